//! Matrices a caller already holds in memory, read in place: the rows of a float matrix
//! (the C library's and the Python package's arrays), and a genotype dosage matrix.
//!
//! The values are never copied into a second matrix: the actors read the caller's buffer
//! panel by panel, as they read a store. A [`Lease`] marks the time the buffer is lent;
//! once it is dropped, any late read fails instead of touching memory that is the caller's
//! again.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ndarray::{s, ArrayView2, ArrayViewMut2, ShapeBuilder};
use rankwise_exec::Runtime;
use rankwise_sources::{
    dosage_of_call, fill_cols_f32_rounded, ElementType, GenotypeSource, PanelBuffer, PanelSource,
    PanelValues, ReadStats, SourceError, StoredPanels,
};

use crate::{Error, Input};

/// Default panels of an in-memory matrix hold at most this many bytes: several panels per
/// rank keep every actor busy, and the panel tree's messages stay `n × n` whatever the
/// panel size.
pub const DEFAULT_PANEL_BYTES: u64 = 8 << 20;

/// While alive, the caller's buffer is lent to the sources made with it; dropping it ends
/// the loan, and any later read fails with an error instead of reading the buffer.
#[derive(Debug)]
pub struct Lease {
    live: Arc<AtomicBool>,
}

impl Lease {
    fn new() -> (Lease, Arc<AtomicBool>) {
        let live = Arc::new(AtomicBool::new(true));
        (
            Lease {
                live: Arc::clone(&live),
            },
            live,
        )
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.live.store(false, Ordering::Release);
    }
}

/// A strided view of a caller's buffer of `T`: `rows × cols`, element strides (both
/// non-negative), the address as an integer so that the sources are `Send + Sync` (they
/// only read).
#[derive(Clone, Copy, Debug)]
struct Strided {
    ptr: usize,
    rows: usize,
    cols: usize,
    strides: (usize, usize),
}

impl Strided {
    /// # Safety
    /// The buffer holds `rows × cols` values of `T` at these strides and is readable.
    unsafe fn view<'a, T>(&self) -> ArrayView2<'a, T> {
        if self.rows == 0 || self.cols == 0 {
            return ArrayView2::from_shape((self.rows, self.cols), &[]).expect("empty view");
        }
        // SAFETY: the caller's promise; strides are non-negative, the extent fits isize.
        unsafe {
            ArrayView2::from_shape_ptr(
                (self.rows, self.cols).strides(self.strides),
                self.ptr as *const T,
            )
        }
    }
}

/// Checks a caller's strides: non-negative, and the last element within `isize`.
fn check_strides(
    parameter: &'static str,
    rows: usize,
    cols: usize,
    strides: (isize, isize),
    elem: usize,
) -> Result<(usize, usize), Error> {
    let bad = |message: String| Error::Parameter { parameter, message };
    if strides.0 < 0 || strides.1 < 0 {
        return Err(bad(format!(
            "negative strides {strides:?} are not read in place: pass a copy"
        )));
    }
    let (rs, cs) = (strides.0 as usize, strides.1 as usize);
    let last = (rows.saturating_sub(1))
        .checked_mul(rs)
        .and_then(|r| cols.saturating_sub(1).checked_mul(cs).map(|c| (r, c)))
        .and_then(|(r, c)| r.checked_add(c))
        .and_then(|e| e.checked_mul(elem));
    match last {
        Some(b) if b <= isize::MAX as usize => Ok((rs, cs)),
        _ => Err(bad(format!(
            "{rows} × {cols} values at strides {strides:?} do not fit in memory"
        ))),
    }
}

/// This rank's rows of a float matrix, read in place from the caller's buffer: global rows
/// `row0 .. row0 + rows` of an `m × cols` matrix. Other rows are never asked for, because
/// the placement keeps every panel on the rank that holds it.
#[derive(Debug)]
pub struct RowsInPlace {
    buf: Strided,
    /// The caller's values are f32 (else f64).
    f32: bool,
    row0: u64,
    m: u64,
    live: Arc<AtomicBool>,
}

/// The float types a caller's matrix may hold to be read in place: `f64`, and `f32`,
/// whose values the passes multiply as f32 tiles or widen exactly to f64 ones.
pub trait InPlaceFloat: Copy + private::Sealed {
    /// Whether this is `f32`.
    #[doc(hidden)]
    const F32: bool;
}

impl InPlaceFloat for f64 {
    const F32: bool = false;
}

impl InPlaceFloat for f32 {
    const F32: bool = true;
}

mod private {
    pub trait Sealed {}
    impl Sealed for f64 {}
    impl Sealed for f32 {}
}

impl RowsInPlace {
    /// Global rows `row0 .. row0 + rows` of an `m × cols` matrix, this rank's block, in the
    /// caller's buffer (`rows × cols` values of `T` at element `strides`), for a caller that
    /// has agreed on `row0` and `m` with the other ranks itself (the C library);
    /// [`rows_in_place`] does that agreement. Returns the source and its [`Lease`].
    ///
    /// # Safety
    /// As [`rows_in_place`].
    pub unsafe fn new<T: InPlaceFloat>(
        ptr: *const T,
        rows: usize,
        cols: usize,
        strides: (isize, isize),
        row0: u64,
        m: u64,
    ) -> Result<(RowsInPlace, Lease), Error> {
        let strides = check_strides("a", rows, cols, strides, std::mem::size_of::<T>())?;
        let (lease, live) = Lease::new();
        Ok((
            RowsInPlace {
                buf: Strided {
                    ptr: ptr as usize,
                    rows,
                    cols,
                    strides,
                },
                f32: T::F32,
                row0,
                m,
                live,
            },
            lease,
        ))
    }
}

impl RowsInPlace {
    /// Rows `rows` as a view of the caller's values, when they are `T`, each row is
    /// contiguous, the loan is live and the rows are this rank's.
    fn contiguous<T: InPlaceFloat>(&self, rows: Range<u64>) -> Option<ArrayView2<'_, T>> {
        let contiguous = self.buf.strides.1 == 1 || self.buf.cols <= 1;
        contiguous.then(|| self.strided(rows)).flatten()
    }

    /// Rows `rows` as a view of the caller's values at their strides, when they are `T`,
    /// the loan is live and the rows are this rank's.
    fn strided<T: InPlaceFloat>(&self, rows: Range<u64>) -> Option<ArrayView2<'_, T>> {
        let mine = self.row0..self.row0 + self.buf.rows as u64;
        if T::F32 != self.f32
            || !self.live.load(Ordering::Acquire)
            || rows.start < mine.start
            || rows.end > mine.end
            || rows.start > rows.end
        {
            return None;
        }
        // SAFETY: the buffer holds this rank's rows of `T` (in_place) and is lent (live);
        // the view is borrowed from the source, which the call holding the loan keeps.
        let all = unsafe { self.buf.view::<T>() };
        Some(all.slice_move(s![
            (rows.start - self.row0) as usize..(rows.end - self.row0) as usize,
            ..
        ]))
    }
}

