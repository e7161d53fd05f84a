//! `rankwise rsvd` and `rankwise pca`: the randomized SVD and the genotype PCA.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use ndarray::Array2;
use rankwise::genomics::{pca_problem, pca_scales, IdList, PcaParams, Selection};
use rankwise::Input;
use rankwise_exec::format_bytes;
use rankwise_exec::Runtime;
use rankwise_linalg::{
    rsvd, HweP, Method, Operand, Precision, Projection, RsvdOptions, RsvdPlan, RsvdProblem,
    RsvdResult, VariantFilter,
};
use rankwise_sources::{Dist, Generated, GenotypeSource};
use serde_json::json;

use super::{
    cli_error, factor_sink, finish_output, injected_fault, open_output, CliError, MatrixArgs,
    OpenOutput, RunArgs, ZarrFormatArg,
};
use crate::launcher::LaunchInfo;
use crate::plot::{plot_pcs, Groups};
use crate::report::seconds;
use rankwise::output::group::{SvdOutput, ZarrFormat};
use rankwise::output::report::{
    peak_rss_bytes, produced_on_all_ranks, MachineLimit, RankReport, RsvdBody, RsvdWork, RunReport,
};
use rankwise::pca_group::{result_layout, write_factors, CallerError, PcaFiles, PcaGroup};

/// How the range is refined.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MethodChoice {
    /// LOBPCG on AᵀA until every component meets --tol (one read of the matrix per
    /// iteration, memory independent of the iterations); the default.
    Lobpcg,
    /// Thick-restart block Lanczos on AᵀA until every component meets --tol: blocks of 8
    /// columns (narrower passes than LOBPCG's), a basis of at most 2(k + p) + 80 columns.
    Lanczos,
    /// Subspace iteration with re-orthonormalization at every half-step, for
    /// --power-iters passes (Dask's `n_power_iter`); 2 unless given.
    Subspace,
    /// Block Krylov (Musco & Musco 2015): a basis of (q + 1)(k + p) columns; with power
    /// iterations, B in a pass of its own (one pass more than subspace iteration).
    BlockKrylov,
}

/// Options of the randomized algorithm, shared by `rsvd` and `pca`.
#[derive(Args, Debug, Clone)]
pub(super) struct SketchArgs {
    /// Rank of the result (number of components).
    #[arg(short = 'k', long = "k", default_value_t = 10)]
    k: usize,
    /// Oversampling: the sketch has k + P columns.
    #[arg(long, default_value_t = 10)]
    oversample: usize,
    /// A fixed number of power iterations (each one more pass over the matrix, two with
    /// `--projection separate`), as Dask's `n_power_iter`, instead of iterating to --tol:
    /// selects `--method subspace` unless `block-krylov` is given. The residuals are still
    /// measured (one more pass) and reported against --tol.
    #[arg(long)]
    power_iters: Option<usize>,
    /// The solver. Default: lobpcg, or subspace with --power-iters.
    #[arg(long, value_enum)]
    method: Option<MethodChoice>,
    /// Convergence tolerance: a component has converged when ‖Aᵀuᵢ − σᵢvᵢ‖₂/σ₁ (for
    /// --power-iters, ‖Avᵢ − σᵢuᵢ‖₂/σ₁) is at most T.
    #[arg(long, value_name = "T", default_value_t = rankwise_linalg::DEFAULT_TOL)]
    tol: f64,
    /// Most passes over the matrix the iterative solvers make before they stop unconverged
    /// (and say so).
    #[arg(long, value_name = "N", default_value_t = rankwise_linalg::DEFAULT_MAX_PASSES)]
    max_passes: usize,
    /// Fail (on every rank, non-zero exit, no output left) when a component did not meet
    /// --tol, instead of warning.
    #[arg(long)]
    require_converged: bool,
    /// Measure the machine's GEMM rate after the run (every rank's compute threads at once,
    /// about 0.1–0.3 s) and state each pass's share of it in the summary and the report.
    #[arg(long)]
    machine_limit: bool,
    /// Print the plan (panels, placement, each actor's memory and residency, the sketch)
    /// and exit without reading or computing anything; with --json, as JSON.
    #[arg(long)]
    plan: bool,
    /// Gaussian probes of the a-posteriori error estimate (0: none).
    #[arg(long, default_value_t = 4)]
    probes: usize,
    /// Seed of the random test matrix and probes (default: the matrix seed + 1).
    #[arg(long)]
    sketch_seed: Option<u64>,
    /// Precision of the tiles and their GEMMs (sums are accumulated in f64 either way);
    /// f32 doubles the GEMM rate and halves resident float panels. `auto`: with LOBPCG, f32
    /// passes until f32 stops improving the residuals, then f64, and the last pass (which
    /// measures the returned components) in f64; with --power-iters, f32 for a float32
    /// Zarr array (its values carry no more), f64 otherwise.
    #[arg(long, value_enum, default_value = "auto")]
    precision: PrecisionChoice,
    /// Where the projections AᵀQ (one per power iteration, and B = QᵀA) are formed.
    /// `fused`: in the range pass before, as (AᵀY)·R⁻¹, so q + 1 reads of the matrix
    /// instead of 2q + 2; each is used when cond(Y) is at most 100 (the report gives it),
    /// else a pass of its own follows. `separate`: always a pass of its own.
    #[arg(long, value_enum, default_value = "fused")]
    projection: ProjectionChoice,
}

/// Where the projections are formed.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProjectionChoice {
    /// In the range pass before, when the sketch is well conditioned.
    Fused,
    /// In a pass of its own.
    Separate,
}

/// Precision of the tile GEMMs.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PrecisionChoice {
    /// LOBPCG: f32 while it improves the residuals, then f64; fixed iterations: f32 for
    /// float32 stored values, f64 otherwise.
    Auto,
    /// f64 tiles, DGEMM.
    F64,
    /// f32 tiles, SGEMM.
    F32,
}

