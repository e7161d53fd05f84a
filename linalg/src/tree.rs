//! The fixed reduction tree over global panel order.
//!
//! Node `(level, j)` covers panels `[j·2^level, (j+1)·2^level)`; its children are
//! `(level−1, 2j)` and `(level−1, 2j+1)`. A node lives on the rank that owns its leftmost
//! panel, so a subtree inside one rank's contiguous panel range never communicates and a
//! parent receives only from its right child. The tree depends on the panel count alone:
//! the same products are formed in the same order for any number of ranks or actors,
//! which is what makes results bit-identical across rank counts.
//!
//! Message order cannot deadlock: in the up-sweep a rank first sends every node whose
//! parent is elsewhere (always to a lower rank) before it waits on any receive; the
//! down-sweep mirrors this towards higher ranks.

use std::collections::BTreeMap;

use ndarray::{Array2, ShapeBuilder};
use rankwise_transports::{Comm, Tag};

use crate::LinalgError;

const TAG_UP: Tag = 1000;
const TAG_DOWN: Tag = 2000;

/// The shape of the tree over `panels` leaves, with each panel's owning rank.
pub struct Tree<'a> {
    owners: &'a [usize],
}

impl<'a> Tree<'a> {
    /// A tree over the panels owned as `owners[p]`.
    pub fn new(owners: &'a [usize]) -> Self {
        Tree { owners }
    }

    /// The owner of every panel.
    pub fn owners(&self) -> &[usize] {
        self.owners
    }

    fn count(&self, level: usize) -> usize {
        self.owners.len().div_ceil(1 << level)
    }

    fn owner(&self, level: usize, j: usize) -> usize {
        self.owners[j << level]
    }

    /// Number of levels above the leaves.
    pub fn height(&self) -> usize {
        let mut l = 0;
        while self.count(l) > 1 {
            l += 1;
        }
        l
    }

    /// Rank holding the root.
    pub fn root_owner(&self) -> usize {
        self.owners[0]
    }

    /// Messages (and their element counts are the caller's business) this rank sends in one
    /// sweep: one per node whose parent is on another rank.
    pub fn messages_sent_by(&self, rank: usize) -> usize {
        let mut n = 0;
        for level in 0..self.height() {
            for j in (1..self.count(level)).step_by(2) {
                if self.owner(level, j) == rank && self.owner(level + 1, j / 2) != rank {
                    n += 1;
                }
            }
        }
        n
    }

    /// Merges this rank makes in one sweep: one per node it owns that has two children. The
    /// root's rank makes those of its own panels' subtree, then one a level above it; the
    /// other ranks merge their subtrees meanwhile, so its count is the sweep's critical path.
    pub fn merges_made_by(&self, rank: usize) -> usize {
        (0..self.height())
            .map(|level| {
                (0..self.count(level) / 2)
                    .filter(|&j| self.owner(level + 1, j) == rank)
                    .count()
            })
            .sum()
    }

    /// Combines leaf values up the tree. `combine(level, j, left, right)` forms node
    /// `(level, j)` from its two children; a node with one child takes its value unchanged.
    /// Returns the root's value on the root's owner, `None` elsewhere.
    pub fn up<F>(
        &self,
        comm: &dyn Comm,
        leaves: BTreeMap<usize, Array2<f64>>,
        combine: F,
    ) -> Result<Option<Array2<f64>>, LinalgError>
    where
        F: FnMut(usize, usize, Array2<f64>, Array2<f64>) -> Result<Array2<f64>, LinalgError>,
    {
        self.up_partial(
            comm,
            leaves.into_iter().map(|(p, v)| ((0, p), v)).collect(),
            combine,
        )
    }

    /// [`Tree::up`] from nodes at any level, keyed `(level, j)`: the leaves and the local
    /// subtrees already combined (by [`PartialSums`]). Every node of this rank must be
    /// present either itself or through an ancestor formed from it.
    pub fn up_partial<F>(
        &self,
        comm: &dyn Comm,
        mut nodes: BTreeMap<(usize, usize), Array2<f64>>,
        mut combine: F,
    ) -> Result<Option<Array2<f64>>, LinalgError>
    where
        F: FnMut(usize, usize, Array2<f64>, Array2<f64>) -> Result<Array2<f64>, LinalgError>,
    {
        let me = comm.rank();
        for level in 0..self.height() {
            let count = self.count(level);
            for j in (1..count).step_by(2) {
                let parent = self.owner(level + 1, j / 2);
                if self.owner(level, j) == me && parent != me {
                    let v = nodes
                        .remove(&(level, j))
                        .ok_or(LinalgError::Tree { level, node: j })?;
                    comm.send_f64(parent, TAG_UP + level as Tag, &encode(&v))?;
                }
            }
            for p in 0..self.count(level + 1) {
                let formed = (level + 1..=self.height())
                    .any(|l| nodes.contains_key(&(l, p >> (l - level - 1))));
                if self.owner(level + 1, p) != me || formed {
                    continue;
                }
                let left = nodes
                    .remove(&(level, 2 * p))
                    .ok_or(LinalgError::Tree { level, node: 2 * p })?;
                let value = if 2 * p + 1 < count {
                    let right = if self.owner(level, 2 * p + 1) == me {
                        nodes.remove(&(level, 2 * p + 1)).ok_or(LinalgError::Tree {
                            level,
                            node: 2 * p + 1,
                        })?
                    } else {
                        let src = self.owner(level, 2 * p + 1);
                        decode(src, &comm.recv_f64(src, TAG_UP + level as Tag)?)?
                    };
                    combine(level + 1, p, left, right)?
                } else {
                    left
                };
                nodes.insert((level + 1, p), value);
            }
        }
        Ok(nodes.remove(&(self.height(), 0)))
    }

