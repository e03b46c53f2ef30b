//! One rsocket stream connection over a softrdma RC queue pair.
//!
//! # Protocol (ours; both ends must be softrdma)
//!
//! The connection is an RC QP set up through [`softrdma_engine::cm_events`]
//! (MPA private data [`PD_MAGIC`]). Each side owns [`RX_SLOTS`] receive
//! slots of [`SLOT`] octets, always posted, and [`TX_SLOTS`] send slots of
//! the same size in registered memory. Every Send carries one message: a
//! 16-octet header ([`Header`]) and its payload:
//!
//! * `DATA`: stream octets (at most `SLOT - HDR`);
//! * `CREDIT`: nothing but returned credits;
//! * `IOMAP` / `IOUNMAP`: the sender mapped (`riomap`) or unmapped a buffer
//!   the peer may RDMA Write into at a given offset;
//! * `FIN`: the sender will send no more (`rshutdown(SHUT_WR)`).
//!
//! Every header returns *credits*: receive slots its sender consumed (and
//! reposted) since it last said so. A side may have at most `RX_SLOTS`
//! messages unaccounted for at its peer; `DATA` keeps [`RESERVE`] of them
//! for control messages, so credits can always flow back. Credits are
//! returned with the next message, or alone (`CREDIT`) when half the slots
//! are waiting to be returned or a reader is about to block.
//!
//! `riowrite` is an RDMA Write from a send slot into the peer's mapped
//! buffer; it consumes no receive slot, and being on the same QP it is
//! ordered with the stream. The last octet of the range goes in a second,
//! one-octet Write after the rest: a peer application learns that a
//! transfer arrived by watching that octet and may write it at once
//! (riostream does, in the buffer it sends from), so it must be stored
//! exactly once and after every other octet. Placement copies with the C
//! library's `memmove`, which may store the end of a range twice (its head
//! and tail vectors overlap when the length is one vector) or before the
//! octets just ahead of it; a one-octet copy is a single store, and the
//! Writes are placed in order.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use softrdma_engine::{self as engine, CompChannel, Completion, Cq, Qp, QpCaps, QpLinkState};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus};

/// MPA private data that marks an rsocket connection (both directions).
pub const PD_MAGIC: &[u8] = b"softrdma-rsocket-1";
/// Octets per slot.
pub const SLOT: usize = 64 * 1024;
/// Receive slots per connection.
pub const RX_SLOTS: usize = 32;
/// Send slots per connection.
pub const TX_SLOTS: usize = 32;
/// Peer slots `DATA` leaves for control messages.
pub const RESERVE: usize = 2;
/// Header octets.
pub const HDR: usize = 16;
/// Most stream octets per message.
pub const MAX_DATA: usize = SLOT - HDR;

const K_DATA: u8 = 1;
const K_CREDIT: u8 = 2;
const K_IOMAP: u8 = 3;
const K_IOUNMAP: u8 = 4;
const K_FIN: u8 = 5;

/// `wr_id` tag of receives (the slot index is in the low bits).
const WR_RECV: u64 = 1 << 32;
/// `wr_id` tag of sends and writes.
const WR_SEND: u64 = 2 << 32;
/// `wr_id` of the first piece of a split `riowrite` (its slot is released
/// by the second piece's completion).
const WR_PART: u64 = 4 << 32;

/// A message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    kind: u8,
    credits: u32,
    len: u32,
}

