//! Reading storage-backed operands: the plan's checks and the per-pass read-aheads.
//!
//! Passes over a stored matrix start one [`ReadAhead`] per actor, over the panels that
//! the pass must read (those not resident), in the actor's job order. The jobs take their
//! decoded panel from it; totals of what was read are kept for the reports.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use rankwise_exec::{ChunkGrid, ReadBuffers, Runtime, RuntimeError};
use rankwise_sources::{BufferPool, FetchAhead, ReadFn};
use rankwise_sources::{PanelLease, ReadAhead, ReadStats, StoredPanels};
use serde::{Deserialize, Serialize};

use crate::layout::TILE_ROWS;
use crate::LinalgError;

/// What one rank read from storage over a run.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
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

/// Decoded bytes a read-ahead segment aims at by default: small enough that a few per
/// actor cost little memory and stay warm, large enough that Blosc decodes few blocks
/// twice (a block straddling two segments is decoded for each; blocks are 256 KiB–4 MiB).
pub const DEFAULT_SEGMENT_BYTES: u64 = 16 << 20;

/// Rows per read-ahead segment when `stored` decodes row ranges without decoding whole
/// chunks ([`StoredPanels::partial_reads`]) and panels are taller than one segment: a
/// multiple of [`TILE_ROWS`] near `segment_bytes` of decoded values.
pub(crate) fn segment_rows(
    stored: &dyn StoredPanels,
    grid: &ChunkGrid,
    segment_bytes: u64,
) -> Option<u64> {
    if !stored.partial_reads() {
        return None;
    }
    let row = grid.cols.max(1) * stored.element_type().size() as u64;
    let tile = TILE_ROWS as u64;
    let rows = (segment_bytes / row / tile).max(1) * tile;
    (rows < grid.chunk_rows.min(grid.rows)).then_some(rows)
}

/// Checks that panels align to the stored chunk bands and describes one read buffer for
/// the memory plan: a whole panel, or with `segment_bytes` (a pass that reads in segments
/// where the source allows, [`segment_rows`]) one segment.
pub(crate) fn read_buffers(
    stored: &dyn StoredPanels,
    grid: &ChunkGrid,
    what: &str,
    segment_bytes: Option<u64>,
) -> Result<ReadBuffers, LinalgError> {
    let band = stored.chunk_rows();
    if !grid.chunk_rows.is_multiple_of(band) && grid.chunk_rows < grid.rows {
        return Err(LinalgError::Option {
            parameter: "chunk_rows",
            message: format!(
                "panels of {} rows do not align with the {band}-row chunks of {what}; use a \
                 multiple of {band} (or leave `chunk_rows` out to use the stored chunks)",
                grid.chunk_rows
            ),
        });
    }
    let (rows, unit) = match segment_bytes.and_then(|b| segment_rows(stored, grid, b)) {
        Some(r) => (r, "segment"),
        None => (grid.chunk_rows.min(grid.rows), "panel"),
    };
    let bytes = stored.buffer_bytes(rows);
    Ok(ReadBuffers {
        bytes,
        what: format!(
            "one decoded {unit} of {rows} rows × {} columns of {what}",
            grid.cols
        ),
    })
}

/// How a pass reads a stored operand: its panels' reader, and what the read-aheads tell
/// the source of the reads to come (so that a store with latency fetches across panels).
#[derive(Clone)]
pub(crate) struct StoredReads {
    pub(crate) read: Arc<ReadFn>,
    pub(crate) ahead: Arc<dyn FetchAhead>,
}

/// What the passes of one run over a stored operand share: the totals read, and each
/// actor's pool of buffers (reused from pass to pass).
#[derive(Default)]
pub(crate) struct Reading {
    totals: Mutex<ReadTotals>,
    pools: Mutex<Vec<Arc<BufferPool>>>,
}

impl Reading {
    /// Adds a read made outside the read-aheads (a GPU actor's frames decoded on its
    /// device), with the seconds it took.
    pub(crate) fn add(&self, stats: ReadStats, seconds: f64) {
        self.totals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(stats, seconds);
    }

    /// What this rank has read so far.
    pub(crate) fn totals(&self) -> ReadTotals {
        *self.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pool(&self, actor: usize) -> Arc<BufferPool> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if pools.len() <= actor {
            pools.resize_with(actor + 1, Arc::default);
        }
        Arc::clone(&pools[actor])
    }
}

/// The read-aheads of one pass, one per actor of this rank (none where nothing is read).
pub(crate) struct PassReads {
    reads: Vec<Option<ReadAhead>>,
    reading: Arc<Reading>,
    /// Per actor: panel → its read units.
    units: Vec<HashMap<usize, Units>>,
    segment_rows: Option<u64>,
}

