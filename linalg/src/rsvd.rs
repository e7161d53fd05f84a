//! The randomized SVD (Halko, Martinsson & Tropp 2011) and block Krylov iteration
//! (Musco & Musco 2015), over row panels that never leave their actor.
//!
//! # Passes
//!
//! 1. Range: `Y = A·[Ω | W]` panel by panel. `Ω` (`n × l`, `l = k + oversample`) and the
//!    error probes `W` (`n × r`) are Gaussian, generated from the seed by the counter-based
//!    generator, so every rank has them without a message. `Y` is orthonormalized by the
//!    distributed TSQR (`Q`, `m × l`, rows stay where they were formed); `A·W` is kept.
//! 2. Each power iteration: `B = QᵀA` (an `l × n` sum over panels, reduced over the fixed
//!    panel tree), `Z = orth(Bᵀ)` on the tree's root, broadcast, then `Y = A·Z`,
//!    orthonormalized again. Orthonormalizing at every half-step keeps the iteration stable
//!    on flat spectra. Block Krylov keeps every block `Q₀ … Q_q` and orthonormalizes
//!    their concatenation at the end.
//! 3. Last pass: `B = QᵀA`; the root computes `B = U_B Σ Vᵀ` and broadcasts it, and every
//!    actor forms its rows `U = Q·U_B` and the probe residuals `(A − UΣVᵀ)W`.
//!
//! # Fused projections
//!
//! `Q = Y·R⁻¹` for the TSQR's `R`, so `AᵀQ = (AᵀY)·R⁻¹`, and `AᵀY = Σ A_iᵀY_i` over row
//! blocks needs only row block `i` of `A` and of `Y`. Every range pass therefore sweeps each
//! row block's tiles twice ([`crate::tiles::Sweeps::Twice`]): the first sweep completes the
//! block's rows of `Y = A·Ω` (or `A·Z`), the second sums `A_iᵀY_i` while the block is still
//! in cache, and the pass that would compute `AᵀQ` is saved: `q + 1` reads of the matrix
//! instead of `2q + 2` (at `q = 0`, half the reads and decodes). The price is rounding:
//! `R⁻¹` multiplies the error of `AᵀY` by up to `cond(R) = cond(Y)`, so the root checks
//! `cond(R)` ([`fused_condition_limit`]) and, when it is over, every rank makes the separate
//! pass (the same decision everywhere: the root broadcasts it with the result). Yu et al.'s
//! single-pass PCA (IJCAI 2017) rests on the same identity (`AᵀY` summed in the pass that
//! forms `Y`). Unlike the single-pass sketches of Tropp et al. (2017), it gives the two-pass
//! algorithm's products, not approximations of them.
//!
//! Only `l × n` and `l × l` matrices travel. Every pass produces the panels again from the
//! source unless the memory plan keeps them resident (2-bit packed for genotypes). Sums over
//! panels follow the fixed tree of [`crate::tree`], so results are bit-identical for any
//! number of ranks and actors.
//!
//! # Error estimate
//!
//! With `E = A − UΣVᵀ` and `r` Gaussian probes `ω_i`, `E[‖Eω‖²] = ‖E‖_F²`, so
//! `(Σ‖Eω_i‖²/r)^½` estimates the Frobenius error, and by Halko et al. §4.3
//! `‖E‖₂ ≤ 10·√(2/π)·max‖Eω_i‖` except with probability `10⁻ʳ`.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ndarray::{s, Array2};
use rankwise_device::{NcclComm, NcclJoin};
use rankwise_exec::{ActorKind, ChunkGrid, MemoryPlan, Placement, Residency, Runtime, World};
use rankwise_sources::{Dist, Generated, GenotypeSource, PanelSource, StoredFrames};
use rankwise_transports::Comm;
use serde::Serialize;

use crate::gpu::{staging_host_bytes, DeviceSource, GpuReal};
use crate::kernels::{qr, small_svd, stack_rows, PanelFactor};
use crate::reads::{
    read_buffers, segment_rows, PassReads, ReadTotals, Reading, DEFAULT_SEGMENT_BYTES,
};
use crate::svd::{Clock, FactorSink, PhaseTiming};
use crate::tiles::{Operand, PanelFacts, Precision, Stored, TILE_COLS, TILE_ROWS};
use crate::tree::{decode, encode, PartialSums, Tree};
use crate::variants::VariantFilter;
use crate::LinalgError;
use ndarray_linalg::{Diag, SolveTriangular, UPLO};

mod backend;
mod lobpcg;
mod tall;

use backend::RangeJob;
pub use lobpcg::{rayleigh_ritz_seconds, StepSeconds, LANCZOS_BLOCK};
pub use tall::rayleigh_ritz_threads;

/// How the range is refined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// LOBPCG (Knyazev 2001) on `AᵀA`, iterated until every requested component meets
    /// [`RsvdOptions::tol`] or [`RsvdOptions::max_passes`] is spent; the result's
    /// [`Convergence`] says which. `power_iters` does not apply.
    Lobpcg,
    /// Thick-restart block Lanczos on `AᵀA` (blocks of 8 columns, a basis of at most
    /// `2l + 80`), iterated as [`Method::Lobpcg`] is: to [`RsvdOptions::tol`] or
    /// [`RsvdOptions::max_passes`]. Its passes are narrower, and a flat spectrum's components
    /// take fewer columns of products in all; see the module documentation of the solver.
    Lanczos,
    /// Subspace (power) iteration, re-orthonormalized at every half-step.
    SubspaceIteration,
    /// Block Krylov: the basis spans every block `(AAᵀ)^j AΩ`, `j = 0 … q`.
    BlockKrylov,
}

impl Method {
    /// Iterates until every component meets the tolerance ([`Method::Lobpcg`],
    /// [`Method::Lanczos`]), rather than for a fixed number of power iterations.
    pub fn iterates(self) -> bool {
        matches!(self, Method::Lobpcg | Method::Lanczos)
    }

    /// The method's name in summaries, phases and messages.
    pub fn name(self) -> &'static str {
        match self {
            Method::Lobpcg => "LOBPCG",
            Method::Lanczos => "block Lanczos",
            Method::SubspaceIteration => "subspace iteration",
            Method::BlockKrylov => "block Krylov",
        }
    }
}

/// Where the projections `AᵀQ` (of each power iteration, and `B = QᵀA` at the end) are
/// formed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Projection {
    /// In the range pass before, which also sums `W = YᵀA` over each row block once that
    /// block's rows of `Y = A·Ω` (or `A·Z`) are complete; after the TSQR `Y = QR`,
    /// `AᵀQ = Wᵀ·R⁻¹` on the root. One read of the matrix fewer per projection; each falls
    /// back to a pass of its own when `R` is too ill-conditioned for that (see
    /// [`fused_condition_limit`]). Block Krylov's last projection, of the whole basis,
    /// always has a pass of its own.
    Fused,
    /// In a pass of its own, as Halko et al.'s Algorithm 4.4 (randomized subspace
    /// iteration) is written.
    Separate,
}

/// Options of the randomized SVD.
#[derive(Clone, Debug, Serialize)]
pub struct RsvdOptions {
    /// Rank of the result.
    pub k: usize,
    /// Extra columns of the sketch (`l = k + oversample`).
    pub oversample: usize,
    /// Power iterations `q` (each costs one pass over the matrix with fused projections,
    /// two without).
    pub power_iters: usize,
    /// Subspace iteration or block Krylov.
    pub method: Method,
    /// Seed of `Ω` and of the error probes.
    pub seed: u64,
    /// Gaussian probes of the error estimate (0: no estimate). The default, 4, makes the
    /// first pass's product `k + p + 4` columns wide: 24 with the default sketch, a whole
    /// number of the 8-wide SIMD blocks of the BLAS kernels (25 runs ~8% slower per tile).
    pub probes: usize,
    /// Precision of the tiles and their GEMMs.
    pub precision: Precision,
    /// Decoded bytes per read-ahead segment, where a stored band is read in parts (rows in
    /// multiples of the tiles' near this size; [`DEFAULT_SEGMENT_BYTES`] by default).
    pub segment_bytes: u64,
    /// Where the projections `AᵀQ` are formed.
    pub projection: Projection,
    /// Convergence tolerance: component `i` has converged when its residual
    /// `‖Aᵀuᵢ − σᵢvᵢ‖₂ / σ₁` is at most this ([`Convergence::residuals`]). The iterative
    /// methods ([`Method::iterates`]) go on until every one of the `k` has; the
    /// fixed-iteration methods only report it.
    pub tol: f64,
    /// Most passes over the matrix the iterative methods make, the pass that forms `U` and
    /// measures the returned components included. At least 2.
    pub max_passes: usize,
    /// The iterative methods only: start in f32 tiles and move to f64 when f32 stops
    /// improving the residuals (or, at the end, f64 says they are not met); the pass that
    /// measures the returned components is always f64. `precision` is then ignored.
    pub mixed_precision: bool,
}

/// The default [`RsvdOptions::tol`]: on structured genotype matrices (a few strong
/// components over a Marchenko–Pastur bulk whose top eigenvalues are within 0.1 % of each
/// other) every component then matches the exact PCA to |corr| ≥ 0.9999 and its
/// eigenvalue to 1e-6 relative; see the module documentation for the measurements.
pub const DEFAULT_TOL: f64 = 1e-6;

/// The most power iterations (and LOBPCG passes) a run may ask for: every run ends.
pub(crate) const MAX_POWER_ITERS: usize = 10_000;

/// The default [`RsvdOptions::max_passes`]. Block Lanczos's narrower passes are more:
/// a k = 20 PCA of the 200,000 × 20,000 `.bed` of the PLINK 2 comparison took 124 (LOBPCG
/// 70), and stopped unconverged at 100.
pub const DEFAULT_MAX_PASSES: usize = 250;

impl Default for RsvdOptions {
    fn default() -> Self {
        RsvdOptions {
            k: 10,
            oversample: 10,
            power_iters: 2,
            method: Method::Lobpcg,
            seed: 0,
            probes: 4,
            precision: Precision::F64,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            projection: Projection::Fused,
            tol: DEFAULT_TOL,
            max_passes: DEFAULT_MAX_PASSES,
            mixed_precision: false,
        }
    }
}

impl RsvdOptions {
    /// Columns of the sketch, `l = k + oversample`.
    pub fn sketch(&self) -> usize {
        // Saturating: `validate` refuses what does not fit, and must get there to say so.
        self.k.saturating_add(self.oversample)
    }

    /// Columns of the final basis: `l`, or `(q + 1)·l` for block Krylov.
    pub fn basis(&self) -> usize {
        match self.method {
            Method::SubspaceIteration | Method::Lobpcg | Method::Lanczos => self.sketch(),
            Method::BlockKrylov => self
                .sketch()
                .saturating_mul(self.power_iters.saturating_add(1)),
        }
    }

    /// Passes over the matrix: `2q + 2` with separate projections, `q + 1` with every
    /// projection fused (`q + 2` for block Krylov with power iterations), one more for each
    /// fused projection that is not.
    pub fn passes(&self) -> usize {
        let q = self.power_iters;
        if self.method.iterates() {
            return self.max_passes;
        }
        // The last pass measures the returned components' residuals.
        let q = q.min(MAX_POWER_ITERS);
        1 + match self.projection {
            Projection::Separate => 2 + 2 * q,
            Projection::Fused => 1 + q + usize::from(self.method == Method::BlockKrylov && q > 0),
        }
    }

