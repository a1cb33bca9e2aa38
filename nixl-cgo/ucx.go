package nixl

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include "ucx_shim.h"
static inline void *kvg_notif_data(kvg_notif *n) { return n->data; }
*/
import "C"

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// ucxParams are the UCX backend parameters NIXL's plugin takes, and what
// this implementation does with each. Anything else is refused by name.
var ucxParams = map[string]string{
	"device_list":             "UCX devices to use (UCX_NET_DEVICES), comma separated",
	"ucx_devices":             "alias of device_list (the name NIXL advertises as a default)",
	"num_workers":             "UCP workers, default 1; transfers are spread over them",
	"ucx_error_handling_mode": "none or peer (default): peer failures end transfers with an error",
	"ucx_ep_close_force":      "close endpoints by force (true) or after a flush (false, default)",
	"num_threads":             "only 0: the thread-pool engine is not implemented",
}

// UCXParams lists the UCX backend's parameters with their meaning
// (getPluginParams).
func UCXParams() map[string]string { return maps.Clone(ucxParams) }

// epCloseWait bounds how long closing an endpoint waits for the peer.
const epCloseWait = 2 * time.Second

// ucxBackend is the UCX backend engine: one UCP context and its workers.
type ucxBackend struct {
	ctx        C.ucp_context_h
	workers    []*C.kvg_worker
	errPeer    bool
	closeForce bool
	wakeup     bool // workers made with UCP_FEATURE_WAKEUP (event descriptors)
	cuda       bool
	next       int // round-robin worker choice
}

func ucsError(op string, st C.ucs_status_t) error {
	return errorf(op, statusOfUCS(st), "%s", C.GoString(C.ucs_status_string(st)))
}

func statusOfUCS(st C.ucs_status_t) Status {
	switch {
	case st == C.UCS_OK:
		return Success
	case st == C.UCS_INPROGRESS:
		return InProg
	case st == C.UCS_ERR_CANCELED:
		return ErrCanceled
	case st == C.UCS_ERR_CONNECTION_RESET, st == C.UCS_ERR_UNREACHABLE, st == C.UCS_ERR_NOT_CONNECTED,
		st == C.UCS_ERR_REJECTED, st == C.UCS_ERR_TIMED_OUT,
		st <= C.UCS_ERR_FIRST_LINK_FAILURE && st >= C.UCS_ERR_LAST_ENDPOINT_FAILURE:
		return ErrRemoteDisconnect
	case st == C.UCS_ERR_INVALID_PARAM:
		return ErrInvalidParam
	case st == C.UCS_ERR_UNSUPPORTED, st == C.UCS_ERR_NOT_IMPLEMENTED:
		return ErrNotSupported
	}
	return ErrBackend
}

func parseUCXParams(p Params) (devices string, workers int, errPeer, force bool, err error) {
	workers, errPeer = 1, true
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := p[k]
		switch k {
		case "device_list", "ucx_devices":
			if devices != "" && devices != v {
				return "", 0, false, false, fmt.Errorf("device_list %q and ucx_devices %q disagree", devices, v)
			}
			devices = strings.TrimSpace(v)
		case "num_workers":
			n, e := strconv.Atoi(v)
			if e != nil || n < 1 || n > maxWorkers {
				return "", 0, false, false, fmt.Errorf("num_workers %q: want an integer 1..%d", v, maxWorkers)
			}
			workers = n
		case "ucx_error_handling_mode":
			switch v {
			case "peer":
				errPeer = true
			case "none":
				errPeer = false
			default:
				return "", 0, false, false, fmt.Errorf("ucx_error_handling_mode %q: want none or peer", v)
			}
		case "ucx_ep_close_force":
			b, e := strconv.ParseBool(v)
			if e != nil {
				return "", 0, false, false, fmt.Errorf("ucx_ep_close_force %q: want a boolean", v)
			}
			force = b
		case "num_threads":
			if v != "0" && v != "" {
				return "", 0, false, false, fmt.Errorf("num_threads %q: the thread-pool engine is not implemented; use 0 (num_workers spreads transfers)", v)
			}
		default:
			return "", 0, false, false, fmt.Errorf("unknown UCX backend parameter %q (known: %s)", k, strings.Join(sortedKeys(ucxParams), ", "))
		}
	}
	return devices, workers, errPeer, force, nil
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func newUCXBackend(p Params, o engineOpts) (backendEngine, error) {
	devices, nworkers, errPeer, force, err := parseUCXParams(p)
	if err != nil {
		return nil, errorf("createBackend", ErrInvalidParam, "UCX: %v", err)
	}
	b := &ucxBackend{errPeer: errPeer, closeForce: force, wakeup: o.wakeup}
	var cdev *C.char
	if devices != "" {
		cdev = C.CString(devices)
		defer C.free(unsafe.Pointer(cdev))
	}
	if st := C.kvg_context_create(cdev, cbool(b.wakeup), &b.ctx); st != C.UCS_OK {
		return nil, ucsError("createBackend", st)
	}
	b.cuda = C.kvg_cuda_supported(b.ctx) != 0
	for range nworkers {
		var w *C.kvg_worker
		if st := C.kvg_worker_create(b.ctx, cbool(b.wakeup), C.size_t(maxNotifPayload), &w); st != C.UCS_OK {
			b.close()
			return nil, ucsError("createBackend", st)
		}
		b.workers = append(b.workers, w)
	}
	return b, nil
}

