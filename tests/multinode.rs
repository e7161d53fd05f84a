//! Ranks on several nodes: two network namespaces of this machine, each with its own
//! address and hostname, linked through a bridge (`tools/netns-cluster.sh`). `mpirun`
//! starts its daemons in them through the script, so Open MPI and UCX see two hosts and
//! talk over TCP between them: the results must have the bits of the embedded run, the
//! report must name each rank's node (under `mpirun`, and under `srun` of a Slurm with one
//! slurmd per node: `tools/netns-slurm.sh`), and losing a node (its ranks killed, or its link cut)
//! must end every other rank with a message instead of a hang.
//!
//! Needs root (network and UTS namespaces), as the Slurm tests do.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::mpirun::{run_with_timeout, RunOutput, OMPI_ENV};
use common::{embedded, rankwise_bin, scratch, strings, test_seed};
use rankwise::output::group::read_f64_array;
use serde_json::Value;

/// Node names (`rwt1`, `rwt2`) and subnet: not the script's defaults, so a cluster a user
/// brought up by hand is left alone.
const PREFIX: &str = "rwt";
const NET: &str = "10.78.0";

/// Held by each test for as long as its nodes are up: both use the same names.
static NODES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How long one run may take before the test gives up on it.
const LIMIT: Duration = Duration::from_secs(120);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/netns-cluster.sh")
}

fn cluster_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(script());
    cmd.args(args)
        .env("RANKWISE_NETNS_PREFIX", PREFIX)
        .env("RANKWISE_NETNS_NET", NET);
    cmd
}

/// The two nodes; dropping them (also while a failed check unwinds) removes them.
struct Nodes;

impl Nodes {
    fn up() -> Nodes {
        Nodes::up_with(&[])
    }

    /// The nodes, with the script's settings `env` (a link rate or delay).
    fn up_with(env: &[(&str, &str)]) -> Nodes {
        // Nodes left by a run of this test that was killed before its teardown.
        let _ = run_with_timeout(cluster_command(&["down"]), Duration::from_secs(30));
        let mut up = cluster_command(&["up", "2"]);
        up.envs(env.iter().copied());
        let run = run_with_timeout(up, Duration::from_secs(30));
        assert!(
            run.success(),
            "tools/netns-cluster.sh up failed: network namespaces cannot be made here (this \
             test needs root)\n{}",
            run.describe()
        );
        assert_nodes_run_cubic();
        Nodes
    }
}

/// Each node's TCP congestion control is CUBIC where the kernel has it: with BBR (some
/// kernels' default) a 300 KB MPI message over 5 ms links waited about 10 ms more than its
/// latencies and bytes, because BBR paces bursts at the rate it has seen.
fn assert_nodes_run_cubic() {
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    if !available.split_whitespace().any(|cc| cc == "cubic") {
        eprintln!("this kernel has no CUBIC ({available:?}): the nodes keep its default");
        return;
    }
    for i in 1..=2 {
        let node = format!("{PREFIX}{i}");
        let mut cat = Command::new("ip");
        cat.args(["netns", "exec", &node, "cat"])
            .arg("/proc/sys/net/ipv4/tcp_congestion_control");
        let run = run_with_timeout(cat, Duration::from_secs(10));
        run.assert_success();
        assert_eq!(
            run.stdout.trim(),
            "cubic",
            "{node}'s TCP congestion control"
        );
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let run = run_with_timeout(cluster_command(&["down"]), Duration::from_secs(30));
        if !run.success() {
            eprintln!("tools/netns-cluster.sh down failed:\n{}", run.describe());
        }
    }
}

/// Slurm on the nodes (`tools/netns-slurm.sh`); dropping it stops the daemons.
struct NodeSlurm {
    conf: PathBuf,
}

impl NodeSlurm {
    fn up() -> NodeSlurm {
        let run = run_with_timeout(slurm_command(&["up"]), Duration::from_secs(60));
        assert!(
            run.success(),
            "tools/netns-slurm.sh up failed\n{}",
            run.describe()
        );
        let env = run_with_timeout(slurm_command(&["env"]), Duration::from_secs(10));
        env.assert_success();
        let conf = env
            .stdout
            .trim()
            .strip_prefix("export SLURM_CONF=")
            .unwrap_or_else(|| panic!("netns-slurm.sh env: {}", env.stdout))
            .into();
        NodeSlurm { conf }
    }
}

