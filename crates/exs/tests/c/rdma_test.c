/* The RDMA model of libexs between two processes: the program forks
 * before its first exs_* call; the child is the server (it listens on
 * 127.0.0.1, port 0, and tells the parent the port through a pipe), the
 * parent the client.
 *
 *   rdma_test seqpacket        transfers of every size class, boundaries,
 *                              truncation, unregistered buffers, names
 *   rdma_test stream           byte order with short receives
 *   rdma_test credits N        credits negotiated; N small messages blasted
 *                              in order (no RNR: a lost message or a reset
 *                              fails the run), then 2000 pulled ones
 *   rdma_test errors           calls that cannot start, late failures
 *   rdma_test kill             the server is killed mid-transfer: every
 *                              outstanding operation ends with ECONNRESET;
 *                              exs_poll says POLLHUP | POLLERR
 *   rdma_test threads N        two connections, a sleeping and a busy-polling
 *                              thread per side, N checked ping-pongs each
 *   rdma_test persistent       persistent send and receive, with and without
 *                              notes, offsets and their bounds
 *   rdma_test latency N        ping-pong, one-way microseconds at 1/10/100 B
 *                              for normal (small 0) and immediate sends;
 *                              then receives pulling a persistent block
 *   rdma_test calls TYPE       exs_sendmsg/exs_recvmsg, exs_sendfile (a file
 *                              under $TMPDIR), exs_poll (with a pipe),
 *                              exs_cancel, exs_shutdown, exs_aclose on a
 *                              TYPE (seqpacket or stream) connection
 *
 * Every wait is bounded (10 s); the harness bounds the whole run too. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static exs_qhandle_t q;

static exs_event_t next(int type) {
    exs_event_t ev;
    struct timespec t = {10, 0};
    int n = exs_qdequeue(q, &ev, 1, &t);
    CHECK(n == 1, "no event in 10 s (waiting for type %d)", type);
    CHECK(ev.exs_evt_type == type, "event type %d, expected %d (errno %d)", ev.exs_evt_type,
          type, ev.exs_evt_errno);
    return ev;
}

static struct sockaddr_in lo(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static int type_of(const char *mode) {
    return strcmp(mode, "stream") == 0 ? SOCK_STREAM : SOCK_SEQPACKET;
}

/* Server side: listen, tell the port, accept one connection. */
static int serve(int wfd, int type, int credits) {
    CHECK(exs_init(EXS_VERSION) == 0, "init");
    q = exs_qcreate(4096);
    CHECK(q != EXS_QHANDLE_INVALID, "qcreate");
    int l = exs_socket(AF_INET, type, 0);
    CHECK(l >= 0, "exs_socket");
    if (credits > 0) CHECK(exs_fcntl(l, EXS_F_SETCREDITS, credits) == 0, "set credits");
    struct sockaddr_in a = lo(0);
    CHECK(exs_bind(l, (struct sockaddr *)&a, sizeof a) == 0, "bind");
    CHECK(exs_listen(l, 4) == 0, "listen");
    socklen_t al = sizeof a;
    CHECK(exs_getsockname(l, (struct sockaddr *)&a, &al) == 0 && ntohs(a.sin_port) != 0, "name");
    int port = ntohs(a.sin_port);
    CHECK(write(wfd, &port, sizeof port) == sizeof port, "tell port");
    exs_acceptaddr_t aa;
    memset(&aa, 0, sizeof aa);
    CHECK(exs_accept(l, &aa, 0, q, AH(1)) == 0, "accept");
    exs_event_t ev = next(EXS_EVT_ACCEPT);
    CHECK(ev.exs_evt_errno == 0, "accept failed");
    int fd = ev.exs_evt_union.exs_evt_accept.exs_evt_newfd;
    CHECK(fd >= 0 && aa.aa_addrlen == sizeof(struct sockaddr_in), "accepted");
    CHECK(((struct sockaddr_in *)&aa.aa_addr)->sin_addr.s_addr == htonl(INADDR_LOOPBACK),
          "peer address");
    CHECK(exs_close(l) == 0, "close listener");
    return fd;
}

static int dial(int port, int type, int credits, int small) {
    CHECK(exs_init(EXS_VERSION) == 0, "init");
    q = exs_qcreate(4096);
    CHECK(q != EXS_QHANDLE_INVALID, "qcreate");
    int fd = exs_socket(AF_INET, type, 0);
    CHECK(fd >= 0, "exs_socket");
    if (credits > 0) CHECK(exs_fcntl(fd, EXS_F_SETCREDITS, credits) == 0, "set credits");
    if (small >= 0) CHECK(exs_fcntl(fd, EXS_F_SETSMALL, small) == 0, "set small");
    struct sockaddr_in a = lo(port);
    CHECK(exs_connect(fd, (struct sockaddr *)&a, sizeof a, q, AH(2)) == 0, "connect");
    exs_event_t ev = next(EXS_EVT_CONNECT);
    CHECK(ev.exs_evt_errno == 0, "connect failed: %d", ev.exs_evt_errno);
    return fd;
}

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131 + i * 7);
}

static int same(const unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed * 131 + i * 7)) return 0;
    return 1;
}

static const size_t sizes[] = {0, 1, 100, 128, 129, 232, 4096, 65536, 1 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define BIG (1 << 20)

static void send1(int fd, void *buf, size_t len, exs_mhandle_t mh, int tag) {
    CHECK(exs_send(fd, buf, len, 0, q, AH(tag), mh) == 0, "send %zu", len);
}

/* ---------------------------------------------------------------- */

static int seq_server(int wfd) {
    int fd = serve(wfd, SOCK_SEQPACKET, 0);
    unsigned char *b = malloc(BIG);
    exs_mhandle_t mh = exs_mregister(b, BIG, 0);
    CHECK(mh != EXS_MHANDLE_INVALID, "mregister");
    for (unsigned i = 0; i < NSIZES; i++) {
        memset(b, 0xee, BIG);
        CHECK(exs_recv(fd, b, BIG, 0, q, AH(i), mh) == 0, "recv");
        exs_event_t ev = next(EXS_EVT_RECV);
        CHECK(ev.exs_evt_errno == 0, "recv %u errno", i);
        CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)sizes[i],
              "recv %u: %zd octets, expected %zu", i, ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes,
              sizes[i]);
        CHECK(same(b, sizes[i], i), "content of message %u", i);
        CHECK(sizes[i] == BIG || b[sizes[i]] == 0xee, "octets past message %u", i);
    }
    /* truncation: a 1000-octet message into 10 octets, then the next
     * message whole (boundaries kept) */
    CHECK(exs_recv(fd, b, 10, 0, q, AH(100), mh) == 0, "short recv");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 10 &&
              (ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & MSG_TRUNC),
          "truncated: %zd flags %x", ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes,
          ev.exs_evt_union.exs_evt_xfer.exs_evt_flags);
    CHECK(same(b, 10, 50), "truncated content");
    CHECK(exs_recv(fd, b, 5000, 0, q, AH(101), mh) == 0, "recv");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 3000 && same(b, 3000, 51) &&
              !(ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & MSG_TRUNC),
          "message after the truncated one");
    /* the same for an immediate message */
    CHECK(exs_recv(fd, b, 3, 0, q, AH(102), mh) == 0, "short recv");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 3 && same(b, 3, 52) &&
              (ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & MSG_TRUNC),
          "truncated immediate");
    /* unregistered receive buffer (registered for the one operation) */
    unsigned char *u = malloc(70000);
    CHECK(exs_recv(fd, u, 70000, 0, q, AH(103), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 70000 && same(u, 70000, 53),
          "unregistered receive");
    /* receives queued before the messages arrive complete in order */
    for (int i = 0; i < 8; i++)
        CHECK(exs_recv(fd, b + i * 8192, 8192, 0, q, AH(200 + i), mh) == 0, "recv");
    CHECK(write(wfd, "g", 1) == 1, "go");
    for (int i = 0; i < 8; i++) {
        ev = next(EXS_EVT_RECV);
        CHECK(ev.exs_evt_ahandle == AH(200 + i), "receive order");
        size_t n = (i % 2) ? 8000 : 16;
        CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)n &&
                  same(b + i * 8192, n, 60 + i),
              "queued receive %d", i);
    }
    /* names */
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    CHECK(exs_getpeername(fd, (struct sockaddr *)&a, &al) == 0 && al == sizeof a &&
              a.sin_addr.s_addr == htonl(INADDR_LOOPBACK),
          "getpeername");
    /* the peer closes: a pending receive ends with 0 octets */
    CHECK(exs_recv(fd, b, 10, 0, q, AH(300), mh) == 0, "recv");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0,
          "end of stream: errno %d", ev.exs_evt_errno);
    CHECK(exs_close(fd) == 0, "close");
    CHECK(exs_mderegister(mh) == 0, "mderegister");
    printf("server: ok\n");
    return 0;
}

