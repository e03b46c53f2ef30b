/*
 * SOFTRDMA_TRANSPORT on UDP sockets (softrdma/sockets.h): one datagram
 * and its echo between a server and a client, each choosing its socket's
 * transport before the socket is bound or used.
 *
 *   udp_transport server PORT T   bind 127.0.0.1:PORT, echo one datagram
 *   udp_transport client PORT T   send one datagram there, read the echo
 *
 * T: kernel, ud, rd, or default (no setsockopt). Prints what the option
 * reads back and the errors it gives for values it must refuse.
 */
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

static int transport_of(int fd) {
    int v = -1;
    socklen_t l = sizeof v;
    if (getsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_TRANSPORT, &v, &l) != 0)
        return -errno;
    return v;
}

static int choose(int fd, const char *t) {
    int v;
    if (strcmp(t, "default") == 0)
        return 0;
    if (strcmp(t, "kernel") == 0)
        v = SOFTRDMA_TRANSPORT_KERNEL;
    else if (strcmp(t, "ud") == 0)
        v = SOFTRDMA_TRANSPORT_UD;
    else if (strcmp(t, "rd") == 0)
        v = SOFTRDMA_TRANSPORT_RD;
    else
        return -EINVAL;
    /* RC is no transport for a datagram socket. */
    int rc = SOFTRDMA_TRANSPORT_RC;
    if (setsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_TRANSPORT, &rc, sizeof rc) == 0) {
        printf("RC accepted on a UDP socket\n");
        exit(1);
    }
    printf("rc refused: %s\n", errno == EINVAL ? "EINVAL" : strerror(errno));
    if (setsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_TRANSPORT, &v, sizeof v) != 0)
        return -errno;
    return 0;
}

/* After the socket was taken: another transport is refused (EBUSY). */
static void late_change(int fd) {
    int now = transport_of(fd);
    if (now != SOFTRDMA_TRANSPORT_UD && now != SOFTRDMA_TRANSPORT_RD)
        return;
    int other = now == SOFTRDMA_TRANSPORT_UD ? SOFTRDMA_TRANSPORT_RD : SOFTRDMA_TRANSPORT_UD;
    if (setsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_TRANSPORT, &other, sizeof other) == 0) {
        printf("late change accepted\n");
        exit(1);
    }
    printf("late change refused: %s\n", errno == EBUSY ? "EBUSY" : strerror(errno));
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s server|client PORT T\n", argv[0]);
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("socket");
        return 1;
    }
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int r = choose(fd, argv[3]);
    if (r == -ENOPROTOOPT) {
        printf("option refused: ENOPROTOOPT\n");
        return 0;
    }
    if (r != 0) {
        printf("setsockopt: %s\n", strerror(-r));
        return 1;
    }
    printf("before: transport %d\n", transport_of(fd));
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[2]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char buf[256];
    if (server) {
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            perror("bind");
            return 1;
        }
        printf("%s: transport %d\n", argv[1], transport_of(fd));
        late_change(fd);
        fflush(stdout);
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (n < 0) {
            perror("recvfrom");
            return 1;
        }
        if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, fl) != n) {
            perror("sendto");
            return 1;
        }
        printf("echoed %zd octets\n", n);
    } else {
        const char msg[] = "datagram over softrdma";
        if (sendto(fd, msg, sizeof msg, 0, (struct sockaddr *)&a, sizeof a) != (ssize_t)sizeof msg) {
            perror("sendto");
            return 1;
        }
        printf("%s: transport %d\n", argv[1], transport_of(fd));
        late_change(fd);
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n != (ssize_t)sizeof msg || memcmp(buf, msg, sizeof msg) != 0) {
            printf("bad echo (%zd)\n", n);
            return 1;
        }
        printf("echo intact\n");
    }
    return 0;
}
