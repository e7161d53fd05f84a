//! SIGINT, SIGTERM and SIGHUP end a rank only after it has removed the temporary outputs it
//! registered (`DIR.tmp-…`, the PCA's side files under `*.tmp-*` names).
//!
//! Without this, the default action of those signals ended the process at once and left
//! its temporaries behind: an interrupted `gen` left 551 MB. `mpirun` and `srun` pass the
//! signal on to every rank (SIGTERM), so each rank removes what it registered; the paths
//! are shared by all ranks of a job, and a path already gone is not an error. SIGKILL
//! cannot be caught: what it leaves carries the `.tmp-` mark that no finished output has.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once, RwLock, RwLockReadGuard};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

static TEMPORARIES: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Final names of outputs renamed ahead of the one whose commit marks the run complete
/// (the PCA's side files before its group), with that mark's path.
static UNCOMMITTED: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

/// What the run was doing, for the message of a signal (`in pass 3 … of pca k = 10`).
type Status = Box<dyn Fn() -> String + Send + Sync>;
static STATUS: Mutex<Option<Status>> = Mutex::new(None);
/// Held (shared) by every write into a temporary output, and (exclusively) by the handler
/// from the moment a signal comes: no write of this rank runs during or after the removal.
static WRITES: RwLock<()> = RwLock::new(());

/// A write into a temporary output is under way while this lives.
pub type Writing = RwLockReadGuard<'static, ()>;

/// The guard a write into a temporary output holds.
pub fn writing() -> Writing {
    WRITES.read().unwrap_or_else(|p| p.into_inner())
}

/// Registers a temporary output (a directory or a file whose name contains `.tmp-`) to be
/// removed if a signal ends the process. Registering a path that never comes to exist, or
/// that a commit renamed away, is harmless.
pub fn register(path: &Path) {
    let mut t = TEMPORARIES.lock().unwrap_or_else(|p| p.into_inner());
    if !t.iter().any(|p| p == path) {
        t.push(path.to_path_buf());
    }
}

/// Temporary files that go when the guard does, by an error or a panic as well as when the
/// work that writes them ends, and that a signal removes meanwhile ([`register`]). A file a
/// commit renamed away is not there to remove, and no error.
#[derive(Debug)]
pub struct RemovedOnDrop(Vec<PathBuf>);

impl RemovedOnDrop {
    /// Registers `paths` and removes them when dropped.
    pub fn new(paths: impl IntoIterator<Item = PathBuf>) -> RemovedOnDrop {
        let paths: Vec<PathBuf> = paths.into_iter().collect();
        for p in &paths {
            register(p);
        }
        RemovedOnDrop(paths)
    }
}

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Registers the final name of a file renamed ahead of the commit that marks the run
/// complete, the appearance of `mark`: a signal while `mark` does not exist removes it.
pub fn register_uncommitted(path: &Path, mark: &Path) {
    UNCOMMITTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((path.to_path_buf(), mark.to_path_buf()));
}

/// The run's outputs are committed: what [`register_uncommitted`] named stays.
pub fn committed() {
    UNCOMMITTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
}

/// Removes every registered temporary that still exists, and the files renamed ahead of
/// a commit that has not happened; returns how many it removed.
fn remove_registered() -> usize {
    let uncommitted = UNCOMMITTED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut removed = 0;
    for (p, mark) in uncommitted {
        // Committed already (the signal came between the commit and `committed`): keep.
        if std::fs::symlink_metadata(&mark).is_ok() {
            continue;
        }
        if std::fs::remove_file(&p).is_ok() {
            removed += 1;
        }
    }
    let paths = TEMPORARIES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for p in paths {
        // Only ever a temporary: a wrong registration must not delete real data.
        let is_tmp = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains(".tmp-"));
        if !is_tmp {
            continue;
        }
        if std::fs::symlink_metadata(&p).is_err() {
            continue;
        }
        // A writer may still be adding to the directory while it goes: a few tries catch
        // a file created behind the first removal.
        for _ in 0..5 {
            let gone = match std::fs::symlink_metadata(&p) {
                Err(_) => true,
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p).is_ok(),
                Ok(_) => std::fs::remove_file(&p).is_ok(),
            };
            if gone {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if std::fs::symlink_metadata(&p).is_err() {
            removed += 1;
        }
    }
    removed
}

/// Says where the run is when a signal ends it: `status` is asked by the handler, and its
/// text (`in pass 3 (of at most 100) of pca k = 10`) follows the signal's name.
pub fn set_status(status: impl Fn() -> String + Send + Sync + 'static) {
    if let Ok(mut s) = STATUS.lock() {
        *s = Some(Box::new(status));
    }
}

