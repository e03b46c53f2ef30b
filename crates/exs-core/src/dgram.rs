//! `SOCK_DGRAM` descriptors of the RDMA model: one softrdma UD queue pair
//! (or RD, chosen with `exs_fcntl(fd, EXS_F_SETDGRAM, EXS_DGRAM_RD)`)
//! per descriptor. With `EXS_DGRAM_WR` the QP is a UD QP whose datagrams
//! are RDMA Write-Records into receive rings the receivers granted
//! ([`crate::dgram_wr`]).
//!
//! Addressing: the QP is self-driven, so its UDP socket is its own, bound
//! to the descriptor's address, and its number is `port << 8` (slot 0 of
//! the engine's `(port << 8) | slot` rule). An EXS datagram socket's
//! address `(ip, port)` therefore names its QP: a send to `(ip, port)` is
//! one UD (RD) Send to QP `port << 8` at `ip`, UDP port `port`, and a
//! received message's source address is the completion's source IP and
//! UDP port. No header is added (a Write-Record carries one in its slot).
//!
//! Datagrams are copied: each descriptor owns [`RX_BUFS`] receive buffers
//! of [`MAX_DGRAM`] octets and [`TX_BUFS`] send buffers of that and a
//! record header (a datagram that arrives before a receive is queued
//! waits in one, as in a socket buffer; one that finds none is lost, as
//! UDP's). Each descriptor has a
//! thread that polls the CQ (reading the QP's socket) and otherwise
//! sleeps on the QP's socket, the CQ's completion channel and a wake-up
//! eventfd.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use libc::{c_int, sockaddr, socklen_t};
use softrdma_verbs::{
    Access, AddressHandle, Completion, CompletionChannel, CompletionQueue, MemoryRegion, Payload,
    QpCaps, RdQpOptions, RdQueuePair, RecvWr, SendFlags, SendOp, SendWr, SgList, UdQpOptions,
    UdQueuePair, WcOpcode, WcStatus, WorkCompletion,
};

use crate::abi::*;
use crate::dgram_wr::{self, Ctl, Plan, Stats, Wr, SLOT};
use crate::engine::engine;
use crate::queue::Queue;
use crate::rdma::{dev, from_sockaddr, unspecified, write_addr};
use crate::sys;
use crate::Errno;

/// The largest datagram (a send over it is `EMSGSIZE` at the call).
pub const MAX_DGRAM: usize = 65536;
/// Receive buffers per descriptor.
pub const RX_BUFS: usize = 32;
/// Send buffers per descriptor (sends beyond wait for one).
pub const TX_BUFS: usize = 16;

/// `exs_fcntl`: the datagram transport (before `exs_bind`, `exs_connect`
/// or the first transfer).
pub const EXS_F_SETDGRAM: c_int = 0x4558_0105;
/// Reads it.
pub const EXS_F_GETDGRAM: c_int = 0x4558_0106;
/// Unreliable Datagram (default).
pub const EXS_DGRAM_UD: c_int = 0;
/// Reliable Datagram.
pub const EXS_DGRAM_RD: c_int = 1;
/// Write-Record: a UD QP; datagrams are RDMA Write-Records into a ring
/// the receiver granted (UD Sends while it has none or no credit).
pub const EXS_DGRAM_WR: c_int = 2;
/// `exs_fcntl(fd, EXS_F_GETDGRAMSTAT, which)`: one of the descriptor's
/// datagram counters (`EXS_DGRAM_STAT_*`, saturated at `INT_MAX`).
pub const EXS_F_GETDGRAMSTAT: c_int = 0x4558_0107;
/// Datagrams sent as Write-Records.
pub const EXS_DGRAM_STAT_RECORDS_OUT: c_int = 0;
/// Datagrams received as Write-Records (whole or partial).
pub const EXS_DGRAM_STAT_RECORDS_IN: c_int = 1;
/// Of those, delivered as their placed prefix (`MSG_TRUNC`).
pub const EXS_DGRAM_STAT_RECORDS_PARTIAL: c_int = 2;
/// Datagrams sent as UD (RD) Sends.
pub const EXS_DGRAM_STAT_SENDS_OUT: c_int = 3;
/// Datagrams received as UD (RD) Sends.
pub const EXS_DGRAM_STAT_SENDS_IN: c_int = 4;

/// Octets of a send buffer (a Write-Record's header and the largest
/// datagram).
const TXB: usize = SLOT;