impl Header {
    fn encode(&self, out: &mut [u8]) {
        out[..HDR].fill(0);
        out[0] = self.kind;
        out[4..8].copy_from_slice(&self.credits.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < HDR {
            return None;
        }
        let h = Header {
            kind: b[0],
            credits: u32::from_le_bytes(b[4..8].try_into().ok()?),
            len: u32::from_le_bytes(b[8..12].try_into().ok()?),
        };
        (h.len as usize <= b.len() - HDR).then_some(h)
    }
}

/// Registered memory owned by a connection: page-aligned, zeroed,
/// deregistered before it is freed.
struct Region {
    ctx: engine::Context,
    ptr: *mut u8,
    layout: Layout,
    stag: u32,
}

// The region is plain memory; every access goes through `&mut self` of
// the owning connection (under its lock) or through the engine's
// registry, which synchronises itself.
// SAFETY: see above.
unsafe impl Send for Region {}

impl Region {
    fn new(ctx: &engine::Context, pd: u32, len: usize) -> io::Result<Region> {
        let layout = Layout::from_size_align(len, 4096)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the layout has a non-zero size (callers pass len > 0).
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        let access = Access::LOCAL_WRITE;
        // SAFETY: the live allocation above, freed only in Drop after deregistering.
        let reg = unsafe { ctx.registry().register(ptr, len, ptr as u64, access, pd) };
        match reg {
            Ok(stag) => Ok(Region {
                ctx: ctx.clone(),
                ptr,
                layout,
                stag,
            }),
            Err(_) => {
                // SAFETY: allocated above with this layout, never shared.
                unsafe { dealloc(ptr, layout) };
                Err(io::Error::from_raw_os_error(libc::ENOMEM))
            }
        }
    }

    fn addr(&self, off: usize) -> u64 {
        self.ptr as u64 + off as u64
    }

    fn slice(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.layout.size());
        // The engine writes a receive slot only while it is posted, and a
        // slot is read only after its completion was polled.
        // SAFETY: in bounds (checked above) of the live allocation.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    fn slice_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.layout.size());
        // A send slot is written only while no work request on it is
        // outstanding.
        // SAFETY: in bounds (checked above) of the live allocation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.ctx.registry().deregister(self.stag);
        // SAFETY: allocated in `new` with this layout; deregistered above.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// A buffer this side mapped for the peer's `riowrite` (`riomap`).
#[derive(Debug, Clone, Copy)]
pub struct LocalMap {
    /// Start of the application's buffer.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// The offset peers address it by.
    pub offset: u64,
    /// Its registration.
    pub stag: u32,
}

/// A buffer the peer mapped for our `riowrite`.
#[derive(Debug, Clone, Copy)]
struct RemoteMap {
    offset: u64,
    addr: u64,
    len: u64,
    rkey: u32,
}

/// Why a data-path call cannot proceed now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Would block: wait on [`Conn::wait_fd`] and retry.
    Again,
    /// Failed with this errno.
    Errno(i32),
}

/// A connected rsocket stream.
pub struct Conn {
    ctx: engine::Context,
    pd: u32,
    qp: Qp,
    cq: Arc<Cq>,
    chan: Arc<CompChannel>,
    rx: Region,
    tx: Region,
    /// Received messages not yet consumed: (slot, offset read so far, len).
    ready: VecDeque<(usize, usize, usize)>,
    /// Free send slots.
    tx_free: Vec<usize>,
    /// Messages we may still send before the peer returns credits.
    peer_avail: usize,
    /// Receive slots consumed and reposted, not yet reported to the peer.
    unreported: u32,
    local_maps: Vec<LocalMap>,
    remote_maps: Vec<RemoteMap>,
    /// The peer sent FIN.
    peer_fin: bool,
    /// We sent FIN.
    fin_sent: bool,
    /// The connection failed (errno).
    error: Option<i32>,
}

impl Conn {
    /// A QP with its CQ, channel and slots, every receive posted, not yet
    /// connected.
    pub fn new(ctx: &engine::Context) -> io::Result<Conn> {
        let pd = ctx.alloc_pd();
        let chan = CompChannel::new()?;
        // A send slot has up to two Writes out (a split `riowrite`).
        let cq = ctx.create_cq(RX_SLOTS + 2 * TX_SLOTS + 8, Some(chan.clone()));
        let caps = QpCaps {
            max_send_wr: 2 * TX_SLOTS + 4,
            max_recv_wr: RX_SLOTS,
        };
        let qp = ctx
            .create_rc_qp(pd, caps, cq.clone(), cq.clone())
            .map_err(|e| io::Error::other(e.to_string()))?;
        let rx = Region::new(ctx, pd, SLOT * RX_SLOTS)?;
        let tx = Region::new(ctx, pd, SLOT * TX_SLOTS)?;
        let conn = Conn {
            ctx: ctx.clone(),
            pd,
            qp,
            cq,
            chan,
            rx,
            tx,
            ready: VecDeque::new(),
            tx_free: (0..TX_SLOTS).rev().collect(),
            peer_avail: RX_SLOTS,
            unreported: 0,
            local_maps: Vec::new(),
            remote_maps: Vec::new(),
            peer_fin: false,
            fin_sent: false,
            error: None,
        };
        for slot in 0..RX_SLOTS {
            conn.post_recv(slot)?;
        }
        Ok(conn)
    }

