/*
 * conf_device.c - conformance with rdma-core 44's man pages for the device
 * and context verbs: ibv_get_device_list(3), ibv_get_device_name(3),
 * ibv_get_device_guid(3), ibv_get_device_index(3), ibv_open_device(3),
 * ibv_query_device(3), ibv_query_device_ex(3), ibv_query_port(3),
 * ibv_query_gid(3), ibv_query_gid_ex(3), ibv_query_gid_table(3),
 * ibv_query_pkey(3), ibv_get_pkey_index(3), ibv_get_async_event(3) (a
 * non-blocking async_fd), ibv_fork_init(3), ibv_is_fork_initialized(3),
 * the string calls (ibv_node_type_str(3), ibv_port_state_str(3),
 * ibv_event_type_str(3), ibv_wc_status_str(3)) and the rate conversions
 * (ibv_rate_to_mult(3), ibv_rate_to_mbps(3)).
 *
 * Prints "conf_device: <page>: OK" per page and "conf_device: OK" at the
 * end; exits 1 at the first check that fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define CONF_NAME "conf_device"
#include "conf.h"

int main(void)
{
	/* ibv_get_device_list(3): NULL-terminated, *num_devices entries. */
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0, "no devices (n %d)", n);
	CHECK(list[n] == NULL, "list not NULL-terminated at %d", n);
	for (int i = 0; i < n; i++)
		CHECK(list[i] != NULL, "entry %d NULL", i);
	struct ibv_device **again = ibv_get_device_list(NULL);
	CHECK(again && again[n] == NULL && again[n - 1], "second list, NULL num");
	ibv_free_device_list(again);
	PAGE_OK("ibv_get_device_list");

	/* ibv_get_device_name(3), ibv_get_device_index(3): distinct. */
	struct ibv_device *dev = NULL;
	for (int i = 0; i < n; i++) {
		const char *name = ibv_get_device_name(list[i]);
		CHECK(name && *name, "device %d has no name", i);
		int idx = ibv_get_device_index(list[i]);
		CHECK(idx >= 0, "device %s index %d", name, idx);
		for (int j = 0; j < i; j++) {
			CHECK(strcmp(name, ibv_get_device_name(list[j])), "name %s twice", name);
			CHECK(idx != ibv_get_device_index(list[j]), "index %d twice", idx);
		}
		if (!strcmp(name, "softrdma_lo"))
			dev = list[i];
	}
	CHECK(dev, "softrdma_lo not listed");
	PAGE_OK("ibv_get_device_name");
	PAGE_OK("ibv_get_device_index");

	/* ibv_open_device(3). */
	struct ibv_context *ctx = ibv_open_device(dev);
	CHECK(ctx, "ibv_open_device: %s", strerror(errno));
	CHECK(ctx->device == dev, "ctx->device %p", (void *)ctx->device);
	CHECK(ctx->num_comp_vectors >= 1, "num_comp_vectors %d", ctx->num_comp_vectors);
	CHECK(ctx->async_fd >= 0, "async_fd %d", ctx->async_fd);
	PAGE_OK("ibv_open_device");

	/* ibv_query_device(3), ibv_get_device_guid(3). */
	struct ibv_device_attr attr;
	memset(&attr, 0xa5, sizeof(attr));
	CHECK(ibv_query_device(ctx, &attr) == 0, "ibv_query_device");
	CHECK(attr.phys_port_cnt >= 1, "phys_port_cnt %u", attr.phys_port_cnt);
	CHECK(attr.max_qp > 0 && attr.max_qp_wr > 0 && attr.max_sge > 0 &&
		      attr.max_cq > 0 && attr.max_cqe > 0 && attr.max_mr > 0 &&
		      attr.max_pd > 0 && attr.max_pkeys > 0 && attr.max_mr_size > 0,
	      "a zero limit: qp %d wr %d sge %d cq %d cqe %d mr %d pd %d pkeys %u",
	      attr.max_qp, attr.max_qp_wr, attr.max_sge, attr.max_cq, attr.max_cqe,
	      attr.max_mr, attr.max_pd, attr.max_pkeys);
	CHECK(attr.max_srq == 0 || (attr.max_srq_wr > 0 && attr.max_srq_sge > 0),
	      "SRQs without limits");
	CHECK(memchr(attr.fw_ver, 0, sizeof(attr.fw_ver)), "fw_ver not terminated");
	CHECK(ibv_get_device_guid(dev) == attr.node_guid,
	      "ibv_get_device_guid %llx != node_guid %llx",
	      (unsigned long long)ibv_get_device_guid(dev),
	      (unsigned long long)attr.node_guid);
	CHECK(attr.node_guid != 0, "node_guid 0");
	PAGE_OK("ibv_query_device");
	PAGE_OK("ibv_get_device_guid");

	/* ibv_query_device_ex(3): orig_attr is ibv_query_device's; an input
	 * comp_mask is EINVAL. */
	struct ibv_device_attr_ex ex;
	memset(&ex, 0x5a, sizeof(ex));
	CHECK(ibv_query_device_ex(ctx, NULL, &ex) == 0, "ibv_query_device_ex");
	CHECK(!memcmp(&ex.orig_attr, &attr, sizeof(attr)),
	      "orig_attr differs from ibv_query_device");
	CHECK(ex.phys_port_cnt_ex >= attr.phys_port_cnt, "phys_port_cnt_ex %u",
	      ex.phys_port_cnt_ex);
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &ex) == EINVAL, "input comp_mask not EINVAL");
	PAGE_OK("ibv_query_device_ex");

	/* ibv_query_port(3). */
	struct ibv_port_attr pa;
	memset(&pa, 0, sizeof(pa));
	CHECK(ibv_query_port(ctx, 1, &pa) == 0, "ibv_query_port 1");
	CHECK(pa.state == IBV_PORT_ACTIVE, "port state %d", pa.state);
	CHECK(pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= pa.max_mtu &&
		      pa.max_mtu <= IBV_MTU_4096,
	      "mtu active %d max %d", pa.active_mtu, pa.max_mtu);
	CHECK(pa.gid_tbl_len >= 1, "gid_tbl_len %d", pa.gid_tbl_len);
	CHECK(pa.pkey_tbl_len >= 1 && pa.pkey_tbl_len <= attr.max_pkeys,
	      "pkey_tbl_len %u (max_pkeys %u)", pa.pkey_tbl_len, attr.max_pkeys);
	CHECK(pa.max_msg_sz > 0, "max_msg_sz 0");
	CHECK(pa.link_layer == IBV_LINK_LAYER_ETHERNET ||
		      pa.link_layer == IBV_LINK_LAYER_INFINIBAND,
	      "link_layer %u", pa.link_layer);
	CHECK(ibv_query_port(ctx, 0, &pa) == EINVAL, "port 0 not EINVAL");
	CHECK(ibv_query_port(ctx, attr.phys_port_cnt + 1, &pa) == EINVAL,
	      "port phys_port_cnt+1 not EINVAL");
	PAGE_OK("ibv_query_port");

	/* ibv_query_gid(3): 0 / -1. */
	union ibv_gid gid, zero;
	memset(&zero, 0, sizeof(zero));
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid 0");
	CHECK(memcmp(&gid, &zero, sizeof(gid)), "GID 0 is all zero");
	CHECK(ibv_query_gid(ctx, 1, pa.gid_tbl_len, &gid) == -1,
	      "GID index gid_tbl_len not refused");
	CHECK(ibv_query_gid(ctx, 2, 0, &gid) == -1, "GID of port 2 not refused");
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid 0 again");
	PAGE_OK("ibv_query_gid");

	/* ibv_query_gid_ex(3): the same GID, its index and port. */
	struct ibv_gid_entry ge;
	memset(&ge, 0xff, sizeof(ge));
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0, "ibv_query_gid_ex");
	CHECK(!memcmp(&ge.gid, &gid, sizeof(gid)), "query_gid_ex GID differs");
	CHECK(ge.gid_index == 0 && ge.port_num == 1, "entry index %u port %u",
	      ge.gid_index, ge.port_num);
	CHECK(ge.gid_type == IBV_GID_TYPE_IB || ge.gid_type == IBV_GID_TYPE_ROCE_V1 ||
		      ge.gid_type == IBV_GID_TYPE_ROCE_V2,
	      "gid_type %u", ge.gid_type);
	/* Outside the table, another port, flags other than 0: EINVAL (the
	 * kernel's; ENODATA is for an empty entry inside the table). */
	int r = ibv_query_gid_ex(ctx, 1, pa.gid_tbl_len, &ge, 0);
	CHECK(r == EINVAL, "index gid_tbl_len: %d", r);
	CHECK(ibv_query_gid_ex(ctx, 2, 0, &ge, 0) == EINVAL, "port 2 not EINVAL");
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 1) == EINVAL, "flags 1 not EINVAL");
	PAGE_OK("ibv_query_gid_ex");

	/* ibv_query_gid_table(3): at most gid_tbl_len valid entries. */
	struct ibv_gid_entry tab[64];
	ssize_t cnt = ibv_query_gid_table(ctx, tab, 64, 0);
	CHECK(cnt >= 1 && cnt <= pa.gid_tbl_len, "gid table count %zd", cnt);
	CHECK(!memcmp(&tab[0].gid, &gid, sizeof(gid)) && tab[0].port_num == 1,
	      "table entry 0 differs");
	CHECK(ibv_query_gid_table(ctx, tab, 64, 1) == -EINVAL, "table with flags 1");
	PAGE_OK("ibv_query_gid_table");

	/* ibv_query_pkey(3), ibv_get_pkey_index(3): the pkey's index back. */
	__be16 pkey = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0, "ibv_query_pkey 0");
	CHECK(pkey != 0, "P_Key 0 is 0");
	CHECK(ibv_query_pkey(ctx, 1, pa.pkey_tbl_len, &pkey) == -1,
	      "P_Key index pkey_tbl_len not refused");
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0, "ibv_query_pkey 0 again");
	CHECK(ibv_get_pkey_index(ctx, 1, pkey) == 0, "pkey index %d",
	      ibv_get_pkey_index(ctx, 1, pkey));
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0x1234)) == -1, "unknown pkey found");
	PAGE_OK("ibv_query_pkey");
	PAGE_OK("ibv_get_pkey_index");

	/* ibv_get_async_event(3) on a non-blocking async_fd: -1, EAGAIN. */
	int fl = fcntl(ctx->async_fd, F_GETFL);
	CHECK(fl >= 0 && fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0,
	      "O_NONBLOCK on async_fd");
	struct ibv_async_event ae;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN,
	      "async event with none pending: errno %d", errno);
	PAGE_OK("ibv_get_async_event");

	/* ibv_fork_init(3), ibv_is_fork_initialized(3). */
	CHECK(ibv_fork_init() == 0, "ibv_fork_init");
	enum ibv_fork_status fs = ibv_is_fork_initialized();
	CHECK(fs == IBV_FORK_ENABLED || fs == IBV_FORK_UNNEEDED, "fork status %d", fs);
	PAGE_OK("ibv_fork_init");
	PAGE_OK("ibv_is_fork_initialized");

	/* The string calls: rdma-core's texts. */
	CHECK(!strcmp(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter") &&
		      !strcmp(ibv_node_type_str(IBV_NODE_RNIC), "iWARP NIC") &&
		      !strcmp(ibv_node_type_str(99), "unknown"),
	      "ibv_node_type_str");
	CHECK(!strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "active") &&
		      !strcmp(ibv_port_state_str(IBV_PORT_DOWN), "down") &&
		      !strcmp(ibv_port_state_str(99), "invalid state"),
	      "ibv_port_state_str");
	CHECK(!strcmp(ibv_event_type_str(IBV_EVENT_SRQ_LIMIT_REACHED), "SRQ limit reached") &&
		      !strcmp(ibv_event_type_str(IBV_EVENT_COMM_EST),
			      "communication established") &&
		      !strcmp(ibv_event_type_str(99), "unknown"),
	      "ibv_event_type_str");
	CHECK(!strcmp(ibv_wc_status_str(IBV_WC_SUCCESS), "success") &&
		      !strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR),
			      "Work Request Flushed Error") &&
		      !strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error") &&
		      !strcmp(ibv_wc_status_str(999), "unknown"),
	      "ibv_wc_status_str");
	CHECK(ibv_node_type_str(ctx->device->node_type) &&
		      strcmp(ibv_node_type_str(ctx->device->node_type), "unknown"),
	      "our node type %d has no name", ctx->device->node_type);
	PAGE_OK("ibv_node_type_str");
	PAGE_OK("ibv_port_state_str");
	PAGE_OK("ibv_event_type_str");
	PAGE_OK("ibv_wc_status_str");

	/* ibv_rate_to_mult(3), ibv_rate_to_mbps(3) and their inverses. */
	CHECK(ibv_rate_to_mult(IBV_RATE_2_5_GBPS) == 1 && ibv_rate_to_mult(IBV_RATE_10_GBPS) == 4 &&
		      ibv_rate_to_mult(IBV_RATE_MAX) == -1,
	      "ibv_rate_to_mult");
	CHECK(mult_to_ibv_rate(4) == IBV_RATE_10_GBPS && mult_to_ibv_rate(3) == IBV_RATE_MAX,
	      "mult_to_ibv_rate");
	CHECK(ibv_rate_to_mbps(IBV_RATE_25_GBPS) == 25781 &&
		      ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125 &&
		      ibv_rate_to_mbps(IBV_RATE_MAX) == -1,
	      "ibv_rate_to_mbps");
	CHECK(mbps_to_ibv_rate(25781) == IBV_RATE_25_GBPS && mbps_to_ibv_rate(12345) == IBV_RATE_MAX,
	      "mbps_to_ibv_rate");
	PAGE_OK("ibv_rate_to_mult");
	PAGE_OK("ibv_rate_to_mbps");

	/* ibv_close_device(3). */
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	PAGE_OK("ibv_close_device");
	printf("conf_device: OK\n");
	return 0;
}
