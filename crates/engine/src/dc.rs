//! Software dynamically connected transport (SoftDC) runtime: DC targets
//! ([`Dct`]) and initiators ([`Dci`]) built from UD QPs (connection
//! invitations) and RC QPs (data), driving the sans-IO
//! [`softrdma_proto::dc::DcTable`] (`docs/dc.md`).
//!
//! # Pieces
//!
//! A [`DcService`] per context (shared by every DCI and DCT of the
//! context, created by the first of them, dropped with the last) owns:
//!
//! * the connection table ([`DcTable`]: capacity, LRU, idle timeout,
//!   invitation retransmission);
//! * one UD QP the initiators send invitations from and receive answers
//!   on; each DCT has a UD QP of its own whose number is the DCT number;
//!   their receive buffers are registered in a private protection domain;
//! * one internal CQ for the initiators' RC QPs, and one for the UD QPs,
//!   both on one completion channel whose descriptor the context's
//!   progress thread watches (so invitations are answered and answers
//!   acted upon whether or not anybody polls), plus one progress timer
//!   for [`DcTable::poll_timeout`];
//! * (once a DCT exists) TCP listeners for the RC connections the DCTs
//!   accept: one on the port number of each DCT's UDP socket (where
//!   direct connection requests go), non-blocking and accepted by the
//!   progress thread, which also answers the MPA Requests (at once when
//!   the Request is all there, else when its socket turns readable): no
//!   accept thread, no hand-off.
//!
//! An initiator opens an RC connection without blocking (`Opening`:
//! non-blocking TCP connect, MPA Request written at once, Reply read with
//! exact lengths), stepped by busy pollers and the progress thread, then
//! hands the queued work to the connection; if that cannot be set up, a
//! persistent connector thread runs the blocking [`cm::connect`]. A new
//! connection's first attempt is **direct** ([`PD_MAGIC_DIRECT`]: the DC
//! key in the MPA Request, to the DCT's UDP port number), made before
//! the invitation, whose first Invite waits for it
//! ([`DcConfig::direct_grace`]); the table decides what follows
//! (`softrdma_proto::dc`, `docs/dc.md` §2). The RC QPs of the service are
//! internal ([`Qp::set_internal`]): no QP async events (evictions are
//! normal operation; errors are completions).
//!
//! **Reverse use** (`DcConfig::reverse`, `docs/dc.md` §2): a connection
//! request offers the context's DCTs of the connection's protection
//! domain ([`ReverseOffer`] after the fixed private data); a peer that
//! accepted such a connection sends its own work for those DCTs over it
//! after a UD Bind proved its DC key: this side binds the initiator QP's
//! receive side to the DCT ([`Qp::bind_receive`]), the peer posts on its
//! target QP (whose send completions go to the internal CQ, into the
//! DCIs' reorder rings). A bound connection is closed only after the
//! Unbind/Unbound handshake; the Unbound goes when the reverse work is
//! complete and its octets acknowledged ([`Qp::tx_unacked`]), and the
//! closer reads its socket before closing.
//!
//! # Completion order
//!
//! A DCI is one send queue: its completions reach the application's CQ in
//! posting order, whatever target each work request went to. Every work
//! request is posted to its RC QP signaled, with an internal id (DCI,
//! sequence number); the RC completions land in the internal CQ and wait
//! in the DCI's reorder ring until every earlier work request has
//! completed. Unsignaled work requests that succeed are then dropped, as
//! verbs would. Work requests to a target that is being connected wait in
//! the connection's backlog (in order) and go out when it is up; if the
//! invitation fails (timeout, wrong key, no such DCT) or the RC connection
//! fails, only that target's work requests complete in error
//! (`RetryExcErr`, `RemAccessErr`, `RemInvReqErr`, `WrFlushErr`).
//!
//! # Progress
//!
//! Busy-polling the DCI's CQ drives the service inline (try-lock: skipped
//! while another thread is at it): the internal CQ, the sockets of the
//! initiator connections with work in flight (an idle connection costs no
//! system call), and the UD QP and the connections being opened only
//! while an invitation or connection is outstanding. Everything else
//! happens on the progress thread.
//!
//! # Locks
//!
//! The service's core lock, then a QP's lock (posting), then the CQs'
//! entry locks. Threads that set up connections take the core lock only
//! around table updates, never across a blocking call.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use softrdma_proto::dc::{
    ConnId, DcConfig, DcEvent, DcStats, DcTable, DcTarget, FailReason, LocalMap, RejectReason,
    ReverseOffer, MSG_LEN,
};
use softrdma_proto::memory::Access;
use softrdma_proto::mpa::{Initiator, Negotiated, Outcome};
use softrdma_proto::wr::{
    DgramAddr, InlineData, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_wire::mpa::{frame_len as mpa_frame_len, HEADER_LEN};
use softrdma_wire::rdmap::TerminateCause;

use crate::cm::{self, ConnParams, Listener};
use crate::cq::{CompChannel, Completion, Cq, InlineProgress};
use crate::dgram::{DgramError, DgramQpHandle, UdOptions};
use crate::progress::{Parking, Source};
use crate::{Context, Qp, QpCaps, QpError, QpLinkState, Shared, Srq};

/// First octets of the MPA private data of a DC connection request that
/// presents an Accept's cookie: magic, cookie (8), DCT number (4), the
/// initiator's connection id (8).
pub const PD_MAGIC: [u8; 4] = *b"sDC1";
/// First octets of the MPA private data of a direct DC connection request
/// (made in parallel with the invitation, to the DCT's UDP port number):
/// magic, DC key (8), DCT number (4), the initiator's connection id (8),
/// the initiator's invitation UD QPN (4) and UDP port (2).
pub const PD_MAGIC_DIRECT: [u8; 4] = *b"sDCd";

/// Receive slot size of the invitation UD QPs (messages are [`MSG_LEN`]).
const SLOT: usize = 64;
/// Receives posted on the initiators' UD QP.
const CTL_RECVS: usize = 64;
/// Receives posted on each DCT's UD QP.
const DCT_RECVS: usize = 16;
/// Send queue depth of the RC QPs (more waits in the connection backlog).
const RC_SQ: usize = 256;
/// How often target connections are checked for having closed while
/// any exist (they are also checked whenever the table is full).
const REAP_EVERY: std::time::Duration = std::time::Duration::from_millis(50);
/// Sequence bits of an internal work request id (the DCI id above).
const SEQ_BITS: u32 = 40;
/// A busy poller counts as gone after this long without a poll.
const POLLER_IDLE: std::time::Duration = std::time::Duration::from_millis(1);
/// How often the progress thread looks whether a busy poller stopped
/// without arming its CQ (arming hands over at once: `on_app_armed`).
const POLLER_WATCH: std::time::Duration = std::time::Duration::from_millis(20);
/// Environment variable that turns reverse use off (`0` or `off`) for
/// every DC service of the process, whatever its options say: for
/// benchmarks comparing it on and off (`softrdma perf --transport dc`).
pub const REVERSE_ENV: &str = "SOFTRDMA_DC_REVERSE";
/// How often target connections waiting for their written octets to be
/// acknowledged (before an Unbound) are looked at.
const DRAIN_CHECK: std::time::Duration = std::time::Duration::from_millis(1);
/// Key-rejection reports kept per DCT until read.
const MAX_REJECTIONS: usize = 256;

/// Progress-thread tokens of DC services (above RC QPs' and datagram
/// tokens).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1 << 56);

/// The service of each live context.
static SERVICES: Mutex<Vec<(Weak<Shared>, Weak<DcService>)>> = Mutex::new(Vec::new());

/// How a context's DC service is set up (by its first DCI or DCT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DcOptions {
    /// Table and invitation protocol parameters (the seed is replaced by
    /// an unpredictable one).
    pub table: DcConfig,
    /// Address the UD sockets and the TCP listener bind to.
    pub bind_ip: IpAddr,
}

impl Default for DcOptions {
    fn default() -> Self {
        DcOptions {
            table: DcConfig::default(),
            bind_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        }
    }
}

/// Why a DC object could not be created or a work request posted.
#[derive(Debug)]
pub enum DcError {
    /// A UD QP for invitations could not be created.
    Dgram(DgramError),
    /// A socket, the listener or the progress thread failed.
    Io(io::Error),
    /// Memory for invitation buffers could not be registered.
    Register,
}

impl std::fmt::Display for DcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DcError::Dgram(e) => write!(f, "DC invitation QP: {e}"),
            DcError::Io(e) => write!(f, "DC service: {e}"),
            DcError::Register => f.write_str("DC service: cannot register invitation buffers"),
        }
    }
}

impl std::error::Error for DcError {}

impl From<DgramError> for DcError {
    fn from(e: DgramError) -> Self {
        DcError::Dgram(e)
    }
}

impl From<io::Error> for DcError {
    fn from(e: io::Error) -> Self {
        DcError::Io(e)
    }
}

/// A service's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DcServiceStats {
    /// The table's counters (invitations, retransmissions, rejections,
    /// evictions, high-water mark of slots in use …).
    pub table: DcStats,
    /// Slots in use now.
    pub live: usize,
    /// RC QPs (initiator and target side) that exist now.
    pub rc_qps: usize,
    /// Highest number of RC QPs that existed at once.
    pub max_rc_qps: usize,
    /// Initiator connections waiting for a slot.
    pub waiting: usize,
}

/// Registered receive buffers of an invitation UD QP.
struct RecvBuf {
    shared: Arc<Shared>,
    mem: Box<[u8]>,
    stag: u32,
}

impl RecvBuf {
    fn new(shared: &Arc<Shared>, pd: u32, slots: usize) -> Result<RecvBuf, DcError> {
        let mut mem = vec![0u8; slots * SLOT].into_boxed_slice();
        let ptr = mem.as_mut_ptr();
        // `mem` is freed only after Drop deregisters the STag, and moving
        // the Box does not move its heap memory.
        // SAFETY: `mem` is a live heap allocation of `slots * SLOT` octets.
        let stag = unsafe {
            shared
                .registry
                .register(ptr, mem.len(), ptr as u64, Access::LOCAL_WRITE, pd)
        }
        .map_err(|_| DcError::Register)?;
        Ok(RecvBuf {
            shared: shared.clone(),
            mem,
            stag,
        })
    }