    /// The QP (to connect or accept through the CM).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The descriptor that becomes readable when the CQ fires (after
    /// [`Conn::arm`]).
    pub fn wait_fd(&self) -> i32 {
        self.chan.fd()
    }

    fn post_recv(&self, slot: usize) -> io::Result<()> {
        let wr = RecvWr {
            wr_id: WR_RECV | slot as u64,
            sgl: SgList::single(self.rx.addr(slot * SLOT), SLOT as u32, self.rx.stag),
        };
        self.qp
            .post_recv(wr)
            .map_err(|e| io::Error::other(format!("post_recv: {e:?}")))
    }

    /// Asks for a wake-up on the next completion, then makes progress once
    /// more (a completion that raced the arming is seen here). Returns true
    /// if something is ready to look at now.
    pub fn arm(&mut self) -> bool {
        self.cq.req_notify(false);
        self.progress()
    }

    /// Drains the wake-up events of the channel (after a poll said so).
    pub fn drain_wakeups(&self) {
        while self.chan.try_get_event().is_some() {}
    }

    /// Polls the CQ and handles what completed. Returns true if anything
    /// did.
    pub fn progress(&mut self) -> bool {
        let mut wcs = [Completion {
            wc: softrdma_proto::wr::WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0),
            qp_num: 0,
        }; 16];
        let mut any = false;
        loop {
            let n = self.cq.poll(&mut wcs);
            for c in &wcs[..n] {
                self.handle(c);
            }
            any |= n > 0;
            if n < wcs.len() {
                break;
            }
        }
        if self.error.is_none() && self.qp.link_state() == QpLinkState::Error && !self.peer_fin {
            self.error = Some(libc::ECONNRESET);
            any = true;
        }
        if self.unreported as usize >= RX_SLOTS / 2 {
            self.send_control(K_CREDIT, &[]);
        }
        any
    }

    fn handle(&mut self, c: &Completion) {
        let wc = &c.wc;
        let slot = (wc.wr_id & 0xFFFF_FFFF) as usize;
        if wc.wr_id == WR_PART {
            if wc.status != WcStatus::Success && self.error.is_none() && !self.peer_fin {
                self.error = Some(libc::ECONNRESET);
            }
            return;
        }
        if wc.wr_id & WR_SEND != 0 {
            if slot < TX_SLOTS {
                self.tx_free.push(slot);
            }
            if wc.status != WcStatus::Success && self.error.is_none() && !self.peer_fin {
                self.error = Some(libc::ECONNRESET);
            }
            return;
        }
        if wc.status != WcStatus::Success || slot >= RX_SLOTS {
            if self.error.is_none() && !self.peer_fin {
                self.error = Some(libc::ECONNRESET);
            }
            return;
        }
        let len = (wc.byte_len as usize).min(SLOT);
        let Some(h) = Header::decode(self.rx.slice(slot * SLOT, len)) else {
            self.error = Some(libc::EPROTO);
            return;
        };
        self.peer_avail = (self.peer_avail + h.credits as usize).min(RX_SLOTS);
        let body = slot * SLOT + HDR;
        match h.kind {
            K_DATA if h.len > 0 => {
                self.ready.push_back((slot, 0, h.len as usize));
                return;
            }
            K_IOMAP if h.len >= 28 => {
                let b = self.rx.slice(body, 28);
                let m = RemoteMap {
                    offset: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
                    addr: u64::from_le_bytes(b[8..16].try_into().unwrap_or_default()),
                    len: u64::from_le_bytes(b[16..24].try_into().unwrap_or_default()),
                    rkey: u32::from_le_bytes(b[24..28].try_into().unwrap_or_default()),
                };
                self.remote_maps.retain(|r| r.offset != m.offset);
                self.remote_maps.push(m);
            }
            K_IOUNMAP if h.len >= 8 => {
                let b = self.rx.slice(body, 8);
                let off = u64::from_le_bytes(b.try_into().unwrap_or_default());
                self.remote_maps.retain(|r| r.offset != off);
            }
            K_FIN => self.peer_fin = true,
            _ => {}
        }
        self.recycle(slot);
    }

