//! A byte stream over an RC queue pair: what an accelerated TCP socket
//! carries once the MPA exchange is over.
//!
//! Every message is an RC Send into one of the peer's pre-posted receive
//! buffers, all [`BUF`] octets, and starts with an 8-octet header:
//!
//! | octets | field |
//! |---|---|
//! | 0 | kind: 1 data, 2 credit, 3 end of stream (the writer shut down), 4 switch to the Extended Sockets RDMA model, 0x82 credit after the switch, 0x85 ready |
//! | 1 | control credits returned |
//! | 2..4 | zero |
//! | 4..8 | data credits returned (little endian) |
//!
//! A data message carries up to `BUF − 8` octets of the stream. Each end
//! posts `data + ctrl` receive buffers (numbers exchanged in the MPA
//! private data, [`Params`]); the sender spends a *data credit* per data
//! message and a *control credit* per credit or end-of-stream message, so
//! a Send always finds a buffer (iWARP has no receiver-not-ready retry: a
//! Send without one ends the connection). A buffer the application has
//! emptied is posted again and its credit goes back on the next message
//! of any kind; when there is none to carry it and half the data credits
//! are owed, a credit message carries them. Control credits come back
//! the same way; a credit message is only ever sent after the peer's data
//! was consumed, and every message the peer sends after receiving one
//! returns its control credit, so control credits cannot run out while
//! one is needed (four are enough; see `docs/sockets.md`).
//!
//! Writes are copied into registered send slots; while data credits
//! last, each write goes out at once (latency), and while they do not,
//! later writes are appended to the open slot (TCP's coalescing under a
//! closed window). Reads copy out of the receive buffers in order.
//!
//! A socket the application switched with `SOFTRDMA_DDPMODE` can move on
//! to the Extended Sockets API's RDMA model (`docs/exs.md`, "DDPMODE
//! sockets"). Each end sends one switch message (kind 4, after the data
//! it wrote, carrying its EXS parameters); until the peer's arrives it
//! still takes the peer's data, with credit messages of kind 0x82; once
//! it has arrived (no data follows it) this end posts no more stream
//! buffers, the EXS model posts its receives behind them, and a ready
//! message (kind 0x85) tells the peer so. Each end sends EXS messages
//! once it has the peer's ready message. The kinds sent after a switch
//! message have the high bit set, which no EXS message's first octet has.
//! Receive work requests of this protocol carry [`RX_TAG`] and its sends
//! [`TX_TAG`] (or the control `wr_id`), so that during the handover
//! [`Conn::handover`] tells them from the EXS model's own work on the
//! same CQ; an EXS message of the peer that lands in one of this
//! protocol's buffers is handed on as such.

use std::collections::VecDeque;

use softrdma_verbs::{
    Access, Completion, CompletionQueue, Context, InlineData, MemoryRegion, Payload,
    ProtectionDomain, QpCaps, QueuePair, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode,
    WcStatus, WorkCompletion,
};

/// Octets per buffer (header included).
pub const BUF: usize = 64 * 1024;
/// Header octets.
pub const HDR: usize = 8;
/// Receive buffers for data messages.
pub const DATA_BUFS: u32 = 16;
/// Receive buffers for control messages.
pub const CTRL_BUFS: u32 = 4;

const KIND_DATA: u8 = 1;
const KIND_CREDIT: u8 = 2;
const KIND_FIN: u8 = 3;
const KIND_SWITCH: u8 = 4;
/// A credit message after this end's switch message.
const KIND_LATE_CREDIT: u8 = 0x82;
/// The EXS model's receives are posted: the peer may send EXS messages.
const KIND_READY: u8 = 0x85;

