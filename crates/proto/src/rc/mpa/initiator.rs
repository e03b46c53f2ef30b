//! The initiator (active side): sends the MPA Request, waits for the
//! Reply, and works out what both ends agreed on.

use super::*;

/// The initiator (active side) of an MPA negotiation: sends the Request,
/// waits for the Reply.
#[derive(Debug)]
pub struct Initiator {
    cfg: MpaConfig,
    /// The IRD/ORD word we sent (Rev 2).
    sent_word: Option<IrdOrd>,
    sent_trailer: bool,
    tx: TxBuf,
    rx: FrameReader,
    deadline: Option<Instant>,
    state: State,
    outcome: Option<Outcome>,
    failure: Option<MpaError>,
    framing: Option<Framing>,
}

impl Initiator {
    /// Starts a negotiation: the Request is queued for [`Initiator::poll_transmit`]
    /// and the timer runs from `now`.
    ///
    /// Fails with [`MpaError::InvalidConfig`] for a bad `rev`,
    /// `max_private_data`, or P2P with no RTR kind to offer, and with
    /// [`MpaError::UlpPrivateDataTooLong`] if the ULP's private data and the
    /// IRD/ORD word exceed `max_private_data`. The softrdma trailer is left
    /// out (no error) when it alone does not fit.
    pub fn new(cfg: MpaConfig, now: Instant) -> Result<Initiator, MpaError> {
        cfg.validate()?;
        let enhanced = cfg.rev == REV_2;
        let ird = cfg.ird.min(IRD_ORD_MAX);
        let ord = cfg.ord.min(IRD_ORD_MAX);
        let sent_word = enhanced.then(|| {
            let p2p = cfg.p2p;
            IrdOrd {
                ird,
                ord,
                p2p,
                rtr_write: p2p && cfg.rtr.write,
                rtr_read: p2p && cfg.rtr.read && ord >= 1,
                rtr_send: p2p && cfg.rtr.send,
            }
        });
        if let Some(w) = sent_word {
            if w.p2p && !(w.rtr_write || w.rtr_read || w.rtr_send) {
                return Err(MpaError::InvalidConfig(
                    "p2p with no RTR kind to offer (Read needs ord >= 1)",
                ));
            }
        }
        let base = word_len(enhanced) + cfg.private_data.len();
        if base > cfg.max_private_data {
            return Err(MpaError::UlpPrivateDataTooLong {
                len: cfg.private_data.len(),
                max: cfg.max_private_data.saturating_sub(word_len(enhanced)),
            });
        }
        let sent_trailer = cfg.softrdma_ext && base + EXT_TRAILER_LEN <= cfg.max_private_data;
        let repr = MpaRepr {
            markers: cfg.markers,
            crc: cfg.crc,
            rev: cfg.rev,
            ..MpaRepr::request(sent_word, &[])
        };
        let request = build_frame(
            repr,
            &cfg.private_data,
            sent_trailer.then_some(SoftrdmaTrailer::OURS),
        );
        let mut tx = TxBuf::default();
        tx.set(request);
        Ok(Initiator {
            rx: FrameReader::new(FrameKind::Reply, cfg.max_private_data),
            deadline: cfg.deadline(now),
            cfg,
            sent_word,
            sent_trailer,
            tx,
            state: State::AwaitingPeer,
            outcome: None,
            failure: None,
            framing: None,
        })
    }

