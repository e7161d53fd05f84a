//! The AVX2 form of the fused `atb`, `b += Qᵀ·T` of a packed genotype tile, for CPUs
//! without AVX-512F.
//!
//! Each value of `b` is one f32 chain of multiply-adds over the tile's rows in order, added
//! to `b` in f64: the order of the AVX-512 kernel and of the skinny kernel on the
//! standardized tile, so the bits are those of standardizing first, on either instruction
//! set. Each group of 16 columns is expanded once into a line a row (the codes' word
//! broadcast, shifted by `2·lane` and `16 + 2·lane`, and `vpermilps` through the row's table
//! in both 128-bit halves, whose low two bits index it), and up to six rows of `b` by those 16
//! columns (12 accumulators) run over the lines while they are in L1.
//!
//! Measured on one core of the 2-core AMD EPYC KVM guest (Zen 3), criterion
//! `rsvd_tiles/fused_qt_packed_flops` against `standardized_qt_packed_flops` (a row block of
//! 256 variants × 20,000 samples, 20 rows of `b`), in the same runs, 2026-11-29: 54.0
//! against 38.7 GFLOP/s and 54.2 against 50.3 (the host's speed drifts between runs), and
//! 62.6 against 50.9 once each row's table is laid out once per tile and indexed in-lane
//! (`vpermilps`, one cycle, where `vpermps` crosses lanes);
//! expanding the codes again for every group of six rows instead of once was slower than
//! standardizing first. `T·Ω` has no AVX2 form here: the dot-product form of the AVX-512
//! kernel, written for 16 registers (one row against six columns, or two against two from
//! expanded lines), ran at 0.8–1.0 of standardizing first and the skinny kernel
//! (`fused_packed_omega_flops` 54.3 against 65.9, `fused_pass_f32_dot_ab` 54.3 against
//! 61.8), which it would have to beat to be worth its other order of sums; so on AVX2 nodes
//! `T·Ω` sums in the skinny kernel's order and its f32 results differ from an AVX-512
//! node's in the last bits.

use std::arch::x86_64::*;

use super::Src;

/// Bytes ahead of a packed tile's first code that hold the next tile's codes.
const NEXT_TILE: usize = crate::layout::TILE_COLS / 4;

/// Most rows of `b` in one sweep: 12 accumulators.
const MOST: usize = 6;

/// Even parts of `n`, each at most [`MOST`]: `(first, count)`.
fn parts(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let per = n.div_ceil(n.div_ceil(MOST).max(1)).max(1);
    (0..n)
        .step_by(per)
        .map(move |first| (first, per.min(n - first)))
}

/// The lane mask of the first `n` of 16 lanes, as two halves of all-ones or zero lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn mask(n: usize) -> [__m256i; 2] {
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let n = _mm256_set1_epi32(n as i32);
    let hi = _mm256_add_epi32(lanes, _mm256_set1_epi32(8));
    [_mm256_cmpgt_epi32(n, lanes), _mm256_cmpgt_epi32(n, hi)]
}

/// One row of a packed tile: its first byte and its table repeated twice.
#[derive(Clone, Copy)]
struct Row {
    at: *const u8,
    lut: __m256,
}

/// Row `i` of `t`.
///
/// # Safety
/// `i < t.rows`, and `t` is packed (a table per row).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn row(t: &Src, i: usize) -> Row {
    // SAFETY: the caller's contract.
    unsafe {
        let l = _mm_loadu_ps((*t.tables.add(i)).as_ptr());
        Row {
            at: t.base.add(i * t.stride),
            lut: _mm256_set_m128(l, l),
        }
    }
}

/// Values `16·j ..` of a row in two halves: all 16 (`FULL`), or the `n < 16` of its
/// ragged end (lanes `m`; the others zero), reading nothing past them.
///
/// # Safety
/// The row holds those codes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn group<const FULL: bool>(r: Row, j: usize, n: usize, m: [__m256i; 2]) -> [__m256; 2] {
    // SAFETY: the caller's contract.
    unsafe {
        let at = r.at.add(4 * j);
        let word = if FULL {
            at.cast::<i32>().read_unaligned()
        } else {
            super::x86::tail(at, n)
        };
        let w = _mm256_set1_epi32(word);
        let lo = _mm256_srlv_epi32(w, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
        let hi = _mm256_srlv_epi32(w, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30));
        let v = [
            _mm256_permutevar_ps(r.lut, lo),
            _mm256_permutevar_ps(r.lut, hi),
        ];
        if FULL {
            v
        } else {
            [
                _mm256_and_ps(v[0], _mm256_castsi256_ps(m[0])),
                _mm256_and_ps(v[1], _mm256_castsi256_ps(m[1])),
            ]
        }
    }
}

/// 16 values of a row, on one cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

