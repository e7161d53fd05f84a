//! rankwise launch: launcher detection, rank → device binding, the `rankwise` command line,
//! run reports and output writers.

pub mod cli;
pub mod gen_store;
mod interrupt;
pub mod launcher;
pub mod output;
pub mod pca_files;
pub mod report;
