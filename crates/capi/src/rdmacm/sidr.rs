//! The UD "connection" exchange of `RDMA_PS_UDP` ids (IB's SIDR), over a
//! short TCP connection to the listener's port. Ours: both ends softrdma.
//!
//! * Request (initiator → listener): `"sSIDR1"`, one octet of private
//!   data length, the private data.
//! * Reply: `"sSIDR1"`, status (0 accept, 1 reject), QPN (u32 big
//!   endian), qkey (u32 big endian), one octet of private data length,
//!   the private data. The listener's UD QP is then reached at the
//!   listener's IP (the address the initiator connected to) and the QPN.
//!
//! The initiator gets `ESTABLISHED` with `param.ud` (address vector, QPN,
//! qkey, the reply's private data) or `REJECTED`; a listener that cannot
//! be reached gives `UNREACHABLE`. A listener thread per listening id
//! reads requests (each with a deadline) and queues `CONNECT_REQUEST`
//! with a new child id holding the connection for `rdma_accept` /
//! `rdma_reject`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{ev, ChanShared, Param, Pending, Res, RDMA_UDP_QKEY};

const MAGIC: &[u8; 6] = b"sSIDR1";
/// How long either side waits for the other's message.
const TIMEOUT: Duration = Duration::from_secs(5);

/// What a listener thread needs to make child ids, taken when listening
/// starts (the thread never touches the listening id itself, which the
/// application may destroy at any time).
pub(crate) struct ChildProto {
    /// `*mut IdObj` of the listening id (only compared, never followed).
    pub listen_id: usize,
    /// Its channel.
    pub chan: Arc<ChanShared>,
    /// `id->channel` of the listening id, copied into children.
    pub chan_ptr: usize,
    /// `id->context`, copied into children.
    pub context: usize,
    /// The port space.
    pub ps: i32,
}

/// A listening UD id's acceptor.
pub struct Listener {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Listener {
    /// Listens on `addr` for requests to the listening id of `proto`,
    /// queueing `CONNECT_REQUEST`s (with new child ids) on its channel.
    pub(crate) fn start(addr: SocketAddr, proto: ChildProto) -> Res<Listener> {
        let l =
            TcpListener::bind(addr).map_err(|e| e.raw_os_error().unwrap_or(libc::EADDRINUSE))?;
        let local = l.local_addr().map_err(|_| libc::EINVAL)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("softrdma-sidr".into())
            .spawn(move || run(l, proto, stop2))
            .map_err(|_| libc::EAGAIN)?;
        Ok(Listener { local, stop })
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocked accept.
        let _ = TcpStream::connect_timeout(&self.local, Duration::from_millis(200));
    }
}

fn run(l: TcpListener, p: ChildProto, stop: Arc<AtomicBool>) {
    for s in l.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut s) = s else { continue };
        let Ok(private_data) = read_request(&mut s) else {
            continue;
        };
        if stop.load(Ordering::Acquire) || !super::is_live(p.listen_id) {
            return;
        }
        let child = super::new_id(p.chan.clone(), p.chan_ptr, p.context, p.ps);
        // SAFETY: just made; nobody else has it until the event is read.
        let c = unsafe { &mut *child };
        if let (Ok(local), Ok(peer)) = (s.local_addr(), s.peer_addr()) {
            let _ = c.set_src(local);
            c.set_dst(peer);
        }
        super::lock(&c.st).ud_request = Some(s);
        p.chan.push(Pending {
            id: child as usize,
            listen_id: p.listen_id,
            event: ev::CONNECT_REQUEST,
            status: 0,
            param: Param::Ud {
                ah_attr: super::ah_attr_to(c.dst_ip(), 0),
                qp_num: 0,
                qkey: RDMA_UDP_QKEY,
                user: 0,
            },
            private_data,
        });
    }
}

