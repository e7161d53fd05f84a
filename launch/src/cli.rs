//! The `rankwise` command line.
//!
//! Every subcommand that computes runs the same function on every rank. An error on any
//! rank is sent to all others ([`Comm::abort`]) and every rank prints the same line,
//! `rankwise: rank R failed: …`, and exits with status 1; no rank waits for a peer that
//! will never answer.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use ndarray::ArrayView2;
use rankwise_device::DeviceChoice;
use rankwise_exec::format_bytes;
use rankwise_exec::{
    actor_specs, parse_bytes, ChunkGrid, CoreShare, Runtime, RuntimeConfig, RuntimeError, Topology,
};
use rankwise_linalg::{svd, FactorSink, LinalgError, SvdOptions, SvdPlan, SvdProblem, SvdResult};
use rankwise_sources::Dist;
use rankwise_transports::{announce_failure, Comm, LocalWorld, TransportError};
use serde_json::json;

use crate::launcher::LaunchInfo;
use crate::report::seconds;
use rankwise::output::group::{OutputError, OutputLayout, SvdOutput};
use rankwise::output::report::{
    peak_rss_bytes, produced_on_all_ranks, MachineLimit, Provenance, RankReport, ReportError,
    RunInfo, RunReport, SvdBody, SvdWork,
};

// Compiled for the unit tests too, so that `make test` checks the parser.
mod gen_cmd;
mod project_cmd;
mod read_cmd;
mod reduce_cmd;
mod rsvd_cmd;
mod size_cmd;
mod tasks_cmd;

/// Distributed SVD and PCA of matrices too large for one machine.
#[derive(Parser, Debug)]
// `about` alone would take the launch crate's description from Cargo.toml.
#[command(
    name = "rankwise",
    version,
    about = "Distributed SVD and PCA of matrices too large for one machine, on MPI ranks of pinned actors",
    long_about = None
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Exact SVD of a tall-and-skinny (or short-and-fat) matrix by TSQR.
    Svd(SvdArgs),
    /// Rank-k randomized SVD (Halko, Martinsson & Tropp) of a generated matrix.
    Rsvd(rsvd_cmd::RsvdArgs),
    /// PCA of a genotype matrix (variants × samples), standardized per variant.
    Pca(Box<rsvd_cmd::PcaArgs>),
    /// New samples' PCs on the axes of an earlier PCA (`plink2 --score` with the PCA's
    /// variant weights), matched by variant ID and allele.
    Project(Box<project_cmd::ProjectArgs>),
    /// Write a generated matrix (uniform, normal, or genotypes with population structure)
    /// as a Zarr store, each rank writing the panels it owns.
    Gen(gen_cmd::GenArgs),
    /// Print the placement and memory plan of an SVD without computing it; with
    /// `--nodes`, size an svd, rsvd or pca job for a cluster (time and memory per rank).
    Plan(PlanArgs),
    /// Measure this machine's rates for `plan --nodes` (writes a JSON file): per core on
    /// CPU actors, per GPU on GPU actors (`--device cpu` or `gpu`; `auto` takes the GPUs
    /// where there are any).
    Calibrate(size_cmd::CalibrateArgs),
    /// Decode every chunk of a Zarr array once, on the actors that own it; report the
    /// throughput and a checksum.
    Read(read_cmd::ReadArgs),
    /// `(x + C)[::S, ::S].sum()` of a generated matrix, tile by tile on the actors: a
    /// chunked elementwise map and strided reduction, the same bits for any rank count.
    Reduce(reduce_cmd::ReduceArgs),
    /// Run N no-op tasks, one per chunk, through the actors: the runtime's cost per task.
    Tasks(tasks_cmd::TasksArgs),
    /// Print what hwloc sees, the launcher, and the actors this rank would start.
    Info(InfoArgs),
}

/// The matrix: read from a Zarr array, or generated.
#[derive(Args, Debug, Clone)]
struct MatrixArgs {
    /// Read the matrix from this Zarr array (v2 or v3; `PATH`, or `PATH:ARRAY` for an
    /// array inside a group) instead of generating it.
    #[arg(long, value_name = "PATH[:ARRAY]", conflicts_with_all = ["rows", "cols", "dist", "seed"])]
    zarr: Option<String>,
    /// Rows of the generated matrix.
    #[arg(long, required_unless_present = "zarr")]
    rows: Option<u64>,
    /// Columns of the generated matrix.
    #[arg(long, required_unless_present = "zarr")]
    cols: Option<u64>,
    /// Rows per panel (along the long dimension for a short-and-fat matrix). With
    /// `--zarr`, a multiple of the stored chunk (or shard) rows; the stored chunks by default.
    #[arg(long, required_unless_present = "zarr")]
    chunk_rows: Option<u64>,
    /// Seed of the generator.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Distribution of the generated values: uniform, normal or genotype.
    #[arg(long, default_value = "uniform")]
    dist: Dist,
}

/// Which transport carries messages between ranks.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum TransportChoice {
    /// Ranks are threads of this process (`--local-ranks`).
    Local,
    /// MPI, under mpirun or srun.
    Mpi,
    /// UCX's tagged messages, under mpirun or srun (MPI starts the ranks and exchanges
    /// the UCX addresses).
    Ucx,
}

/// The Zarr format of an output group (`--zarr-format`).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ZarrFormatArg {
    /// Zarr v2 (`.zgroup`, `.zarray`, consolidated `.zmetadata`), for readers that only
    /// know v2: sgkit 0.10 and zarr-python 2.
    #[value(name = "2")]
    V2,
    /// Zarr v3.
    #[value(name = "3")]
    V3,
}

impl From<ZarrFormatArg> for rankwise::output::ZarrFormat {
    fn from(f: ZarrFormatArg) -> Self {
        match f {
            ZarrFormatArg::V2 => rankwise::output::ZarrFormat::V2,
            ZarrFormatArg::V3 => rankwise::output::ZarrFormat::V3,
        }
    }
}

