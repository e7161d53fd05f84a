//! The Zarr output group of an SVD run: Zarr v3 by default, or Zarr v2 for readers that
//! only know v2 (sgkit 0.10 pins zarr-python 2).
//!
//! Layout of the group (`--out result.zarr`):
//!
//! ```text
//! result.zarr/
//!   zarr.json      group metadata; attributes = OutputLayout::attributes (+ updates,
//!                  the run report as `report`), every array's metadata consolidated
//!   S/             (k)      f64, one chunk
//!   U/             (m, k)   f64, chunks of u_chunk_rows rows × k
//!   Vt/            (k, n)   f64, chunks of k × vt_chunk_cols columns
//!   <vectors>/     optional small 1-D f64 arrays (explained variance, ...)
//! ```
//!
//! In Zarr v2 ([`ZarrFormat::V2`]) the group's metadata is `.zgroup` and `.zattrs`, each
//! array's `.zarray` and `.zattrs` (its dimension names as xarray's `_ARRAY_DIMENSIONS`),
//! and the consolidated metadata `.zmetadata`, as zarr-python 2 writes them.
//!
//! Arrays are uncompressed little-endian f64 (readable by any Zarr implementation)
//! with fill value NaN, so a chunk that was never written reads as NaN, never as
//! plausible zeros.
//!
//! Several MPI ranks write into one group on a shared file system. The caller
//! sequences the steps with barriers:
//!
//! 1. every rank: [`SvdOutput::check_target`] (cheap, gives early errors);
//! 2. every rank: `tmp = SvdOutput::temp_path(out, token)` with the same token;
//! 3. one rank: [`SvdOutput::create`]; barrier; other ranks: [`SvdOutput::open`];
//! 4. every rank writes its own chunks ([`SvdOutput::write_u_rows`], possibly
//!    from several threads at once); one rank writes S, Vt, vectors, the report;
//! 5. barrier; one rank: [`SvdOutput::commit`] renames `tmp` to `out` atomically.
//!    On failure: [`SvdOutput::abandon`] removes `tmp`.
//!
//! Nothing appears under the `--out` name before everything has been written.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ndarray::{s, ArrayView2};
use zarrs::array::{data_type, Array, ArrayBuilder};
use zarrs::filesystem::FilesystemStore;
use zarrs::group::{Group, GroupBuilder};

/// Boxed error of the zarrs crate kept as the source of an [`OutputError`].
type ZarrsError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of writing the output group. Every message names the path involved
/// (and the array and chunk where relevant).
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The output path exists already.
    #[error("`out` {path}: already exists; `out` must not exist (rankwise never overwrites results)", path = .path.display())]
    Exists {
        /// The `--out` path.
        path: PathBuf,
    },
    /// The output path is a URL: outputs are written to a file system.
    #[error("`out` {path}: a URL; outputs are written to a local or shared file system (write there, then copy, e.g. `aws s3 cp --recursive`)", path = .path.display())]
    Url {
        /// The `--out` path.
        path: PathBuf,
    },
    /// The output path has no final component (e.g. `/` or `..`).
    #[error("`out` {path}: not a usable output path; `out` must name a new directory such as result.zarr", path = .path.display())]
    BadPath {
        /// The `--out` path.
        path: PathBuf,
    },
    /// The parent directory of the output path does not exist or is no directory.
    #[error("`out` {path}: parent directory {parent} {problem}; create it or choose another `out`", path = .path.display(), parent = .parent.display())]
    NoParent {
        /// The `--out` path.
        path: PathBuf,
        /// Its parent directory.
        parent: PathBuf,
        /// "does not exist" or "is not a directory".
        problem: &'static str,
    },
    /// The parent directory of the output path is not writable.
    #[error("`out` {path}: parent directory {parent} is not writable ({reason}); choose another `out`", path = .path.display(), parent = .parent.display())]
    NotWritable {
        /// The `--out` path.
        path: PathBuf,
        /// Its parent directory.
        parent: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// The temporary directory exists already (a leftover of an earlier attempt).
    #[error("{path}: temporary output directory already exists (left over from an earlier run with the same job token?); remove it and retry", path = .path.display())]
    TempExists {
        /// The temporary directory.
        path: PathBuf,
    },
    /// The temporary directory is missing when a rank opens it.
    #[error("{path}: temporary output directory not found; SvdOutput::create must run on one rank before the others open it", path = .path.display())]
    TempMissing {
        /// The temporary directory.
        path: PathBuf,
    },
    /// The output layout is invalid.
    #[error("output layout: {0}")]
    Layout(String),
    /// A file system operation failed.
    #[error("{path}: {op}: {source}", path = .path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The operating system error.
        #[source]
        source: std::io::Error,
    },
    /// The zarrs crate failed on an array or the group.
    #[error("{path}: array {array}{chunk}: {source}", path = .path.display())]
    Zarr {
        /// The group directory.
        path: PathBuf,
        /// The array ("U", "S", "Vt", ...) or "(group)".
        array: String,
        /// ", chunk [i, j]" where a chunk is involved, else empty.
        chunk: String,
        /// The zarrs error.
        #[source]
        source: ZarrsError,
    },
    /// A block passed to a write method does not fit the array or its chunks.
    #[error("{path}: array {array}: {message}", path = .path.display())]
    Block {
        /// The group directory.
        path: PathBuf,
        /// The array.
        array: String,
        /// What is wrong with the block.
        message: String,
    },
    /// An existing array does not match the expected layout.
    #[error("{path}: array {array}: {message}", path = .path.display())]
    Mismatch {
        /// The group directory.
        path: PathBuf,
        /// The array.
        array: String,
        /// Expected versus found.
        message: String,
    },
    /// A write or commit after the group was committed.
    #[error("{path}: output already committed; it can no longer be written", path = .path.display())]
    Committed {
        /// The committed output path.
        path: PathBuf,
    },
    /// Serializing JSON failed.
    #[error("{path}: encoding JSON: {source}", path = .path.display())]
    Json {
        /// The file being written.
        path: PathBuf,
        /// The serde_json error.
        #[source]
        source: serde_json::Error,
    },
}

/// Shape and chunking of the output arrays, and the group attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputLayout {
    /// Rows of A (and of U).
    pub m: u64,
    /// Columns of A (and of Vt).
    pub n: u64,
    /// Number of singular values / components.
    pub k: u64,
    /// Rows per chunk of U (capped at m). Blocks written with
    /// [`SvdOutput::write_u_rows`] start on multiples of this.
    pub u_chunk_rows: u64,
    /// Columns per chunk of Vt (capped at n). Blocks written with
    /// [`SvdOutput::write_vt_cols`] start on multiples of this.
    pub vt_chunk_cols: u64,
    /// Attributes of the group (run metadata), stored in its `zarr.json`.
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// Names of 1-D f64 arrays of m values beside U, chunked as U (a PCA's per-variant
    /// allele frequencies), written with [`SvdOutput::write_row_vector`].
    pub row_vectors: Vec<String>,
    /// Names of m × k f64 arrays beside U, chunked and named as U (a PCA's loadings),
    /// written with [`SvdOutput::write_row_matrix`].
    pub row_matrices: Vec<String>,
    /// The arrays' dimension names.
    pub dims: Dims,
    /// The Zarr format of the group.
    pub format: ZarrFormat,
}

/// The Zarr format an output group is written in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ZarrFormat {
    /// Zarr v3 (`zarr.json`), the default.
    #[default]
    V3,
    /// Zarr v2 (`.zgroup`, `.zarray`, `.zattrs`, consolidated `.zmetadata`), for readers that
    /// only know v2, such as sgkit 0.10 (zarr-python < 3).
    V2,
}

/// The element types of a group's arrays.
#[derive(Clone, Copy, Debug)]
enum Element {
    /// f64, fill value NaN.
    F64,
    /// i64, fill value 0 (in Zarr v2 none, which zarrs reads as 0).
    I64,
    /// Variable-length UTF-8 strings, fill value empty.
    Str,
}

/// Creates the array `name` of the group in `store` and stores its metadata, in `format`.
///
/// Zarr v2 arrays are made from their `.zarray` document, which zarrs writes as given; the
/// dimension names become the `_ARRAY_DIMENSIONS` attribute, as xarray writes and reads
/// them in v2.
fn new_array(
    store: &Arc<FilesystemStore>,
    format: ZarrFormat,
    name: &str,
    shape: Vec<u64>,
    chunks: Vec<u64>,
    element: Element,
    dims: &[&str],
) -> Result<Array<FilesystemStore>, ZarrsError> {
    let path = format!("/{name}");
    let array = match format {
        ZarrFormat::V3 => {
            let mut builder = match element {
                Element::F64 => ArrayBuilder::new(shape, chunks, data_type::float64(), f64::NAN),
                Element::I64 => ArrayBuilder::new(shape, chunks, data_type::int64(), 0i64),
                Element::Str => ArrayBuilder::new(shape, chunks, data_type::string(), ""),
            };
            builder
                .dimension_names(Some(dims.to_vec()))
                .build(store.clone(), &path)?
        }
        ZarrFormat::V2 => {
            let (dtype, fill, filters) = match element {
                Element::F64 => ("<f8", serde_json::json!("NaN"), serde_json::Value::Null),
                // A null fill, as zarr-python 2 writes integers by default: xarray reads the
                // fill value of a v2 array as its `_FillValue`, and would make integers with
                // one floats.
                Element::I64 => ("<i8", serde_json::Value::Null, serde_json::Value::Null),
                // zarr-python 2's object strings: a null fill, the numcodecs VLenUTF8 filter
                // (whose encoding is the v3 `vlen-utf8` codec's).
                Element::Str => (
                    "|O",
                    serde_json::Value::Null,
                    serde_json::json!([{ "id": "vlen-utf8" }]),
                ),
            };
            let zarray = serde_json::json!({
                "zarr_format": 2,
                "shape": shape,
                "chunks": chunks,
                "dtype": dtype,
                "compressor": null,
                "fill_value": fill,
                "order": "C",
                "filters": filters,
                "dimension_separator": ".",
            });
            let metadata: zarrs::metadata::v2::ArrayMetadataV2 = serde_json::from_value(zarray)?;
            let attributes =
                serde_json::Map::from_iter([("_ARRAY_DIMENSIONS".to_string(), dims.into())]);
            Array::new_with_metadata(
                store.clone(),
                &path,
                zarrs::metadata::ArrayMetadata::V2(metadata.with_attributes(attributes)),
            )?
        }
    };
    array.store_metadata()?;
    Ok(array)
}

