//! A chunked elementwise map and strided reduction of a generated matrix on the actors:
//! `Σ (x_ij + c)` over the rows and columns `i, j ≡ 0 (mod s)`, which is what Dask's
//! `(x + c)[::s, ::s].sum()` computes.
//!
//! The matrix is cut into tiles of `chunk_rows × chunk_cols`; a row of tiles is a panel,
//! the unit [`Placement`] hands to an actor. Per tile, an actor thread generates only the
//! selected values (the rows `i ≡ 0 (mod s)` and in each the columns `j ≡ 0 (mod s)`, one
//! row at a time into a short buffer), adds `c` to each and sums them. Nothing the size of
//! a tile is ever allocated: the values selected go from the generator to the sum through
//! the cache.
//!
//! The order of every addition is fixed by the grid alone, never by placement or timing:
//! * a row: eight interleaved partial sums (lane `k` takes values `k, k + 8, …`) added as
//!   `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`, then the tail in order;
//! * a tile: its rows' sums, pairwise (halving the list);
//! * a panel: its tiles' sums, pairwise in column order;
//! * the matrix: the panels' sums through the fixed tree over global panel order
//!   ([`Tree`]), the tree the TSQR uses.
//!
//! So the sum has the same bits for any number of ranks, actors or threads, as the SVD's
//! results do. With `check`, each tile also keeps a compensated (Neumaier) sum of the same
//! values, carried through the same tree with an error-free two-sum at every node: the
//! reference against which the plain sum's rounding error is reported.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use ndarray::Array2;
use rankwise_exec::{ChunkGrid, Placement, Runtime};
use rankwise_sources::{Generated, PanelSource};

use crate::tree::{decode, encode, Tree};
use crate::LinalgError;

/// What to sum and how the matrix is cut.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StridedSum {
    /// Rows per panel (a row of tiles).
    pub chunk_rows: u64,
    /// Columns per tile (capped at the matrix's columns).
    pub chunk_cols: u64,
    /// The stride of the selection in both dimensions (`[::step, ::step]`).
    pub step: u64,
    /// The constant added to every value before the sum.
    pub add: f64,
    /// Also form the compensated sum.
    pub check: bool,
}

/// The result of [`strided_sum`], the same on every rank (except the per-rank figures).
#[derive(Clone, Debug, PartialEq)]
pub struct StridedSumResult {
    /// `Σ (x_ij + add)` over the selection, in the fixed order described above.
    pub sum: f64,
    /// The compensated sum of the same values (with `check`).
    pub compensated: Option<f64>,
    /// Values in the selection: `⌈rows / step⌉ · ⌈cols / step⌉`.
    pub count: u64,
    /// Values this rank generated.
    pub local_count: u64,
    /// The panels.
    pub grid: ChunkGrid,
    /// Columns per tile, as used (capped at the columns).
    pub chunk_cols: u64,
    /// Tiles in the matrix.
    pub tiles: usize,
    /// Tiles this rank summed.
    pub local_tiles: usize,
}

impl StridedSum {
    /// Checks the options against a generated source of shape `(rows, cols)` and returns
    /// the panel grid. Errors name the command-line options.
    pub fn grid(&self, source: &Generated) -> Result<ChunkGrid, LinalgError> {
        let option =
            |parameter: &'static str, message: String| LinalgError::Option { parameter, message };
        if source.is_transposed() {
            return Err(option(
                "source",
                "the strided sum runs over the untransposed generated matrix".into(),
            ));
        }
        let (rows, cols) = PanelSource::shape(source);
        rankwise_sources::Generated::check_shape(rows, cols)?;
        let grid = ChunkGrid::new(rows, cols, self.chunk_rows)?;
        if self.chunk_cols == 0 {
            return Err(option(
                "chunk_cols",
                "tiles need at least one column".into(),
            ));
        }
        if self.step == 0 {
            return Err(option(
                "step",
                "the stride must be at least 1 (1 sums every value)".into(),
            ));
        }
        if !self.add.is_finite() {
            return Err(option(
                "add",
                format!("{} is not a finite number", self.add),
            ));
        }
        Ok(grid)
    }

    /// Values in the selection of a `rows × cols` matrix.
    pub fn count(&self, rows: u64, cols: u64) -> u64 {
        rows.div_ceil(self.step.max(1)) * cols.div_ceil(self.step.max(1))
    }
}

/// One tile's sums: plain, and the compensated pair (sum, correction).
type TileSums = [f64; 3];