/// How ranks and actors are set up.
#[derive(Args, Debug, Clone)]
struct RunArgs {
    /// Actors per rank (default: one per NUMA domain given to the rank).
    #[arg(long)]
    actors: Option<usize>,
    /// Worker threads per actor (default: the cores the actor was given).
    #[arg(long)]
    threads_per_actor: Option<usize>,
    /// Memory budget per actor, e.g. 2G (default: 70% of available memory, shared; inside a
    /// Slurm job at most 70% of the rank's share of --mem or --mem-per-cpu).
    #[arg(long)]
    memory_per_actor: Option<String>,
    /// Ranks as threads of this process on the local transport.
    #[arg(long, default_value_t = 1)]
    local_ranks: usize,
    /// Transport (default: mpi under mpirun/srun, local otherwise).
    #[arg(long)]
    transport: Option<TransportChoice>,
    /// Do not pin worker threads to cores.
    #[arg(long)]
    no_pin: bool,
    /// No progress on stderr (rank 0 shows it for runs longer than a second: a line that
    /// updates on a terminal, a line every 10 s, then every minute, in a log file).
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Where actors compute: `cpu`, `gpu` (one GPU actor per GPU the rank is given; an
    /// error without CUDA or a device), or `auto` (GPUs where CUDA, NVRTC, cuBLAS and a
    /// device are all present, else CPU; `rankwise info` shows what was found).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    device: DeviceChoice,
    /// Seconds a rank waits for a message before it declares its peer gone, and for MPI
    /// to connect the ranks at the start (at least 1).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    comm_timeout: u64,
    /// Decoded bytes per read-ahead segment (`rsvd`, `pca`, `read`), where a stored band is
    /// read in parts: Blosc or uncompressed chunks spanning every column.
    #[arg(long, value_name = "SIZE", default_value = "16M")]
    read_segment: String,
    /// The endpoint of an S3-compatible object store (`http://127.0.0.1:9000`), for
    /// `s3://` inputs; over `AWS_ENDPOINT_URL` and the AWS profile's `endpoint_url`.
    #[arg(long, value_name = "URL")]
    endpoint_url: Option<String>,
    /// Requests each reader keeps in flight to an object store (`s3://`, `gs://`,
    /// `http(s)://` inputs); each holds up to one encoded chunk of the actor's budget.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    io_concurrency: u64,
    /// Retries of an object-store request that failed transiently (5xx, a timeout, a reset
    /// connection), with exponential backoff, within 3 minutes.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=100))]
    io_retries: u64,
}

fn parse_device(s: &str) -> Result<DeviceChoice, String> {
    s.parse()
}

impl RunArgs {
    /// `--read-segment` in bytes.
    fn segment_bytes(&self) -> Result<u64, CliError> {
        match parse_bytes(&self.read_segment) {
            Ok(b) if b > 0 => Ok(b),
            Ok(_) => Err(CliError::Option {
                option: "--read-segment",
                message: "must be more than 0 bytes".into(),
            }),
            Err(message) => Err(CliError::Option {
                option: "--read-segment",
                message,
            }),
        }
    }
}

#[derive(Args, Debug, Clone)]
struct SvdArgs {
    #[command(flatten)]
    matrix: MatrixArgs,
    #[command(flatten)]
    run: RunArgs,
    /// Write U, S, Vᵀ and the run report as a Zarr group here (must not exist).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The Zarr format of the `--out` group: 3, or 2 for readers that only know Zarr v2
    /// (sgkit 0.10, zarr-python 2).
    #[arg(long, value_enum, default_value = "3", requires = "out")]
    zarr_format: ZarrFormatArg,
    /// Check ‖A − UΣVᵀ‖/‖A‖ and the orthogonality of U and V (one more pass).
    #[arg(long)]
    check: bool,
    /// Measure, after the run, the machine's GEMM rate and the rate at which it produces the
    /// matrix (every rank's compute threads at once, about 0.2–0.5 s), and state each pass's
    /// share of the limit they make in the summary and the report.
    #[arg(long)]
    machine_limit: bool,
    /// Print the run report as JSON on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug, Clone)]
struct PlanArgs {
    #[command(flatten)]
    matrix: MatrixArgs,
    #[command(flatten)]
    run: RunArgs,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    sizing: size_cmd::SizingArgs,
}

#[derive(Args, Debug, Clone)]
struct InfoArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Also compile the GPU kernels with NVRTC, for each visible device's architecture
    /// (sm_90 when there is none): checks a CUDA installation without running anything.
    #[arg(long)]
    check_kernels: bool,
}

/// Errors of the command line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad option.
    #[error("{option}: {message}")]
    Option {
        /// The option.
        option: &'static str,
        /// What is wrong.
        message: String,
    },
    /// From the linear algebra (its parameters named by their flags).
    #[error("{}", with_flags(.0))]
    Linalg(#[from] LinalgError),
    /// From the runtime (its parameters named by their flags).
    #[error("{}", with_flags(.0))]
    Runtime(#[from] RuntimeError),
    /// From a source (its parameters named by their flags).
    #[error("{}", with_flags(.0))]
    Source(#[from] rankwise_sources::SourceError),
    /// From the transport.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// From the output writer (its parameters named by their flags).
    #[error("{}", with_flags(.0))]
    Output(#[from] OutputError),
    /// A file that cannot be read or written, or that does not say what it must.
    #[error("{}: {message}", path.display())]
    File {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// `--require-converged` and a component over the tolerance (every rank finds it).
    #[error("--require-converged: {0}")]
    NotConverged(String),
    /// A panic on this rank.
    #[error("panic: {0}")]
    Panic(String),
    /// A result that contradicts what the command ran (work lost or done twice).
    #[error("internal check failed: {0}")]
    Invariant(String),
    /// An error of this rank that was already sent to the other ranks.
    #[error(transparent)]
    Announced(Box<CliError>),
    /// A failure the phase hook made ([`main_with_phase_hook`]).
    #[error("{message}")]
    Failed {
        /// What the hook said.
        message: String,
    },
}

impl CliError {
    /// The failure of another rank this error reports, if that is what it is.
    fn peer_failure(&self) -> Option<(usize, &str)> {
        let t = match self {
            CliError::Transport(t) => t,
            CliError::Linalg(LinalgError::Transport(t)) => t,
            CliError::Linalg(LinalgError::Runtime(RuntimeError::Transport(t))) => t,
            CliError::Runtime(RuntimeError::Transport(t)) => t,
            _ => return None,
        };
        match t {
            TransportError::PeerFailed { rank, message } => Some((*rank, message)),
            _ => None,
        }
    }
}

/// The GEMM rate of the machine for a run's machine limit, with the kernels that reach it
/// ([`rankwise::linalg::machine_gemm_peak`]): this binary is its own probe process, which
/// [`run_command_line`] answers before the restart that would pin the kernels.
/// Collective.
pub(crate) fn machine_gemm_peak(
    rt: &Runtime,
    precision: rankwise::linalg::Precision,
) -> Result<rankwise::linalg::MachineGemm, CliError> {
    let probe = rankwise::linalg::GemmProbe::this_executable();
    Ok(rankwise::linalg::machine_gemm_peak(
        rt,
        precision,
        Some(&probe),
    )?)
}

/// Runs the command line; returns the process exit status. `RANKWISE_FAULT` (the failure
/// tests' hook, read only by the `rankwise-fault` binary) is refused rather than ignored: a
/// job that sets it expects a failure, and must not read a success as one.
pub fn main() -> i32 {
    if std::env::var_os("RANKWISE_FAULT").is_some() {
        print_whole_line(
            "rankwise: RANKWISE_FAULT is set, but this rankwise has no fault injection (a test \
             hook of the rankwise-fault binary, which is never shipped); unset RANKWISE_FAULT \
             to run",
        );
        return 2;
    }
    run_command_line()
}

/// A check a run passes at each of its phases (`start`, `before-svd`, `after-svd`,
/// `before-write`, `after-write`, `commit`), given the rank: an `Err` fails the rank with
/// that message, as bad input would. The failure tests' `rankwise-fault` binary fails ranks
/// on purpose through it; `rankwise` itself passes none.
pub type PhaseHook = fn(rank: usize, phase: &str) -> Result<(), String>;

/// The hook of this process, set once before the command line is read.
static PHASE_HOOK: std::sync::OnceLock<PhaseHook> = std::sync::OnceLock::new();

/// [`main`] with `hook` called at every phase of the run (the failure tests' binary).
#[doc(hidden)]
pub fn main_with_phase_hook(hook: PhaseHook) -> i32 {
    let _ = PHASE_HOOK.set(hook);
    run_command_line()
}

fn run_command_line() -> i32 {
    if let Some(status) = rankwise::linalg::serve_gemm_probe() {
        return status;
    }
    rankwise::process::restart_with_layout_independent_kernels();
    rankwise::process::hold_large_blocks_in_mmap();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    match cli.command {
        Command::Info(a) => {
            let check = a.check_kernels;
            run_ranks(&a.run, move |rt, launch| info(rt, launch, check))
        }
        Command::Plan(a) if a.sizing.nodes.is_some() => {
            // A cluster that is not this one: no ranks to start.
            match sizing(&a) {
                Ok(text) => {
                    print!("{text}");
                    0
                }
                Err(e) => {
                    eprintln!("rankwise plan: {e}");
                    2
                }
            }
        }
        Command::Plan(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run.clone(), move |rt, _| plan(rt, &a))
        }
        Command::Calibrate(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run.clone(), move |rt, launch| {
                size_cmd::calibrate_command(rt, launch, &a)
            })
        }
        Command::Read(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run().clone(), move |rt, launch| {
                read_cmd::read_command(rt, launch, &a)
            })
        }
        Command::Svd(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run.clone(), move |rt, launch| {
                svd_command(rt, launch, &a)
            })
        }
        Command::Rsvd(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run().clone(), move |rt, launch| {
                rsvd_cmd::rsvd_command(rt, launch, &a)
            })
        }
        Command::Pca(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run().clone(), move |rt, launch| {
                rsvd_cmd::pca_command(rt, launch, &a)
            })
        }
        Command::Project(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run().clone(), move |rt, _| {
                project_cmd::project_command(rt, &a)
            })
        }
        Command::Reduce(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run().clone(), move |rt, launch| {
                reduce_cmd::reduce_command(rt, launch, &a)
            })
        }
        Command::Tasks(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run().clone(), move |rt, launch| {
                tasks_cmd::tasks_command(rt, launch, &a)
            })
        }
        Command::Gen(a) => {
            let a = Arc::new(a);
            run_ranks(&a.run().clone(), move |rt, launch| {
                gen_cmd::gen_command(rt, launch, &a)
            })
        }
    }
}

