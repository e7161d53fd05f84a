//! The Zarr store written by `rankwise gen`: a generated matrix, stored chunk by chunk by
//! the actors that own its panels.
//!
//! Layout (`--out data.zarr`):
//!
//! ```text
//! uniform / normal                 genotype (the VCF-Zarr names)
//! data.zarr/                       data.zarr/
//!   zarr.json  (array; or          zarr.json          group, attributes = generator
//!              .zarray + .zattrs)  call_dosage/       variants × samples, −1 missing
//!   c/<i>/<j>  chunks (v2: i.j)    sample_id/         samples, strings S0000000, …
//! ```
//!
//! Every value is exactly [`Generated::value`] (or [`Generated::genotype`]) of the same
//! generator, cast to the stored type, so a run on the store and a run on the generator
//! can be compared bit for bit. The matrix attributes describe the generator (`dist`,
//! `seed`, `populations`, `fst`, `missing`) so that a reader can tell what it is.
//!
//! The matrix is cut into panels of whole stored chunks (or whole shards) along the rows.
//! Each panel is written whole by one caller, so the same chunk files come out whichever
//! rank or thread writes them; edge chunks are padded with the fill value, which no
//! generated value ever equals. The steps of a multi-rank write are those of
//! [`crate::group::SvdOutput`]: one rank [`GenStore::create`]s under the temporary name,
//! a barrier, the others [`GenStore::open`], everyone [`GenStore::write_panels`] its own
//! panels, a barrier, one rank [`GenStore::commit`]s.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ndarray::{ArrayViewMut2, ShapeBuilder};
use rankwise_sources::{Dist, Generated, PanelSource, SourceError};
use serde_json::{json, Map, Value};
use zarrs::array::{Array, ArrayMetadata, CodecOptions, Element};
use zarrs::filesystem::FilesystemStore;
use zarrs::storage::{ReadableStorageTraits, StoreKey, WritableStorageTraits};

use crate::group::{check_open, commit_once, create_temp_dir, new_store, OutputError, SvdOutput};

/// Zarr format version of the store.
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ZarrFormat {
    /// Zarr v2 (`.zarray`, `.zattrs`, chunk keys `i.j`).
    V2,
    /// Zarr v3 (`zarr.json`, chunk keys `c/i/j`; sharding).
    V3,
}

/// Stored element type.
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 64-bit float.
    F64,
    /// 32-bit float (the f64 value rounded to nearest).
    F32,
    /// Unsigned byte (genotypes without missing calls).
    U8,
    /// Signed byte (genotypes, −1 missing).
    I8,
    /// 16-bit integer.
    I16,
    /// 32-bit integer.
    I32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::I16 => 2,
            DType::U8 | DType::I8 => 1,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32)
    }

    /// Zarr v3 `data_type`.
    fn v3_name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
        }
    }

    /// Zarr v2 (NumPy) `dtype`.
    fn v2_name(self) -> &'static str {
        match self {
            DType::F64 => "<f8",
            DType::F32 => "<f4",
            DType::U8 => "|u1",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
        }
    }

    /// The fill value: a chunk that was never written must not read as plausible data, so
    /// it is NaN for floats and a value no dosage takes for integers (−1 means missing).
    fn fill_value(self) -> Value {
        match self {
            DType::F64 | DType::F32 => json!("NaN"),
            DType::U8 => json!(u8::MAX),
            _ => json!(-2),
        }
    }
}

/// Displays a choice by its serialized name, which is also its command-line value.
macro_rules! display_as_typed {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match serde_json::to_value(self) {
                    Ok(Value::String(name)) => f.write_str(&name),
                    _ => f.write_str("?"),
                }
            }
        }
    )*};
}
display_as_typed!(ZarrFormat, DType, Codec, Shuffle);

/// Compression of the chunks.
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Codec {
    /// Uncompressed.
    None,
    /// Blosc with LZ4, level 5.
    BloscLz4,
    /// Blosc with Zstandard, level 5.
    BloscZstd,
    /// Zstandard, level 3.
    Zstd,
    /// Gzip, level 6.
    Gzip,
}

impl Codec {
    /// Whether the codec shuffles (only Blosc does).
    pub fn shuffles(self) -> bool {
        matches!(self, Codec::BloscLz4 | Codec::BloscZstd)
    }
}

/// Blosc's shuffle filter.
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shuffle {
    /// No shuffle.
    None,
    /// Byte shuffle.
    Byte,
    /// Bit shuffle.
    Bit,
}

