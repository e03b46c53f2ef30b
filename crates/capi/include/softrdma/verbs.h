/*
 * softrdma/verbs.h - softrdma's extensions to the verbs C API.
 *
 * Include after (or instead of) <infiniband/verbs.h>; link with softrdma's
 * libibverbs.so.1 (`softrdma run -- PROG`, or -L<dir with libibverbs.so>).
 * The calls below are in symbol version SOFTRDMA_1.0; a program that uses
 * them does not load with rdma-core's libibverbs.
 *
 *   - Reliable datagram QPs: IBV_QPT_SOFTRDMA_RD for ibv_create_qp(). They
 *     are addressed like UD QPs (AH + remote QPN) but deliver reliably, in
 *     order, exactly once per peer, and also take RDMA Read and atomics.
 *   - RDMA Write-Record (UD and RD QPs): a one-sided write whose placement
 *     is logged at the target, as a completion on its receive CQ
 *     (IBV_WC_SOFTRDMA_RECV_WRITE_RECORD, consuming no receive) and in a
 *     validity map queried with softrdma_record_*().
 *
 * Work completions of Write-Records: the sender sees opcode
 * IBV_WC_SOFTRDMA_WRITE_RECORD; the target IBV_WC_SOFTRDMA_RECV_WRITE_RECORD
 * with byte_len = octets of the message, status IBV_WC_SUCCESS when it was
 * placed whole or IBV_WC_SOFTRDMA_RECORD_PARTIAL when it was retired after
 * the partial timeout with only some datagrams placed (the validity map
 * says which octets).
 *
 * Dynamically connected transport in software (SoftDC, ibv_sdc_*, symbol
 * version SOFTRDMA_1.1): see the section "SoftDC" below and
 * tests/c/sdc.c in crates/capi for a complete program.
 */
#ifndef SOFTRDMA_VERBS_H
#define SOFTRDMA_VERBS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* QP type of reliable datagram QPs (ibv_qp_init_attr.qp_type). */
#define IBV_QPT_SOFTRDMA_RD ((enum ibv_qp_type)0x5200)

/* ibv_send_wr.opcode of RDMA Write-Record (UD and RD QPs). */
#define IBV_WR_SOFTRDMA_WRITE_RECORD ((enum ibv_wr_opcode)0x5201)

/* Completion opcodes and status of Write-Records. */
#define IBV_WC_SOFTRDMA_RECV_WRITE_RECORD ((enum ibv_wc_opcode)0x1000)
#define IBV_WC_SOFTRDMA_WRITE_RECORD ((enum ibv_wc_opcode)0x1001)
#define IBV_WC_SOFTRDMA_RECORD_PARTIAL ((enum ibv_wc_status)0x1000)

/*
 * A Write-Record through ibv_post_send(): opcode
 * IBV_WR_SOFTRDMA_WRITE_RECORD, the destination in wr.ud (ah, remote_qpn)
 * as for a UD send, and the target address and rkey set with this helper
 * (they travel in the bind_mw member, which a Write-Record does not use,
 * because wr.ud and wr.rdma share storage).
 */
static inline void softrdma_wr_set_record(struct ibv_send_wr *wr,
					  uint64_t remote_addr, uint32_t rkey)
{
	wr->bind_mw.mw = (struct ibv_mw *)(uintptr_t)remote_addr;
	wr->bind_mw.rkey = rkey;
}

/*
 * A Write-Record through the ibv_wr_* API: between ibv_wr_start() and
 * ibv_wr_complete(), then ibv_wr_set_ud_addr() and ibv_wr_set_sge() (or
 * _list / ibv_wr_set_inline_data) as for ibv_wr_send().
 */
void softrdma_wr_write_record(struct ibv_qp_ex *qp, uint32_t rkey,
			      uint64_t remote_addr);

/* length octets at offset (from the start of the memory region). */
struct softrdma_range {
	uint64_t offset;
	uint64_t length;
};

/*
 * The ranges of [offset, offset + len) of mr that Write-Records to qp placed
 * and nobody cleared since, in order; at most max written to out, their
 * number to *n. Returns 0, E2BIG when more ranges did not fit (the first
 * max are written), ERANGE when the range leaves the region, EOPNOTSUPP for
 * a QP that is not UD/RD, EINVAL for bad arguments.
 */
int softrdma_record_valid_ranges(struct ibv_qp *qp, struct ibv_mr *mr,
				 uint64_t offset, uint64_t len,
				 struct softrdma_range *out, size_t max,
				 size_t *n);

/* 1 if every octet of the range is valid, 0 if not, -errno on error. */
int softrdma_record_is_valid(struct ibv_qp *qp, struct ibv_mr *mr,
			     uint64_t offset, uint64_t len);

/* Marks the range not valid (its data was consumed). 0 or an errno. */
int softrdma_record_clear(struct ibv_qp *qp, struct ibv_mr *mr,
			  uint64_t offset, uint64_t len);

