//! The error of the genomics calls.

use rankwise_linalg::LinalgError;
use rankwise_sources::SourceError;

/// An error of a PCA or of its selection.
///
/// A bad argument names the parameter (`keep`, `chromosomes`), never a command-line flag:
/// the command line maps parameters to its flags.
#[derive(Debug, thiserror::Error)]
pub enum GenomicsError {
    /// A bad value of a parameter (named in backticks, as the other crates' errors name
    /// them).
    #[error("`{parameter}`: {message}")]
    Parameter {
        /// The parameter, as the API names it.
        parameter: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// Every component was asked to converge, and at least one did not (every rank finds
    /// it).
    #[error("{0}")]
    NotConverged(String),
    /// A file of a projection (`.eigenvec.var`, `.afreq`, `.eigenval`) that cannot be read
    /// or written, or that does not say what it must; the message names the line.
    #[error("{}: {message}", path.display())]
    File {
        /// The file at fault.
        path: std::path::PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A file that is not there (a projection's weights).
    #[error("{}: no such file", path.display())]
    NotFound {
        /// The file looked for.
        path: std::path::PathBuf,
    },
    /// From the linear algebra.
    #[error(transparent)]
    Linalg(#[from] LinalgError),
    /// From the genotypes' source.
    #[error(transparent)]
    Source(#[from] SourceError),
}

impl GenomicsError {
    /// The parameter a [`GenomicsError::Parameter`] names.
    pub fn parameter(&self) -> Option<&'static str> {
        match self {
            GenomicsError::Parameter { parameter, .. } => Some(parameter),
            _ => None,
        }
    }
}
