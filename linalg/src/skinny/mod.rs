//! Products with one skinny operand (float32 and float64), for the tiles of the randomized
//! SVD's passes.
//!
//! # Why not BLAS
//!
//! Every pass of the randomized SVD multiplies a tile of the matrix (256 × 512 values) by
//! a sketch or basis only `l = k + p` (+ probes) columns wide: `Y = T·Ω` in the range pass,
//! `Qᵀ·T` in the projection pass. BLAS's GEMM copies ("packs") both operands into its own
//! layout before multiplying, and with an output this narrow packing the tile costs about
//! as much as the product: profiles of `rsvd --zarr` on two cores put OpenBLAS's copy
//! routines at 17% of all CPU time next to 21% for its kernel, which on AMD Zen runs the
//! AVX2 code of Haswell. These kernels read the tile where it lies, once, and keep the
//! narrow operand's `l` columns in AVX-512 registers:
//!
//! - [`ab`], `C = A·B` with `B` narrow (`n ≤` [`MAX_NARROW`]): twelve rows of `A` at a
//!   time, each value broadcast against one row of `B` (two registers, masked to `n`),
//!   sums over the inner dimension kept in registers.
//! - [`atb`], `C = Aᵀ·B` with `A` narrow (`m ≤` [`MAX_NARROW`]): one register of columns
//!   of `B` at a time, each row's values scaled by the broadcast `A[i, c]` of up to 24
//!   rows of `C`, in blocks of rows that stay in cache.
//!
//! Both sum over the inner dimension in order, one fused multiply-add per term, so the
//! result depends only on the operands. They run where the CPU has AVX-512F, and in their
//! AVX2 form ([`avx2`], the same sums in the same order, so the same bits) where it has
//! AVX2 and FMA; elsewhere (and for wider operands) the callers use BLAS.

#[cfg(target_arch = "x86_64")]
mod avx2;

/// The widest narrow operand the kernels take (columns of `B` in [`ab`], of `A` in
/// [`atb`]); wider products go to BLAS, whose packing is then amortized.
pub(crate) const MAX_NARROW: usize = 64;

/// The instruction sets the kernels come in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512F: 32 registers of 512 bits.
    Avx512,
    /// AVX2 and FMA: 16 registers of 256 bits; the same bits as [`Isa::Avx512`].
    Avx2,
}

impl Isa {
    /// Those this CPU runs, widest first.
    pub(crate) fn supported() -> Vec<Isa> {
        let mut isas = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                isas.push(Isa::Avx2);
            }
        }
        isas
    }
}

/// The kernels' instruction set here: the widest this CPU runs, unless `RANKWISE_SKINNY`
/// says otherwise. `RANKWISE_SKINNY=0` sends every product to BLAS (to compare the two on a
/// given CPU); `RANKWISE_SKINNY=avx2` runs the AVX2 kernels on an AVX-512 CPU, computing as
/// an AVX2 node does (the fused `T·Ω`, AVX-512 only, then stays off; the fused `Qᵀ·T` runs
/// its AVX2 form, which gives the same bits).
pub(crate) fn isa() -> Option<Isa> {
    static ISA: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let supported = Isa::supported();
        match std::env::var("RANKWISE_SKINNY").as_deref() {
            Ok("0") => None,
            Ok("avx2") => supported.into_iter().find(|i| *i == Isa::Avx2),
            _ => supported.first().copied(),
        }
    })
}

/// The element types the kernels take (f32 and f64).
pub(crate) trait Elem: Copy + sealed::Sealed {
    /// Values per AVX-512 register.
    const LANES: usize;
    /// [`ab`] for `w ≤ 2·LANES` columns (AVX-512) or `w ≤ MAX_NARROW` (AVX2).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn ab_columns(
        isa: Isa,
        m: usize,
        w: usize,
        k: usize,
        a: *const Self,
        lda: usize,
        b: *const Self,
        ldb: usize,
        beta: Self,
        c: *mut Self,
        ldc: usize,
    );
    /// [`atb`] for `g ≤ 12` rows of `C` (AVX-512).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn atb_group(
        g: usize,
        n: usize,
        k: usize,
        a: *const Self,
        lda: usize,
        b: *const Self,
        ldb: usize,
        beta: Self,
        c: *mut Self,
        ldc: usize,
    );
    /// [`atb`] with the AVX2 kernel (all `m` rows of `C`).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn atb_avx2(
        m: usize,
        n: usize,
        k: usize,
        a: *const Self,
        lda: usize,
        b: *const Self,
        ldb: usize,
        beta: Self,
        c: *mut Self,
        ldc: usize,
    );
}

