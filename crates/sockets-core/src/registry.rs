//! The same-host registry: how an interposed end learns, before a byte
//! is sent, that the other end of a TCP connection is interposed too.
//!
//! A directory (`SOFTRDMA_SOCKETS_DIR`, default `/dev/shm/softrdma-sockets`,
//! mode 1777) holds small files:
//!
//! * `tcp-L-<port>/<netns>-<addr>-<pid>`: a listening socket of process
//!   `pid` bound to `addr:port` in the network namespace `netns` (the
//!   inode number of `/proc/self/ns/net`). Written by `listen`, removed
//!   when its creator closes it (a process that inherited it leaves it).
//! * `tcp-C-<addr>-<port>`: an interposed client whose connection's local
//!   end is `addr:port`; holds `<netns> <pid>`. Written before `connect`
//!   (the socket is bound first so its port is known), removed when the
//!   MPA exchange ends or the socket closes.
//!
//! * `udp-<addr>-<port>`: a datagram socket bound to `addr:port` with a UD
//!   (or RD) QP; holds `<netns> <pid> <qp port> <qpn> <ud|rd|wr>`, and for
//!   `wr` (Write-Record) the receive area's shape after it:
//!   `<rings> <slots per ring> <slot octets>` (each writer's ring, its
//!   rkey and address, is granted by the socket itself: [`crate::udp`]).
//!   Readers take the first five fields and ignore the rest; one that
//!   does not know the transport word takes the socket as plain. Written
//!   when softrdma takes the socket, removed when its creator closes it.
//!
//! A client connecting to `addr:port` accelerates when a listener entry
//! matches; a server that accepts a connection from `addr:port` expects
//! an MPA Request when a client entry does. Entries whose process is gone
//! are ignored and removed. Loopback addresses match only within one
//! network namespace; other addresses match across namespaces (two
//! namespaces of one host acting as two hosts), but a wildcard listener
//! matches only a destination that is an address of the client's own
//! namespace. Peers on other hosts are reached by rule
//! ([`crate::policy`]), not through the registry.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The registry's directory.
pub fn dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os("SOFTRDMA_SOCKETS_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/dev/shm/softrdma-sockets"))
    })
    .clone()
}

/// Creates the directory (mode 1777, so every user's programs share it).
pub fn ensure_dir() -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let d = dir();
    match std::fs::create_dir(&d) {
        Ok(()) => {
            let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777));
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// This process's network namespace (inode of `/proc/self/ns/net`), 0 if
/// unknown.
pub fn netns() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino())
}

