//! Datagram queue pairs, UD ([`Context::create_ud_qp`]) and RD
//! ([`Context::create_rd_qp`]), over real UDP sockets.
//!
//! The protocol engines are sans-IO ([`softrdma_proto::dgram::DatagramQp`]);
//! this module gives them sockets, threads and a clock, the way [`crate::qp`]
//! does for RC.
//!
//! # Sockets, ports and QP numbers
//!
//! A context opens UDP sockets on demand, each bound to `(addr, port)`
//! ([`UdOptions::bind`]; port 0 lets the kernel pick) and shared by up to
//! 256 QPs. A QP's number is `(port << 8) | slot` (the convention of
//! [`crate::ibconn`]), so `(IP, QPN)` alone tells a peer
//! where to send: the UDP port is `qpn >> 8`. A QP created with port 0
//! takes a free slot of any socket of this context bound to the same IP,
//! or opens a new socket. QPN `0xFFFFFF` ([`MCAST_QPN`], port 65535 slot
//! 255) is never handed out: it means "every attached QP" on multicast.
//!
//! Every socket has DF set (`IP_PMTUDISC_DO`): nothing is ever
//! IP-fragmented, segments are sized for the path MTU the QP is given
//! ([`UdOptions::mtu`], else `SOFTRDMA_DGRAM_MTU`, default 1500), and a
//! datagram too large for the real path fails its work request
//! (`EMSGSIZE` → `GeneralErr`) instead of being fragmented.
//!
//! # Receive
//!
//! The progress thread (epoll, level-triggered) and inline progress from
//! [`crate::Cq::poll`] read a socket with `recvmmsg`, up to 8 buffers
//! (datagrams, or GRO runs of them, see below) per call, into buffers
//! allocated once per socket (no allocation per datagram). Each datagram is demultiplexed on its
//! destination QPN ([`dest_qpn`]: the DQPN word of a UD datagram, the shim's
//! DQPN of an RD one): the QPN's port must be the socket's, its low octet
//! names the slot. Consecutive datagrams for the same QP are handled under
//! one acquisition of its lock and one registry view
//! (`handle_datagram`); then its completions go to the CQs (under the QP
//! lock, as in [`crate::qp`], so a QP's completions keep their order
//! whichever thread makes progress) and its events, after the lock is
//! released, to the async event queue ([`AsyncEvent::DgramRemoteAccessError`],
//! [`AsyncEvent::DgramPeerFailed`]). A datagram for no QP, without a DQPN,
//! or truncated is dropped and counted ([`SocketStats`]); everything else
//! is the protocol engine's to check.
//!
//! # Transmit
//!
//! On the caller's thread in [`DgramQpHandle::post_send`]: the engine
//! hands datagrams (framed whole in a staging buffer for batches of five
//! or more, gathered from header, registered memory and CRC trailer
//! otherwise; `softrdma_proto::ud`) to a [`DatagramSink`] over the socket
//! that sends each batch with one `sendmmsg`, io-vectors that continue one
//! another merged. When the socket pushes back
//! (`WouldBlock`) the QP waits on the socket's writability, which the
//! progress thread watches and then resumes the QP's transmit.
//!
//! UDP segmentation offload pays and is on by default
//! (`SOFTRDMA_DGRAM_OFFLOAD=0` turns it off): within each batch the sink
//! sends every run of equal-sized datagrams to one destination (the
//! segments of a message) as one GSO message (`UDP_SEGMENT`), several per
//! `sendmmsg`, and sockets have `UDP_GRO` on, so such a run arrives as one
//! buffer that the receive path splits back into the protocol's
//! datagrams (each still CRC-checked on its own). The wire is unchanged:
//! the same datagrams, the kernel (or NIC) does the cutting. A path whose
//! device refuses GSO gets plain `sendmmsg` from then on. Measured with
//! `examples/ud_quickbench.rs` on this 2-core VM over loopback (one
//! process, 16 messages in flight, three runs each): 64 KiB messages at
//! MTU 1500 go from 0.30 GB/s to 1.4–2.7 GB/s, at MTU 9000 from
//! 1.4–1.6 to 4.1–4.3 GB/s; 4 KiB messages at MTU 1500 from 0.28 to
//! 0.41–0.46 GB/s; single-datagram messages are unchanged.
//!
//! # Timers
//!
//! Reassembly, Write-Record partial timeouts and (RD) retransmission are
//! due whether or not anybody polls: after every operation a QP asks its
//! engine for `poll_timeout` and, when that is earlier than the deadline
//! it has armed, arms the progress thread's timer for its token
//! (`progress.rs`). When it fires, the progress thread runs
//! `handle_timeout`, transmits what that produced, flushes completions and
//! re-arms. An armed deadline that became unnecessary just fires early
//! and finds nothing to do.
//!
//! A busy poller runs due timers itself: inline progress
//! ([`crate::Cq::poll`]) compares the QP's armed deadline (an atomic
//! mirror, no lock) with the clock and, when it has passed, runs
//! `handle_timeout` under a try-locked QP lock. Once a spinning poller
//! has run a QP's timers, the QP is *watched* (set under the QP lock, by
//! the poller only): the progress thread holds only a
//! look-again deadline for it, and the deadlines the QP re-arms (every
//! RD message re-arms its retransmission timer or the deferred-ACK
//! fallback) are left to the poller instead of being armed with the
//! thread, whose every wake-up (an eventfd write when the new deadline
//! is earlier than its sleep) takes a core from a poller on a small
//! machine. When the look-again fires and the poller looked at the
//! timers within the last `PARK_RECHECK`, the thread does not take the
//! QP lock but looks again twice as late, up to `PARK_RECHECK_MAX` (the
//! first look-again is `WATCH_FIRST`, 4 ms, away; a QP that arms a
//! deadline while a poller spins on its socket becomes watched too);
//! otherwise it takes the timers back (drains the socket, runs them,
//! arms every deadline with itself again). Arming a CQ of the QP
//! (`req_notify`) hands the timers back at once. So a poller that stops
//! without arming a CQ leaves its timers up to about two look-again
//! periods late (16 ms after a long spin; an RD peer may re-send once
//! meanwhile). An RD retransmission or delayed ACK of a busy-polled QP
//! is thus not rounded up to the thread's millisecond sleep, and the
//! thread neither holds the QP lock the poller needs (with RD's
//! retransmission timer re-armed by every message it did every few
//! milliseconds: in a 64 B RD ping-pong of 5000 round trips, 113
//! `futex` calls before, 2 after) nor wakes for each message (a 64 B RD
//! `send_lat` p99 of 15-20 µs before, 5 µs after).
//! [`DgramQpStats::timers_inline`] and [`DgramQpStats::timers_thread`]
//! count who ran them; [`DgramQpStats::thread_arms`] and
//! [`DgramQpStats::thread_look_agains`] how often the thread was armed.
//!
//! # Self-driven datagram QPs
//!
//! A QP created with [`UdOptions::self_driven`] (or
//! [`RdOptions::self_driven`]) gets a UDP socket of its own, shared with
//! no other QP, which the progress thread never reads for arrivals: the
//! socket is known to the thread (its token, its timer, write interest
//! while the QP waits for room) but is not in its epoll set for reading.
//! The QP's user reads it: [`crate::Cq::poll`]'s inline progress drains
//! it on the polling thread, and a user with nothing to do sleeps on
//! [`DgramQpHandle::socket_fd`] (readable) itself — with a CQ of the QP
//! armed and its completion channel beside it, for what the thread still
//! completes (below). A datagram that arrives while the user sleeps thus
//! wakes the user directly, instead of the progress thread, which then
//! signals the channel, which wakes the user (two thread hand-offs per
//! datagram, and on a small machine a core taken from the peer). This is
//! what the sockets interposer's UDP sockets use, as its TCP sockets use
//! [`crate::Qp::set_self_driven`]. What the thread still does:
//!
//! * **Timers** (reassembly, Write-Record partial timeouts, RD
//!   retransmission, delayed ACKs, probes, expiry) run as for any QP (see
//!   Timers), including the look-agains of a busy poller. A timer the
//!   thread runs drains the socket first, as for any QP, so a message
//!   whose last segments wait in the kernel is completed, not retired
//!   as idle; completions it makes go to the CQ (and fire an armed
//!   channel).
//! * **Back-pressure**: a send the socket refuses (`WouldBlock`) makes the
//!   QP wait for writability as any QP does: the socket joins the thread's
//!   epoll set for writes only, and the thread resumes the transmit.
//! * **RD liveness**: a user that makes no call for a while (a program
//!   that does not read its socket) must not make its RD peers give up on
//!   it (they retransmit unacknowledged messages and fail after their
//!   retry span, about 4 s). Every 10 ms the thread looks at a
//!   self-driven RD QP's socket and, when no inline poll ran since its
//!   previous look, reads what arrived (acknowledging and placing it into
//!   posted receives). A self-driven UD QP gets no such look: what
//!   arrives while its user is in no call waits in the kernel socket's
//!   buffer, and what does not fit is dropped there — UDP's behaviour.
//!
//! A self-driven QP's socket is closed with the QP.
//!
//! # Multicast
//!
//! `ibv_attach_mcast` semantics, IPv4 only: [`DgramQpHandle::attach_mcast`]
//! joins the group on the interface of the QP's socket address (any
//! interface, chosen by route, for a socket bound to 0.0.0.0). A sender
//! addresses a group as
//! `DgramAddr { ip: group, port: SOFTRDMA_MCAST_PORT, qpn: MCAST_QPN }`
//! ([`Context::mcast_dest`]); every QP attached to the group receives a
//! copy (a QPN other than [`MCAST_QPN`] reaches only that attached QP).
//!
//! Why a fixed, well-known port: a group send is one datagram to one UDP
//! port, while receiving QPs live on sockets with different (ephemeral)
//! ports, in different processes or network namespaces. So every context
//! with an attached QP also listens on the multicast port
//! (`SOFTRDMA_MCAST_PORT`, default 18516) with a second socket bound to
//! `0.0.0.0:port` with `SO_REUSEADDR` + `SO_REUSEPORT` (every such socket
//! on a host gets its own copy of each multicast datagram), with
//! `IP_MULTICAST_ALL` off (it sees only the groups its own context
//! joined) and `IP_PKTINFO` (it learns which group a datagram was sent
//! to, and hands it only to QPs attached to that group). Example: one
//! sender and three receiving QPs in two network namespaces joined by a
//! veth pair: the sender's socket is bound to its veth address (multicast
//! leaves through that interface, `IP_MULTICAST_IF`); the receivers' QPs
//! are bound to their namespace's veth address and joined there; each
//! receiving context has its own multicast socket on port 18516 of its
//! namespace (namespaces have separate port spaces; two contexts in one
//! namespace share the port through `SO_REUSEPORT`). The datagram reaches
//! the other namespace over the veth and the sender's own namespace
//! through multicast loopback (`IP_MULTICAST_LOOP`, on). TTL is 1: groups
//! are link-local. A QP receives a group's datagrams only from the
//! interface it joined on, so attach QPs whose sockets are bound to an
//! address of the link the sender uses.
//!
//! A UD QP accepts DQPN [`MCAST_QPN`] as addressed to itself, so the
//! multicast path hands every attached QP the datagram as received.
//!
//! # Adding a transport
//!
//! The runtime only uses [`DatagramQp`] through the `AnyQp` enum. A
//! transport is one line in the `dgram_kinds!` invocation
//! (`Rd(RdQp, RdQpCounters, rd_counters)`: a type implementing
//! [`DatagramQp`], the type of its counters in [`ProtoStats`] and the
//! function reading them) and a `Context::create_*_qp` constructor
//! (through `create_dgram_qp`, which does the socket, slot, CQ and
//! progress wiring for any kind). The runtime calls
//! [`DatagramQp::set_now`] before `post_send` and `poll_transmit` (RD
//! reads its clock there: RTO samples, ACK timing) when the QP
//! [`DatagramQp::wants_now`]; UD does not, so its sends read no clock.
//!
//! An RD QP's retransmission, delayed-ACK, probe and expiry deadlines are
//! ordinary `poll_timeout` deadlines (see Timers), so a peer that stops
//! answering fails (its work requests complete with `RetryExcErr`,
//! [`AsyncEvent::DgramPeerFailed`] is raised) whether or not anybody
//! polls.
//!
//! # Locks
//!
//! Socket receive lock → slot table / group list (briefly) → QP core →
//! registration table (read) → CQ entries / async events. Transmit: QP
//! core → registration table, then the socket's writability list. Nothing
//! takes a socket's receive lock while holding a QP lock, and inline
//! progress only try-locks the receive lock.

