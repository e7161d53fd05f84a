//! The block work of Cholesky QR by hand (AVX2 and FMA): the Gram matrix `AᵀA` and the
//! triangular solve `A·R⁻¹` of a cache-sized column-major row block with few columns.
//!
//! # Why
//! At 20 columns, OpenBLAS's `dsyrk` and `dtrsm` spend as much time packing the block into
//! their own layout as multiplying: on a Zen 3 core, profiles of `rankwise svd` of
//! 10,000,000 × 20 put the copy routines at about half the kernels' time. Both products
//! are simple for a column-major block that sits in L2: a column is contiguous, so four
//! rows are one register.
//!
//! - [`gram`]: tiles of three by four columns of `G` (12 accumulators, each holding four
//!   partial sums over the rows `r ≡ lane (mod 4)`), over the upper triangle; the four
//!   lanes are added last in a fixed order, `(l₀ + l₁) + (l₂ + l₃)`.
//! - [`solve_right`]: strips of 16 rows; each column `qⱼ = (aⱼ − Σᵢ₍ᵢ₌₀..ⱼ₎ rᵢⱼqᵢ)·(1/rⱼⱼ)`,
//!   the sum in the order of `i`, one fused multiply-add per term, the product by the
//!   reciprocal last. (A division per register, as before, occupied Zen 3's divider for
//!   4.5 cycles each, about as long as all of a 20-column strip's multiply-adds; the
//!   reciprocal costs one more rounding, `2u` instead of `u` in each `qⱼ`, far inside the
//!   solve's backward error of `n·u`.) Measured on one core of the 2-core AMD EPYC (Zen 3)
//!   KVM guest, a 1,638 × 20 block (a row block of a 20-column panel), best of 200 × 50
//!   solves with the block copied in first: 31.6–32.8 µs with the division and one column
//!   at a time, 26.0–27.5 µs now.
//!
//! Both orders depend only on the block, and every CPU with AVX2 and FMA (AVX-512 ones
//! too) runs the same code, so the bits do not depend on placement or on the node.
//! Measured figures: `benches/RESULTS.md`, issue 38 notes, and the parent module.

use std::arch::x86_64::*;

/// Most columns the kernels take; wider blocks go to BLAS, whose packing is amortized
/// there (panels from `kernels::WHOLE_PANEL_COLS` columns are factored whole).
pub(super) const MAX_COLS: usize = 64;

/// True where the kernels run: AVX2 and FMA, and the hand kernels not switched off
/// (`RANKWISE_SKINNY=0` sends these products to BLAS too).
pub(super) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        crate::skinny::isa().is_some()
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
    })
}

/// `[-1, -1, -1, -1, 0, 0, 0, 0]`: the four lanes ending at `4 - n` mask the first `n`.
const MASKS: [i64; 8] = [-1, -1, -1, -1, 0, 0, 0, 0];

/// The mask of the first `n` lanes (`n ≤ 4`).
#[inline]
#[target_feature(enable = "avx2")]
fn mask(n: usize) -> __m256i {
    // SAFETY: `4 - n ≤ 4`, so the four values lie in MASKS.
    unsafe { _mm256_loadu_si256(MASKS.as_ptr().add(4 - n).cast()) }
}

/// The four lanes' sum in a fixed order.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes_sum(v: __m256d) -> f64 {
    let mut l = [0.0f64; 4];
    // SAFETY: `l` holds four values.
    unsafe { _mm256_storeu_pd(l.as_mut_ptr(), v) };
    (l[0] + l[1]) + (l[2] + l[3])
}

/// `G = AᵀA` for the column-major `m × n` block `a` (ld `m`), into the upper triangle of
/// `g` (`n × n`, ld `n`; the strictly lower triangle is not written).
///
/// # Safety
/// AVX2 and FMA; `a` holds at least `m·n` values, `g` at least `n·n`, `n ≤ MAX_COLS`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gram(a: &[f64], m: usize, n: usize, g: &mut [f64]) {
    debug_assert!(a.len() >= m * n && g.len() >= n * n && n <= MAX_COLS);
    let mut i0 = 0;
    while i0 < n {
        let ni = (n - i0).min(3);
        let mut j0 = i0;
        while j0 < n {
            let nj = (n - j0).min(4);
            // SAFETY: columns i0..i0 + ni and j0..j0 + nj lie in the block, and their
            // entries in `g`.
            unsafe {
                match (ni, nj) {
                    (3, 4) => tile::<3, 4>(a, m, i0, j0, g, n),
                    (3, 3) => tile::<3, 3>(a, m, i0, j0, g, n),
                    (3, 2) => tile::<3, 2>(a, m, i0, j0, g, n),
                    (3, 1) => tile::<3, 1>(a, m, i0, j0, g, n),
                    (2, 4) => tile::<2, 4>(a, m, i0, j0, g, n),
                    (2, 3) => tile::<2, 3>(a, m, i0, j0, g, n),
                    (2, 2) => tile::<2, 2>(a, m, i0, j0, g, n),
                    (2, 1) => tile::<2, 1>(a, m, i0, j0, g, n),
                    (1, 4) => tile::<1, 4>(a, m, i0, j0, g, n),
                    (1, 3) => tile::<1, 3>(a, m, i0, j0, g, n),
                    (1, 2) => tile::<1, 2>(a, m, i0, j0, g, n),
                    _ => tile::<1, 1>(a, m, i0, j0, g, n),
                }
            }
            j0 += nj;
        }
        i0 += ni;
    }
}