/// A layout that cannot be written, naming the parameter at fault.
#[derive(Debug, thiserror::Error)]
#[error("`{parameter}`: {message}")]
pub struct LayoutError {
    /// The parameter at fault (a field of [`GenLayout`], or `rows`/`cols`).
    pub parameter: &'static str,
    /// What is wrong and what to do.
    pub message: String,
}

fn layout_err(parameter: &'static str, message: impl Into<String>) -> LayoutError {
    LayoutError {
        parameter,
        message: message.into(),
    }
}

/// What to store: the generator and how its matrix is chunked, typed and compressed.
#[derive(Clone, Debug)]
pub struct GenLayout {
    /// The generated matrix (untransposed: rows × cols).
    pub source: Generated,
    /// Rows per stored chunk (capped at the rows of the matrix).
    pub chunk_rows: u64,
    /// Columns per stored chunk (capped at the columns).
    pub chunk_cols: u64,
    /// Rows per shard (Zarr v3 sharding; a multiple of `chunk_rows`). A shard spans all
    /// columns, so a panel is one shard file.
    pub shard_rows: Option<u64>,
    /// Element type.
    pub dtype: DType,
    /// Zarr v2 or v3.
    pub format: ZarrFormat,
    /// Compression.
    pub codec: Codec,
    /// Blosc shuffle (`Shuffle::None` for the other codecs).
    pub shuffle: Shuffle,
}

impl GenLayout {
    /// Checks that the layout can be written and holds the generator's values exactly.
    pub fn validate(&self) -> Result<(), LayoutError> {
        if self.source.is_transposed() {
            // Genotype rows are variants: a transposed view would store samples × variants.
            return Err(layout_err(
                "source",
                "a transposed generator cannot be stored; store the untransposed matrix",
            ));
        }
        let (rows, cols) = self.shape();
        if rows == 0 || cols == 0 {
            return Err(layout_err(
                if rows == 0 { "rows" } else { "cols" },
                "the matrix needs at least one row and one column",
            ));
        }
        if self.chunk_rows == 0 {
            return Err(layout_err("chunk_rows", "chunks need at least one row"));
        }
        if self.chunk_cols == 0 {
            return Err(layout_err("chunk_cols", "chunks need at least one column"));
        }
        if let Some(sr) = self.shard_rows {
            if self.format == ZarrFormat::V2 {
                return Err(layout_err(
                    "shard_rows",
                    "sharding is a Zarr v3 codec; use `format` v3 or leave out `shard_rows`",
                ));
            }
            if sr == 0 || !sr.is_multiple_of(self.chunk_rows) {
                return Err(layout_err(
                    "shard_rows",
                    format!(
                        "{sr} is not a positive multiple of `chunk_rows` {}",
                        self.chunk_rows
                    ),
                ));
            }
        }
        if self.shuffle != Shuffle::None && !self.codec.shuffles() {
            return Err(layout_err(
                "shuffle",
                "only the blosc codecs shuffle; use `codec` blosc-lz4 or blosc-zstd, or \
                 `shuffle` none",
            ));
        }
        let dist = self.source.dist();
        match dist {
            Dist::Uniform | Dist::Normal if !self.dtype.is_float() => Err(layout_err(
                "dtype",
                format!(
                    "{dist} values are fractional and do not fit {}; use f64 or f32",
                    self.dtype
                ),
            )),
            Dist::Genotype if self.dtype == DType::U8 && self.source.missing_rate() > 0.0 => {
                Err(layout_err(
                    "dtype",
                    "missing calls are −1, which u8 cannot hold; use i8 (or --missing 0)",
                ))
            }
            _ => Ok(()),
        }
    }

    /// `(rows, cols)` of the matrix.
    pub fn shape(&self) -> (u64, u64) {
        PanelSource::shape(&self.source)
    }

    /// Rows × columns of a stored chunk.
    pub fn chunk_shape(&self) -> [u64; 2] {
        let (rows, cols) = self.shape();
        [
            self.chunk_rows.min(rows).max(1),
            self.chunk_cols.min(cols).max(1),
        ]
    }

    /// Rows of a panel: the unit of work one actor thread writes whole (a row of chunks,
    /// or one shard).
    pub fn panel_rows(&self) -> u64 {
        let [cr, _] = self.chunk_shape();
        match self.shard_rows {
            // Capped like the chunks: a shard taller than the matrix holds it all.
            Some(sr) => sr.min(self.shape().0.div_ceil(cr) * cr),
            None => cr,
        }
    }

