//! `EXS_DGRAM_WR`: the receive rings of a datagram descriptor whose
//! datagrams are RDMA Write-Records (the ring protocol of
//! `docs/exs.md`, "Datagram sockets"). [`crate::dgram`] owns the QP and
//! the buffers; this module keeps the rings this descriptor granted its
//! writers, the rings its peers granted it, and the counters, and says
//! which control messages to send.
//!
//! Control messages are UD Sends tagged by their immediate data
//! ([`imm`]): a datagram (the payload is the datagram, delivered as
//! usual) whose sender asks for a ring ([`K_HELLO`]) or for credit
//! ([`K_ASK`]), and, never delivered, a grant ([`K_GRANT`]: rkey, ring
//! address, slots, records consumed; zero slots refuses) or a credit
//! ([`K_CREDIT`]: rkey, records consumed). A record is an 8-octet header
//! (`b"EW"`, two zero octets, the sequence number, big endian) and the
//! datagram, written into slot `seq % slots` of the ring.
//!
//! The protocol is the sockets interposer's Write-Record protocol
//! (`sockets-core`'s `udp` module) without its per-message UD header:
//! an EXS descriptor's address names its QP, and the tags ride in the
//! immediate data, so an untagged UD Send is an ordinary datagram and a
//! `EXS_DGRAM_UD` peer receives a Write-Record sender's fallback Sends
//! unchanged.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use softrdma_verbs::dgram::{PartialAction, RecordConfig, RecordMode};
use softrdma_verbs::{
    Access, AddressHandle, DgramAddr, MemoryRegion, UdQueuePair, WcStatus, WorkCompletion,
};

use crate::dgram::MAX_DGRAM;

/// Octets of a record's header.
pub const HDR: usize = 8;
/// Octets of a ring slot: a header and the largest datagram.
pub const SLOT: usize = HDR + MAX_DGRAM;
/// Slots of the ring one writer writes into.
pub const RING_SLOTS: u32 = 8;
/// Rings of a descriptor (the writers it serves by Write-Record; others
/// are refused and send UD Sends).
pub const RINGS: usize = 4;
/// A datagram whose sender asks for a ring.
pub const K_HELLO: u8 = 1;
/// A ring granted (20 octets: rkey, address, slots, consumed).
pub const K_GRANT: u8 = 2;
/// Credit (8 octets: rkey, consumed).
pub const K_CREDIT: u8 = 3;
/// A datagram whose sender is out of credit.
pub const K_ASK: u8 = 4;
/// The immediate data's upper 24 bits on a tagged message (`"EXW"`).
const MAGIC: u32 = 0x4558_5700;
/// Least time between two requests of a writer to one peer.
const ASK_EVERY: Duration = Duration::from_millis(2);
/// How long a refused writer sends UD Sends before it asks again.
const REFUSED: Duration = Duration::from_secs(1);
/// How long a record missing segments waits before it is delivered as
/// its placed prefix.
pub const PARTIAL_TIMEOUT: Duration = Duration::from_millis(100);
/// A ring whose writer is out of credit with none of its records queued
/// and none completed for this long is re-keyed.
const STUCK: Duration = Duration::from_millis(200);

/// The immediate data tagging a message of `kind`.
pub fn imm(kind: u8) -> u32 {
    MAGIC | u32::from(kind)
}

/// The kind a message's immediate data tags, if any.
pub fn kind(imm: Option<u32>) -> Option<u8> {
    imm.filter(|v| v & !0xff == MAGIC)
        .map(|v| (v & 0xff) as u8)
        .filter(|k| (K_HELLO..=K_ASK).contains(k))
}

/// The record settings of a Write-Record descriptor's UD QP.
pub fn record_config() -> RecordConfig {
    RecordConfig {
        mode: RecordMode::Cq,
        partial_timeout: PARTIAL_TIMEOUT,
        partial_action: PartialAction::Deliver,
        ..RecordConfig::default()
    }
}