/// The dimension names of a group's arrays: of A's rows, of its columns, and of the
/// components.
#[derive(Clone, Debug, PartialEq)]
pub struct Dims {
    /// Of the rows (`row`; a PCA's `variants`).
    pub rows: &'static str,
    /// Of the columns (`column`; a PCA's `samples`).
    pub cols: &'static str,
    /// Of the components (`component`; a PCA's `components`).
    pub components: &'static str,
}

impl Dims {
    /// `row`, `column`, `component`.
    pub const MATRIX: Dims = Dims {
        rows: "row",
        cols: "column",
        components: "component",
    };
    /// sgkit's: `variants`, `samples`, `components`.
    pub const GENOTYPES: Dims = Dims {
        rows: "variants",
        cols: "samples",
        components: "components",
    };
}

impl OutputLayout {
    /// Checks that every size is positive.
    fn validate(&self) -> Result<(), OutputError> {
        for (name, v) in [
            ("m", self.m),
            ("n", self.n),
            ("k", self.k),
            ("u_chunk_rows", self.u_chunk_rows),
            ("vt_chunk_cols", self.vt_chunk_cols),
        ] {
            if v == 0 {
                return Err(OutputError::Layout(format!("{name} must be positive")));
            }
        }
        Ok(())
    }

    /// Rows per U chunk as stored: `u_chunk_rows` capped at `m`.
    pub fn u_chunk_rows_stored(&self) -> u64 {
        self.u_chunk_rows.min(self.m).max(1)
    }

    /// Columns per Vt chunk as stored: `vt_chunk_cols` capped at `n`.
    pub fn vt_chunk_cols_stored(&self) -> u64 {
        self.vt_chunk_cols.min(self.n).max(1)
    }
}

/// The first `len` elements of a chunk of a 1-D array, as a subset.
#[allow(clippy::single_range_in_vec_init)] // one range per dimension, and there is one
fn first(len: u64) -> [std::ops::Range<u64>; 1] {
    [0..len]
}

/// Whether `name` may name an extra array: ASCII letters, digits, `_`, `-` or `.`, not
/// starting with `.` or `__`, and not a main array's or the report's name.
fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && !name.starts_with('.')
        && !name.starts_with("__")
        && !RESERVED.contains(&name)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if valid {
        Ok(())
    } else {
        Err(
            "is not a valid name for an extra array (ASCII letters, digits, _ - .; not U, S, Vt)"
                .to_string(),
        )
    }
}

/// The group attribute that holds the run report.
pub const REPORT_ATTRIBUTE: &str = "report";
/// Names reserved for the main arrays.
const RESERVED: [&str; 3] = ["U", "S", "Vt"];

/// An SVD output group being written under its temporary name.
///
/// `SvdOutput` is `Send + Sync`: threads of one rank may write disjoint chunks
/// through a shared reference at the same time.
pub struct SvdOutput {
    /// Final path (`--out`).
    out: PathBuf,
    /// Temporary directory the group is written into.
    tmp: PathBuf,
    /// Layout (as given; stored chunk sizes via the helper methods).
    layout: OutputLayout,
    /// The file system store rooted at `tmp`.
    store: Arc<FilesystemStore>,
    /// U, m × k.
    u: Array<FilesystemStore>,
    /// S, k.
    s: Array<FilesystemStore>,
    /// Vt, k × n.
    vt: Array<FilesystemStore>,
    /// The layout's `row_vectors`.
    row_vectors: Vec<(String, Array<FilesystemStore>)>,
    /// The layout's `row_matrices`.
    row_matrices: Vec<(String, Array<FilesystemStore>)>,
    /// Set by [`SvdOutput::commit`]; later writes are refused.
    committed: AtomicBool,
    /// C-order copies of row chunks, reused chunk after chunk by the writing threads and
    /// freed with the output: a fresh buffer per chunk faulted in (and the kernel zeroed)
    /// as many new pages as the chunk writes. Measured with `svd` of 10,000,000 × 20 to
    /// Zarr on the 2-core Zen 3 guest, interleaved: pass 2 took 2.4–5.3 s with a fresh
    /// buffer per chunk, 2.0–3.1 s with these (the page cache's state varies run to run;
    /// `dd` of the same bytes: 0.9–1.4 s to the page cache, 1.1–1.2 s with fdatasync).
    c_order: Arc<std::sync::Mutex<Vec<Vec<f64>>>>,
}

/// A C-order copy of one whole chunk, lent to the store as that chunk's encoded bytes (the
/// arrays are uncompressed little-endian f64: the values' bytes are the encoding), and given
/// back to the pool when the store drops it after writing. zarrs's `store_chunk` would
/// copy the values into a fresh encoded buffer first (its pages faulted in and zeroed).
struct LentChunk {
    values: Vec<f64>,
    pool: Arc<std::sync::Mutex<Vec<Vec<f64>>>>,
}

impl AsRef<[u8]> for LentChunk {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: any f64's 8 bytes are valid u8s; the slice covers the values exactly and
        // lives as long as `self`.
        unsafe {
            std::slice::from_raw_parts(self.values.as_ptr().cast::<u8>(), self.values.len() * 8)
        }
    }
}

impl Drop for LentChunk {
    fn drop(&mut self) {
        let values = std::mem::take(&mut self.values);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(values);
    }
}

impl std::fmt::Debug for SvdOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SvdOutput")
            .field("out", &self.out)
            .field("tmp", &self.tmp)
            .field("layout", &self.layout)
            .finish_non_exhaustive()
    }
}

impl SvdOutput {
    /// Temporaries beside `out` that another run left (`<name>.tmp-*`, and the PCA's
    /// `<stem>.tmp-*.<ext>` side files): a run killed by SIGKILL, or one still writing.
    /// Whether their writer is gone cannot be told from here on a shared file system, so
    /// they are named, not removed.
    pub fn stale_temporaries(out: &Path) -> Vec<PathBuf> {
        let (Some(name), Some(stem)) = (
            out.file_name().and_then(|n| n.to_str()),
            out.file_stem().and_then(|n| n.to_str()),
        ) else {
            return Vec::new();
        };
        let ours = format!("{name}.tmp-");
        let side = format!("{stem}.tmp-");
        let mut found: Vec<PathBuf> = fs::read_dir(parent_dir(out))
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        let n = e.file_name();
                        let n = n.to_string_lossy();
                        n.starts_with(&ours) || n.starts_with(&side)
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        found
    }

    /// Checks that `out` can be created: it must not exist, and its parent must be
    /// an existing writable directory. Errors name the path and `--out`.
    pub fn check_target(out: &Path) -> Result<(), OutputError> {
        let text = out.to_string_lossy();
        if ["s3://", "s3a://", "gs://", "gcs://", "http://", "https://"]
            .iter()
            .any(|s| text.starts_with(s))
        {
            return Err(OutputError::Url {
                path: out.to_path_buf(),
            });
        }
        if out.file_name().is_none() {
            return Err(OutputError::BadPath {
                path: out.to_path_buf(),
            });
        }
        match fs::symlink_metadata(out) {
            Ok(_) => {
                return Err(OutputError::Exists {
                    path: out.to_path_buf(),
                })
            }
            // A missing or non-directory parent is reported below.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) => {}
            Err(e) => {
                return Err(OutputError::Io {
                    path: out.to_path_buf(),
                    op: "checking `out`",
                    source: e,
                })
            }
        }
        let parent = parent_dir(out);
        match fs::metadata(&parent) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                return Err(OutputError::NoParent {
                    path: out.to_path_buf(),
                    parent,
                    problem: "is not a directory",
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(OutputError::NoParent {
                    path: out.to_path_buf(),
                    parent,
                    problem: "does not exist",
                })
            }
            Err(e) => {
                return Err(OutputError::Io {
                    path: parent,
                    op: "checking the parent directory of `out`",
                    source: e,
                })
            }
        }
        if let Err(reason) = check_writable(&parent) {
            return Err(OutputError::NotWritable {
                path: out.to_path_buf(),
                parent,
                reason,
            });
        }
        Ok(())
    }

    /// The temporary sibling directory `<out>.tmp-<job_token>` the group is written
    /// into. Every rank must pass the same token (e.g. the Slurm job and step id,
    /// or a value broadcast from rank 0). Characters other than ASCII letters,
    /// digits, `-` and `_` in the token are replaced by `_`.
    pub fn temp_path(out: &Path, job_token: &str) -> PathBuf {
        let token: String = job_token
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        match out.file_name() {
            Some(name) => {
                let mut name = name.to_os_string();
                name.push(format!(".tmp-{token}"));
                out.with_file_name(name)
            }
            None => {
                let mut s = out.as_os_str().to_os_string();
                s.push(format!(".tmp-{token}"));
                PathBuf::from(s)
            }
        }
    }

