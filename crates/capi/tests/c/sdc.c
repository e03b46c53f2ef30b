/*
 * sdc.c - SoftDC's C API (ibv_sdc_* of softrdma/verbs.h) in one process on
 * softrdma_lo: two DC targets sharing an SRQ and a CQ (with a completion
 * channel), DC initiators reaching them through one address handle.
 *
 *   cc -Wall -Werror -o sdc sdc.c -I crates/capi/include \
 *      -L target/debug -libverbs
 *   softrdma run -- ./sdc
 *
 * Checks: Send with immediate, RDMA Write, RDMA Read and fetch-and-add
 * posted as one chain (data, completion opcodes, byte_len, imm, wr_id and
 * order); a chain with a destination per work request; a wrong DC key
 * (error completion, counted at the DCT); an unknown DCT number; bad
 * arguments (errno values, bad_wr, a full send queue, a DCT number of
 * port 0, a chain longer than its destinations); completions through
 * a completion channel on both sides. Prints one "sdc: ..." line per
 * check and "sdc: OK" at the end, exits 1 at the first failure.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <time.h>

#include <infiniband/verbs.h>
#include <softrdma/verbs.h>

#define CHECK(c, ...)                                         \
	do {                                                  \
		if (!(c)) {                                   \
			fprintf(stderr, "sdc: FAILED: " __VA_ARGS__); \
			fprintf(stderr, " (line %d)\n", __LINE__);    \
			exit(1);                              \
		}                                             \
	} while (0)

#define KEY 0x5eedc0ffee123456ULL
#define KEY2 0x2222ULL

/* Layout of the one registered buffer. */
#define RECV_OFF 0	  /* NRECV receives of 64 octets */
#define NRECV 8
#define SRC_OFF 1024	  /* what is sent and written */
#define WRITE_OFF 2048	  /* RDMA Write target */
#define READ_OFF 3072	  /* RDMA Read destination */
#define ATOMIC_OFF 3584	  /* fetch-and-add target */
#define RESULT_OFF 3592	  /* fetch-and-add original value */
#define BUF_LEN 4096
#define WRITE_LEN 200

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

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* One completion of cq within 20 s, busy-polling (which also drives the
 * DCI). */
static void poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double end = now_s() + 20;

	while (now_s() < end) {
		int n = ibv_poll_cq(cq, 1, wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n == 1)
			return;
	}
	CHECK(0, "no completion within 20 s");
}

static void post_srq_recv(struct ibv_srq *srq, struct ibv_mr *mr, int i)
{
	struct ibv_sge sge = { .addr = (uintptr_t)mr->addr + RECV_OFF + 64 * i,
			       .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge,
				  .num_sge = 1 };
	struct ibv_recv_wr *bad;

	CHECK(!ibv_post_srq_recv(srq, &wr, &bad), "ibv_post_srq_recv");
}

static const char *wc_name(struct ibv_wc *wc)
{
	switch (wc->opcode) {
	case IBV_WC_SEND: return "SEND";
	case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "RDMA_READ";
	case IBV_WC_FETCH_ADD: return "FETCH_ADD";
	case IBV_WC_RECV: return "RECV";
	default: return "?";
	}
}