func cbool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}

func (b *ucxBackend) close() {
	for _, w := range b.workers {
		C.kvg_worker_destroy(w)
	}
	b.workers = nil
	if b.ctx != nil {
		C.kvg_context_destroy(b.ctx)
		b.ctx = nil
	}
}

func (b *ucxBackend) supportsMem(t MemType) error {
	switch t {
	case DRAM:
		return nil
	case VRAM:
		if !b.cuda {
			return errorf("registerMem", ErrNotSupported, "VRAM_SEG: this node's UCX cannot map GPU memory (no CUDA support or no GPU)")
		}
		return nil
	}
	return errorf("registerMem", ErrNotSupported, "%s: the UCX backend registers DRAM_SEG and VRAM_SEG only", t)
}

func (b *ucxBackend) connInfo() [][]byte {
	out := make([][]byte, len(b.workers))
	for i, w := range b.workers {
		out[i] = C.GoBytes(w.addr, C.int(w.addrlen))
	}
	return out
}

// ucxReg is one mapped region.
type ucxReg struct {
	mh   C.ucp_mem_h
	rkey []byte
}

func (r *ucxReg) publicMD() []byte { return r.rkey }

// registerMem maps d; ucp_mem_map tells host from CUDA memory itself, so
// the type (checked by supportsMem) is not needed.
func (b *ucxBackend) registerMem(_ MemType, d Desc) (backendMem, error) {
	var (
		mh   C.ucp_mem_h
		rk   unsafe.Pointer
		rkln C.size_t
	)
	if st := C.kvg_mem_map(b.ctx, C.uintptr_t(d.Addr), C.size_t(d.Len), &mh, &rk, &rkln); st != C.UCS_OK {
		return nil, ucsError("registerMem", st)
	}
	r := &ucxReg{mh: mh, rkey: C.GoBytes(rk, C.int(rkln))}
	C.kvg_rkey_buffer_release(rk)
	return r, nil
}

func (b *ucxBackend) deregisterMem(m backendMem) { C.kvg_mem_unmap(b.ctx, m.(*ucxReg).mh) }

func (b *ucxBackend) pickWorker() int {
	w := b.next % len(b.workers)
	b.next++
	return w
}

// progress runs every worker until idle or for at most rounds rounds each;
// it reports whether a worker was still busy (so the caller should come
// back before sleeping).
func (b *ucxBackend) progress(rounds int) (busy bool) {
	for _, w := range b.workers {
		n := 0
		for ; n < rounds && C.kvg_progress(w) != 0; n++ {
		}
		busy = busy || n == rounds
	}
	return busy
}

// armWait readies every worker's event descriptor; nil means events are
// pending and the caller should progress again.
func (b *ucxBackend) armWait() func(time.Duration) {
	for _, w := range b.workers {
		if C.kvg_worker_arm(w) != C.UCS_OK {
			return nil
		}
	}
	ws := b.workers
	return func(timeout time.Duration) { waitEvents(ws, timeout) }
}

