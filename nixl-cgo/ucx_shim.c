#include "ucx_shim.h"

#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_long live;

long kvg_live_objects(void) { return atomic_load(&live); }

static void *obj_alloc(size_t n)
{
	void *p = calloc(1, n);
	if (p)
		atomic_fetch_add(&live, 1);
	return p;
}

static void obj_free(void *p)
{
	if (p) {
		atomic_fetch_sub(&live, 1);
		free(p);
	}
}

void kvg_free(void *p) { obj_free(p); }

ucs_status_t kvg_context_create(const char *net_devices, int wakeup, ucp_context_h *out)
{
	ucp_config_t *cfg;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK)
		return st;
	if (net_devices && *net_devices) {
		st = ucp_config_modify(cfg, "NET_DEVICES", net_devices);
		if (st != UCS_OK) {
			ucp_config_release(cfg);
			return st;
		}
	}
	ucp_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO32 | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
	if (wakeup)
		p.features |= UCP_FEATURE_WAKEUP;
	p.mt_workers_shared = 1;
	st = ucp_init(&p, cfg, out);
	ucp_config_release(cfg);
	return st;
}

void kvg_context_destroy(ucp_context_h ctx) { ucp_cleanup(ctx); }

static ucs_status_t notif_cb(void *arg, const void *header, size_t header_length, void *data,
			     size_t length, const ucp_am_recv_param_t *param)
{
	kvg_worker *w = arg;
	(void)header;
	/* Notifications are eager, header-less messages; anything else is not
	 * ours to interpret, and the queue holds at most its count of the
	 * largest the Go side sends. */
	if (header_length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ||
	    length > w->max_notif || w->nqueued >= KVG_MAX_QUEUED_NOTIFS) {
		w->ndropped++;
		return UCS_OK;
	}
	kvg_notif *n = obj_alloc(sizeof(*n) + length);
	if (!n) {
		w->ndropped++;
		return UCS_OK;
	}
	n->len = length;
	memcpy(n->data, data, length);
	if (w->ntail)
		w->ntail->next = n;
	else
		w->nhead = n;
	w->ntail = n;
	w->nqueued++;
	return UCS_OK;
}

ucs_status_t kvg_worker_create(ucp_context_h ctx, int wakeup, size_t max_notif, kvg_worker **out)
{
	kvg_worker *w = obj_alloc(sizeof(*w));
	if (!w)
		return UCS_ERR_NO_MEMORY;
	w->efd = -1;
	w->max_notif = max_notif;
	ucp_worker_params_t wp;
	memset(&wp, 0, sizeof(wp));
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
	ucs_status_t st = ucp_worker_create(ctx, &wp, &w->w);
	if (st != UCS_OK)
		goto fail;
	st = ucp_worker_get_address(w->w, (ucp_address_t **)&w->addr, &w->addrlen);
	if (st != UCS_OK)
		goto fail_worker;
	if (wakeup) {
		st = ucp_worker_get_efd(w->w, &w->efd);
		if (st != UCS_OK)
			goto fail_addr;
	}
	ucp_am_handler_param_t hp;
	memset(&hp, 0, sizeof(hp));
	hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
			UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
	hp.id = KVG_AM_NOTIF;
	hp.cb = notif_cb;
	hp.arg = w;
	hp.flags = UCP_AM_FLAG_WHOLE_MSG;
	st = ucp_worker_set_am_recv_handler(w->w, &hp);
	if (st != UCS_OK)
		goto fail_addr;
	*out = w;
	return UCS_OK;
fail_addr:
	ucp_worker_release_address(w->w, w->addr);
fail_worker:
	ucp_worker_destroy(w->w);
fail:
	obj_free(w);
	return st;
}

static void reap_pending(kvg_worker *w, int all)
{
	kvg_pending **pp = &w->pend;
	while (*pp) {
		kvg_pending *p = *pp;
		if (!all && ucp_request_check_status(p->req) == UCS_INPROGRESS) {
			pp = &p->next;
			continue;
		}
		*pp = p->next;
		ucp_request_free(p->req);
		obj_free(p->buf);
		obj_free(p);
	}
}

void kvg_worker_destroy(kvg_worker *w)
{
	/* Endpoints are closed first (by the Go side), which completes every
	 * send still pending. */
	while (w->pend && ucp_worker_progress(w->w))
		;
	reap_pending(w, 1);
	kvg_notif *n;
	while ((n = kvg_pop_notif(w)))
		obj_free(n);
	ucp_worker_release_address(w->w, w->addr);
	ucp_worker_destroy(w->w);
	obj_free(w);
}