/// An address as the registry spells it (IPv4-mapped IPv6 as IPv4).
fn canon(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

fn listener_dir(port: u16) -> PathBuf {
    dir().join(format!("tcp-L-{port}"))
}

/// The entry of a listening socket; removes it when dropped by the process
/// that made it.
#[derive(Debug)]
pub struct ListenerEntry {
    path: PathBuf,
    pid: u32,
}

impl ListenerEntry {
    /// Registers a listener bound to `addr`.
    pub fn new(addr: SocketAddr) -> io::Result<ListenerEntry> {
        ensure_dir()?;
        let d = listener_dir(addr.port());
        match std::fs::create_dir(&d) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let pid = std::process::id();
        let path = d.join(format!("{}-{}-{}", netns(), canon(addr.ip()), pid));
        std::fs::write(&path, b"")?;
        Ok(ListenerEntry { path, pid })
    }
}

impl Drop for ListenerEntry {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether `ip` is an address of one of this namespace's interfaces.
fn is_local(ip: IpAddr) -> bool {
    // Connecting to the unspecified address reaches this host (Linux).
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifa` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return false;
    }
    let mut found = false;
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: `p` walks the list getifaddrs returned.
        let e = unsafe { &*p };
        // SAFETY: getifaddrs' addresses are complete for their family.
        if let Some(a) = unsafe { crate::addr::from_sockaddr_ptr(e.ifa_addr) } {
            if canon(a.ip()) == ip {
                found = true;
                break;
            }
        }
        p = e.ifa_next;
    }
    // SAFETY: the list came from getifaddrs.
    unsafe { libc::freeifaddrs(ifa) };
    found
}

/// Whether an interposed process listens where a connection to `dest`
/// arrives.
pub fn listener_at(dest: SocketAddr) -> bool {
    let ip = canon(dest.ip());
    let d = listener_dir(dest.port());
    let Ok(entries) = std::fs::read_dir(&d) else {
        return false;
    };
    let ns = netns();
    let mut local = None;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let mut parts = name.splitn(2, '-');
        let (Some(ens), Some(rest)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some((eaddr, epid)) = rest.rsplit_once('-') else {
            continue;
        };
        let (Ok(ens), Ok(eaddr), Ok(epid)) = (
            ens.parse::<u64>(),
            eaddr.parse::<IpAddr>(),
            epid.parse::<u32>(),
        ) else {
            continue;
        };
        if !alive(epid) {
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        let same_ns = ens == ns;
        let hit = if eaddr.is_unspecified() {
            // The wildcard of the other family also takes this family's
            // connections only on a dual-stack socket; accept either.
            same_ns && *local.get_or_insert_with(|| is_local(ip))
        } else if eaddr == ip {
            same_ns || !ip.is_loopback()
        } else {
            false
        };
        if hit {
            return true;
        }
    }
    false
}

fn client_path(local: SocketAddr) -> PathBuf {
    dir().join(format!("tcp-C-{}-{}", canon(local.ip()), local.port()))
}

/// The entry of an interposed client's connection; removed when dropped
/// by the process that made it.
#[derive(Debug)]
pub struct ClientEntry {
    path: PathBuf,
    pid: u32,
}

impl ClientEntry {
    /// Registers a client whose local end is `local`.
    pub fn new(local: SocketAddr) -> io::Result<ClientEntry> {
        ensure_dir()?;
        let path = client_path(local);
        let pid = std::process::id();
        std::fs::write(&path, format!("{} {}", netns(), pid))?;
        Ok(ClientEntry { path, pid })
    }
}

impl Drop for ClientEntry {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether the connection that arrived from `peer` was made by an
/// interposed client (which sends an MPA Request first).
pub fn client_at(peer: SocketAddr) -> bool {
    let path = client_path(peer);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return false;
    };
    let mut it = text.split_whitespace();
    let (Some(Ok(ens)), Some(Ok(pid))) = (
        it.next().map(str::parse::<u64>),
        it.next().map(str::parse::<u32>),
    ) else {
        return false;
    };
    if !alive(pid) {
        let _ = std::fs::remove_file(&path);
        return false;
    }
    ens == netns() || !canon(peer.ip()).is_loopback()
}

fn udp_path(a: SocketAddr) -> PathBuf {
    dir().join(format!("udp-{}-{}", canon(a.ip()), a.port()))
}

/// The entry of a datagram socket with a UD QP; removed when dropped by
/// the process that made it.
#[derive(Debug)]
pub struct UdpEntry {
    path: PathBuf,
    pid: u32,
}

impl UdpEntry {
    /// Registers the socket bound to `local` whose QP is `qpn` at UDP
    /// port `qp_port`.
    pub fn new(
        local: SocketAddr,
        qp_port: u16,
        qpn: u32,
        transport: crate::udp::Transport,
    ) -> io::Result<UdpEntry> {
        ensure_dir()?;
        let path = udp_path(local);
        let pid = std::process::id();
        let mut text = format!(
            "{} {} {} {} {}",
            netns(),
            pid,
            qp_port,
            qpn,
            transport.as_str()
        );
        if transport == crate::udp::Transport::Wr {
            text.push_str(&format!(
                " {} {} {}",
                crate::udp::RINGS,
                crate::udp::RING_SLOTS,
                crate::udp::SLOT
            ));
        }
        std::fs::write(&path, text)?;
        Ok(UdpEntry { path, pid })
    }
}

impl Drop for UdpEntry {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The QP (UDP port, QPN, transport) of the interposed datagram socket at
/// `dest`, if there is one: bound to that address, or to the wildcard of a
/// local destination in this network namespace.
pub fn udp_peer(dest: SocketAddr) -> Option<(u16, u32, crate::udp::Transport)> {
    let ip = canon(dest.ip());
    let exact = SocketAddr::new(ip, dest.port());
    let wild = SocketAddr::new(
        if ip.is_ipv4() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        },
        dest.port(),
    );
    for (cand, wildcard) in [(exact, false), (wild, true)] {
        let Ok(text) = std::fs::read_to_string(udp_path(cand)) else {
            continue;
        };
        let f: Vec<&str> = text.split_whitespace().collect();
        let (Some(Ok(ens)), Some(Ok(pid)), Some(Ok(port)), Some(Ok(qpn)), Some(t)) = (
            f.first().map(|v| v.parse::<u64>()),
            f.get(1).map(|v| v.parse::<u32>()),
            f.get(2).map(|v| v.parse::<u16>()),
            f.get(3).map(|v| v.parse::<u32>()),
            f.get(4).and_then(|v| crate::udp::Transport::parse(v)),
        ) else {
            continue;
        };
        if !alive(pid) {
            let _ = std::fs::remove_file(udp_path(cand));
            continue;
        }
        let same_ns = ens == netns();
        let ok = if wildcard {
            same_ns && is_local(ip)
        } else {
            same_ns || !ip.is_loopback()
        };
        if ok {
            return Some((port, qpn, t));
        }
    }
    None
}

/// The local address (port 0) the kernel would use to reach `dest`: a
/// UDP socket connected there is asked (no packet is sent).
pub fn source_for(dest: SocketAddr) -> Option<SocketAddr> {
    let any = unspecified_like(&dest);
    let u = std::net::UdpSocket::bind(any).ok()?;
    u.connect(dest).ok()?;
    let mut a = u.local_addr().ok()?;
    a.set_port(0);
    Some(a)
}

/// The unspecified address of `addr`'s family (what an implicit bind uses).
pub fn unspecified_like(addr: &SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    }
}
