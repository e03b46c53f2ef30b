/*
 * errors.c - documented error cases of ibv_create_cq(3) and
 * ibv_create_cq_ex(3) on softrdma_lo: a cqe below 1 or above max_cqe, or a
 * comp_vector outside [0, num_comp_vectors), gives NULL with errno EINVAL;
 * the valid extremes still work. ibv_resize_cq(3): cqe outside [1, max_cqe]
 * is EINVAL, a valid size is taken and reported in cq->cqe.
 * ibv_rereg_mr(3): no or unknown flags, a translation without address,
 * REMOTE_WRITE without LOCAL_WRITE give IBV_REREG_MR_ERR_INPUT with errno
 * EINVAL and leave the MR as it was; a new translation, PD and access are
 * taken, lkey/rkey kept. ibv_query_gid_table(3) with a zero-entry buffer
 * is -EINVAL.
 *
 * Prints "errors: OK" and exits 0 when every check holds.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "errors: FAILED %s:%d: ", __FILE__, \
				__LINE__);                                \
			fprintf(stderr, __VA_ARGS__);                     \
			fputc('\n', stderr);                              \
			exit(1);                                          \
		}                                                         \
	} while (0)

static void expect_einval_cq(struct ibv_context *ctx, int cqe, int vector,
			     const char *what)
{
	errno = 0;
	struct ibv_cq *cq = ibv_create_cq(ctx, cqe, NULL, NULL, vector);
	CHECK(cq == NULL && errno == EINVAL, "%s: cq %p errno %d", what,
	      (void *)cq, errno);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no devices");
	struct ibv_device *dev = NULL;
	for (int i = 0; i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "softrdma_lo"))
			dev = list[i];
	CHECK(dev, "softrdma_lo not listed");
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx, "ibv_open_device: %s", strerror(errno));
	struct ibv_device_attr attr;
	CHECK(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");

	/* cqe and comp_vector. */
	expect_einval_cq(ctx, 0, 0, "cqe 0");
	expect_einval_cq(ctx, -1, 0, "cqe -1");
	expect_einval_cq(ctx, attr.max_cqe + 1, 0, "cqe max_cqe + 1");
	expect_einval_cq(ctx, 16, ctx->num_comp_vectors, "comp_vector = num_comp_vectors");
	expect_einval_cq(ctx, 16, -1, "comp_vector -1");
	struct ibv_cq *cq = ibv_create_cq(ctx, attr.max_cqe, NULL, NULL,
					  ctx->num_comp_vectors - 1);
	CHECK(cq, "cqe max_cqe, last vector: %s", strerror(errno));
	CHECK(ibv_destroy_cq(cq) == 0, "destroy");

	struct ibv_cq_init_attr_ex ex = { .cqe = 16, .comp_vector = 7 };
	errno = 0;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ex);
	CHECK(cqx == NULL && errno == EINVAL, "create_cq_ex comp_vector 7: errno %d",
	      errno);
	ex.comp_vector = 0;
	ex.cqe = 0;
	errno = 0;
	cqx = ibv_create_cq_ex(ctx, &ex);
	CHECK(cqx == NULL && errno == EINVAL, "create_cq_ex cqe 0: errno %d", errno);
	ex.cqe = 16;
	cqx = ibv_create_cq_ex(ctx, &ex);
	CHECK(cqx, "create_cq_ex valid: %s", strerror(errno));
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "destroy ex");
	printf("errors: invalid cqe and comp_vector refused with EINVAL\n");

	/* ibv_resize_cq. */
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq, "create_cq: %s", strerror(errno));
	CHECK(ibv_resize_cq(cq, 0) == EINVAL, "resize_cq 0");
	CHECK(ibv_resize_cq(cq, attr.max_cqe + 1) == EINVAL, "resize_cq max_cqe + 1");
	CHECK(cq->cqe == 16, "cqe after refused resizes: %d", cq->cqe);
	CHECK(ibv_resize_cq(cq, 256) == 0, "resize_cq 256");
	CHECK(cq->cqe == 256, "cqe after resize: %d", cq->cqe);
	CHECK(ibv_resize_cq(cq, 4) == 0, "resize_cq 4 (empty CQ)");
	CHECK(cq->cqe == 4, "cqe after shrink: %d", cq->cqe);
	CHECK(ibv_destroy_cq(cq) == 0, "destroy resized");
	printf("errors: ibv_resize_cq takes valid sizes and refuses the rest\n");

	/* ibv_rereg_mr. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx), *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd && pd2, "alloc_pd: %s", strerror(errno));
	static char a[4096], b[8192];
	struct ibv_mr *mr = ibv_reg_mr(pd, a, sizeof(a), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr: %s", strerror(errno));
	uint32_t lkey = mr->lkey, rkey = mr->rkey;
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL, "rereg no flags: errno %d", errno);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 1 << 7, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL, "rereg unknown flag: errno %d", errno);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 16, 0) ==
			      IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "rereg translation without address: errno %d", errno);
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_REMOTE_WRITE) != 0 && errno == EINVAL,
	      "rereg REMOTE_WRITE without LOCAL_WRITE: errno %d", errno);
	CHECK(mr->addr == a && mr->length == sizeof(a) && mr->pd == pd,
	      "MR changed by refused rereg");
	CHECK(ibv_rereg_mr(mr,
			   IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD |
				   IBV_REREG_MR_CHANGE_ACCESS,
			   pd2, b, sizeof(b),
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0,
	      "rereg: %s", strerror(errno));
	CHECK(mr->addr == b && mr->length == sizeof(b) && mr->pd == pd2 &&
		      mr->lkey == lkey && mr->rkey == rkey,
	      "MR after rereg: addr %p len %zu", mr->addr, mr->length);
	CHECK(ibv_dereg_mr(mr) == 0, "dereg after rereg");
	CHECK(ibv_dealloc_pd(pd) == 0 && ibv_dealloc_pd(pd2) == 0, "dealloc_pd");
	printf("errors: ibv_rereg_mr changes translation, PD and access; refuses bad input\n");

	/* ibv_query_gid_table with no room. */
	struct ibv_gid_entry ent[4];
	CHECK(ibv_query_gid_table(ctx, ent, 0, 0) == -EINVAL, "gid_table max 0");
	CHECK(ibv_query_gid_table(ctx, ent, 4, 0) >= 1, "gid_table max 4");
	printf("errors: ibv_query_gid_table refuses a buffer with no room\n");

	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("errors: OK\n");
	return 0;
}