use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::time::{Duration, Instant};

use softrdma_proto::dgram::{DatagramQp, DgramEvent};
use softrdma_proto::memory::Memory;
use softrdma_proto::rc::{CqKind, PostError};
use softrdma_proto::rd::RdStats;
use softrdma_proto::rdqp::{self, RdQp, RdQpConfig, RdQpConfigError, RdQpStats};
use softrdma_proto::record::{PartialAction, RecordStats, Tracker};
use softrdma_proto::ud::{Datagram, DatagramSink, UdConfig, UdConfigError, UdQp, UdStats};
use softrdma_proto::wr::{DgramAddr, RecvWr, SendWr, WorkCompletion};
use softrdma_wire::rd::Framing;

use crate::cq::{AsyncEvent, Completion, Cq, Direct, InlineProgress};
use crate::progress::{Parking, Progress, Source, PARK_RECHECK, PARK_RECHECK_MAX};

/// The first look-again of a watched QP's timers (module docs); it doubles
/// up to [`PARK_RECHECK_MAX`] while the poller is still there. Half the
/// longest period rather than the socket parking's 1 ms: a look-again is
/// a wake-up that takes a core from a poller, and the first milliseconds
/// of a ping-pong had four of them per process (1, 3, 7, 15 ms) beside
/// the socket's own re-checks — the p99 of a 2 000-message RD cell. A
/// poller that stops without arming its CQ still hands its timers over
/// within two periods (16 ms at most, as before).
const WATCH_FIRST: Duration = Duration::from_millis(4);
use crate::sys;
use crate::udp::{self, RxRing};
use crate::{Context, QpCaps, QpError, Shared};

/// The destination QPN meaning "every QP attached to the group" (IB's
/// multicast QPN).
pub use softrdma_proto::ud::MCAST_QPN;

/// `recvmmsg` calls per readiness event (then epoll is asked again, so one
/// busy socket cannot starve the others).
const RX_ROUNDS_THREAD: usize = 8;
/// `recvmmsg` calls per inline poll.
const RX_ROUNDS_INLINE: usize = 2;
/// When the transmit a busy poller's receive deferred goes out through
/// the timer if no poll, post or CQ arming came first
/// (`DgramQpShared::receive`). A quarter of RD's smallest RTO (2 ms); the
/// progress thread sleeps in whole milliseconds (rounded up), so in
/// effect it fires after about 1 ms, still half the RTO.
const DEFERRED_TX_FALLBACK: Duration = Duration::from_micros(500);

/// Inline polls that read at most one datagram, of a QP with a timer
/// armed, per reading of the clock for it (`progress_inline`; a poll that
/// read a batch always reads it): at a few hundred nanoseconds such a
/// poll, due timers run within some microseconds.
const INLINE_CLOCK_EVERY: u32 = 16;
/// The longest a due timer waits for a busy poller's reading of the
/// clock: a poller whose readings come further apart than this (its polls
/// are not that busy) reads it on every poll again, and one whose polls
/// come [`INLINE_CLOCK_EVERY`] times faster goes back to every 16th.
const INLINE_CLOCK_GAP_NS: u64 = 50_000;
/// How often the progress thread looks at a self-driven RD QP's socket
/// for what arrived while its user was in no call (`look_idle`): well
/// within RD's retry span (about 4 s), and rare enough to cost nothing.
const SELF_DRIVEN_LOOK: Duration = Duration::from_millis(10);
/// Progress-thread tokens of datagram sockets and QPs: above every RC QP's
/// token (a u32 QPN).
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1 << 40);

/// `at` as nanoseconds since a process-wide epoch, at least 1 (0 means
/// "no deadline" in [`DgramQpShared`]'s atomic mirror of its timer).
fn deadline_ns(at: Instant) -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let e = *EPOCH.get_or_init(Instant::now);
    (at.saturating_duration_since(e).as_nanos() as u64).max(1)
}

fn next_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// The QPN a datagram is addressed to, for either framing (`docs/datagram.md`
/// §9.1; the first octet tells them apart, so UD and RD QPs share sockets):
/// a UD datagram's DQPN word, an RD datagram's shim DQPN
/// ([`rdqp::dqpn_of`]). `None` if the first octet is reserved, the
/// datagram too short, or a UD datagram carries no DQPN. Nothing else is
/// checked (the CRC included): the QP does that.
pub fn dest_qpn(datagram: &[u8]) -> Option<u32> {
    rdqp::dqpn_of(datagram)
}

// ----------------------------------------------------------------------
// The protocol engines, behind one enum
// ----------------------------------------------------------------------

macro_rules! dgram_kinds {
    ($($(#[$doc:meta])* $kind:ident($ty:ty, $stats:ty, $get:path)),+ $(,)?) => {
        /// The protocol engine behind a datagram QP (one per QP, inside
        /// its lock: the variants' sizes do not matter).
        #[allow(clippy::large_enum_variant)]
        pub(crate) enum AnyQp {
            $($(#[$doc])* $kind($ty)),+
        }

        /// Protocol counters of a datagram QP, by transport (more
        /// transports may come).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[non_exhaustive]
        #[allow(clippy::large_enum_variant)]
        pub enum ProtoStats {
            $($(#[$doc])* $kind($stats)),+
        }

        impl AnyQp {
            fn stats(&self) -> ProtoStats {
                match self {
                    $(AnyQp::$kind(q) => ProtoStats::$kind($get(q))),+
                }
            }
        }

        impl DatagramQp for AnyQp {
            fn qpn(&self) -> u32 {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::qpn(q)),+
                }
            }
            fn post_send(&mut self, wr: SendWr, dest: DgramAddr) -> Result<(), PostError> {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::post_send(q, wr, dest)),+
                }
            }
            fn post_send_and_transmit<M: Memory, S: DatagramSink>(
                &mut self,
                wr: SendWr,
                dest: DgramAddr,
                mem: &M,
                sink: &mut S,
            ) -> Result<io::Result<usize>, PostError> {
                match self {
                    $(AnyQp::$kind(q) => {
                        DatagramQp::post_send_and_transmit(q, wr, dest, mem, sink)
                    }),+
                }
            }
            fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::post_recv(q, wr)),+
                }
            }
            fn handle_datagram_lazy<M: Memory, F: FnMut() -> Instant>(
                &mut self,
                src_ip: IpAddr,
                src_port: u16,
                data: &[u8],
                mem: &mut M,
                now: F,
            ) {
                match self {
                    $(AnyQp::$kind(q) => {
                        DatagramQp::handle_datagram_lazy(q, src_ip, src_port, data, mem, now)
                    }),+
                }
            }
            fn poll_transmit<M: Memory, S: DatagramSink>(
                &mut self,
                mem: &M,
                sink: &mut S,
            ) -> io::Result<usize> {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::poll_transmit(q, mem, sink)),+
                }
            }
            fn wants_transmit(&self) -> bool {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::wants_transmit(q)),+
                }
            }
            fn poll_completion(&mut self) -> Option<(CqKind, WorkCompletion)> {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::poll_completion(q)),+
                }
            }
            fn poll_event(&mut self) -> Option<DgramEvent> {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::poll_event(q)),+
                }
            }
            fn poll_timeout(&self) -> Option<Instant> {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::poll_timeout(q)),+
                }
            }
            fn handle_timeout(&mut self, now: Instant) {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::handle_timeout(q, now)),+
                }
            }
            fn record_tracker(&mut self) -> &mut Tracker {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::record_tracker(q)),+
                }
            }
            fn set_now(&mut self, now: Instant) {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::set_now(q, now)),+
                }
            }
            fn wants_now(&self) -> bool {
                match self {
                    $(AnyQp::$kind(q) => DatagramQp::wants_now(q)),+
                }
            }
        }
    };
}

dgram_kinds! {
    /// Unreliable datagram ([`UdQp`]).
    Ud(UdQp, UdStats, UdQp::stats),
    /// Reliable datagram ([`RdQp`]): its counters and its reliability
    /// layer's.
    Rd(RdQp, RdQpCounters, rd_counters),
}

/// Counters of an RD QP: the QP's ([`RdQpStats`]: messages, drops by
/// cause, Terminates) and its reliability layer's ([`RdStats`]:
/// retransmissions, timeouts, NAKs, sessions, peers failed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdQpCounters {
    /// The RD queue pair's counters.
    pub qp: RdQpStats,
    /// The reliability layer's counters.
    pub rd: RdStats,
}

fn rd_counters(q: &RdQp) -> RdQpCounters {
    RdQpCounters {
        qp: q.stats(),
        rd: *q.rd_stats(),
    }
}

// ----------------------------------------------------------------------
// Public types
// ----------------------------------------------------------------------

/// How a UD QP is created ([`Context::create_ud_qp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdOptions {
    /// Protocol settings. `qpn` is replaced by the number the socket slot
    /// gives, `sq_depth`/`rq_depth` by the [`QpCaps`], and `mtu` by
    /// [`UdOptions::mtu`] or the context's `SOFTRDMA_DGRAM_MTU`.
    pub proto: UdConfig,
    /// The path MTU; `None`: the context's [`crate::config::Config::dgram_mtu`].
    pub mtu: Option<usize>,
    /// Where the QP's socket is bound. Port 0: any socket of this context
    /// bound to the same IP that has a free slot, else a new one on a port
    /// the kernel picks. Bind a concrete address to make
    /// [`DgramQpHandle::local_addr`] something a peer can use.
    pub bind: SocketAddr,
    /// A socket of the QP's own that the progress thread does not read:
    /// the QP's user reads it through inline progress ([`crate::Cq::poll`])
    /// and waits on it ([`DgramQpHandle::socket_fd`]) — see the module
    /// docs, "Self-driven datagram QPs". Default off.
    pub self_driven: bool,
}

impl Default for UdOptions {
    fn default() -> Self {
        UdOptions {
            proto: UdConfig::default(),
            mtu: None,
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            self_driven: false,
        }
    }
}

/// How an RD QP is created ([`Context::create_rd_qp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdOptions {
    /// Protocol settings (queue limits, ORD/IRD, GRH, Write-Record
    /// logging, the reliability layer's timers and windows). `qpn` is
    /// replaced by the number the socket slot gives, `sq_depth`/`rq_depth`
    /// by the [`QpCaps`], `mtu` by [`RdOptions::mtu`] or the context's
    /// `SOFTRDMA_DGRAM_MTU`, and `rd.epoch_seed` by the wall clock in
    /// milliseconds (so a QP re-created on the same port starts sessions
    /// newer than its predecessor's, `docs/datagram.md` §9.4).
    pub proto: RdQpConfig,
    /// The path MTU; `None`: the context's [`crate::config::Config::dgram_mtu`].
    pub mtu: Option<usize>,
    /// Where the QP's socket is bound, as [`UdOptions::bind`]; UD and RD
    /// QPs share sockets (the first octet of a datagram tells the framings
    /// apart).
    pub bind: SocketAddr,
    /// A socket of the QP's own that the progress thread does not read,
    /// as [`UdOptions::self_driven`]. Default off.
    pub self_driven: bool,
}

impl Default for RdOptions {
    fn default() -> Self {
        RdOptions {
            proto: RdQpConfig::default(),
            mtu: None,
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            self_driven: false,
        }
    }
}

/// Why a datagram QP operation failed.
#[derive(Debug)]
pub enum DgramError {
    /// A socket could not be opened or configured.
    Io(io::Error),
    /// The UD protocol engine refused the settings.
    Config(UdConfigError),
    /// The RD protocol engine refused the settings.
    RdConfig(RdQpConfigError),
    /// The requested port's 256 QP slots are taken.
    PortFull,
    /// Not an IPv4 multicast group address.
    NotMulticast,
    /// The QP is not attached to that group.
    NotAttached,
}

impl std::fmt::Display for DgramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DgramError::Io(e) => write!(f, "datagram socket: {e}"),
            DgramError::Config(e) => write!(f, "datagram QP settings: {e}"),
            DgramError::RdConfig(e) => write!(f, "RD QP settings: {e}"),
            DgramError::PortFull => f.write_str("all 256 QP slots of the port are taken"),
            DgramError::NotMulticast => f.write_str("not an IPv4 multicast group address"),
            DgramError::NotAttached => f.write_str("the QP is not attached to the group"),
        }
    }
}

