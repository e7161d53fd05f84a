//! The exact SVD of a tall-and-skinny matrix (short-and-fat through the transpose).
//!
//! Pass 1: every actor factors its panels (`A_i = Q_i R_i`, [`PanelFactor`]). The R
//! factors are reduced up the fixed [`Tree`] (`[R_a; R_b] = Q_node R`), the root's R is
//! decomposed on its owner (`R = U_R Σ Vᵀ`) and broadcast, and `U_R` is pushed down the
//! tree through the stored node Q factors. Pass 2: every actor forms its rows of U as
//! `Q_i C_i`, either from the Q factors it kept (resident) or by factoring the panel again
//! (regenerated): both give the same bits. Only R factors (n×n) and C blocks (n×k) travel.
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
use rankwise_sources::ReadFn;
use rankwise_sources::{PanelBuffer, PanelSource};
use serde::{Deserialize, Serialize};

use crate::gpu::{factor_panel, generated_factor, panel_qr, DeviceSource, GpuDevice};
use crate::kernels::{
    block_rows, give_scratch, qr, small_svd, stack_rows, take_scratch, Keep, PanelFactor,
    WHOLE_PANEL_COLS,
};
use crate::reads::{read_buffers, PassReads, ReadTotals, Reading};
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
}

impl SvdPlan {
    /// Plans `grid` over the runtime's world. Pure: every rank computes the same plan.
    pub fn new(grid: ChunkGrid, world: &rankwise_exec::World) -> Result<SvdPlan, LinalgError> {
        Self::reading(grid, None, world, None)
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
        Self::reading(
            problem.grid,
            problem.rank_panels.as_deref(),
            world,
            reads.as_ref(),
        )
    }

