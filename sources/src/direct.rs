//! Direct chunk decoding for the codec chains most stores use: no compression, Blosc, zstd,
//! gzip or zlib.
//!
//! # Why not through zarrs
//!
//! zarrs decodes a chunk by reading its file into a fresh vector, decoding into a second
//! fresh vector, and copying that into the destination. For the 400 MB chunks of a
//! genotype or float matrix, those two fresh allocations cost more in page faults than
//! Blosc costs in decoding (measured: about 40% of the time of `rankwise read` on a Blosc
//! lz4 + bitshuffle store went to the kernel, faulting and zeroing new pages). Here a whole
//! chunk is read into a buffer that the reader keeps from chunk to chunk, a part of a Blosc
//! chunk is decoded from the mapped file (only the blocks that hold it), and Blosc frames
//! decode straight into the panel when the chunk lands contiguously in it: LZ4 and
//! stored frames by [`crate::blosc`], other compressors by c-blosc. Every other chain
//! (sharding, big-endian, filters) still goes through zarrs, and so does a missing chunk
//! (the fill value).
//!
//! # Bounded by the chunk, not by what the file says
//!
//! A chunk's decoded size is known from the array's metadata, so nothing here is sized by
//! the file: a chunk file larger than any valid encoding of its chunk ([`max_encoded`]) is
//! refused before a byte of it is read, a chunk path that is not a regular file (a link to
//! `/dev/zero`, a FIFO) is refused, and zstd, gzip and zlib streams are decoded straight
//! into the destination and stopped one byte past the expected size. zarrs decodes those
//! codecs into a vector sized by the stream itself (a 12.8 KB zstd frame that claims
//! 400 MiB is given 400 MiB), which is why they are decoded here too.

use std::io::Read;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::panel::reserve;

/// A codec chain decoded here rather than by zarrs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirectCodec {
    /// The chunk file holds the values as they are (little-endian, C order).
    Raw,
    /// One Blosc (1.x) frame.
    Blosc,
    /// A zstd stream (one or more frames).
    Zstd,
    /// A gzip stream (one or more members).
    Gzip,
    /// A zlib stream (Zarr 2's `zlib` compressor).
    Zlib,
}

impl DirectCodec {
    /// The direct codec of an array, from its metadata (v2 or v3 JSON), when its chain is
    /// one of those above and its values are little-endian in C order.
    pub(crate) fn of(meta: &serde_json::Value) -> Option<DirectCodec> {
        if cfg!(target_endian = "big") {
            return None;
        }
        // A codec without configuration may be written as its bare name (`"bytes"` of a
        // one-byte type).
        let name = |c: &serde_json::Value| {
            c.as_str()
                .or_else(|| {
                    c.get("name")
                        .or_else(|| c.get("id"))
                        .and_then(|v| v.as_str())
                })
                .map(str::to_string)
        };
        if let Some(codecs) = meta.get("codecs").and_then(|v| v.as_array()) {
            // Format 3: `bytes` (little-endian, or no endianness for one-byte types), then
            // nothing or `blosc`.
            let bytes = codecs.first()?;
            let endian = bytes
                .get("configuration")
                .and_then(|c| c.get("endian"))
                .and_then(|e| e.as_str());
            if name(bytes)? != "bytes" || endian.is_some_and(|e| e != "little") {
                return None;
            }
            return match codecs.get(1..)? {
                [] => Some(DirectCodec::Raw),
                [c] => match name(c)?.as_str() {
                    "blosc" => Some(DirectCodec::Blosc),
                    "zstd" => Some(DirectCodec::Zstd),
                    "gzip" => Some(DirectCodec::Gzip),
                    _ => None,
                },
                _ => None,
            };
        }
        // Format 2: no filters, C order, little-endian or one-byte dtype, and no compressor
        // or Blosc.
        let no_filters = match meta.get("filters") {
            None | Some(serde_json::Value::Null) => true,
            Some(f) => f.as_array().is_some_and(|a| a.is_empty()),
        };
        let dtype = meta.get("dtype")?.as_str()?;
        let c_order = meta.get("order").and_then(|o| o.as_str()) == Some("C");
        if !no_filters || !c_order || !(dtype.starts_with('<') || dtype.starts_with('|')) {
            return None;
        }
        match meta.get("compressor") {
            None | Some(serde_json::Value::Null) => Some(DirectCodec::Raw),
            Some(c) => match name(c)?.as_str() {
                "blosc" => Some(DirectCodec::Blosc),
                "zstd" => Some(DirectCodec::Zstd),
                "gzip" => Some(DirectCodec::Gzip),
                "zlib" => Some(DirectCodec::Zlib),
                _ => None,
            },
        }
    }

    /// Whether a byte range of a chunk decodes without decoding the chunk from its start:
    /// uncompressed bytes are read at an offset and Blosc decodes only the blocks that hold
    /// it; a zstd, gzip or zlib stream has to be decoded from its start.
    pub(crate) fn decodes_parts(self) -> bool {
        matches!(self, DirectCodec::Raw | DirectCodec::Blosc)
    }

    /// Bytes a decoder of this codec holds besides the encoded and decoded chunk: the
    /// file's read buffer and the decoder's window (zstd's is capped, see [`zstd_window_log`]).
    pub(crate) fn decoder_bytes(self, whole: u64) -> u64 {
        match self {
            DirectCodec::Raw | DirectCodec::Blosc => 0,
            DirectCodec::Zstd => {
                STREAM_BUFFER as u64 + (1u64 << zstd_window_log(whole as usize)) + (256 << 10)
            }
            DirectCodec::Gzip | DirectCodec::Zlib => STREAM_BUFFER as u64 + (64 << 10),
        }
    }

