//! Checks of the arguments a rank passes, before anything is communicated.

use crate::*;

/// Why a call failed; each variant has one status code.
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    /// A required pointer was NULL.
    #[error("`{arg}` is NULL")]
    NullPointer {
        /// The argument's name in the header.
        arg: &'static str,
    },
    /// An argument is out of range.
    #[error("`{arg}`: {message}")]
    InvalidArgument {
        /// The argument's name in the header.
        arg: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// MPI cannot be used from this call.
    #[error("{0}")]
    MpiNotReady(String),
    /// The communicator handle is not usable.
    #[error("`comm`: {0}")]
    InvalidCommunicator(String),
    /// The ranks passed arguments that do not fit together.
    #[error("`{arg}`: {message}")]
    Inconsistent {
        /// The argument's name in the header.
        arg: &'static str,
        /// What does not fit.
        message: String,
    },
    /// Another rank's call failed.
    #[error("rank {rank} of the communicator failed (status {status}); its own call reports why")]
    OtherRank {
        /// The first failing rank.
        rank: usize,
        /// Its status code.
        status: rankwise_status,
    },
    /// Another rank's computation failed after the call began.
    #[error("rank {rank} failed: {message}")]
    Peer {
        /// The rank that failed first.
        rank: usize,
        /// Its message.
        message: String,
    },
    /// The input could not be opened or read (the message names the file or chunk).
    #[error("{0}")]
    Input(String),
    /// The results could not be published.
    #[error("{0}")]
    Output(String),
    /// A component missed the tolerance and convergence was required.
    #[error("{0}")]
    NotConverged(String),
    /// An MPI call returned an error.
    #[error("{call} failed with MPI error {code}")]
    Mpi {
        /// The MPI function.
        call: &'static str,
        /// Its return code.
        code: i32,
    },
    /// The computation failed.
    #[error("{0}")]
    Compute(String),
    /// A bug of rankwise, stopped at the boundary.
    #[error("internal error: {0}")]
    Internal(String),
}

impl CapiError {
    /// The status code of this error.
    pub fn status(&self) -> rankwise_status {
        match self {
            CapiError::NullPointer { .. } => RANKWISE_ERROR_NULL_POINTER,
            CapiError::InvalidArgument { .. } => RANKWISE_ERROR_INVALID_ARGUMENT,
            CapiError::MpiNotReady(_) => RANKWISE_ERROR_MPI_NOT_READY,
            CapiError::InvalidCommunicator(_) => RANKWISE_ERROR_INVALID_COMMUNICATOR,
            CapiError::Inconsistent { .. } => RANKWISE_ERROR_INCONSISTENT,
            CapiError::OtherRank { .. } | CapiError::Peer { .. } => RANKWISE_ERROR_OTHER_RANK,
            CapiError::Input(_) => RANKWISE_ERROR_INPUT,
            CapiError::Output(_) => RANKWISE_ERROR_OUTPUT,
            CapiError::NotConverged(_) => RANKWISE_ERROR_NOT_CONVERGED,
            CapiError::Mpi { .. } => RANKWISE_ERROR_MPI,
            CapiError::Compute(_) => RANKWISE_ERROR_COMPUTE,
            CapiError::Internal(_) => RANKWISE_ERROR_INTERNAL,
        }
    }
}

pub(crate) fn invalid(arg: &'static str, message: impl Into<String>) -> CapiError {
    CapiError::InvalidArgument {
        arg,
        message: message.into(),
    }
}

/// `p` as a mutable reference target, or the NULL-pointer error naming `arg`.
pub(crate) fn non_null_mut<T>(p: *mut T, arg: &'static str) -> Result<*mut T, CapiError> {
    if p.is_null() {
        Err(CapiError::NullPointer { arg })
    } else {
        Ok(p)
    }
}

/// Which decomposition a call asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Method {
    /// The exact TSQR SVD.
    Exact,
    /// The randomized SVD.
    Randomized {
        k: i64,
        oversample: i64,
        power_iters: i64,
        seed: u64,
    },
    /// The randomized SVD iterated to a tolerance (LOBPCG), with its residuals.
    ToTolerance {
        k: i64,
        oversample: i64,
        tol: f64,
        max_passes: i64,
        seed: u64,
        /// `k` residuals out.
        residuals: *mut f64,
        /// 1 when every residual met `tol`, else 0.
        converged: *mut i32,
    },
}

