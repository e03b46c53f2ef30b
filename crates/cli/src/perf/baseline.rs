//! Raw-socket baselines, measured in the same run as softrdma and waiting
//! the same way ([`WaitMode`]): `tcp_lat` and `udp_lat` (ping-pong,
//! one way = round trip / 2), `tcp_bw` and `udp_bw` (stream).
//!
//! * `tcp_lat`: TCP_NODELAY, `size` octets each way per round trip.
//! * `tcp_mpa_lat`: `tcp_lat` whose messages are what an RC Send puts on
//!   the wire (one MPA FPDU per message of up to 16 KiB: RDMAP Send header,
//!   pad, CRC32C), framed and taken apart with softrdma's own wire code
//!   and nothing else: the sender emits the header, copies the payload
//!   behind it and computes the CRC; the receiver checks the CRC, parses
//!   and checks the header (opcode, queue, MSN) and copies the payload to
//!   its receive buffer. No queues, locks, registry or completion queue:
//!   the floor of any iWARP Send over kernel sockets built on this wire
//!   code, so `softrdma perf tcp_mpa_lat` (a ratio to `tcp_lat` of the
//!   same run) splits the RC latency ratio into protocol and engine.
//! * `udp_dgram_lat`: `udp_lat` whose datagrams are what a UD Send of one
//!   datagram puts on the wire (DDP untagged header with the DQPN word,
//!   RDMAP Send, payload, CRC32C trailer), framed and taken apart with
//!   softrdma's datagram wire code and nothing else: the sender emits the
//!   header, copies the payload behind it and seals it with the CRC; the
//!   receiver checks the CRC, parses and checks the header (opcode, queue,
//!   MSN, DQPN) and copies the payload to its receive buffer. The UD
//!   counterpart of `tcp_mpa_lat`: `softrdma perf udp_dgram_lat` (a ratio
//!   to `udp_lat` of the same run) splits the UD latency ratio into
//!   protocol and engine. Messages of one datagram only.
//! * `tcp_bw`: `size`-octet writes; the receiver reads 256 KiB at a time
//!   and acknowledges EOF with one octet; the sender's clock stops at that
//!   acknowledgement, so nothing still queued in socket buffers counts.
//!   A write the full socket refuses is retried once `poll` says there is
//!   room again ([`wait_room`]), not on every spin, which is faster.
//! * `tcp_mpa_bw`: `tcp_bw` whose stream is RDMA Write FPDUs without CRC,
//!   each payload read into place by its own `readv` (the floor of RC
//!   Write bandwidth without CRC; module [`super::mpa_bw`]).
//! * `tcp_mpa_crc_bw`: `tcp_mpa_bw` with the MPA CRC: each FPDU's CRC32C
//!   computed by the sender right before it is written (in batches of
//!   256 KiB, as the RC engine does) and checked by the receiver over the
//!   payload where it was placed. Framing, per-FPDU reads and CRC
//!   together: the floor of RC Write bandwidth with CRC, which
//!   `tcp_crc_bw` (CRC over a plain stream read 256 KiB at a time) is
//!   not.
//! * `tcp_crc_bw`: `tcp_bw` with CRC32C (the MPA CRC, same code) over
//!   every octet at both ends: the sender over each message before
//!   writing it, the receiver over each read. Kernel sockets give no way
//!   to fold the CRC into the kernel's copy, so this is the ceiling of any
//!   MPA stream with CRC on this machine; `softrdma perf tcp_crc_bw`
//!   reports it as a ratio to `tcp_bw` of the same run.
//! * `udp_crc_bw`: `udp_bw` with the work every datagram iWARP receiver
//!   must do on top: a CRC32C trailer on every datagram (mandatory in the
//!   datagram wire format), computed by the sender and checked
//!   by the receiver, which also copies each datagram's payload to its
//!   place in a 1 MiB target ring (placement; a datagram's payload cannot
//!   be received straight into its destination, which only its header
//!   names). The ceiling of UD Send and Write-Record bandwidth on this
//!   machine; `softrdma perf udp_crc_bw` reports it as a ratio to
//!   `udp_bw` of the same run.
//! * `udp_lat`: a `size`-octet message cut into datagrams of
//!   `spec.payload` message octets (plus an 8-octet seq/index header), the
//!   same payload softrdma's datagrams carry; the server echoes a message
//!   once all its datagrams arrived. A message not answered within
//!   [`LOSS_TIMEOUT`] counts as lost and the next one goes.
//! * `udp_bw`: a blast of such datagrams; the figure is what arrives at
//!   the receiver, timed from its first to its last datagram.
//!
//! UDP goes through [`softrdma_engine::rawudp`]: the datagrams of a
//! message leave in UDP GSO runs (up to 64 datagrams per `sendmsg`) and
//! arrive through `recvmmsg` with UDP GRO, the kernel features softrdma's
//! datagram QPs use, so the ratio compares protocol work, not system
//! call counts. A ping-pong whose messages are one datagram each (64 B)
//! is the exception: its sockets have no GRO and a poll is a plain
//! `recvfrom`, as any raw UDP ping-pong makes it (a one-buffer `recvmmsg`
//! per poll, which also zeroes sixteen message headers, costs some 0.4 µs
//! one way more than a minimal `recv_from` ping-pong and would make UD's
//! latency ratio read 8-14 % too well; see `docs/performance.md`). The
//! sockets get the engine's buffer sizes (4 MiB each way), so the raw
//! blast and the QPs lose to the same receive buffer.
//!
//! Poll mode: non-blocking sockets, both ends spinning. Event mode:
//! blocking sockets.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use softrdma_engine::rawudp::{RawUdp, GSO_RUN, MAX_SEGMENTS};

