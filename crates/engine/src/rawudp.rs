//! Raw UDP with the kernel features the datagram QPs use, for the
//! raw-socket baselines of `softrdma perf`: a blast or ping-pong measured
//! against softrdma's UD/RD QPs must be allowed the same batching, or the
//! ratio says more about system calls than about softrdma.
//!
//! * Sending: [`RawUdp::send_segments`] hands the kernel a run of
//!   equal-sized datagrams in one `sendmsg` with `UDP_SEGMENT` (UDP GSO),
//!   as [`crate::dgram`] does for a multi-datagram message.
//! * Receiving: [`RawUdp::recv_batch`] is one `recvmmsg` of up to
//!   [`RX_SLOTS`] buffers with `UDP_GRO` on, each buffer split back into
//!   its datagrams at the segment size the kernel reports.
//!
//! Both fall back to plain datagrams when the kernel refuses GSO/GRO (the
//! fallback is sticky and visible through [`RawUdp::gso`] / [`RawUdp::gro`]).
//! A socket made without GRO ([`RawUdp::with_gro`]), for traffic of one
//! datagram per message, receives with `recvfrom` while the sizer offers
//! one buffer: what a plain UDP ping-pong does (a one-buffer `recvmmsg`
//! costs the kernel the import of a message header and io-vector on every
//! poll, some 80 ns on this machine, which a raw baseline has no reason to
//! pay).
//! The socket gets the engine's buffer sizes ([`crate::tune_udp_socket`]).
//! Nothing here knows any softrdma header: the callers put their own
//! sequence numbers in the datagrams.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use crate::udp;

/// Receive buffers one [`RawUdp::recv_batch`] fills at most.
pub const RX_SLOTS: usize = 16;
/// Octets of each receive buffer (one GRO super-datagram at most).
const RX_SLOT: usize = 65536;
/// Largest UDP payload of one IPv4 `sendmsg` (GSO or not).
pub const MAX_SEND: usize = 65507;
/// Datagrams one GSO send carries at most (the kernel's `UDP_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: usize = 64;
/// UDP payload octets of the largest GSO run (IPv4) a device with the
/// default `gso_max_size` of 65 536 takes whole: 65 536 less the Ethernet
/// (14), IPv4 (20) and UDP (8) headers. A longer run is segmented in
/// software on the way out, so the receiver's GRO gets datagrams one by
/// one (measured on loopback: 46 × 1 424 octets ran at 7 Gbit/s, 46 ×
/// 1 420 at 50).
pub const GSO_RUN: usize = 65_536 - 14 - 20 - 8;

/// A UDP socket sending with GSO and receiving with GRO + `recvmmsg`.
#[derive(Debug)]
pub struct RawUdp {
    sock: UdpSocket,
    /// An IPv6 socket (IPv4 destinations go IPv4-mapped).
    v6: bool,
    gso: bool,
    gro: bool,
    bufs: Vec<u8>,
    /// Buffers each `recvmmsg` offers (as the datagram QPs size theirs).
    sizer: udp::BatchSizer,
}

impl RawUdp {
    /// Wraps `sock` (bound; blocking or not as the caller set it), giving
    /// it the engine's buffer sizes and turning on GRO where the kernel
    /// has it.
    pub fn new(sock: UdpSocket) -> io::Result<Self> {
        Self::with_gro(sock, true)
    }

    /// As [`RawUdp::new`], turning GRO on only if `gro`. Without GRO a
    /// datagram is never merged with others on the way in, so a receive
    /// of one buffer is a plain `recvfrom` (the GSO runs of a
    /// multi-datagram message are then split by the kernel on arrival).
    pub fn with_gro(sock: UdpSocket, gro: bool) -> io::Result<Self> {
        crate::tune_udp_socket(&sock)?;
        let gro = gro && udp::enable_gro(sock.as_raw_fd());
        Ok(RawUdp {
            v6: sock.local_addr()?.is_ipv6(),
            sock,
            gso: true,
            gro,
            bufs: vec![0; RX_SLOTS * RX_SLOT],
            sizer: udp::BatchSizer::default(),
        })
    }

