//! The C ABI of rankwise, for MPI codes that already hold their matrix.
//!
//! Every rank of a communicator holds a contiguous block of rows of a tall matrix, the
//! blocks in rank order (rank 0 the first rows). Each rank passes its block as a pointer,
//! a row count, a leading dimension and a layout, and the communicator as a Fortran
//! handle (`MPI_Comm_c2f`), so that no MPI C handle type is part of this ABI. The results
//! go into the caller's buffers: the singular values and `Vᵀ` on every rank, and on each
//! rank the rows of `U` that match its rows of the matrix.
//!
//! `rankwise_pca` computes the genotype PCA of a file the ranks read (a PLINK fileset, a
//! VCF Zarr store, a Zarr array of dosages), through the library's
//! [`rankwise::pca`]/[`rankwise::pca_to_group`]; its results come back as a handle.
//!
//! Every function returns a `rankwise_status` (0 on success) and never aborts the process
//! or unwinds into the caller: a failure leaves its message in `rankwise_last_error()`.
//!
//! # Panels
//!
//! The matrix is cut into row panels of `panel_rows` rows, exactly as `rankwise svd
//! --chunk-rows panel_rows` cuts it, and a panel never spans two ranks: the rows of every
//! rank but the last must be a multiple of `panel_rows`. With the same panel rows, the
//! results are bit-identical to the `rankwise` command line for any number of ranks.

mod args;
mod comm;
mod matrix;
mod pca;

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub use args::CapiError;
pub use pca::{rankwise_pca_options, rankwise_pca_result};

/// The Fortran handle of an MPI communicator (`MPI_Comm_c2f(comm)` in C, `comm%MPI_VAL`
/// or an `integer` communicator in Fortran). The header takes the type from `mpi.h`.
#[allow(non_camel_case_types)]
pub type MPI_Fint = std::os::raw::c_int;

/// What a call returned: `RANKWISE_OK` or one of the `RANKWISE_ERROR_…` codes below.
#[allow(non_camel_case_types)]
pub type rankwise_status = i32;
/// Success.
pub const RANKWISE_OK: rankwise_status = 0;
/// A required pointer argument was NULL.
pub const RANKWISE_ERROR_NULL_POINTER: rankwise_status = 1;
/// An argument is out of range: a negative size, a leading dimension smaller than the
/// rows (column-major) or columns (row-major), k too large, an unknown layout.
pub const RANKWISE_ERROR_INVALID_ARGUMENT: rankwise_status = 2;
/// MPI is not initialized, already finalized, or initialized below
/// `MPI_THREAD_FUNNELED`.
pub const RANKWISE_ERROR_MPI_NOT_READY: rankwise_status = 3;
/// The communicator handle is not a valid intra-communicator.
pub const RANKWISE_ERROR_INVALID_COMMUNICATOR: rankwise_status = 4;
/// The ranks disagree: different columns or options, or a rank's rows break the panel
/// rule (see `panel_rows`).
pub const RANKWISE_ERROR_INCONSISTENT: rankwise_status = 5;
/// Another rank of the communicator failed (its own call returned its own error).
pub const RANKWISE_ERROR_OTHER_RANK: rankwise_status = 6;
/// An MPI call failed.
pub const RANKWISE_ERROR_MPI: rankwise_status = 7;
/// The computation failed (e.g. not enough memory for the plan).
pub const RANKWISE_ERROR_COMPUTE: rankwise_status = 8;
/// An internal error of rankwise (a bug): the call was stopped before it could unwind
/// into the caller.
pub const RANKWISE_ERROR_INTERNAL: rankwise_status = 9;
/// The input of `rankwise_pca` could not be opened or read; the message names the file,
/// and the chunk where one is at fault.
pub const RANKWISE_ERROR_INPUT: rankwise_status = 10;
/// The results of `rankwise_pca` could not be published at `out`; none were left behind.
pub const RANKWISE_ERROR_OUTPUT: rankwise_status = 11;
/// `require_converged` was set and a component missed the tolerance; the message names
/// the components and their residuals.
pub const RANKWISE_ERROR_NOT_CONVERGED: rankwise_status = 12;

/// Memory layout of a matrix buffer.
#[allow(non_camel_case_types)]
pub type rankwise_layout = i32;
/// Column-major (Fortran, LAPACK): element (i, j) at `ptr[i + j·ld]`, `ld ≥ rows`.
pub const RANKWISE_COL_MAJOR: rankwise_layout = 0;
/// Row-major (C): element (i, j) at `ptr[i·ld + j]`, `ld ≥ cols`.
pub const RANKWISE_ROW_MAJOR: rankwise_layout = 1;