use super::cell::{Kind, Measured, Op, Spec, WaitMode, Watch, HANG};
use super::ctrl::{Ctrl, Msg};
use super::hist::Histogram;

/// A UDP ping-pong message without an answer for this long is lost.
pub(crate) const LOSS_TIMEOUT: Duration = Duration::from_millis(200);
/// Read size of the TCP stream receiver (the engine's receive buffer).
const TCP_RX: usize = 256 * 1024;
/// Octets of the seq/index header in every baseline UDP datagram.
pub(crate) const UDP_HDR: usize = 8;

pub(crate) fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::TimedOut
    )
}

/// Reads exactly `buf.len()` octets; `Ok(false)` on EOF before the first.
pub(crate) fn read_full(s: &mut TcpStream, buf: &mut [u8], w: &mut Watch) -> io::Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        match s.read(&mut buf[at..]) {
            Ok(0) if at == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "TCP peer closed mid-message",
                ))
            }
            Ok(n) => {
                at += n;
                w.progress();
            }
            Err(e) if would_block(&e) => w.check("a TCP read")?,
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `buf`.
pub(crate) fn write_full(s: &mut TcpStream, buf: &[u8], w: &mut Watch) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match s.write(&buf[at..]) {
            Ok(0) => return Err(io::Error::other("TCP write returned 0")),
            Ok(n) => {
                at += n;
                w.progress();
            }
            Err(e) if would_block(&e) => wait_room(s, w)?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Busy-waits until a TCP socket a write found full has room again, by
/// asking the kernel (`softrdma_engine::tcp_has_room`) rather than
/// retrying the write: on this loopback a 1 MiB stream whose writer spins
/// on refused writes moves less (by 4-20 % in alternated pairs, see
/// `docs/performance.md`), and the baseline is to show what kernel
/// sockets can do.
pub(crate) fn wait_room(s: &TcpStream, w: &mut Watch) -> io::Result<()> {
    while !softrdma_engine::tcp_has_room(s) {
        w.check("room in the TCP send buffer")?;
    }
    Ok(())
}

/// Accepts one connection within `within`.
pub(crate) fn accept_within(l: &TcpListener, within: Duration) -> io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let end = Instant::now() + within;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if would_block(&e) && Instant::now() < end => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) if would_block(&e) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no data connection from the peer",
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

fn prepare_tcp(s: &TcpStream, wait: WaitMode) -> io::Result<()> {
    s.set_nodelay(true)?;
    match wait {
        WaitMode::Poll => s.set_nonblocking(true),
        WaitMode::Event => {
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(Duration::from_millis(100)))
        }
    }
}

/// A baseline UDP socket bound to `ip`: GSO/GRO and the engine's
/// buffer sizes ([`RawUdp`]), waiting as `wait` says.
/// A UDP socket for `spec`: with GRO, unless every message of a ping-pong
/// is one datagram — then nothing arrives merged and a poll is a plain
/// `recvfrom`, as a raw UDP ping-pong makes it ([`RawUdp::with_gro`]).
fn udp_bind(ip: IpAddr, spec: &Spec) -> io::Result<RawUdp> {
    let one_dgram = chunks(spec.size, spec.payload).is_ok_and(|(cnt, _)| cnt == 1);
    let gro = !(spec.test.kind == Kind::Lat && one_dgram);
    let wait = spec.wait;
    let s = UdpSocket::bind((ip, 0))?;
    match wait {
        WaitMode::Poll => s.set_nonblocking(true)?,
        WaitMode::Event => {
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(Duration::from_millis(5)))?
        }
    }
    RawUdp::with_gro(s, gro)
}

/// The server (echo / sink) end of a baseline cell.
pub(crate) fn serve(spec: &Spec, ctrl: &mut Ctrl) -> io::Result<()> {
    let ip = ctrl.local_addr()?.ip();
    match spec.test.op {
        Op::Tcp => serve_tcp(spec, ctrl, ip),
        Op::Udp => serve_udp(spec, ctrl, ip),
        _ => Err(io::Error::other("not a baseline")),
    }
}