static int seq_client(int port, int rfd) {
    int fd = dial(port, SOCK_SEQPACKET, 0, -1);
    CHECK(exs_fcntl(fd, EXS_F_GETCREDITS) == 64, "default credits");
    CHECK(exs_fcntl(fd, EXS_F_GETSMALL) == 128, "default small");
    FAILS(exs_fcntl(fd, EXS_F_SETCREDITS, 8), EISCONN);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    CHECK(exs_getpeername(fd, (struct sockaddr *)&a, &al) == 0 && ntohs(a.sin_port) == port,
          "getpeername");
    al = sizeof a;
    CHECK(exs_getsockname(fd, (struct sockaddr *)&a, &al) == 0 &&
              a.sin_addr.s_addr == htonl(INADDR_LOOPBACK),
          "getsockname");
    unsigned char *b = malloc(NSIZES * BIG);
    exs_mhandle_t mh = exs_mregister(b, NSIZES * BIG, 0);
    CHECK(mh != EXS_MHANDLE_INVALID, "mregister");
    for (unsigned i = 0; i < NSIZES; i++) {
        fill(b + i * BIG, sizes[i], i);
        send1(fd, b + i * BIG, sizes[i], mh, (int)i);
    }
    for (unsigned i = 0; i < NSIZES; i++) {
        exs_event_t ev = next(EXS_EVT_SEND);
        CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(i) &&
                  ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)sizes[i],
              "send %u", i);
    }
    fill(b, 1000, 50);
    fill(b + 4096, 3000, 51);
    fill(b + 8192, 100, 52);
    send1(fd, b, 1000, mh, 50);
    send1(fd, b + 4096, 3000, mh, 51);
    send1(fd, b + 8192, 100, mh, 52);
    unsigned char *u = malloc(70000);
    fill(u, 70000, 53);
    send1(fd, u, 70000, EXS_MHANDLE_UNREGISTERED, 53);
    for (int i = 0; i < 4; i++) {
        exs_event_t ev = next(EXS_EVT_SEND);
        CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(50 + i), "send %d", 50 + i);
    }
    char g;
    CHECK(read(rfd, &g, 1) == 1, "go");
    for (int i = 0; i < 8; i++) {
        size_t n = (i % 2) ? 8000 : 16;
        fill(b + BIG + i * 8192, n, 60 + i);
        send1(fd, b + BIG + i * 8192, n, mh, 60 + i);
    }
    for (int i = 0; i < 8; i++) {
        exs_event_t ev = next(EXS_EVT_SEND);
        CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(60 + i), "send order");
    }
    CHECK(exs_close(fd) == 0, "close");
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

static int stream_server(int wfd) {
    int fd = serve(wfd, SOCK_STREAM, 0);
    unsigned char *b = malloc(200000);
    exs_mhandle_t mh = exs_mregister(b, 200000, 0);
    size_t got = 0, total = 100 + 100000;
    while (got < total) {
        CHECK(exs_recv(fd, b + got, 777, 0, q, AH(1), mh) == 0, "recv");
        exs_event_t ev = next(EXS_EVT_RECV);
        ssize_t n = ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
        CHECK(ev.exs_evt_errno == 0 && n > 0 && n <= 777, "stream recv %zd", n);
        got += (size_t)n;
    }
    CHECK(got == total && same(b, 100, 1) && same(b + 100, 100000, 2), "stream order");
    /* 50 sends of 10 octets, all arrived before the receive: one receive
     * spans them (coalescing), bytes in order */
    usleep(200000);
    memset(b, 0, 4096);
    got = 0;
    int receives = 0;
    size_t first = 0;
    while (got < 500) {
        CHECK(exs_recv(fd, b + got, 4096 - got, 0, q, AH(1), mh) == 0, "recv");
        exs_event_t ev = next(EXS_EVT_RECV);
        ssize_t n = ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
        CHECK(ev.exs_evt_errno == 0 && n > 0, "stream recv %zd", n);
        if (receives++ == 0) first = (size_t)n;
        got += (size_t)n;
    }
    CHECK(got == 500 && same(b, 500, 3), "coalesced bytes in order");
    CHECK(first > 10, "the first receive spans sends (%zu octets)", first);
    printf("coalesced: 500 octets of 50 sends in %d receives\n", receives);
    CHECK(exs_close(fd) == 0, "close");
    printf("server: ok\n");
    return 0;
}

static int stream_client(int port) {
    int fd = dial(port, SOCK_STREAM, 0, -1);
    unsigned char *b = malloc(200000);
    fill(b, 100, 1);
    fill(b + 4096, 100000, 2);
    send1(fd, b, 100, EXS_MHANDLE_UNREGISTERED, 1);
    send1(fd, b + 4096, 100000, EXS_MHANDLE_UNREGISTERED, 2);
    for (int i = 0; i < 2; i++) CHECK(next(EXS_EVT_SEND).exs_evt_errno == 0, "send");
    fill(b, 500, 3);
    for (int i = 0; i < 50; i++) send1(fd, b + 10 * i, 10, EXS_MHANDLE_UNREGISTERED, 10 + i);
    for (int i = 0; i < 50; i++) CHECK(next(EXS_EVT_SEND).exs_evt_errno == 0, "small send");
    exs_event_t ev;
    struct timespec t = {10, 0};
    /* wait for the server to finish (its close ends our connection) */
    char c;
    CHECK(exs_recv(fd, &c, 1, 0, q, AH(3), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_qdequeue(q, &ev, 1, &t) == 1 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0,
          "end of stream");
    CHECK(exs_close(fd) == 0, "close");
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

#define WINDOW 256

static void blast_recv(int fd, long n, size_t len, unsigned char *b, exs_mhandle_t mh) {
    long posted = 0, done = 0;
    exs_event_t evs[WINDOW];
    struct timespec t = {10, 0};
    while (done < n) {
        while (posted < n && posted - done < WINDOW) {
            unsigned char *p = b + (size_t)(posted % WINDOW) * len;
            CHECK(exs_recv(fd, p, len, 0, q, AH(posted), mh) == 0, "recv %ld", posted);
            posted++;
        }
        int k = exs_qdequeue(q, evs, WINDOW, &t);
        CHECK(k > 0, "blast receive stalled at %ld", done);
        for (int i = 0; i < k; i++) {
            long id = (long)(uintptr_t)evs[i].exs_evt_ahandle;
            CHECK(evs[i].exs_evt_errno == 0 && id == done, "receive %ld errno %d (expected %ld)",
                  id, evs[i].exs_evt_errno, done);
            CHECK(evs[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)len, "length");
            long v;
            memcpy(&v, b + (size_t)(id % WINDOW) * len, sizeof v);
            CHECK(v == id, "message %ld carries %ld", id, v);
            done++;
        }
    }
}

static void blast_send(int fd, long n, size_t len, unsigned char *b, exs_mhandle_t mh) {
    long posted = 0, done = 0;
    exs_event_t evs[WINDOW];
    struct timespec t = {10, 0};
    while (done < n) {
        while (posted < n && posted - done < WINDOW) {
            unsigned char *p = b + (size_t)(posted % WINDOW) * len;
            memcpy(p, &posted, sizeof posted);
            CHECK(exs_send(fd, p, len, 0, q, AH(posted), mh) == 0, "send %ld", posted);
            posted++;
        }
        int k = exs_qdequeue(q, evs, WINDOW, &t);
        CHECK(k > 0, "blast send stalled at %ld", done);
        for (int i = 0; i < k; i++) {
            CHECK(evs[i].exs_evt_errno == 0, "send errno %d", evs[i].exs_evt_errno);
            CHECK((long)(uintptr_t)evs[i].exs_evt_ahandle == done, "send order");
            done++;
        }
    }
}

static int credits_server(int wfd, long n) {
    int fd = serve(wfd, SOCK_SEQPACKET, 16);
    CHECK(exs_fcntl(fd, EXS_F_GETCREDITS) == 4, "negotiated credits (server)");
    unsigned char *b = malloc(WINDOW * 1000);
    exs_mhandle_t mh = exs_mregister(b, WINDOW * 1000, 0);
    blast_recv(fd, n, 8, b, mh);
    blast_recv(fd, 2000, 1000, b, mh);
    CHECK(write(wfd, "d", 1) == 1, "done");
    /* wait for the client's close */
    CHECK(exs_recv(fd, b, 8, 0, q, AH(-1), mh) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0, "end");
    exs_close(fd);
    printf("server: ok\n");
    return 0;
}

static int credits_client(int port, int rfd, long n) {
    int fd = dial(port, SOCK_SEQPACKET, 4, -1);
    CHECK(exs_fcntl(fd, EXS_F_GETCREDITS) == 4, "negotiated credits (client)");
    unsigned char *b = malloc(WINDOW * 1000);
    exs_mhandle_t mh = exs_mregister(b, WINDOW * 1000, 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    blast_send(fd, n, 8, b, mh);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    blast_send(fd, 2000, 1000, b, mh);
    char c;
    CHECK(read(rfd, &c, 1) == 1, "server done");
    CHECK(exs_close(fd) == 0, "close");
    printf("blast: %ld messages in %.2f s (%.0f/s)\n", n, s, (double)n / s);
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

static int errors_server(int wfd) {
    int fd = serve(wfd, SOCK_SEQPACKET, 0);
    char c;
    /* stay until the client closes */
    CHECK(exs_recv(fd, &c, 1, 0, q, AH(1), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0, "end");
    exs_close(fd);
    printf("server: ok\n");
    return 0;
}

/* Bad arguments of exs_sendmsg/exs_recvmsg, exs_sendfile, exs_shutdown,
 * exs_poll and exs_cancel on a connected RDMA-model descriptor. b has
 * 1024 registered octets (mh). */
static void bad_arguments(int fd, char *b, exs_mhandle_t mh) {
    exs_msghdr_t m;
    exs_iovec_t iv[2] = {{b, 10, mh}, {NULL, 10, EXS_MHANDLE_UNREGISTERED}};
    memset(&m, 0, sizeof m);
    FAILS(exs_sendmsg(fd, NULL, 0, q, AH(0)), EFAULT);
    FAILS(exs_recvmsg(fd, NULL, 0, q, AH(0)), EFAULT);
    m.msg_iovlen = -1;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EINVAL);
    m.msg_iovlen = 2;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EFAULT); /* msg_iov NULL */
    m.msg_iov = iv;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EFAULT); /* iovec 1 NULL */
    FAILS(exs_recvmsg(fd, &m, 0, q, AH(0)), EFAULT);
    iv[1].iov_base = b + 2000; /* outside the registration */
    iv[1].iov_mhandle = mh;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EINVAL);
    iv[1].iov_mhandle = 12345;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EINVAL);
    m.msg_iovlen = 1;
    iv[0].iov_mhandle = 12345;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EINVAL);
    iv[0].iov_mhandle = mh;
    FAILS(exs_sendmsg(fd, &m, MSG_OOB, q, AH(0)), EINVAL);
    FAILS(exs_sendmsg(fd, &m, EXS_PERSISTENT, q, AH(0)), EOPNOTSUPP);
    FAILS(exs_recvmsg(fd, &m, MSG_PEEK, q, AH(0)), EINVAL);
    FAILS(exs_sendmsg(fd, &m, 0, 9999, AH(0)), EINVAL);
    FAILS(exs_shutdown(fd, 7, q, AH(0)), EINVAL);
    FAILS(exs_shutdown(fd, SHUT_WR, 9999, AH(0)), EINVAL);
    exs_xferfile_t xf[2];
    memset(xf, 0, sizeof xf);
    xf[0].xf_type = EXS_IOVEC;
    xf[0].xf_u.xf_iov.iov_base = b;
    xf[0].xf_u.xf_iov.iov_len = 10;
    xf[0].xf_u.xf_iov.iov_mhandle = mh;
    FAILS(exs_sendfile(fd, NULL, 1, 0, q, AH(0)), EFAULT);
    FAILS(exs_sendfile(fd, xf, 0, 0, q, AH(0)), EINVAL);
    FAILS(exs_sendfile(fd, xf, 1, 1, q, AH(0)), EINVAL);
    xf[1].xf_type = 99;
    FAILS(exs_sendfile(fd, xf, 2, 0, q, AH(0)), EINVAL);
    xf[1].xf_type = EXS_FDVEC;
    xf[1].xf_u.xf_fdv.fdv_fd = -1;
    xf[1].xf_u.xf_fdv.fdv_len = 10;
    FAILS(exs_sendfile(fd, xf, 2, 0, q, AH(0)), EBADF);
    xf[1].xf_u.xf_fdv.fdv_fd = fd; /* open; the offset is checked first */
    xf[1].xf_u.xf_fdv.fdv_offset = -1;
    FAILS(exs_sendfile(fd, xf, 2, 0, q, AH(0)), EINVAL);
    xf[0].xf_u.xf_iov.iov_mhandle = 12345;
    FAILS(exs_sendfile(fd, xf, 1, 0, q, AH(0)), EINVAL);
    exs_pollfd_t pf = {fd, EXS_POLLIN, 0};
    FAILS(exs_poll(NULL, 1, q, AH(0)), EFAULT);
    FAILS(exs_poll(&pf, 0, q, AH(0)), EINVAL);
    FAILS(exs_poll(&pf, 1, 9999, AH(0)), EINVAL);
    pf.events = EXS_POLLHUP;
    FAILS(exs_poll(&pf, 1, q, AH(0)), EINVAL);
    FAILS(exs_cancel(fd, AH(0), 0), EINVAL);
    FAILS(exs_cancel(fd, AH(0), 4), EINVAL);
}

