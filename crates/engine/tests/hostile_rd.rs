//! Hostile input aimed at a live RD queue pair over real UDP on 127.0.0.1
//! (`docs/datagram.md` §9–§11). The UD QP's hostile test is in `dgram.rs`.
//!
//! The target RD QP's memory regions sit between `PROT_NONE` guard pages
//! (a stray write or read outside a registered region faults and kills the
//! test): receive buffers ending exactly at a guard page, a region open to
//! remote writes, reads and atomics, one registered for local writes only
//! and one for remote reads only.
//!
//! 1. A real exchange with the target, run by a sans-IO RD QP in this
//!    process over a plain UDP socket (Sends with and without immediate,
//!    several segments, RDMA Write, Write-Record, RDMA Read, fetch-and-add,
//!    compare-and-swap, and access violations that the target answers with
//!    Terminates) gives the seeds: every datagram of it, both ways.
//! 2. 20 000 hostile datagrams (seeded, deterministic): random octets;
//!    mutated seeds (bit flips in the shim and the segment, truncation,
//!    extension, opcodes, DDP flags, STags, tagged offsets, MSN / T-MSN,
//!    MO / T-MO, Read sizes and sources, sequence numbers and epochs);
//!    most are then made deliverable (the shim of a SYN at PSN 0 of a fresh
//!    session from a new source QP, addressed to the target) and given a
//!    correct CRC, so they reach the RDMAP/DDP checks behind the
//!    reliability layer; bursts of mutated segments with consecutive PSNs
//!    of one session exercise the message state (segments out of place,
//!    messages never finished, orphans from the middle of a message).
//! 3. Afterwards a legitimate peer (a fresh sans-IO QP) runs a real
//!    exchange with the target: every request succeeds and the data is
//!    exact. Nothing was written to the local-only or read-only regions,
//!    and the target's counters show the storm reached every layer.
//!
//! Bounded: the storm takes a few seconds; the test gives up after 30 s.

use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use softrdma_engine::dgram::ProtoStats;
use softrdma_engine::{Completion, Context, Cq, DgramQpHandle, QpCaps, RdOptions, RdQpCounters};
use softrdma_proto::memory::{Access, VecMemory};
use softrdma_proto::rd::RdConfig;
use softrdma_proto::rdqp::{RdQp, RdQpConfig};
use softrdma_proto::ud::DatagramSink;
use softrdma_proto::wr::{
    DgramAddr, Payload, RecvWr, SendFlags, SendOp, SendWr, SgList, WcOpcode, WcStatus,
    WorkCompletion,
};
use softrdma_wire::datagram;

/// The whole test's time limit.
const LIMIT: Duration = Duration::from_secs(30);
const ROUNDS: u32 = 20_000;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..len).map(|_| r.next() as u8).collect()
}

// ----------------------------------------------------------------------
// Guarded memory
// ----------------------------------------------------------------------

const PAGE: usize = 4096;

/// Memory with an inaccessible guard page on each side; the usable part
/// ends exactly at the upper guard page.
struct Guarded {
    base: *mut u8,
    total: usize,
    len: usize,
}

impl Guarded {
    fn new(len: usize) -> Guarded {
        let body = len.div_ceil(PAGE) * PAGE;
        let total = body + 2 * PAGE;
        // SAFETY: anonymous private mapping, no file; checked for failure.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as *mut u8;
        // SAFETY: both guard pages lie inside the mapping made above.
        unsafe {
            assert_eq!(
                libc::mprotect(base as *mut libc::c_void, PAGE, libc::PROT_NONE),
                0
            );
            assert_eq!(
                libc::mprotect(
                    base.add(PAGE + body) as *mut libc::c_void,
                    PAGE,
                    libc::PROT_NONE
                ),
                0
            );
        }
        Guarded { base, total, len }
    }

    fn ptr(&self) -> *mut u8 {
        let body = self.total - 2 * PAGE;
        // SAFETY: inside the mapping (the usable part ends at the upper
        // guard page).
        unsafe { self.base.add(PAGE + body - self.len) }
    }

    fn addr(&self, off: usize) -> u64 {
        self.ptr() as u64 + off as u64
    }

    fn bytes(&self) -> Vec<u8> {
        // SAFETY: the usable range is mapped read/write.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len).to_vec() }
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: inside the usable range, which is mapped read/write; the
        // engine does not touch this range while the test writes it.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr().add(off), data.len()) }
    }

