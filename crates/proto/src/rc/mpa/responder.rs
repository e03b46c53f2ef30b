//! The responder (passive side): reads the MPA Request, lets the ULP
//! accept or reject it, and sends the Reply.

use super::*;

/// What the responder remembers between the Request and the ULP's decision.
#[derive(Debug)]
struct Pending {
    request: PeerRequest,
    reply_rev: u8,
    /// We answer with the enhanced flag and an IRD/ORD word.
    answer_enhanced: bool,
    crc: bool,
    /// The initiator's softrdma trailer, if one was recognised.
    peer_trailer: Option<SoftrdmaTrailer>,
}

/// The responder (passive side) of an MPA negotiation: waits for the
/// Request, lets the ULP decide, sends the Reply.
#[derive(Debug)]
pub struct Responder {
    cfg: MpaConfig,
    tx: TxBuf,
    rx: FrameReader,
    deadline: Option<Instant>,
    state: State,
    pending: Option<Pending>,
    outcome: Option<Outcome>,
    failure: Option<MpaError>,
}

impl Responder {
    /// Starts waiting for the Request; the timer runs from `now`. Fails with
    /// [`MpaError::InvalidConfig`] for a bad `rev` or `max_private_data`.
    pub fn new(cfg: MpaConfig, now: Instant) -> Result<Responder, MpaError> {
        cfg.validate()?;
        Ok(Responder {
            rx: FrameReader::new(FrameKind::Request, MAX_PRIVATE_DATA),
            deadline: cfg.deadline(now),
            cfg,
            tx: TxBuf::default(),
            state: State::AwaitingPeer,
            pending: None,
            outcome: None,
            failure: None,
        })
    }

