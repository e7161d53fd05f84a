//! Stored genotype panels decoded on the GPU actor's device: the host reads the chunks'
//! Blosc frames from their files and nothing else; the device decompresses them
//! ([`DeviceDecoder`]), packs the int8 dosages into 2-bit codes while counting each
//! variant's codes (`dosage_codes` in the device crate's `kernels.cu`), standardizes them
//! through the tables the host computes from those counts exactly as the CPU kernels do,
//! and multiplies.
//!
//! # Why
//!
//! Staged through the host ([`crate::gpu::Staging`]), a GPU actor's pass over a Zarr store
//! ran at the host's decode rate: 6.2 GB/s of int8 decoded on an H200 node's 16 cores,
//! against 55 GB/s of page-locked copies (RESULTS.md, run A). The device decodes Blosc
//! frames at 55–76 GB/s (run D), and only the compressed bytes cross the link.
//!
//! # What it takes, and the fallback
//!
//! Chunks that span every sample, each one Blosc frame of int8 dosages in a local file
//! ([`StoredPanels::device_frames`]); a run whose store is otherwise is staged through the
//! host, and its report says why. A frame the device does not decode (another compressor
//! than LZ4 or zstd, a stream nvCOMP cannot take at its offset) or a chunk without a file
//! is decoded on the host for its batch, which the report counts.
//!
//! The device holds one batch of about [`BATCH_BYTES`] decoded bytes (whole chunks, one at
//! the least), its 2-bit codes and one tile; the host [`FRAMES_IN_FLIGHT`] batches' frames
//! and their page-locked copies ([`decoded_host_bytes`], in the memory plan). A panel's
//! job reads its frames itself, not through the read-ahead: its first batch before it
//! takes the device's lane (so that one panel's files are read and packed while another's
//! is on the device), the rest while it holds it, waiting for nothing else meanwhile.

use std::ops::Range;
use std::sync::{Condvar, Mutex};

use cudarc::driver::{CudaSlice, PushKernelArg};
use rankwise_sources::{PanelBuffer, PanelValues, StoredFrames, StoredPanels};

use crate::device_decode::{DecodeStats, DeviceDecodeError, DeviceDecoder, Packed};
use crate::gpu::{
    gpu as gpu_err, grid as grid_of, standardize_rows, tables_from_counts, tile_rows, GpuDevice,
    GpuReal, KeptCodes, PanelJob, PanelOut, Products,
};
use crate::tiles::{Operand, PanelFacts};
use crate::LinalgError;

/// Decoded bytes a batch aims at: whole chunks, at least one. Batches of 1 GiB decoded at
/// 55 GB/s and 4 GiB at 69 GB/s on an H200 (RESULTS.md, run D); half a GiB keeps what the
/// host holds per GPU actor ([`decoded_host_bytes`]) near a gigabyte or two.
pub(crate) const BATCH_BYTES: u64 = 512 << 20;

/// Chunks per batch for `frames`.
fn batch_chunks(frames: &StoredFrames) -> u64 {
    let chunk = (frames.chunk_rows * frames.row_bytes).max(1);
    (BATCH_BYTES / chunk).max(1)
}

/// Host bytes one GPU actor holds to decode on its device: [`FRAMES_IN_FLIGHT`] batches'
/// frames as read and their page-locked copies (rounded up to 32 MiB), and the host decode
/// of a batch that falls back (`buffer_bytes`).
pub(crate) fn decoded_host_bytes(stored: &dyn StoredPanels, frames: &StoredFrames) -> u64 {
    let chunks = batch_chunks(frames);
    let encoded = chunks.saturating_mul(frames.most_encoded);
    let fallback = stored.buffer_bytes(chunks * frames.chunk_rows);
    (2 * encoded + (32 << 20))
        .saturating_mul(FRAMES_IN_FLIGHT as u64)
        .saturating_add(fallback)
}

/// What a rank's GPU actors decoded on their devices, and what fell back to the host.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceDecodeReport {
    /// The chunks decoded on the devices: bytes moved, and the steps' seconds.
    pub device: DecodeStats,
    /// Chunks a GPU actor decoded on the host instead.
    pub host_chunks: u64,
    /// Why, for the first of them.
    pub host_reason: Option<String>,
    /// Seconds the jobs spent reading the chunks' files.
    pub read_seconds: f64,
}

