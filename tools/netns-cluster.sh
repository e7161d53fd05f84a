#!/usr/bin/env bash
# Several "nodes" on this machine, for tests that must cross a network stack between hosts:
# each node is a network namespace with its own address, reached from the others through a
# veth pair and a bridge, and its processes see their own hostname (a UTS namespace). Open
# MPI's mpirun starts its daemons in the nodes through this script as its rsh agent, so
# Open MPI and UCX treat the ranks of different nodes as remote (TCP over the bridge) and
# those of one node as local. Nothing leaves the machine: the bridge has no uplink.
#
#   tools/netns-cluster.sh up N          N nodes (2 to 8): PREFIX1 … PREFIXN
#   tools/netns-cluster.sh down          remove the nodes and the bridge
#   tools/netns-cluster.sh mpirun-args   the mpirun options that launch into the nodes
#   tools/netns-cluster.sh NODE COMMAND…         run COMMAND in NODE (mpirun's rsh agent)
#   tools/netns-cluster.sh cut NODE | mend NODE  take NODE's link down / up again
#
# For example:
#   tools/netns-cluster.sh up 2
#   mpirun $(tools/netns-cluster.sh mpirun-args) --host rwn1:2,rwn2:2 -np 4 rankwise svd …
#   tools/netns-cluster.sh down
#
# Settings (environment):
#   RANKWISE_NETNS_PREFIX  node names, and the prefix of the bridge's and links' [rwn]
#   RANKWISE_NETNS_NET     the first three octets of the nodes' /24          [10.77.0]
#   RANKWISE_NETNS_RATE    each node's link rate, e.g. 1gbit (tc tbf); none by default
#   RANKWISE_NETNS_BURST   what tbf lets through at once before the rate applies [256kb]:
#                          messages shorter than it barely see the rate
#   RANKWISE_NETNS_DELAY   one-way delay added on each link, e.g. 2ms, so 2× between two
#                          nodes; none by default. tools/netdelay.py makes it (kernels may
#                          lack tc's sch_netem): each link is then a pair of TAP devices
#                          whose frames it copies after the delay, with a 9000-byte MTU
#   RANKWISE_NETNS_CC      TCP congestion control inside the nodes [cubic], Linux's usual
#                          default. Some kernels default to BBR, which paces each burst at
#                          the bandwidth it has seen; MPI's request-and-reply traffic never
#                          fills the link, so that estimate stays low and over 5 ms links a
#                          300 KB message took 10-14 ms more than its bytes at the rate
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and util-linux's unshare; python3
# for a delay.
set -euo pipefail

prefix=${RANKWISE_NETNS_PREFIX:-rwn}
net=${RANKWISE_NETNS_NET:-10.77.0}
bridge=${prefix}br
self=$(readlink -f "$0")
delay_pid=/run/rankwise-netns-$prefix.delay.pid
delay_log=/run/rankwise-netns-$prefix.delay.log

say() { printf 'netns-cluster: %s\n' "$*" >&2; }
fail() {
  say "error: $*"
  exit 1
}

nodes() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" || true; }

