/* DDPMODE meets the Extended Sockets API: a TCP connection both ends
 * switch with SOFTRDMA_DDPMODE, a plain exchange, then exs_* calls of the
 * RDMA model on the same descriptors.
 *
 *   ddp_exs server PORT rdma | client PORT rdma
 *       under the interposer: the first exs call switches the socket to
 *       the RDMA model (SOFTRDMA_DDPMODE then reads 2); octets written
 *       with write() before the switch are still read with read(), then
 *       read()/write() fail with EOPNOTSUPP; normal sends (1 KiB, 1 MiB,
 *       registered), an immediate one, both directions; a persistent
 *       receive with notes written by exs_send_offset; a persistent send
 *       with notes pulled by exs_recv and exs_recv_offset; credits.
 *   ddp_exs server PORT fallback | client PORT fallback
 *       without the interposer: DDPMODE is refused (ENOPROTOOPT), the
 *       RDMA-model calls fail as on any kernel socket (exs_fcntl and the
 *       offset calls ENOTSOCK, persistent flags EOPNOTSUPP), and normal
 *       exs_send/exs_recv work over the kernel (the Open Group model).
 *
 * Every wait is bounded (10 s); the harness bounds the whole run too.
 * Prints what it checked; exit 0 when everything held. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <softrdma/sockets.h>

#define CHECK(c, ...)                                                           \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "[%s] FAIL line %d: ", role, __LINE__);             \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (errno %d)\n", errno);                            \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define FAILS(call, err) CHECK((call) == -1 && errno == (err), "%s should fail with %s", #call, #err)
#define AH(x) ((exs_ahandle_t)(uintptr_t)(x))

#define BIG (1 << 20)
#define PLAIN (3 * 1024 * 1024 + 5)

static const char *role = "?";
static exs_qhandle_t q;

static exs_event_t next(int type, exs_ahandle_t ah) {
    exs_event_t ev;
    struct timespec t = {10, 0};
    int n = exs_qdequeue(q, &ev, 1, &t);
    CHECK(n == 1, "no event in 10 s (waiting for type %d)", type);
    CHECK(ev.exs_evt_type == type && ev.exs_evt_ahandle == ah,
          "event type %d ahandle %p, expected %d %p (event errno %d)", ev.exs_evt_type,
          ev.exs_evt_ahandle, type, ah, ev.exs_evt_errno);
    CHECK(ev.exs_evt_errno == 0, "event errno %d", ev.exs_evt_errno);
    return ev;
}

static long nbytes(exs_event_t ev) { return (long)ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes; }

static void fill(unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131 + i * 7);
}

static int same(const unsigned char *b, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed * 131 + i * 7)) return 0;
    return 1;
}

static void xfer(int fd, void *buf, size_t n, int out) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = out ? write(fd, (char *)buf + done, n - done)
                        : read(fd, (char *)buf + done, n - done);
        CHECK(r > 0, "%s: %zd", out ? "write" : "read", r);
        done += (size_t)r;
    }
}

static int ddpmode(int fd) {
    int v = -1;
    socklen_t len = sizeof v;
    CHECK(getsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_DDPMODE, &v, &len) == 0, "getsockopt DDPMODE");
    return v;
}

/* Sends `len` octets at `buf` and waits for its event. */
static void send_wait(int fd, void *buf, size_t len, exs_mhandle_t mh, int tag) {
    CHECK(exs_send(fd, buf, len, 0, q, AH(tag), mh) == 0, "exs_send %zu", len);
    exs_event_t ev = next(EXS_EVT_SEND, AH(tag));
    CHECK(nbytes(ev) == (long)len, "sent %ld of %zu", nbytes(ev), len);
}

/* Receives exactly `len` octets into `buf`. */
static void recv_wait(int fd, void *buf, size_t len, exs_mhandle_t mh, int tag) {
    CHECK(exs_recv(fd, buf, len, MSG_WAITALL, q, AH(tag), mh) == 0, "exs_recv %zu", len);
    exs_event_t ev = next(EXS_EVT_RECV, AH(tag));
    CHECK(nbytes(ev) == (long)len, "received %ld of %zu", nbytes(ev), len);
}