/// Distribution of the values of `rankwise_generate`.
#[allow(non_camel_case_types)]
pub type rankwise_dist = i32;
/// Uniform in [0, 1) (`rankwise … --dist uniform`).
pub const RANKWISE_DIST_UNIFORM: rankwise_dist = 0;
/// Standard normal (`rankwise … --dist normal`).
pub const RANKWISE_DIST_NORMAL: rankwise_dist = 1;

/// Sizes of the outputs of one rank's call, from `rankwise_tsqr_svd_query` or
/// `rankwise_rsvd_query`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rankwise_sizes {
    /// Singular values: `s` holds this many doubles (k).
    pub s_len: i64,
    /// Rows of this rank's block of U (its rows of the matrix).
    pub u_rows: i64,
    /// Columns of U (k).
    pub u_cols: i64,
    /// Rows of Vᵀ (k).
    pub vt_rows: i64,
    /// Columns of Vᵀ (the matrix's columns).
    pub vt_cols: i64,
    /// The smallest `ldu` for the layout asked about.
    pub min_ldu: i64,
    /// The smallest `ldvt` for the layout asked about.
    pub min_ldvt: i64,
    /// Workspace the caller must provide: always 0, rankwise allocates its own working
    /// memory (reported so that callers written for a workspace query need no change).
    pub workspace_bytes: i64,
}

/// Floating-point precision of `rankwise_gemm_peak`.
#[allow(non_camel_case_types)]
pub type rankwise_precision = i32;
/// Double precision (DGEMM).
pub const RANKWISE_F64: rankwise_precision = 0;
/// Single precision (SGEMM).
pub const RANKWISE_F32: rankwise_precision = 1;

/// One phase of this thread's last decomposition (`rankwise_last_phases`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct rankwise_phase {
    /// Its name, NUL-terminated, as `rankwise … --json` reports it (e.g. "pass 1: produce
    /// panels + panel QR").
    pub name: *const c_char,
    /// Wall seconds on this rank.
    pub seconds: f64,
    /// Floating-point operations of its matrix products over the whole matrix (all
    /// ranks); 0 for a phase whose work is not counted. `flops / seconds` against
    /// `rankwise_gemm_peak` is the phase's share of the GEMM rate.
    pub flops: f64,
    /// Bytes of matrix values this rank read into the kernels' blocks in the phase (8 a
    /// value); summed over the ranks and divided by `rankwise_production_peak` (the
    /// exact SVD's) or `rankwise_tile_production_peak` (a randomized SVD's), the rest of
    /// the phase's machine limit.
    pub produced_bytes: i64,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
    /// The phases of this thread's last decomposition and the names they point into.
    static LAST_PHASES: RefCell<(Vec<CString>, Vec<rankwise_phase>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Records the phases of a decomposition that succeeded (none: clears them).
fn set_last_phases(timings: &[rankwise::linalg::PhaseTiming]) {
    LAST_PHASES.with(|l| {
        let mut l = l.borrow_mut();
        let names: Vec<CString> = timings
            .iter()
            .map(|t| CString::new(t.phase.replace('\0', " ")).unwrap_or_default())
            .collect();
        // The CStrings' buffers stay where they are when the Vec holding them moves.
        let phases = timings
            .iter()
            .zip(&names)
            .map(|(t, name)| rankwise_phase {
                name: name.as_ptr(),
                seconds: t.seconds,
                flops: t.flops,
                produced_bytes: i64::try_from(t.produced_bytes).unwrap_or(i64::MAX),
            })
            .collect();
        *l = (names, phases);
    });
}

/// Records `e` as this thread's last error and returns its status code.
fn fail(e: CapiError) -> rankwise_status {
    let text = e.to_string().replace('\0', " ");
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::new(text).unwrap_or_default());
    e.status()
}

/// Runs `f`, turning its error or panic into a status code and this thread's message.
fn guarded(f: impl FnOnce() -> Result<(), CapiError>) -> rankwise_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            LAST_ERROR.with(|l| *l.borrow_mut() = CString::default());
            RANKWISE_OK
        }
        Ok(Err(e)) => fail(e),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(CapiError::Internal(what))
        }
    }
}

