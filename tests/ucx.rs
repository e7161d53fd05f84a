//! The `rankwise` binary under real `mpirun` with `--transport ucx`: the same bits as
//! `--transport mpi` for svd and rsvd on 2–4 ranks, over TCP and over shared memory, and
//! failures that end every rank.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::mpirun::{mpirun_command, run_with_timeout, RunOutput};
use common::*;

/// UCX transports of the tests: TCP over loopback (every container has it) and shared
/// memory (UCX 1.13's `sm`: posix, sysv and cma).
const TCP: &[(&str, &str)] = &[("UCX_TLS", "tcp,self"), ("UCX_NET_DEVICES", "lo")];
const SHM: &[(&str, &str)] = &[("UCX_TLS", "sm,self")];

fn mpirun_with(np: usize, args: &[String], env: &[(&str, &str)]) -> Command {
    mpirun_bin_with(&rankwise_bin(), np, args, env)
}

/// [`mpirun_with`] of `bin` (`rankwise-fault` for the failure tests).
fn mpirun_bin_with(
    bin: &std::path::Path,
    np: usize,
    args: &[String],
    env: &[(&str, &str)],
) -> Command {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = mpirun_command(np, bin, &args);
    for (key, value) in env {
        // The caller's environment wins, so a cluster can test its own devices.
        if std::env::var_os(key).is_none() {
            cmd.env(key, value);
        }
    }
    cmd
}

/// Shapes and bits of output arrays by name.
type Arrays = std::collections::BTreeMap<String, (Vec<u64>, Vec<u64>)>;

/// `mpirun -np np rankwise args… --transport transport --json --out out`: the report, and
/// the bits of S, U and Vᵀ.
fn run(
    np: usize,
    args: &[String],
    transport: &str,
    env: &[(&str, &str)],
    out: &Path,
) -> (serde_json::Value, Arrays) {
    let mut all = args.to_vec();
    all.extend(strings(&["--transport", transport, "--json", "--out"]));
    all.push(out.to_str().unwrap().to_string());
    let done = run_with_timeout(mpirun_with(np, &all, env), CLI_LIMIT);
    let r = report(&done);
    assert_eq!(r["transport"], transport, "{}", done.describe());
    assert!(!done.stderr.contains("UCX  ERROR"), "{}", done.describe());
    (r, group_bits(out, &["S", "U", "Vt"]))
}

#[test]
fn svd_and_rsvd_over_ucx_match_mpi_bit_for_bit() {
    let dir = scratch("ucx-bits");
    let mut draw = Draw(test_seed());
    let seed = draw.next().to_string();
    let svd = strings(&[
        "svd",
        "--rows",
        "20011",
        "--cols",
        "9",
        "--chunk-rows",
        "1500",
        "--seed",
        &seed,
        "--dist",
        "normal",
    ]);
    let rsvd = strings(&[
        "rsvd",
        "--rows",
        "6007",
        "--cols",
        "48",
        "--chunk-rows",
        "700",
        "--seed",
        &seed,
        "-k",
        "6",
        "--oversample",
        "4",
        "--power-iters",
        "1",
    ]);
    for (what, args) in [("svd", &svd), ("rsvd", &rsvd)] {
        for np in 2..=4 {
            let t = Instant::now();
            let (mpi_report, mpi) = run(
                np,
                args,
                "mpi",
                &[],
                &dir.join(format!("{what}-mpi{np}.zarr")),
            );
            for (tls, env) in [("tcp", TCP), ("shm", SHM)] {
                let out = dir.join(format!("{what}-{tls}{np}.zarr"));
                let (r, got) = run(np, args, "ucx", env, &out);
                assert_eq!(
                    json_bits(&r["singular_values"]),
                    json_bits(&mpi_report["singular_values"]),
                    "{what} np {np} {tls}: singular values differ from MPI's"
                );
                assert_eq!(r["ranks"].as_u64(), Some(np as u64));
                for name in ["S", "U", "Vt"] {
                    assert_eq!(
                        got[name].0, mpi[name].0,
                        "{what} np {np} {tls}: shape of {name}"
                    );
                    assert!(
                        got[name].1 == mpi[name].1,
                        "{what} np {np} {tls}: {name} differs from the MPI transport's"
                    );
                }
            }
            eprintln!("{what} np {np}: {:.2} s", t.elapsed().as_secs_f64());
        }
    }
}

