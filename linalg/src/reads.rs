//! Reading storage-backed operands: the plan's checks and the per-pass read-aheads.
//!
//! Passes over a stored matrix start one [`ReadAhead`] per actor, over the panels that
//! the pass must read (those not resident), in the actor's job order. The jobs take their
//! decoded panel from it; totals of what was read are kept for the reports.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use rankwise_runtime::readahead::ReadFn;
use rankwise_runtime::{
    budget::format_bytes, ChunkGrid, PanelLease, ReadAhead, ReadBuffers, ReadStats, Runtime,
    RuntimeError, StoredPanels,
};
use serde::Serialize;

use crate::LinalgError;

/// What one rank read from storage over a run.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ReadTotals {
    /// Stored chunks decoded (over all passes).
    pub chunks: u64,
    /// Encoded bytes read.
    pub stored_bytes: u64,
    /// Bytes after decoding.
    pub decoded_bytes: u64,
    /// Seconds the read-ahead threads spent reading and decoding, summed over threads.
    pub decode_seconds: f64,
}

impl ReadTotals {
    fn add(&mut self, s: ReadStats, seconds: f64) {
        self.chunks += s.chunks;
        self.stored_bytes += s.stored_bytes;
        self.decoded_bytes += s.decoded_bytes;
        self.decode_seconds += seconds;
    }
}

/// Checks that panels align to the stored chunk bands and describes one band's buffer
/// for the memory plan.
pub fn read_buffers(
    stored: &dyn StoredPanels,
    grid: &ChunkGrid,
    what: &str,
) -> Result<ReadBuffers, LinalgError> {
    let band = stored.chunk_rows();
    if grid.chunk_rows % band != 0 && grid.chunk_rows < grid.rows {
        return Err(LinalgError::Option {
            option: "--chunk-rows",
            message: format!(
                "panels of {} rows do not align with the {band}-row chunks of {what}; use a \
                 multiple of {band} (or leave --chunk-rows out to use the stored chunks)",
                grid.chunk_rows
            ),
        });
    }
    let rows = grid.chunk_rows.min(grid.rows);
    let bytes = stored.buffer_bytes(rows);
    Ok(ReadBuffers {
        bytes,
        what: format!(
            "one decoded panel of {rows} rows × {} columns of {what} ({} with scratch)",
            grid.cols,
            format_bytes(bytes)
        ),
    })
}

/// The read-aheads of one pass, one per actor of this rank (none where nothing is read).
pub struct PassReads {
    reads: Vec<Option<ReadAhead>>,
    totals: Arc<Mutex<ReadTotals>>,
}

impl PassReads {
    /// Starts the read-aheads: `order[a]` lists the panels actor `a` reads, in its job
    /// order; `buffers[a]` is the pool its plan allows.
    pub fn start(
        rt: &Runtime,
        stored: Option<Arc<ReadFn>>,
        order: Vec<Vec<(usize, Range<u64>)>>,
        buffers: &[usize],
        totals: Arc<Mutex<ReadTotals>>,
    ) -> Result<PassReads, LinalgError> {
        let mut reads = Vec::with_capacity(order.len());
        for (a, panels) in order.into_iter().enumerate() {
            let Some(read) = stored.as_ref().filter(|_| !panels.is_empty()) else {
                reads.push(None);
                continue;
            };
            let spec = rt.actors()[a].spec();
            let cores = spec.pin.then(|| spec.cores.clone());
            let read = Arc::clone(read);
            reads.push(Some(
                ReadAhead::start(
                    panels,
                    buffers.get(a).copied().unwrap_or(1),
                    spec.cores.len(),
                    cores,
                    read,
                )
                .map_err(RuntimeError::Spawn)?,
            ));
        }
        Ok(PassReads { reads, totals })
    }

    /// Actor `actor`'s decoded panel `panel`, when this pass reads it.
    pub fn take(
        &self,
        actor: usize,
        panel: usize,
        rows: &Range<u64>,
    ) -> Result<Option<PanelLease>, LinalgError> {
        let Some(r) = self.reads.get(actor).and_then(Option::as_ref) else {
            return Ok(None);
        };
        let lease = r.take(panel).map_err(|e| LinalgError::Panel {
            panel,
            rows: format!("{}..{}", rows.start, rows.end),
            message: e.to_string(),
        })?;
        let mut t = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        t.add(lease.stats, lease.seconds);
        Ok(Some(lease))
    }
}
