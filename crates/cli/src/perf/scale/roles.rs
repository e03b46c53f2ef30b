//! The processes of one `perf scale` point: one server, a few clients
//! (`softrdma perf scale --role server|client key=value…`), all on
//! 127.0.0.1.
//!
//! * **server**: one context, one CQ, one registered buffer; for UD and RD
//!   one QP, for RC a listener that accepts every connection onto a new
//!   QP, for DC one DC target (its shared receive queue keeps the
//!   receives) and one DC initiator that replies (one DC address handle
//!   shared by every reply). It reports its resident set size before any peer (`ready
//!   rss=…`), once every one of the `n` peers has been served (`setup
//!   rss=…`), and after the traffic has been idle for `settle_ms`, longer
//!   than the RD idle expiry set for the run (`result rss=…`), with the
//!   open descriptors and, for RD, the peer entries still alive. It is
//!   told `go` with the clients; from then on, [`SERVER_STALL`] without a
//!   new peer served is a failure (`error …` with the counts and, for UD
//!   and RD, the QP's counters).
//! * **client**: creates `count` endpoints (UD QPs, RD QPs, RC QPs that
//!   are not yet connected, or DC targets: each endpoint is a DCT the
//!   server replies to, and one DCI per client process sends every
//!   endpoint's request, over one connection to the server's DCT — DC
//!   shares it; the replies need one connection per endpoint, made and
//!   evicted by the server's 16-slot table), says `ready`, and on `go` walks them in turn:
//!   (RC: connect,) send the server one 8-octet message carrying the
//!   endpoint's peer id, wait for the server's reply on that endpoint (UD:
//!   send again after 200 ms, at most 25 times). Then it keeps every
//!   endpoint open, idle, until `stop`. An endpoint left without a reply
//!   fails the client (`error endpoint i: …`, with that endpoint's
//!   counters for UD and RD); the parent watches the clients while the
//!   server serves, so that ends the point at once.
//!
//! Serving a peer is: its first message received (UD/RD: the peer id, read
//! from a receive slot that only that receive uses, marks a bitmap
//! allocated before the baseline; RC: the QP's first receive; DC: the
//! peer id and the endpoint's DCT number from the receive slot) and a reply
//! sent to it (UD/RD: through an address handle made from the completion
//! and dropped at once — no per-peer state in the application).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use softrdma_verbs::cm::{self, ConnParams};
use softrdma_verbs::dc::{DcAddressHandle, DcInitiator, DcOptions, DcTarget};
use softrdma_verbs::dgram::SocketStats;
use softrdma_verbs::{
    Access, AddressHandle, Completion, Context, DgramAddr, MemoryRegion, Payload, ProtectionDomain,
    QpCaps, QueuePair, RdQpOptions, RdQueuePair, RecvWr, SendFlags, SendOp, SendWr, SgList,
    UdQpOptions, UdQueuePair, WcOpcode, WcStatus, WorkCompletion,
};

use super::super::loss::proc::{commands, fd_limit, open_fds, rss, say, stopped, Kv};

/// The transports `perf scale` knows (roles side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reliable connected: one TCP connection and QP per peer.
    Rc,
    /// Unreliable datagram: one server QP for every peer.
    Ud,
    /// Reliable datagram: one server QP, per-peer reliability state that
    /// expires when idle.
    Rd,
    /// Dynamically connected (SoftDC): one server DCT and DCI, RC
    /// connections made on demand in a 16-slot table.
    Dc,
}

impl Kind {
    /// The argument spelling.
    pub fn key(self) -> &'static str {
        match self {
            Kind::Rc => "rc",
            Kind::Ud => "ud",
            Kind::Rd => "rd",
            Kind::Dc => "dc",
        }
    }

    /// Parses [`Kind::key`].
    pub fn from_key(s: &str) -> Option<Kind> {
        [Kind::Rc, Kind::Ud, Kind::Rd, Kind::Dc]
            .into_iter()
            .find(|k| k.key() == s)
    }
}