    /// Reposts a consumed receive slot.
    fn recycle(&mut self, slot: usize) {
        if self.post_recv(slot).is_err() {
            if self.error.is_none() && !self.peer_fin {
                self.error = Some(libc::ECONNRESET);
            }
            return;
        }
        self.unreported += 1;
    }

    /// Sends one control message (uses the reserve). False if it could not
    /// be sent now.
    fn send_control(&mut self, kind: u8, body: &[u8]) -> bool {
        if self.peer_avail == 0 || self.error.is_some() {
            return false;
        }
        let Some(slot) = self.tx_free.pop() else {
            return false;
        };
        self.post_message(slot, kind, body)
    }

    fn post_message(&mut self, slot: usize, kind: u8, body: &[u8]) -> bool {
        let h = Header {
            kind,
            credits: self.unreported,
            len: body.len() as u32,
        };
        let off = slot * SLOT;
        let buf = self.tx.slice_mut(off, HDR + body.len());
        h.encode(buf);
        buf[HDR..].copy_from_slice(body);
        let wr = SendWr {
            wr_id: WR_SEND | slot as u64,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(SgList::single(
                self.tx.addr(off),
                (HDR + body.len()) as u32,
                self.tx.stag,
            )),
            flags: SendFlags {
                signaled: true,
                ..SendFlags::default()
            },
        };
        match self.qp.post_send(wr) {
            Ok(()) => {
                self.unreported = 0;
                self.peer_avail -= 1;
                true
            }
            Err(_) => {
                self.tx_free.push(slot);
                if self.error.is_none() {
                    self.error = Some(libc::ECONNRESET);
                }
                false
            }
        }
    }

    /// The pending error, if any (`SO_ERROR` keeps it).
    pub fn error(&self) -> Option<i32> {
        self.error
    }

    /// True if `rrecv` would not block.
    pub fn readable(&self) -> bool {
        !self.ready.is_empty() || self.peer_fin || self.error.is_some()
    }

    /// True if `rsend` would not block.
    pub fn writable(&self) -> bool {
        self.error.is_some()
            || (self.peer_avail > RESERVE && !self.tx_free.is_empty() && !self.fin_sent)
    }

    /// True once the peer sent FIN.
    pub fn peer_closed(&self) -> bool {
        self.peer_fin
    }

    /// Queues up to `data.len()` octets; returns how many.
    pub fn send(&mut self, data: &[u8]) -> Result<usize, Blocked> {
        self.progress();
        if let Some(e) = self.error {
            return Err(Blocked::Errno(e));
        }
        if self.fin_sent {
            return Err(Blocked::Errno(libc::EPIPE));
        }
        let mut done = 0;
        while done < data.len() && self.peer_avail > RESERVE {
            let Some(slot) = self.tx_free.pop() else {
                break;
            };
            let n = (data.len() - done).min(MAX_DATA);
            if !self.post_message(slot, K_DATA, &data[done..done + n]) {
                break;
            }
            done += n;
        }
        if done == 0 {
            return Err(match self.error {
                Some(e) => Blocked::Errno(e),
                None => Blocked::Again,
            });
        }
        Ok(done)
    }