    /// Checks the options against an `m × n` matrix.
    pub fn validate(&self, m: u64, n: u64) -> Result<(), LinalgError> {
        let mn = m.min(n);
        let opt = |parameter, message| Err(LinalgError::Option { parameter, message });
        if self.k == 0 {
            return opt("k", "the rank must be at least 1".into());
        }
        if !self.method.iterates() && self.power_iters > MAX_POWER_ITERS {
            return opt(
                "power_iters",
                format!(
                    "{} power iterations: at most {MAX_POWER_ITERS} (to iterate until \
                     converged, leave it out)",
                    self.power_iters
                ),
            );
        }
        if self.method.iterates() && self.max_passes > MAX_POWER_ITERS {
            return opt(
                "max_passes",
                format!("{}: at most {MAX_POWER_ITERS}", self.max_passes),
            );
        }
        // The probes are `n` values each, generated on every rank.
        if self.probes as u64 > n.max(1000) {
            return opt(
                "probes",
                format!(
                    "{} probes: at most max(columns, 1000) = {}",
                    self.probes,
                    n.max(1000)
                ),
            );
        }
        if self.k as u64 >= mn {
            return opt(
                "k",
                format!(
                    "k = {} must be smaller than min(rows, cols) = {mn}; `rankwise svd` computes \
                     the full decomposition",
                    self.k
                ),
            );
        }
        if self.sketch() as u64 > mn {
            return opt(
                "oversample",
                format!(
                    "k + oversample = {} + {} = {} exceeds min(rows, cols) = {mn}; use at most \
                     `oversample` {}",
                    self.k,
                    self.oversample,
                    self.sketch(),
                    mn - self.k as u64
                ),
            );
        }
        if self.method.iterates() {
            if !(self.tol.is_finite() && self.tol > 0.0 && self.tol < 1.0) {
                return opt("tol", format!("{} is not a tolerance in (0, 1)", self.tol));
            }
            if self.max_passes < 2 {
                return opt(
                    "max_passes",
                    format!(
                        "{}: the iteration needs at least 2 passes (one to iterate, one to \
                         form U and measure the residuals)",
                        self.max_passes
                    ),
                );
            }
        }
        if self.basis() as u64 > mn {
            return opt(
                "power_iters",
                format!(
                    "block Krylov with {} power iterations builds a basis of (q + 1)(k + \
                     oversample) = {} columns, more than min(rows, cols) = {mn}; lower \
                     `power_iters` or `oversample`",
                    self.power_iters,
                    self.basis()
                ),
            );
        }
        Ok(())
    }
}

/// The matrix of a randomized SVD or PCA.
#[derive(Clone)]
pub struct RsvdProblem {
    /// Where the values come from; its shape is the matrix the algorithm sees.
    pub operand: Operand,
    /// Row panels of the operand.
    pub grid: ChunkGrid,
    /// True when the operand is the transpose of the user's matrix.
    pub transposed: bool,
    /// Panels each rank owns, in rank order, when the panels must stay where they are (see
    /// [`crate::svd::SvdProblem::rank_panels`]); `None` places them by weight.
    pub rank_panels: Option<Vec<usize>>,
}

impl RsvdProblem {
    /// A generated float matrix; short-and-fat ones go through the transpose, so panels run
    /// along the long dimension.
    pub fn generated(
        rows: u64,
        cols: u64,
        chunk_rows: u64,
        seed: u64,
        dist: Dist,
    ) -> Result<RsvdProblem, LinalgError> {
        let p = crate::svd::SvdProblem::generated(rows, cols, chunk_rows, seed, dist)?;
        Ok(RsvdProblem {
            operand: Operand::Dense(p.source),
            grid: p.grid,
            transposed: p.transposed,
            rank_panels: None,
        })
    }

    /// A float matrix from any panel source, panels of `chunk_rows` rows.
    pub fn dense(
        source: Arc<dyn PanelSource>,
        chunk_rows: u64,
    ) -> Result<RsvdProblem, LinalgError> {
        let (m, n) = source.shape();
        Ok(RsvdProblem {
            grid: ChunkGrid::new(m, n, chunk_rows)?,
            operand: Operand::Dense(source),
            transposed: false,
            rank_panels: None,
        })
    }

    /// A genotype matrix (variants × samples), standardized per variant; panels of
    /// `chunk_rows` variants.
    pub fn genotypes(
        source: Arc<dyn GenotypeSource>,
        chunk_rows: u64,
    ) -> Result<RsvdProblem, LinalgError> {
        let (m, n) = source.shape();
        Ok(RsvdProblem {
            grid: ChunkGrid::new(m, n, chunk_rows)?,
            operand: Operand::Genotypes(source, VariantFilter::NONE),
            transposed: false,
            rank_panels: None,
        })
    }

    /// The same problem with the variants `filter` excludes zero (a genotype matrix; a
    /// float matrix has no variants and is returned unchanged).
    pub fn with_variant_filter(mut self, filter: VariantFilter) -> RsvdProblem {
        if let Operand::Genotypes(_, f) = &mut self.operand {
            *f = filter;
        }
        self
    }
}

/// What the plan decided, before any work.
#[derive(Clone, Debug, Serialize)]
pub struct RsvdPlan {
    /// The grid.
    pub grid: ChunkGrid,
    /// Rank count.
    pub ranks: usize,
    /// Which actor owns which panels.
    pub placement: Placement,
    /// Memory decision of every actor, in placement order.
    pub memory: Vec<MemoryPlan>,
    /// Sketch columns `l`.
    pub sketch: usize,
    /// Final basis columns.
    pub basis: usize,
    /// Passes over the matrix when every projection it plans to fuse is fused
    /// ([`RsvdResult::passes`] has those made).
    pub passes: usize,
    /// Whether projections are fused into the range passes ([`Projection::Fused`]).
    pub fused: bool,
    /// f64 values of one `B` reduction message.
    pub words_b: usize,
}

impl RsvdPlan {
    /// The first panel `rank` holds, with its rows; `None` when it holds none.
    pub fn first_panel(&self, rank: usize) -> Option<(usize, Range<u64>)> {
        (self.placement.assignments.iter())
            .filter(|a| a.rank == rank && !a.panels.is_empty())
            .map(|a| a.panels.start)
            .min()
            .map(|p| (p, self.grid.panel_rows(p)))
    }

    /// Validates the options and plans the grid over the world. Pure: every rank computes
    /// the same plan.
    pub fn new(
        problem: &RsvdProblem,
        options: &RsvdOptions,
        world: &World,
    ) -> Result<RsvdPlan, LinalgError> {
        let (m, n) = problem.operand.shape();
        if (m, n) != (problem.grid.rows, problem.grid.cols) {
            return Err(LinalgError::Option {
                parameter: "grid",
                message: format!(
                    "grid {}×{} does not match the source's {m}×{n}",
                    problem.grid.rows, problem.grid.cols
                ),
            });
        }
        options.validate(m, n)?;
        let grid = problem.grid;
        let placement = match &problem.rank_panels {
            Some(counts) => Placement::by_rank(grid.panels(), counts, world)?,
            None => Placement::compute(grid.panels(), world),
        };
        let (l, basis, r) = (options.sketch(), options.basis(), options.probes);
        let nn = n as usize;
        let chunk = grid.chunk_rows.min(grid.rows) as usize;
        let codes = match problem.operand {
            Operand::Genotypes(..) => TILE_ROWS * nn,
            Operand::Dense(_) => 0,
        };
        // Per thread: a tile, a row block of dosages, one panel's B, its sketch before
        // the TSQR and the TSQR's Q.
        let per_thread = ((TILE_ROWS * TILE_COLS
            + basis * nn
            + chunk * (l + r)
            + 2 * chunk * basis)
            * 8
            + codes) as u64;
        let reads = problem
            .operand
            .stored()
            .map(|s| {
                read_buffers(
                    s,
                    &grid,
                    &problem.operand.describe(),
                    Some(options.segment_bytes),
                )
            })
            .transpose()?;
        let mut memory = Vec::new();
        for a in &placement.assignments {
            let shape = &world.ranks[a.rank][a.actor];
            let rows: u64 = a
                .panels
                .clone()
                .map(|p| grid.panel_rows(p).end - grid.panel_rows(p).start)
                .sum();
            // What the panels hold between passes, at its most: the basis and the probe
            // products; for the residual check of the fixed-iteration methods, U and A·V
            // (the basis gone by then); for LOBPCG's last pass, A·X, its Q and the probe
            // products. LOBPCG's iterates (X, S, P and their products with AᵀA, and the
            // Rayleigh–Ritz bases built from them: about 12 blocks of n × l) are held on
            // the tree's root, counted on every actor as any could be it.
            // The TSQR holds each panel's factor of what it orthonormalizes beside the
            // basis it replaces or extends and the probe products, all panels at once
            // between the tree's sweeps: a sketch (`l` columns) beside the basis, or block
            // Krylov's whole basis beside its new Q.
            let (columns, iterates) = match options.method {
                Method::Lobpcg => (2 * l + r, (96 * l as u64).saturating_mul(nn as u64)),
                Method::Lanczos => (
                    (2 * l + r).max(l + lobpcg::LANCZOS_BLOCK),
                    lobpcg::lanczos_bytes(l, nn as u64),
                ),
                _ => ((2 * basis + r).max(2 * options.k), 0),
            };
            let kept = (rows * columns as u64 * 8).saturating_add(iterates);
            let threads = shape.threads.max(1) as u64;
            let resident = problem.operand.resident_bytes(rows, options.precision);
            // A GPU actor's workers each carry a stored panel to the device through two
            // page-locked blocks (`gpu::Staging`).
            // Or, where the device decodes the chunks, the actor holds one batch of their
            // frames (`gpu_decoded`), counted here per thread.
            let staging = match (shape.kind, problem.operand.stored()) {
                (ActorKind::Gpu, Some(s)) => {
                    let decoded = match (&problem.operand, s.device_frames()) {
                        (Operand::Genotypes(..), Ok(f)) => {
                            crate::gpu_decoded::decoded_host_bytes(s, &f)
                                .div_ceil(shape.threads.max(1) as u64)
                        }
                        _ => 0,
                    };
                    staging_host_bytes(&problem.operand, options.precision, chunk).max(decoded)
                }
                _ => 0,
            };
            let per_thread = per_thread + kept.div_ceil(threads) + staging;
            let mut mp = match &reads {
                Some(r) => MemoryPlan::decide_reading(
                    shape.memory,
                    per_thread,
                    shape.threads,
                    resident,
                    r,
                )?,
                None => MemoryPlan::decide(shape.memory, per_thread, shape.threads, resident)?,
            };
            if matches!(&problem.operand, Operand::Dense(s) if s.cheaper_to_reproduce()) {
                mp.residency = Residency::Regenerated;
            }
            // Keeping decoded float panels costs touching that much fresh memory once,
            // which costs about what decoding it again does, and far more on a virtual
            // machine that hands free memory back to its host (free page reporting: on
            // the 2-core benchmark VM, pages the host had taken back cost about 2 s per GB
            // to touch again, and `rsvd --zarr` at q = 0 with resident panels took 3.6–7.4 s
            // against 2.5–2.7 s); with at most two passes (a fused projection that fell
            // back) the only read it saves is the second, so the panels are read twice
            // instead. Genotypes stay resident with power iterations: packed, they are a
            // quarter of what they decode to.
            if matches!(&problem.operand, Operand::Dense(s) if s.stored().is_some())
                && options.passes() <= 2
            {
                mp.residency = Residency::Regenerated;
            }
            // One pass (q = 0, B fused into it): nothing would read a kept copy unless the
            // fused projection falls back, and keeping it costs its fresh memory every run.
            if options.passes() == 1 {
                mp.residency = Residency::Regenerated;
            }
            // A GPU actor computes every pass from the source, generated on its device or
            // staged from storage (`Ctx::on_gpu`): it keeps nothing on the host.
            let on_device =
                DeviceSource::of(&problem.operand).is_some() || problem.operand.stored().is_some();
            if shape.kind == ActorKind::Gpu && on_device {
                mp.residency = Residency::Regenerated;
            }
            memory.push(mp);
        }
        let fused = options.projection == Projection::Fused;
        Ok(RsvdPlan {
            grid,
            ranks: world.ranks.len(),
            placement,
            memory,
            sketch: l,
            basis,
            passes: options.passes(),
            fused,
            words_b: 2 + basis * nn,
        })
    }
}