// signal wakes the progress goroutine's sleep; workers without wakeup
// have no sleeper (and UCP refuses ucp_worker_signal on them).
func (b *ucxBackend) signal() {
	if !b.wakeup {
		return
	}
	for _, w := range b.workers {
		C.kvg_worker_signal(w)
	}
}

// getNotifs drains received notification payloads; dropped is the
// workers' running count.
func (b *ucxBackend) getNotifs(yield func([]byte)) (dropped uint64) {
	for _, w := range b.workers {
		for n := C.kvg_pop_notif(w); n != nil; n = C.kvg_pop_notif(w) {
			yield(C.GoBytes(C.kvg_notif_data(n), C.int(n.len)))
			C.kvg_free(unsafe.Pointer(n))
		}
		dropped += uint64(w.ndropped)
	}
	return dropped
}

// ucxConn is the connection to one remote agent: an endpoint per local
// worker (to the remote worker of the same index, modulo its count) and the
// rkeys unpacked on each.
type ucxConn struct {
	b     *ucxBackend
	addrs [][]byte
	rkeys [][]byte // per remote region
	eps   []*C.kvg_ep
	unpk  []map[int]C.ucp_rkey_h // per worker: region → rkey
}

// ucxAddrVersionMask and ucxAddrVersionMax read a worker address's header:
// its low four bits are the format version, and UCP (1.13) unpacks v1 (0)
// and v2 (1) only; any other value fails an assertion inside ucp_ep_create
// that aborts the whole process, so a peer's metadata must not reach it.
const (
	ucxAddrVersionMask = 0x0f
	ucxAddrVersionMax  = 1
)

func (b *ucxBackend) loadRemote(md *backendMD) (backendPeer, error) {
	for i, w := range md.Workers {
		// decodeMD refuses an empty address.
		if v := w[0] & ucxAddrVersionMask; v > ucxAddrVersionMax {
			return nil, fmt.Errorf("worker address %d has format version %d; UCP reads 0..%d", i, v, ucxAddrVersionMax)
		}
	}
	c := &ucxConn{b: b, addrs: md.Workers, eps: make([]*C.kvg_ep, len(b.workers)),
		unpk: make([]map[int]C.ucp_rkey_h, len(b.workers))}
	for _, r := range md.Regions {
		c.rkeys = append(c.rkeys, r.RKey)
	}
	return c, nil
}

func (c *ucxConn) ep(worker int) (*C.kvg_ep, error) {
	if e := c.eps[worker]; e != nil {
		return e, nil
	}
	addr := c.addrs[worker%len(c.addrs)]
	caddr := C.CBytes(addr)
	defer C.free(caddr)
	var e *C.kvg_ep
	if st := C.kvg_ep_create(c.b.workers[worker], caddr, cbool(c.b.errPeer), &e); st != C.UCS_OK {
		return nil, ucsError("connect", st)
	}
	c.eps[worker] = e
	c.unpk[worker] = map[int]C.ucp_rkey_h{}
	return e, nil
}

func (c *ucxConn) rkey(worker, region int) (C.ucp_rkey_h, error) {
	if rk, ok := c.unpk[worker][region]; ok {
		return rk, nil
	}
	if len(c.rkeys[region]) == 0 {
		// UCP unpacks an rkey without a length: an empty one would have it
		// parse what lies past the buffer.
		return nil, errorf("rkeyUnpack", ErrInvalidParam, "the peer's region %d has an empty rkey", region)
	}
	buf := C.CBytes(c.rkeys[region])
	defer C.free(buf)
	var rk C.ucp_rkey_h
	if st := C.kvg_rkey_unpack(c.eps[worker], buf, &rk); st != C.UCS_OK {
		return nil, ucsError("rkeyUnpack", st)
	}
	c.unpk[worker][region] = rk
	return rk, nil
}

// failed is the first worker endpoint's failure, if any.
func (c *ucxConn) failed() error {
	for _, e := range c.eps {
		if e != nil {
			if st := C.ucs_status_t(C.kvg_ep_status(e)); st != C.UCS_OK {
				return ucsError("connection", st)
			}
		}
	}
	return nil
}

