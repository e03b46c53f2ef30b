//! Builds librdmacm.so (SONAME `librdmacm.so.1`) as forwarding trampolines
//! (see `src/lib.rs`):
//!
//! * `trampolines.s`: `NAME: jmp softrdma_NAME@PLT` for every symbol of
//!   `exports.txt`;
//! * a version script with rdma-core's nodes `RDMACM_1.0` … `RDMACM_1.3`
//!   (each inheriting from the one before);
//! * a stub `libibverbs.so.1` (SONAME `libibverbs.so.1`) defining
//!   `softrdma_NAME` in version node `SOFTRDMA_PRIVATE_1`, compiled with the
//!   system C compiler and linked against, so the library gets
//!   `NEEDED libibverbs.so.1` and versioned references that softrdma's real
//!   `libibverbs.so.1` satisfies at run time. The stub is never installed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::Command;

const NODES: &[&str] = &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"];
/// The version node of the forwarding targets in libibverbs.so.1.
const PRIVATE_NODE: &str = "SOFTRDMA_PRIVATE_1";
/// Prefix of the forwarding targets.
const PREFIX: &str = "softrdma_";

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=exports.txt");
    println!("cargo:rerun-if-changed=build.rs");
    let list = std::fs::read_to_string(format!("{dir}/exports.txt")).expect("exports.txt");
    let mut nodes: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in list.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut it = line.split_whitespace();
        let (Some(node), Some(sym), None) = (it.next(), it.next(), it.next()) else {
            panic!("exports.txt: bad line {line:?}");
        };
        assert!(NODES.contains(&node), "exports.txt: unknown node {node}");
        assert!(
            sym.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "exports.txt: bad symbol {sym}"
        );
        nodes.entry(node).or_default().push(sym);
    }
    let all: Vec<&str> = NODES
        .iter()
        .flat_map(|n| nodes.get(n).cloned().unwrap_or_default())
        .collect();

    // The trampolines.
    let mut asm = String::from(".text\n");
    for s in &all {
        let _ = write!(
            asm,
            ".globl {s}\n.type {s}, @function\n.p2align 4\n{s}:\n    jmp {PREFIX}{s}@PLT\n.size {s}, . - {s}\n"
        );
    }
    std::fs::write(format!("{out}/trampolines.s"), asm).expect("write trampolines.s");

    // The version script.
    let mut map = String::new();
    for (i, node) in NODES.iter().enumerate() {
        let _ = writeln!(map, "{node} {{");
        if let Some(syms) = nodes.get(node) {
            let _ = writeln!(map, "  global:");
            for s in syms {
                let _ = writeln!(map, "    {s};");
            }
        }
        if i == 0 {
            let _ = writeln!(map, "  local: *;");
            let _ = writeln!(map, "}};");
        } else {
            let _ = writeln!(map, "}} {};", NODES[i - 1]);
        }
    }
    let map_path = format!("{out}/librdmacm.map");
    std::fs::write(&map_path, map).expect("write version script");

    // The stub libibverbs.so.1 that records NEEDED and the versions.
    let stub_dir = format!("{out}/stub");
    std::fs::create_dir_all(&stub_dir).expect("stub dir");
    let mut c = String::new();
    let mut smap = format!("{PRIVATE_NODE} {{\n  global:\n");
    for s in &all {
        let _ = writeln!(c, "void {PREFIX}{s}(void) {{}}");
        let _ = writeln!(smap, "    {PREFIX}{s};");
    }
    smap.push_str("  local: *;\n};\n");
    std::fs::write(format!("{stub_dir}/stub.c"), c).expect("write stub.c");
    std::fs::write(format!("{stub_dir}/stub.map"), smap).expect("write stub.map");
    let stub = format!("{stub_dir}/libibverbs.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-nostdlib", "-o", &stub])
        .arg(format!("{stub_dir}/stub.c"))
        .arg("-Wl,-soname,libibverbs.so.1")
        .arg(format!("-Wl,--version-script={stub_dir}/stub.map"))
        .status()
        .unwrap_or_else(|e| panic!("running {cc} for the libibverbs.so.1 stub: {e}"));
    assert!(
        status.success(),
        "{cc} failed to build the libibverbs.so.1 stub"
    );

    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={map_path}");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg={stub}");
}
