//! The products of LOBPCG's Rayleigh–Ritz step with its tall blocks (`n × c`: `n` the
//! matrix's columns, samples in a PCA; `c` up to three times the sketch), on the root rank's
//! cores.
//!
//! # Why
//! The step runs on the root while every actor waits for its result, so on one thread it is
//! a serial part of every pass that grows with `n` and not with the cluster: on the 2-core
//! AMD EPYC guest, a PCA of 20,000 samples (`plink.sh`'s QC row, 7,990 variants) spent 3.4–
//! 4.3 s of 14–17 s in it, 51 steps of about 66 ms, against about 20 ms of arithmetic.
//! Here the rows are cut into fixed chunks of [`CHUNK`] rows, taken by as many threads as
//! the rank has cores; sums over the rows add the chunks' products in chunk order, and the
//! thin SVD is a TSQR over the chunks (each chunk's panel factorization, then the QR of
//! their stacked R factors), so every result depends on `n` only, never on the number of
//! threads or ranks.
//!
//! Products are written in place, each thread into its chunks' rows of a column-major
//! block. They were stacked after the fact, a serial copy that at 16,384 samples (columns
//! 128 KiB apart: cache-set conflicts) made a step slower on two threads than on one; and
//! written row-major, the step's column-wise work (residuals, norms, the Ritz values) read
//! every value from its own cache line. A single chunk's thin SVD is the same TSQR (one
//! panel factorization), not LAPACK's `dgesdd`. Measured with `rayleigh_ritz_seconds`
//! (k = 10, l = 20, two threads) on the 2-core AMD EPYC guest, the builds in turn: 16,384
//! samples 57–61 → 32–36 ms a step, 20,000 samples 46 → 34–36 ms, 7,990 samples 28–30 →
//! 17–18 ms. Of a step at 16,000 samples on one thread, 24–27 ms were these products and
//! 13–16 ms the rest (copies, residuals, the small eigenproblem), which no thread shortens.
//!
//! The basis `[X, S, P]` and its products are given as blocks side by side
//! ([`Tall::atb_parts`], [`Tall::ab_parts`]) rather than copied into one block on one
//! thread first: at 20,000 samples the part no thread shortens went from 15–18 ms a step to
//! 9–10 ms, and the step on two threads from 38.5–41.4 ms to 34.7–36.2 ms (the products
//! by parts are smaller GEMMs, and took 2–3 ms more).
//!
//! The residuals of the step, their norms and the Ritz values (`lobpcg::residuals`,
//! `column_norms`, `column_dots`) go over the same chunks: on one thread of the 2-core
//! Intel Xeon guest at 200,000 samples (`rayleigh_ritz_seconds`, k = 10), the part of a
//! step that no thread shortened went from 143–147 ms to 75–78 ms; on two threads the step
//! took 331–375 ms against 374–377 ms, and the root's steps of an 8-pass PCA of 100,000
//! samples (`pca --rows 20000 --cols 100000 --chunk-rows 2500 -k 10 --max-passes 8`)
//! 1.54–1.67 s against 1.87–1.90 s.
//!
//! The threads are started for each product (scoped, so a panic is the caller's): about
//! 20 µs a thread, some fifteen products a step. That is nothing on a few cores; on a node
//! of 64 it is about 20 ms a step, as much as the step's arithmetic for 500,000 samples, and
//! the actors' own threads (the runtime's `map`) would serve it better.

use std::ops::Range;
use std::sync::Mutex;

use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayView2, ArrayViewMut2, Axis, ShapeBuilder};

use crate::kernels::{qr, small_svd, stack_rows, Keep, PanelFactor, Svd};
use crate::LinalgError;

/// Rows per chunk: fixed, so that sums over the rows run in one order whatever the number
/// of threads; large enough that a chunk's products run at BLAS-3 speed (4,096 rows of 60
/// columns: 2 MB).
pub(super) const CHUNK: usize = 4096;