impl SketchArgs {
    /// The options for `operand`, whose generated values (if any) use `matrix_seed`.
    fn options(&self, matrix_seed: u64, operand: &Operand) -> Result<RsvdOptions, CliError> {
        let values = match operand {
            Operand::Genotypes(..) => rankwise::Values::Genotypes,
            Operand::Dense(s) => rankwise::Values::Dense { f32: s.holds_f32() },
        };
        let choice = rankwise::SolverChoice {
            k: self.k,
            oversample: self.oversample,
            power_iters: self.power_iters,
            method: self.method.map(|m| match m {
                MethodChoice::Lobpcg => Method::Lobpcg,
                MethodChoice::Lanczos => Method::Lanczos,
                MethodChoice::Subspace => Method::SubspaceIteration,
                MethodChoice::BlockKrylov => Method::BlockKrylov,
            }),
            tol: self.tol,
            max_passes: self.max_passes,
            precision: match self.precision {
                PrecisionChoice::Auto => None,
                PrecisionChoice::F64 => Some(Precision::F64),
                PrecisionChoice::F32 => Some(Precision::F32),
            },
            seed: self
                .sketch_seed
                .unwrap_or_else(|| matrix_seed.wrapping_add(1)),
            probes: self.probes,
        };
        let options = choice.options(values).map_err(super::cli_error)?;
        Ok(RsvdOptions {
            projection: match self.projection {
                ProjectionChoice::Fused => Projection::Fused,
                ProjectionChoice::Separate => Projection::Separate,
            },
            ..options
        })
    }
}