unsigned kvg_progress(kvg_worker *w)
{
	unsigned n = ucp_worker_progress(w->w);
	if (w->pend)
		reap_pending(w, 0);
	return n;
}

ucs_status_t kvg_worker_arm(kvg_worker *w) { return ucp_worker_arm(w->w); }

int kvg_workers_wait(kvg_worker **ws, int n, int timeout_ms)
{
	struct pollfd p[64];
	if (n > 64)
		n = 64;
	for (int i = 0; i < n; i++) {
		p[i].fd = ws[i]->efd;
		p[i].events = POLLIN;
		p[i].revents = 0;
	}
	return poll(p, n, timeout_ms);
}

kvg_notif *kvg_pop_notif(kvg_worker *w)
{
	kvg_notif *n = w->nhead;
	if (n) {
		w->nhead = n->next;
		if (!w->nhead)
			w->ntail = NULL;
		w->nqueued--;
		n->next = NULL;
	}
	return n;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	(void)ep;
	kvg_ep *e = arg;
	if (e->status == UCS_OK)
		e->status = status;
}

ucs_status_t kvg_ep_create(kvg_worker *w, const void *addr, int err_peer, kvg_ep **out)
{
	kvg_ep *e = obj_alloc(sizeof(*e));
	if (!e)
		return UCS_ERR_NO_MEMORY;
	e->w = w;
	ucp_ep_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
		       UCP_EP_PARAM_FIELD_ERR_HANDLER;
	p.address = addr;
	p.err_mode = err_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
	p.err_handler.cb = ep_err_cb;
	p.err_handler.arg = e;
	ucs_status_t st = ucp_ep_create(w->w, &p, &e->ep);
	if (st != UCS_OK) {
		obj_free(e);
		return st;
	}
	*out = e;
	return UCS_OK;
}

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

void kvg_ep_close(kvg_ep *e, int force, int timeout_ms)
{
	if (!e->ep)
		return;
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	/* A failed endpoint can only be closed by force. */
	p.flags = (force || e->status != UCS_OK) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	void *req = ucp_ep_close_nbx(e->ep, &p);
	e->ep = NULL;
	if (e->status == UCS_OK)
		e->status = UCS_ERR_CANCELED;
	if (UCS_PTR_IS_PTR(req)) {
		long deadline = now_ms() + timeout_ms;
		while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ms() < deadline)
			kvg_progress(e->w);
		ucp_request_free(req);
	}
}

void kvg_ep_free(kvg_ep *e)
{
	kvg_ep_close(e, 1, 0);
	obj_free(e);
}

int kvg_ep_status(kvg_ep *e) { return e->status; }