fn serve_tcp(spec: &Spec, ctrl: &mut Ctrl, ip: IpAddr) -> io::Result<()> {
    let l = TcpListener::bind((ip, 0))?;
    // The run's congestion control, as the RC QPs get it (tcp_cc).
    super::tcp_cc::listen(&l, super::tcp_cc::chosen().as_deref())?;
    ctrl.send(&Msg::new("READY").with("port", l.local_addr()?.port()))?;
    let mut s = accept_within(&l, HANG)?;
    prepare_tcp(&s, spec.wait)?;
    let mut w = Watch::new(HANG);
    let mut octets = 0u64;
    if is_mpa(spec) {
        let mut p = MpaPingPong::new(spec.size)?;
        let mut msn = 0u32;
        while p.recv(&mut s, &mut w, &mut msn)? {
            p.send(&mut s, &mut w, msn)?;
            octets += spec.size as u64;
        }
    } else if spec.test.kind == Kind::Lat {
        let mut buf = vec![0u8; spec.size];
        while read_full(&mut s, &mut buf, &mut w)? {
            write_full(&mut s, &buf, &mut w)?;
            octets += spec.size as u64;
        }
    } else if is_mpa_bw(spec) {
        let mut region = vec![0u8; spec.size.max(1)];
        octets = super::mpa_bw::receive(&mut s, &mut region, &mut w, is_mpa_crc_bw(spec))?;
        std::hint::black_box(&region);
        write_full(&mut s, &[1], &mut w)?;
    } else {
        let crc = with_crc(spec);
        let mut sum = 0u32;
        let mut buf = vec![0u8; TCP_RX];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if crc {
                        sum ^= softrdma_wire::crc::crc32c(&buf[..n]);
                    }
                    octets += n as u64;
                    w.progress();
                }
                Err(e) if would_block(&e) => w.check("TCP stream data")?,
                Err(e) => return Err(e),
            }
        }
        std::hint::black_box(sum);
        write_full(&mut s, &[1], &mut w)?;
    }
    ctrl.expect("END")?;
    ctrl.send(&Msg::new("DONE").with("octets", octets))
}

/// Header of a baseline datagram: message seq, index, count.
fn put_hdr(d: &mut [u8], seq: u32, idx: u16, cnt: u16) {
    d[..4].copy_from_slice(&seq.to_le_bytes());
    d[4..6].copy_from_slice(&idx.to_le_bytes());
    d[6..8].copy_from_slice(&cnt.to_le_bytes());
}

fn get_hdr(d: &[u8]) -> Option<(u32, u16, u16)> {
    if d.len() < UDP_HDR {
        return None;
    }
    Some((
        u32::from_le_bytes(d[..4].try_into().ok()?),
        u16::from_le_bytes(d[4..6].try_into().ok()?),
        u16::from_le_bytes(d[6..8].try_into().ok()?),
    ))
}

/// Datagram count and chunk length of a `size` message at `payload`.
fn chunks(size: usize, payload: usize) -> io::Result<(usize, usize)> {
    let p = payload.max(1);
    let cnt = size.div_ceil(p).max(1);
    if cnt > u16::MAX as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a {size}-octet message needs {cnt} datagrams of {p}: too many"),
        ));
    }
    Ok((cnt, p))
}

/// Sends message `seq` of `size` octets as datagrams to `to`, in GSO runs
/// of at most [`MAX_SEGMENTS`] datagrams / [`GSO_RUN`] octets; `run_buf` holds
/// a run's datagrams back to back (`[hdr | chunk]` each, plus the CRC32C
/// trailer for `udp_crc_bw`).
fn send_msg(
    s: &mut RawUdp,
    to: SocketAddr,
    run_buf: &mut Vec<u8>,
    seq: u32,
    spec: &Spec,
    w: &mut Watch,
) -> io::Result<()> {
    let (size, crc) = (spec.size, with_crc(spec));
    let (cnt, p) = chunks(size, spec.payload)?;
    let trailer = if crc { CRC_LEN } else { 0 };
    let seg = UDP_HDR + p + trailer;
    let per_run = (GSO_RUN / seg).clamp(1, MAX_SEGMENTS);
    let mut i = 0;
    while i < cnt {
        let n = per_run.min(cnt - i);
        run_buf.clear();
        for k in i..i + n {
            let len = if k + 1 == cnt { size - k * p } else { p };
            let at = run_buf.len();
            run_buf.resize(at + UDP_HDR + len + trailer, 0);
            put_hdr(&mut run_buf[at..], seq, k as u16, cnt as u16);
            if crc {
                let end = at + UDP_HDR + len;
                let c = softrdma_wire::crc::crc32c(&run_buf[at..end]);
                run_buf[end..].copy_from_slice(&softrdma_wire::crc::to_wire(c));
            }
        }
        loop {
            match s.send_segments(to, run_buf, seg) {
                Ok(()) => break,
                Err(e) if would_block(&e) => w.check("UDP send room")?,
                // Loopback reports a full receiver as ECONNREFUSED/ENOBUFS
                // at times: the datagrams are lost, like any other.
                Err(e) if matches!(e.raw_os_error(), Some(105) | Some(111)) => break,
                Err(e) => return Err(e),
            }
        }
        i += n;
    }
    Ok(())
}

