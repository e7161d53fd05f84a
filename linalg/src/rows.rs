//! The rows of a distributed factor that one rank holds, collected from the
//! [`FactorSink`] its actors hand their panels to.

use std::sync::{Arc, Mutex};

use ndarray::{s, Array2};

use crate::FactorSink;

/// The rows of a distributed factor that this rank holds, in global row order: `rows[i]`
/// is the global row of `values`' row `i`. On one rank, every row, in order.
#[derive(Clone, Debug)]
pub struct LocalRows {
    /// The global index of each row.
    pub rows: Vec<u64>,
    /// The rows, `rows.len() × k`.
    pub values: Array2<f64>,
}

type Collected = Arc<Mutex<Vec<(u64, Array2<f64>)>>>;

/// Collects the panels of a factor as the actors hand them over ([`LocalRows::collect`]).
#[derive(Debug)]
pub struct RowCollector {
    panels: Collected,
    k: usize,
}

impl LocalRows {
    /// A sink for a driver's factor (`k` columns), and what gathers its panels into this
    /// rank's [`LocalRows`] once the driver has returned.
    pub fn collect(k: usize) -> (FactorSink, RowCollector) {
        let panels: Collected = Default::default();
        let to = Arc::clone(&panels);
        let sink: FactorSink = Arc::new(move |_, rows, block| {
            if block.nrows() as u64 != rows.end - rows.start {
                return Err(format!(
                    "{} rows handed over for rows {rows:?}",
                    block.nrows()
                ));
            }
            // Each push is whole: the list is consistent even if a pusher panicked (that
            // panic is its rank's failure, reported by the driver).
            to.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((rows.start, block.to_owned()));
            Ok(())
        });
        (sink, RowCollector { panels, k })
    }
}

impl RowCollector {
    /// This rank's rows, in global row order.
    pub fn finish(self) -> LocalRows {
        let mut panels =
            std::mem::take(&mut *self.panels.lock().unwrap_or_else(|p| p.into_inner()));
        panels.sort_by_key(|(r, _)| *r);
        let total: usize = panels.iter().map(|(_, b)| b.nrows()).sum();
        let k = panels.first().map_or(self.k, |(_, b)| b.ncols());
        let mut values = Array2::zeros((total, k));
        let mut rows = Vec::with_capacity(total);
        let mut at = 0;
        for (r0, b) in panels {
            values.slice_mut(s![at..at + b.nrows(), ..]).assign(&b);
            rows.extend(r0..r0 + b.nrows() as u64);
            at += b.nrows();
        }
        LocalRows { rows, values }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_handed_over_in_any_order_come_back_in_row_order() {
        let (sink, collector) = LocalRows::collect(2);
        let block = |v: f64, n: usize| Array2::from_elem((n, 2), v);
        sink(1, 3..5, block(1.0, 2).view()).unwrap();
        sink(0, 0..3, block(0.0, 3).view()).unwrap();
        assert!(sink(2, 5..9, block(2.0, 3).view()).is_err(), "3 rows for 4");
        let got = collector.finish();
        assert_eq!(got.rows, [0, 1, 2, 3, 4]);
        assert_eq!(got.values.column(0).to_vec(), [0.0, 0.0, 0.0, 1.0, 1.0]);
    }
}