    fn register(&self, ctx: &Context, pd: u32, access: Access) -> u32 {
        // SAFETY: the mapping outlives the context's use of it (the
        // Guarded values are dropped after the context).
        unsafe {
            ctx.registry()
                .register(self.ptr(), self.len, self.ptr() as u64, access, pd)
        }
        .unwrap()
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.total) };
    }
}

// ----------------------------------------------------------------------
// A sans-IO RD QP on a plain socket: the seeds and the legitimate peer
// ----------------------------------------------------------------------

struct SockSink<'a> {
    sock: &'a UdpSocket,
    sent: &'a mut Vec<Vec<u8>>,
}

impl DatagramSink for SockSink<'_> {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let d: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        self.sock.send_to(&d, SocketAddr::from(dest))?;
        self.sent.push(d);
        Ok(())
    }
}

const PEER_BASE: u64 = 0x5000_0000;
const PEER_LEN: usize = 1 << 16;

/// An RD QP run by the test over a plain UDP socket.
struct Peer {
    sock: UdpSocket,
    qp: RdQp,
    mem: VecMemory,
    stag: u32,
    /// Every datagram sent and received.
    seen: Vec<Vec<u8>>,
}

impl Peer {
    fn new(seed: u64) -> Peer {
        let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
        let qpn = u32::from(sock.local_addr().unwrap().port()) << 8 | 1;
        let mut mem = VecMemory::new();
        let stag = mem.register(0, PEER_BASE, PEER_LEN, Access::LOCAL_WRITE);
        mem.bytes_mut(stag)
            .copy_from_slice(&pattern(seed, PEER_LEN));
        let cfg = RdQpConfig {
            qpn,
            mtu: 1500,
            rd: RdConfig {
                epoch_seed: seed as u32 | 1,
                ..RdConfig::default()
            },
            ..RdQpConfig::default()
        };
        Peer {
            sock,
            qp: RdQp::new(cfg, Instant::now()).unwrap(),
            mem,
            stag,
            seen: Vec::new(),
        }
    }

    fn sgl(&self, off: usize, len: usize) -> Payload {
        Payload::Sgl(SgList::single(
            PEER_BASE + off as u64,
            len as u32,
            self.stag,
        ))
    }

    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        &self.mem.bytes(self.stag)[off..off + len]
    }

    /// Posts `ops` to `to` and runs the exchange until they all complete;
    /// returns their completions (posting order).
    fn run(&mut self, to: DgramAddr, ops: Vec<(SendOp, Payload)>) -> Vec<WorkCompletion> {
        let n = ops.len();
        for (k, (op, payload)) in ops.into_iter().enumerate() {
            let wr = SendWr {
                wr_id: k as u64,
                op,
                payload,
                flags: SendFlags {
                    signaled: true,
                    ..Default::default()
                },
            };
            self.qp.post_send_at(wr, to, Instant::now()).unwrap();
        }
        let mut done = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 65536];
        while done.len() < n {
            assert!(
                Instant::now() < deadline,
                "exchange stuck: {done:?}, {:?}",
                self.qp.stats()
            );
            let now = Instant::now();
            if self.qp.poll_timeout().is_some_and(|t| t <= now) {
                self.qp.handle_timeout(now);
            }
            let mut sink = SockSink {
                sock: &self.sock,
                sent: &mut self.seen,
            };
            self.qp.poll_transmit_at(&self.mem, &mut sink, now).unwrap();
            if let Ok((len, from)) = self.sock.recv_from(&mut buf) {
                let d = buf[..len].to_vec();
                self.qp
                    .handle_datagram(from.ip(), from.port(), &d, &mut self.mem, Instant::now());
                self.seen.push(d);
            }
            while let Some((_, wc)) = self.qp.poll_completion() {
                done.push(wc);
            }
        }
        done.sort_by_key(|wc| wc.wr_id);
        done
    }
}

// ----------------------------------------------------------------------
// The target
// ----------------------------------------------------------------------

/// Short RD timers, so hostile sessions that owe retransmissions fail and
/// expire within the test.
fn fast_rd() -> RdConfig {
    RdConfig {
        rto_min: Duration::from_millis(20),
        rto_initial: Duration::from_millis(20),
        rto_max: Duration::from_millis(100),
        retry_limit: 4,
        max_datagram_lifetime: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(2),
        ..RdConfig::default()
    }
}

struct Target {
    ctx: Context,
    pd: u32,
    cq: Arc<Cq>,
    qp: DgramQpHandle,
}

