//! Every size and offset of `softrdma_capi::abi`/`abi_cm` against Debian's
//! `libibverbs-dev`/`librdmacm-dev` headers: a C program printing
//! `sizeof`/`offsetof` of each row of `abi::layout_table()` is compiled
//! with the system C compiler and its output compared row by row.

use std::fmt::Write as _;
use std::process::Command;

#[test]
fn layouts_match_the_c_headers() {
    let rows = ibverbs::abi::layout_table();
    assert!(
        rows.len() > 300,
        "the table covers the structures ({} rows)",
        rows.len()
    );
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (t, f, _, _) in &rows {
        // `union ibv_gid` is the one union in the table.
        let kw = if *t == "ibv_gid" { "union" } else { "struct" };
        if f.is_empty() {
            let _ = writeln!(c, "  printf(\"%zu 0\\n\", sizeof({kw} {t}));");
        } else {
            let _ = writeln!(
                c,
                "  printf(\"%zu %zu\\n\", offsetof({kw} {t}, {f}), sizeof((({kw} {t} *)0)->{f}));"
            );
        }
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("softrdma-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let bin = dir.join("layout");
    std::fs::write(&src, &c).unwrap();
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc (install the C compiler and libibverbs-dev/librdmacm-dev: scripts/install-test-deps.sh)");
    assert!(
        cc.status.success(),
        "compiling against the headers failed (scripts/install-test-deps.sh installs libibverbs-dev, librdmacm-dev):\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&bin).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), rows.len());
    let mut bad = Vec::new();
    for ((t, f, off, size), line) in rows.iter().zip(&lines) {
        let mut it = line.split_whitespace().map(|x| x.parse::<usize>().unwrap());
        let (coff, csize) = (it.next().unwrap(), it.next().unwrap());
        let (want_off, want_size) = if f.is_empty() {
            (*off, 0)
        } else {
            (*off, *size)
        };
        if (coff, csize) != (want_off, want_size) {
            bad.push(format!(
                "struct {t}{}{f}: C offset/size {coff}/{csize}, Rust {want_off}/{want_size}",
                if f.is_empty() { "" } else { "." }
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "layout mismatches:\n{}", bad.join("\n"));
}
