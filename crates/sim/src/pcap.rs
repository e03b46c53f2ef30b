//! Classic pcap writer and reader, with Ethernet + IPv4 + TCP/UDP framing.
//!
//! Files use the classic format: magic `0xa1b2c3d4` written in little-endian
//! order (microsecond timestamps), version 2.4, link type
//! [`LINKTYPE_ETHERNET`]. Every IPv4 header checksum and every TCP/UDP
//! checksum is computed, so `tshark -o tcp.check_checksum:TRUE` (and the IPv4
//! and UDP equivalents) reports them as good.
//!
//! Ethernet addresses are derived from the IPv4 address
//! (`02:00:a:b:c:d` for `a.b.c.d`), so every endpoint has a stable, locally
//! administered MAC.
//!
//! Timestamps come from the writer's clock: each frame gets the next tick,
//! starting at [`PcapWriter::DEFAULT_START`] and advancing by
//! [`PcapWriter::DEFAULT_STEP`] unless [`PcapWriter::with_clock`] chose
//! otherwise.
//!
//! ```
//! use softrdma_sim::pcap::{Dir, PcapWriter, TcpSession};
//! use std::net::{Ipv4Addr, SocketAddrV4};
//!
//! let client = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 40001);
//! let server = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 2), 7174);
//! let writer = PcapWriter::new(Vec::new())?;
//! let mut tcp = TcpSession::open(writer, client, server)?;
//! tcp.send(Dir::ClientToServer, b"hello")?;
//! tcp.send_segments(Dir::ServerToClient, &[b"one", b"two"])?;
//! let bytes: Vec<u8> = tcp.close()?.into_inner();
//! assert_eq!(&bytes[..4], &0xa1b2c3d4u32.to_le_bytes());
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fmt;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::{BitOr, BitOrAssign};
use std::time::Duration;

/// Classic pcap magic number (microsecond timestamps).
pub const PCAP_MAGIC: u32 = 0xa1b2_c3d4;
/// Classic pcap magic number with nanosecond timestamps (accepted by the reader).
pub const PCAP_MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// Link type for Ethernet II frames.
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Snapshot length written in the file header; no frame may be longer.
pub const SNAPLEN: u32 = 262_144;
/// IPv4 protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IPv4 protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETH_HEADER_LEN: usize = 14;
const IPV4_HEADER_LEN: usize = 20;
const TCP_HEADER_LEN: usize = 20;
const UDP_HEADER_LEN: usize = 8;
const IPV4_MAX_TOTAL_LEN: usize = u16::MAX as usize;

/// Largest TCP payload of one segment without options (IPv4 total length limit).
pub const MAX_TCP_PAYLOAD: usize = IPV4_MAX_TOTAL_LEN - IPV4_HEADER_LEN - TCP_HEADER_LEN;
/// Largest UDP payload of one datagram (IPv4 total length limit).
pub const MAX_UDP_PAYLOAD: usize = IPV4_MAX_TOTAL_LEN - IPV4_HEADER_LEN - UDP_HEADER_LEN;

fn invalid_input(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}