    /// Copies up to `out.len()` received octets; `Ok(0)` at end of stream.
    pub fn recv(&mut self, out: &mut [u8], peek: bool) -> Result<usize, Blocked> {
        self.progress();
        let mut done = 0;
        let mut i = 0;
        while done < out.len() {
            let Some(&(slot, read, len)) = self.ready.get(i) else {
                break;
            };
            let n = (len - read).min(out.len() - done);
            out[done..done + n].copy_from_slice(self.rx.slice(slot * SLOT + HDR + read, n));
            done += n;
            if peek {
                i += 1;
                continue;
            }
            if read + n == len {
                self.ready.pop_front();
                self.recycle(slot);
            } else if let Some(front) = self.ready.front_mut() {
                front.1 += n;
            }
        }
        if done > 0 {
            if self.ready.is_empty() && self.unreported > 0 {
                self.send_control(K_CREDIT, &[]);
            }
            return Ok(done);
        }
        if out.is_empty() {
            return Ok(0);
        }
        if self.unreported > 0 {
            // About to block: the peer may be waiting for these.
            self.send_control(K_CREDIT, &[]);
        }
        if self.peer_fin {
            return Ok(0);
        }
        Err(match self.error {
            Some(e) => Blocked::Errno(e),
            None => Blocked::Again,
        })
    }

    /// Sends FIN (once). Would-block if no slot is free now.
    pub fn shutdown_write(&mut self) -> Result<(), Blocked> {
        if self.fin_sent {
            return Ok(());
        }
        self.progress();
        if let Some(e) = self.error {
            return Err(Blocked::Errno(e));
        }
        if self.send_control(K_FIN, &[]) {
            self.fin_sent = true;
            Ok(())
        } else {
            Err(Blocked::Again)
        }
    }

    /// True when no send or write is outstanding.
    pub fn sends_idle(&self) -> bool {
        self.tx_free.len() == TX_SLOTS
    }

    /// Registers `len` octets at `addr` for the peer's RDMA Writes at
    /// `offset` (-1: pick one) and tells the peer. Returns the offset.
    ///
    /// # Safety
    /// The memory must stay valid until [`Conn::unmap`] or the connection
    /// is dropped.
    pub unsafe fn map(&mut self, addr: *mut u8, len: usize, offset: i64) -> Result<u64, Blocked> {
        self.progress();
        if let Some(e) = self.error {
            return Err(Blocked::Errno(e));
        }
        let offset = if offset < 0 {
            self.local_maps
                .iter()
                .map(|m| m.offset + m.len)
                .max()
                .unwrap_or(0)
        } else {
            offset as u64
        };
        if self
            .local_maps
            .iter()
            .any(|m| offset < m.offset + m.len && m.offset < offset + len as u64)
        {
            return Err(Blocked::Errno(libc::EADDRINUSE));
        }
        if self.peer_avail == 0 || self.tx_free.is_empty() {
            return Err(Blocked::Again);
        }
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        // The caller keeps `addr..addr+len` valid until unmapped; `unmap`
        // and Drop deregister before that ends.
        // SAFETY: see above.
        let stag = unsafe {
            self.ctx
                .registry()
                .register(addr, len, addr as u64, access, self.pd)
        }
        .map_err(|_| Blocked::Errno(libc::EINVAL))?;
        let mut body = [0u8; 28];
        body[0..8].copy_from_slice(&offset.to_le_bytes());
        body[8..16].copy_from_slice(&(addr as u64).to_le_bytes());
        body[16..24].copy_from_slice(&(len as u64).to_le_bytes());
        body[24..28].copy_from_slice(&stag.to_le_bytes());
        if !self.send_control(K_IOMAP, &body) {
            self.ctx.registry().deregister(stag);
            return Err(self.error.map_or(Blocked::Again, Blocked::Errno));
        }
        self.local_maps.push(LocalMap {
            addr: addr as u64,
            len: len as u64,
            offset,
            stag,
        });
        Ok(offset)
    }