fn target() -> Target {
    let ctx = Context::new().unwrap();
    let pd = ctx.alloc_pd();
    let cq = ctx.create_cq(4096, None);
    let qp = ctx
        .create_rd_qp(
            pd,
            QpCaps::default(),
            cq.clone(),
            cq.clone(),
            RdOptions {
                proto: RdQpConfig {
                    rd: fast_rd(),
                    ..RdQpConfig::default()
                },
                mtu: Some(1500),
                bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                self_driven: false,
            },
        )
        .unwrap();
    Target { ctx, pd, cq, qp }
}

fn counters(qp: &DgramQpHandle) -> RdQpCounters {
    let ProtoStats::Rd(c) = qp.stats().proto else {
        panic!("not an RD QP")
    };
    c
}

fn blank() -> Completion {
    Completion {
        wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
        qp_num: 0,
    }
}

fn drain(cq: &Cq) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut buf = [blank(); 64];
    loop {
        let k = cq.poll(&mut buf);
        if k == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..k]);
    }
}

// ----------------------------------------------------------------------
// Mutations
// ----------------------------------------------------------------------

/// Offsets of the 32-bit fields worth rewriting: DDP/RDMAP header words
/// after the 26-octet shim (STag / RsvdULP, TO or QN/MSN, T-MSN / MO,
/// T-MO / DQPN, DQPN, and the Read Request / Atomic parts).
const FIELDS: [usize; 12] = [28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72];

struct Mutator {
    rng: Rng,
    /// STags worth trying (the target's regions) and addresses near them.
    stags: Vec<u32>,
    addrs: Vec<u64>,
    target_qpn: u32,
    next_sqpn: u32,
}

impl Mutator {
    fn value(&mut self) -> u32 {
        match self.rng.below(6) {
            0 => self.stags[self.rng.below(self.stags.len() as u64) as usize],
            1 => {
                let a = self.addrs[self.rng.below(self.addrs.len() as u64) as usize];
                let a = a.wrapping_add(self.rng.below(64)).wrapping_sub(32);
                if self.rng.chance(50) {
                    a as u32
                } else {
                    (a >> 32) as u32
                }
            }
            2 => [0, 1, 2, 0xFFFF_FFFF, 0x8000_0000, 1420, 1416, 65536][self.rng.below(8) as usize],
            _ => self.rng.next() as u32,
        }
    }

    /// Bit flips, truncation, extension and field rewrites.
    fn mutate(&mut self, d: &mut Vec<u8>) {
        for _ in 0..1 + self.rng.below(4) {
            match self.rng.below(10) {
                0 if !d.is_empty() => {
                    let n = self.rng.below(d.len() as u64) as usize;
                    d.truncate(n);
                }
                1 => d.extend((0..self.rng.below(64)).map(|_| self.rng.next() as u8)),
                2 | 3 if d.len() > 27 => {
                    // Opcode and DDP control bits.
                    if self.rng.chance(50) {
                        d[27] = 0x40 | (self.rng.below(16) as u8);
                    } else {
                        d[26] ^= [0x80, 0x40, 0x20, 0x10, 0x0C][self.rng.below(5) as usize];
                    }
                }
                4..=6 => {
                    let at = FIELDS[self.rng.below(FIELDS.len() as u64) as usize];
                    if d.len() >= at + 4 {
                        let v = self.value();
                        d[at..at + 4].copy_from_slice(&v.to_be_bytes());
                    }
                }
                _ if !d.is_empty() => {
                    // Header octets more often than payload ones.
                    let span = if self.rng.chance(60) {
                        d.len().min(80)
                    } else {
                        d.len()
                    };
                    let i = self.rng.below(span as u64) as usize;
                    d[i] ^= 1 << self.rng.below(8);
                }
                _ => {}
            }
        }
    }

