"""The stores of the object-store tests (tests/object_store.rs), written by zarr-python and
put into an S3 bucket through obstore:

    s3_stores.py ENDPOINT BUCKET DIR
    s3_stores.py upload ENDPOINT BUCKET STORE...

The first form writes each store under DIR (zarr-python 3, as users write them), creates BUCKET on the S3
server at ENDPOINT (moto, scripts/s3_server.py) and uploads every store's files under the
same names; `direct.zarr` is also written by zarr-python straight into the bucket, through
zarr.storage.ObjectStore, as `direct-s3.zarr`. Prints a JSON manifest of the stores.
The second creates BUCKET and puts each STORE directory (written elsewhere, by
`rankwise gen` say) into it under its base name.
"""

import json
import os
import sys

import boto3
import numpy as np
import obstore
import zarr
from obstore.store import S3Store
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ZstdCodec
from zarr.storage import ObjectStore


def data(seed, shape, dtype):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 3, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def stores(root, s3=None):
    """Writes the stores under `root` (a path, or an obstore store for the direct one)."""
    out = []

    def add(name, kind, arr_path=""):
        out.append({"name": name, "kind": kind, "array": arr_path})

    def create(name, values, **kw):
        arr = zarr.create_array(os.path.join(root, name), shape=values.shape,
                                dtype=values.dtype, **kw)
        arr[...] = values
        return arr

    # Blosc, v3 (decoded by rankwise's own Blosc path), rows of chunks spanning every column.
    create("direct.zarr", data(1, (2400, 48), "f8"), chunks=(300, 48),
           compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    add("direct.zarr", "matrix")
    # zstd, v2, chunks in both dimensions.
    create("v2_zstd.zarr", data(2, (1800, 40), "f4"), chunks=(250, 16), zarr_format=2,
           compressors=[__import__("numcodecs").Zstd(level=3)])
    add("v2_zstd.zarr", "matrix")
    # Sharded: inner chunks decoded here, the index read by byte ranges.
    create("sharded.zarr", data(3, (2000, 36), "f8"), chunks=(125, 18), shards=(500, 36),
           compressors=ZstdCodec(level=1))
    add("sharded.zarr", "matrix")
    # Sharded with big-endian inner chunks: checked here, decoded by zarrs.
    create("sharded_be.zarr", data(4, (1000, 20), "f8"), chunks=(100, 10), shards=(400, 20),
           serializer=BytesCodec(endian="big"), compressors=GzipCodec(level=1))
    add("sharded_be.zarr", "matrix")
    # A chunk never written: the fill value.
    arr = zarr.create_array(os.path.join(root, "missing.zarr"), shape=(1200, 30), dtype="f8",
                            chunks=(200, 30), fill_value=1.5,
                            compressors=BloscCodec(cname="zstd", shuffle="bitshuffle"))
    values = data(5, (1200, 30), "f8")
    arr[:400] = values[:400]
    arr[600:] = values[600:]
    add("missing.zarr", "matrix")
    # Genotype dosages with sample IDs beside them, for pca.
    g = zarr.open_group(os.path.join(root, "geno.zarr"), mode="w")
    d = g.create_array("dosages", shape=(3000, 120), dtype="u1", chunks=(500, 120),
                       compressors=BloscCodec(cname="lz4", shuffle="bitshuffle"))
    pops = np.repeat([0.15, 0.45], 60)
    rng = np.random.default_rng(6)
    freq = np.clip(rng.uniform(0.05, 0.5, size=(3000, 1)) + 0.2 * (pops - 0.3), 0.01, 0.99)
    d[...] = rng.binomial(2, np.broadcast_to(freq, (3000, 120))).astype("u1")
    ids = g.create_array("sample_id", shape=(120,), dtype=str, chunks=(120,))
    ids[...] = np.array([f"S{j:03d}" for j in range(120)])
    add("geno.zarr", "genotypes", "dosages")
    # A VCF Zarr store in bio2zarr's layout: diploid calls with a few missing, the mask,
    # contigs (chromosome X among them, which pca leaves out), alleles (some multiallelic).
    v = zarr.open_group(os.path.join(root, "cohort.vcz"), mode="w")
    nv, ns = 900, 80
    rng = np.random.default_rng(8)
    p = rng.uniform(0.05, 0.6, size=(nv, 1, 1))
    calls = (rng.uniform(size=(nv, ns, 2)) < p).astype("i1")
    calls[rng.uniform(size=calls.shape) < 0.02] = -1
    cg = v.create_array("call_genotype", shape=calls.shape, dtype="i1", chunks=(200, ns, 2),
                        compressors=BloscCodec(cname="zstd", shuffle="bitshuffle"))
    cg[...] = calls
    mask = v.create_array("call_genotype_mask", shape=calls.shape, dtype=bool,
                          chunks=(200, ns, 2))
    mask[...] = calls < 0
    sid = v.create_array("sample_id", shape=(ns,), dtype=str, chunks=(ns,))
    sid[...] = np.array([f"HG{j:05d}" for j in range(ns)])
    contig = v.create_array("contig_id", shape=(3,), dtype=str, chunks=(3,))
    contig[...] = np.array(["1", "2", "X"])
    vc = v.create_array("variant_contig", shape=(nv,), dtype="i1", chunks=(nv,))
    vc[...] = np.repeat([0, 1, 2], nv // 3).astype("i1")
    alleles = np.full((nv, 3), "", dtype=object)
    alleles[:, 0], alleles[:, 1] = "A", "G"
    alleles[::50, 2] = "T"
    va = v.create_array("variant_allele", shape=(nv, 3), dtype=str, chunks=(nv, 3))
    va[...] = alleles.astype(str)
    add("cohort.vcz", "vcf", "")
    return out


def upload(local, store):
    """Puts every file of the store directory `local` under its name in the bucket."""
    base = os.path.dirname(local)
    for dirpath, _, files in os.walk(local):
        for f in files:
            path = os.path.join(dirpath, f)
            with open(path, "rb") as fh:
                obstore.put(store, os.path.relpath(path, base), fh.read())


def bucket_store(endpoint, bucket):
    """Creates `bucket` on the server at `endpoint` and returns an obstore store of it."""
    creds = dict(aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1")
    boto3.client("s3", endpoint_url=endpoint, **creds).create_bucket(Bucket=bucket)
    return S3Store(bucket, endpoint=endpoint, access_key_id="testing",
                   secret_access_key="testing", region="us-east-1",
                   client_options={"allow_http": True})


def main():
    if sys.argv[1] == "upload":
        endpoint, bucket = sys.argv[2:4]
        s3 = bucket_store(endpoint, bucket)
        for local in sys.argv[4:]:
            upload(os.path.abspath(local), s3)
        return
    endpoint, bucket, root = sys.argv[1:4]
    s3 = bucket_store(endpoint, bucket)
    os.makedirs(root, exist_ok=True)
    manifest = stores(root)
    for entry in manifest:
        upload(os.path.join(root, entry["name"]), s3)
    # zarr-python itself writing into the bucket: the same array as direct.zarr.
    arr = zarr.create_array(ObjectStore(s3), name="direct-s3.zarr", shape=(2400, 48),
                            dtype="f8", chunks=(300, 48),
                            compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    arr[...] = data(1, (2400, 48), "f8")
    manifest.append({"name": "direct-s3.zarr", "kind": "matrix", "array": "",
                     "same_as": "direct.zarr"})
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
    # Every object is written by now (the puts and zarr's writes return when done) and
    # the manifest is on stdout. The interpreter's shutdown, with zarr's event-loop thread
    # and obstore's runtime still alive, is skipped: three clean-clone runs of `make test`
    # saw this script killed by SIGABRT with nothing on stderr, which is what an abort
    # after faulthandler has been shut down looks like.
    sys.stdout.flush()
    os._exit(0)
