//! Write-Record over UD: logging without a receive, late segments,
//! completion order, partial messages.

use super::*;

#[test]
fn write_record_is_logged_without_a_receive() {
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 4000, 8);
    let wr = a.wr(
        5,
        SendOp::WriteRecord {
            remote_addr: BASE + 0x1000,
            rkey: b.buf,
        },
        0,
        4000,
    );
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 3);
    assert!(d.iter().all(|s| s[1] == 0x4C && s[0] & 0x30 == 0x30));
    assert_eq!(a.wcs()[0].1.opcode, WcOpcode::WriteRecord);
    let now = Instant::now();
    b.rx(a.addr, &d[2], now);
    b.rx(a.addr, &d[0], now);
    assert!(b.wcs().is_empty());
    assert!(b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 1442));
    assert!(!b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 1443));
    b.rx(a.addr, &d[1], now);
    let w = b.wcs();
    assert_eq!(w.len(), 1);
    let (kind, wc) = w[0];
    assert_eq!(kind, CqKind::Recv);
    assert_eq!(
        (wc.opcode, wc.status),
        (WcOpcode::RecvWriteRecord, WcStatus::Success)
    );
    assert_eq!(wc.src, Some(a.addr), "tagged source QPN = port << 8 | slot");
    let rec = wc.record.expect("record info");
    assert_eq!(
        (rec.stag, rec.to, rec.len, rec.msn),
        (b.buf, BASE + 0x1000, 4000, 1)
    );
    assert_eq!(b.at(0x1000, 4000), &data[..]);
    assert!(b.qp.record_tracker().is_valid(b.buf, BASE + 0x1000, 4000));
    assert_eq!(b.qp.stats().rx_record_segments, 3);
    // Duplicates are neither recorded twice nor placed again: what
    // the application wrote after the completion stays.
    let reused = b.fill(0x1000, 4000, 77);
    for s in &d {
        b.rx(a.addr, s, now);
    }
    assert!(b.wcs().is_empty());
    assert_eq!(b.qp.record_stats().duplicates, 3);
    assert_eq!(b.at(0x1000, 4000), &reused[..], "a duplicate was placed");
    assert_eq!(b.qp.stats().rx_no_recv, 0);
    // Zero-length Write-Record: one segment, one record.
    let wr = a.wr(
        6,
        SendOp::WriteRecord {
            remote_addr: BASE,
            rkey: b.buf,
        },
        0,
        0,
    );
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    assert_eq!(d.len(), 1);
    b.rx(a.addr, &d[0], now);
    let wc = b.wcs()[0].1;
    assert_eq!(wc.record.map(|r| (r.len, r.msn)), Some((0, 2)));
}

#[test]
fn a_late_segment_of_a_retired_record_changes_no_memory() {
    // Reordering: the first segment of message 2 overtakes the tail of
    // message 1, which it retires (partial). The tail arrives next: the
    // tracker drops it as stale, and memory must not hold it either —
    // the validity map and the partial record describe memory exactly.
    let (mut a, mut b) = (a(), b());
    let data = a.fill(0, 4000, 8);
    let write = |a: &Node, id, off: u64| {
        a.wr(
            id,
            SendOp::WriteRecord {
                remote_addr: BASE + off,
                rkey: b.buf,
            },
            0,
            4000,
        )
    };
    a.qp.post_send(write(&a, 1, 0x1000), b.addr).unwrap();
    let m1 = a.tx();
    a.qp.post_send(write(&a, 2, 0x4000), b.addr).unwrap();
    let m2 = a.tx();
    assert_eq!((m1.len(), m2.len()), (3, 3));
    let before = b.at(0x1000, 4000).to_vec();
    let now = Instant::now();
    b.rx(a.addr, &m1[0], now);
    b.rx(a.addr, &m2[0], now);
    b.rx(a.addr, &m1[1], now);
    b.rx(a.addr, &m1[2], now);
    assert_eq!(b.qp.record_stats().retired_by_newer_msn, 1);
    assert_eq!(b.qp.record_stats().stale_segments, 2);
    assert_eq!(b.at(0x1000, 1442), &data[..1442], "the head was placed");
    assert_eq!(
        b.at(0x1000 + 1442, 4000 - 1442),
        &before[1442..],
        "the stale tail was not"
    );
    let t = b.qp.record_tracker();
    assert!(t.is_valid(b.buf, BASE + 0x1000, 1442));
    assert!(!t.is_valid(b.buf, BASE + 0x1000 + 1442, 1));
    let w = b.wcs();
    assert_eq!(w.len(), 1, "message 1 reported once, as partial");
    assert_eq!(w[0].1.status, WcStatus::RecordPartial);
    // Message 2 goes on as if nothing happened.
    b.rx(a.addr, &m2[1], now);
    b.rx(a.addr, &m2[2], now);
    assert_eq!(b.at(0x4000, 4000), &data[..]);
    assert_eq!(b.wcs()[0].1.status, WcStatus::Success);
}

#[test]
fn record_and_send_completions_keep_arrival_order() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 100, 1);
    b.recv(1, 0, 100);
    let rec = |id| a_wr_record(id, b.buf);
    a.qp.post_send(a.wr(1, rec(1), 0, 10), b.addr).unwrap();
    a.send(2, 0, 10, None, b.addr);
    a.qp.post_send(a.wr(3, rec(3), 0, 10), b.addr).unwrap();
    let now = Instant::now();
    for s in a.tx() {
        b.rx(a.addr, &s, now);
    }
    let ops: Vec<WcOpcode> = b.wcs().iter().map(|w| w.1.opcode).collect();
    assert_eq!(
        ops,
        vec![
            WcOpcode::RecvWriteRecord,
            WcOpcode::Recv,
            WcOpcode::RecvWriteRecord
        ]
    );
}

fn a_wr_record(id: u64, rkey: u32) -> SendOp {
    SendOp::WriteRecord {
        remote_addr: BASE + 0x1000 * id,
        rkey,
    }
}

#[test]
fn write_record_partial_after_timeout() {
    let (mut a, mut b) = (a(), b());
    a.fill(0, 4000, 8);
    let wr = a.wr(
        5,
        SendOp::WriteRecord {
            remote_addr: BASE,
            rkey: b.buf,
        },
        0,
        4000,
    );
    a.qp.post_send(wr, b.addr).unwrap();
    let d = a.tx();
    let t0 = Instant::now();
    b.rx(a.addr, &d[0], t0);
    b.rx(a.addr, &d[2], t0);
    let t = b.qp.poll_timeout().expect("tracker deadline");
    b.qp.handle_timeout(t);
    let wc = b.wcs()[0].1;
    assert_eq!(wc.status, WcStatus::RecordPartial);
    let rec = wc.record.unwrap();
    assert_eq!(
        &rec.ranges[..usize::from(rec.n_ranges)],
        &[(0, 1442), (2884, 4000 - 2884)]
    );
}
