//! The `rankwise` binary: outputs, bad input and failures on Local ranks.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::mpirun::run_with_timeout;
use common::*;
use ndarray::Array2;
use rankwise::output::read_f64_array;
use rankwise::sources::Dist;

fn rankwise(args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(rankwise_bin());
    cmd.args(args);
    let run = run_with_timeout(cmd, Duration::from_secs(120));
    run.assert_finished();
    (run.code.unwrap_or(-1), run.stdout, run.stderr)
}

fn no_leftovers(dir: &std::path::Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "left behind in {}: {left:?}",
        dir.display()
    );
}

#[test]
fn help_describes_the_project_not_its_launch_crate() {
    let (code, stdout, _) = rankwise(&["--help"]);
    assert_eq!(code, 0);
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("Distributed SVD and PCA"),
        "first line of --help: {first}"
    );
}

#[test]
fn svd_writes_a_complete_zarr_group() {
    let dir = scratch("cli-out");
    for (m, n, chunk) in [(5_003u64, 7u64, 1_000u64), (6, 300, 64)] {
        let out = dir.join(format!("r{m}x{n}.zarr"));
        let (code, stdout, stderr) = rankwise(&[
            "svd",
            "--rows",
            &m.to_string(),
            "--cols",
            &n.to_string(),
            "--chunk-rows",
            &chunk.to_string(),
            "--seed",
            "5",
            "--dist",
            "normal",
            "--local-ranks",
            "3",
            "--actors",
            "2",
            "--json",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let k = m.min(n) as usize;
        let (ss, s) = read_f64_array(&out, "S").unwrap();
        let (us, u) = read_f64_array(&out, "U").unwrap();
        let (vs, vt) = read_f64_array(&out, "Vt").unwrap();
        assert_eq!(
            (ss, us, vs),
            (vec![k as u64], vec![m, k as u64], vec![k as u64, n])
        );
        let printed: Vec<f64> = serde_json::from_value(report["singular_values"].clone()).unwrap();
        assert_eq!(printed, s, "report and S array agree");
        let u = Array2::from_shape_vec((m as usize, k), u).unwrap();
        let vt = Array2::from_shape_vec((k, n as usize), vt).unwrap();
        let a = dense(m, n, 5, Dist::Normal);
        let back = (&u * &ndarray::Array1::from(s)).dot(&vt);
        let res = (&back - &a).mapv(|x| x * x).sum().sqrt() / a.mapv(|x| x * x).sum().sqrt();
        assert!(
            res < 1e-13,
            "{m}×{n}: residual of the written factors {res:e}"
        );
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("zarr.json")).unwrap()).unwrap();
        assert_eq!(meta["attributes"]["report"]["command"], "svd", "{meta}");
        // Consolidated, as xarray opens it.
        assert_eq!(
            meta["consolidated_metadata"]["metadata"]["U"]["node_type"],
            "array"
        );
    }
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".tmp-")),
        "temporary directories left: {names:?}"
    );
}

