//! The RDMA model's wire format: the private data of the connection
//! exchange and the control messages (`docs/exs.md` specifies both).
//!
//! Every control message is one RC Send of [`HDR`] octets (little endian),
//! followed by the data of an immediate advertisement:
//!
//! | octets | field |
//! |---|---|
//! | 0 | kind: [`ADV`], [`ACK`], [`CREDIT`], [`FIN`], [`PADV`], [`PRECV`], [`RNOTE`], [`WNOTE`] |
//! | 1 | flags: [`F_IMM`] (the data follows the header), [`F_NOTIFY`] |
//! | 2..4 | advertisement credits returned |
//! | 4..8 | sequence number (ADV: its own; ACK: the one acknowledged) |
//! | 8..16 | ADV, PADV, PRECV: address of the block; notes: offset in it |
//! | 16..20 | ADV, PADV, PRECV: length; ACK: octets taken; notes: octets |
//! | 20..24 | ADV, PADV, PRECV: STag of the block (0 when immediate) |
//!
//! Every kind but ACK, CREDIT and FIN spends one of the sender's credits.
//! [`check`] is the pure entry point the fuzz target drives: a message
//! and a connection's counters in, the verdict out.

/// Header octets.
pub const HDR: usize = 24;
/// The largest control message (one inline Send).
pub const MSG_MAX: usize = 256;
/// The most data an immediate advertisement carries.
pub const IMM_MAX: usize = MSG_MAX - HDR;

/// An advertisement: a message is ready to be pulled (or, with
/// [`F_IMM`], is carried here).
pub const ADV: u8 = 1;
/// An acknowledgement: the advertised message with this sequence number
/// was pulled; the sender's operation completes.
pub const ACK: u8 = 2;
/// Credits returned, nothing else.
pub const CREDIT: u8 = 3;
/// The sender closed the connection; nothing follows.
pub const FIN: u8 = 4;

/// A persistent send's block: every later receive of the peer pulls
/// from it with one RDMA Read, without acknowledgement.
pub const PADV: u8 = 5;
/// A persistent receive's block: every later send of the peer is pushed
/// into it with one RDMA Write.
pub const PRECV: u8 = 6;
/// Notification to a [`PADV`] owner that asked for it ([`F_NOTIFY`]): the
/// peer read `len` octets at offset `addr` of the block.
pub const RNOTE: u8 = 7;
/// Notification to a [`PRECV`] owner that asked for it: the peer wrote
/// `len` octets at offset `addr` of the block (the Write precedes it on
/// the connection, so it has landed).
pub const WNOTE: u8 = 8;

/// Flag: the advertisement carries its data.
pub const F_IMM: u8 = 1;
/// Flag of [`PADV`] and [`PRECV`]: the owner wants a note per access.
pub const F_NOTIFY: u8 = 2;

/// Whether a message of `kind` spends one of its sender's credits.
pub fn spends_credit(kind: u8) -> bool {
    matches!(kind, ADV | PADV | PRECV | RNOTE | WNOTE)
}

/// A connection's counters as [`check`] sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// The negotiated credits.
    pub credits: u32,
    /// Credits this end may still spend.
    pub send_credits: u32,
    /// Credit-spending messages of the peer held and not yet returned.
    pub held: u32,
    /// Length of this end's persistent receive block (0: none).
    pub precv_len: u64,
    /// Length of this end's persistent send block (0: none).
    pub psend_len: u64,
}

/// Checks a received message against the connection's counters: `Err(())`
/// means a protocol violation (the connection is reset). On success the
/// counters are updated as the receiver applies the message.
#[allow(clippy::result_unit_err)]
pub fn check(w: &mut Window, m: &Msg) -> Result<(), ()> {
    let back = w.send_credits.checked_add(u32::from(m.credits)).ok_or(())?;
    if back > w.credits {
        return Err(());
    }
    w.send_credits = back;
    if spends_credit(m.kind) {
        if w.held >= w.credits {
            return Err(());
        }
        w.held += 1;
    }
    let within = |len: u64| {
        m.addr
            .checked_add(u64::from(m.len))
            .is_some_and(|end| end <= len)
    };
    match m.kind {
        RNOTE if !within(w.psend_len) => Err(()),
        WNOTE if !within(w.precv_len) => Err(()),
        PADV | PRECV if m.len == 0 => Err(()),
        _ => Ok(()),
    }
}

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Msg {
    /// [`ADV`], [`ACK`], [`CREDIT`] or [`FIN`].
    pub kind: u8,
    /// [`F_IMM`] or 0.
    pub flags: u8,
    /// Advertisement credits returned.
    pub credits: u16,
    /// Sequence number.
    pub seq: u32,
    /// Address of the advertised data.
    pub addr: u64,
    /// Length (ADV) or octets taken (ACK).
    pub len: u32,
    /// STag of the advertised data.
    pub stag: u32,
    /// Immediate data.
    pub data: Vec<u8>,
}

