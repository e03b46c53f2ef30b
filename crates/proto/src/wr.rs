//! Work requests and work completions, in verbs terms.
//!
//! These are the values the queue-pair engines take in (`post_send`,
//! `post_recv`) and hand out (`poll_completion`). They are plain data with
//! fixed capacity — scatter/gather lists and inline data live inside the
//! request — so queues of them can be allocated once, when a QP is created,
//! and never grow on the data path.
//!
//! Also here, because every transport uses them: [`CqKind`] (which
//! completion queue a completion belongs to) and [`PostError`] (why a
//! work request was refused at post time).

/// Most scatter/gather entries in one work request.
pub const MAX_SGE: usize = 8;
/// Most octets of inline data in one send work request.
pub const MAX_INLINE: usize = 256;

/// One scatter/gather entry: `length` octets at virtual address `addr` of the
/// memory region whose local key is `lkey`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Sge {
    /// Start address, in the region's address space.
    pub addr: u64,
    /// Length in octets.
    pub length: u32,
    /// Local key of the memory region.
    pub lkey: u32,
}

/// A scatter/gather list of at most [`MAX_SGE`] entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SgList {
    sge: [Sge; MAX_SGE],
    len: u8,
}

impl SgList {
    /// An empty list (a zero-length operation).
    pub const fn new() -> Self {
        SgList {
            sge: [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE],
            len: 0,
        }
    }

    /// A list holding `entries`, or `None` if there are more than
    /// [`MAX_SGE`].
    pub fn from_slice(entries: &[Sge]) -> Option<Self> {
        if entries.len() > MAX_SGE {
            return None;
        }
        let mut l = SgList::new();
        l.sge[..entries.len()].copy_from_slice(entries);
        l.len = entries.len() as u8;
        Some(l)
    }

    /// A list of one entry.
    pub fn single(addr: u64, length: u32, lkey: u32) -> Self {
        let mut l = SgList::new();
        l.sge[0] = Sge { addr, length, lkey };
        l.len = 1;
        l
    }

    /// The entries.
    pub fn as_slice(&self) -> &[Sge] {
        &self.sge[..usize::from(self.len)]
    }

    /// Total octets described (64-bit: eight 4 GiB entries do not fit u32).
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.length)).sum()
    }

    /// Calls `f(sge, offset_in_sge, len)` for the pieces that cover octets
    /// `[offset, offset + len)` of the list, in order. Returns false (having
    /// called `f` for nothing) if the range runs past the end of the list.
    pub fn for_range(&self, offset: u64, len: u64, mut f: impl FnMut(&Sge, u64, u64)) -> bool {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.total_len())
        {
            return false;
        }
        let mut skip = offset;
        let mut left = len;
        for s in self.as_slice() {
            if left == 0 {
                break;
            }
            let l = u64::from(s.length);
            if skip >= l {
                skip -= l;
                continue;
            }
            let n = (l - skip).min(left);
            f(s, skip, n);
            left -= n;
            skip = 0;
        }
        true
    }
}

/// Inline payload copied into the work request at post time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineData {
    data: [u8; MAX_INLINE],
    len: u16,
}

impl InlineData {
    /// Copies `bytes`, or `None` if there are more than [`MAX_INLINE`].
    pub fn new(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > MAX_INLINE {
            return None;
        }
        let mut d = InlineData {
            data: [0; MAX_INLINE],
            len: bytes.len() as u16,
        };
        d.data[..bytes.len()].copy_from_slice(bytes);
        Some(d)
    }

    /// The payload.
    pub fn as_slice(&self) -> &[u8] {
        &self.data[..usize::from(self.len)]
    }
}

/// Where a send work request's payload comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// Gathered from registered memory when transmitted.
    Sgl(SgList),
    /// Copied at post time (`IBV_SEND_INLINE`).
    Inline(InlineData),
}

