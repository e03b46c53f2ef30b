//! libfabric's verbs provider (Debian `libfabric1`, programs from
//! `libfabric-bin`) over softrdma's librdmacm.so.1 + libibverbs.so.1,
//! through `softrdma run`: `fi_info` finds softrdma's devices for
//! `FI_EP_MSG` (verbs) and `FI_EP_RDM` (verbs;ofi_rxm), and `fi_pingpong`
//! completes every size it runs (64 B to 1 MiB) over both, server
//! and client as separate processes, the client pointed at 127.0.0.1 and
//! at this host's first non-loopback IPv4 address.
//!
//! The provider resolves addresses through rdma_cm (`rdma_getaddrinfo`,
//! `rdma_bind_addr`, `rdma_resolve_addr`), keeps only the devices of
//! interfaces other than `lo`, and takes the device of each connection
//! from `id->verbs`; so these runs check that loopback traffic is bound to
//! the first active device, as the kernel's rdma_cm does.
//!
//! Without `fi_info`/`fi_pingpong` installed the tests are skipped, except
//! under `CI=true`, where they fail.

#[path = "../../capi/tests/common/mod.rs"]
mod common;

use std::net::Ipv4Addr;

use common::{free_port, pair, run, Done};

/// Whether `prog` can run: installed, or (under `CI=true`) a failure.
fn have(prog: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false);
    if !found {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{prog} is not installed (Debian package libfabric-bin)"
        );
        eprintln!("skipped: {prog} is not installed (Debian package libfabric-bin)");
    }
    found
}

/// The first IPv4 address of an interface that is up and not loopback.
fn eth_addr() -> Option<Ipv4Addr> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head to ifap; freed below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = ifap;
    while !p.is_null() && found.is_none() {
        // SAFETY: a node of the list, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        let flags = ifa.ifa_flags;
        if ifa.ifa_addr.is_null()
            || flags & libc::IFF_UP as u32 == 0
            || flags & libc::IFF_LOOPBACK as u32 != 0
        {
            continue;
        }
        // SAFETY: non-null; the family field is always readable.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET means a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
    }
    // SAFETY: from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(ifap) };
    found
}

/// The `provider:`/`domain:`/`type:` triples `fi_info` printed.
fn listed(d: &Done) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let (mut prov, mut dom) = (String::new(), String::new());
    for l in d.stdout.lines() {
        let l = l.trim();
        if let Some(v) = l.strip_prefix("provider: ") {
            prov = v.to_string();
        } else if let Some(v) = l.strip_prefix("domain: ") {
            dom = v.to_string();
        } else if let Some(v) = l.strip_prefix("type: ") {
            out.push((prov.clone(), dom.clone(), v.to_string()));
        }
    }
    out
}

#[test]
fn fi_info_lists_verbs_msg_domains() {
    if !have("fi_info") {
        return;
    }
    let d = run("fi_info", &["-p", "verbs"]);
    d.assert_ok("fi_info -p verbs", &["provider: verbs"]);
    let l = listed(&d);
    assert!(
        l.iter()
            .any(|(p, dom, t)| p == "verbs" && dom.starts_with("softrdma_") && t == "FI_EP_MSG"),
        "no softrdma FI_EP_MSG domain:\n{}",
        d.stdout
    );
    let d = run("fi_info", &["-p", "verbs", "-t", "FI_EP_MSG", "-v"]);
    d.assert_ok(
        "fi_info -p verbs -t FI_EP_MSG -v",
        &["FI_PROTO_IWARP", "Ethernet-iWARP"],
    );
}

#[test]
fn fi_info_lists_rxm_rdm_domains() {
    if !have("fi_info") {
        return;
    }
    let d = run("fi_info", &["-p", "verbs;ofi_rxm", "-t", "FI_EP_RDM"]);
    d.assert_ok("fi_info -p verbs;ofi_rxm", &["FI_PROTO_RXM"]);
    assert!(
        listed(&d).iter().any(|(p, dom, t)| p == "verbs;ofi_rxm"
            && dom.starts_with("softrdma_")
            && t == "FI_EP_RDM"),
        "no softrdma FI_EP_RDM domain:\n{}",
        d.stdout
    );
}

/// `fi_pingpong` server and client with `provider` and endpoint type
/// `ep`, the client aimed at `addr`; both must exit 0 having reported
/// every size from 64 B to 1 MiB.
fn pingpong(provider: &str, ep: &str, addr: &str) {
    if !have("fi_pingpong") {
        return;
    }
    let port = free_port();
    let ps = port.to_string();
    let server = ["-p", provider, "-e", ep, "-B", &ps];
    let client = ["-p", provider, "-e", ep, "-P", &ps, addr];
    let (sd, cd) = pair("fi_pingpong", &server, &client, port);
    for (who, d) in [("server", &sd), ("client", &cd)] {
        let what = format!("fi_pingpong -p {provider} -e {ep} {who} ({addr})");
        d.assert_ok(&what, &["bytes", "#sent", "#ack"]);
        // Rows: size, sent, "=acked", ...; every message acknowledged.
        let rows: Vec<Vec<&str>> = d
            .stdout
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|c| c.len() > 2 && c[2].strip_prefix('=') == Some(c[1]))
            .collect();
        for want in ["64", "256", "1k", "4k", "64k", "1m"] {
            assert!(
                rows.iter().any(|c| c[0] == want),
                "{what}: no complete result row for {want}:\n{}",
                d.stdout
            );
        }
    }
}

#[test]
fn fi_pingpong_msg_loopback() {
    pingpong("verbs", "msg", "127.0.0.1");
}

#[test]
fn fi_pingpong_rdm_loopback() {
    pingpong("verbs;ofi_rxm", "rdm", "127.0.0.1");
}

#[test]
fn fi_pingpong_msg_interface_address() {
    let Some(a) = eth_addr() else {
        eprintln!("skipped: no non-loopback IPv4 interface");
        return;
    };
    pingpong("verbs", "msg", &a.to_string());
}

#[test]
fn fi_pingpong_rdm_interface_address() {
    let Some(a) = eth_addr() else {
        eprintln!("skipped: no non-loopback IPv4 interface");
        return;
    };
    pingpong("verbs;ofi_rxm", "rdm", &a.to_string());
}
