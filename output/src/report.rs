//! The run report: what `--json` prints and the result group's `report` attribute holds.
//!
//! One definition serves every command. [`RunReport`] carries the fields every report has:
//! the command, where and how it ran ([`RunInfo`], with the [`Provenance`] of the build and
//! the process), the wall time, and one [`RankReport`] per rank. The command's own figures
//! are its body (`B`), and each rank's work its `W`; both are flattened into the report, so
//! the JSON keeps one flat object per report and per rank.
//!
//! The ranks' figures cross to rank 0 as JSON of their own type
//! ([`RankReport::gather`]), so a field added to a command's `W` reaches the report
//! without positional encoding.

use std::time::SystemTime;

use rankwise_exec::{ChunkGrid, MemoryPlan, Placement, Runtime};
use rankwise_linalg::{
    CheckReport, Convergence, ErrorEstimate, GenotypeSummary, PhaseTiming, ProjectionReport,
    ReadTotals, RsvdOptions, RsvdResult, SvdResult,
};
use rankwise_transports::TransportError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A command's report: the common fields around the command's body `B`, with each rank's
/// work `W`.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport<B, W> {
    /// The command: `svd`, `rsvd`, `pca`, `gen`, …
    pub command: String,
    /// The command's own figures.
    #[serde(flatten)]
    pub body: B,
    /// Where and how the run ran.
    #[serde(flatten)]
    pub run: RunInfo,
    /// Wall seconds of the command on rank 0.
    pub seconds: f64,
    /// Every rank's figures, by rank.
    pub per_rank: Vec<RankReport<W>>,
}

/// Where and how a run ran: the same fields in every command's report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    /// The transport's name (`local`, `mpi`, `ucx`).
    pub transport: String,
    /// Ranks in the job.
    pub ranks: usize,
    /// Actors over all ranks.
    pub actors: usize,
    /// The launcher detected (`None`, `Mpirun`, `Srun`, …).
    pub launcher: String,
    /// The batch system's job id, if any.
    pub job_id: Option<String>,
    /// What this rank understood of its launcher and allocation.
    pub launch: serde_json::Value,
    /// The build and the process that produced the report.
    pub rankwise: Provenance,
}

/// Which build ran, how it was started and on which libraries: what a result needs to be
/// reproduced or compared.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Provenance {
    /// The crate version.
    pub version: String,
    /// The git commit the binary was built from (`unknown` outside a git checkout).
    pub revision: String,
    /// The command line, as the process received it.
    pub argv: Vec<String>,
    /// When the run started, UTC, RFC 3339 to the second.
    pub started: String,
    /// The BLAS library and the kernels it chose for this CPU.
    pub blas: String,
    /// The MPI library's own version text, when the run's transport is MPI's.
    pub mpi: Option<String>,
}

impl Provenance {
    /// This build and process, started at `started`, with the BLAS and MPI libraries given
    /// (the caller asks the libraries it linked).
    pub fn new(started: SystemTime, blas: String, mpi: Option<String>) -> Provenance {
        Provenance {
            version: env!("CARGO_PKG_VERSION").to_string(),
            revision: revision().to_string(),
            argv: std::env::args().collect(),
            started: humantime::format_rfc3339_seconds(started).to_string(),
            blas,
            mpi,
        }
    }
}

/// The git commit this crate was built from, or `unknown`.
pub fn revision() -> &'static str {
    env!("RANKWISE_REVISION")
}

/// One rank's figures: where it ran, its peak memory, and the command's work `W`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RankReport<W> {
    /// The rank.
    pub rank: usize,
    /// The host it ran on.
    pub hostname: String,
    /// Its actors' devices (`cpu numa0 cores 0,1`, …).
    pub actors: Vec<String>,
    /// Its peak resident set size, where the OS tells.
    pub peak_rss_bytes: Option<u64>,
    /// What its transport carried until the report was gathered: messages and bytes each
    /// way, and the seconds its receives waited (the phases give the same per phase).
    #[serde(default)]
    pub comm: rankwise_transports::CommCounts,
    /// The command's figures of this rank.
    #[serde(flatten)]
    pub work: W,
}

