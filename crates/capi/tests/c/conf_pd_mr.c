/*
 * conf_pd_mr.c - conformance with rdma-core 44's man pages for protection
 * domains and memory regions: ibv_alloc_pd(3), ibv_dealloc_pd(3),
 * ibv_reg_mr(3) (also ibv_reg_mr_iova, ibv_reg_mr_iova2), ibv_dereg_mr(3).
 * (ibv_rereg_mr(3) is checked by errors.c, the PD's EBUSY by busy.c.)
 *
 * Prints "conf_pd_mr: <page>: OK" per page and "conf_pd_mr: OK" at the
 * end; exits 1 at the first check that fails.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CONF_NAME "conf_pd_mr"
#include "conf.h"

/* A registration the man page (and the kernel behind it) refuses: NULL
 * with errno `want`. A variable access keeps the header's ibv_reg_mr macro
 * on its run-time path. */
static void reg_refused(struct ibv_pd *pd, void *buf, size_t len, volatile int access,
			int want, const char *what)
{
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len, access);
	CHECK(mr == NULL && errno == want, "%s: mr %p errno %d, want %d", what,
	      (void *)mr, errno, want);
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = open_lo(&list);

	/* ibv_alloc_pd(3): a PD of this context; each one distinct. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx), *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd && pd2 && pd != pd2, "ibv_alloc_pd: %s", strerror(errno));
	CHECK(pd->context == ctx && pd2->context == ctx, "pd->context");
	PAGE_OK("ibv_alloc_pd");

	/* ibv_reg_mr(3): the MR reports what was registered. */
	static char buf[3 * 4096];
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *mr = ibv_reg_mr(pd, buf + 100, 5000, all);
	CHECK(mr, "ibv_reg_mr: %s", strerror(errno));
	CHECK(mr->addr == buf + 100 && mr->length == 5000 && mr->pd == pd &&
		      mr->context == ctx,
	      "mr addr %p length %zu pd %p context %p", mr->addr, mr->length,
	      (void *)mr->pd, (void *)mr->context);
	struct ibv_mr *ro = ibv_reg_mr(pd, buf, sizeof(buf), 0);
	CHECK(ro, "read-only local MR: %s", strerror(errno));
	CHECK(ro->lkey != mr->lkey && ro->rkey != mr->rkey, "two MRs share keys");
	/* "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, then
	 * IBV_ACCESS_LOCAL_WRITE must be set too." */
	reg_refused(pd, buf, 64, IBV_ACCESS_REMOTE_WRITE, EINVAL,
		    "REMOTE_WRITE without LOCAL_WRITE");
	reg_refused(pd, buf, 64, IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ, EINVAL,
		    "REMOTE_ATOMIC without LOCAL_WRITE");
	/* Access bits no verbs version defines are refused; on-demand paging
	 * is a feature softrdma's device does not report. */
	reg_refused(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE | (1 << 12), EINVAL, "unknown access bit");
	reg_refused(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND, EOPNOTSUPP,
		    "IBV_ACCESS_ON_DEMAND");
	/* "The optional flags ... may be ignored": RELAXED_ORDERING is taken. */
	volatile int relaxed = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING;
	struct ibv_mr *rel = ibv_reg_mr(pd, buf, 64, relaxed);
	CHECK(rel, "RELAXED_ORDERING refused: %s", strerror(errno));
	CHECK(ibv_dereg_mr(rel) == 0, "dereg relaxed");
	PAGE_OK("ibv_reg_mr");

	/* ibv_reg_mr_iova / ibv_reg_mr_iova2: addr is the address given. */
	struct ibv_mr *iv = ibv_reg_mr_iova(pd, buf, 4096, 0x10000, IBV_ACCESS_LOCAL_WRITE);
	CHECK(iv && iv->addr == buf && iv->length == 4096 && iv->pd == pd,
	      "ibv_reg_mr_iova: %s", iv ? "wrong fields" : strerror(errno));
	struct ibv_mr *iv2 =
		ibv_reg_mr_iova2(pd, buf + 4096, 4096, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(iv2 && iv2->addr == buf + 4096 && iv2->length == 4096,
	      "ibv_reg_mr_iova2: %s", iv2 ? "wrong fields" : strerror(errno));
	errno = 0;
	CHECK(ibv_reg_mr_iova2(pd, buf, 64, 0, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "iova2 REMOTE_WRITE without LOCAL_WRITE: errno %d", errno);
	PAGE_OK("ibv_reg_mr_iova");

	/* ibv_dereg_mr(3). */
	CHECK(ibv_dereg_mr(iv) == 0 && ibv_dereg_mr(iv2) == 0, "dereg iova");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(ro) == 0, "dereg");
	PAGE_OK("ibv_dereg_mr");

	/* ibv_dealloc_pd(3). */
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(pd2) == 0, "ibv_dealloc_pd");
	PAGE_OK("ibv_dealloc_pd");

	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("conf_pd_mr: OK\n");
	return 0;
}
