//! The device kernels compiled for the host CPU, to check them where no GPU is present.
//!
//! # Why
//!
//! The kernels of `kernels.cu` must reproduce the CPU generator and kernels bit for bit,
//! and the GPU passes launch them with geometry and parameters of their own. A GPU runs
//! them only on machines that have one, so the tests of `make test` compile the same
//! source with the system's C++ compiler against `host_cuda.h`, which provides the CUDA
//! built-ins the kernels use on host threads, and run them through [`HostKernels::launch`]
//! with the grid and parameters the GPU passes would pass to cuLaunchKernel.
//!
//! This checks the kernels' arithmetic, indexing and launch geometry; it does not check
//! what only a device shows (memory ordering between streams, cuBLAS, timings), which
//! `make test-gpu` does.
//!
//! # Faithful parameters
//!
//! As with cuLaunchKernel, each parameter is read through a pointer with the size the
//! kernel declares. [`HostArgs`] stores each value in a slot of its own size followed by
//! filler bytes, so a 4-byte value passed where the kernel reads 8 bytes yields garbage
//! here as it would on the device, rather than a value that happens to be right.

use std::ffi::{c_char, c_void};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::device::KERNEL_NAMES;
use crate::KERNELS_SOURCE;

/// The C++ side: CUDA built-ins on host threads.
const HOST_HEADER: &str = include_str!("host_cuda.h");

/// The kernels whose threads wait for each other (`__syncthreads`, warp shuffles): they run
/// a host thread per device thread. The others run their threads one after another, and a
/// barrier in one of them is reported as an error, so a kernel missing here cannot pass.
const SYNCHRONIZING: [&str; 4] = [
    "genotype_packed",
    "dosage_codes",
    "sum_squares_f64",
    "sum_squares_f32",
];

/// Errors of compiling or running the kernels on the host.
#[derive(Debug, Clone, thiserror::Error)]
pub enum HostKernelError {
    /// The C++ compiler could not be run or failed.
    #[error("compiling the device kernels for the host with `{compiler}`: {message}")]
    Compile {
        /// The compiler command.
        compiler: String,
        /// Its output or why it did not run.
        message: String,
    },
    /// The compiled library could not be loaded or lacks a kernel.
    #[error("loading the host-compiled kernels: {0}")]
    Load(String),
    /// A launch was refused or went wrong in the kernel.
    #[error("kernel {kernel} on the host: {message}")]
    Launch {
        /// The kernel.
        kernel: String,
        /// What went wrong.
        message: String,
    },
}

type Entry = unsafe extern "C" fn(*const u32, *mut *mut c_void, usize, *mut c_char, usize) -> i32;

/// The kernels of [`KERNELS_SOURCE`] built for the host (see the module documentation).
pub struct HostKernels {
    _lib: libloading::Library,
    entries: Vec<(&'static str, Entry)>,
}

impl std::fmt::Debug for HostKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKernels")
            .field("kernels", &self.entries.len())
            .finish()
    }
}

