//! The randomized passes of one panel on its GPU actor's device.
//!
//! # What runs where
//!
//! A panel of a generated matrix never exists on the host: the device generates it row
//! tile by row tile (the block-stream generator of `rankwise_sources::stream`, ported to
//! CUDA in `device/src/kernels.cu`, gives the same values), standardizes genotype
//! tiles from their 2-bit codes, and multiplies them by cuBLAS. Only the thin results
//! come back: `Y = A·[Ω | W]` (`h × (l + r)`) in the range pass, `B = QᵀA` (`l × n`) in
//! the projection pass, and per genotype tile its code counts (`h × 4`), from which the
//! host computes each variant's standardization exactly as the CPU kernels do (so the
//! standardized values are the CPU's, bit for bit), and sends back a 4-entry table per
//! variant. With fused projections the range pass also forms `W = YᵀA` from the same
//! tiles, each row block's `Y` first. The orthonormalization (TSQR of the thin `Y`) and
//! everything after stay on the host, as on CPU actors.
//!
//! A panel read from storage (Zarr, raw files) is decoded on the host by the actor's CPU
//! threads, as on CPU actors, and [`Staging`] copies it to the device block by block
//! through page-locked buffers, double-buffered on a copy stream of its own: decode, copy
//! and products overlap. Genotypes travel as their 2-bit codes with a 4-entry table per
//! variant, computed on the host as the CPU kernels compute it.
//!
//! The exact SVD (`crate::svd`) factors whole panels rather than thin products: a GPU actor
//! with cuSOLVER generates a generated uniform panel on its device, gathers its tiles into
//! the column-major layout cuSOLVER takes ([`generated_factor`]), and factors it there;
//! other panels are produced on the host and copied up for the QR ([`factor_panel`]). Only
//! `Q` and `R` come back, since the tree and pass 2 work on the host.
//!
//! # Precision
//!
//! f64 tiles multiply in one DGEMM over all columns. f32 tiles multiply in column chunks
//! of [`F32_CHUNK`] whose products are added to f64 sums on the device, as the CPU
//! kernels add each tile's SGEMM to f64 sums.
//!
//! # Layouts
//!
//! Everything is row-major, which cuBLAS (column-major) sees as the transpose: a
//! row-major `h × n` tile is a column-major `n × h` matrix with leading dimension `n`.

use std::ops::Range;

use cudarc::cublas::result::CublasError;
use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2};
pub(crate) use rankwise_device::GpuDevice;
use rankwise_device::{GpuError, GpuKernels, PinnedLease};
use rankwise_sources::stream::{BLOCK_COLS, LANES};
use rankwise_sources::{Dist, Generated};

use crate::kernels::{block_rows, Keep, PanelFactor};
use crate::tiles::{
    Operand, PackedTile, PanelFacts, Precision, Real, RowCounts, Tile, TileReal, TILE_ROWS,
};
use crate::variants::VariantFilter;
use crate::LinalgError;

/// Columns per f32 GEMM whose product is added to the f64 sums.
pub(crate) const F32_CHUNK: usize = 2048;

/// Bytes of one device tile of the panel's values (its rows are chosen to fit).
const TILE_BYTES: usize = 512 << 20;

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;

/// What a device can produce by itself.
#[derive(Clone, Debug)]
pub enum DeviceSource {
    /// Generated uniform values.
    Uniform(Generated),
    /// Generated genotype dosages, standardized per variant after the filter.
    Genotypes(Generated, VariantFilter),
    /// Generated genotype dosages as a plain matrix (`--dist genotype`): 0, 1, 2, and −1
    /// for a missing call, made from the same packed codes as [`DeviceSource::Genotypes`].
    Dosages(Generated),
}

impl DeviceSource {
    /// The device form of an operand, when the device can produce it: generated uniform
    /// values or genotypes, not transposed. Everything else runs on the actor's CPU cores.
    pub fn of(operand: &Operand) -> Option<DeviceSource> {
        match operand {
            Operand::Dense(s) => {
                let g = s.generated().filter(|g| !g.is_transposed())?;
                match g.dist() {
                    Dist::Uniform => Some(DeviceSource::Uniform(g.clone())),
                    Dist::Genotype => Some(DeviceSource::Dosages(g.clone())),
                    Dist::Normal => None,
                }
            }
            Operand::Genotypes(s, filter) => {
                let g = s.generated()?;
                (!g.is_transposed()).then(|| DeviceSource::Genotypes(g.clone(), filter.clone()))
            }
        }
    }

    /// Why an operand runs on CPU cores even on a GPU actor.
    pub fn why_not(operand: &Operand) -> String {
        format!(
            "GPU actors compute generated uniform or genotype matrices and stored matrices on \
             the device; {} is computed on the actor's CPU cores",
            operand.describe()
        )
    }

    fn generated(&self) -> &Generated {
        match self {
            DeviceSource::Uniform(g) | DeviceSource::Genotypes(g, _) | DeviceSource::Dosages(g) => {
                g
            }
        }
    }

    /// The values of a tile's codes, 4 per row (codes 0, 1, 2 and 3), for rows from
    /// `first` with code counts `counts` (4 per row), adding the rows' facts.
    pub(crate) fn tables<T: Real>(
        &self,
        counts: &[u32],
        first: u64,
        measure: bool,
        facts: &mut PanelFacts,
    ) -> Vec<T> {
        match self {
            DeviceSource::Genotypes(_, filter) => {
                tables_from_counts(counts, first, filter, measure, facts)
            }
            DeviceSource::Dosages(_) => dosage_tables(counts, measure, facts),
            DeviceSource::Uniform(_) => Vec::new(),
        }
    }
}

/// Tile element types the device computes in.
pub trait GpuReal: TileReal + DeviceRepr + ValidAsZeroBits + bytemuck::Pod {
    /// `c = op(a)·op(b)·alpha + beta·c` by cuBLAS: `Gemm::gemm` of this type, here so that
    /// code generic over the element type needs no `CudaBlas: Gemm<T>` bound.
    ///
    /// # Safety
    /// As `Gemm::gemm`: `cfg` must describe matrices inside the three buffers.
    unsafe fn cublas_gemm<A: DevicePtr<Self>, B: DevicePtr<Self>, C: DevicePtrMut<Self>>(
        blas: &CudaBlas,
        cfg: GemmConfig<Self>,
        a: &A,
        b: &B,
        c: &mut C,
    ) -> Result<(), CublasError>;
    /// The generator kernel of uniform values.
    fn uniform(k: &GpuKernels) -> &CudaFunction;
    /// The packed-codes standardization kernel.
    fn standardize(k: &GpuKernels) -> &CudaFunction;
    /// The sum-of-squares kernel.
    fn sum_squares_kernel(k: &GpuKernels) -> &CudaFunction;
    /// Columns per GEMM whose product is summed in f64 (all of them for f64).
    fn chunk(n: usize) -> usize;
    /// The f64 sums as a buffer of this type, when products go straight into them (f64).
    fn sums(acc: &mut CudaSlice<f64>) -> Option<&mut CudaSlice<Self>>;
}

impl GpuReal for f64 {
    unsafe fn cublas_gemm<A: DevicePtr<f64>, B: DevicePtr<f64>, C: DevicePtrMut<f64>>(
        blas: &CudaBlas,
        cfg: GemmConfig<f64>,
        a: &A,
        b: &B,
        c: &mut C,
    ) -> Result<(), CublasError> {
        // SAFETY: the caller's contract.
        unsafe { <CudaBlas as Gemm<f64>>::gemm(blas, cfg, a, b, c) }
    }
    fn uniform(k: &GpuKernels) -> &CudaFunction {
        &k.uniform_f64
    }
    fn standardize(k: &GpuKernels) -> &CudaFunction {
        &k.standardize_f64
    }
    fn sum_squares_kernel(k: &GpuKernels) -> &CudaFunction {
        &k.sum_squares_f64
    }
    fn chunk(n: usize) -> usize {
        n.max(1)
    }
    fn sums(acc: &mut CudaSlice<f64>) -> Option<&mut CudaSlice<f64>> {
        Some(acc)
    }
}

impl GpuReal for f32 {
    unsafe fn cublas_gemm<A: DevicePtr<f32>, B: DevicePtr<f32>, C: DevicePtrMut<f32>>(
        blas: &CudaBlas,
        cfg: GemmConfig<f32>,
        a: &A,
        b: &B,
        c: &mut C,
    ) -> Result<(), CublasError> {
        // SAFETY: the caller's contract.
        unsafe { <CudaBlas as Gemm<f32>>::gemm(blas, cfg, a, b, c) }
    }
    fn uniform(k: &GpuKernels) -> &CudaFunction {
        &k.uniform_f32
    }
    fn standardize(k: &GpuKernels) -> &CudaFunction {
        &k.standardize_f32
    }
    fn sum_squares_kernel(k: &GpuKernels) -> &CudaFunction {
        &k.sum_squares_f32
    }
    fn chunk(_n: usize) -> usize {
        F32_CHUNK
    }
    fn sums(_acc: &mut CudaSlice<f64>) -> Option<&mut CudaSlice<f32>> {
        None
    }
}

/// Rows of a device tile of `n` columns of `bytes_per_value` bytes: as many as fit in
/// `TILE_BYTES`, at least one, at most `h` and at most 65,535 (one grid row each).
pub(crate) fn tile_rows(n: usize, bytes_per_value: usize, h: usize) -> usize {
    (TILE_BYTES / (n.max(1) * bytes_per_value))
        .clamp(1, 65_535)
        .min(h.max(1))
}

pub(crate) fn grid(width: usize, rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (width as u32).div_ceil(BLOCK).max(1),
            rows.clamp(1, 65_535) as u32,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Most blocks of a [`flat`] grid.
const MAX_BLOCKS: usize = 1 << 16;

fn flat(len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (len as u64)
                .div_ceil(BLOCK as u64)
                .clamp(1, MAX_BLOCKS as u64) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn gpu<'d>(
    dev: &'d GpuDevice,
    what: &str,
) -> impl Fn(cudarc::driver::DriverError) -> LinalgError + 'd {
    let what = what.to_string();
    move |e| LinalgError::Gpu(dev.error(&what, e))
}

fn blas_err(dev: &GpuDevice, what: &str, e: cudarc::cublas::result::CublasError) -> LinalgError {
    LinalgError::Gpu(dev.error(what, e))
}

/// Produces a panel's row tiles on the device.
struct Producer<'d, T: GpuReal> {
    dev: &'d GpuDevice,
    src: &'d DeviceSource,
    n: usize,
    rows: usize,
    /// The current tile's values, `rows × n`.
    tile: CudaSlice<T>,
    /// Genotypes: packed codes, per-variant code counts, thresholds and tables.
    packed: Option<CudaSlice<u8>>,
    counts: Option<CudaSlice<u32>>,
    /// One partial Σx² per block of a `flat` grid.
    sum: CudaSlice<f64>,
    thresholds: Vec<u64>,
    /// Genotypes kept on the device for later passes: the whole panel's codes (each tile's
    /// at its rows, from the panel's first row `first`) and its code counts.
    keep: Option<(u64, CudaSlice<u8>, Vec<u32>)>,
}

impl<'d, T: GpuReal> Producer<'d, T> {
    fn new(
        dev: &'d GpuDevice,
        src: &'d DeviceSource,
        n: usize,
        h: usize,
    ) -> Result<Self, LinalgError> {
        let stream = dev.stream();
        let rows = tile_rows(n, std::mem::size_of::<T>(), h);
        let alloc = gpu(dev, "allocating a tile");
        let tile = stream.alloc_zeros::<T>(rows * n).map_err(&alloc)?;
        let (packed, counts) = match src {
            DeviceSource::Genotypes(..) | DeviceSource::Dosages(_) => (
                Some(
                    stream
                        .alloc_zeros::<u8>(rows * n.div_ceil(4))
                        .map_err(&alloc)?,
                ),
                Some(stream.alloc_zeros::<u32>(rows * 4).map_err(&alloc)?),
            ),
            DeviceSource::Uniform(_) => (None, None),
        };
        let sum = stream.alloc_zeros::<f64>(MAX_BLOCKS).map_err(&alloc)?;
        Ok(Producer {
            dev,
            src,
            n,
            rows,
            tile,
            packed,
            counts,
            sum,
            thresholds: Vec::new(),
            keep: None,
        })
    }