impl std::error::Error for DgramError {}

impl From<io::Error> for DgramError {
    fn from(e: io::Error) -> Self {
        DgramError::Io(e)
    }
}

/// Counters of a datagram QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DgramQpStats {
    /// The protocol engine's counters.
    pub proto: ProtoStats,
    /// Write-Record counters.
    pub record: RecordStats,
    /// Async events not queued because [`crate::cq::MAX_LOSSY_EVENTS`]
    /// were waiting.
    pub events_dropped: u64,
    /// Times the QP's protocol timers (RD retransmission, delayed ACK,
    /// reassembly and Write-Record timeouts) ran from a busy poller's
    /// inline progress ([`crate::Cq::poll`]).
    pub timers_inline: u64,
    /// Times they ran on the progress thread.
    pub timers_thread: u64,
    /// Times the QP armed the progress thread's timer for a protocol
    /// deadline (each may wake the thread). While a busy poller runs the
    /// timers inline, the thread only looks again now and then and the QP
    /// arms nothing.
    pub thread_arms: u64,
    /// Times the progress thread found a busy poller running the timers
    /// and only set itself to look again later.
    pub thread_look_agains: u64,
}

/// Counters of one UDP socket (shared by its QPs), or of the context's
/// multicast socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Datagrams read.
    pub rx_datagrams: u64,
    /// `recvmmsg` calls that returned datagrams.
    pub rx_batches: u64,
    /// Dropped: longer than a receive buffer.
    pub rx_truncated: u64,
    /// Dropped: no destination QPN could be read.
    pub rx_no_dqpn: u64,
    /// Dropped: the destination QPN names no QP of this socket (or no QP
    /// attached to the group).
    pub rx_no_qp: u64,
    /// Multicast socket: dropped because not sent to a multicast group.
    pub rx_not_group: u64,
    /// Receive errors other than "nothing to read".
    pub rx_errors: u64,
    /// Datagrams the socket accepted.
    pub tx_datagrams: u64,
    /// `sendmmsg`/`sendmsg` calls.
    pub tx_calls: u64,
    /// Sends refused with `WouldBlock` (the QP then waits for writability).
    pub tx_would_block: u64,
}

#[derive(Debug, Default)]
struct Counters {
    rx_datagrams: AtomicU64,
    rx_batches: AtomicU64,
    rx_truncated: AtomicU64,
    rx_no_dqpn: AtomicU64,
    rx_no_qp: AtomicU64,
    rx_not_group: AtomicU64,
    rx_errors: AtomicU64,
    tx_datagrams: AtomicU64,
    tx_calls: AtomicU64,
    tx_would_block: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// [`bump`] for a counter only ever written under one lock (the socket's
/// receive lock): a plain load and store instead of a locked
/// read-modify-write, which costs a busy poller some 5 ns per counter on
/// every receive. Readers may see it a moment late, never torn.
fn bump_serial(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// The time, read from the clock the first time it is asked for and the
/// same instant after that: one per received batch at most, none for a
/// batch that starts no timer (a UD message in one datagram).
#[derive(Default)]
struct LazyNow(Option<Instant>);

impl LazyNow {
    fn get(&mut self) -> Instant {
        *self.0.get_or_insert_with(Instant::now)
    }
}

impl Counters {
    fn snapshot(&self) -> SocketStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SocketStats {
            rx_datagrams: g(&self.rx_datagrams),
            rx_batches: g(&self.rx_batches),
            rx_truncated: g(&self.rx_truncated),
            rx_no_dqpn: g(&self.rx_no_dqpn),
            rx_no_qp: g(&self.rx_no_qp),
            rx_not_group: g(&self.rx_not_group),
            rx_errors: g(&self.rx_errors),
            tx_datagrams: g(&self.tx_datagrams),
            tx_calls: g(&self.tx_calls),
            tx_would_block: g(&self.tx_would_block),
        }
    }
}

// ----------------------------------------------------------------------
// The context's datagram service
// ----------------------------------------------------------------------

/// The datagram sockets of one context (a field of [`Shared`]).
#[derive(Debug, Default)]
pub(crate) struct Service {
    sockets: Mutex<Vec<Arc<DgramSocket>>>,
    /// The multicast listener, opened on the first attach.
    mcast: Mutex<Option<Arc<DgramSocket>>>,
}

impl Service {
    /// A socket bound like `bind` with a free slot, reserved.
    /// `own`: a new socket for this QP alone, self-driven (not in the
    /// list: no other QP gets a slot of it).
    fn reserve(
        &self,
        shared: &Arc<Shared>,
        bind: SocketAddr,
        own: bool,
    ) -> Result<(Arc<DgramSocket>, u8), DgramError> {
        if own {
            let s = DgramSocket::open(shared, bind, true)?;
            let slot = s.reserve_slot().ok_or(DgramError::PortFull)?;
            return Ok((s, slot));
        }
        let mut socks = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
        for s in socks.iter() {
            if s.local.ip() != bind.ip() || (bind.port() != 0 && s.local.port() != bind.port()) {
                continue;
            }
            if let Some(slot) = s.reserve_slot() {
                return Ok((s.clone(), slot));
            }
            if bind.port() != 0 {
                return Err(DgramError::PortFull);
            }
        }
        let s = DgramSocket::open(shared, bind, false)?;
        let slot = s.reserve_slot().ok_or(DgramError::PortFull)?;
        socks.push(s.clone());
        Ok((s, slot))
    }

    /// The multicast listener, opened on first use.
    fn mcast_socket(&self, shared: &Arc<Shared>) -> Result<Arc<DgramSocket>, DgramError> {
        let mut m = self.mcast.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = m.as_ref() {
            return Ok(s.clone());
        }
        let s = DgramSocket::open_mcast(shared, shared.config.mcast_port)?;
        *m = Some(s.clone());
        Ok(s)
    }

    fn mcast_if_open(&self) -> Option<Arc<DgramSocket>> {
        self.mcast.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

// ----------------------------------------------------------------------
// Sockets
// ----------------------------------------------------------------------

#[derive(Default)]
enum Slot {
    #[default]
    Free,
    Reserved,
    Bound(Weak<DgramQpShared>),
}

struct Group {
    addr: Ipv4Addr,
    iface: Ipv4Addr,
    qps: Vec<Weak<DgramQpShared>>,
}

enum Role {
    /// A port of QPs, demultiplexed by slot.
    Unicast { slots: Mutex<Vec<Slot>> },
    /// The multicast listener: by group.
    Multicast { groups: Mutex<Vec<Group>> },
}

struct RxState {
    ring: RxRing,
    /// Multicast: the QPs one datagram goes to (kept, not reallocated).
    targets: Vec<Arc<DgramQpShared>>,
}

#[derive(Default)]
struct TxWait {
    qps: Vec<Weak<DgramQpShared>>,
    watching: bool,
}

/// One UDP socket of a context.
pub(crate) struct DgramSocket {
    sock: UdpSocket,
    local: SocketAddr,
    v6: bool,
    /// Send runs of equal-sized datagrams as one UDP GSO message.
    gso: AtomicBool,
    /// `UDP_GRO` is on: buffers may hold several datagrams.
    gro: bool,
    token: u64,
    shared: Weak<Shared>,
    role: Role,
    rx: Mutex<RxState>,
    tx_wait: Mutex<TxWait>,
    /// Epoll interest and busy-poll parking (`progress` module docs).
    park: Parking,
    stats: Counters,
    /// The socket of one self-driven QP: the progress thread never reads
    /// it for arrivals (module docs, "Self-driven datagram QPs").
    self_driven: bool,
    /// Self-driven RD: the thread looks at the socket every
    /// [`SELF_DRIVEN_LOOK`] and reads it if no poller did meanwhile.
    idle_look: AtomicBool,
}

impl std::fmt::Debug for DgramSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DgramSocket")
            .field("local", &self.local)
            .field("multicast", &matches!(self.role, Role::Multicast { .. }))
            .finish()
    }
}

enum RxDrop {
    Truncated,
    NoDqpn,
    NoQp,
}

impl DgramSocket {
    fn new(
        shared: &Arc<Shared>,
        sock: UdpSocket,
        role: Role,
        offload: bool,
        self_driven: bool,
    ) -> io::Result<Arc<DgramSocket>> {
        let local = sock.local_addr()?;
        let gro = offload && udp::enable_gro(sock.as_raw_fd());
        let unicast = matches!(role, Role::Unicast { .. });
        let s = Arc::new(DgramSocket {
            v6: local.is_ipv6(),
            gso: AtomicBool::new(offload),
            gro,
            local,
            token: next_token(),
            shared: Arc::downgrade(shared),
            role,
            rx: Mutex::new(RxState {
                ring: {
                    let mut ring = RxRing::new();
                    if gro && unicast {
                        ring.gro_switchable();
                    }
                    ring
                },
                targets: Vec::with_capacity(8),
            }),
            tx_wait: Mutex::new(TxWait::default()),
            park: Parking::default(),
            stats: Counters::default(),
            self_driven,
            idle_look: AtomicBool::new(false),
            sock,
        });
        if self_driven {
            s.park.register_quiet(
                shared.progress()?,
                s.sock.as_raw_fd(),
                s.token,
                Arc::downgrade(&s),
            );
        } else {
            s.park.register(
                shared.progress()?,
                s.sock.as_raw_fd(),
                s.token,
                Arc::downgrade(&s),
            )?;
        }
        Ok(s)
    }

    /// A QP socket bound to `bind` (`self_driven`: of one self-driven QP).
    fn open(
        shared: &Arc<Shared>,
        bind: SocketAddr,
        self_driven: bool,
    ) -> io::Result<Arc<DgramSocket>> {
        let sock = UdpSocket::bind(bind)?;
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        udp::configure(fd, bind.is_ipv6())?;
        if let IpAddr::V4(a) = bind.ip() {
            if !a.is_unspecified() {
                udp::set_multicast_if(fd, a)?;
            }
        }
        let slots = (0..256).map(|_| Slot::Free).collect();
        DgramSocket::new(
            shared,
            sock,
            Role::Unicast {
                slots: Mutex::new(slots),
            },
            shared.config.dgram_offload,
            self_driven,
        )
    }

    /// The multicast listener on `port`.
    fn open_mcast(shared: &Arc<Shared>, port: u16) -> io::Result<Arc<DgramSocket>> {
        let sock = udp::bind_shared_v4(std::net::SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port))?;
        DgramSocket::new(
            shared,
            sock,
            Role::Multicast {
                groups: Mutex::new(Vec::new()),
            },
            false,
            false,
        )
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        match &self.role {
            Role::Unicast { slots } => slots.lock().unwrap_or_else(|p| p.into_inner()),
            Role::Multicast { .. } => unreachable!("QP slots of the multicast socket"),
        }
    }

    fn qpn_of(&self, slot: u8) -> u32 {
        (u32::from(self.local.port()) << 8) | u32::from(slot)
    }

    fn reserve_slot(&self) -> Option<u8> {
        let mut slots = self.slots();
        let i = (0..256usize).find(|&i| {
            let free = match &slots[i] {
                Slot::Free => true,
                Slot::Reserved => false,
                Slot::Bound(w) => w.strong_count() == 0,
            };
            free && self.qpn_of(i as u8) != MCAST_QPN
        })?;
        slots[i] = Slot::Reserved;
        Some(i as u8)
    }

    fn bind_slot(&self, slot: u8, qp: Weak<DgramQpShared>) {
        self.slots()[usize::from(slot)] = Slot::Bound(qp);
    }

    fn free_slot(&self, slot: u8) {
        self.slots()[usize::from(slot)] = Slot::Free;
    }

    /// `qp` holds `slot` of this socket (what [`DgramSocket::slot_qp`]
    /// would return, without its lock and reference count).
    fn is_bound_here(&self, qp: &DgramQpShared, slot: u8) -> bool {
        qp.slot == slot
            && std::ptr::eq(Arc::as_ptr(&qp.socket), self)
            && qp.bound.load(Ordering::Acquire)
    }

    fn slot_qp(&self, slot: u8) -> Option<Arc<DgramQpShared>> {
        match &self.slots()[usize::from(slot)] {
            Slot::Bound(w) => w.upgrade(),
            _ => None,
        }
    }

