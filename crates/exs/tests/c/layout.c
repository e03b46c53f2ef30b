/* Prints the sizes and offsets of sys/exs.h's types, one "name value"
 * per line, in the order of softrdma_exs_core::abi::layout(). */
#include <stddef.h>
#include <stdio.h>
#include <sys/exs.h>

#define P(name, v) printf("%s %zu\n", name, (size_t)(v))

int main(void) {
    P("sizeof(exs_event_t)", sizeof(exs_event_t));
    P("exs_evt_errno", offsetof(exs_event_t, exs_evt_errno));
    P("exs_evt_fd", offsetof(exs_event_t, exs_evt_fd));
    P("exs_evt_ahandle", offsetof(exs_event_t, exs_evt_ahandle));
    P("exs_evt_union", offsetof(exs_event_t, exs_evt_union));
    P("sizeof(exs_evt_xfer_t)", sizeof(exs_evt_xfer_t));
    P("exs_evt_nbytes", offsetof(exs_evt_xfer_t, exs_evt_nbytes));
    P("xfer.exs_evt_flags", offsetof(exs_evt_xfer_t, exs_evt_flags));
    P("xfermsg.exs_evt_nbytes", offsetof(exs_evt_xfermsg_t, exs_evt_nbytes));
    P("xferfile.exs_evt_nbytes", offsetof(exs_evt_xferfile_t, exs_evt_nbytes));
    P("accept.exs_evt_addr", offsetof(exs_evt_accept_t, exs_evt_addr));
    P("poll.exs_evt_nready", offsetof(exs_evt_poll_t, exs_evt_nready));
    P("sizeof(exs_iovec_t)", sizeof(exs_iovec_t));
    P("iov_mhandle", offsetof(exs_iovec_t, iov_mhandle));
    P("sizeof(exs_msghdr_t)", sizeof(exs_msghdr_t));
    P("msg_iov", offsetof(exs_msghdr_t, msg_iov));
    P("msg_control", offsetof(exs_msghdr_t, msg_control));
    P("msg_flags", offsetof(exs_msghdr_t, msg_flags));
    P("sizeof(exs_xferfile_t)", sizeof(exs_xferfile_t));
    P("xf_u", offsetof(exs_xferfile_t, xf_u));
    P("fdv_len", offsetof(exs_fdvec_t, fdv_len));
    P("sizeof(exs_acceptaddr_t)", sizeof(exs_acceptaddr_t));
    P("aa_addr", offsetof(exs_acceptaddr_t, aa_addr));
    P("sizeof(exs_pollfd_t)", sizeof(exs_pollfd_t));
    P("sizeof(exs_signal_t)", sizeof(exs_signal_t));
    /* values the library relies on */
    P("EXS_VERSION", EXS_VERSION);
    P("EXS_EVT_CLOSE", EXS_EVT_CLOSE);
    P("EXS_POLLIN", EXS_POLLIN);
    P("EXS_POLLOUT", EXS_POLLOUT);
    P("SO_ASYNC_RECV_ORDERED", SO_ASYNC_RECV_ORDERED);
    P("EXS_PERSISTENT", EXS_PERSISTENT);
    P("EXS_PERSISTENT_NOTIFY", EXS_PERSISTENT_NOTIFY);
    return 0;
}