static int errors_client(int port) {
    CHECK(exs_init(EXS_VERSION) == 0, "init");
    q = exs_qcreate(64);
    FAILS(exs_socket(AF_UNIX, SOCK_SEQPACKET, 0), EAFNOSUPPORT);
    FAILS(exs_socket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), EPROTONOSUPPORT);
    FAILS(exs_socket(AF_INET, SOCK_RAW, 0), ESOCKTNOSUPPORT);
    FAILS(exs_socket(AF_INET, SOCK_SEQPACKET, 6), EPROTONOSUPPORT);
    int fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    CHECK(fd >= 0, "socket");
    char b[4096];
    exs_mhandle_t mh = exs_mregister(b, 1024, 0);
    FAILS(exs_send(fd, b, 10, 0, q, AH(0), mh), ENOTCONN);
    FAILS(exs_fcntl(fd, EXS_F_SETCREDITS, 0), EINVAL);
    FAILS(exs_fcntl(fd, EXS_F_SETCREDITS, 1025), EINVAL);
    FAILS(exs_fcntl(fd, EXS_F_SETSMALL, 233), EINVAL);
    FAILS(exs_fcntl(fd, 12345), EINVAL);
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    FAILS(exs_getpeername(fd, (struct sockaddr *)&a, &al), ENOTCONN);
    FAILS(exs_getsockname(fd, (struct sockaddr *)&a, NULL), EFAULT);
    struct sockaddr_in6 a6;
    memset(&a6, 0, sizeof a6);
    a6.sin6_family = AF_INET6;
    FAILS(exs_connect(fd, (struct sockaddr *)&a6, sizeof a6, q, AH(0)), EAFNOSUPPORT);
    FAILS(exs_connect(fd, NULL, sizeof a, q, AH(0)), EFAULT);
    a = lo(port);
    FAILS(exs_connect(fd, (struct sockaddr *)&a, 3, q, AH(0)), EINVAL);
    FAILS(exs_connect(fd, (struct sockaddr *)&a, sizeof a, 9999, AH(0)), EINVAL);
    /* nothing listens on the port the server's listener had before:
     * ECONNREFUSED arrives as the event */
    int other = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    int lp = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    struct sockaddr_in z = lo(0);
    CHECK(exs_bind(lp, (struct sockaddr *)&z, sizeof z) == 0 && exs_listen(lp, 1) == 0, "listen");
    al = sizeof z;
    CHECK(exs_getsockname(lp, (struct sockaddr *)&z, &al) == 0, "name");
    FAILS(exs_bind(lp, (struct sockaddr *)&z, sizeof z), EINVAL);
    FAILS(exs_connect(lp, (struct sockaddr *)&a, sizeof a, q, AH(0)), EINVAL);
    CHECK(exs_close(lp) == 0, "close listener");
    CHECK(exs_connect(other, (struct sockaddr *)&z, sizeof z, q, AH(7)) == 0, "connect");
    exs_event_t ev = next(EXS_EVT_CONNECT);
    CHECK(ev.exs_evt_errno == ECONNREFUSED && ev.exs_evt_ahandle == AH(7), "refused: %d",
          ev.exs_evt_errno);
    exs_close(other);

    CHECK(exs_connect(fd, (struct sockaddr *)&a, sizeof a, q, AH(1)) == 0, "connect");
    FAILS(exs_connect(fd, (struct sockaddr *)&a, sizeof a, q, AH(1)), EALREADY);
    ev = next(EXS_EVT_CONNECT);
    CHECK(ev.exs_evt_errno == 0, "connect");
    FAILS(exs_connect(fd, (struct sockaddr *)&a, sizeof a, q, AH(1)), EISCONN);
    FAILS(exs_listen(fd, 1), EISCONN);
    FAILS(exs_fcntl(fd, EXS_F_SETSMALL, 10), EISCONN);
    /* a buffer outside its registration, bad handles, flags */
    FAILS(exs_send(fd, b + 1000, 100, 0, q, AH(0), mh), EINVAL);
    FAILS(exs_recv(fd, b + 2000, 1, 0, q, AH(0), mh), EINVAL);
    FAILS(exs_send(fd, b, 10, 0, q, AH(0), 12345), EINVAL);
    FAILS(exs_send(fd, b, 10, 0, q, AH(0), EXS_MHANDLE_INVALID), EINVAL);
    FAILS(exs_send(fd, NULL, 10, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), EFAULT);
    FAILS(exs_send(fd, (void *)16, 10, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), EFAULT);
    FAILS(exs_send(fd, b, 10, MSG_OOB, q, AH(0), mh), EINVAL);
    FAILS(exs_recv(fd, b, 10, MSG_PEEK, q, AH(0), mh), EINVAL);
    FAILS(exs_send(fd, b, 0, EXS_PERSISTENT, q, AH(0), mh), EINVAL);
    FAILS(exs_recv(fd, b, 0, EXS_PERSISTENT_NOTIFY, q, AH(0), mh), EINVAL);
    FAILS(exs_send(fd, b, 10, 0, 9999, AH(0), mh), EINVAL);
    /* the peer has no persistent block */
    FAILS(exs_send_offset(fd, b, 10, 0, 0, q, AH(0), mh), EINVAL);
    FAILS(exs_recv_offset(fd, b, 10, 0, 0, q, AH(0), mh), EINVAL);
    FAILS(exs_recv_offset(fd, b, 10, EXS_PERSISTENT, 0, q, AH(0), mh), EINVAL);
    bad_arguments(fd, b, mh);
    /* a full queue: EAGAIN */
    exs_qhandle_t small = exs_qcreate(1);
    CHECK(exs_recv(fd, b, 10, 0, small, AH(0), mh) == 0, "recv");
    FAILS(exs_recv(fd, b, 10, 0, small, AH(0), mh), EAGAIN);
    /* exs_close cancels what is outstanding */
    CHECK(exs_close(fd) == 0, "close");
    struct timespec t = {10, 0};
    CHECK(exs_qdequeue(small, &ev, 1, &t) == 1 && ev.exs_evt_errno == ECANCELED, "cancelled");
    FAILS(exs_close(fd), EBADF);
    FAILS(exs_send(fd, b, 10, 0, q, AH(0), mh), EBADF);
    /* calls on a descriptor that is not connected */
    fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    exs_msghdr_t m;
    exs_iovec_t iv[2] = {{b, 10, mh}, {b + 10, 10, mh}};
    memset(&m, 0, sizeof m);
    m.msg_iov = iv;
    m.msg_iovlen = 2;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), ENOTCONN);
    FAILS(exs_recvmsg(fd, &m, 0, q, AH(0)), ENOTCONN);
    FAILS(exs_shutdown(fd, SHUT_WR, q, AH(0)), ENOTCONN);
    CHECK(exs_cancel(fd, AH(0), EXS_CAF_FILDES) == 0, "nothing to cancel");
    CHECK(exs_close(fd) == 0, "close");
    FAILS(exs_shutdown(fd, SHUT_WR, q, AH(0)), EBADF);
    FAILS(exs_cancel(fd, AH(0), EXS_CAF_FILDES), EBADF);
    CHECK(exs_mderegister(mh) == 0, "mderegister");
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

