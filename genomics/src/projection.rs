//! Projection of new samples onto the axes of a PCA, as `plink2 --score` does with the
//! variant weights of `plink2 --pca var-wts`.
//!
//! # The files
//!
//! A PCA of variants × samples standardized as PLINK 2 standardizes them
//! (`x = (g − 2p)/√(2p(1−p))`, a missing call 0) is `X = U·Σ·Vᵀ`; its `.eigenvec` holds `V`
//! and its `.eigenval` `λⱼ = σⱼ²/M` (M variants). Next to them a PCA with an output writes:
//! - `.eigenvec.var`: `#CHROM ID MAJ NONMAJ PC1 … PCk`, each variant's weights
//!   `W = ±U·√M` for the copies of its non-major allele, the scale `plink2 --pca var-wts`
//!   writes (measured against PLINK v2.00a3.5: its weights are `U·√M` to 6 digits);
//! - `.afreq`: `#CHROM ID REF ALT ALT_FREQS OBS_CT`, the frequencies the standardization
//!   used, as `plink2 --freq` writes them (for a `.bed`, REF is A2 and ALT is A1).
//!
//! Both are what `plink2 --read-freq F.afreq --score F.eigenvec.var 2 4 header-read
//! variance-standardize no-mean-imputation --score-col-nums 5-…` reads, and its score
//! sums are ours: a missing call adds nothing (its standardized value is 0, as in the
//! PCA). Without `no-mean-imputation`, plink2 v2.00a3.5's sums of samples with missing calls
//! differ from these, and from the PCA's own PCs, by up to 10 %. Since `XᵀU = VΣ`, a sample's score
//! sum `sⱼ = Σᵥ xᵥ·Wᵥⱼ` is `Vⱼ·σⱼ·√M`; with `‖Wⱼ‖² = M` and `σⱼ = √(λⱼM)`,
//! `Vⱼ = sⱼ / (‖Wⱼ‖²·√λⱼ)`: [`project`] writes new samples' PCs on the `.eigenvec`'s own
//! scale, so that projecting the samples of the PCA gives back their PCs.
//!
//! # Matching
//!
//! As `plink2 --score` matches: a variant of the new data is used when a weights line has
//! its ID and that line's allele is one of its two alleles (the other one flips the sign
//! and the frequency). Lines whose ID the new data lacks, lines whose allele is neither,
//! and variants of the new data without an ID are counted and reported. An ID the new
//! data holds twice is an error, as it is for plink2.
//!
//! Sources without variant IDs or alleles (a plain Zarr dosage matrix, generated data)
//! name variant `i` `v{i}` on chromosome 1 with alleles A (counted) and G, as
//! `tools/zarr_to_bed.py` names them: such sources are matched by row.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ndarray::{s, Array2};
use rankwise_exec::Runtime;
use rankwise_linalg::{row_counts, PartialSums, Tree, VariantFilter};
use rankwise_sources::GenotypeSource;

use crate::GenomicsError as Error;

/// Bytes of dosages read at a time where a pass reads a panel's rows in blocks.
const BLOCK_BYTES: u64 = 8 << 20;

/// Each variant's chromosome, ID and alleles, in row order (see the module notes for a
/// source that has none).
#[derive(Clone, Debug, Default)]
pub struct VariantInfo {
    /// Chromosome names.
    pub chromosomes: Vec<String>,
    /// IDs (`.` where the source has none for a variant).
    pub ids: Vec<String>,
    /// The allele whose copies the dosages count (A1; ALT).
    pub counted: Vec<String>,
    /// The other allele (A2; REF).
    pub other: Vec<String>,
}

impl VariantInfo {
    /// Reads them from `source`.
    pub fn of(source: &dyn GenotypeSource) -> Result<VariantInfo, Error> {
        let m = source.shape().0 as usize;
        let mut info = VariantInfo::default();
        if !source.variant_ids(&mut |id| info.ids.push(id.unwrap_or(".").to_owned()))? {
            info.ids = (0..m).map(|i| format!("v{i}")).collect();
        }
        if !source.variant_chromosomes(&mut |c| info.chromosomes.push(c.to_owned()))? {
            info.chromosomes = vec!["1".to_owned(); m];
        }
        let (mut counted, mut other) = (Vec::new(), Vec::new());
        if source.variant_alleles(&mut |a, b| {
            counted.push(a.to_owned());
            other.push(b.to_owned());
        })? {
            info.counted = counted;
            info.other = other;
        } else {
            info.counted = vec!["A".to_owned(); m];
            info.other = vec!["G".to_owned(); m];
        }
        for (what, len) in [
            ("IDs", info.ids.len()),
            ("chromosomes", info.chromosomes.len()),
            ("alleles", info.counted.len()),
        ] {
            if len != m {
                return Err(Error::Parameter {
                    parameter: "source",
                    message: format!(
                        "{}: {len} variant {what} for {m} variants",
                        source.describe()
                    ),
                });
            }
        }
        Ok(info)
    }
}

