//! What a run is doing, for a progress display: which pass, how many of this rank's jobs
//! of the pass are done, and, for an iteration to a tolerance, how far it still is.
//!
//! The drivers and [`Runtime::map`](crate::Runtime::map) update it on their own rank, and
//! any thread may read it ([`Progress::snapshot`]). Nothing here crosses ranks: a display
//! on rank 0 shows rank 0's panels, which the placement gives about an equal share, and
//! the pass every rank is in (passes are collective). So progress never adds a collective
//! call, let alone one per panel.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A rank's progress, updated with relaxed atomics (a display needs no ordering).
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    /// Passes begun.
    pass: AtomicU64,
    /// The most passes the run may make (0: not known).
    max_passes: AtomicU64,
    /// Jobs submitted and finished in this pass on this rank: those of the pass's first
    /// [`Runtime::map`](crate::Runtime::map), one per panel (the later ones of a pass are
    /// short steps on its results).
    jobs: AtomicU64,
    jobs_done: AtomicU64,
    /// Whether the pass's first map is still to come.
    unclaimed: AtomicBool,
    /// f64 bits of the largest residual after the last pass, and of the tolerance (NaN: none).
    residual: AtomicU64,
    tol: AtomicU64,
    /// The residual before the last one, for the rate of convergence.
    previous: AtomicU64,
    /// What runs (`pca k = 10`) and on what (`PLINK .bed …`); empty until a command says.
    title: Mutex<(String, String)>,
}

impl Default for Progress {
    fn default() -> Progress {
        Progress {
            started: Instant::now(),
            pass: AtomicU64::new(0),
            max_passes: AtomicU64::new(0),
            jobs: AtomicU64::new(0),
            jobs_done: AtomicU64::new(0),
            unclaimed: AtomicBool::new(false),
            residual: AtomicU64::new(f64::NAN.to_bits()),
            tol: AtomicU64::new(f64::NAN.to_bits()),
            previous: AtomicU64::new(f64::NAN.to_bits()),
            title: Mutex::new((String::new(), String::new())),
        }
    }
}

/// A reading of [`Progress`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProgressSnapshot {
    /// What runs (`pca k = 10`; empty until a command says).
    pub title: String,
    /// On what (`PLINK .bed …`).
    pub subject: String,
    /// Seconds since the runtime started.
    pub seconds: f64,
    /// Passes begun (0 before the first).
    pub pass: u64,
    /// The most passes the run may make, where known.
    pub max_passes: Option<u64>,
    /// This rank's jobs of the current pass: done, of submitted.
    pub jobs: (u64, u64),
    /// The largest residual after the last pass, and the tolerance it iterates to.
    pub residual: Option<(f64, f64)>,
    /// Passes still needed at the last pass's rate of convergence, where it converges.
    pub passes_left: Option<u64>,
}

impl Progress {
    /// Says what runs (`pca k = 10`) and on what (a source's description).
    pub fn set_title(&self, title: impl Into<String>, subject: impl Into<String>) {
        if let Ok(mut t) = self.title.lock() {
            *t = (title.into(), subject.into());
        }
    }

    /// A run begins on this runtime (a runtime may make several, one after another): its
    /// passes are counted from none, up to `max` (0: not known), and the last run's
    /// residuals are forgotten.
    pub fn begin_run(&self, max: u64) {
        self.pass.store(0, Ordering::Relaxed);
        self.max_passes.store(max, Ordering::Relaxed);
        for a in [&self.residual, &self.tol, &self.previous] {
            a.store(f64::NAN.to_bits(), Ordering::Relaxed);
        }
    }

    /// Says the most passes the run may make.
    pub fn set_max_passes(&self, max: u64) {
        self.max_passes.store(max, Ordering::Relaxed);
    }

    /// A pass begins: the jobs of its first map are counted.
    pub fn start_pass(&self) {
        self.pass.fetch_add(1, Ordering::Relaxed);
        self.jobs.store(0, Ordering::Relaxed);
        self.jobs_done.store(0, Ordering::Relaxed);
        self.unclaimed.store(true, Ordering::Relaxed);
    }

