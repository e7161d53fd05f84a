//! Cholesky QR of a row block: the local panel factorization at BLAS-3 speed.
//!
//! A row block `A` (`m × n`, column-major, `m ≥ n`) is factored as `A = Q·R` by Cholesky QR
//! steps: `G = AᵀA` (`dsyrk`), `R₁ = chol(G)` (`dpotrf`), `Q₁ = A·R₁⁻¹` (`dtrsm`). One step
//! loses orthogonality as `κ(A)²·u`; a second step on `Q₁` restores it to the unit roundoff
//! (CholeskyQR2; Yamamoto et al., ETNA 44, 2015). A block so well conditioned that the
//! first step's loss is already within the contract stops after that step's Cholesky
//! factor, without touching `A` at all (see [`ONE_STEP_LOSS`]). When `A` is too
//! ill-conditioned for CholeskyQR2,
//! the first step factors `G + sI` with the shift `s = 11·(mn + n(n+1))·u·‖A‖_F²`, which
//! leaves `Q₁` conditioned well enough for CholeskyQR2 to finish (shifted CholeskyQR3;
//! Fukaya et al., SIAM J. Sci. Comput. 42, 2020). What decides is `dtrcon`'s estimate of
//! `κ₁(R)` after each Cholesky factorization, read before `A` is touched. A block that is
//! rank deficient, zero or not finite is left to LAPACK's Householder QR, as before.
//!
//! Which steps run depends on the block's values only, so the result depends only on the
//! panel, never on placement or rank count. The Gram matrices and the solves of blocks
//! with up to 64 columns and 1 MiB are computed by hand where the CPU has AVX2 and FMA
//! ([`avx2`]), by BLAS elsewhere.
//!
//! # Why
//! Householder QR of a block with few columns (`dgeqr2` and `dorg2r`: LAPACK's blocked code
//! starts at 32 columns) is a sequence of level-2 updates, `daxpy` and `dgemv`; they took
//! 60 % of `rankwise svd` of 10,000,000 × 20. Two Cholesky QR steps cost twice the flops in
//! four level-3 calls. Measured with `rankwise svd --rows 10000000 --cols 20 --chunk-rows
//! 625000` on the 2-core Intel Xeon KVM guest (AVX-512; OpenBLAS 0.3.21): see
//! `benches/RESULTS.md` (issue 38 notes) for the before and after.

use cblas_sys::{
    cblas_dsyrk, cblas_dtrmm, cblas_dtrsm, CBLAS_DIAG, CBLAS_LAYOUT, CBLAS_SIDE, CBLAS_TRANSPOSE,
    CBLAS_UPLO,
};
use ndarray::{Array2, ShapeBuilder};

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Largest `κ₁(R)` estimate with which the block's own Gram matrix is trusted (the
/// unshifted first step). CholeskyQR2 needs `κ(A)² · u · c(m, n) < 1`; at `κ = 10⁵` the
/// first step's loss of orthogonality is about `10⁻⁶`, far inside that, and `κ₂` may exceed
/// `dtrcon`'s estimate of `κ₁` by a factor up to about `3n`.
const KAPPA_FIRST: f64 = 1e5;

/// Largest `κ₁(R)` estimate in the step after a shifted one. The shift leaves
/// `κ(Q₁) ≈ √s · κ(A) / ‖A‖`, about `10⁷` at `κ(A) = 10¹²` (measured: `dtrcon` estimates of
/// 4·10⁴ to 6·10⁷ for 20-column blocks); that step then loses orthogonality to `κ²u < 1` and
/// the last step removes what is left. A larger estimate means that the block is
/// numerically rank deficient, which Householder QR handles.
const KAPPA_MIDDLE: f64 = 1e9;

/// Largest `κ₁(R)` estimate in the last step, whose input is orthonormal to a few digits
/// when the steps before it did their work; the last step then leaves `Q` orthonormal to
/// `κ² · u`, within the contract of 10⁻¹³.
const KAPPA_LAST: f64 = 4.0;

