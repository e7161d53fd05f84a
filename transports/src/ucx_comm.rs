//! `Ucx`: the transport over UCX's tagged API, bootstrapped by MPI.
//!
//! [`UcxComm`] moves every message of [`Comm::send_raw`] with `ucp_tag_send_nbx`; UCX picks
//! shared memory, TCP, InfiniBand or GPU transports as the hardware offers, under the
//! control of its usual environment (`UCX_TLS`, `UCX_NET_DEVICES`, ...). MPI is used to
//! start only: it is initialized first, the ranks exchange their UCX worker addresses with
//! an allgather over it, and it stays initialized (idle) until the transport is dropped,
//! when it meets the other ranks once more in a barrier and is finalized.
//!
//! # Threads
//!
//! The UCP context and worker are created for one thread (`UCS_THREAD_MODE_SINGLE`).
//! [`UcxComm`] is neither `Send` nor `Sync` (it also holds the MPI bootstrap, see
//! [`MpiComm`]), so every UCX call stays on the thread that created it. UCX has no progress
//! thread here: data moves only while that thread is inside a call of the transport. A
//! wait polls UCX, spinning for a few microseconds ([`SPIN_VAR`] sets how many) and then
//! yielding the CPU between polls, sleeping (up to 1 ms) only after 2 ms without news and
//! never while a large message is on its way.
//!
//! # Delivery
//!
//! As with [`MpiComm`], a rank takes in every message that has arrived whenever it is
//! inside any call of the transport (`ucp_worker_progress`, then `ucp_tag_probe_nb` with
//! removal, which tells the length, then `ucp_tag_msg_recv_nbx` into a buffer of exactly
//! that size), and keeps it in a mailbox until asked for it: receives match by source and
//! tag, and sends never wait for the receiver to ask for that particular message. A large
//! message (UCX's rendezvous protocol) completes at the sender only once the receiver is
//! inside some call of the transport, so the timeout must exceed the longest time a rank
//! computes without communicating — as for receives.
//!
//! # Wire format and tags
//!
//! A message is its payload only, in one UCX operation of any length (UCX counts are
//! `size_t`). Its 64-bit UCX tag carries the sender's rank in the upper 32 bits and the
//! rankwise [`Tag`] in the lower 32, so every rankwise tag, reserved ones included, has a
//! UCX tag, and the receiver learns the sender from the tag. UCX keeps the messages of one
//! endpoint in order, so messages with the same source and tag are received in the order
//! they were sent. A message to this rank itself goes straight to the mailbox.
//!
//! # Failure
//!
//! [`Comm::abort`] sends a notice (tag [`ABORT_TAG`]) to every peer and lingers up to two
//! seconds for the notices to leave; every wait of every rank looks for notices first and
//! reports them as [`TransportError::PeerFailed`]. The notice also goes over the MPI
//! bootstrap, where a peer that has finished its work waits in the closing barrier.
//!
//! Endpoints are created with `UCP_ERR_HANDLING_MODE_PEER` and an error callback: a peer
//! that disappears without a word (killed) fails its endpoint, and any wait on that peer
//! ends at once with [`TransportError::Disconnected`] naming it (the other ranks then hear
//! of it through the abort notice of the rank that noticed). UCX 1.13's shared-memory
//! transports cannot handle peer errors: with `UCX_TLS` limited to them, endpoint creation
//! falls back to no error handling, and a killed peer is noticed by the launcher or the
//! timeout. With other transports enabled too, peer error handling makes UCX 1.13 leave
//! shared memory aside; [`ERR_HANDLING_VAR`]`=none` gives it back at the price of that
//! detection.
//!
//! An operation that cannot finish (timeout, failure) is abandoned by force-closing the
//! endpoint to that peer, which completes its requests; should one still be pending, the
//! transport stops calling UCX altogether, so that it never touches the caller's buffer
//! again. After a failure, leave through [`UcxComm::exit_after_failure`].

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::{c_void, CStr};
use std::time::{Duration, Instant};

use rankwise_ucx_sys as sys;

use crate::mpi_comm::Backoff;
use crate::{Comm, MpiComm, Result, Tag, TransportError, ABORT_TAG, DEFAULT_TIMEOUT};

/// How long [`Comm::abort`] waits for its notices to leave before it returns anyway.
const ABORT_LINGER: Duration = Duration::from_secs(2);

/// Abort messages longer than this are truncated, so that the notice always goes eagerly.
const ABORT_MESSAGE_MAX: usize = 1024;

/// Sends larger than this poll without sleeping while they wait (UCX's eager limit is
/// smaller: such a message goes by rendezvous and moves only while both ranks call UCX).
const HOT_SEND_BYTES: usize = 64 * 1024;

/// How long a wait spins before it yields the CPU: short, because a rank's peers may share
/// its core (oversubscribed or busy nodes), and a spinning rank then delays the very
/// message it waits for. `RANKWISE_UCX_SPIN_US` overrides it.
const SPIN: Duration = Duration::from_micros(5);

/// Environment variable that sets the spin before a wait yields, in microseconds.
pub const SPIN_VAR: &str = "RANKWISE_UCX_SPIN_US";