/// The a-posteriori error estimate (see the module documentation).
#[derive(Clone, Debug, Serialize)]
pub struct ErrorEstimate {
    /// Probes used.
    pub probes: usize,
    /// Estimate of ‖A − UΣVᵀ‖_F from the probes.
    pub frobenius: f64,
    /// The same relative to ‖A‖_F.
    pub relative_frobenius: f64,
    /// Upper bound on ‖A − UΣVᵀ‖₂ (Halko et al. §4.3) …
    pub spectral_bound: f64,
    /// … which fails with at most this probability.
    pub failure_probability: f64,
    /// ‖A‖_F, from the first pass.
    pub norm_frobenius: f64,
}

/// Genotype counts of a PCA.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GenotypeSummary {
    /// Variants in the matrix.
    pub variants: u64,
    /// Variants used (neither filtered nor dropped).
    pub variants_used: u64,
    /// Variants dropped: allele frequency 0 or 1 among their calls, or no calls.
    pub variants_dropped: u64,
    /// Variants the [`VariantFilter`] excluded (`--maf`, `--geno`, `--hwe`, `--extract`,
    /// `--exclude`).
    pub variants_filtered: u64,
    /// The filter applied.
    pub filter: VariantFilter,
    /// Missing calls, imputed to the variant's mean.
    pub missing_calls: u64,
    /// All calls.
    pub calls: u64,
}

/// The result on one rank.
#[derive(Clone, Debug)]
pub struct RsvdResult {
    /// The `k` largest singular values, descending.
    pub s: Vec<f64>,
    /// `Vᵀ` (`k × n`), replicated (for a transposed problem, `Uᵀ` of the user's matrix).
    pub wt: Array2<f64>,
    /// True when the problem was solved through the transpose.
    pub transposed: bool,
    /// ‖A‖_F² (after standardization for genotypes), the total variance.
    pub total_sum_squares: f64,
    /// The error estimate, with probes.
    pub estimate: Option<ErrorEstimate>,
    /// Genotype counts, for a genotype operand.
    pub genotypes: Option<GenotypeSummary>,
    /// Phase timings on this rank.
    pub timings: Vec<PhaseTiming>,
    /// The plan that ran.
    pub plan: RsvdPlan,
    /// Bytes of matrix values produced from the source on this rank, all passes.
    pub bytes_produced: u64,
    /// What this rank read from storage (zero for generated and in-memory operands).
    pub read: ReadTotals,
    /// Panel passes this rank computed on its GPUs (0 on CPU actors).
    pub gpu_panels: u64,
    /// Bytes of stored panels this rank staged from host to GPU memory, all passes.
    pub gpu_staged_bytes: u64,
    /// Panel QRs (of `Y`, in the TSQR's leaves) this rank computed on its GPUs by cuSOLVER.
    pub gpu_qrs: u64,
    /// Where this rank's device-produced panels spent their time, all passes.
    pub gpu_seconds: crate::gpu::GpuPanelSeconds,
    /// What this rank's GPU actors decoded on their devices (stored genotypes whose
    /// chunks the device decodes), and what fell back to the host; `None` when no GPU
    /// actor decoded on its device.
    pub gpu_decode: Option<crate::gpu_decoded::DeviceDecodeReport>,
    /// What this rank's GPU actors computed from genotypes kept on their devices as 2-bit
    /// codes, after the pass that generated or decoded them.
    pub gpu_kept: GpuKept,
    /// What the projections' sums went through across ranks: `nccl`, or the transport's
    /// name with why NCCL was not used.
    pub collectives: String,
    /// Why GPU actors of this rank computed on their CPU cores, when they did.
    pub gpu_note: Option<String>,
    /// How each projection was formed, in order (the power iterations', then `B`'s).
    pub projections: Vec<ProjectionReport>,
    /// The largest cond(Y) a fused projection is used for.
    pub condition_limit: f64,
    /// Passes over the matrix made.
    pub passes: usize,
    /// Whether the `k` components converged, and their residuals.
    pub convergence: Convergence,
}

/// The GPU panels' seconds summed in `ctx` so far.
fn gpu_seconds_of(ctx: &Ctx) -> crate::gpu::GpuPanelSeconds {
    *ctx.gpu_seconds.lock().unwrap_or_else(|e| e.into_inner())
}

/// Genotype panels kept on GPU actors' devices ([`RsvdResult::gpu_kept`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuKept {
    /// Panel passes computed from the kept codes.
    pub passes: u64,
    /// Bytes of codes kept.
    pub bytes: u64,
}

/// Panel passes from codes kept on the GPUs so far, and the bytes kept.
fn gpu_kept_of(ctx: &Ctx) -> GpuKept {
    GpuKept {
        passes: ctx.gpu_kept_passes.load(Ordering::Relaxed),
        bytes: ctx.residency.iter().map(|r| r.kept_bytes()).sum(),
    }
}

/// What the GPU actors decoded on their devices so far, when any did.
fn gpu_decode_of(ctx: &Ctx) -> Option<crate::gpu_decoded::DeviceDecodeReport> {
    ctx.device_frames?;
    Some(
        ctx.gpu_decode
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
    )
    .filter(|r| r.device.frames > 0 || r.host_chunks > 0)
}

/// How far each returned component is from an exact singular triplet.
#[derive(Clone, Debug, Serialize)]
pub struct Convergence {
    /// The tolerance ([`RsvdOptions::tol`]).
    pub tol: f64,
    /// Per component, `‖Aᵀuᵢ − σᵢvᵢ‖₂ / σ₁` (the iterative methods) or `‖Avᵢ − σᵢuᵢ‖₂ / σ₁`
    /// (the fixed-iteration methods, whose `Aᵀuᵢ = σᵢvᵢ` by construction), measured in f64
    /// sums from the returned `U`, `Σ`, `V` (or `V` and `AᵀAV` formed in the same pass).
    pub residuals: Vec<f64>,
    /// Which of the two residuals [`Convergence::residuals`] holds.
    pub measure: &'static str,
    /// Whether every residual is at most `tol`.
    pub converged: bool,
    /// Per component, whether its residual is at most `tol`.
    pub met: Vec<bool>,
    /// The iterative methods: the largest residual of the `k` after each iteration's pass, as
    /// the iteration saw it (in that pass's precision).
    pub history: Vec<f64>,
    /// The tiles' precision of each pass, in order.
    pub pass_precisions: Vec<Precision>,
    /// Why the iteration ended before every component met `tol`, when it did.
    pub stopped: Option<String>,
}

impl Convergence {
    fn measured(
        tol: f64,
        residuals: Vec<f64>,
        measure: &'static str,
        history: Vec<f64>,
        pass_precisions: Vec<Precision>,
        stopped: Option<String>,
    ) -> Convergence {
        let met: Vec<bool> = residuals.iter().map(|&r| r <= tol).collect();
        Convergence {
            tol,
            converged: met.iter().all(|&m| m),
            met,
            residuals,
            measure,
            history,
            pass_precisions,
            stopped,
        }
    }

    /// Which components (called `name1`, `name2`, …: `PC`, `component `) missed the
    /// tolerance, and why the solver stopped.
    pub fn describe(&self, name: &str) -> String {
        let list: Vec<String> = self
            .unconverged()
            .iter()
            .map(|(i, r)| format!("{name}{i} ({r:.2e})"))
            .collect();
        format!(
            "{} of {} components did not converge to `tol` {:.0e}: {}{}",
            list.len(),
            self.residuals.len(),
            self.tol,
            list.join(", "),
            self.stopped
                .as_ref()
                .map(|s| format!("; {s}"))
                .unwrap_or_default()
        )
    }

    /// The components (1-based) that did not meet the tolerance, with their residuals.
    pub fn unconverged(&self) -> Vec<(usize, f64)> {
        self.residuals
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.met[*i])
            .map(|(i, &r)| (i + 1, r))
            .collect()
    }
}

/// How one projection `AᵀQ` was formed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ProjectionReport {
    /// True when it came from the range pass before (`Wᵀ·R⁻¹`); false when a pass of its
    /// own computed it.
    pub fused: bool,
    /// The 2-norm condition number of `Y` (of its TSQR's `R`), when `AᵀY` was summed for
    /// a fused projection.
    pub condition: Option<f64>,
    /// For a power iteration's `Y = A·Z` and after, with fused projections planned: the
    /// condition number predicted for `Y` before its pass (that of the previous `AᵀQ`);
    /// `AᵀY` is summed only when it is within the limit.
    pub predicted: Option<f64>,
}

/// The largest condition number of `Y` for which `AᵀQ = (AᵀY)·R⁻¹` is used. Its rounding
/// error is about `cond(R)` times that of the separate product (both rounded in the tiles'
/// precision), so the limit keeps the loss to about two decimal digits in either
/// precision.
pub fn fused_condition_limit(precision: Precision) -> f64 {
    match precision {
        Precision::F64 => 1e2,
        Precision::F32 => 1e2,
    }
}

/// One panel's state between passes; it lives on its actor (moved in and out of jobs).
struct PanelState {
    p: usize,
    rows: Range<u64>,
    stored: Option<Stored>,
    /// Orthonormal blocks (one, or one per Krylov block), row-major `h × l`.
    basis: Vec<Array2<f64>>,
    /// The sketch waiting to be orthonormalized.
    y: Option<Array2<f64>>,
    /// `A·W`.
    probes: Option<Array2<f64>>,
    factor: Option<PanelFactor>,
    /// The panel's rows of `U`, between forming them and the residual check.
    u: Option<Array2<f64>>,
}

