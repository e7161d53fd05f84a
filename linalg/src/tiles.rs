//! Tiles of a panel for the randomized passes, and the GEMMs that consume them.
//!
//! # Why tiles
//!
//! A randomized pass multiplies every value of the matrix with a thin matrix (`Ω`, `Z` or
//! `Q`, 20–30 columns). The values are produced (generated, decoded, or unpacked from 2-bit
//! genotypes) one tile of [`TILE_ROWS`] rows × [`TILE_COLS`] columns at a time, straight
//! into a buffer that stays in the core's L2 cache, and BLAS multiplies the tile while it is
//! there. No pass ever holds a float copy of a whole panel unless the memory plan made the
//! panel resident.
//!
//! # Genotypes
//!
//! Dosages are kept 2-bit packed when resident (four per byte; code 3 is a missing call).
//! Each variant (row) is standardized on the fly, `x = (g − 2p)/√(2p(1−p))` with `p` the
//! allele frequency of its non-missing calls, and a missing call is imputed to the mean,
//! i.e. `x = 0`. Variants with `p = 0` or `p = 1` (no variance) are dropped: their rows are
//! zero. The per-row mean and scale are computed when the row is first produced, from the
//! whole row, so tiles of any width standardize identically.

use std::ops::Range;
use std::sync::Arc;

use cblas_sys::{cblas_dgemm, CBLAS_LAYOUT, CBLAS_TRANSPOSE};
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2};
use rankwise_runtime::{GenotypeSource, PanelSource};

use crate::LinalgError;

/// Rows of one tile.
pub const TILE_ROWS: usize = 64;
/// Columns of one tile (a multiple of 4, so genotype tiles start on a packed byte).
pub const TILE_COLS: usize = 1024;

/// What the randomized passes multiply with.
#[derive(Clone)]
pub enum Operand {
    /// A float matrix (generated, or read).
    Dense(Arc<dyn PanelSource>),
    /// Genotype dosages, standardized per variant on the fly.
    Genotypes(Arc<dyn GenotypeSource>),
}

impl Operand {
    /// `(rows, cols)`.
    pub fn shape(&self) -> (u64, u64) {
        match self {
            Operand::Dense(s) => s.shape(),
            Operand::Genotypes(s) => s.shape(),
        }
    }

    /// Description for reports and errors.
    pub fn describe(&self) -> String {
        match self {
            Operand::Dense(s) => s.describe(),
            Operand::Genotypes(s) => s.describe(),
        }
    }

    /// Bytes a resident panel of `rows` rows keeps.
    pub fn resident_bytes(&self, rows: u64) -> u64 {
        let n = self.shape().1;
        match self {
            Operand::Dense(_) => rows * n * 8,
            Operand::Genotypes(_) => rows * (n.div_ceil(4) + 16),
        }
    }
}

/// Standardization of one variant: `x = (g − mean) · scale`, missing → 0; `scale = 0` for
/// a dropped variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowScale {
    /// `2p`.
    pub mean: f64,
    /// `1/√(2p(1−p))`, or 0 when the variant is dropped.
    pub scale: f64,
}

/// A panel's values kept between passes.
#[derive(Debug)]
pub enum Stored {
    /// Row-major `rows × cols` floats.
    Dense(Array2<f64>),
    /// 2-bit packed dosages, `stride` bytes per row, with each row's standardization.
    Packed {
        /// Packed rows.
        bytes: Vec<u8>,
        /// Bytes per row.
        stride: usize,
        /// Standardization per row.
        rows: Vec<RowScale>,
    },
}

/// What producing a panel once tells about it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PanelFacts {
    /// Σ x² over the panel (after standardization for genotypes).
    pub sum_squares: f64,
    /// Variants dropped (genotypes; `p = 0` or `1`, or no calls).
    pub dropped: u64,
    /// Missing calls (genotypes).
    pub missing: u64,
}

/// Produces the tiles of one panel. `store` keeps the values produced in this pass (the
/// plan made the panel resident); `stored` supplies them in later passes.
pub struct TileProducer<'a> {
    operand: &'a Operand,
    panel: usize,
    rows: Range<u64>,
}

