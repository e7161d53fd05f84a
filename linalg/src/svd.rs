//! The exact SVD of a tall-and-skinny matrix (short-and-fat through the transpose).
//!
//! Pass 1: every actor factors its panels (`A_i = Q_i R_i`, [`PanelFactor`]). The R
//! factors are reduced up the fixed [`Tree`] (`[R_a; R_b] = Q_node R`), the root's R is
//! decomposed on its owner (`R = U_R Σ Vᵀ`) and broadcast, and `U_R` is pushed down the
//! tree through the stored node Q factors. Pass 2: every actor forms its rows of U as
//! `Q_i C_i`, from the Q factors it kept (resident), from the panel produced again and
//! the triangular solves it kept (resident panels of a generated uniform matrix, cheaper to
//! make again than to keep), or by factoring the panel again (regenerated): all give the
//! same bits. Only R factors (n×n) and C blocks (n×k) travel.
//!
//! On GPU actors with cuSOLVER the panel QRs run on the device, and generated uniform
//! panels are generated there too; tree nodes of at least `DEVICE_NODE_COLS` columns
//! are factored on the rank's first such GPU.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, ShapeBuilder};
use rankwise_exec::{ChunkGrid, MemoryPlan, Placement, ReadBuffers, Residency, Runtime};
use rankwise_sources::{PanelBuffer, PanelSource};
use rankwise_transports::Comm;
use serde::{Deserialize, Serialize};

use crate::gpu::{factor_panel, generated_factor, panel_qr, DeviceSource, GpuDevice};
use crate::kernels::{
    block_rows, give_scratch, qr, small_svd, stack_rows, stacked_triangles_qr,
    take_scratch_for_overwrite, Keep, PanelFactor, StackedQ, WHOLE_PANEL_COLS,
};
use crate::reads::{read_buffers, PassReads, ReadTotals, Reading, StoredReads};
use crate::tree::{decode, encode, Tree};
use crate::LinalgError;

