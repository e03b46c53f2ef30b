/* sys/exs.h: the Extended Sockets API (ES-API) of libexs.so (softrdma).
 *
 * Two models share this header:
 *
 *  - The Open Group model: asynchronous I/O on ordinary kernel sockets.
 *    A call such as exs_send() queues the operation and returns 0 (or -1
 *    with errno when it cannot start); its completion arrives later as one
 *    exs_event_t on the event queue named in the call, carrying the
 *    caller's ahandle and the outcome. The peer is any TCP/UDP program.
 *    Progress runs inside the library (one progress thread, epoll over the
 *    descriptors that have pending operations).
 *
 *  - The RDMA model (UNH-EXS): exs_socket() and friends over softrdma RC
 *    queue pairs (see the RDMA model section at the end).
 *
 * The names come from the ES-API and UNH-EXS. The numeric values and the
 * structure layouts below are this library's own and are frozen: they
 * never change within EXS_VERSION1 (source compatibility with other
 * ES-API implementations, binary compatibility with every libexs.so.1).
 * Where the specification is silent, the decision is written next to the
 * declaration it concerns; docs/exs.md collects them.
 *
 * Every call is thread-safe. Errors: a call that cannot start returns -1
 * (or the invalid handle) and sets errno; a failure after the call
 * returned 0 is reported in the event's exs_evt_errno. No pointer is kept
 * past the call unless the description says so (buffers of data
 * transfers, exs_msghdr_t of exs_recvmsg, exs_acceptaddr_t, exs_pollfd_t
 * arrays: these must stay valid until their event is dequeued).
 */
#ifndef SYS_EXS_H
#define SYS_EXS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Declared by <time.h> only in POSIX modes; named here for strict C. */
struct timespec;

/* ------------------------------------------------------------------ */
/* Version                                                            */

/* exs_init() accepts exactly this version. */
#define EXS_VERSION1 1
#define EXS_VERSION EXS_VERSION1

/* ------------------------------------------------------------------ */
/* Handles                                                            */

/* Event queue handle: a small non-negative int (printable with %d). */
typedef int exs_qhandle_t;
/* Memory registration handle: a small non-negative int. */
typedef int exs_mhandle_t;
/* The caller's tag for one operation, returned untouched in its event;
 * any value is allowed, including NULL and (exs_ahandle_t)-1. */
typedef void *exs_ahandle_t;

#define EXS_QHANDLE_INVALID ((exs_qhandle_t)-1)
#define EXS_MHANDLE_INVALID ((exs_mhandle_t)-1)
/* Passed instead of a handle: the buffer is not registered and is not
 * checked against any region. */
#define EXS_MHANDLE_UNREGISTERED ((exs_mhandle_t)-2)

/* exs_mregister() flags. EXS_MRF_SHARED: the region may be shared with
 * other processes; accepted, no effect on kernel sockets. Any other bit
 * is refused with EINVAL. */
#define EXS_MRF_SHARED 0x1

/* ------------------------------------------------------------------ */
/* Limits (ours)                                                      */

/* Largest |n| of exs_qdequeue() and largest queue depth. */
#define EXS_EVTVEC_MAX 65536
/* Most elements in an exs_msghdr_t, exs_sendfile() vector or exs_poll()
 * array. */
#define EXS_IOV_MAX 1024

/* ------------------------------------------------------------------ */
/* Event types (exs_evt_type)                                         */

#define EXS_EVT_POLL 1
#define EXS_EVT_CONNECT 2
#define EXS_EVT_ACCEPT 3
#define EXS_EVT_SEND 4
#define EXS_EVT_RECV 5
#define EXS_EVT_SENDMSG 6
#define EXS_EVT_RECVMSG 7
#define EXS_EVT_SENDFILE 8
/* Reserved for SO_ASYNC_SEND_TIMEOUT / SO_ASYNC_RECV_TIMEOUT (not
 * implemented yet: never delivered). */
#define EXS_EVT_SENDTIMEOUT 9
#define EXS_EVT_RECVTIMEOUT 10
#define EXS_EVT_SHUTDOWN 11
#define EXS_EVT_CLOSE 12

/* ------------------------------------------------------------------ */
/* Poll (the same bits as Linux poll(2))                              */

