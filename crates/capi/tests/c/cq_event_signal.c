/*
 * cq_event_signal.c - ibv_get_cq_event(3) and signals, as rdma-core's
 * blocking read(2) of the channel fd has them: a signal caught by a
 * handler installed without SA_RESTART ends the wait with -1 and EINTR
 * (qperf ends its tests that way); with SA_RESTART the wait goes on until
 * the CQ fires. One process on softrdma_lo; the event comes from a UD QP
 * sending to itself through an address handle without a GRH.
 *
 *   cc -Wall -Werror -o cq_event_signal cq_event_signal.c -L target/debug -libverbs -lpthread
 *   softrdma run -- ./cq_event_signal
 *
 * Prints one "cq_event_signal: ..." line per check and "cq_event_signal: OK"
 * at the end, exits 1 at the first failure.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define CHECK(c, ...)                                                     \
	do {                                                              \
		if (!(c)) {                                               \
			fprintf(stderr, "cq_event_signal: FAILED: " __VA_ARGS__); \
			fprintf(stderr, " (line %d, errno %d)\n",         \
				__LINE__, errno);                         \
			exit(1);                                          \
		}                                                         \
	} while (0)

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void alarm_in_ms(int ms, int flags)
{
	struct sigaction sa;
	struct itimerval it = { .it_value = { 0, ms * 1000 } };

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	CHECK(sigaction(SIGALRM, &sa, NULL) == 0, "sigaction");
	CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0, "setitimer");
}

struct sender {
	struct ibv_qp *qp;
	struct ibv_ah *ah;
	struct ibv_mr *mr;
	char *buf;
};

static void *send_later(void *arg)
{
	struct sender *s = arg;
	struct ibv_sge sge = { (uintptr_t)s->buf, 8, s->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	usleep(300 * 1000);
	wr.wr.ud.ah = s->ah;
	wr.wr.ud.remote_qpn = s->qp->qp_num;
	wr.wr.ud.remote_qkey = 0x11111111;
	CHECK(ibv_post_send(s->qp, &wr, &bad) == 0, "post send");
	return NULL;
}

int main(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	struct ibv_cq *ev_cq;
	void *ev_ctx;

	CHECK(l, "no device list");
	for (int i = 0; l[i]; i++)
		if (!strcmp(ibv_get_device_name(l[i]), "softrdma_lo"))
			ctx = ibv_open_device(l[i]);
	ibv_free_device_list(l);
	CHECK(ctx, "softrdma_lo not found (run through softrdma run)");

	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, ch, 0);
	CHECK(ch && pd && cq, "channel, PD, CQ");
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "arm");

	/* No SA_RESTART: the wait ends with EINTR. */
	alarm_in_ms(100, 0);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EINTR,
	      "no EINTR without SA_RESTART");
	CHECK(alarms == 1, "the handler ran");
	printf("cq_event_signal: EINTR without SA_RESTART\n");

	/* SA_RESTART: the wait outlives the signal and returns the event. */
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "UD QP");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = 0x11111111 };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
				  IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(buf && mr, "MR");
	struct ibv_sge rsge = { (uintptr_t)buf + 1024, 40 + 8, mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(ibv_post_recv(qp, &rwr, &rbad) == 0, "post receive");
	/* A LID and no GRH: a peer on this host. */
	struct ibv_ah_attr aha = { .dlid = 1, .port_num = 1 };
	struct sender s = { qp, ibv_create_ah(pd, &aha), mr, buf };
	CHECK(s.ah, "AH without a GRH");
	pthread_t t;
	CHECK(pthread_create(&t, NULL, send_later, &s) == 0, "thread");
	alarm_in_ms(100, SA_RESTART);
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq,
	      "no event with SA_RESTART");
	CHECK(alarms == 2, "the handler ran");
	ibv_ack_cq_events(cq, 1);
	pthread_join(t, NULL);
	printf("cq_event_signal: SA_RESTART waits for the event\n");

	struct ibv_wc wc[2];
	int got = 0;
	for (int i = 0; i < 1000 && got < 2; i++) {
		int n = ibv_poll_cq(cq, 2 - got, wc + got);
		CHECK(n >= 0, "poll");
		got += n;
		if (got < 2)
			usleep(1000);
	}
	CHECK(got == 2, "send and receive complete (%d)", got);
	for (int i = 0; i < 2; i++)
		CHECK(wc[i].status == IBV_WC_SUCCESS, "status %d", wc[i].status);
	printf("cq_event_signal: UD to a LID-only AH arrives\n");

	ibv_destroy_ah(s.ah);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	free(buf);
	printf("cq_event_signal: OK\n");
	return 0;
}
