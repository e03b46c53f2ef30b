//! Per-socket statistics, readable from outside while the program runs.
//!
//! Every interposed process keeps a table of its sockets in a shared
//! memory file, `<dir>/stat.<pid>` (`dir`: [`crate::registry::dir`]),
//! that it updates in place with relaxed atomic stores — no system call
//! per update. [`snapshot`] maps another process's file read-only and
//! copies the live rows out (`softrdma sockets stat PID`). The file is
//! removed at exit; [`snapshot`] of a process that is gone reports
//! `NotFound` (and removes a file left behind by a crash).
//!
//! Layout (native endianness, both ends are on one host): a 128-octet
//! header (`MAGIC`, version, row count, pid, totals) and [`ROWS`] rows of
//! [`ROW_LEN`] octets. A row whose `fd` is −1 is free. Counters are
//! monotonic; a reader may see a row mid-update (the text fields are
//! written before `fd` makes the row live, and are not changed after).

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// First octets of a statistics file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SRSKSTAT");
/// The layout's version.
pub const VERSION: u32 = 2;
/// Rows in a file: the sockets a process can show at once (later ones
/// are counted in the header's `overflow`).
pub const ROWS: usize = 4096;
/// Octets per row.
pub const ROW_LEN: usize = 256;
const HEADER_LEN: usize = 128;
const ADDR_LEN: usize = 64;
const FILE_LEN: usize = HEADER_LEN + ROWS * ROW_LEN;

/// What kind of socket a row describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `SOCK_STREAM` (TCP).
    Stream = 1,
    /// `SOCK_DGRAM` (UDP).
    Dgram = 2,
}

/// The socket's role in its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    /// Not connected or listening yet.
    Unknown = 0,
    /// `connect` made it.
    Client = 1,
    /// `accept` returned it.
    Server = 2,
    /// A listening socket.
    Listener = 3,
}

/// Where the socket's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum State {
    /// Not decided yet (unconnected, or the peer's answer is awaited).
    Pending = 0,
    /// Straight to the kernel socket ([`Row::reason`] says why).
    Kernel = 1,
    /// The MPA negotiation with a softrdma peer is under way.
    Handshake = 2,
    /// Over an RC queue pair (iWARP on the connection's TCP stream).
    Rc = 3,
    /// Was accelerated; the connection has ended (or failed).
    Closed = 4,
    /// Inherited across `fork` from a parent that had accelerated it;
    /// unusable here (see `docs/sockets.md`).
    Inherited = 5,
    /// A datagram socket with a UD QP (interposed peers over UD, others
    /// through the kernel).
    Ud = 6,
    /// A datagram socket whose QP carries RDMA Write-Records
    /// (`SOFTRDMA_TRANSPORT_WR`; interposed peers of the same transport
    /// over Write-Records, others through the kernel).
    Wr = 7,
}

/// Why a socket is not (or no longer) accelerated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reason {
    /// Nothing to say (accelerated, or not decided).
    None = 0,
    /// The peer is not known to run softrdma (no registry entry, no rule).
    PlainPeer = 1,
    /// The policy (rules, `SOFTRDMA_SOCKETS`) leaves it to the kernel.
    Policy = 2,
    /// Not a kind softrdma carries (datagram sockets, raw, unix, …).
    Unsupported = 3,
    /// A listening socket: its accepted connections are decided one by one.
    Listener = 4,
    /// The MPA negotiation with the peer failed.
    HandshakeFailed = 5,
    /// softrdma could not set up its resources (memory, engine).
    Resources = 6,
    /// The socket was used in a way only the kernel can serve (e.g. the
    /// program read it before the decision, or a non-blocking connect's
    /// peer answered in a way that rules the decision out).
    Disturbed = 7,
}

impl Reason {
    /// The word `softrdma sockets stat` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::None => "-",
            Reason::PlainPeer => "plain-peer",
            Reason::Policy => "policy",
            Reason::Unsupported => "unsupported",
            Reason::Listener => "listener",
            Reason::HandshakeFailed => "handshake-failed",
            Reason::Resources => "resources",
            Reason::Disturbed => "disturbed",
        }
    }
    fn from_u8(v: u8) -> Reason {
        match v {
            1 => Reason::PlainPeer,
            2 => Reason::Policy,
            3 => Reason::Unsupported,
            4 => Reason::Listener,
            5 => Reason::HandshakeFailed,
            6 => Reason::Resources,
            7 => Reason::Disturbed,
            _ => Reason::None,
        }
    }
}