impl PanelSource for RowsInPlace {
    fn shape(&self) -> (u64, u64) {
        (self.m, self.buf.cols as u64)
    }

    fn fill(&self, rows: Range<u64>, out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError> {
        self.fill_cols(rows, 0..self.buf.cols as u64, out)
    }

    fn fill_cols(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        mut out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), SourceError> {
        let mine = self.row0..self.row0 + self.buf.rows as u64;
        if !self.live.load(Ordering::Acquire)
            || rows.start < mine.start
            || rows.end > mine.end
            || rows.start > rows.end
            || cols.start > cols.end
            || cols.end > self.buf.cols as u64
            || out.dim()
                != (
                    (rows.end - rows.start) as usize,
                    (cols.end - cols.start) as usize,
                )
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: self.shape(),
                what: self.describe(),
            });
        }
        let (r0, r1) = (
            (rows.start - self.row0) as usize,
            (rows.end - self.row0) as usize,
        );
        let cols = cols.start as usize..cols.end as usize;
        if self.f32 {
            // SAFETY: the buffer holds this rank's rows (in_place) and is lent (live).
            let all = unsafe { self.buf.view::<f32>() };
            out.zip_mut_with(&all.slice(s![r0..r1, cols]), |o, &v| *o = f64::from(v));
            return Ok(());
        }
        // SAFETY: the buffer holds this rank's rows (in_place) and is lent (live).
        let all = unsafe { self.buf.view::<f64>() };
        out.assign(&all.slice(s![r0..r1, cols]));
        Ok(())
    }

    /// Rounded as it is copied: the default would fill an f64 tile first, allocated and
    /// zeroed for every tile.
    fn fill_cols_f32(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        mut out: ArrayViewMut2<'_, f32>,
    ) -> Result<(), SourceError> {
        let fits = cols.start <= cols.end
            && cols.end <= self.buf.cols as u64
            && rows.start <= rows.end
            && out.dim()
                == (
                    (rows.end - rows.start) as usize,
                    (cols.end - cols.start) as usize,
                );
        let c = cols.start as usize..cols.end as usize;
        if let Some(all) = fits.then(|| self.strided::<f32>(rows.clone())).flatten() {
            out.assign(&all.slice(s![.., c]));
            return Ok(());
        }
        let Some(all) = fits.then(|| self.rows_in_memory(rows.clone())).flatten() else {
            // f64 rows of another layout, rows outside the loan or of another shape:
            // through an f64 tile, whose fill names what is wrong.
            return fill_cols_f32_rounded(self, rows, cols, out);
        };
        let tile = all.slice(s![.., c]);
        for (mut o, t) in out.rows_mut().into_iter().zip(tile.rows()) {
            match (o.as_slice_mut(), t.as_slice()) {
                (Some(o), Some(t)) => o.iter_mut().zip(t).for_each(|(o, &v)| *o = v as f32),
                _ => o.zip_mut_with(&t, |o, &v| *o = v as f32),
            }
        }
        Ok(())
    }

    /// The caller's rows where they lie, when each is contiguous (a C-ordered array): the
    /// passes then multiply them in place, where copying every tile out first cost as much
    /// as the multiplication.
    fn rows_in_memory(&self, rows: Range<u64>) -> Option<ArrayView2<'_, f64>> {
        self.contiguous::<f64>(rows)
    }

    /// As [`Self::rows_in_memory`], for a caller's f32 rows.
    fn rows_in_memory_f32(&self, rows: Range<u64>) -> Option<ArrayView2<'_, f32>> {
        self.contiguous::<f32>(rows)
    }

    fn holds_f32(&self) -> bool {
        self.f32
    }

    /// The caller's rows are in memory already: reading them again is a copy at memory
    /// speed, where keeping a copy doubles the matrix's memory and costs its fresh pages
    /// (the C library's `rankwise_rsvd` of a row-major 200,000 × 2,000 matrix on 2 ranks,
    /// Intel model 207 guest: pass 1 took 6.63 s keeping copies, 38 % of it in the
    /// kernel clearing pages, against 0.49 s for a later pass).
    fn cheaper_to_reproduce(&self) -> bool {
        true
    }

    fn describe(&self) -> String {
        format!(
            "the caller's rows {}..{} of {} × {}",
            self.row0,
            self.row0 + self.buf.rows as u64,
            self.m,
            self.buf.cols
        )
    }
}

/// How a matrix whose row blocks the ranks hold in rank order (rank 0 the first rows)
/// splits into panels that never span two ranks: what [`rows_in_place`] and the C
/// library agree on from every rank's row count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowBlocks {
    /// Rows of the whole matrix.
    pub rows: u64,
    /// Rows of a panel.
    pub panel_rows: u64,
    /// This rank's first row.
    pub row0: u64,
    /// Panels each rank holds, in rank order.
    pub rank_panels: Vec<usize>,
}

