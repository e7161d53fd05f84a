//! The rankwise runtime: topology, pinned actors, the chunk grid and placement, chunk
//! sources and the per-actor memory budget.
//!
//! A [`Runtime`] is one rank: it holds the transport ([`rankwise_transports::Comm`]) and the
//! rank's actors, and knows every other rank's actors (the [`World`]) so that placement is
//! computed identically everywhere without further messages.

pub mod actor;
pub mod bed;
mod blosc;
pub mod budget;
mod direct;
pub mod gpu;
pub mod grid;
pub mod panel;
pub mod readahead;
mod runtime;
pub mod source;
pub mod stream;
pub mod subset;
pub mod topology;
pub mod zarr;

pub use actor::{Actor, ActorSpec};
pub use bed::BedGenotypes;
pub use budget::{parse_bytes, MemoryPlan, ReadBuffers, Residency};
pub use grid::{ActorKind, ActorShape, Assignment, ChunkGrid, Placement, World};
pub use panel::{
    ChunkScratch, ElementType, PanelBuffer, PanelValues, ReadScratch, ReadStats, StoredPanels,
};
pub use readahead::{BufferPool, PanelLease, ReadAhead};
pub use runtime::{actor_specs, CoreShare, Runtime, RuntimeConfig};
pub use source::{
    Dist, Generated, GenotypeSource, InMemoryGenotypes, InMemoryMatrix, PanelSource, SourceError,
};
pub use topology::Topology;

use rankwise_transports::TransportError;

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A parameter with a bad value. Messages name parameters in backticks
    /// (`` `chunk_rows` ``), so that a client can name them its own way (the command line
    /// as its flags).
    #[error("`{parameter}`: {message}")]
    Option {
        /// The parameter at fault, as the API names it (e.g. `chunk_rows`).
        parameter: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// The memory budget cannot hold the work.
    #[error("`memory_per_actor`: {0}")]
    Budget(String),
    /// A transport failure (including another rank's failure).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A chunk source failure.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A job panicked inside an actor.
    #[error("actor {actor} on rank {rank} panicked: {message}")]
    Panic {
        /// Rank of the actor.
        rank: usize,
        /// Actor index on its rank.
        actor: usize,
        /// The panic message.
        message: String,
    },
    /// A GPU actor's device could not be used.
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    /// Starting a thread failed.
    #[error("could not start actor threads: {0}")]
    Spawn(#[from] std::io::Error),
}
