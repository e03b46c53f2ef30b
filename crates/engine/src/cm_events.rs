//! rdma_cm-style asynchronous connection events over the blocking
//! connection manager ([`crate::cm`]).
//!
//! An [`EventChannel`] (`rdma_event_channel`) is a pollable file descriptor
//! (an eventfd) plus a queue of [`CmEvent`]s. Connection identifiers
//! ([`CmId`], `rdma_cm_id`) are created on a channel and report there:
//!
//! * a **listening** id ([`EventChannel::listen`], [`CmId::listen`]) runs
//!   acceptor threads that take TCP connections and read the MPA Request,
//!   then queue [`CmEvent::ConnectRequest`] carrying a new **child** id that
//!   holds the pending request; the application [`CmId::accept`]s it onto a
//!   QP (queues [`CmEvent::Established`] for the child) or [`CmId::reject`]s
//!   it with private data;
//! * an **active** id ([`EventChannel::connect`], [`CmId::connect`]) runs
//!   the MPA exchange on a thread and queues `Established` (with the peer's
//!   private data), `Rejected` (with the peer's reject private data),
//!   `Unreachable` or `ConnectError`;
//! * [`CmId::disconnect`] queues `Disconnected` for the local id; the peer's
//!   id gets `Disconnected` when its QP's connection goes down
//!   (`RDMA_CM_EVENT_DISCONNECTED`), as do ids whose link fails otherwise.
//!
//! Design choices:
//!
//! * **Ids are `Arc` handles.** [`CmId`] is a cheap `Clone` handle compared
//!   by [`CmId::number`], a process-unique `u64` the C ABI can
//!   key its `rdma_cm_id` structures by. Events own a clone of the id they
//!   are about, so `ev.id().accept(..)` works directly. Events are owned
//!   values: nothing to acknowledge (`rdma_ack_cm_event` is the C layer's
//!   business).
//! * **Lifetimes.** Ids refer to their channel weakly: events for a dropped
//!   channel are discarded. An id refers to its QP weakly (the application
//!   owns the [`Qp`]); dropping a connected QP counts as the link going
//!   down. A connected id is kept alive by the disconnect watcher until its
//!   `Disconnected` event is queued, so that event always arrives even if
//!   the application dropped its handles. Dropping the last handle of an id
//!   is [`CmId::destroy`]: a listener stops, a pending request is rejected.
//! * **The fd is readable exactly while events are queued.** The eventfd is
//!   signalled on every push and drained when the queue empties, both under
//!   the queue lock.
//! * **Acceptors.** A listening id runs up to [`ACCEPTORS`] threads that
//!   take TCP connections from the same socket (one at a time) and read
//!   their MPA Requests in parallel, so a slow or silent initiator holds up
//!   at most one of them (for the MPA timeout) instead of every request
//!   behind it.
//! * **Order.** Connection requests are reported in the order the TCP
//!   connections were accepted, and one process's [`CmId::connect`]s make
//!   their TCP connections in the order they were called (each waits until
//!   the one called before it is connected or failed). Applications that
//!   connect several QPs one after the other and pair them by the order of
//!   `CONNECT_REQUEST` on the server (perftest `-R -q N`: its iWARP credit
//!   writes target the peer QP of the same index) rely on this; kernel
//!   rdma_cm keeps that order too. A predecessor that takes longer than
//!   [`ORDER_WAIT`] (a silent initiator, a remote host that does not
//!   answer) is not waited for beyond that. Requests that fail MPA are dropped
//!   silently, as rdma_cm does. Destroying the listener shuts the listening
//!   socket down (`shutdown(SHUT_RD)`), which wakes the blocked `accept`s
//!   and refuses new connections at once. The listen backlog is applied
//!   with a second `listen(2)` on the bound socket.
//! * **Observing a link going down: a watcher that polls
//!   [`Qp::link_state`].** One process-wide thread looks at the connected
//!   ids every [`DISCONNECT_POLL`] (20 ms) and sleeps on a condition
//!   variable, with no wake-ups at all, while no id is connected. No busy
//!   loop, no change to the QP code, and no theft from the context's async
//!   event queue (which belongs to the application's
//!   `ibv_get_async_event`). The price is up to 20 ms of latency on a
//!   *peer's* disconnect (a local [`CmId::disconnect`] reports at once). A
//!   push hook in the QP (a callback run when `flush` sees the link enter
//!   the error state) would remove the latency; it is one function
//!   (`link_down::watch`) to swap.
//!
//! Failures of an active connect map to events as the kernel's iWARP
//! connection manager maps its providers' connect replies
//! (`cma_iw_handler`: -ECONNREFUSED and -ECONNRESET are `REJECTED`,
//! -ETIMEDOUT is `UNREACHABLE`, anything else `CONNECT_ERROR`, the errno
//! kept as the status): the TCP connection could not be made (host or
//! network unreachable, connect timeout) → [`CmEvent::Unreachable`]; the
//! peer refused it (nothing listens on the port) → [`CmEvent::Rejected`]
//! with no private data, status `-ECONNREFUSED` (Linux siw fails
//! `rdma_connect` itself instead, its TCP connect being synchronous). A
//! refusal is first tried
//! again for `Config::connect_retry` (`SOFTRDMA_CONNECT_RETRY_MS`, 1 s by
//! default): perftest's `-R` server closes the listener of its parameter
//! exchange and opens another on the same port for the test's QPs, and a
//! client that connects in between is refused; perftest then retries with
//! ids it has already destroyed and crashes (seen as a rare CI hang of its
//! server, waiting for a client that had died). After TCP connected: the
//! peer answered the MPA Request with a reject → [`CmEvent::Rejected`],
//! status `-ECONNREFUSED`, with its private data; the peer closed or reset
//! the connection before its MPA Reply (or had closed it when the Request
//! was written: EPIPE) → [`CmEvent::Rejected`], status `-ECONNRESET`, no
//! private data (siw reports a close while it awaits the Reply so); no MPA
//! Reply within `Config::mpa_timeout` →
//! [`CmEvent::Unreachable`], status `-ETIMEDOUT` (siw's MPA timer);
//! anything else (an MPA protocol error, a local socket error) →
//! [`CmEvent::ConnectError`]. Every `status` is a negative errno, as in
//! `rdma_cm_event.status`.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread;
use std::time::{Duration, Instant};