/// How long closing the endpoints may take when the transport is dropped.
const CLOSE_LINGER: Duration = Duration::from_secs(5);

/// How long the ranks wait for each other in the closing barrier.
const CLOSE_BARRIER_TIMEOUT: Duration = Duration::from_secs(60);

/// The UCX tag of a message from `src` with rankwise tag `tag`.
fn encode_tag(src: usize, tag: Tag) -> u64 {
    ((src as u64) << 32) | tag as u64
}

/// Sender and rankwise tag of a UCX tag (the inverse of [`encode_tag`]).
fn decode_tag(utag: u64) -> (usize, Tag) {
    ((utag >> 32) as usize, utag as u32)
}

/// UCX's words for a status code.
fn status_text(status: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string returns a static C string for any code.
    let text = unsafe { sys::ucs_status_string(status) };
    if text.is_null() {
        format!("status {status}")
    } else {
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

fn ucx_error(what: &str, status: sys::ucs_status_t) -> TransportError {
    TransportError::Ucx(format!("{what}: {}", status_text(status)))
}

/// Environment variable that chooses the endpoints' error handling: `peer` (the default)
/// or `none` (lets UCX 1.13 use shared memory between the ranks of a node even when other
/// transports are enabled, at the price of noticing a killed peer only through the
/// launcher or the timeout).
pub const ERR_HANDLING_VAR: &str = "RANKWISE_UCX_ERR_HANDLING";

fn peer_errors_wanted() -> Result<bool> {
    match std::env::var(ERR_HANDLING_VAR) {
        Err(_) => Ok(true),
        Ok(v) if v == "peer" || v.is_empty() => Ok(true),
        Ok(v) if v == "none" => Ok(false),
        Ok(v) => Err(TransportError::Ucx(format!(
            "{ERR_HANDLING_VAR}={v:?}: expected `peer` or `none`"
        ))),
    }
}

/// Runs `f` with UCX's logging limited to fatal errors, unless the user chose a level
/// (`UCX_LOG_LEVEL`): for a call whose failure is expected and handled, which UCX would
/// otherwise log as an error.
fn quiet_ucx<T>(f: impl FnOnce() -> T) -> T {
    if std::env::var_os("UCX_LOG_LEVEL").is_some() {
        return f();
    }
    // SAFETY: a plain integer field of UCS's global options; this thread is the only one
    // that calls UCX.
    unsafe {
        let level = std::ptr::addr_of_mut!(sys::ucs_global_opts.log_component.log_level);
        let before = level.read();
        level.write(sys::UCS_LOG_LEVEL_FATAL);
        let out = f();
        level.write(before);
        out
    }
}

/// The safe layer over UCP: context, worker, endpoints, requests.
mod ucp {
    use super::*;

    /// A UCP context with the tag-matching feature (`ucp_init`).
    pub(super) struct Context(sys::ucp_context_h);

    impl Context {
        /// Reads the `UCX_*` environment and initializes UCP for `ranks` endpoints.
        pub(super) fn new(ranks: usize) -> Result<Context> {
            let mut config: *mut sys::ucp_config_t = std::ptr::null_mut();
            // SAFETY: null prefix and file mean "UCX_" and no file; config is an out-pointer.
            let status =
                unsafe { sys::ucp_config_read(std::ptr::null(), std::ptr::null(), &mut config) };
            if status != sys::UCS_OK {
                return Err(ucx_error("reading the UCX configuration", status));
            }
            let params = sys::ucp_params_t {
                field_mask: (sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_ESTIMATED_NUM_EPS)
                    as u64,
                features: sys::UCP_FEATURE_TAG as u64,
                estimated_num_eps: ranks,
                ..Default::default()
            };
            let mut context: sys::ucp_context_h = std::ptr::null_mut();
            // SAFETY: params and config are valid; context is an out-pointer.
            let status = unsafe { sys::ucp_init(&params, config, &mut context) };
            // SAFETY: config came from ucp_config_read and is released once.
            unsafe { sys::ucp_config_release(config) };
            if status != sys::UCS_OK || context.is_null() {
                return Err(ucx_error("initializing UCP", status));
            }
            Ok(Context(context))
        }
    }

    impl Drop for Context {
        fn drop(&mut self) {
            // SAFETY: the context is valid and every worker of it is gone (field order of
            // the owner).
            unsafe { sys::ucp_cleanup(self.0) }
        }
    }

    /// A completed, failed or pending non-blocking operation.
    pub(super) enum Op {
        /// Completed at once.
        Done,
        /// Failed at once.
        Failed(sys::ucs_status_t),
        /// In progress: poll it.
        Pending(Request),
    }

    impl Op {
        fn from_ptr(ptr: sys::ucs_status_ptr_t) -> Op {
            if ptr.is_null() {
                Op::Done
            } else if sys::UCS_PTR_IS_ERR(ptr) {
                Op::Failed(sys::UCS_PTR_STATUS(ptr))
            } else {
                Op::Pending(Request(ptr))
            }
        }
    }

    /// A pending request of UCP, freed when it completes. Dropping it unfinished leaves it
    /// to UCP (the memory it works on must then stay valid).
    pub(super) struct Request(*mut c_void);

    impl Request {
        /// Leaves an unfinished request to UCP: it is never freed, and the memory it works
        /// on must stay valid (a `Request` has no destructor; this names the intent).
        pub(super) fn leave(self) {}

        /// The final status once the operation completed (the request is then freed), or
        /// the request back while it is in progress.
        pub(super) fn check(self) -> std::result::Result<sys::ucs_status_t, Request> {
            // SAFETY: the request is a live UCP request, not yet freed.
            let status = unsafe { sys::ucp_request_check_status(self.0) };
            if status == sys::UCS_INPROGRESS {
                Err(self)
            } else {
                // SAFETY: completed; freed exactly once.
                unsafe { sys::ucp_request_free(self.0) };
                Ok(status)
            }
        }
    }

    /// A message taken off the unexpected queue by a probe: sender's tag and length.
    pub(super) struct Probed {
        pub handle: sys::ucp_tag_message_h,
        pub tag: u64,
        pub len: usize,
    }

    /// An endpoint to a peer's worker.
    #[derive(Clone, Copy)]
    pub(super) struct Endpoint(pub sys::ucp_ep_h);

    /// A UCP worker for one thread.
    pub(super) struct Worker(sys::ucp_worker_h);

    impl Worker {
        /// A worker of `context` in single-thread mode.
        pub(super) fn new(context: &Context) -> Result<Worker> {
            let params = sys::ucp_worker_params_t {
                field_mask: sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64,
                thread_mode: sys::UCS_THREAD_MODE_SINGLE,
                ..Default::default()
            };
            let mut worker: sys::ucp_worker_h = std::ptr::null_mut();
            // SAFETY: valid context and params; worker is an out-pointer.
            let status = unsafe { sys::ucp_worker_create(context.0, &params, &mut worker) };
            if status != sys::UCS_OK || worker.is_null() {
                return Err(ucx_error("creating the UCP worker", status));
            }
            Ok(Worker(worker))
        }

        /// The worker's address, for peers to connect to.
        pub(super) fn address(&self) -> Result<Vec<u8>> {
            let mut addr: *mut sys::ucp_address_t = std::ptr::null_mut();
            let mut len = 0usize;
            // SAFETY: valid worker; out-pointers.
            let status = unsafe { sys::ucp_worker_get_address(self.0, &mut addr, &mut len) };
            if status != sys::UCS_OK || addr.is_null() {
                return Err(ucx_error("getting the UCP worker address", status));
            }
            // SAFETY: UCP gave `len` readable bytes at `addr`; copied, then released once.
            let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
            unsafe { sys::ucp_worker_release_address(self.0, addr) };
            Ok(bytes)
        }

        /// Connects to the worker at `address`. With `on_error`, the endpoint uses peer
        /// error handling (`UCP_ERR_HANDLING_MODE_PEER`): `on_error` is called with `arg`
        /// (from inside [`Worker::progress`]) when the peer fails. Fails with UCX's status.
        pub(super) fn connect(
            &self,
            address: &[u8],
            on_error: sys::ucp_err_handler_cb_t,
            arg: *mut c_void,
        ) -> std::result::Result<Endpoint, sys::ucs_status_t> {
            let mut params = sys::ucp_ep_params_t {
                field_mask: sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as u64,
                address: address.as_ptr() as *const sys::ucp_address_t,
                ..Default::default()
            };
            if on_error.is_some() {
                params.field_mask |= (sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                    | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER)
                    as u64;
                params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
                params.err_handler = sys::ucp_err_handler_t { cb: on_error, arg };
            }
            let mut ep: sys::ucp_ep_h = std::ptr::null_mut();
            // SAFETY: valid worker; the address bytes live through the call (UCP copies
            // what it needs); ep is an out-pointer.
            let status = unsafe { sys::ucp_ep_create(self.0, &params, &mut ep) };
            if status != sys::UCS_OK || ep.is_null() {
                return Err(if status == sys::UCS_OK {
                    sys::UCS_ERR_NO_ELEM
                } else {
                    status
                });
            }
            Ok(Endpoint(ep))
        }

        /// Makes progress on every operation of the worker; returns the number of events.
        pub(super) fn progress(&self) -> u32 {
            // SAFETY: valid worker, on its thread.
            unsafe { sys::ucp_worker_progress(self.0) }
        }

        /// Starts sending `buf` with `tag`.
        ///
        /// # Safety
        /// `buf` must stay valid and unchanged until the returned operation completed.
        pub(super) unsafe fn tag_send(&self, ep: Endpoint, buf: &[u8], tag: u64) -> Op {
            // No datatype given: contiguous bytes.
            let param = sys::ucp_request_param_t::default();
            // SAFETY: valid endpoint; the caller keeps the buffer alive.
            let ptr = unsafe {
                sys::ucp_tag_send_nbx(ep.0, buf.as_ptr() as *const c_void, buf.len(), tag, &param)
            };
            Op::from_ptr(ptr)
        }

        /// Takes the first arrived message whose tag matches `tag` under `mask` off the
        /// worker's queue, if any.
        pub(super) fn probe(&self, tag: u64, mask: u64) -> Option<Probed> {
            let mut info = sys::ucp_tag_recv_info_t::default();
            // SAFETY: valid worker; info is an out-pointer; remove = 1 hands the message
            // to us (it must be received with tag_msg_recv).
            let handle = unsafe { sys::ucp_tag_probe_nb(self.0, tag, mask, 1, &mut info) };
            if handle.is_null() {
                None
            } else {
                Some(Probed {
                    handle,
                    tag: info.sender_tag,
                    len: info.length,
                })
            }
        }

        /// Starts receiving a probed message into `buf` (exactly its length).
        ///
        /// # Safety
        /// `buf` must stay valid and unused until the returned operation completed.
        pub(super) unsafe fn msg_recv(&self, message: &Probed, buf: &mut [u8]) -> Op {
            // No datatype given: contiguous bytes.
            let param = sys::ucp_request_param_t::default();
            // SAFETY: the message was probed with removal and is received once.
            let ptr = unsafe {
                sys::ucp_tag_msg_recv_nbx(
                    self.0,
                    buf.as_mut_ptr() as *mut c_void,
                    buf.len(),
                    message.handle,
                    &param,
                )
            };
            Op::from_ptr(ptr)
        }

        /// Starts closing `ep`: flushing its operations first, or at once (`force`), which
        /// completes its pending operations with an error.
        pub(super) fn close(&self, ep: Endpoint, force: bool) -> Op {
            let param = sys::ucp_request_param_t {
                op_attr_mask: sys::UCP_OP_ATTR_FIELD_FLAGS,
                flags: if force {
                    sys::UCP_EP_CLOSE_FLAG_FORCE
                } else {
                    0
                },
                ..Default::default()
            };
            // SAFETY: the endpoint is open and closed once (the owner forgets it).
            Op::from_ptr(unsafe { sys::ucp_ep_close_nbx(ep.0, &param) })
        }
    }

    impl Drop for Worker {
        fn drop(&mut self) {
            // SAFETY: valid worker; its endpoints were closed by the owner.
            unsafe { sys::ucp_worker_destroy(self.0) }
        }
    }
}

use ucp::{Context, Endpoint, Op, Request, Worker};

/// What this rank knows about failures.
enum State {
    /// Nothing went wrong.
    Ok,
    /// A rank failed (this one, through [`Comm::abort`], or a peer whose notice arrived).
    Failed { rank: usize, message: String },
    /// An operation could not be taken back: UCX may still use memory of a caller, so no
    /// further UCX call is made (the transport is leaked on drop).
    Broken(String),
}

/// Failure flag of one peer's endpoint, set by UCX's error callback.
#[derive(Default)]
struct PeerSlot {
    /// `UCS_OK` while the endpoint is healthy, its error status after.
    status: Cell<sys::ucs_status_t>,
}

unsafe extern "C" fn on_endpoint_error(
    arg: *mut c_void,
    _ep: sys::ucp_ep_h,
    status: sys::ucs_status_t,
) {
    if arg.is_null() {
        return;
    }
    // SAFETY: `arg` points into the boxed slots of the UcxComm that owns the endpoint,
    // which outlive it; UCX calls this on the worker's (our) thread during progress.
    let slot = unsafe { &*(arg as *const PeerSlot) };
    slot.status.set(if status == sys::UCS_OK {
        sys::UCS_ERR_CONNECTION_RESET
    } else {
        status
    });
}

/// Messages that arrived before anyone asked for them, by (source, tag), oldest first.
type Mailbox = HashMap<(usize, Tag), VecDeque<Vec<u8>>>;

/// The UCX objects, dropped in order: endpoints (closed by hand), worker, context.
struct Ucx {
    endpoints: RefCell<Vec<Option<Endpoint>>>,
    worker: Worker,
    _context: Context,
}

/// One rank of a job on the UCX transport, bootstrapped by MPI.
///
/// Create it with [`UcxComm::init`] (rankwise initializes MPI, and finalizes it when this
/// value is dropped) or [`UcxComm::from_mpi`].
///
/// ```compile_fail
/// fn needs_send<T: Send>() {}
/// needs_send::<rankwise_transports::UcxComm>();
/// ```
pub struct UcxComm {
    ucx: Option<Ucx>,
    /// Failure flags of the peers' endpoints; UCX holds pointers to them.
    slots: Box<[PeerSlot]>,
    /// Whether every endpoint reports peer failures (see [`UcxComm::detects_peer_failure`]).
    peer_errors: bool,
    rank: usize,
    size: usize,
    timeout: Duration,
    /// Spin of a wait before it yields ([`SPIN`]).
    spin: Duration,
    state: RefCell<State>,
    inbox: RefCell<Mailbox>,
    /// The bootstrap, finalized after UCX is shut down.
    mpi: Option<MpiComm>,
}

impl UcxComm {
    /// Initializes MPI ([`MpiComm::init`]) and then UCX over it.
    pub fn init() -> Result<UcxComm> {
        UcxComm::from_mpi(MpiComm::init()?)
    }

    /// [`UcxComm::init`] with MPI's start limited as [`MpiComm::init_within`] limits it.
    pub fn init_within(limit: std::time::Duration) -> Result<UcxComm> {
        UcxComm::from_mpi(MpiComm::init_within(limit)?)
    }

    /// Starts UCX on the ranks of `mpi`: every rank must call this. The worker addresses
    /// travel in an allgather over `mpi`, which this value keeps (and drops after UCX).
    pub fn from_mpi(mpi: MpiComm) -> Result<UcxComm> {
        let (rank, size) = (mpi.rank(), mpi.size());
        let started = (|| -> Result<(Context, Worker, Vec<u8>)> {
            let context = Context::new(size)?;
            let worker = Worker::new(&context)?;
            let address = worker.address()?;
            Ok((context, worker, address))
        })();
        // Every rank takes part in the exchange, so one rank's failure fails them all.
        let (context, worker, address) = match started {
            Ok(s) => s,
            Err(e) => {
                mpi.abort(&format!("cannot start UCX: {e}"));
                return Err(e);
            }
        };
        let addresses = mpi.allgather_bytes(&address)?;
        if addresses.len() != size {
            return Err(TransportError::Ucx(format!(
                "the address exchange returned {} addresses for {size} ranks",
                addresses.len()
            )));
        }
        let slots: Box<[PeerSlot]> = (0..size).map(|_| PeerSlot::default()).collect();
        let mut endpoints = Vec::with_capacity(size);
        let mut peer_errors = peer_errors_wanted()?;
        for (peer, address) in addresses.iter().enumerate() {
            if peer == rank {
                endpoints.push(None);
                continue;
            }
            let arg = &slots[peer] as *const PeerSlot as *mut c_void;
            // Peer error handling where the transports offer it; UCX 1.13's shared memory
            // transports do not ("no peer failure handler": the endpoint is unreachable in
            // that mode), and there a vanished peer is noticed by the launcher or the timeout.
            let first = if peer_errors {
                quiet_ucx(|| worker.connect(address, Some(on_endpoint_error), arg))
            } else {
                Err(sys::UCS_ERR_UNREACHABLE)
            };
            let ep = match first {
                Err(sys::UCS_ERR_UNREACHABLE) => {
                    peer_errors = false;
                    worker.connect(address, None, std::ptr::null_mut())
                }
                other => other,
            };
            match ep {
                Ok(ep) => endpoints.push(Some(ep)),
                Err(status) => {
                    for ep in endpoints.into_iter().flatten() {
                        if let Op::Pending(r) = worker.close(ep, true) {
                            r.leave();
                        }
                    }
                    let error = ucx_error(&format!("connecting to rank {peer}"), status);
                    mpi.abort(&format!("cannot start UCX: {error}"));
                    return Err(error);
                }
            }
        }
        Ok(UcxComm {
            ucx: Some(Ucx {
                endpoints: RefCell::new(endpoints),
                worker,
                _context: context,
            }),
            slots,
            peer_errors,
            rank,
            size,
            timeout: DEFAULT_TIMEOUT,
            spin: std::env::var(SPIN_VAR)
                .ok()
                .and_then(|v| v.parse().ok())
                .map(Duration::from_micros)
                .unwrap_or(SPIN),
            state: RefCell::new(State::Ok),
            inbox: RefCell::new(HashMap::new()),
            mpi: Some(mpi),
        })
    }

    /// The MPI bootstrap (`None` only while leaving through
    /// [`UcxComm::exit_after_failure`]).
    pub fn mpi(&self) -> Option<&MpiComm> {
        self.mpi.as_ref()
    }

    /// Whether every endpoint uses UCX's peer error handling, so that a peer that vanishes
    /// fails the operations waiting on it at once. False where the transports UCX chose do
    /// not offer it (UCX 1.13's shared memory); a vanished peer is then noticed by the
    /// launcher, which ends the job, or by the timeout.
    pub fn detects_peer_failure(&self) -> bool {
        self.peer_errors
    }

    /// The current timeout of receives and sends.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Ends the process with exit status `code` after a failure, like
    /// [`MpiComm::exit_after_failure`]: shuts UCX down (closing endpoints at once), then
    /// leaves through the MPI bootstrap, which lets every rank report before `mpirun` tears
    /// the job down, and exits without waiting more than `grace`.
    pub fn exit_after_failure(mut self, code: i32, grace: Duration) -> ! {
        let mpi = self.mpi.take();
        std::thread::spawn(move || {
            std::thread::sleep(grace + Duration::from_secs(1));
            use std::io::Write;
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            // SAFETY: _exit ends the process at once; nothing runs after it.
            unsafe { libc::_exit(code) }
        });
        drop(self);
        match mpi {
            Some(mpi) => mpi.exit_after_failure(code, grace),
            None => std::process::exit(code),
        }
    }

    fn backoff(&self, hot: bool) -> Backoff {
        Backoff::with_spin(hot, self.spin)
    }

    fn ucx(&self) -> Result<&Ucx> {
        self.check_state()?;
        self.ucx
            .as_ref()
            .ok_or_else(|| TransportError::Ucx("the transport was shut down".into()))
    }

    /// Fails fast when an earlier failure is known.
    fn check_state(&self) -> Result<()> {
        match &*self.state.borrow() {
            State::Ok => Ok(()),
            State::Failed { rank, message } => Err(TransportError::PeerFailed {
                rank: *rank,
                message: message.clone(),
            }),
            State::Broken(why) => Err(TransportError::Ucx(why.clone())),
        }
    }

    fn mark_broken(&self, why: String) {
        let mut state = self.state.borrow_mut();
        if !matches!(*state, State::Broken(_)) {
            *state = State::Broken(why);
        }
    }

    /// Records a peer's abort notice and returns it as an error.
    fn peer_failed(&self, rank: usize, notice: &[u8]) -> TransportError {
        let message = String::from_utf8_lossy(notice).into_owned();
        let mut state = self.state.borrow_mut();
        if matches!(*state, State::Ok) {
            *state = State::Failed {
                rank,
                message: message.clone(),
            };
        }
        TransportError::PeerFailed { rank, message }
    }

    /// The error of `peer`'s endpoint, if UCX reported one.
    fn endpoint_failed(&self, peer: usize) -> Option<TransportError> {
        let status = self.slots.get(peer)?.status.get();
        (status != sys::UCS_OK).then_some(TransportError::Disconnected { peer })
    }

    fn timeout_error(&self, peer: usize, tag: Tag) -> TransportError {
        TransportError::Timeout {
            me: self.rank,
            peer,
            tag,
            secs: self.timeout.as_secs(),
        }
    }

    fn endpoint(&self, ucx: &Ucx, peer: usize) -> Result<Endpoint> {
        ucx.endpoints
            .borrow()
            .get(peer)
            .copied()
            .flatten()
            .ok_or(TransportError::Disconnected { peer })
    }

    /// Looks for an abort notice, even behind other messages, and turns it into an error.
    fn poll_abort(&self, ucx: &Ucx) -> Result<()> {
        ucx.worker.progress();
        if let Some(probed) = ucx.worker.probe(ABORT_TAG as u64, u32::MAX as u64) {
            let (src, _) = decode_tag(probed.tag);
            let notice = self.receive(ucx, &probed)?;
            return Err(self.peer_failed(src, &notice));
        }
        Ok(())
    }

    /// Takes in every message that has arrived: abort notices (an error) and messages,
    /// which go to the mailbox.
    fn progress(&self, ucx: &Ucx) -> Result<()> {
        while ucx.worker.progress() > 0 {}
        while let Some(probed) = ucx.worker.probe(0, 0) {
            let (src, tag) = decode_tag(probed.tag);
            let message = self.receive(ucx, &probed)?;
            if src >= self.size || src == self.rank {
                let error = TransportError::Ucx(format!(
                    "a message claims to come from rank {src} (tag {tag:#x}); this is rank {} \
                     of {}",
                    self.rank, self.size
                ));
                self.mark_broken(format!("protocol error: {error}"));
                return Err(error);
            }
            if tag == ABORT_TAG {
                return Err(self.peer_failed(src, &message));
            }
            self.inbox
                .borrow_mut()
                .entry((src, tag))
                .or_default()
                .push_back(message);
        }
        Ok(())
    }

    /// Receives a probed message into a buffer of its length, polling without sleeping.
    fn receive(&self, ucx: &Ucx, probed: &ucp::Probed) -> Result<Vec<u8>> {
        let (src, tag) = decode_tag(probed.tag);
        // Zeroed allocation: a large one comes straight from the kernel, already zero.
        let mut buf = vec![0u8; probed.len];
        // SAFETY: buf stays alive and untouched until the request completes; if it is
        // abandoned unfinished, buf is leaked below.
        let op = unsafe { ucx.worker.msg_recv(probed, &mut buf) };
        let mut request = match op {
            Op::Done => return Ok(buf),
            Op::Failed(status) => return Err(self.receive_failed(src, tag, status)),
            Op::Pending(r) => r,
        };
        let mut backoff = self.backoff(true);
        loop {
            ucx.worker.progress();
            request = match request.check() {
                Ok(status) if status == sys::UCS_OK => return Ok(buf),
                Ok(status) => return Err(self.receive_failed(src, tag, status)),
                Err(pending) => pending,
            };
            let failed = if let Some(e) = self.endpoint_failed(src) {
                Some(e)
            } else if backoff.elapsed() >= self.timeout {
                Some(self.timeout_error(src, tag))
            } else {
                None
            };
            if let Some(error) = failed {
                let request = self.abandon(ucx, src, request);
                if request.is_some() {
                    // UCX may still write into the buffer: it must stay allocated.
                    std::mem::forget(buf);
                    request.into_iter().for_each(Request::leave);
                    self.mark_broken(format!(
                        "a receive of {} bytes from rank {src} (tag {tag:#x}) was abandoned: \
                         {error}",
                        probed.len
                    ));
                }
                return Err(error);
            }
            backoff.pause(true);
        }
    }

    fn receive_failed(&self, src: usize, tag: Tag, status: sys::ucs_status_t) -> TransportError {
        self.endpoint_failed(src).unwrap_or_else(|| {
            ucx_error(&format!("receiving from rank {src} (tag {tag:#x})"), status)
        })
    }

    /// Gives up on `request` with `peer`: force-closes the endpoint to the peer, which
    /// completes its operations, and waits briefly for the request. Returns it when it is
    /// still pending (its memory must then stay valid for ever).
    fn abandon(&self, ucx: &Ucx, peer: usize, request: Request) -> Option<Request> {
        if let Some(slot) = self.slots.get(peer) {
            if slot.status.get() == sys::UCS_OK {
                slot.status.set(sys::UCS_ERR_CANCELED);
            }
        }
        let ep = ucx
            .endpoints
            .borrow_mut()
            .get_mut(peer)
            .and_then(Option::take);
        let mut close = match ep.map(|ep| ucx.worker.close(ep, true)) {
            Some(Op::Pending(r)) => Some(r),
            _ => None,
        };
        let mut request = Some(request);
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline && (request.is_some() || close.is_some()) {
            ucx.worker.progress();
            request = request.and_then(|r| r.check().err());
            close = close.and_then(|r| r.check().err());
            std::thread::yield_now();
        }
        close.into_iter().for_each(Request::leave);
        request
    }

    fn take_ready(&self, src: usize, tag: Tag) -> Option<Vec<u8>> {
        self.inbox
            .borrow_mut()
            .get_mut(&(src, tag))
            .and_then(VecDeque::pop_front)
    }

    /// Closes every endpoint (flushing them when `flush`), waiting at most
    /// [`CLOSE_LINGER`], then destroys the worker and the context.
    fn shut_down(&mut self, flush: bool) {
        let Some(ucx) = self.ucx.take() else {
            return;
        };
        if matches!(*self.state.borrow(), State::Broken(_)) {
            // Pending operations may still refer to memory that is gone or in use: leave
            // everything to the end of the process.
            std::mem::forget(ucx);
            return;
        }
        let endpoints = std::mem::take(&mut *ucx.endpoints.borrow_mut());
        let mut closing = Vec::new();
        for (peer, ep) in endpoints.into_iter().enumerate() {
            let Some(ep) = ep else { continue };
            let healthy = self.slots[peer].status.get() == sys::UCS_OK;
            if let Op::Pending(r) = ucx.worker.close(ep, !(flush && healthy)) {
                closing.push(r);
            }
        }
        let deadline = Instant::now() + CLOSE_LINGER;
        let mut backoff = self.backoff(false);
        while !closing.is_empty() && Instant::now() < deadline {
            ucx.worker.progress();
            closing = closing
                .into_iter()
                .filter_map(|r| r.check().err())
                .collect();
            backoff.pause(false);
        }
        if !closing.is_empty() {
            // Endpoints that would not close in time: leave UCX to the end of the process.
            closing.into_iter().for_each(Request::leave);
            std::mem::forget(ucx);
            return;
        }
        drop(ucx);
    }
}

impl Comm for UcxComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn name(&self) -> &'static str {
        "ucx"
    }

    fn library(&self) -> Option<String> {
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: writes three integers through the pointers given; no other state.
        unsafe { sys::ucp_get_version(&mut major, &mut minor, &mut release) };
        let mpi = mpi::environment::library_version().ok();
        Some(format!(
            "UCX {major}.{minor}.{release}{}",
            mpi.map(|v| format!(" over {}", v.trim()))
                .unwrap_or_default()
        ))
    }

    fn send_raw(&self, dest: usize, tag: Tag, data: &[u8]) -> Result<()> {
        self.check_rank(dest)?;
        let ucx = self.ucx()?;
        if dest == self.rank {
            self.inbox
                .borrow_mut()
                .entry((dest, tag))
                .or_default()
                .push_back(data.to_vec());
            return Ok(());
        }
        if let Some(e) = self.endpoint_failed(dest) {
            return Err(e);
        }
        let ep = self.endpoint(ucx, dest)?;
        // SAFETY: `data` is borrowed until this call returns; the request completes before
        // that, or is abandoned (endpoint force-closed) — and if even that leaves it
        // pending, the transport is marked broken and never calls UCX again.
        let op = unsafe { ucx.worker.tag_send(ep, data, encode_tag(self.rank, tag)) };
        let mut request = match op {
            Op::Done => return Ok(()),
            Op::Failed(status) => {
                return Err(self.endpoint_failed(dest).unwrap_or_else(|| {
                    ucx_error(&format!("sending to rank {dest} (tag {tag:#x})"), status)
                }))
            }
            Op::Pending(r) => r,
        };
        // A large message (rendezvous) moves only while both ranks call UCX: poll it
        // without sleeping.
        let mut backoff = self.backoff(data.len() > HOT_SEND_BYTES);
        loop {
            let step = self.progress(ucx);
            request = match request.check() {
                Ok(status) if status == sys::UCS_OK => return step,
                Ok(status) => {
                    return Err(self.endpoint_failed(dest).unwrap_or_else(|| {
                        ucx_error(&format!("sending to rank {dest} (tag {tag:#x})"), status)
                    }))
                }
                Err(pending) => pending,
            };
            let failed = match step {
                Err(e) => Some(e),
                Ok(()) => {
                    if let Some(e) = self.endpoint_failed(dest) {
                        Some(e)
                    } else if backoff.elapsed() >= self.timeout {
                        Some(self.timeout_error(dest, tag))
                    } else {
                        None
                    }
                }
            };
            if let Some(error) = failed {
                if let Some(r) = self.abandon(ucx, dest, request) {
                    r.leave();
                    self.mark_broken(format!(
                        "a send of {} bytes to rank {dest} (tag {tag:#x}) was abandoned: {error}",
                        data.len()
                    ));
                }
                return Err(error);
            }
            backoff.pause(false);
        }
    }

    fn recv_raw(&self, src: usize, tag: Tag) -> Result<Vec<u8>> {
        self.check_rank(src)?;
        let ucx = self.ucx()?;
        let mut backoff = self.backoff(false);
        loop {
            // Abort notices first, as in LocalComm.
            self.progress(ucx)?;
            if let Some(message) = self.take_ready(src, tag) {
                return Ok(message);
            }
            // Nobody else can send this rank's messages to itself: waiting cannot help.
            if src == self.rank || backoff.elapsed() >= self.timeout {
                return Err(self.timeout_error(src, tag));
            }
            if let Some(e) = self.endpoint_failed(src) {
                return Err(e);
            }
            backoff.pause(false);
        }
    }

    fn abort(&self, message: &str) {
        {
            let mut state = self.state.borrow_mut();
            match *state {
                // The original failure was already announced by the rank where it happened.
                State::Failed { .. } => return,
                // No more UCX calls; peers learn of the failure from the launcher.
                State::Broken(_) => return,
                State::Ok => {}
            }
            *state = State::Failed {
                rank: self.rank,
                message: message.to_string(),
            };
        }
        let Some(ucx) = self.ucx.as_ref() else {
            return;
        };
        let mut end = message.len().min(ABORT_MESSAGE_MAX);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        // Leaked on purpose: a notice that cannot leave before the linger ends stays with
        // UCX, and abort happens at most once per rank.
        let notice: &'static [u8] =
            Box::leak(message.as_bytes()[..end].to_vec().into_boxed_slice());
        let mut pending = Vec::new();
        for dest in (0..self.size).filter(|&d| d != self.rank) {
            if self.endpoint_failed(dest).is_some() {
                continue;
            }
            let Ok(ep) = self.endpoint(ucx, dest) else {
                continue;
            };
            // SAFETY: the notice is 'static.
            if let Op::Pending(r) = unsafe {
                ucx.worker
                    .tag_send(ep, notice, encode_tag(self.rank, ABORT_TAG))
            } {
                pending.push(r);
            }
        }
        let deadline = Instant::now() + ABORT_LINGER;
        let mut backoff = self.backoff(false);
        while !pending.is_empty() && Instant::now() < deadline {
            ucx.worker.progress();
            pending = pending
                .into_iter()
                .filter_map(|r| r.check().err())
                .collect();
            backoff.pause(false);
        }
        // Notices still pending stay with UCX (their buffer is 'static).
        pending.into_iter().for_each(Request::leave);
        // Also over the bootstrap: a peer that finished its work waits there, in the
        // closing barrier, and no longer listens to UCX.
        if let Some(mpi) = &self.mpi {
            mpi.abort(message);
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        if let Some(mpi) = self.mpi.as_mut() {
            mpi.set_timeout(timeout);
        }
    }

    fn peer_failure(&self, wait: Duration) -> Option<(usize, String)> {
        let deadline = Instant::now() + wait;
        loop {
            let step = self
                .check_state()
                .and_then(|()| self.ucx())
                .and_then(|ucx| self.poll_abort(ucx));
            if let Err(TransportError::PeerFailed { rank, message }) = step {
                return Some((rank, message));
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

impl Drop for UcxComm {
    fn drop(&mut self) {
        if std::thread::panicking() && matches!(*self.state.borrow(), State::Ok) {
            self.abort(&format!("rank {} panicked", self.rank));
        }
        let clean = matches!(*self.state.borrow(), State::Ok);
        if clean {
            // Nobody closes an endpoint that a peer may still use: meet first (over MPI,
            // which is idle), then close with flushing.
            if let Some(mpi) = self.mpi.as_mut() {
                let timeout = mpi.timeout();
                mpi.set_timeout(CLOSE_BARRIER_TIMEOUT.min(timeout));
                let _ = mpi.barrier();
                mpi.set_timeout(timeout);
            }
        }
        self.shut_down(clean);
        // The MPI bootstrap (when still here) is dropped after this: MPI_Finalize.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_carry_sender_and_rankwise_tag() {
        for (src, tag) in [
            (0usize, 0u32),
            (3, 17),
            (4095, ABORT_TAG),
            (1, crate::RESERVED_TAG_BASE),
        ] {
            assert_eq!(decode_tag(encode_tag(src, tag)), (src, tag));
        }
        // An abort notice is found by its low 32 bits whatever the sender.
        let mask = u32::MAX as u64;
        assert_eq!(encode_tag(7, ABORT_TAG) & mask, ABORT_TAG as u64);
        assert_ne!(encode_tag(7, 5) & mask, ABORT_TAG as u64);
    }

    #[test]
    fn status_codes_have_words() {
        assert!(!status_text(sys::UCS_ERR_CONNECTION_RESET).is_empty());
    }
}