/// `rankwise rsvd`.
#[derive(Args, Debug, Clone)]
pub(super) struct RsvdArgs {
    #[command(flatten)]
    matrix: MatrixArgs,
    #[command(flatten)]
    sketch: SketchArgs,
    #[command(flatten)]
    run: RunArgs,
    /// Write U, S, Vᵀ and the run report as a Zarr group here (must not exist).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The Zarr format of the `--out` group: 3, or 2 for readers that only know Zarr v2
    /// (sgkit 0.10, zarr-python 2).
    #[arg(long, value_enum, default_value = "3", requires = "out")]
    zarr_format: ZarrFormatArg,
    /// Print the run report as JSON on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

impl RsvdArgs {
    pub(super) fn run(&self) -> &RunArgs {
        &self.run
    }
}

/// `rankwise pca`.
#[derive(Args, Debug, Clone)]
pub(super) struct PcaArgs {
    /// Read dosages (variants × samples, integers, −1 missing) from this Zarr array
    /// (`PATH` or `PATH:ARRAY`) instead of generating them.
    #[arg(long, value_name = "PATH[:ARRAY]", conflicts_with_all = ["rows", "cols", "seed", "missing", "populations", "fst", "vcf_zarr", "bed"])]
    zarr: Option<String>,
    /// Read genotypes from a VCF Zarr store (bio2zarr's layout: `call_genotype`,
    /// `call_genotype_mask`, `sample_id`).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["rows", "cols", "seed", "missing", "populations", "fst", "bed"])]
    vcf_zarr: Option<PathBuf>,
    /// Read genotypes from a PLINK 1 binary fileset (`PREFIX.bed`, `.bim`, `.fam`;
    /// variant-major): dosages of the `.bim`'s first allele, the `.fam`'s IDs.
    #[arg(long, value_name = "PREFIX", conflicts_with_all = ["rows", "cols", "seed", "missing", "populations", "fst"])]
    bed: Option<PathBuf>,
    /// Variants (rows) of the generated genotype matrix.
    #[arg(long, required_unless_present_any = ["zarr", "vcf_zarr", "bed"])]
    rows: Option<u64>,
    /// Samples (columns).
    #[arg(long, required_unless_present_any = ["zarr", "vcf_zarr", "bed"])]
    cols: Option<u64>,
    /// Variants per panel. With `--zarr`/`--vcf-zarr`, a multiple of the stored chunk
    /// rows; the stored chunks by default. With `--bed`, any number; by default panels
    /// of at most 128 MiB of dosages, at least 64 of them where there are enough variants.
    #[arg(long, required_unless_present_any = ["zarr", "vcf_zarr", "bed"])]
    chunk_rows: Option<u64>,
    /// Seed of the generated genotypes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Fraction of calls generated missing (−1), imputed to the variant mean.
    #[arg(long, default_value_t = 0.0)]
    missing: f64,
    /// Populations: the samples are split into K contiguous blocks whose allele
    /// frequencies drift apart (Balding–Nichols), so the PCs have structure to find.
    #[arg(long, default_value_t = 1)]
    populations: u64,
    /// Fixation index F_ST of the populations' frequencies, in (0, 1).
    #[arg(long, default_value_t = rankwise_sources::DEFAULT_FST)]
    fst: f64,
    /// Exclude variants whose minor allele frequency among their calls is below MIN, as
    /// PLINK's `--maf` does (a variant exactly at MIN is kept). Excluded variants get zero
    /// loadings and do not count among the variants that scale the eigenvalues.
    #[arg(long, value_name = "MIN", default_value_t = 0.0)]
    maf: f64,
    /// Exclude variants whose fraction of missing calls is above MAX, as PLINK's `--geno`
    /// does.
    #[arg(long, value_name = "MAX", default_value_t = 1.0)]
    geno: f64,
    /// Exclude variants whose Hardy–Weinberg exact test p-value (Wigginton et al. 2005,
    /// from the called genotypes) is below P, as PLINK 2's `--hwe P` does; `--hwe P midp`
    /// uses the mid-p value. Every variant is tested as an autosome's.
    #[arg(long, value_names = ["P", "midp"], num_args = 1..=2)]
    hwe: Vec<String>,
    /// Keep only the variants whose IDs FILE lists (whitespace-separated, as PLINK's
    /// `--extract` reads them: a `plink2 --indep-pairwise` `.prune.in`, say). IDs come from
    /// the `.bim` (`--bed`) or `variant_id` (`--vcf-zarr`).
    #[arg(long, value_name = "FILE")]
    extract: Option<PathBuf>,
    /// Exclude the variants whose IDs FILE lists (PLINK's `--exclude`).
    #[arg(long, value_name = "FILE")]
    exclude: Option<PathBuf>,
    /// Keep only the variants on these chromosomes, as PLINK's `--chr` does: names and
    /// ranges, comma-separated (`1-4,22,X`); a `chr` prefix is ignored, and 23–26 are X,
    /// Y, XY, MT. Chromosomes come from the `.bim` (`--bed`) or `contig_id` and
    /// `variant_contig` (`--vcf-zarr`).
    #[arg(long, value_name = "LIST")]
    chr: Option<String>,
    /// Exclude the variants on these chromosomes (PLINK's `--not-chr`; lists as `--chr`).
    #[arg(long = "not-chr", value_name = "LIST")]
    not_chr: Option<String>,
    /// Keep only the variants on autosomes 1–22, as PLINK's `--autosome` does (X, Y, XY,
    /// MT, unplaced and other contigs are excluded).
    #[arg(long)]
    autosome: bool,
    /// Keep the variants on X, Y and MT, which `pca` leaves out by default as `plink2 --pca`
    /// does ("Excluding N variants on non-autosomes from PCA"). XY (the pseudo-autosomal
    /// regions) and other contigs stay in either way.
    #[arg(long = "include-non-autosomes")]
    include_non_autosomes: bool,
    /// Keep only the samples FILE lists, as PLINK 2's `--keep` reads it: a line per
    /// sample, `FID IID`, or `IID` alone for family 0 (or the columns a `#FID IID`/`#IID`
    /// header names). A `.fam`'s samples are matched by FID and IID, a store's by
    /// `sample_id` alone. Frequencies and filters are those of the kept samples.
    #[arg(long, value_name = "FILE")]
    keep: Option<PathBuf>,
    /// Drop the samples FILE lists (PLINK's `--remove`; the format of `--keep`).
    #[arg(long, value_name = "FILE")]
    remove: Option<PathBuf>,
    /// Colour the plot's samples by the groups FILE gives: `IID GROUP` or `FID IID GROUP`
    /// lines (`#` lines skipped). By default a generated cohort's populations, else the
    /// `.fam`'s FIDs where they name 2 to 20 groups.
    #[arg(long, value_name = "FILE")]
    groups: Option<PathBuf>,
    #[command(flatten)]
    sketch: SketchArgs,
    #[command(flatten)]
    run: RunArgs,
    /// Write loadings (U), singular values, sample PCs (Vt), eigenvalues, explained
    /// variance, each variant's allele frequency and calls, and the report as a Zarr group
    /// here (sgkit's variable and dimension names), with PLINK 2 `.eigenvec` and
    /// `.eigenval` files, a PC1/PC2 scatter plot (`.png`), and what `rankwise project` (or
    /// `plink2 --score`) reads to project new samples: `.eigenvec.var` (variant weights, as
    /// `plink2 --pca var-wts`) and `.afreq`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The Zarr format of the `--out` group: 3, or 2 for sgkit 0.10 (`sgkit.load_dataset`),
    /// which reads Zarr v2 only.
    #[arg(long, value_enum, default_value = "3", requires = "out")]
    zarr_format: ZarrFormatArg,
    /// Print the run report as JSON on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
}

impl PcaArgs {
    pub(super) fn run(&self) -> &RunArgs {
        &self.run
    }
}

pub(super) fn rsvd_command(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &RsvdArgs,
) -> Result<Option<String>, CliError> {
    let start = Instant::now();
    injected_fault(rt, "start")?;
    let m = &a.matrix;
    let p = super::problem(m)?;
    let shape = super::user_shape(p.source.shape(), p.transposed);
    let describe = super::matrix_json(m, p.source.describe());
    let problem = RsvdProblem {
        operand: Operand::Dense(p.source),
        grid: p.grid,
        transposed: p.transposed,
        rank_panels: None,
    };
    let options = RsvdOptions {
        segment_bytes: a.run.segment_bytes()?,
        ..a.sketch.options(m.seed, &problem.operand)?
    };
    let job = Job {
        command: "rsvd",
        shape,
        describe,
        out: a.out.clone(),
        zarr_format: a.zarr_format.into(),
        json: a.json,
        require_converged: a.sketch.require_converged,
        machine_limit: a.sketch.machine_limit,
        plan_only: a.sketch.plan,
        groups: None,
    };
    run_job(rt, launch, &job, &problem, &options, start)
}

pub(super) fn pca_command(
    rt: &Runtime,
    launch: &LaunchInfo,
    a: &PcaArgs,
) -> Result<Option<String>, CliError> {
    let start = Instant::now();
    injected_fault(rt, "start")?;
    if !(0.0..1.0).contains(&a.missing) {
        return Err(CliError::Option {
            option: "--missing",
            message: format!("{} is not a fraction in [0, 1)", a.missing),
        });
    }
    let filter = VariantFilter::new(a.maf, a.geno)?;
    let filter = match a.hwe.as_slice() {
        [] => filter,
        [p, rest @ ..] => {
            let how = match rest {
                [] => HweP::Exact,
                [m] if m == "midp" => HweP::MidP,
                other => {
                    return Err(CliError::Option {
                        option: "--hwe",
                        message: format!("{other:?}: the only modifier is `midp`"),
                    })
                }
            };
            let p = p.parse::<f64>().map_err(|e| CliError::Option {
                option: "--hwe",
                message: format!("{p:?} is not a p-value: {e}"),
            })?;
            filter.with_hwe(p, how)?
        }
    };
    let (source, describe): (Arc<dyn GenotypeSource>, serde_json::Value) =
        match (&a.zarr, &a.vcf_zarr, &a.bed) {
            (_, _, Some(path)) => {
                let b = Input::Bed(path.clone()).genotypes().map_err(cli_error)?;
                let d = json!({"bed": path, "source": b.describe()});
                (b, d)
            }
            (Some(spec), _, _) => {
                let z = Input::Zarr(spec.clone()).genotypes().map_err(cli_error)?;
                let d = json!({"zarr": spec, "source": z.describe()});
                (z, d)
            }
            (None, Some(path), None) => {
                let v = Input::VcfZarr(path.clone())
                    .genotypes()
                    .map_err(cli_error)?;
                let d = json!({"vcf_zarr": path, "source": v.describe()});
                (v, d)
            }
            (None, None, None) => {
                let (rows, cols) = (a.rows.unwrap_or(0), a.cols.unwrap_or(0));
                rankwise_sources::Generated::check_shape(rows, cols)?;
                let g = Generated::new(rows, cols, a.seed, Dist::Genotype)
                    .with_missing(a.missing)
                    .with_populations(a.populations, a.fst)?;
                (
                    Arc::new(g),
                    json!({
                        "dist": "genotype",
                        "seed": a.seed,
                        "missing": a.missing,
                        "populations": a.populations,
                        "fst": a.fst,
                    }),
                )
            }
        };
    let list = |flag: &'static str, path: &Option<PathBuf>, samples: bool| {
        path.as_deref()
            .map(|p| {
                let read = if samples {
                    IdList::read_samples(p)
                } else {
                    IdList::read_variants(p)
                };
                read.map_err(|e| CliError::Option {
                    option: flag,
                    message: format!("{}: {e}", p.display()),
                })
            })
            .transpose()
    };
    let params = PcaParams {
        filter,
        selection: Selection {
            keep: list("--keep", &a.keep, true)?,
            remove: list("--remove", &a.remove, true)?,
            extract: list("--extract", &a.extract, false)?,
            exclude: list("--exclude", &a.exclude, false)?,
            chromosomes: a.chr.clone(),
            not_chromosomes: a.not_chr.clone(),
            autosomes_only: a.autosome,
            non_autosomes: a.include_non_autosomes,
        },
        panel_rows: a.chunk_rows,
        ..PcaParams::default()
    };
    let problem = pca_problem(source, &params, super::flag_of).map_err(cli_error)?;
    let shape = problem.operand.shape();
    let options = RsvdOptions {
        segment_bytes: a.run.segment_bytes()?,
        ..a.sketch.options(a.seed, &problem.operand)?
    };
    let job = Job {
        command: "pca",
        shape,
        describe,
        out: a.out.clone(),
        zarr_format: a.zarr_format.into(),
        json: a.json,
        require_converged: a.sketch.require_converged,
        machine_limit: a.sketch.machine_limit,
        plan_only: a.sketch.plan,
        groups: a.groups.clone(),
    };
    run_job(rt, launch, &job, &problem, &options, start)
}

