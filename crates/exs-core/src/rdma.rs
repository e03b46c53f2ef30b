//! The RDMA model (UNH-EXS): `exs_socket` descriptors over softrdma RC
//! queue pairs connected through the verbs crate's connection manager.
//!
//! A send advertises its buffer (address, length, STag) in a control
//! message; the receiver's `exs_recv` pulls it with one RDMA Read straight
//! into the application's buffer and acknowledges, which completes the
//! send. Sends up to the connection's small-packet size carry their data
//! in the advertisement (immediate data: no Read, no acknowledgement).
//! Advertisements are limited by credits negotiated at connect, and every
//! control message finds a posted receive (iWARP has no retry). The wire
//! format is in [`crate::wire`] and `docs/exs.md`.
//!
//! Descriptors are eventfds: real descriptors of the process that never
//! collide with a kernel socket. One lock guards every descriptor; the
//! progress thread sleeps on the library's completion channel (every
//! connection's CQ reports to it) and, every [`TICK`], looks at every
//! connection, so a peer's death is seen even when no completion reports
//! it.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use libc::{c_int, sockaddr, socklen_t};
use softrdma_verbs::{
    cm, Access, Completion, CompletionChannel, CompletionQueue, Context, InlineData, MemoryRegion,
    Payload, ProtectionDomain, QpCaps, QpLinkState, QueuePair, RecvWr, SendFlags, SendOp, SendWr,
    SgList, WcOpcode, WcStatus, WorkCompletion,
};

use crate::abi::*;
use crate::engine::engine;
use crate::queue::Queue;
use crate::sys;
use crate::wire::{self, Msg, Params, IMM_MAX, MAX_CREDITS, MSG_MAX};
use crate::Errno;

/// Credits when `exs_fcntl` did not set them.
pub const DEFAULT_CREDITS: u32 = 64;
/// Immediate-data threshold when `exs_fcntl` did not set it.
pub const DEFAULT_SMALL: u32 = 128;
/// `exs_fcntl` commands of the RDMA model.
pub const EXS_F_SETCREDITS: c_int = 0x4558_0101;
/// Reads the credits (negotiated once connected).
pub const EXS_F_GETCREDITS: c_int = 0x4558_0102;
/// Sets the immediate-data threshold (`small_packet_max_size`).
pub const EXS_F_SETSMALL: c_int = 0x4558_0103;
/// Reads it (negotiated once connected).
pub const EXS_F_GETSMALL: c_int = 0x4558_0104;

/// How often the progress thread looks at every connection.
const TICK: Duration = Duration::from_millis(20);
/// RDMA Reads in flight per connection (the connection's ORD).
const MAX_READS: usize = 16;
/// Receives beyond the two credit windows (credit messages and FIN).
const EXTRA_RECVS: usize = 4;
/// RDMA Writes into the peer's persistent receive block in flight.
const MAX_WRITES: usize = 16;

const TAG_CTRL: u64 = 0;
const TAG_IMM: u64 = 1;
const TAG_READ: u64 = 2;
const TAG_WRITE: u64 = 3;

pub(crate) struct Dev {
    pub(crate) ctx: Context,
    pub(crate) pd: ProtectionDomain,
    ch: CompletionChannel,
}

static DEV: OnceLock<Result<Dev, Errno>> = OnceLock::new();
static ST: OnceLock<Mutex<RState>> = OnceLock::new();
static ACTIVE: AtomicBool = AtomicBool::new(false);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) fn dev() -> Result<&'static Dev, Errno> {
    let d = DEV
        .get_or_init(|| {
            // Under the sockets interposer: its device (DDPMODE sockets).
            let (ctx, pd) = match crate::ddp::host_device() {
                Some(d) => d,
                None => {
                    let ctx = Context::open().map_err(|_| libc::ENODEV)?;
                    let pd = ctx.alloc_pd();
                    (ctx, pd)
                }
            };
            let ch = ctx.create_comp_channel().map_err(|_| libc::EMFILE)?;
            Ok(Dev { ctx, pd, ch })
        })
        .as_ref()
        .map_err(|e| *e)?;
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("exs-rdma".into())
            .spawn(progress_thread);
    });
    Ok(d)
}

fn st() -> MutexGuard<'static, RState> {
    ST.get_or_init(|| Mutex::new(RState::default()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Whether `fd` is a descriptor of the RDMA model.
pub fn owns(fd: c_int) -> bool {
    ACTIVE.load(Ordering::Acquire) && st().socks.contains_key(&fd)
}

/// How long a thread waiting in `exs_qdequeue` polls the connections'
/// completion queues itself before it sleeps, unless
/// `SOFTRDMA_EXS_SPIN_US` says otherwise.
pub const SPIN: Duration = Duration::from_micros(50);

/// [`SPIN`], or `SOFTRDMA_EXS_SPIN_US` (microseconds; 0: sleep at once).
pub fn spin() -> Duration {
    static US: OnceLock<u64> = OnceLock::new();
    Duration::from_micros(*US.get_or_init(|| {
        std::env::var("SOFTRDMA_EXS_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(SPIN.as_micros() as u64)
    }))
}

/// Whether the RDMA model has been used in this process.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Drives every connection in the caller's thread: takes completions
/// (the engine's inline progress reads the wire in this thread too),
/// matches, posts, and queues the events of what finished. Without `arm`
/// it gives up at once when another thread holds the model's lock and
/// leaves the CQs as they are (a CQ that was armed stays armed, so the
/// progress thread still hears of what this poller does not take); with
/// `arm` it waits for the lock and re-arms every CQ, which a poller does
/// before it sleeps. Returns whether it polled.
pub fn poll_inline(arm: bool) -> bool {
    if !active() {
        return false;
    }
    let Some(m) = ST.get() else { return false };
    let mut g = if arm {
        m.lock().unwrap_or_else(|e| e.into_inner())
    } else {
        match m.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        }
    };
    let g = &mut *g;
    for (fd, s) in g.socks.iter_mut() {
        if s.conn.is_some() {
            s.drive_opt(*fd, arm);
            s.publish(*fd);
        }
    }
    g.forget();
    true
}

/// Threads inside `exs_qdequeue` while the RDMA model is in use.
static WAITERS: AtomicUsize = AtomicUsize::new(0);
/// When the last one left ([`now_ns`]).
static LAST_EXIT: AtomicU64 = AtomicU64::new(0);
/// The progress thread sleeps long, away from the channel (a waiter has
/// it): the waiter that leaves last wakes it through [`kick`].
static PT_AWAY: AtomicBool = AtomicBool::new(false);
/// How long after the last waiter left the progress thread still leaves
/// the channel alone (an application between two `exs_qdequeue` calls
/// comes back sooner; what arrives meanwhile is found by its polls).
const HANDBACK: Duration = Duration::from_millis(1);

fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// The progress thread's wake-up eventfd.
fn kick() -> c_int {
    static FD: OnceLock<c_int> = OnceLock::new();
    // SAFETY: no pointer arguments.
    *FD.get_or_init(|| unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })
}

/// A thread waiting in `exs_qdequeue` (see [`Waiter::enter`]).
pub struct Waiter(());

impl Waiter {
    /// Counts the calling thread as a waiter: it drives the connections
    /// itself (polling, then sleeping on the completion channel), so the
    /// progress thread stays off the channel meanwhile and a completion
    /// wakes one thread, not two that then fight for the lock.
    pub fn enter() -> Waiter {
        WAITERS.fetch_add(1, Ordering::SeqCst);
        Waiter(())
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        LAST_EXIT.store(now_ns(), Ordering::Release);
        // SeqCst with the progress thread's store of PT_AWAY and load of
        // WAITERS: one of the two sees the other (no lost wake-up).
        if WAITERS.fetch_sub(1, Ordering::SeqCst) == 1 && PT_AWAY.swap(false, Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 octets from a local.
            unsafe { libc::write(kick(), (&one as *const u64).cast(), 8) };
        }
    }
}

/// The completion channel every connection's CQ reports to, once the
/// RDMA model is in use.
pub fn channel_fd() -> Option<c_int> {
    match DEV.get() {
        Some(Ok(d)) => Some(d.ch.fd()),
        _ => None,
    }
}

/// Takes the channel's pending CQ ids and drives their connections: what
/// the progress thread does when the channel wakes it, done by whichever
/// thread gets there first (a waiter in `exs_qdequeue` or the progress
/// thread; the other finds nothing left).
pub fn progress_channel() {
    let Some(Ok(d)) = DEV.get() else { return };
    let mut ids: [u64; 16] = [0; 16];
    let mut n = 0;
    let mut more = false;
    while let Some(id) = d.ch.get_event(Some(Duration::ZERO)) {
        if n == ids.len() {
            more = true;
            break;
        }
        ids[n] = id;
        n += 1;
    }
    if n == 0 {
        return;
    }
    let mut s = st();
    for id in &ids[..n] {
        if let Some(&fd) = s.cqs.get(id) {
            s.drive(fd);
        }
    }
    if more {
        let fds: Vec<c_int> = s.cqs.values().copied().collect();
        for fd in fds {
            s.drive(fd);
        }
    }
}

/// Removes `stag` from the engine (`exs_mderegister` of a region the
/// RDMA model used).
pub fn deregister(stag: u32) {
    if let Some(Ok(d)) = DEV.get() {
        d.ctx.engine().registry().deregister(stag);
    }
}

fn reg_user(addr: usize, len: usize, access: Access) -> Result<u32, Errno> {
    let d = dev()?;
    // SAFETY: the application registered (or passed) this mapped range
    // and keeps it valid while registered, as the API requires.
    unsafe {
        d.ctx
            .engine()
            .registry()
            .register(addr as *mut u8, len, addr as u64, access, d.pd.number())
    }
    .map_err(|_| libc::ENOMEM)
}

fn all_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

/// One send or receive.
struct XOp {
    q: Arc<Queue>,
    ah: usize,
    buf: usize,
    len: usize,
    flags: c_int,
    mh: c_int,
    /// A temporary registration of an unregistered buffer.
    tmp: Option<u32>,
    seq: u32,
    adv: bool,
    done: Option<Errno>,
    nbytes: usize,
    trunc: bool,
    /// `exs_send_offset` / `exs_recv_offset`: the offset in the peer's
    /// persistent block.
    offset: Option<u64>,
    /// A persistent send (its PADV) or receive (its PRECV); the note flag.
    persist: Option<bool>,
    /// Which call it is (its event's type and what completion does).
    kind: XKind,
}

/// One of this end's persistent blocks: registered exactly (so the peer
/// reaches nothing else) until the descriptor goes.
struct PBlock {
    q: Arc<Queue>,
    ah: usize,
    buf: usize,
    len: usize,
    stag: u32,
    notify: bool,
}

impl Drop for PBlock {
    fn drop(&mut self) {
        deregister(self.stag);
    }
}

/// The peer's persistent block.
#[derive(Clone, Copy)]
struct Remote {
    addr: u64,
    len: u64,
    stag: u32,
    notify: bool,
}

impl XOp {
    fn finish(self, fd: c_int, recv: bool, errno: Errno) {
        if !matches!(self.kind, XKind::Plain) {
            self.finish_kind(fd, errno);
            return;
        }
        if self.mh != EXS_MHANDLE_UNREGISTERED {
            if let Ok(e) = engine() {
                e.mem_release(self.mh);
            }
        }
        if let Some(s) = self.tmp {
            deregister(s);
        }
        let ty = if recv { EXS_EVT_RECV } else { EXS_EVT_SEND };
        let mut ev = exs_event_t::new(ty, fd, self.ah, errno);
        let mut flags = self.flags & !(EXS_PERSISTENT | EXS_PERSISTENT_NOTIFY);
        if self.persist.is_some() {
            flags |= EXS_PERSISTENT;
        }
        if self.trunc {
            flags |= libc::MSG_TRUNC;
        }
        ev.exs_evt_union.exs_evt_xfer = exs_evt_xfer_t {
            exs_evt_buf: self.buf as *mut libc::c_void,
            exs_evt_len: self.len,
            exs_evt_nbytes: if errno == 0 { self.nbytes as isize } else { 0 },
            exs_evt_flags: flags,
        };
        self.q.push(ev);
    }

    /// The STag covering the buffer (registering it on first use).
    fn stag(&mut self, access: Access) -> Result<u32, Errno> {
        if self.mh == EXS_MHANDLE_UNREGISTERED {
            if let Some(s) = self.tmp {
                return Ok(s);
            }
            let s = reg_user(self.buf, self.len, access)?;
            self.tmp = Some(s);
            Ok(s)
        } else {
            engine()?.mem_stag(self.mh, |a, l| reg_user(a, l, all_access()))
        }
    }
}

/// An advertisement received and not yet consumed.
struct Adv {
    seq: u32,
    addr: u64,
    len: usize,
    stag: u32,
    imm: Option<Vec<u8>>,
    /// Octets already taken (stream sockets).
    off: usize,
}

/// A receive matched with (part of) an advertisement.
struct Rd {
    op: XOp,
    /// Read to post: remote address, STag, local STag, length.
    read: Option<(u64, u32, u32, usize)>,
    posted: bool,
    ready: bool,
    /// The advertisement's sequence number when this part ends it (its
    /// acknowledgement is due when the Read completes).
    last: Option<u32>,
    /// A Read of the peer's persistent block that asked for notes: the
    /// RNOTE (offset, length) due when the Read completes.
    note: Option<(u64, u32)>,
}

struct Conn {
    qp: QueuePair,
    cq: CompletionQueue,
    rx: MemoryRegion,
    nrx: usize,
    credits: u32,
    small: usize,
    send_credits: u32,
    owed: u32,
    next_seq: u32,
    advs: VecDeque<Adv>,
    reads_posted: usize,
    writes_posted: usize,
    /// Credit-spending messages of the peer not yet returned.
    held: u32,
    /// The peer's persistent send block (PADV).
    peer_psend: Option<Remote>,
    /// The peer's persistent receive block (PRECV).
    peer_precv: Option<Remote>,
    /// Notes (RNOTE, WNOTE) waiting for a credit.
    outbox: VecDeque<Msg>,
    broken: bool,
    /// A DDPMODE socket's byte stream finishing on this QP
    /// ([`crate::ddp`]).
    pre: Option<Box<dyn crate::ddp::Prelude>>,
}

impl Conn {
    fn new(credits: u32) -> Result<Conn, Errno> {
        let d = dev()?;
        let c = credits as usize;
        let nrx = 2 * c + EXTRA_RECVS;
        let nsq = 3 * c + MAX_READS + MAX_WRITES + 8;
        let cq = d.ctx.create_cq(nrx + nsq + 16, Some(&d.ch));
        let qp = d.pd.create_cm_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: nsq,
                max_recv_wr: nrx,
            },
        );
        Conn::with_qp(qp, cq, credits, true)
    }

    /// A connection on an existing QP and CQ (in the device's PD), with
    /// its receives posted if `post`.
    fn with_qp(
        qp: QueuePair,
        cq: CompletionQueue,
        credits: u32,
        post: bool,
    ) -> Result<Conn, Errno> {
        let d = dev()?;
        let nrx = 2 * credits as usize + EXTRA_RECVS;
        let rx =
            d.pd.register(nrx * MSG_MAX, Access::LOCAL_WRITE)
                .map_err(|_| libc::ENOMEM)?;
        let conn = Conn {
            qp,
            cq,
            rx,
            nrx,
            credits,
            small: DEFAULT_SMALL as usize,
            send_credits: credits,
            owed: 0,
            next_seq: 0,
            advs: VecDeque::new(),
            reads_posted: 0,
            writes_posted: 0,
            held: 0,
            peer_psend: None,
            peer_precv: None,
            outbox: VecDeque::new(),
            broken: false,
            pre: None,
        };
        if post {
            for i in 0..nrx {
                conn.post_recv(i)?;
            }
        }
        Ok(conn)
    }

    fn set(&mut self, p: Params) {
        self.credits = p.credits;
        self.send_credits = p.credits;
        self.small = p.small as usize;
    }

    fn post_recv(&self, i: usize) -> Result<(), Errno> {
        let s = self.rx.sge(i * MSG_MAX, MSG_MAX as u32);
        self.qp
            .post_recv(RecvWr {
                wr_id: i as u64,
                sgl: SgList::single(s.addr, s.length, s.lkey),
            })
            .map_err(|_| libc::ECONNRESET)
    }

    fn post(&mut self, wr_id: u64, op: SendOp, payload: Payload) {
        let wr = SendWr {
            wr_id,
            op,
            payload,
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        if self.qp.post_send(wr).is_err() {
            self.broken = true;
        }
    }

    fn send_msg(&mut self, wr_id: u64, mut m: Msg) {
        m.credits = self.owed.min(u16::MAX as u32) as u16;
        self.owed -= u32::from(m.credits);
        self.held = self.held.saturating_sub(u32::from(m.credits));
        let b = m.encode();
        let data = InlineData::new(&b).expect("control messages fit inline");
        self.post(
            wr_id,
            SendOp::Send {
                imm: None,
                invalidate: None,
            },
            Payload::Inline(data),
        );
    }
}