mod sealed {
    pub(crate) trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// `C = A·B + beta·C` with the kernels of `isa` (row-major: `A` is `m × k` with leading
/// dimension `lda`, `B` is `k × n` with `ldb`, `C` is `m × n` with `ldc`). Returns false,
/// computing nothing, when `n > MAX_NARROW` or this element type has no kernels for `isa`.
///
/// # Safety
/// The pointers and leading dimensions must describe valid matrices of those shapes, `C`
/// exclusively borrowed and not overlapping `A` or `B`; this CPU runs `isa` ([`isa`]).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn ab<T: Elem>(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: *const T,
    lda: usize,
    b: *const T,
    ldb: usize,
    beta: T,
    c: *mut T,
    ldc: usize,
) -> bool {
    if n > MAX_NARROW {
        return false;
    }
    let step = match isa {
        Isa::Avx512 => 2 * T::LANES,
        // The AVX2 kernel groups all the columns itself.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => MAX_NARROW,
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 => return false,
    };
    let mut c0 = 0;
    while c0 < n {
        let w = (n - c0).min(step);
        // SAFETY: `isa` runs here; columns c0..c0 + w lie in B and C.
        unsafe { T::ab_columns(isa, m, w, k, a, lda, b.add(c0), ldb, beta, c.add(c0), ldc) };
        c0 += w;
    }
    true
}

/// `C = Aᵀ·B + beta·C` with the kernels of `isa` (row-major: `A` is `k × m` with leading
/// dimension `lda`, `B` is `k × n` with `ldb`, `C` is `m × n` with `ldc`). Returns false,
/// computing nothing, when `m > MAX_NARROW` or this element type has no kernels for `isa`.
///
/// # Safety
/// As for [`ab`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn atb<T: Elem>(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: *const T,
    lda: usize,
    b: *const T,
    ldb: usize,
    beta: T,
    c: *mut T,
    ldc: usize,
) -> bool {
    if m > MAX_NARROW {
        return false;
    }
    if isa == Isa::Avx2 {
        // SAFETY: AVX2 and FMA run here; the caller's contract.
        unsafe { T::atb_avx2(m, n, k, a, lda, b, ldb, beta, c, ldc) };
        return true;
    }
    // Rows of C in even groups of at most 12, each group one more read of B: the kernel
    // keeps two registers of columns of each row of C (24 accumulators).
    let per = m.div_ceil(m.div_ceil(12).max(1)).max(1);
    let mut r0 = 0;
    while r0 < m {
        let g = (m - r0).min(per);
        // SAFETY: AVX-512F runs here; rows r0..r0 + g of C are columns of A.
        unsafe { T::atb_group(g, n, k, a.add(r0), lda, b, ldb, beta, c.add(r0 * ldc), ldc) };
        r0 += g;
    }
    true
}