struct Job {
    command: &'static str,
    shape: (u64, u64),
    describe: serde_json::Value,
    out: Option<PathBuf>,
    /// `--zarr-format`.
    zarr_format: ZarrFormat,
    json: bool,
    require_converged: bool,
    /// `--machine-limit`.
    machine_limit: bool,
    /// `--plan`: print the plan and stop.
    plan_only: bool,
    /// `pca --groups`.
    groups: Option<PathBuf>,
}

impl Job {
    fn is_pca(&self) -> bool {
        self.command == "pca"
    }
}

fn run_job(
    rt: &Runtime,
    launch: &LaunchInfo,
    job: &Job,
    problem: &RsvdProblem,
    options: &RsvdOptions,
    start: Instant,
) -> Result<Option<String>, CliError> {
    // Every rank refuses bad options or a bad budget before any output exists.
    let plan = RsvdPlan::new(problem, options, rt.world())?;
    // A `--groups` file that cannot be used fails every rank now, not rank 0 after the
    // passes (the figure is drawn from it at the end).
    if let (Some(file), Operand::Genotypes(g, _)) = (&job.groups, &problem.operand) {
        let ids = g
            .sample_ids()
            .unwrap_or_else(|| (0..job.shape.1).map(|j| format!("sample_{j}")).collect());
        let fids = g.family_ids().filter(|f| f.len() == ids.len());
        groups_file(file, fids.as_deref(), &ids)?;
    }
    if job.plan_only {
        if rt.rank() != 0 {
            return Ok(None);
        }
        return Ok(Some(if job.json {
            serde_json::to_string_pretty(&plan).unwrap_or_default() + "\n"
        } else {
            plan_text(rt, job, problem, options, &plan)
        }));
    }
    let output = match &job.out {
        Some(out) if job.is_pca() => {
            let files = pca_files(job, out);
            let group = PcaGroup::open(rt, files, problem, options.k).map_err(cli_error)?;
            super::note_stale(group.stale());
            Some(JobOutput::Pca(Box::new(group)))
        }
        Some(out) => {
            let layout = result_layout(problem, options.k, job.zarr_format, job.command, false);
            Some(JobOutput::Plain(open_output(rt, out, layout)?))
        }
        None => None,
    };
    rt.progress().set_title(
        format!("{} k = {}", job.command, options.k),
        problem.operand.describe(),
    );
    let result = compute(rt, launch, job, problem, options, output.as_ref(), start);
    match output {
        Some(JobOutput::Pca(group)) => {
            let result = result.and_then(|done| commit_pca(rt, job, &group, done));
            super::finish_with(result, |own| group.abandon(rt, own)).map(|d| d.text)
        }
        Some(JobOutput::Plain(o)) => finish_output(rt, result, Some(o)).map(|d| d.text),
        None => result.map(|d| d.text),
    }
}

