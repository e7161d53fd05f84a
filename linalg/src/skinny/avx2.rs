//! The AVX2 forms of the skinny kernels, for CPUs without AVX-512F (AMD Zen 1–3, Intel
//! client parts, most of today's cloud and HPC nodes), in f64 and f32.
//!
//! They compute the same products in the same order as the AVX-512 kernels of the parent
//! module: every value of `C` is one chain of fused multiply-adds over the inner dimension
//! in order, started and finished as there. So the two give the same bits, and a run on
//! an AVX2 node and one on an AVX-512 node agree. With 16 registers of 256 bits instead of
//! 32 of 512, one call covers fewer values of `C`:
//!
//! - `ab_columns`: the columns in groups of at most three registers, each over as many rows
//!   of `C` as 16 registers hold without spilling (three rows of three registers, five of
//!   two, eight of one), the inner dimension in blocks whose rows of `B` stay in L1;
//! - `atb`: up to six rows of `C` by two registers of columns (12 accumulators), over
//!   blocks of `B` whose lines stay in L1 for every group of rows of `C`.
//!
//! Measured on one core of a 2-core AMD EPYC KVM guest (Zen 3, family 25, AVX2; one core
//! does 44–47 GFLOP/s in DGEMM), criterion `skinny_widths` (a 256 × 512 tile, rows 520
//! values apart), 2026-11-29, GFLOP/s before → after this form of the kernels (before:
//! five registers of columns by two rows, the inner dimension whole, each group of `atb`
//! over a whole block of `B`; f32 went to OpenBLAS 0.3.21):
//!
//! | width | `T·Ω` f64 | `Qᵀ·T` f64 | `T·Ω` f32 | `Qᵀ·T` f32 |
//! |---|---|---|---|---|
//! | 10 | 17.6 → 34.3 | 26.9 → 31.0 | 29.6 → 55.7 | 30.9 → 72.1 |
//! | 20 | 28.6 → 39.7 | 22.3 → 31.6 | 53.3 → 70.6 | 47.8 → 77.1 |
//! | 24 | 28.6 → 41.1 | 27.9 → 35.4 | 47.7 → 91.6 | 51.0 → 83.1 |
//! | 44 | 21.5 → 36.7 | 27.8 → 29.8 | 62.7 → 74.4 | 61.9 → 78.1 |
//!
//! With rows 512 values apart (4 KiB in f64, 2 KiB in f32, as a stored panel of 512
//! columns) f64 gains as much, and f32 is within the run-to-run spread of OpenBLAS, which
//! copies every operand into its own layout first (width 44, `Qᵀ·T`: 51.7 against 64.0).
//! Where the gain came from: the five-register groups left one register for a broadcast,
//! so a row of `B` (up to 176 KiB of a tile's `Ω`) was read from L2 for every two rows of
//! `A`, at about the bytes per cycle L2 delivers; and the masked last register was
//! chosen at run time inside the inner loop (five tests and branches per row of `B`).

/// Bytes of `B`'s rows per block of the inner dimension of `ab_columns` (half of a 32 KiB L1).
const AB_BLOCK_BYTES: usize = 16 * 1024;