impl DeviceDecodeReport {
    /// Adds `o` to this.
    pub fn add(&mut self, o: &DeviceDecodeReport) {
        self.device.add(&o.device);
        self.host_chunks += o.host_chunks;
        if self.host_reason.is_none() {
            self.host_reason.clone_from(&o.host_reason);
        }
        self.read_seconds += o.read_seconds;
    }
}

/// How many of a GPU actor's panels may hold their first batch of frames at once: the one
/// the device decodes, and the next, read and packed meanwhile.
pub(crate) const FRAMES_IN_FLIGHT: usize = 2;

/// A count of the batches of frames a GPU actor's workers hold (see [`FRAMES_IN_FLIGHT`]).
#[derive(Debug)]
pub(crate) struct Permits {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Default for Permits {
    fn default() -> Self {
        Permits {
            free: Mutex::new(FRAMES_IN_FLIGHT),
            freed: Condvar::new(),
        }
    }
}

impl Permits {
    /// Waits for a permit; it is given back when the guard is dropped.
    fn acquire(&self) -> Permit<'_> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        Permit(self)
    }
}

/// A permit of [`Permits`], held until dropped.
struct Permit<'a>(&'a Permits);

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// The genotype panels one GPU actor keeps on its device ([`KeptCodes`]), and the device
/// memory left for more.
///
/// Why: a GPU actor read and decoded every stored panel again in every pass (and generated
/// every generated one), where CPU actors keep genotypes resident 2-bit packed. On an H200, a pass over 10 GB of int8
/// genotypes in Blosc zstd then took 1.3–1.5 s on the GPU actor against 0.38 s for a pass
/// over resident panels on 16 CPU cores, and the default PCA's 71 passes took 95 s
/// (RESULTS.md, run H). From device memory a pass is the standardization and the products.
#[derive(Default)]
pub(crate) struct Residency {
    room: std::sync::atomic::AtomicU64,
    /// Bytes of codes kept.
    kept: std::sync::atomic::AtomicU64,
    panels: Mutex<std::collections::HashMap<usize, std::sync::Arc<KeptCodes>>>,
}

impl Residency {
    /// Residency with `room` bytes of device memory for panels' codes.
    pub(crate) fn new(room: u64) -> Self {
        Residency {
            room: room.into(),
            kept: 0.into(),
            panels: Mutex::default(),
        }
    }

    /// Takes `bytes` of the room, when there is that much left.
    fn reserve(&self, bytes: u64) -> bool {
        use std::sync::atomic::Ordering;
        let ok = self
            .room
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                r.checked_sub(bytes)
            })
            .is_ok();
        if ok {
            self.kept.fetch_add(bytes, Ordering::Relaxed);
        }
        ok
    }

    /// Takes `bytes` of the room for codes on `dev`, when there is that much left and the
    /// device has that much free beyond [`free_margin`] now: ranks that share a GPU (more
    /// ranks on a node than GPUs) each measured the room when their run started, and see
    /// each other's kept codes only here.
    pub(crate) fn reserve_on(&self, dev: &GpuDevice, bytes: u64) -> bool {
        let margin = free_margin(dev.memory_bytes());
        let free = dev.free_memory().unwrap_or(0);
        free >= bytes.saturating_add(margin) && self.reserve(bytes)
    }

    /// Bytes of codes kept (reserved) so far.
    pub(crate) fn kept_bytes(&self) -> u64 {
        self.kept.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Panel `p`'s codes, when they are kept.
    pub(crate) fn get(&self, p: usize) -> Option<std::sync::Arc<KeptCodes>> {
        self.panels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&p)
            .cloned()
    }

    pub(crate) fn insert(&self, p: usize, panel: KeptCodes) {
        self.panels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p, std::sync::Arc::new(panel));
    }
}

/// The device memory a GPU actor lets resident panels take: half of what is free when the
/// run starts, less 4 GiB for the passes' own buffers (a decode batch, its streams, nvCOMP's
/// scratch, a tile and the products).
pub(crate) fn residency_room(free: u64) -> u64 {
    (free / 2).saturating_sub(4 << 30)
}

/// What a device of `total` bytes keeps free whatever codes are kept: 4 GiB for a pass's
/// buffers and an eighth of the device for the other processes sharing it.
pub(crate) fn free_margin(total: u64) -> u64 {
    (4u64 << 30).saturating_add(total / 8)
}

