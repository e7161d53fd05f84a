"""Writes a genotype Zarr store's dosages as a PLINK 1 binary fileset, for benches/plink.sh.

    python tools/zarr_to_bed.py STORE.zarr PREFIX

STORE.zarr is a group as `rankwise gen --dist genotype` writes it: `call_dosage` (variants ×
samples, int8, −1 missing) and `sample_id`. PREFIX.bed is variant-major; each dosage counts
the `.bim`'s first allele (code 00 = two copies, 10 = one, 11 = none, 01 = missing), so that
PLINK and `rankwise pca --bed` see the store's own matrix. Written under temporary names and
renamed when complete.
"""

import os
import sys

import numpy as np
import zarr

# Dosage + 1 (−1 missing … 2) → the call's two bits.
CODES = np.array([0b01, 0b11, 0b10, 0b00], dtype=np.uint8)


def main():
    store, prefix = sys.argv[1], sys.argv[2]
    group = zarr.open_group(store, mode="r")
    dosages = group["call_dosage"]
    m, n = dosages.shape
    ids = [str(s) for s in group["sample_id"][:]] if "sample_id" in group else [f"s{j}" for j in range(n)]
    record = (n + 3) // 4
    step = max(1, (256 << 20) // n)
    tmp = {ext: f"{prefix}.{ext}.tmp-{os.getpid()}" for ext in ("bed", "bim", "fam")}
    with open(tmp["bed"], "wb") as bed:
        bed.write(bytes([0x6C, 0x1B, 0x01]))
        for r0 in range(0, m, step):
            g = np.asarray(dosages[r0 : r0 + step], dtype=np.int16)
            c = CODES[g + 1]
            pad = record * 4 - n
            if pad:
                c = np.concatenate([c, np.zeros((c.shape[0], pad), np.uint8)], axis=1)
            c = c.reshape(c.shape[0], record, 4)
            packed = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
            bed.write(np.ascontiguousarray(packed, dtype=np.uint8).tobytes())
    with open(tmp["bim"], "w") as bim:
        bim.writelines(f"1\tv{i}\t0\t{i + 1}\tA\tG\n" for i in range(m))
    with open(tmp["fam"], "w") as fam:
        fam.writelines(f"{s}\t{s}\t0\t0\t0\t-9\n" for s in ids)
    for ext, path in tmp.items():
        os.replace(path, f"{prefix}.{ext}")
    print(f"{prefix}.bed: {m} variants × {n} samples, {os.path.getsize(prefix + '.bed')} bytes")


if __name__ == "__main__":
    main()
