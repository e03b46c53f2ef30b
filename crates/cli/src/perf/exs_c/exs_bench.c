/* The programs of `softrdma perf exs`: one executable, built at run time
 * against sys/exs.h and libexs.so. It forks before its first exs_* call;
 * the child is the server (it listens on 127.0.0.1, port 0, and tells
 * the parent the port through a pipe), the parent the client.
 *
 *   exs_bench lat KIND N          RDMA model ping-pong, SOCK_SEQPACKET, at
 *                                 1, 10 and 100 B: KIND normal (small-packet
 *                                 size 0), immediate (the default small-
 *                                 packet size) or persistent (EXS_PERSISTENT
 *                                 on every send and receive). Prints
 *                                 "lat KIND SIZE US" (one-way microseconds),
 *                                 or "notbuilt KIND REASON" when the library
 *                                 answers EOPNOTSUPP.
 *   exs_bench rdma SIZE BYTES     RDMA model blast: BYTES in SIZE messages,
 *                                 a window of them in flight
 *   exs_bench tcp SIZE BYTES      raw TCP: blocking send(2) of SIZE octets in
 *                                 a loop into a recv(2) sink
 *   exs_bench og SIZE BYTES DEPTH the Open Group model: exs_send on a kernel
 *                                 TCP socket, DEPTH sends in flight, events
 *                                 taken with exs_qdequeue, into the same sink
 *
 * A transfer ends when the receiver, having every octet, answers one
 * octet; the client prints "xfer MODE SIZE BYTES SECONDS" (first send to
 * that answer), and each side prints "cpu SIDE CPU_SECONDS WALL_SECONDS"
 * (getrusage user + system of the whole process over its part of the
 * transfer). Any failure prints "FAIL ..." on stderr and exits 1. Both
 * processes arm alarm(DEADLINE) (EXS_BENCH_DEADLINE seconds, default 60)
 * and the child dies with its parent (PR_SET_PDEATHSIG). */
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
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c, ...)                                                                 \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "FAIL %s (%s:%d): ", side, __FILE__, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));            \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)
#define AH(x) ((exs_ahandle_t)(uintptr_t)(x))

