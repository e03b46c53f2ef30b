/* SOCK_DGRAM sockets of libexs (UD, RD or Write-Record queue pairs)
 * between two processes: the program forks before its first exs_* call;
 * the child is the server (bound to 127.0.0.1, port 0; it tells the
 * parent the port through a pipe), the parent the client.
 *
 *   dgram_test ud | rd | wr | wrmix
 *
 * (wrmix: the client EXS_DGRAM_WR, the server EXS_DGRAM_UD.)
 * Datagrams of several sizes up to 65536 octets with their contents
 * checked and echoed to the source address the receive reported;
 * MSG_TRUNC for short receives (exs_recv and exs_recvmsg); connected
 * sockets (exs_send/exs_recv, datagrams from others ignored); 300
 * datagrams of 1 to 65536 octets echoed by connected sockets, checked
 * octet for octet, and counted (EXS_F_GETDGRAMSTAT: Write-Records or
 * Sends as the modes say); calls that cannot start; a receive pending at
 * exs_close ends with ECANCELED, exs_cancel by handle and by
 * descriptor. wr also: a sender that outruns a
 * receiver that reads nothing (datagrams lost, none corrupted, no ring
 * slot written twice before it was read). Every wait is bounded (10 s);
 * the harness bounds the whole run too. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/exs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static exs_qhandle_t q;
/* This process's datagram transport; the run's name. */
static int dmode;
static const char *mode;
/* server -> client: ports; client -> server: "done" of the overrun. */
static int s2c[2], c2s[2];
#define MANY 300
#define BLAST 300
#define BLAST_LEN 9000
static const size_t sizes[] = {1, 17, 100, 1472, 1500, 4096, 9000, 32768, 65535, 65536};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define BIG 65536

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

static unsigned char pat(size_t i, size_t size) { return (unsigned char)(i * 7 + size * 13 + 1); }

static int dsocket(void) {
    int fd = exs_socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0, "socket");
    CHECK(exs_fcntl(fd, EXS_F_GETDGRAM) == EXS_DGRAM_UD, "default UD");
    if (dmode != EXS_DGRAM_UD) {
        CHECK(exs_fcntl(fd, EXS_F_SETDGRAM, dmode) == 0, "set mode %d", dmode);
        CHECK(exs_fcntl(fd, EXS_F_GETDGRAM) == dmode, "mode %d set", dmode);
    }
    return fd;
}

static int bind_lo(int fd) {
    struct sockaddr_in a = lo(0);
    CHECK(exs_bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind");
    socklen_t l = sizeof a;
    CHECK(exs_getsockname(fd, (struct sockaddr *)&a, &l) == 0, "getsockname");
    CHECK(l == sizeof a && a.sin_port != 0 && a.sin_addr.s_addr == htonl(INADDR_LOOPBACK),
          "bound name");
    return ntohs(a.sin_port);
}

/* One datagram through exs_recvmsg; the source written to *from. */
static ssize_t recv_from(int fd, char *buf, size_t len, struct sockaddr_in *from, int *flags) {
    exs_iovec_t iov = {buf, len, EXS_MHANDLE_UNREGISTERED};
    exs_msghdr_t m;
    memset(&m, 0, sizeof m);
    memset(from, 0, sizeof *from);
    m.msg_name = from;
    m.msg_namelen = sizeof *from;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_flags = -1;
    CHECK(exs_recvmsg(fd, &m, 0, q, AH(&m)) == 0, "recvmsg");
    exs_event_t ev = next(EXS_EVT_RECVMSG);
    CHECK(ev.exs_evt_errno == 0, "recvmsg errno %d", ev.exs_evt_errno);
    CHECK(ev.exs_evt_union.exs_evt_xfermsg.exs_evt_msg == &m, "event's msghdr");
    CHECK(m.msg_namelen == sizeof *from && from->sin_family == AF_INET, "source written");
    CHECK((ev.exs_evt_union.exs_evt_xfermsg.exs_evt_flags & MSG_TRUNC) ==
              (m.msg_flags & MSG_TRUNC),
          "MSG_TRUNC in the event and msg_flags agree");
    *flags = m.msg_flags;
    return ev.exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes;
}

/* Two iovecs (the datagram is their concatenation) to `to`. */
static void send_to(int fd, const char *buf, size_t len, const struct sockaddr_in *to) {
    size_t half = len / 3;
    exs_iovec_t iov[2] = {{(void *)buf, half, EXS_MHANDLE_UNREGISTERED},
                          {(void *)(buf + half), len - half, EXS_MHANDLE_UNREGISTERED}};
    exs_msghdr_t m;
    memset(&m, 0, sizeof m);
    m.msg_name = (void *)to;
    m.msg_namelen = sizeof *to;
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    CHECK(exs_sendmsg(fd, &m, 0, q, AH(&m)) == 0, "sendmsg %zu", len);
    exs_event_t ev = next(EXS_EVT_SENDMSG);
    CHECK(ev.exs_evt_errno == 0, "sendmsg errno %d", ev.exs_evt_errno);
    CHECK(ev.exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes == (ssize_t)len, "sent %zd of %zu",
          ev.exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes, len);
}

static void send1(int fd, const char *s) {
    CHECK(exs_send(fd, s, strlen(s), 0, q, AH(1), EXS_MHANDLE_UNREGISTERED) == 0, "send");
    exs_event_t ev = next(EXS_EVT_SEND);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)strlen(s),
          "send event of \"%s\": errno %d, %zd octets", s, ev.exs_evt_errno,
          ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes);
}

