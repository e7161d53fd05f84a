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
//!
//! A pass of the exact SVD is different: it produces the matrix (generates it, or reads
//! and decodes it) and multiplies it by as few columns as the matrix has, so producing the
//! values costs as much as the products. Its limit is its flops at the GEMM rate plus its
//! bytes at the rate [`production_peak`] measures: the same threads producing a panel's
//! rows at once, in the row blocks the kernels use.

use std::ops::Range;
use std::sync::Barrier;
use std::time::Instant;

use ndarray::{ArrayViewMut2, ShapeBuilder};
use rankwise_sources::PanelSource;

use rankwise_exec::Runtime;

use crate::blas::Blas;
use crate::kernels::block_rows;
use crate::tiles::{Operand, Precision, Tile, TileProducer, TileReal};
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
    let mut sum = [gemm_rate(precision, threads)];
    rt.comm().allreduce_sum_f64(&mut sum)?;
    Ok(sum[0])
}

/// The GEMM rate of [`gemm_peak`] on this process alone: `threads` threads started
/// together, each running square GEMMs of order 1024 in `precision` on the BLAS kernels
/// this process loaded, their rates summed. Not collective: a process started only to
/// measure the kernels the BLAS would choose by itself calls it.
pub fn gemm_rate(precision: Precision, threads: usize) -> f64 {
    match precision {
        Precision::F64 => probe::<f64>(threads.max(1)),
        Precision::F32 => probe::<f32>(threads.max(1)),
    }
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

/// Values each thread of [`production_peak`] produces per repetition, at most: enough for a
/// rate (about 30 MiB), few enough that the probe stays short.
const PRODUCED_VALUES: usize = 1 << 22;

/// The rate, in bytes of float64 values per second, at which the compute threads of this
/// rank (every actor's) produce `source`'s values all at once, summed over all ranks: the
/// generator's rate for a generated matrix, reading and decoding for a stored one (from
/// the page cache when a run has just read it). Each thread produces rows from
/// `rows.start` in the row blocks the panel kernels use, the way a pass produces them
/// before it multiplies them. With [`gemm_peak`] it makes the machine limit of a pass
/// that produces the matrix and multiplies it: its bytes at this rate and its flops at
/// that one. Collective: every rank calls it.
pub fn production_peak(
    rt: &Runtime,
    source: &dyn PanelSource,
    rows: Range<u64>,
) -> Result<f64, LinalgError> {
    let n = source.shape().1 as usize;
    let rows = probe_rows(rows, n);
    on_every_thread(rt, !rows.is_empty() && n > 0, |start| {
        produce(start, source, rows.clone())
    })
}

/// The rate, in bytes per second at 8 bytes a value whatever the precision, at which the
/// compute threads of this rank (every actor's) produce `operand`'s tiles in `precision`
/// all at once, summed over all ranks: each thread produces the rows of `panel` (this
/// rank's first: its index and rows; `None` for a rank without any) tile by tile, as a randomized pass does before it multiplies them (generated in the tiles'
/// precision, or read, decoded and converted). With [`gemm_peak`] of the same precision
/// it makes the machine limit of a randomized pass over panels that are not resident: its
/// bytes at this rate and its flops at that one. For a genotype operand the passes'
/// products read packed codes, not the values this measures; the limit of its passes is
/// the GEMM rate's alone. Collective: every rank calls it.
pub fn tile_production_peak(
    rt: &Runtime,
    operand: &Operand,
    panel: Option<(usize, Range<u64>)>,
    precision: Precision,
) -> Result<f64, LinalgError> {
    let n = operand.shape().1 as usize;
    let (panel, rows) = panel.unwrap_or((0, 0..0));
    let rows = probe_rows(rows, n);
    on_every_thread(rt, !rows.is_empty() && n > 0, |start| match precision {
        Precision::F64 => produce_tiles::<f64>(start, operand, panel, rows.clone()),
        Precision::F32 => produce_tiles::<f32>(start, operand, panel, rows.clone()),
    })
}

/// The first rows of `rows` that make at most [`PRODUCED_VALUES`] values of `n` columns.
fn probe_rows(rows: Range<u64>, n: usize) -> Range<u64> {
    let take = (PRODUCED_VALUES / n.max(1)).max(1) as u64;
    rows.start..rows.end.min(rows.start + take)
}

/// Runs `probe` on every compute thread of this rank at once (when `any`: a rank with
/// nothing to probe measures 0) and sums their rates over the threads and the ranks.
fn on_every_thread(
    rt: &Runtime,
    any: bool,
    probe: impl Fn(&Barrier) -> Result<f64, LinalgError> + Sync,
) -> Result<f64, LinalgError> {
    let threads: usize = rt.actors().iter().map(|a| a.threads().max(1)).sum();
    let local = if !any {
        Ok(0.0)
    } else {
        let start = Barrier::new(threads.max(1));
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads.max(1))
                .map(|_| {
                    let (start, probe) = (&start, &probe);
                    s.spawn(move || probe(start))
                })
                .collect();
            // A probe thread that panicked is this rank's failure, as in any pass. Every
            // thread is joined before the first failure counts (the scope would panic
            // over one left unjoined).
            let joined: Vec<_> = (handles.into_iter().enumerate())
                .map(|(i, h)| {
                    h.join().unwrap_or_else(|p| {
                        Err(LinalgError::Runtime(rankwise_exec::RuntimeError::Panic {
                            rank: rt.rank(),
                            actor: i,
                            message: panic_text(p.as_ref()),
                        }))
                    })
                })
                .collect();
            joined.into_iter().sum::<Result<f64, LinalgError>>()
        })
    };
    // Every rank joins the sum, also one whose probe failed, so that none waits.
    let mut sum = [*local.as_ref().unwrap_or(&0.0)];
    rt.comm().allreduce_sum_f64(&mut sum)?;
    local?;
    Ok(sum[0])
}

