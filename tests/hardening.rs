//! Regressions of hostile input, each named after the defect it held:
//! - a decoder that panics in a read-ahead thread (zarrs on a sharded store whose shard
//!   index points past the end of the address space, its CRC recomputed so that it passes)
//!   fails the run naming the rows, embedded, with local ranks and under `mpirun`, instead
//!   of hanging;
//! - absurd shapes in `zarr.json`/`.zarray` or on the command line are refused with an
//!   error naming the option, instead of aborting on an allocation;
//! - options whose values overflow (`--oversample`, `--probes`, `--power-iters` of
//!   2⁶⁴ − 1) and `--comm-timeout 0` are refused naming the option.
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
    // The shard index sits at the end of the shard: (offset, nbytes) per inner chunk as
    // little-endian u64s, then the CRC-32C of those bytes.
    let shards = shard_files(&store);
    let victim = &shards[draw.range(0, shards.len() as u64 - 1) as usize];
    let mut bytes = std::fs::read(victim).unwrap();
    let entries = (shard / chunk) as usize;
    let index_len = entries * 16;
    let start = bytes.len() - index_len - 4;
    let entry = draw.range(0, entries as u64 - 1) as usize;
    let at = start + entry * 16;
    bytes[at..at + 8].copy_from_slice(&(u64::MAX - 9).to_le_bytes());
    bytes[at + 8..at + 16].copy_from_slice(&100u64.to_le_bytes());
    let crc = crc32c(&bytes[start..start + index_len]);
    let end = bytes.len();
    bytes[end - 4..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(victim, &bytes).unwrap();
    let what = format!(
        "{rows} × {cols}, chunks of {chunk}, shards of {shard}: {} entry {entry}",
        victim.display()
    );
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
