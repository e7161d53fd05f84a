//! Convergence control of the randomized SVD and the PCA:
//! - LOBPCG (the default) and block Lanczos on in-memory matrices with flat tails, clustered and
//!   geometrically decaying singular values: every component within the tolerance, against
//!   LAPACK, and the residuals it reports are the true ones of the triplets it returns;
//! - the fixed-iteration methods' residuals are honest too, and `converged` says whether
//!   they meet the tolerance;
//! - structured genotype cohorts (`Generated` with populations, written as a PLINK fileset)
//!   against `plink2 --pca` (exact): every PC to |corr| ≥ 0.9999 and every eigenvalue to
//!   1e-4, for k = 10 and 20, embedded and under `mpirun -np 3` with the same bits;
//! - the unconverged path: a warning and `converged: false`, and with
//!   `--require-converged` a failure on every rank that leaves no output.
//!
//! Shapes, spectra and seeds are drawn fresh on every run from `test_seed()` (printed; set
//! RANKWISE_TEST_SEED to reproduce a failure).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::mpirun::run_with_timeout;
use common::*;
use ndarray::{Array1, Array2};
use ndarray_linalg::{JobSvd, SVDDCInto};
use rankwise::linalg::{Method, RsvdOptions, RsvdProblem, RsvdResult};
use rankwise::sources::{Dist, Generated, InMemoryMatrix};

/// The spectra the solvers are held to.
#[derive(Clone, Copy, Debug)]
enum Profile {
    /// A few strong values over a tail within 2 % of flat: a genotype cohort's shape.
    FlatTail,
    /// Groups of values equal to 1e-9 relative, then a slow decay.
    Clustered,
    /// σᵢ = ρⁱ.
    Geometric,
}

fn spectrum(profile: Profile, r: usize, draw: &mut Draw) -> Vec<f64> {
    match profile {
        Profile::FlatTail => {
            let strong = draw.range(1, 4) as usize;
            (0..r)
                .map(|i| match i < strong {
                    true => 10.0 - 2.0 * i as f64,
                    false => 1.0 - 0.02 * (i - strong) as f64 / r as f64,
                })
                .collect()
        }
        Profile::Clustered => {
            let size = draw.range(2, 4) as usize;
            (0..r)
                .map(|i| {
                    let group = (i / size) as f64;
                    let within = (i % size) as f64;
                    5.0 * 0.8f64.powf(group) * (1.0 - 1e-9 * within)
                })
                .collect()
        }
        Profile::Geometric => {
            let rho = 0.5 + 0.45 * (draw.next() % 1000) as f64 / 1000.0;
            (0..r).map(|i| rho.powi(i as i32)).collect()
        }
    }
}

fn norm(v: ndarray::ArrayView1<'_, f64>) -> f64 {
    v.dot(&v).sqrt()
}

/// The true residuals of the returned triplets, in f64: `‖Aᵀuᵢ − σᵢvᵢ‖/σ₁` and
/// `‖Avᵢ − σᵢuᵢ‖/σ₁`.
fn true_residuals(a: &Array2<f64>, u: &Array2<f64>, r: &RsvdResult) -> (Vec<f64>, Vec<f64>) {
    let v = r.wt.t();
    let atu = a.t().dot(u);
    let av = a.dot(&v);
    let s1 = r.s[0];
    (0..r.s.len())
        .map(|i| {
            let left = &atu.column(i) - &(&v.column(i) * r.s[i]);
            let right = &av.column(i) - &(&u.column(i) * r.s[i]);
            (norm(left.view()) / s1, norm(right.view()) / s1)
        })
        .unzip()
}