fn invalid_data(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

// ---------------------------------------------------------------------------
// Checksums and framing
// ---------------------------------------------------------------------------

/// The Internet checksum (RFC 1071) over the concatenation of `parts`.
///
/// Parts may have odd lengths; they are summed as if they were one buffer.
/// The result is the value to store in the header (already complemented).
/// Summing a buffer that contains a correct checksum gives 0.
pub fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    let mut pending_high: Option<u8> = None;
    for part in parts {
        let mut rest: &[u8] = part;
        if let Some(high) = pending_high {
            match rest.split_first() {
                Some((&low, tail)) => {
                    sum += u64::from(u16::from_be_bytes([high, low]));
                    pending_high = None;
                    rest = tail;
                }
                None => continue,
            }
        }
        let mut chunks = rest.chunks_exact(2);
        for pair in &mut chunks {
            sum += u64::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        if let [last] = chunks.remainder() {
            pending_high = Some(*last);
        }
    }
    if let Some(high) = pending_high {
        sum += u64::from(u16::from_be_bytes([high, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn pseudo_header(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, l4_len: usize) -> [u8; 12] {
    let mut ph = [0u8; 12];
    ph[0..4].copy_from_slice(&src.octets());
    ph[4..8].copy_from_slice(&dst.octets());
    ph[9] = protocol;
    ph[10..12].copy_from_slice(&(l4_len as u16).to_be_bytes());
    ph
}

/// The Ethernet address used for an IPv4 address: `02:00:a:b:c:d`.
pub fn mac_for(addr: Ipv4Addr) -> [u8; 6] {
    let o = addr.octets();
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

/// Builds a complete Ethernet II + IPv4 frame around `l4` (a TCP segment or
/// UDP datagram whose own checksum is already filled in).
fn ethernet_ipv4_frame(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ident: u16,
    protocol: u8,
    l4: &[u8],
) -> io::Result<Vec<u8>> {
    let total_len = IPV4_HEADER_LEN + l4.len();
    if total_len > IPV4_MAX_TOTAL_LEN {
        return Err(invalid_input(format!(
            "IPv4 packet of {total_len} octets exceeds 65535"
        )));
    }
    let mut frame = Vec::with_capacity(ETH_HEADER_LEN + total_len);
    frame.extend_from_slice(&mac_for(dst));
    frame.extend_from_slice(&mac_for(src));
    frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());

    let mut ip = [0u8; IPV4_HEADER_LEN];
    ip[0] = 0x45; // version 4, IHL 5
    ip[2..4].copy_from_slice(&(total_len as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&ident.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 64; // TTL
    ip[9] = protocol;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let csum = internet_checksum(&[&ip]);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());

    frame.extend_from_slice(&ip);
    frame.extend_from_slice(l4);
    Ok(frame)
}

/// TCP header flags.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// No flags.
    pub const NONE: TcpFlags = TcpFlags(0);
    /// FIN: no more data from the sender.
    pub const FIN: TcpFlags = TcpFlags(0x01);
    /// SYN: synchronize sequence numbers.
    pub const SYN: TcpFlags = TcpFlags(0x02);
    /// RST: reset the connection.
    pub const RST: TcpFlags = TcpFlags(0x04);
    /// PSH: push function.
    pub const PSH: TcpFlags = TcpFlags(0x08);
    /// ACK: the acknowledgment field is significant.
    pub const ACK: TcpFlags = TcpFlags(0x10);
    /// URG: the urgent pointer is significant.
    pub const URG: TcpFlags = TcpFlags(0x20);

    /// Whether every flag of `other` is set in `self`.
    pub fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for TcpFlags {
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(TcpFlags, &str); 6] = [
            (TcpFlags::FIN, "FIN"),
            (TcpFlags::SYN, "SYN"),
            (TcpFlags::RST, "RST"),
            (TcpFlags::PSH, "PSH"),
            (TcpFlags::ACK, "ACK"),
            (TcpFlags::URG, "URG"),
        ];
        let mut first = true;
        f.write_str("TcpFlags(")?;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if self.0 & 0xc0 != 0 {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "{:#04x}", self.0 & 0xc0)?;
        }
        f.write_str(")")
    }
}

/// One TCP segment to be written by [`PcapWriter::write_tcp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpSegment<'a> {
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number (only meaningful with [`TcpFlags::ACK`]).
    pub ack: u32,
    /// Header flags.
    pub flags: TcpFlags,
    /// Receive window.
    pub window: u16,
    /// If set, a Maximum Segment Size option with this value (normally on
    /// SYN segments only).
    pub mss_option: Option<u16>,
    /// Payload octets.
    pub payload: &'a [u8],
}

fn tcp_segment_bytes(src: SocketAddrV4, dst: SocketAddrV4, seg: &TcpSegment<'_>) -> Vec<u8> {
    let options_len = if seg.mss_option.is_some() { 4 } else { 0 };
    let header_len = TCP_HEADER_LEN + options_len;
    let mut out = Vec::with_capacity(header_len + seg.payload.len());
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
    out.extend_from_slice(&seg.seq.to_be_bytes());
    out.extend_from_slice(&seg.ack.to_be_bytes());
    out.push(((header_len / 4) as u8) << 4);
    out.push(seg.flags.0);
    out.extend_from_slice(&seg.window.to_be_bytes());
    out.extend_from_slice(&[0, 0]); // checksum, filled below
    out.extend_from_slice(&[0, 0]); // urgent pointer
    if let Some(mss) = seg.mss_option {
        out.extend_from_slice(&[2, 4]);
        out.extend_from_slice(&mss.to_be_bytes());
    }
    out.extend_from_slice(seg.payload);
    let ph = pseudo_header(*src.ip(), *dst.ip(), IPPROTO_TCP, out.len());
    let csum = internet_checksum(&[&ph, &out]);
    out[16..18].copy_from_slice(&csum.to_be_bytes());
    out
}

fn udp_datagram_bytes(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let len = UDP_HEADER_LEN + payload.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
    let ph = pseudo_header(*src.ip(), *dst.ip(), IPPROTO_UDP, len);
    let mut csum = internet_checksum(&[&ph, &out]);
    if csum == 0 {
        // 0 means "no checksum" in UDP over IPv4; RFC 768 sends all ones.
        csum = 0xffff;
    }
    out[6..8].copy_from_slice(&csum.to_be_bytes());
    out
}

// ---------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------

/// Writes a classic pcap stream (Ethernet link type) to any [`Write`].
///
/// The global header is written by the constructor. Frames are written
/// immediately; wrap the output in a [`std::io::BufWriter`] if it is a file.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    next_ts: Duration,
    step: Duration,
    ip_ident: u16,
    frames: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Timestamp of the first frame by default (2023-11-14T22:13:20Z).
    pub const DEFAULT_START: Duration = Duration::from_secs(1_700_000_000);
    /// Interval between consecutive frames by default.
    pub const DEFAULT_STEP: Duration = Duration::from_millis(1);

    /// Starts a pcap stream with the default clock and writes the global header.
    pub fn new(out: W) -> io::Result<Self> {
        Self::with_clock(out, Self::DEFAULT_START, Self::DEFAULT_STEP)
    }

    /// Starts a pcap stream whose first frame is stamped `start` (since the
    /// Unix epoch) and each following frame `step` later.
    pub fn with_clock(mut out: W, start: Duration, step: Duration) -> io::Result<Self> {
        if start.as_secs() > u64::from(u32::MAX) {
            return Err(invalid_input("pcap timestamps must fit in 32-bit seconds"));
        }
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&PCAP_MAGIC.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes());
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone = 0, sigfigs = 0
        header[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&header)?;
        Ok(PcapWriter {
            out,
            next_ts: start,
            step,
            ip_ident: 1,
            frames: 0,
        })
    }

    /// Timestamp the next frame written without an explicit time will get.
    pub fn next_timestamp(&self) -> Duration {
        self.next_ts
    }

    /// Number of frames written so far.
    pub fn frames_written(&self) -> u64 {
        self.frames
    }

    /// Writes one raw link-layer (Ethernet) frame at the next clock tick.
    pub fn write_frame(&mut self, frame: &[u8]) -> io::Result<()> {
        self.write_frame_at(self.next_ts, frame)
    }

    /// Writes one raw link-layer (Ethernet) frame with timestamp `ts`.
    ///
    /// The clock then continues from `ts + step` if that is later than its
    /// current next tick, so timestamps never go backwards because of it.
    pub fn write_frame_at(&mut self, ts: Duration, frame: &[u8]) -> io::Result<()> {
        if frame.len() > SNAPLEN as usize {
            return Err(invalid_input(format!(
                "frame of {} octets exceeds the snapshot length {SNAPLEN}",
                frame.len()
            )));
        }
        let secs = u32::try_from(ts.as_secs())
            .map_err(|_| invalid_input("pcap timestamps must fit in 32-bit seconds"))?;
        let mut rec = [0u8; 16];
        rec[0..4].copy_from_slice(&secs.to_le_bytes());
        rec[4..8].copy_from_slice(&ts.subsec_micros().to_le_bytes());
        rec[8..12].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        rec[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&rec)?;
        self.out.write_all(frame)?;
        self.frames += 1;
        let after = ts + self.step;
        if after > self.next_ts {
            self.next_ts = after;
        }
        Ok(())
    }

    /// Writes an Ethernet + IPv4 frame carrying `l4` (whose own checksum, if
    /// any, must already be set) as IP protocol `protocol`.
    pub fn write_ipv4(
        &mut self,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        protocol: u8,
        l4: &[u8],
    ) -> io::Result<()> {
        let frame = ethernet_ipv4_frame(src, dst, self.ip_ident, protocol, l4)?;
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.write_frame(&frame)
    }

    /// Writes one TCP segment from `src` to `dst`, computing the checksum.
    pub fn write_tcp(
        &mut self,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        seg: &TcpSegment<'_>,
    ) -> io::Result<()> {
        let bytes = tcp_segment_bytes(src, dst, seg);
        self.write_ipv4(*src.ip(), *dst.ip(), IPPROTO_TCP, &bytes)
    }

    /// Writes one UDP datagram from `src` to `dst`, computing the checksum.
    pub fn write_udp(
        &mut self,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        payload: &[u8],
    ) -> io::Result<()> {
        if payload.len() > MAX_UDP_PAYLOAD {
            return Err(invalid_input(format!(
                "UDP payload of {} octets exceeds {MAX_UDP_PAYLOAD}",
                payload.len()
            )));
        }
        let bytes = udp_datagram_bytes(src, dst, payload);
        self.write_ipv4(*src.ip(), *dst.ip(), IPPROTO_UDP, &bytes)
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The underlying writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// The underlying writer, mutably. Writing to it directly corrupts the
    /// pcap stream.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Returns the underlying writer (not flushed; call [`flush`](Self::flush)
    /// first if it buffers).
    pub fn into_inner(self) -> W {
        self.out
    }
}

// ---------------------------------------------------------------------------
// TCP session
// ---------------------------------------------------------------------------

/// Direction of traffic in a [`TcpSession`] or [`UdpFlow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// From the client (connection initiator / first endpoint) to the server.
    ClientToServer,
    /// From the server (responder / second endpoint) to the client.
    ServerToClient,
}

impl Dir {
    /// The opposite direction.
    pub fn reverse(self) -> Dir {
        match self {
            Dir::ClientToServer => Dir::ServerToClient,
            Dir::ServerToClient => Dir::ClientToServer,
        }
    }

    fn index(self) -> usize {
        match self {
            Dir::ClientToServer => 0,
            Dir::ServerToClient => 1,
        }
    }
}

/// Parameters of a synthesized TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Maximum segment size: advertised in both SYNs and used by
    /// [`TcpSession::send`] to split data. Default 1448 (MTU 1500 with TCP
    /// timestamps, as Linux uses).
    pub mss: u16,
    /// Client's initial sequence number.
    pub client_isn: u32,
    /// Server's initial sequence number.
    pub server_isn: u32,
    /// Receive window both sides advertise.
    pub window: u16,
    /// Whether [`TcpSession::send`] and [`TcpSession::send_segments`] end
    /// with a pure ACK from the receiving side. Default `true`; when `false`,
    /// call [`TcpSession::ack`] yourself.
    pub auto_ack: bool,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            mss: 1448,
            client_isn: 0x1000_0000,
            server_isn: 0x2000_0000,
            window: 65535,
            auto_ack: true,
        }
    }
}

