package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/agent/kvblock"
	"github.com/kvgate/kvgate/internal/kvwire"
	nixl "github.com/kvgate/kvgate/nixl-cgo"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// Config configures an Agent.
type Config struct {
	// Name is the agent's NIXL name, unique among peers (default: the
	// listen address given to New).
	Name string
	// RegionDir holds every region file a server may register (default
	// DefaultRegionDir); a path outside it is refused.
	RegionDir string
	// CPUBytes sizes the CPU tier (0: none).
	CPUBytes int
	// DefaultLease holds blocks whose hold names no lease (vLLM's
	// kv_lease_duration, 30 s).
	DefaultLease time.Duration
	// PullTimeout bounds a pull whose request names none.
	PullTimeout time.Duration
	// UCX are the UCX backend's parameters (num_workers, device_list, ...).
	UCX    nixl.Params
	Logger *slog.Logger
	// Transfers, when set, is told of every NIXL READ this agent runs
	// (agent/netobs reports them per peer beside the TCP flows).
	Transfers TransferObserver
}

// TransferObserver receives the timing of each NIXL transfer: the peer
// agent's address, the bytes moved and how long the READ took (post to
// completion), or that it failed.
type TransferObserver interface {
	ObserveTransfer(peer string, bytes uint64, d time.Duration, failed bool)
}

const (
	maxRegions  = 64 // registered by live servers
	maxRetired  = 64 // address ranges of gone servers kept mapped (see mapping)
	maxPeers    = 256
	maxHashes   = 1 << 16 // per request
	maxLeases   = 1 << 16 // holds and peers' pins at once
	watchQueue  = 1024
	maxWatchers = 16 // release watches per engine (a server needs one)
)

