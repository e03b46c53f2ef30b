/*
 * Edge cases of softrdma's librdmacm.so.1 that the Debian example programs
 * do not reach, through the installed headers (rdma/rdma_cma.h,
 * rdma/rsocket.h). Two processes (fork): the parent is the passive side,
 * the child the active side; a pipe says when the parent listens.
 *
 *   rdmacm_api RC_PORT UD_PORT RSOCKET_PORT
 *
 * Prints "ok: <what>" per check and "rdmacm_api: OK" at the end; any
 * failed check prints "FAIL: ..." and exits 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#define CHECK(c, ...)                                                   \
	do {                                                            \
		if (!(c)) {                                             \
			printf("FAIL (%s:%d, errno %d): ", who, __LINE__, errno); \
			printf(__VA_ARGS__);                            \
			printf("\n");                                   \
			fflush(stdout);                                 \
			exit(1);                                        \
		}                                                       \
	} while (0)
#define OK(what) printf("ok: %s: %s\n", who, what)

static const char *who = "main";
static int port, ud_port, rs_port;

static struct sockaddr_in addr(int p)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(p);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, int type)
{
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event");
	CHECK(e->event == type, "got %s (status %d), want %s", rdma_event_str(e->event),
	      e->status, rdma_event_str(type));
	return e;
}

/* A connect request on `ps` that the passive side rejects with private
 * data, and (UD) one it accepts with private data in the reply. */
static void passive_cm(struct rdma_event_channel *ch, enum rdma_port_space ps, int p)
{
	struct rdma_cm_id *l, *id;
	struct rdma_cm_event *e;
	struct sockaddr_in a = addr(p);

	CHECK(rdma_create_id(ch, &l, NULL, ps) == 0, "create_id");
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&a) == 0, "bind");
	CHECK(rdma_listen(l, 4) == 0, "listen");
	CHECK(rdma_get_src_port(l) == htons(p), "src port %u", ntohs(rdma_get_src_port(l)));
	OK("listening, rdma_get_src_port");
	CHECK(!l->verbs, "a listener bound to loopback has no device");
	e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = e->id;
	CHECK(e->listen_id == l, "listen_id");
	{
		struct ibv_context **devs = rdma_get_devices(NULL);
		CHECK(devs && id->verbs == devs[0], "loopback request on the first device");
		rdma_free_devices(devs);
	}
	CHECK(e->param.conn.private_data_len >= 5 &&
	      memcmp(e->param.conn.private_data, "hello", 5) == 0, "request private data");
	OK("connect request carries the initiator's private data");
	rdma_ack_cm_event(e);
	CHECK(rdma_reject(id, "nope!", 5) == 0, "reject");
	rdma_destroy_id(id);
	OK("rejected with private data");
	if (ps == RDMA_PS_UDP) {
		struct ibv_pd *pd;
		struct ibv_cq *cq;
		struct ibv_qp_init_attr qa;

		e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		id = e->id;
		rdma_ack_cm_event(e);
		CHECK(id->verbs, "child id has a device context");
		pd = ibv_alloc_pd(id->verbs);
		cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
		CHECK(pd && cq, "pd/cq");
		memset(&qa, 0, sizeof qa);
		qa.qp_type = IBV_QPT_UD;
		qa.send_cq = qa.recv_cq = cq;
		qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
		qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
		CHECK(rdma_create_qp(id, pd, &qa) == 0, "create UD qp");
		CHECK(id->qp->state == IBV_QPS_RTS, "UD QP in RTS (%d)", id->qp->state);
		struct rdma_conn_param cp;
		memset(&cp, 0, sizeof cp);
		cp.private_data = "welcome";
		cp.private_data_len = 7;
		CHECK(rdma_accept(id, &cp) == 0, "accept");
		/* Tell the child our QPN through the reply; it checks it. */
		printf("server qpn %u\n", id->qp->qp_num);
		OK("UD request accepted");
		fflush(stdout);
		rdma_destroy_qp(id);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
		rdma_destroy_id(id);
	}
	rdma_destroy_id(l);
}