/// A synthesized TCP connection between two IPv4 endpoints, written to a pcap.
///
/// [`open`](Self::open) writes the 3-way handshake (SYN and SYN-ACK carry an
/// MSS option). Data segments always carry ACK; sequence and acknowledgment
/// numbers are tracked per direction (with wrap-around), so Wireshark's TCP
/// analysis finds nothing to complain about.
#[derive(Debug)]
pub struct TcpSession<W: Write> {
    writer: PcapWriter<W>,
    client: SocketAddrV4,
    server: SocketAddrV4,
    config: TcpConfig,
    /// Next sequence number per direction (index = `Dir::index`).
    next_seq: [u32; 2],
    /// Payload octets sent per direction.
    sent: [u64; 2],
}

impl<W: Write> TcpSession<W> {
    /// Opens a connection with [`TcpConfig::default`] and writes the handshake.
    pub fn open(
        writer: PcapWriter<W>,
        client: SocketAddrV4,
        server: SocketAddrV4,
    ) -> io::Result<Self> {
        Self::open_with(writer, client, server, TcpConfig::default())
    }

    /// Opens a connection with `config` and writes the handshake.
    pub fn open_with(
        writer: PcapWriter<W>,
        client: SocketAddrV4,
        server: SocketAddrV4,
        config: TcpConfig,
    ) -> io::Result<Self> {
        if config.mss == 0 {
            return Err(invalid_input("TCP MSS must be at least 1"));
        }
        let mut session = TcpSession {
            writer,
            client,
            server,
            config,
            next_seq: [config.client_isn, config.server_isn],
            sent: [0, 0],
        };
        let c = Dir::ClientToServer;
        let s = Dir::ServerToClient;
        session.emit(c, TcpFlags::SYN, Some(config.mss), &[])?;
        session.next_seq[0] = session.next_seq[0].wrapping_add(1);
        session.emit(s, TcpFlags::SYN | TcpFlags::ACK, Some(config.mss), &[])?;
        session.next_seq[1] = session.next_seq[1].wrapping_add(1);
        session.emit(c, TcpFlags::ACK, None, &[])?;
        Ok(session)
    }

