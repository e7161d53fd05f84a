//! `rankwise reduce`: `(x + C)[::S, ::S].sum()` of a generated matrix, tile by tile on the
//! actors that own the panels, with a fixed order of additions so the sum has the same
//! bits for any rank, actor or thread count ([`rankwise_linalg::reduce`]).
//!
//! It is the chunked elementwise-map-and-reduce of array libraries on rankwise's actors:
//! each actor generates only the rows and columns the stride selects, and the report gives
//! the rate at which those values were produced and summed.

use std::time::Instant;

use clap::Args;
use rankwise_exec::format_bytes;
use rankwise_exec::Runtime;
use rankwise_linalg::{strided_sum, StridedSum, StridedSumResult};
use rankwise_sources::{Dist, Generated, PanelSource};
use serde_json::json;

use super::{gather_rank_figures, CliError, RunArgs};
use crate::launcher::LaunchInfo;
use crate::report::seconds;
use rankwise::output::report::{peak_rss_bytes, RankReport, RunReport};

/// `rankwise reduce`.
#[derive(Args, Debug, Clone)]
pub(super) struct ReduceArgs {
    /// Rows of the generated matrix.
    #[arg(long)]
    rows: u64,
    /// Columns of the generated matrix.
    #[arg(long)]
    cols: u64,
    /// Rows per panel: a row of tiles, the unit placed on an actor.
    #[arg(long)]
    chunk_rows: u64,
    /// Columns per tile, the unit of work of an actor thread (default: all columns).
    #[arg(long)]
    chunk_cols: Option<u64>,
    /// Seed of the generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Distribution of the generated values: uniform, normal or genotype.
    #[arg(long, default_value = "uniform")]
    dist: Dist,
    /// Stride of the selection in both dimensions: rows and columns 0, S, 2S, … (`[::S, ::S]`).
    #[arg(long, default_value_t = 2)]
    step: u64,
    /// Constant added to every selected value before the sum (`x + C`).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    add: f64,
    /// Also form a compensated (Neumaier) sum of the same values and report how far the
    /// plain sum is from it.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    run: RunArgs,
    /// Print the report as JSON on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

impl ReduceArgs {
    pub(super) fn run(&self) -> &RunArgs {
        &self.run
    }

    fn spec(&self) -> StridedSum {
        StridedSum {
            chunk_rows: self.chunk_rows,
            chunk_cols: self.chunk_cols.unwrap_or(self.cols),
            step: self.step,
            add: self.add,
            check: self.check,
        }
    }