    /// Reads the chunk file at `path` and decodes it into `dest`, which must be exactly
    /// the decoded size of a whole chunk. `encoded` is the caller's reusable buffer for
    /// the file's bytes. Returns the bytes read from storage, or `None` when the chunk
    /// file does not exist. Errors are messages for the caller to attach the chunk key
    /// to.
    pub(crate) fn decode_file(
        self,
        path: &Path,
        encoded: &mut Vec<u8>,
        dest: &mut [u8],
    ) -> Result<Option<u64>, String> {
        let Some((mut file, len)) = open_chunk(path, self, dest.len())? else {
            return Ok(None);
        };
        let read_error = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
        match self {
            DirectCodec::Raw => {
                if len != dest.len() as u64 {
                    return Err(format!(
                        "the uncompressed chunk is {len} bytes, expected {}",
                        dest.len()
                    ));
                }
                file.read_exact(dest).map_err(read_error)?;
            }
            DirectCodec::Blosc => {
                read_whole(file, len, encoded).map_err(read_error)?;
                blosc_decode(encoded, dest)?;
            }
            DirectCodec::Zstd | DirectCodec::Gzip | DirectCodec::Zlib => {
                let whole = dest.len();
                let mut stream = self.stream(file.take(len), whole)?;
                read_stream(&mut *stream, dest, self)?;
                finish_stream(&mut *stream, whole, self)?;
            }
        }
        Ok(Some(len))
    }

    /// The encoded bytes of chunk file `path` (a chunk of `whole` decoded bytes), appended
    /// to `encoded` after clearing it; `None` when the file does not exist. The file is
    /// checked as [`DirectCodec::decode_file`] checks it before anything is read.
    pub(crate) fn read_file(
        self,
        path: &Path,
        whole: usize,
        encoded: &mut Vec<u8>,
    ) -> Result<Option<u64>, String> {
        let Some((file, len)) = open_chunk(path, self, whole)? else {
            return Ok(None);
        };
        read_whole(file, len, encoded)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(Some(len))
    }

    /// Decodes the encoded chunk `src` into `dest`, which must be exactly its decoded
    /// size (an inner chunk of a shard, read from the shard file).
    pub(crate) fn decode_bytes(self, src: &[u8], dest: &mut [u8]) -> Result<(), String> {
        match self {
            DirectCodec::Raw => {
                if src.len() != dest.len() {
                    return Err(format!(
                        "the uncompressed chunk is {} bytes, expected {}",
                        src.len(),
                        dest.len()
                    ));
                }
                dest.copy_from_slice(src);
                Ok(())
            }
            DirectCodec::Blosc => blosc_decode(src, dest),
            DirectCodec::Zstd | DirectCodec::Gzip | DirectCodec::Zlib => {
                let whole = dest.len();
                let mut stream = self.stream(src, whole)?;
                read_stream(&mut *stream, dest, self)?;
                finish_stream(&mut *stream, whole, self)
            }
        }
    }

    /// A decoder of this (stream) codec reading `input`, for a chunk of `whole` bytes.
    fn stream<'r, R: Read + 'r>(
        self,
        input: R,
        whole: usize,
    ) -> Result<Box<dyn Read + 'r>, String> {
        let input = std::io::BufReader::with_capacity(STREAM_BUFFER, input);
        Ok(match self {
            DirectCodec::Zstd => {
                let mut d = zstd::stream::read::Decoder::with_buffer(input)
                    .map_err(|e| format!("cannot start a zstd decoder: {e}"))?;
                d.window_log_max(zstd_window_log(whole))
                    .map_err(|e| format!("cannot limit the zstd window: {e}"))?;
                Box::new(d)
            }
            DirectCodec::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
            DirectCodec::Zlib => Box::new(flate2::bufread::ZlibDecoder::new(input)),
            DirectCodec::Raw | DirectCodec::Blosc => unreachable!("not a stream codec"),
        })
    }

    fn label(self) -> &'static str {
        match self {
            DirectCodec::Raw => "uncompressed",
            DirectCodec::Blosc => "Blosc",
            DirectCodec::Zstd => "zstd",
            DirectCodec::Gzip => "gzip",
            DirectCodec::Zlib => "zlib",
        }
    }
}

/// The read buffer of a stream decoder.
pub(crate) const STREAM_BUFFER: usize = 64 << 10;

/// The largest zstd window (log₂ bytes) accepted for a chunk of `whole` bytes: the chunk's
/// own size (an encoder that knew it never needs more), but at least 8 MiB, which streaming
/// encoders that did not know it declare at the usual levels. A frame that asks for more is
/// an error rather than an allocation sized by the frame.
fn zstd_window_log(whole: usize) -> u32 {
    let need = usize::BITS - whole.saturating_sub(1).leading_zeros();
    need.clamp(23, 27)
}

/// The most bytes any valid encoding of a `whole`-byte chunk takes with `codec`: the
/// decoded size plus the codec's worst-case expansion (zstd's `ZSTD_compressBound`, zlib's
/// `deflateBound` with a gzip header, Blosc's 16-byte header and a memcpy fallback), with
/// room to spare for headers (file names, comments, skippable frames).
pub(crate) fn max_encoded(codec: Option<DirectCodec>, whole: u64) -> u64 {
    match codec {
        Some(DirectCodec::Raw) => whole,
        _ => whole.saturating_add(whole / 64).saturating_add(64 << 10),
    }
}

/// Fills `dest` from a stream decoder; a stream that ends early is an error saying so.
fn read_stream(stream: &mut dyn Read, dest: &mut [u8], codec: DirectCodec) -> Result<(), String> {
    let mut at = 0;
    while at < dest.len() {
        match stream.read(&mut dest[at..]) {
            Ok(0) => {
                return Err(format!(
                    "the {} stream decodes to {at} bytes, expected {} for a whole chunk",
                    codec.label(),
                    dest.len()
                ))
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("the {} stream is corrupt: {e}", codec.label())),
        }
    }
    Ok(())
}

