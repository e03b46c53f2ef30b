//! The public, safe Rust verbs API of softrdma.
//!
//! The shape follows libibverbs: a [`Context`] gives [`ProtectionDomain`]s,
//! [`CompletionQueue`]s and [`CompletionChannel`]s; a protection domain
//! registers [`MemoryRegion`]s and creates [`QueuePair`]s; the [`cm`] module
//! connects queue pairs (rdma_cm semantics over iWARP/MPA). Datagram queue
//! pairs ([`UdQueuePair`], [`RdQueuePair`], with [`AddressHandle`]s) are in
//! [`dgram`].
//!
//! ```
//! use softrdma_verbs::{Access, Context, QpCaps};
//! let ctx = Context::open().unwrap();
//! let pd = ctx.alloc_pd();
//! let cq = ctx.create_cq(64, None);
//! let mr = pd.register(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
//! let qp = pd.create_qp(&cq, &cq, QpCaps::default());
//! mr.write_at(0, b"hello").unwrap();
//! assert_eq!(mr.len(), 4096);
//! assert!(qp.qpn() > 0);
//! ```
//!
//! Memory regions own their memory. Because peers may write into a region
//! at any time (that is what RDMA is), the API never hands out a Rust
//! reference into it: data goes in and out with [`MemoryRegion::write_at`]
//! and [`MemoryRegion::read_at`], which copy. The raw address is available
//! for work requests and for C interop.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use softrdma_engine::{AsyncEvent, Completion, QpCaps, QpLinkState};
pub use softrdma_proto::memory::Access;
pub use softrdma_proto::wr::{
    InlineData, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};

use softrdma_engine as engine;

pub mod qp_state;
pub use qp_state::{Destination, ModifyError, QpAttr, QpState};

pub mod dc;
pub mod dgram;
pub use dgram::{
    AddressHandle, AhError, DgramAddr, DgramError, RdPostError, RdQpOptions, RdQpStats,
    RdQueuePair, UdPostError, UdQpOptions, UdQpStats, UdQueuePair, WriteRecordInfo,
};

/// Why a device could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// A `SOFTRDMA_*` variable has an invalid value, or the system refused
    /// a resource (eventfd).
    Config(std::io::Error),
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Config(e) => write!(f, "cannot open the softrdma device: {e}"),
        }
    }
}

impl std::error::Error for OpenError {}

/// A softrdma device context.
#[derive(Debug, Clone)]
pub struct Context {
    inner: engine::Context,
}

/// QP numbers: unique in the process, never 0 (0 and 1 are special in IB).
static NEXT_QPN: AtomicU32 = AtomicU32::new(2);

impl Context {
    /// Opens the device, configured from the environment.
    pub fn open() -> Result<Context, OpenError> {
        Ok(Context {
            inner: engine::Context::new().map_err(OpenError::Config)?,
        })
    }

    /// A new protection domain.
    pub fn alloc_pd(&self) -> ProtectionDomain {
        ProtectionDomain {
            ctx: self.inner.clone(),
            pd: self.inner.alloc_pd(),
        }
    }

    /// A completion queue of `capacity` entries, optionally reporting to a
    /// completion channel.
    pub fn create_cq(
        &self,
        capacity: usize,
        channel: Option<&CompletionChannel>,
    ) -> CompletionQueue {
        CompletionQueue {
            cq: self
                .inner
                .create_cq(capacity, channel.map(|c| c.ch.clone())),
        }
    }

    /// A completion channel (a pollable file descriptor).
    pub fn create_comp_channel(&self) -> std::io::Result<CompletionChannel> {
        Ok(CompletionChannel {
            ch: engine::CompChannel::new()?,
        })
    }

    /// The next async event, waiting up to `timeout` (`None`: for ever).
    pub fn get_async_event(&self, timeout: Option<Duration>) -> Option<AsyncEvent> {
        self.inner.async_events().get(timeout)
    }

    /// The engine context (for the C ABI and tools in this workspace).
    pub fn engine(&self) -> &engine::Context {
        &self.inner
    }
}