// Agent is the KV-transfer service. It implements agentv1.KVTransferServer.
type Agent struct {
	agentv1.UnimplementedKVTransferServer
	cfg Config
	log *slog.Logger
	nx  *nixl.Agent
	dir *regionDir

	mu        sync.Mutex
	closed    bool // by Close: the ranges are unmapped, calls are refused
	blockSize int  // bytes per slot, set by the first region
	regions   map[string]*region
	retired   []*mapping // blanked, reusable once no pull writes into them
	cpu       *slotPool
	cpuMem    *nixl.Region
	cpuOwner  map[uint32]string // CPU slot → the engine whose topic announced it
	leases    map[string]*lease
	deadlines leaseHeap   // the leases by deadline
	expiry    *time.Timer // armed for deadlines' head (see leaseHeap)
	peers     map[string]*peer
	peerUses  uint64 // counts pulls per peer lookup, to order peers by last use
	watchers  map[string]map[chan *agentv1.Release]struct{}
	stats     Stats
	leaseSeq  uint64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Stats count what the agent did.
type Stats struct {
	Pulls, PullFailures, PulledBytes uint64
	Offloaded, Loaded, CPUEvicted    uint64
	Released, Expired                uint64
}

type region struct {
	engine string
	path   string      // cleaned
	file   os.FileInfo // the region file, to know it again under another name
	m      *mapping
	mem    []byte // m.mem's first slots × block_bytes
	pool   *slotPool
	pub    *kvwire.Publisher
}

// mapping is an address range of this process that region files are
// mapped into, registered with NIXL as a whole. The agent owns it from the
// RegisterRegion that made it until Close, and never unmaps it before:
// a peer that loaded this agent's metadata may READ any registered address
// at any time, and UCX over TCP serves such a READ in software, from this
// process's memory, so an unmapped (or reused) range would fault the agent
// or leak another region's bytes. When its server is gone the range is
// blanked (private zero pages, the file's pages released) and kept as
// retired; a later registration whose region fits maps its file over the
// range in place, once no pull of this agent is still writing into it. So
// a server restarting on its region file again and again reuses one range.
type mapping struct {
	mem     []byte
	writers int // pulls whose READ lands in the range (under Agent.mu)
}

func (m *mapping) desc() nixl.DescList {
	return nixl.DescList{Type: nixl.DRAM, Descs: []nixl.Desc{{Addr: addr(m.mem), Len: uint64(len(m.mem))}}}
}

// lease pins slots of one pool until released or expired.
type lease struct {
	id       string
	engine   string // "" for a P2P pin of the CPU tier
	pool     *slotPool
	slots    []uint32
	deadline time.Time
	at       int // index in Agent.deadlines
	// consumers is how many release notifications free the lease (the
	// first one's count), notified how many arrived.
	consumers, notified uint64
}

// New starts an agent: NIXL agent, UCX backend, notification loop, lease
// expiry timer.
func New(cfg Config) (*Agent, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("agent: a name is required")
	}
	if cfg.DefaultLease <= 0 {
		cfg.DefaultLease = 30 * time.Second
	}
	if cfg.PullTimeout <= 0 {
		cfg.PullTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RegionDir == "" {
		cfg.RegionDir = DefaultRegionDir
	}
	dir, err := openRegionDir(cfg.RegionDir)
	if err != nil {
		return nil, err
	}
	nx, err := nixl.NewAgent(cfg.Name, nixl.AgentConfig{ProgressThread: true, CaptureTelemetry: true})
	if err != nil {
		dir.close()
		return nil, err
	}
	if _, err := nx.CreateBackend("UCX", cfg.UCX); err != nil {
		nx.Close()
		dir.close()
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("component", "kv-agent"), nx: nx, dir: dir, regions: map[string]*region{},
		cpuOwner: map[uint32]string{}, leases: map[string]*lease{}, peers: map[string]*peer{},
		watchers: map[string]map[chan *agentv1.Release]struct{}{}}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.expiry = time.AfterFunc(math.MaxInt64, a.expire) // armed by the first lease
	a.wg.Add(1)
	go a.notifLoop()
	return a, nil
}

// Close stops the agent and frees its memory. Server regions stay mapped
// by their servers. Calls after it are refused (Unavailable): a handler
// may outlive the gRPC server's Serve, and must not touch unmapped ranges.
func (a *Agent) Close() error {
	a.cancel()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		// Unmapping again could unmap whatever was mapped there since.
		return nil
	}
	a.closed = true
	a.expiry.Stop()
	for _, p := range a.peers {
		p.conn.Close()
	}
	// Closed, NIXL serves no peer's READ any more: the ranges can go.
	err := a.nx.Close()
	for _, r := range a.regions {
		if r.pub != nil {
			r.pub.Close()
		}
		kvblock.Unmap(r.m.mem)
	}
	for _, m := range a.retired {
		kvblock.Unmap(m.mem)
	}
	a.retired = nil
	if a.cpuMem != nil {
		a.cpuMem.Close()
	}
	a.endWatchesLocked()
	return errors.Join(err, a.dir.close())
}

// EndWatches ends the release watches and refuses new ones. A watch lasts
// as long as its model server, so a graceful stop of the gRPC server, which
// waits for every call to end, must end them first.
func (a *Agent) EndWatches() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.endWatchesLocked()
}

func (a *Agent) endWatchesLocked() {
	for _, ws := range a.watchers {
		for ch := range ws {
			close(ch)
		}
	}
	a.watchers = nil
}

// Stats returns the running totals.
func (a *Agent) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// notifLoop applies release notifications as they arrive. It sleeps until
// NIXL announces some (Notified) rather than polling: the agent runs NIXL
// with its progress goroutine, which sleeps on the UCX workers' event
// descriptors and, woken by a peer's message (or a peer's READ, which UCX
// over TCP serves in software), progresses them and collects the
// notifications. So neither notifications nor peers' READs need this loop
// to progress UCX. Leases expire on their own timer (see leaseHeap).
func (a *Agent) notifLoop() {
	defer a.wg.Done()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-a.nx.Notified():
		}
		notifs, err := a.nx.GetNotifs()
		if err != nil {
			a.log.Warn("notifications", "err", err)
			continue
		}
		a.mu.Lock()
		for sender, msgs := range notifs {
			for _, m := range msgs {
				a.notifiedLocked(sender, m)
			}
		}
		a.mu.Unlock()
	}
}