enum Role {
    Fresh,
    Connecting,
    Connected,
    Listening,
}

struct AcceptOp {
    q: Arc<Queue>,
    ah: usize,
    addr: usize,
    flags: c_int,
}

struct Sock {
    id: u64,
    family: c_int,
    ty: c_int,
    bound: Option<SocketAddr>,
    credits: u32,
    small: u32,
    role: Role,
    conn: Option<Conn>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    connect_op: Option<(Arc<Queue>, usize)>,
    sends: VecDeque<XOp>,
    recvs: VecDeque<XOp>,
    reading: VecDeque<Rd>,
    accepts: VecDeque<AcceptOp>,
    backlog: VecDeque<(Conn, SocketAddr, SocketAddr)>,
    backlog_max: usize,
    closed: Option<Arc<AtomicBool>>,
    dead: Option<Errno>,
    fin: bool,
    /// This end's persistent send block, once advertised.
    psend: Option<PBlock>,
    /// This end's persistent receive block, once advertised.
    precv: Option<PBlock>,
    /// A persistent receive waiting to be advertised.
    precv_op: Option<XOp>,
    /// Notes received for a block that asked for them, waiting for a
    /// queue slot (their credits are held until then: the peer slows
    /// down instead of the queue overflowing).
    notes: VecDeque<Msg>,
    /// `exs_shutdown` SHUT_WR (or SHUT_RDWR) was called: sends fail.
    shut_wr: bool,
    /// `exs_shutdown` SHUT_RD (or SHUT_RDWR) was called: receives end
    /// with 0 octets, arriving messages are discarded.
    shut_rd: bool,
    /// The FIN of a SHUT_WR went out (a close sends no second one).
    fin_sent: bool,
}

impl Sock {
    fn new(family: c_int, ty: c_int) -> Sock {
        Sock {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            family,
            ty,
            bound: None,
            credits: DEFAULT_CREDITS,
            small: DEFAULT_SMALL,
            role: Role::Fresh,
            conn: None,
            local: None,
            peer: None,
            connect_op: None,
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            reading: VecDeque::new(),
            accepts: VecDeque::new(),
            backlog: VecDeque::new(),
            backlog_max: 1,
            closed: None,
            dead: None,
            fin: false,
            psend: None,
            precv: None,
            precv_op: None,
            notes: VecDeque::new(),
            shut_wr: false,
            shut_rd: false,
            fin_sent: false,
        }
    }

    fn stream(&self) -> bool {
        self.ty == libc::SOCK_STREAM
    }

    /// Takes completions, matches receives with advertisements, posts
    /// Reads and advertisements, returns credits, and queues the events of
    /// what finished (in call order).
    fn drive(&mut self, fd: c_int) {
        self.drive_opt(fd, true)
    }

