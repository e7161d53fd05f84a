//! `rankwise plan --nodes N …` (a job sized for a cluster: [`rankwise::sizing::predict`])
//! and `rankwise calibrate` (the per-core rates it uses: [`rankwise::sizing::calibrate`]).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use rankwise::sizing::{predict, Cluster, Network, Prediction, Rates, Solver, Transport, Workload};
use rankwise_exec::{parse_bytes, Runtime};

use super::{CliError, LaunchInfo, RunArgs};

/// The job `plan --nodes` sizes.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// The exact SVD, `U` formed.
    Svd,
    /// A randomized SVD of a float64 matrix.
    Rsvd,
    /// A genotype PCA (variants × samples).
    Pca,
}

/// How `plan --nodes` counts a randomized job's passes.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SolverKind {
    /// LOBPCG to a tolerance (the default of `rsvd`): float32 passes but the last.
    Lobpcg,
    /// Block Lanczos to a tolerance (the default of `pca`): float32 passes of 8 columns but
    /// the last.
    Lanczos,
    /// Fixed power iterations (`--power-iters`), float64 passes.
    PowerIters,
}

/// Options of `plan` that size a job for a cluster instead of planning this one.
#[derive(Args, Debug, Clone)]
pub(crate) struct SizingArgs {
    /// Size the job for a cluster of this many nodes (with `--network`): predicted time
    /// and memory per rank, from the rates of `--calibration`.
    #[arg(long, requires = "network")]
    pub(crate) nodes: Option<usize>,
    /// MPI ranks per node.
    #[arg(long, default_value_t = 1, requires = "nodes")]
    ranks_per_node: usize,
    /// Actors per rank.
    #[arg(long, default_value_t = 1, requires = "nodes")]
    actors_per_rank: usize,
    /// CPU cores per node (default: this machine's).
    #[arg(long, requires = "nodes")]
    cores_per_node: Option<usize>,
    /// Memory per node the job may plan with, e.g. 256G (default: this machine's).
    #[arg(long, requires = "nodes")]
    memory_per_node: Option<String>,
    /// GPUs per node, each rank taking the same number. With rates calibrated on GPU
    /// actors (`calibrate --device gpu`), a pass's values are divided among the GPUs;
    /// with CPU rates those apply, and the prediction says so.
    #[arg(long, default_value_t = 0, requires = "nodes")]
    gpus_per_node: usize,
    /// The network between nodes: bandwidth in Gb/s and latency, e.g. `100,2us` or
    /// `10,50us` (units: ns, us, ms, s), and optionally the MPI library's eager limit
    /// (default 64K, Open MPI's `btl_tcp_eager_limit`), e.g. `10,5ms,1M` for a job run
    /// with `--mca btl_tcp_eager_limit 1048576`.
    #[arg(long, value_name = "GBPS,LATENCY[,EAGER]", requires = "nodes")]
    network: Option<String>,
    /// Storage bandwidth per node in GB/s for a stored input (default: not counted).
    #[arg(long, requires = "nodes")]
    read_gbps: Option<f64>,
    /// The rates `rankwise calibrate` wrote.
    #[arg(long, default_value = "rankwise-rates.json", requires = "nodes")]
    calibration: PathBuf,
    /// The job to size.
    #[arg(long, value_enum, default_value = "svd", requires = "nodes")]
    job: JobKind,
    /// Components (rsvd, pca).
    #[arg(short = 'k', default_value_t = 10, requires = "nodes")]
    k: usize,
    /// Extra sketch columns (rsvd, pca).
    #[arg(long, default_value_t = 10, requires = "nodes")]
    oversample: usize,
    /// Passes over the matrix (rsvd, pca): LOBPCG to a tolerance makes as many as the
    /// spectrum needs (a run's report says how many); `--power-iters q` makes q + 2 (the residual check included).
    #[arg(long, default_value_t = 10, requires = "nodes")]
    passes: usize,
    /// How the job iterates (rsvd, pca): what each pass sends and its precision.
    /// [default: lanczos for pca, lobpcg for rsvd, as the jobs run]
    #[arg(long, value_enum, requires = "nodes")]
    solver: Option<SolverKind>,
}

