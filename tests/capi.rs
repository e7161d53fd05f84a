//! The C library as an HPC code links it: installed with scripts/install-capi.sh (what
//! `make install` runs), the C and Fortran examples built against the installed prefix
//! with mpicc/mpifort and pkg-config, run under mpirun with 1, 2 and 4 ranks, and their
//! S, U and Vᵀ compared bit for bit with the `rankwise` command line on the same data.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::mpirun::{mpirun, run_with_timeout};
use common::*;

const LIMIT: Duration = Duration::from_secs(120);

/// The installed prefix and the built examples, made once per test binary.
struct Built {
    prefix: PathBuf,
    bin: PathBuf,
}

/// Runs a build step; a failure shows its output.
fn run(cmd: Command) {
    run_with_timeout(cmd, Duration::from_secs(300)).assert_success();
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = std::env::current_exe().unwrap();
        let target = exe.ancestors().nth(3).unwrap().to_path_buf();
        let dir = scratch("capi");
        let prefix = dir.join("prefix");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        // `cargo test` builds the library's rlib, not librankwise.so/.a: without this the
        // examples would link whatever an earlier build left there. The command is `make
        // build`'s, so that after it nothing is compiled again (a build of rankwise-capi
        // alone resolves its dependencies' features anew and compiles the whole stack).
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build
            .args([
                "build",
                "--release",
                "--workspace",
                "--lib",
                "--bins",
                "--examples",
                "--features",
                "rankwise/system-tests,rankwise-transports/system-tests",
                "--target-dir",
            ])
            .arg(&target);
        mpirun::without_cargo_test_env(&mut build);
        run(build);
        let mut install = Command::new("bash");
        install
            .arg(repo.join("scripts/install-capi.sh"))
            .arg(&prefix)
            .arg(&target);
        run(install);
        for (sub, targets) in [
            ("c", vec!["all", "svd_example_static"]),
            ("fortran", vec!["all"]),
        ] {
            let mut make = Command::new("make");
            make.arg("-C")
                .arg(repo.join("examples").join(sub))
                .arg(format!("PREFIX={}", prefix.display()))
                .arg(format!("OUT={}", bin.display()));
            for t in targets {
                let t = if t == "all" {
                    t.to_string()
                } else {
                    bin.join(t).display().to_string()
                };
                make.arg(t);
            }
            run(make);
        }
        Built { prefix, bin }
    })
}

/// Raw little-endian doubles of a file, as bits.
fn file_bits(path: &Path) -> Vec<u64> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Runs `program` with `args` on `np` ranks writing into a fresh directory; returns the
/// bits of S, Vᵀ and U (the ranks' blocks in rank order).
fn example_bits(program: &Path, np: usize, args: &[&str], out: &Path) -> [Vec<u64>; 3] {
    std::fs::create_dir_all(out).unwrap();
    let mut all: Vec<&str> = args.to_vec();
    let out_s = out.to_str().unwrap();
    all.insert(6, out_s);
    let run = mpirun(np, program, &all, LIMIT);
    run.assert_success();
    let u = (0..np)
        .flat_map(|r| file_bits(&out.join(format!("U.{r}.bin"))))
        .collect();
    [
        file_bits(&out.join("S.bin")),
        file_bits(&out.join("Vt.bin")),
        u,
    ]
}

/// The command line's S, Vᵀ and U on the same data.
fn cli_bits(args: &[String], out: &Path) -> [Vec<u64>; 3] {
    let mut all = args.to_vec();
    all.extend(["--out".to_string(), out.display().to_string()]);
    embedded(&all).assert_success();
    let g = group_bits(out, &["S", "Vt", "U"]);
    [g["S"].1.clone(), g["Vt"].1.clone(), g["U"].1.clone()]
}

/// 21 panels of 1,000 rows, the last ragged (11 rows): with 4 ranks the last rank holds
/// six panels and the ragged end, the others five.
const ROWS: &str = "20011";
const COLS: &str = "12";
const PANEL: &str = "1000";