/// Set in the `wr_id` of this protocol's receives.
pub const RX_TAG: u64 = 1 << 62;
/// Set in the `wr_id` of this protocol's data sends.
pub const TX_TAG: u64 = 1 << 61;
/// Receive work requests a DDPMODE socket's QP has room for beyond this
/// protocol's own (the EXS model's receives after a switch).
pub const EXS_RECV_ROOM: usize = 160;
/// Send work requests likewise.
pub const EXS_SEND_ROOM: usize = 256;

/// `wr_id` of control sends (inline, no slot).
const WR_CTRL: u64 = u64::MAX;

/// The private data each end puts in its MPA frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Flags: bit 0 — the socket was switched to DDP by the application.
    pub flags: u8,
    /// Receive buffers posted for data messages.
    pub data_bufs: u32,
    /// Receive buffers posted for control messages.
    pub ctrl_bufs: u32,
    /// Octets per receive buffer.
    pub buf: u32,
}

/// First octets of [`Params`] on the wire.
pub const MAGIC: [u8; 4] = *b"SRSK";
/// Version of the stream protocol.
pub const VERSION: u8 = 1;
/// Octets of [`Params`] on the wire.
pub const PARAMS_LEN: usize = 16;

impl Params {
    /// This end's parameters.
    pub fn ours(flags: u8) -> Params {
        Params {
            flags,
            data_bufs: DATA_BUFS,
            ctrl_bufs: CTRL_BUFS,
            buf: BUF as u32,
        }
    }