/// A batch of chunks as the host hands it to the device.
enum Loaded<'d> {
    /// Its frames, packed for the device.
    Packed(Packed<'d>),
    /// Decode it on the host, for this reason.
    Host(String),
}

/// Reads the frames of chunks `bands` and packs them for the device (none of which needs
/// the device's lane), or says why the host must decode them.
fn load<'d>(
    decoder: &DeviceDecoder<'d>,
    stored: &dyn StoredPanels,
    bands: Range<u64>,
    threads: usize,
    report: &mut DeviceDecodeReport,
) -> Result<Loaded<'d>, String> {
    let read = std::time::Instant::now();
    let frames = read_frames(stored, bands.clone(), threads)
        .map_err(|e| format!("reading chunks {}..{}: {e}", bands.start, bands.end))?;
    report.read_seconds += read.elapsed().as_secs_f64();
    let Some(refs) = frames
        .iter()
        .map(|f| f.as_deref())
        .collect::<Option<Vec<&[u8]>>>()
    else {
        return Ok(Loaded::Host("a chunk without a file (fill values)".into()));
    };
    match decoder.prepare(&refs) {
        Ok(p) => Ok(Loaded::Packed(p)),
        Err(e) => classify(e, &bands).map(Loaded::Host),
    }
}

/// Why a batch goes to the host (`Ok`, a frame the device does not take), or the panel
/// fails (`Err`, naming the chunk).
fn classify(e: DeviceDecodeError, bands: &Range<u64>) -> Result<String, String> {
    match e {
        DeviceDecodeError::Unsupported { frame, why } => {
            Ok(format!("chunk {}: {why}", bands.start + frame as u64))
        }
        DeviceDecodeError::Corrupt { frame, message } => Err(format!(
            "chunk ({}, 0): {message}",
            bands.start + frame as u64
        )),
        e => Err(e.to_string()),
    }
}

/// Reads the frames of chunks `bands` on up to `threads` threads; `None` for a chunk
/// without a file.
fn read_frames(
    stored: &dyn StoredPanels,
    bands: Range<u64>,
    threads: usize,
) -> Result<Vec<Option<Vec<u8>>>, rankwise_sources::SourceError> {
    let ids: Vec<u64> = bands.collect();
    let per = ids.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = ids
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&b| {
                            let mut f = Vec::new();
                            Ok(stored.read_frame(b, &mut f)?.then_some(f))
                        })
                        .collect::<Result<Vec<_>, rankwise_sources::SourceError>>()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(ids.len());
        for p in parts {
            // A reader's panic is this job's: it reaches the caller as a panic.
            all.extend(p.join().unwrap_or_else(|e| std::panic::resume_unwind(e))?);
        }
        Ok(all)
    })
}

