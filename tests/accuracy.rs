//! Accuracy of the exact SVD against LAPACK on matrices small enough to hold whole,
//! over shapes and seeds drawn fresh on every run.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use ndarray::Array2;
use rankwise::exec::RuntimeConfig;
use rankwise::linalg::SvdProblem;
use rankwise::sources::Dist;

fn check_case(rt: &rankwise::exec::Runtime, m: u64, n: u64, chunk: u64, seed: u64, dist: Dist) {
    let case = format!("{m}×{n} chunk {chunk} seed {seed} {dist}");
    let problem = SvdProblem::generated(m, n, chunk, seed, dist).unwrap();
    let k = m.min(n) as usize;
    let store = Arc::new(Mutex::new(Array2::zeros((problem.grid.rows as usize, k))));
    let result = run_svd(rt, &problem, true, Arc::clone(&store));
    let distributed = store.lock().unwrap().clone();
    let g = assemble(result, distributed);
    let a = dense(m, n, seed, dist);

    // Our own residual, computed here from the gathered factors.
    let s = ndarray::Array1::from(g.result.s.clone());
    let back = (&g.u * &s).dot(&g.vt);
    let norm = a.mapv(|x| x * x).sum().sqrt();
    // Regression: a tiny genotype draw (1 × 2) can be all zeros, and its relative residual
    // was 0/0; a zero matrix must be reproduced exactly.
    let diff = (&back - &a).mapv(|x| x * x).sum().sqrt();
    let res = if norm > 0.0 { diff / norm } else { diff };
    assert!(res <= 1e-13, "{case}: ‖A − UΣVᵀ‖/‖A‖ = {res:e}");
    let utu = g.u.t().dot(&g.u) - Array2::<f64>::eye(k);
    let u_orth = utu.iter().fold(0.0f64, |x, y| x.max(y.abs()));
    assert!(u_orth <= 1e-13, "{case}: max|UᵀU − I| = {u_orth:e}");
    let vtv = g.vt.dot(&g.vt.t()) - Array2::<f64>::eye(k);
    let v_orth = vtv.iter().fold(0.0f64, |x, y| x.max(y.abs()));
    assert!(v_orth <= 1e-13, "{case}: max|VᵀV − I| = {v_orth:e}");

    // Singular values: descending, and within 1e-12 of LAPACK's relative to ‖A‖₂ = σ₁
    // (the accuracy any backward-stable SVD promises for every σ, large or small).
    let lap = lapack_sigma(&a);
    assert_eq!(lap.len(), k, "{case}");
    for i in 0..k {
        let d = (g.result.s[i] - lap[i]).abs();
        assert!(
            d <= 1e-12 * lap[0].max(f64::MIN_POSITIVE),
            "{case}: σ{} = {} vs LAPACK {} (Δ {d:e})",
            i + 1,
            g.result.s[i],
            lap[i]
        );
        if i > 0 {
            assert!(
                g.result.s[i] <= g.result.s[i - 1],
                "{case}: σ not descending"
            );
        }
    }

    // The run's own checks agree.
    let c = g.result.check.expect("check requested");
    assert!(
        c.relative_residual <= 1e-13 && c.u_orthogonality <= 1e-13 && c.v_orthogonality <= 1e-13,
        "{case}: {c:?}"
    );
}

#[test]
fn random_shapes_match_lapack() {
    let rt = rankwise::embedded(&RuntimeConfig {
        actors: Some(2),
        ..Default::default()
    })
    .unwrap();
    let mut draw = Draw(test_seed());
    let dists = [Dist::Uniform, Dist::Normal, Dist::Genotype];
    for case in 0..24 {
        let m = draw.log_range(1, 50_000);
        let n = draw.range(1, 64);
        // Panels from one row to the whole matrix, often ragged, often shorter than n.
        let chunk = draw.log_range(1, m.max(n));
        let chunk = if m.max(n) / chunk > 2000 {
            m.max(n).div_ceil(2000)
        } else {
            chunk
        };
        let seed = draw.next();
        check_case(&rt, m, n, chunk, seed, dists[case % 3]);
    }
}