    /// [`Sock::drive`]; without `arm` the CQ is only polled, not armed.
    fn drive_opt(&mut self, fd: c_int, arm: bool) {
        let Some(cq) = self.conn.as_ref().map(|c| c.cq.clone()) else {
            return;
        };
        let blank = Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        };
        let mut out = [blank; 32];
        let mut armed = false;
        loop {
            let n = cq.poll(&mut out);
            for c in &out[..n] {
                self.completion(&c.wc);
            }
            if n == 0 {
                if armed || !arm {
                    break;
                }
                cq.req_notify(false);
                armed = true;
            }
        }
        if let Some(c) = &self.conn {
            if c.broken || c.qp.state() == QpLinkState::Error {
                // What already arrived still reaches the receives waiting
                // for it (immediate data, up to the peer's FIN); a message
                // that must be pulled cannot be any more.
                self.match_recvs();
                self.complete_recvs(fd);
                self.die(fd);
                return;
            }
        }
        self.ddp_step();
        if self.shut_rd {
            self.discard_reads(fd);
        }
        self.match_recvs();
        self.post_reads();
        self.complete_recvs(fd);
        self.deliver_notes(fd);
        self.advertise();
        if self.precv_op.as_ref().is_some_and(|o| o.done.is_some()) {
            let op = self.precv_op.take().expect("checked");
            let e = op.done.unwrap_or(0);
            op.finish(fd, true, e);
        }
        while self.sends.front().is_some_and(|s| s.done.is_some()) {
            let op = self.sends.pop_front().expect("front");
            let e = op.done.unwrap_or(0);
            op.finish(fd, false, e);
        }
        if self
            .sends
            .front()
            .is_some_and(|s| matches!(s.kind, XKind::Close))
        {
            // exs_aclose: every earlier send is done.
            let op = self.sends.pop_front().expect("front");
            op.finish(fd, false, 0);
        }
        if let Some(c) = self.conn.as_mut() {
            if c.owed > 0 && c.owed >= (c.credits / 2).max(1) {
                c.send_msg(
                    TAG_CTRL,
                    Msg {
                        kind: wire::CREDIT,
                        ..Msg::default()
                    },
                );
            }
            if c.broken {
                self.die(fd);
            }
        }
    }

    fn completion(&mut self, wc: &WorkCompletion) {
        let Some(c) = self.conn.as_mut() else { return };
        if let Some(p) = c.pre.as_mut() {
            match p.take(wc) {
                crate::ddp::Taken::No => {}
                crate::ddp::Taken::Yes => return,
                crate::ddp::Taken::Msg(b) => {
                    match Msg::decode(&b) {
                        Some(m) => self.message(m),
                        None => c.broken = true,
                    }
                    return;
                }
            }
        }
        if wc.status != WcStatus::Success {
            c.broken = true;
            return;
        }
        match wc.opcode {
            WcOpcode::Recv => {
                let i = wc.wr_id as usize;
                let n = wc.byte_len as usize;
                if i >= c.nrx || n > MSG_MAX {
                    c.broken = true;
                    return;
                }
                let mut b = vec![0u8; n];
                let _ = c.rx.read_at(i * MSG_MAX, &mut b);
                if c.post_recv(i).is_err() {
                    c.broken = true;
                    return;
                }
                match Msg::decode(&b) {
                    Some(m) => self.message(m),
                    None => c.broken = true,
                }
            }
            WcOpcode::RdmaRead => {
                c.reads_posted = c.reads_posted.saturating_sub(1);
                let Some(rd) = self.reading.iter_mut().find(|r| r.posted && !r.ready) else {
                    c.broken = true;
                    return;
                };
                rd.ready = true;
                if let Some((addr, len)) = rd.note {
                    c.outbox.push_back(Msg {
                        kind: wire::RNOTE,
                        addr,
                        len,
                        ..Msg::default()
                    });
                }
                if let Some(seq) = rd.last {
                    c.owed += 1;
                    let len = rd.op.nbytes as u32;
                    c.send_msg(
                        TAG_CTRL,
                        Msg {
                            kind: wire::ACK,
                            seq,
                            len,
                            ..Msg::default()
                        },
                    );
                }
            }
            _ => {
                let tag = wc.wr_id >> 32;
                if tag == TAG_WRITE {
                    c.writes_posted = c.writes_posted.saturating_sub(1);
                }
                if tag == TAG_IMM || tag == TAG_WRITE {
                    let seq = wc.wr_id as u32;
                    if let Some(s) = self.sends.iter_mut().find(|s| s.adv && s.seq == seq) {
                        s.done = Some(0);
                        s.nbytes = s.len;
                    }
                }
            }
        }
    }

    /// An adopted DDPMODE connection: the stream's last work, and the
    /// peer's parameters once both switch messages are out.
    fn ddp_step(&mut self) {
        let Some(c) = self.conn.as_mut() else { return };
        let Some(p) = c.pre.as_mut() else { return };
        let b = match p.step() {
            crate::ddp::Step::Wait => return,
            crate::ddp::Step::PostReceives => {
                for i in 0..c.nrx {
                    if c.post_recv(i).is_err() {
                        c.broken = true;
                        return;
                    }
                }
                if let Some(p) = c.pre.as_mut() {
                    p.posted();
                }
                return self.ddp_step();
            }
            crate::ddp::Step::Start(b) => b,
        };
        match Params::parse(&b) {
            Some(peer) => {
                let n = peer.credits.min(c.credits).max(1);
                let small = peer.small.min(c.small as u32);
                c.set(Params {
                    ty: peer.ty,
                    credits: n,
                    small,
                });
                self.credits = n;
                self.small = small;
            }
            None => c.broken = true,
        }
    }

    fn message(&mut self, m: Msg) {
        let psend_len = self.psend.as_ref().map_or(0, |b| b.len as u64);
        let precv_len = self.precv.as_ref().map_or(0, |b| b.len as u64);
        let psend_notify = self.psend.as_ref().is_some_and(|b| b.notify);
        let precv_notify = self.precv.as_ref().is_some_and(|b| b.notify);
        let Some(c) = self.conn.as_mut() else { return };
        let mut w = wire::Window {
            credits: c.credits,
            send_credits: c.send_credits,
            held: c.held,
            precv_len,
            psend_len,
        };
        if wire::check(&mut w, &m).is_err() {
            c.broken = true;
            return;
        }
        c.send_credits = w.send_credits;
        c.held = w.held;
        match m.kind {
            wire::PADV | wire::PRECV => {
                let r = Remote {
                    addr: m.addr,
                    len: u64::from(m.len),
                    stag: m.stag,
                    notify: m.flags & wire::F_NOTIFY != 0,
                };
                if m.kind == wire::PADV {
                    c.peer_psend = Some(r);
                } else {
                    c.peer_precv = Some(r);
                }
                c.owed += 1;
            }
            wire::RNOTE | wire::WNOTE => {
                let wanted = if m.kind == wire::RNOTE {
                    psend_notify
                } else {
                    precv_notify
                };
                if wanted {
                    self.notes.push_back(m);
                } else {
                    c.owed += 1;
                }
            }
            wire::ADV => {
                if c.advs.len() >= c.credits as usize {
                    c.broken = true;
                    return;
                }
                let imm = (m.flags & wire::F_IMM != 0).then_some(m.data);
                c.advs.push_back(Adv {
                    seq: m.seq,
                    addr: m.addr,
                    len: m.len as usize,
                    stag: m.stag,
                    imm,
                    off: 0,
                });
            }
            wire::ACK => {
                match self
                    .sends
                    .iter_mut()
                    .find(|s| s.adv && s.seq == m.seq && s.done.is_none())
                {
                    Some(s) => {
                        s.done = Some(0);
                        s.nbytes = s.len;
                    }
                    None => c.broken = true,
                }
            }
            wire::FIN => self.fin = true,
            _ => {}
        }
    }

    fn match_recvs(&mut self) {
        let stream = self.stream();
        while let Some(front) = self.recvs.front() {
            let Some(c) = self.conn.as_mut() else { return };
            if front.offset.is_some() || c.advs.is_empty() {
                // From the peer's persistent block: one Read, no ACK.
                let p = c.peer_psend;
                if p.is_none() && front.offset.is_none() {
                    return;
                }
                let op = self.recvs.pop_front().expect("non-empty");
                self.reading.push_back(pull_persistent(op, p, stream));
                continue;
            }
            let Some(a) = c.advs.front_mut() else { return };
            let mut op = self.recvs.pop_front().expect("non-empty");
            let rem = a.len - a.off;
            let take = rem.min(op.len);
            let ends = !stream || take == rem;
            op.trunc = !stream && take < rem;
            op.nbytes = take;
            let mut ack = None;
            let mut rd = Rd {
                op,
                read: None,
                posted: false,
                ready: false,
                last: None,
                note: None,
            };
            if let Some(d) = &a.imm {
                if take > 0 {
                    // SAFETY: the receive's buffer: inside its registration
                    // (mapped when registered) or checked mapped at the
                    // call; the application keeps it until the event.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            d[a.off..].as_ptr(),
                            rd.op.buf as *mut u8,
                            take,
                        )
                    };
                }
                rd.ready = true;
                if ends {
                    c.owed += 1;
                }
            } else if take == 0 {
                rd.ready = true;
                if ends {
                    ack = Some(a.seq);
                }
            } else {
                match rd.op.stag(Access::LOCAL_WRITE) {
                    Ok(l) => {
                        rd.read = Some((a.addr + a.off as u64, a.stag, l, take));
                        if ends {
                            rd.last = Some(a.seq);
                        }
                    }
                    Err(e) => {
                        // The advertisement stays for the next receive.
                        rd.op.done = Some(e);
                        rd.ready = true;
                        self.reading.push_back(rd);
                        continue;
                    }
                }
            }
            let imm = a.imm.is_some();
            if ends {
                c.advs.pop_front();
            } else {
                a.off += take;
            }
            if stream && imm {
                // Coalescing: a stream receive that began with immediate
                // data goes on through the immediate messages already
                // here, up to its length (as a TCP receive returns what
                // has arrived).
                while rd.op.nbytes < rd.op.len {
                    let Some(b) = c.advs.front_mut() else { break };
                    let Some(d) = &b.imm else { break };
                    let rem = b.len - b.off;
                    let k = rem.min(rd.op.len - rd.op.nbytes);
                    if k > 0 {
                        // SAFETY: as above; nbytes + k <= the receive's length.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                d[b.off..].as_ptr(),
                                (rd.op.buf as *mut u8).add(rd.op.nbytes),
                                k,
                            )
                        };
                    }
                    rd.op.nbytes += k;
                    if k == rem {
                        c.advs.pop_front();
                        c.owed += 1;
                    } else {
                        b.off += k;
                    }
                }
            }
            if let Some(seq) = ack {
                c.owed += 1;
                c.send_msg(
                    TAG_CTRL,
                    Msg {
                        kind: wire::ACK,
                        seq,
                        ..Msg::default()
                    },
                );
            }
            self.reading.push_back(rd);
        }
    }

    fn post_reads(&mut self) {
        let Some(c) = self.conn.as_mut() else { return };
        for rd in self.reading.iter_mut() {
            if c.reads_posted >= MAX_READS {
                return;
            }
            if rd.posted || rd.ready {
                continue;
            }
            let Some((raddr, rkey, lkey, len)) = rd.read else {
                continue;
            };
            c.reads_posted += 1;
            rd.posted = true;
            c.post(
                (TAG_READ << 32) | 1,
                SendOp::Read {
                    remote_addr: raddr,
                    rkey,
                },
                Payload::Sgl(SgList::single(rd.op.buf as u64, len as u32, lkey)),
            );
        }
    }

    fn complete_recvs(&mut self, fd: c_int) {
        while self.reading.front().is_some_and(|r| r.ready) {
            let rd = self.reading.pop_front().expect("front");
            let e = rd.op.done.unwrap_or(0);
            rd.op.finish(fd, true, e);
        }
        let empty = self.conn.as_ref().is_none_or(|c| c.advs.is_empty());
        if self.fin && empty && self.reading.is_empty() {
            for mut op in self.recvs.drain(..) {
                op.nbytes = 0;
                op.finish(fd, true, 0);
            }
        }
    }

    fn advertise(&mut self) {
        let Sock {
            conn,
            sends,
            psend,
            precv,
            precv_op,
            fin_sent,
            ..
        } = self;
        let Some(c) = conn.as_mut() else { return };
        while c.send_credits > 0 && !c.broken {
            let Some(m) = c.outbox.pop_front() else { break };
            c.send_credits -= 1;
            c.send_msg(TAG_CTRL, m);
        }
        if let Some(op) = precv_op.as_mut().filter(|o| o.done.is_none()) {
            if c.send_credits > 0 && !c.broken {
                let notify = op.persist == Some(true);
                match PBlock::new(op, Access::LOCAL_WRITE | Access::REMOTE_WRITE, notify) {
                    Ok(b) => {
                        c.send_credits -= 1;
                        c.send_msg(TAG_CTRL, b.msg(wire::PRECV));
                        *precv = Some(b);
                        op.done = Some(0);
                    }
                    Err(e) => op.done = Some(e),
                }
            }
        }
        for op in sends.iter_mut() {
            if op.adv || op.done.is_some() {
                continue;
            }
            if c.broken {
                return;
            }
            if matches!(op.kind, XKind::Close) {
                // Nothing queued after an exs_aclose reaches the wire.
                return;
            }
            if let XKind::Shutdown { fin } = op.kind {
                // Every earlier send is on the wire: the FIN follows them.
                if fin {
                    *fin_sent = true;
                    c.send_msg(
                        TAG_CTRL,
                        Msg {
                            kind: wire::FIN,
                            ..Msg::default()
                        },
                    );
                }
                op.done = Some(0);
                continue;
            }
            if let Some(notify) = op.persist {
                if c.send_credits == 0 {
                    return;
                }
                match PBlock::new(op, Access::REMOTE_READ, notify) {
                    Ok(b) => {
                        c.send_credits -= 1;
                        c.send_msg(TAG_CTRL, b.msg(wire::PADV));
                        *psend = Some(b);
                        op.adv = true;
                        op.done = Some(0);
                        op.nbytes = op.len;
                    }
                    Err(e) => op.done = Some(e),
                }
                continue;
            }
            if op.offset.is_some() || c.peer_precv.is_some() {
                // Into the peer's persistent receive block: one Write.
                let Some(p) = c.peer_precv else {
                    op.done = Some(libc::EINVAL);
                    continue;
                };
                let off = op.offset.unwrap_or(0);
                if off.checked_add(op.len as u64).is_none_or(|e| e > p.len) {
                    op.done = Some(if op.offset.is_some() {
                        libc::EINVAL
                    } else {
                        libc::EMSGSIZE
                    });
                    continue;
                }
                if (p.notify && c.send_credits == 0) || c.writes_posted >= MAX_WRITES {
                    return;
                }
                let seq = c.next_seq;
                if op.len == 0 {
                    op.done = Some(0);
                } else {
                    let lkey = match op.stag(Access::LOCAL_WRITE) {
                        Ok(l) => l,
                        Err(e) => {
                            op.done = Some(e);
                            continue;
                        }
                    };
                    c.writes_posted += 1;
                    c.post(
                        (TAG_WRITE << 32) | u64::from(seq),
                        SendOp::Write {
                            remote_addr: p.addr + off,
                            rkey: p.stag,
                            imm: None,
                        },
                        Payload::Sgl(SgList::single(op.buf as u64, op.len as u32, lkey)),
                    );
                }
                c.next_seq = c.next_seq.wrapping_add(1);
                op.adv = true;
                op.seq = seq;
                if p.notify {
                    c.send_credits -= 1;
                    c.send_msg(
                        TAG_CTRL,
                        Msg {
                            kind: wire::WNOTE,
                            addr: off,
                            len: op.len as u32,
                            ..Msg::default()
                        },
                    );
                }
                continue;
            }
            if c.send_credits == 0 {
                return;
            }
            let seq = c.next_seq;
            let imm = op.len <= c.small;
            let m = if imm {
                let mut data = vec![0u8; op.len];
                if op.len > 0 {
                    // SAFETY: the send's buffer, inside its registration or
                    // checked mapped at the call.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            op.buf as *const u8,
                            data.as_mut_ptr(),
                            op.len,
                        )
                    };
                }
                Msg {
                    kind: wire::ADV,
                    flags: wire::F_IMM,
                    seq,
                    len: op.len as u32,
                    data,
                    ..Msg::default()
                }
            } else {
                match op.stag(Access::REMOTE_READ) {
                    Ok(stag) => Msg {
                        kind: wire::ADV,
                        seq,
                        addr: op.buf as u64,
                        len: op.len as u32,
                        stag,
                        ..Msg::default()
                    },
                    Err(e) => {
                        op.done = Some(e);
                        continue;
                    }
                }
            };
            c.next_seq = c.next_seq.wrapping_add(1);
            c.send_credits -= 1;
            op.adv = true;
            op.seq = seq;
            let tag = if imm { TAG_IMM } else { TAG_CTRL };
            c.send_msg((tag << 32) | u64::from(seq), m);
        }
    }

    /// The connection is gone: every outstanding operation completes.
    fn die(&mut self, fd: c_int) {
        // Notes that arrived before the end still become events.
        self.deliver_notes(fd);
        let e = if self.fin {
            libc::EPIPE
        } else {
            libc::ECONNRESET
        };
        self.dead = Some(e);
        let conn = self.conn.take();
        if let Some(c) = &conn {
            c.qp.disconnect();
            st_forget_cq(c.cq.id());
        }
        for rd in self.reading.drain(..) {
            let ok = rd.ready && rd.op.done.is_none();
            let err = rd.op.done.unwrap_or(e);
            rd.op.finish(fd, true, if ok { 0 } else { err });
        }
        for mut op in self.recvs.drain(..) {
            if self.fin {
                op.nbytes = 0;
                op.finish(fd, true, 0);
            } else {
                op.finish(fd, true, e);
            }
        }
        for op in self.sends.drain(..) {
            let d = op.done;
            op.finish(fd, false, if d == Some(0) { 0 } else { e });
        }
        if let Some(op) = self.precv_op.take() {
            op.finish(fd, true, e);
        }
        self.notes.clear();
        self.psend = None;
        self.precv = None;
    }

    /// Fails every operation with `e` (close, failed connect).
    fn cancel_all(&mut self, fd: c_int, e: Errno) {
        for rd in self.reading.drain(..) {
            rd.op.finish(fd, true, e);
        }
        for op in self.recvs.drain(..) {
            op.finish(fd, true, e);
        }
        for op in self.sends.drain(..) {
            op.finish(fd, false, e);
        }
        if let Some(op) = self.precv_op.take() {
            op.finish(fd, true, e);
        }
        self.notes.clear();
        self.psend = None;
        self.precv = None;
        for a in self.accepts.drain(..) {
            push_accept(fd, a, -1, None, e);
        }
        if let Some((q, ah)) = self.connect_op.take() {
            q.push(exs_event_t::new(EXS_EVT_CONNECT, fd, ah, e));
        }
    }
}

