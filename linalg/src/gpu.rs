//! The randomized passes of one panel on its GPU actor's device.
//!
//! # What runs where
//!
//! A panel of a generated matrix never exists on the host: the device generates it row
//! tile by row tile (the block-stream generator of `rankwise_runtime::stream`, ported to
//! CUDA in `runtime/src/gpu/kernels.cu`, gives the same values), standardizes genotype
//! tiles from their 2-bit codes, and multiplies them by cuBLAS. Only the thin results
//! come back: `Y = A·[Ω | W]` (`h × (l + r)`) in the range pass, `B = QᵀA` (`l × n`) in
//! the projection pass, and per genotype tile its code counts (`h × 4`), from which the
//! host computes each variant's standardization exactly as the CPU kernels do (so the
//! standardized values are the CPU's, bit for bit), and sends back a 4-entry table per
//! variant. The orthonormalization (TSQR of the thin `Y`) and everything after stay on the
//! host, as on CPU actors.
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

use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use ndarray::{s, Array2, ArrayView2};
pub use rankwise_runtime::gpu::GpuDevice;
use rankwise_runtime::gpu::{GpuError, GpuKernels};
use rankwise_runtime::stream::{BLOCK_COLS, LANES};
use rankwise_runtime::{Dist, Generated};

use crate::tiles::{scale_of, Operand, PanelFacts, Real, RowCounts};
use crate::LinalgError;

/// Columns per f32 GEMM whose product is added to the f64 sums.
pub const F32_CHUNK: usize = 2048;

/// Bytes of one device tile of the panel's values (its rows are chosen to fit).
const TILE_BYTES: usize = 512 << 20;

/// Threads per block of the element-wise kernels.
const BLOCK: u32 = 256;

/// What a device can produce by itself.
#[derive(Clone, Debug)]
pub enum DeviceSource {
    /// Generated uniform values.
    Uniform(Generated),
    /// Generated genotype dosages, standardized per variant.
    Genotypes(Generated),
}

impl DeviceSource {
    /// The device form of an operand, when the device can produce it: generated uniform
    /// values or genotypes, not transposed. Everything else runs on the actor's CPU cores.
    pub fn of(operand: &Operand) -> Option<DeviceSource> {
        match operand {
            Operand::Dense(s) => {
                let g = s.generated()?;
                (g.dist() == Dist::Uniform && !g.is_transposed())
                    .then(|| DeviceSource::Uniform(g.clone()))
            }
            Operand::Genotypes(s) => {
                let g = s.generated()?;
                (!g.is_transposed()).then(|| DeviceSource::Genotypes(g.clone()))
            }
        }
    }

    /// Why an operand runs on CPU cores even on a GPU actor.
    pub fn why_not(operand: &Operand) -> String {
        format!(
            "GPU actors produce generated uniform or genotype matrices on the device; {} is \
             computed on the actor's CPU cores",
            operand.describe()
        )
    }

    fn generated(&self) -> &Generated {
        match self {
            DeviceSource::Uniform(g) | DeviceSource::Genotypes(g) => g,
        }
    }
}