/// Checks that a stream decoder, having delivered all `whole` bytes, is at its end: it is
/// asked for one byte more, never for the rest of what it would expand to.
fn finish_stream(stream: &mut dyn Read, whole: usize, codec: DirectCodec) -> Result<(), String> {
    let mut one = [0u8; 1];
    loop {
        return match stream.read(&mut one) {
            Ok(0) => Ok(()),
            Ok(_) => Err(format!(
                "the {} stream decodes to more than {whole} bytes, the size of a whole chunk \
                 (refused without decoding the rest)",
                codec.label()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Err(format!("the {} stream is corrupt: {e}", codec.label())),
        };
    }
}

impl DirectCodec {
    /// Decodes bytes `part` of the decoded chunk stored in file `path` (whose decoded size
    /// is `whole`) into `dest` (`part.len()` bytes), without decoding the rest of the
    /// chunk where the codec allows: Blosc decodes only the blocks that hold `part`, from
    /// the mapped file, and an uncompressed chunk is read at an offset. Returns the share
    /// of the chunk's stored bytes that `part` stands for, or `None` when the chunk file
    /// does not exist.
    pub(crate) fn decode_part(
        self,
        path: &Path,
        part: Range<usize>,
        whole: usize,
        dest: &mut [u8],
    ) -> Result<Option<u64>, String> {
        let Some((file, len)) = open_chunk(path, self, whole)? else {
            return Ok(None);
        };
        let share = (len as u128 * part.len() as u128 / whole.max(1) as u128) as u64;
        match self {
            DirectCodec::Raw => {
                if len != whole as u64 {
                    return Err(format!(
                        "the uncompressed chunk is {len} bytes, expected {whole}"
                    ));
                }
                file.read_exact_at(dest, part.start as u64)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            }
            DirectCodec::Blosc => {
                // Mapped, not read: `pread` into a buffer costs a copy of every stored
                // byte out of the page cache, which measured 17–21% of the CPU time of
                // `read --zarr` and `rsvd --zarr` on a Blosc lz4 store; mapping and
                // faulting the pages in costs a third of that (system time 0.27–0.40 s
                // against 0.61–1.12 s per 3.3 GB pass on two cores).
                // SAFETY: the mapping is only read, and only while this call holds it. A
                // store rewritten by another process during a run is outside what any
                // reader can give meaning to; the decoders' own bounds checks still hold.
                let map = unsafe { memmap2::Mmap::map(&file) }
                    .map_err(|e| format!("cannot map {}: {e}", path.display()))?;
                blosc_decode_part(&map, part, whole, dest)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            DirectCodec::Zstd | DirectCodec::Gzip | DirectCodec::Zlib => {
                // Decoded from the start: the bytes before `part` are decoded into a small
                // buffer and dropped, and the stream is still checked to end at `whole`.
                let mut stream = self.stream(file.take(len), whole)?;
                let mut skip = vec![0u8; STREAM_BUFFER.min(part.start)];
                let mut left = part.start;
                while left > 0 {
                    let n = left.min(skip.len());
                    read_stream(&mut *stream, &mut skip[..n], self).map_err(|_| {
                        format!(
                            "the {} stream ends before byte {} of the chunk",
                            self.label(),
                            part.start
                        )
                    })?;
                    left -= n;
                }
                read_stream(&mut *stream, dest, self)?;
                let mut rest = whole - part.end;
                let mut sink = vec![0u8; STREAM_BUFFER.min(rest)];
                while rest > 0 {
                    let n = rest.min(sink.len());
                    read_stream(&mut *stream, &mut sink[..n], self)?;
                    rest -= n;
                }
                finish_stream(&mut *stream, whole, self)?;
            }
        }
        Ok(Some(share))
    }
}

/// Opens a chunk file of a chunk of `whole` decoded bytes, and its length; `None` when it
/// does not exist (a missing chunk). A path that is not a regular file, or a file longer
/// than any valid encoding of the chunk, is refused before it is read.
/// The `len` bytes of a checked chunk file into `encoded` (cleared first). The length was
/// checked: `take` holds even if the file grows meanwhile.
fn read_whole(file: std::fs::File, len: u64, encoded: &mut Vec<u8>) -> std::io::Result<()> {
    encoded.clear();
    reserve(encoded, len as usize);
    file.take(len).read_to_end(encoded).map(|_| ())
}

fn open_chunk(
    path: &Path,
    codec: DirectCodec,
    whole: usize,
) -> Result<Option<(std::fs::File, u64)>, String> {
    let Some(len) = check_chunk_file(path, Some(codec), whole as u64)? else {
        return Ok(None);
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    Ok(Some((file, len)))
}

/// The length of chunk file `path` of a chunk of `whole` decoded bytes (for `codec`, or
/// for a chain zarrs decodes: `None`, with `extra` bytes allowed for a shard index), or
/// `None` when it does not exist. A path that is not a regular file (a link to
/// `/dev/zero`, a FIFO, a directory), or a file longer than any valid encoding of the
/// chunk, is an error: it is never opened, so nothing it holds is read.
pub(crate) fn check_chunk_file(
    path: &Path,
    codec: Option<DirectCodec>,
    whole: u64,
) -> Result<Option<u64>, String> {
    check_chunk_file_with(path, max_encoded(codec, whole), codec)
}

/// [`check_chunk_file`] with the largest valid length given.
pub(crate) fn check_chunk_file_with(
    path: &Path,
    most: u64,
    codec: Option<DirectCodec>,
) -> Result<Option<u64>, String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot stat {}: {e}", path.display())),
    };
    if !meta.is_file() {
        return Err(format!(
            "{} is not a regular file (a chunk is a file; refused without reading it)",
            path.display()
        ));
    }
    let len = meta.len();
    if len > most {
        let what = codec.map_or("encoded", |c| c.label());
        return Err(if codec == Some(DirectCodec::Raw) {
            format!("the uncompressed chunk is {len} bytes, expected {most}")
        } else {
            format!(
                "the chunk file is {len} bytes, more than any valid {what} encoding of its \
                 chunk ({most} bytes at most); refused without reading it"
            )
        });
    }
    Ok(Some(len))
}

/// One bytes-to-bytes stage of a codec chain that zarrs decodes (filters, big-endian
/// values, several compressors, checksums), as far as the bounded check below knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A compressor.
    Codec(DirectCodec),
    /// A CRC-32C checksum: 4 bytes after what it guards.
    Crc32c,
}

impl Stage {
    /// The bytes-to-bytes stages of an array's chain, outermost (applied last when
    /// encoding, first when decoding) first: Zarr 3's codecs after the array-to-bytes one,
    /// Zarr 2's compressor. `None` for a sharded array (its inner chunks are chains of their
    /// own) and for a chain without a stage that could expand.
    pub(crate) fn of_chain(meta: &serde_json::Value) -> Option<Vec<Stage>> {
        // A codec without configuration may be written as its bare name (`"crc32c"`).
        let name = |c: &serde_json::Value| {
            c.as_str()
                .or_else(|| {
                    c.get("name")
                        .or_else(|| c.get("id"))
                        .and_then(|v| v.as_str())
                })
                .map(str::to_string)
        };
        let stage = |n: &str| match n {
            "blosc" => Some(Stage::Codec(DirectCodec::Blosc)),
            "zstd" => Some(Stage::Codec(DirectCodec::Zstd)),
            "gzip" => Some(Stage::Codec(DirectCodec::Gzip)),
            "zlib" => Some(Stage::Codec(DirectCodec::Zlib)),
            "crc32c" => Some(Stage::Crc32c),
            _ => None,
        };
        let mut stages = Vec::new();
        if let Some(codecs) = meta.get("codecs").and_then(|v| v.as_array()) {
            for c in codecs {
                let n = name(c)?;
                if n == "sharding_indexed" {
                    return None;
                }
                stages.extend(stage(&n));
            }
            stages.reverse();
        } else if let Some(c) = meta.get("compressor").filter(|c| !c.is_null()) {
            stages.extend(stage(&name(c)?));
        }
        stages
            .iter()
            .any(|s| matches!(s, Stage::Codec(_)))
            .then_some(stages)
    }
}

/// Checks, before zarrs decodes it, that the `len`-byte chunk file at `path` decodes
/// through `stages` (outermost first) to at most `whole` bytes (and 4 more per checksum):
/// zarrs' decoders grow their output to whatever a stream expands to, so a decompression
/// bomb would take memory the plan never accepted. The stream decoders are chained and
/// their output only counted, never held; a Blosc stage holds its frame and its decoded
/// size, which its header states and the check bounds first. This decodes the chunk once
/// more, on the path of the chains that zarrs decodes only.
pub(crate) fn check_stages(
    path: &Path,
    len: u64,
    stages: &[Stage],
    whole: u64,
) -> Result<(), String> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    check_stages_in(
        Box::new(std::io::BufReader::with_capacity(
            STREAM_BUFFER,
            file.take(len),
        )),
        stages,
        whole,
    )
}