/// Datagram counters of a descriptor (`EXS_F_GETDGRAMSTAT`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Datagrams sent as Write-Records.
    pub records_out: u64,
    /// Datagrams received as Write-Records (whole or partial).
    pub records_in: u64,
    /// Of those, delivered as their placed prefix.
    pub records_partial: u64,
    /// Datagrams sent as UD (RD) Sends.
    pub sends_out: u64,
    /// Datagrams received as UD (RD) Sends.
    pub sends_in: u64,
}

/// A control message to send: where, its kind, its body.
pub type Ctl = (AddressHandle, u8, Vec<u8>);

/// A receive ring one writer writes its records into.
struct Ring {
    mr: MemoryRegion,
    /// The writer's QP (IP, QPN): only its records are taken.
    owner: (IpAddr, u32),
    ah: AddressHandle,
    /// The writer's descriptor address (the receive's source).
    from: SocketAddr,
    /// One past the highest sequence number consumed.
    consumed: u32,
    /// `consumed` as last sent.
    credited: u32,
    /// Records of the ring waiting for a receive.
    queued: usize,
    /// The last record completion (or grant).
    last: Instant,
}

/// A ring a peer granted this descriptor.
struct Grant {
    rkey: u32,
    base: u64,
    slots: u32,
    /// The next record's sequence number.
    next: u32,
    /// Records may be written while `next` is below this.
    upto: u32,
}

/// How a datagram goes out.
pub enum Plan {
    /// A Write-Record of header and datagram.
    Record {
        /// Target address (the slot).
        remote_addr: u64,
        /// The ring's rkey.
        rkey: u32,
        /// The record's header.
        hdr: [u8; HDR],
    },
    /// A UD Send with this immediate data (a request) or none.
    Send(Option<u32>),
}

/// A record received: ring, slot offset, sequence number, datagram
/// length, octets of it placed, source.
pub struct Record {
    /// Ring index.
    pub ring: usize,
    /// Offset of the slot in the ring's region.
    pub off: usize,
    /// Sequence number.
    pub seq: u32,
    /// The datagram's length.
    pub len: usize,
    /// Octets placed from its start (less than `len`: partial).
    pub avail: usize,
    /// The writer's address.
    pub from: SocketAddr,
}

/// The Write-Record state of a descriptor.
pub struct Wr {
    rings: Vec<Option<Ring>>,
    grants: HashMap<SocketAddr, Grant>,
    asked: HashMap<SocketAddr, Instant>,
}

impl Default for Wr {
    fn default() -> Self {
        Wr {
            rings: (0..RINGS).map(|_| None).collect(),
            grants: HashMap::new(),
            asked: HashMap::new(),
        }
    }
}

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// `a` is after `b` in sequence space.
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// A refusal (a grant of zero slots).
pub fn refusal(ah: AddressHandle) -> Ctl {
    (ah, K_GRANT, vec![0; 20])
}

impl Wr {
    /// How the next datagram to `dest` goes: a record while a ring with
    /// credit is granted, else a UD Send, tagged (at most every 2 ms) to
    /// ask for a ring or for credit.
    pub fn plan(&mut self, dest: SocketAddr) -> Plan {
        let dest = SocketAddr::new(dest.ip().to_canonical(), dest.port());
        if let Some(g) = self.grants.get_mut(&dest).filter(|g| after(g.upto, g.next)) {
            let seq = g.next;
            g.next = seq.wrapping_add(1);
            let mut hdr = [0u8; HDR];
            hdr[..2].copy_from_slice(b"EW");
            hdr[4..].copy_from_slice(&seq.to_be_bytes());
            return Plan::Record {
                remote_addr: g.base + u64::from(seq % g.slots) * SLOT as u64,
                rkey: g.rkey,
                hdr,
            };
        }
        let now = Instant::now();
        if self.asked.get(&dest).is_some_and(|t| now < *t) {
            return Plan::Send(None);
        }
        self.asked.insert(dest, now + ASK_EVERY);
        let k = if self.grants.contains_key(&dest) {
            K_ASK
        } else {
            K_HELLO
        };
        Plan::Send(Some(imm(k)))
    }

