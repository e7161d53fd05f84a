//! PLINK 1 binary filesets (`pca --bed`) written by PLINK 2 itself (`plink2 --dummy …
//! --make-bed`, Debian's plink2), against PLINK 2's own answers:
//! - the eigenvalues and eigenvectors of `plink2 --pca` (no missing calls);
//! - with missing calls, the mean-imputed PCA of the dosages PLINK 2 exports (`--export A`),
//!   computed here with LAPACK: the `.bed`'s records decode to PLINK's own calls;
//! - `--maf`, `--geno` and `--hwe` exclude the variants PLINK 2's own filters exclude, and
//!   `--extract`/`--exclude` of `plink2 --indep-pairwise`'s lists keep what PLINK keeps;
//! - two ranks under `mpirun` give the embedded run's bits;
//! - a truncated `.bed` and a `.fam` that is not the fileset's fail on both ranks, naming the
//!   file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::mpirun::run_with_timeout;
use common::*;
use ndarray::Array2;
use ndarray_linalg::{Eigh, UPLO};

/// `plink2 --dummy SAMPLES VARIANTS MISSING --make-bed` into `dir/d`, seeded: the prefix.
fn plink_fileset(dir: &Path, samples: u64, variants: u64, missing: f64, seed: u64) -> PathBuf {
    let prefix = dir.join("d");
    let mut cmd = Command::new("plink2");
    cmd.args(["--dummy", &samples.to_string(), &variants.to_string()])
        .arg(missing.to_string())
        .args(["--seed", &(seed % 4_000_000_000).to_string()])
        .args(["--make-bed", "--threads", "1", "--out"])
        .arg(&prefix);
    let run = run_with_timeout(cmd, CLI_LIMIT);
    assert!(
        run.success(),
        "plink2 is installed by scripts/install-deps.sh\n{}",
        run.describe()
    );
    prefix
}

/// A `plink2 --dummy` fileset of drawn shape.
struct Drawn {
    prefix: PathBuf,
    samples: u64,
    variants: u64,
    /// Its fraction of missing calls.
    missing: f64,
}

/// A fileset in `dir` with samples and variants drawn from the ranges (both ends
/// included) and its missing-call fraction one of `missing`.
fn drawn_fileset(
    rng: &mut Draw,
    dir: &Path,
    (s0, s1): (u64, u64),
    (v0, v1): (u64, u64),
    missing: &[f64],
) -> Drawn {
    let samples = rng.range(s0, s1);
    let variants = rng.range(v0, v1);
    let missing = missing[rng.range(0, missing.len() as u64 - 1) as usize];
    let prefix = plink_fileset(dir, samples, variants, missing, rng.next());
    Drawn {
        prefix,
        samples,
        variants,
        missing,
    }
}

/// Runs plink2 with `args` on the fileset `prefix`, writing `prefix.OUT.*`.
fn plink(prefix: &Path, out: &str, args: &[&str]) -> PathBuf {
    let out = prefix.with_file_name(out);
    let mut cmd = Command::new("plink2");
    cmd.arg("--bfile")
        .arg(prefix)
        .args(args)
        .args(["--threads", "1", "--out"])
        .arg(&out);
    let run = run_with_timeout(cmd, CLI_LIMIT);
    assert!(run.success(), "{}", run.describe());
    out
}

fn floats(text: &str) -> Vec<f64> {
    text.split_whitespace()
        .map(|x| x.parse().unwrap_or_else(|_| panic!("not a number: {x}")))
        .collect()
}

/// `rankwise pca --bed PREFIX -k K` with every sample in the sketch (exact), and `extra`.
fn rankwise_pca(prefix: &Path, samples: u64, k: u64, extra: &[&str]) -> Vec<String> {
    let mut args = strings(&["pca", "--bed", prefix.to_str().unwrap(), "-k"]);
    args.push(k.to_string());
    args.extend(strings(&["--oversample", &(samples - k).to_string()]));
    args.extend(strings(extra));
    args
}