fn option(option: &'static str, message: impl Into<String>) -> CliError {
    CliError::Option {
        option,
        message: message.into(),
    }
}

/// `plan --nodes …`: predicts the job on the cluster the options describe, for a matrix
/// of `shape` (rows × cols as given) in panels of `panel_rows` (0: the default).
pub(crate) fn size_command(
    a: &SizingArgs,
    shape: (u64, u64),
    panel_rows: u64,
    transport: Transport,
    json: bool,
) -> Result<Option<String>, CliError> {
    let text = std::fs::read_to_string(&a.calibration).map_err(|e| {
        option(
            "--calibration",
            format!(
                "{}: {e}; run `rankwise calibrate --out {}` on a node of the cluster first",
                a.calibration.display(),
                a.calibration.display()
            ),
        )
    })?;
    let rates: Rates = serde_json::from_str(&text).map_err(|e| {
        option(
            "--calibration",
            format!(
                "{}: not the rates `rankwise calibrate` writes: {e}",
                a.calibration.display()
            ),
        )
    })?;
    let network: Network =
        a.network
            .as_deref()
            .unwrap_or_default()
            .parse()
            .map_err(|e| match e {
                rankwise::Error::Parameter { message, .. } => option("--network", message),
                other => option("--network", other.to_string()),
            })?;
    let mut cluster = Cluster::like_this_node(a.nodes.unwrap_or(1), network);
    if let Some(s) = &a.memory_per_node {
        cluster.memory_per_node = parse_bytes(s).map_err(|m| option("--memory-per-node", m))?;
    }
    if let Some(c) = a.cores_per_node {
        cluster.cores_per_node = c;
    }
    cluster.ranks_per_node = a.ranks_per_node;
    cluster.actors_per_rank = a.actors_per_rank;
    cluster.gpus_per_node = a.gpus_per_node;
    cluster.transport = transport;
    cluster.read_gbps = a.read_gbps;
    let solver = match a.solver.unwrap_or(match a.job {
        JobKind::Pca => SolverKind::Lanczos,
        _ => SolverKind::Lobpcg,
    }) {
        SolverKind::Lobpcg => Solver::Lobpcg,
        SolverKind::Lanczos => Solver::Lanczos,
        SolverKind::PowerIters => Solver::PowerIters,
    };
    let workload = match a.job {
        JobKind::Svd => Workload::Svd,
        JobKind::Rsvd => Workload::Rsvd {
            k: a.k,
            oversample: a.oversample,
            passes: a.passes,
            solver,
        },
        JobKind::Pca => Workload::Pca {
            k: a.k,
            oversample: a.oversample,
            passes: a.passes,
            solver,
        },
    };
    let p =
        predict(shape.0, shape.1, panel_rows, &workload, &cluster, &rates).map_err(|e| match e
            .parameter()
        {
            Some("rates") => option(
                "--calibration",
                format!(
                    "{}: {e}; run `rankwise calibrate` again",
                    a.calibration.display()
                ),
            ),
            // A count of the world as a whole: `--nodes` sets it.
            Some("cluster") => option("--nodes", e.to_string()),
            Some(p) => option(super::flag_of(p), e.to_string()),
            None => option("--nodes", e.to_string()),
        })?;
    if json {
        return Ok(Some(
            serde_json::to_string_pretty(&p).unwrap_or_default() + "\n",
        ));
    }
    Ok(Some(text_of(&p, &cluster, &rates, a.job)))
}

