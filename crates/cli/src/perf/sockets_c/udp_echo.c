/* UDP echo server and many-socket client for `softrdma perf sockets`'s
 * memory row (compiled at run time with cc).
 * usage: udp_echo server PORT | clients PORT N FIRST
 * server: one socket on 127.0.0.1:PORT echoing every datagram; prints
 *   "ready"; exits 0 on SIGINT.
 * clients: N sockets, each bound to a port of its own (the first free
 *   ones from FIRST up), each sends one datagram to the server and reads
 *   the echo (three tries, 2 s each); prints "answered K of N last P"
 *   (P: the last port used), then waits for SIGINT with every socket
 *   open and exits 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_int(int s) { (void)s; stop = 1; }

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_int;
    sigaction(SIGINT, &sa, NULL);
    struct sockaddr_in srv = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    srv.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (strcmp(argv[1], "server") == 0) {
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (fd < 0 || bind(fd, (void *)&srv, sizeof srv) != 0) { perror("bind"); return 1; }
        printf("ready\n");
        char buf[2048];
        while (!stop) {
            struct sockaddr_storage from;
            socklen_t fl = sizeof from;
            ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (void *)&from, &fl);
            if (n < 0) {
                if (errno == EINTR) continue;
                perror("recvfrom");
                return 1;
            }
            sendto(fd, buf, (size_t)n, 0, (void *)&from, fl);
        }
        return 0;
    }
    if (strcmp(argv[1], "clients") != 0 || argc != 5) return 2;
    int n = atoi(argv[3]), port = atoi(argv[4]);
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    int *fds = calloc((size_t)n, sizeof *fds), answered = 0;
    struct sockaddr_in me = {.sin_family = AF_INET};
    me.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 2};
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_DGRAM, 0);
        if (fds[i] < 0) {
            printf("socket %d: %s\n", i, strerror(errno));
            return 1;
        }
        for (;; port++) {
            if (port > 65535) {
                printf("no free port left for socket %d\n", i);
                return 1;
            }
            me.sin_port = htons(port);
            if (bind(fds[i], (void *)&me, sizeof me) == 0) break;
            if (errno != EADDRINUSE) {
                printf("bind %d: %s\n", port, strerror(errno));
                return 1;
            }
        }
        port++;
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char msg[32], got[32];
        int len = snprintf(msg, sizeof msg, "client %d", i);
        for (int t = 0; t < 3 && !stop; t++) {
            if (sendto(fds[i], msg, (size_t)len, 0, (void *)&srv, sizeof srv) != len) continue;
            ssize_t r = recv(fds[i], got, sizeof got, 0);
            if (r == len && memcmp(got, msg, (size_t)len) == 0) {
                answered++;
                break;
            }
        }
    }
    printf("answered %d of %d last %d\n", answered, n, port - 1);
    while (!stop) pause();
    return 0;
}
