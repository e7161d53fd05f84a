//! Genotype PCA as PLINK 2 makes it: sample, variant and chromosome selection, the QC
//! filters, the principal components, eigenvalues and sample IDs of the result, and PLINK 2's
//! `.eigenvec` and `.eigenval` files.
//!
//! The standardization of dosages and the QC filters' per-variant tests run inside the
//! passes ([`rankwise_linalg::VariantFilter`], re-exported here); this crate decides what
//! enters them and what the result means to a geneticist.

mod chromosomes;
mod error;
pub mod plink_files;
pub mod projection;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use ndarray::Array2;
use rankwise_exec::Runtime;
use rankwise_linalg::{rsvd, Convergence, Method, RowSelection, RsvdOptions, RsvdProblem};
use rankwise_sources::GenotypeSource;
use rankwise_sources::SampleSubset;

use chromosomes::ChromosomeFilter;
pub use error::GenomicsError;
pub use rankwise_linalg::VariantFilter;

use GenomicsError as Error;

/// How a caller names the selection parameters in the text of errors and reports: the
/// library uses the parameter names (`keep`, `chromosomes`), the command line its flags.
pub type Names = fn(&'static str) -> &'static str;

fn same_name(parameter: &'static str) -> &'static str {
    parameter
}

/// A list of sample or variant identifiers, and where it came from (for messages).
///
/// Samples are named as PLINK 2 names them: by their (FID, IID) pair where the source has
/// family IDs (a `.fam`) and the list was read from a file ([`IdList::read_samples`]); a
/// line without an FID stands for FID `0`, as in `plink2 --keep`. A list made by
/// [`IdList::new`], or applied to a source without family IDs (Zarr, VCF Zarr), matches
/// IIDs alone.
#[derive(Clone, Debug, Default)]
pub struct IdList {
    /// The identifiers: variant IDs, or sample IIDs.
    pub ids: HashSet<String>,
    /// For a sample list read from a file: its (FID, IID) pairs.
    pub pairs: Option<HashSet<(String, String)>>,
    /// Where they came from (a file's path), as messages name it.
    pub origin: String,
}

impl IdList {
    /// A list of the given identifiers (variant IDs, or sample IIDs matched alone).
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(ids: I) -> IdList {
        let ids: HashSet<String> = ids.into_iter().map(Into::into).collect();
        let origin = format!("a list of {} IDs", ids.len());
        IdList {
            ids,
            pairs: None,
            origin,
        }
    }

    /// A list of (FID, IID) sample pairs.
    pub fn of_pairs<I: IntoIterator<Item = (S, S)>, S: Into<String>>(pairs: I) -> IdList {
        let pairs: HashSet<(String, String)> = pairs
            .into_iter()
            .map(|(f, i)| (f.into(), i.into()))
            .collect();
        let origin = format!("a list of {} samples", pairs.len());
        IdList {
            ids: pairs.iter().map(|(_, i)| i.clone()).collect(),
            pairs: Some(pairs),
            origin,
        }
    }

    /// The variant IDs `path` lists (whitespace-separated tokens, as PLINK's `--extract`
    /// reads them: a `plink2 --indep-pairwise` `.prune.in`, say).
    pub fn read_variants(path: &Path) -> Result<IdList, std::io::Error> {
        let text = rankwise_sources::read_regular_to_string(path)?;
        Ok(IdList {
            ids: text.split_whitespace().map(str::to_owned).collect(),
            pairs: None,
            origin: path.display().to_string(),
        })
    }

    /// The samples `path` lists, as PLINK 2's `--keep` reads them: a `#FID IID …` or
    /// `#IID …` header names the columns; without one, a line of two or more columns is
    /// `FID IID`, a line of one an IID. A sample without an FID has FID `0`. A malformed
    /// line is an [`std::io::ErrorKind::InvalidData`] error naming it.
    pub fn read_samples(path: &Path) -> Result<IdList, std::io::Error> {
        let bad = |message: String| std::io::Error::new(std::io::ErrorKind::InvalidData, message);
        let text = rankwise_sources::read_regular_to_string(path)?;
        // The FID and IID columns a header names (no FID column: FID 0).
        let mut header: Option<(Option<usize>, usize)> = None;
        let mut pairs = HashSet::new();
        for (no, line) in text.lines().enumerate() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.is_empty() {
                continue;
            }
            if no == 0 && fields[0].starts_with('#') {
                let names: Vec<&str> = fields.iter().map(|f| f.trim_start_matches('#')).collect();
                let iid = names
                    .iter()
                    .position(|f| *f == "IID")
                    .ok_or_else(|| bad(format!("the header {line:?} names no IID column")))?;
                header = Some((names.iter().position(|f| *f == "FID"), iid));
                continue;
            }
            let (fid, iid) = header.unwrap_or(if fields.len() > 1 {
                (Some(0), 1)
            } else {
                (None, 0)
            });
            let field = |c: usize, what: &str| {
                fields
                    .get(c)
                    .copied()
                    .ok_or_else(|| bad(format!("line {} has no {what} (column {})", no + 1, c + 1)))
            };
            let iid = field(iid, "IID")?;
            let fid = fid.map(|c| field(c, "FID")).transpose()?.unwrap_or("0");
            pairs.insert((fid.to_owned(), iid.to_owned()));
        }
        Ok(IdList {
            ids: pairs.iter().map(|(_, i)| i.clone()).collect(),
            pairs: Some(pairs),
            origin: path.display().to_string(),
        })
    }

    /// Whether the list names the sample `iid` of family `fid` (`None`: a source without
    /// family IDs, matched by IID).
    fn names_sample(&self, fid: Option<&str>, iid: &str) -> bool {
        match (fid, &self.pairs) {
            (Some(fid), Some(pairs)) => pairs.contains(&(fid.to_owned(), iid.to_owned())),
            _ => self.ids.contains(iid),
        }
    }
}

/// Which samples and variants enter the PCA, as PLINK 2's options select them. The
/// default keeps everything.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Keep only these samples (PLINK's `--keep`), by IID: the `.fam`'s second column or
    /// the store's `sample_id`. Frequencies and filters are those of the kept samples.
    pub keep: Option<IdList>,
    /// Drop these samples (PLINK's `--remove`).
    pub remove: Option<IdList>,
    /// Keep only these variants (PLINK's `--extract`), by the `.bim`'s or the store's
    /// `variant_id`.
    pub extract: Option<IdList>,
    /// Drop these variants (PLINK's `--exclude`).
    pub exclude: Option<IdList>,
    /// Keep only the variants on these chromosomes (PLINK's `--chr`): names and ranges,
    /// comma-separated (`1-4,22,X`); a `chr` prefix is ignored, 23–26 are X, Y, XY, MT.
    pub chromosomes: Option<String>,
    /// Drop the variants on these chromosomes (PLINK's `--not-chr`).
    pub not_chromosomes: Option<String>,
    /// Keep only the variants on autosomes 1–22 (PLINK's `--autosome`).
    pub autosomes_only: bool,
    /// Keep the variants on X, Y and MT. PLINK 2's `--pca` leaves them out ("Excluding N
    /// variants on non-autosomes from PCA"), and so does [`pca`] unless this is set; XY
    /// (the pseudo-autosomal regions) and other contigs (scaffolds, unplaced) stay in, as
    /// there. A source that does
    /// not name chromosomes keeps every variant.
    pub non_autosomes: bool,
}

