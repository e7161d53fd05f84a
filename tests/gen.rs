//! `rankwise gen`, the real binary: the stores read back with zarrs hold exactly the
//! generator's values for every distribution, type, format, codec and sharding; `mpirun`
//! with 2 and 3 processes writes the same files as one process; an existing output is
//! refused; bad options name the option on every rank and leave nothing behind. And the
//! population structure of the generator is real: a PCA separates the populations.
//!
//! Build the binary first (`cargo build --release --workspace --bins`, in the same target
//! directory as the tests; `make test` does).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use common::mpirun::{mpirun_command, run_with_timeout};
use common::*;
use ndarray::Array2;
use rankwise::exec::RuntimeConfig;
use rankwise::linalg::{rsvd, RsvdOptions, RsvdProblem};
use rankwise::sources::{Dist, Generated};
use serde_json::Value;
use zarrs::array::{Array, ElementOwned};
use zarrs::filesystem::FilesystemStore;
use zarrs::group::Group;

/// One `rankwise gen` configuration.
#[derive(Clone, Debug)]
struct Case {
    dist: Dist,
    dtype: &'static str,
    format: &'static str,
    codec: &'static str,
    shuffle: Option<&'static str>,
    rows: u64,
    cols: u64,
    chunk_rows: u64,
    chunk_cols: Option<u64>,
    shard_rows: Option<u64>,
    populations: Option<u64>,
    fst: Option<f64>,
    missing: Option<f64>,
    seed: u64,
}

impl Case {
    fn args(&self, out: &Path) -> Vec<String> {
        let mut a = strings(&[
            "gen",
            "--out",
            out.to_str().unwrap(),
            "--rows",
            &self.rows.to_string(),
            "--cols",
            &self.cols.to_string(),
            "--chunk-rows",
            &self.chunk_rows.to_string(),
            "--dist",
            &self.dist.to_string(),
            "--seed",
            &self.seed.to_string(),
            "--dtype",
            self.dtype,
            "--format",
            self.format,
            "--codec",
            self.codec,
            "--json",
        ]);
        let mut opt = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                a.extend([name.to_string(), v]);
            }
        };
        opt("--shuffle", self.shuffle.map(str::to_string));
        opt("--chunk-cols", self.chunk_cols.map(|v| v.to_string()));
        opt("--shard-rows", self.shard_rows.map(|v| v.to_string()));
        opt("--populations", self.populations.map(|v| v.to_string()));
        opt("--fst", self.fst.map(|v| v.to_string()));
        opt("--missing", self.missing.map(|v| v.to_string()));
        a
    }

    fn generator(&self) -> Generated {
        Generated::new(self.rows, self.cols, self.seed, self.dist)
            .with_missing(self.missing.unwrap_or(0.0))
            .with_populations(self.populations.unwrap_or(1), self.fst.unwrap_or(0.1))
            .unwrap()
    }

    fn matrix_path(&self) -> &'static str {
        if self.dist == Dist::Genotype {
            "/call_dosage"
        } else {
            "/"
        }
    }
}

/// A whole array of a store, in C order.
fn read<T: ElementOwned>(dir: &Path, path: &str) -> (Vec<u64>, Vec<T>, Value) {
    let store = Arc::new(FilesystemStore::new(dir).unwrap());
    let a = Array::open(store, path).unwrap_or_else(|e| panic!("{}{path}: {e}", dir.display()));
    let v: Vec<T> = a.retrieve_array_subset(&a.subset_all()).unwrap();
    (a.shape().to_vec(), v, Value::Object(a.attributes().clone()))
}

/// The stored matrix as bits, with the bits the generator says it must hold.
fn stored_and_expected(dir: &Path, c: &Case) -> (Vec<u64>, Vec<u64>, Vec<u64>, Value) {
    let g = c.generator();
    let path = c.matrix_path();
    let want = |f: &dyn Fn(u64, u64) -> u64| -> Vec<u64> {
        (0..c.rows)
            .flat_map(|i| (0..c.cols).map(move |j| (i, j)))
            .map(|(i, j)| f(i, j))
            .collect()
    };
    macro_rules! as_bits {
        ($t:ty, $conv:expr, $expect:expr) => {{
            let (shape, v, attrs) = read::<$t>(dir, path);
            let bits: Vec<u64> = v.iter().map($conv).collect();
            (shape, bits, want(&$expect), attrs)
        }};
    }
    match c.dtype {
        "f64" => as_bits!(f64, |x| x.to_bits(), |i, j| g.value(i, j).to_bits()),
        "f32" => as_bits!(f32, |x| x.to_bits() as u64, |i, j| {
            (g.value(i, j) as f32).to_bits() as u64
        }),
        "u8" => as_bits!(u8, |&x| x as u64, |i, j| g.genotype(i, j) as u8 as u64),
        "i8" => as_bits!(i8, |&x| x as u64, |i, j| g.genotype(i, j) as u64),
        "i16" => as_bits!(i16, |&x| x as u64, |i, j| g.genotype(i, j) as i16 as u64),
        "i32" => as_bits!(i32, |&x| x as u64, |i, j| g.genotype(i, j) as i32 as u64),
        other => panic!("unknown dtype {other}"),
    }
}