impl State {
    /// The word `softrdma sockets stat` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Kernel => "kernel",
            State::Handshake => "handshake",
            State::Rc => "rc",
            State::Closed => "closed",
            State::Inherited => "inherited",
            State::Ud => "ud",
            State::Wr => "wr",
        }
    }
    fn from_u8(v: u8) -> State {
        match v {
            1 => State::Kernel,
            2 => State::Handshake,
            3 => State::Rc,
            4 => State::Closed,
            5 => State::Inherited,
            6 => State::Ud,
            7 => State::Wr,
            _ => State::Pending,
        }
    }
}

impl Role {
    /// The word `softrdma sockets stat` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Unknown => "-",
            Role::Client => "client",
            Role::Server => "server",
            Role::Listener => "listener",
        }
    }
    fn from_u8(v: u8) -> Role {
        match v {
            1 => Role::Client,
            2 => Role::Server,
            3 => Role::Listener,
            _ => Role::Unknown,
        }
    }
}

impl Kind {
    /// The word `softrdma sockets stat` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Stream => "tcp",
            Kind::Dgram => "udp",
        }
    }
}

/// One row as [`snapshot`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The application's descriptor.
    pub fd: i32,
    /// TCP or UDP.
    pub kind: Kind,
    /// Client, server or listener.
    pub role: Role,
    /// Where its bytes go.
    pub state: State,
    /// Why it is not accelerated ([`Reason::None`] when it is).
    pub reason: Reason,
    /// Local address (`ip:port`), empty if unbound.
    pub local: String,
    /// Peer address, empty if unconnected.
    pub peer: String,
    /// Octets the application sent.
    pub tx_bytes: u64,
    /// Octets the application received.
    pub rx_bytes: u64,
    /// Messages (RC Sends) carrying them out.
    pub tx_msgs: u64,
    /// Messages carrying them in.
    pub rx_msgs: u64,
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    rows: AtomicU32,
    pid: AtomicU32,
    overflow: AtomicU32,
    /// Connections carried over RC so far.
    rc_conns: AtomicU64,
    /// Connections (client or server ends) left to the kernel so far.
    kernel_conns: AtomicU64,
    /// Octets sent and received over RC so far.
    rc_tx_bytes: AtomicU64,
    rc_rx_bytes: AtomicU64,
    /// Datagram sockets given a UD QP so far.
    ud_socks: AtomicU64,
    /// Octets sent and received over UD so far.
    ud_tx_bytes: AtomicU64,
    ud_rx_bytes: AtomicU64,
}

/// A process's totals since it started (rows come and go with sockets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Connections carried over RC.
    pub rc_conns: u64,
    /// Connection ends left to the kernel.
    pub kernel_conns: u64,
    /// Octets the application sent over RC.
    pub rc_tx_bytes: u64,
    /// Octets the application received over RC.
    pub rc_rx_bytes: u64,
    /// Datagram sockets given a UD QP.
    pub ud_socks: u64,
    /// Octets the application sent over UD.
    pub ud_tx_bytes: u64,
    /// Octets the application received over UD.
    pub ud_rx_bytes: u64,
}

impl Totals {
    /// One line, `key=value` pairs (`SOFTRDMA_SOCKETS_REPORT`).
    pub fn line(&self, pid: u32) -> String {
        format!(
            "pid={pid} rc_conns={} kernel_conns={} rc_tx_bytes={} rc_rx_bytes={} ud_socks={} ud_tx_bytes={} ud_rx_bytes={}",
            self.rc_conns,
            self.kernel_conns,
            self.rc_tx_bytes,
            self.rc_rx_bytes,
            self.ud_socks,
            self.ud_tx_bytes,
            self.ud_rx_bytes
        )
    }
}

