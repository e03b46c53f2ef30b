/*
 * write_record.c - softrdma's C extensions in one process: for a UD and
 * an RD (IBV_QPT_SOFTRDMA_RD) QP pair on softrdma_lo, an RDMA Write-Record
 * from A into B's memory, then B's completion and validity map.
 *
 *   cc -o write_record write_record.c -I crates/capi/include \
 *      -L target/debug -libverbs
 *   softrdma run -- ./write_record
 *
 * Prints "write_record: OK" and exits 0 when every check holds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <softrdma/verbs.h>

#define LEN 3000 /* more than one datagram: the record is reassembled */

#define CHECK(c, ...)                                                  \
	do {                                                           \
		if (!(c)) {                                            \
			fprintf(stderr, "write_record: " __VA_ARGS__); \
			fprintf(stderr, "\n");                         \
			exit(1);                                       \
		}                                                      \
	} while (0)

static struct ibv_context *open_lo(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;

	CHECK(l, "no device list");
	for (int i = 0; l[i]; i++)
		if (!strcmp(ibv_get_device_name(l[i]), "softrdma_lo"))
			ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	CHECK(ctx, "softrdma_lo not found (run through softrdma run)");
	return ctx;
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq,
			      enum ibv_qp_type type)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = 0x11111111 };

	CHECK(qp, "create QP type %#x: %s", type, strerror(errno));
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_QKEY), "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	return qp;
}

static void poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long spins = 0; spins < 200000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, wc);
		CHECK(n >= 0, "poll_cq");
		if (n == 1)
			return;
	}
	CHECK(0, "no completion");
}

static void run(struct ibv_context *ctx, enum ibv_qp_type type,
		const char *name)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(pd, scq, type);
	struct ibv_qp *b = make_qp(pd, rcq, type);
	char *src = calloc(1, 4096), *dst = calloc(1, 8192);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, 8192,
					IBV_ACCESS_LOCAL_WRITE |
					IBV_ACCESS_REMOTE_WRITE);
	union ibv_gid gid;
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	struct ibv_ah *ah;
	struct ibv_sge sge;
	struct ibv_send_wr wr = {0}, *bad;
	struct ibv_wc wc;
	struct softrdma_range r[4];
	size_t n = 0;

	CHECK(pd && scq && rcq && src && dst && smr && dmr, "resources");
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "query gid");
	aa.grh.dgid = gid;
	ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "create AH");
	for (int i = 0; i < LEN; i++)
		src[i] = (char)(i * 7 + 1);

	/* A writes LEN octets at offset 1000 of B's region. */
	sge = (struct ibv_sge){ (uintptr_t)src, LEN, smr->lkey };
	wr.wr_id = 42;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SOFTRDMA_WRITE_RECORD;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = b->qp_num;
	wr.wr.ud.remote_qkey = 0x11111111;
	softrdma_wr_set_record(&wr, (uintptr_t)dst + 1000, dmr->rkey);
	CHECK(!ibv_post_send(a, &wr, &bad), "%s: post Write-Record", name);

	poll_one(scq, &wc);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 42 &&
	      wc.opcode == IBV_WC_SOFTRDMA_WRITE_RECORD,
	      "%s: sender completion status %d opcode %d", name, wc.status,
	      wc.opcode);
	poll_one(rcq, &wc);
	CHECK(wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_SOFTRDMA_RECV_WRITE_RECORD &&
	      wc.byte_len == LEN && wc.src_qp == a->qp_num,
	      "%s: target completion status %d opcode %#x len %u src %#x",
	      name, wc.status, wc.opcode, wc.byte_len, wc.src_qp);
	CHECK(!memcmp(dst + 1000, src, LEN), "%s: data differs", name);

	CHECK(!softrdma_record_valid_ranges(b, dmr, 0, 8192, r, 4, &n),
	      "%s: valid ranges", name);
	CHECK(n == 1 && r[0].offset == 1000 && r[0].length == LEN,
	      "%s: map has %zu ranges, first %llu+%llu", name, n,
	      (unsigned long long)r[0].offset,
	      (unsigned long long)r[0].length);
	CHECK(softrdma_record_is_valid(b, dmr, 1000, LEN) == 1, "%s: valid",
	      name);
	CHECK(softrdma_record_is_valid(b, dmr, 999, 2) == 0, "%s: 999 valid",
	      name);
	CHECK(!softrdma_record_clear(b, dmr, 1000, 100), "%s: clear", name);
	CHECK(softrdma_record_is_valid(b, dmr, 1000, 100) == 0,
	      "%s: still valid after clear", name);
	CHECK(softrdma_record_valid_ranges(b, dmr, 8000, 500, r, 4, &n) ==
	      ERANGE, "%s: out of region not ERANGE", name);
	printf("write_record: %s QP %#x -> %#x: %d octets placed and logged\n",
	       name, a->qp_num, b->qp_num, LEN);

	ibv_destroy_ah(ah);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dealloc_pd(pd);
	free(src);
	free(dst);
}

int main(void)
{
	struct ibv_context *ctx = open_lo();

	run(ctx, IBV_QPT_UD, "UD");
	run(ctx, IBV_QPT_SOFTRDMA_RD, "RD");
	ibv_close_device(ctx);
	printf("write_record: OK\n");
	return 0;
}