/// The threads LOBPCG's Rayleigh–Ritz step uses on a root rank of `threads` cores for a
/// matrix of `samples` columns: one per chunk of 4,096 rows of its `n × c` blocks, at
/// most the rank's cores. The sizing model divides the step's calibrated work by it.
pub fn rayleigh_ritz_threads(samples: u64, threads: usize) -> usize {
    let chunks = samples.div_ceil(CHUNK as u64).max(1);
    (threads.max(1) as u64).min(chunks) as usize
}

thread_local! {
    /// Seconds this thread has spent in the products shared among the threads: what
    /// [`shared_seconds`] reads, so that the sizing model's calibration can tell the part
    /// of a step that more cores shorten from the part they do not.
    static SHARED: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// `f()`, its time added to this thread's [`SHARED`] seconds.
fn shared<R>(f: impl FnOnce() -> R) -> R {
    let start = std::time::Instant::now();
    let r = f();
    SHARED.with(|s| s.set(s.get() + start.elapsed().as_secs_f64()));
    r
}

/// Seconds this thread has spent in products shared among the threads, since it started.
pub(super) fn shared_seconds() -> f64 {
    SHARED.with(|s| s.get())
}

/// The root's threads for the step's tall products.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tall {
    threads: usize,
}

impl Tall {
    /// Products on `threads` threads (at least one: the caller's).
    pub(super) fn new(threads: usize) -> Tall {
        Tall {
            threads: threads.max(1),
        }
    }

    /// The chunks of `n` rows.
    fn chunks(n: usize) -> Vec<Range<usize>> {
        (0..n.div_ceil(CHUNK))
            .map(|i| i * CHUNK..((i + 1) * CHUNK).min(n))
            .collect()
    }

