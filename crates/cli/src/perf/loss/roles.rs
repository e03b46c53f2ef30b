//! The two ends of one `perf loss` point, each a child process in its own
//! network namespace (`softrdma perf loss --role send|recv key=value…`).
//!
//! How goodput is counted (what the application got, intact):
//! * **UD Send** (receiver): octets of messages that completed a receive
//!   successfully inside the measuring window; a message missing any
//!   datagram is dropped whole by UD and counts nothing.
//! * **UD Write-Record** (receiver): octets the Write-Record completions
//!   report placed (`byte_len`, complete or partial records) inside the
//!   window; each record's region is cleared after it is counted, as an
//!   application consuming the data would.
//! * **RD Write, RC Write** (sender): octets of every Write posted,
//!   divided by the time from the first post to the completion of one
//!   8-octet RDMA Read posted after the last Write. The Read's response
//!   leaves the target only after every earlier Write was placed (both are
//!   in order per peer), so all those octets reached the target's memory
//!   in that span. It includes the start (TCP slow start, RD's first
//!   window): a reliable transport's real cost. (Timing from a first Read
//!   instead would be skewed when that Read's response is itself delayed
//!   by loss on the way back.)
//! * **raw TCP** (receiver, the baseline): octets read from one stream
//!   inside the window, divided by the window's length.
//!
//! The window: the receiver of UD and raw TCP starts it `warm` seconds
//! after the parent's `go` (sent once the sender posted its first message)
//! and ends it `dur` seconds later — for raw TCP later until it counted
//! 8 messages, at most five times as long, since a window shorter than
//! TCP's retransmission timeout (200 ms, doubling) can otherwise fall
//! inside one stall and count nothing; the RD/RC sender writes for `warm +
//! dur` seconds (longer until 8 Writes were posted, at most five times as
//! long). Every message carries the same pattern; the receiver checks 16
//! octets at each end of what it counts (`bad=` in the result; the parent
//! fails the point if any differ), the RD/RC target 16 octets at each end
//! of its first slot after the run.
//!
//! Every role ends when its stdin closes (the measuring ones with an
//! error): the parent was killed or is gone, and nobody would read what
//! it measures.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use softrdma_verbs::cm::{self, ConnParams};
use softrdma_verbs::dgram::PartialAction;
use softrdma_verbs::{
    Access, Completion, CompletionQueue, Context, DgramAddr, MemoryRegion, Payload, QpCaps,
    RdPostError, RdQpOptions, RecvWr, SendFlags, SendOp, SendWr, SgList, UdPostError, UdQpOptions,
    WcOpcode, WcStatus, WorkCompletion,
};

use super::proc::{commands, orphaned, say, stopped, Kv};

/// What one point measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// UD Send into posted receives; whole messages count.
    UdSend,
    /// UD RDMA Write-Record; placed octets count.
    UdWriteRecord,
    /// RD RDMA Write (reliable, acknowledged).
    RdWrite,
    /// RC RDMA Write over TCP.
    RcWrite,
    /// The baseline: a raw TCP stream between the same two namespaces
    /// (what the link gives TCP, and so RC).
    RawTcp,
}

impl Kind {
    /// The role-argument spelling.
    pub fn key(self) -> &'static str {
        match self {
            Kind::UdSend => "ud_send",
            Kind::UdWriteRecord => "ud_write_record",
            Kind::RdWrite => "rd_write",
            Kind::RcWrite => "rc_write",
            Kind::RawTcp => "raw_tcp",
        }
    }

    /// Parses [`Kind::key`].
    pub fn from_key(s: &str) -> Option<Kind> {
        [
            Kind::UdSend,
            Kind::UdWriteRecord,
            Kind::RdWrite,
            Kind::RcWrite,
            Kind::RawTcp,
        ]
        .into_iter()
        .find(|k| k.key() == s)
    }

    /// True if the receiver measures (UD, raw TCP); false if the sender
    /// does (RD, RC).
    pub fn receiver_measures(self) -> bool {
        matches!(self, Kind::UdSend | Kind::UdWriteRecord | Kind::RawTcp)
    }

    /// True if the sender is paced (no flow control of its own).
    pub fn paced(self) -> bool {
        matches!(self, Kind::UdSend | Kind::UdWriteRecord)
    }
}