#define EXS_POLLIN 0x001
#define EXS_POLLPRI 0x002
#define EXS_POLLOUT 0x004
#define EXS_POLLERR 0x008
#define EXS_POLLHUP 0x010
#define EXS_POLLNVAL 0x020

typedef struct exs_pollfd {
    int fd;
    short events;  /* EXS_POLLIN | EXS_POLLOUT | EXS_POLLPRI */
    short revents; /* written when the EXS_EVT_POLL event is queued */
} exs_pollfd_t;

/* ------------------------------------------------------------------ */
/* Shutdown, cancel                                                   */

#define EXS_SHUT_RD 0
#define EXS_SHUT_WR 1
#define EXS_SHUT_RDWR 2

/* exs_cancel() flags: EXS_CAF_FILDES cancels the operations of one
 * descriptor; EXS_CAF_AHANDLE those carrying one ahandle (on that
 * descriptor when EXS_CAF_FILDES is also set, on any otherwise). */
#define EXS_CAF_FILDES 0x1
#define EXS_CAF_AHANDLE 0x2

/* ------------------------------------------------------------------ */
/* Queue attributes (exs_qgetattr / exs_qsetattr)                     */

/* int: the depth; may be raised, or lowered down to what is in use. */
#define EXS_QATTR_DEPTH 1
/* exs_signal_t: a signal raised on the process each time an event is
 * queued (EXS_SIG_ENABLE), or none (EXS_SIG_DISABLE, the default). */
#define EXS_QATTR_SIGNAL 2
/* int, read only: events ready to be dequeued. */
#define EXS_QATTR_EVENTS 3
/* int: how exs_qdequeue() waits: EXS_WAIT_NOTIFY (sleep, the default),
 * EXS_WAIT_ADAPTIVE (spin about 50 us, then sleep), EXS_WAIT_BUSY_POLL
 * (spin; a signal does not end such a wait with EINTR). While the RDMA
 * model is in use a waiting thread completes the connections' work
 * itself: it first polls them for SOFTRDMA_EXS_SPIN_US microseconds
 * (environment; default 50, 0 sleeps at once), whatever the mode. */
#define EXS_QATTR_WAIT 4

#define EXS_SIG_DISABLE 0
#define EXS_SIG_ENABLE 1

typedef struct exs_signal {
    int exs_sig_mode;  /* EXS_SIG_ENABLE or EXS_SIG_DISABLE */
    int exs_sig_signo; /* 1..64 when enabled */
} exs_signal_t;

#define EXS_WAIT_NOTIFY 0
#define EXS_WAIT_ADAPTIVE 1
#define EXS_WAIT_BUSY_POLL 2

/* ------------------------------------------------------------------ */
/* Socket options (exs_setsockopt / exs_getsockopt, level SOL_SOCKET)  */

/* int: receives complete in the order they were queued. Always true
 * here (every descriptor's receives are ordered); setting 0 is accepted
 * and changes nothing. */
#define SO_ASYNC_RECV_ORDERED 0x45580001
/* struct timespec: reserved, refused with ENOPROTOOPT (not implemented). */
#define SO_ASYNC_SEND_TIMEOUT 0x45580002
#define SO_ASYNC_RECV_TIMEOUT 0x45580003
#define EXS_TIMEOUT_ONCE 0x1

/* ------------------------------------------------------------------ */
/* Flags of data transfers                                            */

/* The RDMA model's persistent send/receive (UNH-EXS; see the RDMA model
 * below). Refused with EOPNOTSUPP on kernel sockets.
 * EXS_PERSISTENT_NOTIFY: persistent, and the block's owner gets an event
 * each time the peer reads (a send block) or writes (a receive block)
 * it. */
#define EXS_PERSISTENT 0x10000000
#define EXS_PERSISTENT_NOTIFY 0x20000000

/* ------------------------------------------------------------------ */
/* Scatter/gather                                                     */

typedef struct exs_iovec {
    void *iov_base;
    size_t iov_len;
    exs_mhandle_t iov_mhandle; /* or EXS_MHANDLE_UNREGISTERED */
} exs_iovec_t;

