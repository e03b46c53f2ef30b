//! The verbs QP state machine: RESET → INIT → RTR → RTS (⇄ SQD), SQE, ERR,
//! with the InfiniBand transition table (IBA §10.3.1) and the attributes
//! each transition needs.
//!
//! | from \ to | RESET | INIT | RTR | RTS | SQD | ERR |
//! |---|---|---|---|---|---|---|
//! | RESET | ✓ | ✓ | | | | ✓ |
//! | INIT | ✓ | ✓ | ✓ | | | ✓ |
//! | RTR | ✓ | | | ✓ | | ✓ |
//! | RTS | ✓ | | | ✓ | ✓ | ✓ |
//! | SQD | ✓ | | | ✓ | ✓ | ✓ |
//! | SQE | ✓ | | | ✓ | | ✓ |
//! | ERR | ✓ | | | | | ✓ |
//!
//! On softrdma, RTR with a destination starts the daemonless IB-style
//! connection (the side with the smaller (GID, QPN) connects, see
//! `softrdma_engine::ibconn`), and RTS waits until it is up. A QP connected
//! by the [`crate::cm`] module goes to RTS when the connection is
//! established. Resetting a QP that has been connected is not supported:
//! create a new QP (the call says so).

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// QP states, numbered as `enum ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: work is flushed.
    Err,
}

impl QpState {
    /// The `ibv_qp_state` value.
    pub const fn ibv_code(self) -> u32 {
        match self {
            QpState::Reset => 0,
            QpState::Init => 1,
            QpState::Rtr => 2,
            QpState::Rts => 3,
            QpState::Sqd => 4,
            QpState::Sqe => 5,
            QpState::Err => 6,
        }
    }

    /// Whether the IB state table allows `self → to`.
    pub const fn can_move_to(self, to: QpState) -> bool {
        use QpState::*;
        matches!(
            (self, to),
            (_, Reset)
                | (_, Err)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Rts)
                | (Sqd, Sqd)
                | (Sqe, Rts)
        )
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        };
        f.write_str(s)
    }
}

/// The peer of an RTR transition (what `ibv_qp_attr.ah_attr` and
/// `dest_qp_num` say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination {
    /// The peer's address (its GID as an IP address).
    pub addr: IpAddr,
    /// The peer's QP number.
    pub qpn: u32,
}

/// Attributes of a transition (`ibv_qp_attr` with its mask: `None` = not in
/// the mask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// The target state.
    pub state: QpState,
    /// RTR: the peer (required for INIT → RTR).
    pub dest: Option<Destination>,
    /// RTR: inbound RDMA Read depth (`max_dest_rd_atomic`).
    pub max_dest_rd_atomic: Option<u16>,
    /// RTS: outbound RDMA Read depth (`max_rd_atomic`).
    pub max_rd_atomic: Option<u16>,
    /// RTS: how long to wait for the connection (default 30 s).
    pub timeout: Option<Duration>,
}

impl QpAttr {
    /// A transition to `state` with no other attribute.
    pub const fn to(state: QpState) -> QpAttr {
        QpAttr {
            state,
            dest: None,
            max_dest_rd_atomic: None,
            max_rd_atomic: None,
            timeout: None,
        }
    }
}

/// Why a transition was refused; the QP's state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModifyError {
    /// The IB state table does not allow it.
    InvalidTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A required attribute is missing.
    MissingAttribute {
        /// Requested state.
        to: QpState,
        /// Which attribute.
        attribute: &'static str,
    },
    /// Not supported by softrdma (the message says what to do instead).
    Unsupported(&'static str),
    /// The connection to the destination failed or timed out.
    Connect(String),
}

impl fmt::Display for ModifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModifyError::InvalidTransition { from, to } => {
                write!(
                    f,
                    "QP state transition {from} -> {to} is not allowed (IB state table)"
                )
            }
            ModifyError::MissingAttribute { to, attribute } => {
                write!(f, "QP transition to {to} needs the {attribute} attribute")
            }
            ModifyError::Unsupported(what) => write!(f, "not supported: {what}"),
            ModifyError::Connect(e) => write!(f, "connecting the QP failed: {e}"),
        }
    }
}

impl std::error::Error for ModifyError {}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::*;

    #[test]
    fn table() {
        let all = [Reset, Init, Rtr, Rts, Sqd, Sqe, Err];
        let allowed: &[(QpState, QpState)] = &[
            (Reset, Init),
            (Init, Init),
            (Init, Rtr),
            (Rtr, Rts),
            (Rts, Rts),
            (Rts, Sqd),
            (Sqd, Rts),
            (Sqd, Sqd),
            (Sqe, Rts),
        ];
        for f in all {
            for t in all {
                let expect = t == Reset || t == Err || allowed.contains(&(f, t));
                assert_eq!(f.can_move_to(t), expect, "{f} -> {t}");
            }
        }
        assert_eq!(Rts.ibv_code(), 3);
        assert!(ModifyError::InvalidTransition {
            from: Reset,
            to: Rts
        }
        .to_string()
        .contains("RESET -> RTS"));
    }
}
