//! Conformance with rdma-core 44's man pages: one C program per group of
//! pages (`tests/c/conf_*.c`), compiled against the installed
//! `<infiniband/verbs.h>` and run against this crate's libibverbs.so
//! through `softrdma run`, as `c_example.rs` runs its programs.
//!
//! Each program checks, page by page, the documented errors (a refused
//! argument gives the documented return value and errno, and leaves the
//! object as it was) and the round trips (what create/modify set is what
//! query returns, limits reported by `ibv_query_device` are the limits
//! enforced), and prints `<program>: <page>: OK` per page. The test asserts
//! every page it expects was reported, so a check that stops early fails.
//!
//! * `conf_device.c`: device list, names, GUID, index, open/close,
//!   `ibv_query_device(_ex)`, `ibv_query_port`, GIDs, P_Keys, async events,
//!   fork, the string and rate helpers;
//! * `conf_pd_mr.c`: PDs and `ibv_reg_mr`/`_iova`/`_iova2`;
//! * `conf_cq.c`: completion channels and CQs (`ibv_create_cq(_ex)`,
//!   `ibv_req_notify_cq`, `ibv_poll_cq`);
//! * `conf_qp.c`: `ibv_create_qp(_ex)`, `ibv_modify_qp`/`ibv_query_qp` round
//!   trips for RC and UD, `ibv_post_send`/`ibv_post_recv` errors;
//! * `conf_srq.c`: `ibv_create_srq(_ex)`, `ibv_modify_srq`/`ibv_query_srq`,
//!   `ibv_post_srq_recv`;
//! * `conf_ah_mcast.c`: address handles (also from a received
//!   completion), completion events, multicast;
//! * `conf_unsupported.c`: the verbs softrdma does not offer return the
//!   documented "not supported" error (README, "Verbs not supported").

mod common;

use std::path::Path;
use std::process::Command;

/// Compiles `tests/c/<stem>.c`, runs it, and asserts it reported every page
/// in `pages` and finished.
fn conform(stem: &str, pages: &[&str]) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::target_dir();
    common::softrdma();
    let src = manifest.join(format!("tests/c/{stem}.c"));
    let out = std::env::temp_dir().join(format!("softrdma-{stem}-{}", std::process::id()));
    let cc = Command::new("timeout")
        .args(["120", "cc", "-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-L")
        .arg(&dir)
        .arg("-libverbs")
        .output()
        .expect("cc (scripts/install-test-deps.sh installs libibverbs-dev)");
    assert!(
        cc.status.success(),
        "compiling {stem}.c failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let d = common::run(out.to_str().expect("utf-8 path"), &[]);
    let _ = std::fs::remove_file(&out);
    let lines: Vec<String> = pages.iter().map(|p| format!("{stem}: {p}: OK")).collect();
    let mut needles: Vec<&str> = lines.iter().map(String::as_str).collect();
    let done = format!("{stem}: OK");
    needles.push(&done);
    d.assert_ok(stem, &needles);
}

#[test]
fn device_and_context_pages() {
    conform(
        "conf_device",
        &[
            "ibv_get_device_list",
            "ibv_get_device_name",
            "ibv_get_device_index",
            "ibv_open_device",
            "ibv_query_device",
            "ibv_get_device_guid",
            "ibv_query_device_ex",
            "ibv_query_port",
            "ibv_query_gid",
            "ibv_query_gid_ex",
            "ibv_query_gid_table",
            "ibv_query_pkey",
            "ibv_get_pkey_index",
            "ibv_get_async_event",
            "ibv_fork_init",
            "ibv_is_fork_initialized",
            "ibv_node_type_str",
            "ibv_port_state_str",
            "ibv_event_type_str",
            "ibv_wc_status_str",
            "ibv_rate_to_mult",
            "ibv_rate_to_mbps",
            "ibv_close_device",
        ],
    );
}

#[test]
fn pd_and_mr_pages() {
    conform(
        "conf_pd_mr",
        &[
            "ibv_alloc_pd",
            "ibv_reg_mr",
            "ibv_reg_mr_iova",
            "ibv_dereg_mr",
            "ibv_dealloc_pd",
        ],
    );
}

#[test]
fn cq_pages() {
    conform(
        "conf_cq",
        &[
            "ibv_create_comp_channel",
            "ibv_poll_cq",
            "ibv_req_notify_cq",
            "ibv_get_cq_event",
            "ibv_ack_cq_events",
            "ibv_create_cq",
            "ibv_destroy_cq",
            "ibv_create_cq_ex",
        ],
    );
}

#[test]
fn qp_pages() {
    conform(
        "conf_qp",
        &[
            "ibv_create_qp",
            "ibv_post_send",
            "ibv_post_recv",
            "ibv_modify_qp",
            "ibv_query_qp",
            "ibv_create_qp_ex",
            "ibv_destroy_qp",
        ],
    );
}

#[test]
fn srq_pages() {
    conform(
        "conf_srq",
        &[
            "ibv_create_srq",
            "ibv_post_srq_recv",
            "ibv_get_async_event",
            "ibv_modify_srq",
            "ibv_query_srq",
            "ibv_destroy_srq",
            "ibv_create_srq_ex",
        ],
    );
}

#[test]
fn ah_event_and_multicast_pages() {
    conform(
        "conf_ah_mcast",
        &[
            "ibv_poll_cq",
            "ibv_req_notify_cq",
            "ibv_get_cq_event",
            "ibv_create_ah_from_wc",
            "ibv_req_notify_cq solicited_only",
            "ibv_ack_cq_events",
            "ibv_attach_mcast",
            "ibv_create_ah",
        ],
    );
}

#[test]
fn unsupported_verbs_say_so() {
    conform(
        "conf_unsupported",
        &[
            "ibv_alloc_mw",
            "ibv_alloc_mw type 2",
            "ibv_bind_mw",
            "ibv_dealloc_mw",
            "ibv_open_xrcd",
            "ibv_create_qp_ex IBV_QPT_XRC_SEND",
            "ibv_open_qp",
            "ibv_get_srq_num",
            "ibv_create_qp IBV_QPT_RAW_PACKET",
            "ibv_create_qp UD on an SRQ",
            "ibv_create_qp_ex IBV_QP_EX_WITH_ATOMIC_WRITE",
            "ibv_create_qp_ex IBV_QP_EX_WITH_TSO",
            "ibv_create_flow",
            "ibv_create_flow_action",
            "ibv_alloc_dm",
            "ibv_import_dm",
            "ibv_alloc_td",
            "ibv_alloc_parent_domain",
            "ibv_create_wq",
            "ibv_create_rwq_ind_table",
            "ibv_create_counters",
            "ibv_alloc_null_mr",
            "ibv_reg_dmabuf_mr",
            "ibv_advise_mr",
            "ibv_modify_cq",
            "ibv_query_rt_values_ex",
            "ibv_modify_qp_rate_limit",
            "ibv_post_srq_ops",
            "ibv_query_ece",
            "ibv_set_ece",
            "ibv_import_device",
            "ibv_import_pd",
            "ibv_import_mr",
            "ibv_post_send IBV_WR_BIND_MW",
            "ibv_post_send IBV_WR_TSO",
        ],
    );
}
