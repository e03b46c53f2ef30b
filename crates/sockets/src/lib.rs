//! `libsoftrdma-sockets.so`: the `LD_PRELOAD` interposer (`softrdma run
//! --sockets`). It exports the libc socket calls and forwards them to
//! `softrdma-sockets-core`; see `docs/sockets.md`.
