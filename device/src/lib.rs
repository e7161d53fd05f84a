//! GPU actors' devices: CUDA through cudarc, every library loaded at run time.
//!
//! # Why everything is probed before it is used
//!
//! The binary is built without CUDA installed (cudarc's dynamic loading) and runs on
//! machines that have none. cudarc panics when a function of a library that is not there
//! is first called, so nothing here calls into a CUDA library before [`probe`] has found
//! it: [`GpuLibraries::require`] turns an absent library into an error that names it and
//! the names that were searched, and `rankwise info` prints the whole probe.
//!
//! # Layers
//!
//! `cudarc::*::sys` (the C functions, loaded lazily) → `cudarc::*::result`/safe wrappers →
//! [`GpuDevice`] (one device: context, stream, cuBLAS handle, the kernels of
//! `kernels.cu` compiled by NVRTC for its compute capability) → the GPU passes of
//! `rankwise-linalg`.

mod device;
#[cfg(any(test, feature = "host-kernels"))]
pub mod host;
mod libs;
mod nccl;
mod nvcomp;

pub use device::{compile_kernels, GpuDevice, GpuKernels, PinnedLease, KERNELS_SOURCE};
pub use libs::{probe, GpuInfo, GpuLibraries, Library};
pub use nccl::{NcclComm, NcclJoin};
pub use nvcomp::{status_name as nvcomp_status_name, Nvcomp, NvcompCodec};

use std::str::FromStr;
use std::sync::OnceLock;

/// [`probe`], once per process.
pub fn probed() -> &'static GpuLibraries {
    static PROBE: OnceLock<GpuLibraries> = OnceLock::new();
    PROBE.get_or_init(probe)
}

/// Errors of the GPU layer.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A CUDA library this needs was not found.
    #[error(
        "{what} needs the {library} library, which was not found (searched {searched}); \
         set LD_LIBRARY_PATH to its directory{}",
        if what.starts_with("`device`") { " or run with `device` cpu" } else { "" }
    )]
    Missing {
        /// What needed it.
        what: String,
        /// The library (e.g. `cublas`).
        library: &'static str,
        /// The file names that were tried.
        searched: String,
    },
    /// No CUDA device is visible to this process.
    #[error("`device` gpu: no CUDA device is visible to this process ({0})")]
    NoDevice(String),
    /// A call into CUDA failed.
    #[error("gpu {ordinal}: {what}: {message}")]
    Cuda {
        /// Device ordinal.
        ordinal: usize,
        /// The operation.
        what: String,
        /// CUDA's message.
        message: String,
    },
    /// NVRTC could not compile the kernels.
    #[error("gpu {ordinal}: compiling the kernels with NVRTC for {arch}: {message}")]
    Compile {
        /// Device ordinal.
        ordinal: usize,
        /// The target architecture.
        arch: String,
        /// NVRTC's log.
        message: String,
    },
}

/// Where actors compute (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// CPU NUMA domains only.
    Cpu,
    /// One GPU actor per GPU the rank is given; an error when there is none.
    Gpu,
    /// GPUs where CUDA, cuBLAS, NVRTC and a device are all present, else CPU.
    #[default]
    Auto,
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "gpu" => Ok(DeviceChoice::Gpu),
            "auto" => Ok(DeviceChoice::Auto),
            other => Err(format!("{other:?} is not one of cpu, gpu, auto")),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Gpu => "gpu",
            DeviceChoice::Auto => "auto",
        })
    }
}

/// The GPUs (device ordinals) a rank gets: with at least as many ranks on the node as
/// GPUs, one each (`local_rank % gpus`, so ranks share when there are more ranks);
/// with fewer ranks than GPUs, every GPU `g` with `g % local_size == local_rank`.
pub fn gpus_for_rank(local_rank: usize, local_size: usize, gpus: usize) -> Vec<usize> {
    if gpus == 0 {
        return Vec::new();
    }
    let local_size = local_size.max(1);
    let local_rank = local_rank % local_size;
    if local_size >= gpus {
        vec![local_rank % gpus]
    } else {
        (0..gpus).filter(|g| g % local_size == local_rank).collect()
    }
}

