//! The `rankwise` binary under real `mpirun` with several processes: bit-identical results
//! for any rank count, and failures that end every rank.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::mpirun::{self, mpirun, mpirun_command, run_with_timeout};
use common::*;
use rankwise::output::read_f64_array;

type Bits = (Vec<u64>, Vec<u64>, Vec<u64>);

fn read_bits(dir: &Path) -> Bits {
    let bits = |name| {
        read_f64_array(dir, name)
            .unwrap()
            .1
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    (bits("S"), bits("U"), bits("Vt"))
}

fn embedded(args: &[&str], out: &Path) -> Bits {
    let mut cmd = Command::new(rankwise_bin());
    cmd.arg("svd").args(args).arg("--out").arg(out);
    run_with_timeout(cmd, Duration::from_secs(120)).assert_success();
    read_bits(out)
}

fn under_mpirun(np: usize, args: &[&str], out: &Path) -> Bits {
    let mut all = vec!["svd", "--out", out.to_str().unwrap()];
    all.extend(args);
    let run = mpirun(np, &rankwise_bin(), &all, Duration::from_secs(120));
    run.assert_success();
    assert!(run.stdout.contains("transport mpi"), "{}", run.describe());
    read_bits(out)
}

#[test]
fn mpirun_1_to_4_ranks_match_the_embedded_run_bit_for_bit() {
    let dir = scratch("mpi-bits");
    let seed = test_seed().to_string();
    let shapes: [[&str; 6]; 3] = [
        // 14 panels, the last one ragged.
        ["--rows", "20011", "--cols", "9", "--chunk-rows", "1500"],
        // 3 panels: with 4 ranks one rank owns nothing.
        ["--rows", "1000", "--cols", "16", "--chunk-rows", "400"],
        // Short and fat, through the transpose: 5 column panels.
        ["--rows", "7", "--cols", "50", "--chunk-rows", "12"],
    ];
    for (i, shape) in shapes.iter().enumerate() {
        let mut args: Vec<&str> = shape.to_vec();
        args.extend(["--seed", &seed, "--dist", "normal"]);
        let reference = embedded(&args, &dir.join(format!("ref{i}.zarr")));
        for np in 1..=4 {
            let got = under_mpirun(np, &args, &dir.join(format!("s{i}-np{np}.zarr")));
            assert_eq!(got.0, reference.0, "{shape:?} np {np}: S differs");
            assert_eq!(got.1, reference.1, "{shape:?} np {np}: U differs");
            assert_eq!(got.2, reference.2, "{shape:?} np {np}: Vᵀ differs");
        }
    }
}

#[test]
fn two_ranks_of_two_actors_equal_one_rank_of_four() {
    let dir = scratch("mpi-mixed");
    let seed = test_seed().to_string();
    let args = [
        "--rows",
        "30001",
        "--cols",
        "12",
        "--chunk-rows",
        "2000",
        "--seed",
        &seed,
    ];
    let mut one = args.to_vec();
    one.extend(["--actors", "4"]);
    let reference = embedded(&one, &dir.join("one.zarr"));
    let mut two = args.to_vec();
    two.extend(["--actors", "2"]);
    assert_eq!(under_mpirun(2, &two, &dir.join("two.zarr")), reference);
}

/// The report's frame under `mpirun`: one typed `per_rank` entry per rank with its own
/// figures, and the provenance of the run (build, argv, start time, BLAS and MPI).
#[test]
fn the_report_says_which_build_ran_how_and_on_what() {
    let dir = scratch("mpi-report");
    let out = dir.join("r.zarr");
    let seed = test_seed().to_string();
    let args = [
        "rsvd",
        "--rows",
        "4001",
        "--cols",
        "40",
        "--chunk-rows",
        "500",
        "-k",
        "4",
        "--seed",
        &seed,
        "--out",
        out.to_str().unwrap(),
        "--json",
    ];
    let before = std::time::SystemTime::now();
    let run = mpirun(3, &rankwise_bin(), &args, Duration::from_secs(120));
    run.assert_success();
    let printed: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("zarr.json")).unwrap()).unwrap();
    let stored = meta["attributes"]["report"].clone();
    assert_eq!(printed, stored, "--json and the group's report differ");
    let r = stored;
    assert_eq!(r["command"], "rsvd");
    assert_eq!(r["transport"], "mpi");
    assert_eq!(r["ranks"], 3);
    let per_rank = r["per_rank"].as_array().unwrap();
    let ranks: Vec<u64> = per_rank
        .iter()
        .map(|x| x["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(ranks, [0, 1, 2]);
    let produced: u64 = per_rank
        .iter()
        .map(|x| x["bytes_produced"].as_u64().unwrap())
        .sum();
    assert!(produced >= 4001 * 40 * 8, "{r}");
    for x in per_rank {
        assert!(x["peak_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{x}");
        assert!(!x["timings"].as_array().unwrap().is_empty(), "{x}");
    }
    let p = &r["rankwise"];
    assert_eq!(p["version"], env!("CARGO_PKG_VERSION"));
    let revision = p["revision"].as_str().unwrap();
    assert!(
        revision == "unknown" || revision.chars().all(|c| c.is_ascii_hexdigit()),
        "{revision}"
    );
    let argv: Vec<&str> = p["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&argv[1..], &args[..], "argv");
    // RFC 3339 to the second, UTC, not before the test started (allowing the second cut).
    let started = humantime::parse_rfc3339(p["started"].as_str().unwrap()).unwrap();
    assert!(started + Duration::from_secs(1) >= before, "{p}");
    assert!(p["blas"].as_str().unwrap().contains("OpenBLAS"), "{p}");
    assert!(p["mpi"].as_str().unwrap().contains("Open MPI"), "{p}");
}

/// Every rank prints the same failure line.
fn assert_every_rank_reports(run: &mpirun::RunOutput, np: usize, line: &str) {
    // Occurrences, not lines: the launcher may merge two ranks' lines into one.
    let count = run.stderr.matches(line).count();
    assert!(
        count >= np,
        "expected {np} ranks to print {line:?}, got {count}\n{}",
        run.describe()
    );
}

/// `mpirun -np np` of the failure tests' binary with `RANKWISE_FAULT=fault`, which must end
/// non-zero within a minute.
fn with_fault(np: usize, args: &[&str], fault: &str) -> mpirun::RunOutput {
    let mut cmd = mpirun_command(np, &rankwise_fault_bin(), args);
    cmd.env("RANKWISE_FAULT", fault);
    let run = run_with_timeout(cmd, Duration::from_secs(60));
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{fault}\n{}", run.describe());
    run
}

#[test]
fn an_error_or_panic_on_one_rank_ends_every_rank_with_its_message() {
    let dir = scratch("mpi-fail");
    let out = dir.join("r.zarr");
    for (fault, line) in [
        (
            "2:error",
            "rankwise: rank 2 failed: RANKWISE_FAULT: injected input error on rank 2",
        ),
        (
            "1:panic:before-svd",
            "rankwise: rank 1 failed: panic: injected panic on rank 1",
        ),
        (
            "0:error:after-svd",
            "rankwise: rank 0 failed: RANKWISE_FAULT: injected input error on rank 0",
        ),
    ] {
        let run = with_fault(
            3,
            &[
                "svd",
                "--rows",
                "50000",
                "--cols",
                "8",
                "--chunk-rows",
                "2000",
                "--out",
                out.to_str().unwrap(),
            ],
            fault,
        );
        assert!(
            run.elapsed < Duration::from_secs(10),
            "{fault}: took {:?}",
            run.elapsed
        );
        assert_every_rank_reports(&run, 3, line);
        assert!(
            !out.exists(),
            "{fault}: a failed run left {}",
            out.display()
        );
    }
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.is_empty(), "left behind: {names:?}");
}

/// A failure on rank 0 while it writes a PCA's side files (`.eigenvec`, `.eigenval`, the
/// plot, the projection files), after the other ranks finished their part: every rank
/// exits non-zero with rank 0's message, and no temporary is left (the other ranks exited
/// 0, and the side file that broke off stayed, before).
#[test]
fn a_failure_writing_the_side_files_ends_every_rank_and_leaves_nothing() {
    let dir = scratch("mpi-side-files");
    let out = dir.join("p.zarr");
    for (fault, line) in [
        (
            "0:error:side-files",
            "rank 0 failed: RANKWISE_FAULT: injected input error on rank 0",
        ),
        (
            "0:panic:side-files",
            "rank 0 failed: panic: injected panic on rank 0",
        ),
    ] {
        let run = with_fault(
            2,
            &[
                "pca",
                "--rows",
                "2000",
                "--cols",
                "60",
                "--chunk-rows",
                "500",
                "-k",
                "3",
                "--out",
                out.to_str().unwrap(),
            ],
            fault,
        );
        assert_every_rank_reports(&run, 2, line);
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(names.is_empty(), "{fault}: left behind: {names:?}");
    }
}

#[test]
fn bad_input_is_reported_by_every_rank() {
    let run = mpirun(
        4,
        &rankwise_bin(),
        &["svd", "--rows", "1000", "--cols", "5", "--chunk-rows", "0"],
        Duration::from_secs(60),
    );
    run.assert_finished();
    assert_ne!(run.code, Some(0));
    assert!(run.elapsed < Duration::from_secs(10));
    assert_every_rank_reports(&run, 4, "--chunk-rows: panels need at least one row");
}

#[test]
fn a_rank_killed_by_sigkill_ends_the_job() {
    // A run long enough to be killed in the middle: regenerated panels, two passes.
    let marker = format!("{}", 1_000_000 + std::process::id());
    let args = [
        "svd",
        "--rows",
        "40000000",
        "--cols",
        "20",
        "--chunk-rows",
        "500000",
        "--memory-per-actor",
        "600M",
        "--seed",
        &marker,
    ];
    let cmd = mpirun_command(3, &rankwise_bin(), &args);
    let runner = std::thread::spawn(move || run_with_timeout(cmd, Duration::from_secs(90)));
    let start = Instant::now();
    let mut pids = Vec::new();
    while start.elapsed() < Duration::from_secs(30) {
        pids = rankwise_pids("svd", &marker);
        if pids.len() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pids.len(), 3, "the ranks did not start");
    std::thread::sleep(Duration::from_millis(1500));
    let victim = pids[1];
    let killed_at = Instant::now();
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let run = runner.join().unwrap();
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{}", run.describe());
    assert!(
        killed_at.elapsed() < Duration::from_secs(30),
        "took {:?} after the kill",
        killed_at.elapsed()
    );
    assert!(
        run.stderr.contains("signal 9") || run.stderr.contains("Killed"),
        "{}",
        run.describe()
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        rankwise_pids("svd", &marker).is_empty(),
        "ranks left running after the job ended"
    );
}

#[test]
fn an_mpi_program_can_hand_rankwise_its_communicator() {
    let example = rankwise_bin()
        .parent()
        .unwrap()
        .join("examples")
        .join("embed_mpi");
    assert!(
        example.exists(),
        "{} missing: `make build` builds the examples",
        example.display()
    );
    let args = ["12001", "6", "1000", "77"];
    let run = mpirun(2, &example, &args, Duration::from_secs(60));
    run.assert_success();
    let got: Vec<u64> = run
        .stdout
        .lines()
        .map(|l| l.trim().parse::<f64>().unwrap().to_bits())
        .collect();
    let mut cmd = Command::new(rankwise_bin());
    cmd.args([
        "svd",
        "--rows",
        "12001",
        "--cols",
        "6",
        "--chunk-rows",
        "1000",
        "--seed",
        "77",
        "--json",
    ]);
    let run = run_with_timeout(cmd, Duration::from_secs(60));
    run.assert_success();
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let want: Vec<u64> = report["singular_values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap().to_bits())
        .collect();
    assert_eq!(
        got, want,
        "σ from the embedding program differ from the CLI's"
    );
}

/// The sizing model's messages are the ones the code sends: `rankwise plan --nodes 1
/// --ranks-per-node 4` against the bytes that the busiest of 4 ranks under `mpirun`
/// reports sending, for the exact SVD's tree and for one power iteration of rsvd (its
/// sketch's R factors and the sum of B). The model counts the blocks' values.
#[test]
fn the_sizing_models_messages_are_those_the_ranks_send() {
    let dir = scratch("mpi-sizing");
    std::fs::create_dir_all(&dir).unwrap();
    let rates = dir.join("rates.json");
    let out = Command::new(rankwise_bin())
        .args([
            "calibrate",
            "-q",
            "--device",
            "cpu",
            "--values",
            "262144",
            "--out",
        ])
        .arg(&rates)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let predicted = |job: &str, shape: &[&str]| -> serde_json::Value {
        let out = Command::new(rankwise_bin())
            .arg("plan")
            .args(shape)
            .args([
                "--nodes",
                "1",
                "--ranks-per-node",
                "4",
                "--network",
                "10,10us",
            ])
            .args(["--job", job, "--passes", "4", "--json", "--calibration"])
            .arg(&rates)
            // The measured rsvd runs fixed power iterations.
            .args(["--solver", "power-iters"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // The busiest rank's bytes in the phases whose names start with one of `phases`.
    let busiest = |r: &serde_json::Value, phases: &[&str]| -> (u64, u64) {
        r["per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|rank| {
                rank["timings"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|t| {
                        phases
                            .iter()
                            .any(|p| t["phase"].as_str().unwrap().starts_with(p))
                    })
                    .fold((0, 0), |(b, m), t| {
                        (
                            b + t["comm"]["bytes_sent"].as_u64().unwrap(),
                            m + t["comm"]["messages_sent"].as_u64().unwrap(),
                        )
                    })
            })
            .max()
            .unwrap()
    };
    let close = |what: &str, model: u64, (bytes, messages): (u64, u64)| {
        // Headers, and the few values that travel with a block (B's carries its
        // sketch's column norms): at most 64 bytes a message and 1 % in all.
        let extra = 64 * messages + model / 100;
        assert!(
            model <= bytes && bytes <= model + extra,
            "{what}: the model says {model} bytes, the busiest rank sent {bytes} in {messages} messages"
        );
    };
    // `rankwise HEAD… SHAPE…` on 4 ranks over MPI: its report.
    let measured = |head: &[&str], shape: &[&str]| {
        let tail = ["--dist", "normal", "--transport", "mpi", "--json", "-q"];
        report(&common::under_mpirun(
            4,
            &strings(&[head, &tail[..], shape].concat()),
        ))
    };
    let shape = ["--rows", "40000", "--cols", "24", "--chunk-rows", "2500"];
    let svd = measured(&["svd"], &shape);
    let model = predicted("svd", &shape);
    close(
        "svd tree",
        model["phases"][1]["bytes_sent"].as_u64().unwrap(),
        busiest(&svd, &["tree", "SVD of R"]),
    );
    let shape = [
        "--rows",
        "40000",
        "--cols",
        "300",
        "--chunk-rows",
        "2500",
        "-k",
        "10",
    ];
    let rsvd = measured(&["rsvd", "--power-iters", "2"], &shape);
    let model = predicted("rsvd", &shape);
    close(
        "an rsvd power iteration",
        model["phases"][1]["bytes_sent"].as_u64().unwrap(),
        busiest(&rsvd, &["iteration 1:"]),
    );
}

/// The run report accounts for communication phase by phase: what each rank sends and
/// receives in all is what its phases say, but for the plan's agreement before the first
/// phase (a few bytes). A message outside every phase's clock once hid LOBPCG's broadcast
/// of each search block (13 MB in a 44-pass run showed as 56 bytes).
#[test]
fn every_message_a_rank_sends_is_in_one_of_its_phases() {
    let rsvd = [
        "rsvd",
        "--rows",
        "20000",
        "--cols",
        "400",
        "--chunk-rows",
        "2000",
        "-k",
        "5",
    ];
    let fixed = [&rsvd[..], &["--power-iters", "2"]].concat();
    let jobs: [&[&str]; 4] = [
        &[
            "svd",
            "--rows",
            "60000",
            "--cols",
            "20",
            "--chunk-rows",
            "5000",
        ],
        &rsvd,
        &fixed,
        &[
            "pca",
            "--rows",
            "6000",
            "--cols",
            "300",
            "--chunk-rows",
            "500",
            "-k",
            "4",
        ],
    ];
    for job in jobs {
        let mut args = job.to_vec();
        args.extend(["--transport", "mpi", "--json", "-q"]);
        let r = report(&common::under_mpirun(3, &strings(&args)));
        for rank in r["per_rank"].as_array().unwrap() {
            let total = &rank["comm"];
            let phases = rank["timings"].as_array().unwrap();
            for (field, slack) in [
                ("bytes_sent", 1024),
                ("bytes_received", 1024),
                ("messages_sent", 4),
                ("messages_received", 4),
            ] {
                let all = total[field].as_u64().unwrap();
                let counted: u64 = phases
                    .iter()
                    .map(|t| t["comm"][field].as_u64().unwrap())
                    .sum();
                assert!(
                    counted <= all && all - counted <= slack,
                    "{}: rank {} {field}: {all} in all, {counted} in its phases",
                    job.join(" "),
                    rank["rank"]
                );
            }
        }
    }
}
