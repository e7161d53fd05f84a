//! Tiles of a panel for the randomized passes, and the GEMMs that consume them.
//!
//! # Why tiles
//!
//! A randomized pass multiplies every value of the matrix with a thin matrix (`Ω`, `Z` or
//! `Q`, 20–30 columns). The values are produced (generated, decoded, or unpacked from 2-bit
//! genotypes) one tile of [`TILE_ROWS`] rows × [`TILE_COLS`] columns at a time, straight
//! into a buffer that stays in the core's L2 cache, and BLAS multiplies the tile while it is
//! there. No pass ever holds a float copy of a whole panel unless the memory plan made the
//! panel resident.
//!
//! # Genotypes
//!
//! Dosages are kept 2-bit packed when resident (four per byte; code 3 is a missing call).
//! Each variant (row) is standardized on the fly, `x = (g − 2p)/√(2p(1−p))` with `p` the
//! allele frequency of its non-missing calls, and a missing call is imputed to the mean,
//! i.e. `x = 0`. Variants with `p = 0` or `p = 1` (no variance) are dropped: their rows are
//! zero. The per-row mean and scale are computed when the row is first produced, from the
//! whole row, so tiles of any width standardize identically.
//!
//! The passes take genotype tiles packed ([`Tile::Packed`]), with each row's table of the
//! four standardized codes. With f32 tiles on CPUs with AVX-512F they never see the
//! standardized values: [`crate::fused`] standardizes in registers as it multiplies.
//! Otherwise the rows are standardized into a float tile for BLAS, the rows of excluded
//! and dropped variants (all zeros) left out where they are a quarter of the tile or more
//! ([`PackedTile::live_rows`]).

use std::ops::Range;
use std::sync::Arc;

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis, ShapeBuilder};
use rankwise_sources::FetchAhead;
use rankwise_sources::{
    Dist, GenotypeSource, PanelBuffer, PanelLease, PanelSource, PanelValues, StoredPanels,
};

pub(crate) use crate::blas::{gemm, Blas};
pub(crate) use crate::layout::{PackedTile, RowCounts, RowScale, TILE_COLS, TILE_ROWS};
pub(crate) use crate::reads::PanelSegments;
use crate::reads::{PanelRead, StoredReads};
use crate::real::sum_squares_view;
pub(crate) use crate::real::Real;
use crate::variants::VariantFilter;
use crate::LinalgError;

/// What the randomized passes multiply with.
#[derive(Clone)]
pub enum Operand {
    /// A float matrix (generated, or read).
    Dense(Arc<dyn PanelSource>),
    /// Genotype dosages, standardized per variant on the fly, the variants the filter
    /// excludes zero.
    Genotypes(Arc<dyn GenotypeSource>, VariantFilter),
}

impl FetchAhead for Operand {
    fn fetch_ahead(&self, owner: u64, buffers: usize, upcoming: &[Range<u64>]) {
        if let Some(s) = self.stored() {
            s.fetch_ahead(owner, buffers, upcoming);
        }
    }

    fn drop_fetched(&self, owner: u64) {
        if let Some(s) = self.stored() {
            s.drop_fetched(owner);
        }
    }
}

impl Operand {
    /// `(rows, cols)`.
    pub fn shape(&self) -> (u64, u64) {
        match self {
            Operand::Dense(s) => s.shape(),
            Operand::Genotypes(s, _) => s.shape(),
        }
    }

    /// Description for reports and errors.
    pub fn describe(&self) -> String {
        match self {
            Operand::Dense(s) => s.describe(),
            Operand::Genotypes(s, _) => s.describe(),
        }
    }

    /// The stored-chunk reader, for operands read from storage.
    pub fn stored(&self) -> Option<&dyn StoredPanels> {
        match self {
            Operand::Dense(s) => s.stored(),
            Operand::Genotypes(s, _) => s.stored(),
        }
    }

    /// How the read-aheads read this operand, for operands read from storage.
    pub(crate) fn stored_reads(&self) -> Option<StoredReads> {
        self.stored()?;
        let op = self.clone();
        Some(StoredReads {
            read: Arc::new(move |rows, buf: &mut PanelBuffer| {
                op.stored()
                    .expect("the operand was checked to be stored")
                    .read_panel(rows, buf)
            }),
            ahead: Arc::new(self.clone()),
        })
    }

    /// Bytes a resident panel of `rows` rows keeps.
    pub fn resident_bytes(&self, rows: u64, precision: Precision) -> u64 {
        let n = self.shape().1;
        let width = match precision {
            Precision::F64 => 8,
            Precision::F32 => 4,
        };
        match self {
            Operand::Dense(s) => match s.stored() {
                Some(st) => rows * n * st.element_type().size() as u64,
                None => rows * n * width,
            },
            Operand::Genotypes(..) => rows * (n.div_ceil(4) + 16),
        }
    }
}

impl RowCounts {
    /// Σ x² of the row standardized by `s` into tiles of type `T`, from the counts alone:
    /// each dosage contributes its table value, rounded to `T`, squared. The first pass
    /// measures the total variance this way rather than summing every tile's squares.
    pub fn sum_squares<T: Real>(&self, s: RowScale) -> f64 {
        let t = s.table();
        (0..3)
            .map(|c| {
                let v = T::from_f64(t[c]).to_f64();
                self.dosages[c] as f64 * (v * v)
            })
            .sum()
    }
}

/// Precision of the tiles and of their products with the thin matrices. Sums over tiles
/// are always accumulated in f64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f64 tiles and DGEMM.
    F64,
    /// f32 tiles and SGEMM (twice the GEMM rate, half the resident bytes); each tile's
    /// product is added to f64 accumulators.
    F32,
}

impl Precision {
    /// Its name in messages and reports (`f64`, `f32`), as serialized.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
        }
    }

    /// Bytes of one tile value.
    pub fn bytes(self) -> usize {
        match self {
            Precision::F64 => 8,
            Precision::F32 => 4,
        }
    }
}

/// What tiles of an element type (f64 or f32) need beyond its numbers and BLAS: how they
/// are filled from sources and decoded panels, how genotype codes are standardized into
/// them, how they are multiplied (by the fused kernels where those run), and how a
/// resident panel of them is kept.
pub trait TileReal: Blas {
    /// Tile of a float source.
    fn fill(
        src: &dyn PanelSource,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, Self>,
    ) -> Result<(), rankwise_sources::SourceError>;
    /// Tile `rows × cols` (buffer coordinates) of a decoded panel.
    fn fill_buffer(
        buf: &PanelBuffer,
        rows: Range<usize>,
        cols: Range<usize>,
        out: ArrayViewMut2<'_, Self>,
    );
    /// The values of a decoded panel, when they are stored in this type (tiles are then
    /// views into the panel, not copies).
    fn values_of(buf: &PanelBuffer) -> Option<&[Self]>;
    /// Rows of a source that holds them in memory in this type
    /// ([`PanelSource::rows_in_memory`]): tiles are then views of them, not copies.
    fn in_memory(src: &dyn PanelSource, rows: Range<u64>) -> Option<ArrayView2<'_, Self>> {
        let _ = (src, rows);
        None
    }
    /// Standardizes `out.len()` packed dosages starting at the first code of `bytes`.
    fn standardize_packed(bytes: &[u8], s: RowScale, out: &mut [Self]);
    /// The fused kernels' layout of `Ω` (`n × w`), where they run for this type; made once
    /// per pass for [`TileReal::ab_tile`].
    fn omega_layout(omega: ArrayView2<'_, Self>) -> Option<crate::fused::OmegaLayout> {
        let _ = omega;
        None
    }
    /// `y += T·Ω[c0.., ..]` for a tile whose first column is column `c0`, with `y`
    /// `rows × w`: by the fused kernels with `layout` ([`TileReal::omega_layout`] of `omega`)
    /// where they run, else by [`gemm`] (a packed tile standardized into `scratch` first)
    /// and an f64 addition.
    fn ab_tile(
        t: Tile<'_, Self>,
        omega: ArrayView2<'_, Self>,
        layout: Option<&crate::fused::OmegaLayout>,
        c0: usize,
        y: ArrayViewMut2<'_, f64>,
        scratch: &mut Vec<Self>,
    ) {
        let _ = layout;
        ab_tile_by_gemm(t, omega, c0, y, scratch);
    }
    /// `b += Qᵀ·T` for a tile, `q` `rows × g` and `b` `g × cols`: packed, by the fused
    /// kernels where they run; otherwise by [`gemm`] and an f64 addition (for float tiles
    /// the skinny kernel where it runs: `crate::fused` says why not the fused one).
    fn atb_tile(
        t: Tile<'_, Self>,
        q: ArrayView2<'_, Self>,
        b: ArrayViewMut2<'_, f64>,
        scratch: &mut Vec<Self>,
    ) {
        atb_tile_by_gemm(t, q, b, scratch);
    }
    /// Wraps a resident panel.
    fn store(a: Array2<Self>) -> Stored;
    /// The resident panel, if it has this precision.
    fn stored(s: &Stored) -> Option<ArrayView2<'_, Self>>;
}

