//! The C structures of librdmacm (rdma-core 44, `rdma/rdma_cma.h`,
//! x86_64) that clients or header inlines touch, for the rdma_cm
//! implementation in [`crate::rdmacm`]. Checked against the installed
//! headers by `tests/layout.rs`, like [`crate::abi`].

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_int, c_void};

use crate::abi::*;

/// `struct sockaddr_storage` (128 octets, 8-aligned).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct sockaddr_storage(pub [u8; 128]);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    pub pkey: u16,
}

/// `struct rdma_addr`: source and destination as `sockaddr_storage`
/// (the header's unions also name them `src_addr`/`src_sin`/...).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src_addr: sockaddr_storage,
    pub dst_addr: sockaddr_storage,
    pub addr: rdma_ib_addr,
}

#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut c_void,
    pub num_paths: c_int,
}

#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut libc::sockaddr,
}

/// Adds this module's structures to the layout table.
pub(crate) fn layout_rows(out: &mut Layout) {
    layout! { out;
        rdma_ib_addr { sgid, dgid, pkey }
        rdma_addr { src_addr => "src_storage", dst_addr => "dst_storage", addr }
        rdma_route { addr, path_rec, num_paths }
        rdma_event_channel { fd }
        rdma_cm_id { verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
            send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type }
        rdma_conn_param { private_data, private_data_len, responder_resources, initiator_depth,
            flow_control, retry_count, rnr_retry_count, srq, qp_num }
        rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_addrinfo { ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
            ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next }
        rdma_cm_join_mc_attr_ex { comp_mask, join_flags, addr }
    }
    out.push_field("rdma_cm_event", "param.ud.ah_attr", 40, 32);
    out.push_field("rdma_cm_event", "param.ud.qp_num", 72, 4);
    out.push_field("rdma_cm_event", "param.conn.qp_num", 40, 4);
}
