//! GPU actors.
//!
//! Everywhere (`make test`): the CUDA probe and `rankwise info` never panic and name every
//! library; `--device gpu` without CUDA fails with a message naming the missing library, on
//! one rank and on both ranks of `mpirun -np 2`, without hanging; `--device auto` runs on
//! CPU; the projections' sums cross ranks through the transport, saying why not through
//! NCCL, where some rank has no GPU actor; the device kernels compile with
//! NVRTC installed from PyPI (a compiler library: no GPU needed); and `benches/gpu.sh`, the
//! GPU machine's script, runs every step on CPU actors, keeps to its deadline and timeouts,
//! counts skipped tests apart from passed ones, and summarizes what ran. Where no `mpirun`
//! is installed (GPU node images, bundles), the two-rank parts skip, saying so.
//!
//! A test that skips all of its checks prints `SKIPPED: TEST: why`, one that skips a part
//! `PART SKIPPED: TEST (part): why`, each at the start of a line on stdout: `benches/gpu.sh`
//! counts those as skipped (or passed with a part skipped), not as passed. Three tests skip
//! by design on a machine with a usable GPU (the two `*_without_cuda_*` tests and, under
//! `benches/gpu.sh`, the script's own check), and with one GPU the two-rank NCCL part only
//! shows that NCCL was declined, so it reports itself as a part skipped.
//!
//! On a machine with a GPU (`make test-gpu`, which sets `RANKWISE_REQUIRE_GPU=1` so that a
//! missing GPU fails instead of skipping):
//! - the device generator gives the host generator's values;
//! - `rsvd`, `pca` and `svd` on GPU actors agree with CPU actors on the same seed and grid
//!   (σ, and for `rsvd` and `pca` the singular subspaces: U's columns and Vᵀ's rows);
//! - Zarr stores staged to the device through pinned buffers agree with host reads;
//! - the default, convergence-controlled PCA converges on GPU actors as on CPU actors, to
//!   the same eigenvalues and PCs;
//! - Blosc chunks decoded on the device (nvCOMP and the unshuffle kernels) are the host's
//!   decode, bit for bit, and other compressors are refused for the host to decode;
//! - NCCL sums agree with the transport's;
//! - cuSOLVER's panel QR agrees with LAPACK's;
//! - a GPU run repeats bit for bit.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::mpirun::run_with_timeout;
use common::*;
use ndarray::Array2;
use rankwise::device::{probed, GpuDevice};
use rankwise::linalg::internals::gpu::{produce_rows, DeviceSource};
use rankwise::linalg::{Operand, VariantFilter};
use rankwise::sources::{Dist, Generated, GenotypeSource, PanelSource};

/// Says that `test` checked nothing on this machine, and why (`benches/gpu.sh` counts it as
/// skipped, not passed).
fn skipped(test: &str, why: &str) {
    println!("SKIPPED: {test}: {why}");
}

/// Says that `test` left `part` of its checks out on this machine, and why.
fn part_skipped(test: &str, part: &str, why: &str) {
    println!("PART SKIPPED: {test} ({part}): {why}");
}

/// Whether this machine can run the GPU passes; prints why not (or fails under
/// `RANKWISE_REQUIRE_GPU=1`).
fn gpu_or_skip(test: &str) -> Option<Arc<GpuDevice>> {
    let libs = probed();
    let why = match libs.usable() {
        Err(e) => e.to_string(),
        Ok(()) if libs.devices.is_empty() => "no CUDA device visible".into(),
        Ok(()) => match GpuDevice::open(0, libs) {
            Ok(d) => return Some(Arc::new(d)),
            Err(e) => e.to_string(),
        },
    };
    assert!(
        std::env::var("RANKWISE_REQUIRE_GPU").as_deref() != Ok("1"),
        "{test}: RANKWISE_REQUIRE_GPU=1 but no usable GPU: {why}"
    );
    skipped(test, &why);
    None
}

/// `Err(why not)` where no Open MPI launcher is installed (GPU node images and bundles
/// carry none).
fn mpirun_available() -> Result<(), String> {
    let mpirun = std::env::var("RANKWISE_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    match Command::new(&mpirun).arg("--version").output() {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("no {mpirun} ({e})")),
    }
}

fn gpu_usable() -> bool {
    let libs = probed();
    libs.usable().is_ok() && !libs.devices.is_empty()
}

#[test]
fn info_names_every_cuda_library() {
    let run = embedded(&strings(&["info"]));
    run.assert_success();
    for lib in [
        "cuda", "nvrtc", "cublas", "cublasLt", "cusolver", "nccl", "nvcomp",
    ] {
        assert!(
            run.stdout.contains(&format!("  {lib:<9} found: "))
                || run.stdout.contains(&format!("  {lib:<9} not found (")),
            "info says nothing of {lib}:\n{}",
            run.stdout
        );
    }
    assert!(run.stdout.contains("GPU actors: "), "{}", run.stdout);
}

#[test]
fn device_gpu_without_cuda_fails_naming_the_library_on_every_rank() {
    const TEST: &str = "device_gpu_without_cuda_fails_naming_the_library_on_every_rank";
    if gpu_usable() {
        skipped(TEST, "this machine has a usable GPU");
        return;
    }
    // The library names the parameter (`device`); the command line names its flag.
    let why = probed().usable().err().map(|e| {
        let e = e.to_string();
        assert!(!e.contains("--"), "a library error names no flag: {e}");
        e.replace("`device`", "--device")
    });
    let args = strings(&[
        "rsvd",
        "--rows",
        "2000",
        "--cols",
        "50",
        "--chunk-rows",
        "500",
        "-k",
        "3",
        "--device",
        "gpu",
    ]);
    let run = embedded(&args);
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(
        run.stderr.contains("rankwise: rank 0 failed: ") && run.stderr.contains("--device"),
        "{}",
        run.describe()
    );
    if let Some(why) = &why {
        assert!(run.stderr.contains(why.as_str()), "{}", run.describe());
        assert!(run.stderr.contains("library"), "{}", run.describe());
    }
    if let Err(why) = mpirun_available() {
        part_skipped(TEST, "two ranks", &why);
        return;
    }
    let run = under_mpirun(2, &args);
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{}", run.describe());
    let failures = run.stderr.matches(" failed: ").count();
    assert!(failures >= 2, "both ranks must report:\n{}", run.describe());
}

#[test]
fn device_auto_without_cuda_runs_on_cpu_actors() {
    if gpu_usable() {
        skipped(
            "device_auto_without_cuda_runs_on_cpu_actors",
            "this machine has a usable GPU",
        );
        return;
    }
    let common = [
        "rsvd",
        "--rows",
        "3000",
        "--cols",
        "40",
        "--chunk-rows",
        "500",
        "-k",
        "4",
        "--json",
    ];
    let auto = report(&embedded(&strings(
        &[&common[..], &["--device", "auto"]].concat(),
    )));
    let cpu = report(&embedded(&strings(
        &[&common[..], &["--device", "cpu"]].concat(),
    )));
    assert_eq!(
        json_bits(&auto["singular_values"]),
        json_bits(&cpu["singular_values"])
    );
    let actors = &auto["per_rank"][0]["actors"];
    assert!(
        actors
            .as_array()
            .is_some_and(|a| !a.is_empty() && !on_gpu_actor(&auto)),
        "{actors}"
    );
}