// maxConsumers bounds a release notification's count: no tensor-parallel
// group is larger.
const maxConsumers = 1 << 10

// parseRelease splits a release notification, "<request id>:<count>" split
// at the last colon (vLLM NixlConnector's "<remote_request_id>:<tp size>"):
// count is how many consumers read the request's blocks, each of which
// sends one such notification.
func parseRelease(msg []byte) (id string, count uint64, err error) {
	s := string(msg)
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", 0, fmt.Errorf("no \":<count>\" after the request id")
	}
	count, err = strconv.ParseUint(s[i+1:], 10, 64)
	if err != nil || count == 0 || count > maxConsumers {
		return "", 0, fmt.Errorf("count %q is not a number of consumers in 1..%d", s[i+1:], maxConsumers)
	}
	return s[:i], count, nil
}

// notifiedLocked applies one release notification: the lease it names is
// freed once as many notifications as its count arrived (a decoder with
// tensor-parallel ranks that each pull sends one per rank, all with the
// rank count).
func (a *Agent) notifiedLocked(sender string, msg []byte) {
	id, count, err := parseRelease(msg)
	if err != nil {
		// Not counted: the lease's expiry frees the blocks.
		a.log.Warn("release notification refused", "from", sender, "msg", string(msg), "err", err)
		return
	}
	l, ok := a.leases[id]
	if !ok {
		// vLLM logs and ignores these too: a late notification after
		// expiry, or a duplicate.
		a.log.Debug("notification for no held request", "from", sender, "msg", string(msg))
		return
	}
	if l.consumers == 0 {
		l.consumers = count
	} else if count != l.consumers {
		a.log.Warn("release notifications disagree on the consumer count; keeping the first", "request", id,
			"first", l.consumers, "this", count, "from", sender)
	}
	if l.notified++; l.notified >= l.consumers {
		a.releaseLocked(l, false)
	}
}

func (a *Agent) releaseLocked(l *lease, expired bool) {
	for _, s := range l.slots {
		l.pool.unpin(s)
	}
	a.removeLeaseLocked(l)
	if expired {
		a.stats.Expired++
		a.log.Info("releasing expired KV blocks", "request", l.id, "blocks", len(l.slots))
	} else {
		a.stats.Released++
	}
	if l.engine == "" {
		return
	}
	ev := &agentv1.Release{RequestId: l.id, Expired: expired}
	for ch := range a.watchers[l.engine] {
		select {
		case ch <- ev:
		default:
			a.log.Warn("release watcher queue full; dropping", "engine", l.engine, "request", l.id)
		}
	}
}