    /// Keeps the codes of the panel of `h` rows from row `first` (genotypes only).
    fn keeping(&mut self, first: u64, h: usize) -> Result<(), LinalgError> {
        let whole = self
            .dev
            .stream()
            .alloc_zeros::<u8>(h * self.n.div_ceil(4))
            .map_err(gpu(self.dev, "allocating kept codes"))?;
        self.keep = Some((first, whole, Vec::with_capacity(4 * h)));
        Ok(())
    }

    /// Produces global rows `g` (at most `self.rows`) into the tile; adds their facts.
    fn produce(
        &mut self,
        g: Range<u64>,
        measure: bool,
        facts: &mut PanelFacts,
    ) -> Result<(), LinalgError> {
        let dev = self.dev;
        let stream = dev.stream();
        let k = dev.kernels();
        let b = (g.end - g.start) as usize;
        let (n32, b32) = (self.n as u32, b as u32);
        let gen = self.src.generated();
        let key = gen.key();
        match self.src {
            DeviceSource::Uniform(_) => {
                let col0 = 0u64;
                let mut l = stream.launch_builder(T::uniform(k));
                l.arg(&mut self.tile)
                    .arg(&key)
                    .arg(&g.start)
                    .arg(&col0)
                    .arg(&b32)
                    .arg(&n32)
                    .arg(&n32);
                // One thread per (256-column block, lane) of the row.
                let threads = self.n.div_ceil(BLOCK_COLS) * LANES;
                // SAFETY: the kernel writes b rows of n values at stride n inside the tile
                // (b ≤ self.rows), and takes its scalars by value.
                unsafe { l.launch(grid(threads, b)) }
                    .map_err(gpu(dev, "generating uniform values"))?;
                if measure {
                    facts.sum_squares += self.sum_squares(b * self.n)?;
                }
            }
            DeviceSource::Genotypes(..) | DeviceSource::Dosages(_) => {
                let pops = gen.populations() as u32;
                self.thresholds.clear();
                gen.genotype_thresholds(g.clone(), &mut self.thresholds);
                let th = stream
                    .clone_htod(&self.thresholds)
                    .map_err(gpu(dev, "copying allele-frequency thresholds"))?;
                let stride = self.n.div_ceil(4);
                // Where the tile's codes go: the kept panel's rows, or the tile's buffer.
                let off = match &self.keep {
                    Some((first, ..)) => (g.start - first) as usize * stride,
                    None => 0,
                };
                let counts = self.counts.as_mut().expect("genotype producer");
                stream
                    .memset_zeros(counts)
                    .map_err(gpu(dev, "zeroing code counts"))?;
                let st32 = stride as u32;
                let missing = gen.missing_threshold();
                {
                    let mut packed = match &mut self.keep {
                        Some((_, whole, _)) => whole.slice_mut(off..),
                        None => self
                            .packed
                            .as_mut()
                            .expect("genotype producer")
                            .slice_mut(..),
                    };
                    let mut l = stream.launch_builder(&k.genotype_packed);
                    l.arg(&mut packed)
                        .arg(&mut *counts)
                        .arg(&th)
                        .arg(&key)
                        .arg(&g.start)
                        .arg(&b32)
                        .arg(&n32)
                        .arg(&pops)
                        .arg(&missing)
                        .arg(&st32);
                    // SAFETY: b rows of `stride` packed bytes from `off` and 4 counts each
                    // fit the buffers; the thresholds hold b·pops entries.
                    unsafe { l.launch(grid(self.n.div_ceil(BLOCK_COLS), b)) }
                        .map_err(gpu(dev, "generating genotypes"))?;
                }
                let mut host = vec![0u32; 4 * b];
                // Plain dosages need their counts only for Σx² (and to be kept): without it
                // the host does not wait for the device here, and queues the panel's tiles
                // ahead of it.
                if measure || self.keep.is_some() || !matches!(self.src, DeviceSource::Dosages(_)) {
                    stream
                        .memcpy_dtoh(&counts.slice(..4 * b), &mut host)
                        .map_err(gpu(dev, "copying code counts"))?;
                }
                if let Some((_, _, kept)) = &mut self.keep {
                    kept.extend_from_slice(&host);
                }
                let table = self.src.tables::<T>(&host, g.start, measure, facts);
                let table = stream
                    .clone_htod(&table)
                    .map_err(gpu(dev, "copying standardization tables"))?;
                let packed = match &self.keep {
                    Some((_, whole, _)) => whole.slice(off..),
                    None => self.packed.as_ref().expect("genotype producer").slice(..),
                };
                let col0 = 0u32;
                let mut l = stream.launch_builder(T::standardize(k));
                l.arg(&mut self.tile)
                    .arg(&packed)
                    .arg(&table)
                    .arg(&col0)
                    .arg(&b32)
                    .arg(&n32)
                    .arg(&st32)
                    .arg(&n32);
                // SAFETY: reads b rows of packed codes and 4 table entries per row, writes
                // b rows of n values into the tile.
                unsafe { l.launch(grid(self.n, b)) }
                    .map_err(gpu(dev, "standardizing genotypes"))?;
            }
        }
        Ok(())
    }

    /// Produces rows `rows` tile by tile, handing `f` each tile, the offset of its first
    /// row in `rows` and its row count.
    fn each_tile<F>(
        &mut self,
        rows: Range<u64>,
        measure: bool,
        facts: &mut PanelFacts,
        mut f: F,
    ) -> Result<(), LinalgError>
    where
        F: FnMut(&CudaSlice<T>, usize, usize) -> Result<(), LinalgError>,
    {
        let h = (rows.end - rows.start) as usize;
        for r0 in (0..h).step_by(self.rows) {
            let r1 = (r0 + self.rows).min(h);
            self.produce(
                rows.start + r0 as u64..rows.start + r1 as u64,
                measure,
                facts,
            )?;
            f(&self.tile, r0, r1 - r0)?;
        }
        Ok(())
    }

    /// Σ x² of the first `len` values of the tile: the blocks' partial sums, added in
    /// block order on the host, so that a panel's figure is the same on every run.
    fn sum_squares(&mut self, len: usize) -> Result<f64, LinalgError> {
        let dev = self.dev;
        let stream = dev.stream();
        let cfg = flat(len);
        let blocks = cfg.grid_dim.0 as usize;
        let len64 = len as u64;
        let mut l = stream.launch_builder(T::sum_squares_kernel(dev.kernels()));
        l.arg(&self.tile).arg(&len64).arg(&mut self.sum);
        // SAFETY: reads `len` ≤ tile length values; writes one f64 per block, and `sum`
        // holds one per block of the largest grid `flat` makes.
        unsafe { l.launch(cfg) }.map_err(gpu(dev, "summing squares"))?;
        let mut partial = vec![0f64; blocks];
        stream
            .memcpy_dtoh(&self.sum.slice(..blocks), &mut partial)
            .map_err(gpu(dev, "copying partial sums"))?;
        Ok(partial.iter().sum())
    }
}

/// Each variant's standardization table (the values of codes 0, 1, 2 and 3) from its code
/// counts (`counts[4 i + code]`, variant `i` being row `first + i`), as the CPU kernels
/// compute it, adding the variants' facts.
pub(crate) fn tables_from_counts<T: Real>(
    counts: &[u32],
    first: u64,
    filter: &VariantFilter,
    measure: bool,
    facts: &mut PanelFacts,
) -> Vec<T> {
    let mut table = Vec::with_capacity(counts.len());
    for (row, c) in (first..).zip(counts.chunks_exact(4)) {
        let counts = RowCounts {
            dosages: [c[0] as u64, c[1] as u64, c[2] as u64],
            missing: c[3] as u64,
        };
        let scale = facts.variant::<T>(row, &counts, filter, measure);
        table.extend(scale.table().iter().map(|&v| T::from_f64(v)));
    }
    table
}

/// [`DeviceSource::Dosages`]' tables: codes 0, 1, 2 are their dosages and a missing call
/// is −1, as `Generated::value` makes them. Σx² comes from the counts: the values are small
/// integers, so it is exact, as the CPU's f64 sum of them is.
fn dosage_tables<T: Real>(counts: &[u32], measure: bool, facts: &mut PanelFacts) -> Vec<T> {
    if measure {
        facts.sum_squares += counts
            .chunks_exact(4)
            .map(|c| (c[1] as u64 + 4 * c[2] as u64 + c[3] as u64) as f64)
            .sum::<f64>();
    }
    let row = [0.0, 1.0, 2.0, -1.0].map(T::from_f64);
    counts.chunks_exact(4).flat_map(|_| row).collect()
}

/// `acc += part` on the device, `len` values.
fn add_into<T: GpuReal>(
    dev: &GpuDevice,
    acc: &mut CudaViewMut<'_, f64>,
    part: &CudaView<'_, T>,
    len: usize,
) -> Result<(), LinalgError> {
    let k = dev.kernels();
    let f = if std::mem::size_of::<T>() == 4 {
        &k.add_f32_to_f64
    } else {
        &k.add_f64
    };
    let len64 = len as u64;
    let mut l = dev.stream().launch_builder(f);
    l.arg(acc).arg(part).arg(&len64);
    // SAFETY: both buffers hold at least `len` values of the kernel's types (f32 parts go
    // to add_f32_to_f64, f64 parts to add_f64).
    unsafe { l.launch(flat(len)) }.map_err(gpu(dev, "adding partial products"))?;
    Ok(())
}

/// One cuBLAS GEMM of a panel's products, `C = op(A)·op(B) (+ C)` in cuBLAS's column-major
/// terms (`A` never transposed), and the ranges of its three buffers that it covers.
///
/// Everything is row-major, which cuBLAS sees as the transpose, so the products are
/// written transposed: `Yᵀ = Ωᵀ·Tᵀ` in the range pass and `Bᵀ = Tᵀ·X` in the projection.
/// The steps are plain data so that a test can run them through a column-major host GEMM.
#[derive(Clone, Debug, PartialEq, Eq)]
struct GemmStep {
    /// Whether `B` is transposed.
    transb: bool,
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    /// The values of each buffer the GEMM reads or writes, from the buffer's start.
    a: Range<usize>,
    b: Range<usize>,
    c: Range<usize>,
}

impl GemmStep {
    /// Whether a column-major operand of `rows × cols` (stored, before any transposition)
    /// with leading dimension `ld` lies within `len` values.
    fn fits(rows: usize, cols: usize, ld: usize, len: usize) -> bool {
        rows == 0 || cols == 0 || (ld >= rows && (cols - 1) * ld + rows <= len)
    }