/// Panel `panel` (operand rows `rows`) of a stored genotype `operand` whose chunks are
/// `frames`, decoded and multiplied for `job` on `dev`; with `measure`, its facts are
/// computed too. `threads` read the chunk files; `permits` are the actor's
/// ([`FRAMES_IN_FLIGHT`]). Where `residency` has room, the panel's codes stay on the device
/// for the later passes ([`resident_panel`]).
///
/// The panel's first batch is read and packed before the device's lane is taken, so that
/// one worker's files are read while another's panel is on the device.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decoded_panel<T: GpuReal>(
    dev: &GpuDevice,
    operand: &Operand,
    frames: &StoredFrames,
    permits: &Permits,
    residency: &Residency,
    panel: usize,
    rows: Range<u64>,
    job: PanelJob<'_, T>,
    measure: bool,
    threads: usize,
) -> Result<(PanelOut, DeviceDecodeReport), LinalgError> {
    let Operand::Genotypes(source, filter) = operand else {
        return Err(internal(panel, &rows, "device decode of a float operand"));
    };
    let stored = source
        .stored()
        .ok_or_else(|| internal(panel, &rows, "device decode of an operand not stored"))?;
    let n = operand.shape().1 as usize;
    let h = (rows.end - rows.start) as usize;
    let what = operand.describe();
    let panel_err = |message: String| LinalgError::Panel {
        panel,
        rows: format!("{}..{}", rows.start, rows.end),
        message: format!("{what}: {message}"),
    };
    let decoder = DeviceDecoder::new(dev).map_err(|e| panel_err(e.to_string()))?;
    let cr = frames.chunk_rows;
    let ld = frames.row_bytes as usize;
    let stride = n.div_ceil(4);
    let (first_band, last_band) = (rows.start / cr, rows.end.div_ceil(cr));
    let per_batch = batch_chunks(frames).min(last_band - first_band).max(1);
    let batches: Vec<Range<u64>> = (first_band..last_band)
        .step_by(per_batch as usize)
        .map(|b| b..(b + per_batch).min(last_band))
        .collect();
    let batch_rows = (per_batch * cr).min(h as u64) as usize;
    let tile = tile_rows(n, std::mem::size_of::<T>(), batch_rows);
    let mut report = DeviceDecodeReport::default();
    let _permit = permits.acquire();
    let mut first = Some(load(
        &decoder,
        stored,
        batches[0].clone(),
        threads,
        &mut report,
    ));
    let lane = dev.lock();
    dev.bind().map_err(LinalgError::Gpu)?;
    let stream = dev.stream();
    let k = dev.kernels();
    let alloc = gpu_err(dev, "allocating the decode buffers");
    let mut decoded = stream
        .alloc_zeros::<u8>((per_batch * cr) as usize * ld.max(n))
        .map_err(&alloc)?;
    // Kept: the whole panel's codes, each batch's at its rows.
    let keep = residency.reserve_on(dev, (h * stride) as u64);
    let mut packed = stream
        .alloc_zeros::<u8>(if keep { h } else { batch_rows } * stride.max(1))
        .map_err(&alloc)?;
    let mut kept_counts = Vec::with_capacity(if keep { 4 * h } else { 0 });
    let mut counts = stream.alloc_zeros::<u32>(batch_rows * 4).map_err(&alloc)?;
    let mut bad = stream.alloc_zeros::<u64>(1).map_err(&alloc)?;
    let mut values: CudaSlice<T> = stream.alloc_zeros::<T>(tile * n.max(1)).map_err(&alloc)?;
    let mut products = Products::new(dev, n, h, tile, &job)?;
    let mut facts = PanelFacts::default();
    let mut host_buf = PanelBuffer::default();
    for bands in &batches {
        // The panel's rows in this batch, and where they start in its first chunk.
        let g0 = (bands.start * cr).max(rows.start);
        let g1 = (bands.end * cr).min(rows.end);
        let b = (g1 - g0) as usize;
        let skip = (g0 - bands.start * cr) as usize;
        let loaded = match first.take() {
            Some(l) => l,
            None => load(&decoder, stored, bands.clone(), threads, &mut report),
        }
        .map_err(&panel_err)?;
        let on_device = match loaded {
            Loaded::Packed(p) => match decoder.decode_packed(p, &mut decoded) {
                Ok(stats) => {
                    report.device.add(&stats);
                    Ok(())
                }
                Err(e) => Err(classify(e, bands).map_err(&panel_err)?),
            },
            Loaded::Host(why) => Err(why),
        };
        // Rows of the decoded bytes: chunk rows of `ld` bytes from the device decode, the
        // panel's rows of `n` from the host's.
        let (src_ld, src_row) = match on_device {
            Ok(()) => (ld, skip),
            Err(why) => {
                report.host_chunks += bands.end - bands.start;
                report.host_reason.get_or_insert(why);
                stored
                    .read_panel(g0..g1, &mut host_buf)
                    .map_err(|e| panel_err(e.to_string()))?;
                let PanelValues::I8(d) = &host_buf.values else {
                    return Err(internal(panel, &rows, "a genotype panel not of int8"));
                };
                let bytes: &[u8] = bytemuck::cast_slice(&d[..b * n]);
                stream
                    .memcpy_htod(bytes, &mut decoded.slice_mut(..b * n))
                    .map_err(gpu_err(dev, "copying host-decoded dosages"))?;
                (n, 0)
            }
        };
        stream
            .memset_zeros(&mut counts)
            .map_err(gpu_err(dev, "zeroing code counts"))?;
        stream
            .memcpy_htod(&[u64::MAX][..], &mut bad)
            .map_err(gpu_err(dev, "resetting the value check"))?;
        let (b32, n32, ld32, st32) = (b as u32, n as u32, src_ld as u32, stride as u32);
        let input = decoded.slice(src_row * src_ld..);
        // The batch's first row in `packed`.
        let base = if keep { (g0 - rows.start) as usize } else { 0 };
        let mut codes = packed.slice_mut(base * stride..);
        let mut l = stream.launch_builder(&k.dosage_codes);
        l.arg(&mut codes)
            .arg(&mut counts)
            .arg(&mut bad)
            .arg(&input)
            .arg(&b32)
            .arg(&n32)
            .arg(&ld32)
            .arg(&st32);
        // SAFETY: reads b rows of n bytes at stride src_ld from the decoded rows (inside
        // `decoded`: a batch's chunks, or the host's b × n), writes b rows of `stride`
        // codes from row `base` and 4 counts each (the buffers hold base + b rows: the
        // panel's, or batch_rows ≥ b) and one u64.
        unsafe { l.launch(grid_of(n.div_ceil(16), b)) }.map_err(gpu_err(dev, "packing dosages"))?;
        let mut host_counts = vec![0u32; 4 * b];
        stream
            .memcpy_dtoh(&counts.slice(..4 * b), &mut host_counts)
            .map_err(gpu_err(dev, "copying code counts"))?;
        let mut first_bad = [0u64];
        stream
            .memcpy_dtoh(&bad, &mut first_bad)
            .map_err(gpu_err(dev, "copying the value check"))?;
        if first_bad[0] != u64::MAX {
            let (i, j) = (
                (first_bad[0] / n as u64) as usize,
                (first_bad[0] % n as u64) as usize,
            );
            let mut value = [0u8];
            let at = (src_row + i) * src_ld + j;
            stream
                .memcpy_dtoh(&decoded.slice(at..at + 1), &mut value)
                .map_err(gpu_err(dev, "copying a bad value"))?;
            return Err(LinalgError::Genotype {
                variant: g0 + i as u64,
                sample: j as u64,
                value: value[0] as i8,
                what,
            });
        }
        let table = tables_from_counts::<T>(&host_counts, g0, filter, measure, &mut facts);
        if keep {
            kept_counts.extend_from_slice(&host_counts);
        }
        // Tables from the batch's first row, as `standardize` reads them from row `base`.
        let mut from_base = vec![T::zero(); 4 * base];
        from_base.extend(table);
        let table = stream
            .clone_htod(&from_base)
            .map_err(gpu_err(dev, "copying standardization tables"))?;
        for r in (0..b).step_by(tile) {
            let t = tile.min(b - r);
            standardize_rows(dev, &mut values, &packed, &table, base + r, t, n)?;
            products.rows((g0 - rows.start) as usize + r, t, &values)?;
        }
    }
    let fetched = products.fetch()?;
    if keep {
        residency.insert(
            panel,
            KeptCodes {
                packed,
                counts: kept_counts,
            },
        );
    }
    drop(lane);
    let mut out = fetched.into_out()?;
    out.facts = facts;
    Ok((out, report))
}