/// Why a role stopped mid-run: its stdin closed.
const PARENT_GONE: &str = "stdin closed: the parent is gone";

/// Target slots the writers cycle through.
const SLOTS: usize = 16;
/// Octets checked at each end of a counted message.
const CHECK: usize = 16;
const RW: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0);

fn pattern(i: usize) -> u8 {
    (i % 251) as u8 ^ 0x5A
}

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

fn signaled() -> SendFlags {
    SendFlags {
        signaled: true,
        ..SendFlags::default()
    }
}

fn sgl(mr: &MemoryRegion, off: usize, len: usize) -> SgList {
    let s = mr.sge(off, len as u32);
    SgList::single(s.addr, s.length, s.lkey)
}

/// Runs role `role` with its `key=value` arguments; prints `error …` and
/// returns false on failure.
pub fn run(role: &str, kv: &Kv) -> bool {
    let r = match role {
        "send" => send(kv),
        "recv" => recv(kv),
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

struct Common {
    kind: Kind,
    size: usize,
    ip: IpAddr,
    dur: f64,
    warm: f64,
}

fn common(kv: &Kv) -> Result<Common, String> {
    let kind: String = kv.get("kind")?;
    Ok(Common {
        kind: Kind::from_key(&kind).ok_or_else(|| format!("unknown kind {kind}"))?,
        size: kv.get("size")?,
        ip: kv.get("ip")?,
        dur: kv.get("dur")?,
        warm: kv.get("warm")?,
    })
}

fn open() -> Result<Context, String> {
    Context::open().map_err(|e| e.to_string())
}

fn reg(
    pd: &softrdma_verbs::ProtectionDomain,
    len: usize,
    acc: Access,
) -> Result<MemoryRegion, String> {
    pd.register(len, acc).map_err(|e| e.to_string())
}

fn fill(mr: &MemoryRegion, len: usize) -> Result<(), String> {
    let data: Vec<u8> = (0..len).map(pattern).collect();
    mr.write_at(0, &data).map_err(|e| e.to_string())
}

/// Checks [`CHECK`] octets at both ends of `[off, off + len)` of `mr`,
/// where message octet `msg_off + k` sits at `off + k`.
fn check(mr: &MemoryRegion, off: usize, len: usize, msg_off: usize) -> bool {
    let n = CHECK.min(len);
    let mut buf = [0u8; CHECK];
    for (at, moff) in [(off, msg_off), (off + len - n, msg_off + len - n)] {
        if mr.read_at(at, &mut buf[..n]).is_err() {
            return false;
        }
        if buf[..n]
            .iter()
            .enumerate()
            .any(|(k, &b)| b != pattern(moff + k))
        {
            return false;
        }
    }
    true
}

fn rd_options(ip: IpAddr, size: usize) -> RdQpOptions {
    let mut o = RdQpOptions {
        bind: SocketAddr::new(ip, 0),
        max_msg: size.max(4096),
        ..RdQpOptions::default()
    };
    // Room for several messages per peer: a 1 MiB message is ~740 datagrams.
    o.reliability.max_queue = o.reliability.max_queue.max(16 * 1024);
    o
}

fn ud_options(ip: IpAddr, size: usize) -> UdQpOptions {
    UdQpOptions {
        bind: SocketAddr::new(ip, 0),
        max_msg: size.max(UdQpOptions::default().max_msg),
        ..UdQpOptions::default()
    }
}

// ----------------------------------------------------------------------
// Receivers
// ----------------------------------------------------------------------

fn recv(kv: &Kv) -> Result<(), String> {
    let c = common(kv)?;
    let ctx = open()?;
    let pd = ctx.alloc_pd();
    let cmds = commands();
    match c.kind {
        Kind::UdSend => {
            let depth = ((64 << 20) / c.size).clamp(16, 512);
            let cq = ctx.create_cq(depth * 2, None);
            let caps = QpCaps {
                max_send_wr: 16,
                max_recv_wr: depth,
            };
            let qp = pd
                .create_ud_qp(&cq, &cq, caps, ud_options(c.ip, c.size))
                .map_err(|e| e.to_string())?;
            let mr = reg(&pd, depth * c.size, Access::LOCAL_WRITE)?;
            let post = |i: u64| {
                qp.post_recv(RecvWr {
                    wr_id: i,
                    sgl: sgl(&mr, i as usize * c.size, c.size),
                })
                .map_err(|e| e.to_string())
            };
            for i in 0..depth as u64 {
                post(i)?;
            }
            say(&format!(
                "ready port={} qpn={} stag=0 base=0",
                qp.local_addr().port(),
                qp.qpn()
            ));
            let (bytes, msgs, bad) = measure(&c, &cmds, &cq, |wc, count| {
                let mut got = (0, 0, 0);
                if wc.opcode == WcOpcode::Recv && wc.status == WcStatus::Success {
                    let n = wc.byte_len as usize;
                    if count {
                        let ok = n == c.size && check(&mr, wc.wr_id as usize * c.size, n, 0);
                        got = (n as u64, 1, u64::from(!ok));
                    }
                }
                if wc.opcode == WcOpcode::Recv {
                    post(wc.wr_id)?;
                }
                Ok(got)
            })?;
            let s = qp.stats().ud;
            say(&format!(
                "result bytes={bytes} secs={} msgs={msgs} bad={bad} reasm_timeouts={} \
                 evicted={} no_recv={}",
                c.dur, s.rx_timeouts, s.rx_evicted, s.rx_no_recv
            ));
        }
        Kind::UdWriteRecord => {
            let cq = ctx.create_cq(4096, None);
            let caps = QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
            };
            let qp = pd
                .create_ud_qp(&cq, &cq, caps, ud_options(c.ip, c.size))
                .map_err(|e| e.to_string())?;
            qp.set_record_partial_timeout(Duration::from_millis(10));
            qp.set_record_partial_action(PartialAction::Deliver);
            let mr = reg(&pd, SLOTS * c.size, RW)?;
            say(&format!(
                "ready port={} qpn={} stag={} base={}",
                qp.local_addr().port(),
                qp.qpn(),
                mr.rkey(),
                mr.addr()
            ));
            let (bytes, msgs, bad) = measure(&c, &cmds, &cq, |wc, count| {
                let Some(rec) = wc.record else {
                    return Ok((0, 0, 0));
                };
                if wc.opcode != WcOpcode::RecvWriteRecord {
                    return Ok((0, 0, 0));
                }
                let slot_off = (rec.to - mr.addr()) as usize;
                let mut got = (0, 0, 0);
                if count && matches!(wc.status, WcStatus::Success | WcStatus::RecordPartial) {
                    let mut ok = true;
                    for &(o, l) in &rec.ranges[..rec.n_ranges as usize] {
                        if l > 0 {
                            ok &= check(&mr, slot_off + o as usize, l as usize, o as usize);
                        }
                    }
                    got = (u64::from(wc.byte_len), 1, u64::from(!ok));
                }
                let _ = qp.record_clear(&mr, slot_off, (rec.len as usize).min(c.size));
                Ok(got)
            })?;
            let s = qp.stats().record;
            say(&format!(
                "result bytes={bytes} secs={} msgs={msgs} bad={bad} partial={} \
                 not_recorded={} validity_overflow={}",
                c.dur, s.partial_delivered, s.overflow, s.validity_overflow
            ));
        }
        Kind::RdWrite => {
            let cq = ctx.create_cq(256, None);
            let qp = pd
                .create_rd_qp(&cq, &cq, QpCaps::default(), rd_options(c.ip, c.size))
                .map_err(|e| e.to_string())?;
            let mr = reg(&pd, SLOTS * c.size, RW)?;
            say(&format!(
                "ready port={} qpn={} stag={} base={}",
                qp.local_addr().port(),
                qp.qpn(),
                mr.rkey(),
                mr.addr()
            ));
            wait_stop(&cmds, &cq);
            say(&format!(
                "checked ok={}",
                u8::from(check(&mr, 0, c.size, 0))
            ));
        }
        Kind::RcWrite => {
            let listener = cm::Listener::bind(&ctx, (c.ip, 0)).map_err(|e| e.to_string())?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            let mr = reg(&pd, SLOTS * c.size, RW)?;
            let cq = ctx.create_cq(256, None);
            say(&format!(
                "ready port={port} qpn=0 stag={} base={}",
                mr.rkey(),
                mr.addr()
            ));
            let req = listener.get_request().map_err(|e| e.to_string())?;
            let qp = pd.create_qp(&cq, &cq, QpCaps::default());
            req.accept(&qp, &conn_params()).map_err(|e| e.to_string())?;
            wait_stop(&cmds, &cq);
            say(&format!(
                "checked ok={}",
                u8::from(check(&mr, 0, c.size, 0))
            ));
            drop(qp);
        }
        Kind::RawTcp => {
            let listener = TcpListener::bind((c.ip, 0)).map_err(|e| e.to_string())?;
            crate::perf::tcp_cc::listen(&listener, crate::perf::tcp_cc::chosen().as_deref())
                .map_err(|e| format!("TCP congestion control: {e}"))?;
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            say(&format!("ready port={port} qpn=0 stag=0 base=0"));
            let (mut sock, _) = listener.accept().map_err(|e| e.to_string())?;
            sock.set_read_timeout(Some(Duration::from_millis(20)))
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; 1 << 20];
            let mut window: Option<(Instant, Instant)> = None;
            let (mut bytes, mut at, mut bad) = (0u64, 0usize, 0u64);
            let secs = loop {
                match cmds.try_recv() {
                    Ok(cmd) if cmd == "go" && window.is_none() => {
                        let t0 = Instant::now() + Duration::from_secs_f64(c.warm);
                        window = Some((t0, t0 + Duration::from_secs_f64(c.dur)));
                    }
                    Ok(_) | Err(std::sync::mpsc::TryRecvError::Empty) => {}
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        return Err(PARENT_GONE.into())
                    }
                }
                let n = match sock.read(&mut buf) {
                    Ok(0) => return Err("the sender closed the stream early".into()),
                    Ok(n) => n,
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        0
                    }
                    Err(e) => return Err(e.to_string()),
                };
                // The stream repeats the message pattern.
                bad += u64::from(
                    buf[..n.min(CHECK)]
                        .iter()
                        .enumerate()
                        .any(|(k, &b)| b != pattern((at + k) % c.size)),
                );
                at = (at + n) % c.size;
                let now = Instant::now();
                let Some((a, b)) = window.filter(|&(a, _)| now >= a) else {
                    continue;
                };
                bytes += n as u64;
                if stream_window_over(now - a, b - a, bytes, c.size) {
                    break (now - a).as_secs_f64();
                }
            };
            say(&format!(
                "result bytes={bytes} secs={secs} msgs={} bad={bad}",
                bytes / c.size as u64
            ));
        }
    }
    Ok(())
}