/// Tile element types the device computes in.
pub trait GpuReal: Real + DeviceRepr + ValidAsZeroBits
where
    CudaBlas: Gemm<Self>,
{
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
/// [`TILE_BYTES`], at least one, at most `h` and at most 65,535 (one grid row each).
pub fn tile_rows(n: usize, bytes_per_value: usize, h: usize) -> usize {
    (TILE_BYTES / (n.max(1) * bytes_per_value))
        .clamp(1, 65_535)
        .min(h.max(1))
}

fn grid(width: usize, rows: usize) -> LaunchConfig {
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

fn flat(len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (len as u64).div_ceil(BLOCK as u64).clamp(1, 1 << 16) as u32,
            1,
            1,
        ),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn gpu<'d>(
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
struct Producer<'d, T: GpuReal>
where
    CudaBlas: Gemm<T>,
{
    dev: &'d GpuDevice,
    src: &'d DeviceSource,
    n: usize,
    rows: usize,
    /// The current tile's values, `rows × n`.
    tile: CudaSlice<T>,
    /// Genotypes: packed codes, per-variant code counts, thresholds and tables.
    packed: Option<CudaSlice<u8>>,
    counts: Option<CudaSlice<u32>>,
    sum: CudaSlice<f64>,
    thresholds: Vec<u64>,
}

impl<'d, T: GpuReal> Producer<'d, T>
where
    CudaBlas: Gemm<T>,
{
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
            DeviceSource::Genotypes(_) => (
                Some(
                    stream
                        .alloc_zeros::<u8>(rows * n.div_ceil(4))
                        .map_err(&alloc)?,
                ),
                Some(stream.alloc_zeros::<u32>(rows * 4).map_err(&alloc)?),
            ),
            DeviceSource::Uniform(_) => (None, None),
        };
        let sum = stream.alloc_zeros::<f64>(1).map_err(&alloc)?;
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
        })
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
            DeviceSource::Genotypes(_) => {
                let pops = gen.populations() as u32;
                self.thresholds.clear();
                gen.genotype_thresholds(g.clone(), &mut self.thresholds);
                let th = stream
                    .clone_htod(&self.thresholds)
                    .map_err(gpu(dev, "copying allele-frequency thresholds"))?;
                let packed = self.packed.as_mut().expect("genotype producer");
                let counts = self.counts.as_mut().expect("genotype producer");
                stream
                    .memset_zeros(counts)
                    .map_err(gpu(dev, "zeroing code counts"))?;
                let stride = self.n.div_ceil(4) as u32;
                let missing = gen.missing_threshold();
                let mut l = stream.launch_builder(&k.genotype_packed);
                l.arg(&mut *packed)
                    .arg(&mut *counts)
                    .arg(&th)
                    .arg(&key)
                    .arg(&g.start)
                    .arg(&b32)
                    .arg(&n32)
                    .arg(&pops)
                    .arg(&missing)
                    .arg(&stride);
                // SAFETY: b rows of `stride` packed bytes and 4 counts each fit the buffers;
                // the thresholds hold b·pops entries.
                unsafe { l.launch(grid(self.n.div_ceil(BLOCK_COLS), b)) }
                    .map_err(gpu(dev, "generating genotypes"))?;
                let mut host = vec![0u32; 4 * b];
                stream
                    .memcpy_dtoh(&counts.slice(..4 * b), &mut host)
                    .map_err(gpu(dev, "copying code counts"))?;
                // Each variant's standardization, as the CPU kernels compute it.
                let mut table = Vec::with_capacity(4 * b);
                for c in host.chunks_exact(4) {
                    let counts = RowCounts {
                        dosages: [c[0] as u64, c[1] as u64, c[2] as u64],
                        missing: c[3] as u64,
                    };
                    let scale = scale_of(&counts);
                    facts.missing += counts.missing;
                    if scale.scale == 0.0 {
                        facts.dropped += 1;
                    }
                    if measure {
                        facts.sum_squares += counts.sum_squares::<T>(scale);
                    }
                    table.extend(scale.table().iter().map(|&v| T::from_f64(v)));
                }
                let table = stream
                    .clone_htod(&table)
                    .map_err(gpu(dev, "copying standardization tables"))?;
                let col0 = 0u32;
                let mut l = stream.launch_builder(T::standardize(k));
                l.arg(&mut self.tile)
                    .arg(&*packed)
                    .arg(&table)
                    .arg(&col0)
                    .arg(&b32)
                    .arg(&n32)
                    .arg(&stride)
                    .arg(&n32);
                // SAFETY: reads b rows of packed codes and 4 table entries per row, writes
                // b rows of n values into the tile.
                unsafe { l.launch(grid(self.n, b)) }
                    .map_err(gpu(dev, "standardizing genotypes"))?;
            }
        }
        Ok(())
    }

    /// Σ x² of the first `len` values of the tile.
    fn sum_squares(&mut self, len: usize) -> Result<f64, LinalgError> {
        let dev = self.dev;
        let stream = dev.stream();
        stream
            .memset_zeros(&mut self.sum)
            .map_err(gpu(dev, "zeroing a sum"))?;
        let len64 = len as u64;
        let mut l = stream.launch_builder(T::sum_squares_kernel(dev.kernels()));
        l.arg(&self.tile).arg(&len64).arg(&mut self.sum);
        // SAFETY: reads `len` ≤ tile length values; writes one f64.
        unsafe { l.launch(flat(len)) }.map_err(gpu(dev, "summing squares"))?;
        let mut out = [0f64];
        stream
            .memcpy_dtoh(&self.sum, &mut out)
            .map_err(gpu(dev, "copying a sum"))?;
        Ok(out[0])
    }
}