fn header_totals(h: &Header) -> Totals {
    Totals {
        rc_conns: h.rc_conns.load(Ordering::Relaxed),
        kernel_conns: h.kernel_conns.load(Ordering::Relaxed),
        rc_tx_bytes: h.rc_tx_bytes.load(Ordering::Relaxed),
        rc_rx_bytes: h.rc_rx_bytes.load(Ordering::Relaxed),
        ud_socks: h.ud_socks.load(Ordering::Relaxed),
        ud_tx_bytes: h.ud_tx_bytes.load(Ordering::Relaxed),
        ud_rx_bytes: h.ud_rx_bytes.load(Ordering::Relaxed),
    }
}

/// A row in shared memory; see the module docs.
#[repr(C)]
struct RawRow {
    fd: AtomicI32,
    kind: AtomicU8,
    role: AtomicU8,
    state: AtomicU8,
    reason: AtomicU8,
    tx_bytes: AtomicU64,
    rx_bytes: AtomicU64,
    tx_msgs: AtomicU64,
    rx_msgs: AtomicU64,
    local: [AtomicU8; ADDR_LEN],
    peer: [AtomicU8; ADDR_LEN],
}

const _: () = assert!(std::mem::size_of::<RawRow>() <= ROW_LEN);
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_LEN);

/// This process's table (created on first use; re-created in a forked
/// child by [`after_fork_child`]).
struct Table {
    base: *mut u8,
    path: Mutex<PathBuf>,
    /// Free row indices are found by scanning from `next` (under `alloc`).
    alloc: Mutex<usize>,
}

// SAFETY: the mapping is shared memory accessed only through atomics
// (rows, header) or under `alloc`; the pointer stays valid for the process.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

static TABLE: OnceLock<Option<Table>> = OnceLock::new();
fn path_of(pid: u32) -> PathBuf {
    crate::registry::dir().join(format!("stat.{pid}"))
}

fn create_table() -> Option<Table> {
    let pid = std::process::id();
    let path = path_of(pid);
    crate::registry::ensure_dir().ok()?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .ok()?;
    file.set_len(FILE_LEN as u64).ok()?;
    let base = map(&file, true).ok()?;
    // SAFETY: `base` maps FILE_LEN octets, Header fits in HEADER_LEN and
    // is made of atomics (any bit pattern, including the file's zeros).
    let h = unsafe { &*(base as *const Header) };
    for i in 0..ROWS {
        row_at(base, i).fd.store(-1, Ordering::Relaxed);
    }
    h.version.store(VERSION, Ordering::Relaxed);
    h.rows.store(ROWS as u32, Ordering::Relaxed);
    h.pid.store(pid, Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Release);
    Some(Table {
        base,
        path: Mutex::new(path),
        alloc: Mutex::new(0),
    })
}