/// Receives the distributed factor, panel by panel, on the actor that owns the panel.
///
/// Arguments: the global panel index, its global rows, and the panel's rows of the factor
/// (`U` for a tall matrix; `V`, i.e. columns of `Vᵀ`, for a transposed one).
pub type FactorSink =
    Arc<dyn Fn(usize, Range<u64>, ArrayView2<'_, f64>) -> Result<(), String> + Send + Sync>;

/// The matrix to decompose.
#[derive(Clone)]
pub struct SvdProblem {
    /// Where the panels come from; its shape is the (tall) matrix the algorithm sees.
    pub source: Arc<dyn PanelSource>,
    /// The panel grid over `source`.
    pub grid: ChunkGrid,
    /// True when `source` is the transpose of the user's matrix (short-and-fat input).
    pub transposed: bool,
    /// Panels each rank owns, in rank order, when the panels must stay where they are (a
    /// host code's row blocks, see [`rankwise_exec::Placement::by_rank`]); `None`
    /// places them by weight. Results do not depend on it.
    pub rank_panels: Option<Vec<usize>>,
}

impl SvdProblem {
    /// The generated `rows × cols` matrix in panels of `chunk_rows` rows. A short-and-fat
    /// matrix (`rows < cols`) is decomposed through its transpose, whose panels are
    /// `chunk_rows` columns of the matrix: panels always run along the long dimension.
    pub fn generated(
        rows: u64,
        cols: u64,
        chunk_rows: u64,
        seed: u64,
        dist: rankwise_sources::Dist,
    ) -> Result<SvdProblem, LinalgError> {
        ChunkGrid::new(rows, cols, chunk_rows)?;
        rankwise_sources::Generated::check_shape(rows, cols)?;
        let g = rankwise_sources::Generated::new(rows, cols, seed, dist);
        let transposed = rows < cols;
        let (source, grid): (Arc<dyn PanelSource>, ChunkGrid) = if transposed {
            (
                Arc::new(g.transposed()),
                ChunkGrid::new(cols, rows, chunk_rows)?,
            )
        } else {
            (Arc::new(g), ChunkGrid::new(rows, cols, chunk_rows)?)
        };
        Ok(SvdProblem {
            source,
            grid,
            transposed,
            rank_panels: None,
        })
    }
}

/// Options of the SVD.
#[derive(Clone, Debug, Default)]
pub struct SvdOptions {
    /// Compute ‖A − UΣVᵀ‖/‖A‖ and the orthogonality of U and V in pass 2.
    pub check: bool,
}

/// What the plan decided, before any work.
#[derive(Clone, Debug, Serialize)]
pub struct SvdPlan {
    /// The grid.
    pub grid: ChunkGrid,
    /// Rank count.
    pub ranks: usize,
    /// Which actor owns which panels.
    pub placement: Placement,
    /// Memory decision of every actor, in placement order.
    pub memory: Vec<MemoryPlan>,
    /// Tree messages each rank sends in one sweep (up or down).
    pub messages_per_sweep: Vec<usize>,
    /// f64 values in one up-sweep message (an R factor) and one down-sweep message.
    pub words_up: usize,
    /// f64 values in one down-sweep message (a C block).
    pub words_down: usize,
    /// Per actor, in placement order: whether its resident panels keep only their blocks'
    /// triangular solves, not their `Q` (CPU actors, a generated uniform matrix, fewer than
    /// 64 columns); their `resident_bytes` count those.
    pub keeps_solves: Vec<bool>,
}

impl SvdPlan {
    /// Plans `grid` over the runtime's world. Pure: every rank computes the same plan.
    pub fn new(grid: ChunkGrid, world: &rankwise_exec::World) -> Result<SvdPlan, LinalgError> {
        Self::reading(grid, None, world, None, false)
    }

    /// Plans `problem` over the runtime's world, with the read-ahead buffers of a source
    /// read from storage.
    pub fn for_problem(
        problem: &SvdProblem,
        world: &rankwise_exec::World,
    ) -> Result<SvdPlan, LinalgError> {
        let reads = problem
            .source
            .stored()
            .map(|s| read_buffers(s, &problem.grid, &problem.source.describe(), None))
            .transpose()?;
        // A generated uniform matrix is produced again faster than its kept `Q` costs: the
        // kernel provides and zeroes fresh pages for 8 bytes a value as pass 1 keeps it
        // (about 40 % of pass 1 here), and pass 2 streams them back. Its resident panels
        // keep only their blocks' solves, and pass 2 makes `Q̃` again, block by block in
        // cache ([`Keep::Solves`]; the same bits). Measured on the 2-core AMD EPYC (Zen 3)
        // KVM guest, `svd --rows 10000000 --cols 20 --chunk-rows 625000`: see
        // `benches/RESULTS.md`, issue 38 notes. Normal values cost about 8× as much to make
        // (the ziggurat), which made pass 2 slower than the kept `Q` (4,000,000 × 20:
        // 0.93–1.09 s kept, 1.11–1.23 s replayed), so they keep it, as do panels factored
        // whole ([`WHOLE_PANEL_COLS`] columns and more).
        let solves = problem
            .source
            .generated()
            .is_some_and(|g| g.dist() == rankwise_sources::Dist::Uniform)
            && (problem.grid.cols as usize) < WHOLE_PANEL_COLS;
        Self::reading(
            problem.grid,
            problem.rank_panels.as_deref(),
            world,
            reads.as_ref(),
            solves,
        )
    }

    fn reading(
        grid: ChunkGrid,
        rank_panels: Option<&[usize]>,
        world: &rankwise_exec::World,
        reads: Option<&ReadBuffers>,
        solves: bool,
    ) -> Result<SvdPlan, LinalgError> {
        let placement = match rank_panels {
            Some(counts) => Placement::by_rank(grid.panels(), counts, world)?,
            None => Placement::compute(grid.panels(), world),
        };
        let n = grid.cols as usize;
        let k = grid.rows.min(grid.cols) as usize;
        let chunk = grid.chunk_rows.min(grid.rows) as usize;
        // Per thread: the panel's Q blocks and its rows of U (pass 2), one row block, the
        // stacked block R factors and their Q, each block's last Cholesky QR factor, and
        // one Cholesky QR's workspace (its Gram matrix, factor, inverse, condition work).
        // A panel factored whole is one block.
        let blocks = if n >= WHOLE_PANEL_COLS {
            1
        } else {
            chunk.div_ceil(block_rows(n))
        };
        let block = block_rows(n).min(chunk.max(1));
        let per_thread = (2 * chunk * n + block * n + 3 * blocks * n * n + 4 * n * n) as u64 * 8;
        let tree = Tree::new(&placement.owner);
        let mut memory = Vec::new();
        let mut keeps_solves = Vec::new();
        for a in &placement.assignments {
            let shape = &world.ranks[a.rank][a.actor];
            // GPU actors factor on their devices, which keep `Q`.
            let solves = solves && shape.kind == rankwise_exec::ActorKind::Cpu;
            keeps_solves.push(solves);
            // The tree's node Q factors (`2n × n` each) are kept where they were formed
            // until U comes down: one node per panel combined on this rank, and one per
            // level of the tree for what other ranks send. Counted on each actor, spread
            // over its threads as the rest of the workspace is.
            let nodes = (a.panels.len() + tree.height() + 1) as u64;
            let node_qs = nodes.saturating_mul(16 * (n * n) as u64);
            // Every panel's R factor (`min(rows, n) × n`) is held from pass 1 until the
            // tree combines it. Counted beside the nodes, not within them: the R factors
            // are allocated on the worker threads and the nodes on the tree's thread, in
            // another malloc arena, so the nodes do not reuse what the R factors free
            // (measured: 161 panels of 1000 × 259 peaked 44 MiB above a plan without
            // them, about the 82 MiB of R factors less what the arena gave back).
            let leaves: u64 = a
                .panels
                .clone()
                .map(|p| {
                    let r = grid.panel_rows(p);
                    (r.end - r.start).min(grid.cols) * grid.cols * 8
                })
                .sum();
            let per_thread = per_thread + (node_qs + leaves).div_ceil(shape.threads.max(1) as u64);
            let resident: u64 = a
                .panels
                .clone()
                .map(|p| {
                    let r = grid.panel_rows(p);
                    let h = r.end - r.start;
                    if solves {
                        // Each block's solves (two after a shifted step) and its rows of
                        // the stacked Q, each n × n.
                        h.div_ceil(block_rows(n) as u64) * (3 * n * n) as u64 * 8
                    } else {
                        h * h.min(grid.cols) * 8
                    }
                })
                .sum();
            memory.push(match reads {
                Some(r) => MemoryPlan::decide_reading(
                    shape.memory,
                    per_thread,
                    shape.threads,
                    resident,
                    r,
                )?,
                None => MemoryPlan::decide(shape.memory, per_thread, shape.threads, resident)?,
            });
        }
        let messages_per_sweep = (0..world.ranks.len())
            .map(|r| tree.messages_sent_by(r))
            .collect();
        Ok(SvdPlan {
            grid,
            ranks: world.ranks.len(),
            placement,
            memory,
            messages_per_sweep,
            words_up: 2 + k * n,
            words_down: 2 + k * k,
            keeps_solves,
        })
    }
}

/// Accuracy figures of a finished SVD.
#[derive(Clone, Debug, Serialize)]
pub struct CheckReport {
    /// ‖A − UΣVᵀ‖_F / ‖A‖_F.
    pub relative_residual: f64,
    /// max |UᵀU − I|.
    pub u_orthogonality: f64,
    /// max |VᵀV − I|.
    pub v_orthogonality: f64,
}

/// Wall time of one phase on this rank, and what its transport carried meanwhile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseTiming {
    /// Phase name.
    pub phase: String,
    /// Seconds.
    pub seconds: f64,
    /// Messages and bytes this rank sent and received in the phase, and the seconds its
    /// receives waited.
    #[serde(default)]
    pub comm: rankwise_transports::CommCounts,
    /// Floating-point operations of the phase's products with the whole matrix (all ranks
    /// together; 0 for a phase that does not multiply the matrix): its rate against the
    /// machine's GEMM rate ([`crate::gemm_peak`]) is its share of the machine limit.
    #[serde(default)]
    pub flops: f64,
    /// Bytes of matrix values this rank produced in the phase (generated, or read and
    /// decoded), as float64: with the machine's production rate
    /// ([`crate::production_peak`]), the rest of the phase's machine limit.
    #[serde(default)]
    pub produced_bytes: u64,
}