/// `acc += part` on the device, `len` values.
fn add_into<T: GpuReal>(
    dev: &GpuDevice,
    acc: &mut CudaSlice<f64>,
    part: &CudaSlice<T>,
    len: usize,
) -> Result<(), LinalgError>
where
    CudaBlas: Gemm<T>,
{
    let k = dev.kernels();
    let f = if std::mem::size_of::<T>() == 4 {
        &k.add_f32_to_f64
    } else {
        &k.add_f64
    };
    let len64 = len as u64;
    let mut l = dev.stream().launch_builder(f);
    l.arg(&mut *acc).arg(part).arg(&len64);
    // SAFETY: both buffers hold at least `len` values of the kernel's types (f32 parts go
    // to add_f32_to_f64, f64 parts to add_f64).
    unsafe { l.launch(flat(len)) }.map_err(gpu(dev, "adding partial products"))?;
    Ok(())
}

/// Range pass of one panel: `Y = A[rows, :]·omega` (`h × w`, f64), and the panel's facts.
pub fn range_panel<T: GpuReal>(
    dev: &GpuDevice,
    src: &DeviceSource,
    rows: Range<u64>,
    omega: ArrayView2<'_, T>,
    measure: bool,
) -> Result<(Array2<f64>, PanelFacts), LinalgError>
where
    CudaBlas: Gemm<T>,
{
    let _lane = dev.lock();
    let stream = dev.stream();
    let (n, w) = omega.dim();
    let h = (rows.end - rows.start) as usize;
    let mut facts = PanelFacts::default();
    let mut y = Array2::<f64>::zeros((h, w));
    if h == 0 || w == 0 {
        return Ok((y, facts));
    }
    let omega = omega.as_standard_layout();
    let om = stream
        .clone_htod(omega.as_slice().expect("standard layout"))
        .map_err(gpu(dev, "copying the test matrix"))?;
    let mut p = Producer::<T>::new(dev, src, n, h)?;
    let alloc = gpu(dev, "allocating products");
    let mut acc = stream.alloc_zeros::<f64>(p.rows * w).map_err(&alloc)?;
    let chunk = T::chunk(n);
    let mut part = if chunk < n {
        Some(stream.alloc_zeros::<T>(p.rows * w).map_err(&alloc)?)
    } else {
        None
    };
    for r0 in (0..h).step_by(p.rows) {
        let r1 = (r0 + p.rows).min(h);
        let b = r1 - r0;
        p.produce(
            rows.start + r0 as u64..rows.start + r1 as u64,
            measure,
            &mut facts,
        )?;
        // Yᵀ (w × b) = Ωᵀ (w × n) · tileᵀ (n × b), column-major.
        for c0 in (0..n).step_by(chunk) {
            let kc = chunk.min(n - c0);
            let cfg = |beta| GemmConfig {
                transa: CUBLAS_OP_N,
                transb: CUBLAS_OP_N,
                m: w as i32,
                n: b as i32,
                k: kc as i32,
                alpha: T::one(),
                lda: w as i32,
                ldb: n as i32,
                beta,
                ldc: w as i32,
            };
            let a = om.slice(c0 * w..(c0 + kc) * w);
            let t = p.tile.slice(c0..);
            if let Some(sums) = T::sums(&mut acc) {
                // f64: one product over all columns, straight into the sums.
                let mut c = sums.slice_mut(..b * w);
                // SAFETY: the shapes lie inside the buffers: Ω is n × w, the tile b × n
                // (row-major), the sums b × w.
                unsafe { dev.blas().gemm(cfg(T::zero()), &a, &t, &mut c) }
                    .map_err(|e| blas_err(dev, "GEMM of a tile with Ω", e))?;
                continue;
            }
            let part = part.as_mut().expect("f32 products have a part buffer");
            {
                let mut c = part.slice_mut(..b * w);
                // SAFETY: as above, with the product of kc columns into `part`.
                unsafe { dev.blas().gemm(cfg(T::zero()), &a, &t, &mut c) }
                    .map_err(|e| blas_err(dev, "GEMM of a tile with Ω", e))?;
            }
            if c0 == 0 {
                stream
                    .memset_zeros(&mut acc)
                    .map_err(gpu(dev, "zeroing sums"))?;
            }
            add_into(dev, &mut acc, part, b * w)?;
        }
        let dst = y
            .slice_mut(s![r0..r1, ..])
            .into_slice()
            .expect("rows of a standard-layout array are contiguous");
        stream
            .memcpy_dtoh(&acc.slice(..b * w), dst)
            .map_err(gpu(dev, "copying Y"))?;
    }
    Ok((y, facts))
}

