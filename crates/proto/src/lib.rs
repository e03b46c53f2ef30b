//! Sans-IO iWARP protocol engines.
//!
//! Contract (design.md §2): no sockets, no clocks, no threads. Inputs arrive
//! through `handle_*` calls (stream bytes, datagrams, timeouts with `now`
//! passed in); outputs leave through `poll_*` calls (transmits, the next
//! timeout, completion and connection events). Memory is reached only through
//! a trait that checks STag, PD, access rights and bounds.
//!
//! This crate is empty until the RC transport lands (issue 3).
#![forbid(unsafe_code)]
