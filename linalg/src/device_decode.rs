//! Blosc chunks decoded on the GPU: the host reads the compressed frames and copies them up;
//! nvCOMP decompresses their LZ4 or zstd streams in one batch; the kernels copy the stored
//! streams and unshuffle the blocks (`copy_segments`, `blosc_unshuffle` in the device
//! crate's `kernels.cu`).
//!
//! # Why
//!
//! A GPU actor's stored panels were decoded by the host's cores, then staged: 6.5 GB/s of
//! int8 genotypes on 16 cores, a ninth of the 55 GB/s the PCIe link copies (RESULTS.md).
//! Decoding on the device moves only the compressed bytes across the link and leaves the
//! host the file reads. The layout of each frame comes from the host's parser
//! ([`rankwise_sources::BloscLayout`]), and the result is the host decode's, bit for bit
//! (sources/tests/device_blosc.rs checks the kernels on the host, tests/gpu.rs the whole
//! path on a GPU).
//!
//! Measured on one H200 (benches/RESULTS.md, `examples/device_decode`): 4 GB of int8
//! genotypes in Blosc zstd + bit shuffle decode at 55 GB/s in 1 GiB batches (nvCOMP 146
//! GB/s of decoded bytes, the unshuffle 615 GB/s, the copy 52 GB/s of staged bytes; the
//! rest is the host packing the streams), against 7.2 GB/s on the node's 16 cores. The
//! first version packed on one thread and waited between the steps: 8.3 GB/s.
//!
//! # Fallback
//!
//! A frame the device does not decode is reported as [`DeviceDecodeError::Unsupported`],
//! naming the frame and why (another compressor, a stream nvCOMP cannot take at its
//! offset), so that the caller decodes it on the host and says so; nvCOMP missing is
//! [`DeviceDecoder::new`]'s error.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use rankwise_device::{nvcomp_status_name, GpuDevice, Nvcomp, NvcompCodec};
use rankwise_sources::{BlockShuffle, BloscCodec, BloscLayout};

/// Why a batch was not decoded on the device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceDecodeError {
    /// A frame the device path does not take: decode it on the host.
    #[error("frame {frame}: {why}; decode it on the host")]
    Unsupported {
        /// Its index in the batch.
        frame: usize,
        /// Why.
        why: String,
    },
    /// A frame whose header or streams are corrupt.
    #[error("frame {frame}: {message}")]
    Corrupt {
        /// Its index in the batch.
        frame: usize,
        /// What is wrong.
        message: String,
    },
    /// The device, nvCOMP or a buffer failed.
    #[error("decoding on {device}: {what}: {message}")]
    Device {
        /// The device, as [`GpuDevice::name`] gives it.
        device: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        message: String,
    },
}

/// What a batch moved and decoded, and where its time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DecodeStats {
    /// Frames decoded.
    pub frames: usize,
    /// Their streams: decompressed by nvCOMP, and stored (copied).
    pub compressed_streams: usize,
    /// Stored streams.
    pub stored_streams: usize,
    /// Bytes copied to the device (the frames' streams, packed and aligned).
    pub staged_bytes: u64,
    /// Decoded bytes.
    pub decoded_bytes: u64,
    /// Seconds the host spent laying out the frames and packing their streams into
    /// page-locked memory.
    pub pack_seconds: f64,
    /// Seconds of the copy to the device (CUDA events).
    pub copy_seconds: f64,
    /// Seconds of nvCOMP's decompression (CUDA events).
    pub decompress_seconds: f64,
    /// Seconds of the stored streams' copies and the unshuffle kernels (CUDA events).
    pub unshuffle_seconds: f64,
}

impl DecodeStats {
    /// Adds `other`'s counts and seconds to these.
    pub fn add(&mut self, other: &DecodeStats) {
        self.frames += other.frames;
        self.compressed_streams += other.compressed_streams;
        self.stored_streams += other.stored_streams;
        self.staged_bytes += other.staged_bytes;
        self.decoded_bytes += other.decoded_bytes;
        self.pack_seconds += other.pack_seconds;
        self.copy_seconds += other.copy_seconds;
        self.decompress_seconds += other.decompress_seconds;
        self.unshuffle_seconds += other.unshuffle_seconds;
    }
}

