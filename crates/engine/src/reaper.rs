//! Connections closed with octets the peer will not take.
//!
//! An IB-style QP (`RcConfig::rnr_wait`) that disconnects flushes its work
//! as InfiniBand does, but the octets already written to its socket stay
//! there, and a peer whose receive path waits for a receive does not read
//! them: the TCP window stays shut, the FIN queued behind them never
//! leaves, and the peer never learns of the disconnect. InfiniBand's
//! disconnect travels outside the QP's traffic and discards it. Here a
//! disconnected connection (watched from `Qp::disconnect` and again once
//! its last FPDU is written) whose unsent octets have not moved for [`STALL`] is
//! reset (`connect(AF_UNSPEC)` aborts a TCP connection with an RST, which
//! the waiting peer sees: `QpShared::recheck_parked`); one that drains is
//! simply let go. One thread, started on first use, looks every [`EVERY`];
//! at exit (the thread goes with the process, and an orphaned socket with a
//! shut window is dropped by the kernel without a word to the peer) every
//! connection still watched gets [`AT_EXIT`] to drain, then is reset.

use std::net::TcpStream;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long unsent octets may sit unmoved before the connection is reset.
const STALL: Duration = Duration::from_secs(2);
/// How often the thread looks.
const EVERY: Duration = Duration::from_millis(100);
/// How long the exit handler lets watched connections drain.
const AT_EXIT: Duration = Duration::from_millis(300);

struct Watched {
    /// The socket's inode: one connection is watched once, though both
    /// the disconnect and the close of its sending side ask.
    ino: u64,
    sock: OwnedFd,
    unsent: i32,
    since: Instant,
}

static WATCHED: Mutex<Vec<Watched>> = Mutex::new(Vec::new());
static STARTED: Mutex<u32> = Mutex::new(0);

/// Octets written to `fd` and not yet sent or acknowledged (`SIOCOUTQ`);
/// 0 when unknown.
fn unsent(fd: RawFd) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int to the pointer given.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    if r < 0 {
        0
    } else {
        n
    }
}

/// Aborts the connection of `fd` with an RST.
fn reset(fd: RawFd) {
    let sa = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: a live sockaddr of the length given; connect(AF_UNSPEC) on a
    // TCP socket disconnects it.
    let _ = unsafe {
        libc::connect(
            fd,
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
}

/// Watches a connection that was just shut down: it is reset if its
/// unsent octets stall, let go once they are gone.
pub(crate) fn watch(sock: &TcpStream) {
    let fd = sock.as_raw_fd();
    let left = unsent(fd);
    if left <= 0 {
        return;
    }
    let Ok(dup) = sock.try_clone() else { return };
    let file = std::fs::File::from(OwnedFd::from(dup));
    let Ok(ino) = file.metadata().map(|m| m.ino()) else {
        return;
    };
    {
        let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        if w.iter().any(|x| x.ino == ino) {
            return;
        }
        w.push(Watched {
            ino,
            sock: file.into(),
            unsent: left,
            since: Instant::now(),
        });
    }
    let pid = std::process::id();
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if *started != pid {
        // Once per process (a forked child has no thread of its parent's).
        if *started == 0 {
            // SAFETY: registering a plain extern "C" handler.
            unsafe { libc::atexit(at_exit) };
        }
        *started = pid;
        let _ = std::thread::Builder::new()
            .name("softrdma-reaper".into())
            .spawn(run);
    }
}

extern "C" fn at_exit() {
    let end = Instant::now() + AT_EXIT;
    loop {
        let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|x| unsent(x.sock.as_raw_fd()) > 0);
        if w.is_empty() {
            return;
        }
        if Instant::now() >= end {
            for x in w.drain(..) {
                reset(x.sock.as_raw_fd());
            }
            return;
        }
        drop(w);
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn run() {
    loop {
        std::thread::sleep(EVERY);
        let now = Instant::now();
        let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        w.retain_mut(|x| {
            let fd = x.sock.as_raw_fd();
            let left = unsent(fd);
            if left <= 0 {
                return false;
            }
            if left < x.unsent {
                x.unsent = left;
                x.since = now;
                return true;
            }
            if now.duration_since(x.since) >= STALL {
                reset(fd);
                return false;
            }
            true
        });
    }
}
