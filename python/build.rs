//! No build step: this script exists so that the build-dependencies of Cargo.toml (feature
//! parity with the workspace's build, see there) are part of the package's resolution.

fn main() {}
