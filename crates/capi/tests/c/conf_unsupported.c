/*
 * conf_unsupported.c - the verbs softrdma does not offer fail the way
 * rdma-core 44 documents for a device without the feature: NULL with
 * errno EOPNOTSUPP (object-creating calls), EOPNOTSUPP returned
 * (errno-returning calls). The list is README's "Verbs not supported".
 *
 * Memory windows (ibv_alloc_mw(3), ibv_bind_mw(3), IBV_WR_BIND_MW), XRC
 * (ibv_open_xrcd(3), XRC SRQs and QPs), ibv_open_qp(3), flow steering
 * (ibv_create_flow(3), ibv_create_flow_action(3)), device memory
 * (ibv_alloc_dm(3), ibv_import_dm(3)), thread and parent domains
 * (ibv_alloc_td(3), ibv_alloc_parent_domain(3)), WQs and RSS
 * (ibv_create_wq(3), ibv_create_rwq_ind_table(3)), counters
 * (ibv_create_counters(3)), ibv_alloc_null_mr(3), ibv_advise_mr(3),
 * ibv_reg_dmabuf_mr, ibv_modify_cq(3), ibv_query_rt_values_ex(3),
 * ibv_modify_qp_rate_limit(3), ibv_get_srq_num(3), ibv_post_srq_ops(3),
 * ECE (ibv_query_ece(3), ibv_set_ece(3)), importing (ibv_import_device(3),
 * ibv_import_pd(3), ibv_import_mr(3)), raw packet QPs, UD QPs on an SRQ,
 * TSO and atomic write.
 *
 * Prints "conf_unsupported: <page>: OK" per page and
 * "conf_unsupported: OK" at the end; exits 1 at the first check that
 * fails.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CONF_NAME "conf_unsupported"
#include "conf.h"

/* A pointer-returning call: NULL with errno EOPNOTSUPP. */
#define NULL_EOPNOTSUPP(call, page)                                                  \
	do {                                                                         \
		errno = 0;                                                           \
		void *p_ = (void *)(call);                                           \
		CHECK(p_ == NULL && errno == EOPNOTSUPP, "%s: %p errno %d", page, p_, \
		      errno);                                                        \
		PAGE_OK(page);                                                       \
	} while (0)

