#!/usr/bin/env bash
# A one-node Slurm on this machine, for trying the job scripts in slurm/ on a workstation and
# for the tests: munged, slurmctld and slurmd, all on localhost.
#
#   slurm/local-cluster.sh up       configure and start the three daemons, wait for the node
#   slurm/local-cluster.sh down     cancel what is left of the jobs, stop the daemons
#   slurm/local-cluster.sh status   which daemons run, and sinfo (exit status 1 unless all run)
#   slurm/local-cluster.sh env      the line that points Slurm's commands at this cluster:
#                                   eval "$(slurm/local-cluster.sh env)"
#
# Then, for example:
#   eval "$(slurm/local-cluster.sh env)"
#   srun -n 4 target/release/rankwise info
#   RANKWISE_BIN=$PWD/target/release/rankwise sbatch slurm/cpu.sbatch
#
# The packages come from scripts/install-deps.sh (slurmctld, slurmd, slurm-client, munge,
# libpmix-dev). Nothing is written outside the state directory: the configuration, the munge
# key and socket, the controller's state, slurmd's spool, the logs and the PID files all live
# there, and only processes named in its PID files are ever signalled. No systemd and no
# cgroups are needed: processes are tracked through /proc and tasks are not confined, so
# rankwise pins its own threads as it does outside Slurm. It runs as root (slurmd starts
# jobs as the user who submits them, which takes root), as in containers and CI.
#
# Settings (environment):
#   RANKWISE_SLURM_DIR     state directory                     [${TMPDIR:-/tmp}/rankwise-slurm]
#   RANKWISE_SLURM_CPUS    CPUs the node offers                [this machine's, at least 8]
#   RANKWISE_SLURM_MEM_MB  memory the node offers, in MiB      [90% of MemTotal]
#   RANKWISE_SLURM_PORT    slurmctld's port; slurmd uses the next one            [6817]
#   RANKWISE_SLURM_WAIT    seconds `up` waits for the node to accept jobs          [60]
set -euo pipefail

state=${RANKWISE_SLURM_DIR:-${TMPDIR:-/tmp}/rankwise-slurm}
conf=$state/slurm.conf
munge_socket=$state/munge/munge.socket
node=$(hostname -s)

say() { printf 'local-cluster: %s\n' "$*" >&2; }
fail() {
  say "error: $*"
  exit 1
}

# The pid in a PID file, when that process lives and is the daemon named (a stale file may
# name a pid that now belongs to something else).
running() { # pidfile name
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -cd '0-9' <"$1")
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  echo "$pid"
}

# The PID file of each daemon.
pidfile() { echo "$state/run/$1.pid"; }

need_programs() {
  local p missing=()
  for p in munged munge slurmctld slurmd sbatch srun sinfo scontrol squeue scancel; do
    command -v "$p" >/dev/null || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] || fail "not installed: ${missing[*]} (run scripts/install-deps.sh)"
}

