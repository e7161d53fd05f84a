//! The device's Blosc decode reproduces c-blosc bit for bit: a frame's stored streams copied
//! by `copy_segments`, its compressed streams decompressed to their places (on the host
//! here; by nvCOMP on a GPU), and every block put together by `blosc_unshuffle`, for LZ4 and
//! Zstandard frames with no, byte and bit shuffle, typesizes 1 to 17 and short last blocks.
//! Checked on the host CPU, through the device crate's host build of `kernels.cu` (see
//! `rankwise_device::host`), so that `make test` checks the kernels where no GPU is present;
//! `tests/gpu.rs` checks the same on a GPU with nvCOMP.

use rankwise_device::host::{Guarded, HostArgs, HostKernels};
use rankwise_sources::{BlockShuffle, BloscLayout};
use rankwise_testkit::Draw;

fn kernels() -> &'static HostKernels {
    HostKernels::get().unwrap_or_else(|e| panic!("{e}"))
}

/// A frame of `values` compressed by c-blosc.
fn compress(
    values: &[u8],
    typesize: usize,
    shuffle: i32,
    blocksize: usize,
    codec: &str,
) -> Vec<u8> {
    let mut out = vec![0u8; values.len() + blosc_src::BLOSC_MAX_OVERHEAD as usize];
    let compressor = std::ffi::CString::new(codec).unwrap();
    // SAFETY: sizes as documented by blosc_compress_ctx; `out` has room for the worst case
    // (input plus overhead).
    let n = unsafe {
        blosc_src::blosc_compress_ctx(
            5,
            shuffle,
            typesize,
            values.len(),
            values.as_ptr().cast(),
            out.as_mut_ptr().cast(),
            out.len(),
            compressor.as_ptr(),
            blocksize,
            1,
        )
    };
    assert!(n > 0, "blosc_compress_ctx: {n}");
    out.truncate(n as usize);
    out
}

/// Genotype-like values (small integers, repeated) with stretches of noise, so that frames
/// hold both compressed and stored streams.
fn values(len: usize, d: &mut Draw) -> Vec<u8> {
    let noisy = d.below(len as u64 + 1) as usize;
    (0..len)
        .map(|i| {
            if i >= noisy && i < noisy + len / 4 {
                d.next() as u8
            } else {
                (d.below(3) as u8).wrapping_sub((d.below(50) == 0) as u8)
            }
        })
        .collect()
}

/// Where the decoded frame starts in the kernel's output.
const SHIFT: usize = 3;

/// Decodes `frame` as the device does, with the kernels run on the host.
fn device_decode(frame: &[u8], layout: &BloscLayout, grid: (u32, u32), threads: u32) -> Vec<u8> {
    let k = kernels();
    let n = layout.nbytes;
    // The compressed streams, decompressed where nvCOMP would put them; the stored ones
    // left to copy_segments (the host's decode of them is overwritten below).
    let mut decoded = vec![0u8; n];
    layout.decompress_streams(frame, &mut decoded).unwrap();
    let mut streams = Guarded::<u8>::zeroed(n);
    let stored: Vec<u64> = (layout.streams.iter())
        .filter(|s| s.stored)
        .flat_map(|s| [s.src.start as u64, s.dst.start as u64, s.src.len() as u64])
        .collect();
    for s in layout.streams.iter().filter(|s| !s.stored) {
        streams.values_mut()[s.dst.clone()].copy_from_slice(&decoded[s.dst.clone()]);
    }
    if !stored.is_empty() {
        let mut a = HostArgs::new();
        a.buffer(streams.values_mut())
            .input(frame)
            .input(&stored)
            .value((stored.len() / 3) as u32);
        k.launch(
            "copy_segments",
            (grid.0, grid.1, 1),
            (threads, 1, 1),
            &mut a,
        )
        .unwrap();
    }
    streams.check("copy_segments").unwrap();
    let blocks: Vec<u64> = (layout.blocks.iter())
        .flat_map(|b| {
            let kind = match b.shuffle {
                BlockShuffle::None => 0,
                BlockShuffle::Byte => 1,
                BlockShuffle::Bit => 2,
            };
            [
                b.at.start as u64,
                (SHIFT + b.at.start) as u64,
                b.at.len() as u64,
                kind,
            ]
        })
        .collect();
    // Blocks land `SHIFT` bytes on in `out` (where a chunk lies in a batch's output).
    let mut out = Guarded::<u8>::zeroed(SHIFT + n);
    let mut a = HostArgs::new();
    a.buffer(out.values_mut())
        .input(streams.values())
        .input(&blocks)
        .value(layout.blocks.len() as u32)
        .value(layout.typesize as u32);
    k.launch(
        "blosc_unshuffle",
        (grid.0, grid.1, 1),
        (threads, 1, 1),
        &mut a,
    )
    .unwrap();
    out.check("blosc_unshuffle").unwrap();
    assert!(out.values()[..SHIFT].iter().all(|&b| b == 0));
    out.values()[SHIFT..].to_vec()
}