/// [`check_stages`] of the encoded chunk `reader` yields (an inner chunk of a shard).
pub(crate) fn check_stages_in<'r>(
    mut reader: Box<dyn Read + 'r>,
    stages: &[Stage],
    whole: u64,
) -> Result<(), String> {
    let limit =
        whole.saturating_add(4 * stages.iter().filter(|s| **s == Stage::Crc32c).count() as u64);
    let corrupt = |label: &str, e: std::io::Error| format!("the {label} stream is corrupt: {e}");
    for stage in stages {
        reader = match *stage {
            // Passed through: the limit counts its 4 bytes.
            Stage::Crc32c | Stage::Codec(DirectCodec::Raw) => reader,
            Stage::Codec(DirectCodec::Blosc) => {
                let most = max_encoded(None, limit);
                let mut frame = Vec::new();
                reader
                    .take(most.saturating_add(1))
                    .read_to_end(&mut frame)
                    .map_err(|e| corrupt("Blosc", e))?;
                if frame.len() as u64 > most {
                    return Err(format!(
                        "the Blosc frame inside the chunk is more than {most} bytes, more than \
                         any valid encoding of its chunk (refused before decoding it)"
                    ));
                }
                let n = blosc_validate(&frame)?;
                if n as u64 > limit {
                    return Err(format!(
                        "a Blosc frame of the chunk decodes to {n} bytes, more than the {limit} \
                         its chunk holds (refused before decoding it)"
                    ));
                }
                let mut out = vec![0u8; n];
                blosc_decode(&frame, &mut out)?;
                Box::new(std::io::Cursor::new(out))
            }
            Stage::Codec(c) => c.stream(reader, limit as usize)?,
        };
    }
    let label = stages
        .iter()
        .rev()
        .find_map(|s| match s {
            Stage::Codec(c) => Some(c.label()),
            Stage::Crc32c => None,
        })
        .unwrap_or("encoded");
    let decoded = std::io::copy(
        &mut reader.take(limit.saturating_add(1)),
        &mut std::io::sink(),
    )
    .map_err(|e| corrupt(label, e))?;
    if decoded > limit {
        return Err(format!(
            "the chunk decompresses to more than {limit} bytes, the size of a whole chunk \
             (refused before decoding the rest)"
        ));
    }
    Ok(())
}

