//! How many nodes, and how long: a model that sizes `svd`, `rsvd` and `pca` jobs on a
//! cluster this process is not running on.
//!
//! The model has two halves.
//!
//! * **The code's own plan.** The same planners that every run uses ([`SvdPlan`],
//!   [`RsvdPlan`]) are run over a described world of `nodes × ranks_per_node` ranks, each
//!   with its actors, cores and memory. They decide the placement of panels, what each
//!   actor keeps in memory, the passes over the matrix and the size of every message, so
//!   the prediction's memory per rank is the plan's, and its messages are those the run
//!   would send.
//! * **Rates measured on a machine** ([`calibrate`], `rankwise calibrate`): the seconds
//!   per matrix value of the exact SVD's two passes at several column counts, and of one
//!   randomized pass (dense and genotype operands) as a function of the sketch's columns,
//!   per core. A pass's compute time is that rate times the values on its critical path
//!   per core: the busiest rank's values over the cores it can use (at least one, a
//!   thread), or the busiest node's values over the node's cores, whichever is more. The
//!   second matters where ranks outnumber cores: a rank with fewer panels finishes early and
//!   leaves its core to the others (a node's scheduler shares the cores by work, not by
//!   rank).
//!
//! Communication follows the reduction tree of [`rankwise_linalg`]: a node of the tree
//! lives on the rank of its leftmost panel, so a rank receives from another rank once per
//! tree level above its own panels, and the critical path is the tree's height over the
//! ranks, `⌈log₂ P⌉` messages up and as many down. Levels inside a node (the first
//! `⌈log₂ R⌉` with `R` ranks per node, ranks placed node by node as `mpirun` and `srun`
//! place them) cost shared-memory time; the others cost the network's latency plus the
//! message over its bandwidth, and the round trips of the transport's protocol: past the
//! MPI library's eager limit ([`Network::eager_bytes`]) a message waits for the
//! receiver's clear-to-send, and over MPI a payload past [`MPI_INLINE_BYTES`] first waits
//! for the receiver's go-ahead ([`Transport`]). Compute and communication do not overlap
//! in the model (the tree waits for every panel of a pass), which is what the drivers do.
//!
//! Rates measured on GPU actors are per GPU ([`RateUnit::Gpu`]): a pass's values are then
//! divided among the GPUs of the busiest rank or node, one GPU actor per GPU.
//!
//! The exact SVD's tree also computes: each merge is the QR of two stacked `n × n` R
//! factors (and, on the way down, its products with the root's `U_R`), made on the rank
//! of the node while the actors wait, and the root's rank ends with the SVD of an `n × n`
//! R. The critical path is the root's rank's merges, those of its own panels' subtree and
//! one a level above it, each at the calibrated seconds of a merge at that width, and the
//! root's SVD. Both are `n³` work: negligible at tens of columns, a tenth of a run and
//! more at hundreds.
//!
//! LOBPCG's Rayleigh–Ritz step runs on the root rank between passes while every actor
//! waits: its products with `n × 3l` blocks (`n` the matrix's shorter side, the samples of
//! a PCA) on the root's cores, one thread per chunk of rows
//! ([`rankwise_linalg::rayleigh_ritz_threads`]). It costs the calibrated core-seconds per
//! sample and sketch column times `n·l`, over those threads, once a pass: it grows with the
//! samples and not with the variants or the nodes, so at biobank sample counts on many
//! nodes it is the cost that dominates.
//!
//! Storage reads count when [`Cluster::read_gbps`] is given: a pass over a stored matrix
//! is at most as fast as the node's storage bandwidth. The read-ahead overlaps a pass's
//! reads with its own compute, so each pass takes the slower of the two; panels kept in
//! memory are read in the first pass only. What the model leaves out, and says so in its
//! output: the variant QC pass of `pca`, and start-up.

use std::sync::Arc;
use std::time::Instant;

use rankwise_exec::{ActorKind, ActorShape, ChunkGrid, Runtime, World};
use rankwise_linalg::{RsvdOptions, RsvdPlan, RsvdProblem, SvdOptions, SvdPlan, SvdProblem};
use rankwise_sources::{Dist, Generated, GenotypeSource, PanelSource, SourceError};
use rankwise_transports::MPI_INLINE_BYTES;
use serde::{Deserialize, Serialize};

use crate::Error;

/// A link between nodes: bandwidth, latency, and the MPI library's eager limit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Gigabits per second one rank can use.
    pub gbps: f64,
    /// One-way latency of a message, seconds.
    pub latency: f64,
    /// Messages longer than this wait for the receiver's clear-to-send before their data
    /// goes (the rendezvous protocol): a round trip more. Open MPI's TCP transport starts
    /// it past 64 KiB (`btl_tcp_eager_limit`, the default here), its shared memory past 4
    /// KiB; UCX past its `UCX_RNDV_THRESH`.
    #[serde(default = "default_eager_bytes")]
    pub eager_bytes: u64,
}

/// Open MPI's `btl_tcp_eager_limit`.
const TCP_EAGER_BYTES: u64 = 64 << 10;

fn default_eager_bytes() -> u64 {
    TCP_EAGER_BYTES
}

impl Network {
    /// A link of `gbps` Gb/s and `latency` seconds one way, with Open MPI's TCP eager limit.
    pub fn new(gbps: f64, latency: f64) -> Network {
        Network {
            gbps,
            latency,
            eager_bytes: TCP_EAGER_BYTES,
        }
    }

    /// Seconds to move a message of `bytes` over the link by `transport`: its latency, a
    /// round trip more for a message past the eager limit, and the bytes at the link's
    /// rate. Over MPI, a payload past [`MPI_INLINE_BYTES`] first sends its header and waits
    /// for the receiver's go-ahead: another round trip (a payload within it travels with
    /// its 8-byte header).
    fn seconds(&self, bytes: f64, transport: Transport) -> f64 {
        let handshake = |b: f64| {
            if b > self.eager_bytes as f64 {
                2.0 * self.latency
            } else {
                0.0
            }
        };
        let wire = bytes * 8.0 / (self.gbps * 1e9);
        match transport {
            Transport::Mpi if bytes > MPI_INLINE_BYTES as f64 => {
                3.0 * self.latency + handshake(bytes) + wire
            }
            Transport::Mpi => self.latency + handshake(bytes + 8.0) + wire,
            Transport::Ucx => self.latency + handshake(bytes) + wire,
        }
    }
}

/// `GBPS,LATENCY[,EAGER]`, as `rankwise plan --network` takes it: `100,2us`, `10,5ms,1M`
/// (latency units ns, us, ms, s; a bare number is seconds; the eager limit a size such
/// as `64K`). A bad text is an [`Error::Parameter`] naming `network`.
impl std::str::FromStr for Network {
    type Err = Error;

    fn from_str(s: &str) -> Result<Network, Error> {
        let bad = |why: String| Error::Parameter {
            parameter: "network",
            message: why,
        };
        let form = || {
            bad(format!(
                "{s:?} is not GBPS,LATENCY[,EAGER] (e.g. 100,2us or 10,5ms,1M)"
            ))
        };
        let mut parts = s.split(',');
        let (Some(gbps), Some(latency)) = (parts.next(), parts.next()) else {
            return Err(form());
        };
        let eager = parts.next();
        if parts.next().is_some() {
            return Err(form());
        }
        let gbps: f64 = gbps.trim().parse().map_err(|_| form())?;
        let latency = latency.trim();
        // The unit is the trailing letters (`1e-6` is a number in seconds).
        let number = latency.trim_end_matches(|c: char| c.is_alphabetic());
        let scale = match latency[number.len()..].trim() {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" | "" => 1.0,
            _ => return Err(form()),
        };
        let latency = number.trim().parse::<f64>().map_err(|_| form())? * scale;
        if !(gbps > 0.0 && gbps.is_finite() && latency >= 0.0 && latency.is_finite()) {
            return Err(form());
        }
        let mut net = Network::new(gbps, latency);
        if let Some(e) = eager {
            net.eager_bytes =
                rankwise_exec::parse_bytes(e).map_err(|m| bad(format!("eager limit {m}")))?;
        }
        Ok(net)
    }
}

/// Shared memory between ranks of one node, as Open MPI's `vader` and UCX's `sysv`/`cma`
/// carry a message of a few kilobytes to megabytes: about a microsecond and a memory copy
/// (`vader`'s eager limit is 4 KiB).
pub const SHARED_MEMORY: Network = Network {
    gbps: 80.0,
    latency: 1e-6,
    eager_bytes: 4 << 10,
};

/// The transport a job's ranks talk over (`--transport`): what a large message costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// MPI: a payload past [`MPI_INLINE_BYTES`] waits for the receiver's go-ahead, then
    /// goes as one MPI message.
    #[default]
    Mpi,
    /// UCX's tagged messages: every payload in one message.
    Ucx,
}

/// The cluster a job would run on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// Nodes.
    pub nodes: usize,
    /// MPI ranks per node.
    pub ranks_per_node: usize,
    /// Actors per rank (one per NUMA domain the rank is given, by default).
    pub actors_per_rank: usize,
    /// CPU cores per node, shared out among its ranks.
    pub cores_per_node: usize,
    /// Memory per node that the ranks may plan with (bytes).
    pub memory_per_node: u64,
    /// GPUs per node (0: CPU actors), each rank taking the same number. With per-GPU rates
    /// ([`RateUnit::Gpu`]) the passes' values are divided among them; with per-core rates
    /// those apply, and the prediction says so.
    pub gpus_per_node: usize,
    /// The network between nodes.
    pub network: Network,
    /// The transport between ranks.
    #[serde(default)]
    pub transport: Transport,
    /// Storage bandwidth per node for a stored input, GB/s (`None`: not a bound).
    pub read_gbps: Option<f64>,
}

/// The most passes a randomized prediction counts: a run's own limit (`max_passes`).
const MAX_PASSES: usize = 10_000;

/// The most actors (nodes × ranks per node × actors per rank) a prediction plans for: 2²⁰.
const MAX_WORLD_ACTORS: usize = 1 << 20;

impl Cluster {
    /// `nodes` nodes like the one this runs on (its cores and memory), linked by
    /// `network`: one rank of one actor a node, no GPUs, MPI between ranks, storage reads
    /// not counted. Change the fields to describe another cluster.
    pub fn like_this_node(nodes: usize, network: Network) -> Cluster {
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or(16 << 30, |kib| kib << 10);
        Cluster {
            nodes,
            ranks_per_node: 1,
            actors_per_rank: 1,
            cores_per_node: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_per_node: memory,
            gpus_per_node: 0,
            network,
            transport: Transport::Mpi,
            read_gbps: None,
        }
    }

    fn ranks(&self) -> usize {
        self.nodes * self.ranks_per_node
    }

    fn cores_per_rank(&self) -> f64 {
        self.cores_per_node as f64 / self.ranks_per_node as f64
    }

    /// Units of compute per rank and per node that a calibration of `unit` divides a
    /// pass's values among: cores, or GPUs.
    fn units(&self, unit: RateUnit) -> (f64, f64) {
        match unit {
            RateUnit::Core => (self.cores_per_rank(), self.cores_per_node as f64),
            RateUnit::Gpu => (
                (self.gpus_per_node / self.ranks_per_node) as f64,
                self.gpus_per_node as f64,
            ),
        }
    }

    /// A rank's actors for rates of `unit`: `actors_per_rank`, or with per-GPU rates its
    /// GPUs (one GPU actor per GPU the rank is given, as a run makes them).
    fn actors_of_rank(&self, unit: RateUnit) -> usize {
        match unit {
            RateUnit::Core => self.actors_per_rank.max(1),
            RateUnit::Gpu => (self.gpus_per_node / self.ranks_per_node).max(1),
        }
    }