    /// Creates the group with arrays S, U and Vt and the layout's attributes in
    /// the new directory `tmp` (call on ONE rank, then barrier). Fails if `out`
    /// or `tmp` exists. On error nothing is left behind.
    pub fn create(out: &Path, tmp: &Path, layout: OutputLayout) -> Result<SvdOutput, OutputError> {
        layout.validate()?;
        Self::check_target(out)?;
        create_temp_dir(tmp)?;
        match Self::create_in(out, tmp, layout) {
            Ok(o) => Ok(o),
            Err(e) => {
                let _ = fs::remove_dir_all(tmp);
                Err(e)
            }
        }
    }

    /// Writes group and array metadata into the (new, empty) `tmp`.
    fn create_in(out: &Path, tmp: &Path, layout: OutputLayout) -> Result<SvdOutput, OutputError> {
        let store = new_store(tmp)?;
        let zerr = |array: &str, e: ZarrsError| OutputError::Zarr {
            path: tmp.to_path_buf(),
            array: array.to_string(),
            chunk: String::new(),
            source: e,
        };
        let group = match layout.format {
            ZarrFormat::V3 => GroupBuilder::new()
                .attributes(layout.attributes.clone())
                .build(store.clone(), "/")
                .map_err(|e| zerr("(group)", e.into()))?,
            ZarrFormat::V2 => Group::new_with_metadata(
                store.clone(),
                "/",
                zarrs::metadata::GroupMetadata::V2(
                    zarrs::metadata::v2::GroupMetadataV2::new()
                        .with_attributes(layout.attributes.clone()),
                ),
            )
            .map_err(|e| zerr("(group)", e.into()))?,
        };
        group
            .store_metadata()
            .map_err(|e| zerr("(group)", e.into()))?;

        let (m, n, k) = (layout.m, layout.n, layout.k);
        let new_array = |name: &str, shape: Vec<u64>, chunks: Vec<u64>, dims: &[&str]| {
            new_array(
                &store,
                layout.format,
                name,
                shape,
                chunks,
                Element::F64,
                dims,
            )
            .map(drop)
            .map_err(|e| zerr(name, e))
        };
        let d = &layout.dims;
        new_array("S", vec![k], vec![k], &[d.components])?;
        new_array(
            "U",
            vec![m, k],
            vec![layout.u_chunk_rows_stored(), k],
            &[d.rows, d.components],
        )?;
        new_array(
            "Vt",
            vec![k, n],
            vec![k, layout.vt_chunk_cols_stored()],
            &[d.components, d.cols],
        )?;
        for name in &layout.row_vectors {
            check_name(name)
                .map_err(|message| OutputError::Layout(format!("{name:?} {message}")))?;
            new_array(name, vec![m], vec![layout.u_chunk_rows_stored()], &[d.rows])?;
        }
        for name in &layout.row_matrices {
            check_name(name)
                .map_err(|message| OutputError::Layout(format!("{name:?} {message}")))?;
            new_array(
                name,
                vec![m, k],
                vec![layout.u_chunk_rows_stored(), k],
                &[d.rows, d.components],
            )?;
        }
        Self::open_existing(out, tmp, layout, store)
    }

    /// Opens the group another rank created with [`SvdOutput::create`] (after a
    /// barrier). Writes no metadata; checks that the arrays match `layout`.
    pub fn open(out: &Path, tmp: &Path, layout: OutputLayout) -> Result<SvdOutput, OutputError> {
        layout.validate()?;
        if !tmp.is_dir() {
            return Err(OutputError::TempMissing {
                path: tmp.to_path_buf(),
            });
        }
        let store = new_store(tmp)?;
        Self::open_existing(out, tmp, layout, store)
    }

    /// Opens the three arrays and checks their shapes and chunking.
    fn open_existing(
        out: &Path,
        tmp: &Path,
        layout: OutputLayout,
        store: Arc<FilesystemStore>,
    ) -> Result<SvdOutput, OutputError> {
        let (m, n, k) = (layout.m, layout.n, layout.k);
        let open = |name: &str, shape: [u64; 2], chunk: [u64; 2], dims: usize| {
            let array =
                Array::open(store.clone(), &format!("/{name}")).map_err(|e| OutputError::Zarr {
                    path: tmp.to_path_buf(),
                    array: name.to_string(),
                    chunk: String::new(),
                    source: e.into(),
                })?;
            let mismatch = |message: String| OutputError::Mismatch {
                path: tmp.to_path_buf(),
                array: name.to_string(),
                message,
            };
            if array.shape() != &shape[..dims] {
                return Err(mismatch(format!(
                    "shape {:?} on disk, expected {:?} (different layouts on different ranks?)",
                    array.shape(),
                    &shape[..dims]
                )));
            }
            let found: Vec<u64> = array
                .chunk_shape(&vec![0; dims])
                .map_err(|e| mismatch(e.to_string()))?
                .iter()
                .map(|c| c.get())
                .collect();
            if found != chunk[..dims] {
                return Err(mismatch(format!(
                    "chunk shape {found:?} on disk, expected {:?}",
                    &chunk[..dims]
                )));
            }
            if array.data_type().fixed_size() != Some(8) {
                return Err(mismatch("data type is not float64".to_string()));
            }
            Ok(array)
        };
        let s = open("S", [k, 0], [k, 0], 1)?;
        let u = open("U", [m, k], [layout.u_chunk_rows_stored(), k], 2)?;
        let vt = open("Vt", [k, n], [k, layout.vt_chunk_cols_stored()], 2)?;
        let row_vectors = layout
            .row_vectors
            .iter()
            .map(|name| {
                Ok((
                    name.clone(),
                    open(name, [m, 0], [layout.u_chunk_rows_stored(), 0], 1)?,
                ))
            })
            .collect::<Result<Vec<_>, OutputError>>()?;
        let row_matrices = layout
            .row_matrices
            .iter()
            .map(|name| {
                Ok((
                    name.clone(),
                    open(name, [m, k], [layout.u_chunk_rows_stored(), k], 2)?,
                ))
            })
            .collect::<Result<Vec<_>, OutputError>>()?;
        Ok(SvdOutput {
            out: out.to_path_buf(),
            tmp: tmp.to_path_buf(),
            layout,
            store,
            u,
            s,
            vt,
            row_vectors,
            row_matrices,
            committed: AtomicBool::new(false),
            c_order: Arc::new(std::sync::Mutex::new(Vec::new())),
        })
    }

    /// The final path (`--out`).
    pub fn out_path(&self) -> &Path {
        &self.out
    }

    /// The temporary directory being written.
    pub fn temp_dir(&self) -> &Path {
        &self.tmp
    }

    /// The layout the group was created or opened with.
    pub fn layout(&self) -> &OutputLayout {
        &self.layout
    }

    /// Writes rows `[row0, row0 + block.nrows())` of U. `block` has k columns and
    /// any memory layout (C or Fortran order, strided). `row0` must be a multiple
    /// of the U chunk height and the block must end on a chunk boundary or at
    /// row m, so that every chunk is written whole by exactly one caller. May be
    /// called concurrently from several threads and ranks for disjoint blocks.
    pub fn write_u_rows(&self, row0: u64, block: ArrayView2<'_, f64>) -> Result<(), OutputError> {
        self.write_rows(&self.u, "U", row0, block)
    }

    /// Writes rows `[row0, row0 + block.nrows())` of the layout's row matrix `name` (k
    /// columns), with the alignment [`SvdOutput::write_u_rows`] asks for. Callable
    /// concurrently for disjoint blocks.
    pub fn write_row_matrix(
        &self,
        name: &str,
        row0: u64,
        block: ArrayView2<'_, f64>,
    ) -> Result<(), OutputError> {
        let Some((_, array)) = self.row_matrices.iter().find(|(n, _)| n == name) else {
            return Err(self.block_err(name, "is not a row matrix of this layout".to_string()));
        };
        self.write_rows(array, name, row0, block)
    }

