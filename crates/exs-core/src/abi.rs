//! The C types and constants of `sys/exs.h`, with the same layout and
//! values (the C layout test in `crates/exs/tests` compares them).

#![allow(non_camel_case_types)]

use libc::{c_int, c_short, c_uint, c_void, off_t, size_t, sockaddr_storage, socklen_t, ssize_t};

/// `EXS_VERSION1`, the only version `exs_init` accepts.
pub const EXS_VERSION1: c_int = 1;
/// `EXS_QHANDLE_INVALID`.
pub const EXS_QHANDLE_INVALID: c_int = -1;
/// `EXS_MHANDLE_INVALID`.
pub const EXS_MHANDLE_INVALID: c_int = -1;
/// `EXS_MHANDLE_UNREGISTERED`: the buffer is not checked against a region.
pub const EXS_MHANDLE_UNREGISTERED: c_int = -2;
/// `EXS_MRF_SHARED`.
pub const EXS_MRF_SHARED: c_int = 0x1;
/// `EXS_EVTVEC_MAX`: largest |n| of `exs_qdequeue` and largest depth.
pub const EXS_EVTVEC_MAX: c_int = 65536;
/// `EXS_IOV_MAX`: most elements of a vector argument.
pub const EXS_IOV_MAX: c_int = 1024;

/// `EXS_EVT_POLL`.
pub const EXS_EVT_POLL: c_int = 1;
/// `EXS_EVT_CONNECT`.
pub const EXS_EVT_CONNECT: c_int = 2;
/// `EXS_EVT_ACCEPT`.
pub const EXS_EVT_ACCEPT: c_int = 3;
/// `EXS_EVT_SEND`.
pub const EXS_EVT_SEND: c_int = 4;
/// `EXS_EVT_RECV`.
pub const EXS_EVT_RECV: c_int = 5;
/// `EXS_EVT_SENDMSG`.
pub const EXS_EVT_SENDMSG: c_int = 6;
/// `EXS_EVT_RECVMSG`.
pub const EXS_EVT_RECVMSG: c_int = 7;
/// `EXS_EVT_SENDFILE`.
pub const EXS_EVT_SENDFILE: c_int = 8;
/// `EXS_EVT_SENDTIMEOUT` (reserved).
pub const EXS_EVT_SENDTIMEOUT: c_int = 9;
/// `EXS_EVT_RECVTIMEOUT` (reserved).
pub const EXS_EVT_RECVTIMEOUT: c_int = 10;
/// `EXS_EVT_SHUTDOWN`.
pub const EXS_EVT_SHUTDOWN: c_int = 11;
/// `EXS_EVT_CLOSE`.
pub const EXS_EVT_CLOSE: c_int = 12;

/// `EXS_CAF_FILDES`.
pub const EXS_CAF_FILDES: c_int = 0x1;
/// `EXS_CAF_AHANDLE`.
pub const EXS_CAF_AHANDLE: c_int = 0x2;

/// `EXS_QATTR_DEPTH`.
pub const EXS_QATTR_DEPTH: c_int = 1;
/// `EXS_QATTR_SIGNAL`.
pub const EXS_QATTR_SIGNAL: c_int = 2;
/// `EXS_QATTR_EVENTS`.
pub const EXS_QATTR_EVENTS: c_int = 3;
/// `EXS_QATTR_WAIT`.
pub const EXS_QATTR_WAIT: c_int = 4;
/// `EXS_SIG_DISABLE`.
pub const EXS_SIG_DISABLE: c_int = 0;
/// `EXS_SIG_ENABLE`.
pub const EXS_SIG_ENABLE: c_int = 1;
/// `EXS_WAIT_NOTIFY`.
pub const EXS_WAIT_NOTIFY: c_int = 0;
/// `EXS_WAIT_ADAPTIVE`.
pub const EXS_WAIT_ADAPTIVE: c_int = 1;
/// `EXS_WAIT_BUSY_POLL`.
pub const EXS_WAIT_BUSY_POLL: c_int = 2;

/// `SO_ASYNC_RECV_ORDERED`.
pub const SO_ASYNC_RECV_ORDERED: c_int = 0x4558_0001;
/// `SO_ASYNC_SEND_TIMEOUT` (refused: not implemented).
pub const SO_ASYNC_SEND_TIMEOUT: c_int = 0x4558_0002;
/// `SO_ASYNC_RECV_TIMEOUT` (refused: not implemented).
pub const SO_ASYNC_RECV_TIMEOUT: c_int = 0x4558_0003;

