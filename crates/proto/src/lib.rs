//! Sans-IO iWARP protocol engines.
//!
//! Contract (design.md §2): no sockets, no clocks, no threads. Inputs arrive
//! through `handle_*` calls (stream bytes, datagrams, timeouts with `now`
//! passed in); outputs leave through `poll_*` calls (transmits, the next
//! timeout, completion and connection events). Memory is reached only through
//! a trait that checks STag, PD, access rights and bounds.
//!
//! * [`wr`]: work requests and completions in verbs terms;
//! * [`memory`]: the memory-access trait and a `Vec`-backed implementation;
//! * [`mpa`]: MPA connection setup (initiator and responder);
//! * [`rc`]: the RC queue pair over an MPA stream.
#![forbid(unsafe_code)]

pub mod dc;
pub mod dgram;
pub use dgram::record;
pub mod memory;
pub mod rc;
pub use rc::mpa;
pub mod rd;
pub use rd::qp as rdqp;
pub mod ud;
pub mod wr;

mod util;