    fn wr(&self, slot: usize) -> RecvWr {
        let addr = self.mem.as_ptr() as u64 + (slot * SLOT) as u64;
        RecvWr {
            wr_id: slot as u64,
            sgl: SgList::single(addr, SLOT as u32, self.stag),
        }
    }

    /// Copies the message in `slot` out (the slot is not reposted yet,
    /// so nothing writes it).
    fn read(&self, slot: usize, len: usize) -> Option<[u8; MSG_LEN]> {
        if len != MSG_LEN || slot >= self.mem.len() / SLOT {
            return None;
        }
        let src = self.mem.as_ptr().wrapping_add(slot * SLOT);
        let mut out = [0u8; MSG_LEN];
        // The engine wrote the slot through the registration before the
        // completion was queued and does not write it again until the slot
        // is reposted, so a plain copy of octets is enough.
        // SAFETY: `src..src+MSG_LEN` lies inside `mem` (checked above).
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), MSG_LEN) };
        Some(out)
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        self.shared.registry.deregister(self.stag);
    }
}

/// One posted DCI work request awaiting its turn to complete.
struct Slot {
    wr_id: u64,
    /// The connection it was posted to.
    conn: ConnId,
    signaled: bool,
    done: Option<WorkCompletion>,
}

struct DciState {
    cq: Arc<Cq>,
    qp_num: u32,
    pd: u32,
    depth: usize,
    /// Sequence number of `ring[0]`.
    base: u64,
    ring: VecDeque<Slot>,
    /// Has completions ready to release.
    dirty: bool,
}

/// An initiator connection in the engine.
struct Conn {
    pd: u32,
    qp: Option<Qp>,
    /// Work requests not yet handed to the QP (in order).
    backlog: VecDeque<SendWr>,
    /// Handed to the QP, not completed.
    inflight: u32,
    /// Failed: remaining completions are flushes.
    dead: bool,
    /// The table knows it as live.
    up: bool,
    /// The RC connection being opened without blocking.
    opening: Option<Box<Opening>>,
    /// `opening` is the direct attempt (no cookie).
    direct: bool,
    /// Reverse use: `qp` is a target connection's (this side accepted
    /// it; the peer opened it and bound its receive side to a DCT).
    shared: bool,
    /// Offering side: this connection's receive side is bound to this
    /// DCT (the peer sends to it over the connection).
    bound_dct: Option<u32>,
}

struct DctState {
    ud: DgramQpHandle,
    buf: RecvBuf,
    pd: u32,
    cq: Arc<Cq>,
    srq: Arc<Srq>,
    rejected: u64,
    rejections: VecDeque<DgramAddr>,
    /// Connections failed by a Send that found the SRQ empty.
    lost_no_receive: u64,
}

struct TargetConn {
    qp: Qp,
    dct: u32,
}

struct Core {
    table: DcTable,
    conns: LocalMap<ConnId, Conn>,
    dcis: LocalMap<u32, DciState>,
    next_dci: u32,
    dcts: LocalMap<u32, DctState>,
    /// Target connections, from before their accept runs.
    targets: LocalMap<ConnId, TargetConn>,
    /// Target connections asked to unbind whose reverse work is done:
    /// the Unbound goes once what was written on them is acknowledged.
    drained: Vec<ConnId>,
    timer: Option<Instant>,
    last_reap: Option<Instant>,
    max_rc: usize,
    /// Completions on their way to a DCI's CQ (reused buffer).
    scratch: Vec<Completion>,
    /// Inline polls so far.
    polls: u64,
}

/// The DC machinery of one context (see the module documentation).
pub struct DcService {
    shared: Arc<Shared>,
    this: Weak<DcService>,
    opts: DcOptions,
    ctl_pd: u32,
    channel: Arc<CompChannel>,
    ctl_cq: Arc<Cq>,
    data_cq: Arc<Cq>,
    ctl_qp: DgramQpHandle,
    ctl_buf: RecvBuf,
    token: u64,
    /// Connections inviting or connecting (gates inline UD polling).
    pending: AtomicUsize,
    /// When a CQ poll last drove the service (ns since `epoch`; 0: never).
    inline_at: AtomicU64,
    epoch: Instant,
    /// The TCP listeners (the first one's port is the one Accepts name
    /// unless a DCT's own UDP port number has one), watched by the
    /// progress thread.
    listeners: Mutex<Vec<Arc<ListenSource>>>,
    /// A QP number reserved at creation for the first RC QP.
    spare_qpn: Mutex<Option<u32>>,
    /// Accepted connections whose MPA Request is still coming, watched by
    /// the progress thread (by token).
    handshakes: Mutex<LocalMap<u64, Arc<HandshakeSource>>>,
    /// The thread that reads Requests arriving in pieces (started on
    /// first use; ends when this queue closes).
    slow: Mutex<Option<std::sync::mpsc::Sender<SlowHandshake>>>,
    /// The threads that open initiator connections.
    connector: Arc<Connector>,
    core: Mutex<Core>,
}

impl std::fmt::Debug for DcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DcService")
            .field("ctl_qpn", &self.ctl_qp.qpn())
            .finish()
    }
}

fn tag(dci: u32, seq: u64) -> u64 {
    (u64::from(dci) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1))
}

fn untag(id: u64) -> (u32, u64) {
    ((id >> SEQ_BITS) as u32, id & ((1 << SEQ_BITS) - 1))
}

fn random_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 40) ^ (&NEXT_TOKEN as *const _ as u64)
}