// RegisterRegion maps a server's shared region and registers it with NIXL.
func (a *Agent) RegisterRegion(ctx context.Context, req *agentv1.RegisterRegionRequest) (*agentv1.RegisterRegionResponse, error) {
	bb, n := int(req.BlockBytes), int(req.Slots)
	switch {
	case req.EngineId == "":
		return nil, status.Error(codes.InvalidArgument, "engine_id is required")
	case req.Path == "":
		return nil, status.Error(codes.InvalidArgument, "path is required")
	case bb <= 0 || n <= 0 || bb > 1<<30 || n > 1<<24:
		return nil, status.Errorf(codes.InvalidArgument, "block_bytes %d and slots %d must be positive (block ≤ 1 GiB, ≤ 16M slots)", bb, n)
	}
	f, err := a.dir.open(req.Path)
	if err != nil {
		if errors.Is(err, os.ErrClosed) { // the region directory, by Close
			return nil, errClosed
		}
		if errors.Is(err, ErrOutsideRegionDir) {
			return nil, status.Error(codes.PermissionDenied, err.Error())
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	defer f.Close()
	file, err := f.Stat()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "region %s: %v", req.Path, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, errClosed
	}
	if _, ok := a.regions[req.EngineId]; ok {
		return nil, status.Errorf(codes.AlreadyExists, "engine %s already has a region", req.EngineId)
	}
	if a.blockSize != 0 && a.blockSize != bb {
		return nil, status.Errorf(codes.FailedPrecondition, "block_bytes %d differs from this agent's %d (all servers of a node share one KV block size)", bb, a.blockSize)
	}
	path := filepath.Clean(req.Path)
	for _, old := range a.regions {
		if old.path == path || os.SameFile(old.file, file) {
			// A restarted server (new engine id, same file, or a new one
			// where it removed its old one): the old engine is gone.
			a.retireLocked(old)
		}
	}
	if len(a.regions) >= maxRegions {
		return nil, status.Errorf(codes.ResourceExhausted, "%d regions registered already", maxRegions)
	}
	r := &region{engine: req.EngineId, path: path, file: file}
	resp := &agentv1.RegisterRegionResponse{}
	if req.KvEventsEndpoint != "" {
		r.pub, err = kvwire.NewPublisher(a.ctx, kvwire.PublisherConfig{Endpoint: req.KvEventsEndpoint, Topic: req.KvEventsTopic, Logger: a.cfg.Logger})
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "kv events: %v", err)
		}
		if ad := r.pub.Addr(); ad != nil {
			resp.KvEventsAddr = ad.String()
		}
	}
	if r.m, err = a.mapLocked(f, bb*n); err != nil {
		if r.pub != nil {
			r.pub.Close()
		}
		return nil, err
	}
	r.mem = r.m.mem[:bb*n]
	r.pool = newSlotPool(r.mem, bb)
	if a.blockSize == 0 {
		a.blockSize = bb
		if err := a.initCPULocked(); err != nil {
			a.log.Error("CPU tier disabled", "err", err)
		}
	}
	a.regions[req.EngineId] = r
	a.log.Info("region registered", "engine", req.EngineId, "path", req.Path, "block_bytes", bb, "slots", n)
	return resp, nil
}

// mapLocked maps size bytes of the region file f: over the smallest retired
// range that fits and that no pull writes into, else into a new range
// registered with NIXL.
func (a *Agent) mapLocked(f *os.File, size int) (*mapping, error) {
	best := -1
	for i, m := range a.retired {
		if m.writers == 0 && len(m.mem) >= size && (best < 0 || len(m.mem) < len(a.retired[best].mem)) {
			best = i
		}
	}
	if best >= 0 {
		m := a.retired[best]
		if err := kvblock.MapOver(f, m.mem[:size]); err != nil {
			// The range is as it was (mmap failed) or partly the file's:
			// blank it again and keep it retired.
			if berr := kvblock.Blank(m.mem); berr != nil {
				a.log.Error("re-blank retired range", "err", berr)
			}
			return nil, status.Errorf(codes.Internal, "map region: %v", err)
		}
		a.retired = slices.Delete(a.retired, best, best+1)
		return m, nil
	}
	if len(a.retired) >= maxRetired {
		// Unmapping one is no way out (see mapping): only restarting the
		// agent releases them.
		return nil, status.Errorf(codes.ResourceExhausted, "%d address ranges of gone servers are kept mapped and none fits %d bytes (a pull still writes into it, or the server grew its region): restart the agent to release them", len(a.retired), size)
	}
	mem, err := kvblock.MapFile(f, size)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	m := &mapping{mem: mem}
	if err := a.nx.RegisterMem(m.desc()); err != nil {
		kvblock.Unmap(mem)
		return nil, status.Errorf(codes.Internal, "register region: %v", err)
	}
	return m, nil
}

