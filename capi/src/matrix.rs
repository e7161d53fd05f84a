//! The caller's buffers as ndarray views (this rank's rows are read as a panel source by
//! the library's [`rankwise::memory::RowsInPlace`]).

use ndarray::{ArrayViewMut2, ShapeBuilder};
use rankwise::sources::{Dist, Generated, PanelSource};
use rankwise::sources::{MAX_GENERATED_COLS, MAX_GENERATED_ROWS};

use crate::args::{check_ld, check_size, invalid, CapiError, Layout};
use crate::*;

/// A mutable view of a caller's `rows × cols` buffer.
///
/// # Safety
/// `ptr` must point to a buffer of that shape, leading dimension and layout (checked by
/// [`check_ld`]), valid for writes and not aliased for the view's lifetime.
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
