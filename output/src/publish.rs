//! Opening an output on every rank under one temporary name, and removing it when a run
//! fails: the collective half of "nothing half-written is left behind". The commit itself
//! (one rename) is the output's own ([`SvdOutput::commit`]).
//!
//! Every rank of a runtime calls [`open_collectively`] with the same `out`: rank 0 picks a
//! token, broadcasts it, and creates the output at [`SvdOutput::temp_path`]; the others
//! open it after a barrier. From then on the temporary is registered
//! ([`crate::temporaries`]), so a signal removes it. A rank whose run fails calls
//! [`abandon_collectively`]: it tells the other ranks first (unless the failure is theirs),
//! so that a peer whose next write finds the directory gone already has the cause waiting,
//! then removes the temporary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rankwise_exec::Runtime;
use rankwise_transports::{announce_failure, TransportError};

use crate::group::{OutputError, OutputLayout, SvdOutput};

/// Why an output could not be opened on every rank.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Rank 0 could not create the output at its temporary name: a problem of `out`.
    #[error("`out`: {0}")]
    Create(#[source] OutputError),
    /// `out` cannot be written (it exists, or its parent is missing or read-only), or a rank
    /// could not open what rank 0 created.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The ranks could not agree on the temporary name.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// An output open on this rank, under its temporary name.
#[derive(Debug)]
pub struct Opened<O> {
    /// The output, shared by this rank's actors.
    pub output: Arc<O>,
    /// Its temporary path, committed to `out` by one rename.
    pub tmp: PathBuf,
    /// On rank 0: temporaries of `out` that an earlier run left (killed by SIGKILL) or is
    /// still writing; empty on the other ranks. The caller says so to the user.
    pub stale: Vec<PathBuf>,
}

/// Creates an output under a temporary name shared by all ranks (a collective call):
/// rank 0 runs `create`, the others `open` after a barrier. `out` must not exist. On
/// failure nothing is left behind.
pub fn open_collectively<O>(
    rt: &Runtime,
    out: &Path,
    create: impl FnOnce(&Path) -> Result<O, OutputError>,
    open: impl FnOnce(&Path) -> Result<O, OutputError>,
) -> Result<Opened<O>, PublishError> {
    let comm = rt.comm();
    let me = rt.rank();
    SvdOutput::check_target(out)?;
    let stale = if me == 0 {
        SvdOutput::stale_temporaries(out)
    } else {
        Vec::new()
    };
    let mut token = if me == 0 {
        format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        )
        .into_bytes()
    } else {
        Vec::new()
    };
    comm.broadcast_bytes(0, &mut token)?;
    let tmp = SvdOutput::temp_path(out, &String::from_utf8_lossy(&token));
    // From here on the temporary directory may exist: any failure removes it, and so does
    // a signal.
    crate::temporaries::register(&tmp);
    let opened = (|| -> Result<O, PublishError> {
        let created = if me == 0 {
            Some(create(&tmp).map_err(PublishError::Create)?)
        } else {
            None
        };
        comm.barrier()?;
        Ok(match created {
            Some(o) => o,
            None => open(&tmp)?,
        })
    })();
    match opened {
        Ok(o) => Ok(Opened {
            output: Arc::new(o),
            tmp,
            stale,
        }),
        Err(e) => {
            // Until every rank has opened it, only its creator may remove it: another
            // rank's cleanup could race with the creation itself.
            if me == 0 {
                let _ = SvdOutput::abandon(&tmp);
            }
            Err(e)
        }
    }
}

/// [`open_collectively`] for the result group of `layout`.
pub fn open_group(
    rt: &Runtime,
    out: &Path,
    layout: OutputLayout,
) -> Result<Opened<SvdOutput>, PublishError> {
    let for_open = layout.clone();
    open_collectively(
        rt,
        out,
        |tmp| SvdOutput::create(out, tmp, layout),
        |tmp| SvdOutput::open(out, tmp, for_open),
    )
}

/// Ends a failed run that had `opened` open: unless `own` is `None` (the failure is
/// another rank's, which the others already heard of), tells the other ranks
/// `own()` first, then removes the temporary output. Returns the failure of another rank
/// that arrived instead, if one did ([`announce_failure`]).
pub fn abandon_collectively<O>(
    rt: &Runtime,
    opened: Opened<O>,
    own: Option<&dyn Fn() -> String>,
) -> Option<(usize, String)> {
    // Every rank removes the temporary after its own last write, so no late write leaves a
    // partial directory behind; a peer's notice sent just before it removed the output
    // may still be on its way when our write finds the directory gone.
    let heard = own.and_then(|own| announce_failure(rt.comm(), own));
    let Opened { output, tmp, .. } = opened;
    drop(output);
    let _ = SvdOutput::abandon(&tmp);
    heard
}

