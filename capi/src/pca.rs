//! `rankwise_pca`: the genotype PCA of a PLINK fileset, a VCF Zarr store or a Zarr array
//! of dosages, through the library's [`rankwise::pca`] and [`rankwise::pca_to_group`].
//! The result is an opaque handle that every rank holds alike, read with accessors.

use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;

use rankwise::genomics::{IdList, PcaParams, Selection, VariantFilter};
use rankwise::pca_group::PcaFiles;
use rankwise::{SolverChoice, Values};

use crate::args::{check_ld, invalid, CapiError, Layout};
use crate::comm::{agree, open_comm, runtime, Agreed};
use crate::matrix::view_mut;
use crate::*;

/// The options of `rankwise_pca`. Fill it with `rankwise_pca_options_init`, then set the
/// fields wanted: every rank must pass the same values.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rankwise_pca_options {
    /// Components (10).
    pub k: i64,
    /// A component has converged when its residual `‖Aᵀuᵢ − σᵢvᵢ‖₂ / σ₁` is at most `tol`
    /// (1e-6), as `rankwise pca --tol`.
    pub tol: f64,
    /// The most passes over the genotypes before the iteration stops unconverged (250).
    pub max_passes: i64,
    /// Seed of the starting block (0).
    pub seed: u64,
    /// Smallest minor allele frequency kept, PLINK's `--maf` (0: no filter).
    pub maf: f64,
    /// Largest fraction of missing calls kept, PLINK's `--geno` (1: no filter).
    pub geno: f64,
    /// Smallest Hardy–Weinberg exact-test p-value kept, PLINK's `--hwe` (0: no test).
    pub hwe: f64,
    /// PLINK's `--chr` list ("1-22,X"), or NULL for every chromosome.
    pub chromosomes: *const c_char,
    /// A file of the samples to keep, as PLINK's `--keep` reads it (FID and IID columns,
    /// or IIDs alone), or NULL for every sample.
    pub keep: *const c_char,
    /// A file of the variant IDs to keep, as PLINK's `--extract` reads it (a
    /// `.prune.in`), or NULL for every variant.
    pub extract: *const c_char,
    /// Variants per panel (0: the stored chunks, or panels of at most 128 MiB for a
    /// `.bed`), as `rankwise pca --chunk-rows`.
    pub panel_rows: i64,
    /// 1: fail with `RANKWISE_ERROR_NOT_CONVERGED`, and publish nothing, when a component
    /// misses `tol`; 0 (the default): return it, with `converged` 0.
    pub require_converged: i32,
    /// The Zarr format of `out`: 3 (the default) or 2.
    pub zarr_format: i32,
    /// Publish the results as `rankwise pca --out` does, or NULL for none: the Zarr group
    /// `out` in sgkit's layout, PLINK 2's `OUT.eigenvec` and `OUT.eigenval`, and
    /// `OUT.eigenvec.var` and `OUT.afreq` (what `rankwise project` and `plink2 --score`
    /// read), all or nothing. Existing results are never overwritten.
    pub out: *const c_char,
}

impl Default for rankwise_pca_options {
    fn default() -> Self {
        let solver = SolverChoice::default();
        rankwise_pca_options {
            k: solver.k as i64,
            tol: solver.tol,
            max_passes: solver.max_passes as i64,
            seed: solver.seed,
            maf: 0.0,
            geno: 1.0,
            hwe: 0.0,
            chromosomes: std::ptr::null(),
            keep: std::ptr::null(),
            extract: std::ptr::null(),
            panel_rows: 0,
            require_converged: 0,
            zarr_format: 3,
            out: std::ptr::null(),
        }
    }
}

/// A PCA's results, on every rank alike (`rankwise_pca`); freed by `rankwise_pca_free`.
#[allow(non_camel_case_types)]
pub struct rankwise_pca_result {
    pca: rankwise::genomics::Pca,
    /// The samples' IDs as C strings, in the order of the PCs' rows.
    ids: Vec<CString>,
}

