/*
 * conf_srq.c - conformance with rdma-core 44's man pages for shared
 * receive queues: ibv_create_srq(3) (and ibv_destroy_srq),
 * ibv_create_srq_ex(3), ibv_modify_srq(3), ibv_query_srq(3),
 * ibv_post_srq_recv(3), and the SRQ limit event of ibv_get_async_event(3).
 *
 * Limits from ibv_query_device are enforced (max_srq_wr + 1, max_srq_sge + 1
 * refused), granted sizes are >= requested, ibv_query_srq returns the
 * srq_limit ibv_modify_srq set, and 0 once the limit event has fired;
 * refused modifications change nothing.
 *
 * Prints "conf_srq: <page>: OK" per page and "conf_srq: OK" at the end;
 * exits 1 at the first check that fails.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CONF_NAME "conf_srq"
#include "conf.h"

static struct ibv_context *ctx;

static void connect_qp(struct ibv_qp *qp, uint32_t peer_qpn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS),
	      "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 1;
	CHECK(!ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid), "gid");
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
	      "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC),
	      "RTS");
}

static void srq_refused(struct ibv_pd *pd, struct ibv_srq_init_attr si, const char *what)
{
	errno = 0;
	struct ibv_srq *s = ibv_create_srq(pd, &si);
	CHECK(s == NULL && errno == EINVAL, "%s: srq %p errno %d", what, (void *)s, errno);
}

static struct ibv_srq_attr query(struct ibv_srq *srq)
{
	struct ibv_srq_attr a;
	memset(&a, 0xcc, sizeof(a));
	CHECK(ibv_query_srq(srq, &a) == 0, "ibv_query_srq");
	return a;
}

int main(void)
{
	struct ibv_device **list;
	ctx = open_lo(&list);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0, "query_device");
	CHECK(da.max_srq > 0, "device without SRQs");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd, "pd");

	/* ibv_create_srq(3): the device's limits; granted >= requested. */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = da.max_srq_wr + 1, .max_sge = 1 } };
	srq_refused(pd, si, "max_wr = max_srq_wr + 1");
	si.attr.max_wr = 8;
	si.attr.max_sge = da.max_srq_sge + 1;
	srq_refused(pd, si, "max_sge = max_srq_sge + 1");
	si.attr.max_wr = da.max_srq_wr;
	si.attr.max_sge = da.max_srq_sge;
	struct ibv_srq *bigs = ibv_create_srq(pd, &si);
	CHECK(bigs, "SRQ with the device's limits: %s", strerror(errno));
	CHECK(ibv_destroy_srq(bigs) == 0, "destroy big SRQ");
	int tag;
	si.srq_context = &tag;
	si.attr.max_wr = 8;
	si.attr.max_sge = 2;
	si.attr.srq_limit = 0;
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq, "ibv_create_srq: %s", strerror(errno));
	CHECK(si.attr.max_wr >= 8 && si.attr.max_sge >= 2, "granted max_wr %u max_sge %u",
	      si.attr.max_wr, si.attr.max_sge);
	CHECK(srq->context == ctx && srq->pd == pd && srq->srq_context == &tag,
	      "SRQ fields");
	PAGE_OK("ibv_create_srq");

	/* ibv_query_srq(3): what creation granted; no limit armed. */
	struct ibv_srq_attr q = query(srq);
	CHECK(q.max_wr >= 8 && q.max_sge >= 2 && q.srq_limit == 0,
	      "query: max_wr %u max_sge %u limit %u", q.max_wr, q.max_sge, q.srq_limit);
	uint32_t max_wr = q.max_wr;

	/* ibv_modify_srq(3): IBV_SRQ_LIMIT round trip; a limit above max_wr
	 * refused; resizing only where IBV_DEVICE_SRQ_RESIZE says so, and a
	 * refused call changes nothing. */
	struct ibv_srq_attr m = { .srq_limit = 5 };
	CHECK(ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT) == 0, "arm limit 5");
	CHECK(query(srq).srq_limit == 5, "limit after modify: %u", query(srq).srq_limit);
	m.srq_limit = max_wr + 1;
	CHECK(ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT) == EINVAL, "limit max_wr + 1");
	CHECK(query(srq).srq_limit == 5, "limit after refused modify");
	if (!(da.device_cap_flags & IBV_DEVICE_SRQ_RESIZE)) {
		m.max_wr = max_wr * 2;
		m.srq_limit = 2;
		CHECK(ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) == EOPNOTSUPP,
		      "resize without IBV_DEVICE_SRQ_RESIZE");
		q = query(srq);
		CHECK(q.max_wr == max_wr && q.srq_limit == 5, "refused resize changed max_wr %u limit %u",
		      q.max_wr, q.srq_limit);
	}
	m.srq_limit = 3;
	CHECK(ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT) == 0, "arm limit 3");
	CHECK(query(srq).srq_limit == 3, "limit 3");

	/* ibv_post_srq_recv(3): too many SGEs, more than max_wr: refused with
	 * bad_wr. */
	static char buf[8][64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_sge sges[64];
	for (int i = 0; i < 64; i++) {
		sges[i].addr = (uintptr_t)buf[i % 8];
		sges[i].length = 64;
		sges[i].lkey = mr->lkey;
	}
	struct ibv_recv_wr many = { .wr_id = 99, .sg_list = sges, .num_sge = q.max_sge + 1 },
			   *bad = NULL;
	CHECK(q.max_sge < 64, "max_sge %u", q.max_sge);
	CHECK(ibv_post_srq_recv(srq, &many, &bad) == EINVAL && bad == &many, "num_sge max_sge + 1");
	struct ibv_recv_wr rw[64];
	CHECK(max_wr < 64, "max_wr %u", max_wr);
	for (uint32_t i = 0; i <= max_wr; i++) {
		rw[i].wr_id = i;
		rw[i].sg_list = &sges[i % 8];
		rw[i].num_sge = 1;
		rw[i].next = i < max_wr ? &rw[i + 1] : NULL;
	}
	bad = NULL;
	CHECK(ibv_post_srq_recv(srq, rw, &bad) != 0 && bad == &rw[max_wr],
	      "max_wr + 1 receives: bad_wr %p (want %p)", (void *)bad, (void *)&rw[max_wr]);
	PAGE_OK("ibv_post_srq_recv");

	/* A QP on the SRQ: ibv_query_qp names it. Sends from a peer take
	 * receives until fewer than the limit remain: the limit event comes,
	 * and ibv_query_srq reports the limit disarmed (0). */
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq, "cq");
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .srq = srq,
				       .cap = { .max_send_wr = 16, .max_send_sge = 1 },
				       .qp_type = IBV_QPT_RC };
	struct ibv_qp *d = ibv_create_qp(pd, &qa);
	CHECK(d, "QP on the SRQ: %s", strerror(errno));
	qa.srq = NULL;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_recv_sge = 1;
	struct ibv_qp *c = ibv_create_qp(pd, &qa);
	CHECK(c, "peer QP");
	struct ibv_qp_attr qq;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(d, &qq, IBV_QP_CAP, &qi) == 0 && qi.srq == srq && d->srq == srq,
	      "QP does not name its SRQ");
	CHECK(ibv_destroy_srq(srq) == EBUSY, "SRQ with a QP not EBUSY");
	connect_qp(c, d->qp_num);
	connect_qp(d, c->qp_num);
	uint32_t sends = max_wr - 2; /* leaves 2 < limit 3 */
	for (uint32_t i = 0; i < sends; i++) {
		struct ibv_send_wr sw = { .wr_id = 100 + i, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *sbad;
		CHECK(ibv_post_send(c, &sw, &sbad) == 0, "send %u: %s", i, strerror(errno));
	}
	unsigned got = 0;
	for (int spins = 0; got < 2 * sends && spins < 20000000; spins++) {
		struct ibv_wc wc[8];
		int n = ibv_poll_cq(cq, 8, wc);
		CHECK(n >= 0, "poll");
		for (int i = 0; i < n; i++)
			CHECK(wc[i].status == IBV_WC_SUCCESS, "completion status %s",
			      ibv_wc_status_str(wc[i].status));
		got += n;
	}
	CHECK(got == 2 * sends, "%u of %u completions", got, 2 * sends);
	/* The connections' "communication established" events may come
	 * first. */
	struct ibv_async_event ev;
	for (int i = 0;; i++) {
		CHECK(i < 8, "no SRQ limit event among the first 8");
		CHECK(ibv_get_async_event(ctx, &ev) == 0, "get_async_event");
		ibv_ack_async_event(&ev);
		if (ev.event_type == IBV_EVENT_COMM_EST)
			continue;
		CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq,
		      "event %s", ibv_event_type_str(ev.event_type));
		break;
	}
	CHECK(query(srq).srq_limit == 0, "limit after its event: %u", query(srq).srq_limit);
	PAGE_OK("ibv_get_async_event");
	PAGE_OK("ibv_modify_srq");
	PAGE_OK("ibv_query_srq");

	CHECK(ibv_destroy_qp(c) == 0 && ibv_destroy_qp(d) == 0, "destroy QPs");
	CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
	PAGE_OK("ibv_destroy_srq");

	/* ibv_create_srq_ex(3): a basic SRQ through the extended call; XRC
	 * SRQs are not offered (EOPNOTSUPP). */
	struct ibv_srq_init_attr_ex sx = {
		.attr = { .max_wr = 4, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE,
		.srq_type = IBV_SRQT_BASIC,
		.pd = pd,
	};
	struct ibv_srq *s2 = ibv_create_srq_ex(ctx, &sx);
	CHECK(s2 && sx.attr.max_wr >= 4, "ibv_create_srq_ex basic: %s", strerror(errno));
	CHECK(query(s2).max_wr >= 4, "basic SRQ_ex max_wr");
	CHECK(ibv_destroy_srq(s2) == 0, "destroy srq_ex");
	sx.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ |
		       IBV_SRQ_INIT_ATTR_XRCD;
	sx.srq_type = IBV_SRQT_XRC;
	sx.cq = cq;
	errno = 0;
	CHECK(ibv_create_srq_ex(ctx, &sx) == NULL && errno == EOPNOTSUPP, "XRC SRQ: errno %d",
	      errno);
	PAGE_OK("ibv_create_srq_ex");

	CHECK(ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0,
	      "teardown");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("conf_srq: OK\n");
	return 0;
}