static const char *side = "client";
static exs_qhandle_t q = EXS_QHANDLE_INVALID;
/* The buffer ring of a blast is at most this large per side. */
#define RING_MAX (64u << 20)
#define WINDOW_MAX 64

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
           (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static struct sockaddr_in lo(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static exs_event_t next(int type) {
    exs_event_t ev;
    struct timespec t = {20, 0};
    int n = exs_qdequeue(q, &ev, 1, &t);
    CHECK(n == 1, "no event in 20 s (waiting for type %d)", type);
    CHECK(ev.exs_evt_type == type, "event type %d, expected %d", ev.exs_evt_type, type);
    errno = ev.exs_evt_errno;
    CHECK(ev.exs_evt_errno == 0, "event type %d failed", type);
    return ev;
}

/* ---------------------------------------------------------------- */
/* RDMA model connections                                           */

static void init_q(void) {
    CHECK(exs_init(EXS_VERSION) == 0, "exs_init");
    q = exs_qcreate(1024);
    CHECK(q != EXS_QHANDLE_INVALID, "exs_qcreate");
}

static int rdma_serve(int wfd) {
    init_q();
    int l = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    CHECK(l >= 0, "exs_socket");
    struct sockaddr_in a = lo(0);
    CHECK(exs_bind(l, (struct sockaddr *)&a, sizeof a) == 0, "exs_bind");
    CHECK(exs_listen(l, 4) == 0, "exs_listen");
    socklen_t al = sizeof a;
    CHECK(exs_getsockname(l, (struct sockaddr *)&a, &al) == 0, "exs_getsockname");
    int port = ntohs(a.sin_port);
    CHECK(write(wfd, &port, sizeof port) == sizeof port, "tell the port");
    CHECK(exs_accept(l, NULL, 0, q, AH(1)) == 0, "exs_accept");
    exs_event_t ev = next(EXS_EVT_ACCEPT);
    int fd = ev.exs_evt_union.exs_evt_accept.exs_evt_newfd;
    CHECK(exs_close(l) == 0, "close the listener");
    return fd;
}

static int rdma_dial(int port, int small) {
    init_q();
    int fd = exs_socket(AF_INET, SOCK_SEQPACKET, 0);
    CHECK(fd >= 0, "exs_socket");
    if (small >= 0) CHECK(exs_fcntl(fd, EXS_F_SETSMALL, small) == 0, "EXS_F_SETSMALL");
    struct sockaddr_in a = lo(port);
    CHECK(exs_connect(fd, (struct sockaddr *)&a, sizeof a, q, AH(2)) == 0, "exs_connect");
    next(EXS_EVT_CONNECT);
    return fd;
}

/* ---------------------------------------------------------------- */
/* Latency                                                          */

static const size_t lat_sizes[] = {1, 10, 100};

static void not_built(const char *kind) {
    printf("notbuilt %s exs_send/exs_recv with EXS_PERSISTENT: %s\n", kind, strerror(errno));
    exit(0);
}

/* A send's and a receive's events, in either order (an immediate send
 * completes when its message left, which the reply may overtake). */
static void both(void) {
    exs_event_t ev[2];
    int got = 0;
    while (got < 2) {
        struct timespec t = {20, 0};
        int n = exs_qdequeue(q, ev + got, 2 - got, &t);
        CHECK(n > 0, "ping-pong stalled");
        got += n;
    }
    errno = ev[0].exs_evt_errno ? ev[0].exs_evt_errno : ev[1].exs_evt_errno;
    CHECK(ev[0].exs_evt_type != ev[1].exs_evt_type && ev[0].exs_evt_errno == 0 &&
              ev[1].exs_evt_errno == 0,
          "ping-pong events");
}

static void pingpong(int fd, int client, long n, unsigned char *b, exs_mhandle_t mh,
                     const char *kind, int flags) {
    for (unsigned s = 0; s < sizeof lat_sizes / sizeof lat_sizes[0]; s++) {
        size_t len = lat_sizes[s];
        double t0 = 0;
        for (long i = -100; i < n; i++) {
            if (i == 0) t0 = now_s();
            if (exs_recv(fd, b + 4096, len, flags, q, AH(1), mh) != 0) {
                if (errno == EOPNOTSUPP && flags) not_built(kind);
                CHECK(0, "exs_recv");
            }
            if (client) {
                if (exs_send(fd, b, len, flags, q, AH(2), mh) != 0) {
                    if (errno == EOPNOTSUPP && flags) not_built(kind);
                    CHECK(0, "exs_send");
                }
                both();
            } else {
                next(EXS_EVT_RECV);
                if (exs_send(fd, b, len, flags, q, AH(2), mh) != 0) {
                    if (errno == EOPNOTSUPP && flags) not_built(kind);
                    CHECK(0, "exs_send");
                }
                next(EXS_EVT_SEND);
            }
        }
        if (client)
            printf("lat %s %zu %.3f\n", kind, len, (now_s() - t0) * 1e6 / (double)n / 2);
    }
}

/* Persistent: the server sends one 100-octet block with EXS_PERSISTENT
 * and stays passive until the client closes; each of the client's
 * receives is then one RDMA Read of that block, whose round trip, halved,
 * is the one-way figure (the server's CPU takes no part). */
static void persistent_lat(int fd, int client, long n, unsigned char *b, exs_mhandle_t mh) {
    if (!client) {
        memset(b, 5, 100);
        if (exs_send(fd, b, 100, EXS_PERSISTENT, q, AH(3), mh) != 0) {
            if (errno == EOPNOTSUPP) not_built("persistent");
            CHECK(0, "persistent exs_send");
        }
        next(EXS_EVT_SEND);
        CHECK(exs_recv(fd, b + 4096, 1, 0, q, AH(4), mh) == 0, "exs_recv (the close)");
        exs_event_t ev = next(EXS_EVT_RECV);
        CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == 0, "end of stream");
        return;
    }
    for (unsigned s = 0; s < sizeof lat_sizes / sizeof lat_sizes[0]; s++) {
        size_t len = lat_sizes[s];
        double t0 = 0;
        for (long i = -100; i < n; i++) {
            if (i == 0) t0 = now_s();
            CHECK(exs_recv(fd, b + 4096, len, 0, q, AH(1), mh) == 0, "exs_recv (pull)");
            exs_event_t ev = next(EXS_EVT_RECV);
            CHECK(ev.exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (long)len, "pulled %zu", len);
        }
        CHECK(b[4096] == 5 && b[4096 + len - 1] == 5, "pulled data");
        printf("lat persistent %zu %.3f\n", len, (now_s() - t0) * 1e6 / (double)n / 2);
    }
}

static int lat(int server, int port_fd, const char *kind, long n) {
    int flags = 0, small = -1;
    if (!strcmp(kind, "normal")) small = 0;
    else if (!strcmp(kind, "persistent")) flags = EXS_PERSISTENT;
    else CHECK(!strcmp(kind, "immediate"), "unknown kind %s", kind);
    static unsigned char b[8192];
    int fd;
    if (server) {
        fd = rdma_serve(port_fd);
    } else {
        int port;
        CHECK(read(port_fd, &port, sizeof port) == sizeof port, "the server's port");
        fd = rdma_dial(port, small);
        if (small == 0) CHECK(exs_fcntl(fd, EXS_F_GETSMALL) == 0, "small-packet size 0");
    }
    exs_mhandle_t mh = exs_mregister(b, sizeof b, 0);
    CHECK(mh != EXS_MHANDLE_INVALID, "exs_mregister");
    if (flags & EXS_PERSISTENT)
        persistent_lat(fd, !server, n, b, mh);
    else
        pingpong(fd, !server, n, b, mh, kind, flags);
    exs_close(fd);
    return 0;
}

/* ---------------------------------------------------------------- */
/* Blasts                                                           */

static void report_cpu(double c0, double t0) {
    printf("cpu %s %.6f %.6f\n", side, cpu_s() - c0, now_s() - t0);
}

static size_t window_for(size_t size, size_t cap) {
    size_t w = RING_MAX / size;
    if (w > cap) w = cap;
    if (w < 2) w = 2;
    return w;
}

static unsigned char *ring(size_t w, size_t size) {
    unsigned char *b = malloc(w * size);
    CHECK(b != NULL, "malloc %zu", w * size);
    memset(b, 0x5a, w * size);
    return b;
}

static int rdma_blast(int server, int port_fd, size_t size, long count) {
    size_t w = window_for(size, WINDOW_MAX);
    unsigned char *b = ring(w, size);
    exs_mhandle_t mh;
    exs_event_t evs[WINDOW_MAX];
    char ack = 'k';
    exs_mhandle_t amh;
    if (server) {
        int fd = rdma_serve(port_fd);
        mh = exs_mregister(b, w * size, 0);
        amh = exs_mregister(&ack, 1, 0);
        CHECK(mh != EXS_MHANDLE_INVALID && amh != EXS_MHANDLE_INVALID, "exs_mregister");
        double c0 = cpu_s(), t0 = now_s();
        long posted = 0, done = 0;
        while (done < count) {
            while (posted < count && (size_t)(posted - done) < w) {
                CHECK(exs_recv(fd, b + (size_t)(posted % (long)w) * size, size, 0, q, AH(posted),
                               mh) == 0,
                      "exs_recv");
                posted++;
            }
            struct timespec t = {20, 0};
            int k = exs_qdequeue(q, evs, WINDOW_MAX, &t);
            CHECK(k > 0, "receive stalled at %ld of %ld", done, count);
            for (int i = 0; i < k; i++) {
                errno = evs[i].exs_evt_errno;
                CHECK(evs[i].exs_evt_errno == 0 && evs[i].exs_evt_type == EXS_EVT_RECV &&
                          evs[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)size,
                      "receive %ld", done);
                done++;
            }
        }
        CHECK(exs_send(fd, &ack, 1, 0, q, AH(0), amh) == 0, "exs_send the answer");
        {
            /* The client closes as soon as the answer arrived: its FIN
             * may be seen before the answer's local completion (EPIPE). */
            struct timespec t = {20, 0};
            CHECK(exs_qdequeue(q, evs, 1, &t) == 1 && evs[0].exs_evt_type == EXS_EVT_SEND,
                  "the answer's event");
            errno = evs[0].exs_evt_errno;
            CHECK(errno == 0 || errno == EPIPE, "the answer");
        }
        report_cpu(c0, t0);
        /* wait for the client's close */
        CHECK(exs_recv(fd, &ack, 1, 0, q, AH(0), amh) == 0, "exs_recv");
        struct timespec t = {20, 0};
        exs_qdequeue(q, evs, 1, &t);
        exs_close(fd);
        return 0;
    }
    int port;
    CHECK(read(port_fd, &port, sizeof port) == sizeof port, "the server's port");
    int fd = rdma_dial(port, -1);
    mh = exs_mregister(b, w * size, 0);
    amh = exs_mregister(&ack, 1, 0);
    CHECK(mh != EXS_MHANDLE_INVALID && amh != EXS_MHANDLE_INVALID, "exs_mregister");
    CHECK(exs_recv(fd, &ack, 1, 0, q, AH(-1), amh) == 0, "exs_recv the answer");
    double c0 = cpu_s(), t0 = now_s();
    long posted = 0, done = 0;
    int answered = 0;
    while (done < count || !answered) {
        while (posted < count && (size_t)(posted - done) < w) {
            CHECK(exs_send(fd, b + (size_t)(posted % (long)w) * size, size, 0, q, AH(posted),
                           mh) == 0,
                  "exs_send");
            posted++;
        }
        struct timespec t = {20, 0};
        int k = exs_qdequeue(q, evs, WINDOW_MAX, &t);
        CHECK(k > 0, "send stalled at %ld of %ld", done, count);
        for (int i = 0; i < k; i++) {
            errno = evs[i].exs_evt_errno;
            CHECK(evs[i].exs_evt_errno == 0, "event type %d", evs[i].exs_evt_type);
            if (evs[i].exs_evt_type == EXS_EVT_RECV) answered = 1;
            else done++;
        }
    }
    double secs = now_s() - t0;
    report_cpu(c0, t0);
    printf("xfer rdma %zu %ld %.6f\n", size, (long)size * count, secs);
    exs_close(fd);
    return 0;
}

/* The TCP sink of tcp and og: every octet, then one octet back. */
static int tcp_sink(int wfd, size_t size, long count) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(l >= 0, "socket");
    struct sockaddr_in a = lo(0);
    CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0, "bind");
    CHECK(listen(l, 4) == 0, "listen");
    socklen_t al = sizeof a;
    CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0, "getsockname");
    int port = ntohs(a.sin_port);
    CHECK(write(wfd, &port, sizeof port) == sizeof port, "tell the port");
    int fd = accept(l, NULL, NULL);
    CHECK(fd >= 0, "accept");
    close(l);
    unsigned char *b = ring(1, size);
    double c0 = cpu_s(), t0 = now_s();
    long long want = (long long)size * count, got = 0;
    while (got < want) {
        size_t n = size;
        if ((long long)n > want - got) n = (size_t)(want - got);
        ssize_t r = recv(fd, b, n, 0);
        CHECK(r > 0, "recv after %lld of %lld octets", got, want);
        got += r;
    }
    CHECK(send(fd, "k", 1, MSG_NOSIGNAL) == 1, "send the answer");
    report_cpu(c0, t0);
    char c;
    (void)!recv(fd, &c, 1, 0); /* the client's close */
    close(fd);
    return 0;
}