    fn endpoints(&self, dir: Dir) -> (SocketAddrV4, SocketAddrV4) {
        match dir {
            Dir::ClientToServer => (self.client, self.server),
            Dir::ServerToClient => (self.server, self.client),
        }
    }

    /// Writes one segment in `dir` at the current sequence numbers, without
    /// advancing them.
    fn emit(
        &mut self,
        dir: Dir,
        flags: TcpFlags,
        mss_option: Option<u16>,
        payload: &[u8],
    ) -> io::Result<()> {
        let (src, dst) = self.endpoints(dir);
        let seg = TcpSegment {
            seq: self.next_seq[dir.index()],
            ack: if flags.contains(TcpFlags::ACK) {
                self.next_seq[dir.reverse().index()]
            } else {
                0
            },
            flags,
            window: self.config.window,
            mss_option,
            payload,
        };
        self.writer.write_tcp(src, dst, &seg)
    }

    fn emit_data(&mut self, dir: Dir, payload: &[u8], push: bool) -> io::Result<()> {
        if payload.len() > MAX_TCP_PAYLOAD {
            return Err(invalid_input(format!(
                "TCP segment payload of {} octets exceeds {MAX_TCP_PAYLOAD}",
                payload.len()
            )));
        }
        let mut flags = TcpFlags::ACK;
        if push {
            flags |= TcpFlags::PSH;
        }
        self.emit(dir, flags, None, payload)?;
        let i = dir.index();
        self.next_seq[i] = self.next_seq[i].wrapping_add(payload.len() as u32);
        self.sent[i] += payload.len() as u64;
        Ok(())
    }

    /// Sends `data` in `dir`, split into segments of at most the MSS; the
    /// last segment has PSH. Then (with `auto_ack`) the other side sends a
    /// pure ACK. Empty `data` writes nothing.
    pub fn send(&mut self, dir: Dir, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mss = usize::from(self.config.mss).min(MAX_TCP_PAYLOAD);
        let count = data.len().div_ceil(mss);
        for (n, chunk) in data.chunks(mss).enumerate() {
            self.emit_data(dir, chunk, n + 1 == count)?;
        }
        if self.config.auto_ack {
            self.ack(dir)?;
        }
        Ok(())
    }