    /// The world the planners see: every rank's actors ([`Cluster::actors_of_rank`]), each
    /// with its share of the node's cores and memory.
    fn world(&self, unit: RateUnit) -> World {
        if unit == RateUnit::Gpu {
            let gpus = self.actors_of_rank(unit);
            let threads = (self.cores_per_node / self.gpus_per_node.max(1)).max(1);
            let shape = ActorShape {
                threads,
                memory: self.memory_per_node / self.gpus_per_node.max(1) as u64,
                device: "GPU".into(),
                kind: ActorKind::Gpu,
            };
            return World {
                ranks: vec![vec![shape; gpus]; self.ranks()],
            };
        }
        let actors = self.actors_of_rank(unit);
        let per_actor = self.ranks_per_node * actors;
        let threads = (self.cores_per_node / per_actor).max(1);
        let memory = self.memory_per_node / per_actor as u64;
        let shape = ActorShape {
            threads,
            memory,
            device: format!("{threads} cores"),
            kind: ActorKind::Cpu,
        };
        World {
            ranks: vec![vec![shape; actors]; self.ranks()],
        }
    }
}

/// Seconds per matrix value of the exact SVD's passes at one column count, per core.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SvdRate {
    /// Columns of the calibration matrix.
    pub cols: u64,
    /// Pass 1 (produce the panels and factor them), core-seconds per value.
    pub pass1: f64,
    /// Pass 2 (form `U`), core-seconds per value.
    pub pass2: f64,
    /// Seconds of one merge of the reduction tree at this width, on the rank that makes
    /// it: the QR of two stacked `n × n` R factors on the way up and its products with the
    /// root's `U_R` on the way down. Files of older versions did not measure it.
    #[serde(default)]
    pub merge: Option<f64>,
    /// Seconds of the SVD of the root's `n × n` R factor. Files of older versions did not
    /// measure it.
    #[serde(default)]
    pub root: Option<f64>,
}

/// Core-seconds per matrix value of a randomized pass as `a + b·l` for a sketch of `l`
/// columns.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PassRate {
    /// Core-seconds per value, whatever the sketch: the fit's intercept, which may be
    /// negative (a pass's rate is never taken below 0).
    pub per_value: f64,
    /// Core-seconds per value and sketch column (the products).
    pub per_value_column: f64,
}

impl PassRate {
    /// The line through two measurements `(l, cost)`, its slope at least 0. Its intercept
    /// may be negative (a later pass costs more than in proportion to the sketch's width):
    /// clamping it at 0 predicted the 20-column pass from the slope alone, 40 % slow.
    fn through((l0, t0): (f64, f64), (l1, t1): (f64, f64)) -> PassRate {
        let b = ((t1 - t0) / (l1 - l0)).max(0.0);
        PassRate {
            per_value: t0 - b * l0,
            per_value_column: b,
        }
    }

    fn at(&self, l: usize) -> f64 {
        (self.per_value + self.per_value_column * l as f64).max(0.0)
    }
}

/// The randomized passes over one kind of operand: the first, which produces every panel
/// (and keeps it when the plan makes panels resident), and a later pass over resident
/// panels. A pass over panels that are not resident costs `produce` more than a later one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PassRates {
    /// Producing a value (generating or decoding it), core-seconds.
    pub produce: f64,
    /// The first pass.
    pub first: PassRate,
    /// A later pass over resident panels.
    pub later: PassRate,
}

/// Rates measured on one machine by [`calibrate`]: what a core does per second, with the
/// machine they were measured on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// The machine: CPU model and cores used, or the GPUs.
    pub machine: String,
    /// Cores (or GPUs, see `unit`) of the actors the rates were measured on.
    pub cores: usize,
    /// What each rate is per: a core of CPU actors, or a GPU of GPU actors. Files of
    /// older versions were measured on CPU actors.
    #[serde(default)]
    pub unit: RateUnit,
    /// The exact SVD at several column counts, ascending (pass 2 over resident panels).
    pub svd: Vec<SvdRate>,
    /// Randomized passes over a generated float64 matrix.
    pub dense: PassRates,
    /// Randomized passes over generated genotypes (decoded and standardized per variant).
    pub genotypes: PassRates,
    /// The same passes in float32 tiles (LOBPCG's passes before its last), where the
    /// calibration measured them (files of older versions did not).
    #[serde(default)]
    pub dense_f32: Option<PassRates>,
    /// Genotype passes in float32 tiles.
    #[serde(default)]
    pub genotypes_f32: Option<PassRates>,
    /// LOBPCG's Rayleigh–Ritz step on the root rank, once a pass. Files of older versions
    /// did not measure it.
    #[serde(default)]
    pub rayleigh_ritz: Option<RayleighRitzRate>,
    /// Block Lanczos's step on the root rank, once a pass, over whole restart cycles. Files
    /// of older versions did not measure it (their predictions count LOBPCG's step).
    #[serde(default)]
    pub lanczos_step: Option<RayleighRitzRate>,
}

/// What a calibration's rates are per.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateUnit {
    /// A core of CPU actors: a pass's values over the cores that compute them.
    #[default]
    Core,
    /// A GPU (one GPU actor): its values over the GPUs. Producing a value is part of each
    /// pass's rate (a GPU actor generates or stages its panels on every pass and keeps
    /// none on the host), so `produce` is 0. LOBPCG's Rayleigh–Ritz step is the root
    /// rank's CPU threads' as ever.
    Gpu,
}

/// LOBPCG's Rayleigh–Ritz step for `n` samples (the matrix's shorter side) and a sketch of
/// `l` columns on `t` threads: `n·l·(serial + parallel / t)` seconds, each part `a + b·l`
/// per sample and sketch column (its products with the `n × 3l` blocks are `n·l²`; its
/// copies, residuals and small eigenproblem `n·l` or less). Both measured on one thread:
/// the step's residuals, copies and encoding run on one thread whatever `t` is.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RayleighRitzRate {
    /// Seconds per sample and sketch column on one thread, whatever the threads.
    pub serial: PassRate,
    /// Core-seconds per sample and sketch column shared among the threads.
    pub parallel: PassRate,
}

impl RayleighRitzRate {
    /// Seconds of one step.
    fn seconds(&self, n: u64, l: usize, threads: usize) -> f64 {
        (n * l as u64) as f64 * (self.serial.at(l) + self.parallel.at(l) / threads.max(1) as f64)
    }
}

impl Rates {
    /// What is wrong with rates that no calibration writes (a file edited or damaged):
    /// no cores, no exact-SVD widths or widths out of order, a rate that is not finite, or
    /// one that makes work free or earn time back. Each would predict nonsense (a run of
    /// 0 s, or of infinite or negative length) rather than fail.
    fn check(&self) -> Result<(), String> {
        if self.cores == 0 {
            return Err("`cores` is 0: the rates were measured on at least one".into());
        }
        if self.svd.is_empty() {
            return Err("`svd` lists no widths: the exact SVD's rates are missing".into());
        }
        let positive = |what: String, v: f64| {
            if v > 0.0 && v.is_finite() {
                Ok(())
            } else {
                Err(format!(
                    "{what} is {v:?}: a rate must be positive and finite"
                ))
            }
        };
        for (i, r) in self.svd.iter().enumerate() {
            if r.cols == 0 || (i > 0 && r.cols <= self.svd[i - 1].cols) {
                return Err(format!(
                    "`svd[{i}].cols` is {}: the widths must be at least 1 and ascending",
                    r.cols
                ));
            }
            positive(format!("`svd[{i}].pass1`"), r.pass1)?;
            positive(format!("`svd[{i}].pass2`"), r.pass2)?;
            if let Some(v) = r.merge {
                positive(format!("`svd[{i}].merge`"), v)?;
            }
            if let Some(v) = r.root {
                positive(format!("`svd[{i}].root`"), v)?;
            }
        }
        // A line `a + b·l` may have a negative intercept (`PassRate::through`), but not a
        // negative slope; a pass costs something at some width (a part of the
        // Rayleigh–Ritz step may cost nothing).
        let line = |what: &str, r: &PassRate, costs: bool| {
            let (a, b) = (r.per_value, r.per_value_column);
            if !(a.is_finite() && b.is_finite() && b >= 0.0 && (!costs || a > 0.0 || b > 0.0)) {
                return Err(format!(
                    "`{what}` is {a:?} + {b:?}·l: the slope must be finite and not negative{}",
                    if costs {
                        ", and the rate positive at some width"
                    } else {
                        ""
                    }
                ));
            }
            Ok(())
        };
        let passes = |what: &str, p: &PassRates| {
            if !(p.produce >= 0.0 && p.produce.is_finite()) {
                return Err(format!(
                    "`{what}.produce` is {:?}: it must be finite and not negative",
                    p.produce
                ));
            }
            line(&format!("{what}.first"), &p.first, true)?;
            line(&format!("{what}.later"), &p.later, true)
        };
        passes("dense", &self.dense)?;
        passes("genotypes", &self.genotypes)?;
        if let Some(p) = &self.dense_f32 {
            passes("dense_f32", p)?;
        }
        if let Some(p) = &self.genotypes_f32 {
            passes("genotypes_f32", p)?;
        }
        for (what, step) in [
            ("rayleigh_ritz", &self.rayleigh_ritz),
            ("lanczos_step", &self.lanczos_step),
        ] {
            if let Some(r) = step {
                line(&format!("{what}.serial"), &r.serial, false)?;
                line(&format!("{what}.parallel"), &r.parallel, false)?;
            }
        }
        Ok(())
    }

    /// Pass 1 and pass 2 core-seconds per value at `n` columns: interpolated between the
    /// calibrated column counts in log n (per value, the Gram and triangular work grows
    /// with n), extrapolated linearly in n beyond the widest.
    fn svd_at(&self, n: u64) -> (f64, f64) {
        let points: Vec<_> = (self.svd.iter())
            .map(|r| (r.cols, [r.pass1, r.pass2]))
            .collect();
        let Some(([p1, p2], widest)) = at_width(&points, n) else {
            return (0.0, 0.0);
        };
        let f = (n as f64 / widest as f64).max(1.0);
        (p1 * f, p2 * f)
    }

    /// Seconds of one tree merge and of the root's SVD at `n` columns, where the
    /// calibration measured them: both are `n³` work, so their coefficient per `n³` is
    /// interpolated in log n between the calibrated widths and kept beyond the widest;
    /// below the narrowest a merge costs what it cost there (its calls' own overhead).
    fn svd_tree_at(&self, n: u64) -> Option<(f64, f64)> {
        let cube = |c: u64| (c as f64).powi(3);
        let points: Vec<_> = (self.svd.iter())
            .filter_map(|r| Some((r.cols, [r.merge? / cube(r.cols), r.root? / cube(r.cols)])))
            .collect();
        let n = n.max(points.first()?.0);
        let ([merge, root], _) = at_width(&points, n)?;
        Some((merge * cube(n), root * cube(n)))
    }
}

/// Values measured at ascending widths, at width `n`: interpolated in log n between the
/// two widths around it, the narrowest's below them and the widest's beyond them; with
/// the widest width, for a caller that extrapolates. `None` without measurements.
fn at_width<const K: usize>(points: &[(u64, [f64; K])], n: u64) -> Option<([f64; K], u64)> {
    let (first, last) = (points.first()?, points.last()?);
    if n <= first.0 {
        return Some((first.1, last.0));
    }
    for w in points.windows(2) {
        if n <= w[1].0 {
            let ln = |c: u64| (c as f64).ln();
            let t = (ln(n) - ln(w[0].0)) / (ln(w[1].0) - ln(w[0].0));
            return Some((
                std::array::from_fn(|i| w[0].1[i] + t * (w[1].1[i] - w[0].1[i])),
                last.0,
            ));
        }
    }
    Some((last.1, last.0))
}

