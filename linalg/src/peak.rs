//! The machine limit of a pass: the GEMM rate that the compute threads of every rank reach
//! together, measured by a short probe, against which a run states each pass's rate.
//!
//! A pass of the randomized SVD is a product of the matrix with thin matrices, so a large
//! square GEMM of the same precision on the same threads is the rate the pass could reach
//! at best (the benchmarks' machine-limit column uses OpenBLAS's DGEMM the same way). The
//! probe runs on as many threads as the rank's actors compute with, all at once (so they
//! share the memory system and the clock limits as the pass did), and the ranks' rates
//! are summed: ranks that share a node probe together, so the sum is that node's rate.
//! It costs about 0.1–0.3 s per run, so it runs when asked.

use std::sync::Barrier;
use std::time::Instant;

use rankwise_exec::Runtime;

use crate::blas::Blas;
use crate::tiles::Precision;
use crate::LinalgError;

/// Order of the square GEMM each thread runs: large enough for BLAS's full rate, small
/// enough (24 MiB in f64) that the probe stays short.
const ORDER: usize = 1024;

/// Timed GEMMs per thread after one warm-up; the fastest counts.
const REPS: usize = 2;

/// The GEMM rate, in floating-point operations per second, of this rank's compute threads
/// (every actor's) running at once in `precision`, summed over all ranks. Collective: every
/// rank calls it.
pub fn gemm_peak(rt: &Runtime, precision: Precision) -> Result<f64, LinalgError> {
    let threads: usize = rt.actors().iter().map(|a| a.threads().max(1)).sum();
    let local = match precision {
        Precision::F64 => probe::<f64>(threads.max(1)),
        Precision::F32 => probe::<f32>(threads.max(1)),
    };
    let mut sum = [local];
    rt.comm().allreduce_sum_f64(&mut sum)?;
    Ok(sum[0])
}

/// Runs the probe on `threads` threads started together; the sum of their rates.
fn probe<T: Blas>(threads: usize) -> f64 {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let start = &start;
                s.spawn(move || one_thread::<T>(start, i))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
    })
}

/// One thread's best rate over [`REPS`] GEMMs of order [`ORDER`].
fn one_thread<T: Blas>(start: &Barrier, seed: usize) -> f64 {
    let n = ORDER;
    let value = |i: usize| T::from_f64(((i * 7 + seed) % 13) as f64 / 13.0 - 0.5);
    let a: Vec<T> = (0..n * n).map(value).collect();
    let b: Vec<T> = (0..n * n).map(|i| value(i + 5)).collect();
    let mut c = vec![T::from_f64(0.0); n * n];
    start.wait();
    let mut best = f64::INFINITY;
    for rep in 0..=REPS {
        let t = Instant::now();
        // SAFETY: a, b and c are n × n row-major with leading dimension n; c is exclusive.
        unsafe {
            T::gemm(
                false,
                n,
                n,
                n,
                a.as_ptr(),
                n,
                b.as_ptr(),
                n,
                T::from_f64(0.0),
                c.as_mut_ptr(),
                n,
            )
        };
        if rep > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    std::hint::black_box(&c);
    2.0 * (n as f64).powi(3) / best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_measures_a_positive_finite_rate_in_both_precisions() {
        let one = probe::<f64>(1);
        assert!(one.is_finite() && one > 1e8, "one thread: {one} FLOP/s");
        let single = probe::<f32>(1);
        assert!(single.is_finite() && single > 1e8, "f32: {single} FLOP/s");
    }
}