    /// The socket.
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Whether sends still use GSO.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Whether receives use GRO.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Sends `buf` to `to` as datagrams of `seg` octets (the last may be
    /// shorter): one `sendmsg` with `UDP_SEGMENT` when `buf` holds more
    /// than one datagram and GSO works, else one `send_to` per datagram.
    /// `buf` must fit [`MAX_SEND`] and hold at most [`MAX_SEGMENTS`]
    /// datagrams (`EINVAL` otherwise). Errors are the kernel's
    /// (`WouldBlock` on a full non-blocking socket: nothing was sent when
    /// GSO is in use; with the fallback, the datagrams before it were).
    pub fn send_segments(&mut self, to: SocketAddr, buf: &[u8], seg: usize) -> io::Result<()> {
        let seg = seg.max(1);
        if buf.len() > MAX_SEND || buf.len().div_ceil(seg) > MAX_SEGMENTS {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if buf.len() <= seg || !self.gso {
            return self.send_plain(to, buf, seg);
        }
        match self.send_gso(to, buf, seg as u16) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EIO) | Some(libc::EINVAL)) => {
                self.gso = false;
                self.send_plain(to, buf, seg)
            }
            r => r,
        }
    }

    fn send_plain(&self, to: SocketAddr, buf: &[u8], seg: usize) -> io::Result<()> {
        for d in buf.chunks(seg) {
            self.sock.send_to(d, to)?;
        }
        if buf.is_empty() {
            self.sock.send_to(buf, to)?;
        }
        Ok(())
    }

    fn send_gso(&self, to: SocketAddr, buf: &[u8], seg: u16) -> io::Result<()> {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut addr: libc::sockaddr_storage = unsafe { zeroed() };
        let alen = udp::encode_addr((to.ip(), to.port()), self.v6, &mut addr)
            .ok_or(io::Error::from_raw_os_error(libc::EAFNOSUPPORT))?;
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut cmsg = [0u64; 4];
        // SAFETY: all-zero is a valid msghdr.
        let mut h: libc::msghdr = unsafe { zeroed() };
        h.msg_name = &mut addr as *mut _ as *mut libc::c_void;
        h.msg_namelen = alen;
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        h.msg_control = cmsg.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE only computes a size.
        h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as libc::c_uint) } as _;
        // SAFETY: the control buffer (32 octets, 8-aligned) holds one u16 control message (CMSG_SPACE(2) = 24 octets); CMSG_FIRSTHDR of a buffer that large is non-null and the writes stay inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&h);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as libc::c_uint) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
        }
        // SAFETY: `h` points at the live address, iovec (over `buf`) and control buffer above, all outliving the call.
        let r = unsafe { libc::sendmsg(self.sock.as_raw_fd(), &h, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// One `recvmmsg` (blocking or not as the socket is; a blocking one
    /// returns once something arrived, `MSG_WAITFORONE`) offering one
    /// buffer or all [`RX_SLOTS`], sized as the datagram QPs size theirs
    /// (one while datagrams come one at a time): calls `f` with
    /// every datagram received, in order, with its source; returns how
    /// many datagrams that was. Errors are the kernel's (`WouldBlock` when
    /// nothing is queued on a non-blocking socket).
    pub fn recv_batch(&mut self, mut f: impl FnMut(&[u8], SocketAddr)) -> io::Result<usize> {
        if !self.gro && self.sizer.len(RX_SLOTS) == 1 {
            // Nothing merged can be queued: one datagram, plainly.
            return match self.sock.recv_from(&mut self.bufs[..RX_SLOT]) {
                Ok((len, from)) => {
                    self.sizer.note(1, 1);
                    f(&self.bufs[..len.min(RX_SLOT)], from);
                    Ok(1)
                }
                Err(e) => {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        self.sizer.note(1, 0);
                    }
                    Err(e)
                }
            };
        }
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut hdrs: [libc::mmsghdr; RX_SLOTS] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut addrs: [libc::sockaddr_storage; RX_SLOTS] = unsafe { zeroed() };
        let mut iovs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; RX_SLOTS];
        let mut cmsgs = [[0u64; 4]; RX_SLOTS];
        let base = self.bufs.as_mut_ptr();
        let (iov_p, addr_p, cmsg_p) = (iovs.as_mut_ptr(), addrs.as_mut_ptr(), cmsgs.as_mut_ptr());
        for (i, m) in hdrs.iter_mut().enumerate() {
            // SAFETY: `i < RX_SLOTS`: every offset stays inside its array, and `bufs` is RX_SLOTS * RX_SLOT octets long.
            unsafe {
                *iov_p.add(i) = libc::iovec {
                    iov_base: base.add(i * RX_SLOT) as *mut libc::c_void,
                    iov_len: RX_SLOT,
                };
                let h = &mut m.msg_hdr;
                h.msg_name = addr_p.add(i) as *mut libc::c_void;
                h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                h.msg_iov = iov_p.add(i);
                h.msg_iovlen = 1;
                h.msg_control = cmsg_p.add(i) as *mut libc::c_void;
                h.msg_controllen = size_of::<[u64; 4]>() as _;
            }
        }
        let offer = self.sizer.len(RX_SLOTS);
        // The system call directly, as the datagram QPs make it (libc's
        // wrapper is a cancellation point, which costs every call).
        // SAFETY: every header points at live buffers of the sizes it states, all outliving the call; the kernel writes at most those sizes.
        let n = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                self.sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                offer as libc::c_uint,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                self.sizer.note(offer, 0);
            }
            return Err(e);
        }
        let n = (n as usize).min(offer);
        self.sizer.note(offer, n);
        let mut count = 0;
        for (i, m) in hdrs.iter().enumerate().take(n) {
            let mut seg = 0usize;
            // SAFETY: the msghdr the kernel filled; its control buffer (`cmsgs[i]`) is live and msg_controllen says how much of it holds control messages; the CMSG macros stay inside it and the payload is read unaligned.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                        let v: libc::c_int =
                            std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        seg = usize::try_from(v).unwrap_or(0);
                    }
                    c = libc::CMSG_NXTHDR(&m.msg_hdr, c);
                }
            }
            let from = udp::decode_addr(&addrs[i])
                .unwrap_or(SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0)));
            let len = (m.msg_len as usize).min(RX_SLOT);
            let data = &self.bufs[i * RX_SLOT..i * RX_SLOT + len];
            let seg = if seg == 0 { len.max(1) } else { seg };
            if len == 0 {
                f(data, from);
                count += 1;
            }
            for d in data.chunks(seg) {
                f(d, from);
                count += 1;
            }
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::{Duration, Instant};

    fn pair() -> (RawUdp, RawUdp) {
        let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (RawUdp::new(a).unwrap(), RawUdp::new(b).unwrap())
    }

    /// A GSO run arrives as the same datagrams, in order, whatever GRO
    /// merged; a bad size is refused before anything is sent.
    #[test]
    fn segments_arrive_as_sent() {
        let (mut a, mut b) = pair();
        let to = b.socket().local_addr().unwrap();
        let seg = 1000;
        let msg: Vec<u8> = (0..10_500u32).map(|i| (i % 251) as u8).collect();
        a.send_segments(to, &msg, seg).unwrap();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let until = Instant::now() + Duration::from_secs(5);
        while got.len() < 11 && Instant::now() < until {
            b.recv_batch(|d, from| {
                assert_eq!(from, a.socket().local_addr().unwrap());
                got.push(d.to_vec());
            })
            .unwrap();
        }
        assert_eq!(
            got.len(),
            11,
            "datagrams: {:?}",
            got.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert!(got[..10].iter().all(|d| d.len() == seg));
        assert_eq!(got[10].len(), 500);
        assert_eq!(got.concat(), msg);
        let too_many = vec![0u8; 65 * 10];
        let e = a.send_segments(to, &too_many, 10).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    /// Without GRO: datagrams sent one at a time arrive whole and from
    /// their source, through `recvmmsg` at first and through `recvfrom`
    /// once the sizer offers one buffer; a GSO run sent to it arrives as
    /// its datagrams (split by the kernel), in order.
    #[test]
    fn without_gro_one_datagram_per_receive() {
        let a = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let b = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        b.set_nonblocking(true).unwrap();
        let (mut a, mut b) = (RawUdp::new(a).unwrap(), RawUdp::with_gro(b, false).unwrap());
        assert!(!b.gro());
        let (to, src) = (
            b.socket().local_addr().unwrap(),
            a.socket().local_addr().unwrap(),
        );
        // A ping-pong's receiver: a datagram, then polls that find none.
        let mut via_recvfrom = 0;
        for k in 0..12u8 {
            let d = vec![k; 40 + usize::from(k)];
            a.send_segments(to, &d, 1472).unwrap();
            via_recvfrom += usize::from(b.sizer.len(RX_SLOTS) == 1);
            let mut got = Vec::new();
            let until = Instant::now() + Duration::from_secs(5);
            let n = loop {
                match b.recv_batch(|x, from| got.push((x.to_vec(), from))) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        assert!(Instant::now() < until, "datagram {k} never came")
                    }
                    Err(e) => panic!("{e}"),
                }
            };
            assert_eq!((n, got), (1, vec![(d, src)]), "datagram {k}");
            let e = b.recv_batch(|_, _| panic!("nothing more")).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        }
        assert!(
            via_recvfrom >= 6,
            "the recvfrom path took {via_recvfrom} of 12"
        );
        let msg: Vec<u8> = (0..5_500u32).map(|i| (i % 241) as u8).collect();
        a.send_segments(to, &msg, 1000).unwrap();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let until = Instant::now() + Duration::from_secs(5);
        while got.len() < 6 && Instant::now() < until {
            b.recv_batch(|d, _| got.push(d.to_vec())).unwrap();
        }
        assert_eq!(
            got.iter().map(Vec::len).collect::<Vec<_>>(),
            [1000, 1000, 1000, 1000, 1000, 500]
        );
        assert_eq!(got.concat(), msg);
    }
}