    /// Sends exactly one segment per slice in `dir`, each with PSH, ignoring
    /// the MSS (a slice may be up to [`MAX_TCP_PAYLOAD`] octets). Then (with
    /// `auto_ack`) the other side sends a pure ACK.
    ///
    /// Use this to control segment boundaries, e.g. one FPDU per segment as
    /// Wireshark's marker-aware MPA parsing requires. Empty slices are
    /// rejected; nothing is written if any slice is invalid.
    pub fn send_segments(&mut self, dir: Dir, segments: &[&[u8]]) -> io::Result<()> {
        for (n, seg) in segments.iter().enumerate() {
            if seg.is_empty() {
                return Err(invalid_input(format!("segment {n} is empty")));
            }
            if seg.len() > MAX_TCP_PAYLOAD {
                return Err(invalid_input(format!(
                    "segment {n} has {} octets, more than {MAX_TCP_PAYLOAD}",
                    seg.len()
                )));
            }
        }
        if segments.is_empty() {
            return Ok(());
        }
        for seg in segments {
            self.emit_data(dir, seg, true)?;
        }
        if self.config.auto_ack {
            self.ack(dir)?;
        }
        Ok(())
    }

    /// Writes a pure ACK acknowledging everything sent in `dir`; it travels
    /// in the opposite direction.
    pub fn ack(&mut self, dir: Dir) -> io::Result<()> {
        self.emit(dir.reverse(), TcpFlags::ACK, None, &[])
    }

    /// Closes the connection: client FIN/ACK, server FIN/ACK, client ACK.
    /// Returns the writer so more frames can follow.
    pub fn close(mut self) -> io::Result<PcapWriter<W>> {
        let c = Dir::ClientToServer;
        let s = Dir::ServerToClient;
        self.emit(c, TcpFlags::FIN | TcpFlags::ACK, None, &[])?;
        self.next_seq[0] = self.next_seq[0].wrapping_add(1);
        self.emit(s, TcpFlags::FIN | TcpFlags::ACK, None, &[])?;
        self.next_seq[1] = self.next_seq[1].wrapping_add(1);
        self.emit(c, TcpFlags::ACK, None, &[])?;
        Ok(self.writer)
    }

    /// Stops without closing (no FIN) and returns the writer.
    pub fn into_writer(self) -> PcapWriter<W> {
        self.writer
    }

    /// The pcap writer, e.g. to interleave UDP datagrams with
    /// [`PcapWriter::write_udp`].
    pub fn writer_mut(&mut self) -> &mut PcapWriter<W> {
        &mut self.writer
    }

    /// Sequence number of the next octet sent in `dir`.
    pub fn next_seq(&self, dir: Dir) -> u32 {
        self.next_seq[dir.index()]
    }

    /// Number of payload octets sent in `dir` so far (the stream offset of
    /// the next octet).
    pub fn bytes_sent(&self, dir: Dir) -> u64 {
        self.sent[dir.index()]
    }

    /// The client endpoint.
    pub fn client(&self) -> SocketAddrV4 {
        self.client
    }

    /// The server endpoint.
    pub fn server(&self) -> SocketAddrV4 {
        self.server
    }

    /// The configuration the session was opened with.
    pub fn config(&self) -> &TcpConfig {
        &self.config
    }
}

// ---------------------------------------------------------------------------
// UDP flow
// ---------------------------------------------------------------------------

/// UDP datagrams between two IPv4 endpoints, written to a pcap.
///
/// [`Dir::ClientToServer`] goes from the first endpoint (`a`) to the second
/// (`b`).
#[derive(Debug)]
pub struct UdpFlow<W: Write> {
    writer: PcapWriter<W>,
    a: SocketAddrV4,
    b: SocketAddrV4,
    sent: [u64; 2],
}

impl<W: Write> UdpFlow<W> {
    /// A flow between `a` (the "client") and `b` (the "server"). Writes nothing.
    pub fn new(writer: PcapWriter<W>, a: SocketAddrV4, b: SocketAddrV4) -> Self {
        UdpFlow {
            writer,
            a,
            b,
            sent: [0, 0],
        }
    }

    /// Writes one datagram carrying `payload` in `dir`.
    pub fn send(&mut self, dir: Dir, payload: &[u8]) -> io::Result<()> {
        let (src, dst) = match dir {
            Dir::ClientToServer => (self.a, self.b),
            Dir::ServerToClient => (self.b, self.a),
        };
        self.writer.write_udp(src, dst, payload)?;
        self.sent[dir.index()] += 1;
        Ok(())
    }

    /// Number of datagrams written in `dir`.
    pub fn datagrams_sent(&self, dir: Dir) -> u64 {
        self.sent[dir.index()]
    }