/// The kernels of one element type: `$m` is the module, `$t` the type, `$lanes` its values
/// per register, then its AVX-512 intrinsics (register type, mask type, set1, fmadd,
/// mul, loadu, maskz_loadu, mask_storeu, setzero).
macro_rules! kernels {
    ($m:ident, $t:ty, $lanes:literal, $v:ty, $mask:ty, $set1:ident, $fmadd:ident, $mul:ident,
     $loadu:ident, $maskz_loadu:ident, $mask_storeu:ident, $zero:ident) => {
        #[cfg(target_arch = "x86_64")]
        mod $m {
            use std::arch::x86_64::*;

            /// Rows of `B` per block of [`atb_rows`]: a block's rows, a register of columns
            /// at a time, touch few enough pages and cache lines (B's rows are a panel row
            /// apart, often more than a page) that the next columns find them cached.
            const ROW_BLOCK: usize = 64;

            /// Values ahead of the current columns that [`atb_rows`] prefetches.
            const PREFETCH: usize = 256 / std::mem::size_of::<$t>();

            /// Lanes of `w` (0..=LANES) columns.
            fn mask(w: usize) -> $mask {
                if w >= $lanes {
                    <$mask>::MAX
                } else {
                    ((1u32 << w) - 1) as $mask
                }
            }

            /// Writes `acc` (masked by `m`) to `c`, as `acc + beta·c`.
            #[target_feature(enable = "avx512f")]
            unsafe fn put(c: *mut $t, m: $mask, acc: $v, beta: $t) {
                // SAFETY: the caller's masked lanes lie in C.
                unsafe {
                    let v = if beta == 0.0 {
                        acc
                    } else {
                        $fmadd($set1(beta), $maskz_loadu(m, c), acc)
                    };
                    $mask_storeu(c, m, v);
                }
            }

            /// [`super::ab`] for `w ≤ 2·LANES` columns.
            ///
            /// # Safety
            /// AVX-512F; as [`super::ab`] with `n = w`.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn ab_columns(
                m: usize,
                w: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                let (m0, m1) = (mask(w), mask(w.saturating_sub($lanes)));
                let mut r = 0;
                // SAFETY (all calls): rows r.. of A and C exist (r + R ≤ m).
                unsafe {
                    let at = |r: usize| (a.add(r * lda), c.add(r * ldc));
                    while r + 12 <= m {
                        let (a, c) = at(r);
                        ab_rows::<12>(k, a, lda, b, ldb, m0, m1, beta, c, ldc);
                        r += 12;
                    }
                    if r + 8 <= m {
                        let (a, c) = at(r);
                        ab_rows::<8>(k, a, lda, b, ldb, m0, m1, beta, c, ldc);
                        r += 8;
                    }
                    if r + 4 <= m {
                        let (a, c) = at(r);
                        ab_rows::<4>(k, a, lda, b, ldb, m0, m1, beta, c, ldc);
                        r += 4;
                    }
                    while r < m {
                        let (a, c) = at(r);
                        ab_rows::<1>(k, a, lda, b, ldb, m0, m1, beta, c, ldc);
                        r += 1;
                    }
                }
            }

            /// `R` rows of `C = A·B` over the columns masked by `m0` (the first register)
            /// and `m1` (the second).
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = "avx512f")]
            unsafe fn ab_rows<const R: usize>(
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                m0: $mask,
                m1: $mask,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                let mut lo = [$zero(); R];
                let mut hi = [$zero(); R];
                // SAFETY: j < k and r < R address A and B inside their shapes; masked-off
                // lanes are not read.
                unsafe {
                    if m1 == 0 {
                        for j in 0..k {
                            let b0 = $maskz_loadu(m0, b.add(j * ldb));
                            for (r, acc) in lo.iter_mut().enumerate() {
                                *acc = $fmadd($set1(*a.add(r * lda + j)), b0, *acc);
                            }
                        }
                    } else {
                        for j in 0..k {
                            let row = b.add(j * ldb);
                            let b0 = $loadu(row);
                            let b1 = $maskz_loadu(m1, row.add($lanes));
                            for r in 0..R {
                                let x = $set1(*a.add(r * lda + j));
                                lo[r] = $fmadd(x, b0, lo[r]);
                                hi[r] = $fmadd(x, b1, hi[r]);
                            }
                        }
                    }
                    for r in 0..R {
                        let out = c.add(r * ldc);
                        put(out, m0, lo[r], beta);
                        if m1 != 0 {
                            put(out.add($lanes), m1, hi[r], beta);
                        }
                    }
                }
            }

            /// [`super::atb`] for `g ≤ 12` rows of `C`.
            ///
            /// # Safety
            /// AVX-512F; as [`super::atb`] with `m = g`.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx512f")]
            pub(super) unsafe fn atb_group(
                g: usize,
                n: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                // SAFETY: the caller's contract.
                unsafe {
                    by_const!(
                        g,
                        atb_rows,
                        (n, k, a, lda, b, ldb, beta, c, ldc),
                        1 2 3 4 5 6 7 8 9 10 11 12
                    )
                }
            }

            /// `G` rows of `C = Aᵀ·B` (columns of `A` from `a`), all `n` columns: for each
            /// block of [`ROW_BLOCK`] rows of `B`, a register of columns at a time, with
            /// the sums carried in `C` between blocks (stored and reloaded exactly, so the
            /// order of the sums is that of the rows).
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx512f")]
            unsafe fn atb_rows<const G: usize>(
                n: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                let mut i0 = 0;
                loop {
                    let i1 = (i0 + ROW_BLOCK).min(k);
                    let mut j0 = 0;
                    // SAFETY (both calls): i0..i1 < k rows, G rows of C, and the columns
                    // given (two whole registers, or the masked lanes j0.. < n) lie in A,
                    // B and C.
                    while j0 + 2 * $lanes <= n {
                        let full = <$mask>::MAX;
                        unsafe { atb_block::<G, 2>(i0..i1, j0, [full; 2], a, lda, b, ldb, beta, c, ldc) };
                        j0 += 2 * $lanes;
                    }
                    while j0 < n {
                        let lanes = [mask(n - j0)];
                        unsafe { atb_block::<G, 1>(i0..i1, j0, lanes, a, lda, b, ldb, beta, c, ldc) };
                        j0 += $lanes;
                    }
                    if i1 >= k {
                        break;
                    }
                    i0 = i1;
                }
            }
            /// Rows `rows` of [`atb_rows`] for `W` registers of columns from `j0` (lanes
            /// `masks`), the sums starting from `C` (or `beta·C` in the first block). With
            /// two registers, each value of `A` is loaded once for two multiply-adds, where
            /// one register loads it for each: on Ice Lake, multiply-adds with a memory
            /// operand ran at about half the rate of register ones. Each sum still runs
            /// over the rows in order. Not inlined: inlined into [`atb_rows`], some of the
            /// 24 accumulators were spilled to the stack.
            #[allow(clippy::too_many_arguments)]
            #[inline(never)]
            #[target_feature(enable = "avx512f")]
            unsafe fn atb_block<const G: usize, const W: usize>(
                rows: std::ops::Range<usize>,
                j0: usize,
                masks: [$mask; W],
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                // SAFETY: the caller's contract: rows `rows` of A and B, the masked lanes
                // of W registers from column j0 of B and C, rows 0..G of C.
                unsafe {
                    let mut acc = [[$zero(); W]; G];
                    for (g, s) in acc.iter_mut().enumerate() {
                        for (w, s) in s.iter_mut().enumerate() {
                            let at = c.add(g * ldc + j0 + w * $lanes);
                            if rows.start > 0 {
                                *s = $maskz_loadu(masks[w], at);
                            } else if beta != 0.0 {
                                *s = $mul($set1(beta), $maskz_loadu(masks[w], at));
                            }
                        }
                    }
                    for i in rows {
                        // The rows are a panel row apart: fetch them ahead, as no hardware
                        // prefetcher follows that many streams.
                        let row = b.add(i * ldb + j0);
                        let mut x = [$zero(); W];
                        for (w, x) in x.iter_mut().enumerate() {
                            let ahead = row.wrapping_add(PREFETCH + w * $lanes);
                            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                            *x = $maskz_loadu(masks[w], row.add(w * $lanes));
                        }
                        let ai = a.add(i * lda);
                        for (g, s) in acc.iter_mut().enumerate() {
                            let v = $set1(*ai.add(g));
                            for (s, x) in s.iter_mut().zip(x) {
                                *s = $fmadd(v, x, *s);
                            }
                        }
                    }
                    for (g, s) in acc.iter().enumerate() {
                        for (w, s) in s.iter().enumerate() {
                            $mask_storeu(c.add(g * ldc + j0 + w * $lanes), masks[w], *s);
                        }
                    }
                }
            }
        }

        impl Elem for $t {
            const LANES: usize = $lanes;
            unsafe fn ab_columns(
                isa: Isa,
                m: usize,
                w: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller's contract (`isa` runs here).
                unsafe {
                    match isa {
                        Isa::Avx512 => $m::ab_columns(m, w, k, a, lda, b, ldb, beta, c, ldc),
                        Isa::Avx2 => avx2::$m::ab_columns(m, w, k, a, lda, b, ldb, beta, c, ldc),
                    }
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (isa, m, w, k, a, lda, b, ldb, beta, c, ldc);
            }
            unsafe fn atb_group(
                g: usize,
                n: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller's contract (AVX-512F runs here).
                unsafe {
                    $m::atb_group(g, n, k, a, lda, b, ldb, beta, c, ldc)
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (g, n, k, a, lda, b, ldb, beta, c, ldc);
            }
            unsafe fn atb_avx2(
                m: usize,
                n: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the caller's contract (AVX2 and FMA run here).
                unsafe {
                    avx2::$m::atb(m, n, k, a, lda, b, ldb, beta, c, ldc)
                }
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (m, n, k, a, lda, b, ldb, beta, c, ldc);
            }
        }
    };
}