/// `EXS_PERSISTENT` (RDMA model only).
pub const EXS_PERSISTENT: c_int = 0x1000_0000;
/// `EXS_PERSISTENT_NOTIFY`: a persistent send or receive whose owner gets
/// an event each time the peer reads (or writes) the block; implies
/// `EXS_PERSISTENT`.
pub const EXS_PERSISTENT_NOTIFY: c_int = 0x2000_0000;

/// `EXS_IOVEC`.
pub const EXS_IOVEC: c_int = 1;
/// `EXS_FDVEC`.
pub const EXS_FDVEC: c_int = 2;

/// `exs_pollfd_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct exs_pollfd_t {
    /// The descriptor.
    pub fd: c_int,
    /// Requested `EXS_POLL*` bits.
    pub events: c_short,
    /// Returned bits.
    pub revents: c_short,
}

/// `exs_signal_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct exs_signal_t {
    /// `EXS_SIG_ENABLE` or `EXS_SIG_DISABLE`.
    pub exs_sig_mode: c_int,
    /// The signal number.
    pub exs_sig_signo: c_int,
}

/// `exs_iovec_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_iovec_t {
    /// Start.
    pub iov_base: *mut c_void,
    /// Length.
    pub iov_len: size_t,
    /// Registration, or `EXS_MHANDLE_UNREGISTERED`.
    pub iov_mhandle: c_int,
}

/// `exs_msghdr_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_msghdr_t {
    /// Address.
    pub msg_name: *mut c_void,
    /// Address length.
    pub msg_namelen: socklen_t,
    /// Vector.
    pub msg_iov: *mut exs_iovec_t,
    /// Vector length.
    pub msg_iovlen: c_int,
    /// Ancillary data.
    pub msg_control: *mut c_void,
    /// Ancillary data length.
    pub msg_controllen: socklen_t,
    /// Flags.
    pub msg_flags: c_int,
}

/// `exs_fdvec_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_fdvec_t {
    /// The file.
    pub fdv_fd: c_int,
    /// Offset in the file.
    pub fdv_offset: off_t,
    /// Bytes.
    pub fdv_len: size_t,
}

/// The union of `exs_xferfile_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union exs_xferfile_u {
    /// `EXS_IOVEC`.
    pub xf_iov: exs_iovec_t,
    /// `EXS_FDVEC`.
    pub xf_fdv: exs_fdvec_t,
}

/// `exs_xferfile_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct exs_xferfile_t {
    /// `EXS_IOVEC` or `EXS_FDVEC`.
    pub xf_type: c_int,
    /// The element.
    pub xf_u: exs_xferfile_u,
}

/// `exs_acceptaddr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct exs_acceptaddr_t {
    /// Length of the address.
    pub aa_addrlen: socklen_t,
    /// The peer's address.
    pub aa_addr: sockaddr_storage,
}

/// `exs_evt_xfer_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_evt_xfer_t {
    /// The call's buffer.
    pub exs_evt_buf: *mut c_void,
    /// The call's length.
    pub exs_evt_len: size_t,
    /// Bytes moved.
    pub exs_evt_nbytes: ssize_t,
    /// The call's flags.
    pub exs_evt_flags: c_int,
}

/// `exs_evt_xfermsg_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_evt_xfermsg_t {
    /// The call's msghdr.
    pub exs_evt_msg: *mut exs_msghdr_t,
    /// Bytes moved.
    pub exs_evt_nbytes: ssize_t,
    /// The call's flags.
    pub exs_evt_flags: c_int,
}

/// `exs_evt_xferfile_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_evt_xferfile_t {
    /// The call's vector.
    pub exs_evt_vec: *const exs_xferfile_t,
    /// Its count.
    pub exs_evt_count: c_int,
    /// Bytes sent.
    pub exs_evt_nbytes: ssize_t,
}

/// `exs_evt_accept_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_evt_accept_t {
    /// The new descriptor, -1 on failure.
    pub exs_evt_newfd: c_int,
    /// The call's address buffer.
    pub exs_evt_addr: *mut exs_acceptaddr_t,
}

/// `exs_evt_poll_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_evt_poll_t {
    /// The call's array.
    pub exs_evt_fds: *mut exs_pollfd_t,
    /// Its length.
    pub exs_evt_nfds: c_uint,
    /// Entries with revents set.
    pub exs_evt_nready: c_int,
}