    /// The shape of what one `store_chunk` call writes: a chunk, or a shard of
    /// `panel_rows` rows spanning all columns (rounded up to whole chunks).
    fn write_shape(&self) -> [u64; 2] {
        let [cr, cc] = self.chunk_shape();
        match self.shard_rows {
            Some(_) => [self.panel_rows(), self.shape().1.div_ceil(cc) * cc],
            None => [cr, cc],
        }
    }

    /// Number of panels.
    pub fn panels(&self) -> usize {
        self.shape().0.div_ceil(self.panel_rows()) as usize
    }

    /// Rows of panel `p`.
    pub fn panel_range(&self, p: usize) -> Range<u64> {
        let h = self.panel_rows();
        let start = p as u64 * h;
        start..(start + h).min(self.shape().0)
    }

    /// Bytes one writer thread holds for one write: the values, the dosage codes and the
    /// encoded chunk.
    pub fn workspace_bytes(&self) -> u64 {
        let [h, w] = self.write_shape();
        h * w * (2 * self.dtype.size() as u64 + 1)
    }

    /// Bytes of the matrix's values, uncompressed.
    pub fn uncompressed_bytes(&self) -> u64 {
        let (rows, cols) = self.shape();
        rows * cols * self.dtype.size() as u64
    }

    /// True for genotypes: the store is a group with `call_dosage` and `sample_id`.
    pub fn is_genotypes(&self) -> bool {
        self.source.dist() == Dist::Genotype
    }

