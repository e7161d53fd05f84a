//! Matrices read from Zarr: the same bits as generating them, for 1–4 ranks (embedded and
//! under `mpirun`); streamed passes within the memory budget; a damaged chunk reported by
//! every rank, naming the chunk, with no hang; budgets that cannot hold a stored chunk
//! refused before any work.
//!
//! The stores here are written with zarrs from the generator's own values, so a run over
//! the store and a run over the generator must agree bit for bit. Interoperability with
//! stores written by zarr-python is in `zarr_interop.rs`.
//!
//! Build the binary first (`cargo build --release --workspace --bins`; `make test` does).

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use rankwise::sources::{Dist, Generated, PanelSource};
use zarrs::array::{data_type, ArrayBuilder};
use zarrs::filesystem::FilesystemStore;

/// Writes the generated `rows × cols` uniform matrix of `seed` as a float64 Zarr v3 array
/// with chunks `chunk` (uncompressed, so that a damaged chunk is detected by its length).
fn write_generated(dir: &Path, rows: u64, cols: u64, chunk: (u64, u64), seed: u64) {
    let g = Generated::new(rows, cols, seed, Dist::Uniform);
    write_f64(dir, (rows, cols), chunk, |r, band| g.fill(r, band).unwrap());
}

/// Writes a `rows × cols` float64 Zarr v3 array with chunks `chunk`, uncompressed, band of
/// chunk rows by band: `fill(rows, band)` supplies the values of rows `rows`.
fn write_f64(
    dir: &Path,
    (rows, cols): (u64, u64),
    chunk: (u64, u64),
    fill: impl Fn(std::ops::Range<u64>, ndarray::ArrayViewMut2<'_, f64>),
) {
    let store = Arc::new(FilesystemStore::new(dir).unwrap());
    let array = ArrayBuilder::new(
        vec![rows, cols],
        vec![chunk.0, chunk.1],
        data_type::float64(),
        0.0f64,
    )
    .build(store, "/")
    .unwrap();
    array.store_metadata().unwrap();
    for ci in 0..rows.div_ceil(chunk.0) {
        let r = ci * chunk.0..((ci + 1) * chunk.0).min(rows);
        let mut band = ndarray::Array2::<f64>::zeros(((r.end - r.start) as usize, cols as usize));
        fill(r.clone(), band.view_mut());
        for cj in 0..cols.div_ceil(chunk.1) {
            let c = cj * chunk.1..((cj + 1) * chunk.1).min(cols);
            let block = band.slice(ndarray::s![.., c.start as usize..c.end as usize]);
            let values: Vec<f64> = block.iter().copied().collect();
            array
                .store_chunk_subset(
                    &[ci, cj],
                    &[0..r.end - r.start, 0..c.end - c.start],
                    &values[..],
                )
                .unwrap();
        }
    }
}

#[test]
fn a_zarr_matrix_gives_the_generated_bits_for_1_to_4_ranks() {
    let dir = scratch("zarr-bits");
    let mut draw = Draw(test_seed());
    let seed = draw.next() % 1000;
    // A tall matrix (panels are chunk rows) and a wide one (panels are chunk columns).
    let tall = (draw.range(3000, 6000), draw.range(12, 30));
    let wide = (draw.range(10, 24), draw.range(2000, 4000));
    for (name, (rows, cols)) in [("tall", tall), ("wide", wide)] {
        let long = rows.max(cols);
        let band = draw.range(long / 9, long / 4);
        let chunk = if rows >= cols {
            (band, draw.range(5, cols))
        } else {
            (draw.range(3, rows), band)
        };
        let store = dir.join(format!("{name}.zarr"));
        write_generated(&store, rows, cols, chunk, seed);
        let z = store.to_str().unwrap();
        let (r, c, b, s) = (
            rows.to_string(),
            cols.to_string(),
            band.to_string(),
            seed.to_string(),
        );
        for cmd in ["svd", "rsvd"] {
            let mut gen = strings(&[
                cmd,
                "--rows",
                &r,
                "--cols",
                &c,
                "--chunk-rows",
                &b,
                "--seed",
                &s,
                "--json",
            ]);
            let mut zarr = strings(&[cmd, "--zarr", z, "--json"]);
            if cmd == "rsvd" {
                let extra = ["-k", "4", "--oversample", "5", "--sketch-seed", "7"];
                gen.extend(strings(&extra));
                zarr.extend(strings(&extra));
            }
            let want = json_bits(&report(&embedded(&gen))["singular_values"]);
            let one = report(&embedded(&zarr));
            assert_eq!(
                json_bits(&one["singular_values"]),
                want,
                "{name} {cmd}, 1 rank"
            );
            // Every stored chunk was decoded, at least once (more in a pass of its own).
            let chunks = rows.div_ceil(chunk.0) * cols.div_ceil(chunk.1);
            let decoded = one["per_rank"][0]["read"]["chunks"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name} {cmd}: no per_rank[0].read.chunks in {one}"));
            assert!(
                decoded >= chunks,
                "{name} {cmd}: {decoded} chunks decoded of {chunks}"
            );
            let mut two = zarr.clone();
            two.extend(strings(&["--local-ranks", "2"]));
            assert_eq!(
                json_bits(&report(&embedded(&two))["singular_values"]),
                want,
                "{name} {cmd}, 2 local ranks"
            );
            for np in [3, 4] {
                assert_eq!(
                    json_bits(&report(&under_mpirun(np, &zarr))["singular_values"]),
                    want,
                    "{name} {cmd}, mpirun -np {np}"
                );
            }
        }
    }
}

#[test]
fn rsvd_streams_a_zarr_array_four_times_its_budget_within_budget() {
    let dir = scratch("zarr-budget");
    let seed = test_seed() % 1000;
    // 150,000 × 200 float64: 240 MB stored, in 8 MB bands.
    let (rows, cols, band) = (150_000u64, 200u64, 5_000u64);
    let store = dir.join("big.zarr");
    write_generated(&store, rows, cols, (band, cols), seed);
    let z = store.to_str().unwrap();
    // Fixed iterations (the q = 2 of Dask's comparisons), whose TSQR holds each panel's
    // factor beside the basis, and LOBPCG to its tolerance, whose last pass holds A·X, its
    // Q and the probe products and whose iterates live on the root: they plan 52.4 and
    // 52.6 MiB.
    let mut run = serde_json::Value::Null;
    for (budget, extra) in [
        (56u64 << 20, &["--power-iters", "2"][..]),
        (56 << 20, &[][..]),
    ] {
        assert!(rows * cols * 8 >= 4 * budget);
        let budget_arg = format!("{}M", budget >> 20);
        let mut args = strings(&[
            "rsvd",
            "--zarr",
            z,
            "-k",
            "5",
            "--actors",
            "1",
            "--memory-per-actor",
            &budget_arg,
            "--sketch-seed",
            "11",
            "--json",
        ]);
        args.extend(strings(extra));
        run = report(&embedded(&args));
        // Each pass re-reads the data: the plan cannot keep it.
        let passes = run["passes"].as_u64().unwrap();
        let rank = &run["per_rank"][0];
        let decoded = rank["read"]["decoded_bytes"].as_u64().unwrap();
        assert_eq!(decoded, passes * rows * cols * 8, "{extra:?}: {run:#}");
        // Stated fixed overhead: the binary, its libraries and BLAS's own buffers.
        const OVERHEAD: u64 = 64 << 20;
        let peak = rank["peak_rss_bytes"].as_u64().unwrap();
        assert!(
            peak <= budget + OVERHEAD,
            "{extra:?}: peak RSS {peak} exceeds the budget {budget} + {OVERHEAD}: {run:#}"
        );
    }
    // And the answer is the generated matrix's, bit for bit.
    let (r, c, b, s) = (
        rows.to_string(),
        cols.to_string(),
        band.to_string(),
        seed.to_string(),
    );
    let gen = report(&embedded(&strings(&[
        "rsvd",
        "--rows",
        &r,
        "--cols",
        &c,
        "--chunk-rows",
        &b,
        "--seed",
        &s,
        "-k",
        "5",
        "--sketch-seed",
        "11",
        "--json",
    ])));
    assert_eq!(
        json_bits(&run["singular_values"]),
        json_bits(&gen["singular_values"])
    );
}

#[test]
fn a_damaged_chunk_fails_every_rank_naming_the_chunk() {
    let dir = scratch("zarr-damaged");
    let store = dir.join("m.zarr");
    write_generated(&store, 4000, 20, (500, 20), 3);
    // The last band: owned by the last rank, so the others learn of it through the
    // failure notice, not from their own reads.
    let chunk = store.join("c").join("7").join("0");
    let bytes = std::fs::read(&chunk).unwrap();
    std::fs::write(&chunk, &bytes[..bytes.len() / 2]).unwrap();
    let z = store.to_str().unwrap();
    for cmd in ["svd", "rsvd"] {
        let out = dir.join(format!("{cmd}-out.zarr"));
        let args = strings(&[cmd, "--zarr", z, "--out", out.to_str().unwrap()]);
        let run = under_mpirun(3, &args);
        run.assert_finished();
        assert!(!run.success(), "{}", run.describe());
        let lines: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.contains("failed:"))
            .collect();
        assert!(lines.len() >= 3, "every rank reports: {}", run.describe());
        for l in &lines {
            assert!(l.contains("c/7/0") && l.contains("m.zarr"), "{l}");
        }
        assert!(!out.exists(), "no output is left looking complete");
    }
}

