//! The solvers of [`super::rsvd`] that iterate to a tolerance, with every returned
//! component's residual measured: LOBPCG on `AᵀA` ([`Method::Lobpcg`], the default) and
//! thick-restart block Lanczos on `AᵀA` ([`Method::Lanczos`], a genotype PCA's default).
//! They share the passes, the root's protocol and the last pass; they differ in the search
//! space the root keeps between passes.
//!
//! # Why block Lanczos for genotypes
//!
//! A genotype pass expands the stored codes in registers, so its cost grows with its
//! columns (a 50,000 × 20,000 fileset, f32 tiles, 2-core Xeon: 0.235 s a pass at 2 columns,
//! 0.317 s at 8, 0.707 s at 20). LOBPCG's block is `l` wide; block Lanczos's passes are
//! [`LANCZOS_BLOCK`] wide, and its basis (at most `2l + 80` columns, restarted to its first
//! `2l` Ritz vectors) makes up for the narrower block: on the bulk it takes about 1.5 times
//! LOBPCG's passes. Measured, k = 10, every residual to 1e-6: a generated 50,000 × 20,000
//! cohort 19.1 s (85 passes) against LOBPCG's 35.1 s (62), the 200,000 × 20,000 `.bed` of
//! the PLINK 2 comparison 96.0 s (95) against 128.2 s (64), eigenvalues equal to 8.7e-9.
//! A NumPy model of the iteration (40,000 × 4,000, f64, passes to 1e-6): blocks of 1, 4, 8
//! and 10 with a basis of 120 took 232, 82, 59 and 53 passes, LOBPCG (block 20) 43.
//!
//! A larger basis saves few passes for its longer steps on the root: on the `.bed` above
//! (k = 10, l = 20, one run each on the same 2-core guest), at most `2l + 80` columns
//! kept `2l` took 95 passes (88.7 s in passes, 3.4 s in steps), `2l + 240` 88 (80.5 s, 5.1
//! s), `2l + 480` 87 (72.3 s, 9.5 s), and `2l + 240` keeping `3l` 87 (74.0 s, 4.8 s). The
//! flat bulk's convergence, not the restarts, sets the count.
//!
//! The next block is the last block's product made orthonormal to the basis (the Krylov
//! continuation), which holds the residual of every Ritz vector, so a restart loses none.
//! That holds only for a basis built so from the start: restarted from other vectors (the
//! f32 → f64 move, a failed check) it would lack the directions of their residuals that no
//! block holds (a model of it stuck at 4.7e-4), so there LOBPCG takes over.
//!
//! # Why LOBPCG
//!
//! Genotype matrices have a few strong components (population structure) over a flat
//! Marchenko–Pastur bulk whose top eigenvalues lie within 0.1 % of each other. Subspace
//! iteration converges a component at the rate `(σ_{l+1}/σᵢ)^{2q}`, which is all but 1 there:
//! at q = 2 PCs 3–10 came out as unconverged mixtures with eigenvalues 20 % low. Measured in a
//! NumPy model of these passes on Balding–Nichols cohorts (3 populations, F_ST 0.1;
//! 40,000 variants × 1,500 and × 4,000 samples, k = 10, the minimum over PCs of |corr| with
//! the exact eigenvectors), passes to reach |corr| ≥ 0.9999:
//!
//! | solver (block 20 unless said) | 40k × 1.5k | 40k × 4k | memory beyond the panels |
//! |---|---|---|---|
//! | subspace iteration + Rayleigh–Ritz (2 reads an iteration) | > 50 (|corr| 0.05 at 50) | — | `m × l` |
//! | thick-restart block Davidson, basis 160, keep 40 | — | 30 | `2 × n × 160` |
//! | thick-restart block Davidson, block 10 / 15, basis 120 | — | > 30 | `2 × n × 120` |
//! | LOBPCG, block 30 | — | 22 | `≈ 12 × n × l` |
//! | **LOBPCG, block 20** | **23** | **28** | `≈ 12 × n × l` |
//!
//! On in-memory 20,000 × 1,000 matrices `U·diag(σ)·Vᵀ`, k = 10, passes (the last, which
//! measures the result, included) until every residual is at most 1e-6 of σ₁:
//!
//! | spectrum | LOBPCG, block 20 | subspace iteration, l = 20, fused (1 read an iteration) |
//! |---|---|---|
//! | geometric, ρ = 0.9 | 5 | 8 |
//! | geometric, ρ = 0.5 | 3 | 3 |
//! | 3 strong over a tail within 2 % of flat | 35 | > 300 |
//! | pairs equal to 1e-9 (clustered), decaying 0.8 a pair | 5 | 7 |
//!
//! LOBPCG's three-term recurrence matched or beat a Krylov basis eight times larger, its
//! memory does not grow with the passes, and each iteration is one fused pass: the range pass
//! of the randomized SVD already sums `AᵀY` while it forms `Y = A·S`, so `AᵀA·S` costs one
//! read of the matrix. No `m`-sized basis is kept between passes.
//!
//! # The iteration
//!
//! The block `X` (`n × l`, `l = k + oversample`) starts as the orthonormalized Gaussian
//! `Ω`. Each pass computes `G·S = Aᵀ(A·S)` for the search block `S`; the tree's root then
//! makes the Rayleigh–Ritz step on `[X, S, P]` (Knyazev 2001, with `P` kept orthonormal to
//! `X` as Hetmaniuk & Lehoucq 2006 do), forms the residuals `GX − XΘ` and the next `S` from
//! those of the components not yet converged (and of the `oversample` guard vectors), and
//! broadcasts `S`. Only `n × l` blocks travel; every rank follows the root, so the result is
//! the same for any number of ranks and actors.
//!
//! # Convergence and the last pass
//!
//! With `σᵢ = √θᵢ` and `uᵢ = A·xᵢ/σᵢ`, `‖Aᵀuᵢ − σᵢxᵢ‖ = ‖Gxᵢ − θᵢxᵢ‖/σᵢ`: the iteration's own
//! residual, divided by `σ₁` to compare with `tol`. When all `k` meet it (or the passes are
//! spent), a last pass forms `Y = A·X` and `AᵀY = G·X` again, in f64; the TSQR `Y = QR` and
//! the SVD `R = U_R Σ W_Rᵀ` give `U = Q·U_R`, `V = X·W_R` and `Σ` (orthonormal `U` and `V`,
//! and `σ` without the squaring of `AᵀA`), and the residuals reported are those of these
//! very triplets, from `G·X` of the same pass. If that pass finds a component over `tol`
//! (f32 tiles fooled the iteration), the iteration goes on in f64 from there.
//!
//! # Precision
//!
//! With [`RsvdOptions::mixed_precision`] the passes start in f32 tiles (twice the GEMM rate)
//! and move to f64 when f32 stops improving the residuals (eight passes without a 5 % fall),
//! or when the last pass, in f64, finds a component over the tolerance. The first f64 pass
//! computes `G·X` afresh with `G·S`, so no f32 rounding stays in the iterates.

use super::tall::{Tall, CHUNK};
use super::*;
use crate::kernels::fix_signs;
use ndarray::{Array1, ArrayView2, ShapeBuilder};
use ndarray_linalg::Eigh;
use rankwise_transports::CommCounts;

