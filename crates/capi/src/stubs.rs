//! `IBVERBS_PRIVATE_34`: the provider interface of rdma-core 44 that the
//! system's `libmlx5.so.1`/`libefa.so.1` import when a program (perftest)
//! links them. The dynamic loader needs the names to exist; nothing calls
//! them for a softrdma device (perftest takes the mlx5dv/efadv paths only
//! for Mellanox/Amazon vendor ids). So: `verbs_register_driver_34` (run by
//! libmlx5's constructor) registers nothing, `verbs_allow_disassociate_destroy`
//! is the data object it is upstream, every `ibv_cmd_*` and
//! `execute_ioctl` returns EOPNOTSUPP, the allocating calls return NULL
//! with errno EOPNOTSUPP, and the `void` ones do nothing.

use std::ffi::{c_int, c_void};

use crate::export::{export_as, set_errno};

/// Every `ibv_cmd_*` and `execute_ioctl`: no kernel below.
unsafe extern "C" fn stub_eopnotsupp() -> c_int {
    libc::EOPNOTSUPP
}

/// Allocating provider calls.
unsafe extern "C" fn stub_null() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `void` provider calls (logging, driver registration, op tables).
unsafe extern "C" fn stub_void() {}

export_as!(stub_eopnotsupp =>
    execute_ioctl,
    ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw, ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast, ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters,
    ibv_cmd_create_cq_ex, ibv_cmd_create_flow, ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp_ex, ibv_cmd_create_qp_ex2, ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq, ibv_cmd_create_srq_ex, ibv_cmd_create_wq, ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd, ibv_cmd_dereg_mr, ibv_cmd_destroy_ah, ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq, ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action, ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq, ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context, ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp, ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq, ibv_cmd_modify_wq, ibv_cmd_open_qp, ibv_cmd_open_xrcd,
    ibv_cmd_query_context, ibv_cmd_query_device_any, ibv_cmd_query_mr, ibv_cmd_query_port,
    ibv_cmd_query_qp, ibv_cmd_query_srq, ibv_cmd_read_counters, ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr, ibv_cmd_rereg_mr, ibv_cmd_resize_cq,
);
export_as!(stub_null => _verbs_init_and_alloc_context, verbs_open_device);
export_as!(stub_void =>
    __verbs_log, verbs_init_cq, verbs_register_driver_34, verbs_set_ops, verbs_uninit_context,
);

// `bool verbs_allow_disassociate_destroy` (a 1-octet data object upstream).
std::arch::global_asm!(
    ".pushsection .data.verbs_allow_disassociate_destroy,\"aw\",@progbits",
    ".globl verbs_allow_disassociate_destroy",
    ".type verbs_allow_disassociate_destroy, @object",
    ".size verbs_allow_disassociate_destroy, 1",
    "verbs_allow_disassociate_destroy:",
    ".byte 0",
    ".popsection",
);
