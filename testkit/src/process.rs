//! Runs programs under `mpirun` with a hard time limit, for multi-process tests.
//!
//! * [`mpirun_command`] builds the command line: `mpirun --allow-run-as-root --oversubscribe
//!   --bind-to none -np P program args...`, with environment that makes Open MPI work as
//!   root in a container without network (shared memory and loopback only, no warnings about
//!   unused network components). `RANKWISE_MPIRUN` overrides the `mpirun` program and
//!   `RANKWISE_MPIRUN_ARGS` (whitespace separated) adds arguments before `-np`.
//! * [`run_with_timeout`] runs any command, collects its output, and when the time limit
//!   passes kills the whole process tree (`mpirun` puts every rank in its own process group,
//!   so killing mpirun's group is not enough) and reports `timed_out`.
//! * [`example_binary`] finds an example of this package that `cargo test` built.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What a finished (or killed) run left behind.
#[derive(Debug)]
pub struct RunOutput {
    /// The command line, for messages.
    pub command: String,
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Wall time until exit (or until killed).
    pub elapsed: Duration,
    /// True when the time limit passed and the process tree was killed.
    pub timed_out: bool,
}

impl RunOutput {
    /// Exit code 0 and not timed out.
    pub fn success(&self) -> bool {
        !self.timed_out && self.code == Some(0)
    }

    /// Panics (failing the test) when the run was killed for exceeding its time limit.
    pub fn assert_finished(&self) -> &Self {
        assert!(
            !self.timed_out,
            "`{}` exceeded its time limit ({:.0} s) and was killed\n{}",
            self.command,
            self.elapsed.as_secs_f64(),
            self.describe()
        );
        self
    }

    /// Panics unless the run exited with code 0.
    pub fn assert_success(&self) -> &Self {
        self.assert_finished();
        assert!(
            self.success(),
            "`{}` failed ({:?})\n{}",
            self.command,
            self.code,
            self.describe()
        );
        self
    }

    /// Panics unless stdout contains `needle`.
    pub fn assert_stdout_contains(&self, needle: &str) -> &Self {
        assert!(
            self.stdout.contains(needle),
            "`{}`: stdout lacks {needle:?}\n{}",
            self.command,
            self.describe()
        );
        self
    }

    /// Exit status, time and both outputs, for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "exit code: {:?}, {:.1} s{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            self.elapsed.as_secs_f64(),
            if self.timed_out { ", TIMED OUT" } else { "" },
            self.stdout,
            self.stderr
        )
    }
}

/// The `mpirun` command for `np` processes of `program args...`.
pub fn mpirun_command(np: usize, program: &Path, args: &[&str]) -> Command {
    let mpirun = std::env::var("RANKWISE_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(mpirun);
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ]);
    if let Ok(extra) = std::env::var("RANKWISE_MPIRUN_ARGS") {
        cmd.args(extra.split_whitespace());
    }
    cmd.arg("-np").arg(np.to_string()).arg(program).args(args);
    // Each mpirun gets its own session directory base. Concurrent mpiruns (tests run in
    // parallel) otherwise share /tmp/ompi.HOST.UID, which one removes while another creates
    // it: "A call to mkdir was unable to create the desired directory … File exists".
    if std::env::var_os(SESSION_BASE_VAR).is_none() {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = std::env::temp_dir()
            .join(SESSION_DIRS)
            .join(format!("{}-{n}", std::process::id()));
        if std::fs::create_dir_all(&base).is_ok() {
            cmd.env(SESSION_BASE_VAR, &base);
        }
    }
    for (key, value) in OMPI_ENV {
        // The caller's environment wins, so a cluster can choose its own transports.
        if std::env::var_os(key).is_none() {
            cmd.env(key, value);
        }
    }
    cmd
}

/// Open MPI's parameter for the base of its session directories.
const SESSION_BASE_VAR: &str = "OMPI_MCA_orte_tmpdir_base";
/// Where [`mpirun_command`] puts them (under the temporary directory), one per run.
const SESSION_DIRS: &str = "rankwise-mpirun-sessions";

/// Open MPI settings for one node, as root, in a container without network.
pub const OMPI_ENV: &[(&str, &str)] = &[
    // Same as --allow-run-as-root, also honoured by singleton runs.
    ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
    ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
    // More ranks than cores.
    ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
    // Shared memory and self only: no InfiniBand, libfabric or TCP probing.
    ("OMPI_MCA_pml", "ob1"),
    ("OMPI_MCA_btl", "self,vader"),
    ("OMPI_MCA_btl_base_warn_component_unused", "0"),
    // mpirun talks to its ranks over loopback.
    ("OMPI_MCA_oob_tcp_if_include", "lo"),
    // Oversubscribed ranks must not busy-wait inside MPI.
    ("OMPI_MCA_mpi_yield_when_idle", "1"),
];

/// Runs `program args...` under `mpirun -np np`, killing everything after `limit`.
pub fn mpirun(np: usize, program: &Path, args: &[&str], limit: Duration) -> RunOutput {
    run_with_timeout(mpirun_command(np, program, args), limit)
}