use softrdma_proto::mpa::MpaError;

use crate::cm::{self, CmError, ConnParams, Incoming, Listener};
use crate::qp::QpShared;
use crate::sys::EventFd;
use crate::{Context, Qp, QpLinkState};

/// How often the watcher looks at connected ids' links (only while some id
/// is connected).
pub const DISCONNECT_POLL: Duration = Duration::from_millis(20);

/// Most acceptor threads per listening id.
pub const ACCEPTORS: usize = 4;

/// Pause of an acceptor after a listening-socket error that would repeat at
/// once (out of descriptors or memory).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Longest wait for an earlier connect or connection request to go first
/// (module docs, "Order").
pub const ORDER_WAIT: Duration = Duration::from_millis(250);

/// Tickets handed out in one order, whose holders then act in that order:
/// [`Order::wait_turn`] returns once every earlier ticket is
/// [`Order::done`] (or after a bounded wait).
#[derive(Debug)]
struct Order {
    st: Mutex<OrderState>,
    cv: Condvar,
}

#[derive(Debug)]
struct OrderState {
    next_ticket: u64,
    /// Every ticket below this one is done.
    done_below: u64,
    /// Done tickets above `done_below` (finished out of order).
    done: std::collections::BTreeSet<u64>,
}

impl Order {
    const fn new() -> Order {
        Order {
            st: Mutex::new(OrderState {
                next_ticket: 0,
                done_below: 0,
                done: std::collections::BTreeSet::new(),
            }),
            cv: Condvar::new(),
        }
    }

    /// The next ticket; it must be passed to [`Order::done`] once.
    fn ticket(&self) -> u64 {
        let mut st = lock(&self.st);
        let t = st.next_ticket;
        st.next_ticket += 1;
        t
    }