fn runtime_config(run: &RunArgs, launch: &LaunchInfo) -> Result<RuntimeConfig, CliError> {
    let memory_per_actor = match &run.memory_per_actor {
        Some(s) => Some(parse_bytes(s).map_err(|message| CliError::Option {
            option: "--memory-per-actor",
            message,
        })?),
        None => None,
    };
    Ok(RuntimeConfig {
        actors: run.actors,
        threads_per_actor: run.threads_per_actor,
        memory_per_actor,
        memory_limit_per_rank: launch.memory_limit().map(|l| l.bytes),
        local_rank: launch.local_rank.unwrap_or(0),
        local_size: launch.local_size.unwrap_or(1),
        pin: !run.no_pin,
        // `--local-ranks` ranks are threads of one process and share its cores out.
        core_share: if run.local_ranks > 1 {
            CoreShare::ByLocalRank
        } else {
            CoreShare::LauncherIfBound
        },
        device: run.device,
    })
}

/// How long a failing MPI rank lets its error line travel through the launcher.
const OUTPUT_DRAIN: Duration = Duration::from_millis(700);

/// The longest a failing MPI rank waits for its peers in MPI_Finalize before it exits.
const FAILURE_GRACE: Duration = Duration::from_secs(4);

type Job = dyn Fn(&Runtime, &LaunchInfo) -> Result<Option<String>, CliError> + Send + Sync;

/// Runs `job` on every rank of the chosen transport and turns failures into one message
/// on every rank.
fn run_ranks<F>(run: &RunArgs, job: F) -> i32
where
    F: Fn(&Runtime, &LaunchInfo) -> Result<Option<String>, CliError> + Send + Sync + 'static,
{
    let launch = LaunchInfo::detect();
    rankwise_sources::RemoteOptions::set_default(rankwise_sources::RemoteOptions {
        endpoint_url: run.endpoint_url.clone(),
        concurrency: run.io_concurrency as usize,
        retries: run.io_retries as usize,
        ..Default::default()
    });
    // Signals end the process only after its temporaries are gone.
    if let Err(e) = rankwise::output::temporaries::install(launch.rank.unwrap_or(0)) {
        eprintln!("rankwise: warning: signal handling not installed ({e}): an interrupted run may leave *.tmp-* outputs");
    }
    let transport = run.transport.unwrap_or(if launch.under_launcher() {
        TransportChoice::Mpi
    } else {
        TransportChoice::Local
    });
    let job: Arc<Job> = Arc::new(job);
    match transport {
        TransportChoice::Local => run_local(run, launch, job),
        TransportChoice::Mpi => run_mpi(run, launch, job, false),
        TransportChoice::Ucx => run_mpi(run, launch, job, true),
    }
}

fn run_local(run: &RunArgs, launch: LaunchInfo, job: Arc<Job>) -> i32 {
    if run.local_ranks == 0 {
        eprintln!("rankwise: --local-ranks: at least one rank is needed");
        return 2;
    }
    let handles: Vec<_> = LocalWorld::create(run.local_ranks)
        .into_iter()
        .enumerate()
        .map(|(r, mut comm)| {
            let job = Arc::clone(&job);
            let run = run.clone();
            let mut launch = launch.clone();
            launch.local_rank = Some(r);
            launch.local_size = Some(run.local_ranks);
            comm.set_timeout(Duration::from_secs(run.comm_timeout));
            std::thread::spawn(move || {
                match rank_main(Box::new(comm), &run, &launch, job.as_ref()) {
                    RankOutcome::Done(text) => Ok(text),
                    RankOutcome::Failed(line, _) => Err(line),
                }
            })
        })
        .collect();
    let outcomes: Vec<Result<Option<String>, String>> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| Err("rank thread died".into())))
        .collect();
    // One line for the failure, as every MPI rank would print it.
    let mut status = 0;
    for o in &outcomes {
        if let Err(line) = o {
            eprintln!("{line}");
            status = 1;
            break;
        }
    }
    if let Some(Ok(Some(text))) = outcomes.first() {
        print!("{text}");
    }
    status
}