/// Two lists of the same kind (`keep`/`remove` or `extract`/`exclude`) as one rule.
struct Lists<'a> {
    /// The first parameter given, for errors.
    parameter: &'static str,
    /// The parameters given with their origins (`--keep a.txt --remove b.txt`).
    origin: String,
    include: Option<&'a IdList>,
    exclude: Option<&'a IdList>,
}

impl<'a> Lists<'a> {
    fn of(
        (inc, include): (&'static str, Option<&'a IdList>),
        (exc, exclude): (&'static str, Option<&'a IdList>),
        names: Names,
    ) -> Option<Lists<'a>> {
        let given = [(inc, include), (exc, exclude)];
        let parameter = given.iter().find(|(_, l)| l.is_some()).map(|(p, _)| *p)?;
        let origin = given
            .iter()
            .filter_map(|(p, l)| l.map(|l| format!("{} {}", names(p), l.origin)))
            .collect::<Vec<_>>()
            .join(" ");
        Some(Lists {
            parameter,
            origin,
            include,
            exclude,
        })
    }

    /// Whether the lists keep `id`: named by the include list, if there is one, and not by
    /// the exclude list. Without an identifier, kept only without an include list.
    fn admits(&self, id: Option<&str>) -> bool {
        match id {
            Some(id) => {
                self.include.is_none_or(|l| l.ids.contains(id))
                    && !self.exclude.is_some_and(|l| l.ids.contains(id))
            }
            None => self.include.is_none(),
        }
    }

    /// Whether the lists keep the sample `iid` of family `fid` ([`IdList::names_sample`]).
    fn admits_sample(&self, fid: Option<&str>, iid: &str) -> bool {
        self.include.is_none_or(|l| l.names_sample(fid, iid))
            && !self.exclude.is_some_and(|l| l.names_sample(fid, iid))
    }
}