    /// Waits until every ticket before `t` is done, at most `max`.
    fn wait_turn(&self, t: u64, max: Duration) {
        let deadline = Instant::now() + max;
        let mut st = lock(&self.st);
        while st.done_below < t {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Ticket `t` has acted (or given up).
    fn done(&self, t: u64) {
        let mut st = lock(&self.st);
        st.done.insert(t);
        loop {
            let below = st.done_below;
            if !st.done.remove(&below) {
                break;
            }
            st.done_below += 1;
        }
        drop(st);
        self.cv.notify_all();
    }
}

/// The order of this process's [`CmId::connect`]s.
static CONNECTS: Order = Order::new();

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ----------------------------------------------------------------------
// Event kinds and events
// ----------------------------------------------------------------------

/// rdma_cm's event types (`enum rdma_cm_event_type`), with its numbering.
/// This module produces `ConnectRequest`, `ConnectError`, `Unreachable`,
/// `Rejected`, `Established` and `Disconnected`; the others are listed for
/// the C ABI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED` (0).
    AddrResolved = 0,
    /// `RDMA_CM_EVENT_ADDR_ERROR` (1).
    AddrError = 1,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED` (2).
    RouteResolved = 2,
    /// `RDMA_CM_EVENT_ROUTE_ERROR` (3).
    RouteError = 3,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST` (4).
    ConnectRequest = 4,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE` (5).
    ConnectResponse = 5,
    /// `RDMA_CM_EVENT_CONNECT_ERROR` (6).
    ConnectError = 6,
    /// `RDMA_CM_EVENT_UNREACHABLE` (7).
    Unreachable = 7,
    /// `RDMA_CM_EVENT_REJECTED` (8).
    Rejected = 8,
    /// `RDMA_CM_EVENT_ESTABLISHED` (9).
    Established = 9,
    /// `RDMA_CM_EVENT_DISCONNECTED` (10).
    Disconnected = 10,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL` (11).
    DeviceRemoval = 11,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN` (12).
    MulticastJoin = 12,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR` (13).
    MulticastError = 13,
    /// `RDMA_CM_EVENT_ADDR_CHANGE` (14).
    AddrChange = 14,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT` (15).
    TimewaitExit = 15,
}

impl CmEventKind {
    const ALL: [CmEventKind; 16] = [
        CmEventKind::AddrResolved,
        CmEventKind::AddrError,
        CmEventKind::RouteResolved,
        CmEventKind::RouteError,
        CmEventKind::ConnectRequest,
        CmEventKind::ConnectResponse,
        CmEventKind::ConnectError,
        CmEventKind::Unreachable,
        CmEventKind::Rejected,
        CmEventKind::Established,
        CmEventKind::Disconnected,
        CmEventKind::DeviceRemoval,
        CmEventKind::MulticastJoin,
        CmEventKind::MulticastError,
        CmEventKind::AddrChange,
        CmEventKind::TimewaitExit,
    ];

    /// The `rdma_cm_event_type` value.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The kind with rdma_cm number `code`.
    pub fn from_code(code: u32) -> Option<CmEventKind> {
        Self::ALL.get(code as usize).copied()
    }

    /// The C name, as `rdma_event_str` spells it.
    pub const fn name(self) -> &'static str {
        match self {
            CmEventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

/// A connection event, owning the id it is about.
#[derive(Debug)]
pub enum CmEvent {
    /// A connection request arrived on a listening id.
    ConnectRequest {
        /// A new id holding the request: [`CmId::accept`] or
        /// [`CmId::reject`] it (dropping every handle rejects it).
        id: CmId,
        /// The listening id it arrived on (`rdma_cm_event.listen_id`).
        listener: CmId,
        /// The initiator's private data.
        private_data: Vec<u8>,
        /// The initiator's address.
        peer: SocketAddr,
        /// The initiator's inbound RDMA Read depth (MPA v2; 0 if it sent
        /// none).
        ird: u16,
        /// The initiator's outbound RDMA Read depth (MPA v2; 0 if it sent
        /// none).
        ord: u16,
    },
    /// The connection is up; the QP may be used.
    Established {
        /// The id.
        id: CmId,
        /// The peer's private data (the responder's, on the active side;
        /// empty on the passive side).
        private_data: Vec<u8>,
    },
    /// The peer rejected the connection request or refused its TCP
    /// connection (no listener on the port, after the connect retry):
    /// status `-ECONNREFUSED`; or it closed or reset the connection before
    /// its MPA Reply: status `-ECONNRESET`. The kernel's iWARP connection
    /// manager reports all three as `RDMA_CM_EVENT_REJECTED`.
    Rejected {
        /// The id.
        id: CmId,
        /// `-ECONNREFUSED` or `-ECONNRESET`.
        status: i32,
        /// The peer's reject private data (empty unless the peer sent an
        /// MPA reject).
        private_data: Vec<u8>,
    },
    /// The peer could not be reached (no route, connect timeout) or did
    /// not answer the MPA Request in time (status `-ETIMEDOUT`).
    Unreachable {
        /// The id.
        id: CmId,
        /// Negative errno.
        status: i32,
        /// What went wrong.
        reason: String,
    },
    /// Connection set-up failed for another reason (an MPA protocol
    /// error, a local socket error).
    ConnectError {
        /// The id.
        id: CmId,
        /// Negative errno.
        status: i32,
        /// What went wrong.
        reason: String,
    },
    /// The connection is gone: disconnected locally or by the peer, or the
    /// link failed.
    Disconnected {
        /// The id.
        id: CmId,
    },
}

impl CmEvent {
    /// The id the event is about (for `ConnectRequest`, the new child id).
    pub fn id(&self) -> &CmId {
        match self {
            CmEvent::ConnectRequest { id, .. }
            | CmEvent::Established { id, .. }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id, .. }
            | CmEvent::ConnectError { id, .. }
            | CmEvent::Disconnected { id } => id,
        }
    }

    /// The event's kind.
    pub fn kind(&self) -> CmEventKind {
        match self {
            CmEvent::ConnectRequest { .. } => CmEventKind::ConnectRequest,
            CmEvent::Established { .. } => CmEventKind::Established,
            CmEvent::Rejected { .. } => CmEventKind::Rejected,
            CmEvent::Unreachable { .. } => CmEventKind::Unreachable,
            CmEvent::ConnectError { .. } => CmEventKind::ConnectError,
            CmEvent::Disconnected { .. } => CmEventKind::Disconnected,
        }
    }

    /// The `rdma_cm_event_type` number (`rdma_cm_event.event`).
    pub fn rdma_cm_event(&self) -> u32 {
        self.kind().code()
    }

    /// `rdma_cm_event.status`: 0, or a negative errno (`-ECONNREFUSED` for
    /// a reject or a refused connection, `-ECONNRESET` for a peer that
    /// closed before its MPA Reply, as iWARP reports them).
    pub fn status(&self) -> i32 {
        match self {
            CmEvent::Rejected { status, .. }
            | CmEvent::Unreachable { status, .. }
            | CmEvent::ConnectError { status, .. } => *status,
            _ => 0,
        }
    }

    /// The private data the event carries (empty if none).
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmEvent::ConnectRequest { private_data, .. }
            | CmEvent::Established { private_data, .. }
            | CmEvent::Rejected { private_data, .. } => private_data,
            _ => &[],
        }
    }
}

// ----------------------------------------------------------------------
// The channel
// ----------------------------------------------------------------------

#[derive(Debug)]
struct Chan {
    efd: EventFd,
    queue: Mutex<VecDeque<CmEvent>>,
}

impl Chan {
    fn push(&self, ev: CmEvent) {
        let mut q = lock(&self.queue);
        q.push_back(ev);
        self.efd.signal();
    }
}

/// An event channel (`rdma_event_channel`): a pollable descriptor that is
/// readable while events are queued, and the queue. Clones share it.
#[derive(Debug, Clone)]
pub struct EventChannel {
    chan: Arc<Chan>,
}

impl EventChannel {
    /// A new, empty channel (`rdma_create_event_channel`).
    pub fn new() -> io::Result<EventChannel> {
        Ok(EventChannel {
            chan: Arc::new(Chan {
                efd: EventFd::new()?,
                queue: Mutex::new(VecDeque::new()),
            }),
        })
    }

    /// The pollable descriptor: readable while an event is queued.
    pub fn fd(&self) -> RawFd {
        self.chan.efd.as_raw_fd()
    }

    /// The next event, without waiting.
    pub fn try_get_event(&self) -> Option<CmEvent> {
        let mut q = lock(&self.chan.queue);
        let ev = q.pop_front();
        if q.is_empty() {
            self.chan.efd.drain();
        }
        ev
    }

    /// The next event, waiting up to `timeout` (`None`: for ever;
    /// `rdma_get_cm_event`). `None` on timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> Option<CmEvent> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            if let Some(ev) = self.try_get_event() {
                return Some(ev);
            }
            let left = match (timeout, deadline) {
                (None, _) | (Some(_), None) => None,
                (Some(_), Some(d)) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    Some(left)
                }
            };
            poll_readable(self.fd(), left);
        }
    }

    /// A new idle id reporting to this channel (`rdma_create_id`,
    /// `RDMA_PS_TCP`).
    pub fn create_id(&self, ctx: &Context) -> CmId {
        CmId::new(ctx.clone(), Arc::downgrade(&self.chan), State::Idle, None)
    }

    /// A new id listening on `addr` (see [`CmId::listen`]).
    pub fn listen(
        &self,
        ctx: &Context,
        addr: impl ToSocketAddrs,
        backlog: u32,
    ) -> io::Result<CmId> {
        let id = self.create_id(ctx);
        id.listen(addr, backlog)?;
        Ok(id)
    }

    /// A new id connecting `qp` to `addr` (see [`CmId::connect`]).
    pub fn connect(
        &self,
        ctx: &Context,
        qp: &Qp,
        addr: SocketAddr,
        params: &ConnParams,
    ) -> Result<CmId, CmError> {
        let id = self.create_id(ctx);
        id.connect(qp, addr, params)?;
        Ok(id)
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

/// Waits until `fd` is readable or `timeout` passes (`None`: for ever).
/// Does not consume anything; spurious returns are fine for the callers.
fn poll_readable(fd: RawFd, timeout: Option<Duration>) {
    let ms = timeout
        .map(|d| d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32)
        .unwrap_or(-1);
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // `fd` is the channel's open eventfd (the caller holds the channel);
    // EINTR or errors just return early.
    // SAFETY: one live pollfd on an open descriptor (above).
    let _ = unsafe { libc::poll(&mut p, 1, ms) };
}

// ----------------------------------------------------------------------
// Ids
// ----------------------------------------------------------------------

/// Where an id is (see [`CmId::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmIdState {
    /// Created, unused.
    Idle,
    /// Listening for connection requests.
    Listening,
    /// A connection request waiting for accept or reject.
    ConnectRequest,
    /// Accepting (the MPA Reply is being sent).
    Accepting,
    /// Connecting (active side).
    Connecting,
    /// Connected.
    Connected,
    /// The connection is gone; `Disconnected` was queued.
    Disconnected,
    /// Rejected, destroyed, or accept failed.
    Closed,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The acceptor threads of a listening id.
#[derive(Debug)]
struct Acceptors {
    listener: Listener,
    stopped: AtomicBool,
    /// Held while taking a TCP connection, so tickets follow accept order.
    accepting: Mutex<()>,
    /// Requests are reported in accept order.
    order: Order,
}

impl Acceptors {
    /// Stops the acceptors: no new request is reported, blocked `accept`s
    /// return, new connections are refused.
    fn stop(&self) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            // The descriptor belongs to the listener, alive as long as `self`.
            // SAFETY: no pointers; an open descriptor (above).
            let _ = unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RD) };
        }
    }
}

