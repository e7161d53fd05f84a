//! The chunk grid and row-panel placement.
//!
//! A matrix is cut into row panels of `chunk_rows` rows (the last one may be shorter). A
//! panel is owned whole by one actor, so products with the panel and per-row work never
//! communicate. Placement gives each actor, in global order (rank, then actor), a contiguous
//! range of panels whose size is proportional to the actor's weight (its thread count). It
//! is a pure function of the grid and the world: every rank computes the same placement
//! without talking to the others, and `rankwise plan` prints it.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::RuntimeError;

/// The most panels a grid may have. The plan keeps a few words per panel on every rank
/// (its owner, its place in the reduction tree), sized by the input: a hostile shape of
/// 10¹⁵ rows in bands of 200 would ask for 40 TB of them. 2²⁴ panels are 10⁹ variants in
/// panels of 60 rows.
pub(crate) const MAX_PANELS: u64 = 1 << 24;

/// A matrix cut into row panels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkGrid {
    /// Rows of the matrix the algorithm sees.
    pub rows: u64,
    /// Columns.
    pub cols: u64,
    /// Rows per panel (the last panel may be shorter).
    pub chunk_rows: u64,
}

impl ChunkGrid {
    /// Checks the shape and returns the grid. The messages name the command-line options.
    pub fn new(rows: u64, cols: u64, chunk_rows: u64) -> Result<Self, RuntimeError> {
        if rows == 0 {
            return Err(RuntimeError::Option {
                parameter: "rows",
                message: "the matrix needs at least one row".into(),
            });
        }
        if cols == 0 {
            return Err(RuntimeError::Option {
                parameter: "cols",
                message: "the matrix needs at least one column".into(),
            });
        }
        if chunk_rows == 0 {
            return Err(RuntimeError::Option {
                parameter: "chunk_rows",
                message: "panels need at least one row".into(),
            });
        }
        let panels = rows.div_ceil(chunk_rows);
        if panels > MAX_PANELS {
            return Err(RuntimeError::Option {
                parameter: "chunk_rows",
                message: format!(
                    "{rows} rows in panels of {chunk_rows} are {panels} panels, more than the \
                     {MAX_PANELS} a plan can place; use panels of at least {} rows",
                    rows.div_ceil(MAX_PANELS)
                ),
            });
        }
        Ok(ChunkGrid {
            rows,
            cols,
            chunk_rows,
        })
    }

    /// Number of panels.
    pub fn panels(&self) -> usize {
        self.rows.div_ceil(self.chunk_rows) as usize
    }

    /// Global rows of panel `p`.
    pub fn panel_rows(&self, p: usize) -> Range<u64> {
        let start = p as u64 * self.chunk_rows;
        start..(start + self.chunk_rows).min(self.rows)
    }

    /// Bytes of one full f64 panel.
    pub fn panel_bytes(&self) -> u64 {
        self.chunk_rows.min(self.rows) * self.cols * 8
    }
}

/// What computes an actor's panels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActorKind {
    /// Its worker threads, on their CPU cores.
    #[default]
    Cpu,
    /// Its GPU (an opened device), fed by its worker threads: the plans count the
    /// page-locked host buffers that carry stored panels to the device.
    Gpu,
}

/// What one actor brings to the placement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActorShape {
    /// Worker threads of the actor (its placement weight).
    pub threads: usize,
    /// The actor's memory budget in bytes.
    pub memory: u64,
    /// Where it runs, for reports: e.g. `numa0 cores 0-1`.
    pub device: String,
    /// What computes its panels.
    pub kind: ActorKind,
}

/// Every rank's actors, as all ranks agree on them after start-up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct World {
    /// `ranks[r]` lists rank r's actors.
    pub ranks: Vec<Vec<ActorShape>>,
}

impl World {
    /// Total number of actors.
    pub fn actors(&self) -> usize {
        self.ranks.iter().map(Vec::len).sum()
    }
}

/// One actor's share of the panels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The rank hosting the actor.
    pub rank: usize,
    /// The actor's index on its rank.
    pub actor: usize,
    /// Its contiguous range of global panel indices.
    pub panels: Range<usize>,
}

/// Which actor owns which panels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Assignments in global actor order; ranges are contiguous and cover all panels.
    pub assignments: Vec<Assignment>,
    /// `owner[p]` = rank owning panel `p`.
    pub owner: Vec<usize>,
}

impl Placement {
    /// Places `panels` panels over the world's actors, weighted by threads.
    pub fn compute(panels: usize, world: &World) -> Placement {
        let actors: Vec<(usize, usize, usize)> = world
            .ranks
            .iter()
            .enumerate()
            .flat_map(|(r, a)| {
                a.iter()
                    .enumerate()
                    .map(move |(i, s)| (r, i, s.threads.max(1)))
            })
            .collect();
        let total: usize = actors.iter().map(|a| a.2).sum();
        let mut assignments = Vec::with_capacity(actors.len());
        let mut owner = vec![0usize; panels];
        let mut cum = 0usize;
        let mut start = 0usize;
        for &(rank, actor, w) in &actors {
            cum += w;
            // Integer arithmetic: the same boundaries on every rank and every machine.
            let end = if total == 0 {
                panels
            } else {
                ((panels as u128 * cum as u128 + total as u128 / 2) / total as u128) as usize
            };
            let end = end.clamp(start, panels);
            for o in &mut owner[start..end] {
                *o = rank;
            }
            assignments.push(Assignment {
                rank,
                actor,
                panels: start..end,
            });
            start = end;
        }
        Placement { assignments, owner }
    }

