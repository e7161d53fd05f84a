//! rankwise linear algebra: panel kernels, the distributed TSQR over a fixed tree of global
//! panel order, the exact tall-and-skinny SVD built on it, the randomized SVD, and a strided
//! sum over the same tree.
//!
//! The API is the drivers ([`svd()`], [`rsvd()`], [`strided_sum()`], [`read_stored()`]),
//! their problems, options and results, and the pieces a layer above needs ([`Tree`] and
//! [`PartialSums`], [`VariantFilter`], [`row_counts`]). The kernels are private; the
//! `internals` feature lends a few of them to the kernel benchmarks and the device harness.
//!
//! # Layers (private modules)
//!
//! * The element types: `real::Real` is f64 and f32 as numbers (conversions, sums in f64);
//!   `blas::Blas` adds their GEMM; `tiles::TileReal` adds what tiles of them need (filled
//!   from sources, genotype codes standardized into them, multiplied by the fused kernels
//!   where those run, kept resident); `gpu::GpuReal` adds the device's.
//! * The kernels: `tiles` (a panel produced tile by tile into cache), `fused`, the panel
//!   factorizations (`kernels`, `cholqr`), and `tree` (the reduction tree and its typed
//!   sums).
//! * The drivers, each plan → passes → result: [`svd()`] (two passes over the panels and a
//!   TSQR) and [`rsvd()`] (a plan every rank checks alike, then LOBPCG's passes or the fixed
//!   passes of subspace iteration and block Krylov, then the result). Ranks exchange typed
//!   messages (a first pass's facts, the checks' sums) whose encodings the tree adds.
//! * The per-actor seam (`rsvd::backend`): the randomized passes ask each actor's backend
//!   (its CPU cores or its GPU) for a panel's range products and projections, and for its
//!   sketch's QR; the exact SVD's panel factorization is chosen per actor the same way. The
//!   drivers hold no device branch.

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

// The modules below hold the items `internals` re-exports: without that feature those
// items are unreachable (and a few unused), so the lints that say so are checked with the
// feature on, as the workspace's `--all-targets` builds (which the benchmarks join) have it.
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
mod blas;
mod cholqr;
pub mod device_decode;
mod finite;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
mod fused;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
mod gpu;
mod gpu_decoded;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
mod kernels;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
mod layout;
mod peak;
mod reads;
mod real;
mod reduce;
mod rows;
mod rsvd;
mod skinny;
mod svd;
#[cfg(test)]
mod testing;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub, dead_code))]
mod tiles;
mod tree;
mod variants;

pub use gpu::GpuPanelSeconds;
pub use gpu_decoded::DeviceDecodeReport;
pub use kernels::{
    blas_library, init_blas_threads, openblas_core, openblas_preferred_core, PanelFactor,
};
pub use peak::{
    gemm_peak, gemm_rate, machine_gemm_peak, production_peak, serve_gemm_probe,
    tile_production_peak, GemmProbe, MachineGemm, GEMM_PROBE_VAR,
};
pub use reads::{read_stored, ReadTotals, StoredRead, DEFAULT_SEGMENT_BYTES};
pub use reduce::{strided_sum, StridedSum, StridedSumResult};
pub use rows::{LocalRows, RowCollector};
pub use rsvd::{
    fused_condition_limit, rayleigh_ritz_seconds, rayleigh_ritz_threads, rsvd, Convergence,
    ErrorEstimate, GenotypeSummary, GpuKept, Method, Projection, ProjectionReport, RsvdOptions,
    RsvdPlan, RsvdProblem, RsvdResult, StepSeconds, DEFAULT_MAX_PASSES, DEFAULT_TOL, LANCZOS_BLOCK,
};
pub use svd::{
    svd, CheckReport, FactorSink, PhaseTiming, SvdOptions, SvdPlan, SvdProblem, SvdResult,
};
pub use tiles::{row_counts, Operand, Precision};
pub use tree::{PartialSums, Tree};
pub use variants::{hwe_p, HweP, RowSelection, VariantFilter};

/// The kernels below the API, for the kernel benchmarks (`benches/kernels.rs`), the
/// transport example and the device harness (`tests/gpu.rs`). Not a stable API: it is built
/// only with the `internals` feature.
#[cfg(feature = "internals")]
pub mod internals {
    /// The fused genotype-tile products.
    pub mod fused {
        pub use crate::fused::{ab, atb, atb_available, available, OmegaLayout};
    }
    /// Tiles produced into cache, and their GEMM.
    pub mod tiles {
        pub use crate::blas::gemm;
        pub use crate::layout::{PackedTile, TILE_COLS, TILE_ROWS};
        pub use crate::tiles::{pack_row, row_scale, Tile, TileReal};
    }
    /// The panel factorizations.
    pub mod kernels {
        pub use crate::kernels::{qr, stack_rows, Keep};
    }
    /// The device passes' building blocks.
    pub mod gpu {
        pub use crate::gpu::{panel_qr, produce_rows, DeviceSource};
    }
}

use rankwise_exec::RuntimeError;
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
    /// A source could not be read.
    #[error(transparent)]
    Source(#[from] rankwise_sources::SourceError),
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
    /// A value of the input that is NaN or infinite.
    #[error(
        "panel {panel}: the value at row {row}, column {col} is {value} ({location}); \
         rankwise needs finite values"
    )]
    NonFinite {
        /// Global panel index.
        panel: usize,
        /// Row (global) of the value.
        row: u64,
        /// Column of the value.
        col: u64,
        /// The value.
        value: f64,
        /// Where it is stored.
        location: String,
    },
    /// Finite input values whose products overflow the pass's floating-point type.
    #[error(
        "panel {panel}: the products of its values overflow {precision}: the largest, \
         {max:e} at row {row}, column {col} ({location}), {advice}"
    )]
    Overflow {
        /// Global panel index.
        panel: usize,
        /// `float64` or `float32`.
        precision: &'static str,
        /// The value of largest magnitude in the panel.
        max: f64,
        /// Its row (global).
        row: u64,
        /// Its column.
        col: u64,
        /// Where it is stored.
        location: String,
        /// Why, and what to do about it.
        advice: &'static str,
    },
    /// A matrix whose scale the randomized passes cannot square without underflow.
    #[error(
        "the matrix's values are too small for the randomized passes, which square their \
         scale: its products with the sketch reach only {scale:e} ({precision} squares \
         lose precision below about {floor}, and σ would come out as 0); multiply the data \
         by a power of ten, or use `svd`, which does not square it"
    )]
    Underflow {
        /// Σ over panels of the largest |y| of `A·Ω`.
        scale: f64,
        /// `float64` or `float32`.
        precision: &'static str,
        /// Below what scale its squares lose precision.
        floor: &'static str,
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
    /// A parameter with a bad value (named in backticks, as the runtime's errors name
    /// them).
    #[error("`{parameter}`: {message}")]
    Option {
        /// The parameter at fault, as the API names it (e.g. `power_iters`).
        parameter: &'static str,
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
    Gpu(rankwise_device::GpuError),
    /// A tree node that should have been present was not (an internal invariant).
    #[error("reduction tree: node {node} at level {level} missing")]
    Tree {
        /// Level.
        level: usize,
        /// Node index.
        node: usize,
    },
}
