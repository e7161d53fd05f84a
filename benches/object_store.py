"""Zarr from an S3 server on 127.0.0.1: rankwise against Dask + zarr-python (through
obstore, and through s3fs) on the same store, from disk, from the server, and through a proxy that adds a
delay to every request. Driven by benches/object_store.sh, which gives the paths:

    object_store.py RANKWISE SCRIPTS_DIR WORK_DIR ROWS COLS CHUNK_ROWS DELAY_MS K

Prints one JSON object per row (what, how, seconds, GB/s decoded, accuracy), then nothing
else; the shell script writes the table.
"""

import json
import os
import re
import subprocess
import sys
import time

import boto3
import dask.array as da
import numpy as np
import obstore
import zarr
from obstore.store import S3Store
from zarr.codecs import BloscCodec
from zarr.storage import FsspecStore, ObjectStore

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_REGION": "us-east-1"}


def server(scripts, name, *args):
    p = subprocess.Popen([sys.executable, os.path.join(scripts, name), *args],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return p, int(p.stdout.readline())


def rankwise(binary, args):
    env = dict(os.environ, **CREDS)
    t = time.perf_counter()
    out = subprocess.run([binary, *args], env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"rankwise {' '.join(args)} failed:\n{out.stderr}")
    return dt, out.stdout + out.stderr


def dask_rows(x, tool, source, decoded, k, truth):
    """Dask's read (`.sum()`) and `svd_compressed` of `x`, timed, with their accuracy."""
    t = time.perf_counter()
    total = float(x.sum().compute())
    secs = time.perf_counter() - t
    read = {"what": "read", "tool": tool, "source": source, "seconds": secs,
            "gbps": decoded / secs / 1e9, "sum": total}
    t = time.perf_counter()
    _, sd, _ = da.compute(*da.linalg.svd_compressed(x, k, n_power_iter=2, seed=1))
    secs = time.perf_counter() - t
    svd = {"what": f"svd_compressed k={k}", "tool": tool, "source": source, "seconds": secs,
           "max_rel_err": float(np.max(np.abs(sd[:k] - truth) / truth))}
    return [read, svd]


def main():
    binary, scripts, work, rows, cols, chunk, delay, k = sys.argv[1:9]
    rows, cols, chunk, delay, k = int(rows), int(cols), int(chunk), float(delay), int(k)
    os.makedirs(work, exist_ok=True)
    local = os.path.join(work, "bench.zarr")
    rng = np.random.default_rng(7)
    # A matrix with a decaying spectrum, so that the top k are well defined.
    u = np.linalg.qr(rng.standard_normal((rows, 40)))[0]
    s = 100.0 * 0.8 ** np.arange(40)
    a = (u * s) @ rng.standard_normal((40, cols)) / np.sqrt(cols)
    a += 0.01 * rng.standard_normal((rows, cols))
    arr = zarr.create_array(local, shape=a.shape, dtype="f8", chunks=(chunk, cols),
                            compressors=BloscCodec(cname="lz4", shuffle="shuffle"),
                            overwrite=True)
    arr[...] = a
    truth = np.linalg.svd(a, compute_uv=False)[:k]
    s3, s3_port = server(scripts, "s3_server.py")
    direct, direct_port = server(scripts, "s3_proxy.py", str(s3_port))
    slow, slow_port = server(scripts, "s3_proxy.py", str(s3_port), "--delay-ms", str(delay))
    endpoint = f"http://127.0.0.1:{s3_port}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1"
                 ).create_bucket(Bucket="bench")
    put = S3Store("bench", endpoint=endpoint, access_key_id="testing",
                  secret_access_key="testing", region="us-east-1",
                  client_options={"allow_http": True})
    for dirpath, _, files in os.walk(local):
        for f in files:
            path = os.path.join(dirpath, f)
            with open(path, "rb") as fh:
                obstore.put(put, os.path.relpath(path, work), fh.read())
    decoded = a.nbytes
    sources = [
        ("disk", [local], None),
        ("S3 server", ["s3://bench/bench.zarr", "--endpoint-url", endpoint], endpoint),
        ("S3 through proxy, +0 ms", ["s3://bench/bench.zarr", "--endpoint-url",
                                     f"http://127.0.0.1:{direct_port}"],
         f"http://127.0.0.1:{direct_port}"),
        (f"S3 through proxy, +{delay:g} ms", ["s3://bench/bench.zarr", "--endpoint-url",
                                               f"http://127.0.0.1:{slow_port}"],
         f"http://127.0.0.1:{slow_port}"),
    ]
    rows_out = []
    for name, spec, url in sources:
        best = None
        for _ in range(2):
            dt, text = rankwise(binary, ["read", "--zarr", *spec])
            m = re.search(r"decoded in ([0-9.]+) (ms|s)", text)
            secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
            best = secs if best is None else min(best, secs)
        total = float(re.search(r"sum of values ([-+0-9.e]+)", text).group(1))
        rows_out.append({"what": "read", "tool": "rankwise", "source": name,
                         "seconds": best, "gbps": decoded / best / 1e9, "sum": total})
        dt, text = rankwise(binary, ["rsvd", "--zarr", *spec, "-k", str(k), "--json", "-q"])
        sigma = np.array(json.loads(text[text.index("{"):])["singular_values"])[:k]
        rows_out.append({"what": f"rsvd k={k}", "tool": "rankwise", "source": name,
                         "seconds": dt, "max_rel_err": float(np.max(np.abs(sigma - truth) / truth))})
        # Dask on the same store: zarr-python reads it (through obstore for S3).
        if url is None:
            x = da.from_zarr(zarr.open_array(local, mode="r"))
        else:
            store = S3Store("bench", endpoint=url, access_key_id="testing",
                            secret_access_key="testing", region="us-east-1",
                            client_options={"allow_http": True})
            x = da.from_zarr(zarr.open_array(ObjectStore(store, read_only=True),
                                             path="bench.zarr", mode="r"))
        rows_out += dask_rows(x, "Dask + zarr-python", name, decoded, k, truth)
        if url is None:
            continue
        # The same through s3fs (fsspec), the object-store path most Dask users take.
        fs = FsspecStore.from_url(
            "s3://bench/bench.zarr", read_only=True,
            storage_options={"endpoint_url": url, "key": "testing", "secret": "testing",
                             "client_kwargs": {"region_name": "us-east-1"},
                             "asynchronous": True})
        x = da.from_zarr(zarr.open_array(fs, mode="r"))
        rows_out += dask_rows(x, "Dask + zarr-python + s3fs", name, decoded, k, truth)
    for p in (slow, direct, s3):
        p.stdin.close()
        p.wait()
    for r in rows_out:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