    /// Places panels where they already are: rank `r` owns the `rank_panels[r]` panels that
    /// follow those of ranks `0..r`, in rank order (a host code's row blocks, each a whole
    /// number of panels). Within a rank the panels are shared among its actors by threads,
    /// as in [`Placement::compute`]. Fails when the counts do not match the world's ranks
    /// or do not add up to `panels`.
    pub fn by_rank(
        panels: usize,
        rank_panels: &[usize],
        world: &World,
    ) -> Result<Placement, RuntimeError> {
        if rank_panels.len() != world.ranks.len() || rank_panels.iter().sum::<usize>() != panels {
            return Err(RuntimeError::Option {
                parameter: "rank_panels",
                message: format!(
                    "{} panels cannot be placed as {rank_panels:?} over {} ranks",
                    panels,
                    world.ranks.len()
                ),
            });
        }
        let mut assignments = Vec::with_capacity(world.actors());
        let mut owner = Vec::with_capacity(panels);
        let mut start = 0usize;
        for (rank, (&count, actors)) in rank_panels.iter().zip(&world.ranks).enumerate() {
            // The rank's own share, placed over its actors alone.
            let local = Placement::compute(
                count,
                &World {
                    ranks: vec![actors.clone()],
                },
            );
            for a in local.assignments {
                assignments.push(Assignment {
                    rank,
                    actor: a.actor,
                    panels: start + a.panels.start..start + a.panels.end,
                });
            }
            owner.extend(std::iter::repeat_n(rank, count));
            start += count;
        }
        Ok(Placement { assignments, owner })
    }

    /// Panels of actor `actor` on rank `rank`.
    pub fn panels_of(&self, rank: usize, actor: usize) -> Range<usize> {
        self.assignments
            .iter()
            .find(|a| a.rank == rank && a.actor == actor)
            .map(|a| a.panels.clone())
            .unwrap_or(0..0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world(spec: &[&[usize]]) -> World {
        World {
            ranks: spec
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|&t| ActorShape {
                            threads: t,
                            memory: 1 << 30,
                            device: "cpu".into(),
                            kind: ActorKind::Cpu,
                        })
                        .collect()
                })
                .collect(),
        }
    }

    #[test]
    fn grid_counts_ragged_panels() {
        let g = ChunkGrid::new(10, 3, 4).unwrap();
        assert_eq!(g.panels(), 3);
        assert_eq!(g.panel_rows(2), 8..10);
        assert!(ChunkGrid::new(0, 3, 4).is_err());
        assert!(ChunkGrid::new(3, 0, 4).is_err());
        let e = ChunkGrid::new(3, 3, 0).unwrap_err().to_string();
        assert!(e.contains("`chunk_rows`"), "{e}");
    }

    /// Hostile shapes (a `zarr.json` of 10¹⁵ rows, `plan --rows 549755813888 --chunk-rows
    /// 1`) are refused before anything is sized by them: they aborted the process when the
    /// placement allocated a word per panel.
    #[test]
    fn absurd_panel_counts_are_refused_before_anything_is_allocated() {
        for (rows, chunk) in [
            (1_000_000_000_000_000u64, 200u64),
            (549_755_813_888, 1),
            (u64::MAX, 1),
            (u64::MAX, 1 << 20),
            (MAX_PANELS + 1, 1),
        ] {
            let e = ChunkGrid::new(rows, 50, chunk).unwrap_err().to_string();
            assert!(e.contains("`chunk_rows`") && e.contains("panels"), "{e}");
        }
        let g = ChunkGrid::new(MAX_PANELS * 3, 50, 3).unwrap();
        assert_eq!(g.panels() as u64, MAX_PANELS);
    }

    #[test]
    fn placement_is_contiguous_weighted_and_complete() {
        for panels in [0usize, 1, 2, 3, 7, 16, 100] {
            for spec in [
                &[&[1usize][..]][..],
                &[&[2, 2], &[1]],
                &[&[1], &[1], &[1], &[1]],
            ] {
                let w = world(spec);
                let p = Placement::compute(panels, &w);
                assert_eq!(p.assignments.len(), w.actors());
                let mut next = 0;
                for a in &p.assignments {
                    assert_eq!(a.panels.start, next);
                    next = a.panels.end;
                    for q in a.panels.clone() {
                        assert_eq!(p.owner[q], a.rank);
                    }
                }
                assert_eq!(next, panels);
                assert_eq!(p, Placement::compute(panels, &w), "pure function");
            }
        }
        let p = Placement::compute(10, &world(&[&[3], &[1]]));
        assert_eq!(p.assignments[0].panels, 0..8);
    }

    #[test]
    fn placement_by_rank_keeps_each_ranks_panels() {
        let w = world(&[&[1, 1], &[2], &[1]]);
        let p = Placement::by_rank(7, &[4, 0, 3], &w).unwrap();
        assert_eq!(p.owner, vec![0, 0, 0, 0, 2, 2, 2]);
        let ranges: Vec<_> = p.assignments.iter().map(|a| a.panels.clone()).collect();
        assert_eq!(ranges, vec![0..2, 2..4, 4..4, 4..7]);
        assert_eq!(p.assignments[3].rank, 2);
        assert!(Placement::by_rank(7, &[4, 3], &w).is_err());
        assert!(Placement::by_rank(8, &[4, 0, 3], &w).is_err());
    }

    #[test]
    fn more_actors_than_panels_leaves_some_empty() {
        let p = Placement::compute(2, &world(&[&[1], &[1], &[1], &[1]]));
        let owned: Vec<usize> = p.assignments.iter().map(|a| a.panels.len()).collect();
        assert_eq!(owned.iter().sum::<usize>(), 2);
        assert!(owned.contains(&0));
    }
}
