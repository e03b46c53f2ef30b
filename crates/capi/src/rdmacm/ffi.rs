//! The C entry points of librdmacm, exported as `softrdma_rdma_*` in the
//! private version node; librdmacm.so.1 forwards `rdma_*` to them. Each
//! runs in the panic boundary; failures return -1 with `errno` (or NULL),
//! as librdmacm does. Calls softrdma does not provide (`rdma_notify`,
//! SRQs through rdma_cm, ECE) fail with `ENOSYS`/`EOPNOTSUPP`.

use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;

use crate::abi::*;
use crate::abi_cm::*;
use crate::export::{export, guard, guard_neg, guard_ptr};
use crate::rsocket::sockaddr_read;

use super::{addrinfo, id_from_raw, ChanObj};

fn ok(r: super::Res<()>) -> Result<i32, i32> {
    r.map(|()| 0)
}

/// A sockaddr of the family it names (NULL: None).
///
/// # Safety
/// `a` is NULL or a valid sockaddr of its family.
unsafe fn addr_opt(a: *const libc::sockaddr) -> Result<Option<SocketAddr>, i32> {
    if a.is_null() {
        return Ok(None);
    }
    // SAFETY: contract: the family field is readable.
    let len = match i32::from(unsafe { (*a).sa_family }) {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return Err(libc::EAFNOSUPPORT),
    };
    // SAFETY: a sockaddr of that family (contract).
    unsafe { sockaddr_read(a, len as u32) }.map(Some)
}

/// `rdma_create_event_channel`.
pub extern "C" fn softrdma_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard_ptr(|| super::create_channel().map(|c| c as *mut rdma_event_channel))
}

/// `rdma_destroy_event_channel`.
///
/// # Safety
/// `ch` is a live channel with no ids left.
pub unsafe extern "C" fn softrdma_rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    guard((), || {
        if !ch.is_null() {
            // SAFETY: allocated by create_channel; handed back once.
            drop(unsafe { Box::from_raw(ch as *mut ChanObj) });
        }
    })
}

/// `rdma_create_id`.
///
/// # Safety
/// `ch` NULL or a live channel; `id` valid.
pub unsafe extern "C" fn softrdma_rdma_create_id(
    ch: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard_neg(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: contract.
        let obj = unsafe { super::create_id(ch as *mut ChanObj, context, ps) }?;
        // SAFETY: `id` valid (contract).
        unsafe { *id = obj as *mut rdma_cm_id };
        Ok(0)
    })
}

/// `rdma_destroy_id`.
///
/// # Safety
/// `id` a live id.
pub unsafe extern "C" fn softrdma_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: contract.
    guard_neg(|| ok(unsafe { super::destroy_id(id) }))
}

/// `rdma_bind_addr`.
///
/// # Safety
/// `id` live, `addr` a valid sockaddr.
pub unsafe extern "C" fn softrdma_rdma_bind_addr(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let a = unsafe { addr_opt(addr) }?.ok_or(libc::EINVAL)?;
        ok(super::bind_addr(obj, a))
    })
}

/// `rdma_resolve_addr`.
///
/// # Safety
/// `id` live; addresses NULL or valid.
pub unsafe extern "C" fn softrdma_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let s = unsafe { addr_opt(src) }?;
        // SAFETY: contract.
        let d = unsafe { addr_opt(dst) }?.ok_or(libc::EINVAL)?;
        ok(super::resolve_addr(obj, s, d))
    })
}

/// `rdma_resolve_route`.
///
/// # Safety
/// `id` live.
pub unsafe extern "C" fn softrdma_rdma_resolve_route(
    id: *mut rdma_cm_id,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: contract.
    guard_neg(|| ok(super::resolve_route(unsafe { id_from_raw(id) }?)))
}

/// `rdma_create_qp`.
///
/// # Safety
/// `id` live; `pd` NULL or live; `attr` valid.
pub unsafe extern "C" fn softrdma_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        // SAFETY: contract.
        ok(unsafe { super::create_qp(obj, pd, a) })
    })
}

/// `rdma_create_qp_ex` (the basic attributes; the PD from the attributes).
///
/// # Safety
/// `id` live; `attr` valid.
pub unsafe extern "C" fn softrdma_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let x = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        let mut a = ibv_qp_init_attr {
            qp_context: x.qp_context,
            send_cq: x.send_cq,
            recv_cq: x.recv_cq,
            srq: x.srq,
            cap: x.cap,
            qp_type: x.qp_type,
            sq_sig_all: x.sq_sig_all,
        };
        let pd = if x.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            x.pd
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: contract.
        unsafe { super::create_qp(obj, pd, &mut a) }?;
        x.cap = a.cap;
        Ok(0)
    })
}