    /// Whether every operand lies within its range (what cuBLAS trusts its caller with).
    fn in_bounds(&self) -> bool {
        let (bm, bn) = if self.transb {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        Self::fits(self.m, self.k, self.lda, self.a.len())
            && Self::fits(bm, bn, self.ldb, self.b.len())
            && Self::fits(self.m, self.n, self.ldc, self.c.len())
    }

    /// Runs the GEMM on the device with `a`, `b` and `c` its three ranges.
    fn run<T: GpuReal, A: DevicePtr<T>, B: DevicePtr<T>, C: DevicePtrMut<T>>(
        &self,
        dev: &GpuDevice,
        beta: T,
        a: &A,
        b: &B,
        c: &mut C,
        what: &str,
    ) -> Result<(), LinalgError> {
        let lens = (a.len(), b.len(), c.len());
        if !self.in_bounds() || lens != (self.a.len(), self.b.len(), self.c.len()) {
            return Err(LinalgError::Gpu(dev.error(
                what,
                format!("a GEMM outside its buffers: {self:?} on buffers of {lens:?} values"),
            )));
        }
        let cfg = GemmConfig {
            transa: CUBLAS_OP_N,
            transb: if self.transb {
                CUBLAS_OP_T
            } else {
                CUBLAS_OP_N
            },
            m: self.m as i32,
            n: self.n as i32,
            k: self.k as i32,
            alpha: T::one(),
            lda: self.lda as i32,
            ldb: self.ldb as i32,
            beta,
            ldc: self.ldc as i32,
        };
        // SAFETY: `in_bounds` checked that each operand lies within its buffer.
        unsafe { T::cublas_gemm(dev.blas(), cfg, a, b, c) }.map_err(|e| blas_err(dev, what, e))
    }
}

/// The range pass's GEMMs for rows `r0..r0 + rows` of a panel of `n` columns and a test
/// matrix of `w` columns: `Yᵀ (w × rows) = Ωᵀ (w × n) · tileᵀ (n × rows)` in column chunks
/// of `chunk`, each into the block's rows of `Y` (`direct`, f64) or into the start of a
/// part buffer that the caller adds to them (f32).
fn range_steps(
    n: usize,
    w: usize,
    r0: usize,
    rows: usize,
    chunk: usize,
    direct: bool,
) -> Vec<GemmStep> {
    (0..n)
        .step_by(chunk.max(1))
        .map(|c0| {
            let kc = chunk.min(n - c0);
            GemmStep {
                transb: false,
                m: w,
                n: rows,
                k: kc,
                lda: w,
                ldb: n,
                ldc: w,
                a: c0 * w..(c0 + kc) * w,
                b: c0..rows * n,
                c: if direct {
                    r0 * w..(r0 + rows) * w
                } else {
                    0..rows * w
                },
            }
        })
        .collect()
}

/// The projection's GEMM for a block of `rows` rows: `Bᵀ (n × l) = tileᵀ (n × rows) · X
/// (rows × l)`, X the block's rows (row-major with leading dimension `ldx`, its first `l`
/// columns used), which cuBLAS sees as `Xᵀ`.
fn project_step(n: usize, l: usize, rows: usize, ldx: usize) -> GemmStep {
    GemmStep {
        transb: true,
        m: n,
        n: l,
        k: rows,
        lda: n,
        ldb: ldx,
        ldc: n,
        a: 0..rows * n,
        b: 0..rows * ldx,
        c: 0..l * n,
    }
}

/// What one panel's tiles are multiplied for on the device.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PanelJob<'a, T> {
    /// The range pass: `Y = A·Ω` (`h × w`), and with `fused: Some(l)` also
    /// `W = Y[:, ..l]ᵀ·A` (`l × n`) from the same tiles, each row block of `Y` as soon as
    /// its rows are complete (they depend on the block's rows of `A` only).
    Range {
        /// The test matrix with its probe columns, `n × w`.
        omega: ArrayView2<'a, T>,
        /// The columns of `Y` that `W` is formed from, when the projections are fused.
        fused: Option<usize>,
    },
    /// The projection pass: `B = Qᵀ·A` (`l × n`) for the panel's rows of the basis.
    Project {
        /// The panel's rows of `Q`, `h × l`.
        q: ArrayView2<'a, f64>,
    },
}

/// Where a GPU actor's panels spent their time, summed over its panels (device-produced
/// panels: generated uniform values and genotypes). `produce` and `multiply` are device
/// time between CUDA events around each tile's steps, so a wait of the device for the host
/// inside a step (the genotypes' code counts read back, the tables computed and copied up)
/// counts in that step; `setup` and `finish` are host wall time.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuPanelSeconds {
    /// Allocating a panel's tile and product buffers and copying up Ω or `Q`'s rows.
    pub setup: f64,
    /// Producing the tiles: generating, (genotypes) packing, counting, reading the counts
    /// back and standardizing through the host's tables; with the sums of squares measured.
    pub produce: f64,
    /// The tiles' GEMMs and, in f32, adding their products to the f64 sums.
    pub multiply: f64,
    /// Waiting for the panel's last work and copying `Y` and `W`/`B` back.
    pub finish: f64,
    /// Panels timed.
    pub panels: u64,
    /// Tiles timed.
    pub tiles: u64,
}

impl GpuPanelSeconds {
    /// Adds `o` to these.
    pub fn add(&mut self, o: &GpuPanelSeconds) {
        self.setup += o.setup;
        self.produce += o.produce;
        self.multiply += o.multiply;
        self.finish += o.finish;
        self.panels += o.panels;
        self.tiles += o.tiles;
    }
}

/// What a panel's device products bring back to the host.
#[derive(Debug, Default)]
pub(crate) struct PanelOut {
    /// `Y` (`h × w`), in range passes.
    pub y: Option<Array2<f64>>,
    /// `W` (fused range passes) or `B` (projection passes), `l × n`.
    pub b: Option<Array2<f64>>,
    /// The panel's facts, when the device produced its values; a staged panel's facts
    /// come from the host that decoded it.
    pub facts: PanelFacts,
    /// Where a device-produced panel's time went.
    pub seconds: GpuPanelSeconds,
}

/// The device buffers of one panel's products, fed a block of the panel's rows at a time.
pub(crate) struct Products<'d, T: GpuReal> {
    dev: &'d GpuDevice,
    n: usize,
    h: usize,
    /// Columns of `Y` (range passes; 0 in projection passes).
    w: usize,
    /// Rows of `W`/`B` (0 when there is neither).
    l: usize,
    /// Ω, `n × w` row-major.
    om: Option<CudaSlice<T>>,
    /// `Y` of the whole panel, `h × w` row-major, f64.
    y: Option<CudaSlice<f64>>,
    /// The panel's rows of `Q`, `h × l` row-major.
    q: Option<CudaSlice<T>>,
    /// f32 range passes with fused projections: a block of `Y` rounded to f32.
    yt: Option<CudaSlice<T>>,
    /// `W` or `B`, `l × n` row-major (`Bᵀ` column-major for cuBLAS), f64.
    b: Option<CudaSlice<f64>>,
    /// f32: each product before it is added to the f64 sums.
    part: Option<CudaSlice<T>>,
}

impl<'d, T: GpuReal> Products<'d, T> {
    /// Buffers for a panel of `h × n` fed at most `block` rows at a time.
    pub(crate) fn new(
        dev: &'d GpuDevice,
        n: usize,
        h: usize,
        block: usize,
        job: &PanelJob<'_, T>,
    ) -> Result<Self, LinalgError> {
        let stream = dev.stream();
        let alloc = gpu(dev, "allocating products");
        let f32 = std::mem::size_of::<T>() == 4;
        let (mut om, mut y, mut q, mut yt) = (None, None, None, None);
        let (w, l) = match job {
            PanelJob::Range { omega, fused } => {
                let omega = omega.as_standard_layout();
                om = Some(
                    stream
                        .clone_htod(omega.as_slice().expect("standard layout"))
                        .map_err(gpu(dev, "copying the test matrix"))?,
                );
                let w = omega.ncols();
                y = Some(stream.alloc_zeros::<f64>(h * w).map_err(&alloc)?);
                let l = fused.unwrap_or(0).min(w);
                if l > 0 && f32 {
                    yt = Some(stream.alloc_zeros::<T>(block * w).map_err(&alloc)?);
                }
                (w, l)
            }
            PanelJob::Project { q: rows } => {
                let qt: Vec<T> = rows
                    .as_standard_layout()
                    .iter()
                    .map(|&v| T::from_f64(v))
                    .collect();
                q = Some(
                    stream
                        .clone_htod(&qt)
                        .map_err(gpu(dev, "copying the panel's rows of Q"))?,
                );
                (0, rows.ncols())
            }
        };
        let b = (l > 0)
            .then(|| stream.alloc_zeros::<f64>(l * n))
            .transpose()
            .map_err(&alloc)?;
        let part = f32
            .then(|| stream.alloc_zeros::<T>((block * w).max(l * n).max(1)))
            .transpose()
            .map_err(&alloc)?;
        Ok(Products {
            dev,
            n,
            h,
            w,
            l,
            om,
            y,
            q,
            yt,
            b,
            part,
        })
    }

    /// Multiplies the panel's rows `r0..r0 + rows`: the first `rows · n` values of `tile`,
    /// row-major.
    pub(crate) fn rows(
        &mut self,
        r0: usize,
        rows: usize,
        tile: &CudaSlice<T>,
    ) -> Result<(), LinalgError> {
        let (dev, n, w, l) = (self.dev, self.n, self.w, self.l);
        if rows == 0 || n == 0 {
            return Ok(());
        }
        if let (Some(om), Some(y)) = (&self.om, self.y.as_mut()) {
            let direct = T::sums(y).is_some();
            for step in range_steps(n, w, r0, rows, T::chunk(n), direct) {
                let a = om.slice(step.a.clone());
                let t = tile.slice(step.b.clone());
                if let Some(sums) = T::sums(y) {
                    let mut c = sums.slice_mut(step.c.clone());
                    step.run(dev, T::zero(), &a, &t, &mut c, "GEMM of a tile with Ω")?;
                    continue;
                }
                let part = self.part.as_mut().expect("f32 products have a part buffer");
                {
                    let mut c = part.slice_mut(step.c.clone());
                    step.run(dev, T::zero(), &a, &t, &mut c, "GEMM of a tile with Ω")?;
                }
                let mut acc = y.slice_mut(r0 * w..(r0 + rows) * w);
                add_into(dev, &mut acc, &part.slice(..rows * w), rows * w)?;
            }
        }
        if l == 0 {
            return Ok(());
        }
        // X is the block's rows of Q (leading dimension l) or of Y (leading dimension w,
        // its first l columns; f32 passes round them to f32 first).
        let (x, ldx): (CudaView<'_, T>, usize) = if let Some(q) = &self.q {
            (q.slice(r0 * l..(r0 + rows) * l), l)
        } else {
            let y = self.y.as_mut().expect("range passes keep Y");
            if T::sums(y).is_none() {
                let yt = self.yt.as_mut().expect("f32 fused passes round Y");
                let len = (rows * w) as u64;
                let mut launch = dev.stream().launch_builder(&dev.kernels().round_f64_to_f32);
                let src = y.slice(r0 * w..(r0 + rows) * w);
                launch.arg(&mut *yt).arg(&src).arg(&len);
                // SAFETY: `yt` holds `block · w` ≥ rows · w values; the source rows · w.
                unsafe { launch.launch(flat(rows * w)) }.map_err(gpu(dev, "rounding Y to f32"))?;
                (yt.slice(..rows * w), w)
            } else {
                let sums = T::sums(y).expect("f64");
                (sums.slice(r0 * w..(r0 + rows) * w), w)
            }
        };
        let b = self.b.as_mut().expect("l > 0 keeps B");
        let step = project_step(n, l, rows, ldx);
        let t = tile.slice(step.a.clone());
        let x = x.slice(step.b.clone());
        let what = "GEMM of a tile with Q or Y";
        if let Some(sums) = T::sums(b) {
            let mut c = sums.slice_mut(step.c.clone());
            return step.run(dev, T::one(), &t, &x, &mut c, what);
        }
        let part = self.part.as_mut().expect("f32 products have a part buffer");
        {
            let mut c = part.slice_mut(step.c.clone());
            step.run(dev, T::zero(), &t, &x, &mut c, what)?;
        }
        add_into(dev, &mut b.slice_mut(..), &part.slice(..l * n), l * n)
    }