    /// Writes rows of an m × k array chunked as U.
    fn write_rows(
        &self,
        array: &Array<FilesystemStore>,
        name: &str,
        row0: u64,
        block: ArrayView2<'_, f64>,
    ) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        let chunk = self.layout.u_chunk_rows_stored();
        let (rows, cols) = (block.nrows() as u64, block.ncols() as u64);
        if cols != self.layout.k {
            return Err(self.block_err(
                name,
                format!(
                    "block at row {row0} has {cols} columns, expected k = {}",
                    self.layout.k
                ),
            ));
        }
        self.check_aligned(name, "row", row0, rows, chunk, self.layout.m)?;
        let mut r = 0u64;
        while r < rows {
            let global = row0 + r;
            let ci = global / chunk;
            let h = chunk.min(rows - r);
            let sub = block.slice(s![r as usize..(r + h) as usize, ..]);
            // A whole chunk (a ragged last one is a partial update) on a little-endian host:
            // its C-order values are its encoding, written without a copy by zarrs.
            let whole = h == chunk && cfg!(target_endian = "little");
            let stored = match sub.as_slice() {
                Some(values) => array.store_chunk_subset(&[ci, 0], &[0..h, 0..cols], values),
                None if whole => {
                    let mut values = self
                        .c_order
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .pop()
                        .unwrap_or_default();
                    c_order_copy(sub, &mut values);
                    let lent = LentChunk {
                        values,
                        pool: Arc::clone(&self.c_order),
                    };
                    // SAFETY: every array of an output is uncompressed little-endian f64
                    // in C order (`new_array`: v3's default `bytes` codec, or v2 with no
                    // compressor and no filters, "<f8"), so a whole chunk's encoding is its
                    // values' bytes in C order, which `lent` holds (h × k values, the
                    // chunk's shape) on this little-endian host.
                    unsafe {
                        array.store_encoded_chunk(&[ci, 0], zarrs::storage::Bytes::from_owner(lent))
                    }
                }
                None => {
                    let pool = || self.c_order.lock().unwrap_or_else(|e| e.into_inner());
                    let mut buf = pool().pop().unwrap_or_default();
                    c_order_copy(sub, &mut buf);
                    let stored = array.store_chunk_subset(&[ci, 0], &[0..h, 0..cols], &buf[..]);
                    pool().push(buf);
                    stored
                }
            };
            stored.map_err(|e| self.zarr_err(name, Some([ci, 0]), e.into()))?;
            r += h;
        }
        Ok(())
    }

    /// Writes all of U (m × k, any memory layout).
    pub fn write_u(&self, u: ArrayView2<'_, f64>) -> Result<(), OutputError> {
        if u.nrows() as u64 != self.layout.m {
            return Err(self.block_err(
                "U",
                format!("has {} rows, expected m = {}", u.nrows(), self.layout.m),
            ));
        }
        self.write_u_rows(0, u)
    }

    /// Writes columns `[col0, col0 + block.ncols())` of Vt (k rows, any memory
    /// layout). `col0` must be a multiple of the Vt chunk width and the block must
    /// end on a chunk boundary or at column n. Callable concurrently for disjoint
    /// blocks.
    pub fn write_vt_cols(&self, col0: u64, block: ArrayView2<'_, f64>) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        let chunk = self.layout.vt_chunk_cols_stored();
        let (rows, cols) = (block.nrows() as u64, block.ncols() as u64);
        if rows != self.layout.k {
            return Err(self.block_err(
                "Vt",
                format!(
                    "block at column {col0} has {rows} rows, expected k = {}",
                    self.layout.k
                ),
            ));
        }
        self.check_aligned("Vt", "column", col0, cols, chunk, self.layout.n)?;
        let mut c = 0u64;
        while c < cols {
            let global = col0 + c;
            let cj = global / chunk;
            let w = chunk.min(cols - c);
            let sub = block.slice(s![.., c as usize..(c + w) as usize]);
            let data = sub.as_standard_layout();
            let values = to_c_vec(&data);
            self.vt
                .store_chunk_subset(&[0, cj], &[0..rows, 0..w], &values[..])
                .map_err(|e| self.zarr_err("Vt", Some([0, cj]), e.into()))?;
            c += w;
        }
        Ok(())
    }

    /// Writes all of Vt (k × n, any memory layout).
    pub fn write_vt(&self, vt: ArrayView2<'_, f64>) -> Result<(), OutputError> {
        if vt.ncols() as u64 != self.layout.n {
            return Err(self.block_err(
                "Vt",
                format!("has {} columns, expected n = {}", vt.ncols(), self.layout.n),
            ));
        }
        self.write_vt_cols(0, vt)
    }

    /// Writes rows `[row0, row0 + values.len())` of the layout's row vector `name`, with
    /// the alignment [`SvdOutput::write_u_rows`] asks for. Callable concurrently for
    /// disjoint blocks.
    pub fn write_row_vector(
        &self,
        name: &str,
        row0: u64,
        values: &[f64],
    ) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        let Some((_, array)) = self.row_vectors.iter().find(|(n, _)| n == name) else {
            return Err(self.block_err(name, "is not a row vector of this layout".to_string()));
        };
        let chunk = self.layout.u_chunk_rows_stored();
        let rows = values.len() as u64;
        self.check_aligned(name, "row", row0, rows, chunk, self.layout.m)?;
        let mut r = 0u64;
        while r < rows {
            let ci = (row0 + r) / chunk;
            let h = chunk.min(rows - r);
            array
                .store_chunk_subset(&[ci], &first(h), &values[r as usize..(r + h) as usize])
                .map_err(|e| self.zarr_err(name, Some([ci, 0]), e.into()))?;
            r += h;
        }
        Ok(())
    }

    /// Writes the k singular values.
    pub fn write_s(&self, s: &[f64]) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        if s.len() as u64 != self.layout.k {
            return Err(self.block_err(
                "S",
                format!("has {} values, expected k = {}", s.len(), self.layout.k),
            ));
        }
        self.s
            .store_chunk(&[0], s)
            .map_err(|e| self.zarr_err("S", None, e.into()))
    }

    /// Adds a small 1-D f64 array `name` (e.g. "explained_variance") to the group
    /// and writes `values` into it (one chunk). Call on one rank only. `name`
    /// must be ASCII letters, digits, `_`, `-` or `.`, not start with `.` and not
    /// be U, S or Vt.
    pub fn write_vector(&self, name: &str, values: &[f64]) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        check_name(name).map_err(|message| self.block_err(name, message))?;
        let len = values.len() as u64;
        let array = new_array(
            &self.store,
            self.layout.format,
            name,
            vec![len],
            vec![len.max(1)],
            Element::F64,
            &[self.layout.dims.components],
        )
        .map_err(|e| self.zarr_err(name, None, e))?;
        if len > 0 {
            array
                .store_chunk(&[0], values)
                .map_err(|e| self.zarr_err(name, Some([0, 0]), e.into()))?;
        }
        Ok(())
    }

    /// Creates the 1-D array `name` of `len` values along `dim`, in chunks of `chunk`.
    fn new_1d(
        &self,
        name: &str,
        dim: &str,
        len: usize,
        chunk: u64,
        element: Element,
    ) -> Result<Array<FilesystemStore>, OutputError> {
        check_name(name).map_err(|message| self.block_err(name, message))?;
        new_array(
            &self.store,
            self.layout.format,
            name,
            vec![len as u64],
            vec![chunk],
            element,
            &[dim],
        )
        .map_err(|e| self.zarr_err(name, None, e))
    }

    /// Adds a 1-D array of UTF-8 strings `name` along dimension `dim` (Zarr v3 `string`,
    /// empty fill; in Zarr v2 object strings with the `vlen-utf8` filter) and writes
    /// `values` in chunks of `chunk`. Call on one rank only.
    pub fn write_strings(
        &self,
        name: &str,
        dim: &str,
        values: &[String],
        chunk: u64,
    ) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        let chunk = chunk.clamp(1, values.len().max(1) as u64);
        let array = self.new_1d(name, dim, values.len(), chunk, Element::Str)?;
        for (i, part) in values.chunks(chunk as usize).enumerate() {
            let part: Vec<&str> = part.iter().map(String::as_str).collect();
            array
                .store_chunk_subset(&[i as u64], &first(part.len() as u64), &part[..])
                .map_err(|e| self.zarr_err(name, Some([i as u64, 0]), e.into()))?;
        }
        Ok(())
    }

    /// Adds a 1-D array of i64 `name` along dimension `dim` and writes `values` in chunks
    /// of `chunk`. Call on one rank only.
    pub fn write_integers(
        &self,
        name: &str,
        dim: &str,
        values: &[i64],
        chunk: u64,
    ) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        let chunk = chunk.clamp(1, values.len().max(1) as u64);
        let array = self.new_1d(name, dim, values.len(), chunk, Element::I64)?;
        for (i, part) in values.chunks(chunk as usize).enumerate() {
            array
                .store_chunk_subset(&[i as u64], &first(part.len() as u64), part)
                .map_err(|e| self.zarr_err(name, Some([i as u64, 0]), e.into()))?;
        }
        Ok(())
    }

    /// Adds a small 2-D f64 array `name` with dimensions `dims` and writes `a` into it (one
    /// chunk). Call on one rank only.
    pub fn write_matrix(
        &self,
        name: &str,
        dims: [&str; 2],
        a: ArrayView2<'_, f64>,
    ) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        check_name(name).map_err(|message| self.block_err(name, message))?;
        let (r, c) = (a.nrows() as u64, a.ncols() as u64);
        let array = new_array(
            &self.store,
            self.layout.format,
            name,
            vec![r, c],
            vec![r.max(1), c.max(1)],
            Element::F64,
            &dims,
        )
        .map_err(|e| self.zarr_err(name, None, e))?;
        if r > 0 && c > 0 {
            let data = a.as_standard_layout();
            array
                .store_chunk(&[0, 0], &to_c_vec(&data)[..])
                .map_err(|e| self.zarr_err(name, Some([0, 0]), e.into()))?;
        }
        Ok(())
    }

    /// Adds (or replaces) group attributes, e.g. results known only at the end of
    /// the run. Call on one rank only.
    pub fn update_attributes(
        &self,
        attributes: serde_json::Map<String, serde_json::Value>,
    ) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        let mut group = Group::open(self.store.clone(), "/")
            .map_err(|e| self.zarr_err("(group)", None, e.into()))?;
        group.attributes_mut().extend(attributes);
        group
            .store_metadata()
            .map_err(|e| self.zarr_err("(group)", None, e.into()))
    }

    /// Stores the run report as the group attribute `report` (in its `zarr.json`, or in v2
    /// its `.zattrs`), where zarr-python and xarray read it as metadata: a plain file inside
    /// the group is a node they warn about. Call on one rank only.
    pub fn write_report(&self, json: &impl serde::Serialize) -> Result<(), OutputError> {
        let value = serde_json::to_value(json).map_err(|source| OutputError::Json {
            path: self.tmp.join(match self.layout.format {
                ZarrFormat::V3 => "zarr.json",
                ZarrFormat::V2 => ".zattrs",
            }),
            source,
        })?;
        self.update_attributes(serde_json::Map::from_iter([(
            REPORT_ATTRIBUTE.to_string(),
            value,
        )]))
    }

    /// Writes the group's consolidated metadata, so that xarray and zarr-python open the
    /// group in one read and without a warning. The last write before
    /// [`SvdOutput::commit`].
    ///
    /// In Zarr v3 every array's `zarr.json` goes inline in the root's, as zarr-python's
    /// `consolidate_metadata` writes it. The arrays' own files are copied, not zarrs'
    /// `consolidate_metadata`, which writes a codec without configuration as a bare name
    /// (`"vlen-utf8"`) that zarr-python 3.1 refuses. In Zarr v2 (which zarrs does not
    /// consolidate) the group's and arrays' documents go into `.zmetadata` under their keys,
    /// `zarr_consolidated_format` 1, as zarr-python 2 writes it.
    fn consolidate(&self) -> Result<(), OutputError> {
        let _writing = self.ensure_open()?;
        let io = |path: &Path, op: &'static str| {
            let path = path.to_path_buf();
            move |source| OutputError::Io { path, op, source }
        };
        let json = |path: &Path| -> Result<serde_json::Value, OutputError> {
            let bytes = fs::read(path).map_err(io(path, "reading"))?;
            serde_json::from_slice(&bytes).map_err(|source| OutputError::Json {
                path: path.to_path_buf(),
                source,
            })
        };
        let (root_path, array_file) = match self.layout.format {
            ZarrFormat::V3 => (self.tmp.join("zarr.json"), "zarr.json"),
            ZarrFormat::V2 => (self.tmp.join(".zmetadata"), ".zarray"),
        };
        let mut entries: Vec<_> = fs::read_dir(&self.tmp)
            .map_err(io(&self.tmp, "listing"))?
            .flatten()
            .filter(|e| e.path().join(array_file).is_file())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        let mut metadata = serde_json::Map::new();
        let root = match self.layout.format {
            ZarrFormat::V3 => {
                for e in entries {
                    let name = e.file_name().to_string_lossy().into_owned();
                    metadata.insert(name, json(&e.path().join("zarr.json"))?);
                }
                let mut root = json(&root_path)?;
                root["consolidated_metadata"] = serde_json::json!({
                    "kind": "inline",
                    "must_understand": false,
                    "metadata": metadata,
                });
                root
            }
            ZarrFormat::V2 => {
                let mut documents = vec![(".zgroup".to_string(), self.tmp.join(".zgroup"))];
                documents.push((".zattrs".to_string(), self.tmp.join(".zattrs")));
                for e in entries {
                    let name = e.file_name().to_string_lossy().into_owned();
                    for file in [".zarray", ".zattrs"] {
                        documents.push((format!("{name}/{file}"), e.path().join(file)));
                    }
                }
                for (key, path) in documents {
                    if path.is_file() {
                        metadata.insert(key, json(&path)?);
                    }
                }
                serde_json::json!({ "metadata": metadata, "zarr_consolidated_format": 1 })
            }
        };
        let text = serde_json::to_vec_pretty(&root).map_err(|source| OutputError::Json {
            path: root_path.clone(),
            source,
        })?;
        let mut tmp = root_path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        fs::write(&tmp, text).map_err(io(&tmp, "writing"))?;
        fs::rename(&tmp, &root_path).map_err(io(&root_path, "renaming"))
    }

    /// Renames the temporary directory to `out` atomically (call on one rank, after
    /// a barrier that follows every rank's last write). Takes `&self` so that an
    /// output shared through an `Arc` can be committed; every write after a
    /// successful commit fails with [`OutputError::Committed`]. Fails, leaving
    /// the temporary directory in place, if `out` has appeared meanwhile.
    pub fn commit(&self) -> Result<PathBuf, OutputError> {
        self.consolidate()?;
        commit_once(&self.committed, &self.tmp, &self.out)
    }

    /// Fails with [`OutputError::Committed`] once the output was committed, and with
    /// [`OutputError::TempMissing`] once another rank abandoned it: a write must never
    /// recreate a temporary directory that an error path already removed.
    ///
    /// Hold the guard it returns for the write: a signal waits for it, so the rank's own
    /// writes cannot recreate the directory its handler removes.
    fn ensure_open(&self) -> Result<crate::temporaries::Writing, OutputError> {
        let writing = crate::temporaries::writing();
        check_open(&self.committed, &self.tmp, &self.out)?;
        Ok(writing)
    }

    /// Removes a temporary output directory (error paths). A missing directory is
    /// not an error. Refuses paths whose name does not contain `.tmp-`, so that a
    /// wrong argument cannot delete real data.
    pub fn abandon(tmp: &Path) -> Result<(), OutputError> {
        let is_tmp = tmp
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains(".tmp-"));
        if !is_tmp {
            return Err(OutputError::Io {
                path: tmp.to_path_buf(),
                op: "refusing to remove a directory that is not a temporary output (*.tmp-*)",
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        match fs::remove_dir_all(tmp) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(OutputError::Io {
                path: tmp.to_path_buf(),
                op: "removing the temporary output directory",
                source: e,
            }),
        }
    }

    /// Checks that `[start, start + len)` is a whole-chunk-aligned range of `extent`.
    fn check_aligned(
        &self,
        array: &str,
        what: &str,
        start: u64,
        len: u64,
        chunk: u64,
        extent: u64,
    ) -> Result<(), OutputError> {
        let end = start.saturating_add(len);
        if end > extent {
            return Err(self.block_err(
                array,
                format!(
                    "block of {what}s [{start}, {end}) exceeds the {extent} {what}s of the array"
                ),
            ));
        }
        if !start.is_multiple_of(chunk) {
            return Err(self.block_err(
                array,
                format!(
                    "block starts at {what} {start}, which is not a multiple of the chunk size {chunk}"
                ),
            ));
        }
        if !end.is_multiple_of(chunk) && end != extent {
            return Err(self.block_err(
                array,
                format!(
                    "block of {what}s [{start}, {end}) ends inside chunk {} (chunk size {chunk}); blocks must cover whole chunks",
                    end / chunk
                ),
            ));
        }
        Ok(())
    }

    /// A [`OutputError::Block`] for `array`.
    fn block_err(&self, array: &str, message: String) -> OutputError {
        OutputError::Block {
            path: self.tmp.clone(),
            array: array.to_string(),
            message,
        }
    }

    /// A [`OutputError::Zarr`] for `array` (and chunk).
    fn zarr_err(&self, array: &str, chunk: Option<[u64; 2]>, source: ZarrsError) -> OutputError {
        let chunk = match (array, chunk) {
            (_, None) => String::new(),
            ("U" | "Vt", Some(c)) => format!(", chunk [{}, {}]", c[0], c[1]),
            (_, Some(c)) => format!(", chunk [{}]", c[0]),
        };
        OutputError::Zarr {
            path: self.tmp.clone(),
            array: array.to_string(),
            chunk,
            source,
        }
    }
}

