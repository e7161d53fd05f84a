//! One CUDA device of a GPU actor: its context, stream, cuBLAS handle and kernels.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublas::CudaBlas;
use cudarc::cusolver::DnHandle;
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, PinnedHostSlice};
use cudarc::nvrtc::Ptx;

use crate::{GpuError, GpuLibraries};

/// The CUDA C source of the device kernels.
pub const KERNELS_SOURCE: &str = include_str!("kernels.cu");

/// Names of the kernels in [`KERNELS_SOURCE`], in the order of [`GpuKernels`]' fields.
pub(crate) const KERNEL_NAMES: [&str; 15] = [
    "uniform_f64",
    "uniform_f32",
    "genotype_packed",
    "dosage_codes",
    "standardize_f64",
    "standardize_f32",
    "add_f32_to_f64",
    "add_f64",
    "sum_squares_f64",
    "sum_squares_f32",
    "round_f64_to_f32",
    "rows_to_columns_f64",
    "top_rows_f64",
    "copy_segments",
    "blosc_unshuffle",
];

/// The compiled kernels of one device (see `kernels.cu` for what each computes).
#[derive(Clone, Debug)]
pub struct GpuKernels {
    /// Uniform generated values, f64.
    pub uniform_f64: CudaFunction,
    /// Uniform generated values rounded to f32.
    pub uniform_f32: CudaFunction,
    /// Generated genotype dosages, 2-bit packed, with per-variant code counts.
    pub genotype_packed: CudaFunction,
    /// Decoded int8 dosages → the same packed codes and counts, flagging non-dosages.
    pub dosage_codes: CudaFunction,
    /// Packed codes → standardized f64 tile through per-variant tables.
    pub standardize_f64: CudaFunction,
    /// Packed codes → standardized f32 tile.
    pub standardize_f32: CudaFunction,
    /// `acc += part` with f32 parts and f64 sums.
    pub add_f32_to_f64: CudaFunction,
    /// `acc += part` in f64.
    pub add_f64: CudaFunction,
    /// Σ x² of an f64 buffer, one partial sum per thread block.
    pub sum_squares_f64: CudaFunction,
    /// Σ x² of an f32 buffer, summed in f64, one partial sum per thread block.
    pub sum_squares_f32: CudaFunction,
    /// `out = x` rounded from f64 to f32.
    pub round_f64_to_f32: CudaFunction,
    /// Row-major f64 tile rows into a column-major panel (for cuSOLVER).
    pub rows_to_columns_f64: CudaFunction,
    /// The top rows of a column-major matrix (R after geqrf).
    pub top_rows_f64: CudaFunction,
    /// Byte segments copied by a table (a Blosc frame's stored streams).
    pub copy_segments: CudaFunction,
    /// Blosc blocks put together from their decoded streams (byte or bit unshuffle).
    pub blosc_unshuffle: CudaFunction,
}