    /// Copies `Y` and `W`/`B` into page-locked host buffers and waits for the copies: the
    /// device's part of bringing the products back, after which the caller may give the
    /// device's lane to the next panel before [`Fetched::into_out`] copies them out.
    ///
    /// Why page-locked: copied straight into a new array (pageable memory), `Y` of a panel
    /// of 250,000 rows × 24 (48 MB) took 31 ms on an H200, 28 % of the device time of a
    /// generated panel (RESULTS.md, run G): the driver copies pageable memory through a
    /// buffer of its own, and the array's fresh pages fault in one by one meanwhile.
    pub(crate) fn fetch(self) -> Result<Fetched<'d>, LinalgError> {
        let dev = self.dev;
        let stream = dev.stream();
        let mut fetched = Fetched {
            dev,
            y: None,
            b: None,
        };
        let copy = |src: &CudaSlice<f64>, rows: usize, cols: usize, what: &'static str| {
            let len = rows * cols;
            let mut lease = dev.pinned(len * 8).map_err(LinalgError::Gpu)?;
            let dst = lease.values_mut::<f64>(len).map_err(gpu(dev, what))?;
            stream
                .memcpy_dtoh(&src.slice(..len), dst)
                .map_err(gpu(dev, what))?;
            Ok::<_, LinalgError>((lease, rows, cols))
        };
        if let Some(y) = &self.y {
            fetched.y = Some(copy(y, self.h, self.w, "copying Y")?);
        }
        if let Some(b) = &self.b {
            fetched.b = Some(copy(b, self.l, self.n, "copying B")?);
        }
        stream
            .synchronize()
            .map_err(gpu(dev, "waiting for the products' copies"))?;
        Ok(fetched)
    }
}

/// A panel's products copied back into page-locked buffers, each with its shape.
pub(crate) struct Fetched<'d> {
    dev: &'d GpuDevice,
    y: Option<(PinnedLease<'d>, usize, usize)>,
    b: Option<(PinnedLease<'d>, usize, usize)>,
}

impl Fetched<'_> {
    /// The products as arrays, copied out of the page-locked buffers into memory whose
    /// pages are populated in one call.
    pub(crate) fn into_out(self) -> Result<PanelOut, LinalgError> {
        let dev = self.dev;
        let array = |f: Option<(PinnedLease<'_>, usize, usize)>| {
            f.map(|(lease, rows, cols)| {
                let len = rows * cols;
                let mut v = crate::kernels::alloc_populated(len);
                let src = lease
                    .values::<f64>(len)
                    .map_err(gpu(dev, "reading page-locked products"))?;
                v.copy_from_slice(src);
                Ok::<_, LinalgError>(
                    Array2::from_shape_vec((rows, cols), v).expect("rows × cols values"),
                )
            })
            .transpose()
        };
        Ok(PanelOut {
            y: array(self.y)?,
            b: array(self.b)?,
            ..PanelOut::default()
        })
    }
}

/// One panel of a matrix the device produces itself ([`DeviceSource`]), global rows
/// `rows` with `n` columns: its tiles are produced and multiplied for `job` on the device;
/// with `measure`, the panel's facts are computed too.
pub(crate) fn generated_panel<T: GpuReal>(
    dev: &GpuDevice,
    src: &DeviceSource,
    rows: Range<u64>,
    n: usize,
    job: PanelJob<'_, T>,
    measure: bool,
    keep: bool,
) -> Result<(PanelOut, Option<KeptCodes>), LinalgError> {
    let lane = dev.lock();
    let h = (rows.end - rows.start) as usize;
    let mut facts = PanelFacts::default();
    if h == 0 || n == 0 {
        // Nothing to multiply (and CUDA refuses allocations of no bytes).
        let out = match job {
            PanelJob::Range { omega, fused } => PanelOut {
                y: Some(Array2::zeros((h, omega.ncols()))),
                b: fused.map(|l| Array2::zeros((l.min(omega.ncols()), n))),
                facts,
                seconds: GpuPanelSeconds::default(),
            },
            PanelJob::Project { q } => PanelOut {
                y: None,
                b: Some(Array2::zeros((q.ncols(), n))),
                facts,
                seconds: GpuPanelSeconds::default(),
            },
        };
        return Ok((out, None));
    }
    let setup = std::time::Instant::now();
    let mut p = Producer::<T>::new(dev, src, n, h)?;
    let keep = keep && !matches!(src, DeviceSource::Uniform(_));
    if keep {
        p.keeping(rows.start, h)?;
    }
    let mut products = Products::new(dev, n, h, p.rows, &job)?;
    let mut seconds = GpuPanelSeconds {
        setup: setup.elapsed().as_secs_f64(),
        panels: 1,
        ..GpuPanelSeconds::default()
    };
    // Events before each tile is produced, and before and after it is multiplied: device
    // time, read once the panel's copies back have waited for the stream.
    let stream = dev.stream();
    let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mark = || {
        stream
            .record_event(timed)
            .map_err(gpu(dev, "recording a timing event"))
    };
    let mut marks = vec![mark()?];
    p.each_tile(rows, measure, &mut facts, |tile, r0, b| {
        marks.push(mark()?);
        products.rows(r0, b, tile)?;
        marks.push(mark()?);
        Ok(())
    })?;
    let finish = std::time::Instant::now();
    let fetched = products.fetch()?;
    // The device is done with the panel: the next may start while this one's products
    // are copied out of the page-locked buffers.
    drop(lane);
    let mut out = fetched.into_out()?;
    seconds.finish = finish.elapsed().as_secs_f64();
    for (i, pair) in marks.windows(2).enumerate() {
        let s = f64::from(
            pair[0]
                .elapsed_ms(&pair[1])
                .map_err(gpu(dev, "reading a timing event"))?,
        ) / 1e3;
        if i % 2 == 0 {
            seconds.produce += s;
        } else {
            seconds.multiply += s;
            seconds.tiles += 1;
        }
    }
    out.facts = facts;
    out.seconds = seconds;
    let kept = p
        .keep
        .take()
        .map(|(_, packed, counts)| KeptCodes { packed, counts });
    Ok((out, kept))
}

/// A genotype panel's 2-bit codes kept in device memory after the pass that produced
/// them (generated on the device, or decoded there from storage), with each variant's code
/// counts, from which a later pass computes its tables in its own precision, and the
/// facts, as the first did ([`kept_panel`]).
pub(crate) struct KeptCodes {
    /// `h × ⌈n/4⌉` codes, row-major.
    pub(crate) packed: CudaSlice<u8>,
    /// 4 per row.
    pub(crate) counts: Vec<u32>,
}

/// A pass over a panel (global rows `rows`, `n` columns) from its codes kept on `dev`:
/// the tables that `tables` makes of the kept counts (adding the facts), then each tile
/// standardized and multiplied for `job`.
pub(crate) fn kept_panel<T: GpuReal>(
    dev: &GpuDevice,
    n: usize,
    kept: &KeptCodes,
    rows: Range<u64>,
    job: PanelJob<'_, T>,
    tables: impl FnOnce(&[u32], u64, &mut PanelFacts) -> Vec<T>,
) -> Result<PanelOut, LinalgError> {
    let h = (rows.end - rows.start) as usize;
    let tile = tile_rows(n, std::mem::size_of::<T>(), h);
    let mut facts = PanelFacts::default();
    let table = tables(&kept.counts, rows.start, &mut facts);
    let lane = dev.lock();
    dev.bind().map_err(LinalgError::Gpu)?;
    let stream = dev.stream();
    let mut values = stream
        .alloc_zeros::<T>(tile * n.max(1))
        .map_err(gpu(dev, "allocating a tile"))?;
    let table = stream
        .clone_htod(&table)
        .map_err(gpu(dev, "copying standardization tables"))?;
    let mut products = Products::new(dev, n, h, tile, &job)?;
    for r in (0..h).step_by(tile) {
        let t = tile.min(h - r);
        standardize_rows(dev, &mut values, &kept.packed, &table, r, t, n)?;
        products.rows(r, t, &values)?;
    }
    let fetched = products.fetch()?;
    drop(lane);
    let mut out = fetched.into_out()?;
    out.facts = facts;
    Ok(out)
}

/// Standardizes rows `r..r + t` of packed codes (`n` columns) through their tables (4 per
/// row, from row 0 of `table`) into `values`.
pub(crate) fn standardize_rows<T: GpuReal>(
    dev: &GpuDevice,
    values: &mut CudaSlice<T>,
    packed: &CudaSlice<u8>,
    table: &CudaSlice<T>,
    r: usize,
    t: usize,
    n: usize,
) -> Result<(), LinalgError> {
    let stride = n.div_ceil(4);
    let (t32, n32, st32, col0) = (t as u32, n as u32, stride as u32, 0u32);
    let codes = packed.slice(r * stride..);
    let tab = table.slice(4 * r..);
    let mut l = dev.stream().launch_builder(T::standardize(dev.kernels()));
    l.arg(values)
        .arg(&codes)
        .arg(&tab)
        .arg(&col0)
        .arg(&t32)
        .arg(&n32)
        .arg(&st32)
        .arg(&n32);
    // SAFETY: reads t rows of codes and 4 table entries each from row r (the caller's rows
    // lie inside both), writes t rows of n values, which `values` holds.
    unsafe { l.launch(grid(n, t)) }.map_err(gpu(dev, "standardizing genotypes"))?;
    Ok(())
}

/// Bytes of the values of one staged block of rows on the device (its rows are chosen to
/// fit, in whole row blocks of [`TILE_ROWS`]).
const STAGE_BYTES: usize = 64 << 20;

/// Rows per staged block of a panel of `h` rows and `n` columns of `bytes_per_value`
/// bytes on the device: whole row blocks of [`TILE_ROWS`] that fit in `STAGE_BYTES`, at
/// least one, and no more than the panel needs.
pub(crate) fn stage_rows(n: usize, bytes_per_value: usize, h: usize) -> usize {
    let fit = STAGE_BYTES / (n.max(1) * bytes_per_value.max(1)) / TILE_ROWS * TILE_ROWS;
    fit.max(TILE_ROWS).min(h.max(1).next_multiple_of(TILE_ROWS))
}

/// One staging's page-locked blocks for a panel of `h` rows of the stored `operand` in
/// values of `size` bytes: rows per block, and the bytes of each block of codes (2-bit
/// genotypes) or values, and of each block of tables (genotypes only; 0 for floats).
fn stage_layout(operand: &Operand, size: usize, h: usize) -> (usize, usize, usize) {
    let n = operand.shape().1 as usize;
    let rows = stage_rows(n, size, h);
    match operand {
        Operand::Genotypes(..) => (rows, rows * n.div_ceil(4), rows * 4 * size),
        Operand::Dense(_) => (rows, rows * n * size, 0),
    }
}

/// Page-locked host bytes one [`Staging`] of a panel of `h` rows holds while it runs: two
/// blocks of codes and tables, or of values. A GPU actor's workers stage one panel each,
/// so the plans count this per worker thread.
pub(crate) fn staging_host_bytes(operand: &Operand, precision: Precision, h: usize) -> u64 {
    let (_, block, tables) = stage_layout(operand, precision.bytes(), h);
    2 * (block + tables) as u64
}

/// Which rows of a panel the staged block being filled holds. Tiles come in row blocks
/// (every column tile of a block, then the next block); a block is sent when the next row
/// block would not fit, so staged blocks are whole row blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StageFill {
    /// Capacity in rows.
    rows: usize,
    /// The panel row the block starts at.
    base: usize,
    /// Rows complete in the block.
    filled: usize,
}

impl StageFill {
    /// Whether the block must be sent before the tile at column `c0` of a row block of
    /// `b` rows is placed.
    fn full_before(&self, c0: usize, b: usize) -> bool {
        c0 == 0 && self.filled > 0 && self.filled + b > self.rows
    }

    /// The block row that panel row `r0` goes to, for `b` rows, if they fit.
    fn local(&self, r0: usize, b: usize) -> Option<usize> {
        r0.checked_sub(self.base).filter(|&i| i + b <= self.rows)
    }

    /// A tile was placed at block row `local`; with `last_column` its row block is
    /// complete.
    fn placed(&mut self, local: usize, b: usize, last_column: bool) {
        if last_column {
            self.filled = self.filled.max(local + b);
        }
    }

    /// The block was sent: the next starts after it.
    fn sent(&mut self) {
        self.base += self.filled;
        self.filled = 0;
    }
}

