//! The public Rust verbs API (Context, ProtectionDomain, CompletionQueue,
//! QueuePair, MemoryRegion, AddressHandle, SharedReceiveQueue) and the
//! connection manager.
//!
//! This crate is empty until the RC transport lands (issue 3).