    fn reading(
        grid: ChunkGrid,
        rank_panels: Option<&[usize]>,
        world: &rankwise_exec::World,
        reads: Option<&ReadBuffers>,
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
        for a in &placement.assignments {
            let shape = &world.ranks[a.rank][a.actor];
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
                    (r.end - r.start) * (r.end - r.start).min(grid.cols) * 8
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
fn fill_from<'a>(
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
fn read_fn(source: &Arc<dyn PanelSource>) -> Option<Arc<ReadFn>> {
    crate::tiles::Operand::Dense(Arc::clone(source)).read_fn()
}

/// Computes the SVD. A collective call: every rank of the runtime makes it with the same
/// problem and options. `sink` receives this rank's panels of the distributed factor.
pub fn svd(
    rt: &Runtime,
    problem: &SvdProblem,
    options: &SvdOptions,
    sink: Option<FactorSink>,
) -> Result<SvdResult, LinalgError> {
    let comm = rt.comm();
    let me = comm.rank();
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
    let k = (m as usize).min(n);
    let my_actors: Vec<(usize, Range<usize>, Residency)> = plan
        .placement
        .assignments
        .iter()
        .zip(&plan.memory)
        .filter(|(a, _)| a.rank == me)
        .map(|(a, mp)| (a.actor, a.panels.clone(), mp.residency))
        .collect();
    let residency: Vec<Residency> = my_actors.iter().map(|a| a.2).collect();
    let read_buffers: Vec<usize> = plan
        .placement
        .assignments
        .iter()
        .zip(&plan.memory)
        .filter(|(a, _)| a.rank == me)
        .map(|(_, mp)| mp.read_buffers)
        .collect();
    let reading = Arc::new(Reading::default());
    let reader = read_fn(&problem.source);
    let mut timings = Vec::new();
    let mut bytes_generated = 0u64;
    // Bytes of this rank's panels: of all its actors, or of those that regenerate.
    let panel_bytes = |only_regenerated: bool| -> u64 {
        my_actors
            .iter()
            .filter(|a| !only_regenerated || a.2 == Residency::Regenerated)
            .flat_map(|a| a.1.clone())
            .map(|p| {
                let r = grid.panel_rows(p);
                (r.end - r.start) * n as u64 * 8
            })
            .sum()
    };
    let my_panel_bytes = panel_bytes(false);

    // GPU actors factor their panels on their devices where cuSOLVER was found, and
    // generate them there when the device can.
    let gpus_all: Vec<_> = rt.actors().iter().map(|a| a.gpu().cloned()).collect();
    let work = Arc::new(GpuWork::default());
    let on_device = DeviceSource::of(&crate::tiles::Operand::Dense(Arc::clone(&problem.source)));

    // Pass 1: panel factors.
    let t = Clock::start(rt);
    let inputs: Vec<Vec<usize>> = my_actors.iter().map(|a| a.1.clone().collect()).collect();
    let source = Arc::clone(&problem.source);
    let (gpus, work1, on_device1) = (gpus_all.clone(), Arc::clone(&work), on_device.clone());
    let res = residency.clone();
    let order = inputs
        .iter()
        .map(|ps| ps.iter().map(|&p| (p, grid.panel_rows(p))).collect())
        .collect();
    let reads = PassReads::start(
        rt,
        reader.clone(),
        order,
        &read_buffers,
        Arc::clone(&reading),
        None,
    )?;
    rt.progress().set_max_passes(2);
    rt.progress().start_pass();
    let pass1 = rt.map(
        inputs.clone(),
        move |actor, p| -> Result<Pass1, LinalgError> {
            let rows = grid.panel_rows(p);
            let lease = reads.take(actor, p, &rows)?;
            let keep = if res[actor] == Residency::Resident {
                Keep::Kept
            } else {
                Keep::Scratch
            };
            let f = factor_on_actor(
                gpus.get(actor).and_then(Option::as_deref),
                on_device1.as_ref(),
                source.as_ref(),
                p,
                rows,
                lease.as_deref(),
                keep,
                &work1,
            )?;
            let r = f.r.clone();
            let kept = match keep {
                Keep::Kept => Some(f),
                Keep::Scratch => {
                    f.recycle();
                    None
                }
            };
            Ok(Pass1 { r, kept })
        },
    )?;
    bytes_generated += my_panel_bytes;
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
    timings.push(t.phase("pass 1: produce panels + panel QR"));

    // The tree: R factors up, node Q factors kept where they were formed.
    let t = Clock::start(rt);
    let tree = Tree::new(&plan.placement.owner);
    let mut node_q: HashMap<(usize, usize), (usize, Array2<f64>)> = HashMap::new();
    // The rank's nodes go to its first GPU with cuSOLVER when they are wide enough.
    let node_gpu = gpus_all
        .iter()
        .flatten()
        .find(|d| d.solver().is_some())
        .filter(|_| n >= DEVICE_NODE_COLS);
    let mut gpu_node_qrs = 0u64;
    let root = tree.up(comm, leaves, |level, j, a, b| {
        let ka = a.nrows();
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
        node_q.insert((level, j), (ka, q));
        Ok(r)
    })?;
    timings.push(t.phase("tree: reduce R factors"));

    // SVD of the root's R on its owner, broadcast to all.
    let t = Clock::start(rt);
    let root_owner = tree.root_owner();
    let mut packed = Vec::new();
    let mut u_r = None;
    if me == root_owner {
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
    let c = tree.down(comm, u_r, |level, j, c| {
        let (ka, q) = node_q
            .remove(&(level, j))
            .ok_or(LinalgError::Tree { level, node: j })?;
        Ok((q.slice(s![..ka, ..]).dot(&c), q.slice(s![ka.., ..]).dot(&c)))
    })?;
    timings.push(t.phase("tree: push down U_R"));

    // Pass 2: rows of the distributed factor, and the checks.
    let t = Clock::start(rt);
    let mut c = c;
    let mut inputs2 = Vec::with_capacity(my_actors.len());
    for a in &my_actors {
        let mut items = Vec::new();
        for p in a.1.clone() {
            let ci = c
                .remove(&p)
                .ok_or(LinalgError::Tree { level: 0, node: p })?;
            items.push((p, ci, kept.remove(&p)));
        }
        inputs2.push(items);
    }
    let source = Arc::clone(&problem.source);
    let (gpus2, work2, on_device2) = (gpus_all, Arc::clone(&work), on_device);
    let check = options.check;
    let s_arc = Arc::new(s.clone());
    let wt_arc = Arc::new(wt.clone());
    // Pass 2 reads the panels it must factor again, and every panel for the checks.
    let order = inputs2
        .iter()
        .map(|items| {
            items
                .iter()
                .filter(|(_, _, kept)| check || kept.is_none())
                .map(|(p, _, _)| (*p, grid.panel_rows(*p)))
                .collect()
        })
        .collect();
    let reads = PassReads::start(rt, reader, order, &read_buffers, Arc::clone(&reading), None)?;
    rt.progress().start_pass();
    let pass2 = rt.map(
        inputs2,
        move |actor,
              (p, ci, kept): (usize, Array2<f64>, Option<PanelFactor>)|
              -> Result<Array2<f64>, LinalgError> {
            let rows = grid.panel_rows(p);
            let lease = if check || kept.is_none() {
                reads.take(actor, p, &rows)?
            } else {
                None
            };
            let h = (rows.end - rows.start) as usize;
            let factor = match kept {
                Some(f) => f,
                None => factor_on_actor(
                    gpus2.get(actor).and_then(Option::as_deref),
                    on_device2.as_ref(),
                    source.as_ref(),
                    p,
                    rows.clone(),
                    lease.as_deref(),
                    Keep::Scratch,
                    &work2,
                )?,
            };
            let mut ubuf = take_scratch(h * k);
            let mut u =
                ArrayViewMut2::from_shape((h, k).f(), &mut ubuf[..]).expect("U block shape");
            factor.apply_into(ci.view(), u.view_mut());
            factor.recycle();
            let u = u.view();
            if let Some(sink) = &sink {
                if let Err(message) = sink(p, rows.clone(), u.view()) {
                    give_scratch(ubuf);
                    return Err(LinalgError::Sink { panel: p, message });
                }
            }
            let stats = if check {
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
                Array2::zeros((0, 0))
            };
            give_scratch(ubuf);
            Ok(stats)
        },
    )?;
    // Pass 2 produces the panels again where they were not kept, and once more for checks.
    bytes_generated += panel_bytes(true) + if options.check { my_panel_bytes } else { 0 };
    let mut stats = BTreeMap::new();
    for (a, results) in my_actors.iter().zip(pass2) {
        for (p, r) in a.1.clone().zip(results) {
            stats.insert(p, r?);
        }
    }
    timings.push(t.phase(if check {
        "pass 2: form U + checks"
    } else {
        "pass 2: form U"
    }));

    let check = if check {
        let t = Clock::start(rt);
        let total = tree.sum_all(comm, stats, (1, 2 + k * k))?;
        let rel = if total[[0, 1]] > 0.0 {
            (total[[0, 0]] / total[[0, 1]]).sqrt()
        } else {
            total[[0, 0]].sqrt()
        };
        let mut u_orth = 0.0f64;
        for i in 0..k {
            for j in 0..k {
                let v = total[[0, 2 + j * k + i]] - if i == j { 1.0 } else { 0.0 };
                u_orth = u_orth.max(v.abs());
            }
        }
        let vtv = wt.dot(&wt.t());
        let mut v_orth = 0.0f64;
        for ((i, j), v) in vtv.indexed_iter() {
            v_orth = v_orth.max((v - if i == j { 1.0 } else { 0.0 }).abs());
        }
        timings.push(t.phase("checks: reduce"));
        Some(CheckReport {
            relative_residual: rel,
            u_orthogonality: u_orth,
            v_orthogonality: v_orth,
        })
    } else {
        None
    };

    let read = reading.totals();
    Ok(SvdResult {
        s,
        wt,
        transposed: problem.transposed,
        check,
        timings,
        plan,
        bytes_generated,
        read,
        gpu_qrs: work.qrs.load(Ordering::Relaxed),
        gpu_generated: work.generated.load(Ordering::Relaxed),
        gpu_node_qrs,
    })
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
) -> Result<Array2<f64>, LinalgError> {
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
    let utu = u.t().dot(&u);
    let mut out = Array2::zeros((1, 2 + k * k));
    out[[0, 0]] = res;
    out[[0, 1]] = norm;
    for (i, v) in utu.t().iter().enumerate() {
        out[[0, 2 + i]] = *v;
    }
    Ok(out)
}
