//! softrdma's drop-in `libibverbs.so.1` (rdma-core 44 ABI, Debian 12).
//!
//! Unmodified verbs programs load this library instead of rdma-core's
//! (`softrdma run -- PROG`, or `LD_LIBRARY_PATH`) and run over softrdma:
//! no kernel module, no root. It also carries the implementation of
//! librdmacm and rsockets ([`rdmacm`], [`rsocket`]), which the thin
//! `librdmacm.so.1` forwards to, so one process has exactly one softrdma
//! engine ([`objects::engine`]) whichever library loads first.
//!
//! * [`abi`], [`abi_cm`]: the C structures, checked against Debian's
//!   headers by `tests/layout.rs`.
//! * [`export`]: symbol export with rdma-core's version nodes
//!   (`exports.txt` → `build.rs` version script) and the panic boundary.
//! * [`device`]: one device per IPv4 interface, iWARP, Ethernet, port
//!   ACTIVE, IPv4-mapped GID.
//! * [`objects`]: how C objects map to engine objects; the internal API
//!   rdma_cm builds on (`docs/capi.md`).
//! * [`verbs_api`]: the exported control path; [`datapath`]: the
//!   `ibv_context_ops` data path; [`qp_ex`]: `ibv_wr_*` and
//!   `ibv_cq_ex` polling.
//! * [`stubs`]: the `IBVERBS_PRIVATE_34` names the system's provider
//!   libraries import; [`ext`]: softrdma's own calls
//!   (`include/softrdma/verbs.h`); [`sdc`]: the SoftDC calls
//!   (`ibv_sdc_*`, same header).

// Every `pub unsafe extern "C" fn` here is a C entry point whose safety
// contract is the rdma-core API's (pointers are the library's live objects
// or the caller's valid buffers), stated once here rather than per function.
#![allow(clippy::missing_safety_doc)]

pub mod abi;
pub mod abi_cm;
pub mod datapath;
pub mod device;
pub mod export;
pub mod ext;
pub mod kern;
pub mod objects;
pub mod qp_ex;
pub mod rdmacm;
pub mod rsocket;
pub mod sdc;
pub mod stubs;
pub mod verbs_api;