impl TileReal for f64 {
    fn fill(
        src: &dyn PanelSource,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), rankwise_sources::SourceError> {
        src.fill_cols(rows, cols, out)
    }
    fn fill_buffer(
        buf: &PanelBuffer,
        rows: Range<usize>,
        cols: Range<usize>,
        out: ArrayViewMut2<'_, f64>,
    ) {
        buf.tile_f64(rows, cols, out)
    }
    fn in_memory(src: &dyn PanelSource, rows: Range<u64>) -> Option<ArrayView2<'_, f64>> {
        src.rows_in_memory(rows)
    }
    fn values_of(buf: &PanelBuffer) -> Option<&[f64]> {
        match &buf.values {
            PanelValues::F64(v) => Some(v),
            _ => None,
        }
    }
    fn standardize_packed(bytes: &[u8], s: RowScale, out: &mut [f64]) {
        let lut = s.table();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected just now.
            return unsafe { simd::packed_f64_avx512(bytes, lut, out) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was detected just now.
            return unsafe { simd::packed_f64_avx2(bytes, lut, out) };
        }
        packed_scalar(bytes, lut, out)
    }
    fn store(a: Array2<f64>) -> Stored {
        Stored::Dense(a)
    }
    fn stored(s: &Stored) -> Option<ArrayView2<'_, f64>> {
        match s {
            Stored::Dense(a) => Some(a.view()),
            _ => None,
        }
    }
}

impl TileReal for f32 {
    fn fill(
        src: &dyn PanelSource,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, f32>,
    ) -> Result<(), rankwise_sources::SourceError> {
        src.fill_cols_f32(rows, cols, out)
    }
    fn fill_buffer(
        buf: &PanelBuffer,
        rows: Range<usize>,
        cols: Range<usize>,
        out: ArrayViewMut2<'_, f32>,
    ) {
        buf.tile_f32(rows, cols, out)
    }
    fn in_memory(src: &dyn PanelSource, rows: Range<u64>) -> Option<ArrayView2<'_, f32>> {
        src.rows_in_memory_f32(rows)
    }
    fn values_of(buf: &PanelBuffer) -> Option<&[f32]> {
        match &buf.values {
            PanelValues::F32(v) => Some(v),
            _ => None,
        }
    }
    fn standardize_packed(bytes: &[u8], s: RowScale, out: &mut [f32]) {
        let t = s.table();
        let lut = [t[0] as f32, t[1] as f32, t[2] as f32, t[3] as f32];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected just now.
            return unsafe { simd::packed_f32_avx512(bytes, lut, out) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was detected just now.
            return unsafe { simd::packed_f32_avx2(bytes, lut, out) };
        }
        packed_scalar(bytes, lut, out)
    }
    fn omega_layout(omega: ArrayView2<'_, f32>) -> Option<crate::fused::OmegaLayout> {
        crate::fused::available().then(|| crate::fused::OmegaLayout::new(omega))
    }
    fn ab_tile(
        t: Tile<'_, f32>,
        omega: ArrayView2<'_, f32>,
        layout: Option<&crate::fused::OmegaLayout>,
        c0: usize,
        mut y: ArrayViewMut2<'_, f64>,
        scratch: &mut Vec<f32>,
    ) {
        let done = match (&t, layout) {
            (Tile::Dense(v), Some(l)) => crate::fused::ab_values(*v, l, c0, y.view_mut()),
            (Tile::Packed(p), Some(l)) => crate::fused::ab(p, l, c0, y.view_mut()),
            (_, None) => false,
        };
        if !done {
            ab_tile_by_gemm(t, omega, c0, y, scratch);
        }
    }
    fn atb_tile(
        t: Tile<'_, f32>,
        q: ArrayView2<'_, f32>,
        mut b: ArrayViewMut2<'_, f64>,
        scratch: &mut Vec<f32>,
    ) {
        if !matches!(&t, Tile::Packed(p) if crate::fused::atb(p, q, b.view_mut())) {
            atb_tile_by_gemm(t, q, b, scratch);
        }
    }
    fn store(a: Array2<f32>) -> Stored {
        Stored::Dense32(a)
    }
    fn stored(s: &Stored) -> Option<ArrayView2<'_, f32>> {
        match s {
            Stored::Dense32(a) => Some(a.view()),
            _ => None,
        }
    }
}

/// Standardizes packed codes through the row's table, one code at a time.
fn packed_scalar<T: Copy>(bytes: &[u8], lut: [T; 4], out: &mut [T]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = lut[((bytes[j >> 2] >> (2 * (j & 3))) & 3) as usize];
    }
}

/// SIMD kernels of the packed standardization: each group of 2-bit codes is broadcast,
/// shifted into lanes, and used as indices of a register-held table, so a tile row costs a
/// few instructions per 16 (AVX-512) or 8 (AVX2) f32 values, 8 or 4 f64 values.
///
/// The AVX2 kernels matter on CPUs without AVX-512 (AMD Zen 2/3, older Xeons), where the
/// fused and skinny kernels do not run and every packed tile is standardized before its
/// GEMM. There the scalar table lookup took 42 % of the CPU time of a genotype PCA
/// (`perf`, `pca --bed` of 20,000 × 20,000, k = 10, 8 passes, 2-core AMD EPYC Milan,
/// 2026-11-27); the numbers after the change are in `benches/RESULTS.md`. Both copy table
/// entries, so every path gives the scalar one's bits.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX-512F; `bytes` must hold `out.len()` codes.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn packed_f32_avx512(bytes: &[u8], lut: [f32; 4], out: &mut [f32]) {
        let table = _mm512_setr_ps(
            lut[0], lut[1], lut[2], lut[3], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
            0.0,
        );
        let shifts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let three = _mm512_set1_epi32(3);
        let groups = out.len() / 16;
        for (g, word) in bytes.chunks_exact(4).take(groups).enumerate() {
            let w = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
            let idx = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(w), shifts), three);
            let v = _mm512_permutexvar_ps(idx, table);
            // SAFETY: 16 values at 16·g are inside `out` (g < out.len() / 16).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(16 * g), v) };
        }
        super::packed_scalar(&bytes[4 * groups..], lut, &mut out[16 * groups..]);
    }

    /// # Safety
    /// The CPU must support AVX-512F; `bytes` must hold `out.len()` codes.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn packed_f64_avx512(bytes: &[u8], lut: [f64; 4], out: &mut [f64]) {
        let table = _mm512_setr_pd(lut[0], lut[1], lut[2], lut[3], 0.0, 0.0, 0.0, 0.0);
        let shifts = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
        let three = _mm512_set1_epi64(3);
        let groups = out.len() / 8;
        for (g, word) in bytes.chunks_exact(2).take(groups).enumerate() {
            let w = u16::from_le_bytes([word[0], word[1]]) as i64;
            let idx = _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64(w), shifts), three);
            let v = _mm512_permutexvar_pd(idx, table);
            // SAFETY: 8 values at 8·g are inside `out` (g < out.len() / 8).
            unsafe { _mm512_storeu_pd(out.as_mut_ptr().add(8 * g), v) };
        }
        super::packed_scalar(&bytes[2 * groups..], lut, &mut out[8 * groups..]);
    }

    /// # Safety
    /// The CPU must support AVX2; `bytes` must hold `out.len()` codes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn packed_f32_avx2(bytes: &[u8], lut: [f32; 4], out: &mut [f32]) {
        // `vpermilps` indexes within each 128-bit half by the low two bits of a lane, so
        // the table repeated in both halves needs no masking of the shifted codes.
        let table = _mm256_setr_ps(
            lut[0], lut[1], lut[2], lut[3], lut[0], lut[1], lut[2], lut[3],
        );
        let low = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        let high = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
        let groups = out.len() / 16;
        for (g, word) in bytes.chunks_exact(4).take(groups).enumerate() {
            let w = _mm256_set1_epi32(i32::from_le_bytes([word[0], word[1], word[2], word[3]]));
            let a = _mm256_permutevar_ps(table, _mm256_srlv_epi32(w, low));
            let b = _mm256_permutevar_ps(table, _mm256_srlv_epi32(w, high));
            // SAFETY: 16 values at 16·g are inside `out` (g < out.len() / 16).
            unsafe {
                _mm256_storeu_ps(out.as_mut_ptr().add(16 * g), a);
                _mm256_storeu_ps(out.as_mut_ptr().add(16 * g + 8), b);
            }
        }
        super::packed_scalar(&bytes[4 * groups..], lut, &mut out[16 * groups..]);
    }

    /// # Safety
    /// The CPU must support AVX2; `bytes` must hold `out.len()` codes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn packed_f64_avx2(bytes: &[u8], lut: [f64; 4], out: &mut [f64]) {
        // The four f64 entries are eight 32-bit words; code c selects words 2c and 2c + 1
        // through `vpermps` across the whole register.
        let table = _mm256_castpd_ps(_mm256_setr_pd(lut[0], lut[1], lut[2], lut[3]));
        let shifts = _mm256_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6);
        let halves = _mm256_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1);
        let three = _mm256_set1_epi32(3);
        let groups = out.len() / 4;
        for (g, &byte) in bytes.iter().take(groups).enumerate() {
            let codes = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(byte as i32), shifts),
                three,
            );
            let idx = _mm256_add_epi32(_mm256_slli_epi32::<1>(codes), halves);
            let v = _mm256_castps_pd(_mm256_permutevar8x32_ps(table, idx));
            // SAFETY: 4 values at 4·g are inside `out` (g < out.len() / 4).
            unsafe { _mm256_storeu_pd(out.as_mut_ptr().add(4 * g), v) };
        }
        super::packed_scalar(&bytes[groups..], lut, &mut out[4 * groups..]);
    }
}

