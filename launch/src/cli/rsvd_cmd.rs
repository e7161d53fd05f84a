//! `rankwise rsvd` and `rankwise pca`: the randomized SVD and the genotype PCA.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use ndarray::{Array2, ArrayView2};
use rankwise::genomics::{pca_problem, pca_scales, IdList, PcaParams, Selection};
use rankwise::Input;
use rankwise_exec::format_bytes;
use rankwise_exec::Runtime;
use rankwise_linalg::{
    rsvd, FactorSink, HweP, Method, Operand, Precision, Projection, RsvdOptions, RsvdPlan,
    RsvdProblem, RsvdResult, VariantFilter,
};
use rankwise_sources::{Dist, ElementType, Generated, GenotypeSource};
use serde_json::json;

use super::{
    cli_error, factor_sink, finish_output, injected_fault, open_output, CliError, MatrixArgs,
    OpenOutput, RunArgs, ZarrFormatArg,
};
use crate::launcher::LaunchInfo;
use crate::plot::{plot_pcs, Groups};
use crate::report::seconds;
use rankwise::genomics::plink_files::{write_eigenval, write_eigenvec};
use rankwise::genomics::projection::{
    variant_frequencies, write_weight_files, VariantInfo, WeightRows,
};
use rankwise::genomics::GenomicsError;
use rankwise::output::group::{read_f64_rows, Dims, OutputLayout, SvdOutput, ZarrFormat};
use rankwise::output::report::{
    peak_rss_bytes, MachineLimit, RankReport, RsvdBody, RsvdWork, RunReport,
};

