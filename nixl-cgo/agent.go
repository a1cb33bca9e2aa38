package nixl

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
)

// AgentConfig is nixlAgentConfig's subset that applies here.
type AgentConfig struct {
	// ProgressThread runs a goroutine that progresses the workers whenever
	// UCX has events, so that a peer's READs of this agent's memory (which
	// UCX over TCP serves in software) and incoming notifications move
	// without this agent polling. Without it, progress happens only inside
	// GetXferStatus, GetNotifs and Wait.
	ProgressThread bool
	// ProgressDelay bounds the progress goroutine's sleep between event
	// checks (pthr_delay_us); default 50 ms.
	ProgressDelay time.Duration
	// ProgressSpin makes the progress goroutine poll without sleeping on
	// events: the lowest latency for peers' READs, at the price of a busy
	// core (ucx_perftest's server does the same).
	ProgressSpin bool
	// CaptureTelemetry keeps per-request telemetry (capture_telemetry).
	CaptureTelemetry bool
}

// Backend is a created backend (nixlBackendH).
type Backend struct {
	Type   string
	Params Params
	eng    backendEngine
}

// Agent is one process's NIXL agent (nixlAgent).
type Agent struct {
	name string
	cfg  AgentConfig

	mu       sync.Mutex
	closed   bool
	be       *Backend // nil until CreateBackend
	regs     []*registration
	remotes  map[string]*remoteAgent
	notifs   map[string][][]byte
	notified chan struct{} // a value while notifs are held (see Notified)
	inflight map[*XferReq]struct{}
	stats    AgentStats
	cDropped uint64 // the workers' drop count already added to stats

	stop chan struct{}
	wg   sync.WaitGroup
}

type registration struct {
	typ MemType
	d   Desc
	mem backendMem
}

type remoteAgent struct {
	name  string
	md    *agentMD
	blob  []byte
	regs  []regionMD
	conn  backendPeer
	inUse int // requests in progress on conn
}

// NewAgent makes an agent named name (its identity in peers' metadata and
// in notifications).
func NewAgent(name string, cfg AgentConfig) (*Agent, error) {
	if name == "" || len(name) > maxNameLen {
		return nil, errorf("createAgent", ErrInvalidParam, "agent name must have 1..%d bytes", maxNameLen)
	}
	if cfg.ProgressDelay <= 0 {
		cfg.ProgressDelay = 50 * time.Millisecond
	}
	return &Agent{name: name, cfg: cfg, remotes: map[string]*remoteAgent{}, notifs: map[string][][]byte{},
		notified: make(chan struct{}, 1), inflight: map[*XferReq]struct{}{}, stop: make(chan struct{})}, nil
}

// Name is the agent's name.
func (a *Agent) Name() string { return a.name }

// CreateBackend creates a backend by type name (one of AvailablePlugins)
// with its parameters. An agent has one backend: transfers, metadata and
// notifications all go through it.
func (a *Agent) CreateBackend(typ string, params Params) (*Backend, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, errorf("createBackend", ErrNotAllowed, "agent %s is closed", a.name)
	}
	plugin, ok := backendPlugins[typ]
	if !ok {
		return nil, unknownPlugin("createBackend", typ)
	}
	if a.be != nil {
		return nil, errorf("createBackend", ErrNotAllowed, "agent %s already has a %s backend", a.name, a.be.Type)
	}
	eng, err := plugin.create(params, engineOpts{wakeup: a.cfg.ProgressThread && !a.cfg.ProgressSpin})
	if err != nil {
		return nil, err
	}
	be := &Backend{Type: typ, Params: params, eng: eng}
	a.be = be
	if a.cfg.ProgressThread {
		a.wg.Add(1)
		go a.progressLoop(eng)
	}
	return be, nil
}