impl Drop for NodeSlurm {
    fn drop(&mut self) {
        let run = run_with_timeout(slurm_command(&["down"]), Duration::from_secs(30));
        if !run.success() {
            eprintln!("tools/netns-slurm.sh down failed:\n{}", run.describe());
        }
    }
}

fn slurm_command(args: &[&str]) -> Command {
    let mut cmd =
        Command::new(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/netns-slurm.sh"));
    cmd.args(args)
        .env("RANKWISE_NETNS_PREFIX", PREFIX)
        .env("RANKWISE_NETNS_NET", NET);
    cmd
}

/// `mpirun` of 2 ranks on each node running `rankwise args…` (rank 0 and 1 on the first).
fn on_nodes(args: &[String], env: &[(&str, &str)]) -> Command {
    let setup = run_with_timeout(cluster_command(&["mpirun-args"]), Duration::from_secs(10));
    setup.assert_success();
    let mut cmd = Command::new("mpirun");
    cmd.args(setup.stdout.split_whitespace()).args([
        "--host",
        &format!("{PREFIX}1:2,{PREFIX}2:2"),
        "-np",
        "4",
        "--bind-to",
        "none",
    ]);
    // The ranks' environment: daemons started through the agent pass on only what `-x`
    // names (and Open MPI's own variables).
    for (key, value) in env {
        cmd.arg("-x").arg(format!("{key}={value}"));
    }
    cmd.arg(rankwise_bin()).args(args);
    // The one-node settings of the other MPI tests; the `--mca` options above win over
    // their shared-memory-only BTLs and loopback-only daemons.
    for (key, value) in OMPI_ENV {
        cmd.env(key, value);
    }
    cmd
}

fn report(run: &RunOutput) -> Value {
    // The report is the last thing on stdout, after any log lines of UCX.
    let at = run
        .stdout
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| run.stdout.starts_with('{').then_some(0))
        .unwrap_or_else(|| panic!("no JSON report\n{}", run.describe()));
    serde_json::from_str(&run.stdout[at..]).unwrap_or_else(|e| panic!("{e}\n{}", run.describe()))
}

/// The report places ranks 0 and 1 on the first node and ranks 2 and 3 on the second.
fn assert_two_ranks_per_node(r: &Value, what: &str) {
    let hosts: Vec<&str> = r["per_rank"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no per_rank in {r}"))
        .iter()
        .map(|x| x["hostname"].as_str().unwrap_or(""))
        .collect();
    let (n1, n2) = (format!("{PREFIX}1"), format!("{PREFIX}2"));
    assert_eq!(hosts, [&n1, &n1, &n2, &n2], "{what}: each rank's node");
}

fn assert_same_arrays(got: &Path, reference: &Path, names: &[&str], what: &str) {
    for name in names {
        let (gs, gv) = read_f64_array(got, name).unwrap_or_else(|e| panic!("{what}: {e}"));
        let (rs, rv) = read_f64_array(reference, name).unwrap();
        assert_eq!(gs, rs, "{what}: shape of {name}");
        let differ = gv
            .iter()
            .zip(&rv)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differ, 0,
            "{what}: {differ} values of {name} differ in their bits"
        );
    }
}

/// From Open MPI's BTL reporting (`btl_base_verbose` 100: "[host:pid] mca: bml: Using vader
/// btl for send to [[job,1],2] on node rwt2"): every rank sends to the ranks of its own
/// node through shared memory (`vader`) and to the other node's through `tcp`.
fn assert_shared_memory_inside_nodes_and_tcp_between(run: &RunOutput, what: &str) {
    let mut seen = std::collections::BTreeSet::new();
    for line in run.stdout.lines().chain(run.stderr.lines()) {
        let Some(at) = line.find("mca: bml: Using ") else {
            continue;
        };
        let host = line
            .strip_prefix('[')
            .and_then(|l| l.split(':').next())
            .unwrap_or("");
        let words: Vec<&str> = line[at..].split_whitespace().collect();
        // mca: bml: Using BTL btl for send to PEER on node NODE
        let (btl, peer_node) = (words[3], words[words.len() - 1]);
        if btl == "self" {
            continue;
        }
        let expected = if host == peer_node { "vader" } else { "tcp" };
        assert_eq!(btl, expected, "{what}: {line}");
        seen.insert((host.to_string(), btl.to_string()));
    }
    let want: std::collections::BTreeSet<(String, String)> = [1, 2]
        .iter()
        .flat_map(|n| ["tcp", "vader"].map(|b| (format!("{PREFIX}{n}"), b.to_string())))
        .collect();
    assert_eq!(
        seen,
        want,
        "{what}: each node's BTLs, from Open MPI's report\n{}",
        run.describe()
    );
}

