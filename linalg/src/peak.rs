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

/// The variable that makes a process a GEMM probe ([`serve_gemm_probe`]): `f64:THREADS` or
/// `f32:THREADS`.
pub const GEMM_PROBE_VAR: &str = "RANKWISE_GEMM_PROBE";

/// What precedes a probe's answer on its line.
const PROBE_MARKER: &str = "rankwise gemm probe: ";

/// Answers a [`machine_gemm_peak`] probe, where this process was started as one
/// ([`GEMM_PROBE_VAR`] set): prints the GEMM rate of the kernels the BLAS loaded ([`gemm_rate`],
/// FLOP/s) and their name on stdout, and returns the status the process should exit with
/// (2 for a value it cannot read). `None` in any other process. A program that names itself
/// as the probe ([`GemmProbe::this_executable`]) calls it before anything else in `main`.
pub fn serve_gemm_probe() -> Option<i32> {
    let spec = std::env::var_os(GEMM_PROBE_VAR)?;
    let spec = spec.to_string_lossy();
    let parsed = spec.split_once(':').and_then(|(p, t)| {
        let precision = match p {
            "f64" => Precision::F64,
            "f32" => Precision::F32,
            _ => return None,
        };
        Some((precision, t.parse::<usize>().ok()?))
    });
    let Some((precision, threads)) = parsed else {
        eprintln!("rankwise: {GEMM_PROBE_VAR}={spec}: expected f64:THREADS or f32:THREADS");
        return Some(2);
    };
    crate::kernels::init_blas_threads();
    // On a line of its own after a marker, so that a probe program that prints other
    // things (a test harness) can still be read.
    println!(
        "\n{PROBE_MARKER}{} {}",
        gemm_rate(precision, threads),
        crate::kernels::openblas_core()
    );
    Some(0)
}

/// How [`machine_gemm_peak`] starts a process that measures other BLAS kernels: a program
/// (with its arguments) that calls [`serve_gemm_probe`] first. OpenBLAS chooses its kernels
/// once, when it is loaded, from `OPENBLAS_CORETYPE`; other kernels are measured only in a
/// process started with another value.
#[derive(Clone, Debug)]
pub struct GemmProbe {
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
}

impl GemmProbe {
    /// `program` with `args`, for example a Python interpreter with `-c` and code that
    /// loads the `rankwise` extension and calls its `serve_gemm_probe`.
    pub fn new(
        program: impl Into<std::ffi::OsString>,
        args: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
    ) -> GemmProbe {
        GemmProbe {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }

    /// This executable again (Linux's `/proc/self/exe`), for a program whose `main` calls
    /// [`serve_gemm_probe`] first, as the `rankwise` command line does.
    pub fn this_executable() -> GemmProbe {
        GemmProbe::new("/proc/self/exe", Vec::<std::ffi::OsString>::new())
    }

    /// The probe's rate and kernel name with `OPENBLAS_CORETYPE=core` (`None`: unset, the
    /// kernels OpenBLAS chooses by itself); `None` where the process failed.
    fn measure(
        &self,
        precision: Precision,
        threads: usize,
        core: Option<&str>,
    ) -> Option<(f64, String)> {
        let mut c = std::process::Command::new(&self.program);
        c.args(&self.args)
            .env(GEMM_PROBE_VAR, format!("{}:{threads}", precision.name()))
            .env("OPENBLAS_NUM_THREADS", "1")
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        match core {
            Some(core) => c.env("OPENBLAS_CORETYPE", core),
            None => c.env_remove("OPENBLAS_CORETYPE"),
        };
        let out = c.output().ok().filter(|o| o.status.success())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let answer = text.lines().find_map(|l| l.split_once(PROBE_MARKER))?.1;
        let (rate, name) = answer.trim().split_once(' ')?;
        let rate = rate
            .parse::<f64>()
            .ok()
            .filter(|r| r.is_finite() && *r > 0.0)?;
        Some((rate, name.to_string()))
    }
}

/// The machine's GEMM rate for a run's machine limit ([`machine_gemm_peak`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MachineGemm {
    /// FLOP/s, all ranks together, with the best kernels measured.
    pub flops: f64,
    /// The name of those kernels (OpenBLAS's, e.g. `SkylakeX`).
    pub kernels: String,
    /// The rate of the kernels this process runs, where the best are others (and faster).
    pub loaded_flops: Option<f64>,
}

