//! Communication between ranks for rankwise.
//!
//! Every algorithm in rankwise talks to other ranks through the [`Comm`] trait only. Two
//! properties are required of every implementation:
//!
//! * **Determinism.** Collectives that combine values ([`Comm::allreduce_sum_f64`]) combine
//!   them in rank order, never in arrival order, so a run is repeatable bit for bit.
//! * **No hangs.** A rank that fails calls [`Comm::abort`]; every receive on every other
//!   rank watches for that notice while it waits and returns [`TransportError::PeerFailed`]
//!   carrying the failing rank and its message. Receives also give up after the
//!   configured timeout ([`Comm::set_timeout`]) so that a peer that vanished without a word
//!   (killed by a signal) cannot keep the job alive forever.
//!
//! Collectives have default implementations over point-to-point messages with reserved
//! tags, so a transport only has to move bytes.

use std::time::Duration;

mod counted;
mod local;
#[cfg(feature = "mpi")]
pub mod mpi_comm;
#[cfg(feature = "ucx")]
pub mod ucx_comm;

pub use counted::{CommCounts, Counted};
pub use local::{LocalComm, LocalWorld};
#[cfg(feature = "mpi")]
pub use mpi_comm::MpiComm;
#[cfg(feature = "ucx")]
pub use ucx_comm::UcxComm;

/// The largest payload the MPI transport sends inline with its header, in one MPI message.
/// A larger one waits for the receiver's go-ahead first (a round trip), then goes in pieces
/// (`mpi_comm`'s wire format); the sizing model counts that round trip.
pub const MPI_INLINE_BYTES: usize = 64 * 1024;

/// A message tag. Tags at or above [`RESERVED_TAG_BASE`] belong to the transport itself.
pub type Tag = u32;

/// First tag reserved for collectives and the abort notice.
pub const RESERVED_TAG_BASE: Tag = 0xFFFF_0000;
/// Tag of the abort notice a failing rank sends to all others.
pub const ABORT_TAG: Tag = 0xFFFF_FFFF;
const TAG_BCAST: Tag = RESERVED_TAG_BASE + 1;
const TAG_GATHER: Tag = RESERVED_TAG_BASE + 2;
const TAG_BARRIER: Tag = RESERVED_TAG_BASE + 3;

/// Default time a receive waits for its peer before it reports [`TransportError::Timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Errors of the transports.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Another rank failed and told everyone why.
    #[error("rank {rank} failed: {message}")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// Its error message.
        message: String,
    },
    /// A receive waited longer than the timeout.
    #[error("rank {me} waited {secs} s for a message from rank {peer} (tag {tag:#x}) and gave up; that rank is probably gone")]
    Timeout {
        /// The waiting rank.
        me: usize,
        /// The rank it waited for.
        peer: usize,
        /// The tag it waited for.
        tag: Tag,
        /// How long it waited.
        secs: u64,
    },
    /// A rank number outside the world.
    #[error("rank {rank} is outside the world of {size} ranks")]
    InvalidRank {
        /// The rank asked for.
        rank: usize,
        /// The world size.
        size: usize,
    },
    /// A tag from the reserved range was used by a caller.
    #[error("tag {0:#x} is reserved for the transport")]
    ReservedTag(Tag),
    /// A message whose length does not fit what the receiver expected.
    #[error("message from rank {peer} has {got} bytes, expected {expected}")]
    Length {
        /// Sender.
        peer: usize,
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// The peer's side of the channel is gone (its thread or process ended).
    #[error("rank {peer} disconnected")]
    Disconnected {
        /// The rank that is gone.
        peer: usize,
    },
    /// An error reported by the MPI library.
    #[error("MPI: {0}")]
    Mpi(String),
    /// An error reported by the UCX library.
    #[error("UCX: {0}")]
    Ucx(String),
}

/// Result type of the transports.
pub type Result<T> = std::result::Result<T, TransportError>;

/// How long a failing rank looks for a peer's earlier failure notice before it announces
/// its own error: long enough for a notice already sent to arrive, short enough not to
/// delay the job's end.
pub const PEER_NOTICE_WAIT: Duration = Duration::from_millis(200);

/// The collective step of a rank that failed with its own error `own`, shared by every
/// client (the command line, the C library): when a peer's failure notice arrives within
/// [`PEER_NOTICE_WAIT`], our error is likely its consequence (a file the peer removed),
/// and the peer's `(rank, message)` is returned as the cause every rank should report;
/// otherwise `own()` is announced to every rank ([`Comm::abort`]) and `None` returned.
pub fn announce_failure(comm: &dyn Comm, own: &dyn Fn() -> String) -> Option<(usize, String)> {
    match comm.peer_failure(PEER_NOTICE_WAIT) {
        Some(cause) => Some(cause),
        None => {
            comm.abort(&own());
            None
        }
    }
}

