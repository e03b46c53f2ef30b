/*
 * An MPI program whose every result is checked: a ping-pong between ranks
 * 0 and 1 at 8 B to 1 MiB (each message a pattern of its size, round and
 * direction, compared byte for byte on arrival), MPI_Allreduce (sum and
 * max of known integer vectors) and MPI_Alltoall (each block names its
 * sender and receiver). Rank 0 prints one "OK <part>" line per part that
 * passed on every rank; any mismatch prints "FAIL ..." and aborts.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long a, long b, long c)
{
    fprintf(stderr, "FAIL rank %d: %s (%ld %ld %ld)\n", rank, what, a, b, c);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

/* The byte at offset i of the message of length len, round r, sent by s. */
static unsigned char pat(size_t i, size_t len, int r, int s)
{
    return (unsigned char)((i * 131u) ^ (len * 7u) ^ ((unsigned)r * 29u) ^ ((unsigned)s * 101u) ^ (i >> 8));
}

static void fill(unsigned char *b, size_t len, int r, int s)
{
    for (size_t i = 0; i < len; i++)
        b[i] = pat(i, len, r, s);
}

static void check(const unsigned char *b, size_t len, int r, int s)
{
    for (size_t i = 0; i < len; i++)
        if (b[i] != pat(i, len, r, s))
            fail("ping-pong data differs: len, round, offset", (long)len, r, (long)i);
}

/* Every rank agrees that all passed (or aborts). */
static void all_passed(const char *part, const char *detail)
{
    int one = 1, n = 0;
    MPI_Allreduce(&one, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (n != size)
        fail("not every rank passed", n, size, 0);
    if (rank == 0) {
        printf("OK %s %s ranks=%d\n", part, detail, size);
        fflush(stdout);
    }
}

static void pingpong(void)
{
    const size_t max = 1 << 20;
    const int rounds = 10;
    unsigned char *out = malloc(max), *in = malloc(max);
    if (!out || !in)
        fail("malloc", 0, 0, 0);
    if (rank <= 1 && size >= 2) {
        int peer = 1 - rank;
        for (size_t len = 8; len <= max; len *= 2) {
            double t0 = MPI_Wtime();
            for (int r = 0; r < rounds; r++) {
                MPI_Status st;
                int got = -1;
                memset(in, 0xee, len);
                if (rank == 0) {
                    fill(out, len, r, 0);
                    MPI_Send(out, (int)len, MPI_BYTE, peer, r, MPI_COMM_WORLD);
                    MPI_Recv(in, (int)len, MPI_BYTE, peer, r, MPI_COMM_WORLD, &st);
                    MPI_Get_count(&st, MPI_BYTE, &got);
                    if ((size_t)got != len)
                        fail("ping-pong length differs", (long)len, got, r);
                    check(in, len, r, 1);
                } else {
                    MPI_Recv(in, (int)len, MPI_BYTE, peer, r, MPI_COMM_WORLD, &st);
                    MPI_Get_count(&st, MPI_BYTE, &got);
                    if ((size_t)got != len)
                        fail("ping-pong length differs", (long)len, got, r);
                    check(in, len, r, 0);
                    fill(out, len, r, 1);
                    MPI_Send(out, (int)len, MPI_BYTE, peer, r, MPI_COMM_WORLD);
                }
            }
            if (rank == 0) {
                double us = (MPI_Wtime() - t0) * 1e6 / (2.0 * rounds);
                printf("pingpong %zu bytes: %.1f us one way\n", len, us);
                fflush(stdout);
            }
        }
    }
    free(out);
    free(in);
    all_passed("pingpong", "8..1048576");
}

static void allreduce(void)
{
    const int n = 100000;
    long *v = malloc(n * sizeof *v), *sum = malloc(n * sizeof *sum), *mx = malloc(n * sizeof *mx);
    if (!v || !sum || !mx)
        fail("malloc", 0, 0, 0);
    for (int i = 0; i < n; i++)
        v[i] = (long)i * (rank + 1) + rank;
    MPI_Allreduce(v, sum, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(v, mx, n, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    long s1 = (long)size * (size + 1) / 2, s0 = (long)size * (size - 1) / 2;
    for (int i = 0; i < n; i++) {
        if (sum[i] != (long)i * s1 + s0)
            fail("allreduce sum differs: index, got, want", i, sum[i], (long)i * s1 + s0);
        if (mx[i] != (long)i * size + (size - 1))
            fail("allreduce max differs: index, got, want", i, mx[i], (long)i * size + size - 1);
    }
    free(v);
    free(sum);
    free(mx);
    all_passed("allreduce", "sum,max of 100000 longs");
}

static void alltoall(void)
{
    const int per = 4096; /* ints per block */
    int *out = malloc((size_t)per * size * sizeof(int)), *in = malloc((size_t)per * size * sizeof(int));
    if (!out || !in)
        fail("malloc", 0, 0, 0);
    for (int d = 0; d < size; d++)
        for (int k = 0; k < per; k++)
            out[d * per + k] = (rank << 24) | (d << 16) | k;
    memset(in, 0xff, (size_t)per * size * sizeof(int));
    MPI_Alltoall(out, per, MPI_INT, in, per, MPI_INT, MPI_COMM_WORLD);
    for (int s = 0; s < size; s++)
        for (int k = 0; k < per; k++)
            if (in[s * per + k] != ((s << 24) | (rank << 16) | k))
                fail("alltoall block differs: sender, index, got", s, k, in[s * per + k]);
    free(out);
    free(in);
    all_passed("alltoall", "4096 ints per pair");
}

int main(int argc, char **argv)
{
    char host[MPI_MAX_PROCESSOR_NAME];
    int hl = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &hl);
    printf("rank %d of %d on %s\n", rank, size, host);
    fflush(stdout);
    if (size < 2)
        fail("needs at least 2 ranks", size, 0, 0);
    pingpong();
    allreduce();
    alltoall();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("OK all\n");
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
