//! rsockets (`rsocket`, `rbind`, ..., `riowrite`) over softrdma, owned by
//! the rdmacm engineer; exported like [`crate::rdmacm`] under private
//! names that `librdmacm.so.1` forwards to (see `ARCHITECTURE.md`).
