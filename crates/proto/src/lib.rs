//! Sans-IO iWARP protocol engines.
//!
//! Contract (design.md §2): no sockets, no clocks, no threads. Inputs arrive
//! through `handle_*` calls (stream bytes, datagrams, timeouts with `now`
//! passed in); outputs leave through `poll_*` calls (transmits, the next
//! timeout, completion and connection events). Memory is reached only through
//! a trait that checks STag, PD, access rights and bounds.
//!
//! # Module map
//!
//! Shared by every transport:
//!
//! * [`wr`]: work requests and completions in verbs terms, the completion
//!   queue a completion belongs to ([`wr::CqKind`]) and why a post is
//!   refused ([`wr::PostError`]);
//! * [`memory`]: the memory-access trait and a `Vec`-backed implementation;
//! * `util`: a fast hasher for locally chosen keys (public as
//!   [`dc::LocalHasher`] / [`dc::LocalMap`]) and the datagram QPs' peer
//!   table.
//!
//! One folder per transport:
//!
//! * [`rc`]: the RC queue pair over an MPA stream: its API and receive
//!   queue in `rc/mod.rs`, framing and transmit (`tx_build`, `tx_ring`,
//!   `tx`), receive (`rx`, `rx_stash`, `rx_direct`), failure (`fail`);
//!   [`rc::mpa`] (also [`mpa`]): MPA connection setup (frame, initiator,
//!   responder);
//! * [`dgram`]: what the datagram QPs share: the [`dgram::DatagramQp`]
//!   interface, the [`dgram::DatagramSink`] and batch staging, the receive
//!   FIFO, segment helpers, and Write-Record placement, [`dgram::record`]
//!   (also [`record`]);
//! * [`ud`]: the UD queue pair (transmit, receive, reassembly);
//! * [`rd`]: reliable datagram: the reliability endpoint
//!   ([`rd::RdEndpoint`]: peers, transmit, receive, timers) and the RD
//!   queue pair [`rd::qp`] (also [`rdqp`]: slots, per-peer state, pump,
//!   settling, transmit, receive);
//! * [`dc`]: SoftDC, dynamically connected transport over RC: the
//!   connection table, its messages, the initiator and target sides,
//!   message handling and timers.
//!
//! Every public path of the flat layout stays valid: `mpa`, `record` and
//! `rdqp` are re-exports of the folder modules, and types that moved to a
//! shared module are re-exported where they were (`rc::CqKind`,
//! `rc::PostError`, `ud::DatagramSink`, `ud::Datagram`, `ud::TX_BATCH`).
#![forbid(unsafe_code)]

pub mod dc;
pub mod dgram;
pub mod memory;
pub mod rc;
pub mod rd;
pub mod ud;
pub mod wr;

mod util;

pub use dgram::record;
pub use rc::mpa;
pub use rd::qp as rdqp;
