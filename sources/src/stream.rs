//! Block streams: the words behind every generated value.
//!
//! # Design
//!
//! A generated value must be a pure function of `(key, row, col)`, so that any actor on any
//! rank or device can regenerate any panel in any pass. The first generator did that by
//! hashing every element's counter with the SplitMix64 finalizer: two 64-bit multiplies per
//! value. On CPUs where a vector 64-bit multiply is several µops (AVX2 has none; Ice Lake's
//! `vpmullq` is three) the hash was a quarter of a generated genotype PCA.
//!
//! The columns of row `r` are now grouped in fixed global blocks of [`BLOCK_COLS`]; block
//! `b` is one short stream of 64-bit words from [`LANES`] interleaved xoroshiro128+
//! generators (Blackman & Vigna 2018: two xors, two rotates, a shift and an add per word,
//! no multiply). Word `w` of the block is output `⌊w / LANES⌋` of lane `w mod LANES`, so one
//! step of all lanes fills one SIMD register of words on AVX-512 (two on AVX2), and a GPU
//! thread can make a block alone. Lane `l` starts from the SplitMix64 draws of counters
//! `c + 2l` and `c + 2l + 1`, where `c = r·2²⁴ + b·BLOCK_COLS` is the counter of the
//! block's first element: the hash is paid 16 times per 256 words instead of 256 times, and
//! seeding from a bijective hash of distinct counters keeps every lane's state distinct
//! and nonzero in practice. Blocks never depend on each other, so values still do not
//! depend on panel splits, tile widths or rank counts; the price is that one element alone
//! costs up to `BLOCK_COLS / LANES` steps of its lane ([`word`]), which only scalar
//! accessors and strided selections pay.
//!
//! How words become values:
//! - uniform: word `c mod 256` of block `⌊c / 256⌋`, its top 52 bits as the mantissa of a
//!   number in [1, 2), minus 1 ([`unit()`]): exact, and a shift, an or and a subtraction
//!   in any SIMD width;
//! - genotypes: column `c` uses the 32-bit half `c mod 2` (low half first) of word
//!   `(c mod 256) / 2`; its two 16-bit halves are the two alleles' uniform draws, each an
//!   alternative allele when below the variant's threshold `round(p·2¹⁶)`
//!   ([`allele_threshold`]). A missing call is decided by the same half of word
//!   `128 + (c mod 256) / 2` against `round(rate·2³²)`, so the alleles do not change with the
//!   missing rate and a block without missing calls makes only 128 words.
//!
//! The device kernels (`gpu/kernels.cu`) implement the same definition, and the tests there
//! compare them with these functions bit for bit.

/// The SplitMix64 increment (the golden ratio in 64-bit fixed point).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Columns of the generated index space: `counter = row · 2²⁴ + col`.
pub const MAX_GENERATED_COLS: u64 = 1 << 24;
/// Rows of the generated index space (so the counter stays below 2⁶⁴).
pub const MAX_GENERATED_ROWS: u64 = 1 << 39;
/// Columns per block stream.
pub const BLOCK_COLS: usize = 256;
/// Interleaved generators per block stream.
pub const LANES: usize = 8;
/// Words of a genotype block: alleles in the first half, missing-call draws in the second.
const GENOTYPE_WORDS: usize = BLOCK_COLS / 2;

/// The SplitMix64 output (finalizer) function.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The counter-based draw `mix64(key + (row·2²⁴ + col)·γ)`: per-row and per-population
/// parameters, and the seeds of block streams.
#[inline(always)]
pub fn counter_bits(key: u64, row: u64, col: u64) -> u64 {
    mix64(key.wrapping_add((row * MAX_GENERATED_COLS + col).wrapping_mul(GAMMA)))
}

/// A word's uniform value in [0, 1): its top 52 bits as a mantissa.
#[inline(always)]
pub fn unit(x: u64) -> f64 {
    f64::from_bits((x >> 12) | 0x3FF0_0000_0000_0000) - 1.0
}

/// The 16-bit threshold of allele frequency `p`: an allele's draw `u` (16 bits) is the
/// alternative allele when `u < allele_threshold(p)`, i.e. with probability `p` rounded to
/// a multiple of 2⁻¹⁶.
#[inline]
pub fn allele_threshold(p: f64) -> u64 {
    // At most 2¹⁶ − 1, so a threshold fits the 16-bit lanes it is compared in.
    (p.clamp(0.0, 1.0) * 65_536.0).round().min(65_535.0) as u64
}

/// The 32-bit threshold of a missing-call rate (a call is missing when its 32-bit draw is
/// below it).
#[inline]
pub fn missing_threshold(rate: f64) -> u64 {
    (rate.clamp(0.0, 1.0) * 4_294_967_296.0)
        .round()
        .min(4_294_967_295.0) as u64
}

/// The starting states of the lanes of block `block` of row `row`.
#[inline(always)]
fn seed(key: u64, row: u64, block: u64) -> ([u64; LANES], [u64; LANES]) {
    let c = row * MAX_GENERATED_COLS + block * BLOCK_COLS as u64;
    let (mut s0, mut s1) = ([0u64; LANES], [0u64; LANES]);
    for l in 0..LANES {
        s0[l] = counter_bits(key, 0, c + 2 * l as u64);
        s1[l] = counter_bits(key, 0, c + 2 * l as u64 + 1);
    }
    (s0, s1)
}

/// One xoroshiro128+ step of every lane, writing each lane's output.
#[inline(always)]
fn step(s0: &mut [u64; LANES], s1: &mut [u64; LANES], out: &mut [u64]) {
    for l in 0..LANES {
        let a = s0[l];
        let b = s1[l] ^ a;
        out[l] = a.wrapping_add(s1[l]);
        s0[l] = a.rotate_left(24) ^ b ^ (b << 16);
        s1[l] = b.rotate_left(37);
    }
}

/// The first `out.len()` words (a multiple of [`LANES`]) of block `block` of row `row`.
#[inline(always)]
pub fn block_words(key: u64, row: u64, block: u64, out: &mut [u64]) {
    let (mut s0, mut s1) = seed(key, row, block);
    for chunk in out.chunks_exact_mut(LANES) {
        step(&mut s0, &mut s1, chunk);
    }
}

/// Word `w` of block `block` of row `row`, alone (steps its lane `w / LANES` times).
pub fn word(key: u64, row: u64, block: u64, w: usize) -> u64 {
    let l = w % LANES;
    let c = row * MAX_GENERATED_COLS + block * BLOCK_COLS as u64;
    let mut a = counter_bits(key, 0, c + 2 * l as u64);
    let mut s1 = counter_bits(key, 0, c + 2 * l as u64 + 1);
    for _ in 0..w / LANES {
        let b = s1 ^ a;
        a = a.rotate_left(24) ^ b ^ (b << 16);
        s1 = b.rotate_left(37);
    }
    a.wrapping_add(s1)
}