static void recv1(int fd, const char *want) {
    char b[64];
    memset(b, 0, sizeof b);
    CHECK(exs_recv(fd, b, sizeof b - 1, 0, q, AH(2), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == 0, "recv errno %d", ev.exs_evt_errno);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)strlen(want) &&
              memcmp(b, want, strlen(want)) == 0,
          "got \"%s\", want \"%s\"", b, want);
}

static long dstat(int fd, int which) {
    int v = exs_fcntl(fd, EXS_F_GETDGRAMSTAT, which);
    CHECK(v >= 0, "EXS_F_GETDGRAMSTAT %d", which);
    return v;
}

/* Octet i of datagram k of the MANY phase, and its size. */
static size_t many_size(size_t k) {
    if (k == 0) return 1;
    if (k == 1) return BIG;
    return (k * 7919) % BIG + 1;
}
static unsigned char many_pat(size_t i, size_t k) { return (unsigned char)(i * 11 + k * 29 + 5); }

/* The MANY phase on a connected descriptor: the client sends, the server
 * checks and echoes, the client checks the echo. */
static void many(int fd, int is_server, char *buf) {
    for (size_t k = 0; k < MANY; k++) {
        size_t size = many_size(k);
        if (!is_server) {
            for (size_t i = 0; i < size; i++) buf[i] = (char)many_pat(i, k);
            CHECK(exs_send(fd, buf, size, 0, q, AH(5), EXS_MHANDLE_UNREGISTERED) == 0, "send");
            exs_event_t ev = next(EXS_EVT_SEND);
            CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)size,
                  "many: send %zu errno %d", k, ev.exs_evt_errno);
            memset(buf, 0, size);
        }
        CHECK(exs_recv(fd, buf, BIG, 0, q, AH(6), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
        exs_event_t ev = next(EXS_EVT_RECV);
        CHECK(ev.exs_evt_errno == 0, "many: recv errno %d", ev.exs_evt_errno);
        ssize_t n = ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
        CHECK(n == (ssize_t)size && !(ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & MSG_TRUNC),
              "many: datagram %zu of %zu octets came as %zd", k, size, n);
        for (size_t i = 0; i < size; i++)
            CHECK((unsigned char)buf[i] == many_pat(i, k), "many: datagram %zu octet %zu", k, i);
        if (is_server) {
            CHECK(exs_send(fd, buf, size, 0, q, AH(5), EXS_MHANDLE_UNREGISTERED) == 0, "echo");
            ev = next(EXS_EVT_SEND);
            CHECK(ev.exs_evt_errno == 0, "many: echo %zu errno %d", k, ev.exs_evt_errno);
        }
    }
    long ro = dstat(fd, EXS_DGRAM_STAT_RECORDS_OUT), ri = dstat(fd, EXS_DGRAM_STAT_RECORDS_IN),
         rp = dstat(fd, EXS_DGRAM_STAT_RECORDS_PARTIAL), so = dstat(fd, EXS_DGRAM_STAT_SENDS_OUT),
         si = dstat(fd, EXS_DGRAM_STAT_SENDS_IN);
    fprintf(stderr, "%s %s: records out %ld in %ld partial %ld, sends out %ld in %ld\n",
            is_server ? "server" : "client", mode, ro, ri, rp, so, si);
    /* Every datagram of the descriptor is counted once, one way or the
     * other (the client sent MANY + 14 and received MANY + 12, the server
     * the reverse; the stray one of another socket is not counted). */
    long out = is_server ? MANY + 12 : MANY + 14, in = is_server ? MANY + 14 : MANY + 12;
    CHECK(ro + so == out && ri + si == in, "counted %ld + %ld out, %ld + %ld in", ro, so, ri, si);
    if (!strcmp(mode, "wr")) {
        /* After the first exchange every datagram has a ring with credit
         * (the reads return it long before it runs out). */
        CHECK(ro >= MANY && ri >= MANY && so <= 4 && si <= 4,
              "Write-Records: %ld out, %ld in; Sends %ld out, %ld in", ro, ri, so, si);
        CHECK(rp == 0, "no partial record on loopback without overrun");
    } else {
        CHECK(ro == 0 && ri == 0 && rp == 0, "no Write-Record in mode %s", mode);
    }
    fprintf(stderr, "many: %d datagrams (%s)\n", MANY, is_server ? "server" : "client");
}