func (a *Agent) progressLoop(u backendEngine) {
	defer a.wg.Done()
	for {
		select {
		case <-a.stop:
			return
		default:
		}
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return
		}
		// Bounded under the lock: a peer's long READ keeps UCX busy, and
		// this agent's own calls must get in between.
		busy := u.progress(pollSpins)
		a.drainNotifsLocked()
		if busy || a.cfg.ProgressSpin {
			a.mu.Unlock()
			runtime.Gosched()
			continue
		}
		wait := u.armWait()
		a.mu.Unlock()
		if wait != nil {
			wait(a.cfg.ProgressDelay)
		}
	}
}

func (a *Agent) backend(op string) (backendEngine, error) {
	if a.closed {
		return nil, errorf(op, ErrNotAllowed, "agent %s is closed", a.name)
	}
	if a.be == nil {
		return nil, errorf(op, ErrNotFound, "agent %s has no backend; CreateBackend first (available: %s)", a.name, strings.Join(AvailablePlugins(), ", "))
	}
	return a.be.eng, nil
}

// RegisterMem registers each descriptor of the list with the backend, for
// the memory types the backend supports (UCX: DRAM; VRAM only where UCX
// maps CUDA memory).
func (a *Agent) RegisterMem(l DescList) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	u, err := a.backend("registerMem")
	if err != nil {
		return err
	}
	if err := u.supportsMem(l.Type); err != nil {
		return err
	}
	if len(l.Descs) == 0 {
		return errorf("registerMem", ErrInvalidParam, "empty descriptor list")
	}
	var added []*registration
	for i, d := range l.Descs {
		if d.Len == 0 || d.Addr == 0 || d.end() < uint64(d.Addr) {
			err = errorf("registerMem", ErrInvalidParam, "descriptor %d {addr %#x, len %d} is empty or wraps", i, d.Addr, d.Len)
			break
		}
		if r := a.overlapLocked(l.Type, d, added); r != nil {
			err = errorf("registerMem", ErrNotAllowed, "descriptor %d {addr %#x, len %d} overlaps registered {addr %#x, len %d}", i, d.Addr, d.Len, r.d.Addr, r.d.Len)
			break
		}
		var m backendMem
		if m, err = u.registerMem(l.Type, d); err != nil {
			break
		}
		added = append(added, &registration{typ: l.Type, d: d, mem: m})
	}
	if err != nil {
		for _, r := range added {
			u.deregisterMem(r.mem)
		}
		return err
	}
	a.regs = append(a.regs, added...)
	return nil
}

func (a *Agent) overlapLocked(t MemType, d Desc, extra []*registration) *registration {
	for _, set := range [][]*registration{a.regs, extra} {
		for _, r := range set {
			if r.typ == t && r.d.DevID == d.DevID && uint64(d.Addr) < r.d.end() && uint64(r.d.Addr) < d.end() {
				return r
			}
		}
	}
	return nil
}

// DeregisterMem removes registrations; each descriptor must equal one
// registered before. Peers must reload this agent's metadata afterwards.
func (a *Agent) DeregisterMem(l DescList) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	u, err := a.backend("deregisterMem")
	if err != nil {
		return err
	}
	idx := make([]int, 0, len(l.Descs))
	for i, d := range l.Descs {
		j := -1
		for k, r := range a.regs {
			if r.typ == l.Type && r.d == d {
				j = k
			}
		}
		if j < 0 {
			return errorf("deregisterMem", ErrNotFound, "descriptor %d {addr %#x, len %d} is not registered", i, d.Addr, d.Len)
		}
		idx = append(idx, j)
	}
	drop := map[int]bool{}
	for _, j := range idx {
		if !drop[j] {
			u.deregisterMem(a.regs[j].mem)
			drop[j] = true
		}
	}
	kept := a.regs[:0]
	for k, r := range a.regs {
		if !drop[k] {
			kept = append(kept, r)
		}
	}
	a.regs = kept
	return nil
}

// LocalMD is the agent's metadata for peers (getLocalMD): the backend's
// connection info and, per registered region, its public data (UCX: the
// workers' addresses and packed rkeys).
func (a *Agent) LocalMD() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u, err := a.backend("getLocalMD")
	if err != nil {
		return nil, err
	}
	be := backendMD{Type: a.be.Type, Workers: u.connInfo()}
	for _, r := range a.regs {
		be.Regions = append(be.Regions, regionMD{Type: r.typ, Desc: r.d, RKey: r.mem.publicMD()})
	}
	return (&agentMD{Name: a.name, Backends: []backendMD{be}}).encode(), nil
}