/// The word of element `(row, col)` for uniform values.
pub fn element_word(key: u64, row: u64, col: u64) -> u64 {
    word(
        key,
        row,
        col / BLOCK_COLS as u64,
        (col % BLOCK_COLS as u64) as usize,
    )
}

/// Where a genotype's draws are: the word of its alleles, the shift of its 32-bit half, and
/// the word of its missing-call draw.
#[inline(always)]
fn genotype_place(col: u64) -> (usize, u32, usize) {
    let c = (col % BLOCK_COLS as u64) as usize;
    (c / 2, 32 * (c % 2) as u32, GENOTYPE_WORDS + c / 2)
}

/// Dosage code of one 32-bit half: alternative alleles among its two 16-bit draws.
#[inline(always)]
fn alleles(h: u64, t: u64) -> u64 {
    ((h & 0xFFFF) < t) as u64 + (((h >> 16) & 0xFFFF) < t) as u64
}

/// The genotype code of element `(row, col)` (0, 1, 2, or 3 for a missing call), alone.
pub fn genotype_code(key: u64, row: u64, col: u64, t: u64, missing: u64) -> u8 {
    let block = col / BLOCK_COLS as u64;
    let (w, shift, mw) = genotype_place(col);
    if missing != 0 && (word(key, row, block, mw) >> shift) & 0xFFFF_FFFF < missing {
        return 3;
    }
    alleles(word(key, row, block, w) >> shift, t) as u8
}

/// `out[k] = value(words[col0 + k])` along row `row`: the loop behind the row fills.
#[inline(always)]
fn map_row<T>(key: u64, row: u64, col0: u64, out: &mut [T], value: impl Fn(u64) -> T) {
    let mut words = [0u64; BLOCK_COLS];
    for (block, skip, range) in blocks(col0, out.len()) {
        let need = (skip + range.len()).div_ceil(LANES) * LANES;
        block_words(key, row, block, &mut words[..need]);
        for (o, &x) in out[range].iter_mut().zip(&words[skip..]) {
            *o = value(x);
        }
    }
}

/// The values of one step's `words` (words `w0..w0 + LANES` of a block) that are among the
/// wanted words `wanted`, one at a time through `one(at, value)`, `at` counted from `start`
/// for the first wanted word: a step that straddles the edge of a row's columns.
#[inline(always)]
fn straddle(
    words: &[u64; LANES],
    w0: usize,
    wanted: std::ops::Range<usize>,
    start: usize,
    one: &mut impl FnMut(usize, f64),
) {
    for (l, &x) in words.iter().enumerate() {
        let w = w0 + l;
        if wanted.contains(&w) {
            one(start + w - wanted.start, unit(x));
        }
    }
}

/// Fills `out` with the uniform values of row `row`, columns `col0..col0 + out.len()`.
pub fn uniform_row(key: u64, row: u64, col0: u64, out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512F and DQ run here (`available`).
        return unsafe { avx512::uniform_row(key, row, col0, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::only() {
        // SAFETY: AVX2 runs here (`only`).
        return unsafe { avx2::uniform_row(key, row, col0, out) };
    }
    uniform_row_auto(key, row, col0, out)
}

/// [`uniform_row`] rounded to f32.
pub fn uniform_row_f32(key: u64, row: u64, col0: u64, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        // SAFETY: AVX-512F and DQ run here (`available`).
        return unsafe { avx512::uniform_row_f32(key, row, col0, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::only() {
        // SAFETY: AVX2 runs here (`only`).
        return unsafe { avx2::uniform_row_f32(key, row, col0, out) };
    }
    uniform_row_f32_auto(key, row, col0, out)
}

/// [`uniform_row`] as the compiler vectorizes [`map_row`] (CPUs without AVX2, and AVX-512
/// ones without AVX-512DQ).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
fn uniform_row_auto(key: u64, row: u64, col0: u64, out: &mut [f64]) {
    map_row(key, row, col0, out, unit)
}

/// [`uniform_row_f32`] as the compiler vectorizes [`map_row`].
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
fn uniform_row_f32_auto(key: u64, row: u64, col0: u64, out: &mut [f32]) {
    map_row(key, row, col0, out, |x| unit(x) as f32)
}

/// The uniform rows written out for AVX2 without AVX-512: each step of the eight lanes
/// (two registers of state words each) becomes eight values in registers and is stored
/// once. The compiler's form of [`map_row`] wrote every block's words to a buffer, zeroed
/// for every row, and read them back: criterion `rsvd_tiles/generate_uniform_f64`, a
/// 256 × 512 tile on one core of a 2-core Zen 3 guest, 65 → 52 µs in f64, 67 → 60 µs in
/// f32. The values are
/// [`unit`]'s bits (the integer steps are exact, the subtraction and the rounding to f32
/// are IEEE's), as `rows_at_any_offset_match_elements` checks.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{blocks, seed, straddle, LANES};
    use std::arch::x86_64::*;

    /// True where AVX2 runs and AVX-512F does not.
    pub(super) fn only() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
            && !std::arch::is_x86_feature_detected!("avx512f")
    }

    /// `v` rotated left by `R` bits (`L = 64 − R`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn rotl<const R: i32, const L: i32>(v: __m256i) -> __m256i {
        _mm256_or_si256(_mm256_slli_epi64::<R>(v), _mm256_srli_epi64::<L>(v))
    }

    /// One xoroshiro128+ step of four lanes: their output words.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn step(s0: &mut __m256i, s1: &mut __m256i) -> __m256i {
        let a = *s0;
        let b = _mm256_xor_si256(*s1, a);
        let out = _mm256_add_epi64(a, *s1);
        *s0 = _mm256_xor_si256(
            _mm256_xor_si256(rotl::<24, 40>(a), b),
            _mm256_slli_epi64::<16>(b),
        );
        *s1 = rotl::<37, 27>(b);
        out
    }

    /// [`super::unit`] of four words.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn units(x: __m256i) -> __m256d {
        let bits = _mm256_or_si256(
            _mm256_srli_epi64::<12>(x),
            _mm256_set1_epi64x(0x3FF0_0000_0000_0000),
        );
        _mm256_sub_pd(_mm256_castsi256_pd(bits), _mm256_set1_pd(1.0))
    }

    /// The rows of [`super::uniform_row`] and [`super::uniform_row_f32`]: `put(at, lo, hi)`
    /// stores a step's eight values at `out[at..at + 8]`; the values of a step that
    /// straddles the wanted columns go one at a time through `one`.
    ///
    /// # Safety
    /// AVX2 runs here; `put` writes only `out[at..at + 8]` of a slice of `len` values.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn rows(
        key: u64,
        row: u64,
        col0: u64,
        len: usize,
        mut put: impl FnMut(usize, __m256d, __m256d),
        mut one: impl FnMut(usize, f64),
    ) {
        for (block, skip, range) in blocks(col0, len) {
            let (s0, s1) = seed(key, row, block);
            // SAFETY: the arrays hold eight lanes, two registers each.
            let (mut a0, mut a1, mut b0, mut b1) = unsafe {
                (
                    _mm256_loadu_si256(s0.as_ptr().cast()),
                    _mm256_loadu_si256(s0.as_ptr().add(4).cast()),
                    _mm256_loadu_si256(s1.as_ptr().cast()),
                    _mm256_loadu_si256(s1.as_ptr().add(4).cast()),
                )
            };
            let end = skip + range.len();
            let mut w0 = 0;
            while w0 < end {
                let lo = step(&mut a0, &mut b0);
                let hi = step(&mut a1, &mut b1);
                if w0 >= skip && w0 + LANES <= end {
                    put(range.start + w0 - skip, units(lo), units(hi));
                } else {
                    let mut words = [0u64; LANES];
                    // SAFETY: eight words.
                    unsafe {
                        _mm256_storeu_si256(words.as_mut_ptr().cast(), lo);
                        _mm256_storeu_si256(words.as_mut_ptr().add(4).cast(), hi);
                    }
                    straddle(&words, w0, skip..end, range.start, &mut one);
                }
                w0 += LANES;
            }
        }
    }

    /// [`super::uniform_row`] with AVX2.
    ///
    /// # Safety
    /// AVX2 runs here.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn uniform_row(key: u64, row: u64, col0: u64, out: &mut [f64]) {
        let (len, p) = (out.len(), out.as_mut_ptr());
        // SAFETY: `rows` hands out `at + 8 ≤ len` and `i < len`.
        unsafe {
            rows(
                key,
                row,
                col0,
                len,
                |at, lo, hi| {
                    _mm256_storeu_pd(p.add(at), lo);
                    _mm256_storeu_pd(p.add(at + 4), hi);
                },
                |i, v| *p.add(i) = v,
            )
        }
    }

    /// [`super::uniform_row_f32`] with AVX2 (`vcvtpd2ps` rounds to nearest, as `as f32`).
    ///
    /// # Safety
    /// AVX2 runs here.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn uniform_row_f32(key: u64, row: u64, col0: u64, out: &mut [f32]) {
        let (len, p) = (out.len(), out.as_mut_ptr());
        // SAFETY: `rows` hands out `at + 8 ≤ len` and `i < len`.
        unsafe {
            rows(
                key,
                row,
                col0,
                len,
                |at, lo, hi| {
                    let v = _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
                    _mm256_storeu_ps(p.add(at), v);
                },
                |i, v| *p.add(i) = v as f32,
            )
        }
    }
}