fn text_of(p: &Prediction, c: &Cluster, rates: &Rates, job: JobKind) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:?} of {} × {} on {} node(s) × {} rank(s) ({} cores, {} per node; network {} Gb/s, {:.1} µs, eager limit {}; {:?})",
        job,
        p.shape.0,
        p.shape.1,
        c.nodes,
        c.ranks_per_node,
        c.cores_per_node,
        rankwise_exec::format_bytes(c.memory_per_node),
        c.network.gbps,
        c.network.latency * 1e6,
        rankwise_exec::format_bytes(c.network.eager_bytes),
        c.transport
    );
    let _ = writeln!(
        s,
        "{} panels of {} rows, {} pass(es); rates of {}",
        p.panels, p.panel_rows, p.passes, rates.machine
    );
    let _ = writeln!(
        s,
        "{:<56} {:>11} {:>11} {:>11} {:>11}",
        "phase", "compute", "storage", "network", "bytes sent"
    );
    for ph in &p.phases {
        let _ = writeln!(
            s,
            "{:<56} {:>10.3}s {:>10.3}s {:>10.4}s {:>11}",
            ph.phase,
            ph.compute_seconds,
            ph.read_seconds,
            ph.comm_seconds,
            rankwise_exec::format_bytes(ph.bytes_sent)
        );
    }
    let _ = writeln!(
        s,
        "predicted: {:.2} s; memory per rank {} ({}); dominant cost: {}",
        p.seconds,
        rankwise_exec::format_bytes(p.memory_per_rank),
        if p.resident {
            "panels kept in memory"
        } else {
            "panels produced again each pass"
        },
        p.dominant
    );
    for n in &p.notes {
        let _ = writeln!(s, "not counted: {n}");
    }
    s
}

/// `rankwise calibrate`.
#[derive(Args, Debug, Clone)]
pub(crate) struct CalibrateArgs {
    /// Where to write the rates (JSON), for `rankwise plan --nodes … --calibration`.
    #[arg(long, default_value = "rankwise-rates.json")]
    out: PathBuf,
    /// Matrix values per measurement (about a minute in all at the default on 2 cores).
    #[arg(long, default_value_t = rankwise::sizing::DEFAULT_CALIBRATION_VALUES)]
    values: u64,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// Measures the rates on one rank's actors and writes them (rank 0), whole or not at all.
pub(crate) fn calibrate_command(
    rt: &Runtime,
    _launch: &LaunchInfo,
    a: &CalibrateArgs,
) -> Result<Option<String>, CliError> {
    // What the library would refuse after the checks of `--out` below, refused first.
    if rt.comm().size() > 1 {
        return Err(option(
            "--transport",
            "calibrate measures one rank's actors: run it without mpirun",
        ));
    }
    if a.values < rankwise::sizing::MIN_CALIBRATION_VALUES {
        return Err(option(
            "--values",
            format!(
                "at least {} values per measurement",
                rankwise::sizing::MIN_CALIBRATION_VALUES
            ),
        ));
    }
    // `--out` as every command takes it (not there yet, its parent a writable directory),
    // checked before the minute of measuring, and again before the rename: like every
    // output, the rates never replace a file.
    let target = || {
        rankwise::output::group::SvdOutput::check_target(&a.out)
            .map_err(|e| option("--out", e.to_string()))
    };
    target()?;
    let rates = rankwise::sizing::calibrate(rt, a.values).map_err(super::cli_error)?;
    let json = serde_json::to_string_pretty(&rates).unwrap_or_default() + "\n";
    target()?;
    // Written under a `.tmp-` name that a signal, a failure or a panic removes, and
    // renamed: the rates are whole or not there.
    let tmp = a
        .out
        .with_extension(format!("json.tmp-{}", std::process::id()));
    let _temporary = rankwise::output::temporaries::RemovedOnDrop::new([tmp.clone()]);
    std::fs::write(&tmp, &json)
        .and_then(|()| std::fs::rename(&tmp, &a.out))
        .map_err(|e| option("--out", format!("{}: {e}", a.out.display())))?;
    Ok(Some(format!(
        "rates of {} written to {}\n{json}",
        rates.machine,
        a.out.display()
    )))
}
