//! `libexs.so.1`: the Extended Sockets API of `include/sys/exs.h`. The
//! exports are `softrdma_exs_core::exs_exports!` (the sockets interposer
//! expands the same macro); each forwards to `softrdma_exs_core::api`
//! behind a panic boundary: a panic inside the library fails the one call
//! with `EIO` rather than unwinding into C. The design is in
//! `docs/exs.md`.

softrdma_exs_core::exs_exports!();