/// The message of the last failed call on this thread (an empty string after a call that
/// succeeded). The pointer stays valid until the next rankwise call on this thread.
#[no_mangle]
pub extern "C" fn rankwise_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// The version of the library, e.g. "0.1.0" (a static string).
#[no_mangle]
pub extern "C" fn rankwise_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// Output sizes of `rankwise_tsqr_svd` on a rank holding `rows_local` rows of a matrix of
/// `cols` columns, with `ldu`/`ldvt` minima for `layout`. Local: no communication.
#[no_mangle]
pub extern "C" fn rankwise_tsqr_svd_query(
    rows_local: i64,
    cols: i64,
    layout: rankwise_layout,
    sizes: *mut rankwise_sizes,
) -> rankwise_status {
    guarded(|| {
        let out = args::sizes(rows_local, cols, cols, layout)?;
        // SAFETY: checked non-null; the caller passes a writable rankwise_sizes.
        unsafe { *args::non_null_mut(sizes, "sizes")? = out };
        Ok(())
    })
}

/// Output sizes of `rankwise_rsvd` of rank `k` on a rank holding `rows_local` rows of a
/// matrix of `cols` columns, with `ldu`/`ldvt` minima for `layout`. Local: no
/// communication (k is checked against the global shape by `rankwise_rsvd`).
#[no_mangle]
pub extern "C" fn rankwise_rsvd_query(
    rows_local: i64,
    cols: i64,
    k: i64,
    layout: rankwise_layout,
    sizes: *mut rankwise_sizes,
) -> rankwise_status {
    guarded(|| {
        let out = args::sizes(rows_local, cols, k, layout)?;
        // SAFETY: checked non-null; the caller passes a writable rankwise_sizes.
        unsafe { *args::non_null_mut(sizes, "sizes")? = out };
        Ok(())
    })
}

/// The exact SVD `A = U·diag(S)·Vᵀ` of the tall matrix whose row blocks the ranks of
/// `comm` hold (TSQR over a fixed tree of panels). Collective: every rank of `comm` calls
/// it, with the same `cols` and `panel_rows`.
///
/// * `comm`: the communicator's Fortran handle (`MPI_Comm_c2f`). MPI must be initialized
///   with at least `MPI_THREAD_FUNNELED`, and this called on the thread that makes the
///   MPI calls. The handle must be valid on every rank or on none.
/// * `a`, `rows_local`, `lda`, `layout`: this rank's rows (`rows_local × cols`); rank r's
///   rows follow rank r−1's. `a` may be NULL when `rows_local` is 0. The global rows
///   (the sum over ranks) must be at least `cols`.
/// * `panel_rows`: rows per panel; the rows of every rank but the last must be a
///   multiple of it. 0 chooses it: the greatest common divisor of the row counts of all
///   ranks but the last, split further while a panel exceeds 8 MiB into panels no
///   shorter than `cols` where it can (where only the last rank holds rows, into equal
///   panels).
/// * `s`: `cols` singular values, descending, on every rank.
/// * `u_local`, `ldu`: this rank's `rows_local × cols` rows of U, in `layout` (NULL
///   allowed when `rows_local` is 0).
/// * `vt`, `ldvt`: `Vᵀ`, `cols × cols` in `layout`, on every rank.
///
/// OpenBLAS is set to one thread: rankwise's own threads supply the parallelism.
#[no_mangle]
pub extern "C" fn rankwise_tsqr_svd(
    comm: MPI_Fint,
    a: *const f64,
    rows_local: i64,
    cols: i64,
    lda: i64,
    layout: rankwise_layout,
    panel_rows: i64,
    s: *mut f64,
    u_local: *mut f64,
    ldu: i64,
    vt: *mut f64,
    ldvt: i64,
) -> rankwise_status {
    guarded(|| {
        let call = args::Call {
            a,
            rows_local,
            cols,
            lda,
            layout,
            panel_rows,
            s,
            u_local,
            ldu,
            vt,
            ldvt,
            method: args::Method::Exact,
        };
        comm::run(comm, &call)
    })
}

