//! `rankwise reduce` and `rankwise tasks`: the strided sum equals a direct computation and
//! has the same bits for 1–4 ranks (embedded and under `mpirun`); bad options are refused
//! by name; the task runner runs every task exactly once.
//!
//! Build the binary first (`cargo build --release --workspace --bins`; `make test` does).

mod common;

use common::*;
use rankwise::sources::Dist;
use serde_json::Value;

/// `Σ (x_ij + add)` over rows and columns ≡ 0 (mod step), straight from the definition.
fn direct(rows: u64, cols: u64, seed: u64, dist: Dist, step: u64, add: f64) -> (f64, u64) {
    let a = dense(rows, cols, seed, dist);
    let (mut sum, mut count) = (0.0, 0u64);
    for i in (0..rows as usize).step_by(step as usize) {
        for j in (0..cols as usize).step_by(step as usize) {
            sum += a[[i, j]] + add;
            count += 1;
        }
    }
    (sum, count)
}

fn reduce_args(
    shape: (u64, u64),
    chunk: (u64, u64),
    seed: u64,
    dist: &str,
    extra: &[&str],
) -> Vec<String> {
    let mut a = strings(&[
        "reduce",
        "--rows",
        &shape.0.to_string(),
        "--cols",
        &shape.1.to_string(),
        "--chunk-rows",
        &chunk.0.to_string(),
        "--chunk-cols",
        &chunk.1.to_string(),
        "--seed",
        &seed.to_string(),
        "--dist",
        dist,
        "--json",
    ]);
    a.extend(strings(extra));
    a
}

#[test]
fn reduce_equals_the_direct_sum() {
    let mut draw = Draw(test_seed());
    for (dist, name) in [
        (Dist::Normal, "normal"),
        (Dist::Uniform, "uniform"),
        (Dist::Genotype, "genotype"),
    ] {
        let (rows, cols) = (draw.range(1, 150), draw.range(1, 150));
        let chunk = (draw.range(1, rows), draw.range(1, cols + 10));
        let step = [1u64, 2, 3, 7][draw.range(0, 3) as usize];
        let add = [1.0, -0.5, 0.0, 3.25][draw.range(0, 3) as usize];
        let seed = draw.next() % 1000;
        let (s, a) = (step.to_string(), add.to_string());
        let args = reduce_args(
            (rows, cols),
            chunk,
            seed,
            name,
            &[
                "--step",
                &s,
                &format!("--add={a}"),
                "--check",
                "--actors",
                "2",
            ],
        );
        let r = report(&embedded(&args));
        let (want, count) = direct(rows, cols, seed, dist, step, add);
        let what = format!("{name} {rows}×{cols}, chunks {chunk:?}, step {step}, add {add}");
        assert_eq!(r["count"].as_u64(), Some(count), "{what}");
        let scale = want.abs().max(count as f64);
        for (key, got) in [
            ("sum", r["sum"].as_f64().unwrap()),
            (
                "compensated sum",
                r["check"]["compensated_sum"].as_f64().unwrap(),
            ),
        ] {
            assert!(
                (got - want).abs() <= 1e-12 * scale,
                "{what}: {key} {got:e} vs direct {want:e}"
            );
        }
        assert!(r["check"]["relative_difference"].as_f64().unwrap() < 1e-12);
    }
}