/// Octets per receive slot.
const SLOT: usize = 64;
/// Receives the UD/RD server keeps posted.
const SERVER_RQ: usize = 256;
/// Octets of a request or reply.
const MSG: usize = 8;
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The DC access key of the experiment.
const DC_KEY: u64 = 0x5ca1_e000_0000_00dc;
/// Send queue depth of the DC server's DCI (replies wait in it while
/// their connections are made).
const DC_SQ: usize = 4096;
/// The server gives up when no new peer was served for this long after
/// `go` (each client walks its endpoints in turn, so one that waits in
/// vain for a reply stops every peer behind it).
const SERVER_STALL: Duration = Duration::from_secs(120);

fn dc_options() -> DcOptions {
    DcOptions {
        bind_ip: LOCALHOST,
        ..DcOptions::default()
    }
}

/// The DC server's objects.
struct DcServer {
    srq: softrdma_verbs::SharedReceiveQueue,
    dct: DcTarget,
    dci: DcInitiator,
    /// The DCI's own CQ (send completions only).
    cq: softrdma_verbs::CompletionQueue,
    ah: DcAddressHandle,
}

impl DcServer {
    /// Reads the DCI's completions; counts the failed ones.
    fn drain(&self, errors: &mut u64) {
        let mut buf = [blank(); 64];
        loop {
            let k = self.cq.poll(&mut buf);
            *errors += buf[..k]
                .iter()
                .filter(|c| c.wc.status != WcStatus::Success)
                .count() as u64;
            if k < buf.len() {
                return;
            }
        }
    }
}

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

fn sgl(mr: &MemoryRegion, off: usize, len: usize) -> SgList {
    let s = mr.sge(off, len as u32);
    SgList::single(s.addr, s.length, s.lkey)
}

fn send_wr(wr_id: u64, mr: &MemoryRegion, off: usize) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Send {
            imm: None,
            invalidate: None,
        },
        payload: Payload::Sgl(sgl(mr, off, MSG)),
        flags: SendFlags {
            signaled: true,
            ..SendFlags::default()
        },
    }
}

fn reg(pd: &ProtectionDomain, len: usize) -> Result<MemoryRegion, String> {
    pd.register(len, Access::LOCAL_WRITE)
        .map_err(|e| e.to_string())
}

fn conn_params() -> ConnParams {
    ConnParams {
        private_data: Vec::new(),
        ird: 1,
        ord: 1,
    }
}

fn ud_options() -> UdQpOptions {
    UdQpOptions {
        bind: SocketAddr::new(LOCALHOST, 0),
        ..UdQpOptions::default()
    }
}

fn rd_options(idle: Duration) -> RdQpOptions {
    let mut o = RdQpOptions {
        bind: SocketAddr::new(LOCALHOST, 0),
        ..RdQpOptions::default()
    };
    // The RD layer requires idle_timeout >= (retry_limit + 1) * rto_max +
    // max_datagram_lifetime (a peer is not forgotten while it may still
    // retry); shorten the latter two to fit the run's short expiry.
    let r = &mut o.reliability;
    let slots = 2 * (r.retry_limit + 1);
    r.rto_max = r.rto_max.min(idle / slots).max(r.rto_min * 2);
    r.rto_initial = r.rto_initial.min(r.rto_max);
    r.max_datagram_lifetime = r.max_datagram_lifetime.min(idle / 4);
    r.idle_timeout = idle;
    o
}

/// Runs role `role`; prints `error …` and returns false on failure.
pub fn run(role: &str, kv: &Kv) -> bool {
    let r = match role {
        "server" => server(kv),
        "client" => client(kv),
        other => Err(format!("unknown role {other}")),
    };
    match r {
        Ok(()) => true,
        Err(e) => {
            say(&format!("error {e}"));
            false
        }
    }
}

fn kind_of(kv: &Kv) -> Result<Kind, String> {
    let k: String = kv.get("transport")?;
    Kind::from_key(&k).ok_or_else(|| format!("unknown transport {k}"))
}

// ----------------------------------------------------------------------
// Server
// ----------------------------------------------------------------------

