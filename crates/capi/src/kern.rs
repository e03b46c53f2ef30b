//! `ibv_copy_*_kern` (`IBVERBS_1.0`/`1.1`): conversions between the kernel
//! uverbs/SA structures and the verbs ones. softrdma has no kernel side;
//! these exist because the *system* librdmacm imports them, so a program
//! that still loads it (before our librdmacm.so.1 is in place) links.
//! They copy field by field as rdma-core does.

#![allow(non_camel_case_types, missing_docs)]

use crate::abi::*;
use crate::export::{export, guard};

/// `struct ib_uverbs_global_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ib_uverbs_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reserved: u8,
}

/// `struct ib_uverbs_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ib_uverbs_ah_attr {
    pub grh: ib_uverbs_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
    pub reserved: u8,
}

/// `struct ib_uverbs_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ib_uverbs_qp_attr {
    pub qp_attr_mask: u32,
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub ah_attr: ib_uverbs_ah_attr,
    pub alt_ah_attr: ib_uverbs_ah_attr,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub reserved: [u8; 5],
}

/// `struct ib_user_path_rec`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ib_user_path_rec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: u32,
    pub flow_label: u32,
    pub reversible: u32,
    pub mtu: u32,
    pub pkey: u16,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub numb_path: u8,
    pub sl: u8,
    pub mtu_selector: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct ibv_sa_path_rec` (`infiniband/sa.h`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: i32,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: i32,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

fn ah_from_kern(s: &ib_uverbs_ah_attr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: s.grh.dgid },
            flow_label: s.grh.flow_label,
            sgid_index: s.grh.sgid_index,
            hop_limit: s.grh.hop_limit,
            traffic_class: s.grh.traffic_class,
        },
        dlid: s.dlid,
        sl: s.sl,
        src_path_bits: s.src_path_bits,
        static_rate: s.static_rate,
        is_global: s.is_global,
        port_num: s.port_num,
    }
}

/// `ibv_copy_ah_attr_from_kern`.
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(
    dst: *mut ibv_ah_attr,
    src: *const ib_uverbs_ah_attr,
) {
    guard((), || {
        // SAFETY: the caller's structures.
        if let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) {
            *d = ah_from_kern(s);
        }
    })
}

/// `ibv_copy_qp_attr_from_kern`.
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(
    dst: *mut ibv_qp_attr,
    src: *const ib_uverbs_qp_attr,
) {
    guard((), || {
        // SAFETY: the caller's structures.
        let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
            return;
        };
        *d = ibv_qp_attr {
            qp_state: s.qp_state as i32,
            cur_qp_state: s.cur_qp_state as i32,
            path_mtu: s.path_mtu as i32,
            path_mig_state: s.path_mig_state as i32,
            qkey: s.qkey,
            rq_psn: s.rq_psn,
            sq_psn: s.sq_psn,
            dest_qp_num: s.dest_qp_num,
            qp_access_flags: s.qp_access_flags,
            cap: ibv_qp_cap {
                max_send_wr: s.max_send_wr,
                max_recv_wr: s.max_recv_wr,
                max_send_sge: s.max_send_sge,
                max_recv_sge: s.max_recv_sge,
                max_inline_data: s.max_inline_data,
            },
            ah_attr: ah_from_kern(&s.ah_attr),
            alt_ah_attr: ah_from_kern(&s.alt_ah_attr),
            pkey_index: s.pkey_index,
            alt_pkey_index: s.alt_pkey_index,
            en_sqd_async_notify: s.en_sqd_async_notify,
            sq_draining: s.sq_draining,
            max_rd_atomic: s.max_rd_atomic,
            max_dest_rd_atomic: s.max_dest_rd_atomic,
            min_rnr_timer: s.min_rnr_timer,
            port_num: s.port_num,
            timeout: s.timeout,
            retry_cnt: s.retry_cnt,
            rnr_retry: s.rnr_retry,
            alt_port_num: s.alt_port_num,
            alt_timeout: s.alt_timeout,
            rate_limit: 0,
        };
    })
}

/// `ibv_copy_path_rec_from_kern`.
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(
    dst: *mut ibv_sa_path_rec,
    src: *const ib_user_path_rec,
) {
    guard((), || {
        // SAFETY: the caller's structures.
        let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
            return;
        };
        *d = ibv_sa_path_rec {
            dgid: ibv_gid { raw: s.dgid },
            sgid: ibv_gid { raw: s.sgid },
            dlid: s.dlid,
            slid: s.slid,
            raw_traffic: s.raw_traffic as i32,
            flow_label: s.flow_label,
            hop_limit: s.hop_limit,
            traffic_class: s.traffic_class,
            reversible: s.reversible as i32,
            numb_path: s.numb_path,
            pkey: s.pkey,
            sl: s.sl,
            mtu_selector: s.mtu_selector,
            mtu: s.mtu as u8,
            rate_selector: s.rate_selector,
            rate: s.rate,
            packet_life_time_selector: s.packet_life_time_selector,
            packet_life_time: s.packet_life_time,
            preference: s.preference,
        };
    })
}

/// `ibv_copy_path_rec_to_kern`.
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(
    dst: *mut ib_user_path_rec,
    src: *const ibv_sa_path_rec,
) {
    guard((), || {
        // SAFETY: the caller's structures.
        let (Some(d), Some(s)) = (unsafe { dst.as_mut() }, unsafe { src.as_ref() }) else {
            return;
        };
        *d = ib_user_path_rec {
            dgid: s.dgid.raw,
            sgid: s.sgid.raw,
            dlid: s.dlid,
            slid: s.slid,
            raw_traffic: s.raw_traffic as u32,
            flow_label: s.flow_label,
            reversible: s.reversible as u32,
            mtu: u32::from(s.mtu),
            pkey: s.pkey,
            hop_limit: s.hop_limit,
            traffic_class: s.traffic_class,
            numb_path: s.numb_path,
            sl: s.sl,
            mtu_selector: s.mtu_selector,
            rate_selector: s.rate_selector,
            rate: s.rate,
            packet_life_time_selector: s.packet_life_time_selector,
            packet_life_time: s.packet_life_time,
            preference: s.preference,
        };
    })
}

export!(
    ibv_copy_ah_attr_from_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_path_rec_to_kern,
);
