//! Chunk sources: where a panel's values come from.
//!
//! # The generator
//!
//! [`Generated`] is counter-based: the value at global `(row, col)` is a pure function of
//! `(seed, row, col)`, computed by the SplitMix64 output function (Steele, Lea & Flood 2014)
//! applied to `key(seed) + counter(row, col)·γ`. SplitMix64 is itself a counter-based
//! generator: its n-th output is `mix(state₀ + n·γ)`, so jumping to any element costs one
//! multiply and the stream passes BigCrush. Because no state is carried from one element to
//! the next, a panel can be regenerated in any pass, by any actor on any rank or device, and
//! the values never depend on placement, chunking or rank count. Normal values use the
//! ziggurat of `rand_distr` fed by a short per-element stream derived the same way.

use std::convert::Infallible;
use std::ops::Range;

use ndarray::ArrayViewMut2;
use rand_distr::{Distribution, StandardNormal};

/// The SplitMix64 increment (the golden ratio in 64-bit fixed point).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Columns of the generated index space: `counter = row · 2²⁴ + col`.
pub const MAX_GENERATED_COLS: u64 = 1 << 24;
/// Rows of the generated index space (so the counter stays below 2⁶⁴).
pub const MAX_GENERATED_ROWS: u64 = 1 << 39;

/// The SplitMix64 output (finalizer) function.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Maps the top 53 bits of `x` to a uniform f64 in [0, 1).
#[inline(always)]
pub fn unit_f64(x: u64) -> f64 {
    (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Distribution of generated values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dist {
    /// Uniform in [0, 1), like `da.random.random`.
    Uniform,
    /// Standard normal.
    Normal,
    /// Genotype dosages 0, 1, 2: row `i` is a variant with allele frequency
    /// `p_i ∈ [0.05, 0.5)` and each entry is Binomial(2, p_i).
    Genotype,
}

impl std::str::FromStr for Dist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Dist::Uniform),
            "normal" => Ok(Dist::Normal),
            "genotype" => Ok(Dist::Genotype),
            other => Err(format!(
                "unknown distribution `{other}` (expected uniform, normal or genotype)"
            )),
        }
    }
}

impl std::fmt::Display for Dist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Dist::Uniform => "uniform",
            Dist::Normal => "normal",
            Dist::Genotype => "genotype",
        })
    }
}

/// Errors of chunk sources.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The requested rows or columns fall outside the source.
    #[error("rows {rows:?} × {cols} columns are outside the {what} of shape {shape:?}")]
    OutOfBounds {
        /// What was asked for.
        rows: Range<u64>,
        /// Columns of the buffer.
        cols: usize,
        /// The source's shape.
        shape: (u64, u64),
        /// Which source.
        what: String,
    },
}

/// A matrix whose row panels can be produced on demand, by any actor, any number of times.
pub trait PanelSource: Send + Sync {
    /// Shape `(rows, cols)` of the matrix this source yields (after any transposition).
    fn shape(&self) -> (u64, u64);
    /// Writes rows `rows` (all columns) into `out`, which has `rows.len()` rows and
    /// `shape().1` columns in any memory layout.
    fn fill(&self, rows: Range<u64>, out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError>;
    /// Short description for reports and errors.
    fn describe(&self) -> String;
}

/// The counter-based generated matrix of shape `(rows, cols)`.
#[derive(Clone, Debug)]
pub struct Generated {
    rows: u64,
    cols: u64,
    seed: u64,
    dist: Dist,
    key: u64,
    /// Yield the transpose: panel rows are columns of the generated matrix.
    transposed: bool,
}

impl Generated {
    /// A generated `rows × cols` matrix. Panics never; shape limits are checked by the grid.
    pub fn new(rows: u64, cols: u64, seed: u64, dist: Dist) -> Self {
        Generated {
            rows,
            cols,
            seed,
            dist,
            key: mix64(seed ^ 0x005E_ED0F_4A4E_4B57),
            transposed: false,
        }
    }