#[derive(Debug)]
enum State {
    Idle,
    Listening(Arc<Acceptors>),
    Requested(Box<Incoming>),
    Accepting,
    Connecting(Weak<QpShared>),
    Connected(Weak<QpShared>),
    Disconnected,
    Closed,
}

#[derive(Debug)]
struct Core {
    state: State,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
}

#[derive(Debug)]
struct IdInner {
    number: u64,
    ctx: Context,
    chan: Weak<Chan>,
    core: Mutex<Core>,
}

impl IdInner {
    fn lock(&self) -> MutexGuard<'_, Core> {
        lock(&self.core)
    }

    fn emit(&self, ev: CmEvent) {
        if let Some(c) = self.chan.upgrade() {
            c.push(ev);
        }
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        let st = std::mem::replace(&mut self.lock().state, State::Closed);
        teardown(st);
    }
}

/// Releases what a state holds (`rdma_destroy_id`).
fn teardown(st: State) {
    match st {
        State::Listening(a) => a.stop(),
        State::Requested(inc) => {
            let _ = inc.reject(&[]);
        }
        State::Connected(w) => {
            if let Some(q) = w.upgrade() {
                Qp { inner: q }.disconnect();
            }
        }
        // A connect in flight sees the id closed and disconnects if it
        // still succeeds.
        State::Idle
        | State::Accepting
        | State::Connecting(_)
        | State::Disconnected
        | State::Closed => {}
    }
}