/// Checks every value, the attributes, and for genotypes the group and `sample_id`.
fn check_store(dir: &Path, c: &Case) {
    let (shape, got, want, attrs) = stored_and_expected(dir, c);
    assert_eq!(shape, vec![c.rows, c.cols], "{c:?}");
    if let Some(k) = (0..got.len()).find(|&k| got[k] != want[k]) {
        panic!(
            "{c:?}: element ({}, {}) is {:#x}, the generator says {:#x}",
            k as u64 / c.cols,
            k as u64 % c.cols,
            got[k],
            want[k]
        );
    }
    let gen = &attrs["generator"];
    assert_eq!(gen["dist"], c.dist.to_string(), "{attrs}");
    assert_eq!(gen["seed"].as_u64(), Some(c.seed), "{attrs}");
    if c.dist == Dist::Genotype {
        assert_eq!(
            gen["populations"].as_u64(),
            Some(c.populations.unwrap_or(1))
        );
        assert_eq!(gen["fst"].as_f64(), Some(c.fst.unwrap_or(0.1)));
        let missing = gen["missing"].as_f64().unwrap();
        assert!(
            (missing - c.missing.unwrap_or(0.0)).abs() < 1e-15,
            "{attrs}"
        );
        let store = Arc::new(FilesystemStore::new(dir).unwrap());
        let group = Group::open(store, "/").unwrap();
        assert_eq!(group.attributes()["generator"], *gen);
        let (ishape, ids, _) = read::<String>(dir, "/sample_id");
        assert_eq!(ishape, vec![c.cols]);
        assert_eq!(ids[0], "S0000000");
        for (j, id) in ids.iter().enumerate() {
            assert_eq!(*id, format!("S{j:07}"));
        }
    }
}

/// Files (chunks or shards) of the matrix, by the store's chunk key scheme.
fn matrix_files(c: &Case) -> u64 {
    let panel = c.shard_rows.unwrap_or(c.chunk_rows).min(c.rows);
    let across = match c.shard_rows {
        Some(_) => 1,
        None => c.cols.div_ceil(c.chunk_cols.unwrap_or(c.cols).min(c.cols)),
    };
    c.rows.div_ceil(panel) * across
}

fn base(draw: &mut Draw, dist: Dist, dtype: &'static str, format: &'static str) -> Case {
    // Ragged on purpose: the last chunk row and column are partial.
    let chunk_rows = draw.range(5, 12);
    let chunk_cols = draw.range(4, 9);
    Case {
        dist,
        dtype,
        format,
        codec: "blosc-lz4",
        shuffle: None,
        rows: chunk_rows * draw.range(3, 6) + draw.range(1, chunk_rows - 1),
        cols: chunk_cols * draw.range(2, 4) + draw.range(1, chunk_cols - 1),
        chunk_rows,
        chunk_cols: Some(chunk_cols),
        shard_rows: None,
        populations: None,
        fst: None,
        missing: None,
        seed: draw.next(),
    }
}