fn read_request(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    s.set_read_timeout(Some(TIMEOUT))?;
    let mut h = [0u8; 7];
    s.read_exact(&mut h)?;
    if &h[..6] != MAGIC {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    let mut pd = vec![0u8; usize::from(h[6])];
    s.read_exact(&mut pd)?;
    Ok(pd)
}

/// Answers a request (accept with our QPN, or reject) and closes.
pub fn reply(mut s: TcpStream, accept: bool, qpn: u32, private_data: &[u8]) -> Res<()> {
    let pd = &private_data[..private_data.len().min(255)];
    let mut m = Vec::with_capacity(16 + pd.len());
    m.extend_from_slice(MAGIC);
    m.push(if accept { 0 } else { 1 });
    m.extend_from_slice(&qpn.to_be_bytes());
    m.extend_from_slice(&RDMA_UDP_QKEY.to_be_bytes());
    m.push(pd.len() as u8);
    m.extend_from_slice(pd);
    s.write_all(&m)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::ECONNRESET))
}

/// Starts the initiator's exchange with `dst` on a thread; the outcome
/// arrives on `chan` for the id at `id`.
pub(crate) fn connect(id: usize, chan: Arc<ChanShared>, dst: SocketAddr, private_data: Vec<u8>) {
    let chan2 = chan.clone();
    let spawned = std::thread::Builder::new()
        .name("softrdma-sidr-connect".into())
        .spawn(move || {
            let p = exchange(dst, &private_data);
            chan2.push(outcome(id, dst, p));
        });
    if spawned.is_err() {
        chan.push(outcome(id, dst, Err(libc::EAGAIN)));
    }
}

/// (status, qpn, qkey, private data) of a reply.
type Reply = (u8, u32, u32, Vec<u8>);

fn exchange(dst: SocketAddr, private_data: &[u8]) -> Result<Reply, i32> {
    let mut s = TcpStream::connect_timeout(&dst, TIMEOUT)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::ETIMEDOUT))?;
    let pd = &private_data[..private_data.len().min(255)];
    let mut m = Vec::with_capacity(8 + pd.len());
    m.extend_from_slice(MAGIC);
    m.push(pd.len() as u8);
    m.extend_from_slice(pd);
    let io = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::ECONNRESET);
    s.write_all(&m).map_err(io)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    let mut h = [0u8; 16];
    s.read_exact(&mut h).map_err(io)?;
    if &h[..6] != MAGIC {
        return Err(libc::EPROTO);
    }
    let qpn = u32::from_be_bytes([h[7], h[8], h[9], h[10]]);
    let qkey = u32::from_be_bytes([h[11], h[12], h[13], h[14]]);
    let mut rpd = vec![0u8; usize::from(h[15])];
    s.read_exact(&mut rpd).map_err(io)?;
    Ok((h[6], qpn, qkey, rpd))
}

fn outcome(id: usize, dst: SocketAddr, r: Result<Reply, i32>) -> Pending {
    let (event, status, param, private_data) = match r {
        Ok((0, qpn, qkey, pd)) => (
            ev::ESTABLISHED,
            0,
            Param::Ud {
                ah_attr: super::ah_attr_to(dst.ip(), 0),
                qp_num: qpn,
                qkey,
                user: 0,
            },
            pd,
        ),
        // The reject's private data, readable through param.ud (and
        // param.conn: both start with private_data and its length).
        Ok((_, _, _, pd)) => (
            ev::REJECTED,
            -libc::ECONNREFUSED,
            Param::Ud {
                // SAFETY: all-zero is a valid ibv_ah_attr.
                ah_attr: unsafe { std::mem::zeroed() },
                qp_num: 0,
                qkey: 0,
                user: 0,
            },
            pd,
        ),
        Err(e) => (ev::UNREACHABLE, -e, Param::None, Vec::new()),
    };
    Pending {
        id,
        listen_id: 0,
        event,
        status,
        param,
        private_data,
    }
}