/// `rdma_destroy_qp`.
///
/// # Safety
/// `id` live.
pub unsafe extern "C" fn softrdma_rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: contract.
        if let Ok(obj) = unsafe { id_from_raw(id) } {
            // SAFETY: the id's objects are live (contract).
            unsafe { super::destroy_qp(obj) };
        }
    })
}

/// # Safety
/// `p` NULL or valid.
unsafe fn param<'a>(p: *const rdma_conn_param) -> Option<&'a rdma_conn_param> {
    // SAFETY: contract.
    unsafe { p.as_ref() }
}

/// `rdma_connect`.
///
/// # Safety
/// `id` live; `p` NULL or valid.
pub unsafe extern "C" fn softrdma_rdma_connect(
    id: *mut rdma_cm_id,
    p: *mut rdma_conn_param,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let p = unsafe { param(p) };
        ok(super::connect(obj, p))
    })
}

/// `rdma_listen`.
///
/// # Safety
/// `id` live.
pub unsafe extern "C" fn softrdma_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    // SAFETY: contract.
    guard_neg(|| ok(super::listen(unsafe { id_from_raw(id) }?, backlog)))
}

/// `rdma_accept`.
///
/// # Safety
/// `id` live; `p` NULL or valid.
pub unsafe extern "C" fn softrdma_rdma_accept(
    id: *mut rdma_cm_id,
    p: *mut rdma_conn_param,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let p = unsafe { param(p) };
        ok(super::accept(obj, p))
    })
}

/// `rdma_reject`.
///
/// # Safety
/// `id` live; `pd` points to `len` octets.
pub unsafe extern "C" fn softrdma_rdma_reject(
    id: *mut rdma_cm_id,
    pd: *const c_void,
    len: u8,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        let data = if pd.is_null() || len == 0 {
            &[][..]
        } else {
            // SAFETY: contract.
            unsafe { std::slice::from_raw_parts(pd as *const u8, usize::from(len)) }
        };
        ok(super::reject(obj, data))
    })
}

/// `rdma_disconnect`.
///
/// # Safety
/// `id` live.
pub unsafe extern "C" fn softrdma_rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: contract.
    guard_neg(|| ok(super::disconnect(unsafe { id_from_raw(id) }?)))
}

/// `rdma_establish`: with the QP moved by the application
/// (`rdma_init_qp_attr` + `ibv_modify_qp`), the connection is already up
/// once `ESTABLISHED` arrived; nothing to do.
///
/// # Safety
/// `id` live.
pub unsafe extern "C" fn softrdma_rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        unsafe { id_from_raw(id) }?;
        Ok(0)
    })
}

/// `rdma_init_qp_attr`.
///
/// # Safety
/// `id` live; `attr`, `mask` valid.
pub unsafe extern "C" fn softrdma_rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        if mask.is_null() {
            return Err(libc::EINVAL);
        }
        let m = super::init_qp_attr(obj, a)?;
        // SAFETY: contract.
        unsafe { *mask = m };
        Ok(0)
    })
}

/// `rdma_get_cm_event`.
///
/// # Safety
/// `ch` live; `event` valid.
pub unsafe extern "C" fn softrdma_rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard_neg(|| {
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: contract.
        let e = unsafe { super::get_event(ch as *mut ChanObj) }?;
        // SAFETY: contract.
        unsafe { *event = e };
        Ok(0)
    })
}

/// `rdma_ack_cm_event`.
///
/// # Safety
/// `e` an event from `rdma_get_cm_event`, acked once.
pub unsafe extern "C" fn softrdma_rdma_ack_cm_event(e: *mut rdma_cm_event) -> c_int {
    guard_neg(|| {
        if e.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: contract.
        unsafe { super::free_event(e) };
        Ok(0)
    })
}

static EVENT_NAMES: [&[u8]; 16] = [
    b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
    b"RDMA_CM_EVENT_ADDR_ERROR\0",
    b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
    b"RDMA_CM_EVENT_ROUTE_ERROR\0",
    b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
    b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
    b"RDMA_CM_EVENT_CONNECT_ERROR\0",
    b"RDMA_CM_EVENT_UNREACHABLE\0",
    b"RDMA_CM_EVENT_REJECTED\0",
    b"RDMA_CM_EVENT_ESTABLISHED\0",
    b"RDMA_CM_EVENT_DISCONNECTED\0",
    b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
    b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
    b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
    b"RDMA_CM_EVENT_ADDR_CHANGE\0",
    b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
];