/// Resolves `--device` against what the probe found: the GPU ordinals this rank's actors
/// use (empty: CPU actors). `auto` falls back to CPU with the reason; `gpu` makes the
/// reason an error.
pub fn resolve_devices(
    choice: DeviceChoice,
    libs: &GpuLibraries,
    local_rank: usize,
    local_size: usize,
) -> Result<(Vec<usize>, Option<String>), GpuError> {
    if choice == DeviceChoice::Cpu {
        return Ok((Vec::new(), None));
    }
    let why_not = match libs.usable() {
        Err(e) => Some(e),
        Ok(()) if libs.devices.is_empty() => Some(GpuError::NoDevice(
            libs.device_error
                .clone()
                .unwrap_or_else(|| "the driver reports 0 devices".into()),
        )),
        Ok(()) => None,
    };
    match (why_not, choice) {
        (Some(e), DeviceChoice::Gpu) => Err(e),
        (Some(e), _) => Ok((Vec::new(), Some(e.to_string()))),
        (None, _) => Ok((
            gpus_for_rank(local_rank, local_size, libs.devices.len()),
            None,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_share_gpus_by_local_rank() {
        assert_eq!(gpus_for_rank(0, 1, 0), Vec::<usize>::new());
        assert_eq!(gpus_for_rank(0, 1, 4), vec![0, 1, 2, 3]);
        assert_eq!(gpus_for_rank(1, 2, 4), vec![1, 3]);
        assert_eq!(gpus_for_rank(3, 4, 4), vec![3]);
        assert_eq!(gpus_for_rank(5, 8, 4), vec![1]);
        assert_eq!(gpus_for_rank(2, 3, 1), vec![0]);
    }

    #[test]
    fn device_choice_parses_and_prints() {
        for c in [DeviceChoice::Cpu, DeviceChoice::Gpu, DeviceChoice::Auto] {
            assert_eq!(c.to_string().parse::<DeviceChoice>(), Ok(c));
        }
        assert!("tpu"
            .parse::<DeviceChoice>()
            .unwrap_err()
            .contains("cpu, gpu, auto"));
    }

    fn without_cuda() -> GpuLibraries {
        GpuLibraries {
            libraries: libs::LIBRARIES
                .iter()
                .map(|&(name, purpose)| Library {
                    name,
                    purpose,
                    found: None,
                    searched: vec![format!("lib{name}.so")],
                    hint: None,
                })
                .collect(),
            driver_version: None,
            devices: Vec::new(),
            device_error: None,
        }
    }

    #[test]
    fn auto_falls_back_to_cpu_and_gpu_names_the_missing_library() {
        let libs = without_cuda();
        let (gpus, why) = resolve_devices(DeviceChoice::Auto, &libs, 0, 1).unwrap();
        assert!(gpus.is_empty());
        assert!(why.unwrap().contains("cuda"));
        let err = resolve_devices(DeviceChoice::Gpu, &libs, 0, 1).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("the cuda library") && text.contains("libcuda.so"),
            "{text}"
        );
        assert!(resolve_devices(DeviceChoice::Cpu, &libs, 0, 1)
            .unwrap()
            .0
            .is_empty());
    }

    /// On this machine, whatever it has: the probe never panics, and a library it reports
    /// found really loads.
    #[test]
    fn probe_reports_without_panicking() {
        let libs = probe();
        for l in &libs.libraries {
            if let Some(file) = &l.found {
                // SAFETY: loading a library the probe already loaded once.
                assert!(unsafe { libloading::Library::new(file) }.is_ok(), "{file}");
            } else {
                assert!(!l.searched.is_empty());
            }
        }
        let text = libs.summary();
        assert!(text.contains("cuBLAS") && text.contains("NCCL"), "{text}");
        if libs.find("cuda").is_none() {
            println!("skipped the device part: no CUDA driver on this machine");
            assert!(libs.devices.is_empty());
        }
    }
}