    /// The pcap writer, e.g. to interleave other frames.
    pub fn writer_mut(&mut self) -> &mut PcapWriter<W> {
        &mut self.writer
    }

    /// Returns the writer.
    pub fn into_writer(self) -> PcapWriter<W> {
        self.writer
    }
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

/// One record of a pcap file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapRecord {
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Original length of the frame on the wire.
    pub orig_len: u32,
    /// Captured octets.
    pub data: Vec<u8>,
}

/// A classic pcap file read into memory (either byte order, micro- or
/// nanosecond timestamps; pcapng is not supported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapFile {
    /// Link type from the global header.
    pub linktype: u32,
    /// Snapshot length from the global header.
    pub snaplen: u32,
    /// The records in file order.
    pub records: Vec<PcapRecord>,
}

impl PcapFile {
    /// Parses a whole classic pcap file.
    pub fn parse(bytes: &[u8]) -> io::Result<PcapFile> {
        if bytes.len() < 24 {
            return Err(invalid_data("pcap file shorter than its global header"));
        }
        let magic_le = u32::from_le_bytes(bytes[0..4].try_into().expect("4 octets"));
        let magic_be = u32::from_be_bytes(bytes[0..4].try_into().expect("4 octets"));
        let (little, nanos) = match (magic_le, magic_be) {
            (PCAP_MAGIC, _) => (true, false),
            (PCAP_MAGIC_NANOS, _) => (true, true),
            (_, PCAP_MAGIC) => (false, false),
            (_, PCAP_MAGIC_NANOS) => (false, true),
            _ => return Err(invalid_data("not a classic pcap file (bad magic)")),
        };
        let u32_at = |off: usize| -> u32 {
            let b: [u8; 4] = bytes[off..off + 4].try_into().expect("4 octets");
            if little {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        let snaplen = u32_at(16);
        let linktype = u32_at(20);
        let mut records = Vec::new();
        let mut off = 24;
        while off < bytes.len() {
            if bytes.len() - off < 16 {
                return Err(invalid_data(format!(
                    "truncated record header at offset {off}"
                )));
            }
            let secs = u32_at(off);
            let frac = u32_at(off + 4);
            let incl = u32_at(off + 8) as usize;
            let orig_len = u32_at(off + 12);
            off += 16;
            if bytes.len() - off < incl {
                return Err(invalid_data(format!("truncated record at offset {off}")));
            }
            let sub = if nanos {
                Duration::from_nanos(u64::from(frac))
            } else {
                Duration::from_micros(u64::from(frac))
            };
            records.push(PcapRecord {
                timestamp: Duration::from_secs(u64::from(secs)) + sub,
                orig_len,
                data: bytes[off..off + incl].to_vec(),
            });
            off += incl;
        }
        Ok(PcapFile {
            linktype,
            snaplen,
            records,
        })
    }
}

/// The transport part of a frame decoded by [`decode_frame`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A TCP segment.
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Sequence number.
        seq: u32,
        /// Acknowledgment number.
        ack: u32,
        /// Header flags.
        flags: TcpFlags,
        /// Receive window.
        window: u16,
        /// Value of the MSS option, if present.
        mss_option: Option<u16>,
        /// Whether the TCP checksum verifies.
        checksum_ok: bool,
        /// Payload octets.
        payload: Vec<u8>,
    },
    /// A UDP datagram.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Whether the UDP checksum verifies (a zero checksum counts as ok).
        checksum_ok: bool,
        /// Payload octets.
        payload: Vec<u8>,
    },
    /// Another IP protocol; its raw octets.
    Other(Vec<u8>),
}

/// An Ethernet + IPv4 frame decoded by [`decode_frame`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4Packet {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// IP protocol number.
    pub protocol: u8,
    /// Whether the IPv4 header checksum verifies.
    pub header_checksum_ok: bool,
    /// The transport segment.
    pub transport: Transport,
}