impl PhaseTiming {
    /// The phase with `flops` floating-point operations of products with the matrix.
    pub(crate) fn with_flops(mut self, flops: f64) -> PhaseTiming {
        self.flops = flops;
        self
    }

    /// The phase with `bytes` of matrix values produced on this rank.
    pub(crate) fn with_produced(mut self, bytes: u64) -> PhaseTiming {
        self.produced_bytes = bytes;
        self
    }

    /// Its products' rate, in floating-point operations per second (None without any).
    pub fn flop_rate(&self) -> Option<f64> {
        (self.flops > 0.0 && self.seconds > 0.0).then(|| self.flops / self.seconds)
    }
}

/// The start of a phase: its time and the transport's counts then.
pub(crate) struct Clock<'a> {
    rt: &'a Runtime,
    t: Instant,
    c: rankwise_transports::CommCounts,
}

impl<'a> Clock<'a> {
    /// Starts timing a phase on `rt`.
    pub(crate) fn start(rt: &'a Runtime) -> Clock<'a> {
        Clock {
            rt,
            t: Instant::now(),
            c: rt.comm_counts(),
        }
    }

    /// Seconds and traffic since the start.
    pub(crate) fn lap(&self) -> (f64, rankwise_transports::CommCounts) {
        (
            self.t.elapsed().as_secs_f64(),
            self.rt.comm_counts().since(&self.c),
        )
    }

    /// The phase `name`, from the start until now.
    pub(crate) fn phase(&self, name: &str) -> PhaseTiming {
        let (seconds, comm) = self.lap();
        PhaseTiming {
            phase: name.to_string(),
            seconds,
            comm,
            flops: 0.0,
            produced_bytes: 0,
        }
    }
}

/// The result on one rank.
#[derive(Clone, Debug)]
pub struct SvdResult {
    /// Singular values, descending (`k = min(m, n)` of them).
    pub s: Vec<f64>,
    /// The replicated factor: `Vᵀ` (`k × n`) for a tall matrix; for a transposed problem this
    /// is `Uᵀ` of the user's matrix.
    pub wt: Array2<f64>,
    /// True when the problem was solved through the transpose.
    pub transposed: bool,
    /// Accuracy checks, when asked for.
    pub check: Option<CheckReport>,
    /// Phase timings on this rank.
    pub timings: Vec<PhaseTiming>,
    /// The plan that ran.
    pub plan: SvdPlan,
    /// Bytes of matrix values produced from the source on this rank, all passes.
    pub bytes_generated: u64,
    /// What this rank read from storage (zero for generated and in-memory sources).
    pub read: ReadTotals,
    /// Panel QRs this rank computed on its GPUs by cuSOLVER, both passes.
    pub gpu_qrs: u64,
    /// Of those, the panels its GPUs also generated (generated uniform matrices): they
    /// never existed on the host.
    pub gpu_generated: u64,
    /// Tree-node QRs (of stacked R factors) this rank computed on a GPU.
    pub gpu_node_qrs: u64,
}

/// Columns from which a tree node's QR (`2n × n`) goes to a GPU of the rank: below them
/// the copies and the launches cost more than the host's LAPACK takes.
pub(crate) const DEVICE_NODE_COLS: usize = 512;

/// Work done on GPUs, counted across an actor's threads.
#[derive(Default)]
struct GpuWork {
    qrs: AtomicU64,
    generated: AtomicU64,
}

/// Factors panel `p` (`rows`) where it belongs: a GPU actor with cuSOLVER generates a
/// generated uniform panel on its device and factors it there, and factors any other
/// panel there after producing it on the host; everything else is factored on the host.
#[allow(clippy::too_many_arguments)]
fn factor_on_actor(
    dev: Option<&GpuDevice>,
    on_device: Option<&DeviceSource>,
    source: &dyn PanelSource,
    p: usize,
    rows: Range<u64>,
    decoded: Option<&PanelBuffer>,
    keep: Keep,
    work: &GpuWork,
) -> Result<PanelFactor, LinalgError> {
    let n = source.shape().1 as usize;
    if let (Some(d), Some(src)) = (dev, on_device) {
        if let Some(f) = generated_factor(d, src, rows.clone(), n)? {
            work.qrs.fetch_add(1, Ordering::Relaxed);
            work.generated.fetch_add(1, Ordering::Relaxed);
            return Ok(f);
        }
    }
    let h = (rows.end - rows.start) as usize;
    let (f, on_gpu) = factor_panel(dev, h, n, keep, fill_from(source, p, rows.clone(), decoded))?;
    if on_gpu {
        work.qrs.fetch_add(1, Ordering::Relaxed);
    }
    // The QR is scaled (LAPACK's norms do not overflow), so a non-finite R is a
    // non-finite value of the panel.
    if !crate::finite::all_finite(f.r.view()) {
        return Err(crate::finite::diagnose(source, p, rows, false));
    }
    Ok(f)
}

struct Pass1 {
    r: Array2<f64>,
    kept: Option<PanelFactor>,
}

/// Fills row blocks of panel `panel` (`rows`): from the read-ahead's decoded panel, from
/// the whole panel read once here (storage-backed sources), or from the source directly.
pub(crate) fn fill_from<'a>(
    source: &'a dyn PanelSource,
    panel: usize,
    rows: Range<u64>,
    decoded: Option<&'a PanelBuffer>,
) -> impl FnMut(Range<usize>, ndarray::ArrayViewMut2<'_, f64>) -> Result<(), LinalgError> + 'a {
    let mut local: Option<PanelBuffer> = None;
    let n = source.shape().1 as usize;
    move |r, out| {
        let g = rows.start + r.start as u64..rows.start + r.end as u64;
        let err = |e: rankwise_sources::SourceError| LinalgError::Panel {
            panel,
            rows: format!("{}..{}", g.start, g.end),
            message: e.to_string(),
        };
        let buf = match (decoded, source.stored()) {
            (Some(b), _) => b,
            (None, Some(st)) => match &mut local {
                Some(b) => &*b,
                slot @ None => {
                    let mut b = PanelBuffer::default();
                    st.read_panel(rows.clone(), &mut b).map_err(err)?;
                    &*slot.insert(b)
                }
            },
            (None, None) => return source.fill(g.clone(), out).map_err(err),
        };
        buf.tile_f64(r, 0..n, out);
        Ok(())
    }
}

/// A panel reader for the read-aheads, for sources read from storage.
fn stored_reads(source: &Arc<dyn PanelSource>) -> Option<StoredReads> {
    crate::tiles::Operand::Dense(Arc::clone(source)).stored_reads()
}

/// Computes the SVD. A collective call: every rank of the runtime makes it with the same
/// problem and options. `sink` receives this rank's panels of the distributed factor.
///
/// The plan (every rank refuses the same bad grid or budget), then the passes: pass 1
/// factors every panel, the tree reduces their R factors, the root's R is decomposed and
/// its `U_R` pushed down, and pass 2 forms the rows of `U` (and the checks'); then the
/// result.
pub fn svd(
    rt: &Runtime,
    problem: &SvdProblem,
    options: &SvdOptions,
    sink: Option<FactorSink>,
) -> Result<SvdResult, LinalgError> {
    let run = SvdRun::start(rt, problem)?;
    let tree = Tree::new(&run.plan.placement.owner);
    let mut timings = Vec::new();
    let (leaves, kept) = run.factor_panels(&mut timings)?;
    let root = run.reduce_and_decompose(&tree, leaves, &mut timings)?;
    let sums = run.form_u(
        root.u_r,
        kept,
        &root.s,
        &root.wt,
        options.check,
        sink,
        &mut timings,
    )?;
    let check = match sums {
        Some(sums) => {
            let t = Clock::start(rt);
            let report = check_report(&tree, rt.comm(), sums, &root.wt, run.k)?;
            timings.push(t.phase("checks: reduce"));
            Some(report)
        }
        None => None,
    };
    Ok(SvdResult {
        s: root.s,
        wt: root.wt,
        transposed: problem.transposed,
        check,
        timings,
        bytes_generated: run.bytes_generated(options.check),
        read: run.reading.totals(),
        gpu_qrs: run.work.qrs.load(Ordering::Relaxed),
        gpu_generated: run.work.generated.load(Ordering::Relaxed),
        gpu_node_qrs: root.gpu_node_qrs,
        plan: run.plan,
    })
}

/// This rank's part of an exact SVD, as planned: its actors and their panels, and what
/// their passes share.
struct SvdRun<'a> {
    rt: &'a Runtime,
    problem: &'a SvdProblem,
    plan: SvdPlan,
    /// This rank's actors: index, panels, residency, and whether they keep solves.
    my_actors: Vec<(usize, Range<usize>, Residency, bool)>,
    /// Each actor's read-ahead buffers.
    read_buffers: Vec<usize>,
    reading: Arc<Reading>,
    reader: Option<StoredReads>,
    /// Each actor's GPU, if it is a GPU actor.
    gpus: Vec<Option<Arc<GpuDevice>>>,
    work: Arc<GpuWork>,
    /// The source as a device produces it, when one can.
    on_device: Option<DeviceSource>,
    n: usize,
    k: usize,
}

