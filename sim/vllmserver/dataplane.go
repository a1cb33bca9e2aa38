package vllmserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/agent/kvblock"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/vllm"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
	"github.com/kvgate/kvgate/sim/engine"
)

// Load-failure policies (vLLM's kv_load_failure_policy).
const (
	PolicyFail      = "fail"
	PolicyRecompute = "recompute"
)

// dpQueue bounds the store/offload work waiting for the agent; beyond it
// work is dropped (counted): a block missing from the region or the CPU
// tier only costs a recompute later.
const dpQueue = 4096

// dataPlane moves this server's KV bytes through its node agent
// (--agent): the shared region stands for the GPU KV memory. Prefill legs
// store their blocks' content under a hold; decode legs have the agent
// READ the prefiller's blocks and verify them before the engine runs; GPU
// evictions offload to the agent's CPU tier and later hits load back;
// remote_kv_source pulls a peer's CPU-tier blocks.
//
// Ownership: the engine's event sink (tee) runs under the runner's lock:
// it updates gpu, the blocks the engine holds (bounded by its block
// count), and only queues agent work, which one worker goroutine does.
// A CPU-tier hit trusts gpu as of the last delivered step: a leading block
// the engine evicts in the step under way would be counted as loaded
// though only the blocks after it were (a one-step window, accepted).
type dataPlane struct {
	s          *Server
	log        *slog.Logger
	agentAddr  string
	engine     string // the region's engine id: new at every start, as vLLM's engine_id
	conn       *grpc.ClientConn
	c          agentv1.KVTransferClient
	blockBytes int
	slots      int
	path       string
	mem        []byte
	// hasher serves every request goroutine (kvhash.Hasher keeps no
	// per-call state; one that reused a buffer, shared, gave legs hashes no
	// engine computes and failed decoders' byte checks on intact bytes).
	hasher  *kvhash.Hasher
	policy  string
	timeout time.Duration
	work    chan []dpWork
	wg      sync.WaitGroup
	// regionMu makes each operation that writes the region and then reads
	// what it wrote (a store and its fills, a pull or a CPU-tier load and
	// its check), and each offload that copies from it, one step: the
	// agent's slot pool reuses unpinned slots LRU first, and a concurrent
	// pull could otherwise take a slot another pull has just filled before
	// its bytes are checked.
	regionMu sync.Mutex

	gpuMu sync.Mutex
	gpu   map[uint64]gpuBlock

	stats dpStats
	nixl  *nixlMetrics // vLLM's NixlConnector metrics; nil until start
}

// nixlMetrics are the vllm:nixl_* series vLLM's NixlConnector exports
// (names, buckets and labels as vllm/distributed/kv_transfer/kv_connector/
// v1/metrics.py; counters with the _total suffix Python's client adds),
// fed by this server's pulls.
type nixlMetrics struct {
	xferTime, postTime, bytes, descs prometheus.Histogram
	failed, expired                  prometheus.Counter
}

func newNIXLMetrics(reg prometheus.Registerer, labels prometheus.Labels) (*nixlMetrics, error) {
	timeBuckets := []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0}
	var byteBuckets []float64
	for i := 1; i < 25; i += 2 {
		byteBuckets = append(byteBuckets, float64(uint64(1)<<(10+i)))
	}
	h := func(name, help string, b []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: labels})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	m := &nixlMetrics{
		xferTime: h("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", timeBuckets[1:]),
		postTime: h("vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers.", timeBuckets),
		bytes:    h("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.", byteBuckets),
		descs: h("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL KV Cache transfers.",
			[]float64{10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000}),
		failed:  c("vllm:nixl_num_failed_transfers_total", "Number of failed NIXL KV Cache transfers."),
		expired: c("vllm:nixl_num_kv_expired_reqs_total", "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance."),
	}
	for _, col := range []prometheus.Collector{m.xferTime, m.postTime, m.bytes, m.descs, m.failed, m.expired} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

type gpuBlock struct {
	parent    uint64
	hasParent bool
	tokens    []int32
	lora      string
}

// dpStats are the data plane's counters.
type dpStats struct {
	Pulls, PulledBytes, PullFailures, VerifyFailures atomic.Uint64
	CPUHits, CPUBlocks, P2PPulls, P2PBlocks          atomic.Uint64
	Offloaded, Stored, Dropped, Released             atomic.Uint64
	Recomputed                                       atomic.Uint64
	// Pending counts the work units queued for the agent and not yet
	// applied: zero once everything the engine did so far reached it.
	Pending atomic.Int64
}