// retireLocked forgets a region whose server is gone. Its range stays
// mapped and registered (see mapping) but is blanked, so that a peer still
// holding the old metadata reads zeros (and fails its content check)
// instead of this process touching freed memory; the shared file's pages
// are released.
func (a *Agent) retireLocked(r *region) {
	for _, l := range a.leases {
		if l.engine == r.engine {
			a.releaseLocked(l, true)
		}
	}
	for ch := range a.watchers[r.engine] {
		close(ch)
	}
	delete(a.watchers, r.engine)
	if r.pub != nil {
		r.pub.Close()
	}
	if err := kvblock.Blank(r.m.mem); err != nil {
		a.log.Error("retire region", "engine", r.engine, "err", err)
	}
	delete(a.regions, r.engine)
	a.retired = append(a.retired, r.m)
	a.log.Info("region retired (its file was registered again)", "engine", r.engine, "path", r.path)
}

func (a *Agent) initCPULocked() error {
	n := a.cfg.CPUBytes / a.blockSize
	if n == 0 {
		return nil
	}
	m, err := nixl.AllocDRAM(n * a.blockSize)
	if err != nil {
		return err
	}
	if err := a.nx.RegisterMem(nixl.DescList{Type: nixl.DRAM, Descs: []nixl.Desc{m.Desc(0, m.Len())}}); err != nil {
		m.Close()
		return err
	}
	a.cpuMem = m
	a.cpu = newSlotPool(m.Bytes(), a.blockSize)
	a.cpu.onEvict = func(slot uint32, h uint64) {
		a.stats.CPUEvicted++
		owner := a.cpuOwner[slot]
		delete(a.cpuOwner, slot)
		if r := a.regions[owner]; r != nil && r.pub != nil {
			a.publish(r, kvwire.BlockRemoved{BlockHashes: []kvwire.Hash{kvwire.Uint64Hash(h)}, Medium: "CPU"})
		}
	}
	return nil
}

func (a *Agent) publish(r *region, evs ...kvwire.Event) {
	b := kvwire.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs}
	if err := r.pub.Publish(b); err != nil {
		a.log.Debug("CPU-tier event not published", "err", err)
	}
}

func (a *Agent) leaseOf(ms uint32) time.Duration {
	if ms == 0 {
		return a.cfg.DefaultLease
	}
	return time.Duration(ms) * time.Millisecond
}

// errClosed refuses a call that reached a closed agent.
var errClosed = status.Error(codes.Unavailable, "agent closed")

func (a *Agent) regionLocked(engine string) (*region, error) {
	if a.closed {
		return nil, errClosed
	}
	r, ok := a.regions[engine]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no region registered for engine %q", engine)
	}
	return r, nil
}

// leaseRoomLocked refuses a new lease past maxLeases: a lease lasts up to
// its lease_ms (49 days at most) unless released.
func (a *Agent) leaseRoomLocked() error {
	if len(a.leases) >= maxLeases {
		return status.Errorf(codes.ResourceExhausted, "%d leases held already", maxLeases)
	}
	return nil
}

func checkHashes(h []uint64) error {
	if len(h) > maxHashes {
		return status.Errorf(codes.InvalidArgument, "%d blocks exceed %d per request", len(h), maxHashes)
	}
	return nil
}