    /// Makes `d` the data datagram `psn` of session `epoch` from source QP
    /// `sqpn` to the target, with SYN (delivered unless it is out of
    /// order).
    fn deliverable(&mut self, d: &mut Vec<u8>, sqpn: u32, epoch: u32, psn: u32) {
        if d.len() < 30 {
            d.resize(30, 0);
        }
        d[0] = 0x52;
        d[1..4].copy_from_slice(&self.target_qpn.to_be_bytes()[1..]);
        let mut flags = 0x80 | 0x40;
        if self.rng.chance(10) {
            flags |= 0x04;
        }
        d[4] = flags;
        d[5..8].copy_from_slice(&sqpn.to_be_bytes()[1..]);
        d[8..12].copy_from_slice(&epoch.to_be_bytes());
        d[12..16].copy_from_slice(&psn.to_be_bytes());
        // The Q word names the target too (most of the time).
        if d.len() > 27 && d[26] & 0x10 != 0 && self.rng.chance(80) {
            let at = 26
                + if d[26] & 0x80 != 0 {
                    14 + if d[26] & 0x20 != 0 { 8 } else { 0 }
                } else {
                    18
                };
            if d.len() >= at + 8 {
                d[at + 1..at + 4].copy_from_slice(&self.target_qpn.to_be_bytes()[1..]);
            }
        }
    }

    fn fresh_sqpn(&mut self) -> u32 {
        self.next_sqpn = (self.next_sqpn + 1) & 0x00FF_FFFF;
        self.next_sqpn
    }
}

fn fix_crc(d: &mut [u8]) {
    if d.len() >= 4 {
        let n = d.len();
        let t = datagram::trailer(&d[..n - 4], &[]);
        d[n - 4..].copy_from_slice(&t);
    }
}

// ----------------------------------------------------------------------
// The test
// ----------------------------------------------------------------------

const RW: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