/// The read units of one panel: their keys in the read-ahead, in row order, and the
/// panel's rows.
type Units = (Vec<usize>, Range<u64>);

/// Panels or read units with their rows, in order.
type UnitList = Vec<(usize, Range<u64>)>;

/// Splits each panel of `panels` (one actor's, in job order) into read units (segments of
/// `segment_rows`, or the whole panel) and orders the units for the read-ahead.
///
/// The actor's `workers` start the first `workers` panels together and each takes its
/// panel's units in row order, so the units of each group of `workers` consecutive panels
/// are interleaved (unit 0 of each, then unit 1 of each, …): read in panel order, the
/// second worker would wait for every unit of the first panel to be claimed while the
/// readers wait for the first worker to give buffers back, and a profile of `rsvd --zarr`
/// on two cores showed both sides idle a third of each pass.
///
/// This keeps the read-ahead free of deadlock ([`rankwise_sources::readahead`]): a group's
/// units are claimed only after every unit of the groups before it, and each panel of a
/// group is taken by a worker that waits for nothing but its own units, since no worker
/// takes a later panel before every panel of the group has been taken.
fn read_units(
    panels: UnitList,
    segment_rows: Option<u64>,
    workers: usize,
) -> (HashMap<usize, Units>, UnitList) {
    let mut map = HashMap::new();
    let mut list = Vec::new();
    for group in panels.chunks(workers.max(1)) {
        let split: Vec<Vec<Range<u64>>> = group
            .iter()
            .map(|(_, rows)| {
                let step = segment_rows.unwrap_or(rows.end - rows.start).max(1);
                let mut parts = Vec::new();
                let mut r = rows.start;
                while r < rows.end {
                    let stop = (r + step).min(rows.end);
                    parts.push(r..stop);
                    r = stop;
                }
                parts
            })
            .collect();
        let mut keys: Vec<Vec<usize>> = vec![Vec::new(); group.len()];
        let longest = split.iter().map(Vec::len).max().unwrap_or(0);
        for u in 0..longest {
            for (g, parts) in split.iter().enumerate() {
                if let Some(rows) = parts.get(u) {
                    keys[g].push(list.len());
                    list.push((list.len(), rows.clone()));
                }
            }
        }
        for ((p, rows), k) in group.iter().zip(keys) {
            map.insert(*p, (k, rows.clone()));
        }
    }
    (map, list)
}

/// How a job gets its panel's decoded values in a pass.
pub(crate) enum PanelRead<'r> {
    /// The panel is not read in this pass (resident, or not storage-backed).
    NotRead,
    /// Decoded whole.
    Whole(PanelLease),
    /// Decoded in segments, taken one at a time.
    Segments(Segments<'r>),
}

/// A panel that the actor's read-ahead decodes in segments of rows: the tiles of a row
/// block come from the segment holding it, and only a few segments are in memory at once
/// (the read-ahead's pool), however large the stored chunks are.
pub(crate) trait PanelSegments: Sync {
    /// Rows per segment (the last may be shorter); a multiple of [`TILE_ROWS`].
    fn segment_rows(&self) -> usize;
    /// Waits for segment `s` and lends it.
    fn take(&self, s: usize) -> Result<PanelLease, LinalgError>;
}

/// The segments of one panel (see [`PanelSegments`]).
pub(crate) struct Segments<'r> {
    reads: &'r PassReads,
    actor: usize,
    panel: usize,
    /// The read-ahead keys of the panel's segments, in row order.
    keys: &'r [usize],
    rows: usize,
}

impl PanelSegments for Segments<'_> {
    fn segment_rows(&self) -> usize {
        self.rows
    }

    fn take(&self, s: usize) -> Result<PanelLease, LinalgError> {
        let Some(&key) = self.keys.get(s) else {
            return Err(LinalgError::Panel {
                panel: self.panel,
                rows: format!("segment {s}"),
                message: format!("internal: the panel has {} segments", self.keys.len()),
            });
        };
        self.reads
            .take_unit(self.actor, self.panel, key, &format!("segment {s}"))
    }
}