/// Commits the group `output` together with files written beside it under temporary
/// names: each `(written, final)` pair is renamed into place first, then the group is
/// committed, because the group's name is the mark of a complete run. Until it is, a signal
/// removes the files already renamed ([`crate::temporaries::register_uncommitted`]). On
/// failure every one of the files is removed, under either name, and the group is left
/// uncommitted for [`abandon_collectively`]. Called on one rank, after the barrier that
/// follows every rank's last write.
pub fn commit_with_files(
    output: &SvdOutput,
    files: &[(PathBuf, PathBuf)],
) -> Result<PathBuf, OutputError> {
    let mark = output.out_path();
    for (_, to) in files {
        crate::temporaries::register_uncommitted(to, mark);
    }
    let mut renamed = Vec::new();
    let result = (|| {
        for (from, to) in files {
            std::fs::rename(from, to).map_err(|source| OutputError::Io {
                path: to.clone(),
                op: "moving into place",
                source,
            })?;
            renamed.push(to);
        }
        output.commit()
    })();
    if result.is_err() {
        for (from, _) in files {
            let _ = std::fs::remove_file(from);
        }
        for to in renamed {
            let _ = std::fs::remove_file(to);
        }
    }
    crate::temporaries::committed();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{Dims, ZarrFormat};

    fn layout() -> OutputLayout {
        OutputLayout {
            format: ZarrFormat::V3,
            m: 8,
            n: 3,
            k: 2,
            u_chunk_rows: 4,
            vt_chunk_cols: 3,
            row_vectors: Vec::new(),
            row_matrices: Vec::new(),
            dims: Dims::MATRIX,
            attributes: serde_json::Map::new(),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rankwise-publish-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// `f` on each rank of a `Local` world of `ranks` threads, in rank order.
    fn on_ranks<T: Send + 'static>(
        ranks: usize,
        f: impl Fn(&Runtime) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let f = Arc::new(f);
        let threads: Vec<_> = rankwise_transports::LocalWorld::create(ranks)
            .into_iter()
            .map(|comm| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || f(&crate::report::one_actor_runtime(comm)))
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    #[test]
    fn every_rank_opens_one_temporary_and_abandoning_it_leaves_nothing() {
        let dir = scratch("open");
        let out = dir.join("r.zarr");
        let at = out.clone();
        let tmps = on_ranks(3, move |rt| {
            let opened = open_group(rt, &at, layout()).unwrap();
            let tmp = opened.tmp.clone();
            assert!(tmp.is_dir(), "{}", tmp.display());
            rt.comm().barrier().unwrap();
            // Rank 1 fails; the others hear of it.
            let own = format!("rank {} failed", rt.rank());
            let mine: &dyn Fn() -> String = &|| own.clone();
            let heard = abandon_collectively(rt, opened, (rt.rank() == 1).then_some(mine));
            if rt.rank() == 1 {
                assert_eq!(heard, None);
            }
            tmp
        });
        assert!(tmps.windows(2).all(|w| w[0] == w[1]), "{tmps:?}");
        assert!(!tmps[0].exists() && !out.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn side_files_move_into_place_before_the_group_and_leave_with_it_on_failure() {
        let dir = scratch("files");
        let out = dir.join("r.zarr");
        let at = out.clone();
        let files: Vec<(PathBuf, PathBuf)> = ["a", "b"]
            .iter()
            .map(|e| (dir.join(format!("r.tmp-x.{e}")), dir.join(format!("r.{e}"))))
            .collect();
        let all = files.clone();
        on_ranks(1, move |rt| {
            let opened = open_group(rt, &at, layout()).unwrap();
            for (from, _) in &all {
                std::fs::write(from, b"x").unwrap();
            }
            // `out` appears meanwhile: the commit fails, and no side file stays.
            std::fs::create_dir(&at).unwrap();
            let e = commit_with_files(&opened.output, &all).unwrap_err();
            assert!(e.to_string().contains("r.zarr"), "{e}");
            for (from, to) in &all {
                assert!(!from.exists() && !to.exists(), "{}", to.display());
            }
            abandon_collectively(rt, opened, None);
            std::fs::remove_dir(&at).unwrap();
            // Then the same, committed.
            let opened = open_group(rt, &at, layout()).unwrap();
            for (from, _) in &all {
                std::fs::write(from, b"x").unwrap();
            }
            assert_eq!(commit_with_files(&opened.output, &all).unwrap(), at);
        });
        assert!(out.join("zarr.json").is_file());
        for (from, to) in &files {
            assert!(!from.exists() && to.is_file());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_existing_out_is_refused_on_every_rank_before_anything_is_made() {
        let dir = scratch("exists");
        let out = dir.join("r.zarr");
        std::fs::create_dir(&out).unwrap();
        let at = out.clone();
        let errors = on_ranks(2, move |rt| {
            open_group(rt, &at, layout())
                .map(|_| ())
                .unwrap_err()
                .to_string()
        });
        for e in errors {
            assert!(e.contains("already exists"), "{e}");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