/// A PCA's files at `out`: the group, PLINK 2's side files and the plot.
fn pca_files(job: &Job, out: &Path) -> PcaFiles {
    PcaFiles {
        out: out.to_path_buf(),
        zarr_format: job.zarr_format,
        extra_side_files: vec!["png"],
        command: job.command.into(),
    }
}

/// Where a job's results go: a PCA's group and side files, or another command's group.
enum JobOutput {
    Pca(Box<PcaGroup>),
    Plain(OpenOutput),
}

impl JobOutput {
    fn group(&self) -> &Arc<SvdOutput> {
        match self {
            JobOutput::Pca(g) => g.output(),
            JobOutput::Plain(o) => &o.0,
        }
    }
}

/// What rank 0 keeps for the files written after the group is committed.
struct Done {
    text: Option<String>,
    plot: Option<PlotData>,
}

/// What a PCA's plot is drawn from: the sample PCs, each component's share of the
/// variance, and the samples' groups (each sample's, and their names).
struct PlotData {
    pcs: Array2<f64>,
    explained: Vec<f64>,
    groups: Option<(Vec<usize>, Vec<String>)>,
}

/// Publishes a PCA's group and side files, the plot among them, on every rank
/// ([`PcaGroup::commit`]).
fn commit_pca(rt: &Runtime, job: &Job, group: &PcaGroup, done: Done) -> Result<Done, CliError> {
    let out = job.out.as_deref().unwrap_or(Path::new("."));
    let title = format!("rankwise pca: {}", out.display());
    let plot = |path: &Path| -> Result<(), CallerError> {
        // (A failure test's hook: `.eigenvec` and `.eigenval` are written, the rest not.)
        injected_fault(rt, "side-files")?;
        let Some(PlotData {
            pcs,
            explained,
            groups,
        }) = &done.plot
        else {
            return Err("internal: rank 0 has no PCs to plot".into());
        };
        let groups = groups
            .as_ref()
            .map(|(of_sample, names)| Groups { of_sample, names });
        plot_pcs(path, pcs.view(), explained, &title, groups.as_ref()).map_err(|e| {
            Box::new(CliError::Option {
                option: "--out",
                message: e.to_string(),
            }) as CallerError
        })
    };
    group.commit(rt, &[("png", &plot)]).map_err(cli_error)?;
    Ok(done)
}

