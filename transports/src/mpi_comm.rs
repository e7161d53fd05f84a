//! `Mpi`: the transport over MPI, through rsmpi.
//!
//! [`MpiComm`] moves bytes with non-blocking MPI calls and polls them, so that every wait
//! also watches for abort notices from any rank and gives up after the timeout: a failure on
//! one rank reaches every rank, and nothing hangs.
//!
//! # Threads
//!
//! MPI is initialized with `MPI_THREAD_SERIALIZED` when the library grants it (at least
//! `MPI_THREAD_FUNNELED` is required). [`MpiComm`] is neither `Send` nor `Sync`, so every MPI
//! call made through it stays on the thread that owns it — the thread that initialized MPI.
//! Worker threads (actors) never talk to MPI directly; they hand their messages to that
//! thread.
//!
//! # Delivery
//!
//! Like [`LocalComm`](crate::LocalComm), a rank takes in every message that has arrived
//! whenever it is inside any call of the transport, and keeps it until asked for it: a
//! receive matches messages by source and tag, a send never waits for the receiver to ask
//! for that particular message. Code that works on `LocalComm` therefore cannot deadlock on
//! `MpiComm` for want of buffering (for instance two ranks that each send a large message to
//! the other and then receive). A send of a large message does wait until the receiver is
//! inside some call of the transport, so the timeout must exceed the longest time a rank
//! computes without communicating — as it must for receives.
//!
//! # Wire format
//!
//! Every message of [`Comm::send_raw`] starts with a header message: the total length as a
//! little-endian `u64`, followed by the payload itself when the payload is small (at most
//! 64 KiB and within [`MpiComm::max_message_bytes`]). A larger payload is split: the
//! receiver answers the bare header with a go-ahead (the same 8 bytes, on a reserved tag) and
//! allocates the whole message; the sender then sends pieces of at most
//! [`MpiComm::max_message_bytes`] bytes (by default `i32::MAX`, the largest count one MPI
//! call can carry). A sender finishes one message before it starts the next, and MPI keeps
//! the messages of one sender in order, so the pieces that follow a header from a rank are
//! that header's. While a sender waits for the go-ahead it polls lazily; once the receiver is
//! known to be receiving, both poll without sleeping, because Open MPI moves the data of a
//! large message only while the ranks are inside MPI calls.
//!
//! # Tags
//!
//! MPI tags are C ints no larger than the library's `MPI_TAG_UB` (at least 32767; Open MPI
//! allows 2³¹−1). User tags are passed through unchanged and must be at most
//! [`MpiComm::max_user_tag`] (`MPI_TAG_UB` − 1024); the top 1024 MPI tags carry the reserved
//! tags of the collectives, the go-ahead (`MPI_TAG_UB` − 1) and the abort notice
//! (`MPI_TAG_UB`). The mapping depends only on `MPI_TAG_UB`, which is the same on every rank
//! of a job.
//!
//! All traffic runs on a duplicate of the communicator, so it never matches messages of the
//! code that hosts rankwise.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

pub use mpi;
use mpi::attribute::{AttributeKey, CommAttribute};
use mpi::environment::{Threading, Universe};
use mpi::point_to_point::Message;
use mpi::request::StaticScope;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use crate::{
    split_counts, Comm, Result, Tag, TransportError, ABORT_TAG, DEFAULT_TIMEOUT, RESERVED_TAG_BASE,
};

/// Default for [`MpiComm::max_message_bytes`]: the largest count one MPI call accepts.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// Smallest value [`MpiComm::set_max_message_bytes`] accepts.
pub const MIN_MAX_MESSAGE_BYTES: usize = 16;

/// Payloads up to this size travel inside the header message (one MPI message in all).
const INLINE_MAX: usize = crate::MPI_INLINE_BYTES;

/// Number of MPI tags at the top of the tag range that carry reserved tags.
const RESERVED_MPI_TAGS: c_int = 1024;

/// How long [`Comm::abort`] waits for its notices to leave before it returns anyway.
const ABORT_LINGER: Duration = Duration::from_secs(2);

/// Abort messages longer than this are truncated, so that the notice always goes eagerly.
const ABORT_MESSAGE_MAX: usize = 1024;

/// `MPI_TAG_UB`, a predefined attribute of `MPI_COMM_WORLD`.
#[repr(C)]
#[derive(Clone)]
struct TagUb(c_int);

impl CommAttribute for TagUb {
    fn get_key() -> AttributeKey {
        // SAFETY: MPI_TAG_UB is a predefined keyval; its value points at a C int.
        unsafe { AttributeKey::new_unchecked(mpi::ffi::MPI_TAG_UB as i32) }
    }
}