fn invalid(msg: &'static str) -> CmError {
    CmError::Io(io::Error::new(io::ErrorKind::InvalidInput, msg))
}

/// A connection identifier (`rdma_cm_id`): a cheap, clonable handle,
/// compared by [`CmId::number`] (key maps by that number: the handle itself
/// is not `Hash`).
#[derive(Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No lock here: ids are printed from places that may hold one.
        f.debug_tuple("CmId").field(&self.inner.number).finish()
    }
}

impl PartialEq for CmId {
    fn eq(&self, other: &Self) -> bool {
        self.inner.number == other.inner.number
    }
}

impl Eq for CmId {}

impl CmId {
    fn new(ctx: Context, chan: Weak<Chan>, state: State, peer: Option<SocketAddr>) -> CmId {
        CmId {
            inner: Arc::new(IdInner {
                number: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                ctx,
                chan,
                core: Mutex::new(Core {
                    state,
                    local: None,
                    peer,
                }),
            }),
        }
    }

    /// The id's process-unique number (never 0).
    pub fn number(&self) -> u64 {
        self.inner.number
    }

    /// The context the id was created in.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Where the id is.
    pub fn state(&self) -> CmIdState {
        match self.inner.lock().state {
            State::Idle => CmIdState::Idle,
            State::Listening(_) => CmIdState::Listening,
            State::Requested(_) => CmIdState::ConnectRequest,
            State::Accepting => CmIdState::Accepting,
            State::Connecting(_) => CmIdState::Connecting,
            State::Connected(_) => CmIdState::Connected,
            State::Disconnected => CmIdState::Disconnected,
            State::Closed => CmIdState::Closed,
        }
    }

