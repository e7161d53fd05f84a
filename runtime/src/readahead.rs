//! Read-ahead: an actor decodes its next panels while its workers multiply the current
//! ones.
//!
//! # Design
//!
//! One [`ReadAhead`] serves one actor for one pass. It knows the actor's panels in the
//! order the actor's workers take them (the order of the actor's job queue), and runs
//! reader threads, pinned to the actor's cores, that claim panels in that order and decode
//! each into a buffer from a fixed pool. A worker [`ReadAhead::take`]s its panel, waiting
//! if it is still being decoded, and the buffer goes back to the pool when the
//! [`PanelLease`] drops. Memory is bounded by the pool: `buffers` decoded panels at most,
//! counted in the actor's memory plan.
//!
//! Why this cannot deadlock: readers claim panels in queue order and claim only with a
//! buffer in hand, and workers take panels in the same order, holding at most one lease
//! each while they compute (never while they wait). The earliest panel not yet taken is
//! therefore always either decoded, being decoded, or next to be claimed with the next
//! buffer that a finishing worker returns.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::panel::{PanelBuffer, ReadStats};
use crate::source::SourceError;
use crate::topology::bind_current_thread;

/// Decodes one panel (its global rows) into a buffer.
pub type ReadFn =
    dyn Fn(Range<u64>, &mut PanelBuffer) -> Result<ReadStats, SourceError> + Send + Sync;

struct Done {
    result: Result<ReadStats, SourceError>,
    buffer: PanelBuffer,
    seconds: f64,
}

#[derive(Default)]
struct State {
    next: usize,
    free: Vec<PanelBuffer>,
    ready: HashMap<usize, Done>,
    stop: bool,
}