/// Largest predicted loss of orthogonality, `κ̂² · √m · ε` (`ε = 2⁻⁵²`) for `dtrcon`'s estimate `κ̂` of
/// `κ₁(R₁)`, with which the first step is the whole factorization.
///
/// One step loses orthogonality as the Gram matrix's rounding error seen through `R₁⁻¹`:
/// about `κ(A)² · ε` times the growth of that error with the `m` terms of each sum, which is
/// a random walk's `√m` rather than the worst case's `m`. Measured on 12,000 blocks of the
/// kernels' shapes (`m = block_rows(n)` for `n` from 2 to 64; random orthonormal factors with
/// singular values spread geometrically, or one large and the rest nearly equal, as a
/// uniform matrix's mean gives them; `κ₂` from 6 to 24), the loss `‖QᵀQ − I‖_max` was at most
/// `0.046 · κ̂² · √m · ε`. At this bound that is at most 5.5·10⁻¹⁴, within the contract of
/// 10⁻¹³; the worst of the 1,924 blocks the bound admitted lost 2.2·10⁻¹⁴. A uniform
/// matrix of 20 columns (`κ₂ ≈ 7.8`, estimates 9.1–10.4 in blocks of 1,638 rows; the bound
/// admits 11.6 there) takes this path: `svd --rows 10000000 --cols 20` lost
/// 1.8·10⁻¹⁵ where CholeskyQR2 lost 2.2·10⁻¹⁵, in 0.53 s instead of 0.85 s on the 2-core
/// Intel Xeon guest (`benches/RESULTS.md`, exact SVD notes).
const ONE_STEP_LOSS: f64 = 1.2e-12;

/// Whether one Cholesky QR step with the factor's `κ₁` estimate `kappa` leaves an `m`-row
/// block's `Q` orthonormal within the contract ([`ONE_STEP_LOSS`]).
fn one_step(kappa: f64, m: usize) -> bool {
    kappa * kappa * (m as f64).sqrt() * f64::EPSILON <= ONE_STEP_LOSS
}

/// How many times [`kappa2`]'s estimate the one-step test takes `κ₂` to be: the estimate
/// approaches `κ₂` from below, and within a few percent in [`KAPPA2_STEPS`] steps even where
/// the extreme singular values sit in a cluster (a random block's, at the edges of the
/// Marchenko–Pastur law); an isolated extreme value is found in a few steps.
const KAPPA2_MARGIN: f64 = 2.0;

/// Power-iteration steps of [`kappa2`] for each extreme singular value.
const KAPPA2_STEPS: usize = 30;