impl DcService {
    /// The DC service of `ctx`, created with `opts` if it has none (an
    /// existing service keeps the options it was created with:
    /// [`DcService::options`]).
    pub fn of(ctx: &Context, opts: DcOptions) -> Result<Arc<DcService>, DcError> {
        let mut all = SERVICES.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|(c, s)| c.strong_count() > 0 && s.strong_count() > 0);
        if let Some(s) = all
            .iter()
            .find(|(c, _)| std::ptr::eq(c.as_ptr(), Arc::as_ptr(&ctx.shared)))
            .and_then(|(_, s)| s.upgrade())
        {
            return Ok(s);
        }
        let svc = DcService::create(ctx, opts)?;
        all.push((Arc::downgrade(&ctx.shared), Arc::downgrade(&svc)));
        Ok(svc)
    }

    fn create(ctx: &Context, opts: DcOptions) -> Result<Arc<DcService>, DcError> {
        let shared = ctx.shared.clone();
        let channel = CompChannel::new()?;
        let ctl_cq = ctx.create_cq(4096, Some(channel.clone()));
        // No inline progress of its own: a poll of a DCI's CQ progresses
        // only the RC QPs with work in flight (`drive`), so that an idle
        // connection costs the busy poller no system call.
        let data_cq = Cq::new(
            shared.next_cq.fetch_add(1, Ordering::Relaxed),
            1 << 16,
            Some(channel.clone()),
            shared.events.clone(),
            false,
        );
        let ctl_pd = ctx.alloc_pd();
        let ctl_qp = ctx.create_ud_qp(
            ctl_pd,
            QpCaps {
                max_send_wr: 1024,
                max_recv_wr: CTL_RECVS,
            },
            ctl_cq.clone(),
            ctl_cq.clone(),
            UdOptions {
                bind: SocketAddr::new(opts.bind_ip, 0),
                ..UdOptions::default()
            },
        )?;
        let ctl_buf = RecvBuf::new(&shared, ctl_pd, CTL_RECVS)?;
        for i in 0..CTL_RECVS {
            ctl_qp
                .post_recv(ctl_buf.wr(i))
                .map_err(|_| DcError::Register)?;
        }
        let mut opts = opts;
        // Benchmark switch (`docs/dc.md` §7): the environment can turn
        // reverse use off for a whole run (both processes of `perf`).
        if std::env::var_os(REVERSE_ENV).is_some_and(|v| v == "0" || v == "off") {
            opts.table.reverse = false;
        }
        let table = DcTable::new(DcConfig {
            seed: random_seed(),
            ..opts.table
        });
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        let svc = Arc::new_cyclic(|this| DcService {
            shared: shared.clone(),
            this: this.clone(),
            opts,
            ctl_pd,
            channel: channel.clone(),
            ctl_cq: ctl_cq.clone(),
            data_cq: data_cq.clone(),
            ctl_qp,
            ctl_buf,
            token,
            pending: AtomicUsize::new(0),
            inline_at: AtomicU64::new(0),
            epoch: Instant::now(),
            listeners: Mutex::new(Vec::new()),
            handshakes: Mutex::new(LocalMap::default()),
            slow: Mutex::new(None),
            spare_qpn: Mutex::new(ctx.ib_conn().reserve().ok()),
            connector: Arc::new(Connector::default()),
            core: Mutex::new(Core {
                table,
                conns: LocalMap::default(),
                dcis: LocalMap::default(),
                next_dci: 1,
                dcts: LocalMap::default(),
                targets: LocalMap::default(),
                drained: Vec::new(),
                timer: None,
                last_reap: None,
                max_rc: 0,
                scratch: Vec::with_capacity(64),
                polls: 0,
            }),
        });
        shared
            .progress()?
            .register(channel.fd(), token, Arc::downgrade(&svc))?;
        // One connector waits from the start: a first message pays no
        // thread creation.
        svc.connector.spawn_worker(&svc.this)?;
        ctl_cq.req_notify(false);
        data_cq.req_notify(false);
        Ok(svc)
    }

    /// A QP number for an RC QP of the service: the one reserved when the
    /// service was created (so that the first connection does not pay
    /// for the numbering's listener and thread), then fresh ones.
    fn reserve_qpn(&self, ib: &crate::ibconn::IbConn) -> Result<u32, crate::ibconn::IbConnError> {
        let spare = self
            .spare_qpn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        spare.map_or_else(|| ib.reserve(), Ok)
    }

    /// The options in force.
    pub fn options(&self) -> DcOptions {
        self.opts
    }

    /// The counters.
    pub fn stats(&self) -> DcServiceStats {
        let c = self.lock();
        DcServiceStats {
            table: c.table.stats(),
            live: c.table.live(),
            rc_qps: rc_count(&c),
            max_rc_qps: c.max_rc,
            waiting: c.table.waiting(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ctx(&self) -> Context {
        Context {
            shared: self.shared.clone(),
        }
    }

    // ------------------------------------------------------------------
    // Initiator
    // ------------------------------------------------------------------

    fn post(&self, dci: u32, wr: SendWr, target: DcTarget) -> Result<(), QpError> {
        match wr.op {
            SendOp::WriteRecord { .. } => return Err(QpError::Unsupported),
            SendOp::LocalInvalidate { .. } => return Err(QpError::Invalid),
            _ => {}
        }
        let now = Instant::now();
        let mut c = self.lock();
        // A poster completes without polling when its completion is moved
        // here: it counts as active (no channel wake-up per completion).
        self.touch(&mut c);
        let core = &mut *c;
        let st = core.dcis.get_mut(&dci).ok_or(QpError::Invalid)?;
        if st.ring.len() >= st.depth {
            return Err(QpError::QueueFull);
        }
        let (pd, seq) = (st.pd, st.base + st.ring.len() as u64);
        let internal = SendWr {
            wr_id: tag(dci, seq),
            flags: SendFlags {
                signaled: true,
                ..wr.flags
            },
            ..wr
        };
        let key = DcTarget {
            local: pd,
            ..target
        };
        // A connection whose QP failed is forgotten first, so that this
        // work request gets a fresh one.
        let (id, new) = loop {
            let (id, new) = core.table.post(now, key);
            let failed = core.conns.get(&id).is_some_and(|conn| {
                conn.dead
                    || (conn.up
                        && conn
                            .qp
                            .as_ref()
                            .is_some_and(|q| q.link_state() == QpLinkState::Error))
            });
            if !failed {
                break (id, new);
            }
            core.table.completed(id, now);
            self.kill_conn(core, id, now);
        };
        let st = core.dcis.get_mut(&dci).expect("checked");
        st.ring.push_back(Slot {
            wr_id: wr.wr_id,
            conn: id,
            signaled: wr.flags.signaled,
            done: None,
        });
        if new {
            self.pending.fetch_add(1, Ordering::Relaxed);
            core.conns.insert(
                id,
                Conn {
                    pd,
                    qp: None,
                    backlog: VecDeque::new(),
                    inflight: 0,
                    dead: false,
                    up: false,
                    opening: None,
                    direct: false,
                    shared: false,
                    bound_dct: None,
                },
            );
        }
        let conn = core.conns.get_mut(&id).expect("inserted");
        conn.backlog.push_back(internal);
        if conn.up {
            self.drain_backlog(core, id, now);
            // A Send or Write completes when written: move its completion
            // to the DCI's CQ now, so that the application's next poll
            // finds it without walking (and progressing) the CQ's QPs.
            if self.drive(core, false, false) {
                return Ok(());
            }
        }
        self.pump(core, now);
        self.release(core);
        Ok(())
    }

    /// Hands backlog work of `id` to its QP while it takes it.
    fn drain_backlog(&self, core: &mut Core, id: ConnId, now: Instant) {
        let Some(conn) = core.conns.get_mut(&id) else {
            return;
        };
        let Some(qp) = conn.qp.clone() else { return };
        let mut failed = Vec::new();
        while let Some(wr) = conn.backlog.front().copied() {
            match qp.post_send(wr) {
                Ok(()) => {
                    conn.backlog.pop_front();
                    conn.inflight += 1;
                }
                Err(QpError::QueueFull) => break,
                // A target connection bound to while its accept runs:
                // the accept drains the backlog when it is done.
                Err(QpError::NotConnected)
                    if conn.shared && qp.link_state() == QpLinkState::Unconnected =>
                {
                    break
                }
                Err(e) => {
                    conn.backlog.pop_front();
                    failed.push((wr, e));
                }
            }
        }
        for (wr, e) in failed {
            let status = match e {
                QpError::Unsupported | QpError::Invalid => WcStatus::LocQpOpErr,
                _ => WcStatus::WrFlushErr,
            };
            finish(core, wr.wr_id, status, WcOpcode::of(&wr.op), now);
        }
    }

    /// Forgets initiator connection `id`: its queued work completes with
    /// `WrFlushErr` (work in flight completes through the QP's flush), its
    /// QP is disconnected, its slot freed.
    fn kill_conn(&self, core: &mut Core, id: ConnId, now: Instant) {
        core.table.closed(id, now);
        if let Some(mut conn) = core.conns.remove(&id) {
            if !conn.up {
                self.pending.fetch_sub(1, Ordering::Relaxed);
            }
            fail_backlog(core, &mut conn, WcStatus::WrFlushErr, now);
            // Work in flight completes through the QP's flush.
            if let Some(qp) = conn.qp.take() {
                // (Only an opener's own connection has its receive side
                // bound; a reverse user's QP is counted when reaped.)
                if let Some(dct) = conn.bound_dct {
                    count_no_receive(core, &qp, dct);
                }
                qp.disconnect();
            }
        }
    }

    /// Sends the table's transmits, acts on its events, arms its timer.
    fn pump(&self, core: &mut Core, now: Instant) {
        loop {
            let mut any = false;
            if !core.drained.is_empty() {
                self.check_drained(core);
            }
            // Events first: a direct connection request goes out before
            // the invitation it runs in parallel with.
            while let Some(ev) = core.table.poll_event() {
                any = true;
                self.on_event(core, ev, now);
            }
            while let Some(tx) = core.table.poll_transmit() {
                any = true;
                let wr = SendWr {
                    wr_id: 0,
                    op: SendOp::Send {
                        imm: None,
                        invalidate: None,
                    },
                    payload: Payload::Inline(
                        InlineData::new(&tx.msg.encode()).expect("40 octets fit inline"),
                    ),
                    flags: SendFlags::default(),
                };
                let qp = match tx.from_dct {
                    None => Some(&self.ctl_qp),
                    Some(d) => core.dcts.get(&d).map(|s| &s.ud),
                };
                // A datagram that cannot be sent is lost: the invitation
                // is retransmitted on the initiator's schedule.
                if let Some(qp) = qp {
                    let _ = qp.post_send(wr, tx.to);
                }
            }
            if !any {
                break;
            }
        }
        let mut next = core.table.poll_timeout();
        if !core.drained.is_empty() {
            let soon = now + DRAIN_CHECK;
            next = Some(next.map_or(soon, |t| t.min(soon)));
        }
        if !core.targets.is_empty() {
            let reap = now + REAP_EVERY;
            next = Some(next.map_or(reap, |t| t.min(reap)));
        }
        if let Some(t) = next {
            if core.timer.is_none_or(|armed| t < armed || armed <= now) {
                core.timer = Some(t);
                if let Ok(p) = self.shared.progress() {
                    p.set_timer(self.token, t);
                }
            }
        }
    }

    /// Target connections whose reverse work is done: the Unbound goes
    /// for those whose written octets the peer has all acknowledged (so
    /// the peer, reading its socket before it closes, loses none).
    fn check_drained(&self, core: &mut Core) {
        let mut i = 0;
        while i < core.drained.len() {
            let id = core.drained[i];
            let unacked = core.targets.get(&id).and_then(|t| t.qp.tx_unacked());
            if unacked.is_some_and(|n| n > 0) {
                i += 1;
                continue;
            }
            core.drained.swap_remove(i);
            core.table.unbound_ready(id);
        }
    }

    fn on_event(&self, core: &mut Core, ev: DcEvent, now: Instant) {
        match ev {
            DcEvent::Connect {
                id,
                target,
                port,
                cookie,
            } => self.start_connect(core, id, target, port, Some(cookie)),
            DcEvent::ConnectDirect { id, target, port } => {
                self.start_connect(core, id, target, port, None)
            }
            DcEvent::Failed { id, reason, .. } => {
                let status = match reason {
                    FailReason::Timeout | FailReason::ConnectFailed => WcStatus::RetryExcErr,
                    FailReason::Rejected(RejectReason::BadKey) => WcStatus::RemAccessErr,
                    FailReason::Rejected(_) => WcStatus::RemInvReqErr,
                };
                if let Some(mut conn) = core.conns.remove(&id) {
                    if !conn.up {
                        self.pending.fetch_sub(1, Ordering::Relaxed);
                    }
                    fail_backlog(core, &mut conn, status, now);
                    if let Some(qp) = conn.qp.take() {
                        qp.disconnect();
                    }
                }
            }
            DcEvent::Teardown { id } => {
                // Idle by the table's account: nothing queued or in flight.
                if let Some(mut conn) = core.conns.remove(&id) {
                    if !conn.up {
                        self.pending.fetch_sub(1, Ordering::Relaxed);
                    }
                    fail_backlog(core, &mut conn, WcStatus::WrFlushErr, now);
                    if let Some(qp) = conn.qp.take() {
                        if conn.bound_dct.is_some() {
                            // The peer's last messages (acknowledged before
                            // its Unbound) are in the socket: read them
                            // into the DCT before closing.
                            qp.inner.progress_inline();
                        }
                        qp.disconnect();
                    }
                }
            }
            DcEvent::BindReceive { id, dct } => {
                let ok = match (core.conns.get(&id), core.dcts.get(&dct)) {
                    (Some(conn), Some(d)) if conn.pd == d.pd => conn
                        .qp
                        .as_ref()
                        .is_some_and(|qp| qp.bind_receive(d.srq.clone(), d.cq.clone()).is_ok()),
                    _ => false,
                };
                if ok {
                    if let Some(conn) = core.conns.get_mut(&id) {
                        conn.bound_dct = Some(dct);
                    }
                } else {
                    // Cannot happen by construction (one bind per
                    // connection, offered DCTs of its domain): the
                    // connection goes, the peer's work takes the normal
                    // path or fails as with a closed connection.
                    self.kill_conn(core, id, now);
                }
            }
            DcEvent::Bound { id, via } => {
                let qp = core.targets.get(&via).map(|t| t.qp.clone());
                match (core.conns.get_mut(&id), qp) {
                    (Some(conn), Some(qp)) => {
                        conn.qp = Some(qp);
                        conn.shared = true;
                        conn.up = true;
                        self.pending.fetch_sub(1, Ordering::Relaxed);
                        self.drain_backlog(core, id, now);
                    }
                    _ => self.kill_conn(core, id, now),
                }
            }
            DcEvent::Unbound { id } => {
                // Not closed here: the QP is the target connection's.
                if let Some(mut conn) = core.conns.remove(&id) {
                    if !conn.up {
                        self.pending.fetch_sub(1, Ordering::Relaxed);
                    }
                    fail_backlog(core, &mut conn, WcStatus::WrFlushErr, now);
                }
            }
            DcEvent::Drained { id } => {
                if !core.drained.contains(&id) {
                    core.drained.push(id);
                }
            }
            DcEvent::KeyRejected { dct, src } => {
                if let Some(d) = core.dcts.get_mut(&dct) {
                    d.rejected += 1;
                    if d.rejections.len() < MAX_REJECTIONS {
                        d.rejections.push_back(src);
                    }
                }
            }
        }
    }

    /// Creates the RC QP of initiator connection `id` (unless it has one
    /// not connected yet) and connects it to the target's listener at
    /// `port`, presenting `cookie`, or (`None`: the direct attempt, in
    /// parallel with the invitation) the DC key.
    fn start_connect(
        &self,
        core: &mut Core,
        id: ConnId,
        target: DcTarget,
        port: u16,
        cookie: Option<u64>,
    ) {
        let now = Instant::now();
        // Reverse use: this context's DCTs of the connection's domain
        // are offered to the peer (`docs/dc.md` §2).
        let offer = core.conns.get(&id).and_then(|conn| {
            let mut dcts: Vec<u32> = core
                .dcts
                .iter()
                .filter(|(_, d)| d.pd == conn.pd)
                .map(|(&n, _)| n)
                .collect();
            dcts.sort_unstable();
            core.table.offer(id, &dcts)
        });
        let Some(conn) = core.conns.get_mut(&id) else {
            return;
        };
        // A direct attempt still under way (it went to another port than
        // the Accept names) is dropped: the cookie decides.
        conn.opening = None;
        let qp = match conn.qp.clone() {
            Some(qp) if qp.link_state() == QpLinkState::Unconnected => qp,
            _ => {
                let ctx = self.ctx();
                let ib = ctx.ib_conn();
                match self.reserve_qpn(&ib) {
                    Ok(qpn) => {
                        let qp = ctx.create_qp(
                            qpn,
                            conn.pd,
                            QpCaps {
                                max_send_wr: RC_SQ,
                                max_recv_wr: 1,
                            },
                            self.data_cq.clone(),
                            self.data_cq.clone(),
                        );
                        // Eviction is normal operation, not an async error.
                        qp.set_internal();
                        let _ = ib.bind(qpn, &qp);
                        conn.qp = Some(qp.clone());
                        qp
                    }
                    Err(_) => {
                        match cookie {
                            Some(_) => core.table.connect_failed(id, now),
                            None => core.table.direct_failed(id, now),
                        }
                        return;
                    }
                }
            }
        };
        let pd = match cookie {
            Some(cookie) => {
                let mut pd = PD_MAGIC.to_vec();
                pd.extend_from_slice(&cookie.to_be_bytes());
                pd.extend_from_slice(&target.addr.qpn.to_be_bytes());
                pd.extend_from_slice(&id.0.to_be_bytes());
                pd
            }
            None => {
                let src = self.ctl_qp.local_addr();
                let mut pd = PD_MAGIC_DIRECT.to_vec();
                pd.extend_from_slice(&target.key.to_be_bytes());
                pd.extend_from_slice(&target.addr.qpn.to_be_bytes());
                pd.extend_from_slice(&id.0.to_be_bytes());
                pd.extend_from_slice(&src.qpn.to_be_bytes());
                pd.extend_from_slice(&src.port.to_be_bytes());
                pd
            }
        };
        let mut pd = pd;
        if let Some(o) = &offer {
            o.encode(&mut pd);
        }
        let addr = SocketAddr::new(target.addr.ip, port);
        conn.direct = cookie.is_none();
        core.max_rc = core.max_rc.max(rc_count(core));
        let conn = core.conns.get_mut(&id).expect("present");
        // Without blocking, driven by a busy poller and the progress
        // thread (no thread hand-off); a connector thread if that cannot
        // be set up (not for the direct attempt: the invitation goes on).
        match Opening::start(self, id, addr, &pd) {
            Ok(o) => {
                conn.opening = Some(o);
                return;
            }
            Err(_) if cookie.is_none() => {
                core.table.direct_failed(id, now);
                return;
            }
            Err(_) => {}
        }
        let job = ConnectJob {
            id,
            qp,
            addr,
            private_data: pd,
        };
        if self.connector.submit(job, &self.this).is_err() {
            core.table.connect_failed(id, now);
        }
    }

    /// Takes the non-blocking opening of `id` one step (socket ready, a
    /// poll, its deadline); on the MPA Reply the QP runs over the socket
    /// and the backlog goes out. The caller pumps and releases.
    fn advance_open(&self, core: &mut Core, id: ConnId, now: Instant) {
        let Some(conn) = core.conns.get_mut(&id) else {
            return;
        };
        let Some(op) = conn.opening.as_mut() else {
            return;
        };
        let ok = match op.step(now) {
            Step::Pending => return,
            Step::Failed => false,
            Step::Done(n) => {
                let op = conn.opening.take().expect("opening");
                let ctx = self.ctx();
                let sock = op.into_socket();
                let cfg = cm::rc_config(&ctx, &n, true, &sock);
                conn.qp
                    .as_ref()
                    .is_some_and(|qp| qp.attach(sock, cfg, n.first_fpdu_not_before).is_ok())
            }
        };
        conn.opening = None;
        if ok {
            conn.up = true;
            self.pending.fetch_sub(1, Ordering::Relaxed);
            core.table.connected(id, now);
            self.drain_backlog(core, id, now);
        } else if conn.direct {
            // The invitation goes on; the QP (never attached) is kept for
            // the cookie connection.
            conn.direct = false;
            core.table.direct_failed(id, now);
        } else {
            conn.qp = None;
            core.table.connect_failed(id, now);
        }
    }

    /// The progress thread: an opening's socket is ready or its deadline
    /// passed.
    fn on_open_ready(&self, id: ConnId) {
        let now = Instant::now();
        let mut c = self.lock();
        self.advance_open(&mut c, id, now);
        self.pump(&mut c, now);
        self.release(&mut c);
    }

    fn on_connected(&self, id: ConnId, ok: bool) {
        let now = Instant::now();
        let mut c = self.lock();
        let core = &mut *c;
        let Some(conn) = core.conns.get_mut(&id) else {
            return;
        };
        if ok {
            conn.up = true;
            self.pending.fetch_sub(1, Ordering::Relaxed);
            core.table.connected(id, now);
            self.drain_backlog(core, id, now);
        } else {
            conn.qp = None;
            core.table.connect_failed(id, now);
        }
        self.pump(core, now);
        self.release(core);
    }

    /// Internal RC completions: into the DCIs' reorder rings.
    fn on_data(&self, core: &mut Core, batch: &[Completion], now: Instant) {
        let mut touched: Vec<ConnId> = Vec::new();
        for c in batch {
            if matches!(c.wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                continue;
            }
            let Some(id) = finish_wc(core, &c.wc, now) else {
                continue;
            };
            if let Some(conn) = core.conns.get_mut(&id) {
                conn.inflight = conn.inflight.saturating_sub(1);
                if c.wc.status != WcStatus::Success {
                    conn.dead = true;
                }
                if !touched.contains(&id) {
                    touched.push(id);
                }
            }
        }
        for id in touched {
            if core.conns.get(&id).is_some_and(|c| c.dead) {
                self.kill_conn(core, id, now);
            } else {
                self.drain_backlog(core, id, now);
            }
        }
    }

    /// Moves completed prefixes of the DCIs' rings to their CQs.
    fn release(&self, core: &mut Core) {
        let Core { dcis, scratch, .. } = core;
        for st in dcis.values_mut() {
            if !st.dirty {
                continue;
            }
            st.dirty = false;
            scratch.clear();
            while st.ring.front().is_some_and(|s| s.done.is_some()) {
                let s = st.ring.pop_front().expect("front");
                st.base += 1;
                let wc = s.done.expect("done");
                if s.signaled || wc.status != WcStatus::Success {
                    scratch.push(Completion {
                        wc,
                        qp_num: st.qp_num,
                    });
                }
            }
            st.cq.push(scratch);
        }
    }

    // ------------------------------------------------------------------
    // Progress
    // ------------------------------------------------------------------

    /// Drains both internal CQs and acts on what they held; `inline_rc`
    /// (a busy poller): first reads and writes the sockets of the
    /// initiator connections with work in flight.
    fn drive(&self, core: &mut Core, with_ud: bool, inline_rc: bool) -> bool {
        let mut buf = [Completion {
            wc: WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0),
            qp_num: 0,
        }; 32];
        let mut now = None;
        let mut any = false;
        let mut progressed = !inline_rc;
        loop {
            let n = self.data_cq.poll(&mut buf);
            if n > 0 {
                any = true;
                let t = *now.get_or_insert_with(Instant::now);
                self.on_data(core, &buf[..n], t);
            }
            let m = if with_ud {
                self.ctl_cq.poll(&mut buf)
            } else {
                0
            };
            if m > 0 {
                any = true;
                let t = *now.get_or_insert_with(Instant::now);
                self.on_ctl(core, &buf[..m], t);
            }
            if n < buf.len() && m < buf.len() {
                // Completions already queued come first: a Send or Write
                // completes when written, so after a post the connection
                // is usually idle again and its socket need not be read.
                if progressed || !progress_in_flight(core) {
                    break;
                }
                progressed = true;
            }
        }
        if any {
            let now = now.unwrap_or_else(Instant::now);
            self.pump(core, now);
            self.release(core);
        }
        any
    }

    /// Invitation traffic (UD receives) and UD send completions.
    fn on_ctl(&self, core: &mut Core, batch: &[Completion], now: Instant) {
        for c in batch {
            if c.wc.opcode != WcOpcode::Recv {
                continue;
            }
            let slot = c.wc.wr_id as usize;
            let is_ctl = c.qp_num == self.ctl_qp.qpn();
            let msg = if is_ctl {
                self.ctl_buf.read(slot, c.wc.byte_len as usize)
            } else {
                core.dcts
                    .get(&c.qp_num)
                    .and_then(|d| d.buf.read(slot, c.wc.byte_len as usize))
            };
            // Repost first: the message is copied out.
            if is_ctl {
                let _ = self.ctl_qp.post_recv(self.ctl_buf.wr(slot));
            } else if let Some(d) = core.dcts.get(&c.qp_num) {
                let _ = d.ud.post_recv(d.buf.wr(slot));
            }
            let (Some(msg), Some(src)) = (msg, c.wc.src) else {
                continue;
            };
            if !is_ctl && core.table.live() >= core.table.config().capacity {
                reap(core, now);
            }
            core.table.handle_message(now, src, c.qp_num, &msg);
        }
    }

    fn on_timer_now(&self, now: Instant) {
        if self.poller_idle() {
            self.data_cq.req_notify(false);
        }
        let mut c = self.lock();
        let core = &mut *c;
        core.timer = None;
        self.drive(core, true, false);
        core.table.handle_timeout(now);
        if core.last_reap.is_none_or(|t| now >= t + REAP_EVERY) {
            reap(core, now);
        }
        self.pump(core, now);
        self.release(core);
        self.watch_poller(core);
    }

    /// While a poller is active the data CQ is not armed: check again in
    /// a moment whether it stopped.
    fn watch_poller(&self, core: &mut Core) {
        if self.poller_idle() {
            return;
        }
        let at = Instant::now() + POLLER_WATCH;
        if core.timer.is_none_or(|t| at < t) {
            core.timer = Some(at);
            if let Ok(p) = self.shared.progress() {
                p.set_timer(self.token, at);
            }
        }
    }

    fn on_channel(&self) {
        while self.channel.try_get_event().is_some() {}
        let mut c = self.lock();
        loop {
            self.ctl_cq.req_notify(false);
            // While an application busy-polls a DCI's CQ the data CQ is
            // drained inline: no channel wake-ups (an eventfd write per
            // completion and a progress thread fighting for the lock);
            // the timer below re-arms it once polling stops.
            if self.poller_idle() {
                self.data_cq.req_notify(false);
            }
            if !self.drive(&mut c, true, false) {
                break;
            }
        }
        self.watch_poller(&mut c);
    }

    /// A DCI's CQ was armed (its poller may block next): the progress
    /// thread takes over at once — the data CQ armed, the initiator
    /// sockets parked for the poller watched again — and what already
    /// completed moves to the DCIs' CQs.
    fn on_app_armed(&self) {
        self.inline_at.store(0, Ordering::Relaxed);
        self.data_cq.req_notify(false);
        let mut c = self.lock();
        for conn in c.conns.values() {
            if let Some(qp) = &conn.qp {
                qp.inner.notify_armed();
            }
        }
        self.drive(&mut c, true, false);
    }

    /// Marks the application active (a poll or a post): the data CQ stays
    /// unarmed. A clock read every 16th call is recent enough for
    /// `poller_idle` (calls take microseconds, POLLER_IDLE is 1 ms).
    fn touch(&self, core: &mut Core) {
        core.polls = core.polls.wrapping_add(1);
        if core.polls & 15 == 1 {
            self.inline_at.store(
                (self.epoch.elapsed().as_nanos() as u64).max(1),
                Ordering::Relaxed,
            );
        }
    }

    /// True if no thread drove the service from a CQ poll recently.
    fn poller_idle(&self) -> bool {
        let last = self.inline_at.load(Ordering::Relaxed);
        let now = self.epoch.elapsed().as_nanos() as u64;
        last == 0 || now.saturating_sub(last) > POLLER_IDLE.as_nanos() as u64
    }

    fn inline(&self) {
        let Ok(mut c) = self.core.try_lock() else {
            return;
        };
        self.touch(&mut c);
        let with_ud = self.pending.load(Ordering::Relaxed) > 0;
        if with_ud {
            // Invitation timers at the poller's resolution (the progress
            // thread's is a millisecond).
            let now = Instant::now();
            if c.table.poll_timeout().is_some_and(|t| t <= now) {
                c.table.handle_timeout(now);
                self.pump(&mut c, now);
            }
            // Connections being opened, by this poller.
            let opening: Vec<ConnId> = c
                .conns
                .iter()
                .filter(|(_, x)| x.opening.is_some())
                .map(|(&id, _)| id)
                .collect();
            if !opening.is_empty() {
                for id in opening {
                    self.advance_open(&mut c, id, now);
                }
                self.pump(&mut c, now);
                self.release(&mut c);
            }
        }
        self.drive(&mut c, with_ud, true);
    }

    // ------------------------------------------------------------------
    // Target
    // ------------------------------------------------------------------

    /// The first listener's port (the one Accepts name by default).
    fn main_port(&self) -> Option<u16> {
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first()
            .map(|l| l.port)
    }

    /// A TCP listener on port `port` (the UDP port of a DCT's socket:
    /// the port direct connection requests go to), watched by the
    /// progress thread; the first listener's port is the one Accepts name
    /// by default. If `port` is taken, the first listener binds any port
    /// (direct requests to that DCT then fail and its invitations
    /// decide). True if a listener of ours is on `port` (0: the first
    /// one, on any port).
    fn listener(&self, port: u16) -> Result<bool, DcError> {
        let mut ls = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        if ls.iter().any(|l| l.port == port) {
            return Ok(true);
        }
        let first = ls.is_empty();
        let l = match Listener::bind(&self.ctx(), SocketAddr::new(self.opts.bind_ip, port)) {
            Ok(l) => l,
            Err(_) if first => Listener::bind(&self.ctx(), SocketAddr::new(self.opts.bind_ip, 0))?,
            Err(_) => return Ok(false),
        };
        let lport = l.local_addr()?.port();
        let fd = l.as_raw_fd();
        // Accepted by the progress thread: never blocks.
        // SAFETY: fcntl on the listener's own descriptor, kept open by `l`.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error().into());
        }
        let src = Arc::new(ListenSource {
            svc: self.this.clone(),
            listener: Arc::new(l),
            port: lport,
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
        });
        self.shared
            .progress()?
            .register(fd, src.token, Arc::downgrade(&src))?;
        ls.push(src);
        if first {
            self.lock().table.set_listen_port(lport);
        }
        Ok(lport == port)
    }

    /// A TCP connection accepted by the progress thread: answered as
    /// soon as its MPA Request is all there — at once, or when the socket
    /// turns readable (watched by the progress thread, dropped after the
    /// MPA timeout). No thread hand-off either way.
    fn on_incoming(&self, sock: TcpStream, peer: SocketAddr, l: &Arc<Listener>) {
        match request_in(&sock) {
            ReqState::Whole => {
                let fd = sock.as_raw_fd();
                if l.handshake(sock, peer)
                    .is_ok_and(|inc| self.on_request(inc))
                {
                    first_fpdu_spin(fd);
                }
            }
            // Closed or failed: dropped.
            ReqState::Gone => {}
            ReqState::Part => self.slow_handshake(sock, peer, l),
            ReqState::Nothing => {
                let Ok(p) = self.shared.progress() else {
                    return;
                };
                let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
                let fd = sock.as_raw_fd();
                let hs = Arc::new(HandshakeSource {
                    svc: self.this.clone(),
                    listener: l.clone(),
                    conn: Mutex::new(Some((sock, peer))),
                    token,
                });
                let mut all = self.handshakes.lock().unwrap_or_else(|p| p.into_inner());
                if p.register(fd, token, Arc::downgrade(&hs)).is_err() {
                    return;
                }
                p.set_timer(token, Instant::now() + self.ctx().config().mpa_timeout);
                all.insert(token, hs);
            }
        }
    }

    /// A connection waiting for its MPA Request is readable (`timeout`:
    /// or its time is up).
    fn on_handshake_ready(&self, token: u64, timeout: bool) {
        let mut all = self.handshakes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(hs) = all.get(&token).cloned() else {
            return;
        };
        let mut conn = hs.conn.lock().unwrap_or_else(|p| p.into_inner());
        let ready = match conn.as_ref() {
            Some((sock, _)) if !timeout => request_in(sock),
            _ => ReqState::Gone,
        };
        if ready == ReqState::Nothing {
            return;
        }
        all.remove(&token);
        drop(all);
        if let Ok(p) = self.shared.progress() {
            if let Some((sock, _)) = conn.as_ref() {
                p.unregister(sock.as_raw_fd(), token);
            }
        }
        let taken = conn.take();
        drop(conn);
        match (ready, taken) {
            (ReqState::Whole, Some((sock, peer))) => {
                let fd = sock.as_raw_fd();
                if hs
                    .listener
                    .handshake(sock, peer)
                    .is_ok_and(|inc| self.on_request(inc))
                {
                    first_fpdu_spin(fd);
                }
            }
            (ReqState::Part, Some((sock, peer))) => self.slow_handshake(sock, peer, &hs.listener),
            _ => {}
        }
    }

    /// A Request that arrives in pieces (a readable socket the progress
    /// thread cannot wait on without spinning): the slow-handshake thread
    /// (started on first use) reads it with the blocking MPA exchange,
    /// bounded by the MPA timeout. Not the path of a softrdma initiator,
    /// which writes its Request in one piece.
    fn slow_handshake(&self, sock: TcpStream, peer: SocketAddr, l: &Arc<Listener>) {
        let mut slow = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        if slow.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<SlowHandshake>();
            let me = self.this.clone();
            let spawned = std::thread::Builder::new()
                .name("softrdma-dc-mpa".into())
                .spawn(move || {
                    for (sock, peer, l) in rx {
                        let Some(svc) = me.upgrade() else { return };
                        if let Ok(inc) = l.handshake(sock, peer) {
                            svc.on_request(inc);
                        }
                    }
                });
            if spawned.is_err() {
                // Dropped: the initiator sees the connection close.
                return;
            }
            *slow = Some(tx);
        }
        if let Some(tx) = slow.as_ref() {
            let _ = tx.send((sock, peer, l.clone()));
        }
    }

    /// Handles one RC connection request to a DCT.
    fn on_request(&self, inc: cm::Incoming) -> bool {
        let Some(req) = parse_request(inc.private_data(), inc.peer_addr().ip()) else {
            let _ = inc.reject(b"softrdma: not a DC connection request");
            return false;
        };
        let dct = req.dct;
        let ctx = self.ctx();
        let ib = ctx.ib_conn();
        let (qp, id) = {
            let mut c = self.lock();
            let core = &mut *c;
            let now = Instant::now();
            let id = match req.auth {
                Auth::Cookie(cookie) => core.table.target_attach(cookie, dct, req.conn),
                Auth::Key { key, src } => {
                    if core.table.live() >= core.table.config().capacity {
                        reap(core, now);
                    }
                    let id = core.table.target_direct(now, src, dct, key, req.conn);
                    // An eviction to make room: its Teardown.
                    self.pump(core, now);
                    id
                }
            };
            let Some(id) = id else {
                drop(c);
                let _ = inc.reject(b"softrdma: unknown DC invitation");
                return false;
            };
            let Some(d) = core.dcts.get(&dct) else {
                core.table.closed(id, Instant::now());
                drop(c);
                let _ = inc.reject(b"softrdma: no such DCT");
                return false;
            };
            let Ok(qpn) = self.reserve_qpn(&ib) else {
                core.table.closed(id, Instant::now());
                drop(c);
                let _ = inc.reject(b"softrdma: no QP number");
                return false;
            };
            // With a reverse offer, this side's DCIs may send over the
            // connection: its send completions go to the internal CQ
            // (into the DCIs' reorder rings) like an initiator QP's.
            let reverse = req.offer.is_some() && core.table.config().reverse;
            let qp = ctx.create_qp_with_srq(
                qpn,
                d.pd,
                QpCaps {
                    max_send_wr: if reverse { RC_SQ } else { 1 },
                    max_recv_wr: 1,
                },
                self.data_cq.clone(),
                d.cq.clone(),
                d.srq.clone(),
            );
            // Its closing is normal operation, not an async error.
            qp.set_internal();
            let _ = ib.bind(qpn, &qp);
            // Known (and its offer taken) before the accept lets the QP
            // deliver: an application that has a message from the peer
            // must find the connection, or its answer would open a
            // second one instead of going back over this one.
            core.targets.insert(
                id,
                TargetConn {
                    qp: qp.clone(),
                    dct,
                },
            );
            if reverse {
                if let Some(offer) = req.offer {
                    core.table.accept_offer(id, offer, d.pd);
                }
            }
            core.max_rc = core.max_rc.max(rc_count(core));
            (qp, id)
        };
        let ok = inc
            .accept(
                &qp,
                &ConnParams {
                    private_data: Vec::new(),
                    ird: 0,
                    ord: 0,
                },
            )
            .is_ok();
        let now = Instant::now();
        let mut c = self.lock();
        let core = &mut *c;
        if !ok {
            // (A DCT destroyed meanwhile has closed it already.)
            if core.targets.remove(&id).is_some() {
                qp.disconnect();
                core.table.closed(id, now);
            }
        } else {
            // Work of this side's DCIs bound to the connection while the
            // accept ran waited for it.
            let waiting: Vec<ConnId> = core
                .conns
                .iter()
                .filter(|(_, c)| {
                    c.shared
                        && c.qp
                            .as_ref()
                            .is_some_and(|q| Arc::ptr_eq(&q.inner, &qp.inner))
                })
                .map(|(&cid, _)| cid)
                .collect();
            for cid in waiting {
                self.drain_backlog(core, cid, now);
            }
        }
        self.pump(core, now);
        ok && core.targets.contains_key(&id)
    }

    fn add_dct(&self, pd: u32, cq: Arc<Cq>, srq: Arc<Srq>, key: u64) -> Result<u32, DcError> {
        let ctx = self.ctx();
        // The TCP listener first, then the DCT's UDP socket on the same
        // port number (the number direct requests go to): a pair free in
        // both port spaces. If that UDP port cannot be had (taken, or its
        // socket's slots are full), any port, and a listener is tried on
        // that number below.
        if self.main_port().is_none() {
            self.listener(0)?;
        }
        let ud_on = |port: u16| {
            ctx.create_ud_qp(
                self.ctl_pd,
                QpCaps {
                    max_send_wr: 256,
                    max_recv_wr: DCT_RECVS,
                },
                self.ctl_cq.clone(),
                self.ctl_cq.clone(),
                UdOptions {
                    bind: SocketAddr::new(self.opts.bind_ip, port),
                    ..UdOptions::default()
                },
            )
        };
        let ud = match self.main_port().map(ud_on) {
            Some(Ok(ud)) => ud,
            _ => ud_on(0)?,
        };
        let buf = RecvBuf::new(&self.shared, self.ctl_pd, DCT_RECVS)?;
        for i in 0..DCT_RECVS {
            ud.post_recv(buf.wr(i)).map_err(|_| DcError::Register)?;
        }
        let num = ud.qpn();
        let port = (num >> 8) as u16;
        let own = self.listener(port)?;
        let mut c = self.lock();
        c.table.add_dct(num, key);
        if own {
            c.table.set_dct_listen_port(num, port);
        }
        c.dcts.insert(
            num,
            DctState {
                ud,
                buf,
                pd,
                cq,
                srq,
                rejected: 0,
                rejections: VecDeque::new(),
                lost_no_receive: 0,
            },
        );
        Ok(num)
    }

    fn remove_dct(&self, num: u32) {
        let now = Instant::now();
        let mut c = self.lock();
        let core = &mut *c;
        core.table.remove_dct(num);
        core.dcts.remove(&num);
        let gone: Vec<ConnId> = core
            .targets
            .iter()
            .filter(|(_, t)| t.dct == num)
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            if let Some(t) = core.targets.remove(&id) {
                t.qp.disconnect();
            }
            core.table.closed(id, now);
        }
        // Initiator connections whose receive side delivers into it: the
        // peer must not reach a destroyed DCT over them.
        let bound: Vec<ConnId> = core
            .conns
            .iter()
            .filter(|(_, c)| c.bound_dct == Some(num))
            .map(|(&id, _)| id)
            .collect();
        for id in bound {
            self.kill_conn(core, id, now);
        }
        self.pump(core, now);
    }
}