kernels!(
    single,
    f32,
    16,
    __m512,
    __mmask16,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_mul_ps,
    _mm512_loadu_ps,
    _mm512_maskz_loadu_ps,
    _mm512_mask_storeu_ps,
    _mm512_setzero_ps
);
kernels!(
    double,
    f64,
    8,
    __m512d,
    __mmask8,
    _mm512_set1_pd,
    _mm512_fmadd_pd,
    _mm512_mul_pd,
    _mm512_loadu_pd,
    _mm512_maskz_loadu_pd,
    _mm512_mask_storeu_pd,
    _mm512_setzero_pd
);

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::Rng;

    /// The element types under test, with what the checks need.
    trait Val: Elem + PartialEq + std::fmt::Debug {
        const NAN: Self;
        /// Relative tolerance against the float64 product.
        const TOL: f64;
        fn of(x: f32) -> Self;
        fn f64(self) -> f64;
        fn bits(self) -> u64;
        /// `self·y + z`, rounded once.
        fn fma(self, y: Self, z: Self) -> Self;
        fn mul(self, y: Self) -> Self;
    }

    impl Val for f32 {
        const NAN: f32 = f32::NAN;
        const TOL: f64 = 1e-4;
        fn of(x: f32) -> f32 {
            x
        }
        fn f64(self) -> f64 {
            self as f64
        }
        fn bits(self) -> u64 {
            self.to_bits() as u64
        }
        fn fma(self, y: f32, z: f32) -> f32 {
            self.mul_add(y, z)
        }
        fn mul(self, y: f32) -> f32 {
            self * y
        }
    }

    impl Val for f64 {
        const NAN: f64 = f64::NAN;
        const TOL: f64 = 1e-12;
        fn of(x: f32) -> f64 {
            x as f64
        }
        fn f64(self) -> f64 {
            self
        }
        fn bits(self) -> u64 {
            self.to_bits()
        }
        fn fma(self, y: f64, z: f64) -> f64 {
            self.mul_add(y, z)
        }
        fn mul(self, y: f64) -> f64 {
            self * y
        }
    }

    /// A `rows × cols` row-major matrix with leading dimension `ld ≥ cols` (padding NaN, so
    /// a kernel reading outside the shape shows).
    fn matrix<T: Val>(rng: &mut Rng, rows: usize, cols: usize, ld: usize) -> Vec<T> {
        let mut v = vec![T::NAN; rows.max(1) * ld];
        for i in 0..rows {
            for j in 0..cols {
                v[i * ld + j] = T::of(rng.value());
            }
        }
        v
    }

    fn check<T: Val>(got: &[T], want: &[f64], old: &[T], rows: usize, cols: usize, ldc: usize) {
        for i in 0..rows {
            for j in 0..cols {
                let (g, w) = (got[i * ldc + j].f64(), want[i * cols + j]);
                assert!(
                    (g - w).abs() <= T::TOL * (1.0 + w.abs()),
                    "C[{i},{j}] {g} vs {w}"
                );
            }
            // Padding past the shape is untouched.
            for j in cols..ldc {
                assert_eq!(got[i * ldc + j].bits(), old[i * ldc + j].bits());
            }
        }
    }

    /// The kernels' own order, one value at a time: `ab` sums from zero and adds `beta·c`
    /// last; `atb` starts from `beta·c` (rounded) and sums in order.
    fn fma_chain<T: Val>(start: T, terms: impl Iterator<Item = (T, T)>) -> T {
        terms.fold(start, |s, (x, y)| x.fma(y, s))
    }

    #[test]
    fn every_instruction_set_in_both_precisions_gives_the_bits_of_one_ordered_fma_chain() {
        let isas = Isa::supported();
        if isas.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2+FMA");
            return;
        }
        let mut rng = Rng::fresh();
        for isa in isas {
            cases::<f32>(isa, &mut rng);
            cases::<f64>(isa, &mut rng);
        }
    }

    fn cases<T: Val>(isa: Isa, rng: &mut Rng) {
        for case in 0..60 {
            let m = 1 + rng.below(80);
            let narrow = 1 + rng.below(MAX_NARROW);
            let k = rng.below(300);
            let beta = T::of([0.0f32, 1.0, -0.5][case % 3]);
            let pad = |r: &mut Rng| r.below(5);
            // ab: A m×k, B k×narrow, C m×narrow.
            let (lda, ldb, ldc) = (k + pad(rng), narrow + pad(rng), narrow + pad(rng));
            let a: Vec<T> = matrix(rng, m, k, lda.max(1));
            let b: Vec<T> = matrix(rng, k, narrow, ldb);
            let c0: Vec<T> = matrix(rng, m, narrow, ldc);
            let mut want = vec![0.0f64; m * narrow];
            let mut exact = vec![T::of(0.0); m * narrow];
            for i in 0..m {
                for j in 0..narrow {
                    let mut s = beta.f64() * c0[i * ldc + j].f64();
                    for t in 0..k {
                        s += a[i * lda + t].f64() * b[t * ldb + j].f64();
                    }
                    want[i * narrow + j] = s;
                    let terms = (0..k).map(|t| (a[i * lda + t], b[t * ldb + j]));
                    let sum = fma_chain(T::of(0.0), terms);
                    exact[i * narrow + j] = if beta.f64() == 0.0 {
                        sum
                    } else {
                        beta.fma(c0[i * ldc + j], sum)
                    };
                }
            }
            let mut c = c0.clone();
            // SAFETY: the shapes and leading dimensions describe the vectors above; `isa`
            // runs here.
            let ran = unsafe {
                ab(
                    isa,
                    m,
                    narrow,
                    k,
                    a.as_ptr(),
                    lda.max(1),
                    b.as_ptr(),
                    ldb,
                    beta,
                    c.as_mut_ptr(),
                    ldc,
                )
            };
            assert!(ran);
            check(&c, &want, &c0, m, narrow, ldc);
            same_bits(isa, "ab", &c, &exact, m, narrow, ldc);
            // atb: A k×narrow, B k×n, C narrow×n. Every fourth case, B's rows are a
            // multiple of 1 KiB apart (the AVX2 kernel copies its blocks) and may span
            // several blocks of columns.
            let aliased = case % 4 == 3;
            let n = if aliased { 1 + rng.below(700) } else { m };
            let ldb = n + pad(rng);
            let ldb = if aliased {
                ldb.div_ceil(256) * 256
            } else {
                ldb
            };
            let (lda, ldc) = (narrow + pad(rng), n + pad(rng));
            let a: Vec<T> = matrix(rng, k, narrow, lda);
            let b: Vec<T> = matrix(rng, k, n, ldb);
            let c0: Vec<T> = matrix(rng, narrow, n, ldc);
            let mut want = vec![0.0f64; narrow * n];
            let mut exact = vec![T::of(0.0); narrow * n];
            for i in 0..narrow {
                for j in 0..n {
                    let mut s = beta.f64() * c0[i * ldc + j].f64();
                    for t in 0..k {
                        s += a[t * lda + i].f64() * b[t * ldb + j].f64();
                    }
                    want[i * n + j] = s;
                    let start = if beta.f64() == 0.0 {
                        T::of(0.0)
                    } else {
                        beta.mul(c0[i * ldc + j])
                    };
                    let terms = (0..k).map(|t| (a[t * lda + i], b[t * ldb + j]));
                    exact[i * n + j] = fma_chain(start, terms);
                }
            }
            let mut c = c0.clone();
            // SAFETY: as above.
            let ran = unsafe {
                atb(
                    isa,
                    narrow,
                    n,
                    k,
                    a.as_ptr(),
                    lda,
                    b.as_ptr(),
                    ldb,
                    beta,
                    c.as_mut_ptr(),
                    ldc,
                )
            };
            assert!(ran);
            check(&c, &want, &c0, narrow, n, ldc);
            same_bits(isa, "atb", &c, &exact, narrow, n, ldc);
        }
    }

    /// Every value of `got` is bit for bit that of `exact` (so every instruction set gives
    /// the same result).
    fn same_bits<T: Val>(
        isa: Isa,
        what: &str,
        got: &[T],
        exact: &[T],
        rows: usize,
        cols: usize,
        ldc: usize,
    ) {
        for i in 0..rows {
            for j in 0..cols {
                assert_eq!(
                    got[i * ldc + j].bits(),
                    exact[i * cols + j].bits(),
                    "{isa:?} {what} C[{i},{j}] of {rows}×{cols}: {:?} against the ordered chain's {:?}",
                    got[i * ldc + j],
                    exact[i * cols + j]
                );
            }
        }
    }

    #[test]
    fn wider_operands_are_left_to_blas() {
        let mut c = [0.0f32; 1];
        for isa in Isa::supported() {
            // SAFETY: nothing is read or written when the kernel declines; `isa` runs here.
            unsafe {
                assert!(!ab(
                    isa,
                    1,
                    MAX_NARROW + 1,
                    0,
                    c.as_ptr(),
                    1,
                    c.as_ptr(),
                    1,
                    0.0,
                    c.as_mut_ptr(),
                    1
                ));
                assert!(!atb(
                    isa,
                    MAX_NARROW + 1,
                    1,
                    0,
                    c.as_ptr(),
                    1,
                    c.as_ptr(),
                    1,
                    0.0,
                    c.as_mut_ptr(),
                    1
                ));
            }
        }
    }
}