fn compare(method: &str, cli: &[&str], extra: &[&str]) {
    compare_mode(method, method, cli, extra);
}

/// `rankwise <method> cli…` against the examples' `<mode>` with `extra` arguments; the
/// residuals too when the mode reports them (`rsvd-tol`).
fn compare_mode(method: &str, mode: &str, cli: &[&str], extra: &[&str]) {
    let b = built();
    let dir = scratch(&format!("capi-{mode}"));
    let seed = (test_seed() % 1_000_000).to_string();
    let mut cli_args = strings(&[
        method,
        "--rows",
        ROWS,
        "--cols",
        COLS,
        "--chunk-rows",
        PANEL,
    ]);
    cli_args.extend(strings(&["--seed", &seed, "--dist", "normal"]));
    cli_args.extend(strings(cli));
    let reference = cli_bits(&cli_args, &dir.join("cli.zarr"));
    let residuals = if mode == "rsvd-tol" {
        group_bits(&dir.join("cli.zarr"), &["residuals"])["residuals"]
            .1
            .clone()
    } else {
        Vec::new()
    };
    let mut args = vec![mode, ROWS, COLS, PANEL, &seed, "normal"];
    args.extend(extra);
    for (lang, program) in [
        ("c", b.bin.join("svd_example")),
        ("fortran", b.bin.join("svd_example_f")),
    ] {
        for np in [1, 2, 4] {
            let out = dir.join(format!("{lang}-np{np}"));
            let got = example_bits(&program, np, &args, &out);
            if mode == "rsvd-tol" {
                assert_eq!(
                    file_bits(&out.join("R.bin")),
                    residuals,
                    "{lang} np {np}: the residuals differ from the command line's"
                );
            }
            for (i, name) in ["S", "Vt", "U"].iter().enumerate() {
                assert_eq!(
                    got[i].len(),
                    reference[i].len(),
                    "{lang} {method} np {np}: {name} has a different length"
                );
                assert!(
                    got[i] == reference[i],
                    "{lang} {method} np {np}: {name} differs from the command line's"
                );
            }
        }
    }
}

#[test]
fn c_and_fortran_examples_match_the_cli_svd_bit_for_bit() {
    compare("svd", &[], &[]);
}

#[test]
fn c_and_fortran_examples_match_the_cli_rsvd_bit_for_bit() {
    compare(
        "rsvd",
        &[
            "-k",
            "4",
            "--oversample",
            "3",
            "--power-iters",
            "2",
            "--sketch-seed",
            "99",
            "--probes",
            "0",
        ],
        &["4", "3", "2", "99"],
    );
}

/// `rankwise_rsvd_tol`: the factors and each component's residual are the command line's
/// LOBPCG to the same tolerance, bit for bit, on 1, 2 and 4 ranks.
#[test]
fn c_and_fortran_examples_match_the_cli_rsvd_to_tolerance_with_residuals() {
    compare_mode(
        "rsvd",
        "rsvd-tol",
        &[
            "-k",
            "4",
            "--oversample",
            "3",
            "--method",
            "lobpcg",
            "--precision",
            "f64",
            "--tol",
            "1e-9",
            "--max-passes",
            "30",
            "--sketch-seed",
            "99",
            "--probes",
            "0",
        ],
        &["4", "3", "1e-9", "30", "99"],
    );
}

