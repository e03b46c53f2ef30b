//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` over libc's `getaddrinfo`.
//!
//! The contract of rdma_getaddrinfo(3) as rdma-core implements it:
//!
//! * With `node` or `service`: libc's `getaddrinfo` with the hints
//!   translated (`RAI_PASSIVE` → `AI_PASSIVE`, `RAI_NUMERICHOST` →
//!   `AI_NUMERICHOST`, the family, a socket type from the QP type, a
//!   protocol from the port space). One `rdma_addrinfo`, for the first
//!   IPv4/IPv6 address found: a passive lookup fills `ai_src_addr` (the
//!   wildcard address if `node` is NULL) and sets `RAI_PASSIVE`; an active
//!   one fills `ai_dst_addr`. The QP type and port space are the hints'
//!   or, where the hints leave them 0, follow from the socket type and
//!   protocol found (stream/TCP: RC and `RDMA_PS_TCP`; datagram/UDP: UD
//!   and `RDMA_PS_UDP`).
//! * With neither: the result is built from the hints alone (flags,
//!   family, QP type, port space, and their destination address); this is
//!   how a caller turns addresses it already has into an `rdma_addrinfo`.
//!   Neither and no hints: `EINVAL`.
//! * A result without a source address takes the hints' one, if any.
//!
//! No route or connect data (`ai_route`, `ai_connect` stay NULL):
//! softrdma has no path records. `AF_IB` is refused. Failures return -1
//! with `errno`: `EINVAL`/`ENOMEM`, or, for a failed name lookup, the
//! `EAI_*` code as rdma-core leaves it (`EAI_SYSTEM`: the system's errno).
//! Everything is allocated with `malloc` and released by [`free`].

use std::ffi::{c_char, c_int, CStr};

use crate::abi::{IBV_QPT_RC, IBV_QPT_UD};
use crate::abi_cm::rdma_addrinfo;

/// `RAI_PASSIVE`.
pub const RAI_PASSIVE: c_int = 1;
/// `RAI_NUMERICHOST`.
pub const RAI_NUMERICHOST: c_int = 2;
/// `RAI_NOROUTE`.
pub const RAI_NOROUTE: c_int = 4;
/// `RAI_FAMILY`.
pub const RAI_FAMILY: c_int = 8;
/// `AF_IB`.
pub const AF_IB: c_int = 27;

/// Copies `len` octets of `src` into a new `malloc` block.
///
/// # Safety
/// `src` must point to `len` readable octets.
unsafe fn dup(src: *const u8, len: usize) -> *mut u8 {
    // SAFETY: malloc with a non-zero size.
    let p = unsafe { libc::malloc(len.max(1)) } as *mut u8;
    if !p.is_null() {
        // SAFETY: `p` has `len` octets; `src` per the contract.
        unsafe { std::ptr::copy_nonoverlapping(src, p, len) };
    }
    p
}

/// A `malloc` copy of a sockaddr of `len` octets, with its length.
///
/// # Safety
/// `a` must point to `len` readable octets.
unsafe fn dup_addr(
    a: *const libc::sockaddr,
    len: u32,
) -> Result<(*mut libc::sockaddr, u32), c_int> {
    // SAFETY: contract.
    let p = unsafe { dup(a as *const u8, len as usize) };
    if p.is_null() {
        return Err(libc::ENOMEM);
    }
    Ok((p as *mut libc::sockaddr, len))
}

/// The libc hints for `h` (rdma-core's translation).
fn ai_hints(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: a plain struct; zero is a valid addrinfo (NULL pointers).
    let mut ah: libc::addrinfo = unsafe { std::mem::zeroed() };
    if h.ai_flags & RAI_PASSIVE != 0 {
        ah.ai_flags |= libc::AI_PASSIVE;
    }
    if h.ai_flags & RAI_NUMERICHOST != 0 {
        ah.ai_flags |= libc::AI_NUMERICHOST;
    }
    ah.ai_family = h.ai_family;
    ah.ai_socktype = match h.ai_qp_type {
        IBV_QPT_RC => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ah.ai_protocol = match h.ai_port_space {
        super::RDMA_PS_TCP => libc::IPPROTO_TCP,
        super::RDMA_PS_UDP | super::RDMA_PS_IPOIB => libc::IPPROTO_UDP,
        super::RDMA_PS_IB => match ah.ai_socktype {
            libc::SOCK_STREAM => libc::IPPROTO_TCP,
            libc::SOCK_DGRAM => libc::IPPROTO_UDP,
            _ => 0,
        },
        _ => 0,
    };
    ah
}

/// Fills `r` from a name lookup; 0 or an `EAI_*`/errno failure (as
/// [`getaddrinfo`] returns them through `errno`).
///
/// # Safety
/// `node`/`service` are NULL or C strings.
unsafe fn lookup(
    node: *const c_char,
    service: *const c_char,
    h: &rdma_addrinfo,
    r: &mut rdma_addrinfo,
) -> Result<(), c_int> {
    let ah = ai_hints(h);
    let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: node/service are NULL or C strings (contract); ah and ai live.
    let rc = unsafe { libc::getaddrinfo(node, service, &ah, &mut ai) };
    if rc != 0 {
        if rc == libc::EAI_SYSTEM {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO));
        }
        return Err(rc);
    }
    let mut out = Err(libc::EAI_FAMILY);
    let mut p = ai;
    while !p.is_null() {
        // SAFETY: a node of the list getaddrinfo returned.
        let a = unsafe { &*p };
        p = a.ai_next;
        if a.ai_family != libc::AF_INET && a.ai_family != libc::AF_INET6 {
            continue;
        }
        // SAFETY: a node of the list; its strings and address live until freeaddrinfo.
        out = unsafe { convert(h, a, r) };
        break;
    }
    // SAFETY: ai came from getaddrinfo, freed once.
    unsafe { libc::freeaddrinfo(ai) };
    out
}