    /// Pushes a value from the root down to the leaves. `split(level, j, value)` gives the
    /// values of node `(level, j)`'s two children; a node with one child passes its value
    /// on unchanged. `root` must be `Some` on the root's owner. Returns this rank's leaves.
    pub fn down<F>(
        &self,
        comm: &dyn Comm,
        root: Option<Array2<f64>>,
        mut split: F,
    ) -> Result<BTreeMap<usize, Array2<f64>>, LinalgError>
    where
        F: FnMut(usize, usize, Array2<f64>) -> Result<(Array2<f64>, Array2<f64>), LinalgError>,
    {
        let me = comm.rank();
        let top = self.height();
        let mut nodes = BTreeMap::new();
        if self.owner(top, 0) == me {
            nodes.insert(
                0,
                root.ok_or(LinalgError::Tree {
                    level: top,
                    node: 0,
                })?,
            );
        }
        for level in (0..top).rev() {
            let count = self.count(level);
            let mut next = BTreeMap::new();
            for (p, value) in std::mem::take(&mut nodes) {
                if 2 * p + 1 < count {
                    let (l, r) = split(level + 1, p, value)?;
                    next.insert(2 * p, l);
                    let dest = self.owner(level, 2 * p + 1);
                    if dest == me {
                        next.insert(2 * p + 1, r);
                    } else {
                        comm.send_f64(dest, TAG_DOWN + level as Tag, &encode(&r))?;
                    }
                } else {
                    next.insert(2 * p, value);
                }
            }
            for j in (1..count).step_by(2) {
                let parent = self.owner(level + 1, j / 2);
                if self.owner(level, j) == me && parent != me {
                    next.insert(
                        j,
                        decode(parent, &comm.recv_f64(parent, TAG_DOWN + level as Tag)?)?,
                    );
                }
            }
            nodes = next;
        }
        Ok(nodes)
    }

    /// Sums equally shaped leaf arrays up the tree and gives the total to every rank.
    pub fn sum_all(
        &self,
        comm: &dyn Comm,
        leaves: BTreeMap<usize, Array2<f64>>,
        shape: (usize, usize),
    ) -> Result<Array2<f64>, LinalgError> {
        self.sum_all_partial(
            comm,
            leaves.into_iter().map(|(p, v)| ((0, p), v)).collect(),
            shape,
        )
    }

    /// [`Tree::sum_all`] from the nodes a [`PartialSums`] left.
    pub fn sum_all_partial(
        &self,
        comm: &dyn Comm,
        nodes: BTreeMap<(usize, usize), Array2<f64>>,
        shape: (usize, usize),
    ) -> Result<Array2<f64>, LinalgError> {
        let root = self.up_partial(comm, nodes, |_, _, a, b| Ok(a + b))?;
        let mut flat = match root {
            Some(r) => encode(&r),
            None => Vec::new(),
        };
        comm.broadcast_f64(self.root_owner(), &mut flat)?;
        let total = decode(self.root_owner(), &flat)?;
        if total.dim() != shape {
            return Err(LinalgError::Tree {
                level: self.height(),
                node: 0,
            });
        }
        Ok(total)
    }
}

/// Sums leaf values up the tree as they arrive, inside this rank: a node whose two children
/// are both here (or that has one child) is formed as soon as its children are, so a rank
/// holds a few partial sums instead of one array per panel. The additions are the tree's own
/// (left + right at each node), so the result does not depend on the order leaves arrive
/// in. Leaves may be inserted from any thread.
pub struct PartialSums {
    owners: Vec<usize>,
    me: usize,
    nodes: std::sync::Mutex<BTreeMap<(usize, usize), Array2<f64>>>,
}

impl PartialSums {
    /// Partial sums over panels owned as `owners[p]`, on rank `me`.
    pub fn new(owners: Vec<usize>, me: usize) -> Self {
        PartialSums {
            owners,
            me,
            nodes: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// Adds the value of leaf `panel`.
    pub fn insert(&self, panel: usize, mut value: Array2<f64>) {
        let tree = Tree::new(&self.owners);
        let height = tree.height();
        let (mut level, mut j) = (0, panel);
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        while level < height && tree.owner(level + 1, j / 2) == self.me {
            let sib = j ^ 1;
            if sib < tree.count(level) {
                if tree.owner(level, sib) != self.me {
                    break;
                }
                match nodes.remove(&(level, sib)) {
                    Some(other) => {
                        value = if j % 2 == 0 {
                            value + other
                        } else {
                            other + value
                        };
                    }
                    None => break,
                }
            }
            level += 1;
            j /= 2;
        }
        nodes.insert((level, j), value);
    }

    /// Takes the nodes formed so far, for [`Tree::sum_all_partial`] or
    /// [`Tree::up_partial`].
    pub fn take(&self) -> BTreeMap<(usize, usize), Array2<f64>> {
        std::mem::take(&mut *self.nodes.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Flattens a matrix as `[rows, cols, column-major values…]`.
pub(crate) fn encode(a: &Array2<f64>) -> Vec<f64> {
    let mut out = Vec::with_capacity(2 + a.len());
    out.push(a.nrows() as f64);
    out.push(a.ncols() as f64);
    out.extend(a.t().iter());
    out
}

/// Inverse of [`encode`]; `peer` names the sender in errors.
pub(crate) fn decode(peer: usize, v: &[f64]) -> Result<Array2<f64>, LinalgError> {
    let bad = || LinalgError::Message { peer };
    if v.len() < 2 {
        return Err(bad());
    }
    let (r, c) = (v[0] as usize, v[1] as usize);
    if v.len() != 2 + r * c {
        return Err(bad());
    }
    Array2::from_shape_vec((r, c).f(), v[2..].to_vec()).map_err(|_| bad())
}