/// A protection domain.
#[derive(Debug, Clone)]
pub struct ProtectionDomain {
    ctx: engine::Context,
    pd: u32,
}

/// Why a registration failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterError {
    /// REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE (verbs rule).
    InvalidAccess,
    /// Zero length, or the memory could not be allocated.
    InvalidLength,
    /// The registration table is full.
    TooMany,
}

impl ProtectionDomain {
    /// Allocates `len` zeroed octets (page aligned, an anonymous mapping
    /// whose pages become resident when first touched: [`engine::Pages`])
    /// and registers them.
    pub fn register(&self, len: usize, access: Access) -> Result<MemoryRegion, RegisterError> {
        if len == 0 {
            return Err(RegisterError::InvalidLength);
        }
        let mem = engine::Pages::zeroed(len).map_err(|_| RegisterError::InvalidLength)?;
        // SAFETY: `mem` is a live mapping of `len` octets that the
        // MemoryRegion keeps until after it deregisters it (Drop: the
        // deregistration comes first, the field is dropped after).
        let stag = unsafe {
            self.ctx
                .registry()
                .register(mem.as_ptr(), len, mem.as_ptr() as u64, access, self.pd)
        };
        match stag {
            Ok(stag) => Ok(MemoryRegion {
                ctx: self.ctx.clone(),
                mem,
                stag,
            }),
            Err(e) => Err(match e {
                engine::RegError::BadAccess => RegisterError::InvalidAccess,
                engine::RegError::TooMany => RegisterError::TooMany,
                engine::RegError::BadRange | engine::RegError::NoSuchStag => {
                    RegisterError::InvalidLength
                }
            }),
        }
    }

    /// An RC queue pair completing into `send_cq` and `recv_cq`, created in
    /// INIT (receives may be posted at once, as after `rdma_create_qp`).
    /// Its number makes it reachable IB-style (`(port << 8) | slot`); if no
    /// listener can be opened for that, it gets a plain number and an RTR
    /// transition with a destination will fail with a clear error.
    pub fn create_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> QueuePair {
        let (s, r) = (send_cq.cq.clone(), recv_cq.cq.clone());
        let qp = match self.ctx.create_rc_qp(self.pd, caps, s.clone(), r.clone()) {
            Ok(qp) => qp,
            Err(_) => {
                let qpn = NEXT_QPN.fetch_add(1, Ordering::Relaxed) & 0x00FF_FFFF;
                self.ctx.create_qp(qpn, self.pd, caps, s, r)
            }
        };
        QueuePair {
            qp,
            ctx: self.ctx.clone(),
            state: Arc::new(std::sync::Mutex::new(QpState::Init)),
        }
    }

    /// An RC queue pair connected only through connection managers (`cm`
    /// or [`cm::attach_negotiated`]), never IB-style by QP number: it gets
    /// a plain number and no listener (and no thread) is opened for it.
    pub fn create_cm_qp(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
    ) -> QueuePair {
        let qpn = NEXT_QPN.fetch_add(1, Ordering::Relaxed) & 0x00FF_FFFF;
        let qp = self
            .ctx
            .create_qp(qpn, self.pd, caps, send_cq.cq.clone(), recv_cq.cq.clone());
        QueuePair {
            qp,
            ctx: self.ctx.clone(),
            state: Arc::new(std::sync::Mutex::new(QpState::Init)),
        }
    }

    /// The protection domain's number.
    pub fn number(&self) -> u32 {
        self.pd
    }

    /// A shared receive queue of at most `depth` receives (at least 1)
    /// (`ibv_create_srq`). Its receives use memory registered in this
    /// protection domain; QPs take from it when created with
    /// [`ProtectionDomain::create_qp_with_srq`].
    pub fn create_srq(&self, depth: usize) -> SharedReceiveQueue {
        SharedReceiveQueue {
            srq: self.ctx.create_srq(depth),
            pd: self.pd,
        }
    }