/// Runs `cmd` to completion or until `limit` passes; then kills its whole process tree.
pub fn run_with_timeout(cmd: Command, limit: Duration) -> RunOutput {
    let command = format!("{cmd:?}");
    // The session directory base that mpirun_command made for this run, removed after it.
    let session = cmd
        .get_envs()
        .find(|(k, _)| *k == SESSION_BASE_VAR)
        .and_then(|(_, v)| v.map(std::path::PathBuf::from))
        .filter(|p| p.parent().and_then(|d| d.file_name()) == Some(SESSION_DIRS.as_ref()));
    let out = run_and_collect(cmd, command, limit);
    if let Some(dir) = session {
        let _ = std::fs::remove_dir_all(dir);
    }
    out
}

fn run_and_collect(mut cmd: Command, command: String, limit: Duration) -> RunOutput {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{command}`: {e} (is Open MPI installed?)"));
    let stdout = collect(child.stdout.take().expect("piped stdout"));
    let stderr = collect(child.stderr.take().expect("piped stderr"));

    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for child") {
            break Some(status);
        }
        if start.elapsed() >= limit {
            timed_out = true;
            kill_tree(child.id());
            break child.wait().ok();
        }
        thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    // Ranks that outlive mpirun keep the pipes open; give the readers a moment, then take
    // what they have.
    let text = |(buf, done): (Arc<Mutex<Vec<u8>>>, Arc<Mutex<bool>>)| {
        let until = Instant::now() + Duration::from_secs(5);
        while !*done.lock().unwrap() && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        let bytes = buf.lock().unwrap().clone();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    RunOutput {
        command,
        code: status.and_then(|s| s.code()),
        stdout: text(stdout),
        stderr: text(stderr),
        elapsed,
        timed_out,
    }
}

type Collected = (Arc<Mutex<Vec<u8>>>, Arc<Mutex<bool>>);

fn collect(mut pipe: impl Read + Send + 'static) -> Collected {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(Mutex::new(false));
    let (b, d) = (Arc::clone(&buf), Arc::clone(&done));
    thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => b.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
        *d.lock().unwrap() = true;
    });
    (buf, done)
}

/// SIGTERM to `root` (mpirun forwards it to its ranks and cleans up), then SIGKILL to
/// `root` and every descendant found before, so nothing survives the test.
pub fn kill_tree(root: u32) {
    let mut pids = descendants(root);
    pids.push(root);
    // SAFETY: kill(2) with valid signal numbers.
    unsafe {
        libc::kill(root as libc::pid_t, libc::SIGTERM);
    }
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until && pids.iter().any(|&p| alive(p)) {
        thread::sleep(Duration::from_millis(50));
    }
    for &pid in &pids {
        // SAFETY: as above.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
    }
}

fn alive(pid: u32) -> bool {
    // A zombie counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| parse_stat(&s).is_some_and(|(state, _)| state != 'Z'))
        .unwrap_or(false)
}

/// State and parent pid from the text of /proc/PID/stat.
fn parse_stat(stat: &str) -> Option<(char, u32)> {
    // "pid (comm) state ppid ..."; comm may contain spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// All processes below `root`, found through /proc.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
                if let Some((_, ppid)) = parse_stat(&stat) {
                    children.entry(ppid).or_default().push(pid);
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(c);
            stack.push(c);
        }
    }
    out
}

/// Path of example `name` of this package, as built by `cargo test` (which builds the
/// examples next to the test binaries: `target/<profile>/examples/<name>`).
///
/// # Panics
/// When it does not exist; the message says how to build it.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current test binary");
    // target/<profile>/deps/<test>-<hash> → target/<profile>/examples/<name>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary inside target/<profile>/deps");
    let path = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} does not exist: run the tests with `cargo test -p <package>` (which builds the \
         examples) or build it with `cargo build --example {name}`",
        path.display()
    );
    if let (Ok(example), Ok(test)) = (modified(&path), modified(&exe)) {
        if example + Duration::from_secs(1) < test {
            eprintln!(
                "warning: {} is older than this test binary; if the library changed, \
                 rebuild it with `cargo build --example {name}`",
                path.display()
            );
        }
    }
    path
}

fn modified(path: &Path) -> std::io::Result<std::time::SystemTime> {
    std::fs::metadata(path)?.modified()
}

/// Bytes of memory available now (MemAvailable of /proc/meminfo), if known.
pub fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Removes from `cmd`'s environment what cargo sets for a test process (`CARGO_PKG_*`,
/// `CARGO_MANIFEST_DIR`, `CARGO_CRATE_NAME`, …), for a test that runs a nested cargo build
/// (or maturin). Build scripts watch some of them (ring's watches `CARGO_PKG_NAME` and
/// `CARGO_MANIFEST_DIR`): inherited, they rerun it and recompile everything above it, once
/// in the nested build and once more in the next plain one, about 3 minutes each on 2 cores.
pub fn without_cargo_test_env(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let set_for_tests = key.starts_with("CARGO_PKG_")
            || key.starts_with("CARGO_BIN_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if set_for_tests {
            cmd.env_remove(key);
        }
    }
    cmd
}