#[test]
fn the_statically_linked_example_needs_no_shared_rankwise_and_a_rank_may_hold_no_rows() {
    let b = built();
    let program = b.bin.join("svd_example_static");
    let ldd = Command::new("ldd").arg(&program).output().unwrap();
    let deps = String::from_utf8_lossy(&ldd.stdout);
    assert!(!deps.contains("librankwise"), "{deps}");
    // 3 panels on 4 ranks: rank 0 holds no rows (yet gets S and Vᵀ), rank 3 the ragged end.
    let dir = scratch("capi-static");
    let got = example_bits(
        &program,
        4,
        &["svd", "2500", "5", "1000", "3", "uniform"],
        &dir.join("out"),
    );
    let reference = cli_bits(
        &strings(&[
            "svd",
            "--rows",
            "2500",
            "--cols",
            "5",
            "--chunk-rows",
            "1000",
            "--seed",
            "3",
            "--dist",
            "uniform",
        ]),
        &dir.join("cli.zarr"),
    );
    assert_eq!(
        std::fs::metadata(dir.join("out/U.0.bin")).unwrap().len(),
        0,
        "rank 0 holds no rows"
    );
    assert!(got == reference, "the static example differs from the CLI");
    assert!(b.prefix.join("lib/pkgconfig/rankwise.pc").exists());
}

#[test]
fn the_header_works_from_cxx() {
    let b = built();
    run_with_timeout(Command::new(b.bin.join("cxx_header_check")), LIMIT)
        .assert_success()
        .assert_stdout_contains("from C++: status 0, U is 100 x 4");
}

#[test]
fn bad_arguments_return_codes_and_never_abort() {
    let b = built();
    let run = mpirun(2, &b.bin.join("bad_args"), &[], LIMIT);
    run.assert_success();
    for rank in 0..2 {
        assert!(
            run.stdout
                .contains(&format!("rank {rank}: all cases behaved")),
            "{}",
            run.describe()
        );
        for case in [
            "communicator 12345",
            "MPI_COMM_NULL",
            "freed communicator",
            "call on a communicator of one rank",
            "null a",
            "lda < rows",
            "k = 0",
            "k = cols",
            "negative tolerance",
            "one pass",
            "null residuals",
            "null converged",
            "ranks disagree on tol",
            "precision 7",
            "ranks disagree on precision",
            "null flops_per_second",
            "null bytes_per_second (tiles)",
            "lda < rows (tiles)",
            "null phases",
            "phases of a failed call",
            "pca null input",
            "pca k = 0",
            "pca maf 0.7",
            "pca missing keep file",
            "ranks disagree on the PCA's k",
            "ranks disagree on the PCA's input",
            "pca missing input",
            "pca get of NULL",
            "good call",
            "good call to a tolerance",
            "phases of a good call",
            "machine limit",
        ] {
            assert!(
                run.stdout.contains(&format!("rank {rank}: ok {case}:")),
                "rank {rank}, {case}:\n{}",
                run.describe()
            );
        }
    }
}