/// Maps a rankwise tag to an MPI tag for a library whose largest tag is `tag_ub`.
///
/// User tags map to themselves and must be at most `tag_ub - 1024`; reserved tag
/// `RESERVED_TAG_BASE + k` maps to `tag_ub - 1023 + k` (`k < 1022`); `tag_ub - 1` carries
/// the go-ahead of split messages ([`go_tag`]); [`ABORT_TAG`] maps to `tag_ub`. Returns
/// `None` for a tag that has no MPI tag.
fn map_tag(tag: Tag, tag_ub: c_int) -> Option<c_int> {
    let band_start = tag_ub - RESERVED_MPI_TAGS + 1;
    if tag == ABORT_TAG {
        Some(tag_ub)
    } else if tag >= RESERVED_TAG_BASE {
        let k = tag - RESERVED_TAG_BASE;
        if k < (RESERVED_MPI_TAGS - 2) as u32 {
            Some(band_start + k as c_int)
        } else {
            None
        }
    } else if tag < band_start as u32 {
        Some(tag as c_int)
    } else {
        None
    }
}

/// The rankwise tag of an MPI tag (the inverse of [`map_tag`]), for messages.
fn unmap_tag(mtag: c_int, tag_ub: c_int) -> Tag {
    let band_start = tag_ub - RESERVED_MPI_TAGS + 1;
    if mtag == tag_ub {
        ABORT_TAG
    } else if mtag >= band_start {
        RESERVED_TAG_BASE + (mtag - band_start) as Tag
    } else {
        mtag as Tag
    }
}

/// MPI tag of the go-ahead a receiver sends when it starts receiving a split message.
fn go_tag(tag_ub: c_int) -> c_int {
    tag_ub - 1
}

/// What this rank knows about failures.
enum State {
    /// Nothing went wrong.
    Ok,
    /// A rank failed (this one, through [`Comm::abort`], or a peer whose notice arrived).
    Failed { rank: usize, message: String },
    /// A split message was abandoned half-way, so the message stream between two ranks is
    /// out of step; no further communication is attempted.
    Broken(String),
}

/// A split message being received.
struct Partial {
    mtag: c_int,
    buf: Vec<u8>,
    filled: usize,
}

/// Messages that arrived before anyone asked for them.
#[derive(Default)]
struct Inbox {
    /// Complete messages by (source, MPI tag), oldest first.
    ready: HashMap<(usize, c_int), VecDeque<Vec<u8>>>,
    /// Split messages being received, by source (a sender finishes one before the next).
    partial: HashMap<usize, Partial>,
    /// Go-aheads received, by the rank that sent them: the length it agreed to receive.
    go: HashMap<usize, VecDeque<u64>>,
}

/// How a send waits for its MPI request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SendWait {
    /// Take in arriving messages while waiting, polling lazily.
    Lazy,
    /// Take in arriving messages while waiting, never sleeping: the receiver is receiving.
    Hot,
    /// Only watch for abort notices: for go-aheads, sent from inside the intake itself.
    Bare,
}

/// Polls with a short spin first, then yields, then sleeps up to about 1 ms.
pub(crate) struct Backoff {
    start: Instant,
    sleep: Duration,
    /// How long to spin before yielding.
    spin: Duration,
    /// Never sleep: the peer is known to be taking part, and MPI only moves data while this
    /// rank is inside an MPI call (Open MPI has no progress thread).
    hot: bool,
}

impl Backoff {
    pub(crate) fn new(hot: bool) -> Backoff {
        Backoff::with_spin(hot, Duration::from_micros(50))
    }

    /// Spins for `spin` before it starts yielding.
    pub(crate) fn with_spin(hot: bool, spin: Duration) -> Backoff {
        Backoff {
            start: Instant::now(),
            sleep: Duration::from_micros(20),
            spin,
            hot,
        }
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Waits a little; `hot_now` forbids sleeping this time.
    pub(crate) fn pause(&mut self, hot_now: bool) {
        let waited = self.start.elapsed();
        if waited < self.spin {
            std::hint::spin_loop();
        } else if self.hot || hot_now || waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
            self.sleep = (self.sleep * 2).min(Duration::from_millis(1));
        }
    }
}