#[test]
fn bad_input_names_the_option_and_leaves_nothing() {
    let dir = scratch("cli-bad");
    let existing = dir.join("exists.zarr");
    std::fs::create_dir(&existing).unwrap();
    let out = dir.join("new.zarr");
    let out = out.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--rows",
                "0",
                "--cols",
                "5",
                "--chunk-rows",
                "10",
                "--out",
                out,
            ],
            "--rows",
        ),
        (
            vec![
                "--rows",
                "10",
                "--cols",
                "0",
                "--chunk-rows",
                "10",
                "--out",
                out,
            ],
            "--cols",
        ),
        (
            vec![
                "--rows",
                "10",
                "--cols",
                "5",
                "--chunk-rows",
                "0",
                "--out",
                out,
            ],
            "--chunk-rows",
        ),
        (
            vec![
                "--rows",
                "100000",
                "--cols",
                "50",
                "--chunk-rows",
                "100000",
                "--memory-per-actor",
                "1M",
                "--out",
                out,
            ],
            "--memory-per-actor",
        ),
        (
            vec![
                "--rows",
                "10",
                "--cols",
                "5",
                "--chunk-rows",
                "2",
                "--memory-per-actor",
                "lots",
                "--out",
                out,
            ],
            "--memory-per-actor",
        ),
        (
            vec![
                "--rows",
                "10",
                "--cols",
                "5",
                "--chunk-rows",
                "2",
                "--dist",
                "cauchy",
                "--out",
                out,
            ],
            "--dist",
        ),
        (
            vec![
                "--rows",
                "10",
                "--cols",
                "5",
                "--chunk-rows",
                "2",
                "--out",
                existing.to_str().unwrap(),
            ],
            "--out",
        ),
        (
            vec![
                "--rows",
                "10",
                "--cols",
                "5",
                "--chunk-rows",
                "2",
                "--out",
                "/nonexistent-dir/x.zarr",
            ],
            "--out",
        ),
        (
            vec![
                "--rows",
                "10",
                "--cols",
                "5",
                "--chunk-rows",
                "2",
                "--out",
                "/proc/x.zarr",
            ],
            "--out",
        ),
    ];
    for (args, option) in cases {
        for ranks in ["1", "3"] {
            let mut all = vec!["svd", "--local-ranks", ranks];
            all.extend(&args);
            let (code, _, stderr) = rankwise(&all);
            assert_ne!(code, 0, "{all:?} succeeded");
            assert!(
                stderr.contains(option),
                "{all:?}: stderr does not name {option}: {stderr}"
            );
            assert!(!std::path::Path::new(out).exists(), "{all:?} left {out}");
        }
    }
    std::fs::remove_dir(&existing).unwrap();
    no_leftovers(&dir);
}

#[test]
fn a_failing_rank_fails_every_rank_with_its_message() {
    let dir = scratch("cli-fault");
    let out = dir.join("r.zarr");
    for (fault, needle) in [
        ("1:error", "rank 1 failed"),
        ("2:panic:before-svd", "rank 2 failed: panic"),
        ("0:error:after-svd", "rank 0 failed"),
    ] {
        let mut cmd = Command::new(rankwise_fault_bin());
        cmd.env("RANKWISE_FAULT", fault).args([
            "svd",
            "--rows",
            "20000",
            "--cols",
            "8",
            "--chunk-rows",
            "1000",
            "--local-ranks",
            "3",
            "--out",
            out.to_str().unwrap(),
        ]);
        let run = run_with_timeout(cmd, Duration::from_secs(60));
        run.assert_finished();
        let (stderr, took) = (&run.stderr, run.elapsed);
        assert_eq!(run.code, Some(1), "{fault}: {stderr}");
        assert!(
            stderr.contains(needle) && stderr.contains("injected"),
            "{fault}: {stderr}"
        );
        assert!(took < Duration::from_secs(10), "{fault}: took {took:?}");
        assert!(!out.exists(), "{fault}: output looks complete");
    }
    no_leftovers(&dir);
}

/// The shipped `rankwise` has no fault injection: its file holds none of the hook's text,
/// and a run with `RANKWISE_FAULT` set (a job's environment passed on by sbatch, say) is
/// refused before it computes or writes anything, instead of running as if unset.
#[test]
fn the_shipped_binary_refuses_rankwise_fault() {
    let image = std::fs::read(rankwise_bin()).unwrap();
    for text in ["injected input error", "injected panic"] {
        assert!(
            !image.windows(text.len()).any(|w| w == text.as_bytes()),
            "{} contains {text:?}: the fault hook is compiled in",
            rankwise_bin().display()
        );
    }
    let dir = scratch("cli-no-fault");
    let out = dir.join("r.zarr");
    for value in ["1:error", "0:exit:commit", "not a fault"] {
        let mut cmd = Command::new(rankwise_bin());
        cmd.env("RANKWISE_FAULT", value).args([
            "svd",
            "--rows",
            "2000",
            "--cols",
            "8",
            "--chunk-rows",
            "500",
            "--local-ranks",
            "2",
            "--out",
            out.to_str().unwrap(),
        ]);
        let run = run_with_timeout(cmd, Duration::from_secs(60));
        run.assert_finished();
        assert_eq!(run.code, Some(2), "{value}\n{}", run.describe());
        assert!(
            run.stderr.contains("RANKWISE_FAULT is set")
                && run.stderr.contains("has no fault injection"),
            "{value}\n{}",
            run.describe()
        );
        assert!(run.stdout.is_empty(), "{value}\n{}", run.describe());
    }
    no_leftovers(&dir);
}