/// Entries `(i0 + di, j0 + dj)` of `AᵀA`, `di < I`, `dj < J`, into `g` (ld `n`) where
/// they lie on or above the diagonal.
///
/// # Safety
/// AVX2 and FMA; columns `i0..i0 + I` and `j0..j0 + J` of the `m`-row block lie in `a`,
/// and `g` holds `n·n` values with `i0 + I, j0 + J ≤ n`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const I: usize, const J: usize>(
    a: &[f64],
    m: usize,
    i0: usize,
    j0: usize,
    g: &mut [f64],
    n: usize,
) {
    let p = a.as_ptr();
    let mut acc = [[_mm256_setzero_pd(); J]; I];
    let mut r = 0;
    // SAFETY (all loads): rows r..r + 4 (or the masked m - r) of the columns named.
    unsafe {
        while r + 4 <= m {
            let xi: [__m256d; I] =
                std::array::from_fn(|d| _mm256_loadu_pd(p.add((i0 + d) * m + r)));
            for (dj, col) in (j0..j0 + J).enumerate() {
                let xj = _mm256_loadu_pd(p.add(col * m + r));
                for (acc, x) in acc.iter_mut().zip(xi) {
                    acc[dj] = _mm256_fmadd_pd(x, xj, acc[dj]);
                }
            }
            r += 4;
        }
        if r < m {
            // The last rows: masked loads give zeros in the other lanes, which add nothing.
            let k = mask(m - r);
            let xi: [__m256d; I] =
                std::array::from_fn(|d| _mm256_maskload_pd(p.add((i0 + d) * m + r), k));
            for (dj, col) in (j0..j0 + J).enumerate() {
                let xj = _mm256_maskload_pd(p.add(col * m + r), k);
                for (acc, x) in acc.iter_mut().zip(xi) {
                    acc[dj] = _mm256_fmadd_pd(x, xj, acc[dj]);
                }
            }
        }
    }
    for (di, row) in acc.iter().enumerate() {
        for (dj, v) in row.iter().enumerate() {
            let (i, j) = (i0 + di, j0 + dj);
            if i <= j {
                g[i + j * n] = lanes_sum(*v);
            }
        }
    }
}

/// Rows per strip of [`solve_right`]: four registers.
const STRIP: usize = 16;

/// `A := A·R⁻¹` for the column-major `m × n` block `a` (ld `m`) and the upper triangular
/// `r` (`n × n`, ld `n`, non-singular).
///
/// # Safety
/// AVX2 and FMA; `a` holds at least `m·n` values, `r` at least `n·n`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn solve_right(a: &mut [f64], m: usize, n: usize, r: &[f64]) {
    debug_assert!(a.len() >= m * n && r.len() >= n * n);
    let p = a.as_mut_ptr();
    let mut s = 0;
    // SAFETY (the strips): rows s..s + STRIP of every column lie in the block.
    while s + STRIP <= m {
        unsafe { strip(p, m, n, r, s) };
        s += STRIP;
    }
    // The last rows one at a time, in the strips' order: `(-r).mul_add(q, x)` rounds as
    // `_mm256_fnmadd_pd(r, q, x)` does, so every row gets the bits a strip would give it.
    for row in s..m {
        for j in 0..n {
            let mut x = a[row + j * m];
            for i in 0..j {
                x = (-r[i + j * n]).mul_add(a[row + i * m], x);
            }
            a[row + j * m] = x * (1.0 / r[j + j * n]);
        }
    }
}

