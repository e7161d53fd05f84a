//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};

#[allow(unused_imports)]
pub(crate) use rankwise_testkit::process as mpirun;
// Each test binary uses a part of these.
#[allow(unused_imports)]
pub(crate) use rankwise_testkit::{scratch, snapshot, test_seed, Draw};

use ndarray::{Array1, Array2};
use ndarray_linalg::{JobSvd, SVDDCInto};
use rankwise::exec::Runtime;
use rankwise::linalg::{svd, FactorSink, SvdOptions, SvdProblem, SvdResult};
use rankwise::sources::{Dist, Generated};

/// The dense generated matrix.
pub(crate) fn dense(rows: u64, cols: u64, seed: u64, dist: Dist) -> Array2<f64> {
    let g = Generated::new(rows, cols, seed, dist);
    Array2::from_shape_fn((rows as usize, cols as usize), |(i, j)| {
        g.value(i as u64, j as u64)
    })
}

/// LAPACK's singular values of `a`.
pub(crate) fn lapack_sigma(a: &Array2<f64>) -> Array1<f64> {
    a.clone().svddc_into(JobSvd::None).unwrap().1
}

/// The distributed SVD with the distributed factor gathered in memory.
pub(crate) struct Gathered {
    pub result: SvdResult,
    /// U (m × k) of the user's matrix.
    pub u: Array2<f64>,
    /// Vᵀ (k × n) of the user's matrix.
    pub vt: Array2<f64>,
}

/// Runs the SVD on `rt` and gathers the factor this rank wrote into `store`.
pub(crate) fn run_svd(
    rt: &Runtime,
    problem: &SvdProblem,
    check: bool,
    store: Arc<Mutex<Array2<f64>>>,
) -> SvdResult {
    let sink: FactorSink = Arc::new(move |_, rows, f| {
        let mut s = store.lock().unwrap();
        s.slice_mut(ndarray::s![rows.start as usize..rows.end as usize, ..])
            .assign(&f);
        Ok(())
    });
    svd(rt, problem, &SvdOptions { check }, Some(sink)).unwrap()
}

/// Assembles U and Vᵀ of the user's matrix from the replicated factor and the gathered one.
pub(crate) fn assemble(result: SvdResult, distributed: Array2<f64>) -> Gathered {
    let (u, vt) = if result.transposed {
        (result.wt.t().to_owned(), distributed.t().to_owned())
    } else {
        (distributed, result.wt.clone())
    };
    Gathered { result, u, vt }
}