    /// The expression, as an array library spells it.
    fn expression(&self) -> String {
        format!("(x + {})[::{s}, ::{s}].sum()", self.add, s = self.step)
    }
}

/// Mean and variance of one generated value, where they are known in closed form (the
/// genotypes' depend on each row's allele frequency).
fn moments(dist: Dist) -> Option<(f64, f64)> {
    match dist {
        Dist::Uniform => Some((0.5, 1.0 / 12.0)),
        Dist::Normal => Some((0.0, 1.0)),
        Dist::Genotype => None,
    }
}

pub(super) fn reduce_command(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &ReduceArgs,
) -> Result<Option<String>, CliError> {
    let source = Generated::new(a.rows, a.cols, a.seed, a.dist);
    let spec = a.spec();
    // Every rank refuses bad options before any work.
    spec.grid(&source)?;
    rt.comm().barrier()?;
    let t = Instant::now();
    let r = strided_sum(rt, &source, &spec)?;
    let mine_seconds = t.elapsed().as_secs_f64();
    let ranks = gather_rank_figures(
        rt,
        ReduceWork {
            values: r.local_count,
            tiles: r.local_tiles,
            seconds: mine_seconds,
        },
    )?;
    let elapsed = t.elapsed().as_secs_f64();
    let Some(ranks) = ranks else {
        return Ok(None);
    };
    let report = report_json(rt, launch, a, &source, &r, ranks, (t, elapsed));
    if a.json {
        return Ok(Some(
            serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        ));
    }
    Ok(Some(summary_text(rt, a, &source, &r, &report, elapsed)))
}

/// How far the sum is from its expectation, in standard deviations of the sum of `count`
/// independent values: a statistical check that the values are what they claim to be.
fn z_score(a: &ReduceArgs, r: &StridedSumResult) -> Option<f64> {
    let (mean, var) = moments(a.dist)?;
    let n = r.count as f64;
    Some((r.sum - n * (mean + a.add)) / (n * var).sqrt())
}

/// One rank's share of a reduction.
#[derive(serde::Serialize, serde::Deserialize)]
struct ReduceWork {
    /// Values it summed.
    values: u64,
    /// Tiles it summed.
    tiles: usize,
    /// Its seconds.
    seconds: f64,
}

fn report_json(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &ReduceArgs,
    source: &Generated,
    r: &StridedSumResult,
    ranks: Vec<RankReport<ReduceWork>>,
    (start, elapsed): (Instant, f64),
) -> RunReport<serde_json::Value, ReduceWork> {
    let values_bytes = r.count * 8;
    let matrix_bytes = a.rows * a.cols * 8;
    let check = r.compensated.map(|c| {
        json!({
            "compensated_sum": c,
            "relative_difference": if c != 0.0 { ((r.sum - c) / c).abs() } else { (r.sum - c).abs() },
        })
    });
    let body = json!({
        "expression": a.expression(),
        "shape": [a.rows, a.cols],
        "matrix": {"dist": a.dist, "seed": a.seed, "source": PanelSource::describe(source)},
        "step": a.step,
        "add": a.add,
        "chunk_rows": r.grid.chunk_rows,
        "chunk_cols": r.chunk_cols,
        "panels": r.grid.panels(),
        "tiles": r.tiles,
        "sum": r.sum,
        "count": r.count,
        "mean": r.sum / r.count as f64,
        "z_score": z_score(a, r),
        "check": check,
        "values_bytes": values_bytes,
        "values_gb_per_s": values_bytes as f64 / elapsed / 1e9,
        "matrix_bytes": matrix_bytes,
        "matrix_gb_per_s": matrix_bytes as f64 / elapsed / 1e9,
    });
    RunReport {
        command: "reduce".into(),
        body,
        run: super::run_info(rt, launch, start),
        seconds: elapsed,
        per_rank: ranks,
    }
}

fn summary_text(
    rt: &Runtime,
    a: &ReduceArgs,
    source: &Generated,
    r: &StridedSumResult,
    report: &RunReport<serde_json::Value, ReduceWork>,
    elapsed: f64,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "rankwise reduce: {} of the {}",
        a.expression(),
        PanelSource::describe(source)
    );
    let _ = writeln!(
        s,
        "  {} tiles of {} × {} in {} panels; {} rank(s), {} actor(s), transport {}",
        r.tiles,
        r.grid.chunk_rows.min(r.grid.rows),
        r.chunk_cols,
        r.grid.panels(),
        rt.comm().size(),
        rt.world().actors(),
        rt.comm().name()
    );
    let _ = writeln!(
        s,
        "sum = {:.17e} over {} values (mean {:.9}{})",
        r.sum,
        r.count,
        r.sum / r.count as f64,
        z_score(a, r)
            .map(|z| format!(", {z:+.2} standard deviations from its expectation"))
            .unwrap_or_default()
    );
    if let Some(c) = r.compensated {
        let _ = writeln!(
            s,
            "check: compensated sum {c:.17e}; relative difference {:.2e}",
            report.body["check"]["relative_difference"]
                .as_f64()
                .unwrap_or(f64::NAN)
        );
    }
    let _ = writeln!(
        s,
        "total {}: {:.2} GB/s of values generated and summed ({}), {:.2} GB/s of the whole \
         {} matrix; peak RSS rank 0 {}",
        seconds(elapsed),
        report.body["values_gb_per_s"].as_f64().unwrap_or(0.0),
        format_bytes(r.count * 8),
        report.body["matrix_gb_per_s"].as_f64().unwrap_or(0.0),
        format_bytes(a.rows * a.cols * 8),
        peak_rss_bytes()
            .map(format_bytes)
            .unwrap_or_else(|| "unknown".into())
    );
    s
}