impl HostKernels {
    /// The kernels, compiled once per process with `$CXX` (default `c++`).
    pub fn get() -> Result<&'static HostKernels, HostKernelError> {
        static KERNELS: OnceLock<Result<HostKernels, HostKernelError>> = OnceLock::new();
        KERNELS
            .get_or_init(|| {
                let kernels: Vec<(&'static str, bool)> = KERNEL_NAMES
                    .iter()
                    .map(|&name| (name, SYNCHRONIZING.contains(&name)))
                    .collect();
                Self::build(KERNELS_SOURCE, &kernels)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compiles `kernels` (name, whether its threads wait for each other) of `kernel_source`.
    fn build(
        kernel_source: &str,
        kernels: &[(&'static str, bool)],
    ) -> Result<HostKernels, HostKernelError> {
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
        let dir = scratch_dir();
        let compile_err = |message: String| HostKernelError::Compile {
            compiler: compiler.clone(),
            message,
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| compile_err(format!("creating {}: {e}", dir.display())))?;
        let result = (|| {
            let mut source = String::from("#include \"host_cuda.h\"\n#line 1 \"kernels.cu\"\n");
            source.push_str(kernel_source);
            source.push('\n');
            for (name, sync) in kernels {
                source.push_str(&format!("RW_HOST_EXPORT({name}, {sync})\n"));
            }
            let write = |name: &str, text: &str| {
                std::fs::write(dir.join(name), text)
                    .map_err(|e| compile_err(format!("writing {}: {e}", dir.display())))
            };
            write("host_cuda.h", HOST_HEADER)?;
            write("kernels_host.cpp", &source)?;
            let lib = dir.join("libkernels_host.so");
            let out = Command::new(&compiler)
                .args(["-std=c++17", "-O2", "-shared", "-fPIC", "-pthread", "-o"])
                .arg(&lib)
                .arg(dir.join("kernels_host.cpp"))
                .output()
                .map_err(|e| compile_err(format!("{e} (install a C++ compiler: g++)")))?;
            if !out.status.success() {
                return Err(compile_err(
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                ));
            }
            // SAFETY: the library is ours, just built; its initializers only set up
            // globals of the C++ runtime.
            let lib = unsafe { libloading::Library::new(&lib) }
                .map_err(|e| HostKernelError::Load(e.to_string()))?;
            let mut entries = Vec::with_capacity(kernels.len());
            for &(name, _) in kernels {
                let symbol = format!("rw_host_{name}");
                // SAFETY: RW_HOST_EXPORT defines each entry with exactly this signature.
                let f: Entry = unsafe { lib.get::<Entry>(symbol.as_bytes()) }
                    .map(|s| *s)
                    .map_err(|e| HostKernelError::Load(format!("{symbol}: {e}")))?;
                entries.push((name, f));
            }
            Ok(HostKernels { _lib: lib, entries })
        })();
        // The loaded library stays mapped after its file is gone.
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    /// Runs `kernel` over `grid` blocks of `block` threads with `args`, as cuLaunchKernel
    /// would, and waits for it.
    pub fn launch(
        &self,
        kernel: &str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        args: &mut HostArgs,
    ) -> Result<(), HostKernelError> {
        let f = self
            .entries
            .iter()
            .find(|(n, _)| *n == kernel)
            .map(|&(_, f)| f)
            .ok_or_else(|| HostKernelError::Launch {
                kernel: kernel.to_string(),
                message: "no such kernel in kernels.cu".to_string(),
            })?;
        let dims = [grid.0, grid.1, grid.2, block.0, block.1, block.2];
        let mut params: Vec<*mut c_void> = args
            .slots
            .iter_mut()
            .map(|s| s.as_mut_ptr() as *mut c_void)
            .collect();
        let mut err = vec![0u8; 1024];
        // SAFETY: `params` point at live slots of at least 8 bytes each (the widest
        // parameter the kernels take); the pointers inside them are the caller's buffers,
        // which `HostArgs` borrows mutably for as long as it lives.
        let rc = unsafe {
            f(
                dims.as_ptr(),
                params.as_mut_ptr(),
                params.len(),
                err.as_mut_ptr() as *mut c_char,
                err.len(),
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        Err(HostKernelError::Launch {
            kernel: kernel.to_string(),
            message: String::from_utf8_lossy(&err[..end]).into_owned(),
        })
    }
}

fn scratch_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "rankwise-host-kernels-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Filler of the bytes of a parameter slot past its value.
const FILLER: u8 = 0xA5;

/// The parameters of one host launch, in the kernel's order.
#[derive(Debug, Default)]
pub struct HostArgs<'b> {
    slots: Vec<[u8; 8]>,
    _buffers: std::marker::PhantomData<&'b mut ()>,
}

impl<'b> HostArgs<'b> {
    /// No parameters yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A scalar parameter, stored with its own size (at most 8 bytes).
    pub fn value<T: bytemuck::Pod>(&mut self, v: T) -> &mut Self {
        let bytes = bytemuck::bytes_of(&v);
        assert!(bytes.len() <= 8, "kernel parameters are at most 8 bytes");
        let mut slot = [FILLER; 8];
        slot[..bytes.len()].copy_from_slice(bytes);
        self.slots.push(slot);
        self
    }

    /// A buffer the kernel reads or writes (a device pointer on a GPU).
    pub fn buffer<T>(&mut self, b: &'b mut [T]) -> &mut Self {
        self.slots.push((b.as_mut_ptr() as u64).to_ne_bytes());
        self
    }

    /// A buffer the kernel only reads.
    pub fn input<T>(&mut self, b: &'b [T]) -> &mut Self {
        self.slots.push((b.as_ptr() as u64).to_ne_bytes());
        self
    }
}

/// A buffer with guard zones of filler on both sides, so that kernels writing outside
/// their range are caught ([`Guarded::check`]).
#[derive(Debug)]
pub struct Guarded<T> {
    all: Vec<T>,
    guard: usize,
    len: usize,
}

impl<T: bytemuck::Pod> Guarded<T> {
    /// `len` values (zeroed) between two guard zones of 4 KiB.
    pub fn zeroed(len: usize) -> Self {
        let guard = 4096 / std::mem::size_of::<T>().max(1);
        let mut all = vec![T::zeroed(); guard + len + guard];
        for (i, v) in all.iter_mut().enumerate() {
            if i < guard || i >= guard + len {
                bytemuck::bytes_of_mut(v).fill(FILLER);
            }
        }
        Guarded { all, guard, len }
    }

    /// The values between the guards.
    pub fn values(&self) -> &[T] {
        &self.all[self.guard..self.guard + self.len]
    }

    /// The values between the guards, to fill or hand to a kernel.
    pub fn values_mut(&mut self) -> &mut [T] {
        let (g, l) = (self.guard, self.len);
        &mut self.all[g..g + l]
    }

    /// An error naming `what` when anything was written into a guard zone.
    pub fn check(&self, what: &str) -> Result<(), String> {
        let bytes: &[u8] = bytemuck::cast_slice(&self.all);
        let size = std::mem::size_of::<T>();
        let (lo, hi) = (self.guard * size, (self.guard + self.len) * size);
        match bytes
            .iter()
            .enumerate()
            .find(|&(i, &b)| (i < lo || i >= hi) && b != FILLER)
        {
            None => Ok(()),
            Some((i, _)) => Err(format!(
                "{what}: a kernel wrote outside its buffer of {} values, at byte {} {} it",
                self.len,
                if i < lo { lo - i } else { i - hi + 1 },
                if i < lo { "before" } else { "past" }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use rankwise_testkit::Draw;

    use super::*;

    fn kernels() -> &'static HostKernels {
        HostKernels::get().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The element-wise kernels on fresh lengths and grids: standardization through the
    /// per-variant tables, f64 sums of f32 and f64 parts, rounding to f32, the column-major
    /// gather of tile rows and the top rows of a column-major matrix.
    #[test]
    fn element_wise_kernels_compute_what_their_callers_expect() {
        let k = kernels();
        let mut d = Draw::fresh();
        for round in 0..4 {
            let what = format!("round {round}");
            // standardize: out(i, j) = table[4 i + code(i, col0 + j)].
            let (h, w) = (1 + d.below(6) as usize, 1 + d.below(600) as usize);
            let col0 = d.below(9) as usize;
            let pld = (col0 + w).div_ceil(4) + d.below(2) as usize;
            let codes: Vec<u8> = (0..h * pld).map(|_| d.next() as u8).collect();
            let table: Vec<f64> = (0..4 * h).map(|_| d.unit()).collect();
            let ld = w + d.below(3) as usize;
            let mut out = Guarded::<f64>::zeroed(h * ld);
            {
                let mut a = HostArgs::new();
                a.buffer(out.values_mut())
                    .input(&codes)
                    .input(&table)
                    .value(col0 as u32)
                    .value(h as u32)
                    .value(w as u32)
                    .value(pld as u32)
                    .value(ld as u32);
                let grid = ((w as u32).div_ceil(64), 1 + d.below(h as u64) as u32, 1);
                k.launch("standardize_f64", grid, (64, 1, 1), &mut a)
                    .unwrap();
            }
            out.check(&what).unwrap();
            for i in 0..h {
                for j in 0..w {
                    let c = col0 + j;
                    let code = (codes[i * pld + c / 4] >> (2 * (c % 4))) & 3;
                    assert_eq!(
                        out.values()[i * ld + j],
                        table[4 * i + code as usize],
                        "{what}"
                    );
                }
            }
            // add_f32_to_f64, add_f64 and round_f64_to_f32 over grids smaller than the data.
            let len = 1 + d.below(5000) as usize;
            let part32: Vec<f32> = (0..len).map(|_| d.unit() as f32).collect();
            let part64: Vec<f64> = (0..len).map(|_| d.unit()).collect();
            let start: Vec<f64> = (0..len).map(|_| d.unit()).collect();
            let mut acc = Guarded::<f64>::zeroed(len);
            acc.values_mut().copy_from_slice(&start);
            let grid = (1 + d.below(8) as u32, 1, 1);
            for (name, f32s) in [("add_f32_to_f64", true), ("add_f64", false)] {
                let mut a = HostArgs::new();
                a.buffer(acc.values_mut());
                if f32s {
                    a.input(&part32);
                } else {
                    a.input(&part64);
                }
                a.value(len as u64);
                k.launch(name, grid, (256, 1, 1), &mut a).unwrap();
            }
            acc.check(&what).unwrap();
            for i in 0..len {
                let want = start[i] + part32[i] as f64 + part64[i];
                assert_eq!(acc.values()[i], want, "{what}: sum {i}");
            }
            let mut rounded = Guarded::<f32>::zeroed(len);
            {
                let mut a = HostArgs::new();
                a.buffer(rounded.values_mut())
                    .input(acc.values())
                    .value(len as u64);
                k.launch("round_f64_to_f32", grid, (256, 1, 1), &mut a)
                    .unwrap();
            }
            rounded.check(&what).unwrap();
            assert!(rounded
                .values()
                .iter()
                .zip(acc.values())
                .all(|(&r, &v)| r == v as f32));
            // rows_to_columns_f64: tile rows into rows r0.. of a column-major panel.
            let (b, n) = (1 + d.below(9) as usize, 1 + d.below(300) as usize);
            let r0 = d.below(5) as usize;
            let panel_ld = r0 + b + d.below(3) as usize;
            let tile: Vec<f64> = (0..b * n).map(|_| d.unit()).collect();
            let mut panel = Guarded::<f64>::zeroed(panel_ld * n);
            {
                let mut a = HostArgs::new();
                a.buffer(panel.values_mut())
                    .input(&tile)
                    .value(r0 as u64)
                    .value(b as u32)
                    .value(n as u32)
                    .value(panel_ld as u64);
                let grid = ((n as u32).div_ceil(256), 1 + d.below(b as u64) as u32, 1);
                k.launch("rows_to_columns_f64", grid, (256, 1, 1), &mut a)
                    .unwrap();
            }
            panel.check(&what).unwrap();
            for i in 0..panel_ld {
                for j in 0..n {
                    let want = if (r0..r0 + b).contains(&i) {
                        tile[(i - r0) * n + j]
                    } else {
                        0.0
                    };
                    assert_eq!(
                        panel.values()[j * panel_ld + i],
                        want,
                        "{what}: panel ({i}, {j})"
                    );
                }
            }
            // top_rows_f64: the top kk rows of the column-major panel.
            let kk = 1 + d.below(panel_ld as u64) as usize;
            let mut top = Guarded::<f64>::zeroed(kk * n);
            {
                let mut a = HostArgs::new();
                a.buffer(top.values_mut())
                    .input(panel.values())
                    .value(kk as u32)
                    .value(n as u32)
                    .value(panel_ld as u64);
                let grid = ((kk as u32).div_ceil(256), 1 + d.below(n as u64) as u32, 1);
                k.launch("top_rows_f64", grid, (256, 1, 1), &mut a).unwrap();
            }
            top.check(&what).unwrap();
            for j in 0..n {
                for i in 0..kk {
                    assert_eq!(
                        top.values()[j * kk + i],
                        panel.values()[j * panel_ld + i],
                        "{what}"
                    );
                }
            }
        }
    }

    /// Σx² per block, on grids smaller and larger than the data: the partials add up to
    /// the sum of squares, and two launches give the same bits.
    #[test]
    fn sum_squares_partials_add_up_and_repeat() {
        let k = kernels();
        let mut d = Draw::fresh();
        for round in 0..4 {
            let len = 1 + d.below(20_000) as usize;
            let x: Vec<f32> = (0..len).map(|_| d.unit() as f32 - 0.5).collect();
            let blocks = 1 + d.below(40) as u32;
            let threads = [32u32, 128, 256][round % 3];
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut partial = Guarded::<f64>::zeroed(blocks as usize);
                {
                    let mut a = HostArgs::new();
                    a.input(&x).value(len as u64).buffer(partial.values_mut());
                    k.launch("sum_squares_f32", (blocks, 1, 1), (threads, 1, 1), &mut a)
                        .unwrap();
                }
                partial.check("partials").unwrap();
                runs.push(partial.values().iter().sum::<f64>());
            }
            let want: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
            assert!(
                (runs[0] - want).abs() <= 1e-12 * want,
                "round {round}: {} vs {want}",
                runs[0]
            );
            assert_eq!(
                runs[0].to_bits(),
                runs[1].to_bits(),
                "round {round}: repeat"
            );
        }
    }

    /// The host check itself: a full-mask shuffle in a block of 48 threads (a partial
    /// warp), a launch with a parameter missing, and a kernel that does not exist are
    /// reported, not run.
    #[test]
    fn the_host_check_reports_launches_a_device_would_get_wrong() {
        let k = kernels();
        let x = vec![1.0f64; 100];
        let mut partial = vec![0f64; 1];
        let mut a = HostArgs::new();
        a.input(&x).value(100u64).buffer(&mut partial);
        let e = k
            .launch("sum_squares_f64", (1, 1, 1), (48, 1, 1), &mut a)
            .unwrap_err();
        assert!(e.to_string().contains("partial warp"), "{e}");
        let mut a = HostArgs::new();
        a.input(&x).value(100u64);
        let e = k
            .launch("sum_squares_f64", (1, 1, 1), (32, 1, 1), &mut a)
            .unwrap_err();
        assert!(e.to_string().contains("takes 3 parameters"), "{e}");
        let e = k
            .launch("no_such", (1, 1, 1), (32, 1, 1), &mut HostArgs::new())
            .unwrap_err();
        assert!(e.to_string().contains("no such kernel"), "{e}");
    }

    /// Kernels written to break the rules the device relies on: a thread that returns
    /// before its warp's full-mask shuffle, threads of one block waiting at different
    /// barriers, and a barrier in a kernel listed as not synchronizing. Each is reported;
    /// the same shuffle with every thread present is not.
    #[test]
    fn the_host_check_reports_kernels_that_break_the_device_rules() {
        let source = r#"
extern "C" __global__ void shuffle(double* out, unsigned quit) {
    if (threadIdx.x == quit) return;
    double v = __shfl_down_sync(0xFFFFFFFFu, (double)threadIdx.x, 1);
    out[threadIdx.x] = v;
}
extern "C" __global__ void diverge(double* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        out[threadIdx.x] = __shfl_down_sync(0xFFFFFFFFu, 1.0, 1);
    }
}
extern "C" __global__ void unlisted(double* out) {
    __syncthreads();
    out[threadIdx.x] = 1.0;
}
"#;
        let k = HostKernels::build(
            source,
            &[("shuffle", true), ("diverge", true), ("unlisted", false)],
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut out = vec![0f64; 64];
        let mut a = HostArgs::new();
        a.buffer(&mut out).value(64u32);
        k.launch("shuffle", (1, 1, 1), (64, 1, 1), &mut a).unwrap();
        let want: Vec<f64> = (0..64)
            .map(|t| {
                if t % 32 == 31 {
                    t as f64
                } else {
                    t as f64 + 1.0
                }
            })
            .collect();
        assert_eq!(out, want, "a shuffle down by one within each warp");
        for quit in [5u32, 31, 40] {
            let mut a = HostArgs::new();
            a.buffer(&mut out).value(quit);
            let e = k
                .launch("shuffle", (1, 1, 1), (64, 1, 1), &mut a)
                .unwrap_err();
            let says = format!("thread {quit} of its warp has returned");
            assert!(e.to_string().contains(&says), "{e}");
        }
        let mut a = HostArgs::new();
        a.buffer(&mut out);
        let e = k
            .launch("diverge", (2, 1, 1), (32, 1, 1), &mut a)
            .unwrap_err();
        assert!(e.to_string().contains("wait at different barriers"), "{e}");
        let mut a = HostArgs::new();
        a.buffer(&mut out);
        let e = k
            .launch("unlisted", (1, 1, 1), (32, 1, 1), &mut a)
            .unwrap_err();
        assert!(e.to_string().contains("lists as not synchronizing"), "{e}");
    }
}