#[test]
fn lobpcg_meets_the_tolerance_against_lapack_and_reports_true_residuals() {
    assert_eq!(
        RsvdOptions::default().method,
        Method::Lobpcg,
        "the default solver"
    );
    let mut draw = Draw(test_seed());
    let rt = runtime(2);
    let profiles = [Profile::FlatTail, Profile::Clustered, Profile::Geometric];
    for (profile, method) in profiles
        .into_iter()
        .flat_map(|p| [(p, Method::Lobpcg), (p, Method::Lanczos)])
    {
        let m = draw.range(400, 1500) as usize;
        let n = draw.range(60, 160) as usize;
        let k = draw.range(2, 12) as usize;
        let rank = n;
        let sig = spectrum(profile, rank, &mut draw);
        let a = orthonormal(m, rank, draw.next())
            .dot(&Array2::from_diag(&Array1::from(sig.clone())))
            .dot(&orthonormal(n, rank, draw.next()).t());
        let chunk = (m as u64).div_ceil(draw.range(3, 7));
        let problem =
            RsvdProblem::dense(Arc::new(InMemoryMatrix::new(a.clone(), "drawn")), chunk).unwrap();
        let tol = [1e-6, 1e-8, 1e-10][draw.range(0, 2) as usize];
        let options = RsvdOptions {
            k,
            seed: draw.next(),
            tol,
            method,
            ..RsvdOptions::default()
        };
        let case = format!("{method:?}, {profile:?}: {m}×{n}, k {k}, chunk {chunk}, tol {tol:e}");
        let (r, u) = run_rsvd(&rt, &problem, &options);
        let c = &r.convergence;
        assert!(c.converged, "{case}: {c:?}");
        assert_eq!(c.residuals.len(), k, "{case}");
        let (left, right) = true_residuals(&a, &u, &r);
        for i in 0..k {
            // The reported residual is the true one: to 1 % where it is resolved, and to
            // the f64 rounding of ‖A‖² below that.
            let floor = 1e-12;
            assert!(
                (c.residuals[i] - left[i]).abs() <= 0.01 * left[i] + floor,
                "{case}: component {}: reported {:e}, true ‖Aᵀu − σv‖/σ₁ {:e}",
                i + 1,
                c.residuals[i],
                left[i]
            );
            assert!(left[i] <= tol * 1.01 + floor, "{case}: {i}: {:e}", left[i]);
            // `U` is formed as `A·V/σ` in effect, so the other residual is rounding.
            assert!(
                right[i] <= 1e-11,
                "{case}: {i}: ‖Av − σu‖/σ₁ {:e}",
                right[i]
            );
            // A singular value lies within the residual of each returned one; the sorted
            // ones match by index when they have converged.
            let bound = (left[i] + right[i]) * sig[0] * 2.0 + 1e-12 * sig[0];
            assert!(
                (r.s[i] - sig[i]).abs() <= bound,
                "{case}: σ{}: {} against LAPACK's {}",
                i + 1,
                r.s[i],
                sig[i]
            );
            // Each component whose value stands apart is the exact vector, to residual
            // over gap (Wedin).
            let gap = (0..rank)
                .filter(|&j| j != i)
                .map(|j| (sig[j] - sig[i]).abs())
                .fold(f64::INFINITY, f64::min);
            if gap > 1e-3 * sig[0] {
                let (eu, _, evt) = a.clone().svddc_into(JobSvd::Some).unwrap();
                let (eu, evt) = (eu.unwrap(), evt.unwrap());
                // The cosine of the angle: over the norms, which are 1 only to about 1e-15,
                // and 1 − 5e-15 alone reads as a sine of 1e-7.
                let cos =
                    eu.column(i).dot(&u.column(i)).abs() / (norm(eu.column(i)) * norm(u.column(i)));
                let cos_v =
                    evt.row(i).dot(&r.wt.row(i)).abs() / (norm(evt.row(i)) * norm(r.wt.row(i)));
                let sin = (1.0 - cos.min(1.0).powi(2)).max(0.0).sqrt();
                let sin_v = (1.0 - cos_v.min(1.0).powi(2)).max(0.0).sqrt();
                let allowed = 2.0 * (left[i] + right[i]) * sig[0] / gap + 1e-7;
                assert!(
                    sin.max(sin_v) <= allowed,
                    "{case}: component {}: sin∠ {sin:e} / {sin_v:e}, allowed {allowed:e}",
                    i + 1
                );
            }
        }
        // U and V orthonormal.
        let d = u.t().dot(&u) - Array2::<f64>::eye(k);
        assert!(d.iter().all(|x| x.abs() < 1e-12), "{case}: UᵀU");
        let d = r.wt.dot(&r.wt.t()) - Array2::<f64>::eye(k);
        assert!(d.iter().all(|x| x.abs() < 1e-12), "{case}: VᵀV");
        // The pass that measured them is f64 (mixed precision by default).
        let last = c.pass_precisions.last().unwrap();
        assert_eq!(
            format!("{last:?}"),
            "F64",
            "{case}: {:?}",
            c.pass_precisions
        );
        assert!(r.passes <= options.max_passes, "{case}");
    }
}

