//! An MPI program that initializes MPI itself and hands its world communicator to rankwise:
//! the way an existing HPC code links rankwise. Run it with
//! `mpirun -np 2 target/release/examples/embed_mpi ROWS COLS CHUNK SEED`; rank 0 prints
//! the singular values, one per line, in full precision.

use rankwise::exec::RuntimeConfig;
use rankwise::linalg::{svd, SvdOptions, SvdProblem};
use rankwise::sources::Dist;
use rankwise::transports::mpi_comm::mpi;
use rankwise::transports::mpi_comm::mpi::traits::Communicator;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let [rows, cols, chunk, seed] = args[..] else {
        eprintln!("usage: embed_mpi ROWS COLS CHUNK SEED");
        std::process::exit(2);
    };
    // The host code owns MPI: it initializes and (on drop of `universe`) finalizes it.
    let universe = mpi::initialize().expect("MPI_Init");
    let world = universe.world();
    let rank = world.rank();
    let config = RuntimeConfig {
        actors: Some(1),
        ..Default::default()
    };
    let rt = rankwise::from_mpi_communicator(world, &config).expect("runtime");
    let problem = SvdProblem::generated(rows, cols, chunk, seed, Dist::Uniform).expect("problem");
    let result = svd(&rt, &problem, &SvdOptions::default(), None).expect("svd");
    if rank == 0 {
        for s in &result.s {
            println!("{s:e}");
        }
    }
    drop(rt);
}