const SEND_OK: c_int = libc::MSG_EOR | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | libc::MSG_MORE;
const RECV_OK: c_int = libc::MSG_TRUNC | libc::MSG_DONTWAIT;

enum DQp {
    Ud(UdQueuePair),
    Rd(RdQueuePair),
}

impl DQp {
    fn post_recv(&self, wr: RecvWr) -> bool {
        match self {
            DQp::Ud(q) => q.post_recv(wr).is_ok(),
            DQp::Rd(q) => q.post_recv(wr).is_ok(),
        }
    }
    fn post_send(&self, wr: SendWr, ah: &AddressHandle) -> bool {
        match self {
            DQp::Ud(q) => q.post_send(wr, ah).is_ok(),
            DQp::Rd(q) => q.post_send(wr, ah).is_ok(),
        }
    }
    fn qpn(&self) -> u32 {
        match self {
            DQp::Ud(q) => q.qpn(),
            DQp::Rd(q) => q.qpn(),
        }
    }
    fn ud(&self) -> Option<&UdQueuePair> {
        match self {
            DQp::Ud(q) => Some(q),
            DQp::Rd(_) => None,
        }
    }
    fn socket_fd(&self) -> c_int {
        match self {
            DQp::Ud(q) => q.socket_fd(),
            DQp::Rd(q) => q.socket_fd(),
        }
    }
    fn local_addr(&self) -> SocketAddr {
        match self {
            DQp::Ud(q) => q.local_addr(),
            DQp::Rd(q) => q.local_addr(),
        }
    }
}

/// One send or receive.
struct DOp {
    q: Arc<Queue>,
    ah: usize,
    iov: Vec<(usize, usize)>,
    mhs: Vec<c_int>,
    flags: c_int,
    /// `exs_sendmsg`/`exs_recvmsg`: the caller's msghdr.
    msg: Option<usize>,
    /// The destination of a send.
    dest: Option<SocketAddr>,
}

impl DOp {
    fn total(&self) -> usize {
        self.iov.iter().map(|v| v.1).sum()
    }

    fn finish(self, fd: c_int, recv: bool, errno: Errno, nbytes: usize, trunc: bool) {
        if let Ok(e) = engine() {
            for &m in &self.mhs {
                if m != EXS_MHANDLE_UNREGISTERED {
                    e.mem_release(m);
                }
            }
        }
        let mut ev = exs_event_t::new(0, fd, self.ah, errno);
        let mut flags = self.flags;
        if trunc {
            flags |= libc::MSG_TRUNC;
        }
        let nb = if errno == 0 { nbytes as isize } else { 0 };
        if let Some(m) = self.msg {
            ev.exs_evt_type = if recv {
                EXS_EVT_RECVMSG
            } else {
                EXS_EVT_SENDMSG
            };
            if recv && errno == 0 {
                // SAFETY: the caller's msghdr, checked mapped at the call
                // and to stay valid until the event (sys/exs.h).
                unsafe {
                    std::ptr::addr_of_mut!((*(m as *mut exs_msghdr_t)).msg_flags).write(if trunc {
                        libc::MSG_TRUNC
                    } else {
                        0
                    });
                }
            }
            ev.exs_evt_union.exs_evt_xfermsg = exs_evt_xfermsg_t {
                exs_evt_msg: m as *mut exs_msghdr_t,
                exs_evt_nbytes: nb,
                exs_evt_flags: flags,
            };
        } else {
            ev.exs_evt_type = if recv { EXS_EVT_RECV } else { EXS_EVT_SEND };
            let (buf, len) = self.iov.first().copied().unwrap_or((0, 0));
            ev.exs_evt_union.exs_evt_xfer = exs_evt_xfer_t {
                exs_evt_buf: buf as *mut libc::c_void,
                exs_evt_len: len,
                exs_evt_nbytes: nb,
                exs_evt_flags: flags,
            };
        }
        self.q.push(ev);
    }
}

/// Where a received datagram lies.
#[derive(Clone, Copy)]
enum Loc {
    /// A receive buffer (its index).
    Buf(usize),
    /// A ring slot: ring, slot offset, sequence number.
    Slot(usize, usize, u32),
}

/// A datagram arrived: where, its length, octets of it present (fewer:
/// a partial Write-Record's placed prefix), its source.
struct Rx {
    loc: Loc,
    len: usize,
    avail: usize,
    from: SocketAddr,
}

