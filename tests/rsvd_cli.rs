//! `rankwise rsvd` and `rankwise pca`, the real binary: the same bits embedded and under
//! `mpirun` with 1–3 processes, the PCA's PLINK files and plot, refusal to overwrite, and bad
//! input reported by every rank with nothing left behind.
//!
//! Build the binary first (`cargo build --release --workspace --bins`, in the same target
//! directory as the tests; `make test` does).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use common::mpirun::RunOutput;
use common::*;
use rankwise::exec::RuntimeConfig;
use rankwise::linalg::{
    hwe_p, rsvd, HweP, Method, Projection, RsvdOptions, RsvdProblem, VariantFilter,
};
use rankwise::output::read_f64_array;
use rankwise::sources::{Dist, Generated};
use serde_json::Value;

/// A printed number and the stored one: equal, or one ulp apart (serde_json's default
/// float parser is not always correctly rounded; the printed text is shortest round-trip).
fn assert_close_bits(printed: &[u64], stored: &[u64], what: &str) {
    assert_eq!(printed.len(), stored.len(), "{what}: lengths");
    for (i, (a, b)) in printed.iter().zip(stored).enumerate() {
        assert!(
            a.abs_diff(*b) <= 1,
            "{what}[{i}]: printed {} vs stored {}",
            f64::from_bits(*a),
            f64::from_bits(*b)
        );
    }
}

fn sketch_args(draw: &mut Draw, cols: u64) -> (Vec<String>, RsvdOptions) {
    let k = draw.range(2, 8) as usize;
    let p = draw.range(2, 8) as usize;
    let q = draw.range(0, 2) as usize;
    let krylov = (q + 1) * (k + p) <= cols as usize && draw.range(0, 1) == 1;
    let seed = draw.next();
    let separate = draw.range(0, 2) == 0;
    let args = strings(&[
        "--projection",
        if separate { "separate" } else { "fused" },
        "-k",
        &k.to_string(),
        "--oversample",
        &p.to_string(),
        "--power-iters",
        &q.to_string(),
        "--method",
        if krylov { "block-krylov" } else { "subspace" },
        "--sketch-seed",
        &seed.to_string(),
        "--probes",
        "4",
    ]);
    let options = RsvdOptions {
        k,
        oversample: p,
        power_iters: q,
        method: if krylov {
            Method::BlockKrylov
        } else {
            Method::SubspaceIteration
        },
        seed,
        probes: 4,
        projection: if separate {
            Projection::Separate
        } else {
            Projection::Fused
        },
        ..RsvdOptions::default()
    };
    (args, options)
}

/// Runs `args` (with `--json --out`) embedded, on 3 local ranks and under mpirun with 1–3
/// processes; every run must give the same printed numbers and the same arrays, bit for bit.
/// Returns the embedded report and its group.
fn same_bits_everywhere(
    dir: &Path,
    args: &[String],
    printed: &[&str],
    arrays: &[&str],
) -> (Value, PathBuf) {
    let with_out = |name: &str, extra: &[&str]| {
        let mut a = args.to_vec();
        a.extend(strings(extra));
        a.extend(strings(&[
            "--json",
            "--out",
            dir.join(name).to_str().unwrap(),
        ]));
        a
    };
    let t = Instant::now();
    let ref_out = dir.join("ref.zarr");
    let reference = report(&embedded(&with_out("ref.zarr", &[])));
    let ref_arrays = group_bits(&ref_out, arrays);
    assert_close_bits(
        &json_bits(&reference["singular_values"]),
        &ref_arrays["S"].1,
        "singular_values vs S",
    );
    eprintln!("embedded: {:.2} s", t.elapsed().as_secs_f64());
    let mut runs: Vec<(String, RunOutput, PathBuf)> = Vec::new();
    let local = dir.join("local3.zarr");
    runs.push((
        "3 local ranks".into(),
        embedded(&with_out(
            "local3.zarr",
            &["--local-ranks", "3", "--actors", "2"],
        )),
        local,
    ));
    for np in 1..=3 {
        let t = Instant::now();
        let name = format!("np{np}.zarr");
        let run = under_mpirun(np, &with_out(&name, &[]));
        eprintln!("mpirun -np {np}: {:.2} s", t.elapsed().as_secs_f64());
        runs.push((format!("mpirun -np {np}"), run, dir.join(name)));
    }
    for (what, run, out) in &runs {
        let r = report(run);
        if what.starts_with("mpirun") {
            assert_eq!(r["transport"], "mpi", "{what}\n{}", run.describe());
            assert_eq!(
                r["ranks"].as_u64(),
                what[11..].parse::<u64>().ok(),
                "{what}"
            );
        }
        for key in printed {
            assert_eq!(
                json_bits(&r[key]),
                json_bits(&reference[key]),
                "{what}: {key} differs from the embedded run"
            );
        }
        assert_eq!(r["genotypes"], reference["genotypes"], "{what}");
        // Every rank took the root's decision on the last pass.
        assert_eq!(r["passes"], reference["passes"], "{what}");
        assert_eq!(r["projections"], reference["projections"], "{what}");
        assert_eq!(
            json_bits(&Value::Array(vec![r["total_sum_squares"].clone()])),
            json_bits(&Value::Array(vec![reference["total_sum_squares"].clone()])),
            "{what}: total_sum_squares"
        );
        let got = group_bits(out, arrays);
        for name in arrays {
            assert_eq!(got[*name].0, ref_arrays[*name].0, "{what}: shape of {name}");
            assert!(
                got[*name].1 == ref_arrays[*name].1,
                "{what}: {name} differs from the embedded run"
            );
        }
    }
    (reference, ref_out)
}