// LoadRemoteMD loads a peer's metadata and returns its agent name
// (loadRemoteMD). Loading a name again replaces its metadata, which is
// refused while requests to it are in progress.
func (a *Agent) LoadRemoteMD(blob []byte) (string, error) {
	return a.loadRemoteMD(blob, "")
}

// LoadRemoteMDAs is LoadRemoteMD of the metadata of the peer that calls
// itself name: a blob that carries another name is refused (ErrMismatch)
// before anything is loaded, so that a peer cannot replace what is loaded
// under another agent's name.
func (a *Agent) LoadRemoteMDAs(name string, blob []byte) error {
	if name == "" {
		return errorf("loadRemoteMD", ErrInvalidParam, "an expected agent name is required")
	}
	_, err := a.loadRemoteMD(blob, name)
	return err
}

// loadRemoteMD decodes blob once and loads it; want, when set, is the name
// it must carry.
func (a *Agent) loadRemoteMD(blob []byte, want string) (string, error) {
	md, err := decodeMD(blob)
	if err != nil {
		return "", errorf("loadRemoteMD", ErrInvalidParam, "%v", err)
	}
	if want != "" && md.Name != want {
		return "", errorf("loadRemoteMD", ErrMismatch, "metadata of agent %q, expected %q", md.Name, want)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u, err := a.backend("loadRemoteMD")
	if err != nil {
		return "", err
	}
	if md.Name == a.name {
		return "", errorf("loadRemoteMD", ErrNotAllowed, "metadata is this agent's own (%s)", a.name)
	}
	var be *backendMD
	for i := range md.Backends {
		if md.Backends[i].Type == a.be.Type {
			be = &md.Backends[i]
		}
	}
	if be == nil {
		return "", errorf("loadRemoteMD", ErrMismatch, "agent %s has no %s backend in common", md.Name, a.be.Type)
	}
	// Checked before anything loaded under the name is replaced.
	conn, err := u.loadRemote(be)
	if err != nil {
		return "", errorf("loadRemoteMD", ErrInvalidParam, "agent %s: %v", md.Name, err)
	}
	if old, ok := a.remotes[md.Name]; ok {
		if bytes.Equal(old.blob, blob) && old.conn.failed() == nil {
			return md.Name, nil
		}
		if old.inUse > 0 {
			return "", errorf("loadRemoteMD", ErrNotAllowed, "agent %s has %d requests in progress; release them first", md.Name, old.inUse)
		}
		old.conn.close()
		delete(a.remotes, md.Name)
	}
	a.remotes[md.Name] = &remoteAgent{name: md.Name, md: md, blob: bytes.Clone(blob), regs: be.Regions, conn: conn}
	return md.Name, nil
}

// InvalidateRemoteMD forgets a peer (invalidateRemoteMD) and closes its
// connections; refused while requests to it are in progress.
func (a *Agent) InvalidateRemoteMD(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.remotes[name]
	if !ok {
		return errorf("invalidateRemoteMD", ErrNotFound, "no metadata loaded for agent %q", name)
	}
	if r.inUse > 0 {
		return errorf("invalidateRemoteMD", ErrNotAllowed, "agent %s has %d requests in progress; release them first", name, r.inUse)
	}
	r.conn.close()
	delete(a.remotes, name)
	return nil
}

// RemoteAgents lists the peers whose metadata is loaded.
func (a *Agent) RemoteAgents() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.remotes))
	for n := range a.remotes {
		out = append(out, n)
	}
	return out
}

// PreppedList is a descriptor list resolved against one agent's memory
// (nixlDlistH): local registrations, or a remote agent's regions.
type PreppedList struct {
	agent   string
	remote  *remoteAgent // nil: local
	typ     MemType
	descs   []Desc
	regions []int // index of the region each descriptor lies in
}