    /// A record could not be posted: its sequence number is not used.
    pub fn unplan(&mut self, dest: SocketAddr, seq: u32) {
        let dest = SocketAddr::new(dest.ip().to_canonical(), dest.port());
        if let Some(g) = self.grants.get_mut(&dest) {
            if g.next == seq.wrapping_add(1) {
                g.next = seq;
            }
        }
    }

    /// A grant or credit from the peer `at` (a descriptor this one
    /// writes to).
    pub fn control(&mut self, at: DgramAddr, kind: u8, b: &[u8]) {
        let key = SocketAddr::new(at.ip.to_canonical(), at.port);
        let need = if kind == K_GRANT { 20 } else { 8 };
        if b.len() < need {
            return;
        }
        let rkey = be32(b, 0);
        if kind == K_CREDIT {
            if let Some(g) = self.grants.get_mut(&key).filter(|g| g.rkey == rkey) {
                let upto = be32(b, 4).wrapping_add(g.slots);
                if after(upto, g.upto) {
                    g.upto = upto;
                }
            }
            return;
        }
        let base = u64::from_be_bytes(b[4..12].try_into().unwrap_or([0; 8]));
        let (slots, consumed) = (be32(b, 12), be32(b, 16));
        if slots == 0 || slots > RING_SLOTS * 64 {
            // Refused: UD Sends, asking again later.
            self.grants.remove(&key);
            self.asked.insert(key, Instant::now() + REFUSED);
            return;
        }
        match self.grants.get_mut(&key) {
            Some(g) if g.rkey == rkey => {
                let upto = consumed.wrapping_add(slots);
                if after(upto, g.upto) {
                    g.upto = upto;
                }
            }
            _ => {
                self.grants.insert(
                    key,
                    Grant {
                        rkey,
                        base,
                        slots,
                        next: consumed,
                        upto: consumed.wrapping_add(slots),
                    },
                );
            }
        }
    }

