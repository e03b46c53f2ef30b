/*
 * conf_qp.c - conformance with rdma-core 44's man pages for queue pairs:
 * ibv_create_qp(3) (and ibv_destroy_qp), ibv_create_qp_ex(3),
 * ibv_modify_qp(3), ibv_query_qp(3), ibv_post_send(3), ibv_post_recv(3).
 *
 * Creation: every cap beyond ibv_query_device's limit is EINVAL, granted
 * caps are >= requested, ibv_query_qp's init_attr returns what was given.
 * ibv_modify_qp/ibv_query_qp round trips: an RC pair (connected to each
 * other, IB-style) through INIT, RTR, RTS with every attribute of each
 * transition, a UD QP with its qkey and sq_psn; refused modifications
 * (bad transition, state, port, P_Key index, MTU, RDMA Read depth) give
 * EINVAL and change nothing. Posting: requests a QP cannot take now
 * (state, SGEs, inline size) are EINVAL with bad_wr naming the request.
 *
 * Prints "conf_qp: <page>: OK" per page and "conf_qp: OK" at the end;
 * exits 1 at the first check that fails.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CONF_NAME "conf_qp"
#include "conf.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *scq, *rcq;
static struct ibv_device_attr dattr;

static struct ibv_qp_init_attr init_attr(enum ibv_qp_type t)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 16 },
		.qp_type = t,
	};
	return ia;
}

static void create_refused(struct ibv_qp_init_attr ia, const char *what)
{
	errno = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp == NULL && errno == EINVAL, "%s: qp %p errno %d", what, (void *)qp, errno);
}

static struct ibv_qp_attr query(struct ibv_qp *qp, struct ibv_qp_init_attr *ia)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr dummy;
	memset(&a, 0xcc, sizeof(a));
	CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_PKEY_INDEX |
				     IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_ACCESS_FLAGS | IBV_QP_AV |
				     IBV_QP_PATH_MTU | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_RQ_PSN | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER | IBV_QP_DEST_QPN | IBV_QP_CAP,
			  ia ? ia : &dummy) == 0,
	      "ibv_query_qp");
	return a;
}

/* A modification the man page's rules refuse: EINVAL, and the QP (state
 * and the attribute) unchanged. */
static void modify_refused(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	struct ibv_qp_attr before = query(qp, NULL);
	int r = ibv_modify_qp(qp, a, mask);
	CHECK(r == EINVAL, "%s: %d, want EINVAL", what, r);
	struct ibv_qp_attr after = query(qp, NULL);
	CHECK(after.qp_state == before.qp_state && qp->state == before.qp_state,
	      "%s: state moved %d -> %d", what, before.qp_state, after.qp_state);
	CHECK(after.port_num == before.port_num && after.pkey_index == before.pkey_index &&
		      after.path_mtu == before.path_mtu &&
		      after.max_rd_atomic == before.max_rd_atomic &&
		      after.qp_access_flags == before.qp_access_flags,
	      "%s: an attribute changed", what);
}

static const int rc_access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

static void rc_to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = rc_access };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS) == 0,
	      "RC RESET->INIT");
}

static struct ibv_qp_attr rtr_attr(uint32_t peer, uint32_t rq_psn)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 1;
	CHECK(ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid) == 0, "gid");
	return a;
}

static const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

static struct ibv_qp_attr rts_attr(uint32_t sq_psn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .sq_psn = sq_psn, .timeout = 14,
				 .retry_cnt = 6, .rnr_retry = 5, .max_rd_atomic = 3 };
	return a;
}

static const int rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;