/// `rdma_event_str`.
pub extern "C" fn softrdma_rdma_event_str(event: c_int) -> *const c_char {
    const UNKNOWN: &[u8] = b"UNKNOWN EVENT\0";
    guard(UNKNOWN.as_ptr() as *const c_char, || {
        let s: &[u8] = usize::try_from(event)
            .ok()
            .and_then(|i| EVENT_NAMES.get(i).copied())
            .unwrap_or(UNKNOWN);
        s.as_ptr() as *const c_char
    })
}

/// `rdma_getaddrinfo`: 0, or -1 with `errno` ([`addrinfo`]).
///
/// # Safety
/// As rdma_getaddrinfo(3).
pub unsafe extern "C" fn softrdma_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    // SAFETY: contract.
    guard_neg(|| ok(unsafe { addrinfo::getaddrinfo(node, service, hints, res) }))
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` NULL or from `rdma_getaddrinfo`.
pub unsafe extern "C" fn softrdma_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    // SAFETY: contract.
    guard((), || unsafe { addrinfo::free(res) })
}

/// `rdma_create_ep`.
///
/// # Safety
/// `id` valid; `res` a valid rdma_addrinfo; `pd` NULL or live; `attr`
/// NULL or valid.
pub unsafe extern "C" fn softrdma_rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_neg(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: contract.
        let r = unsafe { res.as_ref() }.ok_or(libc::EINVAL)?;
        let ps = if r.ai_port_space == 0 {
            super::RDMA_PS_TCP
        } else {
            r.ai_port_space
        };
        // SAFETY: NULL channel: a synchronous id.
        let obj = unsafe { super::create_id(std::ptr::null_mut(), std::ptr::null_mut(), ps) }?;
        // SAFETY: just created.
        let o = unsafe { &mut *obj };
        let fail = |e: i32| {
            // SAFETY: ours, not yet handed out.
            let _ = unsafe { super::destroy_id(obj as *mut rdma_cm_id) };
            Err(e)
        };
        if r.ai_flags & addrinfo::RAI_PASSIVE != 0 {
            // SAFETY: the addrinfo's addresses are valid (contract).
            let src = match unsafe { addr_opt(r.ai_src_addr) } {
                Ok(Some(a)) => a,
                Ok(None) => return fail(libc::EINVAL),
                Err(e) => return fail(e),
            };
            if let Err(e) = super::bind_addr(o, src) {
                return fail(e);
            }
            // SAFETY: contract.
            if let Some(a) = unsafe { attr.as_ref() } {
                super::lock(&o.st).qp_init = Some(super::copy_init(a));
                o.id.pd = pd;
            }
        } else {
            // SAFETY: the addrinfo's addresses are valid (contract).
            let (src, dst) = match unsafe { (addr_opt(r.ai_src_addr), addr_opt(r.ai_dst_addr)) } {
                (Ok(s), Ok(Some(d))) => (s, d),
                (Err(e), _) | (_, Err(e)) => return fail(e),
                _ => return fail(libc::EINVAL),
            };
            if let Err(e) = super::resolve_addr(o, src, dst) {
                return fail(e);
            }
            if let Err(e) = super::resolve_route(o) {
                return fail(e);
            }
            // SAFETY: contract.
            if let Some(a) = unsafe { attr.as_mut() } {
                // SAFETY: contract.
                if let Err(e) = unsafe { super::create_qp(o, pd, a) } {
                    return fail(e);
                }
            }
        }
        // SAFETY: contract.
        unsafe { *id = obj as *mut rdma_cm_id };
        Ok(0)
    })
}

/// `rdma_destroy_ep`.
///
/// # Safety
/// `id` a live id.
pub unsafe extern "C" fn softrdma_rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        // SAFETY: contract.
        if let Ok(obj) = unsafe { id_from_raw(id) } {
            // SAFETY: the id's objects are live (contract).
            unsafe { super::destroy_qp(obj) };
            // SAFETY: contract.
            let _ = unsafe { super::destroy_id(id) };
        }
    })
}

/// `rdma_get_request`.
///
/// # Safety
/// `listen` a live synchronous listening id; `id` valid.
pub unsafe extern "C" fn softrdma_rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    guard_neg(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: contract.
        let c = super::get_request(unsafe { id_from_raw(listen) }?)?;
        // SAFETY: contract.
        unsafe { *id = c };
        Ok(0)
    })
}

/// `rdma_join_multicast`.
///
/// # Safety
/// `id` live; `addr` valid.
pub unsafe extern "C" fn softrdma_rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let a = unsafe { addr_opt(addr) }?.ok_or(libc::EINVAL)?;
        ok(super::join_multicast(obj, a, false, context as usize))
    })
}

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`.
const JOIN_ADDRESS: u32 = 1;
/// `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
const JOIN_FLAGS: u32 = 2;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
const SENDONLY: u32 = 1;