fn serve_udp(spec: &Spec, ctrl: &mut Ctrl, ip: IpAddr) -> io::Result<()> {
    let mut s = udp_bind(ip, spec)?;
    ctrl.send(&Msg::new("READY").with("port", s.socket().local_addr()?.port()))?;
    if is_dgram_lat(spec) {
        return serve_dgram_lat(spec, ctrl, s);
    }
    let mut run_buf = Vec::new();
    let crc = with_crc(spec);
    let trailer = if crc { CRC_LEN } else { 0 };
    let mut ring = vec![0u8; if crc { PLACE_RING } else { 0 }];
    let mut bad_crc = 0u64;
    let (mut cur, mut got) = (u32::MAX, 0u16);
    let (mut octets, mut dgrams) = (0u64, 0u64);
    let (mut first, mut last): (Option<(Instant, usize)>, Instant) = (None, Instant::now());
    let mut idle = 0u32;
    let mut w = Watch::new(Duration::from_secs(3600));
    let lat = spec.test.kind == Kind::Lat;
    // Messages whose every datagram arrived (ping-pong): answered after
    // the batch.
    let mut complete: Vec<(u32, SocketAddr)> = Vec::new();
    loop {
        let r = s.recv_batch(|d, from| {
            let Some((seq, idx, cnt)) = get_hdr(d) else {
                return;
            };
            if d.len() < UDP_HDR + trailer {
                return;
            }
            let body = d.len() - trailer;
            if crc {
                let want = softrdma_wire::crc::crc32c(&d[..body]);
                if d[body..] != softrdma_wire::crc::to_wire(want) {
                    bad_crc += 1;
                    return;
                }
                // Placement: the chunk to its place in the target ring.
                let chunk = &d[UDP_HDR..body];
                let at = ((seq as usize * cnt as usize + idx as usize) * spec.payload)
                    % (PLACE_RING - spec.payload.min(PLACE_RING / 2));
                ring[at..at + chunk.len()].copy_from_slice(chunk);
            }
            let now = Instant::now();
            dgrams += 1;
            octets += (body - UDP_HDR) as u64;
            if first.is_none() {
                first = Some((now, body - UDP_HDR));
            }
            last = now;
            if lat {
                if seq != cur {
                    cur = seq;
                    got = 0;
                }
                got += 1;
                if got == cnt {
                    complete.push((seq, from));
                }
            }
        });
        match r {
            Ok(_) => {
                idle = 0;
                for (seq, from) in complete.drain(..) {
                    send_msg(&mut s, from, &mut run_buf, seq, spec, &mut w)?;
                }
            }
            Err(e) if would_block(&e) => {
                idle += 1;
                if (spec.wait == WaitMode::Event || idle & 1023 == 0) && ctrl.ready() {
                    break;
                }
            }
            Err(e) if e.raw_os_error() == Some(111) => {}
            Err(e) => return Err(e),
        }
    }
    ctrl.expect("END")?;
    // Take in what is still queued.
    let drain_end = Instant::now() + Duration::from_millis(20);
    s.socket().set_nonblocking(true)?;
    while Instant::now() < drain_end {
        let _ = s.recv_batch(|d, _| {
            if d.len() >= UDP_HDR + trailer {
                dgrams += 1;
                octets += (d.len() - UDP_HDR - trailer) as u64;
                last = Instant::now();
            }
        });
    }
    std::hint::black_box(&ring);
    if bad_crc > 0 {
        return Err(io::Error::other(format!(
            "udp_crc_bw: {bad_crc} datagrams failed their CRC"
        )));
    }
    let (secs, counted) = match first {
        Some((t0, n0)) => (last.duration_since(t0).as_secs_f64(), octets - n0 as u64),
        None => (0.0, 0),
    };
    ctrl.send(
        &Msg::new("DONE")
            .with("octets", octets)
            .with("counted", counted)
            .with("secs", secs)
            .with("dgrams", dgrams),
    )
}

/// The client (measuring) end of a baseline cell.
pub(crate) fn run(spec: &Spec, ctrl: &mut Ctrl) -> io::Result<Measured> {
    let ready = ctrl.expect("READY")?;
    let port: u16 = ready.num("port")?;
    let ip = ctrl.peer_addr()?.ip();
    let to = SocketAddr::new(ip, port);
    match (spec.test.op, spec.test.kind) {
        (Op::Tcp, Kind::Lat) => tcp_lat(spec, ctrl, to),
        (Op::Tcp, Kind::Bw) => tcp_bw(spec, ctrl, to),
        (Op::Udp, Kind::Lat) if is_dgram_lat(spec) => udp_dgram_lat(spec, ctrl, to),
        (Op::Udp, Kind::Lat) => udp_lat(spec, ctrl, to),
        (Op::Udp, Kind::Bw) => udp_bw(spec, ctrl, to),
        _ => Err(io::Error::other("not a baseline")),
    }
}

fn tcp_lat(spec: &Spec, ctrl: &mut Ctrl, to: SocketAddr) -> io::Result<Measured> {
    let mut s = super::tcp_cc::connect(&to, HANG, super::tcp_cc::chosen().as_deref())?;
    prepare_tcp(&s, spec.wait)?;
    let mut w = Watch::new(HANG);
    let closed = || io::Error::other("TCP peer closed");
    if is_mpa(spec) {
        let mut p = MpaPingPong::new(spec.size)?;
        let (mut tx_msn, mut rx_msn) = (0u32, 0u32);
        let round = |s: &mut TcpStream| -> io::Result<()> {
            tx_msn = tx_msn.wrapping_add(1);
            p.send(s, &mut w, tx_msn)?;
            if !p.recv(s, &mut w, &mut rx_msn)? {
                return Err(closed());
            }
            Ok(())
        };
        let note = "MPA/DDP/RDMAP Send framing with CRC32C, wire code only";
        return timed_rounds(spec, ctrl, &mut s, round, note);
    }
    let tx = vec![0x5au8; spec.size];
    let mut rx = vec![0u8; spec.size];
    let round = |s: &mut TcpStream| -> io::Result<()> {
        write_full(s, &tx, &mut w)?;
        if !read_full(s, &mut rx, &mut w)? {
            return Err(closed());
        }
        Ok(())
    };
    timed_rounds(spec, ctrl, &mut s, round, "")
}

