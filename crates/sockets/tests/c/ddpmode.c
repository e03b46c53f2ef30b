/* DDPMODE both ways: a plain exchange, then the switch, then data.
 * usage: ddpmode server PORT | client PORT | noswitch-client PORT
 * Exit 0 when every check holds; prints what happened. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <softrdma/sockets.h>

#define N (4 * 1024 * 1024)

static void die(const char *what) { perror(what); exit(2); }

static void xfer(int fd, char *buf, size_t n, int out) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = out ? write(fd, buf + done, n - done) : read(fd, buf + done, n - done);
        if (r <= 0) die(out ? "write" : "read");
        done += (size_t)r;
    }
}

static int ddp(int fd) {
    int one = 1, got = -1;
    socklen_t len = sizeof got;
    if (setsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_DDPMODE, &one, sizeof one) != 0) {
        printf("switch: errno %d (%s)\n", errno, strerror(errno));
        return -errno;
    }
    if (getsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_DDPMODE, &got, &len) != 0) die("getsockopt");
    printf("switch: ok, DDPMODE reads %d\n", got);
    return got == 1 ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int port = atoi(argv[2]);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char *buf = malloc(N), line[3];
    for (int i = 0; i < N; i++) buf[i] = (char)(i * 7 + 3);
    if (strcmp(argv[1], "server") == 0) {
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) die("listen");
        printf("listening\n");
        fflush(stdout);
        int fd = accept(l, NULL, NULL);
        if (fd < 0) die("accept");
        struct timeval tv = {.tv_sec = 2};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        xfer(fd, line, 3, 0);
        xfer(fd, "ok\n", 3, 1);
        int r = ddp(fd);
        if (r == -ETIMEDOUT || r == -EPROTO) {
            /* The peer did not switch: the socket is still plain TCP. */
            xfer(fd, buf, N, 0);
            for (int i = 0; i < N; i++)
                if (buf[i] != (char)(i * 7 + 3)) { printf("plain data differs at %d\n", i); return 1; }
            printf("peer did not switch; plain data intact\n");
            return 0;
        }
        if (r != 0) return 1;
        memset(buf, 0, N);
        xfer(fd, buf, N, 0);
        for (int i = 0; i < N; i++)
            if (buf[i] != (char)(i * 7 + 3)) { printf("data differs at %d\n", i); return 1; }
        xfer(fd, "ok\n", 3, 1);
        printf("server: %d octets intact\n", N);
        close(fd);
        return 0;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (void *)&a, sizeof a)) die("connect");
    xfer(fd, "hi\n", 3, 1);
    xfer(fd, line, 3, 0);
    if (strcmp(argv[1], "client") == 0 && ddp(fd) != 0) return 1;
    xfer(fd, buf, N, 1);
    if (strcmp(argv[1], "client") == 0) {
        xfer(fd, line, 3, 0);
        if (memcmp(line, "ok\n", 3)) return 1;
    }
    printf("client: sent %d octets\n", N);
    close(fd);
    return 0;
}
