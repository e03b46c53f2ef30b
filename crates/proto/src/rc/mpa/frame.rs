//! MPA frame plumbing shared by both roles: the octets queued for the
//! peer, the reader that collects the peer's frame, and the builders of
//! Request, Reply and Reject frames.
//!
//! Contract: the reader consumes octets up to the end of the peer's frame
//! and not one octet further, and checks the header before the private
//! data has arrived.

use super::*;

/// Octets queued for the peer and how many of them were written.
#[derive(Debug, Default)]
pub(super) struct TxBuf {
    buf: Vec<u8>,
    sent: usize,
}

impl TxBuf {
    pub(super) fn set(&mut self, bytes: Vec<u8>) {
        self.buf = bytes;
        self.sent = 0;
    }

    pub(super) fn pending(&self) -> Option<&[u8]> {
        self.buf.get(self.sent..).filter(|rest| !rest.is_empty())
    }

    pub(super) fn advance(&mut self, n: usize) {
        let left = self.buf.len() - self.sent;
        debug_assert!(
            n <= left,
            "transmitted({n}) with only {left} octets pending"
        );
        self.sent += n.min(left);
    }

    pub(super) fn is_drained(&self) -> bool {
        self.sent >= self.buf.len()
    }

    pub(super) fn clear(&mut self) {
        self.buf.clear();
        self.sent = 0;
    }
}

/// Accumulates one MPA frame from the stream, failing fast on a bad header.
#[derive(Debug)]
pub(super) struct FrameReader {
    buf: Vec<u8>,
    expect: FrameKind,
    /// PD_Length above this fails as soon as the header is in.
    fail_fast_pd: usize,
}

impl FrameReader {
    pub(super) fn new(expect: FrameKind, fail_fast_pd: usize) -> FrameReader {
        FrameReader {
            buf: Vec::with_capacity(HEADER_LEN + fail_fast_pd),
            expect,
            fail_fast_pd,
        }
    }

    /// Takes octets up to the end of the frame: `(consumed, complete)`.
    pub(super) fn feed(&mut self, data: &[u8]) -> Result<(usize, bool), MpaError> {
        let mut used = 0;
        if self.buf.len() < HEADER_LEN {
            let take = (HEADER_LEN - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            used = take;
            if self.buf.len() < HEADER_LEN {
                return Ok((used, false));
            }
            self.check_header()?;
        }
        let total = frame_len(&self.buf).unwrap_or(HEADER_LEN);
        let take = (total - self.buf.len()).min(data.len() - used);
        self.buf.extend_from_slice(&data[used..used + take]);
        used += take;
        Ok((used, self.buf.len() == total))
    }

    pub(super) fn check_header(&self) -> Result<(), MpaError> {
        let f = MpaFrame::new_unchecked(&self.buf[..HEADER_LEN]);
        if f.kind() != Some(self.expect) {
            return Err(MpaError::BadKey);
        }
        if f.rev() > REV_2 {
            return Err(MpaError::UnsupportedRevision(f.rev()));
        }
        let len = usize::from(f.pd_length());
        if len > self.fail_fast_pd {
            return Err(MpaError::PrivateDataTooLong {
                len,
                max: self.fail_fast_pd,
            });
        }
        Ok(())
    }

    pub(super) fn frame(&self) -> MpaFrame<&[u8]> {
        MpaFrame::new_unchecked(&self.buf[..])
    }
}

/// Builds one frame. `ulp` and the optional trailer form the private data
/// after the IRD/ORD word.
pub(super) fn build_frame(
    repr: MpaRepr<'_>,
    ulp: &[u8],
    trailer: Option<SoftrdmaTrailer>,
) -> Vec<u8> {
    let mut pd = Vec::with_capacity(ulp.len() + EXT_TRAILER_LEN);
    pd.extend_from_slice(ulp);
    if let Some(t) = trailer {
        pd.extend_from_slice(&t.to_bytes());
    }
    let repr = MpaRepr {
        private_data: &pd,
        ..repr
    };
    let mut out = vec![0; repr.buffer_len()];
    repr.emit(&mut out);
    out
}

/// An automatic rejection: R=1, no ULP private data, the IRD/ORD word
/// only for a well-formed enhanced Request answered with Rev 2.
pub(super) fn reject_frame(reply_rev: u8, word: Option<IrdOrd>, crc: bool) -> Vec<u8> {
    let repr = MpaRepr {
        reject: true,
        crc,
        rev: reply_rev,
        ..MpaRepr::reply(word, &[])
    };
    build_frame(repr, &[], None)
}

/// The IRD/ORD word's share of PD_Length.
pub(super) const fn word_len(enhanced: bool) -> usize {
    if enhanced {
        IRD_ORD_LEN
    } else {
        0
    }
}
