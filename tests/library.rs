//! The library is the command line's path: `rankwise::pca` and `rankwise::rsvd`, called
//! from Rust, give the bits `rankwise pca` and `rankwise rsvd` print, with the same
//! selection and filters, on filesets written by PLINK 2 and by the library; and their
//! errors name parameters where the command line names flags.

mod common;

use std::collections::HashSet;

use common::*;
use rankwise::genomics::{pca, write_example_fileset, IdList, PcaParams, Selection};
use rankwise::linalg::VariantFilter;
use rankwise::{open, World};

fn world() -> rankwise::Runtime {
    World::embedded()
        .actors(1)
        .pin(false)
        .build()
        .expect("a runtime")
}

/// The CLI's report of `args` with `--json` and one actor.
fn cli(args: &[String]) -> serde_json::Value {
    let mut a = args.to_vec();
    a.extend(strings(&["--actors", "1", "--json"]));
    report(&embedded(&a))
}

#[test]
fn the_library_pca_gives_the_command_lines_bits_with_selection_and_filters() {
    let dir = scratch("library-pca");
    let mut draw = Draw(test_seed());
    let (variants, samples) = (draw.range(800, 3000), draw.range(60, 200));
    let prefix = dir.join("cohort");
    write_example_fileset(&prefix, variants, samples, draw.next()).unwrap();
    let p = prefix.to_str().unwrap();
    // Two thirds of the samples, a random four fifths of the variants, chromosomes 1–11.
    let keep: Vec<String> = (0..samples)
        .filter(|j| j % 3 != 1)
        .map(|j| format!("fam{j}\tS{j}"))
        .collect();
    let extract: Vec<String> = (0..variants)
        .filter(|_| !draw.next().is_multiple_of(5))
        .map(|v| format!("rs{v}"))
        .collect();
    std::fs::write(dir.join("keep.txt"), keep.join("\n")).unwrap();
    std::fs::write(dir.join("extract.txt"), extract.join("\n")).unwrap();
    let k = draw.range(2, 6) as usize;
    let seed = draw.next() % 1000;
    let params = PcaParams {
        solver: rankwise::RsvdOptions {
            k,
            seed,
            ..PcaParams::default().solver
        },
        filter: VariantFilter::new(0.02, 0.2).unwrap(),
        selection: Selection {
            keep: Some(IdList::read_samples(&dir.join("keep.txt")).unwrap()),
            extract: Some(IdList::read_variants(&dir.join("extract.txt")).unwrap()),
            chromosomes: Some("1-11".into()),
            ..Selection::default()
        },
        loadings: true,
        ..PcaParams::default()
    };
    let rt = world();
    let lib = pca(&rt, open(p).unwrap().genotypes().unwrap(), &params).unwrap();
    let cli = cli(&strings(&[
        "pca",
        "--bed",
        p,
        "-k",
        &k.to_string(),
        "--sketch-seed",
        &seed.to_string(),
        "--maf",
        "0.02",
        "--geno",
        "0.2",
        "--keep",
        dir.join("keep.txt").to_str().unwrap(),
        "--extract",
        dir.join("extract.txt").to_str().unwrap(),
        "--chr",
        "1-11",
        "--out",
        dir.join("o.zarr").to_str().unwrap(),
    ]));
    let what = format!("{variants} × {samples}, k = {k}");
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&lib.singular_values),
        json_bits(&cli["singular_values"]),
        "{what}"
    );
    assert_eq!(
        bits(&lib.eigenvalues),
        json_bits(&cli["eigenvalues"]),
        "{what}"
    );
    assert_eq!(
        lib.convergence.converged,
        cli["converged"].as_bool().unwrap()
    );
    assert_eq!(lib.pcs.dim(), (keep.len(), k), "{what}");
    let families = lib.family_ids.as_ref().expect("a .fam has family IDs");
    let ids: HashSet<String> = families
        .iter()
        .zip(&lib.sample_ids)
        .map(|(f, i)| format!("{f}\t{i}"))
        .collect();
    assert_eq!(
        ids,
        keep.iter().cloned().collect(),
        "{what}: the kept samples, by FID and IID"
    );
    // sgkit's loadings, as the command line writes them into its group.
    let (shape, written) =
        rankwise::output::read_f64_array(&dir.join("o.zarr"), "sample_pca_loading").unwrap();
    let loadings = lib.loadings.as_ref().expect("loadings were asked for");
    assert_eq!(shape, [loadings.rows.len() as u64, k as u64], "{what}");
    assert!(loadings.rows.iter().copied().eq(0..shape[0]), "{what}");
    assert_eq!(
        bits(loadings.values.as_slice().unwrap()),
        bits(&written),
        "{what}: loadings"
    );
    // Chromosomes 1–11 are half the variants; the extract list and the filters take more.
    assert!(
        lib.variants_used > 0 && lib.variants_used < variants.div_ceil(2),
        "{what}: {} variants used",
        lib.variants_used
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_library_rsvd_gives_the_command_lines_bits() {
    let dir = scratch("library-rsvd");
    let mut draw = Draw(test_seed() ^ 5);
    // Tall and short-and-fat (factored as its transpose) both.
    for (rows, cols) in [
        (draw.range(2000, 6000), draw.range(20, 80)),
        (draw.range(20, 80), draw.range(2000, 6000)),
    ] {
        let band = draw.range(300, 900).min(rows);
        let store = gen_store(
            &dir.join(format!("{rows}x{cols}.zarr")),
            (rows, cols, band),
            "normal",
            &draw.next().to_string(),
            &[],
        );
        let k = draw.range(2, 8) as usize;
        let seed = draw.next() % 1000;
        let options = rankwise::RsvdOptions {
            k,
            seed,
            ..Default::default()
        };
        let rt = world();
        let lib = rankwise::rsvd(&rt, &open(&store).unwrap(), &options).unwrap();
        let cli = cli(&strings(&[
            "rsvd",
            "--zarr",
            &store,
            "-k",
            &k.to_string(),
            "--sketch-seed",
            &seed.to_string(),
            "--precision",
            "f64",
        ]));
        let bits: Vec<u64> = lib.s.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits, json_bits(&cli["singular_values"]), "{rows} × {cols}");
        assert_eq!(lib.transposed, rows < cols);
        assert!(lib.convergence.converged, "{rows} × {cols}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn library_errors_name_parameters_and_the_command_line_names_flags() {
    let dir = scratch("library-errors");
    let prefix = dir.join("c");
    write_example_fileset(&prefix, 300, 40, test_seed()).unwrap();
    let p = prefix.to_str().unwrap();
    let g = open(p).unwrap().genotypes().unwrap();
    let rt = world();
    let nobody = PcaParams {
        selection: Selection {
            keep: Some(IdList::new(["no-such-sample"])),
            ..Selection::default()
        },
        ..PcaParams::default()
    };
    let e = pca(&rt, g.clone(), &nobody).unwrap_err();
    assert_eq!(e.parameter(), Some("keep"), "{e}");
    assert!(!e.to_string().contains("--"), "{e}");
    let bad_chr = PcaParams {
        selection: Selection {
            chromosomes: Some("3-1".into()),
            ..Selection::default()
        },
        ..PcaParams::default()
    };
    let e = pca(&rt, g, &bad_chr).unwrap_err();
    assert_eq!(e.parameter(), Some("chromosomes"), "{e}");
    // The facade's call takes the opened input, and its error names the parameter too.
    let e = rankwise::pca(&rt, &open(p).unwrap(), &bad_chr).unwrap_err();
    assert_eq!(e.parameter(), Some("chromosomes"), "{e}");
    assert!(!e.to_string().contains("--"), "{e}");
    let run = embedded(&strings(&["pca", "--bed", p, "--chr", "3-1"]));
    assert_fails_naming(&run, &[], "--chr");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The bytes of every file under `dir` (a group, or one file), by path relative to it,
/// less the report (its timings and host differ from run to run) and the metadata that
/// names it.
fn tree(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        } else {
            let name = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            if !name.ends_with("zarr.json") && !name.starts_with('.') {
                files.insert(name, std::fs::read(&p).unwrap());
            }
        }
    }
    files
}

/// `rankwise::pca_to_group` publishes what `rankwise pca --out` publishes: the group's
/// arrays and PLINK 2's side files, byte for byte (the command line adds its plot), on
/// one rank and on two; it never overwrites results, refuses what the group already
/// holds, and a run that fails leaves nothing behind.
#[test]
fn the_library_publishes_the_command_lines_group_and_side_files() {
    use rankwise::pca_group::PcaFiles;
    let dir = scratch("library-group");
    let mut draw = Draw(test_seed());
    let (variants, samples) = (draw.range(600, 2500), draw.range(50, 160));
    let prefix = dir.join("cohort");
    write_example_fileset(&prefix, variants, samples, draw.next()).unwrap();
    let p = prefix.to_str().unwrap().to_string();
    let k = draw.range(2, 6) as usize;
    let seed = draw.next() % 1000;
    let params = PcaParams {
        solver: rankwise::RsvdOptions {
            k,
            seed,
            ..PcaParams::default().solver
        },
        filter: VariantFilter::new(0.02, 0.2).unwrap(),
        ..PcaParams::default()
    };
    let what = format!("{variants} × {samples}, k = {k}");
    let lib_out = dir.join("lib.zarr");
    let cohort = open(&p).unwrap();
    let lib = rankwise::pca_to_group(&world(), &cohort, &params, PcaFiles::new(&lib_out))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let cli_out = dir.join("cli.zarr");
    cli(&strings(&[
        "pca",
        "--bed",
        &p,
        "-k",
        &k.to_string(),
        "--sketch-seed",
        &seed.to_string(),
        "--maf",
        "0.02",
        "--geno",
        "0.2",
        "--out",
        cli_out.to_str().unwrap(),
    ]));
    let mut lib_files = tree(&lib_out);
    let mut cli_files = tree(&cli_out);
    for f in [&mut lib_files, &mut cli_files] {
        f.retain(|name, _| !name.ends_with("report.json"));
    }
    assert!(lib_files
        .keys()
        .any(|n| n.starts_with("sample_pca_loading")));
    assert_eq!(
        lib_files.keys().collect::<Vec<_>>(),
        cli_files.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (name, bytes) in &lib_files {
        assert!(&cli_files[name] == bytes, "{what}: {name} differs");
    }
    for ext in ["eigenvec", "eigenval", "eigenvec.var", "afreq"] {
        let (a, b) = (lib_out.with_extension(ext), cli_out.with_extension(ext));
        assert_eq!(
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            "{what}: .{ext}"
        );
    }
    assert!(cli_out.with_extension("png").is_file());
    assert!(!lib_out.with_extension("png").exists());
    let (_, s) = rankwise::output::read_f64_array(&lib_out, "S").unwrap();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&s), bits(&lib.singular_values), "{what}");

    // Two ranks (threads of the Local transport): the same bytes.
    let two = dir.join("two.zarr");
    let (params2, two2, cohort2) = (params.clone(), two.clone(), cohort.clone());
    let config = rankwise::RuntimeConfig {
        actors: Some(1),
        pin: false,
        ..Default::default()
    };
    for r in rankwise::local_world(2, &config, move |rt| {
        rankwise::pca_to_group(&rt, &cohort2, &params2, PcaFiles::new(&two2))
            .map(|p| p.singular_values)
            .map_err(|e| e.to_string())
    }) {
        let s2 = r
            .expect("a runtime")
            .unwrap_or_else(|e| panic!("{what}: two ranks: {e}"));
        assert_eq!(bits(&s2), bits(&lib.singular_values), "{what}: two ranks");
    }
    let mut two_files = tree(&two);
    two_files.retain(|name, _| !name.ends_with("report.json"));
    assert_eq!(two_files, lib_files, "{what}: two ranks' group");

    // Never over results; what the group holds is refused; a failure leaves nothing.
    let before = tree(&dir);
    let again = rankwise::pca_to_group(&world(), &cohort, &params, PcaFiles::new(&lib_out));
    let e = again.expect_err("an existing group");
    assert_eq!(e.parameter(), Some("out"), "{e}");
    assert!(e.to_string().contains("never overwrites"), "{e}");
    let weights = PcaParams {
        weights: Some(dir.join("w")),
        ..params.clone()
    };
    let e = rankwise::pca_to_group(
        &world(),
        &cohort,
        &weights,
        PcaFiles::new(dir.join("w.zarr")),
    )
    .expect_err("weights and a group");
    assert_eq!(e.parameter(), Some("weights"), "{e}");
    let strict = PcaParams {
        solver: rankwise::RsvdOptions {
            tol: 1e-15,
            max_passes: 3,
            ..params.solver.clone()
        },
        require_converged: true,
        ..params.clone()
    };
    let e = rankwise::pca_to_group(
        &world(),
        &cohort,
        &strict,
        PcaFiles::new(dir.join("x.zarr")),
    )
    .expect_err("unconverged with require_converged");
    assert!(matches!(e, rankwise::Error::NotConverged(_)), "{e}");
    assert_eq!(
        tree(&dir),
        before,
        "a refused or failed run left files behind"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
