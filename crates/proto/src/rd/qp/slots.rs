//! The QP's fixed tables: send-queue slots and inbound-request slots
//! (Read and atomic requests from peers, Terminates to send), the tokens
//! that name them to the reliability endpoint, and the per-peer FIFOs
//! threaded through the slots.
//!
//! Contract: slots are allocated when the QP is created and never grow;
//! a slot is on at most one FIFO at a time.

use super::*;

/// What the reliability layer sequences for an RD QP: one segment of a
/// send work request or of an inbound response / Terminate, by slot,
/// generation and segment number. Nothing else is kept per datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token {
    pub(super) from: Source,
    pub(super) slot: u32,
    pub(super) gen: u32,
    pub(super) seg: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Source {
    Sq,
    Inbound,
}

// ----------------------------------------------------------------------
// Internal state
// ----------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    Write,
    WriteRecord,
    Read,
    Atomic,
}

impl Kind {
    /// Completed by acknowledgements (not by a response).
    pub(super) fn acked_kind(self) -> bool {
        matches!(self, Kind::Send | Kind::Write | Kind::WriteRecord)
    }
}

/// A send work request.
#[derive(Debug, Clone, Copy)]
pub(super) struct SqEntry {
    pub(super) wr: SendWr,
    pub(super) dest: DgramAddr,
    pub(super) kind: Kind,
    /// Its first token was given to the reliability layer.
    pub(super) started: bool,
    /// MSN (Send), T-MSN (Write, Write-Record) or request MSN (Read,
    /// atomic); fixed at start.
    pub(super) msn: u32,
    /// Payload octets per data segment.
    pub(super) room: u32,
    /// Data segments (the Immediate Data segment excluded).
    pub(super) data_segs: u32,
    /// All segments (tokens).
    pub(super) nsegs: u32,
    /// Tokens given to the reliability layer.
    pub(super) pumped: u32,
    /// Tokens acknowledged or abandoned.
    pub(super) resolved: u32,
    /// Tokens acknowledged.
    pub(super) acked: u32,
    /// Read / atomic: the response is awaited (holds one ORD unit).
    pub(super) awaiting: bool,
    /// Acknowledged, but its success waits for the peer's gate.
    pub(super) gated: bool,
    /// Read: response octets placed.
    pub(super) received: u32,
    /// Its outcome is decided (`outcome`).
    pub(super) done: bool,
    pub(super) outcome: (WcStatus, u32),
    /// Its completion was produced (or suppressed): every earlier request
    /// to the same peer was reported before.
    pub(super) reported: bool,
    /// Next request to the same peer in posting order (not yet reported).
    pub(super) next_all: u32,
    /// Terminate MSN of the sender-abort Terminate, once one was needed.
    pub(super) abort_msn: u32,
    /// In the peer's list of requests still to pump.
    pub(super) in_fifo: bool,
    pub(super) next: u32,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct SqSlot {
    pub(super) gen: u32,
    pub(super) e: Option<SqEntry>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum InKind {
    Read {
        req: ReadRequest,
        msn: u32,
    },
    Atomic {
        resp: AtomicResponse,
        msn: u32,
    },
    Terminate {
        term: TerminateRepr,
        /// MSN / T-MSN of the message it is about (RsvdULP).
        about: u32,
        /// Its own Terminate MSN.
        msn: u32,
    },
}

/// Something this QP sends on its own account: a response or a
/// Terminate.
#[derive(Debug, Clone, Copy)]
pub(super) struct InEntry {
    pub(super) peer: DgramAddr,
    pub(super) kind: InKind,
    pub(super) room: u32,
    pub(super) nsegs: u32,
    pub(super) pumped: u32,
    pub(super) resolved: u32,
    /// Counts against the peer's IRD.
    pub(super) ird: bool,
    /// Stop pumping (failed source, failed peer).
    pub(super) dead: bool,
    /// A remote access event was raised for it.
    pub(super) reported: bool,
    /// Terminate MSN used if its source fails in flight.
    pub(super) abort_msn: u32,
    pub(super) in_fifo: bool,
    pub(super) next: u32,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct InSlot {
    pub(super) gen: u32,
    pub(super) e: Option<InEntry>,
}

/// A slot of a table threaded by a per-peer intrusive FIFO (the requests
/// still to pump, the responses still to send).
pub(super) trait FifoSlot {
    /// The entry's (in the FIFO, next slot) link, if the slot is in use.
    fn link(&mut self) -> Option<(&mut bool, &mut u32)>;
}

impl FifoSlot for SqSlot {
    fn link(&mut self) -> Option<(&mut bool, &mut u32)> {
        self.e.as_mut().map(|e| (&mut e.in_fifo, &mut e.next))
    }
}

impl FifoSlot for InSlot {
    fn link(&mut self) -> Option<(&mut bool, &mut u32)> {
        self.e.as_mut().map(|e| (&mut e.in_fifo, &mut e.next))
    }
}

/// Appends `slot` to the FIFO `head..tail` threaded through `slots`.
pub(super) fn fifo_push<S: FifoSlot>(slots: &mut [S], head: &mut u32, tail: &mut u32, slot: u32) {
    if let Some((in_fifo, next)) = slots[slot as usize].link() {
        *in_fifo = true;
        *next = NIL;
    }
    if *tail == NIL {
        *head = slot;
    } else if let Some((_, next)) = slots[*tail as usize].link() {
        *next = slot;
    }
    *tail = slot;
}

/// Removes `slot` from the FIFO `head..tail` (if it is in it) and clears
/// its link.
pub(super) fn fifo_unlink<S: FifoSlot>(slots: &mut [S], head: &mut u32, tail: &mut u32, slot: u32) {
    let Some((in_fifo, next)) = slots[slot as usize].link() else {
        return;
    };
    if !*in_fifo {
        return;
    }
    *in_fifo = false;
    let after = std::mem::replace(next, NIL);
    let mut prev = NIL;
    let mut cur = *head;
    while cur != NIL && cur != slot {
        prev = cur;
        cur = slots[cur as usize].link().map_or(NIL, |(_, n)| *n);
    }
    if cur == NIL {
        return;
    }
    if prev == NIL {
        *head = after;
    } else if let Some((_, n)) = slots[prev as usize].link() {
        *n = after;
    }
    if *tail == slot {
        *tail = prev;
    }
}