// StoreBlocks gives each hash a slot of the engine's region, pinned under
// the hold when one is named.
func (a *Agent) StoreBlocks(ctx context.Context, req *agentv1.StoreBlocksRequest) (*agentv1.StoreBlocksResponse, error) {
	if err := checkHashes(req.Hashes); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.regionLocked(req.EngineId)
	if err != nil {
		return nil, err
	}
	if h := req.Hold; h != nil {
		if h.RequestId == "" {
			return nil, status.Error(codes.InvalidArgument, "hold.request_id is required")
		}
		if _, ok := a.leases[h.RequestId]; ok {
			return nil, status.Errorf(codes.AlreadyExists, "request %s already holds blocks", h.RequestId)
		}
		if err := a.leaseRoomLocked(); err != nil {
			return nil, err
		}
	}
	resp := &agentv1.StoreBlocksResponse{}
	for _, h := range req.Hashes {
		s, fresh, err := r.pool.acquire(h)
		if err != nil {
			// The caller gets the error: nothing writes these slots.
			r.pool.giveBack(resp.Slots, resp.Fresh)
			return nil, status.Errorf(codes.ResourceExhausted, "engine %s region: %v (%d slots)", req.EngineId, err, r.pool.slots())
		}
		resp.Slots = append(resp.Slots, s)
		resp.Fresh = append(resp.Fresh, fresh)
	}
	if h := req.Hold; h != nil {
		a.addLeaseLocked(&lease{id: h.RequestId, engine: req.EngineId, pool: r.pool, slots: resp.Slots,
			deadline: time.Now().Add(a.leaseOf(h.LeaseMs))})
	} else {
		for _, s := range resp.Slots {
			r.pool.unpin(s)
		}
	}
	return resp, nil
}

// WatchReleases streams the engine's released holds.
func (a *Agent) WatchReleases(req *agentv1.WatchReleasesRequest, stream agentv1.KVTransfer_WatchReleasesServer) error {
	ch := make(chan *agentv1.Release, watchQueue)
	a.mu.Lock()
	if _, err := a.regionLocked(req.EngineId); err != nil {
		a.mu.Unlock()
		return err
	}
	if a.watchers == nil {
		a.mu.Unlock()
		return status.Error(codes.Unavailable, "agent closing")
	}
	if len(a.watchers[req.EngineId]) >= maxWatchers {
		a.mu.Unlock()
		return status.Errorf(codes.ResourceExhausted, "engine %s has %d release watches already", req.EngineId, maxWatchers)
	}
	if a.watchers[req.EngineId] == nil {
		a.watchers[req.EngineId] = map[chan *agentv1.Release]struct{}{}
	}
	a.watchers[req.EngineId][ch] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if a.watchers != nil {
			delete(a.watchers[req.EngineId], ch)
		}
		a.mu.Unlock()
	}()
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-a.ctx.Done():
			return nil
		case ev, ok := <-ch:
			if !ok {
				return nil
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}

// GetMetadata is the peers' handshake: NIXL metadata and the layout of
// every registered area.
func (a *Agent) GetMetadata(ctx context.Context, _ *agentv1.GetMetadataRequest) (*agentv1.GetMetadataResponse, error) {
	// Under a.mu, which every registration holds: metadata taken before
	// it could miss a region the list below names, and a peer would fail
	// every READ of that region without handshaking again.
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, errClosed
	}
	md, err := a.nx.LocalMD()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	resp := &agentv1.GetMetadataResponse{AgentName: a.nx.Name(), NixlMetadata: md, BlockBytes: uint64(a.blockSize)}
	for _, r := range a.regions {
		resp.Regions = append(resp.Regions, &agentv1.RegionInfo{EngineId: r.engine, BaseAddr: uint64(addr(r.mem)), Slots: uint32(r.pool.slots())})
	}
	if a.cpu != nil {
		resp.CpuTier = &agentv1.RegionInfo{BaseAddr: uint64(a.cpuMem.Addr()), Slots: uint32(a.cpu.slots())}
	}
	return resp, nil
}