/// The root's decomposition, broadcast: every singular value, `Wᵀ`, and each of this
/// rank's panels' block of `U_R`.
struct Decomposed {
    s: Vec<f64>,
    wt: Array2<f64>,
    u_r: BTreeMap<usize, Array2<f64>>,
    gpu_node_qrs: u64,
}

impl<'a> SvdRun<'a> {
    /// The plan, and this rank's part of it.
    fn start(rt: &'a Runtime, problem: &'a SvdProblem) -> Result<Self, LinalgError> {
        let me = rt.comm().rank();
        let grid = problem.grid;
        let (m, n) = problem.source.shape();
        if (m, n) != (grid.rows, grid.cols) {
            return Err(LinalgError::Option {
                parameter: "grid",
                message: format!(
                    "grid {}×{} does not match the source's {m}×{n}",
                    grid.rows, grid.cols
                ),
            });
        }
        let plan = SvdPlan::for_problem(problem, rt.world())?;
        let n = n as usize;
        let mine = || {
            plan.placement
                .assignments
                .iter()
                .zip(&plan.memory)
                .filter(|(a, _)| a.rank == me)
        };
        let my_actors = plan
            .placement
            .assignments
            .iter()
            .zip(&plan.memory)
            .zip(&plan.keeps_solves)
            .filter(|((a, _), _)| a.rank == me)
            .map(|((a, mp), &solves)| (a.actor, a.panels.clone(), mp.residency, solves))
            .collect();
        let read_buffers = mine().map(|(_, mp)| mp.read_buffers).collect();
        // GPU actors factor their panels on their devices where cuSOLVER was found, and
        // generate them there when the device can.
        let source = crate::tiles::Operand::Dense(Arc::clone(&problem.source));
        Ok(SvdRun {
            rt,
            problem,
            my_actors,
            read_buffers,
            reading: Arc::new(Reading::default()),
            reader: stored_reads(&problem.source),
            gpus: rt.actors().iter().map(|a| a.gpu().cloned()).collect(),
            work: Arc::new(GpuWork::default()),
            on_device: DeviceSource::of(&source),
            n,
            k: (m as usize).min(n),
            plan,
        })
    }

