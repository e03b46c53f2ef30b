//! What the QP keeps per peer: the message being received, the heads of
//! its send and inbound FIFOs, the ordering gates and the Terminate
//! numbering.
//!
//! Contract: a peer whose state is idle holds nothing and may be dropped.

use super::*;

/// The Send message being received from a peer.
#[derive(Debug, Clone, Copy)]
pub(super) struct RxMsg {
    pub(super) msn: u32,
    /// Posting sequence of the claimed receive.
    pub(super) seq: u64,
    pub(super) wr: RecvWr,
    /// Octets of message the receive takes.
    pub(super) cap: u64,
    /// Octets received so far (= the next MO expected).
    pub(super) received: u32,
}

/// What this QP keeps per peer (besides the reliability layer's entry).
#[derive(Debug, Clone, Copy)]
pub(super) struct PeerState {
    pub(super) tx_msn: u32,
    pub(super) tx_req: u32,
    pub(super) tx_tmsn: u32,
    pub(super) tx_resp: u32,
    pub(super) tx_term: u32,
    /// Requests not yet reported, in posting order.
    pub(super) all_head: u32,
    pub(super) all_tail: u32,
    /// Requests not yet wholly given to the reliability layer.
    pub(super) sq_head: u32,
    pub(super) sq_tail: u32,
    pub(super) in_head: u32,
    pub(super) in_tail: u32,
    pub(super) ord_used: u16,
    pub(super) ird_used: u16,
    /// Send-queue slot of the Read that got the last Read Response.
    pub(super) read_hint: u32,
    /// Success completions wait until the peer's datagram with this
    /// (epoch, PSN) is delivered (its ACK arrived out of order, ahead of a
    /// Terminate it may follow).
    pub(super) gate: Option<(u32, u32)>,
    pub(super) rx: Option<RxMsg>,
    /// Send MSN whose remaining segments are dropped.
    pub(super) skip_send: Option<u32>,
    /// T-MSN whose remaining segments are dropped.
    pub(super) skip_tagged: Option<u32>,
    /// The tagged (Write, Write-Record) message being received: T-MSN
    /// and the next T-MO expected.
    pub(super) rx_tagged: Option<(u32, u32)>,
    pub(super) ready: bool,
    pub(super) turn_in: bool,
}

impl PeerState {
    pub(super) fn new() -> Self {
        PeerState {
            tx_msn: 1,
            tx_req: 1,
            tx_tmsn: 1,
            tx_resp: 1,
            tx_term: 1,
            all_head: NIL,
            all_tail: NIL,
            sq_head: NIL,
            sq_tail: NIL,
            in_head: NIL,
            in_tail: NIL,
            ord_used: 0,
            ird_used: 0,
            read_hint: NIL,
            gate: None,
            rx: None,
            skip_send: None,
            skip_tagged: None,
            rx_tagged: None,
            ready: false,
            turn_in: false,
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.all_head == NIL
            && self.sq_head == NIL
            && self.in_head == NIL
            && self.ord_used == 0
            && self.ird_used == 0
            && self.gate.is_none()
            && self.rx.is_none()
    }

    pub(super) fn next_term(&mut self) -> u32 {
        let m = self.tx_term;
        self.tx_term = m.wrapping_add(1);
        m
    }
}