/// Runs `job` on this process's rank of an MPI job: over MPI itself, or over UCX (`ucx`)
/// with MPI only to start and to leave together.
#[cfg(feature = "mpi")]
fn run_mpi(run: &RunArgs, launch: LaunchInfo, job: Arc<Job>, ucx: bool) -> i32 {
    let name = if ucx { "ucx" } else { "mpi" };
    if run.local_ranks != 1 {
        eprintln!(
            "rankwise: --local-ranks: not available with --transport {name} (use mpirun -np)"
        );
        return 2;
    }
    let comm: Box<dyn Comm> = match start_mpi_comm(ucx, Duration::from_secs(run.comm_timeout)) {
        Ok(c) => c,
        Err(line) => {
            eprintln!("{line}");
            return 1;
        }
    };
    let outcome = rank_main(comm, run, &launch, job.as_ref());
    match outcome {
        RankOutcome::Done(text) => {
            if let Some(t) = text {
                print!("{t}");
            }
            0
        }
        RankOutcome::Failed(line, comm) => {
            print_whole_line(&line);
            // mpirun/srun end the whole job at the first rank that leaves, often before the
            // others have printed why. Ranks that know of the failure therefore meet in
            // MPI_Finalize and leave together; a rank stuck outside MPI cannot hold them
            // longer than the grace period.
            use std::io::Write;
            let _ = std::io::stderr().flush();
            // The launcher forwards each rank's output asynchronously and drops what is
            // still in flight when it tears the job down: let the line get out first.
            std::thread::sleep(OUTPUT_DRAIN);
            if let Some(c) = comm {
                let any = c.into_any();
                let any = match any.downcast::<rankwise_transports::MpiComm>() {
                    Ok(mpi) => mpi.exit_after_failure(1, FAILURE_GRACE),
                    Err(other) => other,
                };
                #[cfg(feature = "ucx")]
                if let Ok(ucx) = any.downcast::<rankwise_transports::UcxComm>() {
                    ucx.exit_after_failure(1, FAILURE_GRACE);
                }
                #[cfg(not(feature = "ucx"))]
                drop(any);
            }
            let _ = std::io::stdout().flush();
            std::thread::sleep(FAILURE_GRACE);
            // SAFETY: ends the process at once, skipping destructors that would call MPI.
            unsafe { libc::_exit(1) }
        }
    }
}

/// Initializes MPI, and UCX over it when `ucx`; the error is the line to print.
#[cfg(feature = "mpi")]
fn start_mpi_comm(ucx: bool, timeout: Duration) -> Result<Box<dyn Comm>, String> {
    if ucx {
        #[cfg(feature = "ucx")]
        {
            let mut comm = rankwise_transports::UcxComm::init_within(timeout)
                .map_err(|e| format!("rankwise: cannot start UCX: {e}"))?;
            comm.set_timeout(timeout);
            return Ok(Box::new(comm));
        }
        #[cfg(not(feature = "ucx"))]
        return Err("rankwise: --transport ucx: this build has no UCX support".into());
    }
    // MPI's start waits for every rank to connect: --comm-timeout bounds it too.
    let mut comm = rankwise_transports::MpiComm::init_within(timeout)
        .map_err(|e| format!("rankwise: cannot start MPI: {e}"))?;
    comm.set_timeout(timeout);
    Ok(Box::new(comm))
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_: &RunArgs, _: LaunchInfo, _: Arc<Job>, ucx: bool) -> i32 {
    let name = if ucx { "ucx" } else { "mpi" };
    eprintln!("rankwise: --transport {name}: this build has no MPI support");
    2
}

/// A rank's error, with the transport when the runtime that owns it was never built.
type RankFailure = (Option<Box<dyn Comm>>, CliError);

enum RankOutcome {
    Done(Option<String>),
    /// The line to print, and the transport when it survived (to leave in its own way).
    Failed(String, Option<Box<dyn Comm>>),
}

/// One rank's life: start the runtime, run the job, and on failure tell everyone.
fn rank_main(comm: Box<dyn Comm>, run: &RunArgs, launch: &LaunchInfo, job: &Job) -> RankOutcome {
    rankwise_linalg::init_blas_threads();
    let me = comm.rank();
    let failed =
        |comm: Option<Box<dyn Comm>>, e: CliError| -> Result<Option<String>, RankFailure> {
            // A peer's failure was announced by that peer; anything else is ours to announce,
            // unless a peer's notice is already here: then our error is likely its consequence
            // (a file it removed), and its cause is what every rank should report.
            let mut e = e;
            if e.peer_failure().is_none() && !matches!(e, CliError::Announced(_)) {
                if let Some(c) = &comm {
                    if let Some((rank, message)) = announce_failure(c.as_ref(), &|| e.to_string()) {
                        e = CliError::Transport(TransportError::PeerFailed { rank, message });
                    }
                }
            }
            Err((comm, e))
        };
    let result = catch_unwind(AssertUnwindSafe(
        || -> Result<Option<String>, RankFailure> {
            let config = match runtime_config(run, launch) {
                Ok(c) => c,
                Err(e) => return failed(Some(comm), e),
            };
            let specs = match actor_specs(&Topology::detect(), &config) {
                Ok(s) => s,
                Err(e) => return failed(Some(comm), e.into()),
            };
            let rt = match Runtime::try_new(comm, specs) {
                Ok(rt) => rt,
                Err((comm, e)) => return failed(Some(comm), e.into()),
            };
            // A signal's message says where the run was.
            let progress = std::sync::Arc::clone(rt.progress());
            rankwise::output::temporaries::set_status(move || {
                crate::progress::whereabouts(&progress.snapshot())
            });
            // Rank 0's display, gone (its line cleared) before the summary is printed.
            let _progress = (me == 0 && !run.quiet)
                .then(|| crate::progress::Display::start(std::sync::Arc::clone(rt.progress())));
            match catch_unwind(AssertUnwindSafe(|| job(&rt, launch))) {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => failed(Some(rt.into_comm()), e),
                Err(p) => failed(Some(rt.into_comm()), CliError::Panic(panic_text(p))),
            }
        },
    ));
    match result {
        Ok(Ok(v)) => RankOutcome::Done(v),
        Ok(Err((comm, e))) => RankOutcome::Failed(
            match e.peer_failure() {
                Some((rank, message)) => format!("rankwise: rank {rank} failed: {message}"),
                None => format!("rankwise: rank {me} failed: {e}"),
            },
            comm,
        ),
        Err(p) => RankOutcome::Failed(
            format!("rankwise: rank {me} failed: panic: {}", panic_text(p)),
            None,
        ),
    }
}

/// Writes `line` and its newline to stderr in one call: launchers merge the ranks' output,
/// and a line written in pieces can be split by another rank's.
fn print_whole_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

/// Passes the phase hook, if any ([`main_with_phase_hook`]): its error is this rank's
/// failure, named after `RANKWISE_FAULT`, the failure tests' variable that arms it.
fn injected_fault(rt: &Runtime, phase: &str) -> Result<(), CliError> {
    match PHASE_HOOK.get() {
        None => Ok(()),
        Some(hook) => hook(rt.rank(), phase).map_err(|message| CliError::Failed { message }),
    }
}

/// `rankwise info --check-kernels`: NVRTC compiles the kernels for every visible device's
/// architecture, or for sm_90 (Hopper) on a machine without devices.
fn check_kernels() -> Result<String, CliError> {
    use rankwise_device::{compile_kernels, probed};
    let libs = probed();
    libs.require("nvrtc", "--check-kernels")
        .map_err(RuntimeError::from)?;
    let mut archs: Vec<(i32, i32)> = libs.devices.iter().map(|d| d.compute_capability).collect();
    if archs.is_empty() {
        archs.push((9, 0));
    }
    archs.dedup();
    let mut out = String::new();
    for (major, minor) in archs {
        let cubin = compile_kernels(major, minor).map_err(|message| {
            RuntimeError::from(rankwise_device::GpuError::Compile {
                ordinal: 0,
                arch: format!("sm_{major}{minor}"),
                message,
            })
        })?;
        out.push_str(&format!(
            "kernels: compiled for sm_{major}{minor} by NVRTC ({}), {} bytes of machine code\n",
            libs.find("nvrtc")
                .and_then(|l| l.found.as_deref())
                .unwrap_or("?"),
            cubin.len()
        ));
    }
    Ok(out)
}

