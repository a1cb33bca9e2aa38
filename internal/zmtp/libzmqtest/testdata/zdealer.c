// zdealer: a libzmq DEALER replay client: sends ["", START] to ENDPOINT and
// prints each reply's sequence number and payload until the end marker.
// usage: zdealer ENDPOINT START
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

int main(int argc, char **argv) {
	if (argc != 3) { fprintf(stderr, "usage\n"); return 2; }
	void *ctx = zmq_ctx_new();
	void *s = zmq_socket(ctx, ZMQ_DEALER);
	int rcvtmo = 20000;
	zmq_setsockopt(s, ZMQ_RCVTIMEO, &rcvtmo, sizeof rcvtmo);
	if (zmq_connect(s, argv[1]) != 0) { fprintf(stderr, "connect: %s\n", zmq_strerror(zmq_errno())); return 1; }
	uint64_t start = strtoull(argv[2], NULL, 10);
	unsigned char sb[8];
	for (int i = 0; i < 8; i++) sb[i] = (unsigned char)(start >> (56 - 8 * i));
	zmq_send(s, "", 0, ZMQ_SNDMORE);
	zmq_send(s, sb, 8, 0);
	for (;;) {
		unsigned char empty[8], seq[8], body[65536];
		int en = zmq_recv(s, empty, sizeof empty, 0);
		int qn = zmq_recv(s, seq, sizeof seq, 0);
		int bn = zmq_recv(s, body, sizeof body, 0);
		if (en != 0 || qn != 8 || bn < 0) { fprintf(stderr, "bad reply %d %d %d\n", en, qn, bn); return 1; }
		uint64_t v = 0;
		for (int i = 0; i < 8; i++) v = v << 8 | seq[i];
		if (v == UINT64_MAX) { printf("end\n"); break; }
		printf("%llu %d\n", (unsigned long long)v, bn);
		fflush(stdout);
	}
	zmq_close(s);
	zmq_ctx_term(ctx);
	return 0;
}