#[test]
fn hostile_datagrams_at_an_rd_qp_never_escape_registered_memory() {
    let t0 = Instant::now();
    let seed = 0x5eed_4d52;
    let t = target();
    let recv = Guarded::new(6000);
    let open = Guarded::new(8000);
    let local_only = Guarded::new(4096);
    let read_only = Guarded::new(4096);
    let recv_stag = recv.register(&t.ctx, t.pd, Access::LOCAL_WRITE);
    let open_stag = open.register(&t.ctx, t.pd, RW);
    let lo_stag = local_only.register(&t.ctx, t.pd, Access::LOCAL_WRITE);
    let ro_stag = read_only.register(&t.ctx, t.pd, Access::REMOTE_READ);
    open.write(0, &pattern(seed, 8000));
    // Receives ending exactly at the guard page, of odd sizes, as many as
    // the receive queue takes.
    let mut posted = 0u64;
    let post = |n: u64, posted: &mut u64| {
        for _ in 0..n {
            let off = [0u64, 1000, 2999, 5000][(*posted % 4) as usize];
            let wr = RecvWr {
                wr_id: *posted,
                sgl: SgList::single(recv.addr(off as usize), (6000 - off) as u32, recv_stag),
            };
            if t.qp.post_recv(wr).is_err() {
                // The receive queue is full.
                return;
            }
            *posted += 1;
        }
    };
    post(200, &mut posted);
    let dest = t.qp.local_addr();

    // 1. A real exchange: the seeds.
    let mut p = Peer::new(seed);
    let ops = vec![
        (
            SendOp::Send {
                imm: None,
                invalidate: None,
            },
            p.sgl(0, 900),
        ),
        (
            SendOp::Send {
                imm: Some(7),
                invalidate: None,
            },
            p.sgl(0, 2500),
        ),
        (
            SendOp::Write {
                remote_addr: open.addr(1000),
                rkey: open_stag,
                imm: None,
            },
            p.sgl(0, 3000),
        ),
        (
            SendOp::WriteRecord {
                remote_addr: open.addr(4000),
                rkey: open_stag,
            },
            p.sgl(0, 3000),
        ),
        (
            SendOp::Read {
                remote_addr: open.addr(500),
                rkey: open_stag,
            },
            p.sgl(10_000, 2000),
        ),
        (
            SendOp::FetchAdd {
                remote_addr: open.addr(7992),
                rkey: open_stag,
                add: 3,
            },
            p.sgl(20_000, 8),
        ),
        (
            SendOp::CompareSwap {
                remote_addr: open.addr(7992),
                rkey: open_stag,
                compare: 0,
                swap: 1,
            },
            p.sgl(20_008, 8),
        ),
        (
            SendOp::Write {
                remote_addr: read_only.addr(0),
                rkey: ro_stag,
                imm: None,
            },
            p.sgl(0, 100),
        ),
        (
            SendOp::WriteRecord {
                remote_addr: local_only.addr(0),
                rkey: lo_stag,
            },
            p.sgl(0, 100),
        ),
        (
            SendOp::Read {
                remote_addr: read_only.addr(4000),
                rkey: ro_stag,
            },
            p.sgl(30_000, 200),
        ),
    ];
    let wcs = p.run(dest, ops);
    let statuses: Vec<WcStatus> = wcs.iter().map(|w| w.status).collect();
    use WcStatus::{RemAccessErr, Success};
    assert_eq!(
        statuses,
        [
            Success,
            Success,
            Success,
            Success,
            Success,
            Success,
            Success,
            RemAccessErr,
            RemAccessErr,
            RemAccessErr
        ]
    );
    let seeds: Vec<Vec<u8>> = p.seen.clone();
    assert!(seeds.len() >= 15, "{} seeds", seeds.len());
    // Consecutive data datagrams of the peer: runs to replay as sessions.
    let data_seeds: Vec<Vec<u8>> = seeds
        .iter()
        .filter(|d| d.len() > 30 && d[0] == 0x52 && d[4] & 0x80 != 0)
        .cloned()
        .collect();
    drop(p);
    drain(&t.cq);

    // 2. The storm, from one plain socket.
    let plain = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    plain.set_nonblocking(true).unwrap();
    let mut m = Mutator {
        rng: Rng(seed),
        stags: vec![recv_stag, open_stag, lo_stag, ro_stag, 0, 0xFFFF_FFFF],
        addrs: vec![
            recv.addr(0),
            recv.addr(6000),
            open.addr(0),
            open.addr(8000),
            local_only.addr(0),
            read_only.addr(0),
            read_only.addr(4096),
        ],
        target_qpn: dest.qpn,
        next_sqpn: 0x10_0000,
    };
    let send = |d: &[u8]| {
        let _ = plain.send_to(d, (dest.ip, dest.port));
    };
    let mut junk = [0u8; 2048];
    let mut round = 0;
    while round < ROUNDS {
        let kind = m.rng.below(10);
        if kind < 2 {
            // Random octets, a plausible first octet.
            let len = m.rng.below(1600) as usize;
            let mut d: Vec<u8> = (0..len).map(|_| m.rng.next() as u8).collect();
            if let Some(c) = d.first_mut() {
                *c = [0x52, 0x52, 0x41, 0x92, *c][m.rng.below(5) as usize];
            }
            if m.rng.chance(50) {
                fix_crc(&mut d);
            }
            send(&d);
            round += 1;
        } else if kind < 8 {
            // One mutated seed, usually made deliverable.
            let mut d = seeds[m.rng.below(seeds.len() as u64) as usize].clone();
            m.mutate(&mut d);
            if m.rng.chance(80) {
                let (sqpn, epoch) = (m.fresh_sqpn(), m.rng.next() as u32);
                m.deliverable(&mut d, sqpn, epoch, 0);
            }
            if m.rng.chance(90) {
                fix_crc(&mut d);
            }
            send(&d);
            round += 1;
        } else {
            // A session: a run of the peer's data datagrams, some mutated,
            // some left out, with consecutive PSNs.
            let start = m.rng.below(data_seeds.len() as u64) as usize;
            let len = 2 + m.rng.below(8) as usize;
            let (sqpn, epoch) = (m.fresh_sqpn(), m.rng.next() as u32);
            let mut psn = 0;
            for d in data_seeds.iter().skip(start).take(len) {
                if m.rng.chance(15) {
                    continue;
                }
                let mut d = d.clone();
                if m.rng.chance(40) {
                    m.mutate(&mut d);
                }
                m.deliverable(&mut d, sqpn, epoch, psn);
                fix_crc(&mut d);
                send(&d);
                psn += 1;
                round += 1;
            }
        }
        if round % 64 == 0 {
            // Let the target keep up (a full socket buffer only drops), and
            // throw its answers away.
            thread::sleep(Duration::from_millis(1));
            while plain.recv_from(&mut junk).is_ok() {}
            for c in drain(&t.cq) {
                if c.wc.opcode == WcOpcode::Recv {
                    post(1, &mut posted);
                }
            }
        }
        assert!(t0.elapsed() < LIMIT, "storm too slow: round {round}");
    }
    let storm = t0.elapsed();
    // Hostile messages left unfinished hold the receives they claimed
    // until their (hostile) peers expire: idle_timeout, then the receives
    // return to the queue. Meanwhile consumed receives are re-posted.
    let quiet = Instant::now() + fast_rd().idle_timeout + Duration::from_millis(700);
    while Instant::now() < quiet {
        thread::sleep(Duration::from_millis(50));
        while plain.recv_from(&mut junk).is_ok() {}
        for c in drain(&t.cq) {
            if c.wc.opcode == WcOpcode::Recv {
                post(1, &mut posted);
            }
        }
    }

    // 3. A legitimate peer: everything works, the data is exact (the Send
    // fits the smallest receive).
    let mut good = Peer::new(seed ^ 0xabcd);
    let before = open.bytes();
    let send_data = good.bytes(100, 900).to_vec();
    let write_data = good.bytes(5000, 2000).to_vec();
    let ops = vec![
        (
            SendOp::Send {
                imm: Some(0xC0FFEE),
                invalidate: None,
            },
            good.sgl(100, 900),
        ),
        (
            SendOp::Write {
                remote_addr: open.addr(2000),
                rkey: open_stag,
                imm: None,
            },
            good.sgl(5000, 2000),
        ),
        (
            SendOp::Read {
                remote_addr: open.addr(2000),
                rkey: open_stag,
            },
            good.sgl(40_000, 2000),
        ),
        (
            SendOp::FetchAdd {
                remote_addr: open.addr(16),
                rkey: open_stag,
                add: 5,
            },
            good.sgl(50_000, 8),
        ),
    ];
    let wcs = good.run(dest, ops);
    assert!(
        wcs.iter().all(|w| w.status == WcStatus::Success),
        "the QP stopped working for a legitimate peer: {wcs:?} {:?}",
        counters(&t.qp)
    );
    assert_eq!(
        good.bytes(40_000, 2000),
        &write_data[..],
        "Read after Write"
    );
    let old = u64::from_ne_bytes(before[16..24].try_into().unwrap());
    assert_eq!(
        u64::from_ne_bytes(good.bytes(50_000, 8).try_into().unwrap()),
        old,
        "fetch-and-add original value"
    );
    let after = open.bytes();
    assert_eq!(
        u64::from_ne_bytes(after[16..24].try_into().unwrap()),
        old.wrapping_add(5)
    );
    // The Send arrived whole into a posted receive.
    let deadline = Instant::now() + Duration::from_secs(5);
    'found: loop {
        assert!(Instant::now() < deadline, "legitimate Send not received");
        for c in drain(&t.cq) {
            if c.wc.imm == Some(0xC0FFEE) {
                assert_eq!((c.wc.status, c.wc.byte_len), (WcStatus::Success, 900));
                let off = [0usize, 1000, 2999, 5000][(c.wc.wr_id % 4) as usize];
                assert_eq!(&recv.bytes()[off..off + 900], &send_data[..]);
                break 'found;
            }
        }
        thread::sleep(Duration::from_millis(1));
    }

    assert!(
        local_only.bytes().iter().all(|&x| x == 0),
        "a LOCAL_WRITE-only region was written remotely"
    );
    assert!(
        read_only.bytes().iter().all(|&x| x == 0),
        "a REMOTE_READ region was written"
    );
    let c = counters(&t.qp);
    let q = c.qp;
    eprintln!(
        "hostile_rd: {ROUNDS} datagrams in {storm:?}; bad_crc={} malformed={} not_rd={} \
         not_delivered={} access_errors={} orphans={} skipped={} inconsistent={} \
         terminates_sent={} read_requests={} atomics={} unmatched_responses={} \
         unmatched_terminates={} rd delivered={} resets_sent={} peers_failed={}",
        q.rx_bad_crc,
        q.rx_malformed,
        q.rx_not_rd,
        q.rx_not_delivered,
        q.rx_access_errors,
        q.rx_orphan_segments,
        q.rx_skipped,
        q.rx_inconsistent,
        q.terminates_sent,
        q.rx_read_requests,
        q.rx_atomics,
        q.rx_unmatched_responses,
        q.rx_unmatched_terminates,
        c.rd.delivered,
        c.rd.resets_sent,
        c.rd.peers_failed,
    );
    // The storm reached every layer: the CRC, the shim, the reliability
    // layer, and behind it the RDMAP/DDP checks.
    assert!(q.rx_bad_crc > 0 && q.rx_malformed > 0, "{q:?}");
    assert!(c.rd.delivered > 1000, "{:?}", c.rd);
    assert!(q.rx_access_errors > 0 && q.terminates_sent > 0, "{q:?}");
    assert!(q.rx_orphan_segments > 0 && q.rx_inconsistent > 0, "{q:?}");
    assert!(q.rx_read_requests > 0 && q.rx_atomics > 0, "{q:?}");
    assert!(t0.elapsed() < LIMIT, "took {:?}", t0.elapsed());
    drop(t);
}
