//! Blosc 1 frames of LZ4 or stored streams, decoded here rather than by c-blosc.
//!
//! # Why
//!
//! A float32 array written by zarr-python with Blosc lz4 + bitshuffle (its default codec)
//! stores each block as four streams, one per byte of the values: the three low bytes of
//! random mantissas do not compress, so Blosc stores them as they are. c-blosc copies each
//! stored stream into a temporary buffer, bit-untransposes it (with SSE2 code: the bundled
//! library is built without AVX2), and `blosc_getitem` copies the result once more into
//! the destination. Profiles of `rankwise rsvd --zarr` showed those copies (c-blosc's
//! `fastcopy`) taking a quarter of all CPU time, more than the untransposition itself.
//!
//! Here a stored stream is read where it lies (in the frame in memory: the chunk file is
//! mapped, see `direct.rs`), only LZ4
//! streams are decompressed (into a block-sized scratch buffer that stays in cache), and the
//! untransposition writes straight into the destination: with AVX-512 (BW, VBMI) and GFNI,
//! 64 groups of eight values at a time, one `vgf2p8affineqb` per eight 8×8 bit
//! transposes; elsewhere a portable 8×8 transpose per group.
//!
//! Frames with another compressor (zstd, zlib, BloscLZ, Snappy) or a format this module
//! does not know are left to c-blosc ([`Frame::parse`] returns `None`).
//!
//! # The format (c-blosc 1.x, `blosc.c`)
//!
//! A 16-byte header — format version, compressor version, flags, typesize, then the
//! decoded size, the block size and the frame size as little-endian `u32` — and, unless the
//! frame is stored whole (flag `0x02`), one `u32` offset per block. A block is `nsplits`
//! streams (`typesize` of them when flag `0x10` is clear, the typesize is at most 16, the
//! block holds at least 128 values and is not the short last block; else one), each an
//! `i32` size and the stream: stored when the size equals the stream's decoded size, LZ4
//! otherwise. The concatenated streams are the shuffled block: byte-shuffled (flag
//! `0x01`): `typesize` planes, plane `j` holding byte `j` of every value; bit-shuffled
//! (flag `0x04`): `8·typesize` rows of `n/8` bytes, row `8j + k` holding bit `k` of byte
//! `j` of every value, value `i` at bit `i mod 8` of byte `i/8` — when the block's `n`
//! values are a multiple of 8; otherwise the block is not shuffled at all. Bytes past the
//! last whole value are stored unshuffled.

use std::ops::Range;

/// Flag: the block is byte-shuffled.
const DOSHUFFLE: u8 = 0x01;
/// Flag: the frame is stored whole, without blocks.
const MEMCPYED: u8 = 0x02;
/// Flag: the block is bit-shuffled.
const DOBITSHUFFLE: u8 = 0x04;
/// Flag: blocks are never split into streams.
const DONT_SPLIT: u8 = 0x10;
/// Compressor code of LZ4 (and LZ4HC, which shares its format), in the flags' top 3 bits.
const LZ4: u8 = 1;
/// c-blosc's `MAX_SPLITS` and `MIN_BUFFERSIZE`.
const MAX_SPLITS: usize = 16;
const MIN_BUFFERSIZE: usize = 128;
/// Header bytes.
const HEADER: usize = 16;

/// How a block's streams are shuffled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shuffle {
    None,
    Byte,
    Bit,
}

/// Which untransposition kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernels {
    /// AVX-512 BW + VBMI + GFNI where the CPU has them, else portable.
    Detect,
    /// Portable code only (tests compare both).
    #[cfg(test)]
    Portable,
}

/// A parsed Blosc 1 frame that this module decodes.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
    /// The frame.
    src: &'a [u8],
    /// Bytes of the whole frame.
    len: usize,
    flags: u8,
    typesize: usize,
    nbytes: usize,
    blocksize: usize,
}