static int kill_server(int wfd) {
    int fd = serve(wfd, SOCK_SEQPACKET, 0);
    unsigned char *b = malloc(BIG);
    exs_mhandle_t mh = exs_mregister(b, BIG, 0);
    CHECK(exs_recv(fd, b, BIG, 0, q, AH(1), mh) == 0, "recv");
    CHECK(next(EXS_EVT_RECV).exs_evt_errno == 0, "first message");
    CHECK(write(wfd, "r", 1) == 1, "tell");
    for (;;) pause(); /* killed here, with the client's sends outstanding */
}

static int kill_client(int port, int rfd, pid_t server) {
    int fd = dial(port, SOCK_SEQPACKET, 0, -1);
    unsigned char *b = malloc(9 * BIG);
    exs_mhandle_t mh = exs_mregister(b, 9 * BIG, 0);
    for (int i = 0; i < 8; i++) send1(fd, b + i * BIG, BIG, mh, i);
    for (int i = 0; i < 4; i++)
        CHECK(exs_recv(fd, b + 8 * BIG + i * 1000, 1000, 0, q, AH(100 + i), mh) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(0), "first send");
    char c;
    CHECK(read(rfd, &c, 1) == 1, "server got one");
    CHECK(kill(server, SIGKILL) == 0, "kill");
    int sends = 0, recvs = 0;
    for (int i = 0; i < 11; i++) {
        struct timespec t = {10, 0};
        CHECK(exs_qdequeue(q, &ev, 1, &t) == 1, "outstanding operation %d never completed", i);
        CHECK(ev.exs_evt_errno == ECONNRESET, "errno %d, expected ECONNRESET", ev.exs_evt_errno);
        if (ev.exs_evt_type == EXS_EVT_SEND) sends++;
        if (ev.exs_evt_type == EXS_EVT_RECV) recvs++;
    }
    CHECK(sends == 7 && recvs == 4, "every operation: %d sends %d receives", sends, recvs);
    /* exs_poll: the broken connection is hung up, with an error */
    exs_pollfd_t po = {fd, EXS_POLLOUT, 0};
    CHECK(exs_poll(&po, 1, q, AH(50)) == 0, "poll");
    ev = next(EXS_EVT_POLL);
    CHECK(ev.exs_evt_union.exs_evt_poll.exs_evt_nready == 1 &&
              po.revents == (EXS_POLLHUP | EXS_POLLERR),
          "poll after the reset: revents %x", po.revents);
    FAILS(exs_send(fd, b, 10, 0, q, AH(0), mh), ECONNRESET);
    CHECK(exs_close(fd) == 0, "close");
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

/* Waits up to 10 s for n octets at p to read as fill(seed). */
static void await_same(const unsigned char *p, size_t n, unsigned seed, const char *what) {
    for (int i = 0; i < 10000 && !same(p, n, seed); i++) usleep(1000);
    CHECK(same(p, n, seed), "%s never arrived", what);
}

/* exs_send_offset until the peer's persistent receive block is known
 * (EINVAL before its advertisement arrived). */
static void send_offset_retry(int fd, void *buf, size_t len, uint64_t off, exs_mhandle_t mh,
                              int tag) {
    for (int i = 0; i < 10000; i++) {
        if (exs_send_offset(fd, buf, len, 0, off, q, AH(tag), mh) == 0) return;
        CHECK(errno == EINVAL, "send_offset");
        usleep(1000);
    }
    CHECK(0, "the peer's persistent receive block never became known");
}

static void persistent_event(exs_event_t ev, exs_ahandle_t ah, void *buf, long n) {
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == ah, "event errno %d", ev.exs_evt_errno);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_buf == buf &&
              ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == n &&
              (ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & EXS_PERSISTENT),
          "persistent event: buf %p (want %p), %ld octets (want %ld)",
          ev.exs_evt_union.exs_evt_xfer.exs_evt_buf, buf,
          (long)ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes, n);
}

static void await_eof(int fd) {
    char c;
    CHECK(exs_recv(fd, &c, 1, 0, q, AH(99), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0, "end of stream");
}

/* Connection 1: the server sends a 4096-octet block persistently (no
 * notes) and receives persistently with notes; connection 2 the other
 * way round. The client pulls, pulls at offsets, and writes. */
static int persistent_server(int wfd) {
    unsigned char *pb = malloc(4096), *rb = calloc(1, 4096);
    fill(pb, 4096, 7);
    exs_mhandle_t pm = exs_mregister(pb, 4096, 0);
    int fd = serve(wfd, SOCK_SEQPACKET, 0);
    CHECK(exs_send(fd, pb, 4096, EXS_PERSISTENT, q, AH(10), pm) == 0, "persistent send");
    exs_event_t ev = next(EXS_EVT_SEND);
    persistent_event(ev, AH(10), pb, 4096);
    FAILS(exs_send(fd, pb, 10, EXS_PERSISTENT, q, AH(0), pm), EINVAL);
    FAILS(exs_send(fd, pb, 10, 0, q, AH(0), pm), EINVAL);
    CHECK(exs_recv(fd, rb, 4096, EXS_PERSISTENT_NOTIFY, q, AH(11), EXS_MHANDLE_UNREGISTERED) == 0,
          "persistent recv");
    ev = next(EXS_EVT_RECV);
    persistent_event(ev, AH(11), rb, 0);
    FAILS(exs_recv(fd, rb, 10, EXS_PERSISTENT, q, AH(0), EXS_MHANDLE_UNREGISTERED), EINVAL);
    /* the client writes 200 octets at 1000, 100 at 0, 96 at 4000: one
     * event each, in order, with the data in place */
    ev = next(EXS_EVT_RECV);
    persistent_event(ev, AH(11), rb + 1000, 200);
    CHECK(same(rb + 1000, 200, 2), "write at 1000");
    ev = next(EXS_EVT_RECV);
    persistent_event(ev, AH(11), rb, 100);
    CHECK(same(rb, 100, 1), "write at 0");
    ev = next(EXS_EVT_RECV);
    persistent_event(ev, AH(11), rb + 4000, 96);
    CHECK(same(rb + 4000, 96, 3), "write at 4000");
    /* nothing outside the writes changed */
    for (size_t i = 100; i < 1000; i++) CHECK(rb[i] == 0, "octet %zu", i);
    await_eof(fd);
    exs_close(fd);

    unsigned char *pb2 = malloc(1000), *rb2 = calloc(1, 1000);
    fill(pb2, 1000, 9);
    fd = serve(wfd, SOCK_STREAM, 0);
    /* the receive block first: the notes of the client's reads cannot
     * come before its event */
    CHECK(exs_recv(fd, rb2, 1000, EXS_PERSISTENT, q, AH(21), EXS_MHANDLE_UNREGISTERED) == 0,
          "persistent recv");
    ev = next(EXS_EVT_RECV);
    persistent_event(ev, AH(21), rb2, 0);
    CHECK(exs_send(fd, pb2, 1000, EXS_PERSISTENT_NOTIFY, q, AH(20), EXS_MHANDLE_UNREGISTERED) == 0,
          "persistent send with notes");
    ev = next(EXS_EVT_SEND);
    persistent_event(ev, AH(20), pb2, 1000);
    /* the client reads the block twice whole and 10 octets at 990 */
    ev = next(EXS_EVT_SEND);
    persistent_event(ev, AH(20), pb2, 1000);
    ev = next(EXS_EVT_SEND);
    persistent_event(ev, AH(20), pb2, 1000);
    ev = next(EXS_EVT_SEND);
    persistent_event(ev, AH(20), pb2 + 990, 10);
    /* a write without notes: it just lands */
    await_same(rb2 + 100, 500, 4, "write at 100");
    await_eof(fd);
    exs_close(fd);
    printf("server: ok\n");
    return 0;
}

static int persistent_client(int rfd) {
    unsigned char *b = calloc(1, 8192);
    exs_mhandle_t mh = exs_mregister(b, 8192, 0);
    int port;
    CHECK(read(rfd, &port, sizeof port) == sizeof port, "port");
    int fd = dial(port, SOCK_SEQPACKET, 0, -1);
    /* a receive waits for the block, then pulls it whole */
    memset(b, 0, 8192);
    CHECK(exs_recv(fd, b, 4096, 0, q, AH(1), mh) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 4096 &&
              same(b, 4096, 7),
          "pulled block");
    /* again (not consumed); shorter: first octets, MSG_TRUNC */
    memset(b, 0, 8192);
    CHECK(exs_recv(fd, b, 10, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 10 &&
              (ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & MSG_TRUNC) && same(b, 10, 7) &&
              b[10] == 0,
          "short pull");
    /* at an offset */
    CHECK(exs_recv_offset(fd, b + 5000, 100, 0, 3000, q, AH(3), mh) == 0, "recv_offset");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 100, "offset pull");
    {
        unsigned char want[4096];
        fill(want, 4096, 7);
        CHECK(memcmp(b + 5000, want + 3000, 100) == 0, "offset pull data");
    }
    CHECK(exs_recv_offset(fd, b, 96, 0, 4000, q, AH(4), mh) == 0, "recv_offset to the end");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == 0, "to the end");
    FAILS(exs_recv_offset(fd, b, 97, 0, 4000, q, AH(0), mh), EINVAL);
    FAILS(exs_recv_offset(fd, b, 1, 0, 4096, q, AH(0), mh), EINVAL);
    FAILS(exs_recv_offset(fd, b, 2, 0, UINT64_MAX, q, AH(0), mh), EINVAL);
    /* writes into the server's persistent receive block */
    fill(b, 200, 2);
    send_offset_retry(fd, b, 200, 1000, mh, 5);
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 200, "write");
    fill(b + 1000, 100, 1);
    send1(fd, b + 1000, 100, mh, 6);
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 100, "write");
    fill(b + 2000, 96, 3);
    CHECK(exs_send_offset(fd, b + 2000, 96, 0, 4000, q, AH(7), mh) == 0, "send_offset");
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == 0, "write at 4000");
    FAILS(exs_send_offset(fd, b, 97, 0, 4000, q, AH(0), mh), EINVAL);
    FAILS(exs_send_offset(fd, b, 1, 0, UINT64_MAX, q, AH(0), mh), EINVAL);
    /* a send longer than the block: EMSGSIZE as the event */
    send1(fd, b, 5000, mh, 8);
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == EMSGSIZE, "too long: %d", ev.exs_evt_errno);
    exs_close(fd);

    CHECK(read(rfd, &port, sizeof port) == sizeof port, "port");
    fd = dial(port, SOCK_STREAM, 0, -1);
    for (int i = 0; i < 2; i++) {
        memset(b, 0, 1000);
        CHECK(exs_recv(fd, b, 1000, 0, q, AH(1), mh) == 0, "recv");
        ev = next(EXS_EVT_RECV);
        CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 1000 && same(b, 1000, 9), "pull %d",
              i);
    }
    CHECK(exs_recv_offset(fd, b, 10, 0, 990, q, AH(2), mh) == 0, "recv_offset");
    ev = next(EXS_EVT_RECV);
    {
        unsigned char want[1000];
        fill(want, 1000, 9);
        CHECK(ev.exs_evt_errno == 0 && memcmp(b, want + 990, 10) == 0, "offset pull");
    }
    fill(b, 500, 4);
    send_offset_retry(fd, b, 500, 100, mh, 3);
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == 0, "write");
    exs_close(fd);
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