/// True once the raw TCP receiver's window may close, `elapsed` into a
/// window of nominal length `len` that counted `bytes` of `size`-octet
/// messages. A window shorter than TCP's retransmission timeout (200 ms,
/// doubling) can fall inside one stall and count nothing, so it stays open
/// until it holds [`MIN_MSGS`] messages, at most five times its length, as
/// the RD/RC writer's does.
fn stream_window_over(elapsed: Duration, len: Duration, bytes: u64, size: usize) -> bool {
    elapsed >= len && (bytes >= MIN_MSGS * size as u64 || elapsed >= 5 * len)
}

fn conn_params() -> ConnParams {
    ConnParams {
        private_data: Vec::new(),
        ird: 4,
        ord: 4,
    }
}

fn wait_stop(cmds: &std::sync::mpsc::Receiver<String>, cq: &CompletionQueue) {
    let mut buf = [blank(); 16];
    while !stopped(cmds) {
        if cq.poll(&mut buf) == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The receiver's window: waits for `go`, then counts what `on` reports
/// for completions in `[go + warm, go + warm + dur)`. `on(wc, in_window)`
/// returns (octets, messages, bad) to add when `in_window`.
fn measure(
    c: &Common,
    cmds: &std::sync::mpsc::Receiver<String>,
    cq: &CompletionQueue,
    mut on: impl FnMut(&WorkCompletion, bool) -> Result<(u64, u64, u64), String>,
) -> Result<(u64, u64, u64), String> {
    let mut buf = [blank(); 64];
    let mut window: Option<(Instant, Instant)> = None;
    let mut total = (0u64, 0u64, 0u64);
    let give_up = Instant::now() + Duration::from_secs(120);
    loop {
        let now = Instant::now();
        if window.is_none() {
            match cmds.try_recv() {
                Ok(cmd) if cmd == "go" => {
                    let t0 = now + Duration::from_secs_f64(c.warm);
                    window = Some((t0, t0 + Duration::from_secs_f64(c.dur)));
                }
                Ok(_) | Err(std::sync::mpsc::TryRecvError::Empty) => {}
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    return Err("stdin closed before go".into())
                }
            }
            if now > give_up {
                return Err("no go within 120 s".into());
            }
        } else if orphaned(cmds) {
            return Err(PARENT_GONE.into());
        }
        let k = cq.poll(&mut buf);
        let now = Instant::now();
        let in_window = window.is_some_and(|(a, b)| now >= a && now < b);
        for comp in &buf[..k] {
            let (b, m, x) = on(&comp.wc, in_window)?;
            total.0 += b;
            total.1 += m;
            total.2 += x;
        }
        if window.is_some_and(|(_, b)| now >= b) {
            return Ok(total);
        }
    }
}

// ----------------------------------------------------------------------
// Senders
// ----------------------------------------------------------------------

fn send(kv: &Kv) -> Result<(), String> {
    let c = common(kv)?;
    let to: IpAddr = kv.get("to")?;
    let port: u16 = kv.get("port")?;
    let qpn: u32 = kv.get("qpn")?;
    let stag: u32 = kv.get("stag")?;
    let base: u64 = kv.get("base")?;
    let rate: f64 = kv.get("rate")?;
    let ctx = open()?;
    let pd = ctx.alloc_pd();
    let cmds = commands();
    let mr = reg(&pd, c.size + 64, Access::LOCAL_WRITE)?;
    fill(&mr, c.size)?;
    let slot = |i: u64| base + (i as usize % SLOTS * c.size) as u64;
    match c.kind {
        Kind::UdSend | Kind::UdWriteRecord => {
            let cq = ctx.create_cq(1024, None);
            let caps = QpCaps {
                max_send_wr: 256,
                max_recv_wr: 1,
            };
            let qp = pd
                .create_ud_qp(&cq, &cq, caps, ud_options(c.ip, c.size))
                .map_err(|e| e.to_string())?;
            let ah = pd
                .create_ah(DgramAddr { ip: to, port, qpn })
                .map_err(|e| e.to_string())?;
            let mut buf = [blank(); 64];
            let start = Instant::now();
            let give_up = Duration::from_secs_f64(c.warm + c.dur + 120.0);
            let (mut i, mut errors) = (0u64, 0u64);
            while !stopped(&cmds) && start.elapsed() < give_up {
                pace(start, i as f64 * c.size as f64, rate);
                let op = if c.kind == Kind::UdSend {
                    SendOp::Send {
                        imm: None,
                        invalidate: None,
                    }
                } else {
                    SendOp::WriteRecord {
                        remote_addr: slot(i),
                        rkey: stag,
                    }
                };
                let wr = SendWr {
                    wr_id: i,
                    op,
                    payload: Payload::Sgl(sgl(&mr, 0, c.size)),
                    flags: signaled(),
                };
                loop {
                    match qp.post_send(wr, &ah) {
                        Ok(()) => break,
                        Err(UdPostError::QueueFull) => {
                            errors += reap(&cq, &mut buf);
                        }
                        Err(e) => return Err(e.to_string()),
                    }
                }
                if i == 0 {
                    say("started");
                }
                i += 1;
                errors += reap(&cq, &mut buf);
            }
            let secs = start.elapsed().as_secs_f64();
            say(&format!(
                "sent msgs={i} rate={} errors={errors}",
                i as f64 * c.size as f64 / secs
            ));
        }
        Kind::RdWrite => {
            let cq = ctx.create_cq(1024, None);
            let caps = QpCaps {
                max_send_wr: 128,
                max_recv_wr: 1,
            };
            let qp = pd
                .create_rd_qp(&cq, &cq, caps, rd_options(c.ip, c.size))
                .map_err(|e| e.to_string())?;
            let ah = pd
                .create_ah(DgramAddr { ip: to, port, qpn })
                .map_err(|e| e.to_string())?;
            let post = |wr: SendWr| loop {
                match qp.post_send(wr, &ah) {
                    Ok(()) => return Ok(()),
                    Err(RdPostError::QueueFull) => std::thread::yield_now(),
                    Err(e) => return Err(e.to_string()),
                }
            };
            let r = writer(&c, &cmds, &mr, &cq, stag, base, slot, post)?;
            say(&r);
        }
        Kind::RcWrite => {
            let cq = ctx.create_cq(1024, None);
            let caps = QpCaps {
                max_send_wr: 128,
                max_recv_wr: 4,
            };
            let qp = pd.create_qp(&cq, &cq, caps);
            cm::connect(&qp, (to, port), &conn_params()).map_err(|e| e.to_string())?;
            let post = |wr: SendWr| loop {
                match qp.post_send(wr) {
                    Ok(()) => return Ok(()),
                    Err(softrdma_verbs::PostError::QueueFull) => std::thread::yield_now(),
                    Err(e) => return Err(e.to_string()),
                }
            };
            let r = writer(&c, &cmds, &mr, &cq, stag, base, slot, post)?;
            say(&r);
            qp.disconnect();
        }
        Kind::RawTcp => {
            let mut sock = crate::perf::tcp_cc::connect(
                &SocketAddr::from((to, port)),
                Duration::from_secs(10),
                crate::perf::tcp_cc::chosen().as_deref(),
            )
            .map_err(|e| e.to_string())?;
            let data: Vec<u8> = (0..c.size).map(pattern).collect();
            let start = Instant::now();
            let give_up = Duration::from_secs_f64(c.warm + c.dur + 120.0);
            let mut i = 0u64;
            while !stopped(&cmds) && start.elapsed() < give_up {
                if sock.write_all(&data).is_err() {
                    break; // the receiver is done and closed
                }
                if i == 0 {
                    say("started");
                }
                i += 1;
            }
            say(&format!(
                "sent msgs={i} rate={} errors=0",
                i as f64 * c.size as f64 / start.elapsed().as_secs_f64()
            ));
        }
    }
    Ok(())
}

/// Reaps send completions; returns how many failed.
fn reap(cq: &CompletionQueue, buf: &mut [Completion]) -> u64 {
    let k = cq.poll(buf);
    buf[..k]
        .iter()
        .filter(|c| c.wc.status != WcStatus::Success)
        .count() as u64
}

/// Sleeps until `sent` octets are due at `rate` octets/s (0: unpaced).
fn pace(start: Instant, sent: f64, rate: f64) {
    if rate <= 0.0 {
        return;
    }
    let due = start + Duration::from_secs_f64(sent / rate);
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    }
}