/// Times a TCP ping-pong: `spec.warmup` unmeasured rounds, then rounds
/// until the spec says stop, each recorded one way (round trip / 2); then
/// the end handshake with the server.
fn timed_rounds(
    spec: &Spec,
    ctrl: &mut Ctrl,
    s: &mut TcpStream,
    mut round: impl FnMut(&mut TcpStream) -> io::Result<()>,
    note: &str,
) -> io::Result<Measured> {
    for _ in 0..spec.warmup {
        round(s)?;
    }
    let mut h = Histogram::new();
    let t0 = Instant::now();
    while spec.more(h.count(), t0) {
        let a = Instant::now();
        round(s)?;
        h.record(a.elapsed().as_nanos() as u64 / 2);
    }
    let tcp_cc = softrdma_engine::tcp_congestion(s).ok();
    s.shutdown(Shutdown::Write)?;
    ctrl.send(&Msg::new("END"))?;
    ctrl.expect("DONE")?;
    Ok(Measured {
        hist: Some(h),
        note: note.into(),
        tcp_cc,
        ..Default::default()
    })
}

fn tcp_bw(spec: &Spec, ctrl: &mut Ctrl, to: SocketAddr) -> io::Result<Measured> {
    let mut s = super::tcp_cc::connect(&to, HANG, super::tcp_cc::chosen().as_deref())?;
    prepare_tcp(&s, spec.wait)?;
    let mut w = Watch::new(HANG);
    let msg = vec![0xa5u8; spec.size];
    let crc = with_crc(spec);
    // tcp_mpa_bw: every message framed as RC would frame a Write of it on
    // this connection (SOFTRDMA_MAX_FPDU applies as it does to RC).
    let mut frames = if is_mpa_bw(spec) {
        let cfg = softrdma_engine::config::Config::from_env().map_err(io::Error::other)?;
        let ulpdu = softrdma_engine::cm::max_ulpdu(&cfg, &s, false);
        Some(super::mpa_bw::WriteFrames::new(
            spec.size,
            0,
            ulpdu,
            is_mpa_crc_bw(spec),
        )?)
    } else {
        None
    };
    let mut sum = 0u32;
    let mut sent = 0u64;
    let t0 = Instant::now();
    while spec.more(sent, t0) {
        if crc {
            sum ^= softrdma_wire::crc::crc32c(std::hint::black_box(&msg));
        }
        match &mut frames {
            Some(f) => f.write(&mut s, std::hint::black_box(&msg), &mut w)?,
            None => write_full(&mut s, &msg, &mut w)?,
        }
        sent += 1;
    }
    std::hint::black_box(sum);
    s.shutdown(Shutdown::Write)?;
    let mut ack = [0u8; 1];
    if !read_full(&mut s, &mut ack, &mut w)? {
        return Err(io::Error::other(
            "TCP receiver closed without acknowledging",
        ));
    }
    let secs = t0.elapsed().as_secs_f64();
    ctrl.send(&Msg::new("END"))?;
    let done = ctrl.expect("DONE")?;
    let octets: u64 = done.num("octets")?;
    if octets != sent * spec.size as u64 {
        return Err(io::Error::other(format!(
            "TCP receiver counted {octets} octets, {} were sent",
            sent * spec.size as u64
        )));
    }
    Ok(Measured {
        octets,
        msgs: sent,
        secs,
        tcp_cc: softrdma_engine::tcp_congestion(&s).ok(),
        fpdus_per_msg: frames.as_ref().map(|f| f.count() as u64),
        note: match (&frames, crc) {
            (Some(_), _) if is_mpa_crc_bw(spec) => {
                "RDMA Write FPDUs with CRC32C both ends, one readv per FPDU; \
                 timed to the receiver's ack"
                    .into()
            }
            (Some(_), _) => "RDMA Write FPDUs without CRC, one readv per FPDU; \
                 timed to the receiver's ack"
                .into(),
            (None, true) => "crc32c both ends; timed to the receiver's ack".into(),
            (None, false) => "timed to the receiver's ack".into(),
        },
        ..Default::default()
    })
}

/// True for the baselines that checksum what they move.
fn with_crc(spec: &Spec) -> bool {
    matches!(spec.test.name, "tcp_crc_bw" | "udp_crc_bw")
}

/// True for `tcp_mpa_bw` and `tcp_mpa_crc_bw` (`tcp_bw` framed as RC
/// Writes, without and with CRC).
fn is_mpa_bw(spec: &Spec) -> bool {
    matches!(spec.test.name, "tcp_mpa_bw" | "tcp_mpa_crc_bw")
}

/// True for `tcp_mpa_crc_bw` (`tcp_bw` framed as RC Writes with CRC).
fn is_mpa_crc_bw(spec: &Spec) -> bool {
    spec.test.name == "tcp_mpa_crc_bw"
}

/// True for `tcp_mpa_lat` (`tcp_lat` framed as RC Sends).
fn is_mpa(spec: &Spec) -> bool {
    spec.test.name == "tcp_mpa_lat"
}

/// True for `udp_dgram_lat` (`udp_lat` framed as UD Sends).
fn is_dgram_lat(spec: &Spec) -> bool {
    spec.test.name == "udp_dgram_lat"
}

/// The DQPN word of every `udp_dgram_lat` datagram (both ends' QP 1 in
/// slot 1, as a UD QP puts its own slot in the top octet).
const DGRAM_LAT_DQPN: u32 = (1 << 24) | 1;