/// Regression: on AVX-512 Intel CPUs OpenBLAS's SkylakeX kernels made the root rank's small
/// QR and SVD depend on where their operands lay in memory, and this block Krylov run (a
/// 36-column basis of a 38-column matrix) gave other bits with 2 and 3 local ranks than
/// with 1. The binary now runs OpenBLAS's Haswell kernels there; the child processes get no
/// OPENBLAS_CORETYPE of the test's environment, so the binary chooses by itself.
#[test]
fn openblas_avx512_kernels_no_longer_change_the_bits_with_the_rank_count() {
    let args = [
        "rsvd",
        "--rows",
        "5114",
        "--cols",
        "38",
        "--chunk-rows",
        "1023",
        "--seed",
        "9198451021521047816",
        "-k",
        "7",
        "--oversample",
        "5",
        "--power-iters",
        "2",
        "--method",
        "block-krylov",
        "--sketch-seed",
        "10271324026120266740",
        "--json",
    ];
    let bits = |ranks: &str| {
        let mut cmd = std::process::Command::new(rankwise_bin());
        cmd.args(args)
            .args(["--local-ranks", ranks])
            .env_remove("OPENBLAS_CORETYPE");
        json_bits(&report(&common::mpirun::run_with_timeout(cmd, CLI_LIMIT))["singular_values"])
    };
    let one = bits("1");
    for ranks in ["2", "3"] {
        assert_eq!(bits(ranks), one, "--local-ranks {ranks} against 1");
    }
}

#[test]
fn rsvd_under_mpirun_matches_the_embedded_run_bit_for_bit() {
    let dir = scratch("rsvd-cli-bits");
    let mut draw = Draw(test_seed());
    let seed = draw.next();
    let rows = draw.range(2000, 6000);
    let cols = draw.range(30, 60);
    let chunk = rows.div_ceil(draw.range(4, 9));
    let dist = ["normal", "uniform"][draw.range(0, 1) as usize];
    let mut args = strings(&[
        "rsvd",
        "--rows",
        &rows.to_string(),
        "--cols",
        &cols.to_string(),
        "--chunk-rows",
        &chunk.to_string(),
        "--seed",
        &seed.to_string(),
        "--dist",
        dist,
    ]);
    let (sketch, options) = sketch_args(&mut draw, cols);
    args.extend(sketch);
    eprintln!("{args:?}");
    let (reference, out) =
        same_bits_everywhere(&dir, &args, &["singular_values"], &["S", "U", "Vt"]);
    let (_, u) = read_f64_array(&out, "U").unwrap();
    assert_eq!(u.len() as u64, rows * options.k as u64);

    // The library, in process, with the same problem and options: the same bits.
    let problem =
        RsvdProblem::generated(rows, cols, chunk, seed, dist.parse::<Dist>().unwrap()).unwrap();
    let rt = rankwise::embedded(&RuntimeConfig {
        pin: false,
        ..Default::default()
    })
    .unwrap();
    let r = rsvd(&rt, &problem, &options, None).unwrap();
    let s: Vec<u64> = r.s.iter().map(|x| x.to_bits()).collect();
    assert_eq!(
        s,
        group_bits(&out, &["S"])["S"].1,
        "the CLI's S differs from the library's"
    );
    assert_eq!(reference["options"]["k"].as_u64(), Some(options.k as u64));
    assert_eq!(reference["passes"].as_u64(), Some(r.passes as u64));
    let fused: Vec<_> = r.projections.iter().map(|p| Some(p.fused)).collect();
    let printed: Vec<_> = reference["projections"]
        .as_array()
        .expect("projections listed")
        .iter()
        .map(|p| p["fused"].as_bool())
        .collect();
    assert_eq!(printed, fused);
    assert_eq!(
        r.projections.iter().any(|p| p.condition.is_some()),
        options.projection == Projection::Fused,
        "{:?}",
        r.projections
    );
}