/* Like struct msghdr, with registered iovecs. exs_sendmsg() reads it
 * during the call only. exs_recvmsg() keeps the pointer: msg_namelen,
 * msg_controllen and msg_flags are written when its event is queued. */
typedef struct exs_msghdr {
    void *msg_name;
    socklen_t msg_namelen;
    exs_iovec_t *msg_iov;
    int msg_iovlen;
    void *msg_control;
    socklen_t msg_controllen;
    int msg_flags;
} exs_msghdr_t;

/* exs_sendfile() elements: bytes from memory (EXS_IOVEC) or a range of
 * a file (EXS_FDVEC), sent in vector order. */
#define EXS_IOVEC 1
#define EXS_FDVEC 2

typedef struct exs_fdvec {
    int fdv_fd;       /* a readable file (pread) */
    off_t fdv_offset;
    size_t fdv_len;
} exs_fdvec_t;

typedef struct exs_xferfile {
    int xf_type; /* EXS_IOVEC or EXS_FDVEC */
    union {
        exs_iovec_t xf_iov;
        exs_fdvec_t xf_fdv;
    } xf_u;
} exs_xferfile_t;

/* exs_accept() writes the peer's address here when the connection is
 * accepted (aa_addrlen: its length). */
typedef struct exs_acceptaddr {
    socklen_t aa_addrlen;
    struct sockaddr_storage aa_addr;
} exs_acceptaddr_t;

/* ------------------------------------------------------------------ */
/* Events                                                             */

/* EXS_EVT_SEND, EXS_EVT_RECV. */
typedef struct exs_evt_xfer {
    void *exs_evt_buf;      /* the call's buffer */
    size_t exs_evt_len;     /* the call's length */
    ssize_t exs_evt_nbytes; /* bytes moved; RECV: 0 = end of stream */
    int exs_evt_flags;      /* the call's flags */
} exs_evt_xfer_t;

/* EXS_EVT_SENDMSG, EXS_EVT_RECVMSG. */
typedef struct exs_evt_xfermsg {
    exs_msghdr_t *exs_evt_msg; /* the call's msghdr */
    ssize_t exs_evt_nbytes;
    int exs_evt_flags;
} exs_evt_xfermsg_t;

/* EXS_EVT_SENDFILE. */
typedef struct exs_evt_xferfile {
    const exs_xferfile_t *exs_evt_vec; /* the call's vector (not read again) */
    int exs_evt_count;
    ssize_t exs_evt_nbytes;
} exs_evt_xferfile_t;

/* EXS_EVT_ACCEPT. */
typedef struct exs_evt_accept {
    int exs_evt_newfd;                /* -1 on failure */
    exs_acceptaddr_t *exs_evt_addr;   /* the call's, or NULL */
} exs_evt_accept_t;

/* EXS_EVT_POLL. */
typedef struct exs_evt_poll {
    exs_pollfd_t *exs_evt_fds; /* the call's array, revents written */
    unsigned int exs_evt_nfds;
    int exs_evt_nready;        /* entries with revents != 0 */
} exs_evt_poll_t;

/* One completion. exs_evt_errno is 0 on success, else the errno of the
 * failure (ECANCELED for a cancelled operation, ECONNRESET once the peer
 * reset the connection). EXS_EVT_CONNECT, EXS_EVT_SHUTDOWN and
 * EXS_EVT_CLOSE carry no union member. The union's size is reserved for
 * the RDMA model's additions. */
typedef struct exs_event {
    int exs_evt_type;
    int exs_evt_errno;
    int exs_evt_fd; /* the descriptor of the call (-1 for EXS_EVT_POLL) */
    int exs_evt_reserved0;
    exs_ahandle_t exs_evt_ahandle;
    union {
        exs_evt_xfer_t exs_evt_xfer;
        exs_evt_xfermsg_t exs_evt_xfermsg;
        exs_evt_xferfile_t exs_evt_xferfile;
        exs_evt_accept_t exs_evt_accept;
        exs_evt_poll_t exs_evt_poll;
        uint64_t exs_evt_reserved[6];
    } exs_evt_union;
} exs_event_t;

/* ------------------------------------------------------------------ */
/* Initialisation, event queues, memory                               */