/// The job to size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Workload {
    /// The exact SVD (TSQR), `U` formed.
    Svd,
    /// A rank-`k` randomized SVD of a float64 matrix making `passes` passes.
    Rsvd {
        /// Components.
        k: usize,
        /// Extra sketch columns.
        oversample: usize,
        /// Passes over the matrix (LOBPCG to a tolerance makes as many as it needs: the
        /// run reports them; `power_iters` q makes q + 2, the residual check included).
        passes: usize,
        /// How it iterates.
        solver: Solver,
    },
    /// A genotype PCA: as `Rsvd`, on standardized genotypes.
    Pca {
        /// Components.
        k: usize,
        /// Extra sketch columns.
        oversample: usize,
        /// Passes over the matrix.
        passes: usize,
        /// How it iterates.
        solver: Solver,
    },
}

/// How a randomized job iterates: what its passes send, and in which precision they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Solver {
    /// LOBPCG to a tolerance, the default: every pass but the last (which measures the
    /// result in float64) in float32 tiles; each pass sums `AᵀA·S` (`n × l`) up the tree and
    /// the root broadcasts the next search block (`n × l`) back down.
    Lobpcg,
    /// Block Lanczos to a tolerance, the default of a genotype PCA: its passes are
    /// [`rankwise_linalg::LANCZOS_BLOCK`] columns wide (the last, which measures the result
    /// in float64, `l`), in float32 tiles but the last; each sums `AᵀA·S` (`n × 8`) up the
    /// tree and the root broadcasts the next block back down. Its steps on the root are
    /// counted at LOBPCG's calibrated rate (measured: 24 ms a step against LOBPCG's 43 ms
    /// at 20,000 samples, so an overestimate).
    Lanczos,
    /// A fixed number of power iterations (`power_iters`) in float64 tiles: each pass
    /// orthonormalizes the sketch (the TSQR's `l × l` factors up and down) and sums `B`'s
    /// panels up the tree.
    PowerIters,
}

/// One phase of a predicted run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictedPhase {
    /// What it is.
    pub phase: String,
    /// Seconds of compute on the busiest rank.
    pub compute_seconds: f64,
    /// Seconds of communication on the critical path.
    pub comm_seconds: f64,
    /// Seconds the busiest node reads the stored matrix in this phase, at
    /// [`Cluster::read_gbps`] (0 without it): the read-ahead overlaps them with the
    /// phase's compute, so the phase takes the longer of the two.
    #[serde(default)]
    pub read_seconds: f64,
    /// Bytes the busiest sender sends in the phase (payloads; each message also carries a
    /// header of a few bytes).
    pub bytes_sent: u64,
}

/// What the model predicts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Ranks.
    pub ranks: usize,
    /// Rows and columns of the matrix the algorithm sees (tall).
    pub shape: (u64, u64),
    /// Rows per panel, and panels.
    pub panel_rows: u64,
    /// Panels.
    pub panels: usize,
    /// Passes over the matrix.
    pub passes: usize,
    /// The phases, in order.
    pub phases: Vec<PredictedPhase>,
    /// Seconds, all phases.
    pub seconds: f64,
    /// The plan's memory per rank (the sum of its actors' planned bytes), the largest.
    pub memory_per_rank: u64,
    /// Whether the plan keeps every panel in memory between passes.
    pub resident: bool,
    /// Whether that memory fits the node's share per rank (a run would refuse it else).
    pub fits: bool,
    /// The cost that dominates: `compute` (the passes), `network`, `storage` or
    /// `Rayleigh–Ritz steps on the root` (LOBPCG's steps between passes).
    pub dominant: String,
    /// What the model did not count.
    pub notes: Vec<String>,
}

/// The phase of LOBPCG's Rayleigh–Ritz steps, and the dominant cost when they are.
const ROOT_STEPS: &str = "Rayleigh–Ritz steps on the root";

/// A matrix of a given shape that is never read: what the planners need to plan.
struct Shaped(u64, u64);

impl PanelSource for Shaped {
    fn shape(&self) -> (u64, u64) {
        (self.0, self.1)
    }
    fn fill(
        &self,
        rows: std::ops::Range<u64>,
        _: ndarray::ArrayViewMut2<'_, f64>,
    ) -> Result<(), SourceError> {
        Err(self.unread(rows))
    }
    fn describe(&self) -> String {
        format!("a {} × {} matrix (planned, not read)", self.0, self.1)
    }
}

impl GenotypeSource for Shaped {
    fn shape(&self) -> (u64, u64) {
        (self.0, self.1)
    }
    fn fill_dosages(
        &self,
        rows: std::ops::Range<u64>,
        _: ndarray::ArrayViewMut2<'_, i8>,
    ) -> Result<(), SourceError> {
        Err(self.unread(rows))
    }
    fn describe(&self) -> String {
        PanelSource::describe(self)
    }
}

impl Shaped {
    fn unread(&self, rows: std::ops::Range<u64>) -> SourceError {
        SourceError::OutOfBounds {
            rows,
            cols: self.1 as usize,
            shape: (self.0, self.1),
            what: PanelSource::describe(self),
        }
    }
}

/// Panel rows when none are given: enough panels for every actor a few times over, each
/// at most 64 MiB of f64; the exact SVD's panels are at least as tall as the matrix is
/// wide (its panel QR needs it), the randomized passes' at least 256 rows (their panel
/// QR is of the sketch's few columns).
fn default_panel_rows(rows: u64, cols: u64, actors: usize, svd: bool) -> u64 {
    let least = if svd { cols } else { 256 };
    let by_bytes = ((64u64 << 20) / (8 * cols.max(1))).max(least);
    let by_actors = rows.div_ceil(4 * actors.max(1) as u64).max(least);
    by_bytes.min(by_actors).min(rows).max(1)
}

/// Communication on the critical path of one tree sweep over `ranks` ranks placed
/// `per_node` to a node, each message `bytes` long.
fn tree_seconds(ranks: usize, per_node: usize, bytes: f64, cluster: &Cluster) -> f64 {
    let levels = |p: usize| (p.max(1) as f64).log2().ceil() as usize;
    let inside = levels(per_node.min(ranks));
    let all = levels(ranks);
    let t = cluster.transport;
    inside as f64 * SHARED_MEMORY.seconds(bytes, t)
        + (all - inside) as f64 * cluster.network.seconds(bytes, t)
}

/// The longest run [`predict`] answers, a thousand years: longer ones come from rates no
/// machine has (a calibration file edited or damaged).
const MAX_PREDICTED_SECONDS: f64 = 1000.0 * 365.25 * 86_400.0;