impl PanelState {
    /// Keeps `A·[Ω | W]` (`h × w`): the first `l` columns as the sketch, the rest as the
    /// probe products.
    fn set_sketch(&mut self, mut y: Array2<f64>, l: usize) {
        if y.ncols() > l {
            self.probes = Some(y.slice(s![.., l..]).to_owned());
            y = y.slice(s![.., ..l]).as_standard_layout().into_owned();
        }
        self.y = Some(y);
    }
}

struct Ctx {
    operand: Operand,
    resident: Vec<bool>,
    n: usize,
    /// Read-ahead buffers of this rank's actors (storage-backed operands).
    read_buffers: Vec<usize>,
    read: Arc<Reading>,
    /// Rows per read-ahead segment, when panels are read in segments.
    segment_rows: Option<u64>,
    /// Each of this rank's actors' GPU, if it is a GPU actor.
    gpus: Vec<Option<Arc<rankwise_device::GpuDevice>>>,
    /// The operand as a device produces it, when one can.
    device_source: Option<DeviceSource>,
    /// Panel passes computed on a GPU.
    gpu_panels: AtomicU64,
    /// Bytes of stored panels staged from the host to GPUs.
    gpu_staged_bytes: AtomicU64,
    /// The ranks' GPUs joined by NCCL, when every rank has a GPU actor.
    nccl: Option<NcclComm>,
    /// Panel QRs computed on a GPU.
    gpu_qrs: AtomicU64,
    /// Where the device-produced panels' time went.
    gpu_seconds: std::sync::Mutex<crate::gpu::GpuPanelSeconds>,
    /// The stored chunks' geometry when GPU actors decode them on their devices.
    device_frames: Option<StoredFrames>,
    /// Worker threads of each of this rank's actors.
    threads: Vec<usize>,
    /// Each actor's permits for batches of frames read ahead of its device.
    decode_permits: Vec<crate::gpu_decoded::Permits>,
    /// Each GPU actor's genotype panels kept on its device as 2-bit codes after the pass
    /// that produced or decoded them.
    residency: Vec<crate::gpu_decoded::Residency>,
    /// Panel passes computed from those codes.
    gpu_kept_passes: AtomicU64,
    /// What they decoded.
    gpu_decode: std::sync::Mutex<crate::gpu_decoded::DeviceDecodeReport>,
    /// Whether a float32 pass whose products are not finite leaves them to the root
    /// (which repeats the pass in float64, LOBPCG with mixed precision) rather than
    /// failing.
    f32_overflow_to_root: bool,
}

impl Ctx {
    /// Whether `actor` is a GPU actor that decodes the stored chunks on its device.
    fn decodes_on_device(&self, actor: usize) -> bool {
        self.device_frames.is_some() && self.gpus.get(actor).is_some_and(Option::is_some)
    }

    /// Starts this pass's read-aheads over the panels that are not resident (and that
    /// no GPU actor reads itself to decode on its device).
    fn reads(&self, rt: &Runtime, states: &States) -> Result<Arc<PassReads>, LinalgError> {
        let order = states
            .iter()
            .enumerate()
            .map(|(actor, list)| {
                if self.decodes_on_device(actor) {
                    return Vec::new();
                }
                list.iter()
                    .filter(|st| st.stored.is_none())
                    .map(|st| (st.p, st.rows.clone()))
                    .collect()
            })
            .collect();
        Ok(Arc::new(PassReads::start(
            rt,
            self.operand.stored_reads(),
            order,
            &self.read_buffers,
            Arc::clone(&self.read),
            self.segment_rows,
        )?))
    }
}

/// Whether this rank's GPU actors decode the stored operand's chunks on their devices
/// (`crate::gpu_decoded`): the chunks' geometry when they do; else, where GPU actors stage
/// a stored operand through the host, the report's note of why.
fn device_frames(
    operand: &Operand,
    gpu_actors: bool,
    device_source: &Option<DeviceSource>,
) -> (Option<StoredFrames>, Option<String>) {
    let Some(stored) = operand.stored() else {
        return (None, None);
    };
    if !gpu_actors || device_source.is_some() {
        return (None, None);
    }
    let staged = |why: String| {
        (
            None,
            Some(format!(
                "GPU actors decoded {} on the host's cores and staged it to the device: {why}",
                operand.describe()
            )),
        )
    };
    if !matches!(operand, Operand::Genotypes(..)) {
        return staged("the device decodes genotype dosages, not float values".into());
    }
    match stored.device_frames() {
        Err(why) => staged(why),
        Ok(frames) => match rankwise_device::Nvcomp::get() {
            Ok(_) => (Some(frames), None),
            Err(e) => staged(e),
        },
    }
}

/// Computes the rank-k randomized SVD. A collective call: every rank of the runtime makes
/// it with the same problem and options. `sink` receives this rank's rows of `U`.
///
/// Three stages: the plan (every rank refuses the same bad options or budget before any
/// pass), the passes (the iterative methods' iteration to the tolerance, or the fixed passes
/// of [`Method::SubspaceIteration`] and [`Method::BlockKrylov`]), and the result they assemble.
pub fn rsvd(
    rt: &Runtime,
    problem: &RsvdProblem,
    options: &RsvdOptions,
    sink: Option<FactorSink>,
) -> Result<RsvdResult, LinalgError> {
    let plan = RsvdPlan::new(problem, options, rt.world())?;
    let owners = plan.placement.owner.clone();
    let tree = Tree::new(&owners);
    let mut run = Run::start(rt, problem, options, sink, plan, &tree)?;
    if options.method.iterates() {
        return lobpcg::solve(run);
    }
    let mut timings = Vec::new();
    let sketched = sketch_passes(&mut run, &mut timings)?;
    let projected = last_projection(&run, sketched, &mut timings)?;
    fixed_result(run, projected, timings)
}

/// Everything [`rsvd`] sets up before the passes: this rank's panels and their states, the
/// context the actors share, and what the result reports of them.
struct Run<'a, 't> {
    rt: &'a Runtime,
    problem: &'a RsvdProblem,
    options: &'a RsvdOptions,
    sink: Option<FactorSink>,
    plan: RsvdPlan,
    ctx: Arc<Ctx>,
    tree: &'a Tree<'t>,
    states: States,
    /// Rows of this rank's panels.
    my_rows: u64,
    /// Of those, the rows of panels produced again in every pass (not resident).
    regenerated_rows: u64,
    /// Bytes of one value as the operand holds it.
    value_bytes: u64,
    /// What carries the collectives (NCCL, or the transport, and why not NCCL).
    collectives: String,
    /// Why GPU actors could not compute the passes, when they could not.
    gpu_note: Option<String>,
}

impl<'a, 't> Run<'a, 't> {
    /// This rank's panel states and the actors' context for `plan`.
    fn start(
        rt: &'a Runtime,
        problem: &'a RsvdProblem,
        options: &'a RsvdOptions,
        sink: Option<FactorSink>,
        plan: RsvdPlan,
        tree: &'a Tree<'t>,
    ) -> Result<Self, LinalgError> {
        let comm = rt.comm();
        let me = comm.rank();
        rt.progress().begin_run(plan.passes as u64);
        let grid = plan.grid;
        let n = problem.operand.shape().1 as usize;
        let mut resident = Vec::new();
        let mut read_buffers = Vec::new();
        let mut states = Vec::new();
        let mut regenerated_rows = 0u64;
        let mut my_rows = 0u64;
        for (a, mp) in plan.placement.assignments.iter().zip(&plan.memory) {
            if a.rank != me {
                continue;
            }
            resident.push(mp.residency == Residency::Resident);
            read_buffers.push(mp.read_buffers);
            states.push(
                a.panels
                    .clone()
                    .map(|p| {
                        let rows = grid.panel_rows(p);
                        my_rows += rows.end - rows.start;
                        if mp.residency == Residency::Regenerated {
                            regenerated_rows += rows.end - rows.start;
                        }
                        PanelState {
                            p,
                            rows,
                            stored: None,
                            basis: Vec::new(),
                            y: None,
                            probes: None,
                            factor: None,
                            u: None,
                        }
                    })
                    .collect::<Vec<_>>(),
            );
        }
        let value_bytes = match problem.operand {
            Operand::Dense(_) => 8,
            Operand::Genotypes(..) => 1,
        };
        let gpus: Vec<_> = rt.actors().iter().map(|a| a.gpu().cloned()).collect();
        let device_source = DeviceSource::of(&problem.operand);
        let (device_frames, decode_note) = device_frames(
            &problem.operand,
            gpus.iter().any(Option::is_some),
            &device_source,
        );
        // What each GPU actor that decodes on its device may keep there.
        let residency = gpus
            .iter()
            .map(|g| {
                let genotypes = device_frames.is_some()
                    || matches!(
                        &device_source,
                        Some(DeviceSource::Genotypes(..) | DeviceSource::Dosages(_))
                    );
                let room = match g {
                    Some(dev) if genotypes => dev
                        .free_memory()
                        .map_or(0, crate::gpu_decoded::residency_room),
                    _ => 0,
                };
                crate::gpu_decoded::Residency::new(room)
            })
            .collect();
        let first_gpu = gpus.iter().flatten().next();
        let (nccl, collectives) = match NcclComm::join(comm, first_gpu)? {
            NcclJoin::Joined(c) => (Some(c), "nccl".to_string()),
            NcclJoin::Declined(why) => (None, format!("{} (NCCL not used: {why})", comm.name())),
        };
        let ctx = Arc::new(Ctx {
            operand: problem.operand.clone(),
            resident,
            n,
            read_buffers,
            read: Arc::default(),
            segment_rows: problem
                .operand
                .stored()
                .and_then(|s| segment_rows(s, &problem.grid, options.segment_bytes)),
            gpus,
            device_source,
            device_frames,
            threads: rt
                .actors()
                .iter()
                .map(|a| a.spec().cores.len().max(1))
                .collect(),
            decode_permits: rt.actors().iter().map(|_| Default::default()).collect(),
            residency,
            gpu_kept_passes: AtomicU64::new(0),
            gpu_decode: Default::default(),
            gpu_panels: AtomicU64::new(0),
            gpu_staged_bytes: AtomicU64::new(0),
            nccl,
            gpu_qrs: AtomicU64::new(0),
            gpu_seconds: Default::default(),
            f32_overflow_to_root: options.method.iterates() && options.mixed_precision,
        });
        let gpu_note = (ctx.gpus.iter().any(Option::is_some)
            && ctx.device_source.is_none()
            && problem.operand.stored().is_none())
        .then(|| DeviceSource::why_not(&problem.operand))
        .or(decode_note);
        Ok(Run {
            rt,
            problem,
            options,
            sink,
            plan,
            ctx,
            tree,
            states,
            my_rows,
            regenerated_rows,
            value_bytes,
            collectives,
            gpu_note,
        })
    }
}

/// What the range passes of the fixed methods leave: the basis `Q` in the panel states,
/// pass 1's facts, and what the last projection takes from the last range pass.
struct Sketched {
    states: States,
    stats: PassFacts,
    /// `W = YᵀA` summed in the last range pass, when its projection is fused.
    fused_w: Option<Arc<PartialSums>>,
    /// `R` of the last TSQR, on the root.
    root_r: Option<Array2<f64>>,
    projections: Vec<ProjectionReport>,
    /// The condition number the last iteration predicted for the last sketch.
    predicted: Option<f64>,
}