impl RowBlocks {
    /// From every rank's row count (`rows_per_rank`, in rank order) and the panel rows
    /// requested (0: [`panel_rows`]' choice), for rank `me`. Refuses, naming `a`, a
    /// matrix that is not tall (rows ≥ columns ≥ 1) or whose rows overflow, and, naming
    /// `panel_rows`, a rank before the last whose rows are not a multiple of the panel
    /// rows.
    pub fn agree(
        rows_per_rank: &[u64],
        cols: u64,
        panel_rows_requested: u64,
        me: usize,
    ) -> Result<RowBlocks, Error> {
        let m = rows_per_rank
            .iter()
            .try_fold(0u64, |s, &r| s.checked_add(r))
            .ok_or_else(|| Error::Parameter {
                parameter: "a",
                message: "the ranks' rows overflow a 64-bit count".into(),
            })?;
        if m < cols || cols == 0 {
            return Err(Error::Parameter {
                parameter: "a",
                message: format!(
                    "the ranks hold {m} rows of {cols} columns: the matrix must be tall \
                     (rows ≥ columns ≥ 1); pass the transpose"
                ),
            });
        }
        let p = panel_rows(panel_rows_requested, rows_per_rank, cols);
        if let Some((rank, r)) = rows_per_rank[..rows_per_rank.len() - 1]
            .iter()
            .enumerate()
            .find(|(_, &r)| r % p != 0)
        {
            return Err(Error::Parameter {
                parameter: "panel_rows",
                message: format!(
                    "rank {rank} holds {r} rows, not a multiple of the panel rows {p}: a \
                     panel never spans two ranks, so every rank but the last holds a \
                     multiple of the panel rows"
                ),
            });
        }
        Ok(RowBlocks {
            rows: m,
            panel_rows: p,
            row0: rows_per_rank[..me.min(rows_per_rank.len())].iter().sum(),
            rank_panels: rows_per_rank
                .iter()
                .map(|&r| r.div_ceil(p) as usize)
                .collect(),
        })
    }
}

/// The rows of a panel, by the rule of the C library's header: the greatest common divisor
/// of the row counts of every rank but the last (so that no panel spans two ranks), or its
/// largest divisor whose panel fits [`DEFAULT_PANEL_BYTES`] but is not shorter than the
/// matrix is wide; where none fits, its smallest divisor that is that tall, so that a
/// rank's actors still share its rows. Where only the last rank holds rows, any count
/// divides them (its last panel may be shorter): the fewest equal panels that fit, or
/// else the most that stay that tall. `requested` > 0 is taken as it is.
///
/// Wide rows outgrow the byte budget: one rank's 50,000 × 20,000 matrix, which has no
/// divisor that both fits and is tall, was one panel, so one actor multiplied it while the
/// other waited (`rankwise.rsvd`, f64, q = 2, on 2 cores: 9.7 s in one panel, 5.2–5.4 s in
/// two of 25,000 rows; `benches/RESULTS.md`).
pub fn panel_rows(requested: u64, rows_per_rank: &[u64], cols: u64) -> u64 {
    if requested > 0 {
        return requested;
    }
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let Some((last, rest)) = rows_per_rank.split_last() else {
        return 1;
    };
    let fits = |d: u64| d.saturating_mul(cols.saturating_mul(8)) <= DEFAULT_PANEL_BYTES;
    let g = rest.iter().fold(0, |g, &r| gcd(g, r));
    if g == 0 {
        // Only the last rank holds rows: panels of equal size, as many as the budget asks
        // for, but no more than keep every one at least `cols` tall.
        let rows = (*last).max(1);
        if fits(rows) || rows < cols.saturating_mul(2) {
            return rows;
        }
        let fitting = (DEFAULT_PANEL_BYTES / cols.saturating_mul(8).max(1)).max(1);
        let count = if fitting >= cols {
            rows.div_ceil(fitting)
        } else {
            rows / cols.max(1)
        };
        return rows.div_ceil(count.max(1));
    }
    if fits(g) {
        return g;
    }
    let divisors = (1u64..)
        .take_while(|d: &u64| d * d <= g)
        .filter(|d| g % d == 0)
        .flat_map(|d| [d, g / d]);
    let tall = || divisors.clone().filter(|&c| c >= cols);
    tall()
        .filter(|&c| fits(c))
        .max()
        .or_else(|| tall().min())
        .unwrap_or(g)
}

/// The matrix whose row blocks the ranks of `rt` hold, each rank passing its own block
/// (`rows × cols` values of `T`, f64 or f32, at element `strides`): a collective call.
/// The ranks' blocks stack in rank order; panels of `panel_rows` rows (0:
/// [`panel_rows`]'s default) stay on the rank that holds them. Returns the input and the
/// [`Lease`] of the buffer: keep it alive for every call on the input. f32 values are
/// read as they are, never copied to f64 first: f32 tiles multiply them where they lie
/// and f64 tiles widen them exactly.
///
/// # Safety
/// `ptr` must point to `rows × cols` values of `T` at `strides` (in elements), readable
/// and not written until the lease is dropped.
pub unsafe fn rows_in_place<T: InPlaceFloat>(
    rt: &Runtime,
    ptr: *const T,
    rows: usize,
    cols: usize,
    strides: (isize, isize),
    panel_rows_requested: u64,
) -> Result<(Input, Lease), Error> {
    let local = check_strides("a", rows, cols, strides, std::mem::size_of::<T>()).map(|_| strides);
    let blocks = agree_blocks(
        rt,
        local.is_ok(),
        "passed an array that cannot be read in place",
        rows as u64,
        cols as u64,
        panel_rows_requested,
    );
    let strides = local?;
    let RowBlocks {
        rows: m,
        panel_rows: p,
        row0,
        rank_panels,
    } = blocks?;
    // SAFETY: the caller's promise, passed on.
    let (source, lease) = unsafe { RowsInPlace::new(ptr, rows, cols, strides, row0, m)? };
    Ok((
        Input::Rows {
            source: Arc::new(source),
            panel_rows: p,
            rank_panels: Some(rank_panels),
        },
        lease,
    ))
}

/// The collective agreement of [`rows_in_place`] and [`rows_pulled`]: every rank sends
/// whether its own arguments are usable (`usable`; `unusable` says what a rank that is
/// not did), its rows and its columns, and all get the same [`RowBlocks`] or the same
/// refusal. Every rank takes part, a rank with bad arguments too, so that none is left
/// waiting.
fn agree_blocks(
    rt: &Runtime,
    usable: bool,
    unusable: &str,
    rows: u64,
    cols: u64,
    panel_rows_requested: u64,
) -> Result<RowBlocks, Error> {
    let mut mine = Vec::with_capacity(24);
    mine.extend_from_slice(&(usable as u64).to_le_bytes());
    mine.extend_from_slice(&rows.to_le_bytes());
    mine.extend_from_slice(&cols.to_le_bytes());
    let all = rt.comm().allgather_bytes(&mine)?;
    let word = |b: &[u8], i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap());
    let mut counts = Vec::with_capacity(all.len());
    for (rank, b) in all.iter().enumerate() {
        if b.len() != 24 {
            return Err(Error::Parameter {
                parameter: "a",
                message: format!("rank {rank} sent a malformed shape"),
            });
        }
        if word(b, 0) == 0 {
            return Err(Error::Parameter {
                parameter: "a",
                message: format!("rank {rank} {unusable}"),
            });
        }
        if word(b, 2) != cols {
            return Err(Error::Parameter {
                parameter: "a",
                message: format!(
                    "this rank's block has {cols} columns but rank {rank}'s has {}: every \
                     rank holds whole rows of one matrix",
                    word(b, 2)
                ),
            });
        }
        counts.push(word(b, 1));
    }
    RowBlocks::agree(&counts, cols, panel_rows_requested, rt.rank())
}