    /// The matrix array's path inside the store.
    pub fn matrix_path(&self) -> &'static str {
        if self.is_genotypes() {
            "/call_dosage"
        } else {
            "/"
        }
    }

    /// The attributes describing the generator (on the matrix, and on the group).
    pub fn generator_attributes(&self) -> Map<String, Value> {
        let g = &self.source;
        let (rows, cols) = self.shape();
        let mut generator = json!({
            "name": "rankwise block-stream generator (xoroshiro128+ lanes per 256 columns, seeded by SplitMix64 of seed, row, column)",
            "dist": g.dist(),
            "seed": g.seed(),
            "rows": rows,
            "cols": cols,
        });
        if self.is_genotypes() {
            generator["populations"] = json!(g.populations());
            generator["fst"] = json!(g.fst());
            generator["missing"] = json!(g.missing_rate());
            generator["values"] = json!(
                "alternate-allele dosage 0, 1, 2 of variant (row) and sample (column); -1 missing"
            );
        }
        Map::from_iter([
            ("generator".to_string(), generator),
            (
                "producer".to_string(),
                json!(format!("rankwise {}", env!("CARGO_PKG_VERSION"))),
            ),
        ])
    }

    /// The bytes-to-bytes codec of the chunks, as Zarr v3 metadata.
    fn v3_compressor(&self, typesize: usize, shuffle: Shuffle) -> Option<Value> {
        let blosc = |cname: &str| {
            json!({"name": "blosc", "configuration": {
                "cname": cname,
                "clevel": 5,
                "shuffle": match shuffle {
                    Shuffle::None => "noshuffle",
                    Shuffle::Byte => "shuffle",
                    Shuffle::Bit => "bitshuffle",
                },
                "typesize": typesize,
                "blocksize": 0,
            }})
        };
        match self.codec {
            Codec::None => None,
            Codec::BloscLz4 => Some(blosc("lz4")),
            Codec::BloscZstd => Some(blosc("zstd")),
            Codec::Zstd => {
                Some(json!({"name": "zstd", "configuration": {"level": 3, "checksum": false}}))
            }
            Codec::Gzip => Some(json!({"name": "gzip", "configuration": {"level": 6}})),
        }
    }

    /// The compressor of the chunks, as Zarr v2 metadata.
    fn v2_compressor(&self, shuffle: Shuffle) -> Value {
        let blosc = |cname: &str| {
            json!({
                "id": "blosc",
                "cname": cname,
                "clevel": 5,
                "shuffle": match shuffle {
                    Shuffle::None => 0,
                    Shuffle::Byte => 1,
                    Shuffle::Bit => 2,
                },
                "blocksize": 0,
            })
        };
        match self.codec {
            Codec::None => Value::Null,
            Codec::BloscLz4 => blosc("lz4"),
            Codec::BloscZstd => blosc("zstd"),
            Codec::Zstd => json!({"id": "zstd", "level": 3}),
            Codec::Gzip => json!({"id": "gzip", "level": 6}),
        }
    }

    /// Metadata of the matrix array.
    fn matrix_metadata(&self) -> Value {
        let (rows, cols) = self.shape();
        let chunk = self.chunk_shape();
        let dims = if self.is_genotypes() {
            ["variants", "samples"]
        } else {
            ["row", "column"]
        };
        let mut attributes = self.generator_attributes();
        match self.format {
            ZarrFormat::V3 => {
                let endian = json!({"name": "bytes", "configuration": {"endian": "little"}});
                let mut codecs = vec![endian.clone()];
                codecs.extend(self.v3_compressor(self.dtype.size(), self.shuffle));
                let (grid, codecs) = match self.shard_rows {
                    None => (chunk.to_vec(), codecs),
                    Some(_) => (
                        self.write_shape().to_vec(),
                        vec![json!({"name": "sharding_indexed", "configuration": {
                            "chunk_shape": chunk,
                            "codecs": codecs,
                            "index_codecs": [endian, {"name": "crc32c"}],
                            "index_location": "end",
                        }})],
                    ),
                };
                json!({
                    "zarr_format": 3,
                    "node_type": "array",
                    "shape": [rows, cols],
                    "data_type": self.dtype.v3_name(),
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
                    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                    "fill_value": self.dtype.fill_value(),
                    "codecs": codecs,
                    "attributes": attributes,
                    "dimension_names": dims,
                })
            }
            ZarrFormat::V2 => {
                // xarray's name for dimensions in Zarr v2.
                attributes.insert("_ARRAY_DIMENSIONS".into(), json!(dims));
                json!({
                    "zarr_format": 2,
                    "shape": [rows, cols],
                    "chunks": chunk,
                    "dtype": self.dtype.v2_name(),
                    "compressor": self.v2_compressor(self.shuffle),
                    "fill_value": self.dtype.fill_value(),
                    "order": "C",
                    "filters": null,
                    "dimension_separator": ".",
                    "attributes": attributes,
                })
            }
        }
    }

    /// Metadata of `sample_id` (variable-length UTF-8 strings, chunked like the columns).
    fn sample_id_metadata(&self) -> Value {
        let cols = self.shape().1;
        let chunk = self.chunk_shape()[1];
        match self.format {
            ZarrFormat::V3 => {
                let mut codecs = vec![json!({"name": "vlen-utf8"})];
                codecs.extend(self.v3_compressor(1, Shuffle::None));
                json!({
                    "zarr_format": 3,
                    "node_type": "array",
                    "shape": [cols],
                    "data_type": "string",
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk]}},
                    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                    "fill_value": "",
                    "codecs": codecs,
                    "attributes": {},
                    "dimension_names": ["samples"],
                })
            }
            ZarrFormat::V2 => json!({
                "zarr_format": 2,
                "shape": [cols],
                "chunks": [chunk],
                "dtype": "|O",
                "compressor": self.v2_compressor(Shuffle::None),
                "fill_value": "",
                "order": "C",
                "filters": [{"id": "vlen-utf8"}],
                "dimension_separator": ".",
                "attributes": {"_ARRAY_DIMENSIONS": ["samples"]},
            }),
        }
    }
}

/// The identifier of sample `j`: `S0000123`.
pub fn sample_id(j: u64) -> String {
    format!("S{j:07}")
}

/// What writing one panel produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PanelWritten {
    /// Chunk (or shard) files written.
    pub files: u64,
    /// Their bytes on disk.
    pub stored_bytes: u64,
}

/// A generated matrix being stored under its temporary name.
///
/// `Send + Sync`: threads of one rank write disjoint panels through a shared reference.
pub struct GenStore {
    out: PathBuf,
    tmp: PathBuf,
    layout: GenLayout,
    store: Arc<FilesystemStore>,
    matrix: Array<FilesystemStore>,
    /// One codec thread per writer: the actor threads are the parallelism, and zarrs must
    /// not start threads of its own beside them (unpinned, oversubscribing the cores).
    codec_options: CodecOptions,
    metadata_bytes: u64,
    committed: AtomicBool,
}