/// Pass 1 (the sketch `A·Ω` and the probe products, and with fused projections
/// `W = YᵀA`), its TSQR, and `q` power iterations (block Krylov: the whole basis
/// orthonormalized after them).
fn sketch_passes(
    run: &mut Run<'_, '_>,
    timings: &mut Vec<PhaseTiming>,
) -> Result<Sketched, LinalgError> {
    let states = std::mem::take(&mut run.states);
    let (rt, ctx, tree, options) = (run.rt, &run.ctx, run.tree, run.options);
    let comm = rt.comm();
    let (m, n) = run.problem.operand.shape();
    let n = n as usize;
    let (l, r) = (options.sketch(), options.probes);
    let fuse = run.plan.fused;
    let q = options.power_iters;
    let krylov = options.method == Method::BlockKrylov;
    let w_sums = || Arc::new(PartialSums::new(tree.owners().to_vec(), comm.rank()));
    let limit = fused_condition_limit(options.precision);
    let mut projections = Vec::new();
    let t = Clock::start(rt);
    let omega = Arc::new(gaussian(n, l + r, options.seed));
    let prec = options.precision;
    let mut fused_w = fuse.then(w_sums);
    let (st, facts) = range_pass(rt, ctx, states, omega, l, true, prec, fused_w.as_ref())?;
    let mut states = st;
    let stats = PassFacts::sum_all(tree, comm, facts)?;
    check_scale(&stats, options.precision)?;
    variants_left(&run.problem.operand, &stats, m)?;
    let also_w = if fused_w.is_some() { " + Yᵀ·A" } else { "" };
    // The products' floating-point operations with the whole matrix: `2mn` per column of
    // the thin operand.
    let mn2 = 2.0 * m as f64 * n as f64;
    let fused_cols = |w: bool| if w { l as f64 } else { 0.0 };
    timings.push(
        t.phase(&format!("pass 1: produce panels + A·Ω{also_w}"))
            .with_flops(mn2 * ((l + r) as f64 + fused_cols(fused_w.is_some()))),
    );
    let t = Clock::start(rt);
    let mut root_r = orthonormalize(rt, ctx, tree, &mut states, false)?;
    timings.push(t.phase("orthonormalize (TSQR)"));

    let mut predicted = None;
    for it in 1..=q {
        let t = Clock::start(rt);
        // `Z = orth(AᵀQ)`, and below it in one more row, cond(AᵀQ): the next `Y = A·Z` has
        // about the same condition number (`Z` spans the dominant right singular vectors
        // found so far, and `A` maps them to vectors of about those lengths).
        let (zc, mut how) = project(
            rt,
            ctx,
            tree,
            &mut states,
            prec,
            (fused_w.take(), root_r.take(), limit),
            |bt| {
                let (q, r) = qr(bt)?;
                let mut out = Array2::zeros((q.nrows() + 1, q.ncols()));
                out.slice_mut(s![..q.nrows(), ..]).assign(&q);
                out[[q.nrows(), 0]] = condition(&r)?;
                Ok(out)
            },
        )?;
        let (z, next) = (zc.slice(s![..n, ..]).to_owned(), zc[[n, 0]]);
        let what = if how.fused {
            "R⁻ᵀ·YᵀA"
        } else {
            "Aᵀ·Q"
        };
        // A fused projection reuses the pass before's `YᵀA`: no product with the matrix.
        let projected = if how.fused { 0.0 } else { mn2 * l as f64 };
        timings.push(
            t.phase(&format!("iteration {it}: {what} + orth"))
                .with_flops(projected),
        );
        how.predicted = predicted;
        projections.push(how);
        predicted = fuse.then_some(next);
        let t = Clock::start(rt);
        // Fused only when the next sketch promises to be well enough conditioned (a fused
        // projection that falls back has computed `AᵀY` for nothing), and not for block
        // Krylov's last projection, of the whole basis orthonormalized after this pass.
        fused_w = (fuse && next <= limit && !(krylov && it == q)).then(w_sums);
        let (st, _) = range_pass(
            rt,
            ctx,
            states,
            Arc::new(z),
            l,
            false,
            prec,
            fused_w.as_ref(),
        )?;
        states = st;
        root_r = orthonormalize(rt, ctx, tree, &mut states, krylov)?;
        let also_w = if fused_w.is_some() { " + Yᵀ·A" } else { "" };
        timings.push(
            t.phase(&format!("iteration {it}: A·Z{also_w} + orth"))
                .with_flops(mn2 * (l as f64 + fused_cols(fused_w.is_some()))),
        );
    }
    if krylov && q > 0 {
        let t = Clock::start(rt);
        for st in states.iter_mut().flatten() {
            let blocks: Vec<_> = st.basis.iter().map(|b| b.view()).collect();
            let cat = ndarray::concatenate(ndarray::Axis(1), &blocks)
                .map_err(|e| LinalgError::Lapack(format!("Krylov basis: {e}")))?;
            st.basis.clear();
            st.y = Some(cat.as_standard_layout().into_owned());
        }
        orthonormalize(rt, ctx, tree, &mut states, false)?;
        timings.push(t.phase("block Krylov: orthonormalize the basis"));
    }
    Ok(Sketched {
        states,
        stats,
        fused_w,
        root_r,
        projections,
        predicted,
    })
}

/// What the last projection gives every rank: the singular values, `U_B` (basis × k), `Vᵀ`
/// and `Vᵀ·W` of the probes, with the panel states and the projections' reports.
struct Projected {
    states: States,
    stats: PassFacts,
    projections: Vec<ProjectionReport>,
    s: Vec<f64>,
    ub: Array2<f64>,
    wt: Array2<f64>,
    vtw: Array2<f64>,
}

/// The last pass: `B = QᵀA` (or `R⁻ᵀ·YᵀA`, summed in the last range pass), its SVD on the
/// root, broadcast.
fn last_projection(
    run: &Run<'_, '_>,
    sketched: Sketched,
    timings: &mut Vec<PhaseTiming>,
) -> Result<Projected, LinalgError> {
    let (rt, options, tree) = (run.rt, run.options, run.tree);
    let n = run.ctx.n;
    let (k, l, r) = (options.k, options.sketch(), options.probes);
    let Sketched {
        mut states,
        stats,
        fused_w,
        root_r,
        mut projections,
        predicted,
    } = sketched;
    let t = Clock::start(rt);
    let basis = run.plan.basis;
    let limit = fused_condition_limit(options.precision);
    let w = gaussian(n, l + r, options.seed)
        .slice(s![.., l..])
        .to_owned();
    let finish = |bt: Array2<f64>| {
        let (u, s, vt) = small_svd(bt.t())?;
        let vtk = vt.slice(s![..k, ..]).to_owned();
        let vtw = vtk.dot(&w);
        let mut out = Vec::new();
        out.extend(s.iter().take(k));
        out.extend(encode(&u.slice(s![.., ..k]).to_owned()));
        out.extend(encode(&vtk));
        out.extend(encode(&vtw));
        Ok(Array2::from_shape_vec((1, out.len()), out).expect("flat"))
    };
    let (packed, mut how) = project(
        rt,
        &run.ctx,
        tree,
        &mut states,
        options.precision,
        (fused_w, root_r, limit),
        finish,
    )?;
    how.predicted = predicted;
    let what = if how.fused {
        "last projection (fused): R⁻ᵀ·YᵀA + SVD of B"
    } else {
        "last pass: Qᵀ·A + SVD of B"
    };
    let (m, _) = run.problem.operand.shape();
    // `QᵀA` with the basis's columns; a fused projection reuses the last range pass's `YᵀA`.
    let projected = if how.fused {
        0.0
    } else {
        2.0 * m as f64 * n as f64 * basis as f64
    };
    timings.push(t.phase(what).with_flops(projected));
    projections.push(how);
    let flat: Vec<f64> = packed.iter().copied().collect();
    let root = tree.root_owner();
    let bad = || LinalgError::Message { peer: root };
    let take = |v: &[f64]| -> Result<(Array2<f64>, usize), LinalgError> {
        let len =
            2 + (v.first().copied().unwrap_or(0.0) * v.get(1).copied().unwrap_or(0.0)) as usize;
        Ok((decode(root, v.get(..len).ok_or_else(bad)?)?, len))
    };
    let s_k = flat.get(..k).ok_or_else(bad)?.to_vec();
    let (ub, used) = take(&flat[k..])?;
    let (wt, used2) = take(&flat[k + used..])?;
    let (vtw, _) = take(&flat[k + used + used2..])?;
    if ub.dim() != (basis, k) || wt.dim() != (k, n) {
        return Err(bad());
    }
    Ok(Projected {
        states,
        stats,
        projections,
        s: s_k,
        ub,
        wt,
        vtw,
    })
}

/// `U = Q·U_B` (kept for the residual check), the probe residuals, the residual check, and
/// the result of the fixed passes.
fn fixed_result(
    run: Run<'_, '_>,
    projected: Projected,
    mut timings: Vec<PhaseTiming>,
) -> Result<RsvdResult, LinalgError> {
    let (rt, options, tree, ctx) = (run.rt, run.options, run.tree, &run.ctx);
    let comm = rt.comm();
    let (m, n) = run.problem.operand.shape();
    let n = n as usize;
    let (k, r, q) = (options.k, options.probes, options.power_iters);
    let prec = options.precision;
    let Projected {
        states,
        stats,
        projections,
        s: s_k,
        ub,
        wt,
        vtw,
    } = projected;
    let t = Clock::start(rt);
    let (leaves, states) = form_u(rt, states, ub, &s_k, vtw, r, None)?;
    let probe_sq = tree.sum_all(comm, leaves, (1, r))?;
    timings.push(t.phase("form U + error probes"));

    // The residual check: one more pass, `A·V`, against `U·Σ`. `Aᵀuᵢ = σᵢvᵢ` holds by
    // construction (`U = Q·U_B` and `QᵀA = B`), so `‖Avᵢ − σᵢuᵢ‖` is the residual left.
    let t = Clock::start(rt);
    let v = Arc::new(wt.t().as_standard_layout().into_owned());
    let (states, _) = range_pass(rt, ctx, states, v, k, false, prec, None)?;
    let (residuals, _) = residual_pass(rt, tree, states, &s_k, run.sink)?;
    let (rows, cols) = run.problem.operand.shape();
    timings.push(
        t.phase("residual check: A·V against U·Σ")
            .with_flops(2.0 * rows as f64 * cols as f64 * k as f64),
    );
    // The phases that multiply the matrix are its passes: the first produced every panel
    // of this rank, each later one those that are not resident.
    let mut first = true;
    for t in timings.iter_mut().filter(|t| t.flops > 0.0) {
        let rows = match std::mem::take(&mut first) {
            true => run.my_rows,
            false => run.regenerated_rows,
        };
        t.produced_bytes = rows * cols * 8;
    }
    let convergence = Convergence::measured(
        options.tol,
        residuals,
        "‖Avᵢ − σᵢuᵢ‖₂ / σ₁",
        Vec::new(),
        Vec::new(),
        None,
    );

    let total_sum_squares = stats.sum_squares;
    let estimate = error_estimate(&probe_sq, r, total_sum_squares);
    let genotypes = genotype_summary(&run.problem.operand, &stats, m, n);
    let fused_projections = projections.iter().filter(|p| p.fused).count();
    // The range and projection passes, and the residual check.
    let passes = (3 + 2 * q - fused_projections) as u64;
    let bytes_produced =
        (run.my_rows + (passes - 1) * run.regenerated_rows) * n as u64 * run.value_bytes;
    Ok(RsvdResult {
        gpu_panels: ctx.gpu_panels.load(Ordering::Relaxed),
        gpu_staged_bytes: ctx.gpu_staged_bytes.load(Ordering::Relaxed),
        gpu_qrs: ctx.gpu_qrs.load(Ordering::Relaxed),
        gpu_seconds: gpu_seconds_of(ctx),
        gpu_decode: gpu_decode_of(ctx),
        gpu_kept: gpu_kept_of(ctx),
        collectives: run.collectives,
        gpu_note: run.gpu_note,
        s: s_k,
        wt,
        transposed: run.problem.transposed,
        total_sum_squares,
        estimate,
        genotypes,
        timings,
        plan: run.plan,
        bytes_produced,
        read: ctx.read.totals(),
        projections,
        condition_limit: fused_condition_limit(prec),
        passes: passes as usize,
        convergence: Convergence {
            pass_precisions: vec![prec; passes as usize],
            ..convergence
        },
    })
}