fn info(rt: &Runtime, launch: &LaunchInfo, check: bool) -> Result<Option<String>, CliError> {
    let kernels = if check && rt.rank() == 0 {
        Some(check_kernels()?)
    } else {
        None
    };
    let topology = Topology::detect();
    let mut lines = Vec::new();
    let actors: Vec<String> = rt
        .actors()
        .iter()
        .enumerate()
        .map(|(i, a)| {
            format!(
                "  actor {i}: {} ({} threads, budget {}){}",
                a.spec().device(),
                a.threads(),
                format_bytes(a.spec().memory),
                a.pin_error()
                    .map(|e| format!(" — not pinned: {e}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    lines.push(format!(
        "rank {} of {} (transport {}; launcher {:?}; local rank {} of {})",
        rt.rank(),
        rt.comm().size(),
        rt.comm().name(),
        launch.launcher,
        launch.local_rank.unwrap_or(0),
        launch.local_size.unwrap_or(1)
    ));
    let binding = launch.device(topology.gpus.len(), topology.numa.len());
    let gpu_actors = rt.actors().iter().filter(|a| a.gpu().is_some()).count();
    lines.push(format!(
        "  device by local rank: {binding:?}; {}",
        if gpu_actors > 0 {
            format!("{gpu_actors} GPU actor(s)")
        } else {
            "CPU actors".to_string()
        }
    ));
    lines.extend(allocation_lines(launch));
    lines.extend(actors);
    let mine = lines.join("\n") + "\n";
    let all = rt.comm().gather_bytes(0, mine.as_bytes())?;
    Ok(all.map(|all| {
        // What a result needs to be reproduced: the build and the libraries it runs on.
        let mut out = format!(
            "rankwise {} (git {})\nBLAS: {}\nMPI: {}\n",
            env!("CARGO_PKG_VERSION"),
            rankwise::output::report::revision(),
            rankwise_linalg::blas_library(),
            rt.comm()
                .library()
                .unwrap_or_else(|| "not used (local transport)".into())
        );
        out.push_str(&topology.summary());
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&rankwise_device::probed().summary());
        if let Some(k) = &kernels {
            out.push_str(k);
        }
        for part in all {
            out.push_str(&String::from_utf8_lossy(&part));
        }
        // The runtime's notes name parameters; `info` names the flags.
        with_flags(&out)
    }))
}

/// What `rankwise info` says of the Slurm allocation and of the GPUs a rank may use.
fn allocation_lines(launch: &LaunchInfo) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(job) = &launch.job_id {
        let mut parts = vec![match &launch.step_id {
            Some(step) => format!("  slurm: job {job}, step {step}"),
            None => format!("  slurm: job {job}, outside an srun step"),
        }];
        let cpus = |n: usize| {
            if n == 1 {
                "1 CPU".to_string()
            } else {
                format!("{n} CPUs")
            }
        };
        if let Some(c) = launch.cpus_per_task {
            parts.push(format!("{} per task", cpus(c)));
        }
        if let Some(c) = launch.cpus_on_node {
            parts.push(format!("{} on this node", cpus(c)));
        }
        lines.push(parts.join(", "));
        lines.push(match launch.memory_limit() {
            Some(l) => format!(
                "  memory limit: {} for this rank ({}); the default budget stays within 70% of it",
                format_bytes(l.bytes),
                l.from
            ),
            None => "  memory limit: none set by the job (no --mem or --mem-per-cpu)".into(),
        });
    }
    lines.push(match &launch.visible_gpus {
        None => "  GPUs: not restricted (no CUDA_VISIBLE_DEVICES or Slurm GPU list)".into(),
        Some(l) if l.is_empty() => "  GPUs: none (the GPU list is empty or NoDevFiles)".into(),
        Some(l) => format!("  GPUs: {} visible ({})", l.len(), l.join(",")),
    });
    lines
}

fn problem(m: &MatrixArgs) -> Result<SvdProblem, CliError> {
    match &m.zarr {
        Some(spec) => {
            // Panels run along the long dimension, as for generated matrices.
            let (source, transposed) = rankwise::Input::Zarr(spec.clone())
                .matrix()
                .map_err(cli_error)?;
            let (pm, pn) = source.shape();
            let band = source.preferred_panel_rows();
            Ok(SvdProblem {
                grid: ChunkGrid::new(pm, pn, m.chunk_rows.unwrap_or(band))?,
                source,
                transposed,
                rank_panels: None,
            })
        }
        None => Ok(SvdProblem::generated(
            m.rows.unwrap_or(0),
            m.cols.unwrap_or(0),
            m.chunk_rows.unwrap_or(0),
            m.seed,
            m.dist,
        )?),
    }
}

/// Every rank's figures for the report (a collective call): `own` plus the rank, its peak
/// RSS, actors and host, gathered on rank 0 (`None` on the others).
pub(crate) fn gather_rank_figures<W: serde::Serialize + serde::de::DeserializeOwned>(
    rt: &Runtime,
    work: W,
) -> Result<Option<Vec<RankReport<W>>>, CliError> {
    RankReport::gather(rt, work).map_err(|e| match e {
        ReportError::Comm(t) => CliError::Transport(t),
        other => CliError::Invariant(other.to_string()),
    })
}

/// Where and how this run ran, for its report; `start` is when the command started.
pub(crate) fn run_info(rt: &Runtime, launch: &LaunchInfo, start: Instant) -> RunInfo {
    let started = std::time::SystemTime::now()
        .checked_sub(start.elapsed())
        .unwrap_or_else(std::time::SystemTime::now);
    RunInfo {
        transport: rt.comm().name().to_string(),
        ranks: rt.comm().size(),
        actors: rt.world().actors(),
        launcher: format!("{:?}", launch.launcher),
        job_id: launch.job_id.clone(),
        launch: launch.to_json(),
        rankwise: Provenance::new(
            started,
            rankwise_linalg::blas_library(),
            rt.comm().library(),
        ),
    }
}

/// The library's parameters and the flags that set them: the library's messages name
/// parameters in backticks (`` `chunk_rows` ``), the command line's name the flags.
const FLAGS: &[(&str, &str)] = &[
    ("k", "-k"),
    ("weights", "--pca"),
    ("actors", "--actors"),
    ("threads_per_actor", "--threads-per-actor"),
    ("memory_per_actor", "--memory-per-actor"),
    ("device", "--device"),
    ("rows", "--rows"),
    ("cols", "--cols"),
    ("chunk_rows", "--chunk-rows"),
    ("panel_rows", "--chunk-rows"),
    ("chunk_cols", "--chunk-cols"),
    ("shard_rows", "--shard-rows"),
    ("dtype", "--dtype"),
    ("codec", "--codec"),
    ("shuffle", "--shuffle"),
    ("format", "--format"),
    ("out", "--out"),
    ("populations", "--populations"),
    ("fst", "--fst"),
    ("step", "--step"),
    ("add", "--add"),
    ("power_iters", "--power-iters"),
    ("max_passes", "--max-passes"),
    ("probes", "--probes"),
    ("oversample", "--oversample"),
    ("tol", "--tol"),
    ("precision", "--precision"),
    ("maf", "--maf"),
    ("geno", "--geno"),
    ("hwe", "--hwe"),
    ("keep", "--keep"),
    ("remove", "--remove"),
    ("extract", "--extract"),
    ("exclude", "--exclude"),
    ("chromosomes", "--chr"),
    ("not_chromosomes", "--not-chr"),
    ("autosomes_only", "--autosome"),
    ("non_autosomes", "--include-non-autosomes"),
    ("genotypes", "--vcf-zarr"),
    ("vcf_zarr", "--vcf-zarr"),
    ("spec", "--zarr"),
    ("values", "--values"),
    // `plan --nodes`'s description of a cluster.
    ("nodes", "--nodes"),
    ("ranks_per_node", "--ranks-per-node"),
    ("actors_per_rank", "--actors-per-rank"),
    ("cores_per_node", "--cores-per-node"),
    ("memory_per_node", "--memory-per-node"),
    ("gpus_per_node", "--gpus-per-node"),
    ("network", "--network"),
    ("read_gbps", "--read-gbps"),
    ("passes", "--passes"),
];

/// The flag that sets a parameter of the library, for its errors; a parameter without a
/// flag of its own is named as the library names it.
pub(crate) fn flag_of(parameter: &'static str) -> &'static str {
    FLAGS
        .iter()
        .find(|(p, _)| *p == parameter)
        .map_or(parameter, |(_, f)| f)
}

/// A library message with its parameters (`` `chunk_rows` ``) named by their flags.
pub(crate) fn with_flags(message: &dyn std::fmt::Display) -> String {
    let mut text = message.to_string();
    for (p, f) in FLAGS {
        let quoted = format!("`{p}`");
        if text.contains(&quoted) {
            text = text.replace(&quoted, f);
        }
    }
    text
}

/// A library error, as the command line reports it: parameters named by their flags.
pub(crate) fn cli_error(e: impl Into<rankwise::Error>) -> CliError {
    match e.into() {
        rankwise::Error::Parameter { parameter, message } => CliError::Option {
            option: flag_of(parameter),
            message: with_flags(&message),
        },
        rankwise::Error::NotConverged(what) => CliError::NotConverged(what),
        rankwise::Error::Linalg(e) => CliError::Linalg(e),
        rankwise::Error::Runtime(e) => CliError::Runtime(e),
        rankwise::Error::Source(e) => CliError::Source(e),
        rankwise::Error::Transport(e) => CliError::Transport(e),
        rankwise::Error::Output(e) => CliError::Output(e),
        // A function of ours the library called (a side file's writer) failed.
        rankwise::Error::Caller(e) => match e.downcast::<CliError>() {
            Ok(e) => *e,
            Err(e) => CliError::Failed {
                message: e.to_string(),
            },
        },
        rankwise::Error::File { path, message } => CliError::File { path, message },
        rankwise::Error::NotFound { path } => CliError::File {
            path,
            message: "no such file".into(),
        },
    }
}

/// A Zarr source error, as the command line reports it.
pub(crate) fn zarr_error(e: rankwise_sources::ZarrError) -> CliError {
    CliError::Source(e.into())
}

/// The user's `(rows, cols)` of a problem (the source may be its transpose).
pub(crate) fn user_shape(source: (u64, u64), transposed: bool) -> (u64, u64) {
    if transposed {
        (source.1, source.0)
    } else {
        source
    }
}

/// How the matrix was given, for reports.
fn matrix_json(m: &MatrixArgs, describe: String) -> serde_json::Value {
    match &m.zarr {
        Some(spec) => json!({"zarr": spec, "source": describe}),
        None => json!({"dist": m.dist, "seed": m.seed, "source": describe}),
    }
}

/// `plan --nodes`: the matrix's shape (generated, or a Zarr array's) sized for a cluster.
fn sizing(a: &PlanArgs) -> Result<String, CliError> {
    let (shape, panel_rows) = match &a.matrix.zarr {
        Some(_) => {
            let p = problem(&a.matrix)?;
            (p.source.shape(), p.grid.chunk_rows)
        }
        None => (
            (a.matrix.rows.unwrap_or(0), a.matrix.cols.unwrap_or(0)),
            a.matrix.chunk_rows.unwrap_or(0),
        ),
    };
    let transport = match a.run.transport {
        None | Some(TransportChoice::Mpi) => rankwise::sizing::Transport::Mpi,
        Some(TransportChoice::Ucx) => rankwise::sizing::Transport::Ucx,
        Some(TransportChoice::Local) => {
            return Err(CliError::Option {
                option: "--transport",
                message: "local runs ranks as threads of one process: size a cluster's job \
                          with mpi (the default) or ucx"
                    .into(),
            })
        }
    };
    Ok(
        size_cmd::size_command(&a.sizing, shape, panel_rows, transport, a.json)?
            .unwrap_or_default(),
    )
}

fn plan(rt: &Runtime, a: &PlanArgs) -> Result<Option<String>, CliError> {
    let p = problem(&a.matrix)?;
    let plan = SvdPlan::for_problem(&p, rt.world())?;
    if rt.rank() != 0 {
        return Ok(None);
    }
    if a.json {
        return Ok(Some(
            serde_json::to_string_pretty(&plan).unwrap_or_default() + "\n",
        ));
    }
    Ok(Some(plan_text(&plan, &p, rt)))
}

/// A plan's table of actors: each one's panels and rows, the bytes of those rows in f64,
/// its budget, its read-ahead buffers, and whether its panels stay resident between passes.
pub(crate) fn actor_table(
    rt: &Runtime,
    g: rankwise_exec::ChunkGrid,
    placement: &rankwise_exec::Placement,
    memory: &[rankwise_exec::MemoryPlan],
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>5} {:>5}  {:<28} {:>13} {:>12} {:>10} {:>11} {:>11}  residency",
        "rank", "actor", "device", "panels", "rows", "bytes", "budget", "read bufs"
    );
    for (a, m) in placement.assignments.iter().zip(memory) {
        let rows: u64 = a
            .panels
            .clone()
            .map(|q| g.panel_rows(q).end - g.panel_rows(q).start)
            .sum();
        let panels = if a.panels.is_empty() {
            "none".to_string()
        } else {
            format!("{}..{}", a.panels.start, a.panels.end)
        };
        let _ = writeln!(
            s,
            "{:>5} {:>5}  {:<28} {:>13} {:>12} {:>10} {:>11} {:>11}  {:?}",
            a.rank,
            a.actor,
            rt.world().ranks[a.rank][a.actor].device,
            panels,
            rows,
            format_bytes(rows * g.cols * 8),
            format_bytes(m.budget),
            format_bytes(m.read_bytes),
            m.residency
        );
    }
    s
}