impl std::fmt::Debug for GenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenStore")
            .field("out", &self.out)
            .field("tmp", &self.tmp)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl GenStore {
    /// Creates the temporary directory `tmp` and writes every piece of metadata (and, for
    /// genotypes, `sample_id`) into it; call on ONE rank, then barrier. Fails if `out` or
    /// `tmp` exists; on error nothing is left behind.
    pub fn create(out: &Path, tmp: &Path, layout: GenLayout) -> Result<GenStore, OutputError> {
        layout
            .validate()
            .map_err(|e| OutputError::Layout(e.to_string()))?;
        SvdOutput::check_target(out)?;
        create_temp_dir(tmp)?;
        let created = Self::new(out, tmp, layout).and_then(|mut s| {
            s.metadata_bytes = s.write_metadata()?;
            Ok(s)
        });
        if created.is_err() {
            let _ = SvdOutput::abandon(tmp);
        }
        created
    }

    /// Opens the store another rank created (after a barrier). Reads nothing: the metadata
    /// follows from the layout, which every rank has.
    pub fn open(out: &Path, tmp: &Path, layout: GenLayout) -> Result<GenStore, OutputError> {
        layout
            .validate()
            .map_err(|e| OutputError::Layout(e.to_string()))?;
        if !tmp.is_dir() {
            return Err(OutputError::TempMissing {
                path: tmp.to_path_buf(),
            });
        }
        Self::new(out, tmp, layout)
    }

    fn new(out: &Path, tmp: &Path, layout: GenLayout) -> Result<GenStore, OutputError> {
        let store = new_store(tmp)?;
        let matrix = array_from_json(&store, tmp, layout.matrix_path(), layout.matrix_metadata())?;
        Ok(GenStore {
            out: out.to_path_buf(),
            tmp: tmp.to_path_buf(),
            layout,
            store,
            matrix,
            codec_options: CodecOptions::default().with_concurrent_target(1),
            metadata_bytes: 0,
            committed: AtomicBool::new(false),
        })
    }

    /// Bytes of metadata (and `sample_id`) this handle wrote: all of them on the rank that
    /// created the store, 0 elsewhere.
    pub fn metadata_bytes(&self) -> u64 {
        self.metadata_bytes
    }

    /// The layout.
    pub fn layout(&self) -> &GenLayout {
        &self.layout
    }

    /// The temporary directory being written.
    pub fn temp_dir(&self) -> &Path {
        &self.tmp
    }

    /// Writes the group, the matrix's metadata and `sample_id`; returns the bytes written.
    fn write_metadata(&self) -> Result<u64, OutputError> {
        let mut bytes = 0;
        if self.layout.is_genotypes() {
            let group = match self.layout.format {
                ZarrFormat::V3 => json!({"zarr_format": 3, "node_type": "group"}),
                ZarrFormat::V2 => json!({"zarr_format": 2}),
            };
            bytes += self.store_node_metadata("", group, self.layout.generator_attributes())?;
            bytes += self.write_sample_ids()?;
        }
        bytes += self.store_node_metadata(
            self.layout.matrix_path(),
            self.layout.matrix_metadata(),
            Map::new(),
        )?;
        Ok(bytes)
    }

    /// Writes a node's metadata exactly as the layout spells it (zarrs would rewrite it:
    /// it spells a codec without configuration as a bare name, which zarr-python 3
    /// rejects): `zarr.json`, or `.zarray`/`.zgroup` and `.zattrs`. `attributes` are added
    /// to those in `metadata`. Returns the bytes written.
    fn store_node_metadata(
        &self,
        node: &str,
        mut metadata: Value,
        attributes: Map<String, Value>,
    ) -> Result<u64, OutputError> {
        let node = node.trim_start_matches('/');
        let mut all = match metadata
            .as_object_mut()
            .and_then(|m| m.remove("attributes"))
        {
            Some(Value::Object(a)) => a,
            _ => Map::new(),
        };
        all.extend(attributes);
        let files = match self.layout.format {
            ZarrFormat::V3 => {
                metadata["attributes"] = Value::Object(all);
                vec![("zarr.json", metadata)]
            }
            ZarrFormat::V2 => {
                let name = if metadata.get("shape").is_some() {
                    ".zarray"
                } else {
                    ".zgroup"
                };
                let mut files = vec![(name, metadata)];
                if !all.is_empty() {
                    files.push((".zattrs", Value::Object(all)));
                }
                files
            }
        };
        let mut bytes = 0;
        for (file, value) in files {
            let key = if node.is_empty() {
                file.to_string()
            } else {
                format!("{node}/{file}")
            };
            let zerr = |e: ZarrsError| self.zarr_err(node, String::new(), e);
            let key = StoreKey::new(key).map_err(|e| zerr(e.into()))?;
            let mut text = serde_json::to_vec_pretty(&value).map_err(|e| zerr(e.into()))?;
            text.push(b'\n');
            bytes += text.len() as u64;
            self.store
                .set(&key, text.into())
                .map_err(|e| zerr(e.into()))?;
        }
        Ok(bytes)
    }

    /// Writes `sample_id`, a chunk at a time (there may be millions of samples).
    fn write_sample_ids(&self) -> Result<u64, OutputError> {
        let metadata = self.layout.sample_id_metadata();
        let ids = array_from_json(&self.store, &self.tmp, "/sample_id", metadata.clone())?;
        let mut bytes = self.store_node_metadata("sample_id", metadata, Map::new())?;
        let cols = self.layout.shape().1;
        let chunk = self.layout.chunk_shape()[1];
        for c in 0..cols.div_ceil(chunk) {
            // The edge chunk is padded with the fill value, as zarrs stores whole chunks.
            let values: Vec<String> = (c * chunk..(c + 1) * chunk)
                .map(|j| {
                    if j < cols {
                        sample_id(j)
                    } else {
                        String::new()
                    }
                })
                .collect();
            let refs: Vec<&str> = values.iter().map(String::as_str).collect();
            ids.store_chunk_opt(&[c], &refs[..], &self.codec_options)
                .map_err(|e| self.zarr_err("sample_id", format!(", chunk [{c}]"), e.into()))?;
            bytes += self.key_size(&ids.chunk_key(&[c]));
        }
        Ok(bytes)
    }

    /// Generates panels `panels` and writes their chunks (or shards), one after another
    /// through the same buffers. Callable concurrently from several threads and ranks for
    /// different panels.
    pub fn write_panels(&self, panels: &[usize]) -> Result<PanelWritten, OutputError> {
        match self.layout.dtype {
            DType::F64 => self.write_panels_as::<f64>(panels),
            DType::F32 => self.write_panels_as::<f32>(panels),
            DType::U8 => self.write_panels_as::<u8>(panels),
            DType::I8 => self.write_panels_as::<i8>(panels),
            DType::I16 => self.write_panels_as::<i16>(panels),
            DType::I32 => self.write_panels_as::<i32>(panels),
        }
    }

    fn write_panels_as<T: Cell>(&self, panels: &[usize]) -> Result<PanelWritten, OutputError> {
        let cols = self.layout.shape().1;
        let [h, w] = self.layout.write_shape();
        // Reused for every chunk: a fresh chunk-sized buffer each time would be mapped,
        // faulted in page by page and unmapped again, which costs more than generating it.
        let mut values = Vec::new();
        let mut codes = Vec::new();
        let mut written = PanelWritten::default();
        for &p in panels {
            let rows = self.layout.panel_range(p);
            for cj in 0..cols.div_ceil(w) {
                let block = cj * w..((cj + 1) * w).min(cols);
                let chunk = || format!(", chunk [{p}, {cj}]");
                let path = self.layout.matrix_path();
                generate_block::<T>(
                    &self.layout.source,
                    rows.clone(),
                    block,
                    [h as usize, w as usize],
                    &mut values,
                    &mut codes,
                )
                .map_err(|e| self.zarr_err(path, chunk(), e.into()))?;
                // Never recreate a temporary directory that a failing rank already removed.
                let _writing = self.ensure_open()?;
                let indices = [p as u64, cj];
                self.matrix
                    .store_chunk_opt(&indices, &values[..], &self.codec_options)
                    .map_err(|e| self.zarr_err(path, chunk(), e.into()))?;
                written.files += 1;
                written.stored_bytes += self.key_size(&self.matrix.chunk_key(&indices));
            }
        }
        Ok(written)
    }

    /// Renames the temporary directory to `out` (one rank, after a barrier that follows
    /// every rank's last write). Fails, leaving the temporary directory, if `out` exists.
    pub fn commit(&self) -> Result<PathBuf, OutputError> {
        commit_once(&self.committed, &self.tmp, &self.out)
    }

    /// Fails once the output was committed or abandoned; hold the guard it returns for the
    /// write (see [`crate::group::SvdOutput`]'s).
    fn ensure_open(&self) -> Result<crate::temporaries::Writing, OutputError> {
        let writing = crate::temporaries::writing();
        check_open(&self.committed, &self.tmp, &self.out)?;
        Ok(writing)
    }

    /// Size of a stored file (0 when it is not there).
    fn key_size(&self, key: &StoreKey) -> u64 {
        self.store.size_key(key).ok().flatten().unwrap_or(0)
    }

    fn zarr_err(&self, array: &str, chunk: String, source: ZarrsError) -> OutputError {
        OutputError::Zarr {
            path: self.tmp.clone(),
            array: match array.trim_start_matches('/') {
                "" => "(matrix)".to_string(),
                a => a.to_string(),
            },
            chunk,
            source,
        }
    }
}

