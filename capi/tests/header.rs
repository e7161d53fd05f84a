//! The committed header (what `make install` installs) is the one cbindgen generates from
//! the current source.

#[test]
fn committed_header_is_up_to_date() {
    let generated = std::path::Path::new(env!("OUT_DIR")).join("rankwise.h");
    let committed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include/rankwise.h");
    let g = std::fs::read_to_string(&generated)
        .unwrap_or_else(|e| panic!("{}: {e} (did cbindgen fail?)", generated.display()));
    let c = std::fs::read_to_string(&committed).unwrap_or_default();
    assert!(
        g == c,
        "{} is out of date: cp {} {}",
        committed.display(),
        generated.display(),
        committed.display()
    );
}