/// Moves bytes between the ranks of one job.
///
/// Implementations are not required to be `Send`: the MPI transport stays on the thread
/// that initialized MPI, and the type system keeps it there.
pub trait Comm {
    /// This rank's number, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Short name of the transport, for reports (`local`, `mpi`, ...).
    fn name(&self) -> &'static str;
    /// Sends `data` to `dest` with `tag`. Returns once the buffer may be reused.
    fn send_raw(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()>;
    /// Receives the next message from `src` with `tag`, watching for abort notices.
    fn recv_raw(&self, src: usize, tag: Tag) -> Result<Vec<u8>>;
    /// Tells every other rank that this rank failed with `message`. Best effort, never blocks
    /// for long.
    fn abort(&self, message: &str);
    /// Sets how long a receive waits before it gives up.
    fn set_timeout(&mut self, timeout: Duration);
    /// Waits up to `wait` for another rank's abort notice and returns it if one came.
    /// A rank whose own error may be a consequence of a peer's failure (a file the peer
    /// removed, say) asks this first, so that every rank reports the cause.
    fn peer_failure(&self, wait: Duration) -> Option<(usize, String)>;
    /// The version text of the communication library under the transport (the MPI
    /// library's, for MPI and for UCX started by MPI), for run reports; `None` for the
    /// local transport.
    fn library(&self) -> Option<String> {
        None
    }
    /// The concrete transport, for callers that need its own methods (for example
    /// [`MpiComm::exit_after_failure`](crate::MpiComm)).
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;

    /// Sends `data` to `dest`; `tag` must be below [`RESERVED_TAG_BASE`].
    fn send_bytes(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        check_user_tag(tag)?;
        self.check_rank(dest)?;
        self.send_raw(dest, tag, data)
    }

    /// Receives a message from `src` with `tag` (below [`RESERVED_TAG_BASE`]).
    fn recv_bytes(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        check_user_tag(tag)?;
        self.check_rank(src)?;
        self.recv_raw(src, tag)
    }

    /// Sends a slice of f64.
    fn send_f64(&self, dest: usize, tag: Tag, data: &[f64]) -> Result<()> {
        self.send_bytes(dest, tag, bytemuck::cast_slice(data))
    }

    /// Receives a vector of f64.
    fn recv_f64(&self, src: usize, tag: Tag) -> Result<Vec<f64>> {
        let bytes = self.recv_bytes(src, tag)?;
        bytes_to_f64(src, &bytes)
    }

    /// Errors unless `rank` is inside the world.
    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank < self.size() {
            Ok(())
        } else {
            Err(TransportError::InvalidRank {
                rank,
                size: self.size(),
            })
        }
    }

    /// Blocks until every rank has entered the barrier.
    fn barrier(&self) -> Result<()> {
        let _ = self.gather_bytes(0, &[])?;
        let mut token = Vec::new();
        self.broadcast_tagged(0, &mut token, TAG_BARRIER)
    }

    /// Replaces `data` on every rank with the root's `data`.
    fn broadcast_bytes(&self, root: usize, data: &mut Vec<u8>) -> Result<()> {
        self.broadcast_tagged(root, data, TAG_BCAST)
    }

    /// Binomial-tree broadcast with a given tag (used by the default collectives).
    fn broadcast_tagged(&self, root: usize, data: &mut Vec<u8>, tag: Tag) -> Result<()> {
        self.check_rank(root)?;
        let size = self.size();
        let rel = (self.rank() + size - root) % size;
        // Receive from the parent (the rank that differs in the lowest set bit).
        let mut mask = 1usize;
        while mask < size {
            if rel & mask != 0 {
                let parent = (rel - mask + root) % size;
                *data = self.recv_raw(parent, tag)?;
                break;
            }
            mask <<= 1;
        }
        // Forward to children.
        mask >>= 1;
        while mask > 0 {
            if rel + mask < size {
                let child = (rel + mask + root) % size;
                self.send_raw(child, tag, data)?;
            }
            mask >>= 1;
        }
        Ok(())
    }

    /// Broadcasts a vector of f64 from `root`.
    fn broadcast_f64(&self, root: usize, data: &mut Vec<f64>) -> Result<()> {
        let mut bytes = if self.rank() == root {
            bytemuck::cast_slice(data.as_slice()).to_vec()
        } else {
            Vec::new()
        };
        self.broadcast_bytes(root, &mut bytes)?;
        if self.rank() != root {
            *data = bytes_to_f64(root, &bytes)?;
        }
        Ok(())
    }

