//! Products of 2-bit packed genotype tiles with a narrow operand, standardizing the codes
//! in registers, and the same dot-product kernel for float32 tiles (AVX-512F; `Qᵀ·T` also
//! AVX2).
//!
//! # Why fused
//!
//! Standardizing a packed tile first writes 256 × 512 float32 values (512 KiB, more than
//! the L2 share of a busy core) that the skinny kernels then read back. Profiles of
//! `pca --precision f32` (200,000 × 20,000, q = 0, two cores) put the standardization at
//! 14 % of CPU time, the two products at 55 % and the f64 accumulation of their results at
//! 5 %. Packed, the tile is 32 KiB and stays in L1, and a group of 16 codes becomes 16
//! standardized values in three instructions: broadcast, variable shift, and a `vpermps`
//! through the row's table (its four values repeated four times, so the low four bits of
//! each shifted lane index it directly).
//!
//! - [`ab`], `y += T·Ω`: the dot-product form. A row's values, 16 at a time, meet rows
//!   of `Ωᵀ`; each output column keeps 16 partial sums, folded by one transposing
//!   reduction per tile. All 16 lanes do useful work, where broadcasting each value against
//!   a row of `Ω` (as `skinny::ab` does) fills only 24 of 32 lanes for 24 columns.
//!   Two rows share each load of `Ω`, and the columns go in sweeps of at most 12 so a
//!   sweep's slice for one tile (12 × 512 × 4 bytes) stays in L1. `Ω` is laid out once per
//!   pass ([`OmegaLayout`]) so that a group's operands sit at fixed offsets.
//!
//!   Its sums are in another order than the skinny kernel's, so `pca --precision f32`
//!   gives other last bits than standardized tiles would; the order depends only on the
//!   operands, so results stay identical for any number of ranks, actors or threads.
//! - [`ab_values`], the same for a float32 tile (decoded, resident or generated), the
//!   values loaded as they lie. Against the skinny kernel followed by an f64 addition, on
//!   one Ice Lake core (criterion, `rsvd_tiles/fused_pass_f32_*`, and by hand): a tile in
//!   L2, 83 against 107 µs (76 against 59 GFLOP/s); a row block of 256 × 5,000 read from
//!   memory, 1.10 against 1.37 ms; a whole fused range pass over such a block, `Yᵀ·T`
//!   included, 1.58–1.64 against 1.66–1.75 ms. Streaming rows two at a time, it fetches the rows two
//!   pairs ahead itself (without, a row block from memory ran slower than the skinny
//!   kernel, whose twelve rows at a time the hardware prefetchers follow).
//! - [`atb`], `b += Qᵀ·T`: the order of `skinny::atb` (rows in order, one f32
//!   sum per tile), so the result is bit for bit that of standardizing first. Float32
//!   tiles keep the skinny kernel: this one, reading all 256 rows of a tile per pair of
//!   column groups, ran slower on row blocks read from memory than the skinny kernel's
//!   blocks of 64 rows, and no faster in cache (79 against 82 µs).
//!
//! Both add their f32 sums to f64 accumulators directly, as the passes did after each tile.
//! [`atb`] also has an AVX2 form (module `avx2`, which gives the measurements, and says why
//! `T·Ω` has none); it gives the same bits.
//!
//! A row whose table is all zeros (a variant the PCA's filters excluded, or a monomorphic
//! one) adds nothing. Where such rows are a quarter of a tile or more (QC that excludes half
//! the variants, say), the tile's other rows are gathered first (`Live`) and only they are
//! multiplied: `y`'s rows get the same sums, bit for bit (each row's sum is added to `y`
//! once), and `b`'s only miss additions of zero.
//!
//! Measured (criterion, `rsvd_tiles/fused_*`, a row block of 256 variants × 20,000 samples
//! on one core of an Ice Lake Xeon): `Y = T·Ω` (24 columns) at 50–80 GFLOP/s and `Qᵀ·T`
//! (20 rows) at 55–65 GFLOP/s, against 118 GFLOP/s for OpenBLAS's SGEMM of 3000 × 3000.
//!
//! # Lookup tables tried instead
//!
//! The form ProPCA multiplies genotypes in (the "Mailman" or four-Russians product) needs
//! no expansion: a row's product is `t₀·ΣΩ + s·(Σ_lo + 2·Σ_hi)` less its missing calls,
//! where `Σ_lo` and `Σ_hi` add, for each byte of the row's low and high code bits (8
//! samples), a precomputed sum of the matching rows of `Ω` (a table of 256 × `w` values a
//! byte position); `Qᵀ·T` takes tables of `Q`'s rows per 8 variants, indexed by the
//! bit-transposed planes. A standalone prototype with only the two plane sums (no `t₀`
//! term, no missing calls: a bound in its favour) on a row block of 256 × 20,000 and 8
//! columns, one core of the 2-core AMD EPYC (Zen 4) guest, 2026-12-01, against this
//! module's kernels on the same core (criterion, `fused_*/256x20000x8`): `T·Ω` 0.79–1.34 ms
//! with tables of 16 entries a 4 samples (those of a 256-sample slice fit L1, 32 KiB) and
//! 3.0 ms with byte tables (512 KiB a 512-sample tile: misses), against 0.83 ms; `Qᵀ·T`
//! 1.41 ms with byte tables and the bit transposes, against 0.88 ms. The lookups are loads
//! whose addresses depend on the codes, one per 4 to 8 values; the fused kernels' FMAs are
//! one per 16 values and column, and at 8 columns they were no slower. Not kept.

use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis};

use crate::layout::PackedTile;
use crate::skinny::Isa;
#[cfg(target_arch = "x86_64")]
use x86::{ab_sweep, atb_group};

#[cfg(target_arch = "x86_64")]
mod avx2;

/// True when the fused `T·Ω` kernels ([`ab`], [`ab_values`]) run on this CPU: AVX-512F, and
/// the `skinny` module's kernels running in it.
pub fn available() -> bool {
    crate::skinny::isa() == Some(Isa::Avx512)
}