/// The rank-`k` randomized SVD (subspace iteration, Halko, Martinsson & Tropp 2011) of
/// the tall matrix whose row blocks the ranks of `comm` hold; the arguments are those of
/// `rankwise_tsqr_svd`, with:
///
/// * `k`: the rank, `1 ≤ k < min(global rows, cols)`; `s` holds k values, `u_local` is
///   `rows_local × k` and `vt` is `k × cols`.
/// * `oversample`: extra sketch columns, `k + oversample ≤ min(global rows, cols)`
///   (10 is usual).
/// * `power_iters`: power iterations (each is two more passes over the matrix; 2 is
///   usual).
/// * `seed`: seed of the Gaussian test matrix; the same seed gives the same bits as
///   `rankwise rsvd --sketch-seed seed --probes 0`.
///
/// A fixed number of iterations says nothing of how close the result is: for factors
/// whose accuracy is measured and reported, call `rankwise_rsvd_tol`.
#[no_mangle]
pub extern "C" fn rankwise_rsvd(
    comm: MPI_Fint,
    a: *const f64,
    rows_local: i64,
    cols: i64,
    lda: i64,
    layout: rankwise_layout,
    panel_rows: i64,
    k: i64,
    oversample: i64,
    power_iters: i64,
    seed: u64,
    s: *mut f64,
    u_local: *mut f64,
    ldu: i64,
    vt: *mut f64,
    ldvt: i64,
) -> rankwise_status {
    guarded(|| {
        let call = args::Call {
            a,
            rows_local,
            cols,
            lda,
            layout,
            panel_rows,
            s,
            u_local,
            ldu,
            vt,
            ldvt,
            method: args::Method::Randomized {
                k,
                oversample,
                power_iters,
                seed,
            },
        };
        comm::run(comm, &call)
    })
}

/// The rank-`k` randomized SVD iterated until every component has converged (LOBPCG on
/// `AᵀA`, as `rankwise rsvd` runs by default), with each component's residual. The
/// arguments are those of `rankwise_rsvd`, with:
///
/// * `tol`: a component has converged when its residual `‖Aᵀuᵢ − σᵢvᵢ‖₂ / σ₁` is at most
///   `tol`, `0 < tol < 1`; 0 selects the default, 1e-6.
/// * `max_passes`: the most passes over the matrix before the iteration stops
///   unconverged, at least 2; 0 selects the default, 100.
/// * `residuals`: `k` values, each component's residual, on every rank.
/// * `converged`: set to 1 when every residual is at most `tol`, else 0. An unconverged
///   result still returns `RANKWISE_OK` with the best factors reached: check it.
///
/// The same arguments give the same bits as `rankwise rsvd --method lobpcg --precision f64
/// --tol tol --max-passes max_passes --sketch-seed seed --probes 0`.
#[no_mangle]
pub extern "C" fn rankwise_rsvd_tol(
    comm: MPI_Fint,
    a: *const f64,
    rows_local: i64,
    cols: i64,
    lda: i64,
    layout: rankwise_layout,
    panel_rows: i64,
    k: i64,
    oversample: i64,
    tol: f64,
    max_passes: i64,
    seed: u64,
    s: *mut f64,
    u_local: *mut f64,
    ldu: i64,
    vt: *mut f64,
    ldvt: i64,
    residuals: *mut f64,
    converged: *mut i32,
) -> rankwise_status {
    guarded(|| {
        let call = args::Call {
            a,
            rows_local,
            cols,
            lda,
            layout,
            panel_rows,
            s,
            u_local,
            ldu,
            vt,
            ldvt,
            method: args::Method::ToTolerance {
                k,
                oversample,
                tol: if tol == 0.0 {
                    rankwise::linalg::DEFAULT_TOL
                } else {
                    tol
                },
                max_passes: if max_passes == 0 {
                    rankwise::linalg::DEFAULT_MAX_PASSES as i64
                } else {
                    max_passes
                },
                seed,
                residuals,
                converged,
            },
        };
        comm::run(comm, &call)
    })
}

/// The phases of this thread's last `rankwise_tsqr_svd`, `rankwise_rsvd` or
/// `rankwise_rsvd_tol` call: `*phases` points to `*count` entries, in the order they ran
/// (`*count` is 0 after a call that failed, or before any). Local. The entries and their
/// names stay valid until the next decomposition call on this thread.
#[no_mangle]
pub extern "C" fn rankwise_last_phases(
    phases: *mut *const rankwise_phase,
    count: *mut i64,
) -> rankwise_status {
    guarded(|| {
        let phases = args::non_null_mut(phases, "phases")?;
        let count = args::non_null_mut(count, "count")?;
        LAST_PHASES.with(|l| {
            let l = l.borrow();
            // SAFETY: both checked non-null; the caller passes writable locations.
            unsafe {
                *phases = l.1.as_ptr();
                *count = l.1.len() as i64;
            }
        });
        Ok(())
    })
}

