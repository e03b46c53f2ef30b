/*
 * softrdma/sockets.h - socket options of softrdma's sockets interposer
 * (libsoftrdma-sockets.so.1, `softrdma run --sockets`).
 *
 * Under the interposer, a TCP socket whose peer is interposed too carries
 * its bytes over an RC queue pair (iWARP on the same TCP connection). By
 * default (SOFTRDMA_SOCKETS=auto) that happens at connect/accept; with
 * SOFTRDMA_SOCKETS=ddpmode only sockets the application switches with
 * SOFTRDMA_DDPMODE are touched, and every other call goes straight to the
 * C library.
 *
 * Without the interposer these options reach the kernel, which answers
 * -1 with errno ENOPROTOOPT: the application can tell and carry on.
 */
#ifndef SOFTRDMA_SOCKETS_H
#define SOFTRDMA_SOCKETS_H

/* The option level. */
#define SOL_SOFTRDMA 0x5352

/*
 * int. setsockopt with 1 switches a connected TCP socket to DDP: the MPA
 * exchange runs on the connection at once (the connecting end initiates,
 * the accepting end answers), so both ends must set it at the same point
 * of their byte streams, with nothing unread in between. It blocks until
 * the exchange ends, at most SO_RCVTIMEO or 10 s, and returns 0, or -1:
 *   ENOTCONN     the socket is not connected;
 *   ETIMEDOUT    the peer did not switch (on the accepting end the
 *                socket stays a plain TCP socket; on the connecting end
 *                the connection is unusable, its MPA Request was sent);
 *   EPROTO       the peer sent other data first (left unread; the socket
 *                stays plain);
 *   ECONNREFUSED the peer's interposer refused (its policy); both ends
 *                go on as plain TCP;
 *   ENOMEM       softrdma could not set up the queue pair.
 * Setting 1 on a socket already carried over RC returns 0; setting 0 on
 * one returns -1/EOPNOTSUPP (there is no way back mid-stream).
 * getsockopt returns 1 while the socket's bytes go over RC, 2 once it
 * moved to the Extended Sockets RDMA model, else 0.
 *
 * The interposer exports the Extended Sockets calls (sys/exs.h) too, so
 * a program linked with -lexs that runs under it gets them from the
 * interposer. An end's first exs_send, exs_recv, exs_sendmsg,
 * exs_recvmsg, exs_send_offset, exs_recv_offset, exs_fcntl, exs_shutdown,
 * exs_aclose, exs_getsockname or exs_getpeername on a switched socket
 * moves it to the RDMA model on the same connection, after the octets it
 * wrote: the descriptor becomes an RDMA-model SOCK_STREAM descriptor
 * (advertisements, RDMA Reads, immediate data, persistent transfers,
 * offsets, credits) once the peer's application switched too. Once the
 * peer switched, read/recv return the octets it wrote before and then
 * fail with EOPNOTSUPP; once this end switched, write/send/shutdown fail
 * with EOPNOTSUPP. See docs/exs.md, "DDPMODE sockets".
 */
#define SOFTRDMA_DDPMODE 1

/*
 * int: what carries the socket. getsockopt returns one of the values
 * below: SOFTRDMA_TRANSPORT_RC for a TCP socket carried over RC, the QP's
 * transport for a UDP socket that has its queue pair (it gets it when it
 * is bound, or at its first sendto/connect toward an interposed socket),
 * else SOFTRDMA_TRANSPORT_KERNEL.
 *
 * setsockopt on a UDP socket, before it is bound or first used, chooses
 * the transport of its queue pair instead of the process's default
 * (SOFTRDMA_SOCKETS_UDP=ud|rd|wr): SOFTRDMA_TRANSPORT_UD,
 * SOFTRDMA_TRANSPORT_RD or SOFTRDMA_TRANSPORT_WR, or
 * SOFTRDMA_TRANSPORT_KERNEL to leave the socket to the kernel. Both ends
 * must use the same transport: datagrams between sockets whose transports
 * differ go through the kernel.
 *
 * SOFTRDMA_TRANSPORT_WR: each datagram is one RDMA Write-Record into a
 * ring of 64 KiB slots that the receiving socket grants the sender (the
 * first datagrams, before the grant arrives, and datagrams sent while the
 * receiver has not read enough of the ring go as UD Sends). A datagram
 * some of whose segments were lost is delivered, after 100 ms, as the
 * part placed contiguously from its start: recvmsg sets MSG_TRUNC in
 * msg_flags and returns fewer octets than the datagram had (with the
 * MSG_TRUNC flag, recv returns its full length), so a reader that sizes
 * its buffer to the largest datagram tells a partial one by MSG_TRUNC.
 * A datagram whose first segment was lost is not delivered. Errors:
 *   EBUSY       the socket already has its queue pair (or was left to
 *               the kernel) and the value differs from what it has;
 *   EINVAL      not one of the values, or SOFTRDMA_TRANSPORT_RC;
 *   EOPNOTSUPP  a TCP socket (SOFTRDMA_DDPMODE switches those).
 */
#define SOFTRDMA_TRANSPORT 2

/* Values of SOFTRDMA_TRANSPORT. */
#define SOFTRDMA_TRANSPORT_KERNEL 0 /* the kernel's socket */
#define SOFTRDMA_TRANSPORT_RC     1 /* an RC queue pair (TCP) */
#define SOFTRDMA_TRANSPORT_UD     2 /* a UD queue pair (UDP): unreliable */
#define SOFTRDMA_TRANSPORT_RD     3 /* an RD queue pair (UDP): reliable datagrams */
#define SOFTRDMA_TRANSPORT_WR     4 /* a UD queue pair (UDP): RDMA Write-Records,
                                       partial delivery under loss */

/*
 * struct softrdma_records, getsockopt only: the socket's datagrams sent as
 * Write-Records, received as Write-Records, and of those delivered partly
 * (zeros for a socket that is not SOFTRDMA_TRANSPORT_WR). EINVAL if the
 * buffer is smaller than the struct.
 */
#define SOFTRDMA_RECORDS 3

struct softrdma_records {
	unsigned long long sent;
	unsigned long long received;
	unsigned long long partial;
};

#endif /* SOFTRDMA_SOCKETS_H */