/// What a map over the panels returns: each panel's state and value, per actor.
type PanelResults = Vec<Vec<Result<(PanelState, Array2<f64>), LinalgError>>>;

/// Per-panel results of a map split into the panels' values (the tree's leaves) and the
/// states, in their actors' lists.
fn split_leaves(out: PanelResults) -> Result<(BTreeMap<usize, Array2<f64>>, States), LinalgError> {
    let mut leaves = BTreeMap::new();
    let mut back = Vec::with_capacity(out.len());
    for list in out {
        let mut mine = Vec::with_capacity(list.len());
        for x in list {
            let (st, v) = x?;
            leaves.insert(st.p, v);
            mine.push(st);
        }
        back.push(mine);
    }
    Ok((leaves, back))
}

/// Hands a panel's rows of `U` to the sink.
fn to_sink(sink: &FactorSink, st: &PanelState, u: &Array2<f64>) -> Result<(), LinalgError> {
    sink(st.p, st.rows.clone(), u.view()).map_err(|message| LinalgError::Sink {
        panel: st.p,
        message,
    })
}

/// `U = Q·coeff` for every panel (`Q` its first basis block, which goes) and the probe
/// residuals of `U·Σ·Vᵀ` (`1 × r` leaves, `vtw = VᵀW`). With `sink`, each panel's `U` goes
/// there; without, the panel keeps it (`u`) for the residual check.
fn form_u(
    rt: &Runtime,
    states: States,
    coeff: Array2<f64>,
    s_k: &[f64],
    vtw: Array2<f64>,
    r: usize,
    sink: Option<FactorSink>,
) -> Result<(BTreeMap<usize, Array2<f64>>, States), LinalgError> {
    let coeff = Arc::new(coeff);
    let sv = Arc::new(s_k.to_vec());
    let vtw = Arc::new(vtw);
    let res = rt.map(
        states,
        move |_, mut st: PanelState| -> Result<(PanelState, Array2<f64>), LinalgError> {
            let q = st.basis.first().ok_or(LinalgError::Tree {
                level: 0,
                node: st.p,
            })?;
            let u = q.dot(&*coeff);
            st.basis.clear();
            let out = probe_squares(st.probes.take(), &u, &sv, &vtw, r);
            match &sink {
                Some(sink) => to_sink(sink, &st, &u)?,
                None => st.u = Some(u),
            }
            Ok((st, out))
        },
    )?;
    split_leaves(res)
}

/// Fails alike on every rank (the sums are the same everywhere) when pass 1's facts
/// leave no variant of a genotype operand.
fn variants_left(operand: &Operand, stats: &PassFacts, m: u64) -> Result<(), LinalgError> {
    if let Operand::Genotypes(_, filter) = operand {
        let (dropped, filtered) = (stats.dropped, stats.filtered);
        if dropped + filtered >= m {
            return Err(LinalgError::NoVariants {
                variants: m,
                filtered,
                dropped,
                filter: filter.clone(),
            });
        }
    }
    Ok(())
}

/// The error estimate from the probes' `Σ‖Eω‖²` (`1 × r`).
fn error_estimate(
    probe_sq: &Array2<f64>,
    r: usize,
    total_sum_squares: f64,
) -> Option<ErrorEstimate> {
    (r > 0).then(|| {
        let sq: Vec<f64> = probe_sq.iter().copied().collect();
        let mean = sq.iter().sum::<f64>() / r as f64;
        let max = sq.iter().fold(0.0f64, |a, &b| a.max(b)).sqrt();
        let norm = total_sum_squares.sqrt();
        ErrorEstimate {
            probes: r,
            frobenius: mean.sqrt(),
            relative_frobenius: if norm > 0.0 { mean.sqrt() / norm } else { 0.0 },
            spectral_bound: 10.0 * (2.0 / std::f64::consts::PI).sqrt() * max,
            failure_probability: 10f64.powi(-(r as i32)),
            norm_frobenius: norm,
        }
    })
}

/// A genotype operand's counts from pass 1's facts.
fn genotype_summary(
    operand: &Operand,
    stats: &PassFacts,
    m: u64,
    n: usize,
) -> Option<GenotypeSummary> {
    match operand {
        Operand::Genotypes(_, filter) => Some(GenotypeSummary {
            variants: m,
            variants_used: m - stats.dropped - stats.filtered,
            variants_dropped: stats.dropped,
            variants_filtered: stats.filtered,
            filter: filter.clone(),
            missing_calls: stats.missing,
            calls: m * n as u64,
        }),
        Operand::Dense(_) => None,
    }
}

/// `Σ (A·w − U·Σ·Vᵀw)²` over a panel's rows, per probe `w` (`1 × r`; zeros without probes).
fn probe_squares(
    probes: Option<Array2<f64>>,
    u: &Array2<f64>,
    sv: &[f64],
    vtw: &Array2<f64>,
    r: usize,
) -> Array2<f64> {
    let mut out = Array2::zeros((1, r));
    if let Some(pw) = probes {
        let k = sv.len();
        let usv = (u * &Array2::from_shape_fn((1, k), |(_, j)| sv[j])).dot(vtw);
        let e = pw - &usv;
        for j in 0..r.min(e.ncols()) {
            out[[0, j]] = e.column(j).iter().map(|v| v * v).sum();
        }
    }
    out
}

/// After a pass that left `A·V` in every panel's `y`: `‖Avᵢ − σᵢuᵢ‖₂ / σ₁` for the panel's
/// rows of `U` (`st.u`), summed over the tree and the same on every rank; each panel's `U`
/// then goes to `sink`. Returns the residuals and the states, emptied.
fn residual_pass(
    rt: &Runtime,
    tree: &Tree<'_>,
    states: States,
    s_k: &[f64],
    sink: Option<FactorSink>,
) -> Result<(Vec<f64>, States), LinalgError> {
    let k = s_k.len();
    let sv = Arc::new(s_k.to_vec());
    let res = rt.map(
        states,
        move |_, mut st: PanelState| -> Result<(PanelState, Array2<f64>), LinalgError> {
            let missing = LinalgError::Tree {
                level: 0,
                node: st.p,
            };
            let (Some(y), Some(u)) = (st.y.take(), st.u.take()) else {
                return Err(missing);
            };
            let mut out = Array2::zeros((1, k));
            for j in 0..k {
                out[[0, j]] = y
                    .column(j)
                    .iter()
                    .zip(u.column(j))
                    .map(|(a, b)| (a - sv[j] * b).powi(2))
                    .sum();
            }
            if let Some(sink) = &sink {
                to_sink(sink, &st, &u)?;
            }
            Ok((st, out))
        },
    )?;
    let (leaves, back) = split_leaves(res)?;
    let sq = tree.sum_all(rt.comm(), leaves, (1, k))?;
    let s1 = s_k.first().copied().unwrap_or(0.0);
    let residuals = sq
        .iter()
        .map(|&x| relative(x.max(0.0).sqrt(), s1))
        .collect();
    Ok((residuals, back))
}

/// `x / σ₁`, 0 for a zero matrix (whose every triplet is exact).
fn relative(x: f64, s1: f64) -> f64 {
    if s1 > 0.0 {
        x / s1
    } else if x == 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

/// The Gaussian test matrix `n × w` (row-major) of `seed`, the same on every rank.
pub(crate) fn gaussian(n: usize, w: usize, seed: u64) -> Array2<f64> {
    let g = Generated::new(
        n as u64,
        w as u64,
        seed ^ 0x0A3E_6AC0_FFEE_0001,
        Dist::Normal,
    );
    Array2::from_shape_fn((n, w), |(i, j)| g.value(i as u64, j as u64))
}

type States = Vec<Vec<PanelState>>;

/// `Y = A·omega` for every panel; with `first`, also produces (and keeps, if resident) the
/// panels and the facts of pass 1, and keeps the probe columns `omega[:, l..]`. With
/// `w_sums`, also `Wᵀ = AᵀY` of the sketch columns, each panel's into `w_sums`: every row
/// block's tiles are swept twice, the second time once its rows of `Y` are complete.
#[allow(clippy::too_many_arguments)]
fn range_pass(
    rt: &Runtime,
    ctx: &Arc<Ctx>,
    states: States,
    omega: Arc<Array2<f64>>,
    l: usize,
    first: bool,
    precision: Precision,
    w_sums: Option<&Arc<PartialSums>>,
) -> Result<(States, BTreeMap<usize, PassFacts>), LinalgError> {
    let w_sums = w_sums.cloned();
    rt.progress().start_pass();
    // Row-major, as the tile products take it: LOBPCG's blocks arrive column-major, and
    // a column-major `Ω` sent every tile's product through ndarray's `dot` (OpenBLAS with
    // its packing, and a fresh product array a tile): a PCA of 50,000 × 10,000 genotypes
    // on the 2-core Zen 3 guest spent 36 % of its time in `sgemm` and its copies.
    let omega = if omega.is_standard_layout() {
        omega
    } else {
        Arc::new(omega.as_standard_layout().into_owned())
    };
    match precision {
        Precision::F64 => range_pass_t::<f64>(rt, ctx, states, omega, l, first, w_sums),
        Precision::F32 => {
            let o32 = Arc::new(Array2::from_shape_fn(omega.dim(), |(i, j)| {
                omega[[i, j]] as f32
            }));
            range_pass_t::<f32>(rt, ctx, states, o32, l, first, w_sums)
        }
    }
}

/// What a first pass measures of a panel, and its sum over every panel of every rank (the
/// tree sums the encodings, which add field by field).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct PassFacts {
    /// Σ x² (after standardization for genotypes).
    pub(crate) sum_squares: f64,
    /// Variants dropped (monomorphic, no calls).
    pub(crate) dropped: u64,
    /// Missing calls.
    pub(crate) missing: u64,
    /// Variants the filter excluded.
    pub(crate) filtered: u64,
    /// The largest |y| of the panel's sketch `A·Ω` (summed: a scale of the whole sketch).
    pub(crate) y_scale: f64,
}