    /// The same values, seen transposed (`cols × rows`): used for short-and-fat matrices,
    /// whose SVD is computed through the transpose.
    pub fn transposed(mut self) -> Self {
        self.transposed = !self.transposed;
        self
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The distribution.
    pub fn dist(&self) -> Dist {
        self.dist
    }

    /// The raw 64-bit draw of element `(row, col)` of the untransposed matrix.
    #[inline(always)]
    pub fn bits(&self, row: u64, col: u64) -> u64 {
        mix64(
            self.key
                .wrapping_add((row * MAX_GENERATED_COLS + col).wrapping_mul(GAMMA)),
        )
    }

    /// Value at `(row, col)` of the untransposed matrix.
    #[inline]
    pub fn value(&self, row: u64, col: u64) -> f64 {
        match self.dist {
            Dist::Uniform => unit_f64(self.bits(row, col)),
            Dist::Normal => normal_from(self.bits(row, col)),
            Dist::Genotype => self.genotype(row, col) as f64,
        }
    }

    /// Genotype dosage at `(row, col)`: row is the variant.
    #[inline]
    pub fn genotype(&self, row: u64, col: u64) -> u8 {
        let p = self.allele_frequency(row);
        let x = self.bits(row, col);
        let a = ((x >> 32) as f64) * (1.0 / 4_294_967_296.0);
        let b = ((x & 0xFFFF_FFFF) as f64) * (1.0 / 4_294_967_296.0);
        (a < p) as u8 + (b < p) as u8
    }

    /// Allele frequency of variant `row` for [`Dist::Genotype`].
    #[inline]
    pub fn allele_frequency(&self, row: u64) -> f64 {
        // A column index no real matrix reaches gives each row its own draw.
        0.05 + 0.45 * unit_f64(self.bits(row, MAX_GENERATED_COLS - 1))
    }

    /// Fills `out` with rows `rows`, columns `col0..col0 + out.ncols()` of the untransposed
    /// matrix.
    fn fill_direct(&self, rows: Range<u64>, col0: u64, mut out: ArrayViewMut2<'_, f64>) {
        let ncols = out.ncols();
        match self.dist {
            Dist::Uniform => {
                // Walk in memory order; the counter of (i, j) is an affine function of i and j.
                if out.is_standard_layout() {
                    for (li, mut row) in out.rows_mut().into_iter().enumerate() {
                        let counter = (rows.start + li as u64) * MAX_GENERATED_COLS + col0;
                        let base = self.key.wrapping_add(counter.wrapping_mul(GAMMA));
                        let row = row.as_slice_mut().expect("standard layout row");
                        fill_uniform_run(row, base, GAMMA);
                    }
                } else {
                    let step = MAX_GENERATED_COLS.wrapping_mul(GAMMA);
                    for j in 0..ncols {
                        let mut col = out.column_mut(j);
                        let base = self.key.wrapping_add(
                            (rows.start * MAX_GENERATED_COLS + col0 + j as u64).wrapping_mul(GAMMA),
                        );
                        match col.as_slice_mut() {
                            Some(s) => fill_uniform_run(s, base, step),
                            None => {
                                for (li, v) in col.iter_mut().enumerate() {
                                    *v = unit_f64(mix64(
                                        base.wrapping_add((li as u64).wrapping_mul(step)),
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            _ => {
                for ((li, j), v) in out.indexed_iter_mut() {
                    *v = self.value(rows.start + li as u64, col0 + j as u64);
                }
            }
        }
    }
}

#[inline]
fn fill_uniform_run(out: &mut [f64], base: u64, step: u64) {
    let mut z = base;
    for v in out.iter_mut() {
        *v = unit_f64(mix64(z));
        z = z.wrapping_add(step);
    }
}

/// A short stream of 64-bit draws started from one element's draw, for rejection samplers.
struct ElementStream {
    state: u64,
}

impl rand_core::TryRng for ElementStream {
    type Error = Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        self.state = self.state.wrapping_add(GAMMA);
        Ok(mix64(self.state))
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

#[inline]
fn normal_from(bits: u64) -> f64 {
    let mut stream = ElementStream { state: bits };
    StandardNormal.sample(&mut stream)
}

impl PanelSource for Generated {
    fn shape(&self) -> (u64, u64) {
        if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    fn fill(&self, rows: Range<u64>, out: ArrayViewMut2<'_, f64>) -> Result<(), SourceError> {
        let (m, n) = self.shape();
        if rows.end > m
            || rows.start > rows.end
            || out.nrows() as u64 != rows.end - rows.start
            || out.ncols() as u64 != n
        {
            return Err(SourceError::OutOfBounds {
                rows,
                cols: out.ncols(),
                shape: (m, n),
                what: self.describe(),
            });
        }
        if self.transposed {
            // Panel rows are columns `rows` of the generated matrix: fill the transposed view.
            self.fill_direct(0..self.rows, rows.start, out.reversed_axes());
        } else {
            self.fill_direct(rows, 0, out);
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "generated {} × {} {} matrix (seed {}){}",
            self.rows,
            self.cols,
            self.dist,
            self.seed,
            if self.transposed { ", transposed" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, ShapeBuilder};

    fn dense(g: &Generated, rows: Range<u64>, fortran: bool) -> Array2<f64> {
        let n = g.shape().1 as usize;
        let len = (rows.end - rows.start) as usize;
        let mut a = if fortran {
            Array2::zeros((len, n).f())
        } else {
            Array2::zeros((len, n))
        };
        g.fill(rows, a.view_mut()).unwrap();
        a
    }

    #[test]
    fn values_do_not_depend_on_panel_split_or_layout() {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Genotype] {
            let g = Generated::new(37, 5, 11, dist);
            let whole = dense(&g, 0..37, true);
            for (cut, fortran) in [(1u64, false), (13, true), (36, false)] {
                let top = dense(&g, 0..cut, fortran);
                let bottom = dense(&g, cut..37, !fortran);
                for i in 0..37usize {
                    for j in 0..5usize {
                        let v = if (i as u64) < cut {
                            top[[i, j]]
                        } else {
                            bottom[[i - cut as usize, j]]
                        };
                        assert_eq!(v.to_bits(), whole[[i, j]].to_bits(), "{dist} ({i},{j})");
                        assert_eq!(v.to_bits(), g.value(i as u64, j as u64).to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn transpose_yields_the_same_values() {
        let g = Generated::new(6, 9, 3, Dist::Normal);
        let t = g.clone().transposed();
        assert_eq!(t.shape(), (9, 6));
        let a = dense(&t, 2..7, false);
        for r in 0..5usize {
            for c in 0..6usize {
                assert_eq!(a[[r, c]], g.value(c as u64, r as u64 + 2));
            }
        }
    }

    #[test]
    fn moments_are_plausible() {
        let n = 200_000u64;
        for (dist, mean, var) in [(Dist::Uniform, 0.5, 1.0 / 12.0), (Dist::Normal, 0.0, 1.0)] {
            let g = Generated::new(n, 1, 7, dist);
            let a = dense(&g, 0..n, true);
            let m = a.mean().unwrap();
            let v = a.mapv(|x| (x - m) * (x - m)).mean().unwrap();
            assert!((m - mean).abs() < 0.01, "{dist} mean {m}");
            assert!((v - var).abs() < 0.02 * var.max(0.1), "{dist} var {v}");
        }
        let g = Generated::new(1, n, 7, Dist::Genotype);
        let p = g.allele_frequency(0);
        let a = dense(&g, 0..1, false);
        assert!(a.iter().all(|&x| x == 0.0 || x == 1.0 || x == 2.0));
        let m = a.mean().unwrap();
        assert!(
            (m - 2.0 * p).abs() < 0.01,
            "genotype mean {m} vs 2p {}",
            2.0 * p
        );
    }

    #[test]
    fn different_seeds_differ() {
        let a = Generated::new(4, 4, 1, Dist::Uniform);
        let b = Generated::new(4, 4, 2, Dist::Uniform);
        assert_ne!(a.value(0, 0), b.value(0, 0));
    }

    #[test]
    fn out_of_bounds_is_an_error() {
        let g = Generated::new(4, 3, 1, Dist::Uniform);
        let mut a = Array2::zeros((2, 3));
        assert!(g.fill(3..5, a.view_mut()).is_err());
    }
}
