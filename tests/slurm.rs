//! The job scripts of `slurm/` under a real Slurm: `slurm/local-cluster.sh` brings up a
//! one-node cluster on localhost, each script is submitted with `sbatch` as users submit it
//! (its `#SBATCH` lines overridden on the command line, its parameters in the environment),
//! and its results must be the embedded run's, bit for bit. `srun -n 4 rankwise` is run
//! directly as well, and a job with a wrong input must end FAILED, with rankwise's error in
//! its output file, within seconds. The cluster is torn down at the end, also when a check
//! fails, and nothing of it may be left running.
//!
//! Needs the packages of `scripts/install-deps.sh` (Slurm, munge, libpmix-dev) and the
//! release binary (`make test` builds both). Where Slurm's daemons cannot run, the test fails
//! and says why: it never passes without having run the jobs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::mpirun::{run_with_timeout, RunOutput, OMPI_ENV};
use common::*;
use serde_json::Value;

/// The checkout: the scripts live in `slurm/` and `scripts/` of it.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The port of this test's controller (its slurmd takes the next one): not Slurm's usual
/// 6817, so a workstation's own Slurm, or a cluster of `local-cluster.sh up`, is left alone.
const PORT: &str = "6827";

/// How long one job may take from `sbatch` to its end before the test gives up on it.
const JOB_LIMIT: Duration = Duration::from_secs(120);

/// The one-node cluster of `slurm/local-cluster.sh`; dropping it (also while a failed check
/// unwinds) tears it down.
struct Cluster {
    state: PathBuf,
    conf: PathBuf,
    down: bool,
}

impl Cluster {
    fn up() -> Cluster {
        let state = std::env::temp_dir().join("rankwise-slurm-test");
        // A cluster left by a run of this test that was killed before its teardown.
        let _ = local_cluster(&state, "down");
        let run = local_cluster(&state, "up");
        assert!(
            run.success(),
            "slurm/local-cluster.sh up failed: Slurm's daemons cannot run here, so the Slurm \
             job scripts cannot be tested (scripts/install-deps.sh installs Slurm)\n{}",
            run.describe()
        );
        let conf = state.join("slurm.conf");
        assert!(
            run.stdout
                .contains(&format!("export SLURM_CONF={}", conf.display())),
            "{}",
            run.describe()
        );
        Cluster {
            state,
            conf,
            down: false,
        }
    }

    /// The pids of the daemons, from their PID files.
    fn daemons(&self) -> Vec<(String, u32)> {
        ["munged", "slurmctld", "slurmd"]
            .iter()
            .filter_map(|name| {
                let text = std::fs::read_to_string(self.state.join(format!("run/{name}.pid")));
                Some((name.to_string(), text.ok()?.trim().parse().ok()?))
            })
            .collect()
    }