/// Elements of a standard-layout (C order) array as a slice, copying only if the
/// array is not contiguous.
/// `block`'s values in C order into `out` (its length set to theirs). A column-major block
/// (every U block of a pass) is copied by runs of 64 rows, each column's run read
/// contiguously into a destination that stays in L1: ndarray's iterator in logical order
/// took 13.5 % of the CPU samples of `svd --out` of 10,000,000 × 20 on the 2-core Zen 3
/// guest (perf), this copy 9.9 %.
fn c_order_copy(block: ArrayView2<'_, f64>, out: &mut Vec<f64>) {
    let (h, k) = block.dim();
    if out.len() != h * k {
        // Pooled buffers of whole chunks keep their length: no zeroing chunk after chunk.
        out.clear();
        out.resize(h * k, 0.0);
    }
    if h == 0 || k == 0 {
        return;
    }
    let columns: Option<Vec<&[f64]>> = (0..k).map(|j| block.column(j).to_slice()).collect();
    let Some(columns) = columns else {
        for (o, &v) in out.iter_mut().zip(block.iter()) {
            *o = v;
        }
        return;
    };
    const RUN: usize = 64;
    for (r, dst) in out.chunks_mut(RUN * k).enumerate() {
        let i0 = r * RUN;
        for (j, col) in columns.iter().enumerate() {
            let run = &col[i0..i0 + dst.len() / k];
            for (i, &v) in run.iter().enumerate() {
                dst[i * k + j] = v;
            }
        }
    }
}

fn to_c_vec<'a>(data: &'a ndarray::CowArray<'_, f64, ndarray::Ix2>) -> std::borrow::Cow<'a, [f64]> {
    match data.as_slice() {
        Some(slice) => std::borrow::Cow::Borrowed(slice),
        None => std::borrow::Cow::Owned(data.iter().copied().collect()),
    }
}

/// Creates the new, empty temporary directory `tmp` an output is written into; fails if
/// it exists (a leftover of an earlier attempt must not be mixed into this one).
pub(crate) fn create_temp_dir(tmp: &Path) -> Result<(), OutputError> {
    match fs::create_dir(tmp) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(OutputError::TempExists {
            path: tmp.to_path_buf(),
        }),
        Err(e) => Err(OutputError::Io {
            path: tmp.to_path_buf(),
            op: "creating the temporary output directory",
            source: e,
        }),
    }
}