impl<W: Serialize + DeserializeOwned> RankReport<W> {
    /// This rank's report around `work`.
    pub fn own(rt: &Runtime, work: W) -> RankReport<W> {
        RankReport {
            rank: rt.rank(),
            hostname: hostname(),
            actors: rt.actors().iter().map(|a| a.spec().device()).collect(),
            peak_rss_bytes: peak_rss_bytes(),
            comm: rt.comm_counts(),
            work,
        }
    }

    /// Gathers every rank's report on rank 0 (a collective call): `Some` there, by rank,
    /// `None` on the others. A rank whose report cannot be read back is an error naming it.
    pub fn gather(rt: &Runtime, work: W) -> Result<Option<Vec<RankReport<W>>>, ReportError> {
        let comm = rt.comm();
        let own = serde_json::to_vec(&RankReport::own(rt, work))
            .map_err(|source| ReportError::Encode { source })?;
        let all = comm.gather_bytes(0, &own)?;
        comm.barrier()?;
        all.map(|all| {
            all.iter()
                .enumerate()
                .map(|(rank, bytes)| {
                    serde_json::from_slice(bytes)
                        .map_err(|source| ReportError::Decode { rank, source })
                })
                .collect()
        })
        .transpose()
    }
}

/// Why a report could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The transport failed while the reports were gathered.
    #[error(transparent)]
    Comm(#[from] TransportError),
    /// This rank's figures could not be encoded.
    #[error("encoding this rank's report: {source}")]
    Encode {
        /// The encoder's error.
        source: serde_json::Error,
    },
    /// A rank's figures could not be read back on rank 0.
    #[error("the report of rank {rank} could not be read: {source}")]
    Decode {
        /// The rank.
        rank: usize,
        /// The decoder's error.
        source: serde_json::Error,
    },
}

/// The body of a randomized SVD's or a PCA's report (`rsvd`, `pca`).
#[derive(Clone, Debug, Serialize)]
pub struct RsvdBody {
    /// The user's matrix shape (variants × samples for a PCA).
    pub shape: [u64; 2],
    /// How the matrix was given (path or generator), and its description.
    pub matrix: serde_json::Value,
    /// The source's description.
    pub source: String,
    /// The options that ran.
    pub options: RsvdOptions,
    /// Passes over the matrix.
    pub passes: usize,
    /// How each projection was formed.
    pub projections: Vec<ProjectionReport>,
    /// The largest cond(Y) a fused projection is used for.
    pub condition_limit: f64,
    /// Whether the problem was solved through the transpose.
    pub transposed: bool,
    /// The panels.
    pub grid: ChunkGrid,
    /// Which actor owns which panels.
    pub placement: Placement,
    /// Each actor's memory plan.
    pub memory: Vec<MemoryPlan>,
    /// The `k` singular values.
    pub singular_values: Vec<f64>,
    /// Per-component residuals and whether they met the tolerance.
    pub convergence: Convergence,
    /// Whether every component converged (`convergence.converged`, at the top for scripts).
    pub converged: bool,
    /// ‖A‖_F² (after standardization for genotypes).
    pub total_sum_squares: f64,
    /// The error estimate from the probes.
    pub error_estimate: Option<ErrorEstimate>,
    /// A PCA's genotype counts.
    pub genotypes: Option<GenotypeSummary>,
    /// A PCA's eigenvalues (PLINK's scale).
    pub eigenvalues: Option<Vec<f64>>,
    /// A PCA's σᵢ² / ‖X‖_F².
    pub explained_variance_ratio: Option<Vec<f64>>,
    /// Floating-point operations of the products with the thin matrices.
    pub gemm_flops: f64,
    /// The same per second of the run.
    pub gemm_gflop_per_s: f64,
    /// Each pass's rate against the machine's GEMM rate (`--machine-limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_limit: Option<MachineLimit>,
}