static void active_cm(struct rdma_event_channel *ch, enum rdma_port_space ps, int p)
{
	struct rdma_cm_id *id;
	struct rdma_cm_event *e;
	struct sockaddr_in a = addr(p);
	struct rdma_conn_param cp;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp_init_attr qa;
	int round, rounds = ps == RDMA_PS_UDP ? 2 : 1;

	for (round = 0; round < rounds; round++) {
		CHECK(rdma_create_id(ch, &id, NULL, ps) == 0, "create_id");
		CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000) == 0, "resolve_addr");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
		CHECK(id->verbs && id->port_num == 1, "verbs/port after ADDR_RESOLVED");
		CHECK(rdma_get_dst_port(id) == htons(p), "dst port");
		CHECK(rdma_resolve_route(id, 2000) == 0, "resolve_route");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
		pd = ibv_alloc_pd(id->verbs);
		cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
		memset(&qa, 0, sizeof qa);
		qa.qp_type = ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
		qa.send_cq = qa.recv_cq = cq;
		qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
		qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
		CHECK(rdma_create_qp(id, pd, &qa) == 0, "create qp");
		memset(&cp, 0, sizeof cp);
		cp.private_data = "hello";
		cp.private_data_len = 5;
		cp.responder_resources = cp.initiator_depth = 1;
		CHECK(rdma_connect(id, &cp) == 0, "connect");
		if (round == 0) {
			e = expect(ch, RDMA_CM_EVENT_REJECTED);
			CHECK(e->status != 0, "reject status %d", e->status);
			CHECK(e->param.conn.private_data_len >= 5 &&
			      memcmp(e->param.conn.private_data, "nope!", 5) == 0,
			      "reject private data");
			OK("REJECTED with the passive side's private data");
		} else {
			e = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
			CHECK(e->param.ud.qkey == RDMA_UDP_QKEY, "qkey %#x", e->param.ud.qkey);
			CHECK(e->param.ud.qp_num != 0, "qp_num");
			CHECK(e->param.ud.ah_attr.is_global, "GRH address vector");
			CHECK(e->param.ud.private_data_len >= 7 &&
			      memcmp(e->param.ud.private_data, "welcome", 7) == 0,
			      "reply private data");
			struct ibv_ah *ah = ibv_create_ah(pd, &e->param.ud.ah_attr);
			CHECK(ah, "ibv_create_ah from param.ud.ah_attr");
			ibv_destroy_ah(ah);
			printf("client saw qpn %u\n", e->param.ud.qp_num);
			OK("UD ESTABLISHED: qkey, QPN, AV, reply private data");
		}
		rdma_ack_cm_event(e);
		rdma_destroy_qp(id);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
		rdma_destroy_id(id);
	}
}

/* rsockets: a stream of odd-sized sends, end of stream, rpoll with an
 * ordinary descriptor, non-blocking behaviour, options, iomap errors. */
#define TOTAL (3 * 1024 * 1024 + 12345)

static unsigned char pattern(size_t i)
{
	return (unsigned char)(i * 131 + (i >> 9));
}

static void rsocket_server(int p, int ready_fd)
{
	struct sockaddr_in a = addr(p), peer;
	socklen_t len = sizeof peer;
	int l, s, n, one = 1;
	size_t got = 0;
	static unsigned char buf[100000];

	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "rsocket");
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "SO_REUSEADDR");
	CHECK(rbind(l, (struct sockaddr *)&a, sizeof a) == 0, "rbind");
	CHECK(rlisten(l, 2) == 0, "rlisten");
	struct pollfd lp = { .fd = l, .events = POLLIN };
	CHECK(rpoll(&lp, 1, 50) == 0 && lp.revents == 0, "idle listener: rpoll times out");
	OK("rpoll on an idle listener times out");
	CHECK(write(ready_fd, "r", 1) == 1, "ready");
	s = raccept(l, (struct sockaddr *)&peer, &len);
	CHECK(s >= 0, "raccept");
	CHECK(len == sizeof peer && peer.sin_addr.s_addr == htonl(INADDR_LOOPBACK), "peer address");
	for (;;) {
		n = rrecv(s, buf, sizeof buf, 0);
		CHECK(n >= 0, "rrecv");
		if (n == 0)
			break;
		for (int i = 0; i < n; i++)
			CHECK(buf[i] == pattern(got + i), "data at %zu", got + i);
		got += n;
	}
	CHECK(got == TOTAL, "received %zu of %d", got, TOTAL);
	OK("stream intact up to the peer's shutdown, then end of stream");
	/* Answer, then close. */
	CHECK(rsend(s, "bye", 3, 0) == 3, "rsend bye");
	CHECK(rclose(s) == 0, "rclose");
	CHECK(rclose(l) == 0, "rclose listener");
	CHECK(rclose(l) == -1 && errno == EBADF, "double rclose is EBADF");
	OK("rclose");
}