/// The error of selection parameters (`origin`, as given; `parameter` the first of them)
/// that keep none of the `count` `what` (samples, variants) of `source`.
fn left_nothing(
    parameter: &'static str,
    origin: &str,
    count: u64,
    what: &str,
    source: &dyn GenotypeSource,
) -> Error {
    Error::Parameter {
        parameter,
        message: format!(
            "{origin}: none of the {count} {what} of {} is left",
            source.describe()
        ),
    }
}

impl Selection {
    /// Applies the selection to `source`: the samples kept (a view of `source`, or `source`
    /// itself), and the variants kept (`None`: all). Known before any pass: a selection
    /// that keeps nothing is refused here, naming its parameters.
    pub fn apply(
        &self,
        source: Arc<dyn GenotypeSource>,
    ) -> Result<(Arc<dyn GenotypeSource>, Option<RowSelection>), Error> {
        self.apply_named(source, same_name)
    }

    /// [`Selection::apply`], with the parameters named in messages by `names`.
    pub fn apply_named(
        &self,
        source: Arc<dyn GenotypeSource>,
        names: Names,
    ) -> Result<(Arc<dyn GenotypeSource>, Option<RowSelection>), Error> {
        let source = self.samples(source, names)?;
        let rows = self.variants(source.as_ref(), names)?;
        Ok((source, rows))
    }

    fn samples(
        &self,
        source: Arc<dyn GenotypeSource>,
        names: Names,
    ) -> Result<Arc<dyn GenotypeSource>, Error> {
        let given = ("keep", self.keep.as_ref());
        let Some(lists) = Lists::of(given, ("remove", self.remove.as_ref()), names) else {
            return Ok(source);
        };
        let Some(ids) = source.sample_ids() else {
            return Err(Error::Parameter {
                parameter: lists.parameter,
                message: format!(
                    "{} has no sample IDs (a .fam, and a VCF Zarr store's or a Zarr group's \
                     sample_id, have them)",
                    source.describe()
                ),
            });
        };
        let families = source.family_ids().filter(|f| f.len() == ids.len());
        let subset = SampleSubset::new(source.clone(), &lists.origin, &ids, |j, id| {
            lists.admits_sample(families.as_ref().map(|f| f[j].as_str()), id)
        });
        if subset.kept() == 0 {
            return Err(left_nothing(
                lists.parameter,
                &lists.origin,
                ids.len() as u64,
                "samples",
                source.as_ref(),
            ));
        }
        Ok(Arc::new(subset))
    }

