//! IB-style connection without a daemon: a QP is reached
//! by its number alone, the way `ibv_rc_pingpong` connects QPs with
//! `ibv_modify_qp(RTR)` given the peer's GID and QPN.
//!
//! * Each context serves RC QPs created here from TCP listeners of its own;
//!   a QP's number is `QPN = (port << 8) | slot`, where `port` is the
//!   listener's TCP port and `slot` (0–255) picks the QP among those sharing
//!   it. The number therefore tells a peer where to connect.
//! * At RTR both sides know (their GID, QPN) and the peer's. The side with
//!   the smaller pair opens the TCP connection to `peer_ip:(peer_qpn >> 8)`
//!   and sends an MPA Request whose private data names both QPs
//!   ([`PD_MAGIC`], source QPN, destination QPN); the other side's listener
//!   matches it to the QP by slot and accepts once that QP has reached RTR
//!   (a request that arrives earlier waits; one that names no such QP, or
//!   the wrong peer, is rejected).
//! * RTS waits until the connection is up ([`IbConn::wait_connected`]).
//! * Such a QP keeps InfiniBand's meaning of an RDMA Write completion
//!   ([`Qp::set_write_placed`]): a signaled Write completes once the peer
//!   has placed it, so a program may read the target as soon as its Write
//!   completes (rdma-core's tests and much IB middleware do). A
//!   zero-length Read follows each signaled Write for that; unsignaled
//!   Writes before it are placed first too (RFC 5040 ordering).
//!
//! The private data is ours: both ends must be softrdma (siw cannot connect
//! this way; it needs rdma_cm).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::cm::{self, ConnParams, Incoming, Listener};
use crate::{Context, Qp, QpLinkState};

/// First four octets of an IB-style connection's MPA private data.
pub const PD_MAGIC: [u8; 4] = *b"sIB1";

/// Why an IB-style connection could not be set up.
#[derive(Debug)]
pub enum IbConnError {
    /// No listener could be opened to give the QP a number.
    Listen(io::Error),
    /// The QP number is not one of this context's.
    UnknownQp,
    /// The connection did not come up in time.
    Timeout,
    /// Connection set-up failed.
    Cm(cm::CmError),
}

impl std::fmt::Display for IbConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IbConnError::Listen(e) => write!(f, "cannot open a listener for QP numbers: {e}"),
            IbConnError::UnknownQp => write!(f, "the QP was not created by this context"),
            IbConnError::Timeout => write!(f, "the peer QP did not connect in time"),
            IbConnError::Cm(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for IbConnError {}

/// What a QP at RTR expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expect {
    peer_ip: IpAddr,
    peer_qpn: u32,
    params: (u16, u16),
}

#[derive(Default)]
struct SlotState {
    /// Number handed out, QP not created yet.
    reserved: bool,
    qp: Option<Weak<crate::qp::QpShared>>,
    expect: Option<Expect>,
    /// A request that arrived before the QP reached RTR.
    parked: Option<(Incoming, u32)>,
    /// Set once the connection is up or failed.
    outcome: Option<Result<(), String>>,
}

struct Port {
    port: u16,
    slots: Vec<SlotState>,
}

/// The IB-style connection service of one context.
pub struct IbConn {
    /// The context, weakly: the context owns this service.
    shared: Weak<crate::Shared>,
    ports: Mutex<Vec<Port>>,
    changed: Condvar,
    this: Weak<IbConn>,
}

impl std::fmt::Debug for IbConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IbConn")
    }
}

