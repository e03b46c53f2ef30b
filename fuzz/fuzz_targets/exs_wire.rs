//! The RDMA model of `libexs` (`softrdma_exs_core::wire`): the control
//! messages and the connection exchange's private data from arbitrary
//! octets, and the sans-IO step that applies each received message to a
//! connection's counters (`wire::check` on a `wire::Window`), with the
//! credits this end returns in between.
//!
//! Holds: nothing panics; a message that decodes re-encodes to the same
//! octets and is at most `MSG_MAX` long; parsed private data has sane
//! numbers and re-encodes to what parses the same; the window's counters
//! never leave their bounds (credits spendable and credits held within the
//! negotiated window), and a message the step refuses leaves nothing
//! half-applied that a later message could exploit (the run stops there,
//! as the connection would be reset).
//!
//! Input: a window octet pair (credits, and which persistent blocks exist
//! with what length), then a sequence of operations: `0..=0x7f` a message
//! of that many octets follows; `0x80..=0xbf` this end returns the low
//! bits' count of held credits; `0xc0..` the following 16 octets are
//! private data.
#![no_main]
use libfuzzer_sys::fuzz_target;
use softrdma_exs_core::wire::{self, Msg, Params, Window, MAX_CREDITS, MSG_MAX, PARAMS_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let credits = u32::from(data[0]) % 16 + 1;
    let blocks = data[1];
    let len_of = |bits: u8| -> u64 {
        match bits & 3 {
            0 => 0,
            1 => 1,
            2 => 4096,
            _ => u64::from(u32::MAX),
        }
    };
    let mut w = Window {
        credits,
        send_credits: u32::from(data[2]) % (credits + 1),
        held: 0,
        psend_len: len_of(blocks),
        precv_len: len_of(blocks >> 2),
    };
    let mut rest = &data[3..];
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        if op < 0x80 {
            let n = (op as usize).min(rest.len());
            let (b, tail) = rest.split_at(n);
            rest = tail;
            // Longer messages than one octet can say: pad with the input's
            // start so every size up to and past MSG_MAX is reached.
            let mut m = b.to_vec();
            if op & 0x40 != 0 {
                m.extend(
                    data.iter()
                        .cycle()
                        .take(wire::HDR + (op as usize & 0x3f) * 4),
                );
            }
            let Some(msg) = Msg::decode(&m) else { continue };
            assert!(m.len() <= MSG_MAX);
            assert_eq!(msg.encode(), m, "decode/encode round trip");
            let before = w;
            match wire::check(&mut w, &msg) {
                Ok(()) => {
                    assert!(w.send_credits <= w.credits, "{before:?} -> {w:?}");
                    assert!(w.held <= w.credits, "{before:?} -> {w:?}");
                    assert!(w.send_credits >= before.send_credits);
                    if wire::spends_credit(msg.kind) {
                        assert_eq!(w.held, before.held + 1);
                        if msg.kind == wire::RNOTE {
                            assert!(msg.addr + u64::from(msg.len) <= w.psend_len);
                        }
                        if msg.kind == wire::WNOTE {
                            assert!(msg.addr + u64::from(msg.len) <= w.precv_len);
                        }
                    } else {
                        assert_eq!(w.held, before.held);
                    }
                }
                Err(()) => return,
            }
        } else if op < 0xc0 {
            // This end returns credits (piggybacked or in a CREDIT).
            let k = u32::from(op & 0x3f).min(w.held);
            w.held -= k;
        } else {
            let n = PARAMS_LEN.min(rest.len());
            let (b, tail) = rest.split_at(n);
            rest = tail;
            if let Some(p) = Params::parse(b) {
                assert!((1..=MAX_CREDITS).contains(&p.credits));
                assert!(p.small as usize <= wire::IMM_MAX);
                assert_eq!(Params::parse(&p.to_bytes()), Some(p));
            }
        }
    }
});