// DataPlaneStats is a snapshot of the data plane's counters.
type DataPlaneStats struct {
	Pulls, PulledBytes, PullFailures, VerifyFailures uint64
	CPUHits, CPUBlocks, P2PPulls, P2PBlocks          uint64
	Offloaded, Stored, Dropped, Released, Recomputed uint64
}

// DataPlaneStats reports the --agent data plane's counters (zero without
// one).
func (s *Server) DataPlaneStats() DataPlaneStats {
	if s.dp == nil {
		return DataPlaneStats{}
	}
	st := &s.dp.stats
	return DataPlaneStats{Pulls: st.Pulls.Load(), PulledBytes: st.PulledBytes.Load(), PullFailures: st.PullFailures.Load(),
		VerifyFailures: st.VerifyFailures.Load(), CPUHits: st.CPUHits.Load(), CPUBlocks: st.CPUBlocks.Load(),
		P2PPulls: st.P2PPulls.Load(), P2PBlocks: st.P2PBlocks.Load(), Offloaded: st.Offloaded.Load(),
		Stored: st.Stored.Load(), Dropped: st.Dropped.Load(), Released: st.Released.Load(), Recomputed: st.Recomputed.Load()}
}

func newDataPlane(s *Server, kvBytesPerToken int) (*dataPlane, error) {
	o := &s.opts
	hasher, err := kvhash.New(o.HashSeed, o.BlockSize)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(o.Agent, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("--agent %q: %w", o.Agent, err)
	}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	d := &dataPlane{s: s, log: s.log.With("component", "kv-data-plane"), agentAddr: o.Agent, conn: conn,
		engine: s.engID + "-" + hex.EncodeToString(nonce[:]),
		c:      agentv1.NewKVTransferClient(conn), blockBytes: kvBytesPerToken * o.BlockSize,
		policy: o.KVLoadFailurePolicy, timeout: o.KVTransferTimeout, work: make(chan []dpWork, dpQueue),
		gpu: map[uint64]gpuBlock{}, hasher: hasher}
	return d, nil
}

// start maps and registers the region (slots from the engine's block
// count, capped by --kv-region-bytes), exports the counters and starts the
// workers.
func (d *dataPlane) start(ctx context.Context, gpuBlocks int) error {
	o := &d.s.opts
	// The region holds the GPU tier's blocks plus room for pulls and loads
	// landing beside them.
	d.slots = min(2*gpuBlocks, max(1, int(o.KVRegionBytes/int64(d.blockBytes))))
	dir := o.KVRegionDir
	if dir == "" {
		dir = "/dev/shm"
	}
	// Named after the server's address, not the engine id: a restarted
	// server reuses the file, and the agent retires the old engine.
	d.path = filepath.Join(dir, "kvgate-"+strings.NewReplacer("/", "_", ":", "_").Replace(d.s.engID)+".kv")
	var err error
	if d.mem, err = kvblock.Map(d.path, d.slots*d.blockBytes); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = d.c.RegisterRegion(rctx, &agentv1.RegisterRegionRequest{EngineId: d.engine, Path: d.path,
		BlockBytes: uint64(d.blockBytes), Slots: uint32(d.slots), KvEventsEndpoint: o.KVOffloadEventsEndpoint, KvEventsTopic: d.s.topic})
	if err != nil {
		kvblock.Unmap(d.mem)
		os.Remove(d.path)
		return fmt.Errorf("register the KV region with agent %s: %w", d.agentAddr, err)
	}
	if err := d.registerMetrics(); err != nil {
		return err
	}
	d.log.Info("KV region registered", "agent", d.agentAddr, "path", d.path, "slots", d.slots, "block_bytes", d.blockBytes)
	d.wg.Add(2)
	go d.worker(ctx)
	go d.watchReleases(ctx)
	return nil
}

func (d *dataPlane) close() {
	d.wg.Wait()
	d.conn.Close()
	if d.mem != nil {
		kvblock.Unmap(d.mem)
		os.Remove(d.path)
	}
}

func (d *dataPlane) slot(s uint32) []byte {
	return d.mem[int(s)*d.blockBytes : (int(s)+1)*d.blockBytes]
}

