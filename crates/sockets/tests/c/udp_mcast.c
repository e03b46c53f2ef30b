/*
 * A UDP multicast group under the sockets interposer.
 *
 *   udp_mcast recv GROUP PORT   bind 0.0.0.0:PORT, join GROUP, print every
 *                               datagram that comes within 1 s of the
 *                               last (at most 10 s for the first)
 *   udp_mcast send GROUP PORT   send three datagrams to GROUP:PORT
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

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s recv|send GROUP PORT\n", argv[0]);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in g = {0};
    g.sin_family = AF_INET;
    g.sin_port = htons((unsigned short)atoi(argv[3]));
    if (fd < 0 || inet_pton(AF_INET, argv[2], &g.sin_addr) != 1) {
        perror("socket/group");
        return 1;
    }
    if (strcmp(argv[1], "recv") == 0) {
        int on = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
        struct sockaddr_in a = g;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            perror("bind");
            return 1;
        }
        struct ip_mreq m;
        m.imr_multiaddr = g.sin_addr;
        m.imr_interface.s_addr = htonl(INADDR_ANY);
        if (setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) != 0) {
            perror("IP_ADD_MEMBERSHIP");
            return 1;
        }
        printf("joined\n");
        fflush(stdout);
        struct timeval tv = {10, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        int got = 0;
        for (;;) {
            char buf[256];
            ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
            if (n < 0)
                break;
            buf[n] = 0;
            printf("got %s\n", buf);
            fflush(stdout);
            got++;
            struct timeval one = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &one, sizeof one);
        }
        printf("received %d\n", got);
        setsockopt(fd, IPPROTO_IP, IP_DROP_MEMBERSHIP, &m, sizeof m);
    } else {
        for (int i = 0; i < 3; i++) {
            char msg[32];
            int l = snprintf(msg, sizeof msg, "datagram-%d", i);
            if (sendto(fd, msg, (size_t)l, 0, (struct sockaddr *)&g, sizeof g) != l) {
                perror("sendto");
                return 1;
            }
            usleep(50000);
        }
        printf("sent 3\n");
    }
    return 0;
}
