/* The C side of nixl-cgo's UCX backend: the few UCP sequences that are
 * awkward or slow to drive call by call from Go (a batch of get/put plus
 * the endpoint flush, the active-message receive callback and its queue,
 * endpoint close with a bounded wait). Every function here is called with
 * the owning Go agent's lock held, so the UCP workers run in
 * UCS_THREAD_MODE_SERIALIZED. */
#ifndef KVG_UCX_SHIM_H
#define KVG_UCX_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

/* The active-message id notifications travel on. */
#define KVG_AM_NOTIF 1u
/* Received notifications a worker queues before it drops (and counts). */
#define KVG_MAX_QUEUED_NOTIFS 65536u

typedef struct kvg_notif {
	struct kvg_notif *next;
	size_t len;
	char data[];
} kvg_notif;

typedef struct kvg_pending {
	struct kvg_pending *next;
	void *req;
	void *buf;
} kvg_pending;

typedef struct kvg_worker {
	ucp_worker_h w;
	void *addr;
	size_t addrlen;
	int efd;
	kvg_notif *nhead, *ntail;
	size_t nqueued;
	uint64_t ndropped;
	size_t max_notif; /* larger notifications are dropped (and counted) */
	kvg_pending *pend; /* notification sends still in flight */
} kvg_worker;

typedef struct kvg_ep {
	ucp_ep_h ep;
	kvg_worker *w;
	ucs_status_t status; /* set by the error callback */
} kvg_ep;

typedef struct kvg_xfer {
	kvg_ep *ep;
	void *flush;          /* the endpoint flush that ends the batch */
	ucs_status_t status;  /* UCS_INPROGRESS until the flush completes */
	ucs_status_t failed;  /* the first operation that failed to post */
	void *notif;          /* sent once the data completes */
	size_t notif_len;
} kvg_xfer;

ucs_status_t kvg_context_create(const char *net_devices, int wakeup, ucp_context_h *out);
void kvg_context_destroy(ucp_context_h ctx);

ucs_status_t kvg_worker_create(ucp_context_h ctx, int wakeup, size_t max_notif, kvg_worker **out);
void kvg_worker_destroy(kvg_worker *w);
unsigned kvg_progress(kvg_worker *w);
/* Arms the worker for wake-up; UCS_ERR_BUSY means progress first. */
ucs_status_t kvg_worker_arm(kvg_worker *w);
/* Waits (without the agent lock) up to timeout_ms for events on any of the
 * workers (at most 64), all armed and created with wakeup. */
int kvg_workers_wait(kvg_worker **ws, int n, int timeout_ms);
/* Pops one received notification (caller frees with kvg_free), or NULL. */
kvg_notif *kvg_pop_notif(kvg_worker *w);

ucs_status_t kvg_ep_create(kvg_worker *w, const void *addr, int err_peer, kvg_ep **out);
/* Closes the UCP endpoint (its requests end, canceled when forced), waiting
 * at most timeout_ms; the struct stays valid (status set) until kvg_ep_free. */
void kvg_ep_close(kvg_ep *e, int force, int timeout_ms);
void kvg_ep_free(kvg_ep *e);
int kvg_ep_status(kvg_ep *e);
/* Whether the context can map CUDA memory (VRAM). */
int kvg_cuda_supported(ucp_context_h ctx);
/* Wakes a kvg_worker_wait on this worker; safe from any thread. */
void kvg_worker_signal(kvg_worker *w);

ucs_status_t kvg_mem_map(ucp_context_h ctx, uintptr_t addr, size_t len, ucp_mem_h *mh,
			 void **rkey, size_t *rkey_len);
void kvg_mem_unmap(ucp_context_h ctx, ucp_mem_h mh);
void kvg_rkey_buffer_release(void *rkey);
ucs_status_t kvg_rkey_unpack(kvg_ep *e, const void *buf, ucp_rkey_h *out);
void kvg_rkey_destroy(ucp_rkey_h rk);

/* Posts n get (op 0) or put (op 1) operations and the endpoint flush.
 * notif (may be NULL) is copied and sent as an active message once the
 * flush completes. Returns the transfer (check x->status) or NULL when out
 * of memory. */
kvg_xfer *kvg_xfer_post(kvg_ep *e, int op, int n, const uintptr_t *laddr, const uint64_t *raddr,
			const uint64_t *len, const ucp_rkey_h *rkeys, const void *notif,
			size_t notif_len);
/* Progresses the worker (up to spins rounds while the transfer runs) and
 * returns the transfer's status; sends the pending notification on
 * completion. */
ucs_status_t kvg_xfer_poll(kvg_xfer *x, int spins);
/* Frees a transfer that is no longer in progress. */
void kvg_xfer_free(kvg_xfer *x);

/* Sends a standalone notification on the endpoint. */
ucs_status_t kvg_send_notif(kvg_ep *e, const void *data, size_t len);

void kvg_free(void *p);
/* C objects alive (transfers, endpoints, notifications, pending sends, rkeys). */
long kvg_live_objects(void);

#endif