impl PassReads {
    /// Starts the read-aheads: `order[a]` lists the panels actor `a` reads, in its job
    /// order; `buffers[a]` is the pool its plan allows. With `segment_rows`, panels are
    /// read in segments of that many rows ([`segment_rows`]).
    pub(crate) fn start(
        rt: &Runtime,
        stored: Option<StoredReads>,
        order: Vec<Vec<(usize, Range<u64>)>>,
        buffers: &[usize],
        reading: Arc<Reading>,
        segment_rows: Option<u64>,
    ) -> Result<PassReads, LinalgError> {
        let mut reads = Vec::with_capacity(order.len());
        let mut units = Vec::with_capacity(order.len());
        for (a, panels) in order.into_iter().enumerate() {
            let workers = rt.actors()[a].spec().cores.len().max(1);
            let (map, panels) = read_units(panels, segment_rows, workers);
            units.push(map);
            let Some(read) = stored.as_ref().filter(|_| !panels.is_empty()) else {
                reads.push(None);
                continue;
            };
            let spec = rt.actors()[a].spec();
            let cores = spec.pin.then(|| spec.cores.clone());
            reads.push(Some(
                ReadAhead::start(
                    panels,
                    buffers.get(a).copied().unwrap_or(1),
                    spec.cores.len(),
                    cores,
                    Arc::clone(&read.read),
                    Some(Arc::clone(&read.ahead)),
                    reading.pool(a),
                )
                .map_err(RuntimeError::Spawn)?,
            ));
        }
        Ok(PassReads {
            reads,
            reading,
            units,
            segment_rows,
        })
    }

    /// How actor `actor` gets panel `panel` in this pass.
    pub(crate) fn panel(&self, actor: usize, panel: usize) -> Result<PanelRead<'_>, LinalgError> {
        let Some((keys, rows)) = self.units.get(actor).and_then(|m| m.get(&panel)) else {
            return Ok(PanelRead::NotRead);
        };
        if self.reads.get(actor).and_then(Option::as_ref).is_none() {
            return Ok(PanelRead::NotRead);
        }
        Ok(match self.segment_rows {
            Some(rows) => PanelRead::Segments(Segments {
                reads: self,
                actor,
                panel,
                keys,
                rows: rows as usize,
            }),
            None => PanelRead::Whole(self.take_unit(
                actor,
                panel,
                keys.first().copied().unwrap_or_default(),
                &format!("{}..{}", rows.start, rows.end),
            )?),
        })
    }

    /// Actor `actor`'s decoded panel `panel`, when this pass reads it whole.
    pub(crate) fn take(
        &self,
        actor: usize,
        panel: usize,
        rows: &Range<u64>,
    ) -> Result<Option<PanelLease>, LinalgError> {
        match self.panel(actor, panel)? {
            PanelRead::NotRead => Ok(None),
            PanelRead::Whole(lease) => Ok(Some(lease)),
            PanelRead::Segments(_) => Err(LinalgError::Panel {
                panel,
                rows: format!("{}..{}", rows.start, rows.end),
                message: "internal: this pass reads the panel in segments".into(),
            }),
        }
    }

    fn take_unit(
        &self,
        actor: usize,
        panel: usize,
        unit: usize,
        what: &str,
    ) -> Result<PanelLease, LinalgError> {
        let r = self
            .reads
            .get(actor)
            .and_then(Option::as_ref)
            .expect("a unit is taken only from an actor that reads");
        let lease = r.take(unit).map_err(|e| LinalgError::Panel {
            panel,
            rows: what.to_string(),
            message: e.to_string(),
        })?;
        let mut t = self
            .reading
            .totals
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        t.add(lease.stats, lease.seconds);
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression test: segments were read panel after panel, so an actor's second worker
    /// waited for every segment of the first worker's panel to be claimed while the
    /// readers waited for buffers (`rsvd --zarr` on two cores idled a third of each pass).
    #[test]
    fn segments_of_panels_started_together_are_read_in_turn() {
        // Panels 3, 5, 8 (job order) of 25, 25 and 12 rows, segments of 10 rows, 2 workers.
        let panels = vec![(3, 0..25), (5, 25..50), (8, 50..62)];
        let (map, list) = read_units(panels, Some(10), 2);
        let rows: Vec<Range<u64>> = list.iter().map(|(_, r)| r.clone()).collect();
        assert_eq!(
            rows,
            vec![
                0..10,
                25..35,
                10..20,
                35..45,
                20..25,
                45..50,
                50..60,
                60..62
            ]
        );
        for (i, (key, _)) in list.iter().enumerate() {
            assert_eq!(*key, i, "keys are positions in the read order");
        }
        assert_eq!(map[&3], (vec![0, 2, 4], 0..25));
        assert_eq!(map[&5], (vec![1, 3, 5], 25..50));
        assert_eq!(map[&8], (vec![6, 7], 50..62));
        // Each panel's keys, in row order, cover its rows exactly.
        for (keys, rows) in map.values() {
            let covered: Vec<Range<u64>> = keys.iter().map(|&k| list[k].1.clone()).collect();
            assert_eq!(covered.first().map(|r| r.start), Some(rows.start));
            assert_eq!(covered.last().map(|r| r.end), Some(rows.end));
            assert!(covered.windows(2).all(|w| w[0].end == w[1].start));
        }
        // Whole panels (no segments) and one worker: the job order itself.
        let (_, list) = read_units(vec![(0, 0..7), (1, 7..9)], None, 1);
        assert_eq!(list, vec![(0, 0..7), (1, 7..9)]);
    }
}