// tee is the engine's event sink in --agent mode: it forwards to the KV
// events publisher (when there is one), keeps the set of GPU-resident
// blocks exact as of the events delivered, and queues the agent work.
type tee struct {
	next engine.EventSink
	d    *dataPlane
}

// dpWork is one unit of the worker's: content to store, or blocks to
// offload.
type dpWork struct {
	store   []uint64
	offload []*agentv1.OffloadBlock
	lora    string
}

func (t *tee) Publish(events []engine.Event) {
	if t.next != nil {
		t.next.Publish(events)
	}
	d := t.d
	var work []dpWork
	d.gpuMu.Lock()
	for _, ev := range events {
		switch e := ev.(type) {
		case *engine.BlockStored:
			if e.Medium != "" && e.Medium != engine.MediumGPU {
				continue
			}
			parent, has := e.ParentBlockHash, e.HasParent
			for i, h := range e.BlockHashes {
				toks := make([]int32, 0, e.BlockSize)
				for _, tk := range e.TokenIDs[i*e.BlockSize : min((i+1)*e.BlockSize, len(e.TokenIDs))] {
					toks = append(toks, int32(tk))
				}
				d.gpu[h] = gpuBlock{parent: parent, hasParent: has, tokens: toks, lora: e.LoRAName}
				parent, has = h, true
			}
			work = append(work, dpWork{store: append([]uint64(nil), e.BlockHashes...)})
		case *engine.BlockRemoved:
			if e.Medium != engine.MediumGPU {
				continue
			}
			w := dpWork{}
			for _, h := range e.BlockHashes {
				b, ok := d.gpu[h]
				if !ok {
					continue
				}
				delete(d.gpu, h)
				w.offload = append(w.offload, &agentv1.OffloadBlock{Hash: h, ParentHash: b.parent, HasParent: b.hasParent, TokenIds: b.tokens})
				w.lora = b.lora
			}
			if len(w.offload) > 0 {
				work = append(work, w)
			}
		case *engine.AllBlocksCleared:
			clear(d.gpu)
		}
	}
	d.gpuMu.Unlock()
	if len(work) == 0 {
		return
	}
	// Counted before the send: a reader must never see zero while the
	// worker holds work.
	d.stats.Pending.Add(int64(len(work)))
	select {
	case d.work <- work:
	default:
		d.stats.Pending.Add(-int64(len(work)))
		d.stats.Dropped.Add(uint64(len(work)))
	}
}

// worker keeps the region and the CPU tier in step with the engine: blocks
// the engine stores get their content in the region; blocks it evicts go
// to the CPU tier.
func (d *dataPlane) worker(ctx context.Context) {
	defer d.wg.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case ws := <-d.work:
			for _, w := range ws {
				d.apply(ctx, w)
				d.stats.Pending.Add(-1)
			}
		}
	}
}

func (d *dataPlane) apply(ctx context.Context, w dpWork) {
	if len(w.store) > 0 {
		if _, err := d.store(ctx, w.store, nil); err != nil {
			d.log.Debug("store blocks", "err", err)
		}
	}
	if len(w.offload) > 0 {
		// The agent copies the blocks' slots as they are: not while a store
		// is filling one or a pull is landing in one (a block the region
		// had evicted and a new request brought back), or the CPU tier
		// would keep a torn copy under the block's hash.
		d.regionMu.Lock()
		resp, err := d.c.OffloadBlocks(ctx, &agentv1.OffloadBlocksRequest{EngineId: d.engine, Blocks: w.offload,
			BlockSizeTokens: uint32(d.s.engCfg.BlockSize), LoraName: w.lora})
		d.regionMu.Unlock()
		if err != nil {
			d.log.Debug("offload to the CPU tier", "err", err)
			return
		}
		d.stats.Offloaded.Add(uint64(resp.Offloaded))
	}
}

// store writes the content of hashes' blocks into region slots the agent
// assigns (pinned under hold when given) and returns the slots.
func (d *dataPlane) store(ctx context.Context, hashes []uint64, hold *agentv1.Hold) ([]uint32, error) {
	// One store at a time, its fills included: the agent hands a block's
	// slot out fresh once, and a second store of the same hash (a prefill
	// leg's hold while the worker stores the engine's blocks) must not
	// name the slot to a decoder before the first has written its bytes.
	d.regionMu.Lock()
	defer d.regionMu.Unlock()
	resp, err := d.c.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: d.engine, Hashes: hashes, Hold: hold})
	if err != nil {
		return nil, err
	}
	for i, s := range resp.Slots {
		if resp.Fresh[i] {
			kvblock.Fill(d.slot(s), hashes[i])
			d.stats.Stored.Add(1)
		}
	}
	return resp.Slots, nil
}