fn internal(panel: usize, rows: &Range<u64>, message: &str) -> LinalgError {
    LinalgError::Panel {
        panel,
        rows: format!("{}..{}", rows.start, rows.end),
        message: format!("internal: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// At most FRAMES_IN_FLIGHT workers hold frames at once, and every waiting worker gets
    /// its turn.
    #[test]
    fn permits_bound_the_batches_held_at_once() {
        let permits = Permits::default();
        let (held, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let _p = permits.acquire();
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        held.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert!(most.load(Ordering::SeqCst) <= FRAMES_IN_FLIGHT);
        assert_eq!(*permits.free.lock().unwrap(), FRAMES_IN_FLIGHT);
    }

    /// Codes are kept while the room lasts, and what was kept is counted.
    #[test]
    fn residency_keeps_panels_while_there_is_room() {
        let r = Residency::new(100);
        assert!(r.reserve(60));
        assert!(!r.reserve(41), "past the room");
        assert!(r.reserve(40));
        assert!(!r.reserve(1));
        assert_eq!(r.kept_bytes(), 100);
        assert!(r.get(0).is_none());
        assert_eq!(residency_room(2 << 30), 0, "a small device keeps nothing");
        assert_eq!(residency_room(40 << 30), 16 << 30);
        assert_eq!(free_margin(80 << 30), 14 << 30);
    }
}
