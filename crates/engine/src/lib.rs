//! The softrdma runtime: sockets, progress threads, timers and memory
//! registration. Besides the C ABI crates, the only place with syscalls and
//! `unsafe` (design.md §2).
//!
//! This crate is empty until the RC transport lands (issue 3).