/// The local address the kernel would use to reach `peer` (no packet is
/// sent: a UDP socket is only connected to learn the route).
pub fn local_addr_toward(peer: IpAddr) -> io::Result<IpAddr> {
    let bind: SocketAddr = match peer {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(bind)?;
    s.connect((peer, 9))?;
    Ok(s.local_addr()?.ip())
}

/// The GID of an address: IPv4-mapped for IPv4.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl IbConn {
    /// The service for `ctx` (one per context; see [`Context::ib_conn`]).
    pub(crate) fn new(shared: Weak<crate::Shared>) -> Arc<IbConn> {
        Arc::new_cyclic(|this| IbConn {
            shared,
            ports: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            this: this.clone(),
        })
    }

    fn ctx(&self) -> Result<Context, IbConnError> {
        self.shared
            .upgrade()
            .map(|shared| Context { shared })
            .ok_or(IbConnError::Listen(io::Error::other("context closed")))
    }

    /// Reserves a QP number of the form `(port << 8) | slot` (opening a
    /// listener when every port's 256 slots are taken). [`IbConn::bind`]
    /// attaches the QP created with it.
    pub fn reserve(&self) -> Result<u32, IbConnError> {
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        let free =
            |s: &SlotState| !s.reserved && s.qp.as_ref().is_none_or(|w| w.strong_count() == 0);
        for p in ports.iter_mut() {
            if let Some(i) = p.slots.iter().position(free) {
                p.slots[i] = SlotState {
                    reserved: true,
                    ..SlotState::default()
                };
                return Ok((u32::from(p.port) << 8) | i as u32);
            }
            if p.slots.len() < 256 {
                p.slots.push(SlotState {
                    reserved: true,
                    ..SlotState::default()
                });
                return Ok((u32::from(p.port) << 8) | (p.slots.len() - 1) as u32);
            }
        }
        let listener = Listener::bind(&self.ctx()?, (Ipv4Addr::UNSPECIFIED, 0))
            .map_err(IbConnError::Listen)?;
        let port = listener.local_addr().map_err(IbConnError::Listen)?.port();
        let me = self.this.clone();
        thread::Builder::new()
            .name(format!("softrdma-ib-{port}"))
            .spawn(move || accept_loop(me, listener, port))
            .map_err(IbConnError::Listen)?;
        ports.push(Port {
            port,
            slots: vec![SlotState {
                reserved: true,
                ..SlotState::default()
            }],
        });
        Ok(u32::from(port) << 8)
    }

    /// Attaches the QP created with a reserved number.
    pub fn bind(&self, qpn: u32, qp: &Qp) -> Result<(), IbConnError> {
        self.with_slot(qpn, |s| {
            s.qp = Some(Arc::downgrade(&qp.inner));
            s.reserved = false;
        })
        .ok_or(IbConnError::UnknownQp)
    }

    fn with_slot<R>(&self, qpn: u32, f: impl FnOnce(&mut SlotState) -> R) -> Option<R> {
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        let port = (qpn >> 8) as u16;
        let p = ports.iter_mut().find(|p| p.port == port)?;
        p.slots.get_mut((qpn & 0xff) as usize).map(f)
    }

    /// Moves the QP `qpn` toward the peer QP `peer_qpn` at `peer_ip` (the RTR
    /// transition). Returns at once; [`IbConn::wait_connected`] waits.
    pub fn start(
        &self,
        qp: &Qp,
        qpn: u32,
        peer_ip: IpAddr,
        peer_qpn: u32,
        ird: u16,
        ord: u16,
    ) -> Result<(), IbConnError> {
        let local_ip = local_addr_toward(peer_ip).unwrap_or(peer_ip);
        qp.set_write_placed();
        qp.set_rnr_wait();
        let we_connect = (gid_of(local_ip), qpn) < (gid_of(peer_ip), peer_qpn);
        let expect = Expect {
            peer_ip,
            peer_qpn,
            params: (ird, ord),
        };
        let parked = self
            .with_slot(qpn, |s| {
                s.expect = Some(expect);
                s.outcome = None;
                s.parked.take()
            })
            .ok_or(IbConnError::UnknownQp)?;
        let params = ConnParams {
            private_data: Vec::new(),
            ird,
            ord,
        };
        if we_connect {
            let ctx = self.ctx()?;
            let qp = qp.clone();
            let me = self.this.clone();
            thread::Builder::new()
                .name("softrdma-ib-connect".into())
                .spawn(move || {
                    let mut pd = PD_MAGIC.to_vec();
                    pd.extend_from_slice(&qpn.to_be_bytes());
                    pd.extend_from_slice(&peer_qpn.to_be_bytes());
                    let target = SocketAddr::new(peer_ip, (peer_qpn >> 8) as u16);
                    let r = cm::connect(
                        &ctx,
                        &qp,
                        target,
                        &ConnParams {
                            private_data: pd,
                            ..params
                        },
                    )
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                    if let Some(me) = me.upgrade() {
                        me.finish(qpn, r);
                    }
                })
                .map_err(IbConnError::Listen)?;
        } else if let Some((inc, src)) = parked {
            self.answer(qp, qpn, expect, inc, src);
        }
        Ok(())
    }

    fn finish(&self, qpn: u32, r: Result<(), String>) {
        self.with_slot(qpn, |s| s.outcome = Some(r));
        self.changed.notify_all();
    }

    /// Accepts or rejects a request for our QP `qpn` from `src`.
    fn answer(&self, qp: &Qp, qpn: u32, e: Expect, inc: Incoming, src: u32) {
        let from_ip = inc.peer_addr().ip();
        let same_ip = from_ip == e.peer_ip
            || (from_ip.is_loopback() && e.peer_ip.is_loopback())
            || e.peer_ip.is_unspecified();
        if src != e.peer_qpn || !same_ip {
            let _ = inc.reject(b"softrdma: QP expects another peer");
            return;
        }
        let r = inc
            .accept(
                qp,
                &ConnParams {
                    private_data: Vec::new(),
                    ird: e.params.0,
                    ord: e.params.1,
                },
            )
            .map_err(|e| e.to_string());
        self.finish(qpn, r);
    }

    /// Waits until the QP's connection is up (the RTS transition).
    pub fn wait_connected(&self, qp: &Qp, qpn: u32, timeout: Duration) -> Result<(), IbConnError> {
        let deadline = Instant::now() + timeout;
        let mut ports = self.ports.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let port = (qpn >> 8) as u16;
            let slot = ports
                .iter_mut()
                .find(|p| p.port == port)
                .and_then(|p| p.slots.get_mut((qpn & 0xff) as usize))
                .ok_or(IbConnError::UnknownQp)?;
            match &slot.outcome {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => {
                    return Err(IbConnError::Cm(cm::CmError::Io(io::Error::other(
                        e.clone(),
                    ))))
                }
                None => {}
            }
            if qp.link_state() == QpLinkState::Connected {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(IbConnError::Timeout);
            }
            ports = self
                .changed
                .wait_timeout(ports, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Serves one listener: matches each request to its QP by slot.
fn accept_loop(me: Weak<IbConn>, listener: Listener, port: u16) {
    loop {
        let inc = match listener.accept() {
            Ok(i) => i,
            Err(_) => {
                if me.strong_count() == 0 {
                    return;
                }
                continue;
            }
        };
        let Some(ib) = me.upgrade() else { return };
        let pd = inc.private_data().to_vec();
        if pd.len() < 12 || pd[..4] != PD_MAGIC {
            let _ = inc.reject(b"softrdma: not an IB-style connection request");
            continue;
        }
        let src = u32::from_be_bytes(pd[4..8].try_into().expect("4 octets"));
        let dst = u32::from_be_bytes(pd[8..12].try_into().expect("4 octets"));
        if (dst >> 8) as u16 != port {
            let _ = inc.reject(b"softrdma: wrong port for that QP");
            continue;
        }
        // Find the QP; if it has not reached RTR yet, park the request.
        enum Next {
            Answer(Qp, Expect, Incoming),
            Reject(Incoming),
            Parked,
        }
        let next = ib.with_slot(dst, |s| {
            match (s.qp.as_ref().and_then(|w| w.upgrade()), s.expect) {
                (Some(q), Some(e)) => Next::Answer(Qp { inner: q }, e, inc),
                (Some(_), None) => {
                    s.parked = Some((inc, src));
                    Next::Parked
                }
                (None, _) => Next::Reject(inc),
            }
        });
        match next {
            Some(Next::Answer(qp, e, inc)) => ib.answer(&qp, dst, e, inc, src),
            Some(Next::Reject(inc)) => {
                let _ = inc.reject(b"softrdma: no such QP");
            }
            Some(Next::Parked) => {}
            None => {}
        }
    }
}