fn compute(
    rt: &Runtime,
    launch: &LaunchInfo,
    job: &Job,
    problem: &RsvdProblem,
    options: &RsvdOptions,
    output: Option<&JobOutput>,
    start: Instant,
) -> Result<Done, CliError> {
    let sink = match output {
        Some(JobOutput::Pca(g)) => Some(g.sink(problem)),
        Some(JobOutput::Plain(o)) => Some(factor_sink(Arc::clone(&o.0), problem.transposed)),
        None => None,
    };
    injected_fault(rt, "before-svd")?;
    let mut result = rsvd(rt, problem, options, sink)?;
    // Why the solver stopped names its parameters; the warning and the report name flags.
    let stopped = result.convergence.stopped.take();
    result.convergence.stopped = stopped.map(|s| super::with_flags(&s));
    injected_fault(rt, "after-svd")?;
    // Every rank holds the same convergence report, so every rank fails alike.
    let c = &result.convergence;
    if !c.converged {
        let what = unconverged_text(job, c);
        if job.require_converged {
            return Err(CliError::NotConverged(what));
        }
        if rt.rank() == 0 {
            eprintln!("rankwise {}: warning: {what}", job.command);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Collective: every rank probes at once, before the figures gather on rank 0. A
    // dense operand's passes produce its values before they multiply them, so producing
    // them is part of the limit; a genotype operand's products read packed codes, and its
    // limit is the GEMM rate's alone.
    let rates = match job.machine_limit {
        true => {
            let gemm = super::machine_gemm_peak(rt, options.precision)?;
            let production = match &problem.operand {
                Operand::Dense(_) => Some(rankwise::linalg::tile_production_peak(
                    rt,
                    &problem.operand,
                    result.plan.first_panel(rt.rank()),
                    options.precision,
                )?),
                Operand::Genotypes(..) => None,
            };
            Some((gemm, production))
        }
        false => None,
    };
    let Some(ranks) = super::gather_rank_figures(rt, RsvdWork::of(&result))? else {
        return Ok(Done {
            text: None,
            plot: None,
        });
    };
    let limit = rates.map(|(gemm, production)| {
        let name = options.precision.name();
        let limit = match production {
            Some(rate) => {
                let all: Vec<_> = ranks.iter().map(|r| &r.work.timings[..]).collect();
                let produced = |phase: &str| produced_on_all_ranks(&all, phase);
                MachineLimit::with_production(&result.timings, produced, name, gemm.flops, rate)
            }
            None => MachineLimit::of(&result.timings, name, gemm.flops),
        };
        limit.with_kernels(gemm.kernels, gemm.loaded_flops)
    });
    let pca = job.is_pca().then(|| pca_figures(&result));
    let report = report_json(
        rt,
        launch,
        job,
        problem,
        options,
        &result,
        pca.as_ref(),
        ranks,
        (start, elapsed),
        limit.clone(),
    );
    match output {
        Some(JobOutput::Pca(g)) => g.write_result(problem, &result).map_err(cli_error)?,
        Some(JobOutput::Plain(o)) => write_factors(&o.0, &result)?,
        None => {}
    }
    if let Some(o) = output.map(JobOutput::group) {
        o.write_report(&report)?;
        if !job.is_pca() {
            o.commit()?;
        }
    }
    let text = if job.json {
        serde_json::to_string_pretty(&report).unwrap_or_default() + "\n"
    } else {
        summary_text(
            rt,
            job,
            problem,
            options,
            &result,
            pca.as_ref(),
            elapsed,
            limit.as_ref(),
        )
    };
    // The plot of a PCA with an output, drawn on rank 0 when the group is committed.
    let plot = match (pca, output) {
        (Some(p), Some(JobOutput::Pca(_))) => {
            let (ids, families, groups) = match &problem.operand {
                Operand::Genotypes(g, _) => (g.sample_ids(), g.family_ids(), g.sample_groups()),
                Operand::Dense(_) => (None, None, None),
            };
            let sample_ids =
                ids.unwrap_or_else(|| (0..job.shape.1).map(|j| format!("sample_{j}")).collect());
            let family_ids = families.filter(|f| f.len() == sample_ids.len());
            let groups = match &job.groups {
                Some(file) => Some(groups_file(file, family_ids.as_deref(), &sample_ids)?),
                None => groups
                    .filter(|g| g.len() == sample_ids.len())
                    .or_else(|| family_ids.filter(|f| fids_are_groups(f)))
                    .map(|names| indexed(&names)),
            };
            Some(PlotData {
                pcs: result.wt.t().to_owned(),
                explained: p.explained,
                groups,
            })
        }
        _ => None,
    };
    Ok(Done {
        text: Some(text),
        plot,
    })
}

/// `--plan`'s text: the matrix, the panels, the solver's passes and each actor's share
/// and memory.
fn plan_text(
    rt: &Runtime,
    job: &Job,
    problem: &RsvdProblem,
    options: &RsvdOptions,
    plan: &RsvdPlan,
) -> String {
    use std::fmt::Write;
    let g = plan.grid;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "rankwise {} plan: {}",
        job.command,
        problem.operand.describe()
    );
    let _ = writeln!(
        s,
        "grid: {} × {} in {} panels of {} rows{}",
        g.rows,
        g.cols,
        g.panels(),
        g.chunk_rows,
        if problem.transposed {
            " (the transpose of the input)"
        } else {
            ""
        }
    );
    let solver = match options.method {
        Method::Lobpcg | Method::Lanczos => format!(
            "{} to tol {:.0e}, at most {} passes",
            options.method.name(),
            options.tol,
            options.max_passes
        ),
        m => format!("{m:?}, {} passes", plan.passes),
    };
    let _ = writeln!(
        s,
        "k = {}, sketch {} columns, basis {}; {solver}",
        options.k, plan.sketch, plan.basis
    );
    let _ = writeln!(
        s,
        "ranks: {}, actors: {}, transport {}",
        plan.ranks,
        rt.world().actors(),
        rt.comm().name()
    );
    s.push_str(&super::actor_table(rt, g, &plan.placement, &plan.memory));
    s
}

/// Each sample's group as an index into the groups' names (in order of first sight).
fn indexed(labels: &[String]) -> (Vec<usize>, Vec<String>) {
    let mut names: Vec<String> = Vec::new();
    let of_sample = labels
        .iter()
        .map(|l| match names.iter().position(|n| n == l) {
            Some(i) => i,
            None => {
                names.push(l.clone());
                names.len() - 1
            }
        })
        .collect();
    (of_sample, names)
}

/// Whether a `.fam`'s FIDs name groups worth colouring: 2 to 20 of them, fewer than the
/// samples (an FID per sample, or every FID 0, names none).
fn fids_are_groups(fids: &[String]) -> bool {
    let distinct: std::collections::BTreeSet<&String> = fids.iter().collect();
    (2..=20).contains(&distinct.len()) && distinct.len() < fids.len()
}

/// `pca --groups FILE`: `IID GROUP` or `FID IID GROUP` lines; samples it does not list are
/// in the group `unlisted`.
fn groups_file(
    file: &Path,
    fids: Option<&[String]>,
    iids: &[String],
) -> Result<(Vec<usize>, Vec<String>), CliError> {
    let bad = |message: String| CliError::Option {
        option: "--groups",
        message: format!("{}: {message}", file.display()),
    };
    let text = rankwise_sources::read_regular_to_string(file).map_err(|e| bad(e.to_string()))?;
    let mut by_pair = std::collections::HashMap::new();
    let mut by_iid = std::collections::HashMap::new();
    for (no, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [] => {}
            [first, ..] if first.starts_with('#') => {}
            [iid, group] => {
                by_iid.insert(iid.to_string(), group.to_string());
            }
            [fid, iid, group, ..] => {
                by_pair.insert((fid.to_string(), iid.to_string()), group.to_string());
                by_iid.insert(iid.to_string(), group.to_string());
            }
            [_] => return Err(bad(format!("line {} has no group (`IID GROUP`)", no + 1))),
        }
    }
    let labels: Vec<String> = iids
        .iter()
        .enumerate()
        .map(|(j, iid)| {
            let pair = fids.map(|f| (f[j].clone(), iid.clone()));
            pair.and_then(|p| by_pair.get(&p))
                .or_else(|| by_iid.get(iid))
                .cloned()
                .unwrap_or_else(|| "unlisted".into())
        })
        .collect();
    if labels.iter().all(|l| l == "unlisted") {
        return Err(bad(format!(
            "names none of the {} samples (by IID, or FID and IID)",
            iids.len()
        )));
    }
    Ok(indexed(&labels))
}

/// PCA figures from the singular values.
struct PcaFigures {
    /// Eigenvalues of the genetic relationship matrix `XᵀX / M` (PLINK's scale: M counts
    /// every variant given but those the filters excluded, the dropped monomorphic ones
    /// too, as PLINK 2's `--pca` does).
    eigenvalues: Vec<f64>,
    /// σᵢ² / ‖X‖_F².
    explained: Vec<f64>,
}

fn pca_figures(r: &RsvdResult) -> PcaFigures {
    let (eigenvalues, explained) = pca_scales(r);
    PcaFigures {
        eigenvalues,
        explained,
    }
}

