//! Regressions of hostile input, each named after the defect it held:
//! - a decoder that panics in a read-ahead thread (zarrs on a sharded store whose shard
//!   index points past the end of the address space, its CRC recomputed so that it passes)
//!   fails the run naming the rows, embedded, with local ranks and under `mpirun`, instead
//!   of hanging;
//! - absurd shapes in `zarr.json`/`.zarray` or on the command line are refused with an
//!   error naming the option, instead of aborting on an allocation;
//! - decompression bombs (zstd and gzip, v2 and v3), chunk files longer than any encoding
//!   of their chunk (sparse, 600 MB) and chunk paths linked to `/dev/zero` are refused
//!   naming the chunk, with peak RSS (from `wait4`) within the budget;
//! - peak RSS stays within the least budget each plan accepts plus the stated fixed
//!   overhead, for `read`, `svd`, `rsvd` (three methods) and `pca` on drawn shapes;
//! - NaN, ±Inf and values whose squares overflow are named with their row, column and
//!   chunk, embedded and under `mpirun`; data scaled by 1e-140…1e100 gives LAPACK's σ, and
//!   data too small for the passes' squares is refused (never σ = 0 "converged");
//! - options whose values overflow (`--oversample`, `--probes`, `--power-iters` of
//!   2⁶⁴ − 1) and `--comm-timeout 0` are refused naming the option;
//! - metadata, PLINK files and sample or variant lists that are FIFOs or links to
//!   `/dev/zero` are refused naming the file (they hung the run, or filled the memory), and
//!   chunk shapes wider than the array are refused by the plan (an abort before).
//!
//! Shapes and seeds are drawn from `test_seed()` (printed; set RANKWISE_TEST_SEED to
//! reproduce a failure).

mod common;

use std::path::Path;

use common::*;

