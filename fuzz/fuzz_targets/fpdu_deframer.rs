//! FPDU deframer fed arbitrary octets in arbitrary splits, with CRC and
//! markers on or off: never panics, always makes progress, and stays failed
//! after an error. A second deframer takes the same octets but moves every
//! payload it is offered for direct placement past `placed_payload` (CRC)
//! or `skip_payload` (no CRC) instead of `decode`: it must report the same
//! headers and FPDU ends and fail with the same error.
#![no_main]
use libfuzzer_sys::fuzz_target;
use softrdma_wire::fpdu::{Deframer, Event, MAX_HEADER};

/// What a run reported: headers and ends in order, and the error if any.
#[derive(Debug, PartialEq)]
enum Seen {
    Header(Vec<u8>),
    End(usize),
}

fn run(
    crc: bool,
    markers: bool,
    step: usize,
    stream: &[u8],
    direct: bool,
) -> (Vec<Seen>, Option<String>) {
    let mut d = Deframer::new(crc, markers);
    let mut seen = Vec::new();
    let mut failed = None;
    for piece in stream.chunks(step) {
        let mut piece = piece;
        while !piece.is_empty() {
            if direct {
                if let Some((left, _)) = d.direct_payload() {
                    let n = left.min(piece.len());
                    if n > 0 {
                        let ok = if crc {
                            !d.skip_payload(n) && d.placed_payload(&piece[..n])
                        } else {
                            d.skip_payload(n)
                        };
                        assert!(ok, "direct_payload offered {left}, {n} refused");
                        piece = &piece[n..];
                        continue;
                    }
                }
            }
            match d.decode(piece) {
                Ok((n, ev)) => {
                    assert!(failed.is_none(), "decoded after an error");
                    assert!(n <= piece.len());
                    assert!(n > 0 || ev.is_some(), "no progress");
                    match ev {
                        Some(Event::Header(h)) => {
                            assert!(h.len() <= MAX_HEADER);
                            seen.push(Seen::Header(h.to_vec()));
                        }
                        Some(Event::End { ulpdu_len }) => seen.push(Seen::End(ulpdu_len)),
                        _ => {}
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
    (seen, failed.map(|e| format!("{e:?}")))
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let Some((&split, stream)) = rest.split_first() else {
        return;
    };
    let (crc, markers) = (cfg & 1 != 0, cfg & 2 != 0);
    let step = usize::from(split).max(1);
    let streamed = run(crc, markers, step, stream, false);
    let placed = run(crc, markers, step, stream, true);
    assert_eq!(
        streamed, placed,
        "direct placement changed what the stream says"
    );
});