// Len is the number of descriptors.
func (p *PreppedList) Len() int { return len(p.descs) }

// PrepXferDlist resolves l against agent's memory: this agent's name for
// local memory, a loaded peer's name for its memory (prepXferDlist). Every
// descriptor must lie inside one registered region.
func (a *Agent) PrepXferDlist(agent string, l DescList) (*PreppedList, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.backend("prepXferDlist"); err != nil {
		return nil, err
	}
	return a.prepLocked(agent, l)
}

func (a *Agent) prepLocked(agent string, l DescList) (*PreppedList, error) {
	p := &PreppedList{agent: agent, typ: l.Type, descs: append([]Desc(nil), l.Descs...), regions: make([]int, len(l.Descs))}
	var find func(Desc) int
	if agent == a.name {
		find = func(d Desc) int {
			for i, r := range a.regs {
				if r.typ == l.Type && r.d.contains(d) {
					return i
				}
			}
			return -1
		}
	} else {
		r, ok := a.remotes[agent]
		if !ok {
			return nil, errorf("prepXferDlist", ErrNotFound, "no metadata loaded for agent %q", agent)
		}
		p.remote = r
		find = func(d Desc) int {
			for i, rg := range r.regs {
				if rg.Type == l.Type && rg.Desc.contains(d) {
					return i
				}
			}
			return -1
		}
	}
	for i, d := range l.Descs {
		if d.Len == 0 {
			return nil, errorf("prepXferDlist", ErrInvalidParam, "descriptor %d has length 0", i)
		}
		if p.regions[i] = find(d); p.regions[i] < 0 {
			return nil, errorf("prepXferDlist", ErrNotFound, "descriptor %d {%s addr %#x, len %d, dev %d} is not in memory registered by agent %s", i, l.Type, d.Addr, d.Len, d.DevID, agent)
		}
	}
	return p, nil
}

// XferReq is a transfer request (nixlXferReqH): made once, posted, polled,
// reposted after completion, released.
type XferReq struct {
	op     XferOp
	remote *remoteAgent
	ndesc  int
	bytes  uint64
	opts   XferOpts

	h        backendXfer
	active   bool // posted and not ended
	status   Status
	err      error
	released bool
	start    time.Time
	postDur  time.Duration
	telem    Telemetry
	hasTelem bool
}

// MakeXferReq builds a request from prepared lists and descriptor indices
// (makeXferReq): local[li[k]] ↔ remote[ri[k]], equal lengths.
func (a *Agent) MakeXferReq(op XferOp, local *PreppedList, li []int, remote *PreppedList, ri []int, opts XferOpts) (*XferReq, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.backend("makeXferReq"); err != nil {
		return nil, err
	}
	return a.makeLocked(op, local, li, remote, ri, opts)
}