/// The release binary `rankwise`, built by `make test` before the tests run.
pub(crate) fn rankwise_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("rankwise");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build --release --workspace --bins`; `make test` does)",
        bin.display()
    );
    bin
}

/// `rankwise-fault`: the release binary with `RANKWISE_FAULT` read (package
/// `rankwise-fault`), which the failure tests launch; `make build` builds it.
pub(crate) fn rankwise_fault_bin() -> PathBuf {
    let bin = rankwise_bin().with_file_name("rankwise-fault");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`make build`, or `cargo build --release --workspace \
         --bins`)",
        bin.display()
    );
    bin
}

/// The Python interpreter of the zarr-python virtualenv (`scripts/zarr-venv.sh`, pinned
/// versions), created under the target dir on first use; concurrent callers wait for each
/// other (the script locks).
pub(crate) fn zarr_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| pinned_python("zarr-venv.sh", "zarr-venv"))
        .clone()
}

/// The Python interpreter of sgkit 0.10's virtualenv (`scripts/sgkit-venv.sh`: zarr-python
/// 2, pinned versions), made as [`zarr_python`]'s.
pub(crate) fn sgkit_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| pinned_python("sgkit-venv.sh", "sgkit-venv"))
        .clone()
}

/// `bash scripts/SCRIPT target/DIR`, which makes a pinned virtualenv there: its Python.
fn pinned_python(script: &str, dir: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = target.join(dir);
    let out = std::process::Command::new("bash")
        .arg(repo.join("scripts").join(script))
        .arg(&venv)
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "scripts/{script} {} failed ({}):\n{}",
        venv.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    venv.join("bin/python")
}

/// `bash scripts/NAME args…` of this repository: its stdout, or the test fails with its
/// stderr.
pub(crate) fn repo_script(name: &str, args: &[&std::ffi::OsStr]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "scripts/{name} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Time limit of one `rankwise` run started by a test (a hang fails the test, not CI).
pub(crate) const CLI_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// `rankwise args…` in one process.
pub(crate) fn embedded(args: &[String]) -> mpirun::RunOutput {
    embedded_env(args, &[])
}

/// [`embedded`] with `env` added to the environment (an object store's credentials, say).
pub(crate) fn embedded_env(args: &[String], env: &[(&str, &str)]) -> mpirun::RunOutput {
    let mut cmd = std::process::Command::new(rankwise_bin());
    cmd.args(args).envs(env.iter().copied());
    mpirun::run_with_timeout(cmd, CLI_LIMIT)
}

/// `mpirun -np np rankwise args…`.
pub(crate) fn under_mpirun(np: usize, args: &[String]) -> mpirun::RunOutput {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    mpirun::mpirun(np, &rankwise_bin(), &args, CLI_LIMIT)
}

/// Writes a generated `rows × cols` store of `dist` values in bands of `band` rows with
/// `rankwise gen` (plus `extra` options: dtype, codec, …) and returns the spec of its
/// matrix: genotypes are written as a group whose dosages are `call_dosage`.
pub(crate) fn gen_store(
    out: &Path,
    (rows, cols, band): (u64, u64, u64),
    dist: &str,
    seed: &str,
    extra: &[&str],
) -> String {
    let out = out.to_str().expect("UTF-8 scratch paths");
    let (r, c, b) = (rows.to_string(), cols.to_string(), band.to_string());
    let mut args = vec![
        "gen",
        "--out",
        out,
        "--rows",
        &r,
        "--cols",
        &c,
        "--chunk-rows",
        &b,
        "--dist",
        dist,
        "--seed",
        seed,
    ];
    args.extend(extra);
    embedded(&strings(&args)).assert_success();
    if dist == "genotype" {
        format!("{out}:call_dosage")
    } else {
        out.to_string()
    }
}

/// Owned arguments.
pub(crate) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The JSON report a successful `--json` run printed.
pub(crate) fn report(run: &mpirun::RunOutput) -> serde_json::Value {
    run.assert_success();
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a JSON report ({e})\n{}", run.describe()))
}

/// The numbers of a JSON array.
pub(crate) fn json_floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The bits of a JSON array of numbers.
pub(crate) fn json_bits(v: &serde_json::Value) -> Vec<u64> {
    json_floats(v).iter().map(|x| x.to_bits()).collect()
}

/// Bits of the named arrays of a Zarr group.
pub(crate) fn group_bits(dir: &Path, names: &[&str]) -> BTreeMap<String, (Vec<u64>, Vec<u64>)> {
    names
        .iter()
        .map(|&name| {
            let (shape, v) = rankwise::output::read_f64_array(dir, name)
                .unwrap_or_else(|e| panic!("{}: {name}: {e}", dir.display()));
            (
                name.to_string(),
                (shape, v.iter().map(|x| x.to_bits()).collect()),
            )
        })
        .collect()
}

/// Asserts that `run` (of `args`) failed with exit status 1 and that rank 0 named `option`.
pub(crate) fn assert_fails_naming(run: &mpirun::RunOutput, args: &[String], option: &str) {
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{args:?}\n{}", run.describe());
    assert!(
        run.stderr
            .contains(&format!("rankwise: rank 0 failed: {option}: ")),
        "{args:?}: stderr does not name {option}:\n{}",
        run.stderr
    );
}

/// Asserts that a 2-rank `mpirun` of `args` failed and that both ranks printed the
/// failure naming `option` (the launcher may merge the lines, so a count of the message's
/// occurrences also counts).
pub(crate) fn assert_both_ranks_name(run: &mpirun::RunOutput, args: &[String], option: &str) {
    let line = format!(" failed: {option}: ");
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{args:?}\n{}", run.describe());
    let count = run
        .stderr
        .lines()
        .filter(|l| l.contains("rankwise: rank ") && l.contains(&line))
        .count()
        .max(run.stderr.matches(&line).count());
    assert!(
        count >= 2,
        "mpirun -np 2 {args:?}: expected both ranks to print {line:?}, got {count}\n{}",
        run.describe()
    );
}

/// PIDs of the rank processes of `rankwise COMMAND` whose command line carries `marker`
/// (not the launcher's own).
pub(crate) fn rankwise_pids(command: &str, marker: &str) -> Vec<i32> {
    let needle = format!("rankwise {command}");
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) && cmdline.contains(marker) && !cmdline.contains("mpirun") {
            pids.push(pid);
        }
    }
    pids.sort();
    pids
}

/// A sink that writes this rank's rows of the distributed factor into `store`.
pub(crate) fn sink_into(store: &Arc<Mutex<Array2<f64>>>) -> FactorSink {
    let store = Arc::clone(store);
    Arc::new(move |_, rows, f| {
        store
            .lock()
            .unwrap()
            .slice_mut(ndarray::s![rows.start as usize..rows.end as usize, ..])
            .assign(&f);
        Ok(())
    })
}

/// Runs the randomized SVD on `rt` and returns the result with the gathered `U` (m × k)
/// of the operand (the problems the tests build are never transposed).
pub(crate) fn run_rsvd(
    rt: &Runtime,
    problem: &rankwise::linalg::RsvdProblem,
    options: &rankwise::linalg::RsvdOptions,
) -> (rankwise::linalg::RsvdResult, Array2<f64>) {
    let m = problem.grid.rows as usize;
    let store = Arc::new(Mutex::new(Array2::from_elem((m, options.k), f64::NAN)));
    let result = rankwise::linalg::rsvd(rt, problem, options, Some(sink_into(&store))).unwrap();
    assert!(!result.transposed);
    let u = store.lock().unwrap().clone();
    assert!(u.iter().all(|v| v.is_finite()), "the sink missed rows of U");
    (result, u)
}

/// An `m × k` matrix with orthonormal columns: Q of a Gaussian matrix.
pub(crate) fn orthonormal(m: usize, k: usize, seed: u64) -> Array2<f64> {
    use ndarray_linalg::QR;
    let g = dense(m as u64, k as u64, seed, Dist::Normal);
    let (q, _) = g.qr().unwrap();
    assert_eq!(q.dim(), (m, k));
    q
}

/// An embedded runtime of `actors` unpinned actors (the `Local` transport, one rank).
pub(crate) fn runtime(actors: usize) -> Runtime {
    rankwise::embedded(&rankwise::exec::RuntimeConfig {
        actors: Some(actors),
        pin: false,
        ..Default::default()
    })
    .unwrap()
}

/// The process's fixed overhead, stated beside the budget (docs/memory.md): the binary
/// and its libraries (OpenBLAS, MPI, UCX), their own buffers and the allocator's slack.
/// A run of a few kilobytes peaks at about 15 MiB.
pub(crate) const FIXED_OVERHEAD: u64 = 32 << 20;

/// `rankwise args…` in one process, with the peak resident memory (bytes) the kernel
/// recorded for it: `wait4`'s `ru_maxrss`, which holds for runs that fail too (a failing
/// run writes no report to read `peak_rss_bytes` from).
///
/// The run is forked from a small Python process that waits for it: a child spawned from
/// this test process starts its `ru_maxrss` at this process's own peak (the kernel keeps
/// the high-water mark of the memory image an `exec` replaces, and a spawned child's is
/// the test harness's, which other tests had grown past 100 MiB), so the measure would be
/// the harness's, not rankwise's. A fork of the waiter starts from the waiter's few MiB.
pub(crate) fn embedded_with_peak(args: &[String]) -> (mpirun::RunOutput, u64) {
    embedded_with_peak_env(args, &[])
}

/// [`embedded_with_peak`] with `env` added to the environment.
pub(crate) fn embedded_with_peak_env(
    args: &[String],
    env: &[(&str, &str)],
) -> (mpirun::RunOutput, u64) {
    const WAITER: &str = concat!(
        "import os, sys\n",
        "pid = os.fork()\n",
        "if pid == 0: os.execv(sys.argv[1], sys.argv[1:])\n",
        "_, status, usage = os.wait4(pid, 0)\n",
        "sys.stderr.write('\\nPEAK_RSS_KIB=%d\\n' % usage.ru_maxrss)\n",
        "sys.exit(os.waitstatus_to_exitcode(status) % 256)\n",
    );
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("-c")
        .arg(WAITER)
        .arg(rankwise_bin())
        .args(args)
        .envs(env.iter().copied());
    let mut run = mpirun::run_with_timeout(cmd, CLI_LIMIT);
    let at = run
        .stderr
        .rfind("\nPEAK_RSS_KIB=")
        .unwrap_or_else(|| panic!("the waiter reported no peak RSS\n{}", run.describe()));
    let kib: u64 = run.stderr[at + "\nPEAK_RSS_KIB=".len()..]
        .trim()
        .parse()
        .unwrap();
    run.stderr.truncate(at);
    // A run killed by a signal: the waiter exits with the signal's number as Python
    // reports it (negative), here as 256 − N; read as "no exit code".
    if run.code.is_some_and(|c| c > 128) {
        run.code = None;
    }
    (run, kib * 1024)
}

/// The least `--memory-per-actor` (bytes, rounded up to a MiB) that the plan of `args`
/// accepts, from the refusal of a budget too small ("raise --memory-per-actor to at least
/// X MiB"), or 4 MiB when that is accepted.
pub(crate) fn least_budget(args: &[String]) -> u64 {
    least_budget_env(args, &[])
}

/// [`least_budget`] with `env` added to the environment.
pub(crate) fn least_budget_env(args: &[String], env: &[(&str, &str)]) -> u64 {
    let mut tiny = args.to_vec();
    tiny.extend(strings(&["--memory-per-actor", "4M"]));
    let run = embedded_env(&tiny, env);
    run.assert_finished();
    if run.success() {
        return 4 << 20;
    }
    let at = run
        .stderr
        .find("at least ")
        .unwrap_or_else(|| panic!("4M is refused, naming the least\n{}", run.describe()));
    let rest = &run.stderr[at + "at least ".len()..];
    let mut words = rest.split_whitespace();
    let value: f64 = words.next().unwrap().parse().unwrap();
    let unit = match words.next().unwrap().trim_end_matches([';', ',', ')']) {
        "KiB" => 1u64 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => panic!("unit {other}: {}", run.describe()),
    };
    ((value * unit as f64) as u64).div_ceil(1 << 20) << 20
}