/// The machine limit: the GEMM rate, in floating-point operations per second, of the
/// threads rankwise runs on every rank of `comm` (each rank's compute threads multiply
/// square matrices of order 1024 at once, the best of two runs each, with the BLAS kernels
/// this process loaded: `OPENBLAS_CORETYPE` chooses them, and `rankwise … --machine-limit`
/// also measures the others the CPU can run), summed over the ranks, into
/// `*flops_per_second` on every rank. Collective: every rank passes the same
/// `precision` (`RANKWISE_F64` or `RANKWISE_F32`). A phase's `flops / seconds` divided
/// by it is the phase's share of the limit, as `rankwise rsvd --machine-limit` prints.
/// Takes about a second.
#[no_mangle]
pub extern "C" fn rankwise_gemm_peak(
    comm: MPI_Fint,
    precision: rankwise_precision,
    flops_per_second: *mut f64,
) -> rankwise_status {
    guarded(|| {
        let out = args::non_null_mut(flops_per_second, "flops_per_second");
        // A NULL output still takes part in the agreement, so that no rank waits.
        let peak = comm::gemm_peak(comm, if out.is_ok() { precision } else { -1 }, None);
        let out = out?;
        // SAFETY: checked non-null; the caller passes a writable double.
        unsafe { *out = peak?.flops };
        Ok(())
    })
}

/// Answers `rankwise_machine_gemm_peak` when this process was started as its probe (the
/// variable `RANKWISE_GEMM_PROBE` set): measures the GEMM rate of the BLAS kernels this
/// process loaded, prints it on stdout and returns the status the process should exit
/// with (0, or 2 for a request it cannot read). Returns -1 in any other process. A program
/// that is its own probe calls it first in `main`, before `MPI_Init`.
#[no_mangle]
pub extern "C" fn rankwise_serve_gemm_probe() -> i32 {
    std::panic::catch_unwind(rankwise::linalg::serve_gemm_probe)
        .ok()
        .map_or(1, |s| s.unwrap_or(-1))
}

/// `rankwise_gemm_peak` with the best BLAS kernels the CPU runs: OpenBLAS chooses its
/// kernels once, when it is loaded (`OPENBLAS_CORETYPE`), so the others (its own choice,
/// Haswell's with AVX2, SkylakeX's with AVX-512) are each measured in a process started as
/// `probe`, a program that calls `rankwise_serve_gemm_probe` first (a NUL-terminated
/// path; NULL: this program again, `/proc/self/exe`). `*flops_per_second` is the best rate,
/// summed over the ranks; `*loaded_flops_per_second` (NULL: not wanted) that of the
/// kernels this process runs where the best are others, else 0. Where a probe process
/// fails on any rank, both are the loaded kernels' rate and 0. Collective, as
/// `rankwise_gemm_peak`; takes a few seconds.
///
/// # Safety
/// `probe` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rankwise_machine_gemm_peak(
    comm: MPI_Fint,
    precision: rankwise_precision,
    probe: *const std::os::raw::c_char,
    flops_per_second: *mut f64,
    loaded_flops_per_second: *mut f64,
) -> rankwise_status {
    guarded(|| {
        let out = args::non_null_mut(flops_per_second, "flops_per_second");
        let probe = if probe.is_null() {
            rankwise::linalg::GemmProbe::this_executable()
        } else {
            use std::os::unix::ffi::OsStrExt;
            // SAFETY: non-null and NUL-terminated, as documented.
            let path = unsafe { std::ffi::CStr::from_ptr(probe) };
            rankwise::linalg::GemmProbe::new(
                std::ffi::OsStr::from_bytes(path.to_bytes()),
                Vec::<std::ffi::OsString>::new(),
            )
        };
        // A NULL output still takes part in the agreement, so that no rank waits.
        let peak = comm::gemm_peak(comm, if out.is_ok() { precision } else { -1 }, Some(&probe));
        let out = out?;
        let peak = peak?;
        // SAFETY: checked non-null; the caller passes a writable double.
        unsafe { *out = peak.flops };
        if !loaded_flops_per_second.is_null() {
            // SAFETY: non-null; the caller passes a writable double.
            unsafe { *loaded_flops_per_second = peak.loaded_flops.unwrap_or(0.0) };
        }
        Ok(())
    })
}