/// One rank's arguments of `rankwise_tsqr_svd` or `rankwise_rsvd`.
pub(crate) struct Call {
    pub a: *const f64,
    pub rows_local: i64,
    pub cols: i64,
    pub lda: i64,
    pub layout: rankwise_layout,
    pub panel_rows: i64,
    pub s: *mut f64,
    pub u_local: *mut f64,
    pub ldu: i64,
    pub vt: *mut f64,
    pub ldvt: i64,
    pub method: Method,
}

/// A layout argument, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    ColMajor,
    RowMajor,
}

impl Layout {
    pub(crate) fn parse(layout: rankwise_layout) -> Result<Layout, CapiError> {
        match layout {
            RANKWISE_COL_MAJOR => Ok(Layout::ColMajor),
            RANKWISE_ROW_MAJOR => Ok(Layout::RowMajor),
            other => Err(invalid(
                "layout",
                format!("{other} is neither RANKWISE_COL_MAJOR (0) nor RANKWISE_ROW_MAJOR (1)"),
            )),
        }
    }

    /// The smallest leading dimension of a `rows × cols` matrix.
    pub(crate) fn min_ld(self, rows: i64, cols: i64) -> i64 {
        match self {
            Layout::ColMajor => rows.max(1),
            Layout::RowMajor => cols.max(1),
        }
    }

    /// Strides (row, column) in elements.
    pub(crate) fn strides(self, ld: usize) -> (usize, usize) {
        match self {
            Layout::ColMajor => (1, ld),
            Layout::RowMajor => (ld, 1),
        }
    }
}

