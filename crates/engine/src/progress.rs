//! The per-context progress thread: one epoll loop over every connected
//! QP's socket. It makes receive progress (placement, Read Responses,
//! completions) when the application is not polling, and resumes transmit
//! when a socket that pushed back becomes writable.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::thread;

use crate::qp::QpShared;
use crate::sys::{Epoll, EventFd, Interest};

/// Token of the wake-up eventfd.
const WAKE: u64 = u64::MAX;

/// Handle to the progress thread.
#[derive(Debug)]
pub struct Progress {
    epoll: Arc<Epoll>,
    wake: Arc<EventFd>,
    qps: Arc<Mutex<HashMap<u64, Weak<QpShared>>>>,
}

impl Progress {
    /// Starts the thread.
    pub(crate) fn start() -> io::Result<Progress> {
        let epoll = Arc::new(Epoll::new()?);
        let wake = Arc::new(EventFd::new()?);
        epoll.add(
            wake.as_raw_fd(),
            WAKE,
            Interest {
                read: true,
                write: false,
            },
        )?;
        let qps: Arc<Mutex<HashMap<u64, Weak<QpShared>>>> = Arc::new(Mutex::new(HashMap::new()));
        let (e, w, q) = (epoll.clone(), wake.clone(), qps.clone());
        thread::Builder::new()
            .name("softrdma-progress".into())
            .spawn(move || run(&e, &w, &q))?;
        Ok(Progress { epoll, wake, qps })
    }

    /// Watches `fd` for the QP `qp` under `token`.
    pub(crate) fn register(&self, fd: RawFd, token: u64, qp: Weak<QpShared>) -> io::Result<()> {
        self.qps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, qp);
        self.epoll.add(
            fd,
            token,
            Interest {
                read: true,
                write: false,
            },
        )
    }

    /// Adds or removes interest in writability.
    pub(crate) fn watch_write(&self, fd: RawFd, token: u64, write: bool) -> io::Result<()> {
        self.epoll.modify(fd, token, Interest { read: true, write })
    }

    /// Stops watching.
    pub(crate) fn unregister(&self, fd: RawFd, token: u64) {
        self.epoll.delete(fd);
        self.qps
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token);
        self.wake.signal();
    }
}

fn run(epoll: &Epoll, wake: &EventFd, qps: &Mutex<HashMap<u64, Weak<QpShared>>>) {
    let mut evs = [(0u64, false, false, false); 64];
    loop {
        let n = match epoll.wait(&mut evs, 1000) {
            Ok(n) => n,
            Err(_) => return,
        };
        for &(token, r, w, hup) in &evs[..n] {
            if token == WAKE {
                wake.drain();
                continue;
            }
            let qp = qps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&token)
                .and_then(|w| w.upgrade());
            match qp {
                Some(qp) => qp.on_ready(r || hup, w),
                None => {
                    qps.lock().unwrap_or_else(|p| p.into_inner()).remove(&token);
                }
            }
        }
    }
}