/* Two connections, one thread each per side, each thread with its own
 * queue: one sleeps (EXS_WAIT_NOTIFY), the other busy-polls
 * (EXS_WAIT_BUSY_POLL). Ping-pongs alternate pulled (4096 octets) and
 * immediate (100) messages, every one checked: whichever thread drives
 * the connections, each event reaches its own queue and nothing stalls. */
struct pp {
    int fd, client, wait;
    long n;
};

static exs_event_t pp_next(exs_qhandle_t qq, int type) {
    exs_event_t ev;
    struct timespec t = {10, 0};
    CHECK(exs_qdequeue(qq, &ev, 1, &t) == 1, "thread: no event in 10 s (type %d)", type);
    CHECK(ev.exs_evt_type == type && ev.exs_evt_errno == 0, "thread: event %d errno %d",
          ev.exs_evt_type, ev.exs_evt_errno);
    return ev;
}

static void *pp_thread(void *arg) {
    struct pp *p = arg;
    exs_qhandle_t qq = exs_qcreate(8);
    CHECK(qq != EXS_QHANDLE_INVALID, "qcreate");
    CHECK(exs_qsetattr(qq, EXS_QATTR_WAIT, &p->wait) == 0, "wait mode");
    unsigned char *b = calloc(1, 8192);
    exs_mhandle_t mh = exs_mregister(b, 8192, 0);
    unsigned base = (unsigned)p->wait * 7919u;
    for (long i = 0; i < p->n; i++) {
        size_t len = (i & 1) ? 100 : 4096;
        CHECK(exs_recv(p->fd, b + 4096, 4096, 0, qq, AH(1), mh) == 0, "recv");
        if (p->client) {
            fill(b, len, base + (unsigned)i);
            CHECK(exs_send(p->fd, b, len, 0, qq, AH(2), mh) == 0, "send");
            exs_event_t ev[2];
            int got = 0;
            while (got < 2) {
                struct timespec t = {10, 0};
                int k = exs_qdequeue(qq, ev + got, 2 - got, &t);
                CHECK(k > 0, "thread ping-pong stalled at %ld", i);
                got += k;
            }
            for (int j = 0; j < 2; j++) {
                CHECK(ev[j].exs_evt_errno == 0, "event errno");
                if (ev[j].exs_evt_type == EXS_EVT_RECV)
                    CHECK(ev[j].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (long)len,
                          "reply %ld: %ld octets", i,
                          (long)ev[j].exs_evt_union.exs_evt_xfer.exs_evt_nbytes);
            }
            CHECK(same(b + 4096, len, base + (unsigned)i + 1), "reply %ld", i);
        } else {
            exs_event_t ev = pp_next(qq, EXS_EVT_RECV);
            CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (long)len &&
                      same(b + 4096, len, base + (unsigned)i),
                  "message %ld", i);
            fill(b, len, base + (unsigned)i + 1);
            CHECK(exs_send(p->fd, b, len, 0, qq, AH(2), mh) == 0, "send");
            pp_next(qq, EXS_EVT_SEND);
        }
    }
    return NULL;
}

static void pp_pair(int fd0, int fd1, int client, long n) {
    struct pp a = {fd0, client, EXS_WAIT_NOTIFY, n}, c = {fd1, client, EXS_WAIT_BUSY_POLL, n};
    pthread_t t0, t1;
    CHECK(pthread_create(&t0, NULL, pp_thread, &a) == 0 &&
              pthread_create(&t1, NULL, pp_thread, &c) == 0,
          "threads");
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
}

static int threads_server(int wfd, long n) {
    CHECK(exs_init(EXS_VERSION) == 0, "init");
    q = exs_qcreate(16);
    int l = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    struct sockaddr_in a = lo(0);
    CHECK(exs_bind(l, (struct sockaddr *)&a, sizeof a) == 0 && exs_listen(l, 4) == 0, "listen");
    socklen_t al = sizeof a;
    CHECK(exs_getsockname(l, (struct sockaddr *)&a, &al) == 0, "name");
    int port = ntohs(a.sin_port);
    CHECK(write(wfd, &port, sizeof port) == sizeof port, "tell port");
    int fds[2];
    for (int i = 0; i < 2; i++) {
        CHECK(exs_accept(l, NULL, 0, q, AH(i)) == 0, "accept");
        fds[i] = next(EXS_EVT_ACCEPT).exs_evt_union.exs_evt_accept.exs_evt_newfd;
    }
    /* the client's first thread talks on its first connection */
    pp_pair(fds[0], fds[1], 0, n);
    exs_close(fds[0]);
    exs_close(fds[1]);
    exs_close(l);
    printf("server: ok\n");
    return 0;
}

static int threads_client(int port, long n) {
    int fd0 = dial(port, SOCK_SEQPACKET, 0, -1);
    int fd1 = dial(port, SOCK_SEQPACKET, 0, -1);
    pp_pair(fd0, fd1, 1, n);
    exs_close(fd0);
    exs_close(fd1);
    printf("threads: %ld ping-pongs on each of 2 connections\n", n);
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static const size_t lat_sizes[] = {1, 10, 100};

static double cpu_us(const struct rusage *r) {
    return (double)(r->ru_utime.tv_sec + r->ru_stime.tv_sec) * 1e6 +
           (double)(r->ru_utime.tv_usec + r->ru_stime.tv_usec);
}

/* A send's and a receive's events, in either order (an immediate send
 * completes when its message left, which the reply may overtake). */
static void both(void) {
    exs_event_t ev[2];
    int got = 0;
    while (got < 2) {
        struct timespec t = {10, 0};
        int n = exs_qdequeue(q, ev + got, 2 - got, &t);
        CHECK(n > 0, "ping-pong stalled");
        got += n;
    }
    CHECK(ev[0].exs_evt_type != ev[1].exs_evt_type && ev[0].exs_evt_errno == 0 &&
              ev[1].exs_evt_errno == 0,
          "ping-pong events");
}

static void pingpong(int fd, int client, long n, unsigned char *b, exs_mhandle_t mh,
                     const char *what) {
    for (unsigned s = 0; s < 3; s++) {
        size_t len = lat_sizes[s];
        double t0 = 0;
        for (long i = -100; i < n; i++) {
            if (i == 0) t0 = now_us();
            CHECK(exs_recv(fd, b + 4096, len, 0, q, AH(1), mh) == 0, "recv");
            if (client) {
                send1(fd, b, len, mh, 2);
                both();
            } else {
                next(EXS_EVT_RECV);
                send1(fd, b, len, mh, 2);
                next(EXS_EVT_SEND);
            }
        }
        if (client)
            printf("latency %s %zu B: %.2f us one-way\n", what, len, (now_us() - t0) / (double)n / 2);
    }
}

static int latency_server(int wfd, long n) {
    unsigned char *b = malloc(8192);
    int fd = serve(wfd, SOCK_SEQPACKET, 0);
    exs_mhandle_t mh = exs_mregister(b, 8192, 0);
    pingpong(fd, 0, n, b, mh, "normal");
    exs_close(fd);
    fd = serve(wfd, SOCK_SEQPACKET, 0);
    pingpong(fd, 0, n, b, mh, "immediate");
    exs_close(fd);
    /* persistent: one send of a 100-octet block, then passive until the
     * client closes */
    fd = serve(wfd, SOCK_SEQPACKET, 0);
    fill(b, 100, 5);
    CHECK(exs_send(fd, b, 100, EXS_PERSISTENT, q, AH(3), mh) == 0, "persistent send");
    next(EXS_EVT_SEND);
    struct rusage p0, t0, p1, t1;
    getrusage(RUSAGE_SELF, &p0);
    getrusage(RUSAGE_THREAD, &t0);
    await_eof(fd);
    getrusage(RUSAGE_SELF, &p1);
    getrusage(RUSAGE_THREAD, &t1);
    /* What serving the client's 3 (n + 100) reads cost this process: all
     * of it is the engine answering Read Requests (a software RNIC);
     * the application thread only waits. */
    double reads = 3.0 * (double)(n + 100);
    printf("persistent sender cpu: %.2f us per read (application thread %.3f)\n",
           (cpu_us(&p1) - cpu_us(&p0)) / reads, (cpu_us(&t1) - cpu_us(&t0)) / reads);
    exs_close(fd);
    return 0;
}

/* Each receive is one Read of the peer's persistent block: its round
 * trip, halved, is the one-way figure. */
static void pull_latency(int fd, long n, unsigned char *b, exs_mhandle_t mh) {
    for (unsigned s = 0; s < 3; s++) {
        size_t len = lat_sizes[s];
        double t0 = 0;
        for (long i = -100; i < n; i++) {
            if (i == 0) t0 = now_us();
            CHECK(exs_recv(fd, b + 4096, len, 0, q, AH(1), mh) == 0, "recv");
            exs_event_t ev = next(EXS_EVT_RECV);
            CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (long)len,
                  "pull");
        }
        CHECK(same(b + 4096, len, 5), "pulled data");
        printf("latency persistent %zu B: %.2f us one-way\n", len,
               (now_us() - t0) / (double)n / 2);
    }
}