/// One end of the `udp_dgram_lat` ping-pong: its transmit datagram and the
/// "registered" memory its payload comes from and goes to.
struct DgramPingPong {
    size: usize,
    /// Header, payload and CRC of one datagram.
    tx: Vec<u8>,
    /// Where the sent payload comes from and the received one goes.
    mem: Vec<u8>,
}

impl DgramPingPong {
    fn new(spec: &Spec) -> io::Result<Self> {
        // What one UD Send datagram carries on this path.
        let max = super::cell::dgram_payload("ud", Op::Send, super::cell::dgram_mtu());
        if spec.size > max {
            return Err(io::Error::other(format!(
                "udp_dgram_lat: messages up to {max} octets (one datagram)"
            )));
        }
        Ok(DgramPingPong {
            size: spec.size,
            tx: vec![0; max + 128],
            mem: vec![0x3c; spec.size.max(1)],
        })
    }

    /// Frames a Send with `msn`; the datagram's length.
    fn frame(&mut self, msn: u32) -> usize {
        use softrdma_wire::datagram;
        use softrdma_wire::rdmap::{Opcode, RdmapBody, SegmentRepr};
        let mut repr = SegmentRepr::untagged(Opcode::Send, 0, msn, 0, true, RdmapBody::None);
        repr.dqpn = Some(DGRAM_LAT_DQPN);
        let h = datagram::emit_header(&repr, &mut self.tx);
        self.tx[h..h + self.size].copy_from_slice(&self.mem[..self.size]);
        datagram::seal(&mut self.tx, h + self.size)
    }

    /// Checks one datagram (CRC, then a Send on queue 0 to this QP with a
    /// whole message of the size) and copies its payload to `mem`; its
    /// MSN.
    fn take(&mut self, d: &[u8]) -> Result<u32, String> {
        use softrdma_wire::ddp::DdpHeader;
        use softrdma_wire::rdmap::Opcode;
        let (repr, payload) = softrdma_wire::datagram::parse(d).map_err(|e| format!("{e:?}"))?;
        let msn = match repr.ddp {
            DdpHeader::Untagged {
                qn: 0, msn, mo: 0, ..
            } => msn,
            _ => return Err(format!("unexpected {repr:?}")),
        };
        let ok = repr.opcode == Opcode::Send
            && repr.last
            && repr.dqpn == Some(DGRAM_LAT_DQPN)
            && payload.len() == self.size;
        if !ok {
            return Err(format!("unexpected {repr:?}"));
        }
        self.mem[..self.size].copy_from_slice(payload);
        Ok(msn)
    }
}