/// The QP and its buffers, from the first use that needs them.
struct Qp {
    qp: DQp,
    cq: CompletionQueue,
    chan: CompletionChannel,
    rx_mr: MemoryRegion,
    tx_mr: MemoryRegion,
    tx_free: Vec<usize>,
    /// Sends posted, by send buffer (`None`: a control message).
    inflight: HashMap<usize, Option<DOp>>,
    /// Datagrams arrived.
    rx: VecDeque<Rx>,
    ahs: HashMap<SocketAddr, AddressHandle>,
    /// `EXS_DGRAM_WR`: the rings.
    wr: Option<Wr>,
    /// Control messages waiting for a send buffer.
    ctl: VecDeque<Ctl>,
    stats: Stats,
}

impl Qp {
    fn post_recv(&self, idx: usize) {
        let sge = self.rx_mr.sge(idx * MAX_DGRAM, MAX_DGRAM as u32);
        let _ = self.qp.post_recv(RecvWr {
            wr_id: idx as u64,
            sgl: SgList::single(sge.addr, sge.length, sge.lkey),
        });
    }

    /// The application is done with a datagram: its buffer is posted
    /// again, or its ring slot counts as consumed.
    fn release(&mut self, loc: Loc) {
        match loc {
            Loc::Buf(idx) => self.post_recv(idx),
            Loc::Slot(ring, _, seq) => {
                if let Some(w) = self.wr.as_mut() {
                    let mut out = Vec::new();
                    w.release(ring, seq, &mut out);
                    self.ctl.extend(out);
                }
            }
        }
    }

    /// The address handle toward the descriptor at `dest`.
    fn ah(&mut self, dest: SocketAddr) -> Option<AddressHandle> {
        if !self.ahs.contains_key(&dest) {
            let port = dest.port();
            let a = self
                .qp_pd()
                .create_ah_to(dest.ip().to_canonical(), port, u32::from(port) << 8)
                .ok()?;
            self.ahs.insert(dest, a);
        }
        self.ahs.get(&dest).cloned()
    }

    /// Posts the control messages waiting, while send buffers are free
    /// (one that finds none waits; the peers ask again anyway).
    fn send_ctl(&mut self) {
        while !self.tx_free.is_empty() {
            let Some((ah, kind, body)) = self.ctl.pop_front() else {
                break;
            };
            let slot = self.tx_free.pop().unwrap_or(0);
            let _ = self.tx_mr.write_at(slot * TXB, &body);
            let sge = self.tx_mr.sge(slot * TXB, body.len() as u32);
            let wr = SendWr {
                wr_id: slot as u64,
                op: SendOp::Send {
                    imm: Some(dgram_wr::imm(kind)),
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::single(sge.addr, sge.length, sge.lkey)),
                flags: SendFlags {
                    signaled: true,
                    ..SendFlags::default()
                },
            };
            if self.qp.post_send(wr, &ah) {
                self.inflight.insert(slot, None);
            } else {
                self.tx_free.push(slot);
            }
        }
    }
}

struct Inner {
    family: c_int,
    /// `EXS_DGRAM_UD`, `_RD` or `_WR`.
    mode: c_int,
    bound: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    qp: Option<Qp>,
    recvs: VecDeque<DOp>,
    sends: VecDeque<DOp>,
    closed: bool,
}

struct DSock {
    inner: Mutex<Inner>,
    wake: c_int,
    stop: AtomicBool,
}

impl DSock {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: our eventfd, 8 octets.
        unsafe { libc::write(self.wake, &one as *const u64 as *const libc::c_void, 8) };
    }
}

impl Drop for DSock {
    fn drop(&mut self) {
        // SAFETY: our own descriptor.
        unsafe { libc::close(self.wake) };
    }
}

type Socks = Mutex<HashMap<c_int, Arc<DSock>>>;

fn socks() -> MutexGuard<'static, HashMap<c_int, Arc<DSock>>> {
    static S: OnceLock<Socks> = OnceLock::new();
    S.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether any datagram descriptor was ever made (cheap check first).
pub fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Whether `fd` is a datagram descriptor of the RDMA model.
pub fn owns(fd: c_int) -> bool {
    ACTIVE.load(Ordering::Acquire) && socks().contains_key(&fd)
}

