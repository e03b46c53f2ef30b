//! The built libibverbs.so against what Debian 12's rdma-core 44 binaries
//! and provider libraries import (`tests/data/ibverbs_imports.txt`: every
//! `IBVERBS_*` symbol and version that ibverbs-utils, rdmacm-utils,
//! perftest, librdmacm, libmlx5 and libefa need, from `objdump -T`): each
//! must be exported with that version, the SONAME must be libibverbs.so.1,
//! and nothing may be exported unversioned except the private rdma_cm
//! forwarding targets.

mod common;

use std::collections::HashSet;
use std::process::Command;

#[test]
fn exports_every_imported_symbol_with_its_version() {
    let lib = common::target_dir().join("libibverbs.so");
    common::softrdma();
    let out = Command::new("objdump")
        .arg("-T")
        .arg(&lib)
        .output()
        .expect("objdump (binutils)");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // Defined dynamic symbols: "<addr> g DF .text <size> <VERSION> <name>".
    let mut have: HashSet<(String, String)> = HashSet::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 6 && !l.contains("*UND*") && f[1] == "g" {
            let name = f[f.len() - 1].to_string();
            let ver = f[f.len() - 2]
                .trim_matches(|c| c == '(' || c == ')')
                .to_string();
            have.insert((ver, name));
        }
    }
    let want = include_str!("data/ibverbs_imports.txt");
    let mut missing = Vec::new();
    for l in want.lines().filter(|l| !l.trim().is_empty()) {
        let mut it = l.split_whitespace();
        let ver = it.next().unwrap().trim_matches(|c| c == '(' || c == ')');
        let name = it.next().unwrap();
        if !have.contains(&(ver.to_string(), name.to_string())) {
            missing.push(format!("{name}@{ver}"));
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}");
    assert!(have.contains(&(
        "IBVERBS_PRIVATE_34".into(),
        "verbs_allow_disassociate_destroy".into()
    )));
    // Everything public carries a version node.
    let unversioned: Vec<_> = have
        .iter()
        .filter(|(v, n)| v == "Base" && !n.starts_with("softrdma_"))
        .collect();
    assert!(
        unversioned.is_empty(),
        "unversioned exports: {unversioned:?}"
    );

    let dynamic = Command::new("objdump")
        .arg("-p")
        .arg(&lib)
        .output()
        .unwrap();
    let p = String::from_utf8_lossy(&dynamic.stdout);
    assert!(
        p.lines()
            .any(|l| l.contains("SONAME") && l.trim_end().ends_with("libibverbs.so.1")),
        "{p}"
    );
    for node in [
        "IBVERBS_1.0",
        "IBVERBS_1.1",
        "IBVERBS_1.14",
        "IBVERBS_PRIVATE_34",
    ] {
        assert!(p.contains(node), "version node {node} not defined");
    }
}

/// Every function `include/softrdma/verbs.h` declares (not the `static
/// inline` helpers) is exported under a public `SOFTRDMA_*` version node,
/// the SoftDC calls under `SOFTRDMA_1.1`, and no such export is missing
/// from the header.
#[test]
fn extension_header_matches_the_exports() {
    let lib = common::target_dir().join("libibverbs.so");
    common::softrdma();
    let out = Command::new("objdump")
        .arg("-T")
        .arg(&lib)
        .output()
        .expect("objdump (binutils)");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut ours: HashSet<(String, String)> = HashSet::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() >= 6 && !l.contains("*UND*") && f[1] == "g" {
            let ver = f[f.len() - 2].trim_matches(|c| c == '(' || c == ')');
            // SOFTRDMA_PRIVATE_1: librdmacm.so.1's forwarding targets,
            // not part of the header.
            if ver.starts_with("SOFTRDMA_") && !ver.starts_with("SOFTRDMA_PRIVATE") {
                ours.insert((ver.to_string(), f[f.len() - 1].to_string()));
            }
        }
    }
    // Declarations: a line that names `softrdma_x(` or `ibv_sdc_x(` after
    // a return type, outside `static inline` definitions.
    let header = include_str!("../include/softrdma/verbs.h");
    let mut declared: HashSet<String> = HashSet::new();
    let mut prev = "";
    for l in header.lines() {
        let t = l.trim_start();
        let decl = !t.starts_with('*')
            && !t.starts_with("/*")
            && !t.starts_with("static")
            && !prev.trim_start().starts_with("static");
        if decl {
            for prefix in ["softrdma_", "ibv_sdc_"] {
                let mut rest = t;
                while let Some(i) = rest.find(prefix) {
                    let name: String = rest[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    let after = &rest[i + name.len()..];
                    if after.starts_with('(') && i > 0 {
                        declared.insert(name.clone());
                    }
                    rest = after;
                }
            }
        }
        prev = l;
    }
    let sdc = [
        "ibv_sdc_create_dct",
        "ibv_sdc_destroy_dct",
        "ibv_sdc_create_qp",
        "ibv_sdc_destroy_qp",
        "ibv_sdc_create_ah",
        "ibv_sdc_destroy_ah",
        "ibv_sdc_post_send",
        "ibv_sdc_query_dct",
        "ibv_sdc_query_qp",
    ];
    for name in sdc {
        assert!(declared.contains(name), "{name} not declared in verbs.h");
        assert!(
            ours.contains(&("SOFTRDMA_1.1".to_string(), name.to_string())),
            "{name} not exported as {name}@@SOFTRDMA_1.1: {ours:?}"
        );
    }
    // Added later, in a node of its own.
    let name = "ibv_sdc_dct_lost_no_receive";
    assert!(declared.contains(name), "{name} not declared in verbs.h");
    assert!(
        ours.contains(&("SOFTRDMA_1.2".to_string(), name.to_string())),
        "{name} not exported as {name}@@SOFTRDMA_1.2: {ours:?}"
    );
    for name in &declared {
        assert!(
            ours.iter().any(|(_, n)| n == name),
            "{name} is declared in verbs.h but not exported: {ours:?}"
        );
    }
    for (ver, name) in &ours {
        assert!(
            declared.contains(name),
            "{name}@{ver} is exported but not declared in verbs.h"
        );
    }
}
