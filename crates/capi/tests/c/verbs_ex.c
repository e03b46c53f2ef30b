/*
 * verbs_ex.c - the extended verbs through the header inlines, in one
 * process over softrdma_lo: ibv_query_device_ex, ibv_create_cq_ex with
 * ibv_start_poll/ibv_next_poll/ibv_end_poll and ibv_wc_read_*,
 * ibv_create_qp_ex with send_ops_flags, ibv_qp_to_qp_ex and the ibv_wr_*
 * calls (send, send with immediate, RDMA write, RDMA read, fetch-and-add,
 * inline data), a completion channel whose fd poll(2) reports readable, and
 * ibv_query_qp. Two RC QPs are connected IB-style (RTR with each other's
 * GID and QPN). An SRQ's limit event arrives through a pollable async_fd.
 * Both fds are made O_NONBLOCK: the get calls fail with EAGAIN when idle.
 * Prints "verbs_ex: OK" and exits 0 when every check holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include <infiniband/verbs.h>

#define CHECK(c, ...)                                               \
	do {                                                        \
		if (!(c)) {                                         \
			fprintf(stderr, "verbs_ex: " __VA_ARGS__);  \
			fprintf(stderr, " (errno %d)\n", errno);    \
			exit(1);                                    \
		}                                                   \
	} while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;

static struct ibv_qp *make_qp(struct ibv_cq_ex *cq)
{
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = ibv_cq_ex_to_cq(cq),
		.recv_cq = ibv_cq_ex_to_cq(cq),
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32,
			 .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				  IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &ia);

	CHECK(qp, "ibv_create_qp_ex");
	CHECK(ia.cap.max_inline_data >= 64, "inline %u", ia.cap.max_inline_data);
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t peer_qpn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				 IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.hop_limit = 1;
	CHECK(!ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid), "gid");
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				 IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
	      "RTR");
}

static void to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7,
				 .max_rd_atomic = 4 };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
				 IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), "RTS");
}

/* Polls one completion with the extended API. */
static void next(struct ibv_cq_ex *cq, uint64_t wr_id, enum ibv_wc_opcode op,
		 uint32_t len)
{
	struct ibv_poll_cq_attr pa = {0};
	int r;

	for (long i = 0; i < 200000000L; i++) {
		r = ibv_start_poll(cq, &pa);
		if (r != ENOENT)
			break;
	}
	CHECK(r == 0, "start_poll %d", r);
	CHECK(cq->status == IBV_WC_SUCCESS, "status %d for wr %llu", cq->status,
	      (unsigned long long)cq->wr_id);
	CHECK(cq->wr_id == wr_id, "wr_id %llu want %llu",
	      (unsigned long long)cq->wr_id, (unsigned long long)wr_id);
	CHECK(ibv_wc_read_opcode(cq) == op, "opcode %d want %d",
	      ibv_wc_read_opcode(cq), op);
	if (len)
		CHECK(ibv_wc_read_byte_len(cq) == len, "len %u want %u",
		      ibv_wc_read_byte_len(cq), len);
	ibv_end_poll(cq);
}

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_device_attr_ex dx;
	struct ibv_comp_channel *ch;
	struct ibv_cq_init_attr_ex ca = { .cqe = 64,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
			    IBV_WC_EX_WITH_QP_NUM };
	struct ibv_cq_ex *cqa, *cqb;
	struct ibv_qp *a, *b;
	struct ibv_qp_ex *x;
	char *ma = calloc(1, 4096), *mb = calloc(1, 4096);
	struct ibv_mr *ra, *rb;
	struct ibv_recv_wr rw, *bad;
	struct ibv_sge s;
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	struct pollfd pfd;
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	uint64_t *counter;

	CHECK(l, "device list");
	for (int i = 0; l[i]; i++)
		if (!strcmp(ibv_get_device_name(l[i]), "softrdma_lo"))
			ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	CHECK(ctx, "softrdma_lo");
	CHECK(!ibv_query_device_ex(ctx, NULL, &dx), "query_device_ex");
	CHECK(dx.orig_attr.max_qp_rd_atom > 0 &&
	      dx.orig_attr.atomic_cap == IBV_ATOMIC_HCA, "device attrs");
	pd = ibv_alloc_pd(ctx);
	ch = ibv_create_comp_channel(ctx);
	CHECK(pd && ch, "pd/channel");
	/* O_NONBLOCK on the channel and async fds: the get calls fail with
	 * EAGAIN while there is nothing, instead of waiting. */
	CHECK(!fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) &&
	      !fcntl(ctx->async_fd, F_SETFL,
		     fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK), "O_NONBLOCK");
	{
		struct ibv_async_event aev;

		errno = 0;
		CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 &&
		      errno == EAGAIN, "get_cq_event on an idle non-blocking "
		      "channel: errno %d", errno);
		errno = 0;
		CHECK(ibv_get_async_event(ctx, &aev) == -1 && errno == EAGAIN,
		      "get_async_event on an idle non-blocking fd: errno %d",
		      errno);
	}
	ca.channel = NULL;
	cqa = ibv_create_cq_ex(ctx, &ca);
	ca.channel = ch;
	ca.cq_context = (void *)0x1234;
	cqb = ibv_create_cq_ex(ctx, &ca);
	CHECK(cqa && cqb, "ibv_create_cq_ex");
	ra = ibv_reg_mr(pd, ma, 4096, IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	rb = ibv_reg_mr(pd, mb, 4096, IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(ra && rb, "reg_mr");

	a = make_qp(cqa);
	b = make_qp(cqb);
	/* B posts its receives in INIT, before the connection exists. */
	connect_qp(a, b->qp_num);
	for (int i = 0; i < 2; i++) {
		s = (struct ibv_sge){ (uintptr_t)mb + 1024 * i, 1024, rb->lkey };
		rw = (struct ibv_recv_wr){ .wr_id = 100 + i, .sg_list = &s,
					   .num_sge = 1 };
		if (i == 0) {
			struct ibv_qp_attr ia = { .qp_state = IBV_QPS_INIT,
						  .port_num = 1 };
			CHECK(!ibv_modify_qp(b, &ia, IBV_QP_STATE |
					     IBV_QP_PKEY_INDEX | IBV_QP_PORT),
			      "B INIT");
		}
		CHECK(!ibv_post_recv(b, &rw, &bad), "post_recv");
	}
	connect_qp(b, a->qp_num);
	to_rts(a);
	to_rts(b);
	CHECK(!ibv_req_notify_cq(ibv_cq_ex_to_cq(cqb), 0), "req_notify");

	x = ibv_qp_to_qp_ex(a);
	CHECK(x, "qp_to_qp_ex");
	strcpy(ma, "hello over softrdma");
	ibv_wr_start(x);
	x->wr_id = 1;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, ra->lkey, (uintptr_t)ma, 20);
	x->wr_id = 2;
	ibv_wr_send_imm(x, htonl(0xabcdef));
	ibv_wr_set_inline_data(x, "inline!", 8);
	CHECK(!ibv_wr_complete(x), "wr_complete (sends)");
	next(cqa, 1, IBV_WC_SEND, 0);
	next(cqa, 2, IBV_WC_SEND, 0);

	/* B's CQ fired its channel: the fd is readable. */
	pfd = (struct pollfd){ .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 10000) == 1 && (pfd.revents & POLLIN),
	      "channel fd not readable");
	CHECK(!ibv_get_cq_event(ch, &ev_cq, &ev_ctx), "get_cq_event");
	CHECK(ev_cq == ibv_cq_ex_to_cq(cqb) && ev_ctx == (void *)0x1234,
	      "event names the CQ and its context");
	ibv_ack_cq_events(ev_cq, 1);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "second get_cq_event: errno %d", errno);
	next(cqb, 100, IBV_WC_RECV, 20);
	CHECK(!strcmp(mb, "hello over softrdma"), "payload");
	next(cqb, 101, IBV_WC_RECV, 8);
	CHECK(!strcmp(mb + 1024, "inline!"), "inline payload");

	/* One-sided: write into B, read it back, fetch-and-add. */
	memset(ma, 'w', 100);
	counter = (uint64_t *)(mb + 2048);
	*counter = 40;
	ibv_wr_start(x);
	x->wr_id = 3;
	ibv_wr_rdma_write(x, rb->rkey, (uintptr_t)mb + 3000);
	ibv_wr_set_sge(x, ra->lkey, (uintptr_t)ma, 100);
	x->wr_id = 4;
	ibv_wr_rdma_read(x, rb->rkey, (uintptr_t)mb);
	ibv_wr_set_sge(x, ra->lkey, (uintptr_t)ma + 1024, 20);
	x->wr_id = 5;
	ibv_wr_atomic_fetch_add(x, rb->rkey, (uintptr_t)counter, 2);
	ibv_wr_set_sge(x, ra->lkey, (uintptr_t)ma + 2048, 8);
	CHECK(!ibv_wr_complete(x), "wr_complete (one-sided)");
	next(cqa, 3, IBV_WC_RDMA_WRITE, 0);
	next(cqa, 4, IBV_WC_RDMA_READ, 20);
	next(cqa, 5, IBV_WC_FETCH_ADD, 8);
	CHECK(mb[3000] == 'w' && mb[3099] == 'w', "write landed");
	CHECK(!strcmp(ma + 1024, "hello over softrdma"), "read data");
	CHECK(*(uint64_t *)(ma + 2048) == 40 && *counter == 42, "fetch-add");

	/* IB-style QPs keep InfiniBand's meaning of a Write completion: the
	 * target holds the data once the Write completes at the initiator,
	 * so it is read right after each completion. */
	for (uint64_t i = 1; i <= 2000; i++) {
		uint64_t got;

		memset(ma + 3072, (int)(i & 0xff), 1024);
		memcpy(ma + 3072, &i, sizeof(i));
		ibv_wr_start(x);
		x->wr_id = 1000 + i;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, rb->rkey, (uintptr_t)mb + 3072);
		ibv_wr_set_sge(x, ra->lkey, (uintptr_t)ma + 3072, 1024);
		CHECK(!ibv_wr_complete(x), "wr_complete (write %llu)",
		      (unsigned long long)i);
		next(cqa, 1000 + i, IBV_WC_RDMA_WRITE, 0);
		memcpy(&got, mb + 3072, sizeof(got));
		CHECK(got == i && (unsigned char)mb[4095] == (i & 0xff),
		      "write %llu completed before it was placed (target holds "
		      "%llu)", (unsigned long long)i, (unsigned long long)got);
	}
	printf("verbs_ex: 2000 RDMA Writes placed when they completed\n");

	/* A batch can be aborted; an empty poll says ENOENT. */
	ibv_wr_start(x);
	ibv_wr_send(x);
	ibv_wr_abort(x);
	{
		struct ibv_poll_cq_attr pa = {0};
		CHECK(ibv_start_poll(cqa, &pa) == ENOENT, "nothing to poll");
	}

	/* An SRQ with an armed limit: the async event arrives on async_fd. */
	{
		struct ibv_srq_init_attr si = { .attr = { .max_wr = 8,
							  .max_sge = 1 } };
		struct ibv_srq_attr sa = { .srq_limit = 3 };
		struct ibv_qp_init_attr ci = {
			.send_cq = ibv_cq_ex_to_cq(cqa),
			.recv_cq = ibv_cq_ex_to_cq(cqa), .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 8, .max_send_sge = 1 },
		};
		struct ibv_srq *srq = ibv_create_srq(pd, &si);
		struct ibv_qp *c, *d;
		struct ibv_async_event ev;

		CHECK(srq, "create_srq");
		for (int i = 0; i < 4; i++) {
			s = (struct ibv_sge){ (uintptr_t)mb + 512 * i, 512,
					      rb->lkey };
			rw = (struct ibv_recv_wr){ .wr_id = 200 + i,
						   .sg_list = &s,
						   .num_sge = 1 };
			CHECK(!ibv_post_srq_recv(srq, &rw, &bad),
			      "post_srq_recv");
		}
		CHECK(!ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT), "arm limit");
		ci.srq = srq;
		c = ibv_create_qp(pd, &ci);
		ci.srq = NULL;
		ci.cap.max_recv_wr = 4;
		ci.cap.max_recv_sge = 1;
		d = ibv_create_qp(pd, &ci);
		CHECK(c && d, "SRQ QPs");
		connect_qp(c, d->qp_num);
		connect_qp(d, c->qp_num);
		to_rts(c);
		to_rts(d);
		x = ibv_qp_to_qp_ex(d);
		ibv_wr_start(x);
		for (int i = 0; i < 2; i++) {
			x->wr_id = 300 + i;
			x->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_send(x);
			ibv_wr_set_inline_data(x, "srq", 4);
		}
		CHECK(!ibv_wr_complete(x), "wr_complete (srq sends)");
		/* Two sends and two SRQ receives, in some order. */
		for (int n = 0; n < 4; n++) {
			struct ibv_poll_cq_attr pa = {0};
			int r = ENOENT;

			for (long i = 0; i < 200000000L && r == ENOENT; i++)
				r = ibv_start_poll(cqa, &pa);
			CHECK(r == 0 && cqa->status == IBV_WC_SUCCESS,
			      "srq completion %d status %d", n, cqa->status);
			ibv_end_poll(cqa);
		}
		/* Connections report IBV_EVENT_COMM_EST first; then the limit. */
		for (int n = 0;; n++) {
			CHECK(n < 16, "no SRQ limit event");
			pfd = (struct pollfd){ .fd = ctx->async_fd,
					       .events = POLLIN };
			CHECK(poll(&pfd, 1, 10000) == 1,
			      "async fd not readable");
			CHECK(!ibv_get_async_event(ctx, &ev), "get_async_event");
			ibv_ack_async_event(&ev);
			if (ev.event_type == IBV_EVENT_COMM_EST)
				continue;
			CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
			      ev.element.srq == srq, "async event %d",
			      ev.event_type);
			break;
		}
		CHECK(!ibv_destroy_qp(c) && !ibv_destroy_qp(d), "destroy SRQ QPs");
		CHECK(!ibv_destroy_srq(srq), "destroy_srq");
		x = ibv_qp_to_qp_ex(a);
	}

	CHECK(!ibv_query_qp(b, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi), "query_qp");
	CHECK(qa.qp_state == IBV_QPS_RTS && qi.qp_type == IBV_QPT_RC &&
	      qa.dest_qp_num == a->qp_num, "query_qp values");

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy qp");
	CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(cqa)) &&
	      !ibv_destroy_cq(ibv_cq_ex_to_cq(cqb)), "destroy cq");
	CHECK(!ibv_destroy_comp_channel(ch), "destroy channel");
	CHECK(!ibv_dereg_mr(ra) && !ibv_dereg_mr(rb), "dereg");
	CHECK(!ibv_dealloc_pd(pd), "dealloc pd");
	CHECK(!ibv_close_device(ctx), "close");
	printf("verbs_ex: OK\n");
	return 0;
}
