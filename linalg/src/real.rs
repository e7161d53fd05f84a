//! The element types of the passes' values, as numbers: f64 and f32, their conversions,
//! and the reductions the passes accumulate in f64 (Σ x², sums). How tiles of them are
//! filled, standardized and multiplied is [`crate::tiles::TileReal`]; their BLAS is
//! [`crate::blas::Blas`].

use ndarray::ArrayView2;

/// An element type of the passes: f64 or f32, as numbers.
pub trait Real:
    Copy + Default + Send + Sync + std::fmt::Debug + PartialEq + 'static + ndarray::LinalgScalar
{
    /// Converts from f64 (rounding to nearest for f32).
    fn from_f64(x: f64) -> Self;
    /// Converts to f64 (exact).
    fn to_f64(self) -> f64;
    /// Σ x² in f64.
    fn sum_squares(x: &[Self]) -> f64;
    /// `sums[i] += x[i]` in f64.
    fn add_to(sums: &mut [f64], x: &[Self]);
}

impl Real for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn sum_squares(x: &[f64]) -> f64 {
        sum_squares(x)
    }
    fn add_to(sums: &mut [f64], x: &[f64]) {
        for (s, v) in sums.iter_mut().zip(x) {
            *s += v;
        }
    }
}

impl Real for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn sum_squares(x: &[f32]) -> f64 {
        sum_squares_f32(x)
    }
    fn add_to(sums: &mut [f64], x: &[f32]) {
        add_f32_to(sums, x)
    }
}

/// Σ x², in [`LANES`] interleaved partial sums (a fixed order, so the result is
/// reproducible): with AVX-512F by [`avx512::sum_squares`], elsewhere as the compiler
/// vectorizes [`lane_squares`]; both give the same bits.
pub(crate) fn sum_squares(x: &[f64]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512F runs here.
        return unsafe { avx512::sum_squares(x) };
    }
    sum_squares_lanes(x)
}

/// [`sum_squares`] as the compiler vectorizes it.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
fn sum_squares_lanes(x: &[f64]) -> f64 {
    fold_lanes(lane_squares::<f64, LANES>(x))
}

/// Σ x² of `x` in `N` lanes, value `i` in lane `i mod N`; inlined into the callers, whose
/// target features then vectorize it.
#[inline(always)]
fn lane_squares<T, const N: usize>(x: &[T]) -> [T; N]
where
    T: Copy + Default + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    let mut acc = [T::default(); N];
    let mut chunks = x.chunks_exact(N);
    for c in &mut chunks {
        for k in 0..N {
            acc[k] += c[k] * c[k];
        }
    }
    for (k, &v) in chunks.remainder().iter().enumerate() {
        acc[k] += v * v;
    }
    acc
}

/// Lanes of the sums of squares: four AVX-512 registers of f64, so that four additions
/// are in flight (one register's chain of dependent additions held a tile's Σx² to a
/// quarter of what a core reads from cache).
const LANES: usize = 32;

/// The lanes summed pairwise, in a fixed order.
fn fold_lanes(mut acc: [f64; LANES]) -> f64 {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for k in 0..w {
            acc[k] += acc[k + w];
        }
    }
    acc[0]
}

/// Σ x² of f32 values: squares summed in f32 over blocks of `F32_BLOCK` values, eight
/// per lane of `F32_LANES` (four registers), each block's lanes then added in f64.
///
/// Converting every value to f64 first (as this did) made Σx² 5–7 % of the CPU time of
/// `rsvd --zarr` at q = 0: two conversions and two f64 multiply-adds per 16 values where
/// this takes an f32 multiplication and addition. Each lane's eight squares carry a
/// relative error of at most 9u (u = 2⁻²⁴, about 5.4e-7) and the f64 sums add next to
/// none, so the result is within 5.4e-7 of the exact Σx² of the values, whatever their
/// number; the float32 passes' own products sum 512 terms per tile in f32.
pub(crate) fn sum_squares_f32(x: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512F runs here.
        return unsafe { avx512::sum_squares_f32(x) };
    }
    sum_squares_f32_lanes(x)
}

/// [`sum_squares_f32`] as the compiler vectorizes it.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
fn sum_squares_f32_lanes(x: &[f32]) -> f64 {
    let mut total = [0.0f64; LANES];
    for block in x.chunks(F32_BLOCK) {
        let acc = lane_squares::<f32, F32_LANES>(block);
        for k in 0..LANES {
            total[k] += acc[k] as f64 + acc[k + LANES] as f64;
        }
    }
    fold_lanes(total)
}

