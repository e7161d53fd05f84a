//! The Python package (`python/`): its wheel is built by maturin and installed into the
//! pinned test environment (`scripts/python-venv.sh`), and pytest runs its tests
//! (`python/tests/`) against numpy, scikit-learn, dask, xarray, zarr-python, the release
//! binary and `mpirun` with mpi4py. One test here so that `make test` runs them all; pytest's
//! report is printed when any fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rankwise_testkit::process::{run_with_timeout, without_cargo_test_env};

mod common;

/// Builds the wheel into the pinned test environment (`scripts/python-venv.sh`) once for
/// both tests: the environment and the wheel's path. (A second build while the other test
/// installs the wheel would replace the file under it.)
fn wheel() -> (PathBuf, String) {
    static BUILT: std::sync::OnceLock<(PathBuf, String)> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_wheel).clone()
}

fn build_wheel() -> (PathBuf, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target").join("python-venv");
    let mut build = Command::new(root.join("scripts").join("python-venv.sh"));
    // maturin runs cargo: without cargo's test variables, it reuses `make build`'s work.
    without_cargo_test_env(&mut build);
    let built = build
        .arg(&venv)
        .output()
        .expect("scripts/python-venv.sh runs");
    assert!(
        built.status.success(),
        "scripts/python-venv.sh failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wheel = String::from_utf8_lossy(&built.stdout).trim().to_string();
    (venv, wheel)
}

#[test]
fn the_python_package_passes_its_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (venv, wheel) = wheel();
    let tmp = common::scratch("python-tmp");
    let mut pytest = Command::new(venv.join("bin").join("python"));
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join("python").join("tests"))
        .env("RANKWISE_WHEEL", &wheel)
        .env("RANKWISE_BIN", root.join("target/release/rankwise"))
        .env(
            "RANKWISE_TEST_SEED",
            rankwise_testkit::test_seed().to_string(),
        )
        // A temporary folder of its own: a test checks that a call leaves nothing behind
        // in it, which the sgkit test writing its stores at the same time would upset.
        .env("TMPDIR", &tmp)
        // The tests import the installed wheel, never the source folder.
        .current_dir(&tmp);
    let out = run_with_timeout(pytest, Duration::from_secs(900));
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(out.success(), "pytest failed:\n{}", out.describe());
}

/// `rankwise.pca` of a Dataset that sgkit's own `simulate_genotype_call_dataset` made, in
/// sgkit's environment (sgkit 0.10 pins zarr-python 2, so it has a venv of its own and the
/// wheel is installed there): the exact PCA, the command line's bits on the Dataset that
/// `sgkit.save_dataset` wrote, and `sgkit.pca` (`python/tests/sgkit_dataset.py`).
#[test]
fn an_sgkit_simulated_dataset_gives_the_exact_pca_and_the_command_lines_bits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (_, wheel) = wheel();
    let python = common::sgkit_python();
    let pip = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--force-reinstall", "--no-deps", &wheel])
        .output()
        .expect("pip runs");
    assert!(
        pip.status.success(),
        "installing {wheel} into sgkit's environment failed:\n{}",
        String::from_utf8_lossy(&pip.stderr)
    );
    let dir = common::scratch("python-sgkit");
    let seed = rankwise_testkit::test_seed();
    let mut check = Command::new(&python);
    check
        .arg(root.join("python/tests/sgkit_dataset.py"))
        .arg(seed.to_string())
        .arg(common::rankwise_bin())
        .arg(&dir)
        .current_dir(&dir);
    let out = run_with_timeout(check, Duration::from_secs(600));
    assert!(
        out.success(),
        "sgkit_dataset.py (seed {seed}) failed:\n{}",
        out.describe()
    );
    println!("{}", out.stdout);
}