/// A caller's function that produces rows of its matrix on demand: a matrix that is
/// nowhere in memory as a whole (a dask array computed chunk by chunk, a simulation's
/// output). The actors ask for one panel at a time, within the memory budget, each
/// panel once per pass unless the plan keeps it resident.
pub trait RowPuller: Send + Sync {
    /// Writes rows `rows` of this rank's block (local row numbers, from 0) into `out`,
    /// row-major: `rows.len() × cols` values. An error is a message; the read fails with
    /// it, naming the source and the rows.
    fn pull(&self, rows: Range<u64>, out: &mut [f64]) -> Result<(), String>;
    /// What the caller's matrix is, for errors and reports.
    fn describe(&self) -> String;
}

/// This rank's rows of a matrix that a [`RowPuller`] produces, one panel at a time: a
/// source read from "storage" whose bands are the panels, so that each panel is pulled
/// whole, once per pass, into a read buffer that the memory plan counts.
struct PulledRows {
    puller: Arc<dyn RowPuller>,
    row0: u64,
    rows: u64,
    m: u64,
    cols: u64,
    panel_rows: u64,
}

impl PulledRows {
    fn out_of_bounds(&self, rows: Range<u64>) -> SourceError {
        SourceError::OutOfBounds {
            rows,
            cols: self.cols as usize,
            shape: (self.m, self.cols),
            what: self.puller.describe(),
        }
    }

    /// Pulls global rows `rows` (all on this rank) into `out`, row-major.
    fn pull_into(&self, rows: Range<u64>, out: &mut [f64]) -> Result<(), SourceError> {
        if rows.start < self.row0 || rows.end > self.row0 + self.rows || rows.start > rows.end {
            return Err(self.out_of_bounds(rows));
        }
        let local = rows.start - self.row0..rows.end - self.row0;
        self.puller
            .pull(local, out)
            .map_err(|message| SourceError::Caller {
                what: self.puller.describe(),
                rows,
                message,
            })
    }
}

impl PanelSource for PulledRows {
    fn shape(&self) -> (u64, u64) {
        (self.m, self.cols)
    }

    fn fill(&self, rows: Range<u64>, mut out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError> {
        let h = rows.end.saturating_sub(rows.start) as usize;
        if out.dim() != (h, self.cols as usize) {
            return Err(self.out_of_bounds(rows));
        }
        match out.as_slice_mut() {
            Some(dst) => self.pull_into(rows, dst),
            None => {
                let mut tmp = vec![0.0; h * self.cols as usize];
                self.pull_into(rows, &mut tmp)?;
                let view = ArrayView2::from_shape((h, self.cols as usize), &tmp)
                    .expect("the shape of the buffer");
                out.assign(&view);
                Ok(())
            }
        }
    }

    fn describe(&self) -> String {
        self.puller.describe()
    }

    fn stored(&self) -> Option<&dyn StoredPanels> {
        Some(self)
    }
}

impl StoredPanels for PulledRows {
    fn chunk_rows(&self) -> u64 {
        self.panel_rows
    }

    fn element_type(&self) -> ElementType {
        ElementType::F64
    }

    fn buffer_bytes(&self, rows: u64) -> u64 {
        // The read buffer, and the array the caller's function returns before it is
        // copied there.
        2 * rows * self.cols * 8
    }

    fn stored_bytes(&self, rows: Range<u64>) -> u64 {
        rows.end.saturating_sub(rows.start) * self.cols * 8
    }

    fn read_panel(
        &self,
        rows: Range<u64>,
        buf: &mut PanelBuffer,
    ) -> Result<ReadStats, SourceError> {
        let h = rows.end.saturating_sub(rows.start) as usize;
        let len = h * self.cols as usize;
        buf.rows = h;
        buf.cols = self.cols as usize;
        buf.values.resize(ElementType::F64, len);
        let PanelValues::F64(dst) = &mut buf.values else {
            unreachable!("resized to f64")
        };
        self.pull_into(rows, dst)?;
        Ok(ReadStats {
            chunks: 1,
            stored_bytes: 8 * len as u64,
            decoded_bytes: 8 * len as u64,
        })
    }
}

/// The matrix whose row blocks the ranks of `rt` produce with their [`RowPuller`]s, each
/// rank's `rows × cols` block in rank order: a collective call, as [`rows_in_place`]. Each
/// panel (`panel_rows_requested` rows, 0: [`panel_rows`]' default) is pulled whole when a
/// pass reads it, so a panel that matches the caller's own chunks of rows computes each
/// of them once per pass.
pub fn rows_pulled(
    rt: &Runtime,
    puller: Arc<dyn RowPuller>,
    rows: u64,
    cols: u64,
    panel_rows_requested: u64,
) -> Result<Input, Error> {
    let RowBlocks {
        rows: m,
        panel_rows,
        row0,
        rank_panels,
    } = agree_blocks(rt, true, "", rows, cols, panel_rows_requested)?;
    Ok(Input::Rows {
        source: Arc::new(PulledRows {
            puller,
            row0,
            rows,
            m,
            cols,
            panel_rows,
        }),
        panel_rows,
        rank_panels: Some(rank_panels),
    })
}

/// A genotype matrix in the caller's memory: dosages (0, 1, 2 copies of the alternate
/// allele, −1 for a missing call), variants × samples, as `i8`. Every rank holds all of it.
#[derive(Debug)]
pub struct DosagesInPlace {
    buf: Strided,
    sample_ids: Option<Vec<String>>,
    live: Arc<AtomicBool>,
}

impl GenotypeSource for DosagesInPlace {
    fn shape(&self) -> (u64, u64) {
        (self.buf.rows as u64, self.buf.cols as u64)
    }