/* 0, or -1 with EINVAL when version is not EXS_VERSION1. Starts the
 * progress thread. Optional: every other call initialises on first use.
 * Calling it again is harmless. */
int exs_init(int version);

/* A queue of at most depth events (1..EXS_EVTVEC_MAX; else EINVAL).
 * Every queued operation reserves one slot until its event is dequeued:
 * an operation that finds every slot reserved fails with EAGAIN. */
exs_qhandle_t exs_qcreate(int depth);
/* EBUSY while operations on it are outstanding or events undequeued. */
int exs_qdelete(exs_qhandle_t qhandle);
/* Moves events into events[].
 *   n > 0: up to n events; waits for at least one (bounded by timeout).
 *   n < 0: waits until |n| events were moved (bounded by timeout).
 *   n == 0: returns 0 at once.
 *   timeout NULL: no bound; {0,0}: never blocks.
 * Returns the number moved (0 when the timeout expires first), or -1:
 * EINTR when a signal interrupted the wait before any event was moved
 * (events already moved are returned instead), EINVAL for a bad handle,
 * |n| > EXS_EVTVEC_MAX or a bad timeout, EFAULT for events == NULL. */
int exs_qdequeue(exs_qhandle_t qhandle, exs_event_t *events, int n,
                 const struct timespec *timeout);
int exs_qgetattr(exs_qhandle_t qhandle, int attr, void *value);
int exs_qsetattr(exs_qhandle_t qhandle, int attr, const void *value);

/* Registers [addr, addr + len): len > 0, addr != NULL, the range mapped
 * (else EINVAL / EFAULT). An operation naming the handle must lie inside
 * the range, else it fails with EINVAL. */
exs_mhandle_t exs_mregister(const void *addr, size_t len, int flags);
/* EBUSY while a queued operation names the handle. */
int exs_mderegister(exs_mhandle_t mhandle);

/* ------------------------------------------------------------------ */
/* Asynchronous operations (Open Group model, any kernel socket)      */
/*
 * All return 0 when queued, or -1 with errno: EBADF (fd not open),
 * ENOTSOCK, EINVAL (bad handle, flags, or a buffer outside its
 * registration), EFAULT (NULL buffer with a length), EAGAIN (the queue
 * is full), ECONNRESET (the connection was already reset).
 *
 * Per descriptor, sends (with exs_sendmsg, exs_sendfile, exs_shutdown)
 * complete in the order they were queued, and so do receives (with
 * exs_recvmsg, exs_accept). On a stream socket a send completes when the
 * whole buffer was written (exs_evt_nbytes == len); on failure
 * exs_evt_nbytes says how much was written first. A receive completes
 * with what one recv(2) returns (at least one byte, or 0 at end of
 * stream) unless MSG_WAITALL asks for the whole buffer.
 * Allowed flags: sends MSG_OOB, MSG_DONTROUTE, MSG_EOR, MSG_MORE,
 * MSG_NOSIGNAL (always implied); receives MSG_OOB, MSG_PEEK, MSG_WAITALL,
 * MSG_TRUNC. Others: EINVAL.
 */
int exs_send(int fd, const void *buf, size_t len, int flags,
             exs_qhandle_t qhandle, exs_ahandle_t ahandle, exs_mhandle_t mhandle);
int exs_recv(int fd, void *buf, size_t len, int flags,
             exs_qhandle_t qhandle, exs_ahandle_t ahandle, exs_mhandle_t mhandle);
int exs_sendmsg(int fd, const exs_msghdr_t *msg, int flags,
                exs_qhandle_t qhandle, exs_ahandle_t ahandle);
int exs_recvmsg(int fd, exs_msghdr_t *msg, int flags,
                exs_qhandle_t qhandle, exs_ahandle_t ahandle);
/* vec[0..count) is copied during the call. flags must be 0. */
int exs_sendfile(int fd, const exs_xferfile_t *vec, int count, int flags,
                 exs_qhandle_t qhandle, exs_ahandle_t ahandle);
/* Errors connect(2) reports at once (EINVAL, EISCONN, EAFNOSUPPORT, ...)
 * are the call's (-1); the connection's outcome (ECONNREFUSED, ...) is the
 * event's. Sends and receives queued meanwhile wait for the connection. */