func (a *Agent) makeLocked(op XferOp, local *PreppedList, li []int, remote *PreppedList, ri []int, opts XferOpts) (*XferReq, error) {
	const fn = "makeXferReq"
	switch {
	case op != Read && op != Write:
		return nil, errorf(fn, ErrInvalidParam, "unknown operation %d", int(op))
	case local == nil || remote == nil:
		return nil, errorf(fn, ErrInvalidParam, "nil prepared list")
	case local.remote != nil || local.agent != a.name:
		return nil, errorf(fn, ErrInvalidParam, "the local list was prepared for agent %s, not this agent", local.agent)
	case remote.remote == nil:
		return nil, errorf(fn, ErrInvalidParam, "the remote list was prepared for local memory; prepare it with the peer's name")
	case a.remotes[remote.agent] != remote.remote:
		return nil, errorf(fn, ErrNotFound, "agent %s's metadata was reloaded or invalidated since the list was prepared", remote.agent)
	case local.typ != DRAM && local.typ != VRAM:
		return nil, errorf(fn, ErrNotSupported, "local memory type %s", local.typ)
	case len(li) != len(ri):
		return nil, errorf(fn, ErrMismatch, "%d local descriptors for %d remote ones", len(li), len(ri))
	case len(li) == 0:
		return nil, errorf(fn, ErrInvalidParam, "no descriptors")
	case opts.HasNotif && len(opts.NotifMsg) > maxNotif:
		return nil, errorf(fn, ErrInvalidParam, "notification of %d bytes exceeds %d", len(opts.NotifMsg), maxNotif)
	}
	r := &XferReq{op: op, remote: remote.remote, ndesc: len(li), opts: opts, status: ErrNotPosted}
	laddr, raddr, lens, regions := make([]uintptr, len(li)), make([]uint64, len(li)), make([]uint64, len(li)), make([]int, len(li))
	if opts.HasNotif {
		r.opts.NotifMsg = notifPayload(a.name, opts.NotifMsg)
	}
	for k := range li {
		if li[k] < 0 || li[k] >= len(local.descs) || ri[k] < 0 || ri[k] >= len(remote.descs) {
			return nil, errorf(fn, ErrInvalidParam, "index pair %d (%d, %d) out of range (%d local, %d remote)", k, li[k], ri[k], len(local.descs), len(remote.descs))
		}
		ld, rd := local.descs[li[k]], remote.descs[ri[k]]
		if ld.Len != rd.Len {
			return nil, errorf(fn, ErrMismatch, "pair %d: local length %d != remote length %d", k, ld.Len, rd.Len)
		}
		laddr[k], raddr[k], lens[k] = ld.Addr, uint64(rd.Addr), ld.Len
		regions[k] = remote.regions[ri[k]]
		r.bytes += ld.Len
	}
	r.h = remote.remote.conn.prepXfer(op, laddr, raddr, lens, regions)
	return r, nil
}

// CreateXferReq prepares both lists and makes a request over all their
// descriptors in order (createXferReq).
func (a *Agent) CreateXferReq(op XferOp, local, remote DescList, remoteAgent string, opts XferOpts) (*XferReq, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.backend("createXferReq"); err != nil {
		return nil, err
	}
	if len(local.Descs) != len(remote.Descs) {
		return nil, errorf("createXferReq", ErrMismatch, "%d local descriptors for %d remote ones", len(local.Descs), len(remote.Descs))
	}
	if remoteAgent == a.name {
		return nil, errorf("createXferReq", ErrInvalidParam, "the remote agent is this agent")
	}
	lp, err := a.prepLocked(a.name, local)
	if err != nil {
		return nil, err
	}
	rp, err := a.prepLocked(remoteAgent, remote)
	if err != nil {
		return nil, err
	}
	idx := make([]int, len(local.Descs))
	for i := range idx {
		idx[i] = i
	}
	return a.makeLocked(op, lp, idx, rp, idx, opts)
}

// maxNotif bounds a notification message (it travels as one eager active
// message); maxNotifPayload is its wire form's bound, which receivers
// enforce, since a peer need not be this code.
const (
	maxNotif        = 32 << 10
	maxNotifPayload = 2 + maxNameLen + maxNotif
)

// notifPayload is the wire form of a notification: the sender's name
// (u16 length + bytes), then the message.
func notifPayload(sender string, msg []byte) []byte {
	b := binary.LittleEndian.AppendUint16(make([]byte, 0, 2+len(sender)+len(msg)), uint16(len(sender)))
	return append(append(b, sender...), msg...)
}