#[test]
fn an_error_on_one_rank_ends_every_rank_with_its_message() {
    let dir = scratch("ucx-fail");
    let out = dir.join("r.zarr");
    let args = strings(&[
        "svd",
        "--rows",
        "50000",
        "--cols",
        "8",
        "--chunk-rows",
        "2000",
        "--transport",
        "ucx",
        "--out",
        out.to_str().unwrap(),
    ]);
    for env in [TCP, SHM] {
        let mut cmd = mpirun_bin_with(&rankwise_fault_bin(), 3, &args, env);
        cmd.env("RANKWISE_FAULT", "2:error");
        let run = run_with_timeout(cmd, Duration::from_secs(60));
        run.assert_finished();
        assert_ne!(run.code, Some(0), "{env:?}\n{}", run.describe());
        assert!(
            run.elapsed < Duration::from_secs(15),
            "{env:?}: took {:?}",
            run.elapsed
        );
        let line = "rankwise: rank 2 failed: RANKWISE_FAULT: injected input error on rank 2";
        let count = run.stderr.matches(line).count();
        assert!(
            count >= 3,
            "{env:?}: {count} ranks reported\n{}",
            run.describe()
        );
        assert!(!out.exists(), "a failed run left {}", out.display());
    }
}

/// Starts a long 3-rank rsvd over UCX with `env`, kills rank 1 with SIGKILL once it runs,
/// checks that the job ends within 30 s of the kill with no rank left, and returns the run.
fn kill_rank_1(env: &[(&str, &str)], marker: &str) -> RunOutput {
    let args = strings(&[
        "rsvd",
        "--rows",
        "4000000",
        "--cols",
        "200",
        "--chunk-rows",
        "100000",
        "-k",
        "10",
        "--power-iters",
        "6",
        "--memory-per-actor",
        "600M",
        "--transport",
        "ucx",
        "--seed",
        marker,
    ]);
    let cmd = mpirun_with(3, &args, env);
    let runner = std::thread::spawn(move || run_with_timeout(cmd, Duration::from_secs(90)));
    let start = Instant::now();
    let mut pids = Vec::new();
    while start.elapsed() < Duration::from_secs(30) {
        pids = rankwise_pids("rsvd", marker);
        if pids.len() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(pids.len(), 3, "{env:?}: the ranks did not start");
    std::thread::sleep(Duration::from_millis(1500));
    let victim = pids
        .iter()
        .copied()
        .find(|&pid| rank_of(pid) == Some(1))
        .unwrap_or(pids[1]);
    let killed_at = Instant::now();
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let run: RunOutput = runner.join().unwrap();
    let after = killed_at.elapsed();
    run.assert_finished();
    assert!(
        !run.stdout.contains("transport ucx"),
        "{env:?}: the run finished before the kill; make it longer\n{}",
        run.describe()
    );
    assert!(
        after < Duration::from_secs(30),
        "{env:?}: took {after:?} after the kill\n{}",
        run.describe()
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        rankwise_pids("rsvd", marker).is_empty(),
        "{env:?}: ranks left running"
    );
    run
}

/// The MPI rank of a process started by mpirun (`OMPI_COMM_WORLD_RANK`).
fn rank_of(pid: i32) -> Option<usize> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("OMPI_COMM_WORLD_RANK="))
        .and_then(|v| v.parse().ok())
}

/// A rank killed by SIGKILL in the middle of a long rsvd ends the job on every rank
/// within 30 s, over TCP and over shared memory.
#[test]
fn a_rank_killed_mid_run_ends_the_job_within_30_s() {
    for (i, env) in [TCP, SHM].into_iter().enumerate() {
        let marker = format!("{}", 2_000_000 + 10 * std::process::id() as u64 + i as u64);
        let run = kill_rank_1(env, &marker);
        assert_ne!(
            run.code,
            Some(0),
            "{env:?}: the run must fail\n{}",
            run.describe()
        );
        assert!(
            run.stderr.contains("signal 9") || run.stderr.contains("Killed"),
            "{env:?}: no word of the killed rank\n{}",
            run.describe()
        );
    }
}

/// The same with the launcher told to keep the job going (`orte_enable_recovery`): over
/// TCP, UCX's peer error handling notices the killed rank, and both survivors print a
/// line naming it. (mpirun's own exit status is then not the ranks', so it is not checked.)
#[test]
fn a_killed_rank_is_noticed_by_the_transport_itself() {
    let env = [TCP, &[("OMPI_MCA_orte_enable_recovery", "1")]].concat();
    let marker = format!("{}", 3_000_000 + 10 * std::process::id() as u64);
    let run = kill_rank_1(&env, &marker);
    let lines = run
        .stderr
        .lines()
        .filter(|l| l.starts_with("rankwise: rank ") && l.ends_with("rank 1 disconnected"))
        .count()
        .max(run.stderr.matches(" failed: rank 1 disconnected").count());
    assert!(
        lines >= 2,
        "expected both surviving ranks to name rank 1, got {lines}\n{}",
        run.describe()
    );
}
