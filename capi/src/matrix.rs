//! The caller's buffers as ndarray views, and this rank's rows as a panel source.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ndarray::{s, ArrayView2, ArrayViewMut2, ShapeBuilder};
use rankwise::sources::{Dist, Generated, PanelSource, SourceError};
use rankwise::sources::{MAX_GENERATED_COLS, MAX_GENERATED_ROWS};

use crate::args::{check_ld, check_size, invalid, CapiError, Layout};
use crate::*;

/// A view of a caller's `rows × cols` buffer.
///
/// # Safety
/// `ptr` must point to a buffer of that shape, leading dimension and layout (checked by
/// [`check_ld`]), valid for reads for the view's lifetime.
pub(crate) unsafe fn view<'a>(
    ptr: *const f64,
    rows: usize,
    cols: usize,
    ld: usize,
    layout: Layout,
) -> ArrayView2<'a, f64> {
    let (rs, cs) = layout.strides(ld);
    if rows == 0 || cols == 0 {
        return ArrayView2::from_shape((rows, cols), &[]).expect("empty view");
    }
    // SAFETY: the caller's promise; strides are non-negative and the extent fits isize.
    unsafe { ArrayView2::from_shape_ptr((rows, cols).strides((rs, cs)), ptr) }
}

/// A mutable view of a caller's `rows × cols` buffer.
///
/// # Safety
/// As [`view`], valid for writes, and not aliased for the view's lifetime.
pub(crate) unsafe fn view_mut<'a>(
    ptr: *mut f64,
    rows: usize,
    cols: usize,
    ld: usize,
    layout: Layout,
) -> ArrayViewMut2<'a, f64> {
    let (rs, cs) = layout.strides(ld);
    if rows == 0 || cols == 0 {
        return ArrayViewMut2::from_shape((rows, cols), &mut []).expect("empty view");
    }
    // SAFETY: the caller's promise; strides are non-negative and the extent fits isize.
    unsafe { ArrayViewMut2::from_shape_ptr((rows, cols).strides((rs, cs)), ptr) }
}

/// This rank's rows of the matrix, read in place from the caller's buffer: global rows
/// `row0 .. row0 + rows` of an `m × cols` matrix. Other rows are never asked for, because
/// the placement keeps every panel on the rank that holds it.
pub(crate) struct BorrowedRows {
    /// The buffer's address (an integer, so the source is `Send + Sync`: it is only read).
    ptr: usize,
    row0: u64,
    rows: u64,
    m: u64,
    cols: u64,
    ld: usize,
    layout: Layout,
    /// Cleared when the call returns: the buffer is the caller's again, and any late read
    /// fails instead of touching it.
    live: Arc<AtomicBool>,
}

impl BorrowedRows {
    /// # Safety
    /// `ptr` must hold `rows × cols` values with `ld` and `layout` (checked), readable
    /// until `live` is cleared.
    pub(crate) unsafe fn new(
        ptr: *const f64,
        row0: u64,
        rows: u64,
        m: u64,
        cols: u64,
        ld: usize,
        layout: Layout,
        live: Arc<AtomicBool>,
    ) -> Self {
        BorrowedRows {
            ptr: ptr as usize,
            row0,
            rows,
            m,
            cols,
            ld,
            layout,
            live,
        }
    }
}

impl PanelSource for BorrowedRows {
    fn shape(&self) -> (u64, u64) {
        (self.m, self.cols)
    }

    fn fill(&self, rows: Range<u64>, out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError> {
        self.fill_cols(rows, 0..self.cols, out)
    }

    fn fill_cols(
        &self,
        rows: Range<u64>,
        cols: Range<u64>,
        mut out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), SourceError> {
        let mine = self.row0..self.row0 + self.rows;
        if !self.live.load(Ordering::Acquire)
            || rows.start < mine.start
            || rows.end > mine.end
            || rows.start > rows.end
            || cols.start > cols.end
            || cols.end > self.cols
            || out.dim()
                != (
                    (rows.end - rows.start) as usize,
                    (cols.end - cols.start) as usize,
                )
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (self.m, self.cols),
                what: self.describe(),
            });
        }
        // SAFETY: the buffer holds this rank's rows (BorrowedRows::new) and is live.
        let all = unsafe {
            view(
                self.ptr as *const f64,
                self.rows as usize,
                self.cols as usize,
                self.ld,
                self.layout,
            )
        };
        let (r0, r1) = (
            (rows.start - self.row0) as usize,
            (rows.end - self.row0) as usize,
        );
        out.assign(&all.slice(s![r0..r1, cols.start as usize..cols.end as usize]));
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "the caller's rows {}..{} of {} × {}",
            self.row0,
            self.row0 + self.rows,
            self.m,
            self.cols
        )
    }
}

/// `rankwise_generate`.
pub(crate) fn generate(
    seed: u64,
    dist: rankwise_dist,
    row0: i64,
    rows: i64,
    cols: i64,
    out: *mut f64,
    ld: i64,
    layout: rankwise_layout,
) -> Result<(), CapiError> {
    let dist = match dist {
        RANKWISE_DIST_UNIFORM => Dist::Uniform,
        RANKWISE_DIST_NORMAL => Dist::Normal,
        other => {
            return Err(invalid(
                "dist",
                format!(
                    "{other} is neither RANKWISE_DIST_UNIFORM (0) nor RANKWISE_DIST_NORMAL (1)"
                ),
            ))
        }
    };
    check_size("row0", row0)?;
    check_size("rows", rows)?;
    check_size("cols", cols)?;
    if row0.saturating_add(rows) as u64 > MAX_GENERATED_ROWS {
        return Err(invalid(
            "rows",
            format!("generated matrices have at most {MAX_GENERATED_ROWS} rows"),
        ));
    }
    if cols as u64 >= MAX_GENERATED_COLS {
        return Err(invalid(
            "cols",
            format!(
                "generated matrices have at most {} columns",
                MAX_GENERATED_COLS - 1
            ),
        ));
    }
    let layout = Layout::parse(layout)?;
    check_ld("ld", rows, cols, ld, layout)?;
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let out = args::non_null_mut(out, "out")?;
    let g = Generated::new((row0 + rows) as u64, cols as u64, seed, dist);
    // SAFETY: the caller's buffer of this shape (checked leading dimension).
    let view = unsafe { view_mut(out, rows as usize, cols as usize, ld as usize, layout) };
    g.fill(row0 as u64..(row0 + rows) as u64, view)
        .map_err(|e| CapiError::Internal(e.to_string()))
}