/// The kernels compile, through `rankwise info --check-kernels`: for Hopper (sm_90) with the
/// NVRTC of PyPI's nvidia-cuda-nvrtc (scripts/nvrtc-venv.sh); where the machine has an NVRTC
/// of its own (a GPU node, which may have no network and no checkout to make the virtualenv
/// from), with that one, for the visible devices' architectures.
#[test]
fn kernels_compile_with_nvrtc_from_pypi() {
    let mut cmd = Command::new(rankwise_bin());
    cmd.args(["info", "--check-kernels"]);
    if let Some(own) = probed().find("nvrtc") {
        let own = own.found.as_deref().unwrap_or("libnvrtc");
        println!("kernels_compile_with_nvrtc_from_pypi: with this machine's {own}");
    } else {
        let venv = rankwise_bin()
            .ancestors()
            .nth(2)
            .expect("target dir")
            .join("nvrtc-venv");
        let libdir = repo_script("nvrtc-venv.sh", &[venv.as_os_str()])
            .trim()
            .to_string();
        cmd.env("LD_LIBRARY_PATH", &libdir);
    }
    let run = run_with_timeout(cmd, CLI_LIMIT);
    run.assert_success();
    assert!(
        run.stdout.contains("  nvrtc     found: libnvrtc.so"),
        "{}",
        run.stdout
    );
    // nvCOMP from PyPI (where the machine has none of its own) loads with every function
    // the device decode calls (else its line says what is missing).
    if probed().find("nvcomp").is_none() {
        let line = (run.stdout.lines())
            .find(|l| l.starts_with("  nvcomp "))
            .unwrap_or_default();
        assert!(
            line.contains("found: libnvcomp.so.6") && !line.contains("not loaded"),
            "{}",
            run.stdout
        );
    }
    let compiled = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("kernels: compiled for sm_"))
        .count();
    assert!(compiled >= 1, "{}", run.stdout);
    // Without NVRTC the check names the library instead.
    if probed().find("nvrtc").is_none() {
        let run = embedded(&strings(&["info", "--check-kernels"]));
        run.assert_finished();
        assert_eq!(run.code, Some(1), "{}", run.describe());
        assert!(
            run.stderr
                .contains("--check-kernels needs the nvrtc library"),
            "{}",
            run.describe()
        );
    }
}

#[test]
fn device_generator_gives_the_host_values() {
    let Some(dev) = gpu_or_skip("device_generator_gives_the_host_values") else {
        return;
    };
    let mut rng = Draw(test_seed());
    for _ in 0..4 {
        let m = rng.range(100, 5000);
        let n = rng.range(1, 3000);
        let seed = rng.next();
        let r0 = rng.range(0, m / 2);
        let r1 = rng.range(r0 + 1, m);
        // Uniform: bit for bit, f64 and f32.
        let g = Generated::new(m, n, seed, Dist::Uniform);
        let src = DeviceSource::of(&Operand::Dense(Arc::new(g.clone()))).expect("uniform");
        let (dev64, _) = produce_rows::<f64>(&dev, &src, r0..r1, n as usize).unwrap();
        let mut host = Array2::<f64>::zeros(dev64.dim());
        PanelSource::fill(&g, r0..r1, host.view_mut()).unwrap();
        assert_eq!(bits(&dev64), bits(&host), "uniform f64 {m}×{n} seed {seed}");
        let (dev32, _) = produce_rows::<f32>(&dev, &src, r0..r1, n as usize).unwrap();
        let mut host32 = Array2::<f32>::zeros(dev32.dim());
        g.fill_cols_f32(r0..r1, 0..n, host32.view_mut()).unwrap();
        assert_eq!(dev32, host32, "uniform f32 {m}×{n} seed {seed}");
        // Genotypes with population structure and missing calls: the device's
        // standardized values equal the host's standardization of the host's dosages.
        let pops = rng.range(1, 4).min(n);
        let g = Generated::new(m, n, seed, Dist::Genotype)
            .with_populations(pops, 0.1)
            .unwrap()
            .with_missing(0.05);
        let src = DeviceSource::of(&Operand::Genotypes(
            Arc::new(g.clone()),
            VariantFilter::NONE,
        ))
        .expect("genotypes");
        let (dev64, facts) = produce_rows::<f64>(&dev, &src, r0..r1, n as usize).unwrap();
        let mut dosages = Array2::<i8>::zeros(((r1 - r0) as usize, n as usize));
        g.fill_dosages(r0..r1, dosages.view_mut()).unwrap();
        let mut missing = 0;
        for (i, row) in dosages.rows().into_iter().enumerate() {
            let (scale, counts) =
                rankwise::linalg::internals::tiles::row_scale(row.as_slice().unwrap())
                    .expect("generated dosages are valid");
            missing += counts.missing;
            let t = scale.table();
            for (j, &d) in row.iter().enumerate() {
                let want = t[if d < 0 { 3 } else { d as usize }];
                assert_eq!(
                    dev64[[i, j]].to_bits(),
                    want.to_bits(),
                    "genotype ({}, {j}) of {m}×{n}, seed {seed}, {pops} populations",
                    r0 + i as u64
                );
            }
        }
        assert_eq!(facts.missing, missing);
    }
}

fn bits(a: &Array2<f64>) -> Vec<u64> {
    a.iter().map(|x| x.to_bits()).collect()
}

/// Whether rank 0 of a report ran on a GPU actor (its actors are listed per rank; the
/// report's top-level `actors` is their count).
fn on_gpu_actor(report: &serde_json::Value) -> bool {
    report["per_rank"][0]["actors"].as_array().is_some_and(|a| {
        a.iter()
            .any(|x| x.as_str().is_some_and(|x| x.starts_with("gpu ")))
    })
}

fn singular_values(args: &[&str], device: &str) -> (Vec<f64>, serde_json::Value) {
    let mut all = args.to_vec();
    all.extend(["--json", "--device", device]);
    let r = report(&embedded(&strings(&all)));
    (json_floats(&r["singular_values"]), r)
}

/// `rankwise ARGS --device DEVICE --out DIR`: the singular values and the report; the
/// factors are in the group DIR.
fn factors_out(
    args: &[&str],
    device: &str,
    out: &std::path::Path,
) -> (Vec<f64>, serde_json::Value) {
    let out = out.to_str().expect("a UTF-8 scratch path");
    singular_values(&[args, &["--out", out]].concat(), device)
}

/// The singular vectors of output group `name` ("U": columns, "Vt": rows) as the columns
/// of a matrix.
fn vectors(group: &std::path::Path, name: &str) -> Array2<f64> {
    let (shape, v) = rankwise::output::read_f64_array(group, name)
        .unwrap_or_else(|e| panic!("{}: {name}: {e}", group.display()));
    let a = Array2::from_shape_vec((shape[0] as usize, shape[1] as usize), v).unwrap();
    if name == "Vt" {
        a.t().to_owned()
    } else {
        a
    }
}

