//! MPA FPDU framing (RFC 5044 §4 and §5): ULPDU length, pad, CRC32C and
//! markers, for one direction of a TCP stream.
//!
//! ```text
//! FPDU = ULPDU_Length (2) | ULPDU | PAD (0..3) | CRC (4)
//!        + a 4-octet marker every 512 octets of stream position, wherever
//!          it falls (length field, ULPDU, pad or CRC)
//! ```
//!
//! * [`Framer`] frames outgoing FPDUs as a sequence of [`Chunk`]s: slices
//!   borrowed from the caller's header and payload buffers, interleaved with
//!   a few small generated pieces (markers, pad + CRC). The CRC is computed
//!   while the chunks are produced, so payload octets are never copied; a
//!   sender hands the chunks to `writev`/`sendmsg` as they are.
//! * [`Deframer`] takes the received stream split at any octet and yields,
//!   per FPDU, one [`Event::Header`] (the ULPDU's DDP/RDMAP header, gathered
//!   internally), zero or more [`Event::Payload`] slices borrowed from the
//!   input (markers already removed, so they can be placed directly), and
//!   [`Event::End`] once the pad and CRC have been checked.
//!
//! Both sides count stream positions from the first octet after their own
//! MPA Request/Reply, which is where markers start (RFC 5044). A
//! marker that falls exactly on an FPDU boundary belongs to the following
//! FPDU (FPDUPTR 0) and is covered by its CRC; any other marker's FPDUPTR is
//! the distance from the FPDU's ULPDU_Length field to the marker.
//!
//! Neither side ever panics on stream contents: errors are returned and the
//! deframer stays failed afterwards (an MPA stream cannot resynchronise).

use crate::crc::Crc32c;
use crate::{Error, Result};

/// Octets of the ULPDU_Length field.
pub const LEN_FIELD: usize = 2;
/// Octets of the CRC field, present even when CRC is not negotiated.
pub const CRC_LEN: usize = 4;
/// Octets of one marker.
pub const MARKER_LEN: usize = 4;
/// Stream octets from one marker to the next.
pub const MARKER_INTERVAL: u64 = 512;
/// The largest ULPDU the 16-bit length field can describe.
pub const MAX_ULPDU: usize = u16::MAX as usize;
/// The largest ULPDU header the deframer gathers before it hands out payload:
/// an untagged header (18) + Terminate control (4) + segment length (2) +
/// echoed untagged header (18) + echoed Read Request (28). Atomic Requests
/// (70) fit too.
pub const MAX_HEADER: usize = 70;

/// Pad octets after a ULPDU of `ulpdu_len` octets: makes length field + ULPDU
/// + pad a multiple of four. Markers do not count.
#[inline]
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - ((LEN_FIELD + ulpdu_len) % 4)) % 4
}

/// Octets an FPDU with a ULPDU of `ulpdu_len` octets occupies, markers not
/// counted.
#[inline]
pub const fn fpdu_len(ulpdu_len: usize) -> usize {
    LEN_FIELD + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// The largest ULPDU that keeps a whole FPDU within one TCP segment of
/// `emss` octets (RFC 5044 MULPDU): `EMSS − (6 + EMSS mod 4)`, and with
/// markers a further four octets for each marker the segment may hold
/// (`4·⌈EMSS/512⌉`). Returns 0 when `emss` is too small for any ULPDU.
pub fn max_ulpdu(emss: usize, markers: bool) -> usize {
    let overhead = LEN_FIELD + CRC_LEN + emss % 4;
    let marker_room = if markers {
        MARKER_LEN * emss.div_ceil(MARKER_INTERVAL as usize)
    } else {
        0
    };
    emss.saturating_sub(overhead + marker_room).min(MAX_ULPDU)
}

/// The four octets of a marker: 16 reserved zero bits, then FPDUPTR.
#[inline]
pub const fn marker(fpduptr: u16) -> [u8; 4] {
    let p = fpduptr.to_be_bytes();
    [0, 0, p[0], p[1]]
}

/// Writes the ULPDU_Length slot at the front of `fpdu_header` for a header
/// of `fpdu_header.len() − 2` octets followed by `payload_len` payload
/// octets. Returns [`Error::TooLong`] if the ULPDU exceeds 65535 octets.
///
/// # Panics
/// If `fpdu_header` is shorter than the two-octet slot.
pub fn set_ulpdu_len(fpdu_header: &mut [u8], payload_len: usize) -> Result<usize> {
    let ulpdu = fpdu_header.len() - LEN_FIELD + payload_len;
    let len = u16::try_from(ulpdu).map_err(|_| Error::TooLong)?;
    fpdu_header[..LEN_FIELD].copy_from_slice(&len.to_be_bytes());
    Ok(ulpdu)
}

/// A small generated piece of an FPDU: a marker, or pad and CRC (possibly
/// with a marker between them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inline {
    buf: [u8; 8],
    len: u8,
}

impl Inline {
    fn new() -> Self {
        Inline {
            buf: [0; 8],
            len: 0,
        }
    }
    fn push(&mut self, bytes: &[u8]) {
        let at = self.len as usize;
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len() as u8;
    }
    /// The octets of this piece.
    pub fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

/// One contiguous piece of an outgoing FPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk<'a> {
    /// A slice of the caller's header or payload, to be sent as it is.
    Borrowed(&'a [u8]),
    /// Octets the framer generated (marker, pad, CRC); at most 8.
    Inline(Inline),
}

impl Chunk<'_> {
    /// The octets of this chunk.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Chunk::Borrowed(s) => s,
            Chunk::Inline(i) => i.as_slice(),
        }
    }
}

/// The transmit side of one MPA stream direction.
#[derive(Debug, Clone)]
pub struct Framer {
    crc: bool,
    markers: bool,
    /// Octets sent since the marker origin, markers included.
    pos: u64,
}

impl Framer {
    /// A framer at the marker origin. `crc`: compute the CRC (otherwise the
    /// field is sent as zeros); `markers`: insert markers (the peer asked for
    /// them with M=1).
    pub fn new(crc: bool, markers: bool) -> Self {
        Framer {
            crc,
            markers,
            pos: 0,
        }
    }