impl Sock {
    /// Queues an event per note whose block asked for them, while the
    /// block's queue has a free slot; each note's credit goes back then.
    fn deliver_notes(&mut self, fd: c_int) {
        let Some(c) = self.conn.as_mut() else { return };
        while let Some(m) = self.notes.front() {
            let recv = m.kind == wire::WNOTE;
            let blk = if recv { &self.precv } else { &self.psend };
            if let Some(b) = blk {
                match b.q.reserve() {
                    Ok(()) => {
                        let ty = if recv { EXS_EVT_RECV } else { EXS_EVT_SEND };
                        let mut ev = exs_event_t::new(ty, fd, b.ah, 0);
                        ev.exs_evt_union.exs_evt_xfer = exs_evt_xfer_t {
                            exs_evt_buf: (b.buf + m.addr as usize) as *mut libc::c_void,
                            exs_evt_len: m.len as usize,
                            exs_evt_nbytes: m.len as isize,
                            exs_evt_flags: EXS_PERSISTENT,
                        };
                        b.q.push(ev);
                    }
                    Err(libc::EAGAIN) => return,
                    Err(_) => {}
                }
            }
            self.notes.pop_front();
            c.owed += 1;
        }
    }
}

impl PBlock {
    /// Registers exactly the operation's buffer for the peer.
    fn new(op: &XOp, access: Access, notify: bool) -> Result<PBlock, Errno> {
        let stag = reg_user(op.buf, op.len, access)?;
        Ok(PBlock {
            q: op.q.clone(),
            ah: op.ah,
            buf: op.buf,
            len: op.len,
            stag,
            notify,
        })
    }

    /// Its advertisement ([`wire::PADV`] or [`wire::PRECV`]).
    fn msg(&self, kind: u8) -> Msg {
        Msg {
            kind,
            flags: if self.notify { wire::F_NOTIFY } else { 0 },
            addr: self.buf as u64,
            len: self.len as u32,
            stag: self.stag,
            ..Msg::default()
        }
    }
}

/// A receive served from the peer's persistent block `p` (at its offset,
/// bounds checked, or from the start): one Read, no acknowledgement.
fn pull_persistent(mut op: XOp, p: Option<Remote>, stream: bool) -> Rd {
    let rd = |op: XOp| Rd {
        op,
        read: None,
        posted: false,
        ready: false,
        last: None,
        note: None,
    };
    let Some(p) = p else {
        op.done = Some(libc::EINVAL);
        let mut r = rd(op);
        r.ready = true;
        return r;
    };
    let off = op.offset.unwrap_or(0);
    let take = if op.offset.is_some() {
        if off.checked_add(op.len as u64).is_none_or(|e| e > p.len) {
            op.done = Some(libc::EINVAL);
            let mut r = rd(op);
            r.ready = true;
            return r;
        }
        op.len
    } else {
        op.trunc = !stream && (op.len as u64) < p.len;
        op.len.min(p.len as usize)
    };
    op.nbytes = take;
    let mut r = rd(op);
    if take == 0 {
        r.ready = true;
        return r;
    }
    match r.op.stag(Access::LOCAL_WRITE) {
        Ok(l) => {
            r.read = Some((p.addr + off, p.stag, l, take));
            if p.notify {
                r.note = Some((off, take as u32));
            }
        }
        Err(e) => {
            r.op.done = Some(e);
            r.ready = true;
        }
    }
    r
}

/// CQ ids whose connection went away (pending removal from the map).
static FORGET: Mutex<Vec<u64>> = Mutex::new(Vec::new());

fn st_forget_cq(id: u64) {
    FORGET.lock().unwrap_or_else(|e| e.into_inner()).push(id);
}

#[derive(Default)]
struct RState {
    socks: HashMap<c_int, Sock>,
    cqs: HashMap<u64, c_int>,
}

impl RState {
    fn drive(&mut self, fd: c_int) {
        if let Some(s) = self.socks.get_mut(&fd) {
            s.drive(fd);
            s.publish(fd);
        }
        self.forget();
    }

    /// Drops the CQ ids of connections that went away.
    fn forget(&mut self) {
        let f: Vec<u64> = std::mem::take(&mut *FORGET.lock().unwrap_or_else(|e| e.into_inner()));
        for id in f {
            self.cqs.remove(&id);
        }
    }

    /// Hands the listener's established connections to waiting accepts.
    fn match_accepts(&mut self, lfd: c_int) {
        loop {
            let Some(l) = self.socks.get_mut(&lfd) else {
                return;
            };
            if l.accepts.is_empty() || l.backlog.is_empty() {
                return;
            }
            let a = l.accepts.pop_front().expect("non-empty");
            let (conn, local, peer) = l.backlog.pop_front().expect("non-empty");
            let (family, ty) = (l.family, l.ty);
            let mut fl = libc::EFD_CLOEXEC;
            if a.flags & libc::SOCK_NONBLOCK != 0 {
                fl |= libc::EFD_NONBLOCK;
            }
            // SAFETY: no pointer arguments.
            let nfd = unsafe { libc::eventfd(0, fl) };
            if nfd < 0 {
                let e = sys::errno();
                conn.qp.disconnect();
                push_accept(lfd, a, -1, None, e);
                continue;
            }
            let mut s = Sock::new(family, ty);
            s.credits = conn.credits;
            s.small = conn.small as u32;
            s.role = Role::Connected;
            s.local = Some(local);
            s.peer = Some(peer);
            self.cqs.insert(conn.cq.id(), nfd);
            s.conn = Some(conn);
            self.socks.insert(nfd, s);
            watch_new(nfd);
            push_accept(lfd, a, nfd, Some(peer), 0);
            self.drive(nfd);
        }
    }
}