/// True when the fused [`atb`] runs on this CPU (AVX-512F, or AVX2 and FMA).
pub fn atb_available() -> bool {
    crate::skinny::isa().is_some()
}

/// Whether `t`'s byte slice holds every row's codes.
fn covers(t: &PackedTile<'_>) -> bool {
    t.rows == 0
        || (t.tables.len() >= t.rows
            && t.bytes.len() >= (t.rows - 1) * t.stride + t.cols.div_ceil(4)
            && t.stride >= t.cols.div_ceil(4))
}

/// Most columns of `Ω` that [`ab`] takes in one sweep over a tile's rows (24 accumulators
/// for two rows).
const SWEEP: usize = 12;

/// `Ω` (`n × w`) laid out for [`ab`]: its columns in sweeps of equal width (at most
/// `SWEEP`); within a sweep, for each group of 16 rows of `Ω`, each column's 16 values are
/// contiguous, column after column. The kernel then reads a group's operands at fixed
/// offsets from one pointer, with no address arithmetic per load.
#[derive(Clone, Debug)]
pub struct OmegaLayout {
    /// The layout starts at `data[base]`, the first value on a 64-byte boundary.
    data: Vec<f32>,
    base: usize,
    n: usize,
    w: usize,
    /// `(first column, width, offset in data)` of each sweep.
    sweeps: Vec<(usize, usize, usize)>,
}

impl OmegaLayout {
    /// The layout of `omega` (`n × w`); rows past `n` in the last group are zeros.
    pub fn new(omega: ArrayView2<'_, f32>) -> Self {
        let (n, w) = omega.dim();
        let groups = n.div_ceil(16);
        let count = w.div_ceil(SWEEP).max(1);
        let per = w.div_ceil(count).max(1);
        // Aligned to cache lines: every load of Ω in `ab_sweep` is a whole register, and
        // one that straddles two lines halves the kernel's rate (a standalone loop of the
        // same instructions: 87 GFLOP/s aligned, 56 at an offset of 16 bytes, which is
        // where glibc puts a large allocation). Found when `pca` passes were 14% faster
        // or slower from run to run with the same binary.
        let mut store = vec![0f32; groups * 16 * w + 15];
        let base = store.as_ptr().align_offset(64).min(15);
        let data = &mut store[base..];
        let mut sweeps = Vec::with_capacity(count);
        let (mut c0, mut off) = (0, 0);
        while c0 < w {
            let width = per.min(w - c0);
            for q in 0..groups {
                for c in 0..width {
                    let at = off + (q * width + c) * 16;
                    for i in 0..16.min(n - 16 * q) {
                        data[at + i] = omega[[16 * q + i, c0 + c]];
                    }
                }
            }
            sweeps.push((c0, width, off));
            off += groups * width * 16;
            c0 += width;
        }
        OmegaLayout {
            data: store,
            base,
            n,
            w,
            sweeps,
        }
    }
}

/// `y += T·Ω[c0.., ..]` with `T` the standardized tile (`rows × cols`, its first column
/// column `c0` of the matrix, a multiple of 16) and `y` `rows × w` (rows contiguous).
/// Returns false, computing nothing, when the kernels do not run here or a shape does not
/// fit them.
pub fn ab(
    t: &PackedTile<'_>,
    omega: &OmegaLayout,
    c0: usize,
    mut y: ArrayViewMut2<'_, f64>,
) -> bool {
    if !covers(t) {
        return false;
    }
    let Some(live) = Live::of(t) else {
        return ab_src::<true>(packed_src(t), omega, c0, y);
    };
    // What the kernels would refuse for the whole tile is refused here too: the caller's
    // fallback takes it.
    if !ab_fits(t.rows, t.cols, omega, c0, &y) {
        return false;
    }
    if live.rows.is_empty() {
        return true;
    }
    let mut part = Array2::<f64>::zeros((live.rows.len(), y.ncols()));
    if !ab_src::<true>(live.src(t), omega, c0, part.view_mut()) {
        return false;
    }
    for (&i, p) in live.rows.iter().zip(part.rows()) {
        let mut row = y.index_axis_mut(Axis(0), i);
        row += &p;
    }
    true
}

/// The rows of a packed tile that add anything (a table not all zeros), gathered, when they
/// are at most three quarters of it.
struct Live {
    /// The rows, in order.
    rows: Vec<usize>,
    /// Their codes, `stride` bytes a row.
    bytes: Vec<u8>,
    stride: usize,
    /// Their tables.
    tables: Vec<[f32; 4]>,
}

impl Live {
    fn of(t: &PackedTile<'_>) -> Option<Live> {
        let rows = t.live_rows()?;
        let stride = t.cols.div_ceil(4);
        let mut bytes = Vec::with_capacity(rows.len() * stride);
        for &i in &rows {
            bytes.extend_from_slice(&t.bytes[i * t.stride..i * t.stride + stride]);
        }
        let tables = rows.iter().map(|&i| t.tables[i]).collect();
        Some(Live {
            rows,
            bytes,
            stride,
            tables,
        })
    }

    /// The kernels' view of the gathered rows, `t`'s columns.
    fn src(&self, t: &PackedTile<'_>) -> Src {
        Src {
            base: self.bytes.as_ptr(),
            stride: self.stride,
            rows: self.rows.len(),
            cols: t.cols,
            tables: self.tables.as_ptr(),
        }
    }

    /// `q`'s gathered rows.
    fn q(&self, q: ArrayView2<'_, f32>) -> Array2<f32> {
        q.select(Axis(0), &self.rows)
    }
}

/// [`ab`] for a float32 tile (`rows × cols`, rows contiguous, its first column column
/// `c0` of the matrix): the same dot-product form and order of sums, 16 values loaded at
/// a time where they lie.
pub(crate) fn ab_values(
    t: ArrayView2<'_, f32>,
    omega: &OmegaLayout,
    c0: usize,
    y: ArrayViewMut2<'_, f64>,
) -> bool {
    values_src(t).is_some_and(|src| ab_src::<false>(src, omega, c0, y))
}