/// The rest of the machine limit: the rate, in bytes per second (8 a value), at which the
/// threads rankwise runs on every rank of `comm` read the caller's matrix into the blocks
/// its kernels work on (each rank's compute threads read up to 4 Mi values of its own
/// rows at once, the best of two runs each), summed over the ranks, into
/// `*bytes_per_second` on every rank. Collective: each rank passes its own rows, as to
/// `rankwise_tsqr_svd` (`rows_local` may be 0). A phase's limit is its `flops` at
/// `rankwise_gemm_peak`'s rate plus its `produced_bytes`, summed over the ranks, at this
/// one, as `rankwise svd --machine-limit` prints. Takes well under a second.
#[no_mangle]
pub extern "C" fn rankwise_production_peak(
    comm: MPI_Fint,
    a: *const f64,
    rows_local: i64,
    cols: i64,
    lda: i64,
    layout: rankwise_layout,
    bytes_per_second: *mut f64,
) -> rankwise_status {
    let rows = args::RowsArg {
        a,
        rows_local,
        cols,
        lda,
        layout,
    };
    production_peak(comm, rows, comm::Produced::RowBlocks, bytes_per_second)
}

/// The body of both production probes: the rate into `*bytes_per_second`.
fn production_peak(
    comm: MPI_Fint,
    rows: args::RowsArg,
    produced: comm::Produced,
    bytes_per_second: *mut f64,
) -> rankwise_status {
    guarded(|| {
        let out = args::non_null_mut(bytes_per_second, "bytes_per_second");
        // A NULL output still takes part in the agreement, so that no rank waits.
        let bad = out.as_ref().err().map(|e| e.status());
        let peak = comm::production_peak(comm, &rows, produced, bad);
        let out = out?;
        // SAFETY: checked non-null; the caller passes a writable double.
        unsafe { *out = peak? };
        Ok(())
    })
}

/// As `rankwise_production_peak`, for a randomized SVD (`rankwise_rsvd`,
/// `rankwise_rsvd_tol`): the rate, in bytes per second (8 a value), at which the threads
/// rankwise runs on every rank of `comm` read the caller's matrix into the float64 tiles
/// its randomized passes multiply (each rank's compute threads read up to 4 Mi values of
/// its own rows at once, the best of two runs each), summed over the ranks, into
/// `*bytes_per_second` on every rank. The tiles are laid out for the sketch's products,
/// not as the exact SVD's row blocks, so the two rates differ. Collective; takes well
/// under a second.
#[no_mangle]
pub extern "C" fn rankwise_tile_production_peak(
    comm: MPI_Fint,
    a: *const f64,
    rows_local: i64,
    cols: i64,
    lda: i64,
    layout: rankwise_layout,
    bytes_per_second: *mut f64,
) -> rankwise_status {
    let rows = args::RowsArg {
        a,
        rows_local,
        cols,
        lda,
        layout,
    };
    production_peak(comm, rows, comm::Produced::Tiles, bytes_per_second)
}

/// Fills `out` (`rows × cols` in `layout`, leading dimension `ld`) with rows
/// `row0 .. row0 + rows` of the matrix that `rankwise … --seed seed --dist dist`
/// generates (any row count: the values depend only on the seed, row and column). Local,
/// no MPI: each rank fills its own block.
#[no_mangle]
pub extern "C" fn rankwise_generate(
    seed: u64,
    dist: rankwise_dist,
    row0: i64,
    rows: i64,
    cols: i64,
    out: *mut f64,
    ld: i64,
    layout: rankwise_layout,
) -> rankwise_status {
    guarded(|| matrix::generate(seed, dist, row0, rows, cols, out, ld, layout))
}

/// Fills `options` with the defaults of `rankwise pca`: 10 components, block Lanczos to a
/// tolerance of 1e-6 in at most 250 passes, seed 0, no filters, every sample and variant,
/// the stored panels, no files published. Local.
#[no_mangle]
pub extern "C" fn rankwise_pca_options_init(options: *mut rankwise_pca_options) -> rankwise_status {
    guarded(|| {
        let options = args::non_null_mut(options, "options")?;
        // SAFETY: checked non-null; the caller passes a writable rankwise_pca_options.
        unsafe { *options = rankwise_pca_options::default() };
        Ok(())
    })
}