fn push_accept(fd: c_int, a: AcceptOp, newfd: c_int, peer: Option<SocketAddr>, e: Errno) {
    if let (Some(p), true) = (peer, a.addr != 0) {
        let aa = a.addr as *mut exs_acceptaddr_t;
        let (ss, len) = to_storage(p);
        // SAFETY: the caller's exs_acceptaddr_t, checked mapped at the call
        // and to stay valid until the event (sys/exs.h).
        unsafe {
            std::ptr::addr_of_mut!((*aa).aa_addrlen).write_unaligned(len);
            std::ptr::addr_of_mut!((*aa).aa_addr).write_unaligned(ss);
        }
    }
    let mut ev = exs_event_t::new(EXS_EVT_ACCEPT, fd, a.ah, e);
    ev.exs_evt_union.exs_evt_accept = exs_evt_accept_t {
        exs_evt_newfd: newfd,
        exs_evt_addr: a.addr as *mut exs_acceptaddr_t,
    };
    a.q.push(ev);
}

fn progress_thread() {
    crate::ddp::thread_start();
    // SAFETY: a full local set; pthread_sigmask on this thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    let Ok(d) = dev() else { return };
    let mut last = Instant::now();
    let kfd = kick();
    loop {
        let waiters = WAITERS.load(Ordering::Acquire) > 0;
        let recent =
            now_ns().saturating_sub(LAST_EXIT.load(Ordering::Acquire)) < HANDBACK.as_nanos() as u64;
        let mut p = [
            libc::pollfd {
                fd: kfd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: d.ch.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if waiters || recent {
            // A waiter has the channel (or one is about to come back).
            let ms = if waiters {
                PT_AWAY.store(true, Ordering::SeqCst);
                if WAITERS.load(Ordering::SeqCst) == 0 {
                    // It left in between: do not sleep long.
                    PT_AWAY.store(false, Ordering::Release);
                    1
                } else {
                    TICK.as_millis() as c_int
                }
            } else {
                1
            };
            // SAFETY: one pollfd (the kick eventfd).
            unsafe { libc::poll(p.as_mut_ptr(), 1, ms) };
            PT_AWAY.store(false, Ordering::Release);
            let mut v: u64 = 0;
            // SAFETY: reads 8 octets into a local (non-blocking eventfd).
            unsafe { libc::read(kfd, (&mut v as *mut u64).cast(), 8) };
        } else {
            // SAFETY: two pollfds.
            unsafe { libc::poll(p.as_mut_ptr(), 2, TICK.as_millis() as c_int) };
            progress_channel();
        }
        if last.elapsed() >= TICK {
            let mut s = st();
            last = Instant::now();
            let fds: Vec<c_int> = s.cqs.values().copied().collect();
            for fd in fds {
                s.drive(fd);
            }
        }
    }
}

pub(crate) fn to_storage(a: SocketAddr) -> (libc::sockaddr_storage, socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in.
            unsafe { std::ptr::write_unaligned(&mut ss as *mut _ as *mut libc::sockaddr_in, sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v.port().to_be(),
                sin6_flowinfo: v.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v.ip().octets(),
                },
                sin6_scope_id: v.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6.
            unsafe {
                std::ptr::write_unaligned(&mut ss as *mut _ as *mut libc::sockaddr_in6, sin6)
            };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as socklen_t)
}

/// Reads the caller's address of `len` octets (checked mapped).
pub(crate) fn from_sockaddr(
    addr: *const sockaddr,
    len: socklen_t,
    family: c_int,
) -> Result<SocketAddr, Errno> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(libc::EINVAL);
    }
    if !sys::mapped(addr as usize, len as usize) {
        return Err(libc::EFAULT);
    }
    // SAFETY: mapped, at least the family's octets.
    let fam = c_int::from(unsafe { (addr as *const libc::sa_family_t).read_unaligned() });
    if fam != family {
        return Err(libc::EAFNOSUPPORT);
    }
    if fam == libc::AF_INET {
        if (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: mapped and long enough.
        let s = unsafe { (addr as *const libc::sockaddr_in).read_unaligned() };
        let ip = Ipv4Addr::from(s.sin_addr.s_addr.to_ne_bytes());
        Ok(SocketAddr::V4(SocketAddrV4::new(
            ip,
            u16::from_be(s.sin_port),
        )))
    } else {
        if (len as usize) < std::mem::size_of::<libc::sockaddr_in6>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: mapped and long enough.
        let s = unsafe { (addr as *const libc::sockaddr_in6).read_unaligned() };
        Ok(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(s.sin6_addr.s6_addr),
            u16::from_be(s.sin6_port),
            s.sin6_flowinfo,
            s.sin6_scope_id,
        )))
    }
}

pub(crate) fn unspecified(family: c_int) -> SocketAddr {
    if family == libc::AF_INET6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
    }
}

/// The local address a connection toward `peer` uses (the kernel's route
/// choice), with `port`.
fn local_toward(peer: SocketAddr, port: u16) -> SocketAddr {
    let any = unspecified(if peer.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    });
    let ip = std::net::UdpSocket::bind(any)
        .and_then(|u| {
            u.connect(peer)?;
            u.local_addr()
        })
        .map(|a| a.ip())
        .unwrap_or(any.ip());
    SocketAddr::new(ip, port)
}

fn io_errno(e: &std::io::Error, dflt: Errno) -> Errno {
    e.raw_os_error().unwrap_or(dflt)
}

fn cm_errno(e: &cm::ConnectError) -> Errno {
    match e {
        cm::ConnectError::Io(io) => io_errno(io, libc::ECONNREFUSED),
        cm::ConnectError::Busy => libc::EISCONN,
        _ => libc::ECONNREFUSED,
    }
}

/// `exs_socket`.
pub fn socket(domain: c_int, ty: c_int, protocol: c_int) -> Result<c_int, Errno> {
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err(libc::EAFNOSUPPORT);
    }
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    if base != libc::SOCK_SEQPACKET && base != libc::SOCK_STREAM {
        return Err(if base == libc::SOCK_DGRAM {
            libc::EPROTONOSUPPORT
        } else {
            libc::ESOCKTNOSUPPORT
        });
    }
    if protocol != 0 {
        return Err(libc::EPROTONOSUPPORT);
    }
    engine()?;
    dev()?;
    let mut fl = libc::EFD_CLOEXEC;
    if ty & libc::SOCK_NONBLOCK != 0 {
        fl |= libc::EFD_NONBLOCK;
    }
    // SAFETY: no pointer arguments.
    let fd = unsafe { libc::eventfd(0, fl) };
    if fd < 0 {
        return Err(sys::errno());
    }
    let mut s = st();
    s.socks.insert(fd, Sock::new(domain, base));
    watch_new(fd);
    ACTIVE.store(true, Ordering::Release);
    Ok(fd)
}

fn with<T>(fd: c_int, f: impl FnOnce(&mut Sock) -> Result<T, Errno>) -> Result<T, Errno> {
    let mut s = st();
    let sock = s.socks.get_mut(&fd).ok_or(libc::EBADF)?;
    f(sock)
}

/// `exs_bind`: records the address (the listener binds it at `exs_listen`).
pub fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Result<(), Errno> {
    with(fd, |s| {
        let a = from_sockaddr(addr, len, s.family)?;
        if s.bound.is_some() || !matches!(s.role, Role::Fresh) {
            return Err(libc::EINVAL);
        }
        s.bound = Some(a);
        Ok(())
    })
}

/// `exs_listen`.
pub fn listen(fd: c_int, backlog: c_int) -> Result<(), Errno> {
    let d = dev()?;
    let mut g = st();
    let s = g.socks.get_mut(&fd).ok_or(libc::EBADF)?;
    match s.role {
        Role::Listening => {
            s.backlog_max = backlog.clamp(1, 4096) as usize;
            return Ok(());
        }
        Role::Fresh => {}
        _ => return Err(libc::EISCONN),
    }
    let addr = s.bound.unwrap_or(unspecified(s.family));
    let l = cm::Listener::bind(&d.ctx, addr).map_err(|e| io_errno(&e, libc::EADDRINUSE))?;
    let local = l.local_addr().map_err(|e| io_errno(&e, libc::EINVAL))?;
    s.local = Some(local);
    s.bound = Some(local);
    s.role = Role::Listening;
    s.backlog_max = backlog.clamp(1, 4096) as usize;
    let closed = Arc::new(AtomicBool::new(false));
    s.closed = Some(closed.clone());
    let id = s.id;
    drop(g);
    let spawned = std::thread::Builder::new()
        .name("exs-listen".into())
        .spawn(move || {
            // The listener is dropped when accept_loop returns, before
            // this clone of `closed`: exs_close waits for that.
            accept_loop(fd, id, l, local, &closed);
            drop(closed);
        });
    spawned.map(|_| ()).map_err(|_| libc::EAGAIN)
}

fn accept_loop(fd: c_int, id: u64, l: cm::Listener, local: SocketAddr, closed: &AtomicBool) {
    loop {
        let r = l.get_request();
        if closed.load(Ordering::Acquire) {
            return;
        }
        let Ok(req) = r else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let peer = req.peer_addr();
        let ours = {
            let g = st();
            match g.socks.get(&fd) {
                Some(s) if s.id == id => {
                    (s.ty, s.credits, s.small, s.backlog.len() >= s.backlog_max)
                }
                _ => return,
            }
        };
        let theirs = Params::parse(req.private_data());
        let p = match theirs {
            Some(t) if i32::from(t.ty) == ours.0 && !ours.3 => Params {
                ty: t.ty,
                credits: t.credits.min(ours.1),
                small: t.small.min(ours.2),
            },
            _ => {
                let _ = req.reject(b"EXS1");
                continue;
            }
        };
        let Ok(mut conn) = Conn::new(p.credits) else {
            let _ = req.reject(b"EXS1");
            continue;
        };
        conn.set(p);
        let params = cm::ConnParams {
            private_data: p.to_bytes().to_vec(),
            ird: MAX_READS as u16,
            ord: MAX_READS as u16,
        };
        if req.accept(&conn.qp, &params).is_err() {
            continue;
        }
        let mut g = st();
        match g.socks.get_mut(&fd) {
            Some(s) if s.id == id => {
                let lo = if local.ip().is_unspecified() {
                    local_toward(peer, local.port())
                } else {
                    local
                };
                s.backlog.push_back((conn, lo, peer));
            }
            _ => {
                conn.qp.disconnect();
                return;
            }
        }
        g.match_accepts(fd);
        if let Some(s) = g.socks.get(&fd) {
            s.publish(fd);
        }
    }
}

/// `exs_accept` on a listening descriptor of the RDMA model.
pub fn accept(
    fd: c_int,
    addr: *mut exs_acceptaddr_t,
    flags: c_int,
    q: Arc<Queue>,
    ah: usize,
) -> Result<(), Errno> {
    let mut g = st();
    let s = g.socks.get_mut(&fd).ok_or(libc::EBADF)?;
    if !matches!(s.role, Role::Listening) {
        return Err(libc::EINVAL);
    }
    q.reserve()?;
    s.accepts.push_back(AcceptOp {
        q,
        ah,
        addr: addr as usize,
        flags,
    });
    g.match_accepts(fd);
    if let Some(s) = g.socks.get(&fd) {
        s.publish(fd);
    }
    Ok(())
}