/// The frequency of the counted allele among the calls of each variant `rows` of `source`
/// (NaN where `filter` excludes the variant) and its number of calls: what the PCA's
/// standardization used. Reads the rows in blocks of at most 8 MiB of dosages.
pub fn variant_frequencies(
    source: &dyn GenotypeSource,
    filter: &VariantFilter,
    rows: Range<u64>,
) -> Result<(Vec<f64>, Vec<f64>), Error> {
    let n = source.shape().1;
    let block = (BLOCK_BYTES / n.max(1)).max(1);
    let (mut freq, mut calls) = (Vec::new(), Vec::new());
    let mut at = rows.start;
    while at < rows.end {
        let end = (at + block).min(rows.end);
        let mut d = Array2::<i8>::zeros(((end - at) as usize, n as usize));
        source.fill_dosages(at..end, d.view_mut())?;
        for (i, row) in d.rows().into_iter().enumerate() {
            let v = at + i as u64;
            let row = row.as_slice().expect("standard layout");
            let counts = row_counts(row).map_err(|(j, x)| Error::Parameter {
                parameter: "source",
                message: format!(
                    "{}: variant {v}, sample {j} has dosage {x}, not 0, 1, 2 or missing",
                    source.describe()
                ),
            })?;
            let [_, ones, twos] = counts.dosages;
            let c = counts.dosages.iter().sum::<u64>();
            calls.push(c as f64);
            freq.push(if filter.keeps_row(v, &counts) && c > 0 {
                (ones + 2 * twos) as f64 / (2 * c) as f64
            } else {
                f64::NAN
            });
        }
        at = end;
    }
    Ok((freq, calls))
}

/// One block of rows of a PCA's result, for [`write_weight_files`]: `U`'s rows, and the
/// frequencies and calls of [`variant_frequencies`].
pub struct WeightRows {
    /// Rows of `U` (rows × k).
    pub u: Array2<f64>,
    /// Frequency of the counted allele (NaN: the variant did not enter the PCA).
    pub freq: Vec<f64>,
    /// Calls (non-missing genotypes).
    pub calls: Vec<f64>,
}

/// Writes `var_path` (`.eigenvec.var`) and `afreq_path` (`.afreq`) as the module notes
/// describe, for the variants that entered the PCA, reading its result `chunk` rows at a
/// time through `rows`; `variants_used` is M. Returns the lines written to each.
pub fn write_weight_files(
    var_path: &Path,
    afreq_path: &Path,
    info: &VariantInfo,
    k: usize,
    chunk: u64,
    variants_used: u64,
    mut rows: impl FnMut(Range<u64>) -> Result<WeightRows, Error>,
) -> Result<u64, Error> {
    let create = |p: &Path| {
        std::fs::File::create(p)
            .map(BufWriter::new)
            .map_err(|e| io_error(p, e))
    };
    let (mut var, mut afreq) = (create(var_path)?, create(afreq_path)?);
    let mut head = "#CHROM\tID\tMAJ\tNONMAJ".to_owned();
    for j in 1..=k {
        let _ = write!(head, "\tPC{j}");
    }
    writeln!(var, "{head}").map_err(|e| io_error(var_path, e))?;
    writeln!(afreq, "#CHROM\tID\tREF\tALT\tALT_FREQS\tOBS_CT")
        .map_err(|e| io_error(afreq_path, e))?;
    let root_m = (variants_used as f64).sqrt();
    let m = info.ids.len() as u64;
    let mut written = 0;
    let mut line = String::new();
    let mut at = 0;
    while at < m {
        let end = (at + chunk.max(1)).min(m);
        let b = rows(at..end)?;
        if b.u.dim() != ((end - at) as usize, k) || b.freq.len() != b.u.nrows() {
            return Err(Error::File {
                path: var_path.to_path_buf(),
                message: format!("rows {at}..{end} of the result have the wrong shape"),
            });
        }
        for i in 0..b.u.nrows() {
            let p = b.freq[i];
            if !p.is_finite() {
                continue;
            }
            let v = at as usize + i;
            let (id, chrom) = (field(&info.ids[v]), field(&info.chromosomes[v]));
            let (other, counted) = (field(&info.other[v]), field(&info.counted[v]));
            // The weights are for the non-major allele, as plink2 writes them.
            let (maj, nonmaj, sign) = if p <= 0.5 {
                (&other, &counted, 1.0)
            } else {
                (&counted, &other, -1.0)
            };
            line.clear();
            let _ = write!(line, "{chrom}\t{id}\t{maj}\t{nonmaj}");
            for j in 0..k {
                let w = sign * b.u[[i, j]] * root_m;
                let _ = write!(line, "\t{}", if w == 0.0 { 0.0 } else { w });
            }
            writeln!(var, "{line}").map_err(|e| io_error(var_path, e))?;
            writeln!(
                afreq,
                "{chrom}\t{id}\t{other}\t{counted}\t{p}\t{}",
                2.0 * b.calls[i]
            )
            .map_err(|e| io_error(afreq_path, e))?;
            written += 1;
        }
        at = end;
    }
    for (w, p) in [(var, var_path), (afreq, afreq_path)] {
        w.into_inner()
            .map_err(|e| io_error(p, e.into_error()))?
            .sync_all()
            .map_err(|e| io_error(p, e))?;
    }
    Ok(written)
}

/// A name as a column of the text files: `.` for an empty one (a VCF's missing ALT, which
/// bio2zarr stores as an empty string), and whitespace, which would split the column, as
/// `_`. PLINK 2 writes a missing allele as `.` too.
fn field(name: &str) -> std::borrow::Cow<'_, str> {
    if name.is_empty() {
        ".".into()
    } else if name.contains(char::is_whitespace) {
        name.replace(char::is_whitespace, "_").into()
    } else {
        name.into()
    }
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::NotFound {
        return Error::NotFound {
            path: path.to_path_buf(),
        };
    }
    Error::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// A PCA's variant weights, frequencies and eigenvalues, read from the files a PCA wrote