impl Drop for DcService {
    fn drop(&mut self) {
        self.connector.close();
        if let Ok(p) = self.shared.progress() {
            p.unregister(self.channel.fd(), self.token);
        }
        let hs = self.handshakes.get_mut().unwrap_or_else(|p| p.into_inner());
        for (token, h) in hs.drain() {
            let conn = h.conn.lock().unwrap_or_else(|p| p.into_inner());
            if let (Ok(p), Some((sock, _))) = (self.shared.progress(), conn.as_ref()) {
                p.unregister(sock.as_raw_fd(), token);
            }
        }
        let ls = self.listeners.get_mut().unwrap_or_else(|p| p.into_inner());
        for l in ls.drain(..) {
            if let Ok(p) = self.shared.progress() {
                p.unregister(l.listener.as_raw_fd(), l.token);
            }
        }
        let c = self.core.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, conn) in c.conns.drain() {
            if let Some(qp) = conn.qp {
                qp.disconnect();
            }
        }
        for (_, t) in c.targets.drain() {
            t.qp.disconnect();
        }
    }
}

impl Source for DcService {
    fn on_ready(&self, _readable: bool, _writable: bool) {
        self.on_channel();
    }

    fn on_timer(&self, now: Instant) {
        self.on_timer_now(now);
    }
}

