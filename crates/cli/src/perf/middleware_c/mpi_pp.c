/*
 * MPI ping-pong for `softrdma perf middleware`: ranks 0 and 1 only.
 *
 *   mpi_pp LAT_ITERS BW_REPS
 *
 * Latency: LAT_ITERS round trips of 8 B (MPI_Send/MPI_Recv) after a
 * tenth of them (at least 10) as warm-up; one-way µs = time / (2 ×
 * LAT_ITERS). Bandwidth: BW_REPS windows of 16 MPI_Isend of 1 MiB from
 * rank 0 to rank 1 (which has the matching MPI_Irecv posted), each window
 * closed by a 4 B acknowledgement from rank 1, after 2 windows of
 * warm-up; MB/s = 10^6 B/s. Rank 0 prints
 *
 *   mpi_pp lat 8 <one-way µs>
 *   mpi_pp bw 1048576 <MB/s>
 *
 * The last octet of every message is checked against what was sent.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAT_SIZE 8
#define BW_SIZE (1 << 20)
#define WINDOW 16

static int rank;

static void fail(const char *what, long a)
{
    fprintf(stderr, "FAIL rank %d: %s (%ld)\n", rank, what, a);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv)
{
    int size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 3 || size < 2)
        fail("usage: mpi_pp LAT_ITERS BW_REPS, 2 ranks", size);
    long iters = atol(argv[1]), reps = atol(argv[2]);
    if (iters < 1 || reps < 1)
        fail("LAT_ITERS and BW_REPS must be positive", iters);
    int peer = 1 - rank;
    unsigned char small[LAT_SIZE];
    unsigned char *big = malloc((size_t)BW_SIZE * WINDOW);
    if (!big)
        fail("malloc", BW_SIZE);
    memset(big, 0x5a, (size_t)BW_SIZE * WINDOW);
    MPI_Request req[WINDOW];
    int ack = 0;

    if (rank <= 1) {
        /* Latency. */
        long warm = iters / 10 < 10 ? 10 : iters / 10;
        double t0 = 0;
        for (long i = -warm; i < iters; i++) {
            if (i == 0) {
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = MPI_Wtime();
            }
            unsigned char v = (unsigned char)i;
            if (rank == 0) {
                memset(small, v, LAT_SIZE);
                MPI_Send(small, LAT_SIZE, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(small, LAT_SIZE, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(small, LAT_SIZE, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(small, LAT_SIZE, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            }
            if (small[LAT_SIZE - 1] != v)
                fail("latency message differs at round", i);
        }
        double lat = (MPI_Wtime() - t0) / (2.0 * (double)iters) * 1e6;

        /* Bandwidth. */
        double t1 = 0;
        for (long r = -2; r < reps; r++) {
            if (r == 0) {
                MPI_Barrier(MPI_COMM_WORLD);
                t1 = MPI_Wtime();
            }
            for (int w = 0; w < WINDOW; w++) {
                unsigned char *b = big + (size_t)w * BW_SIZE;
                if (rank == 0) {
                    b[BW_SIZE - 1] = (unsigned char)(r + w);
                    MPI_Isend(b, BW_SIZE, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req[w]);
                } else {
                    MPI_Irecv(b, BW_SIZE, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req[w]);
                }
            }
            MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
            if (rank == 1)
                for (int w = 0; w < WINDOW; w++)
                    if (big[(size_t)w * BW_SIZE + BW_SIZE - 1] != (unsigned char)(r + w))
                        fail("bandwidth message differs in window", r);
            if (rank == 0)
                MPI_Recv(&ack, 1, MPI_INT, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else
                MPI_Send(&ack, 1, MPI_INT, peer, 3, MPI_COMM_WORLD);
        }
        double secs = MPI_Wtime() - t1;
        double mbps = (double)BW_SIZE * WINDOW * (double)reps / secs / 1e6;
        if (rank == 0) {
            printf("mpi_pp lat %d %.3f\n", LAT_SIZE, lat);
            printf("mpi_pp bw %d %.1f\n", BW_SIZE, mbps);
            fflush(stdout);
        }
    } else {
        /* Ranks beyond 1 take part in the barriers only. */
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    free(big);
    MPI_Finalize();
    return 0;
}
