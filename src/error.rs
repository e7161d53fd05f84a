//! The error of the library's calls.

use rankwise_exec::RuntimeError;
use rankwise_linalg::LinalgError;
use rankwise_sources::{BedError, SourceError, ZarrError};
use rankwise_transports::TransportError;

/// An error of [`open`](crate::open), [`pca`](crate::pca) or [`rsvd`](crate::rsvd).
///
/// A bad argument names the parameter (`keep`, `chromosomes`, `spec`), never a
/// command-line flag: the command line maps parameters to its flags.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad value of a parameter (named in backticks, as the other crates' errors name
    /// them).
    #[error("`{parameter}`: {message}")]
    Parameter {
        /// The parameter, as the API names it.
        parameter: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// Every component was asked to converge ([`Convergence`](crate::Convergence)), and at
    /// least one did not (every rank finds it).
    #[error("{0}")]
    NotConverged(String),
    /// A file that cannot be read or written, or that does not say what it must (a
    /// projection's `.eigenvec.var`, `.afreq` or `.eigenval`).
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
    /// From the runtime (budget, placement, actors).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// From a source: a file, store, array or chunk that could not be read.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// From the transport.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// From writing a result group.
    #[error(transparent)]
    Output(#[from] rankwise_output::group::OutputError),
    /// From a function of the caller's that the library called (a side file's writer:
    /// [`crate::pca_group::ExtraSideFile`]), as it returned it.
    #[error(transparent)]
    Caller(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// True when the input named does not exist (a missing file, store or fileset).
    pub fn is_not_found(&self) -> bool {
        let source = |e: &SourceError| match e {
            SourceError::Zarr(ZarrError::NotFound { .. }) => true,
            other => {
                let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(other);
                while let Some(e) = cause {
                    if let Some(io) = e.downcast_ref::<std::io::Error>() {
                        if io.kind() == std::io::ErrorKind::NotFound {
                            return true;
                        }
                    }
                    cause = e.source();
                }
                false
            }
        };
        match self {
            Error::Source(e) | Error::Linalg(LinalgError::Source(e)) => source(e),
            Error::NotFound { .. } => true,
            _ => false,
        }
    }

    /// The rank and message of a peer's failure notice this error passes on, if it is
    /// one: the rank that failed first, whose cause every rank reports.
    pub fn peer_failure(&self) -> Option<(usize, &str)> {
        let t = match self {
            Error::Transport(t)
            | Error::Linalg(LinalgError::Transport(t))
            | Error::Linalg(LinalgError::Runtime(RuntimeError::Transport(t)))
            | Error::Runtime(RuntimeError::Transport(t)) => t,
            _ => return None,
        };
        match t {
            TransportError::PeerFailed { rank, message } => Some((*rank, message)),
            _ => None,
        }
    }

    /// The parameter a bad argument names: an [`Error::Parameter`], or the runtime's,
    /// the linear algebra's or a source's error about a parameter's value. `None` for
    /// every other failure (of the data, the transport or the computation).
    pub fn parameter(&self) -> Option<&'static str> {
        let runtime = |e: &RuntimeError| match e {
            RuntimeError::Option { parameter, .. } => Some(*parameter),
            _ => None,
        };
        let source = |e: &SourceError| match e {
            SourceError::Option { parameter, .. } => Some(*parameter),
            _ => None,
        };
        match self {
            Error::Parameter { parameter, .. } => Some(parameter),
            Error::Runtime(e) => runtime(e),
            Error::Linalg(LinalgError::Option { parameter, .. }) => Some(parameter),
            Error::Linalg(LinalgError::Runtime(e)) => runtime(e),
            Error::Linalg(LinalgError::Source(e)) | Error::Source(e) => source(e),
            _ => None,
        }
    }
}

impl From<ZarrError> for Error {
    fn from(e: ZarrError) -> Self {
        Error::Source(e.into())
    }
}

impl From<BedError> for Error {
    fn from(e: BedError) -> Self {
        Error::Source(e.into())
    }
}

impl From<rankwise_genomics::GenomicsError> for Error {
    fn from(e: rankwise_genomics::GenomicsError) -> Self {
        use rankwise_genomics::GenomicsError as G;
        match e {
            G::Parameter { parameter, message } => Error::Parameter { parameter, message },
            G::NotConverged(what) => Error::NotConverged(what),
            G::Linalg(e) => Error::Linalg(e),
            G::Source(e) => Error::Source(e),
            G::File { path, message } => Error::File { path, message },
            G::NotFound { path } => Error::NotFound { path },
        }
    }
}