static void persistent_event(exs_event_t ev, void *buf, long n) {
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_buf == buf && nbytes(ev) == n &&
              (ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & EXS_PERSISTENT),
          "persistent event: buf %p (want %p), %ld octets (want %ld)",
          ev.exs_evt_union.exs_evt_xfer.exs_evt_buf, buf, nbytes(ev), n);
}

static int connected(int server, int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd;
    if (server) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        CHECK(bind(l, (void *)&a, sizeof a) == 0 && listen(l, 1) == 0, "listen");
        fd = accept(l, NULL, NULL);
        CHECK(fd >= 0, "accept");
        close(l);
    } else {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        int ok = -1;
        for (int i = 0; i < 200 && ok != 0; i++) {
            ok = connect(fd, (void *)&a, sizeof a);
            if (ok != 0) {
                close(fd);
                usleep(20000);
                fd = socket(AF_INET, SOCK_STREAM, 0);
            }
        }
        CHECK(ok == 0, "connect");
    }
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void setup(void) {
    CHECK(exs_init(EXS_VERSION) == 0, "exs_init");
    q = exs_qcreate(64);
    CHECK(q != EXS_QHANDLE_INVALID, "exs_qcreate");
}

/* ---- under the interposer ---- */

static int rdma_server(int fd) {
    unsigned char *big = calloc(1, BIG), *plain = calloc(1, PLAIN), small[100] = {0}, kb[1024] = {0};
    unsigned char *rb = calloc(1, 4096), *pb = calloc(1, 4096);
    exs_mhandle_t bm = exs_mregister(big, BIG, 0), km = exs_mregister(kb, sizeof kb, 0);
    exs_mhandle_t pm = exs_mregister(pb, 4096, 0);
    CHECK(bm >= 0 && km >= 0 && pm >= 0, "exs_mregister");
    /* Written before the switch: the client reads it with read() after
     * its own switch. Three times the stream's window: the write goes
     * on only as the client's reads return credits after its switch. */
    fill(plain, PLAIN, 9);
    xfer(fd, plain, PLAIN, 1);
    /* The client switched before it read (its credits came after its
     * switch message): its stream ended there. */
    char c;
    FAILS(read(fd, &c, 1), EOPNOTSUPP);
    CHECK(ddpmode(fd) == 1, "DDPMODE reads %d before this end's switch", ddpmode(fd));
    printf("server: plain write done; read after the peer's switch: EOPNOTSUPP\n");
    int credits = exs_fcntl(fd, EXS_F_GETCREDITS);
    CHECK(credits > 0, "EXS_F_GETCREDITS %d", credits);
    CHECK(ddpmode(fd) == 2, "DDPMODE reads %d after the switch", ddpmode(fd));
    printf("server: switched, DDPMODE reads 2, credits %d\n", credits);
    memset(kb, 0, sizeof kb);
    recv_wait(fd, kb, sizeof kb, km, 1);
    CHECK(same(kb, sizeof kb, 1), "1 KiB differs");
    recv_wait(fd, big, BIG, bm, 2);
    CHECK(same(big, BIG, 2), "1 MiB differs");
    recv_wait(fd, small, sizeof small, EXS_MHANDLE_UNREGISTERED, 3);
    CHECK(same(small, sizeof small, 3), "immediate differs");
    printf("server: 1 KiB, 1 MiB and 100 octets intact\n");
    fill(kb, sizeof kb, 4);
    send_wait(fd, kb, sizeof kb, km, 4);
    /* A persistent receive with notes: the client writes at an offset. */
    CHECK(exs_recv(fd, rb, 4096, EXS_PERSISTENT_NOTIFY, q, AH(5), EXS_MHANDLE_UNREGISTERED) == 0,
          "persistent recv");
    persistent_event(next(EXS_EVT_RECV, AH(5)), rb, 0);
    persistent_event(next(EXS_EVT_RECV, AH(5)), rb + 1000, 200);
    CHECK(same(rb + 1000, 200, 5), "write at 1000 differs");
    for (int i = 0; i < 1000; i++) CHECK(rb[i] == 0, "octet %d written", i);
    printf("server: persistent receive written at offset 1000\n");
    /* A persistent send with notes: the client pulls it whole, then 100
     * octets at 3000. */
    fill(pb, 4096, 7);
    CHECK(exs_send(fd, pb, 4096, EXS_PERSISTENT_NOTIFY, q, AH(6), pm) == 0, "persistent send");
    persistent_event(next(EXS_EVT_SEND, AH(6)), pb, 4096);
    persistent_event(next(EXS_EVT_SEND, AH(6)), pb, 4096);
    persistent_event(next(EXS_EVT_SEND, AH(6)), pb + 3000, 100);
    printf("server: persistent send pulled whole and at offset 3000\n");
    /* The client's exs_close: end of stream. */
    CHECK(exs_recv(fd, &c, 1, 0, q, AH(7), EXS_MHANDLE_UNREGISTERED) == 0, "last recv");
    exs_event_t ev;
    struct timespec t = {10, 0};
    CHECK(exs_qdequeue(q, &ev, 1, &t) == 1 && ev.exs_evt_type == EXS_EVT_RECV &&
              nbytes(ev) == 0,
          "end of stream");
    CHECK(exs_close(fd) == 0, "exs_close");
    printf("server: ok\n");
    return 0;
}