    /// A map of `n` jobs begins on this rank: true when it is the pass's first, whose jobs
    /// are counted (the map then reports each one [`Progress::finished`]).
    pub(crate) fn claim(&self, n: u64) -> bool {
        let first = self.unclaimed.swap(false, Ordering::Relaxed);
        if first {
            self.jobs.store(n, Ordering::Relaxed);
        }
        first
    }

    /// One job finished on this rank.
    pub(crate) fn finished(&self) {
        self.jobs_done.fetch_add(1, Ordering::Relaxed);
    }

    /// The largest residual after a pass, and the tolerance it iterates to.
    pub fn set_residual(&self, residual: f64, tol: f64) {
        let last = self.residual.swap(residual.to_bits(), Ordering::Relaxed);
        self.previous.store(last, Ordering::Relaxed);
        self.tol.store(tol.to_bits(), Ordering::Relaxed);
    }

    /// The state now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        let f = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        let (residual, tol, previous) = (f(&self.residual), f(&self.tol), f(&self.previous));
        let residual_now = (residual.is_finite() && tol.is_finite()).then_some((residual, tol));
        // Passes left at the last pass's rate: residual · rateⁿ ≤ tol.
        let passes_left = residual_now.and_then(|(r, t)| {
            let rate = r / previous;
            (rate.is_finite() && rate > 0.0 && rate < 1.0 && r > t)
                .then(|| ((t / r).ln() / rate.ln()).ceil() as u64)
        });
        let (title, subject) = self.title.lock().map(|t| t.clone()).unwrap_or_default();
        ProgressSnapshot {
            title,
            subject,
            seconds: self.started.elapsed().as_secs_f64(),
            pass: self.pass.load(Ordering::Relaxed),
            max_passes: Some(self.max_passes.load(Ordering::Relaxed)).filter(|&m| m > 0),
            jobs: (
                self.jobs_done.load(Ordering::Relaxed),
                self.jobs.load(Ordering::Relaxed),
            ),
            residual: residual_now,
            passes_left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_run_counts_its_passes_from_none() {
        let p = Progress::default();
        p.begin_run(2);
        p.start_pass();
        p.start_pass();
        p.set_residual(1e-3, 1e-6);
        p.begin_run(4);
        p.start_pass();
        let s = p.snapshot();
        assert_eq!((s.pass, s.max_passes, s.residual), (1, Some(4), None));
    }

    #[test]
    fn passes_jobs_and_the_rate_of_convergence_are_read_back() {
        let p = Progress::default();
        assert_eq!(p.snapshot().pass, 0);
        assert_eq!(p.snapshot().residual, None);
        p.set_title("pca", "a test");
        p.set_max_passes(100);
        // Outside a pass nothing is counted; in one, the first map's jobs.
        assert!(!p.claim(5));
        p.start_pass();
        assert!(p.claim(8));
        assert!(!p.claim(2), "the pass's later maps are not counted");
        for _ in 0..3 {
            p.finished();
        }
        let s = p.snapshot();
        assert_eq!(
            (
                s.title.as_str(),
                s.subject.as_str(),
                s.pass,
                s.max_passes,
                s.jobs
            ),
            ("pca", "a test", 1, Some(100), (3, 8))
        );
        // A pass restarts the count of jobs.
        p.start_pass();
        assert_eq!(p.snapshot().jobs, (0, 0));
        // Residuals 1e-2 then 2e-3 to tol 1e-6: a fifth per pass, 4.7 passes left.
        p.set_residual(1e-2, 1e-6);
        assert_eq!(p.snapshot().passes_left, None);
        p.set_residual(2e-3, 1e-6);
        let s = p.snapshot();
        assert_eq!(s.residual, Some((2e-3, 1e-6)));
        assert_eq!(s.passes_left, Some(5));
        // Not converging: no estimate.
        p.set_residual(3e-3, 1e-6);
        assert_eq!(p.snapshot().passes_left, None);
    }
}