fn plan_text(plan: &SvdPlan, p: &SvdProblem, rt: &Runtime) -> String {
    use std::fmt::Write;
    let g = plan.grid;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "matrix: {}\ngrid: {} × {} f64{} in {} panels of {} rows ({} per full panel)",
        p.source.describe(),
        g.rows,
        g.cols,
        if p.transposed {
            " (the transpose of the input)"
        } else {
            ""
        },
        g.panels(),
        g.chunk_rows,
        format_bytes(g.panel_bytes())
    );
    let _ = writeln!(
        s,
        "ranks: {}, actors: {}, transport {}",
        plan.ranks,
        rt.world().actors(),
        rt.comm().name()
    );
    s.push_str(&actor_table(rt, g, &plan.placement, &plan.memory));
    if let Some(st) = p.source.stored() {
        let _ = writeln!(
            s,
            "reads per actor (the SVD makes 2 passes; a resident actor reads in pass 1 only):"
        );
        let _ = writeln!(
            s,
            "{:>5} {:>5}  {:>12} {:>12} {:>8} {:>12}  reads in",
            "rank", "actor", "stored", "decoded", "buffers", "buffer bytes"
        );
        for (a, m) in plan.placement.assignments.iter().zip(&plan.memory) {
            let (mut stored, mut decoded) = (0u64, 0u64);
            for q in a.panels.clone() {
                let r = g.panel_rows(q);
                stored += st.stored_bytes(r.clone());
                decoded += st.buffer_bytes(r.end - r.start);
            }
            let _ = writeln!(
                s,
                "{:>5} {:>5}  {:>12} {:>12} {:>8} {:>12}  {}",
                a.rank,
                a.actor,
                format_bytes(stored),
                format_bytes(decoded),
                m.read_buffers,
                format_bytes(m.read_bytes),
                match m.residency {
                    rankwise_exec::Residency::Resident => "pass 1",
                    rankwise_exec::Residency::Regenerated => "every pass",
                }
            );
        }
    }
    let _ = writeln!(s, "messages each rank sends (TSQR up-sweep + push-down):");
    for (r, &n) in plan.messages_per_sweep.iter().enumerate() {
        let bytes = n * (plan.words_up + plan.words_down) * 8;
        let _ = writeln!(
            s,
            "  rank {r}: {} messages, {}",
            2 * n,
            format_bytes(bytes as u64)
        );
    }
    let _ = writeln!(
        s,
        "plus one broadcast of Σ, Vᵀ ({} values) from rank {}",
        plan.words_up,
        plan.placement.owner.first().copied().unwrap_or(0)
    );
    s
}

