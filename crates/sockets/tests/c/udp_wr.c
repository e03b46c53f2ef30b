/*
 * SOFTRDMA_TRANSPORT_WR on UDP sockets (softrdma/sockets.h): a client
 * sends datagrams of many sizes (1 octet to 60 KiB) to a server that
 * echoes each one; the client checks every echo octet for octet.
 *
 *   udp_wr server PORT T   bind 127.0.0.1:PORT, echo until "END"
 *   udp_wr client PORT T   ping-pong ROUNDS datagrams, then bursts
 *   udp_wr sink PORT T     bind there, check every datagram until "END"
 *   udp_wr blast PORT T    send BLAST datagrams without waiting, then "END"
 *
 * The blast outruns the sink (it sleeps now and then): datagrams may be
 * lost, as UDP's are, but every one that arrives must be intact.
 * T: kernel, ud, rd, wr, or default (no setsockopt). Prints what
 * SOFTRDMA_TRANSPORT reads back and the SOFTRDMA_RECORDS counts.
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

#define ROUNDS 240
#define BURST 6
#define BURSTS 20
#define MAXD 65536
#define BLAST 3000

static const size_t sizes[] = {1, 7, 64, 1000, 1442, 1443, 3000, 8192, 20000, 32768, 61440, 65507};
#define NSIZES (sizeof sizes / sizeof sizes[0])

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
    else if (strcmp(t, "wr") == 0)
        v = SOFTRDMA_TRANSPORT_WR;
    else
        return -EINVAL;
    if (setsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_TRANSPORT, &v, sizeof v) != 0)
        return -errno;
    return 0;
}

static void report(const char *who, int fd) {
    struct softrdma_records r = {0, 0, 0};
    socklen_t l = sizeof r;
    if (getsockopt(fd, SOL_SOFTRDMA, SOFTRDMA_RECORDS, &r, &l) != 0) {
        printf("%s: records: %s\n", who, strerror(errno));
        return;
    }
    printf("%s: records sent %llu received %llu partial %llu\n", who, r.sent, r.received,
           r.partial);
}

/* The octets of datagram `id` of `len` octets: its id first, then a pattern. */
static void fill(unsigned char *b, size_t len, unsigned id) {
    for (size_t i = 0; i < len; i++)
        b[i] = (unsigned char)(id * 131 + i * 7 + (i >> 8));
    if (len >= 4)
        memcpy(b, &id, 4);
}

/* Reads one datagram: its length, -1 on timeout; with `partial`, a
 * datagram delivered partly sets *partial (else it fails the run). */