/// Block Lanczos stopped by `max_passes` before its basis holds `k + oversample` columns
/// still returns `k` orthonormal triplets, each with its true residual, and says that they
/// did not converge.
#[test]
fn lanczos_stopped_early_returns_honest_unconverged_triplets() {
    let mut draw = Draw(test_seed() ^ 5);
    let rt = runtime(2);
    let (m, n) = (draw.range(500, 900) as usize, draw.range(80, 140) as usize);
    let sig = spectrum(Profile::FlatTail, n, &mut draw);
    let a = orthonormal(m, n, draw.next())
        .dot(&Array2::from_diag(&Array1::from(sig.clone())))
        .dot(&orthonormal(n, n, draw.next()).t());
    let problem =
        RsvdProblem::dense(Arc::new(InMemoryMatrix::new(a.clone(), "drawn")), 128).unwrap();
    let k = draw.range(9, 14) as usize;
    let options = RsvdOptions {
        k,
        seed: draw.next(),
        method: Method::Lanczos,
        max_passes: 2,
        ..RsvdOptions::default()
    };
    let case = format!("{m}×{n}, k {k}");
    let (r, u) = run_rsvd(&rt, &problem, &options);
    let c = &r.convergence;
    assert!(!c.converged, "{case}: {c:?}");
    assert_eq!(r.passes, 2, "{case}");
    assert_eq!(c.residuals.len(), k, "{case}");
    let (left, _) = true_residuals(&a, &u, &r);
    for i in 0..k {
        assert!(
            (c.residuals[i] - left[i]).abs() <= 0.01 * left[i] + 1e-12,
            "{case}: component {}: reported {:e}, true {:e}",
            i + 1,
            c.residuals[i],
            left[i]
        );
    }
    let d = u.t().dot(&u) - Array2::<f64>::eye(k);
    assert!(d.iter().all(|x| x.abs() < 1e-12), "{case}: UᵀU");
}

#[test]
fn fixed_iterations_report_their_true_residuals() {
    let mut draw = Draw(test_seed() ^ 1);
    let rt = runtime(2);
    for method in [Method::SubspaceIteration, Method::BlockKrylov] {
        let m = draw.range(300, 900) as usize;
        let n = draw.range(50, 120) as usize;
        let k = draw.range(2, 8) as usize;
        let sig = spectrum(Profile::Geometric, n, &mut draw);
        let a = orthonormal(m, n, draw.next())
            .dot(&Array2::from_diag(&Array1::from(sig.clone())))
            .dot(&orthonormal(n, n, draw.next()).t());
        let problem = RsvdProblem::dense(
            Arc::new(InMemoryMatrix::new(a.clone(), "drawn")),
            (m as u64).div_ceil(3),
        )
        .unwrap();
        let q = draw.range(0, 2) as usize;
        let options = RsvdOptions {
            k,
            power_iters: q,
            method,
            seed: draw.next(),
            oversample: 5,
            ..RsvdOptions::default()
        };
        let case = format!("{method:?} q {q}: {m}×{n}, k {k}");
        let (r, u) = run_rsvd(&rt, &problem, &options);
        let c = &r.convergence;
        let (left, right) = true_residuals(&a, &u, &r);
        for i in 0..k {
            assert!(
                (c.residuals[i] - right[i]).abs() <= 1e-6 * right[i] + 1e-13,
                "{case}: {}: reported {:e}, true ‖Av − σu‖/σ₁ {:e}",
                i + 1,
                c.residuals[i],
                right[i]
            );
            assert!(left[i] <= 1e-11, "{case}: ‖Aᵀu − σv‖/σ₁ {:e}", left[i]);
            assert_eq!(c.met[i], c.residuals[i] <= c.tol, "{case}");
        }
        assert_eq!(c.converged, c.met.iter().all(|&x| x), "{case}");
    }
}

// ---------------------------------------------------------------------------------------
// Structured cohorts against plink2 --pca
// ---------------------------------------------------------------------------------------

