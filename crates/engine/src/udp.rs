//! The UDP socket calls std does not offer, for the datagram runtime
//! ([`crate::dgram`]): `recvmmsg` into buffers allocated once per socket,
//! `sendmmsg`/`sendmsg` of gather lists (header, registered memory,
//! trailer: nothing is copied), the socket options we need (DF, buffer
//! sizes, multicast membership and sending interface, `IP_PKTINFO`) and a
//! listener bound with `SO_REUSEADDR`/`SO_REUSEPORT`.
//!
//! Segmentation offload: [`send_batch`] sends each run of consecutive
//! equal-sized datagrams to one destination as one UDP GSO message
//! (`UDP_SEGMENT`, the run's last datagram may be shorter), several such
//! messages per `sendmmsg`; the kernel (or the NIC) cuts it into exactly
//! the datagrams the protocol built. A socket with `UDP_GRO` gets such
//! runs back as one buffer with the segment size in a control message;
//! [`recv_batch`] splits it into the original datagrams again. If the
//! kernel refuses GSO on a path (no checksum offload: `EIO`), the batch is
//! sent datagram by datagram and GSO is switched off for the socket.
//!
//! Every `unsafe` block is one FFI call (or the setup of the structures it
//! reads) on a descriptor the caller owns, and says why it is sound.

use std::io::{self, IoSlice};
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use softrdma_proto::ud::Datagram;

use crate::sys;

/// Buffers (datagrams, or GRO runs of up to 64 KiB) read by one
/// `recvmmsg`. A batch is processed after the kernel wrote all of it, so
/// one that outgrows a core's L2 cache is read back from memory, and
/// evicts the QP's own state with it: 32 buffers (2 MiB of GRO runs) made
/// 64 KiB Write-Records 0.55-0.60x raw UDP, 16 the same, 8 0.66-0.69x, 4
/// 0.56-0.66x (three alternated runs each).
pub(crate) const RX_BATCH: usize = 8;
/// Room for one datagram: the largest UDP payload fits, so nothing a peer
/// with a larger MTU sends is truncated.
pub(crate) const RX_BUF: usize = 65536;
/// Datagrams handed to one `sendmmsg` (a larger batch is sent in pieces).
const TX_BATCH: usize = 32;
/// Gather pieces for one `sendmmsg` (header, payload pieces and trailer
/// of each datagram).
const TX_IOVS: usize = TX_BATCH * 12;
/// Most datagrams in one GSO message (the kernel's `UDP_MAX_SEGMENTS` is
/// 64 on older kernels).
const GSO_MAX_SEGS: usize = 64;
/// Control buffer per received datagram (room for `IP_PKTINFO` and
/// `UDP_GRO`).
const CMSG_WORDS: usize = 8;
/// Pieces (datagrams once GRO runs are split) a ring holds without growing.
const RX_UNITS: usize = RX_BATCH * 64;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// `setsockopt` with an `int` value.
pub(crate) fn set_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its size; `fd` is open (the caller owns it); the kernel only reads the value.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn set_mreqn(fd: RawFd, name: libc::c_int, group: Ipv4Addr, iface: Ipv4Addr) -> io::Result<()> {
    let m = libc::ip_mreqn {
        imr_multiaddr: in_addr(group),
        imr_address: in_addr(iface),
        imr_ifindex: 0,
    };
    // SAFETY: a live ip_mreqn and its size; the kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_IP,
            name,
            &m as *const libc::ip_mreqn as *const libc::c_void,
            size_of::<libc::ip_mreqn>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

fn in_addr(ip: Ipv4Addr) -> libc::in_addr {
    libc::in_addr {
        s_addr: u32::from_ne_bytes(ip.octets()),
    }
}

/// Joins `group` on the interface that owns `iface` (unspecified: the
/// kernel picks by route).
pub(crate) fn join_v4(fd: RawFd, group: Ipv4Addr, iface: Ipv4Addr) -> io::Result<()> {
    set_mreqn(fd, libc::IP_ADD_MEMBERSHIP, group, iface)
}

/// Leaves what [`join_v4`] joined.
pub(crate) fn leave_v4(fd: RawFd, group: Ipv4Addr, iface: Ipv4Addr) -> io::Result<()> {
    set_mreqn(fd, libc::IP_DROP_MEMBERSHIP, group, iface)
}

/// Asks the kernel to hand runs of datagrams over as one buffer
/// (`UDP_GRO`); false if it cannot.
pub(crate) fn enable_gro(fd: RawFd) -> bool {
    set_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
}

/// Multicast sends leave through the interface that owns `iface`.
pub(crate) fn set_multicast_if(fd: RawFd, iface: Ipv4Addr) -> io::Result<()> {
    set_mreqn(fd, libc::IP_MULTICAST_IF, Ipv4Addr::UNSPECIFIED, iface)
}

/// Options every datagram socket gets: DF (path MTU discovery "do", so the
/// kernel never fragments and an oversized datagram fails with EMSGSIZE),
/// large buffers (best effort: capped by `net.core.{r,w}mem_max`), and for
/// IPv4 multicast sends looped back to local members with TTL 1.
pub(crate) fn configure(fd: RawFd, v6: bool) -> io::Result<()> {
    if v6 {
        set_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )?;
        set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MULTICAST_LOOP, 1)?;
    } else {
        set_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )?;
        set_int(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_LOOP, 1)?;
        set_int(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_TTL, 1)?;
    }
    let _ = set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
    let _ = set_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20);
    Ok(())
}

