//! `rankwise tasks`: the runtime's cost per task. N no-op tasks, one per chunk of a grid of N
//! one-row panels, placed on the actors as real panels are ([`Placement`]) and run through
//! [`Runtime::map`], the machinery every command's jobs go through; the time is what it
//! takes to hand them out and collect their results.

use std::time::Instant;

use clap::Args;
use rankwise_exec::{ChunkGrid, Placement, Runtime};
use serde_json::json;

use super::{gather_rank_figures, CliError, RunArgs};
use crate::launcher::LaunchInfo;
use crate::report::seconds;
use rankwise::output::report::RunReport;

/// One rank's tasks in each run.
#[derive(serde::Serialize, serde::Deserialize)]
struct TasksWork {
    /// Tasks it ran, per run.
    tasks: Vec<u64>,
    /// The sum of their chunk indices, per run.
    index_sums: Vec<u64>,
    /// Its seconds, per run.
    seconds: Vec<f64>,
}

/// `rankwise tasks`.
#[derive(Args, Debug, Clone)]
pub(super) struct TasksArgs {
    /// Number of no-op tasks (one per chunk of a grid of this many chunks).
    #[arg(long)]
    tasks: u64,
    /// Times to run the whole batch; the report gives every run and their median.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[command(flatten)]
    run: RunArgs,
    /// Print the report as JSON on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

impl TasksArgs {
    pub(super) fn run(&self) -> &RunArgs {
        &self.run
    }
}

/// One run on this rank: the tasks run and the sum of the chunk indices they returned.
fn one_run(rt: &Runtime, inputs: Vec<Vec<usize>>) -> Result<(u64, u64), CliError> {
    let results = rt.map(inputs, |_, chunk| std::hint::black_box(chunk))?;
    let mut count = 0u64;
    let mut index_sum = 0u64;
    for list in results {
        count += list.len() as u64;
        index_sum += list.iter().map(|&c| c as u64).sum::<u64>();
    }
    Ok((count, index_sum))
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub(super) fn tasks_command(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &TasksArgs,
) -> Result<Option<String>, CliError> {
    let started = Instant::now();
    if a.tasks == 0 {
        return Err(CliError::Option {
            option: "--tasks",
            message: "at least one task is needed".into(),
        });
    }
    if a.repeat == 0 {
        return Err(CliError::Option {
            option: "--repeat",
            message: "at least one run is needed".into(),
        });
    }
    let grid = ChunkGrid::new(a.tasks, 1, 1)?;
    let placement = Placement::compute(grid.panels(), rt.world());
    let me = rt.rank();
    let mine: Vec<std::ops::Range<usize>> = placement
        .assignments
        .iter()
        .filter(|x| x.rank == me)
        .map(|x| x.panels.clone())
        .collect();
    let comm = rt.comm();
    let mut times = Vec::with_capacity(a.repeat);
    let mut counts = Vec::with_capacity(a.repeat);
    let mut index_sums = Vec::with_capacity(a.repeat);
    for _ in 0..a.repeat {
        // The job lists are built before the clock starts, as a task graph is before it
        // is scheduled.
        let inputs: Vec<Vec<usize>> = mine.iter().map(|r| r.clone().collect()).collect();
        comm.barrier()?;
        let t = Instant::now();
        let (count, index_sum) = one_run(rt, inputs)?;
        times.push(t.elapsed().as_secs_f64());
        counts.push(count);
        index_sums.push(index_sum);
    }
    let Some(ranks) = gather_rank_figures(
        rt,
        TasksWork {
            tasks: counts,
            index_sums,
            seconds: times,
        },
    )?
    else {
        return Ok(None);
    };
    // A run ends when its slowest rank does; every task must have run exactly once.
    let mut run_seconds = vec![0.0f64; a.repeat];
    let mut run_tasks = vec![0u64; a.repeat];
    let mut run_index_sums = vec![0u64; a.repeat];
    for r in &ranks {
        for i in 0..a.repeat {
            let w = &r.work;
            run_seconds[i] = run_seconds[i].max(w.seconds.get(i).copied().unwrap_or(f64::NAN));
            run_tasks[i] += w.tasks.get(i).copied().unwrap_or(0);
            run_index_sums[i] += w.index_sums.get(i).copied().unwrap_or(0);
        }
    }
    let want_index_sum = a.tasks * (a.tasks - 1) / 2;
    if let Some(i) =
        (0..a.repeat).find(|&i| run_tasks[i] != a.tasks || run_index_sums[i] != want_index_sum)
    {
        return Err(CliError::Invariant(format!(
            "run {} returned {} results (chunk indices summing to {}) for {} tasks (indices \
             summing to {want_index_sum})",
            i + 1,
            run_tasks[i],
            run_index_sums[i],
            a.tasks
        )));
    }
    let med = median(&run_seconds);
    let threads: usize = rt.world().ranks.iter().flatten().map(|x| x.threads).sum();
    let report = RunReport {
        command: "tasks".into(),
        body: json!({
            "tasks": a.tasks,
            "tasks_run": run_tasks,
            "runs": a.repeat,
            "threads": threads,
            "run_seconds": run_seconds,
            "min_seconds": run_seconds.iter().copied().fold(f64::INFINITY, f64::min),
            "max_seconds": run_seconds.iter().copied().fold(0.0, f64::max),
            "tasks_per_second": a.tasks as f64 / med,
            "microseconds_per_task": med / a.tasks as f64 * 1e6,
        }),
        run: super::run_info(rt, launch, started),
        seconds: med,
        per_rank: ranks,
    };
    if a.json {
        return Ok(Some(
            serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        ));
    }
    Ok(Some(format!(
        "rankwise tasks: {} no-op tasks through {} actor(s) ({} thread(s)) on {} rank(s), \
         transport {}\n  median of {} run(s) {}: {:.0} tasks/s, {:.3} µs per task ({:.3} µs \
         per task per thread)\n",
        a.tasks,
        rt.world().actors(),
        threads,
        comm.size(),
        comm.name(),
        a.repeat,
        seconds(med),
        a.tasks as f64 / med,
        med / a.tasks as f64 * 1e6,
        med * threads as f64 / a.tasks as f64 * 1e6,
    )))
}