/// Busy-poll progress (receive, transmit) of the initiator connections
/// with work in flight (Read and atomic responses, a socket that pushed
/// back, an error); the others are left to the progress thread. True if
/// there was any.
fn progress_in_flight(core: &Core) -> bool {
    let mut any = false;
    for conn in core.conns.values() {
        if let (true, Some(qp)) = (conn.inflight > 0, conn.qp.as_ref()) {
            // Lock order: the core lock (held), then the QP's.
            qp.inner.progress_inline();
            any = true;
        }
    }
    any
}

fn rc_count(c: &Core) -> usize {
    c.conns
        .values()
        .filter(|x| x.qp.is_some() && !x.shared)
        .count()
        + c.targets.len()
}

/// Marks internal work request `wr_id` done with `status` (unless it is
/// done already).
fn finish(core: &mut Core, wr_id: u64, status: WcStatus, opcode: WcOpcode, now: Instant) {
    finish_wc(core, &WorkCompletion::new(wr_id, status, opcode, 0), now);
}

/// Marks the internal work request of `wc` done with `wc` (its wr_id
/// replaced by the application's); tells the table. The connection it
/// was posted to, if it was not done already.
fn finish_wc(core: &mut Core, wc: &WorkCompletion, now: Instant) -> Option<ConnId> {
    let (dci, seq) = untag(wc.wr_id);
    let st = core.dcis.get_mut(&dci)?;
    let slot = st.ring.get_mut(seq.wrapping_sub(st.base) as usize)?;
    if slot.done.is_some() {
        return None;
    }
    slot.done = Some(WorkCompletion {
        wr_id: slot.wr_id,
        ..*wc
    });
    st.dirty = true;
    let id = slot.conn;
    core.table.completed(id, now);
    Some(id)
}

