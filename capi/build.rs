//! Generates the C header `rankwise.h` from the crate's extern functions into `OUT_DIR`.
//! The installed header is the committed `include/rankwise.h`; `tests/header.rs` fails
//! when it differs from the generated one (and says how to update it).

use std::path::PathBuf;

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("rankwise.h");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("capi/cbindgen.toml is valid");
    match cbindgen::generate_with_config(&crate_dir, config) {
        Ok(bindings) => {
            bindings.write_to_file(&out);
        }
        // A syntax error in src/ is reported by rustc with better context; the header
        // test then fails on the missing file.
        Err(e) => println!("cargo:warning=cbindgen could not generate rankwise.h: {e}"),
    }
}
