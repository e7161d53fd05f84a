//! Which CUDA libraries this process can load, and the devices the driver reports.

use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::GpuError;

/// The libraries the GPU actors use, by cudarc's base name, with what each is for.
pub(crate) const LIBRARIES: [(&str, &str); 7] = [
    ("cuda", "CUDA driver"),
    ("nvrtc", "NVRTC, compiles the kernels"),
    ("cublas", "cuBLAS, the GEMMs"),
    ("cublasLt", "cuBLASLt, loaded by cuBLAS"),
    ("cusolver", "cuSOLVER, panel QR"),
    ("nccl", "NCCL, collectives on device buffers"),
    ("nvcomp", "nvCOMP, decompresses Blosc chunks on the device"),
];

/// The libraries the GPU passes cannot run without.
const REQUIRED: [&str; 3] = ["cuda", "nvrtc", "cublas"];

/// One library's probe.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Library {
    /// cudarc's base name (`cublas`).
    pub name: &'static str,
    /// What rankwise uses it for.
    pub purpose: &'static str,
    /// The file name that loaded, if one did.
    pub found: Option<String>,
    /// The file names tried, in order.
    pub searched: Vec<String>,
    /// A library of this name that loads under a name cudarc does not try (NCCL's soname
    /// is `libnccl.so.2`, and NVIDIA's wheels ship nothing else), with what to do about it.
    pub hint: Option<String>,
}

/// A CUDA device as the driver reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuInfo {
    /// CUDA device ordinal (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// Model name.
    pub name: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// PCI address `domain:bus:device.0`, as hwloc prints it.
    pub pci_bus_id: String,
}

/// What [`probe`] found.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GpuLibraries {
    /// Every library rankwise uses (the driver, NVRTC, cuBLAS, cuBLASLt, cuSOLVER, NCCL),
    /// found or not.
    pub libraries: Vec<Library>,
    /// The driver's CUDA version as `(major, minor)`, when the driver loaded.
    pub driver_version: Option<(i32, i32)>,
    /// Devices visible to this process.
    pub devices: Vec<GpuInfo>,
    /// Why the device list could not be read, when the driver loaded but failed.
    pub device_error: Option<String>,
}

/// Looks for each CUDA library under the names cudarc would load, and asks the driver (if
/// it loaded) for its version and devices. Never panics and never calls a library it did
/// not find.
pub fn probe() -> GpuLibraries {
    let libraries: Vec<Library> = LIBRARIES
        .iter()
        .map(|&(name, purpose)| {
            // cudarc's candidates also carry Windows-style names (`cublas64_12`); on
            // Linux only `libNAME.so` and its versioned names can exist.
            let prefix = format!("lib{name}.so");
            let mut searched = Vec::new();
            if name == "nvcomp" {
                searched.extend(crate::nvcomp::NVCOMP_NAMES.iter().map(|n| n.to_string()));
            }
            for c in cudarc::get_lib_name_candidates(name) {
                if c.starts_with(&prefix) && !searched.contains(&c) {
                    searched.push(c);
                }
            }
            // SAFETY: loading a shared library runs its initializers; the CUDA libraries'
            // are the ones cudarc itself would run on first use.
            let found = searched
                .iter()
                .find(|c| unsafe { libloading::Library::new(c.as_str()) }.is_ok())
                .cloned();
            let hint = match (name, &found) {
                ("nccl", None) => soname_hint("libnccl.so.2", "libnccl.so"),
                // A file that loads but lacks the batched functions (an nvCOMP before 5).
                ("nvcomp", Some(_)) => crate::nvcomp::Nvcomp::get().err(),
                _ => None,
            };
            Library {
                name,
                purpose,
                found,
                searched,
                hint,
            }
        })
        .collect();
    let mut out = GpuLibraries {
        libraries,
        driver_version: None,
        devices: Vec::new(),
        device_error: None,
    };
    if out.find("cuda").is_some() {
        // A driver too old for a symbol cudarc expects panics inside cudarc: report it.
        match catch_unwind(AssertUnwindSafe(query_driver)) {
            Ok(Ok((version, devices))) => {
                out.driver_version = Some(version);
                out.devices = devices;
            }
            Ok(Err(e)) => out.device_error = Some(e),
            Err(_) => {
                out.device_error = Some("the CUDA driver lacks a function rankwise uses".into())
            }
        }
    }
    out
}

/// When `soname` loads though none of cudarc's names did: where it is, and the link under
/// `wanted` that would let cudarc load it.
fn soname_hint(soname: &str, wanted: &str) -> Option<String> {
    // SAFETY: as in `probe`: the library's initializers are the ones cudarc would run.
    let _lib = unsafe { libloading::Library::new(soname) }.ok()?;
    let path = linked_path(soname).unwrap_or_else(|| soname.to_string());
    Some(format!(
        "{path} loads, but only under the names above: link it as {wanted} in a directory on \
         LD_LIBRARY_PATH"
    ))
}

/// The path a loaded library named `soname` was loaded under, from the dynamic linker's
/// list of loaded objects.
fn linked_path(soname: &str) -> Option<String> {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the linker passes a valid entry; `data` is the `(soname, found)` pair below,
        // alive for the whole iteration.
        let (soname, found) = unsafe { &mut *(data as *mut (&str, Option<String>)) };
        let name = unsafe { (*info).dlpi_name };
        if name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated path owned by the linker.
        let path = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
        if path.ends_with(&format!("/{soname}")) {
            *found = Some(path.into_owned());
            return 1;
        }
        0
    }
    let mut data: (&str, Option<String>) = (soname, None);
    // SAFETY: `visit` only reads the entries and writes `data`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut data as *mut _ as *mut libc::c_void) };
    data.1
}

