#!/usr/bin/env bash
# The sizing model (`rankwise plan --nodes …`) against measured runs on this machine:
# `rankwise calibrate` once, then each workload under `mpirun -np 1..32` (one node) and on
# two namespace nodes of tools/netns-cluster.sh at several link rates and delays (root
# only; skipped, and said so, otherwise). Each run's own time and passes (its --json
# report) beside the model's prediction for the same shape, ranks, passes and network.
#
#   bash benches/sizing.sh [--quick]
#
# Results: target/bench-results/sizing-*/rows.jsonl and a table on stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN=$ROOT/target/release/rankwise
[[ -x "$BIN" ]] || make --no-print-directory build
OUT=$ROOT/target/bench-results/sizing-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One node: shared memory; oversubscribed ranks yield inside MPI (as in the tests). The
# namespace nodes' mpirun options add TCP over their subnet.
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_oob_tcp_if_include=lo \
    OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_base_warn_component_unused=0
CORES=$(nproc)

# CPU actors throughout (on a node with GPUs, `--device auto` would take those).
"$BIN" calibrate --device cpu --out "$OUT/rates.json" -q >/dev/null
# name | command options (the model's --job and shape are derived from them)
WORKLOADS=(
    "svd|svd --rows 4000000 --cols 20 --chunk-rows 250000 --dist normal"
    "svd|svd --rows 400000 --cols 128 --chunk-rows 25000 --dist normal"
    "rsvd|rsvd --rows 200000 --cols 2000 --chunk-rows 25000 -k 10 --power-iters 2 --dist normal"
    "pca|pca --rows 200000 --cols 2000 --chunk-rows 25000 -k 10 --power-iters 2"
    # Wide: the tree's merges of 400 × 400 R factors and the SVD of the root's are a
    # tenth of the run.
    "svd|svd --rows 200000 --cols 400 --chunk-rows 12500 --dist normal"
)
if [[ ${1:-} == --quick ]]; then
    WORKLOADS=("${WORKLOADS[0]}" "${WORKLOADS[2]}")
fi

# run LAUNCH-WORDS… -- JOB ARGS…: one measured run; prints its JSON report's seconds and
# passes.
measure() {
    local launch=()
    while [[ $1 != -- ]]; do
        launch+=("$1")
        shift
    done
    shift
    "${launch[@]}" "$BIN" "$@" --device cpu --json -q 2>>"$OUT/stderr.log" |
        python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["seconds"], r.get("passes", 2))'
}

# predict JOB ARGS… -- NODES RANKS_PER_NODE CORES_PER_NODE NETWORK PASSES
predict() {
    local job=$1
    shift
    local shape=()
    while [[ $1 != -- ]]; do
        shape+=("$1")
        shift
    done
    shift
    "$BIN" plan "${shape[@]}" --nodes "$1" --ranks-per-node "$2" --cores-per-node "$3" \
        --network "$4" --job "$job" --passes "$5" --calibration "$OUT/rates.json" --json |
        python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["seconds"], r["dominant"])'
}

# The shape options of a workload (what `plan` takes), and how it iterates: fixed power
# iterations in float64, or LOBPCG or block Lanczos (float32 passes but the last); by
# default as the command does (`pca`: block Lanczos, `rsvd`: LOBPCG).
shape_of() {
    local args keep=() i solver=
    read -r -a args <<<"$1"
    for ((i = 1; i < ${#args[@]}; i++)); do
        case ${args[i]} in
        --rows | --cols | --chunk-rows | -k) keep+=("${args[i]}" "${args[i + 1]}") ;;
        --power-iters) solver=power-iters ;;
        --method)
            case ${args[i + 1]} in
            lobpcg | lanczos) solver=${args[i + 1]} ;;
            *) solver=power-iters ;;
            esac
            ;;
        esac
    done
    if [[ -z $solver ]]; then
        if [[ ${args[0]} == pca ]]; then solver=lanczos; else solver=lobpcg; fi
    fi
    echo "${keep[*]} --solver $solver"
}