static ssize_t get_p(int fd, unsigned char *buf, struct sockaddr_in *from, int *partial) {
    struct iovec iov = {buf, MAXD};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_name = from;
    m.msg_namelen = from ? sizeof *from : 0;
    ssize_t n = recvmsg(fd, &m, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return -1;
    if (n < 0) {
        perror("recvmsg");
        exit(1);
    }
    if (partial)
        *partial = (m.msg_flags & MSG_TRUNC) != 0;
    else if (m.msg_flags & MSG_TRUNC) {
        printf("a datagram of %zd octets came partly (MSG_TRUNC)\n", n);
        exit(1);
    }
    return n;
}

static ssize_t get(int fd, unsigned char *buf, struct sockaddr_in *from) {
    return get_p(fd, buf, from, NULL);
}

/* The length of blast datagram `id`. */
static size_t blast_len(unsigned id) {
    return 4 + (size_t)(id * 2654435761u % 9000);
}

static int sink(int fd) {
    unsigned char *buf = malloc(MAXD), *want = malloc(MAXD);
    unsigned long got = 0, partial = 0;
    for (;;) {
        int part = 0;
        ssize_t n = get_p(fd, buf, NULL, &part);
        if (n < 0) {
            printf("sink: nothing for 20 s\n");
            return 1;
        }
        if (n == 3 && memcmp(buf, "END", 3) == 0)
            break;
        unsigned id;
        memcpy(&id, buf, 4);
        size_t len = blast_len(id);
        fill(want, len, id);
        /* Partly delivered (segments lost): the prefix placed, MSG_TRUNC. */
        size_t have = part ? (size_t)n : len;
        if (n < 4 || id >= BLAST || (part ? (size_t)n >= len : (size_t)n != len) ||
            memcmp(buf, want, have) != 0) {
            printf("sink: datagram %u corrupt (%zd octets%s)\n", id, n, part ? ", partial" : "");
            return 1;
        }
        partial += part;
        if (++got % 64 == 0)
            usleep(2000);
    }
    printf("sink: %lu intact, %lu of them partly\n", got, partial);
    return 0;
}

static int blast(int fd, struct sockaddr_in *a) {
    unsigned char *want = malloc(MAXD);
    for (unsigned id = 0; id < BLAST; id++) {
        size_t len = blast_len(id);
        fill(want, len, id);
        if (sendto(fd, want, len, 0, (struct sockaddr *)a, sizeof *a) != (ssize_t)len) {
            perror("sendto");
            return 1;
        }
    }
    /* The end marker, repeated: it may be lost like the rest. */
    for (int i = 0; i < 50; i++) {
        usleep(20000);
        sendto(fd, "END", 3, 0, (struct sockaddr *)a, sizeof *a);
    }
    printf("blast: %u sent\n", BLAST);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s server|client PORT T\n", argv[0]);
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0 || strcmp(argv[1], "sink") == 0;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("socket");
        return 1;
    }
    int big = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    struct timeval tv = {server ? 20 : 2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int r = choose(fd, argv[3]);
    if (r != 0) {
        printf("setsockopt: %s\n", strerror(-r));
        return 1;
    }
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(argv[2]));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    unsigned char *buf = malloc(MAXD), *want = malloc(MAXD);
    if (server) {
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            perror("bind");
            return 1;
        }
        printf("server: transport %d\n", transport_of(fd));
        fflush(stdout);
        if (strcmp(argv[1], "sink") == 0) {
            int rc = sink(fd);
            report("server", fd);
            return rc;
        }
        unsigned long n_echoed = 0;
        for (;;) {
            struct sockaddr_in from;
            ssize_t n = get(fd, buf, &from);
            if (n < 0) {
                printf("server: nothing for 20 s\n");
                return 1;
            }
            if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, sizeof from) != n) {
                perror("sendto");
                return 1;
            }
            if (n == 3 && memcmp(buf, "END", 3) == 0)
                break;
            n_echoed++;
        }
        printf("server: echoed %lu datagrams\n", n_echoed);
        report("server", fd);
        return 0;
    }
    if (strcmp(argv[1], "blast") == 0) {
        int rc = blast(fd, &a);
        report("client", fd);
        return rc;
    }
    unsigned id = 0, lost = 0;
    /* Ping-pong: every size in turn. */
    for (int i = 0; i < ROUNDS; i++, id++) {
        size_t len = sizes[i % NSIZES];
        fill(want, len, id);
        for (int tries = 0;; tries++) {
            if (sendto(fd, want, len, 0, (struct sockaddr *)&a, sizeof a) != (ssize_t)len) {
                perror("sendto");
                return 1;
            }
            if (i == 0)
                printf("client: transport %d\n", transport_of(fd));
            ssize_t n = get(fd, buf, NULL);
            if (n < 0 && tries < 3) {
                lost++;
                continue;
            }
            if (n != (ssize_t)len || memcmp(buf, want, len) != 0) {
                printf("echo %u of %zu octets differs (%zd back)\n", id, len, n);
                return 1;
            }
            break;
        }
    }
    /* Bursts: BURST datagrams in flight at once, echoes matched by id. */
    for (int b = 0; b < BURSTS; b++) {
        unsigned first = id;
        for (int k = 0; k < BURST; k++, id++) {
            size_t len = 8 + (size_t)(id * 37 % 1400);
            fill(want, len, id);
            if (sendto(fd, want, len, 0, (struct sockaddr *)&a, sizeof a) != (ssize_t)len) {
                perror("sendto");
                return 1;
            }
        }
        for (int k = 0; k < BURST; k++) {
            ssize_t n = get(fd, buf, NULL);
            if (n < 0) {
                lost++;
                continue;
            }
            unsigned got;
            memcpy(&got, buf, 4);
            size_t len = 8 + (size_t)(got * 37 % 1400);
            fill(want, len, got);
            if (got < first || got >= id || n != (ssize_t)len || memcmp(buf, want, len) != 0) {
                printf("burst echo %u differs (%zd octets)\n", got, n);
                return 1;
            }
        }
    }
    sendto(fd, "END", 3, 0, (struct sockaddr *)&a, sizeof a);
    get(fd, buf, NULL);
    printf("client: %u datagrams intact, %u lost\n", id, lost);
    report("client", fd);
    return 0;
}
