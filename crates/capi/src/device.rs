//! The device model: one device per IPv4 interface that is
//! up, named `softrdma_<ifname>` (stable across runs), listed
//! non-loopback first in interface order, then loopback.
//!
//! Each device: node type RNIC, transport iWARP, one port, link layer
//! Ethernet, port ACTIVE, active MTU 4096, a one-entry GID table holding
//! the interface's IPv4 address as an IPv4-mapped GID (RoCE v2 type, so
//! tools that pick "the IPv4 GID" find it). The vendor id is softrdma's
//! own ([`VENDOR_ID`]), neither Mellanox's nor Amazon's, so perftest does
//! not take its mlx5dv/efadv paths.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;

use crate::abi::*;

/// softrdma's vendor id (ASCII "sof"; not 0x02c9/0x15b3 Mellanox, not
/// 0x1d0f Amazon).
pub const VENDOR_ID: u32 = 0x73_6f66;
/// Vendor part id.
pub const VENDOR_PART_ID: u32 = 1;
/// Receive-queue and send-queue depth limits reported.
pub const MAX_QP_WR: i32 = 16384;
/// Most RDMA Reads/atomics in flight per QP, each direction.
pub const MAX_RD_ATOM: i32 = 16;

/// The most entries a CQ may have (`max_cqe`).
pub const MAX_CQE: i32 = 1 << 20;
/// The active MTU reported (`IBV_MTU_4096`): UD messages are segmented, so
/// this is a message-size promise, not a datagram size.
pub const ACTIVE_MTU: i32 = IBV_MTU_4096;

/// A device: what `ibv_get_device_list` hands out.
#[repr(C)]
pub struct DevObj {
    /// What the application sees.
    pub dev: ibv_device,
    /// The interface name.
    pub ifname: String,
    /// The interface's address (GID index 0).
    pub ip: IpAddr,
    /// Position in the list.
    pub index: usize,
    /// Node GUID (host order).
    pub guid: u64,
}

// SAFETY: DevObj is immutable after creation (it lives in a static list); the raw pointers in ibv_device's _ops are always NULL.
unsafe impl Sync for DevObj {}
// SAFETY: as above.
unsafe impl Send for DevObj {}

impl DevObj {
    /// The device's name (`softrdma_<ifname>`).
    pub fn name(&self) -> &str {
        // SAFETY: `name` was written NUL-terminated by `make`.
        let c = unsafe { CStr::from_ptr(self.dev.name.as_ptr()) };
        c.to_str().unwrap_or("")
    }

    /// The pointer the application uses.
    pub fn raw(&self) -> *mut ibv_device {
        &self.dev as *const ibv_device as *mut ibv_device
    }
}

fn copy_str(dst: &mut [std::ffi::c_char], s: &str) {
    let n = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as std::ffi::c_char;
    }
}

fn make(index: usize, ifname: &str, ip: Ipv4Addr) -> DevObj {
    let name = format!("softrdma_{ifname}");
    let mut dev = ibv_device {
        _ops: _ibv_device_ops {
            _dummy1: std::ptr::null_mut(),
            _dummy2: std::ptr::null_mut(),
        },
        node_type: IBV_NODE_RNIC,
        transport_type: IBV_TRANSPORT_IWARP,
        name: [0; IBV_SYSFS_NAME_MAX],
        dev_name: [0; IBV_SYSFS_NAME_MAX],
        dev_path: [0; IBV_SYSFS_PATH_MAX],
        ibdev_path: [0; IBV_SYSFS_PATH_MAX],
    };
    copy_str(&mut dev.name, &name);
    copy_str(&mut dev.dev_name, &format!("softrdma{index}"));
    // Paths that do not exist: there is no sysfs node (ibv_devinfo's
    // board_id read fails quietly).
    copy_str(
        &mut dev.dev_path,
        &format!("/sys/class/infiniband_verbs/softrdma{index}"),
    );
    copy_str(
        &mut dev.ibdev_path,
        &format!("/sys/class/infiniband/{name}"),
    );
    let o = ip.octets();
    // "sr" + 0x0000 + IPv4: stable per address, never zero.
    let guid = 0x7372_0000_0000_0000 | u64::from(u32::from_be_bytes(o));
    DevObj {
        dev,
        ifname: ifname.to_string(),
        ip: IpAddr::V4(ip),
        index,
        guid,
    }
}