fn map(file: &File, write: bool) -> io::Result<*mut u8> {
    use std::os::fd::AsRawFd;
    let prot = if write {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a shared mapping of a file we hold open, FILE_LEN long (the
    // file was sized to it, or checked by the caller); no Rust reference
    // aliases it except through atomics.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE_LEN,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

fn row_at<'a>(base: *mut u8, i: usize) -> &'a RawRow {
    debug_assert!(i < ROWS);
    // SAFETY: row i lies inside the FILE_LEN mapping, which lives for the
    // process; RawRow is atomics only, valid for any bit pattern.
    unsafe { &*(base.add(HEADER_LEN + i * ROW_LEN) as *const RawRow) }
}

fn table() -> Option<&'static Table> {
    TABLE.get_or_init(create_table).as_ref()
}

/// Whether statistics are kept (`SOFTRDMA_SOCKETS_STATS=0` turns them off).
fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTRDMA_SOCKETS_STATS").map_or(true, |v| v != "0"))
}

/// A socket's row: a handle the socket keeps and updates. A handle whose
/// table could not be made (or with statistics off) updates nothing.
#[derive(Debug)]
pub struct Slot {
    idx: Option<usize>,
    /// The table's base address when `idx` is `Some`.
    base: usize,
}

impl Slot {
    /// Takes a free row for descriptor `fd`.
    pub fn new(fd: i32, kind: Kind) -> Slot {
        let none = Slot { idx: None, base: 0 };
        if !enabled() {
            return none;
        }
        let Some(t) = table() else { return none };
        let mut next = t.alloc.lock().unwrap_or_else(|e| e.into_inner());
        for k in 0..ROWS {
            let i = (*next + k) % ROWS;
            let r = row_at(t.base, i);
            if r.fd.load(Ordering::Relaxed) == -1 {
                *next = (i + 1) % ROWS;
                for c in r.local.iter().chain(r.peer.iter()) {
                    c.store(0, Ordering::Relaxed);
                }
                for c in [&r.tx_bytes, &r.rx_bytes, &r.tx_msgs, &r.rx_msgs] {
                    c.store(0, Ordering::Relaxed);
                }
                r.kind.store(kind as u8, Ordering::Relaxed);
                r.role.store(0, Ordering::Relaxed);
                r.state.store(0, Ordering::Relaxed);
                r.reason.store(0, Ordering::Relaxed);
                r.fd.store(fd, Ordering::Release);
                return Slot {
                    idx: Some(i),
                    base: t.base as usize,
                };
            }
        }
        // SAFETY: the header is atomics inside the live mapping.
        let h = unsafe { &*(t.base as *const Header) };
        h.overflow.fetch_add(1, Ordering::Relaxed);
        none
    }

    fn row(&self) -> Option<&RawRow> {
        self.idx.map(|i| row_at(self.base as *mut u8, i))
    }

    fn header(&self) -> Option<&Header> {
        // SAFETY: `base` is a live mapping whose header is atomics.
        self.idx.map(|_| unsafe { &*(self.base as *const Header) })
    }

    /// Sets the state and the reason. The first move of a client or
    /// server end to [`State::Rc`] or [`State::Kernel`] counts in the
    /// process's [`Totals`].
    pub fn set_state(&self, state: State, reason: Reason) {
        if let Some(r) = self.row() {
            let old = r.state.swap(state as u8, Ordering::Relaxed);
            r.reason.store(reason as u8, Ordering::Relaxed);
            let role = r.role.load(Ordering::Relaxed);
            let end = role == Role::Client as u8
                || role == Role::Server as u8
                || (matches!(state, State::Ud | State::Wr)
                    && old != State::Ud as u8
                    && old != State::Wr as u8);
            if let (Some(h), true) = (self.header(), end && old != state as u8) {
                match state {
                    State::Rc => {
                        h.rc_conns.fetch_add(1, Ordering::Relaxed);
                    }
                    State::Kernel if old != State::Rc as u8 => {
                        h.kernel_conns.fetch_add(1, Ordering::Relaxed);
                    }
                    State::Ud | State::Wr => {
                        h.ud_socks.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Sets the role.
    pub fn set_role(&self, role: Role) {
        if let Some(r) = self.row() {
            r.role.store(role as u8, Ordering::Relaxed);
        }
    }

    /// Records the descriptor (after `dup2` moved the socket).
    pub fn set_fd(&self, fd: i32) {
        if let Some(r) = self.row() {
            r.fd.store(fd, Ordering::Relaxed);
        }
    }

    /// Records the addresses (`None` leaves one as it is).
    pub fn set_addrs(&self, local: Option<&str>, peer: Option<&str>) {
        if let Some(r) = self.row() {
            for (dst, src) in [(&r.local, local), (&r.peer, peer)] {
                if let Some(s) = src {
                    let b = s.as_bytes();
                    for (i, c) in dst.iter().enumerate() {
                        c.store(
                            if i < ADDR_LEN - 1 {
                                *b.get(i).unwrap_or(&0)
                            } else {
                                0
                            },
                            Ordering::Relaxed,
                        );
                    }
                }
            }
        }
    }

    /// Counts `bytes` sent in `msgs` messages.
    pub fn sent(&self, bytes: usize, msgs: u64) {
        if let Some(r) = self.row() {
            r.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            r.tx_msgs.fetch_add(msgs, Ordering::Relaxed);
        }
        if let (Some(h), Some(r)) = (self.header(), self.row()) {
            if r.kind.load(Ordering::Relaxed) == Kind::Dgram as u8 {
                h.ud_tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            } else {
                h.rc_tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            }
        }
    }

    /// Counts `bytes` received in `msgs` messages.
    pub fn received(&self, bytes: usize, msgs: u64) {
        if let Some(r) = self.row() {
            r.rx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            r.rx_msgs.fetch_add(msgs, Ordering::Relaxed);
        }
        if let (Some(h), Some(r)) = (self.header(), self.row()) {
            if r.kind.load(Ordering::Relaxed) == Kind::Dgram as u8 {
                h.ud_rx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            } else {
                h.rc_rx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
            }
        }
    }

    /// Frees the row.
    pub fn release(&mut self) {
        if let Some(r) = self.row() {
            r.fd.store(-1, Ordering::Release);
        }
        self.idx = None;
    }

    /// Reads the row back (the process's own view; tests).
    pub fn read(&self) -> Option<Row> {
        self.row().and_then(decode)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}

fn decode(r: &RawRow) -> Option<Row> {
    let fd = r.fd.load(Ordering::Acquire);
    if fd < 0 {
        return None;
    }
    let text = |a: &[AtomicU8; ADDR_LEN]| {
        let v: Vec<u8> = a
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .take_while(|&c| c != 0)
            .collect();
        String::from_utf8_lossy(&v).into_owned()
    };
    Some(Row {
        fd,
        kind: if r.kind.load(Ordering::Relaxed) == Kind::Dgram as u8 {
            Kind::Dgram
        } else {
            Kind::Stream
        },
        role: Role::from_u8(r.role.load(Ordering::Relaxed)),
        state: State::from_u8(r.state.load(Ordering::Relaxed)),
        reason: Reason::from_u8(r.reason.load(Ordering::Relaxed)),
        local: text(&r.local),
        peer: text(&r.peer),
        tx_bytes: r.tx_bytes.load(Ordering::Relaxed),
        rx_bytes: r.rx_bytes.load(Ordering::Relaxed),
        tx_msgs: r.tx_msgs.load(Ordering::Relaxed),
        rx_msgs: r.rx_msgs.load(Ordering::Relaxed),
    })
}

/// Process `pid`'s totals and live rows (by descriptor). `NotFound` if
/// the process keeps none (not interposed, statistics off, or gone — a
/// file whose process is gone is removed).
pub fn snapshot(pid: u32) -> io::Result<(Totals, Vec<Row>)> {
    let path = path_of(pid);
    // SAFETY: kill with signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
        || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !alive {
        let _ = std::fs::remove_file(&path);
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no process {pid}"),
        ));
    }
    let file = File::open(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "{}: {e} (is process {pid} running under `softrdma run --sockets`?)",
                path.display()
            ),
        )
    })?;
    if file.metadata()?.len() < FILE_LEN as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: too short for a statistics table", path.display()),
        ));
    }
    let base = map(&file, false)?;
    // SAFETY: the read-only mapping is FILE_LEN long; Header is atomics.
    let h = unsafe { &*(base as *const Header) };
    let out = if h.magic.load(Ordering::Acquire) != MAGIC
        || h.version.load(Ordering::Relaxed) != VERSION
    {
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a version-{VERSION} table", path.display()),
        ))
    } else {
        let mut rows: Vec<Row> = (0..ROWS).filter_map(|i| decode(row_at(base, i))).collect();
        rows.sort_by_key(|r| r.fd);
        Ok((header_totals(h), rows))
    };
    // SAFETY: unmapping the mapping made above; no reference outlives it
    // (rows were copied into owned values).
    unsafe { libc::munmap(base as *mut libc::c_void, FILE_LEN) };
    out
}