static int tcp_dial(int port_fd) {
    int port;
    CHECK(read(port_fd, &port, sizeof port) == sizeof port, "the server's port");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0, "socket");
    struct sockaddr_in a = lo(port);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect");
    return fd;
}

static void tcp_answer(int fd) {
    char c;
    CHECK(recv(fd, &c, 1, MSG_WAITALL) == 1, "the server's answer");
}

static int tcp_blast(int server, int port_fd, size_t size, long count) {
    if (server) return tcp_sink(port_fd, size, count);
    int fd = tcp_dial(port_fd);
    unsigned char *b = ring(1, size);
    double c0 = cpu_s(), t0 = now_s();
    for (long i = 0; i < count; i++) {
        size_t off = 0;
        while (off < size) {
            ssize_t r = send(fd, b + off, size - off, MSG_NOSIGNAL);
            CHECK(r > 0, "send");
            off += (size_t)r;
        }
    }
    tcp_answer(fd);
    double secs = now_s() - t0;
    report_cpu(c0, t0);
    printf("xfer tcp %zu %ld %.6f\n", size, (long)size * count, secs);
    close(fd);
    return 0;
}

static int og_blast(int server, int port_fd, size_t size, long count, int depth) {
    if (server) return tcp_sink(port_fd, size, count);
    CHECK(depth >= 1 && depth <= WINDOW_MAX, "depth %d", depth);
    int fd = tcp_dial(port_fd);
    CHECK(exs_init(EXS_VERSION) == 0, "exs_init");
    q = exs_qcreate(depth);
    CHECK(q != EXS_QHANDLE_INVALID, "exs_qcreate");
    size_t w = window_for(size, (size_t)depth);
    unsigned char *b = ring(w, size);
    exs_mhandle_t mh = exs_mregister(b, w * size, 0);
    CHECK(mh != EXS_MHANDLE_INVALID, "exs_mregister");
    exs_event_t evs[WINDOW_MAX];
    double c0 = cpu_s(), t0 = now_s();
    long posted = 0, done = 0;
    while (done < count) {
        while (posted < count && (size_t)(posted - done) < w) {
            CHECK(exs_send(fd, b + (size_t)(posted % (long)w) * size, size, 0, q, AH(posted), mh) ==
                      0,
                  "exs_send");
            posted++;
        }
        struct timespec t = {20, 0};
        int k = exs_qdequeue(q, evs, WINDOW_MAX, &t);
        CHECK(k > 0, "send stalled at %ld of %ld", done, count);
        for (int i = 0; i < k; i++) {
            errno = evs[i].exs_evt_errno;
            CHECK(evs[i].exs_evt_errno == 0 &&
                      evs[i].exs_evt_union.exs_evt_xfer.exs_evt_nbytes == (ssize_t)size,
                  "send %ld", done);
            done++;
        }
    }
    tcp_answer(fd);
    double secs = now_s() - t0;
    report_cpu(c0, t0);
    printf("xfer og %zu %ld %.6f\n", size, (long)size * count, secs);
    exs_close(fd);
    return 0;
}

