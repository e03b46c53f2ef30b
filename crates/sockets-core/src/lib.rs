//! The sockets interposer's logic: everything `libsoftrdma-sockets.so`
//! does except exporting the libc names (`crates/sockets`), so that the
//! `softrdma` command can read the statistics and the registry without
//! interposing on itself. The design is in `docs/sockets.md`.

pub mod addr;
pub mod registry;
pub mod stat;
