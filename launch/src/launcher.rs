//! Launcher detection and rank → device binding.
//!
//! A process started by `mpirun` (Open MPI), `srun` (Slurm), a PMIx server or a PMI
//! launcher (MPICH's Hydra, Intel MPI) learns its rank, the world size and its place on the
//! node from environment variables. [`LaunchInfo::detect`] reads them; with no launcher at
//! all rankwise runs as one process (the embedded default).
//!
//! Each rank then takes one device by its local rank ([`bind_device`]): a GPU when GPUs are
//! visible (local rank modulo the number of visible GPUs), else a CPU NUMA domain (local rank
//! modulo the number of domains).
//!
//! Inside a Slurm allocation (under `srun`, under `mpirun` in a batch script, or in the batch
//! script itself) the job id, step, CPUs and memory Slurm granted are read as well:
//! [`LaunchInfo::memory_limit`] turns `SLURM_MEM_PER_CPU` or `SLURM_MEM_PER_NODE` into the
//! memory one rank may use, from which the default memory budget is taken, since nothing else
//! tells a process on a shared node how much of it is its own.

use std::fmt;

/// Which launcher started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Launcher {
    /// No launcher: a plain process (inside a Slurm batch script without `srun` too).
    None,
    /// Open MPI's `mpirun`/`mpiexec` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Slurm's `srun` (`SLURM_PROCID` and `SLURM_STEP_ID`).
    Slurm,
    /// A PMIx server other than the two above (`PMIX_RANK`), e.g. PRRTE's `prterun`.
    Pmix,
    /// A PMI-1/PMI-2 launcher (`PMI_RANK`), e.g. MPICH's Hydra or Intel MPI.
    Pmi,
}

impl Launcher {
    /// Short lowercase name for reports: `none`, `openmpi`, `slurm`, `pmix`, `pmi`.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::None => "none",
            Launcher::OpenMpi => "openmpi",
            Launcher::Slurm => "slurm",
            Launcher::Pmix => "pmix",
            Launcher::Pmi => "pmi",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors of the strict readers ([`LaunchInfo::try_detect`], [`LaunchInfo::try_from_env`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// A launcher variable is set but does not hold what it should.
    #[error("environment variable {name}={value:?} is not {expected}")]
    Malformed {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What was expected, e.g. "a non-negative integer".
        expected: &'static str,
    },
    /// The launcher's numbers contradict each other.
    #[error("the {launcher} launcher says {what} is {index}, but there are only {count}")]
    Inconsistent {
        /// The launcher.
        launcher: Launcher,
        /// `rank` or `local rank`.
        what: &'static str,
        /// The index it gave.
        index: usize,
        /// The count it gave.
        count: usize,
    },
}

/// What the launcher told this process. Fields a launcher does not provide are `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// The launcher that started this process.
    pub launcher: Launcher,
    /// Rank in the job, `0..size`.
    pub rank: Option<usize>,
    /// Number of ranks in the job.
    pub size: Option<usize>,
    /// Rank among the ranks on this node, `0..local_size`.
    pub local_rank: Option<usize>,
    /// Number of ranks on this node.
    pub local_size: Option<usize>,
    /// Slurm job id (`SLURM_JOB_ID`), also under `mpirun` inside an allocation.
    pub job_id: Option<String>,
    /// Slurm job step (`SLURM_STEP_ID`), set under `srun`; a batch script itself has none.
    pub step_id: Option<String>,
    /// CPUs Slurm gave each task (`SLURM_CPUS_PER_TASK`).
    pub cpus_per_task: Option<usize>,
    /// CPUs the Slurm job has on this node (`SLURM_CPUS_ON_NODE`).
    pub cpus_on_node: Option<usize>,
    /// Memory per allocated CPU in bytes (`SLURM_MEM_PER_CPU`, given in MiB: `--mem-per-cpu`).
    pub mem_per_cpu: Option<u64>,
    /// Memory per node in bytes (`SLURM_MEM_PER_NODE`, given in MiB: `--mem`); 0 means all
    /// of the node's memory.
    pub mem_per_node: Option<u64>,
    /// GPUs this process may use, as listed by `CUDA_VISIBLE_DEVICES` (indices or UUIDs), or
    /// else by Slurm (`SLURM_STEP_GPUS`, `SLURM_JOB_GPUS`). `Some(vec![])` means the list is
    /// set and empty: no GPU at all. `None` means nobody restricted the GPUs.
    pub visible_gpus: Option<Vec<String>>,
}

impl Default for LaunchInfo {
    fn default() -> Self {
        LaunchInfo {
            launcher: Launcher::None,
            rank: None,
            size: None,
            local_rank: None,
            local_size: None,
            job_id: None,
            step_id: None,
            cpus_per_task: None,
            cpus_on_node: None,
            mem_per_cpu: None,
            mem_per_node: None,
            visible_gpus: None,
        }
    }
}

/// The memory a rank may use by its Slurm allocation, and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes for this rank.
    pub bytes: u64,
    /// How it was derived, e.g. `SLURM_MEM_PER_NODE 4096 MiB / 2 ranks on the node`.
    pub from: String,
}

