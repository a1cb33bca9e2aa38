// zsub: a libzmq SUB (heartbeating, so the peer must answer PINGs) that
// prints each of COUNT messages as one line: the frame count, then each
// frame's length and the sum of its bytes.
// usage: zsub bind|connect ENDPOINT COUNT
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

int main(int argc, char **argv) {
	if (argc != 4) { fprintf(stderr, "usage\n"); return 2; }
	void *ctx = zmq_ctx_new();
	void *s = zmq_socket(ctx, ZMQ_SUB);
	// The heartbeat timeout is a second: a loaded machine may delay the
	// peer's PONG by far more than the usual milliseconds.
	int ivl = 50, tmo = 1000, rcvtmo = 20000;
	zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
	zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &tmo, sizeof tmo);
	zmq_setsockopt(s, ZMQ_RCVTIMEO, &rcvtmo, sizeof rcvtmo);
	zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
	int rc = strcmp(argv[1], "bind") == 0 ? zmq_bind(s, argv[2]) : zmq_connect(s, argv[2]);
	if (rc != 0) { fprintf(stderr, "%s: %s\n", argv[1], zmq_strerror(zmq_errno())); return 1; }
	if (strcmp(argv[1], "bind") == 0) {
		char ep[256]; size_t n = sizeof ep;
		zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n);
		printf("%s\n", ep);
		fflush(stdout);
	}
	long count = atol(argv[3]);
	for (long m = 0; m < count; m++) {
		int frames = 0;
		char line[4096]; int off = 0;
		int more = 1;
		while (more) {
			zmq_msg_t msg;
			zmq_msg_init(&msg);
			if (zmq_msg_recv(&msg, s, 0) < 0) { fprintf(stderr, "recv: %s\n", zmq_strerror(zmq_errno())); return 1; }
			unsigned long sum = 0;
			unsigned char *d = zmq_msg_data(&msg);
			for (size_t i = 0; i < zmq_msg_size(&msg); i++) sum += d[i];
			off += snprintf(line + off, sizeof line - off, " %zu:%lu", zmq_msg_size(&msg), sum);
			more = zmq_msg_more(&msg);
			zmq_msg_close(&msg);
			frames++;
		}
		printf("%d%s\n", frames, line);
		fflush(stdout);
	}
	zmq_close(s);
	zmq_ctx_term(ctx);
	return 0;
}
