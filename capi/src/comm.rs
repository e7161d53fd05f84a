//! The caller's communicator: checked, duplicated, agreed on, and handed to a runtime.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};
use ndarray::ArrayView2;
use rankwise::exec::{ChunkGrid, CoreShare, RuntimeConfig};
use rankwise::linalg::{
    rsvd, svd, FactorSink, Method as RsvdMethod, Operand, Precision, RsvdOptions, RsvdProblem,
    SvdOptions, SvdProblem,
};

use crate::args::{check_local, Call, CapiError, Layout, Method};
use crate::matrix::view_mut;
use crate::*;
use rankwise::host_mpi::HostMpiError;
use rankwise::memory::{RowBlocks, RowsInPlace};
use rankwise::transports::announce_failure;

/// The library's checks of MPI and of the caller's communicator, as this library's errors.
fn host_error(e: HostMpiError) -> CapiError {
    match e {
        HostMpiError::NotReady(m) => CapiError::MpiNotReady(m),
        HostMpiError::InvalidCommunicator(m) => CapiError::InvalidCommunicator(m),
        HostMpiError::Call { call, code } => CapiError::Mpi { call, code },
    }
}

fn mpi_ready() -> Result<(), CapiError> {
    rankwise::host_mpi::mpi_ready().map_err(host_error)
}

fn duplicate(fint: MPI_Fint) -> Result<SimpleCommunicator, CapiError> {
    rankwise::host_mpi::duplicate(fint).map_err(host_error)
}

/// MPI checked usable and the caller's communicator duplicated, with this rank's own
/// checks (`local`) handed back. When MPI or the handle cannot be used, a rank whose own
/// arguments are also wrong reports those: they are what its caller can fix first.
pub(crate) fn open_comm<T>(
    fint: MPI_Fint,
    local: Result<T, CapiError>,
) -> Result<(SimpleCommunicator, Result<T, CapiError>), CapiError> {
    if let Err(e) = mpi_ready() {
        return Err(local.err().unwrap_or(e));
    }
    match duplicate(fint) {
        Ok(d) => Ok((d, local)),
        Err(e) => Err(local.err().unwrap_or(e)),
    }
}

/// What every rank tells the others before any work: its status and row count, then the
/// arguments every rank must pass alike (named as in the header).
const AGREED: [&str; 11] = [
    "status",
    "rows_local",
    "cols",
    "panel_rows",
    "method",
    "k",
    "oversample",
    "power_iters",
    "seed",
    "tol",
    "max_passes",
];
const AGREE: usize = AGREED.len();

fn agreement(status: rankwise_status, c: &Call) -> [i64; AGREE] {
    // The method as a number (0 exact, 1 fixed iterations, 2 to a tolerance), and the
    // tolerance by its bits: every rank must pass the same value.
    let (method, k, oversample, power_iters, seed, tol, max_passes) = match c.method {
        Method::Exact => (0, 0, 0, 0, 0, 0, 0),
        Method::Randomized {
            k,
            oversample,
            power_iters,
            seed,
        } => (1, k, oversample, power_iters, seed as i64, 0, 0),
        Method::ToTolerance {
            k,
            oversample,
            tol,
            max_passes,
            seed,
            ..
        } => (
            2,
            k,
            oversample,
            0,
            seed as i64,
            tol.to_bits() as i64,
            max_passes,
        ),
    };
    [
        status as i64,
        c.rows_local,
        c.cols,
        c.panel_rows,
        method,
        k,
        oversample,
        power_iters,
        seed,
        tol,
        max_passes,
    ]
}

/// One rank's side of an agreement: `mine[0]` its status, then the values named by
/// `names` (as the header names them). `shown` prints a value for a message, or `None`
/// where the value is a hash (a string's).
pub(crate) struct Agreed<'a> {
    pub names: &'a [&'static str],
    pub mine: &'a [i64],
    pub shown: &'a dyn Fn(&str, i64) -> Option<String>,
}