static int rdma_client(int fd) {
    unsigned char *big = calloc(1, BIG), *plain = calloc(1, PLAIN), small[100] = {0}, kb[1024] = {0};
    unsigned char *b = calloc(1, 8192);
    exs_mhandle_t bm = exs_mregister(big, BIG, 0), km = exs_mregister(kb, sizeof kb, 0);
    exs_mhandle_t mh = exs_mregister(b, 8192, 0);
    CHECK(bm >= 0 && km >= 0 && mh >= 0, "exs_mregister");
    fill(kb, sizeof kb, 1);
    /* The first exs call switches the socket. */
    CHECK(exs_send(fd, kb, sizeof kb, 0, q, AH(1), km) == 0, "exs_send 1 KiB");
    CHECK(ddpmode(fd) == 2, "DDPMODE reads %d after the switch", ddpmode(fd));
    /* What the server wrote before its switch still reads with read(). */
    xfer(fd, plain, PLAIN, 0);
    CHECK(same(plain, PLAIN, 9), "plain octets differ");
    printf("client: %d plain octets from before the switch intact\n", (int)PLAIN);
    exs_event_t ev = next(EXS_EVT_SEND, AH(1));
    CHECK(nbytes(ev) == 1024, "sent %ld", nbytes(ev));
    fill(big, BIG, 2);
    send_wait(fd, big, BIG, bm, 2);
    fill(small, sizeof small, 3);
    send_wait(fd, small, sizeof small, EXS_MHANDLE_UNREGISTERED, 3);
    memset(kb, 0, sizeof kb);
    recv_wait(fd, kb, sizeof kb, km, 4);
    CHECK(same(kb, sizeof kb, 4), "1 KiB from the server differs");
    int credits = exs_fcntl(fd, EXS_F_GETCREDITS);
    CHECK(credits > 0, "EXS_F_GETCREDITS %d", credits);
    printf("client: normal and immediate sends done, credits %d\n", credits);
    /* The byte stream ended at the switch. */
    char c;
    FAILS(read(fd, &c, 1), EOPNOTSUPP);
    FAILS(write(fd, "x", 1), EOPNOTSUPP);
    printf("client: read and write after the switch: EOPNOTSUPP\n");
    /* Into the server's persistent receive block (EINVAL until its
     * advertisement arrived). */
    fill(b, 200, 5);
    int ok = -1;
    for (int i = 0; i < 10000 && ok != 0; i++) {
        ok = exs_send_offset(fd, b, 200, 0, 1000, q, AH(5), mh);
        if (ok != 0) {
            CHECK(errno == EINVAL, "exs_send_offset");
            usleep(1000);
        }
    }
    CHECK(ok == 0, "the server's persistent receive block never became known");
    ev = next(EXS_EVT_SEND, AH(5));
    CHECK(nbytes(ev) == 200, "wrote %ld", nbytes(ev));
    /* The server's persistent send block: pulled whole, then at 3000. */
    memset(b, 0, 8192);
    CHECK(exs_recv(fd, b, 4096, 0, q, AH(6), mh) == 0, "exs_recv persistent");
    ev = next(EXS_EVT_RECV, AH(6));
    CHECK(nbytes(ev) == 4096 && same(b, 4096, 7), "pulled %ld octets", nbytes(ev));
    CHECK(exs_recv_offset(fd, b + 5000, 100, 0, 3000, q, AH(7), mh) == 0, "exs_recv_offset");
    ev = next(EXS_EVT_RECV, AH(7));
    unsigned char want[4096];
    fill(want, 4096, 7);
    CHECK(nbytes(ev) == 100 && memcmp(b + 5000, want + 3000, 100) == 0, "offset pull");
    printf("client: offset write and persistent pulls done\n");
    CHECK(exs_close(fd) == 0, "exs_close");
    printf("client: ok\n");
    return 0;
}

