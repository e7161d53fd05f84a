//! Decoded panels of storage-backed sources.
//!
//! A generated source produces any tile on demand, but a stored one (Zarr) can only decode
//! whole chunks. Storage-backed sources therefore expose [`StoredPanels`]: the kernels ask
//! for a whole panel (one band of stored chunks) at a time, decoded into a
//! [`PanelBuffer`] that is reused from panel to panel, and cut their cache-sized tiles out
//! of it. The buffer keeps the stored element type, so decoding writes straight into it and
//! conversion to the kernel's precision happens tile by tile, while the tile is in cache.

use std::ops::Range;

use ndarray::ArrayViewMut2;

use crate::error::SourceError;

/// Values of a decoded panel, in the stored element type, row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum PanelValues {
    /// Unsigned bytes.
    U8(Vec<u8>),
    /// Signed bytes (also genotype dosages, −1 missing).
    I8(Vec<i8>),
    /// 16-bit integers.
    I16(Vec<i16>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// Single precision.
    F32(Vec<f32>),
    /// Double precision.
    F64(Vec<f64>),
}

/// The element types a stored matrix may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElementType {
    /// `uint8`.
    U8,
    /// `int8`.
    I8,
    /// `int16`.
    I16,
    /// `int32`.
    I32,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

impl ElementType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElementType::U8 | ElementType::I8 => 1,
            ElementType::I16 => 2,
            ElementType::I32 | ElementType::F32 => 4,
            ElementType::F64 => 8,
        }
    }

    /// The Zarr v3 name of the type.
    pub fn name(self) -> &'static str {
        match self {
            ElementType::U8 => "uint8",
            ElementType::I8 => "int8",
            ElementType::I16 => "int16",
            ElementType::I32 => "int32",
            ElementType::F32 => "float32",
            ElementType::F64 => "float64",
        }
    }

    /// True for the integer types.
    pub fn is_integer(self) -> bool {
        !matches!(self, ElementType::F32 | ElementType::F64)
    }
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PanelValues {
    /// An empty vector of type `t`.
    pub fn empty(t: ElementType) -> PanelValues {
        match t {
            ElementType::U8 => PanelValues::U8(Vec::new()),
            ElementType::I8 => PanelValues::I8(Vec::new()),
            ElementType::I16 => PanelValues::I16(Vec::new()),
            ElementType::I32 => PanelValues::I32(Vec::new()),
            ElementType::F32 => PanelValues::F32(Vec::new()),
            ElementType::F64 => PanelValues::F64(Vec::new()),
        }
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        match self {
            PanelValues::U8(_) => ElementType::U8,
            PanelValues::I8(_) => ElementType::I8,
            PanelValues::I16(_) => ElementType::I16,
            PanelValues::I32(_) => ElementType::I32,
            PanelValues::F32(_) => ElementType::F32,
            PanelValues::F64(_) => ElementType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            PanelValues::U8(v) => v.len(),
            PanelValues::I8(v) => v.len(),
            PanelValues::I16(v) => v.len(),
            PanelValues::I32(v) => v.len(),
            PanelValues::F32(v) => v.len(),
            PanelValues::F64(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes the vector `t` with `len` elements, reusing the allocation when the type
    /// matches and it is large enough. The values are unspecified afterwards: decoders
    /// overwrite every element.
    pub fn resize(&mut self, t: ElementType, len: usize) {
        if self.element_type() != t {
            *self = PanelValues::empty(t);
        }
        match self {
            PanelValues::U8(v) => grow(v, len, 0),
            PanelValues::I8(v) => grow(v, len, 0),
            PanelValues::I16(v) => grow(v, len, 0),
            PanelValues::I32(v) => grow(v, len, 0),
            PanelValues::F32(v) => grow(v, len, 0.0),
            PanelValues::F64(v) => grow(v, len, 0.0),
        }
    }

    /// The values as raw bytes (native endianness).
    pub fn bytes(&self) -> &[u8] {
        match self {
            PanelValues::U8(v) => bytemuck::cast_slice(v),
            PanelValues::I8(v) => bytemuck::cast_slice(v),
            PanelValues::I16(v) => bytemuck::cast_slice(v),
            PanelValues::I32(v) => bytemuck::cast_slice(v),
            PanelValues::F32(v) => bytemuck::cast_slice(v),
            PanelValues::F64(v) => bytemuck::cast_slice(v),
        }
    }

    /// The values as raw bytes (native endianness), for decoders that write into them.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            PanelValues::U8(v) => bytemuck::cast_slice_mut(v),
            PanelValues::I8(v) => bytemuck::cast_slice_mut(v),
            PanelValues::I16(v) => bytemuck::cast_slice_mut(v),
            PanelValues::I32(v) => bytemuck::cast_slice_mut(v),
            PanelValues::F32(v) => bytemuck::cast_slice_mut(v),
            PanelValues::F64(v) => bytemuck::cast_slice_mut(v),
        }
    }
}

/// Sets `v` to `len` elements, reusing its allocation when it is large enough. A new
/// allocation of panel size is asked to be backed by huge pages: a panel buffer is
/// written once from end to end, and 4 KiB pages would cost one page fault per 4 KiB
/// (a third of the decode time of a 400 MB chunk, measured).
pub(crate) fn grow<T: Copy>(v: &mut Vec<T>, len: usize, zero: T) {
    reserve(v, len);
    if len <= v.len() {
        v.truncate(len);
    } else {
        v.resize(len, zero);
    }
}

/// Makes room for `len` elements in `v`; a new allocation (which drops the contents) is
/// backed by huge pages where the kernel agrees.
pub(crate) fn reserve<T>(v: &mut Vec<T>, len: usize) {
    if len > v.capacity() {
        *v = Vec::with_capacity(len);
        advise_huge_pages(v.as_mut_ptr().cast(), len * std::mem::size_of::<T>());
    }
}

/// Asks the kernel for transparent huge pages over the whole 2 MiB pages inside
/// `bytes` bytes at `ptr`. Only a hint: where it is refused the memory is still usable.
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, bytes: usize) {
    const HUGE: usize = 2 << 20;
    let start = (ptr as usize).next_multiple_of(HUGE);
    let end = (ptr as usize + bytes) / HUGE * HUGE;
    if end > start {
        // SAFETY: the range lies inside an allocation we own; MADV_HUGEPAGE changes no
        // contents and no mapping, only how later faults are served.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _bytes: usize) {}

/// Scratch space of one panel buffer's reader, kept with the buffer so that every panel
/// it decodes reuses the same memory: the encoded chunk as read from storage, a decoded
/// chunk that does not map contiguously into the panel, and a second band for sources
/// that convert what they decode (transposes, wider integers, VCF alleles and mask).
#[derive(Clone, Debug, Default)]
pub struct ReadScratch {
    pub(crate) chunk: ChunkScratch,
    pub(crate) band: Option<PanelValues>,
    pub(crate) mask: Vec<u8>,
}

/// What decoding one chunk at a time needs besides the destination: the encoded chunk,
/// and a whole decoded chunk when it does not land contiguously in the destination.
#[derive(Clone, Debug, Default)]
pub struct ChunkScratch {
    pub(crate) encoded: Vec<u8>,
    pub(crate) staging: Vec<u8>,
}

/// A decoded panel: `rows × cols` values, row-major, reused from panel to panel.
#[derive(Clone, Debug)]
pub struct PanelBuffer {
    /// The values.
    pub values: PanelValues,
    /// Rows held.
    pub rows: usize,
    /// Columns held.
    pub cols: usize,
    /// The reader's scratch, reused with the buffer.
    pub scratch: ReadScratch,
}

impl Default for PanelBuffer {
    fn default() -> Self {
        PanelBuffer {
            values: PanelValues::F64(Vec::new()),
            rows: 0,
            cols: 0,
            scratch: ReadScratch::default(),
        }
    }
}

macro_rules! convert_tile {
    ($values:expr, $cols:expr, $rows:expr, $c:expr, $out:expr, $to:ty) => {{
        let (n, c0, w) = ($cols, $c.start, $c.end - $c.start);
        for (i, mut dst) in $rows.zip($out.rows_mut()) {
            let src = &$values[i * n + c0..i * n + c0 + w];
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s as $to;
            }
        }
    }};
}

impl PanelBuffer {
    /// Writes rows `rows`, columns `cols` (buffer coordinates) into `out`
    /// (`rows.len() × cols.len()`, any layout) as f64; every stored type converts exactly.
    pub fn tile_f64(
        &self,
        rows: Range<usize>,
        cols: Range<usize>,
        mut out: ArrayViewMut2<'_, f64>,
    ) {
        match &self.values {
            PanelValues::U8(v) => convert_tile!(v, self.cols, rows, cols, out, f64),
            PanelValues::I8(v) => convert_tile!(v, self.cols, rows, cols, out, f64),
            PanelValues::I16(v) => convert_tile!(v, self.cols, rows, cols, out, f64),
            PanelValues::I32(v) => convert_tile!(v, self.cols, rows, cols, out, f64),
            PanelValues::F32(v) => convert_tile!(v, self.cols, rows, cols, out, f64),
            PanelValues::F64(v) => convert_tile!(v, self.cols, rows, cols, out, f64),
        }
    }

    /// As [`PanelBuffer::tile_f64`], rounded to f32: the same value as rounding the f64
    /// value (integers of more than 24 bits and f64 values round once).
    pub fn tile_f32(
        &self,
        rows: Range<usize>,
        cols: Range<usize>,
        mut out: ArrayViewMut2<'_, f32>,
    ) {
        match &self.values {
            PanelValues::U8(v) => convert_tile!(v, self.cols, rows, cols, out, f32),
            PanelValues::I8(v) => convert_tile!(v, self.cols, rows, cols, out, f32),
            PanelValues::I16(v) => convert_tile!(v, self.cols, rows, cols, out, f32),
            PanelValues::I32(v) => convert_tile!(v, self.cols, rows, cols, out, f32),
            PanelValues::F32(v) => convert_tile!(v, self.cols, rows, cols, out, f32),
            PanelValues::F64(v) => convert_tile!(v, self.cols, rows, cols, out, f32),
        }
    }

    /// The dosages of a genotype panel (`rows × cols`, −1 missing), when the buffer holds
    /// them as `int8`.
    pub fn dosages(&self) -> Option<&[i8]> {
        match &self.values {
            PanelValues::I8(v) => Some(&v[..self.rows * self.cols]),
            _ => None,
        }
    }

    /// A copy of the values alone (no scratch), to keep after the buffer is reused.
    pub fn detached(&self) -> PanelBuffer {
        let t = self.values.element_type();
        let mut values = PanelValues::empty(t);
        values.resize(t, self.values.len());
        values.bytes_mut().copy_from_slice(self.values.bytes());
        PanelBuffer {
            values,
            rows: self.rows,
            cols: self.cols,
            scratch: ReadScratch::default(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        (self.values.len() * self.values.element_type().size()) as u64
    }
}

/// What reading one panel cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReadStats {
    /// Stored chunks decoded.
    pub chunks: u64,
    /// Bytes read from storage (encoded).
    pub stored_bytes: u64,
    /// Bytes after decoding.
    pub decoded_bytes: u64,
}

impl std::ops::AddAssign for ReadStats {
    fn add_assign(&mut self, o: ReadStats) {
        self.chunks += o.chunks;
        self.stored_bytes += o.stored_bytes;
        self.decoded_bytes += o.decoded_bytes;
    }
}

/// A source backed by stored chunks, read one panel (a band of chunks) at a time.
pub trait StoredPanels: Send + Sync {
    /// Rows of the operand per band of stored chunks: panels must be multiples of it.
    fn chunk_rows(&self) -> u64;
    /// Panel rows when the user gives none: one band of stored chunks, unless the storage
    /// has no bands worth the name (a `.bed`'s are single variants).
    fn default_panel_rows(&self) -> u64 {
        self.chunk_rows()
    }
    /// The element type of decoded panels.
    fn element_type(&self) -> ElementType;
    /// Whether [`StoredPanels::read_panel`] decodes any range of rows without decoding
    /// the rest of their chunks (so a band can be read in short segments, each in a
    /// small buffer). When false, a band is read whole.
    fn partial_reads(&self) -> bool {
        false
    }
    /// Bytes one reader needs to hold a decoded panel of `rows` rows (its buffer and any
    /// scratch), for the memory plan.
    fn buffer_bytes(&self, rows: u64) -> u64;
    /// Encoded bytes in storage of the chunks holding operand rows `rows` (for plans).
    fn stored_bytes(&self, rows: Range<u64>) -> u64;
    /// Decodes operand rows `rows` (a whole number of bands, or the last one; any rows
    /// when [`StoredPanels::partial_reads`]) into `buf`, reusing its allocation.
    fn read_panel(&self, rows: Range<u64>, buf: &mut PanelBuffer)
        -> Result<ReadStats, SourceError>;
    /// For storage with latency (an object store): starts fetching what reading the
    /// panels `upcoming` (their rows, in the order they will be read) needs, for the
    /// read-ahead `owner` with `buffers` read buffers, within the memory those buffers'
    /// plan counts; [`StoredPanels::read_panel`] then takes what was fetched. By default
    /// (local storage) nothing is done.
    fn fetch_ahead(&self, owner: u64, buffers: usize, upcoming: &[Range<u64>]) {
        let _ = (owner, buffers, upcoming);
    }
    /// Drops what [`StoredPanels::fetch_ahead`] fetched for `owner` and no read took.
    fn drop_fetched(&self, owner: u64) {
        let _ = owner;
    }
    /// Whether a GPU can decode this storage's chunks itself ([`StoredFrames`]): the
    /// frames' geometry when every chunk is one Blosc frame of int8 dosages spanning every
    /// column in a local file, else why not (the chunks are then decoded on the host).
    fn device_frames(&self) -> Result<StoredFrames, String> {
        Err("its chunks are not Blosc frames of int8 dosages in local files".into())
    }
    /// Reads the stored frame of chunk `band` (operand rows from `band ·
    /// StoredFrames::chunk_rows`) into `frame`, as it is stored: `Ok(false)` when the chunk
    /// has no file (it holds the fill value; decode it on the host).
    fn read_frame(&self, band: u64, frame: &mut Vec<u8>) -> Result<bool, SourceError> {
        let _ = (band, frame);
        Ok(false)
    }
}

/// The geometry of chunks a GPU decodes itself ([`StoredPanels::device_frames`]): each
/// band of `chunk_rows` operand rows is one Blosc frame that decodes to `chunk_rows` rows
/// of `row_bytes` int8 dosages (the operand's columns first; a chunk wider than the array
/// holds fill values past them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredFrames {
    /// Operand rows per chunk (the last chunk's frame still decodes to this many).
    pub chunk_rows: u64,
    /// Bytes per decoded row of a chunk: its columns, one byte each.
    pub row_bytes: u64,
    /// The most bytes a valid frame of one chunk takes in storage.
    pub most_encoded: u64,
}
