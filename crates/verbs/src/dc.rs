//! Software dynamically connected transport (SoftDC): DC initiators and
//! targets (the `ibv_sdc_*` functions of the SoftDC design, in Rust).
//!
//! * [`ProtectionDomain::create_dct`] (`ibv_sdc_create_dct`): a DC target
//!   bound to a [`SharedReceiveQueue`] and a CQ, with a DC access key.
//!   Any DCI that presents the key may send to it; invitations with a
//!   wrong key are rejected and counted ([`DcTarget::rejected`]).
//! * [`ProtectionDomain::create_dci`] (`ibv_sdc_create_qp`): a DC
//!   initiator: one send queue, any RC operation (Send ± immediate ±
//!   invalidate, Write ± immediate, Read, atomics), each work request with
//!   its own destination: an address handle, a DCT number and a DC key
//!   ([`DcInitiator::post_send`], `ibv_sdc_post_send`).
//! * [`ProtectionDomain::sdc_create_ah`] (`ibv_sdc_create_ah`): an address
//!   handle for DC, cheap to clone and share between DCIs (and threads),
//!   so a server replying to many clients builds each address once.
//!   Dropping the last clone is `ibv_sdc_destroy_ah`.
//!
//! Completions of a DCI arrive in posting order whatever their targets.
//! A target that cannot be reached (invitation timeout), refuses (wrong
//! key, no such DCT) or fails mid-transfer gets error completions for its
//! work requests only; the DCI carries on with the others.
//!
//! The DCIs and DCTs of a context share one connection table
//! ([`DcOptions::table`]: capacity, default 16 connections; idle
//! timeout; invitation retransmission) set up by the first of them;
//! [`DcInitiator::stats`] and [`DcTarget::stats`] read it. With
//! `DcOptions::table.reverse` (the default) a DCI answering a peer whose
//! DCI connected to one of this context's DCTs sends over that same
//! connection (one TCP connection both ways, `docs/dc.md` §2).
//!
//! ```
//! use softrdma_verbs::dc::DcOptions;
//! use softrdma_verbs::{Access, Context, RecvWr, SendFlags, SendOp, SendWr, Payload, SgList};
//! use std::net::Ipv4Addr;
//! let ctx = Context::open().unwrap();
//! let pd = ctx.alloc_pd();
//! let cq = ctx.create_cq(64, None);
//! let srq = pd.create_srq(16);
//! let mr = pd.register(4096, Access::LOCAL_WRITE).unwrap();
//! let sge = mr.sge(0, 64);
//! srq.post_recv(RecvWr { wr_id: 1, sgl: SgList::single(sge.addr, sge.length, sge.lkey) }).unwrap();
//! let dct = pd.create_dct(&cq, &srq, 0x5eed, DcOptions::default()).unwrap();
//! let dci = pd.create_dci(&cq, 16, DcOptions::default()).unwrap();
//! let ah = pd.sdc_create_ah(Ipv4Addr::LOCALHOST.into());
//! mr.write_at(1024, b"hello").unwrap();
//! let src = mr.sge(1024, 5);
//! let wr = SendWr {
//!     wr_id: 7,
//!     op: SendOp::Send { imm: None, invalidate: None },
//!     payload: Payload::Sgl(SgList::single(src.addr, src.length, src.lkey)),
//!     flags: SendFlags { signaled: true, ..SendFlags::default() },
//! };
//! dci.post_send(wr, &ah, dct.number(), 0x5eed).unwrap();
//! let mut got = Vec::new();
//! while got.len() < 2 {
//!     got.extend(cq.wait_one(std::time::Duration::from_secs(10)));
//! }
//! assert!(got.iter().all(|c| c.wc.status == softrdma_verbs::WcStatus::Success));
//! ```

use std::net::IpAddr;
use std::sync::Arc;

pub use softrdma_engine::dc::{DcError, DcOptions, DcServiceStats};
pub use softrdma_proto::dc::{DcConfig, DcStats};

use softrdma_engine::dc as edc;
use softrdma_proto::dc::DcTarget as Dest;
use softrdma_proto::wr::DgramAddr;

use crate::{CompletionQueue, PostError, ProtectionDomain, SendWr, SharedReceiveQueue};

/// A DC address handle (`ibv_sdc_create_ah`): where DCTs live. Clones
/// share it.
#[derive(Debug, Clone)]
pub struct DcAddressHandle {
    inner: Arc<AhInner>,
}

#[derive(Debug)]
struct AhInner {
    ip: IpAddr,
    pd: u32,
}

impl DcAddressHandle {
    /// The IP address it reaches.
    pub fn ip(&self) -> IpAddr {
        self.inner.ip
    }