/// A panel's values kept between passes.
#[derive(Debug)]
pub enum Stored {
    /// Row-major `rows × cols` floats.
    Dense(Array2<f64>),
    /// The same in f32 (precision f32).
    Dense32(Array2<f32>),
    /// A decoded panel of a storage-backed operand, in its stored element type (a float32
    /// or uint8 store stays 4 or 1 bytes per value); tiles convert from it as they are cut.
    Decoded(PanelBuffer),
    /// 2-bit packed dosages, `stride` bytes per row, with each row's standardization.
    Packed {
        /// Packed rows.
        bytes: Vec<u8>,
        /// Bytes per row.
        stride: usize,
        /// Standardization per row.
        rows: Vec<RowScale>,
    },
}

impl PackedTile<'_> {
    /// The standardized values (`rows × cols`, row-major), written into `out`.
    pub fn standardize<'o, T: TileReal>(&self, out: &'o mut Vec<T>) -> ArrayView2<'o, T> {
        self.standardize_into(0..self.rows, aligned_tile(out, self.rows * self.cols))
    }

    /// The standardized values of rows `rows` of the tile (`rows.len() × cols`), written
    /// into `out` (that many values).
    fn standardize_into<'o, T: TileReal>(
        &self,
        rows: impl ExactSizeIterator<Item = usize>,
        out: &'o mut [T],
    ) -> ArrayView2<'o, T> {
        let (h, w) = (rows.len(), self.cols);
        for (k, i) in rows.enumerate() {
            let row = &self.bytes[i * self.stride..];
            T::standardize_packed(row, self.scales[i], &mut out[k * w..(k + 1) * w]);
        }
        ArrayView2::from_shape((h, w), &*out).expect("tile shape")
    }

    /// The rows that add anything to a product (their table is not all zeros: the rows of
    /// excluded and dropped variants are zero), in order, when they are at most three
    /// quarters of the tile. Past that, gathering them costs more than multiplying zeros.
    pub fn live_rows(&self) -> Option<Vec<usize>> {
        let live = |i: &usize| self.tables[*i] != [0.0; 4];
        // Counted first: most tiles are multiplied whole, and allocate nothing here.
        if (0..self.rows).filter(live).count() * 4 > self.rows * 3 {
            return None;
        }
        Some((0..self.rows).filter(live).collect())
    }
}

/// When [`TileProducer`] hands genotype tiles out packed ([`Tile::Packed`]). Tiles of
/// resident rows that are measured again are standardized whatever this says: they are
/// measured from their standardized values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Packing {
    /// Standardized values only.
    Never,
    /// Packed, for every tile type. The consumer multiplies them packed (the fused f32
    /// kernels), standardizes the rows that add anything and multiplies those
    /// ([`TileReal::ab_tile`] and [`TileReal::atb_tile`] otherwise, so that excluded variants cost
    /// no multiplications), or copies the codes elsewhere (GPU actors stage them to the
    /// device 2-bit packed) and standardizes them there.
    Always,
}

/// How many times the tiles of each row block are handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sweeps {
    /// Once.
    Once,
    /// Twice: every tile of a row block once more after the whole block went out once, so
    /// that a product needing the block's finished rows (`Yᵀ·A` after `Y = A·Ω`) reads the
    /// same values in the same pass.
    Twice,
}

/// Which of a row block's sweeps a tile belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// The first (the only one with [`Sweeps::Once`]).
    First,
    /// The second, after every tile of the row block went out in the first.
    Second,
}

/// One tile as [`TileProducer::for_each`] hands it out.
#[derive(Clone, Copy, Debug)]
pub enum Tile<'a, T> {
    /// The values, row-major.
    Dense(ArrayView2<'a, T>),
    /// Packed genotype codes with their standardization.
    Packed(PackedTile<'a>),
}

impl<T> Tile<'_, T> {
    /// `(rows, cols)`.
    pub fn dim(&self) -> (usize, usize) {
        match self {
            Tile::Dense(t) => t.dim(),
            Tile::Packed(p) => (p.rows, p.cols),
        }
    }
}

/// `scratch` as two buffers: `len` values starting on a cache line (where the producer's
/// tiles start too: BLAS's AVX-512 kernels round differently by where their operands lie),
/// and `part` values after them.
fn tile_and_part<T: TileReal>(
    scratch: &mut Vec<T>,
    len: usize,
    part: usize,
) -> (&mut [T], &mut [T]) {
    let pad = 64 / std::mem::size_of::<T>().max(1);
    if scratch.len() < len + pad + part {
        scratch.resize(len + pad + part, T::zero());
    }
    let (a, b) = scratch.split_at_mut(len + pad);
    let off = a.as_ptr().align_offset(64).min(pad);
    (&mut a[off..off + len], &mut b[..part])
}

/// [`TileReal::ab_tile`] by [`gemm`].
fn ab_tile_by_gemm<T: TileReal>(
    t: Tile<'_, T>,
    omega: ArrayView2<'_, T>,
    c0: usize,
    mut y: ArrayViewMut2<'_, f64>,
    scratch: &mut Vec<T>,
) {
    let o = omega.slice(s![c0..c0 + t.dim().1, ..]);
    let p = match t {
        Tile::Dense(t) => return add_product(false, t, o, y, scratch),
        Tile::Packed(p) => p,
    };
    let live = p.live_rows();
    let h = live.as_ref().map_or(p.rows, Vec::len);
    let (values, part) = tile_and_part(scratch, h * p.cols, h * y.ncols());
    match live {
        None => add_product_in(false, p.standardize_into(0..p.rows, values), o, y, part),
        Some(live) if live.is_empty() => {}
        Some(live) => {
            // Each live row's sums become its row of y plus its product, as when the whole
            // tile is multiplied; the other rows' products are zero.
            let mut rows = y.select(Axis(0), &live);
            let t = p.standardize_into(live.iter().copied(), values);
            add_product_in(false, t, o, rows.view_mut(), part);
            for (&i, r) in live.iter().zip(rows.rows()) {
                y.row_mut(i).assign(&r);
            }
        }
    }
}

/// [`TileReal::atb_tile`] by [`gemm`].
fn atb_tile_by_gemm<T: TileReal>(
    t: Tile<'_, T>,
    q: ArrayView2<'_, T>,
    b: ArrayViewMut2<'_, f64>,
    scratch: &mut Vec<T>,
) {
    let p = match t {
        Tile::Dense(t) => return add_product(true, q, t, b, scratch),
        Tile::Packed(p) => p,
    };
    let live = p.live_rows();
    let h = live.as_ref().map_or(p.rows, Vec::len);
    let (values, part) = tile_and_part(scratch, h * p.cols, b.len());
    match live {
        None => add_product_in(true, q, p.standardize_into(0..p.rows, values), b, part),
        Some(live) if live.is_empty() => {}
        Some(live) => {
            let q = q.select(Axis(0), &live);
            let t = p.standardize_into(live.iter().copied(), values);
            add_product_in(true, q.view(), t, b, part);
        }
    }
}

