//! MPA Request/Reply parser: never panics; what parses re-emits to a frame
//! that parses to the same representation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use softrdma_wire::mpa::{frame_len, MpaRepr};

fuzz_target!(|data: &[u8]| {
    let _ = frame_len(data);
    if let Ok((repr, used)) = MpaRepr::parse(data) {
        assert!(used <= data.len());
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(&mut buf);
        let (again, n) = MpaRepr::parse(&buf).expect("emitted frame must parse");
        assert_eq!(n, buf.len());
        assert_eq!(again, repr);
    }
});
