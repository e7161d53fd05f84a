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
use rankwise_exec::Runtime;
use rankwise_linalg::{read_stored, ReadTotals};
use rankwise_sources::{PanelSource, ZarrMatrix};
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
    let world = rt.world();
    let segment_bytes = a.run.segment_bytes()?;
    let mine = read_stored(rt, Arc::clone(&z), a.chunk_rows, segment_bytes)?;
    let t = Instant::now();
    let (panels, chunk_rows) = (mine.panels, mine.chunk_rows);
    let gathered = super::gather_rank_figures(
        rt,
        ReadWork {
            // As bits: JSON has no NaN (serde writes null), and a panel whose sum is NaN
            // must make the checksum NaN, not vanish from it.
            sums: mine
                .panel_sums
                .iter()
                .map(|&(p, s)| (p, s.to_bits()))
                .collect(),
            read: mine.read,
            seconds: mine.seconds,
        },
    )?;
    // From the pass's start (after its barrier) to the gathered figures, as before the
    // pass moved into the library.
    let elapsed = mine.seconds + t.elapsed().as_secs_f64();
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
            "panels": panels,
            "chunk_rows": chunk_rows,
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
        panels,
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
