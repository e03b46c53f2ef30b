/*
 * conf_cq.c - conformance with rdma-core 44's man pages for completion
 * channels and completion queues: ibv_create_comp_channel(3) (and
 * ibv_destroy_comp_channel), ibv_create_cq(3) (and ibv_destroy_cq),
 * ibv_create_cq_ex(3), ibv_poll_cq(3), ibv_req_notify_cq(3),
 * ibv_get_cq_event(3) (a non-blocking channel), ibv_ack_cq_events(3).
 * (cqe and comp_vector limits and ibv_resize_cq(3) are checked by
 * errors.c; completion events with real completions by conf_ah_mcast.c.)
 *
 * Prints "conf_cq: <page>: OK" per page and "conf_cq: OK" at the end;
 * exits 1 at the first check that fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CONF_NAME "conf_cq"
#include "conf.h"

static void cq_ex_refused(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *a, int want,
			  const char *what)
{
	errno = 0;
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, a);
	CHECK(cq == NULL && errno == want, "%s: cq %p errno %d, want %d", what, (void *)cq,
	      errno, want);
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx = open_lo(&list);

	/* ibv_create_comp_channel(3): a channel of this context with an fd. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch, "ibv_create_comp_channel: %s", strerror(errno));
	CHECK(ch->context == ctx && ch->fd >= 0, "channel context %p fd %d",
	      (void *)ch->context, ch->fd);
	CHECK(fcntl(ch->fd, F_GETFD) >= 0, "channel fd %d not open", ch->fd);

	/* ibv_create_cq(3): cqe >= requested, the context, cq_context and
	 * channel given. */
	int tag;
	struct ibv_cq *cq = ibv_create_cq(ctx, 100, &tag, ch, 0);
	CHECK(cq, "ibv_create_cq: %s", strerror(errno));
	CHECK(cq->cqe >= 100, "cqe %d < 100", cq->cqe);
	CHECK(cq->context == ctx && cq->cq_context == &tag && cq->channel == ch,
	      "cq context %p cq_context %p channel %p", (void *)cq->context, cq->cq_context,
	      (void *)cq->channel);
	struct ibv_cq *plain = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	CHECK(plain && plain->cqe >= 1 && plain->channel == NULL, "cq without channel");

	/* ibv_destroy_comp_channel(3): "fails if any CQs are still
	 * associated" (and the channel stays usable). */
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel with a CQ not EBUSY");
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "channel gone after refused destroy");
	PAGE_OK("ibv_create_comp_channel");

	/* ibv_poll_cq(3): an empty CQ gives 0; num_entries 0 gives 0. */
	struct ibv_wc wc[4];
	CHECK(ibv_poll_cq(cq, 4, wc) == 0, "poll of an empty CQ");
	CHECK(ibv_poll_cq(plain, 0, wc) == 0, "poll of 0 entries");
	PAGE_OK("ibv_poll_cq");

	/* ibv_req_notify_cq(3): 0 for both kinds of request. */
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "req_notify all");
	CHECK(ibv_req_notify_cq(cq, 1) == 0, "req_notify solicited only");
	PAGE_OK("ibv_req_notify_cq");

	/* ibv_get_cq_event(3): no completion, so no event: a non-blocking
	 * channel gives -1 with EAGAIN. */
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx = NULL;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "event without a completion: errno %d", errno);
	PAGE_OK("ibv_get_cq_event");

	/* ibv_ack_cq_events(3): acknowledging none is harmless. */
	ibv_ack_cq_events(cq, 0);
	PAGE_OK("ibv_ack_cq_events");

	/* ibv_destroy_cq(3), then the channel goes. */
	CHECK(ibv_destroy_cq(cq) == 0 && ibv_destroy_cq(plain) == 0, "ibv_destroy_cq");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
	PAGE_OK("ibv_create_cq");
	PAGE_OK("ibv_destroy_cq");

	/* ibv_create_cq_ex(3): cqe >= requested through ibv_cq_ex_to_cq, the
	 * standard wc_flags taken; what the device lacks is EOPNOTSUPP, an
	 * undefined comp_mask bit EINVAL. */
	int tag2;
	struct ibv_cq_init_attr_ex ex = {
		.cqe = 33,
		.cq_context = &tag2,
		.wc_flags = IBV_WC_STANDARD_FLAGS,
		.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
		.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED,
	};
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &ex);
	CHECK(cqx, "ibv_create_cq_ex: %s", strerror(errno));
	struct ibv_cq *base = ibv_cq_ex_to_cq(cqx);
	CHECK(base->cqe >= 33 && base->cq_context == &tag2 && base->context == ctx,
	      "cq_ex cqe %d cq_context %p", base->cqe, base->cq_context);
	struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
	CHECK(ibv_start_poll(cqx, &pa) == ENOENT, "start_poll of an empty CQ");
	CHECK(ibv_destroy_cq(base) == 0, "destroy cq_ex");
	struct ibv_cq_init_attr_ex bad = ex;
	bad.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	cq_ex_refused(ctx, &bad, EOPNOTSUPP, "completion timestamps");
	bad = ex;
	bad.comp_mask = 1 << 7;
	cq_ex_refused(ctx, &bad, EINVAL, "undefined comp_mask bit");
	bad = ex;
	bad.flags = 1 << 5;
	cq_ex_refused(ctx, &bad, EOPNOTSUPP, "undefined creation flag");
	bad = ex;
	bad.cqe = 0;
	cq_ex_refused(ctx, &bad, EINVAL, "cqe 0");
	PAGE_OK("ibv_create_cq_ex");

	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("conf_cq: OK\n");
	return 0;
}