int exs_connect(int fd, const struct sockaddr *addr, socklen_t addrlen,
                exs_qhandle_t qhandle, exs_ahandle_t ahandle);
/* flags: 0, SOCK_NONBLOCK, SOCK_CLOEXEC (as accept4). addr may be NULL. */
int exs_accept(int fd, exs_acceptaddr_t *addr, int flags,
               exs_qhandle_t qhandle, exs_ahandle_t ahandle);
/* Completes once, when at least one of fds[0..nfds) is ready (as poll(2)
 * would say); revents are then written into the caller's array. */
int exs_poll(exs_pollfd_t *fds, unsigned int nfds,
             exs_qhandle_t qhandle, exs_ahandle_t ahandle);
/* Queued behind the descriptor's sends: shutdown(2) once they are done. */
int exs_shutdown(int fd, int how, exs_qhandle_t qhandle, exs_ahandle_t ahandle);
/* Asynchronous close: waits for the descriptor's sends and shutdowns,
 * cancels its receives (ECANCELED), closes it, then queues EXS_EVT_CLOSE.
 * (exs_close, below, is the synchronous close.) */
int exs_aclose(int fd, exs_qhandle_t qhandle, exs_ahandle_t ahandle);
/* Cancels queued operations that have not started moving data (a send
 * partly written is left to finish: the stream stays whole). Each one
 * completes with ECANCELED. Returns how many were cancelled. */
int exs_cancel(int fd, exs_ahandle_t ahandle, int flags);

/* SO_ASYNC_* at SOL_SOCKET are the library's; everything else is
 * passed to setsockopt(2)/getsockopt(2). */
int exs_setsockopt(int fd, int level, int name, const void *value, socklen_t len);
int exs_getsockopt(int fd, int level, int name, void *value, socklen_t *len);

/* Synchronous close of any descriptor: its outstanding operations
 * complete with ECANCELED, then close(2). Use this (or exs_aclose)
 * rather than close(2) on a descriptor with operations outstanding. */
int exs_close(int fd);

