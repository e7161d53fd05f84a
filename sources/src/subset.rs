//! A genotype matrix restricted to some of its samples (`pca --keep`, `--remove`).
//!
//! The stored chunks hold every sample, so a panel is read whole as the source reads it
//! (its read-ahead, segments and staging unchanged) and its kept columns are then moved to
//! the front of each row, in place: the buffer ends as a panel of the kept samples alone.
//! Every later step (standardization, `--maf` and the other filters, the products) sees only
//! the kept samples, as PLINK's `--keep` computes allele frequencies after it.

use std::ops::Range;
use std::sync::Arc;

use ndarray::{ArrayViewMut2, ShapeBuilder};

use crate::error::SourceError;
use crate::panel::{ElementType, PanelBuffer, ReadStats, StoredPanels};
use crate::source::GenotypeSource;

/// The samples (columns) `cols` of a genotype source, in the source's order.
pub struct SampleSubset {
    inner: Arc<dyn GenotypeSource>,
    cols: Vec<usize>,
    /// `cols` as runs of consecutive columns `(first, length)`: a selection of blocks of
    /// samples moves a block at a time.
    runs: Vec<(usize, usize)>,
    origin: String,
}

impl SampleSubset {
    /// The columns of `inner` for which `keep` (given each column and its sample's
    /// identifier) is true; `origin` (`--keep FILE`) names the selection in descriptions.
    pub fn new(
        inner: Arc<dyn GenotypeSource>,
        origin: impl Into<String>,
        ids: &[String],
        mut keep: impl FnMut(usize, &str) -> bool,
    ) -> SampleSubset {
        let cols: Vec<usize> = ids
            .iter()
            .enumerate()
            .filter(|(j, id)| keep(*j, id))
            .map(|(j, _)| j)
            .collect();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &j in &cols {
            match runs.last_mut() {
                Some((first, len)) if *first + *len == j => *len += 1,
                _ => runs.push((j, 1)),
            }
        }
        SampleSubset {
            inner,
            cols,
            runs,
            origin: origin.into(),
        }
    }

    /// Samples kept.
    pub fn kept(&self) -> usize {
        self.cols.len()
    }

    /// Moves each of `rows` rows' kept values (of `size` bytes, rows of `n` values) to the
    /// front of its row, rows packed one after another: the columns only move left, so the
    /// copy runs in place. Single samples of one-byte dosages (`--keep` of every other
    /// sample, say) are moved by a plain loop rather than a `memmove` each.
    fn compact(&self, bytes: &mut [u8], rows: usize, n: usize, size: usize) {
        let k = self.cols.len();
        let singles = size == 1 && self.runs.len() * 2 > k;
        for i in 0..rows {
            let (src, dst) = (i * n, i * k);
            if singles {
                for (t, &j) in self.cols.iter().enumerate() {
                    bytes[dst + t] = bytes[src + j];
                }
                continue;
            }
            let mut t = 0;
            for &(first, len) in &self.runs {
                let from = (src + first) * size;
                bytes.copy_within(from..from + len * size, (dst + t) * size);
                t += len;
            }
        }
    }
}

impl GenotypeSource for SampleSubset {
    fn shape(&self) -> (u64, u64) {
        (self.inner.shape().0, self.cols.len() as u64)
    }

    fn fill_dosages(
        &self,
        rows: Range<u64>,
        mut out: ArrayViewMut2<'_, i8>,
    ) -> Result<(), SourceError> {
        let n = self.inner.shape().1 as usize;
        let h = (rows.end - rows.start) as usize;
        let mut whole = vec![0i8; h * n];
        let view = ArrayViewMut2::from_shape((h, n).strides((n, 1)), &mut whole)
            .expect("the buffer holds the rows");
        self.inner.fill_dosages(rows, view)?;
        for (i, mut row) in out.rows_mut().into_iter().enumerate() {
            for (o, &j) in row.iter_mut().zip(&self.cols) {
                *o = whole[i * n + j];
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "{}, {} of its samples ({})",
            self.inner.describe(),
            self.cols.len(),
            self.origin
        )
    }

    fn sample_ids(&self) -> Option<Vec<String>> {
        let ids = self.inner.sample_ids()?;
        Some(self.cols.iter().map(|&j| ids[j].clone()).collect())
    }

    fn family_ids(&self) -> Option<Vec<String>> {
        let ids = self.inner.family_ids()?;
        Some(self.cols.iter().map(|&j| ids[j].clone()).collect())
    }

    fn sample_groups(&self) -> Option<Vec<String>> {
        let groups = self.inner.sample_groups()?;
        Some(self.cols.iter().map(|&j| groups[j].clone()).collect())
    }

    fn variant_ids(&self, each: &mut dyn FnMut(Option<&str>)) -> Result<bool, SourceError> {
        self.inner.variant_ids(each)
    }

    fn variant_allele_counts(&self, each: &mut dyn FnMut(usize)) -> Result<bool, SourceError> {
        self.inner.variant_allele_counts(each)
    }

    fn variant_alleles(&self, each: &mut dyn FnMut(&str, &str)) -> Result<bool, SourceError> {
        self.inner.variant_alleles(each)
    }

    fn variant_positions(&self, each: &mut dyn FnMut(i64)) -> Result<bool, SourceError> {
        self.inner.variant_positions(each)
    }

    // Selecting samples keeps every variant: `keep` with `chromosomes` selects by both.
    fn variant_chromosomes(&self, each: &mut dyn FnMut(&str)) -> Result<bool, SourceError> {
        self.inner.variant_chromosomes(each)
    }

    fn stored(&self) -> Option<&dyn StoredPanels> {
        self.inner.stored().map(|_| self as &dyn StoredPanels)
    }
}

impl StoredPanels for SampleSubset {
    fn chunk_rows(&self) -> u64 {
        self.stored_inner().chunk_rows()
    }

