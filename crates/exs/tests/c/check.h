/* The checks of the RDMA-model and datagram test programs: a failed
 * CHECK prints the process, place, message and errno on stderr and exits
 * 1; FAILS(call, err) checks that a call returns -1 with errno err; AH
 * makes an exs_ahandle_t of an integer. Include after <sys/exs.h>. */
#ifndef EXS_TESTS_CHECK_H
#define EXS_TESTS_CHECK_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CHECK(c, ...)                                                     \
    do {                                                                  \
        if (!(c)) {                                                       \
            fprintf(stderr, "[%d] FAIL %s:%d: ", (int)getpid(), __FILE__, \
                    __LINE__);                                            \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, " (errno %d)\n", errno);                      \
            exit(1);                                                      \
        }                                                                 \
    } while (0)
#define FAILS(call, err) CHECK((call) == -1 && errno == (err), "%s should fail with %s", #call, #err)
#define AH(x) ((exs_ahandle_t)(uintptr_t)(x))

#endif