    /// Gathers every rank's bytes at `root`, in rank order. Other ranks get `None`.
    fn gather_bytes(&self, root: usize, data: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        self.check_rank(root)?;
        if self.rank() == root {
            let mut all = Vec::with_capacity(self.size());
            for r in 0..self.size() {
                if r == root {
                    all.push(data.to_vec());
                } else {
                    all.push(self.recv_raw(r, TAG_GATHER)?);
                }
            }
            Ok(Some(all))
        } else {
            self.send_raw(root, TAG_GATHER, data)?;
            Ok(None)
        }
    }

    /// Every rank gets every rank's bytes, in rank order.
    fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let gathered = self.gather_bytes(0, data)?;
        let mut packed = match gathered {
            Some(all) => pack(&all),
            None => Vec::new(),
        };
        self.broadcast_bytes(0, &mut packed)?;
        unpack(&packed).ok_or(TransportError::Length {
            peer: 0,
            got: packed.len(),
            expected: 0,
        })
    }

    /// Element-wise sum over all ranks, added in rank order so the result is the same
    /// bits on every rank and in every run.
    fn allreduce_sum_f64(&self, data: &mut [f64]) -> Result<()> {
        let gathered = self.gather_bytes(0, bytemuck::cast_slice(data))?;
        let mut sum = Vec::new();
        if let Some(all) = gathered {
            sum = vec![0.0f64; data.len()];
            for (r, bytes) in all.iter().enumerate() {
                let part = bytes_to_f64(r, bytes)?;
                if part.len() != sum.len() {
                    return Err(TransportError::Length {
                        peer: r,
                        got: bytes.len(),
                        expected: data.len() * 8,
                    });
                }
                for (s, p) in sum.iter_mut().zip(&part) {
                    *s += p;
                }
            }
        }
        self.broadcast_f64(0, &mut sum)?;
        data.copy_from_slice(&sum);
        Ok(())
    }
}

fn check_user_tag(tag: Tag) -> Result<()> {
    if tag >= RESERVED_TAG_BASE {
        Err(TransportError::ReservedTag(tag))
    } else {
        Ok(())
    }
}

/// Reinterprets received bytes as f64 values (copying, since the buffer may be unaligned).
pub fn bytes_to_f64(peer: usize, bytes: &[u8]) -> Result<Vec<f64>> {
    if !bytes.len().is_multiple_of(8) {
        return Err(TransportError::Length {
            peer,
            got: bytes.len(),
            expected: bytes.len() / 8 * 8,
        });
    }
    let mut out = vec![0.0f64; bytes.len() / 8];
    bytemuck::cast_slice_mut::<f64, u8>(&mut out).copy_from_slice(bytes);
    Ok(out)
}

/// Length-prefixed concatenation of several byte strings.
fn pack(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + parts.iter().map(|p| p.len() + 8).sum::<usize>());
    out.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

fn unpack(mut bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut take = |n: usize| -> Option<&[u8]> {
        if bytes.len() < n {
            return None;
        }
        let (head, tail) = bytes.split_at(n);
        bytes = tail;
        Some(head)
    };
    let count = u64::from_le_bytes(take(8)?.try_into().ok()?) as usize;
    let mut parts = Vec::with_capacity(count.min(1 << 20));
    for _ in 0..count {
        let len = u64::from_le_bytes(take(8)?.try_into().ok()?) as usize;
        parts.push(take(len)?.to_vec());
    }
    Some(parts)
}

/// Splits a message of `len` elements into pieces of at most `max` elements: MPI counts
/// are C ints, so no single MPI call may carry more than `i32::MAX` elements.
pub fn split_counts(len: usize, max: usize) -> Vec<(usize, usize)> {
    assert!(max > 0, "split size must be positive");
    let mut out = Vec::with_capacity(len / max + 1);
    let mut start = 0;
    while start < len {
        let end = (start + max).min(len);
        out.push((start, end));
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_round_trips() {
        let parts = vec![vec![], vec![1, 2, 3], vec![9; 17]];
        assert_eq!(unpack(&pack(&parts)).unwrap(), parts);
        assert!(unpack(&[1, 2, 3]).is_none());
    }

    #[test]
    fn split_counts_covers_everything_without_overlap() {
        for &(len, max) in &[(0usize, 5usize), (5, 5), (6, 5), (11, 5), (1, 1), (100, 7)] {
            let pieces = split_counts(len, max);
            let mut next = 0;
            for &(s, e) in &pieces {
                assert_eq!(s, next);
                assert!(e > s && e - s <= max);
                next = e;
            }
            assert_eq!(next, len);
        }
        let big = (i32::MAX as usize) * 2 + 3;
        let pieces = split_counts(big, i32::MAX as usize);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces[2], (2 * i32::MAX as usize, big));
    }
}