/// `dtrcon`'s `κ₁` estimate exceeds `κ₂` by up to a factor of about `n`: for a wide block
/// it refuses one step where `κ₂` admits it. A 12,500 × 400 block of normal values has
/// `κ₂ = 1.42` where `dtrcon` estimates `κ₁` at 11.3, over the one-step bound of 6.95 at
/// that height (6,250 × 512: 1.78 against 30.8 and 8.27), so such panels took a second
/// Cholesky QR step, a triangular solve of the panel and a second Gram matrix, that they
/// did not need. This estimates `κ₂(R)` itself, `σ_max / σ_min` by power iteration on
/// `RᵀR` and on `(RᵀR)⁻¹` from a fixed start (`2·n²` flops a step, so the choice depends
/// only on the block's values), for the one-step test to take [`KAPPA2_MARGIN`] times it.
/// Measured on the 2-core Intel Xeon guest, `svd --dist normal --json`, two runs each
/// alternating with the build before: `--rows 200000 --cols 400 --chunk-rows 12500`, pass 1
/// 2.39–2.41 → 1.47–1.48 s, the run 3.60–3.66 → 2.59–2.77 s; `--rows 100000 --cols 512
/// --chunk-rows 6250`, pass 1 1.80–2.20 → 0.98–1.24 s, the run 2.99–3.62 → 2.22–2.39 s;
/// `--check`'s residual and orthogonality 3.4e-15 either way.
fn kappa2(r: &[f64], n: usize) -> f64 {
    use cblas_sys::{cblas_dtrmv, cblas_dtrsv};
    let ni = n as i32;
    // A fixed start with a component along every direction that is not special.
    let start = || -> Vec<f64> {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                0.5 + (s >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    };
    let normalize = |x: &mut [f64]| -> f64 {
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        x.iter_mut().for_each(|v| *v /= norm);
        norm
    };
    let (up, lay, diag) = (
        CBLAS_UPLO::CblasUpper,
        CBLAS_LAYOUT::CblasColMajor,
        CBLAS_DIAG::CblasNonUnit,
    );
    let (no, tr) = (CBLAS_TRANSPOSE::CblasNoTrans, CBLAS_TRANSPOSE::CblasTrans);
    // The growth of a unit vector under `apply`, after KAPPA2_STEPS applications.
    let growth = |apply: &dyn Fn(&mut [f64])| -> f64 {
        let mut x = start();
        normalize(&mut x);
        let mut g = 0.0;
        for _ in 0..KAPPA2_STEPS {
            apply(&mut x);
            g = normalize(&mut x);
        }
        g
    };
    // σ_max²: under RᵀR.
    // SAFETY (both): `r` holds n·n values, ld n, upper triangle read; `x` holds n; R is
    // nonsingular (its Cholesky factorization succeeded with a bounded condition estimate).
    let big = growth(&|x| unsafe {
        cblas_dtrmv(lay, up, no, diag, ni, r.as_ptr(), ni, x.as_mut_ptr(), 1);
        cblas_dtrmv(lay, up, tr, diag, ni, r.as_ptr(), ni, x.as_mut_ptr(), 1);
    });
    // σ_min⁻²: under R⁻¹R⁻ᵀ.
    let small = growth(&|x| unsafe {
        cblas_dtrsv(lay, up, tr, diag, ni, r.as_ptr(), ni, x.as_mut_ptr(), 1);
        cblas_dtrsv(lay, up, no, diag, ni, r.as_ptr(), ni, x.as_mut_ptr(), 1);
    });
    let kappa = (big * small).sqrt();
    if kappa.is_finite() {
        kappa
    } else {
        f64::INFINITY
    }
}

/// Whether one step suffices for the factor `r` (`n × n`) of an `m`-row block with
/// `dtrcon`'s estimate `kappa1`: by that estimate, or else by [`kappa2`]'s. `κ₂ ≥ κ₁ / n`, so
/// a `κ₁` estimate past `n` times the bound is not worth the power iterations.
fn one_step_for(r: &[f64], n: usize, kappa1: f64, m: usize) -> bool {
    if one_step(kappa1, m) {
        return true;
    }
    let bound = (ONE_STEP_LOSS / ((m as f64).sqrt() * f64::EPSILON)).sqrt();
    kappa1 <= n as f64 * bound && one_step(KAPPA2_MARGIN * kappa2(r, n), m)
}

/// Row blocks shorter than this many times their width go straight to Householder QR:
/// their Gram matrix costs nearly as much as the QR itself.
const MIN_ASPECT: usize = 4;

/// One Cholesky QR step's Cholesky factor, or why it was refused.
enum Step {
    /// `R` (`n × n`, upper, column-major, lower triangle zero) with `κ₁(R)` within bounds,
    /// and `dtrcon`'s estimate of that `κ₁(R)`.
    Good(Vec<f64>, f64),
    /// `dpotrf` failed or `R` is too ill-conditioned; `A` is untouched.
    Refused,
}

/// Blocks up to this size are left to the hand kernels, which read the block once per
/// register tile of the result and are fast while it stays in cache (the row blocks of
/// panels with fewer than 64 columns take at most 256 KiB). A panel of 64 columns factored
/// whole streams from memory, where BLAS's packing wins: `svd --dist normal` of
/// 1,048,576 × 64 in 131,073-row panels on the 2-core AMD EPYC (Zen 3) KVM guest, pass 1
/// 4.3–5.1e-8 by hand against 3.0–3.2e-8 core-seconds a value by BLAS.
const HAND_BYTES: usize = 1 << 20;

/// Whether the hand kernels ([`avx2`]) take an `m × n` block here.
fn by_hand(m: usize, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n <= avx2::MAX_COLS && avx2::available() && m * n * 8 <= HAND_BYTES
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, n);
        false
    }
}