/* The overrun (wr): the client sends BLAST datagrams of BLAST_LEN octets
 * (the first 4 the index) before the server reads any. */
static void blast_server(char *buf) {
    int fd = dsocket();
    int port = bind_lo(fd);
    CHECK(write(s2c[1], &port, sizeof port) == sizeof port, "pipe");
    char done;
    CHECK(read(c2s[0], &done, 1) == 1, "done");
    static unsigned char seen[BLAST];
    int got = 0, trunc = 0;
    for (;;) {
        CHECK(exs_recv(fd, buf, BIG, 0, q, AH(7), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
        exs_event_t ev;
        struct timespec t = {0, 500 * 1000 * 1000};
        if (exs_qdequeue(q, &ev, 1, &t) != 1) break; /* nothing more came */
        CHECK(ev.exs_evt_type == EXS_EVT_RECV && ev.exs_evt_errno == 0, "blast recv");
        ssize_t n = ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
        int tr = (ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & MSG_TRUNC) != 0;
        /* Whole, or (a record missing segments) its placed prefix. */
        CHECK(n == BLAST_LEN ? !tr : (tr && n >= 4 && n < BLAST_LEN), "blast: %zd octets", n);
        uint32_t idx;
        memcpy(&idx, buf, 4);
        CHECK(idx < BLAST && !seen[idx], "blast: index %u twice or out of range", idx);
        seen[idx] = 1;
        for (ssize_t i = 4; i < n; i++)
            CHECK((unsigned char)buf[i] == pat((size_t)i, idx), "blast: datagram %u octet %zd", idx, i);
        got++;
        trunc += tr;
    }
    long ri = dstat(fd, EXS_DGRAM_STAT_RECORDS_IN), rp = dstat(fd, EXS_DGRAM_STAT_RECORDS_PARTIAL);
    fprintf(stderr, "blast: %d of %d datagrams arrived intact (%d partial), %ld as records\n", got,
            BLAST, trunc, ri);
    CHECK(got >= 8 && got < BLAST, "an unread receiver loses datagrams: %d of %d", got, BLAST);
    CHECK(ri >= 1 && rp == trunc, "records in %ld, partial %ld (%d truncated)", ri, rp, trunc);
    CHECK(exs_close(fd) == 0, "close");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == ECANCELED, "the last receive ends at close");
}

static void blast_client(char *buf) {
    int port = 0;
    CHECK(read(s2c[0], &port, sizeof port) == sizeof port, "blast port");
    int fd = dsocket();
    struct sockaddr_in to = lo(port);
    CHECK(exs_connect(fd, (struct sockaddr *)&to, sizeof to, q, AH(4)) == 0, "connect");
    next(EXS_EVT_CONNECT);
    for (uint32_t k = 0; k < BLAST; k++) {
        memcpy(buf, &k, 4);
        for (size_t i = 4; i < BLAST_LEN; i++) buf[i] = (char)pat(i, k);
        CHECK(exs_send(fd, buf, BLAST_LEN, 0, q, AH(8), EXS_MHANDLE_UNREGISTERED) == 0, "send");
        exs_event_t ev = next(EXS_EVT_SEND);
        CHECK(ev.exs_evt_errno == 0, "blast send %u errno %d", k, ev.exs_evt_errno);
        if (k == 0) { /* the grant answers the first one */
            struct timespec pause = {0, 20 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
    }
    long ro = dstat(fd, EXS_DGRAM_STAT_RECORDS_OUT), so = dstat(fd, EXS_DGRAM_STAT_SENDS_OUT);
    fprintf(stderr, "blast: records out %ld, sends out %ld\n", ro, so);
    /* The receiver reads nothing: the ring's 8 slots, no more (16 if the
     * ring was re-keyed after its records were all lost). */
    CHECK(ro >= 1 && ro <= 16 && ro + so == BLAST, "records out %ld, sends %ld", ro, so);
    char done = 'd';
    CHECK(write(c2s[1], &done, 1) == 1, "done");
    /* The server's reads return credit: let them arrive before close. */
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    CHECK(exs_close(fd) == 0, "close");
}

static int server(int wfd) {
    CHECK(exs_init(EXS_VERSION) == 0, "init");
    q = exs_qcreate(16);
    int fd = dsocket();
    int port = bind_lo(fd);
    CHECK(write(wfd, &port, sizeof port) == sizeof port, "pipe");
    char *buf = malloc(BIG);
    struct sockaddr_in from;
    int flags;
    for (size_t k = 0; k < NSIZES; k++) {
        size_t size = sizes[k];
        ssize_t n = recv_from(fd, buf, BIG, &from, &flags);
        CHECK(n == (ssize_t)size, "size %zu: got %zd", size, n);
        CHECK(!(flags & MSG_TRUNC), "no truncation");
        for (size_t i = 0; i < size; i++)
            CHECK((unsigned char)buf[i] == pat(i, size), "size %zu octet %zu", size, i);
        CHECK(from.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && from.sin_port != 0, "source");
        send_to(fd, buf, size, &from); /* the echo reaches the client only if the source is right */
    }
    /* Truncation: exs_recv with 100 octets of a 1000-octet datagram. */
    memset(buf, 0, BIG);
    CHECK(exs_recv(fd, buf, 100, 0, q, AH(3), EXS_MHANDLE_UNREGISTERED) == 0, "recv short");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == 0 && ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 100,
          "short recv nbytes %zd", ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes);
    CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_flags & MSG_TRUNC, "MSG_TRUNC in the event");
    for (size_t i = 0; i < 100; i++) CHECK((unsigned char)buf[i] == pat(i, 1000), "trunc octet");
    CHECK(buf[100] == 0, "nothing past the receive's length");
    /* And with exs_recvmsg: 50 octets of the next one. */
    ssize_t n = recv_from(fd, buf, 50, &from, &flags);
    CHECK(n == 50 && (flags & MSG_TRUNC), "recvmsg short: %zd, flags %x", n, flags);
    /* Connected: the server fixes the client as its peer. */
    CHECK(exs_connect(fd, (struct sockaddr *)&from, sizeof from, q, AH(4)) == 0, "connect");
    ev = next(EXS_EVT_CONNECT);
    CHECK(ev.exs_evt_errno == 0, "connect event");
    struct sockaddr_in p;
    socklen_t pl = sizeof p;
    CHECK(exs_getpeername(fd, (struct sockaddr *)&p, &pl) == 0 && p.sin_port == from.sin_port,
          "peer name");
    send1(fd, "connected");
    recv1(fd, "reply");
    send1(fd, "after");
    recv1(fd, "bye");
    many(fd, 1, buf);
    CHECK(exs_close(fd) == 0, "close");
    if (!strcmp(mode, "wr")) blast_server(buf);
    fprintf(stderr, "server: ok\n");
    return 0;
}

static int client(int port) {
    CHECK(exs_init(EXS_VERSION) == 0, "init");
    q = exs_qcreate(16);
    /* Calls that cannot start. */
    int e = exs_socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(e >= 0, "socket");
    CHECK(exs_fcntl(e, EXS_F_SETDGRAM, EXS_DGRAM_WR) == 0, "set WR");
    CHECK(exs_fcntl(e, EXS_F_GETDGRAM) == EXS_DGRAM_WR, "WR set");
    CHECK(exs_fcntl(e, EXS_F_SETDGRAM, dmode) == 0, "back to this run's mode");
    FAILS(exs_fcntl(e, EXS_F_SETDGRAM, 7), EINVAL);
    FAILS(exs_fcntl(e, EXS_F_SETDGRAM, -1), EINVAL);
    FAILS(exs_fcntl(e, EXS_F_GETDGRAMSTAT, 5), EINVAL);
    FAILS(exs_fcntl(e, EXS_F_GETDGRAMSTAT, -1), EINVAL);
    CHECK(exs_fcntl(e, EXS_F_GETDGRAMSTAT, EXS_DGRAM_STAT_RECORDS_OUT) == 0, "no records yet");
    char x[16] = "x";
    FAILS(exs_send(e, x, 1, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), EDESTADDRREQ);
    FAILS(exs_listen(e, 1), EOPNOTSUPP);
    FAILS(exs_send(e, x, 1, EXS_PERSISTENT, q, AH(0), EXS_MHANDLE_UNREGISTERED), EOPNOTSUPP);
    struct sockaddr_in pa;
    socklen_t pl = sizeof pa;
    FAILS(exs_getpeername(e, (struct sockaddr *)&pa, &pl), ENOTCONN);
    bind_lo(e);
    FAILS(exs_fcntl(e, EXS_F_SETDGRAM, EXS_DGRAM_RD), EISCONN);
    FAILS(exs_fcntl(e, EXS_F_SETDGRAM, EXS_DGRAM_WR), EISCONN);
    char *huge = calloc(1, BIG + 1);
    struct sockaddr_in srv = lo(port);
    exs_iovec_t hv = {huge, BIG + 1, EXS_MHANDLE_UNREGISTERED};
    exs_msghdr_t hm;
    memset(&hm, 0, sizeof hm);
    hm.msg_name = &srv;
    hm.msg_namelen = sizeof srv;
    hm.msg_iov = &hv;
    hm.msg_iovlen = 1;
    FAILS(exs_sendmsg(e, &hm, 0, q, AH(0)), EMSGSIZE);
    /* exs_cancel: by handle, then by descriptor; each cancelled receive
     * ends with ECANCELED and its own handle. */
    char y[16], z[16];
    CHECK(exs_recv(e, x, sizeof x, 0, q, AH(11), EXS_MHANDLE_UNREGISTERED) == 0, "recv 11");
    CHECK(exs_recv(e, y, sizeof y, 0, q, AH(12), EXS_MHANDLE_UNREGISTERED) == 0, "recv 12");
    CHECK(exs_recv(e, z, sizeof z, 0, q, AH(13), EXS_MHANDLE_UNREGISTERED) == 0, "recv 13");
    CHECK(exs_cancel(e, AH(12), EXS_CAF_FILDES | EXS_CAF_AHANDLE) == 1, "cancel 12 by handle");
    exs_event_t cev = next(EXS_EVT_RECV);
    CHECK(cev.exs_evt_errno == ECANCELED && cev.exs_evt_ahandle == AH(12), "12 cancelled");
    CHECK(exs_cancel(e, AH(12), EXS_CAF_FILDES | EXS_CAF_AHANDLE) == 0, "12 is gone");
    CHECK(exs_cancel(e, AH(0), EXS_CAF_FILDES) == 2, "cancel the rest by descriptor");
    cev = next(EXS_EVT_RECV);
    exs_event_t cev2 = next(EXS_EVT_RECV);
    CHECK(cev.exs_evt_errno == ECANCELED && cev2.exs_evt_errno == ECANCELED &&
              ((cev.exs_evt_ahandle == AH(11) && cev2.exs_evt_ahandle == AH(13)) ||
               (cev.exs_evt_ahandle == AH(13) && cev2.exs_evt_ahandle == AH(11))),
          "11 and 13 cancelled");
    CHECK(exs_recv(e, x, sizeof x, 0, q, AH(14), EXS_MHANDLE_UNREGISTERED) == 0, "recv 14");
    CHECK(exs_cancel(-1, AH(14), EXS_CAF_AHANDLE) == 1, "cancel 14 by handle alone");
    cev = next(EXS_EVT_RECV);
    CHECK(cev.exs_evt_errno == ECANCELED && cev.exs_evt_ahandle == AH(14), "14 cancelled");
    /* A receive pending at close ends with ECANCELED. */
    CHECK(exs_recv(e, x, sizeof x, 0, q, AH(9), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_close(e) == 0, "close");
    exs_event_t ev = next(EXS_EVT_RECV);
    CHECK(ev.exs_evt_errno == ECANCELED && ev.exs_evt_ahandle == AH(9), "ECANCELED at close");

    int fd = dsocket();
    int me = bind_lo(fd);
    char *buf = malloc(BIG), *back = malloc(BIG);
    struct sockaddr_in from;
    int flags;
    for (size_t k = 0; k < NSIZES; k++) {
        size_t size = sizes[k];
        for (size_t i = 0; i < size; i++) buf[i] = (char)pat(i, size);
        send_to(fd, buf, size, &srv);
        memset(back, 0, size);
        ssize_t n = recv_from(fd, back, BIG, &from, &flags);
        CHECK(n == (ssize_t)size && memcmp(back, buf, size) == 0, "echo of %zu: %zd", size, n);
        CHECK(from.sin_port == htons((uint16_t)port) &&
                  from.sin_addr.s_addr == htonl(INADDR_LOOPBACK),
              "echo's source is the server");
    }
    fprintf(stderr, "sizes: %zu datagrams up to %d octets\n", NSIZES, BIG);
    for (size_t i = 0; i < 1000; i++) buf[i] = (char)pat(i, 1000);
    send_to(fd, buf, 1000, &srv);
    send_to(fd, buf, 1000, &srv);
    /* Connected. */
    CHECK(exs_connect(fd, (struct sockaddr *)&srv, sizeof srv, q, AH(4)) == 0, "connect");
    ev = next(EXS_EVT_CONNECT);
    CHECK(ev.exs_evt_errno == 0, "connect event");
    recv1(fd, "connected");
    /* A datagram from another socket is not the connected peer's. */
    int o = dsocket();
    struct sockaddr_in mine = lo(me);
    send_to(o, "stray", 5, &mine);
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    send1(fd, "reply");
    recv1(fd, "after");
    send1(fd, "bye");
    many(fd, 0, buf);
    CHECK(exs_close(o) == 0 && exs_close(fd) == 0, "close");
    if (!strcmp(mode, "wr")) blast_client(buf);
    fprintf(stderr, "client: ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "ud") && strcmp(argv[1], "rd") && strcmp(argv[1], "wr") &&
                     strcmp(argv[1], "wrmix"))) {
        fprintf(stderr, "usage: dgram_test ud|rd|wr|wrmix\n");
        return 2;
    }
    mode = argv[1];
    int cmode = !strcmp(mode, "rd") ? EXS_DGRAM_RD : !strcmp(mode, "ud") ? EXS_DGRAM_UD : EXS_DGRAM_WR;
    int smode = !strcmp(mode, "wrmix") ? EXS_DGRAM_UD : cmode;
    CHECK(pipe(s2c) == 0 && pipe(c2s) == 0, "pipe");
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        close(s2c[0]);
        close(c2s[1]);
        alarm(80);
        dmode = smode;
        _exit(server(s2c[1]));
    }
    close(s2c[1]);
    close(c2s[0]);
    dmode = cmode;
    int port = 0;
    CHECK(read(s2c[0], &port, sizeof port) == sizeof port, "server port");
    int rc = client(port);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "server status %d", st);
    return rc;
}
