//! `Mpi`: the transport over rsmpi. (Filled in by the MPI work.)