/// `G = AᵀA + shift·I`, upper triangle, into a fresh `n × n` column-major buffer.
fn gram(a: &[f64], m: usize, n: usize, shift: f64) -> Vec<f64> {
    let mut g = vec![0.0f64; n * n];
    if by_hand(m, n) {
        // SAFETY: AVX2 and FMA run here (`by_hand`); `a` holds m·n values, `g` n·n.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx2::gram(a, m, n, &mut g)
        };
    } else {
        gram_blas(a, m, n, &mut g);
    }
    if shift != 0.0 {
        for i in 0..n {
            g[i + i * n] += shift;
        }
    }
    g
}

/// [`gram`]'s product by BLAS (`dsyrk`).
fn gram_blas(a: &[f64], m: usize, n: usize, g: &mut [f64]) {
    // SAFETY: `a` holds m·n values with leading dimension m; `g` holds n·n with ld n.
    unsafe {
        cblas_dsyrk(
            CBLAS_LAYOUT::CblasColMajor,
            CBLAS_UPLO::CblasUpper,
            CBLAS_TRANSPOSE::CblasTrans,
            n as i32,
            m as i32,
            1.0,
            a.as_ptr(),
            m as i32,
            0.0,
            g.as_mut_ptr(),
            n as i32,
        );
    }
}

/// Cholesky factor of `g` (upper, in place) if it exists and its `κ₁` estimate is at most
/// `kappa_max`.
fn cholesky(mut g: Vec<f64>, n: usize, kappa_max: f64) -> Step {
    let ni = n as i32;
    let mut info = 0i32;
    // SAFETY: `g` holds n·n values, ld n; only the upper triangle is read and written.
    unsafe { lapack_sys::dpotrf_(&(b'U' as _), &ni, g.as_mut_ptr(), &ni, &mut info) };
    if info != 0 {
        return Step::Refused;
    }
    let mut rcond = 0.0f64;
    let mut work = vec![0.0f64; 3 * n];
    let mut iwork = vec![0i32; n];
    // SAFETY: as above; `work` holds 3n values and `iwork` n, as dtrcon requires.
    unsafe {
        lapack_sys::dtrcon_(
            &(b'1' as _),
            &(b'U' as _),
            &(b'N' as _),
            &ni,
            g.as_ptr(),
            &ni,
            &mut rcond,
            work.as_mut_ptr(),
            iwork.as_mut_ptr(),
            &mut info,
        );
    }
    // False for a NaN estimate too.
    let bounded = rcond * kappa_max >= 1.0;
    if info != 0 || !bounded {
        return Step::Refused;
    }
    for c in 0..n {
        for r in c + 1..n {
            g[r + c * n] = 0.0;
        }
    }
    Step::Good(g, 1.0 / rcond)
}

/// `B := op(T)·B` or `B := B·op(T)` for the upper triangular `t` (`tn × tn`, ld `tn`) and
/// the column-major `rows × cols` matrix `b` (ld `rows`): `op` is `T⁻¹` when `solve`,
/// else `T`.
fn triangular(
    left: bool,
    solve: bool,
    t: &[f64],
    tn: usize,
    b: &mut [f64],
    rows: usize,
    cols: usize,
) {
    let side = if left {
        CBLAS_SIDE::CblasLeft
    } else {
        CBLAS_SIDE::CblasRight
    };
    let call = if solve { cblas_dtrsm } else { cblas_dtrmm };
    // SAFETY: `t` holds tn·tn values with ld tn, `b` rows·cols with ld rows, and tn is
    // rows (left) or cols (right), as the callers below pass them.
    unsafe {
        call(
            CBLAS_LAYOUT::CblasColMajor,
            side,
            CBLAS_UPLO::CblasUpper,
            CBLAS_TRANSPOSE::CblasNoTrans,
            CBLAS_DIAG::CblasNonUnit,
            rows as i32,
            cols as i32,
            1.0,
            t.as_ptr(),
            tn as i32,
            b.as_mut_ptr(),
            rows as i32,
        );
    }
}

