/*
 * conf_ah_mcast.c - conformance with rdma-core 44's man pages for address
 * handles, completion events and multicast, over a UD QP that sends to
 * itself: ibv_create_ah(3) (and ibv_destroy_ah), ibv_create_ah_from_wc(3)
 * (and ibv_init_ah_from_wc), ibv_req_notify_cq(3) + ibv_get_cq_event(3) +
 * ibv_ack_cq_events(3) with real completions (one event per request,
 * "one shot"), ibv_poll_cq(3) fields of a UD receive (GRH, src_qp,
 * byte_len), ibv_attach_mcast(3) (and ibv_detach_mcast).
 *
 * Prints "conf_ah_mcast: <page>: OK" per page and "conf_ah_mcast: OK" at
 * the end; exits 1 at the first check that fails.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CONF_NAME "conf_ah_mcast"
#include "conf.h"

#define QKEY 0x11111111u
#define MSG 24

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[4096];

/* Receive into buf[1024..] (40 octets of GRH room first). */
static void post_recv(uint64_t id)
{
	struct ibv_sge s = { (uintptr_t)buf + 1024, 40 + MSG, mr->lkey };
	struct ibv_recv_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(qp, &w, &bad) == 0, "post_recv");
}

static void send_flags(struct ibv_ah *ah, uint64_t id, char fill, unsigned flags)
{
	memset(buf, fill, MSG);
	struct ibv_sge s = { (uintptr_t)buf, MSG, mr->lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED | flags },
			   *bad;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = qp->qp_num;
	w.wr.ud.remote_qkey = QKEY;
	CHECK(ibv_post_send(qp, &w, &bad) == 0, "post_send: %s", strerror(errno));
}

static void send_to(struct ibv_ah *ah, uint64_t id, char fill)
{
	send_flags(ah, id, fill, 0);
}

/* Blocks (bounded by poll(2)) for the channel's next event; returns its CQ. */
static struct ibv_cq *wait_event(struct ibv_comp_channel *ch, void *want_ctx)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 20000) == 1, "no completion event in 20 s");
	struct ibv_cq *cq = NULL;
	void *cq_ctx = NULL;
	CHECK(ibv_get_cq_event(ch, &cq, &cq_ctx) == 0, "ibv_get_cq_event: %s", strerror(errno));
	CHECK(cq_ctx == want_ctx, "cq_context %p, want %p", cq_ctx, want_ctx);
	return cq;
}

static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n = 0;
	for (int spins = 0; n == 0 && spins < 20000000; spins++)
		n = ibv_poll_cq(cq, 1, &wc);
	CHECK(n == 1, "no completion (%d)", n);
	CHECK(wc.status == IBV_WC_SUCCESS, "completion: %s", ibv_wc_status_str(wc.status));
	return wc;
}

static void ah_refused(struct ibv_ah_attr aa, const char *what)
{
	errno = 0;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah == NULL && errno == EINVAL, "%s: ah %p errno %d", what, (void *)ah, errno);
}