up() {
  local n=${1:-2} i
  [[ $n =~ ^[2-8]$ ]] || fail "up N: N must be 2 to 8, not '$n'"
  [ ${#prefix} -le 8 ] || fail "RANKWISE_NETNS_PREFIX '$prefix' is longer than 8 characters (interface names)"
  if [ -n "$(nodes)" ] || ip link show "$bridge" >/dev/null 2>&1; then
    fail "nodes of prefix '$prefix' exist already: run down first"
  fi
  ip link add "$bridge" type bridge || fail "cannot create a bridge: this needs root (CAP_NET_ADMIN)"
  # A failure part-way leaves nothing behind.
  trap 'down >/dev/null 2>&1' ERR
  ip addr add "$net.1/24" dev "$bridge"
  ip link set "$bridge" up
  [ -z "${RANKWISE_NETNS_DELAY:-}" ] || delay_line "$n"
  for i in $(seq 1 "$n"); do
    ip netns add "$prefix$i"
    if [ -n "${RANKWISE_NETNS_DELAY:-}" ]; then
      ip link set "${prefix}e$i" netns "$prefix$i" name eth0
    else
      ip link add "${prefix}v$i" type veth peer name eth0 netns "$prefix$i"
    fi
    ip link set "${prefix}v$i" master "$bridge" up
    ip -n "$prefix$i" addr add "$net.$((10 + i))/24" dev eth0
    ip -n "$prefix$i" link set eth0 up
    ip -n "$prefix$i" link set lo up
    congestion_control "$prefix$i"
    shape "${prefix}v$i"
    [ -z "${RANKWISE_NETNS_RATE:-}" ] || shape_in "$prefix$i"
  done
  trap - ERR
  say "$n nodes up: $(nodes | tr '\n' ' ')(bridge $bridge, $net.0/24)"
}

# The delay line's process, and its 2N TAP devices (tools/netdelay.py).
delay_line() {
  local n=$1
  command -v python3 >/dev/null || fail "RANKWISE_NETNS_DELAY needs python3 (tools/netdelay.py)"
  setsid python3 "$(dirname "$self")/netdelay.py" "$prefix" "$n" "$RANKWISE_NETNS_DELAY" \
    >"$delay_log" 2>&1 </dev/null &
  echo $! >"$delay_pid"
  for _ in $(seq 1 100); do
    grep -qx ready "$delay_log" 2>/dev/null && return 0
    kill -0 "$(cat "$delay_pid")" 2>/dev/null || break
    sleep 0.1
  done
  local why
  why=$(tail -n 3 "$delay_log" 2>/dev/null)
  down >/dev/null 2>&1
  fail "the delay line did not start: $why"
}

# NODE's TCP congestion control (RANKWISE_NETNS_CC). A namespace other than the first may
# choose only what the first's tcp_allowed_congestion_control lists: the algorithm is added
# there when it is available but not allowed.
congestion_control() {
  local cc=${RANKWISE_NETNS_CC:-cubic} sys=/proc/sys/net/ipv4
  ip netns exec "$1" sysctl -qw "net.ipv4.tcp_congestion_control=$cc" 2>/dev/null && return 0
  if grep -qw -- "$cc" "$sys/tcp_available_congestion_control" &&
    ! grep -qw -- "$cc" "$sys/tcp_allowed_congestion_control"; then
    echo "$(cat "$sys/tcp_allowed_congestion_control") $cc" >"$sys/tcp_allowed_congestion_control"
    ip netns exec "$1" sysctl -qw "net.ipv4.tcp_congestion_control=$cc" 2>/dev/null && return 0
  fi
  say "warning: TCP congestion control '$cc' cannot be set in $1 (available: $(cat "$sys/tcp_available_congestion_control")); it keeps $(ip netns exec "$1" cat "$sys/tcp_congestion_control")"
}

# The rate of a link (tc tbf), on the bridge's side (traffic towards the node).
shape() {
  local dev=$1
  [ -z "${RANKWISE_NETNS_RATE:-}" ] ||
    tc qdisc add dev "$dev" root tbf rate "$RANKWISE_NETNS_RATE" burst "${RANKWISE_NETNS_BURST:-256kb}" latency 50ms
}

# The same inside the node (traffic leaving it).
shape_in() {
  ip netns exec "$1" tc qdisc replace dev eth0 root tbf rate "$RANKWISE_NETNS_RATE" \
    burst "${RANKWISE_NETNS_BURST:-256kb}" latency 50ms
}

down() {
  local node
  # The delay line's devices go with it (and with one a killed `up` left behind, whose
  # devices would keep a new line from starting).
  if [ -f "$delay_pid" ]; then
    kill "$(cat "$delay_pid")" 2>/dev/null || true
    rm -f "$delay_pid" "$delay_log"
  fi
  pkill -f "netdelay.py $prefix " 2>/dev/null || true
  for node in $(nodes); do
    # Processes still inside a node (a run killed mid-way) would keep its namespace alive.
    ip netns pids "$node" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$node"
  done
  # A namespace that something still held when it was deleted keeps its end of the link:
  # deleting this end removes both.
  local l
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^${prefix}[ve][0-9]+$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  say "down"
}

# mpirun's rsh agent: runs COMMAND (one string or words, as mpirun passes it) in NODE's
# network namespace and a UTS namespace whose hostname is NODE.
agent() {
  local node=$1
  shift
  # shellcheck disable=SC2016 # $0 and $* expand in the node's shell
  exec ip netns exec "$node" unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$node" "$@"
}

mpirun_args() {
  # Daemons and ranks talk over the bridge's subnet only (not the host's own interfaces,
  # which the nodes cannot reach); ranks of one node use shared memory among themselves.
  echo "--mca plm_rsh_agent $self --mca oob_tcp_if_include $net.0/24" \
    "--mca btl_tcp_if_include $net.0/24 --mca btl self,vader,tcp"
}

link() { # NODE up|down
  nodes | grep -qx "$1" || fail "no node '$1'"
  ip link set "${prefix}v${1#"$prefix"}" "$2"
}

case "${1:-}" in
  up) up "${2:-2}" ;;
  down) down ;;
  mpirun-args) mpirun_args ;;
  cut) link "${2:?cut NODE}" down ;;
  mend) link "${2:?mend NODE}" up ;;
  *)
    # mpirun runs the agent without this script's settings: any node of any prefix.
    if [ $# -ge 2 ] && ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$1"; then
      agent "$@"
    fi
    echo "usage: $0 up N|down|mpirun-args|cut NODE|mend NODE|NODE COMMAND…" >&2
    exit 2
    ;;
esac
