//! The softrdma side of a cell, on the safe verbs API: one context,
//! protection domain, CQ (with a completion channel in event mode), one
//! registered buffer and one QP per end, RC (connected with the CM), UD or
//! RD (address handles from the addresses exchanged on the control
//! channel).
//!
//! Buffer layout of each end: `[0, size)` a source area, then `nslots`
//! slots of `size` octets (receives, write targets, read sources, the
//! atomic counter), then a control area of 64-octet entries (credits,
//! closing handshake).
//!
//! How each test measures (A = client, B = server):
//! * `*_lat`: ping-pong, one way = round trip / 2; Send → Send back;
//!   Write → Write back, each side watching the last octet of its slot 0
//!   for the round's tag (ib_write_lat style, polling the CQ in between
//!   for inline progress); Write-Record → Write-Record back, each side
//!   waiting for its record completion; Read and fetch-and-add: A's
//!   request until its completion. Over UD a round without an answer
//!   within [`LOSS_TIMEOUT`] counts as lost and the next round goes.
//! * `*_bw`: A keeps `window` messages outstanding, message k from its slot
//!   k mod nmem to B's slot k mod nmem (nmem: as many slots as fit 1 MiB,
//!   at least one, as perftest reuses one buffer; with `--verify` one slot
//!   per message the queues hold). Sends over RC and RD are flow
//!   controlled with credits (B returns its count of receives consumed
//!   every nslots/4 messages), as a Send finding no receive kills an RC
//!   connection. Reliable transports are timed at A from the first post to
//!   B's confirmation that everything arrived (for one-sided writes, a
//!   closing Send behind them, in order). UD is counted at B (messages or
//!   record octets that arrived, from its first to its last arrival);
//!   UD Write has no event at the target, so it is the sender's rate.
//! * `--verify`: every message is filled with the pattern of its seq and
//!   checked where it lands (Send receives, ping-pong targets, Read
//!   results, fetch-and-add values); one-sided bandwidth tests (whose
//!   target sees no per-message event) check the final contents of every
//!   target slot after the run.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma_verbs::cm::{self, ConnParams};
use softrdma_verbs::{
    Access, AddressHandle, Completion, CompletionChannel, CompletionQueue, Context, DgramAddr,
    MemoryRegion, Payload, ProtectionDomain, QpCaps, QueuePair, RdQpOptions, RdQueuePair, RecvWr,
    SendFlags, SendOp, SendWr, SgList, UdQpOptions, UdQueuePair, WcOpcode, WcStatus,
    WorkCompletion,
};

use super::baseline::LOSS_TIMEOUT;
use super::cell::{
    check, fill, seq_of, transport_by_name, Kind, Measured, Op, Spec, WaitMode, Watch, HANG,
};
use super::ctrl::{Ctrl, Msg};
use super::hist::Histogram;

const CTL_ENTRY: usize = 64;
const CTL_ENTRIES: usize = 16;
/// Credit receives A keeps posted (control entries 0..8).
const CREDIT_RECVS: usize = 8;
/// Control entry of B's closing-handshake receive, and of B's credit
/// source.
const CTL_CLOSE: usize = 8;
const CTL_CREDIT_SRC: usize = 9;
/// wr_id tags.
const ID_CTL: u64 = 1 << 40;
/// Every this many ping-pong posts is signaled.
const SIGNAL_EVERY: u64 = 16;
/// Slots of the latency tests (Send receive ring).
const LAT_SLOTS: usize = 16;
/// Memory budget of the bandwidth slots per end (`--verify`: one slot per
/// outstanding message).
const BW_BUDGET: usize = 32 << 20;
/// Memory the bandwidth slots of a run without `--verify` cycle through
/// (at least one slot): like perftest, which posts every message of more
/// than half a page from the same buffer, and like the raw-socket stream
/// (one send buffer, one 256 KiB receive buffer), so neither side of a
/// ratio measures cache misses the other does not have.
const BW_RING: usize = 1 << 20;

fn err(msg: String) -> io::Error {
    io::Error::other(msg)
}

fn tag(seq: u64) -> u8 {
    (seq % 255) as u8 + 1
}

enum Qp {
    Rc(QueuePair),
    Ud(UdQueuePair),
    Rd(RdQueuePair),
    Dc(Box<super::dc::DcQp>),
}

/// One end of a softrdma cell.
struct End {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    ch: Option<CompletionChannel>,
    qp: Qp,
    ah: Option<AddressHandle>,
    mr: MemoryRegion,
    /// Delivery is reliable (the transport table's word).
    reliable: bool,
    size: usize,
    stride: usize,
    slot_base: usize,
    ctl_base: usize,
    /// Slots the queues and credits count (receives posted, window).
    nslots: usize,
    /// Slots in memory: message k uses slot k mod nmem (= `nslots` with
    /// `--verify`, else as many as fit [`BW_RING`]).
    nmem: usize,
    raddr: u64,
    rkey: u32,
    out: [Completion; 32],
    scratch: Vec<u8>,
}

const NO_COMPLETION: Completion = Completion {
    wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
    qp_num: 0,
};

