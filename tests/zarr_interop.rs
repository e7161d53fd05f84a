//! Zarr interop: rankwise's Zarr reader against stores written by zarr-python.
//!
//! The fixtures are written once per target directory by `scripts/zarr_fixtures.py` with
//! zarr-python (versions pinned in scripts/zarr-requirements.txt, in the venv that
//! `scripts/zarr-venv.sh` builds: the first run needs Python 3.11 or newer and PyPI) into
//! `target/zarr-fixtures`, beside the values zarr-python reads back (raw little-endian
//! truth) and a manifest. A stamp holds a hash of the script and the pins, so the
//! fixtures are rewritten when either changes; a file lock keeps concurrent test processes
//! from writing them twice, and the finished directory is renamed into place.
//!
//! - Every dense and genotype fixture reads back exactly, whole and in row (and column)
//!   ranges that cross chunk and shard boundaries; a chunk never written reads as the fill
//!   value.
//! - VCF Zarr stores (bio2zarr's layout) give the truth dosages and sample ids.
//! - Every damaged or unusable store gives an error that names the store, the array and the
//!   chunk at fault, through the library and through the CLI, which exits non-zero in time.
//! - Results written by `rankwise svd|rsvd|pca --zarr … --out X.zarr` read back in
//!   zarr-python (`scripts/zarr_read.py`) with the singular values rankwise printed,
//!   orthonormal factors, and factors that reproduce the stored matrix.
//!
//! The CLI tests need the release binary (`cargo build --release --workspace --bins`).

mod common;

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::mpirun::{run_with_timeout, RunOutput};
use common::{lapack_sigma, rankwise_bin, scratch, zarr_python};
use ndarray::{s, Array2, ShapeBuilder};
use rankwise::sources::{GenotypeSource, PanelBuffer, PanelSource, StoredPanels};
use rankwise::sources::{VcfZarr, ZarrGenotypes, ZarrMatrix};
use serde_json::Value;

/// How long one CLI run on a fixture may take (they take well under a second).
const LIMIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// The fixtures.