/// The IPv4 interfaces that are up, (name, address), first address of
/// each, in `getifaddrs` order.
fn interfaces() -> Vec<(String, Ipv4Addr, bool)> {
    let mut out: Vec<(String, Ipv4Addr, bool)> = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head to ifap; freed below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the family it names.
        let fam = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(fam) != libc::AF_INET {
            continue;
        }
        // SAFETY: family AF_INET means a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: ifa_name is a NUL-terminated string of the node.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        if out.iter().any(|(n, _, _)| *n == name) {
            continue;
        }
        let lo = ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0;
        out.push((name, ip, lo));
    }
    // SAFETY: ifap came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

/// The devices, enumerated once per process.
pub fn devices() -> &'static [DevObj] {
    static DEVS: OnceLock<Vec<DevObj>> = OnceLock::new();
    DEVS.get_or_init(|| {
        let mut ifs = interfaces();
        // Non-loopback first (stable: getifaddrs order), loopback last.
        ifs.sort_by_key(|(_, _, lo)| *lo);
        if ifs.is_empty() {
            ifs.push(("lo".into(), Ipv4Addr::LOCALHOST, true));
        }
        ifs.iter()
            .enumerate()
            .map(|(i, (n, ip, _))| make(i, n, *ip))
            .collect()
    })
}

/// The device owning `ip`: the interface with that address; a loopback
/// address maps to the loopback device; an unspecified address to the
/// first device.
pub fn device_for_ip(ip: IpAddr) -> Option<&'static DevObj> {
    let devs = devices();
    let ip = ip.to_canonical();
    if let Some(d) = devs.iter().find(|d| d.ip == ip) {
        return Some(d);
    }
    if ip.is_loopback() {
        return devs.iter().find(|d| d.ip.is_loopback());
    }
    if ip.is_unspecified() {
        return devs.first();
    }
    None
}

/// `ibv_query_device` for a device.
pub fn device_attr(d: &DevObj) -> ibv_device_attr {
    let mut fw = [0 as std::ffi::c_char; 64];
    copy_str(&mut fw, concat!("softrdma ", env!("CARGO_PKG_VERSION")));
    ibv_device_attr {
        fw_ver: fw,
        node_guid: d.guid.to_be(),
        sys_image_guid: d.guid.to_be(),
        max_mr_size: u64::MAX,
        page_size_cap: 0x1000,
        vendor_id: VENDOR_ID,
        vendor_part_id: VENDOR_PART_ID,
        hw_ver: 0,
        max_qp: 1 << 16,
        max_qp_wr: MAX_QP_WR,
        device_cap_flags: 0,
        max_sge: softrdma_proto::wr::MAX_SGE as i32,
        max_sge_rd: softrdma_proto::wr::MAX_SGE as i32,
        max_cq: 1 << 16,
        max_cqe: MAX_CQE,
        max_mr: (1 << 24) - 2,
        max_pd: 1 << 20,
        max_qp_rd_atom: MAX_RD_ATOM,
        max_ee_rd_atom: 0,
        max_res_rd_atom: MAX_RD_ATOM * (1 << 16),
        max_qp_init_rd_atom: MAX_RD_ATOM,
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 0,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 256,
        max_mcast_qp_attach: 256,
        max_total_mcast_qp_attach: 256 * 256,
        max_ah: 1 << 20,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: 1 << 16,
        max_srq_wr: MAX_QP_WR,
        max_srq_sge: softrdma_proto::wr::MAX_SGE as i32,
        max_pkeys: 1,
        local_ca_ack_delay: 0,
        phys_port_cnt: 1,
    }
}

/// `ibv_query_port` for a device's port 1.
pub fn port_attr(_d: &DevObj) -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: ACTIVE_MTU,
        gid_tbl_len: 1,
        // IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS
        port_cap_flags: (1 << 16) | (1 << 26),
        max_msg_sz: 1 << 31,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // 4X, 25 Gb/s-class (IBV_SPEED_EDR = 32): a nominal figure.
        active_width: 2,
        active_speed: 32,
        // LINK_UP
        phys_state: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: 0,
        port_cap_flags2: 0,
    }
}
