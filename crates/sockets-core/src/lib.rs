//! The sockets interposer's logic: everything `libsoftrdma-sockets.so`
//! does except exporting the libc names (`crates/sockets`), so that the
//! `softrdma` command can read the statistics and the registry without
//! interposing on itself. The design is in `docs/sockets.md`.
//!
//! * [`hooks`]: one function per interposed C call, with the C call's
//!   contract; the library's exports forward to them.
//! * [`sock`]: an application TCP socket (plain, MPA exchange, RC), and
//!   [`conn`]: the byte stream over an RC QP with its credits.
//! * [`wait`]: `poll`/`select`/`epoll` over a mix of kernel descriptors
//!   and carried sockets.
//! * [`table`]: descriptor → socket; [`registry`]: how interposed ends
//!   find each other on a host; [`policy`]: the environment's rules;
//!   [`stat`]: per-socket statistics in shared memory.
//! * [`real`]: the C library's functions behind ours.

// Every `pub unsafe fn` in `hooks` is a C entry point whose safety
// contract is the C call's (pointers are the caller's valid buffers).
#![allow(clippy::missing_safety_doc)]

pub mod addr;
pub mod conn;
pub mod hooks;
pub mod policy;
pub mod real;
pub mod registry;
pub mod sock;
pub mod stat;
pub mod table;
pub mod udp;
pub mod wait;

use std::sync::{Arc, Mutex};

/// The re-entrancy guard: softrdma's own code (and the engine under it)
/// calls the C library too, which finds the interposed names first. A
/// thread inside softrdma has the guard up, and every interposed call it
/// makes goes straight to the C library.
pub mod guard {
    use std::cell::Cell;

    thread_local! {
        static INSIDE: Cell<bool> = const { Cell::new(false) };
    }

    /// Held while softrdma's code runs on this thread.
    #[derive(Debug)]
    pub struct Guard(());

    /// Raises the guard; `None` if it is already up (the caller is
    /// softrdma itself: forward to the C library).
    pub fn enter() -> Option<Guard> {
        INSIDE
            .try_with(|c| {
                if c.get() {
                    None
                } else {
                    c.set(true);
                    Some(Guard(()))
                }
            })
            .ok()
            .flatten()
    }

    /// Raises the guard for the rest of this thread's life (softrdma's
    /// own threads).
    pub fn enter_forever() {
        let _ = INSIDE.try_with(|c| c.set(true));
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = INSIDE.try_with(|c| c.set(false));
        }
    }
}

/// The process's device, made on first use (and again in a forked child:
/// the parent's engine threads do not exist there).
static DEVICE: Mutex<Option<(u32, Arc<conn::Device>)>> = Mutex::new(None);

/// The process's verbs device.
pub fn device() -> std::io::Result<Arc<conn::Device>> {
    let mut d = DEVICE.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if let Some((p, dev)) = d.as_ref() {
        if *p == pid {
            return Ok(dev.clone());
        }
    }
    let dev = Arc::new(conn::Device::open()?);
    if let Some(old) = d.replace((pid, dev.clone())) {
        // The parent's: its threads are gone, its locks may be held.
        std::mem::forget(old);
    }
    Ok(dev)
}

/// Sockets a forked child inherited with their connections: kept alive
/// (never dropped) so the parent's engine objects are not torn down from
/// the child.
static INHERITED: Mutex<Vec<Arc<sock::Sock>>> = Mutex::new(Vec::new());

/// `pthread_atfork` child handler: connections stay with the parent;
/// statistics go to the child's own table.
pub extern "C" fn after_fork_child() {
    stat::after_fork_child();
    let mut keep = INHERITED.lock().unwrap_or_else(|e| e.into_inner());
    for (_, obj) in table::all() {
        if let table::Obj::Sock(s) = &*obj {
            if s.mark_inherited() {
                keep.push(s.clone());
            }
        }
    }
}

extern "C" fn at_exit() {
    if let Some(_g) = guard::enter() {
        for (fd, obj) in table::all() {
            if let table::Obj::Sock(s) = &*obj {
                if !s.is_inherited() {
                    table::take(fd);
                    s.close_at_exit();
                }
            }
        }
        sock::drain_lingering();
    }
    stat::at_exit();
}

/// Runs once when the library is loaded: fork and exit handlers.
pub fn init() {
    // SAFETY: registering plain extern "C" handlers.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_child));
        libc::atexit(at_exit);
    }
}