/// The uniform rows written out for AVX-512: a block's eight lanes are one register of
/// state words each, seeded by eight SplitMix64 hashes at once (`vpmullq`), and each step
/// becomes eight values in registers, stored once. Two whole blocks side by side step
/// together: one block's step depends on the last (three dependent instructions), and
/// alone it left the vector units idle half the time. The compiler's form of [`map_row`],
/// which AVX-512 CPUs ran until then, hashed the sixteen seeds one at a time and wrote
/// every block's words to a buffer, zeroed for every row, that it read back. Values are
/// [`unit`]'s bits, as `rows_at_any_offset_match_elements` checks.
///
/// Measured on one core of a 2-core Xeon KVM guest (family 6, model 207, AVX-512),
/// 2026-11-30, filling a 256 × 512 tile by rows (`Generated::fill_cols`, the fastest of
/// 3,000 tiles): f64 49–58 µs with the compiler's form, 42–45 µs with one block at a time,
/// 33–35 µs with two (23 → 31 GB/s); f32 48–54 → 37 µs, and 33.5 µs with its values
/// converted from the words' integers (`units_f32`) rather than from the f64 values. In
/// `rsvd` of a generated 50,000 × 20,000 matrix (k = 10, q = 0, two threads, eight runs
/// alternating with the previous binary), the first pass's median went from 1.375 to
/// 1.181 s and the residual check's from 0.458 to 0.411 s.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{blocks, straddle, BLOCK_COLS, GAMMA, LANES, MAX_GENERATED_COLS};
    use std::arch::x86_64::*;

    /// True where AVX-512F and AVX-512DQ (the 64-bit multiply of the seeds) run.
    pub(super) fn available() -> bool {
        static YES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *YES.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
        })
    }

    /// SplitMix64's finalizer of eight words ([`super::mix64`]).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn mix64(z: __m512i) -> __m512i {
        let z = _mm512_xor_si512(z, _mm512_srli_epi64::<30>(z));
        let z = _mm512_mullo_epi64(z, _mm512_set1_epi64(0xBF58_476D_1CE4_E5B9_u64 as i64));
        let z = _mm512_xor_si512(z, _mm512_srli_epi64::<27>(z));
        let z = _mm512_mullo_epi64(z, _mm512_set1_epi64(0x94D0_49BB_1331_11EB_u64 as i64));
        _mm512_xor_si512(z, _mm512_srli_epi64::<31>(z))
    }

    /// The starting states of block `block` of row `row` ([`super::seed`]): lane `l` from
    /// the counters `c + 2l` and `c + 2l + 1`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn seed(key: u64, row: u64, block: u64) -> (__m512i, __m512i) {
        let c = row * MAX_GENERATED_COLS + block * BLOCK_COLS as u64;
        // Lane l's counter is 2l past c.
        let apart = _mm512_mullo_epi64(
            _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0),
            _mm512_set1_epi64(GAMMA as i64),
        );
        states(key, c, apart)
    }

    /// The states of eight lanes whose counters are `c` plus the lanes of `apart`
    /// (given times γ): `counter_bits` of each counter (s0) and of the next (s1).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn states(key: u64, c: u64, apart: __m512i) -> (__m512i, __m512i) {
        // key + counter·γ, in wrapping arithmetic.
        let s0 = _mm512_add_epi64(
            _mm512_set1_epi64(key.wrapping_add(c.wrapping_mul(GAMMA)) as i64),
            apart,
        );
        let s1 = _mm512_add_epi64(s0, _mm512_set1_epi64(GAMMA as i64));
        (mix64(s0), mix64(s1))
    }

    /// One xoroshiro128+ step of the eight lanes: their output words.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn step(s0: &mut __m512i, s1: &mut __m512i) -> __m512i {
        let a = *s0;
        let b = _mm512_xor_si512(*s1, a);
        let out = _mm512_add_epi64(a, *s1);
        // rotl(a, 24) ^ b ^ (b << 16) in one three-way xor.
        *s0 = _mm512_ternarylogic_epi64::<0x96>(
            _mm512_rol_epi64::<24>(a),
            b,
            _mm512_slli_epi64::<16>(b),
        );
        *s1 = _mm512_rol_epi64::<37>(b);
        out
    }

    /// [`super::unit`] of eight words.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn units(x: __m512i) -> __m512d {
        let bits = _mm512_or_si512(
            _mm512_srli_epi64::<12>(x),
            _mm512_set1_epi64(0x3FF0_0000_0000_0000),
        );
        _mm512_sub_pd(_mm512_castsi512_pd(bits), _mm512_set1_pd(1.0))
    }

    /// [`super::unit`] of eight words rounded to f32: the word's top 52 bits `m` converted
    /// to f32 (rounded to nearest, as `as f32` rounds the f64 `m·2⁻⁵²`), times 2⁻⁵²
    /// (exact: a power of two, far from f32's limits). Two instructions fewer than the f64
    /// values converted.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn units_f32(x: __m512i) -> __m256 {
        let m = _mm512_cvtepu64_ps(_mm512_srli_epi64::<12>(x));
        _mm256_mul_ps(m, _mm256_set1_ps(f32::from_bits((127 - 52) << 23)))
    }

    /// The rows of [`super::uniform_row`] and [`super::uniform_row_f32`]: `put(at, words)`
    /// stores the values of a step's eight words at `out[at..at + 8]`; the values of a step that
    /// straddles the wanted columns go one at a time through `one`.
    ///
    /// # Safety
    /// AVX-512F and DQ run here; `put` writes only `out[at..at + 8]` of a slice of `len`
    /// values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn rows(
        key: u64,
        row: u64,
        col0: u64,
        len: usize,
        mut put: impl FnMut(usize, __m512i),
        mut one: impl FnMut(usize, f64),
    ) {
        let mut all = blocks(col0, len).peekable();
        while let Some((block, skip, range)) = all.next() {
            let whole =
                |skip: usize, r: &std::ops::Range<usize>| skip == 0 && r.len() == BLOCK_COLS;
            if whole(skip, &range) && matches!(all.peek(), Some((_, s, r)) if whole(*s, r)) {
                // Two whole blocks side by side: their steps are independent, so the two
                // chains of dependent instructions overlap.
                let next = all.next().expect("peeked").2.start;
                let (mut a0, mut a1) = seed(key, row, block);
                let (mut b0, mut b1) = seed(key, row, block + 1);
                for w0 in (0..BLOCK_COLS).step_by(LANES) {
                    let x = step(&mut a0, &mut a1);
                    let y = step(&mut b0, &mut b1);
                    put(range.start + w0, x);
                    put(next + w0, y);
                }
                continue;
            }
            let (mut s0, mut s1) = seed(key, row, block);
            let end = skip + range.len();
            let mut w0 = 0;
            while w0 < end {
                let x = step(&mut s0, &mut s1);
                if w0 >= skip && w0 + LANES <= end {
                    put(range.start + w0 - skip, x);
                } else {
                    let mut words = [0u64; LANES];
                    // SAFETY: eight words.
                    unsafe { _mm512_storeu_si512(words.as_mut_ptr().cast(), x) };
                    straddle(&words, w0, skip..end, range.start, &mut one);
                }
                w0 += LANES;
            }
        }
    }

    /// [`super::uniform_cols`] for `rows` a multiple of eight: lane `l` of eight rows'
    /// blocks in one register (a row per register lane), its sixteen seeds (two per row)
    /// hashed in two registers, where the compiler's form hashed them one at a time, and
    /// each step stored as eight values down a column. At 20 columns a lane takes three
    /// steps for its sixteen hashes, so the hashes were most of the work: `svd --rows
    /// 10000000 --cols 20 --chunk-rows 625000` on the 2-core Xeon guest (model 207), five
    /// runs alternating with the previous binary, 2026-11-30: whole run 447–553 ms (median
    /// 492) → 424–515 ms (median 449), pass 2 (U formed from values made again) median 256
    /// → 234 ms.
    ///
    /// # Safety
    /// AVX-512F and DQ run here; `rows` is a multiple of eight, and `out` holds value
    /// `(i, j)` at `j·ld + i` for every row and column given.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn uniform_cols(
        key: u64,
        row0: u64,
        rows: usize,
        col0: u64,
        cols: usize,
        out: &mut [f64],
        ld: usize,
    ) {
        debug_assert_eq!(rows % LANES, 0);
        // Row r of a register: its counter is 2²⁴·r past row 0's, its hash's input 2²⁴·r·γ.
        let rows_apart = _mm512_mullo_epi64(
            _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
            _mm512_set1_epi64(MAX_GENERATED_COLS.wrapping_mul(GAMMA) as i64),
        );
        for i0 in (0..rows).step_by(LANES) {
            for (block, skip, range) in blocks(col0, cols) {
                let first = block * BLOCK_COLS as u64;
                let end = skip + range.len();
                for l in 0..LANES.min(end) {
                    let c = (row0 + i0 as u64) * MAX_GENERATED_COLS + first + 2 * l as u64;
                    let (mut s0, mut s1) = states(key, c, rows_apart);
                    for t in 0..(end - l).div_ceil(LANES) {
                        let x = step(&mut s0, &mut s1);
                        let w = t * LANES + l;
                        if w >= skip {
                            let j = range.start + w - skip;
                            let o = &mut out[j * ld + i0..j * ld + i0 + LANES];
                            // SAFETY: eight values, inside `out` (the slice is checked).
                            unsafe { _mm512_storeu_pd(o.as_mut_ptr(), units(x)) };
                        }
                    }
                }
            }
        }
    }

    /// [`super::uniform_row`] with AVX-512.
    ///
    /// # Safety
    /// AVX-512F and DQ run here.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn uniform_row(key: u64, row: u64, col0: u64, out: &mut [f64]) {
        let (len, p) = (out.len(), out.as_mut_ptr());
        // SAFETY: `rows` hands out `at + 8 ≤ len` and `i < len`.
        unsafe {
            rows(
                key,
                row,
                col0,
                len,
                |at, x| _mm512_storeu_pd(p.add(at), units(x)),
                |i, v| *p.add(i) = v,
            )
        }
    }

    /// [`super::uniform_row_f32`] with AVX-512 (`vcvtpd2ps` rounds to nearest, as
    /// `as f32`).
    ///
    /// # Safety
    /// AVX-512F and DQ run here.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn uniform_row_f32(key: u64, row: u64, col0: u64, out: &mut [f32]) {
        let (len, p) = (out.len(), out.as_mut_ptr());
        // SAFETY: `rows` hands out `at + 8 ≤ len` and `i < len`.
        unsafe {
            rows(
                key,
                row,
                col0,
                len,
                |at, x| _mm256_storeu_ps(p.add(at), units_f32(x)),
                |i, v| *p.add(i) = v as f32,
            )
        }
    }
}