int main(void)
{
	struct ibv_context *ctx;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ctx = open_lo();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *dci_cq = ibv_create_cq(ctx, 64, (void *)0x5c5d, ch, 0);
	struct ibv_cq *dct_cq = ibv_create_cq(ctx, 64, (void *)0x7c7c, ch, 0);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	struct ibv_srq *srq2 = ibv_create_srq(pd2, &sa);
	uint8_t *buf = aligned_alloc(4096, BUF_LEN);
	struct ibv_mr *mr;
	struct ibv_wc wc;
	struct ibv_send_wr *bad = NULL;
	struct ibv_sdc_stats st;

	CHECK(pd && pd2 && ch && dci_cq && dct_cq && srq && srq2 && buf,
	      "verbs objects");
	memset(buf, 0, BUF_LEN);
	mr = ibv_reg_mr(pd, buf, BUF_LEN,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(mr, "ibv_reg_mr: %s", strerror(errno));

	/* ---- bad arguments ---- */
	errno = 0;
	CHECK(!ibv_sdc_create_dct(NULL, dct_cq, srq, KEY, NULL) &&
		      errno == EINVAL, "create_dct(NULL pd): errno %d", errno);
	errno = 0;
	CHECK(!ibv_sdc_create_dct(pd, dct_cq, NULL, KEY, NULL) &&
		      errno == EINVAL, "create_dct(NULL srq): errno %d", errno);
	errno = 0;
	CHECK(!ibv_sdc_create_dct(pd, dct_cq, srq2, KEY, NULL) &&
		      errno == EINVAL,
	      "create_dct(SRQ of another PD): errno %d", errno);
	struct ibv_sdc_attr bad_attr = { .comp_mask = 1u << 20 };
	errno = 0;
	CHECK(!ibv_sdc_create_dct(pd, dct_cq, srq, KEY, &bad_attr) &&
		      errno == EOPNOTSUPP,
	      "create_dct(unknown comp_mask): errno %d", errno);
	struct ibv_sdc_qp_init_attr bad_ia = { .send_cq = dci_cq,
					       .cap = { .max_send_wr = 4,
							.max_recv_wr = 4 } };
	errno = 0;
	CHECK(!ibv_sdc_create_qp(pd, &bad_ia) && errno == EINVAL,
	      "create_qp(receive queue): errno %d", errno);
	errno = 0;
	CHECK(!ibv_sdc_create_qp(pd, NULL) && errno == EINVAL,
	      "create_qp(NULL attr): errno %d", errno);
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	errno = 0;
	CHECK(!ibv_sdc_create_ah(pd, (struct sockaddr *)&sun) &&
		      errno == EAFNOSUPPORT,
	      "create_ah(AF_UNIX): errno %d", errno);
	struct sockaddr_in6 s6 = { .sin6_family = AF_INET6,
				   .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	errno = 0;
	CHECK(!ibv_sdc_create_ah(pd, (struct sockaddr *)&s6) &&
		      errno == EOPNOTSUPP,
	      "create_ah(::1): errno %d", errno);
	errno = 0;
	CHECK(!ibv_sdc_create_ah(pd, NULL) && errno == EINVAL,
	      "create_ah(NULL): errno %d", errno);
	CHECK(ibv_sdc_destroy_dct(NULL) == EINVAL, "destroy_dct(NULL)");
	CHECK(ibv_sdc_destroy_qp(NULL) == EINVAL, "destroy_qp(NULL)");
	CHECK(ibv_sdc_destroy_ah(NULL) == EINVAL, "destroy_ah(NULL)");
	printf("sdc: bad arguments refused with EINVAL/EOPNOTSUPP/EAFNOSUPPORT\n");

	/* ---- objects ---- */
	struct ibv_sdc_attr attr = {
		.comp_mask = IBV_SDC_ATTR_CAPACITY | IBV_SDC_ATTR_INVITE_TIMEOUT,
		.capacity = 16,
		.invite_timeout_ms = 5000, /* the unknown DCT waits this long */
	};
	struct ibv_sdc_dct *dct = ibv_sdc_create_dct(pd, dct_cq, srq, KEY, &attr);
	CHECK(dct, "ibv_sdc_create_dct: %s", strerror(errno));
	CHECK(dct->pd == pd && dct->cq == dct_cq && dct->srq == srq &&
		      dct->dc_key == KEY && dct->context == ctx,
	      "DCT fields");
	struct ibv_sdc_dct *dct2 =
		ibv_sdc_create_dct(pd, dct_cq, srq, KEY2, NULL);
	CHECK(dct2 && dct2->dct_num != dct->dct_num, "second DCT");

	struct ibv_sdc_qp_init_attr ia = {
		.qp_context = (void *)0x5c5c,
		.send_cq = dci_cq,
		.cap = { .max_send_wr = 16, .max_send_sge = 1 },
	};
	struct ibv_sdc_qp *dci = ibv_sdc_create_qp(pd, &ia);
	CHECK(dci, "ibv_sdc_create_qp: %s", strerror(errno));
	CHECK(dci->send_cq == dci_cq && dci->pd == pd &&
		      dci->qp_context == (void *)0x5c5c &&
		      ia.cap.max_send_wr == 16 && ia.cap.max_send_sge >= 1 &&
		      dci->cap.max_send_wr == 16,
	      "DCI fields / granted caps");

	struct sockaddr_in sin = { .sin_family = AF_INET };
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct ibv_ah *ah = ibv_sdc_create_ah(pd, (struct sockaddr *)&sin);
	CHECK(ah && ah->pd == pd, "ibv_sdc_create_ah: %s", strerror(errno));
	struct ibv_ah *ah_pd2 = ibv_sdc_create_ah(pd2, (struct sockaddr *)&sin);
	CHECK(ah_pd2, "ibv_sdc_create_ah(pd2)");
	printf("sdc: DCT %#x and %#x, DCI qp_num %u\n", dct->dct_num,
	       dct2->dct_num, dci->qp_num);

	for (int i = 0; i < NRECV; i++)
		post_srq_recv(srq, mr, i);
	CHECK(!ibv_req_notify_cq(dct_cq, 0), "ibv_req_notify_cq");

	/* ---- one chain: Send+imm, Write, Read, fetch-and-add ---- */
	const char msg[] = "hello, dynamically connected";
	memcpy(buf + SRC_OFF, msg, sizeof(msg));
	for (int i = 0; i < WRITE_LEN; i++)
		buf[SRC_OFF + 64 + i] = (uint8_t)(i * 7 + 3);
	uint64_t forty = 40;
	memcpy(buf + ATOMIC_OFF, &forty, 8);

	uint64_t base = (uintptr_t)buf;
	struct ibv_sge s_send = { base + SRC_OFF, sizeof(msg), mr->lkey };
	struct ibv_sge s_write = { base + SRC_OFF + 64, WRITE_LEN, mr->lkey };
	struct ibv_sge s_read = { base + READ_OFF, WRITE_LEN, mr->lkey };
	struct ibv_sge s_atomic = { base + RESULT_OFF, 8, mr->lkey };
	struct ibv_send_wr w[4];
	memset(w, 0, sizeof(w));
	w[0] = (struct ibv_send_wr){ .wr_id = 1, .next = &w[1],
				     .sg_list = &s_send, .num_sge = 1,
				     .opcode = IBV_WR_SEND_WITH_IMM,
				     .send_flags = IBV_SEND_SIGNALED,
				     .imm_data = htonl(0xdc0001) };
	w[1] = (struct ibv_send_wr){ .wr_id = 2, .next = &w[2],
				     .sg_list = &s_write, .num_sge = 1,
				     .opcode = IBV_WR_RDMA_WRITE,
				     .send_flags = IBV_SEND_SIGNALED };
	w[1].wr.rdma.remote_addr = base + WRITE_OFF;
	w[1].wr.rdma.rkey = mr->rkey;
	w[2] = (struct ibv_send_wr){ .wr_id = 3, .next = &w[3],
				     .sg_list = &s_read, .num_sge = 1,
				     .opcode = IBV_WR_RDMA_READ,
				     .send_flags = IBV_SEND_SIGNALED };
	w[2].wr.rdma.remote_addr = base + WRITE_OFF;
	w[2].wr.rdma.rkey = mr->rkey;
	w[3] = (struct ibv_send_wr){ .wr_id = 4, .next = NULL,
				     .sg_list = &s_atomic, .num_sge = 1,
				     .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				     .send_flags = IBV_SEND_SIGNALED };
	w[3].wr.atomic.remote_addr = base + ATOMIC_OFF;
	w[3].wr.atomic.rkey = mr->rkey;
	w[3].wr.atomic.compare_add = 2;
	struct ibv_sdc_dest d = { .ah = ah, .dct_num = dct->dct_num,
				  .dc_key = KEY };
	CHECK(!ibv_sdc_post_send(dci, &w[0], &d, 1, &bad),
	      "ibv_sdc_post_send(chain of 4)");

	const enum ibv_wc_opcode want_op[4] = { IBV_WC_SEND, IBV_WC_RDMA_WRITE,
						IBV_WC_RDMA_READ,
						IBV_WC_FETCH_ADD };
	for (int i = 0; i < 4; i++) {
		poll_one(dci_cq, &wc);
		CHECK(wc.status == IBV_WC_SUCCESS, "wr %d: status %s", i + 1,
		      ibv_wc_status_str(wc.status));
		CHECK(wc.wr_id == (uint64_t)i + 1,
		      "completion %d has wr_id %llu (order)", i,
		      (unsigned long long)wc.wr_id);
		CHECK(wc.opcode == want_op[i], "wr %d: opcode %d", i + 1,
		      wc.opcode);
		CHECK(wc.qp_num == dci->qp_num, "wr %d: qp_num %u", i + 1,
		      wc.qp_num);
		if (wc.opcode == IBV_WC_RDMA_READ)
			CHECK(wc.byte_len == WRITE_LEN, "read byte_len %u",
			      wc.byte_len);
		printf("sdc: DCI completion wr_id %llu %s\n",
		       (unsigned long long)wc.wr_id, wc_name(&wc));
	}
	CHECK(!memcmp(buf + WRITE_OFF, buf + SRC_OFF + 64, WRITE_LEN),
	      "written bytes differ");
	CHECK(!memcmp(buf + READ_OFF, buf + SRC_OFF + 64, WRITE_LEN),
	      "read bytes differ");
	uint64_t now, orig;
	memcpy(&now, buf + ATOMIC_OFF, 8);
	memcpy(&orig, buf + RESULT_OFF, 8);
	CHECK(orig == 40 && now == 42, "fetch-and-add: got %llu, now %llu",
	      (unsigned long long)orig, (unsigned long long)now);
	printf("sdc: write %d, read %d octets, fetch-add 40+2 = %llu: OK\n",
	       WRITE_LEN, WRITE_LEN, (unsigned long long)now);

	/* The target's receive through the completion channel. */
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 10000) == 1, "completion channel not readable");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(!ibv_get_cq_event(ch, &ev_cq, &ev_ctx), "ibv_get_cq_event");
	CHECK(ev_cq == dct_cq && ev_ctx == (void *)0x7c7c, "event CQ/context");
	ibv_ack_cq_events(dct_cq, 1);
	CHECK(ibv_poll_cq(dct_cq, 1, &wc) == 1, "event without completion");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
		      wc.byte_len == sizeof(msg) &&
		      (wc.wc_flags & IBV_WC_WITH_IMM) &&
		      ntohl(wc.imm_data) == 0xdc0001 && wc.wr_id == 100,
	      "DCT receive: status %d opcode %d len %u flags %#x imm %#x wr_id %llu",
	      wc.status, wc.opcode, wc.byte_len, wc.wc_flags,
	      ntohl(wc.imm_data), (unsigned long long)wc.wr_id);
	CHECK(!memcmp(buf + RECV_OFF, msg, sizeof(msg)), "received bytes");
	printf("sdc: DCT receive via completion channel: %u octets, imm %#x\n",
	       wc.byte_len, ntohl(wc.imm_data));

	/* ---- per-WR destinations: one chain to two DCTs ---- */
	struct ibv_sdc_dest two[2] = {
		{ .ah = ah, .dct_num = dct2->dct_num, .dc_key = KEY2 },
		{ .ah = ah, .dct_num = dct->dct_num, .dc_key = KEY },
	};
	struct ibv_send_wr p[2];
	memset(p, 0, sizeof(p));
	p[0] = (struct ibv_send_wr){ .wr_id = 10, .next = &p[1],
				     .sg_list = &s_send, .num_sge = 1,
				     .opcode = IBV_WR_SEND,
				     .send_flags = IBV_SEND_SIGNALED };
	p[1] = (struct ibv_send_wr){ .wr_id = 11, .sg_list = &s_send,
				     .num_sge = 1, .opcode = IBV_WR_SEND,
				     .send_flags = IBV_SEND_SIGNALED };
	CHECK(!ibv_sdc_post_send(dci, &p[0], two, 2, &bad),
	      "ibv_sdc_post_send(2 destinations)");
	for (int i = 0; i < 2; i++) {
		poll_one(dci_cq, &wc);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 10u + i &&
			      wc.opcode == IBV_WC_SEND,
		      "two destinations: wr_id %llu status %s",
		      (unsigned long long)wc.wr_id,
		      ibv_wc_status_str(wc.status));
	}
	int seen = 0;
	for (int i = 0; i < 2; i++) {
		poll_one(dct_cq, &wc);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
			      wc.byte_len == sizeof(msg) &&
			      !(wc.wc_flags & IBV_WC_WITH_IMM) &&
			      (wc.wr_id == 101 || wc.wr_id == 102),
		      "two destinations: receive wr_id %llu",
		      (unsigned long long)wc.wr_id);
		seen |= 1 << (wc.wr_id - 101);
	}
	CHECK(seen == 3, "both receives");
	printf("sdc: one chain to two DCTs: OK\n");

	/* ---- wrong key: an error completion, counted at the DCT ---- */
	struct ibv_sdc_dest wrong = { .ah = ah, .dct_num = dct->dct_num,
				      .dc_key = KEY ^ 1 };
	p[0].next = NULL;
	p[0].wr_id = 20;
	CHECK(!ibv_sdc_post_send(dci, &p[0], &wrong, 1, &bad),
	      "ibv_sdc_post_send(wrong key)");
	poll_one(dci_cq, &wc);
	CHECK(wc.wr_id == 20 && wc.status == IBV_WC_REM_ACCESS_ERR,
	      "wrong key: wr_id %llu status %s", (unsigned long long)wc.wr_id,
	      ibv_wc_status_str(wc.status));
	CHECK(!ibv_sdc_query_dct(dct, &st), "ibv_sdc_query_dct");
	CHECK(st.dct_rejected == 1 && st.rejected_bad_key >= 1 &&
		      st.capacity == 16 && st.live <= st.capacity,
	      "stats: rejected %llu/%llu capacity %u live %u",
	      (unsigned long long)st.dct_rejected,
	      (unsigned long long)st.rejected_bad_key, st.capacity, st.live);
	/* Every Send so far found a receive: no connection lost to an empty
	 * SRQ (the counting itself is tested in Rust, dc_peers). */
	CHECK(ibv_sdc_dct_lost_no_receive(dct) == 0 &&
		      ibv_sdc_dct_lost_no_receive(NULL) == 0,
	      "lost_no_receive %llu",
	      (unsigned long long)ibv_sdc_dct_lost_no_receive(dct));
	printf("sdc: wrong key: %s, DCT rejected %llu\n",
	       ibv_wc_status_str(wc.status),
	       (unsigned long long)st.dct_rejected);
	/* A DCT number nobody has: an error completion too, not a hang. On a
	 * second DCI with a one-entry send queue, which is full meanwhile. */
	struct ibv_sdc_qp_init_attr ia1 = { .send_cq = dci_cq,
					    .cap = { .max_send_wr = 1 } };
	struct ibv_sdc_qp *dci1 = ibv_sdc_create_qp(pd, &ia1);
	CHECK(dci1 && dci1->qp_num != dci->qp_num, "second DCI: %s",
	      strerror(errno));
	struct ibv_sdc_dest nobody = { .ah = ah,
				       .dct_num = dct->dct_num + 0x70,
				       .dc_key = KEY };
	p[0].wr_id = 22;
	p[0].next = NULL;
	CHECK(!ibv_sdc_post_send(dci1, &p[0], &nobody, 1, &bad),
	      "ibv_sdc_post_send(no such DCT)");
	p[1].wr_id = 23;
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci1, &p[1], &nobody, 1, &bad) == ENOMEM &&
		      bad == &p[1], "post_send(send queue full)");
	poll_one(dci_cq, &wc);
	CHECK(wc.wr_id == 22 && wc.qp_num == dci1->qp_num &&
		      (wc.status == IBV_WC_REM_INV_REQ_ERR ||
		       wc.status == IBV_WC_RETRY_EXC_ERR),
	      "no such DCT: wr_id %llu status %s",
	      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	CHECK(!ibv_sdc_destroy_qp(dci1), "destroy second DCI");
	printf("sdc: no such DCT: error completion (%s)\n",
	       ibv_wc_status_str(wc.status));
	/* The right key still works after the rejections; this time the
	 * DCI's completion is waited for through the completion channel. */
	CHECK(!ibv_req_notify_cq(dci_cq, 0), "ibv_req_notify_cq(DCI CQ)");
	p[0].wr_id = 21;
	CHECK(!ibv_sdc_post_send(dci, &p[0], &d, 1, &bad), "post after reject");
	CHECK(poll(&pfd, 1, 10000) == 1, "channel not readable for the DCI");
	CHECK(!ibv_get_cq_event(ch, &ev_cq, &ev_ctx), "ibv_get_cq_event");
	CHECK(ev_cq == dci_cq && ev_ctx == (void *)0x5c5d,
	      "DCI event CQ/context");
	ibv_ack_cq_events(dci_cq, 1);
	poll_one(dci_cq, &wc);
	CHECK(wc.wr_id == 21 && wc.status == IBV_WC_SUCCESS,
	      "after reject: status %s", ibv_wc_status_str(wc.status));
	printf("sdc: DCI completion via completion channel\n");
	poll_one(dct_cq, &wc);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 103,
	      "after reject: receive");

	/* ---- bad work requests ---- */
	p[0].wr_id = 30;
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci, &p[0], NULL, 1, &bad) == EINVAL &&
		      bad == &p[0], "post_send(NULL dest)");
	struct ibv_sdc_dest d_pd2 = { .ah = ah_pd2, .dct_num = dct->dct_num,
				      .dc_key = KEY };
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci, &p[0], &d_pd2, 1, &bad) == EINVAL &&
		      bad == &p[0], "post_send(AH of another PD)");
	struct ibv_send_wr rec = p[0];
	rec.opcode = IBV_WR_SOFTRDMA_WRITE_RECORD;
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci, &rec, &d, 1, &bad) == EOPNOTSUPP &&
		      bad == &rec, "post_send(Write-Record)");
	struct ibv_send_wr inv = p[0];
	inv.opcode = IBV_WR_LOCAL_INV;
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci, &inv, &d, 1, &bad) == EINVAL &&
		      bad == &inv, "post_send(local invalidate)");
	/* A DCT number below 256 names UDP port 0: no DCT can have it. */
	struct ibv_sdc_dest port0 = { .ah = ah, .dct_num = dct->dct_num & 0xff,
				      .dc_key = KEY };
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci, &p[0], &port0, 1, &bad) == EINVAL &&
		      bad == &p[0], "post_send(DCT number of port 0)");
	/* A chain longer than its destinations: refused at the first
	 * request without one, those before it posted. */
	struct ibv_send_wr three[3];
	memset(three, 0, sizeof(three));
	for (int i = 0; i < 3; i++)
		three[i] = (struct ibv_send_wr){ .wr_id = 40 + i,
						 .next = i < 2 ? &three[i + 1]
							       : NULL,
						 .sg_list = &s_send,
						 .num_sge = 1,
						 .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED };
	struct ibv_sdc_dest both[2] = { d, d };
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci, &three[0], both, 2, &bad) == EINVAL &&
		      bad == &three[2], "post_send(3 requests, 2 destinations)");
	for (int i = 0; i < 2; i++) {
		poll_one(dci_cq, &wc);
		CHECK(wc.wr_id == 40u + i && wc.status == IBV_WC_SUCCESS,
		      "longer chain: wr_id %llu status %s",
		      (unsigned long long)wc.wr_id,
		      ibv_wc_status_str(wc.status));
		poll_one(dct_cq, &wc);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
			      wc.wr_id == 104u + i,
		      "longer chain: receive wr_id %llu",
		      (unsigned long long)wc.wr_id);
	}
	/* A bad destination in the middle: the first goes, the second is
	 * refused. */
	struct ibv_sdc_dest garbage[2] = {
		{ .ah = ah, .dct_num = dct->dct_num, .dc_key = KEY },
		{ .ah = (struct ibv_ah *)&sin, .dct_num = dct->dct_num,
		  .dc_key = KEY },
	};
	p[0].wr_id = 31;
	p[0].next = &p[1];
	p[1].wr_id = 32;
	bad = NULL;
	CHECK(ibv_sdc_post_send(dci, &p[0], garbage, 2, &bad) == EINVAL &&
		      bad == &p[1], "post_send(garbage AH in second dest)");
	poll_one(dci_cq, &wc);
	CHECK(wc.wr_id == 31 && wc.status == IBV_WC_SUCCESS,
	      "first of a half-posted chain: wr_id %llu",
	      (unsigned long long)wc.wr_id);
	poll_one(dct_cq, &wc);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 106,
	      "half-posted chain: receive");
	CHECK(ibv_poll_cq(dci_cq, 1, &wc) == 0, "completion for an unposted wr");
	CHECK(!ibv_sdc_query_qp(dci, &st) && st.outstanding == 0,
	      "ibv_sdc_query_qp: outstanding %llu",
	      (unsigned long long)st.outstanding);
	printf("sdc: bad work requests refused, bad_wr set\n");

	/* ---- teardown ---- */
	CHECK(!ibv_sdc_destroy_qp(dci), "destroy DCI");
	CHECK(!ibv_sdc_destroy_dct(dct2), "destroy DCT 2");
	CHECK(!ibv_sdc_destroy_dct(dct), "destroy DCT");
	CHECK(!ibv_sdc_destroy_ah(ah), "destroy AH");
	CHECK(!ibv_destroy_ah(ah_pd2), "ibv_destroy_ah of an sdc AH");
	CHECK(!ibv_dereg_mr(mr), "dereg");
	CHECK(!ibv_destroy_srq(srq) && !ibv_destroy_srq(srq2), "destroy SRQs");
	CHECK(!ibv_destroy_cq(dct_cq) && !ibv_destroy_cq(dci_cq), "destroy CQs");
	CHECK(!ibv_destroy_comp_channel(ch), "destroy channel");
	CHECK(!ibv_dealloc_pd(pd2) && !ibv_dealloc_pd(pd), "dealloc PDs");
	CHECK(!ibv_close_device(ctx), "close");
	free(buf);
	printf("sdc: OK\n");
	return 0;
}
