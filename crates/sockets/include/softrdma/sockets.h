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
 * getsockopt returns 1 while the socket's bytes go over RC, else 0.
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
 * (SOFTRDMA_SOCKETS_UDP=ud|rd): SOFTRDMA_TRANSPORT_UD or
 * SOFTRDMA_TRANSPORT_RD, or SOFTRDMA_TRANSPORT_KERNEL to leave the socket
 * to the kernel. Both ends must use the same transport: datagrams between
 * sockets whose transports differ go through the kernel. Errors:
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

#endif /* SOFTRDMA_SOCKETS_H */
