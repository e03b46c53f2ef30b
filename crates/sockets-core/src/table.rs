//! Descriptor → softrdma object: which application descriptors are
//! sockets softrdma watches (and epoll sets it shadows).
//!
//! Lock-free lookups (every `read`/`write` of the program asks): a
//! two-level array of [`ArcSwapOption`]s, 4096 descriptors a chunk,
//! chunks made on first use, up to 2²⁰ descriptors (beyond that nothing
//! is tracked and everything goes to the kernel).

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;

use crate::sock::Sock;
use crate::wait::EpollSet;

const CHUNK: usize = 4096;
const CHUNKS: usize = 256;

/// What a descriptor is to softrdma.
#[derive(Debug)]
pub enum Obj {
    /// A TCP socket softrdma may carry.
    Sock(Arc<Sock>),
    /// An application epoll set.
    Epoll(Arc<EpollSet>),
}

type Chunk = [ArcSwapOption<Obj>; CHUNK];

static CHUNK_TABLE: [OnceLock<Box<Chunk>>; CHUNKS] = [const { OnceLock::new() }; CHUNKS];

fn slot(fd: i32, create: bool) -> Option<&'static ArcSwapOption<Obj>> {
    if fd < 0 {
        return None;
    }
    let fd = fd as usize;
    let (c, i) = (fd / CHUNK, fd % CHUNK);
    let lock = CHUNK_TABLE.get(c)?;
    let chunk = if create {
        lock.get_or_init(|| Box::new(std::array::from_fn(|_| ArcSwapOption::empty())))
    } else {
        lock.get()?
    };
    Some(&chunk[i])
}

/// The object of `fd`, if any.
pub fn get(fd: i32) -> Option<Arc<Obj>> {
    slot(fd, false)?.load_full()
}

/// The socket of `fd`, if it is one.
pub fn sock(fd: i32) -> Option<Arc<Sock>> {
    match get(fd).as_deref() {
        Some(Obj::Sock(s)) => Some(s.clone()),
        _ => None,
    }
}

/// The epoll set of `fd`, if it is one.
pub fn epoll(fd: i32) -> Option<Arc<EpollSet>> {
    match get(fd).as_deref() {
        Some(Obj::Epoll(e)) => Some(e.clone()),
        _ => None,
    }
}

/// Records `obj` for `fd` (replacing what was there). False if `fd` is
/// beyond the table.
pub fn set(fd: i32, obj: Obj) -> bool {
    match slot(fd, true) {
        Some(s) => {
            s.store(Some(Arc::new(obj)));
            true
        }
        None => false,
    }
}

/// Records an object shared with another descriptor (`dup`).
pub fn set_arc(fd: i32, obj: Arc<Obj>) -> bool {
    match slot(fd, true) {
        Some(s) => {
            s.store(Some(obj));
            true
        }
        None => false,
    }
}

/// Forgets `fd`; returns what it was.
pub fn take(fd: i32) -> Option<Arc<Obj>> {
    slot(fd, false)?.swap(None)
}

/// Every tracked descriptor and its object (fork handling).
pub fn all() -> Vec<(i32, Arc<Obj>)> {
    let mut v = Vec::new();
    for (c, lock) in CHUNK_TABLE.iter().enumerate() {
        if let Some(chunk) = lock.get() {
            for (i, s) in chunk.iter().enumerate() {
                if let Some(o) = s.load_full() {
                    v.push(((c * CHUNK + i) as i32, o));
                }
            }
        }
    }
    v
}
