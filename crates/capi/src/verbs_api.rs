//! The exported `ibv_*` control path: devices, contexts, PDs, MRs, CQs
//! and channels, SRQs, QPs and their state machine, AHs, multicast, async
//! events, and the small helpers (strings, rates, sysfs).
//!
//! Every function runs inside the panic boundary of [`crate::export`].
//! Calls softrdma cannot honour return `EOPNOTSUPP` (errno-returning calls)
//! or NULL with `errno = EOPNOTSUPP` (pointer-returning calls), as rdma-core
//! does for a provider that lacks the operation.
//!
//! QP state machine (the IB table, `softrdma_verbs::qp_state`): RC (and UC,
//! run as RC) connect IB-style: INIT → RTR with `IBV_QP_AV` and
//! `IBV_QP_DEST_QPN` starts the daemonless connection to the peer named by
//! the GID (`ah_attr.grh.dgid`, an IPv4-mapped address; without a GRH only
//! a peer on this host is reachable: loopback) and the QPN; RTR → RTS
//! returns at once, and the first send waits for the connection (see
//! [`crate::datapath`]). Resetting a QP that has been connected is
//! `EOPNOTSUPP` (create a new QP). UD/RD QPs need no connection: the
//! transitions only record the state; sends need RTS, receives any state
//! but RESET, as in verbs.
//!
//! An RC QP's `qp_access_flags` (`IBV_QP_ACCESS_FLAGS`) are enforced as in
//! verbs: a peer's RDMA Write, RDMA Read or atomic needs its
//! `IBV_ACCESS_REMOTE_*` right in the QP's flags as well as in the memory
//! region, and fails with a remote access error otherwise. A QP whose flags
//! were never set (rdma_cm's iWARP QPs) grants all three.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::Mutex;

use softrdma_engine as engine;
use softrdma_engine::{AsyncEvent, QpCaps};
use softrdma_proto::memory::Access;
use softrdma_proto::wr::{MAX_INLINE, MAX_SGE};

use crate::abi::*;
use crate::datapath;
use crate::device::{self, DevObj};
use crate::export::{export, guard, guard_errno, guard_ptr, set_errno};
use crate::objects::*;

/// softrdma's `ibv_qp_type` for reliable-datagram QPs (`softrdma/verbs.h`).
pub const IBV_QPT_SOFTRDMA_RD: c_int = 0x5200;

fn ctx_of<'a>(ctx: *mut ibv_context) -> Result<&'a CtxObj, c_int> {
    // SAFETY: the application passes a context of ours (verbs contract).
    unsafe { CtxObj::from_raw(ctx) }.ok_or(libc::EINVAL)
}

// ---------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------

/// `ibv_get_device_list`.
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard_ptr(|| {
        let devs = device::devices();
        // SAFETY: calloc of n+1 pointers; freed by ibv_free_device_list.
        let arr = unsafe { libc::calloc(devs.len() + 1, std::mem::size_of::<usize>()) }
            as *mut *mut ibv_device;
        if arr.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: i < n+1 entries allocated above.
            unsafe { *arr.add(i) = d.raw() };
        }
        if !num.is_null() {
            // SAFETY: the application's out-pointer.
            unsafe { *num = devs.len() as c_int };
        }
        Ok(arr)
    })
}

/// `ibv_free_device_list`.
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        // SAFETY: the array came from calloc in ibv_get_device_list.
        unsafe { libc::free(list as *mut c_void) }
    })
}

fn dev_of<'a>(dev: *mut ibv_device) -> Option<&'a DevObj> {
    device::devices().iter().find(|d| d.raw() == dev)
}

/// `ibv_get_device_name`.
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    guard(std::ptr::null(), || match dev_of(dev) {
        Some(d) => d.dev.name.as_ptr(),
        None => {
            set_errno(libc::EINVAL);
            std::ptr::null()
        }
    })
}

/// `ibv_get_device_guid` (network order).
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    guard(0, || dev_of(dev).map_or(0, |d| d.guid.to_be()))
}

/// `ibv_get_device_index`.
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    guard(-1, || dev_of(dev).map_or(-1, |d| d.index as c_int))
}

/// Opens a context on `dev` (also what rdma_cm uses, see
/// [`device_context`]).
pub fn open_context(dev: &'static DevObj) -> Result<*mut ibv_context, c_int> {
    let e = engine()?;
    let async_fd = AppFd::watching(e.async_events().fd())?;
    let null = std::ptr::null_mut::<c_void>();
    let ops = ibv_context_ops {
        _compat_query_device: null,
        _compat_query_port: null,
        _compat_alloc_pd: null,
        _compat_dealloc_pd: null,
        _compat_reg_mr: null,
        _compat_rereg_mr: null,
        _compat_dereg_mr: null,
        alloc_mw: Some(alloc_mw),
        bind_mw: Some(bind_mw),
        dealloc_mw: Some(dealloc_mw),
        _compat_create_cq: null,
        poll_cq: Some(datapath::poll_cq),
        req_notify_cq: Some(datapath::req_notify_cq),
        _compat_cq_event: null,
        _compat_resize_cq: null,
        _compat_destroy_cq: null,
        _compat_create_srq: null,
        _compat_modify_srq: null,
        _compat_query_srq: null,
        _compat_destroy_srq: null,
        post_srq_recv: Some(datapath::post_srq_recv),
        _compat_create_qp: null,
        _compat_query_qp: null,
        _compat_modify_qp: null,
        _compat_destroy_qp: null,
        post_send: Some(datapath::post_send),
        post_recv: Some(datapath::post_recv),
        _compat_create_ah: null,
        _compat_destroy_ah: null,
        _compat_attach_mcast: null,
        _compat_detach_mcast: null,
        _compat_async_event: null,
    };
    let vctx = verbs_context {
        query_port: Some(query_port_ex),
        advise_mr: null,
        alloc_null_mr: null,
        read_counters: null,
        attach_counters_point_flow: null,
        create_counters: null,
        destroy_counters: null,
        reg_dm_mr: null,
        alloc_dm: null,
        free_dm: null,
        modify_flow_action_esp: null,
        destroy_flow_action: null,
        create_flow_action_esp: null,
        modify_qp_rate_limit: null,
        alloc_parent_domain: null,
        dealloc_td: null,
        alloc_td: null,
        modify_cq: null,
        post_srq_ops: null,
        destroy_rwq_ind_table: null,
        create_rwq_ind_table: null,
        destroy_wq: null,
        modify_wq: null,
        create_wq: null,
        query_rt_values: null,
        create_cq_ex: Some(crate::qp_ex::create_cq_ex),
        priv_: null,
        query_device_ex: Some(query_device_ex),
        ibv_destroy_flow: null,
        ABI_placeholder2: null,
        ibv_create_flow: null,
        ABI_placeholder1: null,
        open_qp: null,
        create_qp_ex: Some(crate::qp_ex::create_qp_ex),
        get_srq_num: None,
        create_srq_ex: None,
        open_xrcd: null,
        close_xrcd: null,
        _ABI_placeholder3: 0,
        sz: std::mem::size_of::<verbs_context>(),
        context: ibv_context {
            device: dev.raw(),
            ops,
            // No kernel command channel.
            cmd_fd: -1,
            async_fd: async_fd.raw(),
            num_comp_vectors: 1,
            mutex: pthread_mutex_t([0; 40]),
            abi_compat: VERBS_ABI_IS_EXTENDED,
        },
    };
    let obj = Box::into_raw(Box::new(CtxObj {
        vctx,
        dev,
        async_fd,
    }));
    // SAFETY: just allocated.
    Ok(unsafe { (*obj).raw() })
}

/// `ibv_open_device`.
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard_ptr(|| {
        let d = dev_of(dev).ok_or(libc::ENODEV)?;
        open_context(d)
    })
}

/// `ibv_close_device`.
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    guard_errno(|| {
        let Ok(c) = ctx_of(ctx) else {
            return libc::EINVAL;
        };
        // SAFETY: created by Box::into_raw in open_context; the application closes it once.
        drop(unsafe { Box::from_raw(c as *const CtxObj as *mut CtxObj) });
        0
    })
}

/// `ibv_query_device`.
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    guard_errno(|| {
        let Ok(c) = ctx_of(ctx) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the application's out-struct.
        unsafe { *attr = device::device_attr(c.dev) };
        0
    })
}