fn svd_command(rt: &Runtime, launch: &LaunchInfo, a: &SvdArgs) -> Result<Option<String>, CliError> {
    let start = Instant::now();
    injected_fault(rt, "start")?;
    let p = problem(&a.matrix)?;
    let (m, n) = user_shape(p.source.shape(), p.transposed);
    let k = m.min(n);
    // Make every rank refuse a bad budget before any output exists.
    SvdPlan::for_problem(&p, rt.world())?;

    let output = match &a.out {
        Some(out) => Some(open_output(
            rt,
            out,
            layout_for(&p, m, n, k, a.zarr_format.into()),
        )?),
        None => None,
    };
    rt.progress().set_title("svd", p.source.describe());
    let result = run_svd(
        rt,
        launch,
        a,
        &p,
        output.as_ref().map(|o| Arc::clone(&o.0)),
        start,
    );
    finish_output(rt, result, output)
}

fn layout_for(
    p: &SvdProblem,
    m: u64,
    n: u64,
    k: u64,
    format: rankwise::output::ZarrFormat,
) -> OutputLayout {
    OutputLayout {
        format,
        row_vectors: Vec::new(),
        row_matrices: Vec::new(),
        dims: rankwise::output::Dims::MATRIX,
        m,
        n,
        k,
        u_chunk_rows: if p.transposed {
            m.max(1)
        } else {
            p.grid.chunk_rows
        },
        vt_chunk_cols: if p.transposed {
            p.grid.chunk_rows
        } else {
            n.max(1)
        },
        attributes: serde_json::Map::from_iter([
            ("source".to_string(), json!(p.source.describe())),
            (
                "producer".to_string(),
                json!(format!("rankwise {}", env!("CARGO_PKG_VERSION"))),
            ),
        ]),
    }
}

/// An output opened on every rank, and its temporary path.
pub(crate) type Opened<O> = (Arc<O>, PathBuf);

/// An output group opened on every rank, and its temporary path.
pub(crate) type OpenOutput = Opened<SvdOutput>;

/// Creates the output group under a temporary name shared by all ranks (a collective
/// call): [`rankwise::output::publish::open_group`], its errors named by `--out`.
pub(crate) fn open_output(
    rt: &Runtime,
    out: &std::path::Path,
    layout: OutputLayout,
) -> Result<OpenOutput, CliError> {
    opened(rankwise::output::publish::open_group(rt, out, layout))
}

/// Creates an output under a temporary name shared by all ranks (a collective call):
/// [`rankwise::output::publish::open_collectively`], its errors named by `--out`.
pub(crate) fn open_collectively<O>(
    rt: &Runtime,
    out: &std::path::Path,
    create: impl FnOnce(&std::path::Path) -> Result<O, OutputError>,
    open: impl FnOnce(&std::path::Path) -> Result<O, OutputError>,
) -> Result<Opened<O>, CliError> {
    opened(rankwise::output::publish::open_collectively(
        rt, out, create, open,
    ))
}

/// An output opened on every rank, its errors named by `--out`, with a note on rank 0
/// about the temporaries an earlier run left.
fn opened<O>(
    opened: Result<rankwise::output::publish::Opened<O>, rankwise::output::publish::PublishError>,
) -> Result<Opened<O>, CliError> {
    use rankwise::output::publish::PublishError;
    let opened = opened.map_err(|e| match e {
        PublishError::Create(e) => CliError::Option {
            option: "--out",
            message: with_flags(&e),
        },
        PublishError::Output(e) => CliError::Output(e),
        PublishError::Transport(e) => CliError::Transport(e),
    })?;
    note_stale(&opened.stale);
    Ok((opened.output, opened.tmp))
}

/// Tells the user (on rank 0, where `stale` is not empty) about the temporaries of the
/// output that an earlier run left.
pub(crate) fn note_stale(stale: &[std::path::PathBuf]) {
    if !stale.is_empty() {
        let list: Vec<String> = (stale.iter())
            .map(|p| format!("'{}'", p.display()))
            .collect();
        eprintln!(
            "rankwise: note: {} left by a run that was killed (SIGKILL) or is still writing; \
             when none is, remove {}: rm -r {}",
            list.join(", "),
            if list.len() == 1 { "it" } else { "them" },
            list.join(" ")
        );
    }
}

/// Ends a job that writes `output`: on error the peers are told first, then the temporary
/// group is removed ([`rankwise::output::publish::abandon_collectively`]), so nothing
/// half-written is left behind.
pub(crate) fn finish_output<T, O>(
    rt: &Runtime,
    result: Result<T, CliError>,
    output: Option<Opened<O>>,
) -> Result<T, CliError> {
    match output {
        Some((output, tmp)) => finish_with(result, |own| {
            let opened = rankwise::output::publish::Opened {
                output,
                tmp,
                stale: Vec::new(),
            };
            rankwise::output::publish::abandon_collectively(rt, opened, own)
        }),
        None => result,
    }
}