    /// An RC queue pair that takes the receive for every incoming Send
    /// (and Write with immediate) from `srq`, completing into `send_cq`
    /// and `recv_cq` (`ibv_create_qp` with `srq` set; `caps.max_recv_wr` is
    /// unused). [`QueuePair::post_recv`] on it is [`PostError::Invalid`].
    /// An SRQ of another protection domain is [`PostError::Invalid`].
    pub fn create_qp_with_srq(
        &self,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        srq: &SharedReceiveQueue,
        caps: QpCaps,
    ) -> Result<QueuePair, PostError> {
        if srq.pd != self.pd {
            return Err(PostError::Invalid);
        }
        let qpn = NEXT_QPN.fetch_add(1, Ordering::Relaxed) & 0x00FF_FFFF;
        Ok(QueuePair {
            qp: self.ctx.create_qp_with_srq(
                qpn,
                self.pd,
                caps,
                send_cq.cq.clone(),
                recv_cq.cq.clone(),
                srq.srq.clone(),
            ),
            ctx: self.ctx.clone(),
            state: Arc::new(std::sync::Mutex::new(QpState::Init)),
        })
    }
}

/// A shared receive queue (`ibv_srq`): receives that every QP created with
/// it draws from, oldest first, whichever connection a message arrives on.
///
/// Receives may be posted before any QP connects. With a limit armed
/// ([`SharedReceiveQueue::modify_limit`]), the context reports
/// [`AsyncEvent::SrqLimitReached`] with this queue's [`id`] once, when a
/// message takes a receive that leaves fewer than the limit posted; the
/// limit is then disarmed (`IBV_EVENT_SRQ_LIMIT_REACHED`). A message that
/// finds the queue empty puts the QP it arrived on in error (the peer gets
/// a DDP "no buffer" Terminate); the queue and its other QPs carry on, and
/// a failed QP leaves the queue's receives in place.
///
/// ```
/// use softrdma_verbs::{Access, Context, PostError, QpCaps, RecvWr, SgList};
/// let ctx = Context::open().unwrap();
/// let pd = ctx.alloc_pd();
/// let cq = ctx.create_cq(64, None);
/// let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
/// let srq = pd.create_srq(16);
/// for i in 0..4 {
///     let sge = mr.sge(i * 1024, 1024);
///     srq.post_recv(RecvWr { wr_id: i as u64, sgl: SgList::single(sge.addr, sge.length, sge.lkey) })
///         .unwrap();
/// }
/// srq.modify_limit(2).unwrap();
/// assert_eq!(srq.len(), 4);
/// let a = pd.create_qp_with_srq(&cq, &cq, &srq, QpCaps::default()).unwrap();
/// let b = pd.create_qp_with_srq(&cq, &cq, &srq, QpCaps::default()).unwrap();
/// assert_ne!(a.qpn(), b.qpn());
/// // Receives go to the SRQ, not to the QP.
/// let wr = RecvWr { wr_id: 9, sgl: SgList::new() };
/// assert_eq!(a.post_recv(wr), Err(PostError::Invalid));
/// ```
///
/// [`id`]: SharedReceiveQueue::id
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    srq: Arc<engine::Srq>,
    pd: u32,
}

impl SharedReceiveQueue {
    /// Posts a receive (`ibv_post_srq_recv`); [`PostError::QueueFull`] when
    /// the queue holds its depth already.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        Ok(self.srq.post_recv(wr)?)
    }

    /// Arms the limit event (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): one
    /// [`AsyncEvent::SrqLimitReached`] when fewer than `limit` receives
    /// remain after a message takes one, then disarmed until called again.
    /// 0 disarms; a limit above the depth is [`PostError::Invalid`].
    pub fn modify_limit(&self, limit: usize) -> Result<(), PostError> {
        Ok(self.srq.arm_limit(limit)?)
    }

    /// Receives currently posted.
    pub fn len(&self) -> usize {
        self.srq.len()
    }

    /// True if no receive is posted.
    pub fn is_empty(&self) -> bool {
        self.srq.is_empty()
    }

    /// The most receives it holds (`max_wr`).
    pub fn depth(&self) -> usize {
        self.srq.depth()
    }

    /// The id [`AsyncEvent::SrqLimitReached`] reports.
    pub fn id(&self) -> u64 {
        self.srq.id()
    }
}