/// An IPv4 socket bound to `addr` that shares the port with every other
/// socket bound the same way (`SO_REUSEADDR` + `SO_REUSEPORT`: each gets a
/// copy of every multicast datagram), receives only the groups it joined
/// itself (`IP_MULTICAST_ALL` off) and reports each datagram's destination
/// address (`IP_PKTINFO`). Non-blocking.
pub(crate) fn bind_shared_v4(addr: SocketAddrV4) -> io::Result<UdpSocket> {
    // SAFETY: plain socket(2); the result is checked.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    set_int(fd, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0)?;
    set_int(fd, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
    let _ = set_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: in_addr(*addr.ip()),
        sin_zero: [0; 8],
    };
    // SAFETY: a live sockaddr_in and its size.
    cvt(unsafe {
        libc::bind(
            fd,
            &sin as *const libc::sockaddr_in as *const libc::sockaddr,
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    })?;
    Ok(UdpSocket::from(owned))
}

/// Encodes `dest` for a socket of the given family; `None` if it cannot be
/// reached from it (IPv6 from an IPv4 socket).
pub(crate) fn encode_addr(
    dest: (IpAddr, u16),
    v6_socket: bool,
    out: &mut libc::sockaddr_storage,
) -> Option<libc::socklen_t> {
    let (ip, port) = dest;
    let ip = match (ip, v6_socket) {
        (IpAddr::V6(a), false) => IpAddr::V4(a.to_ipv4_mapped()?),
        (IpAddr::V4(a), true) => IpAddr::V6(a.to_ipv6_mapped()),
        (ip, _) => ip,
    };
    match ip {
        IpAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: in_addr(a),
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for every sockaddr type; the write stays inside `out`.
            unsafe {
                std::ptr::write(
                    out as *mut libc::sockaddr_storage as *mut libc::sockaddr_in,
                    sin,
                )
            };
            Some(size_of::<libc::sockaddr_in>() as libc::socklen_t)
        }
        IpAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: as above.
            unsafe {
                std::ptr::write(
                    out as *mut libc::sockaddr_storage as *mut libc::sockaddr_in6,
                    sin6,
                )
            };
            Some(size_of::<libc::sockaddr_in6>() as libc::socklen_t)
        }
    }
}