/// The union of `exs_event_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union exs_evt_union {
    /// Send, receive.
    pub exs_evt_xfer: exs_evt_xfer_t,
    /// Sendmsg, recvmsg.
    pub exs_evt_xfermsg: exs_evt_xfermsg_t,
    /// Sendfile.
    pub exs_evt_xferfile: exs_evt_xferfile_t,
    /// Accept.
    pub exs_evt_accept: exs_evt_accept_t,
    /// Poll.
    pub exs_evt_poll: exs_evt_poll_t,
    /// The union's reserved size.
    pub exs_evt_reserved: [u64; 6],
}

/// `exs_event_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct exs_event_t {
    /// `EXS_EVT_*`.
    pub exs_evt_type: c_int,
    /// 0 or the failure's errno.
    pub exs_evt_errno: c_int,
    /// The call's descriptor.
    pub exs_evt_fd: c_int,
    /// Zero.
    pub exs_evt_reserved0: c_int,
    /// The caller's tag.
    pub exs_evt_ahandle: *mut c_void,
    /// Per type.
    pub exs_evt_union: exs_evt_union,
}

// SAFETY: the raw pointers in events are the caller's values carried
// back to it; the library never dereferences them through an event.
unsafe impl Send for exs_event_t {}

impl exs_event_t {
    /// An event of `ty` for `fd` and `ahandle` with a zeroed union.
    pub fn new(ty: c_int, fd: c_int, ahandle: usize, errno: c_int) -> exs_event_t {
        exs_event_t {
            exs_evt_type: ty,
            exs_evt_errno: errno,
            exs_evt_fd: fd,
            exs_evt_reserved0: 0,
            exs_evt_ahandle: ahandle as *mut c_void,
            exs_evt_union: exs_evt_union {
                exs_evt_reserved: [0; 6],
            },
        }
    }
}

impl std::fmt::Debug for exs_event_t {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("exs_event_t")
            .field("type", &self.exs_evt_type)
            .field("errno", &self.exs_evt_errno)
            .field("fd", &self.exs_evt_fd)
            .field("ahandle", &self.exs_evt_ahandle)
            .finish_non_exhaustive()
    }
}

/// Size and field offsets of the ABI types, for the C layout test:
/// `(name, value)` pairs printed the same way by `tests/c/layout.c`.
pub fn layout() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    vec![
        ("sizeof(exs_event_t)", size_of::<exs_event_t>()),
        ("exs_evt_errno", offset_of!(exs_event_t, exs_evt_errno)),
        ("exs_evt_fd", offset_of!(exs_event_t, exs_evt_fd)),
        ("exs_evt_ahandle", offset_of!(exs_event_t, exs_evt_ahandle)),
        ("exs_evt_union", offset_of!(exs_event_t, exs_evt_union)),
        ("sizeof(exs_evt_xfer_t)", size_of::<exs_evt_xfer_t>()),
        ("exs_evt_nbytes", offset_of!(exs_evt_xfer_t, exs_evt_nbytes)),
        (
            "xfer.exs_evt_flags",
            offset_of!(exs_evt_xfer_t, exs_evt_flags),
        ),
        (
            "xfermsg.exs_evt_nbytes",
            offset_of!(exs_evt_xfermsg_t, exs_evt_nbytes),
        ),
        (
            "xferfile.exs_evt_nbytes",
            offset_of!(exs_evt_xferfile_t, exs_evt_nbytes),
        ),
        (
            "accept.exs_evt_addr",
            offset_of!(exs_evt_accept_t, exs_evt_addr),
        ),
        (
            "poll.exs_evt_nready",
            offset_of!(exs_evt_poll_t, exs_evt_nready),
        ),
        ("sizeof(exs_iovec_t)", size_of::<exs_iovec_t>()),
        ("iov_mhandle", offset_of!(exs_iovec_t, iov_mhandle)),
        ("sizeof(exs_msghdr_t)", size_of::<exs_msghdr_t>()),
        ("msg_iov", offset_of!(exs_msghdr_t, msg_iov)),
        ("msg_control", offset_of!(exs_msghdr_t, msg_control)),
        ("msg_flags", offset_of!(exs_msghdr_t, msg_flags)),
        ("sizeof(exs_xferfile_t)", size_of::<exs_xferfile_t>()),
        ("xf_u", offset_of!(exs_xferfile_t, xf_u)),
        ("fdv_len", offset_of!(exs_fdvec_t, fdv_len)),
        ("sizeof(exs_acceptaddr_t)", size_of::<exs_acceptaddr_t>()),
        ("aa_addr", offset_of!(exs_acceptaddr_t, aa_addr)),
        ("sizeof(exs_pollfd_t)", size_of::<exs_pollfd_t>()),
        ("sizeof(exs_signal_t)", size_of::<exs_signal_t>()),
    ]
}