/// `exs_connect`.
pub fn connect(
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
    q: Arc<Queue>,
    ah: usize,
) -> Result<(), Errno> {
    let mut g = st();
    let s = g.socks.get_mut(&fd).ok_or(libc::EBADF)?;
    let to = from_sockaddr(addr, len, s.family)?;
    match s.role {
        Role::Fresh => {}
        Role::Connecting => return Err(libc::EALREADY),
        Role::Connected => return Err(libc::EISCONN),
        Role::Listening => return Err(libc::EINVAL),
    }
    if let Some(e) = s.dead {
        return Err(e);
    }
    q.reserve()?;
    s.role = Role::Connecting;
    s.connect_op = Some((q, ah));
    let ours = Params {
        ty: s.ty as u8,
        credits: s.credits,
        small: s.small,
    };
    let id = s.id;
    drop(g);
    let r = std::thread::Builder::new()
        .name("exs-connect".into())
        .spawn(move || connect_thread(fd, id, to, ours));
    if r.is_err() {
        let mut g = st();
        if let Some(s) = g.socks.get_mut(&fd) {
            s.role = Role::Fresh;
            if let Some((q, _)) = s.connect_op.take() {
                q.unreserve();
            }
        }
        return Err(libc::EAGAIN);
    }
    Ok(())
}

fn connect_thread(fd: c_int, id: u64, to: SocketAddr, ours: Params) {
    let r = Conn::new(ours.credits).and_then(|mut c| {
        let params = cm::ConnParams {
            private_data: ours.to_bytes().to_vec(),
            ird: MAX_READS as u16,
            ord: MAX_READS as u16,
        };
        let pd = cm::connect(&c.qp, to, &params).map_err(|e| cm_errno(&e))?;
        match Params::parse(&pd) {
            Some(p) if p.credits <= ours.credits && p.small <= ours.small && p.ty == ours.ty => {
                c.set(p);
                Ok(c)
            }
            _ => {
                c.qp.disconnect();
                Err(libc::EPROTO)
            }
        }
    });
    let mut g = st();
    let Some(s) = g.socks.get_mut(&fd).filter(|s| s.id == id) else {
        if let Ok(c) = r {
            c.qp.disconnect();
        }
        return;
    };
    match r {
        Ok(conn) => {
            s.role = Role::Connected;
            s.credits = conn.credits;
            s.small = conn.small as u32;
            s.peer = Some(to);
            s.local = Some(local_toward(to, 0));
            let cqid = conn.cq.id();
            s.conn = Some(conn);
            if let Some((q, ah)) = s.connect_op.take() {
                q.push(exs_event_t::new(EXS_EVT_CONNECT, fd, ah, 0));
            }
            g.cqs.insert(cqid, fd);
            g.drive(fd);
        }
        Err(e) => {
            s.role = Role::Fresh;
            s.cancel_all(fd, e);
            s.publish(fd);
        }
    }
}

/// Checks a transfer's buffer and handle; holds the handle.
fn xop(
    buf: usize,
    len: usize,
    flags: c_int,
    q: &Arc<Queue>,
    ah: usize,
    mh: c_int,
) -> Result<XOp, Errno> {
    if buf == 0 && len > 0 {
        return Err(libc::EFAULT);
    }
    if len > u32::MAX as usize || buf.checked_add(len).is_none() {
        return Err(libc::EMSGSIZE);
    }
    if mh == EXS_MHANDLE_UNREGISTERED && len > 0 && !sys::mapped(buf, len) {
        return Err(libc::EFAULT);
    }
    engine()?.mem_hold(mh, buf, len)?;
    if let Err(e) = q.reserve() {
        if mh != EXS_MHANDLE_UNREGISTERED {
            engine()?.mem_release(mh);
        }
        return Err(e);
    }
    Ok(XOp {
        q: q.clone(),
        ah,
        buf,
        len,
        flags,
        mh,
        tmp: None,
        seq: 0,
        adv: false,
        done: None,
        nbytes: 0,
        trunc: false,
        offset: None,
        persist: None,
        kind: XKind::Plain,
    })
}

/// Send flags the RDMA model accepts (all without effect).
const SEND_OK: c_int = libc::MSG_EOR | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | libc::MSG_MORE;
/// Receive flags the RDMA model accepts (`MSG_TRUNC` is reported in the
/// event's flags whatever the call asked; `MSG_WAITALL` has no effect).
const RECV_OK: c_int = libc::MSG_TRUNC | libc::MSG_WAITALL | libc::MSG_DONTWAIT;

/// The persistent flags.
const PERSIST: c_int = EXS_PERSISTENT | EXS_PERSISTENT_NOTIFY;

/// `exs_send` and `exs_recv` on a descriptor of the RDMA model, and with
/// `offset` `exs_send_offset` and `exs_recv_offset`.
#[allow(clippy::too_many_arguments)]
pub fn xfer(
    recv: bool,
    fd: c_int,
    buf: usize,
    len: usize,
    flags: c_int,
    q: Arc<Queue>,
    ah: usize,
    mh: c_int,
    offset: Option<u64>,
) -> Result<(), Errno> {
    xfer_kind(recv, fd, buf, len, flags, q, ah, mh, offset, XKind::Plain)
}

/// [`xfer`] for an operation of `kind` (`exs_sendmsg`, `exs_recvmsg`,
/// `exs_sendfile` use it too).
#[allow(clippy::too_many_arguments)]
fn xfer_kind(
    recv: bool,
    fd: c_int,
    buf: usize,
    len: usize,
    flags: c_int,
    q: Arc<Queue>,
    ah: usize,
    mh: c_int,
    offset: Option<u64>,
    kind: XKind,
) -> Result<(), Errno> {
    let ok = if recv { RECV_OK } else { SEND_OK };
    if flags & !(ok | PERSIST) != 0 {
        return Err(libc::EINVAL);
    }
    let persist = (flags & PERSIST != 0).then_some(flags & EXS_PERSISTENT_NOTIFY != 0);
    if persist.is_some() && !matches!(kind, XKind::Plain) {
        return Err(libc::EOPNOTSUPP);
    }
    if persist.is_some() && (offset.is_some() || len == 0) {
        return Err(libc::EINVAL);
    }
    let mut g = st();
    let s = g.socks.get_mut(&fd).ok_or(libc::EBADF)?;
    match s.role {
        Role::Connected | Role::Connecting => {}
        _ => return Err(libc::ENOTCONN),
    }
    if let Some(e) = s.dead {
        if !(recv && s.fin) {
            return Err(e);
        }
    }
    if let Some(off) = offset {
        // Bounds of the peer's persistent block (known once its
        // advertisement arrived).
        let c = s.conn.as_ref().ok_or(libc::EINVAL)?;
        let p = if recv { c.peer_psend } else { c.peer_precv };
        let p = p.ok_or(libc::EINVAL)?;
        if off.checked_add(len as u64).is_none_or(|e| e > p.len) {
            return Err(libc::EINVAL);
        }
    }
    let psent = s.psend.is_some() || s.sends.iter().any(|o| o.persist.is_some());
    if persist.is_some() {
        // One persistent block per direction and descriptor.
        let taken = if recv {
            s.precv.is_some() || s.precv_op.is_some()
        } else {
            psent
        };
        if taken {
            return Err(libc::EINVAL);
        }
    } else if !recv && offset.is_none() && psent {
        // The persistent side is passive.
        return Err(libc::EINVAL);
    }
    if !recv && s.shut_wr {
        return Err(libc::EPIPE);
    }
    let mut op = xop(buf, len, flags, &q, ah, mh)?;
    op.offset = offset;
    op.persist = persist;
    op.kind = kind;
    if s.dead.is_some() || (recv && s.shut_rd && persist.is_none() && offset.is_none()) {
        // The peer closed (or SHUT_RD): end of stream at once.
        op.finish(fd, true, 0);
        return Ok(());
    }
    if recv && persist.is_some() {
        s.precv_op = Some(op);
    } else if recv {
        s.recvs.push_back(op);
    } else {
        s.sends.push_back(op);
    }
    g.drive(fd);
    Ok(())
}

/// A DDPMODE socket's connection becomes the `SOCK_STREAM` descriptor
/// `a.fd` of this model ([`crate::ddp::adopt`]); it sends nothing until
/// the prelude reports the peer's parameters. Returns the descriptor's
/// id and this end's parameters.
pub(crate) fn adopt(a: crate::ddp::Adopt, credits: u32) -> Result<(u64, [u8; 16]), Errno> {
    engine()?;
    // Its receives are posted once no more stream data comes.
    let mut conn = Conn::with_qp(a.qp, a.cq, credits, false)?;
    conn.send_credits = 0;
    conn.pre = Some(a.prelude);
    let ours = Params {
        ty: libc::SOCK_STREAM as u8,
        credits,
        small: DEFAULT_SMALL,
    };
    let mut s = Sock::new(a.family, libc::SOCK_STREAM);
    s.role = Role::Connected;
    s.credits = credits;
    s.peer = crate::ddp::addr_of(a.fd, true);
    s.local = crate::ddp::addr_of(a.fd, false);
    let id = s.id;
    let mut g = st();
    g.cqs.insert(conn.cq.id(), a.fd);
    s.conn = Some(conn);
    g.socks.insert(a.fd, s);
    ACTIVE.store(true, Ordering::Release);
    Ok((id, ours.to_bytes()))
}

/// Whether the adopted descriptor `fd` is still the one with `id`.
pub(crate) fn adopted_alive(fd: c_int, id: u64) -> bool {
    st().socks.get(&fd).is_some_and(|s| s.id == id)
}

/// Drives the adopted descriptor `fd` (if it is still the one with `id`).
pub(crate) fn drive_adopted(fd: c_int, id: u64) {
    let mut g = st();
    if g.socks.get(&fd).is_some_and(|s| s.id == id) {
        g.drive(fd);
    }
}

/// `exs_close`: FIN to the peer, then the connection is torn down; the
/// descriptor's operations complete with ECANCELED.
pub fn close(fd: c_int) -> Result<(), Errno> {
    close_opt(fd, true)
}

/// [`close`] without closing the descriptor (a DDPMODE socket the
/// application closed with `close`).
pub(crate) fn close_keep_fd(fd: c_int) -> Result<(), Errno> {
    close_opt(fd, false)
}