/// The address the kernel wrote into `ss`; `None` for a family other
/// than IPv4/IPv6.
pub(crate) fn decode_addr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            let sin =
                // SAFETY: the family says the storage holds a sockaddr_in; storage is aligned and large enough for it.
                unsafe { &*(ss as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            let sin6 =
                // SAFETY: as above, for sockaddr_in6.
                unsafe { &*(ss as *const libc::sockaddr_storage as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// What `recvmmsg` said about one buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxMeta {
    /// The sender.
    pub src: Option<SocketAddr>,
    /// The datagram's destination address (sockets with `IP_PKTINFO`).
    pub dst: Option<IpAddr>,
    /// Longer than [`RX_BUF`]: cut, to be dropped.
    pub truncated: bool,
}

const NO_META: RxMeta = RxMeta {
    src: None,
    dst: None,
    truncated: false,
};

/// One datagram of the last batch: where it lies, and its buffer's meta.
#[derive(Debug, Clone, Copy)]
struct Unit {
    start: u32,
    len: u32,
    meta: u8,
}

/// How many buffers the next `recvmmsg` offers: one while datagrams come
/// one at a time (request/response traffic), the full batch while they
/// come in bursts.
///
/// Each buffer offered costs the kernel a `recvmsg` attempt, and the one
/// past the last queued datagram is a failed attempt: on loopback a
/// 32-buffer `recvmmsg` that finds one datagram costs ~200 ns more than a
/// one-buffer call (measured with a C ping-pong, `recvmmsg` of 16 vs 1
/// vs `recvfrom`: +400 / +150 / 0 ns per message). Latency-bound traffic
/// finds one datagram per call, so it gets one buffer; a call that finds
/// a datagram right after a call that found one means a burst, and the
/// full batch is offered again until [`SINGLE_AFTER`] calls in a row
/// find exactly one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BatchSizer {
    single: bool,
    /// The previous call found something.
    prev_ok: bool,
    /// Full-batch calls in a row that found exactly one buffer.
    ones: u8,
}

/// Full-batch calls in a row that find exactly one datagram after which
/// [`BatchSizer`] offers one buffer.
const SINGLE_AFTER: u8 = 4;

impl BatchSizer {
    /// Buffers to offer now, at most `max`.
    #[inline]
    pub(crate) fn len(&self, max: usize) -> usize {
        if self.single {
            1
        } else {
            max
        }
    }

    /// What the call that offered `offered` buffers got: `n` filled (0:
    /// nothing was queued).
    #[inline]
    pub(crate) fn note(&mut self, offered: usize, n: usize) {
        if self.single {
            if n > 0 && self.prev_ok {
                self.single = false;
                self.ones = 0;
            }
        } else if n == 1 && offered > 1 {
            self.ones += 1;
            if self.ones >= SINGLE_AFTER {
                self.single = true;
            }
        } else if n > 1 {
            self.ones = 0;
        }
        self.prev_ok = n > 0;
    }
}

/// Receive buffers of one socket, allocated once ([`RX_BATCH`] ×
/// [`RX_BUF`] octets, zero pages until used).
pub(crate) struct RxRing {
    bufs: Box<[u8]>,
    meta: [RxMeta; RX_BATCH],
    /// The datagrams of the last batch (GRO buffers split).
    units: Vec<Unit>,
    /// `recvmmsg`'s headers, kept between calls so that a poll finding
    /// nothing does not clear and rebuild kilobytes of them.
    hdr: Box<RxHeaders>,
    /// Headers `0..stale` must be set up before the next call: the
    /// kernel wrote lengths and flags into those the last call filled
    /// (all of them at first, or after a change of `hdr_cmsg`).
    stale: usize,
    /// Whether the headers point at control buffers.
    hdr_cmsg: bool,
    /// Buffers the next call offers.
    sizer: BatchSizer,
    /// Buffers the last call offered.
    offered: usize,
    /// GRO switched off for one-datagram traffic ([`GroSwitch`]).
    gro: GroSwitch,
}

/// One-buffer receives that found one datagram each, not merged, after
/// which [`GroSwitch`] turns GRO off.
const GRO_OFF_AFTER: u8 = 8;

/// GRO of a unicast socket that has it, off while the traffic is one
/// datagram per message. With GRO on, a receive must bring the
/// `UDP_GRO` control message (a merged buffer is split at the segment
/// size it gives), so even a one-buffer poll is a `recvmsg`, whose
/// message header and io-vector the kernel imports on every call: on
/// this machine some 80 ns per poll more than a plain `recvfrom`, and a
/// 64 B UD ping-pong 5-6 % slower. So once the sizer offers one buffer
/// and [`GRO_OFF_AFTER`] receives in a row brought one datagram that
/// nothing was merged with, GRO goes off; the first receive after that
/// which finds the queue empty (with control messages still, for
/// anything merged before the switch) settles it, and from then on a
/// one-buffer poll is a `recvfrom`. GRO goes back on as soon as the
/// sizer offers a full batch again (a burst).
///
/// A datagram merged by a receive path that read the setting just before
/// it changed and queued it just after that settling receive would be
/// read whole by `recvfrom`; its CRC trailer then covers only its last
/// segment, so it fails the datagram CRC and is dropped and counted —
/// lost like any datagram, never delivered wrong.
#[derive(Debug, Default, Clone, Copy)]
struct GroSwitch {
    /// The socket has GRO (turned on at creation, unicast).
    capable: bool,
    /// GRO is on now.
    on: bool,
    /// GRO is off and the queue was found empty since.
    settled: bool,
    /// One-buffer receives in a row of one unmerged datagram.
    plain_run: u8,
}

/// The `recvmmsg` argument arrays of one [`RxRing`]. Their pointers point
/// into the ring's two boxes (`bufs`, and this one), whose heap memory
/// never moves or changes size while the ring lives, so the headers stay
/// valid between calls and when the ring moves between threads.
struct RxHeaders {
    hdrs: [libc::mmsghdr; RX_BATCH],
    addrs: [libc::sockaddr_storage; RX_BATCH],
    iovs: [libc::iovec; RX_BATCH],
    cmsgs: [[u64; CMSG_WORDS]; RX_BATCH],
}

// SAFETY: the raw pointers inside `RxHeaders` point into the ring's own
// heap blocks (`bufs`, this box), which stay where they are when the
// ring moves (to another thread too) and never change while it lives; only `recv_batch`, through `&mut
// RxRing`, hands them to the kernel, and nothing else dereferences them.
// The arrays themselves are plain data owned by the ring.
unsafe impl Send for RxHeaders {}

impl RxRing {
    pub(crate) fn new() -> RxRing {
        RxRing {
            bufs: vec![0u8; RX_BATCH * RX_BUF].into_boxed_slice(),
            meta: [NO_META; RX_BATCH],
            units: Vec::with_capacity(RX_UNITS),
            // SAFETY: all-zero (null pointers, zero lengths) is valid for these C structs.
            hdr: Box::new(unsafe { zeroed() }),
            stale: RX_BATCH,
            hdr_cmsg: false,
            sizer: BatchSizer::default(),
            offered: RX_BATCH,
            gro: GroSwitch::default(),
        }
    }

    /// The socket has GRO on (unicast): from now on it is switched off
    /// while the traffic is one datagram per message ([`GroSwitch`]).
    pub(crate) fn gro_switchable(&mut self) {
        self.gro = GroSwitch {
            capable: true,
            on: true,
            ..GroSwitch::default()
        };
    }

    /// True if the last [`recv_batch`] offered a full batch and filled
    /// it (more may be queued: read on). After a one-buffer call the next
    /// poll reads on, so that a datagram answered at once costs one call.
    pub(crate) fn filled(&self, n: usize) -> bool {
        self.offered > 1 && n >= self.offered
    }

    /// Datagrams in the last batch.
    pub(crate) fn len(&self) -> usize {
        self.units.len()
    }

    /// Datagram `i` of the last batch.
    pub(crate) fn get(&self, i: usize) -> (&[u8], &RxMeta) {
        let u = self.units[i];
        let start = u.start as usize;
        (
            &self.bufs[start..start + u.len as usize],
            &self.meta[usize::from(u.meta)],
        )
    }
}

/// Reads up to [`RX_BATCH`] buffers without blocking (`WouldBlock` if
/// there is nothing) and returns how many; [`RxRing::len`] says how many
/// datagrams they hold (a `UDP_GRO` buffer holds several: it is split at
/// its segment size). `cmsg`: the socket has `IP_PKTINFO` or `UDP_GRO` on
/// (a socket made [`RxRing::gro_switchable`] asks for control messages
/// only while GRO is on or has not settled off).
pub(crate) fn recv_batch(fd: RawFd, ring: &mut RxRing, cmsg: bool) -> io::Result<usize> {
    let mut cmsg = cmsg;
    if ring.gro.capable {
        let g = &mut ring.gro;
        let want = if ring.sizer.len(RX_BATCH) > 1 {
            g.plain_run = 0;
            true
        } else {
            g.on && g.plain_run < GRO_OFF_AFTER
        };
        if want != g.on && set_int(fd, libc::SOL_UDP, libc::UDP_GRO, i32::from(want)).is_ok() {
            g.on = want;
            g.settled = false;
            g.plain_run = 0;
        }
        cmsg = g.on || !g.settled;
    }
    if ring.hdr_cmsg != cmsg {
        ring.hdr_cmsg = cmsg;
        ring.stale = RX_BATCH;
    }
    let RxHeaders {
        hdrs,
        addrs,
        iovs,
        cmsgs,
    } = &mut *ring.hdr;
    // Every pointer below derives from one base pointer per array, taken
    // once the arrays are no longer touched by index.
    let bufs = ring.bufs.as_mut_ptr();
    let (iov_p, addr_p, cmsg_p) = (iovs.as_mut_ptr(), addrs.as_mut_ptr(), cmsgs.as_mut_ptr());
    // Only the headers the last call filled are set up again: an empty
    // busy poll (EAGAIN: the kernel wrote nothing) costs no set-up.
    for (i, h) in hdrs.iter_mut().enumerate().take(ring.stale) {
        // SAFETY: `i < RX_BATCH`, so every offset stays inside its array (`bufs` is RX_BATCH * RX_BUF long).
        unsafe {
            *iov_p.add(i) = libc::iovec {
                iov_base: bufs.add(i * RX_BUF) as *mut libc::c_void,
                iov_len: RX_BUF,
            };
            let h = &mut h.msg_hdr;
            h.msg_name = addr_p.add(i) as *mut libc::c_void;
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = iov_p.add(i);
            h.msg_iovlen = 1;
            if cmsg {
                h.msg_control = cmsg_p.add(i) as *mut libc::c_void;
                h.msg_controllen = (CMSG_WORDS * 8) as _;
            } else {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
            h.msg_flags = 0;
        }
    }
    ring.stale = 0;
    let offer = ring.sizer.len(RX_BATCH);
    ring.offered = offer;
    // The system call directly, not libc's `recvmmsg`: the wrapper is a
    // thread cancellation point and brackets every call (each empty busy
    // poll) with enabling and disabling asynchronous cancellation, which
    // nothing here uses.
    let n = if offer == 1 && !cmsg {
        // One buffer and no control message wanted: `recvfrom`, which the
        // kernel serves without importing a message header (`GroSwitch`).
        let mut alen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: buffer 0 of the ring (RX_BUF octets) and `addrs[0]` with its size in `alen` are live for the call; the kernel writes at most those sizes.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvfrom,
                fd,
                bufs as *mut libc::c_void,
                RX_BUF,
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                addr_p as *mut libc::sockaddr,
                &mut alen as *mut libc::socklen_t,
            )
        };
        if r >= 0 {
            // Where `recvmsg` would have put the length and flags.
            hdrs[0].msg_len = r.min(RX_BUF as i64) as libc::c_uint;
            hdrs[0].msg_hdr.msg_flags = if r as usize > RX_BUF {
                libc::MSG_TRUNC
            } else {
                0
            };
            1
        } else {
            r
        }
    } else if offer == 1 {
        // One buffer (the sizer's latency mode): `recvmsg`, which the
        // kernel serves with less work than a one-entry `recvmmsg` (a C
        // loop of empty polls on loopback: ≈ 267 against ≈ 288 ns); the
        // length it returns goes where `recvmmsg` would have put it.
        // SAFETY: header 0 points at live buffers of the sizes it states (the ring's first, `addrs[0]`, `cmsgs[0]`), all outliving the call; the kernel writes at most those sizes.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmsg,
                fd,
                &mut hdrs[0].msg_hdr as *mut libc::msghdr,
                libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            hdrs[0].msg_len = r as libc::c_uint;
            1
        } else {
            r
        }
    } else {
        // SAFETY: every header points at live buffers of the sizes it states (the ring's, `addrs`, `cmsgs`), all outliving the call; the kernel writes at most those sizes.
        unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                fd,
                hdrs.as_mut_ptr(),
                offer as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::timespec>(),
            )
        }
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if sys::would_block(&e) {
            ring.sizer.note(offer, 0);
            // Empty, looked at with control messages after GRO went off:
            // nothing merged is queued any more.
            if ring.gro.capable && !ring.gro.on {
                ring.gro.settled = true;
            }
        }
        return Err(e);
    }
    let n = (n as usize).min(offer);
    ring.sizer.note(offer, n);
    // The kernel wrote lengths and flags into the headers it filled (and,
    // to be safe, the one after, where it stopped).
    ring.stale = (n + 1).min(RX_BATCH);
    ring.units.clear();
    for (i, mh) in hdrs.iter().enumerate().take(n) {
        let h = &mh.msg_hdr;
        let mut dst = None;
        let mut seg = 0usize;
        if cmsg {
            // SAFETY: `h` is the msghdr the kernel filled, its control buffer (`cmsgs[i]`) is live and msg_controllen says how much of it holds control messages; the CMSG macros stay inside it and the payloads are read unaligned.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(h);
                while !c.is_null() {
                    let (level, kind) = ((*c).cmsg_level, (*c).cmsg_type);
                    if level == libc::IPPROTO_IP && kind == libc::IP_PKTINFO {
                        let info: libc::in_pktinfo =
                            std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in_pktinfo);
                        dst = Some(IpAddr::V4(Ipv4Addr::from(
                            info.ipi_addr.s_addr.to_ne_bytes(),
                        )));
                    } else if level == libc::SOL_UDP && kind == libc::UDP_GRO {
                        let v: libc::c_int =
                            std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        seg = usize::try_from(v).unwrap_or(0);
                    }
                    c = libc::CMSG_NXTHDR(h, c);
                }
            }
        }
        ring.meta[i] = RxMeta {
            src: decode_addr(&addrs[i]),
            dst,
            truncated: h.msg_flags & libc::MSG_TRUNC != 0,
        };
        let len = (mh.msg_len as usize).min(RX_BUF);
        let seg = if seg == 0 { len.max(1) } else { seg };
        let mut off = 0;
        loop {
            let l = seg.min(len - off);
            ring.units.push(Unit {
                start: (i * RX_BUF + off) as u32,
                len: l as u32,
                meta: i as u8,
            });
            off += l;
            if off >= len {
                break;
            }
        }
    }
    if ring.gro.capable {
        let g = &mut ring.gro;
        g.plain_run = if offer == 1 && ring.units.len() == 1 {
            g.plain_run.saturating_add(1)
        } else {
            0
        };
    }
    Ok(n)
}

