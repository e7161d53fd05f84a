//! `scripts/bundle.sh`: the relocatable copy resolves every library it links from its own
//! `lib/` (the C library's excepted) and computes the same bits as the build it came from.

mod common;

use std::process::Command;

use common::mpirun::run_with_timeout;
use common::*;

#[test]
fn a_bundle_runs_from_its_own_libraries_with_the_same_bits() {
    let scratch = scratch("bundle");
    let dir = scratch.join("rankwise-bundle");
    repo_script("bundle.sh", &[dir.as_os_str()]);
    let lib = dir.join("lib");
    let bin = dir.join("bin/rankwise");
    // Every library outside the C library's own comes from the bundle.
    let ldd = Command::new("ldd")
        .arg(&bin)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .expect("running ldd");
    let text = String::from_utf8_lossy(&ldd.stdout);
    let c_library = ["libc.so", "libm.so", "ld-linux", "linux-vdso"];
    let mut from_bundle = 0;
    for line in text.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if c_library
            .iter()
            .any(|c| name.starts_with(c) || line.contains(c))
        {
            continue;
        }
        assert!(
            line.contains(lib.to_str().unwrap()),
            "{name} does not resolve into the bundle:\n{text}"
        );
        from_bundle += 1;
    }
    assert!(from_bundle >= 5, "{text}");
    // The same run, from the bundle and from the build.
    let args = [
        "svd",
        "--rows",
        "40000",
        "--cols",
        "12",
        "--chunk-rows",
        "5000",
        "--json",
    ];
    let mut cmd = Command::new(&bin);
    cmd.args(args).env("LD_LIBRARY_PATH", &lib);
    let bundled = report(&run_with_timeout(cmd, CLI_LIMIT));
    let built = report(&embedded(&strings(&args)));
    assert_eq!(
        json_bits(&bundled["singular_values"]),
        json_bits(&built["singular_values"])
    );
    // A second bundle never overwrites the first.
    let again = Command::new("bash")
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bundle.sh"))
        .arg(&dir)
        .output()
        .expect("running bash");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
    let _ = std::fs::remove_dir_all(&scratch);
}