fn pca_args(draw: &mut Draw) -> (Vec<String>, u64, u64, u64, f64, u64, RsvdOptions) {
    let seed = draw.next();
    let rows = draw.range(2000, 6000);
    let cols = draw.range(20, 60);
    let chunk = rows.div_ceil(draw.range(4, 9));
    let missing = (draw.range(0, 200) as f64) / 1000.0;
    let mut args = strings(&[
        "pca",
        "--rows",
        &rows.to_string(),
        "--cols",
        &cols.to_string(),
        "--chunk-rows",
        &chunk.to_string(),
        "--seed",
        &seed.to_string(),
        "--missing",
        &missing.to_string(),
    ]);
    let (sketch, options) = sketch_args(draw, cols);
    args.extend(sketch);
    (args, rows, cols, chunk, missing, seed, options)
}

#[test]
fn pca_under_mpirun_matches_the_embedded_run_bit_for_bit() {
    let dir = scratch("pca-cli-bits");
    let mut draw = Draw(test_seed());
    let (mut args, rows, cols, chunk, missing, seed, options) = pca_args(&mut draw);
    // Half the draws exclude variants for their frequency and missing calls.
    let filter = if draw.range(0, 1) == 1 {
        let min_maf = draw.range(1, 150) as f64 / 1000.0;
        let how = [HweP::Exact, HweP::MidP][draw.range(0, 1) as usize];
        VariantFilter::new(min_maf, draw.range(20, 250) as f64 / 1000.0)
            .and_then(|f| f.with_hwe(draw.range(0, 100) as f64 / 1000.0, how))
            .unwrap()
    } else {
        VariantFilter::NONE
    };
    args.extend(strings(&[
        "--maf",
        &filter.min_maf.to_string(),
        "--geno",
        &filter.max_missing.to_string(),
        "--hwe",
        &filter.min_hwe_p.to_string(),
    ]));
    if filter.hwe == HweP::MidP {
        args.push("midp".into());
    }
    eprintln!("{args:?}");
    let (reference, out) = same_bits_everywhere(
        &dir,
        &args,
        &["singular_values", "eigenvalues", "explained_variance_ratio"],
        &["S", "U", "Vt", "eigenvalues", "explained_variance_ratio"],
    );
    // The library on the same genotypes.
    let g = Generated::new(rows, cols, seed, Dist::Genotype).with_missing(missing);
    let problem = RsvdProblem::genotypes(Arc::new(g.clone()), chunk)
        .unwrap()
        .with_variant_filter(filter.clone());
    let rt = rankwise::embedded(&RuntimeConfig {
        pin: false,
        ..Default::default()
    })
    .unwrap();
    let r = rsvd(&rt, &problem, &options, None).unwrap();
    let s: Vec<u64> = r.s.iter().map(|x| x.to_bits()).collect();
    assert_eq!(
        s,
        group_bits(&out, &["S"])["S"].1,
        "the CLI's S differs from the library's"
    );
    let gs = r.genotypes.unwrap();
    assert_eq!(
        reference["genotypes"]["variants_dropped"].as_u64(),
        Some(gs.variants_dropped)
    );
    assert_eq!(
        reference["genotypes"]["missing_calls"].as_u64(),
        Some(gs.missing_calls)
    );
    // The filter's rule, counted here from the generator's calls: minor allele frequency
    // below --maf, a missing fraction above --geno, or a Hardy–Weinberg p-value below --hwe.
    let excluded = (0..rows)
        .filter(|&i| {
            let calls: Vec<i8> = (0..cols).map(|j| g.genotype(i, j)).collect();
            let missing = calls.iter().filter(|&&v| v < 0).count() as f64;
            let called = cols as f64 - missing;
            let alt: f64 = calls.iter().filter(|&&v| v >= 0).map(|&v| v as f64).sum();
            let maf = alt.min(2.0 * called - alt) / (2.0 * called);
            let count = |d| calls.iter().filter(|&&v| v == d).count() as u64;
            let hwe = hwe_p([count(0), count(1), count(2)], filter.hwe);
            missing / cols as f64 > filter.max_missing
                || (filter.min_maf > 0.0 && (called == 0.0 || maf < filter.min_maf))
                || hwe < filter.min_hwe_p
        })
        .count() as u64;
    assert_eq!(gs.variants_filtered, excluded, "{filter:?}");
    assert_eq!(
        reference["genotypes"]["variants_filtered"].as_u64(),
        Some(excluded)
    );
    // PLINK's eigenvalues: σ² over the variants the filter kept.
    let kept = (rows - excluded).max(1) as f64;
    let eigenvalues = json_floats(&reference["eigenvalues"]);
    assert_eq!(eigenvalues.len(), r.s.len(), "eigenvalues and σ");
    for (e, s) in eigenvalues.iter().zip(&r.s) {
        assert!(
            (e - s * s / kept).abs() <= 1e-12 * e,
            "eigenvalue {e}, σ {s}"
        );
    }
}

