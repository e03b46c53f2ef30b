//! The SoftDC structures of `src/sdc.rs` against their C declarations in
//! `include/softrdma/verbs.h`: a C program printing `sizeof`/`offsetof`
//! of every field is compiled with the system C compiler and its output
//! compared with Rust's `size_of`/`offset_of`.

use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use ibverbs::sdc::*;

/// (struct, field or "" for the whole struct, offset or size).
macro_rules! rows {
    ($($t:ident { $($f:ident),* }),* $(,)?) => {
        vec![$(
            (stringify!($t), "", size_of::<$t>()),
            $((stringify!($t), stringify!($f), offset_of!($t, $f)),)*
        )*]
    };
}

#[test]
fn sdc_structs_match_the_header() {
    let rows: Vec<(&str, &str, usize)> = rows!(
        ibv_sdc_attr {
            comp_mask,
            capacity,
            idle_timeout_ms,
            invite_timeout_ms
        },
        ibv_sdc_dct {
            context,
            dct_context,
            pd,
            cq,
            srq,
            dc_key,
            dct_num
        },
        ibv_sdc_qp_init_attr {
            qp_context,
            send_cq,
            cap,
            sq_sig_all,
            sdc_attr
        },
        ibv_sdc_qp {
            context,
            qp_context,
            pd,
            send_cq,
            qp_num,
            cap,
            sq_sig_all
        },
        ibv_sdc_dest {
            ah,
            dct_num,
            dc_key
        },
        ibv_sdc_stats {
            dct_rejected,
            outstanding,
            invites,
            retransmits,
            timeouts,
            rejected_bad_key,
            rejected_no_dct,
            rejected_busy,
            evictions,
            idle_closes,
            target_accepts,
            capacity,
            live,
            max_live,
            rc_qps
        },
    );
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <softrdma/verbs.h>\nint main(void) {\n",
    );
    for (t, f, _) in &rows {
        if f.is_empty() {
            let _ = writeln!(c, "  printf(\"%zu\\n\", sizeof(struct {t}));");
        } else {
            let _ = writeln!(c, "  printf(\"%zu\\n\", offsetof(struct {t}, {f}));");
        }
    }
    c.push_str("  return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("softrdma-sdc-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let bin = dir.join("layout");
    std::fs::write(&src, &c).unwrap();
    let inc = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-I")
        .arg(&inc)
        .output()
        .expect("cc (scripts/install-test-deps.sh installs it and libibverbs-dev)");
    assert!(
        cc.status.success(),
        "compiling against softrdma/verbs.h failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let out = Command::new(&bin).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let got: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(got.len(), rows.len());
    let bad: Vec<String> = rows
        .iter()
        .zip(&got)
        .filter(|((_, _, want), c)| want != *c)
        .map(|((t, f, want), c)| format!("{t}.{f}: Rust {want}, C {c}"))
        .collect();
    assert!(bad.is_empty(), "layout differs: {bad:?}");
}
