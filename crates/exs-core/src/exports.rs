//! The `extern "C"` calls of `sys/exs.h`, as a macro both `libexs.so`
//! and the sockets interposer expand ([`crate::exs_exports!`]): under
//! `LD_PRELOAD` an application's `exs_*` calls bind to the interposer's
//! copy, whose RDMA model shares the interposer's device (see
//! [`crate::ddp`]). Each export forwards to [`crate::api`] behind a panic
//! boundary: a panic fails the one call with `EIO` rather than unwinding
//! into C.

use crate::{sys, Errno};

/// The C types the exports name (the invoking crate need not depend on
/// `libc` itself).
#[doc(hidden)]
pub use libc as c;

/// Runs `f`; a panic becomes `fail` with errno EIO.
pub fn boundary<T>(fail: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            sys::set_errno(libc::EIO);
            fail
        }
    }
}

/// `Ok(v)` → `v`; `Err(e)` → `fail` with errno `e`.
pub fn ret<T>(r: Result<T, Errno>, fail: T) -> T {
    match r {
        Ok(v) => v,
        Err(e) => {
            sys::set_errno(e);
            fail
        }
    }
}

/// 0 or -1 with errno, behind the boundary.
pub fn unit(f: impl FnOnce() -> Result<(), Errno>) -> libc::c_int {
    boundary(-1, || ret(f().map(|()| 0), -1))
}