    fn fill_dosages(
        &self,
        rows: Range<u64>,
        mut out: ArrayViewMut2<'_, i8>,
    ) -> Result<(), SourceError> {
        if !self.live.load(Ordering::Acquire)
            || rows.start > rows.end
            || rows.end > self.buf.rows as u64
            || out.dim() != ((rows.end - rows.start) as usize, self.buf.cols)
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: GenotypeSource::shape(self),
                what: self.describe(),
            });
        }
        // SAFETY: the buffer holds the matrix (dosages_in_place) and is lent (live).
        let all = unsafe { self.buf.view::<i8>() };
        out.assign(&all.slice(s![rows.start as usize..rows.end as usize, ..]));
        Ok(())
    }

    fn describe(&self) -> String {
        format!("the caller's {} × {} dosages", self.buf.rows, self.buf.cols)
    }

    fn sample_ids(&self) -> Option<Vec<String>> {
        self.sample_ids.clone()
    }

    /// As a PLINK fileset's: panels of at most 128 MiB of dosages, and at least 64 panels
    /// where there are enough variants, so that every actor gets some.
    fn preferred_panel_rows(&self) -> u64 {
        ((128u64 << 20) / self.buf.cols.max(1) as u64)
            .min((self.buf.rows as u64).div_ceil(64))
            .max(1)
    }
}

/// A genotype matrix the caller holds (`variants × samples` dosages as `i8` at element
/// `strides`; −1 for a missing call), with the samples' IDs where known. Every rank that
/// calls a PCA on it must hold the same matrix. Returns the input and the [`Lease`] of the
/// buffer: keep it alive for every call on the input.
///
/// # Safety
/// `ptr` must point to `variants × samples` i8 values at `strides`, readable and not
/// written until the lease is dropped.
pub unsafe fn dosages_in_place(
    ptr: *const i8,
    variants: usize,
    samples: usize,
    strides: (isize, isize),
    sample_ids: Option<Vec<String>>,
) -> Result<(Input, Lease), Error> {
    let strides = check_strides("dosages", variants, samples, strides, 1)?;
    if variants == 0 || samples == 0 {
        return Err(Error::Parameter {
            parameter: "dosages",
            message: format!("{variants} variants × {samples} samples: nothing to analyse"),
        });
    }
    if let Some(ids) = &sample_ids {
        if ids.len() != samples {
            return Err(Error::Parameter {
                parameter: "sample_ids",
                message: format!("{} IDs for {samples} samples", ids.len()),
            });
        }
    }
    let (lease, live) = Lease::new();
    let source = DosagesInPlace {
        buf: Strided {
            ptr: ptr as usize,
            rows: variants,
            cols: samples,
            strides,
        },
        sample_ids,
        live,
    };
    Ok((Input::Genotypes(Arc::new(source)), lease))
}

/// VCF Zarr's `call_genotype` in the caller's memory (variants × samples × ploidy allele
/// indices as `i8`, an sgkit Dataset's), with its `call_genotype_mask` where there is
/// one: each call's dosage is counted as it is read ([`rankwise_sources::dosage_of_call`],
/// the rule of a VCF Zarr store), so no dosage matrix is made first.
#[derive(Debug)]
pub struct CallsInPlace {
    ptr: usize,
    shape: (usize, usize, usize),
    strides: [usize; 3],
    /// The mask's address and strides (bytes, one per allele).
    mask: Option<(usize, [usize; 3])>,
    sample_ids: Option<Vec<String>>,
    live: Arc<AtomicBool>,
}

impl GenotypeSource for CallsInPlace {
    fn shape(&self) -> (u64, u64) {
        (self.shape.0 as u64, self.shape.1 as u64)
    }

    fn fill_dosages(
        &self,
        rows: Range<u64>,
        mut out: ArrayViewMut2<'_, i8>,
    ) -> Result<(), SourceError> {
        let (variants, samples, ploidy) = self.shape;
        if !self.live.load(Ordering::Acquire)
            || rows.start > rows.end
            || rows.end > variants as u64
            || out.dim() != ((rows.end - rows.start) as usize, samples)
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: GenotypeSource::shape(self),
                what: self.describe(),
            });
        }
        let [sv, ss, sp] = self.strides;
        let mut alleles = vec![0i8; ploidy];
        for (r, v) in (rows.start as usize..rows.end as usize).enumerate() {
            for j in 0..samples {
                for (i, a) in alleles.iter_mut().enumerate() {
                    // SAFETY: v < variants, j < samples, i < ploidy: inside the buffer
                    // (calls_in_place checked its extent), which is lent (live).
                    *a = unsafe { *(self.ptr as *const i8).add(v * sv + j * ss + i * sp) };
                }
                out[[r, j]] = dosage_of_call(&alleles, |i| {
                    self.mask.is_some_and(|(m, [mv, ms, mp])| {
                        // SAFETY: as above, in the mask of the same shape.
                        unsafe { *(m as *const u8).add(v * mv + j * ms + i * mp) != 0 }
                    })
                });
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "the caller's call_genotype ({} variants × {} samples, ploidy {}{})",
            self.shape.0,
            self.shape.1,
            self.shape.2,
            if self.mask.is_some() { ", masked" } else { "" }
        )
    }

    fn sample_ids(&self) -> Option<Vec<String>> {
        self.sample_ids.clone()
    }

    /// As [`DosagesInPlace`]'s.
    fn preferred_panel_rows(&self) -> u64 {
        ((128u64 << 20) / self.shape.1.max(1) as u64)
            .min((self.shape.0 as u64).div_ceil(64))
            .max(1)
    }
}

/// Checks the strides of a 3-D buffer of one-byte values.
fn check_strides3(
    parameter: &'static str,
    shape: (usize, usize, usize),
    strides: [isize; 3],
) -> Result<[usize; 3], Error> {
    let bad = |message: String| Error::Parameter { parameter, message };
    if strides.iter().any(|&s| s < 0) {
        return Err(bad(format!(
            "negative strides {strides:?} are not read in place: pass a copy"
        )));
    }
    let s = strides.map(|s| s as usize);
    let dims = [shape.0, shape.1, shape.2];
    let last = dims.iter().zip(s).try_fold(0usize, |acc, (&d, st)| {
        d.saturating_sub(1)
            .checked_mul(st)
            .and_then(|x| acc.checked_add(x))
    });
    match last {
        Some(b) if b <= isize::MAX as usize => Ok(s),
        _ => Err(bad(format!(
            "{shape:?} values at strides {strides:?} do not fit in memory"
        ))),
    }
}