/// One libc result into `r` (rdma-core's conversion).
///
/// # Safety
/// `a` is a live getaddrinfo result.
unsafe fn convert(
    h: &rdma_addrinfo,
    a: &libc::addrinfo,
    r: &mut rdma_addrinfo,
) -> Result<(), c_int> {
    r.ai_qp_type = match h.ai_qp_type {
        0 => match a.ai_socktype {
            libc::SOCK_STREAM => IBV_QPT_RC,
            libc::SOCK_DGRAM => IBV_QPT_UD,
            _ => 0,
        },
        t => t,
    };
    r.ai_port_space = match h.ai_port_space {
        0 => match a.ai_protocol {
            libc::IPPROTO_TCP => super::RDMA_PS_TCP,
            libc::IPPROTO_UDP => super::RDMA_PS_UDP,
            _ => 0,
        },
        s => s,
    };
    r.ai_family = a.ai_family;
    let canon = if a.ai_canonname.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: a C string of the getaddrinfo result.
        let c = unsafe { CStr::from_ptr(a.ai_canonname) };
        // SAFETY: copies the string with its NUL.
        unsafe { dup(c.as_ptr() as *const u8, c.to_bytes_with_nul().len()) as *mut c_char }
    };
    // SAFETY: ai_addr has ai_addrlen octets.
    let (addr, len) = unsafe { dup_addr(a.ai_addr, a.ai_addrlen) }?;
    if a.ai_flags & libc::AI_PASSIVE != 0 {
        r.ai_flags = RAI_PASSIVE;
        r.ai_src_canonname = canon;
        r.ai_src_addr = addr;
        r.ai_src_len = len;
    } else {
        r.ai_dst_canonname = canon;
        r.ai_dst_addr = addr;
        r.ai_dst_len = len;
    }
    Ok(())
}

/// `rdma_getaddrinfo`: `Ok(())` with `*res` set, or the `errno` value.
///
/// # Safety
/// `node`/`service` are NULL or C strings, `hints` NULL or valid (its
/// addresses as long as their lengths say), `res` valid.
pub unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> Result<(), c_int> {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: all-zero is a valid rdma_addrinfo (no hints).
    let none: rdma_addrinfo = unsafe { std::mem::zeroed() };
    // SAFETY: hints is NULL or valid (contract).
    let h = unsafe { hints.as_ref() }.unwrap_or(&none);
    if h.ai_family == AF_IB {
        return Err(libc::EAI_FAMILY);
    }
    // SAFETY: all-zero is a valid rdma_addrinfo (pointers NULL).
    let mut r: rdma_addrinfo = unsafe { std::mem::zeroed() };
    let filled = if !node.is_null() || !service.is_null() {
        // SAFETY: contract.
        unsafe { lookup(node, service, h, &mut r) }
    } else {
        r.ai_flags = h.ai_flags;
        r.ai_family = h.ai_family;
        r.ai_qp_type = h.ai_qp_type;
        r.ai_port_space = h.ai_port_space;
        if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the hints' destination has ai_dst_len octets (contract).
            unsafe { dup_addr(h.ai_dst_addr, h.ai_dst_len) }.map(|(a, n)| {
                r.ai_dst_addr = a;
                r.ai_dst_len = n;
            })
        } else {
            Ok(())
        }
    };
    let filled = filled.and_then(|()| {
        if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
            // SAFETY: the hints' source has ai_src_len octets (contract).
            let (a, n) = unsafe { dup_addr(h.ai_src_addr, h.ai_src_len) }?;
            r.ai_src_addr = a;
            r.ai_src_len = n;
        }
        Ok(())
    });
    let node = filled.and_then(|()| {
        let size = std::mem::size_of::<rdma_addrinfo>();
        // SAFETY: malloc of the struct's size; written at once below.
        let p = unsafe { libc::malloc(size) } as *mut rdma_addrinfo;
        if p.is_null() {
            Err(libc::ENOMEM)
        } else {
            Ok(p)
        }
    });
    match node {
        Ok(p) => {
            // SAFETY: `p` is a fresh block of the right size; `res` valid (contract).
            unsafe {
                p.write(r);
                *res = p;
            }
            Ok(())
        }
        Err(e) => {
            // SAFETY: `r`'s pointers are NULL or blocks made above.
            unsafe { free_fields(&mut r) };
            Err(e)
        }
    }
}

/// Frees what one node's pointers own.
///
/// # Safety
/// The pointers are NULL or `malloc` blocks of ours, not yet freed.
unsafe fn free_fields(r: &mut rdma_addrinfo) {
    // SAFETY: contract.
    unsafe {
        libc::free(r.ai_src_addr as *mut libc::c_void);
        libc::free(r.ai_dst_addr as *mut libc::c_void);
        libc::free(r.ai_src_canonname as *mut libc::c_void);
        libc::free(r.ai_dst_canonname as *mut libc::c_void);
        libc::free(r.ai_route);
        libc::free(r.ai_connect);
    }
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` is NULL or a list from [`getaddrinfo`], not yet freed.
pub unsafe fn free(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: a node we allocated; its pointers are ours or NULL.
        unsafe {
            let next = (*res).ai_next;
            free_fields(&mut *res);
            libc::free(res as *mut libc::c_void);
            res = next;
        }
    }
}