/// Makes the finished temporary directory `tmp` durable and renames it to `out`, once:
/// `committed` records it, and a second commit fails with [`OutputError::Committed`]. Fails,
/// leaving `tmp` in place, if `out` exists.
pub(crate) fn commit_once(
    committed: &AtomicBool,
    tmp: &Path,
    out: &Path,
) -> Result<PathBuf, OutputError> {
    if committed.swap(true, Ordering::SeqCst) {
        return Err(OutputError::Committed {
            path: out.to_path_buf(),
        });
    }
    sync_dir(tmp);
    if let Err(e) = rename_no_replace(tmp, out) {
        committed.store(false, Ordering::SeqCst);
        return Err(e);
    }
    sync_dir(&parent_dir(out));
    Ok(out.to_path_buf())
}

/// Fails with [`OutputError::Committed`] once the output was committed, and with
/// [`OutputError::TempMissing`] once `tmp` is gone (another rank abandoned it): a write must
/// never recreate a temporary directory that an error path already removed.
pub(crate) fn check_open(
    committed: &AtomicBool,
    tmp: &Path,
    out: &Path,
) -> Result<(), OutputError> {
    if committed.load(Ordering::SeqCst) {
        Err(OutputError::Committed {
            path: out.to_path_buf(),
        })
    } else if !tmp.is_dir() {
        Err(OutputError::TempMissing {
            path: tmp.to_path_buf(),
        })
    } else {
        Ok(())
    }
}

/// A zarrs file system store rooted at `dir`.
pub(crate) fn new_store(dir: &Path) -> Result<Arc<FilesystemStore>, OutputError> {
    FilesystemStore::new(dir)
        .map(Arc::new)
        .map_err(|e| OutputError::Zarr {
            path: dir.to_path_buf(),
            array: "(store)".to_string(),
            chunk: String::new(),
            source: e.into(),
        })
}

/// The directory containing `path` ("." for a bare name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether the current user may create entries in `dir`.
#[cfg(unix)]
fn check_writable(dir: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| "path contains a NUL byte".to_string())?;
    // SAFETY: c is a valid NUL-terminated string.
    let rc = unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

/// Whether the current user may create entries in `dir` (read-only flag only).
#[cfg(not(unix))]
fn check_writable(dir: &Path) -> Result<(), String> {
    match fs::metadata(dir) {
        Ok(md) if md.permissions().readonly() => Err("read-only".to_string()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// Best-effort fsync of a directory (makes renames and new entries durable).
fn sync_dir(dir: &Path) {
    if let Ok(f) = fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Renames `from` to `to`, failing if `to` exists (atomically with
/// `renameat2(RENAME_NOREPLACE)` where the file system supports it).
fn rename_no_replace(from: &Path, to: &Path) -> Result<(), OutputError> {
    let exists = || OutputError::Exists {
        path: to.to_path_buf(),
    };
    let rename_err = |source| OutputError::Io {
        path: to.to_path_buf(),
        op: "renaming the temporary output directory to `out`",
        source,
    };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::ffi::OsStrExt as _;
        if let (Ok(a), Ok(b)) = (
            std::ffi::CString::new(from.as_os_str().as_bytes()),
            std::ffi::CString::new(to.as_os_str().as_bytes()),
        ) {
            // SAFETY: valid NUL-terminated paths; AT_FDCWD resolves them like rename(2).
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    libc::RENAME_NOREPLACE,
                )
            };
            if rc == 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EEXIST) => return Err(exists()),
                // Not supported by this kernel or file system (e.g. NFS): fall back.
                Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP) => {}
                _ => return Err(rename_err(e)),
            }
        }
    }
    // rename(2) would silently replace an empty directory: check first.
    if fs::symlink_metadata(to).is_ok() {
        return Err(exists());
    }
    fs::rename(from, to).map_err(rename_err)
}

/// Opens array `name` of the group at `group`, for reading; the error it gives for a
/// later read names the group and the array too.
fn open_for_reading(
    group: &Path,
    name: &str,
) -> Result<(Array<FilesystemStore>, impl Fn(ZarrsError) -> OutputError), OutputError> {
    let store = Arc::new(FilesystemStore::new(group).map_err(|e| OutputError::Io {
        path: group.to_path_buf(),
        op: "opening",
        source: std::io::Error::other(e.to_string()),
    })?);
    let (path, array) = (group.to_path_buf(), name.to_string());
    let zerr = move |e: ZarrsError| OutputError::Zarr {
        path: path.clone(),
        array: array.clone(),
        chunk: String::new(),
        source: e,
    };
    let a = Array::open(store, &format!("/{name}")).map_err(|e| zerr(Box::new(e)))?;
    Ok((a, zerr))
}

/// Reads rows `rows` of an f64 array of a rankwise output group (1-D or 2-D, all its
/// columns): the values in C (row-major) order. Where the group is large, callers read it a
/// chunk of rows at a time.
pub fn read_f64_rows(
    group: &Path,
    name: &str,
    rows: std::ops::Range<u64>,
) -> Result<Vec<f64>, OutputError> {
    let (a, zerr) = open_for_reading(group, name)?;
    let mut ranges = vec![rows];
    ranges.extend(a.shape().iter().skip(1).map(|&d| 0..d));
    let subset = zarrs::array::ArraySubset::new_with_ranges(&ranges);
    a.retrieve_array_subset(&subset)
        .map_err(|e| zerr(Box::new(e)))
}