#[test]
fn edge_shapes_match_lapack() {
    let rt = rankwise::embedded(&RuntimeConfig::default()).unwrap();
    let mut draw = Draw(test_seed());
    let cases = [
        (1, 1, 1),           // one value
        (1, 7, 1),           // one row: through the transpose
        (7, 1, 3),           // one column, ragged last panel
        (40, 8, 1),          // 1-row panels
        (100, 30, 7),        // panels shorter than n, ragged
        (30, 100, 9),        // short and fat
        (64, 64, 10),        // square
        (50_000, 64, 4_999), // the largest, ragged
    ];
    for (m, n, chunk) in cases {
        check_case(&rt, m, n, chunk, draw.next(), Dist::Normal);
    }
}

/// `U·diag(σ)·Vᵀ` with `σ` spread geometrically from 1 to `1/kappa` and orthonormal `U`,
/// `V` from the QR of normal draws: a matrix of prescribed condition number.
fn conditioned(m: usize, n: usize, kappa: f64, draw: &mut Draw) -> (Array2<f64>, Vec<f64>) {
    use ndarray_linalg::QR;
    let (u, _) = dense(m as u64, n as u64, draw.next(), Dist::Normal)
        .qr()
        .unwrap();
    let (v, _) = dense(n as u64, n as u64, draw.next(), Dist::Normal)
        .qr()
        .unwrap();
    let sigma: Vec<f64> = (0..n)
        .map(|i| kappa.powf(-(i as f64) / ((n - 1).max(1) as f64)))
        .collect();
    let s = ndarray::Array1::from(sigma.clone());
    ((&u * &s).dot(&v.t()), sigma)
}

/// The exact SVD keeps its contract (‖A − UΣVᵀ‖/‖A‖ ≤ 1e-13, U and V orthonormal to
/// 1e-13, σ within 1e-12·σ₁ of LAPACK's) for condition numbers up to 10¹²: the panels'
/// Cholesky QR shifts, or hands a block to Householder QR, where the Gram matrix cannot be
/// trusted. Fresh shapes, panel heights and seeds; panels of many cache blocks, and wide
/// panels factored whole.
#[test]
fn prescribed_condition_numbers_keep_the_contract() {
    use rankwise::sources::InMemoryMatrix;
    let rt = rankwise::embedded(&RuntimeConfig {
        actors: Some(2),
        ..Default::default()
    })
    .unwrap();
    let mut draw = Draw(test_seed());
    for kappa in [1.0, 1e4, 1e8, 1e12] {
        for _ in 0..2 {
            // Narrow panels factored in cache blocks, and from 64 columns panels factored whole.
            let n = draw.range(2, 130) as usize;
            let m = draw.range(4_000, 40_000) as usize;
            let chunk = draw.range(m as u64 / 6, m as u64 / 2);
            let (a, designed) = conditioned(m, n, kappa, &mut draw);
            let case = format!("{m}×{n} chunk {chunk} κ {kappa:e}");
            let problem = SvdProblem {
                grid: rankwise::exec::ChunkGrid::new(m as u64, n as u64, chunk).unwrap(),
                source: Arc::new(InMemoryMatrix::new(a.clone(), "conditioned")),
                transposed: false,
                rank_panels: None,
            };
            let store = Arc::new(Mutex::new(Array2::zeros((m, n))));
            let result = run_svd(&rt, &problem, false, Arc::clone(&store));
            let g = assemble(result, store.lock().unwrap().clone());
            let s = ndarray::Array1::from(g.result.s.clone());
            let back = (&g.u * &s).dot(&g.vt);
            let norm = a.mapv(|x| x * x).sum().sqrt();
            let res = (&back - &a).mapv(|x| x * x).sum().sqrt() / norm;
            assert!(res <= 1e-13, "{case}: ‖A − UΣVᵀ‖/‖A‖ = {res:e}");
            for (what, f) in [("UᵀU", g.u.t().dot(&g.u)), ("VᵀV", g.vt.dot(&g.vt.t()))] {
                let off = (f - Array2::<f64>::eye(n))
                    .iter()
                    .fold(0.0f64, |x, y| x.max(y.abs()));
                assert!(off <= 1e-13, "{case}: max|{what} − I| = {off:e}");
            }
            let lap = lapack_sigma(&a);
            for i in 0..n {
                let d = (g.result.s[i] - lap[i]).abs();
                assert!(
                    d <= 1e-12 * lap[0],
                    "{case}: σ{} = {} vs LAPACK {} (designed {})",
                    i + 1,
                    g.result.s[i],
                    lap[i],
                    designed[i]
                );
            }
        }
    }
}