/// How far the span of `b`'s orthonormal columns is from the span of `a`'s:
/// ‖B − A(AᵀB)‖_F, between sin θ_max and √k·sin θ_max of the largest principal angle
/// (accurate for small angles, where 1 − cos² θ would round away).
fn subspace_distance(a: &Array2<f64>, b: &Array2<f64>) -> f64 {
    assert_eq!(a.dim(), b.dim());
    let residual = b - &a.dot(&a.t().dot(b));
    residual.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// The GPU's singular subspaces (U's columns, Vᵀ's rows) against the CPU's.
fn assert_same_subspaces(gpu: &std::path::Path, cpu: &std::path::Path, tol: f64, what: &str) {
    for name in ["U", "Vt"] {
        let d = subspace_distance(&vectors(cpu, name), &vectors(gpu, name));
        println!("{what}: {name}: subspace distance GPU to CPU {d:.2e}");
        assert!(
            d <= tol,
            "{what}: the GPU's {name} spans another subspace than the CPU's: ‖B − A·AᵀB‖_F = {d:e} > {tol:e}"
        );
    }
}

fn assert_close(gpu: &[f64], cpu: &[f64], rel: f64, what: &str) {
    assert_eq!(gpu.len(), cpu.len());
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert!(
            (g - c).abs() <= rel * cpu[0].abs(),
            "{what}: σ{} GPU {g} CPU {c} (tolerance {rel} of σ₁)",
            i + 1
        );
    }
}