    /// The slot a datagram on this (unicast) socket is for.
    fn slot_of(&self, data: &[u8], m: &udp::RxMeta) -> Result<u8, RxDrop> {
        if m.truncated {
            return Err(RxDrop::Truncated);
        }
        let dqpn = dest_qpn(data).ok_or(RxDrop::NoDqpn)?;
        if m.src.is_none() || dqpn >> 8 != u32::from(self.local.port()) {
            return Err(RxDrop::NoQp);
        }
        Ok(dqpn as u8)
    }

    fn count_drop(&self, d: RxDrop) {
        let c = match d {
            RxDrop::Truncated => &self.stats.rx_truncated,
            RxDrop::NoDqpn => &self.stats.rx_no_dqpn,
            RxDrop::NoQp => &self.stats.rx_no_qp,
        };
        bump(c, 1);
    }

    /// Reads and delivers what the socket holds: from the progress thread
    /// (`wait`: take the receive lock) or inline (skip if someone has it).
    /// `poller`: the QP whose inline progress this is (only its receives
    /// may leave their answers to its next poll, see
    /// [`DgramQpShared::receive`]; the socket's other QPs answer at once),
    /// and the output its poll offers ([`Direct`]) to its completions.
    /// Returns how many datagrams it read.
    fn drain(
        &self,
        wait: bool,
        poller: Option<&DgramQpShared>,
        mut direct: Option<&mut Direct<'_>>,
    ) -> usize {
        let mut rx = match self.rx.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) if wait => {
                self.rx.lock().unwrap_or_else(|p| p.into_inner())
            }
            Err(TryLockError::WouldBlock) => return 0,
        };
        let mut read = 0;
        let rounds = if wait {
            RX_ROUNDS_THREAD
        } else {
            RX_ROUNDS_INLINE
        };
        let mcast = matches!(self.role, Role::Multicast { .. });
        let fd = self.sock.as_raw_fd();
        for _ in 0..rounds {
            let n = match udp::recv_batch(fd, &mut rx.ring, mcast || self.gro) {
                Ok(n) => n,
                Err(e) if sys::would_block(&e) => break,
                Err(e) if sys::interrupted(&e) => continue,
                Err(_) => {
                    // A pending ICMP error and the like: reported once.
                    bump(&self.stats.rx_errors, 1);
                    continue;
                }
            };
            let units = rx.ring.len();
            read += units;
            // Both written under the receive lock only.
            bump_serial(&self.stats.rx_batches, 1);
            bump_serial(&self.stats.rx_datagrams, units as u64);
            let mut now = LazyNow::default();
            if mcast {
                self.dispatch_mcast(&mut rx, units, &mut now);
            } else {
                self.dispatch(&rx.ring, units, &mut now, poller, direct.as_deref_mut());
            }
            if !rx.ring.filled(n) {
                break;
            }
        }
        read
    }

    /// Hands datagrams `0..n` to their QPs, runs for the same QP at once.
    /// `poller`: as for [`DgramSocket::drain`].
    fn dispatch(
        &self,
        ring: &RxRing,
        n: usize,
        now: &mut LazyNow,
        poller: Option<&DgramQpShared>,
        mut direct: Option<&mut Direct<'_>>,
    ) {
        let mut i = 0;
        while i < n {
            let (data, m) = ring.get(i);
            let slot = match self.slot_of(data, m) {
                Ok(s) => s,
                Err(d) => {
                    self.count_drop(d);
                    i += 1;
                    continue;
                }
            };
            let mut j = i + 1;
            while j < n && {
                let (d, m) = ring.get(j);
                matches!(self.slot_of(d, m), Ok(s) if s == slot)
            } {
                j += 1;
            }
            // The poller's own QP (the usual case: one QP per socket,
            // busy-polled) is at hand: no slot table lock and no reference
            // count to take for it.
            if let Some(p) = poller.filter(|p| self.is_bound_here(p, slot)) {
                // Deferring is for the QP whose poller comes back to it:
                // another QP of this socket may be polled by no one
                // (inline progress runs once per socket).
                p.receive(ring, i..j, now, true, direct.as_deref_mut());
            } else {
                match self.slot_qp(slot) {
                    Some(qp) => {
                        let inline = poller.is_some_and(|p| std::ptr::eq(p, &*qp));
                        qp.receive(ring, i..j, now, inline, None)
                    }
                    None => bump(&self.stats.rx_no_qp, (j - i) as u64),
                }
            }
            i = j;
        }
    }

    /// The multicast listener: each datagram to every QP attached to the
    /// group it was sent to (and named by its DQPN, or all for
    /// [`MCAST_QPN`]).
    fn dispatch_mcast(&self, rx: &mut RxState, n: usize, now: &mut LazyNow) {
        let Role::Multicast { groups } = &self.role else {
            return;
        };
        let RxState { ring, targets } = rx;
        for i in 0..n {
            let (data, m) = ring.get(i);
            if m.truncated {
                self.count_drop(RxDrop::Truncated);
                continue;
            }
            let (Some(src), Some(IpAddr::V4(group))) = (m.src, m.dst) else {
                bump(&self.stats.rx_not_group, 1);
                continue;
            };
            if !group.is_multicast() {
                bump(&self.stats.rx_not_group, 1);
                continue;
            }
            let Some(dqpn) = dest_qpn(data) else {
                self.count_drop(RxDrop::NoDqpn);
                continue;
            };
            if Framing::of(data[0]) != Ok(Framing::Ud) {
                // RD is point to point: no multicast.
                self.count_drop(RxDrop::NoQp);
                continue;
            }
            {
                let gs = groups.lock().unwrap_or_else(|p| p.into_inner());
                for g in gs.iter().filter(|g| g.addr == group) {
                    for q in g.qps.iter().filter_map(Weak::upgrade) {
                        if (dqpn == MCAST_QPN || dqpn == q.qpn)
                            && !targets.iter().any(|t| Arc::ptr_eq(t, &q))
                        {
                            targets.push(q);
                        }
                    }
                }
            }
            if targets.is_empty() {
                self.count_drop(RxDrop::NoQp);
                continue;
            }
            for q in targets.drain(..) {
                q.receive_one(data, src, now);
            }
        }
    }

    /// `qp` waits for the socket to take datagrams again.
    fn wait_writable(&self, qp: Weak<DgramQpShared>) {
        let mut w = self.tx_wait.lock().unwrap_or_else(|p| p.into_inner());
        w.qps.push(qp);
        if !w.watching {
            w.watching = true;
            if let Some(s) = self.shared.upgrade() {
                if let Ok(p) = s.progress() {
                    let _ = self.park.watch_write(p, true);
                }
            }
        }
    }

    fn on_writable(&self) {
        let waiting = {
            let mut w = self.tx_wait.lock().unwrap_or_else(|p| p.into_inner());
            if w.watching {
                w.watching = false;
                if let Some(s) = self.shared.upgrade() {
                    if let Ok(p) = s.progress() {
                        let _ = self.park.watch_write(p, false);
                    }
                }
            }
            std::mem::take(&mut w.qps)
        };
        for q in waiting.iter().filter_map(Weak::upgrade) {
            q.resume_transmit();
        }
    }
}

impl Source for DgramSocket {
    fn on_ready(&self, readable: bool, writable: bool) {
        self.on_event(readable, writable, false)
    }

    /// Readable while an application busy-polls a CQ of the socket's QPs:
    /// parked, left to that poller (`progress` module docs).
    fn on_event(&self, readable: bool, writable: bool, hangup: bool) {
        if writable {
            self.on_writable();
        }
        if hangup || (readable && !self.park_if_spinning()) {
            self.drain(true, None, None);
        }
    }

    fn on_timer(&self, now: Instant) {
        if let Some(s) = self.shared.upgrade() {
            if let Ok(p) = s.progress() {
                if self.self_driven {
                    self.look_idle(p, now);
                } else {
                    self.park.recheck(p);
                }
            }
        }
    }
}

impl Drop for DgramSocket {
    fn drop(&mut self) {
        // A self-driven socket goes with its QP; the others live as long
        // as the context (and its progress thread).
        if self.self_driven {
            if let Some(s) = self.shared.upgrade() {
                if let Ok(p) = s.progress() {
                    self.park.unregister(p);
                }
            }
        }
    }
}

impl DgramSocket {
    /// Self-driven RD: from the progress thread's timer, every
    /// [`SELF_DRIVEN_LOOK`]. A user that has not polled since the last
    /// look is not in a call: what arrived meanwhile is read here, so the
    /// peers' messages are acknowledged (an RD peer gives up on a QP that
    /// stays silent for its retry span) and reassembly sees every segment.
    fn look_idle(&self, p: &Progress, now: Instant) {
        if !self.idle_look.load(Ordering::Relaxed) {
            return;
        }
        if !self.park.busy.polled_within(SELF_DRIVEN_LOOK) {
            self.drain(true, None, None);
        }
        p.set_timer(self.token, now + SELF_DRIVEN_LOOK);
    }

    /// From the progress thread, woken readable: parks the socket if some
    /// CQ of its QPs is busy-polled.
    fn park_if_spinning(&self) -> bool {
        self.shared
            .upgrade()
            .is_some_and(|s| s.progress().is_ok_and(|p| self.park.park_if_spinning(p)))
    }

    /// A CQ of one of the socket's QPs was armed.
    fn notify_armed(&self) {
        if let Some(s) = self.shared.upgrade() {
            self.park.notify_armed(|| s.progress());
        }
    }
}

/// The socket as the engine's [`DatagramSink`].
struct SockSink<'a> {
    sock: &'a DgramSocket,
    /// A send hit `WouldBlock`.
    blocked: bool,
}

impl SockSink<'_> {
    fn note<T>(&mut self, r: &io::Result<T>, sent: u64) {
        bump(&self.sock.stats.tx_calls, 1);
        bump(&self.sock.stats.tx_datagrams, sent);
        if matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            self.blocked = true;
            bump(&self.sock.stats.tx_would_block, 1);
        }
    }
}

impl DatagramSink for SockSink<'_> {
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let r = udp::send_one(self.sock.sock.as_raw_fd(), self.sock.v6, dest, bufs);
        self.note(&r, u64::from(r.is_ok()));
        r
    }

    fn send_batch(&mut self, batch: &[Datagram<'_>]) -> io::Result<usize> {
        let r = udp::send_batch(
            self.sock.sock.as_raw_fd(),
            self.sock.v6,
            Some(&self.sock.gso),
            batch,
        );
        let sent = *r.as_ref().unwrap_or(&0) as u64;
        self.note(&r, sent);
        r
    }
}

// ----------------------------------------------------------------------
// QPs
// ----------------------------------------------------------------------

struct Core {
    qp: AnyQp,
    /// Completions gathered under the QP lock, handed to the CQs before
    /// it is released.
    out_send: Vec<Completion>,
    out_recv: Vec<Completion>,
    /// The deadline armed with the progress thread.
    timer: Option<Instant>,
    /// Waiting for the socket to become writable.
    tx_waiting: bool,
    /// Multicast groups attached.
    groups: Vec<Ipv4Addr>,
}

/// The shared part of a datagram QP (CQs, socket and progress thread
/// hold it weakly).
pub(crate) struct DgramQpShared {
    shared: Arc<Shared>,
    socket: Arc<DgramSocket>,
    this: Weak<DgramQpShared>,
    qpn: u32,
    pd: u32,
    slot: u8,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    /// Progress-thread token of the QP's timer.
    token: u64,
    /// Attached to a multicast group (inline progress drains that socket
    /// too).
    in_groups: AtomicBool,
    /// Async events dropped (the event queue was full).
    events_dropped: AtomicU64,
    /// The deadline armed with the progress thread ([`deadline_ns`]
    /// stamp, 0: none), readable without the QP lock so that inline
    /// progress can run due timers itself.
    due_ns: AtomicU64,
    /// Timer runs from inline progress and from the progress thread.
    timers_inline: AtomicU64,
    timers_thread: AtomicU64,
    /// [`DgramQpStats::thread_arms`], [`DgramQpStats::thread_look_agains`].
    thread_arms: AtomicU64,
    thread_look_agains: AtomicU64,
    /// The progress thread holds a look-again deadline for this QP
    /// because a busy poller runs its timers inline: new deadlines are
    /// left to the poller (and to that look-again), not armed with the
    /// thread, whose every extra wake-up takes a core from a poller.
    /// Cleared when the thread takes the timers back (the poller went
    /// quiet) or a CQ is armed ([`InlineProgress::notify_armed`]).
    watched: AtomicBool,
    /// The look-again period while [`DgramQpShared::watched`]: doubles
    /// from [`PARK_RECHECK`] at every look that finds the poller still
    /// there, up to [`PARK_RECHECK_MAX`] (nanoseconds).
    watch_every_ns: AtomicU64,
    /// When inline progress last looked at this QP's timers (a
    /// [`deadline_ns`] stamp, 0: never).
    inline_ns: AtomicU64,
    /// Inline polls since the last that read the clock for the timers
    /// ([`INLINE_CLOCK_EVERY`]); written by pollers without a
    /// read-modify-write (a lost count only moves the next reading).
    inline_polls: AtomicU32,
    /// The inline polls are sparse: each reads the clock
    /// ([`INLINE_CLOCK_GAP_NS`]).
    inline_sparse: AtomicBool,
    /// What a receive by inline progress made the engine owe (an RD ACK,
    /// a response) waits for the next inline poll or `post_send` (see
    /// [`DgramQpShared::receive`]).
    tx_deferred: AtomicBool,
    /// The socket's slot is bound to this QP (set once bound, cleared
    /// before the handle frees it): lets the receive path hand the
    /// poller's own datagrams to it without the slot table.
    bound: AtomicBool,
    core: Mutex<Core>,
}