#[test]
fn device_decode_is_c_blosc_for_lz4_and_zstd_with_every_shuffle() {
    let mut d = Draw::fresh();
    let mut kinds = std::collections::BTreeSet::new();
    for codec in ["lz4", "zstd"] {
        for &typesize in &[1usize, 2, 3, 4, 8, 16, 17] {
            for shuffle in [0i32, 1, 2] {
                let len = 1 + d.below(90_000) as usize;
                // c-blosc's own choice, or blocks of 256 B to 64 KiB (the last one short).
                let blocksize = [0, 256 << d.below(9)][d.below(2) as usize] as usize;
                let v = values(len, &mut d);
                let frame = compress(&v, typesize, shuffle, blocksize, codec);
                let what = format!(
                    "{codec} typesize {typesize} shuffle {shuffle} len {len} blocksize {blocksize}"
                );
                let layout = BloscLayout::of(&frame)
                    .unwrap_or_else(|e| panic!("{what}: {e}"))
                    .unwrap_or_else(|| panic!("{what}: no layout"));
                for b in &layout.blocks {
                    kinds.insert(format!("{:?}", b.shuffle));
                }
                kinds.extend(
                    layout
                        .streams
                        .iter()
                        .map(|s| format!("stored {}", s.stored)),
                );
                // Grids with fewer threads than a block's work, and rows fewer than blocks.
                let grid = (1 + d.below(4) as u32, 1 + d.below(3) as u32);
                let threads = [32u32, 64, 256][d.below(3) as usize];
                let got = device_decode(&frame, &layout, grid, threads);
                if let Some(i) = (0..len).find(|&i| got[i] != v[i]) {
                    panic!("{what}: byte {i} is {} not {}", got[i], v[i]);
                }
            }
        }
    }
    // Every kind of block and stream was met.
    for kind in ["None", "Byte", "Bit", "stored true", "stored false"] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
}

/// Decoded int8 dosages of fresh shapes and strides, some missing and, in some rounds, some
/// that are not dosages: `dosage_codes` packs each value's low two bits four per byte (what
/// the host's `pack_row` stages for a GPU actor), leaves the row's padding bytes alone,
/// counts each code per variant, and reports the first value that is not a dosage.
#[test]
fn dosage_kernel_packs_and_counts_decoded_dosages_and_finds_the_first_bad_one() {
    let k = kernels();
    let mut d = Draw::fresh();
    for round in 0..12 {
        let n = 1 + d.below(1200) as usize;
        let h = 1 + d.below(9) as usize;
        let ldin = n + d.below(5) as usize;
        let stride = n.div_ceil(4);
        let ldout = stride + d.below(3) as usize;
        let what = format!("round {round}: {h} × {n}, ld {ldin} → {ldout}");
        let mut dosages = Guarded::<i8>::zeroed(h * ldin);
        for v in dosages.values_mut() {
            *v = d.below(4) as i8 - 1;
        }
        // Some rounds plant values that are not dosages.
        let mut first_bad = u64::MAX;
        if round % 3 == 2 {
            for _ in 0..1 + d.below(3) {
                let (i, j) = (d.below(h as u64) as usize, d.below(n as u64) as usize);
                dosages.values_mut()[i * ldin + j] = [3i8, -2, 100, -128][d.below(4) as usize];
                first_bad = first_bad.min((i * n + j) as u64);
            }
        }
        let mut packed = Guarded::<u8>::zeroed(h * ldout);
        packed.values_mut().fill(0xEE);
        let mut counts = Guarded::<u32>::zeroed(4 * h);
        let mut bad = Guarded::<u64>::zeroed(1);
        bad.values_mut()[0] = u64::MAX;
        let threads = [32u32, 256][round % 2];
        let groups = n.div_ceil(16) as u32;
        let grid = (groups.div_ceil(threads), 1 + d.below(h as u64) as u32, 1);
        {
            let mut a = HostArgs::new();
            a.buffer(packed.values_mut())
                .buffer(counts.values_mut())
                .buffer(bad.values_mut())
                .input(dosages.values())
                .value(h as u32)
                .value(n as u32)
                .value(ldin as u32)
                .value(ldout as u32);
            k.launch("dosage_codes", grid, (threads, 1, 1), &mut a)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        packed.check(&what).unwrap();
        counts.check(&what).unwrap();
        bad.check(&what).unwrap();
        assert_eq!(
            bad.values()[0],
            first_bad,
            "{what}: the first value not a dosage"
        );
        for i in 0..h {
            let row = &dosages.values()[i * ldin..i * ldin + n];
            let mut want = vec![0u8; stride];
            let mut want_counts = [0u32; 4];
            for (j, &v) in row.iter().enumerate() {
                let code = (v as u8) & 3;
                want[j / 4] |= code << (2 * (j % 4));
                want_counts[code as usize] += 1;
            }
            let got = &packed.values()[i * ldout..(i + 1) * ldout];
            assert_eq!(&got[..stride], &want[..], "{what}: variant {i}");
            assert!(
                got[stride..].iter().all(|&b| b == 0xEE),
                "{what}: variant {i} padding"
            );
            assert_eq!(
                &counts.values()[4 * i..4 * i + 4],
                &want_counts[..],
                "{what}: counts of variant {i}"
            );
        }
    }
}

/// A Zarr v3 store of `m × n` int8 `values` (row-major) in chunks of `c × cols` rows,
/// written here (Blosc LZ4 frames from c-blosc, bit shuffle) with `dtype` as its data type.
fn write_store(
    root: &std::path::Path,
    (m, n, c, cols): (usize, usize, usize, usize),
    dtype: &str,
    values: &[u8],
) -> Vec<Vec<u8>> {
    std::fs::create_dir_all(root).unwrap();
    let meta = serde_json::json!({
        "zarr_format": 3, "node_type": "array", "shape": [m, n], "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [c, cols]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5,
             "shuffle": "bitshuffle", "typesize": 1, "blocksize": 0}}
        ]
    });
    std::fs::write(root.join("zarr.json"), meta.to_string()).unwrap();
    let mut frames = Vec::new();
    for (i, r0) in (0..m).step_by(c).enumerate() {
        for (j, c0) in (0..n).step_by(cols).enumerate() {
            // A whole chunk, fill values past the array's edge.
            let mut chunk = vec![0u8; c * cols];
            for r in r0..(r0 + c).min(m) {
                for k in c0..(c0 + cols).min(n) {
                    chunk[(r - r0) * cols + k - c0] = values[r * n + k];
                }
            }
            let f = compress(&chunk, 1, 2, 0, "lz4");
            let dir = root.join("c").join(i.to_string());
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(j.to_string()), &f).unwrap();
            frames.push(f);
        }
    }
    frames
}