    /// A Slurm command for this cluster. Slurm variables of an allocation the test itself may
    /// run in are dropped (they would point `srun` at that job), and Open MPI gets the
    /// settings of the mpirun tests: ranks as root, shared memory only.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("SLURM_") {
                cmd.env_remove(&key);
            }
        }
        cmd.env("SLURM_CONF", &self.conf);
        for (key, value) in OMPI_ENV {
            if std::env::var_os(key).is_none() {
                cmd.env(key, value);
            }
        }
        cmd
    }

    /// Submits `script` from `dir` with `options` before it and `env` added to the job's
    /// environment; the output file is `dir/NAME-JOBID.out`.
    fn sbatch(
        &self,
        dir: &Path,
        name: &str,
        script: &Path,
        options: &[&str],
        env: &[(&str, String)],
    ) -> Job {
        let mut cmd = self.command("sbatch");
        cmd.current_dir(dir)
            .arg("--parsable")
            .arg(format!("--output={}/{name}-%j.out", dir.display()))
            // Every job of the test shares the node's CPUs, whatever the script asks for.
            .arg("--oversubscribe")
            .args(options)
            .arg(script);
        for (key, value) in env {
            cmd.env(key, value);
        }
        let submitted = Instant::now();
        let run = run_with_timeout(cmd, Duration::from_secs(30));
        run.assert_success();
        let id = run
            .stdout
            .trim()
            .split(';')
            .next()
            .unwrap_or("")
            .to_string();
        assert!(
            !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()),
            "sbatch printed no job id\n{}",
            run.describe()
        );
        Job {
            output: dir.join(format!("{name}-{id}.out")),
            name: name.to_string(),
            id,
            submitted,
        }
    }

    /// Waits for `job` to end (polling `scontrol`; finished jobs stay visible for
    /// MinJobAge) and returns how it ended.
    fn wait(&self, job: &Job) -> Ended {
        loop {
            let mut cmd = self.command("scontrol");
            cmd.args(["show", "job", "--oneliner", &job.id]);
            let run = run_with_timeout(cmd, Duration::from_secs(30));
            let field = |name: &str| {
                run.stdout
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or("")
                    .to_string()
            };
            let state = field("JobState=");
            let ended = [
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "OUT_OF_MEMORY",
                "BOOT_FAIL",
                "DEADLINE",
                "PREEMPTED",
            ];
            if ended.contains(&state.as_str()) {
                return Ended {
                    elapsed: job.submitted.elapsed(),
                    state,
                    exit_code: field("ExitCode="),
                    output: std::fs::read_to_string(&job.output).unwrap_or_else(|e| {
                        format!("(no output file {}: {e})", job.output.display())
                    }),
                };
            }
            if job.submitted.elapsed() > JOB_LIMIT {
                let mut cancel = self.command("scancel");
                cancel.arg(&job.id);
                let _ = run_with_timeout(cancel, Duration::from_secs(30));
                panic!(
                    "job {} ({}) did not end within {JOB_LIMIT:?}: {}\n{}",
                    job.id,
                    job.name,
                    run.stdout,
                    std::fs::read_to_string(&job.output).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for `job`, which must end FAILED, and says how long it took.
    fn wait_failed(&self, job: &Job, what: &str) -> Ended {
        let ended = self.wait(job);
        eprintln!(
            "{what}: {} after {:.2} s",
            ended.state,
            ended.elapsed.as_secs_f64()
        );
        assert_eq!(ended.state, "FAILED", "{what}\n{}", ended.output);
        ended
    }

    /// Stops the cluster and checks that none of its processes is left.
    fn down(mut self) {
        let daemons = self.daemons();
        assert_eq!(daemons.len(), 3, "PID files: {daemons:?}");
        self.down = true;
        let run = local_cluster(&self.state, "down");
        assert!(run.success(), "{}", run.describe());
        let left: Vec<String> = daemons
            .iter()
            .filter(|(_, pid)| Path::new(&format!("/proc/{pid}")).exists())
            .map(|(name, pid)| format!("{name} (pid {pid})"))
            .chain(processes_named("slurmstepd"))
            .collect();
        assert!(left.is_empty(), "left running after down: {left:?}");
        let status = local_cluster(&self.state, "status");
        assert!(
            !status.success(),
            "status after down\n{}",
            status.describe()
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.down {
            let run = local_cluster(&self.state, "down");
            eprintln!("torn down after a failed check:\n{}", run.describe());
        }
    }
}

/// `slurm/local-cluster.sh ACTION` for the cluster whose state is in `state`.
fn local_cluster(state: &Path, action: &str) -> RunOutput {
    let mut cmd = Command::new(repo().join("slurm/local-cluster.sh"));
    cmd.arg(action)
        .env("RANKWISE_SLURM_DIR", state)
        .env("RANKWISE_SLURM_PORT", PORT);
    run_with_timeout(cmd, Duration::from_secs(120))
}

/// `slurmstepd: [JOB.STEP]` processes, which run a job's steps.
fn processes_named(comm: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == comm) {
            found.push(format!("{comm} (pid {name})"));
        }
    }
    found
}

struct Job {
    id: String,
    name: String,
    output: PathBuf,
    submitted: Instant,
}

/// How a job ended.
struct Ended {
    state: String,
    exit_code: String,
    /// From `sbatch` to the end as `scontrol` saw it.
    elapsed: Duration,
    /// Its output file (stdout and stderr).
    output: String,
}

impl Ended {
    fn assert_completed(&self, job: &Job) -> &Self {
        assert_eq!(
            (self.state.as_str(), self.exit_code.as_str()),
            ("COMPLETED", "0:0"),
            "job {} ({}) did not complete\n{}",
            job.id,
            job.name,
            self.output
        );
        self
    }
}

fn assert_same_arrays(got: &Path, reference: &Path, names: &[&str], what: &str) {
    let (got, want) = (group_bits(got, names), group_bits(reference, names));
    for name in names {
        assert_eq!(got[*name].0, want[*name].0, "{what}: shape of {name}");
        assert!(
            got[*name].1 == want[*name].1,
            "{what}: {name} differs from the embedded run"
        );
    }
}

/// The run report a result group holds (its `report` attribute).
fn report_json(group: &Path) -> Value {
    let text = std::fs::read_to_string(group.join("zarr.json"))
        .unwrap_or_else(|e| panic!("{}/zarr.json: {e}", group.display()));
    let mut meta: Value = serde_json::from_str(&text).unwrap();
    meta["attributes"]["report"].take()
}

/// `rankwise args…` in one process; returns its output group.
fn embedded_into(out: &Path, args: &[String]) -> PathBuf {
    let mut all = args.to_vec();
    all.extend(strings(&["--out", out.to_str().unwrap()]));
    embedded(&all).assert_success();
    out.to_path_buf()
}

/// A VCF Zarr store (Zarr v2, uncompressed) of `variants` × `samples` diploid calls drawn
/// from `seed`: alleles 0/1 with variant frequencies spread over (0.05, 0.95), a few calls
/// missing (−1), and sample ids.
fn write_vcf_zarr(path: &Path, variants: usize, samples: usize, chunk: usize, seed: u64) {
    let mut draw = Draw(seed);
    let mut calls = vec![0i8; variants * samples * 2];
    for v in 0..variants {
        let p = 0.05 + 0.9 * (draw.next() >> 11) as f64 / (1u64 << 53) as f64;
        for s in 0..samples {
            for a in 0..2 {
                let u = (draw.next() >> 11) as f64 / (1u64 << 53) as f64;
                calls[(v * samples + s) * 2 + a] = i8::from(u < p);
            }
            if draw.range(0, 99) == 0 {
                calls[(v * samples + s) * 2] = -1;
                calls[(v * samples + s) * 2 + 1] = -1;
            }
        }
    }
    let array = |name: &str, meta: Value, chunks: Vec<(String, Vec<u8>)>| {
        let dir = path.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(".zarray"), meta.to_string()).unwrap();
        for (key, bytes) in chunks {
            std::fs::write(dir.join(key), bytes).unwrap();
        }
    };
    std::fs::create_dir_all(path).unwrap();
    std::fs::write(path.join(".zgroup"), r#"{"zarr_format":2}"#).unwrap();
    let chunks = (0..variants.div_ceil(chunk))
        .map(|c| {
            let rows = c * chunk..((c + 1) * chunk);
            // A chunk is always whole: the last one padded with the fill value.
            let mut bytes = vec![-1i8 as u8; chunk * samples * 2];
            for (i, v) in rows.filter(|&v| v < variants).enumerate() {
                for j in 0..samples * 2 {
                    bytes[i * samples * 2 + j] = calls[v * samples * 2 + j] as u8;
                }
            }
            (format!("{c}.0.0"), bytes)
        })
        .collect();
    array(
        "call_genotype",
        serde_json::json!({
            "zarr_format": 2, "shape": [variants, samples, 2], "chunks": [chunk, samples, 2],
            "dtype": "|i1", "compressor": null, "fill_value": -1, "order": "C",
            "filters": null, "dimension_separator": ".",
        }),
        chunks,
    );
}

#[test]
fn job_scripts_under_a_local_slurm_give_the_embedded_bits() {
    let start = Instant::now();
    let dir = scratch("slurm");
    let seed = test_seed();
    let bin = rankwise_bin().display().to_string();
    let cluster = Cluster::up();
    eprintln!("cluster up in {:.1} s", start.elapsed().as_secs_f64());

    // cpu.sbatch: a generated matrix, 4 ranks on the one node, memory from --mem.
    let cpu_matrix = [
        ("RANKWISE_ROWS", "20011"),
        ("RANKWISE_COLS", "9"),
        ("RANKWISE_CHUNK_ROWS", "1500"),
        ("RANKWISE_DIST", "normal"),
    ];
    let mut cpu_env: Vec<(&str, String)> = cpu_matrix
        .iter()
        .map(|(k, v)| (*k, v.to_string()))
        .collect();
    cpu_env.extend([
        ("RANKWISE_BIN", bin.clone()),
        ("RANKWISE_SEED", seed.to_string()),
        ("RANKWISE_OUT", dir.join("cpu.zarr").display().to_string()),
    ]);
    let cpu = cluster.sbatch(
        &dir,
        "cpu",
        &repo().join("slurm/cpu.sbatch"),
        &["--nodes=1", "--ntasks-per-node=4", "--mem=2G"],
        &cpu_env,
    );

    // gpu.sbatch: with the node's GPUs as it is; without any, Slurm refuses --gpus-per-task,
    // so the script goes without that line and must fall back to the CPUs.
    let has_gpus = std::fs::read_dir("/dev").unwrap().flatten().any(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        n.strip_prefix("nvidia")
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
    });
    let gpu_script = if has_gpus {
        repo().join("slurm/gpu.sbatch")
    } else {
        eprintln!(
            "no GPU on this machine: submitting slurm/gpu.sbatch without its --gpus-per-task \
             line, to run its CPU fallback"
        );
        let text = std::fs::read_to_string(repo().join("slurm/gpu.sbatch")).unwrap();
        let without: String = text
            .lines()
            .filter(|l| !l.contains("--gpus-per-task"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(without.len() < text.len(), "gpu.sbatch asks for no GPU");
        let copy = dir.join("gpu-without-gpus.sbatch");
        std::fs::write(&copy, without).unwrap();
        copy
    };
    let gpu_args = strings(&[
        "svd",
        "--rows",
        "7",
        "--cols",
        "50",
        "--chunk-rows",
        "12",
        "--seed",
        &seed.to_string(),
    ]);
    let gpu = cluster.sbatch(
        &dir,
        "gpu",
        &gpu_script,
        &["--nodes=1", "--ntasks-per-node=3", "--cpus-per-task=1"],
        &[
            ("RANKWISE_BIN", bin.clone()),
            ("RANKWISE_ROWS", "7".into()),
            ("RANKWISE_COLS", "50".into()),
            ("RANKWISE_CHUNK_ROWS", "12".into()),
            ("RANKWISE_SEED", seed.to_string()),
            ("RANKWISE_OUT", dir.join("gpu.zarr").display().to_string()),
        ],
    );

    // pca-vcf-zarr.sbatch: a VCF Zarr store, 2 ranks of 2 CPUs with 500 MiB per CPU.
    let store = dir.join("cohort.vcz");
    write_vcf_zarr(&store, 301, 40, 50, seed);
    let pca_env = |store: &Path, out: &Path| {
        vec![
            ("RANKWISE_BIN", bin.clone()),
            ("RANKWISE_VCF_ZARR", store.display().to_string()),
            ("RANKWISE_OUT_DIR", out.display().to_string()),
            ("RANKWISE_K", "3".to_string()),
        ]
    };
    let pca_options = [
        "--nodes=1",
        "--ntasks-per-node=2",
        "--cpus-per-task=2",
        "--mem-per-cpu=500M",
    ];
    let pca_script = repo().join("slurm/pca-vcf-zarr.sbatch");
    let pca = cluster.sbatch(
        &dir,
        "pca",
        &pca_script,
        &pca_options,
        &pca_env(&store, &dir.join("pca-out")),
    );

    // A wrong input: the store does not exist.
    let missing = dir.join("no-such-cohort.vcz");
    let bad = cluster.sbatch(
        &dir,
        "bad",
        &pca_script,
        &pca_options,
        &pca_env(&missing, &dir.join("bad-out")),
    );

    // A time limit: cpu.sbatch's `--signal=TERM@120` with `--time=1` sends every rank
    // SIGTERM at slurmctld's first check (within about 30 s), long before a run of a flat
    // spectrum to tol 1e-15 could end; each rank says where it stopped and removes its
    // temporaries, and the job ends FAILED with 128 + SIGTERM instead of being killed.
    let limited_out = dir.join("limited.zarr");
    let limited = cluster.sbatch(
        &dir,
        "limited",
        &repo().join("slurm/cpu.sbatch"),
        &["--nodes=1", "--ntasks-per-node=2", "--time=1"],
        &[
            ("RANKWISE_BIN", bin.clone()),
            ("RANKWISE_COMMAND", "rsvd".into()),
            ("RANKWISE_ROWS", "2000000".into()),
            ("RANKWISE_COLS", "400".into()),
            ("RANKWISE_CHUNK_ROWS", "20000".into()),
            ("RANKWISE_DIST", "normal".into()),
            ("RANKWISE_SEED", seed.to_string()),
            (
                "RANKWISE_ARGS",
                "-k 20 --tol 1e-15 --max-passes 10000".into(),
            ),
            ("RANKWISE_INFO", "0".into()),
            ("RANKWISE_OUT", limited_out.display().to_string()),
        ],
    );

    // srun directly, while the jobs run: 4 ranks, 3 panels (one rank owns none).
    let srun_matrix = strings(&[
        "svd",
        "--rows",
        "1000",
        "--cols",
        "16",
        "--chunk-rows",
        "400",
        "--seed",
        &seed.to_string(),
    ]);
    let mut srun = cluster.command("srun");
    srun.args(["-n", "4", "--oversubscribe", "--kill-on-bad-exit=1", &bin])
        .args(&srun_matrix)
        .args(["--json", "--out", dir.join("srun.zarr").to_str().unwrap()]);
    let srun_run = run_with_timeout(srun, JOB_LIMIT);
    let srun_report = report(&srun_run);
    assert_eq!(srun_report["launcher"], "Slurm", "{}", srun_run.describe());
    assert_eq!(srun_report["transport"], "mpi");
    assert_eq!(srun_report["ranks"], 4);
    assert_eq!(srun_report["launch"]["size"], 4);
    assert!(srun_report["launch"]["job_id"].is_string(), "{srun_report}");
    let reference = embedded_into(&dir.join("ref-srun.zarr"), &srun_matrix);
    assert_same_arrays(
        &dir.join("srun.zarr"),
        &reference,
        &["S", "U", "Vt"],
        "srun -n 4",
    );
    eprintln!("srun -n 4: {:.2} s", srun_run.elapsed.as_secs_f64());

    // The wrong input ends FAILED within seconds, rankwise's error in the output file, and
    // leaves no output directory.
    let ended = cluster.wait_failed(&bad, "failing job");
    assert_ne!(ended.exit_code, "0:0");
    assert!(
        ended.elapsed < Duration::from_secs(20),
        "the failing job took {:?}",
        ended.elapsed
    );
    // Each rank prints the failure (its own, or the same one of a peer that was first).
    let failures = ended
        .output
        .lines()
        .filter(|l| {
            l.starts_with("rankwise: rank ")
                && l.contains(" failed: ")
                && l.contains(missing.to_str().unwrap())
        })
        .count();
    assert!(
        failures >= 1,
        "the output file lacks rankwise's error naming {}\n{}",
        missing.display(),
        ended.output
    );
    assert!(
        !dir.join("bad-out").exists(),
        "the failed job left its output directory"
    );

    // cpu.sbatch
    let mut cpu_args = strings(&["svd", "--seed", &seed.to_string()]);
    for (key, flag) in [
        ("RANKWISE_ROWS", "--rows"),
        ("RANKWISE_COLS", "--cols"),
        ("RANKWISE_CHUNK_ROWS", "--chunk-rows"),
        ("RANKWISE_DIST", "--dist"),
    ] {
        let value = cpu_matrix.iter().find(|(k, _)| *k == key).unwrap().1;
        cpu_args.extend(strings(&[flag, value]));
    }
    let reference = embedded_into(&dir.join("ref-cpu.zarr"), &cpu_args);
    let ended = cluster.wait(&cpu);
    ended.assert_completed(&cpu);
    eprintln!(
        "cpu.sbatch: {:.2} s from sbatch to the end",
        ended.elapsed.as_secs_f64()
    );
    assert_same_arrays(
        &dir.join("cpu.zarr"),
        &reference,
        &["S", "U", "Vt"],
        "cpu.sbatch",
    );
    let r = report_json(&dir.join("cpu.zarr"));
    assert_eq!(r["ranks"], 4, "{r}");
    assert_eq!(r["launch"]["launcher"], "slurm");
    assert_eq!(r["launch"]["job_id"].as_str(), Some(cpu.id.as_str()));
    // --mem=2G on one node of 4 ranks: 512 MiB each, and a default budget of 70% of it.
    assert_eq!(r["launch"]["memory_limit_bytes"], 512u64 << 20, "{r}");
    let budget = (512u64 << 20) as f64 * 0.7;
    for m in r["memory"].as_array().unwrap() {
        let b = m["budget"].as_f64().unwrap();
        assert!((b - budget).abs() <= 1.0, "budget {b}, expected {budget}");
    }
    for needle in [
        "rank 3 of 4 (transport mpi; launcher Slurm",
        "memory limit: 512.0 MiB for this rank (SLURM_MEM_PER_NODE 2048 MiB / 4 ranks on the node)",
        "rankwise svd: generated 20011 × 9 normal matrix",
    ] {
        assert!(
            ended.output.contains(needle),
            "cpu.sbatch output lacks {needle:?}\n{}",
            ended.output
        );
    }

    // gpu.sbatch
    let reference = embedded_into(&dir.join("ref-gpu.zarr"), &gpu_args);
    let ended = cluster.wait(&gpu);
    ended.assert_completed(&gpu);
    eprintln!(
        "gpu.sbatch: {:.2} s from sbatch to the end",
        ended.elapsed.as_secs_f64()
    );
    assert_same_arrays(
        &dir.join("gpu.zarr"),
        &reference,
        &["S", "U", "Vt"],
        "gpu.sbatch",
    );
    if !has_gpus {
        assert!(
            ended
                .output
                .contains("no GPU was allocated: the 3 ranks run on CPU cores"),
            "{}",
            ended.output
        );
    }

    // pca-vcf-zarr.sbatch
    let ref_dir = dir.join("ref-pca");
    std::fs::create_dir_all(&ref_dir).unwrap();
    let reference = embedded_into(
        &ref_dir.join("pca.zarr"),
        &strings(&["pca", "--vcf-zarr", store.to_str().unwrap(), "-k", "3"]),
    );
    let ended = cluster.wait(&pca);
    ended.assert_completed(&pca);
    eprintln!(
        "pca-vcf-zarr.sbatch: {:.2} s from sbatch to the end",
        ended.elapsed.as_secs_f64()
    );
    let out = dir.join("pca-out");
    assert_same_arrays(
        &out.join("pca.zarr"),
        &reference,
        &["S", "U", "Vt", "eigenvalues", "explained_variance_ratio"],
        "pca-vcf-zarr.sbatch",
    );
    for file in ["pca.eigenvec", "pca.eigenval"] {
        assert_eq!(
            std::fs::read_to_string(out.join(file)).unwrap(),
            std::fs::read_to_string(ref_dir.join(file)).unwrap(),
            "{file} differs from the embedded run's"
        );
    }
    assert!(out.join("pca.png").is_file());
    let r = report_json(&out.join("pca.zarr"));
    // --mem-per-cpu=500M × --cpus-per-task=2.
    assert_eq!(r["launch"]["memory_limit_bytes"], 1000u64 << 20, "{r}");
    assert_eq!(r["launch"]["cpus_per_task"], 2);

    // The time-limited job.
    let ended = cluster.wait_failed(&limited, "time-limited job");
    assert_eq!(ended.exit_code, "143:0", "{}", ended.output);
    for rank in 0..2 {
        let line = ended
            .output
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "rankwise: rank {rank} stopped by SIGTERM in pass "
                ))
            })
            .unwrap_or_else(|| {
                panic!("rank {rank} did not say where it stopped\n{}", ended.output)
            });
        assert!(
            line.contains(" (of at most 10000) of rsvd k = 20; ")
                && line.ends_with("temporary output(s) removed"),
            "{line}"
        );
    }
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("limited.zarr"))
        .collect();
    assert!(left.is_empty(), "the time-limited job left {left:?}");

    cluster.down();
    eprintln!("all in {:.1} s", start.elapsed().as_secs_f64());
}

#[test]
fn shell_scripts_are_shellcheck_clean() {
    let mut scripts = Vec::new();
    for sub in ["slurm", "scripts", "tools", "benches"] {
        for e in std::fs::read_dir(repo().join(sub)).unwrap().flatten() {
            let p = e.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            // Every script of slurm/, scripts/ and tools/; of benches/, the Slurm, GPU and
            // Heat/Cubed benchmarks.
            let wanted = match sub {
                "benches" => matches!(name.as_str(), "slurm.sh" | "gpu.sh" | "peers.sh"),
                _ => name.ends_with(".sh") || name.ends_with(".sbatch"),
            };
            if wanted {
                scripts.push(p);
            }
        }
    }
    scripts.sort();
    assert!(
        scripts.len() >= 6,
        "expected the Slurm scripts and scripts/*.sh, found {scripts:?}"
    );
    assert!(
        Command::new("shellcheck").arg("--version").output().is_ok(),
        "shellcheck is not installed (scripts/install-deps.sh installs it)"
    );
    let mut cmd = Command::new("shellcheck");
    cmd.args(&scripts);
    let run = run_with_timeout(cmd, Duration::from_secs(120));
    assert!(
        run.success(),
        "shellcheck found problems\n{}",
        run.describe()
    );
}
