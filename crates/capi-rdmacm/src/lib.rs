//! softrdma's drop-in `librdmacm.so.1` (rdma-core 44 ABI, Debian 12).
//!
//! A thin forwarder: each exported `rdma_*` and `r*` symbol (version nodes
//! `RDMACM_1.0` … `RDMACM_1.3`, from `exports.txt`) is a one-instruction
//! trampoline, `jmp softrdma_<name>@PLT`, into softrdma's
//! `libibverbs.so.1` (version node `SOFTRDMA_PRIVATE_1`), where rdma_cm
//! and rsockets are implemented (`crates/capi/src/rdmacm`,
//! `crates/capi/src/rsocket`) next to the verbs objects and the process's
//! one engine. A tail jump passes every argument through untouched
//! (variadic `rfcntl` included) and returns the callee's result, so this
//! library has no code of its own that could panic or misread an
//! argument; the panic boundary is the callee's.
//!
//! `build.rs` generates the trampolines and the version script from
//! `exports.txt`, and links against a stub `libibverbs.so.1` (same SONAME,
//! the private symbols with their version) so the library records
//! `NEEDED libibverbs.so.1` and versioned references; at run time the real
//! softrdma `libibverbs.so.1` next to it provides them.

std::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/trampolines.s")));