impl PassFacts {
    /// Values in an encoding.
    const WIDTH: usize = 5;

    /// A panel's facts.
    fn of_panel(f: &PanelFacts, y_max: f64) -> Self {
        PassFacts {
            sum_squares: f.sum_squares,
            dropped: f.dropped,
            missing: f.missing,
            filtered: f.filtered,
            y_scale: y_max,
        }
    }

    /// The `1 × WIDTH` row the tree sums (counts below 2⁵³ are exact in f64).
    fn encode(&self) -> Array2<f64> {
        let row = vec![
            self.sum_squares,
            self.dropped as f64,
            self.missing as f64,
            self.filtered as f64,
            self.y_scale,
        ];
        Array2::from_shape_vec((1, Self::WIDTH), row).expect("1 × WIDTH")
    }

    /// The facts summed over every panel: the tree's sum of the encodings.
    pub(crate) fn sum_all(
        tree: &Tree,
        comm: &dyn Comm,
        facts: BTreeMap<usize, PassFacts>,
    ) -> Result<PassFacts, LinalgError> {
        let rows = facts.into_iter().map(|(p, f)| (p, f.encode())).collect();
        let t = tree.sum_all(comm, rows, (1, Self::WIDTH))?;
        Ok(PassFacts {
            sum_squares: t[[0, 0]],
            dropped: t[[0, 1]] as u64,
            missing: t[[0, 2]] as u64,
            filtered: t[[0, 3]] as u64,
            y_scale: t[[0, 4]],
        })
    }
}

/// The least scale of `A·Ω` (summed over panels of their largest |y|) whose squares
/// float64 holds with its full precision: the passes square the data's scale (`YᵀA`,
/// LOBPCG's `AᵀA`), and below about 1e-154 those squares are subnormal or zero.
const LEAST_F64_SCALE: f64 = 1e-145;

/// The same for float32 tiles (squares normal above about 1e-19).
pub(super) const LEAST_F32_SCALE: f64 = 1e-15;

/// Refuses a matrix too small in scale for the passes (its products square to zero or
/// to subnormals, and σ would come out as 0 with every residual 0), from a first pass's
/// summed facts.
fn check_scale(stats: &PassFacts, precision: Precision) -> Result<(), LinalgError> {
    let scale = stats.y_scale;
    let (least, name, floor) = match precision {
        Precision::F64 => (LEAST_F64_SCALE, "float64", "1e-154"),
        Precision::F32 => (LEAST_F32_SCALE, "float32", "1e-19"),
    };
    if scale > 0.0 && scale < least {
        return Err(LinalgError::Underflow {
            scale,
            precision: name,
            floor,
        });
    }
    Ok(())
}

/// Zeros for sums that the tile kernels add to, written rather than left to the
/// allocator. A large `Array2::zeros` is fresh zero-filled memory whose first access, the
/// kernels' read before their add, maps the shared zero page; the write after it faults
/// again to copy the page and flushes the TLBs of every core the process runs on. Those
/// faults (`do_wp_page`) took 2 % of the CPU time of `rsvd --zarr` at q = 0.
///
/// Written once: allocated without zeroing, then filled. Zeroed by the allocator and then
/// filled (as this did), memory the allocator reuses is written twice, and a genotype PCA
/// makes one `l × samples` sum a panel each pass (64 panels of 3.2 MB at 20,000 samples):
/// the two writes were 6 % of the CPU time of `pca --bed` of 20,000 × 20,000 on a 2-core
/// Xeon KVM guest (`perf`, 2026-11-30: `memset` 3.2 %, the fill 2.8 %).
fn written_zeros(shape: (usize, usize)) -> Array2<f64> {
    let len = shape.0 * shape.1;
    let mut v = Vec::with_capacity(len);
    v.resize(len, 0.0);
    Array2::from_shape_vec(shape, v).expect("rows × columns values")
}

fn range_pass_t<T: GpuReal>(
    rt: &Runtime,
    ctx: &Arc<Ctx>,
    states: States,
    omega: Arc<Array2<T>>,
    l: usize,
    first: bool,
    w_sums: Option<Arc<PartialSums>>,
) -> Result<(States, BTreeMap<usize, PassFacts>), LinalgError> {
    let c = Arc::clone(ctx);
    let reads = ctx.reads(rt, &states)?;
    // Ω as the fused products take it, laid out once per pass.
    let layout = T::omega_layout(omega.view()).map(Arc::new);
    let out = rt.map(states, move |actor, mut st: PanelState| {
        let job = RangeJob {
            omega: omega.view(),
            layout: layout.as_deref(),
            l,
            fused: w_sums.is_some(),
            first,
        };
        let mut out = c
            .backend::<T>(actor)
            .range(&c, &reads, actor, &mut st, &job)?;
        let single = std::mem::size_of::<T>() == 4;
        let y_max = out.y.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
        if !(single && c.f32_overflow_to_root) {
            let mut parts = vec![out.y.view()];
            parts.extend(out.w.as_ref().map(|w| w.view()));
            crate::finite::check_products(&c.operand, st.p, st.rows.clone(), single, &parts)?;
        }
        if let (Some(sums), Some(w)) = (&w_sums, out.w.take()) {
            // `Wᵀ` in `W`'s memory (column-major): the sums add elementwise and `encode`
            // reads column-major, so no transposed copy is made per panel (that copy and
            // its fresh pages were 4–5 % of a genotype PCA's time).
            sums.insert(st.p, w.reversed_axes());
        }
        st.set_sketch(out.y, l);
        Ok::<_, LinalgError>((st, out.facts, y_max))
    })?;
    let mut states = Vec::with_capacity(out.len());
    let mut facts = BTreeMap::new();
    for list in out {
        let mut mine = Vec::with_capacity(list.len());
        for x in list {
            let (st, f, y_max): (PanelState, PanelFacts, f64) = x?;
            facts.insert(st.p, PassFacts::of_panel(&f, y_max));
            mine.push(st);
        }
        states.push(mine);
    }
    Ok((states, facts))
}

/// Orthonormalizes every panel's `y` by the distributed TSQR; the panel's rows of `Q` are
/// appended to (`append`) or replace its basis. Returns `R` (`Y = QR`) on the tree's root.
fn orthonormalize(
    rt: &Runtime,
    ctx: &Arc<Ctx>,
    tree: &Tree<'_>,
    states: &mut States,
    append: bool,
) -> Result<Option<Array2<f64>>, LinalgError> {
    let comm = rt.comm();
    let ctx = Arc::clone(ctx);
    let out = rt.map(std::mem::take(states), move |actor, mut st: PanelState| {
        let y = st.y.take().ok_or(LinalgError::Tree {
            level: 0,
            node: st.p,
        })?;
        let f = backend::factor_sketch(&ctx, actor, y.view())?;
        let r = f.r.clone();
        st.factor = Some(f);
        Ok::<_, LinalgError>((st, r))
    })?;
    let (leaves, back) = split_leaves(out)?;
    let mut node_q: HashMap<(usize, usize), (usize, Array2<f64>)> = HashMap::new();
    let root = tree.up(comm, leaves, |level, j, a, b| {
        let ka = a.nrows();
        let (q, r) = qr(stack_rows(&[a.view(), b.view()]))?;
        node_q.insert((level, j), (ka, q));
        Ok(r)
    })?;
    let start = root.as_ref().map(|r| Array2::eye(r.nrows()));
    let mut c = tree.down(comm, start, |level, j, c| {
        let (ka, q) = node_q
            .remove(&(level, j))
            .ok_or(LinalgError::Tree { level, node: j })?;
        Ok((q.slice(s![..ka, ..]).dot(&c), q.slice(s![ka.., ..]).dot(&c)))
    })?;
    let mut inputs = Vec::with_capacity(back.len());
    for list in back {
        let mut mine = Vec::with_capacity(list.len());
        for st in list {
            let ci = c.remove(&st.p).ok_or(LinalgError::Tree {
                level: 0,
                node: st.p,
            })?;
            mine.push((st, ci));
        }
        inputs.push(mine);
    }
    let out = rt.map(inputs, move |_, (mut st, ci): (PanelState, Array2<f64>)| {
        let f = st.factor.take().ok_or(LinalgError::Tree {
            level: 0,
            node: st.p,
        })?;
        let q = f.apply(ci.view()).as_standard_layout().into_owned();
        drop(f);
        if !append {
            st.basis.clear();
        }
        st.basis.push(q);
        Ok::<_, LinalgError>(st)
    })?;
    for list in out {
        states.push(list.into_iter().collect::<Result<Vec<_>, _>>()?);
    }
    Ok(root)
}

/// The 2-norm condition number of a square `r` (infinite when singular).
fn condition(r: &Array2<f64>) -> Result<f64, LinalgError> {
    let (_, sv, _) = small_svd(r.view())?;
    Ok(match (sv.first(), sv.last()) {
        (Some(&hi), Some(&lo)) if lo > 0.0 && r.is_square() => hi / lo,
        _ => f64::INFINITY,
    })
}

/// `finish(AᵀQ)` on the root, broadcast, with `Q` every panel's last basis block: from the
/// previous range pass's `W = YᵀA` (`fused`: its sums, `R` on the root, the condition
/// limit) when that is well enough conditioned, else from a pass of its own.
fn project(
    rt: &Runtime,
    ctx: &Arc<Ctx>,
    tree: &Tree<'_>,
    states: &mut States,
    precision: Precision,
    fused: (Option<Arc<PartialSums>>, Option<Array2<f64>>, f64),
    finish: impl Fn(Array2<f64>) -> Result<Array2<f64>, LinalgError> + Copy,
) -> Result<(Array2<f64>, ProjectionReport), LinalgError> {
    let (sums, root_r, limit) = fused;
    let mut how = ProjectionReport {
        fused: false,
        condition: None,
        predicted: None,
    };
    if let Some(sums) = sums {
        let nccl = ctx.nccl.as_ref();
        let (cond, out) = fused_finish(rt, tree, nccl, &sums, root_r, limit, finish)?;
        how.condition = Some(cond);
        if let Some(out) = out {
            how.fused = true;
            return Ok((out, how));
        }
    }
    Ok((project_pass(rt, ctx, tree, states, precision, finish)?, how))
}