/// (or `plink2 --pca var-wts` and `plink2 --freq` wrote).
#[derive(Clone, Debug)]
pub struct Weights {
    ids: HashMap<String, usize>,
    allele: Vec<String>,
    /// Frequency of `allele`.
    freq: Vec<f64>,
    /// variants × k.
    w: Array2<f64>,
    /// `1 / (‖Wⱼ‖²·√λⱼ)`.
    scale: Vec<f64>,
    /// The `.eigenvec.var` file, for messages.
    origin: PathBuf,
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut p = prefix.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// A text table: its header's column names, and each line's number (1-based) and fields.
type Table = (Vec<String>, Vec<(usize, Vec<String>)>);

/// The lines of `path` split on whitespace, with their numbers (1-based), the header
/// (the first line, starting with `#`) apart.
fn table(path: &Path) -> Result<Table, Error> {
    let file = rankwise_sources::open_regular(path).map_err(|e| io_error(path, e))?;
    let mut header = None;
    let mut body = Vec::new();
    for (no, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| io_error(path, e))?;
        let fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if fields.is_empty() {
            continue;
        }
        if header.is_none() && body.is_empty() && fields[0].starts_with('#') {
            header = Some(
                fields
                    .iter()
                    .map(|f| f.trim_start_matches('#').to_owned())
                    .collect(),
            );
            continue;
        }
        body.push((no + 1, fields));
    }
    let header = header.ok_or_else(|| Error::File {
        path: path.to_path_buf(),
        message: "has no header line (`#CHROM ID …`)".into(),
    })?;
    Ok((header, body))
}

impl Weights {
    /// Reads `PREFIX.eigenvec.var`, `PREFIX.afreq` and `PREFIX.eigenval` (plink2's names
    /// for `--out PREFIX`), or, where those are not there, the names
    /// [`Path::with_extension`] gives (`rankwise pca --out RUN.zarr` writes
    /// `RUN.eigenvec.var`).
    pub fn read(prefix: &Path) -> Result<Weights, Error> {
        let name = |ext: &str| {
            let appended = with_suffix(prefix, &format!(".{ext}"));
            let replaced = prefix.with_extension(ext);
            if !appended.exists() && replaced.exists() {
                replaced
            } else {
                appended
            }
        };
        let var_path = name("eigenvec.var");
        let afreq_path = name("afreq");
        let val_path = name("eigenval");
        let bad = |path: &Path, message: String| Error::File {
            path: path.to_path_buf(),
            message,
        };
        let (head, lines) = table(&var_path)?;
        let col = |names: &[&str]| head.iter().position(|h| names.contains(&h.as_str()));
        let id_col =
            col(&["ID"]).ok_or_else(|| bad(&var_path, "its header names no ID column".into()))?;
        let allele_col = col(&["NONMAJ", "A1"]).ok_or_else(|| {
            bad(
                &var_path,
                "its header names no NONMAJ (or A1) column".into(),
            )
        })?;
        let pc_cols: Vec<usize> = (0..head.len())
            .filter(|&c| head[c].starts_with("PC"))
            .collect();
        let k = pc_cols.len();
        if k == 0 {
            return Err(bad(&var_path, "its header names no PC columns".into()));
        }
        let mut ids = HashMap::new();
        let mut allele = Vec::new();
        let mut w = Array2::zeros((lines.len(), k));
        for (i, (no, f)) in lines.iter().enumerate() {
            let field = |c: usize| {
                f.get(c).ok_or_else(|| {
                    bad(
                        &var_path,
                        format!(
                            "line {no} has {} columns, the header {}",
                            f.len(),
                            head.len()
                        ),
                    )
                })
            };
            let id = field(id_col)?.clone();
            if ids.insert(id.clone(), i).is_some() {
                return Err(bad(
                    &var_path,
                    format!("line {no}: variant ID {id:?} appears twice"),
                ));
            }
            allele.push(field(allele_col)?.clone());
            for (j, &c) in pc_cols.iter().enumerate() {
                let text = field(c)?;
                w[[i, j]] = text
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| {
                        bad(&var_path, format!("line {no}: {text:?} is not a weight"))
                    })?;
            }
        }
        // Frequencies, by ID.
        let (fhead, flines) = table(&afreq_path)?;
        let fcol = |name: &str| {
            fhead
                .iter()
                .position(|h| h == name)
                .ok_or_else(|| bad(&afreq_path, format!("its header names no {name} column")))
        };
        let (fid, fref, falt, ffreq) =
            (fcol("ID")?, fcol("REF")?, fcol("ALT")?, fcol("ALT_FREQS")?);
        let mut freq = vec![f64::NAN; lines.len()];
        for (no, f) in &flines {
            let field = |c: usize| {
                f.get(c).ok_or_else(|| {
                    bad(
                        &afreq_path,
                        format!("line {no} is short of the header's columns"),
                    )
                })
            };
            let Some(&i) = ids.get(field(fid)?) else {
                continue;
            };
            let text = field(ffreq)?;
            let p = text
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=1.0).contains(p))
                .ok_or_else(|| {
                    bad(
                        &afreq_path,
                        format!("line {no}: {text:?} is not one allele frequency"),
                    )
                })?;
            freq[i] = if field(falt)? == &allele[i] {
                p
            } else if field(fref)? == &allele[i] {
                1.0 - p
            } else {
                return Err(bad(
                    &afreq_path,
                    format!(
                        "line {no}: variant {:?} has alleles {} and {}, but {} weighs allele {}",
                        field(fid)?,
                        field(fref)?,
                        field(falt)?,
                        var_path.display(),
                        allele[i]
                    ),
                ));
            };
        }
        if let Some(i) = freq.iter().position(|p| p.is_nan()) {
            let id = ids
                .iter()
                .find(|(_, &v)| v == i)
                .map(|(k, _)| k.clone())
                .unwrap_or_default();
            return Err(bad(
                &afreq_path,
                format!("has no frequency for variant {id:?}"),
            ));
        }
        // Eigenvalues.
        let text = rankwise_sources::read_regular_to_string(&val_path)
            .map_err(|e| io_error(&val_path, e))?;
        let lambda: Vec<f64> = text
            .split_whitespace()
            .map(|t| match t.parse::<f64>() {
                // An eigenvalue of AᵀA/m is finite and not negative (zero: a PC of zeros).
                Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
                _ => Err(bad(&val_path, format!("{t:?} is not an eigenvalue"))),
            })
            .collect::<Result<_, _>>()?;
        if lambda.len() < k {
            return Err(bad(
                &val_path,
                format!(
                    "has {} eigenvalues for the {k} PCs of {}",
                    lambda.len(),
                    var_path.display()
                ),
            ));
        }
        let scale = (0..k)
            .map(|j| {
                let norm2: f64 = w.column(j).iter().map(|x| x * x).sum();
                if norm2 > 0.0 && lambda[j] > 0.0 {
                    1.0 / (norm2 * lambda[j].sqrt())
                } else {
                    0.0
                }
            })
            .collect();
        Ok(Weights {
            ids,
            allele,
            freq,
            w,
            scale,
            origin: var_path,
        })
    }

    /// Number of PCs.
    pub fn k(&self) -> usize {
        self.w.ncols()
    }

    /// Number of weighted variants.
    pub fn variants(&self) -> usize {
        self.w.nrows()
    }
}