/// Predicts the time and memory per rank of `workload` on a `rows × cols` matrix (tall, or
/// its transpose is planned) in panels of `panel_rows` rows (0: the command line's default
/// for a generated matrix) on `cluster`, with the per-core (or per-GPU) `rates` of a
/// calibration.
pub fn predict(
    rows: u64,
    cols: u64,
    panel_rows: u64,
    workload: &Workload,
    cluster: &Cluster,
    rates: &Rates,
) -> Result<Prediction, Error> {
    let bad = |parameter: &'static str, message: String| Error::Parameter { parameter, message };
    rates.check().map_err(|m| bad("rates", m))?;
    for (parameter, count) in [("rows", rows), ("cols", cols)] {
        if count == 0 {
            return Err(bad(parameter, "0: the matrix needs at least one".into()));
        }
    }
    for (parameter, count) in [
        ("nodes", cluster.nodes),
        ("ranks_per_node", cluster.ranks_per_node),
        ("actors_per_rank", cluster.actors_per_rank),
        ("cores_per_node", cluster.cores_per_node),
    ] {
        if count == 0 {
            return Err(bad(parameter, "0: at least 1".into()));
        }
    }
    // The planners see every actor of the world (a list of them per rank): a world past
    // about a million actors is no cluster, and its lists would fill the memory.
    let per_rank = cluster.actors_of_rank(rates.unit);
    let actors = cluster
        .nodes
        .checked_mul(cluster.ranks_per_node)
        .and_then(|r| r.checked_mul(per_rank));
    if actors.is_none_or(|a| a > MAX_WORLD_ACTORS) {
        return Err(bad(
            "cluster",
            format!(
                "{} nodes × {} ranks × {per_rank} actors: at most {MAX_WORLD_ACTORS} actors \
                 in all",
                cluster.nodes, cluster.ranks_per_node,
            ),
        ));
    }
    if cluster
        .read_gbps
        .is_some_and(|g| !(g > 0.0 && g.is_finite()))
    {
        return Err(bad(
            "read_gbps",
            format!(
                "{:?} GB/s: the read bandwidth must be positive and finite",
                cluster.read_gbps.unwrap_or_default()
            ),
        ));
    }
    if !(cluster.network.gbps > 0.0 && cluster.network.latency >= 0.0) {
        return Err(bad(
            "network",
            format!(
                "{} Gb/s and {} s: the bandwidth must be positive and the latency not negative",
                cluster.network.gbps, cluster.network.latency
            ),
        ));
    }
    let (m, n) = if rows >= cols {
        (rows, cols)
    } else {
        (cols, rows)
    };
    match (rates.unit, cluster.gpus_per_node) {
        (RateUnit::Gpu, 0) => {
            return Err(bad(
                "gpus_per_node",
                format!(
                    "the calibration's rates are per GPU ({}): give the GPUs per node",
                    rates.machine
                ),
            ))
        }
        (RateUnit::Gpu, g) if g % cluster.ranks_per_node != 0 => {
            return Err(bad(
                "gpus_per_node",
                format!(
                    "{g} GPUs per node among {} ranks: each rank takes the same number of GPUs",
                    cluster.ranks_per_node
                ),
            ))
        }
        _ => {}
    }
    let world = cluster.world(rates.unit);
    // A plan the budget refuses: the node's memory, as this call describes it, is what to
    // raise (the planner speaks of the memory per actor it was given).
    let planned = |e: Error| {
        let budget = matches!(
            &e,
            Error::Runtime(rankwise_exec::RuntimeError::Budget(_))
                | Error::Linalg(rankwise_linalg::LinalgError::Runtime(
                    rankwise_exec::RuntimeError::Budget(_)
                ))
        );
        if !budget {
            return e;
        }
        bad(
            "memory_per_node",
            format!(
                "{} a node, {} ranks of {} actors each: {e}",
                rankwise_exec::format_bytes(cluster.memory_per_node),
                cluster.ranks_per_node,
                cluster.actors_of_rank(rates.unit)
            ),
        )
    };
    let (units_per_rank, units_per_node) = cluster.units(rates.unit);
    let ranks = cluster.ranks();
    let chunk = if panel_rows > 0 {
        panel_rows
    } else {
        default_panel_rows(m, n, world.actors(), matches!(workload, Workload::Svd))
    };
    let grid = ChunkGrid::new(m, n, chunk).map_err(|e| bad("panel_rows", e.to_string()))?;
    let mut notes = Vec::new();
    if cluster.gpus_per_node > 0 && rates.unit == RateUnit::Core {
        notes.push(
            "GPU actors: the rates are the CPU calibration's; a GPU pass is faster".to_string(),
        );
    }
    // The busiest rank's values, and the values per core on a pass's critical path (the
    // rates are core-seconds per value), from the plan's placement. Ranks are placed node
    // by node, as `mpirun` and `srun` place them.
    let rank_values = |placement: &rankwise_exec::Placement| -> (f64, f64) {
        let mut per_rank = vec![0u64; ranks];
        for a in &placement.assignments {
            for q in a.panels.clone() {
                let r = grid.panel_rows(q);
                per_rank[a.rank] += (r.end - r.start) * n;
            }
        }
        let busiest = per_rank.iter().copied().max().unwrap_or(0) as f64;
        let node = per_rank
            .chunks(cluster.ranks_per_node)
            .map(|c| c.iter().sum::<u64>())
            .max()
            .unwrap_or(0) as f64;
        let per_core = (busiest / units_per_rank.max(1.0)).max(node / units_per_node.max(1.0));
        (busiest, per_core)
    };
    let rank_memory = |memory: &[rankwise_exec::MemoryPlan],
                       placement: &rankwise_exec::Placement|
     -> (u64, bool) {
        let mut per_rank = vec![0u64; ranks];
        let mut resident = true;
        for (a, p) in placement.assignments.iter().zip(memory) {
            let kept = matches!(p.residency, rankwise_exec::Residency::Resident);
            per_rank[a.rank] +=
                p.workspace + p.read_bytes + if kept { p.resident_bytes } else { 0 };
            resident &= kept;
        }
        (per_rank.into_iter().max().unwrap_or(0), resident)
    };
    let read_seconds = |values: f64, bytes_per_value: f64| -> f64 {
        cluster.read_gbps.map_or(0.0, |gbps| {
            values * bytes_per_value * cluster.ranks_per_node as f64 / (gbps * 1e9)
        })
    };
    let levels = (ranks.max(1) as f64).log2().ceil() as u64;
    let per_node = cluster.ranks_per_node;
    let mut phases = Vec::new();
    let (passes, memory, resident) = match workload {
        Workload::Svd => {
            let problem = SvdProblem {
                source: Arc::new(Shaped(m, n)),
                grid,
                transposed: false,
                rank_panels: None,
            };
            let plan = SvdPlan::for_problem(&problem, &world).map_err(|e| planned(e.into()))?;
            let (values, per_core) = rank_values(&plan.placement);
            let (p1, p2) = rates.svd_at(n);
            let (mem, resident) = rank_memory(&plan.memory, &plan.placement);
            let up = (plan.words_up * 8) as f64;
            let down = (plan.words_down * 8) as f64;
            // Σ and Vᵀ: n + n² values.
            let bcast = ((n + n * n) * 8) as f64;
            let read = read_seconds(values, 8.0);
            phases.push(PredictedPhase {
                phase: "pass 1: produce panels + panel QR".into(),
                compute_seconds: per_core * p1,
                comm_seconds: 0.0,
                read_seconds: read,
                bytes_sent: 0,
            });
            // The tree's merges on the root's rank, and the SVD of its R, one after the
            // other on one thread while every actor waits: uncounted, the model predicted
            // `svd` of 100,000 × 512 in 16 panels 21–26 % low on one rank.
            let tree_compute = match rates.svd_tree_at(n) {
                Some((merge, root)) => {
                    let tree = rankwise_linalg::Tree::new(&plan.placement.owner);
                    tree.merges_made_by(tree.root_owner()) as f64 * merge + root
                }
                None => {
                    notes.push(
                        "the calibration has no tree rates (an older file): the exact SVD's \
                         merges of R factors and the SVD of the root's are not counted"
                            .into(),
                    );
                    0.0
                }
            };
            phases.push(PredictedPhase {
                phase: "tree: reduce R factors, SVD of R, broadcast, push down".into(),
                compute_seconds: tree_compute,
                // Up, the broadcast of Σ and Vᵀ (n² values), and down.
                comm_seconds: tree_seconds(ranks, per_node, up, cluster)
                    + tree_seconds(ranks, per_node, bcast, cluster)
                    + tree_seconds(ranks, per_node, down, cluster),
                // The root sends the most: a C block and Σ, Vᵀ down each level.
                bytes_sent: levels * (down + bcast) as u64,
                read_seconds: 0.0,
            });
            // Pass 2 over panels that were not kept produces them again.
            let again = if resident { 0.0 } else { rates.dense.produce };
            phases.push(PredictedPhase {
                phase: "pass 2: form U".into(),
                compute_seconds: per_core * (p2 + again),
                comm_seconds: 0.0,
                read_seconds: if resident { 0.0 } else { read },
                bytes_sent: 0,
            });
            (2, mem, resident)
        }
        Workload::Rsvd {
            k,
            oversample,
            passes,
            solver,
        }
        | Workload::Pca {
            k,
            oversample,
            passes,
            solver,
        } => {
            // Every randomized run makes at least two passes (one to iterate, one to form
            // `U` and measure the result), and at most the runs' own limit.
            if !(2..=MAX_PASSES).contains(passes) {
                return Err(bad(
                    "passes",
                    format!(
                        "{passes} passes: a randomized run makes from 2 (q = 0, or one LOBPCG \
                         iteration and the pass that measures it) to {MAX_PASSES}"
                    ),
                ));
            }
            let genotypes = matches!(workload, Workload::Pca { .. });
            let problem = if genotypes {
                RsvdProblem::genotypes(Arc::new(Shaped(m, n)), chunk)?
            } else {
                RsvdProblem::dense(Arc::new(Shaped(m, n)), chunk)?
            };
            let options = RsvdOptions {
                k: *k,
                oversample: *oversample,
                method: match solver {
                    Solver::Lanczos => rankwise_linalg::Method::Lanczos,
                    _ => rankwise_linalg::Method::Lobpcg,
                },
                ..Default::default()
            };
            let plan = RsvdPlan::new(&problem, &options, &world).map_err(|e| planned(e.into()))?;
            let (values, per_core) = rank_values(&plan.placement);
            let l = plan.sketch;
            let rate = if genotypes {
                rates.genotypes
            } else {
                rates.dense
            };
            let single = if genotypes {
                rates.genotypes_f32
            } else {
                rates.dense_f32
            };
            let single = match (solver, single) {
                (Solver::Lobpcg | Solver::Lanczos, Some(r)) => Some(r),
                (Solver::Lobpcg | Solver::Lanczos, None) => {
                    notes.push(
                        "the calibration has no float32 rates (an older file): the float32 \
                         passes are counted at the float64 rates"
                            .into(),
                    );
                    None
                }
                (Solver::PowerIters, _) => None,
            };
            let (mem, resident) = rank_memory(&plan.memory, &plan.placement);
            // Each pass ends in a tree: the TSQR of the sketch (l × l R factors, up and
            // down) and the sum of B's panels, one message of `words_b` per level. What
            // comes back down is small or crosses a level at the same time as the sum goes
            // up: under `mpirun -np 2` a fixed-iteration PCA's rank 0 sent and received one
            // 320 KB message per pass (an exchange), and LOBPCG's root received one 290 KB
            // message per pass and sent 56 bytes in all. Counting the sum up and down
            // predicted 1 Gbit/s → 20 Mbit/s as +1.01 s where the PCA took +0.31 s.
            //
            // LOBPCG sends more a pass: the root's broadcast of the next search block as well
            // as the sum of `AᵀA·S`, both `n × l`. Under `mpirun -np 2` on two namespace
            // nodes its rank 0 received one 297 KB message a pass and sent one 307 KB one
            // (the run's report, once the broadcast was counted), and a latency 8 ms longer
            // cost it 12 latencies a pass. Each message waits for the transport's go-ahead
            // and then for MPI's rendezvous: five one-way latencies, ten a pass, counted
            // since; with the 44-pass PCA over 5 ms links this took the prediction from
            // 37 % to 8–11 % low (`--mca btl_tcp_eager_limit 1048576` and `--network
            // …,1M`: 12–15 % low). A ping-pong of 300 KB messages on those links put the
            // rest in the transfer: about 9 ms more a message than the link's rate.
            let r_bytes = (l * l * 8) as f64;
            // Block Lanczos's passes but the last are a block wide, and so are its messages.
            let width = |p: usize| match solver {
                Solver::Lanczos if p < *passes => rankwise_linalg::LANCZOS_BLOCK.min(l),
                _ => l,
            };
            let b_bytes = |p: usize| match solver {
                Solver::Lanczos => (n as usize * width(p) * 8) as f64,
                _ => (plan.words_b * 8) as f64,
            };
            let comm = |p: usize| match solver {
                Solver::PowerIters => {
                    2.0 * tree_seconds(ranks, per_node, r_bytes, cluster)
                        + tree_seconds(ranks, per_node, b_bytes(p), cluster)
                }
                Solver::Lobpcg | Solver::Lanczos => {
                    2.0 * tree_seconds(ranks, per_node, b_bytes(p), cluster)
                }
            };
            let passes = *passes;
            // Panels kept in memory are read once, in the first pass; the others in every
            // pass.
            let read = read_seconds(values, if genotypes { 0.25 } else { 8.0 });
            for p in 1..=passes {
                // LOBPCG's passes run in float32 tiles but its last, which measures the
                // result in float64.
                let r = match single {
                    Some(r) if p < passes => r,
                    _ => rate,
                };
                let w = width(p);
                let per_value = if p == 1 {
                    r.first.at(w)
                } else if resident {
                    r.later.at(w)
                } else {
                    r.later.at(w) + r.produce
                };
                phases.push(PredictedPhase {
                    phase: format!("pass {p}"),
                    compute_seconds: per_core * per_value,
                    comm_seconds: comm(p),
                    read_seconds: if p == 1 || !resident { read } else { 0.0 },
                    // The busiest rank sends an R factor and a B block per level, or
                    // (LOBPCG's root) the search block.
                    bytes_sent: match solver {
                        Solver::PowerIters => levels * (r_bytes + b_bytes(p)) as u64,
                        Solver::Lobpcg | Solver::Lanczos => levels * b_bytes(p) as u64,
                    },
                });
            }
            if matches!(solver, Solver::Lobpcg | Solver::Lanczos) {
                // LOBPCG's Rayleigh–Ritz step, after every pass, on the root rank alone
                // while every actor waits: its products with the `n × 3l` blocks run on
                // the root's cores, one thread per chunk of rows. It grows with the
                // samples, not with the variants or the nodes. Block Lanczos's own step
                // where the calibration measured it, LOBPCG's (more work a step) where not.
                let step_rate = match (solver, rates.lanczos_step) {
                    (Solver::Lanczos, Some(r)) => Some(r),
                    (Solver::Lanczos, None) => {
                        if rates.rayleigh_ritz.is_some() {
                            notes.push(
                                "the calibration has no block Lanczos step (an older file): \
                                 its steps on the root are counted at LOBPCG's rate"
                                    .into(),
                            );
                        }
                        rates.rayleigh_ritz
                    }
                    _ => rates.rayleigh_ritz,
                };
                match step_rate {
                    Some(rr) => {
                        let root_threads: usize = world.ranks[0].iter().map(|a| a.threads).sum();
                        let used = rankwise_linalg::rayleigh_ritz_threads(n, root_threads);
                        let step = rr.seconds(n, l, used);
                        phases.push(PredictedPhase {
                            phase: format!(
                                "{ROOT_STEPS} ({passes}, on {used} thread{})",
                                if used == 1 { "" } else { "s" }
                            ),
                            compute_seconds: passes as f64 * step,
                            comm_seconds: 0.0,
                            read_seconds: 0.0,
                            bytes_sent: 0,
                        });
                    }
                    None => notes.push(
                        "the calibration has no Rayleigh–Ritz rate (an older file): LOBPCG's \
                         steps on the root are not counted"
                            .into(),
                    ),
                }
            }
            if genotypes {
                notes.push("the variant QC pass (allele counts) is not counted".into());
            }
            (passes, mem, resident)
        }
    };
    let root: f64 = phases
        .iter()
        .filter(|p| p.phase.starts_with(ROOT_STEPS))
        .map(|p| p.compute_seconds)
        .sum();
    let compute: f64 = phases.iter().map(|p| p.compute_seconds).sum::<f64>() - root;
    let comm: f64 = phases.iter().map(|p| p.comm_seconds).sum();
    let read: f64 = phases.iter().map(|p| p.read_seconds).sum();
    // Reading overlaps a pass's compute (the read-ahead), never another pass's: the pass
    // takes the slower of the two. Measured from moto's S3 server on 127.0.0.1 (0.68 GB/s),
    // `rsvd` q = 2 of a 200,000 × 200 float64 store with its panels kept took 0.78–1.12 s,
    // where the whole run's compute against its one read (0.47 s) had predicted 0.47 s.
    let overlapped: f64 = (phases.iter())
        .filter(|p| !p.phase.starts_with(ROOT_STEPS))
        .map(|p| p.compute_seconds.max(p.read_seconds))
        .sum();
    let seconds = overlapped + root + comm;
    let dominant = [
        (compute, "compute"),
        (read, "storage"),
        (comm, "network"),
        (root, ROOT_STEPS),
    ]
    .into_iter()
    .fold((f64::NEG_INFINITY, "compute"), |best, c| {
        if c.0 > best.0 {
            c
        } else {
            best
        }
    })
    .1;
    let budget = cluster.memory_per_node / cluster.ranks_per_node as u64;
    let fits = memory <= budget;
    if !fits {
        notes.push(format!(
            "the plan needs {} per rank, more than the node's share {}: a run would refuse \
             it (more nodes, or smaller panels)",
            rankwise_exec::format_bytes(memory),
            rankwise_exec::format_bytes(budget)
        ));
    }
    if cluster.read_gbps.is_none() {
        notes.push("storage reads are not counted (no read bandwidth given)".into());
    }
    // Finite rates can still be absurd (a core-second per value of 1e300): their products
    // overflow. No machine the model describes takes longer than this.
    if !(seconds.is_finite() && seconds < MAX_PREDICTED_SECONDS) {
        return Err(bad(
            "rates",
            format!(
                "the run would take {seconds:e} s: the rates ({}) are not a machine's",
                rates.machine
            ),
        ));
    }
    Ok(Prediction {
        ranks,
        shape: (m, n),
        panel_rows: chunk,
        panels: grid.panels(),
        passes,
        phases,
        seconds,
        memory_per_rank: memory,
        resident,
        fits,
        dominant: dominant.into(),
        notes,
    })
}