impl Payload {
    /// Total octets.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sgl(s) => s.total_len(),
            Payload::Inline(d) => d.as_slice().len() as u64,
        }
    }

    /// True for a zero-length payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The operation of a send work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Send; optionally with immediate data (softrdma peers only) or with
    /// Invalidate of the peer's STag `invalidate`.
    Send {
        /// 32-bit immediate data (`IBV_WR_SEND_WITH_IMM`).
        imm: Option<u32>,
        /// STag the receiver invalidates (`IBV_WR_SEND_WITH_INV`).
        invalidate: Option<u32>,
    },
    /// RDMA Write to `remote_addr` in the region of `rkey`; optionally with
    /// immediate data (softrdma peers only).
    Write {
        /// Target tagged offset.
        remote_addr: u64,
        /// Target STag.
        rkey: u32,
        /// 32-bit immediate data (`IBV_WR_RDMA_WRITE_WITH_IMM`).
        imm: Option<u32>,
    },
    /// RDMA Read of the payload's length from `remote_addr`/`rkey` into the
    /// local scatter list.
    Read {
        /// Source tagged offset.
        remote_addr: u64,
        /// Source STag.
        rkey: u32,
    },
    /// 8-octet compare-and-swap (softrdma peers only); the original value
    /// lands in the 8-octet local buffer.
    CompareSwap {
        /// Target tagged offset (8-octet aligned).
        remote_addr: u64,
        /// Target STag.
        rkey: u32,
        /// Value compared with the target.
        compare: u64,
        /// Value stored if equal.
        swap: u64,
    },
    /// 8-octet fetch-and-add (softrdma peers only).
    FetchAdd {
        /// Target tagged offset (8-octet aligned).
        remote_addr: u64,
        /// Target STag.
        rkey: u32,
        /// Value added.
        add: u64,
    },
    /// RDMA Write-Record (datagram QPs, softrdma only): placed like a
    /// Write, and logged at the target (CQ entry or validity map).
    WriteRecord {
        /// Target tagged offset.
        remote_addr: u64,
        /// Target STag.
        rkey: u32,
    },
    /// Invalidate a local STag (`IBV_WR_LOCAL_INV`).
    LocalInvalidate {
        /// The STag.
        stag: u32,
    },
}

/// Flags of a send work request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendFlags {
    /// Generate a completion on success (`IBV_SEND_SIGNALED`).
    pub signaled: bool,
    /// Ask for a solicited event at the receiver (`IBV_SEND_SOLICITED`).
    pub solicited: bool,
    /// Wait for earlier Reads and atomics to complete (`IBV_SEND_FENCE`).
    pub fence: bool,
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// The local data (source of Send/Write, sink of Read/atomics).
    pub payload: Payload,
    /// Flags.
    pub flags: SendFlags,
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming Send is scattered.
    pub sgl: SgList,
}

/// Completion status, numbered as `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// The operation completed.
    Success,
    /// Local length error (message longer than the receive buffer).
    LocLenErr,
    /// Local QP operation error (an operation the peer or state forbids).
    LocQpOpErr,
    /// Local protection error (bad lkey, access or bounds).
    LocProtErr,
    /// Flushed: the QP went to the error state first.
    WrFlushErr,
    /// The peer found the request invalid.
    RemInvReqErr,
    /// The peer refused access (STag, bounds, rights).
    RemAccessErr,
    /// The peer could not complete the operation.
    RemOpErr,
    /// Retries exhausted (datagram transports; LLP failure).
    RetryExcErr,
    /// No receive buffer at the peer.
    RnrRetryExcErr,
    /// Fatal error.
    FatalErr,
    /// Other error.
    GeneralErr,
    /// Write-Record only: the message was placed in part before its
    /// partial-message timeout; the completion lists the ranges placed.
    /// softrdma only.
    RecordPartial,
}

impl WcStatus {
    /// The `ibv_wc_status` value.
    pub const fn ibv_code(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::FatalErr => 19,
            WcStatus::GeneralErr => 21,
            // Outside rdma-core's range; named in softrdma/verbs.h.
            WcStatus::RecordPartial => 0x1000,
        }
    }
}

/// Completion opcode, numbered as `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// Send (any variant) completed at the sender.
    Send,
    /// RDMA Write.
    RdmaWrite,
    /// RDMA Read.
    RdmaRead,
    /// Compare-and-swap.
    CompSwap,
    /// Fetch-and-add.
    FetchAdd,
    /// Local invalidate.
    LocalInv,
    /// A Send arrived.
    Recv,
    /// An RDMA Write with immediate arrived.
    RecvRdmaWithImm,
    /// An RDMA Write-Record was placed (wholly, or partly: see the status
    /// and [`WriteRecordInfo`]); consumes no receive. softrdma only.
    RecvWriteRecord,
    /// An RDMA Write-Record completed at the sender. softrdma only.
    WriteRecord,
}