/// Installs the handler (once per process): a thread waits for SIGINT, SIGTERM or SIGHUP,
/// removes the registered temporaries, says so on stderr and exits with 128 + the signal's
/// number, as the default action's status reads to a shell.
pub fn install(rank: usize) -> std::io::Result<()> {
    let mut result = Ok(());
    INSTALL.call_once(|| {
        result = (|| {
            let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
            std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    if let Some(sig) = signals.forever().next() {
                        let name = match sig {
                            SIGINT => "SIGINT",
                            SIGTERM => "SIGTERM",
                            _ => "SIGHUP",
                        };
                        // This rank's writes stop here (the lock is never given back).
                        let _no_more = WRITES.write().unwrap_or_else(|p| p.into_inner());
                        let mut removed = remove_registered();
                        // The other ranks of the job got the signal too, but a rank still
                        // writing may recreate the directory until its own handler runs (or
                        // the launcher kills it): watch a little longer.
                        for _ in 0..15 {
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            removed += remove_registered();
                        }
                        // `try_lock`: a handler never waits on a thread it interrupted.
                        let status = STATUS
                            .try_lock()
                            .ok()
                            .and_then(|s| s.as_ref().map(|f| f()))
                            .filter(|s| !s.is_empty())
                            .map(|s| format!(" {s}"))
                            .unwrap_or_default();
                        eprintln!(
                            "rankwise: rank {rank} stopped by {name}{status}; {removed} \
                             temporary output(s) removed"
                        );
                        // `_exit`, not `exit`: the other threads are still running (an
                        // actor may be inside a GEMM), and `exit`'s atexit handlers
                        // (OpenBLAS's shutdown frees the buffers its threads use) could
                        // crash one, so the run would end by SIGSEGV instead of 128 + sig.
                        // stderr is unbuffered; nothing else is left to flush.
                        // SAFETY: `_exit` is async-signal-safe and ends the process at once.
                        unsafe { libc::_exit(128 + sig) };
                    }
                })?;
            Ok(())
        })();
    });
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry is the process's: tests that register run one at a time.
    static REGISTRY: Mutex<()> = Mutex::new(());

    /// The guard removes its files when it is dropped, by a panic too, and leaves a file
    /// renamed away (committed) where it went.
    #[test]
    fn a_guard_removes_its_temporaries_when_dropped_by_a_panic_too() {
        let _one = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("rankwise-guard-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, kept) = (
            dir.join("o.tmp-1.eigenvec"),
            dir.join("o.tmp-1.eigenval"),
            dir.join("o.eigenvec"),
        );
        let unwound = std::panic::catch_unwind(|| {
            std::fs::write(&a, b"x").unwrap();
            let _guard = RemovedOnDrop::new([a.clone(), b.clone()]);
            std::fs::write(&b, b"x").unwrap();
            panic!("a failure while writing");
        });
        assert!(unwound.is_err());
        assert!(!a.exists() && !b.exists());
        {
            std::fs::write(&a, b"x").unwrap();
            let _guard = RemovedOnDrop::new([a.clone()]);
            std::fs::rename(&a, &kept).unwrap();
        }
        assert!(kept.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_registered_temporaries_are_removed() {
        let _one = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("rankwise-interrupt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tmp_dir = dir.join("out.zarr.tmp-1");
        std::fs::create_dir_all(tmp_dir.join("U/c")).unwrap();
        std::fs::write(tmp_dir.join("U/c/0"), b"x").unwrap();
        let tmp_file = dir.join("out.tmp-1.eigenvec");
        std::fs::write(&tmp_file, b"x").unwrap();
        let real = dir.join("real.zarr");
        std::fs::create_dir_all(&real).unwrap();
        register(&tmp_dir);
        register(&tmp_file);
        register(&real);
        register(&dir.join("never-made.tmp-2"));
        // Renamed ahead of a commit: removed while the mark is missing, kept once it is.
        let early = dir.join("out.eigenval");
        std::fs::write(&early, b"x").unwrap();
        register_uncommitted(&early, &dir.join("out.zarr"));
        let kept = dir.join("done.eigenval");
        std::fs::write(&kept, b"x").unwrap();
        register_uncommitted(&kept, &real);
        assert_eq!(remove_registered(), 3);
        assert!(!early.exists() && kept.exists());
        committed();
        assert!(!tmp_dir.exists() && !tmp_file.exists());
        assert!(real.exists(), "a path without .tmp- is never removed");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
