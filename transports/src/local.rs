//! `Local`: P ranks as threads of one process, for the embedded default and fast tests.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::{Comm, Result, Tag, TransportError, ABORT_TAG, DEFAULT_TIMEOUT};

struct Envelope {
    src: usize,
    tag: Tag,
    data: Vec<u8>,
}

#[derive(Default)]
struct Mailbox {
    queue: Mutex<Vec<Envelope>>,
    ready: Condvar,
}

/// The shared state of a group of [`LocalComm`]s.
pub struct LocalWorld;

impl LocalWorld {
    /// Creates `size` connected ranks; hand one to each thread.
    ///
    /// # Panics
    /// If `size` is zero.
    pub fn create(size: usize) -> Vec<LocalComm> {
        assert!(size > 0, "a world needs at least one rank");
        let boxes: Arc<Vec<Mailbox>> = Arc::new((0..size).map(|_| Mailbox::default()).collect());
        (0..size)
            .map(|rank| LocalComm {
                rank,
                boxes: Arc::clone(&boxes),
                timeout: DEFAULT_TIMEOUT,
            })
            .collect()
    }
}

/// One rank of a [`LocalWorld`].
pub struct LocalComm {
    rank: usize,
    boxes: Arc<Vec<Mailbox>>,
    timeout: Duration,
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.boxes.len()
    }

    fn name(&self) -> &'static str {
        "local"
    }

    fn send_raw(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.check_rank(dest)?;
        let mailbox = &self.boxes[dest];
        mailbox
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Envelope {
                src: self.rank,
                tag,
                data: data.to_vec(),
            });
        mailbox.ready.notify_all();
        Ok(())
    }

    fn recv_raw(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        self.check_rank(src)?;
        let mailbox = &self.boxes[self.rank];
        let deadline = Instant::now() + self.timeout;
        let mut queue = mailbox.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(i) = queue.iter().position(|e| e.tag == ABORT_TAG) {
                let e = &queue[i];
                return Err(TransportError::PeerFailed {
                    rank: e.src,
                    message: String::from_utf8_lossy(&e.data).into_owned(),
                });
            }
            if let Some(i) = queue.iter().position(|e| e.src == src && e.tag == tag) {
                // Messages between one pair with one tag arrive in order, as in MPI.
                return Ok(queue.remove(i).data);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TransportError::Timeout {
                    me: self.rank,
                    peer: src,
                    tag,
                    secs: self.timeout.as_secs(),
                });
            }
            queue = mailbox
                .ready
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn abort(&self, message: &str) {
        for dest in 0..self.size() {
            if dest != self.rank {
                let _ = self.send_raw(dest, ABORT_TAG, message.as_bytes());
            }
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn peer_failure(&self, wait: Duration) -> Option<(usize, String)> {
        let mailbox = &self.boxes[self.rank];
        let deadline = Instant::now() + wait;
        let mut queue = mailbox.queue.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(e) = queue.iter().find(|e| e.tag == ABORT_TAG) {
                return Some((e.src, String::from_utf8_lossy(&e.data).into_owned()));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            queue = mailbox
                .ready
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn run<F, T>(p: usize, f: F) -> Vec<T>
    where
        F: Fn(LocalComm) -> T + Send + Sync + Copy + 'static,
        T: Send + 'static,
    {
        let handles: Vec<_> = LocalWorld::create(p)
            .into_iter()
            .map(|c| thread::spawn(move || f(c)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn collectives_agree_for_several_sizes() {
        for p in 1..=5 {
            let out = run(p, move |c| {
                let mut v = vec![c.rank() as f64 + 0.5, 1.0];
                c.allreduce_sum_f64(&mut v).unwrap();
                let mut b = if c.rank() == p.min(3) - 1 {
                    b"hello".to_vec()
                } else {
                    vec![]
                };
                c.broadcast_bytes(p.min(3) - 1, &mut b).unwrap();
                let all = c.allgather_bytes(&[c.rank() as u8]).unwrap();
                c.barrier().unwrap();
                (v, b, all)
            });
            let expect: f64 = (0..p).map(|r| r as f64 + 0.5).sum();
            for (v, b, all) in out {
                assert_eq!(v, vec![expect, p as f64]);
                assert_eq!(b, b"hello");
                assert_eq!(all, (0..p).map(|r| vec![r as u8]).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn abort_reaches_a_waiting_peer() {
        let out = run(3, |c| {
            if c.rank() == 2 {
                c.abort("bad chunk");
                None
            } else {
                Some(c.recv_bytes(2, 7).unwrap_err().to_string())
            }
        });
        assert_eq!(out[0].as_deref(), Some("rank 2 failed: bad chunk"));
        assert_eq!(out[1].as_deref(), Some("rank 2 failed: bad chunk"));
    }

    #[test]
    fn peer_failure_sees_a_notice_without_waiting_for_a_message() {
        let mut world = LocalWorld::create(2);
        let b = world.pop().unwrap();
        let a = world.pop().unwrap();
        assert_eq!(a.peer_failure(Duration::from_millis(10)), None);
        b.abort("disk full");
        assert_eq!(
            a.peer_failure(Duration::ZERO),
            Some((1, "disk full".into()))
        );
    }

    #[test]
    fn receive_times_out_instead_of_hanging() {
        let mut c = LocalWorld::create(2).remove(0);
        c.set_timeout(Duration::from_millis(50));
        let err = c.recv_bytes(1, 3).unwrap_err();
        assert!(
            matches!(err, TransportError::Timeout { peer: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn reserved_tags_are_refused() {
        let c = LocalWorld::create(1).remove(0);
        assert!(matches!(
            c.send_bytes(0, ABORT_TAG, &[]),
            Err(TransportError::ReservedTag(_))
        ));
    }
}
