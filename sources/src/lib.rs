//! The rankwise data sources: how the values of a matrix are read.
//!
//! A source is either a matrix ([`PanelSource`]: Zarr arrays, the generator, a matrix in
//! memory) or a genotype matrix ([`GenotypeSource`]: PLINK .bed filesets, VCF Zarr stores,
//! generated cohorts), and says how its values can be read: any tile on demand, whole
//! stored panels decoded into reusable buffers ([`StoredPanels`], read ahead of the kernels
//! by [`ReadAhead`]), or generated on a device from the generator's key.
//!
//! - Zarr ([`ZarrMatrix`], [`ZarrGenotypes`], [`VcfZarr`]): Zarr v2 and v3 arrays and VCF Zarr stores through zarrs, with the common
//!   codec chains (Blosc, zstd, gzip, sharding) decoded straight into panel buffers;
//! - [`BedGenotypes`]: PLINK 1 binary filesets;
//! - [`stream`] and [`Generated`]: the counter-based generator, whose values any rank
//!   (and the device kernels) compute from `(seed, row, column)`;
//! - [`SampleSubset`]: selections of samples and variants;
//! - [`ReadAhead`]: panels decoded on reader threads ahead of the kernels, within the budget.
//!
//! Every read returns a [`SourceError`] that names the file, array, chunk or rows at fault.

mod bed;
mod blosc;
mod direct;
mod error;
mod files;
mod panel;
mod readahead;
mod remote;
mod source;
pub mod stream;
mod subset;
mod zarr;

pub use bed::BedGenotypes;
pub use blosc::{BlockShuffle, BloscBlock, BloscCodec, BloscLayout, BloscStream};
pub use error::{BedError, SourceError, ZarrError};
pub use files::{open_regular, read_regular_at_most, read_regular_to_string};
pub use panel::{
    ChunkScratch, ElementType, PanelBuffer, PanelValues, ReadScratch, ReadStats, StoredFrames,
    StoredPanels,
};
pub use readahead::{BufferPool, FetchAhead, PanelLease, ReadAhead, ReadFn};
pub use remote::{is_url, RemoteOptions};
pub use source::{
    fill_cols_f32_rounded, Dist, Generated, GenotypeSource, InMemoryGenotypes, InMemoryMatrix,
    PanelSource, DEFAULT_FST,
};
pub use stream::{MAX_GENERATED_COLS, MAX_GENERATED_ROWS};
pub use subset::SampleSubset;
pub use zarr::{
    dosage_of_call, node_exists, split_spec, SumLanes, VcfZarr, ZarrArray, ZarrGenotypes,
    ZarrMatrix,
};