/// Writes a packed tile's rows into a staged block at block row `local`: their codes
/// (`stride` bytes a row) and each variant's 4-entry table in the tiles' type (the values
/// the CPU kernels standardize to). Every column tile of a row block carries the block's
/// whole rows of codes, so only the first (`c0 = 0`) is staged.
fn stage_codes<T: Real>(
    p: &PackedTile<'_>,
    local: usize,
    stride: usize,
    codes: &mut [u8],
    tables: &mut [T],
) {
    let b = p.rows;
    codes[local * stride..(local + b) * stride].copy_from_slice(&p.bytes[..b * stride]);
    for (i, scale) in p.scales.iter().take(b).enumerate() {
        let row = &mut tables[4 * (local + i)..4 * (local + i + 1)];
        for (d, v) in row.iter_mut().zip(scale.table()) {
            *d = T::from_f64(v);
        }
    }
}

/// Writes a tile of values (columns from `c0`) into a staged block of rows of `n` values,
/// at block row `local`.
fn stage_values<T: Copy>(
    t: ArrayView2<'_, T>,
    local: usize,
    c0: usize,
    n: usize,
    values: &mut [T],
) {
    let cols = t.ncols();
    for (i, row) in t.rows().into_iter().enumerate() {
        let at = (local + i) * n + c0;
        match row.as_slice() {
            Some(r) => values[at..at + cols].copy_from_slice(r),
            None => values[at..at + cols]
                .iter_mut()
                .zip(row.iter())
                .for_each(|(d, &v)| *d = v),
        }
    }
}

/// The device buffers a staged block travels to.
enum Slots<T> {
    /// Genotypes: 2-bit codes and per-variant tables, standardized into `tile` on the
    /// device.
    Packed {
        /// Bytes per row of codes.
        stride: usize,
        codes: [CudaSlice<u8>; 2],
        tables: [CudaSlice<T>; 2],
        tile: CudaSlice<T>,
    },
    /// Float values in the tiles' type.
    Values { values: [CudaSlice<T>; 2] },
}

/// A stored panel's tiles, decoded on the host by the actor's threads, staged into
/// page-locked buffers and copied to the device on its copy stream, double-buffered: while
/// the device copies and multiplies one block of rows, the host fills the other buffer,
/// and the copy of the next block overlaps the products of the last. Genotypes travel
/// 2-bit packed with four table entries per variant (a quarter of int8's bytes), and are
/// standardized on the device.
///
/// Feed it every tile of the panel from [`crate::tiles::TileProducer`] with
/// [`crate::tiles::Packing::Always`], in the producer's order, then call
/// [`Staging::finish`].
///
/// Unlike the device-produced passes it does not hold the device's lane
/// ([`GpuDevice::lock`]) for the panel: the actor's workers take their panels' segments
/// from one read-ahead, which is free of deadlock only while each worker waits for nothing
/// but its own panel's segments (`reads::read_units`). A worker waiting for the lane while
/// the read-ahead's buffers hold its panel's first segments would stop the worker holding
/// the lane from ever getting its next one. Concurrent stagings share the actor's two
/// streams, each with buffers of its own (`STAGE_BYTES` of device values, two
/// page-locked blocks of codes or values on the host, which the plans count per worker
/// thread: [`staging_host_bytes`]).
pub(crate) struct Staging<'d, T: GpuReal> {
    dev: &'d GpuDevice,
    products: Products<'d, T>,
    panel: usize,
    n: usize,
    /// The page-locked buffers: codes or values, and tables.
    host: [PinnedLease<'d>; 2],
    tables: Option<[PinnedLease<'d>; 2]>,
    slots: Slots<T>,
    /// The slot being filled, and which rows of the panel it holds.
    slot: usize,
    fill: StageFill,
    /// Bytes copied to the device.
    staged: u64,
    error: Option<LinalgError>,
}

impl<'d, T: GpuReal> Staging<'d, T> {
    /// Staging for panel `panel` (`h` rows) of the stored `operand`, multiplied for `job`.
    pub(crate) fn new(
        dev: &'d GpuDevice,
        operand: &Operand,
        panel: usize,
        h: usize,
        job: PanelJob<'_, T>,
    ) -> Result<Self, LinalgError> {
        let n = operand.shape().1 as usize;
        let (rows, block, table_bytes) = stage_layout(operand, std::mem::size_of::<T>(), h);
        let stream = dev.stream();
        let alloc = gpu(dev, "allocating staging buffers");
        let pinned = |bytes| dev.pinned(bytes).map_err(LinalgError::Gpu);
        let (host, tables, slots) = match operand {
            Operand::Genotypes(..) => {
                let stride = n.div_ceil(4);
                let host = [pinned(block)?, pinned(block)?];
                let tables = [pinned(table_bytes)?, pinned(table_bytes)?];
                let two = |len| -> Result<_, LinalgError> {
                    Ok([
                        stream.alloc_zeros::<u8>(len).map_err(&alloc)?,
                        stream.alloc_zeros::<u8>(len).map_err(&alloc)?,
                    ])
                };
                let slots = Slots::Packed {
                    stride,
                    codes: two(rows * stride)?,
                    tables: [
                        stream.alloc_zeros::<T>(rows * 4).map_err(&alloc)?,
                        stream.alloc_zeros::<T>(rows * 4).map_err(&alloc)?,
                    ],
                    tile: stream.alloc_zeros::<T>(rows * n.max(1)).map_err(&alloc)?,
                };
                (host, Some(tables), slots)
            }
            Operand::Dense(_) => {
                let host = [pinned(block)?, pinned(block)?];
                let slots = Slots::Values {
                    values: [
                        stream.alloc_zeros::<T>(rows * n.max(1)).map_err(&alloc)?,
                        stream.alloc_zeros::<T>(rows * n.max(1)).map_err(&alloc)?,
                    ],
                };
                (host, None, slots)
            }
        };
        let products = Products::new(dev, n, h, rows, &job)?;
        Ok(Staging {
            dev,
            products,
            panel,
            n,
            host,
            tables,
            slots,
            slot: 0,
            fill: StageFill {
                rows,
                base: 0,
                filled: 0,
            },
            staged: 0,
            error: None,
        })
    }

    /// Takes tile `(r0, c0)` of the panel. An error is kept and returned by
    /// [`Staging::finish`]; the tiles after it are ignored.
    pub(crate) fn push(&mut self, r0: usize, c0: usize, tile: Tile<'_, T>) {
        if self.error.is_none() {
            if let Err(e) = self.take(r0, c0, tile) {
                self.error = Some(e);
            }
        }
    }

    fn internal(&self, message: String) -> LinalgError {
        LinalgError::Panel {
            panel: self.panel,
            rows: format!("{}..", self.fill.base),
            message: format!("internal: staging for the GPU: {message}"),
        }
    }

    fn take(&mut self, r0: usize, c0: usize, tile: Tile<'_, T>) -> Result<(), LinalgError> {
        let (b, cols) = tile.dim();
        if self.fill.full_before(c0, b) {
            self.flush()?;
        }
        let Some(local) = self.fill.local(r0, b) else {
            return Err(self.internal(format!(
                "rows {r0}..{} outside the staged block {}..{}",
                r0 + b,
                self.fill.base,
                self.fill.base + self.fill.rows
            )));
        };
        let cuda = gpu(self.dev, "waiting for a staging buffer");
        let (n, rows, slot) = (self.n, self.fill.rows, self.slot);
        match (&self.slots, tile) {
            (Slots::Packed { stride, .. }, Tile::Packed(p)) => {
                if c0 == 0 {
                    let codes = self.host[slot]
                        .values_mut::<u8>(rows * stride)
                        .map_err(&cuda)?;
                    let tables = self.tables.as_mut().expect("packed staging has tables");
                    let tables = tables[slot].values_mut::<T>(rows * 4).map_err(&cuda)?;
                    stage_codes(&p, local, *stride, codes, tables);
                }
            }
            (Slots::Values { .. }, Tile::Dense(t)) => {
                let values = self.host[slot].values_mut::<T>(rows * n).map_err(&cuda)?;
                stage_values(t, local, c0, n, values);
            }
            (Slots::Packed { .. }, Tile::Dense(_)) | (Slots::Values { .. }, Tile::Packed(_)) => {
                return Err(self.internal("a tile of the other kind".into()));
            }
        }
        self.fill.placed(local, b, c0 + cols >= n);
        Ok(())
    }

    /// Copies the filled block to the device on the copy stream and queues its products
    /// on the compute stream (which waits for the copy through the buffers' events).
    fn flush(&mut self) -> Result<(), LinalgError> {
        let (dev, rows, s, n) = (self.dev, self.fill.filled, self.slot, self.n);
        if rows == 0 {
            return Ok(());
        }
        let copy = dev.copy_stream();
        let cuda = gpu(dev, "copying a staged block to the device");
        match &mut self.slots {
            Slots::Packed {
                stride,
                codes,
                tables,
                tile,
            } => {
                let stride = *stride;
                let src = self.host[s].values::<u8>(rows * stride).map_err(&cuda)?;
                copy.memcpy_htod(src, &mut codes[s].slice_mut(..rows * stride))
                    .map_err(&cuda)?;
                self.host[s].copied(copy).map_err(&cuda)?;
                let host_tables = self.tables.as_ref().expect("packed staging has tables");
                let src = host_tables[s].values::<T>(rows * 4).map_err(&cuda)?;
                copy.memcpy_htod(src, &mut tables[s].slice_mut(..rows * 4))
                    .map_err(&cuda)?;
                host_tables[s].copied(copy).map_err(&cuda)?;
                self.staged += (rows * (stride + 4 * std::mem::size_of::<T>())) as u64;
                let (col0, h32, n32, pld) = (0u32, rows as u32, n as u32, stride as u32);
                let mut l = dev.stream().launch_builder(T::standardize(dev.kernels()));
                l.arg(&mut *tile)
                    .arg(&codes[s])
                    .arg(&tables[s])
                    .arg(&col0)
                    .arg(&h32)
                    .arg(&n32)
                    .arg(&pld)
                    .arg(&n32);
                // SAFETY: reads `rows` rows of `stride` code bytes and 4 table entries per
                // row, writes rows × n values: all inside buffers of `self.rows` rows.
                unsafe { l.launch(grid(n, rows)) }
                    .map_err(gpu(dev, "standardizing staged genotypes"))?;
                self.products.rows(self.fill.base, rows, tile)?;
            }
            Slots::Values { values } => {
                let src = self.host[s].values::<T>(rows * n).map_err(&cuda)?;
                copy.memcpy_htod(src, &mut values[s].slice_mut(..rows * n))
                    .map_err(&cuda)?;
                self.host[s].copied(copy).map_err(&cuda)?;
                self.staged += (rows * n * std::mem::size_of::<T>()) as u64;
                self.products.rows(self.fill.base, rows, &values[s])?;
            }
        }
        self.fill.sent();
        self.slot ^= 1;
        Ok(())
    }

    /// Multiplies the last block and brings the products back, with the bytes staged to
    /// the device.
    pub(crate) fn finish(mut self) -> Result<(PanelOut, u64), LinalgError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.flush()?;
        let staged = self.staged;
        Ok((self.products.fetch()?.into_out()?, staged))
    }
}

/// A thin QR: `Q` (`h × k`, column-major) and `R` (`k × w`).
pub(crate) type ThinQr = (Vec<f64>, Array2<f64>);

/// Thin QR of a panel's `y` (`h × w`) on the device by cuSOLVER (`geqrf`, then `orgqr`):
/// `Q` (`h × k`, column-major, `k = min(h, w)`) and `R` (`k × w`), as the host's
/// [`crate::kernels::PanelFactor`] holds them. `None` when cuSOLVER was not found: the host
/// factors the panel then.
pub fn panel_qr(dev: &GpuDevice, y: ArrayView2<'_, f64>) -> Result<Option<ThinQr>, LinalgError> {
    if dev.solver().is_none() {
        return Ok(None);
    }
    let (h, w) = y.dim();
    if h.min(w) == 0 {
        return Ok(Some((Vec::new(), Array2::zeros((0, w)))));
    }
    let _lane = dev.lock();
    // Row-major h × w, transposed, is the column-major h × w that cuSOLVER takes.
    let colmajor = y.t().as_standard_layout().into_owned();
    let mut a = dev
        .stream()
        .clone_htod(colmajor.as_slice().expect("standard layout"))
        .map_err(gpu(dev, "copying Y for its QR"))?;
    device_qr(dev, &mut a, h, w).map(Some)
}

