//! rankwise launch: launcher detection, rank → device binding, the `rankwise` command line
//! and its run reports; a client of the `rankwise` library.

pub mod cli;
pub mod launcher;
mod plot;
mod progress;
pub mod report;
