/* The Open Group model of libexs.so, from C against sys/exs.h.
 * usage: exs_test calls | errors
 *        exs_test send-to PORT TOTAL SIZE    (netperf-like blast to a TCP sink)
 *        exs_test recv-from PORT TOTAL       (a TCP source sends TOTAL bytes)
 *        exs_test accept-from PORT TOTAL     (listens; a TCP client sends TOTAL)
 *        exs_test killed PORT                (the peer is killed mid-transfer)
 * The byte at stream offset i is (i * 7 + 3) & 255 in every transfer.
 * Exit 0 when every check holds; a failed check prints "FAIL line: ...". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <sys/exs.h>

#define CHECK(c, ...)                                                             \
    do {                                                                          \
        if (!(c)) {                                                               \
            int e_ = errno;                                                       \
            printf("FAIL %d: ", __LINE__);                                        \
            printf(__VA_ARGS__);                                                  \
            printf(" (errno %d %s)\n", e_, strerror(e_));                        \
            fflush(stdout);                                                       \
            exit(1);                                                              \
        }                                                                         \
    } while (0)
#define FAILS(call, err) CHECK((call) == -1 && errno == (err), "%s should fail with %s", #call, #err)
#define AH(x) ((exs_ahandle_t)(uintptr_t)(x))

static unsigned char pat(size_t i) { return (unsigned char)((i * 7 + 3) & 255); }
static void fill(unsigned char *b, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++) b[i] = pat(off + i);
}
static int same(const unsigned char *b, size_t off, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != pat(off + i)) return 0;
    return 1;
}

static exs_qhandle_t q;

/* One event, within 10 s; it must be of type and carry ah. */
static exs_event_t next(int type, exs_ahandle_t ah) {
    exs_event_t ev;
    struct timespec t = {10, 0};
    int r = exs_qdequeue(q, &ev, 1, &t);
    CHECK(r == 1, "dequeue returned %d waiting for type %d", r, type);
    CHECK(ev.exs_evt_type == type, "event type %d, expected %d (errno %d)", ev.exs_evt_type,
          type, ev.exs_evt_errno);
    CHECK(ev.exs_evt_ahandle == ah, "event ahandle %p, expected %p", ev.exs_evt_ahandle, ah);
    return ev;
}

static int nothing_ready(void) {
    exs_event_t ev;
    struct timespec z = {0, 0};
    return exs_qdequeue(q, &ev, 1, &z) == 0;
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static int listener(int port, struct sockaddr_in *out) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = loopback(port);
    socklen_t len = sizeof a;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 8) == 0, "listen");
    CHECK(getsockname(l, (struct sockaddr *)&a, &len) == 0, "getsockname");
    if (out) *out = a;
    return l;
}

/* A connected pair over loopback TCP, plain calls. */
static void pair(int *c, int *s) {
    struct sockaddr_in a;
    int l = listener(0, &a);
    *c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(connect(*c, (struct sockaddr *)&a, sizeof a) == 0, "connect");
    *s = accept(l, NULL, NULL);
    CHECK(*s >= 0, "accept");
    close(l);
}

static volatile sig_atomic_t signals;
static void on_signal(int s) {
    (void)s;
    signals++;
}