/// How the range is refined.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MethodChoice {
    /// LOBPCG on AᵀA until every component meets --tol (one read of the matrix per
    /// iteration, memory independent of the iterations); the default.
    Lobpcg,
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
    /// Most passes over the matrix LOBPCG makes before it stops unconverged (and says so).
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
        let stored_f32 = matches!(operand, Operand::Dense(_))
            && operand
                .stored()
                .is_some_and(|s| s.element_type() == ElementType::F32);
        let choice = rankwise::SolverChoice {
            k: self.k,
            oversample: self.oversample,
            power_iters: self.power_iters,
            method: self.method.map(|m| match m {
                MethodChoice::Lobpcg => Method::Lobpcg,
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
        let options = choice.options(stored_f32).map_err(super::cli_error)?;
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

/// The extensions of a PCA's side files: PLINK 2's `.eigenvec` and `.eigenval`, the plot,
/// and what projection reads (`.eigenvec.var`, `.afreq`).
const SIDE_EXTENSIONS: [&str; 5] = ["eigenvec", "eigenval", "png", "eigenvec.var", "afreq"];

fn side_files(out: &Path) -> [PathBuf; 5] {
    SIDE_EXTENSIONS.map(|e| out.with_extension(e))
}

/// The per-variant arrays of a PCA's output group: the frequency of the counted allele
/// (NaN for a variant that did not enter) and the number of calls.
const FREQUENCY: &str = "variant_counted_allele_frequency";
const CALLS: &str = "variant_call_count";
/// sgkit's loadings, variants × components: `U` scaled by the square root of each
/// component's explained variance, so a column's squares sum to that variance.
const LOADING: &str = "sample_pca_loading";

/// The factor sink of a PCA: `U`'s rows, and each variant's frequency and calls, read
/// again from the panel's rows by the actor that owns them.
fn pca_sink(o: Arc<SvdOutput>, g: Arc<dyn GenotypeSource>, filter: VariantFilter) -> FactorSink {
    Arc::new(
        move |_panel: usize,
              rows: std::ops::Range<u64>,
              f: ArrayView2<'_, f64>|
              -> Result<(), String> {
            o.write_u_rows(rows.start, f).map_err(|e| e.to_string())?;
            let (freq, calls) = variant_frequencies(g.as_ref(), &filter, rows.clone())
                .map_err(|e| e.to_string())?;
            o.write_row_vector(FREQUENCY, rows.start, &freq)
                .and_then(|()| o.write_row_vector(CALLS, rows.start, &calls))
                .map_err(|e| e.to_string())
        },
    )
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
        chunk_rows: problem.grid.chunk_rows,
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
        chunk_rows: problem.grid.chunk_rows,
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
    chunk_rows: u64,
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

/// Whether the run writes what projection needs: a PCA with an output, of genotypes whose
/// `U` rows are variants.
fn weighs(job: &Job, problem: &RsvdProblem) -> bool {
    job.is_pca()
        && job.out.is_some()
        && !problem.transposed
        && matches!(problem.operand, Operand::Genotypes(..))
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
        Some(out) => {
            if job.is_pca() {
                for f in side_files(out) {
                    if f.exists() {
                        // Side files are committed before their group: without the group
                        // they are what an interrupted commit (SIGKILL) left.
                        let how = if out.exists() {
                            String::new()
                        } else {
                            let all: Vec<String> = side_files(out)
                                .iter()
                                .filter(|p| p.exists())
                                .map(|p| format!("'{}'", p.display()))
                                .collect();
                            format!(
                                " (without its group {}: a run was killed while committing; \
                                 to run again, remove them: rm {})",
                                out.display(),
                                all.join(" ")
                            )
                        };
                        return Err(CliError::Option {
                            option: "--out",
                            message: format!(
                                "{} exists{how}; rankwise never overwrites results",
                                f.display()
                            ),
                        });
                    }
                }
            }
            let (m, n) = job.shape;
            let weighing = weighs(job, problem);
            let layout = OutputLayout {
                format: job.zarr_format,
                m,
                n,
                k: options.k as u64,
                u_chunk_rows: if problem.transposed {
                    m.max(1)
                } else {
                    job.chunk_rows
                },
                vt_chunk_cols: if problem.transposed {
                    job.chunk_rows
                } else {
                    n.max(1)
                },
                row_vectors: if weighing {
                    vec![FREQUENCY.to_string(), CALLS.to_string()]
                } else {
                    Vec::new()
                },
                row_matrices: if weighing {
                    vec![LOADING.to_string()]
                } else {
                    Vec::new()
                },
                dims: if weighing {
                    Dims::GENOTYPES
                } else {
                    Dims::MATRIX
                },
                attributes: serde_json::Map::from_iter([
                    ("source".to_string(), json!(problem.operand.describe())),
                    ("command".to_string(), json!(job.command)),
                    (
                        "producer".to_string(),
                        json!(format!("rankwise {}", env!("CARGO_PKG_VERSION"))),
                    ),
                ]),
            };
            Some(open_output(rt, out, layout)?)
        }
        None => None,
    };
    let shared = output.as_ref().map(|o| Arc::clone(&o.0));
    rt.progress().set_title(
        format!("{} k = {}", job.command, options.k),
        problem.operand.describe(),
    );
    let result = compute(rt, launch, job, problem, options, shared, start);
    let result = match (result, &output) {
        (Ok(v), Some(o)) if job.is_pca() => finish_side_files(rt, job, o, v),
        (r, _) => r,
    };
    finish_output(rt, result, output).map(|d| d.text)
}

/// What rank 0 keeps for the files written after the group is committed.
struct Done {
    text: Option<String>,
    pcs: Option<SamplePcs>,
}

/// A PCA's sample PCs and eigenvalues, and the samples' IDs, for the side files.
struct SamplePcs {
    pcs: Array2<f64>,
    eigenvalues: Vec<f64>,
    /// Each component's share of the variance.
    explained: Vec<f64>,
    /// The plot's groups: each sample's, and their names.
    groups: Option<(Vec<usize>, Vec<String>)>,
    sample_ids: Vec<String>,
    /// The `.fam`'s family IDs, for a PLINK fileset.
    family_ids: Option<Vec<String>>,
    /// For the projection files and the loadings.
    weights: Option<Weighing>,
}

/// What rank 0 needs to write the projection files and the group's loadings, from the
/// group's `U` and per-variant arrays.
struct Weighing {
    /// The variants' IDs and alleles.
    info: VariantInfo,
    /// The variants that entered.
    used: u64,
    /// Components.
    k: usize,
    /// Rows per chunk of the group's `U`.
    chunk: u64,
    /// Each component's `√(explained variance)`, the loadings' scale.
    loading_scale: Vec<f64>,
}

fn finish_side_files(
    rt: &Runtime,
    job: &Job,
    o: &OpenOutput,
    done: Done,
) -> Result<Done, CliError> {
    // Rank 0 writes the PLINK files and the plot under temporary names, then commits the
    // group and renames them: a failure leaves none of them looking complete.
    let out = job.out.as_deref().unwrap_or(Path::new("."));
    let mut renames = Vec::new();
    let mut result = Ok(());
    if let Some(SamplePcs {
        pcs,
        eigenvalues,
        explained,
        groups,
        sample_ids,
        family_ids,
        weights,
    }) = &done.pcs
    {
        let token =
            o.1.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.rsplit(".tmp-").next())
                .unwrap_or("tmp")
                .to_string();
        let [vec_path, val_path, png_path, var_path, afreq_path] = side_files(out);
        // The extension stays last: the plot's encoder is chosen by it. `OUT.tmp-…` is the
        // prefix a later run recognizes as a temporary (`SvdOutput::stale_temporaries`).
        let tmp = |p: &Path| {
            let ext = SIDE_EXTENSIONS
                .iter()
                .find(|e| out.with_extension(e) == p)
                .copied()
                .unwrap_or("out");
            out.with_extension(format!("tmp-{token}.{ext}"))
        };
        let io = |e: rankwise::genomics::plink_files::PcaFileError| CliError::Option {
            option: "--out",
            message: e.to_string(),
        };
        // Every side file's temporary goes when this block ends, by an error or a panic as
        // well (after a commit they have their final names, and nothing is there to go):
        // before rank 0 tells the others, which may end the job. A signal removes them
        // meanwhile.
        let _temporaries = rankwise::output::temporaries::RemovedOnDrop::new(
            [&vec_path, &val_path, &png_path, &var_path, &afreq_path].map(|p| tmp(p)),
        );
        result = (|| -> Result<(), CliError> {
            write_eigenvec(
                &tmp(&vec_path),
                family_ids.as_deref(),
                sample_ids,
                pcs.view(),
            )
            .map_err(io)?;
            renames.push((tmp(&vec_path), vec_path.clone()));
            // (A failure test's hook: the first side file is written, the rest not.)
            injected_fault(rt, "side-files")?;
            write_eigenval(&tmp(&val_path), eigenvalues).map_err(io)?;
            renames.push((tmp(&val_path), val_path.clone()));
            let groups = groups
                .as_ref()
                .map(|(of_sample, names)| Groups { of_sample, names });
            plot_pcs(
                &tmp(&png_path),
                pcs.view(),
                explained,
                &format!("rankwise pca: {}", out.display()),
                groups.as_ref(),
            )
            .map_err(io)?;
            renames.push((tmp(&png_path), png_path.clone()));
            if let Some(Weighing {
                info,
                used,
                k,
                chunk,
                loading_scale,
            }) = weights
            {
                let genomics = |e: GenomicsError| CliError::Option {
                    option: "--out",
                    message: e.to_string(),
                };
                let group = o.0.temp_dir();
                let read = |name: &str, rows: std::ops::Range<u64>| {
                    read_f64_rows(group, name, rows).map_err(|e| GenomicsError::File {
                        path: group.to_path_buf(),
                        message: e.to_string(),
                    })
                };
                write_weight_files(
                    &tmp(&var_path),
                    &tmp(&afreq_path),
                    info,
                    *k,
                    *chunk,
                    *used,
                    |rows| {
                        let u = read("U", rows.clone())?;
                        let u = Array2::from_shape_vec(((rows.end - rows.start) as usize, *k), u)
                            .map_err(|e| GenomicsError::File {
                            path: group.to_path_buf(),
                            message: e.to_string(),
                        })?;
                        // The loadings are written from the same read of `U` (they need
                        // Σ, which the actors writing `U` did not have yet).
                        let scale = ndarray::ArrayView1::from(&loading_scale[..]);
                        o.0.write_row_matrix(LOADING, rows.start, (&u * &scale).view())
                            .map_err(|e| GenomicsError::File {
                                path: group.to_path_buf(),
                                message: e.to_string(),
                            })?;
                        Ok(WeightRows {
                            u,
                            freq: read(FREQUENCY, rows.clone())?,
                            calls: read(CALLS, rows)?,
                        })
                    },
                )
                .map_err(genomics)?;
                renames.push((tmp(&var_path), var_path.clone()));
                renames.push((tmp(&afreq_path), afreq_path.clone()));
            }
            // The group is committed last: its name is the mark of a complete run.
            rankwise::output::publish::commit_with_files(&o.0, &renames)?;
            Ok(())
        })();
    }
    // Every rank learns whether rank 0 succeeded, and fails with it: the other ranks have
    // finished their part, and would otherwise exit 0 with rank 0's failure.
    let mut outcome = match &result {
        Err(e) if rt.rank() == 0 => format!("\u{1}{e}").into_bytes(),
        _ => vec![0],
    };
    rt.comm().broadcast_bytes(0, &mut outcome)?;
    if rt.rank() != 0 && outcome.first() == Some(&1) {
        return Err(CliError::Transport(
            rankwise_transports::TransportError::PeerFailed {
                rank: 0,
                message: String::from_utf8_lossy(&outcome[1..]).into_owned(),
            },
        ));
    }
    result.map(|()| done)
}

fn compute(
    rt: &Runtime,
    launch: &LaunchInfo,
    job: &Job,
    problem: &RsvdProblem,
    options: &RsvdOptions,
    output: Option<Arc<SvdOutput>>,
    start: Instant,
) -> Result<Done, CliError> {
    let sink = match (&output, &problem.operand) {
        (Some(o), Operand::Genotypes(g, filter)) if weighs(job, problem) => {
            Some(pca_sink(Arc::clone(o), Arc::clone(g), filter.clone()))
        }
        _ => output.clone().map(|o| factor_sink(o, problem.transposed)),
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
    // Collective: every rank probes at once, before the figures gather on rank 0.
    let limit = match job.machine_limit {
        true => {
            let peak = rankwise::linalg::gemm_peak(rt, options.precision)?;
            let name = options.precision.name();
            Some(MachineLimit::of(&result.timings, name, peak))
        }
        false => None,
    };
    let Some(ranks) = super::gather_rank_figures(rt, RsvdWork::of(&result))? else {
        return Ok(Done {
            text: None,
            pcs: None,
        });
    };
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
    let mut variants = None;
    if let Some(o) = &output {
        if result.transposed {
            o.write_u_rows(0, result.wt.t())?;
        } else {
            o.write_vt(result.wt.view())?;
        }
        o.write_s(&result.s)?;
        o.write_vector("residuals", &result.convergence.residuals)?;
        if let Some(p) = &pca {
            o.write_vector("eigenvalues", &p.eigenvalues)?;
            o.write_vector("explained_variance_ratio", &p.explained)?;
            if let Operand::Genotypes(g, _) = &problem.operand {
                if weighs(job, problem) {
                    variants = Some(write_identity(o, g.as_ref(), &result, p)?);
                }
            }
        }
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
    let pcs = match pca {
        Some(p) => {
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
                    .or_else(|| family_ids.clone().filter(|f| fids_are_groups(f)))
                    .map(|names| indexed(&names)),
            };
            // The variants' IDs and alleles, read once for the group (on rank 0).
            let weights = match (&output, variants) {
                (Some(o), Some(info)) => Some(Weighing {
                    info,
                    used: result
                        .genotypes
                        .as_ref()
                        .map_or(0, |s| s.variants - s.variants_filtered),
                    k: options.k,
                    chunk: o.layout().u_chunk_rows_stored(),
                    loading_scale: explained_variance(&result, job.shape.1)
                        .iter()
                        .map(|v| v.sqrt())
                        .collect(),
                }),
                _ => None,
            };
            Some(SamplePcs {
                weights,
                pcs: result.wt.t().to_owned(),
                eigenvalues: p.eigenvalues,
                explained: p.explained,
                groups,
                family_ids,
                sample_ids,
            })
        }
        None => None,
    };
    Ok(Done {
        text: Some(text),
        pcs,
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
        Method::Lobpcg => format!(
            "LOBPCG to tol {:.0e}, at most {} passes",
            options.tol, options.max_passes
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

/// What names the rows and columns of a PCA's group, with sgkit's names: `sample_id`,
/// `variant_id`, `variant_contig` (into `contig_id`) and `variant_position`, and the
/// samples' scores `sample_pca_projection` (`V·Σ`), `sample_pca_explained_variance`
/// (`σ²/(n − 1)`) and `sample_pca_explained_variance_ratio`. Returns the variants' IDs and
/// alleles it read, for the weight files.
fn write_identity(
    o: &SvdOutput,
    g: &dyn GenotypeSource,
    result: &RsvdResult,
    p: &PcaFigures,
) -> Result<VariantInfo, CliError> {
    let d = Dims::GENOTYPES;
    let (m, n) = g.shape();
    let chunk = o.layout().u_chunk_rows_stored();
    let ids = g
        .sample_ids()
        .unwrap_or_else(|| (0..n).map(|j| format!("sample_{j}")).collect());
    o.write_strings("sample_id", d.cols, &ids, n)?;
    let info = VariantInfo::of(g).map_err(|e| CliError::Option {
        option: "--out",
        message: e.to_string(),
    })?;
    o.write_strings("variant_id", d.rows, &info.ids, chunk)?;
    let mut contigs: Vec<String> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let contig: Vec<i64> = info
        .chromosomes
        .iter()
        .map(|c| {
            *index.entry(c.clone()).or_insert_with(|| {
                contigs.push(c.clone());
                contigs.len() as i64 - 1
            })
        })
        .collect();
    o.write_strings("contig_id", "contigs", &contigs, contigs.len() as u64)?;
    o.write_integers("variant_contig", d.rows, &contig, chunk)?;
    let mut positions = Vec::with_capacity(m as usize);
    if g.variant_positions(&mut |x| positions.push(x))? {
        o.write_integers("variant_position", d.rows, &positions, chunk)?;
    }
    let scores = Array2::from_shape_fn((n as usize, result.s.len()), |(i, j)| {
        result.wt[[j, i]] * result.s[j]
    });
    o.write_matrix(
        "sample_pca_projection",
        [d.cols, d.components],
        scores.view(),
    )?;
    o.write_vector(
        "sample_pca_explained_variance",
        &explained_variance(result, n),
    )?;
    o.write_vector("sample_pca_explained_variance_ratio", &p.explained)?;
    Ok(info)
}

/// sgkit's (and scikit-learn's) explained variance of each component of `n` samples:
/// `σ²/(n − 1)`.
fn explained_variance(result: &RsvdResult, n: u64) -> Vec<f64> {
    result
        .s
        .iter()
        .map(|s| s * s / (n.max(2) - 1) as f64)
        .collect()
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

/// Floating-point operations of the GEMMs with the thin matrices.
fn gemm_flops(m: u64, n: u64, options: &RsvdOptions, passes: usize) -> f64 {
    let (l, r, b, k) = (
        options.sketch() as f64,
        options.probes as f64,
        options.basis() as f64,
        options.k as f64,
    );
    let mn = 2.0 * m as f64 * n as f64;
    if options.method == Method::Lobpcg {
        // Each pass: A·S and Aᵀ(A·S), S at most l wide; the last one with the probes.
        return mn * (2.0 * l * passes as f64 + r);
    }
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
    let flops = gemm_flops(m, n, options, r.passes);
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
        Method::Lobpcg => format!("LOBPCG to tol {:.0e}", options.tol),
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
        let _ = writeln!(s, "  sums across ranks: {}", r.collectives);
    }
    if let Some(note) = &r.gpu_note {
        let _ = writeln!(s, "note: {note}");
    }
    let _ = writeln!(s, "phases (rank 0):");
    for t in &r.timings {
        let mut line = crate::report::phase_line(t);
        if let Some(p) = limit.and_then(|l| l.share_of(&t.phase)) {
            let _ = write!(
                line,
                "   {:.1} GFLOP/s, {:.0} % of the machine's GEMM",
                p.gflop_per_s,
                100.0 * p.share
            );
        }
        let _ = writeln!(s, "{line}");
    }
    if let Some(l) = limit {
        let _ = writeln!(
            s,
            "machine limit: {} GEMM of all ranks' compute threads at once, {:.1} GFLOP/s",
            l.precision, l.gemm_gflop_per_s
        );
    }
    let (m, n) = problem.operand.shape();
    let flops = gemm_flops(m, n, options, r.passes);
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
            for f in side_files(out) {
                let _ = writeln!(s, "        {}", f.display());
            }
        }
    }
    s
}