type ZarrsError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An array handle from metadata given as JSON (v2 or v3).
fn array_from_json(
    store: &Arc<FilesystemStore>,
    dir: &Path,
    path: &str,
    metadata: Value,
) -> Result<Array<FilesystemStore>, OutputError> {
    let zerr = |e: ZarrsError| OutputError::Zarr {
        path: dir.to_path_buf(),
        array: path.to_string(),
        chunk: String::new(),
        source: e,
    };
    let metadata: ArrayMetadata = serde_json::from_value(metadata).map_err(|e| zerr(e.into()))?;
    Array::new_with_metadata(store.clone(), path, metadata).map_err(|e| zerr(e.into()))
}

/// An element type `rankwise gen` stores.
trait Cell: Element + Copy + Send + Sync + 'static {
    /// The fill value (see [`DType::fill_value`]).
    const FILL: Self;
    /// A dosage (−1..=2; the layout rules out −1 for `u8`).
    fn from_dosage(d: i8) -> Self;
    /// Uniform or normal values of `rows × cols` into `out`.
    fn fill_floats(
        g: &Generated,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, Self>,
    ) -> Result<(), SourceError>;
}

impl Cell for f64 {
    const FILL: f64 = f64::NAN;
    fn from_dosage(d: i8) -> f64 {
        d as f64
    }
    fn fill_floats(
        g: &Generated,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, f64>,
    ) -> Result<(), SourceError> {
        g.fill_cols(rows, cols, out)
    }
}