/// `rankwise-fault` refuses a `RANKWISE_FAULT` it cannot parse, quoting it: a misspelt
/// fault that never fires would let a failure test pass without a failure.
#[test]
fn a_malformed_rankwise_fault_is_an_error_naming_it() {
    let dir = scratch("cli-bad-fault");
    let out = dir.join("r.zarr");
    for value in [
        "",
        "1",
        "one:error",
        "1:crash",
        "1:error:never",
        "1:error:start:x",
    ] {
        let mut cmd = Command::new(rankwise_fault_bin());
        cmd.env("RANKWISE_FAULT", value).args([
            "svd",
            "--rows",
            "2000",
            "--cols",
            "8",
            "--chunk-rows",
            "500",
            "--out",
            out.to_str().unwrap(),
        ]);
        let run = run_with_timeout(cmd, Duration::from_secs(60));
        run.assert_finished();
        assert_eq!(run.code, Some(2), "{value:?}\n{}", run.describe());
        assert!(
            run.stderr.contains(&format!(
                "rankwise: RANKWISE_FAULT: {value:?} is not RANK:KIND"
            )),
            "{value:?}\n{}",
            run.describe()
        );
    }
    no_leftovers(&dir);
    // And a well-formed one for a rank that never reaches it does nothing.
    let mut cmd = Command::new(rankwise_fault_bin());
    cmd.env("RANKWISE_FAULT", "5:error").args([
        "svd",
        "--rows",
        "2000",
        "--cols",
        "8",
        "--chunk-rows",
        "500",
    ]);
    run_with_timeout(cmd, Duration::from_secs(60)).assert_success();
}