    /// A writer's request (hello or ask) on a datagram from QP `at`,
    /// descriptor `from`: a grant, a credit, a re-keyed ring, or a
    /// refusal into `out`.
    pub fn request(
        &mut self,
        qp: &UdQueuePair,
        at: DgramAddr,
        from: SocketAddr,
        kind: u8,
        out: &mut Vec<Ctl>,
    ) {
        let owner = (at.ip.to_canonical(), at.qpn);
        let known = self
            .rings
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.owner == owner));
        let Some(i) = known else {
            let Ok(ah) = qp.pd().create_ah(at) else {
                return;
            };
            let free = self.rings.iter().position(Option::is_none);
            let (Some(i), Ok(mr)) = (free, ring_region(qp)) else {
                out.push(refusal(ah));
                return;
            };
            self.rings[i] = Some(Ring {
                mr,
                owner,
                ah,
                from,
                consumed: 0,
                credited: 0,
                queued: 0,
                last: Instant::now(),
            });
            self.grant(i, out);
            return;
        };
        let Some(r) = self.rings[i].as_mut() else {
            return;
        };
        if kind == K_HELLO {
            self.grant(i, out);
        } else if r.queued == 0 && r.last.elapsed() >= STUCK {
            // Out of credit, nothing queued, nothing completed for a
            // while: its records in flight were lost. A new region (a new
            // rkey), so nothing late lands in it, and a new grant.
            let Ok(mr) = ring_region(qp) else {
                return;
            };
            let old = std::mem::replace(&mut r.mr, mr);
            r.last = Instant::now();
            qp.record_forget(&old);
            self.grant(i, out);
        } else {
            self.credit(i, out);
        }
    }

    fn grant(&mut self, i: usize, out: &mut Vec<Ctl>) {
        let Some(r) = self.rings[i].as_mut() else {
            return;
        };
        let mut b = vec![0u8; 20];
        b[..4].copy_from_slice(&r.mr.rkey().to_be_bytes());
        b[4..12].copy_from_slice(&r.mr.addr().to_be_bytes());
        b[12..16].copy_from_slice(&RING_SLOTS.to_be_bytes());
        b[16..20].copy_from_slice(&r.consumed.to_be_bytes());
        r.credited = r.consumed;
        out.push((r.ah.clone(), K_GRANT, b));
    }

    fn credit(&mut self, i: usize, out: &mut Vec<Ctl>) {
        let Some(r) = self.rings[i].as_mut() else {
            return;
        };
        let mut b = vec![0u8; 8];
        b[..4].copy_from_slice(&r.mr.rkey().to_be_bytes());
        b[4..].copy_from_slice(&r.consumed.to_be_bytes());
        r.credited = r.consumed;
        out.push((r.ah.clone(), K_CREDIT, b));
    }

    /// A Write-Record completion: the datagram in a ring slot, whole or
    /// its placed prefix; `None` when it is not one of ours or its
    /// header is lost.
    pub fn record(&mut self, wc: &WorkCompletion, stats: &mut Stats) -> Option<Record> {
        let (info, src) = (wc.record?, wc.src?);
        let i = self
            .rings
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.mr.rkey() == info.stag))?;
        let r = self.rings[i].as_mut()?;
        if (src.ip.to_canonical(), src.qpn) != r.owner {
            return None;
        }
        let off = info.to.wrapping_sub(r.mr.addr()) as usize;
        let len = info.len as usize;
        if !off.is_multiple_of(SLOT) || off / SLOT >= RING_SLOTS as usize || len > SLOT {
            return None;
        }
        let prefix = match wc.status {
            WcStatus::Success => len,
            WcStatus::RecordPartial => info.ranges[..usize::from(info.n_ranges)]
                .iter()
                .find(|(o, _)| *o == 0)
                .map_or(0, |(_, l)| *l as usize),
            _ => 0,
        };
        let mut h = [0u8; HDR];
        if prefix < HDR || len < HDR || r.mr.read_at(off, &mut h).is_err() || h[..2] != *b"EW" {
            return None;
        }
        r.queued += 1;
        r.last = Instant::now();
        stats.records_in += 1;
        if wc.status != WcStatus::Success {
            stats.records_partial += 1;
        }
        Some(Record {
            ring: i,
            off,
            seq: be32(&h, 4),
            len: len - HDR,
            avail: prefix.min(len) - HDR,
            from: r.from,
        })
    }

    /// Copies octets `[at, at + dst.len())` of the datagram in ring
    /// `ring`'s slot at `off`.
    pub fn read(&self, ring: usize, off: usize, at: usize, dst: &mut [u8]) {
        if let Some(r) = self.rings.get(ring).and_then(Option::as_ref) {
            let _ = r.mr.read_at(off + HDR + at, dst);
        }
    }

    /// The application is done with record `seq` of ring `ring`: it
    /// counts as consumed, credit going back every half ring.
    pub fn release(&mut self, ring: usize, seq: u32, out: &mut Vec<Ctl>) {
        let Some(r) = self.rings.get_mut(ring).and_then(Option::as_mut) else {
            return;
        };
        r.queued = r.queued.saturating_sub(1);
        let next = seq.wrapping_add(1);
        if after(next, r.consumed) {
            r.consumed = next;
        }
        if r.consumed.wrapping_sub(r.credited) >= RING_SLOTS / 2 {
            self.credit(ring, out);
        }
    }
}