/// Decodes bytes `part` of one Blosc frame (of decoded size `whole`) into `dest`.
fn blosc_decode_part(
    src: &[u8],
    part: Range<usize>,
    whole: usize,
    dest: &mut [u8],
) -> Result<(), String> {
    if let Some(frame) = crate::blosc::Frame::parse(src)? {
        if frame.nbytes() != whole {
            return Err(format!(
                "the Blosc frame decodes to {} bytes, expected {whole} for a whole chunk",
                frame.nbytes()
            ));
        }
        return with_scratch(|s| frame.decode(part, dest, s, crate::blosc::Kernels::Detect));
    }
    let nbytes = blosc_validate(src)?;
    if nbytes != whole {
        return Err(format!(
            "the Blosc frame decodes to {nbytes} bytes, expected {whole} for a whole chunk"
        ));
    }
    let typesize = src[3] as usize;
    let aligned =
        typesize > 0 && part.start.is_multiple_of(typesize) && part.len().is_multiple_of(typesize);
    let items = |b: usize| i32::try_from(b / typesize.max(1));
    let (Ok(start), Ok(count), true) = (items(part.start), items(part.len()), aligned) else {
        // A frame whose items do not align with the rows (an unusual typesize): decode
        // it whole.
        let mut all = vec![0u8; whole];
        blosc_decode(src, &mut all)?;
        dest.copy_from_slice(&all[part]);
        return Ok(());
    };
    // SAFETY: the frame was validated against `src.len()`; blosc writes `count` items of
    // `typesize` bytes, `part.len()` bytes, into `dest`, which holds exactly that.
    let n = unsafe {
        blosc_src::blosc_getitem(src.as_ptr().cast(), start, count, dest.as_mut_ptr().cast())
    };
    if n < 0 || n as usize != part.len() {
        return Err(format!(
            "Blosc could not decode bytes {}..{} of the frame (status {n}; corrupt data)",
            part.start, part.end
        ));
    }
    Ok(())
}

/// Checks a Blosc frame against its length and returns its decoded size.
fn blosc_validate(src: &[u8]) -> Result<usize, String> {
    let mut nbytes = 0usize;
    // SAFETY: blosc reads at most `src.len()` bytes of `src` to validate the header and
    // the block offsets, and writes `nbytes`.
    let valid =
        unsafe { blosc_src::blosc_cbuffer_validate(src.as_ptr().cast(), src.len(), &mut nbytes) };
    if valid != 0 || src.len() < 16 {
        return Err(format!(
            "not a valid Blosc frame ({} bytes; truncated or corrupt)",
            src.len()
        ));
    }
    Ok(nbytes)
}

/// Runs `f` with this thread's decoder buffers (kept from call to call: a reader thread
/// decodes chunk after chunk of the same block size).
fn with_scratch<R>(f: impl FnOnce(&mut crate::blosc::Scratch) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::RefCell<crate::blosc::Scratch> = Default::default();
    }
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

/// Decodes one Blosc frame into `dest`, which must be exactly its decoded size: LZ4 and
/// stored frames here ([`crate::blosc`]), others by c-blosc.
fn blosc_decode(src: &[u8], dest: &mut [u8]) -> Result<(), String> {
    if let Some(frame) = crate::blosc::Frame::parse(src)? {
        if frame.nbytes() != dest.len() {
            return Err(format!(
                "the Blosc frame decodes to {} bytes, expected {} for a whole chunk",
                frame.nbytes(),
                dest.len()
            ));
        }
        let all = 0..dest.len();
        return with_scratch(|s| frame.decode(all, dest, s, crate::blosc::Kernels::Detect));
    }
    let nbytes = blosc_validate(src)?;
    if nbytes != dest.len() {
        return Err(format!(
            "the Blosc frame decodes to {nbytes} bytes, expected {} for a whole chunk",
            dest.len()
        ));
    }
    // One internal thread: the actor's read-ahead threads already decode different
    // chunks in parallel on the actor's cores.
    // SAFETY: the frame was validated against `src.len()`; blosc writes at most
    // `dest.len()` bytes into `dest`.
    let n = unsafe {
        blosc_src::blosc_decompress_ctx(
            src.as_ptr().cast(),
            dest.as_mut_ptr().cast(),
            dest.len(),
            1,
        )
    };
    if n < 0 || n as usize != dest.len() {
        return Err(format!(
            "Blosc could not decode the frame (status {n}; corrupt data)"
        ));
    }
    Ok(())
}