# row WHERE JOB OPTIONS NP NODES NETWORK MEASURED PASSES PREDICTED DOMINANT [ROOT_MEASURED
# ROOT_PREDICTED]: one row of rows.jsonl, with the Rayleigh–Ritz steps where given.
row() {
    python3 -c 'import json,sys
w,job,opts,np_,nodes,net,meas,passes,pred,dom=sys.argv[1:11]
r=dict(where=w,job=job,options=opts,ranks=int(np_),nodes=int(nodes),network=net,
  measured=float(meas),passes=int(passes),predicted=float(pred),dominant=dom.replace("_", " "),
  error=(float(pred)-float(meas))/float(meas))
if len(sys.argv) > 11:
    rm, rp = float(sys.argv[11]), float(sys.argv[12])
    r.update(root_measured=rm, root_predicted=rp, root_error=(rp-rm)/rm)
print(json.dumps(r))' "$@" | tee -a "$OUT/rows.jsonl"
}

for w in "${WORKLOADS[@]}"; do
    job=${w%%|*}
    opts=${w#*|}
    read -r -a args <<<"$opts"
    read -r -a shape <<<"$(shape_of "$opts")"
    # Up to 16 ranks: more ranks than cores is what the model's share of a node's cores
    # per rank must also get right, and 16 ranks make a tree four levels deep.
    for np in 1 2 3 4 6 8 16; do
        read -r secs passes < <(measure mpirun -np "$np" --oversubscribe --bind-to none -- "${args[@]}" --transport mpi)
        read -r pred dom < <(predict "$job" "${shape[@]}" -- 1 "$np" "$CORES" 100,1us "$passes")
        row "one node, mpirun -np $np" "$job" "$opts" "$np" 1 "shared memory" "$secs" "$passes" "$pred" "$dom"
    done
done

# Thirty-two ranks (a tree five levels deep), with panels a quarter as tall so that every
# rank holds some, and sixty-four (six levels) with panels an eighth as tall.
WIDE=(
    "svd|svd --rows 4000000 --cols 20 --chunk-rows 125000 --dist normal"
    "rsvd|rsvd --rows 200000 --cols 2000 --chunk-rows 6250 -k 10 --power-iters 2 --dist normal"
    "pca|pca --rows 200000 --cols 2000 --chunk-rows 6250 -k 10 --power-iters 2"
)
WIDER=(
    "svd|svd --rows 4000000 --cols 20 --chunk-rows 62500 --dist normal"
    "rsvd|rsvd --rows 200000 --cols 2000 --chunk-rows 3125 -k 10 --power-iters 2 --dist normal"
    "pca|pca --rows 200000 --cols 2000 --chunk-rows 3125 -k 10 --power-iters 2"
)
if [[ ${1:-} == --quick ]]; then
    WIDE=("${WIDE[0]}")
    WIDER=()
fi
# many_ranks NP WORKLOADS…: one node, NP ranks.
many_ranks() {
    local np=$1 w job opts args shape secs passes pred dom
    shift
    for w in "$@"; do
        job=${w%%|*}
        opts=${w#*|}
        read -r -a args <<<"$opts"
        read -r -a shape <<<"$(shape_of "$opts")"
        read -r secs passes < <(measure mpirun -np "$np" --oversubscribe --bind-to none -- "${args[@]}" --transport mpi)
        read -r pred dom < <(predict "$job" "${shape[@]}" -- 1 "$np" "$CORES" 100,1us "$passes")
        row "one node, mpirun -np $np" "$job" "$opts" "$np" 1 "shared memory" "$secs" "$passes" "$pred" "$dom"
    done
}
many_ranks 32 "${WIDE[@]}"
many_ranks 64 "${WIDER[@]}"

# The Rayleigh–Ritz steps on the root, of LOBPCG and of block Lanczos: PCAs of n × n
# generated genotypes (n samples, the step's size) stopped at 12 passes (block Lanczos: 24,
# two restarts of its basis), under mpirun -np 1 and 2, the report's phase of the steps
# against the model's, and the whole run against the model.
RR_SAMPLES=(4000 12000 24000)
if [[ ${1:-} == --quick ]]; then
    RR_SAMPLES=(12000)
fi
for n in "${RR_SAMPLES[@]}"; do
  for method in lobpcg:12 lanczos:24; do
    opts="pca --rows $n --cols $n --chunk-rows $((n / 8)) -k 10 --method ${method%:*} --max-passes ${method#*:}"
    read -r -a args <<<"$opts"
    for np in 1 2; do
        read -r secs passes root < <(mpirun -np "$np" --oversubscribe --bind-to none "$BIN" \
            "${args[@]}" --transport mpi --device cpu --json -q 2>>"$OUT/stderr.log" |
            python3 -c 'import json,sys; r=json.load(sys.stdin)
print(r["seconds"], r["passes"], max(sum(t["seconds"] for t in p["timings"]
      if t["phase"].startswith("Rayleigh–Ritz")) for p in r["per_rank"]))')
        read -r pred dom proot < <("$BIN" plan --rows "$n" --cols "$n" --chunk-rows $((n / 8)) -k 10 \
            --solver "${method%:*}" --nodes 1 --ranks-per-node "$np" --cores-per-node "$CORES" \
            --network 100,1us --job pca --passes "$passes" --calibration "$OUT/rates.json" --json |
            python3 -c 'import json,sys; r=json.load(sys.stdin)
print(r["seconds"], r["dominant"].replace(" ", "_"), sum(p["compute_seconds"]
      for p in r["phases"] if p["phase"].startswith("Rayleigh–Ritz")))')
        row "one node, mpirun -np $np" pca "$opts" "$np" 1 "shared memory" "$secs" "$passes" "$pred" "$dom" "$root" "$proot"
    done
  done
done

# one_way NODE_A NODE_B ADDRESS_B: the one-way latency between two namespace nodes, half
# the median round trip of a byte over TCP (what `ping` would say; the nodes have no ping).
one_way() {
    ip netns exec "$2" python3 - "$3" <<'PY' &
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5599)); s.listen(1); c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while c.recv(1):
    c.sendall(b"k")
PY
    sleep 0.5
    ip netns exec "$1" python3 - "$3" <<'PY'
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5599))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
ts = []
for _ in range(41):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); ts.append(time.perf_counter() - t)
print(f"{sorted(ts)[20] / 2 * 1e6:.0f}us")
PY
    wait
}