static int latency_client(int rfd, long n) {
    unsigned char *b = malloc(8192);
    int port;
    CHECK(read(rfd, &port, sizeof port) == sizeof port, "port");
    int fd = dial(port, SOCK_SEQPACKET, 0, 0);
    exs_mhandle_t mh = exs_mregister(b, 8192, 0);
    pingpong(fd, 1, n, b, mh, "normal");
    exs_close(fd);
    CHECK(read(rfd, &port, sizeof port) == sizeof port, "port");
    fd = dial(port, SOCK_SEQPACKET, 0, -1);
    pingpong(fd, 1, n, b, mh, "immediate");
    exs_close(fd);
    CHECK(read(rfd, &port, sizeof port) == sizeof port, "port");
    fd = dial(port, SOCK_SEQPACKET, 0, -1);
    pull_latency(fd, n, b, mh);
    exs_close(fd);
    printf("client: ok\n");
    return 0;
}

/* ---------------------------------------------------------------- */

/* ---------------------------------------------------------------- */
/* exs_sendmsg/exs_recvmsg, exs_sendfile, exs_poll, exs_cancel,
 * exs_shutdown, exs_aclose. Credits 2, so that sends wait for credits. */

static int down_r = -1, down_w = -1; /* client -> server */
static unsigned char *reg_area;      /* BIG registered octets */
static exs_mhandle_t reg_mh;
static size_t reg_used;

static void *area(size_t n) {
    if (reg_used + n > BIG) reg_used = 0;
    void *p = reg_area + reg_used;
    reg_used += (n + 63) & ~(size_t)63;
    return p;
}

static void area_init(void) {
    reg_area = calloc(1, BIG);
    CHECK(reg_area != NULL, "calloc");
    reg_mh = exs_mregister(reg_area, BIG, 0);
    CHECK(reg_mh != EXS_MHANDLE_INVALID, "mregister");
}

static void sync_read(int fd, char want) {
    char c = 0;
    CHECK(read(fd, &c, 1) == 1 && c == want, "sync '%c' (got '%c')", want, c);
}

static void sync_write(int fd, char c) { CHECK(write(fd, &c, 1) == 1, "sync '%c'", c); }

static size_t sum(const size_t *sz, int n) {
    size_t t = 0;
    for (int i = 0; i < n; i++) t += sz[i];
    return t;
}

/* One exs_sendmsg of fill(total, seed) split into iovecs of sz[]:
 * even ones unregistered, odd ones registered; waits for its event. */
static void sendmsg_parts(int fd, unsigned seed, const size_t *sz, int n, int tag) {
    size_t total = sum(sz, n), at = 0;
    unsigned char *whole = malloc(total + 1);
    fill(whole, total, seed);
    exs_iovec_t *iv = calloc((size_t)n + 1, sizeof *iv);
    for (int i = 0; i < n; i++) {
        void *p = (i % 2) ? area(sz[i]) : malloc(sz[i] + 1);
        memcpy(p, whole + at, sz[i]);
        iv[i].iov_base = p;
        iv[i].iov_len = sz[i];
        iv[i].iov_mhandle = (i % 2) ? reg_mh : EXS_MHANDLE_UNREGISTERED;
        at += sz[i];
    }
    exs_msghdr_t *m = calloc(1, sizeof *m);
    m->msg_iov = iv;
    m->msg_iovlen = n;
    CHECK(exs_sendmsg(fd, m, 0, q, AH(tag)) == 0, "sendmsg %d", tag);
    exs_event_t ev = next(EXS_EVT_SENDMSG);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(tag) &&
              ev.exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes == (ssize_t)total &&
              ev.exs_evt_union.exs_evt_xfermsg.exs_evt_msg == m,
          "sendmsg %d event: errno %d, %zd octets", tag, ev.exs_evt_errno,
          ev.exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes);
}

/* One exs_recvmsg into iovecs of sz[] (even ones unregistered, odd ones
 * registered); the octets received are copied to out in order. Checks
 * the event, msg_flags against the event's MSG_TRUNC, and that nothing
 * past the received octets was written. Returns the octets; *trunc
 * whether MSG_TRUNC was reported. */
static ssize_t recvmsg_parts(int fd, const size_t *sz, int n, unsigned char *out, int *trunc,
                             int tag) {
    exs_iovec_t iv[8];
    exs_msghdr_t m;
    struct sockaddr_storage name;
    memset(&m, 0, sizeof m);
    m.msg_flags = -1;
    m.msg_name = &name; /* a connection has no name to give: length 0 */
    m.msg_namelen = sizeof name;
    for (int i = 0; i < n; i++) {
        unsigned char *p = (i % 2) ? area(sz[i]) : malloc(sz[i] + 1);
        memset(p, 0xee, sz[i]);
        iv[i].iov_base = p;
        iv[i].iov_len = sz[i];
        iv[i].iov_mhandle = (i % 2) ? reg_mh : EXS_MHANDLE_UNREGISTERED;
    }
    m.msg_iov = iv;
    m.msg_iovlen = n;
    CHECK(exs_recvmsg(fd, &m, 0, q, AH(tag)) == 0, "recvmsg %d", tag);
    exs_event_t ev = next(EXS_EVT_RECVMSG);
    ssize_t k = ev.exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes;
    int f = ev.exs_evt_union.exs_evt_xfermsg.exs_evt_flags & MSG_TRUNC;
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(tag) &&
              ev.exs_evt_union.exs_evt_xfermsg.exs_evt_msg == &m,
          "recvmsg %d event: errno %d", tag, ev.exs_evt_errno);
    CHECK(k >= 0 && (size_t)k <= sum(sz, n), "recvmsg %d: %zd octets", tag, k);
    CHECK((m.msg_flags & MSG_TRUNC) == f && m.msg_namelen == 0 && m.msg_controllen == 0,
          "msghdr written back: flags %x (event %x) namelen %u", m.msg_flags, f,
          (unsigned)m.msg_namelen);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        size_t c = sz[i] < (size_t)k - at ? sz[i] : (size_t)k - at;
        memcpy(out + at, iv[i].iov_base, c);
        for (size_t j = c; j < sz[i]; j++)
            CHECK(((unsigned char *)iv[i].iov_base)[j] == 0xee, "iovec %d written past %zu", i, c);
        at += c;
    }
    *trunc = f != 0;
    return k;
}

/* STREAM: exactly `total` octets by recvmsg into two iovecs (37 and 50
 * octets at most, never more than what remains), compared with want. */
static void stream_recvmsg(int fd, const unsigned char *want, size_t total) {
    unsigned char *got = malloc(total + 1);
    size_t at = 0;
    int calls = 0;
    while (at < total) {
        size_t rem = total - at;
        size_t sz[2] = {rem < 37 ? rem : 37, 0};
        sz[1] = rem - sz[0] < 50 ? rem - sz[0] : 50;
        int tr;
        ssize_t k = recvmsg_parts(fd, sz, 2, got + at, &tr, 30 + calls++);
        CHECK(k > 0 && !tr, "stream recvmsg: %zd octets", k);
        at += (size_t)k;
    }
    CHECK(at == total && memcmp(got, want, total) == 0, "stream bytes in order (%zu)", total);
    free(got);
}

/* exactly `total` octets by exs_recv (at most `chunk` each) into b */
static void recv_exact(int fd, unsigned char *b, exs_mhandle_t mh, size_t total, size_t chunk,
                       int seqpacket) {
    size_t at = 0;
    while (at < total) {
        size_t want = seqpacket ? BIG : (total - at < chunk ? total - at : chunk);
        CHECK(exs_recv(fd, b + at, want, 0, q, AH(40), mh) == 0, "recv");
        exs_event_t ev = next(EXS_EVT_RECV);
        ssize_t k = ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
        CHECK(ev.exs_evt_errno == 0 && k > 0, "recv: errno %d, %zd octets", ev.exs_evt_errno, k);
        CHECK(!seqpacket || (size_t)k == total, "one message of %zu octets, got %zd", total, k);
        at += (size_t)k;
    }
    CHECK(at == total, "%zu octets received, expected %zu", at, total);
}

static void expect_eof(int fd, int tag) {
    char c[4];
    CHECK(exs_recv(fd, c, 4, 0, q, AH(tag), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0,
          "end of stream: errno %d, %zd octets", ev.exs_evt_errno,
          ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes);
    exs_iovec_t iv[2] = {{c, 2, EXS_MHANDLE_UNREGISTERED}, {c + 2, 2, EXS_MHANDLE_UNREGISTERED}};
    exs_msghdr_t m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iv;
    m.msg_iovlen = 2;
    CHECK(exs_recvmsg(fd, &m, 0, q, AH(tag)) == 0, "recvmsg");
    ev = next(EXS_EVT_RECVMSG);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes == 0,
          "end of stream (recvmsg)");
}

static const size_t m1[] = {7, 3000, 50000};
static const size_t pa[] = {10, 20}, pb[] = {100}, pc[] = {150, 150}, pd[] = {1, 2, 2};
static const size_t pf_[] = {60, 60};
#define FILE_LEN 200000
#define FILE_OFF 1000
#define FILE_TAKE 150000
#define SF_TOTAL (100 + FILE_TAKE + 50)
#define LBIG 10000