/// `c += op(a)·b` in f64, `op(a) = aᵀ` with `trans_a`, through an f32/f64 product in
/// `scratch` (grown as needed, reused across tiles).
fn add_product<T: TileReal>(
    trans_a: bool,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    c: ArrayViewMut2<'_, f64>,
    scratch: &mut Vec<T>,
) {
    let len = c.len();
    if scratch.len() < len {
        scratch.resize(len, T::zero());
    }
    add_product_in(trans_a, a, b, c, &mut scratch[..len]);
}

/// [`add_product`] with the product in `part` (`c.len()` values).
fn add_product_in<T: TileReal>(
    trans_a: bool,
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    mut c: ArrayViewMut2<'_, f64>,
    part: &mut [T],
) {
    let mut part = ArrayViewMut2::from_shape(c.dim(), part).expect("the scratch holds m × n");
    // With beta 0 neither the kernels nor BLAS read the scratch's old values.
    gemm(trans_a, a, b, T::zero(), part.view_mut());
    for (mut sums, p) in c.rows_mut().into_iter().zip(part.rows()) {
        match (sums.as_slice_mut(), p.as_slice()) {
            (Some(sums), Some(p)) => T::add_to(sums, p),
            (_, _) => sums.zip_mut_with(&p, |x, &v| *x += v.to_f64()),
        }
    }
}

/// What producing a panel once tells about it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PanelFacts {
    /// Σ x² over the panel (after standardization for genotypes).
    pub sum_squares: f64,
    /// Variants dropped (genotypes; `p = 0` or `1`, or no calls) among those the
    /// [`VariantFilter`] kept.
    pub dropped: u64,
    /// Variants the [`VariantFilter`] excluded (genotypes).
    pub filtered: u64,
    /// Missing calls (genotypes), of every variant read.
    pub missing: u64,
}

impl PanelFacts {
    /// The standardization of variant `row` (global) from its counts, after the `filter`
    /// (an excluded variant's row is zero), adding the variant to the facts; with
    /// `measure`, its Σx² in tiles of type `T`. The CPU kernels and the GPU passes (which
    /// count codes on the device) all standardize through it.
    pub fn variant<T: Real>(
        &mut self,
        row: u64,
        counts: &RowCounts,
        filter: &VariantFilter,
        measure: bool,
    ) -> RowScale {
        self.missing += counts.missing;
        if !filter.keeps_row(row, counts) {
            self.filtered += 1;
            return RowScale {
                mean: 0.0,
                scale: 0.0,
            };
        }
        let scale = scale_of(counts);
        if scale.scale == 0.0 {
            self.dropped += 1;
        }
        if measure {
            self.sum_squares += counts.sum_squares::<T>(scale);
        }
        scale
    }
}

/// Produces the tiles of one panel. `store` keeps the values produced in this pass (the
/// plan made the panel resident); `stored` supplies them in later passes.
pub(crate) struct TileProducer<'a> {
    operand: &'a Operand,
    panel: usize,
    rows: Range<u64>,
    measure: bool,
    packing: Packing,
    decoded: Option<&'a PanelBuffer>,
    segments: Option<&'a dyn PanelSegments>,
}

/// The decoded rows of a panel, row block by row block: the panel decoded whole, or its
/// segments one at a time.
struct DecodedRows<'b> {
    whole: Option<&'b PanelBuffer>,
    segments: Option<&'b dyn PanelSegments>,
    held: Option<(usize, PanelLease)>,
}

impl<'b> DecodedRows<'b> {
    /// The buffer holding panel row `r0` and that row's index in it, or `None` when the
    /// panel is not read from storage. With `fresh`, also whether the buffer was taken
    /// just now (for callers that copy each segment once).
    fn at(&mut self, r0: usize) -> Result<Option<(&PanelBuffer, usize, bool)>, LinalgError> {
        if let Some(b) = self.whole {
            return Ok(Some((b, r0, r0 == 0)));
        }
        let Some(segs) = self.segments else {
            return Ok(None);
        };
        let per = segs.segment_rows().max(1);
        let s = r0 / per;
        let fresh = self.held.as_ref().map(|h| h.0) != Some(s);
        if fresh {
            // The previous segment goes back to the pool before the next is waited for.
            self.held = None;
            self.held = Some((s, segs.take(s)?));
        }
        let (_, lease) = self.held.as_ref().expect("held just now");
        Ok(Some((&**lease, r0 - s * per, fresh)))
    }
}

/// `len` values of `buf` (grown as needed) starting on a 64-byte boundary. The kernels
/// read a tile a register of a row at a time, and tile rows are whole cache lines apart;
/// a buffer of this size is placed by the allocator 16 bytes past a line, where every
/// such load straddles two lines (see `fused::OmegaLayout`).
fn aligned_tile<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    let pad = 64 / std::mem::size_of::<T>().max(1);
    if buf.len() < len + pad {
        buf.resize(len + pad, T::default());
    }
    let off = buf.as_ptr().align_offset(64).min(pad);
    &mut buf[off..off + len]
}

