//! The AVX2 forms of the skinny kernels, for CPUs without AVX-512F (AMD Zen 1–3, Intel
//! client parts, most of today's cloud and HPC nodes).
//!
//! They compute the same f64 products in the same order as the AVX-512 kernels of the parent
//! module: every value of `C` is one chain of fused multiply-adds over the inner dimension
//! in order, started and finished as there. So the two give the same bits, and a run on
//! an AVX2 node and one on an AVX-512 node agree. With 16 registers of 4 doubles
//! instead of 32 of 8, one call covers fewer values of `C`:
//!
//! - `ab_columns`: up to five registers of columns (20 doubles: the sketch width of
//!   k = 10 with oversampling) by as many rows of `C` as 16 registers hold
//!   (two rows by five registers: 10 accumulators, five of a row of `B`, one broadcast),
//!   so that a tile of `A` is read once for all its columns;
//! - `atb`: up to six rows of `C` by two registers of columns (12 accumulators), over
//!   blocks of `B` that stay in L2.
//!
//! Measured on one core of a 2-core AMD EPYC KVM guest (Zen 3, family 25, AVX2), criterion
//! `rsvd_tiles`, a 256 × 512 tile and a 25-column sketch, 2026-11-29, against OpenBLAS
//! 0.3.21 (Haswell kernels): `T·Ω` 213 against 248 µs in f64 (31 against 26 GFLOP/s) and
//! 107 against 124 µs in f32; `Qᵀ·T` 283 against 225 µs in f64 but, in whole runs, `rsvd`
//! of 50,000 × 20,000 ran 1–2 % faster in f64 and `svd` of 10,000,000 × 20 formed U
//! (`Q̃·c`, this kernel) in 270 against 340 ms. There are no f32 forms: measured, they
//! were slower end to end (see the parent's `Elem::AVX2`). Copying each block of `B` once
//! into contiguous strips before `atb` (as BLAS packs; the rows of a tile lie a page
//! apart and share L1 sets) took a tile's `Qᵀ·T` from 283 to 205 µs, but slowed `svd`'s
//! U formation (283 → 335 ms: every `Q̃` block copied once more) and left `rsvd`
//! unchanged end to end (2.86–3.04 against 2.90–3.04 s), so `B` is read where it lies.

/// Registers of columns of `B` per call of `ab_columns`.
pub(super) const AB_REGS: usize = 5;