    fn variants(
        &self,
        source: &dyn GenotypeSource,
        names: Names,
    ) -> Result<Option<RowSelection>, Error> {
        let chromosomes = ChromosomeFilter::new(
            self.chromosomes.as_deref(),
            self.not_chromosomes.as_deref(),
            self.autosomes_only,
            !self.non_autosomes,
            names,
        )?
        .map(|c| c.select(source).map(|rows| rows.map(|rows| (c, rows))))
        .transpose()?
        .flatten();
        // The chromosome selection and the multiallelic sites skipped, as one: the
        // parameter that answers for it, its options as given, and the rows it keeps.
        let chromosomes = match (chromosomes, biallelic_rows(source)?) {
            (c, None) => c.map(|(c, rows)| (c.parameter(), c.origin().to_owned(), rows)),
            (None, Some(b)) => Some(("genotypes", String::new(), b)),
            (Some((c, rows)), Some(b)) => {
                let origin = format!("{}; {}", rows.origin(), b.origin());
                let mut both = RowSelection::builder(origin);
                for row in 0..rows.rows() {
                    both.push(rows.contains(row) && b.contains(row));
                }
                Some((c.parameter(), c.origin().to_owned(), both))
            }
        };
        let lists = Lists::of(
            ("extract", self.extract.as_ref()),
            ("exclude", self.exclude.as_ref()),
            names,
        );
        let Some(lists) = lists else {
            return match chromosomes {
                Some((parameter, _, rows)) if rows.kept() == 0 => Err(left_nothing(
                    parameter,
                    rows.origin(),
                    rows.rows(),
                    "variants",
                    source,
                )),
                other => Ok(other.map(|(_, _, rows)| rows)),
            };
        };
        let origin = match &chromosomes {
            Some((_, given, rows)) => {
                // The chromosome options, the lists, then what was left out by default.
                let note = rows.origin()[given.len()..].trim_start_matches("; ");
                let head = [given.as_str(), lists.origin.as_str()]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                match note {
                    "" => head,
                    n => format!("{head}; {n}"),
                }
            }
            None => lists.origin.clone(),
        };
        let within = chromosomes.map(|(_, _, rows)| rows);
        // A bit per variant as the IDs stream by: 10⁸ variants take 12.5 MB on each rank.
        let mut selection = RowSelection::builder(origin);
        let mut row = 0u64;
        let has_ids = source.variant_ids(&mut |id| {
            let on = within.as_ref().is_none_or(|w| w.contains(row));
            selection.push(on && lists.admits(id));
            row += 1;
        })?;
        if !has_ids {
            return Err(Error::Parameter {
                parameter: lists.parameter,
                message: format!(
                    "{} has no variant IDs (a PLINK fileset's .bim and a VCF Zarr store's \
                     variant_id have them)",
                    source.describe()
                ),
            });
        }
        if selection.rows() != source.shape().0 {
            return Err(Error::Parameter {
                parameter: lists.parameter,
                message: format!(
                    "{} gave {} variant IDs for {} variants",
                    source.describe(),
                    selection.rows(),
                    source.shape().0
                ),
            });
        }
        if selection.kept() == 0 {
            return Err(left_nothing(
                lists.parameter,
                selection.origin(),
                selection.rows(),
                "variants",
                source,
            ));
        }
        Ok(Some(selection))
    }
}

/// The variants of at most two alleles, where `source` has some of more: a PCA of dosages
/// counts the copies of one allele, which a third allele makes meaningless. PLINK 2's
/// `--pca` refuses such variants; a PCA here skips them and says how many.
fn biallelic_rows(source: &dyn GenotypeSource) -> Result<Option<RowSelection>, Error> {
    // A bit per variant as the counts stream by, as the ID lists are held.
    let mut selection = RowSelection::builder(String::new());
    if !source.variant_allele_counts(&mut |n| selection.push(n <= 2))? {
        return Ok(None);
    }
    let multi = selection.rows() - selection.kept();
    if multi == 0 {
        return Ok(None);
    }
    if selection.rows() != source.shape().0 {
        return Err(Error::Parameter {
            parameter: "genotypes",
            message: format!(
                "{} gave allele counts of {} variants for {} variants",
                source.describe(),
                selection.rows(),
                source.shape().0
            ),
        });
    }
    Ok(Some(selection.with_origin(format!(
        "{multi} multiallelic variants (skipped: a dosage PCA needs two alleles, and plink2 \
         --pca refuses them; `bcftools norm -m-` splits them into biallelic records)"
    ))))
}

/// The parameters of [`pca`].
#[derive(Clone, Debug)]
pub struct PcaParams {
    /// The solver: `k` components (10), block Lanczos to `tol`, mixed precision (f32
    /// passes while they improve the residuals, then LOBPCG in f64, the last pass in f64),
    /// as `rankwise pca` runs by default.
    pub solver: RsvdOptions,
    /// The QC filters (`maf`, `geno`, `hwe`); [`VariantFilter::NONE`] by default.
    pub filter: VariantFilter,
    /// Which samples and variants enter.
    pub selection: Selection,
    /// Variants per panel (`None`: the stored chunks, or panels of at most 128 MiB of
    /// dosages for a `.bed`).
    pub panel_rows: Option<u64>,
    /// Fail with [`GenomicsError::NotConverged`] when a component misses the tolerance, instead
    /// of returning it with [`Convergence::converged`] false.
    pub require_converged: bool,
    /// Write what [`projection::project`] (and `plink2 --score`) reads at this prefix:
    /// `PREFIX.eigenvec.var`, `PREFIX.afreq` and `PREFIX.eigenval` (the names
    /// [`Path::with_extension`] gives). The ranks must share the file system it is on.
    pub weights: Option<std::path::PathBuf>,
    /// Return [`Pca::loadings`], the variants' loadings (this rank's rows).
    pub loadings: bool,
}