/// `A := A·R⁻¹` for the upper triangular `r` (`n × n`).
fn solve_right(a: &mut [f64], m: usize, n: usize, r: &[f64]) {
    if by_hand(m, n) {
        // SAFETY: AVX2 and FMA run here (`by_hand`); `a` holds m·n values, `r` n·n.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            avx2::solve_right(a, m, n, r)
        };
    } else {
        triangular(false, true, r, n, a, m, n);
    }
}

/// `B := L·B` for the upper triangular `l` and `b`, both `n × n`.
fn multiply_left(l: &[f64], b: &mut [f64], n: usize) {
    triangular(true, false, l, n, b, n, n);
}

/// `A := A·R` for the upper triangular `r` (`n × n`): undoes [`solve_right`].
fn multiply_right(a: &mut [f64], m: usize, n: usize, r: &[f64]) {
    triangular(false, false, r, n, a, m, n);
}

/// One unshifted step after the first on `a`: `R` and `a := a·R⁻¹`, or `None` with `a`
/// untouched when `κ₁(R)` exceeds `kappa_max`.
fn step(a: &mut [f64], m: usize, n: usize, kappa_max: f64) -> Option<Vec<f64>> {
    match cholesky(gram(a, m, n, 0.0), n, kappa_max) {
        Step::Good(r, _) => {
            solve_right(a, m, n, &r);
            Some(r)
        }
        Step::Refused => None,
    }
}

/// A block's Cholesky QR: `A = Q̃ · T · R`, where `Q̃` is left in the block's values and
/// `Q = Q̃ · T` is orthonormal.
pub(crate) struct CholeskyQr {
    /// `R`, `n × n`, upper triangular.
    pub(crate) r: Array2<f64>,
    /// `T = R_last⁻¹`, `n × n`, upper triangular and nearly orthogonal: the last step's
    /// triangular solve, left to be applied to the small matrices `Q` later multiplies
    /// (`Q·c = Q̃·(T·c)`) instead of to the block, which saves a quarter of the block work.
    pub(crate) t: Array2<f64>,
    /// Whether the first step was shifted (the block's Gram matrix was ill-conditioned);
    /// the tests check which blocks take which path.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) shifted: bool,
    /// The triangular factors whose solves made `Q̃` from `A`, in order (none when one step
    /// was enough, one, or two after a shifted step): [`replay`] makes the same `Q̃` bit for
    /// bit from the same values.
    pub(crate) solves: Vec<Vec<f64>>,
}

/// `A := A·R₁⁻¹·R₂⁻¹…` for the factors `solves` of a [`CholeskyQr`] of the same `m × n`
/// values: its `Q̃` again, bit for bit (the same solves in the same order), at a triangular
/// solve's cost instead of a whole factorization's (no Gram matrix, no Cholesky).
pub(crate) fn replay(a: &mut [f64], m: usize, n: usize, solves: &[Vec<f64>]) {
    for r in solves {
        solve_right(&mut a[..m * n], m, n, r);
    }
}

/// `T := T⁻¹` for the upper triangular `t` (`n × n`) in place.
fn invert_upper(t: &mut [f64], n: usize) -> bool {
    let ni = n as i32;
    let mut info = 0i32;
    // SAFETY: `t` holds n·n values, ld n; only the upper triangle is read and written.
    unsafe {
        lapack_sys::dtrtri_(
            &(b'U' as _),
            &(b'N' as _),
            &ni,
            t.as_mut_ptr(),
            &ni,
            &mut info,
        )
    };
    info == 0
}