impl Msg {
    /// The wire form (at most [`MSG_MAX`] octets).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HDR + self.data.len());
        b.push(self.kind);
        b.push(self.flags);
        b.extend_from_slice(&self.credits.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.stag.to_le_bytes());
        b.extend_from_slice(&self.data);
        b
    }

    /// Parses a received message; `None` when it breaks the format (the
    /// connection is then reset).
    pub fn decode(b: &[u8]) -> Option<Msg> {
        if b.len() < HDR || b.len() > MSG_MAX {
            return None;
        }
        let u32at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[8..16]);
        let m = Msg {
            kind: b[0],
            flags: b[1],
            credits: u16::from_le_bytes([b[2], b[3]]),
            seq: u32at(4),
            addr: u64::from_le_bytes(a),
            len: u32at(16),
            stag: u32at(20),
            data: b[HDR..].to_vec(),
        };
        let ok = match m.kind {
            ADV if m.flags == F_IMM => m.data.len() == m.len as usize,
            ADV => m.flags == 0 && m.data.is_empty(),
            ACK | CREDIT | FIN | RNOTE | WNOTE => m.flags == 0 && m.data.is_empty(),
            PADV | PRECV => m.flags & !F_NOTIFY == 0 && m.data.is_empty(),
            _ => false,
        };
        ok.then_some(m)
    }
}

/// Octets of [`Params`] on the wire.
pub const PARAMS_LEN: usize = 16;
/// First octets of [`Params`].
pub const MAGIC: [u8; 4] = *b"EXS1";

/// What each end puts in the private data of the connection exchange.
/// The initiator proposes; the responder answers with the negotiated
/// values (the smaller of both ends' settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The socket type (`SOCK_SEQPACKET` or `SOCK_STREAM`).
    pub ty: u8,
    /// Advertisements one end may have outstanding toward the other.
    pub credits: u32,
    /// The largest send carried in its advertisement.
    pub small: u32,
}

/// Most credits a connection may use.
pub const MAX_CREDITS: u32 = 1024;

impl Params {
    /// The wire form.
    pub fn to_bytes(self) -> [u8; PARAMS_LEN] {
        let mut b = [0u8; PARAMS_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = 1;
        b[5] = self.ty;
        b[8..12].copy_from_slice(&self.credits.to_le_bytes());
        b[12..16].copy_from_slice(&self.small.to_le_bytes());
        b
    }

    /// Parses private data; `None` unless it is this format with sane
    /// numbers.
    pub fn parse(b: &[u8]) -> Option<Params> {
        if b.len() < PARAMS_LEN || b[..4] != MAGIC || b[4] != 1 {
            return None;
        }
        let p = Params {
            ty: b[5],
            credits: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            small: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        };
        let sane = (1..=MAX_CREDITS).contains(&p.credits) && p.small as usize <= IMM_MAX;
        sane.then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        let m = Msg {
            kind: ADV,
            flags: F_IMM,
            credits: 3,
            seq: 9,
            len: 5,
            data: b"hello".to_vec(),
            ..Msg::default()
        };
        assert_eq!(Msg::decode(&m.encode()), Some(m));
        let a = Msg {
            kind: ACK,
            seq: 7,
            len: 4096,
            ..Msg::default()
        };
        assert_eq!(Msg::decode(&a.encode()), Some(a.clone()));
        assert_eq!(Msg::decode(&[ACK; 3]), None);
        let mut bad = a.encode();
        bad[0] = 9;
        assert_eq!(Msg::decode(&bad), None);
        let p = Params {
            ty: 5,
            credits: 64,
            small: 128,
        };
        assert_eq!(Params::parse(&p.to_bytes()), Some(p));
        let mut q = p.to_bytes();
        q[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Params::parse(&q), None);
    }

    #[test]
    fn persistent_kinds_and_the_window() {
        let p = Msg {
            kind: PADV,
            flags: F_NOTIFY,
            addr: 0x1000,
            len: 64,
            stag: 7,
            ..Msg::default()
        };
        assert_eq!(Msg::decode(&p.encode()), Some(p.clone()));
        let mut bad = p.encode();
        bad[1] = F_IMM;
        assert_eq!(Msg::decode(&bad), None);
        let mut w = Window {
            credits: 2,
            send_credits: 2,
            psend_len: 100,
            ..Window::default()
        };
        let note = |addr: u64, len: u32| Msg {
            kind: RNOTE,
            addr,
            len,
            ..Msg::default()
        };
        assert_eq!(check(&mut w, &note(90, 10)), Ok(()));
        assert_eq!(w.held, 1);
        // Outside the block, past it by wrapping, or into a block we lack.
        assert_eq!(check(&mut w.clone(), &note(91, 10)), Err(()));
        assert_eq!(check(&mut w.clone(), &note(u64::MAX, 2)), Err(()));
        let wn = Msg {
            kind: WNOTE,
            len: 1,
            ..Msg::default()
        };
        assert_eq!(check(&mut w.clone(), &wn), Err(()));
        // A second note fills the window; a third breaks it.
        assert_eq!(check(&mut w, &note(0, 1)), Ok(()));
        assert_eq!(check(&mut w, &note(0, 1)), Err(()));
        // Credits back beyond the window.
        let mut w2 = Window {
            credits: 4,
            send_credits: 3,
            ..Window::default()
        };
        let c = |n: u16| Msg {
            kind: CREDIT,
            credits: n,
            ..Msg::default()
        };
        assert_eq!(check(&mut w2, &c(1)), Ok(()));
        assert_eq!(check(&mut w2, &c(1)), Err(()));
        // An empty persistent block is refused.
        let e = Msg {
            kind: PRECV,
            ..Msg::default()
        };
        assert_eq!(check(&mut w2, &e), Err(()));
    }

    proptest! {
        /// Arbitrary octets never panic the parsers, and what parses
        /// encodes back to the same octets.
        #[test]
        fn arbitrary_octets(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Some(m) = Msg::decode(&b) {
                prop_assert_eq!(m.encode(), b.clone());
            }
            if let Some(p) = Params::parse(&b) {
                prop_assert!(p.credits >= 1 && p.small as usize <= IMM_MAX);
            }
        }
    }
}