/// Writes the generated cohort as a PLINK 1 fileset `dir/c.{bed,bim,fam}` (dosages of the
/// `.bim`'s first allele, as `rankwise pca --bed` reads them) and returns its prefix.
fn write_fileset(dir: &Path, g: &Generated, variants: u64, samples: u64) -> PathBuf {
    let prefix = dir.join("c");
    let mut bed =
        std::io::BufWriter::new(std::fs::File::create(prefix.with_extension("bed")).unwrap());
    bed.write_all(&[0x6c, 0x1b, 0x01]).unwrap();
    for i in 0..variants {
        let mut row = vec![0u8; samples.div_ceil(4) as usize];
        for j in 0..samples {
            // 00: two copies of allele 1; 10: one; 11: none.
            let code = match g.value(i, j) as i64 {
                2 => 0b00,
                1 => 0b10,
                0 => 0b11,
                v => panic!("dosage {v}"),
            };
            row[(j / 4) as usize] |= code << (2 * (j % 4));
        }
        bed.write_all(&row).unwrap();
    }
    bed.flush().unwrap();
    let bim: String = (0..variants)
        .map(|i| format!("1\tv{i}\t0\t{}\tA\tC\n", i + 1))
        .collect();
    std::fs::write(prefix.with_extension("bim"), bim).unwrap();
    let fam: String = (0..samples)
        .map(|j| format!("f{j} s{j} 0 0 0 -9\n"))
        .collect();
    std::fs::write(prefix.with_extension("fam"), fam).unwrap();
    prefix
}

/// `plink2 --pca K` (exact): eigenvalues and the PCs (samples × K).
fn plink2_pca(prefix: &Path, k: usize) -> (Vec<f64>, Array2<f64>) {
    let out = prefix.with_file_name("p");
    let mut cmd = Command::new("plink2");
    cmd.arg("--bfile")
        .arg(prefix)
        .args(["--pca", &k.to_string(), "--threads", "1", "--out"])
        .arg(&out);
    let run = run_with_timeout(cmd, CLI_LIMIT);
    assert!(run.success(), "{}", run.describe());
    let values = std::fs::read_to_string(out.with_extension("eigenval"))
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (values, eigenvec(&out.with_extension("eigenvec")))
}

/// The PC columns of an `.eigenvec` (its header names them `PC1` …; the ID columns
/// before them are skipped).
fn eigenvec(path: &Path) -> Array2<f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let header = text.lines().next().unwrap();
    let ids = header
        .split_whitespace()
        .take_while(|h| !h.starts_with("PC"))
        .count();
    let rows: Vec<Vec<f64>> = text
        .lines()
        .skip(1)
        .map(|l| {
            l.split_whitespace()
                .skip(ids)
                .map(|x| x.parse().unwrap())
                .collect()
        })
        .collect();
    Array2::from_shape_fn((rows.len(), rows[0].len()), |(i, j)| rows[i][j])
}

fn abs_corr(a: ndarray::ArrayView1<'_, f64>, b: ndarray::ArrayView1<'_, f64>) -> f64 {
    let (ma, mb) = (a.mean().unwrap(), b.mean().unwrap());
    let (a, b) = (a.mapv(|x| x - ma), b.mapv(|x| x - mb));
    (a.dot(&b) / (a.dot(&a) * b.dot(&b)).sqrt()).abs()
}