    /// Removes the mapping of the buffer at `addr` (`riounmap`), telling
    /// the peer first; would-block while that message cannot be sent (no
    /// send slot or peer credit now). On a failed connection the mapping
    /// goes without a word.
    pub fn unmap(&mut self, addr: u64) -> Result<(), Blocked> {
        self.progress();
        let Some(i) = self.local_maps.iter().position(|m| m.addr == addr) else {
            return Err(Blocked::Errno(libc::EINVAL));
        };
        let m = self.local_maps[i];
        let told = self.error.is_some() || self.send_control(K_IOUNMAP, &m.offset.to_le_bytes());
        if !told && self.error.is_none() {
            return Err(Blocked::Again);
        }
        self.local_maps.remove(i);
        self.ctx.registry().deregister(m.stag);
        Ok(())
    }

    /// RDMA-Writes up to `data.len()` octets into the peer's mapping at
    /// `offset`; returns how many were queued.
    pub fn iowrite(&mut self, data: &[u8], offset: u64) -> Result<usize, Blocked> {
        self.progress();
        if let Some(e) = self.error {
            return Err(Blocked::Errno(e));
        }
        let Some(m) = self
            .remote_maps
            .iter()
            .find(|m| offset >= m.offset && offset + data.len() as u64 <= m.offset + m.len)
            .copied()
        else {
            return Err(Blocked::Errno(libc::EINVAL));
        };
        let mut done = 0;
        while done < data.len() {
            let Some(slot) = self.tx_free.pop() else {
                break;
            };
            let n = (data.len() - done).min(SLOT);
            let off = slot * SLOT;
            self.tx
                .slice_mut(off, n)
                .copy_from_slice(&data[done..done + n]);
            let remote = m.addr + (offset - m.offset) + done as u64;
            // The range's last octet goes in a Write of its own, after the
            // rest (module docs).
            let split = done + n == data.len() && n > 1;
            let mut pieces = [(0, n, WR_SEND | slot as u64), (0, 0, 0)];
            if split {
                pieces = [(0, n - 1, WR_PART), (n - 1, 1, WR_SEND | slot as u64)];
            }
            let mut posted = 0;
            for &(at, len, wr_id) in pieces.iter().filter(|p| p.1 > 0) {
                let wr = SendWr {
                    wr_id,
                    op: SendOp::Write {
                        remote_addr: remote + at as u64,
                        rkey: m.rkey,
                        imm: None,
                    },
                    payload: Payload::Sgl(SgList::single(
                        self.tx.addr(off + at),
                        len as u32,
                        self.tx.stag,
                    )),
                    flags: SendFlags {
                        signaled: true,
                        ..SendFlags::default()
                    },
                };
                if self.qp.post_send(wr).is_err() {
                    break;
                }
                posted += 1;
            }
            if posted < 1 + usize::from(split) {
                // A first piece already posted still reads the slot: it
                // stays taken then (the connection is failing anyway).
                if posted == 0 {
                    self.tx_free.push(slot);
                }
                self.error.get_or_insert(libc::ECONNRESET);
                break;
            }
            done += n;
        }
        if done == 0 {
            return Err(self.error.map_or(Blocked::Again, Blocked::Errno));
        }
        Ok(done)
    }

    /// Disconnects the QP (outstanding work is flushed).
    pub fn disconnect(&self) {
        self.qp.disconnect();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.qp.disconnect();
        for m in self.local_maps.drain(..) {
            self.ctx.registry().deregister(m.stag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_bounds() {
        let mut b = [0u8; 40];
        let h = Header {
            kind: K_DATA,
            credits: 7,
            len: 24,
        };
        h.encode(&mut b);
        assert_eq!(Header::decode(&b), Some(h));
        // A length past the message is refused.
        assert_eq!(Header::decode(&b[..30]), None);
        assert_eq!(Header::decode(&b[..4]), None);
    }
}