    /// A pass's read-aheads of the panels in `order` (each actor's, in its order).
    fn reads(&self, order: Vec<Vec<(usize, Range<u64>)>>) -> Result<PassReads, LinalgError> {
        PassReads::start(
            self.rt,
            self.reader.clone(),
            order,
            &self.read_buffers,
            Arc::clone(&self.reading),
            None,
        )
    }

    /// Bytes of this rank's panels: of all its actors, or of those that produce their
    /// panels again in pass 2 (they regenerate, or kept only the solves to replay).
    fn panel_bytes(&self, only_regenerated: bool) -> u64 {
        let grid = self.problem.grid;
        self.my_actors
            .iter()
            .filter(|a| !only_regenerated || a.2 == Residency::Regenerated || a.3)
            .flat_map(|a| a.1.clone())
            .map(|p| {
                let r = grid.panel_rows(p);
                (r.end - r.start) * self.n as u64 * 8
            })
            .sum()
    }

    /// Bytes of matrix values produced: every panel in pass 1; in pass 2 the panels that
    /// were not kept, and every panel once more for the checks.
    fn bytes_generated(&self, check: bool) -> u64 {
        let all = self.panel_bytes(false);
        all + self.panel_bytes(true) + if check { all } else { 0 }
    }

    /// Pass 1: every panel factored where its actor computes (kept where it is resident);
    /// the panels' R factors.
    #[allow(clippy::type_complexity)]
    fn factor_panels(
        &self,
        timings: &mut Vec<PhaseTiming>,
    ) -> Result<(BTreeMap<usize, Array2<f64>>, HashMap<usize, PanelFactor>), LinalgError> {
        let (rt, grid) = (self.rt, self.problem.grid);
        let t = Clock::start(rt);
        let inputs: Vec<Vec<usize>> = self
            .my_actors
            .iter()
            .map(|a| a.1.clone().collect())
            .collect();
        let source = Arc::clone(&self.problem.source);
        let (gpus, work, on_device) = (
            self.gpus.clone(),
            Arc::clone(&self.work),
            self.on_device.clone(),
        );
        let res: Vec<Residency> = self.my_actors.iter().map(|a| a.2).collect();
        let solves: Vec<bool> = self.my_actors.iter().map(|a| a.3).collect();
        let order = inputs
            .iter()
            .map(|ps| ps.iter().map(|&p| (p, grid.panel_rows(p))).collect())
            .collect();
        let reads = self.reads(order)?;
        rt.progress().begin_run(2);
        rt.progress().start_pass();
        let pass1 = rt.map(
            inputs.clone(),
            move |actor, p| -> Result<Pass1, LinalgError> {
                let rows = grid.panel_rows(p);
                let lease = reads.take(actor, p, &rows)?;
                let keep = match res[actor] {
                    Residency::Resident if solves[actor] => Keep::Solves,
                    Residency::Resident => Keep::Kept,
                    _ => Keep::Scratch,
                };
                let f = factor_on_actor(
                    gpus.get(actor).and_then(Option::as_deref),
                    on_device.as_ref(),
                    source.as_ref(),
                    p,
                    rows,
                    lease.as_deref(),
                    keep,
                    &work,
                )?;
                let r = f.r.clone();
                let kept = match keep {
                    Keep::Kept | Keep::Solves => Some(f),
                    Keep::Scratch => {
                        f.recycle();
                        None
                    }
                };
                Ok(Pass1 { r, kept })
            },
        )?;
        let mut leaves = BTreeMap::new();
        let mut kept: HashMap<usize, PanelFactor> = HashMap::new();
        for (panels, results) in inputs.iter().zip(pass1) {
            for (&p, r) in panels.iter().zip(results) {
                let r = r?;
                leaves.insert(p, r.r);
                if let Some(f) = r.kept {
                    kept.insert(p, f);
                }
            }
        }
        // The least a local factorization multiplies: one Cholesky QR step's Gram matrix
        // (its upper triangle with the diagonal), of the whole matrix.
        let (m, n) = self.problem.source.shape();
        timings.push(
            t.phase("pass 1: produce panels + panel QR")
                .with_flops(m as f64 * n as f64 * (n + 1) as f64)
                .with_produced(self.panel_bytes(false)),
        );
        Ok((leaves, kept))
    }

