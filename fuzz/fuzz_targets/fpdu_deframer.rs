//! FPDU deframer fed arbitrary octets in arbitrary splits, with CRC and
//! markers on or off: never panics, always makes progress, and stays failed
//! after an error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use softrdma_wire::fpdu::{Deframer, Event, MAX_HEADER};

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else { return };
    let Some((&split, stream)) = rest.split_first() else { return };
    let mut d = Deframer::new(cfg & 1 != 0, cfg & 2 != 0);
    let step = usize::from(split).max(1);
    let mut failed = None;
    for piece in stream.chunks(step) {
        let mut piece = piece;
        while !piece.is_empty() {
            match d.decode(piece) {
                Ok((n, ev)) => {
                    assert!(failed.is_none(), "decoded after an error");
                    assert!(n <= piece.len());
                    assert!(n > 0 || ev.is_some(), "no progress");
                    if let Some(Event::Header(h)) = ev {
                        assert!(h.len() <= MAX_HEADER);
                    }
                    piece = &piece[n..];
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            assert_eq!(d.decode(&[0]).unwrap_err(), e);
            break;
        }
    }
});