/// Which device a rank drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceBinding {
    /// A GPU, by index among the visible GPUs (the CUDA device ordinal).
    Gpu(usize),
    /// A CPU NUMA domain, by index among the node's domains.
    Numa(usize),
}

/// Chooses this rank's device from its local rank: GPU `local_rank % gpus` when `gpus > 0`,
/// else NUMA domain `local_rank % numa_domains` (a node has at least one domain, so 0 is
/// taken as 1).
pub fn bind_device(local_rank: usize, gpus: usize, numa_domains: usize) -> DeviceBinding {
    if gpus > 0 {
        DeviceBinding::Gpu(local_rank % gpus)
    } else {
        DeviceBinding::Numa(local_rank % numa_domains.max(1))
    }
}

impl LaunchInfo {
    /// Reads this process's environment; malformed values count as absent (see
    /// [`LaunchInfo::try_detect`] for the strict reading).
    pub fn detect() -> LaunchInfo {
        LaunchInfo::from_env(|name| std::env::var(name).ok())
    }

    /// Like [`LaunchInfo::detect`], but a malformed or inconsistent value is an error.
    pub fn try_detect() -> Result<LaunchInfo, LaunchError> {
        LaunchInfo::try_from_env(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `get` (for tests: a map instead of the environment);
    /// malformed values count as absent.
    pub fn from_env<F>(get: F) -> LaunchInfo
    where
        F: Fn(&str) -> Option<String>,
    {
        read(&Env { get, strict: false }).expect("lenient reading never fails")
    }

    /// Like [`LaunchInfo::from_env`], but a malformed or inconsistent value is an error.
    pub fn try_from_env<F>(get: F) -> Result<LaunchInfo, LaunchError>
    where
        F: Fn(&str) -> Option<String>,
    {
        let info = read(&Env { get, strict: true })?;
        info.check()?;
        Ok(info)
    }

    /// True when a launcher started this process (it is one rank of a job, even a job of
    /// one rank).
    pub fn under_launcher(&self) -> bool {
        self.launcher != Launcher::None
    }

    /// Errors when rank ≥ size or local rank ≥ local size.
    pub fn check(&self) -> Result<(), LaunchError> {
        let pairs = [
            ("rank", self.rank, self.size),
            ("local rank", self.local_rank, self.local_size),
        ];
        for (what, index, count) in pairs {
            if let (Some(index), Some(count)) = (index, count) {
                if index >= count {
                    return Err(LaunchError::Inconsistent {
                        launcher: self.launcher,
                        what,
                        index,
                        count,
                    });
                }
            }
        }
        Ok(())
    }

    /// The memory this rank may use by its Slurm allocation: `SLURM_MEM_PER_CPU` times the
    /// rank's CPUs (`SLURM_CPUS_PER_TASK`, else the job's CPUs on the node shared by the ranks
    /// there, else one), or `SLURM_MEM_PER_NODE` shared by the ranks on the node. `None`
    /// outside Slurm, when the job asked for no memory, or for `--mem=0` (the whole node).
    pub fn memory_limit(&self) -> Option<MemoryLimit> {
        const MIB: u64 = 1 << 20;
        let ranks = self.local_size.unwrap_or(1).max(1);
        if let Some(per_cpu) = self.mem_per_cpu.filter(|&m| m > 0) {
            // The rank's CPUs, and what the count is.
            let (cpus, what) = match (self.cpus_per_task, self.cpus_on_node) {
                (Some(c), _) => (c, "per task".to_string()),
                (None, Some(c)) if ranks > 1 => (
                    c / ranks,
                    format!("of the {c} on the node shared by {ranks} ranks"),
                ),
                (None, Some(c)) => (c, "on the node".to_string()),
                // A task gets one CPU unless it asks for more.
                (None, None) => (1, "by default".to_string()),
            };
            let cpus = cpus.max(1);
            let noun = if cpus == 1 { "CPU" } else { "CPUs" };
            return Some(MemoryLimit {
                bytes: per_cpu * cpus as u64,
                from: format!(
                    "SLURM_MEM_PER_CPU {} MiB × {cpus} {noun} {what}",
                    per_cpu / MIB
                ),
            });
        }
        let per_node = self.mem_per_node.filter(|&m| m > 0)?;
        Some(MemoryLimit {
            bytes: per_node / ranks as u64,
            from: if ranks > 1 {
                format!(
                    "SLURM_MEM_PER_NODE {} MiB / {ranks} ranks on the node",
                    per_node / MIB
                )
            } else {
                format!("SLURM_MEM_PER_NODE {} MiB", per_node / MIB)
            },
        })
    }

    /// True inside a Slurm job (a batch script, `srun`, or `mpirun` in an allocation).
    pub fn in_slurm_job(&self) -> bool {
        self.job_id.is_some()
    }

    /// What this rank understood of its launcher and allocation, for the run reports.
    pub fn to_json(&self) -> serde_json::Value {
        let limit = self.memory_limit();
        serde_json::json!({
            "launcher": self.launcher.name(),
            "rank": self.rank,
            "size": self.size,
            "local_rank": self.local_rank,
            "local_size": self.local_size,
            "job_id": self.job_id,
            "step_id": self.step_id,
            "cpus_per_task": self.cpus_per_task,
            "cpus_on_node": self.cpus_on_node,
            "mem_per_cpu_bytes": self.mem_per_cpu,
            "mem_per_node_bytes": self.mem_per_node,
            "memory_limit_bytes": limit.as_ref().map(|l| l.bytes),
            "memory_limit_from": limit.map(|l| l.from),
            "visible_gpus": self.visible_gpus,
        })
    }

    /// This rank's device: [`bind_device`] with the local rank (0 when unknown), the number
    /// of visible GPUs (the `CUDA_VISIBLE_DEVICES` list when set, else `detected_gpus`, the
    /// GPUs the node has) and the node's NUMA domains.
    pub fn device(&self, detected_gpus: usize, numa_domains: usize) -> DeviceBinding {
        let gpus = self
            .visible_gpus
            .as_ref()
            .map_or(detected_gpus, |list| list.len());
        bind_device(self.local_rank.unwrap_or(0), gpus, numa_domains)
    }
}

struct Env<F> {
    get: F,
    strict: bool,
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// The variable, unless unset or blank.
    fn text(&self, name: &str) -> Option<String> {
        (self.get)(name).filter(|v| !v.trim().is_empty())
    }

    fn has(&self, name: &str) -> bool {
        self.text(name).is_some()
    }

    fn malformed(&self, name: &str, value: &str, expected: &'static str) -> LaunchError {
        LaunchError::Malformed {
            name: name.into(),
            value: value.into(),
            expected,
        }
    }

    fn num(&self, name: &str) -> Result<Option<usize>, LaunchError> {
        let Some(value) = self.text(name) else {
            return Ok(None);
        };
        match value.trim().parse::<usize>() {
            Ok(n) => Ok(Some(n)),
            Err(_) if self.strict => Err(self.malformed(name, &value, "a non-negative integer")),
            Err(_) => Ok(None),
        }
    }

    /// A Slurm memory size in bytes: Slurm gives these in MiB, as a plain integer.
    fn mebibytes(&self, name: &str) -> Result<Option<u64>, LaunchError> {
        let Some(value) = self.text(name) else {
            return Ok(None);
        };
        match value
            .trim()
            .parse::<u64>()
            .ok()
            .and_then(|m| m.checked_mul(1 << 20))
        {
            Some(bytes) => Ok(Some(bytes)),
            None if self.strict => Err(self.malformed(name, &value, "a number of MiB")),
            None => Ok(None),
        }
    }

    /// The first of `names` that is set (and well formed, when lenient).
    fn first_num(&self, names: &[&str]) -> Result<Option<usize>, LaunchError> {
        for name in names {
            if let Some(n) = self.num(name)? {
                return Ok(Some(n));
            }
        }
        Ok(None)
    }

    /// Tasks on this node from a Slurm list such as `2(x3),1`, indexed by `SLURM_NODEID`.
    fn slurm_tasks_per_node(&self, name: &str) -> Result<Option<usize>, LaunchError> {
        let Some(value) = self.text(name) else {
            return Ok(None);
        };
        let Some(counts) = parse_slurm_counts(&value) else {
            return if self.strict {
                Err(self.malformed(name, &value, "a Slurm count list such as 2(x3),1"))
            } else {
                Ok(None)
            };
        };
        let node = self.num("SLURM_NODEID")?;
        Ok(match node {
            Some(i) => counts.get(i).copied(),
            // Without a node index the answer is only certain when all nodes agree.
            None if counts.windows(2).all(|w| w[0] == w[1]) => counts.first().copied(),
            None => None,
        })
    }

    fn gpu_list(&self, name: &str) -> Option<Vec<String>> {
        // Set but empty means "no GPU", so do not use `text` here.
        let value = (self.get)(name)?;
        let value = value.trim();
        // Slurm's marker for "no GPUs allocated"; also CUDA's documented "-1".
        if value == "NoDevFiles" || value == "-1" {
            return Some(Vec::new());
        }
        Some(
            value
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
        )
    }
}

/// Expands Slurm's compressed count lists: `2(x3),1` → `[2, 2, 2, 1]`.
fn parse_slurm_counts(text: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        let (count, repeat) = match part.split_once('(') {
            Some((count, rest)) => {
                let repeat = rest.strip_prefix('x')?.strip_suffix(')')?;
                (count, repeat.parse::<usize>().ok()?)
            }
            None => (part, 1),
        };
        let count = count.parse::<usize>().ok()?;
        if repeat > 1 << 20 {
            return None;
        }
        out.extend(std::iter::repeat_n(count, repeat));
    }
    (!out.is_empty()).then_some(out)
}

fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<LaunchInfo, LaunchError> {
    let mut info = LaunchInfo {
        job_id: env.text("SLURM_JOB_ID").or_else(|| env.text("SLURM_JOBID")),
        step_id: env
            .text("SLURM_STEP_ID")
            .or_else(|| env.text("SLURM_STEPID")),
        cpus_per_task: env.num("SLURM_CPUS_PER_TASK")?,
        cpus_on_node: env.num("SLURM_CPUS_ON_NODE")?,
        mem_per_cpu: env.mebibytes("SLURM_MEM_PER_CPU")?,
        mem_per_node: env.mebibytes("SLURM_MEM_PER_NODE")?,
        visible_gpus: env
            .gpu_list("CUDA_VISIBLE_DEVICES")
            .or_else(|| env.gpu_list("SLURM_STEP_GPUS"))
            .or_else(|| env.gpu_list("SLURM_JOB_GPUS")),
        ..LaunchInfo::default()
    };
    // Hydra and Intel MPI name the node-local numbers this way; PMI itself does not.
    let hydra_local = |info: &mut LaunchInfo| -> Result<(), LaunchError> {
        info.local_rank = env.num("MPI_LOCALRANKID")?;
        info.local_size = env.num("MPI_LOCALNRANKS")?;
        Ok(())
    };

    if env.has("OMPI_COMM_WORLD_RANK") {
        // mpirun first: inside a Slurm allocation the SLURM_* variables describe the
        // allocation, not this launch.
        info.launcher = Launcher::OpenMpi;
        info.rank = env.num("OMPI_COMM_WORLD_RANK")?;
        info.size = env.num("OMPI_COMM_WORLD_SIZE")?;
        info.local_rank = env.num("OMPI_COMM_WORLD_LOCAL_RANK")?;
        info.local_size = env.num("OMPI_COMM_WORLD_LOCAL_SIZE")?;
    } else if env.has("SLURM_PROCID") && (env.has("SLURM_STEP_ID") || env.has("SLURM_STEPID")) {
        // A batch script also has SLURM_PROCID=0, but no step: that is not a launch.
        info.launcher = Launcher::Slurm;
        info.rank = env.num("SLURM_PROCID")?;
        info.size = env.first_num(&["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"])?;
        info.local_rank = env.num("SLURM_LOCALID")?;
        info.local_size = match env.slurm_tasks_per_node("SLURM_STEP_TASKS_PER_NODE")? {
            Some(n) => Some(n),
            None => match env.slurm_tasks_per_node("SLURM_TASKS_PER_NODE")? {
                Some(n) => Some(n),
                None => env.num("SLURM_NTASKS_PER_NODE")?,
            },
        };
    } else if env.has("PMIX_RANK") {
        info.launcher = Launcher::Pmix;
        info.rank = env.num("PMIX_RANK")?;
        hydra_local(&mut info)?;
    } else if env.has("PMI_RANK") {
        info.launcher = Launcher::Pmi;
        info.rank = env.num("PMI_RANK")?;
        info.size = env.num("PMI_SIZE")?;
        hydra_local(&mut info)?;
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn no_launcher() {
        let info = LaunchInfo::from_env(env(&[("HOME", "/root")]));
        assert_eq!(info, LaunchInfo::default());
        assert!(!info.under_launcher());
        assert_eq!(info.device(0, 2), DeviceBinding::Numa(0));
    }

    #[test]
    fn open_mpi() {
        let info = LaunchInfo::from_env(env(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("PMIX_RANK", "5"),
        ]));
        assert_eq!(info.launcher, Launcher::OpenMpi);
        assert_eq!(
            (info.rank, info.size, info.local_rank, info.local_size),
            (Some(5), Some(8), Some(1), Some(4))
        );
        assert!(info.under_launcher());
        assert_eq!(info.launcher.to_string(), "openmpi");
    }

    #[test]
    fn open_mpi_inside_a_slurm_allocation() {
        let info = LaunchInfo::from_env(env(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_CPUS_PER_TASK", "16"),
        ]));
        assert_eq!(info.launcher, Launcher::OpenMpi);
        assert_eq!((info.rank, info.size), (Some(3), Some(4)));
        assert_eq!(info.job_id.as_deref(), Some("4242"));
        assert_eq!(info.cpus_per_task, Some(16));
    }