/// Uniform values of rows `row0..row0 + rows`, columns `col0..col0 + cols`, column-major:
/// value `(i, j)` at `out[j·ld + i]`. Eight rows at a time share the registers (lane `l`
/// of eight rows' blocks steps together), so narrow panels such as the exact SVD's
/// 20-column ones pay no per-row overhead and store whole registers down each column.
pub fn uniform_cols(
    key: u64,
    row0: u64,
    rows: usize,
    col0: u64,
    cols: usize,
    out: &mut [f64],
    ld: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if avx512::available() {
        let full = rows / LANES * LANES;
        // SAFETY: AVX-512F and DQ run here (`available`); the rows given are whole eights.
        unsafe { avx512::uniform_cols(key, row0, full, col0, cols, out, ld) };
        if full < rows {
            // The last rows (fewer than eight) one at a time, as below; value (i, j) of
            // them is at `out[full..][j·ld + i − full]`.
            uniform_cols_auto(
                key,
                row0 + full as u64,
                rows - full,
                col0,
                cols,
                &mut out[full..],
                ld,
            );
        }
        return;
    }
    uniform_cols_auto(key, row0, rows, col0, cols, out, ld)
}

/// [`uniform_cols`] as the compiler vectorizes it.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
fn uniform_cols_auto(
    key: u64,
    row0: u64,
    rows: usize,
    col0: u64,
    cols: usize,
    out: &mut [f64],
    ld: usize,
) {
    let full = rows / LANES * LANES;
    let mut xs = [[0u64; LANES]; BLOCK_COLS / LANES];
    for i0 in (0..full).step_by(LANES) {
        for (block, skip, range) in blocks(col0, cols) {
            let first = block * BLOCK_COLS as u64;
            let end = skip + range.len();
            for l in 0..LANES.min(end) {
                // Lane l of the eight rows' blocks, one row per register lane.
                let (mut s0, mut s1) = ([0u64; LANES], [0u64; LANES]);
                for r in 0..LANES {
                    let c = (row0 + (i0 + r) as u64) * MAX_GENERATED_COLS + first + 2 * l as u64;
                    s0[r] = counter_bits(key, 0, c);
                    s1[r] = counter_bits(key, 0, c + 1);
                }
                let steps = (end - l).div_ceil(LANES);
                for x in &mut xs[..steps] {
                    step(&mut s0, &mut s1, x);
                }
                for (t, x) in xs[..steps].iter().enumerate() {
                    let w = t * LANES + l;
                    if w >= skip {
                        let j = range.start + w - skip;
                        let o = &mut out[j * ld + i0..j * ld + i0 + LANES];
                        for (o, &x) in o.iter_mut().zip(x) {
                            *o = unit(x);
                        }
                    }
                }
            }
        }
    }
    let mut words = [0u64; BLOCK_COLS];
    for i in full..rows {
        for (block, skip, range) in blocks(col0, cols) {
            let need = (skip + range.len()).div_ceil(LANES) * LANES;
            block_words(key, row0 + i as u64, block, &mut words[..need]);
            for (k, &x) in words[skip..skip + range.len()].iter().enumerate() {
                out[(range.start + k) * ld + i] = unit(x);
            }
        }
    }
}