/// From C as from `rankwise rsvd --machine-limit` and `rankwise svd --machine-limit`:
/// every phase of a randomized and of an exact SVD with its seconds, its products' flops
/// and the bytes each rank read (rankwise_last_phases), the GEMM rate of every rank's
/// threads (rankwise_gemm_peak, and rankwise_machine_gemm_peak with the program as its own
/// probe of OpenBLAS's other kernels) and the rate they read the caller's rows at, into
/// the randomized passes' tiles (rankwise_tile_production_peak) or the exact SVD's row
/// blocks (rankwise_production_peak), so each pass's share of the GEMM rate and its machine
/// limit.
#[test]
fn the_c_library_gives_each_pass_its_share_of_the_machine_limit() {
    let b = built();
    let (rows, cols) = (40_000u64, 300u64);
    for exact in [false, true] {
        let mut args = vec!["40000", "300", "5000", "3", "10", "10", "1"];
        if exact {
            args.push("svd");
        }
        let run = mpirun(2, &b.bin.join("machine_limit"), &args, LIMIT);
        run.assert_success();
        let mut peaks = Vec::new();
        let mut shares = Vec::new();
        let mut bytes = Vec::new();
        for line in run.stdout.lines().filter(|l| l.starts_with("phase ")) {
            // phase NAME: S s, R GFLOP/s, P % of K GFLOP/s; limit L s, Q % (B bytes at G GB/s)
            let (name, rest) = line["phase ".len()..].rsplit_once(": ").unwrap();
            let (gemm, limit) = rest.split_once("; limit ").unwrap();
            let words: Vec<&str> = gemm.split_whitespace().collect();
            let seconds: f64 = words[0].parse().unwrap();
            assert!(seconds >= 0.0, "{line}");
            peaks.push(words[words.len() - 2].to_string());
            let limit: Vec<&str> = limit.split_whitespace().collect();
            if limit[0] != "-" {
                let at: f64 = limit[0].parse().unwrap();
                let share: f64 = limit[2].parse().unwrap();
                assert!(at > 0.0 && share > 0.0 && share < 1000.0, "{line}");
                bytes.push((
                    name.to_string(),
                    limit[4].trim_start_matches('(').parse::<u64>().unwrap(),
                ));
            }
            if words[2] != "-" {
                let share: f64 = words[4].parse().unwrap();
                assert!(share > 0.0 && share < 400.0, "{line}");
                shares.push((name.to_string(), share));
            }
        }
        assert!(
            shares.iter().any(|(n, _)| n.starts_with("pass 1")),
            "no share for pass 1:\n{}",
            run.describe()
        );
        assert!(
            shares.len() >= if exact { 2 } else { 3 },
            "{}",
            run.describe()
        );
        // The first pass read every value of the matrix, on the two ranks together.
        let first = bytes.iter().find(|(n, _)| n.starts_with("pass 1"));
        assert_eq!(
            first.map(|b| b.1),
            Some(rows * cols * 8),
            "{}",
            run.describe()
        );
        let peak: f64 = peaks[0].parse().unwrap();
        assert!(peak > 0.1, "{}", run.describe());
        assert!(peaks.iter().all(|p| *p == peaks[0]), "{}", run.describe());
        // The best kernels, each measured in a process of the program itself
        // (rankwise_serve_gemm_probe): the phases' shares are of that rate; where the
        // loaded kernels are not the best, theirs is the lower one.
        let gemm: Vec<f64> = (run.stdout.lines())
            .find_map(|l| l.strip_prefix("gemm "))
            .unwrap_or_else(|| panic!("no gemm line:\n{}", run.describe()))
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let [loaded, best, slower] = gemm[..] else {
            panic!("{gemm:?}:\n{}", run.describe())
        };
        assert!(loaded > 0.0 && best > 0.0, "{}", run.describe());
        assert_eq!(format!("{best:.2}"), peaks[0], "{}", run.describe());
        assert!(
            slower == 0.0 || (slower > 0.0 && slower < best),
            "{}",
            run.describe()
        );
    }
}