/// A registered memory region that owns its memory.
#[derive(Debug)]
pub struct MemoryRegion {
    ctx: engine::Context,
    /// The memory; dropped after `Drop::drop` deregistered it.
    mem: engine::Pages,
    stag: u32,
}

/// An access outside a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds;

impl MemoryRegion {
    /// The start address (what work requests and peers use).
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }

    /// Length in octets.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.stag
    }

    /// Remote key (the same STag, as in iWARP).
    pub fn rkey(&self) -> u32 {
        self.stag
    }

    /// A scatter/gather entry for `len` octets at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.stag,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), OutOfBounds> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(OutOfBounds),
        }
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        self.check(offset, data.len())?;
        // SAFETY: the range is inside our live allocation; no reference to the region exists, so a concurrent peer write only races contents.
        unsafe { std::ptr::copy(data.as_ptr(), self.mem.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Copies octets at `offset` out of the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        self.check(offset, out.len())?;
        // SAFETY: as in `write_at`.
        unsafe { std::ptr::copy(self.mem.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Reads one octet with a volatile load (for polling a flag a peer
    /// writes, as `ib_write_lat` does).
    pub fn read_volatile(&self, offset: usize) -> Result<u8, OutOfBounds> {
        self.check(offset, 1)?;
        // SAFETY: in bounds of our live allocation.
        Ok(unsafe { std::ptr::read_volatile(self.mem.as_ptr().add(offset)) })
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // The mapping (`mem`) is unmapped after this returns, once the
        // region is deregistered: the registry lock orders the
        // deregistration after any access in progress.
        self.ctx.registry().deregister(self.stag);
    }
}

/// A completion channel: a pollable fd telling which armed CQ fired.
#[derive(Debug, Clone)]
pub struct CompletionChannel {
    ch: Arc<engine::CompChannel>,
}

impl CompletionChannel {
    /// Waits for an armed CQ to fire; returns its id, or `None` on timeout.
    pub fn get_event(&self, timeout: Option<Duration>) -> Option<u64> {
        self.ch.get_event(timeout)
    }

    /// The pollable descriptor.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.ch.fd()
    }
}

/// A completion queue.
#[derive(Debug, Clone)]
pub struct CompletionQueue {
    cq: Arc<engine::Cq>,
}

impl CompletionQueue {
    /// Takes up to `out.len()` completions (driving receive progress when
    /// none are queued). Returns how many.
    pub fn poll(&self, out: &mut [Completion]) -> usize {
        self.cq.poll(out)
    }

    /// Arms the CQ's channel for the next (solicited) completion.
    pub fn req_notify(&self, solicited_only: bool) {
        self.cq.req_notify(solicited_only)
    }

    /// The CQ's id (as reported by [`CompletionChannel::get_event`]).
    pub fn id(&self) -> u64 {
        self.cq.id()
    }

    /// True once a completion was lost to an overrun.
    pub fn overrun(&self) -> bool {
        self.cq.overrun()
    }

    /// Busy-polls for one completion, up to `timeout`.
    pub fn wait_one(&self, timeout: Duration) -> Option<Completion> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = [Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        }];
        loop {
            if self.poll(&mut out) == 1 {
                return Some(out[0]);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::hint::spin_loop();
        }
    }
}

/// Why a work request was refused (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The QP's state does not allow it (sends need RTS; receives need a
    /// state other than RESET).
    InvalidState(QpState),
    /// The queue is full.
    QueueFull,
    /// Sends need a connected QP.
    NotConnected,
    /// Not supported on this connection (RFC 7306 toward a non-softrdma peer).
    Unsupported,
    /// An invalid parameter.
    Invalid,
}

impl From<engine::QpError> for PostError {
    fn from(e: engine::QpError) -> Self {
        match e {
            engine::QpError::QueueFull => PostError::QueueFull,
            engine::QpError::NotConnected => PostError::NotConnected,
            engine::QpError::Unsupported => PostError::Unsupported,
            engine::QpError::Invalid => PostError::Invalid,
        }
    }
}

/// An RC queue pair.
#[derive(Debug, Clone)]
pub struct QueuePair {
    qp: engine::Qp,
    ctx: engine::Context,
    state: Arc<std::sync::Mutex<QpState>>,
}

impl QueuePair {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// The verbs state. A connection that failed shows as ERR.
    pub fn query_state(&self) -> QpState {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.qp.link_state() == QpLinkState::Error && *st != QpState::Reset {
            *st = QpState::Err;
        }
        *st
    }

    /// Transport state.
    pub fn state(&self) -> QpLinkState {
        self.qp.link_state()
    }

    fn set_state(&self, s: QpState) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    /// Moves the QP to another state (`ibv_modify_qp`). INIT → RTR with a
    /// destination starts the IB-style connection; RTR → RTS waits for it.
    /// On error the state is unchanged and the error says why.
    pub fn modify(&self, attr: &QpAttr) -> Result<(), ModifyError> {
        let from = self.query_state();
        let to = attr.state;
        if !from.can_move_to(to) {
            return Err(ModifyError::InvalidTransition { from, to });
        }
        match (from, to) {
            (_, QpState::Err) => {
                self.qp.disconnect();
            }
            (QpState::Reset | QpState::Init, QpState::Reset | QpState::Init) => {}
            (_, QpState::Reset) => {
                return Err(ModifyError::Unsupported(
                    "resetting a QP that has been connected; destroy it and create a new QP",
                ))
            }
            (QpState::Init, QpState::Rtr) => {
                let dest = attr.dest.ok_or(ModifyError::MissingAttribute {
                    to,
                    attribute: "destination (GID and QP number)",
                })?;
                let ird = attr.max_dest_rd_atomic.unwrap_or(16);
                self.ctx
                    .ib_conn()
                    .start(&self.qp, self.qp.qpn(), dest.addr, dest.qpn, ird, 16)
                    .map_err(|e| ModifyError::Connect(e.to_string()))?;
            }
            (QpState::Rtr, QpState::Rts) => {
                let timeout = attr.timeout.unwrap_or(Duration::from_secs(30));
                self.ctx
                    .ib_conn()
                    .wait_connected(&self.qp, self.qp.qpn(), timeout)
                    .map_err(|e| ModifyError::Connect(e.to_string()))?;
            }
            (QpState::Sqe, QpState::Rts)
            | (QpState::Rts | QpState::Sqd, QpState::Rts | QpState::Sqd) => {}
            _ => return Err(ModifyError::InvalidTransition { from, to }),
        }
        self.set_state(to);
        Ok(())
    }

    /// Posts a send work request (the QP must be in RTS).
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        // RTS and ERR both go to the engine (on a failed connection it
        // completes the request at once with a flush error, as verbs does
        // in ERR), so only the other states need `query_state`'s look at
        // the connection: the data path takes no QP lock for the state.
        let st = match self.verbs_state() {
            st @ (QpState::Rts | QpState::Err) => st,
            _ => self.query_state(),
        };
        match st {
            QpState::Rts | QpState::Err => Ok(self.qp.post_send(wr)?),
            other => Err(PostError::InvalidState(other)),
        }
    }

    /// Posts a receive (any state but RESET).
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        // `query_state` reports RESET exactly when the verbs state is.
        match self.verbs_state() {
            QpState::Reset => Err(PostError::InvalidState(QpState::Reset)),
            _ => Ok(self.qp.post_recv(wr)?),
        }
    }

    /// The state the verbs calls set, without the connection's view.
    fn verbs_state(&self) -> QpState {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its user drives all of its progress and waits on the connection's
    /// socket itself (`softrdma_engine::Qp::set_self_driven`); before the
    /// connection is made.
    pub fn set_self_driven(&self) {
        self.qp.set_self_driven();
    }

    /// True when nothing the QP framed is left to write to its connection
    /// (a Send's completion can come before its last octets reach TCP).
    pub fn tx_idle(&self) -> bool {
        self.qp.tx_idle()
    }

    /// Disconnects (`rdma_disconnect`): outstanding work flushes and the QP
    /// goes to ERR.
    pub fn disconnect(&self) {
        self.qp.disconnect();
        self.set_state(QpState::Err);
    }
}