/// `verbs_context.query_device_ex`.
unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    guard_errno(|| {
        let Ok(c) = ctx_of(ctx) else {
            return libc::EINVAL;
        };
        if attr.is_null() || size < std::mem::size_of::<ibv_device_attr>() {
            return libc::EINVAL;
        }
        // SAFETY: all-zero is a valid ibv_device_attr_ex (integers only).
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        ex.orig_attr = device::device_attr(c.dev);
        ex.phys_port_cnt_ex = 1;
        let n = size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the application's buffer has `size` octets; we write n <= size.
        unsafe { std::ptr::copy_nonoverlapping(&ex as *const _ as *const u8, attr as *mut u8, n) };
        0
    })
}

fn port_ok(port: u8) -> bool {
    port == 1
}

/// `verbs_context.query_port` (what the header's `ibv_query_port` macro
/// calls): writes `min(len, sizeof ibv_port_attr)` octets.
unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    guard_errno(|| {
        let Ok(c) = ctx_of(ctx) else {
            return libc::EINVAL;
        };
        if !port_ok(port) || attr.is_null() {
            return libc::EINVAL;
        }
        let a = device::port_attr(c.dev);
        let n = len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the application's buffer has `len` octets.
        unsafe { std::ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
        0
    })
}

/// `ibv_query_port@IBVERBS_1.1`: the 48-octet compat structure.
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded with the compat length.
    unsafe { query_port_ex(ctx, port, attr, COMPAT_PORT_ATTR_LEN) }
}

/// `ibv_query_gid`.
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard_neg(|| {
        let c = ctx_of(ctx)?;
        if !port_ok(port) || index != 0 || gid.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the application's out-struct.
        unsafe { *gid = gid_of(c.dev.ip) };
        Ok(0)
    })
}

use crate::export::guard_neg;

/// `ibv_query_gid_type@IBVERBS_PRIVATE_34`. Its type is rdma-core's
/// private `enum ibv_gid_type_sysfs` (`driver.h`: 0 IB/RoCE v1, 1 RoCE v2),
/// not the public `enum ibv_gid_type` of `_ibv_query_gid_ex`.
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    guard_neg(|| {
        ctx_of(ctx)?;
        if !port_ok(port) || index != 0 || ty.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the application's out-int.
        unsafe { *ty = IBV_GID_TYPE_SYSFS_ROCE_V2 };
        Ok(0)
    })
}

/// `_ibv_query_gid_ex@IBVERBS_1.11`.
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    size: usize,
) -> c_int {
    guard_errno(|| {
        let Ok(c) = ctx_of(ctx) else {
            return libc::EINVAL;
        };
        // As the kernel's QUERY_GID_ENTRY: flags must be 0, the port must
        // exist and the index be inside the table (EINVAL); the table's
        // one entry is always valid (no ENODATA).
        if port != 1
            || flags != 0
            || index != 0
            || entry.is_null()
            || size < std::mem::size_of::<ibv_gid_entry>()
        {
            return libc::EINVAL;
        }
        // SAFETY: the application's out-struct of at least our size.
        unsafe { *entry = gid_entry(c) };
        0
    })
}

fn gid_entry(c: &CtxObj) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: gid_of(c.dev.ip),
        gid_index: 0,
        port_num: 1,
        gid_type: IBV_GID_TYPE_ROCE_V2 as u32,
        ndev_ifindex: ifindex(&c.dev.ifname),
    }
}

fn ifindex(name: &str) -> u32 {
    let Ok(c) = std::ffi::CString::new(name) else {
        return 0;
    };
    // SAFETY: a NUL-terminated name.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

/// `_ibv_query_gid_table@IBVERBS_1.11`.
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        let Ok(c) = ctx_of(ctx) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entries.is_null() || size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        // As the kernel's: a table longer than the buffer is EINVAL.
        if max < 1 {
            return -(libc::EINVAL as isize);
        }
        // SAFETY: the application's array of at least one entry.
        unsafe { *entries = gid_entry(c) };
        1
    })
}

/// `ibv_query_pkey`: one default P_Key.
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard_neg(|| {
        ctx_of(ctx)?;
        if !port_ok(port) || index != 0 || pkey.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the application's out-value.
        unsafe { *pkey = 0xffffu16.to_be() };
        Ok(0)
    })
}

/// `ibv_get_pkey_index`.
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    guard_neg(|| {
        ctx_of(ctx)?;
        if port_ok(port) && u16::from_be(pkey) & 0x7fff == 0x7fff {
            Ok(0)
        } else {
            Err(libc::ENOENT)
        }
    })
}

// ---------------------------------------------------------------------
// PD and MR
// ---------------------------------------------------------------------

/// `ibv_alloc_pd`.
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard_ptr(|| {
        ctx_of(ctx)?;
        let num = engine()?.alloc_pd();
        Ok(Box::into_raw(Box::new(PdObj {
            pd: ibv_pd {
                context: ctx,
                handle: num,
            },
            num,
            users: UseCount::default(),
        })) as *mut ibv_pd)
    })
}

/// `ibv_dealloc_pd`: `EBUSY` (the PD stays) while an AH, SRQ, QP, DCT or
/// DCI is in it.
///
/// MRs are the one exception to rdma-core's rule: a PD that still has
/// MRs is deallocated. Debian's perftest (4.5) leaks an MR on every
/// iWARP device in `ib_send_bw` and would fail its teardown otherwise
/// (reported to perftest upstream as its bug 52). This is memory-safe: PD numbers are never
/// reused, so an orphaned MR is reachable from no QP, and
/// `ibv_dereg_mr` does not touch the PD.
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard_errno(|| {
        // SAFETY: a PD of ours or NULL.
        let Some(p) = (unsafe { pd_from_raw(pd) }) else {
            return libc::EINVAL;
        };
        if p.users.in_use() {
            return libc::EBUSY;
        }
        // SAFETY: a PD of ours (Box::into_raw in ibv_alloc_pd), freed once.
        drop(unsafe { Box::from_raw(pd as *mut PdObj) });
        0
    })
}

/// `IBV_ACCESS_ON_DEMAND`: on-demand paging, which the device does not
/// report.
const IBV_ACCESS_ON_DEMAND: c_int = 1 << 6;
/// The access bits rdma-core 44 defines: `LOCAL_WRITE` through `HUGETLB`
/// and the optional range (`IBV_ACCESS_OPTIONAL_RANGE`, taken as hints).
const IBV_ACCESS_KNOWN: c_int = ((1 << 8) - 1) | 0x3ff0_0000;

