//! The per-actor seam of the randomized passes: what one actor computes of one panel, on
//! its CPU cores ([`Cpu`]) or on its GPU ([`Gpu`]).
//!
//! The passes in `rsvd.rs` take the actor's backend from [`Ctx::backend`] and call it;
//! they hold no device branch. What they do with the products (the finiteness check, the
//! fused sums, the sketch) is the same whichever backend made them. The sketch's panel
//! QR is chosen here too ([`factor_sketch`]).

use std::sync::atomic::Ordering;

use ndarray::{s, Array2, ArrayView2};
use rankwise_sources::StoredFrames;

use super::{written_zeros, Ctx, PanelState};
use crate::fused::OmegaLayout;
use crate::gpu::{self, DeviceSource, GpuReal};
use crate::kernels::{Keep, PanelFactor};
use crate::reads::{PanelRead, PassReads};
use crate::tiles::{
    Operand, Packing, PanelFacts, Stored, Sweep, Sweeps, Tile, TileProducer, TileReal, TILE_ROWS,
};
use crate::LinalgError;

/// A range pass's job for one panel: `Y = A·Ω`, and with `fused` also `W = Y[:, ..l]ᵀ·A`
/// from the same tiles.
pub(super) struct RangeJob<'a, T> {
    /// The test matrix with its probe columns, `n × w`.
    pub(super) omega: ArrayView2<'a, T>,
    /// `Ω` laid out for the fused kernels, where they run.
    pub(super) layout: Option<&'a OmegaLayout>,
    /// The sketch's columns (the rest are probes).
    pub(super) l: usize,
    /// Whether `W` is formed too.
    pub(super) fused: bool,
    /// Whether this is the first pass: its facts are measured, and a panel the plan made
    /// resident is kept.
    pub(super) first: bool,
}

/// What a range pass computes of one panel.
pub(super) struct RangeProducts {
    /// `Y` (`h × w`).
    pub(super) y: Array2<f64>,
    /// `W` (`l × n`), with fused projections.
    pub(super) w: Option<Array2<f64>>,
    /// The panel's facts (measured in the first pass).
    pub(super) facts: PanelFacts,
}

/// How one actor computes a panel's products.
pub(super) trait PanelBackend<T> {
    /// The range pass's products of the panel of `st`; a first pass on the host also keeps
    /// the panel in `st.stored` where the plan made it resident.
    fn range(
        &self,
        c: &Ctx,
        reads: &PassReads,
        actor: usize,
        st: &mut PanelState,
        job: &RangeJob<'_, T>,
    ) -> Result<RangeProducts, LinalgError>;

    /// `B = Qᵀ·A` (`basis × n`) of the panel of `st`, `q` its rows of the basis.
    fn project(
        &self,
        c: &Ctx,
        reads: &PassReads,
        actor: usize,
        st: &PanelState,
        q: ArrayView2<'_, f64>,
    ) -> Result<Array2<f64>, LinalgError>;
}

impl Ctx {
    /// The backend of `actor` for this operand: its GPU where it has one that can produce
    /// or stage the panels, else its CPU cores.
    pub(super) fn backend<T: GpuReal>(&self, actor: usize) -> Box<dyn PanelBackend<T> + '_> {
        match self.on_gpu(actor) {
            Some(how) => Box::new(Gpu(how)),
            None => Box::new(Cpu),
        }
    }

    /// How `actor` computes its panels on a GPU, when it does.
    fn on_gpu(&self, actor: usize) -> Option<OnDevice<'_>> {
        let dev = self.gpus.get(actor)?.as_deref()?;
        let how = match &self.device_source {
            Some(src) => OnDevice::Produced(dev, src),
            None if self.operand.stored().is_some() => match &self.device_frames {
                Some(frames) => OnDevice::Decoded(dev, frames),
                None => OnDevice::Staged(dev),
            },
            None => return None,
        };
        self.gpu_panels.fetch_add(1, Ordering::Relaxed);
        Some(how)
    }
}