/// New samples' PCs from [`project`].
#[derive(Clone, Debug)]
pub struct Projection {
    /// The samples' IDs (`sample_J` where the input has none).
    pub sample_ids: Vec<String>,
    /// Their family IDs, where the input has them.
    pub family_ids: Option<Vec<String>>,
    /// samples × k, on the scale of the PCA's `.eigenvec`.
    pub pcs: Array2<f64>,
    /// Weighted variants found in the new data with a matching allele.
    pub matched: u64,
    /// Of those, matched through the other allele (sign and frequency flipped).
    pub flipped: u64,
    /// Weighted variants whose ID the new data lacks.
    pub absent: u64,
    /// Weighted variants whose allele is neither of the new data's two.
    pub allele_mismatches: u64,
    /// Variants of the new data without an ID (never matched).
    pub unnamed: u64,
    /// Weighted variants in all.
    pub weighted: u64,
}

impl Projection {
    /// One line for a summary: how the variants matched.
    pub fn describe(&self) -> String {
        format!(
            "{} of {} weighted variants matched ({} through the other allele); {} absent from the \
             new data, {} with neither allele{}",
            self.matched,
            self.weighted,
            self.flipped,
            self.absent,
            self.allele_mismatches,
            if self.unnamed > 0 {
                format!("; {} variants of the new data have no ID", self.unnamed)
            } else {
                String::new()
            }
        )
    }
}

/// How each variant of the new data enters: weights line and sign.
struct Plan {
    entry: Vec<Option<(usize, f64)>>,
    projection: Projection,
}

fn plan(source: &dyn GenotypeSource, weights: &Weights) -> Result<Plan, Error> {
    let info = VariantInfo::of(source)?;
    let mut seen = HashSet::new();
    let mut entry = Vec::with_capacity(info.ids.len());
    let (mut matched, mut flipped, mut mismatched, mut unnamed) = (0u64, 0u64, 0u64, 0u64);
    let mut found = vec![false; weights.variants()];
    for (v, id) in info.ids.iter().enumerate() {
        // An empty ID is written as `.`: unnamed too.
        if id.is_empty() || id == "." {
            unnamed += 1;
            entry.push(None);
            continue;
        }
        let Some(&e) = weights.ids.get(id) else {
            entry.push(None);
            continue;
        };
        if !seen.insert(id.as_str()) {
            return Err(Error::Parameter {
                parameter: "source",
                message: format!(
                    "{}: variant ID {id:?} appears more than once; {} weighs it once (as plink2 \
                     --score, a projection needs unique IDs)",
                    source.describe(),
                    weights.origin.display()
                ),
            });
        }
        found[e] = true;
        // The alleles as the weight files write them (`.` for a missing one).
        let a = weights.allele[e].as_str();
        if a == field(&info.counted[v]) {
            matched += 1;
            entry.push(Some((e, 1.0)));
        } else if a == field(&info.other[v]) {
            matched += 1;
            flipped += 1;
            entry.push(Some((e, -1.0)));
        } else {
            mismatched += 1;
            entry.push(None);
        }
    }
    let absent = found.iter().filter(|f| !**f).count() as u64;
    let n = source.shape().1 as usize;
    let sample_ids = source
        .sample_ids()
        .unwrap_or_else(|| (0..n).map(|j| format!("sample_{j}")).collect());
    let family_ids = source.family_ids().filter(|f| f.len() == sample_ids.len());
    Ok(Plan {
        entry,
        projection: Projection {
            sample_ids,
            family_ids,
            pcs: Array2::zeros((n, weights.k())),
            matched,
            flipped,
            absent,
            allele_mismatches: mismatched,
            unnamed,
            weighted: weights.variants() as u64,
        },
    })
}

