//! The Extended Sockets API (ES-API) behind `libexs.so`: event queues,
//! memory registrations and asynchronous operations on kernel sockets
//! (the Open Group model), with the progress thread that completes them.
//!
//! `crates/exs` exports the C calls of `sys/exs.h`; each one is a
//! function of [`api`] behind a panic boundary. The design and the
//! decisions where the specification is silent are in `docs/exs.md`.
//!
//! The RDMA model (UNH-EXS: `exs_socket` and friends over softrdma RC
//! queue pairs) is [`rdma`], with its messages in [`wire`]; it shares the
//! queues ([`queue`]) and the registrations ([`mem`], where a region
//! gains an engine STag on first use). Its `SOCK_DGRAM` descriptors, over
//! UD or RD queue pairs, are [`dgram`].
//!
//! [`exs_exports!`] defines the `extern "C"` calls themselves: `libexs.so`
//! expands it, and so does the sockets interposer, which then serves
//! DDPMODE sockets with the RDMA model on their own QPs ([`ddp`]).

pub mod abi;
pub mod api;
pub mod ddp;
pub mod dgram;
pub mod dgram_wr;
pub mod engine;
pub mod exports;
pub mod mem;
pub mod queue;
pub mod rdma;
pub mod sys;
pub mod wire;

/// An errno value.
pub type Errno = libc::c_int;
