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
#   RANKWISE_NETNS_DELAY   one-way delay added on each link, e.g. 2ms (tc netem, which needs
#                          the kernel's sch_netem); none by default
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and util-linux's unshare.
set -euo pipefail

prefix=${RANKWISE_NETNS_PREFIX:-rwn}
net=${RANKWISE_NETNS_NET:-10.77.0}
bridge=${prefix}br
self=$(readlink -f "$0")

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
  for i in $(seq 1 "$n"); do
    ip netns add "$prefix$i"
    ip link add "${prefix}v$i" type veth peer name eth0 netns "$prefix$i"
    ip link set "${prefix}v$i" master "$bridge" up
    ip -n "$prefix$i" addr add "$net.$((10 + i))/24" dev eth0
    ip -n "$prefix$i" link set eth0 up
    ip -n "$prefix$i" link set lo up
    shape "${prefix}v$i"
    [ -z "${RANKWISE_NETNS_DELAY:-}${RANKWISE_NETNS_RATE:-}" ] ||
      shape_in "$prefix$i"
  done
  trap - ERR
  say "$n nodes up: $(nodes | tr '\n' ' ')(bridge $bridge, $net.0/24)"
}

# The shaping of a link, on the bridge's side (traffic towards the node).
shape() {
  local dev=$1
  if [ -n "${RANKWISE_NETNS_DELAY:-}" ]; then
    local rate=()
    [ -z "${RANKWISE_NETNS_RATE:-}" ] || rate=(rate "$RANKWISE_NETNS_RATE")
    tc qdisc add dev "$dev" root netem delay "$RANKWISE_NETNS_DELAY" "${rate[@]}" ||
      fail "tc netem failed on $dev: the kernel lacks sch_netem (leave RANKWISE_NETNS_DELAY unset)"
  elif [ -n "${RANKWISE_NETNS_RATE:-}" ]; then
    tc qdisc add dev "$dev" root tbf rate "$RANKWISE_NETNS_RATE" burst "${RANKWISE_NETNS_BURST:-256kb}" latency 50ms
  fi
}

# The same shaping inside the node (traffic leaving it).
shape_in() {
  local node=$1
  if [ -n "${RANKWISE_NETNS_DELAY:-}" ]; then
    local rate=()
    [ -z "${RANKWISE_NETNS_RATE:-}" ] || rate=(rate "$RANKWISE_NETNS_RATE")
    ip netns exec "$node" tc qdisc replace dev eth0 root netem delay "$RANKWISE_NETNS_DELAY" "${rate[@]}"
  else
    ip netns exec "$node" tc qdisc replace dev eth0 root tbf rate "$RANKWISE_NETNS_RATE" burst "${RANKWISE_NETNS_BURST:-256kb}" latency 50ms
  fi
}

down() {
  local node
  for node in $(nodes); do
    # Processes still inside a node (a run killed mid-way) would keep its namespace alive.
    ip netns pids "$node" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$node"
  done
  # A namespace that something still held when it was deleted keeps its end of the link:
  # deleting this end removes both.
  local l
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^${prefix}v[0-9]+$" || true); do
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
