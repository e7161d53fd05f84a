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
//!
//! A source with latency (an object store) is also told, through [`FetchAhead`], which
//! panels a reader will read after the one it claims, so that their chunk objects are
//! requested before their reads start: otherwise a reader's requests stop at its panel's
//! edge, and a panel of one chunk has one request in flight (a read through 20 ms of
//! added latency kept 47–52 % of its throughput that way, 95–97 % fetching ahead;
//! benches/RESULTS.md, "Zarr from an S3 server"). The source bounds what it holds by the
//! encodings the buffers' plan counts, and drops what a pass did not take when it ends.
//!
//! The unit read may be a whole panel or a segment of one (a few hundred rows, when the
//! source decodes row ranges): the read-ahead only sees keys and rows. Buffers and each
//! reader's scratch come from the actor's [`BufferPool`] and go back to it when the pass
//! ends, so later passes reuse memory the process has already touched.
//!
//! # Why decoded rows go through memory
//!
//! Every decoded byte is written to a buffer here and read back by the kernels. The
//! alternative was built and measured: each worker decoded its own panel a Blosc block
//! (512 KB) at a time into a buffer of one block plus one row, and multiplied the block's
//! whole rows while they were in cache, with results bit for bit those of the tile loop.
//! On two Ice Lake cores `rsvd --zarr` at `q = 0` (200,000 × 5,000 float32, lz4 +
//! bitshuffle) took 2.46/2.50/2.46/2.48 s against 2.50/2.76/2.51/2.52 s this way
//! (interleaved), with the same CPU time (user + system 4.3–4.8 s): both passes are bound
//! by the decoder's and the kernels' instructions, not by the decoded band's trip through
//! memory, so the simpler design stayed. Where many cores share a memory bus the trip may
//! matter; measure there before reviving it.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::SourceError;
use crate::panel::{PanelBuffer, PanelValues, ReadScratch, ReadStats, StoredPanels};
use rankwise_exec::bind_current_thread;

/// Decodes one panel (its global rows) into a buffer.
pub type ReadFn =
    dyn Fn(Range<u64>, &mut PanelBuffer) -> Result<ReadStats, SourceError> + Send + Sync;

/// What a read-ahead tells a source with latency (an object store) besides its reads:
/// the panels its readers will read next, so that their objects are fetched across panel
/// edges ([`StoredPanels::fetch_ahead`]), and that the pass is over.
pub trait FetchAhead: Send + Sync {
    /// The rows of the panels after the one a reader has just claimed, in claim order.
    fn fetch_ahead(&self, owner: u64, buffers: usize, upcoming: &[Range<u64>]);
    /// The read-ahead `owner` has ended: what it fetched and no read took is dropped.
    fn drop_fetched(&self, owner: u64);
}

impl<S: StoredPanels + ?Sized> FetchAhead for Arc<S> {
    fn fetch_ahead(&self, owner: u64, buffers: usize, upcoming: &[Range<u64>]) {
        StoredPanels::fetch_ahead(self.as_ref(), owner, buffers, upcoming);
    }

    fn drop_fetched(&self, owner: u64) {
        StoredPanels::drop_fetched(self.as_ref(), owner);
    }
}

/// A read-ahead's fetching ahead: the source, this read-ahead's name for it, and its
/// buffers.
struct Ahead {
    source: Arc<dyn FetchAhead>,
    owner: u64,
    buffers: usize,
}

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
    /// The rows of `order`'s panels, for [`FetchAhead`].
    rows: Vec<Range<u64>>,
    ahead: Option<Ahead>,
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
    pool: Arc<BufferPool>,
}

/// Buffers and reader scratch an actor keeps from one pass to the next. Memory that a
/// process has already touched is cheap to reuse, while fresh memory costs a page fault
/// per page and, on a machine whose free memory is in the page cache, a reclaim: reusing
/// the pool keeps each pass from paying for its buffers again.
#[derive(Default)]
pub struct BufferPool {
    buffers: Mutex<Vec<PanelBuffer>>,
    scratch: Mutex<Vec<ReadScratch>>,
}

impl BufferPool {
    fn take_buffers(&self, n: usize) -> Vec<PanelBuffer> {
        let mut b = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let keep = b.len().saturating_sub(n);
        let mut out = b.split_off(keep);
        out.resize_with(n, PanelBuffer::default);
        out
    }

    fn scratch(&self) -> ReadScratch {
        let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        s.pop().unwrap_or_default()
    }

    fn give_scratch(&self, s: ReadScratch) {
        self.scratch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s);
    }
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