int kvg_cuda_supported(ucp_context_h ctx)
{
	ucp_context_attr_t a;
	memset(&a, 0, sizeof(a));
	a.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
	if (ucp_context_query(ctx, &a) != UCS_OK)
		return 0;
	return (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

void kvg_worker_signal(kvg_worker *w) { ucp_worker_signal(w->w); }

ucs_status_t kvg_mem_map(ucp_context_h ctx, uintptr_t addr, size_t len, ucp_mem_h *mh,
			 void **rkey, size_t *rkey_len)
{
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
	p.address = (void *)addr;
	p.length = len;
	ucs_status_t st = ucp_mem_map(ctx, &p, mh);
	if (st != UCS_OK)
		return st;
	st = ucp_rkey_pack(ctx, *mh, rkey, rkey_len);
	if (st != UCS_OK)
		ucp_mem_unmap(ctx, *mh);
	return st;
}

void kvg_mem_unmap(ucp_context_h ctx, ucp_mem_h mh) { ucp_mem_unmap(ctx, mh); }

void kvg_rkey_buffer_release(void *rkey) { ucp_rkey_buffer_release(rkey); }

ucs_status_t kvg_rkey_unpack(kvg_ep *e, const void *buf, ucp_rkey_h *out)
{
	if (!e->ep)
		return e->status;
	ucs_status_t st = ucp_ep_rkey_unpack(e->ep, buf, out);
	if (st == UCS_OK)
		atomic_fetch_add(&live, 1);
	return st;
}

void kvg_rkey_destroy(ucp_rkey_h rk)
{
	ucp_rkey_destroy(rk);
	atomic_fetch_sub(&live, 1);
}

static ucs_status_t send_am(kvg_ep *e, const void *data, size_t len, void *owned)
{
	if (!e->ep) {
		/* Closed, its status set by kvg_ep_close: a transfer whose flush
		 * completed before an abort closed the endpoint ends here, its
		 * notification unsent. */
		obj_free(owned);
		return e->status;
	}
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_AM_SEND_FLAG_EAGER;
	void *req = ucp_am_send_nbx(e->ep, KVG_AM_NOTIF, NULL, 0, data, len, &p);
	if (UCS_PTR_IS_ERR(req)) {
		obj_free(owned);
		return UCS_PTR_STATUS(req);
	}
	if (req == NULL) {
		obj_free(owned);
		return UCS_OK;
	}
	kvg_pending *pd = obj_alloc(sizeof(*pd));
	if (!pd) {
		/* Released on completion by UCX; the buffer must outlive it, so
		 * it is leaked rather than freed under the send. */
		ucp_request_free(req);
		return UCS_ERR_NO_MEMORY;
	}
	pd->req = req;
	pd->buf = owned;
	pd->next = e->w->pend;
	e->w->pend = pd;
	return UCS_OK;
}

ucs_status_t kvg_send_notif(kvg_ep *e, const void *data, size_t len)
{
	if (e->status != UCS_OK)
		return e->status;
	void *buf = obj_alloc(len ? len : 1);
	if (!buf)
		return UCS_ERR_NO_MEMORY;
	memcpy(buf, data, len);
	return send_am(e, buf, len, buf);
}

kvg_xfer *kvg_xfer_post(kvg_ep *e, int op, int n, const uintptr_t *laddr, const uint64_t *raddr,
			const uint64_t *len, const ucp_rkey_h *rkeys, const void *notif,
			size_t notif_len)
{
	kvg_xfer *x = obj_alloc(sizeof(*x));
	if (!x)
		return NULL;
	x->ep = e;
	x->status = UCS_INPROGRESS;
	if (notif) {
		x->notif = obj_alloc(notif_len ? notif_len : 1);
		if (!x->notif) {
			obj_free(x);
			return NULL;
		}
		memcpy(x->notif, notif, notif_len);
		x->notif_len = notif_len;
	}
	if (e->status != UCS_OK) {
		x->status = e->status;
		return x;
	}
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	ucs_status_t failed = UCS_OK;
	for (int i = 0; i < n && failed == UCS_OK; i++) {
		void *req = op == 0 ? ucp_get_nbx(e->ep, (void *)laddr[i], len[i], raddr[i], rkeys[i], &p)
				    : ucp_put_nbx(e->ep, (void *)laddr[i], len[i], raddr[i], rkeys[i], &p);
		if (UCS_PTR_IS_ERR(req))
			failed = UCS_PTR_STATUS(req);
		else if (req)
			/* The flush below completes after this operation; the
			 * request itself is released by UCX when it completes. */
			ucp_request_free(req);
	}
	/* Flushed even after a failure: operations already issued must end
	 * before the caller may reuse the buffers. */
	x->failed = failed;
	void *f = ucp_ep_flush_nbx(e->ep, &p);
	if (UCS_PTR_IS_ERR(f))
		x->status = failed != UCS_OK ? failed : UCS_PTR_STATUS(f);
	else if (f)
		x->flush = f;
	else
		x->status = failed;
	if (x->status == UCS_OK && x->notif) {
		x->status = send_am(e, x->notif, x->notif_len, x->notif);
		x->notif = NULL;
	}
	return x;
}

ucs_status_t kvg_xfer_poll(kvg_xfer *x, int spins)
{
	for (int i = 0; x->status == UCS_INPROGRESS; i++) {
		ucs_status_t st = ucp_request_check_status(x->flush);
		if (st != UCS_INPROGRESS) {
			ucp_request_free(x->flush);
			x->flush = NULL;
			if (st == UCS_OK && x->failed != UCS_OK)
				st = x->failed;
			if (st == UCS_OK && x->notif) {
				/* The data is complete: now the peer may learn it. */
				st = send_am(x->ep, x->notif, x->notif_len, x->notif);
				x->notif = NULL;
			}
			x->status = st;
			break;
		}
		if (i >= spins)
			break;
		kvg_progress(x->ep->w);
	}
	return x->status;
}

void kvg_xfer_free(kvg_xfer *x)
{
	if (x->flush)
		ucp_request_free(x->flush);
	obj_free(x->notif);
	obj_free(x);
}