/// Rows `s..s + STRIP` of [`solve_right`], two columns at a time: the terms of columns `j`
/// and `j + 1` over the solved columns `i < j` are summed side by side, each column's
/// chain in the order of `i` as before, so the bits are those of one column at a time.
/// One column's four chains of dependent multiply-adds (four cycles each) kept only half
/// of a Zen 3 core's two FMA pipes busy; two columns' eight chains fill them, and each
/// load of `qᵢ` feeds two multiply-adds instead of one.
///
/// # Safety
/// AVX2 and FMA; those rows of the `n` columns (ld `m`) lie at `p`; `r` holds `n·n`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn strip(p: *mut f64, m: usize, n: usize, r: &[f64], s: usize) {
    const W: usize = STRIP / 4;
    // SAFETY: the caller's rows; columns i < j were solved above in this strip.
    unsafe {
        let mut j = 0;
        while j + 2 <= n {
            let (c0, c1) = (p.add(j * m + s), p.add((j + 1) * m + s));
            let mut x0: [__m256d; W] = std::array::from_fn(|w| _mm256_loadu_pd(c0.add(4 * w)));
            let mut x1: [__m256d; W] = std::array::from_fn(|w| _mm256_loadu_pd(c1.add(4 * w)));
            for i in 0..j {
                let r0 = _mm256_set1_pd(*r.get_unchecked(i + j * n));
                let r1 = _mm256_set1_pd(*r.get_unchecked(i + (j + 1) * n));
                let qi = p.add(i * m + s);
                for w in 0..W {
                    let q = _mm256_loadu_pd(qi.add(4 * w));
                    x0[w] = _mm256_fnmadd_pd(r0, q, x0[w]);
                    x1[w] = _mm256_fnmadd_pd(r1, q, x1[w]);
                }
            }
            let d0 = _mm256_set1_pd(1.0 / *r.get_unchecked(j + j * n));
            let r01 = _mm256_set1_pd(*r.get_unchecked(j + (j + 1) * n));
            let d1 = _mm256_set1_pd(1.0 / *r.get_unchecked(j + 1 + (j + 1) * n));
            for w in 0..W {
                let q = _mm256_mul_pd(x0[w], d0);
                _mm256_storeu_pd(c0.add(4 * w), q);
                let x = _mm256_fnmadd_pd(r01, q, x1[w]);
                _mm256_storeu_pd(c1.add(4 * w), _mm256_mul_pd(x, d1));
            }
            j += 2;
        }
        if j < n {
            let col = p.add(j * m + s);
            let mut x: [__m256d; W] = std::array::from_fn(|w| _mm256_loadu_pd(col.add(4 * w)));
            for i in 0..j {
                let rij = _mm256_set1_pd(*r.get_unchecked(i + j * n));
                let qi = p.add(i * m + s);
                for (w, x) in x.iter_mut().enumerate() {
                    *x = _mm256_fnmadd_pd(rij, _mm256_loadu_pd(qi.add(4 * w)), *x);
                }
            }
            let d = _mm256_set1_pd(1.0 / *r.get_unchecked(j + j * n));
            for (w, x) in x.iter().enumerate() {
                _mm256_storeu_pd(col.add(4 * w), _mm256_mul_pd(*x, d));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    #[test]
    fn gram_and_solve_match_plain_sums_and_blas_on_drawn_blocks() {
        if !available() {
            eprintln!("skipped: no AVX2 and FMA here");
            return;
        }
        let mut rng = Rng::fresh();
        for _ in 0..40 {
            let n = 1 + rng.below(MAX_COLS);
            let m = n + rng.below(600);
            let a: Vec<f64> = (0..m * n).map(|_| rng.value() as f64 - 0.5).collect();
            let mut g = vec![f64::NAN; n * n];
            // SAFETY: AVX2 and FMA run here; the sizes are the vectors'.
            unsafe { gram(&a, m, n, &mut g) };
            for j in 0..n {
                for i in 0..n {
                    let v = g[i + j * n];
                    if i > j {
                        assert!(v.is_nan(), "lower ({i},{j}) written");
                        continue;
                    }
                    let want: f64 = (0..m).map(|t| a[t + i * m] * a[t + j * m]).sum();
                    let scale: f64 = (0..m).map(|t| (a[t + i * m] * a[t + j * m]).abs()).sum();
                    assert!(
                        (v - want).abs() <= 1e-14 * scale.max(1e-300) * (m as f64).sqrt(),
                        "{m}×{n} G[{i},{j}] {v} vs {want}"
                    );
                }
            }
            // An upper triangular R with a dominant diagonal; `A·R⁻¹·R` gives `A` back.
            let mut r = vec![0.0f64; n * n];
            for j in 0..n {
                for i in 0..j {
                    r[i + j * n] = rng.value() as f64 - 0.5;
                }
                r[j + j * n] = 1.0 + rng.value() as f64;
            }
            let mut q = a.clone();
            // SAFETY: as above.
            unsafe { solve_right(&mut q, m, n, &r) };
            for row in 0..m {
                for j in 0..n {
                    let back: f64 = (0..=j).map(|i| q[row + i * m] * r[i + j * n]).sum();
                    // The solve's componentwise backward error: γₙ·Σᵢ|qᵢ||rᵢⱼ|.
                    let scale: f64 = (0..=j).map(|i| (q[row + i * m] * r[i + j * n]).abs()).sum();
                    let x = a[row + j * m];
                    assert!(
                        (back - x).abs() <= 4.0 * (n + 2) as f64 * f64::EPSILON * scale,
                        "{m}×{n} row {row} col {j}: {back} vs {x} (scale {scale:e})"
                    );
                }
            }
            // The last rows (past the strips) get the bits a strip gives: solving a block
            // made of one strip's rows repeated gives each copy the same values.
            if m >= STRIP {
                let rows = STRIP + STRIP / 2;
                let mut b = vec![0.0f64; rows * n];
                for j in 0..n {
                    for t in 0..rows {
                        b[t + j * rows] = a[(t % STRIP) + j * m];
                    }
                }
                // SAFETY: as above.
                unsafe { solve_right(&mut b, rows, n, &r) };
                for j in 0..n {
                    for t in STRIP..rows {
                        assert_eq!(
                            b[t + j * rows].to_bits(),
                            b[(t - STRIP) + j * rows].to_bits(),
                            "row {t} col {j}"
                        );
                    }
                }
            }
        }
    }
}