/// The fewest matrix values per measurement [`calibrate`] takes.
pub const MIN_CALIBRATION_VALUES: u64 = 1 << 16;

/// Matrix values per measurement of a calibration unless told: about a minute in all on 2
/// cores.
pub const DEFAULT_CALIBRATION_VALUES: u64 = 1 << 26;

/// Measures the [`Rates`] on this runtime's actors (run it with one rank), per core on CPU
/// actors and per GPU on GPU actors (a mix of both is refused, naming `device`): the exact
/// SVD at nine widths from 8 to 512 columns (its two passes, its tree's merges and the SVD
/// of the root's R factor), the randomized passes of a float64 matrix and of genotypes at
/// 8 and 20 sketch columns (the first pass, and the power iterations' passes), and the
/// Rayleigh–Ritz steps of LOBPCG and of block Lanczos for 16,000 samples at 20 and 60
/// sketch columns on one thread (the products the threads share, and the rest), each the
/// faster of two runs, and, on CPU actors, producing a value on one thread. Each
/// measurement makes about `values` matrix values.
pub fn calibrate(rt: &Runtime, values: u64) -> Result<Rates, Error> {
    if rt.comm().size() > 1 {
        // Every rank would measure the machine at once, each slowed by the others.
        return Err(Error::Parameter {
            parameter: "world",
            message: format!(
                "{} ranks: calibrate measures one rank's actors (run it without mpirun)",
                rt.comm().size()
            ),
        });
    }
    if values < MIN_CALIBRATION_VALUES {
        return Err(Error::Parameter {
            parameter: "values",
            message: format!(
                "{values}: at least {MIN_CALIBRATION_VALUES} values per measurement (fewer \
                 time only the calls' overhead)"
            ),
        });
    }
    measure(rt, values).map_err(|e| {
        // A measurement too large for the generator or for the actors' memory: `values`
        // is what to lower (the planner names the rows and the memory it was given).
        let too_large = e.parameter() == Some("rows")
            || matches!(
                &e,
                Error::Runtime(rankwise_exec::RuntimeError::Budget(_))
                    | Error::Linalg(rankwise_linalg::LinalgError::Runtime(
                        rankwise_exec::RuntimeError::Budget(_)
                    ))
            );
        if too_large {
            Error::Parameter {
                parameter: "values",
                message: format!("{values} values per measurement are too many here: {e}"),
            }
        } else {
            e
        }
    })
}

/// [`calibrate`]'s measurements, once its arguments are checked.
fn measure(rt: &Runtime, values: u64) -> Result<Rates, Error> {
    let actors = &rt.world().ranks[0];
    let gpus: Vec<&ActorShape> = actors.iter().filter(|a| a.kind == ActorKind::Gpu).collect();
    // A pass's rate is per unit of one kind: a world of both would blend them.
    if !gpus.is_empty() && gpus.len() < actors.len() {
        return Err(Error::Parameter {
            parameter: "device",
            message: format!(
                "{} GPU and {} CPU actors: calibrate one kind at a time",
                gpus.len(),
                actors.len() - gpus.len()
            ),
        });
    }
    let (unit, cores, machine) = if gpus.is_empty() {
        let cores = actors.iter().map(|a| a.threads).sum::<usize>();
        (
            RateUnit::Core,
            cores,
            format!("{} ({cores} cores)", cpu_model()),
        )
    } else {
        let names: Vec<&str> = gpus.iter().map(|a| a.device.as_str()).collect();
        (
            RateUnit::Gpu,
            gpus.len(),
            format!("{} GPU(s): {}", gpus.len(), names.join(", ")),
        )
    };
    let cores_f = cores as f64;
    let mut svd = Vec::new();
    // Widths close enough that the interpolation follows the cost between them: per value
    // it is not monotonic in n (a generated row pays its streams' seeds whatever its
    // width, the Gram and solve work grows with n, and from 64 columns panels are factored
    // whole). With 8, 32, 128 and 512 alone the model over-predicted 20 columns by 35 %.
    for n in [8u64, 16, 24, 32, 48, 64, 128, 256, 512] {
        let m = (values / n).max(8 * n);
        // Odd panel heights: from 64 columns a panel is factored whole with its height as
        // leading dimension, and a power of two (2²⁶ / n / 8 here) would measure the cache
        // set conflicts of that one height instead of the rate of every other.
        let chunk = ((m / 8) | 1).max(4 * n);
        let problem = SvdProblem::generated(m, n, chunk, 1, Dist::Normal)?;
        // U is formed and handed over, as to a caller's sink, and not kept: what forming
        // it costs, not what keeping it costs.
        let sink: rankwise_linalg::FactorSink = Arc::new(|_, _, _| Ok(()));
        let v = (m * n) as f64;
        // The faster of two runs, pass by pass: a shared machine's interference only ever
        // adds time.
        let mut best = (f64::INFINITY, f64::INFINITY);
        // One rank makes every merge of the tree over the panels, one less than them.
        let merges = problem.grid.panels().saturating_sub(1).max(1) as f64;
        let (mut merge, mut root) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..2 {
            let options = SvdOptions { check: false };
            let r = rankwise_linalg::svd(rt, &problem, &options, Some(Arc::clone(&sink)))?;
            let phase = |prefix: &str| {
                r.timings
                    .iter()
                    .filter(|t| t.phase.starts_with(prefix))
                    .map(|t| t.seconds)
                    .sum::<f64>()
            };
            best.0 = best.0.min(phase("pass 1") * cores_f / v);
            best.1 = best.1.min(phase("pass 2") * cores_f / v);
            merge = merge.min(phase("tree:") / merges);
            root = root.min(phase("SVD of R"));
        }
        svd.push(SvdRate {
            cols: n,
            pass1: best.0,
            pass2: best.1,
            merge: Some(merge),
            root: Some(root),
        });
    }
    let passes =
        |genotypes: bool, precision: rankwise_linalg::Precision| -> Result<PassRates, Error> {
            let n = 2000u64;
            let m = (values / n).max(4 * n);
            let chunk = (m / 8).max(64);
            let dist = if genotypes {
                Dist::Genotype
            } else {
                Dist::Normal
            };
            let g = Generated::new(m, n, 3, dist);
            // Producing: one thread fills panels as the passes do. A GPU actor makes its
            // panels again on every pass, on its device: the passes' own rates hold it.
            let produce = match unit {
                RateUnit::Gpu => 0.0,
                RateUnit::Core => {
                    let t = Instant::now();
                    let rows = chunk.min(m);
                    if genotypes {
                        let mut out = ndarray::Array2::<i8>::zeros((rows as usize, n as usize));
                        for r0 in (0..m).step_by(rows as usize) {
                            let r1 = (r0 + rows).min(m);
                            let part = out.slice_mut(ndarray::s![..(r1 - r0) as usize, ..]);
                            g.fill_dosages(r0..r1, part)?;
                        }
                    } else {
                        let mut out = ndarray::Array2::<f64>::zeros((rows as usize, n as usize));
                        for r0 in (0..m).step_by(rows as usize) {
                            let r1 = (r0 + rows).min(m);
                            let part = out.slice_mut(ndarray::s![..(r1 - r0) as usize, ..]);
                            PanelSource::fill(&g, r0..r1, part)?;
                        }
                    }
                    t.elapsed().as_secs_f64() / (m * n) as f64
                }
            };
            let mut first = Vec::new();
            let mut later = Vec::new();
            // Sketches of 8 columns (block Lanczos's passes, the PCA's default) and 20
            // (k = 10's sketch); wider ones are extrapolated. Genotype passes cost more at
            // narrow widths than a line through 20 and 60 columns says: it put a block
            // Lanczos pass of 50,000 × 20,000 at 0.13 s where it took 0.23 s (float32
            // tiles, 2-core Intel Xeon guest), and a line through 8 and 60 put LOBPCG's
            // 20-column pass at 0.68 s where it took 0.49 s.
            for (k, oversample) in [(4usize, 4usize), (10, 10)] {
                let g = Arc::new(Generated::new(m, n, 3, dist));
                let problem = if genotypes {
                    RsvdProblem::genotypes(g, chunk)?
                } else {
                    RsvdProblem::dense(g, chunk)?
                };
                let options = RsvdOptions {
                    k,
                    oversample,
                    power_iters: 2,
                    method: rankwise_linalg::Method::SubspaceIteration,
                    probes: 0,
                    precision,
                    mixed_precision: false,
                    ..Default::default()
                };
                let v = (m * n) as f64;
                // The faster of two runs, pass by pass, as for the exact SVD: one run's rates
                // varied by up to 40 % between calibrations on the shared 2-core guest.
                let mut best = (f64::INFINITY, f64::INFINITY);
                for _ in 0..2 {
                    let r = rankwise_linalg::rsvd(rt, &problem, &options, None)?;
                    let first_pass: f64 = r
                        .timings
                        .iter()
                        .filter(|t| t.phase.starts_with("pass 1"))
                        .map(|t| t.seconds * cores_f / v)
                        .sum();
                    // Each power iteration's pass over the matrix (its A·Z phase).
                    let iterations: Vec<f64> = r
                        .timings
                        .iter()
                        .filter(|t| t.phase.starts_with("iteration") && t.phase.contains("A·Z"))
                        .map(|t| t.seconds * cores_f / v)
                        .collect();
                    let mean = iterations.iter().sum::<f64>() / iterations.len().max(1) as f64;
                    best = (best.0.min(first_pass), best.1.min(mean));
                }
                let l = (k + oversample) as f64;
                first.push((l, best.0));
                later.push((l, best.1));
            }
            Ok(PassRates {
                produce,
                first: PassRate::through(first[0], first[1]),
                later: PassRate::through(later[0], later[1]),
            })
        };
    // LOBPCG's Rayleigh–Ritz step for 16,000 samples (not a power of two, whose strides
    // measure the cache's set conflicts rather than the step) on one thread: the time in
    // the products the threads share, and the rest, which runs on one thread whatever the
    // cores, at 20 and 60 sketch columns, each the faster of two measurements of four
    // steps. The two parts are timed as they run, not fitted from one thread against two:
    // on the 2-core guest two threads ran the shared products only 1.2–1.5× faster (the
    // host's memory and its other guests), and that fit put up to four fifths of the step
    // in the serial part, where timing the parts finds a quarter to a third.
    // Block Lanczos's step likewise, over whole restart cycles of its basis.
    let step_rate = |method: rankwise_linalg::Method| -> Result<RayleighRitzRate, Error> {
        const SAMPLES: usize = 16_000;
        let (mut serial, mut parallel) = (Vec::new(), Vec::new());
        for k in [10usize, 50] {
            let (mut s, mut p) = (f64::INFINITY, f64::INFINITY);
            for _ in 0..2 {
                let t = rankwise_linalg::rayleigh_ritz_seconds(SAMPLES, k, 10, method, 1, 4)?;
                let per = (SAMPLES * (k + 10)) as f64;
                s = s.min((t.seconds - t.shared).max(0.0) / per);
                p = p.min(t.shared / per);
            }
            let l = (k + 10) as f64;
            serial.push((l, s));
            parallel.push((l, p));
        }
        Ok(RayleighRitzRate {
            serial: PassRate::through(serial[0], serial[1]),
            parallel: PassRate::through(parallel[0], parallel[1]),
        })
    };
    use rankwise_linalg::Precision::{F32, F64};
    Ok(Rates {
        machine,
        cores,
        unit,
        svd,
        dense: passes(false, F64)?,
        genotypes: passes(true, F64)?,
        dense_f32: Some(passes(false, F32)?),
        genotypes_f32: Some(passes(true, F32)?),
        rayleigh_ritz: Some(step_rate(rankwise_linalg::Method::Lobpcg)?),
        lanczos_step: Some(step_rate(rankwise_linalg::Method::Lanczos)?),
    })
}