static int calls_server(int wfd, int type) {
    int seqp = type == SOCK_SEQPACKET;
    int fd = serve(wfd, type, 2);
    CHECK(exs_fcntl(fd, EXS_F_GETCREDITS) == 2, "credits");
    area_init();
    unsigned char *b = malloc(BIG);
    exs_mhandle_t mh = exs_mregister(b, BIG, 0);
    exs_event_t ev;
    struct timespec brief = {0, 200000000};

    /* poll: a kernel pipe and the RDMA descriptor in one array; only the
     * pipe is ready */
    int pp[2];
    CHECK(pipe(pp) == 0, "pipe");
    exs_pollfd_t pf[2] = {{fd, EXS_POLLIN, 0}, {pp[0], EXS_POLLIN, 0}};
    CHECK(exs_poll(pf, 2, q, AH(1)) == 0, "poll");
    CHECK(exs_qdequeue(q, &ev, 1, &brief) == 0, "poll completed with nothing ready");
    CHECK(write(pp[1], "x", 1) == 1, "pipe");
    ev = next(EXS_EVT_POLL);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(1) &&
              ev.exs_evt_union.exs_evt_poll.exs_evt_nready == 1 &&
              ev.exs_evt_union.exs_evt_poll.exs_evt_fds == pf && pf[0].revents == 0 &&
              pf[1].revents == EXS_POLLIN,
          "mixed poll: nready %d revents %x %x", ev.exs_evt_union.exs_evt_poll.exs_evt_nready,
          pf[0].revents, pf[1].revents);
    /* the RDMA descriptor alone: readable once the peer's message is here */
    pf[0].revents = 0;
    CHECK(exs_poll(pf, 1, q, AH(2)) == 0, "poll");
    CHECK(exs_qdequeue(q, &ev, 1, &brief) == 0, "readable before the peer sent");
    sync_write(wfd, '1');
    ev = next(EXS_EVT_POLL);
    CHECK(ev.exs_evt_union.exs_evt_poll.exs_evt_nready == 1 && pf[0].revents == EXS_POLLIN,
          "readable: revents %x", pf[0].revents);
    exs_pollfd_t po = {fd, EXS_POLLIN | EXS_POLLOUT, 0};
    CHECK(exs_poll(&po, 1, q, AH(3)) == 0, "poll");
    ev = next(EXS_EVT_POLL);
    CHECK(po.revents == (EXS_POLLIN | EXS_POLLOUT), "readable and writable: %x", po.revents);

    /* recvmsg scatters one message over three iovecs */
    unsigned char *got = malloc(BIG);
    int tr;
    const size_t r1[] = {5, 1000, 70000};
    ssize_t k = recvmsg_parts(fd, r1, 3, got, &tr, 10);
    unsigned char *want = malloc(BIG);
    fill(want, sum(m1, 3), 20);
    CHECK(k == (ssize_t)sum(m1, 3) && !tr && memcmp(got, want, (size_t)k) == 0,
          "scattered message: %zd octets", k);

    /* four messages of 2, 1, 2 and 3 iovecs */
    const size_t r2[] = {64, 64}, r3[] = {50, 50};
    if (seqp) {
        k = recvmsg_parts(fd, r2, 2, got, &tr, 11);
        CHECK(k == 30 && !tr && same(got, 30, 21), "message A: %zd", k);
        k = recvmsg_parts(fd, r2, 2, got, &tr, 12);
        CHECK(k == 100 && !tr && same(got, 100, 22), "message B: %zd", k);
        k = recvmsg_parts(fd, r3, 2, got, &tr, 13);
        CHECK(k == 100 && tr && same(got, 100, 23), "message C truncated: %zd trunc %d", k, tr);
        k = recvmsg_parts(fd, r2, 2, got, &tr, 14);
        CHECK(k == 5 && !tr && same(got, 5, 24), "message D after the truncated one: %zd", k);
    } else {
        fill(want, 30, 21);
        fill(want + 30, 100, 22);
        fill(want + 130, 300, 23);
        fill(want + 430, 5, 24);
        stream_recvmsg(fd, want, 435);
    }

    /* sendfile: 100 octets of memory, a file range, 50 registered octets */
    memset(b, 0, SF_TOTAL + 1);
    recv_exact(fd, b, mh, SF_TOTAL, 40000, seqp);
    unsigned char *file = malloc(FILE_LEN);
    fill(file, FILE_LEN, 31);
    CHECK(same(b, 100, 30) && memcmp(b + 100, file + FILE_OFF, FILE_TAKE) == 0 &&
              same(b + 100 + FILE_TAKE, 50, 32),
          "sendfile content");

    /* cancel: receives not matched with a message */
    for (int i = 0; i < 3; i++)
        CHECK(exs_recv(fd, b + i * 100, 100, 0, q, AH(500 + i), mh) == 0, "recv");
    CHECK(exs_cancel(fd, AH(501), EXS_CAF_FILDES | EXS_CAF_AHANDLE) == 1, "cancel one");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == ECANCELED && ev.exs_evt_ahandle == AH(501), "cancelled 501");
    CHECK(exs_cancel(fd, AH(0), EXS_CAF_FILDES) == 2, "cancel the others");
    for (int i = 0; i < 3; i += 2) {
        ev = next(EXS_EVT_RECV);
        CHECK(ev.exs_evt_errno == ECANCELED && ev.exs_evt_ahandle == AH(500 + i) &&
                  ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0,
              "cancelled %d: errno %d", 500 + i, ev.exs_evt_errno);
    }
    CHECK(exs_cancel(fd, AH(0), EXS_CAF_FILDES) == 0, "nothing left to cancel");
    sync_write(wfd, 'c');
    /* the client's sends L1 and L2 were on the wire (not cancelled), L3
     * and L4 waited for credits and were; then E */
    sync_read(down_r, 'r');
    recv_exact(fd, b, mh, LBIG, 3000, seqp);
    CHECK(same(b, LBIG, 40), "L1");
    recv_exact(fd, b, mh, LBIG, 3000, seqp);
    CHECK(same(b, LBIG, 41), "L2");
    recv_exact(fd, b, mh, 1, 1, 0);
    CHECK(same(b, 1, 44), "E follows L2: the cancelled sends never went");

    /* the client's SHUT_WR: its last message, then end of stream (again
     * and again); poll says readable */
    if (seqp) {
        const size_t r4[] = {100, 100};
        k = recvmsg_parts(fd, r4, 2, got, &tr, 15);
        CHECK(k == 120 && !tr && same(got, 120, 45), "message F: %zd", k);
    } else {
        fill(want, 120, 45);
        stream_recvmsg(fd, want, 120);
    }
    expect_eof(fd, 16);
    expect_eof(fd, 17);
    po.events = EXS_POLLIN;
    po.revents = 0;
    CHECK(exs_poll(&po, 1, q, AH(4)) == 0, "poll");
    ev = next(EXS_EVT_POLL);
    CHECK(po.revents & EXS_POLLIN, "end of stream is readable: %x", po.revents);
    /* half-closed: this direction still works */
    fill(b, 3, 46);
    CHECK(exs_send(fd, b, 3, 0, q, AH(60), mh) == 0, "send");
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == 0, "send after the peer's SHUT_WR: %d", ev.exs_evt_errno);
    /* the client shut its reading side: what we send now is taken unread */
    sync_read(down_r, 'd');
    /* two sends (the second pulled, so pending), SHUT_RDWR and
     * exs_aclose queued behind them: their events in call order */
    CHECK(exs_send(fd, b, 4, 0, q, AH(61), mh) == 0, "send");
    CHECK(exs_send(fd, b, 5000, 0, q, AH(62), mh) == 0, "send");
    CHECK(exs_shutdown(fd, SHUT_RDWR, q, AH(63)) == 0, "shutdown");
    FAILS(exs_send(fd, b, 4, 0, q, AH(0), mh), EPIPE);
    CHECK(exs_aclose(fd, q, AH(64)) == 0, "aclose");
    for (int i = 0; i < 2; i++) {
        ev = next(EXS_EVT_SEND);
        CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(61 + i),
              "send into a SHUT_RD peer: errno %d", ev.exs_evt_errno);
    }
    ev = next(EXS_EVT_SHUTDOWN);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(63) && ev.exs_evt_fd == fd,
          "shutdown event");
    ev = next(EXS_EVT_CLOSE);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(64) && ev.exs_evt_fd == fd,
          "close event after the sends'");
    FAILS(exs_send(fd, b, 4, 0, q, AH(0), mh), EBADF);
    sync_write(wfd, 'e');
    sync_read(down_r, 'f');
    printf("server: ok\n");
    return 0;
}