/// The thin QR of the column-major `h × w` matrix in `a` (leading dimension `h`, `h, w ≥
/// 1`), which `orgqr` overwrites with `Q`; both copied back. The caller holds the lane and
/// has checked that the device has cuSOLVER.
fn device_qr(
    dev: &GpuDevice,
    a: &mut CudaSlice<f64>,
    h: usize,
    w: usize,
) -> Result<ThinQr, LinalgError> {
    use cudarc::cusolver::sys;
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let solver = dev.solver().expect("checked by the caller");
    dev.bind()?;
    let k = h.min(w);
    let stream = dev.stream();
    let failed = |what: &'static str| {
        move |status: cudarc::cusolver::CusolverError| {
            LinalgError::Gpu(dev.error(what, format!("cuSOLVER {:?}", status.0)))
        }
    };
    let alloc = gpu(dev, "allocating QR workspace");
    let mut tau = stream.alloc_zeros::<f64>(k).map_err(&alloc)?;
    // One status for each call: orgqr writes its own over geqrf's.
    let mut info = stream.alloc_zeros::<i32>(2).map_err(&alloc)?;
    let (m32, n32, k32, lda) = (h as i32, w as i32, k as i32, h as i32);
    let (mut lw_qr, mut lw_q) = (0i32, 0i32);
    {
        let (pa, _a) = a.device_ptr_mut(stream);
        let (pt, _t) = tau.device_ptr(stream);
        // SAFETY: the handle is bound to `stream`; `a` holds h × w values (leading
        // dimension h) and `tau` k; the sizes are written to the two integers.
        unsafe {
            sys::cusolverDnDgeqrf_bufferSize(
                solver.cu(),
                m32,
                n32,
                pa as *mut f64,
                lda,
                &mut lw_qr,
            )
            .result()
            .map_err(failed("sizing geqrf"))?;
            sys::cusolverDnDorgqr_bufferSize(
                solver.cu(),
                m32,
                k32,
                k32,
                pa as *const f64,
                lda,
                pt as *const f64,
                &mut lw_q,
            )
            .result()
            .map_err(failed("sizing orgqr"))?;
        }
    }
    let lwork = lw_qr.max(lw_q).max(1);
    let mut work = stream.alloc_zeros::<f64>(lwork as usize).map_err(&alloc)?;
    {
        let (pa, _a) = a.device_ptr_mut(stream);
        let (pt, _t) = tau.device_ptr_mut(stream);
        let (pw, _w) = work.device_ptr_mut(stream);
        let (pi, _i) = info.device_ptr_mut(stream);
        // SAFETY: as above, with a workspace of `lwork` values and one status integer.
        unsafe {
            sys::cusolverDnDgeqrf(
                solver.cu(),
                m32,
                n32,
                pa as *mut f64,
                lda,
                pt as *mut f64,
                pw as *mut f64,
                lwork,
                pi as *mut i32,
            )
            .result()
            .map_err(failed("geqrf of a panel"))?;
        }
    }
    // R: the upper triangle of the first k rows, gathered on the device and copied in one
    // piece before orgqr overwrites them with Q.
    let mut top = stream.alloc_zeros::<f64>(k * w).map_err(&alloc)?;
    let (top_k, top_w, ld) = (k as u32, w as u32, h as u64);
    let mut l = stream.launch_builder(&dev.kernels().top_rows_f64);
    l.arg(&mut top).arg(&*a).arg(&top_k).arg(&top_w).arg(&ld);
    // SAFETY: reads rows 0..k ≤ h of the w columns of `a` (h × w); writes k × w values.
    unsafe { l.launch(grid(k, w)) }.map_err(gpu(dev, "gathering R"))?;
    let mut host = vec![0f64; k * w];
    stream
        .memcpy_dtoh(&top, &mut host)
        .map_err(gpu(dev, "copying R"))?;
    let r = Array2::from_shape_fn((k, w), |(i, j)| if i <= j { host[j * k + i] } else { 0.0 });
    {
        let (pa, _a) = a.device_ptr_mut(stream);
        let (pt, _t) = tau.device_ptr(stream);
        let (pw, _w) = work.device_ptr_mut(stream);
        let (pi, _i) = info.device_ptr_mut(stream);
        // orgqr's status goes to the second integer.
        let pi = pi + std::mem::size_of::<i32>() as u64;
        // SAFETY: as above: Q's k columns overwrite the first h × k values of `a`.
        unsafe {
            sys::cusolverDnDorgqr(
                solver.cu(),
                m32,
                k32,
                k32,
                pa as *mut f64,
                lda,
                pt as *const f64,
                pw as *mut f64,
                lwork,
                pi as *mut i32,
            )
            .result()
            .map_err(failed("orgqr of a panel"))?;
        }
    }
    let mut status = [0i32; 2];
    stream
        .memcpy_dtoh(&info, &mut status)
        .map_err(gpu(dev, "copying the QR's status"))?;
    for (call, s) in ["geqrf", "orgqr"].into_iter().zip(status) {
        if s != 0 {
            return Err(LinalgError::Gpu(dev.error(
                "QR of a panel",
                format!("cuSOLVER's {call} reports argument {} invalid", -s),
            )));
        }
    }
    let mut q = vec![0f64; h * k];
    stream
        .memcpy_dtoh(&a.slice(..h * k), &mut q)
        .map_err(gpu(dev, "copying Q"))?;
    Ok((q, r))
}

/// The factor of rows `rows` of a generated matrix, computed where they are generated:
/// the device produces the rows tile by tile (the host generator's values), gathers them
/// into a column-major panel and factors it by cuSOLVER; only `Q` and `R` come back, as
/// from [`panel_qr`]. `None` when the device has no cuSOLVER.
pub(crate) fn generated_factor(
    dev: &GpuDevice,
    src: &DeviceSource,
    rows: Range<u64>,
    n: usize,
) -> Result<Option<PanelFactor>, LinalgError> {
    if dev.solver().is_none() {
        return Ok(None);
    }
    let h = (rows.end - rows.start) as usize;
    if h.min(n) == 0 {
        return Ok(Some(PanelFactor::from_explicit(
            Vec::new(),
            h,
            Array2::zeros((0, n)),
        )));
    }
    let _lane = dev.lock();
    let stream = dev.stream();
    let mut panel = stream
        .alloc_zeros::<f64>(h * n)
        .map_err(gpu(dev, "allocating a panel"))?;
    let mut p = Producer::<f64>::new(dev, src, n, h)?;
    let mut facts = PanelFacts::default();
    let (n32, ld) = (n as u32, h as u64);
    p.each_tile(rows, false, &mut facts, |tile, r0, b| {
        let (at, b32) = (r0 as u64, b as u32);
        let mut l = stream.launch_builder(&dev.kernels().rows_to_columns_f64);
        l.arg(&mut panel)
            .arg(tile)
            .arg(&at)
            .arg(&b32)
            .arg(&n32)
            .arg(&ld);
        // SAFETY: reads b rows of n values of the tile (b ≤ its rows); writes rows
        // r0..r0 + b ≤ h of the n columns of the h × n panel.
        unsafe { l.launch(grid(n, b)) }.map_err(gpu(dev, "gathering a panel's columns"))?;
        Ok(())
    })?;
    let (q, r) = device_qr(dev, &mut panel, h, n)?;
    Ok(Some(PanelFactor::from_explicit(q, h, r)))
}