/* An errno-returning call: EOPNOTSUPP. */
#define RET_EOPNOTSUPP(call, page)                                              \
	do {                                                                    \
		int r_ = (call);                                                \
		CHECK(r_ == EOPNOTSUPP, "%s: returned %d, want EOPNOTSUPP", page, r_); \
		PAGE_OK(page);                                                  \
	} while (0)

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = open_lo(&list);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0, "query_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq, "pd/cq");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4,
						.max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_UD };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "UD QP");
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq, "SRQ");
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "MR");

	/* Memory windows: the device reports none, allocation fails. */
	CHECK(da.max_mw == 0, "max_mw %d but windows are not offered", da.max_mw);
	NULL_EOPNOTSUPP(ibv_alloc_mw(pd, IBV_MW_TYPE_1), "ibv_alloc_mw");
	NULL_EOPNOTSUPP(ibv_alloc_mw(pd, IBV_MW_TYPE_2), "ibv_alloc_mw type 2");
	{
		/* No window can exist; a type 1 window object reaches the
		 * provider's bind and dealloc, which refuse. */
		struct ibv_mw mw = { .context = ctx, .pd = pd, .type = IBV_MW_TYPE_1 };
		struct ibv_mw_bind bind = { .wr_id = 1 };
		bind.bind_info.mr = mr;
		bind.bind_info.addr = (uintptr_t)buf;
		bind.bind_info.length = sizeof(buf);
		RET_EOPNOTSUPP(ibv_bind_mw(qp, &mw, &bind), "ibv_bind_mw");
		RET_EOPNOTSUPP(ibv_dealloc_mw(&mw), "ibv_dealloc_mw");
	}

	/* XRC. */
	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
						      IBV_XRCD_INIT_ATTR_OFLAGS,
					 .fd = -1,
					 .oflags = 0 };
	NULL_EOPNOTSUPP(ibv_open_xrcd(ctx, &xa), "ibv_open_xrcd");
	struct ibv_qp_init_attr_ex xq = { .send_cq = cq, .recv_cq = cq,
					  .cap = { .max_send_wr = 4, .max_send_sge = 1 },
					  .qp_type = IBV_QPT_XRC_SEND,
					  .comp_mask = IBV_QP_INIT_ATTR_PD,
					  .pd = pd };
	NULL_EOPNOTSUPP(ibv_create_qp_ex(ctx, &xq), "ibv_create_qp_ex IBV_QPT_XRC_SEND");
	struct ibv_qp_open_attr oa = { .comp_mask = IBV_QP_OPEN_ATTR_NUM |
						    IBV_QP_OPEN_ATTR_XRCD |
						    IBV_QP_OPEN_ATTR_TYPE,
				       .qp_num = qp->qp_num,
				       .qp_type = IBV_QPT_XRC_RECV };
	NULL_EOPNOTSUPP(ibv_open_qp(ctx, &oa), "ibv_open_qp");
	RET_EOPNOTSUPP(ibv_get_srq_num(srq, &(uint32_t){ 0 }), "ibv_get_srq_num");

	/* Raw packet QPs. */
	ia.qp_type = IBV_QPT_RAW_PACKET;
	NULL_EOPNOTSUPP(ibv_create_qp(pd, &ia), "ibv_create_qp IBV_QPT_RAW_PACKET");
	ia.qp_type = IBV_QPT_UD;

	/* A UD QP on an SRQ (UD receives use the QP's own queue). */
	ia.srq = srq;
	NULL_EOPNOTSUPP(ibv_create_qp(pd, &ia), "ibv_create_qp UD on an SRQ");
	ia.srq = NULL;

	/* Atomic write and TSO in the extended post API. */
	struct ibv_qp_init_attr_ex aw = { .send_cq = cq, .recv_cq = cq,
					  .cap = { .max_send_wr = 4, .max_send_sge = 1 },
					  .qp_type = IBV_QPT_RC,
					  .comp_mask = IBV_QP_INIT_ATTR_PD |
						       IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					  .pd = pd,
					  .send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE };
	NULL_EOPNOTSUPP(ibv_create_qp_ex(ctx, &aw), "ibv_create_qp_ex IBV_QP_EX_WITH_ATOMIC_WRITE");
	aw.send_ops_flags = IBV_QP_EX_WITH_TSO;
	NULL_EOPNOTSUPP(ibv_create_qp_ex(ctx, &aw), "ibv_create_qp_ex IBV_QP_EX_WITH_TSO");

	/* Flow steering. */
	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_eth eth;
	} fl = {
		.attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(fl), .num_of_specs = 1,
			  .port = 1 },
		.eth = { .type = IBV_FLOW_SPEC_ETH, .size = sizeof(struct ibv_flow_spec_eth) },
	};
	NULL_EOPNOTSUPP(ibv_create_flow(qp, &fl.attr), "ibv_create_flow");
	struct ibv_flow_action_esp_attr esp = { .esp_attr = NULL };
	NULL_EOPNOTSUPP(ibv_create_flow_action_esp(ctx, &esp), "ibv_create_flow_action");

	/* Device memory. */
	struct ibv_alloc_dm_attr dma = { .length = 4096 };
	NULL_EOPNOTSUPP(ibv_alloc_dm(ctx, &dma), "ibv_alloc_dm");
	NULL_EOPNOTSUPP(ibv_import_dm(ctx, 1), "ibv_import_dm");

	/* Thread and parent domains. */
	struct ibv_td_init_attr tda = { .comp_mask = 0 };
	NULL_EOPNOTSUPP(ibv_alloc_td(ctx, &tda), "ibv_alloc_td");
	struct ibv_parent_domain_init_attr pda = { .pd = pd };
	NULL_EOPNOTSUPP(ibv_alloc_parent_domain(ctx, &pda), "ibv_alloc_parent_domain");

	/* Work queues and RSS indirection tables. */
	struct ibv_wq_init_attr wa = { .wq_type = IBV_WQT_RQ, .max_wr = 4, .max_sge = 1,
				       .pd = pd, .cq = cq };
	NULL_EOPNOTSUPP(ibv_create_wq(ctx, &wa), "ibv_create_wq");
	struct ibv_rwq_ind_table_init_attr ra = { .log_ind_tbl_size = 0, .ind_tbl = NULL };
	NULL_EOPNOTSUPP(ibv_create_rwq_ind_table(ctx, &ra), "ibv_create_rwq_ind_table");

	/* Counters. */
	struct ibv_counters_init_attr ca = { .comp_mask = 0 };
	NULL_EOPNOTSUPP(ibv_create_counters(ctx, &ca), "ibv_create_counters");

	/* Memory registration variants. */
	NULL_EOPNOTSUPP(ibv_alloc_null_mr(pd), "ibv_alloc_null_mr");
	NULL_EOPNOTSUPP(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE),
			"ibv_reg_dmabuf_mr");
	struct ibv_sge asge = { (uintptr_t)buf, sizeof(buf), mr->lkey };
	RET_EOPNOTSUPP(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &asge, 1),
		       "ibv_advise_mr");

	/* CQ moderation, real-time values, rate limits, SRQ ops. */
	struct ibv_modify_cq_attr mca = { .attr_mask = IBV_CQ_ATTR_MODERATE,
					  .moderate = { .cq_count = 4, .cq_period = 10 } };
	RET_EOPNOTSUPP(ibv_modify_cq(cq, &mca), "ibv_modify_cq");
	struct ibv_values_ex vx = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	RET_EOPNOTSUPP(ibv_query_rt_values_ex(ctx, &vx), "ibv_query_rt_values_ex");
	struct ibv_qp_rate_limit_attr rl = { .rate_limit = 1000 };
	RET_EOPNOTSUPP(ibv_modify_qp_rate_limit(qp, &rl), "ibv_modify_qp_rate_limit");
	struct ibv_ops_wr op = { .wr_id = 1, .opcode = IBV_WR_TAG_ADD }, *bad_op = NULL;
	RET_EOPNOTSUPP(ibv_post_srq_ops(srq, &op, &bad_op), "ibv_post_srq_ops");
	CHECK(bad_op == &op, "ibv_post_srq_ops: bad_op not set");

	/* Enhanced connection establishment. */
	struct ibv_ece ece = { 0 };
	RET_EOPNOTSUPP(ibv_query_ece(qp, &ece), "ibv_query_ece");
	RET_EOPNOTSUPP(ibv_set_ece(qp, &ece), "ibv_set_ece");

	/* Importing objects of another process. */
	NULL_EOPNOTSUPP(ibv_import_device(ctx->cmd_fd), "ibv_import_device");
	NULL_EOPNOTSUPP(ibv_import_pd(ctx, 1), "ibv_import_pd");
	NULL_EOPNOTSUPP(ibv_import_mr(pd, 1), "ibv_import_mr");

	/* Work requests for what is not offered: refused with bad_wr. */
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 1 };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_QKEY) == 0,
	      "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	CHECK(ibv_query_gid(ctx, 1, 0, &aa.grh.dgid) == 0, "gid");
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "ah");
	int ops[] = { IBV_WR_BIND_MW, IBV_WR_TSO };
	const char *names[] = { "ibv_post_send IBV_WR_BIND_MW", "ibv_post_send IBV_WR_TSO" };
	for (int i = 0; i < 2; i++) {
		struct ibv_send_wr w = { .wr_id = 5, .opcode = ops[i] }, *bad = NULL;
		w.wr.ud.ah = ah;
		w.wr.ud.remote_qpn = qp->qp_num;
		w.wr.ud.remote_qkey = 1;
		RET_EOPNOTSUPP(ibv_post_send(qp, &w, &bad), names[i]);
		CHECK(bad == &w, "%s: bad_wr not set", names[i]);
	}

	CHECK(ibv_destroy_ah(ah) == 0 && ibv_destroy_qp(qp) == 0 && ibv_destroy_srq(srq) == 0 &&
		      ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0,
	      "teardown");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("conf_unsupported: OK\n");
	return 0;
}