/// Reusable buffers of the decoder: the decompressed streams of one block, and one decoded
/// block for blocks that only partly fall in the requested range.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    streams: Vec<u8>,
    block: Vec<u8>,
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl<'a> Frame<'a> {
    /// Parses the header of `src`. `Ok(None)` when the frame is valid for c-blosc to try
    /// but not one this module decodes (another compressor); an error when the header or
    /// block offsets do not fit `src`.
    pub(crate) fn parse(src: &'a [u8]) -> Result<Option<Frame<'a>>, String> {
        if src.len() >= HEADER && src[2] >> 5 != LZ4 && src[2] & MEMCPYED == 0 {
            return Ok(None);
        }
        Frame::parse_any(src)
    }

    /// [`Frame::parse`] of a frame of any compressor (for [`BloscLayout::of`], whose
    /// streams another decoder decompresses). `Ok(None)` for a format version this module
    /// does not know.
    fn parse_any(src: &'a [u8]) -> Result<Option<Frame<'a>>, String> {
        let len = src.len();
        let bad = |what: &str| Err(format!("not a valid Blosc frame ({len} bytes; {what})"));
        if len < HEADER {
            return bad("shorter than its header");
        }
        let (version, flags, typesize) = (src[0], src[2], src[3] as usize);
        let nbytes = le32(src, 4).unwrap_or(0) as usize;
        let blocksize = le32(src, 8).unwrap_or(0) as usize;
        let cbytes = le32(src, 12).unwrap_or(0) as usize;
        if version == 0 || version > 2 {
            return Ok(None);
        }
        if cbytes != len {
            return bad(&format!(
                "its header gives {cbytes} bytes: truncated or corrupt"
            ));
        }
        if typesize == 0 || nbytes > 0 && blocksize == 0 {
            return bad("a zero typesize or block size");
        }
        let frame = Frame {
            src,
            len,
            flags,
            typesize,
            nbytes,
            blocksize,
        };
        if flags & MEMCPYED != 0 {
            if len != HEADER + nbytes {
                return bad("a stored frame of the wrong length");
            }
            return Ok(Some(frame));
        }
        let nblocks = frame.nblocks();
        if HEADER + 4 * nblocks > len {
            return bad("block offsets past its end");
        }
        Ok(Some(frame))
    }

    /// Decoded bytes of the frame.
    pub(crate) fn nbytes(&self) -> usize {
        self.nbytes
    }

    fn nblocks(&self) -> usize {
        self.nbytes.div_ceil(self.blocksize.max(1))
    }

    /// Decodes bytes `part` of the decoded frame into `dest` (`part.len()` bytes), reading
    /// only the blocks that hold them.
    pub(crate) fn decode(
        &self,
        part: Range<usize>,
        dest: &mut [u8],
        scratch: &mut Scratch,
        kernels: Kernels,
    ) -> Result<(), String> {
        if part.end > self.nbytes || part.start > part.end || dest.len() != part.len() {
            return Err(format!(
                "bytes {}..{} asked of a Blosc frame of {} bytes",
                part.start, part.end, self.nbytes
            ));
        }
        if self.flags & MEMCPYED != 0 {
            dest.copy_from_slice(&self.src[HEADER + part.start..HEADER + part.end]);
            return Ok(());
        }
        if part.is_empty() {
            return Ok(());
        }
        let bs = self.blocksize;
        for b in part.start / bs..part.end.div_ceil(bs) {
            let block = b * bs..((b + 1) * bs).min(self.nbytes);
            let want = block.start.max(part.start)..block.end.min(part.end);
            let out = &mut dest[want.start - part.start..want.end - part.start];
            let data = self.block_bytes(b, block.len())?;
            if want == block {
                self.decode_block(b, data, out, &mut scratch.streams, kernels)?;
            } else {
                let mut whole = std::mem::take(&mut scratch.block);
                whole.resize(block.len(), 0);
                let r = self.decode_block(b, data, &mut whole, &mut scratch.streams, kernels);
                out.copy_from_slice(&whole[want.start - block.start..want.end - block.start]);
                scratch.block = whole;
                r?;
            }
        }
        Ok(())
    }

    /// The compressed bytes of block `b` (`bsize` bytes decoded), from its offset to the
    /// next block's, or at most what its streams can take (each split stored whole, with
    /// its size) and never past the frame.
    fn block_bytes(&self, b: usize, bsize: usize) -> Result<&'a [u8], String> {
        let Some(start) = le32(self.src, HEADER + 4 * b).map(|v| v as usize) else {
            return Err(format!(
                "corrupt Blosc block {b}: its offset lies past the frame"
            ));
        };
        if start > self.len {
            return Err(format!(
                "corrupt Blosc block {b}: it starts at byte {start} of a {}-byte frame",
                self.len
            ));
        }
        // c-blosc writes the blocks in order, so the next block's offset ends this one;
        // otherwise (or for the last block) it ends where its streams must, or the frame.
        let most = bsize.saturating_add(4 * MAX_SPLITS.min(self.typesize.max(1)));
        let mut end = start.saturating_add(most).min(self.len);
        if b + 1 < self.nblocks() {
            if let Some(next) = le32(self.src, HEADER + 4 * (b + 1)).map(|v| v as usize) {
                if next > start && next < end {
                    end = next;
                }
            }
        }
        Ok(&self.src[start..end])
    }

    /// The streams a block of `bsize` decoded bytes is split into: one per byte of the
    /// values (`typesize`), unless the frame says it never splits, the values are wider
    /// than 16 bytes, the block holds fewer than 128 values or it is the short last block.
    fn nsplits(&self, bsize: usize) -> usize {
        let t = self.typesize;
        let leftover = bsize < self.blocksize;
        if self.flags & DONT_SPLIT == 0
            && t <= MAX_SPLITS
            && bsize / t >= MIN_BUFFERSIZE
            && !leftover
        {
            t
        } else {
            1
        }
    }

    /// How a block of `bsize` decoded bytes was shuffled, as the flags say (a bit-shuffled
    /// block whose values are not a multiple of 8 is stored as is: see the module docs).
    fn shuffle(&self, bsize: usize) -> Shuffle {
        if self.flags & DOSHUFFLE != 0 && self.typesize > 1 {
            Shuffle::Byte
        } else if self.flags & DOBITSHUFFLE != 0 && bsize >= self.typesize {
            Shuffle::Bit
        } else {
            Shuffle::None
        }
    }

    /// Decodes block `b`, whose compressed bytes begin `data`, into `out` (the block's
    /// decoded size).
    fn decode_block(
        &self,
        b: usize,
        data: &[u8],
        out: &mut [u8],
        streams: &mut Vec<u8>,
        kernels: Kernels,
    ) -> Result<(), String> {
        let corrupt = |what: String| Err(format!("corrupt Blosc block {b}: {what}"));
        let bsize = out.len();
        let t = self.typesize;
        let (nsplits, shuffle) = (self.nsplits(bsize), self.shuffle(bsize));
        let neblock = bsize / nsplits;
        let mut at = 0usize;
        // Each split as a slice: where it lies in the frame when stored, else decompressed
        // into `streams`. An unshuffled block decompresses straight into `out`.
        let mut stored: [Option<(usize, usize)>; MAX_SPLITS] = [None; MAX_SPLITS];
        if shuffle != Shuffle::None {
            streams.resize(bsize, 0);
        }
        for s in 0..nsplits {
            let Some(cbytes) = le32(data, at).map(|v| v as i32) else {
                return corrupt(format!("stream {s} starts past the frame"));
            };
            at += 4;
            if cbytes < 0 || cbytes as usize > data.len() - at {
                return corrupt(format!("stream {s} of {cbytes} bytes runs past the frame"));
            }
            let cbytes = cbytes as usize;
            let input = &data[at..at + cbytes];
            if cbytes == neblock {
                if shuffle == Shuffle::None {
                    out[s * neblock..(s + 1) * neblock].copy_from_slice(input);
                } else {
                    stored[s] = Some((at, cbytes));
                }
            } else {
                let target = if shuffle == Shuffle::None {
                    &mut out[s * neblock..(s + 1) * neblock]
                } else {
                    &mut streams[s * neblock..(s + 1) * neblock]
                };
                lz4_decompress(input, target)
                    .map_err(|e| format!("corrupt Blosc block {b}, stream {s}: {e}"))?;
            }
            at += cbytes;
        }
        if shuffle == Shuffle::None {
            return Ok(());
        }
        // The shuffled block, split by split.
        let split = |s: usize| -> &[u8] {
            match stored[s] {
                Some((at, len)) => &data[at..at + len],
                None => &streams[s * neblock..(s + 1) * neblock],
            }
        };
        let n = bsize / t;
        // Plane `j` (bytes `j·n..(j+1)·n` of the shuffled block) lies inside one split,
        // since splits are either the whole block or one plane each.
        let plane = |j: usize| -> &[u8] {
            let s = (j * n) / neblock;
            let off = j * n - s * neblock;
            &split(s)[off..off + n]
        };
        let tail = |out: &mut [u8]| {
            // Bytes past the last whole value, unshuffled at the end of the block.
            let whole = n * t;
            let mut done = 0;
            for s in 0..nsplits {
                let sp = split(s);
                let range = s * neblock..s * neblock + sp.len();
                let lo = range.start.max(whole);
                if lo < range.end {
                    out[lo..range.end].copy_from_slice(&sp[lo - range.start..]);
                    done += range.end - lo;
                }
            }
            debug_assert_eq!(done, bsize - whole);
        };
        match shuffle {
            Shuffle::Byte => {
                with_slices(t, plane, |planes| {
                    interleave(planes, n, &mut out[..n * t], kernels)
                });
                tail(out);
            }
            Shuffle::Bit if n.is_multiple_of(8) => {
                with_slices(t, plane, |planes| {
                    bit_unshuffle(planes, n, &mut out[..n * t], kernels)
                });
                tail(out);
            }
            _ => {
                // Bit-shuffle flagged but not applied (values not a multiple of 8): the
                // block is stored as is.
                for s in 0..nsplits {
                    let sp = split(s);
                    out[s * neblock..s * neblock + sp.len()].copy_from_slice(sp);
                }
            }
        }
        Ok(())
    }
}

/// Compressor code of Zstandard, in the flags' top 3 bits.
const ZSTD: u8 = 4;

/// The compressor of a frame's streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BloscCodec {
    /// LZ4 (or LZ4HC: the same format).
    Lz4,
    /// Zstandard: each stream is one zstd frame.
    Zstd,
}