fn get(fd: c_int) -> Result<Arc<DSock>, Errno> {
    socks().get(&fd).cloned().ok_or(libc::EBADF)
}

/// `exs_socket(AF_INET[6], SOCK_DGRAM, 0)`.
pub fn socket(domain: c_int, ty: c_int) -> Result<c_int, Errno> {
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
    // SAFETY: no pointer arguments.
    let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if wake < 0 {
        let e = sys::errno();
        // SAFETY: ours.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let s = Arc::new(DSock {
        inner: Mutex::new(Inner {
            family: domain,
            mode: EXS_DGRAM_UD,
            bound: None,
            peer: None,
            qp: None,
            recvs: VecDeque::new(),
            sends: VecDeque::new(),
            closed: false,
        }),
        wake,
        stop: AtomicBool::new(false),
    });
    socks().insert(fd, s);
    ACTIVE.store(true, Ordering::Release);
    Ok(fd)
}

/// Creates the QP bound to the descriptor's address (the unspecified
/// address and a port the kernel picks when unbound) and starts the
/// descriptor's thread.
fn ensure_qp(fd: c_int, s: &Arc<DSock>, g: &mut Inner) -> Result<(), Errno> {
    if g.qp.is_some() {
        return Ok(());
    }
    let d = dev()?;
    let bind = g.bound.unwrap_or(unspecified(g.family));
    let chan = d.ctx.create_comp_channel().map_err(|_| libc::EMFILE)?;
    let cq = d.ctx.create_cq(
        2 * (RX_BUFS + TX_BUFS) + 2 * dgram_wr::RINGS * dgram_wr::RING_SLOTS as usize + 8,
        Some(&chan),
    );
    let caps = QpCaps {
        max_send_wr: TX_BUFS + 4,
        max_recv_wr: RX_BUFS,
    };
    let wr = g.mode == EXS_DGRAM_WR;
    let qp = if g.mode == EXS_DGRAM_RD {
        d.pd.create_rd_qp(
            &cq,
            &cq,
            caps,
            RdQpOptions {
                bind,
                max_msg: MAX_DGRAM,
                self_driven: true,
                ..RdQpOptions::default()
            },
        )
        .map(DQp::Rd)
    } else {
        d.pd.create_ud_qp(
            &cq,
            &cq,
            caps,
            UdQpOptions {
                bind,
                // A Write-Record is a header and the datagram.
                max_msg: if wr { SLOT } else { MAX_DGRAM },
                self_driven: true,
                record: dgram_wr::record_config(),
                ..UdQpOptions::default()
            },
        )
        .map(DQp::Ud)
    }
    .map_err(|_| libc::EADDRINUSE)?;
    let local = qp.local_addr();
    if qp.qpn() != u32::from(local.port()) << 8 {
        // The rule that lets (ip, port) name the QP does not hold.
        return Err(libc::EADDRINUSE);
    }
    let rx_mr =
        d.pd.register(RX_BUFS * MAX_DGRAM, Access::LOCAL_WRITE)
            .map_err(|_| libc::ENOMEM)?;
    let tx_mr =
        d.pd.register(TX_BUFS * TXB, Access(0))
            .map_err(|_| libc::ENOMEM)?;
    let q = Qp {
        qp,
        cq,
        chan,
        rx_mr,
        tx_mr,
        tx_free: (0..TX_BUFS).rev().collect(),
        inflight: HashMap::new(),
        rx: VecDeque::new(),
        ahs: HashMap::new(),
        wr: wr.then(Wr::default),
        ctl: VecDeque::new(),
        stats: Stats::default(),
    };
    for i in 0..RX_BUFS {
        q.post_recv(i);
    }
    g.bound = Some(local);
    g.qp = Some(q);
    let s2 = s.clone();
    std::thread::Builder::new()
        .name("exs-dgram".into())
        .spawn(move || run(fd, s2))
        .map_err(|_| libc::EAGAIN)?;
    Ok(())
}