/// One rank's part of [`read_stored`]: each of its panels' sums, what it read, and the
/// seconds its pass took.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StoredRead {
    /// `(panel, sum of its values)` for this rank's panels. The sum is taken in eight fixed
    /// lanes ([`rankwise_sources::SumLanes`]), whatever the segments a panel was read in,
    /// so the sum over panels in panel order is the same for any rank or actor count.
    pub panel_sums: Vec<(usize, f64)>,
    /// What this rank read.
    pub read: ReadTotals,
    /// Seconds from the pass's start (after a barrier) to this rank's last panel.
    pub seconds: f64,
    /// Panels of the whole matrix.
    pub panels: usize,
    /// Rows per panel.
    pub chunk_rows: u64,
}

/// Decodes every stored chunk of `source` once, on the actors that own its panels, with
/// the placement, read-ahead and buffers of a pass of the SVDs, and sums each panel's
/// values: the read half of every pass over a stored matrix, measured alone.
///
/// `chunk_rows` (rows per panel) must be a multiple of the stored chunk rows (the stored
/// chunks when `None`); `segment_bytes` is the decoded size a read-ahead segment aims at
/// ([`DEFAULT_SEGMENT_BYTES`]). Collective: every rank calls it.
pub fn read_stored<S>(
    rt: &Runtime,
    source: Arc<S>,
    chunk_rows: Option<u64>,
    segment_bytes: u64,
) -> Result<StoredRead, LinalgError>
where
    S: rankwise_sources::PanelSource + StoredPanels + 'static,
{
    let (m, n) = rankwise_sources::PanelSource::shape(source.as_ref());
    let band = StoredPanels::chunk_rows(source.as_ref());
    let grid = ChunkGrid::new(m, n, chunk_rows.unwrap_or(band))?;
    let world = rt.world();
    let placement = rankwise_exec::Placement::compute(grid.panels(), world);
    let what = rankwise_sources::PanelSource::describe(source.as_ref());
    let reads = read_buffers(source.as_ref(), &grid, &what, Some(segment_bytes))?;
    let segments = segment_rows(source.as_ref(), &grid, segment_bytes);
    let me = rt.rank();
    let mut order = Vec::new();
    let mut buffers = Vec::new();
    for a in placement.assignments.iter().filter(|a| a.rank == me) {
        let shape = &world.ranks[a.rank][a.actor];
        let plan =
            rankwise_exec::MemoryPlan::decide_reading(shape.memory, 0, shape.threads, 0, &reads)?;
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
    let ahead: Arc<dyn FetchAhead> = Arc::new(Arc::clone(&source));
    let reader = StoredReads {
        read: Arc::new(move |rows, buf| source.read_panel(rows, buf)),
        ahead,
    };

    rt.comm().barrier()?;
    let t = std::time::Instant::now();
    let pass = PassReads::start(
        rt,
        Some(reader),
        order,
        &buffers,
        Arc::clone(&totals),
        segments,
    )?;
    let sums = rt.map(inputs, move |actor, p| {
        let mut sum = rankwise_sources::SumLanes::default();
        match pass.panel(actor, p)? {
            PanelRead::Whole(lease) => sum.add(&lease.values),
            PanelRead::Segments(segs) => {
                let rows = grid.panel_rows(p);
                let count = (rows.end - rows.start).div_ceil(segs.segment_rows() as u64);
                for s in 0..count as usize {
                    sum.add(&segs.take(s)?.values);
                }
            }
            PanelRead::NotRead => unreachable!("every panel of a stored source is read"),
        }
        Ok::<_, LinalgError>((p, sum.total()))
    })?;
    let seconds = t.elapsed().as_secs_f64();
    let mut panel_sums = Vec::new();
    for list in sums {
        for r in list {
            panel_sums.push(r?);
        }
    }
    Ok(StoredRead {
        panel_sums,
        read: totals.totals(),
        seconds,
        panels: grid.panels(),
        chunk_rows: grid.chunk_rows,
    })
}