/// Defines every `exs_*` C call (`#[no_mangle] extern "C"`) in a private
/// module of the invoking crate, a `cdylib`.
#[macro_export]
macro_rules! exs_exports {
    () => {
        // Every export here is a C entry point whose safety contract is the
        // one sys/exs.h states for it.
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
        mod exs_exports {
            use $crate::abi::{
                exs_acceptaddr_t, exs_event_t, exs_msghdr_t, exs_pollfd_t, exs_xferfile_t,
                EXS_MHANDLE_INVALID, EXS_QHANDLE_INVALID,
            };
            use $crate::exports::c::{
                c_int, c_uint, c_ulong, c_void, size_t, sockaddr, socklen_t, timespec,
            };

            /// `exs_init`.
            #[no_mangle]
            pub extern "C" fn exs_init(version: c_int) -> c_int {
                $crate::exports::unit(|| $crate::api::init(version))
            }

            /// `exs_qcreate`.
            #[no_mangle]
            pub extern "C" fn exs_qcreate(depth: c_int) -> c_int {
                $crate::exports::boundary(EXS_QHANDLE_INVALID, || {
                    $crate::exports::ret($crate::api::qcreate(depth), EXS_QHANDLE_INVALID)
                })
            }

            /// `exs_qdelete`.
            #[no_mangle]
            pub extern "C" fn exs_qdelete(qh: c_int) -> c_int {
                $crate::exports::unit(|| $crate::api::qdelete(qh))
            }

            /// `exs_qdequeue`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_qdequeue(
                qh: c_int,
                events: *mut exs_event_t,
                n: c_int,
                timeout: *const timespec,
            ) -> c_int {
                // SAFETY: the caller's arguments under sys/exs.h's contract.
                $crate::exports::boundary(-1, || {
                    $crate::exports::ret(
                        unsafe { $crate::api::qdequeue(qh, events, n, timeout) },
                        -1,
                    )
                })
            }

            /// `exs_qgetattr`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_qgetattr(
                qh: c_int,
                attr: c_int,
                value: *mut c_void,
            ) -> c_int {
                // SAFETY: as above.
                $crate::exports::unit(|| unsafe { $crate::api::qgetattr(qh, attr, value) })
            }

            /// `exs_qsetattr`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_qsetattr(
                qh: c_int,
                attr: c_int,
                value: *const c_void,
            ) -> c_int {
                // SAFETY: as above.
                $crate::exports::unit(|| unsafe { $crate::api::qsetattr(qh, attr, value) })
            }

            /// `exs_mregister`.
            #[no_mangle]
            pub extern "C" fn exs_mregister(
                addr: *const c_void,
                len: size_t,
                flags: c_int,
            ) -> c_int {
                $crate::exports::boundary(EXS_MHANDLE_INVALID, || {
                    $crate::exports::ret(
                        $crate::api::mregister(addr, len, flags),
                        EXS_MHANDLE_INVALID,
                    )
                })
            }

            /// `exs_mderegister`.
            #[no_mangle]
            pub extern "C" fn exs_mderegister(mh: c_int) -> c_int {
                $crate::exports::unit(|| $crate::api::mderegister(mh))
            }

            /// `exs_send`.
            #[no_mangle]
            pub extern "C" fn exs_send(
                fd: c_int,
                buf: *const c_void,
                len: size_t,
                flags: c_int,
                qh: c_int,
                ah: *mut c_void,
                mh: c_int,
            ) -> c_int {
                $crate::exports::unit(|| $crate::api::send(fd, buf, len, flags, qh, ah, mh))
            }

            /// `exs_recv`.
            #[no_mangle]
            pub extern "C" fn exs_recv(
                fd: c_int,
                buf: *mut c_void,
                len: size_t,
                flags: c_int,
                qh: c_int,
                ah: *mut c_void,
                mh: c_int,
            ) -> c_int {
                $crate::exports::unit(|| $crate::api::recv(fd, buf, len, flags, qh, ah, mh))
            }

            /// `exs_sendmsg`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_sendmsg(
                fd: c_int,
                msg: *const exs_msghdr_t,
                flags: c_int,
                qh: c_int,
                ah: *mut c_void,
            ) -> c_int {
                // SAFETY: as above (a send only reads the msghdr).
                $crate::exports::unit(|| unsafe {
                    $crate::api::msg(false, fd, msg as *mut exs_msghdr_t, flags, qh, ah)
                })
            }

            /// `exs_recvmsg`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_recvmsg(
                fd: c_int,
                msg: *mut exs_msghdr_t,
                flags: c_int,
                qh: c_int,
                ah: *mut c_void,
            ) -> c_int {
                // SAFETY: as above.
                $crate::exports::unit(|| unsafe { $crate::api::msg(true, fd, msg, flags, qh, ah) })
            }

            /// `exs_sendfile`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_sendfile(
                fd: c_int,
                vec: *const exs_xferfile_t,
                count: c_int,
                flags: c_int,
                qh: c_int,
                ah: *mut c_void,
            ) -> c_int {
                // SAFETY: as above.
                $crate::exports::unit(|| unsafe {
                    $crate::api::sendfile(fd, vec, count, flags, qh, ah)
                })
            }

            /// `exs_connect`.
            #[no_mangle]
            pub extern "C" fn exs_connect(
                fd: c_int,
                addr: *const sockaddr,
                len: socklen_t,
                qh: c_int,
                ah: *mut c_void,
            ) -> c_int {
                $crate::exports::unit(|| $crate::api::connect(fd, addr, len, qh, ah))
            }

            /// `exs_accept`.
            #[no_mangle]
            pub extern "C" fn exs_accept(
                fd: c_int,
                addr: *mut exs_acceptaddr_t,
                flags: c_int,
                qh: c_int,
                ah: *mut c_void,
            ) -> c_int {
                $crate::exports::unit(|| $crate::api::accept(fd, addr, flags, qh, ah))
            }

            /// `exs_poll`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_poll(
                fds: *mut exs_pollfd_t,
                nfds: c_uint,
                qh: c_int,
                ah: *mut c_void,
            ) -> c_int {
                // SAFETY: as above.
                $crate::exports::unit(|| unsafe { $crate::api::poll(fds, nfds, qh, ah) })
            }

            /// `exs_shutdown`.
            #[no_mangle]
            pub extern "C" fn exs_shutdown(
                fd: c_int,
                how: c_int,
                qh: c_int,
                ah: *mut c_void,
            ) -> c_int {
                $crate::exports::unit(|| $crate::api::shutdown(fd, how, qh, ah))
            }

            /// `exs_aclose`.
            #[no_mangle]
            pub extern "C" fn exs_aclose(fd: c_int, qh: c_int, ah: *mut c_void) -> c_int {
                $crate::exports::unit(|| $crate::api::aclose(fd, qh, ah))
            }

            /// `exs_cancel`.
            #[no_mangle]
            pub extern "C" fn exs_cancel(fd: c_int, ah: *mut c_void, flags: c_int) -> c_int {
                $crate::exports::boundary(-1, || {
                    $crate::exports::ret($crate::api::cancel(fd, ah, flags), -1)
                })
            }

            /// `exs_close`.
            #[no_mangle]
            pub extern "C" fn exs_close(fd: c_int) -> c_int {
                $crate::exports::unit(|| $crate::api::close(fd))
            }

            /// `exs_setsockopt`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_setsockopt(
                fd: c_int,
                level: c_int,
                name: c_int,
                value: *const c_void,
                len: socklen_t,
            ) -> c_int {
                // SAFETY: as above.
                $crate::exports::unit(|| unsafe {
                    $crate::api::setsockopt(fd, level, name, value, len)
                })
            }

            /// `exs_getsockopt`.
            #[no_mangle]
            pub unsafe extern "C" fn exs_getsockopt(
                fd: c_int,
                level: c_int,
                name: c_int,
                value: *mut c_void,
                len: *mut socklen_t,
            ) -> c_int {
                // SAFETY: as above.
                $crate::exports::unit(|| unsafe {
                    $crate::api::getsockopt(fd, level, name, value, len)
                })
            }

            /// `exs_socket`.
            #[no_mangle]
            pub extern "C" fn exs_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
                $crate::exports::boundary(-1, || {
                    $crate::exports::ret($crate::api::socket(domain, ty, protocol), -1)
                })
            }

            /// `exs_bind`.
            #[no_mangle]
            pub extern "C" fn exs_bind(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int {
                $crate::exports::unit(|| $crate::api::bind(fd, a, l))
            }

            /// `exs_listen`.
            #[no_mangle]
            pub extern "C" fn exs_listen(fd: c_int, backlog: c_int) -> c_int {
                $crate::exports::unit(|| $crate::api::listen(fd, backlog))
            }

            /// `exs_fcntl`. Declared variadic in C; the one optional argument
            /// travels in a register either way.
            #[no_mangle]
            pub extern "C" fn exs_fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
                $crate::exports::boundary(-1, || {
                    $crate::exports::ret($crate::api::fcntl(fd, cmd, arg), -1)
                })
            }

            /// `exs_getsockname`.
            #[no_mangle]
            pub extern "C" fn exs_getsockname(
                fd: c_int,
                a: *mut sockaddr,
                l: *mut socklen_t,
            ) -> c_int {
                $crate::exports::unit(|| $crate::api::sockname(false, fd, a, l))
            }

            /// `exs_getpeername`.
            #[no_mangle]
            pub extern "C" fn exs_getpeername(
                fd: c_int,
                a: *mut sockaddr,
                l: *mut socklen_t,
            ) -> c_int {
                $crate::exports::unit(|| $crate::api::sockname(true, fd, a, l))
            }

            /// `exs_send_offset`: into the peer's persistent receive block at
            /// `offset` (one RDMA Write).
            #[no_mangle]
            pub extern "C" fn exs_send_offset(
                fd: c_int,
                buf: *const c_void,
                len: size_t,
                flags: c_int,
                offset: u64,
                qh: c_int,
                ah: *mut c_void,
                mh: c_int,
            ) -> c_int {
                $crate::exports::unit(|| {
                    $crate::api::offset_xfer(
                        false,
                        fd,
                        buf as usize,
                        len,
                        flags,
                        offset,
                        qh,
                        ah,
                        mh,
                    )
                })
            }

            /// `exs_recv_offset`: from the peer's persistent send block at `offset`
            /// (one RDMA Read).
            #[no_mangle]
            pub extern "C" fn exs_recv_offset(
                fd: c_int,
                buf: *mut c_void,
                len: size_t,
                flags: c_int,
                offset: u64,
                qh: c_int,
                ah: *mut c_void,
                mh: c_int,
            ) -> c_int {
                $crate::exports::unit(|| {
                    $crate::api::offset_xfer(true, fd, buf as usize, len, flags, offset, qh, ah, mh)
                })
            }
        }
    };
}