/// The descriptor's thread: drives, arms the CQ, sleeps.
fn run(fd: c_int, s: Arc<DSock>) {
    let (sock_fd, chan_fd) = {
        let g = s.lock();
        match &g.qp {
            Some(q) => (q.qp.socket_fd(), q.chan.fd()),
            None => return,
        }
    };
    while !s.stop.load(Ordering::Acquire) {
        {
            let mut g = s.lock();
            if g.closed {
                return;
            }
            drive(fd, &mut g);
            if let Some(q) = &g.qp {
                let _ = q.chan.get_event(Some(Duration::ZERO));
                q.cq.req_notify(false);
            }
            drive(fd, &mut g);
        }
        let mut p = [
            libc::pollfd {
                fd: sock_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: chan_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: s.wake,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: three pollfds of ours.
        unsafe { libc::poll(p.as_mut_ptr(), 3, 10) };
        if p[2].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: our eventfd, 8 octets.
            unsafe { libc::read(s.wake, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
    }
}

/// Takes completions, posts sends, matches datagrams with receives.
fn drive(fd: c_int, g: &mut Inner) {
    let Some(q) = g.qp.as_mut() else { return };
    let blank = Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    };
    let mut out = [blank; 32];
    // A poll reads the QP's socket only when the CQ's queue is empty: a
    // Write-Record sender needs its peers' grants and credits read too,
    // so it looks until one poll found the queue empty.
    let mut looks: usize = if q.wr.is_some() { 4 } else { 0 };
    loop {
        let n = q.cq.poll(&mut out);
        for c in &out[..n] {
            complete(fd, q, g.peer, &c.wc);
        }
        if n == 0 || (n < out.len() && looks == 0) {
            break;
        }
        looks = looks.saturating_sub(usize::from(n < out.len()));
    }
    q.send_ctl();
    // Sends, in order, while send buffers are free.
    while !q.tx_free.is_empty() {
        let Some(op) = g.sends.pop_front() else { break };
        let Some(dest) = op.dest.or(g.peer) else {
            op.finish(fd, false, libc::EDESTADDRREQ, 0, false);
            continue;
        };
        let Some(ah) = q.ah(dest) else {
            op.finish(fd, false, libc::EINVAL, 0, false);
            continue;
        };
        let plan = match q.wr.as_mut() {
            Some(w) => w.plan(dest),
            None => Plan::Send(None),
        };
        let slot = q.tx_free.pop().unwrap_or(0);
        let (hdr, op_wr, seq) = match plan {
            Plan::Record {
                remote_addr,
                rkey,
                hdr,
            } => (
                Some(hdr),
                SendOp::WriteRecord { remote_addr, rkey },
                Some(u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]])),
            ),
            Plan::Send(imm) => (
                None,
                SendOp::Send {
                    imm,
                    invalidate: None,
                },
                None,
            ),
        };
        let mut off = 0;
        if let Some(h) = hdr {
            let _ = q.tx_mr.write_at(slot * TXB, &h);
            off = h.len();
        }
        for &(b, l) in &op.iov {
            if l > 0 {
                // SAFETY: the caller's buffer, checked mapped (or inside
                // its registration) at the call and valid until the event.
                let src = unsafe { std::slice::from_raw_parts(b as *const u8, l) };
                let _ = q.tx_mr.write_at(slot * TXB + off, src);
            }
            off += l;
        }
        let sge = q.tx_mr.sge(slot * TXB, off as u32);
        let wr = SendWr {
            wr_id: slot as u64,
            op: op_wr,
            payload: Payload::Sgl(SgList::single(sge.addr, sge.length, sge.lkey)),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        if q.qp.post_send(wr, &ah) {
            if seq.is_some() {
                q.stats.records_out += 1;
            } else {
                q.stats.sends_out += 1;
            }
            q.inflight.insert(slot, Some(op));
        } else {
            if let (Some(s), Some(w)) = (seq, q.wr.as_mut()) {
                w.unplan(dest, s);
            }
            q.tx_free.push(slot);
            op.finish(fd, false, libc::EIO, 0, false);
        }
    }
    // Receives, in order, while datagrams wait.
    while !q.rx.is_empty() {
        let Some(op) = g.recvs.pop_front() else { break };
        let Some(m) = q.rx.pop_front() else {
            break;
        };
        let mut off = 0;
        for &(b, l) in &op.iov {
            let n = l.min(m.avail - off);
            if n > 0 {
                // SAFETY: the caller's buffer, checked at the call and
                // valid until the event.
                let dst = unsafe { std::slice::from_raw_parts_mut(b as *mut u8, n) };
                match m.loc {
                    Loc::Buf(idx) => {
                        let _ = q.rx_mr.read_at(idx * MAX_DGRAM + off, dst);
                    }
                    Loc::Slot(ring, at, _) => {
                        if let Some(w) = q.wr.as_ref() {
                            w.read(ring, at, off, dst);
                        }
                    }
                }
            }
            off += n;
        }
        q.release(m.loc);
        if let Some(mp) = op.msg {
            // SAFETY: the caller's msghdr, checked mapped at the call.
            let h = unsafe { (mp as *const exs_msghdr_t).read_unaligned() };
            if !h.msg_name.is_null() {
                let mut nl = h.msg_namelen;
                if write_addr(m.from, h.msg_name as *mut sockaddr, &mut nl).is_ok() {
                    // SAFETY: as above.
                    unsafe {
                        std::ptr::addr_of_mut!((*(mp as *mut exs_msghdr_t)).msg_namelen).write(nl)
                    };
                }
            }
        }
        op.finish(fd, true, 0, off, off < m.len);
    }
    // Credits the reads just earned.
    q.send_ctl();
}

/// One completion of the descriptor's CQ.
fn complete(fd: c_int, q: &mut Qp, peer: Option<SocketAddr>, wc: &WorkCompletion) {
    match wc.opcode {
        WcOpcode::Recv => {
            let idx = wc.wr_id as usize;
            if idx >= RX_BUFS {
                return;
            }
            let (WcStatus::Success, Some(src)) = (wc.status, wc.src) else {
                q.post_recv(idx);
                return;
            };
            let from = SocketAddr::new(src.ip.to_canonical(), src.port);
            let kind = dgram_wr::kind(wc.imm);
            if let Some(k @ (dgram_wr::K_GRANT | dgram_wr::K_CREDIT)) = kind {
                // Control, never delivered.
                if let Some(w) = q.wr.as_mut() {
                    let n = (wc.byte_len as usize).min(20);
                    let mut b = [0u8; 20];
                    if q.rx_mr.read_at(idx * MAX_DGRAM, &mut b[..n]).is_ok() {
                        w.control(src, k, &b[..n]);
                    }
                }
                q.post_recv(idx);
                return;
            }
            // A connected descriptor takes its peer's only.
            if peer.is_some_and(|p| !same(p, from)) {
                q.post_recv(idx);
                return;
            }
            if let Some(k @ (dgram_wr::K_HELLO | dgram_wr::K_ASK)) = kind {
                let mut out = Vec::new();
                match (q.wr.as_mut(), q.qp.ud()) {
                    (Some(w), Some(ud)) => w.request(ud, src, from, k, &mut out),
                    // Not a Write-Record descriptor: the writer sends UD
                    // Sends.
                    (None, Some(ud)) => {
                        if let Ok(ah) = ud.pd().create_ah(src) {
                            out.push(dgram_wr::refusal(ah));
                        }
                    }
                    _ => {}
                }
                q.ctl.extend(out);
            }
            q.stats.sends_in += 1;
            let len = wc.byte_len as usize;
            q.rx.push_back(Rx {
                loc: Loc::Buf(idx),
                len,
                avail: len,
                from,
            });
        }
        WcOpcode::RecvWriteRecord => {
            let Some(w) = q.wr.as_mut() else { return };
            let Some(r) = w.record(wc, &mut q.stats) else {
                return;
            };
            let loc = Loc::Slot(r.ring, r.off, r.seq);
            if peer.is_some_and(|p| !same(p, r.from)) {
                q.release(loc);
                return;
            }
            q.rx.push_back(Rx {
                loc,
                len: r.len,
                avail: r.avail,
                from: r.from,
            });
        }
        _ => {
            let slot = wc.wr_id as usize;
            match q.inflight.remove(&slot) {
                Some(Some(op)) => {
                    q.tx_free.push(slot);
                    let n = op.total();
                    let e = if wc.status == WcStatus::Success {
                        0
                    } else {
                        libc::EIO
                    };
                    op.finish(fd, false, e, n, false);
                }
                Some(None) => q.tx_free.push(slot),
                None => {}
            }
        }
    }
}

impl Qp {
    fn qp_pd(&self) -> &softrdma_verbs::ProtectionDomain {
        match &self.qp {
            DQp::Ud(q) => q.pd(),
            DQp::Rd(q) => q.pd(),
        }
    }
}

/// Addresses equal, an unspecified peer IP matching any.
fn same(peer: SocketAddr, from: SocketAddr) -> bool {
    peer.port() == from.port()
        && (peer.ip().to_canonical() == from.ip() || peer.ip().is_unspecified())
}

/// `exs_bind`.
pub fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> Result<(), Errno> {
    let s = get(fd)?;
    let mut g = s.lock();
    let a = from_sockaddr(addr, len, g.family)?;
    if g.bound.is_some() || g.qp.is_some() {
        return Err(libc::EINVAL);
    }
    g.bound = Some(a);
    if let Err(e) = ensure_qp(fd, &s, &mut g) {
        g.bound = None;
        return Err(e);
    }
    Ok(())
}

/// `exs_connect`: fixes the peer (binding first when unbound); the
/// event is queued at once.
pub fn connect(
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
    q: Arc<Queue>,
    ah: usize,
) -> Result<(), Errno> {
    let s = get(fd)?;
    let mut g = s.lock();
    let a = from_sockaddr(addr, len, g.family)?;
    if a.port() == 0 {
        return Err(libc::EINVAL);
    }
    q.reserve()?;
    if let Err(e) = ensure_qp(fd, &s, &mut g) {
        q.unreserve();
        return Err(e);
    }
    g.peer = Some(a);
    q.push(exs_event_t::new(EXS_EVT_CONNECT, fd, ah, 0));
    Ok(())
}

/// `exs_send`/`exs_recv` (`msg` None) and `exs_sendmsg`/`exs_recvmsg`
/// on a datagram descriptor. `iov` is the buffers with their handles,
/// `name` the msghdr's address (sends).
#[allow(clippy::too_many_arguments)]
pub fn xfer(
    recv: bool,
    fd: c_int,
    iov: &[(c_int, usize, usize)],
    flags: c_int,
    q: Arc<Queue>,
    ah: usize,
    msg: Option<usize>,
    name: Option<(usize, socklen_t)>,
) -> Result<(), Errno> {
    let ok = if recv { RECV_OK } else { SEND_OK };
    if flags & (EXS_PERSISTENT | EXS_PERSISTENT_NOTIFY) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if flags & !ok != 0 {
        return Err(libc::EINVAL);
    }
    let s = get(fd)?;
    let mut g = s.lock();
    let mut total: usize = 0;
    for &(mh, b, l) in iov {
        if b == 0 && l > 0 {
            return Err(libc::EFAULT);
        }
        if b.checked_add(l).is_none() {
            return Err(libc::EINVAL);
        }
        if mh == EXS_MHANDLE_UNREGISTERED && l > 0 && !sys::mapped(b, l) {
            return Err(libc::EFAULT);
        }
        total = total.saturating_add(l);
    }
    if !recv && total > MAX_DGRAM {
        return Err(libc::EMSGSIZE);
    }
    let dest = match name {
        Some((p, l)) if !recv && p != 0 && l > 0 => {
            Some(from_sockaddr(p as *const sockaddr, l, g.family)?)
        }
        _ => None,
    };
    if !recv && dest.or(g.peer).is_none() {
        return Err(libc::EDESTADDRREQ);
    }
    if dest.is_some_and(|d| d.port() == 0) {
        return Err(libc::EINVAL);
    }
    let e = engine()?;
    let mut held = Vec::new();
    for &(mh, b, l) in iov {
        if let Err(err) = e.mem_hold(mh, b, l) {
            for &m in &held {
                e.mem_release(m);
            }
            return Err(err);
        }
        if mh != EXS_MHANDLE_UNREGISTERED {
            held.push(mh);
        }
    }
    let release = |held: &[c_int]| {
        for &m in held {
            e.mem_release(m);
        }
    };
    if let Err(err) = q.reserve() {
        release(&held);
        return Err(err);
    }
    if let Err(err) = ensure_qp(fd, &s, &mut g) {
        q.unreserve();
        release(&held);
        return Err(err);
    }
    let op = DOp {
        q,
        ah,
        iov: iov.iter().map(|&(_, b, l)| (b, l)).collect(),
        mhs: held,
        flags,
        msg,
        dest,
    };
    if recv {
        g.recvs.push_back(op);
    } else {
        g.sends.push_back(op);
    }
    drive(fd, &mut g);
    drop(g);
    s.kick();
    Ok(())
}

/// `exs_cancel` on datagram descriptors: the receives and sends still
/// queued (not posted to the QP) of `fd` (every descriptor when `None`)
/// whose handle is `ah` (any when `None`) end with `ECANCELED`; returns
/// how many.
pub fn cancel(fd: Option<c_int>, ah: Option<usize>) -> Result<c_int, Errno> {
    let targets: Vec<(c_int, Arc<DSock>)> = {
        let all = socks();
        match fd {
            Some(fd) => vec![(fd, all.get(&fd).cloned().ok_or(libc::EBADF)?)],
            None => all.iter().map(|(&k, v)| (k, v.clone())).collect(),
        }
    };
    let mut n: c_int = 0;
    for (fd, s) in targets {
        let mut out: Vec<(bool, DOp)> = Vec::new();
        {
            let mut g = s.lock();
            let hit = |o: &DOp| ah.is_none_or(|a| a == o.ah);
            let g = &mut *g;
            for (recv, list) in [(true, &mut g.recvs), (false, &mut g.sends)] {
                let (gone, kept): (VecDeque<DOp>, VecDeque<DOp>) =
                    list.drain(..).partition(|o| hit(o));
                *list = kept;
                out.extend(gone.into_iter().map(|o| (recv, o)));
            }
        }
        for (recv, op) in out {
            op.finish(fd, recv, libc::ECANCELED, 0, false);
            n += 1;
        }
    }
    Ok(n)
}

/// `exs_close`: outstanding operations end with `ECANCELED`.
pub fn close(fd: c_int) -> Result<(), Errno> {
    let s = socks().remove(&fd).ok_or(libc::EBADF)?;
    s.stop.store(true, Ordering::Release);
    s.kick();
    let mut g = s.lock();
    g.closed = true;
    let mut ops: Vec<(bool, DOp)> = g.recvs.drain(..).map(|o| (true, o)).collect();
    ops.extend(g.sends.drain(..).map(|o| (false, o)));
    if let Some(q) = g.qp.as_mut() {
        // An RD QP that received its peer's last message in a poll of
        // this descriptor (the caller's own, in `xfer`) owes the ACK until
        // the CQ is armed or a fallback timer fires. Arming sends it now:
        // dropped with the QP, the peer would retransmit into a closed
        // socket until its retries ran out and fail that send.
        q.cq.req_notify(false);
        ops.extend(
            q.inflight
                .drain()
                .filter_map(|(_, o)| o.map(|o| (false, o))),
        );
    }
    g.qp = None;
    drop(g);
    for (recv, op) in ops {
        op.finish(fd, recv, libc::ECANCELED, 0, false);
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    Ok(())
}

/// `exs_getsockname`: the bound address (the unspecified one before).
pub fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
    let a = {
        let s = get(fd)?;
        let g = s.lock();
        g.bound.unwrap_or(unspecified(g.family))
    };
    write_addr(a, addr, len)
}

/// `exs_getpeername`: `ENOTCONN` unless connected.
pub fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> Result<(), Errno> {
    let a = {
        let s = get(fd)?;
        let g = s.lock();
        g.peer.ok_or(libc::ENOTCONN)?
    };
    write_addr(a, addr, len)
}

/// `exs_fcntl` on a datagram descriptor.
pub fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> Result<c_int, Errno> {
    let s = get(fd)?;
    let mut g = s.lock();
    match cmd {
        EXS_F_GETDGRAM => Ok(g.mode),
        EXS_F_SETDGRAM => {
            let v = arg as c_int;
            match v {
                EXS_DGRAM_UD | EXS_DGRAM_RD | EXS_DGRAM_WR => {
                    if g.qp.is_some() {
                        return Err(libc::EISCONN);
                    }
                    g.mode = v;
                    Ok(0)
                }
                _ => Err(libc::EINVAL),
            }
        }
        EXS_F_GETDGRAMSTAT => {
            let st = g.qp.as_ref().map(|q| q.stats).unwrap_or_default();
            let v = match arg as c_int {
                EXS_DGRAM_STAT_RECORDS_OUT => st.records_out,
                EXS_DGRAM_STAT_RECORDS_IN => st.records_in,
                EXS_DGRAM_STAT_RECORDS_PARTIAL => st.records_partial,
                EXS_DGRAM_STAT_SENDS_OUT => st.sends_out,
                EXS_DGRAM_STAT_SENDS_IN => st.sends_in,
                _ => return Err(libc::EINVAL),
            };
            Ok(v.min(c_int::MAX as u64) as c_int)
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
}