/// The raw words of row `row`, columns `col0..col0 + out.len()` (uniform placement: word
/// `c mod 256` of block `⌊c / 256⌋`).
pub fn words_row(key: u64, row: u64, col0: u64, out: &mut [u64]) {
    map_row(key, row, col0, out, |x| x)
}

/// The blocks that columns `col0..col0 + len` touch, as `(block, skip, range)`: `range` is
/// where the block's columns land in the output, `skip` how many of the block's first
/// columns lie before `col0`. (An iterator rather than a callback: closures do not inherit
/// the target features of the multiversioned function around them, and a large one would
/// not be inlined into it and so would lose its SIMD code.)
#[inline(always)]
fn blocks(col0: u64, len: usize) -> impl Iterator<Item = (u64, usize, std::ops::Range<usize>)> {
    let mut done = 0usize;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let col = col0 + done as u64;
        let block = col / BLOCK_COLS as u64;
        let skip = (col % BLOCK_COLS as u64) as usize;
        let take = (BLOCK_COLS - skip).min(len - done);
        let range = done..done + take;
        done += take;
        Some((block, skip, range))
    })
}

/// Per-column allele thresholds of a row: one for the whole row, or one per population
/// over contiguous column runs.
#[derive(Clone, Copy, Debug)]
pub enum Thresholds<'a> {
    /// Every column has this threshold.
    Row(u64),
    /// Population `q` covers columns `starts[q]..starts[q + 1]` and has threshold `t[q]`.
    Populations {
        /// The first column of each population, then the column count.
        starts: &'a [u64],
        /// The threshold of each population.
        t: &'a [u64],
    },
}

impl<'a> Thresholds<'a> {
    /// One threshold `t[0]` for the row when there are no population `starts` (or one
    /// population), else [`Thresholds::Populations`].
    pub fn new(starts: &'a [u64], t: &'a [u64]) -> Self {
        if starts.len() <= 2 {
            Thresholds::Row(t[0])
        } else {
            Thresholds::Populations { starts, t }
        }
    }

    /// The population of one column (0 for a row without populations).
    fn population(&self, col: u64) -> usize {
        match *self {
            Thresholds::Row(_) => 0,
            Thresholds::Populations { starts, t } => {
                starts[1..].partition_point(|&s| s <= col).min(t.len() - 1)
            }
        }
    }

    /// The threshold of one column.
    pub fn threshold_of(&self, col: u64) -> u64 {
        match *self {
            Thresholds::Row(t) => t,
            Thresholds::Populations { t, .. } => t[self.population(col)],
        }
    }

    /// The threshold of every column of a block, when the whole block lies in one
    /// population (two populations with equal thresholds do not count: the columns
    /// between them may belong to others).
    fn uniform_over(&self, block: u64) -> Option<u64> {
        let first = block * BLOCK_COLS as u64;
        let q = self.population(first);
        (q == self.population(first + BLOCK_COLS as u64 - 1)).then(|| self.threshold_of(first))
    }
}