/// Copies each `(source, destination offset)` into `buf` on up to `threads` threads, in
/// contiguous runs of about equal bytes. The destinations must increase, each past the end
/// of the one before: the runs then write disjoint parts of `buf`.
///
/// Why threads: one core copies about 5–10 GB/s, and a batch's compressed streams are
/// hundreds of megabytes, as long as the device's whole decode of them would take.
fn pack(buf: &mut [u8], pieces: &[(&[u8], usize)], threads: usize) {
    let total: usize = pieces.iter().map(|(p, _)| p.len()).sum();
    let per = total.div_ceil(threads.max(1)).max(1 << 20);
    // Runs of pieces of about `per` bytes each.
    let mut runs: Vec<&[(&[u8], usize)]> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (p, _)) in pieces.iter().enumerate() {
        bytes += p.len();
        if bytes >= per || i + 1 == pieces.len() {
            runs.push(&pieces[start..=i]);
            (start, bytes) = (i + 1, 0);
        }
    }
    std::thread::scope(|s| {
        let mut rest = buf;
        let mut base = 0usize;
        for run in runs {
            let (first, last) = (run[0].1, run[run.len() - 1]);
            let end = last.1 + last.0.len();
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(first - base);
            let (mine, tail) = tail.split_at_mut(end - first);
            rest = tail;
            base = end;
            s.spawn(move || {
                for (p, at) in run {
                    mine[at - first..at - first + p.len()].copy_from_slice(p);
                }
            });
        }
    });
}

/// A batch of frames laid out and packed into page-locked memory by
/// [`DeviceDecoder::prepare`], ready for the device.
pub(crate) struct Packed<'d> {
    layouts: Vec<BloscLayout>,
    /// Where each frame's streams start in the packed buffer.
    offsets: Vec<Vec<usize>>,
    /// Where each frame's decoded streams start.
    stream_base: Vec<usize>,
    total_streams: usize,
    /// Bytes packed.
    staged: usize,
    /// Bytes the frames decode to.
    decoded: usize,
    host: rankwise_device::PinnedLease<'d>,
    pack_seconds: f64,
}

/// Decodes batches of Blosc frames on one device.
pub struct DeviceDecoder<'d> {
    dev: &'d GpuDevice,
    nvcomp: &'static Nvcomp,
}

/// Streams start at multiples of this in the staged buffer and the decoded streams (what
/// nvCOMP asks of zstd's inputs and outputs, more than LZ4's).
const ALIGN: usize = 16;

fn align(x: usize) -> usize {
    x.next_multiple_of(ALIGN)
}

/// Threads per block of the copy and unshuffle kernels.
const THREADS: u32 = 256;

/// One codec's streams in a batch: device addresses and sizes, as nvCOMP takes them.
#[derive(Default)]
struct Group {
    inputs: Vec<u64>,
    in_bytes: Vec<usize>,
    outputs: Vec<u64>,
    out_bytes: Vec<usize>,
    /// (frame, stream) of each, for errors.
    names: Vec<(usize, usize)>,
}

impl<'d> DeviceDecoder<'d> {
    /// A decoder on `dev`; an error naming what is missing when nvCOMP could not be
    /// loaded (decode on the host then).
    pub fn new(dev: &'d GpuDevice) -> Result<Self, DeviceDecodeError> {
        let nvcomp = Nvcomp::get().map_err(|message| DeviceDecodeError::Device {
            device: dev.name().to_string(),
            what: "loading nvCOMP",
            message,
        })?;
        Ok(DeviceDecoder { dev, nvcomp })
    }

