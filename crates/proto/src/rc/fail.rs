//! Failure: Terminates, the error state, and completing or flushing
//! send-queue entries.
//!
//! Contract: the first failure wins; the QP enters the error state, a
//! local Terminate (if any) is queued for transmission, and every send
//! work request not yet done completes with an error (the oldest may get
//! a specific status, the rest flush).

use super::*;

impl RcQp {
    /// Enters the error state. `cause`: Terminate to send (ours) or received
    /// (`remote`). `current`: status for the oldest outstanding send WR.
    pub(super) fn fail(
        &mut self,
        cause: Option<TerminateRepr>,
        remote: bool,
        current: Option<WcStatus>,
    ) {
        self.fail_inner(cause, remote, current, None);
    }

    /// Enters the error state because send work request `seq` could not be
    /// framed (a local access failure): it completes with `status`; every
    /// other outstanding one — a Read still awaiting its response ahead of
    /// it included — is flushed.
    pub(super) fn fail_wr(&mut self, seq: u64, status: WcStatus) {
        self.fail_inner(None, false, Some(status), Some(seq));
    }

    /// [`RcQp::fail`]; with `target`, `current` goes to that send work
    /// request instead of the oldest outstanding one.
    pub(super) fn fail_inner(
        &mut self,
        cause: Option<TerminateRepr>,
        remote: bool,
        current: Option<WcStatus>,
        target: Option<u64>,
    ) {
        if self.state == RcState::Error {
            return;
        }
        self.state = RcState::Error;
        // Nothing held is acted on any more (`RcConfig::rnr_wait`).
        self.rx_held = Vec::new();
        self.rx_paused = false;
        if let (Some(t), false) = (cause, remote) {
            self.terminate = Some(t);
            self.terminate_queued = true;
        }
        self.events.push_back(RcEvent::Error {
            cause: cause.map(|t| t.cause),
            remote,
        });
        // The send queue: everything not done completes with an error; the
        // oldest one may get a specific status.
        // Entries behind it flush even if they were already written: the
        // peer discarded everything after the failure.
        let mut first = current;
        let mut behind = false;
        for e in self.sq.iter_mut() {
            if !behind && matches!(e.state, SqState::Done(..)) {
                continue;
            }
            behind = true;
            let st = match target {
                Some(t) if t == e.seq => current,
                Some(_) => None,
                None => first.take(),
            };
            e.state = SqState::Done(st.unwrap_or(WcStatus::WrFlushErr), 0);
        }
        self.sq_cursor = self.sq.len();
        self.ord.clear();
        self.ird.clear();
        // Pending FPDUs not yet started are dropped; a started one must
        // finish so the stream stays framed for the Terminate.
        while self.pending.len() > 1 || self.pending.front().is_some_and(|p| p.written == 0) {
            self.pending.pop_back();
        }
        if let Some(p) = self.pending.front_mut() {
            p.done = Done::Nothing;
        }
        if let Some(r) = self.rx_recv.take() {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(r.wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            ));
        }
        for wr in self.rq.drain() {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            ));
        }
        self.reap_sq();
        if self.terminate.is_none() && self.pending.is_empty() && !self.tx_closed {
            self.tx_closed = true;
            self.events.push_back(RcEvent::TxClosed);
        }
    }

    /// A Terminate we send about the segment being received.
    pub(super) fn terminate_about(
        &self,
        cause: TerminateCause,
        with_read_request: bool,
    ) -> TerminateRepr {
        let mut t = TerminateRepr::new(cause);
        if let Some(seg) = &self.rx_seg {
            if let Some(echo) = seg.echo {
                t.segment_len = Some(seg.payload_len.min(u64::from(u16::MAX)) as u16);
                t.ddp_header = Some(echo);
            }
            if with_read_request {
                if let RdmapBody::ReadRequest(r) = seg.repr.body {
                    t.rdmap_header = Some(r.to_bytes());
                }
            }
        }
        t
    }

    /// Protocol error found while receiving: send a Terminate and fail.
    pub(super) fn rx_error(&mut self, cause: TerminateCause, with_read_request: bool) {
        let t = self.terminate_about(cause, with_read_request);
        if let Some(seg) = &mut self.rx_seg {
            seg.target = Target::Discard;
        }
        self.fail_rx_recv();
        self.fail(Some(t), false, Some(WcStatus::RemOpErr));
    }

    /// A receive whose message broke the protocol (or arrived corrupted)
    /// fails with an operation error; other receives just flush.
    pub(super) fn fail_rx_recv(&mut self) {
        if let Some(r) = self.rx_recv.take() {
            self.completions.push_back((
                CqKind::Recv,
                WorkCompletion::new(r.wr.wr_id, WcStatus::RemOpErr, WcOpcode::Recv, 0),
            ));
        }
    }

    /// Moves finished SQ entries at the front to the completion queue, in
    /// order (verbs completes send work in posting order).
    pub(super) fn reap_sq(&mut self) {
        while let Some(e) = self.sq.front() {
            let SqState::Done(status, len) = e.state else {
                break;
            };
            let e = self.sq.pop_front().expect("front exists");
            self.sq_cursor = self.sq_cursor.saturating_sub(1);
            if e.wr.flags.signaled || status != WcStatus::Success {
                self.completions.push_back((
                    CqKind::Send,
                    WorkCompletion::new(e.wr.wr_id, status, WcOpcode::of(&e.wr.op), len),
                ));
            }
        }
    }

    pub(super) fn sq_entry_mut(&mut self, seq: u64) -> Option<&mut SqEntry> {
        let front = self.sq.front()?.seq;
        let i = seq.checked_sub(front)? as usize;
        self.sq.get_mut(i)
    }

    pub(super) fn complete_seq(&mut self, seq: u64, status: WcStatus, len: u32) {
        if let Some(e) = self.sq_entry_mut(seq) {
            e.state = SqState::Done(status, len);
        }
        self.reap_sq();
    }

    // ------------------------------------------------------------------
    // Transmit
    // ------------------------------------------------------------------
}