impl DgramQpShared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands datagrams `range` of `ring`, all for this QP, to the engine.
    ///
    /// `inline` (this QP's own busy poller is receiving,
    /// [`crate::Cq::poll`] through its `progress_inline`; not another QP
    /// of the socket, whose receives answer at once): what
    /// the engine wants to send in answer (an RD ACK a P flag asked for, a
    /// Read or Atomic Response, a Terminate) is not sent now but on the
    /// poller's next inline poll, or by the next `post_send`. A ping-pong
    /// application answers in between, and its answer carries the ACK:
    /// one datagram per message instead of a data datagram and an ACK
    /// datagram (RD 64 B `send_lat`: two `sendmsg` per message before).
    /// Arming a CQ of the QP (`req_notify`: the poller may block next)
    /// sends it at once; if nobody polls, posts or arms, the timer armed
    /// here does.
    /// `direct`: the poller's output ([`Direct`]), for the completions.
    fn receive(
        &self,
        ring: &RxRing,
        range: Range<usize>,
        now: &mut LazyNow,
        inline: bool,
        direct: Option<&mut Direct<'_>>,
    ) {
        let mut c = self.lock();
        let qp = &mut c.qp;
        self.shared.registry.with_view(self.pd, |v| {
            for i in range {
                let (data, m) = ring.get(i);
                if let Some(src) = m.src {
                    qp.handle_datagram_lazy(src.ip(), src.port(), data, v, || now.get());
                }
            }
        });
        if inline && !c.tx_waiting && c.qp.wants_transmit() {
            self.tx_deferred.store(true, Ordering::Relaxed);
            self.arm_at(&mut c, now.get() + DEFERRED_TX_FALLBACK);
            self.arm(&mut c);
            self.flush_to(c, direct);
            return;
        }
        self.settle_to(c, direct);
    }

    fn receive_one(&self, data: &[u8], src: SocketAddr, now: &mut LazyNow) {
        let mut c = self.lock();
        let qp = &mut c.qp;
        self.shared.registry.with_view(self.pd, |v| {
            qp.handle_datagram_lazy(src.ip(), src.port(), data, v, || now.get())
        });
        self.settle(c);
    }

    /// Hands the engine's datagrams to the socket until it is done or the
    /// socket pushes back (then waits for writability).
    fn transmit(&self, c: &mut Core) {
        // Whatever a receive deferred goes now (under the QP lock, so a
        // poller seeing the flag clear finds nothing owed).
        self.tx_deferred.store(false, Ordering::Relaxed);
        if c.tx_waiting {
            return;
        }
        if c.qp.wants_now() {
            c.qp.set_now(Instant::now());
        }
        let mut sink = SockSink {
            sock: &self.socket,
            blocked: false,
        };
        // Each round sends, or fails (and completes) one request, or
        // stops; the bound only guards against an engine breaking that.
        for _ in 0..1 << 16 {
            let qp = &mut c.qp;
            let r = self
                .shared
                .registry
                .with_view(self.pd, |v| qp.poll_transmit(v, &mut sink));
            match r {
                Ok(0) => break,
                Ok(_) if sink.blocked || !c.qp.wants_transmit() => break,
                Ok(_) => {}
                // The head request failed (completed in error); go on.
                Err(_) if sink.blocked => break,
                Err(_) => {}
            }
        }
        if sink.blocked {
            self.wait_for_room(c);
        }
    }

    /// The socket pushed back: transmit nothing more until it is writable
    /// again (the progress thread then resumes transmitting).
    fn wait_for_room(&self, c: &mut Core) {
        c.tx_waiting = true;
        self.socket.wait_writable(self.this.clone());
    }

    /// Arms the progress thread's timer if the engine needs one earlier
    /// than the one armed.
    fn arm(&self, c: &mut Core) {
        let Some(next) = c.qp.poll_timeout() else {
            return;
        };
        self.arm_at(c, next);
    }

    fn arm_at(&self, c: &mut Core, next: Instant) {
        if c.timer.is_none_or(|armed| next < armed) {
            c.timer = Some(next);
            self.due_ns.store(deadline_ns(next), Ordering::Relaxed);
            if self.watched.load(Ordering::Relaxed) {
                // A busy poller runs the timers (it reads `due_ns`), and
                // the thread's look-again takes them back if it stops.
                return;
            }
            let Ok(p) = self.shared.progress() else {
                return;
            };
            if self.socket.park.busy.spinning() {
                // A poller spins on the socket: it will run this deadline
                // (and the ones after it); the thread only looks again.
                // Without this, every message of a ping-pong's first
                // milliseconds (until the poller first ran a timer) armed
                // and woke the thread.
                self.start_watch(p, Instant::now());
                return;
            }
            bump(&self.thread_arms, 1);
            p.set_timer(self.token, next);
        }
    }

    /// Makes the QP watched (the caller holds the QP lock): the thread
    /// gets only a look-again, [`WATCH_FIRST`] away.
    fn start_watch(&self, p: &Progress, now: Instant) {
        self.watched.store(true, Ordering::Relaxed);
        self.watch_every_ns
            .store(WATCH_FIRST.as_nanos() as u64, Ordering::Relaxed);
        p.set_timer(self.token, now + WATCH_FIRST);
    }

    /// After any engine call: transmit what it produced, arm its timer,
    /// flush its completions and events.
    fn settle(&self, c: MutexGuard<'_, Core>) {
        self.settle_to(c, None)
    }

    /// [`DgramQpShared::settle`], offering the completions to a poller's
    /// `direct` output first (inline progress).
    fn settle_to(&self, mut c: MutexGuard<'_, Core>, direct: Option<&mut Direct<'_>>) {
        if c.qp.wants_transmit() {
            self.transmit(&mut c);
        }
        self.arm(&mut c);
        self.flush_to(c, direct);
    }

    /// Moves completions into the CQs (under the QP lock, in order), then,
    /// after the lock is released, events into the async event queue.
    fn flush(&self, c: MutexGuard<'_, Core>) {
        self.flush_to(c, None)
    }

    /// [`DgramQpShared::flush`], offering the completions to a poller's
    /// `direct` output first (inline progress).
    fn flush_to(&self, mut c: MutexGuard<'_, Core>, mut direct: Option<&mut Direct<'_>>) {
        // Events are rare (errors): no storage is set up until one comes.
        let mut events: Vec<AsyncEvent> = Vec::new();
        {
            let Core {
                qp,
                out_send,
                out_recv,
                ..
            } = &mut *c;
            while let Some((kind, wc)) = qp.poll_completion() {
                let comp = Completion {
                    wc,
                    qp_num: self.qpn,
                };
                let (staged, cq) = match kind {
                    CqKind::Send => (&mut *out_send, &self.send_cq),
                    CqKind::Recv => (&mut *out_recv, &self.recv_cq),
                };
                Direct::hand_or_stage(direct.as_deref_mut(), cq, staged, comp);
            }
            while let Some(ev) = qp.poll_event() {
                events.push(self.async_event(ev));
            }
        }
        if !c.out_send.is_empty() {
            self.send_cq.push(&c.out_send);
            c.out_send.clear();
        }
        if !c.out_recv.is_empty() {
            self.recv_cq.push(&c.out_recv);
            c.out_recv.clear();
        }
        drop(c);
        for e in events {
            self.raise(e);
        }
    }

    fn raise(&self, e: AsyncEvent) {
        if !self.shared.events.raise_lossy(e) {
            bump(&self.events_dropped, 1);
        }
    }

    fn async_event(&self, ev: DgramEvent) -> AsyncEvent {
        match ev {
            DgramEvent::RemoteAccess {
                src,
                opcode,
                msn,
                stag,
                to,
                len,
                error,
            } => AsyncEvent::DgramRemoteAccessError {
                qpn: self.qpn,
                src,
                opcode,
                msn,
                stag,
                to,
                len,
                error,
            },
            DgramEvent::PeerFailed { peer } => AsyncEvent::DgramPeerFailed {
                qpn: self.qpn,
                peer,
            },
        }
    }

    /// The socket became writable.
    fn resume_transmit(&self) {
        let mut c = self.lock();
        c.tx_waiting = false;
        self.transmit(&mut c);
        self.arm(&mut c);
        self.flush(c);
    }
}

impl Source for DgramQpShared {
    fn on_ready(&self, _readable: bool, _writable: bool) {}

    fn on_timer(&self, now: Instant) {
        let polled = self.inline_ns.load(Ordering::SeqCst);
        if polled != 0 && deadline_ns(now).saturating_sub(polled) < PARK_RECHECK.as_nanos() as u64 {
            // A busy poller runs this QP's due timers inline
            // (`progress_inline`, which stamped `inline_ns` just now):
            // taking the QP lock here would only contend with it (and, on
            // a loaded machine, stall it behind this thread being
            // preempted with the lock held). Look again when it may have
            // stopped, later each time it is still there; meanwhile the
            // QP's new deadlines are the poller's alone (`arm_at`), so
            // the thread is not woken for each of them. Only the poller
            // (under the QP lock) makes the QP watched; this only keeps it.
            let every = if self.watched.load(Ordering::Relaxed) {
                let every = self.watch_every_ns.load(Ordering::Relaxed) * 2;
                every.min(PARK_RECHECK_MAX.as_nanos() as u64)
            } else {
                PARK_RECHECK.as_nanos() as u64
            };
            self.watch_every_ns.store(every, Ordering::Relaxed);
            bump(&self.thread_look_agains, 1);
            if let Ok(p) = self.shared.progress() {
                p.set_timer(self.token, now + Duration::from_nanos(every));
            }
            // A CQ armed meanwhile (`notify_armed` zeroes the stamp, then
            // hands the QP's own deadline to this thread) may just have had
            // that deadline replaced by the look-again: take over now.
            if self.inline_ns.load(Ordering::SeqCst) != 0 {
                return;
            }
        }
        // The poller has gone quiet (or never ran): the thread owns the
        // timers again, and every deadline is armed with it.
        self.watched.store(false, Ordering::Relaxed);
        // What has arrived is taken in before any deadline is judged: a
        // poller that stopped polling (descheduled, or gone to sleep) may
        // have left the rest of a message in the socket, and a timer that
        // ran first would retire that message as idle (a Write-Record
        // reported partial, its remaining segments then stale: placed but
        // neither recorded nor valid; a reassembly dropped).
        self.socket.drain(true, None, None);
        let c = self.lock();
        self.run_timers(c, Instant::now().max(now));
        bump(&self.timers_thread, 1);
    }
}

impl DgramQpShared {
    /// Runs the engine's timers due at `now` and settles what they
    /// produced; re-arms the progress thread for the next deadline.
    fn run_timers(&self, mut c: MutexGuard<'_, Core>, now: Instant) {
        c.timer = None;
        self.due_ns.store(0, Ordering::Relaxed);
        c.qp.handle_timeout(now);
        // A deadline the engine still reports as due right after it ran
        // its timers is retried a millisecond later, not in a busy loop.
        if let Some(next) = c.qp.poll_timeout() {
            self.arm_at(&mut c, next.max(now + Duration::from_millis(1)));
        }
        self.settle(c);
    }
}

