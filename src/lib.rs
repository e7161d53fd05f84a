//! rankwise: distributed SVD and PCA of matrices too large for one machine.
//!
//! Every rank hosts actors pinned to CPU NUMA domains (or GPUs); each actor owns whole row
//! panels of the matrix, and only small matrices — the R factors of the TSQR tree, the
//! projections of the randomized SVD — travel between ranks.
//!
//! # The library
//!
//! A [`World`] gives the runtime of this rank (embedded, or on an MPI communicator);
//! [`open`] names an input; [`pca`] and [`rsvd`] compute on it. Every rank calls them, and
//! every rank gets the same result, which says whether each component converged.
//!
//! A randomized SVD of a Zarr array:
//!
//! ```
//! # use rankwise::output::gen_store::{Codec, DType, GenLayout, GenStore, Shuffle, ZarrFormat};
//! # let dir = std::env::temp_dir().join(format!("rankwise-doc-rsvd-{}", std::process::id()));
//! # let _ = std::fs::remove_dir_all(&dir);
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let store = dir.join("a.zarr");
//! # let source = rankwise::sources::Generated::new(3000, 40, 1, rankwise::sources::Dist::Normal);
//! # let layout = GenLayout { source, chunk_rows: 500, chunk_cols: 40, shard_rows: None,
//! #     dtype: DType::F64, format: ZarrFormat::V3, codec: Codec::BloscLz4, shuffle: Shuffle::Byte };
//! # let panels: Vec<usize> = (0..layout.panels()).collect();
//! # let w = GenStore::create(&store, &dir.join("tmp"), layout).unwrap();
//! # w.write_panels(&panels).unwrap();
//! # w.commit().unwrap();
//! # drop(w);
//! let rt = rankwise::World::embedded().build()?;
//! let a = rankwise::open(store.to_str().unwrap())?;
//! let svd = rankwise::rsvd(&rt, &a, &rankwise::RsvdOptions { k: 5, ..Default::default() })?;
//! assert!(svd.convergence.converged);
//! println!("σ = {:?}", svd.s);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The PCA of a PLINK fileset is [`genomics::pca`]'s example.
//!
//! # The crates, and the direction of their dependencies
//!
//! ```text
//! transports → device → exec → sources → linalg → genomics → output → rankwise (this facade) → { rankwise-launch (CLI), rankwise-capi, rankwise-python }
//! ```
//!
//! `tests/architecture.rs` holds the code to this map: no crate depends on one above it,
//! and no crate's modules form a cycle.
//!
//! * [`transports`]: the `Comm` trait and its `Local`, MPI and UCX transports: point to
//!   point and collective exchange of small matrices, and the announcement of a rank's
//!   failure to the others.
//! * [`device`]: CUDA through cudarc, every library loaded at run time: the probe, one
//!   device's context, stream, cuBLAS and cuSOLVER handles and NVRTC-compiled kernels,
//!   NCCL, and pinned staging buffers. It sits below execution because a GPU actor owns
//!   its device.
//! * [`exec`]: execution: the topology, actors pinned to NUMA domains or GPUs, the chunk
//!   grid and the placement of panels, the memory budget, and the [`Runtime`] of a rank.
//! * [`sources`]: data input: Zarr through zarrs and a Blosc fast path, VCF Zarr, PLINK
//!   `.bed`, the counter-based generator, sample and variant subsets, and the read-ahead
//!   of stored panels within the budget.
//! * [`linalg`]: panel kernels, TSQR, the exact SVD, the randomized SVD (LOBPCG, subspace
//!   iteration, block Krylov) with its convergence report, genotype standardization and
//!   the QC filters.
//! * [`genomics`]: PLINK 2's sample, variant and chromosome selection, the genotype PCA
//!   (its eigenvalues on PLINK 2's scale) and its `.eigenvec` and `.eigenval` files.
//! * [`output`]: the Zarr result group committed by one rename, opened on every rank
//!   under one temporary name and removed on every rank when a run fails
//!   ([`output::publish`]), generated Zarr stores, and the registry of temporaries a signal
//!   removes.
//! * this crate: [`World`], [`open`], [`svd`], [`rsvd`] and [`pca`], with one [`Error`];
//!   [`pca_to_group`] and [`pca_group`] publish a PCA's group and PLINK 2's side files, all
//!   or nothing on every rank (what `rankwise pca --out` and Python's `pca(out=)` write);
//!   [`memory`] reads a matrix or genotypes the caller holds in place, and `host_mpi` takes
//!   a host program's communicator. It has no command line and no plotting.
//! * `rankwise-launch`: the `rankwise` command: flags mapped to these parameters, the
//!   launcher (mpirun, srun) detected, reports printed, plots drawn.
//! * `rankwise-capi`: the C and Fortran library over the same calls.
//! * `rankwise-python`: the Python package's native module (`python/`, built by maturin),
//!   over the same calls.
//!
//! `rankwise-testkit` holds what every crate's tests share (mpirun under a time limit,
//! seeded draws, scratch directories); it is a dev-dependency only.