/// The kernel's `ib_check_mr_access`, behind every registration: EINVAL
/// for bits no verbs version defines, EOPNOTSUPP for on-demand paging
/// (LOCAL_WRITE's requirement is the engine's to check).
fn check_access(flags: c_int) -> Result<(), c_int> {
    if flags & !IBV_ACCESS_KNOWN != 0 {
        return Err(libc::EINVAL);
    }
    if flags & IBV_ACCESS_ON_DEMAND != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

fn access_of(flags: c_int) -> Access {
    let mut a = Access(0);
    for (bit, acc) in [
        (IBV_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE),
        (IBV_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (IBV_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (IBV_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
    ] {
        if flags & bit != 0 {
            a = a | acc;
        }
    }
    a
}

/// Registers application memory (all `ibv_reg_mr*` variants).
///
/// # Safety
/// `pd` must be a PD of ours; `addr..addr+len` must stay mapped until
/// the MR is deregistered (the verbs contract).
pub unsafe fn reg_mr_internal(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> Result<*mut ibv_mr, c_int> {
    // SAFETY: per the contract.
    let p = unsafe { pd_from_raw(pd) }.ok_or(libc::EINVAL)?;
    check_access(access)?;
    // IBV_ACCESS_ZERO_BASED: the region's addresses start at 0.
    let iova = if access & (1 << 5) != 0 { 0 } else { iova };
    let e = engine()?;
    // SAFETY: per the contract the range stays valid until ibv_dereg_mr, which deregisters it first.
    let stag = unsafe {
        e.registry()
            .register(addr as *mut u8, len, iova, access_of(access), p.num)
    }
    .map_err(|err| match err {
        engine::RegError::BadAccess | engine::RegError::BadRange | engine::RegError::NoSuchStag => {
            libc::EINVAL
        }
        engine::RegError::TooMany => libc::ENOMEM,
    })?;
    // MRs do not hold their PD (see ibv_dealloc_pd).
    Ok(Box::into_raw(Box::new(MrObj {
        mr: ibv_mr {
            context: p.pd.context,
            pd,
            addr,
            length: len,
            handle: stag,
            lkey: stag,
            rkey: stag,
        },
        stag,
    })) as *mut ibv_mr)
}

/// `ibv_reg_mr@IBVERBS_1.1`.
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded under the same contract.
    guard_ptr(|| unsafe { reg_mr_internal(pd, addr, len, addr as u64, access) })
}

/// `ibv_reg_mr_iova@IBVERBS_1.7`.
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded under the same contract.
    guard_ptr(|| unsafe { reg_mr_internal(pd, addr, len, iova, access) })
}

/// `ibv_reg_mr_iova2@IBVERBS_1.8`.
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: forwarded under the same contract.
    guard_ptr(|| unsafe { reg_mr_internal(pd, addr, len, iova, access as c_int) })
}

/// `ibv_dereg_mr`.
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard_errno(|| {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: an MR of ours (Box::into_raw in reg_mr_internal), freed once.
        let m = unsafe { Box::from_raw(mr as *mut MrObj) };
        if let Ok(e) = engine() {
            e.registry().deregister(m.stag);
        }
        // The MR's PD is not touched: it may be gone (ibv_dealloc_pd).
        drop(m);
        0
    })
}

/// `ibv_rereg_mr` flags (rdma-core's `enum ibv_rereg_mr_flags`).
const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1 << 0;
const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
const IBV_REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
const IBV_REREG_MR_FLAGS_SUPPORTED: c_int = (1 << 3) - 1;
/// `IBV_REREG_MR_ERR_INPUT`: the arguments were refused before anything
/// changed (errno says why).
const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`: the change itself failed; the MR is as before.
const IBV_REREG_MR_ERR_CMD: c_int = -4;

/// `ibv_rereg_mr`: changes the MR's translation (address and length),
/// PD and/or access rights in place. The lkey and rkey stay the same.
/// Returns 0, or `IBV_REREG_MR_ERR_INPUT` (errno EINVAL: no or unknown
/// flags, a new translation without address or length, an unknown PD,
/// rights that need LOCAL_WRITE or unknown access bits; EOPNOTSUPP:
/// `IBV_ACCESS_ON_DEMAND`) with the MR unchanged.
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    guard(IBV_REREG_MR_ERR_CMD, || {
        let fail = |code: c_int, errno: c_int| {
            set_errno(errno);
            code
        };
        if mr.is_null() || flags == 0 || flags & !IBV_REREG_MR_FLAGS_SUPPORTED != 0 {
            return fail(IBV_REREG_MR_ERR_INPUT, libc::EINVAL);
        }
        let translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0;
        if translation && (addr.is_null() || len == 0) {
            return fail(IBV_REREG_MR_ERR_INPUT, libc::EINVAL);
        }
        let new_pd = if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            // SAFETY: a PD of ours or NULL, per the verbs contract.
            match unsafe { pd_from_raw(pd) } {
                Some(p) => Some(p.num),
                None => return fail(IBV_REREG_MR_ERR_INPUT, libc::EINVAL),
            }
        } else {
            None
        };
        let change_access = flags & IBV_REREG_MR_CHANGE_ACCESS != 0;
        if change_access {
            if let Err(errno) = check_access(access) {
                return fail(IBV_REREG_MR_ERR_INPUT, errno);
            }
        }
        let new_access = change_access.then(|| access_of(access));
        let Ok(e) = engine() else {
            return fail(IBV_REREG_MR_ERR_CMD, libc::ENODEV);
        };
        // SAFETY: an MR of ours (Box::into_raw in reg_mr_internal), live while the app calls.
        let m = unsafe { &mut *(mr as *mut MrObj) };
        let range = translation.then_some((addr as *mut u8, len, addr as u64));
        // SAFETY: per the verbs contract the new range stays valid until ibv_dereg_mr.
        let r = unsafe { e.registry().reregister(m.stag, range, new_access, new_pd) };
        match r {
            Ok(()) => {
                if translation {
                    m.mr.addr = addr;
                    m.mr.length = len;
                }
                if new_pd.is_some() {
                    m.mr.pd = pd;
                }
                0
            }
            Err(engine::RegError::TooMany) => fail(IBV_REREG_MR_ERR_CMD, libc::ENOMEM),
            Err(_) => fail(IBV_REREG_MR_ERR_INPUT, libc::EINVAL),
        }
    })
}

/// `ibv_reg_dmabuf_mr`: no dma-buf in user space.
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _len: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

unsafe extern "C" fn alloc_mw(_pd: *mut ibv_pd, _ty: c_int) -> *mut ibv_mw {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

unsafe extern "C" fn bind_mw(_qp: *mut ibv_qp, _mw: *mut ibv_mw, _b: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

unsafe extern "C" fn dealloc_mw(_mw: *mut ibv_mw) -> c_int {
    libc::EOPNOTSUPP
}

// ---------------------------------------------------------------------
// Completion channels and CQs
// ---------------------------------------------------------------------

/// `ibv_create_comp_channel`.
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    guard_ptr(|| {
        ctx_of(ctx)?;
        let ch =
            engine::CompChannel::new().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
        let app_fd = AppFd::watching(ch.fd())?;
        Ok(Box::into_raw(Box::new(ChannelObj {
            ch: ibv_comp_channel {
                context: ctx,
                fd: app_fd.raw(),
                refcnt: 0,
            },
            engine: ch,
            app_fd,
        })) as *mut ibv_comp_channel)
    })
}

/// `ibv_destroy_comp_channel`: EBUSY while CQs use it.
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard_errno(|| {
        if ch.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a channel of ours.
        if unsafe { AtomicI32::from_ptr(&mut (*ch).refcnt) }.load(Ordering::Acquire) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: created by Box::into_raw in ibv_create_comp_channel, freed once.
        drop(unsafe { Box::from_raw(ch as *mut ChannelObj) });
        0
    })
}

/// Creates a CQ object (the basic and the extended call).
///
/// # Safety
/// `ctx` and `channel` (if not NULL) must be ours.
pub unsafe fn create_cq_internal(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: i64,
) -> Result<*mut CqObj, c_int> {
    ctx_of(ctx)?;
    // ibv_create_cq(3): EINVAL for a cqe outside [1, max_cqe] or a
    // comp_vector outside [0, num_comp_vectors).
    if !(1..=device::MAX_CQE).contains(&cqe) {
        return Err(libc::EINVAL);
    }
    // SAFETY: `ctx` is one of ours (checked above), live.
    let vectors = i64::from(unsafe { (*ctx).num_comp_vectors });
    if !(0..vectors).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let ch = unsafe { channel_from_raw(channel) }.map(|c| c.engine.clone());
    let cq = engine()?.create_cq(cqe as usize, ch.clone());
    if !channel.is_null() {
        // SAFETY: a live channel of ours.
        unsafe { AtomicI32::from_ptr(&mut (*channel).refcnt) }.fetch_add(1, Ordering::AcqRel);
    }
    let id = cq.id();
    let obj = Box::into_raw(Box::new(CqObj {
        cq: UnsafeCell::new(crate::qp_ex::new_cq_ex(ctx, channel, cq_context, cqe, id)),
        engine: cq,
        channel: ch,
        cur: Mutex::new(ibv_wc::default()),
        pending: Mutex::new(std::collections::VecDeque::new()),
        has_pending: std::sync::atomic::AtomicBool::new(false),
        users: UseCount::default(),
    }));
    register_cq(id, obj);
    Ok(obj)
}

/// `ibv_create_cq`.
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard_ptr(|| {
        // SAFETY: the application's objects.
        unsafe { create_cq_internal(ctx, cqe, cq_context, channel, comp_vector.into()) }
            .map(|p| p as *mut ibv_cq)
    })
}

/// `ibv_resize_cq`: the CQ holds up to `cqe` completions from now on
/// (`cq->cqe` reports it). EINVAL for a `cqe` outside [1, max_cqe] or
/// below the completions the CQ holds now.
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    guard_errno(|| {
        // SAFETY: a CQ of ours.
        let Some(c) = (unsafe { cq_from_raw(cq) }) else {
            return libc::EINVAL;
        };
        if !(1..=device::MAX_CQE).contains(&cqe) {
            return libc::EINVAL;
        }
        let held = c.pending.lock().unwrap_or_else(|p| p.into_inner()).len();
        if (cqe as usize) < held {
            return libc::EINVAL;
        }
        match c.engine.resize(cqe as usize) {
            Ok(()) => {
                // SAFETY: the CQ's own field, read by the application only between its calls.
                unsafe { (*c.cq.get()).cqe = cqe };
                0
            }
            Err(_) => libc::EINVAL,
        }
    })
}

/// `ibv_destroy_cq`: `EBUSY` (the CQ stays) while a QP, DCT or DCI
/// completes into it.
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard_errno(|| {
        // SAFETY: a CQ of ours or NULL.
        let Some(c) = (unsafe { cq_from_raw(cq) }) else {
            return libc::EINVAL;
        };
        if c.users.in_use() {
            return libc::EBUSY;
        }
        // SAFETY: created by Box::into_raw in create_cq_internal, destroyed once.
        let mut c = unsafe { Box::from_raw(cq as *mut CqObj) };
        unregister_cq(c.engine.id());
        let ch = c.cq.get_mut().channel;
        if !ch.is_null() {
            // SAFETY: the channel outlives its CQs (EBUSY otherwise).
            unsafe { AtomicI32::from_ptr(&mut (*ch).refcnt) }.fetch_sub(1, Ordering::AcqRel);
        }
        0
    })
}

/// `ibv_get_cq_event`: blocks until an armed CQ of `channel` fires, or,
/// when the application made the channel's fd `O_NONBLOCK`, fails with
/// `EAGAIN` if none has ([`AppFd`]).
///
/// Signals: rdma-core's call is a blocking `read(2)` of the channel fd,
/// which a signal handler installed without `SA_RESTART` interrupts
/// (-1, `errno = EINTR`); qperf ends every test that way (its `SIGALRM`
/// handler sets a flag, and the blocked wait must return to see it). The
/// wait here is a poll(2), which any handled signal interrupts; it
/// returns `EINTR` when some caught signal has a handler without
/// `SA_RESTART` (the one that fired cannot be told apart), and resumes
/// waiting otherwise, as the restarted `read(2)` would.
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard_neg(|| {
        // SAFETY: a channel of ours.
        let ch = unsafe { channel_from_raw(channel) }.ok_or(libc::EINVAL)?;
        loop {
            let got = if ch.app_fd.nonblocking() {
                ch.engine.try_get_event().ok_or(libc::EAGAIN)
            } else {
                ch.engine.get_event_interruptible().map_err(|e| {
                    if e.kind() == std::io::ErrorKind::Interrupted {
                        libc::EINTR
                    } else {
                        e.raw_os_error().unwrap_or(libc::EIO)
                    }
                })
            };
            let id = match got {
                Ok(id) => id,
                Err(libc::EINTR) => {
                    if interrupting_handler_installed() {
                        return Err(libc::EINTR);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            // A CQ destroyed since it fired is skipped.
            let Some(c) = cq_by_id(id) else { continue };
            if !cq.is_null() {
                // SAFETY: the application's out-pointer.
                unsafe { *cq = c as *mut ibv_cq };
            }
            if !cq_context.is_null() {
                // SAFETY: the application's out-pointer; c is live (registered).
                unsafe { *cq_context = (*(*c).cq.get()).cq_context };
            }
            return Ok(0);
        }
    })
}

/// True when some asynchronous signal is caught by a handler installed
/// without `SA_RESTART` (a blocking `read(2)` would then fail with `EINTR`
/// when that signal arrives). Fault signals are left out: they do not
/// arrive while a thread sleeps in a system call.
fn interrupting_handler_installed() -> bool {
    let faults = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE];
    (1..libc::SIGRTMAX())
        .filter(|s| !faults.contains(s))
        .any(|sig| {
            // SAFETY: all-zero is a valid sigaction to be filled in.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: queries only (no new action); `old` is a live out-struct.
            let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
            r == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
                && old.sa_flags & libc::SA_RESTART == 0
        })
}

/// `ibv_ack_cq_events`.
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    guard((), || {
        if cq.is_null() {
            return;
        }
        // SAFETY: a CQ of ours; the counter is only touched atomically.
        unsafe { AtomicU32::from_ptr(&mut (*cq).comp_events_completed) }
            .fetch_add(n, Ordering::AcqRel);
    })
}

// ---------------------------------------------------------------------
// SRQ
// ---------------------------------------------------------------------

/// `ibv_create_srq`.
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard_ptr(|| {
        // SAFETY: the application's PD and attributes.
        let p = unsafe { pd_from_raw(pd) }.ok_or(libc::EINVAL)?;
        // SAFETY: as above.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        if a.attr.max_wr == 0
            || a.attr.max_wr > device::MAX_QP_WR as u32
            || a.attr.max_sge > MAX_SGE as u32
        {
            return Err(libc::EINVAL);
        }
        let s = engine()?.create_srq(a.attr.max_wr as usize);
        a.attr.max_sge = MAX_SGE as u32;
        let id = s.id();
        if a.attr.srq_limit > 0 {
            s.arm_limit(a.attr.srq_limit as usize)
                .map_err(|_| libc::EINVAL)?;
        }
        let obj = Box::into_raw(Box::new(SrqObj {
            srq: ibv_srq {
                context: p.pd.context,
                srq_context: a.srq_context,
                pd,
                handle: id as u32,
                mutex: pthread_mutex_t([0; 40]),
                cond: pthread_cond_t([0; 48]),
                events_completed: 0,
            },
            engine: s,
            pd_num: p.num,
            users: UseCount::default(),
            limit: AtomicU32::new(a.attr.srq_limit),
        }));
        p.users.hold();
        register_srq(id, obj);
        Ok(obj as *mut ibv_srq)
    })
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the limit event; resizing
/// (`IBV_SRQ_MAX_WR`) is EOPNOTSUPP.
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard_errno(|| {
        // SAFETY: the application's SRQ and attributes.
        let (Some(s), Some(a)) = (unsafe { srq_from_raw(srq) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        if mask & IBV_SRQ_MAX_WR != 0 {
            return libc::EOPNOTSUPP;
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            if s.engine.arm_limit(a.srq_limit as usize).is_err() {
                return libc::EINVAL;
            }
            s.limit.store(a.srq_limit, Ordering::Release);
        }
        0
    })
}

/// `ibv_query_srq`.
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard_errno(|| {
        // SAFETY: the application's SRQ and out-struct.
        let (Some(s), Some(a)) = (unsafe { srq_from_raw(srq) }, unsafe { attr.as_mut() }) else {
            return libc::EINVAL;
        };
        *a = ibv_srq_attr {
            max_wr: s.engine.depth() as u32,
            max_sge: MAX_SGE as u32,
            srq_limit: s.limit.load(Ordering::Acquire),
        };
        0
    })
}

/// `ibv_destroy_srq`: `EBUSY` (the SRQ stays) while a QP or DCT
/// receives from it.
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard_errno(|| {
        // SAFETY: an SRQ of ours or NULL.
        let Some(s) = (unsafe { srq_from_raw(srq) }) else {
            return libc::EINVAL;
        };
        if s.users.in_use() {
            return libc::EBUSY;
        }
        // SAFETY: created by Box::into_raw in ibv_create_srq, destroyed once.
        let s = unsafe { Box::from_raw(srq as *mut SrqObj) };
        unregister_srq(s.engine.id());
        // SAFETY: the SRQ's PD, live (it cannot be deallocated while the SRQ is).
        unsafe { release_pd(s.srq.pd) };
        0
    })
}

// ---------------------------------------------------------------------
// QP
// ---------------------------------------------------------------------

/// What creating a QP needs (the basic and the extended call, and
/// `rdma_create_qp`).
pub struct QpInit {
    /// `qp_context`.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ or NULL.
    pub srq: *mut ibv_srq,
    /// Requested capabilities; updated to what was granted.
    pub cap: ibv_qp_cap,
    /// `ibv_qp_type` (RC, UC, UD, or [`IBV_QPT_SOFTRDMA_RD`]).
    pub qp_type: c_int,
    /// `sq_sig_all`.
    pub sq_sig_all: bool,
}

/// Creates a QP in RESET (the call behind `ibv_create_qp`,
/// `ibv_create_qp_ex` and, for rdma_cm, `rdma_create_qp`). `init.cap` is
/// updated to what was granted.
///
/// # Safety
/// `pd` and the CQs/SRQ in `init` must be live objects of ours.
pub unsafe fn create_qp_internal(pd: *mut ibv_pd, init: &mut QpInit) -> Result<*mut QpObj, c_int> {
    // SAFETY: per the contract.
    let p = unsafe { pd_from_raw(pd) }.ok_or(libc::EINVAL)?;
    let c = ctx_of(p.pd.context)?;
    // SAFETY: per the contract.
    let scq = unsafe { cq_from_raw(init.send_cq) }.ok_or(libc::EINVAL)?;
    // SAFETY: per the contract.
    let rcq = unsafe { cq_from_raw(init.recv_cq) }.ok_or(libc::EINVAL)?;
    // SAFETY: per the contract.
    let srq = unsafe { srq_from_raw(init.srq) };
    let cap = &mut init.cap;
    let max_wr = device::MAX_QP_WR as u32;
    if cap.max_send_wr > max_wr
        || cap.max_recv_wr > max_wr
        || cap.max_send_sge > MAX_SGE as u32
        || cap.max_recv_sge > MAX_SGE as u32
        || cap.max_inline_data > MAX_INLINE as u32
    {
        return Err(libc::EINVAL);
    }
    let caps = QpCaps {
        max_send_wr: cap.max_send_wr.max(1) as usize,
        max_recv_wr: cap.max_recv_wr.max(1) as usize,
    };
    let e = engine()?;
    let (s, r) = (scq.engine.clone(), rcq.engine.clone());
    let bind = SocketAddr::new(c.dev.ip, 0);
    let kind = match init.qp_type {
        IBV_QPT_RC | IBV_QPT_UC => {
            // ibv_create_qp(3): only RC and UD QPs may be associated with
            // an SRQ.
            if init.qp_type == IBV_QPT_UC && srq.is_some() {
                return Err(libc::EINVAL);
            }
            let q = match srq {
                Some(sq) => {
                    if sq.pd_num != p.num {
                        return Err(libc::EINVAL);
                    }
                    let ib = e.ib_conn();
                    let qpn = ib.reserve().map_err(|_| libc::ENOMEM)?;
                    let q = e.create_qp_with_srq(qpn, p.num, caps, s, r, sq.engine.clone());
                    ib.bind(qpn, &q).map_err(|_| libc::ENOMEM)?;
                    q
                }
                None => e.create_rc_qp(p.num, caps, s, r).map_err(|err| {
                    eprintln!("softrdma: create QP: {err}");
                    libc::ENOMEM
                })?,
            };
            QpKind::Rc(q)
        }
        IBV_QPT_UD => {
            if srq.is_some() {
                return Err(libc::EOPNOTSUPP);
            }
            let proto = softrdma_proto::ud::UdConfig {
                grh: Some(c.dev.ip),
                ..Default::default()
            };
            let h = e
                .create_ud_qp(
                    p.num,
                    caps,
                    s,
                    r,
                    engine::UdOptions {
                        proto,
                        mtu: None,
                        bind,
                        self_driven: false,
                    },
                )
                .map_err(|err| {
                    eprintln!("softrdma: create UD QP: {err}");
                    libc::ENOMEM
                })?;
            QpKind::Dgram(h)
        }
        IBV_QPT_SOFTRDMA_RD => {
            if srq.is_some() {
                return Err(libc::EOPNOTSUPP);
            }
            let proto = softrdma_proto::rdqp::RdQpConfig {
                grh: Some(c.dev.ip),
                ..Default::default()
            };
            let h = e
                .create_rd_qp(
                    p.num,
                    caps,
                    s,
                    r,
                    engine::RdOptions {
                        proto,
                        mtu: None,
                        bind,
                        self_driven: false,
                    },
                )
                .map_err(|err| {
                    eprintln!("softrdma: create RD QP: {err}");
                    libc::ENOMEM
                })?;
            QpKind::Dgram(h)
        }
        _ => return Err(libc::EOPNOTSUPP),
    };
    cap.max_send_wr = caps.max_send_wr as u32;
    cap.max_recv_wr = if srq.is_some() {
        0
    } else {
        caps.max_recv_wr as u32
    };
    cap.max_send_sge = MAX_SGE as u32;
    cap.max_recv_sge = MAX_SGE as u32;
    cap.max_inline_data = MAX_INLINE as u32;
    let qpn = match &kind {
        QpKind::Rc(q) => q.qpn(),
        QpKind::Dgram(d) => d.qpn(),
    };
    let base = ibv_qp {
        context: p.pd.context,
        qp_context: init.qp_context,
        pd,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        handle: qpn,
        qp_num: qpn,
        state: IBV_QPS_RESET,
        qp_type: init.qp_type,
        mutex: pthread_mutex_t([0; 40]),
        cond: pthread_cond_t([0; 48]),
        events_completed: 0,
    };
    let obj = Box::into_raw(Box::new(QpObj {
        ex: UnsafeCell::new(crate::qp_ex::new_qp_ex(base)),
        qpn,
        qp_type: init.qp_type,
        kind,
        sq_sig_all: init.sq_sig_all,
        cap: *cap,
        pd_num: p.num,
        dev: c.dev,
        state: AtomicI32::new(IBV_QPS_RESET),
        remembered: Mutex::new(QpRemembered::default()),
        batch: Mutex::new(crate::qp_ex::WrBatch::default()),
        ib_style: std::sync::atomic::AtomicBool::new(false),
        deferred: Mutex::new(Vec::new()),
    }));
    // Nothing fails from here on: the QP now names its PD, CQs and SRQ.
    p.users.hold();
    scq.users.hold();
    rcq.users.hold();
    if let Some(sq) = srq {
        sq.users.hold();
    }
    register_qp(qpn, obj);
    Ok(obj)
}

/// `ibv_create_qp`.
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard_ptr(|| {
        // SAFETY: the application's attributes.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        let mut init = QpInit {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all != 0,
        };
        // SAFETY: the application's objects.
        let q = unsafe { create_qp_internal(pd, &mut init) }?;
        a.cap = init.cap;
        Ok(q as *mut ibv_qp)
    })
}

fn state_name(s: c_int) -> softrdma_verbs::QpState {
    use softrdma_verbs::QpState::*;
    match s {
        IBV_QPS_RESET => Reset,
        IBV_QPS_INIT => Init,
        IBV_QPS_RTR => Rtr,
        IBV_QPS_RTS => Rts,
        IBV_QPS_SQD => Sqd,
        IBV_QPS_SQE => Sqe,
        _ => Err,
    }
}

/// `ibv_modify_qp` (see the module documentation for the state machine).
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard_errno(|| {
        // SAFETY: the application's QP and attributes.
        let (Some(q), Some(a)) = (unsafe { qp_from_raw(qp) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        if let Err(e) = check_qp_attr(q, a, mask) {
            return e;
        }
        match modify_qp_internal(q, a, mask) {
            Ok(()) => 0,
            Err(e) => e,
        }
    })
}

/// The attribute ranges the kernel's drivers enforce on `ibv_modify_qp`
/// (EINVAL, nothing changed): a current state that is a state, the port
/// exists (also the address vector's, whose source GID index must be in
/// the GID table), the P_Key index is inside
/// the table, the path MTU is an `ibv_mtu` the port takes, the RDMA
/// Read/atomic depths are within `ibv_query_device`'s
/// `max_qp_init_rd_atom` / `max_qp_rd_atom`.
fn check_qp_attr(q: &QpObj, a: &ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    let port = device::port_attr(q.dev);
    // IBV_MTU_256 is 1.
    let bad = (mask & IBV_QP_CUR_STATE != 0
        && !(IBV_QPS_RESET..=IBV_QPS_ERR).contains(&a.cur_qp_state))
        || (mask & IBV_QP_PORT != 0 && !port_ok(a.port_num))
        || (mask & IBV_QP_AV != 0
            && (!port_ok(a.ah_attr.port_num)
                || (a.ah_attr.is_global != 0 && a.ah_attr.grh.sgid_index != 0)))
        || (mask & IBV_QP_PKEY_INDEX != 0 && a.pkey_index >= port.pkey_tbl_len)
        || (mask & IBV_QP_PATH_MTU != 0 && !(1..=port.max_mtu).contains(&a.path_mtu))
        || (mask & IBV_QP_MAX_QP_RD_ATOMIC != 0
            && i32::from(a.max_rd_atomic) > device::MAX_RD_ATOM)
        || (mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0
            && i32::from(a.max_dest_rd_atomic) > device::MAX_RD_ATOM);
    if bad {
        Err(libc::EINVAL)
    } else {
        Ok(())
    }
}

/// Applies `IBV_QP_ACCESS_FLAGS`, when the mask has it, to an RC QP: the
/// remote operations its peer may perform from now on.
fn set_access_flags(q: &QpObj, a: &ibv_qp_attr, mask: c_int) {
    if mask & IBV_QP_ACCESS_FLAGS != 0 {
        if let QpKind::Rc(rc) = &q.kind {
            rc.set_remote_access(a.qp_access_flags);
        }
    }
}

/// The state machine behind `ibv_modify_qp`.
pub fn modify_qp_internal(q: &QpObj, a: &ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    let from = if mask & IBV_QP_CUR_STATE != 0 {
        a.cur_qp_state
    } else {
        q.state()
    };
    let to = if mask & IBV_QP_STATE != 0 {
        a.qp_state
    } else {
        from
    };
    if !(IBV_QPS_RESET..=IBV_QPS_ERR).contains(&to) {
        return Err(libc::EINVAL);
    }
    if mask & IBV_QP_STATE != 0 && rdma_cm_connected(q, to, mask) {
        // rdma_cm connected this QP (`rping -q`: the application created
        // it, handed `qp_num` to rdma_accept/rdma_connect, and then walks
        // it through INIT/RTR/RTS with `rdma_init_qp_attr`'s iWARP
        // attributes). The connection is rdma_cm's and already runs: the
        // transition changes nothing (siw ignores it too) and the QP stays
        // in RTS. Its access flags still take effect (rping moved it to
        // INIT with none before connecting, and grants them only here).
        set_access_flags(q, a, mask);
        remember(q, a, mask);
        return Ok(());
    }
    if mask & IBV_QP_STATE != 0 && !state_name(from).can_move_to(state_name(to)) {
        return Err(libc::EINVAL);
    }
    if mask & IBV_QP_STATE != 0 && from != to {
        match &q.kind {
            QpKind::Rc(rc) => match (from, to) {
                (_, IBV_QPS_ERR) => {
                    rc.disconnect();
                    q.release_deferred();
                    datapath::release_held_sends(q.qpn(), false);
                }
                (IBV_QPS_RESET | IBV_QPS_INIT, IBV_QPS_RESET | IBV_QPS_INIT) => {}
                (_, IBV_QPS_RESET) => {
                    eprintln!(
                        "softrdma: resetting a connected QP is not supported; destroy it and create a new one"
                    );
                    return Err(libc::EOPNOTSUPP);
                }
                // Neither AV nor DEST_QPN: a QP that rdma_cm connects (an
                // application that created its own QP moves it with the
                // iWARP attributes of `rdma_init_qp_attr`, state only);
                // rdma_cm connects the engine QP and sets RTS itself.
                (IBV_QPS_INIT, IBV_QPS_RTR) if mask & (IBV_QP_AV | IBV_QP_DEST_QPN) == 0 => {}
                (IBV_QPS_INIT, IBV_QPS_RTR) => {
                    if mask & IBV_QP_AV == 0 || mask & IBV_QP_DEST_QPN == 0 {
                        return Err(libc::EINVAL);
                    }
                    let peer = if a.ah_attr.is_global != 0 {
                        ip_of_gid(&a.ah_attr.grh.dgid)
                    } else {
                        None
                    }
                    // Without a GID only a LID came: a peer on this host.
                    .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
                    let ird = if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
                        u16::from(a.max_dest_rd_atomic.max(1))
                    } else {
                        device::MAX_RD_ATOM as u16
                    };
                    let e = engine()?;
                    e.ib_conn()
                        .start(
                            rc,
                            q.qpn(),
                            peer,
                            a.dest_qp_num,
                            ird,
                            device::MAX_RD_ATOM as u16,
                        )
                        .map_err(|err| {
                            eprintln!("softrdma: QP {:#x} to RTR: {err}", q.qpn());
                            libc::EINVAL
                        })?;
                    q.ib_style.store(true, std::sync::atomic::Ordering::Release);
                }
                // RTS does not wait for the connection: the first send does.
                _ => {}
            },
            QpKind::Dgram(_) => {}
        }
    }
    set_access_flags(q, a, mask);
    remember(q, a, mask);
    if mask & IBV_QP_STATE != 0 {
        q.set_state(to);
    }
    Ok(())
}

/// A move to INIT, RTR or RTS without a destination (neither `IBV_QP_AV`
/// nor `IBV_QP_DEST_QPN`) of an RC QP that rdma_cm has already connected
/// (not IB-style, the engine QP connected, the QP in RTS).
fn rdma_cm_connected(q: &QpObj, to: c_int, mask: c_int) -> bool {
    let QpKind::Rc(rc) = &q.kind else {
        return false;
    };
    matches!(to, IBV_QPS_INIT | IBV_QPS_RTR | IBV_QPS_RTS)
        && mask & (IBV_QP_AV | IBV_QP_DEST_QPN) == 0
        && q.state() == IBV_QPS_RTS
        && !q.ib_style.load(std::sync::atomic::Ordering::Acquire)
        && rc.link_state() == engine::QpLinkState::Connected
}

/// Keeps the attributes of an `ibv_modify_qp` for `ibv_query_qp`.
fn remember(q: &QpObj, a: &ibv_qp_attr, mask: c_int) {
    {
        let mut r = q.remembered.lock().unwrap_or_else(|p| p.into_inner());
        let m = &mut r.attr;
        if mask & IBV_QP_ACCESS_FLAGS != 0 {
            m.qp_access_flags = a.qp_access_flags;
        }
        if mask & IBV_QP_PKEY_INDEX != 0 {
            m.pkey_index = a.pkey_index;
        }
        if mask & IBV_QP_PORT != 0 {
            m.port_num = a.port_num;
        }
        if mask & IBV_QP_QKEY != 0 {
            m.qkey = a.qkey;
        }
        if mask & IBV_QP_AV != 0 {
            m.ah_attr = a.ah_attr;
        }
        if mask & IBV_QP_PATH_MTU != 0 {
            m.path_mtu = a.path_mtu;
        }
        if mask & IBV_QP_TIMEOUT != 0 {
            m.timeout = a.timeout;
        }
        if mask & IBV_QP_RETRY_CNT != 0 {
            m.retry_cnt = a.retry_cnt;
        }
        if mask & IBV_QP_RNR_RETRY != 0 {
            m.rnr_retry = a.rnr_retry;
        }
        if mask & IBV_QP_RQ_PSN != 0 {
            m.rq_psn = a.rq_psn;
        }
        if mask & IBV_QP_SQ_PSN != 0 {
            m.sq_psn = a.sq_psn;
        }
        if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
            m.max_rd_atomic = a.max_rd_atomic;
        }
        if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
            m.max_dest_rd_atomic = a.max_dest_rd_atomic;
        }
        if mask & IBV_QP_MIN_RNR_TIMER != 0 {
            m.min_rnr_timer = a.min_rnr_timer;
        }
        if mask & IBV_QP_DEST_QPN != 0 {
            m.dest_qp_num = a.dest_qp_num;
        }
    }
}

/// `ibv_query_qp`.
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard_errno(|| {
        // SAFETY: the application's QP.
        let Some(q) = (unsafe { qp_from_raw(qp) }) else {
            return libc::EINVAL;
        };
        let mut a = q.remembered.lock().unwrap_or_else(|p| p.into_inner()).attr;
        a.qp_state = q.state();
        a.cur_qp_state = a.qp_state;
        a.cap = q.cap;
        if a.path_mtu == 0 {
            a.path_mtu = device::ACTIVE_MTU;
        }
        if a.port_num == 0 {
            a.port_num = 1;
        }
        // SAFETY: the application's out-struct, if any.
        if let Some(out) = unsafe { attr.as_mut() } {
            *out = a;
        }
        // SAFETY: the application's out-struct, if any.
        if let Some(i) = unsafe { init.as_mut() } {
            // SAFETY: the application-visible part of our live QP.
            let b = unsafe { &(*q.raw()).qp_base };
            *i = ibv_qp_init_attr {
                qp_context: b.qp_context,
                send_cq: b.send_cq,
                recv_cq: b.recv_cq,
                srq: b.srq,
                cap: q.cap,
                qp_type: b.qp_type,
                sq_sig_all: c_int::from(q.sq_sig_all),
            };
        }
        0
    })
}

/// `ibv_destroy_qp`: an RC QP's connection is closed.
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard_errno(|| {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: created by Box::into_raw in create_qp_internal, destroyed once.
        let q = unsafe { Box::from_raw(qp as *mut QpObj) };
        unregister_qp(q.qpn());
        datapath::forget_held_sends(q.qpn());
        if let QpKind::Rc(rc) = &q.kind {
            rc.disconnect();
        }
        // SAFETY: only this library writes the QP's object pointers.
        let b = unsafe { &(*q.ex.get()).qp_base };
        // SAFETY: the QP's PD, CQs and SRQ, live (none can go while the QP names it).
        unsafe {
            release_pd(b.pd);
            release_cq(b.send_cq);
            release_cq(b.recv_cq);
            release_srq(b.srq);
        }
        0
    })
}

// ---------------------------------------------------------------------
// Address handles and multicast
// ---------------------------------------------------------------------

/// `ibv_create_ah`: the destination is the GID's address (EINVAL for a
/// port other than 1, a source GID index other than 0 or a GID that is not
/// IPv4-mapped). An AH without
/// a GRH (a LID only, as qperf and other IB programs make them) names a
/// peer on this host: the address of the PD's own device, where that
/// device's datagram QPs are bound (for `softrdma_lo`, loopback).
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard_ptr(|| {
        // SAFETY: the application's attributes or NULL.
        let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
        // As the kernel's rdma_check_ah_attr: the port must exist, and a
        // GRH's source GID index must be in the port's GID table.
        if !port_ok(a.port_num) || (a.is_global != 0 && a.grh.sgid_index != 0) {
            return Err(libc::EINVAL);
        }
        let ip = if a.is_global != 0 {
            ip_of_gid(&a.grh.dgid).ok_or(libc::EINVAL)?
        } else {
            // SAFETY: the application's PD or NULL.
            let p = unsafe { pd_from_raw(pd) }.ok_or(libc::EINVAL)?;
            ctx_of(p.pd.context)?.dev.ip
        };
        // SAFETY: the application's PD or NULL (EINVAL).
        unsafe { create_ah(pd, ip, None) }
    })
}

/// `ibv_init_ah_from_wc`: an AH toward the sender of a datagram receive
/// (its address from the GRH's SGID).
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard_neg(|| {
        ctx_of(ctx)?;
        // SAFETY: the application's completion (or NULL).
        let w = unsafe { wc.as_ref() };
        // SAFETY: the application's GRH buffer (or NULL).
        let g = unsafe { grh.as_ref() };
        // SAFETY: the application's out-struct (or NULL).
        let out = unsafe { ah_attr.as_mut() };
        let (Some(w), Some(g), Some(out)) = (w, g, out) else {
            return Err(libc::EINVAL);
        };
        if w.wc_flags & IBV_WC_GRH == 0 {
            return Err(libc::EINVAL);
        }
        // As rdma-core's: flow label and traffic class from the GRH's
        // first word, hop limit 0xff.
        let flow_class = u32::from_be(g.version_tclass_flow);
        *out = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: g.sgid,
                flow_label: flow_class & 0xf_ffff,
                sgid_index: 0,
                hop_limit: 0xff,
                traffic_class: (flow_class >> 20) as u8,
            },
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            static_rate: 0,
            is_global: 1,
            port_num: port,
        };
        Ok(0)
    })
}

/// `ibv_create_ah_from_wc`.
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    guard_ptr(|| {
        // SAFETY: the application's PD.
        let p = unsafe { pd_from_raw(pd) }.ok_or(libc::EINVAL)?;
        let mut a = ibv_ah_attr::default();
        // SAFETY: forwarded application pointers.
        if unsafe { ibv_init_ah_from_wc(p.pd.context, port, wc, grh, &mut a) } != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        let ah = unsafe { ibv_create_ah(pd, &mut a) };
        if ah.is_null() {
            Err(libc::EINVAL)
        } else {
            Ok(ah)
        }
    })
}

/// `ibv_destroy_ah`.
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard_errno(|| {
        if ah.is_null() {
            return libc::EINVAL;
        }
        if ah_checked(ah).is_none() {
            return libc::EINVAL;
        }
        unregister_ah(ah as *mut AhObj);
        // SAFETY: a live AH of ours (checked above), created by Box::into_raw, destroyed once.
        let a = unsafe { Box::from_raw(ah as *mut AhObj) };
        // SAFETY: the AH's PD, live (it cannot be deallocated while the AH is).
        unsafe { release_pd(a.ah.pd) };
        0
    })
}

/// `ibv_attach_mcast`: UD QPs join the IPv4 group of the GID.
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard_errno(|| mcast(qp, gid, true))
}

/// `ibv_detach_mcast`.
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard_errno(|| mcast(qp, gid, false))
}

fn mcast(qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> c_int {
    // SAFETY: the application's QP and GID.
    let (Some(q), Some(g)) = (unsafe { qp_from_raw(qp) }, unsafe { gid.as_ref() }) else {
        return libc::EINVAL;
    };
    // ibv_attach_mcast(3): only UD QPs join multicast groups (the kernel's
    // ib_attach_mcast: EINVAL for any other type).
    let Some(d) = q.dgram() else {
        return libc::EINVAL;
    };
    let Some(ip) = ip_of_gid(g) else {
        return libc::EINVAL;
    };
    let r = if attach {
        d.attach_mcast(ip)
    } else {
        d.detach_mcast(ip)
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("softrdma: multicast {ip}: {e}");
            libc::EINVAL
        }
    }
}

// ---------------------------------------------------------------------
// Async events
// ---------------------------------------------------------------------

/// `ibv_get_async_event`: blocks for the next event, or fails with
/// `EAGAIN` when there is none and the application made the context's
/// `async_fd` `O_NONBLOCK` ([`AppFd`]). Datagram-only events without a
/// verbs equivalent are not reported here.
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    ev: *mut ibv_async_event,
) -> c_int {
    guard_neg(|| {
        let c = ctx_of(ctx)?;
        if ev.is_null() {
            return Err(libc::EINVAL);
        }
        let e = engine()?;
        loop {
            let next = if c.async_fd.nonblocking() {
                Some(e.async_events().try_get().ok_or(libc::EAGAIN)?)
            } else {
                e.async_events().get(None)
            };
            let Some(a) = next else {
                continue;
            };
            let out = match a {
                AsyncEvent::CqError { cq } => cq_by_id(cq).map(|p| ibv_async_event {
                    element: ibv_async_element {
                        cq: p as *mut ibv_cq,
                    },
                    event_type: IBV_EVENT_CQ_ERR,
                }),
                AsyncEvent::QpFatal { qpn } => qp_ev(qpn, IBV_EVENT_QP_FATAL),
                AsyncEvent::QpAccessError { qpn } => qp_ev(qpn, IBV_EVENT_QP_ACCESS_ERR),
                AsyncEvent::CommEstablished { qpn } => qp_ev(qpn, IBV_EVENT_COMM_EST),
                AsyncEvent::SrqLimitReached { id } => srq_by_id(id).map(|p| {
                    // SAFETY: a registered (live) SRQ of ours; `limit` is atomic.
                    unsafe { (*p).limit.store(0, Ordering::Release) };
                    ibv_async_event {
                        element: ibv_async_element {
                            srq: p as *mut ibv_srq,
                        },
                        event_type: IBV_EVENT_SRQ_LIMIT_REACHED,
                    }
                }),
                _ => None,
            };
            if let Some(o) = out {
                // SAFETY: the application's out-struct.
                unsafe { *ev = o };
                return Ok(0);
            }
        }
    })
}

fn qp_ev(qpn: u32, ty: c_int) -> Option<ibv_async_event> {
    qp_by_num(qpn).map(|p| ibv_async_event {
        element: ibv_async_element {
            qp: p as *mut ibv_qp,
        },
        event_type: ty,
    })
}

/// `ibv_ack_async_event`: nothing to release.
pub unsafe extern "C" fn ibv_ack_async_event(_ev: *mut ibv_async_event) {}

// ---------------------------------------------------------------------
// Fork, strings, rates, sysfs
// ---------------------------------------------------------------------

/// `ibv_fork_init`: registered memory is ordinary memory; nothing to do.
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`.
pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// `ibv_dontfork_range`.
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`.
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

macro_rules! cstr_table {
    ($v:expr, $default:literal; $($n:literal => $s:literal),* $(,)?) => {
        match $v {
            $($n => concat!($s, "\0").as_ptr() as *const c_char,)*
            _ => concat!($default, "\0").as_ptr() as *const c_char,
        }
    };
}

/// `ibv_wc_status_str`.
pub unsafe extern "C" fn ibv_wc_status_str(s: c_int) -> *const c_char {
    if s == 0x1000 {
        return c"softrdma: Write-Record partially placed".as_ptr();
    }
    cstr_table!(s, "unknown";
        0 => "success", 1 => "local length error", 2 => "local QP operation error",
        3 => "local EE context operation error", 4 => "local protection error",
        5 => "Work Request Flushed Error", 6 => "memory management operation error",
        7 => "bad response error", 8 => "local access error", 9 => "remote invalid request error",
        10 => "remote access error", 11 => "remote operation error",
        12 => "transport retry counter exceeded", 13 => "RNR retry counter exceeded",
        14 => "local RDD violation error", 15 => "remote invalid RD request",
        16 => "aborted error", 17 => "invalid EE context number",
        18 => "invalid EE context state", 19 => "fatal error", 20 => "response timeout error",
        21 => "general error", 22 => "TM error", 23 => "TM rendezvous incomplete")
}

/// `ibv_event_type_str`.
pub unsafe extern "C" fn ibv_event_type_str(e: c_int) -> *const c_char {
    cstr_table!(e, "unknown";
        0 => "CQ error", 1 => "local work queue catastrophic error",
        2 => "invalid request local work queue error", 3 => "local access violation work queue error",
        4 => "communication established", 5 => "send queue drained", 6 => "path migrated",
        7 => "path migration request error", 8 => "local catastrophic error", 9 => "port active",
        10 => "port error", 11 => "LID change", 12 => "P_Key change", 13 => "SM change",
        14 => "SRQ catastrophic error", 15 => "SRQ limit reached",
        16 => "last WQE reached", 17 => "client reregistration", 18 => "GID table change",
        19 => "WQ fatal")
}

/// `ibv_node_type_str`.
pub unsafe extern "C" fn ibv_node_type_str(t: c_int) -> *const c_char {
    cstr_table!(t, "unknown";
        1 => "InfiniBand channel adapter", 2 => "InfiniBand switch", 3 => "InfiniBand router",
        4 => "iWARP NIC", 5 => "usNIC", 6 => "usNIC UDP", 7 => "unspecified")
}

/// `ibv_port_state_str`.
pub unsafe extern "C" fn ibv_port_state_str(s: c_int) -> *const c_char {
    cstr_table!(s, "invalid state";
        0 => "no state change (NOP)", 1 => "down", 2 => "init", 3 => "armed",
        4 => "active", 5 => "active defer")
}

const RATES: &[(c_int, c_int, c_int)] = &[
    // (enum, multiple of 2.5 Gb/s, Mb/s)
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, 0, 14062),
    (12, 0, 56250),
    (13, 0, 112500),
    (14, 0, 168750),
    (15, 10, 25781),
    (16, 40, 103125),
    (17, 80, 206250),
    (18, 120, 309375),
    (19, 11, 28125),
    (20, 20, 53125),
    (21, 160, 425000),
    (22, 240, 637500),
    (23, 320, 850000),
    (24, 480, 1275000),
];

/// `ibv_rate_to_mult`.
pub unsafe extern "C" fn ibv_rate_to_mult(r: c_int) -> c_int {
    RATES.iter().find(|x| x.0 == r).map_or(-1, |x| x.1)
}

/// `mult_to_ibv_rate`.
pub unsafe extern "C" fn mult_to_ibv_rate(m: c_int) -> c_int {
    RATES.iter().find(|x| x.1 == m && m != 0).map_or(0, |x| x.0)
}

/// `ibv_rate_to_mbps`.
pub unsafe extern "C" fn ibv_rate_to_mbps(r: c_int) -> c_int {
    RATES.iter().find(|x| x.0 == r).map_or(-1, |x| x.2)
}

/// `mbps_to_ibv_rate`.
pub unsafe extern "C" fn mbps_to_ibv_rate(m: c_int) -> c_int {
    RATES.iter().find(|x| x.2 == m).map_or(0, |x| x.0)
}

/// `ibv_get_sysfs_path`.
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` (softrdma devices have no
/// sysfs nodes, so for them this fails with -1, as for a missing file).
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    guard(-1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return -1;
        }
        // SAFETY: NUL-terminated strings of the caller.
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
        let Ok(mut data) = std::fs::read(path) else {
            return -1;
        };
        data.truncate(size - 1);
        if data.last() == Some(&b'\n') {
            data.pop();
        }
        // SAFETY: buf has size octets; we write at most size.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), buf as *mut u8, data.len());
            *buf.add(data.len()) = 0;
        }
        data.len() as c_int
    })
}