/* ------------------------------------------------------------------ */
/* RDMA model (UNH-EXS)                                               */
/*
 * exs_socket(AF_INET or AF_INET6, SOCK_SEQPACKET or SOCK_STREAM, 0)
 * returns a descriptor of the library's own (an eventfd: a real
 * descriptor that never collides with a kernel socket; close it with
 * exs_close). Its peer is another libexs program; the transport is a
 * softrdma RC queue pair connected through softrdma's connection manager.
 * SOCK_DGRAM (protocol 0 or IPPROTO_UDP): see "Datagram sockets" below.
 * Other types ESOCKTNOSUPPORT; other domains EAFNOSUPPORT; protocol != 0
 * EPROTONOSUPPORT.
 *
 * exs_bind records the address; exs_listen binds it (port 0 picks one,
 * unbound: any address) and accepts connections into its backlog;
 * exs_accept and exs_connect are the asynchronous calls above. exs_send
 * and exs_recv work as above with these differences: a send advertises
 * its buffer and completes when the peer pulled it (one RDMA Read into
 * the receive's buffer) or, at most small-packet size octets, when the
 * data left inside the advertisement; buffers passed with
 * EXS_MHANDLE_UNREGISTERED are registered for the one operation.
 * SOCK_SEQPACKET: one send is one message; a receive shorter than the
 * message takes its first octets, the rest is discarded and the event's
 * exs_evt_flags has MSG_TRUNC. SOCK_STREAM: a receive shorter than the
 * message takes its first octets and the next receive the following
 * ones (byte order kept); a receive that begins with immediate data
 * also takes the immediate messages already arrived behind it, up to its
 * length (small sends coalesce).
 * Send flags: MSG_EOR, MSG_NOSIGNAL, MSG_DONTWAIT, MSG_MORE (no effect);
 * receive flags: MSG_TRUNC, MSG_WAITALL, MSG_DONTWAIT (no effect); others
 * EINVAL. exs_sendmsg/exs_recvmsg: one message per call; one iovec is
 * an exs_send/exs_recv of it, several go through a staging buffer (a
 * send gathers them at the call; a receive scatters before its event;
 * msg_flags gets MSG_TRUNC, msg_namelen and msg_controllen 0).
 * exs_sendfile: the elements are read (pread) into one buffer at the
 * call and sent as one message; an unreadable file fails the call, a
 * short one with EIO. exs_shutdown: SHUT_WR sends a FIN behind the
 * earlier sends (later sends EPIPE; the peer's receives then end with
 * 0 octets); SHUT_RD ends receives with 0 octets and takes what the
 * peer sends unread. exs_poll: POLLIN (a message waiting, end of
 * stream), POLLOUT (a credit free), POLLHUP/POLLERR (gone, broken).
 * exs_cancel: only operations not yet on the wire (receives not matched,
 * sends waiting for a credit). exs_aclose waits for the sends. The
 * peer's death:
 * every outstanding operation completes with ECONNRESET and later calls
 * fail with it; the peer's exs_close: pending receives end with 0 octets
 * (end of stream), sends with EPIPE.
 *
 * Persistent send: exs_send(..., EXS_PERSISTENT) advertises the buffer
 * (len > 0) once, registered for the peer's reads of exactly that range;
 * its event comes when the advertisement left. From then on every
 * exs_recv of the peer (after the normal messages sent before it) is
 * served from the block by one RDMA Read, without acknowledgement: the
 * sender's CPU is not involved and the block is never consumed (a
 * receive shorter than the block takes its first octets, MSG_TRUNC on
 * SOCK_SEQPACKET). With EXS_PERSISTENT_NOTIFY the sender gets one
 * EXS_EVT_SEND per read (exs_evt_buf at the octets read, exs_evt_nbytes
 * their count, exs_evt_flags EXS_PERSISTENT), each needing a free slot of
 * the send's queue (the peer is slowed down, not the queue overrun). One
 * persistent send per descriptor; afterwards exs_send fails with EINVAL
 * (the persistent side is passive). The block must stay mapped until the
 * descriptor is closed.
 * Persistent receive: exs_recv(..., EXS_PERSISTENT) advertises the buffer
 * once for the peer's writes; its event (0 octets, EXS_PERSISTENT) comes
 * when the advertisement left. Every later exs_send of the peer lands at
 * the block's start by one RDMA Write (longer than the block: the send
 * fails with EMSGSIZE) and completes when the Write left. The receiver
 * learns nothing unless it asked with EXS_PERSISTENT_NOTIFY: then one
 * EXS_EVT_RECV per write (exs_evt_buf where it landed, exs_evt_nbytes its
 * length), after the data is in place.
 * exs_send_offset / exs_recv_offset reach octets [offset, offset + len)
 * of the peer's persistent receive / send block with one Write / Read;
 * EINVAL at the call when the peer has no such block (yet) or the range
 * leaves it; persistent flags are EINVAL there.
 */

/* exs_fcntl commands (the int third argument; before exs_connect or
 * exs_listen, else EISCONN). Once connected the GET commands return the
 * negotiated values (the smaller of both ends').
 *   EXS_F_SETCREDITS: advertisements in flight per direction, 1..1024
 *     (default 64).
 *   EXS_F_SETSMALL: the largest send carried inside its advertisement
 *     (small_packet_max_size), 0..232 (default 128).
 * F_GETFL returns O_RDWR, F_SETFL is accepted (every call is
 * asynchronous anyway), F_GETFD/F_SETFD act on the descriptor; other
 * commands EINVAL. */
#define EXS_F_SETCREDITS 0x45580101
#define EXS_F_GETCREDITS 0x45580102
#define EXS_F_SETSMALL 0x45580103
#define EXS_F_GETSMALL 0x45580104

