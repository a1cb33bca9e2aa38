// zrouter: vLLM's replay service on libzmq: a bound ROUTER that answers
// [id, "", start] with [id, "", seq, "batch-<seq>"] for start <= seq < 10,
// then [id, "", -1, ""]; it serves COUNT requests.
// usage: zrouter ENDPOINT COUNT
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static void seqbytes(unsigned char *b, uint64_t v) {
	for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (56 - 8 * i));
}

int main(int argc, char **argv) {
	if (argc != 3) { fprintf(stderr, "usage\n"); return 2; }
	void *ctx = zmq_ctx_new();
	void *s = zmq_socket(ctx, ZMQ_ROUTER);
	if (zmq_bind(s, argv[1]) != 0) { fprintf(stderr, "bind: %s\n", zmq_strerror(zmq_errno())); return 1; }
	char ep[256]; size_t n = sizeof ep;
	zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n);
	printf("%s\n", ep);
	fflush(stdout);
	for (long r = 0; r < atol(argv[2]); r++) {
		unsigned char id[256], empty[8], start[16];
		int idn = zmq_recv(s, id, sizeof id, 0);
		int en = zmq_recv(s, empty, sizeof empty, 0);
		int sn = zmq_recv(s, start, sizeof start, 0);
		if (idn < 0 || en != 0 || sn != 8) { fprintf(stderr, "bad request %d %d %d\n", idn, en, sn); return 1; }
		uint64_t from = 0;
		for (int i = 0; i < 8; i++) from = from << 8 | start[i];
		unsigned char sb[8];
		for (uint64_t seq = from; seq < 10; seq++) {
			char body[32];
			int bn = snprintf(body, sizeof body, "batch-%llu", (unsigned long long)seq);
			seqbytes(sb, seq);
			zmq_send(s, id, idn, ZMQ_SNDMORE);
			zmq_send(s, "", 0, ZMQ_SNDMORE);
			zmq_send(s, sb, 8, ZMQ_SNDMORE);
			zmq_send(s, body, bn, 0);
		}
		seqbytes(sb, UINT64_MAX);
		zmq_send(s, id, idn, ZMQ_SNDMORE);
		zmq_send(s, "", 0, ZMQ_SNDMORE);
		zmq_send(s, sb, 8, ZMQ_SNDMORE);
		zmq_send(s, "", 0, 0);
	}
	zmq_close(s);
	zmq_ctx_term(ctx);
	return 0;
}
