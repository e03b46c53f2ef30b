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
 * Dynamically connected (DC) calls will be added here.
 */
#ifndef SOFTRDMA_VERBS_H
#define SOFTRDMA_VERBS_H

#include <stddef.h>
#include <stdint.h>
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

#ifdef __cplusplus
}
#endif

#endif /* SOFTRDMA_VERBS_H */
