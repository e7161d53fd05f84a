//! Node topology: NUMA domains, their cores and memory, and GPUs, as seen by hwloc.
//!
//! [`Topology::detect`] asks hwloc (through the `hwlocality` crate) for the node's
//! NUMA domains and the PCI GPUs hanging off them. Only the cores this process may
//! run on are reported: the hwloc allowed cpuset (cgroups, `Cpus_allowed`) is
//! intersected with the process's current CPU binding (`taskset`, `mpirun
//! --bind-to`, `srun --cpu-bind`), and one PU (hardware thread) is taken per
//! physical core. If hwloc fails for any reason, a fallback topology of one domain
//! holding every CPU the process may use is returned instead (never a panic).
//!
//! [`bind_current_thread`] pins the calling thread to a set of OS PU indices.

use crate::budget::format_bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CStr;
use std::fmt::Write as _;

use hwlocality::bitmap::BitmapIndex;
use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Errors of topology discovery and thread binding.
#[derive(Debug, Error)]
pub enum TopologyError {
    /// hwloc could not build or query the node topology.
    #[error("hwloc topology discovery failed: {0}")]
    Hwloc(String),
    /// hwloc found no NUMA domain with a core this process is allowed to use.
    #[error("hwloc found no NUMA domain with a core this process may run on")]
    NoUsableCores,
    /// An empty core list was given to [`bind_current_thread`].
    #[error("cannot bind a thread to an empty set of cores")]
    EmptyCoreSet,
    /// A core index is too large to be a CPU index.
    #[error("core index {core} is out of range for CPU binding")]
    CoreOutOfRange {
        /// The offending OS PU index.
        core: usize,
    },
    /// The operating system (or hwloc) refused the binding.
    #[error("binding the current thread to cores {cores:?} failed: {reason}")]
    Bind {
        /// The OS PU indices that were requested.
        cores: Vec<usize>,
        /// Why the binding failed.
        reason: String,
    },
}

/// Where a [`Topology`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopologySource {
    /// Discovered by hwloc.
    Hwloc,
    /// hwloc failed: one domain with every CPU this process may use.
    Fallback,
}

/// One NUMA domain with the cores of it that this process may use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaDomain {
    /// hwloc logical index of the NUMA node (0-based, dense over the machine).
    pub index: usize,
    /// Operating-system index of the NUMA node (as in `/sys/devices/system/node/nodeN`).
    pub os_index: usize,
    /// OS indices of the PUs this process may run on in this domain, one PU per
    /// physical core, ascending. Pass them to [`bind_current_thread`].
    pub cores: Vec<usize>,
    /// Local memory of the domain in bytes (0 if unknown).
    pub memory_bytes: u64,
}