    /// The tree: R factors up (node Q factors kept where they were formed), the SVD of the
    /// root's R on its owner, broadcast, and `U_R` pushed down to the panels.
    fn reduce_and_decompose(
        &self,
        tree: &Tree<'_>,
        leaves: BTreeMap<usize, Array2<f64>>,
        timings: &mut Vec<PhaseTiming>,
    ) -> Result<Decomposed, LinalgError> {
        let (rt, comm, n, k) = (self.rt, self.rt.comm(), self.n, self.k);
        let t = Clock::start(rt);
        let mut node_q: HashMap<(usize, usize), NodeQ> = HashMap::new();
        // The rank's nodes go to its first GPU with cuSOLVER when they are wide enough.
        let node_gpu = self
            .gpus
            .iter()
            .flatten()
            .find(|d| d.solver().is_some())
            .filter(|_| n >= DEVICE_NODE_COLS);
        let mut gpu_node_qrs = 0u64;
        let root = tree.up(comm, leaves, |level, j, a, b| {
            let ka = a.nrows();
            // Two triangles, the left one square: the structured QR of the stacked pair,
            // which leaves the zeros below both triangles alone (a tenth of the dense
            // QR's flops). A short panel's factor, or a GPU node, takes the dense QR.
            if node_gpu.is_none() && ka == n && b.nrows() > 0 && b.nrows() <= n {
                let (q, r) = stacked_triangles_qr(a.view(), b.view())?;
                node_q.insert((level, j), NodeQ::Stacked(q));
                return Ok(r);
            }
            let stacked = stack_rows(&[a.view(), b.view()]);
            let device = match node_gpu {
                Some(d) => panel_qr(d, stacked.view())?,
                None => None,
            };
            let (q, r) = match device {
                Some((q, r)) => {
                    gpu_node_qrs += 1;
                    let shape = (stacked.nrows(), r.nrows()).f();
                    let q = Array2::from_shape_vec(shape, q)
                        .map_err(|e| LinalgError::Lapack(format!("node Q: {e}")))?;
                    (q, r)
                }
                None => qr(stacked)?,
            };
            node_q.insert((level, j), NodeQ::Explicit(ka, q));
            Ok(r)
        })?;
        timings.push(t.phase("tree: reduce R factors"));

        // SVD of the root's R on its owner, broadcast to all.
        let t = Clock::start(rt);
        let root_owner = tree.root_owner();
        let mut packed = Vec::new();
        let mut u_r = None;
        if comm.rank() == root_owner {
            let r = root.ok_or(LinalgError::Tree {
                level: tree.height(),
                node: 0,
            })?;
            let (u, s, vt) = small_svd(r.view())?;
            packed.extend(s.iter());
            packed.extend(encode(&vt));
            u_r = Some(u);
        }
        comm.broadcast_f64(root_owner, &mut packed)?;
        if packed.len() < k {
            return Err(LinalgError::Message { peer: root_owner });
        }
        let s = packed[..k].to_vec();
        let wt = decode(root_owner, &packed[k..])?;
        timings.push(t.phase("SVD of R + broadcast"));

        // Push U_R down the tree.
        let t = Clock::start(rt);
        let u_r = tree.down(comm, u_r, |level, j, c| {
            match node_q
                .remove(&(level, j))
                .ok_or(LinalgError::Tree { level, node: j })?
            {
                NodeQ::Stacked(q) => q.apply(c.view()),
                NodeQ::Explicit(ka, q) => {
                    Ok((q.slice(s![..ka, ..]).dot(&c), q.slice(s![ka.., ..]).dot(&c)))
                }
            }
        })?;
        timings.push(t.phase("tree: push down U_R"));
        Ok(Decomposed {
            s,
            wt,
            u_r,
            gpu_node_qrs,
        })
    }