fn close_opt(fd: c_int, close_fd: bool) -> Result<(), Errno> {
    let mut g = st();
    let mut s = g.socks.remove(&fd).ok_or(libc::EBADF)?;
    if let Some(c) = &s.conn {
        g.cqs.remove(&c.cq.id());
    }
    drop(g);
    let mut conns: Vec<Conn> = s.backlog.drain(..).map(|b| b.0).collect();
    if let Some(mut c) = s.conn.take() {
        if !c.broken && !s.fin_sent {
            c.send_msg(
                TAG_CTRL,
                Msg {
                    kind: wire::FIN,
                    ..Msg::default()
                },
            );
            let end = Instant::now() + Duration::from_millis(200);
            while !c.qp.tx_idle() && Instant::now() < end {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        conns.push(c);
    }
    for c in &conns {
        c.qp.disconnect();
    }
    s.cancel_all(fd, libc::ECANCELED);
    if let (Some(closed), Some(local)) = (&s.closed, s.local) {
        closed.store(true, Ordering::Release);
        let wake = if local.ip().is_unspecified() {
            SocketAddr::new(
                if local.is_ipv4() {
                    IpAddr::V4(Ipv4Addr::LOCALHOST)
                } else {
                    IpAddr::V6(Ipv6Addr::LOCALHOST)
                },
                local.port(),
            )
        } else {
            local
        };
        let _ = std::net::TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        // Stop listening before returning: a connect that follows must
        // find the port closed (ECONNREFUSED), not a listener about to go.
        let end = Instant::now() + Duration::from_secs(1);
        while Arc::strong_count(closed) > 1 && Instant::now() < end {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    unwatch(fd);
    if close_fd {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }
    // A pending exs_poll naming the descriptor now sees it closed.
    if let Ok(e) = engine() {
        e.repoll();
    }
    Ok(())
}

pub(crate) fn write_addr(
    a: SocketAddr,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> Result<(), Errno> {
    if len.is_null() || !sys::mapped(len as usize, std::mem::size_of::<socklen_t>()) {
        return Err(libc::EFAULT);
    }
    // SAFETY: checked mapped.
    let room = unsafe { len.read_unaligned() } as usize;
    let (ss, n) = to_storage(a);
    let k = room.min(n as usize);
    if k > 0 {
        if addr.is_null() || !sys::mapped(addr as usize, k) {
            return Err(libc::EFAULT);
        }
        // SAFETY: k octets mapped at addr; ss has n >= k.
        unsafe { std::ptr::copy_nonoverlapping(&ss as *const _ as *const u8, addr as *mut u8, k) };
    }
    // SAFETY: checked mapped.
    unsafe { len.write_unaligned(n) };
    Ok(())
}

/// `exs_getsockname`.
pub fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
    let a = with(fd, |s| {
        Ok(s.local.or(s.bound).unwrap_or(unspecified(s.family)))
    })?;
    write_addr(a, addr, len)
}

/// `exs_getpeername`.
pub fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
    let a = with(fd, |s| match (&s.role, s.peer) {
        (Role::Connected, Some(p)) => Ok(p),
        _ => Err(libc::ENOTCONN),
    })?;
    write_addr(a, addr, len)
}

/// `exs_fcntl`.
pub fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> Result<c_int, Errno> {
    with(fd, |s| {
        let fresh = matches!(s.role, Role::Fresh) && s.dead.is_none();
        match cmd {
            EXS_F_GETCREDITS => Ok(s.credits as c_int),
            EXS_F_GETSMALL => Ok(s.small as c_int),
            EXS_F_SETCREDITS | EXS_F_SETSMALL => {
                if !fresh {
                    return Err(libc::EISCONN);
                }
                let v = arg as c_int;
                if cmd == EXS_F_SETCREDITS {
                    if !(1..=MAX_CREDITS as c_int).contains(&v) {
                        return Err(libc::EINVAL);
                    }
                    s.credits = v as u32;
                } else {
                    if !(0..=IMM_MAX as c_int).contains(&v) {
                        return Err(libc::EINVAL);
                    }
                    s.small = v as u32;
                }
                Ok(0)
            }
            libc::F_GETFL => Ok(libc::O_RDWR),
            libc::F_SETFL => Ok(0),
            libc::F_GETFD | libc::F_SETFD => {
                // SAFETY: integer argument only.
                let r = unsafe { libc::fcntl(fd, cmd, arg as c_int) };
                if r < 0 {
                    Err(sys::errno())
                } else {
                    Ok(r)
                }
            }
            _ => Err(libc::EINVAL),
        }
    })
}

/// Which call an [`XOp`] serves.
enum XKind {
    /// `exs_send`, `exs_recv` and the offset calls.
    Plain,
    /// `exs_sendmsg` / `exs_recvmsg` with the caller's msghdr. With more
    /// than one iovec the message goes through `stage` (gathered at the
    /// call for a send; scattered into `scatter` at the end of a receive).
    Msg {
        recv: bool,
        user: usize,
        scatter: Vec<(usize, usize)>,
        stage: Option<Vec<u8>>,
    },
    /// `exs_sendfile`: the caller's vector and count; the bytes, staged.
    File {
        user: usize,
        count: c_int,
        /// The advertised buffer, held until the event.
        #[allow(dead_code)]
        stage: Vec<u8>,
    },
    /// `exs_shutdown`; `fin`: it sends the FIN (SHUT_WR, first time).
    Shutdown { fin: bool },
    /// `exs_aclose`, waiting for the earlier sends.
    Close,
}

impl XOp {
    /// [`XOp::finish`] for the calls that are not `exs_send` / `exs_recv`.
    fn finish_kind(mut self, fd: c_int, errno: Errno) {
        if self.mh != EXS_MHANDLE_UNREGISTERED {
            if let Ok(e) = engine() {
                e.mem_release(self.mh);
            }
        }
        if let Some(s) = self.tmp.take() {
            deregister(s);
        }
        let nbytes = if errno == 0 { self.nbytes as isize } else { 0 };
        let mut flags = self.flags;
        if self.trunc {
            flags |= libc::MSG_TRUNC;
        }
        let ev = match std::mem::replace(&mut self.kind, XKind::Plain) {
            XKind::Msg {
                recv,
                user,
                scatter,
                stage,
            } => {
                if recv && errno == 0 {
                    if let Some(st) = &stage {
                        let mut at = 0;
                        for &(b, l) in &scatter {
                            let k = l.min(self.nbytes - at);
                            if k > 0 {
                                // SAFETY: the caller's iovec, inside its
                                // registration or checked mapped at the
                                // call; valid until this event (sys/exs.h).
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        st[at..].as_ptr(),
                                        b as *mut u8,
                                        k,
                                    )
                                };
                            }
                            at += k;
                        }
                    }
                    let m = user as *mut exs_msghdr_t;
                    let mflags = if self.trunc { libc::MSG_TRUNC } else { 0 };
                    // SAFETY: the caller's msghdr, checked mapped at the
                    // call and valid until the event (sys/exs.h).
                    unsafe {
                        std::ptr::addr_of_mut!((*m).msg_namelen).write_unaligned(0);
                        std::ptr::addr_of_mut!((*m).msg_controllen).write_unaligned(0);
                        std::ptr::addr_of_mut!((*m).msg_flags).write_unaligned(mflags);
                    }
                }
                let ty = if recv {
                    EXS_EVT_RECVMSG
                } else {
                    EXS_EVT_SENDMSG
                };
                let mut ev = exs_event_t::new(ty, fd, self.ah, errno);
                ev.exs_evt_union.exs_evt_xfermsg = exs_evt_xfermsg_t {
                    exs_evt_msg: user as *mut exs_msghdr_t,
                    exs_evt_nbytes: nbytes,
                    exs_evt_flags: flags,
                };
                ev
            }
            XKind::File { user, count, .. } => {
                let mut ev = exs_event_t::new(EXS_EVT_SENDFILE, fd, self.ah, errno);
                ev.exs_evt_union.exs_evt_xferfile = exs_evt_xferfile_t {
                    exs_evt_vec: user as *const exs_xferfile_t,
                    exs_evt_count: count,
                    exs_evt_nbytes: nbytes,
                };
                ev
            }
            XKind::Close if errno != libc::ECANCELED => {
                // Due (or the connection died): the descriptor is closed
                // away from the model's lock, then the event is queued.
                let (q, ah) = (self.q.clone(), self.ah);
                let spawned =
                    std::thread::Builder::new()
                        .name("exs-aclose".into())
                        .spawn(move || {
                            let e = close(fd).err().unwrap_or(0);
                            q.push(exs_event_t::new(EXS_EVT_CLOSE, fd, ah, e));
                        });
                if spawned.is_ok() {
                    return;
                }
                exs_event_t::new(EXS_EVT_CLOSE, fd, self.ah, libc::EAGAIN)
            }
            XKind::Close => exs_event_t::new(EXS_EVT_CLOSE, fd, self.ah, errno),
            XKind::Shutdown { .. } | XKind::Plain => {
                exs_event_t::new(EXS_EVT_SHUTDOWN, fd, self.ah, errno)
            }
        };
        self.q.push(ev);
    }
}

/// Readiness of a descriptor for `exs_poll`, and whether a poll ever
/// looked at it (only then does a change wake the engine's epoll).
struct Watch {
    mask: libc::c_short,
    polled: bool,
}

/// The readiness of every descriptor of the model: a lock of its own,
/// taken last (the engine reads it under its lock).
static READY: Mutex<Option<HashMap<c_int, Watch>>> = Mutex::new(None);

fn ready<T>(f: impl FnOnce(&mut HashMap<c_int, Watch>) -> T) -> T {
    let mut g = READY.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(HashMap::new))
}

fn watch_new(fd: c_int) {
    ready(|r| {
        r.insert(
            fd,
            Watch {
                mask: libc::POLLHUP,
                polled: false,
            },
        )
    });
}

fn unwatch(fd: c_int) {
    ready(|r| r.remove(&fd));
    if let Ok(e) = engine() {
        e.forget_fd(fd);
    }
}

/// Whether `fd` is a descriptor of the RDMA model (without the model's
/// lock: the engine asks under its own).
pub fn is_fd(fd: c_int) -> bool {
    active() && ready(|r| r.contains_key(&fd))
}

/// `exs_poll` on a descriptor of the model: its readiness (`POLLIN`,
/// `POLLOUT`, `POLLHUP`, `POLLERR`), or `None` when `fd` is not one. The
/// descriptor (an eventfd) is made readable whenever its readiness
/// changes from then on, so the engine's epoll wakes; this call empties it.
pub fn poll_state(fd: c_int) -> Option<libc::c_short> {
    if !active() {
        return None;
    }
    ready(|r| {
        let w = r.get_mut(&fd)?;
        w.polled = true;
        if sys::poll0(fd, libc::POLLIN) & libc::POLLIN != 0 {
            let mut v: u64 = 0;
            // SAFETY: reads 8 octets into a local; the eventfd is readable
            // and only this function reads it.
            unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
        }
        Some(w.mask)
    })
}

impl Sock {
    /// What `exs_poll` reports for the descriptor.
    fn readiness(&self) -> libc::c_short {
        let (i, o, h, e) = (libc::POLLIN, libc::POLLOUT, libc::POLLHUP, libc::POLLERR);
        match self.role {
            Role::Listening => {
                if self.backlog.is_empty() {
                    0
                } else {
                    i
                }
            }
            Role::Connecting => 0,
            Role::Fresh => h,
            Role::Connected => {
                if let Some(d) = self.dead {
                    return if self.fin && d == libc::EPIPE {
                        i | h
                    } else {
                        i | h | e
                    };
                }
                let Some(c) = &self.conn else { return 0 };
                let mut m = 0;
                if !c.advs.is_empty() || self.fin || self.shut_rd || c.peer_psend.is_some() {
                    m |= i;
                }
                if !self.shut_wr && (c.send_credits > 0 || c.peer_precv.is_some()) {
                    m |= o;
                }
                if self.fin && self.shut_wr {
                    m |= h;
                }
                m
            }
        }
    }

    /// Records the readiness; wakes a poll watching the descriptor when
    /// it changed.
    fn publish(&self, fd: c_int) {
        let m = self.readiness();
        ready(|r| {
            if let Some(w) = r.get_mut(&fd) {
                if w.mask != m {
                    w.mask = m;
                    if w.polled {
                        let one: u64 = 1;
                        // SAFETY: writes 8 octets from a local to our eventfd.
                        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
                    }
                }
            }
        });
    }