/// The genotype PCA of `input`, as `rankwise pca` and `plink2 --pca` compute it: each
/// variant standardized by its allele frequency, missing calls mean-imputed, eigenvalues
/// of the genetic relationship matrix on PLINK 2's scale, every component iterated until
/// its residual meets `tol` (block Lanczos in f32 passes, LOBPCG in f64 if f32 stalls, the last
/// pass in f64). Collective: every
/// rank of `comm` calls it with the same arguments; the ranks read the variants' panels
/// where the placement puts them, so `input` must be reachable from every rank.
///
/// * `input`: a PLINK 1 fileset (`PREFIX`, `PREFIX.bed` or `bed:PREFIX`), a VCF Zarr store
///   (bio2zarr's layout) or a Zarr array of dosages (`PATH[:ARRAY]`), local or an
///   object-store URL, as `rankwise pca` takes it.
/// * `options`: NULL for the defaults (`rankwise_pca_options_init`).
/// * `result`: receives a handle to the results, the same on every rank; read it with
///   `rankwise_pca_sizes`, `rankwise_pca_get` and `rankwise_pca_sample_id`, and free it
///   with `rankwise_pca_free`. Set only on success.
///
/// An unconverged result is returned with `converged` 0 unless `require_converged` is
/// set. With `out`, the files are published all or nothing: a failure on any rank leaves
/// none behind. Errors: `RANKWISE_ERROR_INPUT` (the file, chunk and why),
/// `RANKWISE_ERROR_OUTPUT`, `RANKWISE_ERROR_NOT_CONVERGED`, `RANKWISE_ERROR_INVALID_ARGUMENT`
/// naming the option, and on the other ranks `RANKWISE_ERROR_OTHER_RANK` naming the rank
/// that failed and its message.
#[no_mangle]
pub extern "C" fn rankwise_pca(
    comm: MPI_Fint,
    input: *const c_char,
    options: *const rankwise_pca_options,
    result: *mut *mut rankwise_pca_result,
) -> rankwise_status {
    guarded(|| pca::pca(comm, input, options, result))
}

/// The sizes of a PCA's results: `samples` (the rows of the PCs), `k` (components) and
/// `variants_used` (after the selection and filters). Any output may be NULL. Local.
#[no_mangle]
pub extern "C" fn rankwise_pca_sizes(
    result: *const rankwise_pca_result,
    samples: *mut i64,
    k: *mut i64,
    variants_used: *mut i64,
) -> rankwise_status {
    guarded(|| pca::sizes(result, samples, k, variants_used))
}

/// Copies a PCA's results into the caller's buffers; any output may be NULL. Local.
///
/// * `eigenvalues`: `k` values, descending (PLINK 2's `.eigenval`).
/// * `pcs`, `ldpcs`, `layout`: the samples' PCs, `samples × k` in `layout`, unit columns
///   (PLINK 2's `.eigenvec`).
/// * `residuals`: `k` values, each component's residual against `tol`.
/// * `converged`: 1 when every component met `tol`, else 0.
#[no_mangle]
pub extern "C" fn rankwise_pca_get(
    result: *const rankwise_pca_result,
    eigenvalues: *mut f64,
    pcs: *mut f64,
    ldpcs: i64,
    layout: rankwise_layout,
    residuals: *mut f64,
    converged: *mut i32,
) -> rankwise_status {
    guarded(|| {
        pca::get(
            result,
            eigenvalues,
            pcs,
            ldpcs,
            layout,
            residuals,
            converged,
        )
    })
}

/// The ID of sample `i` (row `i` of the PCs): the `.fam`'s IID, or the store's
/// `sample_id`. NULL for an index out of range (with the message in
/// `rankwise_last_error()`). Valid until `rankwise_pca_free(result)`. Local.
#[no_mangle]
pub extern "C" fn rankwise_pca_sample_id(
    result: *const rankwise_pca_result,
    i: i64,
) -> *const c_char {
    let mut id = std::ptr::null();
    guarded(|| {
        id = pca::sample_id(result, i)?;
        Ok(())
    });
    id
}

