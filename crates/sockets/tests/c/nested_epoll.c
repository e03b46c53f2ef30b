/* Nested epoll sets and signals over one TCP connection.
 * usage: nested_epoll server PORT | client PORT
 *
 * The server echoes 16-octet records; a record starts with four digits,
 * the milliseconds it waits before echoing it. The client waits for the
 * echoes through an epoll set inside another (level-triggered,
 * edge-triggered, one-shot, three sets deep), through poll() and select()
 * on an epoll descriptor, checks loops, removal and closing, then a
 * blocking read interrupted by a signal (restarted with SA_RESTART,
 * EINTR without) and an epoll_wait interrupted by one (EINTR either way).
 * Every check holds under the kernel alone too; the client prints
 * "transport: N" (SOFTRDMA_TRANSPORT, 1 = RC) and "depth: N" (how many
 * sets nest before ELOOP) for the caller to compare.
 * Exit 0 when every check holds. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <softrdma/sockets.h>

#define REC 16

static void die(const char *what) { perror(what); exit(2); }

static int fails;
#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        if (!(cond)) {                                                       \
            printf("FAIL line %d: ", __LINE__);                              \
            printf(__VA_ARGS__);                                             \
            printf(" (errno %d %s)\n", errno, strerror(errno));              \
            fails++;                                                         \
        }                                                                    \
    } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int xfer(int fd, char *buf, size_t n, int out) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = out ? write(fd, buf + done, n - done) : read(fd, buf + done, n - done);
        if (r < 0 && errno == EINTR) return -1;
        if (r <= 0) return done ? (int)done : (int)r;
        done += (size_t)r;
    }
    return (int)done;
}

/* Sends a record the server echoes after `ms`. */
static void ask(int fd, int ms, const char *text) {
    char rec[REC + 1];
    snprintf(rec, sizeof rec, "%04d%-12s", ms, text);
    if (xfer(fd, rec, REC, 1) != REC) die("write");
}

/* Reads one echoed record and checks it carries `text`. */
static void answer(int fd, const char *text) {
    char rec[REC + 1] = {0}, want[REC + 1];
    int r = xfer(fd, rec, REC, 0);
    CHECK(r == REC, "read of '%s' returned %d", text, r);
    snprintf(want, sizeof want, "%-12s", text);
    CHECK(memcmp(rec + 4, want, 12) == 0, "echo '%.12s' is not '%s'", rec + 4, text);
}

static int wait1(int ep, struct epoll_event *ev, int ms) {
    return epoll_wait(ep, ev, 1, ms);
}

static void add(int ep, int fd, uint32_t events, uint64_t data) {
    struct epoll_event ev = {.events = events, .data.u64 = data};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl ADD");
}

static void mod(int ep, int fd, uint32_t events, uint64_t data) {
    struct epoll_event ev = {.events = events, .data.u64 = data};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) != 0) die("epoll_ctl MOD");
}

/* ---- signals ---- */

static volatile sig_atomic_t alarms;
static void on_alarm(int sig) { (void)sig; alarms++; }

static void handler(int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) != 0) die("sigaction");
}

struct kick {
    pthread_t target;
    int ms;
};

static void *kicker(void *arg) {
    struct kick *k = arg;
    usleep(k->ms * 1000);
    pthread_kill(k->target, SIGALRM);
    return NULL;
}

/* Sends SIGALRM to this thread after `ms` (from a thread of its own, so
 * the signal reaches the blocked thread and no other). */
static pthread_t kick_after(struct kick *k, int ms) {
    pthread_t t;
    k->target = pthread_self();
    k->ms = ms;
    if (pthread_create(&t, NULL, kicker, k) != 0) die("pthread_create");
    return t;
}

static void *pipe_writer(void *arg) {
    usleep(100 * 1000);
    if (write(*(int *)arg, "p", 1) != 1) die("pipe write");
    return NULL;
}

/* ---- the two ends ---- */

static int server(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) die("listen");
    printf("listening\n");
    fflush(stdout);
    int fd = accept(l, NULL, NULL);
    if (fd < 0) die("accept");
    char rec[REC];
    int n = 0;
    while (xfer(fd, rec, REC, 0) == REC) {
        char ms[5] = {rec[0], rec[1], rec[2], rec[3], 0};
        usleep(atoi(ms) * 1000);
        if (xfer(fd, rec, REC, 1) != REC) die("echo");
        n++;
    }
    printf("server: echoed %d records\n", n);
    close(fd);
    close(l);
    return 0;
}

