//! rankwise: distributed SVD and PCA of matrices too large for one machine.
//!
//! Every rank hosts actors pinned to CPU NUMA domains (or GPUs); each actor owns whole row
//! panels of the matrix, and only small matrices — the R factors of the TSQR tree — travel
//! between ranks. This crate re-exports the public API of the workspace:
//!
//! * [`runtime`]: topology, actors, the chunk grid and placement, sources, memory budget;
//! * [`transports`]: the `Comm` trait, the `Local` and `Mpi` transports;
//! * [`linalg`]: panel kernels, TSQR, the SVD;
//! * [`output`]: Zarr result groups committed atomically, PLINK 2 eigenvector files.
//!
//! ```
//! use rankwise::{embedded, linalg::{svd, SvdOptions, SvdProblem}, runtime::{Dist, RuntimeConfig}};
//! let rt = embedded(&RuntimeConfig { pin: false, ..Default::default() }).unwrap();
//! let problem = SvdProblem::generated(1000, 4, 100, 7, Dist::Uniform).unwrap();
//! let result = svd(&rt, &problem, &SvdOptions { check: true }, None).unwrap();
//! assert!(result.check.unwrap().relative_residual < 1e-13);
//! ```

pub use rankwise_linalg as linalg;
pub use rankwise_output as output;
pub use rankwise_runtime as runtime;
pub use rankwise_transports as transports;

use rankwise_runtime::{actor_specs, CoreShare, Runtime, RuntimeConfig, RuntimeError, Topology};
use rankwise_transports::{Comm, LocalWorld};

/// A one-rank runtime on the `Local` transport: the embedded default.
pub fn embedded(config: &RuntimeConfig) -> Result<Runtime, RuntimeError> {
    with_comm(Box::new(LocalWorld::create(1).remove(0)), config)
}

/// A runtime on a given transport, with actors from this machine's topology.
pub fn with_comm(comm: Box<dyn Comm>, config: &RuntimeConfig) -> Result<Runtime, RuntimeError> {
    rankwise_linalg::init_blas_threads();
    let topology = Topology::detect();
    Runtime::new(comm, actor_specs(&topology, config)?)
}

/// Runs `f` on `ranks` ranks of the `Local` transport, one thread each, and returns every
/// rank's result in rank order. Each rank gets `config` with its local rank filled in.
pub fn local_world<T, F>(ranks: usize, config: &RuntimeConfig, f: F) -> Vec<Result<T, RuntimeError>>
where
    T: Send + 'static,
    F: Fn(Runtime) -> T + Send + Sync + 'static,
{
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = LocalWorld::create(ranks)
        .into_iter()
        .enumerate()
        .map(|(r, comm)| {
            let f = std::sync::Arc::clone(&f);
            let cfg = RuntimeConfig {
                local_rank: r,
                local_size: ranks,
                // The ranks are threads of this process: they share its cores out.
                core_share: CoreShare::ByLocalRank,
                ..config.clone()
            };
            std::thread::spawn(move || with_comm(Box::new(comm), &cfg).map(|rt| f(rt)))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

/// A runtime on a communicator of a program that already initialized MPI (for HPC codes
/// that link rankwise): every rank of `comm` must call this, and rankwise never finalizes
/// MPI. Call it on the thread that initialized MPI; the runtime stays on that thread.
#[cfg(feature = "mpi")]
pub fn from_mpi_communicator(
    comm: rankwise_transports::mpi_comm::mpi::topology::SimpleCommunicator,
    config: &RuntimeConfig,
) -> Result<Runtime, RuntimeError> {
    with_comm(
        Box::new(rankwise_transports::MpiComm::from_communicator(comm)),
        config,
    )
}