impl Cell for f32 {
    const FILL: f32 = f32::NAN;
    fn from_dosage(d: i8) -> f32 {
        d as f32
    }
    fn fill_floats(
        g: &Generated,
        rows: Range<u64>,
        cols: Range<u64>,
        out: ArrayViewMut2<'_, f32>,
    ) -> Result<(), SourceError> {
        g.fill_cols_f32(rows, cols, out)
    }
}

macro_rules! integer_cell {
    ($t:ty, $fill:expr) => {
        impl Cell for $t {
            const FILL: $t = $fill;
            fn from_dosage(d: i8) -> $t {
                d as $t
            }
            fn fill_floats(
                g: &Generated,
                rows: Range<u64>,
                cols: Range<u64>,
                mut out: ArrayViewMut2<'_, $t>,
            ) -> Result<(), SourceError> {
                // Unreachable through a validated layout (fractional values need a float
                // type); a plain cast keeps it total.
                let mut tile = ndarray::Array2::<f64>::zeros(out.dim());
                g.fill_cols(rows, cols, tile.view_mut())?;
                out.zip_mut_with(&tile, |o, &v| *o = v as $t);
                Ok(())
            }
        }
    };
}
integer_cell!(u8, u8::MAX);
integer_cell!(i8, -2);
integer_cell!(i16, -2);
integer_cell!(i32, -2);