/// CRC-32C (Castagnoli), as the sharding index's `crc32c` codec writes it.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Every shard file of a v3 store `rankwise gen --shard-rows` wrote (`c/<i>/0`).
fn shard_files(store: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![store.join("c")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_panicking_decoder_in_a_readahead_thread_fails_the_run_instead_of_hanging() {
    let mut draw = Draw(test_seed());
    let dir = scratch("hardening-shard-overflow");
    let store = dir.join("s.zarr");
    let chunk = draw.range(50, 200);
    let shard = chunk * draw.range(2, 4);
    let rows = shard * draw.range(3, 6);
    let cols = draw.range(10, 40);
    let spec = gen_store(
        &store,
        (rows, cols, chunk),
        "normal",
        &draw.next().to_string(),
        &["--shard-rows", &shard.to_string(), "--codec", "none"],
    );
    let meta = std::fs::read_to_string(store.join("zarr.json")).unwrap();
    assert!(
        meta.contains("crc32c"),
        "the shard index carries a CRC: {meta}"
    );
    // The same store with a `crc32c` after the inner chunks' `bytes`: a chain rankwise
    // leaves to zarrs, which panics on a shard's first index entry below before it reads
    // any inner chunk (whose checksums this store lacks).
    let zarrs_store = dir.join("t.zarr");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(&store)
        .arg(&zarrs_store)
        .status()
        .unwrap();
    assert!(copied.success());
    let mut m: serde_json::Value = serde_json::from_str(&meta).unwrap();
    m["codecs"][0]["configuration"]["codecs"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "crc32c"}));
    std::fs::write(zarrs_store.join("zarr.json"), m.to_string()).unwrap();
    // The shard index sits at the end of the shard: (offset, nbytes) per inner chunk as
    // little-endian u64s, then the CRC-32C of those bytes. The first shard's entry, so
    // that zarrs meets it before any other chunk.
    let entries = (shard / chunk) as usize;
    let entry = draw.range(0, entries as u64 - 1) as usize;
    // Every shard of the zarrs store, so that each rank of a multi-rank read meets one
    // before an inner chunk without its checksum.
    let victims = [shard_files(&store)[..1].to_vec(), shard_files(&zarrs_store)];
    for (victim, entry) in victims[0]
        .iter()
        .map(|v| (v, entry))
        .chain(victims[1].iter().map(|v| (v, 0)))
    {
        let mut bytes = std::fs::read(victim).unwrap();
        let index_len = entries * 16;
        let start = bytes.len() - index_len - 4;
        let at = start + entry * 16;
        bytes[at..at + 8].copy_from_slice(&(u64::MAX - 9).to_le_bytes());
        bytes[at + 8..at + 16].copy_from_slice(&100u64.to_le_bytes());
        let crc = crc32c(&bytes[start..start + index_len]);
        let end = bytes.len();
        bytes[end - 4..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(victim, &bytes).unwrap();
    }
    let what = format!("{rows} × {cols}, chunks of {chunk}, shards of {shard}: entry {entry}");
    // Decoded here: an error naming the inner chunk and its range.
    let run = embedded(&strings(&["read", "--zarr", &spec]));
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{what}\n{}", run.describe());
    assert!(
        run.stderr.contains(&format!("inner chunk [{entry}, 0]"))
            && run.stderr.contains("lies outside"),
        "{what}: the range is refused, naming the inner chunk\n{}",
        run.describe()
    );
    // Decoded by zarrs, which panics: the panic is the rank's failure, never a hang.
    let spec = zarrs_store.to_str().unwrap().to_string();
    for extra in [vec![], vec!["--local-ranks", "4"]] {
        let mut args = strings(&["read", "--zarr", &spec, "--comm-timeout", "30"]);
        args.extend(strings(&extra));
        let run = embedded(&args);
        run.assert_finished();
        assert_eq!(run.code, Some(1), "{what}: {extra:?}\n{}", run.describe());
        assert!(
            run.stderr.contains("panicked") && run.stderr.contains("reading rows"),
            "{what}: {extra:?}: the error names the rows and the panic\n{}",
            run.describe()
        );
    }
    let run = under_mpirun(
        2,
        &strings(&["read", "--zarr", &spec, "--comm-timeout", "30"]),
    );
    run.assert_finished();
    assert_ne!(run.code, Some(0), "{what}\n{}", run.describe());
    assert!(
        run.stderr.contains("panicked"),
        "{what}: mpirun -np 2\n{}",
        run.describe()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn absurd_shapes_in_metadata_and_options_are_refused_not_aborted() {
    let dir = scratch("hardening-shapes");
    for (i, shape) in [
        "[1000000000000000, 1000000000000000]",
        "[1000000000000000, 50]",
        "[18446744073709551615, 10]",
    ]
    .iter()
    .enumerate()
    {
        let v3 = dir.join(format!("v3-{i}.zarr"));
        std::fs::create_dir_all(&v3).unwrap();
        std::fs::write(
            v3.join("zarr.json"),
            format!(
                r#"{{"zarr_format": 3, "node_type": "array", "shape": {shape},
                "data_type": "float64", "chunk_grid": {{"name": "regular",
                "configuration": {{"chunk_shape": [200, 10]}}}},
                "chunk_key_encoding": {{"name": "default"}}, "fill_value": 0.0,
                "codecs": [{{"name": "bytes", "configuration": {{"endian": "little"}}}}]}}"#
            ),
        )
        .unwrap();
        let v2 = dir.join(format!("v2-{i}.zarr"));
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(
            v2.join(".zarray"),
            format!(
                r#"{{"zarr_format": 2, "shape": {shape}, "chunks": [200, 10], "dtype": "<f8",
                "compressor": null, "fill_value": 0, "order": "C", "filters": null}}"#
            ),
        )
        .unwrap();
        for store in [&v3, &v2] {
            let path = store.to_str().unwrap();
            for cmd in [
                vec!["read", "--zarr", path],
                vec!["rsvd", "--zarr", path, "-k", "2"],
                vec!["svd", "--zarr", path],
            ] {
                let run = embedded(&strings(&cmd));
                run.assert_finished();
                assert_eq!(
                    run.code,
                    Some(1),
                    "{cmd:?} of shape {shape}: an error, not an abort\n{}",
                    run.describe()
                );
                assert!(
                    run.stderr.contains("rankwise: rank 0 failed: "),
                    "{cmd:?}: {}",
                    run.stderr
                );
            }
        }
    }
    let run = embedded(&strings(&[
        "plan",
        "--rows",
        "549755813888",
        "--cols",
        "10",
        "--chunk-rows",
        "1",
    ]));
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(run.stderr.contains("--chunk-rows"), "{}", run.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn overflowing_option_values_and_a_zero_comm_timeout_are_refused_naming_the_option() {
    let base = strings(&[
        "rsvd",
        "--rows",
        "2000",
        "--cols",
        "100",
        "--chunk-rows",
        "500",
        "-k",
        "5",
    ]);
    let max = u64::MAX.to_string();
    for (option, value) in [
        ("--oversample", max.as_str()),
        ("--probes", max.as_str()),
        ("--power-iters", max.as_str()),
        ("--max-passes", max.as_str()),
    ] {
        let mut args = base.clone();
        args.extend(strings(&[option, value]));
        let run = embedded(&args);
        run.assert_finished();
        assert_fails_naming(&run, &args, option);
    }
    let mut args = base.clone();
    args.extend(strings(&["--comm-timeout", "0"]));
    let run = embedded(&args);
    run.assert_finished();
    assert_eq!(run.code, Some(2), "clap refuses it: {}", run.describe());
    assert!(run.stderr.contains("--comm-timeout"), "{}", run.stderr);
}

#[test]
fn a_zarr_json_that_is_not_json_is_reported_as_such_with_where() {
    let dir = scratch("hardening-bad-json");
    let store = dir.join("s.zarr");
    std::fs::create_dir_all(&store).unwrap();
    std::fs::write(
        store.join("zarr.json"),
        "{\"zarr_format\": 3, \"node_type\": \"array\",\n \"shape\": [10, 10",
    )
    .unwrap();
    let run = embedded(&strings(&["read", "--zarr", store.to_str().unwrap()]));
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(
        run.stderr.contains("zarr.json is not valid JSON") && run.stderr.contains("line 2"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("neither"), "{}", run.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reads_checksum_is_nan_when_a_panel_sums_to_nan() {
    let mut draw = Draw(test_seed() ^ 5);
    let dir = scratch("hardening-nan-sum");
    let store = dir.join("s.zarr");
    let (rows, cols, chunk) = (draw.range(400, 900), draw.range(5, 20), draw.range(50, 100));
    let spec = gen_store(
        &store,
        (rows, cols, chunk),
        "normal",
        &draw.next().to_string(),
        &["--codec", "none"],
    );
    let clean = report(&embedded(&strings(&["read", "--zarr", &spec, "--json"])));
    assert!(clean["sum"].as_f64().unwrap().is_finite(), "{clean}");
    let chunks = shard_files(&store);
    let victim = &chunks[draw.range(0, chunks.len() as u64 - 1) as usize];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[..8].copy_from_slice(&f64::NAN.to_le_bytes());
    std::fs::write(victim, &bytes).unwrap();
    for extra in [vec![], vec!["--local-ranks", "3"]] {
        let mut args = strings(&["read", "--zarr", &spec, "--json"]);
        args.extend(strings(&extra));
        let r = report(&embedded(&args));
        assert_eq!(r["sum_text"], "NaN", "{extra:?}: {r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_vcf_zarr_ploidy_beyond_what_a_dosage_holds_is_named() {
    let dir = scratch("hardening-ploidy");
    let store = dir.join("v.vcz");
    let gt = store.join("call_genotype");
    std::fs::create_dir_all(gt.join("c/0/0")).unwrap();
    std::fs::write(
        store.join("zarr.json"),
        r#"{"zarr_format": 3, "node_type": "group", "attributes": {}}"#,
    )
    .unwrap();
    let (v, s, p) = (4u64, 3u64, 130u64);
    std::fs::write(
        gt.join("zarr.json"),
        format!(
            r#"{{"zarr_format": 3, "node_type": "array", "shape": [{v}, {s}, {p}],
            "data_type": "int8", "chunk_grid": {{"name": "regular",
            "configuration": {{"chunk_shape": [{v}, {s}, {p}]}}}},
            "chunk_key_encoding": {{"name": "default"}}, "fill_value": 0,
            "codecs": [{{"name": "bytes"}}]}}"#
        ),
    )
    .unwrap();
    std::fs::write(gt.join("c/0/0/0"), vec![1u8; (v * s * p) as usize]).unwrap();
    let run = embedded(&strings(&[
        "pca",
        "--vcf-zarr",
        store.to_str().unwrap(),
        "-k",
        "1",
    ]));
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(
        run.stderr.contains("ploidy 130") && run.stderr.contains("call_genotype"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("-126"), "{}", run.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------
// Signals: nothing left behind, and the next run to the same --out works
// ---------------------------------------------------------------------------------------

/// Entries of `dir` whose names contain `.tmp-`.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

/// A `gen` long enough to interrupt: `--seed marker` finds its processes.
fn long_gen(out: &Path, marker: &str) -> Vec<String> {
    strings(&[
        "gen",
        "--out",
        out.to_str().unwrap(),
        "--rows",
        "3000000",
        "--cols",
        "64",
        "--chunk-rows",
        "20000",
        "--codec",
        "zstd",
        "--seed",
        marker,
    ])
}

/// Starts `cmd`, waits until `ready` says the run is writing, sends `signal` to the
/// processes `targets` picks, and returns the exit status and stderr.
fn interrupt(
    mut cmd: std::process::Command,
    ready: impl Fn() -> bool,
    targets: impl Fn(&std::process::Child) -> Vec<i32>,
    signal: i32,
) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let start = std::time::Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the run never started writing"
        );
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the run ended ({status}) before it could be interrupted");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for pid in targets(&child) {
        unsafe { libc::kill(pid, signal) };
    }
    let mut stderr = String::new();
    let pipe = child.stderr.take();
    let waited = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            if let Some(mut p) = pipe {
                let _ = p.read_to_string(&mut stderr);
            }
            return (status, stderr);
        }
        if waited.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the run did not end within 60 s of signal {signal}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn sigint_and_sigterm_remove_the_temporaries_embedded_and_under_mpirun() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch("hardening-signals");
    for (np, signal) in [
        (1usize, libc::SIGINT),
        (1, libc::SIGTERM),
        (3, libc::SIGTERM),
        (3, libc::SIGINT),
    ] {
        let out = dir.join(format!("g-{np}-{signal}.zarr"));
        let marker = format!(
            "{}",
            4_000_000 + 100 * std::process::id() as u64 + signal as u64
        );
        let args = long_gen(&out, &marker);
        let cmd = match np {
            1 => {
                let mut c = std::process::Command::new(rankwise_bin());
                c.args(&args);
                c
            }
            n => {
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                common::mpirun::mpirun_command(n, &rankwise_bin(), &a)
            }
        };
        let what = format!("{np} rank(s), signal {signal}");
        let ready = || !temporaries(&dir).is_empty() && rankwise_pids("gen", &marker).len() == np;
        // Embedded: the process itself. Under mpirun: mpirun, which passes it on.
        let (status, stderr) = interrupt(cmd, ready, |child| vec![child.id() as i32], signal);
        assert!(
            !status.success(),
            "{what}: the run must not look successful"
        );
        if np == 1 {
            assert_eq!(status.code(), Some(128 + signal), "{what}: {stderr}");
            assert!(
                stderr.contains("temporary output(s) removed"),
                "{what}: {stderr}"
            );
        } else {
            assert!(
                status.code().is_some() || status.signal().is_some(),
                "{what}"
            );
        }
        // Every rank is gone, and with it every temporary.
        let gone = std::time::Instant::now();
        while !rankwise_pids("gen", &marker).is_empty() {
            assert!(gone.elapsed().as_secs() < 30, "{what}: ranks left running");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(temporaries(&dir), Vec::<String>::new(), "{what}: {stderr}");
        assert!(
            !out.exists(),
            "{what}: an interrupted output looks complete"
        );
        // The next run to the same --out works.
        let rerun = embedded(&strings(&[
            "gen",
            "--out",
            out.to_str().unwrap(),
            "--rows",
            "1000",
            "--cols",
            "8",
            "--chunk-rows",
            "100",
        ]));
        rerun.assert_success();
        assert!(out.join("zarr.json").exists(), "{what}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A signal's message says where the run was: the pass, of at most how many, of what.
#[test]
fn a_signal_says_which_pass_it_ended() {
    let dir = scratch("hardening-signal-pass");
    let out = dir.join("r.zarr");
    let mut cmd = std::process::Command::new(rankwise_bin());
    cmd.args([
        "rsvd",
        "--rows",
        "400000",
        "--cols",
        "400",
        "--chunk-rows",
        "20000",
        "-k",
        "20",
        "--tol",
        "1e-15",
        "--max-passes",
        "80",
        "--out",
        out.to_str().unwrap(),
    ]);
    let started = std::time::Instant::now();
    // Its output is open (so the passes have begun) and a second has gone by.
    let ready = || !temporaries(&dir).is_empty() && started.elapsed().as_secs_f64() > 2.0;
    let (status, stderr) = interrupt(cmd, ready, |c| vec![c.id() as i32], libc::SIGTERM);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("stopped by SIGTERM"))
        .unwrap_or_else(|| panic!("no stop message: {stderr}"));
    assert!(
        line.starts_with("rankwise: rank 0 stopped by SIGTERM in pass ")
            && line.contains(" (of at most 80) of rsvd k = 20; ")
            && line.ends_with("temporary output(s) removed"),
        "{line}"
    );
    assert_eq!(temporaries(&dir), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rank_killed_under_mpirun_leaves_no_temporaries() {
    let dir = scratch("hardening-killed-rank");
    let out = dir.join("g.zarr");
    let marker = format!("{}", 5_000_000 + std::process::id() as u64);
    let args = long_gen(&out, &marker);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let cmd = common::mpirun::mpirun_command(3, &rankwise_bin(), &a);
    let ready = || !temporaries(&dir).is_empty() && rankwise_pids("gen", &marker).len() == 3;
    // SIGKILL of rank 1 alone (the second of the ranks by PID is as good as any).
    let (status, stderr) = interrupt(
        cmd,
        ready,
        |_| {
            rankwise_pids("gen", &marker)
                .into_iter()
                .skip(1)
                .take(1)
                .collect()
        },
        libc::SIGKILL,
    );
    assert!(!status.success(), "{stderr}");
    let gone = std::time::Instant::now();
    while !rankwise_pids("gen", &marker).is_empty() {
        assert!(
            gone.elapsed().as_secs() < 30,
            "ranks left running: {stderr}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(temporaries(&dir), Vec::<String>::new(), "{stderr}");
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// What SIGKILL of every rank leaves cannot be told from a run still writing (on a shared
/// file system its writer may be on another node): the next run to the same --out names it
/// and says how to remove it, and succeeds beside it.
#[test]
fn a_temporary_left_by_sigkill_is_named_by_the_next_run() {
    let dir = scratch("hardening-stale");
    let out = dir.join("g.zarr");
    let stale = dir.join("g.zarr.tmp-12345-678");
    std::fs::create_dir_all(stale.join("c")).unwrap();
    let run = embedded(&strings(&[
        "gen",
        "--out",
        out.to_str().unwrap(),
        "--rows",
        "100",
        "--cols",
        "4",
        "--chunk-rows",
        "10",
    ]));
    run.assert_success();
    assert!(
        run.stderr.contains("g.zarr.tmp-12345-678") && run.stderr.contains("rm -r"),
        "{}",
        run.stderr
    );
    assert!(out.join("zarr.json").exists());
    assert!(
        stale.exists(),
        "another run's temporary is never removed by this one"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes the stream `codec` makes of `len` zero bytes into `path`, fed a megabyte at a
/// time so that the test itself never holds the expansion.
fn write_bomb(path: &Path, codec: &str, len: u64) {
    use std::io::Write;
    let zeros = vec![0u8; 1 << 20];
    let file = std::fs::File::create(path).unwrap();
    let mut sink: Box<dyn Write> = match codec {
        "zstd" => Box::new(
            zstd::stream::write::Encoder::new(file, 1)
                .unwrap()
                .auto_finish(),
        ),
        // The best level: about 1000:1 on zeros, where the fastest makes about 200:1.
        "gzip" => Box::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::best(),
        )),
        other => panic!("no bomb for {other}"),
    };
    for _ in 0..len >> 20 {
        sink.write_all(&zeros).unwrap();
    }
    sink.flush().unwrap();
}

/// The first chunk file of a store `rankwise gen` wrote, v2 (`0.0`) or v3 (`c/0/0`).
fn first_chunk(store: &Path) -> std::path::PathBuf {
    let v3 = store.join("c").join("0").join("0");
    if v3.exists() {
        v3
    } else {
        store.join("0.0")
    }
}

/// `rankwise read` of the store `spec` on one actor of 64 MiB fails (exit 1), naming the
/// first chunk (`format`'s key for it) and saying `expected`, with the peak RSS within the
/// budget and the process's overhead.
fn read_is_refused_within_64m(spec: &str, format: &str, expected: &str, what: &str) {
    const BUDGET: u64 = 64 << 20;
    // What the process holds whatever it reads: the binary, its libraries, BLAS's and the
    // allocator's arenas (the same allowance as tests/zarr.rs's budget test).
    const OVERHEAD: u64 = 64 << 20;
    let args = strings(&[
        "read",
        "--zarr",
        spec,
        "--actors",
        "1",
        "--memory-per-actor",
        "64M",
    ]);
    let (run, peak) = embedded_with_peak(&args);
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{what}\n{}", run.describe());
    let key = if format == "v3" { "c/0/0" } else { "0.0" };
    assert!(
        run.stderr.contains(key) && run.stderr.contains(expected),
        "{what}: the error names chunk {key} and says {expected:?}\n{}",
        run.describe()
    );
    assert!(
        peak <= BUDGET + OVERHEAD,
        "{what}: peak RSS {} MiB beyond the budget {} MiB + {} MiB\n{}",
        peak >> 20,
        BUDGET >> 20,
        OVERHEAD >> 20,
        run.describe()
    );
}

#[test]
fn decompression_bombs_oversize_chunk_files_and_dev_zero_links_stay_within_the_budget() {
    let mut draw = Draw(test_seed() ^ 33);
    let dir = scratch("hardening-bombs");
    // Chunks of 100 rows × `cols` float64 (about 80 KB), a budget of 64 MiB, and a zstd
    // bomb that expands to 400 MiB: six times the budget, 5000 times the chunk. A sharded
    // store's shard file is checked the same way before zarrs reads it.
    let cols = draw.range(90, 110);
    let rows = 100 * draw.range(4, 8);
    let cases = [
        ("v3", "zstd", "bomb"),
        ("v3", "gzip", "bomb"),
        ("v2", "zstd", "bomb"),
        ("v2", "gzip", "bomb"),
        ("v3", "zstd", "oversize"),
        ("v2", "blosc-lz4", "oversize"),
        ("v3", "none", "oversize"),
        ("v3", "blosc-lz4", "dev-zero"),
        ("v2", "gzip", "dev-zero"),
        ("v3", "none", "dev-zero"),
        ("v3", "sharded", "oversize"),
        ("v3", "sharded", "dev-zero"),
    ];
    for (i, (format, codec, attack)) in cases.into_iter().enumerate() {
        let store = dir.join(format!("s{i}.zarr"));
        let spec = gen_store(
            &store,
            (rows, cols, 100),
            "normal",
            &draw.next().to_string(),
            &if codec == "sharded" {
                vec!["--format", format, "--codec", "zstd", "--shard-rows", "200"]
            } else {
                vec!["--format", format, "--codec", codec]
            },
        );
        let chunk = first_chunk(&store);
        std::fs::remove_file(&chunk).unwrap();
        match attack {
            // zstd expands zeros by far more than gzip (at most about 1000:1): a gzip bomb
            // that passes the size check expands to 64 MiB, 800 times its chunk.
            "bomb" if codec == "gzip" => write_bomb(&chunk, codec, 64 << 20),
            "bomb" => write_bomb(&chunk, codec, 400 << 20),
            // A sparse file: 600 MB long, nothing on disk, refused before a byte is read.
            "oversize" => std::fs::File::create(&chunk)
                .unwrap()
                .set_len(600 << 20)
                .unwrap(),
            _ => std::os::unix::fs::symlink("/dev/zero", &chunk).unwrap(),
        }
        let what = format!("{format} {codec} {attack}, {rows} × {cols}");
        let expected = match attack {
            "bomb" => "decodes to more than",
            "oversize" if codec == "none" => "expected",
            "oversize" => "refused without reading it",
            _ => "not a regular file",
        };
        read_is_refused_within_64m(&spec, format, expected, &what);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Chains that zarrs decodes (big-endian values, a checksum inside the compressor, two
/// compressors, a Zarr 2 big-endian dtype, and shards whose inner chunks are such chains):
/// a bomb in their chunk (or inner chunk) is refused, naming the chunk, before zarrs
/// expands it, and the run stays within its budget.
#[test]
fn decompression_bombs_in_chains_zarrs_decodes_stay_within_the_budget() {
    let mut draw = Draw(test_seed() ^ 34);
    let dir = scratch("hardening-zarrs-bombs");
    let cols = draw.range(90, 110);
    let rows = 100 * draw.range(4, 8);
    // (format, codec gen writes, how the chain is rewritten, the bomb's codec and size)
    let cases: [(&str, &str, &str, &str, u64); 6] = [
        ("v3", "zstd", "big-endian", "zstd", 400 << 20),
        ("v3", "gzip", "crc32c inside", "gzip", 64 << 20),
        ("v3", "gzip", "zstd around", "zstd(gzip)", 64 << 20),
        ("v2", "zstd", "big-endian", "zstd", 400 << 20),
        ("v3", "zstd", "sharded big-endian", "zstd", 400 << 20),
        ("v3", "gzip", "sharded crc32c inside", "gzip", 64 << 20),
    ];
    for (i, (format, codec, chain, bomb, len)) in cases.into_iter().enumerate() {
        let store = dir.join(format!("z{i}.zarr"));
        let sharded = chain.starts_with("sharded");
        let mut args = vec!["--format", format, "--codec", codec];
        if sharded {
            args.extend(["--shard-rows", "200"]);
        }
        let spec = gen_store(
            &store,
            (rows, cols, 100),
            "normal",
            &draw.next().to_string(),
            &args,
        );
        // The chain, rewritten where gen wrote it.
        let meta_path = store.join(if format == "v3" {
            "zarr.json"
        } else {
            ".zarray"
        });
        let mut meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
        match (format, chain) {
            ("v2", _) => meta["dtype"] = serde_json::json!(">f8"),
            // The shard's inner chain, rewritten: the shards stay as gen wrote them.
            (_, "sharded big-endian") => {
                meta["codecs"][0]["configuration"]["codecs"][0] =
                    serde_json::json!({"name": "bytes", "configuration": {"endian": "big"}})
            }
            (_, "sharded crc32c inside") => {
                let codecs = meta["codecs"][0]["configuration"]["codecs"]
                    .as_array_mut()
                    .unwrap();
                codecs.insert(1, serde_json::json!({"name": "crc32c"}));
            }
            (_, "big-endian") => {
                meta["codecs"][0] =
                    serde_json::json!({"name": "bytes", "configuration": {"endian": "big"}})
            }
            (_, "crc32c inside") => {
                let codecs = meta["codecs"].as_array_mut().unwrap();
                codecs.insert(1, serde_json::json!({"name": "crc32c"}));
            }
            _ => {
                let codecs = meta["codecs"].as_array_mut().unwrap();
                codecs.push(serde_json::json!({"name": "zstd", "configuration": {"level": 1, "checksum": false}}));
            }
        }
        std::fs::write(&meta_path, serde_json::to_string(&meta).unwrap()).unwrap();
        let chunk = first_chunk(&store);
        if sharded {
            // The first shard's first inner chunk becomes the bomb; the index and its
            // CRC-32C are rewritten to match, as a hostile writer would.
            let bomb_file = dir.join(format!("bomb{i}"));
            write_bomb(&bomb_file, bomb, len);
            replace_first_inner_chunk(&chunk, &std::fs::read(&bomb_file).unwrap(), 2);
            let what = format!("{format} {codec}, {chain}, a {bomb} bomb, {rows} × {cols}");
            read_is_refused_within_64m(&spec, format, "decompresses to more than", &what);
            continue;
        }
        std::fs::remove_file(&chunk).unwrap();
        if bomb == "zstd(gzip)" {
            let inner = dir.join(format!("inner{i}"));
            write_bomb(&inner, "gzip", len);
            let bytes = std::fs::read(&inner).unwrap();
            std::fs::write(&chunk, zstd::encode_all(&bytes[..], 1).unwrap()).unwrap();
        } else {
            write_bomb(&chunk, bomb, len);
        }
        let what = format!("{format} {codec}, {chain}, a {bomb} bomb, {rows} × {cols}");
        read_is_refused_within_64m(&spec, format, "decompresses to more than", &what);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rewrites the shard file `shard` (index at the end: `entries` little-endian (offset,
/// length) pairs and their CRC-32C) with `bytes` as its first inner chunk and the others
/// as they were.
fn replace_first_inner_chunk(shard: &Path, bytes: &[u8], entries: usize) {
    let old = std::fs::read(shard).unwrap();
    let index_at = old.len() - entries * 16 - 4;
    let entry = |j: usize| {
        let e = &old[index_at + j * 16..index_at + j * 16 + 16];
        (
            u64::from_le_bytes(e[..8].try_into().unwrap()) as usize,
            u64::from_le_bytes(e[8..].try_into().unwrap()) as usize,
        )
    };
    let mut out = bytes.to_vec();
    let mut index = Vec::new();
    index.extend((0u64).to_le_bytes());
    index.extend((bytes.len() as u64).to_le_bytes());
    for j in 1..entries {
        let (off, nb) = entry(j);
        index.extend((out.len() as u64).to_le_bytes());
        index.extend((nb as u64).to_le_bytes());
        out.extend_from_slice(&old[off..off + nb]);
    }
    let crc = crc32c(&index);
    out.extend(index);
    out.extend(crc.to_le_bytes());
    std::fs::write(shard, out).unwrap();
}

#[test]
fn peak_rss_stays_within_the_least_budget_the_plan_accepts_across_commands_and_shapes() {
    let mut draw = Draw(test_seed() ^ 66);
    let dir = scratch("hardening-budget");
    let rows = 1000 * draw.range(100, 200);
    let cols = draw.range(60, 300);
    let chunk = 500 * draw.range(2, 8);
    let dense = gen_store(
        &dir.join("f.zarr"),
        (rows, cols, chunk),
        "normal",
        &draw.next().to_string(),
        &[],
    );
    let samples = draw.range(200, 600);
    let geno = gen_store(
        &dir.join("g.zarr"),
        (rows, samples, chunk),
        "genotype",
        &draw.next().to_string(),
        &[],
    );
    let cases: Vec<Vec<&str>> = vec![
        vec!["read", "--zarr", &dense],
        vec!["svd", "--zarr", &dense],
        vec!["rsvd", "--zarr", &dense, "-k", "5"],
        vec!["rsvd", "--zarr", &dense, "-k", "5", "--power-iters", "2"],
        vec![
            "rsvd",
            "--zarr",
            &dense,
            "-k",
            "4",
            "--method",
            "block-krylov",
            "--power-iters",
            "2",
        ],
        vec!["pca", "--zarr", &geno, "-k", "5"],
        vec!["pca", "--zarr", &geno, "-k", "5", "--power-iters", "2"],
    ];
    for case in cases {
        let args = strings(&case);
        let what = format!("{rows} × {cols} (genotypes × {samples}), chunks of {chunk}: {case:?}");
        let budget = least_budget(&args);
        let mut run_args = args.clone();
        run_args.extend(strings(&[
            "--memory-per-actor",
            &format!("{}M", budget >> 20),
        ]));
        let (run, peak) = embedded_with_peak(&run_args);
        run.assert_success();
        eprintln!(
            "{what}: peak RSS {:.1} MiB, least budget {} MiB",
            peak as f64 / (1 << 20) as f64,
            budget >> 20
        );
        assert!(
            peak <= budget + FIXED_OVERHEAD,
            "{what}: peak RSS {:.1} MiB beyond the least budget the plan accepted, {} MiB, \
             plus the fixed {} MiB\n{}",
            peak as f64 / (1 << 20) as f64,
            budget >> 20,
            FIXED_OVERHEAD >> 20,
            run.describe()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rewrites every value `x` of the uncompressed v3 store at `store` as `f(chunk row, x)`.
fn rewrite_values(store: &Path, f: impl Fn(u64, f64) -> f64) {
    for path in shard_files(store) {
        let bytes = std::fs::read(&path).unwrap();
        let out: Vec<u8> = bytes
            .chunks_exact(8)
            .enumerate()
            .flat_map(|(i, b)| f(i as u64, f64::from_le_bytes(b.try_into().unwrap())).to_le_bytes())
            .collect();
        std::fs::write(&path, out).unwrap();
    }
}

#[test]
fn non_finite_values_and_overflow_are_named_where_they_are_stored() {
    let mut draw = Draw(test_seed() ^ 77);
    let dir = scratch("hardening-nonfinite");
    let (rows, cols, chunk) = (100 * draw.range(40, 80), draw.range(20, 60), 100u64);
    for (i, bad) in [f64::NAN, f64::INFINITY, -f64::INFINITY, 3e155]
        .into_iter()
        .enumerate()
    {
        let store = dir.join(format!("s{i}.zarr"));
        gen_store(
            &store,
            (rows, cols, chunk),
            "normal",
            &draw.next().to_string(),
            &["--codec", "none"],
        );
        let (row, col) = (draw.range(0, rows - 1), draw.range(0, cols - 1));
        let victim = store.join(format!("c/{}/0", row / chunk));
        let mut bytes = std::fs::read(&victim).unwrap();
        let at = (((row % chunk) * cols + col) * 8) as usize;
        bytes[at..at + 8].copy_from_slice(&bad.to_le_bytes());
        std::fs::write(&victim, bytes).unwrap();
        let spec = store.to_str().unwrap();
        let key = format!("chunk `c/{}/0`", row / chunk);
        let mut commands = vec![
            strings(&["rsvd", "--zarr", spec, "-k", "3"]),
            strings(&["rsvd", "--zarr", spec, "-k", "3", "--power-iters", "2"]),
        ];
        if !bad.is_finite() {
            // The exact SVD scales as LAPACK does: only non-finite values stop it.
            commands.push(strings(&["svd", "--zarr", spec]));
        }
        for args in commands {
            let what = format!("{bad} at row {row}, column {col} of {rows} × {cols}: {args:?}");
            for run in [embedded(&args), under_mpirun(3, &args)] {
                run.assert_finished();
                assert_eq!(run.code, Some(1), "{what}\n{}", run.describe());
                let named = if bad.is_finite() {
                    format!("the largest, 3e155 at row {row}, column {col} ({key}")
                } else {
                    format!("the value at row {row}, column {col} is {bad} ({key}")
                };
                assert!(
                    run.stderr.contains(&named),
                    "{what}: says {named:?}\n{}",
                    run.describe()
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tiny_and_huge_scales_give_lapacks_singular_values_or_a_named_refusal() {
    let mut draw = Draw(test_seed() ^ 88);
    let dir = scratch("hardening-scale");
    let (rows, cols, chunk) = (100 * draw.range(30, 60), draw.range(20, 40), 100u64);
    let seed = draw.next();
    let base = dir.join("base.zarr");
    gen_store(
        &base,
        (rows, cols, chunk),
        "normal",
        &seed.to_string(),
        &["--codec", "none"],
    );
    let values = report(&embedded(&strings(&[
        "svd",
        "--zarr",
        base.to_str().unwrap(),
        "--json",
    ])));
    let truth = json_floats(&values["singular_values"]);
    // Scales where float32 or the passes' squares would underflow or overflow: the
    // default (float32 until it cannot hold them, then float64) gives LAPACK's σ.
    for scale in [1e-20, 1e-100, 1e-140, 1e30, 1e100] {
        let store = dir.join(format!("x{scale:e}.zarr"));
        let _ = std::fs::remove_dir_all(&store);
        gen_store(
            &store,
            (rows, cols, chunk),
            "normal",
            &seed.to_string(),
            &["--codec", "none"],
        );
        rewrite_values(&store, |_, x| x * scale);
        let args = strings(&[
            "rsvd",
            "--zarr",
            store.to_str().unwrap(),
            "-k",
            "3",
            "--json",
        ]);
        let run = embedded(&args);
        run.assert_success();
        let got = json_floats(&report(&run)["singular_values"]);
        assert_eq!(got.len(), 3, "{scale:e}");
        for (i, (g, t)) in got.iter().zip(&truth).enumerate() {
            let want = t * scale;
            assert!(
                ((g - want) / want).abs() < 1e-6,
                "scale {scale:e}: σ{} = {g:e}, LAPACK's {want:e}\n{}",
                i + 1,
                run.describe()
            );
        }
        assert_eq!(report(&run)["converged"], true, "scale {scale:e}");
    }
    // Below what float64 squares hold: refused, naming why, never σ = 0 "converged".
    let store = dir.join("tiny.zarr");
    gen_store(
        &store,
        (rows, cols, chunk),
        "normal",
        &seed.to_string(),
        &["--codec", "none"],
    );
    rewrite_values(&store, |_, x| x * 1e-170);
    for extra in [&[][..], &["--power-iters", "2"][..]] {
        let mut args = strings(&["rsvd", "--zarr", store.to_str().unwrap(), "-k", "3"]);
        args.extend(strings(extra));
        let run = embedded(&args);
        run.assert_finished();
        assert_eq!(run.code, Some(1), "{extra:?}\n{}", run.describe());
        assert!(
            run.stderr.contains("too small for the randomized passes"),
            "{extra:?}\n{}",
            run.describe()
        );
    }
    let svd = report(&embedded(&strings(&[
        "svd",
        "--zarr",
        store.to_str().unwrap(),
        "--json",
    ])));
    let s1 = json_floats(&svd["singular_values"])[0];
    assert!(
        ((s1 - truth[0] * 1e-170) / (truth[0] * 1e-170)).abs() < 1e-10,
        "svd σ₁ {s1:e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_decompression_bomb_inside_a_shard_stays_within_the_budget() {
    let mut draw = Draw(test_seed() ^ 44);
    let dir = scratch("hardening-shard-bomb");
    let cols = draw.range(90, 110);
    let (chunk, shard) = (100u64, 200u64);
    let rows = shard * draw.range(2, 4);
    let store = dir.join("s.zarr");
    let spec = gen_store(
        &store,
        (rows, cols, chunk),
        "normal",
        &draw.next().to_string(),
        &["--codec", "zstd", "--shard-rows", "200"],
    );
    // The shard rebuilt with its first inner chunk replaced by a zstd stream of 400 MiB of
    // zeros (about 13 KB, inside the bound for an 80 KB chunk), its index and CRC written
    // as a hostile writer would.
    let victim = &shard_files(&store)[0];
    let bytes = std::fs::read(victim).unwrap();
    let entries = (shard / chunk) as usize;
    let index_at = bytes.len() - entries * 16 - 4;
    let entry = |j: usize| {
        let e = &bytes[index_at + j * 16..index_at + j * 16 + 16];
        (
            u64::from_le_bytes(e[..8].try_into().unwrap()),
            u64::from_le_bytes(e[8..].try_into().unwrap()),
        )
    };
    let bomb_path = dir.join("bomb.zst");
    write_bomb(&bomb_path, "zstd", 400 << 20);
    let bomb = std::fs::read(&bomb_path).unwrap();
    let mut data = Vec::new();
    let mut index = Vec::new();
    for j in 0..entries {
        let (off, nb) = entry(j);
        let inner = if j == 0 {
            bomb.clone()
        } else {
            bytes[off as usize..(off + nb) as usize].to_vec()
        };
        index.extend((data.len() as u64).to_le_bytes());
        index.extend((inner.len() as u64).to_le_bytes());
        data.extend(inner);
    }
    let crc = crc32c(&index);
    data.extend(&index);
    data.extend(crc.to_le_bytes());
    std::fs::write(victim, data).unwrap();
    let args = strings(&[
        "read",
        "--zarr",
        &spec,
        "--actors",
        "1",
        "--memory-per-actor",
        "64M",
    ]);
    let (run, peak) = embedded_with_peak(&args);
    run.assert_finished();
    assert_eq!(run.code, Some(1), "{}", run.describe());
    assert!(
        run.stderr.contains("c/0/0")
            && run.stderr.contains("inner chunk [0, 0]")
            && run.stderr.contains("decodes to more than"),
        "names the shard and the inner chunk\n{}",
        run.describe()
    );
    assert!(
        peak <= (64 << 20) + FIXED_OVERHEAD,
        "peak RSS {} MiB\n{}",
        peak >> 20,
        run.describe()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tiny PLINK 1 fileset written by hand at `prefix`: 8 samples, 6 variants.
fn tiny_fileset(prefix: &Path) {
    let with = |ext: &str| prefix.with_extension(ext);
    let fam: String = (0..8).map(|i| format!("f{i} s{i} 0 0 0 -9\n")).collect();
    let bim: String = (0..6)
        .map(|v| format!("1 v{v} 0 {} A G\n", v + 1))
        .collect();
    // Magic, variant-major; each variant's 8 two-bit codes in 2 bytes, none missing.
    let mut bed = vec![0x6c, 0x1b, 0x01];
    for v in 0..6u8 {
        bed.extend([0b1100_1000 ^ v, 0b0010_0011 | (v << 2)]);
    }
    std::fs::write(with("fam"), fam).unwrap();
    std::fs::write(with("bim"), bim).unwrap();
    std::fs::write(with("bed"), bed).unwrap();
}

/// Replaces `path` with a FIFO (an open of it for reading blocks until a writer comes) or
/// with a link to `/dev/zero` (a read of it never ends).
fn not_a_file(path: &Path, fifo: bool) {
    let _ = std::fs::remove_file(path);
    if fifo {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo {}", path.display());
    } else {
        std::os::unix::fs::symlink("/dev/zero", path).unwrap();
    }
}

/// Metadata documents, PLINK's three files and the sample and variant lists that are not
/// regular files were read as they were: a FIFO hung the run for good and a link to
/// `/dev/zero` grew until the kernel killed the process. They are refused, naming the file,
/// embedded and on both ranks under `mpirun`. A chunk shape wider than the array (the chunk
/// decodes whole, its padding included) is refused by the plan instead of aborting on the
/// allocation; an uncompressed chunk file of the wrong length is refused before the staging
/// its metadata declares is made.
#[test]
fn inputs_that_are_not_regular_files_and_chunks_wider_than_the_array_are_refused() {
    let dir = scratch("hardening-not-files");
    let v2 = dir.join("v2.zarr");
    gen_store(
        &v2,
        (1000, 50, 100),
        "uniform",
        "3",
        &["--codec", "none", "--format", "v2"],
    );
    let v3 = dir.join("v3.zarr");
    gen_store(&v3, (1000, 50, 100), "uniform", "3", &["--codec", "none"]);
    let copy = |from: &Path, name: &str| {
        let to = dir.join(name);
        let ok = std::process::Command::new("cp")
            .arg("-r")
            .arg(from)
            .arg(&to)
            .status()
            .unwrap();
        assert!(ok.success());
        to
    };
    let mut cases: Vec<(Vec<String>, std::path::PathBuf)> = Vec::new();
    for (store, meta, fifo) in [
        (&v3, "zarr.json", true),
        (&v3, "zarr.json", false),
        (&v2, ".zarray", false),
        (&v2, ".zattrs", true),
    ] {
        let bad = copy(store, &format!("{meta}-{fifo}.zarr"));
        not_a_file(&bad.join(meta), fifo);
        let args = strings(&["svd", "--zarr", bad.to_str().unwrap()]);
        cases.push((args, bad.join(meta)));
    }
    let good = dir.join("good");
    tiny_fileset(&good);
    for (ext, fifo) in [("fam", true), ("bim", false), ("bim", true), ("bed", true)] {
        let prefix = dir.join(format!("{ext}-{fifo}"));
        tiny_fileset(&prefix);
        not_a_file(&prefix.with_extension(ext), fifo);
        let args = strings(&["pca", "--bed", prefix.to_str().unwrap(), "-k", "2"]);
        cases.push((args, prefix.with_extension(ext)));
    }
    for (option, fifo) in [("--keep", true), ("--extract", false)] {
        let list = dir.join(format!("list{option}"));
        not_a_file(&list, fifo);
        let args = strings(&[
            "pca",
            "--bed",
            good.to_str().unwrap(),
            "-k",
            "2",
            option,
            list.to_str().unwrap(),
        ]);
        cases.push((args, list));
    }
    for (args, file) in &cases {
        let run = embedded(args);
        run.assert_finished();
        assert_eq!(run.code, Some(1), "{args:?}\n{}", run.describe());
        let named = file.file_name().unwrap().to_str().unwrap();
        assert!(
            run.stderr.contains("not a regular file") && run.stderr.contains(named),
            "{args:?}: the error names neither {named} nor why\n{}",
            run.stderr
        );
    }
    let (args, file) = &cases[4];
    let run = under_mpirun(2, args);
    assert_both_ranks_name(&run, args, file.to_str().unwrap());

    // Chunks wider than the array.
    for (name, width, refused) in [
        ("wide", 100_000_000u64, "--memory-per-actor"),
        ("wider", 3_000_000, "the uncompressed chunk is 40000 bytes"),
    ] {
        let store = copy(&v2, &format!("{name}.zarr"));
        let meta = store.join(".zarray");
        let text = std::fs::read_to_string(&meta).unwrap();
        let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
        m["chunks"] = serde_json::json!([100, width]);
        std::fs::write(&meta, m.to_string()).unwrap();
        for cmd in ["read", "svd"] {
            let args = strings(&[cmd, "--zarr", store.to_str().unwrap()]);
            let (run, peak) = embedded_with_peak(&args);
            run.assert_finished();
            assert_eq!(
                run.code,
                Some(1),
                "{args:?}: an error, not an abort\n{}",
                run.describe()
            );
            assert!(run.stderr.contains(refused), "{args:?}\n{}", run.stderr);
            assert!(peak < 256 << 20, "{args:?}: peak RSS {peak} bytes");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An all-zero matrix (a store whose chunks are all missing, fill value 0): every solver
/// gives σ = 0 with residual 0, converged. LOBPCG read its 0/0 as an infinite residual,
/// "not converged", and advised a precision that was already in use.
#[test]
fn an_all_zero_matrix_converges_to_zero_on_every_solver() {
    let dir = scratch("hardening-zeros");
    let store = dir.join("z.zarr");
    gen_store(
        &store,
        (1000, 50, 100),
        "uniform",
        "5",
        &["--codec", "none", "--format", "v2"],
    );
    for e in std::fs::read_dir(&store).unwrap().flatten() {
        if !e.file_name().to_string_lossy().starts_with('.') {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let meta = store.join(".zarray");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
    m["fill_value"] = serde_json::json!(0);
    std::fs::write(&meta, m.to_string()).unwrap();
    for extra in [
        &[][..],
        &["--power-iters", "2"],
        &["--method", "block-krylov"],
    ] {
        let mut args = strings(&["rsvd", "--zarr", store.to_str().unwrap(), "-k", "3"]);
        args.extend(strings(extra));
        args.push("--json".into());
        let run = embedded(&args);
        run.assert_success();
        let r = report(&run);
        assert_eq!(json_floats(&r["singular_values"]), [0.0; 3], "{extra:?}");
        let c = &r["convergence"];
        assert_eq!(c["converged"], serde_json::json!(true), "{extra:?}: {c}");
        assert_eq!(json_floats(&c["residuals"]), [0.0; 3], "{extra:?}: {c}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