/// A VCF Zarr `call_genotype` the caller holds (`variants × samples × ploidy` allele
/// indices, `i8`, at byte `strides`), with its `call_genotype_mask` (`u8`/bool, the same
/// shape) where there is one, and the samples' IDs. Every rank that calls a PCA on it must
/// hold the same calls. Returns the input and the [`Lease`] of the buffers.
///
/// # Safety
/// `calls` (and `mask`) must point to buffers of that shape and those strides, readable and
/// not written until the lease is dropped.
pub unsafe fn calls_in_place(
    calls: *const i8,
    shape: (usize, usize, usize),
    strides: [isize; 3],
    mask: Option<(*const u8, [isize; 3])>,
    sample_ids: Option<Vec<String>>,
) -> Result<(Input, Lease), Error> {
    let strides = check_strides3("call_genotype", shape, strides)?;
    let mask = match mask {
        Some((m, ms)) => Some((m as usize, check_strides3("call_genotype_mask", shape, ms)?)),
        None => None,
    };
    if shape.0 == 0 || shape.1 == 0 || shape.2 == 0 {
        return Err(Error::Parameter {
            parameter: "call_genotype",
            message: format!("shape {shape:?}: nothing to analyse"),
        });
    }
    if let Some(ids) = &sample_ids {
        if ids.len() != shape.1 {
            return Err(Error::Parameter {
                parameter: "sample_ids",
                message: format!("{} IDs for {} samples", ids.len(), shape.1),
            });
        }
    }
    let (lease, live) = Lease::new();
    let source = CallsInPlace {
        ptr: calls as usize,
        shape,
        strides,
        mask,
        sample_ids,
        live,
    };
    Ok((Input::Genotypes(Arc::new(source)), lease))
}

#[cfg(test)]
mod tests {

    #[test]
    fn row_blocks_agree_on_panels_and_name_what_is_wrong() {
        let b = RowBlocks::agree(&[40, 40, 17], 5, 0, 1).unwrap();
        assert_eq!(
            b,
            RowBlocks {
                rows: 97,
                panel_rows: 40,
                row0: 40,
                rank_panels: vec![1, 1, 1],
            }
        );
        let b = RowBlocks::agree(&[40, 40, 17], 5, 20, 2).unwrap();
        assert_eq!((b.row0, b.rank_panels), (80, vec![2, 2, 1]));
        let e = RowBlocks::agree(&[40, 30, 17], 5, 20, 0).unwrap_err();
        assert_eq!(e.parameter(), Some("panel_rows"));
        assert!(e.to_string().contains("rank 1 holds 30 rows"), "{e}");
        let e = RowBlocks::agree(&[2, 1], 5, 0, 0).unwrap_err();
        assert_eq!(e.parameter(), Some("a"));
        assert!(e.to_string().contains("3 rows of 5 columns"), "{e}");
        let e = RowBlocks::agree(&[u64::MAX, 2], 5, 0, 0).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
        assert!(RowBlocks::agree(&[10], 0, 0, 0).is_err());
    }
    use super::*;

    #[test]
    fn default_panel_rows_divide_every_rank_but_the_last() {
        // Asked for: kept.
        assert_eq!(panel_rows(7, &[14, 3], 2), 7);
        // Equal blocks and a ragged last one: one panel per rank while it is small.
        assert_eq!(panel_rows(0, &[1000, 1000, 1000, 11], 12), 1000);
        assert_eq!(panel_rows(0, &[600, 400, 77], 4), 200);
        // One rank, or only the last holding rows: its own row count.
        assert_eq!(panel_rows(0, &[5000], 10), 5000);
        assert_eq!(panel_rows(0, &[0, 0, 300], 10), 300);
        // Large blocks are split into panels of at most 8 MiB, no shorter than wide.
        let p = panel_rows(0, &[1_000_000, 1_000_000, 5], 20);
        assert!(
            1_000_000 % p == 0 && p * 20 * 8 <= 8 << 20 && p >= 20,
            "{p}"
        );
        assert_eq!(p, 50_000);
        // A block with no divisor that fits stays whole (a prime row count).
        assert_eq!(panel_rows(0, &[1_000_003, 1], 20), 1_000_003);
        // Wide rows: the smallest tall divisor, where none fits.
        assert_eq!(panel_rows(0, &[60_000, 60_000, 7], 20_000), 20_000);
        assert_eq!(panel_rows(0, &[50_000, 3], 20_000), 25_000);
        // One rank: equal panels that fit, or the most that stay tall.
        assert_eq!(panel_rows(0, &[1_000_000], 20), 1_000_000 / 20);
        assert_eq!(panel_rows(0, &[1_000_001], 20), 50_001);
        assert_eq!(panel_rows(0, &[50_000], 20_000), 25_000);
        assert_eq!(panel_rows(0, &[0, 50_000], 20_000), 25_000);
        assert_eq!(panel_rows(0, &[39_999], 20_000), 39_999);
        assert_eq!(panel_rows(0, &[99_999], 20_000), 25_000);
    }

    #[test]
    fn a_dropped_lease_stops_every_read() {
        let values: Vec<f64> = (0..12).map(f64::from).collect();
        let rt = crate::World::embedded().actors(1).build().unwrap();
        // SAFETY: `values` is 4 × 3 row-major and outlives the lease.
        let (input, lease) =
            unsafe { rows_in_place(&rt, values.as_ptr(), 4, 3, (3, 1), 0).unwrap() };
        let (source, transposed) = input.matrix().unwrap();
        assert!(!transposed);
        let mut out = ndarray::Array2::zeros((2, 3));
        source.fill(1..3, out.view_mut()).unwrap();
        assert_eq!(out[[1, 2]], 8.0);
        drop(lease);
        assert!(source.fill(1..3, out.view_mut()).is_err());
        // Column-major strides read the same matrix.
        let t: Vec<f64> = (0..3)
            .flat_map(|c| (0..4).map(move |r| (3 * r + c) as f64))
            .collect();
        // SAFETY: `t` is 4 × 3 column-major and outlives the lease.
        let (input, _lease) = unsafe { rows_in_place(&rt, t.as_ptr(), 4, 3, (1, 4), 0).unwrap() };
        let (source, _) = input.matrix().unwrap();
        source.fill(1..3, out.view_mut()).unwrap();
        assert_eq!(out[[1, 2]], 8.0);
        // SAFETY: not read: the strides are refused.
        let bad = unsafe { rows_in_place(&rt, t.as_ptr(), 4, 3, (-1, 4), 0) };
        assert_eq!(bad.unwrap_err().parameter(), Some("a"));
    }

