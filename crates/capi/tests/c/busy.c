/*
 * busy.c - rdma-core's EBUSY rules (ibv_alloc_pd(3), ibv_create_cq(3),
 * ibv_create_srq(3)) in one process on softrdma_lo: ibv_dealloc_pd,
 * ibv_destroy_cq and ibv_destroy_srq return EBUSY and keep the object
 * while something still uses it, and 0 once the users are gone.
 *
 *   cc -Wall -Werror -o busy busy.c -I crates/capi/include \
 *      -L target/debug -libverbs
 *   softrdma run -- ./busy
 *
 * Users checked: an AH, an SRQ, an RC QP (ibv_create_qp and
 * ibv_create_qp_ex on an ibv_create_cq_ex CQ) on a PD; a QP on its send and
 * on its receive CQ (also one CQ in both roles); a QP on its SRQ; a SoftDC
 * DCT on its PD, CQ and SRQ; a DCI on its PD and CQ. An object refused with
 * EBUSY is used afterwards (MR registration, polling, SRQ receives), and
 * failed creations leave no use behind. MRs are the exception (they do
 * not hold their PD: perftest 4.5 leaks one on iWARP). Prints one "busy: ..." line per
 * check and "busy: OK" at the end, exits 1 at the first failure.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <softrdma/verbs.h>

#define CHECK(c, ...)                                                  \
	do {                                                           \
		if (!(c)) {                                            \
			fprintf(stderr, "busy: FAILED: " __VA_ARGS__); \
			fprintf(stderr, " (line %d, errno %d)\n",      \
				__LINE__, errno);                      \
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

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *scq,
			    struct ibv_cq *rcq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq,
		.recv_cq = rcq,
		.srq = srq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = srq ? 0 : 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);

	CHECK(qp, "ibv_create_qp: %s", strerror(errno));
	return qp;
}

/* The PD is still usable: an MR registers and deregisters in it. */
static void pd_usable(struct ibv_pd *pd, char *buf)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 64, IBV_ACCESS_LOCAL_WRITE);

	CHECK(mr, "reg_mr on a PD refused with EBUSY");
	CHECK(!ibv_dereg_mr(mr), "dereg_mr");
}

/* The CQ is still usable: polling it works (and finds nothing). */
static void cq_usable(struct ibv_cq *cq)
{
	struct ibv_wc wc;

	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "poll a CQ refused with EBUSY");
	CHECK(!ibv_req_notify_cq(cq, 0), "arm a CQ refused with EBUSY");
}

