//! rankwise outputs: what a run leaves on disk, and nothing half-written.
//!
//! * [`group`]: the Zarr result group (`U`, `S`, `Vt`, the report; Zarr v3, or v2 on
//!   request), written under a temporary name by every rank and committed by one rename;
//! * [`report`]: the run report (`--json`, the group's `report` attribute), one typed definition for every
//!   command;
//! * [`publish`]: opening an output on every rank under one temporary name, and removing
//!   it on every rank when a run fails;
//! * [`gen_store`]: Zarr stores of generated matrices, written by every rank in parallel;
//! * [`temporaries`]: the registry of temporary outputs, removed when a signal ends the
//!   process (the handler is installed by the program, never by the library alone).

pub mod gen_store;
pub mod group;
pub mod publish;
pub mod report;
pub mod temporaries;

pub use group::{read_f64_array, Dims, OutputError, OutputLayout, SvdOutput, ZarrFormat};