/// The kernels of one element type: `$m` is the module, `$t` the type, `$lanes` its values
/// per register, `$int` the integer of a lane's mask, then its AVX intrinsics (register
/// type, set1, fmadd, mul, loadu, storeu, maskload, maskstore, setzero).
macro_rules! kernels {
    ($m:ident, $t:ty, $lanes:literal, $group:literal, $regs:literal, $int:ty, $v:ty, $set1:ident, $fmadd:ident, $mul:ident,
     $loadu:ident, $storeu:ident, $maskload:ident, $maskstore:ident, $zero:ident) => {
        pub(super) mod $m {
            use std::arch::x86_64::*;

            /// Most rows of `C` per group of [`atb`], and its registers of columns.
            const ATB_GROUP: usize = $group;
            const ATB_REGS: usize = $regs;

            /// Rows of `B` per block of [`atb`].
            const ROW_BLOCK: usize = 64;

            /// Columns of `B` per block of [`atb`] (a multiple of two registers).
            const COL_BLOCK: usize = 2048 / std::mem::size_of::<$t>();

            /// Values ahead of the current columns that [`atb_block`] prefetches.
            const PREFETCH: usize = 256 / std::mem::size_of::<$t>();

            /// `LANES` set lanes, then `LANES` clear ones: the `n` lanes ending at the middle
            /// are the mask of the first `n`.
            const MASKS: [$int; 2 * $lanes] = {
                let mut t = [0; 2 * $lanes];
                let mut i = 0;
                while i < $lanes {
                    t[i] = -1;
                    i += 1;
                }
                t
            };

            /// The first `n` lanes of a register (`0 < n ≤ LANES`).
            #[derive(Clone, Copy)]
            struct Lanes {
                n: usize,
                mask: __m256i,
            }

            #[inline]
            #[target_feature(enable = "avx2")]
            fn lanes(n: usize) -> Lanes {
                debug_assert!(n > 0 && n <= $lanes);
                // SAFETY: `$lanes - n ≤ $lanes`, so the register's values lie in MASKS.
                let mask = unsafe { _mm256_loadu_si256(MASKS.as_ptr().add($lanes - n).cast()) };
                Lanes { n, mask }
            }

            /// The lanes of `l` from `p` (the others zero).
            ///
            /// # Safety
            /// `p..p + l.n` must be readable.
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn load(p: *const $t, l: Lanes) -> $v {
                // SAFETY: the caller's contract; masked-off lanes are not read.
                unsafe {
                    if l.n == $lanes {
                        $loadu(p)
                    } else {
                        $maskload(p, l.mask)
                    }
                }
            }

            /// Writes the lanes of `l` of `v` to `p`.
            ///
            /// # Safety
            /// `p..p + l.n` must be writable.
            #[inline]
            #[target_feature(enable = "avx2")]
            unsafe fn store(p: *mut $t, l: Lanes, v: $v) {
                // SAFETY: the caller's contract; masked-off lanes are not written.
                unsafe {
                    if l.n == $lanes {
                        $storeu(p, v)
                    } else {
                        $maskstore(p, l.mask, v)
                    }
                }
            }

            /// Writes `acc + beta·c` (lanes `l`) to `c`: the AVX-512 kernel's `put`.
            #[inline]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn put(c: *mut $t, l: Lanes, acc: $v, beta: $t) {
                // SAFETY: the caller's lanes lie in C.
                unsafe {
                    let v = if beta == 0.0 {
                        acc
                    } else {
                        $fmadd($set1(beta), load(c, l), acc)
                    };
                    store(c, l, v);
                }
            }

            /// `C = A·B + beta·C` for `w ≤ AB_REGS·LANES` columns (as `super::super::ab`).
            ///
            /// # Safety
            /// AVX2 and FMA; as the parent's `ab` with `n = w`.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma")]
            pub(in crate::skinny) unsafe fn ab_columns(
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
                let regs = w.div_ceil($lanes);
                let mut l = [lanes($lanes); super::AB_REGS];
                for (r, l) in l.iter_mut().enumerate().take(regs) {
                    *l = lanes((w - r * $lanes).min($lanes));
                }
                // Rows of C per step for `regs` registers of columns: as many as 16
                // registers hold (R·W accumulators, W of B's row, one broadcast).
                macro_rules! sweep {
                    ($w:literal, $r:literal) => {{
                        let lw: [Lanes; $w] = std::array::from_fn(|i| l[i]);
                        let mut r = 0;
                        // SAFETY (both calls): rows r.. of A and C exist (r + R ≤ m), and
                        // the registers' lanes cover columns 0..w of B and C.
                        unsafe {
                            while r + $r <= m {
                                let (ar, cr) = (a.add(r * lda), c.add(r * ldc));
                                ab_rows::<$r, $w>(k, ar, lda, b, ldb, lw, beta, cr, ldc);
                                r += $r;
                            }
                            while r < m {
                                let (ar, cr) = (a.add(r * lda), c.add(r * ldc));
                                ab_rows::<1, $w>(k, ar, lda, b, ldb, lw, beta, cr, ldc);
                                r += 1;
                            }
                        }
                    }};
                }
                match regs {
                    1 => sweep!(1, 6),
                    2 => sweep!(2, 6),
                    3 => sweep!(3, 4),
                    4 => sweep!(4, 2),
                    _ => sweep!(5, 2),
                }
            }

            /// `R` rows of `C = A·B` over `W` registers of columns (lanes `l`).
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn ab_rows<const R: usize, const W: usize>(
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                l: [Lanes; W],
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                let mut acc = [[$zero(); W]; R];
                // SAFETY: j < k and r < R address A and B inside their shapes; the lanes
                // of `l` lie in B's and C's rows.
                unsafe {
                    for j in 0..k {
                        let row = b.add(j * ldb);
                        let mut x = [$zero(); W];
                        for (w, x) in x.iter_mut().enumerate() {
                            *x = load(row.add(w * $lanes), l[w]);
                        }
                        for (r, acc) in acc.iter_mut().enumerate() {
                            let v = $set1(*a.add(r * lda + j));
                            for (s, x) in acc.iter_mut().zip(x) {
                                *s = $fmadd(v, x, *s);
                            }
                        }
                    }
                    for (r, acc) in acc.iter().enumerate() {
                        for (w, s) in acc.iter().enumerate() {
                            put(c.add(r * ldc + w * $lanes), l[w], *s, beta);
                        }
                    }
                }
            }

            /// `C = Aᵀ·B + beta·C`, all `m ≤ MAX_NARROW` rows (as the parent's `atb`).
            ///
            /// Where the AVX-512 kernel reads all of `B` once per group of rows of `C`,
            /// this one takes `B` in blocks of [`ROW_BLOCK`] rows by [`COL_BLOCK`] columns
            /// (about 128 KiB, so a block stays in L2) and runs every group over a block
            /// before the next: with groups of at most six rows, `B` would otherwise be
            /// read from memory (or L3) five times for a 25-column sketch. The sums are
            /// carried in `C` between blocks, stored and reloaded exactly, so each still
            /// runs over the rows in order: the AVX-512 kernel's bits.
            ///
            /// # Safety
            /// AVX2 and FMA; as the parent's `atb`.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma")]
            pub(in crate::skinny) unsafe fn atb(
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
                let per = m.div_ceil(m.div_ceil(ATB_GROUP).max(1)).max(1);
                let mut j0 = 0;
                while j0 < n {
                    let j1 = (j0 + COL_BLOCK).min(n);
                    let mut i0 = 0;
                    loop {
                        let i1 = (i0 + ROW_BLOCK).min(k);
                        let mut r0 = 0;
                        while r0 < m {
                            let g = (m - r0).min(per);
                            let (ar, cr) = (a.wrapping_add(r0), c.wrapping_add(r0 * ldc));
                            // SAFETY: rows i0..i1 < k of A and B, rows r0..r0 + g ≤ m of C,
                            // columns j0..j1 ≤ n.
                            unsafe {
                                by_const!(
                                    g,
                                    atb_rows,
                                    (i0..i1, j0..j1, ar, lda, b, ldb, beta, cr, ldc),
                                    1 2 3 4 5 6
                                )
                            }
                            r0 += g;
                        }
                        if i1 >= k {
                            break;
                        }
                        i0 = i1;
                    }
                    j0 = j1;
                }
            }

            /// `G` rows of `C = Aᵀ·B` over rows `rows` of `B` and columns `cols`, two
            /// registers of columns at a time (then one, masked).
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn atb_rows<const G: usize>(
                rows: std::ops::Range<usize>,
                cols: std::ops::Range<usize>,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                let full = lanes($lanes);
                let mut j0 = cols.start;
                // SAFETY (both calls): the caller's rows, G rows of C, and the lanes from
                // column j0 (< cols.end) lie in A, B and C.
                while j0 + ATB_REGS * $lanes <= cols.end {
                    unsafe { atb_block::<G, ATB_REGS>(rows.clone(), j0, [full; ATB_REGS], a, lda, b, ldb, beta, c, ldc) };
                    j0 += ATB_REGS * $lanes;
                }
                while j0 < cols.end {
                    let l = [lanes((cols.end - j0).min($lanes))];
                    unsafe { atb_block::<G, 1>(rows.clone(), j0, l, a, lda, b, ldb, beta, c, ldc) };
                    j0 += $lanes;
                }
            }

            /// Rows `rows` of [`atb_rows`] for `W` registers of columns from `j0` (lanes
            /// `l`), the sums starting from `C` (or `beta·C` in the first block). Not
            /// inlined, as the AVX-512 kernel's, so the accumulators stay in registers.
            #[allow(clippy::too_many_arguments)]
            #[inline(never)]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn atb_block<const G: usize, const W: usize>(
                rows: std::ops::Range<usize>,
                j0: usize,
                l: [Lanes; W],
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                // SAFETY: the caller's contract: rows `rows` of A and B, the lanes of W
                // registers from column j0 of B and C, rows 0..G of C.
                unsafe {
                    let mut acc = [[$zero(); W]; G];
                    for (g, s) in acc.iter_mut().enumerate() {
                        for (w, s) in s.iter_mut().enumerate() {
                            let at = c.add(g * ldc + j0 + w * $lanes);
                            if rows.start > 0 {
                                *s = load(at, l[w]);
                            } else if beta != 0.0 {
                                *s = $mul($set1(beta), load(at, l[w]));
                            }
                        }
                    }
                    for i in rows {
                        let row = b.add(i * ldb + j0);
                        let mut x = [$zero(); W];
                        for (w, x) in x.iter_mut().enumerate() {
                            let ahead = row.wrapping_add(PREFETCH + w * $lanes);
                            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                            *x = load(row.add(w * $lanes), l[w]);
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
                            store(c.add(g * ldc + j0 + w * $lanes), l[w], *s);
                        }
                    }
                }
            }
        }
    };
}

kernels!(
    double,
    f64,
    4,
    6,
    2,
    i64,
    __m256d,
    _mm256_set1_pd,
    _mm256_fmadd_pd,
    _mm256_mul_pd,
    _mm256_loadu_pd,
    _mm256_storeu_pd,
    _mm256_maskload_pd,
    _mm256_maskstore_pd,
    _mm256_setzero_pd
);