impl End {
    fn new(spec: &Spec, ip: IpAddr) -> io::Result<End> {
        let tr = transport_by_name(&spec.transport)
            .ok_or_else(|| err(format!("unknown transport {:?}", spec.transport)))?;
        if let Some(why) = (tr.refuses)(spec.test.op) {
            return Err(err(format!("{} over {}: {why}", spec.test.name, tr.name)));
        }
        let ctx = Context::open().map_err(|e| err(e.to_string()))?;
        let pd = ctx.alloc_pd();
        let ch = match spec.wait {
            WaitMode::Event => Some(ctx.create_comp_channel()?),
            WaitMode::Poll => None,
        };
        let cq = ctx.create_cq(4096, ch.as_ref());
        let size = spec.size;
        let stride = size.div_ceil(64) * 64;
        let nslots = match spec.test.kind {
            Kind::Lat => LAT_SLOTS,
            Kind::Bw => (BW_BUDGET / stride).clamp(2, 128),
        };
        let nmem = match spec.test.kind {
            Kind::Bw if !spec.verify => (BW_RING / stride).clamp(1, nslots),
            _ => nslots,
        };
        let slot_base = size.div_ceil(4096) * 4096;
        let ctl_base = slot_base + nmem * stride;
        let len = ctl_base + CTL_ENTRY * CTL_ENTRIES;
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mr = pd
            .register(len, access)
            .map_err(|e| err(format!("{e} ({len} octets)")))?;
        let caps = QpCaps {
            max_send_wr: 512,
            max_recv_wr: 256,
        };
        let bind = SocketAddr::new(ip, 0);
        let qp = match tr.name {
            "rc" => Qp::Rc(pd.create_qp(&cq, &cq, caps)),
            "ud" => Qp::Ud(
                pd.create_ud_qp(
                    &cq,
                    &cq,
                    caps,
                    UdQpOptions {
                        bind,
                        max_msg: size.max(64 << 10),
                        ..UdQpOptions::default()
                    },
                )
                .map_err(|e| err(format!("UD QP: {e}")))?,
            ),
            "rd" => Qp::Rd(
                pd.create_rd_qp(
                    &cq,
                    &cq,
                    caps,
                    RdQpOptions {
                        bind,
                        max_msg: size.max(64 << 10),
                        ..RdQpOptions::default()
                    },
                )
                .map_err(|e| err(format!("RD QP: {e}")))?,
            ),
            "dc" => Qp::Dc(Box::new(super::dc::DcQp::new(&pd, &cq, caps, ip)?)),
            other => return Err(err(format!("transport {other} has no QP set-up"))),
        };
        Ok(End {
            ctx,
            pd,
            cq,
            ch,
            qp,
            ah: None,
            mr,
            reliable: tr.reliable,
            size,
            stride,
            slot_base,
            ctl_base,
            nslots,
            nmem,
            raddr: 0,
            rkey: 0,
            out: [NO_COMPLETION; 32],
            scratch: vec![0u8; size],
        })
    }

    fn slot(&self, k: usize) -> usize {
        self.slot_base + (k % self.nmem) * self.stride
    }

    fn ctl(&self, i: usize) -> usize {
        self.ctl_base + i * CTL_ENTRY
    }

    fn remote_slot(&self, k: usize) -> u64 {
        self.raddr + self.slot(k) as u64
    }

    /// What the peer needs: our address (datagram QPs), buffer, rkey.
    fn advert(&self, m: Msg) -> Msg {
        let m = m.with("addr", self.mr.addr()).with("rkey", self.mr.rkey());
        let a = match &self.qp {
            Qp::Rc(_) => return m,
            Qp::Dc(q) => return q.advert(m),
            Qp::Ud(q) => q.address(),
            Qp::Rd(q) => q.address(),
        };
        m.with("ip", a.ip).with("port", a.port).with("qpn", a.qpn)
    }

    fn learn(&mut self, m: &Msg) -> io::Result<()> {
        self.raddr = m.num("addr")?;
        self.rkey = m.num("rkey")?;
        if let Qp::Dc(q) = &mut self.qp {
            return q.learn(&self.pd, m);
        }
        if !matches!(self.qp, Qp::Rc(_)) {
            let dest = DgramAddr {
                ip: m.num("ip")?,
                port: m.num("port")?,
                qpn: m.num("qpn")?,
            };
            self.ah = Some(
                self.pd
                    .create_ah(dest)
                    .map_err(|e| err(format!("address handle: {e}")))?,
            );
        }
        Ok(())
    }

    fn post_recv_at(&self, wr_id: u64, off: usize, len: usize) -> io::Result<()> {
        let s = self.mr.sge(off, len as u32);
        let wr = RecvWr {
            wr_id,
            sgl: SgList::single(s.addr, s.length, s.lkey),
        };
        let r = match &self.qp {
            Qp::Rc(q) => q.post_recv(wr).map_err(|e| e.to_string()),
            Qp::Ud(q) => q.post_recv(wr).map_err(|e| e.to_string()),
            Qp::Rd(q) => q.post_recv(wr).map_err(|e| e.to_string()),
            Qp::Dc(q) => q.post_recv(wr),
        };
        r.map_err(|e| err(format!("post_recv: {e}")))
    }

    fn post_recv_slot(&self, k: usize) -> io::Result<()> {
        self.post_recv_at(k as u64, self.slot(k), self.size)
    }

    fn post(
        &self,
        wr_id: u64,
        op: SendOp,
        off: usize,
        len: usize,
        signaled: bool,
    ) -> io::Result<()> {
        let s = self.mr.sge(off, len as u32);
        let wr = SendWr {
            wr_id,
            op,
            payload: Payload::Sgl(SgList::single(s.addr, s.length, s.lkey)),
            flags: SendFlags {
                signaled,
                ..SendFlags::default()
            },
        };
        let no_ah = || err("no address handle".into());
        let r = match &self.qp {
            Qp::Rc(q) => q.post_send(wr).map_err(|e| e.to_string()),
            Qp::Ud(q) => q
                .post_send(wr, self.ah.as_ref().ok_or_else(no_ah)?)
                .map_err(|e| e.to_string()),
            Qp::Rd(q) => q
                .post_send(wr, self.ah.as_ref().ok_or_else(no_ah)?)
                .map_err(|e| e.to_string()),
            Qp::Dc(q) => q.post_send(wr),
        };
        r.map_err(|e| err(format!("post_send: {e}")))
    }