int main(void)
{
	struct ibv_device **list;
	ctx = open_lo(&list);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "pd");
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "mr");
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch, "channel");
	int rtag, stag;
	struct ibv_cq *rcq = ibv_create_cq(ctx, 16, &rtag, ch, 0);
	struct ibv_cq *scq = ibv_create_cq(ctx, 16, &stag, NULL, 0);
	CHECK(rcq && scq, "cqs");
	struct ibv_qp_init_attr ia = { .send_cq = scq, .recv_cq = rcq,
				       .cap = { .max_send_wr = 8, .max_recv_wr = 8,
						.max_send_sge = 1, .max_recv_sge = 1 },
				       .qp_type = IBV_QPT_UD };
	qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "UD QP: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_QKEY) == 0,
	      "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");

	/* ibv_create_ah(3): an AH to this port's GID 0. */
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "gid");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	aa.grh.dgid = gid;
	aa.grh.hop_limit = 64;
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "ibv_create_ah: %s", strerror(errno));
	CHECK(ah->pd == pd && ah->context == ctx, "AH fields");
	struct ibv_ah_attr bad = aa;
	bad.port_num = 2;
	ah_refused(bad, "port 2");
	bad = aa;
	bad.grh.sgid_index = gid_tbl_len(ctx);
	ah_refused(bad, "sgid_index beyond the GID table");

	/* ibv_req_notify_cq(3) + ibv_get_cq_event(3): one event per request. */
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	CHECK(ibv_req_notify_cq(rcq, 0) == 0, "req_notify");
	post_recv(1);
	post_recv(2);
	send_to(ah, 10, 'a');
	struct ibv_cq *ev = wait_event(ch, &rtag);
	CHECK(ev == rcq, "event for CQ %p, want %p", (void *)ev, (void *)rcq);
	unsigned events = 1;
	struct ibv_wc s = poll_one(scq);
	CHECK(s.wr_id == 10 && s.opcode == IBV_WC_SEND, "send completion %llu op %d",
	      (unsigned long long)s.wr_id, s.opcode);

	/* ibv_poll_cq(3): a UD receive: GRH, source QP, length with GRH. */
	struct ibv_wc r = poll_one(rcq);
	CHECK(r.wr_id == 1 && r.opcode == IBV_WC_RECV, "recv wr_id %llu op %d",
	      (unsigned long long)r.wr_id, r.opcode);
	CHECK(r.wc_flags & IBV_WC_GRH, "UD receive without IBV_WC_GRH");
	CHECK(r.byte_len == 40 + MSG, "byte_len %u, want %u", r.byte_len, 40 + MSG);
	CHECK(r.src_qp == qp->qp_num && r.qp_num == qp->qp_num, "src_qp %#x qp_num %#x",
	      r.src_qp, r.qp_num);
	CHECK(buf[1024 + 40] == 'a' && buf[1024 + 40 + MSG - 1] == 'a', "payload");
	PAGE_OK("ibv_poll_cq");

	/* Not re-armed: a second completion brings no event. */
	send_to(ah, 11, 'b');
	poll_one(scq);
	r = poll_one(rcq);
	CHECK(r.wr_id == 2, "second receive %llu", (unsigned long long)r.wr_id);
	struct ibv_cq *evcq;
	void *evctx;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &evcq, &evctx) == -1 && errno == EAGAIN,
	      "an event without a request: errno %d", errno);
	PAGE_OK("ibv_req_notify_cq");
	PAGE_OK("ibv_get_cq_event");

	/* ibv_init_ah_from_wc / ibv_create_ah_from_wc (3): an AH back to the
	 * sender of a received datagram. */
	post_recv(3);
	CHECK(ibv_req_notify_cq(rcq, 0) == 0, "re-arm");
	struct ibv_grh *grh = (struct ibv_grh *)(buf + 1024);
	struct ibv_ah_attr fa;
	memset(&fa, 0xee, sizeof(fa));
	CHECK(ibv_init_ah_from_wc(ctx, 1, &r, grh, &fa) == 0, "ibv_init_ah_from_wc");
	CHECK(fa.is_global == 1 && fa.port_num == 1 && !memcmp(&fa.grh.dgid, &gid, sizeof(gid)),
	      "AH attributes from the completion: global %u port %u", fa.is_global, fa.port_num);
	uint32_t flow_class = be32toh(grh->version_tclass_flow);
	CHECK(fa.dlid == r.slid && fa.sl == r.sl && fa.src_path_bits == r.dlid_path_bits &&
		      fa.grh.hop_limit == 0xff && fa.grh.flow_label == (flow_class & 0xfffff) &&
		      fa.grh.traffic_class == ((flow_class >> 20) & 0xff) &&
		      fa.grh.sgid_index < gid_tbl_len(ctx),
	      "AH from WC: dlid %u sl %u hop_limit %u flow_label %#x tclass %#x", fa.dlid, fa.sl,
	      fa.grh.hop_limit, fa.grh.flow_label, fa.grh.traffic_class);
	struct ibv_ah *back = ibv_create_ah_from_wc(pd, &r, grh, 1);
	CHECK(back, "ibv_create_ah_from_wc: %s", strerror(errno));
	send_to(back, 12, 'c');
	ev = wait_event(ch, &rtag);
	CHECK(ev == rcq, "second event's CQ");
	events++;
	poll_one(scq);
	r = poll_one(rcq);
	CHECK(r.wr_id == 3 && buf[1024 + 40] == 'c', "reply through the AH from the WC");
	CHECK(ibv_destroy_ah(back) == 0, "destroy AH from WC");
	PAGE_OK("ibv_create_ah_from_wc");

	/* Solicited only: an unsolicited receive brings no event, a
	 * solicited one (IBV_SEND_SOLICITED at the sender) does. */
	post_recv(4);
	post_recv(5);
	CHECK(ibv_req_notify_cq(rcq, 1) == 0, "arm solicited only");
	send_to(ah, 13, 'd');
	poll_one(scq);
	r = poll_one(rcq);
	CHECK(r.wr_id == 4, "unsolicited receive %llu", (unsigned long long)r.wr_id);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &evcq, &evctx) == -1 && errno == EAGAIN,
	      "an event for an unsolicited receive: errno %d", errno);
	send_flags(ah, 14, 'e', IBV_SEND_SOLICITED);
	ev = wait_event(ch, &rtag);
	CHECK(ev == rcq, "solicited event's CQ");
	events++;
	poll_one(scq);
	r = poll_one(rcq);
	CHECK(r.wr_id == 5 && buf[1024 + 40] == 'e', "solicited receive");
	PAGE_OK("ibv_req_notify_cq solicited_only");

	/* ibv_ack_cq_events(3): every event acknowledged, the CQ goes. */
	ibv_ack_cq_events(rcq, events);
	CHECK(rcq->comp_events_completed == events, "comp_events_completed %u, want %u",
	      rcq->comp_events_completed, events);
	PAGE_OK("ibv_ack_cq_events");

	/* ibv_attach_mcast(3): a UD QP joins and leaves; attaching twice is
	 * allowed; other QP types and non-multicast GIDs are refused. */
	union ibv_gid mgid;
	memset(&mgid, 0, sizeof(mgid));
	mgid.raw[10] = mgid.raw[11] = 0xff;
	inet_pton(AF_INET, "239.7.7.7", &mgid.raw[12]);
	CHECK(ibv_attach_mcast(qp, &mgid, 0) == 0, "attach: %s", strerror(errno));
	CHECK(ibv_attach_mcast(qp, &mgid, 0) == 0, "attach twice");
	CHECK(ibv_detach_mcast(qp, &mgid, 0) == 0, "detach");
	CHECK(ibv_detach_mcast(qp, &mgid, 0) != 0, "detach of a group not attached");
	CHECK(ibv_attach_mcast(qp, &gid, 0) == EINVAL, "unicast GID not EINVAL");
	ia.qp_type = IBV_QPT_RC;
	struct ibv_qp *rc = ibv_create_qp(pd, &ia);
	CHECK(rc, "RC QP");
	CHECK(ibv_attach_mcast(rc, &mgid, 0) == EINVAL, "RC QP attach: not EINVAL");
	CHECK(ibv_destroy_qp(rc) == 0, "destroy RC");
	PAGE_OK("ibv_attach_mcast");

	/* ibv_destroy_ah(3). */
	CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
	PAGE_OK("ibv_create_ah");

	CHECK(ibv_destroy_qp(qp) == 0, "destroy qp");
	CHECK(ibv_destroy_cq(rcq) == 0 && ibv_destroy_cq(scq) == 0, "destroy cqs");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0, "teardown");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("conf_ah_mcast: OK\n");
	return 0;
}