/// What the root tells every rank to do next.
const GRAM: f64 = 0.0;
const CHECK: f64 = 1.0;
const DONE: f64 = 2.0;

/// Why the iteration ended unconverged.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    None,
    MaxPasses,
    Stalled,
}

impl Stop {
    fn code(self) -> f64 {
        match self {
            Stop::None => 0.0,
            Stop::MaxPasses => 1.0,
            Stop::Stalled => 2.0,
        }
    }

    fn from_code(c: f64) -> Stop {
        match c as u8 {
            1 => Stop::MaxPasses,
            2 => Stop::Stalled,
            _ => Stop::None,
        }
    }

    fn message(self, max_passes: usize, precision: Precision) -> Option<String> {
        match self {
            Stop::None => None,
            Stop::MaxPasses => Some(format!(
                "the pass limit ({max_passes}) was reached; raise `max_passes`"
            )),
            Stop::Stalled => Some(format!(
                "the residuals stopped falling in {} tiles, whose rounding is above the \
                 tolerance; use `precision` f64 or auto",
                precision.name()
            )),
        }
    }
}

fn precision_code(p: Precision) -> f64 {
    match p {
        Precision::F32 => 0.0,
        Precision::F64 => 1.0,
    }
}

fn precision_of(c: f64) -> Precision {
    if c == 0.0 {
        Precision::F32
    } else {
        Precision::F64
    }
}

/// The iteration's state, on the tree's root only.
struct Iterate {
    k: usize,
    l: usize,
    tol: f64,
    max_passes: usize,
    mixed: bool,
    precision: Precision,
    x: Array2<f64>,
    gx: Array2<f64>,
    /// The last step's residuals, whose storage the next step's are written over.
    r: Array2<f64>,
    /// `P` and `G·P` (LOBPCG).
    p: Option<(Array2<f64>, Array2<f64>)>,
    /// LOBPCG's `X` and `G·X` that the last step replaced, whose storage the next step's
    /// are written over (empty blocks before there are any): at biobank sample counts each is past the allocator's largest reused
    /// size, and a fresh one is mapped and its pages zeroed by the kernel (`rayleigh_ritz_step
    /// 2 500000 10 lobpcg` on the 2-core AMD EPYC guest, alternating: 835–887 against
    /// 878–1,015 ms a step).
    spare: (Array2<f64>, Array2<f64>),
    /// [`Method::Lanczos`] rather than LOBPCG.
    lanczos: bool,
    /// Its basis, from the first pass on.
    krylov: Option<Krylov>,
    /// The seed of the Gaussian block that pads `X` for a check pass made before the
    /// block Lanczos basis holds `l` columns.
    pad_seed: u64,
    /// The block whose product the pass under way computes.
    s: Array2<f64>,
    /// The pass under way computes `G·[X | S]` (`X` afresh) rather than `G·S`.
    with_x: bool,
    /// No `X` yet: the pass under way computes `G·X₀`.
    initial: bool,
    history: Vec<f64>,
    passes: usize,
    stop: Stop,
    /// The root's threads for the products with the tall blocks.
    tall: Tall,
}

/// Columns of a block of [`Method::Lanczos`]: the width of its passes. A genotype pass of
/// 8 columns costs about what one of 6 does (the fused kernels' sweeps), and 45 % of one of
/// 20 (a 50,000 × 20,000 fileset, f32 tiles, 2-core Xeon: 0.317 s against 0.707 s).
pub const LANCZOS_BLOCK: usize = 8;

/// The basis of [`Method::Lanczos`] for a sketch of `l` columns and `n` samples: the Ritz
/// vectors a restart keeps, and the most columns it holds (`2l` kept, and ten blocks).
pub(super) fn lanczos_basis(l: usize, n: usize) -> (usize, usize) {
    let most = (2 * l + 10 * LANCZOS_BLOCK).min(n).max(l);
    let keep = (2 * l).min(most.saturating_sub(LANCZOS_BLOCK)).max(l);
    (keep, most)
}

/// The bytes the root holds for [`Method::Lanczos`]'s iterates: the basis and its
/// products, `X`, `G·X`, the residuals, a restart's new basis and its products, and a block
/// and its product, `n` values each column; LOBPCG's, after the hand-over, are fewer.
pub(super) fn lanczos_bytes(l: usize, n: u64) -> u64 {
    let (keep, most) = lanczos_basis(l, n.min(usize::MAX as u64) as usize);
    let columns = 2 * most + 3 * l + 2 * keep + 2 * (l + LANCZOS_BLOCK);
    (8 * columns as u64)
        .saturating_mul(n)
        .max((96 * l as u64).saturating_mul(n))
}

/// The thick-restart block Lanczos basis on `G = AᵀA`: orthonormal blocks `Q`, their
/// products `G·Q` (kept, so that the Rayleigh–Ritz step needs no three-term recurrence to
/// hold in f32), and `H = QᵀGQ`.
struct Krylov {
    q: Vec<Array2<f64>>,
    gq: Vec<Array2<f64>>,
    h: Array2<f64>,
    /// The Ritz vectors' coordinates in `Q` (largest first) and their values, of the last
    /// Rayleigh–Ritz step.
    z: Array2<f64>,
    theta: Vec<f64>,
    keep: usize,
    most: usize,
}

impl Krylov {
    fn columns(&self) -> usize {
        self.q.iter().map(|b| b.ncols()).sum()
    }

    /// The basis `[x]` (orthonormal), its products `[gx]`.
    fn from(tall: Tall, x: &Array2<f64>, gx: &Array2<f64>, (keep, most): (usize, usize)) -> Krylov {
        let h = tall.atb(x.view(), gx.view());
        Krylov {
            q: vec![x.clone()],
            gq: vec![gx.clone()],
            h: (&h + &h.t()) * 0.5,
            z: Array2::zeros((0, 0)),
            theta: Vec::new(),
            keep,
            most,
        }
    }

    /// Appends the block `s` (orthonormal, and orthogonal to the basis) and its product.
    fn append(&mut self, tall: Tall, s: Array2<f64>, gs: Array2<f64>) {
        let j = self.columns();
        let b = s.ncols();
        self.q.push(s);
        let views: Vec<_> = self.q.iter().map(|a| a.view()).collect();
        // `[Q s]ᵀ·G·s`: the new columns of `H`, and by symmetry its new rows.
        let hc = tall.atb_parts(&views, &[gs.view()]);
        let mut h = Array2::zeros((j + b, j + b));
        h.slice_mut(s![..j, ..j]).assign(&self.h);
        h.slice_mut(s![.., j..]).assign(&hc);
        h.slice_mut(s![j.., ..j]).assign(&hc.slice(s![..j, ..]).t());
        let d = hc.slice(s![j.., ..]).to_owned();
        h.slice_mut(s![j.., j..]).assign(&((&d + &d.t()) * 0.5));
        self.h = h;
        self.gq.push(gs);
    }

