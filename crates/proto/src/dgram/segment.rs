//! Small helpers for building the RDMAP segments that UD and RD share.

use softrdma_wire::ddp::DdpHeader;
use softrdma_wire::rdmap::SegmentRepr;

/// Sets the reserved-for-ULP word of an untagged segment (where the
/// datagram transports carry the DQPN); tagged segments are left alone.
pub(crate) fn set_rsvd_ulp(repr: &mut SegmentRepr, v: u32) {
    if let DdpHeader::Untagged { rsvd_ulp, .. } = &mut repr.ddp {
        *rsvd_ulp = v;
    }
}
