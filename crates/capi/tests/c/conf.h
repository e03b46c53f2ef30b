/*
 * conf.h - what the conformance programs (conf_*.c) share: the check that
 * ends the program at its first failure, the per-page verdict line, and
 * opening softrdma's loopback device. Define CONF_NAME (the program's
 * name, a string) before including it.
 */
#ifndef CONF_H
#define CONF_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#ifndef CONF_NAME
#error "define CONF_NAME before including conf.h"
#endif

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, CONF_NAME ": FAILED %s:%d: ",     \
				__FILE__, __LINE__);                      \
			fprintf(stderr, __VA_ARGS__);                     \
			fputc('\n', stderr);                              \
			exit(1);                                          \
		}                                                         \
	} while (0)
#define PAGE_OK(p) printf(CONF_NAME ": %s: OK\n", p)

/* softrdma_lo, opened; the device list stays with the caller. */
static inline struct ibv_context *open_lo(struct ibv_device ***list)
{
	int n = 0;
	*list = ibv_get_device_list(&n);
	CHECK(*list && n > 0, "no devices");
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name((*list)[i]), "softrdma_lo")) {
			struct ibv_context *c = ibv_open_device((*list)[i]);
			CHECK(c, "ibv_open_device: %s", strerror(errno));
			return c;
		}
	CHECK(0, "softrdma_lo not listed");
	return NULL;
}

/* Port 1's GID table size: the first index beyond it. */
static inline int gid_tbl_len(struct ibv_context *c)
{
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(c, 1, &pa) == 0, "query_port");
	return pa.gid_tbl_len;
}

#endif