#[test]
fn two_nodes_give_the_embedded_bits_and_losing_one_ends_every_rank() {
    let _one_at_a_time = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let start = Instant::now();
    let dir = scratch("multinode");
    let seed = test_seed().to_string();
    let nodes = Nodes::up();

    let cases: Vec<(&str, Vec<String>, &[&str])> = vec![
        (
            "svd",
            strings(&[
                "svd",
                "--rows",
                "24000",
                "--cols",
                "40",
                "--chunk-rows",
                "1500",
                "--seed",
                &seed,
            ]),
            &["S", "U", "Vt"],
        ),
        (
            "rsvd",
            strings(&[
                "rsvd",
                "--rows",
                "30000",
                "--cols",
                "60",
                "--chunk-rows",
                "2000",
                "--dist",
                "normal",
                "-k",
                "5",
                "--seed",
                &seed,
            ]),
            &["S", "U", "Vt", "residuals"],
        ),
        (
            "pca",
            strings(&[
                "pca",
                "--rows",
                "6000",
                "--cols",
                "120",
                "--chunk-rows",
                "500",
                "--populations",
                "3",
                "-k",
                "4",
                "--seed",
                &seed,
            ]),
            &["S", "U", "Vt", "eigenvalues"],
        ),
    ];
    for (name, args, arrays) in &cases {
        let reference = dir.join(format!("{name}-embedded.zarr"));
        let mut a = args.clone();
        a.extend(strings(&["--out", reference.to_str().unwrap()]));
        embedded(&a).assert_success();
        for transport in ["mpi", "ucx"] {
            let out = dir.join(format!("{name}-{transport}.zarr"));
            let mut a = args.clone();
            a.extend(strings(&[
                "--transport",
                transport,
                "--json",
                "--out",
                out.to_str().unwrap(),
            ]));
            // UCX names the transport of each endpoint it configures, and Open MPI's
            // BTL layer (at verbosity 100) the BTL it sends to each peer with.
            let mut cmd = on_nodes(&a, &[("UCX_LOG_LEVEL", "info")]);
            cmd.env("OMPI_MCA_btl_base_verbose", "100");
            let run = run_with_timeout(cmd, LIMIT);
            let what = format!("{name} over {transport} on 2 nodes × 2 ranks");
            assert!(run.success(), "{what}\n{}", run.describe());
            let r = report(&run);
            assert_eq!(r["ranks"], 4, "{what}: {r}");
            assert_eq!(r["transport"], transport, "{what}");
            assert_two_ranks_per_node(&r, &what);
            // Every rank's traffic, per phase and in all: what the ranks sent, they received.
            let ranks = r["per_rank"].as_array().unwrap();
            let total = |key: &str| -> u64 {
                ranks
                    .iter()
                    .map(|x| {
                        x["comm"][key]
                            .as_u64()
                            .unwrap_or_else(|| panic!("{what}: {x}"))
                    })
                    .sum()
            };
            assert_eq!(total("bytes_sent"), total("bytes_received"), "{what}: {r}");
            assert_eq!(total("messages_sent"), total("messages_received"), "{what}");
            for x in ranks {
                assert!(x["comm"]["messages_sent"].as_u64() > Some(0), "{what}: {x}");
                let phases = x["timings"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{what}: {x}"));
                let in_phases: u64 = phases
                    .iter()
                    .map(|p| p["comm"]["bytes_sent"].as_u64().unwrap())
                    .sum();
                assert!(
                    in_phases > 0 && in_phases <= x["comm"]["bytes_sent"].as_u64().unwrap(),
                    "{what}: the phases' traffic against the rank's: {x}"
                );
            }
            if transport == "mpi" {
                assert_shared_memory_inside_nodes_and_tcp_between(&run, &what);
            }
            if transport == "ucx" {
                // Between the nodes, UCX goes over TCP on the node's own interface.
                // (UCX logs on stdout.)
                assert!(
                    run.stdout.contains("tcp/eth0"),
                    "{what}: no UCX endpoint over tcp/eth0\n{}",
                    run.describe()
                );
            }
            assert_same_arrays(&out, &reference, arrays, &what);
            eprintln!("{what}: the embedded bits");
        }
    }
    // UCX 1.13 leaves shared memory aside when endpoints handle peer errors (the
    // default, which notices a killed peer at once); without that, each node's ranks talk
    // through shared memory.
    let out = dir.join("rsvd-ucx-shm.zarr");
    let mut a = cases[1].1.clone();
    a.extend(strings(&[
        "--transport",
        "ucx",
        "--out",
        out.to_str().unwrap(),
    ]));
    let run = run_with_timeout(
        on_nodes(
            &a,
            &[
                ("UCX_LOG_LEVEL", "info"),
                (rankwise::transports::ucx_comm::ERR_HANDLING_VAR, "none"),
            ],
        ),
        LIMIT,
    );
    let what = "rsvd over ucx without peer error handling";
    assert!(run.success(), "{what}\n{}", run.describe());
    for node in [format!("{PREFIX}1"), format!("{PREFIX}2")] {
        assert!(
            run.stdout.lines().any(|l| l.contains(&format!("[{node}:"))
                && l.contains("ep_cfg")
                && l.contains("/memory")),
            "{what}: no UCX endpoint through shared memory on {node}\n{}",
            run.describe()
        );
    }
    assert_same_arrays(&out, &dir.join("rsvd-embedded.zarr"), cases[1].2, what);

    // Slurm on the same nodes (tools/netns-slurm.sh): one slurmd per node, in its
    // namespace; srun places two ranks on each, and they give the embedded bits.
    {
        let slurm = NodeSlurm::up();
        let (name, args, arrays) = &cases[0];
        let out = dir.join(format!("{name}-srun.zarr"));
        let mut cmd = Command::new("srun");
        cmd.args(["-N", "2", "-n", "4", "--mpi=pmix"])
            .arg(rankwise_bin())
            .args(args)
            .args(["--json", "--out", out.to_str().unwrap()])
            .env("SLURM_CONF", &slurm.conf);
        // The one-node settings, but TCP between the nodes, over their subnet.
        for (key, value) in OMPI_ENV {
            cmd.env(key, value);
        }
        cmd.env("OMPI_MCA_btl", "self,vader,tcp")
            .env("OMPI_MCA_btl_tcp_if_include", format!("{NET}.0/24"))
            .env("OMPI_MCA_oob_tcp_if_include", format!("{NET}.0/24"));
        let run = run_with_timeout(cmd, LIMIT);
        let what = format!("{name} under srun on 2 slurmd nodes × 2 ranks");
        assert!(run.success(), "{what}\n{}", run.describe());
        let r = report(&run);
        assert_two_ranks_per_node(&r, &what);
        assert_same_arrays(
            &out,
            &dir.join(format!("{name}-embedded.zarr")),
            arrays,
            &what,
        );
        eprintln!("{what}: the embedded bits");

        // Ranks that cannot reach each other: shared memory only, across two nodes. Open
        // MPI says so but waits in MPI_Comm_dup for good; every rank must still end, within
        // --comm-timeout, naming itself.
        let mut cmd = Command::new("srun");
        cmd.args(["-N", "2", "-n", "4", "--mpi=pmix"])
            .arg(rankwise_bin())
            .args(args)
            .args(["--comm-timeout", "10"])
            .env("SLURM_CONF", &slurm.conf);
        for (key, value) in OMPI_ENV {
            cmd.env(key, value);
        }
        let started = std::time::Instant::now();
        let run = run_with_timeout(cmd, LIMIT);
        let what = "ranks without a common transport, under srun";
        run.assert_finished();
        assert!(!run.success(), "{what}\n{}", run.describe());
        let said = format!("{}{}", run.stdout, run.stderr);
        for rank in 0..4 {
            let line = format!("rankwise: rank {rank} (of 4) on ");
            assert!(
                said.lines()
                    .any(|l| l.starts_with(&line) && l.contains("MPI did not start within 10 s")),
                "{what}: no line of rank {rank}\n{}",
                run.describe()
            );
        }
        eprintln!("{what}: every rank ended in {:.1?}", started.elapsed());
    }

    // Losing a node: a long run, then node 2's ranks killed, or node 2's link cut.
    let long = strings(&[
        "rsvd",
        "--rows",
        "400000",
        "--cols",
        "200",
        "--chunk-rows",
        "10000",
        "--dist",
        "normal",
        "-k",
        "10",
        "--tol",
        "1e-15",
        "--max-passes",
        "10000",
        "--comm-timeout",
        "20",
    ]);
    let node2 = format!("{PREFIX}2");
    let ranks_on = |node: &str| -> Vec<i32> {
        let out = Command::new("ip")
            .args(["netns", "pids", node])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|p: &i32| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "rankwise")
            })
            .collect()
    };
    let all_ranks = || [ranks_on(&format!("{PREFIX}1")), ranks_on(&node2)].concat();
    for (fault, act) in [
        ("node 2's ranks killed", "kill"),
        ("node 2's link cut", "cut"),
    ] {
        let mut cmd = on_nodes(&long, &[]);
        cmd.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        // mpirun's stderr, read as it comes (it also carries the ranks').
        let pipe = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut text = String::new();
            let mut pipe = pipe;
            let _ = pipe.read_to_string(&mut text);
            text
        });
        // Until node 2's ranks run and a few passes have gone by.
        let waited = Instant::now();
        while ranks_on(&node2).len() < 2 || waited.elapsed() < Duration::from_secs(3) {
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "{fault}: node 2's ranks never started"
            );
            if let Ok(Some(s)) = child.try_wait() {
                panic!("{fault}: the run ended ({s}) before the fault");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let at = Instant::now();
        if act == "kill" {
            for p in ranks_on(&node2) {
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        } else {
            run_with_timeout(cluster_command(&["cut", &node2]), LIMIT).assert_success();
        }
        // Every rank ends: by the launcher's word, or by its own --comm-timeout (20 s) where
        // the launcher cannot reach node 2 either.
        while !all_ranks().is_empty() {
            if at.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!(
                    "{fault}: ranks still running 60 s after it: {:?}",
                    all_ranks()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let ended = at.elapsed();
        if act == "cut" {
            // mpirun itself waits on its daemon of node 2 until it hears from it again.
            run_with_timeout(cluster_command(&["mend", &node2]), LIMIT).assert_success();
        }
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if at.elapsed() > Duration::from_secs(120) {
                let _ = child.kill();
                panic!("{fault}: mpirun did not end within 120 s of it");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stderr = reader.join().unwrap();
        eprintln!(
            "{fault}: every rank ended {:.1} s after it, mpirun {:.1} s after it\n{stderr}",
            ended.as_secs_f64(),
            at.elapsed().as_secs_f64()
        );
        assert!(!status.success(), "{fault}: the run succeeded\n{stderr}");
        // The message names what was lost: a rank of node 2, or node 2 itself.
        assert!(
            ["rank 2", "rank 3", &node2]
                .iter()
                .any(|w| stderr.contains(w)),
            "{fault}: no message names rank 2, rank 3 or {node2}\n{stderr}"
        );
    }
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("all in {:.1} s", start.elapsed().as_secs_f64());
}

/// Links with a delay (`RANKWISE_NETNS_DELAY`, made by `tools/netdelay.py` where the kernel
/// has no `sch_netem`): a PCA to the default tolerance over MPI on 2 nodes × 2 ranks gives
/// the embedded run's bits, and its passes show the delay (each waits at least for one
/// message up and one down between the nodes, 4 ms each way).
#[test]
fn links_with_a_delay_give_the_embedded_bits_and_the_delay_shows() {
    let _one_at_a_time = NODES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("multinode-delay");
    let seed = test_seed().to_string();
    let args = strings(&[
        "pca",
        "--rows",
        "6000",
        "--cols",
        "300",
        "--chunk-rows",
        "500",
        "--populations",
        "3",
        "-k",
        "4",
        "--seed",
        &seed,
    ]);
    let reference = dir.join("embedded.zarr");
    let mut a = args.clone();
    a.extend(strings(&["--out", reference.to_str().unwrap()]));
    embedded(&a).assert_success();
    let nodes = Nodes::up_with(&[("RANKWISE_NETNS_DELAY", "2ms")]);
    let out = dir.join("delayed.zarr");
    let mut a = args.clone();
    a.extend(strings(&[
        "--transport",
        "mpi",
        "--json",
        "--out",
        out.to_str().unwrap(),
    ]));
    let run = run_with_timeout(on_nodes(&a, &[]), LIMIT);
    let what = "pca over mpi on 2 nodes × 2 ranks, links 2 ms";
    assert!(run.success(), "{what}\n{}", run.describe());
    let r = report(&run);
    assert_two_ranks_per_node(&r, what);
    assert_same_arrays(&out, &reference, &["S", "U", "Vt", "eigenvalues"], what);
    let passes = r["passes"].as_f64().unwrap();
    let seconds = r["seconds"].as_f64().unwrap();
    assert!(
        seconds > passes * 2.0 * 4e-3,
        "{what}: {passes} passes in {seconds} s, less than the delay alone"
    );
    drop(nodes);
}