/// Projection pass of one panel: `B = Qᵀ·A[rows, :]` (`l × n`, f64) for the panel's rows
/// `q` (`h × l`) of the basis.
pub fn project_panel<T: GpuReal>(
    dev: &GpuDevice,
    src: &DeviceSource,
    rows: Range<u64>,
    q: ArrayView2<'_, f64>,
    n: usize,
) -> Result<Array2<f64>, LinalgError>
where
    CudaBlas: Gemm<T>,
{
    let _lane = dev.lock();
    let stream = dev.stream();
    let (h, l) = q.dim();
    let mut out = Array2::<f64>::zeros((l, n));
    if h == 0 || l == 0 || n == 0 {
        return Ok(out);
    }
    let mut p = Producer::<T>::new(dev, src, n, h)?;
    let alloc = gpu(dev, "allocating products");
    let mut acc = stream.alloc_zeros::<f64>(l * n).map_err(&alloc)?;
    let mut part = if std::mem::size_of::<T>() == 4 {
        Some(stream.alloc_zeros::<T>(l * n).map_err(&alloc)?)
    } else {
        None
    };
    let mut facts = PanelFacts::default();
    let mut qt: Vec<T> = Vec::new();
    for r0 in (0..h).step_by(p.rows) {
        let r1 = (r0 + p.rows).min(h);
        let b = r1 - r0;
        p.produce(
            rows.start + r0 as u64..rows.start + r1 as u64,
            false,
            &mut facts,
        )?;
        qt.clear();
        qt.extend(q.slice(s![r0..r1, ..]).iter().map(|&v| T::from_f64(v)));
        let qd = stream
            .clone_htod(&qt)
            .map_err(gpu(dev, "copying rows of Q"))?;
        // Bᵀ (n × l) += tileᵀ (n × b) · Q (b × l), column-major; Q row-major is Qᵀ there.
        let cfg = |beta| GemmConfig {
            transa: CUBLAS_OP_N,
            transb: CUBLAS_OP_T,
            m: n as i32,
            n: l as i32,
            k: b as i32,
            alpha: T::one(),
            lda: n as i32,
            ldb: l as i32,
            beta,
            ldc: n as i32,
        };
        if let Some(sums) = T::sums(&mut acc) {
            // f64: accumulate in place. SAFETY: tile b × n, Q b × l, sums l × n.
            unsafe { dev.blas().gemm(cfg(T::one()), &p.tile, &qd, sums) }
                .map_err(|e| blas_err(dev, "GEMM of Qᵀ with a tile", e))?;
            continue;
        }
        let part = part.as_mut().expect("f32 products have a part buffer");
        // SAFETY: as above, the product into `part`.
        unsafe { dev.blas().gemm(cfg(T::zero()), &p.tile, &qd, part) }
            .map_err(|e| blas_err(dev, "GEMM of Qᵀ with a tile", e))?;
        add_into(dev, &mut acc, part, l * n)?;
    }
    stream
        .memcpy_dtoh(
            &acc,
            out.as_slice_mut().expect("a new array is standard layout"),
        )
        .map_err(gpu(dev, "copying B"))?;
    Ok(out)
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
) -> Result<(Array2<T>, PanelFacts), LinalgError>
where
    CudaBlas: Gemm<T>,
{
    let _lane = dev.lock();
    let h = (rows.end - rows.start) as usize;
    let mut out = Array2::<T>::zeros((h, n));
    let mut facts = PanelFacts::default();
    if h == 0 || n == 0 {
        return Ok((out, facts));
    }
    let mut p = Producer::<T>::new(dev, src, n, h)?;
    for r0 in (0..h).step_by(p.rows) {
        let r1 = (r0 + p.rows).min(h);
        p.produce(
            rows.start + r0 as u64..rows.start + r1 as u64,
            true,
            &mut facts,
        )?;
        let dst = out
            .slice_mut(s![r0..r1, ..])
            .into_slice()
            .expect("rows of a standard-layout array are contiguous");
        dev.stream()
            .memcpy_dtoh(&p.tile.slice(..(r1 - r0) * n), dst)
            .map_err(gpu(dev, "copying a tile"))?;
    }
    Ok((out, facts))
}