    /// After SHUT_RD: receives end with 0 octets; advertisements that
    /// arrive are acknowledged unread (the peer's sends complete, their
    /// data is discarded).
    fn discard_reads(&mut self, fd: c_int) {
        for mut op in self.recvs.drain(..) {
            op.nbytes = 0;
            op.finish(fd, true, 0);
        }
        if !self.reading.is_empty() {
            // A Read of the front advertisement may be in flight.
            return;
        }
        let Some(c) = self.conn.as_mut() else { return };
        while let Some(a) = c.advs.pop_front() {
            c.owed += 1;
            if a.imm.is_none() {
                c.send_msg(
                    TAG_CTRL,
                    Msg {
                        kind: wire::ACK,
                        seq: a.seq,
                        len: a.off as u32,
                        ..Msg::default()
                    },
                );
            }
        }
    }
}

/// Checks the memory of an iovec copied by the library (gathered or
/// scattered through a staging buffer): inside its registration, or
/// mapped when unregistered.
fn iov_ok(mh: c_int, b: usize, l: usize) -> Result<(), Errno> {
    if l == 0 {
        return Ok(());
    }
    if b == 0 {
        return Err(libc::EFAULT);
    }
    if mh == EXS_MHANDLE_UNREGISTERED {
        if !sys::mapped(b, l) {
            return Err(libc::EFAULT);
        }
        return Ok(());
    }
    let e = engine()?;
    e.mem_hold(mh, b, l)?;
    e.mem_release(mh);
    Ok(())
}

/// `exs_sendmsg` (`recv` false) / `exs_recvmsg` on a descriptor of the
/// RDMA model: `iov` holds (handle, address, length) per iovec, `user`
/// is the caller's msghdr. One iovec is an `exs_send` / `exs_recv` of it
/// (zero copy when large); several go through a staging buffer of their
/// total length: gathered at the call for a send (one message), scattered
/// into the iovecs when a receive completes.
pub fn xfer_msg(
    recv: bool,
    fd: c_int,
    iov: &[(c_int, usize, usize)],
    user: usize,
    flags: c_int,
    q: Arc<Queue>,
    ah: usize,
) -> Result<(), Errno> {
    if flags & PERSIST != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if let [(mh, b, l)] = *iov {
        let kind = XKind::Msg {
            recv,
            user,
            scatter: Vec::new(),
            stage: None,
        };
        return xfer_kind(recv, fd, b, l, flags, q, ah, mh, None, kind);
    }
    let mut total: usize = 0;
    for &(mh, b, l) in iov {
        iov_ok(mh, b, l)?;
        total = total.checked_add(l).ok_or(libc::EMSGSIZE)?;
    }
    if total > u32::MAX as usize {
        return Err(libc::EMSGSIZE);
    }
    with(fd, |s| match s.role {
        Role::Connected | Role::Connecting => Ok(()),
        _ => Err(libc::ENOTCONN),
    })?;
    let mut stage = vec![0u8; total];
    if !recv {
        let mut at = 0;
        for &(_, b, l) in iov {
            if l > 0 {
                // SAFETY: checked above: inside its registration or mapped.
                let src = unsafe { std::slice::from_raw_parts(b as *const u8, l) };
                stage[at..at + l].copy_from_slice(src);
            }
            at += l;
        }
    }
    let buf = if total == 0 {
        0
    } else {
        stage.as_ptr() as usize
    };
    let kind = XKind::Msg {
        recv,
        user,
        scatter: iov.iter().map(|&(_, b, l)| (b, l)).collect(),
        stage: Some(stage),
    };
    xfer_kind(
        recv,
        fd,
        buf,
        total,
        flags,
        q,
        ah,
        EXS_MHANDLE_UNREGISTERED,
        None,
        kind,
    )
}

/// Octets `pread` asks for at a time when `exs_sendfile` stages a file.
const FILE_CHUNK: usize = 1 << 20;

/// `exs_sendfile` on a descriptor of the RDMA model: the elements
/// (memory, `iov` with their handles, and file ranges) are read in order
/// into one staging buffer at the call, which is sent as one message
/// (SEQPACKET) or its bytes (STREAM). A file that cannot be read fails
/// the call with its error; one that ends before its range with `EIO`.
pub fn sendfile(
    fd: c_int,
    elems: &[crate::engine::Elem],
    iov: &[(c_int, usize, usize)],
    user: usize,
    count: c_int,
    q: Arc<Queue>,
    ah: usize,
) -> Result<(), Errno> {
    use crate::engine::Elem;
    for &(mh, b, l) in iov {
        iov_ok(mh, b, l)?;
    }
    let mut total: usize = 0;
    for e in elems {
        let l = match *e {
            Elem::Mem(_, l) => l,
            Elem::File { len, .. } => len,
        };
        total = total.checked_add(l).ok_or(libc::EMSGSIZE)?;
    }
    if total > u32::MAX as usize {
        return Err(libc::EMSGSIZE);
    }
    with(fd, |s| {
        if s.shut_wr {
            return Err(libc::EPIPE);
        }
        match s.role {
            Role::Connected | Role::Connecting => Ok(()),
            _ => Err(libc::ENOTCONN),
        }
    })?;
    let mut stage: Vec<u8> = Vec::with_capacity(total);
    for e in elems {
        match *e {
            Elem::Mem(b, l) => {
                if l > 0 {
                    // SAFETY: checked above: inside its registration or mapped.
                    stage.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(b as *const u8, l)
                    });
                }
            }
            Elem::File { fd: ffd, off, len } => {
                let mut done = 0;
                while done < len {
                    let n = FILE_CHUNK.min(len - done);
                    let at = stage.len();
                    stage.resize(at + n, 0);
                    // SAFETY: reads at most n octets into the n just added.
                    let r = unsafe {
                        libc::pread(ffd, stage[at..].as_mut_ptr().cast(), n, off + done as i64)
                    };
                    if r < 0 && sys::errno() == libc::EINTR {
                        stage.truncate(at);
                        continue;
                    }
                    if r <= 0 {
                        return Err(if r == 0 { libc::EIO } else { sys::errno() });
                    }
                    stage.truncate(at + r as usize);
                    done += r as usize;
                }
            }
        }
    }
    let buf = if total == 0 {
        0
    } else {
        stage.as_ptr() as usize
    };
    let kind = XKind::File { user, count, stage };
    xfer_kind(
        false,
        fd,
        buf,
        total,
        0,
        q,
        ah,
        EXS_MHANDLE_UNREGISTERED,
        None,
        kind,
    )
}

/// `exs_shutdown` on a descriptor of the RDMA model. SHUT_RD: receives
/// (pending and later) end with 0 octets and what the peer sends from now
/// on is acknowledged unread. SHUT_WR: later sends fail with `EPIPE`; a
/// FIN follows the earlier sends on the wire, after which the peer's
/// receives end with 0 octets once it has taken every earlier message.
/// The `EXS_EVT_SHUTDOWN` event comes after the earlier sends' events.
pub fn shutdown(fd: c_int, how: c_int, q: Arc<Queue>, ah: usize) -> Result<(), Errno> {
    let mut g = st();
    let s = g.socks.get_mut(&fd).ok_or(libc::EBADF)?;
    if !matches!(s.role, Role::Connected) || s.dead.is_some() {
        return Err(libc::ENOTCONN);
    }
    let rd = how != libc::SHUT_WR;
    let wr = how != libc::SHUT_RD;
    let mut op = xop(0, 0, 0, &q, ah, EXS_MHANDLE_UNREGISTERED)?;
    op.kind = XKind::Shutdown {
        fin: wr && !s.shut_wr,
    };
    s.shut_rd |= rd;
    s.shut_wr |= wr;
    s.sends.push_back(op);
    g.drive(fd);
    Ok(())
}

/// `exs_cancel` on the RDMA model: on `fd` (or every descriptor), the
/// operations with handle `ah` (or all) that have not reached the wire
/// complete with `ECANCELED`: receives not yet matched with an
/// advertisement, sends not yet advertised (waiting for a credit), a
/// persistent receive not yet advertised, pending accepts. Returns how
/// many. Operations already on the wire, a shutdown and a connect go on.
pub fn cancel(fd: Option<c_int>, ah: Option<usize>) -> Result<c_int, Errno> {
    if !active() {
        return match fd {
            Some(_) => Err(libc::EBADF),
            None => Ok(0),
        };
    }
    let mut g = st();
    let fds: Vec<c_int> = match fd {
        Some(f) if g.socks.contains_key(&f) => vec![f],
        Some(_) => return Err(libc::EBADF),
        None => g.socks.keys().copied().collect(),
    };
    let hit = |a: usize| ah.is_none_or(|x| x == a);
    let mut n = 0;
    for f in fds {
        let Some(s) = g.socks.get_mut(&f) else {
            continue;
        };
        let mut keep = VecDeque::new();
        for op in s.recvs.drain(..) {
            if hit(op.ah) {
                op.finish(f, true, libc::ECANCELED);
                n += 1;
            } else {
                keep.push_back(op);
            }
        }
        s.recvs = keep;
        let mut keep = VecDeque::new();
        for op in s.sends.drain(..) {
            let queued = !op.adv && op.done.is_none() && !matches!(op.kind, XKind::Shutdown { .. });
            if queued && hit(op.ah) {
                op.finish(f, false, libc::ECANCELED);
                n += 1;
            } else {
                keep.push_back(op);
            }
        }
        s.sends = keep;
        if s.precv_op
            .as_ref()
            .is_some_and(|o| o.done.is_none() && hit(o.ah))
        {
            let op = s.precv_op.take().expect("checked");
            op.finish(f, true, libc::ECANCELED);
            n += 1;
        }
        let mut keep = VecDeque::new();
        for a in s.accepts.drain(..) {
            if hit(a.ah) {
                push_accept(f, a, -1, None, libc::ECANCELED);
                n += 1;
            } else {
                keep.push_back(a);
            }
        }
        s.accepts = keep;
        g.drive(f);
    }
    Ok(n)
}

/// `exs_aclose` on a descriptor of the RDMA model: with sends pending on
/// a connection, queued behind them (nothing queued later reaches the
/// wire); when they are done the descriptor is closed as by `exs_close`
/// (pending receives end with `ECANCELED`) and `EXS_EVT_CLOSE` is queued.
/// Otherwise closed at once, the event queued before the call returns.
pub fn aclose(fd: c_int, q: Arc<Queue>, ah: usize) -> Result<(), Errno> {
    let mut g = st();
    let s = g.socks.get_mut(&fd).ok_or(libc::EBADF)?;
    if s.sends.is_empty() || s.conn.is_none() {
        drop(g);
        q.reserve()?;
        if let Err(e) = close(fd) {
            q.unreserve();
            return Err(e);
        }
        q.push(exs_event_t::new(EXS_EVT_CLOSE, fd, ah, 0));
        return Ok(());
    }
    let mut op = xop(0, 0, 0, &q, ah, EXS_MHANDLE_UNREGISTERED)?;
    op.kind = XKind::Close;
    s.sends.push_back(op);
    g.drive(fd);
    Ok(())
}
