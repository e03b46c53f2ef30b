//! The one interface the engine drives every datagram QP through, UD
//! ([`crate::ud::UdQp`]) and RD alike, so the UDP runtime is written once.
//!
//! Every method has the meaning it has on [`crate::ud::UdQp`]: posting
//! carries the destination per work request, datagrams come in with their
//! source address, transmit goes through a [`DatagramSink`], time is passed
//! in.
//!
//! # Layout
//!
//! This file holds the [`DatagramQp`] trait and [`DgramEvent`]. Beside it:
//! `sink` ([`DatagramSink`], [`Datagram`], [`TX_BATCH`], and how a batch
//! is offered: gathered, or framed back to back in a staging buffer),
//! `fifo` (the receive queue), `segment` (segment helpers), and
//! [`record`] (Write-Record placement and completion).
//!
//! Contract: what lives here knows nothing of one transport's rules; UD
//! and RD each decide what goes into a datagram.

use std::io;
use std::net::IpAddr;
use std::time::Instant;

use softrdma_wire::rdmap::Opcode;

use crate::memory::{MemError, Memory};
use crate::ud::{UdEvent, UdQp};
use crate::wr::{CqKind, DgramAddr, PostError, RecvWr, SendWr, WorkCompletion};
use record::Tracker;

mod fifo;
pub mod record;
mod segment;
mod sink;

pub(crate) use fifo::RecvFifo;
pub(crate) use segment::set_rsvd_ulp;
#[cfg(test)]
pub(crate) use sink::STAGE_MAX_DGRAM;
pub(crate) use sink::{offer, offer_staged, STAGE_MIN_BATCH};
pub use sink::{Datagram, DatagramSink, TX_BATCH};

/// Asynchronous events of a datagram QP. None of them stops the QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DgramEvent {
    /// A Write or Write-Record segment failed the remote access checks;
    /// nothing of it was placed.
    RemoteAccess {
        /// Who sent it.
        src: DgramAddr,
        /// The opcode.
        opcode: Opcode,
        /// Its (T-)MSN.
        msn: u32,
        /// The STag it named.
        stag: u32,
        /// Its TO.
        to: u64,
        /// Its payload length.
        len: u32,
        /// Why the memory refused it.
        error: MemError,
    },
    /// RD: a peer stopped answering (retry limit); its work failed, other
    /// peers are unaffected.
    PeerFailed {
        /// The peer.
        peer: DgramAddr,
    },
}

impl From<UdEvent> for DgramEvent {
    fn from(e: UdEvent) -> Self {
        match e {
            UdEvent::RemoteAccess {
                src,
                opcode,
                msn,
                stag,
                to,
                len,
                error,
            } => DgramEvent::RemoteAccess {
                src,
                opcode,
                msn,
                stag,
                to,
                len,
                error,
            },
        }
    }
}

/// A datagram queue pair as the engine sees it.
pub trait DatagramQp {
    /// The QP number.
    fn qpn(&self) -> u32;
    /// Posts a send work request to `dest`.
    fn post_send(&mut self, wr: SendWr, dest: DgramAddr) -> Result<(), PostError>;
    /// Posts a receive.
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError>;
    /// A datagram addressed to this QP arrived from `src_ip:src_port`; the
    /// time is asked of `now` only if the datagram needs it (a timer to
    /// start): reading the clock costs a receive some 30 ns, and a UD
    /// message in one datagram starts none. `now` may be called more than
    /// once and should then give the same instant.
    fn handle_datagram_lazy<M: Memory, F: FnMut() -> Instant>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        now: F,
    );
    /// [`DatagramQp::handle_datagram_lazy`] with the time at hand.
    fn handle_datagram<M: Memory>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        now: Instant,
    ) {
        self.handle_datagram_lazy(src_ip, src_port, data, mem, || now)
    }
    /// Hands datagrams to `sink`; returns how many were accepted.
    fn poll_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
    ) -> io::Result<usize>;
    /// `post_send` then `poll_transmit`, as one call (the outer error: the
    /// post was refused; the inner: what `poll_transmit` returned). A QP
    /// may send a lone small message without queueing it
    /// ([`UdQp::post_send_and_transmit`]); the effect must be the same.
    fn post_send_and_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        wr: SendWr,
        dest: DgramAddr,
        mem: &M,
        sink: &mut S,
    ) -> Result<io::Result<usize>, PostError> {
        self.post_send(wr, dest)?;
        Ok(self.poll_transmit(mem, sink))
    }
    /// True if `poll_transmit` has something to send now.
    fn wants_transmit(&self) -> bool;
    /// The next completion and the queue it belongs to.
    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)>;
    /// The next asynchronous event.
    fn poll_event(&mut self) -> Option<DgramEvent>;
    /// When `handle_timeout` is next due.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Runs the timers due at `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// Write-Record records and the validity map.
    fn record_tracker(&mut self) -> &mut Tracker;
    /// Tells the QP the current time before a call that has no `now`
    /// argument (`post_send`, `poll_transmit`); QPs without timers on
    /// those paths ignore it.
    fn set_now(&mut self, _now: Instant) {}
    /// True if the QP reads the time given by [`DatagramQp::set_now`];
    /// a runtime may skip reading its clock for one that does not.
    fn wants_now(&self) -> bool {
        true
    }
}

impl DatagramQp for UdQp {
    #[inline]
    fn qpn(&self) -> u32 {
        UdQp::qpn(self)
    }
    #[inline]
    fn post_send(&mut self, wr: SendWr, dest: DgramAddr) -> Result<(), PostError> {
        UdQp::post_send(self, wr, dest)
    }
    #[inline]
    fn post_send_and_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        wr: SendWr,
        dest: DgramAddr,
        mem: &M,
        sink: &mut S,
    ) -> Result<io::Result<usize>, PostError> {
        UdQp::post_send_and_transmit(self, wr, dest, mem, sink)
    }
    #[inline]
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        UdQp::post_recv(self, wr)
    }
    #[inline]
    fn handle_datagram_lazy<M: Memory, F: FnMut() -> Instant>(
        &mut self,
        src_ip: IpAddr,
        src_port: u16,
        data: &[u8],
        mem: &mut M,
        now: F,
    ) {
        UdQp::handle_datagram_lazy(self, src_ip, src_port, data, mem, now)
    }
    #[inline]
    fn poll_transmit<M: Memory, S: DatagramSink>(
        &mut self,
        mem: &M,
        sink: &mut S,
    ) -> io::Result<usize> {
        UdQp::poll_transmit(self, mem, sink)
    }
    #[inline]
    fn wants_transmit(&self) -> bool {
        UdQp::wants_transmit(self)
    }
    #[inline]
    fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
        UdQp::poll_completion(self)
    }
    #[inline]
    fn poll_event(&mut self) -> Option<DgramEvent> {
        UdQp::poll_event(self).map(DgramEvent::from)
    }
    #[inline]
    fn poll_timeout(&self) -> Option<Instant> {
        UdQp::poll_timeout(self)
    }
    #[inline]
    fn handle_timeout(&mut self, now: Instant) {
        UdQp::handle_timeout(self, now)
    }
    #[inline]
    fn record_tracker(&mut self) -> &mut Tracker {
        UdQp::record_tracker(self)
    }
    /// UD has no timer on its post or transmit paths.
    #[inline]
    fn wants_now(&self) -> bool {
        false
    }
}