#[test]
fn a_budget_below_one_stored_chunk_is_refused_naming_chunk_and_budget() {
    let dir = scratch("zarr-tiny-budget");
    let store = dir.join("m.zarr");
    write_generated(&store, 2000, 50, (1000, 50), 1);
    let z = store.to_str().unwrap();
    for cmd in ["plan", "svd", "rsvd"] {
        let run = embedded(&strings(&[cmd, "--zarr", z, "--memory-per-actor", "100K"]));
        run.assert_finished();
        assert!(!run.success(), "{}", run.describe());
        assert!(
            run.stderr.contains("--memory-per-actor")
                && run.stderr.contains("100.0 KiB")
                && run.stderr.contains("1000 rows × 50 columns"),
            "{cmd}: {}",
            run.describe()
        );
    }
    // Panels must be whole stored chunks.
    let run = embedded(&strings(&["svd", "--zarr", z, "--chunk-rows", "300"]));
    assert!(
        !run.success() && run.stderr.contains("--chunk-rows"),
        "{}",
        run.describe()
    );
}

/// Reading a band in segments (Blosc blocks or uncompressed offsets, a few hundred rows at
/// a time) gives the bits of reading it whole: streamed, resident and under mpirun.
#[test]
fn segmented_reads_give_the_bits_of_whole_panels() {
    let dir = scratch("zarr-segments");
    let mut draw = Draw(test_seed());
    let seed = (draw.next() % 1000).to_string();
    let (rows, cols) = (draw.range(5000, 8000), draw.range(20, 60));
    let band = draw.range(1200, 2500);
    for (dtype, codec, shuffle, dist) in [
        ("f32", "blosc-lz4", "bit", "normal"),
        ("f64", "blosc-zstd", "byte", "uniform"),
        ("i16", "none", "none", "genotype"),
    ] {
        let spec = gen_store(
            &dir.join(format!("{dtype}-{codec}.zarr")),
            (rows, cols, band),
            dist,
            &seed,
            &["--dtype", dtype, "--codec", codec, "--shuffle", shuffle],
        );
        let z = spec.as_str();
        // 4 KiB segments are 256 rows (one tile row block) for these widths.
        let whole = ["--read-segment", "1G"];
        let parts = ["--read-segment", "4K"];
        let read = |seg: &[&str]| {
            let mut a = strings(&["read", "--zarr", z, "--json"]);
            a.extend(strings(seg));
            let r = report(&embedded(&a));
            r["sum"]
                .as_f64()
                .unwrap_or_else(|| panic!("{dtype} {codec}: no sum in {r}"))
                .to_bits()
        };
        assert_eq!(read(&parts), read(&whole), "{dtype} {codec}: read checksum");
        let commands: &[&str] = if dist == "genotype" {
            &["rsvd", "pca"]
        } else {
            &["rsvd"]
        };
        for (cmd, extra) in commands.iter().flat_map(|c| {
            [&[][..], &["--power-iters", "0"][..], &["--actors", "1"][..]].map(|e| (*c, e))
        }) {
            // The one-actor case runs at the least budget both reads' plans accept, so
            // that the panels are read again in every pass rather than kept. (A narrow
            // band's 4 KiB segments can need more than the whole band: a segment is a
            // tile block of rows with its decoding scratch.)
            let base = strings(&[cmd, "--zarr", z, "-k", "4", "--sketch-seed", "7"]);
            let budget = if extra.is_empty() || extra[0] != "--actors" {
                None
            } else {
                let least = |seg: &[&str]| {
                    let mut probe = base.clone();
                    probe.extend(strings(extra));
                    probe.extend(strings(seg));
                    least_budget(&probe)
                };
                Some(least(&whole).max(least(&parts)).to_string())
            };
            let args = |seg: &[&str]| {
                let mut a = base.clone();
                a.extend(strings(extra));
                if let Some(b) = &budget {
                    a.extend(strings(&["--memory-per-actor", b]));
                }
                a.extend(strings(seg));
                a.push("--json".into());
                a
            };
            let want = json_bits(&report(&embedded(&args(&whole)))["singular_values"]);
            let what = format!("{cmd} {dtype} {codec} {extra:?}");
            let one = report(&embedded(&args(&parts)));
            assert_eq!(json_bits(&one["singular_values"]), want, "{what}, 1 rank");
            let decoded = one["per_rank"][0]["read"]["chunks"].as_u64().unwrap();
            assert!(decoded > 0, "{what}: nothing read: {one:#}");
            let three = report(&under_mpirun(3, &args(&parts)));
            assert_eq!(
                json_bits(&three["singular_values"]),
                want,
                "{what}, mpirun -np 3"
            );
        }
    }
}