#[test]
fn eigenvalues_and_pcs_are_plink2s_own() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-pca");
    // PLINK 2 estimates allele frequencies for --pca from 50 samples or more.
    let samples = rng.range(50, 120);
    let variants = rng.range(500, 4000);
    let k = rng.range(2, 5);
    let prefix = plink_fileset(&dir, samples, variants, 0.0, rng.next());
    let what = format!("{variants} variants × {samples} samples, k = {k}");
    let theirs = plink(&prefix, "p", &["--pca", &k.to_string()]);
    let want = floats(&std::fs::read_to_string(theirs.with_extension("eigenval")).unwrap());
    let out = dir.join("r.zarr");
    let mut args = rankwise_pca(&prefix, samples, k, &["--json", "--out"]);
    args.push(out.to_str().unwrap().into());
    let r = report(&embedded(&args));
    let got = json_floats(&r["eigenvalues"]);
    assert_eq!(got.len(), want.len(), "{what}");
    // PLINK prints six significant digits.
    for (j, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w,
            "{what}: eigenvalue {}: rankwise {g}, plink2 {w}",
            j + 1
        );
    }
    // The samples of both .eigenvec files are the .fam's, in its order, named by the same
    // header and ID columns (`#FID IID` for a .fam).
    let ours = std::fs::read_to_string(dir.join("r.eigenvec")).unwrap();
    let theirs = std::fs::read_to_string(theirs.with_extension("eigenvec")).unwrap();
    let ids_of = |text: &str| -> (String, Vec<String>) {
        let head: Vec<&str> = text.lines().next().unwrap().split('\t').take(2).collect();
        let ids = text
            .lines()
            .skip(1)
            .map(|l| l.split('\t').take(2).collect::<Vec<_>>().join(" "))
            .collect();
        (head.join(" "), ids)
    };
    assert_eq!(ids_of(&ours), ids_of(&theirs), "{what}");
    let pc1 = |text: &str| -> Vec<f64> {
        text.lines()
            .skip(1)
            .map(|l| l.split_whitespace().nth(2).unwrap().parse::<f64>().unwrap())
            .collect()
    };
    let (a, b) = (pc1(&ours), pc1(&theirs));
    assert_eq!(a.len() as u64, samples, "{what}");
    // PC1, ours and PLINK's, against XᵀX/M of PLINK's exported dosages (LAPACK): each is an
    // eigenvector of its largest eigenvalue, to the digits PLINK prints; so the two agree
    // up to sign as far as the eigen-gap resolves PC1 (Davis–Kahan: sin θ(x, v₁) ≤ ‖Gx −
    // ρx‖/(ρ − λ₂) for a unit x with Rayleigh quotient ρ). A small gap (random dosages
    // often have one) loosens the last check, not the first two.
    let gram = reference_gram(&exported_dosages(&prefix, &[]));
    let (ev, _) = gram.eigh(UPLO::Lower).unwrap();
    let n = ev.len();
    let (l1, l2) = (ev[n - 1], ev[n - 2]);
    assert!(
        (want[0] - l1).abs() <= 1e-5 * l1,
        "{what}: λ₁ {l1} vs plink2's {}",
        want[0]
    );
    let unit = |v: &[f64]| {
        let x = ndarray::Array1::from(v.to_vec());
        let norm = x.dot(&x).sqrt();
        x / norm
    };
    // The residual relative to λ₁ and sin θ(x, v₁)'s bound.
    let eigenvector = |x: &ndarray::Array1<f64>| -> (f64, f64) {
        let gx = gram.dot(x);
        let rho = x.dot(&gx);
        let r = (&gx - &(x * rho)).dot(&(&gx - &(x * rho))).sqrt();
        (r / l1, if rho > l2 { r / (rho - l2) } else { 1.0 })
    };
    let (a, b) = (unit(&a), unit(&b));
    let ((ra, sa), (rb, sb)) = (eigenvector(&a), eigenvector(&b));
    // Measured over 26 seeds: ours 1.3e-15 to 3.6e-15 (every sample in the basis: exact),
    // PLINK's 3.4e-7 to 1.2e-6 (six significant digits printed); bounds 28× and 8× above.
    assert!(ra <= 1e-13, "{what}: our PC1's residual {ra:e} of λ₁");
    assert!(rb <= 1e-5, "{what}: plink2's PC1's residual {rb:e} of λ₁");
    let cos = a.dot(&b).abs().min(1.0);
    let sin = (1.0 - cos * cos).sqrt();
    let bound = (sa + sb) * 1.01 + 1e-7;
    eprintln!(
        "{what}: λ₁ {l1:.6}, λ₂ {l2:.6} (gap {:.2e} of λ₁); PC1 residuals {ra:.1e} (ours), \
         {rb:.1e} (plink2); sin θ {sin:.2e} ≤ {bound:.2e}",
        (l1 - l2) / l1
    );
    assert!(
        sin <= bound,
        "{what}: sin θ(PC1, plink2's PC1) = {sin:e} > {bound:e} (λ₁ {l1}, λ₂ {l2})"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The dosages PLINK 2 exports from the fileset (`--export A`: samples × variants, `NA`
/// missing) as variants × samples, −1 missing; `filters` are PLINK's own (`--maf` …).
fn exported_dosages(prefix: &Path, filters: &[&str]) -> Array2<f64> {
    let mut args = filters.to_vec();
    args.extend(["--export", "A"]);
    let raw = plink(prefix, "x", &args).with_extension("raw");
    let text = std::fs::read_to_string(raw).unwrap();
    let rows: Vec<Vec<f64>> = text
        .lines()
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .skip(6)
                .map(|x| if x == "NA" { -1.0 } else { x.parse().unwrap() })
                .collect()
        })
        .collect();
    let (n, m) = (rows.len(), rows[0].len());
    Array2::from_shape_fn((m, n), |(i, j)| rows[j][i])
}

/// The top `k` eigenvalues of XᵀX/M for PLINK's standardization of `g`: per variant,
/// (g − 2p)/√(2p(1−p)) with p from its non-missing calls, missing calls 0 (the mean),
/// monomorphic variants 0.
fn reference_eigenvalues(g: &Array2<f64>, k: usize) -> Vec<f64> {
    let (mut ev, _) = reference_gram(g).eigh(UPLO::Lower).unwrap();
    ev.as_slice_mut()
        .unwrap()
        .sort_by(|a, b| b.partial_cmp(a).unwrap());
    ev.iter().take(k).copied().collect()
}

/// XᵀX/M (samples × samples) for PLINK's standardization of `g` (see
/// [`reference_eigenvalues`]).
fn reference_gram(g: &Array2<f64>) -> Array2<f64> {
    let (m, n) = g.dim();
    let mut x = Array2::<f64>::zeros((m, n));
    for i in 0..m {
        let row = g.row(i);
        let called: Vec<f64> = row.iter().copied().filter(|&v| v >= 0.0).collect();
        let p = called.iter().sum::<f64>() / (2.0 * called.len().max(1) as f64);
        let sd = (2.0 * p * (1.0 - p)).sqrt();
        if sd == 0.0 {
            continue;
        }
        for j in 0..n {
            if row[j] >= 0.0 {
                x[[i, j]] = (row[j] - 2.0 * p) / sd;
            }
        }
    }
    x.t().dot(&x) / m as f64
}