/// Reads a whole f64 array of a rankwise output group: its shape and its values in C
/// (row-major) order. For tests and tools that check results.
pub fn read_f64_array(group: &Path, name: &str) -> Result<(Vec<u64>, Vec<f64>), OutputError> {
    let (a, zerr) = open_for_reading(group, name)?;
    let v: Vec<f64> = a
        .retrieve_array_subset(&a.subset_all())
        .map_err(|e| zerr(Box::new(e)))?;
    Ok((a.shape().to_vec(), v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, Array2, ShapeBuilder};

    /// A fresh scratch directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static N: AtomicUsize = AtomicUsize::new(0);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let dir = std::env::temp_dir().join(format!(
                "rankwise-output-{tag}-{}-{nanos}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&dir).expect("scratch dir");
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn layout(m: u64, n: u64, k: u64, cr: u64, cc: u64) -> OutputLayout {
        let mut attributes = serde_json::Map::new();
        attributes.insert("algorithm".into(), "tsqr".into());
        attributes.insert("seed".into(), 42.into());
        OutputLayout {
            row_vectors: Vec::new(),
            row_matrices: Vec::new(),
            dims: Dims::MATRIX,
            m,
            n,
            k,
            u_chunk_rows: cr,
            vt_chunk_cols: cc,
            attributes,
            format: ZarrFormat::V3,
        }
    }

    /// Values with awkward bit patterns: negative zero, subnormals, irrationals.
    fn value(i: u64, j: u64) -> f64 {
        match (i + 3 * j) % 7 {
            0 => -0.0,
            1 => f64::MIN_POSITIVE / 3.0,
            _ => ((i as f64) * 1.000_000_1 + (j as f64) * std::f64::consts::PI).sin() / 7.0,
        }
    }

    fn read_all(dir: &Path, name: &str) -> (Vec<u64>, Vec<f64>) {
        let store = Arc::new(FilesystemStore::new(dir).expect("store"));
        let a = Array::open(store, &format!("/{name}")).expect("open array");
        let v: Vec<f64> = a.retrieve_array_subset(&a.subset_all()).expect("read");
        (a.shape().to_vec(), v)
    }

    fn assert_bits_eq(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn output_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<SvdOutput>();
    }

    #[test]
    fn row_vectors_and_matrices_sit_beside_u_with_its_chunks_and_dimensions() {
        let scratch = Scratch::new("rowmatrices");
        let out = scratch.0.join("pca.zarr");
        let tmp = SvdOutput::temp_path(&out, "t");
        let (m, n, k, cr) = (57u64, 11u64, 3u64, 20u64);
        let mut l = layout(m, n, k, cr, n);
        l.dims = Dims::GENOTYPES;
        l.row_vectors = vec!["freq".into()];
        l.row_matrices = vec!["loading".into()];
        let o = SvdOutput::create(&out, &tmp, l.clone()).expect("create");
        let second = SvdOutput::open(&out, &tmp, l).expect("a second rank opens it");
        let a = Array2::from_shape_fn((m as usize, k as usize), |(i, j)| value(i as u64, j as u64));
        o.write_row_matrix("loading", 0, a.slice(s![0..40, ..]))
            .expect("first two chunks");
        second
            .write_row_matrix("loading", 40, a.slice(s![40.., ..]))
            .expect("the ragged last chunk");
        let f: Vec<f64> = (0..m).map(|i| i as f64 / 7.0).collect();
        o.write_row_vector("freq", 0, &f).expect("vector");
        // Names outside the layout, misaligned blocks and a wrong width are refused.
        let e = o
            .write_row_matrix("U2", 0, a.view())
            .unwrap_err()
            .to_string();
        assert!(e.contains("U2") && e.contains("not a row matrix"), "{e}");
        let e = o
            .write_row_matrix("loading", 5, a.slice(s![5..20, ..]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("loading") && e.contains("row 5"), "{e}");
        let e = o
            .write_row_matrix("loading", 0, a.slice(s![0..20, 0..2]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected k = 3"), "{e}");
        drop(second);
        o.commit().expect("commit");
        let (shape, read) = read_all(&out, "loading");
        assert_eq!(shape, vec![m, k]);
        assert_bits_eq(&read, a.as_slice().unwrap());
        assert_eq!(
            read_f64_rows(&out, "loading", 40..57).unwrap(),
            a.slice(s![40.., ..]).iter().copied().collect::<Vec<_>>()
        );
        let meta: serde_json::Value =
            serde_json::from_slice(&fs::read(out.join("loading/zarr.json")).unwrap()).unwrap();
        assert_eq!(
            meta["dimension_names"],
            serde_json::json!(["variants", "components"])
        );
        assert_eq!(
            meta["chunk_grid"]["configuration"]["chunk_shape"],
            serde_json::json!([20, 3])
        );
    }

    #[test]
    fn output_round_trip_two_threads() {
        round_trip(ZarrFormat::V3);
    }

    #[test]
    fn output_round_trip_two_threads_zarr_v2() {
        round_trip(ZarrFormat::V2);
    }

    fn round_trip(format: ZarrFormat) {
        let scratch = Scratch::new("roundtrip");
        let out = scratch.0.join("result.zarr");
        let (m, n, k, cr, cc) = (103u64, 29u64, 5u64, 10u64, 8u64);
        let tmp = SvdOutput::temp_path(&out, "job 17/step.0");
        assert_eq!(tmp, scratch.0.join("result.zarr.tmp-job_17_step_0"));
        SvdOutput::check_target(&out).expect("target ok");
        let layout = |m, n, k, cr, cc| OutputLayout {
            format,
            ..layout(m, n, k, cr, cc)
        };
        let writer = SvdOutput::create(&out, &tmp, layout(m, n, k, cr, cc)).expect("create");
        // A second rank opens the same group.
        let other = SvdOutput::open(&out, &tmp, layout(m, n, k, cr, cc)).expect("open");

        // U in Fortran order (as LAPACK returns it), written in blocks of 3, 2, 4
        // and the ragged rest of chunks, from two threads through two handles.
        let u = Array2::from_shape_fn((m as usize, k as usize).f(), |(i, j)| {
            value(i as u64, j as u64)
        });
        let blocks: Vec<(u64, u64)> = vec![(0, 30), (30, 50), (50, 90), (90, 103)];
        std::thread::scope(|sc| {
            for (t, handle) in [&writer, &other].into_iter().enumerate() {
                let u = &u;
                let blocks = &blocks;
                sc.spawn(move || {
                    for &(r0, r1) in blocks.iter().skip(t).step_by(2) {
                        let view = u.slice(s![r0 as usize..r1 as usize, ..]);
                        handle.write_u_rows(r0, view).expect("write U block");
                    }
                });
            }
        });

        let sv: Vec<f64> = (0..k).map(|i| 10.0 / (i as f64 + 1.0)).collect();
        writer.write_s(&sv).expect("write S");
        // Vt: a strided (transposed) view, written as two column blocks.
        let v = Array2::from_shape_fn((n as usize, k as usize), |(i, j)| {
            value(j as u64, i as u64 + 1000)
        });
        let vt = v.t();
        other
            .write_vt_cols(0, vt.slice(s![.., 0..16]))
            .expect("vt block 0");
        other
            .write_vt_cols(16, vt.slice(s![.., 16..]))
            .expect("vt block 1");
        writer
            .write_vector(
                "explained_variance_ratio",
                &[0.5, 0.25, 0.125, 0.0625, 0.03125],
            )
            .expect("vector");
        // Strings (one not ASCII, one empty) and integers in chunks with a ragged last one.
        let names: Vec<String> = (0..n).map(|j| format!("s{j}")).collect();
        let names = [vec!["Ångström".to_string(), String::new()], names].concat();
        writer
            .write_strings("names", "column", &names, 8)
            .expect("strings");
        let ints: Vec<i64> = (0..n as i64).map(|j| j * 1_000_003 - 7).collect();
        writer
            .write_integers("ints", "column", &ints, 8)
            .expect("integers");
        let mut extra = serde_json::Map::new();
        extra.insert("sigma_max".into(), sv[0].into());
        writer.update_attributes(extra).expect("attributes");
        let report = serde_json::json!({"phases": {"tsqr": 1.5}, "ranks": 2});
        writer.write_report(&report).expect("report");
        assert!(!out.exists(), "nothing visible under `out` before commit");

        drop(other);
        let committed = writer.commit().expect("commit");
        assert_eq!(committed, out);
        assert!(!tmp.exists(), "tmp dir gone after commit");
        let e = writer.write_s(&sv).unwrap_err().to_string();
        assert!(e.contains("already committed"), "{e}");
        assert!(writer.commit().is_err(), "second commit");
        assert!(!tmp.exists(), "no write recreated the tmp dir");
        drop(writer);

        let (shape, u_read) = read_all(&out, "U");
        assert_eq!(shape, vec![m, k]);
        let u_c: Vec<f64> = u.as_standard_layout().iter().copied().collect();
        assert_bits_eq(&u_read, &u_c);
        let (shape, s_read) = read_all(&out, "S");
        assert_eq!(shape, vec![k]);
        assert_bits_eq(&s_read, &sv);
        let (shape, vt_read) = read_all(&out, "Vt");
        assert_eq!(shape, vec![k, n]);
        let vt_c: Vec<f64> = vt.as_standard_layout().iter().copied().collect();
        assert_bits_eq(&vt_read, &vt_c);
        let (_, evr) = read_all(&out, "explained_variance_ratio");
        assert_bits_eq(&evr, &[0.5, 0.25, 0.125, 0.0625, 0.03125]);

        let store = Arc::new(FilesystemStore::new(&out).expect("store"));
        let group = Group::open(store, "/").expect("group");
        let attrs = group.attributes();
        assert_eq!(attrs["algorithm"], "tsqr");
        assert_eq!(attrs["seed"], 42);
        assert_eq!(attrs["sigma_max"], 10.0);
        assert_eq!(attrs[REPORT_ATTRIBUTE], report);
        let arrays = ["S", "U", "Vt", "explained_variance_ratio", "ints", "names"];
        let read_json = |file: &str| -> serde_json::Value {
            serde_json::from_slice(&fs::read(out.join(file)).unwrap()).unwrap()
        };
        match format {
            ZarrFormat::V3 => {
                // Every array's metadata inline in the root's: xarray opens it consolidated.
                let root = read_json("zarr.json");
                let inline = &root["consolidated_metadata"]["metadata"];
                for name in arrays {
                    assert_eq!(inline[name]["node_type"], "array", "{name}: {root}");
                }
                assert!(!out.join(".zgroup").exists());
            }
            ZarrFormat::V2 => {
                // zarr-python 2's layout: no v3 document anywhere, every document under its
                // key in `.zmetadata`, and the dimension names where xarray reads them in v2.
                assert!(!out.join("zarr.json").exists());
                let consolidated = read_json(".zmetadata");
                assert_eq!(consolidated["zarr_consolidated_format"], 1);
                let documents = &consolidated["metadata"];
                assert_eq!(documents[".zgroup"]["zarr_format"], 2);
                assert_eq!(documents[".zattrs"][REPORT_ATTRIBUTE], report);
                for name in arrays {
                    assert_eq!(
                        documents[format!("{name}/.zarray")],
                        read_json(&format!("{name}/.zarray"))
                    );
                    assert!(!out.join(name).join("zarr.json").exists());
                }
                assert_eq!(
                    documents["U/.zattrs"]["_ARRAY_DIMENSIONS"],
                    serde_json::json!(["row", "component"])
                );
                assert_eq!(documents["names/.zarray"]["dtype"], "|O");
                assert!(out.join("U/0.0").is_file(), "v2 chunk keys");
            }
        }

        // zarr-python must read the same values.
        #[cfg(feature = "system-tests")]
        python_check(&out, &u_c, &sv, &vt_c, m, n, k, &names, &ints);
        #[cfg(not(feature = "system-tests"))]
        let _ = (names, ints);
    }

    /// The Python of the pinned zarr-python virtualenv the integration tests use
    /// (`scripts/zarr-venv.sh`, under the target directory), made on first use; the test
    /// fails with the script's reason where it cannot be made.
    #[cfg(feature = "system-tests")]
    fn zarr_python() -> PathBuf {
        let exe = std::env::current_exe().expect("test executable");
        // target/<profile>/deps/<this test binary>
        let target = exe.ancestors().nth(3).expect("target directory");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("repository");
        let venv = target.join("zarr-venv");
        let out = std::process::Command::new("bash")
            .arg(repo.join("scripts/zarr-venv.sh"))
            .arg(&venv)
            .output()
            .expect("running bash");
        assert!(
            out.status.success(),
            "scripts/zarr-venv.sh {} failed ({}), so zarr-python cannot check the group:\n{}",
            venv.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        venv.join("bin/python")
    }

    /// Reads the committed group with the pinned zarr-python.
    #[cfg(feature = "system-tests")]
    #[allow(clippy::too_many_arguments)]
    fn python_check(
        out: &Path,
        u: &[f64],
        s: &[f64],
        vt: &[f64],
        m: u64,
        n: u64,
        k: u64,
        names: &[String],
        ints: &[i64],
    ) {
        let python = zarr_python();
        let dump = |name: &str, v: &[f64]| {
            let p = out.with_extension(format!("{name}.bin"));
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            fs::write(&p, bytes).expect("write expected values");
            p
        };
        let (pu, ps, pvt) = (dump("u", u), dump("s", s), dump("vt", vt));
        let expected = serde_json::json!({ "names": names, "ints": ints }).to_string();
        let script = format!(
            r#"
import sys, json, numpy as np, zarr
g = zarr.open_group(sys.argv[1], mode="r")
assert g.attrs["algorithm"] == "tsqr", dict(g.attrs)
for name, path, shape in [("U", sys.argv[2], ({m}, {k})), ("S", sys.argv[3], ({k},)), ("Vt", sys.argv[4], ({k}, {n}))]:
    a = g[name][...]
    want = np.fromfile(path, dtype="<f8").reshape(shape)
    assert a.shape == shape, (name, a.shape)
    assert a.dtype == np.float64, (name, a.dtype)
    assert np.array_equal(a.view(np.uint64), want.view(np.uint64)), name
assert sorted(g.array_keys()) == ["S", "U", "Vt", "explained_variance_ratio", "ints", "names"], sorted(g.array_keys())
want = json.loads(sys.argv[5])
assert [str(x) for x in g["names"][...]] == want["names"], g["names"][...]
assert g["ints"].dtype == np.int64 and g["ints"][...].tolist() == want["ints"]
print("zarr-python", zarr.__version__, "read the group (zarr_format", g.metadata.zarr_format, ") bit for bit")
"#
        );
        let o = std::process::Command::new(&python)
            .arg("-c")
            .arg(script)
            .arg(out)
            .args([&pu, &ps, &pvt])
            .arg(expected)
            .output()
            .expect("run python");
        println!("{}", String::from_utf8_lossy(&o.stdout));
        assert!(
            o.status.success(),
            "zarr-python check failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    #[test]
    fn output_rejects_misaligned_and_misshapen_blocks() {
        let scratch = Scratch::new("misaligned");
        let out = scratch.0.join("r.zarr");
        let tmp = SvdOutput::temp_path(&out, "t");
        let w = SvdOutput::create(&out, &tmp, layout(25, 12, 3, 10, 5)).expect("create");
        let u = Array2::<f64>::zeros((10, 3));
        let e = w.write_u_rows(5, u.view()).unwrap_err().to_string();
        assert!(
            e.contains("array U") && e.contains("multiple of the chunk size 10"),
            "{e}"
        );
        assert!(e.contains(&tmp.display().to_string()), "{e}");
        let e = w
            .write_u_rows(0, u.slice(s![0..7, ..]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ends inside chunk 0"), "{e}");
        let e = w.write_u_rows(20, u.view()).unwrap_err().to_string();
        assert!(e.contains("exceeds the 25 rows"), "{e}");
        let e = w
            .write_u_rows(0, Array2::<f64>::zeros((10, 4)).view())
            .unwrap_err()
            .to_string();
        assert!(e.contains("4 columns, expected k = 3"), "{e}");
        // The ragged last chunk is fine on its own.
        w.write_u_rows(20, u.slice(s![0..5, ..]))
            .expect("ragged last chunk");
        let e = w
            .write_vt_cols(3, Array2::<f64>::zeros((3, 5)).view())
            .unwrap_err()
            .to_string();
        assert!(e.contains("array Vt") && e.contains("column 3"), "{e}");
        let e = w.write_s(&[1.0]).unwrap_err().to_string();
        assert!(e.contains("array S") && e.contains("expected k = 3"), "{e}");
        assert!(w.write_vector("U", &[1.0]).is_err());
        assert!(w.write_vector("../evil", &[1.0]).is_err());
        // Empty blocks are a no-op.
        w.write_u_rows(10, u.slice(s![0..0, ..]))
            .expect("empty block");
        drop(w);
        // A rank with a different layout is caught when opening.
        let e = SvdOutput::open(&out, &tmp, layout(26, 12, 3, 10, 5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("array U") && e.contains("shape"), "{e}");
        SvdOutput::abandon(&tmp).expect("abandon");
        assert!(!tmp.exists(), "tmp dir gone after abandon");
        SvdOutput::abandon(&tmp).expect("abandon twice is fine");
        assert!(!out.exists());
    }

    #[test]
    fn output_check_target_errors() {
        let scratch = Scratch::new("target");
        // Exists already.
        let e = SvdOutput::check_target(&scratch.0).unwrap_err().to_string();
        assert!(e.contains("`out`") && e.contains("must not exist"), "{e}");
        assert!(e.contains(&scratch.0.display().to_string()), "{e}");
        // Missing parent.
        let bad = scratch.0.join("no/such/dir/result.zarr");
        let e = SvdOutput::check_target(&bad).unwrap_err().to_string();
        assert!(e.contains("`out`") && e.contains("does not exist"), "{e}");
        assert!(e.contains(&bad.display().to_string()), "{e}");
        // Parent is a file.
        let file = scratch.0.join("file");
        fs::write(&file, b"x").expect("file");
        let e = SvdOutput::check_target(&file.join("r.zarr"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a directory"), "{e}");
        // No final component.
        assert!(SvdOutput::check_target(Path::new("/")).is_err());
        // Fine.
        SvdOutput::check_target(&scratch.0.join("new.zarr")).expect("ok");
        SvdOutput::check_target(Path::new("rankwise-surely-not-here.zarr")).expect("bare name");
    }

    /// Makes the calling thread, and only it, an unprivileged user (`nobody`): the kernel
    /// keeps credentials per thread, and the raw system calls (unlike libc's wrappers,
    /// which change every thread of the process) change only the caller's.
    fn become_nobody_on_this_thread() -> Result<(), String> {
        const NOBODY: libc::c_long = 65534;
        for (name, call) in [
            ("setresgid", libc::SYS_setresgid),
            ("setresuid", libc::SYS_setresuid),
        ] {
            // SAFETY: plain system calls on integer arguments.
            if unsafe { libc::syscall(call, NOBODY, NOBODY, NOBODY) } != 0 {
                return Err(format!("{name}: {}", std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    /// A parent directory without write permission is refused, naming it. Root may write
    /// anywhere, and `make test` runs as root in containers: there the check runs on a
    /// thread that has become `nobody` (the directories on the way are world-searchable).
    #[test]
    fn output_check_target_unwritable_parent() {
        use std::os::unix::fs::PermissionsExt as _;
        let scratch = Scratch::new("ro");
        let ro = scratch.0.join("ro");
        fs::create_dir(&ro).expect("dir");
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).expect("chmod");
        let target = ro.join("r.zarr");
        let checked = std::thread::spawn(move || {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                become_nobody_on_this_thread().map_err(|e| {
                    format!(
                        "running as root, and this thread could not become nobody to check \
                         an unwritable directory ({e}); run the test as a user without \
                         CAP_DAC_OVERRIDE, or where setresuid is allowed"
                    )
                })?;
            }
            Ok::<_, String>(SvdOutput::check_target(&target))
        })
        .join()
        .expect("the checking thread panicked");
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).expect("chmod back");
        let e = checked
            .unwrap_or_else(|why| panic!("{why}"))
            .expect_err("a parent directory without write permission was accepted")
            .to_string();
        assert!(e.contains("`out`") && e.contains("not writable"), "{e}");
        assert!(e.contains(&ro.display().to_string()), "{e}");
    }

    #[test]
    fn output_create_refuses_existing_tmp_and_out() {
        let scratch = Scratch::new("exists");
        let out = scratch.0.join("r.zarr");
        let tmp = SvdOutput::temp_path(&out, "1");
        fs::create_dir(&tmp).expect("stale tmp");
        let e = SvdOutput::create(&out, &tmp, layout(4, 4, 2, 2, 2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists") && e.contains(".tmp-1"), "{e}");
        fs::remove_dir(&tmp).expect("rm");
        let e = SvdOutput::open(&out, &tmp, layout(4, 4, 2, 2, 2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not found"), "{e}");
        let e = SvdOutput::create(&out, &tmp, layout(4, 0, 2, 2, 2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("n must be positive"), "{e}");
        assert!(!tmp.exists());

        // --out appears while the group is being written: commit fails, tmp stays.
        let w = SvdOutput::create(&out, &tmp, layout(4, 4, 2, 2, 2)).expect("create");
        fs::create_dir(&out).expect("racing `out`");
        let e = w.commit().unwrap_err().to_string();
        assert!(e.contains("must not exist"), "{e}");
        assert!(tmp.is_dir());
        // abandon refuses non-temporary paths.
        assert!(SvdOutput::abandon(&out).is_err());
        assert!(out.is_dir());
        SvdOutput::abandon(&tmp).expect("abandon");
        assert!(!tmp.exists());
    }

    #[test]
    fn output_chunks_capped_and_unwritten_chunks_read_nan() {
        let scratch = Scratch::new("cap");
        let out = scratch.0.join("r.zarr");
        let tmp = SvdOutput::temp_path(&out, "x");
        let w = SvdOutput::create(&out, &tmp, layout(7, 3, 2, 4096, 4096)).expect("create");
        assert_eq!(w.layout().u_chunk_rows_stored(), 7);
        let vt = Array2::from_shape_fn((2, 3), |(i, j)| (i * 3 + j) as f64);
        w.write_vt(vt.view()).expect("vt");
        let s = Array1::from(vec![2.0, 1.0]);
        w.write_s(s.as_slice().expect("slice")).expect("s");
        w.commit().expect("commit");
        let (_, u) = read_all(&out, "U");
        assert!(u.iter().all(|x| x.is_nan()), "U never written reads NaN");
        let (_, vt_read) = read_all(&out, "Vt");
        assert_eq!(vt_read, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    }
}