    /// The Rayleigh–Ritz step on the basis: its first `l` Ritz vectors (fewer while it
    /// holds fewer columns) and their products, written over `reuse` where it has their
    /// shape.
    fn ritz(
        &mut self,
        tall: Tall,
        l: usize,
        reuse: (Array2<f64>, Array2<f64>),
    ) -> Result<(Array2<f64>, Array2<f64>), LinalgError> {
        let (w, v) = self
            .h
            .eigh(UPLO::Lower)
            .map_err(|e| LinalgError::Lapack(format!("Rayleigh–Ritz eigenproblem: {e}")))?;
        let c = v.ncols();
        self.theta = (0..c).rev().map(|i| w[i]).collect();
        self.z = Array2::from_shape_fn((c, c), |(i, j)| v[[i, c - 1 - j]]);
        let zl = self.z.slice(s![.., ..l.min(c)]);
        let q: Vec<_> = self.q.iter().map(|a| a.view()).collect();
        let gq: Vec<_> = self.gq.iter().map(|a| a.view()).collect();
        Ok((
            tall.ab_parts_into(&q, zl, reuse.0),
            tall.ab_parts_into(&gq, zl, reuse.1),
        ))
    }

    /// The thick restart: the basis becomes its first `keep` Ritz vectors. The next block
    /// (the last block's continuation, made before) holds the residuals of every one of
    /// them, so the basis stays a Krylov–Schur one.
    fn restart(&mut self, tall: Tall) {
        let keep = self.keep.min(self.z.ncols());
        let zk = self.z.slice(s![.., ..keep]);
        let q: Vec<_> = self.q.iter().map(|a| a.view()).collect();
        let gq: Vec<_> = self.gq.iter().map(|a| a.view()).collect();
        let (nq, ngq) = (tall.ab_parts(&q, zk), tall.ab_parts(&gq, zk));
        self.q = vec![nq];
        self.gq = vec![ngq];
        self.h = Array2::from_diag(&Array1::from(self.theta[..keep].to_vec()));
    }

    /// The next block: the Krylov continuation `G·s` of the last block, made orthonormal
    /// to the basis; where that has nothing new (the basis holds an invariant subspace),
    /// the residuals `r` of the components `pick` names. The basis restarts first where
    /// the block would not fit.
    fn next_block(
        &mut self,
        tall: Tall,
        r: &Array2<f64>,
        pick: &[usize],
    ) -> Result<Array2<f64>, LinalgError> {
        let against: Vec<_> = self.q.iter().map(|a| a.view()).collect();
        let last = self.gq.last().expect("a basis has a block").clone();
        let mut s = orthonormal_rest(tall, last, &against)?;
        if s.ncols() == 0 {
            let mut rs = Array2::zeros((r.nrows(), pick.len()).f());
            for (c, &j) in pick.iter().enumerate() {
                rs.column_mut(c).assign(&r.column(j));
            }
            s = orthonormal_rest(tall, rs, &against)?;
        }
        if self.columns() + s.ncols() > self.most {
            self.restart(tall);
            s = orthonormal_rest(tall, s, &[self.q[0].view()])?;
            let room = self.most.saturating_sub(self.columns());
            if s.ncols() > room {
                s = s.slice(s![.., ..room]).to_owned();
            }
        }
        Ok(s)
    }
}

/// The components whose residuals start a [`Method::Lanczos`] block where the Krylov
/// continuation has nothing new: those of the `k` still over `tol`, furthest first, then
/// the guard vectors beyond `k`, furthest first, at most [`LANCZOS_BLOCK`].
fn lanczos_pick(res: &[f64], k: usize, tol: f64) -> Vec<usize> {
    let by_residual = |mut v: Vec<usize>| {
        v.sort_by(|&a, &b| res[b].total_cmp(&res[a]).then(a.cmp(&b)));
        v
    };
    let open = by_residual((0..k.min(res.len())).filter(|&j| res[j] > tol).collect());
    let guards = by_residual((k.min(res.len())..res.len()).collect());
    open.into_iter().chain(guards).take(LANCZOS_BLOCK).collect()
}