/// The plot at `path` decodes to the 800 × 600 image `rankwise pca` draws, with its
/// `n` points: a white background, several colours, and coloured (neither white, grey nor
/// black) pixels, several per point, spread over most of the plot.
fn assert_plot_drawn(path: &std::path::Path, n: usize) {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap_or_else(|e| panic!("{}: not a PNG: {e}", path.display()));
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    // Panels of 600 × 560: PC1/PC2, PC3/PC4 from k = 4, and the scree from k = 2.
    assert!(
        info.height == 560 && [600, 1200, 1800].contains(&info.width),
        "{}: {} × {}",
        path.display(),
        info.width,
        info.height
    );
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let step = match info.color_type {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("{}: colour type {other:?}", path.display()),
    };
    let w = info.width as usize;
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks_exact(step).collect();
    let distinct: std::collections::BTreeSet<&[u8]> = pixels.iter().map(|p| &p[..3]).collect();
    assert!(
        distinct.len() >= 4,
        "{}: {} colours",
        path.display(),
        distinct.len()
    );
    let white = pixels.iter().filter(|p| p[..3] == [255, 255, 255]).count();
    assert!(
        white > pixels.len() / 2,
        "{}: {white} white pixels",
        path.display()
    );
    let coloured: Vec<(usize, usize)> = pixels
        .iter()
        .enumerate()
        .filter(|(_, p)| p[..3].iter().max().unwrap() - p[..3].iter().min().unwrap() >= 100)
        .map(|(i, _)| (i % w, i / w))
        .collect();
    // A point is a filled circle of radius 3 (about 29 pixels); points may overlap.
    assert!(
        coloured.len() >= 5 * n.min(40),
        "{}: {} coloured pixels for {n} points",
        path.display(),
        coloured.len()
    );
    let span = |f: fn(&(usize, usize)) -> usize| {
        coloured.iter().map(f).max().unwrap() - coloured.iter().map(f).min().unwrap()
    };
    let (dx, dy) = (span(|p| p.0), span(|p| p.1));
    // Across half a panel's width at least (the scatter panels are 600 pixels wide).
    assert!(
        dx >= 300 && dy >= 560 / 3,
        "{}: points span only {dx} × {dy} pixels",
        path.display()
    );
}

