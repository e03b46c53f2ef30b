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

/* int, read only: 0 the kernel carries the socket, 1 an RC queue pair. */
#define SOFTRDMA_TRANSPORT 2

#endif /* SOFTRDMA_SOCKETS_H */
