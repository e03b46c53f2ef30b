//! Reliable datagram (RD): reliable, in-order, exactly-once delivery per
//! source over UDP, and the RD queue pair built on it.
//!
//! * [`RdEndpoint`] (in `endpoint/`, re-exported here): the reliability
//!   layer. It sequences caller-defined tokens per peer (sessions and
//!   epochs, ACKs and NAKs, the receive window, retransmission timers,
//!   peer expiry) and knows nothing of DDP.
//! * [`qp`] (also reachable as `crate::rdqp`): the RD queue pair, RDMAP
//!   over the endpoint, driven through the same
//!   [`crate::dgram::DatagramQp`] interface as a UD QP.
//!
//! Contract: both are sans-IO; time is passed in, datagrams go out
//! through the caller.

mod endpoint;
pub mod qp;

pub use endpoint::*;
