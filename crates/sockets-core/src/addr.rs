//! `struct sockaddr` ⇄ [`SocketAddr`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Reads an `AF_INET`/`AF_INET6` address of `len` octets at `p`; `None`
/// for other families, short lengths or a null pointer.
///
/// # Safety
/// `p` is null or points to `len` readable octets.
pub unsafe fn from_sockaddr(p: *const libc::sockaddr, len: libc::socklen_t) -> Option<SocketAddr> {
    if p.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family field is readable (checked above).
    let family = unsafe { (*p).sa_family } as i32;
    match family {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: long enough for a sockaddr_in; read unaligned.
            let a = unsafe { std::ptr::read_unaligned(p as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: long enough for a sockaddr_in6; read unaligned.
            let a = unsafe { std::ptr::read_unaligned(p as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// As [`from_sockaddr`] for a pointer whose length is implied by its
/// family (`getifaddrs`).
///
/// # Safety
/// `p` is null or points to a complete address of its family.
pub unsafe fn from_sockaddr_ptr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: getifaddrs' addresses are complete for their family.
    let family = unsafe { (*p).sa_family } as i32;
    let len = match family {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    // SAFETY: as above.
    unsafe { from_sockaddr(p, len as libc::socklen_t) }
}

/// `addr` as a `sockaddr_storage` and its length (the engine's own).
pub fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    softrdma_engine::sockaddr_of(*addr)
}

/// Whether `ip` is IPv4 (or IPv4-mapped) loopback or `::1`.
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        IpAddr::V4(v4) => v4.is_loopback(),
    }
}