/// The column groups of `ab_columns` for `regs` registers of columns: threes (four rows of
/// `C` at a time, 12 accumulators, 12 multiply-adds for 7 loads), then twos (six rows),
/// and a one only when `regs` is.
fn groups(regs: usize) -> impl Iterator<Item = usize> {
    let (threes, twos) = match regs % 3 {
        0 => (regs / 3, 0),
        1 if regs >= 4 => (regs / 3 - 1, 2),
        1 => (0, 0),
        _ => (regs / 3, 1),
    };
    let one = (regs == 1) as usize;
    std::iter::repeat_n(3, threes)
        .chain(std::iter::repeat_n(2, twos))
        .chain(std::iter::repeat_n(1, one))
}

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
            /// One register of columns (a masked tail of [`atb`]).
            const ONE: usize = 1;

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

            /// `C = A·B + beta·C` for all `w ≤ MAX_NARROW` columns (as `super::super::ab`).
            ///
            /// The columns go in groups of at most three registers ([`groups`]), each
            /// group over as many rows of `C` at once as 16 registers hold ([`ab_rows`]).
            /// With `beta = 0` the inner dimension goes in blocks whose rows of `B` fit
            /// in L1 ([`AB_BLOCK_BYTES`]), each group's sums carried in `C` between blocks
            /// (stored and reloaded exactly, so each still runs over the inner dimension in
            /// order): a tile's `Ω` (512 rows) is 48 KiB at 12 columns and 176 KiB at 44,
            /// and read from L2 for every few rows of `A` it took as many bytes per cycle
            /// as L2 delivers.
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
                if w == 0 {
                    return;
                }
                let regs = w.div_ceil($lanes);
                let tail = lanes(w - (regs - 1) * $lanes);
                let kc = if beta == 0.0 {
                    (super::AB_BLOCK_BYTES / (ldb.max(w) * std::mem::size_of::<$t>())).max(16)
                } else {
                    k.max(1)
                };
                let mut j0 = 0;
                loop {
                    let j1 = (j0 + kc).min(k);
                    let (first, last) = (j0 == 0, j1 >= k);
                    let mut g0 = 0;
                    for gw in super::groups(regs) {
                        let masked = g0 + gw == regs && tail.n < $lanes;
                        let at = Block { js: j0..j1, first, last, beta };
                        // SAFETY: rows of A and C below m, columns g0·LANES.. of B and C
                        // inside w (the last register masked to `tail`), inner rows j0..j1.
                        unsafe {
                            let (bg, cg) = (b.add(g0 * $lanes), c.add(g0 * $lanes));
                            match (gw, masked) {
                                (1, false) => sweep::<8, 1, false>(m, &at, a, lda, bg, ldb, tail, cg, ldc),
                                (1, true) => sweep::<8, 1, true>(m, &at, a, lda, bg, ldb, tail, cg, ldc),
                                (2, false) => sweep::<5, 2, false>(m, &at, a, lda, bg, ldb, tail, cg, ldc),
                                (2, true) => sweep::<5, 2, true>(m, &at, a, lda, bg, ldb, tail, cg, ldc),
                                (3, false) => sweep::<3, 3, false>(m, &at, a, lda, bg, ldb, tail, cg, ldc),
                                (3, true) => sweep::<3, 3, true>(m, &at, a, lda, bg, ldb, tail, cg, ldc),
                                _ => unreachable!("groups of at most three registers"),
                            }
                        }
                        g0 += gw;
                    }
                    if last {
                        break;
                    }
                    j0 = j1;
                }
            }

            /// One block of the inner dimension of [`ab_columns`]: its rows of `B`, whether
            /// the sums start there (from zero) and end there (then `beta·C` is added).
            struct Block {
                js: std::ops::Range<usize>,
                first: bool,
                last: bool,
                beta: $t,
            }

            /// All `m` rows of one group of `W` registers of columns, `R` rows at a time
            /// (then two, then one).
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn sweep<const R: usize, const W: usize, const MASKED: bool>(
                m: usize,
                at: &Block,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                tail: Lanes,
                c: *mut $t,
                ldc: usize,
            ) {
                let mut r = 0;
                // SAFETY (all calls): rows r.. of A and C exist (r + rows ≤ m).
                unsafe {
                    while r + R <= m {
                        ab_rows::<R, W, MASKED>(at, a.add(r * lda), lda, b, ldb, tail, c.add(r * ldc), ldc);
                        r += R;
                    }
                    while R > 2 && r + 2 <= m {
                        ab_rows::<2, W, MASKED>(at, a.add(r * lda), lda, b, ldb, tail, c.add(r * ldc), ldc);
                        r += 2;
                    }
                    while r < m {
                        ab_rows::<1, W, MASKED>(at, a.add(r * lda), lda, b, ldb, tail, c.add(r * ldc), ldc);
                        r += 1;
                    }
                }
            }

            /// `R` rows of `C = A·B` over `W` registers of columns and the inner rows of
            /// `at`, the last register's lanes `tail` when `MASKED`.
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn ab_rows<const R: usize, const W: usize, const MASKED: bool>(
                at: &Block,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                tail: Lanes,
                c: *mut $t,
                ldc: usize,
            ) {
                let full = lanes($lanes);
                let lane = |w: usize| if MASKED && w + 1 == W { tail } else { full };
                // SAFETY: j in the block and r < R address A and B inside their shapes; the
                // lanes lie in B's and C's rows (masked-off lanes are not touched).
                unsafe {
                    let mut acc = [[$zero(); W]; R];
                    if !at.first {
                        for (r, acc) in acc.iter_mut().enumerate() {
                            for (w, s) in acc.iter_mut().enumerate() {
                                let p = c.add(r * ldc + w * $lanes);
                                *s = if MASKED && w + 1 == W { $maskload(p, tail.mask) } else { $loadu(p) };
                            }
                        }
                    }
                    for j in at.js.clone() {
                        let row = b.add(j * ldb);
                        let mut x = [$zero(); W];
                        for (w, x) in x.iter_mut().enumerate() {
                            let p = row.add(w * $lanes);
                            *x = if MASKED && w + 1 == W { $maskload(p, tail.mask) } else { $loadu(p) };
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
                            let p = c.add(r * ldc + w * $lanes);
                            if at.last {
                                put(p, lane(w), *s, at.beta);
                            } else {
                                store(p, lane(w), *s);
                            }
                        }
                    }
                }
            }

            /// `C = Aᵀ·B + beta·C`, all `m ≤ MAX_NARROW` rows (as the parent's `atb`).
            ///
            /// Where the AVX-512 kernel reads all of `B` once per group of rows of `C`,
            /// this one takes `B` in blocks of [`ROW_BLOCK`] rows by [`COL_BLOCK`] columns
            /// and, for each two registers of columns of a block, runs every group of rows
            /// of `C` in turn: the block's 64 cache lines of those columns come from L2 for
            /// the first group and stay in L1 for the others. When `B`'s rows are a
            /// multiple of 1 KiB apart, those 64 lines would fall in at most four of L1's
            /// 64 sets (eight lines each) and evict each other, so with several groups the
            /// block is first copied to rows a cache line more than [`COL_BLOCK`] apart
            /// ([`STRIPS`]). The sums are carried in `C` between blocks, stored and
            /// reloaded exactly, so each still runs over the rows in order: the AVX-512
            /// kernel's bits.
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
                let copy = m > per && (ldb * std::mem::size_of::<$t>()) % 1024 == 0;
                if !copy {
                    // SAFETY: the caller's contract.
                    return unsafe { atb_blocks(m, per, n, k, a, lda, b, ldb, beta, c, ldc, None) };
                }
                STRIPS.with_borrow_mut(|strips| {
                    strips.resize(ROW_BLOCK * STRIP, 0.0);
                    // SAFETY: the caller's contract; the strips hold a block.
                    unsafe { atb_blocks(m, per, n, k, a, lda, b, ldb, beta, c, ldc, Some(strips)) }
                })
            }

            /// Values between the rows of a copied block of [`atb`]: a cache line more than
            /// [`COL_BLOCK`].
            const STRIP: usize = COL_BLOCK + 64 / std::mem::size_of::<$t>();

            thread_local! {
                /// The copy of one block of `B` ([`atb`]), kept between calls.
                static STRIPS: std::cell::RefCell<Vec<$t>> = const { std::cell::RefCell::new(Vec::new()) };
            }

            /// [`atb`]'s blocks, each read where it lies or, with `strips`, from a copy.
            ///
            /// # Safety
            /// As [`atb`]; `strips` holds `ROW_BLOCK · STRIP` values.
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn atb_blocks(
                m: usize,
                per: usize,
                n: usize,
                k: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
                mut strips: Option<&mut Vec<$t>>,
            ) {
                let full = lanes($lanes);
                let mut j0 = 0;
                while j0 < n {
                    let j1 = (j0 + COL_BLOCK).min(n);
                    let mut i0 = 0;
                    loop {
                        let i1 = (i0 + ROW_BLOCK).min(k);
                        // Row i0 of the block's columns j0.., and the distance between rows.
                        // SAFETY: row i0 < k (or the empty end when k = 0: nothing is read)
                        // and column j0 < n lie in B; the strips hold i1 − i0 ≤ ROW_BLOCK
                        // rows of j1 − j0 ≤ COL_BLOCK values.
                        let (bb, ldbb) = unsafe {
                            match strips.as_deref_mut() {
                                Some(strips) => {
                                    for i in i0..i1 {
                                        let from = std::slice::from_raw_parts(b.add(i * ldb + j0), j1 - j0);
                                        strips[(i - i0) * STRIP..][..j1 - j0].copy_from_slice(from);
                                    }
                                    (strips.as_ptr(), STRIP)
                                }
                                None => (b.wrapping_add(i0 * ldb + j0), ldb),
                            }
                        };
                        let (ai, first, h) = (a.wrapping_add(i0 * lda), i0 == 0, i1 - i0);
                        let mut jr = j0;
                        while jr < j1 {
                            let wide = jr + ATB_REGS * $lanes <= j1;
                            let tail = [lanes((j1 - jr).min($lanes))];
                            let bj = bb.wrapping_add(jr - j0);
                            let mut r0 = 0;
                            while r0 < m {
                                let g = (m - r0).min(per);
                                let (ar, cr) = (ai.wrapping_add(r0), c.wrapping_add(r0 * ldc + jr));
                                // SAFETY: h rows of A from row i0 and of the block from bj,
                                // rows r0..r0 + g ≤ m of C, the registers' columns from jr
                                // inside j1 ≤ n.
                                unsafe {
                                    if wide {
                                        let l = [full; ATB_REGS];
                                        by_const!(g, atb_block::<ATB_REGS>, (h, first, l, ar, lda, bj, ldbb, beta, cr, ldc), 1 2 3 4 5 6)
                                    } else {
                                        by_const!(g, atb_block::<ONE>, (h, first, tail, ar, lda, bj, ldbb, beta, cr, ldc), 1 2 3 4 5 6)
                                    }
                                }
                                r0 += g;
                            }
                            jr += if wide { ATB_REGS * $lanes } else { $lanes };
                        }
                        if i1 >= k {
                            break;
                        }
                        i0 = i1;
                    }
                    j0 = j1;
                }
            }

            /// `G` rows of `C = Aᵀ·B` over `h` rows of `A` and `B`, for `W` registers of
            /// columns (lanes `l`) of `B` from `b` and of `C` from `c`, the sums starting
            /// from `C` (or `beta·C` in the `first` block). Not inlined, as the AVX-512
            /// kernel's, so the accumulators stay in registers.
            #[allow(clippy::too_many_arguments)]
            #[inline(never)]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn atb_block<const W: usize, const G: usize>(
                h: usize,
                first: bool,
                l: [Lanes; W],
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                beta: $t,
                c: *mut $t,
                ldc: usize,
            ) {
                // SAFETY: the caller's contract: h rows of A and B, the lanes of W registers
                // of B and C, rows 0..G of C.
                unsafe {
                    let mut acc = [[$zero(); W]; G];
                    for (g, s) in acc.iter_mut().enumerate() {
                        for (w, s) in s.iter_mut().enumerate() {
                            let at = c.add(g * ldc + w * $lanes);
                            if !first {
                                *s = load(at, l[w]);
                            } else if beta != 0.0 {
                                *s = $mul($set1(beta), load(at, l[w]));
                            }
                        }
                    }
                    for i in 0..h {
                        let row = b.add(i * ldb);
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
                            store(c.add(g * ldc + w * $lanes), l[w], *s);
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
kernels!(
    single,
    f32,
    8,
    6,
    2,
    i32,
    __m256,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    _mm256_mul_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_maskload_ps,
    _mm256_maskstore_ps,
    _mm256_setzero_ps
);