impl Default for PcaParams {
    fn default() -> Self {
        PcaParams {
            solver: RsvdOptions {
                method: Method::Lanczos,
                mixed_precision: true,
                ..RsvdOptions::default()
            },
            filter: VariantFilter::NONE,
            selection: Selection::default(),
            panel_rows: None,
            require_converged: false,
            weights: None,
            loadings: false,
        }
    }
}

/// A genotype PCA, on every rank alike.
#[derive(Clone, Debug)]
pub struct Pca {
    /// The samples' IDs, in the order of the rows of `pcs` (`sample_J` where the input has
    /// none).
    pub sample_ids: Vec<String>,
    /// Their family IDs, where the input has them (a `.fam`'s first column).
    pub family_ids: Option<Vec<String>>,
    /// The principal components: samples × k, unit columns, as PLINK 2's `.eigenvec`.
    pub pcs: Array2<f64>,
    /// Eigenvalues of the genetic relationship matrix `XᵀX / M`, PLINK 2's scale (M: the
    /// variants given less those the filters excluded).
    pub eigenvalues: Vec<f64>,
    /// σᵢ² / ‖X‖²_F.
    pub explained_variance_ratio: Vec<f64>,
    /// The singular values of the standardized matrix.
    pub singular_values: Vec<f64>,
    /// Each component's residual against the tolerance, and whether all met it.
    pub convergence: Convergence,
    /// Variants that entered (after selection and filters).
    pub variants_used: u64,
    /// With [`PcaParams::loadings`]: sgkit's `sample_pca_loading`, the variants' rows of
    /// `U` scaled by each component's `√(explained variance)` (`σ² / (samples − 1)`), so
    /// that a column's squares sum to its explained variance. This rank's rows only, by
    /// their global index among the variants given (after selection); a variant that a
    /// filter excluded has a row of zeros.
    pub loadings: Option<rankwise_linalg::LocalRows>,
    /// Passes over the genotype matrix.
    pub passes: usize,
    /// This rank's phases, each with its products' flops with the whole matrix: at the
    /// machine's GEMM rate (`rankwise_linalg::gemm_peak` of `solver.precision`), each
    /// pass's share of the machine limit.
    pub timings: Vec<rankwise_linalg::PhaseTiming>,
}

impl Pca {
    /// Writes PLINK 2's `.eigenvec` (sample IDs and PCs) and `.eigenval` files at `prefix`
    /// (`prefix.eigenvec`, `prefix.eigenval`) and returns their paths. Each is written
    /// under a temporary name and renamed when complete, so that no half-written file
    /// carries the final name. Every rank holds the result: call it on one.
    pub fn write_plink_files(
        &self,
        prefix: &Path,
    ) -> Result<(std::path::PathBuf, std::path::PathBuf), plink_files::PcaFileError> {
        let with = |ext: &str| {
            let mut p = prefix.as_os_str().to_owned();
            p.push(ext);
            std::path::PathBuf::from(p)
        };
        let (vec_path, val_path) = (with(".eigenvec"), with(".eigenval"));
        let tmp = |p: &Path| {
            let mut t = p.as_os_str().to_owned();
            t.push(format!(".tmp-{}", std::process::id()));
            std::path::PathBuf::from(t)
        };
        let publish = |from: &Path, to: &Path| {
            std::fs::rename(from, to).map_err(|source| {
                let _ = std::fs::remove_file(from);
                plink_files::PcaFileError::Io {
                    path: to.to_path_buf(),
                    source,
                }
            })
        };
        let written = plink_files::write_eigenvec(
            &tmp(&vec_path),
            self.family_ids.as_deref(),
            &self.sample_ids,
            self.pcs.view(),
        )
        .and_then(|()| plink_files::write_eigenval(&tmp(&val_path), &self.eigenvalues))
        .and_then(|()| publish(&tmp(&vec_path), &vec_path))
        .and_then(|()| publish(&tmp(&val_path), &val_path));
        if written.is_err() {
            for p in [tmp(&vec_path), tmp(&val_path)] {
                let _ = std::fs::remove_file(p);
            }
        }
        written.map(|()| (vec_path, val_path))
    }
}

/// Problem and options of a PCA of `genotypes`: the selection applied, the filters set.
/// The command line runs its own output around these; [`pca`] runs them.
pub fn pca_problem(
    genotypes: Arc<dyn GenotypeSource>,
    params: &PcaParams,
    names: Names,
) -> Result<RsvdProblem, Error> {
    let (source, rows) = params.selection.apply_named(genotypes, names)?;
    let filter = match rows {
        Some(rows) => params.filter.clone().with_rows(rows),
        None => params.filter.clone(),
    };
    let band = source.preferred_panel_rows();
    Ok(
        RsvdProblem::genotypes(source, params.panel_rows.unwrap_or(band))?
            .with_variant_filter(filter),
    )
}

