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
 *                              outstanding operation ends with ECONNRESET
 *   rdma_test threads N        two connections, a sleeping and a busy-polling
 *                              thread per side, N checked ping-pongs each
 *   rdma_test persistent       persistent send and receive, with and without
 *                              notes, offsets and their bounds
 *   rdma_test latency N        ping-pong, one-way microseconds at 1/10/100 B
 *                              for normal (small 0) and immediate sends;
 *                              then receives pulling a persistent block
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

#define CHECK(c, ...)                                                     \
    do {                                                                  \
        if (!(c)) {                                                       \
            fprintf(stderr, "[%d] FAIL %s:%d: ", (int)getpid(), __FILE__, \
                    __LINE__);                                            \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, " (errno %d)\n", errno);                      \
            exit(1);                                                      \
        }                                                                 \
    } while (0)
#define FAILS(call, err) CHECK((call) == -1 && errno == (err), "%s should fail with %s", #call, #err)
#define AH(x) ((exs_ahandle_t)(uintptr_t)(x))

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
    exs_msghdr_t m;
    memset(&m, 0, sizeof m);
    FAILS(exs_sendmsg(fd, &m, 0, q, AH(0)), EOPNOTSUPP);
    FAILS(exs_shutdown(fd, SHUT_WR, q, AH(0)), EOPNOTSUPP);
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

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: rdma_test seqpacket|stream|credits N|errors|kill|persistent|threads N|latency N\n");
        return 2;
    }
    const char *mode = argv[1];
    long n = argc > 2 ? atol(argv[2]) : 1000;
    int up[2], down[2];
    CHECK(pipe(up) == 0 && pipe(down) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
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