/// One rank of an MPI job: the [`Comm`] transport over rsmpi.
///
/// Create it with [`MpiComm::init`] (rankwise initializes and finalizes MPI) or
/// [`MpiComm::from_communicator`] (the hosting code already initialized MPI and will
/// finalize it).
///
/// `MpiComm` is neither `Send` nor `Sync`: MPI is initialized for one thread
/// (`MPI_THREAD_FUNNELED`/`SERIALIZED`), and the type system keeps every call on the thread
/// that owns the communicator.
///
/// If a rank is dropped while its thread panics, it first sends an abort notice to every
/// other rank, so they fail instead of waiting for their timeout. After a failure, leave
/// through [`MpiComm::exit_after_failure`].
///
/// ```compile_fail
/// fn needs_send<T: Send>() {}
/// needs_send::<rankwise_transports::MpiComm>();
/// ```
///
/// ```compile_fail
/// fn needs_sync<T: Sync>() {}
/// needs_sync::<rankwise_transports::MpiComm>();
/// ```
pub struct MpiComm {
    // Freed by `drop`, before the universe (MPI_Finalize) goes, unless a failure was
    // announced on it (see there).
    comm: ManuallyDrop<SimpleCommunicator>,
    rank: usize,
    size: usize,
    tag_ub: c_int,
    timeout: Duration,
    max_message_bytes: usize,
    state: RefCell<State>,
    inbox: RefCell<Inbox>,
    threading: Option<Threading>,
    universe: Option<Universe>,
    _single_thread: PhantomData<*const ()>,
}

/// What [`StartWatch`]'s thread watches: whether MPI started, and this rank and the world's
/// size once `MPI_Init_thread` returned.
type StartState = (bool, Option<(usize, usize)>);

