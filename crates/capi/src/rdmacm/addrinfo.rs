//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` over libc's `getaddrinfo`.
//!
//! One `rdma_addrinfo`, for the first IPv4/IPv6 address found. Passive lookups
//! (`RAI_PASSIVE`) fill `ai_src_addr` (the wildcard address if `node` is
//! NULL); active ones fill `ai_dst_addr`, plus `ai_src_addr` when the hints
//! carry one. No route or connect data (`ai_route`, `ai_connect` stay
//! NULL): softrdma has no path records. `AF_IB` is refused
//! (`EAI_FAMILY`). Everything is allocated with `malloc` and released by
//! [`free`].

use std::ffi::{c_char, c_int, CStr};

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

/// `rdma_getaddrinfo`: 0 or an `EAI_*` code (as getaddrinfo).
///
/// # Safety
/// `node`/`service` are NULL or C strings, `hints` NULL or valid, `res`
/// valid.
pub unsafe fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() {
        return libc::EAI_FAIL;
    }
    // SAFETY: hints is NULL or valid (contract).
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let family = h.map_or(0, |h| h.ai_family);
    if family == AF_IB {
        return libc::EAI_FAMILY;
    }
    let ps = match h.map_or(0, |h| h.ai_port_space) {
        0 => super::RDMA_PS_TCP,
        p => p,
    };
    let qp_type = match h.map_or(0, |h| h.ai_qp_type) {
        0 if ps == super::RDMA_PS_TCP || ps == super::RDMA_PS_IB => crate::abi::IBV_QPT_RC,
        0 => crate::abi::IBV_QPT_UD,
        t => t,
    };
    // SAFETY: sockaddr-free plain struct; zero is a valid addrinfo.
    let mut ah: libc::addrinfo = unsafe { std::mem::zeroed() };
    ah.ai_family = family;
    ah.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_NUMERICHOST != 0 {
        ah.ai_flags |= libc::AI_NUMERICHOST;
    }
    if flags & RAI_PASSIVE != 0 {
        ah.ai_flags |= libc::AI_PASSIVE;
    }
    let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
    // SAFETY: node/service are NULL or C strings (contract); ah and ai live.
    let r = unsafe { libc::getaddrinfo(node, service, &ah, &mut ai) };
    if r != 0 {
        return r;
    }
    let mut head: *mut rdma_addrinfo = std::ptr::null_mut();
    let mut p = ai;
    while !p.is_null() {
        // SAFETY: a node of the list getaddrinfo returned.
        let a = unsafe { &*p };
        p = a.ai_next;
        if a.ai_family != libc::AF_INET && a.ai_family != libc::AF_INET6 {
            continue;
        }
        // SAFETY: zero is a valid rdma_addrinfo (pointers NULL).
        let mut r: rdma_addrinfo = unsafe { std::mem::zeroed() };
        r.ai_flags = flags;
        r.ai_family = a.ai_family;
        r.ai_qp_type = qp_type;
        r.ai_port_space = ps;
        // SAFETY: ai_addr has ai_addrlen octets.
        let copy = unsafe { dup(a.ai_addr as *const u8, a.ai_addrlen as usize) };
        if flags & RAI_PASSIVE != 0 {
            r.ai_src_addr = copy as *mut libc::sockaddr;
            r.ai_src_len = a.ai_addrlen;
        } else {
            r.ai_dst_addr = copy as *mut libc::sockaddr;
            r.ai_dst_len = a.ai_addrlen;
            if let Some(h) = h {
                if !h.ai_src_addr.is_null() && h.ai_src_len > 0 {
                    let (src, n) = (h.ai_src_addr as *const u8, h.ai_src_len as usize);
                    // SAFETY: the hints' source has ai_src_len octets.
                    let copy = unsafe { dup(src, n) };
                    r.ai_src_addr = copy as *mut libc::sockaddr;
                    r.ai_src_len = h.ai_src_len;
                }
            }
        }
        if !a.ai_canonname.is_null() {
            // SAFETY: a C string of the getaddrinfo result.
            let c = unsafe { CStr::from_ptr(a.ai_canonname) };
            let n = c.to_bytes_with_nul().len();
            // SAFETY: copies the string with its NUL.
            let copy = unsafe { dup(c.as_ptr() as *const u8, n) };
            r.ai_dst_canonname = copy as *mut c_char;
        }
        let size = std::mem::size_of::<rdma_addrinfo>();
        // SAFETY: malloc of the struct's size; written at once.
        let node = unsafe { libc::malloc(size) } as *mut rdma_addrinfo;
        if node.is_null() {
            break;
        }
        // SAFETY: `node` is a fresh block of the right size.
        unsafe { node.write(r) };
        // The first usable address is what rdma-core returns too.
        head = node;
        break;
    }
    // SAFETY: ai came from getaddrinfo.
    unsafe { libc::freeaddrinfo(ai) };
    if head.is_null() {
        return libc::EAI_NONAME;
    }
    // SAFETY: res is valid (contract).
    unsafe { *res = head };
    0
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
            libc::free((*res).ai_src_addr as *mut libc::c_void);
            libc::free((*res).ai_dst_addr as *mut libc::c_void);
            libc::free((*res).ai_src_canonname as *mut libc::c_void);
            libc::free((*res).ai_dst_canonname as *mut libc::c_void);
            libc::free((*res).ai_route);
            libc::free((*res).ai_connect);
            libc::free(res as *mut libc::c_void);
            res = next;
        }
    }
}