static int calls_client(int port, int rfd, int type) {
    int seqp = type == SOCK_SEQPACKET;
    int fd = dial(port, type, 2, -1);
    CHECK(exs_fcntl(fd, EXS_F_GETCREDITS) == 2, "credits");
    area_init();
    exs_event_t ev;
    struct timespec brief = {0, 200000000};
    char *small = malloc(4096);
    exs_mhandle_t smh = exs_mregister(small, 1024, 0);
    bad_arguments(fd, small, smh);

    sync_read(rfd, '1');
    sendmsg_parts(fd, 20, m1, 3, 100);
    sendmsg_parts(fd, 21, pa, 2, 101);
    sendmsg_parts(fd, 22, pb, 1, 102);
    sendmsg_parts(fd, 23, pc, 2, 103);
    sendmsg_parts(fd, 24, pd, 3, 104);

    /* sendfile of a file made under $TMPDIR */
    const char *dir = getenv("TMPDIR");
    CHECK(dir && *dir, "TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/rdma_sendfile.%d", dir, (int)getpid());
    FILE *f = fopen(path, "w+");
    CHECK(f != NULL, "create %s", path);
    unsigned char *file = malloc(FILE_LEN);
    fill(file, FILE_LEN, 31);
    CHECK(fwrite(file, 1, FILE_LEN, f) == FILE_LEN && fflush(f) == 0, "write file");
    unsigned char *mem = malloc(100), *tail = area(50);
    fill(mem, 100, 30);
    fill(tail, 50, 32);
    exs_xferfile_t xf[3];
    memset(xf, 0, sizeof xf);
    xf[0].xf_type = EXS_IOVEC;
    xf[0].xf_u.xf_iov.iov_base = mem;
    xf[0].xf_u.xf_iov.iov_len = 100;
    xf[0].xf_u.xf_iov.iov_mhandle = EXS_MHANDLE_UNREGISTERED;
    xf[1].xf_type = EXS_FDVEC;
    xf[1].xf_u.xf_fdv.fdv_fd = fileno(f);
    xf[1].xf_u.xf_fdv.fdv_offset = FILE_OFF;
    xf[1].xf_u.xf_fdv.fdv_len = FILE_LEN; /* past the end of the file */
    FAILS(exs_sendfile(fd, xf, 2, 0, q, AH(0)), EIO);
    xf[1].xf_u.xf_fdv.fdv_len = FILE_TAKE;
    xf[2].xf_type = EXS_IOVEC;
    xf[2].xf_u.xf_iov.iov_base = tail;
    xf[2].xf_u.xf_iov.iov_len = 50;
    xf[2].xf_u.xf_iov.iov_mhandle = reg_mh;
    CHECK(exs_sendfile(fd, xf, 3, 0, q, AH(110)) == 0, "sendfile");
    ev = next(EXS_EVT_SENDFILE);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(110) &&
              ev.exs_evt_union.exs_evt_xferfile.exs_evt_nbytes == SF_TOTAL &&
              ev.exs_evt_union.exs_evt_xferfile.exs_evt_vec == xf &&
              ev.exs_evt_union.exs_evt_xferfile.exs_evt_count == 3,
          "sendfile event: errno %d, %zd octets", ev.exs_evt_errno,
          ev.exs_evt_union.exs_evt_xferfile.exs_evt_nbytes);
    fclose(f);
    CHECK(unlink(path) == 0, "unlink");

    /* cancel: with 2 credits and a receiver that takes nothing, L1 and L2
     * are advertised, L3 and L4 wait for credits; so does POLLOUT */
    sync_read(rfd, 'c');
    usleep(100000); /* the credits of the messages above are back */
    unsigned char *lb = area(4 * LBIG);
    for (int i = 0; i < 4; i++) {
        fill(lb + i * LBIG, LBIG, 40 + i);
        CHECK(exs_send(fd, lb + i * LBIG, LBIG, 0, q, AH(701 + i), reg_mh) == 0, "send L%d", i);
    }
    exs_pollfd_t po = {fd, EXS_POLLOUT, 0};
    CHECK(exs_poll(&po, 1, q, AH(705)) == 0, "poll");
    CHECK(exs_qdequeue(q, &ev, 1, &brief) == 0, "an event while the peer takes nothing: %d",
          ev.exs_evt_type);
    CHECK(exs_cancel(fd, AH(703), EXS_CAF_FILDES | EXS_CAF_AHANDLE) == 1, "cancel L3");
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == ECANCELED && ev.exs_evt_ahandle == AH(703), "L3 cancelled");
    CHECK(exs_cancel(-1, AH(704), EXS_CAF_AHANDLE) == 1, "cancel L4 by its handle");
    ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == ECANCELED && ev.exs_evt_ahandle == AH(704), "L4 cancelled");
    CHECK(exs_cancel(fd, AH(701), EXS_CAF_FILDES | EXS_CAF_AHANDLE) == 0,
          "L1 is on the wire: not cancelled");
    sync_write(down_w, 'r');
    /* L1 and L2 complete in order once pulled; POLLOUT when credits return */
    int sends = 0, polls = 0;
    for (int i = 0; i < 3; i++) {
        struct timespec t = {10, 0};
        CHECK(exs_qdequeue(q, &ev, 1, &t) == 1, "event %d of L1, L2 and the poll", i);
        if (ev.exs_evt_type == EXS_EVT_SEND) {
            CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(701 + sends),
                  "L%d: errno %d", sends + 1, ev.exs_evt_errno);
            sends++;
        } else {
            CHECK(ev.exs_evt_type == EXS_EVT_POLL && ev.exs_evt_ahandle == AH(705) &&
                      po.revents == EXS_POLLOUT && ev.exs_evt_union.exs_evt_poll.exs_evt_nready == 1,
                  "writable again: type %d revents %x", ev.exs_evt_type, po.revents);
            polls++;
        }
    }
    CHECK(sends == 2 && polls == 1, "%d sends %d polls", sends, polls);
    unsigned char *e = area(1);
    fill(e, 1, 44);
    send1(fd, e, 1, reg_mh, 706);
    CHECK(next(EXS_EVT_SEND).exs_evt_errno == 0, "E");

    /* SHUT_WR after a last message: its event after the message's */
    sendmsg_parts(fd, 45, pf_, 2, 800);
    CHECK(exs_shutdown(fd, SHUT_WR, q, AH(801)) == 0, "shutdown");
    ev = next(EXS_EVT_SHUTDOWN);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(801) && ev.exs_evt_fd == fd,
          "shutdown event");
    FAILS(exs_send(fd, small, 4, 0, q, AH(0), smh), EPIPE);
    exs_iovec_t iv[2] = {{small, 2, smh}, {small + 2, 2, smh}};
    exs_msghdr_t m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iv;
    m.msg_iovlen = 2;
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EPIPE);
    /* the other direction still works */
    unsigned char got[8];
    memset(got, 0, sizeof got);
    CHECK(exs_recv(fd, got, sizeof got, 0, q, AH(802), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 3 && same(got, 3, 46),
          "message after SHUT_WR: %zd", ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes);
    /* SHUT_RD: receives end at once with 0 octets */
    CHECK(exs_shutdown(fd, SHUT_RD, q, AH(803)) == 0, "shutdown");
    ev = next(EXS_EVT_SHUTDOWN);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(803), "SHUT_RD event");
    expect_eof(fd, 804);
    sync_write(down_w, 'd');
    /* the server's SHUT_RDWR: both directions shut, POLLHUP */
    sync_read(rfd, 'e');
    int hup = 0;
    for (int i = 0; i < 500 && !hup; i++) {
        po.events = EXS_POLLIN | EXS_POLLOUT;
        po.revents = 0;
        CHECK(exs_poll(&po, 1, q, AH(805)) == 0, "poll");
        ev = next(EXS_EVT_POLL);
        CHECK(po.revents & EXS_POLLIN, "shut for reading: readable (%x)", po.revents);
        CHECK(!(po.revents & EXS_POLLOUT), "shut for writing: not writable (%x)", po.revents);
        hup = po.revents & EXS_POLLHUP;
        if (!hup) usleep(10000);
    }
    CHECK(hup, "POLLHUP once both directions are shut");
    expect_eof(fd, 806);
    sync_write(down_w, 'f');
    /* asynchronous close */
    CHECK(exs_aclose(fd, q, AH(900)) == 0, "aclose");
    ev = next(EXS_EVT_CLOSE);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_ahandle == AH(900), "close event");
    FAILS(exs_send(fd, small, 4, 0, q, AH(0), smh), EBADF);
    (void)seqp;
    printf("client: ok\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: rdma_test seqpacket|stream|credits N|errors|kill|persistent|threads N|latency N|calls TYPE\n");
        return 2;
    }
    const char *mode = argv[1];
    CHECK(strcmp(mode, "calls") != 0 || argc > 2, "calls needs a type: seqpacket or stream");
    long n = argc > 2 ? atol(argv[2]) : 1000;
    int up[2], down[2];
    CHECK(pipe(up) == 0 && pipe(down) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    down_r = down[0];
    down_w = down[1];
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        alarm(120);
        int wfd = up[1];
        (void)type_of;
        if (!strcmp(mode, "seqpacket")) return seq_server(wfd);
        if (!strcmp(mode, "stream")) return stream_server(wfd);
        if (!strcmp(mode, "credits")) return credits_server(wfd, n);
        if (!strcmp(mode, "errors")) return errors_server(wfd);
        if (!strcmp(mode, "kill")) return kill_server(wfd);
        if (!strcmp(mode, "latency")) return latency_server(wfd, n);
        if (!strcmp(mode, "persistent")) return persistent_server(wfd);
        if (!strcmp(mode, "threads")) return threads_server(wfd, n);
        if (!strcmp(mode, "calls")) return calls_server(wfd, type_of(argv[2]));
        return 2;
    }
    close(up[1]);
    close(down[0]);
    alarm(120);
    int rfd = up[0];
    int rc;
    if (!strcmp(mode, "latency")) {
        rc = latency_client(rfd, n);
    } else if (!strcmp(mode, "persistent")) {
        rc = persistent_client(rfd);
    } else {
        int port;
        CHECK(read(rfd, &port, sizeof port) == sizeof port, "server port");
        if (!strcmp(mode, "seqpacket")) rc = seq_client(port, rfd);
        else if (!strcmp(mode, "stream")) rc = stream_client(port);
        else if (!strcmp(mode, "credits")) rc = credits_client(port, rfd, n);
        else if (!strcmp(mode, "errors")) rc = errors_client(port);
        else if (!strcmp(mode, "kill")) rc = kill_client(port, rfd, pid);
        else if (!strcmp(mode, "threads")) rc = threads_client(port, n);
        else if (!strcmp(mode, "calls")) rc = calls_client(port, rfd, type_of(argv[2]));
        else rc = 2;
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid, "wait server");
    if (!strcmp(mode, "kill")) {
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "server was killed");
    } else {
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server status %d", st);
    }
    return rc;
}
