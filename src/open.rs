//! Opening an input by its specification: a PLINK 1 fileset, a VCF Zarr store or a Zarr
//! array, read where it lies.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rankwise_sources::{
    is_url, node_exists, split_spec, VcfZarr, ZarrArray, ZarrError, ZarrGenotypes, ZarrMatrix,
};
use rankwise_sources::{BedGenotypes, GenotypeSource, PanelSource};

use crate::Error;

/// What [`open`] found. Opening reads metadata only (array metadata, `.bim`/`.fam`); the
/// values are read by the actors that own them, panel by panel.
#[derive(Clone)]
pub enum Input {
    /// A PLINK 1 binary fileset (`PREFIX.bed`, `.bim`, `.fam`; variant-major).
    Bed(PathBuf),
    /// A VCF Zarr store (bio2zarr's layout: `call_genotype`, `call_genotype_mask`,
    /// `sample_id`, `variant_id`, `variant_contig`).
    VcfZarr(PathBuf),
    /// A 2-D Zarr array, `PATH` or `PATH:ARRAY` (an array inside a group).
    Zarr(String),
    /// A matrix the ranks hold in memory, row blocks in rank order
    /// ([`rows_in_place`](crate::memory::rows_in_place)).
    Rows {
        /// The matrix, this rank's rows readable.
        source: Arc<dyn PanelSource>,
        /// Rows of a panel.
        panel_rows: u64,
        /// Panels each rank holds, in rank order: panels stay where their rows are.
        rank_panels: Option<Vec<usize>>,
    },
    /// A genotype matrix held in memory
    /// ([`dosages_in_place`](crate::memory::dosages_in_place)), or any other source.
    Genotypes(Arc<dyn GenotypeSource>),
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Input::Bed(p) => f.debug_tuple("Bed").field(p).finish(),
            Input::VcfZarr(p) => f.debug_tuple("VcfZarr").field(p).finish(),
            Input::Zarr(s) => f.debug_tuple("Zarr").field(s).finish(),
            Input::Rows {
                source, panel_rows, ..
            } => f
                .debug_struct("Rows")
                .field("source", &source.describe())
                .field("panel_rows", panel_rows)
                .finish(),
            Input::Genotypes(g) => f.debug_tuple("Genotypes").field(&g.describe()).finish(),
        }
    }
}

/// Recognizes the input `spec` names:
///
/// * `bed:PREFIX`, `PREFIX.bed`, or a `PREFIX` beside which `PREFIX.bed` exists: a PLINK 1
///   fileset;
/// * `vcf-zarr:PATH`, or a Zarr group with a `call_genotype` array: a VCF Zarr store;
/// * `zarr:PATH[:ARRAY]`, or any other `PATH[:ARRAY]`: a Zarr array.
///
/// `PATH` may be an object-store URL (`s3://bucket/key`, `gs://bucket/key`,
/// `http(s)://host/path`; see [`rankwise_sources::RemoteOptions`]): a store there with a
/// `call_genotype` array is a VCF Zarr store, any other names a Zarr array.
///
/// Nothing is read but what tells them apart; [`Input::genotypes`] and [`Input::matrix`]
/// open the data.
pub fn open(spec: &str) -> Result<Input, Error> {
    if spec.trim().is_empty() {
        return Err(Error::Parameter {
            parameter: "spec",
            message: "no input named (a PLINK prefix, a VCF Zarr store or a Zarr array)".into(),
        });
    }
    if let Some(prefix) = spec.strip_prefix("bed:") {
        return Ok(Input::Bed(PathBuf::from(prefix)));
    }
    if let Some(path) = spec.strip_prefix("vcf-zarr:") {
        return Ok(Input::VcfZarr(PathBuf::from(path)));
    }
    if let Some(zarr) = spec.strip_prefix("zarr:") {
        return Ok(Input::Zarr(zarr.to_string()));
    }
    if is_url(spec) {
        // An object store: a VCF Zarr store by its `call_genotype`, else a Zarr array.
        let (store, array) = split_spec(spec);
        if array.is_empty() && node_exists(&store, "call_genotype")? {
            return Ok(Input::VcfZarr(store));
        }
        return Ok(Input::Zarr(spec.to_string()));
    }
    if let Some(prefix) = spec.strip_suffix(".bed") {
        return Ok(Input::Bed(PathBuf::from(prefix)));
    }
    let path = Path::new(spec);
    if path.with_extension("bed").is_file() && !path.is_dir() {
        return Ok(Input::Bed(path.to_path_buf()));
    }
    if path.join("call_genotype").is_dir() {
        return Ok(Input::VcfZarr(path.to_path_buf()));
    }
    Ok(Input::Zarr(spec.to_string()))
}