/// The machine limit of a run's passes: the GEMM rate every rank's compute threads reach
/// together (`rankwise_linalg::gemm_peak`), for the exact SVD and the randomized SVD of a
/// float matrix also the rate at which they produce the matrix's values
/// (`rankwise_linalg::production_peak`, `tile_production_peak`), and each pass's share of
/// the limit those rates make.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MachineLimit {
    /// The precision of the probe's GEMM (the run's tiles').
    pub precision: String,
    /// The probe's rate, all ranks together, in GFLOP/s: the machine's best, of the
    /// kernels the run's BLAS calls use and the others it can run.
    pub gemm_gflop_per_s: f64,
    /// The BLAS kernels that reached that rate (OpenBLAS's core name), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_kernels: Option<String>,
    /// The rate of the kernels the run's BLAS calls use, in GFLOP/s, where it is lower
    /// (`rankwise` pins OpenBLAS to layout-independent kernels on AVX-512 Intel CPUs, for
    /// results that do not depend on the rank count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_gemm_gflop_per_s: Option<f64>,
    /// The production probe's rate, all ranks together, in GB/s at 8 bytes a value, where
    /// the limit counts producing the matrix (`svd`, and `rsvd` of a float matrix: a pass
    /// produces the panels that are not resident and multiplies them by a few columns, and
    /// producing them costs about as much as the products).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub production_gb_per_s: Option<f64>,
    /// Rank 0's phases that multiply the matrix, with their rates.
    pub passes: Vec<PassShare>,
}

/// One phase's rate and its share of the machine limit.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PassShare {
    /// The phase's name, as in the phase timings.
    pub phase: String,
    /// Its wall time on rank 0, in seconds.
    pub seconds: f64,
    /// Its products' floating-point operations with the whole matrix.
    pub flops: f64,
    /// Their rate, in GFLOP/s.
    pub gflop_per_s: f64,
    /// Bytes of matrix values the phase produced, all ranks together, where the limit
    /// counts them ([`MachineLimit::production_gb_per_s`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub produced_bytes: Option<u64>,
    /// The phase's time at the machine's rates: its flops at the GEMM rate, and its bytes
    /// at the production rate where they count.
    #[serde(default)]
    pub limit_seconds: f64,
    /// The limit's time over the phase's (0–1); without production, the phase's GEMM rate
    /// over the machine's.
    pub share: f64,
}

impl MachineLimit {
    /// The limit for the phases `timings` (those with products), at a GEMM rate of
    /// `peak_flops` floating-point operations per second.
    pub fn of(timings: &[PhaseTiming], precision: &str, peak_flops: f64) -> MachineLimit {
        let passes = timings
            .iter()
            .filter_map(|t| {
                t.flop_rate().map(|rate| PassShare {
                    phase: t.phase.clone(),
                    seconds: t.seconds,
                    flops: t.flops,
                    gflop_per_s: rate / 1e9,
                    produced_bytes: None,
                    limit_seconds: t.flops / peak_flops,
                    share: rate / peak_flops,
                })
            })
            .collect();
        MachineLimit {
            precision: precision.to_string(),
            gemm_gflop_per_s: peak_flops / 1e9,
            production_gb_per_s: None,
            gemm_kernels: None,
            pinned_gemm_gflop_per_s: None,
            passes,
        }
    }

    /// The limit for the phases `timings` (rank 0's) that multiply or produce the matrix,
    /// at a GEMM rate of `peak_flops` floating-point operations per second and a
    /// production rate of `production` bytes per second; `produced` gives a phase's bytes
    /// produced on all ranks together.
    pub fn with_production(
        timings: &[PhaseTiming],
        produced: impl Fn(&str) -> u64,
        precision: &str,
        peak_flops: f64,
        production: f64,
    ) -> MachineLimit {
        let passes = timings
            .iter()
            .filter(|t| t.seconds > 0.0 && (t.flops > 0.0 || t.produced_bytes > 0))
            .map(|t| {
                let bytes = produced(&t.phase);
                let limit = t.flops / peak_flops + bytes as f64 / production;
                PassShare {
                    phase: t.phase.clone(),
                    seconds: t.seconds,
                    flops: t.flops,
                    gflop_per_s: t.flops / t.seconds / 1e9,
                    produced_bytes: Some(bytes),
                    limit_seconds: limit,
                    share: limit / t.seconds,
                }
            })
            .collect();
        MachineLimit {
            precision: precision.to_string(),
            gemm_gflop_per_s: peak_flops / 1e9,
            production_gb_per_s: Some(production / 1e9),
            gemm_kernels: None,
            pinned_gemm_gflop_per_s: None,
            passes,
        }
    }

