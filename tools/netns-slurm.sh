#!/usr/bin/env bash
# Slurm on the nodes of tools/netns-cluster.sh: one slurmd per node, each in its node's
# network namespace with the node's hostname, its own TmpFS and the host's cgroups; munged
# and slurmctld on the host, on the bridge's address. Debian's packaged Slurm, no
# multiple-slurmd build: each slurmd sees one host of its own.
#
#   tools/netns-slurm.sh up       configure and start the daemons (the nodes must be up)
#   tools/netns-slurm.sh down     stop them
#   tools/netns-slurm.sh env      the line that points Slurm's commands at this cluster
#
# For example:
#   tools/netns-cluster.sh up 2 && tools/netns-slurm.sh up
#   eval "$(tools/netns-slurm.sh env)"
#   srun -N 2 -n 4 --mpi=pmix target/release/rankwise svd --rows 1000000 --cols 20 --chunk-rows 50000
#   tools/netns-slurm.sh down && tools/netns-cluster.sh down
#
# Settings (environment): RANKWISE_NETNS_PREFIX and RANKWISE_NETNS_NET as for
# tools/netns-cluster.sh; RANKWISE_NETNS_SLURM_DIR, the state directory (configuration,
# munge key and socket, spools, each node's TmpFS, logs, PID files)
# [/var/tmp/rankwise-netns-slurm-PREFIX]; RANKWISE_NETNS_SLURM_PORT, slurmctld's port,
# slurmd using the next [6917]. Needs root, as the nodes do.
set -euo pipefail

prefix=${RANKWISE_NETNS_PREFIX:-rwn}
net=${RANKWISE_NETNS_NET:-10.77.0}
state=${RANKWISE_NETNS_SLURM_DIR:-/var/tmp/rankwise-netns-slurm-$prefix}
port=${RANKWISE_NETNS_SLURM_PORT:-6917}
conf=$state/slurm.conf
here=$(dirname "$(readlink -f "$0")")

say() { printf 'netns-slurm: %s\n' "$*" >&2; }
fail() {
  say "error: $*"
  exit 1
}

nodes() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" | sort -V || true; }

# The pid in a PID file, when that process lives and is the daemon named.
running() { # pidfile name
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -cd '0-9' <"$1")
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] || return 1
  echo "$pid"
}

write_config() {
  local list=$1 n i cpus mem
  cpus=$(nproc)
  mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 / 2 }' /proc/meminfo)
  cat >"$conf" <<EOF
# Written by tools/netns-slurm.sh: one slurmd per network-namespace node.
ClusterName=rankwise-netns
SlurmctldHost=$(hostname -s)($net.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.socket
StateSaveLocation=$state/ctld
# Each slurmd expands %n to its own node's name.
SlurmdSpoolDir=$state/spool/%n
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd-%n.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd-%n.log
# The nodes share the host's file system: PMIx's per-step directories, whose names are
# fixed, go under each node's own TmpFS.
TmpFS=$state/tmp/%n
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=batch_sched_delay=0
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
KillWait=5
MinJobAge=300
EOF
  for n in $list; do
    i=${n#"$prefix"}
    echo "NodeName=$n NodeAddr=$net.$((10 + i)) CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$conf"
  done
  echo "PartitionName=nodes Nodes=$(echo "$list" | paste -sd, -) Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$conf"
  : >"$state/gres.conf"
}

# Run inside a node by `up`: `ip netns exec` gives the node a fresh /sys without cgroups,
# which slurmd needs: mount the host's cgroup hierarchies again, then run the command.
node_mounts() {
  if [ "$(stat -f -c %T /proc/1/root/sys/fs/cgroup 2>/dev/null)" = cgroup2fs ]; then
    mount -t cgroup2 none /sys/fs/cgroup
  else
    mount -t tmpfs cgroup /sys/fs/cgroup
    # The v1 hierarchies the host has: this process's own cgroup lines name them.
    awk -F: '$2 != "" { print $2 }' /proc/self/cgroup | while read -r c; do
      mkdir -p "/sys/fs/cgroup/${c#name=}"
      case $c in
        name=*) mount -t cgroup -o "none,$c" cgroup "/sys/fs/cgroup/${c#name=}" ;;
        *) mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c" ;;
      esac
    done
  fi
  exec "$@"
}