    /// Whether the CRC is computed.
    pub fn crc(&self) -> bool {
        self.crc
    }

    /// Whether markers are inserted.
    pub fn markers(&self) -> bool {
        self.markers
    }

    /// Octets framed so far (markers included), i.e. the stream position of
    /// the next FPDU relative to the marker origin.
    pub fn stream_position(&self) -> u64 {
        self.pos
    }

    /// Octets the next FPDU with this ULPDU length will occupy on the wire,
    /// markers included.
    pub fn wire_len(&self, ulpdu_len: usize) -> usize {
        let body = fpdu_len(ulpdu_len) as u64;
        if !self.markers {
            return body as usize;
        }
        // Count the markers a body of `body` octets starting at `pos` gets:
        // walk marker positions; each marker pushes the end out by 4.
        let mut end = self.pos + body;
        let mut next = self.pos.next_multiple_of(MARKER_INTERVAL);
        while next < end {
            end += MARKER_LEN as u64;
            next += MARKER_INTERVAL;
        }
        (end - self.pos) as usize
    }

    /// Frames one FPDU.
    ///
    /// `header` starts with the two-octet ULPDU_Length slot (see
    /// [`set_ulpdu_len`]) followed by the DDP/RDMAP header; `payload` is the
    /// gather list. `sink` receives the chunks in wire order. Returns the
    /// octets produced.
    ///
    /// Errors (nothing is produced and the stream position is unchanged):
    /// [`Error::Truncated`] if `header` has no length slot,
    /// [`Error::TooLong`] if the ULPDU exceeds 65535 octets, and
    /// [`Error::Malformed`] if the slot does not hold the ULPDU's length.
    pub fn frame<'a>(
        &mut self,
        header: &'a [u8],
        payload: &[&'a [u8]],
        mut sink: impl FnMut(Chunk<'a>),
    ) -> Result<usize> {
        if header.len() < LEN_FIELD {
            return Err(Error::Truncated);
        }
        let ulpdu = header.len() - LEN_FIELD + payload.iter().map(|p| p.len()).sum::<usize>();
        if ulpdu > MAX_ULPDU {
            return Err(Error::TooLong);
        }
        if usize::from(u16::from_be_bytes([header[0], header[1]])) != ulpdu {
            return Err(Error::Malformed);
        }
        let start = self.pos;
        let mut g = Gather {
            crc: Crc32c::new(),
            use_crc: self.crc,
            markers: self.markers,
            pos: self.pos,
            fpdu_start: None,
        };
        g.data(header, &mut sink);
        for p in payload {
            g.data(p, &mut sink);
        }
        let mut trailer = Inline::new();
        let pad = [0u8; 3];
        g.small(&pad[..pad_len(ulpdu)], &mut trailer, &mut sink);
        // A marker due right before the CRC field is still inside the range
        // the CRC covers; markers inside the CRC field are not.
        if let Some(m) = g.due_marker() {
            trailer.push(&m);
        }
        let crc = if self.crc { g.crc.wire_bytes() } else { [0; 4] };
        g.use_crc = false;
        g.small(&crc, &mut trailer, &mut sink);
        if trailer.len > 0 {
            sink(Chunk::Inline(trailer));
        }
        self.pos = g.pos;
        Ok((self.pos - start) as usize)
    }

    /// Frames one FPDU into `out` contiguously (for tests, control messages
    /// and small sends). Same errors as [`Framer::frame`].
    pub fn frame_to_vec(
        &mut self,
        header: &[u8],
        payload: &[&[u8]],
        out: &mut Vec<u8>,
    ) -> Result<usize> {
        self.frame(header, payload, |c| out.extend_from_slice(c.as_slice()))
    }
}

/// Produces the chunks of one FPDU, inserting markers by stream position.
struct Gather {
    crc: Crc32c,
    use_crc: bool,
    markers: bool,
    pos: u64,
    /// Stream position of the ULPDU_Length field, once it has been emitted.
    fpdu_start: Option<u64>,
}

impl Gather {
    /// The marker due at the current position, if any.
    fn due_marker(&mut self) -> Option<[u8; 4]> {
        if !self.markers || !self.pos.is_multiple_of(MARKER_INTERVAL) {
            return None;
        }
        let ptr = match self.fpdu_start {
            None => 0,
            Some(s) => (self.pos - s) as u16,
        };
        let m = marker(ptr);
        self.crc.update(&m);
        self.pos += MARKER_LEN as u64;
        Some(m)
    }

    /// Octets until the next marker position (unbounded without markers).
    fn room(&self) -> usize {
        if !self.markers {
            return usize::MAX;
        }
        (MARKER_INTERVAL - self.pos % MARKER_INTERVAL) as usize
    }

    fn account(&mut self, bytes: &[u8]) {
        if self.use_crc {
            self.crc.update(bytes);
        }
        if self.fpdu_start.is_none() {
            self.fpdu_start = Some(self.pos);
        }
        self.pos += bytes.len() as u64;
    }

    /// Borrowed data: split at marker positions, markers sent inline.
    fn data<'a>(&mut self, mut bytes: &'a [u8], sink: &mut impl FnMut(Chunk<'a>)) {
        while !bytes.is_empty() {
            if let Some(m) = self.due_marker() {
                let mut i = Inline::new();
                i.push(&m);
                sink(Chunk::Inline(i));
            }
            let n = bytes.len().min(self.room());
            let (now, rest) = bytes.split_at(n);
            self.account(now);
            sink(Chunk::Borrowed(now));
            bytes = rest;
        }
    }

    /// Generated octets (pad, CRC): gathered into `acc`, markers included.
    fn small<'a>(&mut self, bytes: &[u8], acc: &mut Inline, sink: &mut impl FnMut(Chunk<'a>)) {
        for &b in bytes {
            if let Some(m) = self.due_marker() {
                if acc.len as usize + MARKER_LEN > acc.buf.len() {
                    sink(Chunk::Inline(*acc));
                    *acc = Inline::new();
                }
                acc.push(&m);
            }
            if acc.len as usize == acc.buf.len() {
                sink(Chunk::Inline(*acc));
                *acc = Inline::new();
            }
            self.account(&[b]);
            acc.push(&[b]);
        }
    }
}