/// How a block of a decoded frame is put together from its streams, concatenated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockShuffle {
    /// As they are.
    None,
    /// Byte-shuffled: `typesize` planes of `n` bytes, plane `j` holding byte `j` of every
    /// value; bytes past the last whole value as they are.
    Byte,
    /// Bit-shuffled (`n` a multiple of 8): `8·typesize` rows of `n/8` bytes, row `8j + k`
    /// holding bit `k` of byte `j` of every value, value `i` at bit `i mod 8` of byte
    /// `i/8`; bytes past the last whole value as they are.
    Bit,
}

/// One stream of a frame: bytes `src` of the frame, which decode (decompressed, or copied
/// when `stored`) to bytes `dst` of the concatenated streams of their block, numbered as
/// the decoded frame's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BloscStream {
    /// Where the stream lies in the frame.
    pub src: Range<usize>,
    /// Where it decodes to.
    pub dst: Range<usize>,
    /// Stored as is (incompressible), not compressed.
    pub stored: bool,
}

/// One block of a decoded frame: its bytes, and how its streams are shuffled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BloscBlock {
    /// The block's bytes of the decoded frame.
    pub at: Range<usize>,
    /// How its concatenated streams become its bytes.
    pub shuffle: BlockShuffle,
}

/// The layout of a Blosc 1 frame of LZ4 or Zstandard streams, for a decoder other than
/// this module's (the GPU's: streams decompressed in a batch, blocks unshuffled by a
/// kernel): where each stream lies and decodes to, and how each block is shuffled.
/// Decoding every stream into its `dst` and unshuffling every block gives the frame's
/// bytes as c-blosc decodes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BloscLayout {
    /// The streams' compressor (`None`: a frame stored whole, whose one stream is stored).
    pub codec: Option<BloscCodec>,
    /// Bytes per value.
    pub typesize: usize,
    /// Decoded bytes of the frame.
    pub nbytes: usize,
    /// Every stream of every block, in order.
    pub streams: Vec<BloscStream>,
    /// Every block, in order.
    pub blocks: Vec<BloscBlock>,
}

