//! The errors of the sources: one enum per kind of source, and [`SourceError`], which every
//! read returns. They live apart from the sources so that the panel buffers, the readers and
//! the source traits all name them without naming each other.

use std::ops::Range;
use std::path::PathBuf;

/// Errors of chunk sources.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The requested rows or columns fall outside the source.
    #[error("rows {rows:?} × {cols} columns are outside the {what} of shape {shape:?}")]
    OutOfBounds {
        /// What was asked for.
        rows: Range<u64>,
        /// Columns of the buffer.
        cols: usize,
        /// The source's shape.
        shape: (u64, u64),
        /// Which source.
        what: String,
    },
    /// A stored source could not be read.
    #[error(transparent)]
    Zarr(#[from] ZarrError),
    /// A PLINK binary fileset could not be read.
    #[error(transparent)]
    Bed(#[from] BedError),
    /// A parameter with a bad value (named as the API names it, in backticks).
    #[error("`{parameter}`: {message}")]
    Option {
        /// The parameter at fault (e.g. `populations`).
        parameter: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// A caller's function that produces rows on demand failed (a Python callback that
    /// computes a dask array's rows, say): its message, with the rows asked for.
    #[error("{what}, rows {rows:?}: {message}")]
    Caller {
        /// Which source.
        what: String,
        /// The rows asked for.
        rows: Range<u64>,
        /// The caller's message.
        message: String,
    },
    /// The decoder panicked reading these rows (a bug, or input a library did not
    /// expect): the read fails like any other, instead of taking its thread down.
    #[error("reading rows {rows:?}: the decoder panicked: {message}")]
    Panicked {
        /// The rows being read.
        rows: Range<u64>,
        /// The panic's message.
        message: String,
    },
}

/// Errors of Zarr sources. Every message names the store and array, and the chunk key
/// when one chunk is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ZarrError {
    /// Nothing exists at the path (a local path, or an object-store prefix with no Zarr
    /// metadata under it).
    #[error("{path}: {message}")]
    NotFound {
        /// The path as given.
        path: String,
        /// What was looked for.
        message: String,
    },
    /// The path is not a Zarr array (or group) that can be opened.
    #[error("{path}: {message}")]
    Open {
        /// The path as given.
        path: String,
        /// Why.
        message: String,
    },
    /// The array cannot be used by this command (type, shape, chunk grid, codec).
    #[error("Zarr array {array}: {message}")]
    Unsupported {
        /// `PATH:ARRAY`.
        array: String,
        /// Why.
        message: String,
    },
    /// One chunk could not be read or decoded.
    #[error("Zarr array {array}, chunk `{key}`: {message}")]
    Chunk {
        /// `PATH:ARRAY`.
        array: String,
        /// The chunk's store key.
        key: String,
        /// Why.
        message: String,
    },
    /// A decoded value is not a genotype dosage.
    #[error(
        "Zarr array {array}, chunk `{key}`: value {value} at variant {variant}, sample \
         {sample} is not a dosage (expected −1 for missing, 0, 1 or 2)"
    )]
    Dosage {
        /// `PATH:ARRAY`.
        array: String,
        /// The chunk's store key.
        key: String,
        /// Global variant (row).
        variant: u64,
        /// Global sample (column).
        sample: u64,
        /// The value found.
        value: i64,
    },
}

/// Errors of PLINK binary filesets. Each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum BedError {
    /// A file could not be opened or read.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// The file is not what a PLINK binary fileset holds.
    #[error("{path}: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}
