//! Counting what a rank's transport carries.
//!
//! Every message of every transport passes through [`Comm::send_raw`] and
//! [`Comm::recv_raw`] (the collectives are built on them), so a wrapper around those two
//! sees all of a rank's traffic: the runtime wraps its transport in [`Counted`] and the
//! drivers report, per phase, what was sent and received and how long the receives waited.

use std::cell::Cell;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{Comm, Result, Tag};

/// What one rank's transport carried: messages and bytes each way, and the seconds its
/// receives spent waiting for them (time blocked on peers, which includes their compute).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommCounts {
    /// Messages sent (to other ranks or this one).
    pub messages_sent: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Messages received.
    pub messages_received: u64,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// Seconds spent inside receives.
    pub wait_seconds: f64,
}

impl CommCounts {
    /// What was carried since `earlier` (an earlier reading of the same counts).
    pub fn since(&self, earlier: &CommCounts) -> CommCounts {
        CommCounts {
            messages_sent: self.messages_sent.saturating_sub(earlier.messages_sent),
            bytes_sent: self.bytes_sent.saturating_sub(earlier.bytes_sent),
            messages_received: self
                .messages_received
                .saturating_sub(earlier.messages_received),
            bytes_received: self.bytes_received.saturating_sub(earlier.bytes_received),
            wait_seconds: (self.wait_seconds - earlier.wait_seconds).max(0.0),
        }
    }

    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &CommCounts) {
        self.messages_sent += other.messages_sent;
        self.bytes_sent += other.bytes_sent;
        self.messages_received += other.messages_received;
        self.bytes_received += other.bytes_received;
        self.wait_seconds += other.wait_seconds;
    }

    /// Whether nothing was carried.
    pub fn is_empty(&self) -> bool {
        self.messages_sent == 0 && self.messages_received == 0
    }
}

/// A transport that counts what passes through it ([`CommCounts`]); everything else is
/// the wrapped transport's.
pub struct Counted {
    inner: Box<dyn Comm>,
    counts: Cell<CommCounts>,
}

impl Counted {
    /// Wraps `inner`, counting from zero.
    pub fn new(inner: Box<dyn Comm>) -> Counted {
        Counted {
            inner,
            counts: Cell::new(CommCounts::default()),
        }
    }

    /// What was carried so far.
    pub fn counts(&self) -> CommCounts {
        self.counts.get()
    }

    /// The wrapped transport.
    pub fn into_inner(self) -> Box<dyn Comm> {
        self.inner
    }

    fn update(&self, f: impl FnOnce(&mut CommCounts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }
}

impl Comm for Counted {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn library(&self) -> Option<String> {
        self.inner.library()
    }

    fn send_raw(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.inner.send_raw(dest, tag, data)?;
        self.update(|c| {
            c.messages_sent += 1;
            c.bytes_sent += data.len() as u64;
        });
        Ok(())
    }

    fn recv_raw(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        let t = Instant::now();
        let got = self.inner.recv_raw(src, tag);
        let waited = t.elapsed().as_secs_f64();
        self.update(|c| {
            c.wait_seconds += waited;
            if let Ok(data) = &got {
                c.messages_received += 1;
                c.bytes_received += data.len() as u64;
            }
        });
        got
    }

    fn abort(&self, message: &str) {
        self.inner.abort(message)
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }

    fn peer_failure(&self, wait: Duration) -> Option<(usize, String)> {
        self.inner.peer_failure(wait)
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self.inner.into_any()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalWorld;

    #[test]
    fn counts_every_message_and_byte_of_the_collectives_too() {
        let comms = LocalWorld::create(3);
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let c = Counted::new(Box::new(c));
                    let me = c.rank();
                    if me == 0 {
                        c.send_bytes(1, 7, &[1, 2, 3, 4, 5]).unwrap();
                    } else if me == 1 {
                        assert_eq!(c.recv_bytes(0, 7).unwrap(), vec![1, 2, 3, 4, 5]);
                    }
                    let before = c.counts();
                    let mut v = vec![me as f64; 4];
                    c.allreduce_sum_f64(&mut v).unwrap();
                    assert_eq!(v, vec![3.0; 4]);
                    (me, before, c.counts())
                })
            })
            .collect();
        let mut sent = 0;
        let mut received = 0;
        for h in handles {
            let (me, before, after) = h.join().unwrap();
            match me {
                0 => assert_eq!((before.messages_sent, before.bytes_sent), (1, 5)),
                1 => assert_eq!((before.messages_received, before.bytes_received), (1, 5)),
                _ => assert!(before.is_empty()),
            }
            let d = after.since(&before);
            assert!(
                d.messages_sent + d.messages_received > 0,
                "rank {me}: {d:?}"
            );
            sent += after.bytes_sent;
            received += after.bytes_received;
        }
        // What all ranks sent, all ranks received.
        assert_eq!(sent, received);
    }
}