func parseNotif(p []byte) (string, []byte, bool) {
	if len(p) < 2 {
		return "", nil, false
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n == 0 || n > maxNameLen || len(p) < 2+n || len(p)-2-n > maxNotif {
		return "", nil, false
	}
	return string(p[2 : 2+n]), p[2+n:], true
}

// PostXferReq starts the request (postXferReq): Success when it completed
// at once, InProg otherwise. A completed request may be posted again.
func (a *Agent) PostXferReq(r *XferReq) (Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.backend("postXferReq"); err != nil {
		return ErrNotAllowed, err
	}
	switch {
	case r.released:
		return ErrInvalidParam, errorf("postXferReq", ErrInvalidParam, "request was released")
	case r.active:
		return ErrRepostActive, errorf("postXferReq", ErrRepostActive, "request is still in progress")
	case a.remotes[r.remote.name] != r.remote:
		return ErrNotFound, errorf("postXferReq", ErrNotFound, "agent %s's metadata was reloaded or invalidated", r.remote.name)
	}
	var notif []byte
	if r.opts.HasNotif {
		notif = r.opts.NotifMsg
	}
	r.start = time.Now()
	err := r.h.post(notif)
	r.postDur = time.Since(r.start)
	a.stats.XfersPosted++
	if err != nil {
		r.status, r.err = StatusOf(err), err
		a.stats.XfersFailed++
		return r.status, err
	}
	r.active = true
	r.remote.inUse++
	a.inflight[r] = struct{}{}
	return a.pollLocked(r, 0)
}

// pollLocked advances r (spins rounds of progress at most) and finishes it
// when its batch ended.
func (a *Agent) pollLocked(r *XferReq, spins int) (Status, error) {
	if !r.active {
		return r.status, r.err
	}
	st, err := r.h.check(spins)
	if spins > 0 {
		// Progress may have taken notifications in, and their UCX event
		// with them: the progress goroutine would not wake for them.
		a.drainNotifsLocked()
	}
	if st == InProg {
		r.status, r.err = InProg, nil
		return InProg, nil
	}
	a.finishLocked(r, st, err)
	return r.status, r.err
}

func (a *Agent) finishLocked(r *XferReq, st Status, err error) {
	r.h.release()
	r.active = false
	r.remote.inUse--
	delete(a.inflight, r)
	if err != nil {
		err = fmt.Errorf("transfer %s of %d bytes with agent %s: %w", r.op, r.bytes, r.remote.name, err)
		a.stats.XfersFailed++
	} else {
		a.stats.XfersDone++
		a.stats.BytesDone += r.bytes
		if r.opts.HasNotif {
			a.stats.NotifsSent++
		}
	}
	r.status, r.err = st, err
	if a.cfg.CaptureTelemetry {
		r.telem = Telemetry{StartTimeUS: r.start.UnixMicro(), PostDurationUS: r.postDur.Microseconds(),
			XferDurationUS: time.Since(r.start).Microseconds(), TotalBytes: r.bytes, DescCount: r.ndesc}
		r.hasTelem = true
	}
}

// GetXferStatus progresses the workers and reports the request's state
// (getXferStatus): InProg, Success, or the error that ended it.
func (a *Agent) GetXferStatus(r *XferReq) (Status, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pollLocked(r, 1)
}

// pollSpins is how many rounds of progress one Wait poll makes under the
// lock: enough to amortise the cgo call, short enough to let others in.
const pollSpins = 64

// Wait polls r until it ends or ctx is done. On ctx's end the request is
// still in progress; ReleaseXferReq aborts it.
func (a *Agent) Wait(ctx context.Context, r *XferReq) error {
	for i := 0; ; i++ {
		a.mu.Lock()
		st, err := a.pollLocked(r, pollSpins)
		a.mu.Unlock()
		if st != InProg {
			return err
		}
		if i%16 == 15 {
			if err := ctx.Err(); err != nil {
				return errorf("wait", ErrCanceled, "transfer with agent %s still in progress: %v", r.remote.name, err)
			}
			runtime.Gosched()
		}
	}
}

// ReleaseXferReq frees the request (releaseXferReq). A request still in
// progress is aborted: the endpoints to its peer are force-closed, which
// ends every request in progress to that peer (canceled); the peer's
// metadata must then be loaded again to reconnect.
func (a *Agent) ReleaseXferReq(r *XferReq) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.released {
		return errorf("releaseXferReq", ErrInvalidParam, "request already released")
	}
	if r.active {
		a.abortLocked(r.remote)
	}
	r.released = true
	return nil
}

// abortLocked force-closes the connection to remote and finishes its
// requests in progress.
func (a *Agent) abortLocked(remote *remoteAgent) {
	remote.conn.abort()
	for q := range a.inflight {
		if q.remote != remote {
			continue
		}
		// The forced close completed the flush; poll collects it.
		if st, _ := a.pollLocked(q, pollSpins); st == InProg {
			a.finishLocked(q, ErrCanceled, errorf("releaseXferReq", ErrCanceled, "aborted"))
		}
	}
}

