//! C programs compiled against the installed headers (and softrdma's
//! `include/`) and softrdma's libibverbs.so, run through `softrdma run`:
//!
//! * `examples/c/write_record.c`, the example of `softrdma/verbs.h`: a
//!   Write-Record over a UD and an RD QP, the target completion and the
//!   validity map;
//! * `tests/c/verbs_ex.c`: the extended verbs through the header inlines
//!   (`ibv_query_device_ex`, `ibv_create_cq_ex` + `ibv_start_poll`,
//!   `ibv_create_qp_ex` + `ibv_wr_*`, a completion channel fd that poll(2)
//!   reports readable, an SRQ limit event read from a pollable `async_fd`,
//!   `ibv_query_qp`, a Write's target read as soon as the Write completes);
//! * `tests/c/sdc.c`: SoftDC's `ibv_sdc_*` calls (two DCTs on one SRQ and
//!   CQ with a completion channel, one DCI): Send+imm, Write, Read and
//!   fetch-add as one chain, per-WR destinations, a wrong DC key, bad
//!   arguments;
//! * `tests/c/errors.c`: the documented errors of `ibv_create_cq` and
//!   `ibv_create_cq_ex` (cqe, comp_vector), `ibv_resize_cq`,
//!   `ibv_rereg_mr` (and that it takes a new translation, PD and access),
//!   `ibv_query_gid_table` with no room;
//! * `tests/c/busy.c`: rdma-core's `EBUSY` rules: a PD with an MR, AH,
//!   SRQ, QP, DCT or DCI, a CQ with a QP, DCT or DCI, an SRQ with a QP or
//!   DCT cannot go (and stays usable); once its users are destroyed it can.

mod common;

use std::path::Path;
use std::process::Command;

fn compile_and_run(src: &str, needles: &[&str]) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = common::target_dir();
    common::softrdma();
    let stem = Path::new(src)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let out = std::env::temp_dir().join(format!("softrdma-{stem}-{}", std::process::id()));
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(manifest.join(src))
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-L")
        .arg(&dir)
        .arg("-libverbs")
        .output()
        .expect("cc (scripts/install-test-deps.sh installs libibverbs-dev)");
    assert!(
        cc.status.success(),
        "compiling {src} failed:\n{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let d = common::run(out.to_str().expect("utf-8 path"), &[]);
    let _ = std::fs::remove_file(&out);
    d.assert_ok(src, needles);
}

#[test]
fn write_record_example_compiles_and_runs() {
    compile_and_run(
        "examples/c/write_record.c",
        &[
            "write_record: UD QP",
            "write_record: RD QP",
            "3000 octets placed and logged",
            "write_record: OK",
        ],
    );
}

#[test]
fn create_cq_refuses_bad_cqe_and_comp_vector() {
    compile_and_run(
        "tests/c/errors.c",
        &[
            "errors: invalid cqe and comp_vector refused with EINVAL",
            "errors: ibv_resize_cq takes valid sizes and refuses the rest",
            "errors: ibv_rereg_mr changes translation, PD and access; refuses bad input",
            "errors: ibv_query_gid_table refuses a buffer with no room",
            "errors: OK",
        ],
    );
}

#[test]
fn extended_verbs_through_the_header_inlines() {
    compile_and_run(
        "tests/c/verbs_ex.c",
        &[
            "verbs_ex: 2000 RDMA Writes placed when they completed",
            "verbs_ex: OK",
        ],
    );
}

#[test]
fn softdc_calls_from_c() {
    compile_and_run(
        "tests/c/sdc.c",
        &[
            "sdc: bad arguments refused with EINVAL/EOPNOTSUPP/EAFNOSUPPORT",
            "sdc: DCI completion wr_id 1 SEND",
            "sdc: DCI completion wr_id 2 RDMA_WRITE",
            "sdc: DCI completion wr_id 3 RDMA_READ",
            "sdc: DCI completion wr_id 4 FETCH_ADD",
            "sdc: write 200, read 200 octets, fetch-add 40+2 = 42: OK",
            "sdc: DCT receive via completion channel: 29 octets, imm 0xdc0001",
            "sdc: one chain to two DCTs: OK",
            "sdc: wrong key: remote access error, DCT rejected 1",
            "sdc: no such DCT: error completion",
            "sdc: DCI completion via completion channel",
            "sdc: bad work requests refused, bad_wr set",
            "sdc: OK",
        ],
    );
}

#[test]
fn busy_pd_cq_srq_refuse_to_go() {
    compile_and_run(
        "tests/c/busy.c",
        &[
            "busy: PD with only MRs: deallocated, MRs deregister after",
            "busy: PD with an AH: EBUSY",
            "busy: PD with a QP, CQ with a QP: EBUSY",
            "busy: extended CQ with an extended QP: EBUSY",
            "busy: SRQ with a QP, PD with an SRQ: EBUSY",
            "busy: PD, CQ and SRQ with a DCT: EBUSY",
            "busy: CQ and PD with a DCI: EBUSY",
            "busy: after their users, PD/CQ/SRQ go with 0",
            "busy: OK",
        ],
    );
}

#[test]
fn cq_event_wait_and_signals() {
    compile_and_run(
        "tests/c/cq_event_signal.c",
        &[
            "cq_event_signal: EINTR without SA_RESTART",
            "cq_event_signal: SA_RESTART waits for the event",
            "cq_event_signal: UD to a LID-only AH arrives",
            "cq_event_signal: OK",
        ],
    );
}