/// Compiles [`KERNELS_SOURCE`] with NVRTC into machine code (CUBIN) for compute
/// capability `major.minor`. Machine code rather than PTX: PTX from an NVRTC newer than the
/// driver is refused by the driver's JIT, while a CUBIN for the device's own architecture
/// loads under any driver of the same CUDA major version.
pub fn compile_kernels(major: i32, minor: i32) -> Result<Vec<u8>, String> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(KERNELS_SOURCE).expect("the kernel source has no NUL");
    let prog = result::create_program(&src, None).map_err(|e| e.to_string())?;
    let options = [
        format!("--gpu-architecture=sm_{major}{minor}"),
        // Bit-exact generator arithmetic: no contraction of multiplies and adds.
        "--fmad=false".to_string(),
    ];
    // SAFETY: `prog` is a live program; the options are NUL-free strings.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let out = match compiled {
        Err(e) => {
            // SAFETY: as above.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| {
                    let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_string()
                })
                .unwrap_or_default();
            Err(format!("{e}: {log}"))
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` compiled; `size` and then `cubin` (of that size) are valid
            // out-buffers.
            unsafe {
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        let mut cubin = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast())
                            .result()
                            .map_err(|e| e.to_string())
                            .map(|()| cubin)
                    })
            }
        }
    };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// A CUDA device opened for one GPU actor.
pub struct GpuDevice {
    ordinal: usize,
    name: String,
    memory_bytes: u64,
    stream: Arc<CudaStream>,
    /// Host-to-device copies of staged panels, so that they overlap the kernels on
    /// `stream` (cudarc orders the two streams' uses of a buffer by its events).
    copy_stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuSOLVER's dense handle on `stream`, when the library was found (panel QR on the
    /// device; the host factors the panels without it).
    solver: Option<DnHandle>,
    kernels: GpuKernels,
    /// Page-locked staging buffers, kept from job to job: allocating them costs
    /// milliseconds per buffer, and a pass stages every panel it reads.
    pinned: Mutex<Vec<PinnedHostSlice<u8>>>,
    /// How many buffers `pinned` keeps ([`GpuDevice::keep_pinned`]).
    pinned_keep: AtomicUsize,
    /// One job's device work at a time: the actor's threads share the stream, and each
    /// job sizes its device buffers for the whole device.
    lane: Mutex<()>,
}

impl std::fmt::Debug for GpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuDevice({} {})", self.ordinal, self.name)
    }
}

impl GpuDevice {
    /// Opens device `ordinal`: its primary context, a stream, a cuBLAS handle on it, and
    /// the kernels compiled for its compute capability. Checks first that the libraries
    /// are there (see [`GpuLibraries::usable`]).
    pub fn open(ordinal: usize, libs: &GpuLibraries) -> Result<GpuDevice, GpuError> {
        libs.usable()?;
        let info = libs
            .devices
            .iter()
            .find(|d| d.ordinal == ordinal)
            .ok_or_else(|| {
                GpuError::NoDevice(format!(
                    "device {ordinal} asked for, {} visible",
                    libs.devices.len()
                ))
            })?;
        let cuda = |what: &str| {
            let what = what.to_string();
            move |e: cudarc::driver::DriverError| GpuError::Cuda {
                ordinal,
                what,
                message: e.to_string(),
            }
        };
        let ctx = CudaContext::new(ordinal).map_err(cuda("creating the context"))?;
        let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
        let copy_stream = ctx.new_stream().map_err(cuda("creating a copy stream"))?;
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| GpuError::Cuda {
            ordinal,
            what: "creating the cuBLAS handle".into(),
            message: e.to_string(),
        })?;
        let solver = match libs.find("cusolver") {
            Some(_) => Some(
                DnHandle::new(Arc::clone(&stream)).map_err(|e| GpuError::Cuda {
                    ordinal,
                    what: "creating the cuSOLVER handle".into(),
                    message: format!("{e:?}"),
                })?,
            ),
            None => None,
        };
        let (major, minor) = info.compute_capability;
        let ptx = compile_kernels(major, minor).map_err(|message| GpuError::Compile {
            ordinal,
            arch: format!("sm_{major}{minor}"),
            message,
        })?;
        let module = ctx
            .load_module(Ptx::from_binary(ptx))
            .map_err(cuda("loading the kernels"))?;
        let mut f = Vec::with_capacity(KERNEL_NAMES.len());
        for name in KERNEL_NAMES {
            f.push(
                module
                    .load_function(name)
                    .map_err(cuda(&format!("kernel {name}")))?,
            );
        }
        let mut f = f.into_iter();
        let mut next = || f.next().expect("one function per kernel name");
        let kernels = GpuKernels {
            uniform_f64: next(),
            uniform_f32: next(),
            genotype_packed: next(),
            dosage_codes: next(),
            standardize_f64: next(),
            standardize_f32: next(),
            add_f32_to_f64: next(),
            add_f64: next(),
            sum_squares_f64: next(),
            sum_squares_f32: next(),
            round_f64_to_f32: next(),
            rows_to_columns_f64: next(),
            top_rows_f64: next(),
            copy_segments: next(),
            blosc_unshuffle: next(),
        };
        Ok(GpuDevice {
            ordinal,
            name: info.name.clone(),
            memory_bytes: info.memory_bytes,
            stream,
            copy_stream,
            blas,
            solver,
            kernels,
            pinned: Mutex::new(Vec::new()),
            pinned_keep: AtomicUsize::new(PINNED_POOL),
            lane: Mutex::new(()),
        })
    }

    /// CUDA device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Model name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Device memory in bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Free device memory in bytes, as the driver reports it now.
    pub fn free_memory(&self) -> Result<u64, GpuError> {
        self.stream
            .context()
            .mem_get_info()
            .map(|(free, _)| free as u64)
            .map_err(|e| self.error("reading free memory", e))
    }

    /// The actor's stream: every kernel, copy and GEMM of its jobs runs on it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The stream that copies staged panels to the device ([`GpuDevice::pinned`]).
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy_stream
    }

    /// Lends a page-locked host buffer of at least `bytes` bytes (from the device's pool
    /// when one is large enough, else newly allocated); it goes back to the pool when the
    /// lease is dropped. Copies from page-locked memory are DMA transfers that overlap the
    /// host's work; from pageable memory the driver first copies through its own buffer.
    pub fn pinned(&self, bytes: usize) -> Result<PinnedLease<'_>, GpuError> {
        // Whole 8-byte words, so that the buffer can be viewed as f64 values.
        let bytes = bytes.max(1).next_multiple_of(8);
        let found = {
            let mut pool = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
            // Best fit: a small table block must not take a large block's buffer and
            // leave the next large request to allocate another.
            let i = (0..pool.len())
                .filter(|&i| pool[i].len() >= bytes)
                .min_by_key(|&i| pool[i].len());
            i.map(|i| pool.swap_remove(i))
        };
        let buffer = match found {
            Some(b) => b,
            None => {
                let ctx = self.stream.context();
                // SAFETY: the memory is uninitialized; every lease writes what it copies
                // before the copy reads it (PinnedLease::values_mut hands out only what
                // the caller fills).
                unsafe { ctx.alloc_pinned::<u8>(bytes) }.map_err(|e| {
                    self.error(
                        &format!("allocating {bytes} bytes of pinned host memory"),
                        e,
                    )
                })?
            }
        };
        let done = self
            .stream
            .context()
            .new_event(Some(
                cudarc::driver::sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC,
            ))
            .map_err(|e| self.error("creating an event", e))?;
        Ok(PinnedLease {
            buffer: Some(buffer),
            pool: &self.pinned,
            keep: &self.pinned_keep,
            done,
        })
    }

    /// Keeps up to `buffers` page-locked buffers between jobs (eight at the least):
    /// as many as the actor's threads hold at once when all of them stage panels, four each
    /// (two blocks and two tables), which the memory plan already counts. A smaller pool
    /// frees and allocates buffers for every panel, and freeing page-locked memory waits
    /// for the device.
    pub fn keep_pinned(&self, buffers: usize) {
        self.pinned_keep
            .store(buffers.max(PINNED_POOL), Ordering::Relaxed);
    }

    /// Makes this device's context current on the calling thread. cudarc's driver calls do
    /// that themselves; cuBLAS, cuSOLVER and NCCL calls act on whatever context is current,
    /// and a rank's main thread last bound the device it opened last.
    pub fn bind(&self) -> Result<(), GpuError> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.error("making the device's context current", e))
    }

    /// cuSOLVER's dense handle, bound to [`GpuDevice::stream`], when the library was found.
    pub fn solver(&self) -> Option<&DnHandle> {
        self.solver.as_ref()
    }

    /// cuBLAS, bound to [`GpuDevice::stream`].
    pub fn blas(&self) -> &CudaBlas {
        &self.blas
    }

    /// The compiled kernels.
    pub fn kernels(&self) -> &GpuKernels {
        &self.kernels
    }

    /// Holds the device for one job's work.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        // A job that panicked while holding the lane left no state behind it to protect.
        self.lane.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A CUDA error of this device, saying what was being done.
    pub fn error(&self, what: &str, e: impl std::fmt::Display) -> GpuError {
        GpuError::Cuda {
            ordinal: self.ordinal,
            what: what.into(),
            message: e.to_string(),
        }
    }
}

/// Page-locked buffers a device keeps for later jobs at the least: four per staging (two
/// blocks of codes or values, two of tables) for two concurrent stagings.
const PINNED_POOL: usize = 8;

/// A page-locked host buffer lent by [`GpuDevice::pinned`], with the event of the last
/// copy out of it: the host waits for that copy before writing the buffer again.
pub struct PinnedLease<'d> {
    buffer: Option<PinnedHostSlice<u8>>,
    pool: &'d Mutex<Vec<PinnedHostSlice<u8>>>,
    keep: &'d AtomicUsize,
    done: CudaEvent,
}

impl PinnedLease<'_> {
    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.buffer.as_ref().map_or(0, |b| b.len())
    }

    /// Whether the buffer is empty (never: leases hold at least 8 bytes).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer as `len` values of `T`, to be written, after the last copy out of it
    /// has finished ([`PinnedLease::copied`]).
    pub fn values_mut<T: bytemuck::Pod>(
        &mut self,
        len: usize,
    ) -> Result<&mut [T], cudarc::driver::DriverError> {
        self.done.synchronize()?;
        let b = self
            .buffer
            .as_mut()
            .expect("held until dropped")
            .as_mut_slice()?;
        Ok(&mut bytemuck::cast_slice_mut::<u8, T>(&mut b[..len * std::mem::size_of::<T>()])[..])
    }

    /// The first `len` values of `T` of the buffer, to be copied from.
    pub fn values<T: bytemuck::Pod>(
        &self,
        len: usize,
    ) -> Result<&[T], cudarc::driver::DriverError> {
        let b = self
            .buffer
            .as_ref()
            .expect("held until dropped")
            .as_slice()?;
        Ok(bytemuck::cast_slice::<u8, T>(
            &b[..len * std::mem::size_of::<T>()],
        ))
    }

    /// Marks the work queued on `stream` so far as the last copy out of the buffer.
    pub fn copied(&self, stream: &CudaStream) -> Result<(), cudarc::driver::DriverError> {
        self.done.record(stream)
    }
}

impl Drop for PinnedLease<'_> {
    fn drop(&mut self) {
        // A copy still reading the buffer must finish before another lease may write it.
        let _ = self.done.synchronize();
        if let Some(b) = self.buffer.take() {
            let evicted = {
                let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
                pool.push(b);
                evict_smallest(&mut pool, self.keep.load(Ordering::Relaxed), |b| b.len())
            };
            // Freed outside the lock: cuMemFreeHost waits for the device, and the other
            // threads' leases need the pool meanwhile.
            drop(evicted);
        }
    }
}

/// Jobs of other shapes leave buffers of other sizes: a pool over `keep` buffers keeps its
/// largest and gives back the rest, to be freed.
fn evict_smallest<T>(pool: &mut Vec<T>, keep: usize, len: impl Fn(&T) -> usize) -> Vec<T> {
    if pool.len() <= keep {
        return Vec::new();
    }
    pool.sort_by_key(|b| std::cmp::Reverse(len(b)));
    pool.split_off(keep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_pool_keeps_its_largest_buffers_and_gives_back_the_rest() {
        let mut pool = vec![64, 8, 64, 16, 64, 8];
        assert!(evict_smallest(&mut pool, 6, |&b| b).is_empty());
        assert_eq!(pool, [64, 8, 64, 16, 64, 8]);
        let mut evicted = evict_smallest(&mut pool, 4, |&b| b);
        evicted.sort();
        assert_eq!(evicted, [8, 8]);
        assert_eq!(pool, [64, 64, 64, 16]);
        assert_eq!(evict_smallest(&mut pool, 0, |&b| b).len(), 4);
        assert!(pool.is_empty());
    }

    /// The kernels compile wherever NVRTC can be loaded, GPU or not (NVRTC is a compiler
    /// library; `pip install nvidia-cuda-nvrtc` provides one on any x86-64 Linux).
    #[test]
    fn kernels_compile_with_nvrtc() {
        let libs = crate::probe();
        if libs.find("nvrtc").is_none() {
            println!(
                "skipped: NVRTC not found (searched {}); the CUDA kernels were not compiled",
                libs.libraries
                    .iter()
                    .find(|l| l.name == "nvrtc")
                    .map(|l| l.searched.join(" "))
                    .unwrap_or_default()
            );
            return;
        }
        for (major, minor) in [(8, 0), (9, 0)] {
            let bytes = compile_kernels(major, minor)
                .unwrap_or_else(|log| panic!("sm_{major}{minor}: {log}"));
            assert!(
                bytes.starts_with(b"\x7fELF"),
                "sm_{major}{minor}: not a CUBIN"
            );
            // Every kernel is in the machine code's symbol table.
            for name in KERNEL_NAMES {
                assert!(
                    bytes.windows(name.len()).any(|w| w == name.as_bytes()),
                    "sm_{major}{minor}: {name} missing"
                );
            }
        }
    }
}