#[test]
fn pca_writes_plink_files_and_a_plot_and_never_overwrites() {
    let dir = scratch("pca-cli-files");
    let mut draw = Draw(test_seed());
    let (args, _, cols, _, _, _, options) = pca_args(&mut draw);
    let k = options.k;
    let n = cols as usize;
    let out = dir.join("pcs.zarr");
    let mut a = args.clone();
    a.extend(strings(&[
        "--json",
        "--local-ranks",
        "2",
        "--out",
        out.to_str().unwrap(),
    ]));
    eprintln!("{a:?}");
    let rep = report(&embedded(&a));

    let (vshape, vt) = read_f64_array(&out, "Vt").unwrap();
    assert_eq!(vshape, vec![k as u64, cols]);
    let (_, s) = read_f64_array(&out, "S").unwrap();
    let (eshape, eigenvalues) = read_f64_array(&out, "eigenvalues").unwrap();
    assert_eq!(eshape, vec![k as u64]);
    let (_, explained) = read_f64_array(&out, "explained_variance_ratio").unwrap();
    // PLINK's scale: every variant given, monomorphic ones too.
    let m = rep["genotypes"]["variants"].as_f64().unwrap();
    let tss = rep["total_sum_squares"].as_f64().unwrap();
    for j in 0..k {
        let want = s[j] * s[j] / m;
        assert!(
            (eigenvalues[j] - want).abs() <= 1e-14 * want,
            "eigenvalue {}",
            j + 1
        );
        let want = s[j] * s[j] / tss;
        assert!(
            (explained[j] - want).abs() <= 1e-12 * want,
            "explained {}",
            j + 1
        );
    }
    assert!(explained.iter().sum::<f64>() <= 1.0 + 1e-12);

    // .eigenvec: a header and one line per sample, the sample's column of Vᵀ exactly.
    let eigenvec = std::fs::read_to_string(out.with_extension("eigenvec")).unwrap();
    let mut lines = eigenvec.lines();
    let header: Vec<String> = std::iter::once("#IID".to_string())
        .chain((1..=k).map(|j| format!("PC{j}")))
        .collect();
    assert_eq!(lines.next(), Some(header.join("\t").as_str()));
    let body: Vec<&str> = lines.collect();
    assert_eq!(body.len(), n, ".eigenvec lines");
    for (i, line) in body.iter().enumerate() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), k + 1, "{line}");
        assert_eq!(fields[0], format!("sample_{i}"));
        for j in 0..k {
            let v: f64 = fields[j + 1].parse().unwrap();
            assert_eq!(
                v.to_bits(),
                vt[j * n + i].to_bits(),
                ".eigenvec sample {i} PC{}: {v} vs Vt {}",
                j + 1,
                vt[j * n + i]
            );
        }
    }
    // .eigenval: one eigenvalue per line.
    let eigenval = std::fs::read_to_string(out.with_extension("eigenval")).unwrap();
    let vals: Vec<f64> = eigenval
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(vals.len(), k);
    for j in 0..k {
        assert_eq!(
            vals[j].to_bits(),
            eigenvalues[j].to_bits(),
            "eigenval {}",
            j + 1
        );
    }
    assert_plot_drawn(&out.with_extension("png"), n);

    // Again onto the same --out: refused, naming the path, touching nothing.
    let before = snapshot(&dir);
    let mut again = args.clone();
    again.extend(strings(&["--out", out.to_str().unwrap()]));
    let run = embedded(&again);
    run.assert_finished();
    assert_ne!(run.code, Some(0), "overwrote\n{}", run.describe());
    let named = [
        out.clone(),
        out.with_extension("eigenvec"),
        out.with_extension("eigenval"),
        out.with_extension("png"),
    ];
    assert!(
        run.stderr.contains("--out")
            && named
                .iter()
                .any(|p| run.stderr.contains(p.to_str().unwrap())),
        "stderr does not name the path: {}",
        run.stderr
    );
    assert_eq!(snapshot(&dir), before, "the refused run changed files");

    // Only a side file exists: refused before the group is created, the file untouched.
    let other = dir.join("other.zarr");
    std::fs::write(other.with_extension("eigenval"), "keep\n").unwrap();
    // Only the group exists.
    let third = dir.join("third.zarr");
    std::fs::create_dir(&third).unwrap();
    let before = snapshot(&dir);
    for (o, named) in [
        (&other, other.with_extension("eigenval")),
        (&third, third.clone()),
    ] {
        let mut a = args.clone();
        a.extend(strings(&["--out", o.to_str().unwrap()]));
        let run = embedded(&a);
        run.assert_finished();
        assert_ne!(run.code, Some(0), "{}", run.describe());
        assert!(
            run.stderr.contains("--out") && run.stderr.contains(named.to_str().unwrap()),
            "stderr does not name {}: {}",
            named.display(),
            run.stderr
        );
        assert_eq!(
            snapshot(&dir),
            before,
            "refused run onto {} changed files",
            o.display()
        );
    }
}