/// Removes this process's table file (at exit).
pub fn remove_own() {
    if let Some(Some(t)) = TABLE.get() {
        let p = t.path.lock().unwrap_or_else(|e| e.into_inner());
        let _ = std::fs::remove_file(&*p);
    }
}

/// This process's totals and live rows.
pub fn own() -> (Totals, Vec<Row>) {
    let Some(t) = table() else {
        return (Totals::default(), Vec::new());
    };
    // SAFETY: the header of our own live mapping.
    let h = unsafe { &*(t.base as *const Header) };
    (
        header_totals(h),
        (0..ROWS)
            .filter_map(|i| decode(row_at(t.base, i)))
            .collect(),
    )
}

/// At exit: appends this process's [`Totals::line`] to the file named by
/// `SOFTRDMA_SOCKETS_REPORT` (if set) and removes the table file.
pub fn at_exit() {
    if let Some(path) = report_path() {
        let (t, _) = own();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            use std::io::Write as _;
            // One write: processes that exit together append whole lines.
            let _ = f.write_all(format!("{}\n", t.line(std::process::id())).as_bytes());
        }
    }
    remove_own();
}

/// `SOFTRDMA_SOCKETS_REPORT` as it was when the library was loaded (a
/// program may empty its children's environment: nginx's workers).
pub fn report_path() -> Option<&'static std::ffi::OsStr> {
    static P: OnceLock<Option<std::ffi::OsString>> = OnceLock::new();
    P.get_or_init(|| std::env::var_os("SOFTRDMA_SOCKETS_REPORT").filter(|p| !p.is_empty()))
        .as_deref()
}