/// The PCs of the samples of `source` on the axes whose `weights` a PCA wrote (every rank
/// calls it and gets the result). Each rank reads a contiguous share of the variants in
/// panels of `panel_rows` (`None`: the source's preferred panels); the sums go up the
/// runtime's reduction tree panel by panel, so the result is the same for any number of
/// ranks.
pub fn project(
    rt: &Runtime,
    source: Arc<dyn GenotypeSource>,
    weights: &Arc<Weights>,
    panel_rows: Option<u64>,
) -> Result<Projection, Error> {
    let Plan {
        entry,
        mut projection,
    } = plan(source.as_ref(), weights)?;
    if projection.matched == 0 {
        return Err(Error::Parameter {
            parameter: "weights",
            message: format!(
                "no variant of {} matches {} by ID and allele ({})",
                source.describe(),
                weights.origin.display(),
                projection.describe()
            ),
        });
    }
    let (m, n) = source.shape();
    let k = weights.k();
    let rows = match panel_rows {
        Some(0) => {
            return Err(Error::Parameter {
                parameter: "panel_rows",
                message: "must be at least 1".into(),
            })
        }
        Some(r) => r,
        None => source.preferred_panel_rows().max(1),
    };
    let panels = m.div_ceil(rows).max(1) as usize;
    let ranks = rt.comm().size();
    let owners: Vec<usize> = (0..panels).map(|p| p * ranks / panels).collect();
    let me = rt.rank();
    let sums = PartialSums::new(owners.clone(), me);
    // This rank's panels, dealt to its actors' threads in turn as contiguous runs: each
    // job sums its run of panels with one set of buffers (a buffer per panel is mapped and
    // faulted in afresh every time: allocations of 4 MiB or more are never reused).
    let mine: Vec<usize> = (0..panels).filter(|&p| owners[p] == me).collect();
    let threads: Vec<usize> = rt.actors().iter().map(|a| a.threads().max(1)).collect();
    let runs = threads.iter().sum::<usize>().max(1);
    let mut jobs: Vec<Vec<Vec<usize>>> = vec![Vec::new(); threads.len().max(1)];
    let (mut actor, mut left) = (0, threads.first().copied().unwrap_or(1));
    for run in 0..runs {
        let part = mine[run * mine.len() / runs..(run + 1) * mine.len() / runs].to_vec();
        if !part.is_empty() {
            jobs[actor].push(part);
        }
        left -= 1;
        if left == 0 && actor + 1 < threads.len() {
            actor += 1;
            left = threads[actor];
        }
    }
    let entry = Arc::new(entry);
    let shared = Arc::clone(weights);
    let sums = Arc::new(sums);
    let into = Arc::clone(&sums);
    let results = rt
        .map(jobs, move |_, run: Vec<usize>| -> Result<(), Error> {
            let mut buffers = Buffers::default();
            for p in run {
                let panel = (p as u64 * rows)..((p as u64 + 1) * rows).min(m);
                let total = panel_sums(source.as_ref(), &shared, &entry, panel, &mut buffers)?;
                into.insert(p, total);
            }
            Ok(())
        })
        .map_err(rankwise_linalg::LinalgError::from)?;
    for r in results.into_iter().flatten() {
        r?;
    }
    let tree = Tree::new(&owners);
    let total = tree.sum_all_partial(rt.comm(), sums.take(), (n as usize, k))?;
    for j in 0..k {
        let c = weights.scale[j];
        projection
            .pcs
            .column_mut(j)
            .assign(&total.column(j).mapv(|s| s * c));
    }
    Ok(projection)
}

/// The buffers of [`panel_sums`], kept across the panels of one job.
#[derive(Default)]
struct Buffers {
    d: Array2<i8>,
    x: Array2<f64>,
    a: Array2<f64>,
    b: Array2<f64>,
}