/// What the kernels read of a tile: row `i` starts `i·stride` bytes from `base` and holds
/// 2-bit codes translated through `tables[i]` (packed), or float32 values (`tables` null).
#[derive(Clone, Copy, Debug)]
struct Src {
    base: *const u8,
    stride: usize,
    rows: usize,
    cols: usize,
    tables: *const [f32; 4],
}

/// The kernels' view of a packed tile whose bytes and tables `covers` checked.
fn packed_src(t: &PackedTile<'_>) -> Src {
    Src {
        base: t.bytes.as_ptr(),
        stride: t.stride,
        rows: t.rows,
        cols: t.cols,
        tables: t.tables.as_ptr(),
    }
}

/// The kernels' view of a float32 tile, when its rows are contiguous.
fn values_src(t: ArrayView2<'_, f32>) -> Option<Src> {
    let (rows, cols) = t.dim();
    let st = t.strides();
    let row_step = if rows > 1 { st[0] } else { cols as isize };
    if (cols > 1 && st[1] != 1) || row_step < cols as isize {
        return None;
    }
    Some(Src {
        base: t.as_ptr().cast(),
        stride: 4 * row_step as usize,
        rows,
        cols,
        tables: std::ptr::null(),
    })
}

/// Whether the kernels take a tile of `rows × cols` from column `c0`, `omega` and `y`.
fn ab_fits(
    rows: usize,
    cols: usize,
    omega: &OmegaLayout,
    c0: usize,
    y: &ArrayViewMut2<'_, f64>,
) -> bool {
    let w = omega.w;
    // `T·Ω` has no AVX2 form (`avx2` says why).
    available()
        && c0.is_multiple_of(16)
        && c0 + cols <= omega.n
        && y.dim() == (rows, w)
        && (w <= 1 || y.strides()[1] == 1)
}

/// [`ab`] and [`ab_values`] once the tile is checked (`P`: packed).
fn ab_src<const P: bool>(
    t: Src,
    omega: &OmegaLayout,
    c0: usize,
    mut y: ArrayViewMut2<'_, f64>,
) -> bool {
    let w = omega.w;
    if !ab_fits(t.rows, t.cols, omega, c0, &y) {
        return false;
    }
    if t.rows == 0 || w == 0 || t.cols == 0 {
        return true;
    }
    let ldy = y.strides()[0].max(1) as usize;
    #[cfg(target_arch = "x86_64")]
    for &(first, width, off) in &omega.sweeps {
        // SAFETY: AVX-512F was detected (`Isa::supported`); the caller checked the tile's
        // rows (and tables); the sweep's groups c0/16 .. (c0 + cols)/16 lie in `data`
        // (c0 + cols ≤ n), and `y`'s columns first .. first + width exist.
        unsafe {
            let o = omega
                .data
                .as_ptr()
                .add(omega.base + off + c0 / 16 * width * 16);
            let yp = y.as_mut_ptr().add(first);
            by_const!(width, ab_sweep::<P>, (&t, o, yp, ldy), 1 2 3 4 5 6 7 8 9 10 11 12);
        }
    }
    let _ = ldy;
    true
}

/// Rows of `B` per sweep of [`atb`]'s kernel (two registers each).
const PAIR_ROWS: usize = 12;

/// `b += Qᵀ·T` with `q` `rows × g` (rows contiguous) and `b` `g × cols` (rows contiguous).
/// Returns false, computing nothing, when the kernels do not run here or a layout does not
/// fit them.
pub fn atb(t: &PackedTile<'_>, q: ArrayView2<'_, f32>, b: ArrayViewMut2<'_, f64>) -> bool {
    crate::skinny::isa().is_some_and(|isa| atb_on(isa, t, q, b))
}

/// [`atb`] by the kernels of `isa`.
fn atb_on(isa: Isa, t: &PackedTile<'_>, q: ArrayView2<'_, f32>, b: ArrayViewMut2<'_, f64>) -> bool {
    if !covers(t) {
        return false;
    }
    match Live::of(t) {
        None => atb_src(isa, packed_src(t), q, b),
        // What the kernels would refuse for the whole tile is refused here too.
        Some(_) if !atb_fits(t.rows, t.cols, &q, &b) => false,
        Some(live) if live.rows.is_empty() => true,
        Some(live) => atb_src(isa, live.src(t), live.q(q).view(), b),
    }
}

/// Whether the kernels take a tile of `rows × cols`, `q` and `b`.
fn atb_fits(rows: usize, cols: usize, q: &ArrayView2<'_, f32>, b: &ArrayViewMut2<'_, f64>) -> bool {
    let g = q.ncols();
    q.nrows() == rows
        && b.dim() == (g, cols)
        && (g <= 1 || q.strides()[1] == 1)
        && (cols <= 1 || b.strides()[1] == 1)
}

