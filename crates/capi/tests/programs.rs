//! Debian's unmodified rdma-core and perftest binaries over softrdma's
//! libibverbs.so.1, through `softrdma run`, server and client as separate
//! processes on loopback (device `softrdma_lo`). Each must exit 0 with the
//! output it prints on success. Requires `scripts/install-test-deps.sh`
//! (ibverbs-utils, perftest).

mod common;

use common::{finish, free_port, pair, run};

const DEV: &str = "softrdma_lo";

/// The harness itself: a program killed at its deadline leaves its
/// threads' stacks and the output it had buffered (a hang in CI must be
/// diagnosable from the log alone). Needs gdb and ptrace rights (root in
/// CI); without them the kernel wait channels stand in for the stacks.
#[test]
fn a_program_killed_at_its_deadline_leaves_stacks_and_output() {
    let dir = std::env::temp_dir().join(format!("softrdma-hang-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("hang.c");
    let exe = dir.join("hang");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <unistd.h>\n\
         int main(void) { printf(\"partial result\\n\"); for (;;) pause(); }\n",
    )
    .unwrap();
    let cc = std::process::Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(cc.success());
    let child = std::process::Command::new(&exe)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let d = finish(child, t0 + std::time::Duration::from_millis(300));
    assert!(d.timed_out && d.code.is_none(), "{d:?}");
    // gdb can attach when it is installed and this process may trace
    // (CAP_SYS_PTRACE, bit 19 of the effective set: root outside a
    // container that drops it).
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let may_trace = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 19) != 0);
    let gdb = std::process::Command::new("gdb")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let from_gdb = !d.stacks.contains("wait channels");
    if may_trace && gdb {
        assert!(
            from_gdb,
            "gdb could attach but gave no stacks: {}",
            d.stacks
        );
    }
    if from_gdb {
        assert!(d.stacks.contains("main"), "gdb stacks: {}", d.stacks);
        assert!(d.stdout.contains("partial result"), "flushed: {d:?}");
    } else {
        eprintln!("no stacks from gdb here: checking the wait-channel fallback");
        assert!(d.stacks.contains("hang"), "{}", d.stacks);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ibv_devices_lists_softrdma_devices() {
    let d = run("ibv_devices", &[]);
    d.assert_ok(
        "ibv_devices",
        &["device", "node GUID", "softrdma_lo", "737200007f000001"],
    );
}

#[test]
fn ibv_devinfo_verbose_describes_the_device() {
    let d = run("ibv_devinfo", &["-v", "-d", DEV]);
    d.assert_ok(
        "ibv_devinfo -v",
        &[
            "hca_id:\tsoftrdma_lo",
            "transport:\t\t\tiWARP (1)",
            "vendor_id:\t\t\t0x736f66",
            "state:\t\t\tPORT_ACTIVE (4)",
            "link_layer:\t\tEthernet",
            "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2",
        ],
    );
}

/// The IB-style pingpongs: `-g 0` puts the IPv4-mapped GID in the
/// exchange.
fn pingpong(prog: &str, extra: &[&str]) {
    pingpong_n(prog, extra, "1000 iters in")
}

fn pingpong_n(prog: &str, extra: &[&str], iters: &str) {
    let port = free_port().to_string();
    let mut s = vec!["-d", DEV, "-g", "0", "-p", &port];
    s.extend_from_slice(extra);
    let mut c = s.clone();
    c.push("127.0.0.1");
    let (sd, cd) = pair(prog, &s, &c, port.parse().unwrap());
    for (who, d) in [("server", &sd), ("client", &cd)] {
        d.assert_ok(
            &format!("{prog} {who}"),
            &["local address:", "remote address:", iters],
        );
    }
}

#[test]
fn ibv_rc_pingpong() {
    pingpong("ibv_rc_pingpong", &[]);
}

#[test]
fn ibv_rc_pingpong_events() {
    // `-e`: completion channel + ibv_get_cq_event. The peer's close at the
    // end must not surface as flushed receives (IB keeps them posted).
    pingpong("ibv_rc_pingpong", &["-e"]);
}

#[test]
fn ibv_rc_pingpong_64k_messages() {
    pingpong_n(
        "ibv_rc_pingpong",
        &["-s", "65536", "-n", "200"],
        "200 iters in",
    );
}

#[test]
fn ibv_rc_pingpong_new_send_api() {
    // `-N`: ibv_qp_to_qp_ex + ibv_wr_start/ibv_wr_send/ibv_wr_set_sge/ibv_wr_complete.
    pingpong("ibv_rc_pingpong", &["-N"]);
}

#[test]
fn ibv_rc_pingpong_ts_cq_ex_is_refused_cleanly() {
    // `-t`: completion timestamps, which softrdma does not offer
    // (`completion_timestamp_mask` 0 in ibv_query_device_ex, and
    // ibv_create_cq_ex refuses IBV_WC_EX_WITH_COMPLETION_TIMESTAMP): the
    // program must stop with its own message, not hang or crash.
    let d = run(
        "ibv_rc_pingpong",
        &["-d", DEV, "-g", "0", "-t", "-p", &free_port().to_string()],
    );
    assert_ne!(d.code, Some(0), "{d:?}");
    assert!(!d.timed_out, "{d:?}");
    assert!(
        d.stderr.contains("isn't completion timestamp capable"),
        "{d:?}"
    );
}

#[test]
fn ibv_uc_pingpong() {
    // UC runs as RC on softrdma (docs/capi.md).
    pingpong("ibv_uc_pingpong", &[]);
}

#[test]
fn ibv_srq_pingpong() {
    pingpong("ibv_srq_pingpong", &[]);
}

#[test]
fn ibv_ud_pingpong() {
    pingpong("ibv_ud_pingpong", &[]);
}

/// perftest without `-R` (its own TCP exchange, IB-style QP connect);
/// success is exit 0 on both sides and a result row under the header
/// (on both sides, except the passive server of read/atomic latency tests,
/// which prints none).
fn perftest(prog: &str, extra: &[&str]) {
    let server_reports = !matches!(prog, "ib_read_lat" | "ib_atomic_lat");
    let port = free_port().to_string();
    let mut s = vec!["-d", DEV, "-p", &port];
    s.extend_from_slice(extra);
    let mut c = s.clone();
    c.push("127.0.0.1");
    let (sd, cd) = pair(prog, &s, &c, port.parse().unwrap());
    for (who, d) in [("server", &sd), ("client", &cd)] {
        d.assert_ok(
            &format!("{prog} {who}"),
            &["Transport type : IW", "Link type       : Ethernet"],
        );
        if who == "server" && !server_reports {
            continue;
        }
        // The row after the header starts with the message size.
        let mut lines = d.stdout.lines().skip_while(|l| !l.contains("#bytes"));
        let row = lines.nth(1).unwrap_or_default();
        let first = row.split_whitespace().next().unwrap_or_default();
        assert!(
            first.parse::<u64>().is_ok(),
            "{prog} {who}: no result row after the header:\n{}",
            d.stdout
        );
    }
}

#[test]
fn ib_send_lat() {
    perftest("ib_send_lat", &[]);
}

#[test]
fn ib_send_bw() {
    perftest("ib_send_bw", &[]);
}

#[test]
fn ib_write_lat() {
    perftest("ib_write_lat", &[]);
}

#[test]
fn ib_write_bw() {
    perftest("ib_write_bw", &[]);
}

#[test]
fn ib_read_lat() {
    perftest("ib_read_lat", &[]);
}

#[test]
fn ib_read_bw() {
    perftest("ib_read_bw", &[]);
}

#[test]
fn ib_atomic_lat() {
    perftest("ib_atomic_lat", &[]);
}