    /// The address listened on (listening ids).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().local
    }

    /// The peer's address (connect requests and their children: the
    /// initiator; active ids: the address connected to).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.lock().peer
    }

    /// The QP connected (or being connected) through this id, while the
    /// application keeps it alive.
    pub fn qp(&self) -> Option<Qp> {
        match &self.inner.lock().state {
            State::Connecting(w) | State::Connected(w) => w.upgrade().map(|inner| Qp { inner }),
            _ => None,
        }
    }

    /// Listens on `addr` (port 0 picks one; `rdma_bind_addr` +
    /// `rdma_listen`) with room for `backlog` connections waiting in the
    /// kernel (0: the system maximum). Returns the bound address.
    /// Connection requests arrive as [`CmEvent::ConnectRequest`].
    pub fn listen(&self, addr: impl ToSocketAddrs, backlog: u32) -> io::Result<SocketAddr> {
        let mut core = self.inner.lock();
        if !matches!(core.state, State::Idle) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "listen: the id is in use",
            ));
        }
        let listener = Listener::bind(&self.inner.ctx, addr)?;
        let local = listener.local_addr()?;
        let depth = if backlog == 0 {
            libc::SOMAXCONN
        } else {
            backlog.min(i32::MAX as u32) as i32
        };
        // Linux accepts listen(2) again on a listening socket: it only
        // changes the backlog.
        // SAFETY: no pointers; the listener's open descriptor.
        if unsafe { libc::listen(listener.as_raw_fd(), depth) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let acc = Arc::new(Acceptors {
            listener,
            stopped: AtomicBool::new(false),
            accepting: Mutex::new(()),
            order: Order::new(),
        });
        let threads = if backlog == 0 {
            ACCEPTORS
        } else {
            ACCEPTORS.min(backlog as usize)
        };
        for i in 0..threads {
            let (a, id) = (acc.clone(), Arc::downgrade(&self.inner));
            let spawned = thread::Builder::new()
                .name("softrdma-cm-accept".into())
                .spawn(move || run_acceptor(&a, &id));
            if let Err(e) = spawned {
                if i == 0 {
                    acc.stop();
                    return Err(e);
                }
                break;
            }
        }
        core.state = State::Listening(acc);
        core.local = Some(local);
        Ok(local)
    }

    /// Connects `qp` to a listener at `addr` (`rdma_connect`). Returns once
    /// the attempt is under way; its outcome arrives as
    /// [`CmEvent::Established`], [`CmEvent::Rejected`],
    /// [`CmEvent::Unreachable`] or [`CmEvent::ConnectError`]. Fails at once
    /// if the id is not idle or the QP is already connected.
    pub fn connect(&self, qp: &Qp, addr: SocketAddr, params: &ConnParams) -> Result<(), CmError> {
        if qp.link_state() != QpLinkState::Unconnected {
            return Err(CmError::Busy);
        }
        {
            let mut core = self.inner.lock();
            if !matches!(core.state, State::Idle) {
                return Err(invalid("connect: the id is in use"));
            }
            core.state = State::Connecting(Arc::downgrade(&qp.inner));
            core.peer = Some(addr);
        }
        let (id, qp2, params) = (self.clone(), qp.clone(), params.clone());
        // Taken on the caller's thread: connects start in call order.
        let ticket = CONNECTS.ticket();
        let spawned = thread::Builder::new()
            .name("softrdma-cm-connect".into())
            .spawn(move || id.run_connect(&qp2, addr, &params, ticket));
        if let Err(e) = spawned {
            CONNECTS.done(ticket);
            self.inner.lock().state = State::Idle;
            return Err(CmError::Io(e));
        }
        Ok(())
    }

    fn run_connect(&self, qp: &Qp, addr: SocketAddr, params: &ConnParams, ticket: u64) {
        CONNECTS.wait_turn(ticket, ORDER_WAIT);
        let res = cm::connect_then(&self.inner.ctx, qp, addr, params, || CONNECTS.done(ticket));
        let mut core = self.inner.lock();
        let ours = matches!(&core.state,
            State::Connecting(w) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(&qp.inner)));
        match res {
            Ok(private_data) if ours => {
                core.state = State::Connected(Arc::downgrade(&qp.inner));
                self.inner.emit(CmEvent::Established {
                    id: self.clone(),
                    private_data,
                });
                drop(core);
                link_down::watch(self.clone());
            }
            // Destroyed while connecting: undo.
            Ok(_) => {
                drop(core);
                qp.disconnect();
            }
            Err(e) if ours => {
                // The QP was never attached: the id may connect again.
                core.state = State::Idle;
                self.inner.emit(failure_event(self.clone(), e));
            }
            Err(_) => {}
        }
    }

    /// Accepts the connection request this id holds onto `qp`
    /// (`rdma_accept`) with our private data and depths; queues
    /// [`CmEvent::Established`] for this id. The request is consumed even
    /// if the MPA Reply cannot be sent (the id is then closed); a QP that
    /// is already connected is refused first, the request kept.
    pub fn accept(&self, qp: &Qp, params: &ConnParams) -> Result<(), CmError> {
        if qp.link_state() != QpLinkState::Unconnected {
            return Err(CmError::Busy);
        }
        let inc = {
            let mut core = self.inner.lock();
            match std::mem::replace(&mut core.state, State::Accepting) {
                State::Requested(inc) => inc,
                other => {
                    core.state = other;
                    return Err(invalid("accept: no connection request on this id"));
                }
            }
        };
        let res = inc.accept(qp, params);
        let mut core = self.inner.lock();
        let ours = matches!(core.state, State::Accepting);
        match res {
            Ok(()) if ours => {
                core.state = State::Connected(Arc::downgrade(&qp.inner));
                self.inner.emit(CmEvent::Established {
                    id: self.clone(),
                    private_data: Vec::new(),
                });
                drop(core);
                link_down::watch(self.clone());
                Ok(())
            }
            Ok(()) => {
                drop(core);
                qp.disconnect();
                Err(invalid("accept: the id was destroyed"))
            }
            Err(e) => {
                if ours {
                    core.state = State::Closed;
                }
                Err(e)
            }
        }
    }

    /// Rejects the connection request this id holds (`rdma_reject`): an
    /// MPA Reply with the reject bit and `private_data`, then the TCP
    /// connection closes. No event is queued locally.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        let inc = {
            let mut core = self.inner.lock();
            match std::mem::replace(&mut core.state, State::Closed) {
                State::Requested(inc) => inc,
                other => {
                    core.state = other;
                    return Err(invalid("reject: no connection request on this id"));
                }
            }
        };
        inc.reject(private_data)
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to error (outstanding
    /// work is flushed), the TCP connection closes, and
    /// [`CmEvent::Disconnected`] is queued for this id; the peer gets its
    /// own. Nothing happens (and `Ok`) if the id is already disconnected.
    pub fn disconnect(&self) -> Result<(), CmError> {
        let qp = {
            let mut core = self.inner.lock();
            match std::mem::replace(&mut core.state, State::Disconnected) {
                State::Connected(w) => w,
                State::Disconnected => return Ok(()),
                other => {
                    core.state = other;
                    return Err(CmError::Io(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "disconnect: the id is not connected",
                    )));
                }
            }
        };
        if let Some(inner) = qp.upgrade() {
            Qp { inner }.disconnect();
        }
        self.inner.emit(CmEvent::Disconnected { id: self.clone() });
        Ok(())
    }

    /// Destroys the id (`rdma_destroy_id`): a listener stops listening
    /// (new connections are refused), a pending request is rejected, a
    /// connection is disconnected; no further event is queued for it.
    /// Dropping the last handle does the same.
    pub fn destroy(&self) {
        let st = std::mem::replace(&mut self.inner.lock().state, State::Closed);
        teardown(st);
    }
}