impl PanelLease {
    /// Takes the decoded values out of the lease, to keep (a panel the memory plan made
    /// resident). The buffer goes back to the pool empty, and the next panel decoded into
    /// it allocates anew: the values are not copied.
    pub fn take_values(mut self) -> PanelBuffer {
        let b = self
            .buffer
            .as_mut()
            .expect("a lease holds its buffer until dropped");
        let t = b.values.element_type();
        PanelBuffer {
            values: std::mem::replace(&mut b.values, PanelValues::empty(t)),
            rows: b.rows,
            cols: b.cols,
            scratch: ReadScratch::default(),
        }
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
    /// into at most `buffers` buffers, taken from `pool` and given back when the
    /// read-ahead is dropped.
    pub fn start(
        order: Vec<(usize, Range<u64>)>,
        buffers: usize,
        readers: usize,
        cores: Option<Vec<usize>>,
        read: Arc<ReadFn>,
        ahead: Option<Arc<dyn FetchAhead>>,
        pool: Arc<BufferPool>,
    ) -> std::io::Result<ReadAhead> {
        static OWNERS: AtomicU64 = AtomicU64::new(0);
        let buffers = buffers.max(1);
        let shared = Arc::new(Shared {
            rows: order.iter().map(|(_, r)| r.clone()).collect(),
            ahead: ahead.map(|source| Ahead {
                source,
                owner: OWNERS.fetch_add(1, Ordering::Relaxed),
                buffers,
            }),
            order,
            state: Mutex::new(State {
                free: pool.take_buffers(buffers),
                ..State::default()
            }),
            changed: Condvar::new(),
        });
        // A reader decodes only into a free buffer, so readers beyond the buffers would
        // add nothing but their own chunk scratch, which the plan counts per buffer.
        let readers = readers
            .max(1)
            .min(buffers.max(1))
            .min(shared.order.len().max(1));
        let mut handles = Vec::with_capacity(readers);
        for t in 0..readers {
            let shared = Arc::clone(&shared);
            let read = Arc::clone(&read);
            let cores = cores.clone();
            let pool = Arc::clone(&pool);
            handles.push(
                std::thread::Builder::new()
                    .name(format!("readahead-{t}"))
                    .spawn(move || {
                        if let Some(c) = cores.filter(|c| !c.is_empty()) {
                            // Unpinned reading is still correct; the actor's own pin
                            // report already tells the user when binding fails.
                            let _ = bind_current_thread(&c);
                        }
                        let mut scratch = pool.scratch();
                        reader(&shared, read.as_ref(), &mut scratch);
                        pool.give_scratch(scratch);
                    })?,
            );
        }
        Ok(ReadAhead {
            shared,
            readers: handles,
            pool,
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

/// Decodes panels until none is left; `scratch` is this reader's, lent to each buffer it
/// decodes into (so scratch is held per reader, not per buffer).
fn reader(shared: &Shared, read: &ReadFn, scratch: &mut ReadScratch) {
    loop {
        let (i, mut buffer) = {
            let mut st = shared.lock();
            loop {
                if st.stop || st.next >= shared.order.len() {
                    return;
                }
                if let Some(b) = st.free.pop() {
                    st.next += 1;
                    // Told while the claim is held: the panels after this one are all
                    // unclaimed, so none of their objects has been taken by a read yet
                    // (one taken would be fetched again and held to the pass's end).
                    if let Some(a) = &shared.ahead {
                        a.source
                            .fetch_ahead(a.owner, a.buffers, &shared.rows[st.next..]);
                    }
                    break (st.next - 1, b);
                }
                st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (panel, rows) = shared.order[i].clone();
        let t = Instant::now();
        std::mem::swap(&mut buffer.scratch, scratch);
        // A panic in a decoder (zarrs panicked on a shard index whose offset overflows)
        // must become this panel's error: a reader that died would leave the worker
        // waiting for the panel forever.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read(rows.clone(), &mut buffer)
        }))
        .unwrap_or_else(|payload| {
            Err(SourceError::Panicked {
                rows: rows.clone(),
                message: rankwise_exec::panic_message(payload.as_ref()),
            })
        });
        std::mem::swap(&mut buffer.scratch, scratch);
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
        if let Some(a) = &self.shared.ahead {
            a.source.drop_fetched(a.owner);
        }
        // Buffers still on loan are dropped with their leases; the rest go back.
        let mut st = self.shared.lock();
        let mut back = std::mem::take(&mut st.free);
        back.extend(st.ready.drain().map(|(_, d)| d.buffer));
        drop(st);
        self.pool
            .buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(back);
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
        let ra = ReadAhead::start(order(50), 3, 2, None, read, None, Arc::default()).unwrap();
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
        let ra =
            Arc::new(ReadAhead::start(order(40), 1, 2, None, read, None, Arc::default()).unwrap());
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
        let ra = ReadAhead::start(order(5), 2, 1, None, read, None, Arc::default()).unwrap();
        assert!(ra.take(0).is_ok());
        assert!(ra.take(1).is_ok());
        assert!(ra.take(2).is_err());
        assert!(ra.take(3).is_ok());
        drop(ra.take(4));
    }

    /// A decoder that panics (as zarrs did on an overflowing shard-index range) fails its
    /// panel with the panic's message, and the reader goes on with the rest: the taker
    /// never waits for a panel no thread will deliver.
    #[test]
    fn a_panicking_decoder_fails_its_panel_instead_of_hanging_the_taker() {
        let read: Arc<ReadFn> = Arc::new(|rows: Range<u64>, b: &mut PanelBuffer| {
            if rows.start == 30 {
                panic!("range end index 18446744073709551606 out of range");
            }
            b.values = PanelValues::I8(vec![1; 2]);
            Ok(ReadStats::default())
        });
        for readers in [1, 3] {
            let ra = ReadAhead::start(
                order(6),
                2,
                readers,
                None,
                Arc::clone(&read),
                None,
                Arc::default(),
            )
            .unwrap();
            for p in 0..6 {
                match ra.take(p) {
                    Err(e) if p == 3 => {
                        let e = e.to_string();
                        assert!(e.contains("rows 30..40"), "{e}");
                        assert!(e.contains("panicked") && e.contains("out of range"), "{e}");
                    }
                    Ok(lease) if p != 3 => assert_eq!(lease.values, PanelValues::I8(vec![1; 2])),
                    other => panic!("panel {p}: {:?}", other.map(|l| l.stats)),
                }
            }
        }
    }

    #[test]
    fn buffers_and_reader_scratch_go_back_to_the_pool_for_the_next_pass() {
        let pool = Arc::new(BufferPool::default());
        let read: Arc<ReadFn> = Arc::new(|_rows: Range<u64>, b: &mut PanelBuffer| {
            b.values.resize(crate::panel::ElementType::F64, 1000);
            Ok(ReadStats::default())
        });
        for _pass in 0..3 {
            let ra = ReadAhead::start(
                order(6),
                2,
                1,
                None,
                Arc::clone(&read),
                None,
                Arc::clone(&pool),
            )
            .unwrap();
            for p in 0..6 {
                drop(ra.take(p).unwrap());
            }
            drop(ra);
            let buffers = pool.buffers.lock().unwrap();
            assert_eq!(buffers.len(), 2, "the pool keeps the pass's buffers");
            // A reader that never waits for the taker fills one buffer over and over and
            // leaves the other untouched (seen on a loaded machine): each is either.
            assert!(buffers.iter().all(|b| matches!(b.values.len(), 0 | 1000)));
            assert!(buffers.iter().any(|b| b.values.len() == 1000));
            assert_eq!(
                pool.scratch.lock().unwrap().len(),
                1,
                "one reader's scratch"
            );
        }
        // A kept panel takes its values and leaves the buffer behind, empty.
        let ra = ReadAhead::start(order(1), 2, 1, None, read, None, Arc::clone(&pool)).unwrap();
        let kept = ra.take(0).unwrap().take_values();
        assert_eq!(kept.values.len(), 1000);
        drop(ra);
        assert_eq!(pool.buffers.lock().unwrap().len(), 2);
    }

    /// Dropping the read-ahead with 99 panels untaken returns: its readers stop where the
    /// two buffers stopped them (panel 0, the one read into the buffer panel 0 gave back,
    /// and one more), read nothing after, and both buffers go back to the pool.
    #[test]
    fn dropping_stops_readers_with_panels_untaken() {
        let reads = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let read: Arc<ReadFn> = Arc::new(move |_r: Range<u64>, _b: &mut PanelBuffer| {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(ReadStats::default())
        });
        let pool = Arc::new(BufferPool::default());
        let ra = ReadAhead::start(order(100), 2, 2, None, read, None, Arc::clone(&pool)).unwrap();
        drop(ra.take(0).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(ra);
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("dropping the read-ahead did not return: a reader kept waiting");
        let done = reads.load(Ordering::SeqCst);
        assert!((1..=3).contains(&done), "{done} panels read with 2 buffers");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            reads.load(Ordering::SeqCst),
            done,
            "a reader ran on after the drop"
        );
        assert_eq!(
            pool.buffers.lock().unwrap().len(),
            2,
            "buffers not given back"
        );
        // Each reader takes a scratch from the pool as it starts and gives it back as it
        // ends: two, or one where the second reader started after the first had ended and
        // took that one's scratch (the drop can stop the readers before both have begun).
        let scratch = pool.scratch.lock().unwrap().len();
        assert!(
            (1..=2).contains(&scratch),
            "readers' scratch not given back: {scratch} in the pool"
        );
    }
}