fn cases(draw: &mut Draw) -> Vec<Case> {
    let mut out = Vec::new();
    for (dist, dtype, format, codec, shuffle, shard) in [
        (Dist::Uniform, "f64", "v3", "blosc-lz4", None, false),
        (Dist::Uniform, "f32", "v2", "zstd", None, false),
        (Dist::Uniform, "f64", "v3", "none", None, true),
        (Dist::Normal, "f64", "v3", "gzip", None, true),
        (Dist::Normal, "f32", "v3", "blosc-zstd", Some("byte"), false),
        (Dist::Normal, "f64", "v2", "blosc-lz4", Some("none"), false),
        (Dist::Genotype, "i8", "v3", "blosc-zstd", Some("bit"), true),
        (Dist::Genotype, "i8", "v2", "blosc-lz4", None, false),
        (Dist::Genotype, "u8", "v2", "gzip", None, false),
        (Dist::Genotype, "i16", "v3", "zstd", None, true),
        (Dist::Genotype, "i32", "v2", "none", None, false),
        (
            Dist::Genotype,
            "f32",
            "v3",
            "blosc-lz4",
            Some("byte"),
            false,
        ),
        (Dist::Genotype, "f64", "v3", "gzip", None, true),
    ] {
        let mut c = base(draw, dist, dtype, format);
        c.codec = codec;
        c.shuffle = shuffle;
        if shard {
            c.shard_rows = Some(c.chunk_rows * draw.range(2, 3));
        }
        if dist == Dist::Genotype {
            c.populations = Some(draw.range(1, 4));
            c.fst = Some([0.05, 0.1, 0.3][draw.range(0, 2) as usize]);
            if dtype != "u8" {
                c.missing = Some([0.0, 0.05, 0.2][draw.range(0, 2) as usize]);
            }
        }
        out.push(c);
    }
    out
}

#[test]
fn stores_hold_exactly_the_generator_values() {
    let dir = scratch("gen-values");
    let mut draw = Draw(test_seed());
    for (i, c) in cases(&mut draw).into_iter().enumerate() {
        let out = dir.join(format!("case{i}.zarr"));
        let mut args = c.args(&out);
        // Several actors and ranks in one process on some: the placement must not matter.
        if i % 2 == 1 {
            args.extend(strings(&["--local-ranks", "2", "--actors", "2"]));
        }
        let r = report(&embedded(&args));
        check_store(&out, &c);
        assert_eq!(r["shape"], serde_json::json!([c.rows, c.cols]), "{c:?}");
        assert_eq!(r["dtype"], c.dtype);
        assert_eq!(r["format"], c.format);
        assert_eq!(r["files"].as_u64(), Some(matrix_files(&c)), "{c:?}\n{r}");
        let stored = r["stored_bytes"].as_u64().unwrap();
        let on_disk: u64 = snapshot(&out).values().map(|v| v.len() as u64).sum();
        assert_eq!(stored, on_disk, "{c:?}: reported stored bytes");
        let size = match c.dtype {
            "f64" => 8,
            "f32" | "i32" => 4,
            "i16" => 2,
            _ => 1,
        };
        assert_eq!(
            r["uncompressed_bytes"].as_u64(),
            Some(c.rows * c.cols * size)
        );
        assert!(r["gb_per_s"].as_f64().unwrap() > 0.0);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(left.is_empty(), "temporary directories left: {left:?}");
    }
}