    /// A block of rows made by a formula, counting each row it produces.
    struct Formula {
        row0: u64,
        cols: u64,
        pulled: std::sync::atomic::AtomicU64,
        fail_at: Option<u64>,
    }

    impl Formula {
        fn value(r: u64, c: u64) -> f64 {
            // A matrix of full rank with a spread spectrum.
            let x = (r * 2654435761 + c * 40503) % 10007;
            x as f64 / 10007.0 - 0.5
                + if r % 7 == c {
                    3.0 / (c + 1) as f64
                } else {
                    0.0
                }
        }
    }

    impl RowPuller for Formula {
        fn pull(&self, rows: Range<u64>, out: &mut [f64]) -> Result<(), String> {
            if self.fail_at.is_some_and(|f| rows.contains(&f)) {
                return Err("the dask graph raised ZeroDivisionError".into());
            }
            for (i, r) in rows.clone().enumerate() {
                for c in 0..self.cols {
                    out[i * self.cols as usize + c as usize] = Formula::value(self.row0 + r, c);
                }
            }
            self.pulled
                .fetch_add(rows.end - rows.start, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        fn describe(&self) -> String {
            format!("the formula's rows from {}", self.row0)
        }
    }

    #[test]
    fn pulled_rows_give_the_in_place_bits_on_every_rank_and_name_a_failing_panel() {
        // Ranks' blocks, a ragged last one; panels of 30 rows.
        let blocks = [90u64, 60, 47];
        let cols = 12u64;
        let config = crate::RuntimeConfig {
            actors: Some(2),
            ..Default::default()
        };
        let results = crate::local_world(3, &config, move |rt| {
            let me = rt.rank();
            let row0: u64 = blocks[..me].iter().sum();
            let rows = blocks[me];
            let values: Vec<f64> = (0..rows)
                .flat_map(|r| (0..cols).map(move |c| Formula::value(row0 + r, c)))
                .collect();
            let puller = Arc::new(Formula {
                row0,
                cols,
                pulled: Default::default(),
                fail_at: None,
            });
            let pulled = rows_pulled(&rt, puller.clone(), rows, cols, 30).unwrap();
            // SAFETY: `values` is this rank's block, row-major, alive until the end.
            let (in_place, _lease) = unsafe {
                rows_in_place(
                    &rt,
                    values.as_ptr(),
                    rows as usize,
                    cols as usize,
                    (cols as isize, 1),
                    30,
                )
            }
            .unwrap();
            let options = crate::linalg::SvdOptions { check: false };
            let (a, ua) = crate::svd(&rt, &pulled, &options).unwrap();
            let (b, ub) = crate::svd(&rt, &in_place, &options).unwrap();
            let exact = (a.s == b.s, a.wt == b.wt, ua.values == ub.values);
            let svd_pulls = puller.pulled.swap(0, std::sync::atomic::Ordering::Relaxed);
            let choice = crate::SolverChoice {
                k: 3,
                oversample: 3,
                power_iters: Some(2),
                ..Default::default()
            };
            let opts = choice.options(crate::Values::Dense { f32: false }).unwrap();
            let (c, uc) = crate::rsvd_with_factor(&rt, &pulled, &opts).unwrap();
            let (d, ud) = crate::rsvd_with_factor(&rt, &in_place, &opts).unwrap();
            let rsvd_exact = (c.s == d.s, c.wt == d.wt, uc.values == ud.values);
            // A failing panel on rank 1 fails every rank; the error names the rows.
            let failing = Arc::new(Formula {
                row0,
                cols,
                pulled: Default::default(),
                fail_at: (me == 1).then_some(35),
            });
            let bad = rows_pulled(&rt, failing, rows, cols, 30).unwrap();
            let err = crate::svd(&rt, &bad, &options).unwrap_err();
            let err = crate::fail_collectively(&rt, err).to_string();
            (exact, svd_pulls, rsvd_exact, err)
        });
        for (rank, r) in results.into_iter().enumerate() {
            let (exact, svd_pulls, rsvd_exact, err) = r.unwrap();
            assert_eq!(exact, (true, true, true), "rank {rank}: svd");
            assert_eq!(rsvd_exact, (true, true, true), "rank {rank}: rsvd");
            // The exact SVD has two passes (R factors, then U; the second reads panels
            // again unless the plan kept them): each row is pulled once per pass at most.
            assert!(
                svd_pulls == blocks[rank] || svd_pulls == 2 * blocks[rank],
                "rank {rank}: {svd_pulls} rows pulled of {}",
                blocks[rank]
            );
            // Every rank reports rank 1's cause, with its rows.
            assert!(
                err.contains("rows 120..150") && err.contains("ZeroDivisionError"),
                "rank {rank}: {err}"
            );
            if rank != 1 {
                assert!(err.contains("rank 1"), "rank {rank}: {err}");
            }
        }
    }

    /// The seconds' nanoseconds: a fresh shape and values each run.
    fn fresh_seed() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64
    }

    /// Asserts that `a` and `b` give the same rsvd bits (k, oversample, q) in f64 and f32
    /// tiles.
    fn same_rsvd_bits(
        rt: &Runtime,
        a: &Input,
        b: &Input,
        (k, oversample, q): (usize, usize, usize),
        context: &str,
    ) {
        for f32 in [false, true] {
            let choice = crate::SolverChoice {
                k,
                oversample,
                power_iters: Some(q),
                ..Default::default()
            };
            let opts = choice.options(crate::Values::Dense { f32 }).unwrap();
            let (x, ux) = crate::rsvd_with_factor(rt, a, &opts).unwrap();
            let (y, uy) = crate::rsvd_with_factor(rt, b, &opts).unwrap();
            assert_eq!(x.s, y.s, "f32 tiles {f32}: {context}");
            assert_eq!(x.wt, y.wt, "f32 tiles {f32}: {context}");
            assert_eq!(ux.values, uy.values, "f32 tiles {f32}: {context}");
        }
    }