    /// The limit with the name of the GEMM kernels that reached its rate and, where lower,
    /// the rate `pinned` (FLOP/s) of the kernels the run's BLAS calls use.
    pub fn with_kernels(mut self, kernels: String, pinned: Option<f64>) -> MachineLimit {
        self.gemm_kernels = Some(kernels);
        self.pinned_gemm_gflop_per_s = pinned.map(|p| p / 1e9);
        self
    }

    /// A phase's share, if it has one.
    pub fn share_of(&self, phase: &str) -> Option<&PassShare> {
        self.passes.iter().find(|p| p.phase == phase)
    }
}

/// The bytes of matrix values that phase `phase` produced on all ranks together, from
/// each rank's phases (what [`MachineLimit::with_production`] takes).
pub fn produced_on_all_ranks(ranks: &[&[PhaseTiming]], phase: &str) -> u64 {
    (ranks.iter())
        .flat_map(|r| r.iter().filter(|t| t.phase == phase))
        .map(|t| t.produced_bytes)
        .sum()
}

/// One rank's work in a randomized SVD or PCA.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RsvdWork {
    /// Bytes of matrix values produced from the source, all passes.
    pub bytes_produced: u64,
    /// What the rank read from storage.
    pub read: ReadTotals,
    /// Wall time of each phase.
    pub timings: Vec<PhaseTiming>,
    /// Panel passes computed on GPUs.
    pub gpu_panel_passes: u64,
    /// Bytes of stored panels staged to GPU memory.
    pub gpu_staged_bytes: u64,
    /// What the projections' sums went through across ranks.
    pub collectives: String,
    /// Panel QRs computed on GPUs.
    pub gpu_panel_qrs: u64,
    /// Where the device-produced panels' time went (all zero on CPU actors).
    pub gpu_seconds: rankwise_linalg::GpuPanelSeconds,
    /// What GPU actors decoded on their devices, and what fell back to the host.
    pub gpu_decode: Option<rankwise_linalg::DeviceDecodeReport>,
    /// Panel passes GPU actors computed from genotypes kept on the device as 2-bit codes,
    /// and the bytes kept.
    pub gpu_kept_passes: u64,
    /// Bytes of 2-bit codes kept on the GPUs.
    pub gpu_kept_bytes: u64,
    /// Why GPU actors computed on their CPU cores, when they did.
    pub gpu_note: Option<String>,
}

impl RsvdWork {
    /// This rank's work in `r`.
    pub fn of(r: &RsvdResult) -> RsvdWork {
        RsvdWork {
            bytes_produced: r.bytes_produced,
            read: r.read,
            timings: r.timings.clone(),
            gpu_panel_passes: r.gpu_panels,
            gpu_staged_bytes: r.gpu_staged_bytes,
            collectives: r.collectives.clone(),
            gpu_panel_qrs: r.gpu_qrs,
            gpu_seconds: r.gpu_seconds,
            gpu_decode: r.gpu_decode.clone(),
            gpu_kept_passes: r.gpu_kept.passes,
            gpu_kept_bytes: r.gpu_kept.bytes,
            gpu_note: r.gpu_note.clone(),
        }
    }
}

/// The body of an exact SVD's report (`svd`).
#[derive(Clone, Debug, Serialize)]
pub struct SvdBody {
    /// The user's matrix shape.
    pub shape: [u64; 2],
    /// How the matrix was given (path or generator), and its description.
    pub matrix: serde_json::Value,
    /// Whether the problem was solved through the transpose.
    pub transposed: bool,
    /// The panels.
    pub grid: ChunkGrid,
    /// Which actor owns which panels.
    pub placement: Placement,
    /// Each actor's memory plan.
    pub memory: Vec<MemoryPlan>,
    /// All `min(m, n)` singular values.
    pub singular_values: Vec<f64>,
    /// The accuracy checks, when asked for.
    pub check: Option<CheckReport>,
    /// Bytes of the matrix in f64.
    pub matrix_bytes: u64,
    /// The same per second of the run, in GB/s.
    pub matrix_gb_per_s: f64,
    /// Each pass's share of the machine limit (`--machine-limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_limit: Option<MachineLimit>,
}