/// Fills `values` with the `full = [h, w]` chunk whose top-left `rows × cols` block holds the
/// generator's values; the rest (beyond the matrix's edge) is the fill value.
fn generate_block<T: Cell>(
    g: &Generated,
    rows: Range<u64>,
    cols: Range<u64>,
    full: [usize; 2],
    values: &mut Vec<T>,
    codes: &mut Vec<i8>,
) -> Result<(), SourceError> {
    let [h, w] = full;
    let (bh, bw) = (
        (rows.end - rows.start) as usize,
        (cols.end - cols.start) as usize,
    );
    values.clear();
    values.resize(h * w, T::FILL);
    if g.dist() == Dist::Genotype {
        codes.clear();
        codes.resize(bh * bw, 0);
        g.fill_genotype_rows(rows, cols, codes);
        for (r, src) in codes.chunks_exact(bw).enumerate() {
            for (o, &d) in values[r * w..r * w + bw].iter_mut().zip(src) {
                *o = T::from_dosage(d);
            }
        }
        return Ok(());
    }
    // Rows of the block in place, with the chunk's row stride: a full-width chunk is a
    // contiguous row-major view, which the generator fills fastest.
    let view =
        ArrayViewMut2::from_shape((bh, bw).strides((w, 1)), &mut values[..]).map_err(|_| {
            SourceError::OutOfBounds {
                rows: rows.clone(),
                cols: bw,
                shape: PanelSource::shape(g),
                what: PanelSource::describe(g),
            }
        })?;
    T::fill_floats(g, rows, cols, view)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dist: Dist, dtype: DType) -> GenLayout {
        GenLayout {
            source: Generated::new(10, 7, 1, dist),
            chunk_rows: 4,
            chunk_cols: 3,
            shard_rows: None,
            dtype,
            format: ZarrFormat::V3,
            codec: Codec::BloscLz4,
            shuffle: Shuffle::Bit,
        }
    }

    #[test]
    fn layout_rules_name_the_option() {
        let check = |l: GenLayout, parameter: &str| {
            let e = l.validate().unwrap_err();
            assert_eq!(e.parameter, parameter, "{e}");
        };
        check(layout(Dist::Normal, DType::U8), "dtype");
        check(layout(Dist::Uniform, DType::I32), "dtype");
        let mut l = layout(Dist::Genotype, DType::U8);
        assert!(l.validate().is_ok());
        l.source = l.source.with_missing(0.1);
        check(l, "dtype");
        let mut l = layout(Dist::Uniform, DType::F32);
        l.shard_rows = Some(6);
        check(l.clone(), "shard_rows");
        l.shard_rows = Some(8);
        assert!(l.validate().is_ok());
        l.format = ZarrFormat::V2;
        check(l, "shard_rows");
        let mut l = layout(Dist::Uniform, DType::F64);
        l.codec = Codec::Zstd;
        check(l.clone(), "shuffle");
        l.shuffle = Shuffle::None;
        assert!(l.validate().is_ok());
        l.chunk_cols = 0;
        check(l, "chunk_cols");
        let mut l = layout(Dist::Uniform, DType::F64);
        l.source = l.source.transposed();
        check(l, "source");
    }

    #[test]
    fn panels_and_writes_are_whole_chunks_or_shards() {
        let mut l = layout(Dist::Uniform, DType::F64);
        assert_eq!(
            (l.chunk_shape(), l.panel_rows(), l.panels()),
            ([4, 3], 4, 3)
        );
        assert_eq!(l.write_shape(), [4, 3]);
        assert_eq!(l.panel_range(2), 8..10);
        l.shard_rows = Some(8);
        assert_eq!(
            (l.panel_rows(), l.panels(), l.write_shape()),
            (8, 2, [8, 9])
        );
        // Chunks and shards larger than the matrix are capped.
        l.chunk_rows = 40;
        l.shard_rows = Some(80);
        assert_eq!(
            (l.chunk_shape(), l.panel_rows(), l.panels()),
            ([10, 3], 10, 1)
        );
    }

    #[test]
    fn blocks_are_the_generator_values_padded_with_fill() {
        let g = Generated::new(5, 7, 3, Dist::Uniform);
        let (mut v, mut c) = (Vec::new(), Vec::new());
        generate_block::<f32>(&g, 3..5, 6..7, [4, 3], &mut v, &mut c).unwrap();
        for r in 0..4 {
            for k in 0..3 {
                let x = v[r * 3 + k];
                if r < 2 && k < 1 {
                    assert_eq!(x, g.value(3 + r as u64, 6) as f32);
                } else {
                    assert!(x.is_nan());
                }
            }
        }
        let g = Generated::new(5, 7, 3, Dist::Genotype).with_missing(0.3);
        generate_block::<i16>(&g, 0..5, 0..7, [5, 8], &mut Vec::new(), &mut c).unwrap();
        let mut v = Vec::new();
        generate_block::<i16>(&g, 0..5, 0..7, [5, 8], &mut v, &mut c).unwrap();
        for r in 0..5u64 {
            for k in 0..8u64 {
                let want = if k < 7 { g.genotype(r, k) as i16 } else { -2 };
                assert_eq!(v[(r * 8 + k) as usize], want);
            }
        }
    }
}