#[test]
fn defaults_are_f64_arrays_and_i8_genotype_groups() {
    let dir = scratch("gen-defaults");
    let out = dir.join("u.zarr");
    let args = strings(&[
        "gen",
        "--out",
        out.to_str().unwrap(),
        "--rows",
        "50",
        "--cols",
        "7",
        "--chunk-rows",
        "16",
    ]);
    let run = embedded(&args);
    run.assert_success()
        .assert_stdout_contains("rankwise gen: generated 50 × 7 uniform matrix (seed 0)")
        .assert_stdout_contains("GB/s");
    let meta: Value =
        serde_json::from_slice(&std::fs::read(out.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(meta["node_type"], "array");
    assert_eq!(meta["data_type"], "float64");
    assert_eq!(
        meta["chunk_grid"]["configuration"]["chunk_shape"],
        serde_json::json!([16, 7])
    );
    assert_eq!(meta["codecs"][1]["name"], "blosc");
    assert_eq!(meta["codecs"][1]["configuration"]["cname"], "lz4");
    assert_eq!(meta["codecs"][1]["configuration"]["shuffle"], "bitshuffle");
    let c = Case {
        dist: Dist::Uniform,
        dtype: "f64",
        format: "v3",
        codec: "blosc-lz4",
        shuffle: None,
        rows: 50,
        cols: 7,
        chunk_rows: 16,
        chunk_cols: None,
        shard_rows: None,
        populations: None,
        fst: None,
        missing: None,
        seed: 0,
    };
    check_store(&out, &c);

    let out = dir.join("g.zarr");
    let mut args = strings(&[
        "gen",
        "--out",
        out.to_str().unwrap(),
        "--rows",
        "40",
        "--cols",
        "12",
        "--chunk-rows",
        "16",
        "--dist",
        "genotype",
        "--populations",
        "3",
    ]);
    embedded(&args).assert_success();
    let meta: Value =
        serde_json::from_slice(&std::fs::read(out.join("zarr.json")).unwrap()).unwrap();
    assert_eq!(meta["node_type"], "group");
    let meta: Value =
        serde_json::from_slice(&std::fs::read(out.join("call_dosage/zarr.json")).unwrap()).unwrap();
    assert_eq!(meta["data_type"], "int8");
    assert_eq!(
        meta["dimension_names"],
        serde_json::json!(["variants", "samples"])
    );
    check_store(
        &out,
        &Case {
            dist: Dist::Genotype,
            dtype: "i8",
            populations: Some(3),
            rows: 40,
            cols: 12,
            ..c
        },
    );
    // The same store again: refused, the first one untouched.
    let before = snapshot(&dir);
    args.push("--no-pin".into());
    let run = embedded(&args);
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(
        run.stderr.contains("--out") && run.stderr.contains("already exists"),
        "{}",
        run.describe()
    );
    assert_eq!(snapshot(&dir), before);
}

/// The store's files by their path inside it.
fn relative_snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    snapshot(dir)
        .into_iter()
        .map(|(p, v)| (p.strip_prefix(dir).unwrap().to_path_buf(), v))
        .collect()
}

#[test]
fn mpirun_writes_the_same_files_as_one_process() {
    let dir = scratch("gen-mpirun");
    let mut draw = Draw(test_seed());
    let mut sharded = base(&mut draw, Dist::Genotype, "i8", "v3");
    sharded.shard_rows = Some(sharded.chunk_rows * 2);
    sharded.rows = sharded.chunk_rows * 2 * draw.range(4, 6) + 3;
    sharded.populations = Some(3);
    sharded.missing = Some(0.05);
    let mut chunked = base(&mut draw, Dist::Normal, "f32", "v2");
    chunked.codec = "zstd";
    let mut uniform = base(&mut draw, Dist::Uniform, "f64", "v3");
    uniform.codec = "blosc-zstd";
    for (name, c) in [
        ("sharded", sharded),
        ("chunked", chunked),
        ("uniform", uniform),
    ] {
        let one = dir.join(format!("{name}-1.zarr"));
        report(&embedded(&c.args(&one)));
        check_store(&one, &c);
        let reference = relative_snapshot(&one);
        for np in [2usize, 3] {
            let t = Instant::now();
            let out = dir.join(format!("{name}-np{np}.zarr"));
            let run = under_mpirun(np, &c.args(&out));
            let r = report(&run);
            eprintln!(
                "{name}: mpirun -np {np}: {:.2} s",
                t.elapsed().as_secs_f64()
            );
            assert_eq!(r["transport"], "mpi", "{}", run.describe());
            assert_eq!(r["ranks"].as_u64(), Some(np as u64));
            let per_rank = r["per_rank"].as_array().unwrap();
            assert_eq!(per_rank.len(), np);
            assert!(
                per_rank
                    .iter()
                    .filter(|x| x["files"].as_u64() > Some(0))
                    .count()
                    >= 2,
                "the panels were not shared out: {r}"
            );
            check_store(&out, &c);
            let got = relative_snapshot(&out);
            assert_eq!(
                got.iter().map(|x| &x.0).collect::<Vec<_>>(),
                reference.iter().map(|x| &x.0).collect::<Vec<_>>(),
                "{name}, -np {np}: different files"
            );
            for ((path, a), (_, b)) in got.iter().zip(&reference) {
                assert!(a == b, "{name}, -np {np}: {} differs", path.display());
            }
        }
    }
}

/// Argument lists that must fail with `option` named, and nothing written.
fn bad_cases(out: &Path) -> Vec<(Vec<String>, &'static str)> {
    let o = out.to_str().unwrap();
    let shaped = |shape: [&str; 3], extra: &[&str]| {
        let mut a = strings(&["gen", "--out", o, "--rows", shape[0], "--cols", shape[1]]);
        a.extend(strings(&["--chunk-rows", shape[2]]));
        a.extend(strings(extra));
        a
    };
    let gen = |extra: &[&str]| shaped(["100", "9", "20"], extra);
    let geno = |extra: &[&str]| {
        let mut a = vec!["--dist", "genotype"];
        a.extend_from_slice(extra);
        gen(&a)
    };
    let pca = |extra: &[&str]| {
        let mut a = strings(&["pca", "--rows", "200", "--cols", "9", "--chunk-rows", "50"]);
        a.extend(strings(extra));
        a.extend(strings(&["-k", "2", "--oversample", "2", "--out", o]));
        a
    };
    vec![
        (gen(&["--dist", "normal", "--dtype", "u8"]), "--dtype"),
        (gen(&["--dtype", "i16"]), "--dtype"),
        (geno(&["--dtype", "u8", "--missing", "0.1"]), "--dtype"),
        (gen(&["--shard-rows", "30"]), "--shard-rows"),
        (
            gen(&["--shard-rows", "40", "--format", "v2"]),
            "--shard-rows",
        ),
        (gen(&["--codec", "zstd", "--shuffle", "bit"]), "--shuffle"),
        (gen(&["--chunk-cols", "0"]), "--chunk-cols"),
        (gen(&["--populations", "2"]), "--populations"),
        (gen(&["--missing", "0.1"]), "--missing"),
        (geno(&["--populations", "0"]), "--populations"),
        (geno(&["--populations", "10"]), "--populations"),
        (geno(&["--populations", "2", "--fst", "1.5"]), "--fst"),
        (geno(&["--fst", "0"]), "--fst"),
        (geno(&["--missing", "1"]), "--missing"),
        (shaped(["100", "9", "0"], &[]), "--chunk-rows"),
        (shaped(["100", "0", "20"], &[]), "--cols"),
        (shaped(["0", "9", "20"], &[]), "--rows"),
        (shaped(["100", "16777216", "20"], &[]), "--cols"),
        (gen(&["--memory-per-actor", "1K"]), "--memory-per-actor"),
        (pca(&["--populations", "0"]), "--populations"),
        (pca(&["--populations", "10"]), "--populations"),
        (pca(&["--populations", "3", "--fst=-0.2"]), "--fst"),
    ]
}

#[test]
fn bad_options_fail_on_every_rank_naming_the_option() {
    let dir = scratch("gen-bad");
    let out = dir.join("x.zarr");
    let cases = bad_cases(&out);
    for (args, option) in &cases {
        assert_fails_naming(&embedded(args), args, option);
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
    // Every other case under mpirun, where a failing rank lingers a few seconds for its
    // peers: a few side by side.
    let mpi_cases: Vec<_> = cases.iter().step_by(2).cloned().collect();
    for batch in mpi_cases.chunks(4) {
        let handles: Vec<_> = batch
            .iter()
            .map(|(args, _)| {
                let args = args.clone();
                std::thread::spawn(move || under_mpirun(2, &args))
            })
            .collect();
        for ((args, option), h) in batch.iter().zip(handles) {
            assert_both_ranks_name(&h.join().unwrap(), args, option);
            assert!(!out.exists(), "{args:?} left {}", out.display());
        }
    }
    // A value clap itself rejects, naming the option too.
    let mut args = bad_cases(&out).remove(0).0;
    let at = args.iter().position(|a| a == "u8").unwrap();
    args[at] = "u16".into();
    let run = embedded(&args);
    assert_eq!(run.code, Some(2), "{}", run.describe());
    assert!(run.stderr.contains("--dtype"), "{}", run.stderr);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn existing_output_and_failures_under_mpirun_leave_nothing_behind() {
    let dir = scratch("gen-fail");
    let out = dir.join("data.zarr");
    let args = strings(&[
        "gen",
        "--out",
        out.to_str().unwrap(),
        "--rows",
        "400",
        "--cols",
        "30",
        "--chunk-rows",
        "25",
        "--dist",
        "genotype",
    ]);
    // An existing output: every rank refuses it, naming it; it is not touched.
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), b"mine").unwrap();
    let before = snapshot(&dir);
    let run = under_mpirun(2, &args);
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{}", run.describe());
    let refusals = run
        .stderr
        .lines()
        .filter(|l| l.contains("--out") && l.contains("already exists"))
        .count();
    assert!(refusals >= 2, "{}", run.describe());
    assert!(run.stderr.contains(out.to_str().unwrap()));
    assert_eq!(snapshot(&dir), before);
    std::fs::remove_dir_all(&out).unwrap();

    // A rank failing while or after the others write: every rank exits non-zero, and no
    // store or temporary directory is left.
    for (fault, who) in [
        ("1:error:after-write", "rank 1 failed"),
        ("0:error:commit", "rank 0 failed"),
        ("1:panic:before-write", "rank 1 failed: panic"),
    ] {
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = mpirun_command(2, &rankwise_fault_bin(), &argv);
        cmd.env("RANKWISE_FAULT", fault);
        let run = run_with_timeout(cmd, CLI_LIMIT);
        run.assert_finished();
        assert_ne!(run.code, Some(0), "{fault}\n{}", run.describe());
        let lines = run
            .stderr
            .lines()
            .filter(|l| l.contains(&format!("rankwise: {who}")))
            .count();
        assert!(
            lines >= 2,
            "{fault}: not every rank reported\n{}",
            run.describe()
        );
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{fault}: left behind: {left:?}");
    }
}

/// How well the first two PCs (columns of `pcs`, one row per sample) separate the labelled
/// groups: the fraction of samples nearest their own group's centroid, and the ratio of
/// between-group to within-group sums of squares.
fn separation(pcs: &Array2<f64>, labels: &[u64], groups: u64) -> (f64, f64) {
    let n = labels.len();
    let mut centroid = vec![[0.0f64; 2]; groups as usize];
    let mut count = vec![0.0; groups as usize];
    for (j, &q) in labels.iter().enumerate() {
        for d in 0..2 {
            centroid[q as usize][d] += pcs[[j, d]];
        }
        count[q as usize] += 1.0;
    }
    for q in 0..groups as usize {
        for d in 0..2 {
            centroid[q][d] /= count[q];
        }
    }
    let mean: Vec<f64> = (0..2)
        .map(|d| (0..n).map(|j| pcs[[j, d]]).sum::<f64>() / n as f64)
        .collect();
    let dist2 = |j: usize, c: &[f64; 2]| (0..2).map(|d| (pcs[[j, d]] - c[d]).powi(2)).sum::<f64>();
    let mut nearest_own = 0;
    let mut within = 0.0;
    for (j, &q) in labels.iter().enumerate() {
        let own = dist2(j, &centroid[q as usize]);
        within += own;
        if (0..groups as usize).all(|r| r == q as usize || own < dist2(j, &centroid[r])) {
            nearest_own += 1;
        }
    }
    let between: f64 = (0..groups as usize)
        .map(|q| {
            count[q]
                * (0..2)
                    .map(|d| (centroid[q][d] - mean[d]).powi(2))
                    .sum::<f64>()
        })
        .sum();
    (nearest_own as f64 / n as f64, between / within)
}

#[test]
fn pca_finds_the_populations_and_none_without_structure() {
    let mut draw = Draw(test_seed());
    let (variants, samples, groups) = (3000u64, draw.range(60, 120), 3u64);
    let seed = draw.next();
    let rt = rankwise::embedded(&RuntimeConfig {
        pin: false,
        ..Default::default()
    })
    .unwrap();
    let options = RsvdOptions {
        k: 2,
        oversample: 8,
        ..RsvdOptions::default()
    };
    let labelled = Generated::new(variants, samples, seed, Dist::Genotype)
        .with_populations(groups, 0.1)
        .unwrap();
    let labels: Vec<u64> = (0..samples).map(|j| labelled.population_of(j)).collect();
    for k in [groups, 1] {
        let g = Generated::new(variants, samples, seed, Dist::Genotype)
            .with_missing(0.02)
            .with_populations(k, 0.1)
            .unwrap();
        let problem = RsvdProblem::genotypes(Arc::new(g), 700).unwrap();
        let r = rsvd(&rt, &problem, &options, None).unwrap();
        let pcs = r.wt.t().to_owned();
        let (own, ratio) = separation(&pcs, &labels, groups);
        eprintln!("K = {k}: {own:.3} of samples nearest their block's centroid, between/within {ratio:.3}");
        if k == groups {
            assert_eq!(own, 1.0, "K = {k}: populations not separated on PC1/PC2");
            assert!(ratio > 10.0, "K = {k}: between/within {ratio}");
        } else {
            assert!(own < 0.9, "K = 1: blocks separated anyway ({own})");
            assert!(ratio < 0.5, "K = 1: between/within {ratio}");
        }
    }

    // The command line: `rankwise pca --populations 3` writes sample PCs with the same
    // structure.
    let dir = scratch("gen-pca");
    let out = dir.join("pcs.zarr");
    let args = strings(&[
        "pca",
        "--rows",
        &variants.to_string(),
        "--cols",
        &samples.to_string(),
        "--chunk-rows",
        "500",
        "--seed",
        &seed.to_string(),
        "--populations",
        "3",
        "--fst",
        "0.1",
        "-k",
        "2",
        "--local-ranks",
        "2",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]);
    let r = report(&embedded(&args));
    assert_eq!(r["matrix"]["populations"].as_u64(), Some(3));
    let (shape, vt) = rankwise::output::read_f64_array(&out, "Vt").unwrap();
    assert_eq!(shape, vec![2, samples]);
    let pcs = Array2::from_shape_vec((2, samples as usize), vt)
        .unwrap()
        .t()
        .to_owned();
    let (own, ratio) = separation(&pcs, &labels, groups);
    assert_eq!(own, 1.0, "rankwise pca --populations 3: not separated");
    assert!(
        ratio > 10.0,
        "rankwise pca --populations 3: between/within {ratio}"
    );
}

/// zarr-python (the pinned virtualenv of `scripts/zarr-venv.sh`) reads the stores with the
/// same values, bit for bit, and the sample identifiers.
#[test]
fn zarr_python_reads_the_same_values() {
    let python = zarr_python();
    let dir = scratch("gen-python");
    let mut draw = Draw(test_seed());
    let mut cases = Vec::new();
    for (dist, dtype, format, codec, shard) in [
        (Dist::Genotype, "i8", "v3", "blosc-zstd", true),
        (Dist::Genotype, "u8", "v2", "gzip", false),
        (Dist::Uniform, "f32", "v2", "zstd", false),
        (Dist::Normal, "f64", "v3", "blosc-lz4", false),
        (Dist::Uniform, "f64", "v3", "none", true),
    ] {
        let mut c = base(&mut draw, dist, dtype, format);
        c.codec = codec;
        if shard {
            c.shard_rows = Some(c.chunk_rows * 2);
        }
        if dist == Dist::Genotype {
            c.populations = Some(3);
            c.missing = (dtype != "u8").then_some(0.1);
        }
        cases.push(c);
    }
    let script = r#"
import sys, numpy as np, zarr
node = zarr.open(sys.argv[1], mode="r")
if isinstance(node, zarr.Group):
    ids = node["sample_id"][:]
    assert list(ids) == ["S%07d" % j for j in range(len(ids))], ids[:5]
    node = node["call_dosage"]
a = node[...]
a.astype(a.dtype.newbyteorder("<")).tofile(sys.argv[2])
print(a.dtype.str, a.shape)
"#;
    for (i, c) in cases.iter().enumerate() {
        let out = dir.join(format!("p{i}.zarr"));
        report(&embedded(&c.args(&out)));
        let raw = dir.join(format!("p{i}.bin"));
        let o = Command::new(&python)
            .arg("-c")
            .arg(script)
            .arg(&out)
            .arg(&raw)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{c:?}: zarr-python failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let bytes = std::fs::read(&raw).unwrap();
        let (_, _, want, _) = stored_and_expected(&out, c);
        let size = bytes.len() / want.len();
        let got: Vec<u64> = bytes
            .chunks_exact(size)
            .map(|b| {
                let mut w = [0u8; 8];
                w[..size].copy_from_slice(b);
                let v = u64::from_le_bytes(w);
                // Sign-extend the integers as the expected bits are.
                match c.dtype {
                    "i8" => v as u8 as i8 as u64,
                    "i16" => v as u16 as i16 as u64,
                    "i32" => v as u32 as i32 as u64,
                    _ => v,
                }
            })
            .collect();
        assert!(got == want, "{c:?}: zarr-python read different values");
        println!("zarr-python: {}", String::from_utf8_lossy(&o.stdout).trim());
    }
}

/// Every `--format` × `--codec` × `--dtype` that `rankwise gen` writes (integers hold
/// genotypes; the Blosc shuffles and v3 sharding taken in turn), read back by zarr-python
/// (the pinned virtualenv) and by rankwise's own reader (`ZarrMatrix`, as `--zarr` reads
/// it): zarr-python's values, their dtype, and rankwise's values all agree element by
/// element with each other and with the generator.
#[test]
fn every_format_codec_and_dtype_reads_back_with_zarr_python() {
    use rankwise::sources::PanelSource;
    use rankwise::sources::ZarrMatrix;

    let python = zarr_python();
    let dir = scratch("gen-every-combination");
    let mut draw = Draw(test_seed());
    let mut cases = Vec::new();
    for format in ["v2", "v3"] {
        for codec in ["none", "blosc-lz4", "blosc-zstd", "zstd", "gzip"] {
            for dtype in ["f64", "f32", "u8", "i8", "i16", "i32"] {
                let i = cases.len();
                let dist = match dtype {
                    "f64" | "f32" => [Dist::Normal, Dist::Uniform, Dist::Genotype][i % 3],
                    _ => Dist::Genotype,
                };
                let mut c = base(&mut draw, dist, dtype, format);
                c.codec = codec;
                if codec.starts_with("blosc") {
                    c.shuffle = Some(["none", "byte", "bit"][i % 3]);
                }
                if format == "v3" && i % 2 == 0 {
                    c.shard_rows = Some(c.chunk_rows * 2);
                }
                if dist == Dist::Genotype {
                    c.populations = Some(2);
                    // u8 holds no −1; the others get missing calls to carry.
                    c.missing = (dtype != "u8").then_some(0.1);
                }
                cases.push(c);
            }
        }
    }
    assert_eq!(cases.len(), 60);
    let mut script_args = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let out = dir.join(format!("c{i}.zarr"));
        report(&embedded(&c.args(&out)));
        script_args.push(out.clone());
        script_args.push(dir.join(format!("c{i}.bin")));
    }
    // One interpreter for all the stores: each is dumped little-endian in C order, and its
    // dtype printed, one line per store.
    let script = r#"
import sys, numpy as np, zarr
args = sys.argv[1:]
for store, raw in zip(args[0::2], args[1::2]):
    node = zarr.open(store, mode="r")
    if isinstance(node, zarr.Group):
        node = node["call_dosage"]
    a = node[...]
    a.astype(a.dtype.newbyteorder("<")).tofile(raw)
    print(a.dtype.str, *a.shape)
"#;
    let o = Command::new(&python)
        .arg("-c")
        .arg(script)
        .args(&script_args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "zarr-python failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), cases.len(), "{stdout}");
    for (i, (c, line)) in cases.iter().zip(&lines).enumerate() {
        let what = format!("{} {} {} ({c:?})", c.format, c.codec, c.dtype);
        let dtype = match c.dtype {
            "f64" => "<f8",
            "f32" => "<f4",
            "u8" => "|u1",
            "i8" => "|i1",
            "i16" => "<i2",
            "i32" => "<i4",
            other => panic!("{other}"),
        };
        assert_eq!(
            *line,
            format!("{dtype} {} {}", c.rows, c.cols),
            "{what}: zarr-python's dtype and shape"
        );
        let bytes = std::fs::read(dir.join(format!("c{i}.bin"))).unwrap();
        let size = bytes.len() / (c.rows * c.cols) as usize;
        assert_eq!(bytes.len(), size * (c.rows * c.cols) as usize, "{what}");
        // zarr-python's values as f64 (every stored type converts exactly).
        let python_values: Vec<f64> = bytes
            .chunks_exact(size)
            .map(|b| match c.dtype {
                "f64" => f64::from_le_bytes(b.try_into().unwrap()),
                "f32" => f32::from_le_bytes(b.try_into().unwrap()) as f64,
                "u8" => b[0] as f64,
                "i8" => b[0] as i8 as f64,
                "i16" => i16::from_le_bytes(b.try_into().unwrap()) as f64,
                "i32" => i32::from_le_bytes(b.try_into().unwrap()) as f64,
                other => panic!("{other}"),
            })
            .collect();
        let out = dir.join(format!("c{i}.zarr"));
        let spec = match c.dist {
            Dist::Genotype => format!("{}:call_dosage", out.display()),
            _ => out.display().to_string(),
        };
        let matrix = ZarrMatrix::open(&spec).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(PanelSource::shape(&matrix), (c.rows, c.cols), "{what}");
        let mut ours = Array2::from_elem((c.rows as usize, c.cols as usize), f64::NAN);
        matrix.fill(0..c.rows, ours.view_mut()).unwrap();
        let g = c.generator();
        for (k, (p, r)) in python_values.iter().zip(ours.iter()).enumerate() {
            let (row, col) = (k as u64 / c.cols, k as u64 % c.cols);
            // As `stored_and_expected`: floats hold the generator's values, integers its
            // dosages (−1 missing).
            let want = match c.dtype {
                "f64" => g.value(row, col),
                "f32" => g.value(row, col) as f32 as f64,
                _ => g.genotype(row, col) as f64,
            };
            assert!(
                p.to_bits() == r.to_bits() && p.to_bits() == want.to_bits(),
                "{what}: element ({row}, {col}): zarr-python {p}, rankwise {r}, generator {want}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
