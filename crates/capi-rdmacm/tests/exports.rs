//! librdmacm.so.1 exports exactly rdma-core 44's list (`exports.txt`)
//! with its version nodes, has the right SONAME and NEEDED entry, and every
//! forwarding target `softrdma_<name>` is exported by our libibverbs.so in
//! `SOFTRDMA_PRIVATE_1` (so the dynamic loader resolves all of them).

#[path = "../../capi/tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::process::Command;

/// `objdump ARGS FILE` output.
fn objdump(args: &[&str], file: &std::path::Path) -> String {
    let out = Command::new("objdump")
        .args(args)
        .arg(file)
        .output()
        .expect("objdump (binutils) runs");
    assert!(out.status.success(), "objdump {args:?} {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// (version, name) of the dynamic symbols defined in `file` (not UND).
fn defined(file: &std::path::Path) -> BTreeSet<(String, String)> {
    objdump(&["-T", "--wide"], file)
        .lines()
        .filter(|l| !l.contains("*UND*") && (l.contains(" DF ") || l.contains(" DO ")))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let name = cols.last()?.to_string();
            let ver = cols
                .get(cols.len().checked_sub(2)?)?
                .trim_matches(['(', ')']);
            Some((ver.to_string(), name))
        })
        .collect()
}

/// (version, name) of the undefined dynamic symbols `file` references.
fn undefined(file: &std::path::Path) -> BTreeSet<(String, String)> {
    objdump(&["-T", "--wide"], file)
        .lines()
        .filter(|l| l.contains("*UND*"))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let name = cols.last()?.to_string();
            let ver = cols
                .get(cols.len().checked_sub(2)?)?
                .trim_matches(['(', ')']);
            Some((ver.to_string(), name))
        })
        .collect()
}

fn listed() -> BTreeSet<(String, String)> {
    include_str!("../exports.txt")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut it = l.split_whitespace();
            let node = it.next().expect("node").to_string();
            let name = it.next().expect("name").to_string();
            (node, name)
        })
        .collect()
}

#[test]
fn librdmacm_exports_rdma_core_44_list_and_forwards_to_libibverbs() {
    // Builds softrdma, libibverbs.so and librdmacm.so into the target dir.
    common::softrdma();
    let dir = common::target_dir();
    let rdmacm = dir.join("librdmacm.so");
    let ibverbs = dir.join("libibverbs.so");

    let want = listed();
    assert_eq!(want.len(), 68, "rdma-core 44 exports 68 librdmacm symbols");
    let have: BTreeSet<(String, String)> = defined(&rdmacm)
        .into_iter()
        .filter(|(v, _)| v.starts_with("RDMACM_"))
        .collect();
    assert_eq!(
        have, want,
        "librdmacm.so's RDMACM_* exports differ from exports.txt"
    );
    // Nothing else is exported (no Rust or helper symbols leak out).
    let other: Vec<_> = defined(&rdmacm)
        .into_iter()
        .filter(|(v, n)| !v.starts_with("RDMACM_") && !n.starts_with("RDMACM_"))
        .collect();
    assert!(other.is_empty(), "unexpected exports: {other:?}");

    let dynamic = objdump(&["-p"], &rdmacm);
    assert!(
        dynamic.contains("SONAME               librdmacm.so.1"),
        "{dynamic}"
    );
    assert!(
        dynamic.contains("NEEDED               libibverbs.so.1"),
        "{dynamic}"
    );
    for node in ["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"] {
        assert!(
            dynamic.contains(node),
            "version node {node} missing:\n{dynamic}"
        );
    }

    // Every forwarder's target is referenced with its version and defined
    // by libibverbs.so in that version.
    let refs = undefined(&rdmacm);
    let targets = defined(&ibverbs);
    for (_, name) in &want {
        let t = ("SOFTRDMA_PRIVATE_1".to_string(), format!("softrdma_{name}"));
        assert!(refs.contains(&t), "librdmacm.so does not reference {t:?}");
        assert!(targets.contains(&t), "libibverbs.so does not export {t:?}");
    }
}