static void rsocket_client(int p)
{
	struct sockaddr_in a = addr(p), peer;
	socklen_t len;
	int s, fl, err, pfd[2];
	size_t sent = 0, chunk = 1;
	static unsigned char buf[200000];
	char bye[8];

	s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "rsocket");
	CHECK(rconnect(s, (struct sockaddr *)&a, sizeof a) == 0, "rconnect");
	len = sizeof peer;
	CHECK(rgetpeername(s, (struct sockaddr *)&peer, &len) == 0 && peer.sin_port == htons(p),
	      "rgetpeername");
	len = sizeof err;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0, "SO_ERROR");
	OK("connected; rgetpeername, SO_ERROR");

	/* rpoll over an rsocket with nothing to read and a readable pipe. */
	CHECK(pipe(pfd) == 0, "pipe");
	CHECK(write(pfd[1], "x", 1) == 1, "pipe write");
	struct pollfd fds[2] = { { .fd = s, .events = POLLIN }, { .fd = pfd[0], .events = POLLIN } };
	CHECK(rpoll(fds, 2, 1000) == 1, "rpoll count");
	CHECK(fds[0].revents == 0 && (fds[1].revents & POLLIN), "rpoll revents %x %x",
	      fds[0].revents, fds[1].revents);
	fds[1].fd = -1;
	fds[0].events = POLLOUT;
	CHECK(rpoll(fds, 2, 1000) == 1 && (fds[0].revents & POLLOUT), "rpoll POLLOUT");
	OK("rpoll mixes rsockets and ordinary descriptors");

	/* Non-blocking: nothing to read yet. */
	fl = rfcntl(s, F_GETFL);
	CHECK(fl >= 0 && !(fl & O_NONBLOCK), "F_GETFL");
	CHECK(rfcntl(s, F_SETFL, fl | O_NONBLOCK) == 0, "F_SETFL");
	CHECK(rfcntl(s, F_GETFL) & O_NONBLOCK, "O_NONBLOCK kept");
	CHECK(rrecv(s, buf, 10, 0) == -1 && errno == EAGAIN, "non-blocking rrecv is EAGAIN");
	CHECK(rfcntl(s, F_SETFL, fl) == 0, "F_SETFL back");
	CHECK(rrecv(s, buf, 10, MSG_DONTWAIT) == -1 && errno == EAGAIN, "MSG_DONTWAIT is EAGAIN");
	OK("O_NONBLOCK and MSG_DONTWAIT");

	CHECK(riomap(s, buf, 4096, PROT_READ, 0, 0) == -1 && errno == EINVAL, "riomap PROT_READ");
	CHECK(riowrite(s, buf, 10, 1 << 20, 0) == (size_t)-1 && errno == EINVAL,
	      "riowrite outside any mapping");
	OK("riomap/riowrite refuse what is not mapped for writing");

	while (sent < TOTAL) {
		size_t n = chunk < TOTAL - sent ? chunk : TOTAL - sent;
		for (size_t i = 0; i < n; i++)
			buf[i] = pattern(sent + i);
		size_t off = 0;
		while (off < n) {
			ssize_t r = rsend(s, buf + off, n - off, 0);
			CHECK(r > 0, "rsend");
			off += r;
		}
		sent += n;
		chunk = (chunk * 7 + 13) % sizeof buf + 1;
	}
	CHECK(rshutdown(s, SHUT_WR) == 0, "rshutdown");
	CHECK(rsend(s, "x", 1, 0) == -1 && errno == EPIPE, "rsend after SHUT_WR is EPIPE");
	CHECK(rrecv(s, bye, 3, MSG_WAITALL) == 3 && memcmp(bye, "bye", 3) == 0, "bye");
	CHECK(rrecv(s, bye, 3, 0) == 0, "end of stream after the peer's close");
	CHECK(rclose(s) == 0, "rclose");
	OK("sent everything, shut down, got the answer and end of stream");
}