/// One thread's best rate over [`REPS`] productions of `rows`' tiles, in bytes per second
/// at 8 bytes a value.
fn produce_tiles<T: TileReal>(
    start: &Barrier,
    operand: &Operand,
    panel: usize,
    rows: Range<u64>,
) -> Result<f64, LinalgError> {
    let n = operand.shape().1 as usize;
    let h = (rows.end - rows.start) as usize;
    let mut tile_buf = Vec::new();
    start.wait();
    let mut best = f64::INFINITY;
    for rep in 0..=REPS {
        let t = Instant::now();
        // A fresh producer each time, holding nothing: a stored panel is read and decoded
        // again, and nothing is kept.
        let mut sum = 0.0f64;
        TileProducer::new(operand, panel, rows.clone()).for_each::<T>(
            None,
            false,
            &mut tile_buf,
            |_, _, tile| {
                // One value a tile, so that producing it cannot be left out.
                if let Tile::Dense(v) = tile {
                    sum += v.first().map_or(0.0, |x| x.to_f64());
                }
            },
        )?;
        std::hint::black_box(sum);
        if rep > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    Ok((h * n * 8) as f64 / best)
}

/// One thread's best rate over [`REPS`] productions of `rows`, in bytes per second.
fn produce(
    start: &Barrier,
    source: &dyn PanelSource,
    rows: Range<u64>,
) -> Result<f64, LinalgError> {
    let n = source.shape().1 as usize;
    let b = block_rows(n);
    let mut block = vec![0.0f64; b * n];
    let h = (rows.end - rows.start) as usize;
    start.wait();
    let mut best = f64::INFINITY;
    for rep in 0..=REPS {
        let t = Instant::now();
        // A fresh reader each time: a stored panel is read and decoded again, not tiled
        // from the one the last repetition decoded.
        let mut fill = crate::svd::fill_from(source, 0, rows.clone(), None);
        let mut at = 0;
        while at < h {
            let end = (at + b).min(h);
            let view = ArrayViewMut2::from_shape((end - at, n).f(), &mut block[..(end - at) * n])
                .expect("a row block fits the buffer");
            fill(at..end, view)?;
            at = end;
        }
        if rep > 0 {
            best = best.min(t.elapsed().as_secs_f64());
        }
    }
    std::hint::black_box(&block);
    Ok((h * n * 8) as f64 / best)
}

/// A panic's message, where it has one.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    (p.downcast_ref::<&str>().map(|s| s.to_string()))
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime of one Local rank with `actors` actors of one thread each.
    fn runtime(actors: usize) -> Runtime {
        let comm = rankwise_transports::LocalWorld::create(1).remove(0);
        let spec = rankwise_exec::ActorSpec {
            domain: 0,
            cores: vec![0],
            memory: 1 << 30,
            pin: false,
            gpu: None,
        };
        Runtime::new(Box::new(comm), vec![spec; actors]).unwrap()
    }

    /// A source whose values cannot be made: the probe's thread panics.
    struct Broken;

    impl PanelSource for Broken {
        fn shape(&self) -> (u64, u64) {
            (1000, 4)
        }
        fn fill(
            &self,
            _: Range<u64>,
            _: ArrayViewMut2<'_, f64>,
        ) -> Result<(), rankwise_sources::SourceError> {
            panic!("no values here")
        }
        fn describe(&self) -> String {
            "broken".into()
        }
    }

    /// The production probe measures a generated matrix's rate on every actor's thread,
    /// over at most the rows asked for; an empty range gives 0 (a rank without panels);
    /// a thread that panics is the rank's error, not a rate.
    #[test]
    fn the_production_probe_measures_generation_and_reports_a_panic() {
        let mut rng = crate::testing::Rng::fresh();
        let rt = runtime(1 + rng.below(2));
        let n = 1 + rng.below(40) as u64;
        let g = rankwise_sources::Generated::new(
            50_000,
            n,
            rng.next(),
            rankwise_sources::Dist::Uniform,
        );
        let rate = production_peak(&rt, &g, 0..50_000).unwrap();
        assert!(rate.is_finite() && rate > 1e7, "{rate} bytes/s");
        assert_eq!(production_peak(&rt, &g, 7..7).unwrap(), 0.0);
        let err = production_peak(&rt, &Broken, 0..1000)
            .unwrap_err()
            .to_string();
        assert!(err.contains("panicked: no values here"), "{err}");
    }

    /// The tile probe measures a generated matrix's tiles in both precisions, from a panel
    /// other than the first; a rank without a panel measures 0.
    #[test]
    fn the_tile_production_probe_measures_generated_tiles_in_both_precisions() {
        let mut rng = crate::testing::Rng::fresh();
        let rt = runtime(1 + rng.below(2));
        let (m, n) = (20_000 + rng.below(20_000) as u64, 1 + rng.below(700) as u64);
        let g = rankwise_sources::Generated::new(m, n, rng.next(), rankwise_sources::Dist::Normal);
        let operand = Operand::Dense(std::sync::Arc::new(g));
        for precision in [Precision::F64, Precision::F32] {
            let rate = tile_production_peak(&rt, &operand, Some((3, 0..m)), precision).unwrap();
            assert!(
                rate.is_finite() && rate > 1e7,
                "{precision:?}: {rate} bytes/s"
            );
        }
        assert_eq!(
            tile_production_peak(&rt, &operand, None, Precision::F64).unwrap(),
            0.0
        );
    }

    #[test]
    fn the_probe_measures_a_positive_finite_rate_in_both_precisions() {
        let one = probe::<f64>(1);
        assert!(one.is_finite() && one > 1e8, "one thread: {one} FLOP/s");
        let single = probe::<f32>(1);
        assert!(single.is_finite() && single > 1e8, "f32: {single} FLOP/s");
    }
}
