//! Where datagram QPs hand their datagrams: the [`DatagramSink`] trait,
//! and the two ways a batch is offered to it (gathered io-vectors, or
//! framed back to back in a staging buffer).
//!
//! Contract: a sink takes datagrams in order and stops at the first it
//! does not accept; `WouldBlock` means "not now", and whatever was not
//! accepted is offered again later.

use std::io::{self, IoSlice};
use std::net::IpAddr;

use softrdma_wire::datagram::{self, CRC_LEN};

/// Datagrams handed to [`DatagramSink::send_batch`] at once.
pub const TX_BATCH: usize = 32;

/// Octets of the staging buffer in which a batch of datagrams is framed
/// contiguously (header, payload copied behind it, CRC), so that the
/// kernel takes each GSO run as one io-vector. A gather of three or more
/// io-vectors per datagram costs the kernel's copy more than the copy into
/// the staging buffer costs us. Datagrams
/// larger than [`STAGE_MAX_DGRAM`] are gathered as before.
const STAGE_CAP: usize = 64 << 10;
/// Smallest batch framed in the staging buffer: below it (the latency
/// path) the datagrams are gathered, or copied whole when small.
pub(crate) const STAGE_MIN_BATCH: usize = 5;
/// Largest datagram staged (CRC included): at least four fit in the
/// staging buffer, and for larger ones the io-vectors around the payload
/// cost little.
pub(crate) const STAGE_MAX_DGRAM: usize = STAGE_CAP / 4;

/// One datagram of a batch: destination and the gathered pieces (header,
/// payload slices, CRC trailer).
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Destination IP address and UDP port.
    pub dest: (IpAddr, u16),
    /// The UDP payload, in pieces.
    pub bufs: &'a [IoSlice<'a>],
}

/// Where [`UdQp::poll_transmit`](crate::ud::UdQp::poll_transmit) hands its datagrams (a UDP socket in the
/// engine, a vector in tests).
pub trait DatagramSink {
    /// Sends one datagram made of `bufs` to `dest`. `WouldBlock` means "not
    /// now": the datagram stays pending and is offered again later.
    fn send(&mut self, dest: (IpAddr, u16), bufs: &[IoSlice<'_>]) -> io::Result<()>;

    /// Sends datagrams in order, stopping at the first that is not
    /// accepted, like `sendmmsg`: `Ok(n)` with `n ≥ 1` when the first `n`
    /// were accepted, `Err(e)` when the first one failed with `e`. The
    /// default calls [`DatagramSink::send`] for each.
    fn send_batch(&mut self, batch: &[Datagram<'_>]) -> io::Result<usize> {
        for (i, d) in batch.iter().enumerate() {
            if let Err(e) = self.send(d.dest, d.bufs) {
                return if i == 0 { Err(e) } else { Ok(i) };
            }
        }
        Ok(batch.len())
    }
}

/// Frames datagrams back to back into `stage` (grown to [`STAGE_CAP`] on
/// first use and kept) and offers each as one buffer, all at once:
/// `frame(j, room)` writes datagram `j` (for `dests[j]`) without its CRC at
/// the start of `room` and returns its length, or `None` if it does not
/// fit in `room` or its payload cannot be read, which ends the batch before
/// it. No datagram gets more than [`STAGE_MAX_DGRAM`] octets (CRC
/// included). The CRC is sealed behind each. Returns how many were offered
/// and what the sink said of them; `None` (nothing offered) if not even
/// the first was framed. Fewer may be offered than `dests` holds: a sink
/// that takes all it was offered has not pushed back.
pub(crate) fn offer_staged<S: DatagramSink>(
    sink: &mut S,
    stage: &mut Vec<u8>,
    dests: &[(IpAddr, u16)],
    mut frame: impl FnMut(usize, &mut [u8]) -> Option<usize>,
) -> Option<(usize, io::Result<usize>)> {
    if stage.len() < STAGE_CAP {
        stage.resize(STAGE_CAP, 0);
    }
    let mut spans = [(0usize, 0usize); TX_BATCH];
    let (mut n, mut at) = (0, 0);
    // Each datagram is sealed after the next one is framed: the CRC then
    // reads octets whose stores have left the store buffer, where sealing
    // right behind the copy waits for them (on this host a 1.4 KiB copy
    // and its CRC take ~63 ns back to back and ~44 ns this way).
    let mut unsealed: Option<(usize, usize)> = None;
    for j in 0..dests.len().min(TX_BATCH) {
        // Room for this datagram's CRC too: the CRC_LEN octets behind
        // `len` are reserved, so framing the next one never overlaps it.
        let room = STAGE_MAX_DGRAM.min(STAGE_CAP - at).saturating_sub(CRC_LEN);
        let Some(len) = frame(j, &mut stage[at..at + room]) else {
            break;
        };
        if let Some((a, l)) = unsealed.replace((at, len)) {
            datagram::seal(&mut stage[a..], l);
        }
        spans[n] = (at, at + len + CRC_LEN);
        at += len + CRC_LEN;
        n += 1;
    }
    let (a, l) = unsealed?;
    datagram::seal(&mut stage[a..], l);
    let mut iov = [IoSlice::new(&[]); TX_BATCH];
    let mut bounds = [(0usize, 0usize); TX_BATCH];
    for (j, &(a, b)) in spans[..n].iter().enumerate() {
        iov[j] = IoSlice::new(&stage[a..b]);
        bounds[j] = (j, j + 1);
    }
    Some((
        n,
        offer::<S, TX_BATCH>(sink, &dests[..n], &iov, &bounds[..n]),
    ))
}

/// Offers at most `N` datagrams to `sink` at once: datagram `j` goes to
/// `dests[j]` and is made of the io-vectors `iov[bounds[j].0..bounds[j].1]`.
pub(crate) fn offer<S: DatagramSink, const N: usize>(
    sink: &mut S,
    dests: &[(IpAddr, u16)],
    iov: &[IoSlice<'_>],
    bounds: &[(usize, usize)],
) -> io::Result<usize> {
    let empty = Datagram {
        dest: dests[0],
        bufs: &[],
    };
    let mut batch = [empty; N];
    for ((d, dest), &(a, b)) in batch.iter_mut().zip(dests).zip(bounds) {
        *d = Datagram {
            dest: *dest,
            bufs: &iov[a..b],
        };
    }
    sink.send_batch(&batch[..bounds.len().min(N)])
}