/// Ends a job whose output `abandon` removes on error (after telling the peers the
/// message it is given, unless the failure is a peer's), so nothing half-written is left
/// behind; `abandon` returns the failure of a peer that arrived instead, if one did.
pub(crate) fn finish_with<T>(
    result: Result<T, CliError>,
    abandon: impl FnOnce(Option<&dyn Fn() -> String>) -> Option<(usize, String)>,
) -> Result<T, CliError> {
    match result {
        Ok(v) => Ok(v),
        Err(e) => {
            // A peer's failure was announced by that peer: this rank only cleans up.
            let announce = e.peer_failure().is_none();
            let own = || e.to_string();
            let heard = abandon(announce.then_some(&own as &dyn Fn() -> String));
            Err(if announce && heard.is_none() {
                CliError::Announced(Box::new(e))
            } else {
                e
            })
        }
    }
}

/// The sink that writes each panel's rows of the distributed factor into the output: rows
/// of U, or columns of Vt for a problem solved through the transpose.
pub(crate) fn factor_sink(o: Arc<SvdOutput>, transposed: bool) -> FactorSink {
    Arc::new(
        move |_panel: usize,
              rows: std::ops::Range<u64>,
              f: ArrayView2<'_, f64>|
              -> Result<(), String> {
            if transposed {
                o.write_vt_cols(rows.start, f.t())
                    .map_err(|e| e.to_string())
            } else {
                o.write_u_rows(rows.start, f).map_err(|e| e.to_string())
            }
        },
    )
}

fn run_svd(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &SvdArgs,
    p: &SvdProblem,
    output: Option<Arc<SvdOutput>>,
    start: Instant,
) -> Result<Option<String>, CliError> {
    let sink = output.clone().map(|o| factor_sink(o, p.transposed));
    injected_fault(rt, "before-svd")?;
    let result = svd(rt, p, &SvdOptions { check: a.check }, sink)?;
    injected_fault(rt, "after-svd")?;
    let elapsed = start.elapsed().as_secs_f64();
    // Collective: every rank probes at once, before the figures gather on rank 0.
    let rates = match a.machine_limit {
        true => {
            let gemm = machine_gemm_peak(rt, rankwise::linalg::Precision::F64)?;
            let rows = p.grid.panel_rows(0);
            let production = rankwise::linalg::production_peak(rt, p.source.as_ref(), rows)?;
            Some((gemm, production))
        }
        false => None,
    };
    let Some(ranks) = gather_rank_figures(rt, SvdWork::of(&result))? else {
        return Ok(None);
    };
    let limit = rates.map(|(gemm, production)| {
        let all: Vec<_> = ranks.iter().map(|r| &r.work.timings[..]).collect();
        let produced = |phase: &str| produced_on_all_ranks(&all, phase);
        MachineLimit::with_production(&result.timings, produced, "f64", gemm.flops, production)
            .with_kernels(gemm.kernels, gemm.loaded_flops)
    });
    let report = report_json(rt, launch, a, p, &result, ranks, (start, elapsed), limit);
    if let Some(o) = output {
        if p.transposed {
            o.write_u_rows(0, result.wt.t())?;
        } else {
            o.write_vt(result.wt.view())?;
        }
        o.write_s(&result.s)?;
        o.write_report(&report)?;
        o.commit()?;
    }
    if a.json {
        return Ok(Some(
            serde_json::to_string_pretty(&report).unwrap_or_default() + "\n",
        ));
    }
    let limit = report.body.machine_limit.as_ref();
    Ok(Some(summary_text(rt, a, p, &result, elapsed, limit)))
}

fn report_json(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &SvdArgs,
    p: &SvdProblem,
    r: &SvdResult,
    ranks: Vec<RankReport<SvdWork>>,
    (start, elapsed): (Instant, f64),
    machine_limit: Option<MachineLimit>,
) -> RunReport<SvdBody, SvdWork> {
    let (m, n) = user_shape(p.source.shape(), p.transposed);
    let matrix_bytes = m * n * 8;
    RunReport {
        command: "svd".into(),
        body: SvdBody {
            shape: [m, n],
            matrix: matrix_json(&a.matrix, p.source.describe()),
            transposed: p.transposed,
            grid: r.plan.grid,
            placement: r.plan.placement.clone(),
            memory: r.plan.memory.clone(),
            singular_values: r.s.clone(),
            check: r.check.clone(),
            matrix_bytes,
            matrix_gb_per_s: matrix_bytes as f64 / elapsed / 1e9,
            machine_limit,
        },
        run: run_info(rt, launch, start),
        seconds: elapsed,
        per_rank: ranks,
    }
}

fn summary_text(
    rt: &Runtime,
    a: &SvdArgs,
    p: &SvdProblem,
    r: &SvdResult,
    elapsed: f64,
    limit: Option<&MachineLimit>,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let g = r.plan.grid;
    let _ = writeln!(s, "rankwise svd: {}", p.source.describe());
    let _ = writeln!(
        s,
        "  {} panels of {} rows{}; {} rank(s), {} actor(s), transport {}",
        g.panels(),
        g.chunk_rows,
        if p.transposed {
            " (through the transpose)"
        } else {
            ""
        },
        rt.comm().size(),
        rt.world().actors(),
        rt.comm().name()
    );
    let _ = writeln!(s, "singular values ({}):", r.s.len());
    for (i, v) in r.s.iter().enumerate() {
        let _ = writeln!(s, "  σ{:<3} {:.15e}", i + 1, v);
    }
    if let Some(c) = &r.check {
        let _ = writeln!(s, "checks:");
        let _ = writeln!(s, "  ‖A − UΣVᵀ‖_F / ‖A‖_F = {:.3e}", c.relative_residual);
        let _ = writeln!(s, "  max |UᵀU − I|        = {:.3e}", c.u_orthogonality);
        let _ = writeln!(s, "  max |VᵀV − I|        = {:.3e}", c.v_orthogonality);
    }
    let _ = writeln!(s, "phases (rank 0):");
    for t in &r.timings {
        let mut line = crate::report::phase_line(t);
        if let Some(p) = limit.and_then(|l| l.share_of(&t.phase)) {
            let _ = write!(
                line,
                "   limit {}, {:.0} %",
                seconds(p.limit_seconds),
                100.0 * p.share
            );
        }
        let _ = writeln!(s, "{line}");
    }
    if let Some(l) = limit {
        let _ = writeln!(s, "{}", crate::report::machine_limit_line(l));
    }
    if r.gpu_qrs + r.gpu_node_qrs > 0 {
        let _ = writeln!(
            s,
            "cuSOLVER (rank 0): {} panel QRs ({} of panels generated on the device), {} \
             tree-node QRs",
            r.gpu_qrs, r.gpu_generated, r.gpu_node_qrs
        );
    }
    let (m, n) = user_shape(p.source.shape(), p.transposed);
    let bytes = m * n * 8;
    if r.read.chunks > 0 {
        let _ = writeln!(
            s,
            "read (rank 0): {} chunks, {} stored, {} decoded, {} decoding",
            r.read.chunks,
            format_bytes(r.read.stored_bytes),
            format_bytes(r.read.decoded_bytes),
            seconds(r.read.decode_seconds)
        );
    }
    let _ = writeln!(
        s,
        "total {} for {} of matrix: {:.2} GB/s; peak RSS rank 0 {}",
        seconds(elapsed),
        format_bytes(bytes),
        bytes as f64 / elapsed / 1e9,
        peak_rss_bytes()
            .map(format_bytes)
            .unwrap_or_else(|| "unknown".into())
    );
    if let Some(out) = &a.out {
        let _ = writeln!(s, "output: {}", out.display());
    }
    s
}