/// A C string argument as UTF-8, or None for NULL.
fn text(p: *const c_char, arg: &'static str) -> Result<Option<String>, CapiError> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes NULL or a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| invalid(arg, "is not UTF-8"))
}

/// One rank's arguments, checked and read (the sample and variant files too): what it
/// can find wrong alone, before the ranks agree.
struct Checked {
    input: String,
    params: PcaParams,
    files: Option<PcaFiles>,
    /// The strings, for the agreement (compared by their hashes).
    strings: [Option<String>; 5],
    /// The options as passed (the defaults for NULL), for the agreement.
    options: rankwise_pca_options,
}

fn check(
    input: *const c_char,
    options: *const rankwise_pca_options,
    result: *mut *mut rankwise_pca_result,
) -> Result<Checked, CapiError> {
    args::non_null_mut(result, "result")?;
    let input = text(input, "input")?.ok_or(CapiError::NullPointer { arg: "input" })?;
    let o = if options.is_null() {
        rankwise_pca_options::default()
    } else {
        // SAFETY: the caller passes NULL or a filled rankwise_pca_options.
        unsafe { *options }
    };
    if o.k < 1 {
        return Err(invalid("k", format!("{}: at least one component", o.k)));
    }
    if !(o.tol > 0.0 && o.tol < 1.0) {
        return Err(invalid(
            "tol",
            format!("{}: the tolerance must be in (0, 1); 1e-6 is usual", o.tol),
        ));
    }
    if o.max_passes < 2 {
        return Err(invalid(
            "max_passes",
            format!(
                "{}: the PCA needs at least 2 passes; {} is the default",
                o.max_passes,
                rankwise::linalg::DEFAULT_MAX_PASSES
            ),
        ));
    }
    let within = |arg: &'static str, v: f64, hi: f64| {
        if (0.0..=hi).contains(&v) {
            Ok(())
        } else {
            Err(invalid(arg, format!("{v} is not in [0, {hi}]")))
        }
    };
    within("maf", o.maf, 0.5)?;
    within("geno", o.geno, 1.0)?;
    within("hwe", o.hwe, 1.0)?;
    args::check_size("panel_rows", o.panel_rows)?;
    let zarr_format = match o.zarr_format {
        3 => rankwise::output::group::ZarrFormat::V3,
        2 => rankwise::output::group::ZarrFormat::V2,
        other => return Err(invalid("zarr_format", format!("{other}: 2 or 3"))),
    };
    let chromosomes = text(o.chromosomes, "chromosomes")?;
    let keep = text(o.keep, "keep")?;
    let extract = text(o.extract, "extract")?;
    let out = text(o.out, "out")?;
    let read =
        |arg: &'static str, path: &str, f: fn(&std::path::Path) -> std::io::Result<IdList>| {
            f(std::path::Path::new(path)).map_err(|e| invalid(arg, format!("{path}: {e}")))
        };
    let selection = Selection {
        keep: keep
            .as_deref()
            .map(|p| read("keep", p, IdList::read_samples))
            .transpose()?,
        extract: extract
            .as_deref()
            .map(|p| read("extract", p, IdList::read_variants))
            .transpose()?,
        chromosomes: chromosomes.clone(),
        ..Selection::default()
    };
    let solver = SolverChoice {
        k: o.k as usize,
        tol: o.tol,
        max_passes: o.max_passes as usize,
        seed: o.seed,
        ..SolverChoice::default()
    };
    let params = PcaParams {
        solver: solver.options(Values::Genotypes).map_err(capi_error)?,
        filter: VariantFilter {
            min_maf: o.maf,
            max_missing: o.geno,
            min_hwe_p: o.hwe,
            ..VariantFilter::NONE
        },
        selection,
        panel_rows: (o.panel_rows > 0).then_some(o.panel_rows as u64),
        require_converged: o.require_converged != 0,
        ..PcaParams::default()
    };
    let files = out.as_ref().map(|out| {
        let mut files = PcaFiles::new(PathBuf::from(out));
        files.zarr_format = zarr_format;
        files
    });
    let agreed = [Some(input.clone()), chromosomes, keep, extract, out];
    Ok(Checked {
        input,
        params,
        files,
        strings: agreed,
        options: o,
    })
}