struct Shared {
    order: Vec<(usize, Range<u64>)>,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent state (every update is a
        // single insert/push), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The read-ahead of one actor for one pass (see the module documentation).
pub struct ReadAhead {
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
}

/// A decoded panel on loan from a [`ReadAhead`]; its buffer returns to the pool on drop.
pub struct PanelLease {
    buffer: Option<PanelBuffer>,
    shared: Arc<Shared>,
    /// What decoding it cost.
    pub stats: ReadStats,
    /// Seconds the reader spent decoding it.
    pub seconds: f64,
}

impl std::ops::Deref for PanelLease {
    type Target = PanelBuffer;
    fn deref(&self) -> &PanelBuffer {
        self.buffer
            .as_ref()
            .expect("a lease holds its buffer until dropped")
    }
}

impl Drop for PanelLease {
    fn drop(&mut self) {
        if let Some(b) = self.buffer.take() {
            self.shared.lock().free.push(b);
            self.shared.changed.notify_all();
        }
    }
}

impl ReadAhead {
    /// Starts `readers` threads (pinned to `cores` when given) decoding the panels of
    /// `order` (global panel index and rows, in the order the actor's workers take them)
    /// into at most `buffers` buffers.
    pub fn start(
        order: Vec<(usize, Range<u64>)>,
        buffers: usize,
        readers: usize,
        cores: Option<Vec<usize>>,
        read: Arc<ReadFn>,
    ) -> std::io::Result<ReadAhead> {
        let shared = Arc::new(Shared {
            order,
            state: Mutex::new(State {
                free: (0..buffers.max(1))
                    .map(|_| PanelBuffer::default())
                    .collect(),
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        let readers = readers.max(1).min(shared.order.len().max(1));
        let mut handles = Vec::with_capacity(readers);
        for t in 0..readers {
            let shared = Arc::clone(&shared);
            let read = Arc::clone(&read);
            let cores = cores.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("readahead-{t}"))
                    .spawn(move || {
                        if let Some(c) = cores.filter(|c| !c.is_empty()) {
                            // Unpinned reading is still correct; the actor's own pin
                            // report already tells the user when binding fails.
                            let _ = bind_current_thread(&c);
                        }
                        reader(&shared, read.as_ref());
                    })?,
            );
        }
        Ok(ReadAhead {
            shared,
            readers: handles,
        })
    }

    /// Waits for panel `panel` and lends it. Each panel is taken at most once.
    pub fn take(&self, panel: usize) -> Result<PanelLease, SourceError> {
        let mut st = self.shared.lock();
        loop {
            if let Some(done) = st.ready.remove(&panel) {
                drop(st);
                let lease = PanelLease {
                    buffer: Some(done.buffer),
                    shared: Arc::clone(&self.shared),
                    stats: done.result.as_ref().copied().unwrap_or_default(),
                    seconds: done.seconds,
                };
                return done.result.map(|_| lease);
            }
            st = self
                .shared
                .changed
                .wait(st)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn reader(shared: &Shared, read: &ReadFn) {
    loop {
        let (i, mut buffer) = {
            let mut st = shared.lock();
            loop {
                if st.stop || st.next >= shared.order.len() {
                    return;
                }
                if let Some(b) = st.free.pop() {
                    st.next += 1;
                    break (st.next - 1, b);
                }
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (panel, rows) = shared.order[i].clone();
        let t = Instant::now();
        let result = read(rows, &mut buffer);
        let seconds = t.elapsed().as_secs_f64();
        shared.lock().ready.insert(
            panel,
            Done {
                result,
                buffer,
                seconds,
            },
        );
        shared.changed.notify_all();
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::panel::PanelValues;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn order(n: usize) -> Vec<(usize, Range<u64>)> {
        (0..n)
            .map(|p| (p, p as u64 * 10..p as u64 * 10 + 10))
            .collect()
    }

    #[test]
    fn lends_every_panel_in_order_with_a_bounded_pool() {
        let live = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (l2, p2) = (Arc::clone(&live), Arc::clone(&peak));
        let read: Arc<ReadFn> = Arc::new(move |rows: Range<u64>, b: &mut PanelBuffer| {
            let now = l2.fetch_add(1, Ordering::SeqCst) + 1;
            p2.fetch_max(now, Ordering::SeqCst);
            b.values = PanelValues::F64(vec![rows.start as f64; 4]);
            b.rows = 1;
            b.cols = 4;
            l2.fetch_sub(1, Ordering::SeqCst);
            Ok(ReadStats {
                chunks: 1,
                stored_bytes: 1,
                decoded_bytes: 32,
            })
        });
        let ra = ReadAhead::start(order(50), 3, 2, None, read).unwrap();
        for p in 0..50 {
            let lease = ra.take(p).unwrap();
            assert_eq!(lease.values, PanelValues::F64(vec![p as f64 * 10.0; 4]));
            assert_eq!(lease.stats.chunks, 1);
        }
        assert!(peak.load(Ordering::SeqCst) <= 2);
    }

    #[test]
    fn concurrent_takers_never_deadlock_with_one_buffer() {
        let read: Arc<ReadFn> = Arc::new(|rows: Range<u64>, b: &mut PanelBuffer| {
            b.values = PanelValues::I8(vec![(rows.start / 10) as i8; 2]);
            Ok(ReadStats::default())
        });
        let ra = Arc::new(ReadAhead::start(order(40), 1, 2, None, read).unwrap());
        let next = Arc::new(Mutex::new(0usize));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let ra = Arc::clone(&ra);
                let next = Arc::clone(&next);
                std::thread::spawn(move || loop {
                    // Take jobs in queue order, as an actor's workers do.
                    let p = {
                        let mut n = next.lock().unwrap();
                        if *n == 40 {
                            return;
                        }
                        *n += 1;
                        *n - 1
                    };
                    let lease = ra.take(p).unwrap();
                    assert_eq!(lease.values, PanelValues::I8(vec![p as i8; 2]));
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
    }

    #[test]
    fn a_failed_read_reaches_its_taker_and_the_rest_still_arrive() {
        let read: Arc<ReadFn> = Arc::new(|rows: Range<u64>, _b: &mut PanelBuffer| {
            if rows.start == 20 {
                Err(SourceError::OutOfBounds {
                    rows,
                    cols: 0,
                    shape: (0, 0),
                    what: "test".into(),
                })
            } else {
                Ok(ReadStats::default())
            }
        });
        let ra = ReadAhead::start(order(5), 2, 1, None, read).unwrap();
        assert!(ra.take(0).is_ok());
        assert!(ra.take(1).is_ok());
        assert!(ra.take(2).is_err());
        assert!(ra.take(3).is_ok());
        drop(ra.take(4));
    }

    #[test]
    fn dropping_stops_readers_with_panels_untaken() {
        let read: Arc<ReadFn> =
            Arc::new(|_r: Range<u64>, _b: &mut PanelBuffer| Ok(ReadStats::default()));
        let ra = ReadAhead::start(order(100), 2, 2, None, read).unwrap();
        drop(ra.take(0));
        drop(ra);
    }
}
