//! The rankwise execution layer: topology, pinned actors, the chunk grid and placement, and
//! the per-actor memory budget.
//!
//! A [`Runtime`] is one rank: it holds the transport ([`rankwise_transports::Comm`]) and the
//! rank's actors, and knows every other rank's actors (the [`World`]) so that placement is
//! computed identically everywhere without further messages.

mod actor;
mod budget;
mod grid;
mod progress;
mod runtime;
mod topology;

pub use actor::{Actor, ActorSpec, Job};
pub use budget::{format_bytes, parse_bytes, MemoryPlan, ReadBuffers, Residency};
pub use grid::{ActorKind, ActorShape, Assignment, ChunkGrid, Placement, World};
pub use progress::{Progress, ProgressSnapshot};
pub use runtime::{actor_specs, CoreShare, Interrupter, Runtime, RuntimeConfig};
pub use topology::{
    bind_current_thread, GpuInfo, NumaDomain, Topology, TopologyError, TopologySource,
};

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
    Gpu(#[from] rankwise_device::GpuError),
    /// The work was interrupted ([`Interrupter::interrupt`]).
    #[error("rank {rank} was interrupted")]
    Interrupted {
        /// The interrupted rank.
        rank: usize,
    },
    /// Starting a thread failed.
    #[error("could not start actor threads: {0}")]
    Spawn(#[from] std::io::Error),
}

/// The message of a caught panic's payload (a `&str` or a `String`; other payloads have none).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}
