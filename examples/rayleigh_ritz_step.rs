//! Times the Rayleigh–Ritz step of LOBPCG or block Lanczos, the root rank's work between
//! two passes, as `rankwise calibrate` does for the sizing model: the mean of 20 steps (of
//! whole restart cycles for block Lanczos), and the part of it spent in the products the
//! threads share.
//!
//! ```sh
//! cargo run --release --example rayleigh_ritz_step -- THREADS [SAMPLES] [K] [lobpcg|lanczos]
//! ```

use std::process::ExitCode;

fn main() -> ExitCode {
    let arg = |i: usize, default: usize| -> Result<usize, String> {
        std::env::args().nth(i).map_or(Ok(default), |s| {
            s.parse().map_err(|e| format!("argument {i} ({s:?}): {e}"))
        })
    };
    let run = || -> Result<(), String> {
        let (threads, samples, k) = (arg(1, 1)?, arg(2, 16_000)?, arg(3, 10)?);
        let method = match std::env::args().nth(4).as_deref() {
            None | Some("lobpcg") => rankwise::Method::Lobpcg,
            Some("lanczos") => rankwise::Method::Lanczos,
            Some(other) => return Err(format!("argument 4 ({other:?}): lobpcg or lanczos")),
        };
        rankwise::linalg::init_blas_threads();
        let t = rankwise::linalg::rayleigh_ritz_seconds(samples, k, 10, method, threads, 20)
            .map_err(|e| e.to_string())?;
        println!(
            "{}: {samples} samples, k = {k} (l = {}), {threads} thread(s): {:.1} ms a step, \
             {:.1} ms of it in the shared products",
            method.name(),
            k + 10,
            t.seconds * 1e3,
            t.shared * 1e3
        );
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rayleigh_ritz_step: {e}");
            ExitCode::FAILURE
        }
    }
}