    /// Feeds octets received from the initiator; returns how many were
    /// consumed (never past the end of the Request). See the module
    /// documentation for the contract.
    ///
    /// An invalid Request fails the negotiation; for the errors listed in
    /// the module documentation a Reply with R=1 is queued first.
    pub fn handle_bytes(&mut self, data: &[u8], _now: Instant) -> Result<usize, MpaError> {
        match self.state {
            State::AwaitingPeer => {}
            State::Failed => return Err(self.failure.unwrap_or(MpaError::InvalidState)),
            _ => return Ok(0),
        }
        let (used, complete) = match self.rx.feed(data) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e, None)),
        };
        if complete {
            self.process_request()?;
        }
        Ok(used)
    }

    /// Fails; with `reject`, that rejecting Reply is queued.
    fn fail(&mut self, e: MpaError, reject: Option<Vec<u8>>) -> MpaError {
        self.state = State::Failed;
        self.failure = Some(e);
        self.outcome = Some(Outcome::Failed(e));
        self.pending = None;
        match reject {
            Some(reply) => self.tx.set(reply),
            None => self.tx.clear(),
        }
        e
    }

    fn process_request(&mut self) -> Result<(), MpaError> {
        let f = self.rx.frame();
        let rev = f.rev();
        let (req_crc, req_markers, req_reject) = (f.crc(), f.markers(), f.reject());
        let enhanced = rev == REV_2 && f.enhanced();
        let pd = f.private_data().to_vec();
        let reply_rev = rev.min(self.cfg.rev);
        let crc = self.cfg.crc || req_crc;
        let answer_enhanced = enhanced && reply_rev == REV_2;
        let auto_reject = |this: &mut Responder, e: MpaError, word: Option<IrdOrd>| {
            let reply = reject_frame(reply_rev, word, crc);
            this.fail(e, Some(reply))
        };
        if req_reject {
            let e = MpaError::InvalidFrame("R set in a Request");
            return Err(auto_reject(self, e, None));
        }
        if pd.len() > self.cfg.max_private_data {
            let e = MpaError::PrivateDataTooLong {
                len: pd.len(),
                max: self.cfg.max_private_data,
            };
            return Err(auto_reject(self, e, None));
        }
        let word = if enhanced {
            match IrdOrd::parse(&pd) {
                Ok(w) => Some(w),
                Err(_) => {
                    let e = MpaError::InvalidFrame("enhanced flag without IRD/ORD word");
                    return Err(auto_reject(self, e, None));
                }
            }
        } else {
            None
        };
        let rest = if enhanced {
            &pd[IRD_ORD_LEN..]
        } else {
            &pd[..]
        };
        let (ulp, peer_trailer) = match SoftrdmaTrailer::split(rest) {
            Some((ulp, t)) if self.cfg.softrdma_ext => (ulp, Some(t)),
            _ => (rest, None),
        };
        let rtr = match word {
            Some(w) if w.p2p && answer_enhanced && self.cfg.p2p => {
                match pick_rtr(&w, self.cfg.rtr) {
                    Some(rtr) => rtr,
                    None => {
                        let word = Some(IrdOrd::new(0, 0));
                        return Err(auto_reject(self, MpaError::NoMatchingRtr, word));
                    }
                }
            }
            _ => Rtr::InitiatorSendsFirst,
        };
        let request = PeerRequest {
            rev,
            crc: req_crc,
            markers: req_markers,
            ird_ord: word,
            rtr,
            private_data: ulp.to_vec(),
            peer_is_softrdma: peer_trailer.is_some(),
        };
        self.pending = Some(Pending {
            request,
            reply_rev,
            answer_enhanced,
            crc,
            peer_trailer,
        });
        self.state = State::RequestReceived;
        Ok(())
    }

    /// The Request, while the ULP has to decide ([`State::RequestReceived`]).
    pub fn request(&self) -> Option<&PeerRequest> {
        self.pending.as_ref().map(|p| &p.request)
    }

    /// Accepts the Request: queues the Reply with the ULP's `private_data`
    /// and its wished `ird`/`ord` (negotiated as the module documentation
    /// says; clamped to 0x3FFF). The outcome is
    /// [`Outcome::Negotiated`].
    ///
    /// Fails with [`MpaError::InvalidState`] outside
    /// [`State::RequestReceived`], and with
    /// [`MpaError::UlpPrivateDataTooLong`] if `private_data` plus the
    /// IRD/ORD word exceed `max_private_data`; the state is then unchanged.
    pub fn accept(&mut self, private_data: &[u8], ird: u16, ord: u16) -> Result<(), MpaError> {
        let p = self.pending.as_ref().ok_or(MpaError::InvalidState)?;
        let base = word_len(p.answer_enhanced) + private_data.len();
        if base > self.cfg.max_private_data {
            return Err(MpaError::UlpPrivateDataTooLong {
                len: private_data.len(),
                max: self
                    .cfg
                    .max_private_data
                    .saturating_sub(word_len(p.answer_enhanced)),
            });
        }
        let Some(p) = self.pending.take() else {
            return Err(MpaError::InvalidState);
        };
        let ird = ird.min(IRD_ORD_MAX);
        let ord = ord.min(IRD_ORD_MAX);
        let rtr = p.request.rtr;
        let (ird, ord, word) = match p.request.ird_ord {
            Some(peer) if p.answer_enhanced => {
                let cap = ird.max(self.cfg.max_ird.min(IRD_ORD_MAX));
                let mut our_ird = ird.max(peer.ord).min(cap);
                if rtr == Rtr::ZeroLengthRead {
                    our_ird = our_ird.max(1);
                }
                let our_ord = ord.min(peer.ird);
                (our_ird, our_ord, Some(rtr.word(our_ird, our_ord)))
            }
            _ => (ird, ord, None),
        };
        let trailer = (p.request.peer_is_softrdma
            && base + EXT_TRAILER_LEN <= self.cfg.max_private_data)
            .then_some(SoftrdmaTrailer::OURS);
        let ext_flags = match (trailer, p.peer_trailer) {
            (Some(_), Some(peer)) => peer.flags & EXT_SUPPORTED,
            _ => 0,
        };
        let repr = MpaRepr {
            markers: self.cfg.markers,
            crc: p.crc,
            rev: p.reply_rev,
            ..MpaRepr::reply(word, &[])
        };
        self.tx.set(build_frame(repr, private_data, trailer));
        self.outcome = Some(Outcome::Negotiated(Negotiated {
            rev: p.reply_rev,
            enhanced: word.is_some(),
            crc: p.crc,
            markers_tx: p.request.markers,
            markers_rx: self.cfg.markers,
            ird,
            ord,
            rtr,
            first_fpdu_not_before: None,
            peer_private_data: p.request.private_data,
            peer_is_softrdma: trailer.is_some(),
            ext_flags,
        }));
        self.state = State::Negotiated;
        Ok(())
    }

    /// Rejects the Request: queues a Reply with R=1 and the ULP's
    /// `private_data` (after the IRD/ORD word when the Reply is enhanced).
    /// The outcome is [`Outcome::Rejected`].
    ///
    /// Fails like [`Responder::accept`], leaving the state unchanged.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), MpaError> {
        let p = self.pending.as_ref().ok_or(MpaError::InvalidState)?;
        let wl = word_len(p.answer_enhanced);
        if wl + private_data.len() > self.cfg.max_private_data {
            return Err(MpaError::UlpPrivateDataTooLong {
                len: private_data.len(),
                max: self.cfg.max_private_data.saturating_sub(wl),
            });
        }
        let Some(p) = self.pending.take() else {
            return Err(MpaError::InvalidState);
        };
        let word = p.answer_enhanced.then(|| IrdOrd::new(0, 0));
        let repr = MpaRepr {
            reject: true,
            crc: p.crc,
            rev: p.reply_rev,
            ..MpaRepr::reply(word, &[])
        };
        self.tx.set(build_frame(repr, private_data, None));
        self.outcome = Some(Outcome::Rejected {
            private_data: private_data.to_vec(),
        });
        self.state = State::Rejected;
        Ok(())
    }

    /// The octets still to be written to the peer (the Reply, or what is
    /// left of it), or `None`.
    pub fn poll_transmit(&self) -> Option<&[u8]> {
        self.tx.pending()
    }

    /// Records that the first `n` octets of [`Responder::poll_transmit`]
    /// were written. `n` above that length is a caller bug (clamped; a debug
    /// assertion).
    pub fn transmitted(&mut self, n: usize) {
        self.tx.advance(n);
    }

    /// When [`Responder::handle_timeout`] must be called: the deadline for
    /// the Request, while it is awaited. The ULP's decision time is not
    /// bounded here.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitingPeer => self.deadline,
            _ => None,
        }
    }

    /// Fails the negotiation with [`MpaError::Timeout`] if `now` is at or
    /// past the deadline and the Request has not arrived.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::AwaitingPeer && self.deadline.is_some_and(|d| now >= d) {
            self.fail(MpaError::Timeout, None);
        }
    }

    /// Where the negotiation is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The outcome, once: when the negotiation is over and the Reply (if
    /// any) has been fully transmitted.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        if self.tx.is_drained() {
            self.outcome.take()
        } else {
            None
        }
    }
}
