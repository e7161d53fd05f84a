//! rankwise linear algebra: panel kernels, the distributed TSQR over a fixed tree of global
//! panel order, the exact tall-and-skinny SVD built on it, the randomized SVD, and a strided
//! sum over the same tree.

/// `f::<n>(args)` for the run-time `n` among the literals given (`f` a function in
/// scope; `f::<P>` gives `f::<P, n>`): the kernels' register-blocked widths are const
/// generics, chosen once per call.
macro_rules! by_const {
    ($n:expr, $f:ident::<$p:ident>, $args:tt, $($k:literal)*) => {
        match $n {
            $($k => $f::<$p, $k> $args,)*
            _ => unreachable!("widths are bounded by the callers"),
        }
    };
    ($n:expr, $f:ident, $args:tt, $($k:literal)*) => {
        match $n {
            $($k => $f::<$k> $args,)*
            _ => unreachable!("widths are bounded by the callers"),
        }
    };
}

pub mod fused;
pub mod gpu;
pub mod kernels;
pub mod reads;
pub mod reduce;
pub mod rsvd;
pub mod skinny;
pub mod svd;
#[cfg(test)]
mod testing;
pub mod tiles;
pub mod tree;
pub mod variants;

pub use kernels::{init_blas_threads, PanelFactor};
pub use reads::ReadTotals;
pub use reduce::{strided_sum, StridedSum, StridedSumResult};
pub use rsvd::{
    fused_condition_limit, rsvd, ErrorEstimate, GenotypeSummary, Method, Projection,
    ProjectionReport, RsvdOptions, RsvdPlan, RsvdProblem, RsvdResult,
};
pub use svd::{
    svd, CheckReport, FactorSink, PhaseTiming, SvdOptions, SvdPlan, SvdProblem, SvdResult,
};
pub use tiles::{Operand, Precision};
pub use tree::Tree;
pub use variants::{hwe_p, HweP, RowSelection, VariantFilter};

use rankwise_runtime::RuntimeError;
use rankwise_transports::TransportError;

/// [`LinalgError::NoVariants`]'s message: the filter's options first where they did it, as
/// other errors name the option at fault.
fn no_variants(variants: u64, filtered: u64, dropped: u64, filter: &VariantFilter) -> String {
    let what = format!(
        "no variants left to analyse: {filtered} of {variants} excluded, {dropped} dropped \
         (monomorphic or no calls)"
    );
    if filtered == 0 {
        what
    } else {
        format!("{}: {what}", filter.options())
    }
}

/// Errors of the linear algebra.
#[derive(Debug, thiserror::Error)]
pub enum LinalgError {
    /// LAPACK reported a failure.
    #[error("LAPACK: {0}")]
    Lapack(String),
    /// A runtime failure (options, budget, actors, sources).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A transport failure, including another rank's failure.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A chunk source failed while producing a panel.
    #[error("panel {panel} (rows {rows}): {message}")]
    Panel {
        /// Global panel index.
        panel: usize,
        /// Its rows, for the message.
        rows: String,
        /// What went wrong.
        message: String,
    },
    /// A genotype value outside {−1, 0, 1, 2}.
    #[error(
        "genotype value {value} at variant {variant}, sample {sample} of {what}: dosages \
         must be -1 (missing), 0, 1 or 2"
    )]
    Genotype {
        /// Variant (row), global.
        variant: u64,
        /// Sample (column).
        sample: u64,
        /// The value found.
        value: i8,
        /// The source, described.
        what: String,
    },
    /// The output sink refused a panel.
    #[error("writing panel {panel}: {message}")]
    Sink {
        /// Global panel index.
        panel: usize,
        /// What went wrong.
        message: String,
    },
    /// A genotype matrix none of whose variants is left to analyse: every one was excluded
    /// by the [`VariantFilter`] or dropped (monomorphic, or without calls).
    #[error("{}", no_variants(*variants, *filtered, *dropped, filter))]
    NoVariants {
        /// Variants in the matrix.
        variants: u64,
        /// Variants the filter excluded.
        filtered: u64,
        /// Variants dropped.
        dropped: u64,
        /// The filter.
        filter: VariantFilter,
    },
    /// An argument of the API.
    #[error("{option}: {message}")]
    Option {
        /// The option at fault.
        option: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A malformed matrix message.
    #[error("malformed matrix message from rank {peer}")]
    Message {
        /// Sender.
        peer: usize,
    },
    /// A GPU actor's device failed.
    #[error(transparent)]
    Gpu(rankwise_runtime::gpu::GpuError),
    /// A tree node that should have been present was not (an internal invariant).
    #[error("reduction tree: node {node} at level {level} missing")]
    Tree {
        /// Level.
        level: usize,
        /// Node index.
        node: usize,
    },
}