/// [`atb`] once the tile is checked.
fn atb_src(isa: Isa, t: Src, q: ArrayView2<'_, f32>, mut b: ArrayViewMut2<'_, f64>) -> bool {
    let g = q.ncols();
    if !atb_fits(t.rows, t.cols, &q, &b) {
        return false;
    }
    if t.rows == 0 || g == 0 || t.cols == 0 {
        return true;
    }
    let ldq = q.strides()[0].max(1) as usize;
    let ldb = b.strides()[0].max(1) as usize;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: AVX2 and FMA were detected (`Isa::supported`); the shapes checked `q`'s
        // g columns and `b`'s g rows, `covers` every row's bytes and tables.
        unsafe { avx2::atb_rows(&t, g, q.as_ptr(), ldq, b.as_mut_ptr(), ldb) };
        return true;
    }
    // Rows of B in even blocks of at most PAIR_ROWS: the kernel keeps two accumulators per
    // row of B (two column groups), and all of them in registers.
    let per = g.div_ceil(g.div_ceil(PAIR_ROWS));
    let mut r0 = 0;
    #[cfg(target_arch = "x86_64")]
    while r0 < g {
        let n = (g - r0).min(per);
        // SAFETY: AVX-512F was detected; `covers` checked every row's bytes and tables, the
        // shapes checked `q`'s columns r0..r0 + n and `b`'s rows.
        unsafe {
            let (qp, bp) = (q.as_ptr().add(r0), b.as_mut_ptr().add(r0 * ldb));
            by_const!(
                n,
                atb_group,
                (&t, qp, ldq, bp, ldb),
                1 2 3 4 5 6 7 8 9 10 11 12
            );
        }
        r0 += n;
    }
    let _ = (r0, per, ldq, ldb);
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Src;

    /// Bytes ahead of a packed tile's first code that hold the next tile's codes (the
    /// passes take a row block's tiles left to right).
    const NEXT_TILE: usize = crate::layout::TILE_COLS / 4;

    /// Pairs of rows ahead of the current pair whose float32 values [`ab_rows`] fetches,
    /// a line per group: two rows at a time are too few streams for the hardware
    /// prefetchers to run ahead of a tile read from memory.
    const PAIRS_AHEAD: usize = 2;

    /// Lanes of `n ≤ 16` columns.
    fn mask(n: usize) -> __mmask16 {
        if n >= 16 {
            u16::MAX
        } else {
            ((1u32 << n) - 1) as u16
        }
    }

    /// The `n < 16` codes of a row's ragged end (from `at`) as one 32-bit word, reading
    /// only their bytes.
    ///
    /// # Safety
    /// `at` holds `⌈n/4⌉` bytes.
    #[inline]
    pub(super) unsafe fn tail(at: *const u8, n: usize) -> i32 {
        let mut b = [0u8; 4];
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(at, b.as_mut_ptr(), n.div_ceil(4)) };
        i32::from_le_bytes(b)
    }

    /// Standardized values of 16 codes through `lut` (the row's table, repeated).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn expand(word: i32, lut: __m512, m: __mmask16) -> __m512 {
        let shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        _mm512_maskz_permutexvar_ps(m, _mm512_srlv_epi32(_mm512_set1_epi32(word), shifts), lut)
    }

    /// One row of a tile: its first byte and, packed, its table in all four 128-bit
    /// blocks.
    #[derive(Clone, Copy)]
    struct Row {
        at: *const u8,
        lut: __m512,
    }

    /// Row `i` of `t`.
    ///
    /// # Safety
    /// `i < t.rows`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn row<const P: bool>(t: &Src, i: usize) -> Row {
        // SAFETY: the caller's contract; a packed tile has a table per row.
        unsafe {
            Row {
                at: t.base.add(i * t.stride),
                lut: if P {
                    _mm512_broadcast_f32x4(_mm_loadu_ps((*t.tables.add(i)).as_ptr()))
                } else {
                    _mm512_setzero_ps()
                },
            }
        }
    }

    /// Values `16·j ..` of a row: all 16 (`FULL`), or the `n < 16` of its ragged end
    /// (lanes `m`), reading nothing past them.
    ///
    /// # Safety
    /// The row holds those values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn group<const P: bool, const FULL: bool>(
        r: Row,
        j: usize,
        n: usize,
        m: __mmask16,
    ) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            if P {
                let at = r.at.add(4 * j);
                let word = if FULL {
                    at.cast::<i32>().read_unaligned()
                } else {
                    tail(at, n)
                };
                expand(word, r.lut, m)
            } else {
                let at = r.at.cast::<f32>().add(16 * j);
                if FULL {
                    _mm512_loadu_ps(at)
                } else {
                    _mm512_maskz_loadu_ps(m, at)
                }
            }
        }
    }

    /// The sums of the lanes of up to 16 registers, in order: a transposing reduction
    /// (45 shuffles and adds for 16 sums, in a fixed order).
    #[inline(never)]
    #[target_feature(enable = "avx512f")]
    fn lane_sums<const N: usize>(acc: [__m512; N]) -> [f32; 16] {
        let mut v = [_mm512_setzero_ps(); 16];
        v[..N].copy_from_slice(&acc);
        let mut t = [_mm512_setzero_ps(); 8];
        for p in 0..8 {
            let (a, b) = (v[2 * p], v[2 * p + 1]);
            // Blocks [a0+a2, a1+a3, b0+b2, b1+b3].
            t[p] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
            );
        }
        let mut u = [_mm512_setzero_ps(); 4];
        for p in 0..4 {
            let (a, b) = (t[2 * p], t[2 * p + 1]);
            // Block k: four partial sums of register 4p + k.
            u[p] = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
                _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
            );
        }
        let mut w = [_mm512_setzero_ps(); 2];
        for p in 0..2 {
            let (a, b) = (u[2 * p], u[2 * p + 1]);
            // Per block: [a0+a2, b0+b2, a1+a3, b1+b3].
            w[p] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
        }
        // Lane 4k + i: the sum of register 4i + k.
        let z = _mm512_add_ps(
            _mm512_shuffle_ps::<0b01_00_01_00>(w[0], w[1]),
            _mm512_shuffle_ps::<0b11_10_11_10>(w[0], w[1]),
        );
        let mut lanes = [0f32; 16];
        // SAFETY: 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), z) };
        let mut out = [0f32; 16];
        for (c, o) in out.iter_mut().enumerate() {
            *o = lanes[4 * (c % 4) + c / 4];
        }
        out
    }

    /// `N` columns of `y += T·Ω` for every row of the tile (`o` = the tile's first group of
    /// those columns in an [`super::OmegaLayout`], `y` their first output column).
    ///
    /// # Safety
    /// AVX-512F; as [`super::ab`] for a sweep of width `N` from `o` and `y .. y + N`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn ab_sweep<const P: bool, const N: usize>(
        t: &Src,
        o: *const f32,
        y: *mut f64,
        ldy: usize,
    ) {
        let mut r = 0;
        // SAFETY (both): rows r, r + 1 < t.rows.
        unsafe {
            while r + 2 <= t.rows {
                let rows = [row::<P>(t, r), row::<P>(t, r + 1)];
                let ys = [y.add(r * ldy), y.add((r + 1) * ldy)];
                let next = t.base.wrapping_add((r + 2 * PAIRS_AHEAD) * t.stride);
                ab_rows::<P, 2, N>(t.cols, rows, o, ys, [next, next.wrapping_add(t.stride)]);
                r += 2;
            }
            if r < t.rows {
                let next = [t.base.wrapping_add((r + 1) * t.stride)];
                ab_rows::<P, 1, N>(t.cols, [row::<P>(t, r)], o, [y.add(r * ldy)], next);
            }
        }
    }

    /// `R` rows × `N` columns of `y += T·Ω`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn ab_rows<const P: bool, const R: usize, const N: usize>(
        cols: usize,
        rows: [Row; R],
        o: *const f32,
        y: [*mut f64; R],
        next: [*const u8; R],
    ) {
        if P {
            for r in &rows {
                _mm_prefetch::<_MM_HINT_T0>(r.at.wrapping_add(NEXT_TILE).cast());
                _mm_prefetch::<_MM_HINT_T0>(r.at.wrapping_add(NEXT_TILE + 64).cast());
            }
        }
        let mut acc = [[_mm512_setzero_ps(); N]; R];
        let full = cols / 16;
        // SAFETY (all): values 16q.. of each row exist (16q < cols), and Ωᵀ's rows hold
        // `cols` values; masked lanes are not read.
        unsafe {
            for q in 0..full {
                let mut x = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    if !P {
                        // A prefetch never faults, whatever the address.
                        _mm_prefetch::<_MM_HINT_T0>(next[r].wrapping_add(64 * q).cast());
                    }
                    x[r] = group::<P, true>(rows[r], q, 16, u16::MAX);
                }
                for c in 0..N {
                    let oc = _mm512_loadu_ps(o.add((q * N + c) * 16));
                    for r in 0..R {
                        acc[r][c] = _mm512_fmadd_ps(x[r], oc, acc[r][c]);
                    }
                }
            }
            let rest = cols - 16 * full;
            if rest > 0 {
                let m = mask(rest);
                let mut x = [_mm512_setzero_ps(); R];
                for r in 0..R {
                    x[r] = group::<P, false>(rows[r], full, rest, m);
                }
                for c in 0..N {
                    let oc = _mm512_maskz_loadu_ps(m, o.add((full * N + c) * 16));
                    for r in 0..R {
                        acc[r][c] = _mm512_fmadd_ps(x[r], oc, acc[r][c]);
                    }
                }
            }
            for r in 0..R {
                let s = lane_sums::<N>(acc[r]);
                for c in 0..N {
                    *y[r].add(c) += s[c] as f64;
                }
            }
        }
    }

    /// `G` rows of `b += Qᵀ·T` (`q` their first column of `Q`, `b` their first row).
    ///
    /// # Safety
    /// AVX-512F; as [`super::atb`] for columns `q .. q + G` and rows `b`, `b + ldb`, ….
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn atb_group<const G: usize>(
        t: &Src,
        q: *const f32,
        ldq: usize,
        b: *mut f64,
        ldb: usize,
    ) {
        let full = t.cols / 16;
        // SAFETY (all): as this function's.
        unsafe {
            let mut j = 0;
            while j + 1 < full {
                // The first sweep over the rows also fetches the next tile's codes.
                let (a0, a1) = if j == 0 {
                    atb_pair::<G, true>(t, j, q, ldq)
                } else {
                    atb_pair::<G, false>(t, j, q, ldq)
                };
                atb_add(a0, u16::MAX, b.add(16 * j), ldb);
                atb_add(a1, u16::MAX, b.add(16 * (j + 1)), ldb);
                j += 2;
            }
            if j < full {
                let acc = if j == 0 {
                    atb_columns::<G, true, true>(t, j, u16::MAX, q, ldq)
                } else {
                    atb_columns::<G, true, false>(t, j, u16::MAX, q, ldq)
                };
                atb_add(acc, u16::MAX, b.add(16 * j), ldb);
            }
            let rest = t.cols - 16 * full;
            if rest > 0 {
                let acc = atb_columns::<G, false, false>(t, full, mask(rest), q, ldq);
                atb_add(acc, mask(rest), b.add(16 * full), ldb);
            }
        }
    }

    /// Fetches row `r`'s codes of the tile after this one (the passes take a row block's
    /// tiles left to right), a row at a time: a burst of prefetches would wait for fill
    /// buffers.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fetch_next_tile(r: Row) {
        // A prefetch never faults, whatever the address.
        let next = r.at.wrapping_add(NEXT_TILE);
        _mm_prefetch::<_MM_HINT_T0>(next.cast());
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64).cast());
    }

    /// [`atb_columns`] of the full column groups `j` and `j + 1` at once. Each value of Q
    /// is loaded once for two multiply-adds, where the one-group kernel loads it for each:
    /// on this Ice Lake, multiply-adds with a memory operand ran at about half the rate of
    /// register ones, and a standalone loop of this shape ran 40% faster than the
    /// one-group loop. Each sum still runs over the rows in order, so the result is the
    /// same, bit for bit.
    ///
    /// # Safety
    /// As [`atb_columns`], for the codes of groups `j` and `j + 1`.
    #[inline(never)]
    #[target_feature(enable = "avx512f")]
    unsafe fn atb_pair<const G: usize, const FETCH: bool>(
        t: &Src,
        j: usize,
        q: *const f32,
        ldq: usize,
    ) -> ([__m512; G], [__m512; G]) {
        let mut a0 = [_mm512_setzero_ps(); G];
        let mut a1 = [_mm512_setzero_ps(); G];
        // SAFETY: i < t.rows; the row's values 16j .. 16j + 32 exist (both groups are
        // full); Q's row i holds G values from `q`.
        unsafe {
            for i in 0..t.rows {
                let r = row::<true>(t, i);
                if FETCH {
                    fetch_next_tile(r);
                }
                let x0 = group::<true, true>(r, j, 16, u16::MAX);
                let x1 = group::<true, true>(r, j + 1, 16, u16::MAX);
                let qi = q.add(i * ldq);
                for g in 0..G {
                    let v = _mm512_set1_ps(*qi.add(g));
                    a0[g] = _mm512_fmadd_ps(v, x0, a0[g]);
                    a1[g] = _mm512_fmadd_ps(v, x1, a1[g]);
                }
            }
        }
        (a0, a1)
    }

    /// The f32 sums of `G` rows of `Qᵀ·T` over columns `16·j ..` (masked by `m`; `FULL`
    /// when all 16 are in the tile; `FETCH` prefetches the next tile's codes).
    ///
    /// # Safety
    /// As [`atb_group`], with values `16·j ..` in every row.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn atb_columns<const G: usize, const FULL: bool, const FETCH: bool>(
        t: &Src,
        j: usize,
        m: __mmask16,
        q: *const f32,
        ldq: usize,
    ) -> [__m512; G] {
        let mut acc = [_mm512_setzero_ps(); G];
        // SAFETY: i < t.rows; the row's values 16j.. exist (`group` reads only the ragged
        // end's); Q's row i holds G values from `q`.
        unsafe {
            for i in 0..t.rows {
                let r = row::<true>(t, i);
                if FETCH {
                    fetch_next_tile(r);
                }
                let x = group::<true, FULL>(r, j, t.cols - 16 * j, m);
                let qi = q.add(i * ldq);
                for g in 0..G {
                    acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(*qi.add(g)), x, acc[g]);
                }
            }
        }
        acc
    }

    /// `b[g, ..16] += acc[g]` in f64 over the lanes of `m`.
    ///
    /// # Safety
    /// Rows `b + g·ldb` hold the masked lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn atb_add<const G: usize>(acc: [__m512; G], m: __mmask16, b: *mut f64, ldb: usize) {
        let (m0, m1) = ((m & 0xff) as __mmask8, (m >> 8) as __mmask8);
        for g in 0..G {
            let a = acc[g];
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(a));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(a),
            )));
            // SAFETY: the caller's contract.
            unsafe {
                let out = b.add(g * ldb);
                let s0 = _mm512_add_pd(_mm512_maskz_loadu_pd(m0, out), lo);
                _mm512_mask_storeu_pd(out, m0, s0);
                if m1 != 0 {
                    let s1 = _mm512_add_pd(_mm512_maskz_loadu_pd(m1, out.add(8)), hi);
                    _mm512_mask_storeu_pd(out.add(8), m1, s1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::{s, Array2};

    use super::*;
    use crate::testing::Rng;
    use crate::tiles::{RowScale, Tile, TileReal};

    /// A random packed panel (`rows × stride` bytes, missing calls included) with random
    /// standardizations, none to most of them dropped (or filtered) rows: tiles multiplied
    /// whole and tiles whose live rows are gathered first.
    fn panel(rng: &mut Rng, rows: usize, stride: usize) -> Panel {
        let bytes = (0..rows * stride).map(|_| rng.next() as u8).collect();
        let dropped = [1, 8, 16, 28][rng.below(4)];
        let scales = (0..rows)
            .map(|_| {
                let p = rng.below(1000) as f64 / 1000.0;
                let scale = if rng.below(32) < dropped || p == 0.0 {
                    0.0
                } else {
                    1.0 / (2.0 * p * (1.0 - p)).sqrt()
                };
                RowScale {
                    mean: 2.0 * p,
                    scale,
                }
            })
            .collect::<Vec<RowScale>>();
        let tables = scales.iter().map(|s| s.table().map(|v| v as f32)).collect();
        Panel {
            bytes,
            scales,
            tables,
            stride,
            rows,
        }
    }

    /// What [`panel`] draws.
    struct Panel {
        bytes: Vec<u8>,
        scales: Vec<RowScale>,
        tables: Vec<[f32; 4]>,
        stride: usize,
        rows: usize,
    }

    impl Panel {
        /// The tile of columns `c0..c0 + cols`, its codes ending at the last row's last
        /// one, so that a read past them is caught.
        fn tile(&self, c0: usize, cols: usize) -> PackedTile<'_> {
            let end = (self.rows - 1) * self.stride + (c0 + cols).div_ceil(4);
            PackedTile {
                bytes: &self.bytes[c0 / 4..end],
                stride: self.stride,
                rows: self.rows,
                cols,
                tables: &self.tables,
                scales: &self.scales,
            }
        }
    }

    /// Regression: the layout once started wherever the allocator put it, 16 bytes past a
    /// cache line for large ones, and every load of Ω straddled two lines.
    #[test]
    fn omega_layout_starts_on_a_cache_line_whatever_the_allocation() {
        let mut rng = Rng::fresh();
        // Allocations of every size class shift where the next one lands.
        let mut keep = Vec::new();
        for _ in 0..12 {
            let (n, w) = (1 + rng.below(3000), 1 + rng.below(30));
            keep.push(vec![0u8; 1 + rng.below(5000)]);
            let omega = Array2::from_shape_fn((n, w), |(i, j)| (i * 31 + j) as f32);
            let layout = OmegaLayout::new(omega.view());
            let start = layout.data[layout.base..].as_ptr();
            assert_eq!(start as usize % 64, 0, "n {n}, w {w}");
            for &(c0, width, off) in &layout.sweeps {
                for i in [0, n / 2, n - 1] {
                    for c in [0, width - 1] {
                        let at = layout.base + off + ((i / 16) * width + c) * 16 + i % 16;
                        assert_eq!(layout.data[at], omega[[i, c0 + c]]);
                    }
                }
            }
        }
        drop(keep);
    }

    /// `y0 + T·O` in the order of the fused `ab`, one value at a time: for each value of
    /// `y`, 16 lane sums (lane `l` a multiply-add chain over the values `16q + l`, the
    /// ragged end's missing lanes adding `0·0`), folded as `lane_sums` folds them.
    fn dot_form(t: ArrayView2<'_, f32>, o: ArrayView2<'_, f32>, y0: &Array2<f64>) -> Array2<f64> {
        let cols = t.ncols();
        let mut y = y0.clone();
        for ((i, c), v) in y.indexed_iter_mut() {
            let mut lanes = [0f32; 16];
            for j in 0..cols.div_ceil(16) * 16 {
                let (x, w) = if j < cols {
                    (t[[i, j]], o[[j, c]])
                } else {
                    (0.0, 0.0)
                };
                lanes[j % 16] = x.mul_add(w, lanes[j % 16]);
            }
            let s: Vec<f32> = (0..8).map(|k| lanes[k] + lanes[8 + k]).collect();
            let p: Vec<f32> = (0..4).map(|k| s[k] + s[4 + k]).collect();
            *v += ((p[0] + p[2]) + (p[1] + p[3])) as f64;
        }
        y
    }

    /// `b0 + Qᵀ·T`, each value one f32 multiply-add chain over the rows in order, added in
    /// f64.
    fn row_chains(q: ArrayView2<'_, f32>, t: ArrayView2<'_, f32>, b0: &Array2<f64>) -> Array2<f64> {
        let mut b = b0.clone();
        for ((g, j), v) in b.indexed_iter_mut() {
            let s = (0..t.nrows()).fold(0f32, |s, i| q[[i, g]].mul_add(t[[i, j]], s));
            *v += s as f64;
        }
        b
    }

    /// Every instruction set the kernels come in gives the bits of the models above, packed
    /// or float32 (for `Qᵀ·T`, so an AVX2 node and an AVX-512 node agree).
    #[test]
    fn fused_products_on_every_instruction_set_give_the_bits_of_their_order() {
        let isas = Isa::supported();
        if isas.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2+FMA");
            return;
        }
        let mut rng = Rng::fresh();
        for case in 0..80 {
            let rows = 1 + rng.below(40);
            // Tiles start at a column that is a multiple of 16 inside wider rows.
            let c0 = 16 * rng.below(10);
            let cols = 1 + rng.below(700);
            let stride = (c0 + cols).div_ceil(4) + rng.below(3);
            let drawn = panel(&mut rng, rows, stride);
            let t = drawn.tile(c0, cols);
            let dense = t.standardize(&mut Vec::<f32>::new()).to_owned();

            // Ω has rows for the whole panel width; the tile meets rows c0.. of it.
            let w = 1 + rng.below(40);
            let omega = Array2::from_shape_fn((c0 + cols + rng.below(40), w), |_| rng.value());
            let layout = OmegaLayout::new(omega.view());
            let o = omega.slice(s![c0..c0 + cols, ..]);
            let y0 = Array2::from_shape_fn((rows, w), |_| rng.value() as f64);
            let want = dot_form(dense.view(), o, &y0);

            let g = 1 + rng.below(40);
            let q = Array2::from_shape_fn((rows, g), |_| rng.value());
            let b0 = Array2::from_shape_fn((g, cols), |_| rng.value() as f64);
            let want_b = row_chains(q.view(), dense.view(), &b0);
            let what = format!("case {case}: {rows}×{cols}, w {w}, g {g}");
            // `T·Ω` runs on AVX-512 only, and declines elsewhere, leaving `y` as it was.
            let runs = available();
            let mut y = y0.clone();
            assert_eq!(ab(&t, &layout, c0, y.view_mut()), runs, "{what}");
            assert_eq!(y, if runs { &want } else { &y0 }, "ab, {what}");
            let mut yv = y0.clone();
            let done = ab_values(dense.view(), &layout, c0, yv.view_mut());
            assert_eq!(done, runs, "{what}");
            assert_eq!(yv, if runs { &want } else { &y0 }, "ab_values, {what}");
            for &isa in &isas {
                let what = format!("{isa:?}, {what}");
                let mut b = b0.clone();
                assert!(atb_on(isa, &t, q.view(), b.view_mut()));
                assert_eq!(b, want_b, "atb, {what}");
            }
            // And the model is the product.
            let exact = &y0 + &dense.mapv(f64::from).dot(&o.mapv(f64::from));
            let scale = dense
                .mapv(|x| x.abs() as f64)
                .dot(&o.mapv(|x| x.abs() as f64));
            for ((a, b), s) in want.iter().zip(exact.iter()).zip(scale.iter()) {
                assert!((a - b).abs() <= 1e-5 * (s + 1.0), "ab: {a} vs {b}");
            }
            // Bit for bit what standardizing first and the skinny kernel give.
            let mut skinny = b0.clone();
            let mut part = Array2::<f32>::zeros((g, cols));
            crate::tiles::gemm(true, q.view(), dense.view(), 0.0, part.view_mut());
            skinny.zip_mut_with(&part, |x, &p| *x += p as f64);
            assert_eq!(skinny, want_b, "skinny atb, case {case}");
        }
    }

    #[test]
    fn ab_values_equals_a_float64_product_on_random_tiles_inside_wider_panels() {
        if !available() {
            eprintln!("skipped: this CPU has neither AVX-512F nor AVX2+FMA");
            return;
        }
        let mut rng = Rng::fresh();
        for _ in 0..60 {
            // A tile of a row-major panel `rows × width`, from column c0 (a multiple of
            // 16), as the passes cut decoded panels; NaN past the tile's columns, so a
            // read outside it shows.
            let (rows, cols) = (1 + rng.below(40), 1 + rng.below(600));
            let c0 = 16 * rng.below(8);
            let width = c0 + cols + rng.below(50);
            let panel = Array2::from_shape_fn((rows, width), |(_, j)| {
                if (c0..c0 + cols).contains(&j) {
                    rng.value()
                } else {
                    f32::NAN
                }
            });
            let t = panel.slice(s![.., c0..c0 + cols]);
            let w = 1 + rng.below(30);
            let omega = Array2::from_shape_fn((width, w), |_| rng.value());
            let layout = OmegaLayout::new(omega.view());
            let y0 = Array2::from_shape_fn((rows, w), |_| rng.value() as f64);
            let mut y = y0.clone();
            assert!(ab_values(t, &layout, c0, y.view_mut()));
            let o = omega.slice(s![c0..c0 + cols, ..]);
            let want = &y0 + &t.mapv(f64::from).dot(&o.mapv(f64::from));
            let scale = t.mapv(|x| x.abs() as f64).dot(&o.mapv(|x| x.abs() as f64));
            for ((a, b), s) in y.iter().zip(want.iter()).zip(scale.iter()) {
                assert!(
                    (a - b).abs() <= 1e-5 * (s + 1.0),
                    "ab_values: {a} vs {b} ({rows}×{cols} from column {c0}, w {w})"
                );
            }
        }
        // Tiles whose rows are not contiguous, or a tile not on a group of 16 columns, are
        // declined, not misread.
        let panel = Array2::from_shape_fn((8, 64), |(i, j)| (i * 64 + j) as f32);
        let omega = Array2::from_shape_fn((64, 3), |(i, j)| (i + j) as f32);
        let layout = OmegaLayout::new(omega.view());
        let mut y = Array2::<f64>::zeros((8, 3));
        assert!(!ab_values(
            panel.slice(s![.., ..;2]),
            &layout,
            0,
            y.view_mut()
        ));
        assert!(!ab_values(
            panel.slice(s![.., 4..20]),
            &layout,
            4,
            y.view_mut()
        ));
        let mut yt = Array2::<f64>::zeros((64, 3));
        assert!(!ab_values(panel.t(), &layout, 0, yt.view_mut()));
        assert_eq!(y, Array2::<f64>::zeros((8, 3)));
    }

    /// The trait's products of packed tiles where the fused kernels do not run (f64 tiles
    /// always; f32 without an Ω layout): every row standardized, or the live rows alone
    /// once a quarter or more are dropped or filtered. Either way they are the products of
    /// the standardized tile, the dead rows of `y` untouched.
    #[test]
    fn products_of_packed_tiles_fall_back_to_standardized_values() {
        let mut rng = Rng::fresh();
        let (mut whole, mut gathered) = (0, 0);
        for _ in 0..40 {
            let (rows, cols) = (1 + rng.below(80), 1 + rng.below(700));
            let stride = cols.div_ceil(4) + rng.below(3);
            let drawn = panel(&mut rng, rows, stride);
            let t = drawn.tile(0, cols);
            match t.live_rows() {
                None => whole += 1,
                Some(_) => gathered += 1,
            }
            let c0 = rng.below(40);
            let w = 1 + rng.below(30);
            let omega = Array2::from_shape_fn((c0 + cols + rng.below(9), w), |_| rng.value());
            let q = Array2::from_shape_fn((rows, 1 + rng.below(25)), |_| rng.value());
            check::<f64>(&t, &omega, c0, &q, &mut rng, 1e-12);
            check::<f32>(&t, &omega, c0, &q, &mut rng, 1e-5);
        }
        assert!(
            whole > 0 && gathered > 0,
            "{whole} whole, {gathered} gathered"
        );

        fn check<T: TileReal>(
            t: &PackedTile<'_>,
            omega: &Array2<f32>,
            c0: usize,
            q: &Array2<f32>,
            rng: &mut Rng,
            tol: f64,
        ) {
            let what = format!("f{}: {} × {}", 8 * size_of::<T>(), t.rows, t.cols);
            let dense = t.standardize(&mut Vec::<T>::new()).mapv(|v| v.to_f64());
            let dead: Vec<bool> = t.tables.iter().map(|x| *x == [0.0; 4]).collect();
            let omega = omega.mapv(|v| T::from_f64(v as f64));
            let o = omega.slice(s![c0..c0 + t.cols, ..]).mapv(|v| v.to_f64());
            let y0 = Array2::from_shape_fn((t.rows, o.ncols()), |_| rng.value() as f64);
            let mut y = y0.clone();
            T::ab_tile(
                Tile::Packed(*t),
                omega.view(),
                None,
                c0,
                y.view_mut(),
                &mut Vec::new(),
            );
            let want = &y0 + &dense.dot(&o);
            let scale = dense.mapv(f64::abs).dot(&o.mapv(f64::abs));
            for ((i, j), &v) in y.indexed_iter() {
                if dead[i] {
                    assert_eq!(v.to_bits(), y0[[i, j]].to_bits(), "{what}: dead row {i}");
                }
                let d = (v - want[[i, j]]).abs();
                assert!(d <= tol * (scale[[i, j]] + 1.0), "{what}: y({i}, {j})");
            }
            let qt = q.mapv(|v| T::from_f64(v as f64));
            let b0 = Array2::from_shape_fn((q.ncols(), t.cols), |_| rng.value() as f64);
            let mut b = b0.clone();
            T::atb_tile(Tile::Packed(*t), qt.view(), b.view_mut(), &mut Vec::new());
            let qf = qt.mapv(|v| v.to_f64());
            let want = &b0 + &qf.t().dot(&dense);
            let scale = qf.t().mapv(f64::abs).dot(&dense.mapv(f64::abs));
            for ((i, j), &v) in b.indexed_iter() {
                let d = (v - want[[i, j]]).abs();
                assert!(d <= tol * (scale[[i, j]] + 1.0), "{what}: b({i}, {j})");
            }
        }
        // What the fused kernels do not take is declined, not misread (their fallbacks are
        // the products above).
        let (rows, cols, stride) = (7, 45, 13);
        let drawn = panel(&mut rng, rows, stride);
        let t = drawn.tile(0, cols);
        let omega = Array2::from_shape_fn((cols + 16, 5), |_| rng.value() as f64);
        let mut y = Array2::<f64>::zeros((rows, 5));
        // What the kernels do not take is declined, not misread: a transposed output, a
        // tile not on a group of 16 columns, a tile past Ω's rows.
        let layout = OmegaLayout::new(omega.mapv(|x| x as f32).view());
        let mut yt = Array2::<f64>::zeros((5, rows));
        assert!(!ab(&t, &layout, 0, yt.view_mut().reversed_axes()));
        assert!(!ab(&t, &layout, 4, y.view_mut()));
        assert!(!ab(&t, &layout, 32, y.view_mut()));
    }
}