int main(void)
{
	struct ibv_device **list;
	ctx = open_lo(&list);
	CHECK(ibv_query_device(ctx, &dattr) == 0, "query_device");
	pd = ibv_alloc_pd(ctx);
	scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && scq && rcq, "pd/cq: %s", strerror(errno));

	/* ibv_create_qp(3): limits from ibv_query_device are enforced. */
	struct ibv_qp_init_attr ia = init_attr(IBV_QPT_RC);
	ia.cap.max_send_wr = dattr.max_qp_wr + 1;
	create_refused(ia, "max_send_wr = max_qp_wr + 1");
	ia = init_attr(IBV_QPT_RC);
	ia.cap.max_recv_wr = dattr.max_qp_wr + 1;
	create_refused(ia, "max_recv_wr = max_qp_wr + 1");
	ia = init_attr(IBV_QPT_RC);
	ia.cap.max_send_sge = dattr.max_sge + 1;
	create_refused(ia, "max_send_sge = max_sge + 1");
	ia = init_attr(IBV_QPT_RC);
	ia.cap.max_recv_sge = dattr.max_sge + 1;
	create_refused(ia, "max_recv_sge = max_sge + 1");
	ia = init_attr(IBV_QPT_RC);
	ia.cap.max_inline_data = 1 << 20;
	create_refused(ia, "max_inline_data 1 MiB");
	ia = init_attr(IBV_QPT_RC);
	ia.send_cq = NULL;
	create_refused(ia, "no send CQ");
	/* "will fail if it is asked to create QP of a type other than
	 * IBV_QPT_RC or IBV_QPT_UD associated with an SRQ". */
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq, "srq");
	ia = init_attr(IBV_QPT_UC);
	ia.srq = srq;
	create_refused(ia, "UC QP on an SRQ");
	CHECK(ibv_destroy_srq(srq) == 0, "destroy srq");

	/* The largest caps the device reports are granted. */
	ia = init_attr(IBV_QPT_RC);
	ia.cap.max_send_wr = dattr.max_qp_wr;
	ia.cap.max_recv_wr = dattr.max_qp_wr;
	ia.cap.max_send_sge = dattr.max_sge;
	ia.cap.max_recv_sge = dattr.max_sge;
	struct ibv_qp *big = ibv_create_qp(pd, &ia);
	CHECK(big, "QP with the device's limits: %s", strerror(errno));
	CHECK(ibv_destroy_qp(big) == 0, "destroy big");

	/* Granted caps >= requested; the QP's fields. */
	int tag;
	ia = init_attr(IBV_QPT_RC);
	ia.qp_context = &tag;
	ia.sq_sig_all = 1;
	ia.cap.max_send_wr = 10;
	ia.cap.max_recv_wr = 20;
	ia.cap.max_send_sge = 2;
	ia.cap.max_recv_sge = 3;
	ia.cap.max_inline_data = 32;
	struct ibv_qp_init_attr want = ia;
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	CHECK(a, "ibv_create_qp RC: %s", strerror(errno));
	CHECK(ia.cap.max_send_wr >= 10 && ia.cap.max_recv_wr >= 20 && ia.cap.max_send_sge >= 2 &&
		      ia.cap.max_recv_sge >= 3 && ia.cap.max_inline_data >= 32,
	      "granted caps below requested: wr %u/%u sge %u/%u inline %u", ia.cap.max_send_wr,
	      ia.cap.max_recv_wr, ia.cap.max_send_sge, ia.cap.max_recv_sge,
	      ia.cap.max_inline_data);
	CHECK(a->context == ctx && a->pd == pd && a->send_cq == scq && a->recv_cq == rcq &&
		      a->srq == NULL && a->qp_context == &tag && a->qp_type == IBV_QPT_RC &&
		      a->state == IBV_QPS_RESET && a->qp_num != 0,
	      "QP fields after create");
	PAGE_OK("ibv_create_qp");

	/* ibv_query_qp(3) right after create: RESET, init_attr as given. */
	struct ibv_qp_init_attr qi;
	memset(&qi, 0xcc, sizeof(qi));
	struct ibv_qp_attr q = query(a, &qi);
	CHECK(q.qp_state == IBV_QPS_RESET, "state %d", q.qp_state);
	CHECK(qi.qp_type == IBV_QPT_RC && qi.sq_sig_all == 1 && qi.send_cq == scq &&
		      qi.recv_cq == rcq && qi.srq == NULL && qi.qp_context == &tag,
	      "init_attr: type %d sq_sig_all %d", qi.qp_type, qi.sq_sig_all);
	CHECK(qi.cap.max_send_wr >= want.cap.max_send_wr &&
		      qi.cap.max_recv_wr >= want.cap.max_recv_wr &&
		      qi.cap.max_send_sge >= want.cap.max_send_sge &&
		      qi.cap.max_recv_sge >= want.cap.max_recv_sge &&
		      qi.cap.max_inline_data >= want.cap.max_inline_data,
	      "init_attr caps below requested");
	CHECK(q.cap.max_send_wr == qi.cap.max_send_wr && q.cap.max_recv_wr == qi.cap.max_recv_wr,
	      "attr.cap differs from init_attr.cap");

	/* ibv_post_send(3) / ibv_post_recv(3) in RESET: EINVAL, bad_wr. */
	static char buf[256];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad_rw = NULL;
	CHECK(ibv_post_recv(a, &rw, &bad_rw) == EINVAL && bad_rw == &rw,
	      "post_recv in RESET");
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND },
			   *bad_sw = NULL;
	CHECK(ibv_post_send(a, &sw, &bad_sw) == EINVAL && bad_sw == &sw, "post_send in RESET");

	/* ibv_modify_qp(3): refused transitions and attributes. */
	struct ibv_qp_attr m;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTS;
	modify_refused(a, &m, IBV_QP_STATE, "RESET -> RTS");
	m.qp_state = 42;
	modify_refused(a, &m, IBV_QP_STATE, "state 42");
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.port_num = dattr.phys_port_cnt + 1;
	m.qp_access_flags = rc_access;
	modify_refused(a, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
		       "port phys_port_cnt + 1");
	m.port_num = 0;
	modify_refused(a, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
		       "port 0");
	m.port_num = 1;
	m.pkey_index = dattr.max_pkeys;
	modify_refused(a, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
		       "pkey_index max_pkeys");

	/* RESET -> INIT: the state, port, P_Key index and access flags. */
	rc_to_init(a);
	CHECK(a->state == IBV_QPS_INIT, "qp->state %d after INIT", a->state);
	q = query(a, NULL);
	CHECK(q.qp_state == IBV_QPS_INIT && q.port_num == 1 && q.pkey_index == 0 &&
		      q.qp_access_flags == rc_access,
	      "after INIT: state %d port %u pkey %u access %#x", q.qp_state, q.port_num,
	      q.pkey_index, q.qp_access_flags);
	/* INIT -> INIT changes the access flags only. */
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CHECK(ibv_modify_qp(a, &m, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS) == 0, "INIT -> INIT");
	q = query(a, NULL);
	CHECK(q.qp_state == IBV_QPS_INIT && q.qp_access_flags == IBV_ACCESS_REMOTE_WRITE,
	      "INIT -> INIT access %#x", q.qp_access_flags);
	memset(&m, 0, sizeof(m));
	m.qp_access_flags = rc_access;
	CHECK(ibv_modify_qp(a, &m, IBV_QP_ACCESS_FLAGS) == 0, "access flags without a state");
	CHECK(query(a, NULL).qp_access_flags == rc_access, "access flags back");
	/* A receive may be posted from INIT on. */
	bad_rw = NULL;
	CHECK(ibv_post_recv(a, &rw, &bad_rw) == 0, "post_recv in INIT: %s", strerror(errno));

	/* The peer: a second RC QP. */
	ia = init_attr(IBV_QPT_RC);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(b, "second RC QP");
	rc_to_init(b);

	/* INIT -> RTR: refused attribute values first. */
	m = rtr_attr(b->qp_num, 0x123456);
	m.path_mtu = 0;
	modify_refused(a, &m, rtr_mask, "path_mtu 0");
	m.path_mtu = IBV_MTU_4096 + 1;
	modify_refused(a, &m, rtr_mask, "path_mtu above 4096");
	m = rtr_attr(b->qp_num, 0x123456);
	m.ah_attr.port_num = dattr.phys_port_cnt + 1;
	modify_refused(a, &m, rtr_mask, "AV port phys_port_cnt + 1");
	m = rtr_attr(b->qp_num, 0x123456);
	m.ah_attr.grh.sgid_index = gid_tbl_len(ctx);
	modify_refused(a, &m, rtr_mask, "AV sgid_index beyond the GID table");
	m = rtr_attr(b->qp_num, 0x123456);
	m.cur_qp_state = 42;
	modify_refused(a, &m, rtr_mask | IBV_QP_CUR_STATE, "cur_qp_state 42");
	m = rtr_attr(b->qp_num, 0x123456);
	m.max_dest_rd_atomic = dattr.max_qp_rd_atom + 1;
	modify_refused(a, &m, rtr_mask, "max_dest_rd_atomic = max_qp_rd_atom + 1");
	m = rtr_attr(b->qp_num, 0x123456);
	CHECK(ibv_modify_qp(a, &m, rtr_mask) == 0, "RC INIT->RTR: %s", strerror(errno));
	q = query(a, NULL);
	CHECK(q.qp_state == IBV_QPS_RTR && a->state == IBV_QPS_RTR, "state %d after RTR",
	      q.qp_state);
	CHECK(q.path_mtu == IBV_MTU_1024 && q.dest_qp_num == b->qp_num && q.rq_psn == 0x123456 &&
		      q.max_dest_rd_atomic == 4 && q.min_rnr_timer == 12,
	      "after RTR: mtu %d dest %u rq_psn %#x dest_rd %u rnr_timer %u", q.path_mtu,
	      q.dest_qp_num, q.rq_psn, q.max_dest_rd_atomic, q.min_rnr_timer);
	CHECK(q.ah_attr.is_global == 1 && q.ah_attr.port_num == 1 &&
		      !memcmp(&q.ah_attr.grh.dgid, &m.ah_attr.grh.dgid, sizeof(union ibv_gid)),
	      "after RTR: the AV differs");
	CHECK(q.port_num == 1 && q.qp_access_flags == rc_access, "INIT attributes lost at RTR");
	m = rtr_attr(a->qp_num, 0x654321);
	CHECK(ibv_modify_qp(b, &m, rtr_mask) == 0, "peer RTR");

	/* RTR -> RTS. */
	m = rts_attr(0xabcdef);
	m.max_rd_atomic = dattr.max_qp_init_rd_atom + 1;
	modify_refused(a, &m, rts_mask, "max_rd_atomic = max_qp_init_rd_atom + 1");
	m = rts_attr(0xabcdef);
	CHECK(ibv_modify_qp(a, &m, rts_mask) == 0, "RC RTR->RTS: %s", strerror(errno));
	q = query(a, NULL);
	CHECK(q.qp_state == IBV_QPS_RTS && a->state == IBV_QPS_RTS, "state %d after RTS",
	      q.qp_state);
	CHECK(q.sq_psn == 0xabcdef && q.timeout == 14 && q.retry_cnt == 6 && q.rnr_retry == 5 &&
		      q.max_rd_atomic == 3,
	      "after RTS: sq_psn %#x timeout %u retry %u rnr_retry %u rd_atomic %u", q.sq_psn,
	      q.timeout, q.retry_cnt, q.rnr_retry, q.max_rd_atomic);
	CHECK(q.rq_psn == 0x123456 && q.dest_qp_num == b->qp_num && q.path_mtu == IBV_MTU_1024,
	      "RTR attributes lost at RTS");
	m = rts_attr(1);
	CHECK(ibv_modify_qp(b, &m, rts_mask) == 0, "peer RTS");
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	modify_refused(a, &m, IBV_QP_STATE, "RTS -> INIT");

	/* ibv_post_send(3): too many SGEs, inline beyond max_inline_data,
	 * the failing request in bad_wr (the ones before it posted). */
	struct ibv_sge sges[64];
	for (int i = 0; i < 64; i++)
		sges[i] = sge;
	struct ibv_send_wr ok = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr many = ok;
	many.wr_id = 4;
	many.sg_list = sges;
	many.num_sge = qi.cap.max_send_sge + 1;
	ok.next = &many;
	bad_sw = NULL;
	CHECK(qi.cap.max_send_sge < 64, "max_send_sge %u", qi.cap.max_send_sge);
	CHECK(ibv_post_send(a, &ok, &bad_sw) == EINVAL && bad_sw == &many,
	      "num_sge max_send_sge + 1: bad_wr %p", (void *)bad_sw);
	static char big_inline[1 << 16];
	struct ibv_sge isge = { .addr = (uintptr_t)big_inline,
				.length = qi.cap.max_inline_data + 1 };
	struct ibv_send_wr inl = { .wr_id = 5, .sg_list = &isge, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE };
	CHECK(qi.cap.max_inline_data < sizeof(big_inline), "max_inline_data %u",
	      qi.cap.max_inline_data);
	bad_sw = NULL;
	CHECK(ibv_post_send(a, &inl, &bad_sw) == EINVAL && bad_sw == &inl,
	      "inline max_inline_data + 1");
	PAGE_OK("ibv_post_send");

	/* ibv_post_recv(3): too many SGEs. */
	struct ibv_recv_wr rmany = { .wr_id = 6, .sg_list = sges,
				     .num_sge = qi.cap.max_recv_sge + 1 };
	bad_rw = NULL;
	CHECK(ibv_post_recv(a, &rmany, &bad_rw) == EINVAL && bad_rw == &rmany,
	      "recv num_sge max_recv_sge + 1");
	PAGE_OK("ibv_post_recv");

	/* To ERR and back to RESET is where a QP can go from any state. */
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(a, &m, IBV_QP_STATE) == 0, "RTS -> ERR");
	CHECK(query(a, NULL).qp_state == IBV_QPS_ERR && a->state == IBV_QPS_ERR, "ERR");
	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy RC pair");

	/* UD: qkey at INIT, sq_psn at RTS. */
	ia = init_attr(IBV_QPT_UD);
	struct ibv_qp *ud = ibv_create_qp(pd, &ia);
	CHECK(ud && ud->qp_type == IBV_QPT_UD, "UD QP: %s", strerror(errno));
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.port_num = 1;
	m.qkey = 0x11111111;
	CHECK(ibv_modify_qp(ud, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) ==
		      0,
	      "UD INIT");
	q = query(ud, &qi);
	CHECK(q.qp_state == IBV_QPS_INIT && q.qkey == 0x11111111 && q.port_num == 1 &&
		      q.pkey_index == 0 && qi.qp_type == IBV_QPT_UD,
	      "UD after INIT: qkey %#x", q.qkey);
	/* A send before RTS is refused. */
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	CHECK(ibv_query_gid(ctx, 1, 0, &aa.grh.dgid) == 0, "gid");
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "ibv_create_ah: %s", strerror(errno));
	struct ibv_send_wr usw = { .wr_id = 7, .sg_list = &sge, .num_sge = 1,
				   .opcode = IBV_WR_SEND };
	usw.wr.ud.ah = ah;
	usw.wr.ud.remote_qpn = ud->qp_num;
	usw.wr.ud.remote_qkey = 0x11111111;
	bad_sw = NULL;
	CHECK(ibv_post_send(ud, &usw, &bad_sw) == EINVAL && bad_sw == &usw, "UD send in INIT");
	m.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(ud, &m, IBV_QP_STATE) == 0, "UD RTR");
	m.qp_state = IBV_QPS_RTS;
	m.sq_psn = 0x42;
	CHECK(ibv_modify_qp(ud, &m, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UD RTS");
	q = query(ud, NULL);
	CHECK(q.qp_state == IBV_QPS_RTS && q.sq_psn == 0x42 && q.qkey == 0x11111111,
	      "UD after RTS: state %d sq_psn %#x qkey %#x", q.qp_state, q.sq_psn, q.qkey);
	memset(&m, 0, sizeof(m));
	m.qkey = 0x22222222;
	CHECK(ibv_modify_qp(ud, &m, IBV_QP_QKEY) == 0, "UD qkey in RTS");
	CHECK(query(ud, NULL).qkey == 0x22222222, "UD qkey changed in RTS");
	CHECK(ibv_destroy_ah(ah) == 0, "destroy ah");
	CHECK(ibv_destroy_qp(ud) == 0, "destroy UD");
	PAGE_OK("ibv_modify_qp");
	PAGE_OK("ibv_query_qp");

	/* ibv_create_qp_ex(3): only PD is the basic call; send_ops_flags the
	 * device lacks are EOPNOTSUPP; an ibv_qp_ex is there. */
	struct ibv_qp_init_attr_ex ix = {
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
	};
	struct ibv_qp *x = ibv_create_qp_ex(ctx, &ix);
	CHECK(x, "ibv_create_qp_ex: %s", strerror(errno));
	CHECK(ibv_qp_to_qp_ex(x) != NULL, "ibv_qp_to_qp_ex");
	q = query(x, &qi);
	CHECK(qi.qp_type == IBV_QPT_RC && qi.sq_sig_all == 1 && q.qp_state == IBV_QPS_RESET,
	      "create_qp_ex init_attr");
	CHECK(ibv_destroy_qp(x) == 0, "destroy qp_ex");
	struct ibv_qp_init_attr_ex bx = ix;
	bx.send_ops_flags |= IBV_QP_EX_WITH_BIND_MW;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &bx) == NULL && errno == EOPNOTSUPP,
	      "send_ops_flags BIND_MW: errno %d", errno);
	bx = ix;
	bx.send_ops_flags = IBV_QP_EX_WITH_TSO;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &bx) == NULL && errno == EOPNOTSUPP,
	      "send_ops_flags TSO: errno %d", errno);
	bx = ix;
	bx.qp_type = IBV_QPT_UD;
	bx.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &bx) == NULL && errno == EOPNOTSUPP,
	      "UD with RDMA Write: errno %d", errno);
	bx = ix;
	bx.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	bx.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &bx) == NULL && errno == EOPNOTSUPP,
	      "create_flags: errno %d", errno);
	bx = ix;
	bx.comp_mask = IBV_QP_INIT_ATTR_PD;
	x = ibv_create_qp_ex(ctx, &bx);
	CHECK(x && x->qp_type == IBV_QPT_RC, "create_qp_ex with PD only: %s", strerror(errno));
	CHECK(ibv_destroy_qp(x) == 0, "destroy");
	PAGE_OK("ibv_create_qp_ex");

	CHECK(ibv_dereg_mr(mr) == 0, "dereg");
	CHECK(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(rcq) == 0, "destroy cqs");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc pd");
	PAGE_OK("ibv_destroy_qp");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("conf_qp: OK\n");
	return 0;
}