    /// Pass 2: each panel's rows of `U` (its factor, kept or made again, applied to its
    /// block of `U_R`) to `sink`, and with `check` the panel's check sums.
    #[allow(clippy::too_many_arguments)]
    fn form_u(
        &self,
        mut u_r: BTreeMap<usize, Array2<f64>>,
        mut kept: HashMap<usize, PanelFactor>,
        s: &[f64],
        wt: &Array2<f64>,
        check: bool,
        sink: Option<FactorSink>,
        timings: &mut Vec<PhaseTiming>,
    ) -> Result<Option<BTreeMap<usize, PanelChecks>>, LinalgError> {
        let (rt, grid, k) = (self.rt, self.problem.grid, self.k);
        let t = Clock::start(rt);
        let mut inputs = Vec::with_capacity(self.my_actors.len());
        for a in &self.my_actors {
            let mut items = Vec::new();
            for p in a.1.clone() {
                let ci = u_r
                    .remove(&p)
                    .ok_or(LinalgError::Tree { level: 0, node: p })?;
                items.push((p, ci, kept.remove(&p)));
            }
            inputs.push(items);
        }
        let source = Arc::clone(&self.problem.source);
        let (gpus, work, on_device) = (
            self.gpus.clone(),
            Arc::clone(&self.work),
            self.on_device.clone(),
        );
        let s_arc = Arc::new(s.to_vec());
        let wt_arc = Arc::new(wt.clone());
        // Pass 2 reads the panels it must factor again, and every panel for the checks.
        let order = inputs
            .iter()
            .map(|items| {
                items
                    .iter()
                    .filter(|(_, _, kept)| check || kept.as_ref().is_none_or(PanelFactor::replays))
                    .map(|(p, _, _)| (*p, grid.panel_rows(*p)))
                    .collect()
            })
            .collect();
        let reads = self.reads(order)?;
        rt.progress().start_pass();
        let pass2 = rt.map(
            inputs,
            move |actor,
                  (p, ci, kept): (usize, Array2<f64>, Option<PanelFactor>)|
                  -> Result<PanelChecks, LinalgError> {
                let rows = grid.panel_rows(p);
                let lease = if check || kept.as_ref().is_none_or(PanelFactor::replays) {
                    reads.take(actor, p, &rows)?
                } else {
                    None
                };
                let h = (rows.end - rows.start) as usize;
                let factor = match kept {
                    Some(f) => f,
                    None => factor_on_actor(
                        gpus.get(actor).and_then(Option::as_deref),
                        on_device.as_ref(),
                        source.as_ref(),
                        p,
                        rows.clone(),
                        lease.as_deref(),
                        Keep::Scratch,
                        &work,
                    )?,
                };
                // `apply_into` writes every value (its products have beta = 0), so a reused
                // buffer is not zeroed first.
                let mut ubuf = take_scratch_for_overwrite(h * k);
                let mut u =
                    ArrayViewMut2::from_shape((h, k).f(), &mut ubuf[..]).expect("U block shape");
                if factor.replays() {
                    let fill = fill_from(source.as_ref(), p, rows.clone(), lease.as_deref());
                    factor.replay_into(fill, ci.view(), u.view_mut())?;
                } else {
                    factor.apply_into(ci.view(), u.view_mut());
                }
                factor.recycle();
                let u = u.view();
                if let Some(sink) = &sink {
                    if let Err(message) = sink(p, rows.clone(), u.view()) {
                        give_scratch(ubuf);
                        return Err(LinalgError::Sink { panel: p, message });
                    }
                }
                let sums = if check {
                    panel_checks(
                        source.as_ref(),
                        p,
                        rows,
                        lease.as_deref(),
                        u,
                        &s_arc,
                        &wt_arc,
                    )?
                } else {
                    PanelChecks::default()
                };
                give_scratch(ubuf);
                Ok(sums)
            },
        )?;
        let mut sums = BTreeMap::new();
        for (a, results) in self.my_actors.iter().zip(pass2) {
            for (p, r) in a.1.clone().zip(results) {
                sums.insert(p, r?);
            }
        }
        // U = Q̃·c, and with the checks the panel's A·V and UᵀU besides.
        let (m, n) = self.problem.source.shape();
        let (m, n, kf) = (m as f64, n as f64, k as f64);
        let flops = 2.0 * m * n * kf + if check { 2.0 * m * kf * (n + kf) } else { 0.0 };
        let produced = self.panel_bytes(true) + if check { self.panel_bytes(false) } else { 0 };
        timings.push(
            t.phase(if check {
                "pass 2: form U + checks"
            } else {
                "pass 2: form U"
            })
            .with_flops(flops)
            .with_produced(produced),
        );
        Ok(check.then_some(sums))
    }
}