thread_local! {
    static TILE: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
    static CODES: std::cell::RefCell<Vec<i8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a> TileProducer<'a> {
    /// Tiles of panel `panel` (global rows `rows`) of `operand`.
    pub fn new(operand: &'a Operand, panel: usize, rows: Range<u64>) -> Self {
        TileProducer {
            operand,
            panel,
            rows,
        }
    }

    fn panel_error(&self, rows: Range<u64>, message: String) -> LinalgError {
        LinalgError::Panel {
            panel: self.panel,
            rows: format!("{}..{}", rows.start, rows.end),
            message,
        }
    }

    /// Calls `f(row0, col0, tile)` for every tile in row-block order, then column order
    /// (a fixed order: the GEMM accumulations depend on it). `stored` is the resident
    /// copy from an earlier pass, if any; with `keep` the values produced now are returned
    /// for the next passes.
    pub fn for_each(
        &self,
        stored: Option<&Stored>,
        keep: bool,
        mut f: impl FnMut(usize, usize, ArrayView2<'_, f64>),
    ) -> Result<(PanelFacts, Option<Stored>), LinalgError> {
        let h = (self.rows.end - self.rows.start) as usize;
        let n = self.operand.shape().1 as usize;
        let mut facts = PanelFacts::default();
        match (self.operand, stored) {
            (Operand::Dense(_), Some(Stored::Dense(a))) => {
                for r0 in (0..h).step_by(TILE_ROWS) {
                    let r1 = (r0 + TILE_ROWS).min(h);
                    for c0 in (0..n).step_by(TILE_COLS) {
                        let c1 = (c0 + TILE_COLS).min(n);
                        let t = a.slice(s![r0..r1, c0..c1]);
                        facts.sum_squares += sum_squares_view(t);
                        f(r0, c0, t);
                    }
                }
                Ok((facts, None))
            }
            (Operand::Dense(src), _) => {
                let mut kept = if keep {
                    Some(Array2::<f64>::zeros((h, n)))
                } else {
                    None
                };
                let mut buf = TILE.with(|t| std::mem::take(&mut *t.borrow_mut()));
                buf.resize(TILE_ROWS * TILE_COLS, 0.0);
                let result = (|| {
                    for r0 in (0..h).step_by(TILE_ROWS) {
                        let r1 = (r0 + TILE_ROWS).min(h);
                        let g = self.rows.start + r0 as u64..self.rows.start + r1 as u64;
                        for c0 in (0..n).step_by(TILE_COLS) {
                            let c1 = (c0 + TILE_COLS).min(n);
                            let cols = c0 as u64..c1 as u64;
                            let mut t = match kept.as_mut() {
                                Some(k) => k.slice_mut(s![r0..r1, c0..c1]),
                                None => ArrayViewMut2::from_shape(
                                    (r1 - r0, c1 - c0),
                                    &mut buf[..(r1 - r0) * (c1 - c0)],
                                )
                                .expect("tile fits its buffer"),
                            };
                            src.fill_cols(g.clone(), cols, t.view_mut())
                                .map_err(|e| self.panel_error(g.clone(), e.to_string()))?;
                            facts.sum_squares += sum_squares_view(t.view());
                            f(r0, c0, t.view());
                        }
                    }
                    Ok(())
                })();
                TILE.with(|t| *t.borrow_mut() = buf);
                result.map(|()| (facts, kept.map(Stored::Dense)))
            }
            (Operand::Genotypes(src), stored) => self.genotype_tiles(src.as_ref(), stored, keep, f),
        }
    }

    fn genotype_tiles(
        &self,
        src: &dyn GenotypeSource,
        stored: Option<&Stored>,
        keep: bool,
        mut f: impl FnMut(usize, usize, ArrayView2<'_, f64>),
    ) -> Result<(PanelFacts, Option<Stored>), LinalgError> {
        let h = (self.rows.end - self.rows.start) as usize;
        let n = src.shape().1 as usize;
        let stride = n.div_ceil(4);
        let mut facts = PanelFacts::default();
        let packed = match stored {
            Some(Stored::Packed {
                bytes,
                stride,
                rows,
            }) => Some((bytes, *stride, rows)),
            _ => None,
        };
        let mut kept_bytes = if keep && packed.is_none() {
            vec![0u8; h * stride]
        } else {
            Vec::new()
        };
        let mut kept_rows = Vec::new();
        let mut tile = TILE.with(|t| std::mem::take(&mut *t.borrow_mut()));
        tile.resize(TILE_ROWS * TILE_COLS, 0.0);
        let mut codes = CODES.with(|t| std::mem::take(&mut *t.borrow_mut()));
        codes.resize(TILE_ROWS * n.max(1), 0);
        let mut scales = Vec::with_capacity(TILE_ROWS);
        let result = (|| -> Result<(), LinalgError> {
            for r0 in (0..h).step_by(TILE_ROWS) {
                let r1 = (r0 + TILE_ROWS).min(h);
                let b = r1 - r0;
                scales.clear();
                match packed {
                    Some((bytes, stride, rows)) => {
                        for i in 0..b {
                            let row = &bytes[(r0 + i) * stride..(r0 + i + 1) * stride];
                            unpack_row(row, &mut codes[i * n..(i + 1) * n]);
                            scales.push(rows[r0 + i]);
                        }
                    }
                    None => {
                        let g = self.rows.start + r0 as u64..self.rows.start + r1 as u64;
                        let view = ArrayViewMut2::from_shape((b, n), &mut codes[..b * n])
                            .expect("codes fit their buffer");
                        src.fill_dosages(g.clone(), view)
                            .map_err(|e| self.panel_error(g.clone(), e.to_string()))?;
                        for i in 0..b {
                            let row = &codes[i * n..(i + 1) * n];
                            let (scale, missing) =
                                row_scale(row).map_err(|(j, v)| LinalgError::Genotype {
                                    variant: g.start + i as u64,
                                    sample: j as u64,
                                    value: v,
                                    what: src.describe(),
                                })?;
                            facts.missing += missing;
                            scales.push(scale);
                            if keep {
                                pack_row(row, &mut kept_bytes[(r0 + i) * stride..][..stride]);
                                kept_rows.push(scale);
                            }
                        }
                    }
                }
                for sc in &scales {
                    if sc.scale == 0.0 {
                        facts.dropped += 1;
                    }
                }
                for c0 in (0..n).step_by(TILE_COLS) {
                    let c1 = (c0 + TILE_COLS).min(n);
                    let w = c1 - c0;
                    for i in 0..b {
                        standardize(
                            &codes[i * n + c0..i * n + c1],
                            scales[i],
                            &mut tile[i * w..(i + 1) * w],
                        );
                    }
                    let t = ArrayView2::from_shape((b, w), &tile[..b * w]).expect("tile shape");
                    facts.sum_squares += sum_squares(&tile[..b * w]);
                    f(r0, c0, t);
                }
            }
            Ok(())
        })();
        TILE.with(|t| *t.borrow_mut() = tile);
        CODES.with(|t| *t.borrow_mut() = codes);
        result?;
        let kept = (keep && packed.is_none()).then_some(Stored::Packed {
            bytes: kept_bytes,
            stride,
            rows: kept_rows,
        });
        Ok((facts, kept))
    }
}

/// The standardization of one row of dosages and its missing-call count, or the first
/// value outside {−1, 0, 1, 2} as `(column, value)`.
pub fn row_scale(row: &[i8]) -> Result<(RowScale, u64), (usize, i8)> {
    let (mut sum, mut calls) = (0u64, 0u64);
    let mut bad = false;
    for &v in row {
        bad |= !(-1..=2).contains(&v);
        sum += v.max(0) as u64;
        calls += (v >= 0) as u64;
    }
    if bad {
        let j = row
            .iter()
            .position(|v| !(-1..=2).contains(v))
            .unwrap_or_default();
        return Err((j, row[j]));
    }
    let missing = row.len() as u64 - calls;
    if calls == 0 {
        return Ok((
            RowScale {
                mean: 0.0,
                scale: 0.0,
            },
            missing,
        ));
    }
    let p = sum as f64 / (2.0 * calls as f64);
    let var = 2.0 * p * (1.0 - p);
    let scale = if sum == 0 || sum == 2 * calls || var <= 0.0 {
        0.0
    } else {
        1.0 / var.sqrt()
    };
    Ok((
        RowScale {
            mean: 2.0 * p,
            scale,
        },
        missing,
    ))
}

/// Byte → four codes, low bits first (code 3, a missing call, decodes to −1).
const UNPACK: [[i8; 4]; 256] = {
    let mut t = [[0i8; 4]; 256];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        while k < 4 {
            let c = ((b >> (2 * k)) & 3) as i8;
            t[b][k] = if c == 3 { -1 } else { c };
            k += 1;
        }
        b += 1;
    }
    t
};

/// Packs a row of dosages (−1..=2) four per byte.
pub fn pack_row(row: &[i8], out: &mut [u8]) {
    for (o, chunk) in out.iter_mut().zip(row.chunks(4)) {
        let mut b = 0u8;
        for (k, &v) in chunk.iter().enumerate() {
            b |= ((v as u8) & 3) << (2 * k);
        }
        *o = b;
    }
}

/// Unpacks a packed row into `out` (its length is the row's column count).
pub fn unpack_row(bytes: &[u8], out: &mut [i8]) {
    let full = out.len() / 4;
    for (o, &b) in out[..full * 4].chunks_exact_mut(4).zip(bytes) {
        o.copy_from_slice(&UNPACK[b as usize]);
    }
    let rest = out.len() - full * 4;
    if rest > 0 {
        out[full * 4..].copy_from_slice(&UNPACK[bytes[full] as usize][..rest]);
    }
}

#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
fn standardize(codes: &[i8], s: RowScale, out: &mut [f64]) {
    let off = -s.mean * s.scale;
    for (o, &c) in out.iter_mut().zip(codes) {
        let v = c as f64 * s.scale + off;
        *o = if c < 0 { 0.0 } else { v };
    }
}

/// Σ x², in eight interleaved partial sums (a fixed order, so the result is reproducible;
/// the compiler turns the lanes into one SIMD register).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
pub fn sum_squares(x: &[f64]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for k in 0..8 {
            acc[k] += c[k] * c[k];
        }
    }
    for (k, v) in chunks.remainder().iter().enumerate() {
        acc[k] += v * v;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}

fn sum_squares_view(t: ArrayView2<'_, f64>) -> f64 {
    t.rows()
        .into_iter()
        .map(|r| match r.as_slice() {
            Some(s) => sum_squares(s),
            None => r.iter().map(|v| v * v).sum(),
        })
        .sum()
}

/// Row stride of a row-major view (its rows contiguous).
fn row_major(a: &ArrayView2<'_, f64>) -> Option<usize> {
    let st = a.strides();
    (st[1] == 1 || a.ncols() <= 1).then(|| (st[0].max(1) as usize).max(a.ncols()))
}

/// `y += t · w` (`t`: tile `b × c`, `w`: `c × l`, `y`: `b × l`, all row-major).
pub fn gemm_tile_right(t: ArrayView2<'_, f64>, w: ArrayView2<'_, f64>, y: ArrayViewMut2<'_, f64>) {
    gemm(false, t, w, y)
}

/// `b += qᵀ · t` (`q`: `h × l` rows of the basis, `t`: tile `h × c`, `b`: `l × c`).
pub fn gemm_tile_left(q: ArrayView2<'_, f64>, t: ArrayView2<'_, f64>, b: ArrayViewMut2<'_, f64>) {
    gemm(true, q, t, b)
}

fn gemm(
    trans_a: bool,
    a: ArrayView2<'_, f64>,
    b: ArrayView2<'_, f64>,
    mut c: ArrayViewMut2<'_, f64>,
) {
    let (m, k) = if trans_a {
        (a.ncols(), a.nrows())
    } else {
        (a.nrows(), a.ncols())
    };
    let n = b.ncols();
    debug_assert_eq!(b.nrows(), k);
    debug_assert_eq!(c.dim(), (m, n));
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let (Some(lda), Some(ldb)) = (row_major(&a), row_major(&b)) else {
        // Never reached by the passes (their operands are row-major); kept correct anyway.
        let prod = if trans_a { a.t().dot(&b) } else { a.dot(&b) };
        c += &prod;
        return;
    };
    let ldc = c.strides()[0].max(1) as usize;
    assert!(
        c.strides()[1] == 1 || n == 1,
        "GEMM output must be row-major"
    );
    // SAFETY: the shapes and leading dimensions describe the three views exactly (row-major,
    // checked above), and the output view is exclusively borrowed.
    unsafe {
        cblas_dgemm(
            CBLAS_LAYOUT::CblasRowMajor,
            if trans_a {
                CBLAS_TRANSPOSE::CblasTrans
            } else {
                CBLAS_TRANSPOSE::CblasNoTrans
            },
            CBLAS_TRANSPOSE::CblasNoTrans,
            m as i32,
            n as i32,
            k as i32,
            1.0,
            a.as_ptr(),
            lda as i32,
            b.as_ptr(),
            ldb as i32,
            1.0,
            c.as_mut_ptr(),
            ldc.max(n) as i32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rankwise_runtime::{Dist, Generated, InMemoryGenotypes};

    #[test]
    fn pack_round_trips_every_code_and_ragged_rows() {
        for n in [1usize, 3, 4, 5, 9, 1027] {
            let row: Vec<i8> = (0..n).map(|j| ((j * 7 + n) % 4) as i8 - 1).collect();
            let mut packed = vec![0u8; n.div_ceil(4)];
            pack_row(&row, &mut packed);
            let mut back = vec![9i8; n];
            unpack_row(&packed, &mut back);
            assert_eq!(back, row, "n = {n}");
        }
    }

    #[test]
    fn row_scale_standardizes_and_drops_monomorphic_rows() {
        let (s, missing) = row_scale(&[0, 1, 2, -1, 1]).unwrap();
        assert_eq!(missing, 1);
        let p: f64 = 4.0 / 8.0;
        assert_eq!(s.mean, 2.0 * p);
        assert!((s.scale - 1.0 / (2.0 * p * (1.0 - p)).sqrt()).abs() < 1e-15);
        assert_eq!(row_scale(&[2, 2, -1]).unwrap().0.scale, 0.0);
        assert_eq!(row_scale(&[0, 0]).unwrap().0.scale, 0.0);
        assert_eq!(row_scale(&[-1, -1]).unwrap().0.scale, 0.0);
        assert_eq!(row_scale(&[0, 3, 1]).unwrap_err(), (1, 3));
        assert_eq!(row_scale(&[0, 1, -2]).unwrap_err(), (2, -2));
    }

    fn collect(
        op: &Operand,
        rows: Range<u64>,
        stored: Option<&Stored>,
        keep: bool,
    ) -> (Array2<f64>, PanelFacts, Option<Stored>) {
        let h = (rows.end - rows.start) as usize;
        let n = op.shape().1 as usize;
        let mut out = Array2::from_elem((h, n), f64::NAN);
        let (facts, kept) = TileProducer::new(op, 0, rows)
            .for_each(stored, keep, |r0, c0, t| {
                out.slice_mut(s![r0..r0 + t.nrows(), c0..c0 + t.ncols()])
                    .assign(&t);
            })
            .unwrap();
        (out, facts, kept)
    }

    #[test]
    fn genotype_tiles_are_the_standardized_matrix_resident_or_not() {
        let g = Generated::new(150, 2100, 4, Dist::Genotype).with_missing(0.1);
        let op = Operand::Genotypes(Arc::new(g.clone()));
        let (a, facts, kept) = collect(&op, 10..150, None, true);
        for i in 0..140 {
            let row: Vec<i8> = (0..2100).map(|j| g.genotype(10 + i as u64, j)).collect();
            let (sc, _) = row_scale(&row).unwrap();
            for j in 0..2100 {
                let want = if row[j] < 0 {
                    0.0
                } else {
                    (row[j] as f64 - sc.mean) * sc.scale
                };
                assert!((a[[i, j]] - want).abs() < 1e-14);
            }
        }
        assert!(facts.missing > 0);
        let (b, facts2, none) = collect(&op, 10..150, kept.as_ref(), false);
        assert!(none.is_none());
        assert_eq!(a, b);
        assert_eq!(facts.sum_squares, facts2.sum_squares);
    }

    #[test]
    fn dense_tiles_resident_equal_regenerated() {
        let g = Generated::new(200, 2500, 1, Dist::Uniform);
        let op = Operand::Dense(Arc::new(g));
        let (a, fa, kept) = collect(&op, 3..200, None, true);
        let (b, fb, _) = collect(&op, 3..200, kept.as_ref(), false);
        assert_eq!(a, b);
        assert_eq!(fa.sum_squares, fb.sum_squares);
    }

    #[test]
    fn bad_genotype_names_variant_and_sample() {
        let mut v = Array2::<i8>::zeros((5, 6));
        v[[3, 4]] = 7;
        v[[0, 0]] = 1;
        let op = Operand::Genotypes(Arc::new(InMemoryGenotypes::new(v, "test.zarr")));
        let err = TileProducer::new(&op, 0, 0..5)
            .for_each(None, false, |_, _, _| {})
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("variant 3") && err.contains("sample 4") && err.contains("7"),
            "{err}"
        );
        assert!(err.contains("test.zarr"), "{err}");
    }

    #[test]
    fn tile_gemms_match_dense_products() {
        let a = Array2::from_shape_fn((70, 33), |(i, j)| ((i * 31 + j * 7) % 13) as f64 - 6.0);
        let w = Array2::from_shape_fn((33, 5), |(i, j)| (i as f64 - j as f64) * 0.25);
        let mut y = Array2::<f64>::ones((70, 5));
        gemm_tile_right(a.view(), w.view(), y.view_mut());
        assert_eq!(y, a.dot(&w) + 1.0);
        let q = Array2::from_shape_fn((70, 4), |(i, j)| (i + j) as f64 * 0.5);
        let mut b = Array2::<f64>::zeros((4, 40));
        gemm_tile_left(q.view(), a.view(), b.slice_mut(s![.., 3..36]));
        assert_eq!(b.slice(s![.., 3..36]), q.t().dot(&a));
        assert!(b.slice(s![.., ..3]).iter().all(|&v| v == 0.0));
    }
}
