// zpub: a libzmq PUB that sends [topic, 8-byte big-endian seq, payload]
// messages as vLLM's publisher does, seq from 0, every 2 ms, until it has
// sent count of them. payload is size bytes, byte i = (i*7 + seq) & 0xff.
// usage: zpub bind|connect ENDPOINT TOPIC COUNT SIZE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

int main(int argc, char **argv) {
	if (argc != 6) { fprintf(stderr, "usage\n"); return 2; }
	void *ctx = zmq_ctx_new();
	void *s = zmq_socket(ctx, ZMQ_PUB);
	int rc = strcmp(argv[1], "bind") == 0 ? zmq_bind(s, argv[2]) : zmq_connect(s, argv[2]);
	if (rc != 0) { fprintf(stderr, "%s: %s\n", argv[1], zmq_strerror(zmq_errno())); return 1; }
	if (strcmp(argv[1], "bind") == 0) {
		char ep[256]; size_t n = sizeof ep;
		zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &n);
		printf("%s\n", ep);
		fflush(stdout);
	}
	long count = atol(argv[4]), size = 0;
	unsigned char *payload = NULL;
	int fixed = argv[5][0] == '@';
	if (fixed) {
		FILE *f = fopen(argv[5] + 1, "rb");
		if (!f) { perror("payload"); return 1; }
		fseek(f, 0, SEEK_END); size = ftell(f); fseek(f, 0, SEEK_SET);
		payload = malloc(size > 0 ? size : 1);
		if (fread(payload, 1, size, f) != (size_t)size) { perror("payload"); return 1; }
		fclose(f);
	} else {
		size = atol(argv[5]);
		payload = malloc(size > 0 ? size : 1);
	}
	for (long seq = 0; seq < count; seq++) {
		unsigned char sb[8];
		for (int i = 0; i < 8; i++) sb[i] = (unsigned char)((uint64_t)seq >> (56 - 8 * i));
		for (long i = 0; !fixed && i < size; i++) payload[i] = (unsigned char)((i * 7 + seq) & 0xff);
		zmq_send(s, argv[3], strlen(argv[3]), ZMQ_SNDMORE);
		zmq_send(s, sb, 8, ZMQ_SNDMORE);
		zmq_send(s, payload, size, 0);
		struct timespec ts = {0, 2000000};
		nanosleep(&ts, NULL);
	}
	zmq_close(s);
	zmq_ctx_term(ctx);
	return 0;
}