/// What the [`Deframer`] found in the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// The DDP/RDMAP header of a new FPDU's ULPDU: the first
    /// `min(ULPDU_Length, header length of its opcode)` octets, where the
    /// header length comes from [`crate::rdmap::header_len_hint`] in stream
    /// mode, or [`MAX_HEADER`] when it depends on later octets (Terminate).
    Header(&'a [u8]),
    /// The next octets of the ULPDU after the header, markers removed.
    Payload(&'a [u8]),
    /// The FPDU is complete: pad and CRC read, and the CRC (when enabled)
    /// matched.
    End {
        /// The ULPDU length of the FPDU that ended.
        ulpdu_len: usize,
    },
}

/// A complete FPDU taken at once by [`Deframer::decode_whole`]: its CRC
/// (when enabled) has been checked before anything of it is handed out.
#[derive(Debug, PartialEq, Eq)]
pub struct WholeFpdu<'a> {
    /// The DDP/RDMAP header, as [`Event::Header`] would give it.
    pub header: &'a [u8],
    /// The rest of the ULPDU, as the [`Event::Payload`]s would give it.
    pub payload: &'a [u8],
    /// The ULPDU length.
    pub ulpdu_len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxState {
    /// Gathering the length field and header into `hdr`.
    Header,
    /// Handing out payload octets.
    Payload,
    /// Reading pad and CRC into `trailer`.
    Trailer,
    /// The stream is unusable after this error.
    Failed(Error),
}

/// The receive side of one MPA stream direction: a resumable deframer.
#[derive(Debug, Clone)]
pub struct Deframer {
    crc_enabled: bool,
    markers: bool,
    /// Octets consumed since the marker origin, markers included.
    pos: u64,
    state: RxState,
    crc: Crc32c,
    /// Length field followed by the header octets.
    hdr: [u8; LEN_FIELD + MAX_HEADER],
    hdr_have: usize,
    /// Header octets wanted (length field included); 0 until known.
    hdr_need: usize,
    ulpdu_len: usize,
    payload_left: usize,
    trailer: [u8; 7],
    trailer_have: usize,
    trailer_need: usize,
    /// Stream position of the current FPDU's length field.
    fpdu_start: Option<u64>,
    marker: [u8; MARKER_LEN],
    marker_have: usize,
}

impl Deframer {
    /// A deframer at the marker origin. `crc`: check the CRC (otherwise the
    /// field is read and ignored); `markers`: the stream carries markers
    /// (we asked for them with M=1).
    pub fn new(crc: bool, markers: bool) -> Self {
        Deframer {
            crc_enabled: crc,
            markers,
            pos: 0,
            state: RxState::Header,
            crc: Crc32c::new(),
            hdr: [0; LEN_FIELD + MAX_HEADER],
            hdr_have: 0,
            hdr_need: 0,
            ulpdu_len: 0,
            payload_left: 0,
            trailer: [0; 7],
            trailer_have: 0,
            trailer_need: 0,
            fpdu_start: None,
            marker: [0; MARKER_LEN],
            marker_have: 0,
        }
    }

    /// Octets consumed since the marker origin.
    pub fn stream_position(&self) -> u64 {
        self.pos
    }

    /// The ULPDU length of the FPDU being received, once its length field
    /// has arrived (valid from [`Event::Header`] to [`Event::End`]).
    pub fn ulpdu_len(&self) -> usize {
        self.ulpdu_len
    }

    /// True between FPDUs (no partial FPDU buffered or in progress).
    pub fn at_boundary(&self) -> bool {
        self.state == RxState::Header && self.hdr_have == 0 && self.marker_have == 0
    }

    /// The fast path for a stream without markers: if the deframer is
    /// between FPDUs and `input` starts with a complete FPDU, checks its
    /// CRC (when enabled) and returns the octets it spans with the FPDU cut
    /// into header and payload — the same header and payload octets that
    /// [`Deframer::decode`] would report as events, but only after the CRC
    /// matched (verify, then place). `Ok(None)`: no complete FPDU at the
    /// start of `input` (or markers are on, or an FPDU is in progress):
    /// use [`Deframer::decode`]. A CRC mismatch fails the deframer as
    /// `decode` would.
    pub fn decode_whole<'a>(&mut self, input: &'a [u8]) -> Result<Option<(usize, WholeFpdu<'a>)>> {
        if let RxState::Failed(e) = self.state {
            return Err(e);
        }
        if self.markers
            || self.state != RxState::Header
            || self.hdr_have != 0
            || input.len() < LEN_FIELD + 2
        {
            return Ok(None);
        }
        let ulpdu_len = usize::from(u16::from_be_bytes([input[0], input[1]]));
        let total = fpdu_len(ulpdu_len);
        if input.len() < total {
            return Ok(None);
        }
        let hdr_len = if ulpdu_len < 2 {
            ulpdu_len
        } else {
            crate::rdmap::header_len_hint(
                &input[LEN_FIELD..LEN_FIELD + 2],
                crate::ddp::Mode::Stream,
            )
            .unwrap_or(MAX_HEADER)
            .min(MAX_HEADER)
            .min(ulpdu_len)
        };
        if self.crc_enabled {
            let crc_at = total - CRC_LEN;
            if crate::crc::to_wire(crate::crc::crc32c(&input[..crc_at]))[..] != input[crc_at..total]
            {
                self.state = RxState::Failed(Error::BadCrc);
                return Err(Error::BadCrc);
            }
        }
        self.pos += total as u64;
        Ok(Some((
            total,
            WholeFpdu {
                header: &input[LEN_FIELD..LEN_FIELD + hdr_len],
                payload: &input[LEN_FIELD + hdr_len..LEN_FIELD + ulpdu_len],
                ulpdu_len,
            },
        )))
    }

    /// Direct placement (a receiver that moves payload from the transport
    /// straight into its destination instead of through [`Deframer::decode`]):
    /// when the stream has no markers and an FPDU's payload is being
    /// received, `Some((payload octets left, trailer octets))` where the
    /// trailer is the pad and the CRC field that follow the payload. `None`
    /// otherwise. Report what was placed with [`Deframer::skip_payload`]
    /// (no CRC) or [`Deframer::placed_payload`] (with or without CRC). With
    /// a CRC the FPDU is verified when its trailer arrives, after its
    /// payload was placed: the caller must act on nothing of it before
    /// [`Event::End`] (a mismatch fails the stream instead).
    pub fn direct_payload(&self) -> Option<(usize, usize)> {
        if self.markers || self.state != RxState::Payload {
            return None;
        }
        Some((self.payload_left, pad_len(self.ulpdu_len) + CRC_LEN))
    }

    /// Accounts for `n` payload octets that the caller placed itself (see
    /// [`Deframer::direct_payload`]) as if they had passed through
    /// [`Deframer::decode`] as [`Event::Payload`]. Refused (`false`,
    /// nothing changed) unless `direct_payload` allows at least `n` — and
    /// always with a CRC, which must see the octets
    /// ([`Deframer::placed_payload`]).
    pub fn skip_payload(&mut self, n: usize) -> bool {
        match self.direct_payload() {
            Some((left, _)) if n <= left && !self.crc_enabled => {
                self.payload_left -= n;
                self.pos += n as u64;
                true
            }
            _ => false,
        }
    }

    /// As [`Deframer::skip_payload`] for the payload octets `placed` (as
    /// they now are where the caller put them), which the CRC, when
    /// enabled, covers. Refused (`false`, nothing changed) unless
    /// `direct_payload` allows at least `placed.len()`.
    pub fn placed_payload(&mut self, placed: &[u8]) -> bool {
        match self.direct_payload() {
            Some((left, _)) if placed.len() <= left => {
                self.take(placed);
                self.payload_left -= placed.len();
                true
            }
            _ => false,
        }
    }

    /// Consumes octets from `input` and reports at most one event.
    ///
    /// Returns the number of octets consumed (possibly less than
    /// `input.len()`; call again with the rest) and the event, if one
    /// completed. After an error every later call returns the same error.
    pub fn decode<'a>(&'a mut self, input: &'a [u8]) -> Result<(usize, Option<Event<'a>>)> {
        if let RxState::Failed(e) = self.state {
            return Err(e);
        }
        match self.step(input) {
            Ok((n, kind)) => Ok((n, self.event(kind, input, n))),
            Err(e) => {
                self.state = RxState::Failed(e);
                Err(e)
            }
        }
    }

    fn event<'a>(&'a self, kind: Found, input: &'a [u8], consumed: usize) -> Option<Event<'a>> {
        match kind {
            Found::Nothing => None,
            Found::Header => Some(Event::Header(&self.hdr[LEN_FIELD..self.hdr_need])),
            Found::Payload(n) => Some(Event::Payload(&input[consumed - n..consumed])),
            Found::End(ulpdu_len) => Some(Event::End { ulpdu_len }),
        }
    }

    /// Consumes a marker if the position calls for one. Returns octets
    /// consumed and whether the marker is complete (or none was due).
    fn strip_marker(&mut self, input: &[u8]) -> Result<(usize, bool)> {
        if !self.markers || (self.marker_have == 0 && !self.pos.is_multiple_of(MARKER_INTERVAL)) {
            return Ok((0, true));
        }
        let n = (MARKER_LEN - self.marker_have).min(input.len());
        self.marker[self.marker_have..self.marker_have + n].copy_from_slice(&input[..n]);
        self.marker_have += n;
        self.pos += n as u64;
        if self.marker_have < MARKER_LEN {
            return Ok((n, false));
        }
        self.marker_have = 0;
        // Markers are covered by the CRC of the FPDU they sit in, except
        // those that fall inside the CRC field itself.
        let in_crc_field =
            self.state == RxState::Trailer && self.trailer_have > pad_len(self.ulpdu_len);
        if !in_crc_field && self.crc_enabled {
            self.crc.update(&self.marker);
        }
        let marker_pos = self.pos - MARKER_LEN as u64;
        let expect = match self.fpdu_start {
            None => 0,
            Some(s) => marker_pos - s,
        };
        if self.marker != marker(expect as u16) {
            return Err(Error::BadMarker);
        }
        Ok((n, true))
    }

    /// Octets of stream data (not markers) before the next marker.
    fn room(&self) -> usize {
        if !self.markers {
            return usize::MAX;
        }
        (MARKER_INTERVAL - self.pos % MARKER_INTERVAL) as usize
    }

    fn take(&mut self, bytes: &[u8]) {
        if self.fpdu_start.is_none() {
            self.fpdu_start = Some(self.pos);
        }
        // Without a negotiated CRC the field is ignored, so skip the work.
        if self.crc_enabled {
            self.crc.update(bytes);
        }
        self.pos += bytes.len() as u64;
    }

    fn step(&mut self, input: &[u8]) -> Result<(usize, Found)> {
        let mut used = 0;
        loop {
            // Transitions that need no input. They come before marker
            // stripping so that a marker right after a completed FPDU is
            // counted as the next FPDU's leading marker.
            match self.state {
                RxState::Failed(e) => return Err(e),
                RxState::Header if self.hdr_need != 0 && self.hdr_have == self.hdr_need => {
                    self.payload_left = self.ulpdu_len + LEN_FIELD - self.hdr_need;
                    self.state = RxState::Payload;
                    return Ok((used, Found::Header));
                }
                RxState::Payload if self.payload_left == 0 => {
                    self.trailer_need = pad_len(self.ulpdu_len) + CRC_LEN;
                    self.trailer_have = 0;
                    self.state = RxState::Trailer;
                    continue;
                }
                _ => {}
            }
            if used == input.len() {
                return Ok((used, Found::Nothing));
            }
            let (m, done) = self.strip_marker(&input[used..])?;
            used += m;
            if !done || used == input.len() {
                return Ok((used, Found::Nothing));
            }
            let avail = &input[used..];
            match self.state {
                RxState::Header => {
                    let target = if self.hdr_need != 0 {
                        self.hdr_need
                    } else if self.hdr_have < LEN_FIELD {
                        LEN_FIELD
                    } else {
                        LEN_FIELD + 2
                    };
                    let n = (target - self.hdr_have).min(avail.len()).min(self.room());
                    self.hdr[self.hdr_have..self.hdr_have + n].copy_from_slice(&avail[..n]);
                    self.take(&avail[..n]);
                    self.hdr_have += n;
                    used += n;
                    if self.hdr_need == 0 && self.hdr_have == LEN_FIELD {
                        self.ulpdu_len =
                            usize::from(u16::from_be_bytes([self.hdr[0], self.hdr[1]]));
                        if self.ulpdu_len < 2 {
                            self.hdr_need = LEN_FIELD + self.ulpdu_len;
                        }
                    } else if self.hdr_need == 0 && self.hdr_have == LEN_FIELD + 2 {
                        let hint = crate::rdmap::header_len_hint(
                            &self.hdr[LEN_FIELD..LEN_FIELD + 2],
                            crate::ddp::Mode::Stream,
                        )
                        .unwrap_or(MAX_HEADER)
                        .min(MAX_HEADER);
                        self.hdr_need = LEN_FIELD + hint.min(self.ulpdu_len);
                    }
                }
                RxState::Payload => {
                    let n = self.payload_left.min(avail.len()).min(self.room());
                    self.take(&avail[..n]);
                    self.payload_left -= n;
                    used += n;
                    return Ok((used, Found::Payload(n)));
                }
                RxState::Trailer => {
                    let pad = pad_len(self.ulpdu_len);
                    let n = (self.trailer_need - self.trailer_have)
                        .min(avail.len())
                        .min(self.room());
                    for &b in &avail[..n] {
                        let i = self.trailer_have;
                        self.trailer[i] = b;
                        self.trailer_have += 1;
                        if i < pad {
                            self.take(&[b]);
                        } else {
                            // CRC octets are not covered by the CRC but do
                            // advance the stream position.
                            self.pos += 1;
                        }
                    }
                    used += n;
                    if self.trailer_have < self.trailer_need {
                        continue;
                    }
                    if self.crc_enabled && self.trailer[pad..pad + CRC_LEN] != self.crc.wire_bytes()
                    {
                        return Err(Error::BadCrc);
                    }
                    let ulpdu_len = self.ulpdu_len;
                    self.reset_fpdu();
                    return Ok((used, Found::End(ulpdu_len)));
                }
                RxState::Failed(e) => return Err(e),
            }
        }
    }

    fn reset_fpdu(&mut self) {
        self.state = RxState::Header;
        self.crc = Crc32c::new();
        self.hdr_have = 0;
        self.hdr_need = 0;
        self.ulpdu_len = 0;
        self.payload_left = 0;
        self.trailer_have = 0;
        self.trailer_need = 0;
        self.fpdu_start = None;
    }
}