/// The Fortran module's machine-limit calls on good arguments, under mpirun with two
/// ranks: the last call's phases, the GEMM rate with the loaded kernels and with the best
/// (rankwise_machine_gemm_peak, the program its own probe through
/// rankwise_serve_gemm_probe), and the rate the threads read the caller's matrix at, into
/// the exact SVD's row blocks or the randomized passes' tiles
/// (rankwise_tile_production_peak).
#[test]
fn fortran_measures_the_machine_limit_as_c_does() {
    let b = built();
    let dir = scratch("capi-fortran-rates");
    for (mode, extra) in [("svd", &[][..]), ("rsvd", &["4", "3", "2", "99"][..])] {
        let out = dir.join(mode);
        std::fs::create_dir_all(&out).unwrap();
        let mut args = vec![
            mode,
            ROWS,
            COLS,
            PANEL,
            "7",
            "normal",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut cmd = mpirun::mpirun_command(2, &b.bin.join("svd_example_f"), &args);
        cmd.env("RANKWISE_EXAMPLE_RATES", "1");
        let run = run_with_timeout(cmd, LIMIT);
        run.assert_success();
        // rates: N phases, gemm L GFLOP/s loaded, B GFLOP/s best, reads R GB/s
        let line = (run.stdout.lines())
            .find_map(|l| l.strip_prefix("rates: "))
            .unwrap_or_else(|| panic!("{mode}: no rates line:\n{}", run.describe()));
        let numbers: Vec<f64> = (line.split([' ', ',']))
            .filter_map(|w| w.parse().ok())
            .collect();
        let [phases, loaded, best, reads] = numbers[..] else {
            panic!("{mode}: {line}");
        };
        // The exact SVD's five phases, and a randomized SVD's passes, orthonormalizations
        // and forming of U.
        assert!(phases >= 4.0, "{mode}: {line}");
        assert!(loaded > 0.0 && best > 0.0 && reads > 0.0, "{mode}: {line}");
        // Only rank 0 prints, and the probes it started answered without printing here.
        assert_eq!(
            run.stdout.matches("rates: ").count(),
            1,
            "{}",
            run.describe()
        );
    }
}

#[test]
fn fortran_bad_arguments_return_codes_and_messages() {
    let b = built();
    let run = mpirun(2, &b.bin.join("bad_args_f"), &[], LIMIT);
    run.assert_success();
    for rank in 0..2 {
        for line in [
            "all cases behaved",
            "ok communicator 12345: `comm`",
            "ok k = 0: `k`",
            "ok lda < rows: `lda`",
            "ok good call",
            "ok phases",
            "ok precision 7: `precision`",
            "ok machine limit",
        ] {
            assert!(
                run.stdout.contains(&format!("rank {rank}: {line}")),
                "rank {rank}, {line}:\n{}",
                run.describe()
            );
        }
    }
}

/// `rankwise_pca` from C, under mpirun with 1, 2 and 3 ranks, on a fresh cohort: every
/// rank's eigenvalues, PCs, residuals and sample IDs are the command line's (`rankwise pca
/// --out`: its group's `eigenvalues`, `Vt` and `residuals`, its `.eigenvec`'s IIDs) bit for
/// bit, and the files it publishes with `out` are byte-identical to the command line's; the
/// Fortran module's `rankwise_genotype_pca` gives the same eigenvalues and PCs.
/// An existing `out` is refused on every rank, naming it, and left as it was.
#[test]
fn the_c_pca_matches_the_command_line_and_publishes_the_same_files() {
    let b = built();
    let dir = scratch("capi-pca");
    let mut draw = Draw(test_seed());
    let (variants, samples) = (draw.range(1500, 3000), draw.range(80, 200));
    let prefix = dir.join("cohort");
    rankwise::genomics::write_example_fileset(&prefix, variants, samples, draw.next()).unwrap();
    let p = prefix.to_str().unwrap();
    let k = draw.range(2, 6).to_string();
    let seed = (draw.next() % 1000).to_string();
    let what = format!("{variants} × {samples}, k = {k}, seed {seed}");
    let cli_out = dir.join("cli.zarr");
    embedded(&strings(&[
        "pca",
        "--bed",
        p,
        "-k",
        &k,
        "--chr",
        "1-20",
        "--sketch-seed",
        &seed,
        "--out",
        cli_out.to_str().unwrap(),
    ]))
    .assert_success();
    let g = group_bits(&cli_out, &["eigenvalues", "Vt", "residuals"]);
    let (vt_shape, vt) = &g["Vt"];
    let (kk, n) = (vt_shape[0] as usize, vt_shape[1] as usize);
    assert_eq!(n as u64, samples, "{what}");
    // The PCs, samples × k row-major: Vᵀ transposed.
    let pcs: Vec<u64> = (0..n)
        .flat_map(|i| (0..kk).map(move |j| vt[j * n + i]))
        .collect();
    let eigenvec = std::fs::read_to_string(cli_out.with_extension("eigenvec")).unwrap();
    let iids: Vec<&str> = eigenvec
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    let tree = |root: &Path| {
        let mut files = std::collections::BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let path = e.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let name = path.strip_prefix(root).unwrap().display().to_string();
                    let mut bytes = std::fs::read(&path).unwrap();
                    if name == "zarr.json" {
                        // The command line's run report, an attribute of its group.
                        let mut meta: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                        meta["attributes"]
                            .as_object_mut()
                            .map(|a| a.remove("report"));
                        bytes = meta.to_string().into_bytes();
                    }
                    files.insert(name, bytes);
                }
            }
        }
        files
    };
    let cli_files = tree(&cli_out);
    for np in [1, 2, 3] {
        let out = dir.join(format!("np{np}"));
        std::fs::create_dir_all(&out).unwrap();
        let group = out.join("c.zarr");
        let args = [
            p,
            out.to_str().unwrap(),
            &k,
            group.to_str().unwrap(),
            "1-20",
            &seed,
        ];
        let run = mpirun(np, &b.bin.join("pca_example"), &args, LIMIT);
        run.assert_success();
        assert!(
            run.stdout.contains("all converged"),
            "{what}: {}",
            run.describe()
        );
        for rank in 0..np {
            let file = |name: &str| out.join(format!("{name}.{rank}.bin"));
            let at = format!("{what}, rank {rank} of {np}");
            assert_eq!(file_bits(&file("eigenval")), g["eigenvalues"].1, "{at}");
            assert_eq!(file_bits(&file("residuals")), g["residuals"].1, "{at}");
            assert!(file_bits(&file("pcs")) == pcs, "{at}: the PCs differ");
            let ids = std::fs::read_to_string(out.join(format!("ids.{rank}.txt"))).unwrap();
            assert_eq!(ids.lines().collect::<Vec<_>>(), iids, "{at}");
        }
        assert!(
            tree(&group) == cli_files,
            "{what}, {np} ranks: the groups differ"
        );
        for ext in ["eigenvec", "eigenval", "eigenvec.var", "afreq"] {
            assert_eq!(
                std::fs::read(group.with_extension(ext)).unwrap(),
                std::fs::read(cli_out.with_extension(ext)).unwrap(),
                "{what}, {np} ranks: .{ext}"
            );
        }
    }
    // The Fortran module's rankwise_genotype_pca: the same bits, its PCs column-major
    // (samples × k), which is Vᵀ's row-major order.
    for np in [1, 2] {
        let out = dir.join(format!("fortran-np{np}"));
        std::fs::create_dir_all(&out).unwrap();
        let args = [p, out.to_str().unwrap(), &k, &seed, "1-20"];
        let run = mpirun(np, &b.bin.join("pca_example_f"), &args, LIMIT);
        run.assert_success();
        assert!(
            run.stdout.contains("converged T"),
            "{what}: {}",
            run.describe()
        );
        for rank in 0..np {
            let file = |name: &str| out.join(format!("{name}.{rank}.bin"));
            let at = format!("{what}, Fortran, rank {rank} of {np}");
            assert_eq!(file_bits(&file("eigenval")), g["eigenvalues"].1, "{at}");
            assert!(file_bits(&file("pcs")) == *vt, "{at}: the PCs differ");
        }
    }
    // Published results are never overwritten: every rank fails, naming `out`.
    let before = tree(&cli_out);
    let out = dir.join("again");
    std::fs::create_dir_all(&out).unwrap();
    let args = [
        p,
        out.to_str().unwrap(),
        &k,
        cli_out.to_str().unwrap(),
        "1-20",
        &seed,
    ];
    let run = mpirun(2, &b.bin.join("pca_example"), &args, LIMIT);
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{}", run.describe());
    for rank in 0..2 {
        assert!(
            run.stderr.lines().any(
                |l| l.starts_with(&format!("rank {rank}: rankwise_pca failed"))
                    && l.contains("`out`")
            ),
            "rank {rank}:\n{}",
            run.describe()
        );
    }
    assert!(tree(&cli_out) == before, "the existing group changed");
}