/// Which stores a GPU decodes itself (`StoredPanels::device_frames`), and their frames read
/// as stored: int8 chunks spanning every sample in local Blosc files; not wider types, not
/// chunks that split the samples, not a subset of the samples. A chunk without a file reads
/// as `false` (the caller decodes it on the host).
#[test]
fn stores_whose_chunks_the_device_decodes_hand_over_their_frames() {
    use rankwise_sources::{GenotypeSource, SampleSubset, ZarrGenotypes};
    let mut d = Draw(rankwise_testkit::test_seed());
    let dir = rankwise_testkit::scratch("device-frames");
    for case in 0..3 {
        let (m, n) = (d.range(50, 400) as usize, d.range(20, 300) as usize);
        // At least two chunks of rows: the second's file is removed below (with m ≤ c,
        // one chunk held every row and the removal found no file).
        let c = d.range(8, 64.min(m as u64 / 2)) as usize;
        // Chunks as wide as the array, or wider (fill values past its last sample).
        let cols = n + case * d.range(1, 9) as usize;
        let values: Vec<u8> = (0..m * n)
            .map(|_| (d.range(0, 4) as u8).wrapping_sub(1))
            .collect();
        let root = dir.join(format!("i8-{case}.zarr"));
        let frames = write_store(&root, (m, n, c, cols), "int8", &values);
        let z = ZarrGenotypes::open(root.to_str().unwrap()).unwrap();
        let stored = z.stored().unwrap();
        let geometry = stored.device_frames().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(geometry.chunk_rows, c as u64);
        assert_eq!(geometry.row_bytes, cols as u64);
        for (i, f) in frames.iter().enumerate() {
            assert!(geometry.most_encoded >= f.len() as u64);
            let mut got = Vec::new();
            assert!(stored.read_frame(i as u64, &mut got).unwrap());
            assert_eq!(&got, f, "chunk {i}");
        }
        std::fs::remove_file(root.join("c").join("1").join("0")).unwrap();
        let mut got = Vec::new();
        assert!(
            !stored.read_frame(1, &mut got).unwrap(),
            "a chunk without a file"
        );
        // A subset of the samples is decoded on the host.
        let ids: Vec<String> = (0..n).map(|j| format!("s{j}")).collect();
        let sub = SampleSubset::new(std::sync::Arc::new(z.clone()), "a test", &ids, |j, _| j < 2);
        assert!(GenotypeSource::stored(&sub)
            .unwrap()
            .device_frames()
            .is_err());
    }
    // Chunks that split the samples, and a wider type.
    let (m, n) = (64, 40);
    let values = vec![1u8; m * n];
    let root = dir.join("split.zarr");
    write_store(&root, (m, n, 16, 16), "int8", &values);
    let why = ZarrGenotypes::open(root.to_str().unwrap())
        .unwrap()
        .stored()
        .unwrap()
        .device_frames()
        .unwrap_err();
    assert!(why.contains("do not span all 40 samples"), "{why}");
    let root = dir.join("u8.zarr");
    write_store(&root, (m, n, 16, n), "uint8", &values);
    let why = ZarrGenotypes::open(root.to_str().unwrap())
        .unwrap()
        .stored()
        .unwrap()
        .device_frames()
        .unwrap_err();
    assert!(why.contains("int8"), "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}