impl BloscLayout {
    /// The layout of the frame `src`. `Ok(None)` for a frame of another compressor
    /// (BloscLZ, Snappy, zlib) or an unknown format version: decode it on the host. An
    /// error when its header, offsets or stream sizes do not fit `src`.
    pub fn of(src: &[u8]) -> Result<Option<BloscLayout>, String> {
        let Some(f) = Frame::parse_any(src)? else {
            return Ok(None);
        };
        let mut layout = BloscLayout {
            codec: None,
            typesize: f.typesize,
            nbytes: f.nbytes,
            streams: Vec::new(),
            blocks: Vec::new(),
        };
        if f.flags & MEMCPYED != 0 {
            layout.streams.push(BloscStream {
                src: HEADER..HEADER + f.nbytes,
                dst: 0..f.nbytes,
                stored: true,
            });
            layout.blocks.push(BloscBlock {
                at: 0..f.nbytes,
                shuffle: BlockShuffle::None,
            });
            return Ok(Some(layout));
        }
        layout.codec = match f.flags >> 5 {
            LZ4 => Some(BloscCodec::Lz4),
            ZSTD => Some(BloscCodec::Zstd),
            _ => return Ok(None),
        };
        let bs = f.blocksize;
        for b in 0..f.nblocks() {
            let block = b * bs..((b + 1) * bs).min(f.nbytes);
            let bsize = block.len();
            let data = f.block_bytes(b, bsize)?;
            // Where `data` starts in the frame (block_bytes checked the offset).
            let base = le32(src, HEADER + 4 * b).unwrap_or(0) as usize;
            let nsplits = f.nsplits(bsize);
            let neblock = bsize / nsplits;
            let mut at = 0usize;
            for s in 0..nsplits {
                let corrupt = |what: &str| format!("corrupt Blosc block {b}, stream {s}: {what}");
                let cbytes = le32(data, at).ok_or_else(|| corrupt("starts past the frame"))?;
                at += 4;
                let cbytes = cbytes as i32;
                if cbytes <= 0 || cbytes as usize > data.len() - at {
                    return Err(corrupt(&format!("{cbytes} bytes run past the frame")));
                }
                let cbytes = cbytes as usize;
                let dst = block.start + s * neblock..block.start + (s + 1) * neblock;
                layout.streams.push(BloscStream {
                    src: base + at..base + at + cbytes,
                    dst,
                    stored: cbytes == neblock,
                });
                at += cbytes;
            }
            let shuffle = match f.shuffle(bsize) {
                Shuffle::Byte => BlockShuffle::Byte,
                Shuffle::Bit if (bsize / f.typesize).is_multiple_of(8) => BlockShuffle::Bit,
                _ => BlockShuffle::None,
            };
            layout.blocks.push(BloscBlock { at: block, shuffle });
        }
        Ok(Some(layout))
    }

    /// Decodes every stream of `frame` (whose layout this is) into its `dst` bytes of
    /// `out` (`nbytes` long): the blocks' concatenated streams before unshuffling, what a
    /// batched decompression on the device produces. On the host, for checking such a
    /// decoder and its unshuffling kernel.
    pub fn decompress_streams(&self, frame: &[u8], out: &mut [u8]) -> Result<(), String> {
        if out.len() != self.nbytes {
            return Err(format!(
                "{} bytes given for a frame of {}",
                out.len(),
                self.nbytes
            ));
        }
        for (i, st) in self.streams.iter().enumerate() {
            let input = frame
                .get(st.src.clone())
                .ok_or_else(|| format!("stream {i} lies past the frame"))?;
            let target = &mut out[st.dst.clone()];
            if st.stored {
                target.copy_from_slice(input);
                continue;
            }
            match self.codec {
                Some(BloscCodec::Lz4) => lz4_decompress(input, target),
                Some(BloscCodec::Zstd) => match zstd::bulk::decompress_to_buffer(input, target) {
                    Ok(n) if n == target.len() => Ok(()),
                    Ok(n) => Err(format!("zstd gave {n} bytes of {}", target.len())),
                    Err(e) => Err(format!("zstd: {e}")),
                },
                None => Err("a compressed stream in a stored frame".into()),
            }
            .map_err(|e| format!("stream {i}: {e}"))?;
        }
        Ok(())
    }
}