/// `Σᵥ xᵥᵀ·wᵥ` over the variants of `panel` that `entry` uses (samples × k).
///
/// With `aᵥ = wᵥ/√(2p(1−p))` and `x = (g − 2p)/√(2p(1−p))` (0 for a missing call), the
/// sum is `Σᵥ gᵥ·aᵥ − Σᵥ cᵥ·2p·aᵥ` with `g` a missing call's 0 and `c` 1 where there is a
/// call: one GEMM of the dosages converted as they are (a loop that vectorizes), and a
/// second one only for a block with missing calls. Measured on 20,000 × 20,000 genotypes,
/// k = 20, 2 cores: standardizing through a per-variant table first took 2.0 s, this 1.4 s.
/// Blocks hold at most 16 MiB of converted values: larger buffers are mapped afresh by
/// the allocator for every panel, and their page faults cost more than the arithmetic
/// (3.7 s with 50 MiB blocks).
fn panel_sums(
    source: &dyn GenotypeSource,
    weights: &Weights,
    entry: &[Option<(usize, f64)>],
    panel: Range<u64>,
    buffers: &mut Buffers,
) -> Result<Array2<f64>, Error> {
    let n = source.shape().1 as usize;
    let k = weights.k();
    let block = ((16 << 20) / (8 * n.max(1) as u64)).max(1);
    let rows = block.min(panel.end - panel.start) as usize;
    let mut total = Array2::<f64>::zeros((k, n));
    let Buffers { d, x, a, b } = buffers;
    for (buf, shape) in [
        (&mut *x, (rows, n)),
        (&mut *a, (rows, k)),
        (&mut *b, (rows, k)),
    ] {
        if buf.nrows() < shape.0 || buf.ncols() != shape.1 {
            *buf = Array2::zeros(shape);
        }
    }
    if d.nrows() < rows || d.ncols() != n {
        *d = Array2::zeros((rows, n));
    }
    let mut at = panel.start;
    while at < panel.end {
        let end = (at + block).min(panel.end);
        let used: Vec<(u64, usize, f64)> = (at..end)
            .filter_map(|v| entry[v as usize].map(|(e, s)| (v, e, s)))
            .collect();
        if !used.is_empty() {
            let h = (end - at) as usize;
            source.fill_dosages(at..end, d.slice_mut(s![..h, ..]))?;
            let mut missing = false;
            for (r, &(v, e, sign)) in used.iter().enumerate() {
                let row = d.row((v - at) as usize);
                let row = row.as_slice().expect("standard layout");
                // Folds over slices, not `find`/`any` over iterators: these vectorize.
                let (bad, absent) = row.iter().fold((false, false), |(bad, absent), &g| {
                    (bad | !(-1..=2).contains(&g), absent | (g < 0))
                });
                if bad {
                    let (j, g) = row
                        .iter()
                        .enumerate()
                        .find(|(_, g)| !(-1..=2).contains(*g))
                        .map_or((0, 0), |(j, &g)| (j, g));
                    return Err(Error::Parameter {
                        parameter: "source",
                        message: format!(
                            "{}: variant {v}, sample {j} has dosage {g}, not 0, 1, 2 or missing",
                            source.describe()
                        ),
                    });
                }
                missing |= absent;
                let mut out = x.row_mut(r);
                let out = out.as_slice_mut().expect("standard layout");
                for (o, &g) in out.iter_mut().zip(row) {
                    *o = g.max(0) as f64;
                }
                // The frequency of the allele the dosages count.
                let pc = if sign > 0.0 {
                    weights.freq[e]
                } else {
                    1.0 - weights.freq[e]
                };
                let var = 2.0 * pc * (1.0 - pc);
                let scale = if var > 0.0 { 1.0 / var.sqrt() } else { 0.0 };
                for j in 0..k {
                    a[[r, j]] = sign * weights.w[[e, j]] * scale;
                    b[[r, j]] = a[[r, j]] * 2.0 * pc;
                }
            }
            let u = used.len();
            ndarray::linalg::general_mat_mul(
                1.0,
                &a.slice(s![..u, ..]).t(),
                &x.slice(s![..u, ..]),
                1.0,
                &mut total,
            );
            if missing {
                // `c`: 1 where there is a call.
                for (r, &(v, _, _)) in used.iter().enumerate() {
                    let row = d.row((v - at) as usize);
                    let mut out = x.row_mut(r);
                    let out = out.as_slice_mut().expect("standard layout");
                    for (o, &g) in out.iter_mut().zip(row.as_slice().expect("standard layout")) {
                        *o = (g >= 0) as u8 as f64;
                    }
                }
                ndarray::linalg::general_mat_mul(
                    -1.0,
                    &b.slice(s![..u, ..]).t(),
                    &x.slice(s![..u, ..]),
                    1.0,
                    &mut total,
                );
            } else {
                for j in 0..k {
                    let c: f64 = b.slice(s![..u, j]).sum();
                    total.row_mut(j).mapv_inplace(|t| t - c);
                }
            }
        }
        at = end;
    }
    Ok(total.t().as_standard_layout().into_owned())
}

/// Where a distributed PCA's actors leave each panel's rows of `U`, frequencies and calls
/// ([`PcaParams::weights`](crate::PcaParams::weights)) until rank 0 writes the weight files
/// from them: a directory `PREFIX.tmp-TOKEN-parts` beside the files, one file per panel.
pub(crate) struct Parts {
    dir: PathBuf,
    prefix: PathBuf,
}

/// The extensions of the files [`Parts::finish`] writes.
const WEIGHT_FILES: [&str; 3] = ["eigenvec.var", "afreq", "eigenval"];

