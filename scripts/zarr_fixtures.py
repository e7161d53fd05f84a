"""Writes the Zarr interop fixtures of rankwise's tests with zarr-python.

    target/zarr-venv/bin/python scripts/zarr_fixtures.py OUTDIR

rankwise reads Zarr stores written by any conforming writer; these fixtures are written by
the reference one (zarr-python 3, versions pinned in scripts/zarr-requirements.txt), so the
tests in tests/zarr_interop.rs check rankwise's reader against real zarr-python output
rather than against stores rankwise wrote itself.

OUTDIR must not exist. Everything is deterministic (numpy's default_rng seeded from the
fixture's name). What is written:

* dense matrices (37 × 23, chunks 8 × 5, so the last chunk row and column are ragged; 5
  chunk columns): zarr_format 2 and 3 × every codec rankwise supports (blosc lz4/zstd with
  shuffle/bitshuffle, standalone zstd, gzip, none) × every dtype (u8 i8 i16 i32 f32 f64);
  sharded v3 arrays (index at the end and at the start, one with an inner chunk never
  written); arrays inside groups (spec `STORE:grp/x`); one v2 and one v3 array with a chunk
  that was never written and a non-zero fill value; v2 with `/` chunk keys, v3 with `v2`
  chunk keys, big-endian v2 and v3, a v2 array whose fill_value is null, taller arrays
  (1000 × 12) and wide ones (9 × 40);
* genotype dosage matrices (int8 −1..2 and uint8 0..2, v2 and v3, one sharded);
* VCF Zarr stores in bio2zarr's layout (zarr_format 2 with and without call_genotype_mask,
  and zarr_format 3) with missing (−1) and fill (−2) alleles;
* failure fixtures: a truncated chunk, a chunk of garbage bytes, a truncated shard, unknown
  codecs (v2 and v3), dtypes an SVD cannot use (bool, complex, fixed-length bytes,
  variable-length strings), a float array given as genotypes, a 3-D array given as a matrix,
  a directory that is no Zarr store, an array name that does not exist, a group given as an
  array, a VCF Zarr store without call_genotype.

For each readable fixture NAME the values zarr-python reads back are written as raw
little-endian C-order bytes to NAME.bin (NAME.dosages.bin, int8 variants × samples, for the
VCF Zarr stores, plus NAME.sample_ids.json). OUTDIR/manifest.json lists every fixture (see
`entry()` and `failure()` for the fields). The script checks what zarr-python reads back
against the values it meant to write, and that the chunks meant to be missing are missing.
"""

import argparse
import json
import os
import shutil
import sys
import warnings
import zlib

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BloscCodec, BytesCodec, GzipCodec, ZstdCodec

# zarr-python warns that some v3 data types (fixed-length bytes, strings) have no final spec
# yet; they are written on purpose (as failure fixtures, and for VCF Zarr sample ids).
warnings.filterwarnings("ignore", category=UserWarning)
warnings.filterwarnings("ignore", category=FutureWarning)

SHAPE = (37, 23)
CHUNKS = (8, 5)
DTYPES = ["u8", "i8", "i16", "i32", "f32", "f64"]
NUMPY_DTYPE = {
    "u8": "uint8",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "f32": "float32",
    "f64": "float64",
    "bool": "bool",
    "c128": "complex128",
}
CODECS = [
    "blosc-lz4-shuffle",
    "blosc-lz4-bitshuffle",
    "blosc-zstd-shuffle",
    "blosc-zstd-bitshuffle",
    "zstd",
    "gzip",
    "none",
]


def compressors(codec, zarr_format):
    """The compressor(s) argument of zarr.create_array for a codec name."""
    if codec == "none":
        return None
    if codec.startswith("blosc-"):
        _, cname, shuffle = codec.split("-")
        if zarr_format == 2:
            mode = {"shuffle": numcodecs.Blosc.SHUFFLE, "bitshuffle": numcodecs.Blosc.BITSHUFFLE}
            return numcodecs.Blosc(cname=cname, clevel=5, shuffle=mode[shuffle])
        return BloscCodec(cname=cname, clevel=5, shuffle=shuffle)
    if codec == "zstd":
        return numcodecs.Zstd(level=3) if zarr_format == 2 else ZstdCodec(level=3)
    if codec == "gzip":
        return numcodecs.GZip(level=5) if zarr_format == 2 else GzipCodec(level=5)
    raise ValueError(f"unknown codec {codec}")


def rng_for(name):
    return np.random.default_rng([20240501, zlib.crc32(name.encode())])


def values(name, dtype, shape):
    """Deterministic values of a dtype: the full integer range (negatives included for
    signed types); floats of mixed magnitude with a few exact integers and signed zeros."""
    rng = rng_for(name)
    dt = np.dtype(NUMPY_DTYPE[dtype])
    if dt.kind in "iu":
        info = np.iinfo(dt)
        v = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)
        v.flat[:2] = [info.min, info.max]
        return v
    v = rng.standard_normal(shape) * np.exp(rng.uniform(-6, 6, size=shape))
    v.flat[:4] = [0.0, -0.0, 1.0, -3.0]
    return v.astype(dt)