/// The Cholesky QR of the column-major `m × n` block at `a` (see [`CholeskyQr`]), or `None`
/// with `a` given back for Householder QR: as it was, or, when steps had already been taken,
/// as `Q̃·R` of those steps, which is `A` to a backward error of about `n·u·‖A‖` (the
/// triangular solves' own), the size of Householder QR's. Restoring so rather than from a
/// copy keeps the workspace at a few `n × n` matrices, also for panels factored whole.
pub(crate) fn cholesky_qr(a: &mut [f64], m: usize, n: usize) -> Option<CholeskyQr> {
    if n == 0 || m < MIN_ASPECT * n || m > i32::MAX as usize {
        return None;
    }
    let a = &mut a[..m * n];
    let g = gram(a, m, n, 0.0);
    let trace: f64 = (0..n).map(|i| g[i + i * n]).sum();
    if !trace.is_finite() || trace <= 0.0 {
        return None;
    }
    let (mut r, shifted, solves) = match cholesky(g, n, KAPPA_FIRST) {
        Step::Good(r1, kappa) => {
            if one_step_for(&r1, n, kappa, m) {
                // `Q = A·R₁⁻¹` is orthonormal within the contract already: `Q̃` is `A`
                // itself and `T` the first step's solve, applied to the small matrices only.
                let mut t = r1.clone();
                if invert_upper(&mut t, n) {
                    return Some(CholeskyQr {
                        r: Array2::from_shape_vec((n, n).f(), r1).expect("n × n"),
                        t: Array2::from_shape_vec((n, n).f(), t).expect("n × n"),
                        shifted: false,
                        solves: Vec::new(),
                    });
                }
            }
            solve_right(a, m, n, &r1);
            (r1.clone(), false, vec![r1])
        }
        Step::Refused => {
            let shift = 11.0 * ((m * n + n * (n + 1)) as f64) * f64::EPSILON * trace;
            let Step::Good(r0, _) = cholesky(gram(a, m, n, shift), n, KAPPA_MIDDLE) else {
                return None;
            };
            solve_right(a, m, n, &r0);
            match step(a, m, n, KAPPA_MIDDLE) {
                Some(r1) => {
                    let mut r = r0.clone();
                    multiply_left(&r1, &mut r, n);
                    (r, true, vec![r0, r1])
                }
                None => {
                    multiply_right(a, m, n, &r0);
                    return None;
                }
            }
        }
    };
    // The last step: its factor, but not its solve.
    let last = match cholesky(gram(a, m, n, 0.0), n, KAPPA_LAST) {
        Step::Good(last, _) => {
            let mut t = last.clone();
            invert_upper(&mut t, n).then(|| {
                multiply_left(&last, &mut r, n);
                t
            })
        }
        Step::Refused => None,
    };
    let Some(t) = last else {
        // The steps before did not make the block orthonormal to a few digits (it is
        // numerically rank deficient): give LAPACK the block back.
        multiply_right(a, m, n, &r);
        return None;
    };
    Some(CholeskyQr {
        r: Array2::from_shape_vec((n, n).f(), r).expect("n × n"),
        t: Array2::from_shape_vec((n, n).f(), t).expect("n × n"),
        shifted,
        solves,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, ArrayView2};
    use ndarray_linalg::QR;

    /// A column-major `m × n` matrix with singular values spread geometrically from 1 to
    /// `1/kappa`: random orthonormal factors from the QR of normal draws.
    fn conditioned(m: usize, n: usize, kappa: f64, rng: &mut crate::testing::Rng) -> Vec<f64> {
        let g = crate::testing::normal;
        let (u, _) = g(m, n, rng.next()).qr().unwrap();
        let (v, _) = g(n, n, rng.next()).qr().unwrap();
        let s = Array1::from_shape_fn(n, |i| kappa.powf(-(i as f64) / ((n - 1).max(1) as f64)));
        let a = (&u * &s).dot(&v.t());
        a.t().iter().copied().collect()
    }

    /// `‖QᵀQ − I‖_max`.
    fn orthogonality(q: &Array2<f64>) -> f64 {
        (q.t().dot(q) - Array2::<f64>::eye(q.ncols()))
            .iter()
            .fold(0f64, |a, x| a.max(x.abs()))
    }

    /// `‖A − Q·R‖_F / ‖A‖_F`.
    fn residual(q: &Array2<f64>, r: &Array2<f64>, a: &ArrayView2<'_, f64>) -> f64 {
        let norm = a.iter().map(|x| x * x).sum::<f64>().sqrt();
        (&q.dot(r) - a).iter().map(|x| x * x).sum::<f64>().sqrt() / norm
    }

    fn view(a: &[f64], m: usize, n: usize) -> ArrayView2<'_, f64> {
        ArrayView2::from_shape((m, n).f(), &a[..m * n]).unwrap()
    }

    /// Wide blocks (64 to 320 columns, as panels factored whole are), well conditioned
    /// as random panels are (`κ₂` 1.1 to 3) and less so (10, 100): whatever number of steps
    /// the one-step test with `κ₂`'s estimate chooses, `Q` is orthonormal and `Q·R` is the
    /// block within the contract of 10⁻¹³, on fresh shapes; and the well-conditioned tall
    /// ones, which `dtrcon`'s `κ₁` alone sent to a second step, take one.
    #[test]
    fn wide_blocks_take_one_step_only_where_it_keeps_the_contract() {
        let mut rng = crate::testing::Rng::fresh();
        let mut one_step_by_kappa2 = 0;
        for kappa in [1.1, 1.5, 3.0, 10.0, 100.0] {
            for _ in 0..2 {
                let n = 64 + rng.below(257);
                let m = 25 * n + rng.below(20 * n);
                let a = conditioned(m, n, kappa, &mut rng);
                let mut q = a.clone();
                let f = cholesky_qr(&mut q, m, n)
                    .unwrap_or_else(|| panic!("{m} × {n}, κ {kappa}: refused"));
                let qv = view(&q, m, n).dot(&f.t);
                let av = view(&a, m, n);
                let res = residual(&qv, &f.r, &av);
                let orth = orthogonality(&qv);
                let one = f.solves.is_empty();
                assert!(
                    res <= 1e-13,
                    "{m} × {n}, κ {kappa}, one step {one}: residual {res:e}"
                );
                assert!(
                    orth <= 1e-13,
                    "{m} × {n}, κ {kappa}, one step {one}: orthogonality {orth:e}"
                );
                if one && kappa <= 1.5 {
                    one_step_by_kappa2 += 1;
                }
                if kappa >= 10.0 {
                    assert!(!one, "{m} × {n}, κ {kappa}: one step");
                }
            }
        }
        assert!(
            one_step_by_kappa2 >= 3,
            "{one_step_by_kappa2} of 4 well-conditioned blocks"
        );
    }

    /// The factorization's contract for any conditioning up to 10¹²: `‖A − QR‖/‖A‖` and
    /// `‖QᵀQ − I‖` at most 10⁻¹³ (the SVD's), `R` upper triangular; well-conditioned blocks
    /// take the unshifted path and ill-conditioned ones the shifted one, on fresh shapes.
    #[test]
    fn factors_blocks_of_any_conditioning() {
        let mut rng = crate::testing::Rng::fresh();
        for kappa in [1.0, 1e3, 1e6, 1e9, 1e12] {
            for _ in 0..3 {
                let n = 1 + rng.below(40);
                let m = MIN_ASPECT * n + rng.below(3000);
                let a = conditioned(m, n, kappa, &mut rng);
                let mut q = a.clone();
                let CholeskyQr {
                    r,
                    t,
                    shifted,
                    solves,
                } = cholesky_qr(&mut q, m, n)
                    .unwrap_or_else(|| panic!("{m} × {n}, κ {kappa:e}: refused"));
                // The solves make the same Q̃ again from the block's values.
                let mut again = a.clone();
                replay(&mut again, m, n, &solves);
                assert!(
                    again[..m * n]
                        .iter()
                        .zip(&q)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{m} × {n}, κ {kappa:e}: the replayed Q̃ differs"
                );
                if shifted {
                    assert_eq!(solves.len(), 2);
                } else {
                    assert!(solves.len() <= 1);
                }
                let qv = view(&q, m, n).dot(&t);
                let av = view(&a, m, n);
                let res = residual(&qv, &r, &av);
                let orth = orthogonality(&qv);
                assert!(res <= 1e-13, "{m} × {n}, κ {kappa:e}: residual {res:e}");
                assert!(
                    orth <= 1e-13,
                    "{m} × {n}, κ {kappa:e}: orthogonality {orth:e}"
                );
                for c in 0..n {
                    for i in c + 1..n {
                        assert_eq!(r[[i, c]], 0.0, "{m} × {n}: R not upper triangular");
                    }
                }
                if kappa <= 1e3 {
                    assert!(!shifted, "{m} × {n}, κ {kappa:e}: shifted");
                }
                if kappa >= 1e9 && n > 1 {
                    assert!(shifted, "{m} × {n}, κ {kappa:e}: not shifted");
                }
            }
        }
    }

    /// Blocks of the kernels' shapes near the one-step bound: whichever path each takes,
    /// `‖QᵀQ − I‖` stays within 10⁻¹³ (the measurement behind [`ONE_STEP_LOSS`], on fresh
    /// blocks), and well-conditioned ones take one step and leave their values untouched.
    #[test]
    fn one_step_only_within_the_contract() {
        let mut rng = crate::testing::Rng::fresh();
        let mut one = 0;
        for i in 0..160 {
            let n = 2 + rng.below(63);
            let m = crate::kernels::block_rows(n);
            let kappa = [1.5, 4.0, 8.0, 12.0, 16.0][i % 5];
            let (u, _) = crate::testing::normal(m, n, rng.next()).qr().unwrap();
            let (v, _) = crate::testing::normal(n, n, rng.next()).qr().unwrap();
            // Singular values spread geometrically, or one large and the rest nearly equal
            // (a uniform matrix's mean makes such a spectrum).
            let spike = rng.below(2) == 1;
            let s = Array1::from_shape_fn(n, |j| match (spike, j) {
                (true, 0) => kappa,
                (true, _) => 1.0 + 0.01 * j as f64,
                _ => f64::powf(kappa, -(j as f64) / (n - 1) as f64),
            });
            let a: Vec<f64> = (&u * &s).dot(&v.t()).t().iter().copied().collect();
            let mut q = a.clone();
            let f = cholesky_qr(&mut q, m, n).expect("factored");
            if f.solves.is_empty() {
                one += 1;
                assert!(a.iter().zip(&q).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
            let qv = view(&q, m, n).dot(&f.t);
            let orth = orthogonality(&qv);
            let path = f.solves.len();
            assert!(
                orth <= 1e-13,
                "{m} × {n}, κ₂ {kappa}, spike {spike}, {path} solves: orthogonality {orth:e}"
            );
            if kappa == 1.5 && n >= 8 {
                assert!(f.solves.is_empty(), "{m} × {n}, κ₂ {kappa}: {path} solves");
            }
        }
        assert!(one >= 32, "{one} of 160 blocks took one step");
    }

    /// Blocks no Cholesky QR can factor are refused and given back: untouched when refused
    /// before any step (all zeros, a NaN, too few rows), else equal to within the
    /// triangular solves' backward error (a zero column: rank deficient, found after the
    /// shifted step), with the zero column exactly zero.
    #[test]
    fn refuses_what_it_cannot_factor_and_leaves_it() {
        let mut rng = crate::testing::Rng::fresh();
        let (m, n) = (400 + rng.below(400), 2 + rng.below(20));
        let base = conditioned(m, n, 10.0, &mut rng);
        let mut zero_col = base.clone();
        let c = rng.below(n);
        zero_col[c * m..(c + 1) * m].fill(0.0);
        let mut nan = base.clone();
        nan[rng.below(m * n)] = f64::NAN;
        for (what, a, rows) in [
            ("zero column", zero_col, m),
            ("zeros", vec![0.0; m * n], m),
            ("NaN", nan, m),
            ("short", base.clone(), MIN_ASPECT * n - 1),
        ] {
            let mut b = a.clone();
            assert!(cholesky_qr(&mut b, rows, n).is_none(), "{what}: factored");
            let norm = a
                .iter()
                .filter(|x| x.is_finite())
                .map(|x| x * x)
                .sum::<f64>()
                .sqrt();
            let close = a.iter().zip(&b).all(|(x, y)| {
                x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-14 * n as f64 * norm
            });
            assert!(close, "{what}: values changed");
            if what == "zero column" {
                assert!(
                    b[c * m..(c + 1) * m].iter().all(|x| *x == 0.0),
                    "zero column"
                );
            } else {
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{what}"
                );
            }
        }
    }
}
