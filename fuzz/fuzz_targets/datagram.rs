//! Datagram-extension parser (header, CRC): never panics; what parses
//! re-emits byte for byte once normalised.
#![no_main]
use libfuzzer_sys::fuzz_target;
use softrdma_wire::datagram;

fuzz_target!(|data: &[u8]| {
    if let Ok((repr, payload)) = datagram::parse(data) {
        let mut out = vec![0u8; data.len() + 64];
        let n = datagram::emit_into(&repr, payload, &mut out);
        let (again, p2) = datagram::parse(&out[..n]).expect("emitted datagram must parse");
        assert_eq!(again, repr);
        assert_eq!(p2, payload);
    }
});