    /// The DCT `dct` behind this address (its UDP port is `dct >> 8`, the
    /// `(port << 8) | slot` rule).
    fn dest(&self, dct: u32, key: u64) -> Dest {
        Dest {
            addr: DgramAddr {
                ip: self.inner.ip,
                port: (dct >> 8) as u16,
                qpn: dct,
            },
            key,
            local: 0,
        }
    }
}

/// A DC initiator (`ibv_sdc_create_qp`).
#[derive(Debug)]
pub struct DcInitiator {
    dci: edc::Dci,
    pd: u32,
}

/// A DC target (`ibv_sdc_create_dct`).
#[derive(Debug)]
pub struct DcTarget {
    dct: edc::Dct,
    _srq: SharedReceiveQueue,
}

impl ProtectionDomain {
    /// A DC address handle for `ip` (`ibv_sdc_create_ah`).
    pub fn sdc_create_ah(&self, ip: IpAddr) -> DcAddressHandle {
        DcAddressHandle {
            inner: Arc::new(AhInner { ip, pd: self.pd }),
        }
    }

    /// A DC initiator completing into `cq`, at most `max_send_wr` work
    /// requests outstanding. `opts` set up the context's DC service if
    /// this is its first DCI or DCT (otherwise they are ignored).
    pub fn create_dci(
        &self,
        cq: &CompletionQueue,
        max_send_wr: usize,
        opts: DcOptions,
    ) -> Result<DcInitiator, DcError> {
        let svc = edc::DcService::of(&self.ctx, opts)?;
        Ok(DcInitiator {
            dci: edc::Dci::new(&svc, self.pd, cq.cq.clone(), max_send_wr),
            pd: self.pd,
        })
    }

    /// A DC target with access key `key`: incoming Sends (and Writes with
    /// immediate) take receives from `srq` and complete into `cq`. `opts`
    /// as for [`ProtectionDomain::create_dci`]. An SRQ of another
    /// protection domain is refused.
    pub fn create_dct(
        &self,
        cq: &CompletionQueue,
        srq: &SharedReceiveQueue,
        key: u64,
        opts: DcOptions,
    ) -> Result<DcTarget, DcError> {
        if srq.pd != self.pd {
            return Err(DcError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the SRQ belongs to another protection domain",
            )));
        }
        let svc = edc::DcService::of(&self.ctx, opts)?;
        Ok(DcTarget {
            dct: edc::Dct::new(&svc, self.pd, cq.cq.clone(), srq.srq.clone(), key)?,
            _srq: srq.clone(),
        })
    }
}

impl DcInitiator {
    /// Posts `wr` to DCT number `dct` at `ah` with DC access key `key`
    /// (`ibv_sdc_post_send`). Local memory must be registered in this
    /// DCI's protection domain, as must the address handle's.
    /// [`PostError::Unsupported`] for Write-Record, [`PostError::Invalid`]
    /// for a local invalidate (it has no destination) or an address
    /// handle of another protection domain, [`PostError::QueueFull`] when
    /// `max_send_wr` are outstanding.
    pub fn post_send(
        &self,
        wr: SendWr,
        ah: &DcAddressHandle,
        dct: u32,
        key: u64,
    ) -> Result<(), PostError> {
        if ah.inner.pd != self.pd {
            return Err(PostError::Invalid);
        }
        Ok(self.dci.post_send(wr, ah.dest(dct, key))?)
    }

    /// The number its completions carry (`qp_num`).
    pub fn qp_num(&self) -> u32 {
        self.dci.qp_num()
    }

    /// Work requests posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.dci.outstanding()
    }

    /// The context's DC counters (connection table included).
    pub fn stats(&self) -> DcServiceStats {
        self.dci.service().stats()
    }
}

impl DcTarget {
    /// The DCT number initiators address.
    pub fn number(&self) -> u32 {
        self.dct.number()
    }

    /// The DCT's invitation address (its IP is unspecified when bound to
    /// every interface: peers use one of the host's addresses).
    pub fn address(&self) -> DgramAddr {
        self.dct.address()
    }

    /// Invitations rejected for a wrong DC key.
    pub fn rejected(&self) -> u64 {
        self.dct.rejected()
    }

    /// Sources of rejected invitations not read yet (at most 256 kept).
    pub fn take_rejections(&self) -> Vec<DgramAddr> {
        self.dct.take_rejections()
    }

    /// Connections to this DCT that a Send finding its SRQ empty failed
    /// (iWARP has no receiver-not-ready retry; what that Send and the
    /// Sends behind it carried is lost, `docs/dc.md` §4).
    pub fn connections_lost_no_receive(&self) -> u64 {
        self.dct.connections_lost_no_receive()
    }

    /// The context's DC counters (connection table included).
    pub fn stats(&self) -> DcServiceStats {
        self.dct.service().stats()
    }
}
