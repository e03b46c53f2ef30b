//! How functions leave this library: [`export!`] and the panic boundary.
//!
//! * `export!(name)` defines the global symbol `name` as an alias of the
//!   Rust function of the same name in the invoking module (a
//!   `global_asm!` `.set`). The Rust function itself keeps its mangled name,
//!   so rustc's anonymous version script does not claim the C name and the
//!   version node assigned in `exports.txt` (via `build.rs`) applies. Every
//!   exported name must be in `exports.txt` and vice versa (the link fails
//!   on a name in the list that is not defined; `tests/exports.rs` checks
//!   the other direction against rdma-core's list).
//! * [`guard`] is the panic boundary every `extern "C"` body runs in: a
//!   panic becomes an error return with `errno` set (EIO), never an unwind
//!   into C.

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Exports Rust `extern "C"` functions of the calling module under their
/// own names (see the module documentation).
macro_rules! export {
    ($($name:ident),* $(,)?) => {
        $(
            std::arch::global_asm!(
                concat!(".globl ", stringify!($name)),
                concat!(".type ", stringify!($name), ", @function"),
                concat!(".set ", stringify!($name), ", {f}"),
                f = sym $name,
            );
        )*
    };
}
pub(crate) use export;

/// Exports `func` of the calling module under each of the given names
/// (several C symbols sharing one implementation, e.g. stubs).
macro_rules! export_as {
    ($func:ident => $($name:ident),* $(,)?) => {
        $(
            std::arch::global_asm!(
                concat!(".globl ", stringify!($name)),
                concat!(".type ", stringify!($name), ", @function"),
                concat!(".set ", stringify!($name), ", {f}"),
                f = sym $func,
            );
        )*
    };
}
pub(crate) use export_as;

/// True when `SOFTRDMA_CAPI_DEBUG` is set: failing calls say why on
/// stderr.
pub fn debug_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTRDMA_CAPI_DEBUG").is_some())
}

/// Prints to stderr when [`debug_enabled`].
macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::export::debug_enabled() {
            eprintln!("softrdma-capi: {}", format_args!($($t)*));
        }
    };
}
pub(crate) use debug;

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`; if it panics, sets `errno` to EIO and returns `on_panic`.
pub fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// For calls that return an errno value (0 on success): the panic value is
/// EIO.
pub fn guard_errno(f: impl FnOnce() -> i32) -> i32 {
    guard(libc::EIO, f)
}

/// For calls that return a pointer (NULL with `errno` on failure).
pub fn guard_ptr<T>(f: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    guard(std::ptr::null_mut(), || match f() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// For calls that return 0 or -1 with `errno`.
pub fn guard_neg(f: impl FnOnce() -> Result<i32, i32>) -> i32 {
    guard(-1, || match f() {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}