/// An actor's CPU cores: tiles produced (generated, decoded, unpacked) into cache-sized
/// buffers and multiplied there (`crate::tiles`).
struct Cpu;

impl<T: TileReal> PanelBackend<T> for Cpu {
    fn range(
        &self,
        c: &Ctx,
        reads: &PassReads,
        actor: usize,
        st: &mut PanelState,
        job: &RangeJob<'_, T>,
    ) -> Result<RangeProducts, LinalgError> {
        let (omega, l) = (job.omega, job.l);
        let read = panel_read(reads, actor, st)?;
        let h = (st.rows.end - st.rows.start) as usize;
        let w = omega.ncols();
        let mut y = written_zeros((h, w));
        let mut scratch = Vec::new();
        // The fused `W = YᵀA` (`l × n`), a row block of `Y` in the tiles' type, and the
        // tile products.
        let mut wsum = job.fused.then(|| written_zeros((l, c.n)));
        let mut yt = Array2::<T>::zeros((if wsum.is_some() { TILE_ROWS } else { 0 }, l));
        let mut wscratch = Vec::new();
        let sweeps = if wsum.is_some() {
            Sweeps::Twice
        } else {
            Sweeps::Once
        };
        let keep = job.first && c.resident[actor];
        // A float panel decoded whole is kept as the read-ahead decoded it, without a copy.
        let keep_lease =
            keep && matches!(read, PanelRead::Whole(_)) && matches!(c.operand, Operand::Dense(_));
        let (facts, kept) = TileProducer::new(&c.operand, st.p, st.rows.clone())
            .read_from(&read)
            .measuring(job.first)
            .packing(Packing::Always)
            .sweep(
                st.stored.as_ref(),
                keep && !keep_lease,
                &mut Vec::new(),
                sweeps,
                |sweep, r0, c0, t: Tile<'_, T>| {
                    if let (Sweep::Second, Some(ws)) = (sweep, wsum.as_mut()) {
                        let rows = t.dim().0;
                        if c0 == 0 {
                            yt.slice_mut(s![..rows, ..])
                                .zip_mut_with(&y.slice(s![r0..r0 + rows, ..l]), |a, &v| {
                                    *a = T::from_f64(v)
                                });
                        }
                        let ys = yt.slice(s![..rows, ..]);
                        let bs = ws.slice_mut(s![.., c0..c0 + t.dim().1]);
                        return T::atb_tile(t, ys, bs, &mut wscratch);
                    }
                    let ys = y.slice_mut(s![r0..r0 + t.dim().0, ..]);
                    T::ab_tile(t, omega, job.layout, c0, ys, &mut scratch);
                },
            )?;
        if kept.is_some() {
            st.stored = kept;
        }
        if let (PanelRead::Whole(lease), true) = (read, keep_lease) {
            st.stored = Some(Stored::Decoded(lease.take_values()));
        }
        Ok(RangeProducts { y, w: wsum, facts })
    }

    fn project(
        &self,
        c: &Ctx,
        reads: &PassReads,
        actor: usize,
        st: &PanelState,
        q: ArrayView2<'_, f64>,
    ) -> Result<Array2<f64>, LinalgError> {
        let read = panel_read(reads, actor, st)?;
        // Row-major whatever `q`'s layout (the tile products take it so).
        let qt = Array2::from_shape_fn(q.dim(), |(i, j)| T::from_f64(q[[i, j]]));
        // Sums kept as `B` (basis × n), the tile products as `Qᵀ·T`: the narrow operand
        // on the left is what the skinny kernels take.
        let mut b = written_zeros((q.ncols(), c.n));
        let mut scratch = Vec::new();
        TileProducer::new(&c.operand, st.p, st.rows.clone())
            .read_from(&read)
            .measuring(false)
            .packing(Packing::Always)
            .for_each(
                st.stored.as_ref(),
                false,
                &mut Vec::new(),
                |r0, c0, t: Tile<'_, T>| {
                    let (rows, cols) = t.dim();
                    let qs = qt.slice(s![r0..r0 + rows, ..]);
                    let bs = b.slice_mut(s![.., c0..c0 + cols]);
                    T::atb_tile(t, qs, bs, &mut scratch);
                },
            )?;
        Ok(b)
    }
}