/// The README's examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod error;
#[cfg(feature = "mpi")]
pub mod host_mpi;
pub mod memory;
mod open;
pub mod pca_group;
pub mod process;
pub mod sizing;

pub use error::Error;
pub use open::{open, Input};
pub use rankwise_exec::{Runtime, RuntimeConfig};
pub use rankwise_linalg::{Convergence, LocalRows, Method, Precision, RsvdOptions, RsvdResult};

pub use rankwise_device as device;
pub use rankwise_device::DeviceChoice;
pub use rankwise_exec as exec;
pub use rankwise_genomics as genomics;
pub use rankwise_linalg as linalg;
pub use rankwise_output as output;
pub use rankwise_sources as sources;
pub use rankwise_transports as transports;

use rankwise_exec::{actor_specs, CoreShare, RuntimeError, Topology};
use rankwise_transports::{Comm, LocalWorld, TransportError};

/// What a client does when a call failed on this rank with `error` while other ranks may
/// still wait for it in a collective: unless the error already passes on a peer's notice,
/// it is announced to every rank, whose waits then fail naming this rank. If a peer's
/// notice arrives first (within [`transports::PEER_NOTICE_WAIT`]), this rank's error is
/// likely its consequence, and the peer's failure is returned instead: the cause every
/// rank should report. A bad argument ([`Error::parameter`]) is announced too, in case
/// this rank alone refused it, but stays this rank's error: the ranks that agreed on the
/// arguments refuse them alike. On one rank, `error` is returned unchanged.
pub fn fail_collectively(rt: &Runtime, error: Error) -> Error {
    if rt.comm().size() < 2 || error.peer_failure().is_some() {
        return error;
    }
    match transports::announce_failure(rt.comm(), &|| error.to_string()) {
        Some(_) if error.parameter().is_some() => error,
        Some((rank, message)) => Error::Transport(TransportError::PeerFailed { rank, message }),
        None => error,
    }
}

/// A one-rank runtime on the `Local` transport: the embedded default.
pub fn embedded(config: &RuntimeConfig) -> Result<Runtime, RuntimeError> {
    with_comm(Box::new(LocalWorld::create(1).remove(0)), config)
}

/// A runtime on a given transport, with actors from this machine's topology.
pub fn with_comm(comm: Box<dyn Comm>, config: &RuntimeConfig) -> Result<Runtime, RuntimeError> {
    rankwise_linalg::init_blas_threads();
    let topology = Topology::detect();
    Runtime::new(comm, actor_specs(&topology, config)?)
}

