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

/// Σ x², in eight interleaved partial sums (a fixed order, so the result is reproducible;
/// the compiler turns the lanes into one SIMD register).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
pub fn sum_squares(x: &[f64]) -> f64 {
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
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
pub fn sum_squares_f32(x: &[f32]) -> f64 {
    let mut total = [0.0f64; LANES];
    for block in x.chunks(F32_BLOCK) {
        let acc = lane_squares::<f32, F32_LANES>(block);
        for k in 0..LANES {
            total[k] += acc[k] as f64 + acc[k + LANES] as f64;
        }
    }
    fold_lanes(total)
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