/* Datagram sockets: exs_socket(AF_INET or AF_INET6, SOCK_DGRAM, 0) is
 * one softrdma UD queue pair (RD with EXS_F_SETDGRAM) whose UDP socket is
 * bound to the descriptor's address and whose number is port << 8, so
 * the address (ip, port) names the queue pair: a send to (ip, port)
 * reaches the libexs datagram socket bound there (only such sockets: the
 * peer is another libexs program). exs_bind binds at once (port 0 picks
 * one; exs_getsockname tells it); a descriptor not bound is bound to the
 * unspecified address and a free port by its first exs_connect or
 * transfer. exs_sendmsg sends one datagram of the iovecs to msg_name
 * (exs_send: to the connected peer; neither: EDESTADDRREQ at the call);
 * at most 65536 octets (EMSGSIZE at the call). The send's event comes
 * when the datagram left. exs_recv / exs_recvmsg take one datagram each,
 * in arrival order; exs_recvmsg writes the source address to msg_name
 * (msg_namelen updated) before its EXS_EVT_RECVMSG event. A receive
 * shorter than the datagram takes its first octets, the rest is
 * discarded and the event's flags (and msg_flags) have MSG_TRUNC.
 * exs_connect fixes the peer (EXS_EVT_CONNECT at once): exs_send goes
 * there and only its datagrams are received. Loss is UDP's: a datagram
 * that finds the descriptor's 32 receive buffers full is dropped (RD
 * retransmits lost packets but still drops what finds no buffer).
 * exs_listen, exs_accept, exs_shutdown, exs_sendfile, the persistent flags
 * and the offset calls: EOPNOTSUPP.
 *   EXS_F_SETDGRAM: EXS_DGRAM_UD (default), EXS_DGRAM_RD or EXS_DGRAM_WR,
 *     before the descriptor is bound (else EISCONN). EXS_F_GETDGRAM reads
 *     it. UD and RD: both ends must use the same.
 *   EXS_DGRAM_WR (Write-Record): a UD queue pair whose datagrams are RDMA
 *     Write-Records into a ring of 8 slots the receiver granted this
 *     sender (docs/exs.md, "Datagram sockets"); a receive copies the
 *     datagram out of its slot and frees the slot. Without a ring, or out
 *     of credit (8 datagrams the receiver has not read yet), a datagram
 *     goes as a UD Send, so a WR end and a UD end still exchange
 *     datagrams (as UD). A record missing segments is delivered after
 *     100 ms as its placed prefix: fewer octets, MSG_TRUNC. A receiver
 *     serves 4 writers by Write-Record, others by UD Sends.
 *   EXS_F_GETDGRAMSTAT, EXS_DGRAM_STAT_*: one of the descriptor's
 *     counters (datagrams sent / received as Write-Records, received
 *     partial, sent / received as Sends); another argument EINVAL. */
#define EXS_F_SETDGRAM 0x45580105
#define EXS_F_GETDGRAM 0x45580106
#define EXS_F_GETDGRAMSTAT 0x45580107
#define EXS_DGRAM_UD 0
#define EXS_DGRAM_RD 1
#define EXS_DGRAM_WR 2
#define EXS_DGRAM_STAT_RECORDS_OUT 0
#define EXS_DGRAM_STAT_RECORDS_IN 1
#define EXS_DGRAM_STAT_RECORDS_PARTIAL 2
#define EXS_DGRAM_STAT_SENDS_OUT 3
#define EXS_DGRAM_STAT_SENDS_IN 4

int exs_socket(int domain, int type, int protocol);
int exs_bind(int fd, const struct sockaddr *addr, socklen_t addrlen);
int exs_listen(int fd, int backlog);
int exs_fcntl(int fd, int cmd, ...);
/* Connected: the local address toward the peer (an initiator's port
 * reads 0: the connection manager picks it); unconnected: the bound
 * address or the unspecified one. */
int exs_getsockname(int fd, struct sockaddr *addr, socklen_t *addrlen);
int exs_getpeername(int fd, struct sockaddr *addr, socklen_t *addrlen);
/* See "Persistent" above; ENOTSOCK / EBADF on descriptors that are not
 * the RDMA model's. */
int exs_send_offset(int fd, const void *buf, size_t len, int flags, uint64_t offset,
                    exs_qhandle_t qhandle, exs_ahandle_t ahandle, exs_mhandle_t mhandle);
int exs_recv_offset(int fd, void *buf, size_t len, int flags, uint64_t offset,
                    exs_qhandle_t qhandle, exs_ahandle_t ahandle, exs_mhandle_t mhandle);

#ifdef __cplusplus
}
#endif

#endif /* SYS_EXS_H */
