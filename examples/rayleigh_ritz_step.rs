//! Times LOBPCG's Rayleigh–Ritz step, the root rank's work between two passes, as
//! `rankwise calibrate` does for the sizing model: the mean of 20 steps, and the part of it
//! spent in the products the threads share.
//!
//! ```sh
//! cargo run --release --example rayleigh_ritz_step -- THREADS [SAMPLES] [K]
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
        rankwise::linalg::init_blas_threads();
        let t = rankwise::linalg::rayleigh_ritz_seconds(samples, k, 10, threads, 20)
            .map_err(|e| e.to_string())?;
        println!(
            "{samples} samples, k = {k} (l = {}), {threads} thread(s): {:.1} ms a step, {:.1} ms \
             of it in the shared products",
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