/* ---- without the interposer ---- */

static int fallback(int fd, int server) {
    unsigned char *big = calloc(1, BIG), kb[1024] = {0};
    exs_mhandle_t bm = exs_mregister(big, BIG, 0), km = exs_mregister(kb, sizeof kb, 0);
    CHECK(bm >= 0 && km >= 0, "exs_mregister");
    FAILS(exs_fcntl(fd, EXS_F_GETCREDITS), ENOTSOCK);
    FAILS(exs_send_offset(fd, kb, 10, 0, 0, q, AH(9), km), ENOTSOCK);
    FAILS(exs_recv_offset(fd, kb, 10, 0, 0, q, AH(9), km), ENOTSOCK);
    FAILS(exs_send(fd, kb, 10, EXS_PERSISTENT, q, AH(9), km), EOPNOTSUPP);
    printf("%s: RDMA-model calls refused (ENOTSOCK, EOPNOTSUPP)\n", role);
    if (server) {
        recv_wait(fd, kb, sizeof kb, km, 1);
        CHECK(same(kb, sizeof kb, 1), "1 KiB differs");
        recv_wait(fd, big, BIG, bm, 2);
        CHECK(same(big, BIG, 2), "1 MiB differs");
        printf("server: Open Group model: 1 KiB and 1 MiB intact\n");
    } else {
        fill(kb, sizeof kb, 1);
        send_wait(fd, kb, sizeof kb, km, 1);
        fill(big, BIG, 2);
        send_wait(fd, big, BIG, bm, 2);
    }
    CHECK(exs_close(fd) == 0, "exs_close");
    printf("%s: ok\n", role);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int server = strcmp(argv[1], "server") == 0;
    int rdma = strcmp(argv[3], "rdma") == 0;
    role = argv[1];
    setvbuf(stdout, NULL, _IONBF, 0);
    int fd = connected(server, atoi(argv[2]));
    /* A plain exchange first, then both ends switch. */
    char line[3];
    if (server) {
        xfer(fd, line, 3, 0);
        CHECK(memcmp(line, "hi\n", 3) == 0, "hi");
        xfer(fd, "ok\n", 3, 1);
    } else {
        xfer(fd, "hi\n", 3, 1);
        xfer(fd, line, 3, 0);
        CHECK(memcmp(line, "ok\n", 3) == 0, "ok");
    }
    int one = 1;
    int r = setsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_DDPMODE, &one, sizeof one);
    if (rdma) {
        CHECK(r == 0, "DDPMODE refused");
        CHECK(ddpmode(fd) == 1, "DDPMODE reads %d", ddpmode(fd));
        printf("%s: DDPMODE on\n", role);
    } else {
        CHECK(r == -1 && errno == ENOPROTOOPT, "DDPMODE without the interposer");
        printf("%s: DDPMODE refused (ENOPROTOOPT)\n", role);
    }
    setup();
    if (!rdma) return fallback(fd, server);
    return server ? rdma_server(fd) : rdma_client(fd);
}