# Until the daemon `name` of `pidfile` runs (it forks, then writes the file); it may also
# exit at once (its port taken), which its log says.
started() { # name pidfile log
  for _ in $(seq 50); do
    running "$2" "$1" >/dev/null && return
    sleep 0.1
  done
  fail "$1 exited after starting: $(tail -n 3 "$3" 2>/dev/null)"
}

up() {
  local list n pid
  list=$(nodes)
  [ -n "$list" ] || fail "no nodes of prefix '$prefix': run tools/netns-cluster.sh up first"
  for p in munged munge slurmctld slurmd srun sinfo; do
    command -v "$p" >/dev/null || fail "$p is not installed (run scripts/install-deps.sh)"
  done
  mkdir -p "$state"/{munge,run,log,ctld}
  chmod 755 "$state" "$state/munge"
  for n in $list; do mkdir -p "$state/spool/$n" "$state/tmp/$n"; done
  write_config "$list"
  if ! running "$state/run/munged.pid" munged >/dev/null; then
    [ -s "$state/munge/key" ] || { head -c 1024 /dev/urandom >"$state/munge/key" && chmod 400 "$state/munge/key"; }
    rm -f "$state/munge/munge.socket" "$state/munge/munge.socket.lock"
    # The daemons' output goes to files: a daemon holding its starter's pipes would keep
    # a caller that reads them (a test) waiting.
    munged --key-file="$state/munge/key" --socket="$state/munge/munge.socket" \
      --pid-file="$state/run/munged.pid" --log-file="$state/log/munged.log" \
      --seed-file="$state/munge/seed" </dev/null >"$state/log/munged.start" 2>&1 ||
      fail "munged did not start: $(cat "$state/log/munged.start")"
  fi
  if ! running "$state/run/slurmctld.pid" slurmctld >/dev/null; then
    SLURM_CONF=$conf slurmctld -f "$conf" </dev/null >"$state/log/slurmctld.start" 2>&1 ||
      fail "slurmctld did not start: $(cat "$state/log/slurmctld.start")"
    started slurmctld "$state/run/slurmctld.pid" "$state/log/slurmctld.log"
  fi
  for n in $list; do
    running "$state/run/slurmd-$n.pid" slurmd >/dev/null && continue
    "$here/netns-cluster.sh" "$n" \
      "RANKWISE_NETNS_PREFIX=$prefix $(readlink -f "$0") node-mounts env SLURM_CONF=$conf slurmd -f $conf" \
      </dev/null >"$state/log/slurmd-$n.start" 2>&1 ||
      fail "slurmd on $n did not start: $(cat "$state/log/slurmd-$n.start")"
    started slurmd "$state/run/slurmd-$n.pid" "$state/log/slurmd-$n.log"
  done
  for _ in $(seq 100); do
    if [ "$(SLURM_CONF=$conf sinfo --noheader --format=%T 2>/dev/null | sort -u)" = idle ]; then
      say "$(echo "$list" | wc -l) nodes idle: $(echo "$list" | tr '\n' ' ')(state $state)"
      return
    fi
    sleep 0.2
  done
  fail "the nodes did not become idle: $(SLURM_CONF=$conf sinfo 2>&1 | tail -n 3)"
}

down() {
  local f pid
  for f in "$state"/run/slurmd-*.pid "$state/run/slurmctld.pid" "$state/run/munged.pid"; do
    [ -e "$f" ] || continue
    local name
    name=$(basename "$f" .pid)
    name=${name%%-*}
    if pid=$(running "$f" "$name"); then
      kill "$pid" 2>/dev/null || true
    fi
  done
  # Until they have exited: a controller still shutting down holds its port.
  for _ in $(seq 100); do
    local left=
    for f in "$state"/run/*.pid; do
      [ -e "$f" ] || continue
      local name
      name=$(basename "$f" .pid)
      running "$f" "${name%%-*}" >/dev/null && left=1
    done
    [ -z "$left" ] && break
    sleep 0.1
  done
  # Old step sockets and job state would clash with the next cluster's job IDs.
  rm -rf "$state/spool" "$state/tmp" "$state/ctld" "$state/run"
  say "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export SLURM_CONF=$conf" ;;
  node-mounts)
    shift
    node_mounts "$@"
    ;;
  *) fail "usage: $0 up|down|env" ;;
esac