/// Checks a `rows × cols` buffer argument: its leading dimension, and that its extent fits
/// the address space (so that pointer offsets cannot overflow).
pub(crate) fn check_ld(
    arg: &'static str,
    rows: i64,
    cols: i64,
    ld: i64,
    layout: Layout,
) -> Result<(), CapiError> {
    let min = layout.min_ld(rows, cols);
    if ld < min {
        return Err(invalid(
            arg,
            format!(
                "{ld} is smaller than the {} ({min}) of a {rows} × {cols} {} matrix",
                match layout {
                    Layout::ColMajor => "rows",
                    Layout::RowMajor => "columns",
                },
                match layout {
                    Layout::ColMajor => "column-major",
                    Layout::RowMajor => "row-major",
                }
            ),
        ));
    }
    let outer = match layout {
        Layout::ColMajor => cols,
        Layout::RowMajor => rows,
    };
    if ld
        .checked_mul(outer)
        .and_then(|n| n.checked_mul(8))
        .is_none_or(|b| b > isize::MAX as i64)
    {
        return Err(invalid(
            arg,
            format!(
                "a {rows} × {cols} matrix with leading dimension {ld} exceeds the address space"
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check_size(arg: &'static str, v: i64) -> Result<(), CapiError> {
    if v < 0 {
        return Err(invalid(arg, format!("{v} is negative")));
    }
    Ok(())
}

/// The output sizes of a call with `k` singular triplets.
pub(crate) fn sizes(
    rows_local: i64,
    cols: i64,
    k: i64,
    layout: rankwise_layout,
) -> Result<rankwise_sizes, CapiError> {
    check_size("rows_local", rows_local)?;
    if cols < 1 {
        return Err(invalid(
            "cols",
            format!("{cols}: the matrix needs a column"),
        ));
    }
    if k < 1 || k > cols {
        return Err(invalid(
            "k",
            format!("{k} is not in 1..={cols} (the columns)"),
        ));
    }
    let layout = Layout::parse(layout)?;
    Ok(rankwise_sizes {
        s_len: k,
        u_rows: rows_local,
        u_cols: k,
        vt_rows: k,
        vt_cols: cols,
        min_ldu: layout.min_ld(rows_local, k),
        min_ldvt: layout.min_ld(k, cols),
        workspace_bytes: 0,
    })
}

/// Checks the rank `k` and the oversampling of a randomized SVD of `cols` columns; returns k.
fn check_rank(k: i64, oversample: i64, cols: i64) -> Result<i64, CapiError> {
    if k < 1 {
        return Err(invalid("k", format!("{k}: the rank must be at least 1")));
    }
    if k >= cols {
        return Err(invalid(
            "k",
            format!(
                "k = {k} must be smaller than the columns ({cols}); rankwise_tsqr_svd \
                 computes the full decomposition"
            ),
        ));
    }
    check_size("oversample", oversample)?;
    if k.saturating_add(oversample) > cols {
        return Err(invalid(
            "oversample",
            format!(
                "k + oversample = {} exceeds the columns ({cols})",
                k.saturating_add(oversample)
            ),
        ));
    }
    Ok(k)
}

/// A caller's row block, as `rankwise_production_peak` takes it.
pub(crate) struct RowsArg {
    pub a: *const f64,
    pub rows_local: i64,
    pub cols: i64,
    pub lda: i64,
    pub layout: rankwise_layout,
}

impl RowsArg {
    /// Checks what one rank can check alone; returns the layout.
    pub(crate) fn check(&self) -> Result<Layout, CapiError> {
        check_size("rows_local", self.rows_local)?;
        if self.cols < 1 {
            return Err(invalid(
                "cols",
                format!("{}: the matrix needs a column", self.cols),
            ));
        }
        let layout = Layout::parse(self.layout)?;
        if self.rows_local > 0 && self.a.is_null() {
            return Err(CapiError::NullPointer { arg: "a" });
        }
        check_ld("lda", self.rows_local, self.cols, self.lda, layout)?;
        Ok(layout)
    }
}

/// Checks everything one rank can check alone; returns the layout and k (the columns of
/// the outputs).
pub(crate) fn check_local(c: &Call) -> Result<(Layout, i64), CapiError> {
    check_size("rows_local", c.rows_local)?;
    if c.cols < 1 {
        return Err(invalid(
            "cols",
            format!("{}: the matrix needs a column", c.cols),
        ));
    }
    check_size("panel_rows", c.panel_rows)?;
    let layout = Layout::parse(c.layout)?;
    let k = match c.method {
        Method::Exact => c.cols,
        Method::Randomized {
            k,
            oversample,
            power_iters,
            ..
        } => {
            let k = check_rank(k, oversample, c.cols)?;
            check_size("power_iters", power_iters)?;
            k
        }
        Method::ToTolerance {
            k,
            oversample,
            tol,
            max_passes,
            residuals,
            converged,
            ..
        } => {
            // NaN fails the comparison too.
            if !(tol > 0.0 && tol < 1.0) {
                return Err(invalid(
                    "tol",
                    format!(
                        "{tol}: the tolerance must be in (0, 1); {:e} is usual",
                        rankwise::linalg::DEFAULT_TOL
                    ),
                ));
            }
            if max_passes < 2 {
                return Err(invalid(
                    "max_passes",
                    format!(
                        "{max_passes}: LOBPCG needs at least 2 passes; {} is the default",
                        rankwise::linalg::DEFAULT_MAX_PASSES
                    ),
                ));
            }
            if residuals.is_null() {
                return Err(CapiError::NullPointer { arg: "residuals" });
            }
            if converged.is_null() {
                return Err(CapiError::NullPointer { arg: "converged" });
            }
            check_rank(k, oversample, c.cols)?
        }
    };
    if c.rows_local > 0 && c.a.is_null() {
        return Err(CapiError::NullPointer { arg: "a" });
    }
    check_ld("lda", c.rows_local, c.cols, c.lda, layout)?;
    if c.s.is_null() {
        return Err(CapiError::NullPointer { arg: "s" });
    }
    if c.rows_local > 0 && c.u_local.is_null() {
        return Err(CapiError::NullPointer { arg: "u_local" });
    }
    check_ld("ldu", c.rows_local, k, c.ldu, layout)?;
    if c.vt.is_null() {
        return Err(CapiError::NullPointer { arg: "vt" });
    }
    check_ld("ldvt", k, c.cols, c.ldvt, layout)?;
    Ok((layout, k))
}