enum ServerQp {
    Ud(UdQueuePair),
    Rd(RdQueuePair),
}

impl ServerQp {
    /// The QP's counters on one line, for a failure's message.
    fn brief(&self) -> String {
        match self {
            ServerQp::Ud(q) => ud_brief(q),
            ServerQp::Rd(q) => rd_brief(q),
        }
    }
}

/// A datagram QP's counters on one line: what its socket read and sent,
/// and what its protocol did — enough to tell a request never sent from
/// one lost or one never answered.
fn ud_brief(q: &UdQueuePair) -> String {
    let s = q.stats();
    format!("{}; ud {:?}", socket_brief(&s.socket), s.ud)
}

/// [`ud_brief`] for RD: the RD QP's and reliability layer's counters
/// (sent, re-sent, acknowledged, timed out, sessions, peers) and where its
/// timers ran.
fn rd_brief(q: &RdQueuePair) -> String {
    let s = q.stats();
    let e = q.engine().stats();
    format!(
        "{}; timers inline={} thread={}; rd {:?} reliability {:?}",
        socket_brief(&s.socket),
        e.timers_inline,
        e.timers_thread,
        s.rd,
        s.reliability
    )
}

/// A socket's counters on one line.
fn socket_brief(sock: &SocketStats) -> String {
    format!(
        "socket rx={} tx={} would_block={} no_qp={} errors={}",
        sock.rx_datagrams, sock.tx_datagrams, sock.tx_would_block, sock.rx_no_qp, sock.rx_errors
    )
}

/// Empty polls of the server's CQ timed after the idle period.
const IDLE_POLLS: u128 = 200;