    fn send_op() -> SendOp {
        SendOp::Send {
            imm: None,
            invalidate: None,
        }
    }

    /// Polls once (poll mode) or waits up to 10 ms for an event (event
    /// mode); returns how many completions are in `self.out`. Any error
    /// completion is an error.
    fn next(&mut self) -> io::Result<usize> {
        let mut n = self.cq.poll(&mut self.out);
        if n == 0 {
            if let Some(ch) = &self.ch {
                self.cq.req_notify(false);
                n = self.cq.poll(&mut self.out);
                if n == 0 {
                    ch.get_event(Some(Duration::from_millis(10)));
                    n = self.cq.poll(&mut self.out);
                }
            }
        }
        for c in &self.out[..n] {
            let ok = c.wc.status == WcStatus::Success
                || (c.wc.status == WcStatus::RecordPartial
                    && c.wc.opcode == WcOpcode::RecvWriteRecord);
            if !ok {
                return Err(err(format!(
                    "completion error: {:?} on {:?} (wr_id {:#x})",
                    c.wc.status, c.wc.opcode, c.wc.wr_id
                )));
            }
        }
        Ok(n)
    }

    fn fill_at(&mut self, off: usize, len: usize, seq: u64, side: u8) {
        fill(&mut self.scratch[..len], seq, side);
        self.mr
            .write_at(off, &self.scratch[..len])
            .expect("in the region");
    }

    fn check_at(
        &mut self,
        off: usize,
        len: usize,
        seq: u64,
        side: u8,
        skip_last: bool,
    ) -> io::Result<()> {
        self.mr
            .read_at(off, &mut self.scratch[..len])
            .expect("in the region");
        check(&mut self.scratch[..len], seq, side, skip_last)
    }

    fn seq_at(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        let n = self.size.min(8);
        self.mr.read_at(off, &mut b[..n]).expect("in the region");
        seq_of(&b[..n.max(if self.size >= 8 { 8 } else { 0 })])
    }

    fn byte(&self, off: usize) -> u8 {
        self.mr.read_volatile(off).expect("in the region")
    }

    fn disconnect(&self) {
        if let Qp::Rc(q) = &self.qp {
            q.disconnect();
        }
    }
}

// ---------------------------------------------------------------------------
// Set-up
// ---------------------------------------------------------------------------

/// The server end of a softrdma cell.
pub(crate) fn serve(spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let ip = ctrl.local_addr()?.ip();
    let mut e = End::new(spec, ip)?;
    // Receives and initial contents before the peer can send anything.
    match (spec.test.op, spec.test.kind) {
        (Op::Send, _) => {
            for k in 0..e.nslots.min(256) {
                e.post_recv_slot(k)?;
            }
        }
        (Op::Write | Op::WriteRecord, Kind::Bw) => {
            e.post_recv_at(ID_CTL | CTL_CLOSE as u64, e.ctl(CTL_CLOSE), CTL_ENTRY)?
        }
        (Op::Read, _) => {
            for k in 0..e.nslots {
                let off = e.slot(k);
                e.fill_at(off, spec.size, k as u64, b'B');
            }
        }
        _ => {}
    }
    let ready = e
        .advert(Msg::new("READY"))
        .with("crc", super::env_crc() as u8);
    if let Qp::Rc(qp) = &e.qp {
        let l = cm::Listener::bind(&e.ctx, SocketAddr::new(ip, 0))?;
        ctrl.send(&ready.with("rport", l.local_addr()?.port()))?;
        let req = l.get_request().map_err(|x| err(format!("CM: {x}")))?;
        req.accept(qp, &ConnParams::default())
            .map_err(|x| err(format!("CM accept: {x}")))?;
    } else {
        ctrl.send(&ready)?;
    }
    let client = ctrl.expect("CLIENT")?;
    e.learn(&client)?;
    ctrl.send(&Msg::new("GO"))?;
    let r = match (spec.test.op, spec.test.kind) {
        (Op::Send, Kind::Lat) => send_lat_b(&mut e, spec, ctrl),
        (Op::Write, Kind::Lat) => write_lat_b(&mut e, spec, ctrl),
        (Op::WriteRecord, Kind::Lat) => record_lat_b(&mut e, spec, ctrl),
        (Op::Send, Kind::Bw) => send_bw_b(&mut e, spec, ctrl),
        (Op::Write | Op::WriteRecord, Kind::Bw) => write_bw_b(&mut e, spec, ctrl),
        (Op::Read, _) | (Op::Atomic, _) => passive_b(&mut e, spec, ctrl),
        _ => Err(err("no such cell".into())),
    };
    e.disconnect();
    r
}