/// The event for a failed active connect.
fn failure_event(id: CmId, e: CmError) -> CmEvent {
    let status = -errno(&e);
    match e {
        CmError::Rejected(private_data) => CmEvent::Rejected {
            id,
            status,
            private_data,
        },
        // As the kernel's `cma_iw_handler`: a refused connection, and one
        // the peer closed or reset before its MPA Reply, are rejections
        // (status -ECONNREFUSED, -ECONNRESET), not unreachable peers. A
        // write that found the connection already closed (EPIPE) is the
        // same event seen from the sending side.
        CmError::Io(_) if matches!(-status, libc::ECONNREFUSED | libc::ECONNRESET) => {
            CmEvent::Rejected {
                id,
                status,
                private_data: Vec::new(),
            }
        }
        CmError::Io(_) if -status == libc::EPIPE => CmEvent::Rejected {
            id,
            status: -libc::ECONNRESET,
            private_data: Vec::new(),
        },
        // No MPA Reply in time: siw's MPA timer reports -ETIMEDOUT, which
        // the kernel makes UNREACHABLE.
        CmError::Mpa(MpaError::Timeout) => CmEvent::Unreachable {
            id,
            status,
            reason: e.to_string(),
        },
        CmError::Io(ref io) if unreachable(io) => CmEvent::Unreachable {
            id,
            status,
            reason: e.to_string(),
        },
        e => CmEvent::ConnectError {
            id,
            status,
            reason: e.to_string(),
        },
    }
}

/// True if a connect error says the peer could not be reached at all.
fn unreachable(e: &io::Error) -> bool {
    // `TcpStream::connect_timeout` reports its timeout as TimedOut with no
    // errno; timeouts of the MPA exchange are `MpaError::Timeout`.
    e.kind() == io::ErrorKind::TimedOut
        || matches!(
            e.raw_os_error(),
            Some(
                libc::EHOSTUNREACH
                    | libc::ENETUNREACH
                    | libc::EHOSTDOWN
                    | libc::ENETDOWN
                    | libc::EADDRNOTAVAIL
                    | libc::ETIMEDOUT
            )
        )
}

/// A positive errno for a CM error.
fn errno(e: &CmError) -> i32 {
    match e {
        CmError::Io(io) => io.raw_os_error().unwrap_or(match io.kind() {
            io::ErrorKind::TimedOut => libc::ETIMEDOUT,
            io::ErrorKind::UnexpectedEof => libc::ECONNRESET,
            _ => libc::EIO,
        }),
        CmError::Mpa(MpaError::Timeout) => libc::ETIMEDOUT,
        CmError::Mpa(_) => libc::EPROTO,
        CmError::Rejected(_) => libc::ECONNREFUSED,
        _ => libc::EINVAL,
    }
}

