//! `rankwise read`: decode every stored chunk of a Zarr array once, on the actors that
//! own them, and report the throughput and a checksum.
//!
//! It is the read half of every pass over a stored matrix, measured alone: the same
//! placement, read-ahead and buffers as `svd`/`rsvd --zarr`, with the multiply replaced by
//! a sum of the values (the checksum: summed per panel in eight fixed lanes, see
//! `SumLanes`, then in panel order, so it depends on neither the rank count nor the
//! segments a panel is read in).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use rankwise_exec::format_bytes;
use rankwise_exec::{ChunkGrid, MemoryPlan, Placement, Runtime};
use rankwise_linalg::reads::{
    read_buffers, segment_rows, PanelRead, PassReads, ReadTotals, Reading,
};
use rankwise_linalg::tiles::PanelSegments;
use rankwise_sources::{PanelSource, StoredPanels};
use rankwise_sources::{SumLanes, ZarrMatrix};
use serde_json::json;

use super::{zarr_error, CliError, RunArgs};
use crate::launcher::LaunchInfo;
use crate::report::seconds;
use rankwise::output::report::{peak_rss_bytes, RankReport, RunReport};

/// One rank's part of a read: each of its panels' sums (as bits, so that a NaN crosses
/// intact), what it read, and its seconds.
#[derive(serde::Serialize, serde::Deserialize)]
struct ReadWork {
    sums: Vec<(usize, u64)>,
    read: ReadTotals,
    seconds: f64,
}

/// What the report keeps of a rank's read.
#[derive(serde::Serialize, serde::Deserialize)]
struct ReadFigures {
    /// What it read.
    read: ReadTotals,
    /// Its seconds.
    seconds: f64,
}

/// `rankwise read`.
#[derive(Args, Debug, Clone)]
pub(super) struct ReadArgs {
    /// The Zarr array (`PATH` or `PATH:ARRAY`).
    #[arg(long, value_name = "PATH[:ARRAY]")]
    zarr: String,
    /// Rows per panel: a multiple of the stored chunk (or shard) rows; the stored chunks
    /// by default.
    #[arg(long)]
    chunk_rows: Option<u64>,
    #[command(flatten)]
    run: RunArgs,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Not used; accepted so that scripts can pass the same arguments as to `rsvd`.
    #[arg(long, hide = true)]
    out: Option<PathBuf>,
}

impl ReadArgs {
    pub(super) fn run(&self) -> &RunArgs {
        &self.run
    }
}