/// `a`'s columns made orthonormal to `against` (orthonormal columns each) and to each other;
/// columns that fall below `1e-10` of the largest norm `a` had (dependent on the rest) are
/// dropped.
fn orthonormal_rest(
    tall: Tall,
    a: Array2<f64>,
    against: &[ArrayView2<'_, f64>],
) -> Result<Array2<f64>, LinalgError> {
    let scale = column_norms(tall, &a).into_iter().fold(0.0f64, f64::max);
    let mut a = a;
    let project = |a: &mut Array2<f64>| {
        for q in against {
            if q.ncols() > 0 {
                tall.project_out(a, q.view());
            }
        }
    };
    // Twice is enough (Giraud et al. 2005); a third after the factorization below catches
    // the directions LAPACK completes for dependent columns.
    project(&mut a);
    project(&mut a);
    if scale == 0.0 || a.ncols() == 0 {
        return Ok(Array2::zeros((a.nrows(), 0)));
    }
    // `u`'s first `keep` columns, copied only when some go (a copy of the whole block on
    // one thread, where they all stay).
    let first = |u: Array2<f64>, keep: usize| {
        if keep == u.ncols() {
            u
        } else {
            u.slice(s![.., ..keep]).to_owned()
        }
    };
    let (u, s, _) = tall.svd(a.view())?;
    // `a` is read no more: its room is the second factorization's.
    drop(a);
    let keep = s.iter().take_while(|&&v| v > 1e-10 * scale).count();
    let mut q = first(u, keep);
    project(&mut q);
    if keep == 0 {
        return Ok(q);
    }
    let (u, s, _) = tall.svd(q.view())?;
    let keep = s.iter().take_while(|&&v| v > 0.5).count();
    Ok(first(u, keep))
}

/// The eigenpairs of the symmetric `basisᵀ·gb`, largest first, for a basis and its
/// products given as blocks side by side.
fn rayleigh_ritz(
    tall: Tall,
    basis: &[ArrayView2<'_, f64>],
    gb: &[ArrayView2<'_, f64>],
) -> Result<(Vec<f64>, Array2<f64>), LinalgError> {
    let m = tall.atb_parts(basis, gb);
    let sym = (&m + &m.t()) * 0.5;
    let (w, v) = sym
        .eigh(UPLO::Lower)
        .map_err(|e| LinalgError::Lapack(format!("Rayleigh–Ritz eigenproblem: {e}")))?;
    let c = v.ncols();
    let order: Vec<usize> = (0..c).rev().collect();
    let theta = order.iter().map(|&i| w[i]).collect();
    let vecs = Array2::from_shape_fn((v.nrows(), c), |(i, j)| v[[i, order[j]]]);
    Ok((theta, vecs))
}

/// `‖Gxᵢ − θᵢxᵢ‖ / (σᵢσ₁)`, `σᵢ = √θᵢ`: the residual `‖Aᵀuᵢ − σᵢxᵢ‖/σ₁` of `uᵢ = Axᵢ/σᵢ`.
/// The residual vectors are formed, and their norms summed, chunk by chunk of rows on the
/// root's threads ([`column_norms`]): on one thread this was about 20 ms of a 560 ms step
/// at 200,000 samples, a part no core shortened.
fn residuals(
    tall: Tall,
    x: &Array2<f64>,
    gx: &Array2<f64>,
    theta: &[f64],
    reuse: Array2<f64>,
) -> (Vec<f64>, Array2<f64>) {
    let s1 = theta.first().copied().unwrap_or(0.0).max(0.0).sqrt();
    // Column-major, as the step's other blocks: its columns are read one at a time. Written
    // over `reuse` (the last step's) where it has the shape.
    let mut r = tall::reused(reuse, gx.dim());
    tall.each_rows_mut(&mut r, |i, mut part| {
        let rows = i * CHUNK..i * CHUNK + part.nrows();
        part.assign(&gx.slice(s![rows.clone(), ..]));
        for (j, &t) in theta.iter().enumerate() {
            part.column_mut(j)
                .scaled_add(-t, &x.slice(s![rows.clone(), j]));
        }
    });
    let norms = column_norms(tall, &r);
    let out = theta
        .iter()
        .zip(norms)
        .map(|(&t, norm)| {
            // A zero singular value's triplet has no `u` to speak of: its residual is
            // `‖Gx‖` over σ₁², the same scale as the rest.
            let si = t.max(0.0).sqrt().max(s1 * 1e-8);
            // A zero matrix's triplets (σ₁ = 0 and `Gx = 0`) meet any tolerance: 0/0 read
            // as an infinite residual, "not converged".
            let r = if norm == 0.0 { 0.0 } else { norm / si };
            relative(r, s1)
        })
        .collect();
    (out, r)
}

/// The 2-norm of every column of `a`, scaled by the column's largest entry as LAPACK's
/// `dnrm2` is: a product with `G = AᵀA` is of the order σ², and its plain sum of squares
/// (σ⁴) underflows to zero for σ below about 1e-77, which read as every residual being 0
/// (a 1e-100-scaled matrix "converged" after one pass to a σ₁ half the true one). Over
/// the fixed chunks of rows of [`Tall`]: each chunk's largest entries, then each chunk's
/// sums of squares over them, added in chunk order, so the result depends on the rows
/// only, never on the threads.
fn column_norms(tall: Tall, a: &Array2<f64>) -> Vec<f64> {
    let c = a.ncols();
    let chunk = |rows: std::ops::Range<usize>| a.slice(s![rows, ..]);
    let big = tall
        .each(a.nrows(), |rows| {
            let part = chunk(rows);
            (0..c)
                .map(|j| part.column(j).iter().fold(0.0f64, |m, &x| m.max(x.abs())))
                .collect::<Vec<f64>>()
        })
        .into_iter()
        .fold(vec![0.0f64; c], |mut m, part| {
            for (m, p) in m.iter_mut().zip(part) {
                *m = m.max(p);
            }
            m
        });
    let sums = tall.each(a.nrows(), |rows| {
        let part = chunk(rows);
        (0..c)
            .map(|j| {
                let b = big[j];
                if b == 0.0 || !b.is_finite() {
                    return 0.0;
                }
                part.column(j)
                    .iter()
                    .map(|&x| (x / b) * (x / b))
                    .sum::<f64>()
            })
            .collect::<Vec<f64>>()
    });
    let sums = add_in_chunk_order(sums, c);
    big.iter()
        .zip(sums)
        .map(|(&b, s)| {
            if b == 0.0 || !b.is_finite() {
                b
            } else {
                b * s.sqrt()
            }
        })
        .collect()
}

/// `xⱼ·gxⱼ` of every column pair, over the fixed chunks of rows of [`Tall`], added in
/// chunk order.
fn column_dots(tall: Tall, x: &Array2<f64>, gx: &Array2<f64>) -> Vec<f64> {
    let c = x.ncols();
    let parts = tall.each(x.nrows(), |rows| {
        let (xp, gp) = (x.slice(s![rows.clone(), ..]), gx.slice(s![rows, ..]));
        (0..c)
            .map(|j| xp.column(j).dot(&gp.column(j)))
            .collect::<Vec<f64>>()
    });
    add_in_chunk_order(parts, c)
}

/// The sums of `c` columns over the chunks' partial sums, added in chunk order.
fn add_in_chunk_order(parts: Vec<Vec<f64>>, c: usize) -> Vec<f64> {
    parts.into_iter().fold(vec![0.0f64; c], |mut acc, part| {
        for (a, p) in acc.iter_mut().zip(part) {
            *a += p;
        }
        acc
    })
}

impl Iterate {
    /// The iteration from the orthonormal block `x0` (`n × l`), for `k` components to
    /// `tol` in at most `max_passes`, its first pass in `precision`.
    fn new(
        (k, l): (usize, usize),
        (tol, max_passes): (f64, usize),
        (mixed, precision): (bool, Precision),
        (lanczos, pad_seed): (bool, u64),
        x0: Array2<f64>,
        tall: Tall,
    ) -> Iterate {
        // Block Lanczos starts from the first block of `X₀`.
        let start = if lanczos {
            x0.slice(s![.., ..LANCZOS_BLOCK.min(l)]).to_owned()
        } else {
            x0.clone()
        };
        Iterate {
            lanczos,
            krylov: None,
            pad_seed,
            k,
            l,
            tol,
            max_passes,
            mixed,
            precision,
            gx: Array2::zeros((x0.nrows(), 0)),
            r: Array2::zeros((0, 0)),
            s: start,
            x: x0,
            p: None,
            spare: Default::default(),
            with_x: false,
            initial: true,
            history: Vec::new(),
            passes: 0,
            stop: Stop::None,
            tall,
        }
    }

    /// The command for the next pass, after a pass whose products are absorbed.
    fn next(&mut self) -> Result<Vec<f64>, LinalgError> {
        let theta = self.theta();
        let reuse = std::mem::replace(&mut self.r, Array2::zeros((0, 0)));
        let (res, r) = residuals(self.tall, &self.x, &self.gx, &theta, reuse);
        // (Block Lanczos's first passes have fewer Ritz vectors than `l`: none has met.)
        let whole = res.len() == self.l;
        let worst = res[..self.k.min(res.len())]
            .iter()
            .fold(0.0f64, |a, &b| a.max(b));
        self.history.push(worst);
        let h = &self.history;
        // LOBPCG's residuals plateau for a few passes and fall again (in f64 too: 1.4e-3,
        // 1.2e-3, 1.2e-3, 1.0e-3 on a 40,000 × 1,500 cohort), so a stall is eight passes
        // without a 5 % fall.
        // Block Lanczos's residuals plateau longer, through its restarts (4.4e-4 to 5.0e-4
        // and back over 15 passes, in f64 as in f32, on a 50,000 × 20,000 cohort): twenty
        // passes, two restarts' worth, without a 5 % fall.
        let window = if self.lanczos { 20 } else { 8 };
        let stalled = whole && h.len() > window && worst > 0.95 * h[h.len() - 1 - window];
        // No estimate of f32's floor decides the move to f64: the one tried (2·ε₃₂·σ₁/σₖ)
        // was 5–10× too pessimistic (f32 reached 8.5e-7 at σ₁/σ₁₀ = 8.6 and 8.9e-7 at 18.6,
        // where it predicted 2e-6 and 4.4e-6) and moved 19 of 54 passes of a 20,000 × 20,000
        // PCA to f64 for nothing (68.3 s against 56.6 s in f32 alone). f32 runs until it
        // stalls; the last pass, in f64, says whether it was enough.
        let done = whole && res[..self.k].iter().all(|&v| v <= self.tol);
        if done || self.passes + 1 >= self.max_passes {
            if !done {
                self.stop = Stop::MaxPasses;
            }
            return self.check();
        }
        if stalled && self.precision == Precision::F32 {
            if self.mixed {
                self.precision = Precision::F64;
                self.with_x = true;
                // The pass of `G·[X | S]` is twice as wide: its blocks take the room the
                // spares held (the root's plan counts twelve blocks of `n × l`).
                self.spare = Default::default();
                // Block Lanczos hands over to LOBPCG for the f64 passes: a Krylov basis
                // restarted from `X` alone lacks the directions of `X`'s residuals that no
                // block holds (a model of it stuck at 4.7e-4), where LOBPCG's search block
                // is those residuals.
                self.hand_over_to_lobpcg();
            } else {
                self.stop = Stop::Stalled;
                return self.check();
            }
        }
        let s = if let Some(kr) = &mut self.krylov {
            let pick = lanczos_pick(&res, self.k, self.tol);
            kr.next_block(self.tall, &r, &pick)?
        } else {
            // The search block: residuals of the components still over `tol`, and of the
            // guard vectors beyond `k`, which keep the gap to the rest of the spectrum open.
            let active: Vec<usize> = (0..self.l)
                .filter(|&j| j >= self.k || res[j] > self.tol)
                .collect();
            let mut rs = Array2::zeros((r.nrows(), active.len()));
            for (c, &j) in active.iter().enumerate() {
                rs.column_mut(c).assign(&r.column(j));
            }
            let mut against = vec![self.x.view()];
            if let Some((p, _)) = &self.p {
                against.push(p.view());
            }
            orthonormal_rest(self.tall, rs, &against)?
        };
        self.r = r;
        if s.ncols() == 0 {
            // Nothing new to search: the basis is exhausted (n is small).
            if !done {
                self.stop = Stop::Stalled;
            }
            return self.check();
        }
        self.s = s;
        if self.with_x {
            let operand = ndarray::concatenate(ndarray::Axis(1), &[self.x.view(), self.s.view()])
                .expect("same rows");
            return Ok(command(GRAM, self.precision, &operand));
        }
        Ok(command(GRAM, self.precision, &self.s))
    }

    /// From block Lanczos to LOBPCG, from the current `X` (no `P` yet).
    fn hand_over_to_lobpcg(&mut self) {
        self.lanczos = false;
        self.krylov = None;
        self.p = None;
    }

    fn theta(&self) -> Vec<f64> {
        // `XᵀGX` is diagonal after Rayleigh–Ritz: its diagonal is Θ.
        column_dots(self.tall, &self.x, &self.gx)
    }

    /// The last pass: `A·X` and `G·X`, in f64 unless f32 was asked for.
    fn check(&mut self) -> Result<Vec<f64>, LinalgError> {
        if self.x.ncols() < self.l {
            // Block Lanczos stopped before its basis held `l` columns: `X` is padded with
            // Gaussian columns made orthonormal to it (its components stay unconverged).
            let rest = gaussian(self.x.nrows(), self.l, self.pad_seed);
            let rest = orthonormal_rest(self.tall, rest, &[self.x.view()])?;
            let want = self.l - self.x.ncols();
            self.x = ndarray::concatenate(
                ndarray::Axis(1),
                &[self.x.view(), rest.slice(s![.., ..want.min(rest.ncols())])],
            )
            .expect("same rows");
        }
        let p = if self.mixed {
            Precision::F64
        } else {
            self.precision
        };
        Ok(command(CHECK, p, &self.x))
    }

    /// Takes `G·S` (or `G·[X | S]`, or `G·X₀`) from the pass just made.
    fn absorb(&mut self, gs: Array2<f64>) -> Result<(), LinalgError> {
        if self.lanczos {
            return self.absorb_krylov(gs);
        }
        self.passes += 1;
        let l = self.l;
        // The first pass: the basis is `X` alone, its product the pass's.
        let first = std::mem::replace(&mut self.initial, false);
        let gs = if first {
            gs
        } else if self.with_x {
            self.with_x = false;
            // `G·X` afresh, in f64: `P`'s product, from f32 passes, goes.
            self.gx = gs.slice(s![.., ..l]).to_owned();
            self.p = None;
            gs.slice(s![.., l..]).to_owned()
        } else {
            gs
        };
        // `[X, S, P]` and `G·[X, S, P]` as blocks side by side (the first pass: `X` and
        // `G·X` alone): the products take them in parts, without copying them into one.
        let mut parts = vec![self.x.view()];
        let mut gparts = vec![if first { gs.view() } else { self.gx.view() }];
        if !first {
            parts.push(self.s.view());
            gparts.push(gs.view());
            if let Some((p, gp)) = &self.p {
                parts.push(p.view());
                gparts.push(gp.view());
            }
        }
        let tall = self.tall;
        let (_, c) = rayleigh_ritz(tall, &parts, &gparts)?;
        let c1 = c.slice(s![.., ..l]).to_owned();
        let cols = c.nrows();
        // `X` and `G·X` are written over the spares (the same products, the same bits).
        let (sx, sgx) = std::mem::take(&mut self.spare);
        let x = tall.ab_parts_into(&parts, c1.view(), sx);
        let gx = tall.ab_parts_into(&gparts, c1.view(), sgx);
        let p = if cols > l {
            // `P`: the part of the new `X` from `S` and the old `P`, made orthonormal to
            // `X` in the coordinates of the (orthonormal) basis.
            let mut pc = c1.clone();
            pc.slice_mut(s![..l, ..]).fill(0.0);
            let pc = orthonormal_rest(tall, pc, &[c1.view()])?;
            (pc.ncols() > 0).then(|| {
                (
                    tall.ab_parts(&parts, pc.view()),
                    tall.ab_parts(&gparts, pc.view()),
                )
            })
        } else {
            None
        };
        // (No `P` after the first pass, whose basis is `X` alone.) The `X` and `G·X`
        // replaced are the next step's spares. `P` and `G·P` are not kept so: their width
        // changes from step to step, and holding them too would take the root past the
        // twelve blocks its plan counts.
        self.spare = (
            std::mem::replace(&mut self.x, x),
            std::mem::replace(&mut self.gx, gx),
        );
        self.p = p;
        // `S` is read no more: its room is the next search block's. With it, and no copy
        // of the search block for the pass's command, the root holds at most ten blocks of
        // `n × l` while the next one is made (`X`, `G·X`, `R`, `P`, `G·P`, two spares, and
        // the three that making it orthonormal takes), within the plan's twelve.
        self.s = Array2::zeros((0, 0));
        Ok(())
    }

    /// [`Method::Lanczos`]'s step: the pass's block and its product join the basis, and `X`
    /// becomes the basis's first `l` Ritz vectors (fewer while it holds fewer columns).
    fn absorb_krylov(&mut self, gs: Array2<f64>) -> Result<(), LinalgError> {
        self.passes += 1;
        let (l, tall) = (self.l, self.tall);
        let first = std::mem::replace(&mut self.initial, false);
        let s = std::mem::replace(&mut self.s, Array2::zeros((0, 0)));
        match &mut self.krylov {
            Some(kr) if !first => kr.append(tall, s, gs),
            _ => {
                let sizes = lanczos_basis(l, s.nrows());
                self.krylov = Some(Krylov::from(tall, &s, &gs, sizes));
            }
        }
        let kr = self.krylov.as_mut().expect("made above");
        // The last step's `X` and `G·X` are written over: nothing reads them any more.
        let reuse = (
            std::mem::replace(&mut self.x, Array2::zeros((0, 0))),
            std::mem::replace(&mut self.gx, Array2::zeros((0, 0))),
        );
        let (x, gx) = kr.ritz(tall, l, reuse)?;
        self.x = x;
        self.gx = gx;
        Ok(())
    }

    /// After the check pass: `G·X` and `R` of `A·X = QR`. Returns the command `DONE` with
    /// the result, or a `GRAM` to go on.
    fn checked(
        &mut self,
        gx: Array2<f64>,
        r: Array2<f64>,
        w: &Array2<f64>,
    ) -> Result<Vec<f64>, LinalgError> {
        self.passes += 1;
        let k = self.k;
        let (mut ur, sv, wrt) = small_svd(r.view())?;
        let mut vt = wrt.dot(&self.x.t());
        fix_signs(&mut ur, &mut vt);
        let v = vt.t().to_owned();
        let gv = gx.dot(&v_coords(&self.x, &v));
        let theta: Vec<f64> = sv.iter().map(|s| s * s).collect();
        let (res, _) = residuals(self.tall, &v, &gv, &theta, Array2::zeros((0, 0)));
        let met = res[..k].iter().all(|&x| x <= self.tol);
        if met || self.passes >= self.max_passes || self.stop != Stop::None {
            if !met && self.stop == Stop::None {
                self.stop = Stop::MaxPasses;
            }
            if met {
                self.stop = Stop::None;
            }
            let vtk = vt.slice(s![..k, ..]).to_owned();
            let mut out = vec![DONE, precision_code(Precision::F64)];
            out.extend(sv.iter().take(k));
            out.extend(encode(&ur.slice(s![.., ..k]).to_owned()));
            out.extend(encode(&vtk));
            out.extend(encode(&vtk.dot(w)));
            out.extend(&res[..k]);
            out.push(self.stop.code());
            out.extend(&self.history);
            return Ok(out);
        }
        // Not met: go on in f64 from the measured triplets, by LOBPCG.
        self.hand_over_to_lobpcg();
        self.x = v;
        self.gx = gv;
        self.p = None;
        self.precision = Precision::F64;
        self.mixed = false;
        self.stop = Stop::None;
        self.next()
    }
}

/// The time of one Rayleigh–Ritz step ([`rayleigh_ritz_seconds`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSeconds {
    /// The step, seconds.
    pub seconds: f64,
    /// The part of it spent in the products with the tall blocks, which the threads share
    /// (the rest, residuals, copies, the small eigenproblem and the encoding of the next
    /// block, runs on one thread whatever the cores).
    pub shared: f64,
}

/// The time of one Rayleigh–Ritz step of `method`'s iteration (the root's work between two
/// passes: absorbing `G·S`, the residuals, and the next search block, encoded as the
/// command every rank is sent) for `n` samples and a sketch of `k + oversample` columns,
/// on `threads` threads. `G` is the Gram matrix of a Gaussian block of `n` rows (`8l`
/// columns, or twice block Lanczos's largest basis where that is more), whose flat
/// spectrum keeps the iteration going as a genotype matrix's bulk does; its products are
/// not timed. What `rankwise calibrate` measures for the sizing model.
///
/// For [`Method::Lobpcg`], the mean of `steps` steps after two (by then `P` is part of the
/// basis, as in every later pass). For [`Method::Lanczos`], whose step grows with its basis
/// and shrinks at each restart, the mean over whole restart cycles, at least `steps` steps,
/// once the basis has first filled. Any other method is refused (its steps are not
/// Rayleigh–Ritz steps).
pub fn rayleigh_ritz_seconds(
    n: usize,
    k: usize,
    oversample: usize,
    method: Method,
    threads: usize,
    steps: usize,
) -> Result<StepSeconds, LinalgError> {
    let l = k + oversample;
    if !method.iterates() {
        return Err(LinalgError::Option {
            parameter: "method",
            message: format!("{} makes no Rayleigh–Ritz steps", method.name()),
        });
    }
    if k == 0 {
        return Err(LinalgError::Option {
            parameter: "k",
            message: "the rank must be at least 1".into(),
        });
    }
    let lanczos = method == Method::Lanczos;
    // `G`'s rank: more than block Lanczos's largest basis, which would otherwise run out of
    // directions and stop.
    let rank = if lanczos {
        (8 * l).max(2 * lanczos_basis(l, usize::MAX).1)
    } else {
        8 * l
    };
    if rank > n {
        return Err(LinalgError::Option {
            parameter: "n",
            message: format!("{n} samples: at least {rank} for k + oversample = {l}"),
        });
    }
    let tall = Tall::new(threads);
    let b = gaussian(n, rank, 0x5EED);
    let x0 = orthonormal_rest(tall, gaussian(n, l, 0x5EED + 1), &[])?;
    // Block Lanczos: untimed until the basis first fills (its first block is the first
    // pass's), then whole cycles of restart and refill.
    let (warm, steps) = if lanczos {
        let (keep, most) = lanczos_basis(l, n);
        let cycle = (most - keep).div_ceil(LANCZOS_BLOCK).max(1);
        (
            most.div_ceil(LANCZOS_BLOCK),
            steps.max(1).div_ceil(cycle) * cycle,
        )
    } else {
        (2, steps)
    };
    // A tolerance no residual meets, and no pass limit: every step is a full one.
    let mut it = Iterate::new(
        (k, l),
        (f64::MIN_POSITIVE, usize::MAX),
        (false, Precision::F64),
        (lanczos, 0x5EED + 2),
        x0,
        tall,
    );
    let (mut seconds, mut shared, mut timed) = (0.0, 0.0, 0);
    for step in 0..steps + warm {
        let gs = b.dot(&b.t().dot(&it.s));
        let (start, before) = (std::time::Instant::now(), tall::shared_seconds());
        it.absorb(gs)?;
        let command = it.next()?;
        let dt = start.elapsed().as_secs_f64();
        if step >= warm {
            seconds += dt;
            shared += tall::shared_seconds() - before;
            timed += 1;
        }
        if command[0] != GRAM {
            break;
        }
    }
    let timed = timed.max(1) as f64;
    Ok(StepSeconds {
        seconds: seconds / timed,
        shared: shared / timed,
    })
}

/// `W_R` such that `V = X·W_R`, from orthonormal `X` and `V`: `XᵀV`.
fn v_coords(x: &Array2<f64>, v: &Array2<f64>) -> Array2<f64> {
    x.t().dot(v)
}

fn command(kind: f64, p: Precision, a: &Array2<f64>) -> Vec<f64> {
    let mut out = vec![kind, precision_code(p)];
    out.extend(encode(a));
    out
}

/// Computes the result as [`super::rsvd`] does, by LOBPCG.
pub(super) fn solve(run: Run<'_, '_>) -> Result<RsvdResult, LinalgError> {
    let Run {
        rt,
        problem,
        options,
        sink,
        plan,
        ctx,
        tree,
        mut states,
        my_rows,
        regenerated_rows,
        value_bytes,
        collectives,
        gpu_note,
    } = run;
    let comm = rt.comm();
    let (m, n) = problem.operand.shape();
    let n = n as usize;
    let (k, l, r) = (options.k, options.sketch(), options.probes);
    let root = tree.root_owner();
    let on_root = comm.rank() == root;
    let omega = gaussian(n, l + r, options.seed);
    let w = omega.slice(s![.., l..]).to_owned();
    let start_precision = if options.mixed_precision {
        Precision::F32
    } else {
        options.precision
    };
    let mut it = match on_root {
        true => {
            // The root's actors wait while it computes each step: their cores do its products.
            let tall = Tall::new(rt.actors().iter().map(|a| a.threads()).sum());
            let x0 = orthonormal_rest(tall, omega.slice(s![.., ..l]).to_owned(), &[])?;
            Some(Iterate::new(
                (k, l),
                (options.tol, options.max_passes),
                (options.mixed_precision, start_precision),
                (
                    options.method == Method::Lanczos,
                    options.seed.wrapping_add(0x9AD),
                ),
                x0,
                tall,
            ))
        }
        false => None,
    };
    let mut cmd = match &it {
        Some(it) => command(GRAM, start_precision, &it.s),
        None => Vec::new(),
    };
    rt.progress().set_max_passes(options.max_passes as u64);
    let mut timings = Vec::new();
    let mut pass_precisions = Vec::new();
    let mut stats = None;
    let (mut gram_time, mut root_time) = (0.0, 0.0);
    let (mut gram_comm, mut root_comm) = (CommCounts::default(), CommCounts::default());
    let mut gram_passes = 0;
    // The passes' products with the matrix: `A·S` and `Aᵀ(A·S)`, `2mn` each per column.
    let mut gram_flops = 0.0;
    // Bytes of matrix values the Gram passes produced on this rank (8 a value).
    let mut gram_produced = 0u64;
    let bad = || LinalgError::Message { peer: root };
    let mut after_check = false;
    let done = loop {
        // The root's command and the next search block: the Rayleigh–Ritz step's result,
        // counted with it (the other ranks wait here while the root computes it).
        let t = Clock::start(rt);
        comm.broadcast_f64(root, &mut cmd)?;
        let (dt, dc) = t.lap();
        root_time += dt;
        root_comm.add(&dc);
        let kind = *cmd.first().ok_or_else(bad)?;
        let precision = precision_of(*cmd.get(1).ok_or_else(bad)?);
        if kind == DONE {
            break std::mem::take(&mut cmd);
        }
        if after_check {
            // The check found a component over `tol`: its products go, the iteration goes on.
            for st in states.iter_mut().flatten() {
                st.basis.clear();
                st.y = None;
                st.probes = None;
            }
            after_check = false;
        }
        // The first pass again, in float64, after its float32 sums overflowed (only that
        // moves to float64 after one pass): its measures (Σx²) and any panels it kept came
        // from float32 tiles too, and are made again.
        if pass_precisions == [Precision::F32] && precision == Precision::F64 {
            stats = None;
            for st in states.iter_mut().flatten() {
                st.stored = None;
            }
        }
        let operand = decode(root, &cmd[2..])?;
        pass_precisions.push(precision);
        let first = stats.is_none();
        // A first pass produces every panel of this rank, a later one those not resident.
        let produced = if first { my_rows } else { regenerated_rows } * n as u64 * 8;
        let t = Clock::start(rt);
        let sums = Arc::new(PartialSums::new(tree.owners().to_vec(), comm.rank()));
        let check = kind == CHECK;
        let width = operand.ncols();
        let omega = if check {
            ndarray::concatenate(ndarray::Axis(1), &[operand.view(), w.view()]).expect("same rows")
        } else {
            operand
        };
        let (st, facts) = range_pass(
            rt,
            &ctx,
            std::mem::take(&mut states),
            Arc::new(omega),
            width,
            first,
            precision,
            Some(&sums),
        )?;
        states = st;
        if first {
            let s = super::PassFacts::sum_all(tree, comm, facts)?;
            if precision == Precision::F64 || !options.mixed_precision {
                super::check_scale(&s, precision)?;
            }
            variants_left(&problem.operand, &s, m)?;
            stats = Some(s);
        }
        let gs = sum_to_root(comm, tree, ctx.nccl.as_ref(), sums.take())?;
        // Data whose scale squares below float32's normal range: the first pass again in
        // float64 (which refuses what it cannot hold either, naming the scale).
        let f32_underflows = first
            && precision == Precision::F32
            // (Zero too: values below 1e-45 are zero as float32.)
            && stats
                .as_ref()
                .is_some_and(|s: &super::PassFacts| s.y_scale < super::LEAST_F32_SCALE);
        if !check {
            for st in states.iter_mut().flatten() {
                st.y = None;
                st.probes = None;
            }
            let (dt, dc) = t.lap();
            gram_time += dt;
            gram_comm.add(&dc);
            gram_passes += 1;
            gram_flops += 4.0 * m as f64 * n as f64 * width as f64;
            gram_produced += produced;
            let t = Clock::start(rt);
            cmd = match (&mut it, gs) {
                // A float32 pass whose sums overflowed (values beyond about 1e18 square
                // past float32's range): the same pass again in float64, and float64 from
                // then on. Its panels named nothing (`Ctx::f32_overflow_to_root`); a
                // float64 pass names a non-finite or overflowing value where it is stored.
                (Some(it), Some(gs))
                    if precision == Precision::F32
                        && it.mixed
                        && (!crate::finite::all_finite(gs.view()) || f32_underflows) =>
                {
                    it.precision = Precision::F64;
                    it.mixed = false;
                    let mut again = cmd.clone();
                    again[1] = precision_code(Precision::F64);
                    again
                }
                (Some(it), Some(gs)) => {
                    it.absorb(gs)?;
                    let next = it.next()?;
                    if let Some(&worst) = it.history.last() {
                        rt.progress().set_residual(worst, it.tol);
                    }
                    next
                }
                _ => Vec::new(),
            };

            let (dt, dc) = t.lap();
            root_time += dt;
            root_comm.add(&dc);
            continue;
        }
        let root_r = orthonormalize(rt, &ctx, tree, &mut states, false)?;
        // `A·[X W]` and `Aᵀ(A·X)`: `2mn` per column of each.
        let flops = 2.0 * m as f64 * n as f64 * (2 * width + r) as f64;
        timings.push(
            t.phase(&format!(
                "check pass: A·X, AᵀA·X ({}) + TSQR",
                if precision == Precision::F32 {
                    "f32"
                } else {
                    "f64"
                }
            ))
            .with_flops(flops)
            .with_produced(produced),
        );
        let t = Clock::start(rt);
        cmd = match (&mut it, gs, root_r) {
            (Some(it), Some(gx), Some(r)) => it.checked(gx, r, &w)?,
            _ => Vec::new(),
        };
        let (dt, dc) = t.lap();
        root_time += dt;
        root_comm.add(&dc);
        after_check = true;
    };
    timings.insert(
        0,
        PhaseTiming {
            phase: format!("{}: {gram_passes} passes of AᵀA·S", options.method.name()),
            seconds: gram_time,
            comm: gram_comm,
            flops: gram_flops,
            produced_bytes: gram_produced,
        },
    );
    timings.push(PhaseTiming {
        phase: "Rayleigh–Ritz steps on the root, and their broadcast".into(),
        seconds: root_time,
        comm: root_comm,
        flops: 0.0,
        produced_bytes: 0,
    });

    // The result: σ, U_R, Vᵀ, VᵀW, the residuals, why it stopped, the history.
    let flat = &done[2..];
    let s_k = flat.get(..k).ok_or_else(bad)?.to_vec();
    let mut at = k;
    let mut take = || -> Result<Array2<f64>, LinalgError> {
        let rest = flat.get(at..).ok_or_else(bad)?;
        let len = 2
            + (rest.first().copied().unwrap_or(0.0) * rest.get(1).copied().unwrap_or(0.0)) as usize;
        let a = decode(root, rest.get(..len).ok_or_else(bad)?)?;
        at += len;
        Ok(a)
    };
    let ur = take()?;
    let wt = take()?;
    let vtw = take()?;
    let residual = flat.get(at..at + k).ok_or_else(bad)?.to_vec();
    let stop = Stop::from_code(*flat.get(at + k).ok_or_else(bad)?);
    let history = flat.get(at + k + 1..).ok_or_else(bad)?.to_vec();
    if ur.dim() != (l, k) || wt.dim() != (k, n) {
        return Err(bad());
    }
    // Rows of the states' last stage (the check pass's, whichever rank it was).
    if states.iter().flatten().any(|st| st.basis.is_empty()) {
        return Err(bad());
    }

    // U = Q·U_R, the probe residuals, and U to the sink.
    let t = Clock::start(rt);
    let (leaves, _) = form_u(rt, states, ur, &s_k, vtw, r, sink)?;
    let probe_sq = tree.sum_all(comm, leaves, (1, r))?;
    timings.push(t.phase("form U + error probes"));

    let stats = stats.ok_or_else(bad)?;
    let total_sum_squares = stats.sum_squares;
    let passes = pass_precisions.len();
    let bytes_produced =
        (my_rows + (passes as u64 - 1) * regenerated_rows) * n as u64 * value_bytes;
    let last = pass_precisions.last().copied().unwrap_or(Precision::F64);
    let convergence = Convergence::measured(
        options.tol,
        residual,
        "‖Aᵀuᵢ − σᵢvᵢ‖₂ / σ₁",
        history,
        pass_precisions,
        stop.message(options.max_passes, last),
    );
    Ok(RsvdResult {
        gpu_panels: ctx.gpu_panels.load(Ordering::Relaxed),
        gpu_staged_bytes: ctx.gpu_staged_bytes.load(Ordering::Relaxed),
        gpu_qrs: ctx.gpu_qrs.load(Ordering::Relaxed),
        gpu_seconds: gpu_seconds_of(&ctx),
        gpu_decode: gpu_decode_of(&ctx),
        gpu_kept: gpu_kept_of(&ctx),
        collectives,
        gpu_note,
        s: s_k,
        wt,
        transposed: problem.transposed,
        total_sum_squares,
        estimate: error_estimate(&probe_sq, r, total_sum_squares),
        genotypes: genotype_summary(&problem.operand, &stats, m, n),
        timings,
        plan,
        bytes_produced,
        read: ctx.read.totals(),
        projections: Vec::new(),
        condition_limit: fused_condition_limit(options.precision),
        passes,
        convergence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calibration's step: a positive time for every step it makes, on one thread and
    /// on several, and a refusal naming `n` for fewer samples than its Gram matrix needs.
    #[test]
    fn rayleigh_ritz_steps_are_timed_and_too_few_samples_refused() {
        for method in [Method::Lobpcg, Method::Lanczos] {
            for threads in [1, 3] {
                let t = rayleigh_ritz_seconds(3 * tall::CHUNK, 4, 4, method, threads, 2).unwrap();
                assert!(
                    t.seconds > 0.0 && t.seconds < 60.0,
                    "{method:?}, {threads} threads: {t:?}"
                );
                assert!(
                    t.shared > 0.0 && t.shared < t.seconds,
                    "{method:?}, {threads} threads: {t:?}"
                );
            }
            let e = rayleigh_ritz_seconds(100, 10, 10, method, 1, 2).unwrap_err();
            assert!(
                matches!(e, LinalgError::Option { parameter: "n", .. }),
                "{e}"
            );
        }
        let e = rayleigh_ritz_seconds(10_000, 10, 10, Method::SubspaceIteration, 1, 2);
        assert!(
            matches!(
                e,
                Err(LinalgError::Option {
                    parameter: "method",
                    ..
                })
            ),
            "{e:?}"
        );
    }

    /// The step's column norms and dots, summed over chunks of rows on the root's threads,
    /// are the same bits on one thread and on several, and the plain sums to rounding, at
    /// any scale (σ² of 1e-200 squared underflows a plain sum of squares) and with a ragged
    /// last chunk; the residuals built from them are those of their definition.
    #[test]
    fn step_norms_and_dots_do_not_depend_on_the_threads() {
        let mut rng = crate::testing::Rng::fresh();
        let seed = rng.0;
        let n = 2 * CHUNK + 1 + rng.below(3000);
        let c = 3 + rng.below(5);
        for scale in [1.0, 1e-200, 1e150] {
            let draw = |rng: &mut crate::testing::Rng| {
                Array2::from_shape_fn((n, c).f(), |_| scale * f64::from(rng.value()))
            };
            let (x, gx) = (draw(&mut rng), draw(&mut rng));
            let plain: Vec<f64> = (0..c)
                .map(|j| {
                    let col = x.column(j);
                    let b = col.iter().fold(0.0f64, |m, &v| m.max(v.abs()));
                    b * col.iter().map(|&v| (v / b) * (v / b)).sum::<f64>().sqrt()
                })
                .collect();
            let one = column_norms(Tall::new(1), &x);
            let three = column_norms(Tall::new(3), &x);
            assert_eq!(one, three, "seed {seed}, scale {scale}");
            for (a, b) in one.iter().zip(&plain) {
                assert!((a - b).abs() <= 1e-13 * b, "seed {seed}: {a} vs {b}");
                assert!(*a > 0.0, "seed {seed}, scale {scale}: underflow");
            }
            let dots = column_dots(Tall::new(1), &x, &gx);
            assert_eq!(dots, column_dots(Tall::new(3), &x, &gx));
            let theta: Vec<f64> = (0..c).map(|j| (j + 1) as f64 * scale).collect();
            let (res1, r1) = residuals(Tall::new(1), &x, &gx, &theta, Array2::zeros((0, 0)));
            let (res3, r3) = residuals(Tall::new(3), &x, &gx, &theta, r1.clone());
            assert_eq!(res1, res3);
            assert_eq!(r1, r3);
            for j in 0..c {
                let want = &gx.column(j) - &(&x.column(j) * theta[j]);
                assert_eq!(r1.column(j), want.view(), "seed {seed}");
            }
        }
    }
}
