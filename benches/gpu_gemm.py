#!/usr/bin/env python3
# The skinny products of one 512 MiB tile on a GPU, as GPU actors run them in the 200 GB
# rsvd's pass 1 (benches/RESULTS.md, GPU section, run E): f64 one DGEMM over all columns;
# f32 in column chunks of 2,048 added to f64 sums (as linalg/src/gpu.rs does), and in one
# SGEMM. Needs PyTorch with CUDA (the GPU node images have it):
#
#   python3 benches/gpu_gemm.py
#
# Prints JSON: seconds per product, the best of 20 after a warm-up, timed by CUDA events.
import json, torch
n, l = 20000, 20
dev = "cuda"
def timed(f, reps=20):
    f(); torch.cuda.synchronize()
    best = None
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); b.synchronize()
        s = a.elapsed_time(b) / 1e3
        best = s if best is None else min(best, s)
    return best
out = {}
for name, dt in (("f64", torch.float64), ("f32", torch.float32)):
    h = (512 << 20) // (n * (8 if dt == torch.float64 else 4))
    A = torch.randn(h, n, device=dev, dtype=dt)
    W = torch.randn(n, l, device=dev, dtype=dt)
    Y = torch.randn(h, l, device=dev, dtype=dt)
    acc = torch.zeros(h, l, device=dev, dtype=torch.float64)
    accB = torch.zeros(l, n, device=dev, dtype=torch.float64)
    r = {"tile_rows": h}
    r["A_Omega_one_gemm"] = timed(lambda: A @ W)
    r["Yt_A_one_gemm"] = timed(lambda: Y.T @ A)
    if dt == torch.float32:
        def chunked():
            for c in range(0, n, 2048):
                acc.add_((A[:, c:c + 2048] @ W[c:c + 2048]).double())
        r["A_Omega_chunked_2048_f64_sums"] = timed(chunked)
        r["Yt_A_plus_f64_sums"] = timed(lambda: accB.add_((Y.T @ A).double()))
    r["tile_gb"] = h * n * A.element_size() / 1e9
    out[name] = r
print(json.dumps(out, indent=1))