def json_scalar(x):
    """A fill value as JSON: numbers as numbers, NaN/inf as strings, None as null."""
    if x is None:
        return None
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else str(float(x))
    if isinstance(x, (bytes, np.bytes_)):
        return x.decode("latin-1")
    if isinstance(x, (complex, np.complexfloating)):
        return [float(x.real), float(x.imag)]
    return str(x)


def chunk_key(arr, coords):
    """The store key (relative to the array) of the chunk (or shard) at grid coords."""
    md = arr.metadata
    if arr.metadata.zarr_format == 2:
        sep = md.dimension_separator or "."
        return sep.join(str(c) for c in coords)
    return md.chunk_key_encoding.encode_chunk_key(tuple(coords))


def chunk_slices(coords, chunks, shape):
    return tuple(
        slice(c * n, min((c + 1) * n, s)) for c, n, s in zip(coords, chunks, shape)
    )


def grid(shape, chunks):
    return [
        (i, j)
        for i in range(-(-shape[0] // chunks[0]))
        for j in range(-(-shape[1] // chunks[1]))
    ]


class Writer:
    def __init__(self, out):
        self.out = out
        self.manifest = {
            "generator": "scripts/zarr_fixtures.py",
            "zarr": zarr.__version__,
            "numcodecs": numcodecs.__version__,
            "numpy": np.__version__,
            "dense": [],
            "genotypes": [],
            "vcf": [],
            "failures": [],
        }

    def path(self, name):
        return os.path.join(self.out, name)

    def truth(self, name, arr, expected):
        """Reads `arr` back with zarr-python, checks it against `expected` and writes the
        values read as NAME.bin (little-endian, C order)."""
        back = arr[...]
        if not np.array_equal(back, expected, equal_nan=back.dtype.kind == "f"):
            raise SystemExit(f"zarr_fixtures: {name}: zarr-python reads back other values")
        file = f"{name}.bin"
        back.astype(back.dtype.newbyteorder("<"), copy=False).tofile(self.path(file))
        return file

    def entry(self, kind, name, spec, arr, dtype, codec, expected, missing=()):
        md = arr.metadata
        shards = None
        if arr.shards is not None:
            shards = list(arr.shards)
        record = {
            "name": name,
            "spec": spec,
            "zarr_format": md.zarr_format,
            "dtype": dtype,
            "shape": list(arr.shape),
            "chunks": list(arr.chunks),
            "shards": shards,
            "codec": codec,
            "fill_value": json_scalar(arr.fill_value),
            "missing_chunks": [chunk_key(arr, c) for c in missing],
            "truth": self.truth(name, arr, expected),
        }
        self.manifest[kind].append(record)
        return record

    def check_missing(self, name, arr, missing):
        """The chunks (or shards) meant to be missing are missing, the others are there."""
        base = os.path.join(self.path(name), arr.path)
        for c in grid(arr.shape, arr.shards or arr.chunks):
            present = os.path.exists(os.path.join(base, chunk_key(arr, c)))
            if present == (c in missing):
                raise SystemExit(f"zarr_fixtures: {name}: chunk {c} present={present}")

    def dense(
        self,
        name,
        zarr_format,
        dtype,
        codec,
        *,
        shape=SHAPE,
        chunks=CHUNKS,
        shards=None,
        fill_value=None,
        missing=(),
        kind="dense",
        data=None,
        store_dtype=None,
        **extra,
    ):
        """A store that is itself one 2-D array (stored as `store_dtype` when given, e.g. a
        big-endian one)."""
        data = values(name, dtype, shape) if data is None else data
        if fill_value is not None:
            extra["fill_value"] = fill_value
        arr = zarr.create_array(
            self.path(name),
            shape=shape,
            dtype=store_dtype or NUMPY_DTYPE[dtype],
            chunks=chunks,
            shards=shards,
            compressors=compressors(codec, zarr_format),
            zarr_format=zarr_format,
            **extra,
        )
        expected = write_skipping(arr, data, arr.shards or arr.chunks, missing)
        self.check_missing(name, arr, missing)
        return self.entry(kind, name, name, arr, dtype, codec, expected, missing)


def write_skipping(arr, data, per, missing):
    """Writes `data` chunk (or shard) by chunk, leaving the `missing` ones unwritten; returns
    what a reader must see (the fill value where nothing was written)."""
    expected = data.copy()
    for c in grid(arr.shape, per):
        sl = chunk_slices(c, per, arr.shape)
        if c in missing:
            expected[sl] = arr.fill_value
        else:
            arr[sl] = data[sl]
    return expected


def dense_fixtures(w):
    for zf in (2, 3):
        for dtype in DTYPES:
            for codec in CODECS:
                w.dense(f"v{zf}_{dtype}_{codec}", zf, dtype, codec)

    # Sharded v3: shards of 4 × 2 inner chunks, ragged at the array's edge; index at the end
    # (zarr-python's default) and at the start.
    w.dense("v3_f64_sharded", 3, "f64", "blosc-lz4-bitshuffle", chunks=(4, 5), shards=(16, 10))
    w.dense("v3_i16_sharded", 3, "i16", "zstd", chunks=(4, 5), shards=(16, 10))
    w.dense(
        "v3_f32_sharded_index_start",
        3,
        "f32",
        "gzip",
        chunks=(4, 5),
        shards={"shape": (16, 10), "index_location": "start"},
    )
    # One inner chunk (rows 4..8, columns 5..10 of shard (0, 0)) holds only the fill value:
    # zarr-python does not store it, so the shard index marks it empty (offset and length
    # 2^64 − 1) and a reader must produce the fill value.
    name = "v3_f64_sharded_missing_inner"
    data = values(name, "f64", SHAPE)
    data[4:8, 5:10] = 2.5
    rec = w.dense(
        name, 3, "f64", "blosc-zstd-shuffle", chunks=(4, 5), shards=(16, 10),
        fill_value=2.5, data=data,
    )
    rec["missing_inner_chunks"] = {"c/0/0": [[1, 1]]}
    check_empty_inner(w.path(name) + "/c/0/0", inner_per_shard=(4, 2), empty=[(1, 1)])

    # Chunks spanning every column (ragged last chunk row): readers may decode any range
    # of rows from them without the rest of the chunk (Blosc blocks, raw offsets).
    full = (8, SHAPE[1])
    w.dense("v3_f32_full_width_blosc", 3, "f32", "blosc-lz4-bitshuffle", chunks=full)
    w.dense("v2_f64_full_width_blosc", 2, "f64", "blosc-zstd-shuffle", chunks=full)
    w.dense("v3_i16_full_width_none", 3, "i16", "none", chunks=full)
    w.dense("v2_u8_full_width_none", 2, "u8", "none", chunks=full)
    w.dense("v3_f64_full_width_missing", 3, "f64", "blosc-lz4-shuffle", chunks=full,
            fill_value=1.25, missing=[(2, 0)])

    # A chunk never written, with a non-zero fill value.
    w.dense("v3_f64_missing_chunk", 3, "f64", "blosc-lz4-shuffle", fill_value=-7.5,
            missing=[(2, 3)])
    w.dense("v2_i16_missing_chunk", 2, "i16", "zstd", fill_value=42, missing=[(1, 4), (4, 0)])
    w.dense("v3_u8_missing_chunk", 3, "u8", "gzip", fill_value=200, missing=[(0, 0)])

    # Chunk key encodings: v2 with "/" (bio2zarr's default), v3 with v2-style "." keys.
    w.dense("v2_f64_nested_keys", 2, "f64", "blosc-lz4-shuffle",
            chunk_key_encoding={"name": "v2", "separator": "/"})
    w.dense("v3_f64_v2_keys", 3, "f64", "zstd", chunk_key_encoding={"name": "v2", "separator": "."})

    # Big-endian storage.
    w.dense("v2_f64_bigendian", 2, "f64", "blosc-lz4-shuffle", store_dtype=">f8")
    w.dense("v2_i32_bigendian", 2, "i32", "none", store_dtype=">i4")
    w.dense("v3_f64_bigendian", 3, "f64", "zstd", serializer=BytesCodec(endian="big"))
    # Sharded with big-endian inner chunks: zarrs decodes them, after rankwise has checked
    # each inner chunk it reads decodes to no more than its size.
    w.dense("v3_f64_sharded_bigendian", 3, "f64", "zstd", chunks=(4, 5), shards=(16, 10),
            serializer=BytesCodec(endian="big"))

    # v2 fill_value null (zarr-python 2 and older VCF Zarr writers), every chunk written.
    w.dense("v2_i8_fill_null", 2, "i8", "blosc-zstd-bitshuffle")
    edit_json(w.path("v2_i8_fill_null") + "/.zarray", lambda m: m.update(fill_value=None))
    w.manifest["dense"][-1]["fill_value"] = None

    # A taller array with several chunk rows per typical panel and 3 chunk columns.
    w.dense("v3_f64_tall", 3, "f64", "blosc-zstd-bitshuffle", shape=(1000, 12), chunks=(64, 5))
    w.dense("v2_f32_tall", 2, "f32", "blosc-lz4-bitshuffle", shape=(1000, 12), chunks=(64, 5))

    # Matrices with fewer rows than columns (rankwise reads them through the transpose, in
    # bands of chunk columns).
    w.dense("v3_f64_wide", 3, "f64", "blosc-lz4-shuffle", shape=(9, 40), chunks=(4, 6))
    w.dense("v2_i32_wide", 2, "i32", "zstd", shape=(9, 40), chunks=(4, 6))

    # Arrays inside groups: spec STORE:ARRAY.
    for zf in (2, 3):
        store = f"group_v{zf}"
        root = zarr.open_group(w.path(store), mode="w", zarr_format=zf)
        root.attrs["description"] = "rankwise Zarr interop fixture: arrays inside groups"
        grp = root.create_group("grp")
        for parent, array, dtype, codec in (
            (grp, "x", "f64", "blosc-zstd-shuffle"),
            (root, "top", "i32", "gzip"),
            (grp.create_group("deeper"), "y", "f32", "zstd"),
        ):
            name = f"{store}__{parent.path.replace('/', '_') or 'root'}_{array}"
            data = values(name, dtype, SHAPE)
            arr = parent.create_array(
                array,
                shape=SHAPE,
                dtype=NUMPY_DTYPE[dtype],
                chunks=CHUNKS,
                compressors=compressors(codec, zf),
            )
            arr[...] = data
            spec = f"{store}:{arr.path}"
            w.entry("dense", name, spec, arr, dtype, codec, data)


def check_empty_inner(shard_file, inner_per_shard, empty):
    """Parses a shard's index (at the end: offset, nbytes u64 pairs + 4-byte crc32c) and
    checks which inner chunks are marked empty."""
    raw = open(shard_file, "rb").read()
    n = inner_per_shard[0] * inner_per_shard[1]
    index = np.frombuffer(raw[-(16 * n + 4) : -4], dtype="<u8").reshape(inner_per_shard + (2,))
    marked = {
        (i, j)
        for i in range(inner_per_shard[0])
        for j in range(inner_per_shard[1])
        if (index[i, j] == np.iinfo(np.uint64).max).all()
    }
    if marked != set(empty):
        raise SystemExit(f"zarr_fixtures: {shard_file}: empty inner chunks {marked}, meant {empty}")


def edit_json(path, change):
    with open(path) as f:
        meta = json.load(f)
    change(meta)
    with open(path, "w") as f:
        json.dump(meta, f, indent=2)


def genotype_fixtures(w):
    shape, chunks = (41, 29), (16, 8)

    def dosages(name, signed):
        rng = rng_for(name)
        p = rng.uniform(0.02, 0.5, size=(shape[0], 1))
        g = rng.binomial(2, p, size=shape)
        if signed:
            g[rng.random(shape) < 0.06] = -1
            return g.astype("int8")
        return g.astype("uint8")

    for zf in (2, 3):
        w.dense(f"geno_i8_v{zf}", zf, "i8", "blosc-zstd-bitshuffle", shape=shape, chunks=chunks,
                kind="genotypes", data=dosages(f"geno_i8_v{zf}", True))
        w.dense(f"geno_u8_v{zf}", zf, "u8", "blosc-lz4-shuffle", shape=shape, chunks=chunks,
                kind="genotypes", data=dosages(f"geno_u8_v{zf}", False))
    w.dense("geno_i8_v3_sharded", 3, "i8", "zstd", shape=shape, chunks=chunks, shards=(32, 16),
            kind="genotypes", data=dosages("geno_i8_v3_sharded", True))
    w.dense("geno_i8_v2_missing_chunk", 2, "i8", "gzip", shape=shape, chunks=chunks,
            fill_value=-1, missing=[(1, 2)], kind="genotypes",
            data=dosages("geno_i8_v2_missing_chunk", True))


# ------------------------------------------------------------------------------------------
# VCF Zarr stores in bio2zarr's layout (the VCF Zarr specification's arrays, dimension names in
# _ARRAY_DIMENSIONS, zarr_format 2 with "/" chunk keys and variable-length string ids).

VCF_VARIANTS, VCF_SAMPLES, PLOIDY = 57, 19, 2
VCF_CHUNKS = (16, 8)


def vcf_genotypes():
    """call_genotype values: diploid calls of alleles 0..2 (biallelic and a few triallelic
    sites), some −1 alleles (missing), some haploid calls padded with −2 (mixed ploidy),
    a few calls that are all −2, and a few (−1, −2)."""
    rng = rng_for("vcf-genotypes")  # the same genotypes in every VCF fixture
    n_alleles = np.where(rng.random(VCF_VARIANTS) < 0.15, 3, 2)
    g = np.empty((VCF_VARIANTS, VCF_SAMPLES, PLOIDY), dtype="int8")
    for v in range(VCF_VARIANTS):
        p = rng.uniform(0.05, 0.6)
        alt = rng.random((VCF_SAMPLES, PLOIDY)) < p
        which_alt = rng.integers(1, n_alleles[v], size=(VCF_SAMPLES, PLOIDY), endpoint=False)
        g[v] = np.where(alt, which_alt, 0)
    r = rng.random((VCF_VARIANTS, VCF_SAMPLES, PLOIDY))
    g[r < 0.05] = -1
    haploid = rng.random((VCF_VARIANTS, VCF_SAMPLES)) < 0.04
    g[haploid, 1] = -2
    g[3, 4] = [-2, -2]
    g[40, 17] = [-2, -2]
    g[5, 6] = [-1, -2]
    g[6, 0] = [1, -2]
    g[7, 18] = [0, -2]
    g[8, 2] = [-1, -1]
    g[9, 3] = [2, 1]
    return g, n_alleles


def vcf_extra_mask():
    """Calls (both alleles) masked in call_genotype_mask although their alleles are
    non-negative: a reader that honours the mask reports them missing."""
    rng = rng_for("vcf-mask")
    m = rng.random((VCF_VARIANTS, VCF_SAMPLES)) < 0.05
    m[10, 5] = True
    return m


def vcf_dosages(g, mask):
    """The dosage rule of rankwise's VCF Zarr reader. Per allele: −2 is fill (ignored);
    −1, or a mask that is true on a non-fill allele, is missing. A call is missing (−1) if
    any allele is missing or no allele is left; otherwise its dosage is the number of
    alleles > 0. (bio2zarr writes call_genotype_mask = call_genotype < 0, so the mask is
    true on −2 fill alleles too: a haploid call (a, −2) is not missing.)"""
    fill = g == -2
    missing_allele = (g == -1) | ((mask if mask is not None else False) & ~fill)
    call_missing = missing_allele.any(axis=2) | fill.all(axis=2)
    dos = ((g > 0) & ~fill).sum(axis=2).astype("int8")
    dos[call_missing] = -1
    return dos


def vcf_store(w, name, zarr_format, with_mask, missing_region=False, null_fill=False,
              fixed_width_ids=False):
    g, n_alleles = vcf_genotypes()
    if missing_region:
        # Every call of variants 32..48 × samples 8..16 is missing: with fill_value −1,
        # zarr-python does not write that chunk and a reader must use the fill value.
        g[32:48, 8:16, :] = -1
    mask = None
    if with_mask:
        mask = (g < 0) | vcf_extra_mask()[:, :, None]
    path = w.path(name)
    root = zarr.open_group(path, mode="w", zarr_format=zarr_format)
    samples = [f"NA{19000 + 7 * i}" for i in range(VCF_SAMPLES)]
    samples[4] = "sample_ü_4"  # sample ids are UTF-8
    contigs = ["chr20", "chrX"]
    header = (
        "##fileformat=VCFv4.3\n"
        + "".join(f"##contig=<ID={c}>\n" for c in contigs)
        + '##FORMAT=<ID=GT,Number=1,Type=String,Description="Genotype">\n'
        + "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\tFORMAT\t"
        + "\t".join(samples)
        + "\n"
    )
    root.attrs.update(
        {
            "vcf_zarr_version": "0.2",
            "source": "rankwise scripts/zarr_fixtures.py (bio2zarr layout)",
            "vcf_header": header,
        }
    )
    blosc = {
        2: lambda shuffle: numcodecs.Blosc(cname="zstd", clevel=7, shuffle=shuffle),
        3: lambda shuffle: BloscCodec(
            cname="zstd", clevel=7,
            shuffle={0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}[shuffle]),
    }[zarr_format]
    keys = {"chunk_key_encoding": {"name": "v2", "separator": "/"}} if zarr_format == 2 else {}

    def array(arr_name, data, dims, chunks, shuffle=0, fill_value="default", **kw):
        extra = dict(keys)
        if zarr_format == 3:
            extra["dimension_names"] = dims
        if fill_value != "default":
            extra["fill_value"] = fill_value
        elif null_fill:
            # zarr-python 2's `empty()`, which bio2zarr uses, writes fill_value null.
            extra["fill_value"] = None
        a = root.create_array(
            arr_name,
            shape=data.shape,
            dtype=data.dtype if data.dtype.kind != "U" else str,
            chunks=chunks,
            compressors=blosc(shuffle),
            **extra,
            **kw,
        )
        a.attrs["_ARRAY_DIMENSIONS"] = list(dims)
        a[...] = data
        return a

    gt = array(
        "call_genotype", g, ["variants", "samples", "ploidy"], VCF_CHUNKS + (PLOIDY,), shuffle=2,
        **({"fill_value": -1} if missing_region else {}),
    )
    if with_mask:
        array("call_genotype_mask", mask, ["variants", "samples", "ploidy"],
              VCF_CHUNKS + (PLOIDY,), shuffle=2)
    phased = rng_for("vcf-phased").random((VCF_VARIANTS, VCF_SAMPLES)) < 0.5
    array("call_genotype_phased", phased, ["variants", "samples"], VCF_CHUNKS, shuffle=2)
    if fixed_width_ids:
        # numpy's fixed-width strings, as xarray's to_zarr writes them to format 2: dtype
        # `<U10` with "fill_value": null.
        a = root.create_array("sample_id", shape=(VCF_SAMPLES,), dtype=np.array(samples).dtype,
                              chunks=(VCF_CHUNKS[1],), fill_value=None, **keys)
        a.attrs["_ARRAY_DIMENSIONS"] = ["samples"]
        a[...] = np.array(samples)
        if json.loads(open(os.path.join(path, "sample_id", ".zarray")).read())["fill_value"] is not None:
            raise SystemExit(f"zarr_fixtures: {name}: sample_id was not written with a null fill")
    else:
        array("sample_id", np.array(samples), ["samples"], (VCF_CHUNKS[1],))
    array("contig_id", np.array(contigs), ["contigs"], (len(contigs),))
    array("contig_length", np.array([64444167, 156040895], dtype="int64"), ["contigs"], (2,))
    contig = (np.arange(VCF_VARIANTS) >= 45).astype("int8")
    array("variant_contig", contig, ["variants"], (VCF_CHUNKS[0],))
    pos = (np.cumsum(rng_for("vcf-pos").integers(1, 5000, VCF_VARIANTS)) + 60000).astype("int32")
    array("variant_position", pos, ["variants"], (VCF_CHUNKS[0],))
    bases = np.array(["A", "C", "G", "T"])
    alleles = np.full((VCF_VARIANTS, 3), "", dtype=object)
    ar = rng_for("vcf-alleles")
    for v in range(VCF_VARIANTS):
        picks = ar.permutation(4)[: n_alleles[v]]
        alleles[v, : n_alleles[v]] = bases[picks]
    array("variant_allele", alleles.astype(str), ["variants", "alleles"], (VCF_CHUNKS[0], 3))
    ids = np.array([f"rs{1000 + v}" if v % 3 else "." for v in range(VCF_VARIANTS)])
    array("variant_id", ids, ["variants"], (VCF_CHUNKS[0],))
    array("variant_id_mask", ids == ".", ["variants"], (VCF_CHUNKS[0],), shuffle=2)

    back = np.asarray(root["sample_id"][...]).tolist()
    if back != samples or not np.array_equal(gt[...], g):
        raise SystemExit(f"zarr_fixtures: {name}: zarr-python reads back other values")
    if with_mask and not np.array_equal(root["call_genotype_mask"][...], mask):
        raise SystemExit(f"zarr_fixtures: {name}: mask reads back differently")
    missing = []
    if missing_region:
        missing = [chunk_key(gt, (2, 1, 0))]
        if os.path.exists(os.path.join(path, "call_genotype", missing[0])):
            raise SystemExit(f"zarr_fixtures: {name}: chunk {missing[0]} was written")

    dos = vcf_dosages(gt[...], mask)
    dos.tofile(w.path(f"{name}.dosages.bin"))
    # The raw alleles (and mask) as read back, so that a test can show why a call differs.
    gt[...].tofile(w.path(f"{name}.call_genotype.bin"))
    if with_mask:
        root["call_genotype_mask"][...].astype("uint8").tofile(w.path(f"{name}.mask.bin"))
    with open(w.path(f"{name}.sample_ids.json"), "w") as f:
        json.dump(samples, f, ensure_ascii=False)
    w.manifest["vcf"].append(
        {
            "name": name,
            "spec": name,
            "zarr_format": zarr_format,
            "dtype": "i8",
            "shape": [VCF_VARIANTS, VCF_SAMPLES, PLOIDY],
            "chunks": list(VCF_CHUNKS) + [PLOIDY],
            "shards": None,
            "codec": "blosc-zstd-bitshuffle",
            "fill_value": json_scalar(gt.fill_value),
            "missing_chunks": missing,
            "mask": with_mask,
            "truth": f"{name}.dosages.bin",
            "truth_shape": [VCF_VARIANTS, VCF_SAMPLES],
            "sample_ids": f"{name}.sample_ids.json",
            "alleles": f"{name}.call_genotype.bin",
            "mask_truth": f"{name}.mask.bin" if with_mask else None,
            "counts": {
                "missing_calls": int((dos == -1).sum()),
                "calls_with_fill_alleles": int((g == -2).any(axis=2).sum()),
                "masked_non_negative_calls": int(
                    ((mask.any(axis=2)) & (g >= 0).all(axis=2)).sum()) if with_mask else 0,
            },
        }
    )


def vcf_fixtures(w):
    vcf_store(w, "vcf_v2_mask", 2, with_mask=True, null_fill=True)
    vcf_store(w, "vcf_v2_nomask", 2, with_mask=False, missing_region=True, fixed_width_ids=True)
    vcf_store(w, "vcf_v3_mask", 3, with_mask=True)
    # The brief's file names for the main VCF fixture.
    shutil.copyfile(w.path("vcf_v2_mask.dosages.bin"), w.path("vcf_dosages.bin"))
    shutil.copyfile(w.path("vcf_v2_mask.sample_ids.json"), w.path("vcf_sample_ids.json"))


# ------------------------------------------------------------------------------------------
# Failures.


def failure(
    w, name, spec, use, why, *, array=None, chunk=None, chunk_index=None, mentions=(), library=True
):
    """A fixture rankwise must refuse. `use`: how it is opened (matrix: ZarrMatrix / `svd
    --zarr`; genotypes: ZarrGenotypes / `pca --zarr`; vcf: VcfZarr / `pca --vcf-zarr`).
    `array`: the array path inside the store the error must name (None: the store itself);
    `chunk`: the store key of the damaged chunk, relative to the array (and its grid index);
    `mentions`: other words the error must contain (e.g. the unknown codec's name);
    `library`: False when only the command must refuse it (an int8 genotype source reports
    what is stored, and the kernels reject values that are no dosage)."""
    w.manifest["failures"].append(
        {
            "name": name,
            "spec": spec,
            "use": use,
            "why": why,
            "array": array,
            "chunk_key": chunk,
            "chunk_index": chunk_index,
            "mentions": list(mentions),
            "library": library,
        }
    )


def failure_fixtures(w):
    def plain(name, zf, dtype, codec, **kw):
        data = values(name, dtype, SHAPE)
        arr = zarr.create_array(
            w.path(name), shape=SHAPE, dtype=NUMPY_DTYPE[dtype], chunks=kw.pop("chunks", CHUNKS),
            compressors=compressors(codec, zf), zarr_format=zf, **kw)
        arr[...] = data
        return arr

    arr = plain("fail_truncated_chunk_v3", 3, "f64", "blosc-lz4-shuffle")
    key = chunk_key(arr, (1, 2))
    f = os.path.join(w.path("fail_truncated_chunk_v3"), key)
    raw = open(f, "rb").read()
    open(f, "wb").write(raw[: len(raw) // 2])
    failure(w, "fail_truncated_chunk_v3", "fail_truncated_chunk_v3", "matrix",
            "chunk file cut to half its length", chunk=key, chunk_index=[1, 2])

    arr = plain("fail_garbage_chunk_v2", 2, "f64", "zstd")
    key = chunk_key(arr, (3, 1))
    f = os.path.join(w.path("fail_garbage_chunk_v2"), key)
    n = os.path.getsize(f)
    open(f, "wb").write(rng_for("garbage").integers(0, 256, n, dtype="uint8").tobytes())
    failure(w, "fail_garbage_chunk_v2", "fail_garbage_chunk_v2", "matrix",
            "chunk file overwritten with random bytes", chunk=key, chunk_index=[3, 1])

    arr = plain("fail_garbage_chunk_v3_gzip", 3, "i16", "gzip")
    key = chunk_key(arr, (4, 4))
    f = os.path.join(w.path("fail_garbage_chunk_v3_gzip"), key)
    open(f, "wb").write(b"\x1f\x8b\x08\x00" + b"not a gzip stream" * 3)
    failure(w, "fail_garbage_chunk_v3_gzip", "fail_garbage_chunk_v3_gzip", "matrix",
            "gzip chunk with a valid magic and garbage after it", chunk=key, chunk_index=[4, 4])

    arr = plain("fail_truncated_shard_v3", 3, "f64", "zstd", chunks=(4, 5), shards=(16, 10))
    key = chunk_key(arr, (1, 1))
    f = os.path.join(w.path("fail_truncated_shard_v3"), key)
    raw = open(f, "rb").read()
    open(f, "wb").write(raw[: len(raw) - 40])  # the index at the end is cut
    failure(w, "fail_truncated_shard_v3", "fail_truncated_shard_v3", "matrix",
            "shard file whose index (at the end) is cut", chunk=key, chunk_index=[1, 1])

    # A damaged chunk inside a group: the error must name the array path in the store too.
    root = zarr.open_group(w.path("fail_group_garbage_v3"), mode="w", zarr_format=3)
    a = root.create_group("grp").create_array(
        "x", shape=SHAPE, dtype="float32", chunks=CHUNKS, compressors=compressors("blosc-zstd-shuffle", 3))
    a[...] = values("fail_group_garbage_v3", "f32", SHAPE)
    key = chunk_key(a, (0, 3))
    f = os.path.join(w.path("fail_group_garbage_v3"), "grp", "x", key)
    open(f, "wb").write(b"\x00" * 7)
    failure(w, "fail_group_garbage_v3", "fail_group_garbage_v3:grp/x", "matrix",
            "blosc chunk of 7 zero bytes, in an array inside a group", array="grp/x", chunk=key,
            chunk_index=[0, 3])

    plain("fail_unknown_codec_v3", 3, "f64", "zstd")
    edit_json(w.path("fail_unknown_codec_v3") + "/zarr.json",
              lambda m: m["codecs"][1].update(name="rankwise-test-unknown-codec"))
    failure(w, "fail_unknown_codec_v3", "fail_unknown_codec_v3", "matrix",
            "zarr.json names the codec rankwise-test-unknown-codec",
            mentions=["rankwise-test-unknown-codec"])

    plain("fail_unknown_codec_v2", 2, "f64", "zstd")
    edit_json(w.path("fail_unknown_codec_v2") + "/.zarray",
              lambda m: m["compressor"].update(id="rankwise-test-unknown-codec"))
    failure(w, "fail_unknown_codec_v2", "fail_unknown_codec_v2", "matrix",
            ".zarray names the compressor rankwise-test-unknown-codec",
            mentions=["rankwise-test-unknown-codec"])

    for name, zf, dtype, data in (
        ("fail_bool_v3", 3, "bool", values("fail_bool_v3", "i8", SHAPE) > 0),
        ("fail_complex_v2", 2, "complex128", values("fail_complex_v2", "f64", SHAPE) * 1j),
        ("fail_fixed_bytes_v2", 2, "S4", np.full(SHAPE, b"abcd", dtype="S4")),
        ("fail_string_v3", 3, str, np.full(SHAPE, "text", dtype=object)),
    ):
        a = zarr.create_array(w.path(name), shape=SHAPE, dtype=dtype, chunks=CHUNKS, zarr_format=zf)
        a[...] = data
        failure(w, name, name, "matrix", f"{a.dtype} array: not a numeric dtype an SVD can use")
    failure(w, "fail_bool_genotypes_v3", "fail_bool_v3", "genotypes",
            "bool array given as genotype dosages")

    # Integer arrays holding a value that is no dosage, in one known chunk.
    for name, zf, dtype, bad in (("fail_bad_dosage_v3", 3, "int8", 3), ("fail_bad_dosage_v2", 2, "int16", -5)):
        g = rng_for(name).integers(0, 2, size=(41, 29), endpoint=True).astype(dtype)
        g[20, 9] = bad
        a = zarr.create_array(w.path(name), shape=g.shape, dtype=dtype, chunks=(16, 8),
                              compressors=compressors("zstd", zf), zarr_format=zf)
        a[...] = g
        # int8 values reach the kernels as stored, so the chunk is not named there.
        where = {} if dtype == "int8" else {"chunk": chunk_key(a, (1, 1)), "chunk_index": [1, 1]}
        failure(w, name, name, "genotypes",
                f"value {bad} at variant 20, sample 9 is not a dosage (−1, 0, 1, 2)",
                mentions=["variant 20, sample 9"], library=dtype != "int8", **where)

    plain("fail_float_genotypes_v3", 3, "f32", "zstd")
    failure(w, "fail_float_genotypes_v3", "fail_float_genotypes_v3", "genotypes",
            "float32 array given as genotype dosages (integers expected)")

    a = zarr.create_array(w.path("fail_3d_v3"), shape=(7, 6, 5), dtype="int16", chunks=(4, 3, 5),
                          zarr_format=3)
    a[...] = np.arange(210, dtype="int16").reshape(7, 6, 5)
    failure(w, "fail_3d_v3", "fail_3d_v3", "matrix", "3-D array given as a matrix")
    failure(w, "fail_3d_genotypes_v3", "fail_3d_v3", "genotypes", "3-D array given as genotypes")
    a = zarr.create_array(w.path("fail_1d_v2"), shape=(50,), dtype="float64", chunks=(16,),
                          zarr_format=2)
    a[...] = np.arange(50.0)
    failure(w, "fail_1d_v2", "fail_1d_v2", "matrix", "1-D array given as a matrix")

    os.makedirs(w.path("fail_not_zarr"))
    with open(w.path("fail_not_zarr/README.txt"), "w") as f:
        f.write("This directory is not a Zarr store.\n")
    failure(w, "fail_not_zarr", "fail_not_zarr", "matrix", "directory without Zarr metadata")
    failure(w, "fail_not_zarr_vcf", "fail_not_zarr", "vcf", "directory without Zarr metadata")
    failure(w, "fail_no_such_store", "fail_does_not_exist", "matrix", "path does not exist")
    failure(w, "fail_no_such_array", "group_v3:grp/nope", "matrix",
            "the group has no array grp/nope", array="grp/nope")
    failure(w, "fail_group_not_array", "group_v2:grp", "matrix",
            "grp is a group, not an array", array="grp")
    failure(w, "fail_group_without_array", "group_v3", "matrix",
            "the store is a group and no array is named")

    root = zarr.open_group(w.path("fail_vcf_no_genotype"), mode="w", zarr_format=2)
    root.attrs["vcf_zarr_version"] = "0.2"
    s = root.create_array("sample_id", shape=(3,), dtype=str, chunks=(3,))
    s[...] = np.array(["a", "b", "c"])
    failure(w, "fail_vcf_no_genotype", "fail_vcf_no_genotype", "vcf",
            "VCF Zarr store without call_genotype", array="call_genotype")

    # VCF Zarr with call_genotype of a float dtype.
    root = zarr.open_group(w.path("fail_vcf_float_genotype"), mode="w", zarr_format=3)
    a = root.create_array("call_genotype", shape=(6, 4, 2), dtype="float32", chunks=(4, 4, 2))
    a[...] = 0.0
    s = root.create_array("sample_id", shape=(4,), dtype=str, chunks=(4,))
    s[...] = np.array(["a", "b", "c", "d"])
    failure(w, "fail_vcf_float_genotype", "fail_vcf_float_genotype", "vcf",
            "call_genotype is float32", array="call_genotype")

    # VCF Zarr whose call_genotype has a damaged chunk.
    vcf_store(w, "fail_vcf_garbage_chunk", 2, with_mask=False)
    w.manifest["vcf"].pop()
    for suffix in (".dosages.bin", ".sample_ids.json", ".call_genotype.bin"):
        os.remove(w.path("fail_vcf_garbage_chunk" + suffix))
    key = "1/2/0"
    f = os.path.join(w.path("fail_vcf_garbage_chunk"), "call_genotype", key)
    open(f, "wb").write(b"\x02\x01" + b"\xff" * 30)
    failure(w, "fail_vcf_garbage_chunk", "fail_vcf_garbage_chunk", "vcf",
            "call_genotype chunk of garbage bytes", array="call_genotype", chunk=key,
            chunk_index=[1, 2, 0])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", help="directory to create (must not exist)")
    args = p.parse_args()
    if os.path.exists(args.outdir):
        p.error(f"{args.outdir} exists already")
    os.makedirs(args.outdir)
    w = Writer(args.outdir)
    dense_fixtures(w)
    genotype_fixtures(w)
    vcf_fixtures(w)
    failure_fixtures(w)
    with open(w.path("manifest.json"), "w") as f:
        json.dump(w.manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