/// `rsvd` and `pca` on a GPU actor against CPU actors, same seed and grid: σ within 1e-10 of
/// σ₁ (f64) or 1e-5 (f32), and the same singular subspaces (U and Vᵀ, f64).
/// `calibrate --device gpu` measures per-GPU rates (every pass's rate positive, producing
/// held in the passes), and `plan --gpus-per-node` divides a pass's values among the GPUs:
/// twice the GPUs, half the passes' compute.
#[test]
fn calibrating_gpu_actors_gives_per_gpu_rates_for_plan() {
    if gpu_or_skip("calibrating_gpu_actors_gives_per_gpu_rates_for_plan").is_none() {
        return;
    }
    let dir = scratch("gpu-calibrate");
    std::fs::create_dir_all(&dir).unwrap();
    let rates = dir.join("gpu-rates.json");
    let rates_s = rates.to_str().unwrap();
    let cmd = [
        "calibrate",
        "--device",
        "gpu",
        "--values",
        "16777216",
        "--out",
        rates_s,
        "-q",
    ];
    embedded(&strings(&cmd)).assert_success();
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&rates).unwrap()).unwrap();
    assert_eq!(r["unit"], "gpu", "{r}");
    // One GPU actor per GPU: the rates are per GPU, and say which.
    assert!(r["cores"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["machine"].as_str().unwrap().contains("GPU"), "{r}");
    for kind in ["dense", "genotypes", "dense_f32", "genotypes_f32"] {
        assert_eq!(r[kind]["produce"], 0.0, "{kind}: {r}");
        let at20 = |pass: &str| {
            r[kind][pass]["per_value"].as_f64().unwrap()
                + 20.0 * r[kind][pass]["per_value_column"].as_f64().unwrap()
        };
        assert!(at20("first") > 0.0 && at20("later") > 0.0, "{kind}: {r}");
    }
    for v in r["svd"].as_array().unwrap() {
        assert!(v["pass1"].as_f64().unwrap() > 0.0, "{v}");
    }
    let plan = |gpus: &str| -> f64 {
        let args = [
            "plan",
            "--rows",
            "4000000",
            "--cols",
            "2000",
            "--chunk-rows",
            "15625",
            "--nodes",
            "2",
            "--ranks-per-node",
            "2",
            "--gpus-per-node",
            gpus,
            "--network",
            "100,2us",
            "--job",
            "pca",
            "--passes",
            "10",
            "--calibration",
            rates_s,
            "--json",
        ];
        let run = embedded(&strings(&args));
        run.assert_success();
        let p: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        p["phases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["phase"].as_str().unwrap().starts_with("pass"))
            .map(|x| x["compute_seconds"].as_f64().unwrap())
            .sum()
    };
    let (two, four) = (plan("2"), plan("4"));
    assert!((two / four - 2.0).abs() < 0.05, "{two} vs {four}");
}

#[test]
fn rsvd_and_pca_on_gpu_actors_agree_with_cpu_actors() {
    if gpu_or_skip("rsvd_and_pca_on_gpu_actors_agree_with_cpu_actors").is_none() {
        return;
    }
    let mut rng = Draw(test_seed());
    let m = rng.range(20_000, 60_000);
    let n = rng.range(200, 2000);
    let seed = rng.next().to_string();
    let (m, n) = (m.to_string(), n.to_string());
    // The same generated matrix and grid for every command, and a fixed number of subspace
    // iterations: the comparisons below are of layouts and tiles, which a fixed iteration
    // keeps to rounding (LOBPCG's f32 passes to `--tol` are converged_pca_on_gpu_actors_…'s).
    let job = |command: &'static str, k: &'static str| {
        vec![
            command,
            "--rows",
            m.as_str(),
            "--cols",
            n.as_str(),
            "--chunk-rows",
            "4096",
            "-k",
            k,
            "--seed",
            seed.as_str(),
            "--power-iters",
            "2",
        ]
    };
    let dir = scratch("gpu-against-cpu");
    let rsvd = job("rsvd", "8");
    let (cpu, _) = factors_out(&rsvd, "cpu", &dir.join("rsvd-cpu"));
    let (gpu, report) = factors_out(&rsvd, "gpu", &dir.join("rsvd-gpu"));
    assert!(on_gpu_actor(&report), "{report}");
    assert_close(&gpu, &cpu, 1e-10, "rsvd f64");
    // Rounding differences, amplified by σ₁ over the gap between σ_k and σ_(k+1): 1e-6 leaves
    // room for that and still catches a wrong layout or a lost tile, which move the subspace
    // by O(1).
    assert_same_subspaces(
        &dir.join("rsvd-gpu"),
        &dir.join("rsvd-cpu"),
        1e-6,
        "rsvd f64",
    );
    // The TSQR's leaves, 18 columns wide, were factored by the host's LAPACK: the panels of
    // Y are in host memory, and cuSOLVER takes them from 512 columns on.
    let qrs = |r: &serde_json::Value| r["per_rank"][0]["gpu_panel_qrs"].as_u64().unwrap_or(0);
    assert_eq!(qrs(&report), 0, "{report}");
    let wide = [
        "rsvd",
        "--rows",
        "9000",
        "--cols",
        "700",
        "--chunk-rows",
        "2048",
        "-k",
        "510",
        "--power-iters",
        "0",
        "--seed",
        seed.as_str(),
    ];
    let (cpu, _) = singular_values(&wide, "cpu");
    let (gpu, report) = singular_values(&wide, "gpu");
    assert_close(&gpu, &cpu, 1e-10, "rsvd -k 510");
    let cusolver = probed().find("cusolver").is_some();
    assert_eq!(qrs(&report) > 0, cusolver, "{report}");
    // Raw dosages (`--dist genotype`, the benchmark's matrix): made on the device from
    // packed codes, not on the actor's CPU cores.
    for (precision, tol) in [("f64", 1e-10), ("f32", 1e-5)] {
        let mut dosages = job("rsvd", "8");
        dosages.extend(["--dist", "genotype"]);
        dosages.extend(["--precision", precision]);
        let (cpu, _) = singular_values(&dosages, "cpu");
        let (gpu, report) = singular_values(&dosages, "gpu");
        let what = format!("rsvd --dist genotype --precision {precision}");
        assert_close(&gpu, &cpu, tol, &what);
        let rank = &report["per_rank"][0];
        assert!(
            rank["gpu_panel_passes"].as_u64() > Some(0),
            "{what}: {report}"
        );
        assert!(rank["gpu_note"].is_null(), "{what}: {report}");
    }
    let mut pca = job("pca", "6");
    pca.extend(["--populations", "3", "--missing", "0.05"]);
    let (cpu, _) = factors_out(&pca, "cpu", &dir.join("pca-cpu"));
    let (gpu, _) = factors_out(&pca, "gpu", &dir.join("pca-gpu"));
    assert_close(&gpu, &cpu, 1e-10, "pca f64");
    assert_same_subspaces(&dir.join("pca-gpu"), &dir.join("pca-cpu"), 1e-6, "pca f64");
    // In f32, with variants excluded by the tables the device's code counts give.
    let mut pca32 = pca.clone();
    pca32.extend([
        "--precision",
        "f32",
        "--maf",
        "0.05",
        "--geno",
        "0.06",
        "--hwe",
        "1e-3",
    ]);
    let (cpu, cpu_report) = singular_values(&pca32, "cpu");
    let (gpu, gpu_report) = singular_values(&pca32, "gpu");
    assert_close(&gpu, &cpu, 1e-5, "pca f32");
    let filtered = |r: &serde_json::Value| r["genotypes"]["variants_filtered"].as_u64();
    assert_eq!(filtered(&gpu_report), filtered(&cpu_report), "pca f32");
    assert!(filtered(&cpu_report) > Some(0), "{cpu_report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The convergence-controlled PCA (the defaults: LOBPCG to `--tol`, the precision chosen
/// by accuracy) on a GPU actor against CPU actors, on a structured cohort whose tail is
/// flat: both converge every component, report residuals at most the tolerance, and return
/// the same eigenvalues and PCs to within what that tolerance leaves (a residual r moves σ
/// by O(r²/gap) and the vectors by O(r/gap); rounding differences between the devices can
/// also change the number of passes by one).
#[test]
fn converged_pca_on_gpu_actors_matches_cpu_actors() {
    if gpu_or_skip("converged_pca_on_gpu_actors_matches_cpu_actors").is_none() {
        return;
    }
    let mut rng = Draw(test_seed());
    let m = rng.range(20_000, 50_000).to_string();
    let n = rng.range(600, 1500).to_string();
    let seed = rng.next().to_string();
    let dir = scratch("gpu-converged");
    let pca = [
        "pca",
        "--rows",
        m.as_str(),
        "--cols",
        n.as_str(),
        "--chunk-rows",
        "4096",
        "-k",
        "10",
        "--populations",
        "3",
        "--missing",
        "0.02",
        "--seed",
        seed.as_str(),
    ];
    let (cpu, cpu_report) = factors_out(&pca, "cpu", &dir.join("cpu"));
    let (gpu, gpu_report) = factors_out(&pca, "gpu", &dir.join("gpu"));
    assert!(on_gpu_actor(&gpu_report), "{gpu_report}");
    for (side, r) in [("CPU", &cpu_report), ("GPU", &gpu_report)] {
        let c = &r["convergence"];
        println!(
            "converged PCA {m} × {n} on {side} actors: {} passes ({}), residuals {}",
            c["history"].as_array().map_or(0, |h| h.len()),
            c["pass_precisions"],
            c["residuals"]
        );
        assert_eq!(r["converged"], true, "{side}: {r}");
        let tol = c["tol"].as_f64().expect("a tolerance");
        for (i, res) in json_floats(&c["residuals"]).iter().enumerate() {
            assert!(*res <= tol, "{side}: PC{} residual {res} > {tol}", i + 1);
        }
    }
    assert_close(&gpu, &cpu, 1e-7, "converged pca");
    assert_same_subspaces(&dir.join("gpu"), &dir.join("cpu"), 1e-3, "converged pca");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Blosc chunks decoded on the device (nvCOMP's batched LZ4 and zstd, the copy and
/// unshuffle kernels) are the host's decode, bit for bit: genotype stores (int8) and f32
/// stores written by `rankwise gen` with LZ4 and zstd, without shuffle and with byte and
/// bit shuffle. A frame of another compressor is refused, naming it, for the host to decode.
#[test]
fn blosc_chunks_decode_on_the_device_as_on_the_host() {
    const TEST: &str = "blosc_chunks_decode_on_the_device_as_on_the_host";
    use rankwise::linalg::device_decode::{DeviceDecodeError, DeviceDecoder};
    use rankwise::sources::{BloscLayout, ChunkScratch, ZarrArray};
    let mut rng = Draw(test_seed());
    let dir = scratch("gpu-blosc");
    // Everywhere: the stores, their host decode and their frames as the device takes them.
    let mut cases = Vec::new();
    for (codec, shuffle, dtype, dist) in [
        ("blosc-zstd", "bit", "i8", "genotype"),
        ("blosc-lz4", "bit", "i8", "genotype"),
        ("blosc-zstd", "none", "i8", "genotype"),
        ("blosc-lz4", "byte", "f32", "normal"),
        ("blosc-zstd", "byte", "f32", "normal"),
        ("blosc-lz4", "none", "f32", "normal"),
    ] {
        let (rows, cols) = (rng.range(2_000, 9_000), rng.range(100, 900));
        let chunk = rng.range(300, 1_500);
        let what = format!("{codec} {shuffle} {dtype} {rows} × {cols}, chunks of {chunk}");
        let store = dir.join(format!("{codec}-{shuffle}-{dtype}.zarr"));
        let (r, c, ch, seed) = (
            rows.to_string(),
            cols.to_string(),
            chunk.to_string(),
            rng.next().to_string(),
        );
        embedded(&strings(&[
            "gen",
            "--out",
            store.to_str().unwrap(),
            "--rows",
            &r,
            "--cols",
            &c,
            "--chunk-rows",
            &ch,
            "--dist",
            dist,
            "--dtype",
            dtype,
            "--codec",
            codec,
            "--shuffle",
            shuffle,
            "--seed",
            &seed,
        ]))
        .assert_success();
        let name = if dist == "genotype" {
            "call_dosage"
        } else {
            ""
        };
        let array = ZarrArray::open_at(&store, name).unwrap_or_else(|e| panic!("{what}: {e}"));
        let elem = if dtype == "i8" { 1 } else { 4 };
        let mut host = vec![0u8; (rows * cols) as usize * elem];
        array
            .decode_region(
                &[0..rows, 0..cols],
                elem,
                &mut host,
                &mut ChunkScratch::default(),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut frames = Vec::new();
        for i in 0..rows.div_ceil(chunk) {
            let mut f = Vec::new();
            assert!(
                array.blosc_chunk(&[i, 0], &mut f).unwrap(),
                "{what}: chunk {i}"
            );
            let layout = BloscLayout::of(&f)
                .unwrap_or_else(|e| panic!("{what}: chunk {i}: {e}"))
                .unwrap_or_else(|| panic!("{what}: chunk {i}: no layout"));
            assert_eq!(layout.nbytes, (chunk * cols) as usize * elem, "{what}");
            frames.push(f);
        }
        // The last chunk decodes whole (past the array's last row, as stored).
        let decoded = frames.len() * (chunk * cols) as usize * elem;
        cases.push((what, host, frames, decoded));
    }
    if !gpu_usable() && std::env::var("RANKWISE_REQUIRE_GPU").as_deref() != Ok("1") {
        part_skipped(TEST, "the device decode", "no usable GPU");
        return;
    }
    let Some(dev) = gpu_or_skip(TEST) else {
        return;
    };
    let decoder = match DeviceDecoder::new(&dev) {
        Ok(d) => d,
        Err(e) => {
            part_skipped(TEST, "the device decode", &e.to_string());
            return;
        }
    };
    for (what, host, frames, decoded) in &cases {
        let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
        let mut out = dev.stream().alloc_zeros::<u8>(*decoded).unwrap();
        let stats = decoder
            .decode(&refs, &mut out)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut back = vec![0u8; *decoded];
        dev.stream().memcpy_dtoh(&out, &mut back).unwrap();
        dev.stream().synchronize().unwrap();
        assert!(
            back[..host.len()] == host[..],
            "{what}: the device's bytes differ"
        );
        println!("{what}: {stats:?}");
        assert!(stats.compressed_streams > 0, "{what}: {stats:?}");
    }
    // Another compressor (BloscLZ's code in the flags' top bits): refused, named.
    let mut f = cases[3].2[0].clone();
    f[2] &= 0x1f;
    let mut out = dev.stream().alloc_zeros::<u8>(cases[3].3).unwrap();
    match decoder.decode(&[&f], &mut out) {
        Err(DeviceDecodeError::Unsupported { frame: 0, why }) => {
            assert!(why.contains("BloscLZ"), "{why}")
        }
        other => panic!("a BloscLZ frame: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPU run repeats bit for bit: σ and the matrix's Σx², which the device sums per block
/// and the host adds in block order (it was summed with atomics, whose order varies from
/// run to run).
#[test]
fn gpu_runs_repeat_bit_for_bit_including_the_sum_of_squares() {
    if gpu_or_skip("gpu_runs_repeat_bit_for_bit_including_the_sum_of_squares").is_none() {
        return;
    }
    let mut rng = Draw(test_seed());
    let (m, n, seed) = (
        rng.range(20_000, 80_000).to_string(),
        rng.range(100, 3000).to_string(),
        rng.next().to_string(),
    );
    let args = [
        "rsvd",
        "--rows",
        m.as_str(),
        "--cols",
        n.as_str(),
        "--chunk-rows",
        "8192",
        "-k",
        "5",
        "--seed",
        seed.as_str(),
    ];
    let runs: Vec<_> = (0..2).map(|_| singular_values(&args, "gpu")).collect();
    let bits = |s: &[f64]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let what = format!("rsvd {m} × {n} seed {seed}");
    assert_eq!(bits(&runs[0].0), bits(&runs[1].0), "{what}: σ");
    let total = |r: &serde_json::Value| r["total_sum_squares"].as_f64().unwrap().to_bits();
    assert_eq!(total(&runs[0].1), total(&runs[1].1), "{what}: Σx²");
}

/// Staged bytes of all ranks of a report.
fn staged_bytes(report: &serde_json::Value) -> u64 {
    report["per_rank"]
        .as_array()
        .map(|ranks| {
            ranks
                .iter()
                .map(|r| r["gpu_staged_bytes"].as_u64().unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

/// Zarr stores, decoded on the host and staged to the device through pinned buffers, give
/// what CPU actors reading the same store give: float32 values and genotypes (which travel
/// 2-bit packed: the staged bytes are counted exactly), with and without power iterations,
/// whole panels and panels read in segments.
#[test]
fn zarr_stores_staged_to_the_device_agree_with_host_reads() {
    if gpu_or_skip("zarr_stores_staged_to_the_device_agree_with_host_reads").is_none() {
        return;
    }
    let mut rng = Draw(test_seed());
    let dir = scratch("gpu-staged-zarr");
    let m = rng.range(8_000, 30_000);
    let n = rng.range(300, 3000);
    let band = 1024 * rng.range(2, 6);
    let seed = rng.next().to_string();
    for (dtype, dist, codec) in [
        ("f32", "normal", "blosc-lz4"),
        ("i8", "genotype", "blosc-zstd"),
    ] {
        let spec = gen_store(
            &dir.join(format!("{dtype}.zarr")),
            (m, n, band),
            dist,
            &seed,
            &["--dtype", dtype, "--codec", codec],
        );
        let command = if dist == "genotype" { "pca" } else { "rsvd" };
        for (precision, q, segment, tol) in [
            ("f64", "0", "1G", 1e-10),
            ("f64", "2", "64K", 1e-10),
            ("f32", "1", "1G", 1e-5),
        ] {
            let mut args = vec![
                command,
                "--zarr",
                spec.as_str(),
                "-k",
                "5",
                "--power-iters",
                q,
                "--precision",
                precision,
                "--read-segment",
                segment,
            ];
            if dist == "genotype" && q == "2" {
                // Tables of excluded variants are staged like any other.
                args.extend(["--maf", "0.1"]);
            }
            let what = format!("{command} {dtype} --precision {precision} -q {q}");
            let (cpu, _) = singular_values(&args, "cpu");
            let (gpu, report) = singular_values(&args, "gpu");
            assert!(on_gpu_actor(&report), "{report}");
            assert_close(&gpu, &cpu, tol, &what);
            let staged = staged_bytes(&report);
            assert!(staged > 0, "{what}: nothing staged: {report}");
            let decode = gpu_decode(&report);
            if let (true, Some(d)) = (dist == "genotype", decode) {
                // The device decoded every chunk, none on the host.
                let chunks = m.div_ceil(band);
                let frames = d["device"]["frames"].as_u64().unwrap();
                assert!(frames > 0, "{what}: {d}");
                assert_eq!(
                    frames % chunks,
                    0,
                    "{what}: {frames} frames of {chunks} chunks"
                );
                assert_eq!(d["host_chunks"].as_u64(), Some(0), "{what}: {d}");
                // Every pass after the first ran from the codes kept on the device.
                let kept = report["per_rank"][0]["gpu_kept_passes"].as_u64().unwrap();
                assert!(kept > 0, "{what}: {report}");
                assert_eq!(frames, chunks, "{what}: decoded again after pass 1: {d}");
            } else if dist == "genotype" {
                // No nvCOMP: staged through the host, which the note says.
                part_skipped(
                    "zarr_stores_staged_to_the_device_agree_with_host_reads",
                    "device decode",
                    "nvCOMP not found",
                );
                assert!(
                    report["per_rank"][0]["gpu_note"]
                        .as_str()
                        .is_some_and(|n| n.contains("nvCOMP") || n.contains("nvcomp")),
                    "{report}"
                );
                // Each pass stages every variant's codes and its table of 4 values.
                let value = if precision == "f32" { 4 } else { 8 };
                let per_pass = m * (n.div_ceil(4) + 4 * value);
                assert_eq!(
                    staged % per_pass,
                    0,
                    "{what}: {staged} bytes staged, not whole passes of {per_pass}"
                );
            }
        }
        if dist == "genotype" {
            // A chunk in another Blosc compressor (BloscLZ, which nvCOMP does not
            // decompress): its batch is decoded on the host, the report says so, and the
            // result is still the CPU actors'.
            use zarrs::array::codec::bytes_to_bytes::blosc::{
                blosc_compress_bytes, blosc_decompress_bytes, BloscCompressionLevel,
                BloscCompressor, BloscShuffleMode,
            };
            let store = spec.split(':').next().unwrap();
            let chunk = find_chunk_file(std::path::Path::new(store), 1)
                .unwrap_or_else(|| panic!("no chunk file 1 in {store}"));
            let frame = std::fs::read(&chunk).unwrap();
            let bytes = blosc_decompress_bytes(&frame, (band * n) as usize, 1).unwrap();
            let level = BloscCompressionLevel::try_from(5u8).unwrap();
            let other = blosc_compress_bytes(
                &bytes,
                level,
                BloscShuffleMode::BitShuffle,
                1,
                BloscCompressor::BloscLZ,
                0,
                1,
            )
            .unwrap();
            std::fs::write(&chunk, other).unwrap();
            let args = [
                "pca",
                "--zarr",
                spec.as_str(),
                "-k",
                "5",
                "--power-iters",
                "1",
            ];
            let (cpu, _) = singular_values(&args, "cpu");
            let (gpu, report) = singular_values(&args, "gpu");
            assert_close(&gpu, &cpu, 1e-10, "pca with a BloscLZ chunk");
            if let Some(d) = gpu_decode(&report) {
                assert!(d["host_chunks"].as_u64().unwrap() >= 1, "{d}");
                assert!(
                    d["host_reason"].as_str().unwrap().contains("BloscLZ"),
                    "{d}"
                );
            }
        }
    }
}

/// What rank 0's GPU actors decoded on their devices, when they did.
fn gpu_decode(report: &serde_json::Value) -> Option<&serde_json::Value> {
    Some(&report["per_rank"][0]["gpu_decode"]).filter(|d| !d.is_null())
}

/// The file of chunk (`row`, 0) of the store at `root` (v2 `row.0` or v3 `c/row/0`, under
/// any array path).
fn find_chunk_file(root: &std::path::Path, row: u64) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(root).ok()?.flatten() {
        let p = e.path();
        let name = p.file_name()?.to_str()?.to_string();
        if p.is_file() && name == format!("{row}.0") {
            return Some(p);
        }
        if p.is_dir() {
            if name == "c" {
                let f = p.join(row.to_string()).join("0");
                if f.is_file() {
                    return Some(f);
                }
            }
            if let Some(f) = find_chunk_file(&p, row) {
                return Some(f);
            }
        }
    }
    None
}

fn collectives(report: &serde_json::Value) -> Vec<String> {
    report["per_rank"]
        .as_array()
        .map(|ranks| {
            ranks
                .iter()
                .map(|r| r["collectives"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Every rank agrees on how the projections' sums cross ranks: through the transport,
/// saying why NCCL was not used, when some rank has no GPU actor (here: CPU actors under
/// `mpirun -np 2`, a real MPI all-gather deciding it).
#[test]
fn sums_cross_ranks_through_the_transport_without_one_gpu_per_rank() {
    if let Err(why) = mpirun_available() {
        skipped(
            "sums_cross_ranks_through_the_transport_without_one_gpu_per_rank",
            &why,
        );
        return;
    }
    let args = strings(&[
        "rsvd",
        "--rows",
        "6000",
        "--cols",
        "120",
        "--chunk-rows",
        "1000",
        "-k",
        "3",
        "--device",
        "cpu",
        "--json",
    ]);
    let r = report(&under_mpirun(2, &args));
    let c = collectives(&r);
    assert_eq!(c.len(), 2, "{r}");
    for x in &c {
        assert_eq!(x, "mpi (NCCL not used: rank 0: it has no GPU actor)", "{r}");
    }
    let r = report(&embedded(&args));
    assert!(
        collectives(&r)[0].starts_with("local (NCCL not used: "),
        "{r}"
    );
}

/// With one GPU actor per rank the sums go through NCCL (where the NCCL library is found)
/// and give the transport's σ: one rank on one GPU (NCCL called on a communicator of one
/// rank: nothing crosses ranks), and two ranks under `mpirun`, which join NCCL when the
/// machine has two GPUs and otherwise decline, naming the GPU they share. Only the first
/// sums across ranks through NCCL; the others say so as a part skipped.
#[test]
fn nccl_sums_agree_with_the_transport() {
    const TEST: &str = "nccl_sums_agree_with_the_transport";
    if gpu_or_skip(TEST).is_none() {
        return;
    }
    let nccl = probed().find("nccl").is_some();
    let mut rng = Draw(test_seed());
    let (m, n) = (
        rng.range(20_000, 50_000).to_string(),
        rng.range(200, 1500).to_string(),
    );
    let seed = rng.next().to_string();
    let mut args = vec![
        "rsvd",
        "--rows",
        m.as_str(),
        "--cols",
        n.as_str(),
        "--chunk-rows",
        "2048",
        "-k",
        "6",
        "--power-iters",
        "2",
        "--seed",
        seed.as_str(),
        "--json",
    ];
    let (cpu, _) = singular_values(&args[..args.len() - 1], "cpu");
    let (gpu, r) = singular_values(&args[..args.len() - 1], "gpu");
    assert_close(&gpu, &cpu, 1e-10, "one rank");
    let c = collectives(&r);
    if nccl {
        assert_eq!(c, ["nccl"], "{r}");
    } else {
        assert!(c[0].contains("NCCL library was not found"), "{r}");
    }
    // Without an Open MPI launcher only the one-rank case runs.
    if let Err(why) = mpirun_available() {
        part_skipped(TEST, "two ranks", &why);
        return;
    }
    args.extend(["--device", "gpu"]);
    let r = report(&under_mpirun(2, &strings(&args)));
    let s: Vec<f64> = r["singular_values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_close(&s, &cpu, 1e-10, "two ranks");
    let c = collectives(&r);
    match (nccl, probed().devices.len()) {
        (true, 2..) => assert_eq!(c, ["nccl", "nccl"], "{r}"),
        (true, _) => {
            assert!(c.iter().all(|x| x.contains("use the same GPU")), "{r}");
            part_skipped(
                TEST,
                "NCCL across two ranks",
                "one GPU: the two ranks declined NCCL and summed through MPI",
            );
        }
        (false, _) => {
            assert!(c.iter().all(|x| x.contains("NCCL not used")), "{r}");
            part_skipped(TEST, "NCCL", "the NCCL library was not found");
        }
    }
}

/// cuSOLVER's panel QR against LAPACK on fresh tall and wide shapes: `QR = Y`, `Q`
/// orthonormal, and the same `|R|` diagonal as LAPACK's QR (the factorization is unique up
/// to the signs of `R`'s rows).
#[test]
fn panel_qr_on_the_device_matches_lapack() {
    let Some(dev) = gpu_or_skip("panel_qr_on_the_device_matches_lapack") else {
        return;
    };
    if dev.solver().is_none() {
        assert!(
            std::env::var("RANKWISE_REQUIRE_GPU").as_deref() != Ok("1"),
            "RANKWISE_REQUIRE_GPU=1 but cuSOLVER was not found"
        );
        skipped(
            "panel_qr_on_the_device_matches_lapack",
            "cuSOLVER not found",
        );
        return;
    }
    let mut rng = Draw(test_seed());
    for _ in 0..5 {
        let m = rng.log_range(1, 300_000) as usize;
        let n = rng.range(1, 64) as usize;
        let y = dense(m as u64, n as u64, rng.next(), Dist::Normal);
        let (q, r) = rankwise::linalg::internals::gpu::panel_qr(&dev, y.view())
            .unwrap()
            .expect("cuSOLVER was found");
        let k = m.min(n);
        assert_eq!((q.len(), r.dim()), (m * k, (k, n)), "{m} × {n}");
        let q = Array2::from_shape_vec((k, m), q).unwrap().reversed_axes();
        let back = q.dot(&r);
        let scale = y.iter().fold(0f64, |a, v| a.max(v.abs()));
        let err = (&back - &y).iter().fold(0f64, |a, v| a.max(v.abs()));
        assert!(
            err <= 1e-12 * scale * (m as f64).sqrt(),
            "{m} × {n}: ‖QR − Y‖∞ {err}"
        );
        let gram = q.t().dot(&q);
        let off = (&gram - &Array2::<f64>::eye(k))
            .iter()
            .fold(0f64, |a, v| a.max(v.abs()));
        assert!(
            off <= 1e-12 * (m as f64).sqrt(),
            "{m} × {n}: ‖QᵀQ − I‖∞ {off}"
        );
        let (_, lr) = ndarray_linalg::QR::qr(&y).unwrap();
        for i in 0..k {
            let (a, b) = (r[[i, i]].abs(), lr[[i, i]].abs());
            assert!(
                (a - b).abs() <= 1e-10 * b.max(1e-300),
                "{m} × {n}: |R{i}{i}| {a} vs {b}"
            );
        }
    }
}

/// `svd` on a GPU actor factors its panels with cuSOLVER (where found) and gives the CPU
/// actors' σ, with `U` and `V` orthonormal and `A = UΣVᵀ` checked panel by panel; panels
/// kept between passes and panels factored again in pass 2 both.
#[test]
fn svd_on_gpu_actors_agrees_with_cpu_actors() {
    if gpu_or_skip("svd_on_gpu_actors_agrees_with_cpu_actors").is_none() {
        return;
    }
    let cusolver = probed().find("cusolver").is_some();
    let mut rng = Draw(test_seed());
    let seed = rng.next().to_string();
    // A narrow matrix, with panels both kept and regenerated; and one wide enough for the
    // tree's node QRs to run on the device too.
    let narrow = (rng.range(5_000, 40_000), rng.range(20, 400));
    let wide = (rng.range(4_000, 12_000), rng.range(512, 800));
    // The third run has one thread and the least budget its plan accepts, so that its
    // panels are factored again in pass 2.
    let runs: [(_, &[&str], bool); 4] = [
        (narrow, &[], false),
        // Raw dosages, generated on the device from packed codes like `rsvd`'s.
        (narrow, &["--dist", "genotype"], false),
        (narrow, &["--threads-per-actor", "1"], true),
        (wide, &[], false),
    ];
    for ((m, n), memory, least) in runs {
        let (m, n) = (m.to_string(), n.to_string());
        let mut args = vec![
            "svd",
            "--rows",
            m.as_str(),
            "--cols",
            n.as_str(),
            "--chunk-rows",
            "1024",
            "--seed",
            seed.as_str(),
            "--check",
        ];
        args.extend(memory);
        let budget = least.then(|| least_budget(&strings(&args)).to_string());
        if let Some(b) = &budget {
            args.extend(["--memory-per-actor", b.as_str()]);
        }
        let (cpu, _) = singular_values(&args, "cpu");
        let (gpu, r) = singular_values(&args, "gpu");
        let what = format!("svd {m} × {n} {memory:?}");
        assert_close(&gpu, &cpu, 1e-10, &what);
        for key in ["relative_residual", "u_orthogonality", "v_orthogonality"] {
            let v = r["check"][key].as_f64().unwrap();
            assert!(v < 1e-12, "{what}: {key} {v}");
        }
        let rank = &r["per_rank"][0];
        let count = |key: &str| rank[key].as_u64().unwrap_or(0);
        assert_eq!(count("gpu_panel_qrs") > 0, cusolver, "{what}: {r}");
        // The generated uniform panels never leave the device but as Q and R.
        assert_eq!(
            count("gpu_generated_panels"),
            count("gpu_panel_qrs"),
            "{what}: {r}"
        );
        let wide_nodes = cusolver && n.parse::<usize>().unwrap() >= 512;
        assert_eq!(count("gpu_node_qrs") > 0, wide_nodes, "{what}: {r}");
    }
}

/// `benches/gpu.sh` with `DEVICE=cpu`, on small shapes: the script a GPU node runs
/// in one command, checked here so that a mistake in it does not cost a GPU allocation.
fn gpu_sh(out: &std::path::Path, env: &[(&str, &str)]) -> common::mpirun::RunOutput {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new("bash");
    cmd.arg(repo.join("benches/gpu.sh"))
        .env("RANKWISE", rankwise_bin())
        .env("DEVICE", "cpu")
        .env("OUT", out)
        .env("COLS", "300")
        .env("SMALL_ROWS", "6000")
        .env("ZARR_DIR", out.parent().unwrap().join("stores"))
        .env("ZARR_CHUNK", "1500")
        .env("SVD_COLS", "48")
        .env("SVD_CHUNK", "4000");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_with_timeout(cmd, std::time::Duration::from_secs(300))
}

fn read(path: std::path::PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every step of `benches/gpu.sh` runs and is summarized, tests of tests/gpu.rs run in
/// processes of their own through it and are counted as what they did (a test that skipped
/// is not a pass, and one that skipped a part says so); under a deadline already spent
/// every step is skipped, saying so, and the summary is still written; a step past its
/// timeout fails the script and is named.
#[test]
fn gpu_bench_script_runs_every_step_on_cpu_actors() {
    const TEST: &str = "gpu_bench_script_runs_every_step_on_cpu_actors";
    if std::env::var_os("RANKWISE_IN_GPU_SH").is_some() {
        skipped(TEST, "run by benches/gpu.sh itself");
        return;
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/gpu.sh");
    if !script.exists() {
        // A bundle's copy of this binary, away from the checkout it was built in.
        skipped(TEST, &format!("no {}", script.display()));
        return;
    }
    let mut rng = Draw(test_seed());
    let dir = scratch("gpu-sh");
    let (rows, zarr_rows, svd_rows, conv_rows) = (
        rng.range(8_000, 30_000).to_string(),
        rng.range(3_000, 9_000).to_string(),
        rng.range(8_000, 20_000).to_string(),
        rng.range(5_000, 15_000).to_string(),
    );
    let me = std::env::current_exe().unwrap();
    let all = dir.join("all");
    // Three tests: one that runs, this one (which skips under the script), and one whose
    // two-rank part skips for want of mpirun (or that skips whole where a GPU is usable).
    let run = gpu_sh(
        &all,
        &[
            ("ROWS", &rows),
            ("CHUNK_ROWS", "4000"),
            ("ZARR_ROWS", &zarr_rows),
            ("SVD_ROWS", &svd_rows),
            ("CONV_ROWS", &conv_rows),
            ("CONV_COLS", "300"),
            ("GPU_TESTS", me.to_str().unwrap()),
            (
                "TESTS_FILTER",
                "info_names_every_cuda_library gpu_bench_script_runs_every_step_on_cpu_actors \
                 device_gpu_without_cuda_fails_naming_the_library_on_every_rank",
            ),
            ("RANKWISE_MPIRUN", "/nonexistent/mpirun"),
        ],
    );
    assert!(run.success(), "{}", run.describe());
    let mut files: Vec<String> = std::fs::read_dir(&all)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    // Six files and no folder: few enough to copy back from a node in one piece.
    assert_eq!(
        files,
        [
            "env.txt",
            "reports.json",
            "runs.log",
            "steps.tsv",
            "summary.md",
            "tests.log"
        ]
    );
    let steps = read(all.join("steps.tsv"));
    let names: Vec<&str> = steps
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "test device_gpu_without_cuda_fails_naming_the_library_on_every_rank",
            "test gpu_bench_script_runs_every_step_on_cpu_actors",
            "test info_names_every_cuda_library",
            "small-gpu",
            "small-cpu",
            "converged-gpu",
            "converged-cpu",
            "rsvd-f32",
            "rsvd-f64",
            "gen",
            "zarr-read",
            "zarr-gpu",
            "zarr-cpu",
            "svd-gpu",
            "svd-cpu"
        ],
        "{steps}"
    );
    let outcomes: Vec<&str> = steps
        .lines()
        .map(|l| l.split('\t').nth(1).unwrap())
        .collect();
    let (without_cuda, count) = if gpu_usable() {
        (
            "skipped: this machine has a usable GPU".to_string(),
            "1 passed (0 with a part skipped), 2 skipped, 0 failed",
        )
    } else {
        (
            "ok, part skipped: (two ranks): no /nonexistent/mpirun".to_string(),
            "2 passed (1 with a part skipped), 1 skipped, 0 failed",
        )
    };
    assert!(outcomes[0].starts_with(&without_cuda), "{steps}");
    assert_eq!(
        outcomes[1], "skipped: run by benches/gpu.sh itself",
        "{steps}"
    );
    assert!(outcomes[2..].iter().all(|&o| o == "ok"), "{steps}");
    let tests = read(all.join("tests.log"));
    assert!(tests.contains(&format!("tests/gpu.rs: {count}")), "{tests}");
    let reports: serde_json::Value = serde_json::from_str(&read(all.join("reports.json"))).unwrap();
    for name in &names[3..] {
        if *name != "gen" {
            assert!(reports.get(name).is_some(), "no report {name}");
        }
    }
    assert_eq!(reports["rsvd-f64"]["shape"][0].as_u64(), rows.parse().ok());
    let summary = read(all.join("summary.md"));
    let count_line = format!("tests/gpu.rs: {count}");
    let ok_line = format!("{} of 15 steps ok", if gpu_usable() { 13 } else { 14 });
    for needle in [
        "a check of this script, not of a GPU",
        count_line.as_str(),
        ok_line.as_str(),
        "- test gpu_bench_script_runs_every_step_on_cpu_actors: skipped: run by benches/gpu.sh \
         itself",
        "| f32 | ",
        "| f64 | ",
        "## Zarr → device",
        "- host decode alone",
        "## Default (convergence-controlled) pca -k 10",
        "| CPU actors | ",
        "## svd of a generated",
        "largest difference",
    ] {
        assert!(summary.contains(needle), "no {needle:?} in\n{summary}");
    }

    // A deadline already spent: every step skipped, the summary still written, exit 0.
    let late = dir.join("late");
    let run = gpu_sh(
        &late,
        &[
            ("ROWS", &rows),
            ("GPU_TESTS", "none"),
            ("ZARR_ROWS", "0"),
            ("SVD_ROWS", "0"),
            ("CONV_ROWS", "0"),
            ("DEADLINE", "5"),
        ],
    );
    assert!(run.success(), "{}", run.describe());
    let steps = read(late.join("steps.tsv"));
    assert_eq!(steps.lines().count(), 4, "{steps}");
    assert!(steps.lines().all(|l| l.contains("\tskipped: ")), "{steps}");
    let summary = read(late.join("summary.md"));
    assert!(summary.contains("0 of 4 steps ok"), "{summary}");
    assert!(summary.contains("- rsvd-f64: skipped: "), "{summary}");

    // A run past its timeout: named in the summary, and the script fails.
    let slow = dir.join("slow");
    let run = gpu_sh(
        &slow,
        &[
            ("ROWS", "20000000"),
            ("COLS", "2000"),
            ("CHUNK_ROWS", "250000"),
            ("PRECISIONS", "f64"),
            ("GPU_TESTS", "none"),
            ("ZARR_ROWS", "0"),
            ("SVD_ROWS", "0"),
            ("CONV_ROWS", "0"),
            ("TIMEOUT", "10"),
        ],
    );
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{}", run.describe());
    let summary = read(slow.join("summary.md"));
    assert!(
        summary.contains("- rsvd-f64: timed out after 10 s"),
        "{summary}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