/// `Σ (x_ij + add)` over rows and columns `≡ 0 (mod step)` of the generated matrix, on
/// this rank's actors (a collective call: every rank makes it). See the module
/// documentation for the order of the additions.
pub fn strided_sum(
    rt: &Runtime,
    source: &Generated,
    spec: &StridedSum,
) -> Result<StridedSumResult, LinalgError> {
    let grid = spec.grid(source)?;
    let chunk_cols = spec.chunk_cols.min(grid.cols);
    let tiles_per_panel = grid.cols.div_ceil(chunk_cols) as usize;
    let placement = Placement::compute(grid.panels(), rt.world());
    let me = rt.rank();
    let inputs: Vec<Vec<(usize, usize)>> = placement
        .assignments
        .iter()
        .filter(|a| a.rank == me)
        .map(|a| {
            a.panels
                .clone()
                .flat_map(|p| (0..tiles_per_panel).map(move |t| (p, t)))
                .collect()
        })
        .collect();
    let local_tiles = inputs.iter().map(Vec::len).sum();
    let source = Arc::new(source.clone());
    let spec = *spec;
    let results = rt.map(inputs, move |_, (p, t)| {
        let rows = grid.panel_rows(p);
        let c0 = t as u64 * chunk_cols;
        let cols = c0..(c0 + chunk_cols).min(grid.cols);
        tile_sums(&source, rows.clone(), cols, &spec)
            .map(|(sums, n)| (p, sums, n))
            .map_err(|e| LinalgError::Panel {
                panel: p,
                rows: format!("{}..{}", rows.start, rows.end),
                message: e.to_string(),
            })
    })?;

    // Each panel's tiles, in column order (the order the jobs were listed in).
    let mut panels: BTreeMap<usize, Vec<TileSums>> = BTreeMap::new();
    let mut local_count = 0;
    for list in results {
        for r in list {
            let (p, sums, n) = r?;
            panels.entry(p).or_default().push(sums);
            local_count += n;
        }
    }
    let leaves: BTreeMap<usize, Array2<f64>> = panels
        .into_iter()
        .map(|(p, tiles)| {
            let plain: Vec<f64> = tiles.iter().map(|s| s[0]).collect();
            let (s, c) = tiles.iter().fold((0.0, 0.0), |(s, c), t| {
                add_compensated((s, c), (t[1], t[2]))
            });
            (
                p,
                Array2::from_shape_vec((1, 3), vec![pairwise(&plain), s, c]).expect("1 × 3"),
            )
        })
        .collect();

    let tree = Tree::new(&placement.owner);
    let comm = rt.comm();
    let root = tree.up(comm, leaves, |_, _, a, b| {
        let (s, c) = add_compensated((a[[0, 1]], a[[0, 2]]), (b[[0, 1]], b[[0, 2]]));
        Ok(Array2::from_shape_vec((1, 3), vec![a[[0, 0]] + b[[0, 0]], s, c]).expect("1 × 3"))
    })?;
    let mut flat = root.map(|r| encode(&r)).unwrap_or_default();
    comm.broadcast_f64(tree.root_owner(), &mut flat)?;
    let total = decode(tree.root_owner(), &flat)?;
    if total.dim() != (1, 3) {
        return Err(LinalgError::Message {
            peer: tree.root_owner(),
        });
    }
    Ok(StridedSumResult {
        sum: total[[0, 0]],
        compensated: spec.check.then(|| total[[0, 1]] + total[[0, 2]]),
        count: spec.count(grid.rows, grid.cols),
        local_count,
        grid,
        chunk_cols,
        tiles: grid.panels() * tiles_per_panel,
        local_tiles,
    })
}

/// The first multiple of `step` at or after `start`, if it is before `end`, and how many
/// multiples of `step` lie in `start..end`.
fn selected(range: &Range<u64>, step: u64) -> (u64, u64) {
    let first = range.start.div_ceil(step) * step;
    if first >= range.end {
        (first, 0)
    } else {
        (first, (range.end - first).div_ceil(step))
    }
}

/// One tile's sums and the number of values in it.
fn tile_sums(
    source: &Generated,
    rows: Range<u64>,
    cols: Range<u64>,
    spec: &StridedSum,
) -> Result<(TileSums, u64), rankwise_sources::SourceError> {
    let step = spec.step;
    let (row0, nrows) = selected(&rows, step);
    let (col0, ncols) = selected(&cols, step);
    if nrows == 0 || ncols == 0 {
        return Ok(([0.0; 3], 0));
    }
    let mut buf = vec![0.0; ncols as usize];
    let mut row_sums = Vec::with_capacity(nrows as usize);
    let mut comp = (0.0, 0.0);
    for k in 0..nrows {
        source.fill_strided_row(row0 + k * step, col0, step, &mut buf)?;
        row_sums.push(lanes_sum_plus(&buf, spec.add));
        if spec.check {
            comp = buf
                .iter()
                .fold(comp, |acc, &v| add_compensated(acc, (v + spec.add, 0.0)));
        }
    }
    Ok(([pairwise(&row_sums), comp.0, comp.1], nrows * ncols))
}