// PinBlocks pins the leading hashes present in the CPU tier for a peer's
// pull.
func (a *Agent) PinBlocks(ctx context.Context, req *agentv1.PinBlocksRequest) (*agentv1.PinBlocksResponse, error) {
	if err := checkHashes(req.Hashes); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, errClosed // the CPU tier is unmapped
	}
	a.leaseSeq++
	resp := &agentv1.PinBlocksResponse{LeaseId: "p2p-" + a.cfg.Name + "-" + strconv.FormatUint(a.leaseSeq, 10)}
	if a.cpu == nil {
		return resp, nil
	}
	if err := a.leaseRoomLocked(); err != nil {
		return nil, err
	}
	for _, h := range req.Hashes {
		s, ok := a.cpu.lookup(h)
		if !ok {
			break
		}
		a.cpu.pin(s)
		resp.Slots = append(resp.Slots, s)
	}
	if len(resp.Slots) > 0 {
		a.addLeaseLocked(&lease{id: resp.LeaseId, pool: a.cpu, slots: resp.Slots, deadline: time.Now().Add(a.leaseOf(req.LeaseMs))})
	}
	return resp, nil
}

// OffloadBlocks copies blocks of the engine's region into the CPU tier and
// announces them with medium "CPU".
func (a *Agent) OffloadBlocks(ctx context.Context, req *agentv1.OffloadBlocksRequest) (*agentv1.OffloadBlocksResponse, error) {
	if len(req.Blocks) > maxHashes {
		return nil, status.Errorf(codes.InvalidArgument, "%d blocks exceed %d per request", len(req.Blocks), maxHashes)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.regionLocked(req.EngineId)
	if err != nil {
		return nil, err
	}
	if a.cpu == nil {
		return nil, status.Error(codes.FailedPrecondition, "this agent has no CPU tier (--cpu-bytes)")
	}
	resp := &agentv1.OffloadBlocksResponse{}
	var stored []kvwire.Event
	for _, b := range req.Blocks {
		src, ok := r.pool.lookup(b.Hash)
		if !ok {
			continue
		}
		dst, fresh, err := a.cpu.acquire(b.Hash)
		if err != nil {
			break // the tier is pinned full: the rest is not offloaded
		}
		if fresh {
			copy(a.cpu.bytes(dst), r.pool.bytes(src))
			a.cpuOwner[dst] = req.EngineId
			ev := kvwire.BlockStored{BlockHashes: []kvwire.Hash{kvwire.Uint64Hash(b.Hash)}, BlockSize: int(req.BlockSizeTokens),
				Medium: "CPU", LoRAName: req.LoraName}
			for _, t := range b.TokenIds {
				ev.TokenIDs = append(ev.TokenIDs, int(t))
			}
			if b.HasParent {
				p := kvwire.Uint64Hash(b.ParentHash)
				ev.ParentBlockHash = &p
			}
			stored = append(stored, ev)
		}
		a.cpu.unpin(dst)
		resp.Offloaded++
	}
	a.stats.Offloaded += uint64(resp.Offloaded)
	if len(stored) > 0 && r.pub != nil {
		a.publish(r, stored...)
	}
	return resp, nil
}

// LoadBlocks copies the leading hashes present in the CPU tier into the
// engine's region.
func (a *Agent) LoadBlocks(ctx context.Context, req *agentv1.LoadBlocksRequest) (*agentv1.LoadBlocksResponse, error) {
	if err := checkHashes(req.Hashes); err != nil {
		return nil, err
	}
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := a.regionLocked(req.EngineId)
	if err != nil {
		return nil, err
	}
	resp := &agentv1.LoadBlocksResponse{}
	if a.cpu == nil {
		return resp, nil
	}
	for _, h := range req.Hashes {
		src, ok := a.cpu.lookup(h)
		if !ok {
			break
		}
		dst, fresh, err := r.pool.acquire(h)
		if err != nil {
			break
		}
		if fresh {
			copy(r.pool.bytes(dst), a.cpu.bytes(src))
		}
		r.pool.unpin(dst)
		resp.Slots = append(resp.Slots, dst)
	}
	a.stats.Loaded += uint64(len(resp.Slots))
	resp.CopyUs = uint64(time.Since(start).Microseconds())
	return resp, nil
}