/// The CPU's model name, from /proc/cpuinfo where there is one.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates() -> Rates {
        Rates {
            machine: "test".into(),
            cores: 2,
            unit: RateUnit::Core,
            svd: vec![
                SvdRate {
                    cols: 8,
                    pass1: 1e-9,
                    pass2: 5e-10,
                    merge: Some(1e-5),
                    root: Some(2e-5),
                },
                SvdRate {
                    cols: 512,
                    pass1: 64e-9,
                    pass2: 32e-9,
                    merge: Some(512f64.powi(3) * 1e-10),
                    root: Some(512f64.powi(3) * 4e-10),
                },
            ],
            dense: PassRates {
                produce: 5e-10,
                first: PassRate {
                    per_value: 1e-9,
                    per_value_column: 1e-10,
                },
                later: PassRate {
                    per_value: 1e-10,
                    per_value_column: 1e-10,
                },
            },
            genotypes: PassRates {
                produce: 5e-10,
                first: PassRate {
                    per_value: 2e-9,
                    per_value_column: 1e-10,
                },
                later: PassRate {
                    per_value: 2e-10,
                    per_value_column: 1e-10,
                },
            },
            dense_f32: None,
            genotypes_f32: None,
            rayleigh_ritz: None,
            lanczos_step: None,
        }
    }

    fn cluster(nodes: usize, gbps: f64) -> Cluster {
        Cluster {
            nodes,
            ranks_per_node: 2,
            actors_per_rank: 1,
            cores_per_node: 4,
            memory_per_node: 64 << 30,
            gpus_per_node: 0,
            network: Network::new(gbps, 1e-5),
            transport: Transport::Mpi,
            read_gbps: None,
        }
    }

    /// A world of more actors than any cluster, or one whose count overflows, and a read
    /// bandwidth that is not a positive number are refused naming the parameter, before
    /// the planners' per-actor lists are made (they filled the memory, or overflowed).
    #[test]
    fn absurd_worlds_and_read_bandwidths_are_refused_naming_the_parameter() {
        let w = Workload::Svd;
        for (nodes, ranks_per_node, actors_per_rank) in [
            (10_000_000, 2, 1),
            (usize::MAX, 2, 1),
            (2, usize::MAX / 2 + 1, 1),
            (2, 2, 1 << 30),
        ] {
            let c = Cluster {
                nodes,
                ranks_per_node,
                actors_per_rank,
                ..cluster(1, 100.0)
            };
            let e = predict(80_000, 20, 10_000, &w, &c, &rates()).unwrap_err();
            assert_eq!(
                e.parameter(),
                Some("cluster"),
                "{nodes} × {ranks_per_node}: {e}"
            );
        }
        for g in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
            let c = Cluster {
                read_gbps: Some(g),
                ..cluster(2, 100.0)
            };
            let e = predict(80_000, 20, 10_000, &w, &c, &rates()).unwrap_err();
            assert_eq!(e.parameter(), Some("read_gbps"), "{g}: {e}");
        }
        assert!(predict(80_000, 20, 10_000, &w, &cluster(4096, 100.0), &rates()).is_ok());
        // Fewer passes than any randomized run makes, or more than a run may make.
        for passes in [0, 1, 10_001, usize::MAX] {
            for solver in [Solver::Lobpcg, Solver::Lanczos, Solver::PowerIters] {
                let job = Workload::Pca {
                    k: 10,
                    oversample: 10,
                    passes,
                    solver,
                };
                let e = predict(80_000, 2000, 0, &job, &cluster(2, 100.0), &rates()).unwrap_err();
                assert_eq!(e.parameter(), Some("passes"), "{passes}: {e}");
            }
        }
    }

    /// Block Lanczos's passes are a block wide but the last: less compute a pass than
    /// LOBPCG's `l` columns, messages of `n × 8` values, its last pass as wide as
    /// LOBPCG's, and the memory of its larger basis on the root.
    #[test]
    fn lanczos_passes_are_a_block_wide_but_the_last() {
        let (n, passes) = (20_000u64, 12);
        let job = |solver| Workload::Pca {
            k: 10,
            oversample: 10,
            passes,
            solver,
        };
        let c = cluster(4, 100.0);
        let lob = predict(400_000, n, 0, &job(Solver::Lobpcg), &c, &rates()).unwrap();
        let lan = predict(400_000, n, 0, &job(Solver::Lanczos), &c, &rates()).unwrap();
        let pass = |p: &Prediction, i: usize| p.phases[i].clone();
        for i in 0..passes - 1 {
            let (a, b) = (pass(&lob, i), pass(&lan, i));
            assert!(
                b.compute_seconds < a.compute_seconds,
                "pass {}: {b:?} {a:?}",
                i + 1
            );
            assert!(b.comm_seconds < a.comm_seconds, "pass {}", i + 1);
            assert_eq!(
                b.bytes_sent,
                3 * n * 8 * 8,
                "pass {}: 8 ranks, 3 levels",
                i + 1
            );
        }
        let last = passes - 1;
        assert_eq!(
            pass(&lob, last).compute_seconds,
            pass(&lan, last).compute_seconds
        );
        assert!(lan.memory_per_rank > lob.memory_per_rank);
    }

    #[test]
    fn ranks_beyond_the_cores_share_the_node_by_work() {
        // 8 panels on one node of 2 cores: 1 rank, and 6 ranks of which two hold 2 panels.
        let w = Workload::Svd;
        let node = |ranks_per_node| Cluster {
            nodes: 1,
            ranks_per_node,
            cores_per_node: 2,
            ..cluster(1, 100.0)
        };
        // The passes' compute (the tree's merges follow the panels' owners, not the cores).
        let compute = |p: &Prediction| {
            (p.phases.iter())
                .filter(|x| x.phase.starts_with("pass"))
                .map(|x| x.compute_seconds)
                .sum::<f64>()
        };
        let one = predict(80_000, 20, 10_000, &w, &node(1), &rates()).unwrap();
        let six = predict(80_000, 20, 10_000, &w, &node(6), &rates()).unwrap();
        // The node's two cores do the same work either way: the ranks with one panel leave
        // their core to the others (not 2/8 of the values at a third of a core each).
        let ratio = compute(&six) / compute(&one);
        assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
        // One rank with half the node's panels and two cores of four: its own share binds.
        let two = Cluster {
            nodes: 1,
            ranks_per_node: 2,
            cores_per_node: 4,
            ..cluster(1, 100.0)
        };
        let uneven = predict(30_000, 20, 10_000, &w, &two, &rates()).unwrap();
        let even = predict(40_000, 20, 10_000, &w, &two, &rates()).unwrap();
        // 3 panels on 2 ranks: 2 on the busiest, the same critical path as 4 panels.
        let ratio = compute(&uneven) / compute(&even);
        assert!((ratio - 1.0).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn more_nodes_divide_the_compute_and_a_slower_network_costs_only_communication() {
        let w = Workload::Rsvd {
            k: 10,
            oversample: 10,
            passes: 6,
            solver: Solver::PowerIters,
        };
        let one = predict(1_000_000, 1000, 0, &w, &cluster(1, 100.0), &rates()).unwrap();
        let eight = predict(1_000_000, 1000, 0, &w, &cluster(8, 100.0), &rates()).unwrap();
        let slow = predict(1_000_000, 1000, 0, &w, &cluster(8, 1.0), &rates()).unwrap();
        let compute = |p: &Prediction| p.phases.iter().map(|x| x.compute_seconds).sum::<f64>();
        let comm = |p: &Prediction| p.phases.iter().map(|x| x.comm_seconds).sum::<f64>();
        // Eight times the ranks: an eighth of the values per rank (whole panels: ±1 panel);
        // both keep their panels in memory.
        assert!(one.resident && eight.resident);
        let ratio = compute(&one) / compute(&eight);
        assert!((7.0..=8.5).contains(&ratio), "{ratio}");
        assert_eq!(compute(&eight), compute(&slow));
        assert!(comm(&slow) > comm(&eight));
        // One node: only shared memory.
        assert!(comm(&one) < 1e-3, "{}", comm(&one));
        assert_eq!(one.passes, 6);
        assert_eq!(one.dominant, "compute");
        // The plan's memory: the rank holds at least its panels' sketch rows.
        assert!(eight.memory_per_rank > 0);
    }

    /// Per-GPU rates divide a pass's values among the node's GPUs, not its cores: the
    /// planners see one GPU actor per GPU, and the compute follows the GPUs. A per-GPU
    /// calibration without GPUs, or GPUs that the ranks cannot share evenly, are refused
    /// naming the parameter; CPU rates on GPU nodes are applied with a note.
    #[test]
    fn calibrate_refuses_too_few_or_too_many_values_naming_them() {
        let rt = crate::World::embedded().actors(1).build().unwrap();
        match calibrate(&rt, MIN_CALIBRATION_VALUES - 1) {
            Err(Error::Parameter { parameter, message }) => {
                assert_eq!(parameter, "values", "{message}")
            }
            other => panic!("{:?}", other.map(|r| r.machine)),
        }
        // Measurements too large for the actors' memory: `values` is what to lower.
        let small = crate::World::embedded()
            .actors(1)
            .memory_per_actor(1 << 20)
            .build()
            .unwrap();
        match calibrate(&small, 1 << 26) {
            Err(Error::Parameter { parameter, message }) => {
                assert_eq!(parameter, "values", "{message}");
                assert!(message.contains("cannot hold the workspace"), "{message}");
            }
            other => panic!("{:?}", other.map(|r| r.machine)),
        }
    }

    #[test]
    fn network_texts_parse_with_units_and_refuse_nonsense() {
        let network = |s: &str| s.parse::<Network>();
        assert_eq!(network("100,2us").unwrap(), Network::new(100.0, 2e-6));
        assert_eq!(network("100,2us").unwrap().eager_bytes, 64 << 10);
        assert_eq!(network("1,5ms,1M").unwrap().eager_bytes, 1 << 20);
        assert_eq!(network("1,5ms, 4096").unwrap().eager_bytes, 4096);
        assert_eq!(network("10, 0.5ms").unwrap().latency, 5e-4);
        assert_eq!(network("25,1e-6").unwrap().latency, 1e-6);
        for bad in [
            "100",
            "0,1us",
            "x,1us",
            "10,1 parsec",
            "10,-1us",
            "",
            "10,1us,lots",
            "10,1us,-4K",
            "10,1us,1M,2",
            "inf,1us",
            "10,NaNs",
        ] {
            match network(bad) {
                Err(Error::Parameter { parameter, .. }) => assert_eq!(parameter, "network"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    /// Rates that no calibration writes are refused, naming the field, for every job:
    /// each predicted a run of 0 s, or of infinite length, without a word.
    #[test]
    fn rates_no_calibration_writes_are_refused_naming_the_field() {
        type Edit = fn(&mut Rates);
        let cases: [(&str, Edit); 13] = [
            ("`cores` is 0", |r| r.cores = 0),
            ("`svd` lists no widths", |r| r.svd.clear()),
            ("`svd[1].cols` is 8", |r| r.svd[1].cols = 8),
            ("`svd[0].pass1` is -1", |r| r.svd[0].pass1 = -1.0),
            ("`svd[1].pass2` is 0", |r| r.svd[1].pass2 = 0.0),
            ("`svd[0].merge` is inf", |r| {
                r.svd[0].merge = Some(f64::INFINITY)
            }),
            ("`svd[1].root` is NaN", |r| r.svd[1].root = Some(f64::NAN)),
            ("`dense.produce` is -0.5", |r| r.dense.produce = -0.5),
            ("`genotypes.first` is 0.0 + 0.0·l", |r| {
                r.genotypes.first = PassRate {
                    per_value: 0.0,
                    per_value_column: 0.0,
                }
            }),
            ("`dense.later` is 1.0 + -1.0·l", |r| {
                r.dense.later = PassRate {
                    per_value: 1.0,
                    per_value_column: -1.0,
                }
            }),
            ("`genotypes_f32.later` is 1e308 + inf·l", |r| {
                let mut p = r.genotypes;
                p.later.per_value = 1e308;
                p.later.per_value_column = f64::INFINITY;
                r.genotypes_f32 = Some(p);
            }),
            ("`rayleigh_ritz.parallel` is NaN", |r| {
                let ok = PassRate {
                    per_value: 1e-9,
                    per_value_column: 1e-9,
                };
                r.rayleigh_ritz = Some(RayleighRitzRate {
                    serial: ok,
                    parallel: PassRate {
                        per_value: f64::NAN,
                        ..ok
                    },
                });
            }),
            ("`lanczos_step.serial` is 0.0 + -1.0·l", |r| {
                let ok = PassRate {
                    per_value: 1e-9,
                    per_value_column: 1e-9,
                };
                r.lanczos_step = Some(RayleighRitzRate {
                    serial: PassRate {
                        per_value: 0.0,
                        per_value_column: -1.0,
                    },
                    parallel: ok,
                });
            }),
        ];
        let jobs = [
            Workload::Svd,
            Workload::Rsvd {
                k: 10,
                oversample: 10,
                passes: 4,
                solver: Solver::PowerIters,
            },
            Workload::Pca {
                k: 10,
                oversample: 10,
                passes: 20,
                solver: Solver::Lobpcg,
            },
        ];
        for w in &jobs {
            assert!(predict(1_000_000, 100, 0, w, &cluster(2, 10.0), &rates()).is_ok());
        }
        // Finite but no machine's: the run would outlast any.
        let mut huge = rates();
        for r in &mut huge.svd {
            (r.pass1, r.pass2) = (1e300, 1e300);
        }
        huge.dense.first.per_value = 1e300;
        huge.genotypes.first.per_value = 1e300;
        for w in &jobs {
            match predict(1_000_000, 100, 0, w, &cluster(2, 10.0), &huge) {
                Err(Error::Parameter { parameter, message }) => {
                    assert_eq!(parameter, "rates", "{message}");
                    assert!(message.contains("are not a machine's"), "{message}");
                }
                other => panic!("rates of 1e300 s a value, {w:?}: {other:?}"),
            }
        }
        for (what, edit) in cases {
            let mut r = rates();
            edit(&mut r);
            for w in &jobs {
                match predict(1_000_000, 100, 0, w, &cluster(2, 10.0), &r) {
                    Err(Error::Parameter { parameter, message }) => {
                        assert_eq!(parameter, "rates", "{what}: {message}");
                        assert!(message.starts_with(what), "{what}: {message}");
                    }
                    other => panic!("{what}, {w:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn gpu_rates_divide_the_values_among_the_gpus() {
        let gpu = Rates {
            unit: RateUnit::Gpu,
            cores: 1,
            ..rates()
        };
        let compute = |p: &Prediction| p.phases.iter().map(|x| x.compute_seconds).sum::<f64>();
        for w in [
            Workload::Svd,
            Workload::Rsvd {
                k: 10,
                oversample: 10,
                passes: 6,
                solver: Solver::Lobpcg,
            },
            Workload::Pca {
                k: 10,
                oversample: 10,
                passes: 6,
                solver: Solver::PowerIters,
            },
        ] {
            let on = |gpus: usize, r: &Rates| {
                let c = Cluster {
                    gpus_per_node: gpus,
                    ..cluster(4, 100.0)
                };
                predict(2_000_000, 100, 62_500, &w, &c, r)
            };
            // Four cores a node (two ranks of two) with per-core rates, four GPUs a node
            // (two a rank) with the same rates per GPU: the same compute.
            let cpu = on(0, &rates()).unwrap();
            let four = on(4, &gpu).unwrap();
            let eight = on(8, &gpu).unwrap();
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
            let tree = |p: &Prediction| {
                p.phases
                    .iter()
                    .filter(|x| x.phase.starts_with("tree") || x.phase.starts_with("Rayleigh"))
                    .map(|x| x.compute_seconds)
                    .sum::<f64>()
            };
            assert!(
                close(compute(&four) - tree(&four), compute(&cpu) - tree(&cpu)),
                "{w:?}: {} vs {}",
                compute(&four),
                compute(&cpu)
            );
            // Twice the GPUs: half the passes' compute (32 panels on 16 or 32 GPUs).
            let passes = |p: &Prediction| compute(p) - tree(p);
            assert!(
                close(passes(&eight) * 2.0, passes(&four)),
                "{w:?}: {} vs {}",
                passes(&eight),
                passes(&four)
            );
            assert!(four.notes.iter().all(|n| !n.contains("CPU calibration")));
            // CPU rates on GPU nodes: applied, and said.
            let said = on(4, &rates()).unwrap();
            assert!(said.notes.iter().any(|n| n.contains("CPU calibration")));
            for gpus in [0, 3] {
                match on(gpus, &gpu) {
                    Err(Error::Parameter { parameter, .. }) => {
                        assert_eq!(parameter, "gpus_per_node")
                    }
                    other => panic!("{gpus} GPUs: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn svd_rates_interpolate_between_calibrated_widths_and_refuse_bad_clusters() {
        let r = rates();
        assert_eq!(r.svd_at(4), (1e-9, 5e-10));
        let (mid, _) = r.svd_at(64);
        assert!((mid - 32.5e-9).abs() < 1e-12, "{mid}");
        assert_eq!(r.svd_at(1024).0, 128e-9);
        let mut c = cluster(2, 10.0);
        c.network.gbps = 0.0;
        let e = predict(1000, 10, 0, &Workload::Svd, &c, &r).unwrap_err();
        assert_eq!(e.parameter(), Some("network"));
        // Each count of the cluster named on its own.
        type Edit = fn(&mut Cluster);
        let zeros: [(&str, Edit); 4] = [
            ("nodes", |c| c.nodes = 0),
            ("ranks_per_node", |c| c.ranks_per_node = 0),
            ("actors_per_rank", |c| c.actors_per_rank = 0),
            ("cores_per_node", |c| c.cores_per_node = 0),
        ];
        for (rows, cols, name) in [(0, 10, "rows"), (1000, 0, "cols")] {
            let e = predict(rows, cols, 0, &Workload::Svd, &cluster(2, 10.0), &r).unwrap_err();
            assert_eq!(e.parameter(), Some(name), "{e}");
        }
        for (name, edit) in zeros {
            let mut c = cluster(2, 10.0);
            edit(&mut c);
            let e = predict(1000, 10, 0, &Workload::Svd, &c, &r).unwrap_err();
            assert_eq!(e.parameter(), Some(name), "{e}");
        }
        // A node whose memory cannot hold one panel's workspace: the node's memory is what
        // to raise, whatever the job.
        for w in [
            Workload::Svd,
            Workload::Pca {
                k: 10,
                oversample: 10,
                passes: 10,
                solver: Solver::Lobpcg,
            },
        ] {
            let c = Cluster {
                memory_per_node: 1 << 20,
                ..cluster(2, 10.0)
            };
            let e = predict(10_000_000, 500, 0, &w, &c, &r).unwrap_err();
            assert_eq!(e.parameter(), Some("memory_per_node"), "{e}");
            assert!(e.to_string().contains("1.0 MiB a node, 2 ranks"), "{e}");
        }
    }

    #[test]
    fn the_exact_svds_tree_counts_the_roots_merges_and_its_svd() {
        // One rank merges all its panels; a root with half the panels merges its half,
        // then once a level above it.
        let root_merges =
            |owners: &[usize]| rankwise_linalg::Tree::new(owners).merges_made_by(owners[0]);
        assert_eq!(root_merges(&[0]), 0);
        assert_eq!(root_merges(&[0; 5]), 4);
        assert_eq!(root_merges(&[0, 0, 1, 1]), 2);
        assert_eq!(root_merges(&[0, 0, 0, 0, 1, 1, 1, 1]), 4);
        assert_eq!(root_merges(&[0, 0, 1, 1, 2, 2, 3, 3]), 3);
        let r = rates();
        // Interpolated per n³ between the widths, the narrowest's seconds below them.
        assert_eq!(r.svd_tree_at(4), Some((1e-5, 2e-5)));
        let (merge, root) = r.svd_tree_at(1024).unwrap();
        assert!((merge / (1024f64.powi(3) * 1e-10) - 1.0).abs() < 1e-12);
        assert!((root / (1024f64.powi(3) * 4e-10) - 1.0).abs() < 1e-12);
        let tree = |rows: u64, cols: u64, chunk: u64, nodes: usize, r: &Rates| {
            let mut c = cluster(nodes, 1e6);
            c.ranks_per_node = 1;
            let p = predict(rows, cols, chunk, &Workload::Svd, &c, r).unwrap();
            let t = p
                .phases
                .iter()
                .find(|p| p.phase.starts_with("tree"))
                .unwrap();
            (t.compute_seconds, p.notes.clone())
        };
        // 8 panels on one node of one rank: 7 merges and the root's SVD.
        let (one, _) = tree(8 * 1024, 512, 1024, 1, &r);
        let m = 512f64.powi(3);
        assert!(
            (one - m * (7.0 * 1e-10 + 4e-10)).abs() < 1e-9 * one,
            "{one}"
        );
        // On two nodes the root merges its 4 panels' subtree and once above it.
        let (two, _) = tree(8 * 1024, 512, 1024, 2, &r);
        assert!(
            (two - m * (4.0 * 1e-10 + 4e-10)).abs() < 1e-9 * two,
            "{two}"
        );
        // An older calibration file has no tree rates, and the prediction says so.
        let mut old = r.clone();
        for w in &mut old.svd {
            (w.merge, w.root) = (None, None);
        }
        let (none, notes) = tree(8 * 1024, 512, 1024, 1, &old);
        assert_eq!(none, 0.0);
        assert!(
            notes.iter().any(|n| n.contains("no tree rates")),
            "{notes:?}"
        );
    }

    #[test]
    fn a_pass_overlaps_its_own_reads_and_kept_panels_are_read_once() {
        let job = Workload::Rsvd {
            k: 10,
            oversample: 10,
            passes: 4,
            solver: Solver::PowerIters,
        };
        let (m, n) = (400_000u64, 200u64);
        for (memory, kept) in [(64u64 << 30, true), (600 << 20, false)] {
            let mut c = cluster(1, 100.0);
            c.memory_per_node = memory;
            c.read_gbps = Some(0.5);
            let p = predict(m, n, 10_000, &job, &c, &rates()).unwrap();
            assert_eq!(p.resident, kept, "{p:?}");
            let passes: Vec<_> = (p.phases.iter())
                .filter(|ph| ph.phase.starts_with("pass"))
                .collect();
            assert_eq!(passes.len(), 4);
            // The busiest node's share of the matrix, 8 bytes a value, at 0.5 GB/s: the two
            // ranks of the node read half of it each.
            let whole = (m * n * 8) as f64 / 0.5e9;
            assert!(
                (passes[0].read_seconds - whole).abs() < 1e-9 * whole,
                "{p:?}"
            );
            for ph in &passes[1..] {
                let want = if kept { 0.0 } else { whole };
                assert!((ph.read_seconds - want).abs() < 1e-9 * whole, "{p:?}");
            }
            // Each pass takes the longer of its compute and its reads, never overlapping
            // another pass's.
            let each: f64 = passes
                .iter()
                .map(|ph| ph.compute_seconds.max(ph.read_seconds))
                .sum();
            let comm: f64 = p.phases.iter().map(|ph| ph.comm_seconds).sum();
            assert!((p.seconds - each - comm).abs() < 1e-9, "{p:?}");
            let compute: f64 = passes.iter().map(|ph| ph.compute_seconds).sum();
            let read: f64 = passes.iter().map(|ph| ph.read_seconds).sum();
            assert!(p.seconds > compute.max(read), "{p:?}");
        }
    }

    #[test]
    fn storage_dominates_when_it_is_slow() {
        let mut c = cluster(1, 100.0);
        c.read_gbps = Some(0.001);
        let p = predict(
            1_000_000,
            1000,
            0,
            &Workload::Pca {
                k: 10,
                oversample: 10,
                passes: 4,
                solver: Solver::PowerIters,
            },
            &c,
            &rates(),
        )
        .unwrap();
        assert_eq!(p.dominant, "storage");
    }

    #[test]
    fn lobpcg_passes_run_at_the_float32_rates_but_the_last_and_send_two_blocks() {
        let mut r = rates();
        let half = |p: PassRates| PassRates {
            produce: p.produce,
            first: PassRate {
                per_value: p.first.per_value / 2.0,
                per_value_column: p.first.per_value_column / 2.0,
            },
            later: PassRate {
                per_value: p.later.per_value / 2.0,
                per_value_column: p.later.per_value_column / 2.0,
            },
        };
        r.genotypes_f32 = Some(half(r.genotypes));
        let job = |solver| Workload::Pca {
            k: 10,
            oversample: 10,
            passes: 5,
            solver,
        };
        let c = cluster(4, 10.0);
        let lob = predict(1_000_000, 1000, 0, &job(Solver::Lobpcg), &c, &r).unwrap();
        let fixed = predict(1_000_000, 1000, 0, &job(Solver::PowerIters), &c, &r).unwrap();
        // Passes 1–4 at half the cost, the last at the float64 one.
        for (p, (a, b)) in lob.phases.iter().zip(&fixed.phases).enumerate() {
            let want = if p < 4 { 0.5 } else { 1.0 };
            let ratio = a.compute_seconds / b.compute_seconds;
            assert!((ratio - want).abs() < 1e-9, "pass {}: {ratio}", p + 1);
            // Two n × l blocks a pass, against l × l factors and one block.
            assert!(a.comm_seconds > b.comm_seconds, "pass {}", p + 1);
        }
        // Without float32 rates (an older calibration) the model says what it did instead.
        let old = predict(1_000_000, 1000, 0, &job(Solver::Lobpcg), &c, &rates()).unwrap();
        assert!(
            old.notes.iter().any(|n| n.contains("float32")),
            "{:?}",
            old.notes
        );
        let fixed_old = predict(1_000_000, 1000, 0, &job(Solver::PowerIters), &c, &rates());
        assert_eq!(
            old.phases[0].compute_seconds,
            fixed_old.unwrap().phases[0].compute_seconds
        );
    }

    /// LOBPCG's Rayleigh–Ritz steps: one a pass, on the root's cores (one per chunk of
    /// rows of the samples), growing with the samples and not with the variants or nodes;
    /// none for fixed power iterations, and a note where the calibration has no rate.
    #[test]
    fn rayleigh_ritz_steps_grow_with_the_samples_on_the_root_alone() {
        let mut r = rates();
        r.rayleigh_ritz = Some(RayleighRitzRate {
            serial: PassRate {
                per_value: 0.0,
                per_value_column: 0.0,
            },
            parallel: PassRate {
                per_value: 1e-6,
                per_value_column: 1e-6,
            },
        });
        let job = |solver| Workload::Pca {
            k: 10,
            oversample: 10,
            passes: 5,
            solver,
        };
        let steps = |p: &Prediction| {
            let s: Vec<_> = p
                .phases
                .iter()
                .filter(|x| x.phase.starts_with(ROOT_STEPS))
                .collect();
            assert!(s.len() <= 1, "{:?}", p.phases);
            s.first().map(|x| x.compute_seconds)
        };
        // 4 nodes of 4 cores, 2 ranks each: the root rank has 2 cores. 100,000 samples
        // are 25 chunks of 4,096 rows: both cores; 5 passes of 100,000 × 20 × (1e-6 + 20e-6)
        // core-seconds over 2.
        let c = cluster(4, 10.0);
        let p = predict(1_000_000, 100_000, 0, &job(Solver::Lobpcg), &c, &r).unwrap();
        let want = 5.0 * 100_000.0 * 20.0 * 21e-6 / 2.0;
        let got = steps(&p).expect("a Rayleigh–Ritz phase");
        assert!((got - want).abs() < 1e-9 * want, "{got} against {want}");
        let got_lobpcg = got;
        // Twice the variants, or twice the nodes: the same steps.
        let more = predict(2_000_000, 100_000, 0, &job(Solver::Lobpcg), &c, &r).unwrap();
        let wider = predict(
            1_000_000,
            100_000,
            0,
            &job(Solver::Lobpcg),
            &cluster(8, 10.0),
            &r,
        )
        .unwrap();
        assert_eq!(steps(&more), Some(got));
        assert_eq!(steps(&wider), Some(got));
        // 4,000 samples are one chunk: one thread, whatever the cores.
        let small = predict(1_000_000, 4_000, 0, &job(Solver::Lobpcg), &c, &r).unwrap();
        let want = 5.0 * 4_000.0 * 20.0 * 21e-6;
        let got = steps(&small).unwrap();
        assert!((got - want).abs() < 1e-9 * want, "{got} against {want}");
        assert!(small
            .phases
            .iter()
            .any(|x| x.phase.contains("on 1 thread)")));
        // Steps that outweigh the passes, the network and storage are the dominant cost,
        // and count in the total.
        assert_eq!(p.dominant, ROOT_STEPS);
        let total: f64 = p
            .phases
            .iter()
            .map(|x| x.compute_seconds + x.comm_seconds)
            .sum();
        assert!((p.seconds - total).abs() < 1e-9 * total);
        // A part that runs on one thread is not divided among them.
        let mut r2 = r.clone();
        r2.rayleigh_ritz.as_mut().unwrap().serial.per_value = 2e-6;
        let p2 = predict(1_000_000, 100_000, 0, &job(Solver::Lobpcg), &c, &r2).unwrap();
        let want = 5.0 * 100_000.0 * 20.0 * (2e-6 + 21e-6 / 2.0);
        let got = steps(&p2).unwrap();
        assert!((got - want).abs() < 1e-9 * want, "{got} against {want}");
        // Fixed power iterations have no such step; an older calibration says it is missing.
        let fixed = predict(1_000_000, 100_000, 0, &job(Solver::PowerIters), &c, &r).unwrap();
        assert_eq!(steps(&fixed), None);
        let old = predict(1_000_000, 100_000, 0, &job(Solver::Lobpcg), &c, &rates()).unwrap();
        assert_eq!(steps(&old), None);
        assert!(
            old.notes.iter().any(|n| n.contains("Rayleigh–Ritz")),
            "{:?}",
            old.notes
        );
        // Block Lanczos: its own step where the calibration measured one (a tenth of
        // LOBPCG's here), and LOBPCG's, with a note, where it did not.
        let lanczos =
            |r: &Rates| predict(1_000_000, 100_000, 0, &job(Solver::Lanczos), &c, r).unwrap();
        let lobpcg_rate = lanczos(&r);
        assert_eq!(steps(&lobpcg_rate), Some(got_lobpcg));
        assert!(
            lobpcg_rate
                .notes
                .iter()
                .any(|n| n.contains("no block Lanczos step")),
            "{:?}",
            lobpcg_rate.notes
        );
        let mut r3 = r.clone();
        r3.lanczos_step = Some(RayleighRitzRate {
            serial: PassRate {
                per_value: 0.0,
                per_value_column: 0.0,
            },
            parallel: PassRate {
                per_value: 1e-7,
                per_value_column: 1e-7,
            },
        });
        let own = lanczos(&r3);
        let want = 5.0 * 100_000.0 * 20.0 * 21e-7 / 2.0;
        let got = steps(&own).unwrap();
        assert!((got - want).abs() < 1e-9 * want, "{got} against {want}");
        assert!(
            !own.notes.iter().any(|n| n.contains("block Lanczos step")),
            "{:?}",
            own.notes
        );
        // LOBPCG keeps its own.
        let lob = predict(1_000_000, 100_000, 0, &job(Solver::Lobpcg), &c, &r3).unwrap();
        assert_eq!(steps(&lob), Some(got_lobpcg));
    }

    /// Over UCX a message is one message: the latency, the bytes, and past the eager limit
    /// the rendezvous's round trip. Over MPI a payload past 64 KiB also waits for the
    /// go-ahead, and one within it carries its 8-byte header.
    #[test]
    fn a_message_past_the_eager_limit_waits_a_round_trip_more() {
        let net = Network::new(8.0, 1e-3);
        let eager = TCP_EAGER_BYTES as f64;
        let near = |got: f64, want: f64| assert!((got - want).abs() < 1e-12, "{got} != {want}");
        near(net.seconds(eager, Transport::Ucx), 1e-3 + eager / 1e9);
        near(
            net.seconds(eager + 1.0, Transport::Ucx),
            3e-3 + (eager + 1.0) / 1e9,
        );
        // The header makes a 64 KiB payload one MPI message past the limit.
        near(
            net.seconds(eager - 8.0, Transport::Mpi),
            1e-3 + (eager - 8.0) / 1e9,
        );
        near(net.seconds(eager, Transport::Mpi), 3e-3 + eager / 1e9);
        // Past 64 KiB: header, go-ahead, then the rendezvous of the data.
        near(
            net.seconds(eager + 1.0, Transport::Mpi),
            5e-3 + (eager + 1.0) / 1e9,
        );
        // With a larger eager limit only the go-ahead remains.
        let big = Network {
            eager_bytes: 1 << 20,
            ..net
        };
        near(big.seconds(300e3, Transport::Mpi), 3e-3 + 300e3 / 1e9);
        near(big.seconds(300e3, Transport::Ucx), 1e-3 + 300e3 / 1e9);
        near(big.seconds(2e6, Transport::Ucx), 3e-3 + 2e6 / 1e9);
    }
}