static int calls(void) {
    CHECK(exs_init(EXS_VERSION) == 0, "exs_init");
    CHECK(exs_init(EXS_VERSION) == 0, "exs_init again");
    FAILS(exs_init(EXS_VERSION + 41), EINVAL);
    q = exs_qcreate(64);
    CHECK(q != EXS_QHANDLE_INVALID && q >= 0, "qcreate");

    /* accept and connect, both asynchronous */
    struct sockaddr_in a;
    int l = listener(0, &a);
    exs_acceptaddr_t aa;
    memset(&aa, 0, sizeof aa);
    CHECK(exs_accept(l, &aa, SOCK_CLOEXEC, q, AH(1)) == 0, "exs_accept");
    CHECK(nothing_ready(), "accept completed with nobody connecting");
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(exs_connect(c, (struct sockaddr *)&a, sizeof a, q, AH(2)) == 0, "exs_connect");
    exs_event_t ev[4];
    struct timespec ten = {10, 0};
    CHECK(exs_qdequeue(q, ev, -2, &ten) == 2, "accept + connect events");
    int s = -1, got_connect = 0;
    for (int i = 0; i < 2; i++) {
        CHECK(ev[i].exs_evt_errno == 0, "event %d errno %d", ev[i].exs_evt_type, ev[i].exs_evt_errno);
        if (ev[i].exs_evt_type == EXS_EVT_ACCEPT) {
            CHECK(ev[i].exs_evt_ahandle == AH(1) && ev[i].exs_evt_fd == l, "accept event");
            CHECK(ev[i].exs_evt_union.exs_evt_accept.exs_evt_addr == &aa, "accept addr");
            s = ev[i].exs_evt_union.exs_evt_accept.exs_evt_newfd;
        } else {
            CHECK(ev[i].exs_evt_type == EXS_EVT_CONNECT && ev[i].exs_evt_ahandle == AH(2), "connect");
            CHECK(ev[i].exs_evt_fd == c, "connect fd");
            got_connect = 1;
        }
    }
    CHECK(s >= 0 && got_connect, "accepted fd %d", s);
    CHECK(aa.aa_addrlen == sizeof(struct sockaddr_in) &&
              ((struct sockaddr_in *)&aa.aa_addr)->sin_family == AF_INET, "peer address");
    CHECK(fcntl(s, F_GETFD) & FD_CLOEXEC, "SOCK_CLOEXEC applied");
    close(l);
    printf("accept/connect: ok\n");

    /* registered send and MSG_WAITALL receive of 512 KiB */
    size_t big = 1 << 20, half = big / 2;
    unsigned char *b = malloc(big);
    exs_mhandle_t mh = exs_mregister(b, big, 0);
    CHECK(mh != EXS_MHANDLE_INVALID && mh >= 0, "mregister");
    fill(b, 0, half);
    memset(b + half, 0, half);
    CHECK(exs_recv(s, b + half, half, MSG_WAITALL, q, AH(4), mh) == 0, "exs_recv");
    CHECK(exs_send(c, b, half, 0, q, AH(3), mh) == 0, "exs_send");
    CHECK(exs_qdequeue(q, ev, -2, &ten) == 2, "send + recv");
    for (int i = 0; i < 2; i++) {
        CHECK(ev[i].exs_evt_errno == 0, "xfer errno");
        CHECK(ev[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)half, "whole buffer");
        CHECK(ev[i].exs_evt_union.exs_evt_xfer.exs_evt_len == half, "len");
    }
    CHECK(same(b + half, 0, half), "512 KiB intact");
    printf("send/recv: ok\n");

    /* per-descriptor order: three sends, completions in call order */
    unsigned char three[3000], in[3000];
    fill(three, 0, sizeof three);
    for (int i = 0; i < 3; i++)
        CHECK(exs_send(c, three + 1000 * i, 1000, 0, q, AH(10 + i), EXS_MHANDLE_UNREGISTERED) == 0,
              "send %d", i);
    for (int i = 0; i < 3; i++) next(EXS_EVT_SEND, AH(10 + i));
    CHECK(exs_recv(s, in, sizeof in, MSG_WAITALL, q, AH(13), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    ev[0] = next(EXS_EVT_RECV, AH(13));
    CHECK(ev[0].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 3000 && same(in, 0, 3000), "order");
    printf("order: ok\n");

    /* sendmsg / recvmsg with registered and unregistered iovecs */
    exs_iovec_t siov[3] = {{b, 100, mh}, {three + 100, 900, EXS_MHANDLE_UNREGISTERED}, {b + 1000, 24, mh}};
    fill(b, 0, 100);
    fill(b + 1000, 1000, 24);
    exs_msghdr_t sm;
    memset(&sm, 0, sizeof sm);
    sm.msg_iov = siov;
    sm.msg_iovlen = 3;
    CHECK(exs_sendmsg(s, &sm, 0, q, AH(20)) == 0, "exs_sendmsg");
    memset(&sm, 0x55, sizeof sm); /* read during the call only */
    ev[0] = next(EXS_EVT_SENDMSG, AH(20));
    CHECK(ev[0].exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes == 1024, "sendmsg bytes");
    unsigned char r1[512], r2[512];
    exs_iovec_t riov[2] = {{r1, 512, EXS_MHANDLE_UNREGISTERED}, {r2, 512, EXS_MHANDLE_UNREGISTERED}};
    exs_msghdr_t rm;
    memset(&rm, 0, sizeof rm);
    rm.msg_iov = riov;
    rm.msg_iovlen = 2;
    rm.msg_flags = -1;
    CHECK(exs_recvmsg(c, &rm, MSG_WAITALL, q, AH(21)) == 0, "exs_recvmsg");
    ev[0] = next(EXS_EVT_RECVMSG, AH(21));
    CHECK(ev[0].exs_evt_union.exs_evt_xfermsg.exs_evt_msg == &rm, "recvmsg msg");
    CHECK(ev[0].exs_evt_union.exs_evt_xfermsg.exs_evt_nbytes == 1024, "recvmsg bytes");
    CHECK(same(r1, 0, 512) && same(r2, 512, 512) && rm.msg_flags == 0, "recvmsg data");
    printf("sendmsg/recvmsg: ok\n");

    /* sendfile: header from memory, a file range, trailer */
    const char *tmpdir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/exs-sendfile-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    int f = mkstemp(path);
    CHECK(f >= 0, "mkstemp");
    unlink(path);
    unsigned char *fb = malloc(200000);
    fill(fb, 0, 200000);
    CHECK(write(f, fb, 200000) == 200000, "write file");
    exs_xferfile_t xv[3];
    memset(xv, 0, sizeof xv);
    xv[0].xf_type = EXS_IOVEC;
    xv[0].xf_u.xf_iov.iov_base = (void *)"HDR:";
    xv[0].xf_u.xf_iov.iov_len = 4;
    xv[0].xf_u.xf_iov.iov_mhandle = EXS_MHANDLE_UNREGISTERED;
    xv[1].xf_type = EXS_FDVEC;
    xv[1].xf_u.xf_fdv.fdv_fd = f;
    xv[1].xf_u.xf_fdv.fdv_offset = 100;
    xv[1].xf_u.xf_fdv.fdv_len = 150000;
    xv[2] = xv[0];
    xv[2].xf_u.xf_iov.iov_base = (void *)":END";
    size_t sf = 4 + 150000 + 4;
    unsigned char *sr = malloc(sf);
    CHECK(exs_recv(s, sr, sf, MSG_WAITALL, q, AH(31), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_sendfile(c, xv, 3, 0, q, AH(30)) == 0, "exs_sendfile");
    CHECK(exs_qdequeue(q, ev, -2, &ten) == 2, "sendfile + recv");
    for (int i = 0; i < 2; i++) {
        CHECK(ev[i].exs_evt_errno == 0, "sendfile errno");
        if (ev[i].exs_evt_type == EXS_EVT_SENDFILE)
            CHECK(ev[i].exs_evt_union.exs_evt_xferfile.exs_evt_nbytes == (ssize_t)sf &&
                      ev[i].exs_evt_union.exs_evt_xferfile.exs_evt_count == 3, "sendfile bytes");
        else
            CHECK(ev[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)sf, "recv bytes");
    }
    CHECK(memcmp(sr, "HDR:", 4) == 0 && same(sr + 4, 100, 150000) &&
              memcmp(sr + 4 + 150000, ":END", 4) == 0, "sendfile data");
    close(f);
    printf("sendfile: ok\n");

    /* poll: pending until data arrives */
    exs_pollfd_t pf[2] = {{s, EXS_POLLIN, -1}, {c, EXS_POLLIN, -1}};
    CHECK(exs_poll(pf, 2, q, AH(40)) == 0, "exs_poll");
    usleep(20000);
    CHECK(nothing_ready(), "poll completed with nothing to read");
    CHECK(send(c, "x", 1, 0) == 1, "plain send");
    ev[0] = next(EXS_EVT_POLL, AH(40));
    CHECK(ev[0].exs_evt_union.exs_evt_poll.exs_evt_nready == 1 && ev[0].exs_evt_union.exs_evt_poll.exs_evt_fds == pf, "poll nready");
    CHECK((pf[0].revents & EXS_POLLIN) && pf[1].revents == 0, "revents %d %d", pf[0].revents, pf[1].revents);
    char x;
    CHECK(recv(s, &x, 1, 0) == 1 && x == 'x', "plain recv");
    pf[0].events = EXS_POLLOUT;
    CHECK(exs_poll(pf, 1, q, AH(41)) == 0, "exs_poll ready at once");
    ev[0] = next(EXS_EVT_POLL, AH(41));
    CHECK(pf[0].revents & EXS_POLLOUT, "POLLOUT");
    printf("poll: ok\n");

    /* cancel */
    CHECK(exs_recv(s, in, 10, 0, q, AH(50), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_recv(s, in, 10, 0, q, AH(51), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_cancel(s, AH(51), EXS_CAF_FILDES | EXS_CAF_AHANDLE) == 1, "cancel one by ahandle");
    ev[0] = next(EXS_EVT_RECV, AH(51));
    CHECK(ev[0].exs_evt_errno == ECANCELED, "ECANCELED");
    CHECK(exs_cancel(s, NULL, EXS_CAF_FILDES) == 1, "cancel by descriptor");
    ev[0] = next(EXS_EVT_RECV, AH(50));
    CHECK(ev[0].exs_evt_errno == ECANCELED, "ECANCELED");
    CHECK(exs_cancel(s, NULL, EXS_CAF_FILDES) == 0, "nothing left to cancel");
    pf[0].events = EXS_POLLIN;
    CHECK(exs_poll(pf, 1, q, AH(52)) == 0, "poll");
    CHECK(exs_cancel(-1, AH(52), EXS_CAF_AHANDLE) == 1, "cancel a poll by ahandle");
    ev[0] = next(EXS_EVT_POLL, AH(52));
    CHECK(ev[0].exs_evt_errno == ECANCELED, "poll ECANCELED");
    FAILS(exs_cancel(s, NULL, 0), EINVAL);
    printf("cancel: ok\n");

    /* queue attributes */
    int v = 0;
    CHECK(exs_qgetattr(q, EXS_QATTR_DEPTH, &v) == 0 && v == 64, "depth %d", v);
    v = 128;
    CHECK(exs_qsetattr(q, EXS_QATTR_DEPTH, &v) == 0, "set depth");
    CHECK(exs_qgetattr(q, EXS_QATTR_DEPTH, &v) == 0 && v == 128, "depth now %d", v);
    CHECK(exs_qgetattr(q, EXS_QATTR_EVENTS, &v) == 0 && v == 0, "events %d", v);
    FAILS(exs_qsetattr(q, EXS_QATTR_EVENTS, &v), EINVAL);
    v = EXS_WAIT_ADAPTIVE;
    CHECK(exs_qsetattr(q, EXS_QATTR_WAIT, &v) == 0, "wait adaptive");
    v = 9;
    FAILS(exs_qsetattr(q, EXS_QATTR_WAIT, &v), EINVAL);
    signal(SIGUSR1, on_signal);
    exs_signal_t sg = {EXS_SIG_ENABLE, SIGUSR1};
    CHECK(exs_qsetattr(q, EXS_QATTR_SIGNAL, &sg) == 0, "signal");
    CHECK(exs_send(c, "y", 1, 0, q, AH(60), EXS_MHANDLE_UNREGISTERED) == 0, "send");
    next(EXS_EVT_SEND, AH(60));
    for (int i = 0; i < 100 && !signals; i++) usleep(1000);
    CHECK(signals >= 1, "SIGUSR1 raised per event");
    sg.exs_sig_mode = EXS_SIG_DISABLE;
    CHECK(exs_qsetattr(q, EXS_QATTR_SIGNAL, &sg) == 0, "signal off");
    CHECK(exs_qgetattr(q, EXS_QATTR_SIGNAL, &sg) == 0 && sg.exs_sig_mode == EXS_SIG_DISABLE, "get signal");
    CHECK(recv(s, &x, 1, 0) == 1 && x == 'y', "plain recv");
    printf("attributes: ok\n");

    /* socket options */
    int one = 1;
    socklen_t ol = sizeof v;
    CHECK(exs_setsockopt(s, SOL_SOCKET, SO_ASYNC_RECV_ORDERED, &one, sizeof one) == 0, "ordered");
    v = 0;
    CHECK(exs_getsockopt(s, SOL_SOCKET, SO_ASYNC_RECV_ORDERED, &v, &ol) == 0 && v == 1, "ordered get");
    struct timespec ts = {1, 0};
    FAILS(exs_setsockopt(s, SOL_SOCKET, SO_ASYNC_SEND_TIMEOUT, &ts, sizeof ts), ENOPROTOOPT);
    CHECK(exs_setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one) == 0, "passthrough");
    ol = sizeof v;
    CHECK(getsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &v, &ol) == 0 && v == 1, "keepalive set");
    printf("sockopt: ok\n");

    /* shutdown behind a send; the peer sees the data then end of stream */
    CHECK(exs_send(c, three, 1000, 0, q, AH(70), EXS_MHANDLE_UNREGISTERED) == 0, "send");
    CHECK(exs_shutdown(c, EXS_SHUT_WR, q, AH(71)) == 0, "exs_shutdown");
    next(EXS_EVT_SEND, AH(70));
    ev[0] = next(EXS_EVT_SHUTDOWN, AH(71));
    CHECK(ev[0].exs_evt_errno == 0 && ev[0].exs_evt_fd == c, "shutdown ok");
    CHECK(exs_recv(s, in, 1000, MSG_WAITALL, q, AH(72), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_recv(s, in + 1000, 10, 0, q, AH(73), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    ev[0] = next(EXS_EVT_RECV, AH(72));
    CHECK(ev[0].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 1000 && same(in, 0, 1000), "data before FIN");
    ev[0] = next(EXS_EVT_RECV, AH(73));
    CHECK(ev[0].exs_evt_errno == 0 && ev[0].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0, "end of stream");
    FAILS(exs_shutdown(c, 7, q, AH(0)), EINVAL);
    printf("shutdown: ok\n");

    /* asynchronous close after a send; a pending receive is cancelled */
    int c3, s3;
    pair(&c3, &s3);
    CHECK(exs_recv(s3, in, 10, 0, q, AH(82), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_send(s3, "bye", 3, 0, q, AH(80), EXS_MHANDLE_UNREGISTERED) == 0, "send");
    CHECK(exs_aclose(s3, q, AH(81)) == 0, "exs_aclose");
    CHECK(exs_qdequeue(q, ev, -3, &ten) == 3, "three events");
    int seen = 0;
    for (int i = 0; i < 3; i++) {
        if (ev[i].exs_evt_ahandle == AH(80)) {
            CHECK(ev[i].exs_evt_errno == 0 && seen == 0, "send first");
            seen |= 1;
        }
        if (ev[i].exs_evt_ahandle == AH(82)) {
            CHECK(ev[i].exs_evt_errno == ECANCELED, "recv cancelled");
            seen |= 2;
        }
        if (ev[i].exs_evt_ahandle == AH(81)) {
            CHECK(ev[i].exs_evt_type == EXS_EVT_CLOSE && ev[i].exs_evt_errno == 0 && (seen & 1), "close last");
            seen |= 4;
        }
    }
    CHECK(seen == 7, "send, recv, close events");
    CHECK(fcntl(s3, F_GETFD) == -1 && errno == EBADF, "closed");
    char bye[4] = {0};
    CHECK(recv(c3, bye, 3, MSG_WAITALL) == 3 && strcmp(bye, "bye") == 0, "bye");
    CHECK(recv(c3, bye, 3, 0) == 0, "EOF after close");
    printf("aclose: ok\n");

    /* synchronous close cancels what is outstanding */
    int c2, s2;
    pair(&c2, &s2);
    CHECK(exs_recv(s2, in, 10, 0, q, AH(90), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    CHECK(exs_close(s2) == 0, "exs_close");
    ev[0] = next(EXS_EVT_RECV, AH(90));
    CHECK(ev[0].exs_evt_errno == ECANCELED, "cancelled by exs_close");
    FAILS(exs_close(s2), EBADF);
    CHECK(exs_close(c) == 0 && exs_close(c2) == 0 && exs_close(c3) == 0, "close");
    close(s);
    printf("close: ok\n");

    CHECK(exs_mderegister(mh) == 0, "mderegister");
    FAILS(exs_mderegister(mh), EINVAL);
    CHECK(exs_qdelete(q) == 0, "qdelete");
    FAILS(exs_qdelete(q), EINVAL);
    printf("deregister/qdelete: ok\n");

    /* the RDMA model's calls refuse kernel descriptors */
    struct sockaddr_in z = loopback(1);
    socklen_t zl = sizeof z;
    int k = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(k >= 0, "socket");
    FAILS(exs_bind(k, (struct sockaddr *)&z, zl), ENOTSOCK);
    FAILS(exs_listen(k, 1), ENOTSOCK);
    FAILS(exs_fcntl(k, F_GETFL), ENOTSOCK);
    FAILS(exs_getsockname(k, (struct sockaddr *)&z, &zl), ENOTSOCK);
    FAILS(exs_getpeername(9999, (struct sockaddr *)&z, &zl), EBADF);
    FAILS(exs_send_offset(k, b, 1, 0, 0, 0, AH(0), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
    FAILS(exs_recv_offset(9999, b, 1, 0, 0, 0, AH(0), EXS_MHANDLE_UNREGISTERED), EBADF);
    FAILS(exs_socket(AF_UNIX, SOCK_SEQPACKET, 0), EAFNOSUPPORT);
    close(k);
    printf("rdma model on kernel descriptors: ok\n");
    printf("calls: all ok\n");
    return 0;
}

static void on_alarm(int s) { (void)s; }

static int errors(void) {
    q = exs_qcreate(2);
    CHECK(q >= 0, "qcreate");
    int c, s;
    pair(&c, &s);
    unsigned char buf[4096];
    exs_mhandle_t mh = exs_mregister(buf, 1024, 0);
    CHECK(mh >= 0, "mregister");

    FAILS(exs_qcreate(0), EINVAL);
    CHECK(exs_qcreate(-5) == EXS_QHANDLE_INVALID, "invalid handle");
    FAILS(exs_qcreate(EXS_EVTVEC_MAX + 1), EINVAL);
    CHECK(exs_mregister(NULL, 10, 0) == EXS_MHANDLE_INVALID && errno == EFAULT, "mregister NULL");
    FAILS(exs_mregister(buf, 0, 0), EINVAL);
    FAILS(exs_mregister(buf, 10, 0x100), EINVAL);
    void *gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(gone, 8192);
    FAILS(exs_mregister(gone, 8192, 0), EFAULT);
    FAILS(exs_mderegister(12345), EINVAL);

    /* bad descriptors and handles */
    FAILS(exs_send(-1, buf, 1, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), EBADF);
    FAILS(exs_send(999, buf, 1, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), EBADF);
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    FAILS(exs_recv(p[0], buf, 1, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), ENOTSOCK);
    FAILS(exs_send(c, buf, 1, 0, q + 77, AH(0), EXS_MHANDLE_UNREGISTERED), EINVAL);
    FAILS(exs_send(c, buf, 1, 0, EXS_QHANDLE_INVALID, AH(0), EXS_MHANDLE_UNREGISTERED), EINVAL);
    exs_event_t ev[4];
    FAILS(exs_qdequeue(q + 77, ev, 1, NULL), EINVAL);
    /* buffers outside their registration */
    FAILS(exs_send(c, buf + 1000, 100, 0, q, AH(0), mh), EINVAL);
    FAILS(exs_recv(c, buf + 2000, 1, 0, q, AH(0), mh), EINVAL);
    FAILS(exs_send(c, buf - 1, 10, 0, q, AH(0), mh), EINVAL);
    FAILS(exs_send(c, buf, 1, 0, q, AH(0), mh + 99), EINVAL);
    FAILS(exs_send(c, buf, 1, 0, q, AH(0), EXS_MHANDLE_INVALID), EINVAL);
    exs_iovec_t iov[2] = {{buf, 10, mh}, {buf + 1020, 10, mh}};
    exs_msghdr_t m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    FAILS(exs_sendmsg(c, &m, 0, q, AH(0)), EINVAL);
    m.msg_iovlen = -1;
    FAILS(exs_sendmsg(c, &m, 0, q, AH(0)), EINVAL);
    FAILS(exs_sendmsg(c, NULL, 0, q, AH(0)), EFAULT);
    FAILS(exs_send(c, NULL, 5, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), EFAULT);
    /* flags */
    FAILS(exs_send(c, buf, 1, MSG_PEEK, q, AH(0), EXS_MHANDLE_UNREGISTERED), EINVAL);
    FAILS(exs_recv(c, buf, 1, MSG_MORE, q, AH(0), EXS_MHANDLE_UNREGISTERED), EINVAL);
    FAILS(exs_send(c, buf, 1, EXS_PERSISTENT, q, AH(0), EXS_MHANDLE_UNREGISTERED), EOPNOTSUPP);
    FAILS(exs_accept(c, NULL, 0x4000000, q, AH(0)), EINVAL);
    FAILS(exs_sendfile(c, NULL, 1, 0, q, AH(0)), EFAULT);
    exs_xferfile_t xf;
    memset(&xf, 0, sizeof xf);
    xf.xf_type = 9;
    FAILS(exs_sendfile(c, &xf, 1, 0, q, AH(0)), EINVAL);
    xf.xf_type = EXS_FDVEC;
    xf.xf_u.xf_fdv.fdv_fd = 998;
    FAILS(exs_sendfile(c, &xf, 1, 0, q, AH(0)), EBADF);
    FAILS(exs_poll(NULL, 1, q, AH(0)), EFAULT);
    exs_pollfd_t pf = {c, EXS_POLLIN, 0};
    FAILS(exs_poll(&pf, 0, q, AH(0)), EINVAL);
    FAILS(exs_connect(c, NULL, 16, q, AH(0)), EFAULT);
    struct sockaddr_in a = loopback(1);
    FAILS(exs_connect(c, (struct sockaddr *)&a, sizeof a, q, AH(0)), EISCONN);
    printf("bad arguments: ok\n");

    /* qdequeue arguments and timeouts */
    struct timespec zero = {0, 0}, bad = {0, 2000000000L}, fifty = {0, 50000000L};
    CHECK(exs_qdequeue(q, ev, 0, NULL) == 0, "n == 0 returns at once");
    FAILS(exs_qdequeue(q, NULL, 1, &zero), EFAULT);
    FAILS(exs_qdequeue(q, ev, 1, &bad), EINVAL);
    FAILS(exs_qdequeue(q, ev, EXS_EVTVEC_MAX + 1, &zero), EINVAL);
    CHECK(exs_qdequeue(q, ev, 4, &zero) == 0, "{0,0} never blocks");
    struct timeval t0, t1;
    gettimeofday(&t0, NULL);
    CHECK(exs_qdequeue(q, ev, -1, &fifty) == 0, "timeout");
    gettimeofday(&t1, NULL);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_usec - t0.tv_usec) / 1000;
    CHECK(ms >= 45 && ms < 2000, "waited %ld ms", ms);
    /* EINTR: a signal ends a wait without a timeout */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 0}, {0, 100000}};
    setitimer(ITIMER_REAL, &it, NULL);
    FAILS(exs_qdequeue(q, ev, 1, NULL), EINTR);
    printf("qdequeue: ok\n");

    /* the queue is full: two slots, each held until dequeued */
    CHECK(exs_recv(s, buf, 1, 0, q, AH(1), mh) == 0, "first");
    CHECK(exs_recv(s, buf + 1, 1, 0, q, AH(2), mh) == 0, "second");
    FAILS(exs_recv(s, buf + 2, 1, 0, q, AH(3), mh), EAGAIN);
    FAILS(exs_mderegister(mh), EBUSY);
    FAILS(exs_qdelete(q), EBUSY);
    int depth = 1;
    FAILS(exs_qsetattr(q, EXS_QATTR_DEPTH, &depth), EBUSY);
    CHECK(send(c, "ab", 2, 0) == 2, "plain send");
    CHECK(exs_qdequeue(q, ev, -2, NULL) == 2, "two events");
    CHECK(ev[0].exs_evt_ahandle == AH(1) && ev[1].exs_evt_ahandle == AH(2), "in order");
    CHECK(buf[0] == 'a' && buf[1] == 'b', "data");
    CHECK(exs_recv(s, buf + 2, 1, 0, q, AH(3), mh) == 0, "a slot is free again");
    CHECK(exs_cancel(s, NULL, EXS_CAF_FILDES) == 1, "cancel");
    CHECK(exs_qdequeue(q, ev, 1, NULL) == 1 && ev[0].exs_evt_errno == ECANCELED, "cancelled");
    printf("queue full: ok\n");

    /* a buffer the kernel cannot read: the event says EFAULT, nothing crashes */
    CHECK(exs_send(c, (void *)16, 100, 0, q, AH(5), EXS_MHANDLE_UNREGISTERED) == 0, "queued");
    CHECK(exs_qdequeue(q, ev, 1, NULL) == 1, "event");
    CHECK(ev[0].exs_evt_errno == EFAULT && ev[0].exs_evt_ahandle == AH(5), "EFAULT in the event (%d)", ev[0].exs_evt_errno);
    /* a refused connection is the event's error */
    int d = socket(AF_INET, SOCK_STREAM, 0);
    int l = listener(0, &a);
    close(l); /* nobody listens on that port now */
    CHECK(exs_connect(d, (struct sockaddr *)&a, sizeof a, q, AH(6)) == 0, "connect queued");
    CHECK(exs_qdequeue(q, ev, 1, NULL) == 1 && ev[0].exs_evt_type == EXS_EVT_CONNECT, "connect event");
    CHECK(ev[0].exs_evt_errno == ECONNREFUSED, "ECONNREFUSED (%d)", ev[0].exs_evt_errno);
    close(d);
    printf("late failures: ok\n");
    CHECK(exs_mderegister(mh) == 0 && exs_qdelete(q) == 0, "cleanup");
    printf("errors: all ok\n");
    return 0;
}

static int dial(int port) {
    struct sockaddr_in a = loopback(port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(exs_connect(fd, (struct sockaddr *)&a, sizeof a, q, AH(-2)) == 0, "exs_connect");
    exs_event_t ev = next(EXS_EVT_CONNECT, AH(-2));
    CHECK(ev.exs_evt_errno == 0, "connect errno %d", ev.exs_evt_errno);
    return fd;
}

/* netperf's EXS_TCP_STREAM loop: up to 16 sends in flight, dequeue half. */
static int send_to(int port, size_t total, size_t size) {
    CHECK(exs_init(EXS_VERSION) == 0, "init");
    q = exs_qcreate(128);
    int fd = dial(port);
    unsigned char *b = malloc(total);
    fill(b, 0, total);
    exs_mhandle_t mh = exs_mregister(b, total, 0);
    CHECK(mh >= 0, "mregister");
    exs_event_t evs[128];
    size_t off = 0, sent = 0;
    int pending = 0, eagain = 0;
    while (off < total) {
        while (pending < 16 && off < total) {
            size_t n = total - off < size ? total - off : size;
            if (exs_send(fd, b + off, n, 0, q, AH(off), mh) != 0) {
                CHECK(errno == EAGAIN, "exs_send");
                eagain++;
                break;
            }
            pending++;
            off += n;
        }
        int got = exs_qdequeue(q, evs, -(pending >> 1), NULL);
        CHECK(got >= 0, "dequeue");
        for (int i = 0; i < got; i++) {
            CHECK(evs[i].exs_evt_errno == 0, "send errno %d", evs[i].exs_evt_errno);
            CHECK((size_t)(uintptr_t)evs[i].exs_evt_ahandle == sent, "send completions in order");
            sent += (size_t)evs[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
        }
        pending -= got;
    }
    int got = exs_qdequeue(q, evs, -pending, NULL);
    CHECK(got == pending, "last events");
    for (int i = 0; i < got; i++) sent += (size_t)evs[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
    CHECK(sent == total, "sent %zu of %zu", sent, total);
    CHECK(exs_shutdown(fd, EXS_SHUT_WR, q, AH(-3)) == 0, "shutdown");
    next(EXS_EVT_SHUTDOWN, AH(-3));
    /* the sink answers with its count, then closes */
    char line[64] = {0};
    CHECK(exs_recv(fd, line, sizeof line - 1, 0, q, AH(-4), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    exs_event_t ev = next(EXS_EVT_RECV, AH(-4));
    CHECK(ev.exs_evt_errno == 0, "recv answer");
    printf("sent %zu bytes in sends of %zu (%d EAGAIN); sink says: %s\n", sent, size, eagain, line);
    CHECK(exs_close(fd) == 0 && exs_mderegister(mh) == 0 && exs_qdelete(q) == 0, "cleanup");
    return 0;
}

/* Eight receives in flight; data checked in completion order. */
static size_t receive_all(int fd) {
    enum { K = 8, SZ = 65536 };
    unsigned char *ring = malloc((size_t)K * SZ);
    exs_mhandle_t mh = exs_mregister(ring, (size_t)K * SZ, 0);
    CHECK(mh >= 0, "mregister");
    for (int i = 0; i < K; i++)
        CHECK(exs_recv(fd, ring + (size_t)i * SZ, SZ, 0, q, AH(i), mh) == 0, "recv %d", i);
    size_t got = 0;
    int outstanding = K, eof = 0, next_slot = 0;
    while (outstanding > 0) {
        exs_event_t ev = next(EXS_EVT_RECV, AH(next_slot));
        outstanding--;
        CHECK(ev.exs_evt_errno == 0, "recv errno %d", ev.exs_evt_errno);
        ssize_t n = ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
        unsigned char *slot = ring + (size_t)next_slot * SZ;
        CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_buf == slot, "buffer");
        if (n == 0) {
            eof = 1;
        } else {
            CHECK(!eof, "data after end of stream");
            CHECK(same(slot, got, (size_t)n), "bytes %zu..%zu", got, got + (size_t)n);
            got += (size_t)n;
            CHECK(exs_recv(fd, slot, SZ, 0, q, AH(next_slot), mh) == 0, "recv again");
            outstanding++;
        }
        next_slot = (next_slot + 1) % K;
    }
    CHECK(exs_mderegister(mh) == 0, "mderegister");
    free(ring);
    return got;
}

static int recv_from(int port, size_t total, int do_accept) {
    q = exs_qcreate(64);
    CHECK(q >= 0, "qcreate");
    int fd;
    if (do_accept) {
        int l = listener(port, NULL);
        printf("listening\n");
        fflush(stdout);
        exs_acceptaddr_t aa;
        CHECK(exs_accept(l, &aa, 0, q, AH(-1)) == 0, "exs_accept");
        exs_event_t ev = next(EXS_EVT_ACCEPT, AH(-1));
        CHECK(ev.exs_evt_errno == 0, "accept errno");
        fd = ev.exs_evt_union.exs_evt_accept.exs_evt_newfd;
        close(l);
    } else {
        fd = dial(port);
    }
    size_t got = receive_all(fd);
    CHECK(got == total, "received %zu of %zu", got, total);
    CHECK(exs_send(fd, "thanks\n", 7, 0, q, AH(-5), EXS_MHANDLE_UNREGISTERED) == 0, "send");
    exs_event_t ev = next(EXS_EVT_SEND, AH(-5));
    CHECK(ev.exs_evt_errno == 0, "send errno");
    CHECK(exs_aclose(fd, q, AH(-6)) == 0, "aclose");
    next(EXS_EVT_CLOSE, AH(-6));
    printf("received %zu bytes intact\n", got);
    return 0;
}

/* Queues more than the socket buffers hold plus a receive; the test
 * kills the peer, and every outstanding operation must complete. */
static int killed(int port) {
    q = exs_qcreate(256);
    int fd = dial(port);
    int small = 65536;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    size_t sz = 1 << 20;
    int nsend = 32;
    unsigned char *b = malloc(sz);
    fill(b, 0, sz);
    char in[16];
    CHECK(exs_recv(fd, in, sizeof in, 0, q, AH(1000), EXS_MHANDLE_UNREGISTERED) == 0, "recv");
    for (int i = 0; i < nsend; i++)
        CHECK(exs_send(fd, b, sz, 0, q, AH(i), EXS_MHANDLE_UNREGISTERED) == 0, "send %d", i);
    printf("queued\n");
    fflush(stdout);
    exs_event_t evs[64];
    int total = 0, reset = 0, ok = 0, recv_reset = 0, partial = 0;
    struct timespec t = {20, 0};
    while (total < nsend + 1) {
        int n = exs_qdequeue(q, evs, 64, &t);
        CHECK(n > 0, "events stopped after %d of %d", total, nsend + 1);
        for (int i = 0; i < n; i++) {
            int e = evs[i].exs_evt_errno;
            if (e == 0) {
                ok++;
                CHECK(evs[i].exs_evt_type == EXS_EVT_SEND, "only sends succeed");
            } else {
                CHECK(e == ECONNRESET, "outstanding op ended with errno %d, expected ECONNRESET", e);
                reset++;
                if (evs[i].exs_evt_type == EXS_EVT_RECV) recv_reset = 1;
                ssize_t nb = evs[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes;
                if (evs[i].exs_evt_type == EXS_EVT_SEND && nb > 0) partial++;
            }
        }
        total += n;
    }
    CHECK(reset >= 1 && recv_reset, "the receive and the unsent sends end with ECONNRESET");
    FAILS(exs_send(fd, b, 10, 0, q, AH(0), EXS_MHANDLE_UNREGISTERED), ECONNRESET);
    printf("peer killed: %d sends done, %d operations ECONNRESET (%d partly sent)\n", ok, reset, partial);
    CHECK(exs_close(fd) == 0, "close");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 2 && strcmp(argv[1], "calls") == 0) return calls();
    if (argc >= 2 && strcmp(argv[1], "errors") == 0) return errors();
    if (argc == 5 && strcmp(argv[1], "send-to") == 0)
        return send_to(atoi(argv[2]), strtoul(argv[3], NULL, 10), strtoul(argv[4], NULL, 10));
    if (argc == 4 && strcmp(argv[1], "recv-from") == 0)
        return recv_from(atoi(argv[2]), strtoul(argv[3], NULL, 10), 0);
    if (argc == 4 && strcmp(argv[1], "accept-from") == 0)
        return recv_from(atoi(argv[2]), strtoul(argv[3], NULL, 10), 1);
    if (argc == 3 && strcmp(argv[1], "killed") == 0) return killed(atoi(argv[2]));
    fprintf(stderr, "usage: see the comment at the top\n");
    return 2;
}