/// Frees a result of `rankwise_pca` (NULL: nothing). Local.
#[no_mangle]
pub extern "C" fn rankwise_pca_free(result: *mut rankwise_pca_result) {
    pca::free(result);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: rankwise_last_error returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(rankwise_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn bad_arguments_return_codes_and_name_the_argument() {
        let mut s = [0.0; 4];
        let mut u = [0.0; 40];
        let mut vt = [0.0; 16];
        let a = [1.0; 40];
        let (sp, vtp) = (s.as_mut_ptr(), vt.as_mut_ptr());
        let call = |a: *const f64, rows: i64, cols: i64, lda: i64, layout, u: *mut f64| {
            rankwise_tsqr_svd(0, a, rows, cols, lda, layout, 0, sp, u, 10, vtp, 4)
        };
        let up = u.as_mut_ptr();
        let expect = |status: rankwise_status, want: rankwise_status, arg: &str| {
            assert_eq!(status, want, "{arg}: {}", last());
            assert!(last().contains(&format!("`{arg}`")), "{arg}: {}", last());
        };
        let (col, null) = (RANKWISE_COL_MAJOR, RANKWISE_ERROR_NULL_POINTER);
        let bad = RANKWISE_ERROR_INVALID_ARGUMENT;
        expect(call(std::ptr::null(), 10, 4, 10, col, up), null, "a");
        expect(call(a.as_ptr(), -1, 4, 10, col, up), bad, "rows_local");
        expect(call(a.as_ptr(), 10, 0, 10, col, up), bad, "cols");
        expect(call(a.as_ptr(), 10, 4, 9, col, up), bad, "lda");
        expect(call(a.as_ptr(), 10, 4, 10, 7, up), bad, "layout");
        expect(
            call(a.as_ptr(), 10, 4, 10, col, std::ptr::null_mut()),
            null,
            "u_local",
        );
        // Row-major: lda counts columns.
        expect(
            call(a.as_ptr(), 10, 4, 3, RANKWISE_ROW_MAJOR, up),
            bad,
            "lda",
        );
        // A leading dimension whose extent overflows the address space.
        expect(call(a.as_ptr(), 10, 4, i64::MAX / 2, col, up), bad, "lda");
    }

    #[test]
    fn rsvd_rejects_k_zero_and_sizes_follow_the_layout() {
        let mut sizes = rankwise_sizes::default();
        assert_eq!(
            rankwise_rsvd_query(100, 8, 3, RANKWISE_ROW_MAJOR, &mut sizes),
            0
        );
        assert_eq!(
            sizes,
            rankwise_sizes {
                s_len: 3,
                u_rows: 100,
                u_cols: 3,
                vt_rows: 3,
                vt_cols: 8,
                min_ldu: 3,
                min_ldvt: 8,
                workspace_bytes: 0,
            }
        );
        assert_eq!(
            rankwise_tsqr_svd_query(100, 8, RANKWISE_COL_MAJOR, &mut sizes),
            0
        );
        assert_eq!((sizes.min_ldu, sizes.min_ldvt, sizes.s_len), (100, 8, 8));
        assert_eq!(
            rankwise_rsvd_query(100, 8, 0, RANKWISE_COL_MAJOR, &mut sizes),
            RANKWISE_ERROR_INVALID_ARGUMENT
        );
        assert!(last().contains("`k`"), "{}", last());
        assert_eq!(
            rankwise_rsvd_query(100, 8, 9, RANKWISE_COL_MAJOR, &mut sizes),
            RANKWISE_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            rankwise_rsvd_query(100, 8, 2, RANKWISE_COL_MAJOR, std::ptr::null_mut()),
            RANKWISE_ERROR_NULL_POINTER
        );
        assert!(last().contains("`sizes`"), "{}", last());
    }

    #[test]
    fn without_mpi_a_valid_call_says_so() {
        let a = [1.0; 40];
        let (mut s, mut u, mut vt) = ([0.0; 4], [0.0; 40], [0.0; 16]);
        let status = rankwise_tsqr_svd(
            0,
            a.as_ptr(),
            10,
            4,
            10,
            RANKWISE_COL_MAJOR,
            0,
            s.as_mut_ptr(),
            u.as_mut_ptr(),
            10,
            vt.as_mut_ptr(),
            4,
        );
        assert_eq!(status, RANKWISE_ERROR_MPI_NOT_READY, "{}", last());
        assert!(last().contains("MPI"), "{}", last());
    }

    #[test]
    fn generate_matches_the_generator_in_both_layouts() {
        let g = rankwise::sources::Generated::new(100, 3, 42, rankwise::sources::Dist::Normal);
        let mut col = [0.0; 5 * 3];
        let mut row = [0.0; 4 * 4];
        assert_eq!(
            rankwise_generate(42, RANKWISE_DIST_NORMAL, 7, 5, 3, col.as_mut_ptr(), 5, 0),
            0
        );
        assert_eq!(
            rankwise_generate(42, RANKWISE_DIST_NORMAL, 7, 4, 3, row.as_mut_ptr(), 4, 1),
            0
        );
        for i in 0..4 {
            for j in 0..3 {
                let v = g.value(7 + i, j).to_bits();
                assert_eq!(col[i as usize + 5 * j as usize].to_bits(), v);
                assert_eq!(row[4 * i as usize + j as usize].to_bits(), v);
            }
        }
        assert_eq!(
            rankwise_generate(42, 5, 0, 1, 1, col.as_mut_ptr(), 1, 0),
            RANKWISE_ERROR_INVALID_ARGUMENT
        );
        assert!(last().contains("`dist`"), "{}", last());
    }
}