#[test]
fn plan_and_info_describe_the_run() {
    let (code, stdout, stderr) = rankwise(&[
        "plan",
        "--rows",
        "1000",
        "--cols",
        "20",
        "--chunk-rows",
        "300",
        "--local-ranks",
        "2",
        "--memory-per-actor",
        "1M",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("4 panels of 300 rows"), "{stdout}");
    assert!(
        stdout.contains("0..2") && stdout.contains("2..4"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Resident") && stdout.contains("messages"),
        "{stdout}"
    );
    let (code, stdout, stderr) = rankwise(&[
        "plan",
        "--rows",
        "1000",
        "--cols",
        "20",
        "--chunk-rows",
        "300",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let plan: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(plan["placement"]["owner"].as_array().unwrap().len(), 4);
    let (code, stdout, stderr) = rankwise(&["info"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.to_lowercase().contains("numa"), "{stdout}");
    assert!(stdout.contains("actor 0"), "{stdout}");
    // The build and its libraries, first.
    let head: Vec<&str> = stdout.lines().take(3).collect();
    assert!(
        head[0].starts_with(&format!("rankwise {} (git ", env!("CARGO_PKG_VERSION"))),
        "{stdout}"
    );
    assert!(head[1].starts_with("BLAS: OpenBLAS"), "{stdout}");
    assert_eq!(head[2], "MPI: not used (local transport)", "{stdout}");
}

/// `rankwise calibrate` writes this machine's rates, and `rankwise plan --nodes` sizes a job
/// with them for a described cluster: the code's own plan over that many ranks (panels,
/// passes, memory per rank), the phases, and the options named when they are wrong.
#[test]
fn calibrate_then_plan_a_cluster_job() {
    let dir = scratch("cli-sizing");
    std::fs::create_dir_all(&dir).unwrap();
    let rates = dir.join("rates.json");
    let rates_s = rates.to_str().unwrap();
    // CPU actors: where there are GPUs, `--device auto` would calibrate those.
    let (code, _, err) = rankwise(&[
        "calibrate",
        "--out",
        rates_s,
        "--values",
        "262144",
        "--device",
        "cpu",
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&rates).unwrap())
        .expect("the rates are JSON");
    assert_eq!(r["unit"], "core");
    // Nine widths, ascending, each with both passes timed.
    let widths: Vec<u64> = r["svd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["cols"].as_u64().unwrap())
        .collect();
    assert_eq!(widths, [8, 16, 24, 32, 48, 64, 128, 256, 512]);
    for v in r["svd"].as_array().unwrap() {
        assert!(v["pass1"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["pass2"].as_f64().unwrap() > 0.0, "{v}");
        // The tree: a merge of two R factors, and the SVD of the root's.
        assert!(v["merge"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["root"].as_f64().unwrap() > 0.0, "{v}");
    }
    assert!(r["genotypes"]["produce"].as_f64().unwrap() > 0.0);
    // The Rayleigh–Ritz steps of LOBPCG and of block Lanczos: a positive cost per sample at
    // 20 sketch columns on one thread, the part that runs on one thread and the part the
    // threads share.
    for step in ["rayleigh_ritz", "lanczos_step"] {
        let rr = &r[step];
        let at20 = |part: &str| {
            (rr[part]["per_value"].as_f64().unwrap()
                + 20.0 * rr[part]["per_value_column"].as_f64().unwrap())
            .max(0.0)
        };
        assert!(at20("serial") + at20("parallel") > 0.0, "{step}: {rr}");
    }
    // The genotype passes in float32 tiles (block Lanczos's) cost something at 8 columns.
    let g = &r["genotypes_f32"]["later"];
    assert!(
        g["per_value"].as_f64().unwrap() + 8.0 * g["per_value_column"].as_f64().unwrap() > 0.0,
        "{g}"
    );
    // Nothing half-written beside the rates.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    // Like every output, the rates never replace a file, and `--out` is checked before the
    // measuring (a minute at the default size), not after it.
    let before = std::time::Instant::now();
    let (code, _, err) = rankwise(&["calibrate", "--out", rates_s, "-q"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--out") && err.contains("already exists"),
        "{err}"
    );
    assert!(
        before.elapsed() < Duration::from_secs(10),
        "{:?}",
        before.elapsed()
    );

    // `plan --nodes N` of a 1,000,000 × 100 matrix with the rates of `calibration`.
    let plan_with = |calibration: &str, nodes: &str, extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--rows",
            "1000000",
            "--cols",
            "100",
            "--chunk-rows",
            "0",
            "--nodes",
            nodes,
            "--ranks-per-node",
            "2",
            "--cores-per-node",
            "16",
            "--memory-per-node",
            "8G",
            "--network",
            "25,5us",
            "--calibration",
            calibration,
            "--json",
        ];
        args.extend_from_slice(extra);
        rankwise(&args)
    };
    let plan = |nodes: &str, extra: &[&str]| plan_with(rates_s, nodes, extra);
    let (code, out, err) = plan("4", &["--job", "rsvd", "--passes", "5"]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["ranks"], 8);
    assert_eq!(p["passes"], 5);
    // Five passes, and LOBPCG's Rayleigh–Ritz steps on the root.
    let phases = p["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 6, "{phases:?}");
    assert!(
        phases[5]["phase"]
            .as_str()
            .unwrap()
            .starts_with("Rayleigh–Ritz steps on the root (5, "),
        "{phases:?}"
    );
    assert!(p["seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(p["fits"], true);
    // Twice the nodes: no more compute on the busiest rank.
    let (_, out2, _) = plan("8", &["--job", "rsvd", "--passes", "5"]);
    let p2: serde_json::Value = serde_json::from_str(&out2).unwrap();
    let compute = |p: &serde_json::Value| -> f64 {
        p["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["compute_seconds"].as_f64().unwrap())
            .sum()
    };
    assert!(
        compute(&p2) < compute(&p),
        "{} vs {}",
        compute(&p2),
        compute(&p)
    );
    // The exact SVD: its two passes and the tree.
    let (code, out, err) = plan("2", &[]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["phases"].as_array().unwrap().len(), 3);
    // The tree computes too: the root's merges of 100 × 100 R factors and the SVD of its R.
    assert!(
        p["phases"][1]["compute_seconds"].as_f64().unwrap() > 0.0,
        "{}",
        p["phases"][1]
    );

    // Wrong options are named.
    // A small job, with `extra`; on two nodes with the calibration at `rates`.
    let small_with = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            "--rows",
            "1000",
            "--cols",
            "10",
            "--chunk-rows",
            "0",
        ];
        args.extend_from_slice(extra);
        rankwise(&args)
    };
    let small = |rates: &Path| {
        small_with(&[
            "--nodes",
            "2",
            "--network",
            "10,1us",
            "--calibration",
            rates.to_str().unwrap(),
        ])
    };
    let (code, _, err) = small(&dir.join("none.json"));
    assert_ne!(code, 0);
    assert!(
        err.contains("--calibration") && err.contains("rankwise calibrate"),
        "{err}"
    );
    let (code, _, err) = plan("2", &["--network", "fast"]);
    assert_ne!(code, 0);
    assert!(err.contains("--network"), "{err}");
    // The calibration edited into rates no machine has: refused, naming the file and the
    // field, where they predicted runs of 0 s.
    let edited = dir.join("edited.json");
    for (field, value) in [("cores", "0"), ("pass1", "-1e-9"), ("produce", "-1")] {
        let text = std::fs::read_to_string(&rates).unwrap();
        let key = format!("\"{field}\": ");
        let at = text.find(&key).expect("the field is in the file") + key.len();
        let end = at + text[at..].find([',', '\n']).unwrap();
        std::fs::write(&edited, format!("{}{value}{}", &text[..at], &text[end..])).unwrap();
        let (code, _, err) = small(&edited);
        assert_eq!(code, 2, "{field} {value}: {err}");
        assert!(
            err.contains("--calibration") && err.contains("edited.json") && err.contains(field),
            "{field} {value}: {err}"
        );
    }

    // A LOBPCG pass's messages (100 × 20 doubles, 16 KB here; 1,000 samples' 160 KB)
    // over long links: past the eager limit a round trip more, over MPI past 64 KiB the
    // go-ahead's too; UCX has no go-ahead. (`--solver lobpcg`: a PCA's default is block
    // Lanczos, whose messages are 8 columns wide.)
    let network = |samples: &str, network: &str, extra: &[&str]| -> (i32, f64, String) {
        let mut args = vec![
            "plan",
            "--rows",
            "100000",
            "--cols",
            samples,
            "--chunk-rows",
            "0",
            "--nodes",
            "2",
            "--job",
            "pca",
            "--passes",
            "10",
            "--network",
            network,
            "--calibration",
            rates_s,
            "--json",
        ];
        if !extra.contains(&"--solver") {
            args.extend_from_slice(&["--solver", "lobpcg"]);
        }
        args.extend_from_slice(extra);
        let (code, out, err) = rankwise(&args);
        let comm = serde_json::from_str::<serde_json::Value>(&out).map_or(0.0, |p| {
            p["phases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["comm_seconds"].as_f64().unwrap())
                .sum()
        });
        (code, comm, err)
    };
    let near = |a: f64, b: f64| (a - b).abs() < 1e-3 * b;
    let (_, small_msgs, _) = network("100", "1,5ms", &[]);
    let (_, mpi, _) = network("1000", "1,5ms", &[]);
    let (_, eager, _) = network("1000", "1,5ms,1M", &[]);
    let (_, ucx, _) = network("1000", "1,5ms", &["--transport", "ucx"]);
    let (_, ucx_eager, _) = network("1000", "1,5ms,1M", &["--transport", "ucx"]);
    // Ten passes of two messages each: 5, 3, 3 and 1 latencies a message (the
    // messages' bytes at 1 Gb/s besides).
    let bytes = 2.0 * 10.0 * 1000.0 * 20.0 * 8.0 * 8.0 / 1e9;
    assert!(near(mpi, 20.0 * 5.0 * 5e-3 + bytes), "{mpi}");
    assert!(near(eager, 20.0 * 3.0 * 5e-3 + bytes), "{eager}");
    assert!(near(ucx, 20.0 * 3.0 * 5e-3 + bytes), "{ucx}");
    assert!(near(ucx_eager, 20.0 * 5e-3 + bytes), "{ucx_eager}");
    assert!(near(small_msgs, 20.0 * 5e-3 + bytes / 10.0), "{small_msgs}");
    // Block Lanczos, the PCA's default: nine passes of 1000 × 8 doubles (64,000 bytes,
    // within the 64 KiB a message carries inline and the eager limit: one latency) and the
    // last of 20 columns (LOBPCG's five).
    let (_, lanczos, _) = network("1000", "1,5ms", &["--solver", "lanczos"]);
    let bytes = 2.0 * (9.0 * 8.0 + 20.0) * 1000.0 * 8.0 * 8.0 / 1e9;
    assert!(near(lanczos, 2.0 * (9.0 + 5.0) * 5e-3 + bytes), "{lanczos}");
    let (code, _, err) = network("1000", "1,5ms,lots", &[]);
    assert_ne!(code, 0);
    assert!(err.contains("--network") && err.contains("eager"), "{err}");
    let (code, _, err) = network("1000", "1,5ms", &["--transport", "local"]);
    assert_ne!(code, 0);
    assert!(err.contains("--transport"), "{err}");
    // Rates per GPU (the file of a calibration on GPU actors, `"unit": "gpu"`): a node
    // without GPUs, or GPUs the ranks cannot share evenly, is refused naming the option;
    // with them, the values go to the GPUs, and no note says the rates are a CPU's.
    let mut g = r.clone();
    g["unit"] = "gpu".into();
    let gpu_rates = dir.join("gpu-rates.json");
    std::fs::write(&gpu_rates, g.to_string()).unwrap();
    let gpu_plan = |extra: &[&str]| {
        let mut args = vec!["--job", "rsvd", "--passes", "4"];
        args.extend_from_slice(extra);
        plan_with(gpu_rates.to_str().unwrap(), "2", &args)
    };
    for bad in [&[][..], &["--gpus-per-node", "3"][..]] {
        let (code, _, err) = gpu_plan(bad);
        assert_ne!(code, 0);
        assert!(err.contains("--gpus-per-node"), "{err}");
    }
    let (code, out, err) = gpu_plan(&["--gpus-per-node", "4"]);
    assert_eq!(code, 0, "{err}");
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!p["notes"].to_string().contains("CPU calibration"), "{p}");
    let (_, out, _) = plan(
        "2",
        &["--job", "rsvd", "--passes", "4", "--gpus-per-node", "4"],
    );
    let p: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(p["notes"].to_string().contains("CPU calibration"), "{p}");
    let (code, _, err) = plan("2", &["--job", "pca", "--passes", "0"]);
    assert_ne!(code, 0);
    assert!(err.contains("--passes"), "{err}");
    let (code, _, err) = small_with(&["--ranks-per-node", "2"]);
    assert_ne!(code, 0);
    assert!(err.contains("--nodes"), "{err}");
}

/// `svd --machine-limit`: both passes state their flops (one Cholesky QR step's Gram
/// matrix, then `U = Q̃·c` and the checks' products) and the bytes every rank produced
/// (every panel in pass 1; in pass 2 those made again: a uniform matrix's replayed panels,
/// none of a kept normal one, all once more for the checks), and a limit that is those at
/// the two probes' rates; on 2 Local ranks and fresh shapes.
#[test]
fn svd_machine_limit_counts_each_passs_flops_and_bytes_at_the_probes_rates() {
    let mut draw = common::Draw::fresh();
    for (dist, check) in [("uniform", false), ("normal", false), ("uniform", true)] {
        let m = draw.range(20_000, 60_000);
        let n = draw.range(2, 40);
        let mut args = vec![
            "svd".to_string(),
            "--rows".into(),
            m.to_string(),
            "--cols".into(),
            n.to_string(),
            "--chunk-rows".into(),
            draw.range(3_000, 9_000).to_string(),
            "--dist".into(),
            dist.into(),
            "--local-ranks".into(),
            "2".into(),
            "--machine-limit".into(),
            "--json".into(),
        ];
        if check {
            args.push("--check".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, stderr) = rankwise(&args);
        assert_eq!(code, 0, "{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let limit = &report["machine_limit"];
        let gemm = limit["gemm_gflop_per_s"].as_f64().unwrap() * 1e9;
        let production = limit["production_gb_per_s"].as_f64().unwrap() * 1e9;
        assert!(gemm > 1e8 && production > 1e7, "{limit}");
        let passes = limit["passes"].as_array().unwrap();
        assert_eq!(passes.len(), 2, "{limit}");
        let (mf, nf) = (m as f64, n as f64);
        let bytes = m * n * 8;
        // Kept (normal values, a budget that holds them) or made again (uniform).
        let kept = dist == "normal";
        for plan in report["memory"].as_array().unwrap() {
            assert_eq!(plan["residency"], "resident", "{plan}");
        }
        let want = [
            (mf * nf * (nf + 1.0), bytes),
            (
                2.0 * mf * nf * nf + if check { 2.0 * mf * nf * 2.0 * nf } else { 0.0 },
                if kept { 0 } else { bytes } + if check { bytes } else { 0 },
            ),
        ];
        for (p, (flops, produced)) in passes.iter().zip(want) {
            let got = p["flops"].as_f64().unwrap();
            assert!(
                (got - flops).abs() <= 1e-12 * flops,
                "{p}: want {flops:e} flops"
            );
            assert_eq!(p["produced_bytes"].as_u64(), Some(produced), "{dist}: {p}");
            let seconds = p["seconds"].as_f64().unwrap();
            let at = flops / gemm + produced as f64 / production;
            let limit_seconds = p["limit_seconds"].as_f64().unwrap();
            assert!(
                (limit_seconds - at).abs() <= 1e-9 * at,
                "{p}: want {at:e} s"
            );
            let share = p["share"].as_f64().unwrap();
            assert!((share - at / seconds).abs() <= 1e-9 * share, "{p}");
        }
    }
    // Without the flag, no probe and no section.
    no_machine_limit(&[
        "svd",
        "--rows",
        "3000",
        "--cols",
        "5",
        "--chunk-rows",
        "1000",
    ]);
}

/// A run of `args` without `--machine-limit` reports no machine limit.
fn no_machine_limit(args: &[&str]) {
    let args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
    let (code, stdout, stderr) = rankwise(&args);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(report.get("machine_limit").is_none(), "{report}");
}

/// `--machine-limit`: every pass's products are counted (their sum is the run's GEMM
/// total, computed apart from the options), the probes run on every rank at once (here 2
/// Local ranks), and each pass states its rate, the values it produced (every panel in the
/// first pass, in a later one those not resident), and a limit that is those at the
/// probes' rates, in f64 and f32 tiles. The GEMM rate is the best of the kernels the CPU
/// can run, never below the pinned ones'.
#[test]
fn machine_limit_states_each_passs_rate_and_share_of_the_gemm_probe() {
    let mut draw = common::Draw::fresh();
    for power_iters in 0..3u64 {
        let precision = if power_iters == 1 { "f32" } else { "f64" };
        let m = draw.range(8_000, 30_000);
        let n = draw.range(500, 3_000);
        let k = draw.range(2, 8);
        let (code, stdout, stderr) = rankwise(&[
            "rsvd",
            "--rows",
            &m.to_string(),
            "--cols",
            &n.to_string(),
            "--chunk-rows",
            "2000",
            "-k",
            &k.to_string(),
            "--power-iters",
            &power_iters.to_string(),
            "--precision",
            precision,
            "--local-ranks",
            "2",
            "--machine-limit",
            "--json",
        ]);
        assert_eq!(code, 0, "{stderr}");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        let limit = &report["machine_limit"];
        let peak = limit["gemm_gflop_per_s"].as_f64().unwrap();
        assert!(peak.is_finite() && peak > 0.1, "{limit}");
        assert!(
            limit["gemm_kernels"]
                .as_str()
                .is_some_and(|k| !k.is_empty()),
            "{limit}"
        );
        if let Some(pinned) = limit["pinned_gemm_gflop_per_s"].as_f64() {
            assert!(pinned > 0.0 && pinned < peak, "{limit}");
        }
        let production = limit["production_gb_per_s"].as_f64().unwrap();
        assert!(production.is_finite() && production > 0.01, "{limit}");
        assert_eq!(limit["precision"], precision);
        let passes = limit["passes"].as_array().unwrap();
        // The range pass, q more, and the residual check's A·V (projections fused or not).
        assert!(passes.len() >= 2 + power_iters as usize, "{limit}");
        let residency: Vec<_> = (report["memory"].as_array().unwrap().iter())
            .map(|p| p["residency"].as_str().unwrap().to_string())
            .collect();
        let bytes = m * n * 8;
        let mut sum = 0.0;
        for (i, p) in passes.iter().enumerate() {
            let produced = p["produced_bytes"].as_u64().unwrap();
            if i == 0 {
                assert_eq!(produced, bytes, "{p}");
            } else if residency.iter().all(|r| r == "resident") {
                assert_eq!(produced, 0, "{p}");
            } else if residency.iter().all(|r| r == "regenerated") {
                assert_eq!(produced, bytes, "{p}");
            } else {
                assert!(produced < bytes, "{p}");
            }
            let at =
                p["flops"].as_f64().unwrap() / (peak * 1e9) + produced as f64 / (production * 1e9);
            let limit_seconds = p["limit_seconds"].as_f64().unwrap();
            assert!(
                (limit_seconds - at).abs() <= 1e-9 * at,
                "{p}: want {at:e} s"
            );
            let flops = p["flops"].as_f64().unwrap();
            let columns = flops / (2.0 * m as f64 * n as f64);
            assert!(
                columns >= 1.0 && (columns - columns.round()).abs() < 1e-9,
                "{p}: 2mn × a whole number of columns"
            );
            let (rate, share) = (
                p["gflop_per_s"].as_f64().unwrap(),
                p["share"].as_f64().unwrap(),
            );
            let seconds = p["seconds"].as_f64().unwrap();
            assert!(
                rate > 0.0 && (share - at / seconds).abs() < 1e-9 * share,
                "{p}"
            );
            sum += flops;
        }
        let total = report["gemm_flops"].as_f64().unwrap();
        assert!(
            (sum - total).abs() <= 1e-12 * total,
            "q = {power_iters}: passes {sum:e} against the run's {total:e}"
        );
    }
    // Without the flag, no probe and no section.
    no_machine_limit(&[
        "rsvd",
        "--rows",
        "3000",
        "--cols",
        "200",
        "--chunk-rows",
        "1000",
        "-k",
        "3",
    ]);
}