fn dgram_len(d: &Datagram<'_>) -> usize {
    d.bufs.iter().map(|b| b.len()).sum()
}

/// `sendmmsg` of gathered datagrams, in pieces of [`TX_BATCH`]: `Ok(n ≥ 1)`
/// when the first `n` were accepted, `Err` when the first one was not (the
/// [`softrdma_proto::ud::DatagramSink::send_batch`] contract). A
/// destination the socket's family cannot reach ends the batch there
/// (`EAFNOSUPPORT` if it is the first).
///
/// `gso`: when set, runs of equal-sized datagrams to one destination go
/// as one GSO message each; cleared when the kernel refuses GSO but takes
/// the same datagrams one by one.
pub(crate) fn send_batch(
    fd: RawFd,
    v6: bool,
    gso: Option<&AtomicBool>,
    batch: &[Datagram<'_>],
) -> io::Result<usize> {
    let mut total = 0;
    while total < batch.len() {
        let chunk = &batch[total..batch.len().min(total + TX_BATCH)];
        let use_gso = gso.is_some_and(|g| g.load(Ordering::Relaxed));
        let r = match send_sized(fd, v6, use_gso, chunk) {
            Err(e)
                if use_gso
                    && e.raw_os_error()
                        .is_some_and(|c| c == libc::EIO || c == libc::EINVAL) =>
            {
                let plain = send_sized(fd, v6, false, chunk);
                if plain.is_ok() {
                    if let Some(g) = gso {
                        g.store(false, Ordering::Relaxed);
                    }
                }
                plain
            }
            r => r,
        };
        match r {
            Ok(k) => {
                total += k;
                if k < chunk.len() {
                    return Ok(total);
                }
            }
            Err(e) => return if total == 0 { Err(e) } else { Ok(total) },
        }
    }
    Ok(total)
}

/// [`send_chunk`] with argument arrays sized for `chunk`: one datagram
/// goes by `sendmsg`, a few through small arrays, so that a latency-bound
/// send does not clear the kilobytes a full batch needs.
fn send_sized(fd: RawFd, v6: bool, gso: bool, chunk: &[Datagram<'_>]) -> io::Result<usize> {
    match chunk.len() {
        1 => send_one(fd, v6, chunk[0].dest, chunk[0].bufs).map(|()| 1),
        2..=SMALL_BATCH => send_chunk::<SMALL_BATCH, { SMALL_BATCH * 12 }>(fd, v6, gso, chunk),
        _ => send_chunk::<TX_BATCH, TX_IOVS>(fd, v6, gso, chunk),
    }
}

/// Datagrams a small `sendmmsg` takes.
const SMALL_BATCH: usize = 4;

/// One `sendmmsg` of at most `B` datagrams (and `I` io-vectors); returns
/// how many datagrams were accepted (whole GSO messages only).
fn send_chunk<const B: usize, const I: usize>(
    fd: RawFd,
    v6: bool,
    gso: bool,
    chunk: &[Datagram<'_>],
) -> io::Result<usize> {
    // Only the entries a call uses are written: zeroing the arrays whole
    // (14 KiB at TX_BATCH, for the few messages a staged batch makes) was
    // most of the call's user-space work (callgrind: ~2 600 of ~3 000
    // instructions a call while sending 64 KiB Write-Records).
    let mut hdrs: [MaybeUninit<libc::mmsghdr>; B] = [const { MaybeUninit::uninit() }; B];
    let mut addrs: [MaybeUninit<libc::sockaddr_storage>; B] = [const { MaybeUninit::uninit() }; B];
    let mut iovs: [MaybeUninit<libc::iovec>; I] = [const { MaybeUninit::uninit() }; I];
    let mut cmsgs: [MaybeUninit<[u64; 4]>; B] = [const { MaybeUninit::uninit() }; B];
    // One entry per message; entries `..m` are written.
    let mut plan: [MaybeUninit<MsgPlan>; B] = [const { MaybeUninit::uninit() }; B];
    // A run longer than the device's gso_max_size (64 KiB with the link
    // headers) is segmented in software before it leaves, and the peer's
    // GRO then gets it datagram by datagram (crate::rawudp::GSO_RUN).
    let limit = if v6 {
        crate::rawudp::GSO_RUN - 20
    } else {
        crate::rawudp::GSO_RUN
    };
    let (mut m, mut i, mut niov) = (0, 0, 0);
    while i < chunk.len() && m < B {
        let d = &chunk[i];
        // SAFETY: all-zero is a valid sockaddr_storage.
        let addr = addrs[m].write(unsafe { zeroed() });
        let Some(alen) = encode_addr(d.dest, v6, addr) else {
            break;
        };
        let size = dgram_len(d);
        let mut j = i + 1;
        if gso && size > 0 {
            let mut bytes = size;
            while j < chunk.len() && j - i < GSO_MAX_SEGS && chunk[j].dest == d.dest {
                let l = dgram_len(&chunk[j]);
                if l == 0 || l > size || bytes + l > limit {
                    break;
                }
                bytes += l;
                j += 1;
                if l < size {
                    break;
                }
            }
        }
        let pieces: usize = chunk[i..j].iter().map(|d| d.bufs.len()).sum();
        if niov + pieces > I {
            if m == 0 {
                return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
            }
            break;
        }
        let first = niov;
        for b in chunk[i..j].iter().flat_map(|d| d.bufs.iter()) {
            // A piece that starts where the one before it in this message
            // ends extends it: datagrams framed back to back in one buffer
            // go as one io-vector per GSO run (the kernel cuts a run at
            // the segment size, wherever the io-vectors end).
            if niov > first {
                // SAFETY: entries `..niov` have been written.
                let prev = unsafe { iovs[niov - 1].assume_init_mut() };
                if (prev.iov_base as usize).wrapping_add(prev.iov_len) == b.as_ptr() as usize {
                    prev.iov_len += b.len();
                    continue;
                }
            }
            iovs[niov].write(libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            });
            niov += 1;
        }
        let seg = if j - i > 1 { size as u16 } else { 0 };
        plan[m].write(MsgPlan {
            alen,
            first,
            count: niov - first,
            datagrams: j - i,
            seg,
        });
        m += 1;
        i = j;
    }
    if m == 0 {
        return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
    }
    // Each `m += 1` above follows the write of `plan[m]`.
    // SAFETY: entries `..m` of `plan` have been written.
    let plan = unsafe { std::slice::from_raw_parts(plan.as_ptr().cast::<MsgPlan>(), m) };
    let iov_p = iovs.as_mut_ptr().cast::<libc::iovec>();
    for (k, p) in plan.iter().enumerate() {
        let MsgPlan {
            alen,
            first,
            count,
            seg,
            ..
        } = *p;
        // No name, io-vectors or control until set below.
        // SAFETY: all-zero is a valid mmsghdr.
        let mut h: libc::mmsghdr = unsafe { zeroed() };
        let hdr = &mut h.msg_hdr;
        hdr.msg_name = addrs[k].as_mut_ptr().cast::<libc::c_void>();
        hdr.msg_namelen = alen;
        // SAFETY: `first + count ≤ niov ≤ I`: the pointer stays inside `iovs`, whose entries `..niov` are written and point at the caller's IoSlices, which borrow live memory for the whole call.
        hdr.msg_iov = unsafe { iov_p.add(first) };
        hdr.msg_iovlen = count as _;
        if seg > 0 {
            let c = cmsgs[k].write([0u64; 4]);
            hdr.msg_control = c.as_mut_ptr().cast::<libc::c_void>();
            // SAFETY: the control buffer is the zeroed 32 octets of `cmsgs[k]`, room for one u16 control message (CMSG_SPACE(2) = 24); FIRSTHDR is non-null for a buffer that large, and the value is written unaligned inside it.
            unsafe {
                hdr.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as libc::c_uint) as _;
                let cm = libc::CMSG_FIRSTHDR(hdr);
                (*cm).cmsg_level = libc::SOL_UDP;
                (*cm).cmsg_type = libc::UDP_SEGMENT;
                (*cm).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as libc::c_uint) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cm) as *mut u16, seg);
            }
        }
        hdrs[k].write(h);
    }
    // SAFETY: `hdrs[..m]` are written and point at live addresses, iovecs and control buffers set up above; the kernel reads `m` headers and writes only their `msg_len`.
    let r = unsafe {
        libc::sendmmsg(
            fd,
            hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
            m as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(plan[..r as usize].iter().map(|p| p.datagrams).sum())
}

/// How one message of a [`send_chunk`] call is laid out.
#[derive(Clone, Copy)]
struct MsgPlan {
    /// Length of its destination address.
    alen: libc::socklen_t,
    /// Its first io-vector.
    first: usize,
    /// Its io-vectors.
    count: usize,
    /// Datagrams it carries (a GSO run: more than one).
    datagrams: usize,
    /// GSO segment size (0: none).
    seg: u16,
}

/// `sendto` of one datagram to `addr` (`len` octets of it), as a raw
/// system call (see [`recv_batch`]).
fn sendto(
    fd: RawFd,
    buf: &[u8],
    addr: &libc::sockaddr_storage,
    len: libc::socklen_t,
) -> io::Result<()> {
    // SAFETY: `buf` is live for the call and `addr` a live address of at least `len` octets, both read only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sendto,
            fd,
            buf.as_ptr(),
            buf.len(),
            libc::MSG_DONTWAIT,
            addr as *const libc::sockaddr_storage as *const libc::sockaddr,
            len,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One datagram: `sendto` when it is one piece or small enough to gather
/// into one, else `sendmsg` of its pieces.
pub(crate) fn send_one(
    fd: RawFd,
    v6: bool,
    dest: (IpAddr, u16),
    bufs: &[IoSlice<'_>],
) -> io::Result<()> {
    // SAFETY: all-zero is a valid sockaddr_storage / msghdr.
    let mut addr: libc::sockaddr_storage = unsafe { zeroed() };
    let len =
        encode_addr(dest, v6, &mut addr).ok_or(io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?;
    // One piece, or a small datagram (header, payload, trailer) gathered
    // into one: `sendto`, which spares the kernel the msghdr and
    // io-vector import (a C ping-pong of 96-octet datagrams on loopback,
    // ns per message: `sendto` 3 005-3 095, `sendmsg` of the same one
    // piece 3 100-3 190, of 3 pieces 3 130-3 200).
    if let [one] = bufs {
        return sendto(fd, one, &addr, len);
    }
    let mut flat = [0u8; sys::GATHER_MAX];
    if let Some(one) = sys::gather(bufs, &mut flat) {
        return sendto(fd, one, &addr, len);
    }
    // SAFETY: as above.
    let mut h: libc::msghdr = unsafe { zeroed() };
    h.msg_name = &mut addr as *mut libc::sockaddr_storage as *mut libc::c_void;
    h.msg_namelen = len;
    h.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    h.msg_iovlen = bufs.len() as _;
    // The system call directly (see `recv_batch`: libc's wrapper is a
    // cancellation point, which costs every latency-bound send).
    // SAFETY: `h` points at a live address and at the caller's IoSlices (ABI-compatible with iovec), read only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sendmsg,
            fd,
            &h as *const libc::msghdr,
            libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn batch_sizer_follows_the_traffic() {
        let mut s = BatchSizer::default();
        assert_eq!(s.len(RX_BATCH), RX_BATCH, "starts offering the full batch");
        // Request/response: one datagram per call, nothing in between.
        for k in 0..SINGLE_AFTER {
            assert_eq!(
                s.len(RX_BATCH),
                RX_BATCH,
                "still batching after {k} single finds"
            );
            s.note(RX_BATCH, 1);
            s.note(RX_BATCH, 0);
        }
        assert_eq!(
            s.len(RX_BATCH),
            1,
            "one buffer once datagrams come one at a time"
        );
        // Empty polls and lone datagrams keep it there.
        for _ in 0..10 {
            s.note(1, 0);
            s.note(1, 1);
        }
        assert_eq!(s.len(RX_BATCH), 1);
        // A datagram right after one: a burst, back to the full batch.
        s.note(1, 1);
        assert_eq!(s.len(RX_BATCH), RX_BATCH);
        // A full batch resets the count of single finds.
        s.note(RX_BATCH, 1);
        s.note(RX_BATCH, 5);
        for _ in 0..SINGLE_AFTER - 1 {
            s.note(RX_BATCH, 1);
        }
        assert_eq!(s.len(RX_BATCH), RX_BATCH, "the burst reset the count");
        s.note(RX_BATCH, 1);
        assert_eq!(s.len(RX_BATCH), 1);
    }

    #[test]
    fn one_buffer_calls_still_deliver_bursts() {
        // A ring switched to one buffer gets every datagram of a burst,
        // in order, and returns to full batches.
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let mut ring = RxRing::new();
        let fd = rx.as_raw_fd();
        for k in 0..SINGLE_AFTER {
            tx.send_to(&[k], to).unwrap();
            assert_eq!(recv_batch(fd, &mut ring, false).unwrap(), 1);
            assert!(recv_batch(fd, &mut ring, false).is_err());
        }
        assert_eq!(ring.sizer.len(RX_BATCH), 1);
        for k in 0..100u8 {
            tx.send_to(&[k], to).unwrap();
        }
        let mut got = Vec::new();
        let mut calls = 0;
        while let Ok(n) = recv_batch(fd, &mut ring, false) {
            calls += 1;
            assert!(n >= 1);
            for i in 0..ring.len() {
                got.push(ring.get(i).0[0]);
            }
        }
        assert_eq!(got, (0..100).collect::<Vec<u8>>());
        assert!(
            calls <= 2 + 100 / RX_BATCH + 1,
            "{calls} calls for 100 datagrams"
        );
    }

    #[test]
    fn batch_roundtrip_with_gather() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        configure(tx.as_raw_fd(), false).unwrap();
        let to = rx.local_addr().unwrap();
        let parts: Vec<[IoSlice<'_>; 2]> = (0..40u8)
            .map(|i| {
                [
                    IoSlice::new(b"head-"),
                    IoSlice::new(std::slice::from_ref(&CHARS[i as usize])),
                ]
            })
            .collect();
        let batch: Vec<Datagram<'_>> = parts
            .iter()
            .map(|p| Datagram {
                dest: (to.ip(), to.port()),
                bufs: p,
            })
            .collect();
        assert_eq!(send_batch(tx.as_raw_fd(), false, None, &batch).unwrap(), 40);
        send_one(
            tx.as_raw_fd(),
            false,
            (to.ip(), to.port()),
            &[IoSlice::new(b"one")],
        )
        .unwrap();
        let mut ring = RxRing::new();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < 41 && std::time::Instant::now() < deadline {
            match recv_batch(rx.as_raw_fd(), &mut ring, false) {
                Ok(_) => {
                    for i in 0..ring.len() {
                        let (d, m) = ring.get(i);
                        assert_eq!(m.src, Some(tx.local_addr().unwrap()));
                        got.push(d.to_vec());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got.len(), 41);
        assert_eq!(got[0], b"head-a");
        assert_eq!(got[39], [b"head-".as_slice(), &[CHARS[39]]].concat());
        assert_eq!(got[40], b"one");
        // An IPv6 destination from an IPv4 socket is refused, not sent.
        let v6 = [IoSlice::new(b"x")];
        let bad = [Datagram {
            dest: ("::2".parse().unwrap(), 9),
            bufs: &v6,
        }];
        assert_eq!(
            send_batch(tx.as_raw_fd(), false, None, &bad)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EAFNOSUPPORT)
        );
    }

    const CHARS: [u8; 40] = *b"abcdefghijklmnopqrstuvwxyz0123456789ABCD";

    /// The socket's `UDP_GRO` setting, from the kernel.
    fn gro_of(fd: RawFd) -> libc::c_int {
        let mut v: libc::c_int = -1;
        let mut l = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a live c_int and its size; the kernel writes at most that.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_UDP,
                libc::UDP_GRO,
                &mut v as *mut libc::c_int as *mut libc::c_void,
                &mut l,
            )
        };
        assert_eq!(r, 0, "getsockopt UDP_GRO");
        v
    }

    /// `GroSwitch`: one datagram at a time (a ping-pong: each found, then
    /// an empty poll) turns GRO off and the polls into `recvfrom`; a GSO
    /// run then arrives whole (the kernel splits it), the burst turns GRO
    /// back on, and the next run arrives merged and is split again. Every
    /// datagram intact and in order throughout.
    #[test]
    fn gro_goes_off_for_one_datagram_traffic_and_back_on_for_bursts() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        assert!(enable_gro(rx.as_raw_fd()));
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        configure(tx.as_raw_fd(), false).unwrap();
        let to = rx.local_addr().unwrap();
        let fd = rx.as_raw_fd();
        let mut ring = RxRing::new();
        ring.gro_switchable();
        let flag = AtomicBool::new(true);
        let mut k = 0u8;
        let mut next = |len: usize| -> Vec<u8> {
            k = k.wrapping_add(1);
            (0..len).map(|i| k ^ (i as u8)).collect()
        };
        // Receives until `n` datagrams came (polls that find nothing
        // included), returning them.
        let take = |ring: &mut RxRing, n: usize| -> Vec<Vec<u8>> {
            let mut got = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while got.len() < n {
                assert!(std::time::Instant::now() < deadline, "{} of {n}", got.len());
                match recv_batch(fd, ring, true) {
                    Ok(_) => got.extend((0..ring.len()).map(|i| ring.get(i).0.to_vec())),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
            }
            let e = recv_batch(fd, ring, true).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "nothing more");
            got
        };
        let send = |ds: &[Vec<u8>]| {
            let bufs: Vec<[IoSlice<'_>; 1]> = ds.iter().map(|d| [IoSlice::new(d)]).collect();
            let batch: Vec<Datagram<'_>> = bufs
                .iter()
                .map(|b| Datagram {
                    dest: (to.ip(), to.port()),
                    bufs: b,
                })
                .collect();
            let mut sent = 0;
            while sent < batch.len() {
                sent += send_batch(tx.as_raw_fd(), false, Some(&flag), &batch[sent..]).unwrap();
            }
        };
        assert_eq!(gro_of(fd), 1);
        for _ in 0..24 {
            let d = vec![next(64)];
            send(&d);
            assert_eq!(take(&mut ring, 1), d);
        }
        assert_eq!(gro_of(fd), 0, "off for one-datagram traffic");
        assert!(!ring.gro.on && ring.gro.settled && ring.sizer.single);
        // A burst: a GSO run of 20 (the kernel splits it, GRO being off).
        let run: Vec<Vec<u8>> = (0..20).map(|_| next(1000)).collect();
        send(&run);
        assert_eq!(take(&mut ring, 20), run, "the run, split by the kernel");
        assert_eq!(gro_of(fd), 1, "back on for the burst");
        let run: Vec<Vec<u8>> = (0..20).map(|_| next(900)).collect();
        send(&run);
        assert_eq!(take(&mut ring, 20), run, "the next run, merged and split");
        assert!(flag.load(Ordering::Relaxed), "loopback takes GSO");
    }

    /// Runs of equal-sized datagrams leave as GSO messages and come back,
    /// split, as the same datagrams in order (with or without GRO on the
    /// receiver; read in batches, or one buffer at a time as the batch
    /// sizer's latency mode reads, by `recvmsg`).
    #[test]
    fn gso_runs_and_gro_split() {
        let modes = [(true, false), (false, false), (true, true), (false, true)];
        // `contiguous`: every datagram is a slice of one buffer, back to
        // back (as a staged batch is), so `send_chunk` merges their
        // io-vectors into one per GSO run, and never across two messages.
        for ((gro, single), contiguous) in modes.into_iter().flat_map(|m| [(m, false), (m, true)]) {
            let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
            rx.set_nonblocking(true).unwrap();
            if gro {
                assert!(enable_gro(rx.as_raw_fd()));
            }
            let other = UdpSocket::bind("127.0.0.1:0").unwrap();
            other.set_nonblocking(true).unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            configure(tx.as_raw_fd(), false).unwrap();
            let to = rx.local_addr().unwrap();
            let to2 = other.local_addr().unwrap();
            // Sizes: a run of 5 × 1000 ending in 300, a 1000 to another
            // port, a run of 3 × 700, single 50, then 70 × 100 (more than
            // one GSO message can take).
            let mut want: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
            let mut k = 0u8;
            let mut add = |dst: SocketAddr, len: usize| {
                k = k.wrapping_add(1);
                want.push((dst, (0..len).map(|i| k ^ i as u8).collect()));
            };
            for _ in 0..5 {
                add(to, 1000);
            }
            add(to, 300);
            add(to2, 1000);
            for _ in 0..3 {
                add(to, 700);
            }
            add(to, 50);
            for _ in 0..70 {
                add(to, 100);
            }
            let flat: Vec<u8> = want.iter().flat_map(|(_, d)| d.iter().copied()).collect();
            let mut at = 0;
            // Each datagram in two pieces (header, payload) like the engine's.
            let bufs: Vec<[IoSlice<'_>; 2]> = want
                .iter()
                .map(|(_, d)| {
                    let d = if contiguous {
                        at += d.len();
                        &flat[at - d.len()..at]
                    } else {
                        &d[..]
                    };
                    [
                        IoSlice::new(&d[..10.min(d.len())]),
                        IoSlice::new(&d[10.min(d.len())..]),
                    ]
                })
                .collect();
            let batch: Vec<Datagram<'_>> = want
                .iter()
                .zip(&bufs)
                .map(|((dst, _), b)| Datagram {
                    dest: (dst.ip(), dst.port()),
                    bufs: b,
                })
                .collect();
            let flag = AtomicBool::new(true);
            let mut sent = 0;
            while sent < batch.len() {
                sent += send_batch(tx.as_raw_fd(), false, Some(&flag), &batch[sent..]).unwrap();
            }
            assert!(flag.load(Ordering::Relaxed), "loopback takes GSO");
            let mut ring = RxRing::new();
            let mut got: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while got.len() < want.len() && std::time::Instant::now() < deadline {
                for (s, addr) in [(&rx, to), (&other, to2)] {
                    // Pinned: left alone, two full reads in a row end it.
                    ring.sizer.single = single;
                    match recv_batch(s.as_raw_fd(), &mut ring, gro) {
                        Ok(_) => {
                            for i in 0..ring.len() {
                                got.push((addr, ring.get(i).0.to_vec()));
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            let mut w2: Vec<_> = want.iter().filter(|(a, _)| *a == to2).cloned().collect();
            let mut w1: Vec<_> = want.iter().filter(|(a, _)| *a == to).cloned().collect();
            let g2: Vec<_> = got.iter().filter(|(a, _)| *a == to2).cloned().collect();
            let g1: Vec<_> = got.iter().filter(|(a, _)| *a == to).cloned().collect();
            let what = format!("gro={gro} single={single} contiguous={contiguous}");
            assert_eq!(g1.len(), w1.len(), "{what}");
            assert!(g1 == std::mem::take(&mut w1), "{what}: order and contents");
            assert!(g2 == std::mem::take(&mut w2), "{what}: the other port");
        }
    }
}