impl Input {
    /// The input as a genotype matrix (variants × samples, dosages 0–2, missing calls),
    /// with its sample IDs where it has them (a `.fam`, a VCF Zarr store's `sample_id`, or
    /// a `sample_id` array beside a Zarr dosage array).
    pub fn genotypes(&self) -> Result<Arc<dyn GenotypeSource>, Error> {
        Ok(match self {
            Input::Bed(prefix) => Arc::new(BedGenotypes::open(prefix)?),
            Input::VcfZarr(path) => Arc::new(VcfZarr::open(path)?),
            Input::Zarr(spec) => {
                let z = ZarrGenotypes::open(spec)?;
                let samples = GenotypeSource::shape(&z).1;
                Arc::new(match sibling_sample_ids(spec, samples)? {
                    Some(ids) => z.with_sample_ids(ids),
                    None => z,
                })
            }
            Input::Genotypes(g) => Arc::clone(g),
            Input::Rows { .. } => {
                return Err(Error::Parameter {
                    parameter: "spec",
                    message: "a matrix of numbers is not a genotype matrix: pass dosages".into(),
                })
            }
        })
    }

    /// The input as a matrix of numbers (a Zarr array of any numeric type); returns it and
    /// whether it was transposed so that panels run along its long dimension (a
    /// short-and-fat array is factored as its transpose: `U` and `V` swap).
    pub fn matrix(&self) -> Result<(Arc<dyn PanelSource>, bool), Error> {
        match self {
            Input::Zarr(spec) => {
                let z = ZarrMatrix::open(spec)?;
                let (rows, cols) = z.stored_shape();
                let transposed = rows < cols;
                Ok((
                    if transposed {
                        Arc::new(z.transposed())
                    } else {
                        Arc::new(z)
                    },
                    transposed,
                ))
            }
            Input::Rows { source, .. } => Ok((Arc::clone(source), false)),
            other => Err(Error::Parameter {
                parameter: "spec",
                message: format!(
                    "{other:?} holds genotypes: use `pca`, or name a Zarr array of numbers"
                ),
            }),
        }
    }
}

/// Sample identifiers for a dosage array inside a group: the group's 1-D string array
/// `sample_id` (variable-length or fixed-width strings), `None` where the group has none.
/// One that cannot be read, or whose length is not the samples', is an error naming it:
/// silently numbering the samples instead would mislabel every `.eigenvec` line.
pub(crate) fn sibling_sample_ids(spec: &str, samples: u64) -> Result<Option<Vec<String>>, Error> {
    let (path, array) = split_spec(spec);
    let Some(group) = Path::new(&array).parent() else {
        return Ok(None);
    };
    let group = group.to_string_lossy().into_owned();
    let name = if group.is_empty() {
        "sample_id".to_string()
    } else {
        format!("{group}/sample_id")
    };
    if !node_exists(&path, &name)? {
        return Ok(None);
    }
    let ids = ZarrArray::open_at(&path, &name)?.read_strings()?;
    if ids.len() as u64 != samples {
        return Err(Error::from(ZarrError::Unsupported {
            array: format!("{}:{name}", path.display()),
            message: format!(
                "has {} sample IDs, but the dosage array has {samples} samples",
                ids.len()
            ),
        }));
    }
    Ok(Some(ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_are_told_apart_by_prefix_suffix_and_contents() {
        let dir = std::env::temp_dir().join(format!("rankwise-open-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("vcf.zarr/call_genotype")).unwrap();
        std::fs::write(dir.join("cohort.bed"), b"").unwrap();
        let s = |p: &str| dir.join(p).to_string_lossy().into_owned();
        assert!(matches!(open(&s("cohort")).unwrap(), Input::Bed(p) if p == dir.join("cohort")));
        assert!(
            matches!(open(&s("cohort.bed")).unwrap(), Input::Bed(p) if p == dir.join("cohort"))
        );
        assert!(matches!(open("bed:x").unwrap(), Input::Bed(p) if p == Path::new("x")));
        assert!(matches!(open(&s("vcf.zarr")).unwrap(), Input::VcfZarr(_)));
        assert!(matches!(open("vcf-zarr:y").unwrap(), Input::VcfZarr(_)));
        assert!(matches!(open("a.zarr:g/x").unwrap(), Input::Zarr(z) if z == "a.zarr:g/x"));
        assert!(matches!(open("zarr:cohort").unwrap(), Input::Zarr(_)));
        assert_eq!(open(" ").unwrap_err().parameter(), Some("spec"));
        let genotypes_as_matrix = Input::Bed("x".into()).matrix().err().unwrap();
        assert_eq!(genotypes_as_matrix.parameter(), Some("spec"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