/// Copies the block `extent` starting at `src_at` of a C-order array of shape
/// `src_shape` into the same-sized block at `dst_at` of one of shape `dst_shape`, elements
/// of `elem` bytes.
pub(crate) fn copy_block(
    src: &[u8],
    src_shape: &[u64],
    src_at: &[u64],
    dst: &mut [u8],
    dst_shape: &[u64],
    dst_at: &[u64],
    extent: &[u64],
    elem: usize,
) {
    let d = extent.len();
    // Trailing dimensions that both arrays hold whole are one contiguous run.
    let mut run = elem as u64;
    let mut lead = d;
    while lead > 0
        && extent[lead - 1] == src_shape[lead - 1]
        && extent[lead - 1] == dst_shape[lead - 1]
    {
        run *= extent[lead - 1];
        lead -= 1;
    }
    if lead > 0 {
        run *= extent[lead - 1];
    }
    let outer = lead.saturating_sub(1);
    let strides = |shape: &[u64]| {
        let mut s = vec![elem as u64; d];
        for k in (0..d.saturating_sub(1)).rev() {
            s[k] = s[k + 1] * shape[k + 1];
        }
        s
    };
    let (ss, ds) = (strides(src_shape), strides(dst_shape));
    let mut idx = vec![0u64; outer];
    loop {
        let (mut so, mut dof) = (0u64, 0u64);
        for k in 0..d {
            let i = if k < outer { idx[k] } else { 0 };
            so += (src_at[k] + i) * ss[k];
            dof += (dst_at[k] + i) * ds[k];
        }
        let (so, dof, run) = (so as usize, dof as usize, run as usize);
        dst[dof..dof + run].copy_from_slice(&src[so..so + run]);
        let mut k = outer;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            idx[k] += 1;
            if idx[k] < extent[k] {
                break;
            }
            idx[k] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream written by `codec` of `len` zero bytes.
    fn zeros_in(codec: DirectCodec, len: usize) -> Vec<u8> {
        use std::io::Write;
        let zeros = vec![0u8; len];
        match codec {
            DirectCodec::Gzip => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                e.write_all(&zeros).unwrap();
                e.finish().unwrap()
            }
            DirectCodec::Zstd => zstd::encode_all(&zeros[..], 1).unwrap(),
            other => panic!("no stream for {other:?}"),
        }
    }

    #[test]
    fn stages_zarrs_decodes_are_bounded_by_the_chunk() {
        let dir = std::env::temp_dir().join(format!("rankwise-stages-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let whole = 80_000u64;
        let gz = DirectCodec::Gzip;
        let cases: Vec<(&str, Vec<u8>, Vec<Stage>, bool)> = vec![
            (
                "gzip bomb",
                zeros_in(gz, 8 << 20),
                vec![Stage::Codec(gz), Stage::Crc32c],
                false,
            ),
            (
                "gzip chunk with its checksum",
                zeros_in(gz, whole as usize + 4),
                vec![Stage::Codec(gz), Stage::Crc32c],
                true,
            ),
            (
                "gzip chunk one byte long",
                zeros_in(gz, whole as usize + 5),
                vec![Stage::Codec(gz), Stage::Crc32c],
                false,
            ),
            (
                "zstd around a gzip bomb",
                zstd::encode_all(&zeros_in(gz, 8 << 20)[..], 1).unwrap(),
                vec![Stage::Codec(DirectCodec::Zstd), Stage::Codec(gz)],
                false,
            ),
            (
                "zstd bomb",
                zeros_in(DirectCodec::Zstd, 64 << 20),
                vec![Stage::Codec(DirectCodec::Zstd)],
                false,
            ),
        ];
        for (what, bytes, stages, ok) in cases {
            let path = dir.join("chunk");
            std::fs::write(&path, &bytes).unwrap();
            let r = check_stages(&path, bytes.len() as u64, &stages, whole);
            assert_eq!(r.is_ok(), ok, "{what}: {r:?}");
            if !ok {
                assert!(r.unwrap_err().contains("more than"), "{what}");
            }
        }
        // The stages of chains, outermost first; none where nothing could expand or the
        // chunks are shards.
        use serde_json::json;
        let chain = |codecs| Stage::of_chain(&json!({ "codecs": codecs }));
        assert_eq!(
            chain(
                json!([{"name": "bytes", "configuration": {"endian": "big"}}, "crc32c", {"name": "gzip", "configuration": {"level": 5}}])
            ),
            Some(vec![Stage::Codec(gz), Stage::Crc32c])
        );
        assert_eq!(chain(json!(["bytes", "crc32c"])), None);
        assert_eq!(
            chain(json!([{"name": "sharding_indexed", "configuration": {}}])),
            None
        );
        assert_eq!(
            Stage::of_chain(
                &json!({"compressor": {"id": "zlib", "level": 1}, "filters": [{"id": "delta"}]})
            ),
            Some(vec![Stage::Codec(DirectCodec::Zlib)])
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    use serde_json::json;

    #[test]
    fn recognizes_the_chains_it_decodes_and_leaves_the_rest() {
        let v3 = |codecs: serde_json::Value| json!({ "zarr_format": 3, "codecs": codecs });
        let bytes = json!({"name": "bytes", "configuration": {"endian": "little"}});
        let blosc = json!({"name": "blosc", "configuration": {"cname": "lz4"}});
        let zstd = json!({"name": "zstd", "configuration": {"level": 1}});
        assert_eq!(DirectCodec::of(&v3(json!([bytes]))), Some(DirectCodec::Raw));
        assert_eq!(
            DirectCodec::of(&v3(json!([bytes, blosc]))),
            Some(DirectCodec::Blosc)
        );
        assert_eq!(
            DirectCodec::of(&v3(json!([{"name": "bytes"}, blosc]))),
            Some(DirectCodec::Blosc)
        );
        // A codec without configuration written as its bare name.
        assert_eq!(
            DirectCodec::of(&v3(json!(["bytes", blosc]))),
            Some(DirectCodec::Blosc)
        );
        assert_eq!(
            DirectCodec::of(&v3(json!([bytes, zstd]))),
            Some(DirectCodec::Zstd)
        );
        let gzip = json!({"name": "gzip", "configuration": {"level": 5}});
        assert_eq!(
            DirectCodec::of(&v3(json!([bytes, gzip]))),
            Some(DirectCodec::Gzip)
        );
        let crc = json!({"name": "crc32c"});
        assert_eq!(DirectCodec::of(&v3(json!([bytes, zstd, crc]))), None);
        assert_eq!(DirectCodec::of(&v3(json!([bytes, blosc, zstd]))), None);
        let big = json!({"name": "bytes", "configuration": {"endian": "big"}});
        assert_eq!(DirectCodec::of(&v3(json!([big, blosc]))), None);
        let shard = json!({"name": "sharding_indexed", "configuration": {}});
        assert_eq!(DirectCodec::of(&v3(json!([shard]))), None);

        let v2 = |dtype: &str, order: &str, compressor: serde_json::Value, filters| {
            json!({"zarr_format": 2, "dtype": dtype, "order": order,
                   "compressor": compressor, "filters": filters})
        };
        let b2 = json!({"id": "blosc", "cname": "lz4", "shuffle": 2});
        let null = serde_json::Value::Null;
        assert_eq!(
            DirectCodec::of(&v2("<f4", "C", b2.clone(), null.clone())),
            Some(DirectCodec::Blosc)
        );
        assert_eq!(
            DirectCodec::of(&v2("|u1", "C", null.clone(), json!([]))),
            Some(DirectCodec::Raw)
        );
        assert_eq!(
            DirectCodec::of(&v2(">f4", "C", b2.clone(), null.clone())),
            None
        );
        assert_eq!(
            DirectCodec::of(&v2("<f4", "F", b2.clone(), null.clone())),
            None
        );
        assert_eq!(
            DirectCodec::of(&v2("<f4", "C", b2, json!([{"id": "delta"}]))),
            None
        );
        assert_eq!(
            DirectCodec::of(&v2("<f4", "C", json!({"id": "zstd"}), null.clone())),
            Some(DirectCodec::Zstd)
        );
        assert_eq!(
            DirectCodec::of(&v2("<f4", "C", json!({"id": "zlib"}), null.clone())),
            Some(DirectCodec::Zlib)
        );
        assert_eq!(
            DirectCodec::of(&v2("<f4", "C", json!({"id": "lzma"}), null)),
            None
        );
    }

    #[test]
    fn copies_blocks_between_shapes() {
        // A 3 × 4 × 2 source block at (1, 1, 0) of a 4 × 6 × 2 array, into (0, 2, 0) of a
        // 3 × 7 × 2 array; every element is its own linear index in the source.
        let (ss, ds, ext) = ([4u64, 6, 2], [3u64, 7, 2], [3u64, 4, 2]);
        let src: Vec<u8> = (0..48).collect();
        let mut dst = vec![255u8; 42];
        copy_block(&src, &ss, &[1, 1, 0], &mut dst, &ds, &[0, 2, 0], &ext, 1);
        for i in 0..3u64 {
            for j in 0..7u64 {
                for k in 0..2u64 {
                    let got = dst[((i * 7 + j) * 2 + k) as usize];
                    let want = if (2..6).contains(&j) {
                        (((i + 1) * 6 + (j - 2 + 1)) * 2 + k) as u8
                    } else {
                        255
                    };
                    assert_eq!(got, want, "at {i},{j},{k}");
                }
            }
        }
        // Elements of 4 bytes, a whole-row block (one contiguous run).
        let src: Vec<u8> = (0..64).collect();
        let mut dst = vec![0u8; 32];
        copy_block(
            &src,
            &[4, 4],
            &[2, 0],
            &mut dst,
            &[2, 4],
            &[0, 0],
            &[2, 4],
            4,
        );
        assert_eq!(dst, (32..64).collect::<Vec<u8>>());
    }

    /// A Blosc frame of `values` (lz4, bit shuffle, 4-byte elements), made by the same
    /// library the stores' writers use.
    fn blosc_frame(values: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; values.len() + blosc_src::BLOSC_MAX_OVERHEAD as usize];
        let lz4 = std::ffi::CString::new("lz4").unwrap();
        // SAFETY: `out` has room for the worst case (input + overhead).
        let n = unsafe {
            blosc_src::blosc_compress_ctx(
                5,
                blosc_src::BLOSC_BITSHUFFLE as i32,
                4,
                values.len(),
                values.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                out.len(),
                lz4.as_ptr(),
                0,
                1,
            )
        };
        assert!(n > 0);
        out.truncate(n as usize);
        out
    }

    #[test]
    fn decodes_a_blosc_chunk_file_and_rejects_a_truncated_or_wrong_sized_one() {
        let values: Vec<u8> = (0..40_000u32)
            .flat_map(|i| (i * 7 % 1000).to_le_bytes())
            .collect();
        let dir = std::env::temp_dir().join(format!("rankwise-direct-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chunk");
        let frame = blosc_frame(&values);
        std::fs::write(&path, &frame).unwrap();
        let mut encoded = Vec::new();
        let mut dest = vec![0u8; values.len()];
        let stored = DirectCodec::Blosc
            .decode_file(&path, &mut encoded, &mut dest)
            .unwrap();
        assert_eq!(stored, Some(frame.len() as u64));
        assert_eq!(dest, values);

        let mut short = vec![0u8; values.len() - 4];
        let err = DirectCodec::Blosc
            .decode_file(&path, &mut encoded, &mut short)
            .unwrap_err();
        assert!(
            err.contains("decodes to 160000 bytes, expected 159996"),
            "{err}"
        );

        // Parts of the chunk, from the mapped file.
        let whole = values.len();
        for part in [0..whole, 4000..40_000, whole - 12..whole] {
            let mut out = vec![0u8; part.len()];
            let share = DirectCodec::Blosc
                .decode_part(&path, part.clone(), whole, &mut out)
                .unwrap();
            assert!(share.is_some_and(|s| s <= frame.len() as u64));
            assert_eq!(out, &values[part]);
        }

        std::fs::write(&path, &frame[..frame.len() / 2]).unwrap();
        let err = DirectCodec::Blosc
            .decode_file(&path, &mut encoded, &mut dest)
            .unwrap_err();
        assert!(err.contains("truncated or corrupt"), "{err}");
        // A chunk file cut short (at any length) is an error naming it, never a panic.
        for keep in [0, 10, 16, frame.len() / 2, frame.len() - 1] {
            std::fs::write(&path, &frame[..keep]).unwrap();
            let mut out = vec![0u8; 1000];
            let err = DirectCodec::Blosc
                .decode_part(&path, 0..1000, whole, &mut out)
                .unwrap_err();
            assert!(err.contains("chunk"), "{err}");
        }

        let err = DirectCodec::Raw
            .decode_file(&path, &mut encoded, &mut dest)
            .unwrap_err();
        assert!(err.contains("expected 160000"), "{err}");
        let missing = DirectCodec::Blosc.decode_file(&dir.join("nope"), &mut encoded, &mut dest);
        assert_eq!(missing, Ok(None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stream_codecs_decode_whole_chunks_and_parts_and_stop_at_the_chunks_size() {
        use std::io::Write;
        let values: Vec<u8> = (0..30_000u32)
            .flat_map(|i| (i * 13 % 977).to_le_bytes())
            .collect();
        let dir = std::env::temp_dir().join(format!("rankwise-streams-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chunk");
        let encode = |codec: DirectCodec, data: &[u8]| -> Vec<u8> {
            match codec {
                DirectCodec::Zstd => zstd::bulk::compress(data, 3).unwrap(),
                DirectCodec::Gzip => {
                    let mut e =
                        flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    e.write_all(data).unwrap();
                    e.finish().unwrap()
                }
                DirectCodec::Zlib => {
                    let mut e =
                        flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                    e.write_all(data).unwrap();
                    e.finish().unwrap()
                }
                _ => unreachable!(),
            }
        };
        let whole = values.len();
        for codec in [DirectCodec::Zstd, DirectCodec::Gzip, DirectCodec::Zlib] {
            let stored = encode(codec, &values);
            std::fs::write(&path, &stored).unwrap();
            let (mut encoded, mut dest) = (Vec::new(), vec![0u8; whole]);
            let got = codec.decode_file(&path, &mut encoded, &mut dest).unwrap();
            assert_eq!(got, Some(stored.len() as u64), "{codec:?}");
            assert_eq!(dest, values, "{codec:?}");
            for part in [0..whole, 4000..90_000, whole - 12..whole, 0..7] {
                let mut out = vec![0u8; part.len()];
                codec
                    .decode_part(&path, part.clone(), whole, &mut out)
                    .unwrap();
                assert_eq!(out, &values[part], "{codec:?}");
            }
            // One byte more than the chunk: refused, having decoded one byte past it.
            let mut longer = values.clone();
            longer.push(1);
            std::fs::write(&path, encode(codec, &longer)).unwrap();
            let err = codec
                .decode_file(&path, &mut encoded, &mut dest)
                .unwrap_err();
            assert!(
                err.contains("decodes to more than 120000 bytes"),
                "{codec:?}: {err}"
            );
            let err = codec
                .decode_part(&path, 0..10, whole, &mut [0u8; 10])
                .unwrap_err();
            assert!(err.contains("decodes to more than"), "{codec:?}: {err}");
            // One byte fewer, and a stream cut short: errors, never a panic.
            std::fs::write(&path, encode(codec, &values[1..])).unwrap();
            let err = codec
                .decode_file(&path, &mut encoded, &mut dest)
                .unwrap_err();
            assert!(err.contains("decodes to 119999 bytes"), "{codec:?}: {err}");
            std::fs::write(&path, &stored[..stored.len() / 2]).unwrap();
            assert!(codec.decode_file(&path, &mut encoded, &mut dest).is_err());
            std::fs::write(&path, vec![0x5au8; 300]).unwrap();
            assert!(codec.decode_file(&path, &mut encoded, &mut dest).is_err());
        }
        // A zstd frame asking for a window beyond what any chunk of this size needs (and the
        // 8 MiB floor) is an error, not an allocation of that window.
        let mut big = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
        big.window_log(27).unwrap();
        big.long_distance_matching(true).unwrap();
        big.write_all(&values).unwrap();
        std::fs::write(&path, big.finish().unwrap()).unwrap();
        let mut dest = vec![0u8; whole];
        // A streaming encoder does not know the size, so the frame declares its 128 MiB
        // window, and is refused rather than decoded with one.
        let err = DirectCodec::Zstd
            .decode_file(&path, &mut Vec::new(), &mut dest)
            .unwrap_err();
        assert!(err.contains("zstd stream is corrupt"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn chunk_files_that_are_not_regular_or_too_long_are_refused_unread() {
        let dir = std::env::temp_dir().join(format!("rankwise-oversize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chunk");
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        for codec in [DirectCodec::Raw, DirectCodec::Blosc, DirectCodec::Zstd] {
            let err = codec
                .decode_file(&path, &mut Vec::new(), &mut [0u8; 100])
                .unwrap_err();
            assert!(err.contains("not a regular file"), "{codec:?}: {err}");
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        for codec in [DirectCodec::Blosc, DirectCodec::Gzip] {
            let err = codec
                .decode_part(&path, 0..10, 1000, &mut [0u8; 10])
                .unwrap_err();
            assert!(
                err.contains("refused without reading it"),
                "{codec:?}: {err}"
            );
        }
        assert_eq!(max_encoded(Some(DirectCodec::Raw), 1000), 1000);
        assert!(max_encoded(Some(DirectCodec::Zstd), u64::MAX) == u64::MAX);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_or_truncated_blosc_frame_is_an_error() {
        let mut dest = vec![0u8; 64];
        let err = blosc_decode(&[1, 2, 3], &mut dest).unwrap_err();
        assert!(err.contains("not a valid Blosc frame"), "{err}");
        let junk = vec![0x5au8; 200];
        assert!(blosc_decode(&junk, &mut dest).is_err());
    }
}