/// A stored matrix of rank 2 makes the sketch `Y = A·Ω` singular, so its fused projection
/// falls back to a pass of its own: every rank takes the root's decision, under mpirun as
/// embedded, with the same bits as `--projection separate`.
#[test]
fn a_singular_sketch_falls_back_to_a_separate_pass_on_every_rank() {
    let dir = scratch("zarr-rank2");
    let mut draw = Draw(test_seed());
    let (rows, cols) = (draw.range(3000, 5000), draw.range(30, 60));
    let chunk = (rows.div_ceil(draw.range(3, 6)), cols);
    let (x, y) = (
        Generated::new(rows, 2, draw.next(), Dist::Normal),
        Generated::new(2, cols, draw.next(), Dist::Normal),
    );
    let z = dir.join("rank2.zarr");
    write_f64(&z, (rows, cols), chunk, |r, mut band| {
        for (i, mut row) in r.zip(band.rows_mut()) {
            for (j, v) in (0..cols).zip(row.iter_mut()) {
                *v = x.value(i, 0) * y.value(0, j) + x.value(i, 1) * y.value(1, j);
            }
        }
    });
    let args = |projection: &str, q: &str| {
        strings(&[
            "rsvd",
            "--zarr",
            z.to_str().unwrap(),
            "-k",
            "4",
            "--power-iters",
            q,
            "--projection",
            projection,
            "--json",
        ])
    };
    for q in ["0", "1"] {
        let separate = report(&embedded(&args("separate", q)));
        let fused = report(&embedded(&args("fused", q)));
        let two = report(&under_mpirun(2, &args("fused", q)));
        for (what, r) in [("embedded", &fused), ("mpirun -np 2", &two)] {
            let first = &r["projections"][0];
            assert_eq!(first["fused"], false, "q {q}, {what}: {r}");
            // The first projection's condition is always measured where fusing is planned;
            // JSON has no infinity, so an exactly singular sketch's reads null.
            match first.get("condition") {
                Some(serde_json::Value::Null) => {}
                Some(c) => assert!(
                    c.as_f64().is_some_and(|c| c > 1e2),
                    "q {q}, {what}: {first}"
                ),
                None => panic!("q {q}, {what}: no condition in {first}"),
            }
            assert_eq!(r["passes"], separate["passes"], "q {q}, {what}");
            assert_eq!(
                json_bits(&r["singular_values"]),
                json_bits(&separate["singular_values"]),
                "q {q}, {what}"
            );
        }
        assert_eq!(two["projections"], fused["projections"], "q {q}");
    }
}