/// Dosage codes of one block, one byte per column: `tw(w)` gives the thresholds of word
/// `w`'s even and odd columns.
#[inline(always)]
fn block_codes(
    words: &[u64],
    tw: impl Fn(usize) -> (u64, u64),
    missing: u64,
    out: &mut [u16; GENOTYPE_WORDS],
) {
    // out[w] holds the codes of columns 2w (low byte) and 2w + 1 (high byte).
    for (w, o) in out.iter_mut().enumerate() {
        let x = words[w];
        let (te, to) = tw(w);
        let mut d0 = alleles(x, te);
        let mut d1 = alleles(x >> 32, to);
        if missing != 0 {
            let m = words[GENOTYPE_WORDS + w];
            d0 = if (m & 0xFFFF_FFFF) < missing { 3 } else { d0 };
            d1 = if (m >> 32) < missing { 3 } else { d1 };
        }
        *o = (d0 | (d1 << 8)) as u16;
    }
}

/// Makes the codes of a whole block into `codes` (column `c` in byte `c` of the
/// little-endian pairs).
#[inline(always)]
fn genotype_block(
    key: u64,
    row: u64,
    block: u64,
    thresholds: &Thresholds<'_>,
    missing: u64,
    words: &mut [u64; BLOCK_COLS],
    codes: &mut [u16; GENOTYPE_WORDS],
) {
    let n = if missing != 0 {
        BLOCK_COLS
    } else {
        GENOTYPE_WORDS
    };
    block_words(key, row, block, &mut words[..n]);
    match thresholds.uniform_over(block) {
        Some(t) => block_codes(&words[..n], |_| (t, t), missing, codes),
        None => {
            let first = block * BLOCK_COLS as u64;
            let mut tw = [(0u64, 0u64); GENOTYPE_WORDS];
            for (w, t) in tw.iter_mut().enumerate() {
                let c = first + 2 * w as u64;
                *t = (thresholds.threshold_of(c), thresholds.threshold_of(c + 1));
            }
            block_codes(&words[..n], |w| tw[w], missing, codes)
        }
    }
}

/// Dosages (−1 for a missing call) of row `row`, columns `col0..col0 + out.len()`.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
pub fn dosage_row(
    key: u64,
    row: u64,
    col0: u64,
    starts: &[u64],
    t: &[u64],
    missing: u64,
    out: &mut [i8],
) {
    let thresholds = &Thresholds::new(starts, t);
    let mut words = [0u64; BLOCK_COLS];
    let mut codes = [0u16; GENOTYPE_WORDS];
    for (block, skip, range) in blocks(col0, out.len()) {
        genotype_block(key, row, block, thresholds, missing, &mut words, &mut codes);
        let mut bytes = [0u8; BLOCK_COLS];
        for (b, &c) in bytes.chunks_exact_mut(2).zip(&codes) {
            b.copy_from_slice(&c.to_le_bytes());
        }
        for (o, &code) in out[range].iter_mut().zip(&bytes[skip..]) {
            *o = if code == 3 { -1 } else { code as i8 };
        }
    }
}

