//! The C example of `include/softrdma/verbs.h` (`examples/c/write_record.c`)
//! compiles against the header and softrdma's libibverbs.so, and runs
//! through `softrdma run`: a Write-Record over a UD and an RD QP, the target
//! completion and the validity map.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn write_record_example_compiles_and_runs() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::target_dir();
    common::softrdma();
    let out = std::env::temp_dir().join(format!("softrdma-write-record-{}", std::process::id()));
    let cc = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&out)
        .arg(manifest.join("examples/c/write_record.c"))
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-L")
        .arg(&dir)
        .arg("-libverbs")
        .output()
        .expect("cc (scripts/install-test-deps.sh installs libibverbs-dev)");
    assert!(
        cc.status.success(),
        "compiling the example failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let d = common::run(out.to_str().expect("utf-8 path"), &[]);
    let _ = std::fs::remove_file(&out);
    d.assert_ok(
        "write_record example",
        &[
            "write_record: UD QP",
            "write_record: RD QP",
            "3000 octets placed and logged",
            "write_record: OK",
        ],
    );
}