/// The sums of squares written out for AVX-512F: the lanes of [`lane_squares`] are four
/// registers (lane `k` of register `g` is lane `8g + k` of f64, `16g + k` of f32), each
/// square added as there (a multiplication, then an addition: the same bits).
///
/// The compiler's form of the f64 sum mixed 128-bit operations with shuffles and blends:
/// on a 2-core Xeon KVM guest (family 6, model 207), 2026-11-30, Σx² of the generated tiles
/// took 6 % of all CPU time of `rsvd` of a 100,000 × 20,000 matrix (k = 10, q = 0, `perf`),
/// and 5.9 % even with each row summed from L1 right after it was made; this form takes
/// 2.3 % (1.9 % from L1, not worth the row-by-row filling).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{fold_lanes, F32_BLOCK, F32_LANES, LANES};
    use std::arch::x86_64::*;

    /// True where AVX-512F runs.
    pub(super) fn available() -> bool {
        static YES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *YES.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
    }

    /// [`super::sum_squares`].
    ///
    /// # Safety
    /// AVX-512F runs here.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_squares(x: &[f64]) -> f64 {
        let mut acc = [_mm512_setzero_pd(); LANES / 8];
        let mut chunks = x.chunks_exact(LANES);
        for c in &mut chunks {
            for (g, a) in acc.iter_mut().enumerate() {
                // SAFETY: the chunk holds LANES values.
                let v = unsafe { _mm512_loadu_pd(c.as_ptr().add(8 * g)) };
                *a = _mm512_add_pd(*a, _mm512_mul_pd(v, v));
            }
        }
        let mut lanes = [0.0f64; LANES];
        for (g, a) in acc.iter().enumerate() {
            // SAFETY: eight lanes from 8g, inside the array.
            unsafe { _mm512_storeu_pd(lanes.as_mut_ptr().add(8 * g), *a) };
        }
        for (k, &v) in chunks.remainder().iter().enumerate() {
            lanes[k] += v * v;
        }
        fold_lanes(lanes)
    }

    /// [`super::sum_squares_f32`].
    ///
    /// # Safety
    /// AVX-512F runs here.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_squares_f32(x: &[f32]) -> f64 {
        let mut total = [0.0f64; LANES];
        for block in x.chunks(F32_BLOCK) {
            let mut acc = [_mm512_setzero_ps(); F32_LANES / 16];
            let mut chunks = block.chunks_exact(F32_LANES);
            for c in &mut chunks {
                for (g, a) in acc.iter_mut().enumerate() {
                    // SAFETY: the chunk holds F32_LANES values.
                    let v = unsafe { _mm512_loadu_ps(c.as_ptr().add(16 * g)) };
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(v, v));
                }
            }
            let mut lanes = [0.0f32; F32_LANES];
            for (g, a) in acc.iter().enumerate() {
                // SAFETY: sixteen lanes from 16g, inside the array.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr().add(16 * g), *a) };
            }
            for (k, &v) in chunks.remainder().iter().enumerate() {
                lanes[k] += v * v;
            }
            for k in 0..LANES {
                total[k] += lanes[k] as f64 + lanes[k + LANES] as f64;
            }
        }
        fold_lanes(total)
    }
}

/// Lanes of [`sum_squares_f32`]'s f32 sums (four AVX-512 registers).
const F32_LANES: usize = 2 * LANES;

/// Values per block of [`sum_squares_f32`]: eight squares per lane, a tile's row.
const F32_BLOCK: usize = 8 * F32_LANES;

/// Σ x² of a view, row by row.
pub(crate) fn sum_squares_view<T: Real>(t: ArrayView2<'_, T>) -> f64 {
    t.rows()
        .into_iter()
        .map(|r| match r.as_slice() {
            Some(s) => T::sum_squares(s),
            None => r.iter().map(|v| v.to_f64() * v.to_f64()).sum(),
        })
        .sum()
}

/// `sums[i] += x[i]`, converting to f64 (an ndarray `zip_mut_with` of the same took 3 % of
/// the CPU time of `rsvd --zarr`, converting a value at a time).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(crate) fn add_f32_to(sums: &mut [f64], x: &[f32]) {
    for (s, v) in sums.iter_mut().zip(x) {
        *s += *v as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    /// Both sums give the bits of their compiler-vectorized forms (which the AVX2 and
    /// other CPUs run) at every length around the lanes and blocks, and on values whose
    /// squares round.
    #[test]
    fn the_written_out_sums_of_squares_give_the_bits_of_the_lanes() {
        let mut rng = Rng::fresh();
        // Values with full 53-bit mantissas (the sum of two draws), over several binades.
        let x: Vec<f64> = (0..2100)
            .map(|_| (rng.value() as f64 + rng.value() as f64 * 1e-8) * 1e3)
            .collect();
        let y: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        for len in (0..70).chain([511, 512, 513, 1023, 1100, 2100]) {
            assert_eq!(
                sum_squares(&x[..len]).to_bits(),
                sum_squares_lanes(&x[..len]).to_bits(),
                "f64, {len} values"
            );
            assert_eq!(
                sum_squares_f32(&y[..len]).to_bits(),
                sum_squares_f32_lanes(&y[..len]).to_bits(),
                "f32, {len} values"
            );
        }
    }
}