#[test]
fn records_with_missing_calls_decode_to_plink2s_exported_dosages() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-missing");
    let samples = rng.range(30, 90);
    let variants = rng.range(300, 2500);
    let missing = [0.01, 0.05, 0.2][rng.range(0, 2) as usize];
    let k = 4;
    let prefix = plink_fileset(&dir, samples, variants, missing, rng.next());
    let what = format!("{variants} variants × {samples} samples, {missing} missing");
    let g = exported_dosages(&prefix, &[]);
    assert_eq!(g.dim(), (variants as usize, samples as usize));
    let want = reference_eigenvalues(&g, k);
    let r = report(&embedded(&rankwise_pca(
        &prefix,
        samples,
        k as u64,
        &["--json"],
    )));
    let calls = g.iter().filter(|&&v| v < 0.0).count() as u64;
    assert_eq!(
        r["genotypes"]["missing_calls"].as_u64(),
        Some(calls),
        "{what}"
    );
    let got = json_floats(&r["eigenvalues"]);
    assert_eq!(got.len(), want.len(), "{what}: eigenvalues");
    for (j, (got, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (got - w).abs() <= 1e-10 * w,
            "{what}: eigenvalue {}: rankwise {got}, reference {w}",
            j + 1
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--maf` and `--geno` exclude the variants PLINK 2's own filters exclude, those exactly
/// at a threshold kept. The thresholds are round numbers and the samples a multiple of 50,
/// so that variants sit exactly on them; the test counts them to be sure.
#[test]
fn maf_and_geno_exclude_the_variants_plink2_excludes() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-filter");
    let samples = 50 * rng.range(1, 2);
    let variants = rng.range(800, 3000);
    let missing = [0.0, 0.02, 0.05][rng.range(0, 2) as usize];
    let maf = ["0.1", "0.2", "0.25"][rng.range(0, 2) as usize];
    let geno = ["0.02", "0.04"][rng.range(0, 1) as usize];
    let what = format!(
        "{variants} variants × {samples} samples, {missing} missing, --maf {maf} --geno {geno}"
    );
    let filters = ["--maf", maf, "--geno", geno];
    // Variants exactly on each threshold, from the fileset's own calls.
    let ties = |all: &Array2<f64>| {
        let (mut on_maf, mut on_geno) = (0, 0);
        for row in all.rows() {
            let missing = row.iter().filter(|&&v| v < 0.0).count() as f64;
            let alt: f64 = row.iter().filter(|&&v| v >= 0.0).sum();
            let alleles = 2.0 * (samples as f64 - missing);
            on_maf += (alt.min(alleles - alt) / alleles == maf.parse::<f64>().unwrap()) as u32;
            on_geno += (missing / samples as f64 == geno.parse::<f64>().unwrap()) as u32;
        }
        (on_maf, on_geno)
    };
    // PLINK's dummy frequencies leave some thresholds bare in some draws: a few seeds are
    // tried until a fileset has variants on both.
    let prefix = (0..8)
        .map(|_| plink_fileset(&dir, samples, variants, missing, rng.next()))
        .find(|prefix| {
            let (on_maf, on_geno) = ties(&exported_dosages(prefix, &[]));
            on_maf > 0 && (missing == 0.0 || on_geno > 0)
        })
        .unwrap_or_else(|| panic!("{what}: no fileset of eight with variants on the thresholds"));
    assert_filters_keep_plink2s_variants(&prefix, (variants, samples, missing), &filters);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Asserts that rankwise, given PLINK 2's filter options `filters` (which leave `samples`
/// samples), excludes as many variants as `plink2 --write-snplist` keeps out, and that its
/// eigenvalues (k = 3, exact) are those of the variants PLINK keeps: its `--pca`'s without
/// missing calls, else the mean-imputed PCA (LAPACK) of the dosages it exports under the
/// same options.
fn assert_filters_keep_plink2s_variants(
    prefix: &Path,
    (variants, samples, missing): (u64, u64, f64),
    filters: &[&str],
) {
    let what = format!("{variants} variants × {samples} samples, {missing} missing, {filters:?}");
    let k = 3u64;
    let k_text = k.to_string();
    let mut args = filters.to_vec();
    args.push("--write-snplist");
    let list = plink(prefix, "s", &args).with_extension("snplist");
    let kept = std::fs::read_to_string(list).unwrap().lines().count() as u64;
    let mut extra = filters.to_vec();
    extra.push("--json");
    let r = report(&embedded(&rankwise_pca(prefix, samples, k, &extra)));
    let gs = &r["genotypes"];
    assert_eq!(
        gs["variants_filtered"].as_u64(),
        Some(variants - kept),
        "{what}"
    );
    assert!(kept > 0, "{what}: plink2 kept no variant");
    let got = json_floats(&r["eigenvalues"]);
    let g = exported_dosages(prefix, filters);
    assert_eq!(g.nrows() as u64, kept, "{what}");
    let want = reference_eigenvalues(&g, k as usize);
    assert_eq!(got.len(), want.len(), "{what}: eigenvalues");
    for (j, (e, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (e - w).abs() <= 1e-10 * w,
            "{what}: eigenvalue {}: rankwise {e}, reference {w}",
            j + 1
        );
    }
    if missing == 0.0 {
        let mut args = filters.to_vec();
        args.extend(["--pca", &k_text]);
        let theirs = plink(prefix, "p", &args).with_extension("eigenval");
        let theirs = floats(&std::fs::read_to_string(theirs).unwrap());
        assert_eq!(got.len(), theirs.len(), "{what}: plink2's eigenvalues");
        for (j, (e, w)) in got.iter().zip(&theirs).enumerate() {
            assert!(
                (e - w).abs() <= 1e-5 * w,
                "{what}: eigenvalue {}: rankwise {e}, plink2 {w}",
                j + 1
            );
        }
    }
}

/// `--hwe P` and `--hwe P midp` exclude the variants PLINK 2's own exact test excludes, with
/// missing calls or without, alone or with `--maf`.
#[test]
fn hwe_excludes_the_variants_plink2s_exact_test_excludes() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-hwe");
    let Drawn {
        prefix,
        samples,
        variants,
        missing,
    } = drawn_fileset(&mut rng, &dir, (50, 400), (800, 3000), &[0.0, 0.02, 0.1]);
    // Thresholds that exclude some of PLINK's dummy variants (drawn in equilibrium).
    let p = ["0.01", "0.05", "0.2"][rng.range(0, 2) as usize];
    for filters in [
        vec!["--hwe", p],
        vec!["--hwe", p, "midp"],
        vec!["--hwe", p, "midp", "--maf", "0.1"],
    ] {
        assert_filters_keep_plink2s_variants(&prefix, (variants, samples, missing), &filters);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--autosome`, `--chr` and `--not-chr` keep the variants PLINK 2 keeps, on a fileset whose
/// `.bim` spreads the variants over autosomes, X, Y, XY, MT and unplaced (`0`) in runs, some
/// named with a `chr` prefix; alone, with `--maf`, and with `--extract`.
#[test]
fn chromosome_options_keep_what_plink2_keeps() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-chr");
    let Drawn {
        prefix,
        samples,
        variants,
        missing,
    } = drawn_fileset(&mut rng, &dir, (50, 300), (900, 2500), &[0.0, 0.02]);
    // Each chromosome one run of variants, in order, of a drawn length: at least 30 for
    // an autosome, so that every option below keeps some; the unplaced run takes the rest.
    let names = ["1", "2", "3", "5", "9", "22", "X", "Y", "XY", "MT", "0"];
    let mut cuts = Vec::new();
    let mut end = 0;
    for name in &names[..names.len() - 1] {
        let least = if name.parse::<u32>().is_ok() { 30 } else { 0 };
        end += rng.range(least, variants / 14);
        cuts.push(end);
    }
    let prefixed = rng.range(0, 1) == 1;
    let bim = prefix.with_extension("bim");
    let text = std::fs::read_to_string(&bim).unwrap();
    let mut out = String::new();
    for (row, line) in text.lines().enumerate() {
        let c = names[cuts.iter().filter(|&&c| c <= row as u64).count()];
        let c = if prefixed && c != "0" {
            format!("chr{c}")
        } else {
            c.to_string()
        };
        let (_, rest) = line.split_once(char::is_whitespace).unwrap();
        out.push_str(&format!("{c}\t{rest}\n"));
    }
    std::fs::write(&bim, out).unwrap();
    let list = dir.join("ids.txt");
    let ids: Vec<String> = text
        .lines()
        .filter(|_| rng.range(0, 1) == 1)
        .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
        .collect();
    std::fs::write(&list, ids.join("\n")).unwrap();
    let list = list.to_str().unwrap();
    for filters in [
        vec!["--autosome"],
        vec!["--chr", "2-5,chr22"],
        vec!["--not-chr", "0-1,23-26"],
        vec!["--not-chr", "X,Y,XY,MT,0,3"],
        vec!["--autosome", "--maf", "0.1"],
        vec!["--autosome", "--extract", list],
    ] {
        assert_filters_keep_plink2s_variants(&prefix, (variants, samples, missing), &filters);
    }
    // No option: X, Y and MT are left out, as plink2 --pca leaves them out (XY and the
    // unplaced run stay in); --include-non-autosomes keeps them.
    let sex_and_mt = (cuts[7] - cuts[5]) + (cuts[9] - cuts[8]);
    let r = report(&embedded(&rankwise_pca(&prefix, samples, 3, &["--json"])));
    let what = format!("{variants} × {samples}, {sex_and_mt} on X, Y or MT");
    assert_eq!(r["genotypes"]["variants_filtered"], sex_and_mt, "{what}");
    if missing == 0.0 {
        let theirs = plink(&prefix, "default", &["--pca", "3"]).with_extension("eigenval");
        let theirs = floats(&std::fs::read_to_string(theirs).unwrap());
        for (j, (e, w)) in json_floats(&r["eigenvalues"])
            .iter()
            .zip(&theirs)
            .enumerate()
        {
            assert!(
                (e - w).abs() <= 1e-5 * w,
                "{what}: eigenvalue {}: rankwise {e}, plink2 --pca {w}",
                j + 1
            );
        }
    }
    let all = rankwise_pca(&prefix, samples, 3, &["--json", "--include-non-autosomes"]);
    let r = report(&embedded(&all));
    assert_eq!(r["genotypes"]["variants_filtered"], 0, "{what}");
    let run = embedded(&rankwise_pca(&prefix, samples, 3, &[]));
    assert!(
        sex_and_mt == 0
            || run
                .stdout
                .contains("excluded by X, Y and MT (left out as plink2 --pca"),
        "{}",
        run.describe()
    );
    // A list that leaves nothing fails before the first pass, naming the option.
    let run = embedded(&rankwise_pca(&prefix, samples, 3, &["--chr", "4"]));
    assert!(!run.success(), "{}", run.describe());
    assert!(
        run.stderr.contains("--chr 4: none of the"),
        "{}",
        run.describe()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The usual way to a PCA: LD-prune with `plink2 --indep-pairwise`, then `--extract` the
/// `.prune.in` (or `--exclude` the `.prune.out`, here with `--maf` too). rankwise keeps the
/// variants PLINK 2 keeps under the same options, and gives the eigenvalues of those.
#[test]
fn extract_and_exclude_keep_what_plink2_keeps_after_ld_pruning() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-prune");
    let Drawn {
        prefix,
        samples,
        variants,
        missing,
    } = drawn_fileset(&mut rng, &dir, (50, 200), (1000, 4000), &[0.0, 0.02]);
    let window = rng.range(20, 100).to_string();
    let r2 = ["0.05", "0.1", "0.2"][rng.range(0, 2) as usize];
    let pruned = plink(&prefix, "ld", &["--indep-pairwise", &window, "5", r2]);
    let lists = [
        pruned.with_extension("prune.in"),
        pruned.with_extension("prune.out"),
    ];
    let [keep, drop] = lists.each_ref().map(|p| p.to_str().unwrap());
    for filters in [
        vec!["--extract", keep],
        vec!["--exclude", drop, "--maf", "0.05"],
    ] {
        assert_filters_keep_plink2s_variants(&prefix, (variants, samples, missing), &filters);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--keep` and `--remove` restrict the PCA to the samples PLINK 2 keeps under the same
/// list (`FID IID` lines, with a `#FID IID` header or without): frequencies and filters of
/// those samples, PLINK's eigenvalues, and the `.eigenvec` names them in the `.fam`'s order.
#[test]
fn keep_and_remove_restrict_the_samples_as_plink2_does() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-keep");
    let Drawn {
        prefix,
        samples,
        variants,
        missing,
    } = drawn_fileset(&mut rng, &dir, (90, 200), (800, 2500), &[0.0, 0.03]);
    let fam = std::fs::read_to_string(prefix.with_extension("fam")).unwrap();
    // Two samples of every three, from a random one on: 60 or more kept.
    let offset = rng.range(0, 2) as usize;
    let lines: Vec<&str> = fam.lines().collect();
    let third = |i: &usize| (i + offset).is_multiple_of(3);
    let listed: Vec<&str> = (0..lines.len())
        .filter(|i| !third(i))
        .map(|i| lines[i])
        .collect();
    let rest: Vec<&str> = (0..lines.len()).filter(third).map(|i| lines[i]).collect();
    let pair = |l: &&str| l.split_whitespace().take(2).collect::<Vec<_>>().join("\t");
    let header = if rng.range(0, 1) == 1 {
        "#FID\tIID\n"
    } else {
        ""
    };
    let keep = dir.join("keep.txt");
    let body: Vec<String> = listed.iter().map(pair).collect();
    std::fs::write(&keep, format!("{header}{}\n", body.join("\n"))).unwrap();
    // The others, by IID alone: removing them keeps the same samples (PLINK's --pca wants
    // 50 or more).
    let remove = dir.join("remove.txt");
    let iids: Vec<&str> = rest
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    std::fs::write(&remove, iids.join("\n")).unwrap();
    let [keep, remove] = [&keep, &remove].map(|p| p.to_str().unwrap());
    let cases = [
        (vec!["--keep", keep], &listed),
        (vec!["--remove", remove, "--maf", "0.1"], &listed),
    ];
    for (filters, kept) in cases {
        let what = format!(
            "{variants} variants × {samples} samples, {missing} missing, {} kept, {filters:?}",
            kept.len()
        );
        let shape = (variants, kept.len() as u64, missing);
        assert_filters_keep_plink2s_variants(&prefix, shape, &filters);
        let out = dir.join("k.zarr");
        let mut args = filters.clone();
        args.extend(["--out", out.to_str().unwrap()]);
        embedded(&rankwise_pca(&prefix, kept.len() as u64, 3, &args)).assert_success();
        let eigenvec = std::fs::read_to_string(dir.join("k.eigenvec")).unwrap();
        let named: Vec<String> = eigenvec
            .lines()
            .skip(1)
            .map(|l| l.split('\t').take(2).collect::<Vec<_>>().join(" "))
            .collect();
        let want: Vec<String> = kept
            .iter()
            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(named, want, "{what}");
        for f in [
            "k.zarr",
            "k.eigenvec",
            "k.eigenval",
            "k.png",
            "k.eigenvec.var",
            "k.afreq",
        ] {
            let p = dir.join(f);
            let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Samples named as PLINK 2 names them: two families that share every IID, kept and
/// removed by `FID IID` lines, and by a one-column list (FID 0, which names none of them);
/// the `.eigenvec` carries both ID columns, the kept samples those plink2 keeps.
#[test]
fn samples_are_named_by_family_and_individual_as_plink2_names_them() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-fid");
    let samples = 2 * rng.range(20, 60);
    let variants = rng.range(300, 1500);
    let prefix = plink_fileset(&dir, samples, variants, 0.0, rng.next());
    let fam_path = prefix.with_extension("fam");
    let fam: String = std::fs::read_to_string(&fam_path)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(j, l)| {
            let rest: Vec<&str> = l.split_whitespace().skip(2).collect();
            format!("fam{}\ts{}\t{}\n", j % 2, j / 2, rest.join("\t"))
        })
        .collect();
    std::fs::write(&fam_path, fam).unwrap();
    let pair = |j: u64| format!("fam{} s{}", j % 2, j / 2);
    // About two thirds by FID IID (both families' copies of some IIDs, one of others).
    let listed: Vec<String> = (0..samples)
        .filter(|_| rng.range(0, 2) > 0)
        .map(pair)
        .collect();
    let keep = dir.join("keep.txt");
    std::fs::write(&keep, listed.join("\n") + "\n").unwrap();
    let few: Vec<String> = (0..samples).filter(|j| j % 7 == 3).map(pair).collect();
    let remove = dir.join("remove.txt");
    std::fs::write(
        &remove,
        format!("#FID\tIID\n{}\n", few.join("\n").replace(' ', "\t")),
    )
    .unwrap();
    let single = dir.join("single.txt");
    std::fs::write(&single, "s0\ns1\n").unwrap();
    let [keep, remove, single] = [&keep, &remove, &single].map(|p| p.to_str().unwrap());
    for (n, filters) in [vec!["--keep", keep], vec!["--remove", remove]]
        .into_iter()
        .enumerate()
    {
        let mut args = filters.clone();
        args.push("--write-samples");
        let written = plink(&prefix, &format!("w{n}"), &args).with_extension("id");
        let theirs: Vec<String> = std::fs::read_to_string(written)
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        let out = dir.join(format!("r{n}.zarr"));
        let mut ours = strings(&["pca", "--bed", prefix.to_str().unwrap(), "-k", "2"]);
        ours.extend(strings(&filters));
        ours.extend(strings(&["--out", out.to_str().unwrap()]));
        embedded(&ours).assert_success();
        let eigenvec = std::fs::read_to_string(out.with_extension("eigenvec")).unwrap();
        assert!(eigenvec.starts_with("#FID\tIID\tPC1\tPC2\n"), "{eigenvec}");
        let named: Vec<String> = eigenvec
            .lines()
            .skip(1)
            .map(|l| l.split('\t').take(2).collect::<Vec<_>>().join(" "))
            .collect();
        assert_eq!(named, theirs, "{filters:?}");
        assert!(
            named.len() < samples as usize,
            "{filters:?} kept every sample"
        );
    }
    // One column is an IID of family 0: plink2 keeps nobody here, and so do we, saying so.
    let mut cmd = Command::new("plink2");
    cmd.arg("--bfile")
        .arg(&prefix)
        .args(["--keep", single, "--write-samples", "--out"]);
    cmd.arg(dir.join("w-single"));
    let run = run_with_timeout(cmd, CLI_LIMIT);
    assert!(!run.success(), "plink2 kept samples by a one-column list");
    let run = embedded(&strings(&[
        "pca",
        "--bed",
        prefix.to_str().unwrap(),
        "-k",
        "2",
        "--keep",
        single,
    ]));
    assert!(!run.success());
    assert!(run.stderr.contains("--keep"), "{}", run.describe());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_ranks_read_the_fileset_with_the_embedded_runs_bits() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-mpi");
    let (samples, variants) = (rng.range(30, 200), rng.range(1000, 6000));
    let prefix = plink_fileset(&dir, samples, variants, 0.02, rng.next());
    let chunk = rng.range(50, 700).to_string();
    // And with a random half of the variants extracted: every rank selects the same rows.
    let list = dir.join("half.txt");
    let ids: String = (0..variants)
        .filter(|_| rng.range(0, 1) == 1)
        .map(|i| format!("snp{i}\n"))
        .collect();
    std::fs::write(&list, ids).unwrap();
    // And with every other sample kept: every rank compacts its panels alike.
    let keep = dir.join("keep.txt");
    std::fs::write(
        &keep,
        (0..samples)
            .step_by(2)
            .map(|j| format!("per{j}\n"))
            .collect::<String>(),
    )
    .unwrap();
    let [list, keep] = [&list, &keep].map(|p| p.to_str().unwrap());
    // And with the variants from a drawn one on chromosome 2: every rank reads the .bim's.
    let bim = prefix.with_extension("bim");
    let first_on_2 = rng.range(1, variants - 1);
    let text: String = std::fs::read_to_string(&bim)
        .unwrap()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let chr = if i as u64 >= first_on_2 { "2" } else { "1" };
            format!("{chr}{}\n", &l[l.find(char::is_whitespace).unwrap()..])
        })
        .collect();
    std::fs::write(&bim, text).unwrap();
    for (extra, n) in [
        (vec![], samples),
        (vec!["--extract", list], samples),
        (vec!["--keep", keep, "--extract", list], samples.div_ceil(2)),
        (vec!["--chr", "2", "--extract", list], samples),
    ] {
        let mut args = vec!["--json", "--chunk-rows", &chunk];
        args.extend(extra);
        let args = rankwise_pca(&prefix, n, 3, &args);
        let one = report(&embedded(&args));
        let two = report(&under_mpirun(2, &args));
        assert_eq!(two["ranks"].as_u64(), Some(2), "{two}");
        assert_eq!(
            json_bits(&one["singular_values"]),
            json_bits(&two["singular_values"]),
            "{variants} × {samples}, panels of {chunk}, {args:?}"
        );
        assert_eq!(one["genotypes"], two["genotypes"], "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A list that names nothing in the fileset, a list whose header names no IID column, and a
/// list that is not there fail on both ranks naming the option; the first two before any
/// pass reads the matrix ("none of the … is left", not the first pass's "no variants left").
#[test]
fn lists_that_leave_nothing_fail_on_both_ranks_naming_the_option() {
    let dir = scratch("plink-lists");
    let prefix = plink_fileset(&dir, 50, 400, 0.0, 3);
    let nobody = dir.join("nobody.txt");
    std::fs::write(&nobody, "rs0 someone\nrs1 else\n").unwrap();
    let header = dir.join("header.txt");
    std::fs::write(&header, "#FID\tPID\n0 per1\n").unwrap();
    let [nobody, header] = [&nobody, &header].map(|p| p.to_str().unwrap());
    for (extra, option, says) in [
        (
            ["--extract", nobody],
            "--extract",
            "none of the 400 variants",
        ),
        (["--keep", nobody], "--keep", "none of the 50 samples"),
        (["--remove", header], "--remove", "names no IID column"),
        (["--exclude", "not/here.txt"], "--exclude", "not/here.txt"),
        (["--chr", "5"], "--chr", "--chr 5: none of the 400 variants"),
        (
            ["--not-chr", "X-1"],
            "--not-chr",
            "a range runs between chromosome numbers",
        ),
    ] {
        let args = rankwise_pca(&prefix, 50, 3, &extra);
        let run = under_mpirun(2, &args);
        assert_both_ranks_name(&run, &args, option);
        assert!(run.stderr.contains(says), "{}", run.describe());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_broken_fileset_fails_on_both_ranks_naming_the_file() {
    let dir = scratch("plink-broken");
    let prefix = plink_fileset(&dir, 50, 400, 0.0, 7);
    let bed = prefix.with_extension("bed");
    let bytes = std::fs::read(&bed).unwrap();
    std::fs::write(&bed, &bytes[..bytes.len() - 5]).unwrap();
    let args = strings(&["pca", "--bed", prefix.to_str().unwrap(), "-k", "3"]);
    let run = under_mpirun(2, &args);
    assert_both_ranks_name(&run, &args, &bed.display().to_string());
    assert!(run.stderr.contains("truncated"), "{}", run.describe());
    // A .fam of another fileset (four samples fewer: one byte less per record): the
    // .bed's length names the mismatch.
    std::fs::write(&bed, &bytes).unwrap();
    let fam = prefix.with_extension("fam");
    let text = std::fs::read_to_string(&fam).unwrap();
    std::fs::write(&fam, text.lines().skip(4).collect::<Vec<_>>().join("\n")).unwrap();
    let run = embedded(&args);
    assert_fails_naming(&run, &args, &bed.display().to_string());
    assert!(
        run.stderr.contains("400 variants") && run.stderr.contains("× 46 samples"),
        "{}",
        run.describe()
    );
    assert!(run.stderr.contains("longer"), "{}", run.describe());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A genotype Zarr store written by `rankwise gen`, turned into a fileset by
/// `tools/zarr_to_bed.py` (what benches/plink.sh gives PLINK 2), reads back through
/// `--bed` with the store's own bits: the benchmark's two sides see one matrix.
#[test]
fn a_store_turned_into_a_fileset_gives_the_stores_bits() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-from-zarr");
    let (variants, samples) = (rng.range(2_000, 12_000), rng.range(20, 700));
    let chunk = rng.range(100, 1_000);
    let store = dir.join("g.zarr");
    let mut gen = Command::new(rankwise_bin());
    gen.args([
        "gen",
        "--out",
        store.to_str().unwrap(),
        "--dist",
        "genotype",
    ])
    .args([
        "--rows",
        &variants.to_string(),
        "--cols",
        &samples.to_string(),
    ])
    .args(["--chunk-rows", &chunk.to_string(), "--populations", "2"])
    .args(["--missing", "0.03", "--seed", &rng.next().to_string()])
    .args(["--dtype", "i8", "--codec", "none"]);
    run_with_timeout(gen, CLI_LIMIT).assert_success();
    let prefix = dir.join("g");
    let mut convert = Command::new(zarr_python());
    convert
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/zarr_to_bed.py"))
        .arg(&store)
        .arg(&prefix);
    run_with_timeout(convert, CLI_LIMIT).assert_success();
    let spec = format!("{}:call_dosage", store.display());
    let common = ["-k", "4", "--chunk-rows", &chunk.to_string(), "--json"];
    let from_zarr = report(&embedded(&strings(
        &[&["pca", "--zarr", spec.as_str()][..], &common].concat(),
    )));
    let from_bed = report(&embedded(&strings(
        &[&["pca", "--bed", prefix.to_str().unwrap()][..], &common].concat(),
    )));
    assert_eq!(
        json_bits(&from_zarr["singular_values"]),
        json_bits(&from_bed["singular_values"]),
        "{variants} × {samples}, chunks of {chunk}"
    );
    assert_eq!(from_zarr["genotypes"], from_bed["genotypes"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `PREFIX.eigenvec`'s PCs (samples × k), with each line's IDs.
fn eigenvec(path: &Path) -> (Vec<String>, Array2<f64>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut ids = Vec::new();
    let mut rows = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        ids.push(format!("{} {}", f[0], f[1]));
        rows.push(floats(&f[2..].join(" ")));
    }
    let k = rows[0].len();
    let flat: Vec<f64> = rows.concat();
    (
        ids,
        Array2::from_shape_vec((flat.len() / k, k), flat).unwrap(),
    )
}

/// `pca --out RUN` writes the variant weights and frequencies `plink2 --score` reads:
/// projecting the PCA's own samples gives back their PCs; projecting another fileset (whose
/// `.bim` lists the alleles in another order for about half the variants, renames one ID,
/// gives one variant other alleles and one no ID) matches the variants plink2 matches and
/// gives plink2's score sums on the `.eigenvec`'s scale, on one process and under `mpirun`
/// alike, bit for bit.
#[test]
fn projection_gives_back_the_pcas_samples_and_plink2s_scores() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-project");
    let (train_dir, new_dir) = (dir.join("train"), dir.join("new"));
    for d in [&train_dir, &new_dir] {
        std::fs::create_dir_all(d).unwrap();
    }
    let variants = rng.range(1500, 4000);
    let samples = rng.range(60, 150);
    let missing = [0.0, 0.02][rng.range(0, 1) as usize];
    let k = rng.range(2, 4);
    let train = plink_fileset(&train_dir, samples, variants, missing, rng.next());
    let new_samples = rng.range(20, 60);
    let new = plink_fileset(&new_dir, new_samples, variants, missing, rng.next());
    // The PCA, exact, with monomorphic variants filtered out (plink2's variance-standardize
    // refuses a reference frequency of 0 where the new data has the allele).
    let run = dir.join("run");
    let run_s = run.to_str().unwrap();
    let args = rankwise_pca(&train, samples, k, &["--maf", "0.02", "--out", run_s]);
    embedded(&args).assert_success();
    for ext in ["eigenvec.var", "afreq"] {
        assert!(run.with_extension(ext).is_file(), "{ext} missing");
    }

    // Three variants of the new fileset that must not match, at drawn rows among those the
    // PCA weighted (one the filters dropped has no weight to mismatch).
    let weighted: std::collections::HashSet<String> =
        std::fs::read_to_string(run.with_extension("eigenvec.var"))
            .unwrap()
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .collect();
    let bim = new.with_extension("bim");
    let bim_text = std::fs::read_to_string(&bim).unwrap();
    let ids: Vec<&str> = bim_text
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    let mut weighted_row = |from: u64, to: u64| -> u64 {
        let start = rng.range(from, to);
        (start..=to)
            .chain(from..start)
            .find(|&v| weighted.contains(ids[v as usize]))
            .expect("a weighted variant in every third of the fileset")
    };
    let (renamed, other_alleles, unnamed) = (
        weighted_row(0, variants / 3 - 1),
        weighted_row(variants / 3, 2 * variants / 3 - 1),
        weighted_row(2 * variants / 3, variants - 1),
    );
    let text: String = bim_text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut f: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
            match i as u64 {
                v if v == renamed => f[1] = "renamed".into(),
                v if v == other_alleles => {
                    f[4] = "C".into();
                    f[5] = "T".into();
                }
                v if v == unnamed => f[1] = ".".into(),
                _ => {}
            }
            f.join("\t") + "\n"
        })
        .collect();
    std::fs::write(&bim, text).unwrap();

    let chunk = rng.range(50, variants).to_string();
    let project = |input: &Path, out: &Path, np: usize| {
        let args = strings(&[
            "project",
            "--bed",
            input.to_str().unwrap(),
            "--pca",
            run_s,
            "--out",
            out.to_str().unwrap(),
            "--json",
            "--chunk-rows",
            &chunk,
        ]);
        let r = if np == 1 {
            embedded(&args)
        } else {
            under_mpirun(np, &args)
        };
        report(&r)
    };
    // The PCA's own samples.
    let back = dir.join("back");
    let r = project(&train, &back, 1);
    assert_eq!(r["absent"].as_u64(), Some(0), "{r}");
    let (ids, pcs) = eigenvec(&back.with_extension("eigenvec"));
    let (want_ids, want) = eigenvec(&run.with_extension("eigenvec"));
    assert_eq!(ids, want_ids);
    let worst = (&pcs - &want).iter().fold(0.0f64, |a, x| a.max(x.abs()));
    assert!(worst < 1e-6, "projected training PCs differ by {worst:e}");

    // Another fileset: one process and three ranks, bit for bit.
    let one = dir.join("one");
    let three = dir.join("three");
    let r1 = project(&new, &one, 1);
    let r3 = project(&new, &three, 3);
    assert_eq!(r3["ranks"].as_u64(), Some(3), "{r3}");
    let text = |p: &Path| std::fs::read_to_string(p.with_extension("eigenvec")).unwrap();
    assert!(
        text(&one) == text(&three),
        "1 and 3 ranks differ, panels of {chunk}"
    );
    assert_eq!(r1["absent"].as_u64(), Some(2), "{r1}");
    assert_eq!(r1["allele_mismatches"].as_u64(), Some(1), "{r1}");
    assert_eq!(r1["unnamed"].as_u64(), Some(1), "{r1}");

    // plink2 --score on the same files.
    let cols = format!("5-{}", 4 + k);
    let scored = plink(
        &new,
        "scored",
        &[
            "--read-freq",
            &format!("{run_s}.afreq"),
            "--score",
            &format!("{run_s}.eigenvec.var"),
            "2",
            "4",
            "header-read",
            "variance-standardize",
            "no-mean-imputation",
            "cols=+scoresums",
            "--score-col-nums",
            &cols,
        ],
    );
    let log = std::fs::read_to_string(scored.with_extension("log")).unwrap();
    let processed: u64 = log
        .lines()
        .find_map(|l| {
            l.strip_prefix("--score: ")?
                .strip_suffix(" variants processed.")
        })
        .unwrap_or_else(|| panic!("no count in plink2's log:\n{log}"))
        .parse()
        .unwrap();
    assert_eq!(r1["matched"].as_u64(), Some(processed), "{r1}\n{log}");
    let sscore = std::fs::read_to_string(scored.with_extension("sscore")).unwrap();
    let mut lines = sscore.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let sums: Vec<usize> = (1..=k)
        .map(|j| {
            head.iter()
                .position(|h| *h == format!("PC{j}_SUM"))
                .unwrap()
        })
        .collect();
    // Weights and eigenvalues as written: PC = sum / (‖W‖²·√λ).
    let var = std::fs::read_to_string(run.with_extension("eigenvec.var")).unwrap();
    let mut norm2 = vec![0.0; k as usize];
    for line in var.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        for (j, w) in floats(&f[4..].join(" ")).iter().enumerate() {
            norm2[j] += w * w;
        }
    }
    let lambda = floats(&std::fs::read_to_string(run.with_extension("eigenval")).unwrap());
    let (_, ours) = eigenvec(&one.with_extension("eigenvec"));
    let scale = ours.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        for j in 0..k as usize {
            let theirs = f[sums[j]].parse::<f64>().unwrap() / (norm2[j] * lambda[j].sqrt());
            // plink2 prints 6 significant digits.
            assert!(
                (theirs - ours[[i, j]]).abs() <= 1e-5 * scale,
                "sample {i}, PC{}: plink2 {theirs}, rankwise {}",
                j + 1,
                ours[[i, j]]
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Projection onto weights that are not there, or that a fileset cannot use, fails on both
/// ranks naming the file or the option, and leaves no output.
#[test]
fn projection_onto_missing_or_broken_weights_fails_on_both_ranks() {
    let mut rng = Draw(test_seed());
    let dir = scratch("plink-project-bad");
    let prefix = plink_fileset(
        &dir,
        rng.range(20, 40),
        rng.range(200, 500),
        0.0,
        rng.next(),
    );
    let run = dir.join("run");
    let run_s = run.to_str().unwrap();
    embedded(&strings(&[
        "pca",
        "--bed",
        prefix.to_str().unwrap(),
        "-k",
        "2",
        "--maf",
        "0.05",
        "--out",
        run_s,
    ]))
    .assert_success();
    let out = dir.join("proj");
    let args = |pca: &str| {
        strings(&[
            "project",
            "--bed",
            prefix.to_str().unwrap(),
            "--pca",
            pca,
            "--out",
            out.to_str().unwrap(),
        ])
    };
    // No such run.
    let missing = dir.join("nothing");
    let r = under_mpirun(2, &args(missing.to_str().unwrap()));
    assert_both_ranks_name(
        &r,
        &args("nothing"),
        &format!("{}.eigenvec.var", missing.display()),
    );
    // A weights file that names one variant twice.
    let var = run.with_extension("eigenvec.var");
    let text = std::fs::read_to_string(&var).unwrap();
    let second = text.lines().nth(1).unwrap().to_owned();
    std::fs::write(&var, format!("{text}{second}\n")).unwrap();
    let r = under_mpirun(2, &args(run_s));
    assert_both_ranks_name(&r, &args(run_s), &var.display().to_string());
    assert!(r.stderr.contains("appears twice"), "{}", r.stderr);
    // Weights of no variant of the fileset.
    let renamed: String = text
        .lines()
        .map(|l| l.replacen("snp", "other", 1) + "\n")
        .collect();
    std::fs::write(&var, renamed).unwrap();
    let afreq = run.with_extension("afreq");
    let freqs = std::fs::read_to_string(&afreq).unwrap();
    std::fs::write(&afreq, freqs.replace("snp", "other")).unwrap();
    let r = under_mpirun(2, &args(run_s));
    assert_both_ranks_name(&r, &args(run_s), "--pca");
    assert!(r.stderr.contains("no variant of"), "{}", r.stderr);
    assert!(!out.with_extension("eigenvec").exists());
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("proj"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