/// Gathers every rank's status and values before any work, so that a rank whose own
/// arguments are wrong makes the others return an error instead of waiting for it. Fails
/// with the first rank that failed, else the first value a rank passed differently;
/// returns every rank's values (rank order). `names[1]`, when named `rows_local`, may
/// differ between ranks.
pub(crate) fn agree(dup: &SimpleCommunicator, a: Agreed<'_>) -> Result<Vec<Vec<i64>>, CapiError> {
    let n = a.mine.len();
    let mut all = vec![0i64; n * dup.size() as usize];
    dup.all_gather_into(a.mine, &mut all[..]);
    let all: Vec<Vec<i64>> = all.chunks(n).map(<[i64]>::to_vec).collect();
    if let Some((rank, v)) = all.iter().enumerate().find(|(_, v)| v[0] != 0) {
        return Err(CapiError::OtherRank {
            rank,
            status: v[0] as rankwise_status,
        });
    }
    for (rank, v) in all.iter().enumerate() {
        for i in 1..n {
            let name = a.names[i];
            if v[i] == a.mine[i] || name == "rows_local" {
                continue;
            }
            let message = match ((a.shown)(name, a.mine[i]), (a.shown)(name, v[i])) {
                (Some(mine), Some(theirs)) if name == "method" => format!(
                    "this rank called {mine} but rank {rank} called {theirs}: every rank must \
                     make the same call"
                ),
                (Some(mine), Some(theirs)) => format!(
                    "this rank passed {mine} but rank {rank} passed {theirs}: every rank must \
                     pass the same value"
                ),
                _ => format!(
                    "rank {rank} passed a different value: every rank must pass the same value"
                ),
            };
            return Err(CapiError::Inconsistent { arg: name, message });
        }
    }
    Ok(all)
}

/// A caller's output buffer, shared by the actors that write its disjoint rows.
#[derive(Clone, Copy)]
struct Out {
    ptr: usize,
    ld: usize,
    layout: Layout,
}

impl Out {
    /// Writes `block` at row `r0` of the buffer.
    ///
    /// # Safety
    /// The buffer holds at least `r0 + block.nrows()` rows of `block.ncols()` columns,
    /// and no one else writes these rows meanwhile.
    unsafe fn write(&self, r0: usize, block: ArrayView2<'_, f64>) {
        let offset = match self.layout {
            Layout::ColMajor => r0,
            Layout::RowMajor => r0 * self.ld,
        };
        // SAFETY: the caller's promise; the offset stays inside the buffer.
        let mut v = unsafe {
            view_mut(
                (self.ptr as *mut f64).add(offset),
                block.nrows(),
                block.ncols(),
                self.ld,
                self.layout,
            )
        };
        v.assign(&block);
    }
}