fn fail_backlog(core: &mut Core, conn: &mut Conn, status: WcStatus, now: Instant) {
    while let Some(wr) = conn.backlog.pop_front() {
        finish(core, wr.wr_id, status, WcOpcode::of(&wr.op), now);
    }
}

/// How a DC connection request proves it may connect.
enum Auth {
    /// An Accept's cookie.
    Cookie(u64),
    /// The DC key (a direct request) and the initiator's invitation
    /// address (to find the reservation its invitation may have made).
    Key { key: u64, src: DgramAddr },
}

/// A DC connection request's private data.
struct Request {
    auth: Auth,
    dct: u32,
    conn: u64,
    /// The initiator's reverse offer (after the fixed part; none in the
    /// old format).
    offer: Option<ReverseOffer>,
}

/// Length of the fixed part of a cookie request's private data.
const PD_COOKIE_LEN: usize = 24;
/// Length of the fixed part of a direct request's private data.
const PD_DIRECT_LEN: usize = 30;

/// Parses the private data of a DC connection request ([`PD_MAGIC`] or
/// [`PD_MAGIC_DIRECT`]) from `peer`.
fn parse_request(pd: &[u8], peer: IpAddr) -> Option<Request> {
    let u64_at = |i: usize| Some(u64::from_be_bytes(pd.get(i..i + 8)?.try_into().ok()?));
    let u32_at = |i: usize| Some(u32::from_be_bytes(pd.get(i..i + 4)?.try_into().ok()?));
    match pd.get(..4)? {
        m if m == PD_MAGIC => Some(Request {
            auth: Auth::Cookie(u64_at(4)?),
            dct: u32_at(12)?,
            conn: u64_at(16)?,
            offer: pd.get(PD_COOKIE_LEN..).and_then(ReverseOffer::decode),
        }),
        m if m == PD_MAGIC_DIRECT => {
            let port = u16::from_be_bytes(pd.get(28..30)?.try_into().ok()?);
            Some(Request {
                auth: Auth::Key {
                    key: u64_at(4)?,
                    src: DgramAddr {
                        ip: peer,
                        port,
                        qpn: u32_at(24)?,
                    },
                },
                dct: u32_at(12)?,
                conn: u64_at(16)?,
                offer: pd.get(PD_DIRECT_LEN..).and_then(ReverseOffer::decode),
            })
        }
        _ => None,
    }
}