/* ---------------------------------------------------------------- */

static int run(int server, int fd, int argc, char **argv) {
    const char *mode = argv[1];
    if (!strcmp(mode, "lat") && argc == 4) return lat(server, fd, argv[2], atol(argv[3]));
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 0;
    long long bytes = argc > 3 ? atoll(argv[3]) : 0;
    CHECK(size > 0 && bytes >= (long long)size, "size %zu, bytes %lld", size, bytes);
    long count = (long)(bytes / (long long)size);
    if (!strcmp(mode, "rdma") && argc == 4) return rdma_blast(server, fd, size, count);
    if (!strcmp(mode, "tcp") && argc == 4) return tcp_blast(server, fd, size, count);
    if (!strcmp(mode, "og") && argc == 5) return og_blast(server, fd, size, count, atoi(argv[4]));
    CHECK(0, "bad arguments");
    return 2;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: exs_bench lat KIND N | rdma|tcp SIZE BYTES | og SIZE BYTES DEPTH\n");
        return 2;
    }
    const char *d = getenv("EXS_BENCH_DEADLINE");
    unsigned deadline = d ? (unsigned)atoi(d) : 60;
    int up[2];
    CHECK(pipe(up) == 0, "pipe");
    pid_t parent = getpid();
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        side = "server";
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) return 1;
        alarm(deadline);
        close(up[0]);
        return run(1, up[1], argc, argv);
    }
    close(up[1]);
    alarm(deadline);
    int rc = run(0, up[0], argc, argv);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid, "wait for the server");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server ended with status %d", st);
    return rc;
}