int main(void)
{
	static char buf[4096];
	struct ibv_context *ctx = open_lo();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *cq2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);

	CHECK(pd && pd2 && cq && cq2, "alloc PDs and CQs");
	CHECK(ibv_dealloc_pd(NULL) == EINVAL && ibv_destroy_cq(NULL) == EINVAL &&
		      ibv_destroy_srq(NULL) == EINVAL,
	      "NULL objects");

	/* ---- PD with only MRs: deallocated (softrdma's one exception to
	 * the rule, docs/capi.md: perftest 4.5 leaks an MR on iWARP);
	 * the MRs deregister afterwards ---- */
	struct ibv_pd *pd3 = ibv_alloc_pd(ctx);
	CHECK(pd3, "alloc_pd");
	struct ibv_mr *mr = ibv_reg_mr(pd3, buf, sizeof(buf),
				       IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_mr *mr2 = ibv_reg_mr_iova2(pd3, buf, 64, 0x1000,
					      IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2, "reg_mr_iova2");
	CHECK(!ibv_dealloc_pd(pd3), "dealloc_pd with only MRs");
	CHECK(!ibv_dereg_mr(mr), "dereg_mr after its PD");
	CHECK(!ibv_dereg_mr(mr2), "dereg_mr (iova) after its PD");
	printf("busy: PD with only MRs: deallocated, MRs deregister after\n");

	/* ---- PD with an AH ---- */
	struct ibv_ah_attr aa = { .port_num = 1 };
	struct ibv_ah *ah = ibv_create_ah(pd2, &aa);
	CHECK(ah, "create_ah");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with an AH");
	CHECK(!ibv_destroy_ah(ah), "destroy_ah");
	printf("busy: PD with an AH: EBUSY\n");

	/* ---- PD with a QP, CQs with a QP ---- */
	struct ibv_qp *qp = rc_qp(pd, cq, cq2, NULL);
	CHECK(qp->pd == pd && qp->send_cq == cq && qp->recv_cq == cq2,
	      "QP fields");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with a QP");
	CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy_cq (send CQ of a QP)");
	CHECK(ibv_destroy_cq(cq2) == EBUSY, "destroy_cq (recv CQ of a QP)");
	pd_usable(pd, buf);
	cq_usable(cq);
	cq_usable(cq2);
	CHECK(!ibv_destroy_qp(qp), "destroy_qp");
	/* One CQ in both roles: held twice, released twice. */
	qp = rc_qp(pd, cq, cq, NULL);
	CHECK(ibv_destroy_cq(cq) == EBUSY, "destroy_cq (both CQs of a QP)");
	CHECK(!ibv_destroy_qp(qp), "destroy_qp");
	printf("busy: PD with a QP, CQ with a QP: EBUSY\n");

	/* ---- extended CQ and QP ---- */
	struct ibv_cq_init_attr_ex ca = { .cqe = 16,
					  .wc_flags = IBV_WC_EX_WITH_BYTE_LEN };
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ca);
	CHECK(cqx, "create_cq_ex");
	struct ibv_qp_init_attr_ex iax = {
		.send_cq = ibv_cq_ex_to_cq(cqx),
		.recv_cq = cq2,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd2,
	};
	struct ibv_qp *qpx = ibv_create_qp_ex(ctx, &iax);
	CHECK(qpx, "create_qp_ex");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == EBUSY,
	      "destroy_cq (an extended CQ of a QP)");
	CHECK(ibv_destroy_cq(cq2) == EBUSY, "destroy_cq (recv CQ of a QP ex)");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with a QP ex");
	CHECK(!ibv_destroy_qp(qpx), "destroy_qp (ex)");
	CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), "destroy_cq (ex)");
	printf("busy: extended CQ with an extended QP: EBUSY\n");

	/* ---- SRQ: on its PD, with a QP ---- */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq, "create_srq");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with an SRQ");
	qp = rc_qp(pd, cq, cq, srq);
	CHECK(ibv_destroy_srq(srq) == EBUSY, "destroy_srq with a QP");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64 };
	struct ibv_mr *rmr = ibv_reg_mr(pd, buf, sizeof(buf),
					IBV_ACCESS_LOCAL_WRITE);
	CHECK(rmr, "reg_mr (SRQ receive)");
	sge.lkey = rmr->lkey;
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad = NULL;
	CHECK(!ibv_post_srq_recv(srq, &rwr, &bad),
	      "post_srq_recv on an SRQ refused with EBUSY");
	struct ibv_srq_attr sq;
	CHECK(!ibv_query_srq(srq, &sq) && sq.max_wr >= 8, "query_srq");
	CHECK(!ibv_destroy_qp(qp), "destroy_qp (SRQ)");
	printf("busy: SRQ with a QP, PD with an SRQ: EBUSY\n");

	/* ---- SoftDC: a DCT on PD, CQ, SRQ; a DCI on PD, CQ ---- */
	struct ibv_sdc_dct *dct = ibv_sdc_create_dct(pd, cq, srq, 0x1234, NULL);
	CHECK(dct, "ibv_sdc_create_dct: %s", strerror(errno));
	CHECK(ibv_dealloc_pd(pd) == EBUSY && ibv_destroy_cq(cq) == EBUSY &&
		      ibv_destroy_srq(srq) == EBUSY,
	      "PD/CQ/SRQ of a DCT");
	CHECK(!ibv_dereg_mr(rmr), "dereg_mr (SRQ receive)");
	CHECK(!ibv_destroy_qp(rc_qp(pd, cq, cq, srq)),
	      "a QP on the DCT's objects");
	CHECK(ibv_dealloc_pd(pd) == EBUSY && ibv_destroy_cq(cq) == EBUSY &&
		      ibv_destroy_srq(srq) == EBUSY,
	      "PD/CQ/SRQ of a DCT (after a QP came and went)");
	CHECK(!ibv_sdc_destroy_dct(dct), "destroy_dct");
	printf("busy: PD, CQ and SRQ with a DCT: EBUSY\n");

	struct ibv_sdc_qp_init_attr di = { .send_cq = cq2,
					   .cap = { .max_send_wr = 4 } };
	struct ibv_sdc_qp *dci = ibv_sdc_create_qp(pd2, &di);
	CHECK(dci, "ibv_sdc_create_qp: %s", strerror(errno));
	CHECK(ibv_destroy_cq(cq2) == EBUSY, "destroy_cq with a DCI");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "dealloc_pd with a DCI");
	cq_usable(cq2);
	CHECK(!ibv_sdc_destroy_qp(dci), "destroy DCI");
	printf("busy: CQ and PD with a DCI: EBUSY\n");

	/* ---- failed creations leave no use behind ---- */
	struct ibv_qp_init_attr big = {
		.send_cq = cq, .recv_cq = cq2, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1u << 30, .max_recv_wr = 4 },
	};
	CHECK(!ibv_create_qp(pd, &big), "a QP with 2^30 WRs");
	struct ibv_qp_init_attr ud_srq = {
		.send_cq = cq, .recv_cq = cq2, .srq = srq,
		.qp_type = IBV_QPT_UD, .cap = { .max_send_wr = 4 },
	};
	CHECK(!ibv_create_qp(pd, &ud_srq), "a UD QP on an SRQ");
	CHECK(!ibv_create_qp(pd2, &(struct ibv_qp_init_attr){
		.send_cq = cq, .recv_cq = cq2, .srq = srq,
		.qp_type = IBV_QPT_RC, .cap = { .max_send_wr = 4 } }),
	      "a QP on an SRQ of another PD");
	CHECK(!ibv_sdc_create_dct(pd2, cq, srq, 1, NULL),
	      "a DCT on an SRQ of another PD");
	struct ibv_sdc_qp_init_attr bad_di = { .send_cq = cq2,
					       .cap = { .max_send_wr = 4,
							.max_recv_wr = 1 } };
	CHECK(!ibv_sdc_create_qp(pd, &bad_di), "a DCI with receives");
	struct ibv_srq_init_attr bad_sa = { .attr = { .max_wr = 0 } };
	CHECK(!ibv_create_srq(pd2, &bad_sa), "an SRQ of 0 WRs");

	/* ---- once the users are gone, destroying succeeds ---- */
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with the SRQ left");
	CHECK(!ibv_destroy_srq(srq), "destroy_srq");
	CHECK(!ibv_destroy_cq(cq), "destroy_cq");
	CHECK(!ibv_destroy_cq(cq2), "destroy_cq 2");
	CHECK(!ibv_dealloc_pd(pd), "dealloc_pd");
	CHECK(!ibv_dealloc_pd(pd2), "dealloc_pd 2");
	printf("busy: after their users, PD/CQ/SRQ go with 0\n");
	CHECK(!ibv_close_device(ctx), "close");
	printf("busy: OK\n");
	return 0;
}
