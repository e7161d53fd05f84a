//! A PCA's results as files: a Zarr group in sgkit's layout and PLINK 2's side files,
//! published together or not at all.
//!
//! The group `OUT` holds `U`, `S`, `Vt`, each component's residual, PLINK 2's eigenvalues
//! and the explained variance ratio. For a PCA whose rows are the variants it also holds
//! sgkit's names (`sample_id`, `variant_id`, `variant_contig`, `contig_id`,
//! `variant_position`, `sample_pca_projection`, `sample_pca_loading`,
//! `sample_pca_explained_variance`, `sample_pca_explained_variance_ratio`) and each
//! variant's counted-allele frequency and call count. Beside it lie PLINK 2's
//! `OUT.eigenvec` and `OUT.eigenval`, and for such a PCA `OUT.eigenvec.var` and
//! `OUT.afreq`, what [`crate::project`] and `plink2 --score` read. A caller may add side
//! files of its own ([`PcaFiles::extra_side_files`]: the command line's plot).
//!
//! # All or nothing, on every rank
//!
//! [`PcaGroup::open`] refuses an `OUT` or a side file that exists (results are never
//! overwritten), then every rank opens the group under one temporary name
//! ([`crate::output::publish`]). The actors write `U`'s rows and the per-variant arrays
//! through [`PcaGroup::sink`] as the solver finishes each panel. Rank 0 writes the rest
//! ([`PcaGroup::write_result`]), then [`PcaGroup::commit`] writes the side files under
//! temporary names, renames them into place and commits the group last: its name is the
//! mark of a complete run. Every rank learns rank 0's outcome and fails with it. A failure
//! anywhere is ended by [`PcaGroup::abandon`], which tells the other ranks and removes the
//! temporaries; a signal removes them too ([`crate::output::temporaries`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ndarray::{Array2, ArrayView2};
use rankwise_exec::Runtime;
use rankwise_genomics::plink_files::{write_eigenval, write_eigenvec};
use rankwise_genomics::projection::{
    variant_frequencies, write_weight_files, VariantInfo, WeightRows,
};
use rankwise_genomics::{explained_variance, GenomicsError};
use rankwise_linalg::{FactorSink, Operand, RsvdProblem, RsvdResult};
use rankwise_output::group::{
    read_f64_rows, Dims, OutputError, OutputLayout, SvdOutput, ZarrFormat,
};
use rankwise_output::publish::{self, Opened, PublishError};
use rankwise_output::temporaries::RemovedOnDrop;
use rankwise_sources::GenotypeSource;
use rankwise_transports::TransportError;

use crate::Error;

/// The extensions of the side files every PCA group has (PLINK 2's `.eigenvec` and
/// `.eigenval`) and those of a PCA whose rows are variants (`.eigenvec.var`, `.afreq`).
const SIDE_EXTENSIONS: [&str; 4] = ["eigenvec", "eigenval", "eigenvec.var", "afreq"];

/// The per-variant arrays of the group: the frequency of the counted allele (NaN for a
/// variant that did not enter) and the number of calls.
const FREQUENCY: &str = "variant_counted_allele_frequency";
const CALLS: &str = "variant_call_count";
/// sgkit's loadings, variants × components: `U` scaled by the square root of each
/// component's explained variance, so a column's squares sum to that variance.
const LOADING: &str = "sample_pca_loading";

/// Where and how a PCA's results are written.
#[derive(Clone, Debug)]
pub struct PcaFiles {
    /// The group's path. The side files are `OUT.eigenvec`, `OUT.eigenval`,
    /// `OUT.eigenvec.var` and `OUT.afreq` (the names [`Path::with_extension`] gives).
    pub out: PathBuf,
    /// The group's Zarr format: 3, or 2 for readers of Zarr v2 only (sgkit 0.10).
    pub zarr_format: ZarrFormat,
    /// Extensions of side files the caller writes at [`PcaGroup::commit`] (the command
    /// line's plot, `png`): checked absent at [`PcaGroup::open`] and committed with the
    /// rest.
    pub extra_side_files: Vec<&'static str>,
    /// The group's `command` attribute (`pca`).
    pub command: String,
}