// XferTelemetry is a finished request's telemetry (getXferTelemetry).
func (a *Agent) XferTelemetry(r *XferReq) (Telemetry, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.cfg.CaptureTelemetry {
		return Telemetry{}, errorf("getXferTelemetry", ErrNoTelemetry, "agent %s does not capture telemetry", a.name)
	}
	if !r.hasTelem {
		return Telemetry{}, errorf("getXferTelemetry", ErrNoTelemetry, "request has not finished")
	}
	return r.telem, nil
}

// GenNotif sends msg to a loaded peer as a standalone notification
// (genNotif).
func (a *Agent) GenNotif(remote string, msg []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.backend("genNotif"); err != nil {
		return err
	}
	r, ok := a.remotes[remote]
	if !ok {
		return errorf("genNotif", ErrNotFound, "no metadata loaded for agent %q", remote)
	}
	if len(msg) > maxNotif {
		return errorf("genNotif", ErrInvalidParam, "notification of %d bytes exceeds %d", len(msg), maxNotif)
	}
	if err := r.conn.genNotif(notifPayload(a.name, msg)); err != nil {
		return fmt.Errorf("notification to agent %s: %w", remote, err)
	}
	a.stats.NotifsSent++
	return nil
}

// maxHeldNotifs bounds the notifications kept between GetNotifs calls; older
// ones beyond it are dropped and counted.
const maxHeldNotifs = 1 << 16

func (a *Agent) drainNotifsLocked() {
	held := 0
	for _, l := range a.notifs {
		held += len(l)
	}
	dropped := a.be.eng.getNotifs(func(p []byte) {
		name, msg, ok := parseNotif(p)
		if !ok || held >= maxHeldNotifs {
			a.stats.NotifsDropped++
			return
		}
		a.notifs[name] = append(a.notifs[name], msg)
		a.stats.NotifsReceived++
		held++
		select {
		case a.notified <- struct{}{}:
		default: // one value stands for any number held
		}
	})
	a.stats.NotifsDropped += dropped - a.cDropped
	a.cDropped = dropped
}

// Notified receives a value once notifications are held for GetNotifs
// (one value for any number of them), so that a caller can sleep until one
// arrives instead of polling GetNotifs. Notifications are collected by the
// progress goroutine (AgentConfig.ProgressThread) as they arrive and by
// every call that progresses the workers (GetNotifs, Progress, and polling
// a transfer: GetXferStatus, Wait). A value may stay pending after
// GetNotifs took the notifications it announced: GetNotifs may then return
// none.
func (a *Agent) Notified() <-chan struct{} { return a.notified }

// GetNotifs progresses the workers and returns the notifications received
// since the last call, by sender (getNotifs).
func (a *Agent) GetNotifs() (map[string][][]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u, err := a.backend("getNotifs")
	if err != nil {
		return nil, err
	}
	u.progress(pollSpins)
	a.drainNotifsLocked()
	out := a.notifs
	a.notifs = map[string][][]byte{}
	return out, nil
}

// Progress runs the workers once (for callers without a progress thread
// that serve peers' READs).
func (a *Agent) Progress() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if u, err := a.backend("progress"); err == nil {
		u.progress(pollSpins)
		a.drainNotifsLocked()
	}
}

// Stats are the agent's running totals.
func (a *Agent) Stats() AgentStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Close aborts requests in progress, closes connections, deregisters memory
// and destroys the backend.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	close(a.stop)
	if a.be != nil {
		a.be.eng.signal()
	}
	a.mu.Unlock()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.be == nil {
		return nil
	}
	for _, r := range a.remotes {
		if r.inUse > 0 {
			a.abortLocked(r)
		}
		r.conn.close()
	}
	a.remotes = nil
	u := a.be.eng
	for _, r := range a.regs {
		u.deregisterMem(r.mem)
	}
	a.regs = nil
	u.close()
	a.be = nil
	return nil
}