/* How long (µs) a Write-Record message may place nothing new before it is
 * retired as partial. 0 or an errno. */
int softrdma_record_set_partial_timeout(struct ibv_qp *qp, uint64_t usec);

/*
 * SoftDC: dynamically connected transport in software.
 *
 * A DC target (DCT) is reached by any DC initiator (DCI) that presents its
 * DC access key; a DCI reaches any DCT, each work request naming its own
 * destination (address handle, DCT number, DC key). Underneath, UD carries
 * connection invitations and RC connections carry the data; a connection
 * table (16 connections by default) keeps them for reuse. Every RC
 * operation is available: Send (+imm, +invalidate), RDMA Write (+imm),
 * RDMA Read, atomics. Not available: Write-Record (EOPNOTSUPP) and local
 * invalidate (EINVAL: it has no destination).
 *
 *   struct ibv_sdc_dct *dct = ibv_sdc_create_dct(pd, cq, srq, key, NULL);
 *   struct ibv_sdc_qp_init_attr ia = { .send_cq = cq,
 *                                      .cap = { .max_send_wr = 64 } };
 *   struct ibv_sdc_qp *dci = ibv_sdc_create_qp(pd, &ia);
 *   struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr = ... };
 *   struct ibv_ah *ah = ibv_sdc_create_ah(pd, (struct sockaddr *)&sin);
 *   struct ibv_sdc_dest d = { .ah = ah, .dct_num = num, .dc_key = key };
 *   ibv_sdc_post_send(dci, &wr, &d, 1, &bad_wr);
 *
 * Completions are ordinary: a DCI completes into its send_cq, in posting
 * order whatever the destinations, with wc.qp_num = dci->qp_num; a DCT's
 * incoming Sends / Writes with immediate take receives from its SRQ and
 * complete into its CQ (wc.qp_num is the number of the internal RC
 * connection that carried them, wc.src_qp is 0). ibv_poll_cq,
 * ibv_req_notify_cq and completion channels work on those CQs as on any.
 * A destination that cannot be reached, refuses the key (status
 * IBV_WC_REM_ACCESS_ERR), has no such DCT (IBV_WC_REM_INV_REQ_ERR, or
 * IBV_WC_RETRY_EXC_ERR when the invitation is dropped unanswered, as it is
 * today for an unknown number at a live DCT's port) or does not answer
 * (IBV_WC_RETRY_EXC_ERR after the invitation timeout) fails only its own
 * work requests.
 *
 * Why a DCI is a struct ibv_sdc_qp and not a struct ibv_qp: it has no
 * state machine (it is ready when created), no receive queue and no
 * destination of its own, so ibv_modify_qp, ibv_post_recv and a plain
 * ibv_post_send could only fail on it; a type of its own turns such
 * mistakes into compile errors. Its public fields are those of ibv_qp that
 * mean something for a DCI.
 *
 * Errors: calls returning a pointer return NULL and set errno; the others
 * return 0 or an errno value (as ibv_post_send / ibv_destroy_qp do).
 * EINVAL: NULL or inconsistent arguments (an SRQ or AH of another PD,
 * receive capabilities for a DCI, a chain longer than the destinations,
 * a dct_num that is not a DCT number: above 24 bits or below 256);
 * EOPNOTSUPP: unsupported operations, unknown comp_mask bits, IPv6
 * addresses that are not IPv4-mapped; EAFNOSUPPORT: other address
 * families; ENOMEM: the DCI's send queue is full.
 */

/* ibv_sdc_attr.comp_mask bits. */
enum ibv_sdc_attr_mask {
	IBV_SDC_ATTR_CAPACITY = 1 << 0,
	IBV_SDC_ATTR_IDLE_TIMEOUT = 1 << 1,
	IBV_SDC_ATTR_INVITE_TIMEOUT = 1 << 2,
};

/*
 * Options of the process's DC service (connection table and invitations).
 * The first DCI or DCT created sets them up; later calls' options are
 * ignored. NULL, or comp_mask 0: the defaults (16 connections, idle
 * connections closed after 2000 ms, invitations given up after 2000 ms).
 */
struct ibv_sdc_attr {
	uint32_t comp_mask;	    /* IBV_SDC_ATTR_* of the fields set */
	uint32_t capacity;	    /* connections at once (> 0) */
	uint32_t idle_timeout_ms;   /* > 0 */
	uint32_t invite_timeout_ms; /* > 0 */
};

/* A DC target. Read-only for the application except dct_context. */
struct ibv_sdc_dct {
	struct ibv_context *context;
	void *dct_context; /* NULL at creation; the application's */
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	uint64_t dc_key;
	uint32_t dct_num; /* what initiators put in ibv_sdc_dest.dct_num */
};

/*
 * A DC target in pd with access key dc_key: incoming Sends (and Writes
 * with immediate) consume receives posted to srq (of the same pd) and
 * complete into cq; one-sided operations reach memory registered in pd.
 * attr: service options (see struct ibv_sdc_attr), may be NULL.
 */