impl WcOpcode {
    /// The `ibv_wc_opcode` value.
    pub const fn ibv_code(self) -> u32 {
        match self {
            WcOpcode::Send => 0,
            WcOpcode::RdmaWrite => 1,
            WcOpcode::RdmaRead => 2,
            WcOpcode::CompSwap => 3,
            WcOpcode::FetchAdd => 4,
            WcOpcode::LocalInv => 6,
            WcOpcode::Recv => 128,
            WcOpcode::RecvRdmaWithImm => 129,
            // Outside rdma-core's range; named in softrdma/verbs.h.
            WcOpcode::RecvWriteRecord => 0x1000,
            WcOpcode::WriteRecord => 0x1001,
        }
    }

    /// The completion opcode of a send work request.
    pub const fn of(op: &SendOp) -> WcOpcode {
        match op {
            SendOp::Send { .. } => WcOpcode::Send,
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::LocalInvalidate { .. } => WcOpcode::LocalInv,
            SendOp::WriteRecord { .. } => WcOpcode::WriteRecord,
        }
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's `wr_id`.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Octets received (receives, Reads) or 0.
    pub byte_len: u32,
    /// Immediate data, if the message carried some.
    pub imm: Option<u32>,
    /// The STag a Send with Invalidate invalidated here.
    pub invalidated: Option<u32>,
    /// The message that completed a receive asked for a solicited event.
    pub solicited: bool,
    /// Datagram QPs: where the message came from.
    pub src: Option<DgramAddr>,
    /// Write-Record completions: what was placed.
    pub record: Option<WriteRecordInfo>,
}

/// A datagram QP's address: where its UDP socket is, and which of the QPs
/// sharing that socket (design brief §3: `QPN = (port << 8) | slot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DgramAddr {
    /// IP address.
    pub ip: std::net::IpAddr,
    /// UDP port.
    pub port: u16,
    /// QP number.
    pub qpn: u32,
}

/// What a Write-Record completion reports (`docs/datagram.md` §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRecordInfo {
    /// The sink STag.
    pub stag: u32,
    /// Base tagged offset of the message (TO of its first octet).
    pub to: u64,
    /// Octets of the message.
    pub len: u32,
    /// The message's tagged MSN.
    pub msn: u32,
    /// Octet ranges placed, as (offset from `to`, length); one range
    /// `(0, len)` when the message arrived whole. At most
    /// [`MAX_RECORD_RANGES`] are listed; `ranges_truncated` says more
    /// were placed.
    pub ranges: [(u32, u32); MAX_RECORD_RANGES],
    /// Entries of `ranges` in use.
    pub n_ranges: u8,
    /// More ranges were placed than `ranges` holds (the validity map has
    /// them all).
    pub ranges_truncated: bool,
}

/// Placed ranges a Write-Record completion lists itself.
pub const MAX_RECORD_RANGES: usize = 4;

impl WorkCompletion {
    /// A completion with no immediate, invalidate or solicited flag.
    pub const fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm: None,
            invalidated: None,
            solicited: false,
            src: None,
            record: None,
        }
    }
}

/// Which completion queue a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqKind {
    /// The send queue's CQ.
    Send,
    /// The receive queue's CQ.
    Recv,
}

/// Why a work request was refused at post time (nothing was queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The queue is full.
    QueueFull,
    /// The operation needs a softrdma peer (RFC 7306), or is otherwise not
    /// supported on this connection.
    Unsupported,
    /// A parameter is invalid (an atomic with a buffer other than 8 octets,
    /// inline data on a Read, more SGEs than allowed).
    Invalid,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgl_ranges() {
        let l = SgList::from_slice(&[
            Sge {
                addr: 100,
                length: 10,
                lkey: 1,
            },
            Sge {
                addr: 500,
                length: 0,
                lkey: 2,
            },
            Sge {
                addr: 900,
                length: 5,
                lkey: 3,
            },
        ])
        .unwrap();
        assert_eq!(l.total_len(), 15);
        let mut got = Vec::new();
        assert!(l.for_range(8, 5, |s, o, n| got.push((s.lkey, o, n))));
        assert_eq!(got, vec![(1, 8, 2), (3, 0, 3)]);
        assert!(!l.for_range(14, 2, |_, _, _| panic!("out of range")));
        assert!(!l.for_range(u64::MAX, 2, |_, _, _| panic!("overflow")));
        assert!(l.for_range(15, 0, |_, _, _| panic!("empty")));
        assert!(SgList::from_slice(&[Sge::default(); MAX_SGE + 1]).is_none());
        assert!(InlineData::new(&[0; MAX_INLINE + 1]).is_none());
    }
}