/// Which components missed the tolerance, and why the solver stopped, for the warning
/// and the error of `--require-converged`.
fn unconverged_text(job: &Job, c: &rankwise_linalg::Convergence) -> String {
    let name = if job.is_pca() { "PC" } else { "component " };
    super::with_flags(&c.describe(name))
}

/// Floating-point operations of the run's GEMMs with the thin matrices. The iterative
/// solvers' passes are as wide as their search blocks were, which their phases count.
fn run_flops(m: u64, n: u64, options: &RsvdOptions, r: &RsvdResult) -> f64 {
    if options.method.iterates() {
        r.timings.iter().map(|t| t.flops).sum()
    } else {
        gemm_flops(m, n, options)
    }
}

/// Floating-point operations of the fixed-iteration methods' GEMMs with the thin matrices.
fn gemm_flops(m: u64, n: u64, options: &RsvdOptions) -> f64 {
    let (l, r, b, k) = (
        options.sketch() as f64,
        options.probes as f64,
        options.basis() as f64,
        options.k as f64,
    );
    let mn = 2.0 * m as f64 * n as f64;
    let q = options.power_iters as f64;
    // A·Ω with the probes, two products per iteration, the last projection with the
    // basis, in whichever passes they run, and the residual check's A·V.
    mn * ((l + r) + 2.0 * q * l + b + k)
}

#[allow(clippy::too_many_arguments)]
fn report_json(
    rt: &Runtime,
    launch: &LaunchInfo,
    job: &Job,
    problem: &RsvdProblem,
    options: &RsvdOptions,
    r: &RsvdResult,
    pca: Option<&PcaFigures>,
    ranks: Vec<RankReport<RsvdWork>>,
    (start, elapsed): (Instant, f64),
    machine_limit: Option<MachineLimit>,
) -> RunReport<RsvdBody, RsvdWork> {
    let (m, n) = problem.operand.shape();
    let flops = run_flops(m, n, options, r);
    RunReport {
        command: job.command.to_string(),
        body: RsvdBody {
            shape: [job.shape.0, job.shape.1],
            matrix: job.describe.clone(),
            source: problem.operand.describe(),
            options: options.clone(),
            passes: r.passes,
            projections: r.projections.clone(),
            condition_limit: r.condition_limit,
            transposed: problem.transposed,
            grid: r.plan.grid,
            placement: r.plan.placement.clone(),
            memory: r.plan.memory.clone(),
            singular_values: r.s.clone(),
            convergence: r.convergence.clone(),
            converged: r.convergence.converged,
            total_sum_squares: r.total_sum_squares,
            error_estimate: r.estimate.clone(),
            genotypes: r.genotypes.clone(),
            eigenvalues: pca.map(|p| p.eigenvalues.clone()),
            explained_variance_ratio: pca.map(|p| p.explained.clone()),
            gemm_flops: flops,
            gemm_gflop_per_s: flops / elapsed / 1e9,
            machine_limit,
        },
        run: super::run_info(rt, launch, start),
        seconds: elapsed,
        per_rank: ranks,
    }
}

/// How many passes ran in each precision: `f32 ×12, f64 ×3`.
fn precisions_text(p: &[Precision]) -> String {
    let f32s = p.iter().filter(|&&x| x == Precision::F32).count();
    let f64s = p.len() - f32s;
    match (f32s, f64s) {
        (0, _) => "f64".into(),
        (_, 0) => "f32".into(),
        (a, b) => format!("f32 ×{a}, f64 ×{b}"),
    }
}

/// How the projections went, for the summary line: how many were fused into the range
/// pass before, and the largest cond(Y) of those that were.
fn projections_text(r: &RsvdResult) -> String {
    let planned: Vec<f64> = r.projections.iter().filter_map(|p| p.condition).collect();
    if planned.is_empty() {
        return String::new();
    }
    let fused = r.projections.iter().filter(|p| p.fused).count();
    let worst = planned.iter().fold(0.0f64, |a, &b| a.max(b));
    format!(
        " ({fused} of {} projections fused into the pass before; largest cond(Y) {worst:.3}, \
         limit {:.0e})",
        r.projections.len(),
        r.condition_limit
    )
}