impl Parts {
    /// Refuses a prefix whose files exist (on every rank), and makes the directory.
    pub(crate) fn new(rt: &Runtime, prefix: &Path) -> Result<Parts, Error> {
        for ext in WEIGHT_FILES {
            let p = prefix.with_extension(ext);
            if p.exists() {
                return Err(Error::Parameter {
                    parameter: "weights",
                    message: format!("{} exists; rankwise never overwrites results", p.display()),
                });
            }
        }
        // One name on every rank: rank 0's process ID.
        let mut token = vec![std::process::id() as f64];
        rt.comm()
            .broadcast_f64(0, &mut token)
            .map_err(rankwise_linalg::LinalgError::from)?;
        let dir = prefix.with_extension(format!("tmp-{}-parts", token[0] as u64));
        let made = if rt.rank() == 0 {
            std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))
        } else {
            Ok(())
        };
        rt.comm()
            .barrier()
            .map_err(rankwise_linalg::LinalgError::from)?;
        made?;
        Ok(Parts {
            dir,
            prefix: prefix.to_path_buf(),
        })
    }

    fn part(&self, panel: usize) -> PathBuf {
        self.dir.join(format!("panel-{panel:09}"))
    }

    /// The factor sink: per row, its frequency, calls and `U` row as little-endian f64.
    pub(crate) fn sink(
        &self,
        g: Arc<dyn GenotypeSource>,
        filter: VariantFilter,
    ) -> rankwise_linalg::FactorSink {
        let dir = self.dir.clone();
        let part = move |panel: usize| dir.join(format!("panel-{panel:09}"));
        Arc::new(
            move |panel, rows: Range<u64>, u: ndarray::ArrayView2<'_, f64>| {
                let (freq, calls) = variant_frequencies(g.as_ref(), &filter, rows.clone())
                    .map_err(|e| e.to_string())?;
                let mut bytes = Vec::with_capacity(u.nrows() * (u.ncols() + 2) * 8);
                for (i, row) in u.rows().into_iter().enumerate() {
                    for x in [freq[i], calls[i]].into_iter().chain(row.iter().copied()) {
                        bytes.extend_from_slice(&x.to_le_bytes());
                    }
                }
                let path = part(panel);
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, &bytes)
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(|e| format!("{}: {e}", path.display()))
            },
        )
    }

    /// Removes the parts (after a failure).
    pub(crate) fn abandon(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// After the PCA: rank 0 writes the weight files from the parts (each under a
    /// temporary name, renamed when all are whole) and removes the parts; every rank learns
    /// whether it succeeded.
    pub(crate) fn finish(
        &self,
        rt: &Runtime,
        g: &dyn GenotypeSource,
        k: usize,
        chunk: u64,
        variants_used: u64,
        eigenvalues: &[f64],
    ) -> Result<(), Error> {
        let comm = rt.comm();
        comm.barrier().map_err(rankwise_linalg::LinalgError::from)?;
        let mut failure = None;
        let mut status = vec![0.0];
        if rt.rank() == 0 {
            let finals = WEIGHT_FILES.map(|e| self.prefix.with_extension(e));
            // Written inside the parts' directory, renamed out of it when all are whole.
            let temps = WEIGHT_FILES.map(|e| self.dir.join(format!("whole.{e}")));
            let written = (|| -> Result<(), Error> {
                let info = VariantInfo::of(g)?;
                write_weight_files(
                    &temps[0],
                    &temps[1],
                    &info,
                    k,
                    chunk,
                    variants_used,
                    |rows| {
                        let path = self.part((rows.start / chunk.max(1)) as usize);
                        let bytes = std::fs::read(&path).map_err(|e| io_error(&path, e))?;
                        let n = (rows.end - rows.start) as usize;
                        if bytes.len() != n * (k + 2) * 8 {
                            return Err(Error::File {
                                path,
                                message: format!("holds {} bytes, not {n} rows", bytes.len()),
                            });
                        }
                        let v: Vec<f64> = bytes
                            .chunks_exact(8)
                            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                            .collect();
                        let mut u = Array2::zeros((n, k));
                        let (mut freq, mut calls) = (Vec::with_capacity(n), Vec::with_capacity(n));
                        for (i, row) in v.chunks_exact(k + 2).enumerate() {
                            freq.push(row[0]);
                            calls.push(row[1]);
                            for j in 0..k {
                                u[[i, j]] = row[2 + j];
                            }
                        }
                        Ok(WeightRows { u, freq, calls })
                    },
                )?;
                crate::plink_files::write_eigenval(&temps[2], eigenvalues).map_err(|e| {
                    Error::File {
                        path: temps[2].clone(),
                        message: e.to_string(),
                    }
                })?;
                for (t, f) in temps.iter().zip(&finals) {
                    std::fs::rename(t, f).map_err(|e| io_error(f, e))?;
                }
                Ok(())
            })();
            if let Err(e) = written {
                for f in &finals {
                    // Only what this run renamed: the prefix was checked to have none.
                    let _ = std::fs::remove_file(f);
                }
                status[0] = 1.0;
                failure = Some(e);
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        comm.broadcast_f64(0, &mut status)
            .map_err(rankwise_linalg::LinalgError::from)?;
        match failure {
            Some(e) => Err(e),
            None if status[0] != 0.0 => Err(Error::Parameter {
                parameter: "weights",
                message: format!(
                    "rank 0 could not write the weight files at {}",
                    self.prefix.display()
                ),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rankwise-proj-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn files(dir: &Path, var: &str, afreq: &str, eigenval: &str) -> PathBuf {
        let prefix = dir.join("w");
        std::fs::write(dir.join("w.eigenvec.var"), var).unwrap();
        std::fs::write(dir.join("w.afreq"), afreq).unwrap();
        std::fs::write(dir.join("w.eigenval"), eigenval).unwrap();
        prefix
    }

    const VAR: &str = "#CHROM\tID\tMAJ\tNONMAJ\tPC1\tPC2\n1\ta\tG\tA\t1\t-1\n1\tb\tC\tT\t1\t1\n";
    const AFREQ: &str =
        "#CHROM\tID\tREF\tALT\tALT_FREQS\tOBS_CT\n1\ta\tG\tA\t0.25\t8\n1\tb\tT\tC\t0.75\t8\n";

    #[test]
    fn weights_take_the_weighted_alleles_frequency_and_the_pcs_scale() {
        let dir = scratch("read");
        let w = Weights::read(&files(&dir, VAR, AFREQ, "4\n1\n")).unwrap();
        assert_eq!((w.k(), w.variants()), (2, 2));
        // `b` weighs T, the .afreq's REF: its frequency is 1 − ALT_FREQS.
        assert_eq!(w.freq, vec![0.25, 0.25]);
        // ‖Wⱼ‖² = 2; λ = 4, 1.
        assert_eq!(w.scale, vec![1.0 / (2.0 * 2.0), 1.0 / 2.0]);
        // The names `rankwise pca --out RUN.zarr` gives are found from `RUN.zarr` too.
        assert!(Weights::read(&dir.join("w.zarr")).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn broken_weight_files_are_errors_naming_the_file_and_line() {
        let dir = scratch("broken");
        let cases = [
            (
                VAR.replace("\t1\t-1\n", "\tx\t-1\n"),
                AFREQ.to_owned(),
                "w.eigenvec.var",
                "line 2",
            ),
            (
                VAR.replace("PC1\tPC2", "X\tY"),
                AFREQ.to_owned(),
                "w.eigenvec.var",
                "no PC columns",
            ),
            (
                VAR.to_owned(),
                AFREQ.replace("0.25", "1.5"),
                "w.afreq",
                "line 2",
            ),
            (
                VAR.to_owned(),
                AFREQ.replace("\tT\tC\t", "\tG\tC\t"),
                "w.afreq",
                "weighs allele T",
            ),
            (
                VAR.to_owned(),
                AFREQ.lines().take(2).collect::<Vec<_>>().join("\n"),
                "w.afreq",
                "\"b\"",
            ),
            (
                VAR.replace("1\tb\t", "1\ta\t"),
                AFREQ.to_owned(),
                "w.eigenvec.var",
                "appears twice",
            ),
        ];
        for (var, afreq, file, what) in cases {
            let e = Weights::read(&files(&dir, &var, &afreq, "4\n1\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(file) && e.contains(what), "{e}");
        }
        let e = Weights::read(&files(&dir, VAR, AFREQ, "4\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("w.eigenval") && e.contains("1 eigenvalues for the 2 PCs"),
            "{e}"
        );
        // An eigenvalue that is not finite, or negative, scaled a PC to zeros in silence.
        for bad in ["NaN", "inf", "-inf", "-1", "1e999"] {
            let e = Weights::read(&files(&dir, VAR, AFREQ, &format!("{bad}\n1\n")))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("w.eigenval") && e.contains("is not an eigenvalue"),
                "{bad}: {e}"
            );
        }
        let e = Weights::read(&dir.join("none")).unwrap_err();
        assert!(matches!(e, Error::NotFound { .. }), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A missing allele (bio2zarr's empty string for a VCF's `.` ALT) and a name with
    /// blanks are written as one column each, `.` and `_`: the files read back.
    #[test]
    fn empty_and_blank_names_are_written_as_one_column() {
        assert_eq!(field(""), ".");
        assert_eq!(field("a b\tc"), "a_b_c");
        assert_eq!(field("rs1"), "rs1");
        let dir = scratch("fields");
        let var = VAR.replace("\tG\tA\t", &format!("\t{}\t{}\t", field("G"), field("")));
        let afreq = AFREQ.replace("\tG\tA\t", &format!("\t{}\t{}\t", field("G"), field("")));
        let w = Weights::read(&files(&dir, &var, &afreq, "4\n1\n")).unwrap();
        assert_eq!(w.allele[0], ".");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_weight_files_list_the_variants_that_entered_with_their_non_major_allele() {
        let dir = scratch("write");
        let info = VariantInfo {
            chromosomes: vec!["1".into(), "2".into(), "3".into()],
            ids: vec!["x".into(), "y".into(), "z".into()],
            counted: vec!["A".into(), "C".into(), "G".into()],
            other: vec!["G".into(), "T".into(), "A".into()],
        };
        let (var, afreq) = (dir.join("o.eigenvec.var"), dir.join("o.afreq"));
        let n = write_weight_files(&var, &afreq, &info, 1, 2, 4, |rows| {
            let all = [
                (0.5f64, 0.25f64, 10.0f64),
                (0.5, f64::NAN, 4.0),
                (-0.5, 0.75, 9.0),
            ];
            let part = &all[rows.start as usize..rows.end as usize];
            Ok(WeightRows {
                u: Array2::from_shape_fn((part.len(), 1), |(i, _)| part[i].0),
                freq: part.iter().map(|p| p.1).collect(),
                calls: part.iter().map(|p| p.2).collect(),
            })
        })
        .unwrap();
        assert_eq!(n, 2);
        // √M = 2; `z`'s counted allele is the major one: its weight is for A, negated.
        assert_eq!(
            std::fs::read_to_string(&var).unwrap(),
            "#CHROM\tID\tMAJ\tNONMAJ\tPC1\n1\tx\tG\tA\t1\n3\tz\tG\tA\t1\n"
        );
        assert_eq!(
            std::fs::read_to_string(&afreq).unwrap(),
            "#CHROM\tID\tREF\tALT\tALT_FREQS\tOBS_CT\n1\tx\tG\tA\t0.25\t20\n3\tz\tA\tG\t0.75\t18\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