impl DgramQpShared {
    /// Sends what a receive by this QP's poller deferred, if anything.
    fn send_deferred(&self, direct: Option<&mut Direct<'_>>) {
        if self.tx_deferred.load(Ordering::Relaxed) {
            let mut c = self.lock();
            if c.qp.wants_transmit() {
                self.transmit(&mut c);
            } else {
                self.tx_deferred.store(false, Ordering::Relaxed);
            }
            self.arm(&mut c);
            self.flush_to(c, direct);
        }
    }
}

impl InlineProgress for DgramQpShared {
    fn progress_inline(&self, direct: &mut Direct<'_>) {
        self.progress_inline_ready(direct, true)
    }

    fn progress_fd(&self) -> Option<RawFd> {
        self.socket.park.fd()
    }

    fn progress_inline_ready(&self, direct: &mut Direct<'_>, readable: bool) {
        self.socket.park.busy.polled();
        // What the previous inline receive left to send (see
        // `DgramQpShared::receive`), before reading more.
        self.send_deferred(Some(&mut *direct));
        let read = if readable {
            self.socket.drain(false, Some(self), Some(direct))
        } else {
            0
        };
        if self.in_groups.load(Ordering::Relaxed) {
            if let Some(m) = self.shared.dgram.mcast_if_open() {
                m.park.busy.polled();
                m.drain(false, None, None);
            }
        }
        // Due timers (an RD retransmission, delayed ACK, probe) run here
        // too, at once instead of at the progress thread's millisecond
        // resolution, and without it taking the QP lock from the poller.
        let due = self.due_ns.load(Ordering::Relaxed);
        if due == 0 {
            return;
        }
        // The clock on every poll that read a batch (such a poll is long,
        // and a stream's receiver owes delayed ACKs) and on every poll of
        // a poller that polls sparsely, else on every 16th: an RD QP with
        // a message in flight always has a timer armed, and reading the
        // time on every spin of a ping-pong cost it some 6 % of all
        // samples; its deadlines are hundreds of microseconds away, and a
        // busy poller's 16 polls take a few.
        let polls = self.inline_polls.load(Ordering::Relaxed).wrapping_add(1);
        self.inline_polls.store(polls, Ordering::Relaxed);
        let sparse = self.inline_sparse.load(Ordering::Relaxed);
        if read < 2 && !sparse && !polls.is_multiple_of(INLINE_CLOCK_EVERY) {
            return;
        }
        let prev = self.inline_ns.load(Ordering::Relaxed);
        let now_ns = deadline_ns(Instant::now());
        self.inline_ns.store(now_ns, Ordering::Relaxed);
        let span = if sparse {
            INLINE_CLOCK_GAP_NS / u64::from(INLINE_CLOCK_EVERY)
        } else {
            INLINE_CLOCK_GAP_NS
        };
        let now_sparse = prev == 0 || now_ns.saturating_sub(prev) > span;
        if now_sparse != sparse {
            self.inline_sparse.store(now_sparse, Ordering::Relaxed);
        }
        if now_ns >= due {
            let c = match self.core.try_lock() {
                Ok(c) => c,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            let now = Instant::now();
            if c.timer.is_some_and(|t| t <= now) {
                // From now on the thread only looks again now and then
                // (see `watched`): the deadlines these timers re-arm are
                // this poller's, and arming each with the thread would
                // wake it (an eventfd write, then a core taken from a
                // poller) for nothing. Not for a poll right after the CQ
                // was armed (the last look before blocking): only a poller
                // that is spinning keeps the timers.
                if !self.watched.load(Ordering::Relaxed) && self.socket.park.busy.spinning() {
                    if let Ok(p) = self.shared.progress() {
                        self.start_watch(p, now);
                    }
                }
                self.run_timers(c, now);
                bump(&self.timers_inline, 1);
            }
        }
    }

    fn notify_armed(&self) {
        // Whoever polls may block now: what its last inline receive left
        // to send goes now, not when the fallback timer fires; the
        // progress thread runs the timers again from its next tick on.
        self.send_deferred(None);
        self.inline_ns.store(0, Ordering::SeqCst);
        if self.watched.load(Ordering::Relaxed) {
            // The thread held only a look-again, possibly milliseconds
            // away: hand it the QP's own next deadline now (under the QP
            // lock, against a poller on another thread making the QP
            // watched again in between).
            let c = self.lock();
            if self.watched.swap(false, Ordering::Relaxed) {
                if let (Some(at), Ok(p)) = (c.timer, self.shared.progress()) {
                    bump(&self.thread_arms, 1);
                    p.set_timer(self.token, at);
                }
            }
        }
        self.socket.notify_armed();
        if self.in_groups.load(Ordering::Relaxed) {
            if let Some(m) = self.shared.dgram.mcast_if_open() {
                m.notify_armed();
            }
        }
    }

    fn progress_key(&self) -> usize {
        Arc::as_ptr(&self.socket) as usize
    }
}

/// A datagram queue pair (UD or RD). Dropping it destroys the QP: its slot is
/// freed, its multicast groups left, its queued work discarded without
/// completions (as `ibv_destroy_qp`).
pub struct DgramQpHandle {
    inner: Arc<DgramQpShared>,
}

impl std::fmt::Debug for DgramQpHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DgramQpHandle")
            .field("qpn", &self.inner.qpn)
            .field("local", &self.inner.socket.local)
            .finish()
    }
}

impl DgramQpHandle {
    /// The QP number: `(port << 8) | slot`.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }

    /// The protection domain.
    pub fn pd(&self) -> u32 {
        self.inner.pd
    }

    /// The descriptor of the QP's UDP socket. For a self-driven QP
    /// ([`UdOptions::self_driven`]) it is the QP's alone: wait for it to
    /// become readable, then poll a CQ of the QP (inline progress reads
    /// it). Other QPs share theirs, which the progress thread reads.
    pub fn socket_fd(&self) -> RawFd {
        self.inner.socket.sock.as_raw_fd()
    }

    /// Created self-driven ([`UdOptions::self_driven`]).
    pub fn is_self_driven(&self) -> bool {
        self.inner.socket.self_driven
    }

    /// Where peers send to reach this QP (the socket's bound address).
    pub fn local_addr(&self) -> DgramAddr {
        DgramAddr {
            ip: self.inner.socket.local.ip(),
            port: self.inner.socket.local.port(),
            qpn: self.inner.qpn,
        }
    }

    /// Posts a send work request to `dest` and transmits what the socket
    /// takes. UD: Send (± immediate, solicited), RDMA Write and
    /// Write-Record; RD: those and RDMA Read and atomics. The engine
    /// refuses the rest ([`QpError::Unsupported`]).
    ///
    /// While the socket is not pushing back, post and send are one
    /// protocol call (`post_send_and_transmit`), whose UD shortcut sends a
    /// lone small message with one system call and never queues it.
    pub fn post_send(&self, wr: SendWr, dest: DgramAddr) -> Result<(), QpError> {
        let mut c = self.inner.lock();
        if c.qp.wants_now() {
            c.qp.set_now(Instant::now());
        }
        if c.tx_waiting {
            c.qp.post_send(wr, dest)?;
        } else {
            let qp = &mut c.qp;
            let mut sink = SockSink {
                sock: &self.inner.socket,
                blocked: false,
            };
            // A socket error other than `WouldBlock` has failed the request
            // (its completion is queued), as in `transmit`.
            let _ = self.inner.shared.registry.with_view(self.inner.pd, |v| {
                qp.post_send_and_transmit(wr, dest, v, &mut sink)
            })?;
            if sink.blocked {
                self.inner.wait_for_room(&mut c);
            }
        }
        // What the socket did not take (or what a receive deferred) goes
        // the usual way: `transmit` sends it or waits for writability.
        if c.qp.wants_transmit() || self.inner.tx_deferred.load(Ordering::Relaxed) {
            self.inner.transmit(&mut c);
        }
        self.inner.arm(&mut c);
        self.inner.flush(c);
        Ok(())
    }

    /// Posts a receive.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), QpError> {
        // Posting a receive completes nothing and raises no event (UD and
        // RD only queue it), and every other call flushes what it
        // produced: nothing to flush here.
        self.inner.lock().qp.post_recv(wr)?;
        Ok(())
    }

    /// Write-Record validity map: the valid ranges (absolute TOs,
    /// `[start, end)`) of `stag` within `[to, to + len)`, written to `out`;
    /// returns how many, and whether more did not fit.
    pub fn valid_ranges(
        &self,
        stag: u32,
        to: u64,
        len: u64,
        out: &mut [(u64, u64)],
    ) -> (usize, bool) {
        self.inner
            .lock()
            .qp
            .record_tracker()
            .valid_ranges(stag, to, len, out)
    }

    /// Whether every octet of `[to, to + len)` of `stag` is valid.
    pub fn is_valid(&self, stag: u32, to: u64, len: u64) -> bool {
        self.inner
            .lock()
            .qp
            .record_tracker()
            .is_valid(stag, to, len)
    }

    /// Clears validity of `[to, to + len)` of `stag` (the data was used).
    pub fn clear(&self, stag: u32, to: u64, len: u64) {
        self.inner.lock().qp.record_tracker().clear(stag, to, len)
    }

    /// Forgets every Write-Record state of `stag` (call when its region is
    /// deregistered).
    pub fn forget_stag(&self, stag: u32) {
        self.inner.lock().qp.record_tracker().forget_stag(stag)
    }

    /// How long a Write-Record message may place nothing new before it is
    /// retired as partial.
    pub fn set_record_partial_timeout(&self, timeout: Duration) {
        let mut c = self.inner.lock();
        c.qp.record_tracker().set_partial_timeout(timeout);
        self.inner.arm(&mut c);
        self.inner.flush(c);
    }

    /// What a partial Write-Record message gives (a `RecordPartial`
    /// completion, or nothing).
    pub fn set_record_partial_action(&self, action: PartialAction) {
        self.inner
            .lock()
            .qp
            .record_tracker()
            .set_partial_action(action)
    }

    /// The QP's counters.
    pub fn stats(&self) -> DgramQpStats {
        let mut c = self.inner.lock();
        DgramQpStats {
            proto: c.qp.stats(),
            record: c.qp.record_tracker().stats(),
            events_dropped: self.inner.events_dropped.load(Ordering::Relaxed),
            timers_inline: self.inner.timers_inline.load(Ordering::Relaxed),
            timers_thread: self.inner.timers_thread.load(Ordering::Relaxed),
            thread_arms: self.inner.thread_arms.load(Ordering::Relaxed),
            thread_look_agains: self.inner.thread_look_agains.load(Ordering::Relaxed),
        }
    }

    /// The counters of the socket this QP shares.
    pub fn socket_stats(&self) -> SocketStats {
        self.inner.socket.stats.snapshot()
    }

    /// The counters of the context's multicast socket (zero before the
    /// first attach).
    pub fn mcast_socket_stats(&self) -> SocketStats {
        self.inner
            .shared
            .dgram
            .mcast_if_open()
            .map(|s| s.stats.snapshot())
            .unwrap_or_default()
    }

    /// Attaches the QP to the IPv4 multicast `group`
    /// (`ibv_attach_mcast`): datagrams sent to
    /// [`Context::mcast_dest`]`(group)` reach it. Attaching twice is a
    /// no-op.
    pub fn attach_mcast(&self, group: IpAddr) -> Result<(), DgramError> {
        let IpAddr::V4(g) = group.to_canonical() else {
            return Err(DgramError::NotMulticast);
        };
        if !g.is_multicast() {
            return Err(DgramError::NotMulticast);
        }
        let q = &self.inner;
        let iface = match q.socket.local.ip() {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
        };
        let m = q.shared.dgram.mcast_socket(&q.shared)?;
        let Role::Multicast { groups } = &m.role else {
            unreachable!("the multicast socket has the multicast role");
        };
        {
            let mut gs = groups.lock().unwrap_or_else(|p| p.into_inner());
            let i = match gs.iter().position(|x| x.addr == g && x.iface == iface) {
                Some(i) => i,
                None => {
                    udp::join_v4(m.sock.as_raw_fd(), g, iface)?;
                    gs.push(Group {
                        addr: g,
                        iface,
                        qps: Vec::new(),
                    });
                    gs.len() - 1
                }
            };
            let entry = &mut gs[i];
            entry.qps.retain(|w| w.strong_count() > 0);
            if entry.qps.iter().any(|w| w.ptr_eq(&q.this)) {
                return Ok(());
            }
            entry.qps.push(q.this.clone());
        }
        q.lock().groups.push(g);
        q.in_groups.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Detaches the QP from `group` (`ibv_detach_mcast`); the context
    /// leaves the group when no QP of it is attached any more.
    pub fn detach_mcast(&self, group: IpAddr) -> Result<(), DgramError> {
        let IpAddr::V4(g) = group.to_canonical() else {
            return Err(DgramError::NotMulticast);
        };
        let q = &self.inner;
        {
            let mut c = q.lock();
            let Some(i) = c.groups.iter().position(|x| *x == g) else {
                return Err(DgramError::NotAttached);
            };
            c.groups.swap_remove(i);
            q.in_groups.store(!c.groups.is_empty(), Ordering::Relaxed);
        }
        q.leave(g);
        Ok(())
    }
}