/// A panel's factor (`rows × n`, its row blocks written by `fill`): on `dev` by cuSOLVER
/// when the actor is a GPU actor whose device has it (the panel is gathered on the host
/// first), else on the host by [`PanelFactor::compute`]. Also says whether the device
/// factored it. cuSOLVER's default mode is deterministic, so a panel factored again in a
/// later pass gets the same `Q`.
pub(crate) fn factor_panel<F>(
    dev: Option<&GpuDevice>,
    rows: usize,
    n: usize,
    keep: Keep,
    mut fill: F,
) -> Result<(PanelFactor, bool), LinalgError>
where
    F: FnMut(Range<usize>, ArrayViewMut2<'_, f64>) -> Result<(), LinalgError>,
{
    let Some(dev) = dev.filter(|d| d.solver().is_some()) else {
        return Ok((PanelFactor::compute(rows, n, keep, fill)?, false));
    };
    let mut panel = Array2::<f64>::zeros((rows, n));
    let block = block_rows(n).max(1);
    for r0 in (0..rows).step_by(block) {
        let r1 = (r0 + block).min(rows);
        fill(r0..r1, panel.slice_mut(s![r0..r1, ..]))?;
    }
    let (q, r) = panel_qr(dev, panel.view())?.expect("the device has cuSOLVER");
    Ok((PanelFactor::from_explicit(q, rows, r), true))
}

impl From<GpuError> for LinalgError {
    fn from(e: GpuError) -> Self {
        LinalgError::Gpu(e)
    }
}

/// The values the device produces for rows `rows` (all columns) of `src`, copied back: the
/// standardized tiles for genotypes. Used to check the device generator against the host's
/// (`tests/gpu.rs`); the passes never copy a panel back.
pub fn produce_rows<T: GpuReal>(
    dev: &GpuDevice,
    src: &DeviceSource,
    rows: Range<u64>,
    n: usize,
) -> Result<(Array2<T>, PanelFacts), LinalgError> {
    let _lane = dev.lock();
    let h = (rows.end - rows.start) as usize;
    let mut out = Array2::<T>::zeros((h, n));
    let mut facts = PanelFacts::default();
    if h == 0 || n == 0 {
        return Ok((out, facts));
    }
    let mut p = Producer::<T>::new(dev, src, n, h)?;
    p.each_tile(rows, true, &mut facts, |tile, r0, b| {
        let dst = out
            .slice_mut(s![r0..r0 + b, ..])
            .into_slice()
            .expect("rows of a standard-layout array are contiguous");
        dev.stream()
            .memcpy_dtoh(&tile.slice(..b * n), dst)
            .map_err(gpu(dev, "copying a tile"))
    })?;
    Ok((out, facts))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ndarray::Array2;
    use rankwise_device::host::{Guarded, HostArgs, HostKernels};
    use rankwise_sources::{Dist, Generated, GenotypeSource, InMemoryGenotypes};

    use super::*;
    use crate::testing::Rng;
    use crate::tiles::{Packing, TileProducer, TILE_COLS};
    use crate::variants::RowSelection;

    /// Regression: `rsvd --dist genotype` (raw dosages as a dense operand, the GPU
    /// benchmark's matrix) ran on the GPU actor's CPU cores, 15× slower than on its device.
    #[test]
    fn rsvd_dist_genotype_is_produced_on_the_device() {
        let of = |dist, transposed: bool| {
            let g = Generated::new(10, 7, 1, dist);
            let g = if transposed { g.transposed() } else { g };
            DeviceSource::of(&Operand::Dense(Arc::new(g)))
        };
        assert!(matches!(
            of(Dist::Genotype, false),
            Some(DeviceSource::Dosages(_))
        ));
        assert!(matches!(
            of(Dist::Uniform, false),
            Some(DeviceSource::Uniform(_))
        ));
        assert!(of(Dist::Normal, false).is_none());
        for dist in [Dist::Genotype, Dist::Uniform] {
            assert!(of(dist, true).is_none(), "{dist:?} transposed");
        }
    }

    #[test]
    fn staged_blocks_are_whole_row_blocks_within_the_budget() {
        let mut rng = Rng::fresh();
        for _ in 0..200 {
            let n = 1 + rng.below(200_000);
            let size = [1, 4, 8][rng.below(3)];
            let h = 1 + rng.below(3_000_000);
            let r = stage_rows(n, size, h);
            assert_eq!(r % TILE_ROWS, 0, "n {n} size {size} h {h}: {r}");
            assert!(
                r >= TILE_ROWS && r <= h.next_multiple_of(TILE_ROWS),
                "{n} {h}: {r}"
            );
            assert!(
                r == TILE_ROWS || r * n * size <= STAGE_BYTES,
                "{n} {size}: {r}"
            );
        }
    }

    /// A step on host buffers through OpenBLAS's column-major GEMM with cuBLAS's
    /// parameters, after the bounds check `GemmStep::run` makes.
    fn host_gemm<T: GpuReal>(step: &GemmStep, beta: T, a: &[T], b: &[T], c: &mut [T]) {
        use cblas_sys::{cblas_dgemm, cblas_sgemm, CBLAS_LAYOUT, CBLAS_TRANSPOSE};
        assert!(step.in_bounds(), "{step:?}");
        let (a, b, c) = (
            &a[step.a.clone()],
            &b[step.b.clone()],
            &mut c[step.c.clone()],
        );
        let tb = if step.transb {
            CBLAS_TRANSPOSE::CblasTrans
        } else {
            CBLAS_TRANSPOSE::CblasNoTrans
        };
        let (m, n, k) = (step.m as i32, step.n as i32, step.k as i32);
        let (lda, ldb, ldc) = (step.lda as i32, step.ldb as i32, step.ldc as i32);
        let col = CBLAS_LAYOUT::CblasColMajor;
        let na = CBLAS_TRANSPOSE::CblasNoTrans;
        // SAFETY: `in_bounds` checked every operand against its slice.
        unsafe {
            if std::mem::size_of::<T>() == 8 {
                let (a, b): (&[f64], &[f64]) = (bytemuck::cast_slice(a), bytemuck::cast_slice(b));
                let c: &mut [f64] = bytemuck::cast_slice_mut(c);
                cblas_dgemm(
                    col,
                    na,
                    tb,
                    m,
                    n,
                    k,
                    1.0,
                    a.as_ptr(),
                    lda,
                    b.as_ptr(),
                    ldb,
                    beta.to_f64(),
                    c.as_mut_ptr(),
                    ldc,
                );
            } else {
                let (a, b): (&[f32], &[f32]) = (bytemuck::cast_slice(a), bytemuck::cast_slice(b));
                let c: &mut [f32] = bytemuck::cast_slice_mut(c);
                cblas_sgemm(
                    col,
                    na,
                    tb,
                    m,
                    n,
                    k,
                    1.0,
                    a.as_ptr(),
                    lda,
                    b.as_ptr(),
                    ldb,
                    beta.to_f64() as f32,
                    c.as_mut_ptr(),
                    ldc,
                );
            }
        }
    }

    /// `Products::rows` block by block on the host: its GEMM steps through a column-major
    /// host GEMM, with its f32 parts, additions and rounding. Returns `Y` (`h × w`) and
    /// `W = Y[:, ..l]ᵀ·A` (range) or `B = Qᵀ·A` (with `q`), both row-major f64.
    fn host_products<T: GpuReal>(
        a: &Array2<T>,
        omega: &Array2<T>,
        q: Option<&Array2<f64>>,
        l: usize,
        block: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let (h, n) = a.dim();
        let w = if q.is_some() { 0 } else { omega.ncols() };
        let direct = std::mem::size_of::<T>() == 8;
        let om = omega
            .as_standard_layout()
            .to_owned()
            .into_raw_vec_and_offset()
            .0;
        let qt: Vec<T> = q.map_or(Vec::new(), |q| q.iter().map(|&v| T::from_f64(v)).collect());
        let mut y = vec![0f64; h * w];
        let mut b = vec![0f64; l * n];
        let mut part = vec![T::zero(); (block * w).max(l * n)];
        for r0 in (0..h).step_by(block) {
            let rows = block.min(h - r0);
            let tile: Vec<T> = a.slice(s![r0..r0 + rows, ..]).iter().copied().collect();
            if q.is_none() {
                for step in range_steps(n, w, r0, rows, T::chunk(n), direct) {
                    if direct {
                        let ys: &mut [T] = bytemuck::cast_slice_mut(&mut y);
                        host_gemm(&step, T::zero(), &om, &tile, ys);
                    } else {
                        host_gemm(&step, T::zero(), &om, &tile, &mut part);
                        for (acc, p) in y[r0 * w..(r0 + rows) * w].iter_mut().zip(&part) {
                            *acc += p.to_f64();
                        }
                    }
                }
            }
            if l == 0 {
                continue;
            }
            let (x, ldx): (Vec<T>, usize) = match q {
                Some(_) => (qt[r0 * l..(r0 + rows) * l].to_vec(), l),
                None => {
                    let rows_of_y = &y[r0 * w..(r0 + rows) * w];
                    (rows_of_y.iter().map(|&v| T::from_f64(v)).collect(), w)
                }
            };
            let step = project_step(n, l, rows, ldx);
            if direct {
                let bs: &mut [T] = bytemuck::cast_slice_mut(&mut b);
                host_gemm(&step, T::one(), &tile, &x, bs);
            } else {
                host_gemm(&step, T::zero(), &tile, &x, &mut part);
                for (acc, p) in b.iter_mut().zip(&part) {
                    *acc += p.to_f64();
                }
            }
        }
        (y, b)
    }

    /// The panel products' GEMM steps (layouts, leading dimensions, column chunks of f32
    /// tiles, the buffer ranges) on fresh shapes, run through a column-major host GEMM as
    /// cuBLAS would run them: `Y = A·Ω`, the fused `W = Y[:, ..l]ᵀ·A` and `B = Qᵀ·A` agree
    /// with the products of the same values in f64, for f64 and f32 tiles, fed in blocks of
    /// rows of every size; and every step stays within its buffers.
    #[test]
    fn product_gemm_steps_compute_the_panel_products() {
        let mut rng = Rng::fresh();
        for round in 0..8 {
            // Every fourth round's f32 tiles span several GEMM column chunks.
            let n = 1 + rng.below(300) + if round % 4 == 3 { F32_CHUNK } else { 0 };
            let h = 1 + rng.below(40);
            let w = 1 + rng.below(24);
            let l = 1 + rng.below(w);
            let block = 1 + rng.below(h);
            let what = format!("round {round}: {h} × {n}, w {w}, l {l}, blocks of {block}");
            let a = Array2::from_shape_fn((h, n), |_| rng.value() as f64);
            let omega = Array2::from_shape_fn((n, w), |_| rng.value() as f64);
            let q = Array2::from_shape_fn((h, l), |_| rng.value() as f64);
            check::<f64>(&a, &omega, &q, l, block, 1e-12, &format!("{what}, f64"));
            check::<f32>(&a, &omega, &q, l, block, 1e-5, &format!("{what}, f32"));
        }

        fn check<T: GpuReal>(
            a: &Array2<f64>,
            omega: &Array2<f64>,
            q: &Array2<f64>,
            l: usize,
            block: usize,
            tol: f64,
            what: &str,
        ) {
            let at = a.mapv(T::from_f64);
            let ot = omega.mapv(T::from_f64);
            let (a, omega) = (at.mapv(|v| v.to_f64()), ot.mapv(|v| v.to_f64()));
            let close = |got: &[f64], want: &Array2<f64>, name: &str| {
                let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                for (i, (g, e)) in got.iter().zip(want.iter()).enumerate() {
                    assert!(
                        (g - e).abs() <= tol * scale * 50.0,
                        "{what}: {name}[{i}] {g} vs {e}"
                    );
                }
                assert_eq!(got.len(), want.len(), "{what}: {name}");
            };
            let (y, wt) = host_products::<T>(&at, &ot, None, l, block);
            let want_y = a.dot(&omega);
            close(&y, &want_y, "Y");
            let y32 = want_y.mapv(|v| T::from_f64(v).to_f64());
            close(&wt, &y32.slice(s![.., ..l]).t().dot(&a), "W");
            let (_, b) = host_products::<T>(&at, &ot, Some(q), q.ncols(), block);
            let qt = q.mapv(|v| T::from_f64(v).to_f64());
            close(&b, &qt.t().dot(&a), "B");
        }
    }

    /// What the device would receive, block by block: a panel's tiles as [`Staging`]
    /// places them in its host buffers, each block rebuilt as the standardized values the
    /// device computes from it (codes through the tables, or the values themselves).
    fn staged_blocks<T: TileReal + bytemuck::Pod>(
        op: &Operand,
        h: usize,
        capacity: usize,
    ) -> Vec<(usize, Array2<T>)> {
        let n = op.shape().1 as usize;
        let stride = n.div_ceil(4);
        let mut fill = StageFill {
            rows: capacity,
            base: 0,
            filled: 0,
        };
        let mut codes = vec![0u8; capacity * stride];
        let mut tables = vec![T::default(); capacity * 4];
        let mut values = vec![T::default(); capacity * n];
        let packed = matches!(op, Operand::Genotypes(..));
        let mut blocks = Vec::new();
        let send = |fill: &mut StageFill,
                    codes: &[u8],
                    tables: &[T],
                    values: &[T],
                    blocks: &mut Vec<(usize, Array2<T>)>| {
            let rows = fill.filled;
            let block = if packed {
                // `Staging::flush`'s launch, on the host-compiled kernel.
                let mut tile = Guarded::<T>::zeroed(rows * n);
                let (col0, h32, n32, pld) = (0u32, rows as u32, n as u32, stride as u32);
                let mut a = HostArgs::new();
                a.buffer(tile.values_mut())
                    .input(&codes[..rows * stride])
                    .input(&tables[..rows * 4])
                    .value(col0)
                    .value(h32)
                    .value(n32)
                    .value(pld)
                    .value(n32);
                host_launch(kernel_of::<T>("standardize"), grid(n, rows), &mut a);
                tile.check("a standardized staged block").unwrap();
                Array2::from_shape_vec((rows, n), tile.values().to_vec()).unwrap()
            } else {
                Array2::from_shape_vec((rows, n), values[..rows * n].to_vec()).unwrap()
            };
            blocks.push((fill.base, block));
            fill.sent();
        };
        TileProducer::new(op, 0, 0..h as u64)
            .packing(Packing::Always)
            .for_each(None, false, &mut Vec::new(), |r0, c0, t: Tile<'_, T>| {
                let (b, cols) = t.dim();
                if fill.full_before(c0, b) {
                    send(&mut fill, &codes, &tables, &values, &mut blocks);
                }
                let local = fill
                    .local(r0, b)
                    .expect("a row block fits its staged block");
                match t {
                    Tile::Packed(p) if c0 == 0 => {
                        stage_codes(&p, local, stride, &mut codes, &mut tables)
                    }
                    Tile::Packed(_) => {}
                    Tile::Dense(v) => {
                        assert!(!packed, "a genotype tile came standardized");
                        stage_values(v, local, c0, n, &mut values)
                    }
                }
                fill.placed(local, b, c0 + cols >= n);
            })
            .unwrap();
        if fill.filled > 0 {
            send(&mut fill, &codes, &tables, &values, &mut blocks);
        }
        blocks
    }

    /// The panel's values as the CPU actors multiply them.
    fn host_values<T: TileReal>(op: &Operand, h: usize) -> Array2<T> {
        cpu_rows(op, 0..h as u64).0
    }

    /// Rows `rows` of the operand as the CPU actors multiply them, and their facts.
    fn cpu_rows<T: TileReal>(op: &Operand, rows: Range<u64>) -> (Array2<T>, PanelFacts) {
        let n = op.shape().1 as usize;
        let mut out = Array2::<T>::default(((rows.end - rows.start) as usize, n));
        let (facts, _) = TileProducer::new(op, 0, rows)
            .for_each(None, false, &mut Vec::new(), |r0, c0, t: Tile<'_, T>| {
                let Tile::Dense(v) = t else {
                    panic!("Packing::Never hands out values")
                };
                let (b, w) = v.dim();
                out.slice_mut(s![r0..r0 + b, c0..c0 + w]).assign(&v);
            })
            .unwrap();
        (out, facts)
    }

    /// `prefix_f64` or `prefix_f32`: the kernel of `T`.
    fn kernel_of<T>(prefix: &str) -> String {
        format!("{prefix}_f{}", 8 * std::mem::size_of::<T>())
    }

    /// Launches a kernel compiled for the host on the geometry the GPU passes use.
    fn host_launch(kernel: String, cfg: LaunchConfig, args: &mut HostArgs<'_>) {
        let k = HostKernels::get().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            cfg.shared_mem_bytes, 0,
            "the kernels use static shared memory only"
        );
        k.launch(&kernel, cfg.grid_dim, cfg.block_dim, args)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `Producer::produce` of rows `g`, step by step on the host-compiled kernels: the
    /// same launches (kernel, grid, parameters in order) and the same host work between
    /// them. Returns the tile, `rows × n` row-major.
    fn host_produce<T: GpuReal>(
        src: &DeviceSource,
        g: Range<u64>,
        n: usize,
        measure: bool,
        facts: &mut PanelFacts,
    ) -> Vec<T> {
        let b = (g.end - g.start) as usize;
        let (n32, b32) = (n as u32, b as u32);
        let gen = src.generated();
        let key = gen.key();
        let mut tile = Guarded::<T>::zeroed(b * n);
        match src {
            DeviceSource::Uniform(_) => {
                let col0 = 0u64;
                let mut a = HostArgs::new();
                a.buffer(tile.values_mut())
                    .value(key)
                    .value(g.start)
                    .value(col0)
                    .value(b32)
                    .value(n32)
                    .value(n32);
                let threads = n.div_ceil(BLOCK_COLS) * LANES;
                host_launch(kernel_of::<T>("uniform"), grid(threads, b), &mut a);
                if measure {
                    let cfg = flat(b * n);
                    let mut partial = Guarded::<f64>::zeroed(MAX_BLOCKS);
                    let mut a = HostArgs::new();
                    a.input(tile.values())
                        .value((b * n) as u64)
                        .buffer(partial.values_mut());
                    host_launch(kernel_of::<T>("sum_squares"), cfg, &mut a);
                    partial.check("partial sums").unwrap();
                    let blocks = cfg.grid_dim.0 as usize;
                    facts.sum_squares += partial.values()[..blocks].iter().sum::<f64>();
                }
            }
            DeviceSource::Genotypes(..) | DeviceSource::Dosages(_) => {
                let pops = gen.populations() as u32;
                let mut thresholds = Vec::new();
                gen.genotype_thresholds(g.clone(), &mut thresholds);
                let stride = n.div_ceil(4) as u32;
                let mut packed = Guarded::<u8>::zeroed(b * n.div_ceil(4));
                let mut counts = Guarded::<u32>::zeroed(b * 4);
                let missing = gen.missing_threshold();
                let mut a = HostArgs::new();
                a.buffer(packed.values_mut())
                    .buffer(counts.values_mut())
                    .input(&thresholds)
                    .value(key)
                    .value(g.start)
                    .value(b32)
                    .value(n32)
                    .value(pops)
                    .value(missing)
                    .value(stride);
                host_launch(
                    "genotype_packed".into(),
                    grid(n.div_ceil(BLOCK_COLS), b),
                    &mut a,
                );
                packed.check("packed codes").unwrap();
                counts.check("code counts").unwrap();
                let table = src.tables::<T>(counts.values(), g.start, measure, facts);
                let col0 = 0u32;
                let mut a = HostArgs::new();
                a.buffer(tile.values_mut())
                    .input(packed.values())
                    .input(&table)
                    .value(col0)
                    .value(b32)
                    .value(n32)
                    .value(stride)
                    .value(n32);
                host_launch(kernel_of::<T>("standardize"), grid(n, b), &mut a);
            }
        }
        tile.check("a tile").unwrap();
        tile.values().to_vec()
    }

    /// Generated uniform values and genotypes (with population structure and missing
    /// calls) of fresh shapes and row ranges, produced as a GPU actor's device produces
    /// them (the launches of `Producer::produce` on the host-compiled kernels), some with
    /// variants filtered: the tiles are the CPU actors' values bit for bit in f64 and f32,
    /// and so are the facts (missing calls, dropped and filtered variants; Σx² to
    /// rounding). f64 tiles gathered into
    /// cuSOLVER's column-major layout, and the top rows of that, are the same values.
    #[test]
    fn device_tiles_are_the_cpu_tiles_on_host_compiled_kernels() {
        let mut rng = Rng::fresh();
        for round in 0..4 {
            let n = 1 + rng.below(2 * TILE_COLS);
            let h = 1 + rng.below(24);
            let r0 = rng.below(100) as u64;
            let rows = r0..r0 + h as u64;
            let seed = rng.next();
            let pops = 1 + rng.below(3.min(n)) as u64;
            // Half the rounds exclude variants, as `--maf`/`--geno` do.
            let filter = match round % 4 {
                0 | 1 => VariantFilter::NONE,
                2 => VariantFilter::new(
                    rng.below(300) as f64 / 1000.0,
                    rng.below(100) as f64 / 1000.0,
                )
                .unwrap(),
                // Rows selected by identifier: the tables are those of the panel's rows.
                _ => {
                    let bits = rng.next();
                    VariantFilter::NONE.with_rows(RowSelection::new(200, "`extract` t", |r| {
                        bits >> (r % 64) & 1 == 1
                    }))
                }
            };
            let what =
                format!("round {round}: rows {rows:?} × {n}, {pops} populations, {filter:?}");
            let genotypes = Generated::new(200, n as u64, seed, Dist::Genotype)
                .with_populations(pops, 0.15)
                .unwrap()
                .with_missing([0.0, 0.05][round % 2]);
            let uniform = Generated::new(200, n as u64, seed, Dist::Uniform);
            for op in [
                Operand::Genotypes(Arc::new(genotypes.clone()), filter),
                Operand::Dense(Arc::new(uniform)),
                // `--dist genotype`: the same codes as dosages (rsvd's benchmark matrix).
                Operand::Dense(Arc::new(genotypes)),
            ] {
                let src = DeviceSource::of(&op).expect("the device produces it");
                let what = format!("{what}, {}", op.describe());
                compare::<f64>(&op, &src, rows.clone(), &what);
                compare::<f32>(&op, &src, rows.clone(), &what);
            }
        }

        fn compare<T: GpuReal>(op: &Operand, src: &DeviceSource, rows: Range<u64>, what: &str) {
            let n = op.shape().1 as usize;
            let h = (rows.end - rows.start) as usize;
            let mut facts = PanelFacts::default();
            let tile = host_produce::<T>(src, rows.clone(), n, true, &mut facts);
            let (want, want_facts) = cpu_rows::<T>(op, rows);
            for (i, (a, b)) in tile.iter().zip(want.iter()).enumerate() {
                assert_eq!(
                    a.to_f64().to_bits(),
                    b.to_f64().to_bits(),
                    "{what}, f{}: ({}, {})",
                    8 * std::mem::size_of::<T>(),
                    i / n,
                    i % n
                );
            }
            assert_eq!(facts.missing, want_facts.missing, "{what}: missing calls");
            assert_eq!(
                (facts.dropped, facts.filtered),
                (want_facts.dropped, want_facts.filtered),
                "{what}: dropped and filtered variants"
            );
            // The device sums squares in f64; the CPU's f32 sums are within 5.4e-7 of the
            // exact sum (`sum_squares_f32`), its f64 sums within rounding.
            let (a, b) = (facts.sum_squares, want_facts.sum_squares);
            let tol = if std::mem::size_of::<T>() == 8 {
                1e-12
            } else {
                6e-7
            };
            assert!((a - b).abs() <= tol * b.max(1.0), "{what}: Σx² {a} vs {b}");
            if std::mem::size_of::<T>() != 8 {
                return;
            }
            // `generated_factor`'s gather, then `device_qr`'s copy of R's rows.
            let tile: Vec<f64> = tile.iter().map(|v| v.to_f64()).collect();
            let mut panel = Guarded::<f64>::zeroed(h * n);
            let (at, b32, n32, ld) = (0u64, h as u32, n as u32, h as u64);
            let mut a = HostArgs::new();
            a.buffer(panel.values_mut())
                .input(&tile)
                .value(at)
                .value(b32)
                .value(n32)
                .value(ld);
            host_launch("rows_to_columns_f64".into(), grid(n, h), &mut a);
            panel.check("a gathered panel").unwrap();
            let k = h.min(n);
            let mut r = Guarded::<f64>::zeroed(k * n);
            let (k32, w32) = (k as u32, n as u32);
            let mut a = HostArgs::new();
            a.buffer(r.values_mut())
                .input(panel.values())
                .value(k32)
                .value(w32)
                .value(ld);
            host_launch("top_rows_f64".into(), grid(k, n), &mut a);
            r.check("R's rows").unwrap();
            for i in 0..h {
                for j in 0..n {
                    assert_eq!(panel.values()[j * h + i], tile[i * n + j], "{what}: gather");
                    if i < k {
                        assert_eq!(r.values()[j * k + i], tile[i * n + j], "{what}: top rows");
                    }
                }
            }
        }
    }

    fn check<T: TileReal + bytemuck::Pod>(op: &Operand, h: usize, capacity: usize, what: &str) {
        let blocks = staged_blocks::<T>(op, h, capacity);
        let want = host_values::<T>(op, h);
        let mut next = 0;
        for (i, (base, block)) in blocks.iter().enumerate() {
            assert_eq!(*base, next, "{what}: block {i} starts at {base}");
            if i + 1 < blocks.len() {
                assert_eq!(block.nrows(), capacity, "{what}: block {i} is not full");
            }
            let rows = want.slice(s![next..next + block.nrows(), ..]);
            let same = block
                .iter()
                .zip(rows.iter())
                .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits());
            assert!(
                same,
                "{what}: block {i} (rows {next}..) differs from the host's values"
            );
            next += block.nrows();
        }
        assert_eq!(next, h, "{what}: rows staged");
    }

    /// Staged blocks hold exactly the values the CPU actors multiply, for generated and
    /// stored genotypes (2-bit codes and tables) and for floats, on fresh shapes: row
    /// blocks never straddle two staged blocks, every block but the last is full, and
    /// the standardized values are the CPU's bit for bit in f64 and f32.
    #[test]
    fn staged_blocks_hold_the_values_the_cpu_multiplies() {
        let mut rng = Rng::fresh();
        for round in 0..4 {
            let h = 1 + rng.below(5 * TILE_ROWS);
            let n = 1 + rng.below(3 * TILE_COLS);
            let capacity = TILE_ROWS * (1 + rng.below(3));
            let seed = rng.next();
            let what = format!("round {round}: {h} × {n}, blocks of {capacity} rows");
            let g = Generated::new(h as u64, n as u64, seed, Dist::Genotype).with_missing(0.1);
            let generated = Operand::Genotypes(Arc::new(g.clone()), VariantFilter::NONE);
            let mut dosages = Array2::<i8>::zeros((h, n));
            g.fill_dosages(0..h as u64, dosages.view_mut()).unwrap();
            let stored = Operand::Genotypes(
                Arc::new(InMemoryGenotypes::new(dosages, "t.zarr")),
                VariantFilter::NONE,
            );
            let uniform = Operand::Dense(Arc::new(Generated::new(
                h as u64,
                n as u64,
                seed,
                Dist::Uniform,
            )));
            for (op, kind) in [
                (&generated, "generated genotypes"),
                (&stored, "stored genotypes"),
                (&uniform, "uniform"),
            ] {
                check::<f64>(op, h, capacity, &format!("{what}, {kind}, f64"));
                check::<f32>(op, h, capacity, &format!("{what}, {kind}, f32"));
            }
        }
    }
}