thread_local! {
    /// A tile's values of one group of 16 columns, a line a row (16 KiB for 256 rows), and
    /// its rows.
    static LINES: std::cell::RefCell<(Vec<Line>, Vec<Row>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `b += Qᵀ·T` for `g` rows of `b` (`q` their first column of `Q`, `b` their first row).
/// Each group of 16 columns is expanded once into a line a row, which stay in L1 while
/// every part of at most six rows of `b` runs over them: expanding the codes again for
/// each part made this product slower than standardizing the tile first.
///
/// # Safety
/// AVX2 and FMA; as the AVX-512 `atb_group` for `g` columns of `Q`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn atb_rows(
    t: &Src,
    g: usize,
    q: *const f32,
    ldq: usize,
    b: *mut f64,
    ldb: usize,
) {
    LINES.with_borrow_mut(|(lines, rows)| {
        lines.resize(t.rows, Line([0.0; 16]));
        // Each row's table in a register's layout once, not again for every group.
        rows.clear();
        // SAFETY: i < t.rows.
        rows.extend((0..t.rows).map(|i| unsafe { row(t, i) }));
        for j in 0..t.cols.div_ceil(16) {
            let n = (t.cols - 16 * j).min(16);
            let m = mask(n);
            for (line, &r) in lines.iter_mut().zip(rows.iter()) {
                // SAFETY: the row's values 16j.. exist (`group` reads only the ragged
                // end's); a line holds 16 values.
                unsafe {
                    if j == 0 {
                        // A prefetch never faults, whatever the address.
                        let next = r.at.wrapping_add(NEXT_TILE);
                        _mm_prefetch::<_MM_HINT_T0>(next.cast());
                        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64).cast());
                    }
                    let x = if n == 16 {
                        group::<true>(r, j, n, m)
                    } else {
                        group::<false>(r, j, n, m)
                    };
                    let at = line.0.as_mut_ptr();
                    _mm256_store_ps(at, x[0]);
                    _mm256_store_ps(at.add(8), x[1]);
                }
            }
            for (r0, k) in parts(g) {
                // SAFETY: the caller's contract; columns r0 .. r0 + k of Q, rows of b, and
                // columns 16j .. 16j + n of them.
                unsafe {
                    let (qp, bp) = (q.add(r0), b.add(r0 * ldb + 16 * j));
                    by_const!(k, atb_lines, (lines, qp, ldq, bp, ldb, n), 1 2 3 4 5 6);
                }
            }
        }
    });
}

/// `G` rows of `b += Qᵀ·T` over one group of `n ≤ 16` columns, its values in `lines`.
///
/// # Safety
/// AVX2 and FMA; Q's rows hold `G` values from `q` (a row per line), rows `b + g·ldb` hold
/// `n` values.
#[target_feature(enable = "avx2,fma")]
unsafe fn atb_lines<const G: usize>(
    lines: &[Line],
    q: *const f32,
    ldq: usize,
    b: *mut f64,
    ldb: usize,
    n: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; G];
    // SAFETY: Q's row i holds G values from `q`; a line holds 16 values, 64-byte aligned.
    unsafe {
        for (i, line) in lines.iter().enumerate() {
            let at = line.0.as_ptr();
            let x = [_mm256_load_ps(at), _mm256_load_ps(at.add(8))];
            let qi = q.add(i * ldq);
            for (g, a) in acc.iter_mut().enumerate() {
                let v = _mm256_broadcast_ss(&*qi.add(g));
                a[0] = _mm256_fmadd_ps(v, x[0], a[0]);
                a[1] = _mm256_fmadd_ps(v, x[1], a[1]);
            }
        }
        atb_add(acc, n, b, ldb);
    }
}

/// `b[g, ..n] += acc[g]` in f64, for the first `n ≤ 16` lanes.
///
/// # Safety
/// Rows `b + g·ldb` hold `n` values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn atb_add<const G: usize>(acc: [[__m256; 2]; G], n: usize, b: *mut f64, ldb: usize) {
    for (g, a) in acc.into_iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe {
            let out = b.add(g * ldb);
            if n == 16 {
                for (h, v) in a.into_iter().enumerate() {
                    let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
                    let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v));
                    let at = out.add(8 * h);
                    _mm256_storeu_pd(at, _mm256_add_pd(_mm256_loadu_pd(at), lo));
                    _mm256_storeu_pd(at.add(4), _mm256_add_pd(_mm256_loadu_pd(at.add(4)), hi));
                }
            } else {
                let mut lanes = [0f32; 16];
                _mm256_storeu_ps(lanes.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), a[1]);
                for (c, &v) in lanes.iter().take(n).enumerate() {
                    *out.add(c) += v as f64;
                }
            }
        }
    }
}