#[test]
fn structured_cohorts_match_plink2_exact_pca_for_k_10_and_20_on_1_and_3_ranks() {
    let mut draw = Draw(test_seed() ^ 2);
    for k in [10usize, 20] {
        let dir = scratch(&format!("converge-plink-{k}"));
        let samples = draw.range(200, 360);
        let variants = draw.range(3_000, 7_000);
        let populations = draw.range(2, 4);
        let fst = [0.02, 0.05, 0.1][draw.range(0, 2) as usize];
        let g = Generated::new(variants, samples, draw.next(), Dist::Genotype)
            .with_populations(populations, fst)
            .unwrap();
        let case = format!(
            "k {k}: {variants} variants × {samples} samples, {populations} populations, F_ST \
             {fst}"
        );
        let prefix = write_fileset(&dir, &g, variants, samples);
        let (want, theirs) = plink2_pca(&prefix, k);
        assert_eq!(want.len(), k, "{case}");
        let args = |out: &Path| {
            strings(&[
                "pca",
                "--bed",
                prefix.to_str().unwrap(),
                "-k",
                &k.to_string(),
                "--chunk-rows",
                &(variants / 5).to_string(),
                "--json",
                "--out",
                out.to_str().unwrap(),
            ])
        };
        let one = dir.join("one.zarr");
        let r1 = report(&embedded(&args(&one)));
        let three = dir.join("three.zarr");
        let run3 = under_mpirun(3, &args(&three));
        let r3 = report(&run3);
        assert_eq!(r1["converged"], true, "{case}: {}", r1["convergence"]);
        let got = json_floats(&r1["eigenvalues"]);
        assert_eq!(got.len(), k, "{case}");
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * w,
                "{case}: eigenvalue {}: rankwise {g}, plink2 {w}",
                j + 1
            );
        }
        let ours = eigenvec(&one.with_extension("eigenvec"));
        assert_eq!(ours.dim(), theirs.dim(), "{case}");
        let worst_corr = (0..k)
            .map(|j| abs_corr(ours.column(j), theirs.column(j)))
            .fold(1.0f64, f64::min);
        let worst_ev = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w)
            .fold(0.0f64, f64::max);
        eprintln!(
            "{case}: {} passes; min |corr| {worst_corr:.7}, max eigenvalue error {worst_ev:.1e} \
             (plink2 prints 6 digits)",
            r1["passes"]
        );
        for j in 0..k {
            let c = abs_corr(ours.column(j), theirs.column(j));
            assert!(
                c >= 0.9999,
                "{case}: |corr(PC{}, plink2's)| = {c} (eigenvalues {:?})",
                j + 1,
                &want
            );
        }
        // Three ranks: the same bits.
        assert_eq!(
            json_bits(&r1["singular_values"]),
            json_bits(&r3["singular_values"]),
            "{case}"
        );
        assert_eq!(
            json_bits(&r1["convergence"]["residuals"]),
            json_bits(&r3["convergence"]["residuals"]),
            "{case}"
        );
        assert_eq!(
            std::fs::read(one.with_extension("eigenvec")).unwrap(),
            std::fs::read(three.with_extension("eigenvec")).unwrap(),
            "{case}"
        );
        assert_eq!(
            group_bits(&one, &["U", "S", "residuals"]),
            group_bits(&three, &["U", "S", "residuals"]),
            "{case}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ---------------------------------------------------------------------------------------
// The unconverged path
// ---------------------------------------------------------------------------------------

#[test]
fn too_few_passes_warn_and_require_converged_fails_every_rank() {
    let mut draw = Draw(test_seed() ^ 3);
    let dir = scratch("converge-unconverged");
    let (rows, cols) = (draw.range(20_000, 40_000), draw.range(400, 800));
    let seed = draw.next().to_string();
    let base = |extra: &[&str]| {
        let mut a = strings(&[
            "pca",
            "--rows",
            &rows.to_string(),
            "--cols",
            &cols.to_string(),
            "--chunk-rows",
            &(rows / 4).to_string(),
            "--populations",
            "3",
            "--seed",
            &seed,
            "-k",
            "10",
            "--max-passes",
            "2",
        ]);
        a.extend(strings(extra));
        a
    };
    // Embedded: exit 0, the warning names the components, the report says so.
    let out = dir.join("warned.zarr");
    let run = embedded(&base(&["--json", "--out", out.to_str().unwrap()]));
    let r = report(&run);
    assert_eq!(r["converged"], false, "{}", run.describe());
    assert_eq!(
        r["convergence"]["stopped"]
            .as_str()
            .map(|s| s.contains("--max-passes")),
        Some(true)
    );
    assert!(
        run.stderr.contains("warning: ") && run.stderr.contains("did not converge"),
        "{}",
        run.describe()
    );
    let met = r["convergence"]["met"].as_array().unwrap();
    for (i, m) in met.iter().enumerate() {
        if m == false {
            assert!(
                run.stderr.contains(&format!("PC{} (", i + 1)),
                "PC{} unnamed: {}",
                i + 1,
                run.stderr
            );
        }
    }
    assert!(out.exists(), "a warned run still writes its output");
    assert_eq!(r["passes"], 2);
    // --require-converged: every rank fails, and nothing is left.
    for np in [1usize, 3] {
        let out = dir.join(format!("required-{np}.zarr"));
        let args = base(&["--require-converged", "--out", out.to_str().unwrap()]);
        let run = match np {
            1 => embedded(&args),
            n => under_mpirun(n, &args),
        };
        run.assert_finished();
        assert_ne!(run.code, Some(0), "{}", run.describe());
        let named = run.stderr.matches("--require-converged: ").count();
        assert!(named >= np, "{np} rank(s): {}", run.describe());
        assert!(!out.exists(), "{np} rank(s): the output was left");
        for f in ["eigenvec", "eigenval", "png", "eigenvec.var", "afreq"] {
            assert!(!out.with_extension(f).exists(), "{np}: .{f} left");
        }
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{np}: temporaries {leftovers:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
