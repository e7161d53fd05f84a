//! Naming the value behind a non-finite product.
//!
//! Checking every input value for NaN and infinity would cost a pass over the data on every
//! read. The products the passes form anyway (a panel's sketch `A·Ω` and `AᵀY`, its TSQR
//! factor `R`) are a few columns per panel and still in cache, and they are non-finite
//! when the panel holds a non-finite value or values whose products overflow. Only then is
//! the panel produced again here, row block by row block, to find the first non-finite
//! value, or else the largest one, and to name where it is stored.

use std::ops::Range;

use ndarray::{Array2, ArrayView2};
use rankwise_sources::PanelSource;

use crate::tiles::TILE_ROWS;
use crate::LinalgError;

/// Whether every value of `a` is finite.
pub(crate) fn all_finite(a: ArrayView2<'_, f64>) -> bool {
    a.iter().all(|x| x.is_finite())
}

/// The error for panel `panel` (`rows`) of `source`, whose products in `float32`
/// (`single`) or `float64` were not finite: its first non-finite value, or when it has
/// none, its largest value, which overflowed them.
pub(crate) fn diagnose(
    source: &dyn PanelSource,
    panel: usize,
    rows: Range<u64>,
    single: bool,
) -> LinalgError {
    let n = source.shape().1 as usize;
    let mut block = Array2::<f64>::zeros((TILE_ROWS.min((rows.end - rows.start) as usize), n));
    let (mut max, mut at) = (0.0f64, (rows.start, 0u64));
    let mut r0 = rows.start;
    while r0 < rows.end {
        let r1 = (r0 + TILE_ROWS as u64).min(rows.end);
        let mut view = block.slice_mut(ndarray::s![..(r1 - r0) as usize, ..]);
        if let Err(e) = source.fill(r0..r1, view.view_mut()) {
            return LinalgError::Panel {
                panel,
                rows: format!("{}..{}", rows.start, rows.end),
                message: e.to_string(),
            };
        }
        for ((i, j), &x) in view.indexed_iter() {
            let (row, col) = (r0 + i as u64, j as u64);
            if !x.is_finite() {
                return LinalgError::NonFinite {
                    panel,
                    row,
                    col,
                    value: x,
                    location: source.locate(row, col),
                };
            }
            if x.abs() > max {
                max = x.abs();
                at = (row, col);
            }
        }
        r0 = r1;
    }
    // The randomized passes square the data's scale (LOBPCG's AᵀA, the fused YᵀA):
    // float64 holds that up to values of about 1e150, float32 up to about 1e18.
    let precision = if single { "float32" } else { "float64" };
    let advice = if single && max < 1e150 {
        "is beyond what float32 squares and sums hold (values up to about 1e18); run with \
         `precision` f64, or scale the data (divide it by a power of ten)"
    } else {
        "is beyond what the randomized passes, which square the data's scale, can hold \
         (values up to about 1e150); scale the data (divide it by a power of ten), or use \
         `svd`, which does not square it"
    };
    LinalgError::Overflow {
        panel,
        precision,
        max,
        row: at.0,
        col: at.1,
        location: source.locate(at.0, at.1),
        advice,
    }
}

/// Checks panel `panel`'s products `parts` (in `float32`: `single`) and, when one is not
/// finite, names the value of `operand` behind it.
pub(crate) fn check_products(
    operand: &crate::tiles::Operand,
    panel: usize,
    rows: Range<u64>,
    single: bool,
    parts: &[ArrayView2<'_, f64>],
) -> Result<(), LinalgError> {
    if parts.iter().all(|p| all_finite(p.view())) {
        return Ok(());
    }
    Err(match operand {
        crate::tiles::Operand::Dense(src) => diagnose(src.as_ref(), panel, rows, single),
        // Standardized dosages are finite by construction (a variant without variance is
        // dropped): a non-finite product of them is ours, not the input's.
        crate::tiles::Operand::Genotypes(..) => LinalgError::Panel {
            panel,
            rows: format!("{}..{}", rows.start, rows.end),
            message: "internal: a product of standardized dosages is not finite".into(),
        },
    })
}