/// The panel of `st` as this pass's read-ahead delivers it; nothing to read when the panel
/// is resident.
fn panel_read<'r>(
    reads: &'r PassReads,
    actor: usize,
    st: &PanelState,
) -> Result<PanelRead<'r>, LinalgError> {
    Ok(match st.stored {
        None => reads.panel(actor, st.p)?,
        Some(_) => PanelRead::NotRead,
    })
}

/// How a GPU actor's device gets a panel's values.
enum OnDevice<'a> {
    /// The device produces them itself (generated operands).
    Produced(&'a gpu::GpuDevice, &'a DeviceSource),
    /// The actor's threads decode them on the host and stage them to the device.
    Staged(&'a gpu::GpuDevice),
    /// The device decodes the stored chunks' frames (`crate::gpu_decoded`).
    Decoded(&'a gpu::GpuDevice, &'a StoredFrames),
}

/// An actor's GPU (`crate::gpu`): the panel produced there, or decoded on the host and
/// staged; only the thin products come back.
struct Gpu<'a>(OnDevice<'a>);

impl<T: GpuReal> PanelBackend<T> for Gpu<'_> {
    fn range(
        &self,
        c: &Ctx,
        reads: &PassReads,
        actor: usize,
        st: &mut PanelState,
        job: &RangeJob<'_, T>,
    ) -> Result<RangeProducts, LinalgError> {
        let device_job = gpu::PanelJob::Range {
            omega: job.omega,
            fused: job.fused.then_some(job.l),
        };
        let out = self.panel(c, reads, actor, st, device_job, job.first)?;
        Ok(RangeProducts {
            y: out.y.expect("range passes bring Y back"),
            w: out.b,
            facts: out.facts,
        })
    }

    fn project(
        &self,
        c: &Ctx,
        reads: &PassReads,
        actor: usize,
        st: &PanelState,
        q: ArrayView2<'_, f64>,
    ) -> Result<Array2<f64>, LinalgError> {
        let out = self.panel::<T>(c, reads, actor, st, gpu::PanelJob::Project { q }, false)?;
        Ok(out.b.expect("projection passes bring B back"))
    }
}

impl Gpu<'_> {
    /// A panel's products for `job` on the device, produced there or staged.
    fn panel<T: GpuReal>(
        &self,
        c: &Ctx,
        reads: &PassReads,
        actor: usize,
        st: &PanelState,
        job: gpu::PanelJob<'_, T>,
        measure: bool,
    ) -> Result<gpu::PanelOut, LinalgError> {
        match self.0 {
            OnDevice::Produced(dev, src) => {
                let residency = &c.residency[actor];
                if let Some(kept) = residency.get(st.p) {
                    c.gpu_kept_passes.fetch_add(1, Ordering::Relaxed);
                    return gpu::kept_panel::<T>(
                        dev,
                        c.n,
                        &kept,
                        st.rows.clone(),
                        job,
                        |k, f, x| src.tables(k, f, measure, x),
                    );
                }
                // Keep the codes for the later passes, where the device has room.
                let h = (st.rows.end - st.rows.start) as usize;
                let keep = residency.reserve_on(dev, (h * c.n.div_ceil(4)) as u64);
                let (out, kept) =
                    gpu::generated_panel::<T>(dev, src, st.rows.clone(), c.n, job, measure, keep)?;
                if let Some(k) = kept {
                    residency.insert(st.p, k);
                }
                c.gpu_seconds
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .add(&out.seconds);
                Ok(out)
            }
            OnDevice::Staged(dev) => {
                let read = reads.panel(actor, st.p)?;
                staged(c, dev, st, &read, job, measure)
            }
            OnDevice::Decoded(dev, frames) => {
                let residency = &c.residency[actor];
                if let Some(kept) = residency.get(st.p) {
                    let Operand::Genotypes(_, filter) = &c.operand else {
                        unreachable!("the device decodes genotypes only")
                    };
                    let out =
                        gpu::kept_panel::<T>(dev, c.n, &kept, st.rows.clone(), job, |k, f, x| {
                            gpu::tables_from_counts(k, f, filter, measure, x)
                        })?;
                    c.gpu_kept_passes.fetch_add(1, Ordering::Relaxed);
                    return Ok(out);
                }
                // The chunk files are read by as many threads as the actor has workers.
                let threads = c.threads.get(actor).copied().unwrap_or(1);
                let (out, report) = crate::gpu_decoded::decoded_panel::<T>(
                    dev,
                    &c.operand,
                    frames,
                    &c.decode_permits[actor],
                    residency,
                    st.p,
                    st.rows.clone(),
                    job,
                    measure,
                    threads,
                )?;
                c.gpu_staged_bytes
                    .fetch_add(report.device.staged_bytes, Ordering::Relaxed);
                c.read.add(
                    rankwise_sources::ReadStats {
                        chunks: report.device.frames as u64 + report.host_chunks,
                        stored_bytes: report.device.staged_bytes,
                        decoded_bytes: st.rows.end.saturating_sub(st.rows.start) * c.n as u64,
                    },
                    report.read_seconds
                        + report.device.pack_seconds
                        + report.device.copy_seconds
                        + report.device.decompress_seconds
                        + report.device.unshuffle_seconds,
                );
                c.gpu_decode
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .add(&report);
                Ok(out)
            }
        }
    }
}