/* Forks a helper that writes `c` to `fd` once TCP `p` listens (seen in
 * /proc/net/tcp, so nobody connects to it), for the other process. */
static void signal_when_listening(int fd, int p, char c)
{
	if (fork() != 0)
		return;
	for (int i = 0; i < 10000; i++) {
		char line[256], want[16];
		FILE *f = fopen("/proc/net/tcp", "r");
		int found = 0;

		snprintf(want, sizeof want, ":%04X ", p);
		while (f && fgets(line, sizeof line, f))
			if (strstr(line, want) && strstr(line, " 0A "))
				found = 1;
		if (f)
			fclose(f);
		if (found)
			break;
		usleep(2000);
	}
	_exit(write(fd, &c, 1) == 1 ? 0 : 1);
}

int main(int argc, char **argv)
{
	int ready[2], status;
	pid_t child;
	char c;

	if (argc != 4)
		return 2;
	port = atoi(argv[1]);
	ud_port = atoi(argv[2]);
	rs_port = atoi(argv[3]);
	setvbuf(stdout, NULL, _IOLBF, 0);

	/* Library-only checks. */
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0,
	      "rdma_event_str");
	CHECK(strcmp(rdma_event_str(999), "UNKNOWN EVENT") == 0, "rdma_event_str out of range");
	struct rdma_addrinfo hints, *res;
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
	hints.ai_port_space = RDMA_PS_TCP;
	CHECK(rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res) == 0, "getaddrinfo passive");
	CHECK(res->ai_src_addr && res->ai_family == AF_INET && res->ai_qp_type == IBV_QPT_RC &&
	      ((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7471), "passive result");
	rdma_freeaddrinfo(res);
	hints.ai_flags = RAI_NUMERICHOST;
	hints.ai_port_space = RDMA_PS_UDP;
	CHECK(rdma_getaddrinfo("127.0.0.1", "7174", &hints, &res) == 0, "getaddrinfo active");
	CHECK(res->ai_dst_addr && !res->ai_src_addr && res->ai_qp_type == IBV_QPT_UD, "active result");
	rdma_freeaddrinfo(res);
	CHECK(rdma_getaddrinfo("not-an-address", "1", &hints, &res) == -1, "bad numeric host");
	/* Neither node nor service: the result comes from the hints. */
	struct sockaddr_in hs = addr(0), hd = addr(7174);
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_INET;
	hints.ai_qp_type = IBV_QPT_RC;
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_src_addr = (struct sockaddr *)&hs;
	hints.ai_src_len = sizeof hs;
	hints.ai_dst_addr = (struct sockaddr *)&hd;
	hints.ai_dst_len = sizeof hd;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0, "getaddrinfo from hints");
	CHECK(res->ai_family == AF_INET && res->ai_qp_type == IBV_QPT_RC &&
	      res->ai_port_space == RDMA_PS_TCP && !(res->ai_flags & RAI_PASSIVE) &&
	      res->ai_src_len == sizeof hs && res->ai_dst_len == sizeof hd &&
	      memcmp(res->ai_src_addr, &hs, sizeof hs) == 0 &&
	      memcmp(res->ai_dst_addr, &hd, sizeof hd) == 0, "result from hints");
	rdma_freeaddrinfo(res);
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL, "no input");
	/* An active lookup without a source takes the hints' one. */
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_NUMERICHOST;
	hints.ai_src_addr = (struct sockaddr *)&hs;
	hints.ai_src_len = sizeof hs;
	CHECK(rdma_getaddrinfo("127.0.0.1", "7174", &hints, &res) == 0, "getaddrinfo with source");
	CHECK(res->ai_dst_addr && res->ai_src_len == sizeof hs &&
	      res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP,
	      "active result with the hints' source");
	rdma_freeaddrinfo(res);
	/* Loopback binds no device (as the wildcard); resolving toward it
	 * attaches the first device, the same one on both ends. */
	struct rdma_cm_id *lb;
	struct ibv_context **devs = rdma_get_devices(NULL);
	CHECK(devs && devs[0], "rdma_get_devices");
	CHECK(rdma_create_id(NULL, &lb, NULL, RDMA_PS_TCP) == 0, "create_id");
	CHECK(rdma_bind_addr(lb, (struct sockaddr *)&hs) == 0 && !lb->verbs, "bind loopback: no device");
	rdma_destroy_id(lb);
	CHECK(rdma_create_id(NULL, &lb, NULL, RDMA_PS_TCP) == 0, "create_id");
	CHECK(rdma_resolve_addr(lb, NULL, (struct sockaddr *)&hd, 2000) == 0, "resolve loopback");
	CHECK(lb->verbs == devs[0], "loopback resolves to the first device (%s, first %s)",
	      ibv_get_device_name(lb->verbs->device), ibv_get_device_name(devs[0]->device));
	rdma_destroy_id(lb);
	rdma_free_devices(devs);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "channel");
	CHECK(fcntl(ch->fd, F_SETFL, O_NONBLOCK) == 0, "channel O_NONBLOCK");
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "empty non-blocking channel");
	rdma_destroy_event_channel(ch);
	struct rdma_cm_id *bad;
	CHECK(rdma_create_id(NULL, &bad, NULL, (enum rdma_port_space)0x7777) == -1 && errno == EINVAL,
	      "unknown port space");
	OK("event names, rdma_getaddrinfo, loopback devices, non-blocking channel, bad port space");
	int f = rsocket(AF_INET, SOCK_STREAM, 0);
	struct pollfd fp = { .fd = f, .events = POLLIN };
	CHECK(f >= 0 && rpoll(&fp, 1, 5000) == 1 && (fp.revents & POLLHUP), "fresh rsocket");
	CHECK(rclose(f) == 0, "rclose fresh");
	CHECK(rsocket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == EOPNOTSUPP, "SOCK_DGRAM");
	OK("rpoll on a fresh rsocket reports a hang-up at once; SOCK_DGRAM refused");

	CHECK(pipe(ready) == 0, "pipe");
	child = fork();
	CHECK(child >= 0, "fork");
	if (child == 0) {
		who = "active";
		CHECK(read(ready[0], &c, 1) == 1, "wait for rc listener");
		ch = rdma_create_event_channel();
		active_cm(ch, RDMA_PS_TCP, port);
		CHECK(read(ready[0], &c, 1) == 1, "wait for ud listener");
		active_cm(ch, RDMA_PS_UDP, ud_port);
		rdma_destroy_event_channel(ch);
		CHECK(read(ready[0], &c, 1) == 1, "wait for rsocket listener");
		rsocket_client(rs_port);
		return 0;
	}
	who = "passive";
	ch = rdma_create_event_channel();
	signal_when_listening(ready[1], port, 'r');
	passive_cm(ch, RDMA_PS_TCP, port);
	signal_when_listening(ready[1], ud_port, 'u');
	passive_cm(ch, RDMA_PS_UDP, ud_port);
	rdma_destroy_event_channel(ch);
	rsocket_server(rs_port, ready[1]);
	while (wait(&status) > 0)
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			printf("FAIL: a child exited with %d\n", status);
			return 1;
		}
	printf("rdmacm_api: OK\n");
	return 0;
}