/// Decodes an Ethernet II + IPv4 (+ TCP/UDP) frame, verifying checksums.
///
/// Returns `None` for anything else (other EtherTypes, IP options are fine,
/// fragments and truncated frames are not).
pub fn decode_frame(frame: &[u8]) -> Option<Ipv4Packet> {
    if frame.len() < ETH_HEADER_LEN + IPV4_HEADER_LEN {
        return None;
    }
    if u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = &frame[ETH_HEADER_LEN..];
    if ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if ihl < IPV4_HEADER_LEN || total < ihl || ip.len() < total {
        return None;
    }
    let frag = u16::from_be_bytes([ip[6], ip[7]]);
    if frag & 0x3fff != 0 {
        return None;
    }
    let protocol = ip[9];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let header_checksum_ok = internet_checksum(&[&ip[..ihl]]) == 0;
    let l4 = &ip[ihl..total];
    let ph = pseudo_header(src, dst, protocol, l4.len());
    let transport = match protocol {
        IPPROTO_TCP => {
            if l4.len() < TCP_HEADER_LEN {
                return None;
            }
            let data_off = usize::from(l4[12] >> 4) * 4;
            if data_off < TCP_HEADER_LEN || data_off > l4.len() {
                return None;
            }
            Transport::Tcp {
                src_port: u16::from_be_bytes([l4[0], l4[1]]),
                dst_port: u16::from_be_bytes([l4[2], l4[3]]),
                seq: u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]),
                ack: u32::from_be_bytes([l4[8], l4[9], l4[10], l4[11]]),
                flags: TcpFlags(l4[13]),
                window: u16::from_be_bytes([l4[14], l4[15]]),
                mss_option: tcp_mss_option(&l4[TCP_HEADER_LEN..data_off]),
                checksum_ok: internet_checksum(&[&ph, l4]) == 0,
                payload: l4[data_off..].to_vec(),
            }
        }
        IPPROTO_UDP => {
            if l4.len() < UDP_HEADER_LEN {
                return None;
            }
            let len = usize::from(u16::from_be_bytes([l4[4], l4[5]]));
            if len < UDP_HEADER_LEN || len > l4.len() {
                return None;
            }
            let stored = u16::from_be_bytes([l4[6], l4[7]]);
            Transport::Udp {
                src_port: u16::from_be_bytes([l4[0], l4[1]]),
                dst_port: u16::from_be_bytes([l4[2], l4[3]]),
                checksum_ok: stored == 0 || internet_checksum(&[&ph, &l4[..len]]) == 0,
                payload: l4[UDP_HEADER_LEN..len].to_vec(),
            }
        }
        _ => Transport::Other(l4.to_vec()),
    };
    Some(Ipv4Packet {
        src,
        dst,
        protocol,
        header_checksum_ok,
        transport,
    })
}