struct ibv_sdc_dct *ibv_sdc_create_dct(struct ibv_pd *pd, struct ibv_cq *cq,
				       struct ibv_srq *srq, uint64_t dc_key,
				       const struct ibv_sdc_attr *attr);

/* 0 or an errno. Connections to it are closed. */
int ibv_sdc_destroy_dct(struct ibv_sdc_dct *dct);

struct ibv_sdc_qp_init_attr {
	void *qp_context;
	struct ibv_cq *send_cq;
	/* max_send_wr, max_send_sge, max_inline_data; set to what was
	 * granted. max_recv_wr and max_recv_sge must be 0. */
	struct ibv_qp_cap cap;
	int sq_sig_all;
	const struct ibv_sdc_attr *sdc_attr; /* may be NULL */
};

/* A DC initiator. Read-only for the application except qp_context. */
struct ibv_sdc_qp {
	struct ibv_context *context;
	void *qp_context;
	struct ibv_pd *pd;
	struct ibv_cq *send_cq;
	uint32_t qp_num; /* ibv_wc.qp_num of its completions */
	struct ibv_qp_cap cap;
	int sq_sig_all;
};

/* A DC initiator in pd, ready to post. */
struct ibv_sdc_qp *ibv_sdc_create_qp(struct ibv_pd *pd,
				     struct ibv_sdc_qp_init_attr *init_attr);

/* 0 or an errno. Work requests not completed yet are dropped without
 * completions: wait for them first. */
int ibv_sdc_destroy_qp(struct ibv_sdc_qp *qp);

/*
 * An address handle for the DCTs at addr (AF_INET, or AF_INET6 with an
 * IPv4-mapped address; the port is ignored, the DCT number names it). It
 * is an ordinary struct ibv_ah: any number of DCIs and threads may use it
 * at once, and one from ibv_create_ah() with a GRH (dgid = the IPv4-mapped
 * address) works as well.
 */
struct ibv_ah *ibv_sdc_create_ah(struct ibv_pd *pd,
				 const struct sockaddr *addr);

/* ibv_destroy_ah(). */
int ibv_sdc_destroy_ah(struct ibv_ah *ah);

/* Where one work request goes. */
struct ibv_sdc_dest {
	struct ibv_ah *ah; /* of the DCI's pd */
	uint32_t dct_num;
	uint64_t dc_key;
};

/*
 * Posts the chain wr on DCI qp; the i-th work request goes to dest[i]
 * (num_dest entries; num_dest == 1: every request goes to dest[0]). The
 * requests are ibv_post_send()'s: opcode, sg_list, send_flags, imm_data,
 * wr.rdma / wr.atomic for one-sided operations (wr.ud is not used).
 * Returns 0, or an errno with *bad_wr set to the first request not posted
 * (the ones before it were posted).
 */
int ibv_sdc_post_send(struct ibv_sdc_qp *qp, struct ibv_send_wr *wr,
		      const struct ibv_sdc_dest *dest, size_t num_dest,
		      struct ibv_send_wr **bad_wr);

/* DC counters. "Service" fields are process-wide (all DCIs and DCTs). */
struct ibv_sdc_stats {
	uint64_t dct_rejected;	   /* this DCT: wrong-key invitations */
	uint64_t outstanding;	   /* this DCI: posted, not completed */
	uint64_t invites;	   /* service: invitations sent */
	uint64_t retransmits;	   /* service: invitation retransmissions */
	uint64_t timeouts;	   /* service: invitations timed out */
	uint64_t rejected_bad_key; /* service: rejected, wrong key */
	uint64_t rejected_no_dct;  /* service: rejected, no such DCT */
	uint64_t rejected_busy;	   /* service: rejected, table full */
	uint64_t evictions;	   /* service: idle connections evicted */
	uint64_t idle_closes;	   /* service: closed after idle timeout */
	uint64_t target_accepts;   /* service: connections accepted */
	uint32_t capacity;	   /* service: connection table capacity */
	uint32_t live;		   /* service: connections now */
	uint32_t max_live;	   /* service: most connections at once */
	uint32_t rc_qps;	   /* service: RC QPs now */
};

/* Counters of a DCT (dct_rejected) / a DCI (outstanding) and the service;
 * 0 or an errno. */
int ibv_sdc_query_dct(struct ibv_sdc_dct *dct, struct ibv_sdc_stats *stats);
int ibv_sdc_query_qp(struct ibv_sdc_qp *qp, struct ibv_sdc_stats *stats);

/* Connections to this DCT that a Send finding its SRQ empty failed: iWARP
 * has no receiver-not-ready retry, so that Send and the ones behind it on
 * the connection are lost (the initiator's may have completed
 * successfully: a Send completes when written). Keep at most as many
 * Sends in flight to a DCT as it has receives posted. 0 for NULL. */
uint64_t ibv_sdc_dct_lost_no_receive(struct ibv_sdc_dct *dct);

#ifdef __cplusplus
}
#endif

#endif /* SOFTRDMA_VERBS_H */
