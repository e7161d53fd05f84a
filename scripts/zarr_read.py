"""Reads a Zarr group with zarr-python and prints it as JSON, for rankwise's readback tests.

    target/zarr-venv/bin/python scripts/zarr_read.py GROUP

rankwise writes its results (`--out run.zarr`: arrays U, S, Vt, eigenvalues, ...; see
launch/src/output.rs) as a Zarr v3 group; this script is the independent reader that
checks that zarr-python sees what rankwise meant to write. It prints one JSON object:

    {"zarr_format": 3,
     "attributes": {...the group's attributes...},
     "arrays": {"S": {"shape": [k], "dtype": "float64", "chunks": [...],
                      "values": [...flattened in C order; NaN and ±inf as null...],
                      "f64_bits": [...the same values as the integer bits of float64...]},
                ...}}

`f64_bits` carries the exact values (a JSON float parser need not round correctly);
`values` is for reading by eye. Arrays in subgroups are listed under their path (a/b).
Warnings zarr-python gives while reading (e.g. about files in the group that are not Zarr
nodes) are listed under "warnings", not printed.
Exits non-zero with a message on stderr when GROUP is not a Zarr group.
"""

import json
import sys
import warnings

import numpy as np
import zarr


def arrays(group, prefix=""):
    for name, node in sorted(group.members(), key=lambda m: m[0]):
        path = f"{prefix}{name}"
        if isinstance(node, zarr.Group):
            yield from arrays(node, path + "/")
        else:
            yield path, node


def describe(array):
    data = np.asarray(array[...])
    out = {
        "shape": list(array.shape),
        "dtype": str(data.dtype),
        "chunks": list(array.chunks),
        "fill_value": None,
    }
    if data.dtype.kind in "biuf":
        flat = data.ravel(order="C")
        out["values"] = [
            (v.item() if np.isfinite(v) else None) if data.dtype.kind == "f" else v.item()
            for v in flat
        ]
        out["f64_bits"] = flat.astype(np.float64).view(np.uint64).tolist()
        fill = array.fill_value
        if fill is not None:
            out["fill_value"] = float(fill) if np.isfinite(float(fill)) else str(float(fill))
    else:
        out["values"] = [str(v) for v in data.ravel(order="C")]
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} GROUP")
    path = sys.argv[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            group = zarr.open_group(path, mode="r")
        except Exception as e:  # zarr-python raises several types for a missing or bad group
            sys.exit(f"zarr_read.py: {path}: not a Zarr group ({type(e).__name__}: {e})")
        result = {
            "zarr_format": group.metadata.zarr_format,
            "attributes": dict(group.attrs),
            "arrays": {name: describe(a) for name, a in arrays(group)},
        }
    result["warnings"] = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    json.dump(result, sys.stdout, allow_nan=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