/// Codes of row `row` (all `cols` columns) 2-bit packed, four per byte, low bits first
/// (code 3 is a missing call, padding codes are 0), into `out` (`⌈cols / 4⌉` bytes), and
/// the row's counts of codes 1, 2 and 3.
pub fn packed_row(
    key: u64,
    row: u64,
    cols: u64,
    starts: &[u64],
    t: &[u64],
    missing: u64,
    out: &mut [u8],
) -> [u64; 3] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512BW (and so AVX-512F).
        return unsafe { packed_row_avx512(key, row, cols, starts, t, missing, out) };
    }
    packed_row_portable(key, row, cols, starts, t, missing, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
unsafe fn packed_row_avx512(
    key: u64,
    row: u64,
    cols: u64,
    starts: &[u64],
    t: &[u64],
    missing: u64,
    out: &mut [u8],
) -> [u64; 3] {
    packed_row_with::<Avx512Masks>(key, row, cols, starts, t, missing, out)
}

#[multiversion::multiversion(targets("x86_64+avx2+fma"))]
fn packed_row_portable(
    key: u64,
    row: u64,
    cols: u64,
    starts: &[u64],
    t: &[u64],
    missing: u64,
    out: &mut [u8],
) -> [u64; 3] {
    packed_row_with::<ScalarMasks>(key, row, cols, starts, t, missing, out)
}

#[inline(always)]
fn packed_row_with<M: Masks>(
    key: u64,
    row: u64,
    cols: u64,
    starts: &[u64],
    t: &[u64],
    missing: u64,
    out: &mut [u8],
) -> [u64; 3] {
    let thresholds = &Thresholds::new(starts, t);
    let mut words = [0u64; BLOCK_COLS];
    let mut codes = [0u16; GENOTYPE_WORDS];
    let bytes = cols.div_ceil(4) as usize;
    let out = &mut out[..bytes];
    let n = if missing != 0 {
        BLOCK_COLS
    } else {
        GENOTYPE_WORDS
    };
    for (block, dest) in out.chunks_mut(BLOCK_COLS / 4).enumerate() {
        let block = block as u64;
        if let Some(t) = thresholds.uniform_over(block) {
            // One threshold for the block: compare 16-bit draws by the register, pack from
            // the comparison masks (see `pack16`).
            block_words(key, row, block, &mut words[..n]);
            let mut packed = [0u8; BLOCK_COLS / 4];
            for (g, p) in packed.chunks_exact_mut(4).enumerate() {
                let a = &words[LANES * g..LANES * (g + 1)];
                let m = if missing != 0 {
                    let w = GENOTYPE_WORDS + LANES * g;
                    M::missing(&words[w..w + LANES], missing)
                } else {
                    0
                };
                p.copy_from_slice(&pack16(M::alleles(a, t), m).to_le_bytes());
            }
            let len = dest.len();
            dest.copy_from_slice(&packed[..len]);
            continue;
        }
        genotype_block(key, row, block, thresholds, missing, &mut words, &mut codes);
        // Four codes (bytes) in a u32 gather into one byte, as `pack_row` does.
        for (k, o) in dest.iter_mut().enumerate() {
            let x = codes[2 * k] as u32 | (codes[2 * k + 1] as u32) << 16;
            *o = (x | x >> 6 | x >> 12 | x >> 18) as u8;
        }
    }
    // Codes past the last column are padding: zero them, so they count as nothing.
    let tail = (cols % 4) as u32;
    if tail != 0 {
        out[bytes - 1] &= (1u8 << (2 * tail)) - 1;
    }
    count_codes(out)
}

/// The comparisons of a group of eight words (sixteen columns) as bit masks.
trait Masks {
    /// Bit `f`: field `f` (16 bits, little-endian order) of the eight words is below `t`,
    /// i.e. that allele draw is the alternative allele. Bits `2k` and `2k + 1` are then the
    /// two alleles of the group's column `k`.
    fn alleles(words: &[u64], t: u64) -> u32;
    /// Bit `k`: the 32-bit half `k` of the eight missing-call words is below `missing`,
    /// i.e. column `k` of the group is a missing call.
    fn missing(words: &[u64], missing: u64) -> u32;
}

/// [`Masks`] one field at a time (the definition, and the code for CPUs without AVX-512).
struct ScalarMasks;

impl Masks for ScalarMasks {
    #[inline(always)]
    fn alleles(words: &[u64], t: u64) -> u32 {
        let mut m = 0u32;
        for (w, &x) in words[..LANES].iter().enumerate() {
            for f in 0..4 {
                m |= (((x >> (16 * f)) & 0xFFFF < t) as u32) << (4 * w + f);
            }
        }
        m
    }

    #[inline(always)]
    fn missing(words: &[u64], missing: u64) -> u32 {
        let mut k = 0u32;
        for (w, &x) in words[..LANES].iter().enumerate() {
            k |= (((x & 0xFFFF_FFFF) < missing) as u32) << (2 * w);
            k |= (((x >> 32) < missing) as u32) << (2 * w + 1);
        }
        k
    }
}

/// [`Masks`] by one AVX-512 comparison each. Only used where the CPU has AVX-512BW.
#[cfg(target_arch = "x86_64")]
struct Avx512Masks;

#[cfg(target_arch = "x86_64")]
impl Masks for Avx512Masks {
    #[inline(always)]
    fn alleles(words: &[u64], t: u64) -> u32 {
        use std::arch::x86_64::*;
        let words = &words[..LANES];
        // SAFETY: eight words are 64 readable bytes; only reached from
        // `packed_row_avx512`, which runs where the CPU has AVX-512BW. Thresholds are
        // below 2¹⁶ (`allele_threshold`).
        unsafe {
            let v = _mm512_loadu_si512(words.as_ptr().cast());
            _mm512_cmplt_epu16_mask(v, _mm512_set1_epi16(t as u16 as i16))
        }
    }

    #[inline(always)]
    fn missing(words: &[u64], missing: u64) -> u32 {
        use std::arch::x86_64::*;
        let words = &words[..LANES];
        // SAFETY: as above (AVX-512F); thresholds are below 2³² (`missing_threshold`).
        unsafe {
            let v = _mm512_loadu_si512(words.as_ptr().cast());
            _mm512_cmplt_epu32_mask(v, _mm512_set1_epi32(missing as u32 as i32)) as u32
        }
    }
}

/// Sixteen packed codes from the allele mask `a` (bits `2k`, `2k + 1`: column `k`'s
/// alleles) and the missing mask `m` (bit `k`): the dosage `b₀ + b₁` is code
/// `(b₀ ⊕ b₁) | (b₀ ∧ b₁) << 1`, and a missing call sets both bits.
#[inline(always)]
fn pack16(a: u32, m: u32) -> u32 {
    let lo = a & 0x5555_5555;
    let hi = (a >> 1) & 0x5555_5555;
    let mut codes = (lo ^ hi) | ((lo & hi) << 1);
    if m != 0 {
        // Bit k → bits 2k and 2k + 1.
        let mut x = m & 0xFFFF;
        x = (x | x << 8) & 0x00FF_00FF;
        x = (x | x << 4) & 0x0F0F_0F0F;
        x = (x | x << 2) & 0x3333_3333;
        x = (x | x << 1) & 0x5555_5555;
        codes |= x * 3;
    }
    codes
}

/// How many codes 1, 2 and 3 the packed bytes hold.
pub fn count_codes(bytes: &[u8]) -> [u64; 3] {
    const LOW: u64 = 0x5555_5555_5555_5555;
    let mut c = [0u64; 3];
    let mut add = |x: u64| {
        let lo = x & LOW;
        let hi = (x >> 1) & LOW;
        c[0] += (lo & !hi).count_ones() as u64;
        c[1] += (hi & !lo).count_ones() as u64;
        c[2] += (lo & hi).count_ones() as u64;
    };
    let mut chunks = bytes.chunks_exact(8);
    for ch in &mut chunks {
        add(u64::from_le_bytes(ch.try_into().expect("eight bytes")));
    }
    let mut last = [0u8; 8];
    let rest = chunks.remainder();
    last[..rest.len()].copy_from_slice(rest);
    add(u64::from_le_bytes(last));
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar_block(key: u64, row: u64, block: u64) -> Vec<u64> {
        (0..BLOCK_COLS).map(|w| word(key, row, block, w)).collect()
    }

    #[test]
    fn block_words_are_the_lane_definition() {
        for (key, row, block) in [(1u64, 0u64, 0u64), (77, 5, 3), (u64::MAX, 1 << 30, 65_000)] {
            let mut fast = [0u64; BLOCK_COLS];
            block_words(key, row, block, &mut fast);
            assert_eq!(fast.to_vec(), scalar_block(key, row, block));
            let mut short = [0u64; 24];
            block_words(key, row, block, &mut short);
            assert_eq!(short, fast[..24]);
        }
    }

    /// The reference xoroshiro128+ (Blackman & Vigna's `next()`), one lane at a time.
    #[test]
    fn lanes_are_xoroshiro128_plus() {
        let (s0, s1) = seed(9, 2, 1);
        let words = scalar_block(9, 2, 1);
        for l in 0..LANES {
            let mut s = [s0[l], s1[l]];
            for t in 0..BLOCK_COLS / LANES {
                let r = s[0].wrapping_add(s[1]);
                let x = s[1] ^ s[0];
                s[0] = s[0].rotate_left(24) ^ x ^ (x << 16);
                s[1] = x.rotate_left(37);
                assert_eq!(words[t * LANES + l], r, "lane {l} step {t}");
            }
        }
    }

    #[test]
    fn rows_at_any_offset_match_elements() {
        for (col0, len) in [
            (0u64, 700usize),
            (3, 250),
            (255, 2),
            (256, 256),
            (1000, 37),
            (517, 8),
            (8, 7),
            // Whole blocks in pairs, then one alone, or a pair after a partial block.
            (256, 1024),
            (0, 768),
            (200, 600),
        ] {
            let (mut a, mut a2) = (vec![0f64; len], vec![0f64; len]);
            let (mut b, mut b2) = (vec![0f32; len], vec![0f32; len]);
            uniform_row(5, 11, col0, &mut a);
            uniform_row_f32(5, 11, col0, &mut b);
            // The compiler's form too, where the written-out AVX2 one runs instead.
            uniform_row_auto(5, 11, col0, &mut a2);
            uniform_row_f32_auto(5, 11, col0, &mut b2);
            for k in 0..len {
                let want = unit(element_word(5, 11, col0 + k as u64));
                assert_eq!(a[k].to_bits(), want.to_bits(), "col {}", col0 + k as u64);
                assert_eq!(a2[k].to_bits(), want.to_bits(), "col {}", col0 + k as u64);
                assert_eq!(b[k].to_bits(), (want as f32).to_bits());
                assert_eq!(b2[k].to_bits(), (want as f32).to_bits());
            }
        }
    }

    #[test]
    fn column_major_rows_match_elements() {
        for (rows, col0, cols) in [
            (19usize, 0u64, 20usize),
            (8, 250, 300),
            (3, 7, 1),
            (17, 512, 256),
        ] {
            let ld = rows + 2;
            let mut out = vec![f64::NAN; ld * cols];
            uniform_cols(4, 100, rows, col0, cols, &mut out, ld);
            for i in 0..rows {
                for j in 0..cols {
                    let want = unit(element_word(4, 100 + i as u64, col0 + j as u64));
                    assert_eq!(out[j * ld + i].to_bits(), want.to_bits(), "({i}, {j})");
                }
            }
            assert!(out.chunks(ld).all(|c| c[rows..].iter().all(|v| v.is_nan())));
        }
    }

    #[test]
    fn unit_is_in_range_and_exact() {
        assert_eq!(unit(0), 0.0);
        assert_eq!(unit(u64::MAX), 1.0 - f64::EPSILON);
        assert_eq!(unit(1 << 63), 0.5);
    }

    #[test]
    fn packed_and_dosage_rows_match_elements() {
        let starts = [0u64, 100, 390, 700];
        let ts = [allele_threshold(0.1), allele_threshold(0.45), 9];
        for missing in [0, missing_threshold(0.2)] {
            for th in [
                Thresholds::Row(allele_threshold(0.3)),
                Thresholds::Populations {
                    starts: &starts,
                    t: &ts,
                },
            ] {
                for cols in [1u64, 5, 255, 256, 257, 700] {
                    let th = match th {
                        Thresholds::Populations { .. } if cols < 700 => {
                            Thresholds::Row(allele_threshold(0.3))
                        }
                        t => t,
                    };
                    let mut packed = vec![0xFFu8; cols.div_ceil(4) as usize + 3];
                    let (st, t): (&[u64], Vec<u64>) = match th {
                        Thresholds::Row(t) => (&[], vec![t]),
                        Thresholds::Populations { starts, t } => (starts, t.to_vec()),
                    };
                    let counts = packed_row(7, 3, cols, st, &t, missing, &mut packed);
                    let mut dosages = vec![0i8; cols as usize];
                    dosage_row(7, 3, 0, st, &t, missing, &mut dosages);
                    let mut want = [0u64; 3];
                    for c in 0..cols {
                        let code = genotype_code(7, 3, c, th.threshold_of(c), missing);
                        let got = (packed[c as usize / 4] >> (2 * (c % 4))) & 3;
                        assert_eq!(got, code, "cols {cols} col {c}");
                        let d = dosages[c as usize];
                        assert_eq!(if d < 0 { 3 } else { d as u8 }, code);
                        if code > 0 {
                            want[code as usize - 1] += 1;
                        }
                    }
                    assert_eq!(counts, want, "cols {cols}");
                    if cols % 4 != 0 {
                        let last = packed[cols as usize / 4];
                        assert_eq!(last >> (2 * (cols % 4)), 0, "padding of {cols}");
                    }
                    assert_eq!(
                        packed[cols.div_ceil(4) as usize],
                        0xFF,
                        "wrote past the row"
                    );
                    if missing == 0 {
                        assert_eq!(want[2], 0, "missing calls without a missing rate");
                    } else if cols >= 256 {
                        assert!(want[2] > 0, "no missing call in {cols} at 20 %");
                    }
                }
            }
        }
    }

    /// Populations 0 and 3 of a 31-sample block share a threshold (both frequencies at the
    /// clamp, common with a large F_ST): the block was taken for one population, and the
    /// samples of populations 1 and 2 were drawn with the wrong threshold.
    #[test]
    fn equal_thresholds_at_a_blocks_ends_do_not_make_it_one_population() {
        let starts = [0u64, 8, 16, 24, 31];
        let t = [66u64, 40_000, 20_000, 66];
        for missing in [0, missing_threshold(0.05)] {
            let mut packed = [0u8; 8];
            packed_row(5, 7, 31, &starts, &t, missing, &mut packed);
            let mut dosages = [0i8; 31];
            dosage_row(5, 7, 0, &starts, &t, missing, &mut dosages);
            let th = Thresholds::new(&starts, &t);
            for c in 0..31u64 {
                let code = genotype_code(5, 7, c, th.threshold_of(c), missing);
                assert_eq!(
                    (packed[c as usize / 4] >> (2 * (c % 4))) & 3,
                    code,
                    "col {c}"
                );
                let d = dosages[c as usize];
                assert_eq!(if d < 0 { 3 } else { d as u8 }, code, "col {c}");
            }
            assert!(
                dosages[8..24].iter().any(|&d| d > 0),
                "populations 1 and 2 drew"
            );
        }
    }

    /// The AVX-512 comparisons (where this CPU has them) and the portable ones pack the
    /// same bytes, thresholds at their extremes included.
    #[test]
    fn packed_rows_do_not_depend_on_the_instruction_set() {
        for (t, missing) in [(1u64, 0u64), (0xFFFF, 0), (30_000, 1), (9, u32::MAX as u64)] {
            for cols in [16u64, 1000] {
                let mut a = vec![0u8; cols.div_ceil(4) as usize];
                let mut b = a.clone();
                let ca = packed_row(3, 8, cols, &[], &[t], missing, &mut a);
                let cb = packed_row_portable(3, 8, cols, &[], &[t], missing, &mut b);
                assert_eq!((a, ca), (b, cb), "t {t} missing {missing} cols {cols}");
            }
        }
    }

    #[test]
    fn dosage_frequencies_follow_the_thresholds() {
        let p = 0.3;
        let mut d = vec![0i8; 200_000];
        dosage_row(
            1,
            0,
            0,
            &[],
            &[allele_threshold(p)],
            missing_threshold(0.1),
            &mut d,
        );
        let missing = d.iter().filter(|&&v| v < 0).count() as f64 / d.len() as f64;
        let calls: Vec<f64> = d.iter().filter(|&&v| v >= 0).map(|&v| v as f64).collect();
        let mean = calls.iter().sum::<f64>() / calls.len() as f64;
        assert!((missing - 0.1).abs() < 0.005, "missing {missing}");
        assert!((mean - 2.0 * p).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn count_codes_counts_every_byte() {
        let bytes: Vec<u8> = (0..=255u8).chain(0..13).collect();
        let mut want = [0u64; 3];
        for &b in &bytes {
            for k in 0..4 {
                let c = (b >> (2 * k)) & 3;
                if c > 0 {
                    want[c as usize - 1] += 1;
                }
            }
        }
        assert_eq!(count_codes(&bytes), want);
    }
}