/// PLINK 2's eigenvalues and the explained variance of a PCA's singular values.
pub fn pca_scales(r: &rankwise_linalg::RsvdResult) -> (Vec<f64>, Vec<f64>) {
    // tests/plink.rs holds these to PLINK 2's own eigenvalues.
    let m = r
        .genotypes
        .as_ref()
        .map_or(1, |g| (g.variants - g.variants_filtered).max(1)) as f64;
    let eigenvalues = r.s.iter().map(|s| s * s / m).collect();
    let explained =
        r.s.iter()
            .map(|s| {
                if r.total_sum_squares > 0.0 {
                    s * s / r.total_sum_squares
                } else {
                    0.0
                }
            })
            .collect();
    (eigenvalues, explained)
}

/// The genotype PCA of `genotypes` on the ranks of `rt` (every rank calls it, and every
/// rank gets the result): its principal components, PLINK 2's eigenvalues, and whether
/// every component converged.
///
/// ```
/// # let dir = std::env::temp_dir().join(format!("rankwise-doc-pca-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir).unwrap();
/// # let prefix = dir.join("cohort");
/// # rankwise::genomics::write_example_fileset(&prefix, 400, 60, 7).unwrap();
/// use rankwise::genomics::{pca, PcaParams};
///
/// let rt = rankwise::World::embedded().build()?;
/// let cohort = rankwise::open(prefix.to_str().unwrap())?.genotypes()?;
/// let params = PcaParams { solver: rankwise::RsvdOptions { k: 4, ..PcaParams::default().solver }, ..Default::default() };
/// let result = pca(&rt, cohort, &params)?;
/// assert!(result.convergence.converged);
/// println!("{} samples, eigenvalues {:?}", result.sample_ids.len(), result.eigenvalues);
/// # assert_eq!(result.pcs.dim(), (60, 4));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn pca(
    rt: &Runtime,
    genotypes: Arc<dyn GenotypeSource>,
    params: &PcaParams,
) -> Result<Pca, Error> {
    let problem = pca_problem(genotypes, params, same_name)?;
    let parts = match (&params.weights, &problem.operand) {
        (Some(prefix), rankwise_linalg::Operand::Genotypes(..)) if !problem.transposed => {
            Some(projection::Parts::new(rt, prefix)?)
        }
        (Some(_), _) => {
            return Err(Error::Parameter {
                parameter: "weights",
                message: "variant weights need a genotype source".into(),
            })
        }
        (None, _) => None,
    };
    if params.loadings && problem.transposed {
        return Err(Error::Parameter {
            parameter: "loadings",
            message: "loadings need the variants as the rows of the problem".into(),
        });
    }
    let parts_sink = match (&parts, &problem.operand) {
        (Some(parts), rankwise_linalg::Operand::Genotypes(g, filter)) => {
            Some(parts.sink(Arc::clone(g), filter.clone()))
        }
        _ => None,
    };
    let loadings = params
        .loadings
        .then(|| rankwise_linalg::LocalRows::collect(params.solver.k));
    let sink: Option<rankwise_linalg::FactorSink> =
        match (parts_sink, loadings.as_ref().map(|(s, _)| Arc::clone(s))) {
            (Some(a), Some(b)) => Some(Arc::new(move |panel, rows, f| {
                a(panel, rows.clone(), f)?;
                b(panel, rows, f)
            })),
            (a, b) => a.or(b),
        };
    let result = rsvd(rt, &problem, &params.solver, sink);
    let result = match (result, &parts) {
        (Err(e), Some(parts)) => {
            parts.abandon();
            return Err(e.into());
        }
        (r, _) => r?,
    };
    let c = &result.convergence;
    if params.require_converged && !c.converged {
        if let Some(parts) = &parts {
            parts.abandon();
        }
        return Err(Error::NotConverged(c.describe("PC")));
    }
    let (eigenvalues, _) = pca_scales(&result);
    if let (Some(parts), rankwise_linalg::Operand::Genotypes(g, _)) = (&parts, &problem.operand) {
        let used = result
            .genotypes
            .as_ref()
            .map_or(0, |s| s.variants - s.variants_filtered);
        parts.finish(
            rt,
            g.as_ref(),
            params.solver.k,
            problem.grid.chunk_rows,
            used,
            &eigenvalues,
        )?;
    }
    let mut pca = Pca::of(&problem, &result);
    pca.loadings =
        loadings.map(|(_, collector)| loadings_of(&problem, &result, collector.finish()));
    Ok(pca)
}

