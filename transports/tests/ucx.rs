//! The UCX transport under a real `mpirun` with several processes, over TCP and over
//! shared memory.
//!
//! Each test runs the example `ucx_selftest` (built by `cargo test`) under `mpirun -np P`
//! with `UCX_TLS` set, with a hard time limit, and checks exit codes and the lines it
//! prints. Open MPI itself keeps to its own shared memory (`rankwise_testkit::process::OMPI_ENV`: pml ob1,
//! btl self,vader), so its UCX components never compete with ours for the devices.

use std::time::Duration;

use rankwise_testkit::process::{
    example_binary, mem_available, mpirun_command, run_with_timeout, RunOutput,
};

const LIMIT: Duration = Duration::from_secs(60);

/// UCX transports of the tests: TCP (over loopback, which every container has) and shared
/// memory (UCX 1.13's `sm` alias: posix, sysv and cma).
const TCP: &[(&str, &str)] = &[("UCX_TLS", "tcp,self"), ("UCX_NET_DEVICES", "lo")];
const SHM: &[(&str, &str)] = &[("UCX_TLS", "sm,self")];

fn selftest(np: usize, mode: &[&str], env: &[(&str, &str)], limit: Duration) -> RunOutput {
    let mut cmd = mpirun_command(np, &example_binary("ucx_selftest"), mode);
    for (key, value) in env {
        // The caller's environment wins, so a cluster can test its own devices.
        if std::env::var_os(key).is_none() {
            cmd.env(key, value);
        }
    }
    run_with_timeout(cmd, limit)
}

fn basic(np: usize, env: &[(&str, &str)]) {
    let out = selftest(np, &["basic"], env, LIMIT);
    out.assert_success()
        .assert_stdout_contains(&format!("SELFTEST PASSED size={np} transport=ucx"));
    for rank in 0..np {
        out.assert_stdout_contains(&format!("rank {rank} basic OK"));
    }
    assert!(!out.stderr.contains("UCX  ERROR"), "{}", out.describe());
}

#[test]
fn basic_over_tcp_np2_to_4() {
    for np in 2..=4 {
        basic(np, TCP);
    }
}

#[test]
fn basic_over_shared_memory_np2_to_4() {
    for np in 2..=4 {
        basic(np, SHM);
    }
}

/// The default transports (whatever UCX picks) on one rank and on two, with peer error
/// handling (UCX 1.13 then picks TCP on one node) and without (shared memory).
#[test]
fn basic_with_default_transports() {
    basic(1, &[]);
    basic(2, &[]);
    basic(2, &[("RANKWISE_UCX_ERR_HANDLING", "none")]);
}

/// 256 MiB and more each way between two ranks, both sending before receiving; every
/// byte is checked. About 1.2 GB of memory in all; where less than 2 GiB is available the
/// exchange is 16 MiB and a tail instead (still far above UCX's eager sizes, so the same
/// rendezvous path), and where even that cannot fit the test fails, saying so.
fn big(env: &[(&str, &str)]) {
    let avail = mem_available();
    let bytes: usize = match avail {
        Some(a) if a < 256 << 20 => panic!(
            "the big-message exchange needs about 100 MB of memory even at its smaller size; \
             {} MB available",
            a >> 20
        ),
        Some(a) if a < 2 << 30 => {
            eprintln!(
                "{} MB available: exchanging 16 MiB and a tail instead of 256 MiB",
                a >> 20
            );
            (16 << 20) + 12_345
        }
        _ => (256 << 20) + 12_345,
    };
    let arg = bytes.to_string();
    let out = selftest(2, &["big", &arg], env, Duration::from_secs(120));
    out.assert_success();
    for rank in 0..2 {
        out.assert_stdout_contains(&format!("rank {rank} BIG OK bytes={bytes}"));
    }
}

#[test]
fn large_buffers_are_intact_over_tcp() {
    big(TCP);
}

#[test]
fn large_buffers_are_intact_over_shared_memory() {
    big(SHM);
}

#[test]
fn abort_reaches_every_rank() {
    for (np, env) in [(2, TCP), (3, SHM), (4, TCP)] {
        let out = selftest(np, &["abort"], env, LIMIT);
        out.assert_finished();
        assert_ne!(
            out.code,
            Some(0),
            "abort must fail the job\n{}",
            out.describe()
        );
        let failed = np - 1;
        for rank in 0..np {
            out.assert_stdout_contains(&format!(
                "rank {rank} FAILED: rank {failed} failed: injected failure"
            ));
        }
        // The receives wait up to 60 s; only the notice can end them this early.
        assert!(
            out.elapsed < Duration::from_secs(30),
            "the failure took too long to reach every rank\n{}",
            out.describe()
        );
    }
}

/// A rank that dies without a word (SIGKILL) while the others wait for its message: with
/// UCX's peer error handling (TCP) the transport itself notices, at once, and the first
/// rank to notice tells the rest. The launcher is told to keep the job going
/// (`orte_enable_recovery`), so that the detection is the transport's; its exit status is
/// then not the ranks', so only their lines and the time are checked.
#[test]
fn a_vanished_peer_is_noticed_by_the_transport() {
    let env = [TCP, &[("OMPI_MCA_orte_enable_recovery", "1")]].concat();
    let out = selftest(3, &["vanish"], &env, LIMIT);
    out.assert_finished();
    for rank in [0, 2] {
        let noticed = out
            .stdout
            .lines()
            .any(|l| l.starts_with(&format!("rank {rank} ")) && l.ends_with("rank 1 disconnected"));
        assert!(
            noticed,
            "rank {rank} did not report rank 1\n{}",
            out.describe()
        );
    }
    assert!(
        out.elapsed < Duration::from_secs(20),
        "noticing the vanished rank took too long\n{}",
        out.describe()
    );
}