/// `Σ (v + add)` over `values`, each `v + add` rounded, in eight interleaved lanes (see the
/// module documentation): a fixed order that the compiler can keep in vector registers.
fn lanes_sum_plus(values: &[f64], add: f64) -> f64 {
    let mut lanes = [0.0f64; 8];
    let mut blocks = values.chunks_exact(8);
    for b in &mut blocks {
        for (l, &v) in lanes.iter_mut().zip(b) {
            *l += v + add;
        }
    }
    let mut s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for &v in blocks.remainder() {
        s += v + add;
    }
    s
}

/// Pairwise sum: the two halves (the first `len / 2` values, then the rest) summed
/// recursively and added. Its rounding error grows with the logarithm of the length.
fn pairwise(values: &[f64]) -> f64 {
    match values.len() {
        0 => 0.0,
        1 => values[0],
        n => pairwise(&values[..n / 2]) + pairwise(&values[n / 2..]),
    }
}

/// Neumaier's compensated addition of two (sum, correction) pairs: the sums are added
/// with the rounding error of that addition (Knuth's two-sum) moved into the correction.
fn add_compensated((s1, c1): (f64, f64), (s2, c2): (f64, f64)) -> (f64, f64) {
    let s = s1 + s2;
    let b = s - s1;
    let err = (s1 - (s - b)) + (s2 - b);
    (s, c1 + c2 + err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_counts_multiples_of_the_step() {
        assert_eq!(selected(&(0..10), 2), (0, 5));
        assert_eq!(selected(&(1..10), 2), (2, 4));
        assert_eq!(selected(&(3..4), 2), (4, 0));
        assert_eq!(selected(&(9..10), 3), (9, 1));
        assert_eq!(selected(&(5..7), 1), (5, 2));
    }

    #[test]
    fn sums_have_their_documented_order() {
        let v: Vec<f64> = (0..19).map(|i| 1.0 + i as f64 * 0.1).collect();
        let add = 0.25;
        let mut lanes = [0.0; 8];
        for i in 0..16 {
            lanes[i % 8] += v[i] + add;
        }
        let mut want = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
            + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
        for &x in &v[16..] {
            want += x + add;
        }
        assert_eq!(lanes_sum_plus(&v, add).to_bits(), want.to_bits());
        assert_eq!(
            pairwise(&v[..5]).to_bits(),
            ((v[0] + v[1]) + (v[2] + (v[3] + v[4]))).to_bits()
        );
        assert_eq!(pairwise(&[]), 0.0);
    }

    #[test]
    fn compensated_addition_keeps_what_rounding_drops() {
        let (s, c) = [1e16, 1.0, -1e16, 1.0]
            .iter()
            .fold((0.0, 0.0), |acc, &v| add_compensated(acc, (v, 0.0)));
        assert_eq!(s + c, 2.0);
        let plain: f64 = [1e16, 1.0, -1e16, 1.0].iter().sum();
        assert_ne!(plain, 2.0, "the plain sum loses a 1");
    }

    #[test]
    fn options_are_checked_by_name() {
        let g = Generated::new(10, 10, 0, rankwise_sources::Dist::Normal);
        let ok = StridedSum {
            chunk_rows: 3,
            chunk_cols: 4,
            step: 2,
            add: 1.0,
            check: false,
        };
        assert_eq!(ok.grid(&g).unwrap().panels(), 4);
        assert_eq!(ok.count(10, 9), 25);
        for (bad, option) in [
            (StridedSum { step: 0, ..ok }, "`step`"),
            (
                StridedSum {
                    chunk_cols: 0,
                    ..ok
                },
                "`chunk_cols`",
            ),
            (
                StridedSum {
                    chunk_rows: 0,
                    ..ok
                },
                "`chunk_rows`",
            ),
            (
                StridedSum {
                    add: f64::NAN,
                    ..ok
                },
                "`add`",
            ),
        ] {
            let e = bad.grid(&g).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{option}: ")), "{e}");
        }
        let empty = Generated::new(0, 10, 0, rankwise_sources::Dist::Normal);
        assert!(ok
            .grid(&empty)
            .unwrap_err()
            .to_string()
            .starts_with("`rows`: "));
    }
}