/// sgkit's loadings of this rank's rows of `U` (`rows`, from a [`rankwise_linalg::LocalRows`] collector
/// the solver wrote through): each column scaled by `√(σ² / (samples − 1))`, as the
/// command line writes `sample_pca_loading` (the same products, the same bits).
pub fn loadings_of(
    problem: &RsvdProblem,
    result: &rankwise_linalg::RsvdResult,
    mut rows: rankwise_linalg::LocalRows,
) -> rankwise_linalg::LocalRows {
    let scale: Vec<f64> = explained_variance(result, problem.operand.shape().1)
        .iter()
        .map(|v| v.sqrt())
        .collect();
    rows.values *= &ndarray::ArrayView1::from(&scale[..]);
    rows
}

/// sgkit's (and scikit-learn's) explained variance of each component of a PCA of
/// `samples` samples: `σ²/(samples − 1)`.
pub fn explained_variance(result: &rankwise_linalg::RsvdResult, samples: u64) -> Vec<f64> {
    (result.s.iter())
        .map(|s| s * s / (samples.max(2) - 1) as f64)
        .collect()
}

impl Pca {
    /// The PCA that `result` is of `problem` (a [`pca_problem`]): the samples' IDs and
    /// PCs, PLINK 2's eigenvalues, the convergence report; no loadings.
    pub fn of(problem: &RsvdProblem, result: &rankwise_linalg::RsvdResult) -> Pca {
        let (eigenvalues, explained_variance_ratio) = pca_scales(result);
        let samples = problem.operand.shape().1;
        let genotypes = match &problem.operand {
            rankwise_linalg::Operand::Genotypes(g, _) => Some(g),
            rankwise_linalg::Operand::Dense(_) => None,
        };
        let sample_ids = genotypes
            .and_then(|g| g.sample_ids())
            .unwrap_or_else(|| (0..samples).map(|j| format!("sample_{j}")).collect());
        let family_ids = genotypes
            .and_then(|g| g.family_ids())
            .filter(|f| f.len() == sample_ids.len());
        let variants_used = result
            .genotypes
            .as_ref()
            .map_or(0, |g| g.variants - g.variants_filtered);
        Pca {
            sample_ids,
            family_ids,
            pcs: result.wt.t().to_owned(),
            eigenvalues,
            explained_variance_ratio,
            singular_values: result.s.clone(),
            convergence: result.convergence.clone(),
            variants_used,
            loadings: None,
            passes: result.passes,
            timings: result.timings.clone(),
        }
    }
}