/// Connection management (rdma_cm semantics, `RDMA_PS_TCP`).
pub mod cm {
    use super::*;
    pub use softrdma_engine::cm::ConnParams;

    /// Why a connection attempt failed.
    pub type ConnectError = softrdma_engine::cm::CmError;

    /// Connects `qp` to a listener; returns the peer's private data.
    pub fn connect(
        qp: &QueuePair,
        addr: impl ToSocketAddrs,
        params: &ConnParams,
    ) -> Result<Vec<u8>, ConnectError> {
        let pd = softrdma_engine::cm::connect(&qp.ctx, &qp.qp, addr, params)?;
        qp.set_state(QpState::Rts);
        Ok(pd)
    }

    /// Runs `qp` over a TCP connection made elsewhere whose MPA exchange
    /// (through [`softrdma_engine::cm::initiator`] or
    /// [`softrdma_engine::cm::responder`]) ended in `n`; the QP is then in
    /// RTS.
    pub fn attach_negotiated(
        qp: &QueuePair,
        sock: std::net::TcpStream,
        n: &softrdma_proto::mpa::Negotiated,
        initiator: bool,
    ) -> std::io::Result<()> {
        softrdma_engine::cm::attach_negotiated(&qp.ctx, &qp.qp, sock, n, initiator)?;
        qp.set_state(QpState::Rts);
        Ok(())
    }

