//! A communicator of a program that initialized MPI itself (a C, Fortran or Python code
//! with mpi4py): checked, and duplicated so that rankwise's messages never meet the host's
//! and no failure of ours aborts its job. The C library and the Python package share it.

use std::os::raw::c_int;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::FromRaw;

/// Why a host's MPI or communicator cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum HostMpiError {
    /// MPI cannot be used from this call (not initialized, finalized, or at too low a
    /// thread level).
    #[error("{0}")]
    NotReady(String),
    /// The handle names no usable communicator.
    #[error("`comm`: {0}")]
    InvalidCommunicator(String),
    /// An MPI call returned an error.
    #[error("{call} failed with MPI error {code}")]
    Call {
        /// The MPI function.
        call: &'static str,
        /// Its return code.
        code: i32,
    },
}

fn mpi_call(call: &'static str, code: c_int) -> Result<(), HostMpiError> {
    if code == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(HostMpiError::Call { call, code })
    }
}

/// Fails unless MPI is initialized, not finalized, at `MPI_THREAD_FUNNELED` or above, and
/// (for `FUNNELED`) this is the thread that initialized it.
pub fn mpi_ready() -> Result<(), HostMpiError> {
    let (mut init, mut fin) = (0, 0);
    // SAFETY: both may be called at any time, before MPI_Init and after MPI_Finalize.
    unsafe {
        ffi::MPI_Initialized(&mut init);
        ffi::MPI_Finalized(&mut fin);
    }
    if init == 0 {
        return Err(HostMpiError::NotReady(
            "MPI is not initialized: call MPI_Init_thread (MPI_THREAD_FUNNELED or above) first"
                .into(),
        ));
    }
    if fin != 0 {
        return Err(HostMpiError::NotReady("MPI is already finalized".into()));
    }
    let mut provided = 0;
    // SAFETY: MPI is initialized and not finalized.
    mpi_call("MPI_Query_thread", unsafe {
        ffi::MPI_Query_thread(&mut provided)
    })?;
    if provided < ffi::MPI_THREAD_FUNNELED as c_int {
        return Err(HostMpiError::NotReady(
            "MPI was initialized with MPI_THREAD_SINGLE; rankwise runs worker threads beside \
             the MPI thread: initialize with MPI_Init_thread(…, MPI_THREAD_FUNNELED, …)"
                .into(),
        ));
    }
    // FUNNELED: only the thread that initialized MPI may call it (SERIALIZED and MULTIPLE
    // allow any thread; the caller keeps its own calls apart from ours).
    if provided == ffi::MPI_THREAD_FUNNELED as c_int {
        let mut main = 0;
        // SAFETY: MPI is initialized.
        mpi_call("MPI_Is_thread_main", unsafe {
            ffi::MPI_Is_thread_main(&mut main)
        })?;
        if main == 0 {
            return Err(HostMpiError::NotReady(
                "MPI was initialized with MPI_THREAD_FUNNELED, so rankwise must be called on \
                 the thread that initialized MPI"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// True when every byte of the handle is zero: Open MPI's `MPI_Comm_f2c` returns a NULL
/// pointer for a Fortran handle that names no communicator (out of range, or a freed
/// slot), as MPI-2 §4.12.4 asks ("an invalid C handle", no error handler).
fn is_zero_handle(c: &ffi::MPI_Comm) -> bool {
    // SAFETY: reads the handle's own bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (c as *const ffi::MPI_Comm).cast::<u8>(),
            std::mem::size_of::<ffi::MPI_Comm>(),
        )
    };
    bytes.iter().all(|&b| b == 0)
}

/// The caller's communicator, duplicated with `MPI_ERRORS_RETURN` so that no failure of
/// ours aborts the caller's job, and so that our messages never meet the caller's.
pub fn duplicate(fint: c_int) -> Result<SimpleCommunicator, HostMpiError> {
    // SAFETY: MPI is initialized (mpi_ready); f2c never invokes an error handler.
    let c = unsafe { ffi::MPI_Comm_f2c(fint) };
    // SAFETY: reading the library's constant.
    if is_zero_handle(&c) || c == unsafe { ffi::RSMPI_COMM_NULL } {
        return Err(HostMpiError::InvalidCommunicator(format!(
            "{fint} is not the Fortran handle of a communicator (pass MPI_Comm_c2f(comm) in C, comm.py2f() with mpi4py)"
        )));
    }
    let mut inter = 0;
    // SAFETY: c is a live communicator handle (checked above).
    mpi_call("MPI_Comm_test_inter", unsafe {
        ffi::MPI_Comm_test_inter(c, &mut inter)
    })?;
    if inter != 0 {
        return Err(HostMpiError::InvalidCommunicator(format!(
            "{fint} is an inter-communicator; rankwise needs an intra-communicator"
        )));
    }
    // SAFETY: a valid intra-communicator; MPI_Comm_dup is collective over it, and every
    // rank of the communicator makes this call.
    let mut dup = unsafe { ffi::RSMPI_COMM_NULL };
    mpi_call("MPI_Comm_dup", unsafe { ffi::MPI_Comm_dup(c, &mut dup) })?;
    // SAFETY: dup is a fresh intra-communicator of ours, freed on drop of the wrapper.
    let dup = unsafe { SimpleCommunicator::from_raw(dup) };
    // SAFETY: the predefined handler on our own communicator.
    mpi_call("MPI_Comm_set_errhandler", unsafe {
        ffi::MPI_Comm_set_errhandler(dup.as_raw(), ffi::RSMPI_ERRORS_RETURN)
    })?;
    Ok(dup)
}
