//! Generates bindings to `ucp/api/ucp.h` of the UCX library that pkg-config finds.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let ucx = match pkg_config::Config::new()
        .atleast_version("1.13")
        .probe("ucx")
    {
        Ok(lib) => lib,
        Err(e) => panic!(
            "rankwise-ucx-sys needs UCX 1.13 or newer with its pkg-config file \
             (Debian/Ubuntu: apt-get install libucx-dev): {e}"
        ),
    };
    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*|ucs_status_string")
        .allowlist_type("ucp_.*|ucs_.*")
        .allowlist_var("UCP_.*|UCS_.*|ucs_global_opts")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for dir in &ucx.include_paths {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = builder
        .generate()
        .expect("bindgen could not read ucp/api/ucp.h");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings
        .write_to_file(out.join("ucp.rs"))
        .expect("writing the UCP bindings");
}
