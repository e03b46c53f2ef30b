//! The SoftDC control messages: a fixed [`MSG_LEN`]-octet layout (magic,
//! kind, reject reason, port, DCT, connection, key, cookie), and the
//! reverse offer that may follow an Accept.
//!
//! Contract: `decode` takes exactly [`MSG_LEN`] octets and reads back
//! what `encode` wrote; anything it cannot parse is a [`DecodeError`].
//! Reject codes it does not know are kept as [`RejectReason::Other`].

/// Magic of every SoftDC message.
pub const MAGIC: [u8; 4] = *b"sDC1";
/// Size of every SoftDC message.
pub const MSG_LEN: usize = 40;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    /// Initiator → target: please accept an RC connection.
    Invite,
    /// Target → initiator: connect to the listen port with the cookie.
    Accept,
    /// Target → initiator: no (see [`RejectReason`]).
    Reject,
    /// Reverse user → the offering side's DCT: bind the receive side of
    /// the connection with nonce `cookie` to DCT `dct`; `key` proves the
    /// right to. Answered by an Accept (echoing the nonce) or a Reject.
    Bind,
    /// Connection owner → the reverse user (to the DCT the connection
    /// goes to): stop using the connection with nonce `cookie`, answer
    /// when the work on it is done.
    Unbind,
    /// Reverse user → connection owner: nothing more will come over the
    /// connection with nonce `cookie`; it may close.
    Unbound,
    /// Offering side → reverse user: the Bind is accepted (the receive
    /// side is bound), `cookie` echoes the nonce.
    BindAccept,
    /// Offering side → reverse user: the Bind is refused (`reason`).
    BindReject,
}

/// Why a target refused an invitation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The DC access key does not match the DCT's.
    BadKey,
    /// No DCT with that number here.
    NoSuchDct,
    /// The target's connection table is full of busy connections: try
    /// again (the invitation keeps retransmitting).
    Busy,
    /// Bind: no connection with that nonce that may be bound to that DCT
    /// (gone, closing, bound to another DCT, not offered): use the
    /// normal path.
    NoConnection,
    /// A reason this implementation does not know (treated as final).
    Other(u8),
}

impl RejectReason {
    fn code(self) -> u8 {
        match self {
            RejectReason::BadKey => 1,
            RejectReason::NoSuchDct => 2,
            RejectReason::Busy => 3,
            RejectReason::NoConnection => 4,
            RejectReason::Other(c) => c,
        }
    }

    fn from_code(c: u8) -> RejectReason {
        match c {
            1 => RejectReason::BadKey,
            2 => RejectReason::NoSuchDct,
            3 => RejectReason::Busy,
            4 => RejectReason::NoConnection,
            c => RejectReason::Other(c),
        }
    }
}

/// One SoftDC message (see the module documentation for the layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// What it is.
    pub kind: MsgKind,
    /// Reject: why.
    pub reason: Option<RejectReason>,
    /// Accept: the target's TCP listen port.
    pub port: u16,
    /// The DCT number.
    pub dct: u32,
    /// The initiator's connection id.
    pub conn: u64,
    /// Invite: the DC access key.
    pub key: u64,
    /// Accept: the cookie. Bind, Unbind, Unbound, and the Accept of a
    /// Bind: the connection's reverse-offer nonce.
    pub cookie: u64,
}

/// Most DCT numbers one [`ReverseOffer`] names.
pub const MAX_OFFER_DCTS: usize = 16;
/// Version octet of the [`ReverseOffer`] encoding.
pub const OFFER_VERSION: u8 = 1;