/// The client (measuring) end of a softrdma cell.
pub(crate) fn run(spec: &Spec, ctrl: &mut Ctrl) -> io::Result<Measured> {
    let ready = ctrl.expect("READY")?;
    let ip = ctrl.local_addr()?.ip();
    let mut e = End::new(spec, ip)?;
    match (spec.test.op, spec.test.kind) {
        (Op::Send, Kind::Lat) => {
            for k in 0..e.nslots {
                e.post_recv_slot(k)?;
            }
        }
        (Op::Send, Kind::Bw) if spec.transport != "ud" => {
            for i in 0..CREDIT_RECVS {
                e.post_recv_at(ID_CTL | i as u64, e.ctl(i), CTL_ENTRY)?;
            }
        }
        _ => {}
    }
    e.learn(&ready)?;
    if let Qp::Rc(qp) = &e.qp {
        let port: u16 = ready.num("rport")?;
        let peer = ctrl.peer_addr()?.ip();
        cm::connect(qp, SocketAddr::new(peer, port), &ConnParams::default())
            .map_err(|x| err(format!("CM connect: {x}")))?;
    }
    let first = match &e.qp {
        Qp::Dc(q) => {
            let off = e.ctl(CTL_ENTRIES - 1);
            let raddr = e.raddr + off as u64;
            Some(super::dc::first_message(
                q, &e.cq, &e.mr, off, raddr, e.rkey,
            )?)
        }
        _ => None,
    };
    ctrl.send(&e.advert(Msg::new("CLIENT")))?;
    ctrl.expect("GO")?;
    let r = match (spec.test.op, spec.test.kind) {
        (Op::Send | Op::Write | Op::WriteRecord, Kind::Lat) => ping_a(&mut e, spec, ctrl),
        (Op::Read | Op::Atomic, Kind::Lat) => request_lat_a(&mut e, spec, ctrl),
        (Op::Send, Kind::Bw) => send_bw_a(&mut e, spec, ctrl),
        (Op::Write | Op::WriteRecord, Kind::Bw) => write_bw_a(&mut e, spec, ctrl),
        (Op::Read, Kind::Bw) => read_bw_a(&mut e, spec, ctrl),
        _ => Err(err("no such cell".into())),
    };
    e.disconnect();
    let crc = match e.qp {
        // CRC is used when either side asks for it (MPA).
        Qp::Rc(_) => Some(super::env_crc() || ready.num::<u8>("crc").unwrap_or(1) != 0),
        _ => None,
    };
    r.map(|m| match first {
        Some(t) => Measured {
            crc,
            first_msg_us: Some(super::dc::micros(t)),
            note: super::dc::note(&m.note),
            ..m
        },
        None => Measured { crc, ..m },
    })
}

// ---------------------------------------------------------------------------
// Latency
// ---------------------------------------------------------------------------

