//! The shapes the kernels share: the tile geometry, a genotype row's standardization and
//! dosage counts, and the packed genotype tile. Plain data, below every module that
//! computes with it (tiles, the fused kernels, the variant filters, the GPU passes).

/// Rows of one tile.
pub const TILE_ROWS: usize = 256;
/// Columns of one tile (a multiple of 4, so genotype tiles start on a packed byte).
pub const TILE_COLS: usize = 512;

/// Standardization of one variant: `x = (g − mean) · scale`, missing → 0; `scale = 0` for
/// a dropped variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowScale {
    /// `2p`.
    pub mean: f64,
    /// `1/√(2p(1−p))`, or 0 when the variant is dropped.
    pub scale: f64,
}

impl RowScale {
    /// The standardized value of each 2-bit code: dosages 0, 1, 2, then a missing call (0).
    pub fn table(&self) -> [f64; 4] {
        let off = -self.mean * self.scale;
        [off, self.scale + off, 2.0 * self.scale + off, 0.0]
    }
}

/// How often each dosage occurs in one variant's row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowCounts {
    /// Calls of dosage 0, 1 and 2.
    pub dosages: [u64; 3],
    /// Missing calls.
    pub missing: u64,
}

/// A tile of 2-bit packed genotype codes, handed out instead of its standardized values
/// where the passes multiply it packed ([`Packing::Always`](crate::tiles::Packing::Always)).
#[derive(Clone, Copy, Debug)]
pub struct PackedTile<'a> {
    /// Codes from the tile's first column on; row `i` starts at byte `i·stride`.
    pub bytes: &'a [u8],
    /// Bytes from one row to the next.
    pub stride: usize,
    /// Rows of the tile.
    pub rows: usize,
    /// Columns of the tile.
    pub cols: usize,
    /// Each row's standardized values of codes 0–3 ([`RowScale::table`]) in f32.
    pub tables: &'a [[f32; 4]],
    /// Each row's standardization.
    pub scales: &'a [RowScale],
}
