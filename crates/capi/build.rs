//! Links libibverbs.so with SONAME `libibverbs.so.1` and the rdma-core 44
//! symbol version nodes. The version script is generated from
//! `exports.txt`, `src/rdmacm/exports.txt` and `src/rsocket/exports.txt`
//! (one `NODE symbol` per line), the lists of what the library exports; the symbols themselves are defined by `export!` in
//! `src/export.rs` (global_asm aliases, so rustc's own anonymous version
//! script, which lists only `#[no_mangle]` items, does not claim them).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Version nodes in upstream order; each inherits from the one before.
const IBVERBS_NODES: &[&str] = &[
    "IBVERBS_1.0",
    "IBVERBS_1.1",
    "IBVERBS_1.5",
    "IBVERBS_1.6",
    "IBVERBS_1.7",
    "IBVERBS_1.8",
    "IBVERBS_1.9",
    "IBVERBS_1.10",
    "IBVERBS_1.11",
    "IBVERBS_1.12",
    "IBVERBS_1.13",
    "IBVERBS_1.14",
];

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    // exports.txt is the verbs side's; src/rdmacm and src/rsocket keep
    // their own lists (owned by whoever owns those modules).
    let mut list = String::new();
    for f in [
        "exports.txt",
        "src/rdmacm/exports.txt",
        "src/rsocket/exports.txt",
    ] {
        println!("cargo:rerun-if-changed={f}");
        if let Ok(s) = std::fs::read_to_string(format!("{dir}/{f}")) {
            list.push_str(&s);
            list.push('\n');
        }
    }
    let mut nodes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in list.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(node), Some(sym)) = (it.next(), it.next()) else {
            panic!("exports.txt: bad line {line:?}");
        };
        nodes
            .entry(node.to_string())
            .or_default()
            .push(sym.to_string());
    }
    let mut map = String::new();
    let mut prev: Option<&str> = None;
    let mut order: Vec<String> = IBVERBS_NODES.iter().map(|s| s.to_string()).collect();
    for n in nodes.keys() {
        if !order.contains(n) {
            order.push(n.clone());
        }
    }
    for (i, node) in order.iter().enumerate() {
        let syms = nodes.get(node).cloned().unwrap_or_default();
        let _ = writeln!(map, "{node} {{");
        if !syms.is_empty() {
            let _ = writeln!(map, "  global:");
            for s in &syms {
                let _ = writeln!(map, "    {s};");
            }
        }
        if i == 0 {
            let _ = writeln!(map, "  local: *;");
        }
        let parent = match prev {
            Some(p) if IBVERBS_NODES.contains(&node.as_str()) => format!(" {p}"),
            _ => String::new(),
        };
        let _ = writeln!(map, "}}{parent};");
        if IBVERBS_NODES.contains(&node.as_str()) {
            prev = Some(IBVERBS_NODES[IBVERBS_NODES.iter().position(|n| n == node).unwrap_or(0)]);
        }
    }
    let path = format!("{out}/libibverbs.map");
    std::fs::write(&path, map).expect("write version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={path}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