/// A's side of the Send, Write and Write-Record ping-pongs.
fn ping_a(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<Measured> {
    if spec.test.op == Op::Write && spec.wait == WaitMode::Event {
        return Err(err(
            "write_lat watches memory (a Write raises no event at its target): use --wait poll"
                .into(),
        ));
    }
    let ud = !e.reliable;
    let size = spec.size;
    let mut w = Watch::new(HANG);
    let mut quiet = 0u32;
    let mut h = Histogram::new();
    let (mut lost, mut seq, mut warm) = (0u64, 0u64, 0u64);
    let mut t0 = Instant::now();
    while warm < spec.warmup || spec.more(h.count(), t0) {
        seq += 1;
        let signaled = seq % SIGNAL_EVERY == 0;
        if spec.verify {
            e.fill_at(0, size, seq, b'A');
        } else if size >= 8 {
            // The seq tells a fresh answer from a late one (UD).
            e.mr.write_at(0, &seq.to_le_bytes()).expect("in the region");
        }
        if spec.test.op == Op::Write {
            e.mr.write_at(size - 1, &[tag(seq)]).expect("in the region");
        }
        let a = Instant::now();
        let op = match spec.test.op {
            Op::Send => End::send_op(),
            Op::Write => SendOp::Write {
                remote_addr: e.remote_slot(0),
                rkey: e.rkey,
                imm: None,
            },
            _ => SendOp::WriteRecord {
                remote_addr: e.remote_slot(0),
                rkey: e.rkey,
            },
        };
        e.post(seq, op, 0, size, signaled)?;
        // Wait for the answer.
        let mut spins = 0u32;
        let answered = loop {
            let n = e.next()?;
            let mut got = false;
            for i in 0..n {
                let c = e.out[i].wc;
                match c.opcode {
                    WcOpcode::Recv => {
                        let k = c.wr_id as usize;
                        let off = e.slot(k);
                        let fresh = size < 8 || e.seq_at(off) == seq;
                        if fresh && c.byte_len as usize != size {
                            return Err(err(format!(
                                "received {} octets, sent {size}",
                                c.byte_len
                            )));
                        }
                        if fresh && spec.verify {
                            e.check_at(off, size, seq, b'B', false)?;
                        }
                        e.post_recv_slot(k)?;
                        got |= fresh;
                    }
                    WcOpcode::RecvWriteRecord => {
                        let fresh = size < 8 || e.seq_at(e.slot(0)) == seq;
                        if fresh && spec.verify {
                            let off = e.slot(0);
                            e.check_at(off, size, seq, b'B', false)?;
                        }
                        got |= fresh;
                    }
                    _ => {}
                }
            }
            if spec.test.op == Op::Write && e.byte(e.slot(0) + size - 1) == tag(seq) {
                if spec.verify {
                    let off = e.slot(0);
                    e.check_at(off, size, seq, b'B', true)?;
                }
                got = true;
            }
            if got {
                w.progress();
                break true;
            }
            // The clock only every 256th spin, as the raw UDP ping-pong.
            spins = spins.wrapping_add(1);
            if ud && spins & 255 == 0 && a.elapsed() > LOSS_TIMEOUT {
                break false;
            }
            w.check("the answer of the ping-pong")?;
            peer_alive(ctrl, &mut quiet)?;
        };
        if !answered {
            lost += 1;
            if lost > 10 + h.count() / 10 {
                return Err(err(format!(
                    "UD ping-pong: {lost} messages lost (more than 10 %)"
                )));
            }
            continue;
        }
        if warm < spec.warmup {
            warm += 1;
            // The measured part (and its duration) starts after warm-up.
            t0 = Instant::now();
        } else {
            h.record(a.elapsed().as_nanos() as u64 / 2);
        }
    }
    finish(e, ctrl, seq)?;
    Ok(Measured {
        hist: Some(h),
        lost,
        ..Default::default()
    })
}

/// Every 4096 idle polls of a run: anything the peer says on the control
/// channel before our `END` is its failure (`ERR`, or the channel closed):
/// end the run with the peer's reason instead of waiting for a hang.
fn peer_alive(ctrl: &mut Ctrl, quiet: &mut u32) -> io::Result<()> {
    *quiet = quiet.wrapping_add(1);
    if *quiet & 4095 == 0 && ctrl.ready() {
        let m = ctrl.recv()?;
        return Err(err(format!(
            "unexpected control message {} during the run",
            m.kind
        )));
    }
    Ok(())
}

/// Ends a run: `END n=…`, drains what is outstanding, `DONE`.
fn finish(e: &mut End, ctrl: &mut Ctrl, n: u64) -> io::Result<Msg> {
    ctrl.send(&Msg::new("END").with("n", n))?;
    let done = ctrl.expect("DONE")?;
    let _ = e.cq.poll(&mut e.out);
    Ok(done)
}

/// Checks the control channel every 1024 idle polls (every wait in event
/// mode); true when A said END.
fn ended(ctrl: &mut Ctrl, idle: &mut u32, wait: WaitMode) -> bool {
    *idle = idle.wrapping_add(1);
    (wait == WaitMode::Event || *idle & 1023 == 0) && ctrl.ready()
}

fn send_lat_b(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let size = spec.size;
    let (mut count, mut idle) = (0u64, 0u32);
    loop {
        let n = e.next()?;
        for i in 0..n {
            let c = e.out[i].wc;
            if c.opcode != WcOpcode::Recv {
                continue;
            }
            count += 1;
            let k = c.wr_id as usize;
            let off = e.slot(k);
            let seq = if size >= 8 { e.seq_at(off) } else { count };
            if spec.verify {
                e.check_at(off, size, seq, b'A', false)?;
                e.fill_at(0, size, seq, b'B');
            } else if size >= 8 {
                e.mr.write_at(0, &seq.to_le_bytes()).expect("in the region");
            }
            e.post_recv_slot(k)?;
            e.post(seq, End::send_op(), 0, size, count % SIGNAL_EVERY == 0)?;
        }
        if n == 0 && ended(ctrl, &mut idle, spec.wait) {
            break;
        }
    }
    ctrl.expect("END")?;
    ctrl.send(&Msg::new("DONE").with("n", count))
}

fn write_lat_b(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let size = spec.size;
    let at = e.slot(0) + size - 1;
    let (mut seen, mut count, mut idle) = (0u8, 0u64, 0u32);
    loop {
        let b = e.byte(at);
        if b != seen {
            seen = b;
            count += 1;
            let seq = if size >= 8 {
                e.seq_at(e.slot(0))
            } else {
                count
            };
            if spec.verify {
                let off = e.slot(0);
                e.check_at(off, size, seq, b'A', true)?;
            }
            if spec.verify {
                e.fill_at(0, size, seq, b'B');
            } else if size >= 8 {
                e.mr.write_at(0, &seq.to_le_bytes()).expect("in the region");
            }
            e.mr.write_at(size - 1, &[b]).expect("in the region");
            let op = SendOp::Write {
                remote_addr: e.remote_slot(0),
                rkey: e.rkey,
                imm: None,
            };
            e.post(count, op, 0, size, count % SIGNAL_EVERY == 0)?;
            continue;
        }
        let _ = e.next()?;
        if ended(ctrl, &mut idle, WaitMode::Poll) {
            break;
        }
    }
    ctrl.expect("END")?;
    ctrl.send(&Msg::new("DONE").with("n", count))
}

fn record_lat_b(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let size = spec.size;
    let (mut count, mut idle) = (0u64, 0u32);
    loop {
        let n = e.next()?;
        for i in 0..n {
            let c = e.out[i].wc;
            if c.opcode != WcOpcode::RecvWriteRecord || c.status != WcStatus::Success {
                continue;
            }
            count += 1;
            let off = e.slot(0);
            let seq = if size >= 8 { e.seq_at(off) } else { count };
            if spec.verify {
                e.check_at(off, size, seq, b'A', false)?;
                e.fill_at(0, size, seq, b'B');
            } else if size >= 8 {
                e.mr.write_at(0, &seq.to_le_bytes()).expect("in the region");
            }
            let op = SendOp::WriteRecord {
                remote_addr: e.remote_slot(0),
                rkey: e.rkey,
            };
            e.post(seq, op, 0, size, count % SIGNAL_EVERY == 0)?;
        }
        if n == 0 && ended(ctrl, &mut idle, spec.wait) {
            break;
        }
    }
    ctrl.expect("END")?;
    ctrl.send(&Msg::new("DONE").with("n", count))
}

/// A's Read or fetch-and-add round trips.
fn request_lat_a(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<Measured> {
    let size = spec.size;
    let mut w = Watch::new(HANG);
    let mut quiet = 0u32;
    let mut h = Histogram::new();
    let (mut seq, mut warm) = (0u64, 0u64);
    let zeros = vec![0u8; size];
    let mut t0 = Instant::now();
    while warm < spec.warmup || spec.more(h.count(), t0) {
        let (op, local) = if spec.test.op == Op::Read {
            if spec.verify {
                e.mr.write_at(e.slot(0), &zeros).expect("in the region");
            }
            let op = SendOp::Read {
                remote_addr: e.remote_slot(0),
                rkey: e.rkey,
            };
            (op, e.slot(0))
        } else {
            let op = SendOp::FetchAdd {
                remote_addr: e.remote_slot(0),
                rkey: e.rkey,
                add: 1,
            };
            (op, 0)
        };
        let a = Instant::now();
        e.post(seq, op, local, size, true)?;
        loop {
            let n = e.next()?;
            if e.out[..n]
                .iter()
                .any(|c| matches!(c.wc.opcode, WcOpcode::RdmaRead | WcOpcode::FetchAdd))
            {
                break;
            }
            w.check("a Read/atomic completion")?;
            peer_alive(ctrl, &mut quiet)?;
        }
        let dt = a.elapsed();
        w.progress();
        if spec.verify {
            if spec.test.op == Op::Read {
                e.check_at(e.slot(0), size, 0, b'B', false)?;
            } else {
                let mut v = [0u8; 8];
                e.mr.read_at(0, &mut v).expect("in the region");
                let got = u64::from_le_bytes(v);
                if got != seq {
                    return Err(err(format!(
                        "verify: fetch-and-add {seq} returned {got}, expected {seq}"
                    )));
                }
            }
        }
        seq += 1;
        if warm < spec.warmup {
            warm += 1;
            // The measured part (and its duration) starts after warm-up.
            t0 = Instant::now();
        } else {
            h.record(dt.as_nanos() as u64 / 2);
        }
    }
    let done = finish(e, ctrl, seq)?;
    if spec.test.op == Op::Atomic {
        let v: u64 = done.num("counter")?;
        if v != seq {
            return Err(err(format!(
                "the target counter is {v} after {seq} fetch-and-adds"
            )));
        }
    }
    Ok(Measured {
        hist: Some(h),
        ..Default::default()
    })
}

/// B while A reads or does atomics: drives progress until END.
fn passive_b(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let mut idle = 0u32;
    loop {
        let n = e.next()?;
        if n == 0 && ended(ctrl, &mut idle, spec.wait) {
            break;
        }
    }
    ctrl.expect("END")?;
    let mut v = [0u8; 8];
    e.mr.read_at(e.slot(0), &mut v).expect("in the region");
    ctrl.send(&Msg::new("DONE").with("counter", u64::from_le_bytes(v)))
}

// ---------------------------------------------------------------------------
// Bandwidth
// ---------------------------------------------------------------------------

fn window(e: &End, spec: &Spec) -> usize {
    spec.window.clamp(1, (e.nslots / 2).max(1))
}

fn send_bw_a(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<Measured> {
    let ud = !e.reliable;
    let size = spec.size;
    let win = window(e, spec);
    let mut w = Watch::new(HANG);
    let mut quiet = 0u32;
    let (mut sent, mut done, mut consumed) = (0u64, 0u64, 0u64);
    let credits = e.nslots as u64;
    let t0 = Instant::now();
    let mut stop = false;
    loop {
        while !stop && (sent - done) < win as u64 && (ud || sent - consumed < credits) {
            if !spec.more(sent, t0) {
                stop = true;
                break;
            }
            let off = e.slot(sent as usize);
            if spec.verify {
                e.fill_at(off, size, sent, b'A');
            }
            e.post(sent, End::send_op(), off, size, true)?;
            sent += 1;
        }
        if !stop && !spec.more(sent, t0) {
            stop = true;
        }
        let n = e.next()?;
        for i in 0..n {
            let c = e.out[i].wc;
            match c.opcode {
                WcOpcode::Send => done += 1,
                WcOpcode::Recv => {
                    let j = (c.wr_id & 0xff) as usize;
                    let mut v = [0u8; 8];
                    e.mr.read_at(e.ctl(j), &mut v).expect("in the region");
                    consumed = consumed.max(u64::from_le_bytes(v));
                    e.post_recv_at(c.wr_id, e.ctl(j), CTL_ENTRY)?;
                }
                _ => {}
            }
        }
        if n > 0 {
            w.progress();
        } else {
            w.check("Send completions or credits")?;
            peer_alive(ctrl, &mut quiet)?;
        }
        if stop && done == sent {
            break;
        }
    }
    let send_secs = t0.elapsed().as_secs_f64();
    let d = finish(e, ctrl, sent)?;
    let secs = t0.elapsed().as_secs_f64();
    let got: u64 = d.num("n")?;
    if ud {
        let counted: u64 = d.num("counted")?;
        let rsecs: f64 = d.num("secs")?;
        if counted == 0 || rsecs <= 0.0 {
            return Err(err(format!(
                "UD Send: {got} of {sent} messages arrived, too few to time"
            )));
        }
        return Ok(Measured {
            octets: counted * size as u64,
            msgs: counted,
            // The longer of the sender's run and the receiver's first to
            // last arrival: a receiver draining a full buffer late must not
            // look faster than the sender was.
            secs: rsecs.max(send_secs),
            lost: sent - got.min(sent),
            note: "counted at the receiver".into(),
            ..Default::default()
        });
    }
    if got != sent {
        return Err(err(format!("the receiver got {got} of {sent} messages")));
    }
    Ok(Measured {
        octets: sent * size as u64,
        msgs: sent,
        secs,
        note: "timed to the receiver's confirmation".into(),
        ..Default::default()
    })
}

fn send_bw_b(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let ud = !e.reliable;
    let size = spec.size;
    let every = (e.nslots as u64 / 4).max(1);
    let (mut count, mut idle, mut last_credit) = (0u64, 0u32, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut target: Option<u64> = None;
    loop {
        let n = e.next()?;
        for i in 0..n {
            let c = e.out[i].wc;
            if c.opcode != WcOpcode::Recv {
                continue;
            }
            let now = Instant::now();
            if first.is_none() {
                first = Some(now);
            }
            last = now;
            count += 1;
            let k = c.wr_id as usize;
            if c.byte_len as usize != size {
                return Err(err(format!("received {} octets, sent {size}", c.byte_len)));
            }
            if spec.verify {
                let off = e.slot(k);
                let seq = if size >= 8 { e.seq_at(off) } else { count - 1 };
                e.check_at(off, size, seq, b'A', false)?;
            }
            e.post_recv_slot(k)?;
            if !ud && count - last_credit >= every {
                last_credit = count;
                let src = e.ctl(CTL_CREDIT_SRC);
                e.mr.write_at(src, &count.to_le_bytes())
                    .expect("in the region");
                e.post(ID_CTL, End::send_op(), src, 8, true)?;
            }
        }
        if n > 0 {
            idle = 0;
        }
        if target.is_none() && n == 0 && ended(ctrl, &mut idle, spec.wait) {
            let m = ctrl.expect("END")?;
            target = Some(m.num("n")?);
            if ud {
                // Take in what is still queued, then stop.
                let end = Instant::now() + Duration::from_millis(20);
                while Instant::now() < end {
                    let n = e.next()?;
                    for i in 0..n {
                        let c = e.out[i].wc;
                        if c.opcode == WcOpcode::Recv {
                            count += 1;
                            last = Instant::now();
                            e.post_recv_slot(c.wr_id as usize)?;
                        }
                    }
                }
                break;
            }
        }
        if let Some(t) = target {
            if count >= t {
                break;
            }
            if n == 0 && last.elapsed() > HANG {
                return Err(err(format!("only {count} of {t} messages arrived")));
            }
        }
    }
    let (secs, counted) = match first {
        Some(t0) => (
            last.duration_since(t0).as_secs_f64(),
            count.saturating_sub(1),
        ),
        None => (0.0, 0),
    };
    ctrl.send(
        &Msg::new("DONE")
            .with("n", count)
            .with("counted", counted)
            .with("secs", secs),
    )
}

fn write_bw_a(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<Measured> {
    let ud = !e.reliable;
    let record = spec.test.op == Op::WriteRecord;
    let size = spec.size;
    let win = window(e, spec);
    let mut w = Watch::new(HANG);
    let mut quiet = 0u32;
    let (mut sent, mut done) = (0u64, 0u64);
    let t0 = Instant::now();
    loop {
        while (sent - done) < win as u64 && spec.more(sent, t0) {
            let off = e.slot(sent as usize);
            if spec.verify {
                e.fill_at(off, size, sent, b'A');
            }
            let remote_addr = e.remote_slot(sent as usize);
            let op = if record {
                SendOp::WriteRecord {
                    remote_addr,
                    rkey: e.rkey,
                }
            } else {
                SendOp::Write {
                    remote_addr,
                    rkey: e.rkey,
                    imm: None,
                }
            };
            e.post(sent, op, off, size, true)?;
            sent += 1;
        }
        let n = e.next()?;
        done += e.out[..n]
            .iter()
            .filter(|c| matches!(c.wc.opcode, WcOpcode::RdmaWrite | WcOpcode::WriteRecord))
            .count() as u64;
        if n > 0 {
            w.progress();
        } else {
            w.check("Write completions")?;
            peer_alive(ctrl, &mut quiet)?;
        }
        if done == sent && !spec.more(sent, t0) {
            break;
        }
    }
    let sender_secs = t0.elapsed().as_secs_f64();
    if !ud {
        // Closing Send behind the writes: in order, so its arrival proves
        // theirs.
        let src = e.ctl(0);
        e.post(ID_CTL, End::send_op(), src, 8, true)?;
    }
    let d = finish(e, ctrl, sent)?;
    let secs = t0.elapsed().as_secs_f64();
    if ud && record {
        let octets: u64 = d.num("octets")?;
        let rsecs: f64 = d.num("secs")?;
        let msgs: u64 = d.num("n")?;
        if octets == 0 || rsecs <= 0.0 {
            return Err(err(format!(
                "UD Write-Record: {msgs} of {sent} messages arrived, too few to time"
            )));
        }
        return Ok(Measured {
            octets,
            msgs: octets / size as u64,
            secs: rsecs.max(sender_secs),
            lost: sent.saturating_sub(msgs),
            note: "record octets counted at the receiver".into(),
            ..Default::default()
        });
    }
    if ud {
        return Ok(Measured {
            octets: sent * size as u64,
            msgs: sent,
            secs: sender_secs,
            note: "sender's rate: a UD Write raises nothing at the target to count".into(),
            ..Default::default()
        });
    }
    Ok(Measured {
        octets: sent * size as u64,
        msgs: sent,
        secs,
        note: "timed to a closing Send behind the writes".into(),
        ..Default::default()
    })
}

fn write_bw_b(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let ud = !e.reliable;
    let record = spec.test.op == Op::WriteRecord;
    let size = spec.size;
    let (mut records, mut octets, mut idle) = (0u64, 0u64, 0u32);
    let mut closed = false;
    let mut first: Option<(Instant, u64)> = None;
    let mut last = Instant::now();
    let mut target: Option<u64> = None;
    loop {
        let n = e.next()?;
        for i in 0..n {
            let c = e.out[i].wc;
            match c.opcode {
                WcOpcode::RecvWriteRecord => {
                    let placed: u64 = match c.record {
                        Some(r) => r.ranges[..r.n_ranges as usize]
                            .iter()
                            .map(|&(_, l)| l as u64)
                            .sum(),
                        None => c.byte_len as u64,
                    };
                    if c.status == WcStatus::Success {
                        records += 1;
                        if let Some(r) = c.record {
                            if r.len as usize != size {
                                return Err(err(format!(
                                    "Write-Record of {} octets reported, {size} written",
                                    r.len
                                )));
                            }
                        }
                    }
                    let now = Instant::now();
                    if first.is_none() {
                        first = Some((now, placed));
                    }
                    last = now;
                    octets += placed;
                }
                WcOpcode::Recv => closed = true,
                _ => {}
            }
        }
        if n > 0 {
            idle = 0;
        }
        if target.is_none() && n == 0 && ended(ctrl, &mut idle, spec.wait) {
            let m = ctrl.expect("END")?;
            target = Some(m.num("n")?);
            if ud {
                let end = Instant::now() + Duration::from_millis(if record { 150 } else { 20 });
                while Instant::now() < end {
                    let n = e.next()?;
                    for i in 0..n {
                        let c = e.out[i].wc;
                        if c.opcode == WcOpcode::RecvWriteRecord {
                            if c.status == WcStatus::Success {
                                records += 1;
                                octets += size as u64;
                            }
                            last = Instant::now();
                        }
                    }
                }
                break;
            }
        }
        if target.is_some() && closed {
            break;
        }
        if target.is_some() && n == 0 && last.elapsed() > HANG {
            return Err(err("the closing Send did not arrive".into()));
        }
    }
    let total = target.unwrap_or(0);
    if spec.verify {
        verify_slots(e, size, total, ud)?;
    }
    let (secs, counted) = match first {
        Some((t0, o0)) => (last.duration_since(t0).as_secs_f64(), octets - o0),
        None => (0.0, 0),
    };
    ctrl.send(
        &Msg::new("DONE")
            .with("n", records)
            .with("octets", counted)
            .with("secs", secs),
    )
}

/// After a one-sided bandwidth run of `total` messages (message k into
/// slot k mod nslots): every slot written must hold, octet for octet, the
/// last message written to it (over UD: some message of that slot, as
/// messages may be lost).
fn verify_slots(e: &mut End, size: usize, total: u64, ud: bool) -> io::Result<()> {
    let ns = e.nslots as u64;
    for s in 0..ns.min(total) {
        let off = e.slot(s as usize);
        let want = s + ((total - 1 - s) / ns) * ns;
        let seq = if size >= 8 { e.seq_at(off) } else { want };
        if ud {
            if size < 8 || (seq == 0 && s != 0) {
                continue;
            }
            if seq % ns != s || seq >= total {
                return Err(err(format!(
                    "verify: slot {s} holds message {seq}, not one of its own"
                )));
            }
        } else if seq != want {
            return Err(err(format!(
                "verify: slot {s} holds message {seq}, expected {want}"
            )));
        }
        e.check_at(off, size, seq, b'A', false)?;
    }
    Ok(())
}

fn read_bw_a(e: &mut End, spec: &Spec, ctrl: &mut Ctrl) -> io::Result<Measured> {
    let size = spec.size;
    let win = window(e, spec);
    let mut w = Watch::new(HANG);
    let mut quiet = 0u32;
    let zeros = vec![0u8; if spec.verify { size } else { 0 }];
    let (mut sent, mut done) = (0u64, 0u64);
    let mut inflight: std::collections::VecDeque<u64> =
        std::collections::VecDeque::with_capacity(win);
    let t0 = Instant::now();
    loop {
        while (sent - done) < win as u64 && spec.more(sent, t0) {
            let off = e.slot(sent as usize);
            if spec.verify {
                e.mr.write_at(off, &zeros).expect("in the region");
            }
            let op = SendOp::Read {
                remote_addr: e.remote_slot(sent as usize),
                rkey: e.rkey,
            };
            e.post(sent, op, off, size, true)?;
            inflight.push_back(sent);
            sent += 1;
        }
        let n = e.next()?;
        for i in 0..n {
            let c = e.out[i].wc;
            if c.opcode != WcOpcode::RdmaRead {
                continue;
            }
            done += 1;
            if spec.verify {
                let k = c.wr_id;
                let slot = k % e.nslots as u64;
                let off = e.slot(k as usize);
                e.check_at(off, size, slot, b'B', false)?;
            }
        }
        if n > 0 {
            w.progress();
        } else {
            w.check("Read completions")?;
            peer_alive(ctrl, &mut quiet)?;
        }
        if done == sent && !spec.more(sent, t0) {
            break;
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    finish(e, ctrl, sent)?;
    Ok(Measured {
        octets: sent * size as u64,
        msgs: sent,
        secs,
        note: "timed to the last Read response".into(),
        ..Default::default()
    })
}