/// Calls `f` with the `t` slices `get(0..t)`, on the stack for the typesizes Blosc splits
/// (up to 16 bytes), so that no block or strip allocates.
fn with_slices<'s, R>(
    t: usize,
    get: impl Fn(usize) -> &'s [u8],
    f: impl FnOnce(&[&'s [u8]]) -> R,
) -> R {
    if t <= MAX_SPLITS {
        let mut a: [&[u8]; MAX_SPLITS] = [&[]; MAX_SPLITS];
        for (j, s) in a[..t].iter_mut().enumerate() {
            *s = get(j);
        }
        f(&a[..t])
    } else {
        let v: Vec<&[u8]> = (0..t).map(get).collect();
        f(&v)
    }
}

/// Decompresses one LZ4 block into exactly `out.len()` bytes.
fn lz4_decompress(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    let (Ok(cin), Ok(cout)) = (i32::try_from(input.len()), i32::try_from(out.len())) else {
        return Err("an LZ4 stream larger than 2 GiB".into());
    };
    // SAFETY: LZ4_decompress_safe reads at most `cin` bytes of `input` and writes at most
    // `cout` bytes into `out`, whatever the input holds.
    let n = unsafe {
        lz4_sys::LZ4_decompress_safe(input.as_ptr().cast(), out.as_mut_ptr().cast(), cin, cout)
    };
    if n as usize != out.len() || n < 0 {
        return Err(format!(
            "LZ4 gave {n} bytes, expected {} (status {n})",
            out.len()
        ));
    }
    Ok(())
}

/// True when the AVX-512 kernels can run here.
fn simd_available(kernels: Kernels) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        kernels == Kernels::Detect
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("gfni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = kernels;
        false
    }
}

/// Values per strip of the bit untransposition: 64 groups of eight.
const STRIP: usize = 512;

/// The SIMD kernels, when they run here.
#[cfg(target_arch = "x86_64")]
type Simd = Option<simd::Zips>;
#[cfg(not(target_arch = "x86_64"))]
type Simd = Option<()>;