/// The names of the agreed values, as the header names them.
const AGREED: [&str; 15] = [
    "status",
    "input",
    "chromosomes",
    "keep",
    "extract",
    "out",
    "k",
    "tol",
    "max_passes",
    "seed",
    "maf",
    "geno",
    "hwe",
    "panel_rows",
    "require_converged",
];

/// FNV-1a of a string argument (NULL apart from every string): the ranks compare hashes.
fn hash(s: &Option<String>) -> i64 {
    let Some(s) = s else { return -1 };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 1) as i64
}

/// `rankwise_pca` on one rank.
pub(crate) fn pca(
    fint: MPI_Fint,
    input: *const c_char,
    options: *const rankwise_pca_options,
    result: *mut *mut rankwise_pca_result,
) -> Result<(), CapiError> {
    let (dup, local) = open_comm(fint, check(input, options, result))?;
    let status = local.as_ref().err().map_or(RANKWISE_OK, |e| e.status());
    // A rank whose options were refused still takes part, with the defaults' values.
    let o = local
        .as_ref()
        .map_or_else(|_| rankwise_pca_options::default(), |c| c.options);
    let mut mine = [0i64; AGREED.len()];
    mine[0] = status as i64;
    if let Ok(c) = &local {
        for (m, s) in mine[1..6].iter_mut().zip(&c.strings) {
            *m = hash(s);
        }
    }
    mine[6..].copy_from_slice(&[
        o.k,
        o.tol.to_bits() as i64,
        o.max_passes,
        o.seed as i64,
        o.maf.to_bits() as i64,
        o.geno.to_bits() as i64,
        o.hwe.to_bits() as i64,
        o.panel_rows,
        o.require_converged as i64,
    ]);
    let shown = |name: &str, v: i64| match name {
        "input" | "chromosomes" | "keep" | "extract" | "out" => None,
        "tol" | "maf" | "geno" | "hwe" => Some(f64::from_bits(v as u64).to_string()),
        _ => Some(v.to_string()),
    };
    let agreed = agree(
        &dup,
        Agreed {
            names: &AGREED,
            mine: &mine,
            shown: &shown,
        },
    );
    // This rank's own error first: it is the one the others report as `OtherRank`.
    let c = local?;
    agreed?;
    let rt = runtime(dup)?;
    let fail = |e: rankwise::Error| {
        let e = rankwise::fail_collectively(&rt, e);
        capi_error(e)
    };
    let input = rankwise::open(&c.input).map_err(fail)?;
    let pca = match c.files.clone() {
        Some(files) => rankwise::pca_to_group(&rt, &input, &c.params, files),
        None => rankwise::pca(&rt, &input, &c.params),
    }
    .map_err(fail)?;
    drop(rt);
    let ids = pca
        .sample_ids
        .iter()
        .map(|s| CString::new(s.replace('\0', " ")).unwrap_or_default())
        .collect();
    // SAFETY: checked non-null by `check`; the caller passes a writable pointer.
    unsafe { *result = Box::into_raw(Box::new(rankwise_pca_result { pca, ids })) };
    Ok(())
}