#[test]
fn reduce_has_the_same_bits_for_1_to_4_ranks() {
    let mut draw = Draw(test_seed());
    let shape = (draw.range(1500, 2500), draw.range(1000, 2000));
    let chunk = (draw.range(60, 200), draw.range(200, 700));
    let seed = draw.next() % 1000;
    let args = reduce_args(shape, chunk, seed, "normal", &["--check"]);
    let bits = |r: &Value| {
        (
            json_bits(&Value::Array(vec![r["sum"].clone()])),
            json_bits(&Value::Array(vec![r["check"]["compensated_sum"].clone()])),
        )
    };
    let reference = report(&embedded(&args));
    let (want, count) = direct(shape.0, shape.1, seed, Dist::Normal, 2, 1.0);
    assert_eq!(reference["count"].as_u64(), Some(count));
    let got = reference["sum"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 1e-12 * count as f64,
        "{got:e} vs {want:e}"
    );
    let mut runs = Vec::new();
    for ranks in 1..=4usize {
        for actors in ["1", "2"] {
            let mut a = args.clone();
            a.extend(strings(&[
                "--local-ranks",
                &ranks.to_string(),
                "--actors",
                actors,
            ]));
            runs.push((
                format!("{ranks} local ranks × {actors} actors"),
                embedded(&a),
            ));
        }
    }
    runs.push(("mpirun -np 3".into(), under_mpirun(3, &args)));
    for (what, run) in &runs {
        let r = report(run);
        if what.starts_with("mpirun") {
            assert_eq!(r["transport"], "mpi", "{what}\n{}", run.describe());
            assert_eq!(r["ranks"].as_u64(), Some(3), "{what}");
        }
        assert_eq!(
            bits(&r),
            bits(&reference),
            "{what}: the sums differ in their bits"
        );
        let per_rank = r["per_rank"].as_array().unwrap();
        let values: u64 = per_rank.iter().map(|x| x["values"].as_u64().unwrap()).sum();
        assert_eq!(values, count, "{what}: every value generated once");
        assert!(
            per_rank
                .iter()
                .all(|x| x["peak_rss_bytes"].as_u64().unwrap() > 0),
            "{what}: peak RSS of every rank"
        );
    }
}

#[test]
fn bad_options_are_refused_by_name() {
    let reduce = |rows: &str, cols: &str, chunk_rows: &str, extra: &[&str]| {
        let mut a = strings(&[
            "reduce",
            "--rows",
            rows,
            "--cols",
            cols,
            "--chunk-rows",
            chunk_rows,
        ]);
        a.extend(strings(extra));
        a
    };
    let tasks = |extra: &[&str]| {
        let mut a = strings(&["tasks"]);
        a.extend(strings(extra));
        a
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (reduce("100", "80", "10", &["--step", "0"]), "--step"),
        (reduce("0", "80", "10", &[]), "--rows"),
        (reduce("100", "0", "10", &[]), "--cols"),
        (reduce("100", "80", "0", &[]), "--chunk-rows"),
        (
            reduce("100", "80", "10", &["--chunk-cols", "0"]),
            "--chunk-cols",
        ),
        (reduce("100", "80", "10", &["--add", "inf"]), "--add"),
        (tasks(&["--tasks", "0"]), "--tasks"),
        (tasks(&["--tasks", "5", "--repeat", "0"]), "--repeat"),
    ];
    for (args, option) in &cases {
        assert_fails_naming(&embedded(args), args, option);
    }
    // Under mpirun every rank refuses, and the job fails.
    let run = under_mpirun(2, &reduce("100", "80", "10", &["--step", "0"]));
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{}", run.describe());
    assert!(
        run.stderr.contains("failed: --step: "),
        "mpirun -np 2: no --step error\n{}",
        run.describe()
    );
}

#[test]
fn tasks_run_every_task_exactly_once() {
    let mut draw = Draw(test_seed());
    let n = draw.range(1, 50_000);
    let ns = n.to_string();
    let base = strings(&["tasks", "--tasks", &ns, "--repeat", "2", "--json"]);
    let with = |extra: &[&str]| {
        let mut a = base.clone();
        a.extend(strings(extra));
        a
    };
    let runs = vec![
        ("1 rank".to_string(), embedded(&base)),
        (
            "1 rank, 3 actors".into(),
            embedded(&with(&["--actors", "3"])),
        ),
        (
            "2 local ranks".into(),
            embedded(&with(&["--local-ranks", "2"])),
        ),
        ("mpirun -np 2".into(), under_mpirun(2, &base)),
    ];
    for (what, run) in &runs {
        let r = report(run);
        assert_eq!(r["tasks"].as_u64(), Some(n), "{what}");
        assert_eq!(
            r["tasks_run"],
            serde_json::json!([n, n]),
            "{what}: tasks run in each of the 2 runs"
        );
        let per_rank: u64 = r["per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["tasks"][0].as_u64().unwrap())
            .sum();
        assert_eq!(per_rank, n, "{what}: tasks summed over ranks");
        assert!(r["tasks_per_second"].as_f64().unwrap() > 0.0, "{what}");
    }
}