/// An acceptor thread: takes connection requests until the listener stops.
fn run_acceptor(acc: &Acceptors, listen_id: &Weak<IdInner>) {
    while !acc.stopped.load(Ordering::Acquire) {
        // One thread takes connections at a time, so tickets follow the
        // kernel's accept order; the MPA Requests are read in parallel.
        let accepted = {
            let _one = lock(&acc.accepting);
            if acc.stopped.load(Ordering::Acquire) {
                return;
            }
            acc.listener
                .accept_tcp()
                .map(|conn| (conn, acc.order.ticket()))
        };
        let ((sock, peer), ticket) = match accepted {
            Ok(x) => x,
            // The listener is out of descriptors or memory (or was shut
            // down): the error would repeat at once.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EINVAL)
                ) =>
            {
                if !acc.stopped.load(Ordering::Acquire) {
                    thread::sleep(ACCEPT_BACKOFF);
                }
                continue;
            }
            Err(_) => continue,
        };
        let res = acc.listener.handshake(sock, peer);
        // Requests are reported in accept order (module docs, "Order").
        acc.order.wait_turn(ticket, ORDER_WAIT);
        // A request that failed (bad MPA frame, silent or vanished
        // initiator) is dropped, as rdma_cm does.
        if let Ok(inc) = res {
            let Some(lid) = listen_id.upgrade() else {
                let _ = inc.reject(&[]);
                acc.order.done(ticket);
                return;
            };
            on_request(&lid, acc, inc);
        }
        acc.order.done(ticket);
    }
}

/// Reports a request that arrived on listening id `lid`.
fn on_request(lid: &Arc<IdInner>, acc: &Acceptors, inc: Incoming) {
    let core = lid.lock();
    let current = matches!(&core.state, State::Listening(a) if std::ptr::eq(Arc::as_ptr(a), acc));
    if !current || acc.stopped.load(Ordering::Acquire) {
        drop(core);
        let _ = inc.reject(&[]);
        return;
    }
    let peer = inc.peer_addr();
    let private_data = inc.private_data().to_vec();
    let (ird, ord) = inc
        .request()
        .ird_ord
        .map(|w| (w.ird, w.ord))
        .unwrap_or((0, 0));
    let child = CmId::new(
        lid.ctx.clone(),
        lid.chan.clone(),
        State::Requested(Box::new(inc)),
        Some(peer),
    );
    child.inner.lock().local = core.local;
    lid.emit(CmEvent::ConnectRequest {
        id: child,
        listener: CmId { inner: lid.clone() },
        private_data,
        peer,
        ird,
        ord,
    });
}

/// Noticing that a connected id's link went down (the peer disconnected,
/// the QP failed or was dropped) and queueing its `Disconnected`.
///
/// One process-wide watcher thread, started on first use, polls
/// [`Qp::link_state`] of every connected id every [`DISCONNECT_POLL`], and
/// waits on a condition variable (no wake-ups) while there is none. Ids are
/// held strongly while watched, so the event is delivered even if the
/// application dropped its handles; they leave the list when they stop
/// being connected.
///
/// Lock order: the watch list, then an id, then (through `link_state`) a
/// QP or (through `emit`) a channel queue. Nothing calls [`watch`] with an
/// id or QP lock held.
mod link_down {
    use super::*;

    struct List {
        ids: Vec<CmId>,
        started: bool,
    }

    static LIST: Mutex<List> = Mutex::new(List {
        ids: Vec::new(),
        started: false,
    });
    static WAKE: Condvar = Condvar::new();

    /// Watches a just-connected id.
    pub(super) fn watch(id: CmId) {
        let mut l = lock(&LIST);
        if !l.started {
            // If the thread cannot start now, the next call tries again.
            l.started = thread::Builder::new()
                .name("softrdma-cm-watch".into())
                .spawn(run)
                .is_ok();
        }
        l.ids.push(id);
        WAKE.notify_one();
    }

    fn run() {
        let mut l = lock(&LIST);
        loop {
            while l.ids.is_empty() {
                l = WAKE.wait(l).unwrap_or_else(|p| p.into_inner());
            }
            l.ids.retain(still_up);
            if !l.ids.is_empty() {
                drop(l);
                thread::sleep(DISCONNECT_POLL);
                l = lock(&LIST);
            }
        }
    }

    /// False (stop watching) if the id is no longer connected; queues
    /// `Disconnected` if its link went down.
    fn still_up(id: &CmId) -> bool {
        let mut core = id.inner.lock();
        let State::Connected(w) = &core.state else {
            return false;
        };
        let up = w
            .upgrade()
            .is_some_and(|inner| Qp { inner }.link_state() != QpLinkState::Error);
        if up {
            return true;
        }
        core.state = State::Disconnected;
        drop(core);
        id.inner.emit(CmEvent::Disconnected { id: id.clone() });
        false
    }
}
