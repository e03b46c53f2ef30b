//! DDP/RDMAP segment parser in both modes: never panics; what parses re-emits
//! to a header that parses to the same representation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use softrdma_wire::ddp::Mode;
use softrdma_wire::rdmap::SegmentRepr;

fuzz_target!(|data: &[u8]| {
    let Some((&m, ulpdu)) = data.split_first() else {
        return;
    };
    let mode = if m & 1 == 0 {
        Mode::Stream
    } else {
        Mode::Datagram
    };
    let _ = softrdma_wire::rdmap::header_len_hint(ulpdu, mode);
    if let Ok((repr, hlen)) = SegmentRepr::parse(ulpdu, mode) {
        assert!(hlen <= ulpdu.len());
        assert_eq!(hlen, repr.header_len());
        let mut buf = vec![0u8; hlen];
        repr.emit(&mut buf);
        let (again, n) = SegmentRepr::parse(&buf, mode).expect("emitted header must parse");
        assert_eq!(n, hlen);
        assert_eq!(again, repr);
    }
});