    #[test]
    fn srun() {
        let info = LaunchInfo::from_env(env(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "7"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_NODEID", "2"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2),3"),
            ("SLURM_TASKS_PER_NODE", "4(x2)"),
            ("SLURM_JOB_ID", "99"),
            ("SLURM_CPUS_PER_TASK", "8"),
            ("SLURM_STEP_GPUS", "0,1,2,3"),
            ("PMIX_RANK", "6"),
        ]));
        assert_eq!(info.launcher, Launcher::Slurm);
        assert_eq!(
            (info.rank, info.size, info.local_rank, info.local_size),
            (Some(6), Some(7), Some(2), Some(3))
        );
        assert_eq!(info.job_id.as_deref(), Some("99"));
        assert_eq!(info.cpus_per_task, Some(8));
        assert_eq!(
            info.visible_gpus,
            Some(vec!["0".into(), "1".into(), "2".into(), "3".into()])
        );
        assert_eq!(info.device(8, 2), DeviceBinding::Gpu(2));
    }

    #[test]
    fn srun_local_size_fallbacks() {
        let base = [
            ("SLURM_PROCID", "1"),
            ("SLURM_STEPID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = base.to_vec();
            pairs.extend_from_slice(extra);
            LaunchInfo::from_env(env(&pairs))
        };
        // Uniform list, no node id needed.
        let info = with(&[("SLURM_TASKS_PER_NODE", "2(x2)")]);
        assert_eq!((info.size, info.local_size), (Some(4), Some(2)));
        // Uneven list without a node id: unknown.
        assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "3,1")]).local_size, None);
        assert_eq!(
            with(&[("SLURM_TASKS_PER_NODE", "3,1"), ("SLURM_NODEID", "1")]).local_size,
            Some(1)
        );
        // --ntasks-per-node.
        assert_eq!(with(&[("SLURM_NTASKS_PER_NODE", "2")]).local_size, Some(2));
    }

    #[test]
    fn batch_script_without_srun_is_not_a_launch() {
        let info = LaunchInfo::from_env(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_JOB_ID", "7"),
        ]));
        assert_eq!(info.launcher, Launcher::None);
        assert!(!info.under_launcher());
        assert_eq!((info.rank, info.size), (None, None));
        assert_eq!(info.job_id.as_deref(), Some("7"));
    }

    #[test]
    fn slurm_memory_limits() {
        const MIB: u64 = 1 << 20;
        let srun = [
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_JOB_ID", "31"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = srun.to_vec();
            pairs.extend_from_slice(extra);
            LaunchInfo::try_from_env(env(&pairs)).unwrap()
        };
        // --mem: the node's memory shared by the ranks on it.
        let info = with(&[("SLURM_MEM_PER_NODE", "4096")]);
        assert_eq!(info.mem_per_node, Some(4096 * MIB));
        let limit = info.memory_limit().unwrap();
        assert_eq!(limit.bytes, 2048 * MIB);
        assert_eq!(
            limit.from,
            "SLURM_MEM_PER_NODE 4096 MiB / 2 ranks on the node"
        );
        // --mem-per-cpu with --cpus-per-task.
        let info = with(&[("SLURM_MEM_PER_CPU", "1000"), ("SLURM_CPUS_PER_TASK", "3")]);
        assert_eq!(info.memory_limit().unwrap().bytes, 3000 * MIB);
        // --mem-per-cpu without it: the node's CPUs shared by its ranks.
        let info = with(&[("SLURM_MEM_PER_CPU", "1000"), ("SLURM_CPUS_ON_NODE", "6")]);
        let limit = info.memory_limit().unwrap();
        assert_eq!(limit.bytes, 3000 * MIB);
        assert!(limit.from.contains("shared by 2 ranks"), "{}", limit.from);
        assert_eq!(
            with(&[("SLURM_MEM_PER_CPU", "1000")])
                .memory_limit()
                .unwrap()
                .bytes,
            1000 * MIB
        );
        // --mem=0 is the whole node: no limit of the job's own.
        assert_eq!(with(&[("SLURM_MEM_PER_NODE", "0")]).memory_limit(), None);
        assert_eq!(with(&[]).memory_limit(), None);
        // A batch script (no step): one process with the job's memory on the node.
        let info = LaunchInfo::from_env(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_JOB_ID", "31"),
            ("SLURM_MEM_PER_NODE", "4096"),
        ]));
        assert_eq!(info.launcher, Launcher::None);
        assert!(info.in_slurm_job());
        assert_eq!(info.step_id, None);
        assert_eq!(info.memory_limit().unwrap().bytes, 4096 * MIB);
        // Slurm writes MiB as plain integers; anything else is malformed.
        let err = LaunchInfo::try_from_env(env(&[("SLURM_MEM_PER_NODE", "4G")])).unwrap_err();
        assert!(err.to_string().contains("a number of MiB"), "{err}");
        assert_eq!(
            LaunchInfo::from_env(env(&[("SLURM_MEM_PER_NODE", "4G")])).mem_per_node,
            None
        );
        let json = with(&[("SLURM_MEM_PER_NODE", "4096")]).to_json();
        assert_eq!(json["job_id"], "31");
        assert_eq!(json["step_id"], "0");
        assert_eq!(json["memory_limit_bytes"], 2048 * MIB);
        assert_eq!(json["launcher"], "slurm");
    }

    #[test]
    fn pmix_and_pmi() {
        let info = LaunchInfo::from_env(env(&[("PMIX_RANK", "2")]));
        assert_eq!(
            (info.launcher, info.rank, info.size),
            (Launcher::Pmix, Some(2), None)
        );

        let info = LaunchInfo::from_env(env(&[
            ("PMI_RANK", "3"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
        ]));
        assert_eq!(info.launcher, Launcher::Pmi);
        assert_eq!(
            (info.rank, info.size, info.local_rank, info.local_size),
            (Some(3), Some(4), Some(1), Some(2))
        );
        assert_eq!(info.launcher.name(), "pmi");
    }

    #[test]
    fn gpu_lists() {
        let gpus = |pairs: &[(&str, &str)]| LaunchInfo::from_env(env(pairs)).visible_gpus;
        assert_eq!(gpus(&[]), None);
        assert_eq!(gpus(&[("CUDA_VISIBLE_DEVICES", "")]), Some(vec![]));
        assert_eq!(
            gpus(&[("CUDA_VISIBLE_DEVICES", "NoDevFiles")]),
            Some(vec![])
        );
        assert_eq!(
            gpus(&[("CUDA_VISIBLE_DEVICES", "GPU-abc, 3")]),
            Some(vec!["GPU-abc".into(), "3".into()])
        );
        // CUDA_VISIBLE_DEVICES wins over Slurm's list.
        assert_eq!(
            gpus(&[("CUDA_VISIBLE_DEVICES", "1"), ("SLURM_STEP_GPUS", "0,1")]),
            Some(vec!["1".into()])
        );
        assert_eq!(
            gpus(&[("SLURM_JOB_GPUS", "2,3")]),
            Some(vec!["2".into(), "3".into()])
        );
        // An empty list hides the node's GPUs.
        let info = LaunchInfo::from_env(env(&[("CUDA_VISIBLE_DEVICES", "")]));
        assert_eq!(info.device(4, 2), DeviceBinding::Numa(0));
        // Nothing set: the detected GPUs count.
        let info = LaunchInfo::from_env(env(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
        ]));
        assert_eq!(info.device(4, 2), DeviceBinding::Gpu(1));
        assert_eq!(info.device(0, 2), DeviceBinding::Numa(1));
    }

    #[test]
    fn binding_by_local_rank() {
        assert_eq!(bind_device(0, 4, 2), DeviceBinding::Gpu(0));
        assert_eq!(bind_device(5, 4, 2), DeviceBinding::Gpu(1));
        assert_eq!(bind_device(3, 1, 2), DeviceBinding::Gpu(0));
        assert_eq!(bind_device(0, 0, 2), DeviceBinding::Numa(0));
        assert_eq!(bind_device(3, 0, 2), DeviceBinding::Numa(1));
        assert_eq!(bind_device(7, 0, 8), DeviceBinding::Numa(7));
        assert_eq!(bind_device(9, 0, 0), DeviceBinding::Numa(0));
        // Every local rank of a node gets a device, spread evenly.
        let mut per_gpu = [0; 3];
        for r in 0..9 {
            if let DeviceBinding::Gpu(g) = bind_device(r, 3, 2) {
                per_gpu[g] += 1;
            }
        }
        assert_eq!(per_gpu, [3, 3, 3]);
    }

    #[test]
    fn slurm_count_lists() {
        assert_eq!(parse_slurm_counts("4"), Some(vec![4]));
        assert_eq!(parse_slurm_counts("2(x3),1"), Some(vec![2, 2, 2, 1]));
        assert_eq!(parse_slurm_counts("1,2(x2)"), Some(vec![1, 2, 2]));
        assert_eq!(parse_slurm_counts(""), None);
        assert_eq!(parse_slurm_counts("2(3)"), None);
        assert_eq!(parse_slurm_counts("x"), None);
    }

    #[test]
    fn malformed_values_lenient_and_strict() {
        let pairs = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "four"),
        ];
        let info = LaunchInfo::from_env(env(&pairs));
        assert_eq!(
            (info.launcher, info.rank, info.size),
            (Launcher::OpenMpi, Some(1), None)
        );
        let err = LaunchInfo::try_from_env(env(&pairs)).unwrap_err();
        assert_eq!(
            err,
            LaunchError::Malformed {
                name: "OMPI_COMM_WORLD_SIZE".into(),
                value: "four".into(),
                expected: "a non-negative integer",
            }
        );
        assert!(err.to_string().contains("OMPI_COMM_WORLD_SIZE=\"four\""));

        let err = LaunchInfo::try_from_env(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_TASKS_PER_NODE", "2(y2)"),
        ]))
        .unwrap_err();
        assert!(matches!(err, LaunchError::Malformed { .. }), "{err}");
    }

    #[test]
    fn inconsistent_numbers_are_reported() {
        let pairs = [("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")];
        let err = LaunchInfo::try_from_env(env(&pairs)).unwrap_err();
        assert_eq!(
            err,
            LaunchError::Inconsistent {
                launcher: Launcher::OpenMpi,
                what: "rank",
                index: 4,
                count: 4
            }
        );
        assert_eq!(
            err.to_string(),
            "the openmpi launcher says rank is 4, but there are only 4"
        );
        let ok = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ];
        assert!(LaunchInfo::try_from_env(env(&ok)).is_ok());
    }

    #[test]
    fn detect_reads_the_process_environment() {
        // Whatever the environment of the test run, detection must not panic and must be
        // self-consistent with the lenient reading.
        let info = LaunchInfo::detect();
        assert_eq!(info, LaunchInfo::from_env(|n| std::env::var(n).ok()));
    }
}