    #[test]
    fn rows_multiplied_in_place_give_the_copied_tiles_bits() {
        // Fresh shape and values each run, crossing tile rows (256) and columns (512); the
        // passes need a tall matrix.
        let seed = fresh_seed();
        let cols = 513 + (seed / 7 % 400) as usize;
        let rows = cols + (seed % 300) as usize;
        let value = |r: usize, c: usize| {
            let x =
                (r as u64 * 1_000_003 + c as u64 * 7919 + seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (x >> 11) as f64 / (1u64 << 53) as f64 - 0.5
                + if c.is_multiple_of(3) {
                    r as f64 * 1e-3
                } else {
                    0.0
                }
        };
        let c_order: Vec<f64> = (0..rows)
            .flat_map(|r| (0..cols).map(move |c| (r, c)))
            .map(|(r, c)| value(r, c))
            .collect();
        let f_order: Vec<f64> = (0..cols)
            .flat_map(|c| (0..rows).map(move |r| (r, c)))
            .map(|(r, c)| value(r, c))
            .collect();
        let rt = crate::World::embedded().actors(2).build().unwrap();
        // SAFETY: both vectors are `rows × cols` at these strides and outlive the leases;
        // panels of 300 rows.
        let (held_input, lease) =
            unsafe { rows_in_place(&rt, c_order.as_ptr(), rows, cols, (cols as isize, 1), 300) }
                .unwrap();
        let (strided_input, _f_lease) =
            unsafe { rows_in_place(&rt, f_order.as_ptr(), rows, cols, (1, rows as isize), 300) }
                .unwrap();
        let (held, _) = held_input.matrix().unwrap();
        let (strided, _) = strided_input.matrix().unwrap();
        // Only contiguous rows of this block, while lent, are offered as a view.
        assert_eq!(held.rows_in_memory(5..9).unwrap()[[3, 4]], value(8, 4));
        assert!(held.rows_in_memory(0..rows as u64 + 1).is_none());
        assert!(strided.rows_in_memory(0..4).is_none());
        // The f32 copy rounds each value as the f64 tile would.
        let mut t32 = ndarray::Array2::<f32>::zeros((3, 5));
        held.fill_cols_f32(2..5, 510..515, t32.view_mut()).unwrap();
        assert_eq!(t32[[2, 4]], value(4, 514) as f32);
        for (r0, r1) in [(0, 3), (rows as u64 - 3, rows as u64)] {
            let (mut a, mut b) = (t32.clone(), t32.clone());
            held.fill_cols_f32(r0..r1, 0..5, a.view_mut()).unwrap();
            strided.fill_cols_f32(r0..r1, 0..5, b.view_mut()).unwrap();
            assert_eq!(a, b);
        }
        let context = format!("{rows} × {cols}, seed {seed}");
        same_rsvd_bits(&rt, &held_input, &strided_input, (4, 6, 2), &context);
        drop(lease);
        assert!(held.rows_in_memory(0..1).is_none());
    }

    #[test]
    fn float32_rows_are_read_in_place_with_the_bits_of_their_widened_copy() {
        let seed = fresh_seed();
        let cols = 520 + (seed / 11 % 300) as usize;
        let rows = cols + 200 + (seed % 500) as usize;
        let value = |r: usize, c: usize| {
            let x =
                (r as u64 * 999_983 + c as u64 * 7907 + seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            ((x >> 40) as f32 / (1u32 << 24) as f32 - 0.5)
                + c.is_multiple_of(4) as u8 as f32 * r as f32 * 1e-3
        };
        let narrow: Vec<f32> = (0..rows * cols)
            .map(|i| value(i / cols, i % cols))
            .collect();
        let wide: Vec<f64> = narrow.iter().map(|&v| f64::from(v)).collect();
        let rt = crate::World::embedded().actors(2).build().unwrap();
        // SAFETY: both are `rows × cols` row-major and outlive the leases.
        let (f32_input, _l32) =
            unsafe { rows_in_place(&rt, narrow.as_ptr(), rows, cols, (cols as isize, 1), 0) }
                .unwrap();
        let (f64_input, _l64) =
            unsafe { rows_in_place(&rt, wide.as_ptr(), rows, cols, (cols as isize, 1), 0) }
                .unwrap();
        let (source, _) = f32_input.matrix().unwrap();
        assert!(source.holds_f32() && !f64_input.matrix().unwrap().0.holds_f32());
        assert!(source.rows_in_memory(0..2).is_none());
        assert_eq!(
            source.rows_in_memory_f32(0..2).unwrap()[[1, 3]],
            value(1, 3)
        );
        let mut t = ndarray::Array2::<f64>::zeros((2, 3));
        source.fill_cols(4..6, 1..4, t.view_mut()).unwrap();
        assert_eq!(t[[1, 2]], f64::from(value(5, 3)));
        // Strides of 4-byte elements: column-major f32 reads the same values.
        let by_cols: Vec<f32> = (0..rows * cols)
            .map(|i| value(i % rows, i / rows))
            .collect();
        // SAFETY: `by_cols` is `rows × cols` column-major and outlives the lease.
        let (strided, _ls) =
            unsafe { rows_in_place(&rt, by_cols.as_ptr(), rows, cols, (1, rows as isize), 0) }
                .unwrap();
        let mut u = ndarray::Array2::<f64>::zeros((2, 3));
        strided
            .matrix()
            .unwrap()
            .0
            .fill_cols(4..6, 1..4, u.view_mut())
            .unwrap();
        assert_eq!(t, u);
        let (mut v, mut w) = (
            ndarray::Array2::<f32>::zeros((3, 4)),
            ndarray::Array2::<f32>::zeros((3, 4)),
        );
        source.fill_cols_f32(7..10, 2..6, v.view_mut()).unwrap();
        strided
            .matrix()
            .unwrap()
            .0
            .fill_cols_f32(7..10, 2..6, w.view_mut())
            .unwrap();
        assert_eq!((v[[2, 3]], &v), (value(9, 5), &w));
        let context = format!("{rows} × {cols}, seed {seed}");
        same_rsvd_bits(&rt, &f32_input, &f64_input, (5, 5, 1), &context);
        let options = crate::linalg::SvdOptions { check: false };
        let (a, _) = crate::svd(&rt, &f32_input, &options).unwrap();
        let (b, _) = crate::svd(&rt, &f64_input, &options).unwrap();
        assert_eq!(a.s, b.s, "exact SVD: {rows} × {cols}, seed {seed}");
    }
}