/// `ibv_resolve_eth_l2_from_gid`: there is no Ethernet L2 below softrdma.
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    _ctx: *mut ibv_context,
    _attr: *mut ibv_ah_attr,
    _mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_register_driver`: providers do not apply to softrdma.
pub unsafe extern "C" fn ibv_register_driver(_name: *const c_char, _init: *mut c_void) {}

/// `ibv_query_qp_data_in_order`: RC delivers a message's data in order
/// (TCP), so `IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG` for RC; 0 otherwise.
pub unsafe extern "C" fn ibv_query_qp_data_in_order(
    qp: *mut ibv_qp,
    _op: c_int,
    _flags: u32,
) -> c_int {
    // SAFETY: the application's QP.
    guard(0, || match unsafe { qp_from_raw(qp) } {
        Some(q) if q.rc().is_some() => 1,
        _ => 0,
    })
}

/// `ibv_query_ece` / `ibv_set_ece`: no enhanced connection establishment.
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_set_ece`.
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_import_device` (and the other import calls): no shared kernel
/// objects to import.
pub unsafe extern "C" fn ibv_import_device(_fd: c_int) -> *mut ibv_context {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_pd`.
pub unsafe extern "C" fn ibv_import_pd(_c: *mut ibv_context, _h: u32) -> *mut ibv_pd {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_mr`.
pub unsafe extern "C" fn ibv_import_mr(_p: *mut ibv_pd, _h: u32) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_dm`.
pub unsafe extern "C" fn ibv_import_dm(_c: *mut ibv_context, _h: u32) -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_unimport_pd` (nothing was imported).
pub unsafe extern "C" fn ibv_unimport_pd(_p: *mut ibv_pd) {}

/// `ibv_unimport_mr`.
pub unsafe extern "C" fn ibv_unimport_mr(_m: *mut ibv_mr) {}

/// `ibv_unimport_dm`.
pub unsafe extern "C" fn ibv_unimport_dm(_d: *mut c_void) {}

export!(
    ibv_get_device_list,
    ibv_free_device_list,
    ibv_get_device_name,
    ibv_get_device_guid,
    ibv_get_device_index,
    ibv_open_device,
    ibv_close_device,
    ibv_query_device,
    ibv_query_port,
    ibv_query_gid,
    ibv_query_gid_type,
    _ibv_query_gid_ex,
    _ibv_query_gid_table,
    ibv_query_pkey,
    ibv_get_pkey_index,
    ibv_alloc_pd,
    ibv_dealloc_pd,
    ibv_reg_mr,
    ibv_reg_mr_iova,
    ibv_reg_mr_iova2,
    ibv_dereg_mr,
    ibv_rereg_mr,
    ibv_reg_dmabuf_mr,
    ibv_create_comp_channel,
    ibv_destroy_comp_channel,
    ibv_create_cq,
    ibv_resize_cq,
    ibv_destroy_cq,
    ibv_get_cq_event,
    ibv_ack_cq_events,
    ibv_create_srq,
    ibv_modify_srq,
    ibv_query_srq,
    ibv_destroy_srq,
    ibv_create_qp,
    ibv_modify_qp,
    ibv_query_qp,
    ibv_destroy_qp,
    ibv_create_ah,
    ibv_init_ah_from_wc,
    ibv_create_ah_from_wc,
    ibv_destroy_ah,
    ibv_attach_mcast,
    ibv_detach_mcast,
    ibv_get_async_event,
    ibv_ack_async_event,
    ibv_fork_init,
    ibv_is_fork_initialized,
    ibv_dontfork_range,
    ibv_dofork_range,
    ibv_wc_status_str,
    ibv_event_type_str,
    ibv_node_type_str,
    ibv_port_state_str,
    ibv_rate_to_mult,
    mult_to_ibv_rate,
    ibv_rate_to_mbps,
    mbps_to_ibv_rate,
    ibv_get_sysfs_path,
    ibv_read_sysfs_file,
    ibv_resolve_eth_l2_from_gid,
    ibv_register_driver,
    ibv_query_qp_data_in_order,
    ibv_query_ece,
    ibv_set_ece,
    ibv_import_device,
    ibv_import_pd,
    ibv_import_mr,
    ibv_import_dm,
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
);