impl DgramQpShared {
    /// Removes this QP from `group`'s list (leaving it when empty).
    fn leave(&self, g: Ipv4Addr) {
        let Some(m) = self.shared.dgram.mcast_if_open() else {
            return;
        };
        let Role::Multicast { groups } = &m.role else {
            return;
        };
        let mut gs = groups.lock().unwrap_or_else(|p| p.into_inner());
        for entry in gs.iter_mut().filter(|x| x.addr == g) {
            entry
                .qps
                .retain(|w| w.strong_count() > 0 && !w.ptr_eq(&self.this));
        }
        gs.retain(|entry| {
            let keep = !entry.qps.is_empty();
            if !keep {
                let _ = udp::leave_v4(m.sock.as_raw_fd(), entry.addr, entry.iface);
            }
            keep
        });
    }
}

impl Drop for DgramQpHandle {
    fn drop(&mut self) {
        let q = &self.inner;
        q.bound.store(false, Ordering::Release);
        q.socket.free_slot(q.slot);
        let groups = std::mem::take(&mut q.lock().groups);
        q.in_groups.store(false, Ordering::Relaxed);
        for g in groups {
            q.leave(g);
        }
        if let Ok(p) = q.shared.progress() {
            p.remove_source(q.token);
        }
    }
}

impl Context {
    /// A UD queue pair in protection domain `pd` whose number is
    /// `(port << 8) | slot` of a UDP socket of this context
    /// ([`UdOptions::bind`]); `opts.proto.qpn` is overridden.
    pub fn create_ud_qp(
        &self,
        pd: u32,
        caps: QpCaps,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        opts: UdOptions,
    ) -> Result<DgramQpHandle, DgramError> {
        let mtu = opts.mtu.unwrap_or(self.shared.config.dgram_mtu);
        self.create_dgram_qp(pd, send_cq, recv_cq, opts.bind, opts.self_driven, |qpn| {
            let cfg = UdConfig {
                qpn,
                mtu,
                sq_depth: caps.max_send_wr,
                rq_depth: caps.max_recv_wr,
                ..opts.proto
            };
            UdQp::new(cfg).map(AnyQp::Ud).map_err(DgramError::Config)
        })
    }

    /// An RD (reliable datagram) queue pair in protection domain `pd`,
    /// numbered like a UD QP (`(port << 8) | slot` of a UDP socket of this
    /// context, [`RdOptions::bind`], shared with UD QPs); `opts.proto.qpn`
    /// is overridden. Reliable, in-order, exactly-once delivery per peer
    /// QP with retransmission and ACK timers run by the progress thread;
    /// Send (± immediate), RDMA Write, Write-Record, RDMA Read and atomics
    /// (`docs/datagram.md` §11). A peer that stops answering fails only
    /// its own work requests (`RetryExcErr`) and raises
    /// [`AsyncEvent::DgramPeerFailed`].
    pub fn create_rd_qp(
        &self,
        pd: u32,
        caps: QpCaps,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        opts: RdOptions,
    ) -> Result<DgramQpHandle, DgramError> {
        let mtu = opts.mtu.unwrap_or(self.shared.config.dgram_mtu);
        let epoch_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u32);
        self.create_dgram_qp(pd, send_cq, recv_cq, opts.bind, opts.self_driven, |qpn| {
            let cfg = RdQpConfig {
                qpn,
                mtu,
                sq_depth: caps.max_send_wr,
                rq_depth: caps.max_recv_wr,
                rd: softrdma_proto::rd::RdConfig {
                    epoch_seed,
                    ..opts.proto.rd
                },
                ..opts.proto
            };
            RdQp::new(cfg, Instant::now())
                .map(AnyQp::Rd)
                .map_err(DgramError::RdConfig)
        })
    }

    /// Where to send to reach every QP attached to `group` (in any
    /// context using the same `SOFTRDMA_MCAST_PORT`).
    pub fn mcast_dest(&self, group: IpAddr) -> DgramAddr {
        DgramAddr {
            ip: group,
            port: self.shared.config.mcast_port,
            qpn: MCAST_QPN,
        }
    }

    /// The transport-independent part of creating a datagram QP: a socket
    /// slot, the engine `make` builds for its QPN, the CQ and progress
    /// hooks.
    fn create_dgram_qp(
        &self,
        pd: u32,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        bind: SocketAddr,
        self_driven: bool,
        make: impl FnOnce(u32) -> Result<AnyQp, DgramError>,
    ) -> Result<DgramQpHandle, DgramError> {
        let shared = &self.shared;
        let (socket, slot) = shared.dgram.reserve(shared, bind, self_driven)?;
        let qpn = socket.qpn_of(slot);
        let qp = match make(qpn) {
            Ok(q) => q,
            Err(e) => {
                socket.free_slot(slot);
                return Err(e);
            }
        };
        let inner = Arc::new_cyclic(|this| DgramQpShared {
            shared: shared.clone(),
            socket: socket.clone(),
            this: this.clone(),
            qpn,
            pd,
            slot,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            token: next_token(),
            in_groups: AtomicBool::new(false),
            events_dropped: AtomicU64::new(0),
            due_ns: AtomicU64::new(0),
            tx_deferred: AtomicBool::new(false),
            bound: AtomicBool::new(false),
            timers_inline: AtomicU64::new(0),
            timers_thread: AtomicU64::new(0),
            thread_arms: AtomicU64::new(0),
            thread_look_agains: AtomicU64::new(0),
            watched: AtomicBool::new(false),
            watch_every_ns: AtomicU64::new(WATCH_FIRST.as_nanos() as u64),
            inline_ns: AtomicU64::new(0),
            inline_polls: AtomicU32::new(0),
            inline_sparse: AtomicBool::new(true),
            core: Mutex::new(Core {
                qp,
                out_send: Vec::with_capacity(64),
                out_recv: Vec::with_capacity(64),
                timer: None,
                tx_waiting: false,
                groups: Vec::new(),
            }),
        });
        socket.bind_slot(slot, Arc::downgrade(&inner));
        inner.bound.store(true, Ordering::Release);
        let p = shared.progress()?;
        p.add_source(inner.token, Arc::downgrade(&inner));
        if self_driven && matches!(inner.lock().qp, AnyQp::Rd(_)) {
            socket.idle_look.store(true, Ordering::Relaxed);
            p.set_timer(socket.token, Instant::now() + SELF_DRIVEN_LOOK);
        }
        send_cq.attach(Arc::downgrade(&inner));
        if !Arc::ptr_eq(&send_cq, &recv_cq) {
            recv_cq.attach(Arc::downgrade(&inner));
        }
        Ok(DgramQpHandle { inner })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use softrdma_wire::datagram as wdgram;
    use softrdma_wire::rdmap::{Opcode, RdmapBody, SegmentRepr};

    fn ud_datagram(dqpn: u32) -> Vec<u8> {
        let mut repr = SegmentRepr::untagged(Opcode::Send, 0x02_0304, 7, 0, true, RdmapBody::None);
        repr.dqpn = Some((0xAB << 24) | dqpn);
        let mut out = vec![0u8; wdgram::buffer_len(&repr, 5)];
        let n = wdgram::emit_into(&repr, b"hello", &mut out);
        out.truncate(n);
        out
    }

    #[test]
    fn dest_qpn_both_framings() {
        assert_eq!(dest_qpn(&ud_datagram(0x12_3456)), Some(0x12_3456));
        assert_eq!(dest_qpn(&[]), None);
        assert_eq!(dest_qpn(&[0x00; 40]), None);
        let mut rd = vec![0u8; softrdma_wire::rd::MIN_DATAGRAM_LEN];
        rd[0] = softrdma_wire::rd::MAGIC;
        rd[1..4].copy_from_slice(&[0x65, 0x43, 0x21]);
        assert_eq!(dest_qpn(&rd), Some(0x65_4321));
        assert_eq!(dest_qpn(&rd[..10]), None);
    }
}

/// The deferred answers of busy-polled RD QPs (`DgramQpShared::receive`).
#[cfg(test)]
mod deferred_tests {
    use super::*;
    use crate::config::{Config, ProgressMode};
    use softrdma_proto::memory::Access;
    use softrdma_proto::wr::{Payload, SendFlags, SendOp, SgList, WcOpcode, WcStatus};

    /// Registered heap memory that outlives the contexts using it.
    struct Buf {
        mem: Vec<u8>,
        stag: u32,
    }

    impl Buf {
        fn new(ctx: &Context, pd: u32, len: usize) -> Buf {
            let mut mem = vec![0u8; len];
            let access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
            // SAFETY: the Vec's heap block does not move, and each test keeps the Buf alive until its contexts are dropped.
            let stag = unsafe {
                ctx.registry()
                    .register(mem.as_mut_ptr(), len, mem.as_ptr() as u64, access, pd)
            }
            .unwrap();
            Buf { mem, stag }
        }
        fn sgl(&self, off: usize, len: u32) -> SgList {
            SgList::single(self.mem.as_ptr() as u64 + off as u64, len, self.stag)
        }
    }

    fn ctx() -> Context {
        Context::with_config(Config {
            progress: ProgressMode::Both,
            ..Config::default()
        })
        .unwrap()
    }

    fn rd_qp(ctx: &Context, pd: u32, cq: &Arc<Cq>) -> DgramQpHandle {
        ctx.create_rd_qp(
            pd,
            QpCaps::default(),
            cq.clone(),
            cq.clone(),
            RdOptions {
                bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
                ..RdOptions::default()
            },
        )
        .unwrap()
    }