    /// A listener for connection requests.
    #[derive(Debug)]
    pub struct Listener {
        l: softrdma_engine::cm::Listener,
    }

    impl Listener {
        /// Listens on `addr` (port 0 picks one).
        pub fn bind(ctx: &Context, addr: impl ToSocketAddrs) -> std::io::Result<Listener> {
            Ok(Listener {
                l: softrdma_engine::cm::Listener::bind(&ctx.inner, addr)?,
            })
        }

        /// The address listened on.
        pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
            self.l.local_addr()
        }

        /// Waits for the next connection request.
        pub fn get_request(&self) -> Result<ConnectRequest, ConnectError> {
            Ok(ConnectRequest {
                inc: self.l.accept()?,
            })
        }
    }

    /// A connection request to accept or reject.
    #[derive(Debug)]
    pub struct ConnectRequest {
        inc: softrdma_engine::cm::Incoming,
    }

    impl ConnectRequest {
        /// The initiator's private data.
        pub fn private_data(&self) -> &[u8] {
            self.inc.private_data()
        }

        /// The initiator's address.
        pub fn peer_addr(&self) -> SocketAddr {
            self.inc.peer_addr()
        }

        /// Accepts onto `qp`.
        pub fn accept(self, qp: &QueuePair, params: &ConnParams) -> Result<(), ConnectError> {
            self.inc.accept(&qp.qp, params)?;
            qp.set_state(QpState::Rts);
            Ok(())
        }

        /// Rejects, with private data.
        pub fn reject(self, private_data: &[u8]) -> Result<(), ConnectError> {
            self.inc.reject(private_data)
        }
    }
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RegisterError::InvalidAccess => {
                "memory registration: REMOTE_WRITE or REMOTE_ATOMIC need LOCAL_WRITE"
            }
            RegisterError::InvalidLength => {
                "memory registration: zero length, or the memory could not be allocated"
            }
            RegisterError::TooMany => "memory registration: the registration table is full",
        })
    }
}

impl std::error::Error for RegisterError {}

impl std::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("access outside the memory region")
    }
}

impl std::error::Error for OutOfBounds {}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::InvalidState(s) => write!(f, "work request refused: the QP is in {s}"),
            PostError::QueueFull => f.write_str("work request refused: the queue is full"),
            PostError::NotConnected => f.write_str("work request refused: the QP is not connected"),
            PostError::Unsupported => {
                f.write_str("work request refused: not supported on this connection (RFC 7306 needs a softrdma peer)")
            }
            PostError::Invalid => f.write_str("work request refused: invalid parameter"),
        }
    }
}

impl std::error::Error for PostError {}