/// `rdma_join_multicast_ex`.
///
/// # Safety
/// `id` live; `attr` valid.
pub unsafe extern "C" fn softrdma_rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let x = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        if x.comp_mask & JOIN_ADDRESS == 0 || x.comp_mask & !(JOIN_ADDRESS | JOIN_FLAGS) != 0 {
            return Err(libc::EINVAL);
        }
        let send_only = x.comp_mask & JOIN_FLAGS != 0 && x.join_flags == SENDONLY;
        if x.comp_mask & JOIN_FLAGS != 0 && x.join_flags > SENDONLY {
            return Err(libc::EINVAL);
        }
        // SAFETY: contract.
        let a = unsafe { addr_opt(x.addr) }?.ok_or(libc::EINVAL)?;
        ok(super::join_multicast(obj, a, send_only, context as usize))
    })
}

/// `rdma_leave_multicast`.
///
/// # Safety
/// `id` live; `addr` valid.
pub unsafe extern "C" fn softrdma_rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        let a = unsafe { addr_opt(addr) }?.ok_or(libc::EINVAL)?;
        ok(super::leave_multicast(obj, a))
    })
}

/// `RDMA_OPTION_ID`.
const OPTION_ID: c_int = 0;
/// `RDMA_OPTION_IB`.
const OPTION_IB: c_int = 1;

/// `rdma_set_option`: the `RDMA_OPTION_ID` options (TOS, REUSEADDR,
/// AFONLY, ACK_TIMEOUT) are accepted and recorded (TCP/UDP sockets of
/// softrdma use their defaults); `RDMA_OPTION_IB_PATH` is `ENOSYS` (no
/// path records).
///
/// # Safety
/// `id` live; `val` points to `len` octets.
pub unsafe extern "C" fn softrdma_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: usize,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        if val.is_null() || len == 0 {
            return Err(libc::EINVAL);
        }
        match (level, name) {
            (OPTION_ID, 0) => {
                // SAFETY: at least one octet (checked, contract).
                super::lock(&obj.st).tos = Some(unsafe { *(val as *const u8) });
                Ok(0)
            }
            (OPTION_ID, 1..=3) => Ok(0),
            (OPTION_IB, _) => Err(libc::ENOSYS),
            _ => Err(libc::EINVAL),
        }
    })
}

/// `rdma_migrate_id`.
///
/// # Safety
/// `id` live; `ch` NULL or live.
pub unsafe extern "C" fn softrdma_rdma_migrate_id(
    id: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    guard_neg(|| {
        // SAFETY: contract.
        let obj = unsafe { id_from_raw(id) }?;
        // SAFETY: contract.
        ok(unsafe { super::migrate(obj, ch as *mut ChanObj) })
    })
}

/// `rdma_notify`: not needed on iWARP (no communication-established
/// event to signal); `ENOSYS`.
pub extern "C" fn softrdma_rdma_notify(_id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard_neg(|| Err(libc::ENOSYS))
}

/// `rdma_get_devices`: a NULL-terminated array of this library's
/// contexts, one per device.
///
/// # Safety
/// `num` NULL or valid.
pub unsafe extern "C" fn softrdma_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard_ptr(|| {
        let devs = crate::device::devices();
        let mut v: Vec<*mut ibv_context> = Vec::with_capacity(devs.len() + 1);
        for d in devs {
            v.push(crate::objects::device_context(d)?);
        }
        // SAFETY: malloc for the array and its NULL.
        let p = unsafe { libc::malloc(std::mem::size_of::<*mut ibv_context>() * (v.len() + 1)) }
            as *mut *mut ibv_context;
        if p.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: `p` has room for v.len()+1 pointers.
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), p, v.len());
            *p.add(v.len()) = std::ptr::null_mut();
            if !num.is_null() {
                *num = v.len() as c_int;
            }
        }
        Ok(p)
    })
}

/// `rdma_free_devices`.
///
/// # Safety
/// `list` from `rdma_get_devices`.
pub unsafe extern "C" fn softrdma_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: malloc'd by rdma_get_devices (or NULL).
    guard((), || unsafe { libc::free(list as *mut c_void) })
}