/// The watchdog of [`MpiComm::init_within`]: ends the process unless [`StartWatch::finish`]
/// comes within the limit.
struct StartWatch {
    state: std::sync::Arc<(std::sync::Mutex<StartState>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StartWatch {
    fn start(limit: Duration) -> StartWatch {
        let state = std::sync::Arc::new((
            std::sync::Mutex::new((false, None)),
            std::sync::Condvar::new(),
        ));
        let watched = std::sync::Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("rankwise-mpi-start".into())
            .spawn(move || {
                let (lock, signal) = &*watched;
                let deadline = Instant::now() + limit;
                let mut st = lock.lock().unwrap_or_else(|e| e.into_inner());
                while !st.0 {
                    let now = Instant::now();
                    if now >= deadline {
                        let (who, stage) = match st.1 {
                            Some((rank, size)) => (
                                format!("rank {rank} (of {size})"),
                                "MPI_Comm_dup of MPI_COMM_WORLD, where the ranks first connect, did not return",
                            ),
                            None => (
                                launcher_rank()
                                    .map_or("a rank".to_string(), |r| format!("rank {r}")),
                                "MPI_Init_thread did not return",
                            ),
                        };
                        eprintln!(
                            "rankwise: {who} on {}: MPI did not start within {} s ({stage}); the ranks cannot \
                             all reach each other (a message of the MPI library above may name the \
                             pair and the transports it tried); ending this rank",
                            hostname(),
                            limit.as_secs_f64()
                        );
                        // SAFETY: ends the process at once: its main thread is inside MPI,
                        // and destructors or atexit handlers would call into it again.
                        unsafe { libc::_exit(1) }
                    }
                    st = signal
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            })
            .ok();
        StartWatch { state, thread }
    }

    /// MPI_Init returned: later messages name the rank.
    fn started(&self, rank: usize, size: usize) {
        let mut st = self.state.0.lock().unwrap_or_else(|e| e.into_inner());
        st.1 = Some((rank, size));
    }

    /// MPI started: the watchdog stops.
    fn finish(self) {
        // Dropping it stops the thread (below).
    }
}

impl Drop for StartWatch {
    /// Stops the watchdog: after [`StartWatch::finish`], or on an error return from the
    /// start (which the caller reports).
    fn drop(&mut self) {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner()).0 = true;
        self.state.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// This process's rank as the launcher set it, before MPI could say.
fn launcher_rank() -> Option<String> {
    [
        "OMPI_COMM_WORLD_RANK",
        "PMIX_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok())
}

/// This host's name, for messages.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this host".into())
}

impl MpiComm {
    /// Initializes MPI (`MPI_Init_thread`) and returns the world communicator. MPI is
    /// finalized when the returned value is dropped.
    ///
    /// Call it on the main thread. Asks for `MPI_THREAD_SERIALIZED` and accepts
    /// `MPI_THREAD_FUNNELED`; fails if the library grants less, if MPI was already
    /// initialized (use [`MpiComm::from_communicator`]), or if only `FUNNELED` is granted and
    /// this is not the main thread.
    pub fn init() -> Result<MpiComm> {
        MpiComm::init_within(DEFAULT_TIMEOUT)
    }

    /// [`MpiComm::init`], ending this process (exit status 1, a line on stderr naming the
    /// rank and the stage) when MPI has not started within `limit`.
    ///
    /// Starting is blocking MPI: `MPI_Init_thread`, then `MPI_Comm_dup` of the world, where
    /// the ranks first connect. When some ranks cannot reach others (a launch whose
    /// transports do not span the nodes, say), Open MPI says so and announces an abort,
    /// but its ranks then wait inside `MPI_Comm_dup` for good; no call of ours returns to
    /// notice. A watchdog thread does: past `limit`, it prints why and ends the rank, and
    /// as every rank is stuck the same way, every rank ends.
    pub fn init_within(limit: Duration) -> Result<MpiComm> {
        let watch = StartWatch::start(limit);
        let (universe, granted) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| {
                TransportError::Mpi(
                    "MPI is already initialized (or was finalized); use \
                     MpiComm::from_communicator with the hosting code's communicator"
                        .into(),
                )
            })?;
        if granted < Threading::Funneled {
            return Err(TransportError::Mpi(format!(
                "the MPI library granted thread level {granted:?}; rankwise needs at least \
                 Funneled (its actor threads run next to the MPI thread)"
            )));
        }
        if granted == Threading::Funneled && !is_thread_main() {
            return Err(TransportError::Mpi(
                "MPI granted MPI_THREAD_FUNNELED only, so MPI must be initialized on the main \
                 thread; call MpiComm::init from main"
                    .into(),
            ));
        }
        let world = universe.world();
        watch.started(world.rank() as usize, world.size() as usize);
        let mut comm = MpiComm::from_communicator(world);
        watch.finish();
        comm.threading = Some(granted);
        comm.universe = Some(universe);
        Ok(comm)
    }

    /// Wraps a communicator of code that already initialized MPI. The communicator is
    /// duplicated (`MPI_Comm_dup`, collective over its ranks: every rank must call this), so
    /// rankwise's messages never mix with the caller's; the communicator passed in is then
    /// dropped (a user communicator is freed, `MPI_COMM_WORLD` stays). MPI is not finalized
    /// when the result is dropped.
    ///
    /// The caller must have initialized MPI with at least `MPI_THREAD_FUNNELED` and must use
    /// the result on the thread that makes its MPI calls.
    pub fn from_communicator(comm: SimpleCommunicator) -> MpiComm {
        let dup = comm.duplicate();
        let tag_ub = SimpleCommunicator::world()
            .get_attr::<TagUb>()
            .map(|t| t.0)
            .unwrap_or(32767)
            .max(32767);
        MpiComm {
            rank: dup.rank() as usize,
            size: dup.size() as usize,
            comm: ManuallyDrop::new(dup),
            tag_ub,
            timeout: DEFAULT_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            state: RefCell::new(State::Ok),
            inbox: RefCell::new(Inbox::default()),
            threading: None,
            universe: None,
            _single_thread: PhantomData,
        }
    }

    /// The (duplicated) MPI communicator this transport uses, e.g. to exchange UCX worker
    /// addresses or an NCCL unique id. Messages sent on it directly must not use the tags
    /// of this transport (any tag up to `MPI_TAG_UB`), so prefer a duplicate of it.
    pub fn communicator(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// The thread level MPI granted, when this value initialized MPI.
    pub fn threading(&self) -> Option<Threading> {
        self.threading
    }

    /// Whether this value initialized MPI and will finalize it on drop.
    pub fn owns_mpi(&self) -> bool {
        self.universe.is_some()
    }

    /// The largest user tag the MPI library can carry (`MPI_TAG_UB` − 1024).
    pub fn max_user_tag(&self) -> Tag {
        (self.tag_ub - RESERVED_MPI_TAGS) as Tag
    }

    /// The current timeout of receives and sends.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Largest piece one MPI call carries; longer messages are split.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Sets the largest piece one MPI call carries (clamped to
    /// [`MIN_MAX_MESSAGE_BYTES`]..=[`DEFAULT_MAX_MESSAGE_BYTES`]). Tests lower it to exercise
    /// splitting with small messages; only the sender's setting matters.
    pub fn set_max_message_bytes(&mut self, bytes: usize) {
        self.max_message_bytes = bytes.clamp(MIN_MAX_MESSAGE_BYTES, DEFAULT_MAX_MESSAGE_BYTES);
    }

    /// Ends the process with exit status `code` after a failure (this rank's own, reported
    /// with [`Comm::abort`], or a peer's), so that every rank gets to report it.
    ///
    /// Flushes stdout and stderr, then finalizes MPI when this value owns it, and exits.
    /// `MPI_Finalize` waits for all ranks (in Open MPI it is a fence), and that is the point:
    /// a rank that leaves first — with a non-zero status or without finalizing — makes
    /// `mpirun` kill the others, often before they have printed why they fail. Ranks that
    /// learn of the failure reach the fence within moments; a rank that never will (stuck
    /// outside MPI) cannot hold the job: after `grace` this rank exits without finalizing,
    /// and the launcher ends the rest.
    pub fn exit_after_failure(self, code: i32, grace: Duration) -> ! {
        use std::io::Write;
        let flush = || {
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
        };
        flush();
        std::thread::spawn(move || {
            std::thread::sleep(grace);
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            // SAFETY: _exit ends the process at once; nothing runs after it.
            unsafe { libc::_exit(code) }
        });
        drop(self);
        flush();
        std::process::exit(code)
    }

    /// Calls `MPI_Abort` on this communicator: the MPI runtime kills every process of the
    /// job. The last resort when a rank cannot report its failure through [`Comm::abort`].
    pub fn abort_job(&self, code: i32) -> ! {
        self.comm.abort(code)
    }

    fn mpi_tag(&self, tag: Tag) -> Result<c_int> {
        map_tag(tag, self.tag_ub).ok_or_else(|| {
            if tag >= RESERVED_TAG_BASE {
                TransportError::ReservedTag(tag)
            } else {
                TransportError::Mpi(format!(
                    "tag {tag} is too large for this MPI library: user tags must be at most \
                     {} (MPI_TAG_UB is {}, the top {RESERVED_MPI_TAGS} tags are reserved)",
                    self.max_user_tag(),
                    self.tag_ub
                ))
            }
        })
    }

    /// Fails fast when an earlier failure is known.
    fn check_state(&self) -> Result<()> {
        match &*self.state.borrow() {
            State::Ok => Ok(()),
            State::Failed { rank, message } => Err(TransportError::PeerFailed {
                rank: *rank,
                message: message.clone(),
            }),
            State::Broken(why) => Err(TransportError::Mpi(why.clone())),
        }
    }

    /// Records a peer's abort notice and returns it as an error.
    fn peer_failed(&self, rank: usize, notice: &[u8]) -> TransportError {
        let message = String::from_utf8_lossy(notice).into_owned();
        let mut state = self.state.borrow_mut();
        if !matches!(*state, State::Failed { .. }) {
            *state = State::Failed {
                rank,
                message: message.clone(),
            };
        }
        TransportError::PeerFailed { rank, message }
    }

    /// After a split message was abandoned half-way, the message stream between two ranks
    /// is out of step: refuse all further communication.
    fn mark_broken(&self, why: String) {
        let mut state = self.state.borrow_mut();
        if matches!(*state, State::Ok) {
            *state = State::Broken(why);
        }
    }

    /// Fails for a malformed message (after receiving it, so MPI is done with it).
    fn malformed(&self, message: Message, n: usize, src: usize, expected: usize) -> TransportError {
        let mut scratch = vec![0u8; n];
        message.matched_receive_into(&mut scratch[..]);
        let error = TransportError::Length {
            peer: src,
            got: n,
            expected,
        };
        self.mark_broken(format!("protocol error: {error}"));
        error
    }

    fn timeout_error(&self, peer: usize, tag: Tag) -> TransportError {
        TransportError::Timeout {
            me: self.rank,
            peer,
            tag,
            secs: self.timeout.as_secs(),
        }
    }

    /// True while a split message is coming in: waits must not sleep then.
    fn receiving_split(&self) -> bool {
        !self.inbox.borrow().partial.is_empty()
    }

    /// Receives a pending abort notice, if any, and turns it into an error. Finds it even
    /// behind other messages.
    fn poll_abort(&self) -> Result<()> {
        if let Some((message, status)) = self
            .comm
            .any_process()
            .immediate_matched_probe_with_tag(self.tag_ub)
        {
            let n = status.count(u8::equivalent_datatype()) as usize;
            let mut notice = vec![0u8; n];
            message.matched_receive_into(&mut notice[..]);
            return Err(self.peer_failed(status.source_rank() as usize, &notice));
        }
        Ok(())
    }

    /// Takes in every message that has arrived: abort notices (an error), go-aheads, and
    /// messages or pieces of messages, which go to the inbox.
    fn progress(&self) -> Result<()> {
        let go = go_tag(self.tag_ub);
        while let Some((message, status)) = self.comm.any_process().immediate_matched_probe() {
            let src = status.source_rank() as usize;
            let mtag = status.tag();
            let n = status.count(u8::equivalent_datatype()) as usize;

            if mtag == self.tag_ub {
                let mut notice = vec![0u8; n];
                message.matched_receive_into(&mut notice[..]);
                return Err(self.peer_failed(src, &notice));
            }

            if mtag == go {
                if n != 8 {
                    return Err(self.malformed(message, n, src, 8));
                }
                let mut len = [0u8; 8];
                message.matched_receive_into(&mut len[..]);
                let mut inbox = self.inbox.borrow_mut();
                inbox
                    .go
                    .entry(src)
                    .or_default()
                    .push_back(u64::from_le_bytes(len));
                continue;
            }

            let partial = self.inbox.borrow_mut().partial.remove(&src);
            if let Some(mut p) = partial {
                // The next piece of the split message from `src`.
                if p.mtag != mtag || n == 0 || p.filled + n > p.buf.len() {
                    let expected = p.buf.len() - p.filled;
                    return Err(self.malformed(message, n, src, expected));
                }
                let range = p.filled..p.filled + n;
                if let Err(e) = self.receive_piece(message, &mut p.buf[range], src, mtag) {
                    // MPI may still write into the buffer: it must stay allocated.
                    std::mem::forget(p.buf);
                    return Err(e);
                }
                p.filled += n;
                let mut inbox = self.inbox.borrow_mut();
                if p.filled == p.buf.len() {
                    inbox.ready.entry((src, mtag)).or_default().push_back(p.buf);
                } else {
                    inbox.partial.insert(src, p);
                }
                continue;
            }

            // The header of a new message.
            if !(8..=8 + INLINE_MAX).contains(&n) {
                return Err(self.malformed(message, n, src, 8));
            }
            let mut head = vec![0u8; n];
            message.matched_receive_into(&mut head[..]);
            let total = u64::from_le_bytes(head[..8].try_into().expect("8 bytes")) as usize;
            if n == 8 + total {
                head.drain(..8);
                let mut inbox = self.inbox.borrow_mut();
                inbox.ready.entry((src, mtag)).or_default().push_back(head);
            } else if n == 8 {
                // Zeroed allocation: a large one comes straight from the kernel, already zero.
                let p = Partial {
                    mtag,
                    buf: vec![0u8; total],
                    filled: 0,
                };
                self.inbox.borrow_mut().partial.insert(src, p);
                self.send_piece(src, go, &head, SendWait::Bare)?;
            } else {
                let error = TransportError::Length {
                    peer: src,
                    got: n,
                    expected: 8 + total,
                };
                self.mark_broken(format!("protocol error: {error}"));
                return Err(error);
            }
        }
        Ok(())
    }

    /// Sends one MPI message and waits for it to complete, watching for aborts and the
    /// timeout, and taking in arriving messages unless `wait` is [`SendWait::Bare`].
    fn send_piece(&self, dest: usize, mtag: c_int, buf: &[u8], wait: SendWait) -> Result<()> {
        debug_assert!(buf.len() <= DEFAULT_MAX_MESSAGE_BYTES);
        let peer = self.comm.process_at_rank(dest as c_int);
        mpi::request::scope(|scope| {
            let mut request = peer.immediate_send_with_tag(scope, buf, mtag);
            let mut backoff = Backoff::new(wait == SendWait::Hot);
            loop {
                request = match request.test() {
                    Ok(_) => return Ok(()),
                    Err(pending) => pending,
                };
                let step = match wait {
                    SendWait::Bare => self.poll_abort(),
                    SendWait::Lazy | SendWait::Hot => self.progress(),
                };
                let failed = match step {
                    Err(e) => Some(e),
                    Ok(()) if backoff.elapsed() >= self.timeout => {
                        Some(self.timeout_error(dest, unmap_tag(mtag, self.tag_ub)))
                    }
                    Ok(()) => None,
                };
                if let Some(error) = failed {
                    // MPI cannot take a started send back. Leave the request to MPI and make
                    // no further calls that could progress it (the caller may reuse the
                    // buffer once we return).
                    // SAFETY: the raw request is leaked, never completed; see above.
                    let _ = unsafe { request.into_raw() };
                    self.mark_broken(format!(
                        "a send of {} bytes to rank {dest} (tag {:#x}) was abandoned: {error}",
                        buf.len(),
                        unmap_tag(mtag, self.tag_ub)
                    ));
                    return Err(error);
                }
                backoff.pause(self.receiving_split());
            }
        })
    }

    /// Receives one probed piece of a split message into `buf`, polling hot and watching
    /// for aborts. On an error the receive is left to MPI, which may still write into
    /// `buf`: the caller must then leak the buffer.
    fn receive_piece(
        &self,
        message: Message,
        buf: &mut [u8],
        src: usize,
        mtag: c_int,
    ) -> Result<()> {
        let len = buf.len();
        mpi::request::scope(|scope| {
            let mut request = message.immediate_matched_receive_into(scope, buf);
            let mut backoff = Backoff::new(true);
            loop {
                request = match request.test() {
                    Ok(_) => return Ok(()),
                    Err(pending) => pending,
                };
                let failed = match self.poll_abort() {
                    Err(e) => Some(e),
                    Ok(()) if backoff.elapsed() >= self.timeout => {
                        Some(self.timeout_error(src, unmap_tag(mtag, self.tag_ub)))
                    }
                    Ok(()) => None,
                };
                if let Some(error) = failed {
                    // SAFETY: the request is leaked, and so is its buffer (by the caller).
                    let _ = unsafe { request.into_raw() };
                    self.mark_broken(format!(
                        "a receive of {len} bytes from rank {src} (tag {:#x}) was abandoned: \
                         {error}",
                        unmap_tag(mtag, self.tag_ub)
                    ));
                    return Err(error);
                }
                backoff.pause(true);
            }
        })
    }

    /// Waits for the receiver's go-ahead for a split message of `total` bytes.
    fn wait_go(&self, dest: usize, tag: Tag, total: usize) -> Result<()> {
        let mut backoff = Backoff::new(false);
        loop {
            let step = self.progress();
            let go = self
                .inbox
                .borrow_mut()
                .go
                .get_mut(&dest)
                .and_then(VecDeque::pop_front);
            let failed = match (step, go) {
                (Err(e), _) => e,
                (Ok(()), Some(len)) if len == total as u64 => return Ok(()),
                (Ok(()), Some(len)) => TransportError::Mpi(format!(
                    "rank {dest} agreed to receive {len} bytes, but {total} were announced"
                )),
                (Ok(()), None) if backoff.elapsed() >= self.timeout => {
                    self.timeout_error(dest, tag)
                }
                (Ok(()), None) => {
                    backoff.pause(self.receiving_split());
                    continue;
                }
            };
            self.mark_broken(format!(
                "a message of {total} bytes to rank {dest} (tag {tag:#x}) was abandoned after \
                 its header: {failed}"
            ));
            return Err(failed);
        }
    }

    fn take_ready(&self, src: usize, mtag: c_int) -> Option<Vec<u8>> {
        self.inbox
            .borrow_mut()
            .ready
            .get_mut(&(src, mtag))
            .and_then(VecDeque::pop_front)
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn name(&self) -> &'static str {
        "mpi"
    }

    fn library(&self) -> Option<String> {
        mpi::environment::library_version()
            .ok()
            .map(|v| v.trim().to_string())
    }

    fn send_raw(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.check_rank(dest)?;
        self.check_state()?;
        let mtag = self.mpi_tag(tag)?;
        if dest == self.rank {
            let mut inbox = self.inbox.borrow_mut();
            inbox
                .ready
                .entry((dest, mtag))
                .or_default()
                .push_back(data.to_vec());
            return Ok(());
        }
        let total = data.len();
        let header = (total as u64).to_le_bytes();
        if total <= INLINE_MAX.min(self.max_message_bytes - header.len()) {
            let mut whole = Vec::with_capacity(header.len() + total);
            whole.extend_from_slice(&header);
            whole.extend_from_slice(data);
            return self.send_piece(dest, mtag, &whole, SendWait::Lazy);
        }
        self.send_piece(dest, mtag, &header, SendWait::Lazy)?;
        self.wait_go(dest, tag, total)?;
        for (start, end) in split_counts(total, self.max_message_bytes) {
            self.send_piece(dest, mtag, &data[start..end], SendWait::Hot)?;
        }
        Ok(())
    }

    fn recv_raw(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        self.check_rank(src)?;
        self.check_state()?;
        let mtag = self.mpi_tag(tag)?;
        let mut backoff = Backoff::new(false);
        loop {
            // Abort notices first, as in LocalComm.
            self.progress()?;
            if let Some(message) = self.take_ready(src, mtag) {
                return Ok(message);
            }
            // Nobody else can send this rank's messages to itself: waiting cannot help.
            if src == self.rank || backoff.elapsed() >= self.timeout {
                return Err(self.timeout_error(src, tag));
            }
            backoff.pause(self.receiving_split());
        }
    }

    fn abort(&self, message: &str) {
        {
            let mut state = self.state.borrow_mut();
            if matches!(*state, State::Failed { .. }) {
                // The original failure was already announced by the rank where it happened.
                return;
            }
            *state = State::Failed {
                rank: self.rank,
                message: message.to_string(),
            };
        }
        let mut end = message.len().min(ABORT_MESSAGE_MAX);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        // Leaked on purpose: a notice that cannot leave before the linger ends stays with
        // MPI, and abort happens at most once per rank.
        let notice: &'static [u8] =
            Box::leak(message.as_bytes()[..end].to_vec().into_boxed_slice());
        let mut pending = Vec::new();
        for dest in (0..self.size).filter(|&d| d != self.rank) {
            let peer = self.comm.process_at_rank(dest as c_int);
            pending.push(peer.immediate_send_with_tag(StaticScope, notice, self.tag_ub));
        }
        let deadline = Instant::now() + ABORT_LINGER;
        let mut backoff = Backoff::new(false);
        while !pending.is_empty() && Instant::now() < deadline {
            pending = pending
                .into_iter()
                .filter_map(|request| request.test().err())
                .collect();
            backoff.pause(false);
        }
        for request in pending {
            // SAFETY: the buffer is 'static; the request is left to MPI.
            let _ = unsafe { request.into_raw() };
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn peer_failure(&self, wait: Duration) -> Option<(usize, String)> {
        let deadline = Instant::now() + wait;
        loop {
            let known = match self.check_state().and_then(|()| self.poll_abort()) {
                Err(TransportError::PeerFailed { rank, message }) => Some((rank, message)),
                _ => None,
            };
            if known.is_some() || Instant::now() >= deadline {
                return known;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

impl Drop for MpiComm {
    fn drop(&mut self) {
        if std::thread::panicking() && !matches!(*self.state.borrow(), State::Failed { .. }) {
            self.abort(&format!("rank {} panicked", self.rank));
        }
        // After a failure (or a broken stream), failure notices may still be in flight or unreceived on this
        // communicator (every rank that failed alike announced its own). Freed, its context
        // id would be reused by the next duplicate in this process (a library caller's next
        // call), and that call would receive the old notices as a new failure. So a failed
        // communicator is left to MPI, with whatever it still holds.
        if matches!(*self.state.borrow(), State::Ok) {
            // SAFETY: dropped once, here; no use of `comm` follows.
            unsafe { ManuallyDrop::drop(&mut self.comm) };
        }
    }
}

fn is_thread_main() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI is initialized; flag is a valid out-pointer.
    unsafe {
        mpi::ffi::MPI_Is_thread_main(&mut flag);
    }
    flag != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_map_into_the_mpi_range_without_collisions() {
        for &ub in &[32767, 1 << 21, i32::MAX] {
            let band = ub - RESERVED_MPI_TAGS + 1;
            assert_eq!(map_tag(0, ub), Some(0));
            assert_eq!(map_tag(band as u32 - 1, ub), Some(band - 1));
            assert_eq!(map_tag(band as u32, ub), None);
            assert_eq!(map_tag(RESERVED_TAG_BASE - 1, ub), None);
            assert_eq!(map_tag(ABORT_TAG, ub), Some(ub));
            assert_eq!(go_tag(ub), ub - 1);
            let mut seen = std::collections::HashSet::new();
            let last_k = RESERVED_MPI_TAGS as u32 - 2;
            for k in 0..last_k {
                let t = map_tag(RESERVED_TAG_BASE + k, ub).unwrap();
                assert!(t >= band && t < go_tag(ub), "{t}");
                assert!(seen.insert(t));
            }
            assert_eq!(map_tag(RESERVED_TAG_BASE + last_k, ub), None);
            assert_eq!(map_tag(ABORT_TAG - 1, ub), None);
        }
        // The collectives' tags all have MPI tags.
        for t in [crate::TAG_BCAST, crate::TAG_GATHER, crate::TAG_BARRIER] {
            assert!(map_tag(t, 32767).is_some());
        }
    }

    #[test]
    fn tags_map_back() {
        for &ub in &[32767, i32::MAX] {
            let user = [0, 1, 7, ub as u32 - RESERVED_MPI_TAGS as u32];
            let reserved = [RESERVED_TAG_BASE, RESERVED_TAG_BASE + 3, ABORT_TAG];
            for t in user.into_iter().chain(reserved) {
                assert_eq!(unmap_tag(map_tag(t, ub).unwrap(), ub), t, "tag {t:#x}");
            }
        }
    }
}
