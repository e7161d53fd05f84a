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
    /// LOBPCG to a tolerance (the default of `rsvd` and `pca`): float32 passes but the last.
    Lobpcg,
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
    #[arg(long, value_enum, default_value = "lobpcg", requires = "nodes")]
    solver: SolverKind,
}

fn option(option: &'static str, message: impl Into<String>) -> CliError {
    CliError::Option {
        option,
        message: message.into(),
    }
}

/// `100,2us` or `100,2us,1M` → a [`Network`].
fn network(s: &str) -> Result<Network, CliError> {
    let bad = || {
        option(
            "--network",
            format!("{s:?} is not GBPS,LATENCY[,EAGER] (e.g. 100,2us or 10,5ms,1M)"),
        )
    };
    let mut parts = s.split(',');
    let (Some(gbps), Some(latency)) = (parts.next(), parts.next()) else {
        return Err(bad());
    };
    let eager = parts.next();
    if parts.next().is_some() {
        return Err(bad());
    }
    let gbps: f64 = gbps.trim().parse().map_err(|_| bad())?;
    let latency = latency.trim();
    // The unit is the trailing letters (`1e-6` is a number in seconds).
    let number = latency.trim_end_matches(|c: char| c.is_alphabetic());
    let unit = latency[number.len()..].trim();
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" | "" => 1.0,
        _ => return Err(bad()),
    };
    let latency = number.trim().parse::<f64>().map_err(|_| bad())? * scale;
    if !(gbps > 0.0 && gbps.is_finite() && latency >= 0.0 && latency.is_finite()) {
        return Err(bad());
    }
    let mut net = Network::new(gbps, latency);
    if let Some(e) = eager {
        net.eager_bytes =
            parse_bytes(e).map_err(|m| option("--network", format!("eager limit {m}")))?;
    }
    Ok(net)
}

fn this_machine_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(16 << 30, |kib| kib << 10)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
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
    let memory_per_node = match &a.memory_per_node {
        Some(s) => parse_bytes(s).map_err(|m| option("--memory-per-node", m))?,
        None => this_machine_memory(),
    };
    let cluster = Cluster {
        nodes: a.nodes.unwrap_or(1),
        ranks_per_node: a.ranks_per_node,
        actors_per_rank: a.actors_per_rank,
        cores_per_node: a.cores_per_node.unwrap_or_else(cores),
        memory_per_node,
        gpus_per_node: a.gpus_per_node,
        network: network(a.network.as_deref().unwrap_or_default())?,
        transport,
        read_gbps: a.read_gbps,
    };
    let solver = match a.solver {
        SolverKind::Lobpcg => Solver::Lobpcg,
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
            Some("network") => option("--network", e.to_string()),
            Some("gpus_per_node") => option("--gpus-per-node", e.to_string()),
            Some("cluster") => option("--nodes", e.to_string()),
            Some("read_gbps") => option("--read-gbps", e.to_string()),
            Some("passes") => option("--passes", e.to_string()),
            Some("panel_rows") => option("--chunk-rows", e.to_string()),
            Some("oversample") | Some("k") => option("-k", e.to_string()),
            _ => CliError::Option {
                option: "--nodes",
                message: e.to_string(),
            },
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
    #[arg(long, default_value_t = 1 << 26)]
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
    if rt.comm().size() > 1 {
        return Err(option(
            "--transport",
            "calibrate measures one rank's actors: run it without mpirun",
        ));
    }
    if a.values < 1 << 16 {
        return Err(option("--values", "at least 65536 values per measurement"));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_options_parse_with_units_and_refuse_nonsense() {
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
        ] {
            assert!(network(bad).is_err(), "{bad}");
        }
    }
}