impl PcaFiles {
    /// Files at `out` in Zarr v3, with no side file of the caller's.
    pub fn new(out: impl Into<PathBuf>) -> PcaFiles {
        PcaFiles {
            out: out.into(),
            zarr_format: ZarrFormat::V3,
            extra_side_files: Vec::new(),
            command: "pca".into(),
        }
    }

    /// Every side file's path, the caller's last. `OUT.eigenvec.var` and `OUT.afreq` are
    /// written only by a PCA whose rows are variants.
    pub fn side_files(&self) -> Vec<PathBuf> {
        SIDE_EXTENSIONS
            .iter()
            .chain(&self.extra_side_files)
            .map(|e| self.out.with_extension(e))
            .collect()
    }
}

/// What a caller's side-file writer returns on failure; [`PcaGroup::commit`] returns it
/// as [`Error::Caller`].
pub type CallerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A side file the caller writes at [`PcaGroup::commit`]: its extension (one of
/// [`PcaFiles::extra_side_files`]) and the function that writes it at the path it is
/// given (a temporary name, renamed at the commit).
pub type ExtraSideFile<'a> = (&'static str, &'a dyn Fn(&Path) -> Result<(), CallerError>);

/// What rank 0 needs after the passes to write the side files.
struct Side {
    /// Samples × k.
    pcs: Array2<f64>,
    eigenvalues: Vec<f64>,
    sample_ids: Vec<String>,
    /// The `.fam`'s family IDs, for a PLINK fileset.
    family_ids: Option<Vec<String>>,
    /// For the projection files and the loadings: the variants' IDs and alleles, the
    /// variants that entered, and each component's `√(explained variance)`.
    weights: Option<(VariantInfo, u64, Vec<f64>)>,
}

/// A PCA's group, open on every rank under a temporary name until
/// [`PcaGroup::commit`] or [`PcaGroup::abandon`].
pub struct PcaGroup {
    files: PcaFiles,
    opened: Opened<SvdOutput>,
    /// Whether the group has the per-variant arrays and projection files: a genotype PCA
    /// whose rows are variants.
    weighing: bool,
    k: usize,
    side: Mutex<Option<Side>>,
}

/// Whether a PCA of `problem` writes what projection needs: genotypes whose `U` rows are
/// variants.
fn weighs(problem: &RsvdProblem) -> bool {
    !problem.transposed && matches!(problem.operand, Operand::Genotypes(..))
}

/// The layout of the result group of `problem` with `k` components, written by `command`:
/// `U`'s chunks follow the panels, and a PCA whose rows are variants (`pca_arrays`) has
/// sgkit's dimension names and the per-variant arrays.
pub fn result_layout(
    problem: &RsvdProblem,
    k: usize,
    format: ZarrFormat,
    command: &str,
    pca_arrays: bool,
) -> OutputLayout {
    let (rows, cols) = problem.operand.shape();
    let (m, n) = if problem.transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let chunk = problem.grid.chunk_rows;
    let names = |v: &[&str]| -> Vec<String> {
        if pca_arrays {
            v.iter().map(|s| s.to_string()).collect()
        } else {
            Vec::new()
        }
    };
    OutputLayout {
        format,
        m,
        n,
        k: k as u64,
        u_chunk_rows: if problem.transposed { m.max(1) } else { chunk },
        vt_chunk_cols: if problem.transposed { chunk } else { n.max(1) },
        row_vectors: names(&[FREQUENCY, CALLS]),
        row_matrices: names(&[LOADING]),
        dims: if pca_arrays {
            Dims::GENOTYPES
        } else {
            Dims::MATRIX
        },
        attributes: serde_json::Map::from_iter([
            (
                "source".to_string(),
                serde_json::json!(problem.operand.describe()),
            ),
            ("command".to_string(), serde_json::json!(command)),
            (
                "producer".to_string(),
                serde_json::json!(format!("rankwise {}", env!("CARGO_PKG_VERSION"))),
            ),
        ]),
    }
}

fn out_error(message: impl std::fmt::Display) -> Error {
    Error::Parameter {
        parameter: "out",
        message: message.to_string(),
    }
}

impl PcaGroup {
    /// Opens the group of a PCA of `problem` with `k` components on every rank (a
    /// collective call), after checking on every rank that neither the group nor any side
    /// file exists. Side files without their group are what a run killed while committing
    /// left: the error says how to remove them.
    pub fn open(
        rt: &Runtime,
        files: PcaFiles,
        problem: &RsvdProblem,
        k: usize,
    ) -> Result<PcaGroup, Error> {
        let out = &files.out;
        for f in files.side_files() {
            if f.exists() {
                let how = if out.exists() {
                    String::new()
                } else {
                    let all: Vec<String> = (files.side_files().iter())
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
                return Err(out_error(format!(
                    "{} exists{how}; rankwise never overwrites results",
                    f.display()
                )));
            }
        }
        let weighing = weighs(problem);
        let layout = result_layout(problem, k, files.zarr_format, &files.command, weighing);
        let opened = publish::open_group(rt, out, layout).map_err(|e| match e {
            PublishError::Create(e) => out_error(e),
            PublishError::Output(e) => Error::Output(e),
            PublishError::Transport(e) => Error::Transport(e),
        })?;
        Ok(PcaGroup {
            files,
            opened,
            weighing,
            k,
            side: Mutex::new(None),
        })
    }

    /// The group, for the caller's own arrays and report (before the commit).
    pub fn output(&self) -> &Arc<SvdOutput> {
        &self.opened.output
    }

    /// On rank 0: the temporaries of `OUT` that an earlier run left (killed by SIGKILL)
    /// or is still writing, for the caller to tell the user about. Empty elsewhere.
    pub fn stale(&self) -> &[PathBuf] {
        &self.opened.stale
    }

    /// The factor sink the solver writes through: `U`'s rows, and for a PCA whose rows
    /// are variants each variant's frequency and calls, read again from the panel's rows
    /// by the actor that owns them.
    pub fn sink(&self, problem: &RsvdProblem) -> FactorSink {
        let o = Arc::clone(&self.opened.output);
        let transposed = problem.transposed;
        let genotypes = match &problem.operand {
            Operand::Genotypes(g, filter) if self.weighing => Some((Arc::clone(g), filter.clone())),
            _ => None,
        };
        Arc::new(
            move |_panel: usize, rows: std::ops::Range<u64>, f: ArrayView2<'_, f64>| {
                if transposed {
                    return o
                        .write_vt_cols(rows.start, f.t())
                        .map_err(|e| e.to_string());
                }
                o.write_u_rows(rows.start, f).map_err(|e| e.to_string())?;
                if let Some((g, filter)) = &genotypes {
                    let (freq, calls) = variant_frequencies(g.as_ref(), filter, rows.clone())
                        .map_err(|e| e.to_string())?;
                    o.write_row_vector(FREQUENCY, rows.start, &freq)
                        .and_then(|()| o.write_row_vector(CALLS, rows.start, &calls))
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            },
        )
    }

    /// Writes the solver's result into the group (called on rank 0, after the passes,
    /// when every rank's actors have written their rows): `Vt` (or `U` of a transposed
    /// problem), `S`, the residuals, PLINK 2's eigenvalues, the explained variance and,
    /// for a PCA whose rows are variants, what names the rows and columns. It keeps what
    /// [`PcaGroup::commit`] writes the side files from.
    pub fn write_result(&self, problem: &RsvdProblem, result: &RsvdResult) -> Result<(), Error> {
        let o = &self.opened.output;
        write_factors(o, result)?;
        let pca = rankwise_genomics::Pca::of(problem, result);
        o.write_vector("eigenvalues", &pca.eigenvalues)?;
        o.write_vector("explained_variance_ratio", &pca.explained_variance_ratio)?;
        let samples = problem.operand.shape().1;
        let weights = match &problem.operand {
            Operand::Genotypes(g, _) if self.weighing => {
                let info = write_identity(o, g.as_ref(), result, &pca.explained_variance_ratio)?;
                let scale = explained_variance(result, samples)
                    .iter()
                    .map(|v| v.sqrt())
                    .collect();
                Some((info, pca.variants_used, scale))
            }
            _ => None,
        };
        *self.side.lock().unwrap_or_else(|e| e.into_inner()) = Some(Side {
            pcs: pca.pcs,
            eigenvalues: pca.eigenvalues,
            sample_ids: pca.sample_ids,
            family_ids: pca.family_ids,
            weights,
        });
        Ok(())
    }

    /// Publishes the results (a collective call, after [`PcaGroup::write_result`] on
    /// rank 0): rank 0 writes `.eigenvec` and `.eigenval`, then the caller's `extra` side
    /// files, then the projection files and the loadings (read back from the group's `U`),
    /// each under a temporary name; renames them into place and commits the group last.
    /// Every rank learns whether rank 0 succeeded and fails with it. On failure the caller
    /// ends the group with [`PcaGroup::abandon`]; the temporary side files are already
    /// gone.
    pub fn commit(&self, rt: &Runtime, extra: &[ExtraSideFile<'_>]) -> Result<(), Error> {
        let result = if rt.rank() == 0 {
            self.publish(extra)
        } else {
            Ok(())
        };
        // The other ranks have finished their part, and would otherwise exit 0 with rank
        // 0's failure.
        let mut outcome = match &result {
            Err(e) if rt.rank() == 0 => format!("\u{1}{e}").into_bytes(),
            _ => vec![0],
        };
        rt.comm().broadcast_bytes(0, &mut outcome)?;
        if rt.rank() != 0 && outcome.first() == Some(&1) {
            return Err(Error::Transport(TransportError::PeerFailed {
                rank: 0,
                message: String::from_utf8_lossy(&outcome[1..]).into_owned(),
            }));
        }
        result
    }

    /// Rank 0's part of [`PcaGroup::commit`].
    fn publish(&self, extra: &[ExtraSideFile<'_>]) -> Result<(), Error> {
        let side = self.side.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(side) = side else {
            return Err(out_error(
                "internal: the group was committed before its result was written",
            ));
        };
        let o = &self.opened.output;
        let out = &self.files.out;
        let token = (self.opened.tmp.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.rsplit(".tmp-").next())
            .unwrap_or("tmp")
            .to_string();
        // The extension stays last (a plot's encoder is chosen by it). `OUT.tmp-…` is the
        // prefix a later run recognizes as a temporary (`SvdOutput::stale_temporaries`).
        let tmp = |ext: &str| out.with_extension(format!("tmp-{token}.{ext}"));
        let extensions: Vec<&str> = SIDE_EXTENSIONS
            .iter()
            .copied()
            .chain(extra.iter().map(|(e, _)| *e))
            .collect();
        // Every side file's temporary goes when this function ends, by an error or a panic
        // as well (after a commit they have their final names, and nothing is there to
        // go): before rank 0 tells the others, which may end the job. A signal removes
        // them meanwhile.
        let _temporaries = RemovedOnDrop::new(extensions.iter().map(|e| tmp(e)));
        let mut renames = Vec::new();
        let file = |e: rankwise_genomics::plink_files::PcaFileError| out_error(e);
        write_eigenvec(
            &tmp("eigenvec"),
            side.family_ids.as_deref(),
            &side.sample_ids,
            side.pcs.view(),
        )
        .map_err(file)?;
        renames.push((tmp("eigenvec"), out.with_extension("eigenvec")));
        write_eigenval(&tmp("eigenval"), &side.eigenvalues).map_err(file)?;
        renames.push((tmp("eigenval"), out.with_extension("eigenval")));
        for (ext, write) in extra {
            if !self.files.extra_side_files.contains(ext) {
                return Err(out_error(format!(
                    "internal: side file .{ext} was not declared when the group was opened"
                )));
            }
            write(&tmp(ext)).map_err(Error::Caller)?;
            renames.push((tmp(ext), out.with_extension(ext)));
        }
        if let Some((info, used, loading_scale)) = &side.weights {
            let group = o.temp_dir();
            let k = self.k;
            let chunk = o.layout().u_chunk_rows_stored();
            let genomics = |message: String| GenomicsError::File {
                path: group.to_path_buf(),
                message,
            };
            let read = |name: &str, rows: std::ops::Range<u64>| {
                read_f64_rows(group, name, rows).map_err(|e| genomics(e.to_string()))
            };
            write_weight_files(
                &tmp("eigenvec.var"),
                &tmp("afreq"),
                info,
                k,
                chunk,
                *used,
                |rows| {
                    let u = read("U", rows.clone())?;
                    let u = Array2::from_shape_vec(((rows.end - rows.start) as usize, k), u)
                        .map_err(|e| genomics(e.to_string()))?;
                    // The loadings are written from the same read of `U` (they need Σ,
                    // which the actors writing `U` did not have yet).
                    let scale = ndarray::ArrayView1::from(&loading_scale[..]);
                    o.write_row_matrix(LOADING, rows.start, (&u * &scale).view())
                        .map_err(|e| genomics(e.to_string()))?;
                    Ok(WeightRows {
                        u,
                        freq: read(FREQUENCY, rows.clone())?,
                        calls: read(CALLS, rows)?,
                    })
                },
            )
            .map_err(out_error)?;
            renames.push((tmp("eigenvec.var"), out.with_extension("eigenvec.var")));
            renames.push((tmp("afreq"), out.with_extension("afreq")));
        }
        // The group is committed last: its name is the mark of a complete run.
        publish::commit_with_files(o, &renames)?;
        Ok(())
    }

    /// Ends a failed run (every rank calls it): unless `own` is `None` (the failure is
    /// another rank's, which the others already heard of), tells the other ranks `own()`
    /// first, then removes the temporary group. Returns the failure of another rank that
    /// arrived instead, if one did ([`publish::abandon_collectively`]).
    pub fn abandon(
        self,
        rt: &Runtime,
        own: Option<&dyn Fn() -> String>,
    ) -> Option<(usize, String)> {
        publish::abandon_collectively(rt, self.opened, own)
    }
}

/// Writes what every result group of a randomized SVD holds beside `U` (which the actors
/// write): `Vt` (or `U`, for a problem solved through its transpose), `S` and each
/// component's residual.
pub fn write_factors(o: &SvdOutput, result: &RsvdResult) -> Result<(), OutputError> {
    if result.transposed {
        o.write_u_rows(0, result.wt.t())?;
    } else {
        o.write_vt(result.wt.view())?;
    }
    o.write_s(&result.s)?;
    o.write_vector("residuals", &result.convergence.residuals)
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
    explained: &[f64],
) -> Result<VariantInfo, Error> {
    let d = Dims::GENOTYPES;
    let (m, n) = g.shape();
    let chunk = o.layout().u_chunk_rows_stored();
    let ids = g
        .sample_ids()
        .unwrap_or_else(|| (0..n).map(|j| format!("sample_{j}")).collect());
    o.write_strings("sample_id", d.cols, &ids, n)?;
    let info = VariantInfo::of(g).map_err(out_error)?;
    o.write_strings("variant_id", d.rows, &info.ids, chunk)?;
    let mut contigs: Vec<String> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let contig: Vec<i64> = (info.chromosomes.iter())
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
    o.write_vector("sample_pca_explained_variance_ratio", explained)?;
    Ok(info)
}