fn ring_region(qp: &UdQueuePair) -> Result<MemoryRegion, ()> {
    qp.pd()
        .register(
            RING_SLOTS as usize * SLOT,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_others_are_not_tags() {
        for k in [K_HELLO, K_GRANT, K_CREDIT, K_ASK] {
            assert_eq!(kind(Some(imm(k))), Some(k));
        }
        assert_eq!(kind(None), None);
        assert_eq!(kind(Some(MAGIC)), None);
        assert_eq!(kind(Some(MAGIC | 9)), None);
        assert_eq!(kind(Some(0x1234_5601)), None);
    }

    #[test]
    fn a_writer_asks_writes_within_credit_then_asks_again() {
        let mut w = Wr::default();
        let dest: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let at = DgramAddr {
            ip: dest.ip(),
            port: 5000,
            qpn: 5000 << 8,
        };
        assert!(matches!(w.plan(dest), Plan::Send(Some(v)) if v == imm(K_HELLO)));
        // Within 2 ms: untagged.
        assert!(matches!(w.plan(dest), Plan::Send(None)));
        let mut g = vec![0u8; 20];
        g[..4].copy_from_slice(&7u32.to_be_bytes());
        g[4..12].copy_from_slice(&0x1000u64.to_be_bytes());
        g[12..16].copy_from_slice(&RING_SLOTS.to_be_bytes());
        w.control(at, K_GRANT, &g);
        for n in 0..RING_SLOTS {
            match w.plan(dest) {
                Plan::Record {
                    remote_addr,
                    rkey,
                    hdr,
                } => {
                    assert_eq!(rkey, 7);
                    assert_eq!(remote_addr, 0x1000 + u64::from(n) * SLOT as u64);
                    assert_eq!(be32(&hdr, 4), n);
                }
                Plan::Send(_) => panic!("record {n} within credit went as a Send"),
            }
        }
        // Out of credit: a Send (asking once the 2 ms passed).
        assert!(matches!(w.plan(dest), Plan::Send(_)));
        // Credit for four consumed: four more records, from slot 0.
        let mut c = vec![0u8; 8];
        c[..4].copy_from_slice(&7u32.to_be_bytes());
        c[4..].copy_from_slice(&4u32.to_be_bytes());
        w.control(at, K_CREDIT, &c);
        // A credit for another rkey changes nothing.
        c[..4].copy_from_slice(&8u32.to_be_bytes());
        c[4..].copy_from_slice(&100u32.to_be_bytes());
        w.control(at, K_CREDIT, &c);
        for n in RING_SLOTS..RING_SLOTS + 4 {
            assert!(
                matches!(w.plan(dest), Plan::Record { remote_addr, .. } if remote_addr == 0x1000 + u64::from(n % RING_SLOTS) * SLOT as u64)
            );
        }
        assert!(matches!(w.plan(dest), Plan::Send(_)));
        // Refused: Sends, untagged for a second.
        w.control(at, K_GRANT, &[0u8; 20]);
        assert!(matches!(w.plan(dest), Plan::Send(None)));
    }

    /// A ring granted to a writer at 127.0.0.1:4000 by a real UD QP's
    /// protection domain: the Wr, the QP, the ring's rkey and base.
    fn granted() -> (Wr, UdQueuePair, DgramAddr, u32, u64) {
        let ctx = softrdma_verbs::Context::open().expect("device");
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(16, None);
        let qp = pd
            .create_ud_qp(
                &cq,
                &cq,
                softrdma_verbs::QpCaps {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                },
                softrdma_verbs::UdQpOptions {
                    bind: "127.0.0.1:0".parse().unwrap(),
                    record: record_config(),
                    ..Default::default()
                },
            )
            .expect("UD QP");
        let mut w = Wr::default();
        let writer = DgramAddr {
            ip: "127.0.0.1".parse().unwrap(),
            port: 4000,
            qpn: 4000 << 8,
        };
        let mut out = Vec::new();
        w.request(
            &qp,
            writer,
            SocketAddr::new(writer.ip, 4000),
            K_HELLO,
            &mut out,
        );
        assert_eq!(out.len(), 1, "one grant");
        assert_eq!(out[0].1, K_GRANT);
        let b = &out[0].2;
        assert_eq!(be32(b, 12), RING_SLOTS);
        assert_eq!(be32(b, 16), 0, "nothing consumed yet");
        let base = u64::from_be_bytes(b[4..12].try_into().unwrap());
        (w, qp, writer, be32(b, 0), base)
    }

    fn completion(
        status: WcStatus,
        src: DgramAddr,
        stag: u32,
        to: u64,
        len: u32,
        ranges: &[(u32, u32)],
    ) -> WorkCompletion {
        let mut r = [(0, 0); 4];
        r[..ranges.len()].copy_from_slice(ranges);
        let mut wc = WorkCompletion::new(0, status, softrdma_verbs::WcOpcode::RecvWriteRecord, 0);
        wc.src = Some(src);
        wc.record = Some(softrdma_verbs::WriteRecordInfo {
            stag,
            to,
            len,
            msn: 1,
            ranges: r,
            n_ranges: ranges.len() as u8,
            ranges_truncated: false,
        });
        wc
    }

    #[test]
    fn records_give_whole_datagrams_or_placed_prefixes_and_return_credit() {
        let (mut w, _qp, writer, rkey, base) = granted();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for seq in 0..RING_SLOTS {
            let mut rec = b"EW\0\0".to_vec();
            rec.extend_from_slice(&seq.to_be_bytes());
            rec.extend_from_slice(&data);
            let off = (seq % RING_SLOTS) as usize * SLOT;
            w.rings[0].as_ref().unwrap().mr.write_at(off, &rec).unwrap();
        }
        let mut st = Stats::default();
        let len = (HDR + data.len()) as u32;
        // Whole.
        let wc = completion(WcStatus::Success, writer, rkey, base, len, &[(0, len)]);
        let r = w.record(&wc, &mut st).expect("a whole record");
        assert_eq!(
            (r.ring, r.off, r.seq, r.len, r.avail),
            (0, 0, 0, 1000, 1000)
        );
        let mut got = vec![0u8; 1000];
        w.read(r.ring, r.off, 0, &mut got);
        assert_eq!(got, data);
        // Partial: the range from its start is what is delivered.
        let to = base + SLOT as u64;
        let wc = completion(
            WcStatus::RecordPartial,
            writer,
            rkey,
            to,
            len,
            &[(600, 100), (0, 308)],
        );
        let r = w.record(&wc, &mut st).expect("a partial record");
        assert_eq!((r.seq, r.len, r.avail), (1, 1000, 300));
        assert_eq!((st.records_in, st.records_partial), (2, 1));
        // Its start lost: nothing to deliver.
        let wc = completion(WcStatus::RecordPartial, writer, rkey, to, len, &[(8, 992)]);
        assert!(w.record(&wc, &mut st).is_none());
        // Another QP's record, another region's, a misaligned one: ignored.
        let other = DgramAddr {
            qpn: 4001 << 8,
            ..writer
        };
        let wc = completion(WcStatus::Success, other, rkey, base, len, &[(0, len)]);
        assert!(w.record(&wc, &mut st).is_none());
        let wc = completion(WcStatus::Success, writer, rkey ^ 1, base, len, &[(0, len)]);
        assert!(w.record(&wc, &mut st).is_none());
        let wc = completion(WcStatus::Success, writer, rkey, base + 8, len, &[(0, len)]);
        assert!(w.record(&wc, &mut st).is_none());
        assert_eq!(st.records_in, 2);
        // Reads consume; credit goes back at half a ring.
        let mut out = Vec::new();
        for seq in 0..RING_SLOTS / 2 - 1 {
            w.release(0, seq, &mut out);
        }
        assert!(out.is_empty(), "no credit before half a ring");
        w.release(0, RING_SLOTS / 2 - 1, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, K_CREDIT);
        assert_eq!(be32(&out[0].2, 0), rkey);
        assert_eq!(be32(&out[0].2, 4), RING_SLOTS / 2);
    }

    #[test]
    fn a_stuck_ring_is_rekeyed_and_a_busy_one_only_credited() {
        let (mut w, qp, writer, rkey, _) = granted();
        let from = SocketAddr::new(writer.ip, 4000);
        let mut out = Vec::new();
        // Asked at once: a credit for the same ring.
        w.request(&qp, writer, from, K_ASK, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].1, be32(&out[0].2, 0)), (K_CREDIT, rkey));
        // Nothing queued and nothing completed for STUCK: a new region.
        w.rings[0].as_mut().unwrap().last = Instant::now() - STUCK;
        out.clear();
        w.request(&qp, writer, from, K_ASK, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, K_GRANT);
        assert_ne!(be32(&out[0].2, 0), rkey, "re-keyed");
        // Every ring taken: a fifth writer is refused.
        for port in 4001..4001 + RINGS as u16 {
            out.clear();
            let at = DgramAddr {
                port,
                qpn: u32::from(port) << 8,
                ..writer
            };
            w.request(&qp, at, SocketAddr::new(writer.ip, port), K_HELLO, &mut out);
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1, K_GRANT);
        assert_eq!(be32(&out[0].2, 12), 0, "a refusal grants no slot");
    }
}
