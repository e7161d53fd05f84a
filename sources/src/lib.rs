//! The rankwise data sources: how the values of a matrix are read.
//!
//! A source is either a matrix ([`PanelSource`]: Zarr arrays, the generator, a matrix in
//! memory) or a genotype matrix ([`GenotypeSource`]: PLINK .bed filesets, VCF Zarr stores,
//! generated cohorts), and says how its values can be read: any tile on demand, whole
//! stored panels decoded into reusable buffers ([`StoredPanels`], read ahead of the kernels
//! by [`ReadAhead`]), or generated on a device from the generator's key.
//!
//! - [`zarr`]: Zarr v2 and v3 arrays and VCF Zarr stores through zarrs, with the common
//!   codec chains (Blosc, zstd, gzip, sharding) decoded straight into panel buffers;
//! - [`bed`]: PLINK 1 binary filesets;
//! - [`stream`] and [`Generated`]: the counter-based generator, whose values any rank
//!   (and the device kernels) compute from `(seed, row, column)`;
//! - [`subset`]: selections of samples and variants;
//! - [`readahead`]: panels decoded on reader threads ahead of the kernels, within the budget.
//!
//! Every read returns a [`SourceError`] that names the file, array, chunk or rows at fault.

pub mod bed;
mod blosc;
mod direct;
mod error;
pub mod panel;
pub mod readahead;
pub mod source;
pub mod stream;
pub mod subset;
pub mod zarr;

pub use bed::BedGenotypes;
pub use error::{BedError, SourceError, ZarrError};
pub use panel::{
    ChunkScratch, ElementType, PanelBuffer, PanelValues, ReadScratch, ReadStats, StoredPanels,
};
pub use readahead::{BufferPool, PanelLease, ReadAhead};
pub use source::{Dist, Generated, GenotypeSource, InMemoryGenotypes, InMemoryMatrix, PanelSource};