thread_local! {
    static CODES: std::cell::RefCell<Vec<i8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a> TileProducer<'a> {
    /// Tiles of panel `panel` (global rows `rows`) of `operand`.
    pub(crate) fn new(operand: &'a Operand, panel: usize, rows: Range<u64>) -> Self {
        TileProducer {
            operand,
            panel,
            rows,
            measure: true,
            packing: Packing::Never,
            decoded: None,
            segments: None,
        }
    }

    /// The panel as this pass's read-ahead gives it: whole, in segments, or not at all.
    pub(crate) fn read_from(mut self, read: &'a PanelRead<'_>) -> Self {
        match read {
            PanelRead::NotRead => {}
            PanelRead::Whole(lease) => self.decoded = Some(lease),
            PanelRead::Segments(segs) => self.segments = Some(segs),
        }
        self
    }

    /// The decoded rows: the read-ahead's (whole or in segments), or the panel read now,
    /// whole, into `local`.
    fn decoded<'b>(
        &'b self,
        stored: Option<&dyn StoredPanels>,
        local: &'b mut Option<PanelBuffer>,
    ) -> Result<DecodedRows<'b>, LinalgError> {
        let whole = match (self.decoded, self.segments, stored) {
            (Some(b), _, _) => Some(b),
            (None, Some(_), _) | (None, None, None) => None,
            (None, None, Some(st)) => {
                let mut b = PanelBuffer::default();
                st.read_panel(self.rows.clone(), &mut b)
                    .map_err(|e| self.panel_error(self.rows.clone(), e.to_string()))?;
                Some(&*local.insert(b))
            }
        };
        Ok(DecodedRows {
            whole,
            segments: if whole.is_some() { None } else { self.segments },
            held: None,
        })
    }

    /// Whether to compute Σ x² of the tiles ([`PanelFacts::sum_squares`]; on by default).
    /// Passes after the first skip it: it costs a read of every tile.
    pub(crate) fn measuring(mut self, measure: bool) -> Self {
        self.measure = measure;
        self
    }

    /// When genotype tiles are handed out packed ([`Tile::Packed`]) rather than
    /// standardized; [`Packing::Never`] by default.
    pub(crate) fn packing(mut self, packing: Packing) -> Self {
        self.packing = packing;
        self
    }

    fn panel_error(&self, rows: Range<u64>, message: String) -> LinalgError {
        LinalgError::Panel {
            panel: self.panel,
            rows: format!("{}..{}", rows.start, rows.end),
            message,
        }
    }

    /// Calls `f(row0, col0, tile)` for every tile in row-block order, then column order
    /// (a fixed order: the GEMM accumulations depend on it). `stored` is the resident
    /// copy from an earlier pass, if any; with `keep` the values produced now are returned
    /// for the next passes. `tile_buf` is the caller's scratch, reused across panels.
    pub(crate) fn for_each<T: TileReal>(
        &self,
        stored: Option<&Stored>,
        keep: bool,
        tile_buf: &mut Vec<T>,
        mut f: impl FnMut(usize, usize, Tile<'_, T>),
    ) -> Result<(PanelFacts, Option<Stored>), LinalgError> {
        self.sweep(stored, keep, tile_buf, Sweeps::Once, |_, r0, c0, t| {
            f(r0, c0, t)
        })
    }

    /// [`TileProducer::for_each`], with each row block's tiles handed out `sweeps` times:
    /// `f(sweep, row0, col0, tile)`. A second sweep reads decoded and resident rows where
    /// they are and produces other tiles again (generating or converting them), so it
    /// costs no memory beyond one tile. Only the first sweep is measured and kept.
    pub(crate) fn sweep<T: TileReal>(
        &self,
        stored: Option<&Stored>,
        keep: bool,
        tile_buf: &mut Vec<T>,
        sweeps: Sweeps,
        mut f: impl FnMut(Sweep, usize, usize, Tile<'_, T>),
    ) -> Result<(PanelFacts, Option<Stored>), LinalgError> {
        let order: &[Sweep] = match sweeps {
            Sweeps::Once => &[Sweep::First],
            Sweeps::Twice => &[Sweep::First, Sweep::Second],
        };
        let h = (self.rows.end - self.rows.start) as usize;
        let n = self.operand.shape().1 as usize;
        let mut facts = PanelFacts::default();
        match (self.operand, stored.and_then(T::stored)) {
            (Operand::Dense(_), Some(a)) => {
                for r0 in (0..h).step_by(TILE_ROWS) {
                    let r1 = (r0 + TILE_ROWS).min(h);
                    for &sweep in order {
                        for c0 in (0..n).step_by(TILE_COLS) {
                            let c1 = (c0 + TILE_COLS).min(n);
                            let t = a.slice(s![r0..r1, c0..c1]);
                            // Measured after the GEMM has pulled the tile into cache.
                            f(sweep, r0, c0, Tile::Dense(t));
                            if self.measure && sweep == Sweep::First {
                                facts.sum_squares += sum_squares_view(t);
                            }
                        }
                    }
                }
                Ok((facts, None))
            }
            (Operand::Dense(src), None) => {
                let resident = match stored {
                    Some(Stored::Decoded(b)) => Some(b),
                    _ => None,
                };
                let mut local = None;
                let mut decoded = match resident {
                    Some(b) => DecodedRows {
                        whole: Some(b),
                        segments: None,
                        held: None,
                    },
                    None => self.decoded(src.stored(), &mut local)?,
                };
                let reads = decoded.whole.is_some() || decoded.segments.is_some();
                // A storage-backed panel stays resident as decoded, in its stored type
                // (segments are gathered into one buffer); a generated one as the tiles'
                // floats.
                let mut gathered = (keep && resident.is_none() && reads).then(|| {
                    let t = src.stored().expect("read from storage").element_type();
                    let mut values = PanelValues::empty(t);
                    values.resize(t, h * n);
                    PanelBuffer {
                        values,
                        rows: h,
                        cols: n,
                        ..PanelBuffer::default()
                    }
                });
                let mut kept = if keep && !reads {
                    Some(Array2::<T>::zeros((h, n)))
                } else {
                    None
                };
                // The tile's rows are a cache line more than TILE_COLS apart: at 4 KiB
                // (f64) or 2 KiB (f32) they share L1's sets, and `Qᵀ·T`, which runs down
                // 64 of them a register at a time, must copy each block first (criterion
                // `skinny_widths`, one Zen 3 core, f64 with 20 rows of C: 26.4 GFLOP/s at
                // 512 values a row, 31.6 at 520).
                // Rows the source holds in memory in the tiles' type are multiplied where
                // they lie: copying each tile out first cost as much as its products
                // (`examples/c/machine_limit.c`, see `benches/RESULTS.md`).
                let in_memory = match (&kept, reads) {
                    (None, false) => T::in_memory(src.as_ref(), self.rows.clone()),
                    _ => None,
                };
                let ld = TILE_COLS + 64 / std::mem::size_of::<T>();
                let tile_buf = aligned_tile(tile_buf, TILE_ROWS * ld);
                for r0 in (0..h).step_by(TILE_ROWS) {
                    let r1 = (r0 + TILE_ROWS).min(h);
                    let g = self.rows.start + r0 as u64..self.rows.start + r1 as u64;
                    let block = decoded.at(r0)?;
                    if let (Some(all), Some((b, 0, true))) = (gathered.as_mut(), block) {
                        let w = b.values.element_type().size() * n;
                        let bytes = b.values.bytes();
                        let len = (b.rows * w).min(bytes.len());
                        all.values.bytes_mut()[r0 * w..r0 * w + len].copy_from_slice(&bytes[..len]);
                    }
                    for (&sweep, c0) in order
                        .iter()
                        .flat_map(|s| std::iter::repeat(s).zip((0..n).step_by(TILE_COLS)))
                    {
                        let c1 = (c0 + TILE_COLS).min(n);
                        let first = sweep == Sweep::First;
                        if let Some(a) = &in_memory {
                            let t = a.slice(s![r0..r1, c0..c1]);
                            // Measured after the GEMM has pulled the tile into cache, as
                            // below.
                            f(sweep, r0, c0, Tile::Dense(t));
                            if self.measure && first {
                                facts.sum_squares += sum_squares_view(t);
                            }
                            continue;
                        }
                        let same_type = block.and_then(|(b, i, _)| Some((T::values_of(b)?, i)));
                        if let Some((v, i)) = same_type {
                            // The same tiles, as views of the decoded rows.
                            let t = ArrayView2::from_shape(
                                (r1 - r0, c1 - c0).strides((n, 1)),
                                &v[i * n + c0..],
                            )
                            .expect("the tile lies inside its panel");
                            // Measured after the GEMM has pulled the tile into cache: the
                            // decoded rows are read from memory once, not twice.
                            f(sweep, r0, c0, Tile::Dense(t));
                            if self.measure && first {
                                facts.sum_squares += sum_squares_view(t);
                            }
                            continue;
                        }
                        let cols = c0 as u64..c1 as u64;
                        let refill = first || kept.is_none();
                        let mut t = match kept.as_mut() {
                            Some(k) => k.slice_mut(s![r0..r1, c0..c1]),
                            None => ArrayViewMut2::from_shape(
                                (r1 - r0, c1 - c0).strides((ld, 1)),
                                &mut tile_buf[..(r1 - r0 - 1) * ld + (c1 - c0)],
                            )
                            .expect("tile fits its buffer"),
                        };
                        match block {
                            // A kept tile was filled in the first sweep.
                            _ if !refill => {}
                            Some((b, i, _)) => {
                                T::fill_buffer(b, i..i + (r1 - r0), c0..c1, t.view_mut())
                            }
                            None => T::fill(src.as_ref(), g.clone(), cols, t.view_mut())
                                .map_err(|e| self.panel_error(g.clone(), e.to_string()))?,
                        }
                        if self.measure && first {
                            facts.sum_squares += sum_squares_view(t.view());
                        }
                        f(sweep, r0, c0, Tile::Dense(t.view()));
                    }
                }
                let kept = match gathered {
                    Some(b) => Some(Stored::Decoded(b)),
                    None => kept.map(T::store),
                };
                Ok((facts, kept))
            }
            (Operand::Genotypes(src, filter), _) => {
                self.genotype_tiles(src.as_ref(), filter, stored, keep, tile_buf, order, f)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn genotype_tiles<T: TileReal>(
        &self,
        src: &dyn GenotypeSource,
        filter: &VariantFilter,
        stored: Option<&Stored>,
        keep: bool,
        tile: &mut Vec<T>,
        order: &[Sweep],
        mut f: impl FnMut(Sweep, usize, usize, Tile<'_, T>),
    ) -> Result<(PanelFacts, Option<Stored>), LinalgError> {
        let h = (self.rows.end - self.rows.start) as usize;
        let n = src.shape().1 as usize;
        let stride = n.div_ceil(4);
        // Resident rows measured again are measured from their standardized values.
        let packed_out = self.packing == Packing::Always && !(self.measure && stored.is_some());
        let mut tables: Vec<[f32; 4]> = Vec::with_capacity(TILE_ROWS);
        let mut facts = PanelFacts::default();
        let packed = match stored {
            Some(Stored::Packed {
                bytes,
                stride,
                rows,
            }) => Some((bytes, *stride, rows)),
            _ => None,
        };
        let mut kept_bytes = if keep && packed.is_none() {
            vec![0u8; h * stride]
        } else {
            Vec::new()
        };
        let mut kept_rows = Vec::new();
        let tile = aligned_tile(tile, TILE_ROWS * TILE_COLS);
        let mut codes = CODES.with(|t| std::mem::take(&mut *t.borrow_mut()));
        codes.resize(TILE_ROWS * n.max(1), 0);
        // Rows produced in this pass are packed first (into the kept panel, or a block
        // buffer), so every pass standardizes from the same 2-bit codes.
        let mut block = vec![
            0u8;
            if keep || packed.is_some() {
                0
            } else {
                TILE_ROWS * stride
            }
        ];
        let mut scales = Vec::with_capacity(TILE_ROWS);
        let direct = src
            .generated()
            .filter(|g| g.dist() == Dist::Genotype && !g.is_transposed());
        let mut code_counts = Vec::with_capacity(TILE_ROWS);
        let mut local = None;
        let mut decoded = match packed {
            Some(_) => DecodedRows {
                whole: None,
                segments: None,
                held: None,
            },
            None => self.decoded(src.stored(), &mut local)?,
        };
        let result = (|| -> Result<(), LinalgError> {
            for r0 in (0..h).step_by(TILE_ROWS) {
                let r1 = (r0 + TILE_ROWS).min(h);
                let b = r1 - r0;
                scales.clear();
                let rows_bytes: &[u8] = match packed {
                    Some((bytes, _, rows)) => {
                        scales.extend_from_slice(&rows[r0..r1]);
                        &bytes[r0 * stride..r1 * stride]
                    }
                    None if direct.is_some() => {
                        // The generator packs and counts as it draws: no int8 rows.
                        let gen = direct.expect("checked");
                        let g = self.rows.start + r0 as u64..self.rows.start + r1 as u64;
                        let dest: &mut [u8] = if keep {
                            &mut kept_bytes[r0 * stride..r1 * stride]
                        } else {
                            &mut block[..b * stride]
                        };
                        code_counts.clear();
                        gen.fill_packed_rows(g.clone(), dest, stride, &mut code_counts);
                        for (row, &[ones, twos, missing]) in g.zip(&code_counts) {
                            let counts = RowCounts {
                                dosages: [n as u64 - ones - twos - missing, ones, twos],
                                missing,
                            };
                            scales.push(facts.variant::<T>(row, &counts, filter, self.measure));
                        }
                        if keep {
                            kept_rows.extend_from_slice(&scales);
                            &kept_bytes[r0 * stride..r1 * stride]
                        } else {
                            &block[..b * stride]
                        }
                    }
                    None => {
                        let g = self.rows.start + r0 as u64..self.rows.start + r1 as u64;
                        let codes: &[i8] = match decoded.at(r0)? {
                            Some((buf, i, _)) => {
                                let d = buf.dosages().ok_or_else(|| {
                                    self.panel_error(
                                        self.rows.clone(),
                                        "decoded genotype panel is not int8".into(),
                                    )
                                })?;
                                &d[i * n..(i + b) * n]
                            }
                            None => {
                                let view = ArrayViewMut2::from_shape((b, n), &mut codes[..b * n])
                                    .expect("codes fit their buffer");
                                src.fill_dosages(g.clone(), view)
                                    .map_err(|e| self.panel_error(g.clone(), e.to_string()))?;
                                &codes[..b * n]
                            }
                        };
                        let dest: &mut [u8] = if keep {
                            &mut kept_bytes[r0 * stride..r1 * stride]
                        } else {
                            &mut block[..b * stride]
                        };
                        for i in 0..b {
                            let row = &codes[i * n..(i + 1) * n];
                            let counts =
                                row_counts(row).map_err(|(j, v)| LinalgError::Genotype {
                                    variant: g.start + i as u64,
                                    sample: j as u64,
                                    value: v,
                                    what: src.describe(),
                                })?;
                            let at = g.start + i as u64;
                            scales.push(facts.variant::<T>(at, &counts, filter, self.measure));
                            pack_row(row, &mut dest[i * stride..(i + 1) * stride]);
                        }
                        if keep {
                            kept_rows.extend_from_slice(&scales);
                            &kept_bytes[r0 * stride..r1 * stride]
                        } else {
                            &block[..b * stride]
                        }
                    }
                };
                if packed_out {
                    tables.clear();
                    tables.extend(scales.iter().map(|s| s.table().map(|v| v as f32)));
                }
                for (&sweep, c0) in order
                    .iter()
                    .flat_map(|s| std::iter::repeat(s).zip((0..n).step_by(TILE_COLS)))
                {
                    let c1 = (c0 + TILE_COLS).min(n);
                    let w = c1 - c0;
                    if packed_out {
                        f(
                            sweep,
                            r0,
                            c0,
                            Tile::Packed(PackedTile {
                                bytes: &rows_bytes[c0 / 4..],
                                stride,
                                rows: b,
                                cols: w,
                                tables: &tables,
                                scales: &scales,
                            }),
                        );
                        continue;
                    }
                    for i in 0..b {
                        let row = &rows_bytes[i * stride..(i + 1) * stride];
                        T::standardize_packed(
                            &row[c0 / 4..],
                            scales[i],
                            &mut tile[i * w..(i + 1) * w],
                        );
                    }
                    let t = ArrayView2::from_shape((b, w), &tile[..b * w]).expect("tile shape");
                    // Rows produced in this pass were measured from their counts above.
                    if self.measure && packed.is_some() && sweep == Sweep::First {
                        facts.sum_squares += T::sum_squares(&tile[..b * w]);
                    }
                    f(sweep, r0, c0, Tile::Dense(t));
                }
            }
            Ok(())
        })();
        CODES.with(|t| *t.borrow_mut() = codes);
        result?;
        let kept = (keep && packed.is_none()).then_some(Stored::Packed {
            bytes: kept_bytes,
            stride,
            rows: kept_rows,
        });
        Ok((facts, kept))
    }
}

/// How often each dosage occurs in one row of dosages, or the first value outside
/// {−1, 0, 1, 2} as `(column, value)`.
pub fn row_counts(row: &[i8]) -> Result<RowCounts, (usize, i8)> {
    let (sum, calls, twos, bad) = count_row(row);
    if bad {
        let j = row
            .iter()
            .position(|v| !(-1..=2).contains(v))
            .unwrap_or_default();
        return Err((j, row[j]));
    }
    let ones = sum - 2 * twos;
    Ok(RowCounts {
        dosages: [calls - ones - twos, ones, twos],
        missing: row.len() as u64 - calls,
    })
}

/// The standardization of one row of dosages (no [`VariantFilter`]) and its counts, or the
/// first value outside {−1, 0, 1, 2} as `(column, value)`.
pub fn row_scale(row: &[i8]) -> Result<(RowScale, RowCounts), (usize, i8)> {
    let counts = row_counts(row)?;
    Ok((scale_of(&counts), counts))
}

/// The standardization of a variant from how often each dosage occurs in its row: mean
/// `2p` with `p` the allele frequency among the calls, scale `1/√(2p(1−p))`, or 0 (the
/// variant is dropped) when it is monomorphic or has no calls. The CPU kernels and the
/// GPU passes (which count codes on the device) both standardize through it.
pub(crate) fn scale_of(counts: &RowCounts) -> RowScale {
    let [zeros, ones, twos] = counts.dosages;
    let calls = zeros + ones + twos;
    let sum = ones + 2 * twos;
    if calls == 0 {
        return RowScale {
            mean: 0.0,
            scale: 0.0,
        };
    }
    let p = sum as f64 / (2.0 * calls as f64);
    let var = 2.0 * p * (1.0 - p);
    let scale = if sum == 0 || sum == 2 * calls || var <= 0.0 {
        0.0
    } else {
        1.0 / var.sqrt()
    };
    RowScale {
        mean: 2.0 * p,
        scale,
    }
}

/// `(Σ max(g, 0), calls, twos, any value outside −1..=2)`, in u32 lanes per block of rows
/// so the loop vectorizes.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
fn count_row(row: &[i8]) -> (u64, u64, u64, bool) {
    let (mut sum, mut calls, mut twos, mut bad) = (0u64, 0u64, 0u64, false);
    for block in row.chunks(1 << 20) {
        let (mut s, mut c, mut t, mut b) = (0u32, 0u32, 0u32, 0u32);
        for &v in block {
            let u = (v as u8).wrapping_add(1) as u32;
            b |= (u > 3) as u32;
            s += (v.max(0) as u8) as u32;
            c += (v >= 0) as u32;
            t += (v == 2) as u32;
        }
        sum += s as u64;
        calls += c as u64;
        twos += t as u64;
        bad |= b != 0;
    }
    (sum, calls, twos, bad)
}

/// Byte → four codes, low bits first (code 3, a missing call, decodes to −1).
#[cfg(test)]
const UNPACK: [[i8; 4]; 256] = {
    let mut t = [[0i8; 4]; 256];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        while k < 4 {
            let c = ((b >> (2 * k)) & 3) as i8;
            t[b][k] = if c == 3 { -1 } else { c };
            k += 1;
        }
        b += 1;
    }
    t
};

/// Packs a row of dosages (−1..=2) four per byte.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512dq+avx512vl+avx512bw+avx2+fma",
    "x86_64+avx2+fma"
))]
pub fn pack_row(row: &[i8], out: &mut [u8]) {
    let full = row.len() / 4;
    for (o, chunk) in out[..full].iter_mut().zip(row.chunks_exact(4)) {
        let x = u32::from_le_bytes([
            chunk[0] as u8,
            chunk[1] as u8,
            chunk[2] as u8,
            chunk[3] as u8,
        ]) & 0x0303_0303;
        *o = (x | x >> 6 | x >> 12 | x >> 18) as u8;
    }
    if full < out.len() {
        let mut b = 0u8;
        for (k, &v) in row[full * 4..].iter().enumerate() {
            b |= ((v as u8) & 3) << (2 * k);
        }
        out[full] = b;
    }
}

/// Unpacks a packed row into `out` (its length is the row's column count): the inverse of
/// [`pack_row`], which the tests check it against.
#[cfg(test)]
fn unpack_row(bytes: &[u8], out: &mut [i8]) {
    let full = out.len() / 4;
    for (o, &b) in out[..full * 4].chunks_exact_mut(4).zip(bytes) {
        o.copy_from_slice(&UNPACK[b as usize]);
    }
    let rest = out.len() - full * 4;
    if rest > 0 {
        out[full * 4..].copy_from_slice(&UNPACK[bytes[full] as usize][..rest]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;
    use crate::variants::{HweP, RowSelection};
    use rankwise_sources::{Dist, Generated, InMemoryGenotypes};

    #[test]
    fn simd_standardization_copies_the_scalar_tables_bits() {
        let mut rng = Rng::fresh();
        for n in [1usize, 3, 4, 7, 8, 15, 16, 17, 33, 511, 512, 1027] {
            let bytes: Vec<u8> = (0..n.div_ceil(4)).map(|_| rng.next() as u8).collect();
            let lut64 = [0.0, 0.0, 0.0, 0.0].map(|_: f64| f64::from(rng.value()) / 3.0);
            let lut32 = lut64.map(|x| x as f32);
            let (mut want64, mut want32) = (vec![0f64; n], vec![0f32; n]);
            packed_scalar(&bytes, lut64, &mut want64);
            packed_scalar(&bytes, lut32, &mut want32);
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    let (mut got64, mut got32) = (vec![9f64; n], vec![9f32; n]);
                    // SAFETY: AVX2 was detected; `bytes` holds n codes.
                    unsafe {
                        simd::packed_f64_avx2(&bytes, lut64, &mut got64);
                        simd::packed_f32_avx2(&bytes, lut32, &mut got32);
                    }
                    assert_eq!(got64, want64, "avx2 f64, n = {n}");
                    assert_eq!(got32, want32, "avx2 f32, n = {n}");
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    let (mut got64, mut got32) = (vec![9f64; n], vec![9f32; n]);
                    // SAFETY: AVX-512F was detected; `bytes` holds n codes.
                    unsafe {
                        simd::packed_f64_avx512(&bytes, lut64, &mut got64);
                        simd::packed_f32_avx512(&bytes, lut32, &mut got32);
                    }
                    assert_eq!(got64, want64, "avx512 f64, n = {n}");
                    assert_eq!(got32, want32, "avx512 f32, n = {n}");
                }
            }
        }
    }

    #[test]
    fn pack_round_trips_every_code_and_ragged_rows() {
        for n in [1usize, 3, 4, 5, 9, 1027] {
            let row: Vec<i8> = (0..n).map(|j| ((j * 7 + n) % 4) as i8 - 1).collect();
            let mut packed = vec![0u8; n.div_ceil(4)];
            pack_row(&row, &mut packed);
            let mut back = vec![9i8; n];
            unpack_row(&packed, &mut back);
            assert_eq!(back, row, "n = {n}");
        }
    }

    #[test]
    fn row_scale_standardizes_and_drops_monomorphic_rows() {
        let (s, counts) = row_scale(&[0, 1, 2, -1, 1]).unwrap();
        assert_eq!(
            counts,
            RowCounts {
                dosages: [1, 2, 1],
                missing: 1
            }
        );
        let p: f64 = 4.0 / 8.0;
        assert_eq!(s.mean, 2.0 * p);
        assert!((s.scale - 1.0 / (2.0 * p * (1.0 - p)).sqrt()).abs() < 1e-15);
        assert_eq!(row_scale(&[2, 2, -1]).unwrap().0.scale, 0.0);
        assert_eq!(row_scale(&[0, 0]).unwrap().0.scale, 0.0);
        assert_eq!(row_scale(&[-1, -1]).unwrap().0.scale, 0.0);
        assert_eq!(row_scale(&[0, 3, 1]).unwrap_err(), (1, 3));
        assert_eq!(row_scale(&[0, 1, -2]).unwrap_err(), (2, -2));
    }

    fn collect(
        op: &Operand,
        rows: Range<u64>,
        stored: Option<&Stored>,
        keep: bool,
    ) -> (Array2<f64>, PanelFacts, Option<Stored>) {
        let h = (rows.end - rows.start) as usize;
        let n = op.shape().1 as usize;
        let mut out = Array2::from_elem((h, n), f64::NAN);
        let (facts, kept) = TileProducer::new(op, 0, rows)
            .for_each(stored, keep, &mut Vec::new(), |r0, c0, t: Tile<'_, f64>| {
                let Tile::Dense(t) = t else {
                    panic!("f64 tiles are never packed")
                };
                out.slice_mut(s![r0..r0 + t.nrows(), c0..c0 + t.ncols()])
                    .assign(&t);
            })
            .unwrap();
        (out, facts, kept)
    }

    #[test]
    fn genotype_tiles_are_the_standardized_matrix_resident_or_not() {
        let g = Generated::new(150, 2100, 4, Dist::Genotype).with_missing(0.1);
        let op = Operand::Genotypes(Arc::new(g.clone()), VariantFilter::NONE);
        let (a, facts, kept) = collect(&op, 10..150, None, true);
        for i in 0..140 {
            let row: Vec<i8> = (0..2100).map(|j| g.genotype(10 + i as u64, j)).collect();
            let (sc, _) = row_scale(&row).unwrap();
            for j in 0..2100 {
                let want = if row[j] < 0 {
                    0.0
                } else {
                    (row[j] as f64 - sc.mean) * sc.scale
                };
                assert!((a[[i, j]] - want).abs() < 1e-14);
            }
        }
        assert!(facts.missing > 0);
        let (b, facts2, none) = collect(&op, 10..150, kept.as_ref(), false);
        assert!(none.is_none());
        assert_eq!(a, b);
        // Counted when produced, summed from the tiles when resident: the same up to rounding.
        let direct: f64 = a.iter().map(|x| x * x).sum();
        for ss in [facts.sum_squares, facts2.sum_squares] {
            assert!((ss - direct).abs() <= 1e-12 * direct, "{ss} vs {direct}");
        }
    }

    /// A filtered variant's row (by its counts or its row) is zero whichever way the panel
    /// is made (generated and packed as drawn, decoded from stored dosages, resident), and
    /// it is counted apart from the dropped (monomorphic) ones.
    #[test]
    fn filtered_variants_are_zero_rows_counted_apart_from_dropped_ones() {
        let mut rng = Rng::fresh();
        for _ in 0..3 {
            let (m, n) = (40 + rng.below(300), 5 + rng.below(400));
            let g = Generated::new(m as u64, n as u64, rng.next(), Dist::Genotype)
                .with_missing(rng.below(300) as f64 / 1000.0);
            let filter = VariantFilter::new(
                rng.below(400) as f64 / 1000.0,
                rng.below(1001) as f64 / 1000.0,
            )
            .and_then(|f| f.with_hwe(rng.below(200) as f64 / 1000.0, HweP::Exact))
            .unwrap()
            .with_rows(RowSelection::new(m as u64, "`extract` t", |_| {
                rng.below(4) > 0
            }));
            let what = format!("{m} × {n}, {filter:?}");
            let dosages = Array2::from_shape_fn((m, n), |(i, j)| g.genotype(i as u64, j as u64));
            let (mut filtered, mut dropped) = (0, 0);
            let mut want = Array2::<f64>::zeros((m, n));
            for (i, row) in dosages.rows().into_iter().enumerate() {
                let (sc, counts) = row_scale(row.as_slice().unwrap()).unwrap();
                if !filter.keeps_row(i as u64, &counts) {
                    filtered += 1;
                    continue;
                }
                dropped += (sc.scale == 0.0) as u64;
                for (j, &v) in row.iter().enumerate() {
                    if v >= 0 {
                        want[[i, j]] = (v as f64 - sc.mean) * sc.scale;
                    }
                }
            }
            let stored = InMemoryGenotypes::new(dosages, "t.zarr");
            for op in [
                Operand::Genotypes(Arc::new(g.clone()), filter.clone()),
                Operand::Genotypes(Arc::new(stored.clone()), filter),
            ] {
                let (a, facts, kept) = collect(&op, 0..m as u64, None, true);
                assert_eq!(
                    (facts.filtered, facts.dropped),
                    (filtered, dropped),
                    "{what}"
                );
                let err = (&a - &want).iter().fold(0f64, |e, x| e.max(x.abs()));
                assert!(err < 1e-13, "{what}: {err}");
                let squares: f64 = want.iter().map(|x| x * x).sum();
                assert!((facts.sum_squares - squares).abs() <= 1e-12 * squares.max(1.0));
                let (b, _, _) = collect(&op, 0..m as u64, kept.as_ref(), false);
                assert_eq!(a, b, "{what}: resident");
                // A panel further down selects by the matrix's rows, not the panel's.
                let r0 = rng.below(m);
                let (c, _, _) = collect(&op, r0 as u64..m as u64, None, false);
                assert_eq!(c, a.slice(s![r0.., ..]), "{what}: rows from {r0}");
            }
        }
    }

    /// The second sweep of a row block hands out the first sweep's tiles again, after all of
    /// them and in the same order, for produced and resident panels; it is neither measured
    /// nor kept twice.
    #[test]
    fn a_second_sweep_hands_out_the_first_sweeps_tiles_again() {
        let ops = [
            Operand::Dense(Arc::new(Generated::new(600, 1100, 3, Dist::Uniform))),
            Operand::Genotypes(
                Arc::new(Generated::new(600, 1100, 4, Dist::Genotype).with_missing(0.1)),
                VariantFilter::NONE,
            ),
        ];
        for op in &ops {
            let (once, _, kept) = collect(op, 5..600, None, true);
            for stored in [None, kept.as_ref()] {
                let mut seen: Vec<(Sweep, usize, usize, Array2<f64>)> = Vec::new();
                let (facts, again) = TileProducer::new(op, 0, 5..600)
                    .sweep(
                        stored,
                        stored.is_none(),
                        &mut Vec::new(),
                        Sweeps::Twice,
                        |sweep, r0, c0, t: Tile<'_, f64>| {
                            let Tile::Dense(t) = t else {
                                panic!("f64 tiles are never packed")
                            };
                            seen.push((sweep, r0, c0, t.to_owned()));
                        },
                    )
                    .unwrap();
                let per_block = 1100usize.div_ceil(TILE_COLS);
                assert_eq!(seen.len(), 2 * per_block * 595usize.div_ceil(TILE_ROWS));
                for block in seen.chunks(2 * per_block) {
                    let (first, second) = block.split_at(per_block);
                    for (a, b) in first.iter().zip(second) {
                        assert_eq!((a.0, b.0), (Sweep::First, Sweep::Second));
                        assert_eq!((a.1, a.2, &a.3), (b.1, b.2, &b.3));
                    }
                }
                let mut whole = Array2::from_elem((595, 1100), f64::NAN);
                for (_, r0, c0, t) in seen.iter().filter(|x| x.0 == Sweep::Second) {
                    whole
                        .slice_mut(s![*r0..r0 + t.nrows(), *c0..c0 + t.ncols()])
                        .assign(t);
                }
                assert_eq!(whole, once);
                let (_, once_facts, _) = collect(op, 5..600, stored, false);
                assert_eq!(facts.sum_squares, once_facts.sum_squares);
                assert_eq!(facts.missing, once_facts.missing);
                assert_eq!(again.is_some(), stored.is_none());
            }
        }
    }

    #[test]
    fn dense_tiles_resident_equal_regenerated() {
        let g = Generated::new(200, 2500, 1, Dist::Uniform);
        let op = Operand::Dense(Arc::new(g));
        let (a, fa, kept) = collect(&op, 3..200, None, true);
        let (b, fb, _) = collect(&op, 3..200, kept.as_ref(), false);
        assert_eq!(a, b);
        assert_eq!(fa.sum_squares, fb.sum_squares);
    }

    #[test]
    fn bad_genotype_names_variant_and_sample() {
        let mut v = Array2::<i8>::zeros((5, 6));
        v[[3, 4]] = 7;
        v[[0, 0]] = 1;
        let op = Operand::Genotypes(
            Arc::new(InMemoryGenotypes::new(v, "test.zarr")),
            VariantFilter::NONE,
        );
        let err = TileProducer::new(&op, 0, 0..5)
            .for_each(None, false, &mut Vec::<f64>::new(), |_, _, _| {})
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("variant 3") && err.contains("sample 4") && err.contains("7"),
            "{err}"
        );
        assert!(err.contains("test.zarr"), "{err}");
    }

    #[test]
    fn tile_gemms_match_dense_products() {
        let a = Array2::from_shape_fn((70, 33), |(i, j)| ((i * 31 + j * 7) % 13) as f64 - 6.0);
        let w = Array2::from_shape_fn((33, 5), |(i, j)| (i as f64 - j as f64) * 0.25);
        let mut y = Array2::<f64>::ones((70, 5));
        gemm(false, a.view(), w.view(), 1.0, y.view_mut());
        assert_eq!(y, a.dot(&w) + 1.0);
        let q = Array2::from_shape_fn((70, 4), |(i, j)| (i + j) as f64 * 0.5);
        let mut b = Array2::<f64>::zeros((40, 4));
        gemm(true, a.view(), q.view(), 0.0, b.slice_mut(s![3..36, ..]));
        assert_eq!(b.slice(s![3..36, ..]), a.t().dot(&q));
        assert!(b.slice(s![..3, ..]).iter().all(|&v| v == 0.0));
        let a32 = a.mapv(|x| x as f32);
        let w32 = w.mapv(|x| x as f32);
        let mut y32 = Array2::<f32>::zeros((70, 5));
        gemm(false, a32.view(), w32.view(), 0.0, y32.view_mut());
        assert_eq!(y32, a32.dot(&w32));
    }

    #[test]
    fn f32_genotype_tiles_are_the_f64_tiles_rounded() {
        let g = Generated::new(40, 1500, 8, Dist::Genotype).with_missing(0.1);
        let op = Operand::Genotypes(Arc::new(g), VariantFilter::NONE);
        let (a, _, _) = collect(&op, 0..40, None, false);
        let mut b = Array2::<f32>::zeros((40, 1500));
        let (facts, _) = TileProducer::new(&op, 0, 0..40)
            .for_each(None, false, &mut Vec::new(), |r0, c0, t: Tile<'_, f32>| {
                let Tile::Dense(t) = t else {
                    panic!("tiles are packed only when asked for")
                };
                b.slice_mut(s![r0..r0 + t.nrows(), c0..c0 + t.ncols()])
                    .assign(&t);
            })
            .unwrap();
        assert_eq!(b, a.mapv(|x| x as f32));
        // The counted total variance is that of the rounded tiles, not of the f64 ones,
        // within the rounding of `sum_squares_f32`.
        let direct: f64 = b.iter().map(|&x| x as f64 * x as f64).sum();
        assert!((facts.sum_squares - direct).abs() <= SUM_SQUARES_F32_BOUND * direct);
    }

    /// The relative error [`sum_squares_f32`] documents.
    const SUM_SQUARES_F32_BOUND: f64 = 9.0 / (1u64 << 24) as f64;

    #[test]
    fn sum_squares_f32_stays_within_its_documented_error_on_random_and_adverse_values() {
        let mut rng = crate::testing::Rng::fresh();
        let exact = |x: &[f32]| x.iter().map(|&v| v as f64 * v as f64).sum::<f64>();
        for case in 0..200 {
            let n = rng.below(3000);
            let x: Vec<f32> = match case % 3 {
                // Values of every magnitude from 1e-3 to 1e3.
                0 => (0..n)
                    .map(|_| rng.value() * 10f32.powi(rng.below(7) as i32 - 3))
                    .collect(),
                // Equal values: every rounding of a lane's sum goes the same way.
                1 => vec![1.0 + rng.value().abs() * 1e-3; n],
                _ => (0..n).map(|_| rng.value()).collect(),
            };
            let (got, want) = (crate::real::sum_squares_f32(&x), exact(&x));
            assert!(
                (got - want).abs() <= SUM_SQUARES_F32_BOUND * want,
                "{got} vs {want} ({n} values, case {case})"
            );
        }
    }
}