pub(super) fn read_command(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &ReadArgs,
) -> Result<Option<String>, CliError> {
    let started = Instant::now();
    let z = Arc::new(ZarrMatrix::open(&a.zarr).map_err(zarr_error)?);
    let (m, n) = PanelSource::shape(z.as_ref());
    let band = StoredPanels::chunk_rows(z.as_ref());
    let grid = ChunkGrid::new(m, n, a.chunk_rows.unwrap_or(band))?;
    let world = rt.world();
    let placement = Placement::compute(grid.panels(), world);
    let segment_bytes = a.run.segment_bytes()?;
    let reads = read_buffers(z.as_ref(), &grid, &z.describe(), Some(segment_bytes))?;
    let segments = segment_rows(z.as_ref(), &grid, segment_bytes);
    let me = rt.rank();
    let mut order = Vec::new();
    let mut buffers = Vec::new();
    for a in placement.assignments.iter().filter(|a| a.rank == me) {
        let shape = &world.ranks[a.rank][a.actor];
        let plan = MemoryPlan::decide_reading(shape.memory, 0, shape.threads, 0, &reads)?;
        buffers.push(plan.read_buffers);
        order.push(
            a.panels
                .clone()
                .map(|p| (p, grid.panel_rows(p)))
                .collect::<Vec<_>>(),
        );
    }
    let inputs: Vec<Vec<usize>> = order
        .iter()
        .map(|o| o.iter().map(|(p, _)| *p).collect())
        .collect();
    let totals = Arc::new(Reading::default());
    let z2 = Arc::clone(&z);
    let reader: Arc<rankwise_sources::ReadFn> = Arc::new(move |rows, buf| z2.read_panel(rows, buf));

    rt.comm().barrier()?;
    let t = Instant::now();
    let pass = PassReads::start(
        rt,
        Some(reader),
        order,
        &buffers,
        Arc::clone(&totals),
        segments,
    )?;
    let sums = rt.map(inputs, move |actor, p| {
        let sum = match pass.panel(actor, p)? {
            PanelRead::Whole(lease) => {
                let mut sum = SumLanes::default();
                sum.add(&lease.values);
                sum.total()
            }
            PanelRead::Segments(segs) => {
                let rows = grid.panel_rows(p);
                let count = (rows.end - rows.start).div_ceil(segs.segment_rows() as u64);
                let mut sum = SumLanes::default();
                for s in 0..count as usize {
                    sum.add(&segs.take(s)?.values);
                }
                sum.total()
            }
            PanelRead::NotRead => unreachable!("every panel is read"),
        };
        // As bits: JSON has no NaN (serde writes null), and a panel whose sum is NaN must
        // make the checksum NaN, not vanish from it.
        Ok::<_, CliError>((p, sum.to_bits()))
    })?;
    let mine_seconds = t.elapsed().as_secs_f64();
    let mut mine = Vec::new();
    for list in sums {
        for r in list {
            mine.push(r?);
        }
    }
    let gathered = super::gather_rank_figures(
        rt,
        ReadWork {
            sums: mine,
            read: totals.totals(),
            seconds: mine_seconds,
        },
    )?;
    let elapsed = t.elapsed().as_secs_f64();
    let Some(all) = gathered else {
        return Ok(None);
    };
    let mut by_panel = BTreeMap::new();
    let mut total = ReadTotals::default();
    let mut per_rank = Vec::new();
    for r in all {
        by_panel.extend(r.work.sums.iter().map(|&(p, s)| (p, f64::from_bits(s))));
        let read = r.work.read;
        total.chunks += read.chunks;
        total.stored_bytes += read.stored_bytes;
        total.decoded_bytes += read.decoded_bytes;
        total.decode_seconds += read.decode_seconds;
        // The panel sums have done their work: the report keeps what the rank read.
        per_rank.push(RankReport {
            rank: r.rank,
            hostname: r.hostname,
            actors: r.actors,
            peak_rss_bytes: r.peak_rss_bytes,
            comm: r.comm,
            work: ReadFigures {
                read,
                seconds: r.work.seconds,
            },
        });
    }
    let checksum: f64 = by_panel.values().sum();
    let cores: usize = world.ranks.iter().flatten().map(|a| a.threads.max(1)).sum();
    let gbps = total.decoded_bytes as f64 / elapsed / 1e9;
    let report = RunReport {
        command: "read".into(),
        body: json!({
            "zarr": a.zarr,
            "source": z.describe(),
            "shape": [m, n],
            "element_type": z.element_type(),
            "panels": grid.panels(),
            "chunk_rows": grid.chunk_rows,
            "cores": cores,
            "chunks": total.chunks,
            "stored_bytes": total.stored_bytes,
            "decoded_bytes": total.decoded_bytes,
            "decode_seconds": total.decode_seconds,
            "decoded_gb_per_s": gbps,
            "decoded_gb_per_s_per_core": gbps / cores as f64,
            "sum": checksum,
            // JSON writes a NaN or infinite sum as null: this says which it was.
            "sum_text": format!("{checksum}"),
        }),
        run: super::run_info(rt, launch, started),
        seconds: elapsed,
        per_rank,
    };
    if a.json {
        return Ok(Some(
            serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        ));
    }
    Ok(Some(format!(
        "rankwise read: {}\n  {} chunks in {} panels over {} actor(s) on {} rank(s), {} core(s)\n  \
         {} stored, {} decoded in {}: {:.2} GB/s decoded ({:.2} GB/s per core)\n  sum of \
         values {:.17e}; peak RSS rank 0 {}\n",
        z.describe(),
        total.chunks,
        grid.panels(),
        world.actors(),
        rt.comm().size(),
        cores,
        format_bytes(total.stored_bytes),
        format_bytes(total.decoded_bytes),
        seconds(elapsed),
        gbps,
        gbps / cores as f64,
        checksum,
        peak_rss_bytes()
            .map(format_bytes)
            .unwrap_or_else(|| "unknown".into())
    )))
}