/// Forgets target connections whose QP has failed or closed.
fn reap(core: &mut Core, now: Instant) {
    core.last_reap = Some(now);
    let gone: Vec<ConnId> = core
        .targets
        .iter()
        .filter(|(_, t)| t.qp.link_state() == QpLinkState::Error)
        .map(|(&id, _)| id)
        .collect();
    for id in gone {
        if let Some(t) = core.targets.remove(&id) {
            count_no_receive(core, &t.qp, t.dct);
        }
        core.table.closed(id, now);
    }
}

/// Counts `qp`'s failure on DCT `dct` if a Send found the SRQ empty.
fn count_no_receive(core: &mut Core, qp: &Qp, dct: u32) {
    if matches!(
        qp.terminate_cause(),
        Some((TerminateCause::DdpUntaggedNoBuffer, false))
    ) {
        if let Some(d) = core.dcts.get_mut(&dct) {
            d.lost_no_receive += 1;
        }
    }
}

/// What one step of an [`Opening`] came to.
enum Step {
    /// Waiting for the socket.
    Pending,
    /// Refused, reset, timed out, rejected.
    Failed,
    /// The MPA Reply accepted the connection.
    Done(Negotiated),
}

/// The progress thread's handle on an [`Opening`]'s socket.
struct OpenSource {
    svc: Weak<DcService>,
    id: ConnId,
}

impl Source for OpenSource {
    fn on_ready(&self, _readable: bool, _writable: bool) {
        if let Some(s) = self.svc.upgrade() {
            s.on_open_ready(self.id);
        }
    }

    fn on_timer(&self, _now: Instant) {
        if let Some(s) = self.svc.upgrade() {
            s.on_open_ready(self.id);
        }
    }
}

/// An initiator RC connection opened without blocking: TCP connect in
/// progress, then the MPA Request written, then the Reply read with exact
/// lengths (header, then the rest of the frame: no FPDU octet is
/// consumed), as [`cm::connect`] does with blocking calls. The socket is
/// watched by the progress thread (writable until the Request is out,
/// then readable) and stepped by busy pollers too.
struct Opening {
    shared: Arc<Shared>,
    sock: Option<TcpStream>,
    ini: Initiator,
    /// Request octets not written yet.
    out: Vec<u8>,
    /// Reply octets read so far, and how many the frame has (the header's
    /// length until it is in).
    frame: Vec<u8>,
    need: usize,
    deadline: Instant,
    park: Parking,
    source: Arc<OpenSource>,
}

impl Opening {
    fn start(svc: &DcService, id: ConnId, addr: SocketAddr, pd: &[u8]) -> io::Result<Box<Opening>> {
        let ctx = svc.ctx();
        let now = Instant::now();
        let params = ConnParams {
            private_data: pd.to_vec(),
            ird: 0,
            ord: 0,
        };
        let mut ini = Initiator::new(cm::mpa_config(&ctx, &params), now)
            .map_err(|e| io::Error::other(format!("MPA: {e:?}")))?;
        let mut out = Vec::new();
        while let Some(b) = ini.poll_transmit() {
            let n = b.len();
            out.extend_from_slice(b);
            ini.transmitted(n);
        }
        let sock = crate::sys::nb_connect(addr, svc.shared.config.tcp_congestion.as_deref())?;
        sock.set_nodelay(true)?;
        let source = Arc::new(OpenSource {
            svc: svc.this.clone(),
            id,
        });
        let op = Box::new(Opening {
            shared: svc.shared.clone(),
            sock: Some(sock),
            ini,
            out,
            frame: Vec::with_capacity(HEADER_LEN + 64),
            need: HEADER_LEN,
            deadline: now + ctx.config().mpa_timeout,
            park: Parking::default(),
            source,
        });
        let mut op = op;
        // A loopback connect is usually made by now: the Request goes out
        // at once (the Reply is read by later steps), and the progress
        // thread need not be woken for writability.
        if !op.flush() {
            return Err(io::Error::other("DC connection request failed"));
        }
        let p = svc.shared.progress()?;
        let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        let fd = op.sock.as_ref().map(|s| s.as_raw_fd()).expect("socket");
        op.park.register(p, fd, token, Arc::downgrade(&op.source))?;
        if !op.out.is_empty() {
            op.park.watch_write(p, true)?;
        }
        p.set_timer(token, op.deadline);
        Ok(op)
    }