/// The GEMM rate of the machine for a run's machine limit, all ranks together, with the
/// kernels that reach it: the best of the kernels this process runs ([`gemm_peak`]) and,
/// with `probe`, of OpenBLAS's others that this CPU can run (the ones it chooses by
/// itself, Haswell's with AVX2 and SkylakeX's with AVX-512), each measured in a process
/// `probe` starts with them, on as many threads at once. `rankwise` pins its kernels to
/// layout-independent ones (see [`crate::openblas_preferred_core`]), and OpenBLAS 0.3.21
/// chooses its generic SSE3 kernels for a CPU model it does not know: on the Intel Xeon
/// model 207 guest the pinned Haswell kernels run DGEMM of order 1024 at 79 GFLOP/s on 2
/// threads, the ones it chooses (Prescott) at 28 and SkylakeX's at 142. A limit from the
/// pinned kernels alone would overstate every pass's share. Collective: every rank calls
/// it; where any rank's probe processes all fail, the limit is the loaded kernels' rate.
pub fn machine_gemm_peak(
    rt: &Runtime,
    precision: Precision,
    probe: Option<&GemmProbe>,
) -> Result<MachineGemm, LinalgError> {
    let loaded = gemm_peak(rt, precision)?;
    let threads: usize = rt.actors().iter().map(|a| a.threads().max(1)).sum();
    let mut candidates = vec![None];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") {
            candidates.push(Some("Haswell"));
        }
        if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            candidates.push(Some("SkylakeX"));
        }
    }
    // The kernels this process runs were measured in it already.
    let own_core = std::env::var("OPENBLAS_CORETYPE").ok();
    let best = probe.and_then(|probe| {
        (candidates.into_iter())
            .filter(|c| c.is_none() || c.map(str::to_string) != own_core)
            .filter_map(|core| probe.measure(precision, threads, core))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    });
    // Summed like the loaded rate; where any rank's probes all failed (or it was given
    // none), every rank keeps the loaded rate.
    let mut sums = [
        best.as_ref().map_or(0.0, |b| b.0),
        best.is_none() as u8 as f64,
    ];
    rt.comm().allreduce_sum_f64(&mut sums)?;
    let loaded_name = crate::kernels::openblas_core();
    Ok(match best {
        Some((_, name)) if sums[1] == 0.0 && sums[0] > loaded => MachineGemm {
            flops: sums[0],
            kernels: name,
            loaded_flops: Some(loaded),
        },
        _ => MachineGemm {
            flops: loaded,
            kernels: loaded_name,
            loaded_flops: None,
        },
    })
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

    /// Answers a probe when this test binary was started as one, by
    /// `machine_gemm_peak_takes_the_best_kernels`; in a plain test run it does nothing.
    #[test]
    fn gemm_probe_process() {
        if let Some(status) = serve_gemm_probe() {
            assert_eq!(status, 0);
        }
    }

    #[test]
    fn machine_gemm_peak_takes_the_best_kernels() {
        let rt = runtime(1);
        let probe = GemmProbe::new(
            "/proc/self/exe",
            ["--exact", "peak::tests::gemm_probe_process", "--nocapture"],
        );
        let own = crate::kernels::openblas_core();
        let best = machine_gemm_peak(&rt, Precision::F64, Some(&probe)).unwrap();
        assert!(best.flops > 0.0 && !best.kernels.is_empty(), "{best:?}");
        match best.loaded_flops {
            // Other kernels won: measured in a process of their own, named, faster than
            // the loaded ones were when measured in the same call.
            Some(l) => {
                assert!(best.flops > l, "{best:?}");
                assert!(l > 0.0);
            }
            None => assert_eq!(best.kernels, own),
        }
        // A probe that cannot run leaves the loaded kernels' rate.
        let none = GemmProbe::new("/nonexistent/rankwise-probe", ["x"]);
        let fallback = machine_gemm_peak(&rt, Precision::F64, Some(&none)).unwrap();
        assert_eq!(fallback.kernels, own);
        assert_eq!(fallback.loaded_flops, None);
        assert!(fallback.flops > 0.0);
        // A probe process that answers nothing readable counts as failed.
        let mute = GemmProbe::new("/bin/true", Vec::<String>::new());
        let fallback = machine_gemm_peak(&rt, Precision::F64, Some(&mute)).unwrap();
        assert_eq!(
            (fallback.kernels.as_str(), fallback.loaded_flops),
            (own.as_str(), None)
        );
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