/// The checks' report from every panel's sums: ‖A − UΣVᵀ‖_F/‖A‖_F and how far `UᵀU` and
/// `VᵀV` are from the identity.
fn check_report(
    tree: &Tree<'_>,
    comm: &dyn Comm,
    sums: BTreeMap<usize, PanelChecks>,
    wt: &Array2<f64>,
    k: usize,
) -> Result<CheckReport, LinalgError> {
    let total = PanelChecks::sum_all(tree, comm, sums, k)?;
    let rel = if total.norm > 0.0 {
        (total.residual / total.norm).sqrt()
    } else {
        total.residual.sqrt()
    };
    let mut u_orth = 0.0f64;
    for ((i, j), v) in total.utu.indexed_iter() {
        u_orth = u_orth.max((v - if i == j { 1.0 } else { 0.0 }).abs());
    }
    let vtv = wt.dot(&wt.t());
    let mut v_orth = 0.0f64;
    for ((i, j), v) in vtv.indexed_iter() {
        v_orth = v_orth.max((v - if i == j { 1.0 } else { 0.0 }).abs());
    }
    Ok(CheckReport {
        relative_residual: rel,
        u_orthogonality: u_orth,
        v_orthogonality: v_orth,
    })
}

/// What the checks measure of a panel, and their sum over every panel of every rank (the
/// tree sums the encodings, which add field by field).
#[derive(Debug, Default)]
struct PanelChecks {
    /// ‖A_i − U_i Σ Wᵀ‖²_F.
    residual: f64,
    /// ‖A_i‖²_F.
    norm: f64,
    /// U_iᵀU_i (`k × k`).
    utu: Array2<f64>,
}

impl PanelChecks {
    /// The `1 × (2 + k²)` row the tree sums.
    fn encode(&self, k: usize) -> Array2<f64> {
        let mut row = Array2::zeros((1, 2 + k * k));
        row[[0, 0]] = self.residual;
        row[[0, 1]] = self.norm;
        for (i, v) in self.utu.iter().enumerate() {
            row[[0, 2 + i]] = *v;
        }
        row
    }

    /// The checks summed over every panel.
    fn sum_all(
        tree: &Tree,
        comm: &dyn Comm,
        checks: BTreeMap<usize, PanelChecks>,
        k: usize,
    ) -> Result<PanelChecks, LinalgError> {
        let rows = checks.into_iter().map(|(p, c)| (p, c.encode(k))).collect();
        let t = tree.sum_all(comm, rows, (1, 2 + k * k))?;
        let utu = Array2::from_shape_vec((k, k), t.row(0).slice(s![2..]).to_vec()).expect("k × k");
        Ok(PanelChecks {
            residual: t[[0, 0]],
            norm: t[[0, 1]],
            utu,
        })
    }
}

/// ‖A_i − U_i Σ Wᵀ‖², ‖A_i‖² and U_iᵀU_i of one panel, one cache block of A at a time.
fn panel_checks(
    source: &dyn PanelSource,
    p: usize,
    rows: Range<u64>,
    decoded: Option<&PanelBuffer>,
    u: ArrayView2<'_, f64>,
    s: &[f64],
    wt: &Array2<f64>,
) -> Result<PanelChecks, LinalgError> {
    let (h, k) = u.dim();
    let n = wt.ncols();
    let sw = Array2::from_shape_fn((k, n), |(i, j)| s[i] * wt[[i, j]]);
    let b = block_rows(n);
    let (mut res, mut norm) = (0.0f64, 0.0f64);
    let mut fill = fill_from(source, p, rows, decoded);
    let mut a = Array2::<f64>::zeros((b.min(h), n).f());
    let mut start = 0;
    while start < h {
        let end = (start + b).min(h);
        let mut blk = a.slice_mut(s![..end - start, ..]);
        fill(start..end, blk.view_mut())?;
        norm += blk.iter().map(|x| x * x).sum::<f64>();
        ndarray::linalg::general_mat_mul(-1.0, &u.slice(s![start..end, ..]), &sw, 1.0, &mut blk);
        res += blk.iter().map(|x| x * x).sum::<f64>();
        start = end;
    }
    Ok(PanelChecks {
        residual: res,
        norm,
        utu: u.t().dot(&u).as_standard_layout().into_owned(),
    })
}

/// A tree node's `Q`, kept from the way up for the way down.
enum NodeQ {
    /// The structured QR of two stacked triangles.
    Stacked(StackedQ),
    /// A dense QR's explicit `Q`, with the rows of the left child.
    Explicit(usize, Array2<f64>),
}