/// A staged panel's products on `dev`: its tiles as the read-ahead decodes them, packed
/// where they are genotypes, copied to the device block by block. Returns the device's
/// products and the facts the host measured.
fn staged<T: GpuReal>(
    c: &Ctx,
    dev: &gpu::GpuDevice,
    st: &PanelState,
    read: &PanelRead<'_>,
    job: gpu::PanelJob<'_, T>,
    measure: bool,
) -> Result<gpu::PanelOut, LinalgError> {
    let h = (st.rows.end - st.rows.start) as usize;
    let mut stage = gpu::Staging::<T>::new(dev, &c.operand, st.p, h, job)?;
    let (facts, _) = TileProducer::new(&c.operand, st.p, st.rows.clone())
        .read_from(read)
        .measuring(measure)
        .packing(Packing::Always)
        .for_each(None, false, &mut Vec::new(), |r0, c0, t: Tile<'_, T>| {
            stage.push(r0, c0, t)
        })?;
    let (mut out, bytes) = stage.finish()?;
    c.gpu_staged_bytes.fetch_add(bytes, Ordering::Relaxed);
    out.facts = facts;
    Ok(out)
}

/// The QR of a panel's sketch `y` (`h × w`, in host memory): by cuSOLVER on the actor's
/// GPU where it was found and the sketch is wide enough, else by the host's LAPACK. A
/// narrow panel's copies to the device and back, and cuSOLVER's column-by-column launches,
/// cost more than the host's LAPACK (on an H200, 40 panels of 250,000 × 20 took 3.6 s
/// there, a third of the benchmark's 9.8 s).
pub(super) fn factor_sketch(
    c: &Ctx,
    actor: usize,
    y: ArrayView2<'_, f64>,
) -> Result<PanelFactor, LinalgError> {
    let (h, w) = y.dim();
    let device = c.gpus.get(actor).and_then(Option::as_deref);
    let on_device = match device.filter(|_| w >= crate::svd::DEVICE_NODE_COLS) {
        Some(dev) => gpu::panel_qr(dev, y)?,
        None => None,
    };
    Ok(match on_device {
        Some((q, r)) => {
            c.gpu_qrs.fetch_add(1, Ordering::Relaxed);
            PanelFactor::from_explicit(q, h, r)
        }
        None => PanelFactor::compute(h, w, Keep::Kept, |rows, mut out| {
            out.assign(&y.slice(s![rows, ..]));
            Ok(())
        })?,
    })
}