/// Runs `f` on `ranks` ranks of the `Local` transport, one thread each, and returns every
/// rank's result in rank order. Each rank gets `config` with its local rank filled in.
pub fn local_world<T, F>(ranks: usize, config: &RuntimeConfig, f: F) -> Vec<Result<T, RuntimeError>>
where
    T: Send + 'static,
    F: Fn(Runtime) -> T + Send + Sync + 'static,
{
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = LocalWorld::create(ranks)
        .into_iter()
        .enumerate()
        .map(|(r, comm)| {
            let f = std::sync::Arc::clone(&f);
            let cfg = RuntimeConfig {
                local_rank: r,
                local_size: ranks,
                // The ranks are threads of this process: they share its cores out.
                core_share: CoreShare::ByLocalRank,
                ..config.clone()
            };
            std::thread::spawn(move || with_comm(Box::new(comm), &cfg).map(|rt| f(rt)))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

/// A runtime on a communicator of a program that already initialized MPI (for HPC codes
/// that link rankwise): every rank of `comm` must call this, and rankwise never finalizes
/// MPI. Call it on the thread that initialized MPI; the runtime stays on that thread.
#[cfg(feature = "mpi")]
pub fn from_mpi_communicator(
    comm: rankwise_transports::mpi_comm::mpi::topology::SimpleCommunicator,
    config: &RuntimeConfig,
) -> Result<Runtime, RuntimeError> {
    with_comm(
        Box::new(rankwise_transports::MpiComm::from_communicator(comm)),
        config,
    )
}

/// How this rank's runtime is made: embedded (one rank, the `Local` transport), or on a
/// communicator of an MPI program. A builder: `World::embedded().actors(2).build()`.
#[derive(Clone, Debug)]
pub struct World {
    config: RuntimeConfig,
}

impl World {
    /// One rank in this process, with actors on this machine's NUMA domains (GPU actors
    /// with [`World::device`]).
    pub fn embedded() -> World {
        World {
            config: RuntimeConfig::default(),
        }
    }

    /// Actors on this rank (default: one per NUMA domain, or per GPU).
    pub fn actors(mut self, n: usize) -> World {
        self.config.actors = Some(n);
        self
    }

    /// Worker threads per actor (default: the actor's cores).
    pub fn threads_per_actor(mut self, n: usize) -> World {
        self.config.threads_per_actor = Some(n);
        self
    }

    /// Memory budget of each actor in bytes; plans that need more are refused before any
    /// work, naming what they need.
    pub fn memory_per_actor(mut self, bytes: u64) -> World {
        self.config.memory_per_actor = Some(bytes);
        self
    }

    /// Whether actor threads are pinned to their cores (default: yes).
    pub fn pin(mut self, pin: bool) -> World {
        self.config.pin = pin;
        self
    }

    /// Where the actors compute (default [`DeviceChoice::Cpu`]): `Gpu` gives the rank one
    /// actor per GPU it is given and is an error, naming what is missing, where CUDA,
    /// cuBLAS, NVRTC or a device is; `Auto` uses GPUs where all are present, else the CPUs
    /// (the command line's `--device auto`).
    pub fn device(mut self, device: DeviceChoice) -> World {
        self.config.device = device;
        self
    }

    /// Every setting at once.
    pub fn config(mut self, config: RuntimeConfig) -> World {
        self.config = config;
        self
    }

    /// The runtime of this process's single rank.
    pub fn build(&self) -> Result<Runtime, Error> {
        Ok(embedded(&self.config)?)
    }

    /// The runtime of this rank of `comm`, a communicator of a program that initialized
    /// MPI itself: see [`from_mpi_communicator`].
    #[cfg(feature = "mpi")]
    pub fn build_on(
        &self,
        comm: rankwise_transports::mpi_comm::mpi::topology::SimpleCommunicator,
    ) -> Result<Runtime, Error> {
        Ok(from_mpi_communicator(comm, &self.config)?)
    }
}

/// The genotype PCA of `input` (a PLINK fileset, a VCF Zarr store or a Zarr array of
/// dosages) on the ranks of `rt`: [`genomics::pca`] of [`Input::genotypes`], with its
/// errors as this crate's [`Error`]. Every rank calls it and gets the result.
pub fn pca(
    rt: &Runtime,
    input: &Input,
    params: &genomics::PcaParams,
) -> Result<genomics::Pca, Error> {
    Ok(genomics::pca(rt, input.genotypes()?, params)?)
}

/// [`pca`], with the results published as files on every rank, all or nothing: the Zarr
/// group `files.out` in sgkit's layout (`U`, `S`, `Vt`, the residuals, PLINK 2's
/// eigenvalues, the samples' and variants' names and each variant's frequency, calls and
/// loadings), PLINK 2's `OUT.eigenvec` and `OUT.eigenval`, and what [`project`] reads
/// (`OUT.eigenvec.var`, `OUT.afreq`): see [`pca_group`]. Existing results are never
/// overwritten; a failure on any rank leaves none of the files behind, and every rank
/// returns it. `params.weights` is refused: the group's side files hold the weights.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("rankwise-doc-group-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let prefix = dir.join("cohort");
/// # rankwise::genomics::write_example_fileset(&prefix, 400, 60, 7).unwrap();
/// use rankwise::genomics::PcaParams;
/// use rankwise::pca_group::PcaFiles;
///
/// let rt = rankwise::World::embedded().build()?;
/// let cohort = rankwise::open(prefix.to_str().unwrap())?;
/// let out = dir.join("pcs.zarr");
/// let pca = rankwise::pca_to_group(&rt, &cohort, &PcaParams::default(), PcaFiles::new(&out))?;
/// assert!(pca.convergence.converged);
/// assert!(out.join("U").is_dir() && out.with_extension("eigenvec").is_file());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pca_to_group(
    rt: &Runtime,
    input: &Input,
    params: &genomics::PcaParams,
    files: pca_group::PcaFiles,
) -> Result<genomics::Pca, Error> {
    if params.weights.is_some() {
        return Err(Error::Parameter {
            parameter: "weights",
            message: "the group's side files hold the weights (`OUT.eigenvec.var`, \
                      `OUT.afreq`, `OUT.eigenval`): leave it unset"
                .into(),
        });
    }
    let problem = genomics::pca_problem(input.genotypes()?, params, |p| p)?;
    let group = pca_group::PcaGroup::open(rt, files, &problem, params.solver.k)?;
    let run = (|| {
        let mut sink = group.sink(&problem);
        let loadings = params.loadings.then(|| LocalRows::collect(params.solver.k));
        if let Some((collect, _)) = &loadings {
            let (write, collect) = (sink, std::sync::Arc::clone(collect));
            sink = std::sync::Arc::new(move |panel, rows: std::ops::Range<u64>, f| {
                write(panel, rows.clone(), f)?;
                collect(panel, rows, f)
            });
        }
        let result = linalg::rsvd(rt, &problem, &params.solver, Some(sink))?;
        let c = &result.convergence;
        if params.require_converged && !c.converged {
            return Err(Error::NotConverged(c.describe("PC")));
        }
        // Every rank's actors have written their rows of `U` before rank 0 completes the
        // group.
        rt.comm().barrier()?;
        if rt.rank() == 0 {
            group.write_result(&problem, &result)?;
        }
        group.commit(rt, &[])?;
        let mut pca = genomics::Pca::of(&problem, &result);
        pca.loadings =
            loadings.map(|(_, rows)| genomics::loadings_of(&problem, &result, rows.finish()));
        Ok(pca)
    })();
    match run {
        Ok(pca) => Ok(pca),
        Err(e) => {
            // A peer's failure was announced by that peer: this rank only cleans up.
            let own = || e.to_string();
            let announce = e.peer_failure().is_none();
            group.abandon(rt, announce.then_some(&own as &dyn Fn() -> String));
            Err(e)
        }
    }
}

/// The PCs of the samples of `input` (genotypes) on the axes of an earlier PCA, whose
/// `PREFIX.eigenvec.var`, `PREFIX.afreq` and `PREFIX.eigenval` are at `pca` (written by
/// [`genomics::PcaParams::weights`], by `rankwise pca --out`, or by `plink2 --pca var-wts`
/// and `--freq`): every rank calls it and gets the result. Variants match by ID and
/// allele, as `plink2 --score` matches them; see [`genomics::projection`].
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("rankwise-doc-project-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let prefix = dir.join("cohort");
/// # rankwise::genomics::write_example_fileset(&prefix, 400, 60, 7).unwrap();
/// use rankwise::genomics::PcaParams;
///
/// let rt = rankwise::World::embedded().build()?;
/// let cohort = rankwise::open(prefix.to_str().unwrap())?;
/// let run = dir.join("run");
/// let params = PcaParams { weights: Some(run.clone()), ..Default::default() };
/// let pca = rankwise::pca(&rt, &cohort, &params)?;
/// // The PCA's own samples land where the PCA put them.
/// let projected = rankwise::project(&rt, &cohort, &run, None)?;
/// assert!((&projected.pcs - &pca.pcs).iter().all(|d| d.abs() < 1e-6));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn project(
    rt: &Runtime,
    input: &Input,
    pca: &std::path::Path,
    panel_rows: Option<u64>,
) -> Result<genomics::projection::Projection, Error> {
    let weights = std::sync::Arc::new(genomics::projection::Weights::read(pca)?);
    Ok(genomics::projection::project(
        rt,
        input.genotypes()?,
        &weights,
        panel_rows,
    )?)
}

/// The randomized SVD of `input` (a Zarr array of numbers, or a matrix in memory) on the
/// ranks of `rt`: every rank calls it and gets `s`, `Vᵀ` (`wt`, rows of the right singular
/// vectors) and the [`Convergence`] report. `options.seed` seeds the test matrix.
pub fn rsvd(rt: &Runtime, input: &Input, options: &RsvdOptions) -> Result<RsvdResult, Error> {
    let problem = rsvd_problem(input)?;
    Ok(rankwise_linalg::rsvd(rt, &problem, options, None)?)
}

/// [`rsvd`], with the distributed factor too: the rows of `U` this rank holds (of `V`,
/// when the input was factored through its transpose: see [`RsvdResult::transposed`]).
pub fn rsvd_with_factor(
    rt: &Runtime,
    input: &Input,
    options: &RsvdOptions,
) -> Result<(RsvdResult, LocalRows), Error> {
    let problem = rsvd_problem(input)?;
    let (sink, rows) = LocalRows::collect(options.k);
    let result = rankwise_linalg::rsvd(rt, &problem, options, Some(sink))?;
    Ok((result, rows.finish()))
}

/// The exact SVD (TSQR) of `input` (a Zarr array of numbers, or a matrix in memory) on
/// the ranks of `rt`: every rank calls it and gets every singular value, `Vᵀ` (`wt`) and
/// the rows of `U` it holds (of `V` for a transposed input, as for [`rsvd_with_factor`]).
pub fn svd(
    rt: &Runtime,
    input: &Input,
    options: &linalg::SvdOptions,
) -> Result<(linalg::SvdResult, LocalRows), Error> {
    let (source, transposed) = input.matrix()?;
    let (m, n) = source.shape();
    let (panel_rows, rank_panels) = panels_of(input, source.as_ref());
    let problem = linalg::SvdProblem {
        grid: exec::ChunkGrid::new(m, n, panel_rows)?,
        source,
        transposed,
        rank_panels,
    };
    let (sink, rows) = LocalRows::collect(n as usize);
    let result = linalg::svd(rt, &problem, options, Some(sink))?;
    Ok((result, rows.finish()))
}

/// The rate, in bytes of float64 values per second, at which the compute threads of every
/// rank produce `input`'s values (generate them, or read and decode them), summed over the
/// ranks: [`linalg::production_peak`] on this rank's first panel. With
/// [`linalg::gemm_peak`] it makes the machine limit of an exact SVD's passes
/// ([`output::report::MachineLimit::with_production`], with the `produced_bytes` and
/// `flops` of [`svd`]'s phases). Collective: every rank calls it, after the run.
pub fn production_peak(rt: &Runtime, input: &Input) -> Result<f64, Error> {
    let (source, _) = input.matrix()?;
    let (m, n) = source.shape();
    let (panel_rows, rank_panels) = panels_of(input, source.as_ref());
    let grid = exec::ChunkGrid::new(m, n, panel_rows)?;
    // A matrix in memory holds each rank's own panels only (a rank without any probes
    // nothing but still joins the sum); any other source gives every panel to any rank.
    let rank = rt.rank();
    let rows = match rank_panels {
        Some(counts) if counts.get(rank).is_some_and(|&c| c > 0) => {
            grid.panel_rows(counts[..rank].iter().sum())
        }
        Some(_) => 0..0,
        None => grid.panel_rows(0),
    };
    Ok(linalg::production_peak(rt, source.as_ref(), rows)?)
}

/// The rate, in bytes per second at 8 bytes a value, at which the compute threads of every
/// rank produce `input`'s tiles in `precision` as a randomized SVD's passes do (generate
/// them, or read, decode and convert them), summed over the ranks:
/// [`linalg::tile_production_peak`] on this rank's first panel of `plan` (the run's,
/// [`RsvdResult::plan`]). With [`linalg::gemm_peak`] of the same precision it makes the
/// machine limit of [`rsvd_with_factor`]'s passes over a float matrix
/// ([`output::report::MachineLimit::with_production`], with its phases' `produced_bytes`
/// and `flops`). Collective: every rank calls it, after the run.
pub fn tile_production_peak(
    rt: &Runtime,
    input: &Input,
    plan: &linalg::RsvdPlan,
    precision: Precision,
) -> Result<f64, Error> {
    let problem = rsvd_problem(input)?;
    let panel = plan.first_panel(rt.rank());
    Ok(linalg::tile_production_peak(
        rt,
        &problem.operand,
        panel,
        precision,
    )?)
}

/// The panel rows of `input`, and how many panels each rank holds: what a matrix in memory
/// was given (its rows stay on the rank that holds them), else the source's own panels.
fn panels_of(input: &Input, source: &dyn sources::PanelSource) -> (u64, Option<Vec<usize>>) {
    match input {
        Input::Rows {
            panel_rows,
            rank_panels,
            ..
        } => (*panel_rows, rank_panels.clone()),
        _ => (source.preferred_panel_rows(), None),
    }
}

fn rsvd_problem(input: &Input) -> Result<rankwise_linalg::RsvdProblem, Error> {
    let (source, transposed) = input.matrix()?;
    let (band, rank_panels) = panels_of(input, source.as_ref());
    let mut problem = rankwise_linalg::RsvdProblem::dense(source, band)?;
    problem.transposed = transposed;
    problem.rank_panels = rank_panels;
    Ok(problem)
}

/// The solver a caller chooses, with the command line's defaults: block Lanczos (genotypes)
/// or LOBPCG (dense matrices) to `tol` in mixed precision, or, with `power_iters`, a fixed number of subspace (or block Krylov)
/// iterations whose residuals are still measured. [`SolverChoice::options`] turns it into
/// [`RsvdOptions`]; `rankwise rsvd`, `rankwise pca` and the Python package share it.
#[derive(Clone, Debug)]
pub struct SolverChoice {
    /// Components.
    pub k: usize,
    /// Extra sketch columns.
    pub oversample: usize,
    /// A fixed number of power iterations instead of iterating to `tol`.
    pub power_iters: Option<usize>,
    /// The solver (`None`: block Lanczos for genotypes and LOBPCG for dense matrices, as
    /// [`SolverChoice::options`] says, or subspace iteration with `power_iters`).
    pub method: Option<Method>,
    /// Convergence tolerance of each component's residual.
    pub tol: f64,
    /// Most passes the iterative solvers make.
    pub max_passes: usize,
    /// Tile precision (`None`: the iterative solvers in mixed precision; f32 for the fixed
    /// iterations over stored f32 values, f64 otherwise).
    pub precision: Option<Precision>,
    /// Seed of the test matrix and probes.
    pub seed: u64,
    /// Gaussian probes of the error estimate.
    pub probes: usize,
}

impl Default for SolverChoice {
    fn default() -> Self {
        let d = RsvdOptions::default();
        SolverChoice {
            k: d.k,
            oversample: d.oversample,
            power_iters: None,
            method: None,
            tol: d.tol,
            max_passes: d.max_passes,
            precision: None,
            seed: d.seed,
            probes: d.probes,
        }
    }
}

/// What a job's passes read, which decides the solver and the precision
/// [`SolverChoice::options`] picks where none is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Values {
    /// Genotype dosages, standardized per variant (a PCA): each pass expands the stored
    /// codes in registers, so its cost grows with its columns, and block Lanczos's narrow
    /// passes win (on a 50,000 × 20,000 cohort, k = 10: 19.1 s against LOBPCG's 35.1 s,
    /// in 85 passes of 8 columns against 62 of up to 20).
    Genotypes,
    /// A dense matrix, stored as f32 (`f32`) or not: LOBPCG, whose passes on dense spectra
    /// (geometric decay, clusters: 3–5 passes in the solver's measurements) are the
    /// measured ones. Block Lanczos has not been measured to convergence there; a pass of
    /// a generated 400,000 × 2,000 matrix cost 0.42 s at its 8 columns against 0.70 s at
    /// LOBPCG's 20.
    Dense {
        /// The stored values are f32.
        f32: bool,
    },
}

impl SolverChoice {
    /// The options for a job over `values`. Without a method or power iterations: block
    /// Lanczos for genotypes (unless `precision` is f64, whose genotype passes cost the
    /// same at any width), LOBPCG otherwise; without a precision, the iterative solvers
    /// start in f32 and move to f64, and the fixed iterations use f32 for stored f32
    /// values, f64 otherwise.
    pub fn options(&self, values: Values) -> Result<RsvdOptions, Error> {
        let stored_f32 = values == Values::Dense { f32: true };
        let method = match (self.method, self.power_iters) {
            (Some(m), Some(_)) if m.iterates() => {
                return Err(Error::Parameter {
                    parameter: "power_iters",
                    message: format!(
                        "a fixed iteration count applies to the subspace and block Krylov \
                         methods; {} iterates until `tol` is met (bound it with \
                         `max_passes`)",
                        m.name()
                    ),
                })
            }
            (Some(m), _) => m,
            (None, None)
                if values == Values::Genotypes && self.precision != Some(Precision::F64) =>
            {
                Method::Lanczos
            }
            (None, None) => Method::Lobpcg,
            (None, Some(_)) => Method::SubspaceIteration,
        };
        let lobpcg = method.iterates();
        Ok(RsvdOptions {
            k: self.k,
            oversample: self.oversample,
            power_iters: self.power_iters.unwrap_or(2),
            method,
            seed: self.seed,
            probes: self.probes,
            precision: match self.precision {
                None if stored_f32 && !lobpcg => Precision::F32,
                None => Precision::F64,
                Some(p) => p,
            },
            mixed_precision: lobpcg && self.precision.is_none(),
            tol: self.tol,
            max_passes: self.max_passes,
            ..RsvdOptions::default()
        })
    }
}