/// A GPU found on the PCI bus.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Position of the GPU in PCI bus id order (the order of
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`), 0-based.
    pub index: usize,
    /// Model name where a GPU backend reported one (e.g. "NVIDIA H100 80GB HBM3"),
    /// otherwise hwloc's OS device names (e.g. "cuda0, nvml0") or the PCI ids.
    pub name: String,
    /// PCI bus id, `dddd:bb:dd.f` in lower-case hex.
    pub pci_bus_id: String,
    /// hwloc logical index of the nearest NUMA domain (matches [`NumaDomain::index`]).
    pub numa: Option<usize>,
}

/// The node as this process sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// NUMA domains holding at least one core this process may use, by logical index.
    pub numa: Vec<NumaDomain>,
    /// GPUs on the PCI bus, in PCI bus id order.
    pub gpus: Vec<GpuInfo>,
    /// hwloc library version (e.g. "2.9.0"), or a note when hwloc was not used.
    pub hwloc_version: String,
    /// Whether hwloc or the fallback produced this topology.
    pub source: TopologySource,
    /// Whether this process was started bound to only part of the CPUs it may use (by
    /// `mpirun --bind-to`, `srun --cpu-bind`, `taskset`): the domains above hold only those.
    #[serde(default)]
    pub bound: bool,
}

/// PCI vendor id of NVIDIA.
const PCI_VENDOR_NVIDIA: u16 = 0x10de;
/// PCI vendor id of AMD/ATI GPUs.
const PCI_VENDOR_AMD: u16 = 0x1002;
/// PCI class "VGA compatible controller".
const PCI_CLASS_DISPLAY_VGA: u16 = 0x0300;
/// PCI class "3D controller" (compute GPUs without display).
const PCI_CLASS_DISPLAY_3D: u16 = 0x0302;
/// PCI class "Display controller" (other).
const PCI_CLASS_DISPLAY_OTHER: u16 = 0x0380;
/// Prefixes of hwloc OS device names that belong to GPU compute backends.
const GPU_BACKEND_PREFIXES: [&str; 5] = ["cuda", "nvml", "rsmi", "opencl", "ze"];

impl Topology {
    /// Discovers the node topology with hwloc, falling back to
    /// [`Topology::fallback`] if hwloc fails (or panics) for any reason.
    pub fn detect() -> Topology {
        match std::panic::catch_unwind(Self::detect_hwloc) {
            Ok(Ok(topology)) => topology,
            Ok(Err(_)) | Err(_) => Self::fallback(),
        }
    }

    /// Discovers the node topology with hwloc, returning why it failed instead of
    /// falling back. [`Topology::detect`] is the usual entry point.
    pub fn detect_hwloc() -> Result<Topology, TopologyError> {
        let hw = hwlocality::Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| TopologyError::Hwloc(e.to_string()))?
            .build()
            .map_err(|e| TopologyError::Hwloc(e.to_string()))?;
        Self::from_hwloc(&hw, true)
    }

    /// Builds the topology of another machine from an hwloc XML export (as written
    /// by `lstopo node.xml`), e.g. to plan for a node type other than this one.
    /// The XML's allowed cpuset is used; this process's binding is not applied.
    pub fn from_hwloc_xml(xml: &str) -> Result<Topology, TopologyError> {
        let result = std::panic::catch_unwind(|| {
            let hw = hwlocality::Topology::builder()
                .from_xml(xml)
                .map_err(|e| TopologyError::Hwloc(format!("reading hwloc XML: {e}")))?
                .with_io_type_filter(TypeFilter::KeepImportant)
                .map_err(|e| TopologyError::Hwloc(e.to_string()))?
                .build()
                .map_err(|e| TopologyError::Hwloc(format!("loading hwloc XML: {e}")))?;
            Self::from_hwloc(&hw, false)
        });
        result.unwrap_or_else(|_| Err(TopologyError::Hwloc("hwloc panicked".to_string())))
    }

    /// Extracts domains and GPUs from a loaded hwloc topology. `this_system`:
    /// the topology is the running machine, so the process binding applies.
    fn from_hwloc(hw: &hwlocality::Topology, this_system: bool) -> Result<Topology, TopologyError> {
        let hwloc_version = info_value(hw.root_object(), "hwlocVersion").unwrap_or_else(|| {
            let v = hwlocality::hwloc_api_version();
            format!("{}.{}.{} (API)", v >> 16, (v >> 8) & 0xff, v & 0xff)
        });

        // CPUs this process may use: allowed by the OS (cgroups) and by its binding.
        let mut usable: CpuSet = hw.allowed_cpuset().clone_target();
        let mut bound_to_part = false;
        if this_system {
            if let Ok(bound) = hw.cpu_binding(CpuBindingFlags::PROCESS) {
                let restricted = &usable & &bound;
                if !restricted.is_empty() {
                    bound_to_part = restricted != usable;
                    usable = restricted;
                }
            }
        }

        // One PU per core; machines without Core objects use PUs directly.
        let core_objects: Vec<&TopologyObject> = hw.objects_with_type(ObjectType::Core).collect();
        let unit_sets: Vec<CpuSet> = if core_objects.is_empty() {
            hw.objects_with_type(ObjectType::PU)
                .filter_map(|pu| pu.cpuset().map(|s| s.clone_target()))
                .collect()
        } else {
            core_objects
                .iter()
                .filter_map(|core| core.cpuset().map(|s| s.clone_target()))
                .collect()
        };

        let mut numa_objects: Vec<&TopologyObject> =
            hw.objects_with_type(ObjectType::NUMANode).collect();
        numa_objects.sort_by_key(|n| n.logical_index());

        let mut claimed: BTreeSet<usize> = BTreeSet::new();
        let mut numa = Vec::new();
        for node in &numa_objects {
            let Some(node_cpus) = node.cpuset() else {
                continue;
            };
            let node_usable = &usable & &*node_cpus;
            let mut cores = Vec::new();
            for unit in &unit_sets {
                let in_node = &node_usable & unit;
                // Memory-only nodes sharing the cpuset of a DRAM node (HBM, CXL) come
                // after it in logical order: a core belongs to its first domain only.
                if let Some(first) = in_node
                    .iter_set()
                    .map(usize::from)
                    .find(|pu| !claimed.contains(pu))
                {
                    cores.push(first);
                }
            }
            cores.sort_unstable();
            cores.dedup();
            claimed.extend(node_usable.iter_set().map(usize::from));
            if cores.is_empty() {
                continue;
            }
            let memory_bytes = match node.attributes() {
                Some(ObjectAttributes::NUMANode(attr)) => {
                    attr.local_memory().map_or(0, |m| m.get())
                }
                _ => node.total_memory(),
            };
            numa.push(NumaDomain {
                index: node.logical_index(),
                os_index: node.os_index().unwrap_or(node.logical_index()),
                cores,
                memory_bytes,
            });
        }
        if numa.is_empty() {
            return Err(TopologyError::NoUsableCores);
        }

        let os_to_logical: BTreeMap<usize, usize> = numa_objects
            .iter()
            .filter_map(|n| n.os_index().map(|os| (os, n.logical_index())))
            .collect();
        let gpus = find_gpus(hw, &os_to_logical);

        Ok(Topology {
            numa,
            gpus,
            hwloc_version,
            source: TopologySource::Hwloc,
            bound: bound_to_part,
        })
    }

    /// The topology used when hwloc is unavailable: one domain with every CPU
    /// this process may run on (its `sched_getaffinity` mask, or
    /// `0..available_parallelism` where that is unavailable), the total memory
    /// from `/proc/meminfo` and no GPUs.
    pub fn fallback() -> Topology {
        let affinity = current_affinity();
        let online = online_cpus();
        let bound = matches!((&affinity, online), (Some(a), Some(n)) if a.len() < n);
        let cores = affinity.unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n).collect()
        });
        Topology {
            bound,
            numa: vec![NumaDomain {
                index: 0,
                os_index: 0,
                cores,
                memory_bytes: meminfo_total_bytes().unwrap_or(0),
            }],
            gpus: Vec::new(),
            hwloc_version: "unavailable (fallback topology)".to_string(),
            source: TopologySource::Fallback,
        }
    }

    /// Total number of usable cores over all domains.
    pub fn total_cores(&self) -> usize {
        self.numa.iter().map(|d| d.cores.len()).sum()
    }

    /// Human-readable description for `rankwise info`: hwloc version, each NUMA
    /// domain with its cores and memory, and the GPUs (or "no GPUs").
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let source = match self.source {
            TopologySource::Hwloc => "hwloc",
            TopologySource::Fallback => "fallback, hwloc failed",
        };
        let _ = writeln!(s, "hwloc version: {} ({source})", self.hwloc_version);
        let _ = writeln!(
            s,
            "NUMA domains: {} with {} usable cores{}",
            self.numa.len(),
            self.total_cores(),
            if self.bound {
                " (this process was started bound to them: they are this rank's)"
            } else {
                ""
            }
        );
        for d in &self.numa {
            let _ = writeln!(
                s,
                "  domain {} (os {}): {} cores [{}], memory {}",
                d.index,
                d.os_index,
                d.cores.len(),
                format_ranges(&d.cores),
                format_bytes(d.memory_bytes)
            );
        }
        if self.gpus.is_empty() {
            let _ = writeln!(s, "GPUs: no GPUs");
        } else {
            let _ = writeln!(s, "GPUs: {}", self.gpus.len());
            for g in &self.gpus {
                let numa = g
                    .numa
                    .map_or_else(|| "unknown".to_string(), |n| n.to_string());
                let _ = writeln!(
                    s,
                    "  gpu {}: {} at {}, NUMA domain {numa}",
                    g.index, g.name, g.pci_bus_id
                );
            }
        }
        s
    }
}

/// Binds the calling thread to the given OS PU indices (e.g. [`NumaDomain::cores`]).
///
/// On Linux this is `sched_setaffinity` on the calling thread; elsewhere (or for
/// PU indices beyond `CPU_SETSIZE`) hwloc's `set_cpubind` with the THREAD flag.
/// Errors are returned, never panicked: callers may log them and run unpinned.
pub fn bind_current_thread(cores: &[usize]) -> Result<(), TopologyError> {
    if cores.is_empty() {
        return Err(TopologyError::EmptyCoreSet);
    }
    if let Some(&core) = cores.iter().find(|&&c| c > i32::MAX as usize) {
        return Err(TopologyError::CoreOutOfRange { core });
    }
    #[cfg(target_os = "linux")]
    {
        if cores.iter().all(|&c| c < libc::CPU_SETSIZE as usize) {
            return bind_sched_setaffinity(cores);
        }
    }
    bind_hwloc(cores)
}

/// Linux: `sched_setaffinity(0, ...)` binds the calling thread.
#[cfg(target_os = "linux")]
fn bind_sched_setaffinity(cores: &[usize]) -> Result<(), TopologyError> {
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cores {
        // SAFETY: c < CPU_SETSIZE was checked by the caller.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; the set pointer and size are valid.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(TopologyError::Bind {
            cores: cores.to_vec(),
            reason: std::io::Error::last_os_error().to_string(),
        })
    }
}

/// Portable binding through hwloc (builds a topology without I/O devices).
fn bind_hwloc(cores: &[usize]) -> Result<(), TopologyError> {
    let bind_err = |reason: String| TopologyError::Bind {
        cores: cores.to_vec(),
        reason,
    };
    let result = std::panic::catch_unwind(|| {
        let hw = hwlocality::Topology::new().map_err(|e| bind_err(e.to_string()))?;
        let mut set = CpuSet::new();
        for &c in cores {
            let idx: BitmapIndex = c
                .try_into()
                .map_err(|_| TopologyError::CoreOutOfRange { core: c })?;
            set.set(idx);
        }
        hw.bind_cpu(&set, CpuBindingFlags::THREAD)
            .map_err(|e| bind_err(e.to_string()))
    });
    result.unwrap_or_else(|_| Err(bind_err("hwloc panicked".to_string())))
}

/// The calling thread's CPU affinity mask as OS PU indices (Linux), if readable.
/// CPUs online on the node (whatever this process's affinity).
fn online_cpus() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        (n > 0).then_some(n as usize)
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

fn current_affinity() -> Option<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: pid 0 is the calling thread; the set pointer and size are valid.
        let rc =
            unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
        if rc != 0 {
            return None;
        }
        let cores: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            // SAFETY: i < CPU_SETSIZE.
            .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
            .collect();
        if cores.is_empty() {
            None
        } else {
            Some(cores)
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
fn meminfo_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_total(&text)
}

/// Parses the `MemTotal:  N kB` line of a `/proc/meminfo` text.
fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let factor = match parts.next() {
        Some("kB") | Some("KB") | Some("kb") => 1024,
        Some("MB") => 1024 * 1024,
        Some("GB") => 1024 * 1024 * 1024,
        None | Some("B") => 1,
        Some(_) => return None,
    };
    value.checked_mul(factor)
}

/// Value of the textual info `name` of a hwloc object.
fn info_value(obj: &TopologyObject, name: &str) -> Option<String> {
    obj.infos()
        .iter()
        .find(|i| i.name().to_bytes() == name.as_bytes())
        .map(|i| cstr_lossy(i.value()))
}

/// Lossy UTF-8 copy of a C string.
fn cstr_lossy(s: &CStr) -> String {
    s.to_string_lossy().into_owned()
}

/// GPUs: PCI devices with a GPU compute-backend OS device (CUDA, NVML, ROCm SMI,
/// OpenCL, Level Zero), or NVIDIA/AMD display-class devices. A BMC's VGA chip
/// (which gets a DRM `card0` OS device) is not a GPU.
fn find_gpus(hw: &hwlocality::Topology, os_to_logical: &BTreeMap<usize, usize>) -> Vec<GpuInfo> {
    let mut found: Vec<(String, GpuInfo)> = Vec::new();
    for pci in hw.pci_devices() {
        let Some(ObjectAttributes::PCIDevice(attr)) = pci.attributes() else {
            continue;
        };
        let mut backend_names = Vec::new();
        let mut model = None;
        for child in pci.io_children() {
            let is_gpu_dev = matches!(
                child.attributes(),
                Some(ObjectAttributes::OSDevice(osdev))
                    if matches!(osdev.device_type(), OSDeviceType::GPU | OSDeviceType::CoProcessor)
            );
            if !is_gpu_dev {
                continue;
            }
            let name = child.name().map(cstr_lossy).unwrap_or_default();
            if GPU_BACKEND_PREFIXES.iter().any(|p| name.starts_with(p)) {
                if model.is_none() {
                    model = info_value(child, "GPUModel");
                }
                backend_names.push(name);
            }
        }
        let class = attr.class_id();
        let vendor = attr.vendor_id();
        let display_class = matches!(
            class,
            PCI_CLASS_DISPLAY_VGA | PCI_CLASS_DISPLAY_3D | PCI_CLASS_DISPLAY_OTHER
        );
        let gpu_vendor = vendor == PCI_VENDOR_NVIDIA || vendor == PCI_VENDOR_AMD;
        if backend_names.is_empty() && !(gpu_vendor && display_class) {
            continue;
        }
        let pci_bus_id = format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            attr.domain(),
            attr.bus_id(),
            attr.bus_device(),
            attr.function()
        );
        let name = model
            .filter(|m| !m.is_empty())
            .map(|m| {
                if backend_names.is_empty() {
                    m
                } else {
                    format!("{m} ({})", backend_names.join(", "))
                }
            })
            .or_else(|| (!backend_names.is_empty()).then(|| backend_names.join(", ")))
            .unwrap_or_else(|| format!("PCI {vendor:04x}:{:04x}", attr.device_id()));
        let numa = pci
            .first_non_io_ancestor()
            .and_then(|a| a.nodeset())
            .and_then(|ns| ns.first_set())
            .and_then(|os| os_to_logical.get(&usize::from(os)).copied());
        found.push((
            pci_bus_id.clone(),
            GpuInfo {
                index: 0,
                name,
                pci_bus_id,
                numa,
            },
        ));
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
        .into_iter()
        .enumerate()
        .map(|(i, (_, mut g))| {
            g.index = i;
            g
        })
        .collect()
}

/// "0-3,8,10-11" style list of sorted indices.
fn format_ranges(v: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < v.len() {
        let start = v[i];
        let mut end = start;
        while i + 1 < v.len() && v[i + 1] == end + 1 {
            i += 1;
            end = v[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if end == start {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::format_bytes;

    fn max_cpu_index() -> usize {
        // OS PU indices may be sparse, but never beyond the configured CPU count.
        // SAFETY: sysconf has no preconditions.
        let conf = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        let avail = std::thread::available_parallelism().map_or(1, |n| n.get());
        usize::try_from(conf).unwrap_or(avail).max(avail)
    }

    #[test]
    fn topology_detect_finds_usable_cores() {
        let t = Topology::detect();
        println!("{}", t.summary());
        assert!(!t.numa.is_empty());
        let avail = std::thread::available_parallelism().map_or(1, |n| n.get());
        let limit = max_cpu_index();
        let mut all = Vec::new();
        for d in &t.numa {
            assert!(!d.cores.is_empty(), "domain {} has no cores", d.index);
            assert!(d.cores.windows(2).all(|w| w[0] < w[1]), "cores sorted");
            assert!(
                d.cores.iter().all(|&c| c < limit),
                "{:?} vs {limit}",
                d.cores
            );
            all.extend_from_slice(&d.cores);
        }
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a core appears in two domains");
        assert!(
            n >= 1 && n <= avail,
            "{n} cores, available_parallelism {avail}"
        );
    }

    #[test]
    fn topology_hwloc_works_here() {
        // hwloc is installed on the build machines; the fallback is for nodes
        // where it is broken.
        let t = Topology::detect_hwloc().expect("hwloc topology");
        assert_eq!(t.source, TopologySource::Hwloc);
        assert!(!t.hwloc_version.is_empty());
        assert!(t.numa.iter().all(|d| d.memory_bytes > 0));
        for (i, g) in t.gpus.iter().enumerate() {
            assert_eq!(g.index, i);
            assert_eq!(g.pci_bus_id.len(), 12, "{}", g.pci_bus_id);
        }
    }

    #[test]
    fn topology_fallback_is_sane() {
        let t = Topology::fallback();
        assert_eq!(t.source, TopologySource::Fallback);
        assert_eq!(t.numa.len(), 1);
        assert!(!t.numa[0].cores.is_empty());
        assert!(t.numa[0].memory_bytes > 0);
        assert!(t.summary().contains("no GPUs"));
    }

    #[test]
    fn topology_bind_current_thread_first_core() {
        let t = Topology::detect();
        let core = t.numa[0].cores[0];
        let got = std::thread::spawn(move || {
            bind_current_thread(&[core]).expect("bind");
            current_affinity().expect("sched_getaffinity")
        })
        .join()
        .expect("thread");
        assert_eq!(got, vec![core]);
    }

    #[test]
    fn topology_bind_rejects_bad_input() {
        std::thread::spawn(|| {
            assert!(matches!(
                bind_current_thread(&[]),
                Err(TopologyError::EmptyCoreSet)
            ));
            assert!(matches!(
                bind_current_thread(&[usize::MAX]),
                Err(TopologyError::CoreOutOfRange { .. })
            ));
            // A CPU that does not exist: an error, not a panic.
            assert!(bind_current_thread(&[1000]).is_err());
        })
        .join()
        .expect("thread");
    }

    /// Two packages of two 2-way SMT cores, an extra memory-only NUMA node sharing
    /// package 0's cpuset, a BMC VGA chip with a DRM device, an NVIDIA GPU known
    /// only by its PCI ids (package 0) and one with NVML/CUDA devices (package 1).
    const TWO_SOCKET_XML: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x000000ff" complete_cpuset="0x000000ff" allowed_cpuset="0x000000ff" nodeset="0x00000007" complete_nodeset="0x00000007" allowed_nodeset="0x00000007" gp_index="1">
    <info name="hwlocVersion" value="2.9.0"/>
    <object type="Package" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" nodeset="0x00000005" complete_nodeset="0x00000005" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="68719476736"/>
      <object type="NUMANode" os_index="2" cpuset="0x0000000f" complete_cpuset="0x0000000f" nodeset="0x00000004" complete_nodeset="0x00000004" gp_index="4" local_memory="17179869184"/>
      <object type="Core" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000005" complete_nodeset="0x00000005" gp_index="5">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000005" complete_nodeset="0x00000005" gp_index="6"/>
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000005" complete_nodeset="0x00000005" gp_index="7"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000005" complete_nodeset="0x00000005" gp_index="8">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000005" complete_nodeset="0x00000005" gp_index="9"/>
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000005" complete_nodeset="0x00000005" gp_index="10"/>
      </object>
      <object type="Bridge" gp_index="11" bridge_type="0-1" depth="0" bridge_pci="0000:[00-41]">
        <object type="PCIDev" gp_index="12" pci_busid="0000:02:00.0" pci_type="0300 [1a03:2000] [1a03:2000] 41" pci_link_speed="0.000000">
          <object type="OSDev" gp_index="13" name="card0" osdev_type="1"/>
        </object>
        <object type="PCIDev" gp_index="14" pci_busid="0000:41:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="31.500000"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x000000f0" complete_cpuset="0x000000f0" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="20">
      <object type="NUMANode" os_index="1" cpuset="0x000000f0" complete_cpuset="0x000000f0" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="21" local_memory="68719476736"/>
      <object type="Core" os_index="0" cpuset="0x00000030" complete_cpuset="0x00000030" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="22">
        <object type="PU" os_index="4" cpuset="0x00000010" complete_cpuset="0x00000010" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="23"/>
        <object type="PU" os_index="5" cpuset="0x00000020" complete_cpuset="0x00000020" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="24"/>
      </object>
      <object type="Core" os_index="1" cpuset="0x000000c0" complete_cpuset="0x000000c0" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="25">
        <object type="PU" os_index="6" cpuset="0x00000040" complete_cpuset="0x00000040" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="26"/>
        <object type="PU" os_index="7" cpuset="0x00000080" complete_cpuset="0x00000080" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="27"/>
      </object>
      <object type="Bridge" gp_index="30" bridge_type="0-1" depth="0" bridge_pci="0000:[80-81]">
        <object type="PCIDev" gp_index="31" pci_busid="0000:81:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="31.500000">
          <object type="OSDev" gp_index="32" name="nvml0" osdev_type="1">
            <info name="Backend" value="NVML"/>
            <info name="GPUModel" value="NVIDIA H100 80GB HBM3"/>
          </object>
          <object type="OSDev" gp_index="33" name="cuda0" osdev_type="5" subtype="CUDA">
            <info name="GPUModel" value="NVIDIA H100 80GB HBM3"/>
          </object>
        </object>
      </object>
    </object>
  </object>
</topology>
"#;

    #[test]
    fn topology_from_xml_two_sockets_with_gpus() {
        let t = Topology::from_hwloc_xml(TWO_SOCKET_XML).expect("xml topology");
        println!("{}", t.summary());
        assert_eq!(t.source, TopologySource::Hwloc);
        assert_eq!(t.hwloc_version, "2.9.0");
        // The memory-only node (os 2) shares package 0's cores and is left out.
        let os: Vec<usize> = t.numa.iter().map(|d| d.os_index).collect();
        assert_eq!(os, vec![0, 1]);
        assert_eq!(t.numa[0].cores, vec![0, 2], "one PU per core");
        assert_eq!(t.numa[1].cores, vec![4, 6]);
        assert_eq!(t.numa[0].memory_bytes, 64 << 30);
        // The BMC's VGA chip is not a GPU; the two NVIDIA devices are, in bus order.
        assert_eq!(t.gpus.len(), 2, "{:?}", t.gpus);
        assert_eq!(t.gpus[0].pci_bus_id, "0000:41:00.0");
        assert_eq!(t.gpus[0].name, "PCI 10de:2330");
        assert_eq!(t.gpus[0].numa, Some(t.numa[0].index));
        assert_eq!(t.gpus[1].pci_bus_id, "0000:81:00.0");
        assert_eq!(t.gpus[1].index, 1);
        assert!(
            t.gpus[1].name.starts_with("NVIDIA H100 80GB HBM3"),
            "{}",
            t.gpus[1].name
        );
        assert!(t.gpus[1].name.contains("cuda0"), "{}", t.gpus[1].name);
        assert_eq!(t.gpus[1].numa, Some(t.numa[1].index));
        let s = t.summary();
        assert!(s.contains("0000:81:00.0") && s.contains("64.0 GiB"), "{s}");
    }

    #[test]
    fn topology_from_bad_xml_is_an_error() {
        assert!(Topology::from_hwloc_xml("<not a topology").is_err());
    }

    #[test]
    fn topology_helpers() {
        assert_eq!(format_ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(format_ranges(&[]), "");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(
            parse_meminfo_total("MemFree: 1 kB\nMemTotal:       16318444 kB\n"),
            Some(16318444 * 1024)
        );
        assert_eq!(parse_meminfo_total("nothing"), None);
    }
}
