//! `rankwise project`: new samples' PCs on the axes of an earlier PCA.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::{ArgGroup, Args};
use rankwise::genomics::plink_files::write_eigenvec;
use rankwise::genomics::projection::{project, Weights};
use rankwise::Input;
use rankwise_exec::Runtime;
use serde_json::json;

use super::{cli_error, CliError, RunArgs};

/// `rankwise project`.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("input").required(true).args(["bed", "vcf_zarr", "zarr"])))]
pub(super) struct ProjectArgs {
    /// The new samples: a PLINK 1 binary fileset (`PREFIX.bed`, `.bim`, `.fam`).
    #[arg(long, value_name = "PREFIX")]
    bed: Option<PathBuf>,
    /// The new samples: a VCF Zarr store (bio2zarr's layout).
    #[arg(long, value_name = "PATH")]
    vcf_zarr: Option<PathBuf>,
    /// The new samples: a Zarr array of dosages (variants × samples), matched to the PCA's
    /// variants by row (`v0`, `v1`, …).
    #[arg(long, value_name = "PATH[:ARRAY]")]
    zarr: Option<String>,
    /// The PCA: the `--out` of `rankwise pca` (its `RUN.eigenvec.var`, `RUN.afreq` and
    /// `RUN.eigenval`), or the `--out` of `plink2 --pca var-wts --freq`. Variants match by
    /// ID and allele, as `plink2 --score` matches them.
    #[arg(long, value_name = "RUN")]
    pca: PathBuf,
    /// Write the new samples' PCs to `OUT.eigenvec`, as PLINK 2's `.eigenvec`, on the
    /// scale of the PCA's own `.eigenvec`.
    #[arg(long)]
    out: PathBuf,
    /// Variants per panel (default: the stored chunks, or panels of at most 128 MiB of
    /// dosages for a `.bed`).
    #[arg(long)]
    chunk_rows: Option<u64>,
    #[command(flatten)]
    run: RunArgs,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

impl ProjectArgs {
    pub(super) fn run(&self) -> &RunArgs {
        &self.run
    }
}

pub(super) fn project_command(rt: &Runtime, a: &ProjectArgs) -> Result<Option<String>, CliError> {
    let start = Instant::now();
    // `OUT.eigenvec`, as plink2 names its outputs after `--out`.
    let with = |suffix: &str| {
        let mut p = a.out.as_os_str().to_owned();
        p.push(suffix);
        PathBuf::from(p)
    };
    let path = with(".eigenvec");
    if path.exists() {
        return Err(CliError::Option {
            option: "--out",
            message: format!(
                "{} exists; rankwise never overwrites results",
                path.display()
            ),
        });
    }
    let input = match (&a.bed, &a.vcf_zarr, &a.zarr) {
        (Some(p), _, _) => Input::Bed(p.clone()),
        (_, Some(p), _) => Input::VcfZarr(p.clone()),
        (_, _, Some(spec)) => Input::Zarr(spec.clone()),
        (None, None, None) => {
            return Err(CliError::Option {
                option: "--bed",
                message: "give --bed, --vcf-zarr or --zarr".into(),
            })
        }
    };
    let source = input.genotypes().map_err(cli_error)?;
    let describe = source.describe();
    let weights = Arc::new(Weights::read(&a.pca).map_err(cli_error)?);
    let p = project(rt, source, &weights, a.chunk_rows).map_err(cli_error)?;
    if rt.rank() != 0 {
        rt.comm().barrier()?;
        return Ok(None);
    }
    // Written under a temporary name and renamed when whole.
    let tmp = with(&format!(".tmp-{}.eigenvec", std::process::id()));
    rankwise::output::temporaries::register(&tmp);
    let written = write_eigenvec(&tmp, p.family_ids.as_deref(), &p.sample_ids, p.pcs.view())
        .map_err(|e| CliError::Option {
            option: "--out",
            message: e.to_string(),
        })
        .and_then(|()| {
            std::fs::rename(&tmp, &path).map_err(|e| CliError::File {
                path: path.clone(),
                message: format!("renaming {}: {e}", tmp.display()),
            })
        });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    rankwise::output::temporaries::committed();
    rt.comm().barrier()?;
    written?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Some(if a.json {
        serde_json::to_string_pretty(&json!({
            "command": "project",
            "source": describe,
            "pca": a.pca,
            "samples": p.sample_ids.len(),
            "k": p.pcs.ncols(),
            "weighted_variants": p.weighted,
            "matched": p.matched,
            "flipped": p.flipped,
            "absent": p.absent,
            "allele_mismatches": p.allele_mismatches,
            "unnamed": p.unnamed,
            "ranks": rt.comm().size(),
            "seconds": seconds,
            "eigenvec": path,
        }))
        .unwrap_or_default()
            + "\n"
    } else {
        format!(
            "rankwise project: {} samples of {describe} onto {} PCs of {}\n  {}\n  {} ranks, \
             {seconds:.3} s\noutput: {}\n",
            p.sample_ids.len(),
            p.pcs.ncols(),
            a.pca.display(),
            p.describe(),
            rt.comm().size(),
            path.display()
        )
    }))
}