    /// `f(rows)` for every chunk of `n` rows, the results in chunk order. Chunk `i` goes to
    /// thread `i mod t`; a thread that cannot be started leaves its chunks to the caller's
    /// thread. A panic in a thread is the caller's (the scope re-raises it).
    pub(super) fn each<R: Send>(&self, n: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Vec<R> {
        shared(|| self.each_untimed(n, f))
    }

    fn each_untimed<R: Send>(&self, n: usize, f: impl Fn(Range<usize>) -> R + Sync) -> Vec<R> {
        let chunks = Self::chunks(n);
        let t = self.threads.min(chunks.len());
        if t <= 1 {
            return chunks.into_iter().map(&f).collect();
        }
        let (f, chunks) = (&f, &chunks);
        let share = move |w: usize| -> Vec<(usize, R)> {
            (w..chunks.len())
                .step_by(t)
                .map(|i| (i, f(chunks[i].clone())))
                .collect()
        };
        let shares: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
            let started: Vec<_> = (1..t)
                .map(|w| {
                    let spawned = std::thread::Builder::new()
                        .name(format!("rayleigh-ritz-{w}"))
                        .spawn_scoped(scope, move || share(w));
                    (w, spawned.ok())
                })
                .collect();
            let mut shares = vec![share(0)];
            for (w, handle) in started {
                shares.push(match handle {
                    Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    None => share(w),
                });
            }
            shares
        });
        let mut out: Vec<Option<R>> = (0..chunks.len()).map(|_| None).collect();
        for (i, r) in shares.into_iter().flatten() {
            out[i] = Some(r);
        }
        out.into_iter()
            .map(|r| r.expect("every chunk is computed once"))
            .collect()
    }

    /// `f(i, part)` for every chunk `i` of `out`'s rows, `part` its rows, chunk `i` on
    /// thread `i mod t` as in `each`: products written in place, in parallel, where
    /// stacking the chunks' own results afterwards was a serial copy of the whole block
    /// (with the subtraction of `project_out`, a fifth of a step on the 2-core guest).
    pub(super) fn each_rows_mut(
        &self,
        out: &mut Array2<f64>,
        f: impl Fn(usize, ArrayViewMut2<'_, f64>) + Sync,
    ) {
        shared(|| self.each_rows_mut_untimed(out, f))
    }

    fn each_rows_mut_untimed(
        &self,
        out: &mut Array2<f64>,
        f: impl Fn(usize, ArrayViewMut2<'_, f64>) + Sync,
    ) {
        type Share<'a> = Vec<(usize, ArrayViewMut2<'a, f64>)>;
        let t = self.threads.min(out.nrows().div_ceil(CHUNK)).max(1);
        let mut shares: Vec<Share<'_>> = (0..t).map(|_| Vec::new()).collect();
        for (i, part) in out.axis_chunks_iter_mut(Axis(0), CHUNK).enumerate() {
            shares[i % t].push((i, part));
        }
        let shares: Vec<Mutex<Share<'_>>> = shares.into_iter().map(Mutex::new).collect();
        let take =
            |w: usize| std::mem::take(&mut *shares[w].lock().unwrap_or_else(|e| e.into_inner()));
        let work = |share: Share<'_>| {
            for (i, part) in share {
                f(i, part);
            }
        };
        let (take, work) = (&take, &work);
        std::thread::scope(|scope| {
            let started: Vec<_> = (1..t)
                .filter_map(|w| {
                    std::thread::Builder::new()
                        .name(format!("rayleigh-ritz-{w}"))
                        .spawn_scoped(scope, move || work(take(w)))
                        .ok()
                })
                .collect();
            work(take(0));
            for h in started {
                h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            }
        });
        // The shares of threads that could not be started are the caller's.
        for w in 1..t {
            work(take(w));
        }
    }

    /// `aᵀ·b` over the rows of `a` and `b`, the chunks' products added in chunk order.
    pub(super) fn atb(&self, a: ArrayView2<'_, f64>, b: ArrayView2<'_, f64>) -> Array2<f64> {
        debug_assert_eq!(a.nrows(), b.nrows());
        let parts = self.each(a.nrows(), |r| {
            a.slice(s![r.clone(), ..]).t().dot(&b.slice(s![r, ..]))
        });
        let mut sum = Array2::zeros((a.ncols(), b.ncols()));
        for p in &parts {
            sum += p;
        }
        sum
    }

    /// `[a₁ … aₚ]ᵀ·[b₁ … b_q]` over the rows of blocks side by side, without forming them:
    /// each chunk's product block by block, the chunks' products added in chunk order.
    pub(super) fn atb_parts(
        &self,
        a: &[ArrayView2<'_, f64>],
        b: &[ArrayView2<'_, f64>],
    ) -> Array2<f64> {
        let n = a.first().map_or(0, |x| x.nrows());
        debug_assert!(a.iter().chain(b).all(|x| x.nrows() == n));
        let (ca, cb) = (
            a.iter().map(|x| x.ncols()).sum::<usize>(),
            b.iter().map(|x| x.ncols()).sum::<usize>(),
        );
        let parts = self.each(n, |r| {
            let mut m = Array2::zeros((ca, cb));
            let mut i0 = 0;
            for ai in a {
                let mut j0 = 0;
                for bj in b {
                    general_mat_mul(
                        1.0,
                        &ai.slice(s![r.clone(), ..]).t(),
                        &bj.slice(s![r.clone(), ..]),
                        0.0,
                        &mut m.slice_mut(s![i0..i0 + ai.ncols(), j0..j0 + bj.ncols()]),
                    );
                    j0 += bj.ncols();
                }
                i0 += ai.ncols();
            }
            m
        });
        let mut sum = Array2::zeros((ca, cb));
        for p in &parts {
            sum += p;
        }
        sum
    }

    /// `[a₁ … aₚ]·c` (`n × c.ncols()`, column-major) for blocks side by side, without
    /// forming them: each chunk's rows summed part by part in place.
    pub(super) fn ab_parts(
        &self,
        a: &[ArrayView2<'_, f64>],
        c: ArrayView2<'_, f64>,
    ) -> Array2<f64> {
        self.ab_parts_into(a, c, Array2::zeros((0, 0)))
    }

    /// [`Tall::ab_parts`] written over `reuse` where it has the product's shape and
    /// column-major layout (the same products, the same bits), a new block otherwise. A
    /// block of `n × l` values at biobank sample counts (80 MB at 500,000 × 20) is past the
    /// allocator's largest reused size: each new one is mapped afresh and its pages
    /// zeroed by the kernel on first touch, a fifth of a block Lanczos step there.
    pub(super) fn ab_parts_into(
        &self,
        a: &[ArrayView2<'_, f64>],
        c: ArrayView2<'_, f64>,
        reuse: Array2<f64>,
    ) -> Array2<f64> {
        let n = a.first().map_or(0, |x| x.nrows());
        let mut out = reused(reuse, (n, c.ncols()));
        self.each_rows_mut(&mut out, |i, mut part| {
            let rows = i * CHUNK..i * CHUNK + part.nrows();
            let mut k0 = 0;
            for (p, ai) in a.iter().enumerate() {
                let beta = if p == 0 { 0.0 } else { 1.0 };
                general_mat_mul(
                    1.0,
                    &ai.slice(s![rows.clone(), ..]),
                    &c.slice(s![k0..k0 + ai.ncols(), ..]),
                    beta,
                    &mut part,
                );
                k0 += ai.ncols();
            }
        });
        out
    }

    /// `a := a − q·(qᵀa)`, each chunk of `a` updated in place.
    pub(super) fn project_out(&self, a: &mut Array2<f64>, q: ArrayView2<'_, f64>) {
        let c = self.atb(q, a.view());
        self.each_rows_mut(a, |i, mut part| {
            let rows = i * CHUNK..i * CHUNK + part.nrows();
            general_mat_mul(-1.0, &q.slice(s![rows, ..]), &c, 1.0, &mut part);
        });
    }

    /// The thin SVD of `a` (signs as [`small_svd`] fixes them): for a tall `a`, a TSQR over
    /// the chunks (each chunk's [`PanelFactor`], the QR of their stacked R factors, the SVD
    /// of its R, and `U` chunk by chunk); otherwise [`small_svd`].
    pub(super) fn svd(&self, a: ArrayView2<'_, f64>) -> Result<Svd, LinalgError> {
        let (n, c) = a.dim();
        if c == 0 || n < 4 * c {
            return small_svd(a);
        }
        let factors = self.each(n, |r| {
            PanelFactor::compute(r.len(), c, Keep::Scratch, |rows, mut out| {
                out.assign(&a.slice(s![r.start + rows.start..r.start + rows.end, ..]));
                Ok(())
            })
        });
        let factors = factors.into_iter().collect::<Result<Vec<_>, _>>()?;
        let stacked = stack_rows(&factors.iter().map(|f| f.r.view()).collect::<Vec<_>>());
        let (qs, r) = qr(stacked)?;
        let (ur, s, vt) = small_svd(r.view())?;
        let cs = qs.dot(&ur);
        let mut offsets = Vec::with_capacity(factors.len());
        let mut at = 0;
        for f in &factors {
            offsets.push(at);
            at += f.r.nrows();
        }
        let (factors, offsets, cs) = (&factors, &offsets, &cs);
        let mut u = Array2::zeros((n, cs.ncols()).f());
        self.each_rows_mut(&mut u, |j, mut part| {
            let kj = factors[j].r.nrows();
            part.assign(&factors[j].apply(cs.slice(s![offsets[j]..offsets[j] + kj, ..])));
        });
        Ok((u, s, vt))
    }
}

/// `reuse` where it is an `n × c` column-major block (its values to be overwritten), a new
/// zeroed one otherwise.
pub(super) fn reused(reuse: Array2<f64>, (n, c): (usize, usize)) -> Array2<f64> {
    if reuse.dim() == (n, c) && reuse.t().is_standard_layout() {
        reuse
    } else {
        Array2::zeros((n, c).f())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    fn drawn(rng: &mut Rng, n: usize, c: usize) -> Array2<f64> {
        Array2::from_shape_fn((n, c), |_| rng.value() as f64 - 0.5)
    }

    /// Every product gives the same bits on 1, 2, 3 and 5 threads, and the products and
    /// the SVD are right (against plain products and LAPACK's singular values), on fresh
    /// shapes around the chunk size.
    #[test]
    fn tall_products_do_not_depend_on_the_threads_and_are_right() {
        let mut rng = Rng::fresh();
        for _ in 0..4 {
            let n = CHUNK + rng.below(3 * CHUNK);
            let (c, d) = (1 + rng.below(40), 1 + rng.below(20));
            let a = drawn(&mut rng, n, c);
            let b = drawn(&mut rng, n, d);
            let small = drawn(&mut rng, c, d);
            let one = Tall::new(1);
            let atb = one.atb(a.view(), b.view());
            let ab = one.ab_parts(&[a.view()], small.view());
            // The same products of the blocks cut in parts, as LOBPCG's `[X, S, P]` are.
            fn cut(x: &Array2<f64>, at: usize) -> [ArrayView2<'_, f64>; 2] {
                let at = at.min(x.ncols());
                [x.slice(s![.., ..at]), x.slice(s![.., at..])]
            }
            let (ka, kb) = (rng.below(c + 1), rng.below(d + 1));
            let atb_p = one.atb_parts(&cut(&a, ka), &cut(&b, kb));
            let ab_p = one.ab_parts(&cut(&a, ka), small.view());
            assert!((&atb_p - &atb)
                .iter()
                .all(|x| x.abs() < 1e-12 * (n as f64).sqrt()));
            assert!((&ab_p - &ab).iter().all(|x| x.abs() < 1e-12));
            let (u, s, vt) = one.svd(a.view()).unwrap();
            for t in [2, 3, 5] {
                let many = Tall::new(t);
                assert_eq!(many.atb(a.view(), b.view()), atb, "{n}×{c}: aᵀb on {t}");
                assert_eq!(
                    many.ab_parts(&[a.view()], small.view()),
                    ab,
                    "{n}×{c}: ab on {t}"
                );
                assert_eq!(
                    many.atb_parts(&cut(&a, ka), &cut(&b, kb)),
                    atb_p,
                    "parts on {t}"
                );
                assert_eq!(
                    many.ab_parts(&cut(&a, ka), small.view()),
                    ab_p,
                    "parts on {t}"
                );
                let (u2, s2, vt2) = many.svd(a.view()).unwrap();
                assert!(u2 == u && s2 == s && vt2 == vt, "{n}×{c}: svd on {t}");
            }
            let scale = (n as f64).sqrt();
            assert!((&atb - &a.t().dot(&b))
                .iter()
                .all(|x| x.abs() < 1e-12 * scale));
            assert!((&ab - &a.dot(&small)).iter().all(|x| x.abs() < 1e-12));
            let (_, s_ref, _) = small_svd(a.view()).unwrap();
            for (x, y) in s.iter().zip(&s_ref) {
                assert!((x - y).abs() <= 1e-12 * s_ref[0], "{n}×{c}: σ {x} vs {y}");
            }
            let back = u.dot(&Array2::from_diag(&s)).dot(&vt);
            let err = (&back - &a).iter().fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(err < 1e-12, "{n}×{c}: ‖UΣVᵀ − A‖∞ = {err:e}");
            let orth = (&u.t().dot(&u) - &Array2::<f64>::eye(c))
                .iter()
                .fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(orth < 1e-13, "{n}×{c}: ‖UᵀU − I‖∞ = {orth:e}");
        }
    }
}