/// `rankwise_tsqr_svd`, `rankwise_rsvd` and `rankwise_rsvd_tol` on one rank.
pub(crate) fn run(fint: MPI_Fint, c: &Call) -> Result<(), CapiError> {
    crate::set_last_phases(&[]);
    // Local checks first, but a rank whose own arguments are wrong still takes part in the
    // agreement below, so that the other ranks return an error instead of waiting for it.
    let (dup, local) = open_comm(fint, check_local(c))?;
    let status = local.as_ref().err().map_or(RANKWISE_OK, |e| e.status());
    let mine = agreement(status, c);
    let shown = |name: &str, v: i64| {
        Some(match name {
            "method" => match v {
                0 => "rankwise_tsqr_svd",
                1 => "rankwise_rsvd",
                _ => "rankwise_rsvd_tol",
            }
            .to_string(),
            // The tolerance travels as its bits.
            "tol" => f64::from_bits(v as u64).to_string(),
            _ => v.to_string(),
        })
    };
    let all = agree(
        &dup,
        Agreed {
            names: &AGREED,
            mine: &mine,
            shown: &shown,
        },
    );
    let (layout, k) = local?;
    let all = all?;
    let me = dup.rank() as usize;
    // Every rank's row count was checked non-negative by check_local before it gave
    // status 0, so the conversion is exact.
    let rows: Vec<u64> = all.iter().map(|a| a[1] as u64).collect();
    let cols = c.cols;
    // The library's agreement on panels, its parameters named as the header names them.
    let RowBlocks {
        rows: m,
        panel_rows: p,
        row0,
        rank_panels,
    } = RowBlocks::agree(&rows, cols as u64, c.panel_rows.max(0) as u64, me).map_err(|e| {
        let arg = match e.parameter() {
            Some("panel_rows") => "panel_rows",
            _ => "rows_local",
        };
        let message = match e {
            rankwise::Error::Parameter { message, .. } => message,
            other => other.to_string(),
        };
        CapiError::Inconsistent { arg, message }
    })?;
    // The header's counts are int64_t: a sum of them may not be.
    let m = i64::try_from(m).map_err(|_| CapiError::Inconsistent {
        arg: "rows_local",
        message: format!("the ranks hold {m} rows in all, more than int64_t counts"),
    })?;
    let (p, row0) = (p as i64, row0 as i64);
    let grid = ChunkGrid::new(m as u64, cols as u64, p as u64)
        .map_err(|e| CapiError::Internal(e.to_string()))?;

    let rt = runtime(dup)?;

    let live = Arc::new(AtomicBool::new(true));
    let (rs, cs) = layout.strides(c.lda as usize);
    // SAFETY: check_local checked a, lda and layout for rows_local × cols; the buffer is
    // the caller's until this call returns, and the lease ends before that.
    let (source, _lease) = unsafe {
        RowsInPlace::new(
            c.a,
            c.rows_local as usize,
            cols as usize,
            (rs as isize, cs as isize),
            row0 as u64,
            m as u64,
        )
    }
    .map_err(|e| CapiError::Internal(e.to_string()))?;
    let source = Arc::new(source);
    let u_out = Out {
        ptr: c.u_local as usize,
        ld: c.ldu as usize,
        layout,
    };
    let sink_live = Arc::clone(&live);
    let mine = row0 as u64..(row0 + c.rows_local) as u64;
    let sink: FactorSink = Arc::new(move |_, rows, block| {
        if !sink_live.load(Ordering::Acquire)
            || rows.start < mine.start
            || rows.end > mine.end
            || block.nrows() as u64 != rows.end - rows.start
        {
            return Err(format!("rows {rows:?} are not this rank's"));
        }
        // SAFETY: the placement gives every panel to the rank holding its rows, so these
        // rows are within u_local (rows_local × k, checked ldu); each panel is written by
        // one actor.
        unsafe { u_out.write((rows.start - row0 as u64) as usize, block) };
        Ok(())
    });
    let result = match c.method {
        Method::Exact => {
            let problem = SvdProblem {
                source,
                grid,
                transposed: false,
                rank_panels: Some(rank_panels),
            };
            svd(&rt, &problem, &SvdOptions::default(), Some(sink))
                .map(|r| (r.s, r.wt, None, r.timings))
        }
        Method::Randomized {
            k,
            oversample,
            power_iters,
            seed,
        } => {
            let problem = RsvdProblem {
                operand: Operand::Dense(source),
                grid,
                transposed: false,
                rank_panels: Some(rank_panels),
            };
            let options = RsvdOptions {
                k: k as usize,
                oversample: oversample as usize,
                power_iters: power_iters as usize,
                method: RsvdMethod::SubspaceIteration,
                seed,
                probes: 0,
                precision: Precision::F64,
                ..RsvdOptions::default()
            };
            rsvd(&rt, &problem, &options, Some(sink)).map(|r| (r.s, r.wt, None, r.timings))
        }
        Method::ToTolerance {
            k,
            oversample,
            tol,
            max_passes,
            seed,
            ..
        } => {
            let problem = RsvdProblem {
                operand: Operand::Dense(source),
                grid,
                transposed: false,
                rank_panels: Some(rank_panels),
            };
            // f64 tiles throughout: the caller's values are f64, and the bits are those of
            // `rankwise rsvd --method lobpcg --precision f64`.
            let options = RsvdOptions {
                k: k as usize,
                oversample: oversample as usize,
                method: RsvdMethod::Lobpcg,
                tol,
                max_passes: max_passes as usize,
                seed,
                probes: 0,
                precision: Precision::F64,
                mixed_precision: false,
                ..RsvdOptions::default()
            };
            rsvd(&rt, &problem, &options, Some(sink))
                .map(|r| (r.s, r.wt, Some(r.convergence), r.timings))
        }
    };
    live.store(false, Ordering::Release);
    let (s, wt, convergence, timings) = match result {
        Ok(v) => v,
        Err(e) => {
            let comm = rt.comm();
            let message = match announce_failure(comm, &|| e.to_string()) {
                Some((rank, message)) => format!("rank {rank} failed: {message}"),
                None => e.to_string(),
            };
            drop(rt);
            return Err(CapiError::Compute(message));
        }
    };
    drop(rt);
    if s.len() != k as usize || wt.dim() != (k as usize, cols as usize) {
        return Err(CapiError::Internal(format!(
            "expected {k} values and a {k} × {cols} Vᵀ, got {} and {:?}",
            s.len(),
            wt.dim()
        )));
    }
    // SAFETY: check_local checked s (k values, non-null) and vt (k × cols, ldvt).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), c.s, s.len());
        Out {
            ptr: c.vt as usize,
            ld: c.ldvt as usize,
            layout,
        }
        .write(0, wt.view());
    }
    if let (
        Method::ToTolerance {
            residuals,
            converged,
            ..
        },
        Some(report),
    ) = (&c.method, convergence)
    {
        if report.residuals.len() != s.len() {
            return Err(CapiError::Internal(format!(
                "{} residuals for {} components",
                report.residuals.len(),
                s.len()
            )));
        }
        // SAFETY: check_local checked both non-null; residuals holds k values (the
        // caller's contract, as for s).
        unsafe {
            std::ptr::copy_nonoverlapping(report.residuals.as_ptr(), *residuals, s.len());
            **converged = i32::from(report.converged);
        }
    }
    crate::set_last_phases(&timings);
    Ok(())
}