fn port_of(ss: &sockaddr_storage) -> u16 {
    let fam = u16::from_ne_bytes([ss.0[0], ss.0[1]]);
    if i32::from(fam) == libc::AF_INET || i32::from(fam) == libc::AF_INET6 {
        // sin_port / sin6_port: offset 2, network order, returned as is.
        u16::from_ne_bytes([ss.0[2], ss.0[3]])
    } else {
        0
    }
}

/// `rdma_get_src_port` (network order).
///
/// # Safety
/// `id` live.
pub unsafe extern "C" fn softrdma_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: contract.
        let id = unsafe { id.as_ref() };
        id.map_or(0, |i| port_of(&i.route.addr.src_addr))
    })
}

/// `rdma_get_dst_port` (network order).
///
/// # Safety
/// `id` live.
pub unsafe extern "C" fn softrdma_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        // SAFETY: contract.
        let id = unsafe { id.as_ref() };
        id.map_or(0, |i| port_of(&i.route.addr.dst_addr))
    })
}

/// `rdma_create_srq`: SRQs through rdma_cm are not provided (`ENOSYS`;
/// `ibv_create_srq` works).
pub extern "C" fn softrdma_rdma_create_srq(
    _id: *mut rdma_cm_id,
    _pd: *mut ibv_pd,
    _attr: *mut c_void,
) -> c_int {
    guard_neg(|| Err(libc::ENOSYS))
}

/// `rdma_create_srq_ex`: `ENOSYS`, as `rdma_create_srq`.
pub extern "C" fn softrdma_rdma_create_srq_ex(_id: *mut rdma_cm_id, _attr: *mut c_void) -> c_int {
    guard_neg(|| Err(libc::ENOSYS))
}

/// `rdma_destroy_srq`: nothing was created through rdma_cm.
pub extern "C" fn softrdma_rdma_destroy_srq(_id: *mut rdma_cm_id) {
    guard((), || {})
}

/// `rdma_get_remote_ece`: no ECE on iWARP (`EOPNOTSUPP`).
pub extern "C" fn softrdma_rdma_get_remote_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    guard_neg(|| Err(libc::EOPNOTSUPP))
}

/// `rdma_set_local_ece`: `EOPNOTSUPP`.
pub extern "C" fn softrdma_rdma_set_local_ece(_id: *mut rdma_cm_id, _ece: *mut c_void) -> c_int {
    guard_neg(|| Err(libc::EOPNOTSUPP))
}

/// `rdma_reject_ece`: `EOPNOTSUPP`.
pub extern "C" fn softrdma_rdma_reject_ece(
    _id: *mut rdma_cm_id,
    _pd: *const c_void,
    _len: u8,
) -> c_int {
    guard_neg(|| Err(libc::EOPNOTSUPP))
}

export!(
    softrdma_rdma_create_event_channel,
    softrdma_rdma_destroy_event_channel,
    softrdma_rdma_create_id,
    softrdma_rdma_destroy_id,
    softrdma_rdma_bind_addr,
    softrdma_rdma_resolve_addr,
    softrdma_rdma_resolve_route,
    softrdma_rdma_create_qp,
    softrdma_rdma_create_qp_ex,
    softrdma_rdma_destroy_qp,
    softrdma_rdma_connect,
    softrdma_rdma_listen,
    softrdma_rdma_accept,
    softrdma_rdma_reject,
    softrdma_rdma_disconnect,
    softrdma_rdma_establish,
    softrdma_rdma_init_qp_attr,
    softrdma_rdma_get_cm_event,
    softrdma_rdma_ack_cm_event,
    softrdma_rdma_event_str,
    softrdma_rdma_getaddrinfo,
    softrdma_rdma_freeaddrinfo,
    softrdma_rdma_create_ep,
    softrdma_rdma_destroy_ep,
    softrdma_rdma_get_request,
    softrdma_rdma_join_multicast,
    softrdma_rdma_join_multicast_ex,
    softrdma_rdma_leave_multicast,
    softrdma_rdma_set_option,
    softrdma_rdma_migrate_id,
    softrdma_rdma_notify,
    softrdma_rdma_get_devices,
    softrdma_rdma_free_devices,
    softrdma_rdma_get_src_port,
    softrdma_rdma_get_dst_port,
    softrdma_rdma_create_srq,
    softrdma_rdma_create_srq_ex,
    softrdma_rdma_destroy_srq,
    softrdma_rdma_get_remote_ece,
    softrdma_rdma_set_local_ece,
    softrdma_rdma_reject_ece,
);