fn tcp_mss_option(mut options: &[u8]) -> Option<u16> {
    while let Some(&kind) = options.first() {
        match kind {
            0 => return None,
            1 => options = &options[1..],
            _ => {
                let len = usize::from(*options.get(1)?);
                if len < 2 || len > options.len() {
                    return None;
                }
                if kind == 2 && len == 4 {
                    return Some(u16::from_be_bytes([options[2], options[3]]));
                }
                options = &options[len..];
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(last: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, last), port)
    }

    #[test]
    fn checksum_rfc1071_example() {
        // RFC 1071 §3 example: sum of these words is 0xddf2, checksum 0x220d.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&[&data]), !0xddf2u16);
        // Splitting at odd boundaries gives the same result.
        assert_eq!(
            internet_checksum(&[&data[..1], &data[1..4], &[], &data[4..7], &data[7..]]),
            !0xddf2u16
        );
        assert_eq!(internet_checksum(&[&[0xab]]), !0xab00u16);
    }

    #[test]
    fn global_header_layout() {
        let w = PcapWriter::new(Vec::new()).unwrap();
        let bytes = w.into_inner();
        assert_eq!(bytes.len(), 24);
        assert_eq!(&bytes[0..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(&bytes[4..8], &[2, 0, 4, 0]);
        assert_eq!(&bytes[20..24], &[1, 0, 0, 0]);
        let file = PcapFile::parse(&bytes).unwrap();
        assert_eq!(file.linktype, LINKTYPE_ETHERNET);
        assert!(file.records.is_empty());
    }

    #[test]
    fn tcp_session_numbers_and_checksums() {
        let cfg = TcpConfig {
            mss: 10,
            client_isn: u32::MAX - 5, // wraps during the data
            server_isn: 77,
            ..TcpConfig::default()
        };
        let w = PcapWriter::new(Vec::new()).unwrap();
        let mut s = TcpSession::open_with(w, ep(1, 1000), ep(2, 2000), cfg).unwrap();
        s.send(Dir::ClientToServer, &[7u8; 25]).unwrap();
        s.send_segments(Dir::ServerToClient, &[b"abc", b"de"])
            .unwrap();
        assert_eq!(s.bytes_sent(Dir::ClientToServer), 25);
        assert_eq!(
            s.next_seq(Dir::ClientToServer),
            (u32::MAX - 5).wrapping_add(26)
        );
        let bytes = s.close().unwrap().into_inner();
        let file = PcapFile::parse(&bytes).unwrap();
        // 3 handshake + 3 data + 1 ack + 2 data + 1 ack + 3 close
        assert_eq!(file.records.len(), 13);

        let mut last_ts = Duration::ZERO;
        let mut summary = Vec::new();
        for rec in &file.records {
            assert!(rec.timestamp > last_ts);
            last_ts = rec.timestamp;
            let p = decode_frame(&rec.data).expect("decodes");
            assert!(p.header_checksum_ok);
            match p.transport {
                Transport::Tcp {
                    seq,
                    ack,
                    flags,
                    checksum_ok,
                    payload,
                    mss_option,
                    src_port,
                    ..
                } => {
                    assert!(checksum_ok);
                    summary.push((src_port, seq, ack, flags, payload.len(), mss_option));
                }
                other => panic!("not TCP: {other:?}"),
            }
        }
        let c = u32::MAX - 5;
        let a = TcpFlags::ACK;
        let pa = TcpFlags::PSH | TcpFlags::ACK;
        let fa = TcpFlags::FIN | TcpFlags::ACK;
        let expect = vec![
            (1000, c, 0, TcpFlags::SYN, 0, Some(10)),
            (2000, 77, c.wrapping_add(1), TcpFlags::SYN | a, 0, Some(10)),
            (1000, c.wrapping_add(1), 78, a, 0, None),
            (1000, c.wrapping_add(1), 78, a, 10, None),
            (1000, c.wrapping_add(11), 78, a, 10, None),
            (1000, c.wrapping_add(21), 78, pa, 5, None),
            (2000, 78, c.wrapping_add(26), a, 0, None),
            (2000, 78, c.wrapping_add(26), pa, 3, None),
            (2000, 81, c.wrapping_add(26), pa, 2, None),
            (1000, c.wrapping_add(26), 83, a, 0, None),
            (1000, c.wrapping_add(26), 83, fa, 0, None),
            (2000, 83, c.wrapping_add(27), fa, 0, None),
            (1000, c.wrapping_add(27), 84, a, 0, None),
        ];
        assert_eq!(summary, expect);
    }

    #[test]
    fn send_segments_rejects_empty_and_writes_nothing() {
        let w = PcapWriter::new(Vec::new()).unwrap();
        let mut s = TcpSession::open(w, ep(1, 1), ep(2, 2)).unwrap();
        let before = s.writer_mut().frames_written();
        assert!(s.send_segments(Dir::ClientToServer, &[b"ok", b""]).is_err());
        assert_eq!(s.writer_mut().frames_written(), before);
        s.send(Dir::ClientToServer, b"").unwrap();
        assert_eq!(s.writer_mut().frames_written(), before);
    }

    #[test]
    fn udp_flow_roundtrip() {
        let w = PcapWriter::with_clock(
            Vec::new(),
            Duration::from_secs(5),
            Duration::from_micros(250),
        )
        .unwrap();
        let mut f = UdpFlow::new(w, ep(1, 5000), ep(2, 6000));
        f.send(Dir::ClientToServer, b"ping").unwrap();
        f.send(Dir::ServerToClient, b"pong!").unwrap();
        f.send(Dir::ClientToServer, b"").unwrap();
        assert_eq!(f.datagrams_sent(Dir::ClientToServer), 2);
        let file = PcapFile::parse(&f.into_writer().into_inner()).unwrap();
        let got: Vec<_> = file
            .records
            .iter()
            .map(|r| {
                let p = decode_frame(&r.data).unwrap();
                assert!(p.header_checksum_ok);
                match p.transport {
                    Transport::Udp {
                        src_port,
                        dst_port,
                        checksum_ok,
                        payload,
                    } => {
                        assert!(checksum_ok);
                        (r.timestamp, p.src, src_port, dst_port, payload)
                    }
                    other => panic!("not UDP: {other:?}"),
                }
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    Duration::from_secs(5),
                    Ipv4Addr::new(192, 0, 2, 1),
                    5000,
                    6000,
                    b"ping".to_vec()
                ),
                (
                    Duration::from_micros(5_000_250),
                    Ipv4Addr::new(192, 0, 2, 2),
                    6000,
                    5000,
                    b"pong!".to_vec()
                ),
                (
                    Duration::from_micros(5_000_500),
                    Ipv4Addr::new(192, 0, 2, 1),
                    5000,
                    6000,
                    vec![]
                ),
            ]
        );
    }

    #[test]
    fn oversized_inputs_are_rejected() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        let big = vec![0u8; MAX_UDP_PAYLOAD + 1];
        assert!(w.write_udp(ep(1, 1), ep(2, 2), &big).is_err());
        assert!(w.write_udp(ep(1, 1), ep(2, 2), &big[1..]).is_ok());
        let w = PcapWriter::new(Vec::new()).unwrap();
        let mut s = TcpSession::open(w, ep(1, 1), ep(2, 2)).unwrap();
        let big = vec![0u8; MAX_TCP_PAYLOAD + 1];
        assert!(s.send_segments(Dir::ClientToServer, &[&big]).is_err());
        assert!(s.send_segments(Dir::ClientToServer, &[&big[1..]]).is_ok());
        let cfg = TcpConfig {
            mss: 0,
            ..TcpConfig::default()
        };
        assert!(TcpSession::open_with(
            PcapWriter::new(Vec::new()).unwrap(),
            ep(1, 1),
            ep(2, 2),
            cfg
        )
        .is_err());
    }

    #[test]
    fn flags_debug() {
        assert_eq!(
            format!("{:?}", TcpFlags::SYN | TcpFlags::ACK),
            "TcpFlags(SYN|ACK)"
        );
    }
}