    /// A CUDA error while doing `what`, as this module's error.
    fn cuda(
        &self,
        what: &'static str,
    ) -> impl Fn(cudarc::driver::DriverError) -> DeviceDecodeError + '_ {
        let f = self.failed(what);
        move |e| f(e.to_string())
    }

    fn failed(&self, what: &'static str) -> impl Fn(String) -> DeviceDecodeError + '_ {
        move |message| DeviceDecodeError::Device {
            device: self.dev.name().to_string(),
            what,
            message,
        }
    }

    /// Decodes `frames` (whole Blosc frames in host memory) into `out` on the device, one
    /// after another from its start; `out` must hold their decoded bytes. Returns when the
    /// device has finished, with what was moved.
    pub fn decode(
        &self,
        frames: &[&[u8]],
        out: &mut CudaSlice<u8>,
    ) -> Result<DecodeStats, DeviceDecodeError> {
        let packed = self.prepare(frames)?;
        let _lane = self.dev.lock();
        self.decode_packed(packed, out)
    }

    /// The host's part of a decode, which needs no lane: the frames' layouts, and their
    /// streams packed into page-locked memory at aligned offsets. A caller can pack the
    /// next batch while the device decodes this one ([`DeviceDecoder::decode_packed`]).
    pub(crate) fn prepare(&self, frames: &[&[u8]]) -> Result<Packed<'d>, DeviceDecodeError> {
        let packing = std::time::Instant::now();
        let mut layouts = Vec::with_capacity(frames.len());
        for (i, f) in frames.iter().enumerate() {
            match BloscLayout::of(f) {
                Ok(Some(l)) => layouts.push(l),
                Ok(None) => {
                    return Err(DeviceDecodeError::Unsupported {
                        frame: i,
                        why: "not a frame of LZ4 or zstd streams (BloscLZ, Snappy or zlib)".into(),
                    })
                }
                Err(message) => return Err(DeviceDecodeError::Corrupt { frame: i, message }),
            }
        }
        let decoded: usize = layouts.iter().map(|l| l.nbytes).sum();
        // Where each frame's decoded streams and staged streams start.
        let mut stream_base = Vec::with_capacity(layouts.len());
        let mut total_streams = 0usize;
        let mut staged = 0usize;
        for l in &layouts {
            stream_base.push(total_streams);
            total_streams = align(total_streams + l.nbytes);
            staged += l.streams.iter().map(|s| align(s.src.len())).sum::<usize>();
        }
        let cuda = |what| self.cuda(what);
        // The streams packed into page-locked memory, each at an aligned offset.
        // Leased in whole 32 MiB: batches of about one size then reuse one buffer of the
        // device's pool instead of each allocating (page-locking) its own.
        let mut host = self
            .dev
            .pinned(staged.max(1).next_multiple_of(32 << 20))
            .map_err(|e| self.failed("allocating page-locked memory")(e.to_string()))?;
        let mut offsets: Vec<Vec<usize>> = Vec::with_capacity(layouts.len());
        let mut pieces: Vec<(&[u8], usize)> = Vec::new();
        let mut at = 0usize;
        for (f, l) in frames.iter().zip(&layouts) {
            let mut mine = Vec::with_capacity(l.streams.len());
            for s in &l.streams {
                pieces.push((&f[s.src.clone()], at));
                mine.push(at);
                at = align(at + s.src.len());
            }
            offsets.push(mine);
        }
        {
            let buf = host
                .values_mut::<u8>(staged.max(1))
                .map_err(cuda("staging the frames"))?;
            let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
            pack(buf, &pieces, threads.min(16));
        }
        drop(pieces);
        Ok(Packed {
            layouts,
            offsets,
            stream_base,
            total_streams,
            staged,
            decoded,
            host,
            pack_seconds: packing.elapsed().as_secs_f64(),
        })
    }

    /// The device's part of a decode of frames [`DeviceDecoder::prepare`] packed, into
    /// `out` (which must hold their decoded bytes), for a caller that holds the device's
    /// lane. Returns when the device has finished.
    pub(crate) fn decode_packed(
        &self,
        packed: Packed<'_>,
        out: &mut CudaSlice<u8>,
    ) -> Result<DecodeStats, DeviceDecodeError> {
        let Packed {
            layouts,
            offsets,
            stream_base,
            total_streams,
            staged,
            decoded,
            host,
            pack_seconds,
        } = packed;
        if out.len() < decoded {
            return Err(self.failed("checking the output")(format!(
                "{} bytes for {decoded} decoded bytes",
                out.len()
            )));
        }
        let stream = self.dev.stream();
        self.dev
            .bind()
            .map_err(|e| self.failed("binding the device")(e.to_string()))?;
        let cuda = |what| self.cuda(what);
        // Timing events around the device's three steps.
        let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let event = |what: &'static str| stream.record_event(timed).map_err(cuda(what));
        let before_copy = event("recording an event")?;
        let mut staged_dev = stream
            .alloc_zeros::<u8>(staged.max(1))
            .map_err(cuda("allocating the staged frames"))?;
        stream
            .memcpy_htod(
                host.values::<u8>(staged.max(1))
                    .map_err(cuda("staging the frames"))?,
                &mut staged_dev,
            )
            .map_err(cuda("copying the frames to the device"))?;
        host.copied(stream)
            .map_err(cuda("copying the frames to the device"))?;
        let after_copy = event("recording an event")?;
        let mut streams_dev = stream
            .alloc_zeros::<u8>(total_streams.max(1))
            .map_err(cuda("allocating the decoded streams"))?;
        let (staged_ptr, _s) = staged_dev.device_ptr(stream);
        let (streams_ptr, _d) = streams_dev.device_ptr(stream);
        let (staged_ptr, streams_ptr) = (staged_ptr as usize, streams_ptr as usize);
        drop((_s, _d));
        // The compressed streams by codec, the stored ones as copies.
        let (mut lz4, mut zstd) = (Group::default(), Group::default());
        let mut copies: Vec<u64> = Vec::new();
        let mut stats = DecodeStats {
            frames: layouts.len(),
            staged_bytes: staged as u64,
            decoded_bytes: decoded as u64,
            pack_seconds,
            ..DecodeStats::default()
        };
        for (i, l) in layouts.iter().enumerate() {
            for (j, s) in l.streams.iter().enumerate() {
                let src = offsets[i][j];
                let dst = stream_base[i] + s.dst.start;
                if s.stored {
                    copies.extend([src as u64, dst as u64, s.src.len() as u64]);
                    stats.stored_streams += 1;
                    continue;
                }
                let (group, codec) = match l.codec {
                    Some(BloscCodec::Lz4) => (&mut lz4, NvcompCodec::Lz4),
                    Some(BloscCodec::Zstd) => (&mut zstd, NvcompCodec::Zstd),
                    None => {
                        return Err(DeviceDecodeError::Corrupt {
                            frame: i,
                            message: "a compressed stream in a frame stored whole".into(),
                        })
                    }
                };
                if !dst.is_multiple_of(codec.alignment()) {
                    return Err(DeviceDecodeError::Unsupported {
                        frame: i,
                        why: format!(
                            "stream {j} decodes to byte {} of its frame, not a multiple of \
                             the {} bytes nvCOMP needs",
                            s.dst.start,
                            codec.alignment()
                        ),
                    });
                }
                group.inputs.push((staged_ptr + src) as u64);
                group.in_bytes.push(s.src.len());
                group.outputs.push((streams_ptr + dst) as u64);
                group.out_bytes.push(s.dst.len());
                group.names.push((i, j));
                stats.compressed_streams += 1;
            }
        }
        // Checked once the stream has finished, below: no wait between the steps.
        let mut results = Vec::new();
        for (group, codec) in [(&lz4, NvcompCodec::Lz4), (&zstd, NvcompCodec::Zstd)] {
            if !group.inputs.is_empty() {
                results.push((group, self.decompress(group, codec)?));
            }
        }
        let after_decompress = event("recording an event")?;
        let k = self.dev.kernels();
        if !copies.is_empty() {
            let table = stream
                .clone_htod(&copies)
                .map_err(cuda("copying the stored streams' table"))?;
            let n = copies.len() / 3;
            let longest = copies.chunks(3).map(|c| c[2]).max().unwrap_or(1) as usize;
            let mut l = stream.launch_builder(&k.copy_segments);
            let n32 = n as u32;
            l.arg(&mut streams_dev)
                .arg(&staged_dev)
                .arg(&table)
                .arg(&n32);
            // SAFETY: each segment lies inside the staged frames (its source) and the
            // decoded streams (its destination), as the layouts and offsets above place them.
            unsafe { l.launch(config(longest, n)) }.map_err(cuda("copying stored streams"))?;
        }
        // The blocks, one launch per typesize.
        let mut sizes: Vec<usize> = layouts.iter().map(|l| l.typesize).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut out_base = 0usize;
        let mut tables: Vec<(usize, Vec<u64>, usize)> =
            sizes.iter().map(|&t| (t, Vec::new(), 1)).collect();
        for (i, l) in layouts.iter().enumerate() {
            let (_, table, longest) = tables
                .iter_mut()
                .find(|(t, ..)| *t == l.typesize)
                .expect("every typesize has a table");
            for b in &l.blocks {
                let kind = match b.shuffle {
                    BlockShuffle::None => 0,
                    BlockShuffle::Byte => 1,
                    BlockShuffle::Bit => 2,
                };
                table.extend([
                    (stream_base[i] + b.at.start) as u64,
                    (out_base + b.at.start) as u64,
                    b.at.len() as u64,
                    kind,
                ]);
                *longest = (*longest).max(b.at.len());
            }
            out_base += l.nbytes;
        }
        for (typesize, table, longest) in &tables {
            let dev_table = stream
                .clone_htod(table)
                .map_err(cuda("copying the blocks' table"))?;
            let n = table.len() / 4;
            let (n32, t32) = (n as u32, *typesize as u32);
            let mut l = stream.launch_builder(&k.blosc_unshuffle);
            l.arg(&mut *out)
                .arg(&streams_dev)
                .arg(&dev_table)
                .arg(&n32)
                .arg(&t32);
            // SAFETY: every block reads its bytes of the decoded streams and writes its
            // bytes of `out`, which holds every frame's decoded bytes (checked above).
            unsafe { l.launch(config(longest / 8, n)) }.map_err(cuda("unshuffling blocks"))?;
        }
        let done = event("recording an event")?;
        stream
            .synchronize()
            .map_err(cuda("waiting for the decode"))?;
        for (group, r) in results {
            r.check(group, self)?;
        }
        let seconds = |a: &cudarc::driver::CudaEvent, b| {
            a.elapsed_ms(b)
                .map(|ms| f64::from(ms) / 1e3)
                .map_err(cuda("reading the events"))
        };
        stats.copy_seconds = seconds(&before_copy, &after_copy)?;
        stats.decompress_seconds = seconds(&after_copy, &after_decompress)?;
        stats.unshuffle_seconds = seconds(&after_decompress, &done)?;
        Ok(stats)
    }

    /// Enqueues the decompression of one codec's streams by nvCOMP; what it returns checks
    /// every stream's status and decoded size once the stream has finished.
    fn decompress(&self, g: &Group, codec: NvcompCodec) -> Result<Decompressed, DeviceDecodeError> {
        let stream = self.dev.stream();
        let cuda = |what| self.cuda(what);
        let n = g.inputs.len();
        let total: usize = g.out_bytes.iter().sum();
        let max = g.out_bytes.iter().copied().max().unwrap_or(0);
        let temp_bytes = self
            .nvcomp
            .temp_bytes(codec, n, max, total, stream)
            .map_err(self.failed("sizing nvCOMP's scratch"))?;
        let inputs = stream
            .clone_htod(&g.inputs)
            .map_err(cuda("copying tables"))?;
        let in_bytes = stream
            .clone_htod(&g.in_bytes)
            .map_err(cuda("copying tables"))?;
        let outputs = stream
            .clone_htod(&g.outputs)
            .map_err(cuda("copying tables"))?;
        let capacity = stream
            .clone_htod(&g.out_bytes)
            .map_err(cuda("copying tables"))?;
        let mut actual = stream
            .alloc_zeros::<usize>(n)
            .map_err(cuda("allocating nvCOMP's results"))?;
        let mut statuses = stream
            .alloc_zeros::<i32>(n)
            .map_err(cuda("allocating nvCOMP's results"))?;
        let mut temp = stream
            .alloc_zeros::<u8>(temp_bytes.max(1))
            .map_err(cuda("allocating nvCOMP's scratch"))?;
        {
            let (pi, _a) = inputs.device_ptr(stream);
            let (pb, _b) = in_bytes.device_ptr(stream);
            let (po, _c) = outputs.device_ptr(stream);
            let (pc, _d) = capacity.device_ptr(stream);
            let (pa, _e) = actual.device_ptr_mut(stream);
            let (ps, _f) = statuses.device_ptr_mut(stream);
            let (pt, _g) = temp.device_ptr_mut(stream);
            // SAFETY: n entries in every table; each input lies in the staged frames and
            // each output in the decoded streams with its capacity, all aligned to ALIGN
            // (checked against the codec's alignment when the batch was built); the
            // scratch has nvCOMP's size for this batch. The buffers live in the
            // `Decompressed` returned, which `decode` keeps until the stream has finished.
            unsafe {
                self.nvcomp
                    .decompress(codec, n, pi, pb, pc, pa, pt, temp_bytes, po, ps, stream)
            }
            .map_err(self.failed("decompressing"))?;
        }
        // The tables and the scratch must outlive the work queued on them.
        Ok(Decompressed {
            actual,
            statuses,
            _tables: [inputs, outputs],
            _sizes: [in_bytes, capacity],
            _scratch: temp,
        })
    }
}