/// Writes a PLINK 1 fileset of `variants` × `samples` drawn by the generator from `seed`
/// (three populations, about 5 % of calls missing, variants on chromosomes 1–22 in equal blocks, in order)
/// at `prefix` (`.bed`, `.bim`, `.fam`), for examples and tests.
pub fn write_example_fileset(
    prefix: &Path,
    variants: u64,
    samples: u64,
    seed: u64,
) -> std::io::Result<()> {
    use rankwise_sources::{Dist, Generated};

    let g = Generated::new(variants, samples, seed, Dist::Genotype)
        .with_missing(0.05)
        .with_populations(3, 0.1)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    let bytes_per_variant = samples.div_ceil(4) as usize;
    let mut bed = vec![0x6c, 0x1b, 0x01];
    for v in 0..variants {
        let mut row = vec![0u8; bytes_per_variant];
        for j in 0..samples as usize {
            let d = g.genotype(v, j as u64);
            // PLINK 1 codes: 00 hom. first allele (2 copies), 10 het, 11 hom. second, 01
            // missing; dosages count the first allele.
            let code = match d {
                2 => 0b00,
                1 => 0b10,
                0 => 0b11,
                _ => 0b01,
            };
            row[j / 4] |= code << (2 * (j % 4));
        }
        bed.extend(row);
    }
    std::fs::write(prefix.with_extension("bed"), bed)?;
    let bim: String = (0..variants)
        .map(|v| format!("{}\trs{v}\t0\t{}\tA\tG\n", 1 + v * 22 / variants, 1000 + v))
        .collect();
    std::fs::write(prefix.with_extension("bim"), bim)?;
    let fam: String = (0..samples)
        .map(|j| format!("fam{j}\tS{j}\t0\t0\t0\t-9\n"))
        .collect();
    std::fs::write(prefix.with_extension("fam"), fam)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(ids: &[&str]) -> Pca {
        let n = ids.len();
        Pca {
            sample_ids: ids.iter().map(|s| s.to_string()).collect(),
            family_ids: None,
            pcs: Array2::from_shape_fn((n, 2), |(i, j)| (i * 2 + j) as f64 / 10.0),
            eigenvalues: vec![3.5, 1.25],
            explained_variance_ratio: vec![0.2, 0.1],
            singular_values: vec![2.0, 1.0],
            convergence: Convergence {
                tol: 1e-6,
                residuals: vec![1e-9, 1e-8],
                measure: "test",
                converged: true,
                met: vec![true, true],
                history: Vec::new(),
                pass_precisions: Vec::new(),
                stopped: None,
            },
            variants_used: 10,
            loadings: None,
            passes: 2,
            timings: Vec::new(),
        }
    }

    #[test]
    fn plink_files_are_written_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("rankwise-genomics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let prefix = dir.join("out");
        let (vec_path, val_path) = result(&["a", "b", "c"]).write_plink_files(&prefix).unwrap();
        let vec_text = std::fs::read_to_string(&vec_path).unwrap();
        assert_eq!(vec_text.lines().next(), Some("#IID\tPC1\tPC2"));
        assert_eq!(vec_text.lines().nth(2), Some("b\t0.2\t0.3"));
        assert_eq!(std::fs::read_to_string(&val_path).unwrap(), "3.5\n1.25\n");
        // A sample ID PLINK cannot read: an error naming it, and no file left behind.
        let bad = dir.join("bad");
        let err = result(&["a", "b c", "d"])
            .write_plink_files(&bad)
            .unwrap_err();
        assert!(err.to_string().contains("\"b c\""), "{err}");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("bad"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // With family IDs, PLINK 2's `#FID IID` columns.
        let mut with_fids = result(&["a", "b", "a"]);
        with_fids.family_ids = Some(vec!["f1".into(), "f1".into(), "f2".into()]);
        let (vec_path, _) = with_fids.write_plink_files(&dir.join("fid")).unwrap();
        let text = std::fs::read_to_string(&vec_path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "#FID\tIID\tPC1\tPC2");
        assert_eq!(lines[3], "f2\ta\t0.4\t0.5");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sample_lists_match_family_and_individual_as_plink2_does() {
        let dir = std::env::temp_dir().join(format!("rankwise-keep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let read = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            IdList::read_samples(&p).unwrap()
        };
        // Two families that share IIDs (plink2 keeps one sample for `fam0 s0`).
        let two = read("two.txt", "fam0 s0\nfam1\ts1 extra\n");
        assert!(two.names_sample(Some("fam0"), "s0"));
        assert!(!two.names_sample(Some("fam1"), "s0"));
        assert!(two.names_sample(Some("fam1"), "s1"));
        // One column, or an `#IID` header: FID 0.
        for list in [read("one.txt", "s0\n"), read("iid.txt", "#IID\ns0\n")] {
            assert!(list.names_sample(Some("0"), "s0"));
            assert!(!list.names_sample(Some("s0"), "s0"));
            assert!(!list.names_sample(Some("fam0"), "s0"));
        }
        // A header may put the columns anywhere.
        let moved = read("moved.txt", "#IID\tSEX\tFID\ns2\t1\tfam9\n");
        assert!(moved.names_sample(Some("fam9"), "s2"));
        assert!(!moved.names_sample(Some("0"), "s2"));
        // A source without family IDs is matched by IID, whatever FID a line gives.
        assert!(two.names_sample(None, "s0") && two.names_sample(None, "s1"));
        // A list made of IIDs matches IIDs in any family.
        let iids = IdList::new(["s0"]);
        assert!(iids.names_sample(Some("fam0"), "s0") && iids.names_sample(Some("fam1"), "s0"));
        let pairs = IdList::of_pairs([("fam1", "s0")]);
        assert!(pairs.names_sample(Some("fam1"), "s0") && !pairs.names_sample(Some("fam0"), "s0"));
        // A line short of the header's columns is an error naming it.
        let p = dir.join("short.txt");
        std::fs::write(&p, "#FID\tIID\nfam0\n").unwrap();
        let e = IdList::read_samples(&p).unwrap_err().to_string();
        assert!(e.contains("line 2 has no IID (column 2)"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