/// What the side opening a connection offers for reverse use: the peer may
/// bind the connection's receive side (here) to one of `dcts` by a
/// [`MsgKind::Bind`] naming `nonce`, and then send over the connection
/// it accepted instead of opening one of its own (`docs/dc.md` §2).
///
/// Appended to the private data of a DC connection request, after the
/// fixed part: version (1 octet, [`OFFER_VERSION`]), count `n` (1 octet,
/// 1..=[`MAX_OFFER_DCTS`]), nonce (8), `n` DCT numbers (4 each),
/// big-endian: exactly `10 + 4 n` octets. Nothing after the fixed part:
/// an old-format request, no offer. Anything else after it (another
/// version, a wrong length) is ignored: no offer, the request itself
/// stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReverseOffer {
    /// Names the connection in Bind/Unbind/Unbound (random, never 0).
    pub nonce: u64,
    /// DCTs of the offering context (same protection domain as the
    /// connection) its receive side may be bound to.
    pub dcts: Vec<u32>,
}

impl ReverseOffer {
    /// Appends the wire form to `out` (at most [`MAX_OFFER_DCTS`] DCTs
    /// are written; none: nothing is).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let n = self.dcts.len().min(MAX_OFFER_DCTS);
        if n == 0 {
            return;
        }
        out.push(OFFER_VERSION);
        out.push(n as u8);
        out.extend_from_slice(&self.nonce.to_be_bytes());
        for d in &self.dcts[..n] {
            out.extend_from_slice(&d.to_be_bytes());
        }
    }

    /// Parses what follows the fixed part of a request's private data.
    /// `None`: no offer (nothing there, or not a valid version-1 offer).
    pub fn decode(tail: &[u8]) -> Option<ReverseOffer> {
        let (&ver, rest) = tail.split_first()?;
        let (&n, rest) = rest.split_first()?;
        let n = usize::from(n);
        if ver != OFFER_VERSION || n == 0 || n > MAX_OFFER_DCTS || rest.len() != 8 + 4 * n {
            return None;
        }
        let nonce = u64::from_be_bytes(rest[..8].try_into().ok()?);
        if nonce == 0 {
            return None;
        }
        let dcts = rest[8..]
            .chunks_exact(4)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Some(ReverseOffer { nonce, dcts })
    }
}

/// Why octets are not a SoftDC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Not [`MSG_LEN`] octets.
    Length(usize),
    /// The magic is wrong.
    Magic,
    /// Unknown kind octet.
    Kind(u8),
}

impl Message {
    /// The wire form.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut b = [0u8; MSG_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = match self.kind {
            MsgKind::Invite => 1,
            MsgKind::Accept => 2,
            MsgKind::Reject => 3,
            MsgKind::Bind => 4,
            MsgKind::Unbind => 5,
            MsgKind::Unbound => 6,
            MsgKind::BindAccept => 7,
            MsgKind::BindReject => 8,
        };
        b[5] = self.reason.map_or(0, RejectReason::code);
        b[6..8].copy_from_slice(&self.port.to_be_bytes());
        b[8..12].copy_from_slice(&self.dct.to_be_bytes());
        b[16..24].copy_from_slice(&self.conn.to_be_bytes());
        b[24..32].copy_from_slice(&self.key.to_be_bytes());
        b[32..40].copy_from_slice(&self.cookie.to_be_bytes());
        b
    }

    /// Parses the wire form (exactly [`MSG_LEN`] octets).
    pub fn decode(b: &[u8]) -> Result<Message, DecodeError> {
        if b.len() != MSG_LEN {
            return Err(DecodeError::Length(b.len()));
        }
        if b[..4] != MAGIC {
            return Err(DecodeError::Magic);
        }
        let kind = match b[4] {
            1 => MsgKind::Invite,
            2 => MsgKind::Accept,
            3 => MsgKind::Reject,
            4 => MsgKind::Bind,
            5 => MsgKind::Unbind,
            6 => MsgKind::Unbound,
            7 => MsgKind::BindAccept,
            8 => MsgKind::BindReject,
            k => return Err(DecodeError::Kind(k)),
        };
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 octets"));
        Ok(Message {
            kind,
            reason: matches!(kind, MsgKind::Reject | MsgKind::BindReject)
                .then(|| RejectReason::from_code(b[5])),
            port: u16::from_be_bytes([b[6], b[7]]),
            dct: u32::from_be_bytes(b[8..12].try_into().expect("4 octets")),
            conn: u64_at(16),
            key: u64_at(24),
            cookie: u64_at(32),
        })
    }
}