/// One rank's work in an exact SVD.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SvdWork {
    /// Bytes of matrix values generated on the rank.
    pub bytes_generated: u64,
    /// Panel QRs computed on GPUs.
    pub gpu_panel_qrs: u64,
    /// Of those, panels the GPUs also generated.
    pub gpu_generated_panels: u64,
    /// Tree-node QRs computed on a GPU.
    pub gpu_node_qrs: u64,
    /// What the rank read from storage.
    pub read: ReadTotals,
    /// Wall time of each phase.
    pub timings: Vec<PhaseTiming>,
}

impl SvdWork {
    /// This rank's work in `r`.
    pub fn of(r: &SvdResult) -> SvdWork {
        SvdWork {
            bytes_generated: r.bytes_generated,
            gpu_panel_qrs: r.gpu_qrs,
            gpu_generated_panels: r.gpu_generated,
            gpu_node_qrs: r.gpu_node_qrs,
            read: r.read,
            timings: r.timings.clone(),
        }
    }
}

/// Peak resident set size of this process in bytes (VmHWM), if the OS tells.
pub fn peak_rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The host's name, or an empty string.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A runtime of one small actor on `comm`, for the crate's tests.
#[cfg(test)]
pub(crate) fn one_actor_runtime(comm: rankwise_transports::LocalComm) -> Runtime {
    let spec = rankwise_exec::ActorSpec {
        domain: 0,
        cores: vec![0],
        memory: 1 << 20,
        pin: false,
        gpu: None,
    };
    Runtime::new(Box::new(comm), vec![spec]).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
    struct Work {
        passes: usize,
        timings: Vec<(String, f64)>,
    }

    #[derive(Clone, Debug, Serialize)]
    struct Body {
        shape: [u64; 2],
        singular_values: Vec<f64>,
    }

    fn info() -> RunInfo {
        RunInfo {
            transport: "local".into(),
            ranks: 1,
            actors: 2,
            launcher: "None".into(),
            job_id: None,
            launch: serde_json::json!({"launcher": "none"}),
            rankwise: Provenance::new(SystemTime::UNIX_EPOCH, "OpenBLAS".into(), None),
        }
    }

    #[test]
    fn a_report_is_one_flat_object_with_the_common_fields() {
        let work = Work {
            passes: 7,
            timings: vec![("range".into(), 0.5)],
        };
        let report = RunReport {
            command: "rsvd".into(),
            body: Body {
                shape: [3, 2],
                singular_values: vec![2.0, 1.0],
            },
            run: info(),
            seconds: 1.5,
            per_rank: vec![RankReport {
                rank: 0,
                hostname: "h".into(),
                actors: vec!["cpu numa0 cores 0,1".into()],
                peak_rss_bytes: Some(42),
                comm: Default::default(),
                work: work.clone(),
            }],
        };
        let v = serde_json::to_value(&report).unwrap();
        for key in [
            "command",
            "shape",
            "singular_values",
            "transport",
            "ranks",
            "actors",
            "launcher",
            "job_id",
            "launch",
            "rankwise",
            "seconds",
            "per_rank",
        ] {
            assert!(v.get(key).is_some(), "{key} missing from {v}");
        }
        assert_eq!(v["rankwise"]["started"], "1970-01-01T00:00:00Z");
        assert_eq!(v["rankwise"]["version"], env!("CARGO_PKG_VERSION"));
        assert!(!v["rankwise"]["revision"].as_str().unwrap().is_empty());
        // A rank's report reads back as its own type, the work flattened beside the rank.
        let rank = &v["per_rank"][0];
        assert_eq!(rank["passes"], 7);
        assert_eq!(rank["peak_rss_bytes"], 42);
        let back: RankReport<Work> = serde_json::from_value(rank.clone()).unwrap();
        assert_eq!(back.work, work);
        assert_eq!(back.actors, ["cpu numa0 cores 0,1"]);
    }

    #[test]
    fn ranks_gather_their_own_reports_on_rank_zero() {
        let rt = one_actor_runtime(rankwise_transports::LocalWorld::create(1).remove(0));
        let work = Work {
            passes: 3,
            timings: vec![],
        };
        let all = RankReport::gather(&rt, work.clone()).unwrap().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].rank, 0);
        assert_eq!(all[0].work, work);
        assert_eq!(all[0].actors.len(), 1);
        assert!(all[0].peak_rss_bytes.is_some_and(|b| b > 0));
    }
}
