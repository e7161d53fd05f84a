//! Settings of the whole process that a program running rankwise makes once, before it
//! starts any thread: the allocator's treatment of large blocks, and the BLAS kernels
//! that keep results the same bits for any number of ranks. The `rankwise` command line
//! makes both first thing; a program that links the library calls them from its `main`.
//! (The Python package chooses the kernels its own way, before it loads OpenBLAS: a
//! Python process cannot start itself again.)

/// Keeps every allocation of 4 MiB or more in its own mapping, returned to the system
/// when freed. glibc's default threshold adapts upwards after large frees, after which
/// freed chunk reads and panel buffers stay in the per-thread arenas, and the resident
/// set grows past the memory budget the plan promised. Call it before any thread starts;
/// elsewhere than glibc it does nothing.
pub fn hold_large_blocks_in_mmap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
    }
}

/// Starts this program again (Linux's `/proc/self/exe`, with the same arguments) with
/// `OPENBLAS_CORETYPE` set to the kernels [`rankwise_linalg::openblas_preferred_core`]
/// names, where OpenBLAS chose others; returns without doing anything where it chose
/// those, or where the variable is set (the user's choice is respected).
///
/// Regression (bit-identity across rank counts on AVX-512 Intel CPUs): OpenBLAS's SkylakeX
/// kernels give results that depend on the operands' addresses, so the root rank's small
/// QR and SVD differed in the last bits between 1, 2 and 3 ranks (block Krylov with a
/// 36-column basis). OpenBLAS picks its kernels when it is loaded, before `main` runs, so
/// only a new process can change them: it gets the Haswell (AVX2) kernels, which are
/// layout-independent. The skinny tile kernels keep AVX-512 either way. The same restart
/// gives the AVX2 kernels to a CPU this OpenBLAS does not know by model, where it would
/// run its generic SSE3 ones. Returns (with a warning on stderr) if the restart fails.
pub fn restart_with_layout_independent_kernels() {
    const VAR: &str = "OPENBLAS_CORETYPE";
    if std::env::var_os(VAR).is_some() {
        return;
    }
    let Some(core) = rankwise_linalg::openblas_preferred_core() else {
        return;
    };
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| "rankwise".into());
    let err = std::process::Command::new("/proc/self/exe")
        .arg0(argv0)
        .args(args)
        .env(VAR, core)
        .exec();
    // exec returns only when it failed: carry on with the kernels OpenBLAS chose.
    eprintln!(
        "rankwise: could not restart with {VAR}={core} ({err}); results may differ in the \
         last bits between rank counts, or run on slower kernels"
    );
}