/// The fused projection's end: sums `Wᵀ = AᵀY` over the tree and, on the root, when
/// `cond(R) ≤ limit`, applies `finish` to `AᵀQ = Wᵀ·R⁻¹`. Every rank gets `cond(R)` and
/// the root's result, `None` when the condition number was over the limit (the caller then
/// reads the matrix once more for `AᵀQ`).
fn fused_finish(
    rt: &Runtime,
    tree: &Tree<'_>,
    nccl: Option<&NcclComm>,
    sums: &PartialSums,
    root_r: Option<Array2<f64>>,
    limit: f64,
    finish: impl FnOnce(Array2<f64>) -> Result<Array2<f64>, LinalgError>,
) -> Result<(f64, Option<Array2<f64>>), LinalgError> {
    let comm = rt.comm();
    let root = sum_to_root(comm, tree, nccl, sums.take())?;
    let owner = tree.root_owner();
    let mut flat = Vec::new();
    if let (Some(wt), Some(r)) = (root, root_r) {
        let cond = match r.nrows() == wt.ncols() {
            true => condition(&r)?,
            false => f64::INFINITY,
        };
        flat.push(cond);
        if cond <= limit {
            // Rᵀ·B = W, B = QᵀA.
            let b = r
                .t()
                .to_owned()
                .solve_triangular(UPLO::Lower, Diag::NonUnit, &wt.t().to_owned())
                .map_err(|e| LinalgError::Lapack(format!("triangular solve with R: {e}")))?;
            flat.extend(encode(&finish(b.t().to_owned())?));
        }
    }
    comm.broadcast_f64(owner, &mut flat)?;
    let bad = || LinalgError::Message { peer: owner };
    let cond = *flat.first().ok_or_else(bad)?;
    let packed = match flat.len() {
        1 => None,
        _ => Some(decode(owner, &flat[1..])?),
    };
    Ok((cond, packed))
}

/// `Bᵀ = AᵀQ` (`n × basis`) over all panels, with `Q` the panel's last basis block,
/// reduced over the tree; the root applies `finish` to `Bᵀ` and the result is broadcast to
/// every rank.
fn project_pass(
    rt: &Runtime,
    ctx: &Arc<Ctx>,
    tree: &Tree<'_>,
    states: &mut States,
    precision: Precision,
    finish: impl FnOnce(Array2<f64>) -> Result<Array2<f64>, LinalgError>,
) -> Result<Array2<f64>, LinalgError> {
    let comm = rt.comm();
    let sums = Arc::new(PartialSums::new(tree.owners().to_vec(), comm.rank()));
    let taken = std::mem::take(states);
    let out = match precision {
        Precision::F64 => project_map::<f64>(rt, ctx, &sums, taken)?,
        Precision::F32 => project_map::<f32>(rt, ctx, &sums, taken)?,
    };
    for list in out {
        states.push(list.into_iter().collect::<Result<Vec<_>, _>>()?);
    }
    let root = sum_to_root(comm, tree, ctx.nccl.as_ref(), sums.take())?;
    let owner = tree.root_owner();
    let mut flat = match root {
        Some(b) => encode(&finish(b)?),
        None => Vec::new(),
    };
    comm.broadcast_f64(owner, &mut flat)?;
    decode(owner, &flat)
}

/// The sum of every rank's partial sums, on the tree's root owner (`None` elsewhere): up the
/// tree over the transport, or with NCCL, each rank's nodes added in tree order and the
/// ranks' sums reduced on their devices. NCCL's order of additions is its own, so the sums
/// differ from the tree's in rounding (the tree's are the same for any rank count).
fn sum_to_root(
    comm: &dyn Comm,
    tree: &Tree<'_>,
    nccl: Option<&NcclComm>,
    nodes: BTreeMap<(usize, usize), Array2<f64>>,
) -> Result<Option<Array2<f64>>, LinalgError> {
    let Some(nccl) = nccl else {
        return tree.up_partial(comm, nodes, |_, _, a, b| Ok(a + b));
    };
    let mut local: Option<Array2<f64>> = None;
    for (_, v) in nodes {
        local = Some(match local {
            Some(a) => a + v,
            None => v,
        });
    }
    // A rank without panels adds zeros of the others' shape.
    let shape = local.as_ref().map_or((0, 0), |a| a.dim());
    let mine = [shape.0 as u64, shape.1 as u64]
        .map(u64::to_le_bytes)
        .concat();
    let all = comm.allgather_bytes(&mine)?;
    let dims = |b: &[u8]| -> Option<(usize, usize)> {
        let r = u64::from_le_bytes(b.get(..8)?.try_into().ok()?) as usize;
        let c = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?) as usize;
        Some((r, c))
    };
    let shape = all
        .iter()
        .filter_map(|b| dims(b))
        .find(|&(r, c)| r * c > 0)
        .unwrap_or(shape);
    let mut sum = match local {
        Some(a) => a.as_standard_layout().into_owned(),
        None => Array2::zeros(shape),
    };
    if sum.dim() != shape {
        return Err(LinalgError::Tree {
            level: tree.height(),
            node: 0,
        });
    }
    let root = tree.root_owner();
    nccl.reduce_sum(root, sum.as_slice_mut().expect("standard layout"))?;
    Ok((comm.rank() == root).then_some(sum))
}

type Mapped = Vec<Vec<Result<PanelState, LinalgError>>>;

fn project_map<T: GpuReal>(
    rt: &Runtime,
    ctx: &Arc<Ctx>,
    sums: &Arc<PartialSums>,
    states: States,
) -> Result<Mapped, LinalgError> {
    let c = Arc::clone(ctx);
    let s2 = Arc::clone(sums);
    let reads = ctx.reads(rt, &states)?;
    rt.progress().start_pass();
    Ok(rt.map(states, move |actor, st: PanelState| {
        let q = st.basis.last().ok_or(LinalgError::Tree {
            level: 0,
            node: st.p,
        })?;
        let b = c
            .backend::<T>(actor)
            .project(&c, &reads, actor, &st, q.view())?;
        s2.insert(st.p, b.t().as_standard_layout().into_owned());
        Ok::<_, LinalgError>(st)
    })?)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use rankwise_exec::ActorShape;
    use rankwise_sources::{ZarrGenotypes, ZarrMatrix};

    use super::*;
    use crate::testing::Rng;

    /// A Zarr v2 array of `m × n` values of `dtype` in row bands of `c` rows, every chunk
    /// missing (the fill value, as Zarr reads it): the plans read the metadata only.
    fn v2_store(dir: &Path, dtype: &str, (m, n, c): (u64, u64, u64)) {
        v2_store_with(dir, dtype, (m, n, c), "null");
    }

    fn v2_store_with(dir: &Path, dtype: &str, (m, n, c): (u64, u64, u64), compressor: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let meta = format!(
            r#"{{"zarr_format": 2, "shape": [{m}, {n}], "chunks": [{c}, {n}], "dtype": "{dtype}",
            "compressor": {compressor}, "fill_value": 0, "order": "C", "filters": null}}"#
        );
        std::fs::write(dir.join(".zarray"), meta).unwrap();
    }

    fn actor(threads: usize, kind: ActorKind) -> ActorShape {
        ActorShape {
            threads,
            memory: 1 << 40,
            device: format!("{kind:?}"),
            kind,
        }
    }

    /// A GPU actor's plan holds, per worker thread, the two page-locked blocks through
    /// which it stages a stored panel to its device, or (an int8 Blosc genotype store that
    /// the device decodes) its share of the batches of frames read for the device; a CPU
    /// actor's holds none, and nor does a GPU actor's for a generated matrix, which never
    /// leaves the device. Either way the GPU actor keeps no panel on the host (it did plan
    /// them resident).
    #[test]
    fn gpu_actors_plan_their_staging_buffers() {
        let mut rng = Rng::fresh();
        let dir = std::env::temp_dir().join(format!("rankwise-plan-{}", rng.next()));
        // Removed however the test ends.
        struct Remove<'a>(&'a Path);
        impl Drop for Remove<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(self.0);
            }
        }
        let _remove = Remove(&dir);
        for round in 0..3 {
            let m = 1_000 + rng.below(200_000) as u64;
            let n = 1 + rng.below(30_000) as u64;
            let c = 1 + rng.below(m as usize) as u64;
            let threads = 1 + rng.below(16);
            let what = format!("round {round}: {m} × {n} in bands of {c}, {threads} threads");
            let floats = dir.join(format!("f{round}"));
            let dosages = dir.join(format!("g{round}"));
            v2_store(&floats, "<f4", (m, n, c));
            v2_store(&dosages, "|i1", (m, n, c));
            let blosc = dir.join(format!("b{round}"));
            v2_store_with(
                &blosc,
                "|i1",
                (m, n, c),
                r#"{"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 2, "blocksize": 0}"#,
            );
            let float_src: Arc<dyn PanelSource> =
                Arc::new(ZarrMatrix::open(floats.to_str().unwrap()).unwrap());
            let operands = [
                Operand::Dense(float_src),
                Operand::Genotypes(
                    Arc::new(ZarrGenotypes::open(dosages.to_str().unwrap()).unwrap()),
                    VariantFilter::NONE,
                ),
                Operand::Genotypes(
                    Arc::new(ZarrGenotypes::open(blosc.to_str().unwrap()).unwrap()),
                    VariantFilter::NONE,
                ),
                Operand::Dense(Arc::new(Generated::new(m, n, 7, Dist::Uniform))),
            ];
            let frames = operands[2].stored().unwrap().device_frames();
            assert!(frames.is_ok(), "{what}: {frames:?}");
            // The same shapes on CPU actors and with the second one a GPU actor: the
            // placements are the same, the workspaces differ by the staging alone.
            let world = |second| World {
                ranks: vec![vec![actor(threads, ActorKind::Cpu), actor(threads, second)]],
            };
            let (cpus, gpu) = (world(ActorKind::Cpu), world(ActorKind::Gpu));
            for operand in operands {
                for precision in [Precision::F32, Precision::F64] {
                    let problem = RsvdProblem {
                        grid: ChunkGrid::new(m, n, c).unwrap(),
                        operand: operand.clone(),
                        transposed: false,
                        rank_panels: None,
                    };
                    let options = RsvdOptions {
                        precision,
                        ..Default::default()
                    };
                    let second = |world: &World| {
                        let plan = RsvdPlan::new(&problem, &options, world).unwrap();
                        let i = plan
                            .placement
                            .assignments
                            .iter()
                            .position(|a| a.actor == 1)
                            .unwrap();
                        plan.memory[i]
                    };
                    let workspace = |world: &World| second(world).workspace;
                    let plain = match operand.stored() {
                        Some(_) => staging_host_bytes(&operand, precision, c as usize),
                        None => 0,
                    };
                    let decoded = match operand.stored().map(|s| (s, s.device_frames())) {
                        Some((s, Ok(f))) => {
                            crate::gpu_decoded::decoded_host_bytes(s, &f).div_ceil(threads as u64)
                        }
                        _ => 0,
                    };
                    let staging = plain.max(decoded);
                    let more = workspace(&gpu) - workspace(&cpus);
                    let what = format!("{what}: {} {precision:?}", operand.describe());
                    assert_eq!(more, threads as u64 * staging, "{what}");
                    // Every pass reaches the device from the source: nothing is kept.
                    assert_eq!(second(&gpu).residency, Residency::Regenerated, "{what}");
                    if plain > 0 && decoded == 0 {
                        // Two blocks of at most the staging budget, or of one row block.
                        let one = (crate::tiles::TILE_ROWS * n as usize * precision.bytes())
                            .max(64 << 20) as u64;
                        assert!(staging <= 2 * (one + one / 2), "{what}: {staging}");
                    }
                }
            }
        }
    }
}