fn simd_kernels(kernels: Kernels) -> Simd {
    if !simd_available(kernels) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: AVX-512F was detected.
        Some(unsafe { simd::Zips::new() })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `out[i·t + j] = planes[j][i]` for `i < n`.
fn interleave(planes: &[&[u8]], n: usize, out: &mut [u8], kernels: Kernels) {
    interleave_with(planes, n, out, &simd_kernels(kernels));
}

fn interleave_with(planes: &[&[u8]], n: usize, out: &mut [u8], simd: &Simd) {
    let t = planes.len();
    debug_assert_eq!(out.len(), n * t);
    let mut i0 = 0;
    #[cfg(target_arch = "x86_64")]
    if let (Some(z), true) = (simd, matches!(t, 1 | 2 | 4 | 8)) {
        let full = n / 64 * 64;
        // SAFETY: the features were detected; every plane holds `n ≥ full` bytes and `out`
        // holds `n·t`.
        unsafe { z.interleave(planes, full, out) };
        i0 = full;
    }
    for i in i0..n {
        for (j, p) in planes.iter().enumerate() {
            out[i * t + j] = p[i];
        }
    }
}

/// Undoes the bit shuffle of `t = planes.len()` planes of `n` values (`n` a multiple of
/// 8): plane `j` is rows `8j..8j+8` of `n/8` bytes.
fn bit_unshuffle(planes: &[&[u8]], n: usize, out: &mut [u8], kernels: Kernels) {
    let t = planes.len();
    let l = n / 8;
    let simd = simd_kernels(kernels);
    // One strip of each plane's bytes (value `i` of the strip at `bytes[j·STRIP + i]`), on
    // the stack up to typesize 16.
    let mut stack = [0u8; MAX_SPLITS * STRIP];
    let mut heap = Vec::new();
    let bytes: &mut [u8] = if t <= MAX_SPLITS {
        &mut stack[..t * STRIP]
    } else {
        heap.resize(t * STRIP, 0);
        &mut heap
    };
    let mut g0 = 0;
    while g0 < l {
        let groups = (l - g0).min(STRIP / 8);
        let vals = groups * 8;
        for (j, p) in planes.iter().enumerate() {
            let dst = &mut bytes[j * STRIP..j * STRIP + vals];
            #[cfg(target_arch = "x86_64")]
            if let (Some(z), true) = (&simd, groups == STRIP / 8) {
                // SAFETY: features detected; rows `k·l + g0 .. + 64` lie in the plane
                // (`g0 + 64 ≤ l`), and `dst` holds 512 bytes.
                unsafe { z.untranspose_strip(p, l, g0, dst) };
                continue;
            }
            untranspose_portable(p, l, g0..g0 + groups, dst);
        }
        let dst = &mut out[g0 * 8 * t..(g0 * 8 + vals) * t];
        with_slices(
            t,
            |j| &bytes[j * STRIP..j * STRIP + vals],
            |strip| interleave_with(strip, vals, dst, &simd),
        );
        g0 += groups;
    }
}

/// Portable untransposition of groups `groups` of one plane: `dst[8(g − g0) + m]` is byte
/// `m` of the 8×8 bit transpose of the bytes `plane[k·l + g]`, `k = 0..8`.
fn untranspose_portable(plane: &[u8], l: usize, groups: Range<usize>, dst: &mut [u8]) {
    let g0 = groups.start;
    for g in groups {
        let mut x = 0u64;
        for k in 0..8 {
            x |= (plane[k * l + g] as u64) << (8 * k);
        }
        dst[8 * (g - g0)..8 * (g - g0) + 8].copy_from_slice(&transpose8(x).to_le_bytes());
    }
}

/// The 8×8 bit matrix transpose of `x` (byte `k` bit `m` → byte `m` bit `k`).
fn transpose8(mut x: u64) -> u64 {
    let mut t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
    x ^= t ^ (t << 28);
    x
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// Index vectors of the two-register permutes that zip bytes, words and dwords: `lo`
    /// interleaves the low halves of two registers (unit `2i` from the first, `2i + 1` from
    /// the second), `hi` the high halves.
    pub(super) struct Zips {
        b: [__m512i; 2],
        w: [__m512i; 2],
        d: [__m512i; 2],
    }

    impl Zips {
        #[target_feature(enable = "avx512f")]
        pub(super) fn new() -> Zips {
            fn index(units: usize, hi: bool, width: usize) -> __m512i {
                let mut bytes = [0u8; 64];
                let off = if hi { units / 2 } else { 0 };
                for i in 0..units / 2 {
                    for (slot, v) in [(2 * i, off + i), (2 * i + 1, units + off + i)] {
                        bytes[slot * width..(slot + 1) * width]
                            .copy_from_slice(&(v as u32).to_le_bytes()[..width]);
                    }
                }
                // SAFETY: reading 64 bytes from a 64-byte array.
                unsafe { _mm512_loadu_si512(bytes.as_ptr().cast()) }
            }
            Zips {
                b: [index(64, false, 1), index(64, true, 1)],
                w: [index(32, false, 2), index(32, true, 2)],
                d: [index(16, false, 4), index(16, true, 4)],
            }
        }

        /// Zips 1, 2, 4 or 8 registers of bytes into values: `regs[j]` holds byte `j` of 64
        /// values; `out[..regs.len()]` receives those values, in order.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        fn zip(&self, regs: &[__m512i], out: &mut [__m512i; 8]) {
            let z8 = |a, b, h: usize| _mm512_permutex2var_epi8(a, self.b[h], b);
            let z16 = |a, b, h: usize| _mm512_permutex2var_epi16(a, self.w[h], b);
            let z32 = |a, b, h: usize| _mm512_permutex2var_epi32(a, self.d[h], b);
            match regs.len() {
                1 => out[0] = regs[0],
                2 => {
                    out[0] = z8(regs[0], regs[1], 0);
                    out[1] = z8(regs[0], regs[1], 1);
                }
                4 => {
                    let (a0, a1) = (z8(regs[0], regs[1], 0), z8(regs[0], regs[1], 1));
                    let (b0, b1) = (z8(regs[2], regs[3], 0), z8(regs[2], regs[3], 1));
                    out[0] = z16(a0, b0, 0);
                    out[1] = z16(a0, b0, 1);
                    out[2] = z16(a1, b1, 0);
                    out[3] = z16(a1, b1, 1);
                }
                _ => {
                    // w[2p + h]: values 32h.. as words of bytes (2p, 2p + 1).
                    let mut w = [_mm512_setzero_si512(); 8];
                    for p in 0..4 {
                        w[2 * p] = z8(regs[2 * p], regs[2 * p + 1], 0);
                        w[2 * p + 1] = z8(regs[2 * p], regs[2 * p + 1], 1);
                    }
                    // d[4q + r]: values 16r.. as dwords of bytes 4q..4q + 4.
                    let mut d = [_mm512_setzero_si512(); 8];
                    for h in 0..2 {
                        for q in 0..2 {
                            let (a, b) = (w[4 * q + h], w[4 * q + 2 + h]);
                            d[4 * q + 2 * h] = z16(a, b, 0);
                            d[4 * q + 2 * h + 1] = z16(a, b, 1);
                        }
                    }
                    for r in 0..4 {
                        out[2 * r] = z32(d[r], d[4 + r], 0);
                        out[2 * r + 1] = z32(d[r], d[4 + r], 1);
                    }
                }
            }
        }

        /// `out[i·t + j] = planes[j][i]` for `i < n`, `n` a multiple of 64, `t ∈ {1, 2, 4,
        /// 8}`.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F, BW and VBMI; every plane holds at least `n` bytes
        /// and `out` at least `n·t`.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        pub(super) unsafe fn interleave(&self, planes: &[&[u8]], n: usize, out: &mut [u8]) {
            // SAFETY: the caller's contract, for each plane count.
            unsafe {
                match planes.len() {
                    1 => self.interleave_n::<1>(planes, n, out),
                    2 => self.interleave_n::<2>(planes, n, out),
                    4 => self.interleave_n::<4>(planes, n, out),
                    _ => self.interleave_n::<8>(planes, n, out),
                }
            }
        }

        /// [`Zips::interleave`] of `T` planes. With `T` a constant the zipped registers
        /// stay registers: with a run-time count, the stores of each 64 values became a
        /// `memcpy` call from a stack copy (7% of `read --zarr`'s CPU time).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        unsafe fn interleave_n<const T: usize>(&self, planes: &[&[u8]], n: usize, out: &mut [u8]) {
            let mut regs = [_mm512_setzero_si512(); T];
            let mut zipped = [_mm512_setzero_si512(); 8];
            for c in (0..n).step_by(64) {
                for (j, r) in regs.iter_mut().enumerate() {
                    // SAFETY: c + 64 ≤ n ≤ planes[j].len().
                    *r = unsafe { _mm512_loadu_si512(planes[j].as_ptr().add(c).cast()) };
                }
                self.zip(&regs, &mut zipped);
                for (r, z) in zipped.iter().take(T).enumerate() {
                    // SAFETY: (c + 64)·T ≤ n·T ≤ out.len().
                    unsafe { _mm512_storeu_epi32(out.as_mut_ptr().add(c * T + 64 * r).cast(), *z) };
                }
            }
        }

        /// Untransposes groups `g0..g0 + 64` of one plane (rows `k·l`, `k = 0..8`) into the
        /// 512 bytes of `dst`: the rows' bytes are zipped into one qword per group (row `k`
        /// at byte `7 − k`), and `vgf2p8affineqb`, with those qwords as its matrix operand
        /// and `1 << m` in byte `m` of its vector operand, puts bit `m` of every row into
        /// byte `m`.
        ///
        /// # Safety
        /// The CPU must have AVX-512 F, BW, VBMI and GFNI; `g0 + 64 ≤ l`, the plane holds
        /// `8·l` bytes, `dst` 512.
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,gfni")]
        pub(super) unsafe fn untranspose_strip(
            &self,
            plane: &[u8],
            l: usize,
            g0: usize,
            dst: &mut [u8],
        ) {
            let mut rows = [_mm512_setzero_si512(); 8];
            for k in 0..8 {
                // SAFETY: k·l + g0 + 64 ≤ 8·l.
                rows[7 - k] = unsafe { _mm512_loadu_si512(plane.as_ptr().add(k * l + g0).cast()) };
            }
            let mut q = [_mm512_setzero_si512(); 8];
            self.zip(&rows, &mut q);
            let bits = _mm512_set1_epi64(0x8040_2010_0804_0201u64 as i64);
            for (r, x) in q.iter().enumerate() {
                let v = _mm512_gf2p8affine_epi64_epi8::<0>(bits, *x);
                // SAFETY: 64·(r + 1) ≤ 512 = dst.len().
                unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(64 * r).cast(), v) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame compressed by c-blosc with LZ4.
    fn compress(values: &[u8], typesize: usize, shuffle: i32, blocksize: usize) -> Vec<u8> {
        compress_with(values, typesize, shuffle, blocksize, "lz4")
    }

    /// A frame compressed by c-blosc with `compressor`.
    fn compress_with(
        values: &[u8],
        typesize: usize,
        shuffle: i32,
        blocksize: usize,
        compressor: &str,
    ) -> Vec<u8> {
        let mut out = vec![0u8; values.len() + blosc_src::BLOSC_MAX_OVERHEAD as usize];
        let compressor = std::ffi::CString::new(compressor).unwrap();
        // SAFETY: sizes as documented by blosc_compress_ctx; `out` has room for the worst
        // case (input plus overhead).
        let n = unsafe {
            blosc_src::blosc_compress_ctx(
                5,
                shuffle,
                typesize,
                values.len(),
                values.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                out.len(),
                compressor.as_ptr(),
                blocksize,
                1,
            )
        };
        assert!(n > 0, "blosc_compress_ctx: {n}");
        out.truncate(n as usize);
        out
    }

    /// Values where the low bytes are noise (stored streams) and the high ones repeat
    /// (LZ4 streams), like float data.
    fn values(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if i % 4 == 3 {
                    (i / 4000) as u8
                } else {
                    x as u8
                }
            })
            .collect()
    }

    /// The blocks of `streams` (the concatenated streams) unshuffled as the layout says,
    /// value by value: the definition the device kernel implements.
    fn unshuffle(layout: &BloscLayout, streams: &[u8]) -> Vec<u8> {
        let t = layout.typesize;
        let mut out = streams.to_vec();
        for b in &layout.blocks {
            let (s, n) = (&streams[b.at.clone()], b.at.len() / t);
            let o = &mut out[b.at.clone()];
            for i in 0..n {
                for j in 0..t {
                    o[i * t + j] = match b.shuffle {
                        BlockShuffle::None => s[i * t + j],
                        BlockShuffle::Byte => s[j * n + i],
                        BlockShuffle::Bit => (0..8).fold(0u8, |acc, k| {
                            let row = &s[(8 * j + k) * (n / 8)..];
                            acc | (((row[i / 8] >> (i % 8)) & 1) << k)
                        }),
                    };
                }
            }
        }
        out
    }

    /// The typesizes the frames are written with: one byte, small, odd, and past 16.
    const TYPESIZES: [usize; 7] = [1, 2, 3, 4, 8, 16, 17];
    /// Values and c-blosc block sizes (0: its own): several blocks, a short last block,
    /// one small block, a frame shorter than a block, odd blocks.
    const SIZES: [(usize, usize); 5] = [
        (100_000, 0),
        (64 * 1024 + 13, 8192),
        (1000, 256),
        (37, 0),
        (300_000, 32 * 1024 + 16),
    ];

    #[test]
    fn layouts_decode_lz4_and_zstd_frames_as_c_blosc_does() {
        let mut seed = 11u64;
        for compressor in ["lz4", "zstd", "blosclz"] {
            for &typesize in &TYPESIZES {
                for shuffle in 0i32..3 {
                    for &(len, blocksize) in &SIZES {
                        seed += 1;
                        let v = values(len, seed);
                        let frame = compress_with(&v, typesize, shuffle, blocksize, compressor);
                        let what = format!(
                            "{compressor} typesize {typesize} shuffle {shuffle} len {len} \
                             blocksize {blocksize}"
                        );
                        let Some(layout) = BloscLayout::of(&frame).unwrap() else {
                            assert_eq!(compressor, "blosclz", "{what}");
                            continue;
                        };
                        // BloscLZ frames have none, unless stored whole.
                        assert!(compressor != "blosclz" || layout.codec.is_none(), "{what}");
                        assert_eq!(layout.nbytes, len, "{what}");
                        let mut streams = vec![0u8; len];
                        layout.decompress_streams(&frame, &mut streams).unwrap();
                        assert!(unshuffle(&layout, &streams) == v, "{what}");
                        // The streams tile the decoded frame, and lie inside the frame.
                        let mut next = 0;
                        for st in &layout.streams {
                            assert_eq!(st.dst.start, next, "{what}");
                            next = st.dst.end;
                            assert!(st.src.end <= frame.len(), "{what}");
                        }
                        assert_eq!(next, len, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn corrupt_frames_have_no_layout_and_say_why() {
        let v = values(50_000, 3);
        let frame = compress_with(&v, 4, 2, 4096, "zstd");
        // A stream size past the frame.
        let mut bad = frame.clone();
        let first = le32(&bad, HEADER).unwrap() as usize;
        bad[first..first + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = BloscLayout::of(&bad).unwrap_err();
        assert!(e.contains("corrupt Blosc block 0"), "{e}");
        // Truncated.
        let e = BloscLayout::of(&frame[..frame.len() - 1]).unwrap_err();
        assert!(e.contains("truncated or corrupt"), "{e}");
        // A stream that is not zstd decodes to an error, not a panic.
        let mut garbage = frame.clone();
        let layout = BloscLayout::of(&frame).unwrap().unwrap();
        let st = layout.streams.iter().find(|s| !s.stored).unwrap();
        for x in &mut garbage[st.src.clone()] {
            *x ^= 0x5a;
        }
        let mut out = vec![0u8; layout.nbytes];
        assert!(layout.decompress_streams(&garbage, &mut out).is_err());
    }

    #[test]
    fn decodes_what_c_blosc_wrote_for_every_shuffle_typesize_and_range() {
        let mut seed = 7u64;
        for &typesize in &TYPESIZES {
            for shuffle in 0i32..3 {
                for &(len, blocksize) in &SIZES {
                    seed += 1;
                    let v = values(len, seed);
                    let frame = compress(&v, typesize, shuffle, blocksize);
                    let f = Frame::parse(&frame).unwrap().expect("an lz4 frame");
                    assert_eq!(f.nbytes(), len);
                    let mut scratch = Scratch::default();
                    for kernels in [Kernels::Detect, Kernels::Portable] {
                        let mut out = vec![0u8; len];
                        f.decode(0..len, &mut out, &mut scratch, kernels).unwrap();
                        assert!(
                            out == v,
                            "typesize {typesize} shuffle {shuffle} len {len} {kernels:?}"
                        );
                        for part in [len / 3..len / 2, 1..len.saturating_sub(1), len..len] {
                            if part.start > part.end {
                                continue;
                            }
                            let mut out = vec![0u8; part.len()];
                            f.decode(part.clone(), &mut out, &mut scratch, kernels)
                                .unwrap();
                            assert_eq!(out, &v[part.clone()], "part {part:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_simd_kernels_equal_the_portable_ones_on_every_byte_value() {
        // Every 8×8 bit pattern class through both untransposition kernels.
        for l in [64usize, 128, 200] {
            let plane: Vec<u8> = (0..8 * l).map(|i| (i * 131 + i / 7) as u8).collect();
            let n = 8 * l;
            let mut a = vec![0u8; n];
            let mut b = vec![0u8; n];
            bit_unshuffle(&[&plane], n, &mut a, Kernels::Detect);
            bit_unshuffle(&[&plane], n, &mut b, Kernels::Portable);
            assert_eq!(a, b, "l = {l}");
        }
    }

    #[test]
    fn frames_of_other_compressors_are_left_to_c_blosc() {
        let v = values(10_000, 3);
        let mut out = vec![0u8; v.len() + 16];
        let zstd = std::ffi::CString::new("zstd").unwrap();
        // SAFETY: as in `compress`.
        let n = unsafe {
            blosc_src::blosc_compress_ctx(
                5,
                1,
                4,
                v.len(),
                v.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                out.len(),
                zstd.as_ptr(),
                0,
                1,
            )
        };
        assert!(n > 0);
        assert!(Frame::parse(&out[..n as usize]).unwrap().is_none());
    }

    #[test]
    fn truncated_or_corrupt_frames_are_errors_not_panics() {
        let v = values(200_000, 5);
        let frame = compress(&v, 4, 2, 0);
        assert!(Frame::parse(&frame[..frame.len() - 1]).is_err());
        assert!(Frame::parse(&frame[..10]).is_err());
        let mut scratch = Scratch::default();
        let mut out = vec![0u8; v.len()];
        // Corrupt every few bytes after the header in turn: an error or other bytes,
        // never a panic or a read out of bounds.
        for at in (16..frame.len()).step_by(997) {
            let mut bad = frame.clone();
            bad[at] ^= 0x5A;
            if let Ok(Some(f)) = Frame::parse(&bad) {
                let _ = f.decode(0..v.len(), &mut out, &mut scratch, Kernels::Detect);
            }
        }
    }
}