    fn send(wr_id: u64, sgl: SgList) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(sgl),
            flags: SendFlags {
                signaled: true,
                ..Default::default()
            },
        }
    }

    /// Polls `cq` until a receive completes; reposts it on `qp`.
    fn wait_recv(cq: &Cq, qp: &DgramQpHandle, buf: &Buf) {
        let mut out = [Completion {
            wc: WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0),
            qp_num: 0,
        }; 8];
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = cq.poll(&mut out);
            let mut got = false;
            for c in &out[..n] {
                assert_eq!(c.wc.status, WcStatus::Success, "{:?}", c.wc);
                if c.wc.opcode == WcOpcode::Recv {
                    qp.post_recv(RecvWr {
                        wr_id: c.wc.wr_id,
                        sgl: buf.sgl(1024 + 64 * c.wc.wr_id as usize, 64),
                    })
                    .unwrap();
                    got = true;
                }
            }
            if got {
                return;
            }
            assert!(Instant::now() < deadline, "no receive");
        }
    }

    /// Two RD QPs of one context share its socket and CQ; a busy poll of
    /// the CQ drains the socket through the first QP only (one inline
    /// progress per socket). The second QP's receives made there must
    /// be answered at once: nobody polls that QP, so a deferred ACK or
    /// Read Response would wait for the fallback timer (rounded up to the
    /// progress thread's millisecond), close to the peer's 2 ms RTO.
    #[test]
    fn receive_for_another_qp_of_the_socket_is_not_deferred() {
        const ROUNDS: u64 = 100;
        let x = ctx();
        let xpd = x.alloc_pd();
        let xcq = x.create_cq(1024, None);
        let qa = rd_qp(&x, xpd, &xcq);
        let qb = rd_qp(&x, xpd, &xcq);
        assert_eq!(
            qa.local_addr().port,
            qb.local_addr().port,
            "the QPs share one socket"
        );
        let y = ctx();
        let ypd = y.alloc_pd();
        let ycq = y.create_cq(1024, None);
        let p = rd_qp(&y, ypd, &ycq);
        let (xbuf, ybuf) = (Buf::new(&x, xpd, 4096), Buf::new(&y, ypd, 4096));
        for k in 0..8 {
            qb.post_recv(RecvWr {
                wr_id: k,
                sgl: xbuf.sgl(1024 + 64 * k as usize, 64),
            })
            .unwrap();
            p.post_recv(RecvWr {
                wr_id: k,
                sgl: ybuf.sgl(1024 + 64 * k as usize, 64),
            })
            .unwrap();
        }
        let mut deferred = 0;
        for i in 0..ROUNDS {
            p.post_send(send(i, ybuf.sgl(0, 64)), qb.local_addr())
                .unwrap();
            wait_recv(&xcq, &qb, &xbuf);
            // What the receive made QB owe (the ACK P asked for) is not
            // left to a poll of QB that will not come.
            if qb.inner.tx_deferred.load(Ordering::Relaxed) {
                deferred += 1;
            }
            qb.post_send(send(i, xbuf.sgl(0, 64)), p.local_addr())
                .unwrap();
            wait_recv(&ycq, &p, &ybuf);
        }
        assert_eq!(
            deferred, 0,
            "{deferred} of {ROUNDS} receives of QB left its answer to a poll of QB"
        );
        // QA, which did the polling, received nothing and owes nothing.
        assert!(!qa.inner.tx_deferred.load(Ordering::Relaxed));
        drop((qa, qb, p));
        drop((x, y));
    }

    /// A poller that arms its CQ (`req_notify`, about to block) sends
    /// what its last inline receive deferred at once, instead of leaving
    /// the ACK to the fallback timer.
    #[test]
    fn arming_the_cq_sends_what_was_deferred() {
        let x = ctx();
        let xpd = x.alloc_pd();
        let xcq = x.create_cq(1024, None);
        let qa = rd_qp(&x, xpd, &xcq);
        let y = ctx();
        let ypd = y.alloc_pd();
        let ycq = y.create_cq(1024, None);
        let p = rd_qp(&y, ypd, &ycq);
        let (xbuf, ybuf) = (Buf::new(&x, xpd, 4096), Buf::new(&y, ypd, 4096));
        for k in 0..8 {
            qa.post_recv(RecvWr {
                wr_id: k,
                sgl: xbuf.sgl(1024 + 64 * k as usize, 64),
            })
            .unwrap();
        }
        let control = |q: &DgramQpHandle| match q.stats().proto {
            ProtoStats::Rd(s) => s.rd.control_sent,
            other => panic!("not an RD QP: {other:?}"),
        };
        // A receive the progress thread made is answered at once; try
        // until the poller made one (most of them, in practice).
        let mut checked = 0;
        for i in 0..200 {
            p.post_send(send(i, ybuf.sgl(0, 64)), qa.local_addr())
                .unwrap();
            wait_recv(&xcq, &qa, &xbuf);
            if !qa.inner.tx_deferred.load(Ordering::Relaxed) {
                xcq.req_notify(false);
                continue;
            }
            let before = control(&qa);
            xcq.req_notify(false);
            assert!(
                !qa.inner.tx_deferred.load(Ordering::Relaxed),
                "still deferred after req_notify"
            );
            assert!(control(&qa) > before, "no ACK sent by req_notify");
            checked += 1;
            if checked == 5 {
                break;
            }
        }
        assert!(checked > 0, "no receive by the poller in 200 tries");
        drop((qa, p));
        drop((x, y));
    }
}

/// Self-driven datagram QPs: the progress thread does not read their
/// sockets, and still runs their timers.
#[cfg(test)]
mod self_driven_tests {
    use super::*;
    use softrdma_proto::memory::Access;
    use softrdma_proto::wr::{Payload, SendFlags, SendOp, SgList, WcOpcode, WcStatus};

    struct Buf {
        mem: Vec<u8>,
        stag: u32,
    }

    impl Buf {
        fn new(ctx: &Context, pd: u32, len: usize) -> Buf {
            let mut mem = vec![0u8; len];
            // SAFETY: the Vec's heap block does not move, and each test keeps the Buf alive until its contexts are dropped.
            let stag = unsafe {
                ctx.registry().register(
                    mem.as_mut_ptr(),
                    len,
                    mem.as_ptr() as u64,
                    Access::LOCAL_WRITE,
                    pd,
                )
            }
            .unwrap();
            Buf { mem, stag }
        }
        fn sgl(&self, off: usize, len: u32) -> SgList {
            SgList::single(self.mem.as_ptr() as u64 + off as u64, len, self.stag)
        }
    }

    fn send(wr_id: u64, sgl: SgList) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Send {
                imm: None,
                invalidate: None,
            },
            payload: Payload::Sgl(sgl),
            flags: SendFlags {
                signaled: true,
                ..Default::default()
            },
        }
    }

    fn blank() -> Completion {
        Completion {
            wc: WorkCompletion::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0),
            qp_num: 0,
        }
    }

    /// Polls `cq` until a completion with `opcode` comes (at most 5 s).
    fn poll_for(cq: &Cq, opcode: WcOpcode) -> WorkCompletion {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut out = [blank(); 8];
        loop {
            let n = cq.poll(&mut out);
            if let Some(c) = out[..n].iter().find(|c| c.wc.opcode == opcode) {
                return c.wc;
            }
            assert!(Instant::now() < deadline, "no {opcode:?} completion");
        }
    }

    fn readable(fd: RawFd, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLIN != 0 }
    }

    const LO: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

    /// A self-driven UD QP's datagrams wait in its own socket until its
    /// user polls: the progress thread reads nothing (the socket counts no
    /// datagram, the CQ stays empty), the socket's descriptor turns
    /// readable, and a poll of the CQ delivers on the polling thread.
    #[test]
    fn ud_delivers_only_when_polled() {
        let x = Context::new().unwrap();
        let xpd = x.alloc_pd();
        let xcq = x.create_cq(64, None);
        let q = x
            .create_ud_qp(
                xpd,
                QpCaps::default(),
                xcq.clone(),
                xcq.clone(),
                UdOptions {
                    bind: LO,
                    self_driven: true,
                    ..UdOptions::default()
                },
            )
            .unwrap();
        assert!(q.is_self_driven());
        // Its socket is its own: a second QP bound alike gets another.
        let other = x
            .create_ud_qp(
                xpd,
                QpCaps::default(),
                xcq.clone(),
                xcq.clone(),
                UdOptions {
                    bind: LO,
                    ..UdOptions::default()
                },
            )
            .unwrap();
        assert_ne!(other.local_addr().port, q.local_addr().port);
        assert_ne!(other.socket_fd(), q.socket_fd());
        drop(other);

        let y = Context::new().unwrap();
        let ypd = y.alloc_pd();
        let ycq = y.create_cq(64, None);
        let p = y
            .create_ud_qp(
                ypd,
                QpCaps::default(),
                ycq.clone(),
                ycq.clone(),
                UdOptions {
                    bind: LO,
                    ..UdOptions::default()
                },
            )
            .unwrap();
        let (xbuf, ybuf) = (Buf::new(&x, xpd, 4096), Buf::new(&y, ypd, 4096));
        for k in 0..4 {
            q.post_recv(RecvWr {
                wr_id: k,
                sgl: xbuf.sgl(1024 + 256 * k as usize, 256),
            })
            .unwrap();
        }
        for round in 0..3u64 {
            p.post_send(send(round, ybuf.sgl(0, 100)), q.local_addr())
                .unwrap();
            assert!(readable(q.socket_fd(), 5000), "nothing arrived");
            // Time for a progress thread that would read it.
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(xcq.len(), 0, "round {round}: completed without a poll");
            assert_eq!(
                q.socket_stats().rx_datagrams,
                round,
                "round {round}: the datagram was read without a poll"
            );
            assert!(readable(q.socket_fd(), 0), "no longer readable");
            let wc = poll_for(&xcq, WcOpcode::Recv);
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 100));
            assert_eq!(wc.src, Some(p.local_addr()));
            assert_eq!(q.socket_stats().rx_datagrams, round + 1);
            q.post_recv(RecvWr {
                wr_id: wc.wr_id,
                sgl: xbuf.sgl(1024 + 256 * wc.wr_id as usize, 256),
            })
            .unwrap();
            // And back: the self-driven QP sends as any other.
            p.post_recv(RecvWr {
                wr_id: 20 + round,
                sgl: ybuf.sgl(2048, 256),
            })
            .unwrap();
            q.post_send(send(10 + round, xbuf.sgl(0, 10)), p.local_addr())
                .unwrap();
            let wc = poll_for(&ycq, WcOpcode::Recv);
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 10));
            assert_eq!(wc.src, Some(q.local_addr()));
            let wc = poll_for(&xcq, WcOpcode::Send);
            assert_eq!((wc.wr_id, wc.status), (10 + round, WcStatus::Success));
        }
        drop((q, p));
        drop((x, y, xbuf, ybuf));
    }

    fn rd_opts(self_driven: bool) -> RdOptions {
        let mut o = RdOptions {
            bind: LO,
            self_driven,
            ..RdOptions::default()
        };
        o.proto.rd.rto_initial = Duration::from_millis(20);
        o.proto.rd.rto_max = Duration::from_millis(40);
        o.proto.rd.retry_limit = 3;
        o
    }

    /// A self-driven RD QP whose user never polls still acknowledges its
    /// peer (the thread's idle look reads its socket), so the peer's send
    /// completes successfully; and one that sends into a black hole
    /// retransmits and fails its request by its timers alone, reported
    /// through the armed CQ's channel with nobody polling.
    #[test]
    fn rd_timers_and_acks_without_polls() {
        let x = Context::new().unwrap();
        let xpd = x.alloc_pd();
        let chan = crate::cq::CompChannel::new().unwrap();
        let xcq = x.create_cq(64, Some(chan.clone()));
        let q = x
            .create_rd_qp(
                xpd,
                QpCaps::default(),
                xcq.clone(),
                xcq.clone(),
                rd_opts(true),
            )
            .unwrap();
        let y = Context::new().unwrap();
        let ypd = y.alloc_pd();
        let ycq = y.create_cq(64, None);
        let p = y
            .create_rd_qp(
                ypd,
                QpCaps::default(),
                ycq.clone(),
                ycq.clone(),
                rd_opts(false),
            )
            .unwrap();
        let (xbuf, ybuf) = (Buf::new(&x, xpd, 4096), Buf::new(&y, ypd, 4096));
        q.post_recv(RecvWr {
            wr_id: 1,
            sgl: xbuf.sgl(1024, 256),
        })
        .unwrap();
        // Nobody polls `xcq`: the peer's send completes all the same (with
        // retries 20+40+40 ms, it would fail within ~150 ms otherwise).
        p.post_send(send(7, ybuf.sgl(0, 64)), q.local_addr())
            .unwrap();
        let wc = poll_for(&ycq, WcOpcode::Send);
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success));
        std::thread::sleep(Duration::from_millis(300));
        let ProtoStats::Rd(s) = p.stats().proto else {
            panic!("not RD")
        };
        assert_eq!(s.rd.peers_failed, 0);
        // The message waits in the CQ (placed by the idle look).
        assert_eq!(xcq.len(), 1);

        // A black hole: a plain socket that never answers.
        let hole = UdpSocket::bind(LO).unwrap();
        let dest = DgramAddr {
            ip: Ipv4Addr::LOCALHOST.into(),
            port: hole.local_addr().unwrap().port(),
            qpn: u32::from(hole.local_addr().unwrap().port()) << 8,
        };
        let mut out = [blank(); 8];
        assert_eq!(xcq.poll(&mut out), 1);
        xcq.req_notify(false);
        q.post_send(send(9, xbuf.sgl(0, 64)), dest).unwrap();
        assert!(
            chan.get_event(Some(Duration::from_secs(5))).is_some(),
            "no completion signalled"
        );
        let n = xcq.poll(&mut out);
        let wc = out[..n]
            .iter()
            .find(|c| c.wc.wr_id == 9)
            .expect("the send's completion")
            .wc;
        assert_eq!(wc.status, WcStatus::RetryExcErr);
        let ProtoStats::Rd(s) = q.stats().proto else {
            panic!("not RD")
        };
        assert!(s.rd.retransmitted >= 3, "{:?}", s.rd);
        assert!(q.stats().timers_thread > 0);
        drop((q, p));
        drop((x, y, xbuf, ybuf));
    }
}