fn server(kv: &Kv) -> Result<(), String> {
    let kind = kind_of(kv)?;
    let n: usize = kv.get("n")?;
    let idle = Duration::from_millis(kv.get("idle_ms")?);
    let settle = Duration::from_millis(kv.get("settle_ms")?);
    let cmds = commands();
    let ctx = Context::open().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(8192, None);
    let rx = reg(&pd, SERVER_RQ * SLOT)?;
    let tx = reg(&pd, SLOT)?;
    // One bit per peer, touched now so it is part of the baseline.
    let mut seen = vec![0xFFu8; n / 8 + 1];
    seen.iter_mut().for_each(|b| *b = 0);
    let mut count = 0usize;
    let mut buf = [blank(); 64];
    let mut errors = 0u64;
    let mut dc: Option<DcServer> = None;
    let (port, qpn, dgram, rc) = match kind {
        Kind::Ud | Kind::Rd => {
            let caps = QpCaps {
                max_send_wr: 1024,
                max_recv_wr: SERVER_RQ,
            };
            let qp = match kind {
                Kind::Ud => ServerQp::Ud(
                    pd.create_ud_qp(&cq, &cq, caps, ud_options())
                        .map_err(|e| e.to_string())?,
                ),
                _ => ServerQp::Rd(
                    pd.create_rd_qp(&cq, &cq, caps, rd_options(idle))
                        .map_err(|e| e.to_string())?,
                ),
            };
            for i in 0..SERVER_RQ {
                let wr = RecvWr {
                    wr_id: i as u64,
                    sgl: sgl(&rx, i * SLOT, SLOT),
                };
                match &qp {
                    ServerQp::Ud(q) => q.post_recv(wr).map_err(|e| e.to_string())?,
                    ServerQp::Rd(q) => q.post_recv(wr).map_err(|e| e.to_string())?,
                }
            }
            let (port, qpn) = match &qp {
                ServerQp::Ud(q) => (q.local_addr().port(), q.qpn()),
                ServerQp::Rd(q) => (q.local_addr().port(), q.qpn()),
            };
            (port, qpn, Some(qp), None)
        }
        Kind::Rc => {
            let listener = cm::Listener::bind(&ctx, (LOCALHOST, 0)).map_err(|e| e.to_string())?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            let qps: Arc<Mutex<HashMap<u32, (QueuePair, bool)>>> = Arc::default();
            let (pd2, cq2, qps2) = (pd.clone(), cq.clone(), qps.clone());
            let slot = rx.sge(0, SLOT as u32);
            std::thread::spawn(move || loop {
                let Ok(req) = listener.get_request() else {
                    continue;
                };
                let caps = QpCaps {
                    max_send_wr: 4,
                    max_recv_wr: 2,
                };
                let qp = pd2.create_qp(&cq2, &cq2, caps);
                let wr = RecvWr {
                    wr_id: 0,
                    sgl: SgList::single(slot.addr, slot.length, slot.lkey),
                };
                if qp.post_recv(wr).is_err() {
                    let _ = req.reject(b"");
                    continue;
                }
                // Into the table once accepted (RTS): a request that
                // arrives before is kept pending by the main loop.
                if req.accept(&qp, &conn_params()).is_ok() {
                    qps2.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(qp.qpn(), (qp, false));
                }
            });
            (port, 0, None, Some(qps))
        }
        Kind::Dc => {
            let srq = pd.create_srq(SERVER_RQ);
            for i in 0..SERVER_RQ {
                srq.post_recv(RecvWr {
                    wr_id: i as u64,
                    sgl: sgl(&rx, i * SLOT, SLOT),
                })
                .map_err(|e| e.to_string())?;
            }
            let dct = pd
                .create_dct(&cq, &srq, DC_KEY, dc_options())
                .map_err(|e| e.to_string())?;
            let dcq = ctx.create_cq(DC_SQ, None);
            let dci = pd
                .create_dci(&dcq, DC_SQ, dc_options())
                .map_err(|e| e.to_string())?;
            let qpn = dct.number();
            dc = Some(DcServer {
                srq,
                dct,
                dci,
                cq: dcq,
                ah: pd.sdc_create_ah(LOCALHOST),
            });
            (0, qpn, None, None)
        }
    };
    // Let the progress thread and allocator settle before the baseline.
    std::thread::sleep(Duration::from_millis(200));
    let rss0 = rss();
    let fds0 = open_fds();
    say(&format!(
        "ready port={port} qpn={qpn} rss={rss0} heap={} fds={fds0} fd_limit={}",
        heap(),
        fd_limit().unwrap_or(0)
    ));
    let mut last_seen = Instant::now();
    // The peers served at `go` (the clients are sending) or at the last
    // change of `count`, and since when.
    let mut served_at: Option<(usize, Instant)> = None;
    let mut setup_said = false;
    let mut pending: Vec<u32> = Vec::new();
    loop {
        match cmds.try_recv() {
            Ok(c) if c == "go" => served_at = Some((count, Instant::now())),
            Err(mpsc::TryRecvError::Empty) => {}
            Ok(_) | Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
        }
        match served_at {
            Some((seen, _)) if seen != count => served_at = Some((count, Instant::now())),
            Some((_, since)) if since.elapsed() > SERVER_STALL => {
                return Err(format!(
                    "{count} of {n} peers served, none for {} s; {}",
                    SERVER_STALL.as_secs(),
                    dgram.as_ref().map_or_else(String::new, ServerQp::brief)
                ));
            }
            _ => {}
        }
        if let (Some(qps), false) = (&rc, pending.is_empty()) {
            // RC: reply on every connection whose request arrived, once
            // the accepting thread has put it in the table (accepted).
            let mut map = qps.lock().unwrap_or_else(|p| p.into_inner());
            let mut left = Vec::new();
            for qpn in pending.drain(..) {
                match map.get_mut(&qpn) {
                    Some((qp, served)) if !*served => {
                        qp.post_send(send_wr(0, &tx, 0))
                            .map_err(|e| e.to_string())?;
                        *served = true;
                        count += 1;
                    }
                    Some(_) => {}
                    None => left.push(qpn),
                }
            }
            pending = left;
        }
        if let Some(d) = &dc {
            d.drain(&mut errors);
        }
        let k = cq.poll(&mut buf);
        if k == 0 {
            if count == n {
                if !setup_said {
                    say(&format!(
                        "setup rss={} heap={} fds={}",
                        rss(),
                        heap(),
                        open_fds()
                    ));
                    setup_said = true;
                }
                if last_seen.elapsed() >= settle {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        for comp in &buf[..k] {
            let wc = &comp.wc;
            if wc.opcode != WcOpcode::Recv {
                errors += u64::from(wc.status != WcStatus::Success);
                continue;
            }
            if wc.status != WcStatus::Success {
                errors += 1;
            }
            last_seen = Instant::now();
            if let Some(d) = &dc {
                let slot = wc.wr_id as usize;
                let mut m = [0u8; 8];
                rx.read_at(slot * SLOT, &mut m).map_err(|e| e.to_string())?;
                let id = u32::from_le_bytes(m[..4].try_into().expect("4")) as usize;
                let dct = u32::from_le_bytes(m[4..].try_into().expect("4"));
                d.srq
                    .post_recv(RecvWr {
                        wr_id: slot as u64,
                        sgl: sgl(&rx, slot * SLOT, SLOT),
                    })
                    .map_err(|e| e.to_string())?;
                if wc.status != WcStatus::Success || id >= n {
                    continue;
                }
                if seen[id / 8] & (1 << (id % 8)) == 0 {
                    seen[id / 8] |= 1 << (id % 8);
                    count += 1;
                }
                while let Err(e) = d.dci.post_send(send_wr(0, &tx, 0), &d.ah, dct, DC_KEY) {
                    if e != softrdma_verbs::PostError::QueueFull {
                        return Err(e.to_string());
                    }
                    d.drain(&mut errors);
                }
                continue;
            }
            match (&dgram, &rc) {
                (Some(qp), _) => {
                    let slot = wc.wr_id as usize;
                    let mut id = [0u8; 4];
                    rx.read_at(slot * SLOT, &mut id)
                        .map_err(|e| e.to_string())?;
                    let id = u32::from_le_bytes(id) as usize;
                    if wc.status == WcStatus::Success
                        && id < n
                        && seen[id / 8] & (1 << (id % 8)) == 0
                    {
                        seen[id / 8] |= 1 << (id % 8);
                        count += 1;
                    }
                    let wr = RecvWr {
                        wr_id: slot as u64,
                        sgl: sgl(&rx, slot * SLOT, SLOT),
                    };
                    let reply = send_wr(0, &tx, 0);
                    match qp {
                        ServerQp::Ud(q) => {
                            q.post_recv(wr).map_err(|e| e.to_string())?;
                            if let Ok(ah) = AddressHandle::from_completion(&pd, wc) {
                                while let Err(e) = q.post_send(reply, &ah) {
                                    if e != softrdma_verbs::UdPostError::QueueFull {
                                        return Err(e.to_string());
                                    }
                                    cq.poll(&mut [blank(); 16]);
                                }
                            }
                        }
                        ServerQp::Rd(q) => {
                            q.post_recv(wr).map_err(|e| e.to_string())?;
                            if let Ok(ah) = AddressHandle::from_completion(&pd, wc) {
                                while let Err(e) = q.post_send(reply, &ah) {
                                    if e != softrdma_verbs::RdPostError::QueueFull {
                                        return Err(e.to_string());
                                    }
                                    cq.poll(&mut [blank(); 16]);
                                }
                            }
                        }
                    }
                }
                (None, Some(_)) => {
                    if wc.status == WcStatus::Success {
                        pending.push(comp.qp_num);
                    }
                }
                _ => unreachable!("one of the two"),
            }
        }
    }
    let (live, expired) = match &dgram {
        // DC: table slots in use; connections closed to make room or idle.
        None if dc.is_some() => {
            let s = dc.as_ref().expect("DC").dct.stats();
            (s.live as u64, s.table.evictions + s.table.idle_closes)
        }
        Some(ServerQp::Rd(q)) => {
            let s = q.stats().reliability;
            (
                s.peers_created
                    .saturating_sub(s.peers_expired + s.peers_failed),
                s.peers_expired,
            )
        }
        Some(ServerQp::Ud(_)) => (0, 0),
        None => {
            let qps = rc.as_ref().expect("RC");
            (
                qps.lock().unwrap_or_else(|p| p.into_inner()).len() as u64,
                0,
            )
        }
    };
    // What one busy poll of the server's CQ costs with every peer idle
    // (the RC server has all N connections on it).
    let t0 = Instant::now();
    for _ in 0..IDLE_POLLS {
        cq.poll(&mut buf);
    }
    let poll_ns = t0.elapsed().as_nanos() / IDLE_POLLS;
    say(&format!(
        "result rss={} heap={} fds={} live_peers={live} expired={expired} errors={errors} poll_ns={poll_ns}",
        rss(),
        heap(),
        open_fds()
    ));
    while !stopped(&cmds) {
        std::thread::sleep(Duration::from_millis(20));
        cq.poll(&mut buf);
    }
    Ok(())
}

// ----------------------------------------------------------------------
// Client
// ----------------------------------------------------------------------

enum Ep {
    Ud(UdQueuePair),
    Rd(RdQueuePair),
    Rc(QueuePair),
    /// The endpoint's DCT (the server replies to it) and its SRQ.
    Dc(DcTarget, softrdma_verbs::SharedReceiveQueue),
}

fn client(kv: &Kv) -> Result<(), String> {
    let kind = kind_of(kv)?;
    let first: u32 = kv.get("first")?;
    let count: usize = kv.get("count")?;
    let port: u16 = kv.get("port")?;
    let qpn: u32 = kv.get("qpn")?;
    let idle = Duration::from_millis(kv.get("idle_ms")?);
    let cmds = commands();
    let ctx = Context::open().map_err(|e| e.to_string())?;
    let pd = ctx.alloc_pd();
    // One CQ per endpoint: a CQ poll progresses every QP attached to it,
    // so a shared one would make each client exchange cost O(count).
    let mut cqs = Vec::with_capacity(count);
    // Receive slot i and, after them, send slot i.
    let mr = reg(&pd, 2 * count * SLOT)?;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 2,
    };
    let mut eps = Vec::with_capacity(count);
    // DC: one DCI (with its own CQ) sends every endpoint's request.
    let dci = match kind {
        Kind::Dc => {
            let dcq = ctx.create_cq(64, None);
            let dci = pd
                .create_dci(&dcq, 16, dc_options())
                .map_err(|e| format!("DCI: {e}"))?;
            Some((dci, dcq, pd.sdc_create_ah(LOCALHOST)))
        }
        _ => None,
    };
    for i in 0..count {
        let cq = ctx.create_cq(8, None);
        let ep = match kind {
            Kind::Ud => Ep::Ud(
                pd.create_ud_qp(&cq, &cq, caps, ud_options())
                    .map_err(|e| format!("UD QP {i}: {e}"))?,
            ),
            Kind::Rd => Ep::Rd(
                pd.create_rd_qp(&cq, &cq, caps, rd_options(idle))
                    .map_err(|e| format!("RD QP {i}: {e}"))?,
            ),
            Kind::Rc => Ep::Rc(pd.create_qp(&cq, &cq, caps)),
            Kind::Dc => {
                let srq = pd.create_srq(caps.max_recv_wr);
                let dct = pd
                    .create_dct(&cq, &srq, DC_KEY, dc_options())
                    .map_err(|e| format!("DCT {i}: {e}"))?;
                Ep::Dc(dct, srq)
            }
        };
        let wr = RecvWr {
            wr_id: i as u64,
            sgl: sgl(&mr, i * SLOT, SLOT),
        };
        match &ep {
            Ep::Ud(q) => q.post_recv(wr).map_err(|e| e.to_string())?,
            Ep::Rd(q) => q.post_recv(wr).map_err(|e| e.to_string())?,
            Ep::Rc(q) => q.post_recv(wr).map_err(|e| e.to_string())?,
            Ep::Dc(_, srq) => srq.post_recv(wr).map_err(|e| e.to_string())?,
        }
        let id = first + i as u32;
        // The peer id; DC: then the DCT number to reply to.
        let reply_to = match &ep {
            Ep::Dc(dct, _) => dct.number(),
            _ => 0,
        };
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&id.to_le_bytes());
        msg[4..].copy_from_slice(&reply_to.to_le_bytes());
        mr.write_at((count + i) * SLOT, &msg)
            .map_err(|e| e.to_string())?;
        eps.push(ep);
        cqs.push(cq);
    }
    let ah = match kind {
        Kind::Ud | Kind::Rd => Some(
            pd.create_ah(DgramAddr {
                ip: LOCALHOST,
                port,
                qpn,
            })
            .map_err(|e| e.to_string())?,
        ),
        Kind::Rc | Kind::Dc => None,
    };
    say(&format!(
        "ready count={count} fd_limit={}",
        fd_limit().unwrap_or(0)
    ));
    loop {
        match cmds.recv() {
            Ok(c) if c == "go" => break,
            Ok(_) => {}
            Err(_) => return Ok(()),
        }
    }
    let start = Instant::now();
    let mut buf = [blank(); 16];
    let mut resent = 0u64;
    for (i, (ep, cq)) in eps.iter().zip(&cqs).enumerate() {
        let wr = send_wr(u64::MAX, &mr, (count + i) * SLOT);
        let post = || -> Result<(), String> {
            let no_ah = || "no address handle".to_string();
            match ep {
                Ep::Ud(q) => q
                    .post_send(wr, ah.as_ref().ok_or_else(no_ah)?)
                    .map_err(|e| e.to_string()),
                Ep::Rd(q) => q
                    .post_send(wr, ah.as_ref().ok_or_else(no_ah)?)
                    .map_err(|e| e.to_string()),
                Ep::Rc(q) => q.post_send(wr).map_err(|e| e.to_string()),
                Ep::Dc(..) => {
                    let (dci, _, dah) = dci.as_ref().ok_or_else(|| "no DCI".to_string())?;
                    dci.post_send(wr, dah, qpn, DC_KEY)
                        .map_err(|e| e.to_string())
                }
            }
        };
        if let Ep::Rc(q) = ep {
            cm::connect(q, (LOCALHOST, port), &conn_params())
                .map_err(|e| format!("RC connection {i}: {e}"))?;
        }
        post()?;
        let (wait, tries) = match ep {
            Ep::Ud(_) => (Duration::from_millis(200), 25),
            _ => (Duration::from_secs(30), 1),
        };
        let mut got = false;
        for attempt in 0..tries {
            if attempt > 0 {
                post()?;
                resent += 1;
            }
            let until = Instant::now() + wait;
            while !got && Instant::now() < until {
                if let Some((_, dcq, _)) = &dci {
                    // The request's completion (an error ends the run).
                    let k = dcq.poll(&mut buf);
                    if let Some(c) = buf[..k].iter().find(|c| c.wc.status != WcStatus::Success) {
                        return Err(format!("endpoint {i}: request {:?}", c.wc.status));
                    }
                }
                let k = cq.poll(&mut buf);
                for c in &buf[..k] {
                    if c.wc.status != WcStatus::Success {
                        return Err(format!("endpoint {i}: {:?} {:?}", c.wc.opcode, c.wc.status));
                    }
                    got |= c.wc.opcode == WcOpcode::Recv && c.wc.wr_id == i as u64;
                }
            }
            if got {
                break;
            }
        }
        if !got {
            let counters = match ep {
                Ep::Ud(q) => ud_brief(q),
                Ep::Rd(q) => rd_brief(q),
                Ep::Rc(_) | Ep::Dc(..) => String::new(),
            };
            return Err(format!(
                "endpoint {i}: no reply from the server; {counters}"
            ));
        }
    }
    say(&format!(
        "done count={count} resent={resent} secs={}",
        start.elapsed().as_secs_f64()
    ));
    while !stopped(&cmds) {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(eps);
    Ok(())
}

/// Heap in use by the server (octets; 0 where the allocator cannot say).
fn heap() -> u64 {
    softrdma_engine::heap_in_use().unwrap_or(0)
}