# namespace_rows HOSTS NP RANKS_PER_NODE NETWORK LABEL: every workload on the namespace
# nodes that are up, NP ranks placed by HOSTS (mpirun's --host), against the model's
# prediction for two nodes of RANKS_PER_NODE ranks and one core each. EXTRA_MCA: more
# mpirun options.
EXTRA_MCA=()
namespace_rows() {
    local hosts=$1 np=$2 per_node=$3 net=$4 label=$5 margs w job opts args shape secs passes pred dom
    read -r -a margs <<<"$(tools/netns-cluster.sh mpirun-args)"
    for w in "${NODE_WORKLOADS[@]}"; do
        job=${w%%|*}
        opts=${w#*|}
        read -r -a args <<<"$opts"
        read -r -a shape <<<"$(shape_of "$opts")"
        read -r secs passes < <(measure mpirun "${margs[@]}" "${EXTRA_MCA[@]}" --host "$hosts" \
            -np "$np" --bind-to none -- "${args[@]}" --transport mpi --threads-per-actor 1 --no-pin)
        read -r pred dom < <(predict "$job" "${shape[@]}" -- 2 "$per_node" 1 "$net" "$passes")
        row "$label" "$job" "$opts" "$np" 2 "$net" "$secs" "$passes" "$pred" "$dom"
    done
}

# Two namespace nodes, one rank each, sharing this machine's cores (one core a node, not
# bound: each node's mpirun daemon would bind its rank to the same first core), at
# several link rates (tc tbf; without a delay the latency is the veth pair's, about 50 µs
# with the TCP stacks).
if [[ $(id -u) == 0 ]] && command -v tc >/dev/null; then
    export RANKWISE_NETNS_PREFIX=rwz RANKWISE_NETNS_NET=10.79.0
    NODE_WORKLOADS=("${WORKLOADS[@]}")
    for link in "1gbit 1,50us" "100mbit 0.1,50us" "20mbit 0.02,50us"; do
        read -r rate net <<<"$link"
        # A small burst: each message sees the rate (with tbf's default of 256 KiB here,
        # messages of up to 256 KiB pass at once).
        RANKWISE_NETNS_RATE=$rate RANKWISE_NETNS_BURST=32kb tools/netns-cluster.sh up 2 >/dev/null
        namespace_rows rwz1:1,rwz2:1 2 1 "$net" "2 namespace nodes, $rate"
        tools/netns-cluster.sh down >/dev/null
    done
    # Eight ranks on two namespace nodes (four a node: shared memory inside a node, TCP
    # between), at 1 Gbit/s: one core a node, a quarter of a core a rank.
    RANKWISE_NETNS_RATE=1gbit RANKWISE_NETNS_BURST=32kb tools/netns-cluster.sh up 2 >/dev/null
    namespace_rows rwz1:4,rwz2:4 8 4 1,50us "2 namespace nodes × 4 ranks, 1gbit"
    # Sixteen: eight a node, three tree levels inside each node and one between them.
    namespace_rows rwz1:8,rwz2:8 16 8 1,50us "2 namespace nodes × 8 ranks, 1gbit"
    # Thirty-two: sixteen a node, with the finer panels.
    NODE_WORKLOADS=("${WIDE[@]}")
    namespace_rows rwz1:16,rwz2:16 32 16 1,50us "2 namespace nodes × 16 ranks, 1gbit"
    # Sixty-four: thirty-two a node.
    if [[ ${1:-} != --quick ]]; then
        NODE_WORKLOADS=("${WIDER[@]}")
        namespace_rows rwz1:32,rwz2:32 64 32 1,50us "2 namespace nodes × 32 ranks, 1gbit"
    fi
    NODE_WORKLOADS=("${WORKLOADS[@]}")
    tools/netns-cluster.sh down >/dev/null
    # Links with a delay (tools/netdelay.py, as this kernel may lack sch_netem), two nodes of
    # one rank at 1 Gbit/s, with a PCA to the default tolerance besides (block Lanczos, the
    # default): its 50-odd passes each wait for the tree's messages, so the latency shows.
    # The model is given the latency measured between the nodes (the delay line's copying
    # included).
    NODE_WORKLOADS=("${WORKLOADS[@]}" "pca|pca --rows 40000 --cols 2000 --chunk-rows 5000 -k 10")
    if [[ ${1:-} == --quick ]]; then
        NODE_WORKLOADS=("${WORKLOADS[0]}" "${NODE_WORKLOADS[-1]}")
    fi
    for delay in 1ms 5ms; do
        RANKWISE_NETNS_RATE=1gbit RANKWISE_NETNS_BURST=32kb RANKWISE_NETNS_DELAY=$delay \
            tools/netns-cluster.sh up 2 >/dev/null
        lat=$(one_way rwz1 rwz2 10.79.0.12)
        namespace_rows rwz1:1,rwz2:1 2 1 "1,$lat" "2 namespace nodes, 1gbit, $delay a link"
        # The PCA again with Open MPI's TCP eager limit above its messages (about 300 KB):
        # no rendezvous, and the model told so (`--network …,1M`).
        local_rows=("${NODE_WORKLOADS[@]}")
        NODE_WORKLOADS=("${NODE_WORKLOADS[-1]}")
        EXTRA_MCA=(--mca btl_tcp_eager_limit 1048576 --mca btl_tcp_max_send_size 1048576)
        namespace_rows rwz1:1,rwz2:1 2 1 "1,$lat,1M" "2 namespace nodes, 1gbit, $delay, eager 1M"
        EXTRA_MCA=()
        NODE_WORKLOADS=("${local_rows[@]}")
        tools/netns-cluster.sh down >/dev/null
    done
else
    echo "sizing.sh: not root (or no tc): the namespace-cluster rows are skipped" | tee -a "$OUT/rows.jsonl"
fi

python3 - "$OUT/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'where':34} {'job':5} {'options':90} {'passes':>6} {'measured':>9} {'predicted':>9} {'error':>7}")
for r in rows:
    print(f"{r['where']:34} {r['job']:5} {r['options'][:90]:90} {r['passes']:>6} "
          f"{r['measured']:8.2f}s {r['predicted']:8.2f}s {100*r['error']:+6.0f}%")
errs = [abs(r["error"]) for r in rows]
print(f"median |error| {100*sorted(errs)[len(errs)//2]:.0f}%, largest {100*max(errs):.0f}%")
steps = [r for r in rows if "root_measured" in r]
if steps:
    print("The Rayleigh–Ritz steps on the root (the report's phase against the model's):")
    for r in steps:
        print(f"  {r['options'][:90]:90} -np {r['ranks']} {r['passes']:>3} passes "
              f"{r['root_measured']:6.2f}s {r['root_predicted']:6.2f}s {100*r['root_error']:+4.0f}%")
PY
echo "rows: $OUT/rows.jsonl"