# Debian's OpenMPI starts its ranks under srun only through PMIx: srun's pmix plugin must be
# there, and so must the libpmix.so it loads at run time (unversioned, from libpmix-dev).
need_pmix() {
  local plugins=() libs=()
  shopt -s nullglob
  plugins=(/usr/lib/*/slurm-wlm/mpi_pmix.so /usr/lib/slurm/mpi_pmix.so /usr/lib64/slurm/mpi_pmix.so)
  libs=(/usr/lib/*/pmix2/lib/libpmix.so /usr/lib/*/libpmix.so)
  shopt -u nullglob
  [ ${#plugins[@]} -gt 0 ] || fail "srun's pmix plugin (mpi_pmix.so) is missing (run scripts/install-deps.sh)"
  [ ${#libs[@]} -gt 0 ] || fail "libpmix.so is missing: install libpmix-dev (run scripts/install-deps.sh)"
}

# The node's GPUs for Slurm's gres/gpu: this machine's NVIDIA devices. Slurm drops GPUs
# without a device file, so a machine without GPUs offers none (and slurm/gpu.sbatch, which
# asks for them, cannot be submitted to it as it is).
write_gres_config() { # gpus
  echo "# Written by slurm/local-cluster.sh."
  echo "AutoDetect=off"
  if [ "$1" -gt 0 ]; then
    find /dev -maxdepth 1 -name 'nvidia[0-9]*' | sort -V | head -n "$1" | sed 's/^/Name=gpu File=/'
  fi
}

write_config() {
  local cpus mem port gpus gres=
  cpus=${RANKWISE_SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}
  mem=${RANKWISE_SLURM_MEM_MB:-$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)}
  port=${RANKWISE_SLURM_PORT:-6817}
  gpus=$(find /dev -maxdepth 1 -name 'nvidia[0-9]*' | wc -l)
  if [ "$gpus" -gt 0 ]; then
    gres=gpu:$gpus
  fi
  cat >"$conf.new" <<EOF
# Written by slurm/local-cluster.sh: a one-node cluster on localhost.
ClusterName=rankwise-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$(pidfile slurmctld)
SlurmdPidFile=$(pidfile slurmd)
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
MailProg=/bin/true
# No cgroups: track processes through /proc, and leave tasks unconfined and unbound (srun's
# --cpu-bind then warns that the cluster "lacks support for cpu binding", which is harmless).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
# srun starts Debian's OpenMPI ranks through PMIx (pmi2 and none do not work with it).
MpiDefault=pmix
# CPUs are the allocated resource; memory limits are passed to jobs (--mem, --mem-per-cpu)
# but not enforced.
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Start a batch job as soon as it is submitted instead of in the next scheduling pass.
SchedulerParameters=batch_sched_delay=0
# The node may offer more CPUs than it has cores (for jobs of more ranks than cores).
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
# Finished jobs stay visible to scontrol for 5 minutes (there is no accounting database).
MinJobAge=300
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN${gres:+ Gres=$gres}
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  if [ -n "$gres" ]; then
    echo "GresTypes=gpu" >>"$conf.new"
  fi
  write_gres_config "$gpus" >"$state/gres.conf"
  mv "$conf.new" "$conf"
}

start_munge() {
  local key=$state/munge/key pid
  if pid=$(running "$(pidfile munged)" munged); then
    say "munged already runs (pid $pid)"
    return
  fi
  # munged refuses a key readable by others and a key directory writable by them.
  if [ ! -s "$key" ]; then
    head -c 1024 /dev/urandom >"$key"
    chmod 400 "$key"
  fi
  rm -f "$munge_socket" "$munge_socket.lock"
  munged --key-file="$key" --socket="$munge_socket" --pid-file="$(pidfile munged)" \
    --log-file="$state/log/munged.log" --seed-file="$state/munge/seed" ||
    fail "munged did not start: $(tail -n 3 "$state/log/munged.log" 2>/dev/null)"
  munge -n -S "$munge_socket" | unmunge -S "$munge_socket" >/dev/null ||
    fail "munged does not answer on $munge_socket"
  say "munged started (pid $(cat "$(pidfile munged)"))"
}

start_daemon() { # name args...
  local name=$1 pid
  shift
  if pid=$(running "$(pidfile "$name")" "$name"); then
    say "$name already runs (pid $pid)"
    return
  fi
  # Both daemons fork into the background and then write their PID files.
  # SLURM_CONF as well as -f: Slurm looks for gres.conf beside the file SLURM_CONF names.
  SLURM_CONF=$conf "$name" -f "$conf" "$@" >"$state/log/$name.start" 2>&1 ||
    fail "$name did not start: $(cat "$state/log/$name.start")"
  for _ in $(seq 50); do
    if pid=$(running "$(pidfile "$name")" "$name"); then
      say "$name started (pid $pid)"
      return
    fi
    sleep 0.1
  done
  fail "$name exited after starting: $(tail -n 5 "$state/log/$name.log" 2>/dev/null)"
}

# Until the node takes jobs. A node that was down when the controller started comes back
# through ReturnToService=2; one marked drained is resumed.
wait_for_node() {
  local limit=${RANKWISE_SLURM_WAIT:-60} start node_state
  start=$SECONDS
  while true; do
    node_state=$(SLURM_CONF=$conf sinfo --noheader --nodes="$node" --format=%T 2>/dev/null || true)
    case $node_state in
      idle | mixed | allocated)
        say "node $node is $node_state"
        return
        ;;
      *drain* | down*)
        SLURM_CONF=$conf scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
        ;;
      inval*)
        # The node contradicts its configuration; waiting will not change that.
        tail -n 5 "$state/log/slurmctld.log" >&2 || true
        fail "node $node is invalid: see $state/log/slurmctld.log"
        ;;
    esac
    if ((SECONDS - start >= limit)); then
      tail -n 10 "$state/log/slurmctld.log" "$state/log/slurmd.log" >&2 || true
      fail "node $node is '${node_state:-unknown}' after ${limit} s"
    fi
    sleep 0.2
  done
}

up() {
  [ "$(id -u)" = 0 ] || fail "run it as root: slurmd starts jobs as the user who submits them"
  need_programs
  need_pmix
  mkdir -p "$state"/{ctld,spool,log,run,munge}
  # munged checks that its socket directory is reachable and its key private.
  chmod 755 "$state" "$state/munge"
  write_config
  start_munge
  if running "$(pidfile slurmctld)" slurmctld >/dev/null; then
    start_daemon slurmctld
  else
    # A fresh controller: -c forgets the jobs of an earlier run of this cluster.
    start_daemon slurmctld -c -i
  fi
  start_daemon slurmd -N "$node"
  wait_for_node
  env_line
}

down() {
  local name pid jobs=()
  # slurmd leaves running jobs alone when it stops: cancel them first, and wait until the
  # controller has seen them end, so no job step outlives the cluster.
  if running "$(pidfile slurmctld)" slurmctld >/dev/null && running "$(pidfile slurmd)" slurmd >/dev/null; then
    mapfile -t jobs < <(SLURM_CONF=$conf squeue --noheader --format=%A 2>/dev/null || true)
    if [ ${#jobs[@]} -gt 0 ]; then
      say "cancelling jobs ${jobs[*]}"
      SLURM_CONF=$conf scancel "${jobs[@]}" >/dev/null 2>&1 || true
      for _ in $(seq 100); do
        [ -z "$(SLURM_CONF=$conf squeue --noheader --format=%A 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
    # A step's slurmstepd outlives its job's end in squeue by a few seconds (measured: 2-4 s
    # after a job ended by --signal) until slurmd reaps it: wait for the steps before
    # stopping slurmd, so none is orphaned. (Another Slurm's steps on this machine only make
    # this wait its 10 s.)
    for _ in $(seq 100); do
      grep -qsx slurmstepd /proc/[0-9]*/comm || break
      sleep 0.1
    done
  fi
  local stopping=()
  for name in slurmd slurmctld munged; do
    if pid=$(running "$(pidfile "$name")" "$name"); then
      kill -TERM "$pid"
      stopping+=("$name:$pid")
    fi
  done
  # Each daemon takes a second or two to leave; one that ignores SIGTERM gets SIGKILL.
  local entry
  for entry in "${stopping[@]}"; do
    name=${entry%%:*}
    pid=${entry#*:}
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      say "$name (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
    say "$name (pid $pid) stopped"
  done
  rm -f "$state"/run/*.pid "$munge_socket" "$munge_socket.lock"
}

status() {
  local name pid all=0
  for name in munged slurmctld slurmd; do
    if pid=$(running "$(pidfile "$name")" "$name"); then
      echo "$name: running (pid $pid)"
    else
      echo "$name: not running"
      all=1
    fi
  done
  if [ "$all" = 0 ]; then
    SLURM_CONF=$conf sinfo || all=1
  fi
  return "$all"
}

env_line() { echo "export SLURM_CONF=$conf"; }

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  env) env_line ;;
  *)
    echo "usage: $0 up|down|status|env" >&2
    exit 2
    ;;
esac