#[test]
fn bad_input_fails_on_every_rank_and_leaves_nothing() {
    let dir = scratch("rsvd-cli-bad");
    let mut draw = Draw(test_seed());
    let cols = draw.range(20, 40);
    let c = cols.to_string();
    let out = dir.join("x.zarr");
    let o = out.to_str().unwrap().to_string();
    let rsvd = |extra: &[&str]| {
        let mut a = strings(&[
            "rsvd",
            "--rows",
            "3000",
            "--cols",
            &c,
            "--chunk-rows",
            "700",
        ]);
        a.extend(strings(extra));
        a.extend(strings(&["--out", &o]));
        a
    };
    let pca = |extra: &[&str]| {
        let mut a = strings(&["pca", "--rows", "2000", "--cols", &c, "--chunk-rows", "500"]);
        a.extend(strings(extra));
        a.extend(strings(&["--out", &o]));
        a
    };
    let big = (cols - 5).to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (rsvd(&["-k", "0"]), "-k"),
        (rsvd(&["-k", &c]), "-k"),
        (pca(&["-k", &c, "--oversample", "0"]), "-k"),
        (rsvd(&["-k", "10", "--oversample", &big]), "--oversample"),
        (pca(&["-k", "10", "--oversample", &big]), "--oversample"),
        (
            pca(&[
                "-k",
                "5",
                "--oversample",
                "5",
                "--power-iters",
                "4",
                "--method",
                "block-krylov",
            ]),
            "--power-iters",
        ),
        (pca(&["--missing", "1.5"]), "--missing"),
        (pca(&["--missing=-0.1"]), "--missing"),
        (pca(&["--maf", "0.7"]), "--maf"),
        (pca(&["--geno=-0.5"]), "--geno"),
        (pca(&["--hwe", "2"]), "--hwe"),
        (pca(&["--hwe", "0.01", "mid-p"]), "--hwe"),
        // A generated matrix has no variant IDs; a list that is not there.
        (pca(&["--extract", "Cargo.toml"]), "--extract"),
        (pca(&["--exclude", "no/such/list"]), "--exclude"),
        (pca(&["--keep", "Cargo.toml"]), "--keep"),
        // Nor chromosomes; a list PLINK would refuse too.
        (pca(&["--autosome"]), "--autosome"),
        (pca(&["--not-chr", "1-X"]), "--not-chr"),
        // Every variant excluded: no PCA is left to make.
        (pca(&["--missing", "0.9", "--geno", "0"]), "--geno 0"),
    ];
    // Under mpirun a failing rank lingers a few seconds for its peers: run them side by side.
    let t = Instant::now();
    let handles: Vec<_> = cases
        .iter()
        .map(|(args, _)| {
            let args = args.clone();
            std::thread::spawn(move || under_mpirun(2, &args))
        })
        .collect();
    for ((args, option), h) in cases.iter().zip(handles) {
        assert_fails_naming(&embedded(args), args, option);
        assert_both_ranks_name(&h.join().unwrap(), args, option);
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
    eprintln!(
        "{} cases under mpirun -np 2: {:.2} s",
        cases.len(),
        t.elapsed().as_secs_f64()
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Progress on stderr: rank 0 alone shows it, once a run has taken a second, in a log
/// file a line every 10 s from then; `--quiet` shows none.
#[test]
fn rank_zero_shows_progress_on_stderr_unless_quiet() {
    let args = [
        "rsvd",
        "--rows",
        "100000",
        "--cols",
        "400",
        "--chunk-rows",
        "10000",
        "-k",
        "20",
        "--max-passes",
        "30",
        "--tol",
        "1e-15",
    ];
    let lines = |run: &RunOutput| {
        run.stderr
            .lines()
            .filter(|l| l.starts_with("rankwise rsvd k = 20: pass "))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for np in [1usize, 2] {
        for quiet in [false, true] {
            let mut all: Vec<&str> = args.to_vec();
            if quiet {
                all.push("--quiet");
            }
            let t = Instant::now();
            let run = if np == 1 {
                embedded(&strings(&all))
            } else {
                mpirun::mpirun(np, &rankwise_bin(), &all, CLI_LIMIT)
            };
            let seconds = t.elapsed().as_secs_f64();
            run.assert_success();
            // The run must outlast the display's first second, or this shows nothing.
            assert!(seconds > 1.5, "the run took {seconds:.2} s: make it larger");
            let shown = lines(&run);
            let what = format!("np {np}, quiet {quiet}, {seconds:.1} s\n{}", run.describe());
            if quiet {
                assert!(shown.is_empty(), "{what}");
                continue;
            }
            let most = 1 + (seconds / 10.0) as usize;
            assert!(!shown.is_empty() && shown.len() <= most, "{what}");
            assert!(shown[0].contains("(of at most 30)"), "{what}");
            assert!(shown[0].contains(" | generated 100000 × 400"), "{what}");
        }
    }
}

/// `pca --groups FILE` colours the plot by the file's groups; a file that names none of
/// the samples is an error naming the option, with nothing written.
#[test]
fn pca_groups_come_from_a_file_or_fail_naming_it() {
    let dir = scratch("pca-groups");
    let n = 120;
    let groups = dir.join("groups.txt");
    let lines: String = (0..n)
        .map(|j| format!("sample_{j} {}\n", ["AFR", "EUR", "EAS"][j % 3]))
        .collect();
    std::fs::write(&groups, format!("#IID GROUP\n{lines}")).unwrap();
    let pca = |file: &Path, out: &Path| {
        embedded(&strings(&[
            "pca",
            "--rows",
            "3000",
            "--cols",
            &n.to_string(),
            "--chunk-rows",
            "1000",
            "-k",
            "4",
            "--groups",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]))
    };
    let out = dir.join("g.zarr");
    pca(&groups, &out).assert_success();
    assert_plot_drawn(&out.with_extension("png"), n);
    let nobody = dir.join("nobody.txt");
    std::fs::write(&nobody, "someone_else AFR\n").unwrap();
    let out = dir.join("n.zarr");
    let run = pca(&nobody, &out);
    assert!(!run.success(), "{}", run.describe());
    assert!(
        run.stderr.contains("--groups") && run.stderr.contains("names none of the 120 samples"),
        "{}",
        run.describe()
    );
    assert!(!out.exists() && !out.with_extension("png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--plan` prints the plan of an rsvd or a PCA and stops: nothing read, nothing written,
/// the same plan under mpirun as embedded.
#[test]
fn plan_shows_the_plan_and_runs_nothing() {
    let dir = scratch("rsvd-plan");
    let out = dir.join("never.zarr");
    let args = |command: &str| {
        strings(&[
            command,
            "--rows",
            "40000",
            "--cols",
            "300",
            "--chunk-rows",
            "5000",
            "-k",
            "6",
            "--plan",
            "--out",
            out.to_str().unwrap(),
        ])
    };
    for command in ["rsvd", "pca"] {
        let run = embedded(&args(command));
        run.assert_success();
        let text = &run.stdout;
        assert!(
            text.starts_with(&format!("rankwise {command} plan: generated 40000 × 300")),
            "{text}"
        );
        assert!(
            text.contains("grid: 40000 × 300 in 8 panels of 5000 rows"),
            "{text}"
        );
        assert!(text.contains("k = 6, sketch 16 columns"), "{text}");
        assert!(!out.exists(), "--plan wrote {}", out.display());
        let mut json = args(command);
        json.push("--json".into());
        let plan = report(&embedded(&json));
        assert_eq!(plan["grid"]["chunk_rows"], 5000, "{plan}");
        let a: Vec<&str> = json.iter().map(String::as_str).collect();
        let two = mpirun::mpirun(2, &rankwise_bin(), &a, CLI_LIMIT);
        two.assert_success();
        let two: Value = serde_json::from_str(&two.stdout).unwrap();
        assert_eq!(two["ranks"], 2, "{two}");
        assert_eq!(two["placement"]["owner"].as_array().unwrap().len(), 8);
    }
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