fn query_driver() -> Result<((i32, i32), Vec<GpuInfo>), String> {
    use cudarc::driver::{result, sys};
    result::init().map_err(|e| format!("cuInit: {e}"))?;
    let mut v = 0i32;
    // SAFETY: the driver is loaded (probed) and initialized; `v` is a valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| format!("cuDriverGetVersion: {e}"))?;
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
    let mut devices = Vec::new();
    for ordinal in 0..count.max(0) as usize {
        let dev = result::device::get(ordinal as i32).map_err(|e| format!("cuDeviceGet: {e}"))?;
        let attr = |a| {
            // SAFETY: `dev` is a device handle of the initialized driver.
            unsafe { result::device::get_attribute(dev, a) }.unwrap_or(-1)
        };
        use sys::CUdevice_attribute::*;
        let name = result::device::get_name(dev).unwrap_or_else(|e| format!("({e})"));
        // SAFETY: as above.
        let memory_bytes = unsafe { result::device::total_mem(dev) }.unwrap_or(0) as u64;
        devices.push(GpuInfo {
            ordinal,
            name,
            memory_bytes,
            compute_capability: (
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            pci_bus_id: format!(
                "{:04x}:{:02x}:{:02x}.0",
                attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
                attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
            ),
        });
    }
    Ok(((v / 1000, (v % 1000) / 10), devices))
}

impl GpuLibraries {
    /// The library `name` if it was found.
    pub fn find(&self, name: &str) -> Option<&Library> {
        self.libraries
            .iter()
            .find(|l| l.name == name && l.found.is_some())
    }

    /// An error naming `library` when it was not found (`what` says who needs it).
    pub fn require(&self, library: &'static str, what: &str) -> Result<(), GpuError> {
        if self.find(library).is_some() {
            return Ok(());
        }
        let searched = self
            .libraries
            .iter()
            .find(|l| l.name == library)
            .map(|l| l.searched.join(", "))
            .unwrap_or_default();
        Err(GpuError::Missing {
            what: what.into(),
            library,
            searched,
        })
    }

    /// Whether the GPU passes can run: the driver, NVRTC and cuBLAS were found.
    pub fn usable(&self) -> Result<(), GpuError> {
        for l in REQUIRED {
            self.require(l, "`device` gpu")?;
        }
        Ok(())
    }

    /// The lines `rankwise info` prints.
    pub fn summary(&self) -> String {
        let mut s = String::from("CUDA libraries (loaded at run time):\n");
        for l in &self.libraries {
            let _ = match &l.found {
                Some(f) => writeln!(
                    s,
                    "  {:<9} found: {f} ({}){}",
                    l.name,
                    l.purpose,
                    l.hint
                        .as_deref()
                        .map(|h| format!("; but {h}"))
                        .unwrap_or_default()
                ),
                None => writeln!(
                    s,
                    "  {:<9} not found ({}; searched {}){}",
                    l.name,
                    l.purpose,
                    l.searched.join(" "),
                    l.hint
                        .as_deref()
                        .map(|h| format!("; {h}"))
                        .unwrap_or_default()
                ),
            };
        }
        match (self.driver_version, &self.device_error) {
            (Some((ma, mi)), _) => {
                let _ = writeln!(s, "  driver supports CUDA {ma}.{mi}");
            }
            (None, Some(e)) => {
                let _ = writeln!(s, "  driver: {e}");
            }
            (None, None) => {}
        }
        if self.find("cuda").is_some() {
            let _ = writeln!(s, "CUDA devices: {}", self.devices.len());
            for d in &self.devices {
                let _ = writeln!(
                    s,
                    "  cuda {}: {} ({:.1} GiB, compute {}.{}, PCI {})",
                    d.ordinal,
                    d.name,
                    d.memory_bytes as f64 / (1u64 << 30) as f64,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.pci_bus_id
                );
            }
        }
        match self.usable() {
            Ok(()) if !self.devices.is_empty() => {
                s.push_str("GPU actors: available (`device` auto uses them)\n")
            }
            Ok(()) => s.push_str("GPU actors: unavailable: no device visible\n"),
            Err(e) => {
                let _ = writeln!(s, "GPU actors: unavailable: {e}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library that loads under its soname only is reported with its path and the name
    /// to link it as (NCCL's case; zlib, present wherever rankwise builds, stands in).
    #[test]
    fn a_library_under_its_soname_only_gets_a_hint_with_its_path() {
        let hint = soname_hint("libz.so.1", "libz.so").expect("zlib loads as libz.so.1");
        assert!(hint.contains("/libz.so.1 loads"), "{hint}");
        assert!(hint.contains("link it as libz.so"), "{hint}");
        assert_eq!(
            soname_hint("librankwise-none.so.7", "librankwise-none.so"),
            None
        );
    }

    #[test]
    fn every_missing_library_is_listed_with_the_names_searched() {
        let libs = probe();
        let text = libs.summary();
        for l in &libs.libraries {
            assert!(text.contains(&format!("  {:<9} ", l.name)), "{text}");
            if l.found.is_none() {
                assert!(text.contains(&l.searched.join(" ")), "{text}");
            }
        }
    }
}