/// Writes the RD/RC window should hold for a figure worth the name.
const MIN_MSGS: u64 = 8;
/// `wr_id` of the final Read.
const READ: u64 = u64::MAX;

/// The RD/RC writer: Writes back to back with a bounded number
/// outstanding for `warm + dur` seconds (longer until [`MIN_MSGS`] were
/// posted, at most five times as long), then one 8-octet Read. The Read's
/// response leaves the target only after every Write was placed, so all
/// the Writes' octets reached the target's memory between the first post
/// and the Read's completion: that span is the window.
#[allow(clippy::too_many_arguments)]
fn writer(
    c: &Common,
    cmds: &std::sync::mpsc::Receiver<String>,
    mr: &MemoryRegion,
    cq: &CompletionQueue,
    stag: u32,
    base: u64,
    slot: impl Fn(u64) -> u64,
    post: impl Fn(SendWr) -> Result<(), String>,
) -> Result<String, String> {
    let max_out: u64 = ((8 << 20) / c.size as u64).clamp(2, 32);
    let mut buf = [blank(); 64];
    let start = Instant::now();
    let span = Duration::from_secs_f64(c.warm + c.dur);
    let give_up = 5 * span + Duration::from_secs(90);
    let (mut i, mut out) = (0u64, 0u64);
    let (mut reading, mut done) = (false, None);
    while done.is_none() {
        let now = Instant::now();
        let d = now - start;
        if d > give_up {
            return Err(format!(
                "the final Read did not complete within {:.0} s (writes completed: {}, \
                 outstanding: {out})",
                give_up.as_secs_f64(),
                i - out
            ));
        }
        if orphaned(cmds) {
            return Err(PARENT_GONE.into());
        }
        let k = cq.poll(&mut buf);
        for comp in &buf[..k] {
            let wc = &comp.wc;
            if wc.status != WcStatus::Success {
                return Err(format!("work request {} failed: {:?}", wc.wr_id, wc.status));
            }
            match wc.wr_id {
                READ => done = Some(Instant::now()),
                _ => out -= 1,
            }
        }
        if !reading && d >= span && (i >= MIN_MSGS || d >= 5 * span) {
            post(SendWr {
                wr_id: READ,
                op: SendOp::Read {
                    remote_addr: base,
                    rkey: stag,
                },
                payload: Payload::Sgl(sgl(mr, c.size, 8)),
                flags: signaled(),
            })?;
            reading = true;
        }
        if !reading && out < max_out {
            post(SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_addr: slot(i),
                    rkey: stag,
                    imm: None,
                },
                payload: Payload::Sgl(sgl(mr, 0, c.size)),
                flags: signaled(),
            })?;
            i += 1;
            out += 1;
        }
    }
    let secs = done.map_or(1e-9, |t| (t - start).as_secs_f64().max(1e-9));
    Ok(format!(
        "result bytes={} secs={secs} msgs={i} bad=0",
        i * c.size as u64
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_window_that_counted_too_little_stays_open_up_to_five_times() {
        let ms = Duration::from_millis;
        let size = 16 << 10;
        let enough = MIN_MSGS * size as u64;
        // Not before its nominal end, however much it counted.
        assert!(!stream_window_over(ms(299), ms(300), 10 * enough, size));
        assert!(stream_window_over(ms(300), ms(300), enough, size));
        // A stall: nothing, or less than MIN_MSGS messages, keeps it open …
        assert!(!stream_window_over(ms(300), ms(300), 0, size));
        assert!(!stream_window_over(ms(1000), ms(300), enough - 1, size));
        // … until five times its length.
        assert!(!stream_window_over(ms(1499), ms(300), 0, size));
        assert!(stream_window_over(ms(1500), ms(300), 0, size));
    }
}