    /// The wire form.
    pub fn to_bytes(self) -> [u8; PARAMS_LEN] {
        let mut b = [0u8; PARAMS_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.flags;
        b[6..8].copy_from_slice(&(self.ctrl_bufs as u16).to_le_bytes());
        b[8..12].copy_from_slice(&self.data_bufs.to_le_bytes());
        b[12..16].copy_from_slice(&self.buf.to_le_bytes());
        b
    }

    /// Parses the peer's private data; `None` if it is not a softrdma
    /// sockets peer of this version or its numbers make no sense.
    pub fn parse(b: &[u8]) -> Option<Params> {
        if b.len() < PARAMS_LEN || b[..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        let p = Params {
            flags: b[5],
            ctrl_bufs: u32::from(u16::from_le_bytes([b[6], b[7]])),
            data_bufs: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            buf: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        };
        let sane = (1..=4096).contains(&p.data_bufs)
            && (3..=64).contains(&p.ctrl_bufs)
            && (HDR as u32 + 1..=1 << 24).contains(&p.buf);
        sane.then_some(p)
    }
}

/// The verbs objects of one process (one device context and PD).
#[derive(Debug)]
pub struct Device {
    ctx: Context,
    pd: ProtectionDomain,
}

impl Device {
    /// Opens the device.
    pub fn open() -> std::io::Result<Device> {
        let ctx = Context::open().map_err(|e| std::io::Error::other(e.to_string()))?;
        let pd = ctx.alloc_pd();
        Ok(Device { ctx, pd })
    }

    /// The engine context (MPA settings).
    pub fn engine(&self) -> &softrdma_engine::Context {
        self.ctx.engine()
    }

    /// The verbs context.
    pub fn ctx(&self) -> &Context {
        &self.ctx
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }
}

/// What [`Conn::handover`] made of a completion.
#[derive(Debug, PartialEq, Eq)]
pub enum Handover {
    /// Not this protocol's work: the EXS model's.
    NotOurs,
    /// This protocol's, taken.
    Taken,
    /// An EXS message of the peer that landed in one of this protocol's
    /// buffers: its octets.
    Exs(Vec<u8>),
}

struct RxMsg {
    idx: usize,
    off: usize,
    end: usize,
}

/// Why an operation on the stream cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamErr {
    /// Nothing to do now (non-blocking callers return `EAGAIN`).
    WouldBlock,
    /// The connection is gone: `errno`.
    Errno(i32),
}

/// One accelerated connection.
pub struct Conn {
    qp: QueuePair,
    cq: CompletionQueue,
    rx_mr: MemoryRegion,
    tx_mr: MemoryRegion,
    peer: Params,
    nrx: usize,
    rx: VecDeque<RxMsg>,
    rx_bytes: usize,
    tx_free: Vec<usize>,
    /// The slot being filled and how many stream octets it holds.
    tx_open: Option<(usize, usize)>,
    /// Full slots waiting for a data credit, oldest first (they go out
    /// before the open slot).
    tx_ready: VecDeque<(usize, usize)>,
    tx_inflight: usize,
    data_credits: u32,
    ctrl_credits: u32,
    owed_data: u32,
    owed_ctrl: u32,
    /// The application shut down writing; the end-of-stream message is
    /// owed until sent.
    shut_wr: bool,
    fin_sent: bool,
    fin_rcvd: bool,
    /// The connection under the QP ended without the peer's end of stream.
    broken: bool,
    /// The QP's own descriptor of the TCP connection (-1 before attach).
    efd: i32,
    /// The TCP connection was shut down for writing (closing).
    tcp_shut: bool,
    /// The switch message to send once the data written has left (the
    /// payload after the header).
    switch_out: Option<Vec<u8>>,
    switch_sent: bool,
    /// The peer's switch message (its payload).
    peer_switch: Option<Vec<u8>>,
    /// The EXS model posted its receives.
    exs_posted: bool,
    ready_sent: bool,
    peer_ready: bool,
    /// Messages sent and received (statistics).
    pub msgs_out: u64,
    /// As [`Conn::msgs_out`], inbound.
    pub msgs_in: u64,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("qpn", &self.qp.qpn())
            .field("rx_bytes", &self.rx_bytes)
            .field("data_credits", &self.data_credits)
            .field("ctrl_credits", &self.ctrl_credits)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// The QP, CQ and buffers of a new connection, with every receive
    /// posted (before the MPA exchange ends, so the peer's first Send
    /// finds one).
    /// `exs_room`: the queues also have room for the EXS model's work
    /// (a socket switched with `SOFTRDMA_DDPMODE`).
    pub fn new(dev: &Device, exs_room: bool) -> std::io::Result<Conn> {
        let nrx = (DATA_BUFS + CTRL_BUFS) as usize;
        let ntx = DATA_BUFS as usize;
        let (xr, xs) = if exs_room {
            (EXS_RECV_ROOM, EXS_SEND_ROOM)
        } else {
            (0, 0)
        };
        let cq = dev.ctx.create_cq(2 * (nrx + ntx) + 8 + 2 * (xr + xs), None);
        let qp = dev.pd.create_cm_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: ntx + CTRL_BUFS as usize + 4 + xs,
                max_recv_wr: nrx + xr,
            },
        );
        // No progress thread: the socket's calls drive it and wait on the
        // connection itself (`Conn::wait`).
        qp.set_self_driven();
        let reg = |n: usize, a: Access| {
            dev.pd
                .register(n * BUF, a)
                .map_err(|e| std::io::Error::other(e.to_string()))
        };
        let rx_mr = reg(nrx, Access::LOCAL_WRITE)?;
        let tx_mr = reg(ntx, Access(0))?;
        let c = Conn {
            qp,
            cq,
            rx_mr,
            tx_mr,
            peer: Params::ours(0),
            nrx,
            rx: VecDeque::new(),
            rx_bytes: 0,
            tx_free: (0..ntx).rev().collect(),
            tx_open: None,
            tx_ready: VecDeque::new(),
            tx_inflight: 0,
            data_credits: 0,
            ctrl_credits: 0,
            owed_data: 0,
            owed_ctrl: 0,
            shut_wr: false,
            fin_sent: false,
            fin_rcvd: false,
            broken: false,
            efd: -1,
            tcp_shut: false,
            switch_out: None,
            switch_sent: false,
            peer_switch: None,
            exs_posted: false,
            ready_sent: false,
            peer_ready: false,
            msgs_out: 0,
            msgs_in: 0,
        };
        for i in 0..nrx {
            c.post_recv(i)?;
        }
        Ok(c)
    }

    fn post_recv(&self, idx: usize) -> std::io::Result<()> {
        let sge = self.rx_mr.sge(idx * BUF, BUF as u32);
        self.qp
            .post_recv(RecvWr {
                wr_id: RX_TAG | idx as u64,
                sgl: SgList::single(sge.addr, sge.length, sge.lkey),
            })
            .map_err(|e| std::io::Error::other(format!("post_recv: {e:?}")))
    }

    /// The QP (for the MPA attach).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// Records the descriptor the QP runs on (for the closing handshake).
    pub fn set_efd(&mut self, efd: i32) {
        self.efd = efd;
    }

    /// Starts the stream with the peer's parameters.
    pub fn start(&mut self, peer: Params) {
        self.peer = peer;
        self.data_credits = peer.data_bufs;
        self.ctrl_credits = peer.ctrl_bufs;
    }

    /// What a caller with nothing to do waits for: the connection's socket
    /// readable (whatever arrives is progress), and writable while the QP
    /// has octets to write. `(-1, 0)` before the connection is attached.
    pub fn wait(&self) -> (i32, i16) {
        let mut ev = libc::POLLIN;
        if !self.qp.tx_idle() {
            ev |= libc::POLLOUT;
        }
        (self.efd, ev)
    }

    /// Takes what the CQ holds and sends what can go. Returns true if
    /// anything changed.
    pub fn progress(&mut self) -> bool {
        let mut changed = false;
        let blank = Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        };
        let mut out = [blank; 32];
        loop {
            let n = self.cq.poll(&mut out);
            for c in &out[..n] {
                self.complete(&c.wc);
            }
            changed |= n > 0;
            if n < out.len() {
                break;
            }
        }
        if changed
            || self.tx_open.is_some()
            || !self.tx_ready.is_empty()
            || self.shut_wr
            || self.owed_data > 0
        {
            changed |= self.flush();
        }
        changed
    }

    fn complete(&mut self, wc: &WorkCompletion) {
        match wc.opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                if wc.status != WcStatus::Success {
                    self.broken = true;
                    return;
                }
                let idx = (wc.wr_id & !RX_TAG) as usize;
                let len = wc.byte_len as usize;
                if idx >= self.nrx || len < HDR {
                    self.broken = true;
                    return;
                }
                let mut h = [0u8; HDR];
                let _ = self.rx_mr.read_at(idx * BUF, &mut h);
                self.ctrl_credits += u32::from(h[1]);
                self.data_credits += u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
                self.msgs_in += 1;
                match h[0] {
                    KIND_DATA if len > HDR => {
                        self.rx_bytes += len - HDR;
                        self.rx.push_back(RxMsg {
                            idx,
                            off: HDR,
                            end: len,
                        });
                    }
                    KIND_DATA => self.consumed(idx, true),
                    KIND_FIN => {
                        self.fin_rcvd = true;
                        self.consumed(idx, false);
                    }
                    KIND_CREDIT | KIND_LATE_CREDIT => self.consumed(idx, false),
                    KIND_READY if self.peer_switch.is_some() => {
                        self.peer_ready = true;
                        self.consumed(idx, false);
                    }
                    KIND_SWITCH if self.peer_switch.is_none() => {
                        let mut p = vec![0u8; len - HDR];
                        let _ = self.rx_mr.read_at(idx * BUF + HDR, &mut p);
                        self.peer_switch = Some(p);
                    }
                    _ => self.broken = true,
                }
            }
            _ => {
                if wc.status != WcStatus::Success {
                    self.broken = true;
                }
                if wc.wr_id != WR_CTRL {
                    let idx = (wc.wr_id & !TX_TAG) as usize;
                    self.tx_inflight = self.tx_inflight.saturating_sub(1);
                    self.tx_free.push(idx);
                }
            }
        }
    }

    /// A receive buffer is empty again: post it and owe its credit.
    fn consumed(&mut self, idx: usize, data: bool) {
        if self.exs_posted {
            // The EXS model's receives are behind the stream's buffers now:
            // the buffer stays empty (no stream data comes any more).
            return;
        }
        if self.post_recv(idx).is_err() {
            self.broken = true;
        }
        if data {
            self.owed_data += 1;
        } else {
            self.owed_ctrl += 1;
        }
    }

    fn header(&mut self, kind: u8) -> [u8; HDR] {
        let mut h = [0u8; HDR];
        h[0] = kind;
        let ctrl = self.owed_ctrl.min(255);
        h[1] = ctrl as u8;
        self.owed_ctrl -= ctrl;
        h[4..8].copy_from_slice(&self.owed_data.to_le_bytes());
        self.owed_data = 0;
        h
    }

    fn post_ctrl(&mut self, kind: u8) -> bool {
        let h = self.header(kind);
        let wr = SendWr {
            wr_id: WR_CTRL,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Inline(InlineData::new(&h).expect("8 octets fit inline")),
            // Signaled, so the send queue's slots come back even on a
            // connection that carries only control messages one way.
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        self.ctrl_credits -= 1;
        self.msgs_out += 1;
        if self.qp.post_send(wr).is_err() {
            self.broken = true;
            return false;
        }
        true
    }

    /// Sends the open slot, owed credits and the end of stream as far as
    /// credits allow. True if anything went out.
    fn flush(&mut self) -> bool {
        let mut sent = false;
        if self.broken {
            return false;
        }
        if self.switch_sent {
            // Credits for the peer's data still coming, until its switch
            // message (one credit stays for the ready message); then the
            // ready message once the EXS model's receives are posted.
            if self.peer_switch.is_none()
                && self.owed_data >= self.peer.data_bufs.div_ceil(2).max(1)
                && self.ctrl_credits > 1
            {
                return self.post_ctrl(KIND_LATE_CREDIT);
            }
            if self.exs_posted && !self.ready_sent && self.ctrl_credits + self.data_credits > 0 {
                if self.ctrl_credits == 0 {
                    // The data credit stands in (no data follows).
                    self.ctrl_credits += 1;
                    self.data_credits -= 1;
                }
                self.ready_sent = self.post_ctrl(KIND_READY);
                return self.ready_sent;
            }
            return false;
        }
        while self.data_credits > 0 {
            let next = match self.tx_ready.pop_front() {
                Some(x) => x,
                // A partly filled slot waits while more than half the
                // window is out: later writes join it, so a stream of small
                // writes does not spend a credit (a 64 KiB buffer and a
                // wake-up at the peer) per write. It leaves when credits
                // come back, which they do: the peer owes half the window
                // once it has read what is out (`flush`'s credit rule).
                None if self.holding() => break,
                None => match self.tx_open.take() {
                    Some(x) => x,
                    None => break,
                },
            };
            let (idx, n) = next;
            let h = self.header(KIND_DATA);
            let _ = self.tx_mr.write_at(idx * BUF, &h);
            let sge = self.tx_mr.sge(idx * BUF, (HDR + n) as u32);
            let wr = SendWr {
                wr_id: TX_TAG | idx as u64,
                op: SendOp::Send {
                    imm: None,
                    invalidate: None,
                },
                payload: Payload::Sgl(SgList::single(sge.addr, sge.length, sge.lkey)),
                flags: SendFlags {
                    signaled: true,
                    ..SendFlags::default()
                },
            };
            self.data_credits -= 1;
            self.tx_inflight += 1;
            self.msgs_out += 1;
            if self.qp.post_send(wr).is_err() {
                self.broken = true;
                return sent;
            }
            sent = true;
        }
        if self.shut_wr
            && !self.fin_sent
            && self.tx_open.is_none()
            && self.tx_ready.is_empty()
            && self.ctrl_credits > 0
        {
            self.fin_sent = self.post_ctrl(KIND_FIN);
            sent |= self.fin_sent;
        }
        if self.switch_out.is_some() {
            // Two credits: the switch message's and the ready message's.
            if self.tx_open.is_none()
                && self.tx_ready.is_empty()
                && self.ctrl_credits + self.data_credits >= 2
            {
                sent |= self.post_switch();
            }
            return sent;
        }
        if self.owed_data >= self.peer.data_bufs.div_ceil(2).max(1) && self.ctrl_credits > 0 {
            sent |= self.post_ctrl(KIND_CREDIT);
        }
        sent
    }

    /// Sends the switch message (the last of this protocol from this end),
    /// with every credit owed.
    fn post_switch(&mut self) -> bool {
        let Some(p) = self.switch_out.take() else {
            return false;
        };
        let mut b = self.header(KIND_SWITCH).to_vec();
        b.extend_from_slice(&p);
        let Some(data) = InlineData::new(&b) else {
            self.broken = true;
            return false;
        };
        let wr = SendWr {
            wr_id: WR_CTRL,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Inline(data),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        if self.ctrl_credits > 0 {
            self.ctrl_credits -= 1;
        } else {
            self.data_credits -= 1;
        }
        self.msgs_out += 1;
        self.switch_sent = true;
        if self.qp.post_send(wr).is_err() {
            self.broken = true;
            return false;
        }
        true
    }

    /// Starts the switch to the EXS model: `payload` (this end's EXS
    /// parameters) goes in the switch message, after the data written.
    /// Writing is over for this protocol.
    pub fn begin_switch(&mut self, payload: Vec<u8>) {
        if !self.switch_sent && self.switch_out.is_none() {
            self.switch_out = Some(payload);
            self.flush();
        }
    }

    /// The peer's switch message arrived (its payload).
    pub fn peer_switch(&self) -> Option<&[u8]> {
        self.peer_switch.as_deref()
    }

    /// True when the EXS model should post its receives now: both switch
    /// messages are out, so no more stream data comes and no stream buffer
    /// is posted again.
    pub fn exs_receives_due(&self) -> bool {
        self.switch_sent && self.peer_switch.is_some() && !self.exs_posted
    }

    /// The EXS model posted its receives: the ready message goes out.
    pub fn exs_receives_posted(&mut self) {
        self.exs_posted = true;
        self.flush();
    }

    /// Both ready messages crossed: from here this end may send EXS
    /// messages. The peer's switch payload.
    pub fn switched(&self) -> Option<&[u8]> {
        if self.ready_sent && self.peer_ready {
            self.peer_switch.as_deref()
        } else {
            None
        }
    }

    /// Sends what this protocol still owes (data, then the switch
    /// message) during the handover.
    pub fn handover_flush(&mut self) {
        self.flush();
    }

    /// During the handover the EXS model polls the CQ and passes each
    /// completion here first: this protocol's work is taken
    /// ([`Handover::Taken`]), and a peer's message that landed in one of
    /// its buffers after the peer's switch message and is not a stream
    /// message (high bit of the kind set) is returned as the EXS message
    /// it is.
    pub fn handover(&mut self, wc: &WorkCompletion) -> Handover {
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        let ours = if recv {
            wc.wr_id & RX_TAG != 0
        } else {
            wc.wr_id == WR_CTRL || wc.wr_id & TX_TAG != 0
        };
        if !ours {
            return Handover::NotOurs;
        }
        // After the peer's switch message only its late credits and its
        // ready message are the stream's (high bit set); the rest is EXS.
        let stream_kind = |c: &Conn, idx: usize| {
            let mut k = [0u8; 1];
            idx < c.nrx && c.rx_mr.read_at(idx * BUF, &mut k).is_ok() && k[0] & 0x80 != 0
        };
        let idx = (wc.wr_id & !RX_TAG) as usize;
        if recv
            && self.peer_switch.is_some()
            && wc.status == WcStatus::Success
            && !stream_kind(self, idx)
        {
            let len = (wc.byte_len as usize).min(BUF);
            let mut b = vec![0u8; len];
            if idx >= self.nrx || self.rx_mr.read_at(idx * BUF, &mut b).is_err() {
                self.broken = true;
                return Handover::Taken;
            }
            self.msgs_in += 1;
            return Handover::Exs(b);
        }
        self.complete(wc);
        self.flush();
        Handover::Taken
    }

    /// The CQ (the EXS model polls it after a switch).
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The QP's own descriptor of the TCP connection.
    pub fn efd(&self) -> i32 {
        self.efd
    }

    /// True while the open slot is held back to coalesce later writes:
    /// it is not full, the end of stream is not due, and more than half
    /// the peer's window is in flight.
    fn holding(&self) -> bool {
        let half = self.peer.data_bufs / 2;
        self.tx_open.is_some_and(|(_, n)| n < BUF - HDR)
            && !self.shut_wr
            && self.switch_out.is_none()
            && self.data_credits < self.peer.data_bufs - half
    }

    /// Octets ready to read.
    pub fn readable_bytes(&self) -> usize {
        self.rx_bytes
    }

    /// True once a read would return end of file (after the buffered
    /// octets): the peer shut down writing, or the connection ended.
    pub fn at_eof(&self) -> bool {
        self.fin_rcvd || self.broken
    }

    /// True when the connection ended without the peer's end of stream.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// True when the peer shut down writing.
    pub fn fin_received(&self) -> bool {
        self.fin_rcvd
    }

    /// True when this end shut down writing.
    pub fn write_shut(&self) -> bool {
        self.shut_wr
    }

    /// Room for a write without waiting (`POLLOUT`): a whole send slot
    /// free, so a write of up to a slot's size after `poll` does not
    /// block — as the kernel reports a TCP socket writable only with a
    /// good part of its send buffer free. Reporting a few free octets
    /// would make a blocking writer that polls before each write block
    /// mid-write, with nobody reading the peer's answers.
    pub fn writable(&self) -> bool {
        !self.broken && !self.shut_wr && !self.tx_free.is_empty()
    }

    /// Copies up to `out.len()` octets out (`peek`: without consuming).
    /// Returns how many (0 with nothing buffered).
    pub fn read(&mut self, out: &mut [u8], peek: bool) -> usize {
        let mut done = 0;
        let mut i = 0;
        while done < out.len() && i < self.rx.len() {
            let m = &self.rx[i];
            let n = (m.end - m.off).min(out.len() - done);
            let _ = self
                .rx_mr
                .read_at(m.idx * BUF + m.off, &mut out[done..done + n]);
            done += n;
            if peek {
                i += 1;
                continue;
            }
            let m = &mut self.rx[i];
            m.off += n;
            if m.off == m.end {
                let idx = m.idx;
                self.rx.pop_front();
                self.consumed(idx, true);
            }
        }
        if !peek {
            self.rx_bytes -= done;
            if done > 0 {
                self.flush();
            }
        }
        done
    }

    /// Discards up to `n` buffered octets (`MSG_TRUNC` on a stream).
    pub fn discard(&mut self, n: usize) -> usize {
        let mut left = n;
        while left > 0 {
            let Some(m) = self.rx.front_mut() else { break };
            let k = (m.end - m.off).min(left);
            m.off += k;
            left -= k;
            if m.off == m.end {
                let idx = m.idx;
                self.rx.pop_front();
                self.consumed(idx, true);
            }
        }
        self.rx_bytes -= n - left;
        self.flush();
        n - left
    }

    /// Copies as much of `data` as fits into send slots and sends what
    /// credits allow. Returns the octets taken (0: no room now).
    pub fn write(&mut self, data: &[u8]) -> Result<usize, StreamErr> {
        if self.broken {
            return Err(StreamErr::Errno(libc::EPIPE));
        }
        if self.shut_wr {
            return Err(StreamErr::Errno(libc::EPIPE));
        }
        let mut done = 0;
        while done < data.len() {
            let (idx, fill) = match self.tx_open {
                Some((idx, fill)) if fill < BUF - HDR => (idx, fill),
                full => match self.tx_free.pop() {
                    Some(idx) => {
                        // A full open slot waits its turn for a credit.
                        if let Some(f) = full {
                            self.tx_ready.push_back(f);
                        }
                        (idx, 0)
                    }
                    None => break,
                },
            };
            let n = (BUF - HDR - fill).min(data.len() - done);
            let _ = self
                .tx_mr
                .write_at(idx * BUF + HDR + fill, &data[done..done + n]);
            done += n;
            self.tx_open = Some((idx, fill + n));
            self.flush();
            if self.broken {
                break;
            }
        }
        if done == 0 {
            return Err(if self.broken {
                StreamErr::Errno(libc::EPIPE)
            } else {
                StreamErr::WouldBlock
            });
        }
        Ok(done)
    }

    /// Shuts down writing: the end of stream follows the data written.
    pub fn shutdown_write(&mut self) {
        if !self.shut_wr {
            self.shut_wr = true;
            self.flush();
        }
    }

    /// True when everything written has left (the end of stream too, if
    /// writing was shut down).
    pub fn drained(&self) -> bool {
        self.broken
            || (self.tx_open.is_none()
                && self.tx_ready.is_empty()
                && self.tx_inflight == 0
                && (!self.shut_wr || self.fin_sent)
                && self.qp.tx_idle())
    }

    /// Closing: once everything written has left, the TCP connection is
    /// shut down for writing; the peer's engine then ends its side, and
    /// the connection is over when that close arrives ([`Conn::broken`]).
    /// Closing the socket earlier, with the peer's octets unread, would
    /// reset it, and a reset discards what the peer's kernel still holds.
    /// True when the connection can be dropped.
    pub fn close_step(&mut self) -> bool {
        self.progress();
        if self.broken {
            return true;
        }
        if !self.tcp_shut && self.drained() && self.efd >= 0 {
            self.tcp_shut = true;
            // SAFETY: the QP's own descriptor, open until the QP is dropped.
            unsafe { libc::shutdown(self.efd, libc::SHUT_WR) };
        }
        false
    }

    /// Ends the connection: outstanding work flushes, the TCP connection
    /// closes.
    pub fn disconnect(&self) {
        self.qp.disconnect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_and_refuse_what_is_not_ours() {
        let p = Params::ours(1);
        let b = p.to_bytes();
        assert_eq!(&b[..4], b"SRSK");
        assert_eq!(Params::parse(&b), Some(p));
        // Trailing octets (a longer private data) are ignored.
        let mut long = b.to_vec();
        long.extend_from_slice(&[9; 8]);
        assert_eq!(Params::parse(&long), Some(p));
        // Short, foreign, other versions, nonsense numbers.
        assert_eq!(Params::parse(&b[..PARAMS_LEN - 1]), None);
        let mut other = b;
        other[0] = b'X';
        assert_eq!(Params::parse(&other), None);
        let mut v2 = b;
        v2[4] = VERSION + 1;
        assert_eq!(Params::parse(&v2), None);
        let mut no_data = b;
        no_data[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Params::parse(&no_data), None);
        let mut few_ctrl = b;
        few_ctrl[6..8].copy_from_slice(&2u16.to_le_bytes());
        assert_eq!(
            Params::parse(&few_ctrl),
            None,
            "three control credits are the minimum"
        );
        let mut tiny = b;
        tiny[12..16].copy_from_slice(&(HDR as u32).to_le_bytes());
        assert_eq!(
            Params::parse(&tiny),
            None,
            "a buffer must hold more than the header"
        );
    }
}