/// One codec's decompression, queued: its results on the device, and the buffers its
/// work reads.
struct Decompressed {
    actual: CudaSlice<usize>,
    statuses: CudaSlice<i32>,
    /// The input and output tables, their sizes, and nvCOMP's scratch.
    _tables: [CudaSlice<u64>; 2],
    _sizes: [CudaSlice<usize>; 2],
    _scratch: CudaSlice<u8>,
}

impl Decompressed {
    /// Every stream's status and decoded size, after the stream has finished.
    fn check(&self, g: &Group, d: &DeviceDecoder<'_>) -> Result<(), DeviceDecodeError> {
        let stream = d.dev.stream();
        let cuda = |what| d.cuda(what);
        let n = g.inputs.len();
        let mut got = vec![0usize; n];
        let mut status = vec![0i32; n];
        stream
            .memcpy_dtoh(&self.actual, &mut got)
            .map_err(cuda("reading nvCOMP's results"))?;
        stream
            .memcpy_dtoh(&self.statuses, &mut status)
            .map_err(cuda("reading nvCOMP's results"))?;
        stream.synchronize().map_err(cuda("waiting for nvCOMP"))?;
        for s in 0..n {
            let (frame, st) = g.names[s];
            if status[s] != 0 || got[s] != g.out_bytes[s] {
                return Err(DeviceDecodeError::Corrupt {
                    frame,
                    message: format!(
                        "stream {st}: nvCOMP gave {} of {} bytes: {} ({})",
                        got[s],
                        g.out_bytes[s],
                        nvcomp_status_name(status[s]),
                        status[s]
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A grid of `rows` rows (at most 65,535, the rest strided) and enough blocks along them
/// for `width` items (at most 1,024 blocks: the kernels stride along a row).
fn config(width: usize, rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            (width as u32).div_ceil(THREADS).clamp(1, 1024),
            rows.clamp(1, 65_535) as u32,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The threads' runs together write what one copy in order writes, for any number of
    /// threads and pieces (empty ones too), and nothing between the pieces.
    #[test]
    fn packing_on_threads_writes_every_piece_where_one_copy_would() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for case in 0..40 {
            let count = next(60) as usize;
            let data: Vec<Vec<u8>> = (0..count)
                .map(|_| {
                    let big = next(4) == 0;
                    let len = if big { next(3 << 20) } else { next(300) } as usize;
                    (0..len).map(|_| next(256) as u8).collect()
                })
                .collect();
            let mut pieces = Vec::new();
            let mut at = 0;
            for d in &data {
                pieces.push((d.as_slice(), at));
                at = align(at + d.len());
            }
            let mut want = vec![0xAAu8; at + 7];
            for (p, at) in &pieces {
                want[*at..*at + p.len()].copy_from_slice(p);
            }
            for threads in [1, 2, 3, 16] {
                let mut got = vec![0xAAu8; at + 7];
                pack(&mut got, &pieces, threads);
                assert!(got == want, "case {case}, {threads} threads");
            }
        }
    }
}