    fn default_panel_rows(&self) -> u64 {
        self.stored_inner().default_panel_rows()
    }

    fn element_type(&self) -> ElementType {
        self.stored_inner().element_type()
    }

    fn partial_reads(&self) -> bool {
        self.stored_inner().partial_reads()
    }

    fn buffer_bytes(&self, rows: u64) -> u64 {
        self.stored_inner().buffer_bytes(rows)
    }

    fn stored_bytes(&self, rows: Range<u64>) -> u64 {
        self.stored_inner().stored_bytes(rows)
    }

    fn read_panel(
        &self,
        rows: Range<u64>,
        buf: &mut PanelBuffer,
    ) -> Result<ReadStats, SourceError> {
        let stats = self.stored_inner().read_panel(rows, buf)?;
        let size = buf.values.element_type().size();
        let (h, n) = (buf.rows, buf.cols);
        self.compact(buf.values.bytes_mut(), h, n, size);
        buf.cols = self.cols.len();
        Ok(stats)
    }
}

impl SampleSubset {
    /// The stored panels of the source, which [`GenotypeSource::stored`] only hands out
    /// when there are some.
    fn stored_inner(&self) -> &dyn StoredPanels {
        self.inner
            .stored()
            .expect("a subset is stored exactly when its source is")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Dist, Generated, InMemoryGenotypes};
    use crate::BedGenotypes;

    /// Fresh subsets of a generated matrix, as dosages and, through a `.bed` written from
    /// it, as stored panels compacted in place (sample by sample, and run by run): the kept
    /// columns, in order, with their IDs.
    #[test]
    fn subsets_are_the_kept_columns_filled_or_read() {
        let mut s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        eprintln!("seed {s}");
        let mut next = || {
            s = crate::source::mix64(s.wrapping_add(0x9E37_79B9_7F4A_7C15));
            s
        };
        let dir = std::env::temp_dir().join(format!("rankwise-subset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..6 {
            let (m, n) = (1 + next() % 40, 1 + next() % 30);
            let g = Generated::new(m, n, next(), Dist::Genotype).with_missing(0.1);
            let mut full = ndarray::Array2::<i8>::zeros((m as usize, n as usize));
            g.fill_dosages(0..m, full.view_mut()).unwrap();
            let ids: Vec<String> = (0..n).map(|j| format!("s{j}")).collect();
            // Scattered samples (moved one by one), or blocks of them (moved a run at a time).
            let mask = match round % 2 {
                0 => next(),
                _ => (u64::MAX >> (next() % 64)) << (next() % 8),
            };
            let keep = |j: usize, id: &str| {
                assert_eq!(id, format!("s{j}"));
                mask >> (j % 64) & 1 == 1
            };
            let cols: Vec<usize> = (0..n as usize).filter(|&j| keep(j, &ids[j])).collect();
            let want = full.select(ndarray::Axis(1), &cols);
            let memory: Arc<dyn GenotypeSource> =
                Arc::new(InMemoryGenotypes::new(full.clone(), "t"));
            let sub = SampleSubset::new(memory, "`keep` t", &ids, keep);
            assert_eq!(sub.shape(), (m, cols.len() as u64));
            let mut got = ndarray::Array2::<i8>::zeros((m as usize, cols.len()));
            sub.fill_dosages(0..m, got.view_mut()).unwrap();
            assert_eq!(got, want);
            let rows: Vec<Vec<i8>> = full.rows().into_iter().map(|r| r.to_vec()).collect();
            let prefix = crate::bed::tests::write(&dir, &rows);
            let bed: Arc<dyn GenotypeSource> = Arc::new(BedGenotypes::open(&prefix).unwrap());
            let sub = SampleSubset::new(bed, "`keep` t", &ids, keep);
            let want_ids: Vec<String> = cols.iter().map(|&j| ids[j].clone()).collect();
            assert_eq!(sub.sample_ids(), Some(want_ids));
            // Every variant stays: its ID and chromosome are the fileset's.
            let (mut sub_chr, mut bed_chr) = (Vec::new(), Vec::new());
            assert!(sub
                .variant_chromosomes(&mut |c| sub_chr.push(c.to_string()))
                .unwrap());
            let whole = BedGenotypes::open(&prefix).unwrap();
            assert!(whole
                .variant_chromosomes(&mut |c| bed_chr.push(c.to_string()))
                .unwrap());
            assert_eq!((sub_chr.len(), &sub_chr), (m as usize, &bed_chr));
            let mut sub_ids = 0;
            assert!(sub.variant_ids(&mut |_| sub_ids += 1).unwrap());
            assert_eq!(sub_ids, m);
            let r0 = next() % m;
            let mut buf = PanelBuffer::default();
            sub.stored().unwrap().read_panel(r0..m, &mut buf).unwrap();
            assert_eq!((buf.rows, buf.cols), ((m - r0) as usize, cols.len()));
            let d = buf.dosages().unwrap();
            assert_eq!(
                d,
                want.slice(ndarray::s![r0 as usize.., ..])
                    .iter()
                    .copied()
                    .collect::<Vec<_>>()
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
