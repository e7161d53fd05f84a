//! The Python package (`python/`): its wheel is built by maturin and installed into the
//! pinned test environment (`scripts/python-venv.sh`), and pytest runs its tests
//! (`python/tests/`) against numpy, scikit-learn, dask, xarray, zarr-python, the release
//! binary and `mpirun` with mpi4py. One test here so that `make test` runs them all; pytest's
//! report is printed when any fails.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rankwise_testkit::process::{run_with_timeout, without_cargo_test_env};

#[test]
fn the_python_package_passes_its_tests() {
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
        // The tests import the installed wheel, never the source folder.
        .current_dir(std::env::temp_dir());
    let out = run_with_timeout(pytest, Duration::from_secs(900));
    assert!(out.success(), "pytest failed:\n{}", out.describe());
}