#[derive(Debug, Clone, Copy)]
enum Found {
    Nothing,
    Header,
    Payload(usize),
    End(usize),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Golden FPDUs from `testdata/iwarp/golden.txt` (CRC on, no
    /// markers) as (FPDU octets, ULPDU header length).
    fn golden() -> Vec<(Vec<u8>, usize)> {
        let hex = |s: &str| -> Vec<u8> {
            s.split_whitespace()
                .map(|h| u8::from_str_radix(h, 16).unwrap())
                .collect()
        };
        let read_resp_payload: String = (0u8..64).map(|b| format!("{b:02x} ")).collect();
        vec![
            (
                hex("00 1b c1 40 00 00 33 03 00 00 56 00 12 34 00 00
                     52 44 4d 41 2d 57 52 49 54 45 2d 31 33 00 00 00 c3 27 06 ee"),
                14,
            ),
            (
                hex("00 1c 41 43 00 00 00 00 00 00 00 00 00 00 00 01
                     00 00 00 00 68 65 6c 6c 6f 20 73 65 6e 64 00 00 1d bb 43 13"),
                18,
            ),
            (
                hex("00 2e 41 41 00 00 00 00 00 00 00 01 00 00 00 01
                     00 00 00 00 00 01 2a 01 00 00 7f 00 00 00 10 00
                     00 00 00 40 00 00 4c 02 00 00 7f 00 ab cd 00 00 e7 43 84 2d"),
                46,
            ),
            (
                hex(&format!(
                    "00 4e c1 42 00 01 2a 01 00 00 7f 00 00 00 10 00 {read_resp_payload} cc 15 c7 21"
                )),
                14,
            ),
            (
                hex("00 2a 41 47 00 00 00 00 00 00 00 02 00 00 00 01
                     00 00 00 00 12 02 c0 00 00 64 41 43 00 00 00 00
                     00 00 00 00 00 00 00 05 00 00 00 00 71 0d 5e 50"),
                42,
            ),
            (
                hex("00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00 eb d3 4c 5f"),
                14,
            ),
        ]
    }

    /// `decode_whole` cuts every golden FPDU as `decode` does, consumes
    /// exactly one FPDU, declines partial input and FPDUs in progress, and
    /// refuses a bad CRC before handing anything out (only with CRC on).
    #[test]
    fn decode_whole_agrees_with_decode() {
        for (f, hlen) in golden() {
            let ulpdu = usize::from(u16::from_be_bytes([f[0], f[1]]));
            let mut two = f.clone();
            two.extend_from_slice(&f);
            let mut d = Deframer::new(true, false);
            for _ in 0..2 {
                let at = d.stream_position() as usize;
                let (n, w) = d.decode_whole(&two[at..]).unwrap().unwrap();
                assert_eq!(n, f.len());
                assert_eq!(w.header, &f[LEN_FIELD..LEN_FIELD + hlen]);
                assert_eq!(w.payload, &f[LEN_FIELD + hlen..LEN_FIELD + ulpdu]);
                assert_eq!(w.ulpdu_len, ulpdu);
                assert!(d.at_boundary());
            }
            assert_eq!(d.stream_position() as usize, two.len());

            let mut d = Deframer::new(true, false);
            assert_eq!(d.decode_whole(&f[..f.len() - 1]), Ok(None));
            // In progress through `decode`: the fast path stays out.
            let (n, _) = d.decode(&f[..3]).unwrap();
            assert!(n > 0);
            assert_eq!(d.decode_whole(&f[n..]), Ok(None));
            let mut dm = Deframer::new(true, true);
            assert_eq!(dm.decode_whole(&f), Ok(None), "markers: never");

            for flip in [LEN_FIELD + 1, LEN_FIELD + hlen - 1, f.len() - 1] {
                let mut bad = f.clone();
                bad[flip] ^= 0x20;
                let mut d = Deframer::new(true, false);
                assert_eq!(d.decode_whole(&bad), Err(Error::BadCrc));
                assert_eq!(d.decode(&f).map(|(n, _)| n), Err(Error::BadCrc));
                let mut d = Deframer::new(false, false);
                if flip == f.len() - 1 {
                    assert!(d.decode_whole(&bad).unwrap().is_some(), "CRC off");
                }
            }
        }
    }

    #[derive(Debug, Default, PartialEq, Eq)]
    struct Seen {
        header: Vec<u8>,
        payload: Vec<u8>,
        ulpdu_len: usize,
    }

    /// Runs the deframer over `stream` cut at `cuts`; returns completed FPDUs
    /// and the error, if any.
    fn deframe(d: &mut Deframer, stream: &[u8], cuts: &[usize]) -> (Vec<Seen>, Option<Error>) {
        let mut out = Vec::new();
        let mut cur = Seen::default();
        let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&c| c < stream.len()).collect();
        bounds.push(stream.len());
        bounds.sort_unstable();
        let mut at = 0;
        for end in bounds {
            let mut piece = &stream[at..end];
            at = end;
            while !piece.is_empty() {
                match d.decode(piece) {
                    Err(e) => return (out, Some(e)),
                    Ok((n, ev)) => {
                        assert!(n > 0 || ev.is_some(), "no progress");
                        match ev {
                            Some(Event::Header(h)) => {
                                assert!(cur.header.is_empty() && cur.payload.is_empty());
                                cur.header = h.to_vec();
                            }
                            Some(Event::Payload(p)) => {
                                assert!(!p.is_empty());
                                cur.payload.extend_from_slice(p);
                            }
                            Some(Event::End { ulpdu_len }) => {
                                cur.ulpdu_len = ulpdu_len;
                                out.push(std::mem::take(&mut cur));
                            }
                            None => {}
                        }
                        piece = &piece[n..];
                    }
                }
            }
        }
        // Events that need no input (zero-length payload, end) are drained.
        loop {
            match d.decode(&[]) {
                Ok((_, Some(Event::End { ulpdu_len }))) => {
                    cur.ulpdu_len = ulpdu_len;
                    out.push(std::mem::take(&mut cur));
                }
                Ok((_, Some(Event::Header(h)))) => cur.header = h.to_vec(),
                Ok((_, Some(Event::Payload(p)))) => cur.payload.extend_from_slice(p),
                Ok((_, None)) => break,
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    #[test]
    fn pad_and_lengths() {
        assert_eq!(pad_len(14), 0);
        assert_eq!(pad_len(14 + 13), 3);
        assert_eq!(pad_len(18 + 10), 2);
        assert_eq!(fpdu_len(27), 36);
        assert_eq!(fpdu_len(46), 52);
        // MSS 1448 (MTU 1500 with timestamps): ULPDU 1442, so a Write carries
        // 1428 payload octets and a Send 1424, as siw sends them.
        assert_eq!(max_ulpdu(1448, false), 1442);
        assert_eq!(max_ulpdu(1448, false) - 14, 1428);
        assert_eq!(fpdu_len(max_ulpdu(1449, false)), 1448);
        assert!(max_ulpdu(1448, true) <= 1442 - 12);
        assert_eq!(max_ulpdu(5, false), 0);
        assert_eq!(max_ulpdu(1 << 20, false), MAX_ULPDU);
    }

    #[test]
    fn golden_fpdus_reframe_identically() {
        for (fpdu, hlen) in golden() {
            let header = &fpdu[..LEN_FIELD + hlen];
            let ulpdu = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
            let payload = &fpdu[LEN_FIELD + hlen..LEN_FIELD + ulpdu];
            let mut f = Framer::new(true, false);
            let mut out = Vec::new();
            let n = f.frame_to_vec(header, &[payload], &mut out).unwrap();
            assert_eq!(out, fpdu);
            assert_eq!(n, fpdu.len());
            assert_eq!(f.wire_len(ulpdu), fpdu.len());
            // Split the payload into single octets: same bytes.
            let pieces: Vec<&[u8]> = payload.chunks(1).collect();
            let mut out2 = Vec::new();
            Framer::new(true, false)
                .frame_to_vec(header, &pieces, &mut out2)
                .unwrap();
            assert_eq!(out2, fpdu);
        }
    }

    #[test]
    fn golden_fpdus_deframe_at_every_split() {
        let g = golden();
        let stream: Vec<u8> = g.iter().flat_map(|(f, _)| f.clone()).collect();
        for cut in 0..stream.len() {
            let mut d = Deframer::new(true, false);
            let (seen, err) = deframe(&mut d, &stream, &[cut]);
            assert_eq!(err, None);
            assert_eq!(seen.len(), g.len());
            for (s, (fpdu, hlen)) in seen.iter().zip(&g) {
                assert_eq!(s.header, fpdu[2..2 + hlen]);
                assert_eq!(
                    s.ulpdu_len,
                    usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]))
                );
                assert_eq!(s.payload, fpdu[2 + hlen..2 + s.ulpdu_len]);
            }
            assert!(d.at_boundary());
        }
    }

    #[test]
    fn bad_crc_is_reported_and_sticks() {
        let (mut fpdu, _) = golden().remove(0);
        fpdu[20] ^= 0x01;
        let mut d = Deframer::new(true, false);
        let (seen, err) = deframe(&mut d, &fpdu, &[]);
        assert!(seen.is_empty());
        assert_eq!(err, Some(Error::BadCrc));
        assert_eq!(d.decode(&[0, 0]).unwrap_err(), Error::BadCrc);
        // With CRC off the same octets pass, and a zero CRC field is fine.
        let mut d = Deframer::new(false, false);
        assert_eq!(deframe(&mut d, &fpdu, &[]).0.len(), 1);
    }

    /// The length field and a tagged header (14 octets) for `payload`, and
    /// two FPDUs of them framed with or without CRC.
    fn two_tagged_fpdus(payload: &[u8], crc: bool) -> ([u8; 16], Vec<u8>) {
        let ulpdu = (14 + payload.len()) as u16;
        let mut hdr = [0u8; 16];
        hdr[..2].copy_from_slice(&ulpdu.to_be_bytes());
        hdr[2] = 0xc1;
        hdr[3] = 0x40;
        let mut stream = Vec::new();
        let mut f = Framer::new(crc, false);
        f.frame_to_vec(&hdr, &[payload], &mut stream).unwrap();
        f.frame_to_vec(&hdr, &[payload], &mut stream).unwrap();
        (hdr, stream)
    }

    #[test]
    fn skipped_payload_counts_as_decoded() {
        // A tagged header with 1001 payload octets (pad 3).
        let payload = vec![0x5a; 1001];
        let (hdr, stream) = two_tagged_fpdus(&payload, false);
        let mut d = Deframer::new(false, false);
        assert_eq!(d.direct_payload(), None, "between FPDUs");
        let (n, ev) = d.decode(&stream[..16]).unwrap();
        assert_eq!((n, ev), (16, Some(Event::Header(&hdr[2..]))));
        assert_eq!(d.direct_payload(), Some((1001, 3 + CRC_LEN)));
        assert!(!d.skip_payload(1002), "more than is left");
        assert!(d.skip_payload(1000));
        assert!(d.skip_payload(1));
        assert_eq!(d.direct_payload(), Some((0, 3 + CRC_LEN)));
        // The trailer and the next FPDU decode as usual.
        let (seen, err) = deframe(&mut d, &stream[16 + 1001..], &[]);
        assert_eq!(err, None);
        assert_eq!(d.stream_position(), stream.len() as u64);
        assert_eq!(seen.len(), 1 + 1, "end of the first, all of the second");
        assert_eq!(seen[1].payload, payload);
        // With a CRC the placed octets must pass through the CRC: counting
        // them alone is refused.
        let mut d = Deframer::new(true, false);
        d.decode(&stream[..16]).unwrap();
        assert_eq!(d.direct_payload(), Some((1001, 3 + CRC_LEN)));
        assert!(!d.skip_payload(1));
        // With markers no payload may bypass the deframer.
        let mut marked = Vec::new();
        Framer::new(false, true)
            .frame_to_vec(&hdr, &[&payload], &mut marked)
            .unwrap();
        let mut d = Deframer::new(false, true);
        let (n, ev) = d.decode(&marked[..20]).unwrap();
        let (_, ev2) = if ev.is_none() {
            d.decode(&marked[n..20]).unwrap()
        } else {
            (0, ev)
        };
        assert!(matches!(ev2, Some(Event::Header(_))));
        assert_eq!(d.direct_payload(), None);
        assert!(!d.placed_payload(&payload[..1]));
    }

    #[test]
    fn placed_payload_is_covered_by_the_crc() {
        // Two FPDUs with CRC, a tagged header (14 octets) and 1001 payload
        // octets each; the first one's payload is placed by the caller.
        let payload: Vec<u8> = (0..1001u32).map(|i| (i * 7) as u8).collect();
        let (_, stream) = two_tagged_fpdus(&payload, true);
        let run = |placed: &[u8]| {
            let mut d = Deframer::new(true, false);
            d.decode(&stream[..16]).unwrap();
            assert!(!d.placed_payload(&[0; 1002]), "more than is left");
            assert!(d.placed_payload(&placed[..600]));
            assert!(d.placed_payload(&placed[600..]));
            assert_eq!(d.direct_payload(), Some((0, 3 + CRC_LEN)));
            let r = deframe(&mut d, &stream[16 + 1001..], &[]);
            (r, d.stream_position())
        };
        // The octets that arrived: the CRC matches, the stream goes on.
        let ((seen, err), pos) = run(&payload);
        assert_eq!(err, None);
        assert_eq!(pos, stream.len() as u64);
        assert_eq!(seen.len(), 1 + 1, "end of the first, all of the second");
        assert_eq!(seen[1].payload, payload);
        // Octets that differ from what was sent (one bit): the first FPDU's
        // end fails its CRC and nothing after it is reported.
        let mut bad = payload.clone();
        bad[777] ^= 0x10;
        let ((seen, err), _) = run(&bad);
        assert_eq!(err, Some(Error::BadCrc));
        assert!(
            seen.is_empty(),
            "no End for the damaged FPDU: {}",
            seen.len()
        );
    }

    #[test]
    fn crc_off_sends_zero_field() {
        let mut out = Vec::new();
        let hdr = [0, 14, 0xc1, 0x40, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        Framer::new(false, false)
            .frame_to_vec(&hdr, &[], &mut out)
            .unwrap();
        assert_eq!(&out[16..], &[0, 0, 0, 0]);
    }

    #[test]
    fn framer_rejects_inconsistent_length() {
        let mut f = Framer::new(true, true);
        let mut out = Vec::new();
        assert_eq!(
            f.frame_to_vec(&[0, 15, 0xc1, 0x40], &[], &mut out),
            Err(Error::Malformed)
        );
        assert_eq!(f.frame_to_vec(&[0], &[], &mut out), Err(Error::Truncated));
        let big = vec![0u8; MAX_ULPDU];
        assert_eq!(
            f.frame_to_vec(&[0xff, 0xff, 0xc1, 0x40], &[&big], &mut out),
            Err(Error::TooLong)
        );
        assert!(out.is_empty());
        assert_eq!(f.stream_position(), 0);
    }

    #[test]
    fn markers_land_every_512_octets() {
        // Three FPDUs of assorted sizes, markers on.
        let mut f = Framer::new(true, true);
        let mut stream = Vec::new();
        let payload = vec![0xabu8; 1000];
        for len in [1000usize, 3, 600] {
            let mut hdr = vec![0u8; 16];
            hdr[2] = 0xc1;
            hdr[3] = 0x40;
            set_ulpdu_len(&mut hdr, len).unwrap();
            let before = stream.len();
            let n = f
                .frame_to_vec(&hdr, &[&payload[..len]], &mut stream)
                .unwrap();
            assert_eq!(n, stream.len() - before);
        }
        assert_eq!(f.stream_position(), stream.len() as u64);
        // Every 512th octet starts a marker; the first one is a leading
        // marker (FPDUPTR 0).
        assert_eq!(&stream[0..4], &[0, 0, 0, 0]);
        for at in (512..stream.len()).step_by(512) {
            assert_eq!(&stream[at..at + 2], &[0, 0], "marker at {at}");
            let ptr = u16::from_be_bytes([stream[at + 2], stream[at + 3]]);
            assert_eq!(ptr % 4, 0);
        }
        // The second marker sits 512 octets in, 508 past the first FPDU's
        // length field (which follows the leading marker).
        assert_eq!(&stream[512..516], &marker(508));
        let mut d = Deframer::new(true, true);
        let (seen, err) = deframe(&mut d, &stream, &[]);
        assert_eq!(err, None);
        assert_eq!(
            seen.iter().map(|s| s.payload.len()).collect::<Vec<_>>(),
            vec![1000, 3, 600]
        );
        // A marker with a wrong pointer is refused.
        let mut bad = stream.clone();
        bad[515] ^= 4;
        let mut d = Deframer::new(true, true);
        assert_eq!(deframe(&mut d, &bad, &[]).1, Some(Error::BadMarker));
    }

    #[test]
    fn wire_len_counts_markers() {
        let mut f = Framer::new(false, true);
        let payload = vec![7u8; 5000];
        for len in [0usize, 1, 2, 500, 505, 506, 507, 508, 509, 1020, 1021, 4999] {
            let mut hdr = vec![0u8; 16];
            hdr[2] = 0xc1;
            set_ulpdu_len(&mut hdr, len).unwrap();
            let predicted = f.wire_len(14 + len);
            let mut out = Vec::new();
            let n = f.frame_to_vec(&hdr, &[&payload[..len]], &mut out).unwrap();
            assert_eq!(predicted, n, "len {len}");
        }
    }

    /// A ULPDU for the property tests: a plausible first two octets so the
    /// header hint applies, then arbitrary octets.
    fn arb_ulpdu() -> impl Strategy<Value = Vec<u8>> {
        let ctrl = prop_oneof![
            Just([0xc1u8, 0x40]), // Write
            Just([0xc1, 0x42]),   // Read Response
            Just([0x41, 0x43]),   // Send
            Just([0x01, 0x43]),   // Send, not last
            Just([0x41, 0x41]),   // Read Request
            Just([0x41, 0x47]),   // Terminate
            Just([0x41, 0x4a]),   // Atomic Request
            any::<[u8; 2]>(),
        ];
        (ctrl, prop::collection::vec(any::<u8>(), 0..1500)).prop_map(|(c, mut rest)| {
            let mut v = c.to_vec();
            v.append(&mut rest);
            v
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn deframer_reproduces_fpdus_under_any_split(
            ulpdus in prop::collection::vec(arb_ulpdu(), 1..8),
            short in prop::collection::vec(0usize..2, 0..3),
            cuts in prop::collection::vec(0usize..20_000, 0..40),
            crc in any::<bool>(),
            markers in any::<bool>(),
        ) {
            let mut ulpdus = ulpdus;
            // Also cover ULPDUs of 0 and 1 octets.
            for s in short { ulpdus.push(vec![0xc1; s]); }
            let mut f = Framer::new(crc, markers);
            let mut stream = Vec::new();
            for u in &ulpdus {
                // Header/payload split at an arbitrary but fixed point: the
                // framer does not care where the caller's header ends.
                let cut = u.len().min(14);
                let mut hdr = vec![0u8; 2 + cut];
                hdr[2..].copy_from_slice(&u[..cut]);
                set_ulpdu_len(&mut hdr, u.len() - cut).unwrap();
                f.frame_to_vec(&hdr, &[&u[cut..]], &mut stream).unwrap();
            }
            prop_assert_eq!(f.stream_position(), stream.len() as u64);
            let mut d = Deframer::new(crc, markers);
            let (seen, err) = deframe(&mut d, &stream, &cuts);
            prop_assert_eq!(err, None);
            prop_assert_eq!(seen.len(), ulpdus.len());
            for (s, u) in seen.iter().zip(&ulpdus) {
                let mut whole = s.header.clone();
                whole.extend_from_slice(&s.payload);
                prop_assert_eq!(&whole, u);
                prop_assert_eq!(s.ulpdu_len, u.len());
                prop_assert!(s.header.len() <= MAX_HEADER);
            }
            prop_assert!(d.at_boundary());
            prop_assert_eq!(d.stream_position(), stream.len() as u64);
        }

        #[test]
        fn a_flipped_bit_never_passes_with_crc(
            ulpdu in arb_ulpdu(),
            markers in any::<bool>(),
            bit in any::<prop::sample::Index>(),
        ) {
            let mut f = Framer::new(true, markers);
            let mut stream = Vec::new();
            let mut hdr = vec![0u8; 2];
            set_ulpdu_len(&mut hdr, ulpdu.len()).unwrap();
            f.frame_to_vec(&hdr, &[&ulpdu], &mut stream).unwrap();
            let i = bit.index(stream.len() * 8);
            stream[i / 8] ^= 1 << (i % 8);
            let mut d = Deframer::new(true, markers);
            let (seen, err) = deframe(&mut d, &stream, &[]);
            // Either an error, or the (corrupted) length left the FPDU
            // incomplete; never a clean FPDU.
            prop_assert!(err.is_some() || seen.is_empty(), "{:?} {:?}", seen, err);
        }

        #[test]
        fn deframer_never_panics(
            data in prop::collection::vec(any::<u8>(), 0..3000),
            cuts in prop::collection::vec(0usize..3000, 0..10),
            crc in any::<bool>(),
            markers in any::<bool>(),
        ) {
            let mut d = Deframer::new(crc, markers);
            let _ = deframe(&mut d, &data, &cuts);
        }
    }
}
