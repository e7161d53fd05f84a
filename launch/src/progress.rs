//! Rank 0's progress display on stderr, from [`rankwise_exec::Progress`].
//!
//! Nothing shows for a run shorter than a second. After that: on a terminal, one line that
//! updates in place (an indicatif spinner); in a file (a Slurm job's output), a line every
//! 10 s for the first minute, then one a minute. Each line says what runs, the pass (of at
//! most how many), rank 0's share of the pass's panels, the time, and for an iteration to a
//! tolerance its largest residual and the passes it needs at its last rate.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rankwise_exec::{Progress, ProgressSnapshot};

use crate::report::seconds;

/// The display's thread; dropping it stops the thread and clears the line.
pub(crate) struct Display {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// A run shorter than this shows nothing.
const QUIET_FOR: Duration = Duration::from_secs(1);

impl Display {
    /// Starts showing `progress` (on rank 0).
    pub(crate) fn start(progress: Arc<Progress>) -> Display {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let terminal = std::io::stderr().is_terminal();
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || show(&progress, &flag, terminal))
            .ok();
        Display { stop, thread }
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn show(progress: &Progress, stop: &AtomicBool, terminal: bool) {
    let tick = Duration::from_millis(100);
    let mut bar: Option<ProgressBar> = None;
    let mut next_line = QUIET_FOR.as_secs_f64();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        let s = progress.snapshot();
        if s.seconds < QUIET_FOR.as_secs_f64() || s.pass == 0 {
            continue;
        }
        if terminal {
            let bar = bar.get_or_insert_with(|| {
                let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
                b.set_style(
                    ProgressStyle::with_template("{spinner} {wide_msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                b
            });
            bar.set_message(line(&s));
            bar.tick();
        } else if s.seconds >= next_line {
            eprintln!("{}", line(&s));
            next_line = s.seconds + if s.seconds < 60.0 { 10.0 } else { 60.0 };
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}

/// Where a run is, for the message of the signal that ends it: `in pass 3 (of at most
/// 100) of pca k = 10`; empty before a command says what runs.
pub(crate) fn whereabouts(s: &ProgressSnapshot) -> String {
    match (s.pass, s.title.as_str()) {
        (_, "") => String::new(),
        (0, title) => format!("in {title}, before its first pass"),
        (pass, title) => {
            let max = s
                .max_passes
                .map(|m| format!(" (of at most {m})"))
                .unwrap_or_default();
            format!("in pass {pass}{max} of {title}")
        }
    }
}

/// One line of progress.
pub(crate) fn line(s: &ProgressSnapshot) -> String {
    let mut out = String::from("rankwise");
    if !s.title.is_empty() {
        out.push(' ');
        out.push_str(&s.title);
    }
    out.push_str(&format!(": pass {}", s.pass));
    if let Some(max) = s.max_passes {
        out.push_str(&format!(" (of at most {max})"));
    }
    let (done, jobs) = s.jobs;
    if jobs > 0 {
        out.push_str(&format!(", rank 0 panels {done}/{jobs}"));
    }
    out.push_str(&format!(", {}", seconds(s.seconds)));
    let per_pass = s.seconds / s.pass.max(1) as f64;
    match (s.residual, s.passes_left) {
        (Some((r, tol)), left) => {
            out.push_str(&format!("; largest residual {r:.1e}, tol {tol:.0e}"));
            if let Some(left) = left {
                out.push_str(&format!(
                    ", about {left} passes ({}) to go",
                    seconds(left as f64 * per_pass)
                ));
            }
        }
        (None, _) => {
            if let Some(max) = s.max_passes.filter(|&m| m >= s.pass) {
                let left = (max - s.pass) as f64 + 1.0 - done as f64 / jobs.max(1) as f64;
                out.push_str(&format!("; about {} to go", seconds(left * per_pass)));
            }
        }
    }
    // Last, as a terminal's line is cut at its width.
    if !s.subject.is_empty() {
        out.push_str(&format!(" | {}", s.subject));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> ProgressSnapshot {
        ProgressSnapshot {
            title: "pca".into(),
            subject: "a test".into(),
            seconds: 12.0,
            pass: 3,
            max_passes: Some(100),
            jobs: (5, 8),
            residual: Some((3.2e-4, 1e-6)),
            passes_left: Some(9),
        }
    }

    #[test]
    fn a_line_says_what_runs_where_it_is_and_how_far_it_has_to_go() {
        assert_eq!(
            line(&snapshot()),
            "rankwise pca: pass 3 (of at most 100), rank 0 panels 5/8, 12.000 s; largest \
             residual 3.2e-4, tol 1e-6, about 9 passes (36.000 s) to go | a test"
        );
        // A fixed number of passes: the time left from the passes and panels to go.
        let fixed = ProgressSnapshot {
            max_passes: Some(4),
            residual: None,
            passes_left: None,
            jobs: (4, 8),
            ..snapshot()
        };
        assert_eq!(
            whereabouts(&snapshot()),
            "in pass 3 (of at most 100) of pca"
        );
        let before = ProgressSnapshot {
            pass: 0,
            ..snapshot()
        };
        assert_eq!(whereabouts(&before), "in pca, before its first pass");
        assert!(line(&fixed).ends_with("rank 0 panels 4/8, 12.000 s; about 6.000 s to go | a test"));
    }
}