/// The `udp_dgram_lat` echo: every datagram checked and answered with a
/// Send of the same MSN, until the client ends the cell.
fn serve_dgram_lat(spec: &Spec, ctrl: &mut Ctrl, mut s: RawUdp) -> io::Result<()> {
    let mut p = DgramPingPong::new(spec)?;
    let mut bad: Option<String> = None;
    let mut answer: Vec<(u32, SocketAddr)> = Vec::new();
    let mut idle = 0u32;
    loop {
        let r = s.recv_batch(|d, from| match p.take(d) {
            Ok(msn) => answer.push((msn, from)),
            Err(e) => {
                bad.get_or_insert(e);
            }
        });
        if let Some(e) = bad.take() {
            return Err(io::Error::other(format!("udp_dgram_lat: {e}")));
        }
        match r {
            Ok(_) => {
                idle = 0;
                for (msn, from) in answer.drain(..) {
                    let n = p.frame(msn);
                    match s.socket().send_to(&p.tx[..n], from) {
                        Ok(_) => {}
                        // As for udp_lat: a lost answer is the client's
                        // loss to count.
                        Err(e) if would_block(&e) => {}
                        Err(e) if matches!(e.raw_os_error(), Some(105) | Some(111)) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) if would_block(&e) => {
                idle += 1;
                if (spec.wait == WaitMode::Event || idle & 1023 == 0) && ctrl.ready() {
                    break;
                }
            }
            Err(e) if e.raw_os_error() == Some(111) => {}
            Err(e) => return Err(e),
        }
    }
    ctrl.expect("END")?;
    ctrl.send(&Msg::new("DONE"))
}

/// Largest `tcp_mpa_lat` message: one FPDU, as an RC Send of this size is
/// on a loopback connection (larger ones would be several FPDUs there).
const MPA_MAX: usize = 16 << 10;

/// One end of the `tcp_mpa_lat` ping-pong: its transmit FPDU buffer, the
/// "registered" memory its payload comes from and goes to, and a receive
/// buffer for the stream.
struct MpaPingPong {
    size: usize,
    /// Header (with the length slot), payload, pad and CRC of one FPDU.
    tx: Vec<u8>,
    /// Where the sent payload comes from and the received one goes.
    mem: Vec<u8>,
    rx: Vec<u8>,
    /// Octets of `rx` holding stream data not yet taken.
    have: usize,
    deframer: softrdma_wire::fpdu::Deframer,
}

impl MpaPingPong {
    fn new(size: usize) -> io::Result<Self> {
        if size > MPA_MAX {
            return Err(io::Error::other(format!(
                "tcp_mpa_lat: messages up to {MPA_MAX} octets (one FPDU)"
            )));
        }
        Ok(MpaPingPong {
            size,
            tx: vec![0; MPA_MAX + 64],
            mem: vec![0x3c; size.max(1)],
            rx: vec![0; TCP_RX],
            have: 0,
            deframer: softrdma_wire::fpdu::Deframer::new(true, false),
        })
    }

    /// Frames and writes one Send with `msn`.
    fn send(&mut self, s: &mut TcpStream, w: &mut Watch, msn: u32) -> io::Result<()> {
        use softrdma_wire::fpdu::{self, LEN_FIELD};
        use softrdma_wire::rdmap::{Opcode, RdmapBody, SegmentRepr};
        let repr = SegmentRepr::untagged(Opcode::Send, 0, msn, 0, true, RdmapBody::None);
        let hlen = repr.header_len();
        repr.emit(&mut self.tx[LEN_FIELD..LEN_FIELD + hlen]);
        let ulpdu = fpdu::set_ulpdu_len(&mut self.tx[..LEN_FIELD + hlen], self.size)
            .map_err(|e| io::Error::other(format!("tcp_mpa_lat: {e:?}")))?;
        let at = LEN_FIELD + hlen;
        self.tx[at..at + self.size].copy_from_slice(&self.mem[..self.size]);
        let pad = fpdu::pad_len(ulpdu);
        let end = at + self.size + pad;
        self.tx[at + self.size..end].fill(0);
        let crc = softrdma_wire::crc::crc32c(&self.tx[..end]);
        self.tx[end..end + fpdu::CRC_LEN].copy_from_slice(&softrdma_wire::crc::to_wire(crc));
        let n = end + fpdu::CRC_LEN;
        write_full(s, &self.tx[..n], w)
    }

    /// Reads one whole FPDU, checks its CRC and header (a Send on queue 0
    /// with the next MSN) and copies its payload to `mem`. `Ok(false)` on
    /// EOF before it.
    fn recv(&mut self, s: &mut TcpStream, w: &mut Watch, msn: &mut u32) -> io::Result<bool> {
        use softrdma_wire::ddp::{DdpHeader, Mode};
        use softrdma_wire::rdmap::{Opcode, SegmentRepr};
        loop {
            match self.deframer.decode_whole(&self.rx[..self.have]) {
                Ok(Some((n, f))) => {
                    let (repr, _) = SegmentRepr::parse(f.header, Mode::Stream)
                        .map_err(|e| io::Error::other(format!("tcp_mpa_lat header: {e:?}")))?;
                    let want = msn.wrapping_add(1);
                    let ok = repr.opcode == Opcode::Send
                        && repr.last
                        && matches!(repr.ddp, DdpHeader::Untagged { qn: 0, msn: m, mo: 0, .. } if m == want)
                        && f.payload.len() == self.size;
                    if !ok {
                        return Err(io::Error::other(format!(
                            "tcp_mpa_lat: unexpected {repr:?}"
                        )));
                    }
                    self.mem[..self.size].copy_from_slice(f.payload);
                    *msn = want;
                    self.rx.copy_within(n..self.have, 0);
                    self.have -= n;
                    return Ok(true);
                }
                Ok(None) => {}
                Err(e) => return Err(io::Error::other(format!("tcp_mpa_lat stream: {e:?}"))),
            }
            match s.read(&mut self.rx[self.have..]) {
                Ok(0) if self.have == 0 => return Ok(false),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "TCP peer closed mid-FPDU",
                    ))
                }
                Ok(n) => {
                    self.have += n;
                    w.progress();
                }
                Err(e) if would_block(&e) => w.check("an FPDU")?,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Octets of the CRC32C trailer of a `udp_crc_bw` datagram.
const CRC_LEN: usize = 4;

/// Target ring of the `udp_crc_bw` receiver's placement copies.
const PLACE_RING: usize = 1 << 20;

fn udp_socket(spec: &Spec, ctrl: &Ctrl) -> io::Result<RawUdp> {
    udp_bind(ctrl.local_addr()?.ip(), spec)
}

/// How a UDP ping-pong's client sends message `seq` and recognises the
/// datagrams of its answer (`udp_lat`, `udp_dgram_lat`).
trait UdpRound {
    /// Datagrams the answer to one message arrives in.
    fn datagrams(&self) -> usize;
    /// Sends message `seq` to `to`.
    fn send(&mut self, s: &mut RawUdp, to: SocketAddr, seq: u32) -> io::Result<()>;
    /// Whether `d` is a datagram of the answer to `seq`; `Err` for one that
    /// cannot be part of this ping-pong at all.
    fn answers(&mut self, d: &[u8], seq: u32) -> Result<bool, String>;
}

/// `udp_lat`'s messages: cut into datagrams with a seq/index header.
struct RawRound<'a> {
    spec: &'a Spec,
    datagrams: usize,
    run_buf: Vec<u8>,
    w: Watch,
}

impl UdpRound for RawRound<'_> {
    fn datagrams(&self) -> usize {
        self.datagrams
    }

    fn send(&mut self, s: &mut RawUdp, to: SocketAddr, seq: u32) -> io::Result<()> {
        send_msg(s, to, &mut self.run_buf, seq, self.spec, &mut self.w)
    }

    fn answers(&mut self, d: &[u8], seq: u32) -> Result<bool, String> {
        Ok(get_hdr(d).is_some_and(|(sq, _, _)| sq == seq))
    }
}

/// `udp_dgram_lat`'s messages: one UD Send datagram, MSN = seq.
impl UdpRound for DgramPingPong {
    fn datagrams(&self) -> usize {
        1
    }

    fn send(&mut self, s: &mut RawUdp, to: SocketAddr, seq: u32) -> io::Result<()> {
        let n = self.frame(seq);
        match s.socket().send_to(&self.tx[..n], to) {
            Ok(_) => Ok(()),
            Err(e) if would_block(&e) || e.raw_os_error() == Some(111) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn answers(&mut self, d: &[u8], seq: u32) -> Result<bool, String> {
        self.take(d).map(|msn| msn == seq)
    }
}

fn udp_lat(spec: &Spec, ctrl: &mut Ctrl, to: SocketAddr) -> io::Result<Measured> {
    let (datagrams, _) = chunks(spec.size, spec.payload)?;
    let mut round = RawRound {
        spec,
        datagrams,
        run_buf: Vec::new(),
        w: Watch::new(HANG),
    };
    udp_ping_pong(spec, ctrl, to, &mut round, "UDP ping-pong", "")
}

/// The `udp_dgram_lat` client: `udp_lat`'s loop over framed and checked
/// Sends.
fn udp_dgram_lat(spec: &Spec, ctrl: &mut Ctrl, to: SocketAddr) -> io::Result<Measured> {
    let mut round = DgramPingPong::new(spec)?;
    let note = "DDP/RDMAP UD Send framing with CRC32C, wire code only";
    udp_ping_pong(spec, ctrl, to, &mut round, "udp_dgram_lat", note)
}

/// A UDP ping-pong's client loop: warm-up, then rounds until the spec's
/// count or duration; an answer not complete within [`LOSS_TIMEOUT`]
/// counts as lost (an error past 10 %). `what` names it in errors.
fn udp_ping_pong(
    spec: &Spec,
    ctrl: &mut Ctrl,
    to: SocketAddr,
    round: &mut impl UdpRound,
    what: &str,
    note: &str,
) -> io::Result<Measured> {
    let mut s = udp_socket(spec, ctrl)?;
    let cnt = round.datagrams();
    let mut h = Histogram::new();
    let (mut lost, mut seq, mut warm) = (0u64, 0u32, 0u64);
    let mut t0 = Instant::now();
    while warm < spec.warmup || spec.more(h.count(), t0) {
        seq = seq.wrapping_add(1);
        let a = Instant::now();
        round.send(&mut s, to, seq)?;
        let mut got = 0usize;
        let mut bad: Option<String> = None;
        let mut spins = 0u32;
        let answered = loop {
            let r = s.recv_batch(|d, _| match round.answers(d, seq) {
                Ok(true) => got += 1,
                Ok(false) => {}
                Err(e) => {
                    bad.get_or_insert(e);
                }
            });
            if let Some(e) = bad.take() {
                return Err(io::Error::other(format!("{what}: {e}")));
            }
            match r {
                Ok(_) if got >= cnt => break true,
                Ok(_) => {}
                Err(e) if would_block(&e) => {
                    spins = spins.wrapping_add(1);
                    if (spec.wait == WaitMode::Event || spins & 255 == 0)
                        && a.elapsed() > LOSS_TIMEOUT
                    {
                        break false;
                    }
                }
                Err(e) if e.raw_os_error() == Some(111) => {}
                Err(e) => return Err(e),
            }
        };
        if !answered {
            lost += 1;
            if lost > 10 + h.count() / 10 {
                return Err(io::Error::other(format!(
                    "{what}: {lost} messages lost (more than 10 %)"
                )));
            }
            continue;
        }
        if warm < spec.warmup {
            warm += 1;
            t0 = Instant::now();
        } else {
            h.record(a.elapsed().as_nanos() as u64 / 2);
        }
    }
    ctrl.send(&Msg::new("END"))?;
    ctrl.expect("DONE")?;
    Ok(Measured {
        hist: Some(h),
        lost,
        note: note.into(),
        ..Default::default()
    })
}

fn udp_bw(spec: &Spec, ctrl: &mut Ctrl, to: SocketAddr) -> io::Result<Measured> {
    let mut s = udp_socket(spec, ctrl)?;
    let mut w = Watch::new(HANG);
    let mut run_buf = Vec::new();
    let crc = with_crc(spec);
    let mut sent = 0u64;
    let t0 = Instant::now();
    while spec.more(sent, t0) {
        send_msg(&mut s, to, &mut run_buf, sent as u32, spec, &mut w)?;
        sent += 1;
    }
    let send_secs = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(5));
    ctrl.send(&Msg::new("END"))?;
    let done = ctrl.expect("DONE")?;
    let counted: u64 = done.num("counted")?;
    let secs: f64 = done.num("secs")?;
    if counted == 0 || secs <= 0.0 {
        return Err(io::Error::other(
            "UDP blast: too little arrived at the receiver to time it",
        ));
    }
    let sent_octets = sent * spec.size as u64;
    let got: u64 = done.num("octets")?;
    let lost_msgs = sent_octets.saturating_sub(got) / spec.size.max(1) as u64;
    Ok(Measured {
        octets: counted,
        msgs: counted / spec.size as u64,
        // As for UD: never faster than the sender ran.
        secs: secs.max(send_secs),
        lost: lost_msgs,
        dgram_payload: Some(spec.payload as u64),
        note: format!(
            "counted at the receiver{}{}",
            if s.gso() { ", GSO" } else { "" },
            if crc {
                ", crc32c both ends + placement copy"
            } else {
                ""
            }
        ),
        ..Default::default()
    })
}