struct Fixtures {
    dir: PathBuf,
    python: PathBuf,
    manifest: Value,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The target directory (this test binary is target/<profile>/deps/zarr_interop-…).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

/// FNV-1a over the bytes of `parts`: the stamp of the fixtures' inputs.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for part in parts {
        for &b in *part {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(build_fixtures)
}

fn build_fixtures() -> Fixtures {
    let target = target_dir();
    let python = zarr_python();
    let script = repo().join("scripts/zarr_fixtures.py");
    let stamp = format!(
        "{:016x}",
        fnv1a(&[
            &fs::read(&script).unwrap(),
            &fs::read(repo().join("scripts/zarr-requirements.txt")).unwrap(),
        ])
    );
    let dir = target.join("zarr-fixtures");
    let lock = File::create(target.join("zarr-fixtures.lock")).unwrap();
    lock.lock().unwrap();
    if fs::read_to_string(dir.join(".stamp")).ok().as_deref() != Some(stamp.as_str()) {
        let tmp = target.join(format!("zarr-fixtures.tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let out = Command::new(&python)
            .arg(&script)
            .arg(&tmp)
            .output()
            .expect("running the venv's python");
        assert!(
            out.status.success(),
            "{} {} {} failed ({}):\n{}",
            python.display(),
            script.display(),
            tmp.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        fs::write(tmp.join(".stamp"), &stamp).unwrap();
        let _ = fs::remove_dir_all(&dir);
        fs::rename(&tmp, &dir).unwrap();
    }
    lock.unlock().unwrap();
    let manifest = serde_json::from_str(&fs::read_to_string(dir.join("manifest.json")).unwrap())
        .expect("manifest.json");
    Fixtures {
        dir,
        python,
        manifest,
    }
}

impl Fixtures {
    fn entries(&self, kind: &str) -> &[Value] {
        self.manifest[kind]
            .as_array()
            .unwrap_or_else(|| panic!("manifest has no {kind}"))
    }

    fn entry(&self, kind: &str, name: &str) -> &Value {
        self.entries(kind)
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("manifest has no {kind} fixture {name}"))
    }

    /// The manifest's `PATH[:ARRAY]` (relative to the fixture directory) made absolute.
    fn spec(&self, rel: &str) -> String {
        match rel.split_once(':') {
            Some((p, a)) => format!("{}:{a}", self.dir.join(p).display()),
            None => self.dir.join(rel).display().to_string(),
        }
    }

    fn bytes(&self, file: &str) -> Vec<u8> {
        fs::read(self.dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    }

    /// The truth of a dense or genotype fixture as f64 (every supported dtype converts
    /// exactly).
    fn truth_f64(&self, e: &Value) -> Array2<f64> {
        let raw = self.bytes(str_of(&e["truth"]));
        let values: Vec<f64> = match str_of(&e["dtype"]) {
            "u8" => raw.iter().map(|&b| b as f64).collect(),
            "i8" => raw.iter().map(|&b| b as i8 as f64).collect(),
            "i16" => le(&raw, |b: [u8; 2]| i16::from_le_bytes(b) as f64),
            "i32" => le(&raw, |b: [u8; 4]| i32::from_le_bytes(b) as f64),
            "f32" => le(&raw, |b: [u8; 4]| f32::from_le_bytes(b) as f64),
            "f64" => le(&raw, f64::from_le_bytes),
            other => panic!("unexpected dtype {other}"),
        };
        Array2::from_shape_vec(shape2(e), values).unwrap()
    }
}

fn le<const N: usize>(raw: &[u8], f: impl Fn([u8; N]) -> f64) -> Vec<f64> {
    raw.chunks_exact(N)
        .map(|c| f(c.try_into().unwrap()))
        .collect()
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn shape2(e: &Value) -> (usize, usize) {
    let s = u64s(&e["shape"]);
    (s[0] as usize, s[1] as usize)
}

/// Row ranges of a matrix of `m` rows: the whole, single rows at both ends, and ranges
/// that start, end or straddle each of the `boundaries` (chunk and shard heights).
fn ranges(m: u64, boundaries: &[u64]) -> Vec<Range<u64>> {
    let mut set = BTreeSet::new();
    set.insert((0, m));
    set.insert((0, 1));
    set.insert((m - 1, m));
    set.insert((1, m.saturating_sub(1).max(2).min(m)));
    for &b in boundaries {
        let mut k = b;
        while k < m {
            set.insert((k - 1, (k + 1).min(m)));
            set.insert((k, (k + b).min(m)));
            set.insert((k.saturating_sub(2), (k + b + 3).min(m)));
            k += 2 * b;
        }
        // The last, ragged, chunk.
        set.insert((m - 1 - (m - 1) % b, m));
    }
    set.into_iter()
        .filter(|&(a, z)| a < z && z <= m)
        .map(|(a, z)| a..z)
        .collect()
}

/// Heights at which panels of a fixture's rows can cross stored boundaries.
fn boundaries(e: &Value, axis: usize) -> Vec<u64> {
    let mut b = vec![u64s(&e["chunks"])[axis]];
    if !e["shards"].is_null() {
        b.push(u64s(&e["shards"])[axis]);
    }
    b
}

/// Compares `got` with `want` bit for bit; describes the first differences.
fn diff_bits(what: &str, got: &Array2<f64>, want: ndarray::ArrayView2<'_, f64>) -> Option<String> {
    if got.dim() != want.dim() {
        return Some(format!(
            "{what}: shape {:?}, want {:?}",
            got.dim(),
            want.dim()
        ));
    }
    let bad: Vec<String> = got
        .indexed_iter()
        .filter(|&(ij, g)| g.to_bits() != want[ij].to_bits())
        .map(|(ij, g)| format!("{ij:?}: {g:e} (want {:e})", want[ij]))
        .collect();
    (!bad.is_empty()).then(|| {
        format!(
            "{what}: {} of {} values differ, first {}",
            bad.len(),
            got.len(),
            bad[..bad.len().min(4)].join(", ")
        )
    })
}

/// Runs `f`, turning a panic into an error text.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what}: panicked: {msg}")
    })
}

fn report(problems: Vec<String>, total: usize, what: &str) {
    assert!(
        problems.is_empty(),
        "{} of {total} {what} failed:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Dense matrices.

/// Reads one dense fixture through `ZarrMatrix` in every way the kernels do; returns what
/// differs from the truth.
fn check_dense(fx: &Fixtures, e: &Value) -> Vec<String> {
    let name = str_of(&e["name"]);
    let spec = fx.spec(str_of(&e["spec"]));
    let truth = fx.truth_f64(e);
    let (m, n) = truth.dim();
    let mut problems = Vec::new();
    let matrix = match ZarrMatrix::open(&spec) {
        Ok(x) => x,
        Err(err) => return vec![format!("{name}: open {spec}: {err}")],
    };
    if PanelSource::shape(&matrix) != (m as u64, n as u64) {
        return vec![format!(
            "{name}: shape {:?}, want {:?}",
            PanelSource::shape(&matrix),
            (m, n)
        )];
    }
    for rows in ranges(m as u64, &boundaries(e, 0)) {
        let h = (rows.end - rows.start) as usize;
        let want = truth.slice(s![rows.start as usize..rows.end as usize, ..]);
        let mut got = Array2::from_elem((h, n), f64::NAN);
        match matrix.fill(rows.clone(), got.view_mut()) {
            Ok(()) => problems.extend(diff_bits(&format!("{name} rows {rows:?}"), &got, want)),
            Err(err) => problems.push(format!("{name} rows {rows:?}: {err}")),
        }
    }
    // Column-major output and a column range across chunk columns (the tiles of the
    // randomized passes), in f64 and f32.
    let rows = 1..m as u64;
    let cols = (n as u64 / 4)..(n as u64 - 1);
    let want = truth.slice(s![1.., cols.start as usize..cols.end as usize]);
    let mut got = Array2::from_elem(want.dim().f(), f64::NAN);
    match matrix.fill_cols(rows.clone(), cols.clone(), got.view_mut()) {
        Ok(()) => problems.extend(diff_bits(
            &format!("{name} fill_cols {rows:?} × {cols:?} (column-major)"),
            &got,
            want,
        )),
        Err(err) => problems.push(format!("{name} fill_cols {rows:?} × {cols:?}: {err}")),
    }
    let mut got32 = Array2::from_elem(want.dim(), f32::NAN);
    match matrix.fill_cols_f32(rows.clone(), cols.clone(), got32.view_mut()) {
        Ok(()) => problems.extend(diff_bits(
            &format!("{name} fill_cols_f32 {rows:?} × {cols:?}"),
            &got32.mapv(|x| x as f64),
            want.mapv(|x| x as f32 as f64).view(),
        )),
        Err(err) => problems.push(format!("{name} fill_cols_f32: {err}")),
    }
    // Any range of rows, where the chunks allow decoding part of one (the read-ahead's
    // segments): short ranges that start and end inside chunks.
    if StoredPanels::partial_reads(&matrix) {
        let mut buf = PanelBuffer::default();
        let mut r = 0;
        let mut step = 1;
        while r < m as u64 {
            let rows = r..(r + step).min(m as u64);
            let h = (rows.end - rows.start) as usize;
            let want = truth.slice(s![rows.start as usize..rows.end as usize, ..]);
            let mut got = Array2::from_elem((h, n), f64::NAN);
            match matrix.read_panel(rows.clone(), &mut buf) {
                Ok(_) => {
                    buf.tile_f64(0..h, 0..n, got.view_mut());
                    problems.extend(diff_bits(&format!("{name} part {rows:?}"), &got, want));
                }
                Err(err) => problems.push(format!("{name} part {rows:?}: {err}")),
            }
            r = rows.end;
            step = step % 5 + 2;
        }
    }
    // Through the transpose (how the CLI reads a matrix with fewer rows than columns):
    // panels are bands of stored chunk columns.
    let t = matrix.clone().transposed();
    for cols in ranges(n as u64, &boundaries(e, 1)) {
        let w = (cols.end - cols.start) as usize;
        let want = truth.slice(s![.., cols.start as usize..cols.end as usize]);
        let want = want.t();
        let mut got = Array2::from_elem((w, m), f64::NAN);
        match t.fill(cols.clone(), got.view_mut()) {
            Ok(()) => problems.extend(diff_bits(
                &format!("{name} transposed rows {cols:?}"),
                &got,
                want,
            )),
            Err(err) => problems.push(format!("{name} transposed rows {cols:?}: {err}")),
        }
    }
    problems
}

#[test]
fn every_dense_fixture_reads_back_exactly() {
    let fx = fixtures();
    let dense = fx.entries("dense");
    // Every format × codec × dtype the capability promises is among them.
    for zf in [2, 3] {
        for dtype in ["u8", "i8", "i16", "i32", "f32", "f64"] {
            for codec in [
                "blosc-lz4-shuffle",
                "blosc-lz4-bitshuffle",
                "blosc-zstd-shuffle",
                "blosc-zstd-bitshuffle",
                "zstd",
                "gzip",
                "none",
            ] {
                assert!(
                    dense.iter().any(|e| e["zarr_format"] == zf
                        && e["dtype"] == dtype
                        && e["codec"] == codec),
                    "no v{zf} {dtype} {codec} fixture"
                );
            }
        }
    }
    assert!(dense.iter().any(|e| !e["shards"].is_null()));
    let partial = dense
        .iter()
        .filter(|e| {
            ZarrMatrix::open(&fx.spec(str_of(&e["spec"])))
                .is_ok_and(|x| StoredPanels::partial_reads(&x))
        })
        .count();
    assert!(
        partial >= 5,
        "{partial} fixtures decode row ranges, want the 5 full-width ones"
    );
    assert!(dense.iter().any(|e| str_of(&e["spec"]).contains(':')));
    let mut problems = Vec::new();
    for e in dense {
        let name = str_of(&e["name"]);
        match no_panic(name, || check_dense(fx, e)) {
            Ok(p) => problems.extend(p),
            Err(p) => problems.push(p),
        }
    }
    report(problems, dense.len(), "dense fixtures");
}

#[test]
fn a_chunk_never_written_reads_as_the_fill_value() {
    let fx = fixtures();
    let with_missing: Vec<&Value> = fx
        .entries("dense")
        .iter()
        .filter(|e| !e["missing_chunks"].as_array().unwrap().is_empty())
        .collect();
    assert!(with_missing.len() >= 2, "fixtures with missing chunks");
    for e in with_missing {
        let name = str_of(&e["name"]);
        let fill = e["fill_value"].as_f64().unwrap();
        assert_ne!(
            fill, 0.0,
            "{name}: a missing chunk must have a non-zero fill"
        );
        let matrix = ZarrMatrix::open(&fx.spec(str_of(&e["spec"])))
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        let (m, n) = shape2(e);
        let c = u64s(&e["chunks"]);
        let mut got = Array2::zeros((m, n));
        matrix
            .fill(0..m as u64, got.view_mut())
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        for key in e["missing_chunks"].as_array().unwrap() {
            // Keys are c/I/J (v3) or I.J (v2).
            let idx: Vec<usize> = str_of(key)
                .trim_start_matches("c/")
                .split(['/', '.'])
                .map(|x| x.parse().unwrap())
                .collect();
            let r0 = idx[0] * c[0] as usize;
            let c0 = idx[1] * c[1] as usize;
            let block = got.slice(s![
                r0..(r0 + c[0] as usize).min(m),
                c0..(c0 + c[1] as usize).min(n)
            ]);
            assert!(
                block.iter().all(|&x| x == fill),
                "{name}: chunk {key} was never written and must read as {fill}: {block:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Genotypes.

fn check_dosages(
    name: &str,
    source: &dyn GenotypeSource,
    truth: &Array2<i8>,
    boundaries: &[u64],
) -> Vec<(Range<u64>, String)> {
    let (m, n) = truth.dim();
    let mut problems = Vec::new();
    if source.shape() != (m as u64, n as u64) {
        return vec![(
            0..0,
            format!("{name}: shape {:?}, want {:?}", source.shape(), (m, n)),
        )];
    }
    for rows in ranges(m as u64, boundaries) {
        let h = (rows.end - rows.start) as usize;
        let mut got = Array2::from_elem((h, n), i8::MIN);
        if let Err(err) = source.fill_dosages(rows.clone(), got.view_mut()) {
            problems.push((rows.clone(), format!("{name} rows {rows:?}: {err}")));
            continue;
        }
        let want = truth.slice(s![rows.start as usize..rows.end as usize, ..]);
        let bad: Vec<(usize, usize)> = got
            .indexed_iter()
            .filter(|&(ij, g)| *g != want[ij])
            .map(|(ij, _)| ij)
            .collect();
        if !bad.is_empty() {
            problems.push((
                rows.clone(),
                format!(
                    "{name} rows {rows:?}: {} of {} dosages differ, first {}",
                    bad.len(),
                    got.len(),
                    bad.iter()
                        .take(4)
                        .map(|&(i, j)| format!(
                            "variant {} sample {j}: {} (want {})",
                            rows.start as usize + i,
                            got[(i, j)],
                            want[(i, j)]
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    problems
}

#[test]
fn genotype_fixtures_read_back_exactly() {
    let fx = fixtures();
    let entries = fx.entries("genotypes");
    assert!(entries.len() >= 4);
    let mut problems = Vec::new();
    for e in entries {
        let name = str_of(&e["name"]);
        let truth = fx.truth_f64(e).mapv(|x| x as i8);
        let result = no_panic(name, || {
            match ZarrGenotypes::open(&fx.spec(str_of(&e["spec"]))) {
                Ok(g) => check_dosages(name, &g, &truth, &boundaries(e, 0))
                    .into_iter()
                    .map(|(_, p)| p)
                    .collect(),
                Err(err) => vec![format!("{name}: open: {err}")],
            }
        });
        match result {
            Ok(p) => problems.extend(p),
            Err(p) => problems.push(p),
        }
    }
    report(problems, entries.len(), "genotype fixtures");
}

#[test]
fn vcf_zarr_stores_give_the_truth_dosages_and_sample_ids() {
    let fx = fixtures();
    let entries = fx.entries("vcf");
    assert!(entries
        .iter()
        .any(|e| e["mask"] == true && e["zarr_format"] == 2));
    assert!(entries.iter().any(|e| e["mask"] == false));
    let mut problems = Vec::new();
    for e in entries {
        let name = str_of(&e["name"]);
        let s = u64s(&e["shape"]);
        let (m, n, p) = (s[0] as usize, s[1] as usize, s[2] as usize);
        let truth = Array2::from_shape_vec(
            (m, n),
            fx.bytes(str_of(&e["truth"]))
                .into_iter()
                .map(|b| b as i8)
                .collect(),
        )
        .unwrap();
        let alleles: Vec<i8> = fx
            .bytes(str_of(&e["alleles"]))
            .into_iter()
            .map(|b| b as i8)
            .collect();
        let mask: Option<Vec<u8>> = e["mask_truth"].as_str().map(|f| fx.bytes(f));
        let ids: Vec<String> = serde_json::from_slice(&fx.bytes(str_of(&e["sample_ids"]))).unwrap();
        let result = no_panic(name, || {
            let mut out = Vec::new();
            let vcf = match VcfZarr::open(&fx.dir.join(str_of(&e["spec"]))) {
                Ok(v) => v,
                Err(err) => return vec![format!("{name}: open: {err}")],
            };
            if vcf.sample_ids().as_deref() != Some(ids.as_slice()) {
                out.push(format!(
                    "{name}: sample ids {:?}, want {ids:?}",
                    vcf.sample_ids()
                ));
            }
            for (rows, text) in check_dosages(name, &vcf, &truth, &boundaries(e, 0)) {
                out.push(text);
                if rows != (0..m as u64) {
                    continue;
                }
                // For the whole matrix, show the calls that differ with their alleles.
                let mut got = Array2::zeros((m, n));
                if vcf.fill_dosages(0..m as u64, got.view_mut()).is_ok() {
                    let calls: Vec<String> = got
                        .indexed_iter()
                        .filter(|&(ij, g)| *g != truth[ij])
                        .map(|((v, smp), g)| {
                            let at = (v * n + smp) * p;
                            format!(
                                "({v}, {smp}) alleles {:?}{}: got {g}, want {}",
                                &alleles[at..at + p],
                                mask.as_ref()
                                    .map(|mk| format!(" mask {:?}", &mk[at..at + p]))
                                    .unwrap_or_default(),
                                truth[(v, smp)]
                            )
                        })
                        .collect();
                    out.push(format!("  {name} calls that differ: {}", calls.join("; ")));
                }
            }
            out
        });
        match result {
            Ok(p) => problems.extend(p),
            Err(p) => problems.push(p),
        }
    }
    report(problems, entries.len(), "VCF Zarr fixtures");
}

// ---------------------------------------------------------------------------------------
// Failures.

/// What an error about failure fixture `f` must contain: the store's name, the array path
/// inside it, the chunk key, and any other words the manifest lists.
fn must_name(f: &Value) -> Vec<String> {
    let spec = str_of(&f["spec"]);
    let store = spec.split(':').next().unwrap().to_string();
    let mut words = vec![store];
    for k in ["array", "chunk_key"] {
        if let Some(w) = f[k].as_str() {
            words.push(w.to_string());
        }
    }
    words.extend(
        f["mentions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| str_of(w).to_string()),
    );
    words
}

/// Opens and reads failure fixture `f` through the library; the error text, or why there
/// was none.
fn library_error(fx: &Fixtures, f: &Value) -> Result<String, String> {
    let spec = fx.spec(str_of(&f["spec"]));
    let text = |e: &dyn std::fmt::Display| e.to_string();
    match str_of(&f["use"]) {
        "matrix" => match ZarrMatrix::open(&spec) {
            Err(e) => Ok(text(&e)),
            Ok(x) => {
                let (m, n) = PanelSource::shape(&x);
                let mut out = Array2::zeros((m as usize, n as usize));
                match x.fill(0..m, out.view_mut()) {
                    Err(e) => Ok(text(&e)),
                    Ok(()) => Err(format!(
                        "opened {} and read it without an error",
                        x.describe()
                    )),
                }
            }
        },
        "genotypes" => match ZarrGenotypes::open(&spec) {
            Err(e) => Ok(text(&e)),
            Ok(g) => {
                let (m, n) = g.shape();
                let mut out = Array2::zeros((m as usize, n as usize));
                match g.fill_dosages(0..m, out.view_mut()) {
                    Err(e) => Ok(text(&e)),
                    Ok(()) => Err(format!(
                        "opened {} and read it without an error",
                        g.describe()
                    )),
                }
            }
        },
        "vcf" => match VcfZarr::open(Path::new(&spec)) {
            Err(e) => Ok(text(&e)),
            Ok(v) => {
                let (m, n) = v.shape();
                let mut out = Array2::zeros((m as usize, n as usize));
                match v.fill_dosages(0..m, out.view_mut()) {
                    Err(e) => Ok(text(&e)),
                    Ok(()) => Err(format!(
                        "opened {} and read it without an error",
                        v.describe()
                    )),
                }
            }
        },
        other => panic!("unknown use {other}"),
    }
}

#[test]
fn damaged_and_unusable_stores_give_errors_naming_array_and_chunk() {
    let fx = fixtures();
    let failures: Vec<&Value> = fx
        .entries("failures")
        .iter()
        .filter(|f| f["library"] != false)
        .collect();
    let mut problems = Vec::new();
    for f in &failures {
        let name = str_of(&f["name"]);
        match no_panic(name, || library_error(fx, f)) {
            Err(p) => problems.push(p),
            Ok(Err(p)) => problems.push(format!("{name} ({}): {p}", str_of(&f["why"]))),
            Ok(Ok(text)) => {
                eprintln!("{name}: {text}");
                let missing: Vec<String> = must_name(f)
                    .into_iter()
                    .filter(|w| !text.contains(w.as_str()))
                    .collect();
                if !missing.is_empty() {
                    problems.push(format!(
                        "{name} ({}): the error does not name {missing:?}: {text}",
                        str_of(&f["why"])
                    ));
                }
            }
        }
    }
    report(problems, failures.len(), "failure fixtures");
}

/// The `rankwise` command that reads failure fixture `f`.
fn cli_args(fx: &Fixtures, f: &Value) -> Vec<String> {
    let spec = fx.spec(str_of(&f["spec"]));
    let args: Vec<&str> = match str_of(&f["use"]) {
        "matrix" => vec!["svd", "--zarr", &spec],
        "genotypes" => vec!["pca", "--zarr", &spec, "-k", "2"],
        "vcf" => vec!["pca", "--vcf-zarr", &spec, "-k", "2"],
        other => panic!("unknown use {other}"),
    };
    args.into_iter().map(String::from).collect()
}

fn rankwise(args: &[String], cwd: &Path) -> RunOutput {
    let mut cmd = Command::new(rankwise_bin());
    cmd.args(args).current_dir(cwd);
    run_with_timeout(cmd, LIMIT)
}

#[test]
fn the_cli_refuses_damaged_and_unusable_stores_naming_array_and_chunk() {
    let fx = fixtures();
    let failures = fx.entries("failures");
    let cwd = scratch("zarr-interop-failures");
    let mut problems = Vec::new();
    for f in failures {
        let name = str_of(&f["name"]);
        let run = rankwise(&cli_args(fx, f), &cwd);
        let why = str_of(&f["why"]);
        if run.timed_out {
            problems.push(format!(
                "{name} ({why}): no exit within {LIMIT:?}\n{}",
                run.describe()
            ));
        } else if run.code == Some(0) || run.code.is_none() {
            problems.push(format!(
                "{name} ({why}): exit {:?}, want a failure\n{}",
                run.code,
                run.describe()
            ));
        } else if run.stderr.contains("panicked") {
            problems.push(format!("{name} ({why}): panicked\n{}", run.describe()));
        } else {
            let missing: Vec<String> = must_name(f)
                .into_iter()
                .filter(|w| !run.stderr.contains(w.as_str()))
                .collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "{name} ({why}): stderr does not name {missing:?}: {}",
                    run.stderr.trim()
                ));
            }
        }
    }
    let leftovers: Vec<_> = fs::read_dir(&cwd)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(leftovers.is_empty(), "failed runs left {leftovers:?}");
    report(problems, failures.len(), "failure fixtures through the CLI");
}

// ---------------------------------------------------------------------------------------
// Results read back in zarr-python.

/// One array of `scripts/zarr_read.py`'s output: shape and exact values.
fn read_back(group: &Value, name: &str) -> (Vec<u64>, Vec<f64>) {
    let a = &group["arrays"][name];
    assert!(
        a.is_object(),
        "zarr-python finds no array {name} in {group:.200}"
    );
    let values = a["f64_bits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| f64::from_bits(b.as_u64().unwrap()))
        .collect();
    (u64s(&a["shape"]), values)
}

fn zarr_read(fx: &Fixtures, group: &Path) -> Value {
    let out = Command::new(&fx.python)
        .arg(repo().join("scripts/zarr_read.py"))
        .arg(group)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "zarr_read.py {}: {}",
        group.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn max_offdiag_identity(gram: &Array2<f64>) -> f64 {
    gram.indexed_iter()
        .map(|((i, j), &g)| (g - if i == j { 1.0 } else { 0.0 }).abs())
        .fold(0.0, f64::max)
}

/// Runs `rankwise ARGS --zarr SPEC --json --out DIR` on a dense fixture and checks the
/// result as zarr-python reads it back: the singular values within `tol`·σ₁ of LAPACK's
/// on the values written, and with `exact` the factors reproducing the matrix.
fn check_cli_result(fx: &Fixtures, fixture: &str, args: &[&str], exact: bool, tol: f64) {
    let e = fx.entry("dense", fixture);
    let truth = fx.truth_f64(e);
    let (m, n) = truth.dim();
    let dir = scratch(&format!("zarr-interop-out-{}", fixture.replace(':', "_")));
    let out = dir.join("result.zarr");
    let mut cli: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    cli.extend([
        "--zarr".into(),
        fx.spec(str_of(&e["spec"])),
        "--json".into(),
        "--out".into(),
        out.display().to_string(),
    ]);
    let run = rankwise(&cli, &dir);
    run.assert_success();
    let printed: Vec<f64> = serde_json::from_str::<Value>(&run.stdout)
        .unwrap_or_else(|err| panic!("{fixture}: stdout is not JSON ({err})\n{}", run.describe()))
        ["singular_values"]
        .as_array()
        .unwrap_or_else(|| panic!("{fixture}: no singular_values in {}", run.stdout))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    let group = zarr_read(fx, &out);
    assert_eq!(
        group["zarr_format"], 3,
        "{fixture}: the output group is Zarr v3"
    );
    let (s_shape, s) = read_back(&group, "S");
    let (u_shape, u) = read_back(&group, "U");
    let (vt_shape, vt) = read_back(&group, "Vt");
    let k = printed.len();
    assert_eq!(
        (s_shape, u_shape, vt_shape),
        (
            vec![k as u64],
            vec![m as u64, k as u64],
            vec![k as u64, n as u64]
        ),
        "{fixture}: shapes of S, U, Vt"
    );
    for (i, (a, b)) in printed.iter().zip(&s).enumerate() {
        // The printed text is shortest round-trip; serde_json's parser may be one ulp off.
        assert!(
            a.to_bits().abs_diff(b.to_bits()) <= 1,
            "{fixture}: S[{i}] printed {a:e}, stored {b:e}"
        );
    }
    let u = Array2::from_shape_vec((m, k), u).unwrap();
    let vt = Array2::from_shape_vec((k, n), vt).unwrap();
    let uu = max_offdiag_identity(&u.t().dot(&u));
    let vv = max_offdiag_identity(&vt.dot(&vt.t()));
    assert!(uu < 1e-12, "{fixture}: max |UᵀU − I| = {uu:e}");
    assert!(vv < 1e-12, "{fixture}: max |VᵀV − I| = {vv:e}");
    // The singular values are those of the matrix zarr-python wrote.
    let sigma = lapack_sigma(&truth);
    for i in 0..k {
        assert!(
            (s[i] - sigma[i]).abs() <= tol * sigma[0],
            "{fixture}: σ[{i}] = {:e}, LAPACK on the truth {:e}",
            s[i],
            sigma[i]
        );
    }
    if exact {
        let back = (&u * &ndarray::Array1::from(s)).dot(&vt);
        let norm = truth.mapv(|x| x * x).sum().sqrt();
        let res = (&back - &truth).mapv(|x| x * x).sum().sqrt() / norm;
        assert!(res < 1e-13, "{fixture}: ‖A − UΣVᵀ‖/‖A‖ = {res:e}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn svd_results_read_back_in_zarr_python() {
    let fx = fixtures();
    for fixture in [
        "v3_f64_blosc-zstd-bitshuffle",
        "v2_i16_gzip",
        "v3_f64_sharded",
        "v3_f64_missing_chunk",
        "group_v2__grp_x",
        "v3_f64_wide",
        "v2_i32_wide",
    ] {
        check_cli_result(fx, fixture, &["svd"], true, 1e-11);
    }
}

#[test]
fn rsvd_results_read_back_in_zarr_python() {
    let fx = fixtures();
    // 12 columns and k + oversampling = 12: the sketch spans the row space, so the
    // singular values are exact.
    // float32 values: f32 tiles by default (SGEMM, each tile's product rounded once to
    // f32 before the f64 sums), f64 on request.
    let sketch = ["rsvd", "-k", "5", "--oversample", "7"];
    check_cli_result(fx, "v2_f32_tall", &sketch, false, 1e-5);
    let f64_tiles = [&sketch[..], &["--precision", "f64"]].concat();
    check_cli_result(fx, "v2_f32_tall", &f64_tiles, false, 1e-11);
    check_cli_result(
        fx,
        "v3_f64_tall",
        &["rsvd", "-k", "4", "--oversample", "8", "--power-iters", "0"],
        false,
        1e-11,
    );
}

#[test]
fn pca_of_a_vcf_zarr_store_reads_back_with_its_sample_ids() {
    let fx = fixtures();
    let e = fx.entry("vcf", "vcf_v2_nomask");
    let ids: Vec<String> = serde_json::from_slice(&fx.bytes(str_of(&e["sample_ids"]))).unwrap();
    let dir = scratch("zarr-interop-pca");
    let out = dir.join("run.zarr");
    let k = 3;
    let run = rankwise(
        &[
            "pca".into(),
            "--vcf-zarr".into(),
            fx.dir.join("vcf_v2_nomask").display().to_string(),
            "-k".into(),
            k.to_string(),
            "--json".into(),
            "--out".into(),
            out.display().to_string(),
        ],
        &dir,
    );
    run.assert_success();
    let group = zarr_read(fx, &out);
    let (vt_shape, vt) = read_back(&group, "Vt");
    assert_eq!(vt_shape, vec![k as u64, ids.len() as u64]);
    let vt = Array2::from_shape_vec((k, ids.len()), vt).unwrap();
    let vv = max_offdiag_identity(&vt.dot(&vt.t()));
    assert!(vv < 1e-12, "max |VᵀV − I| = {vv:e}");
    for name in ["U", "S", "eigenvalues", "explained_variance_ratio"] {
        read_back(&group, name);
    }
    // The .eigenvec file names the samples by the store's sample_id.
    let eigenvec = fs::read_to_string(out.with_extension("eigenvec")).unwrap();
    let named: Vec<&str> = eigenvec
        .lines()
        .skip(1)
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(named, ids, ".eigenvec sample ids");
    fs::remove_dir_all(&dir).unwrap();
}

/// `--extract` and `--exclude` select a VCF Zarr store's variants by its `variant_id`
/// (zarr-python's strings, v2 and v3; `.` is no ID): an extracted list keeps exactly the
/// variants it names, never one without an ID (a `.` in the list names none), and an
/// excluded list keeps all the others. `--keep` selects samples by `sample_id`, and
/// `--chr`, `--not-chr` and `--autosome` select variants by `contig_id[variant_contig]`.
#[test]
fn extract_exclude_and_keep_select_vcf_zarr_variants_and_samples_by_id() {
    let fx = fixtures();
    let dir = scratch("zarr-interop-extract");
    for name in ["vcf_v2_nomask", "vcf_v3_mask"] {
        let path = fx.dir.join(str_of(&fx.entry("vcf", name)["spec"]));
        let vcf = VcfZarr::open(&path).unwrap();
        let mut ids = Vec::new();
        assert!(vcf
            .variant_ids(&mut |id| ids.push(id.map(str::to_owned)))
            .unwrap());
        // scripts/zarr_fixtures.py names variant v `rs{1000 + v}`, every third one `.`.
        let want: Vec<Option<String>> = (0..ids.len())
            .map(|v| (v % 3 != 0).then(|| format!("rs{}", 1000 + v)))
            .collect();
        assert_eq!(ids, want, "{name}: variant_id");
        let m = ids.len() as u64;
        let listed: Vec<&str> = ids
            .iter()
            .flatten()
            .step_by(2)
            .map(String::as_str)
            .collect();
        let list = dir.join(format!("{name}.txt"));
        fs::write(&list, format!(".\n{}\n", listed.join("\n"))).unwrap();
        // scripts/zarr_fixtures.py makes about 15 % of the sites triallelic: a PCA skips
        // them, whatever else selects (the fixture's variant_allele pads with "").
        let mut biallelic = Vec::new();
        assert!(vcf
            .variant_allele_counts(&mut |n| biallelic.push(n <= 2))
            .unwrap());
        let multi = biallelic.iter().filter(|b| !**b).count() as u64;
        assert!(multi > 0, "{name}: the fixture has triallelic sites");
        // Of the variants `on` keeps, those a PCA uses.
        let used = |on: &dyn Fn(usize) -> bool| {
            (0..m as usize).filter(|&v| on(v) && biallelic[v]).count() as u64
        };
        let is_listed = |v: usize| ids[v].as_deref().is_some_and(|id| listed.contains(&id));
        // `rankwise pca --vcf-zarr PATH -k 2 --json EXTRA…`'s report.
        let pca = |extra: &[&str]| {
            let mut args = vec![
                "pca",
                "--vcf-zarr",
                path.to_str().unwrap(),
                "-k",
                "2",
                "--json",
            ];
            args.extend(extra);
            let args: Vec<String> = args.into_iter().map(String::from).collect();
            common::report(&rankwise(&args, &dir))
        };
        // The selection alone: chrX stays in (`pca` leaves it out by default, below).
        let all = "--include-non-autosomes";
        let r = pca(&[all]);
        assert_eq!(r["genotypes"]["variants_filtered"], multi, "{name}");
        let (n, rest) = (used(&is_listed), used(&|v| !is_listed(v)));
        for (option, kept) in [("--extract", n), ("--exclude", rest)] {
            let r = pca(&[option, list.to_str().unwrap(), all]);
            assert_eq!(
                r["genotypes"]["variants_filtered"].as_u64(),
                Some(m - kept),
                "{name} {option}"
            );
        }
        // scripts/zarr_fixtures.py puts variants 0–44 on chr20 and the rest on chrX.
        let mut chroms = Vec::new();
        assert!(vcf
            .variant_chromosomes(&mut |c| chroms.push(c.to_owned()))
            .unwrap());
        let want: Vec<&str> = (0..m)
            .map(|v| if v < 45 { "chr20" } else { "chrX" })
            .collect();
        assert_eq!(chroms, want, "{name}: contig_id[variant_contig]");
        let (on_20, on_x) = (used(&|v| v < 45), used(&|v| v >= 45));
        for (options, kept) in [
            (&["--chr", "20"][..], on_20),
            (&["--autosome"], on_20),
            (&["--not-chr", "20", all], on_x),
            (&["--chr", "chr23", all], on_x),
            // No option: chrX left out, as plink2 --pca leaves it out.
            (&[], on_20),
            (&[all], m - multi),
        ] {
            let r = pca(&[&["--oversample", "3"], options].concat());
            assert_eq!(
                r["genotypes"]["variants_filtered"].as_u64(),
                Some(m - kept),
                "{name} {options:?}"
            );
        }
        // `--keep` by `sample_id` (zarr-python's UTF-8 strings, one not ASCII).
        let samples = vcf.sample_ids().unwrap();
        let listed: Vec<&String> = samples.iter().step_by(2).collect();
        assert!(listed.iter().any(|s| !s.is_ascii()), "{listed:?}");
        let keep = dir.join(format!("{name}.keep"));
        fs::write(
            &keep,
            listed.iter().map(|s| format!("{s}\n")).collect::<String>(),
        )
        .unwrap();
        let r = pca(&["--oversample", "3", "--keep", keep.to_str().unwrap()]);
        assert_eq!(
            r["shape"],
            serde_json::json!([m, listed.len()]),
            "{name} --keep"
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

// ---------------------------------------------------------------------------------------
// `rankwise read`.

#[test]
fn rankwise_read_decodes_every_fixture_once_with_the_truth_checksum() {
    let fx = fixtures();
    let dense = fx.entries("dense");
    let cwd = scratch("zarr-interop-read");
    let mut problems = Vec::new();
    for e in dense {
        let name = str_of(&e["name"]);
        let truth = fx.truth_f64(e);
        let size = match str_of(&e["dtype"]) {
            "u8" | "i8" => 1,
            "i16" => 2,
            "i32" | "f32" => 4,
            _ => 8,
        };
        let args = [
            "read".to_string(),
            "--zarr".into(),
            fx.spec(str_of(&e["spec"])),
            "--json".into(),
        ];
        let run = rankwise(&args, &cwd);
        if !run.success() {
            problems.push(format!("{name}: {}", run.describe()));
            continue;
        }
        let json: Value = match serde_json::from_str(&run.stdout) {
            Ok(v) => v,
            Err(err) => {
                problems.push(format!(
                    "{name}: stdout is not JSON ({err}): {}",
                    run.stdout
                ));
                continue;
            }
        };
        let decoded = json["decoded_bytes"].as_u64();
        if decoded != Some((truth.len() * size) as u64) {
            problems.push(format!(
                "{name}: decoded_bytes {decoded:?}, want {} (every value once)",
                truth.len() * size
            ));
        }
        let want: f64 = truth.sum();
        let scale: f64 = truth.iter().map(|x| x.abs()).sum();
        match json["sum"].as_f64() {
            Some(sum) if (sum - want).abs() <= 1e-12 * scale => {}
            other => problems.push(format!("{name}: sum {other:?}, truth {want:e}")),
        }
        for key in ["seconds", "decoded_gb_per_s", "decoded_gb_per_s_per_core"] {
            if !json[key].as_f64().is_some_and(|x| x.is_finite() && x > 0.0) {
                problems.push(format!("{name}: {key} = {}", json[key]));
            }
        }
    }
    report(problems, dense.len(), "fixtures through `rankwise read`");
}

/// A dosage array's sibling `sample_id` written by zarr-python from a numpy string array
/// (fixed-width: `<U…` in v2, `fixed_length_utf32` in v3) names the `.eigenvec`'s samples,
/// as a variable-length one does; one of the wrong length is an error naming it.
#[test]
fn fixed_width_sample_ids_name_the_samples_and_a_wrong_length_is_an_error() {
    let dir = scratch("zarr-interop-fixed-ids");
    let script = r#"
import sys, warnings
import numpy as np, zarr
warnings.simplefilter("ignore")
out = sys.argv[1]
g = np.random.default_rng(7).integers(0, 3, (300, 40)).astype("int8")
for fmt in (2, 3):
    for kind, ids in (("fixed", np.array([f"ind{i:02d}" for i in range(40)])),
                      ("vlen", np.array([f"ind{i:02d}" for i in range(40)], dtype=object)),
                      ("short", np.array([f"ind{i:02d}" for i in range(39)]))):
        root = zarr.open_group(f"{out}/{kind}{fmt}.zarr", mode="w", zarr_format=fmt)
        d = root.create_array("dosage", shape=g.shape, dtype="int8", chunks=(100, 40))
        d[:] = g
        dtype = str if ids.dtype == object else ids.dtype
        s = root.create_array("sample_id", shape=ids.shape, dtype=dtype, chunks=ids.shape)
        s[:] = ids
"#;
    let out = Command::new(zarr_python())
        .args(["-c", script, dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Vec<String> = (0..40).map(|i| format!("ind{i:02}")).collect();
    for fmt in [2, 3] {
        for kind in ["fixed", "vlen"] {
            let store = dir.join(format!("{kind}{fmt}.zarr"));
            let result = dir.join(format!("{kind}{fmt}-pca.zarr"));
            let spec = format!("{}:dosage", store.display());
            let run = rankwise(
                &[
                    "pca",
                    "--zarr",
                    &spec,
                    "-k",
                    "2",
                    "--out",
                    result.to_str().unwrap(),
                ]
                .map(String::from),
                &dir,
            );
            assert!(run.success(), "{kind} v{fmt}: {}", run.describe());
            let text = fs::read_to_string(result.with_extension("eigenvec")).unwrap();
            let named: Vec<&str> = text
                .lines()
                .skip(1)
                .map(|l| l.split('\t').next().unwrap())
                .collect();
            assert_eq!(named, want, "{kind} v{fmt}");
        }
        let short = dir.join(format!("short{fmt}.zarr"));
        let spec = format!("{}:dosage", short.display());
        let run = rankwise(&["pca", "--zarr", &spec, "-k", "2"].map(String::from), &dir);
        assert!(!run.success(), "v{fmt}: {}", run.describe());
        assert!(
            run.stderr.contains("sample_id") && run.stderr.contains("has 39 sample IDs"),
            "v{fmt}: {}",
            run.describe()
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

/// sgkit both ways (sgkit 0.10, which reads and writes Zarr v2 only): rankwise reads a
/// genotype Dataset that `sgkit.save_dataset` wrote (byte-string alleles, fixed-width
/// sample IDs), writes its PCA with `--zarr-format 2`, and `sgkit.load_dataset` opens that
/// without a warning, as a Dataset that passes sgkit's variable specs and agrees with
/// `sgkit.pca` of the same Dataset (`scripts/sgkit_check.py`).
#[test]
fn sgkit_reads_the_pca_of_its_own_dataset_as_it_computes_it() {
    let python = common::sgkit_python();
    let dir = scratch("zarr-interop-sgkit");
    let mut draw = common::Draw::fresh();
    let (variants, samples, k) = (
        draw.range(1500, 5000),
        draw.range(120, 400),
        draw.range(2, 6),
    );
    let seed = draw.next() % 1_000_000;
    let script = repo().join("scripts/sgkit_check.py");
    let sgkit = |args: &[String]| {
        let mut cmd = Command::new(&python);
        cmd.arg(&script).args(args).current_dir(&dir);
        let run = run_with_timeout(cmd, LIMIT);
        assert!(run.success(), "sgkit_check.py {args:?}: {}", run.describe());
        run
    };
    let shape = format!("{variants} × {samples}, k = {k}, seed {seed}");
    sgkit(
        &[
            "write",
            "in.zarr",
            &seed.to_string(),
            &variants.to_string(),
            &samples.to_string(),
        ]
        .map(String::from),
    );
    let args = [
        "pca",
        "--vcf-zarr",
        "in.zarr",
        "-k",
        &k.to_string(),
        "--out",
        "o.zarr",
    ];
    let run = rankwise(
        &[&args[..], &["--zarr-format", "2"]]
            .concat()
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>(),
        &dir,
    );
    assert!(run.success(), "{shape}: {}", run.describe());
    for file in [".zgroup", ".zmetadata", "sample_pca_loading/.zarray"] {
        assert!(
            dir.join("o.zarr").join(file).is_file(),
            "{shape}: no {file}"
        );
    }
    assert!(!dir.join("o.zarr/zarr.json").exists());
    let check = sgkit(&["check", "in.zarr", "o.zarr", &k.to_string()].map(String::from));
    println!("{shape}: {}", check.stdout.trim());
    // The option is the output's: without `--out` it is refused, naming both.
    let run = rankwise(
        &[
            "pca",
            "--vcf-zarr",
            "in.zarr",
            "-k",
            "2",
            "--zarr-format",
            "2",
        ]
        .map(String::from),
        &dir,
    );
    assert!(
        !run.success() && run.stderr.contains("--out"),
        "{}",
        run.describe()
    );
    let _ = fs::remove_dir_all(&dir);
}