// watchReleases frees the engine's held prefill blocks when the agent
// released them (the decoder's notification, or lease expiry).
func (d *dataPlane) watchReleases(ctx context.Context) {
	defer d.wg.Done()
	for ctx.Err() == nil {
		stream, err := d.c.WatchReleases(ctx, &agentv1.WatchReleasesRequest{EngineId: d.engine})
		for err == nil {
			var rel *agentv1.Release
			if rel, err = stream.Recv(); err != nil {
				break
			}
			d.stats.Released.Add(1)
			if rel.Expired {
				d.nixl.expired.Inc()
			}
			if rerr := d.s.runner.Release(rel.RequestId); rerr != nil && !errors.Is(rerr, engine.ErrUnknownRequest) {
				d.log.Warn("release held blocks", "request", rel.RequestId, "err", rerr)
			}
		}
		if ctx.Err() == nil {
			d.log.Debug("release stream ended; reconnecting", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

// promptHashes are the hashes of j's full prompt blocks, at most n.
func (d *dataPlane) promptHashes(j *job, n int) []uint64 {
	full := min(n, len(j.prompt)/d.s.engCfg.BlockSize)
	return d.hasher.AppendUint64s(make([]uint64, 0, full), j.prompt[:full*d.s.engCfg.BlockSize], kvhash.Extra{LoRA: j.lora, CacheSalt: j.cacheSalt, MM: j.mm})
}

// prefillParams stores a finished prefill's blocks under a hold and names
// them in NixlConnector's shape; remote_host:remote_port is the agent, the
// side channel a decoder's agent handshakes with.
func (d *dataPlane) prefillParams(j *job) *vllm.KVTransferParams {
	hashes := d.promptHashes(j, len(j.prompt))
	ctx, cancel := context.WithTimeout(d.s.ctx, 10*time.Second)
	defer cancel()
	lease := uint32(min(d.s.opts.HeldBlockTimeout, time.Duration(1<<31)*time.Millisecond).Milliseconds())
	slots, err := d.store(ctx, hashes, &agentv1.Hold{RequestId: j.id, LeaseMs: lease})
	if err != nil {
		d.log.Warn("prefill blocks not stored with the agent; the decoder will recompute", "request", j.id, "err", err)
		return nil
	}
	host, portStr, err := net.SplitHostPort(d.agentAddr)
	if err != nil {
		return nil
	}
	port, _ := strconv.Atoi(portStr)
	ids := make([]int, len(slots))
	for i, s := range slots {
		ids[i] = int(s)
	}
	id, eng, tp := j.id, d.engine, 1
	return &vllm.KVTransferParams{DoRemotePrefill: true, RemoteEngineID: &eng, RemoteBlockIDs: ids,
		RemoteRequestID: &id, RemoteHost: &host, RemotePort: &port, TPSize: &tp}
}

// decodeRanks is the release count of a decode leg's pull: how many
// consumers read the prefill's blocks, each sending one notification, so
// the prefiller's agent frees its hold after that many (NixlConnector's
// "<remote_request_id>:<tp_ratio>", one per decoder rank that reads). This
// server is one rank and pulls a request's blocks once. The prefiller's
// tp_size is not that count: a prefiller naming tp_size 2 had its hold
// wait for a second notification no one sends, until its lease expired.
const decodeRanks = 1

// beforeSubmit loads what j needs before the engine sees it: a decode
// leg's pull from the prefiller, a P2P pull from remote_kv_source, or a
// CPU-tier hit. The time it takes counts in the request's TTFT.
func (d *dataPlane) beforeSubmit(ctx context.Context, j *job) *apiError {
	bs := d.s.engCfg.BlockSize
	kv := j.kv
	switch {
	case kv != nil && kv.DoRemotePrefill:
		if kv.RemoteHost == nil || kv.RemotePort == nil || kv.RemoteEngineID == nil || kv.RemoteRequestID == nil {
			return badRequest("kv_transfer_params: do_remote_prefill needs remote_engine_id, remote_request_id, remote_host and remote_port")
		}
		hashes := d.promptHashes(j, len(kv.RemoteBlockIDs))
		ids := make([]uint32, len(hashes))
		for i := range hashes {
			if kv.RemoteBlockIDs[i] < 0 {
				return badRequest("kv_transfer_params: negative remote block id %d", kv.RemoteBlockIDs[i])
			}
			ids[i] = uint32(kv.RemoteBlockIDs[i])
		}
		got, err := d.pull(ctx, dialNIXLPull, "remote_host", *kv.RemoteHost, *kv.RemotePort, hashes, &agentv1.PullBlocksRequest{Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{
			RemoteEngineId: *kv.RemoteEngineID, RemoteRequestId: *kv.RemoteRequestID, RemoteBlockIds: ids, TpSize: decodeRanks}}})
		if err == nil && got != len(hashes) {
			err = fmt.Errorf("%d of %d blocks arrived", got, len(hashes))
		}
		if err != nil {
			return d.loadFailed(j, err)
		}
		d.stats.Pulls.Add(1)
		j.remote = &engine.RemotePrefill{Tokens: got * bs}
	case kv != nil && kv.RemoteKVSource != nil:
		src := kv.RemoteKVSource
		hashes := d.promptHashes(j, (len(j.prompt)-1)/bs)
		got, err := d.pull(ctx, dialKVSource, "remote_kv_source.remote_host", src.RemoteHost, src.RemotePort, hashes, &agentv1.PullBlocksRequest{Source: &agentv1.PullBlocksRequest_Cpu{Cpu: &agentv1.CPUSource{}}})
		if err != nil {
			return d.loadFailed(j, err)
		}
		d.stats.P2PPulls.Add(1)
		d.stats.P2PBlocks.Add(uint64(got))
		if got > 0 {
			j.remote = &engine.RemotePrefill{Tokens: got * bs}
		}
	case kv == nil && !j.prefillOnly:
		d.cpuHit(ctx, j)
	}
	return nil
}

// pull has the agent READ blocks from the peer agent at host:port into
// the region (req names the source), then checks every block's bytes; it
// returns how many arrived. The request's field named host, so the agent
// is asked only for hosts the peer guard allows (dial is the guard's
// label for it).
func (d *dataPlane) pull(ctx context.Context, dial, field, host string, port int, hashes []uint64, req *agentv1.PullBlocksRequest) (int, error) {
	if err := d.s.peers.check(dial, field, host); err != nil {
		return 0, err
	}
	req.EngineId, req.Peer, req.Hashes, req.TimeoutMs = d.engine, net.JoinHostPort(host, strconv.Itoa(port)), hashes, uint32(d.timeout.Milliseconds())
	d.regionMu.Lock()
	defer d.regionMu.Unlock()
	resp, err := d.c.PullBlocks(ctx, req)
	if err != nil {
		d.stats.PullFailures.Add(1)
		d.nixl.failed.Inc()
		return 0, err
	}
	if len(resp.Slots) > 0 {
		d.nixl.xferTime.Observe(float64(resp.TransferUs) / 1e6)
		d.nixl.postTime.Observe(float64(resp.PostUs) / 1e6)
		d.nixl.bytes.Observe(float64(resp.Bytes))
		d.nixl.descs.Observe(float64(len(resp.Slots)))
	}
	if err := d.verify(resp.Slots, hashes); err != nil {
		return 0, err
	}
	d.stats.PulledBytes.Add(resp.Bytes)
	return len(resp.Slots), nil
}

func (d *dataPlane) verify(slots []uint32, hashes []uint64) error {
	for i, s := range slots {
		if at := kvblock.Check(d.slot(s), hashes[i]); at >= 0 {
			d.stats.VerifyFailures.Add(1)
			return fmt.Errorf("block %d of %d (hash %d, slot %d): content differs at byte %d (%s)", i, len(slots), hashes[i], s, at, blockContent(d.slot(s), hashes))
		}
	}
	return nil
}

// loadFailed applies kv_load_failure_policy to a failed pull.
func (d *dataPlane) loadFailed(j *job, err error) *apiError {
	if d.policy == PolicyRecompute {
		d.log.Warn("KV load failed; recomputing the prompt", "request", j.id, "err", err)
		d.stats.Recomputed.Add(1)
		j.remote = nil
		return nil
	}
	return kvLoadFailed(err)
}

// cpuHit loads the prompt's blocks the engine lacks but the CPU tier has,
// so the engine counts them as pulled rather than recomputing them.
func (d *dataPlane) cpuHit(ctx context.Context, j *job) {
	bs := d.s.engCfg.BlockSize
	hashes := d.promptHashes(j, (len(j.prompt)-1)/bs)
	d.gpuMu.Lock()
	g := 0
	for g < len(hashes) {
		if _, ok := d.gpu[hashes[g]]; !ok {
			break
		}
		g++
	}
	d.gpuMu.Unlock()
	if g == len(hashes) {
		return
	}
	d.regionMu.Lock()
	defer d.regionMu.Unlock()
	resp, err := d.c.LoadBlocks(ctx, &agentv1.LoadBlocksRequest{EngineId: d.engine, Hashes: hashes[g:]})
	if err != nil {
		d.log.Debug("CPU tier lookup", "err", err)
		return
	}
	if len(resp.Slots) == 0 {
		return
	}
	if err := d.verify(resp.Slots, hashes[g:]); err != nil {
		d.log.Warn("CPU tier block corrupt; recomputing", "err", err)
		return
	}
	d.stats.CPUHits.Add(1)
	d.stats.CPUBlocks.Add(uint64(len(resp.Slots)))
	j.remote = &engine.RemotePrefill{Tokens: (g + len(resp.Slots)) * bs}
}

// registerMetrics exports the counters on the server's /metrics.
func (d *dataPlane) registerMetrics() error {
	var err error
	if d.nixl, err = newNIXLMetrics(d.s.reg, prometheus.Labels{"model_name": d.s.models.base[0], "engine": "0"}); err != nil {
		return err
	}
	st := &d.stats
	if err := registerAtomicCounters(d.s.reg, nil, []atomicCounter{
		{"kvgate_sim_kv_pulls_total", "KV pulls from a prefiller's agent that arrived and verified", &st.Pulls},
		{"kvgate_sim_kv_pulled_bytes_total", "KV bytes that arrived by NIXL READ and verified", &st.PulledBytes},
		{"kvgate_sim_kv_pull_failures_total", "KV pulls the agent failed", &st.PullFailures},
		{"kvgate_sim_kv_verify_failures_total", "pulled or loaded KV blocks whose bytes were wrong", &st.VerifyFailures},
		{"kvgate_sim_kv_cpu_hits_total", "requests that loaded blocks from the agent's CPU tier", &st.CPUHits},
		{"kvgate_sim_kv_cpu_hit_blocks_total", "blocks loaded from the CPU tier", &st.CPUBlocks},
		{"kvgate_sim_kv_p2p_pulls_total", "P2P pulls (remote_kv_source) done", &st.P2PPulls},
		{"kvgate_sim_kv_p2p_blocks_total", "blocks pulled from a peer's CPU tier", &st.P2PBlocks},
		{"kvgate_sim_kv_offloaded_blocks_total", "GPU-evicted blocks copied to the CPU tier", &st.Offloaded},
		{"kvgate_sim_kv_stored_blocks_total", "blocks whose content was written into the region", &st.Stored},
		{"kvgate_sim_kv_dropped_events_total", "engine events the data plane dropped (queue full)", &st.Dropped},
		{"kvgate_sim_kv_released_total", "held prefill requests the agent released", &st.Released},
		{"kvgate_sim_kv_recomputed_total", "failed KV loads recomputed (kv_load_failure_policy=recompute)", &st.Recomputed},
	}); err != nil {
		return err
	}
	return d.s.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvgate_sim_kv_pending_work",
		Help: "stores and offloads queued for the agent, not yet done"}, func() float64 { return float64(st.Pending.Load()) }))
}

// blockContent says what a block that failed its check holds instead: zeros
// (bytes that never arrived), another block of the same request
// (misplaced), or something else (a stale or foreign block), so that a
// failure names its cause.
func blockContent(b []byte, hashes []uint64) string {
	zero := 0
	for _, c := range b {
		if c == 0 {
			zero++
		}
	}
	if zero == len(b) {
		return "all zero"
	}
	for j, h := range hashes {
		if kvblock.Check(b, h) < 0 {
			return fmt.Sprintf("holds block %d's content", j)
		}
	}
	if h := kvblock.ContentHash(b); kvblock.Check(b, h) < 0 {
		return fmt.Sprintf("holds the content of hash %d, no block of this request", h)
	}
	return fmt.Sprintf("%d zero bytes, no block's content", zero)
}