    /// Writes what is left of the Request. False if the socket failed;
    /// `out` is empty once it is all written (else: still connecting, or
    /// the socket pushed back).
    fn flush(&mut self) -> bool {
        let Some(sock) = self.sock.as_mut() else {
            return false;
        };
        while !self.out.is_empty() {
            match crate::sys::NoSigPipe(sock).write(&self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                // Still connecting.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected
                    ) =>
                {
                    return true
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
            if self.out.is_empty() {
                if let Ok(p) = self.shared.progress() {
                    let _ = self.park.watch_write(p, false);
                }
            }
        }
        true
    }

    fn step(&mut self, now: Instant) -> Step {
        if now >= self.deadline {
            return Step::Failed;
        }
        if !self.flush() {
            return Step::Failed;
        }
        if !self.out.is_empty() {
            return Step::Pending;
        }
        let Some(sock) = self.sock.as_mut() else {
            return Step::Failed;
        };
        let mut tmp = [0u8; 512];
        while self.frame.len() < self.need {
            let want = (self.need - self.frame.len()).min(tmp.len());
            match sock.read(&mut tmp[..want]) {
                Ok(0) => return Step::Failed,
                Ok(n) => {
                    self.frame.extend_from_slice(&tmp[..n]);
                    if self.need == HEADER_LEN && self.frame.len() == HEADER_LEN {
                        self.need = mpa_frame_len(&self.frame).unwrap_or(HEADER_LEN);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Failed,
            }
        }
        if self.ini.handle_bytes(&self.frame, now).is_err() {
            return Step::Failed;
        }
        // Anything the initiator sends after the Reply (nothing today):
        // a few octets on an idle socket.
        while let Some(b) = self.ini.poll_transmit() {
            let n = b.len();
            if crate::sys::NoSigPipe(sock).write_all(b).is_err() {
                return Step::Failed;
            }
            self.ini.transmitted(n);
        }
        match self.ini.poll_outcome() {
            Some(Outcome::Negotiated(n)) => Step::Done(n),
            _ => Step::Failed,
        }
    }

    /// Stops watching the socket and hands it over.
    fn into_socket(mut self: Box<Self>) -> TcpStream {
        self.unwatch();
        self.sock.take().expect("socket")
    }

    fn unwatch(&self) {
        if let Ok(p) = self.shared.progress() {
            self.park.unregister(p);
        }
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.unwatch();
    }
}

/// Connector threads kept at most (more connections being opened at once
/// wait for one).
const MAX_CONNECTORS: usize = 8;
/// A connector thread beyond the first ends after this long without work.
const CONNECTOR_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// An initiator connection to open (after an Accept).
struct ConnectJob {
    id: ConnId,
    qp: Qp,
    addr: SocketAddr,
    private_data: Vec<u8>,
}

#[derive(Default)]
struct ConnectorState {
    jobs: VecDeque<ConnectJob>,
    workers: usize,
    idle: usize,
    closed: bool,
}

/// Persistent threads running the blocking [`cm::connect`] of initiator
/// connections (one waits from the service's start; more are started
/// while every one is busy, up to [`MAX_CONNECTORS`]), instead of a thread
/// per connection.
#[derive(Default)]
struct Connector {
    state: Mutex<ConnectorState>,
    cv: std::sync::Condvar,
}

impl Connector {
    fn lock(&self) -> MutexGuard<'_, ConnectorState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn submit(self: &Arc<Self>, job: ConnectJob, svc: &Weak<DcService>) -> io::Result<()> {
        let mut st = self.lock();
        st.jobs.push_back(job);
        let spawn = st.idle < st.jobs.len() && st.workers < MAX_CONNECTORS;
        drop(st);
        self.cv.notify_one();
        if spawn {
            if let Err(e) = self.spawn_worker(svc) {
                // Nobody may run it: take it back unless a worker exists.
                let mut st = self.lock();
                if st.workers == 0 {
                    st.jobs.clear();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn spawn_worker(self: &Arc<Self>, svc: &Weak<DcService>) -> io::Result<()> {
        self.lock().workers += 1;
        let (me, svc) = (self.clone(), svc.clone());
        std::thread::Builder::new()
            .name("softrdma-dc-connect".into())
            .spawn(move || me.work(svc))
            .map(|_| ())
            .inspect_err(|_| self.lock().workers -= 1)
    }

    fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }

    fn work(&self, svc: Weak<DcService>) {
        loop {
            let job = {
                let mut st = self.lock();
                loop {
                    if st.closed {
                        st.workers -= 1;
                        return;
                    }
                    if let Some(j) = st.jobs.pop_front() {
                        break j;
                    }
                    st.idle += 1;
                    let (g, to) = self
                        .cv
                        .wait_timeout(st, CONNECTOR_IDLE)
                        .unwrap_or_else(|p| p.into_inner());
                    st = g;
                    st.idle -= 1;
                    if to.timed_out() && st.jobs.is_empty() && st.workers > 1 {
                        st.workers -= 1;
                        return;
                    }
                }
            };
            // The context only (not the service) across the blocking call:
            // the service may go meanwhile.
            let Some(ctx) = svc.upgrade().map(|s| s.ctx()) else {
                continue;
            };
            let ok = cm::connect(
                &ctx,
                &job.qp,
                job.addr,
                &ConnParams {
                    private_data: job.private_data,
                    ird: 0,
                    ord: 0,
                },
            )
            .is_ok();
            if let Some(s) = svc.upgrade() {
                s.on_connected(job.id, ok);
            }
        }
    }
}

/// How long the progress thread waits, spinning, for the first FPDU of a
/// connection it has just accepted.
const FIRST_FPDU_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// After the MPA Reply went out from the progress thread: the initiator's
/// first work request follows within microseconds on a busy-polling
/// initiator, so the thread looks at the new connection's socket `fd` for
/// up to [`FIRST_FPDU_SPIN`] instead of going to sleep and being woken
/// for it (a thread wake-up costs far more than that on a loaded
/// machine). It returns as soon as the socket is readable (the progress
/// loop's next `epoll_wait` then reports it at once) or closed.
fn first_fpdu_spin(fd: std::os::fd::RawFd) {
    let until = Instant::now() + FIRST_FPDU_SPIN;
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // A descriptor closed meanwhile is reported as POLLNVAL.
        // SAFETY: one live pollfd on the stack, timeout 0 (never blocks).
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n != 0 || Instant::now() >= until {
            return;
        }
        std::hint::spin_loop();
    }
}

/// An accepted connection whose Request arrives in pieces, for the
/// slow-handshake thread.
type SlowHandshake = (TcpStream, SocketAddr, Arc<Listener>);

/// How much of an MPA Request has arrived on an accepted connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReqState {
    /// All of it.
    Whole,
    /// Nothing yet.
    Nothing,
    /// A part (the socket stays readable: not for the progress thread).
    Part,
    /// Closed, failed, or a frame larger than [`MAX_REQUEST`].
    Gone,
}

/// Looks (without consuming) at what has arrived of the MPA Request on
/// `sock`.
fn request_in(sock: &TcpStream) -> ReqState {
    let mut buf = [0u8; MAX_REQUEST];
    if sock.set_nonblocking(true).is_err() {
        return ReqState::Gone;
    }
    let r = sock.peek(&mut buf);
    if sock.set_nonblocking(false).is_err() {
        return ReqState::Gone;
    }
    match r {
        Ok(0) => ReqState::Gone,
        Ok(n) if n >= HEADER_LEN => match mpa_frame_len(&buf[..HEADER_LEN]) {
            Some(len) if len <= n => ReqState::Whole,
            Some(len) if len <= MAX_REQUEST => ReqState::Part,
            _ => ReqState::Gone,
        },
        Ok(_) => ReqState::Part,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => ReqState::Nothing,
        Err(_) => ReqState::Gone,
    }
}

/// Largest MPA Request frame a DC listener takes (the header, the most
/// private data MPA allows and its IRD/ORD word).
const MAX_REQUEST: usize = HEADER_LEN + 512 + 4;

/// An accepted connection whose MPA Request is still coming, watched by
/// the progress thread.
struct HandshakeSource {
    svc: Weak<DcService>,
    listener: Arc<Listener>,
    conn: Mutex<Option<(TcpStream, SocketAddr)>>,
    token: u64,
}

impl Source for HandshakeSource {
    fn on_ready(&self, _readable: bool, _writable: bool) {
        if let Some(s) = self.svc.upgrade() {
            s.on_handshake_ready(self.token, false);
        }
    }

    fn on_timer(&self, _now: Instant) {
        if let Some(s) = self.svc.upgrade() {
            s.on_handshake_ready(self.token, true);
        }
    }
}

/// A DC service's TCP listener, accepted by the progress thread.
struct ListenSource {
    svc: Weak<DcService>,
    listener: Arc<Listener>,
    port: u16,
    token: u64,
}

impl Source for ListenSource {
    fn on_ready(&self, _readable: bool, _writable: bool) {
        let Some(svc) = self.svc.upgrade() else {
            return;
        };
        // Everything pending (the listener does not block); a full
        // descriptor table leaves the rest for the next readiness.
        while let Ok((sock, peer)) = self.listener.accept_tcp() {
            svc.on_incoming(sock, peer, &self.listener);
        }
    }
}

/// Inline progress hook attached to a DCI's CQ.
struct Hook {
    svc: Weak<DcService>,
}

impl InlineProgress for Hook {
    fn progress_inline(&self, _direct: &mut crate::cq::Direct<'_>) {
        if let Some(s) = self.svc.upgrade() {
            s.inline();
        }
    }
    fn progress_key(&self) -> usize {
        self.svc.as_ptr() as usize
    }
    fn notify_armed(&self) {
        if let Some(s) = self.svc.upgrade() {
            s.on_app_armed();
        }
    }
}

// ----------------------------------------------------------------------
// Public objects
// ----------------------------------------------------------------------

/// A DC initiator: one send queue reaching any DCT (per-WR destination).
pub struct Dci {
    svc: Arc<DcService>,
    id: u32,
    qp_num: u32,
    _hook: Arc<Hook>,
}

impl std::fmt::Debug for Dci {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dci").field("qp_num", &self.qp_num).finish()
    }
}

impl Dci {
    /// A DCI of `svc` posting with memory of protection domain `pd`,
    /// completing into `cq` (at most `max_send_wr` outstanding).
    pub fn new(svc: &Arc<DcService>, pd: u32, cq: Arc<Cq>, max_send_wr: usize) -> Dci {
        let hook = Arc::new(Hook {
            svc: Arc::downgrade(svc),
        });
        cq.attach(Arc::downgrade(&hook));
        let mut c = svc.lock();
        let id = c.next_dci;
        c.next_dci = (c.next_dci + 1) & 0x00ff_ffff;
        // The number completions carry: the service's UD QPN's port and a
        // per-service DCI index are not unique enough to mean anything
        // else; it is reported as-is.
        let qp_num = id;
        c.dcis.insert(
            id,
            DciState {
                cq,
                qp_num,
                pd,
                depth: max_send_wr.max(1),
                base: 0,
                ring: VecDeque::with_capacity(max_send_wr.max(1)),
                dirty: false,
            },
        );
        drop(c);
        Dci {
            svc: svc.clone(),
            id,
            qp_num,
            _hook: hook,
        }
    }

    /// The number this DCI's completions carry in `qp_num`.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Posts `wr` to the DCT `target.addr.qpn` at `target.addr`, with the
    /// DC access key `target.key` (`target.local` is ignored).
    pub fn post_send(&self, wr: SendWr, target: DcTarget) -> Result<(), QpError> {
        self.svc.post(self.id, wr, target)
    }

    /// Work requests posted and not yet completed to the CQ.
    pub fn outstanding(&self) -> usize {
        self.svc
            .lock()
            .dcis
            .get(&self.id)
            .map_or(0, |d| d.ring.len())
    }

    /// The service (table counters).
    pub fn service(&self) -> &Arc<DcService> {
        &self.svc
    }
}

impl Drop for Dci {
    fn drop(&mut self) {
        self.svc.lock().dcis.remove(&self.id);
    }
}

/// A DC target: accepts RC connections from any DCI presenting its key;
/// incoming Sends take receives from its SRQ and complete into its CQ.
pub struct Dct {
    svc: Arc<DcService>,
    num: u32,
    addr: DgramAddr,
}

impl std::fmt::Debug for Dct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dct").field("num", &self.num).finish()
    }
}

impl Dct {
    /// A DCT of `svc` in protection domain `pd` with access key `key`.
    pub fn new(
        svc: &Arc<DcService>,
        pd: u32,
        cq: Arc<Cq>,
        srq: Arc<Srq>,
        key: u64,
    ) -> Result<Dct, DcError> {
        let num = svc.add_dct(pd, cq, srq, key)?;
        let addr = svc
            .lock()
            .dcts
            .get(&num)
            .map(|d| d.ud.local_addr())
            .expect("just added");
        Ok(Dct {
            svc: svc.clone(),
            num,
            addr,
        })
    }

    /// The DCT number (its invitation UD QP's number).
    pub fn number(&self) -> u32 {
        self.num
    }

    /// The DCT's UD address (`qpn` = [`Dct::number`]; the IP may be
    /// unspecified when bound to every interface).
    pub fn address(&self) -> DgramAddr {
        self.addr
    }

    /// A counter of this DCT's state (0 once the DCT is gone).
    fn counter(&self, of: impl FnOnce(&DctState) -> u64) -> u64 {
        self.svc.lock().dcts.get(&self.num).map_or(0, of)
    }

    /// Invitations rejected for a wrong key so far.
    pub fn rejected(&self) -> u64 {
        self.counter(|d| d.rejected)
    }

    /// Connections to this DCT that failed because a Send found its SRQ
    /// empty (iWARP has no receiver-not-ready retry: the connection is
    /// terminated, the Send and whatever followed it on that connection
    /// are lost, and the initiator's later work on it fails; `docs/dc.md`
    /// §4). Nothing else tells the target's application: the connections
    /// are internal and raise no async events.
    pub fn connections_lost_no_receive(&self) -> u64 {
        self.counter(|d| d.lost_no_receive)
    }

    /// The sources of rejected invitations not read yet (oldest first; at
    /// most 256 are kept, the count in [`Dct::rejected`] is exact).
    pub fn take_rejections(&self) -> Vec<DgramAddr> {
        self.svc
            .lock()
            .dcts
            .get_mut(&self.num)
            .map_or(Vec::new(), |d| d.rejections.drain(..).collect())
    }

    /// The service (table counters).
    pub fn service(&self) -> &Arc<DcService> {
        &self.svc
    }
}

impl Drop for Dct {
    fn drop(&mut self) {
        self.svc.remove_dct(self.num);
    }
}