fn summary_text(
    rt: &Runtime,
    job: &Job,
    problem: &RsvdProblem,
    options: &RsvdOptions,
    r: &RsvdResult,
    pca: Option<&PcaFigures>,
    elapsed: f64,
    limit: Option<&MachineLimit>,
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let g = r.plan.grid;
    let _ = writeln!(
        s,
        "rankwise {}: {}",
        job.command,
        problem.operand.describe()
    );
    let solver = match options.method {
        Method::Lobpcg | Method::Lanczos => {
            format!("{} to tol {:.0e}", options.method.name(), options.tol)
        }
        m => format!("{} power iteration(s), {m:?}", options.power_iters),
    };
    let _ = writeln!(
        s,
        "  k = {}, oversample {}, {solver}: {} passes ({}){}; {} panels of {} rows{}; {} \
         rank(s), {} actor(s), transport {}",
        options.k,
        options.oversample,
        r.passes,
        precisions_text(&r.convergence.pass_precisions),
        projections_text(r),
        g.panels(),
        g.chunk_rows,
        if problem.transposed {
            " (through the transpose)"
        } else {
            ""
        },
        rt.comm().size(),
        rt.world().actors(),
        rt.comm().name()
    );
    if let Some(gs) = &r.genotypes {
        let filtered = if gs.filter == VariantFilter::NONE {
            String::new()
        } else {
            format!(
                "; {} excluded by {}",
                gs.variants_filtered,
                super::with_flags(&gs.filter.options())
            )
        };
        let _ = writeln!(
            s,
            "  variants used {} of {} ({} dropped: monomorphic or no calls{filtered}); \
             missing calls {} of {} ({:.2} %), imputed to the variant mean",
            gs.variants_used,
            gs.variants,
            gs.variants_dropped,
            gs.missing_calls,
            gs.calls,
            100.0 * gs.missing_calls as f64 / gs.calls.max(1) as f64
        );
    }
    let c = &r.convergence;
    let mark = |i: usize| {
        let met = if c.met[i] { "" } else { "  NOT CONVERGED" };
        format!("{:.2e}{met}", c.residuals[i])
    };
    match pca {
        Some(p) => {
            let _ = writeln!(
                s,
                "components: σ, eigenvalue (GRM), explained variance, residual {}",
                c.measure
            );
            for (i, v) in r.s.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "  PC{:<3} {:.10e}  {:.6e}  {:.4} %  {}",
                    i + 1,
                    v,
                    p.eigenvalues[i],
                    100.0 * p.explained[i],
                    mark(i)
                );
            }
        }
        None => {
            let _ = writeln!(
                s,
                "singular values ({}), residual {}:",
                r.s.len(),
                c.measure
            );
            for (i, v) in r.s.iter().enumerate() {
                let _ = writeln!(s, "  σ{:<3} {:.15e}  {}", i + 1, v, mark(i));
            }
        }
    }
    let _ = writeln!(
        s,
        "convergence: {} (tol {:.0e}; largest residual {:.2e}){}",
        if c.converged {
            format!("all {} components converged", c.residuals.len())
        } else {
            format!(
                "{} of {} components NOT converged",
                c.unconverged().len(),
                c.residuals.len()
            )
        },
        c.tol,
        c.residuals.iter().fold(0.0f64, |a, &b| a.max(b)),
        c.stopped
            .as_ref()
            .map(|s| format!("; {s}"))
            .unwrap_or_default()
    );
    if let Some(e) = &r.estimate {
        let _ = writeln!(s, "error estimate ({} Gaussian probes):", e.probes);
        let _ = writeln!(
            s,
            "  ‖A − UΣVᵀ‖_F ≈ {:.4e} ({:.4e} of ‖A‖_F = {:.4e})",
            e.frobenius, e.relative_frobenius, e.norm_frobenius
        );
        let _ = writeln!(
            s,
            "  ‖A − UΣVᵀ‖₂ ≤ {:.4e} except with probability {:.0e}",
            e.spectral_bound, e.failure_probability
        );
    }
    if r.gpu_panels > 0 {
        let _ = writeln!(
            s,
            "GPU: {} panel passes on rank 0's GPU actors{}",
            r.gpu_panels,
            if r.gpu_staged_bytes > 0 {
                format!(
                    ", {:.2} GB staged from host to device",
                    r.gpu_staged_bytes as f64 / 1e9
                )
            } else {
                String::new()
            }
        );
        if r.gpu_qrs > 0 {
            let _ = writeln!(s, "  panel QRs by cuSOLVER: {}", r.gpu_qrs);
        }
        if r.gpu_kept.passes > 0 {
            let _ = writeln!(
                s,
                "  panel passes from genotypes kept on the device as 2-bit codes: {} ({:.2} GB \
                 kept)",
                r.gpu_kept.passes,
                r.gpu_kept.bytes as f64 / 1e9
            );
        }
        if let Some(d) = &r.gpu_decode {
            let _ = writeln!(
                s,
                "  Zarr chunks decoded on the device: {} ({:.2} GB decoded from {:.2} GB; \
                 nvCOMP {:.3} s, copies {:.3} s, file reads {:.3} s)",
                d.device.frames,
                d.device.decoded_bytes as f64 / 1e9,
                d.device.staged_bytes as f64 / 1e9,
                d.device.decompress_seconds,
                d.device.copy_seconds,
                d.read_seconds
            );
            if d.host_chunks > 0 {
                let _ = writeln!(
                    s,
                    "  chunks decoded on the host instead: {} ({})",
                    d.host_chunks,
                    d.host_reason.as_deref().unwrap_or("")
                );
            }
        }
        let _ = writeln!(s, "  sums across ranks: {}", r.collectives);
    }
    if let Some(note) = &r.gpu_note {
        let _ = writeln!(s, "note: {note}");
    }
    let _ = writeln!(s, "phases (rank 0):");
    for t in &r.timings {
        let mut line = crate::report::phase_line(t);
        match limit.map(|l| (l.share_of(&t.phase), l.production_gb_per_s)) {
            Some((Some(p), Some(_))) => {
                let _ = write!(
                    line,
                    "   {:.1} GFLOP/s, limit {}, {:.0} %",
                    p.gflop_per_s,
                    seconds(p.limit_seconds),
                    100.0 * p.share
                );
            }
            Some((Some(p), None)) => {
                let _ = write!(
                    line,
                    "   {:.1} GFLOP/s, {:.0} % of the machine's GEMM",
                    p.gflop_per_s,
                    100.0 * p.share
                );
            }
            _ => {}
        }
        let _ = writeln!(s, "{line}");
    }
    if let Some(l) = limit {
        let _ = writeln!(s, "{}", crate::report::machine_limit_line(l));
    }
    let (m, n) = problem.operand.shape();
    let flops = run_flops(m, n, options, r);
    let _ = writeln!(
        s,
        "total {}; GEMMs {:.1} GFLOP/s; produced {} on rank 0; peak RSS rank 0 {}",
        seconds(elapsed),
        flops / elapsed / 1e9,
        format_bytes(r.bytes_produced),
        peak_rss_bytes()
            .map(format_bytes)
            .unwrap_or_else(|| "unknown".into())
    );
    if let Some(out) = &job.out {
        let _ = writeln!(s, "output: {}", out.display());
        if job.is_pca() {
            for f in pca_files(job, out).side_files() {
                let _ = writeln!(s, "        {}", f.display());
            }
        }
    }
    s
}
