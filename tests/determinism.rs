//! Same seed and grid, any number of ranks and actors: the same bits.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use ndarray::Array2;
use rankwise::exec::RuntimeConfig;
use rankwise::linalg::SvdProblem;
use rankwise::sources::Dist;

fn run(
    ranks: usize,
    actors: usize,
    m: u64,
    n: u64,
    chunk: u64,
    seed: u64,
) -> (Vec<f64>, Array2<f64>, Array2<f64>) {
    let problem = SvdProblem::generated(m, n, chunk, seed, Dist::Normal).unwrap();
    let k = m.min(n) as usize;
    let store = Arc::new(Mutex::new(Array2::zeros((problem.grid.rows as usize, k))));
    let s2 = Arc::clone(&store);
    let config = RuntimeConfig {
        actors: Some(actors),
        ..Default::default()
    };
    let mut results = rankwise::local_world(ranks, &config, move |rt| {
        run_svd(&rt, &problem, false, Arc::clone(&s2))
    });
    for r in &results {
        assert!(r.is_ok(), "{:?}", r.as_ref().err());
    }
    let first = results.remove(0).unwrap();
    for other in results {
        let other = other.unwrap();
        assert_eq!(bits(&first.s), bits(&other.s), "ranks disagree on σ");
        assert_eq!(
            first.wt, other.wt,
            "ranks disagree on the replicated factor"
        );
    }
    let distributed = store.lock().unwrap().clone();
    let g = assemble(first, distributed);
    (g.result.s, g.u, g.vt)
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn mat_bits(a: &Array2<f64>) -> Vec<u64> {
    a.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn bit_identical_for_1_to_4_ranks_and_actors() {
    let mut draw = Draw(test_seed());
    // A ragged tall case with 15 panels, one whose panels are factored in several cache
    // blocks (the stacked block factors, and Cholesky QR's last factor folded into them),
    // one wide enough that its panels are factored whole, and a short-and-fat one through
    // the transpose.
    for (m, n, chunk) in [
        (10_007u64, 13u64, 700u64),
        (30_011, 9, 7_000),
        (3_001, 70, 430),
        (9, 2_001, 130),
    ] {
        let seed = draw.next();
        let (s0, u0, vt0) = run(1, 1, m, n, chunk, seed);
        for ranks in 1..=4 {
            for actors in 1..=4 {
                let (s, u, vt) = run(ranks, actors, m, n, chunk, seed);
                let what = format!("{m}×{n}/{chunk}: {ranks} ranks × {actors} actors");
                assert_eq!(bits(&s), bits(&s0), "{what}: S differs");
                assert_eq!(mat_bits(&u), mat_bits(&u0), "{what}: U differs");
                assert_eq!(mat_bits(&vt), mat_bits(&vt0), "{what}: Vᵀ differs");
            }
        }
    }
}

#[test]
fn more_ranks_than_panels_works() {
    let seed = test_seed();
    let (s1, u1, _) = run(1, 1, 50, 4, 30, seed);
    let (s4, u4, _) = run(4, 2, 50, 4, 30, seed);
    assert_eq!(bits(&s1), bits(&s4));
    assert_eq!(mat_bits(&u1), mat_bits(&u4));
}

#[test]
fn resident_and_regenerated_give_the_same_bits() {
    let seed = test_seed();
    // Uniform values keep their blocks' solves and make Q̃ again in pass 2; normal ones keep
    // Q. With a budget of the workspace alone, both factor every panel again in pass 2.
    for (dist, solves) in [(Dist::Uniform, true), (Dist::Normal, false)] {
        let problem = SvdProblem::generated(20_000, 16, 2_000, seed, dist).unwrap();
        let mut outs = Vec::new();
        let mut budget = None;
        for _ in 0..2 {
            let rt = rankwise::embedded(&RuntimeConfig {
                actors: Some(1),
                memory_per_actor: budget,
                ..Default::default()
            })
            .unwrap();
            let store = Arc::new(Mutex::new(Array2::zeros((20_000, 16))));
            let r = run_svd(&rt, &problem, false, Arc::clone(&store));
            let residency: Vec<_> = r.plan.memory.iter().map(|m| m.residency).collect();
            outs.push((
                bits(&r.s),
                mat_bits(&store.lock().unwrap()),
                residency,
                r.plan.keeps_solves.clone(),
            ));
            budget = Some(r.plan.memory[0].workspace);
        }
        assert_eq!(outs[0].2, vec![rankwise::exec::Residency::Resident]);
        assert_eq!(outs[0].3, vec![solves], "{dist:?}");
        assert_eq!(outs[1].2, vec![rankwise::exec::Residency::Regenerated]);
        assert_eq!(outs[0].0, outs[1].0, "{dist:?}: S");
        assert_eq!(outs[0].1, outs[1].1, "{dist:?}: U");
    }
}

#[test]
fn panels_placed_by_rank_give_the_same_bits_and_stay_on_their_rank() {
    // 15 panels held as 6, 0 and 9 panels by three ranks of two actors each (what a host
    // code's row blocks give the C library), against one rank placing them by weight.
    let seed = test_seed();
    let (s0, u0, vt0) = run(1, 1, 10_007, 13, 700, seed);
    let mut problem = SvdProblem::generated(10_007, 13, 700, seed, Dist::Normal).unwrap();
    problem.rank_panels = Some(vec![6, 0, 9]);
    let store = Arc::new(Mutex::new(Array2::zeros((10_007, 13))));
    let s2 = Arc::clone(&store);
    let config = RuntimeConfig {
        actors: Some(2),
        ..Default::default()
    };
    let results = rankwise::local_world(3, &config, move |rt| {
        let r = run_svd(&rt, &problem, false, Arc::clone(&s2));
        let owner = r.plan.placement.owner.clone();
        (r, owner)
    });
    for r in &results {
        assert!(r.is_ok(), "{:?}", r.as_ref().err());
    }
    let (first, owner) = results.into_iter().next().unwrap().unwrap();
    let expected: Vec<usize> = [0; 6].into_iter().chain([2; 9]).collect();
    assert_eq!(owner, expected);
    let g = assemble(first, store.lock().unwrap().clone());
    assert_eq!(bits(&g.result.s), bits(&s0), "S differs");
    assert_eq!(mat_bits(&g.u), mat_bits(&u0), "U differs");
    assert_eq!(mat_bits(&g.vt), mat_bits(&vt0), "Vᵀ differs");
}