/// A runtime over `dup`: the node's ranks share its cores out by their rank among the
/// node's ranks; the host code owns its threads' placement, so rankwise does not pin.
pub(crate) fn runtime(dup: SimpleCommunicator) -> Result<rankwise::exec::Runtime, CapiError> {
    let node = dup.split_shared(0);
    let config = RuntimeConfig {
        local_rank: node.rank() as usize,
        local_size: node.size() as usize,
        pin: false,
        core_share: CoreShare::LauncherIfBound,
        ..RuntimeConfig::default()
    };
    drop(node);
    rankwise::from_mpi_communicator(dup, &config).map_err(|e| CapiError::Compute(e.to_string()))
}

/// What a production probe reads the caller's rows into.
#[derive(Clone, Copy)]
pub(crate) enum Produced {
    /// The exact SVD's row blocks (`rankwise_tsqr_svd`).
    RowBlocks,
    /// The float64 tiles of the randomized passes (`rankwise_rsvd`, `rankwise_rsvd_tol`).
    Tiles,
}

/// `rankwise_production_peak` and `rankwise_tile_production_peak`: the ranks agree that
/// every one's arguments are good (a rank with a bad one, or with `bad_output`, makes
/// every rank return an error rather than wait in the probe), then probe their own rows
/// together.
pub(crate) fn production_peak(
    fint: MPI_Fint,
    rows: &crate::args::RowsArg,
    produced: Produced,
    bad_output: Option<rankwise_status>,
) -> Result<f64, CapiError> {
    let local = rows.check();
    let (dup, local) = open_comm(fint, local)?;
    let status = match (&local, bad_output) {
        (Err(e), _) => e.status(),
        (Ok(_), Some(s)) => s,
        (Ok(_), None) => RANKWISE_OK,
    };
    let agreed = agree(
        &dup,
        Agreed {
            names: &["status"],
            mine: &[status as i64],
            shown: &|_, v| Some(v.to_string()),
        },
    );
    let layout = local?;
    agreed?;
    let rt = runtime(dup)?;
    let (rs, cs) = layout.strides(rows.lda as usize);
    let n = rows.rows_local as usize;
    // SAFETY: RowsArg::check checked a, lda and layout for rows_local × cols; the buffer
    // is the caller's until this call returns, and the lease ends before that.
    let (source, _lease) = unsafe {
        RowsInPlace::new(
            rows.a,
            n,
            rows.cols as usize,
            (rs as isize, cs as isize),
            0,
            n as u64,
        )
    }
    .map_err(|e| CapiError::Internal(e.to_string()))?;
    match produced {
        Produced::RowBlocks => rankwise::linalg::production_peak(&rt, &source, 0..n as u64),
        // The caller's values are float64, and so are the tiles of its randomized passes;
        // its rows are one panel, as `run` places them.
        Produced::Tiles => rankwise::linalg::tile_production_peak(
            &rt,
            &Operand::Dense(Arc::new(source)),
            (n > 0).then_some((0, 0..n as u64)),
            Precision::F64,
        ),
    }
    .map_err(|e| CapiError::Compute(e.to_string()))
}

/// `rankwise_gemm_peak`: the ranks agree on `precision` first (a rank with a bad one makes
/// every rank return an error rather than wait in the probe), then probe together.
pub(crate) fn gemm_peak(
    fint: MPI_Fint,
    precision: i32,
    probe: Option<&rankwise::linalg::GemmProbe>,
) -> Result<rankwise::linalg::MachineGemm, CapiError> {
    let local = match precision {
        crate::RANKWISE_F64 => Ok(Precision::F64),
        crate::RANKWISE_F32 => Ok(Precision::F32),
        other => Err(CapiError::InvalidArgument {
            arg: "precision",
            message: format!("{other} is neither RANKWISE_F64 (0) nor RANKWISE_F32 (1)"),
        }),
    };
    let (dup, local) = open_comm(fint, local)?;
    let mine = [
        local.as_ref().err().map_or(RANKWISE_OK, |e| e.status()) as i64,
        precision as i64,
    ];
    let agreed = agree(
        &dup,
        Agreed {
            names: &["status", "precision"],
            mine: &mine,
            shown: &|_, v| Some(v.to_string()),
        },
    );
    let precision = local?;
    agreed?;
    let rt = runtime(dup)?;
    rankwise::linalg::machine_gemm_peak(&rt, precision, probe)
        .map_err(|e| CapiError::Compute(e.to_string()))
}