/// In a forked child: the table becomes the child's own file, starting
/// as a copy of the parent's rows (the child holds the same descriptors)
/// with the totals at zero; the inherited sockets' handles keep working,
/// now on the child's file.
pub fn after_fork_child() {
    let Some(Some(t)) = TABLE.get() else { return };
    let path = path_of(std::process::id());
    // SAFETY: the mapping is FILE_LEN octets of ours; it is read as
    // plain octets to copy it.
    let bytes = unsafe { std::slice::from_raw_parts(t.base as *const u8, FILE_LEN) }.to_vec();
    let copied = std::fs::write(&path, &bytes).is_ok();
    let file = copied
        .then(|| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .ok()
        })
        .flatten();
    match file {
        Some(f) => {
            use std::os::fd::AsRawFd;
            // SAFETY: maps the child's file over the parent's mapping at the
            // same address and length; the handles (atomics) keep working.
            let p = unsafe {
                libc::mmap(
                    t.base as *mut libc::c_void,
                    FILE_LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    f.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                scratch(t.base);
                return;
            }
            // SAFETY: the header of the (new) live mapping.
            let h = unsafe { &*(t.base as *const Header) };
            h.pid.store(std::process::id(), Ordering::Relaxed);
            for c in [
                &h.rc_conns,
                &h.kernel_conns,
                &h.rc_tx_bytes,
                &h.rc_rx_bytes,
                &h.ud_socks,
                &h.ud_tx_bytes,
                &h.ud_rx_bytes,
            ] {
                c.store(0, Ordering::Relaxed);
            }
            *t.path.lock().unwrap_or_else(|e| e.into_inner()) = path;
        }
        None => scratch(t.base),
    }
}

/// Replaces the mapping at `base` by private anonymous memory, so the
/// inherited handles' updates stay in this process.
fn scratch(base: *mut u8) {
    // SAFETY: `base` is the start of a FILE_LEN mapping of ours; MAP_FIXED
    // replaces exactly it with zeroed private memory, which the handles
    // (atomics only) may keep using.
    unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            FILE_LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

/// Formats rows as `softrdma sockets stat` prints them.
pub fn format_table(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>5} {:<4} {:<8} {:<9} {:<16} {:<24} {:<24} {:>12} {:>12} {:>9} {:>9}",
        "fd",
        "kind",
        "role",
        "state",
        "reason",
        "local",
        "peer",
        "tx_bytes",
        "rx_bytes",
        "tx_msgs",
        "rx_msgs"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>5} {:<4} {:<8} {:<9} {:<16} {:<24} {:<24} {:>12} {:>12} {:>9} {:>9}",
            r.fd,
            r.kind.as_str(),
            r.role.as_str(),
            r.state.as_str(),
            r.reason.as_str(),
            r.local,
            r.peer,
            r.tx_bytes,
            r.rx_bytes,
            r.tx_msgs,
            r.rx_msgs
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::State;

    #[test]
    fn datagram_states_have_their_words() {
        for (v, word) in [(6u8, "ud"), (7, "wr")] {
            let s = State::from_u8(v);
            assert_eq!(s as u8, v);
            assert_eq!(s.as_str(), word);
        }
        assert_eq!(State::from_u8(8).as_str(), "pending");
    }
}