// abort force-closes the endpoints: every request on them ends (canceled).
func (c *ucxConn) abort() {
	for _, e := range c.eps {
		if e != nil {
			C.kvg_ep_close(e, 1, C.int(epCloseWait.Milliseconds()))
		}
	}
}

func (c *ucxConn) close() {
	for w, e := range c.eps {
		if e == nil {
			continue
		}
		for _, rk := range c.unpk[w] {
			C.kvg_rkey_destroy(rk)
		}
		C.kvg_ep_close(e, cbool(c.b.closeForce), C.int(epCloseWait.Milliseconds()))
		C.kvg_ep_free(e)
	}
	c.eps, c.unpk = nil, nil
}

func (c *ucxConn) genNotif(payload []byte) error {
	e, err := c.ep(0)
	if err != nil {
		return err
	}
	p := C.CBytes(payload)
	defer C.free(p)
	if st := C.kvg_send_notif(e, p, C.size_t(len(payload))); st != C.UCS_OK {
		return ucsError("genNotif", st)
	}
	return nil
}

// ucxXfer is a request on one worker's endpoint to the peer; x is its
// batch while posted.
type ucxXfer struct {
	c       *ucxConn
	worker  int
	op      XferOp
	laddr   []uintptr
	raddr   []uint64
	lens    []uint64
	regions []int
	x       *C.kvg_xfer
}

// prepXfer spreads requests over the workers round-robin; the endpoint and
// rkeys are made on the first post.
func (c *ucxConn) prepXfer(op XferOp, laddr []uintptr, raddr, lens []uint64, regions []int) backendXfer {
	return &ucxXfer{c: c, worker: c.b.pickWorker(), op: op, laddr: laddr, raddr: raddr, lens: lens, regions: regions}
}

// post issues the batch of gets or puts, then the flush and, after it, the
// notification.
func (x *ucxXfer) post(notif []byte) error {
	c, laddr, raddr, lens := x.c, x.laddr, x.raddr, x.lens
	e, err := c.ep(x.worker)
	if err != nil {
		return err
	}
	rkeys := make([]C.ucp_rkey_h, len(x.regions))
	for i, r := range x.regions {
		if rkeys[i], err = c.rkey(x.worker, r); err != nil {
			return err
		}
	}
	var cn unsafe.Pointer
	if notif != nil {
		cn = C.CBytes(notif)
		defer C.free(cn)
	}
	var lp *C.uintptr_t
	var rp, np *C.uint64_t
	var kp *C.ucp_rkey_h
	if len(laddr) > 0 {
		// uintptr and uint64 have the C types' layout on every cgo target.
		lp = (*C.uintptr_t)(unsafe.Pointer(&laddr[0]))
		rp = (*C.uint64_t)(unsafe.Pointer(&raddr[0]))
		np = (*C.uint64_t)(unsafe.Pointer(&lens[0]))
		kp = &rkeys[0]
	}
	x.x = C.kvg_xfer_post(e, C.int(x.op), C.int(len(laddr)), lp, rp, np, kp, cn, C.size_t(len(notif)))
	if x.x == nil {
		return errorf("postXferReq", ErrBackend, "out of memory")
	}
	return nil
}

// check progresses and returns the batch's state: InProg, Success or an error.
func (x *ucxXfer) check(spins int) (Status, error) {
	st := C.kvg_xfer_poll(x.x, C.int(spins))
	switch st {
	case C.UCS_INPROGRESS:
		return InProg, nil
	case C.UCS_OK:
		return Success, nil
	}
	err := ucsError("getXferStatus", st)
	return StatusOf(err), err
}

func (x *ucxXfer) release() {
	if x.x != nil {
		C.kvg_xfer_free(x.x)
		x.x = nil
	}
}

// liveCObjects counts the C objects alive in this process (leak checks).
func liveCObjects() int64 { return int64(C.kvg_live_objects()) }

// waitEvents sleeps until a worker has events or timeout passes. It runs
// without the agent lock (only poll(2) on the event descriptors).
func waitEvents(ws []*C.kvg_worker, timeout time.Duration) {
	if len(ws) == 0 || ws[0].efd < 0 {
		time.Sleep(timeout)
		return
	}
	C.kvg_workers_wait(&ws[0], C.int(len(ws)), C.int(timeout.Milliseconds()))
}
