/*
 * errors.c - documented error cases of ibv_create_cq(3) and
 * ibv_create_cq_ex(3) on softrdma_lo: a cqe below 1 or above max_cqe, or a
 * comp_vector outside [0, num_comp_vectors), gives NULL with errno EINVAL;
 * the valid extremes still work.
 *
 * Prints "errors: OK" and exits 0 when every check holds.
 */
#include <errno.h>
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

	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("errors: OK\n");
	return 0;
}