/// The library's error as this library's: a parameter keeps its name, the input's
/// failures are `Input`, a peer's is `OtherRank` with its message.
fn capi_error(e: rankwise::Error) -> CapiError {
    if let Some((rank, message)) = e.peer_failure() {
        return CapiError::Peer {
            rank,
            message: message.to_string(),
        };
    }
    if let Some(parameter) = e.parameter() {
        let message = match e {
            rankwise::Error::Parameter { message, .. } => message,
            other => other.to_string(),
        };
        // The library names its input `spec`; this header names it `input`.
        let parameter = if parameter == "spec" {
            "input"
        } else {
            parameter
        };
        return invalid(parameter, message);
    }
    match e {
        rankwise::Error::NotConverged(m) => CapiError::NotConverged(m),
        rankwise::Error::Output(o) => CapiError::Output(o.to_string()),
        e @ (rankwise::Error::Source(_)
        | rankwise::Error::File { .. }
        | rankwise::Error::NotFound { .. }) => CapiError::Input(e.to_string()),
        e if e.is_not_found() => CapiError::Input(e.to_string()),
        other => CapiError::Compute(other.to_string()),
    }
}

/// A checked result handle.
fn handle<'a>(r: *const rankwise_pca_result) -> Result<&'a rankwise_pca_result, CapiError> {
    if r.is_null() {
        return Err(CapiError::NullPointer { arg: "result" });
    }
    // SAFETY: the caller passes a handle from rankwise_pca, not yet freed.
    Ok(unsafe { &*r })
}

/// `rankwise_pca_sizes`.
pub(crate) fn sizes(
    r: *const rankwise_pca_result,
    samples: *mut i64,
    k: *mut i64,
    variants_used: *mut i64,
) -> Result<(), CapiError> {
    let r = handle(r)?;
    let (n, kk) = r.pca.pcs.dim();
    for (p, v) in [
        (samples, n as i64),
        (k, kk as i64),
        (variants_used, r.pca.variants_used as i64),
    ] {
        if !p.is_null() {
            // SAFETY: the caller passes NULL or a writable int64_t.
            unsafe { *p = v };
        }
    }
    Ok(())
}

/// `rankwise_pca_get`.
pub(crate) fn get(
    r: *const rankwise_pca_result,
    eigenvalues: *mut f64,
    pcs: *mut f64,
    ldpcs: i64,
    layout: rankwise_layout,
    residuals: *mut f64,
    converged: *mut i32,
) -> Result<(), CapiError> {
    let r = handle(r)?;
    let pca = &r.pca;
    let (n, k) = pca.pcs.dim();
    if !pcs.is_null() {
        let layout = Layout::parse(layout)?;
        check_ld("ldpcs", n as i64, k as i64, ldpcs, layout)?;
        // SAFETY: the caller's samples × k buffer (checked leading dimension).
        let mut view = unsafe { view_mut(pcs, n, k, ldpcs as usize, layout) };
        view.assign(&pca.pcs);
    }
    for (p, values) in [
        (eigenvalues, &pca.eigenvalues),
        (residuals, &pca.convergence.residuals),
    ] {
        if !p.is_null() {
            // SAFETY: the caller's buffer of k doubles.
            unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), p, values.len().min(k)) };
        }
    }
    if !converged.is_null() {
        // SAFETY: the caller passes NULL or a writable int32_t.
        unsafe { *converged = i32::from(pca.convergence.converged) };
    }
    Ok(())
}

/// `rankwise_pca_sample_id`: NULL for an index out of range.
pub(crate) fn sample_id(r: *const rankwise_pca_result, i: i64) -> Result<*const c_char, CapiError> {
    let r = handle(r)?;
    usize::try_from(i)
        .ok()
        .and_then(|i| r.ids.get(i))
        .map(|s| s.as_ptr())
        .ok_or_else(|| {
            invalid(
                "i",
                format!("{i} is not in 0..{} (the samples)", r.ids.len()),
            )
        })
}

/// `rankwise_pca_free`.
pub(crate) fn free(r: *mut rankwise_pca_result) {
    if !r.is_null() {
        // SAFETY: a handle from rankwise_pca (Box::into_raw), freed once: the caller's
        // promise.
        drop(unsafe { Box::from_raw(r) });
    }
}