static int client(int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (void *)&a, sizeof a) != 0) die("connect");
    ask(fd, 0, "hello");
    answer(fd, "hello");
    int transport = -1;
    socklen_t tl = sizeof transport;
    if (getsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_TRANSPORT, &transport, &tl) != 0) transport = 0;
    printf("transport: %d\n", transport);

    struct epoll_event ev;
    int inner = epoll_create1(0), outer = epoll_create1(0);
    if (inner < 0 || outer < 0) die("epoll_create1");
    add(inner, fd, EPOLLIN, 0x1111);
    add(outer, inner, EPOLLIN, 0x2222);

    /* The kernel's refusals. */
    errno = 0;
    struct epoll_event e0 = {.events = EPOLLIN};
    CHECK(epoll_ctl(inner, EPOLL_CTL_ADD, outer, &e0) == -1 && errno == ELOOP,
          "a loop is refused with ELOOP");
    CHECK(epoll_ctl(outer, EPOLL_CTL_ADD, outer, &e0) == -1 && errno == EINVAL,
          "a set in itself is refused with EINVAL");
    CHECK(epoll_ctl(outer, EPOLL_CTL_ADD, inner, &e0) == -1 && errno == EEXIST,
          "a second ADD is refused with EEXIST");

    /* Level-triggered: nothing yet; the outer wait sleeps until the echo
     * arrives on the carried socket two sets down. */
    CHECK(wait1(outer, &ev, 0) == 0, "outer set idle before the echo");
    ask(fd, 150, "lt");
    double t0 = now_ms();
    int n = wait1(outer, &ev, 3000);
    double dt = now_ms() - t0;
    CHECK(n == 1 && ev.data.u64 == 0x2222 && (ev.events & EPOLLIN),
          "outer reports the inner set (n %d data %llx)", n, (unsigned long long)ev.data.u64);
    CHECK(dt > 100 && dt < 2500, "outer woke when the echo arrived (%.0f ms)", dt);
    CHECK(wait1(outer, &ev, 0) == 1, "level-triggered: reported again while ready");
    n = wait1(inner, &ev, 0);
    CHECK(n == 1 && ev.data.u64 == 0x1111, "inner reports the socket");
    answer(fd, "lt");
    CHECK(wait1(outer, &ev, 0) == 0, "outer idle once the echo is read");

    /* poll() and select() on the inner epoll descriptor. */
    ask(fd, 100, "poll");
    struct pollfd p = {.fd = inner, .events = POLLIN};
    t0 = now_ms();
    n = poll(&p, 1, 3000);
    dt = now_ms() - t0;
    CHECK(n == 1 && (p.revents & POLLIN), "poll on the inner set: %d %x", n, p.revents);
    CHECK(dt > 60 && dt < 2500, "poll woke when the echo arrived (%.0f ms)", dt);
    answer(fd, "poll");
    p.revents = 0;
    CHECK(poll(&p, 1, 0) == 0, "poll idle once the echo is read");
    p.fd = outer;
    CHECK(poll(&p, 1, 0) == 0, "poll on the outer set idle too");
    ask(fd, 100, "poll2");
    n = poll(&p, 1, 3000);
    CHECK(n == 1 && (p.revents & POLLIN), "poll on the outer set: %d %x", n, p.revents);
    answer(fd, "poll2");
    ask(fd, 100, "select");
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(outer, &rs);
    struct timeval tv = {.tv_sec = 3};
    n = select(outer + 1, &rs, NULL, NULL, &tv);
    CHECK(n == 1 && FD_ISSET(outer, &rs), "select on the outer set: %d", n);
    answer(fd, "select");

    /* The inner set's kernel part: a pipe written while the outer waits. */
    int pp[2];
    if (pipe(pp) != 0) die("pipe");
    add(inner, pp[0], EPOLLIN, 0x3333);
    pthread_t pw;
    pthread_create(&pw, NULL, pipe_writer, &pp[1]);
    n = wait1(outer, &ev, 3000);
    CHECK(n == 1 && ev.data.u64 == 0x2222, "outer reports the inner set's pipe");
    n = wait1(inner, &ev, 0);
    CHECK(n == 1 && ev.data.u64 == 0x3333, "inner reports its pipe");
    pthread_join(pw, NULL);
    char c;
    if (read(pp[0], &c, 1) != 1) die("pipe read");
    CHECK(wait1(outer, &ev, 0) == 0, "outer idle once the pipe is read");

    /* Edge-triggered outer entry: one report per change. */
    mod(outer, inner, EPOLLIN | EPOLLET, 0x2222);
    ask(fd, 50, "et1");
    n = wait1(outer, &ev, 3000);
    CHECK(n == 1 && ev.data.u64 == 0x2222, "edge-triggered: first report");
    t0 = now_ms();
    n = wait1(outer, &ev, 200);
    dt = now_ms() - t0;
    CHECK(n == 0 && dt >= 150, "edge-triggered: no second report (%d, %.0f ms)", n, dt);
    answer(fd, "et1");
    ask(fd, 50, "et2");
    n = wait1(outer, &ev, 3000);
    CHECK(n == 1 && ev.data.u64 == 0x2222, "edge-triggered: the next echo is a new edge");
    answer(fd, "et2");

    /* One-shot outer entry: once, then again after EPOLL_CTL_MOD. */
    mod(outer, inner, EPOLLIN | EPOLLONESHOT, 0x2424);
    ask(fd, 50, "oneshot");
    n = wait1(outer, &ev, 3000);
    CHECK(n == 1 && ev.data.u64 == 0x2424, "one-shot: first report (new data)");
    CHECK(wait1(outer, &ev, 100) == 0, "one-shot: disabled after it fired");
    mod(outer, inner, EPOLLIN, 0x2525);
    n = wait1(outer, &ev, 0);
    CHECK(n == 1 && ev.data.u64 == 0x2525, "one-shot: re-armed by MOD");
    answer(fd, "oneshot");

    /* Three sets deep: top -> mid -> inner -> socket. */
    int mid = epoll_create1(0), top = epoll_create1(0);
    add(mid, inner, EPOLLIN, 0x4444);
    add(top, mid, EPOLLIN, 0x5555);
    CHECK(wait1(top, &ev, 0) == 0, "top idle");
    ask(fd, 100, "deep");
    t0 = now_ms();
    n = wait1(top, &ev, 3000);
    dt = now_ms() - t0;
    CHECK(n == 1 && ev.data.u64 == 0x5555 && dt > 60, "three deep: top reports (%.0f ms)", dt);
    answer(fd, "deep");
    CHECK(wait1(top, &ev, 0) == 0, "top idle once read");
    close(top);
    close(mid);

    /* How deep sets nest: a chain until the kernel (or softrdma) says ELOOP. */
    int chain[8], depth = 1;
    chain[0] = epoll_create1(0);
    for (int i = 1; i < 8; i++) {
        chain[i] = epoll_create1(0);
        struct epoll_event ce = {.events = EPOLLIN};
        if (epoll_ctl(chain[i], EPOLL_CTL_ADD, chain[i - 1], &ce) != 0) {
            CHECK(errno == ELOOP, "too deep is ELOOP");
            break;
        }
        depth++;
    }
    for (int i = 0; i < 8; i++) close(chain[i]);
    printf("depth: %d\n", depth);

    /* Removal: the outer set no longer sees the inner one. */
    CHECK(epoll_ctl(outer, EPOLL_CTL_DEL, inner, NULL) == 0, "DEL of the inner set");
    ask(fd, 30, "del");
    CHECK(wait1(outer, &ev, 300) == 0, "after DEL the outer set stays idle");
    answer(fd, "del");

    /* Closing the inner set drops it from the outer one. */
    add(outer, inner, EPOLLIN, 0x6666);
    ask(fd, 0, "close");
    n = wait1(outer, &ev, 3000);
    CHECK(n == 1 && ev.data.u64 == 0x6666, "re-added inner set reports");
    close(inner);
    CHECK(wait1(outer, &ev, 100) == 0, "a closed inner set reports nothing");
    answer(fd, "close");

    /* Signals: a blocking read restarts under SA_RESTART, fails with
     * EINTR without it; epoll_wait fails with EINTR either way. */
    struct kick k;
    char rec[REC];
    handler(1);
    alarms = 0;
    ask(fd, 400, "restart");
    pthread_t kt = kick_after(&k, 100);
    answer(fd, "restart");
    pthread_join(kt, NULL);
    CHECK(alarms == 1, "SA_RESTART: the handler ran (%d)", (int)alarms);

    handler(0);
    alarms = 0;
    ask(fd, 400, "eintr");
    kt = kick_after(&k, 100);
    errno = 0;
    ssize_t r = read(fd, rec, REC);
    CHECK(r == -1 && errno == EINTR, "no SA_RESTART: read fails with EINTR (%zd)", r);
    pthread_join(kt, NULL);
    CHECK(alarms == 1, "no SA_RESTART: the handler ran (%d)", (int)alarms);
    answer(fd, "eintr");

    handler(1);
    int ep = epoll_create1(0);
    add(ep, fd, EPOLLIN, 1);
    kt = kick_after(&k, 100);
    errno = 0;
    n = epoll_wait(ep, &ev, 1, 3000);
    CHECK(n == -1 && errno == EINTR, "epoll_wait fails with EINTR even under SA_RESTART (%d)", n);
    pthread_join(kt, NULL);
    close(ep);

    close(outer);
    close(pp[0]);
    close(pp[1]);
    shutdown(fd, SHUT_WR);
    CHECK(read(fd, rec, REC) == 0, "end of stream");
    close(fd);
    if (fails) {
        printf("%d checks failed\n", fails);
        return 1;
    }
    printf("all checks passed\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int port = atoi(argv[2]);
    if (strcmp(argv[1], "server") == 0) return server(port);
    if (strcmp(argv[1], "client") == 0) return client(port);
    return 2;
}