    /// Feeds octets received from the responder; returns how many were
    /// consumed (never past the end of the Reply). See the module
    /// documentation for the contract.
    pub fn handle_bytes(&mut self, data: &[u8], now: Instant) -> Result<usize, MpaError> {
        match self.state {
            State::AwaitingPeer => {}
            State::Failed => return Err(self.failure.unwrap_or(MpaError::InvalidState)),
            _ => return Ok(0),
        }
        let (used, complete) = match self.rx.feed(data) {
            Ok(r) => r,
            Err(e) => return Err(self.fail(e)),
        };
        if complete {
            match self.process_reply(now) {
                Ok(outcome) => {
                    self.state = match outcome {
                        Outcome::Negotiated(_) => State::Negotiated,
                        _ => State::Rejected,
                    };
                    self.outcome = Some(outcome);
                }
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(used)
    }

    fn fail(&mut self, e: MpaError) -> MpaError {
        self.state = State::Failed;
        self.failure = Some(e);
        self.outcome = Some(Outcome::Failed(e));
        self.tx.clear();
        e
    }

    fn process_reply(&mut self, now: Instant) -> Result<Outcome, MpaError> {
        let f = self.rx.frame();
        let pd = f.private_data();
        let rev = f.rev();
        let enhanced_flag = rev == REV_2 && f.enhanced();
        if f.reject() {
            // Lenient: siw's automatic reject may carry the enhanced flag
            // with no word at all.
            let rest = match pd.get(IRD_ORD_LEN..) {
                Some(rest) if enhanced_flag => rest,
                _ => pd,
            };
            let ulp = match SoftrdmaTrailer::split(rest) {
                Some((ulp, _)) if self.sent_trailer => ulp,
                _ => rest,
            };
            return Ok(Outcome::Rejected {
                private_data: ulp.to_vec(),
            });
        }
        if rev > self.cfg.rev {
            return Err(MpaError::InvalidFrame("Reply Rev above the Request's"));
        }
        // A Rev-2 Reply without the enhanced flag is taken as "no word"
        // (siw would fail the connect; RFC 5044 semantics still work).
        let word = if enhanced_flag {
            let w = IrdOrd::parse(pd)
                .map_err(|_| MpaError::InvalidFrame("enhanced flag without IRD/ORD word"))?;
            Some(w)
        } else {
            None
        };
        let rest = if enhanced_flag {
            &pd[IRD_ORD_LEN..]
        } else {
            pd
        };
        let requested_p2p = self.sent_word.is_some_and(|w| w.p2p);
        if word.is_some_and(|w| w.p2p) && !requested_p2p {
            return Err(MpaError::InvalidFrame("P2P accepted but not requested"));
        }
        // From here on the Reply is well-formed and accepting: a failure
        // may be reported with a Terminate in this framing.
        self.framing = Some(Framing {
            crc: self.cfg.crc || f.crc(),
            markers_tx: f.markers(),
            markers_rx: self.cfg.markers,
        });
        let (ird, ord, rtr) = match (word, self.sent_word) {
            (Some(w), Some(sent)) => {
                let rtr = if w.p2p {
                    let offered = RtrSupport {
                        write: sent.rtr_write,
                        read: sent.rtr_read,
                        send: sent.rtr_send,
                    };
                    pick_rtr(&w, offered).ok_or(MpaError::NoMatchingRtr)?
                } else {
                    // The responder declined P2P.
                    Rtr::InitiatorSendsFirst
                };
                let can_serve = sent.ird.max(self.cfg.max_ird.min(IRD_ORD_MAX));
                if w.ord > can_serve {
                    return Err(MpaError::InsufficientIrd {
                        needed: w.ord,
                        available: can_serve,
                    });
                }
                let ord = sent.ord.min(w.ird);
                if rtr == Rtr::ZeroLengthRead && ord == 0 {
                    return Err(MpaError::InsufficientIrd {
                        needed: 1,
                        available: w.ird,
                    });
                }
                (w.ord, ord, rtr)
            }
            _ => (
                self.cfg.ird.min(IRD_ORD_MAX),
                self.cfg.ord.min(IRD_ORD_MAX),
                Rtr::InitiatorSendsFirst,
            ),
        };
        let (ulp, peer) = match SoftrdmaTrailer::split(rest) {
            Some((ulp, t)) if self.sent_trailer => (ulp, Some(t)),
            _ => (rest, None),
        };
        let peer_is_softrdma = peer.is_some();
        let holdoff = if peer_is_softrdma {
            Duration::ZERO
        } else {
            self.cfg.rtr_holdoff
        };
        Ok(Outcome::Negotiated(Negotiated {
            rev,
            enhanced: word.is_some(),
            crc: self.cfg.crc || f.crc(),
            markers_tx: f.markers(),
            markers_rx: self.cfg.markers,
            ird,
            ord,
            rtr,
            first_fpdu_not_before: Some(now.checked_add(holdoff).unwrap_or(now)),
            peer_private_data: ulp.to_vec(),
            peer_is_softrdma,
            ext_flags: peer.map_or(0, |t| t.flags & EXT_SUPPORTED),
        }))
    }

    /// The octets still to be written to the peer (the Request, or what is
    /// left of it), or `None`. Nothing else is ever queued: the initiator
    /// sends nothing after its Request until the Reply has arrived.
    pub fn poll_transmit(&self) -> Option<&[u8]> {
        self.tx.pending()
    }

    /// Records that the first `n` octets of [`Initiator::poll_transmit`]
    /// were written. `n` above that length is a caller bug (clamped; a debug
    /// assertion).
    pub fn transmitted(&mut self, n: usize) {
        self.tx.advance(n);
    }

    /// When [`Initiator::handle_timeout`] must be called: the deadline for
    /// the Reply, while it is awaited.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitingPeer => self.deadline,
            _ => None,
        }
    }

    /// Fails the negotiation with [`MpaError::Timeout`] if `now` is at or
    /// past the deadline and the Reply has not arrived.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == State::AwaitingPeer && self.deadline.is_some_and(|d| now >= d) {
            self.fail(MpaError::Timeout);
        }
    }

    /// Where the negotiation is.
    pub fn state(&self) -> State {
        self.state
    }

    /// The outcome, once: when the negotiation is over and nothing is left
    /// to transmit.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        if self.tx.is_drained() {
            self.outcome.take()
        } else {
            None
        }
    }

    /// The FPDU framing agreed by an accepting Reply, for a Terminate to send
    /// when the negotiation then failed ([`MpaError::NoMatchingRtr`],
    /// [`MpaError::InsufficientIrd`]), as siw does. `None` if no accepting
    /// Reply was read.
    pub fn terminate_framing(&self) -> Option<Framing> {
        match self.state {
            State::Failed => self.framing,
            _ => None,
        }
    }
}
