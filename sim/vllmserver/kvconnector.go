package vllmserver

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/agent/kvblock"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sim/engine"
)

// vLLM's kv_connector names that --kv-transfer-config accepts.
const (
	ConnectorNixl          = "NixlConnector"
	ConnectorSharedStorage = "SharedStorageConnector"
	ConnectorOffloading    = "OffloadingConnector"
)

// defaultP2PTierBytes bounds an OffloadingConnector p2p tier without
// cpu_bytes_to_use.
const defaultP2PTierBytes = 256 << 20

// kvTransferConfig is the part of vLLM's --kv-transfer-config JSON the
// simulator models; any other field is refused by name.
type kvTransferConfig struct {
	Connector string          `json:"kv_connector"`
	Role      string          `json:"kv_role"`
	Extra     json.RawMessage `json:"kv_connector_extra_config"`

	// Decoded from Extra.
	storagePath string // SharedStorageConnector shared_storage_path
	tierBytes   int64  // OffloadingConnector cpu_bytes_to_use
	p2pAddr     string // the p2p secondary tier's host:port
}

// parseKVTransferConfig reads --kv-transfer-config; "" is vLLM's default
// (NixlConnector semantics, as the rest of the simulator speaks).
func parseKVTransferConfig(raw string) (*kvTransferConfig, error) {
	if raw == "" {
		return nil, nil
	}
	c := &kvTransferConfig{}
	if err := strictJSON([]byte(raw), c); err != nil {
		return nil, fmt.Errorf("--kv-transfer-config: %w", err)
	}
	switch c.Role {
	case "", "kv_both", "kv_producer", "kv_consumer":
	default:
		return nil, fmt.Errorf("--kv-transfer-config kv_role %q: want kv_both, kv_producer or kv_consumer", c.Role)
	}
	extra := c.Extra
	if len(extra) == 0 || string(extra) == "null" {
		extra = []byte("{}")
	}
	switch c.Connector {
	case ConnectorNixl:
		if string(extra) != "{}" {
			return nil, errors.New("--kv-transfer-config: the simulator's NixlConnector takes no kv_connector_extra_config")
		}
	case ConnectorSharedStorage:
		var e struct {
			Path *string `json:"shared_storage_path"`
		}
		if err := strictJSON(extra, &e); err != nil {
			return nil, fmt.Errorf("--kv-transfer-config kv_connector_extra_config: %w", err)
		}
		c.storagePath = "/tmp" // vLLM's default
		if e.Path != nil {
			c.storagePath = *e.Path
		}
		if c.storagePath == "" {
			return nil, errors.New("--kv-transfer-config: shared_storage_path is empty")
		}
	case ConnectorOffloading:
		var e struct {
			Spec  string `json:"spec_name"`
			Bytes *int64 `json:"cpu_bytes_to_use"`
			Tiers []struct {
				Type string `json:"type"`
				Host string `json:"host"`
				Port int    `json:"port"`
			} `json:"secondary_tiers"`
		}
		if err := strictJSON(extra, &e); err != nil {
			return nil, fmt.Errorf("--kv-transfer-config kv_connector_extra_config: %w", err)
		}
		if e.Spec != "TieringOffloadingSpec" {
			return nil, fmt.Errorf("--kv-transfer-config spec_name %q: the simulator models TieringOffloadingSpec (a p2p secondary tier) only", e.Spec)
		}
		if len(e.Tiers) != 1 || e.Tiers[0].Type != "p2p" {
			return nil, errors.New(`--kv-transfer-config secondary_tiers: want exactly one {"type": "p2p", "host", "port"}`)
		}
		if e.Tiers[0].Port < 0 || e.Tiers[0].Port > 65535 {
			return nil, fmt.Errorf("--kv-transfer-config secondary_tiers port %d out of range", e.Tiers[0].Port)
		}
		c.p2pAddr = net.JoinHostPort(e.Tiers[0].Host, strconv.Itoa(e.Tiers[0].Port))
		c.tierBytes = defaultP2PTierBytes
		if e.Bytes != nil {
			if *e.Bytes <= 0 {
				return nil, fmt.Errorf("--kv-transfer-config cpu_bytes_to_use %d must be positive", *e.Bytes)
			}
			c.tierBytes = *e.Bytes
		}
	default:
		return nil, fmt.Errorf("--kv-transfer-config kv_connector %q: the simulator models %s, %s and %s", c.Connector,
			ConnectorNixl, ConnectorSharedStorage, ConnectorOffloading)
	}
	return c, nil
}

// strictJSON decodes one JSON object into v, refusing unknown fields.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON object")
	}
	return nil
}

// kvConnector moves a prompt's KV blocks between servers without a node
// agent: SharedStorageConnector's files and OffloadingConnector's p2p
// tier. Each block's bytes are kvblock's content of its hash, so that the
// receiving server checks every byte it loads. load runs before the
// engine sees a request and sets its remote prefill to what arrived;
// store runs when a request's prefill is done, before its answer goes out.
type kvConnector struct {
	s          *Server
	name       string
	blockBytes int
	hasher     *kvhash.Hasher
	policy     string
	timeout    time.Duration

	dir  string   // shared storage
	tier *p2pTier // offloading: this server's p2p tier
	ln   net.Listener
	srv  *http.Server
	// Offloading: the client of a decode leg's pull from the tier its
	// remote_prefiller names (a peer client).
	pull *http.Client

	stats connectorStats
}

type connectorStats struct {
	Loads, LoadedBlocks, LoadedBytes, LoadFailures, VerifyFailures, Stored, ThresholdMisses atomic.Uint64
}

func newKVConnector(s *Server, c *kvTransferConfig, kvBytesPerToken int) (*kvConnector, error) {
	o := &s.opts
	hasher, err := kvhash.New(o.HashSeed, o.BlockSize)
	if err != nil {
		return nil, err
	}
	k := &kvConnector{s: s, name: c.Connector, blockBytes: kvBytesPerToken * o.BlockSize, hasher: hasher,
		policy: o.KVLoadFailurePolicy, timeout: o.KVTransferTimeout}
	switch c.Connector {
	case ConnectorSharedStorage:
		k.dir = c.storagePath
		if err := os.MkdirAll(k.dir, 0o755); err != nil {
			return nil, fmt.Errorf("shared_storage_path: %w", err)
		}
	case ConnectorOffloading:
		k.tier = newP2PTier(max(1, int(c.tierBytes/int64(k.blockBytes))))
		if k.ln, err = net.Listen("tcp", c.p2pAddr); err != nil {
			return nil, fmt.Errorf("p2p tier: listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /kvgate/p2p/{id}", k.serveTier)
		k.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
			BaseContext: func(net.Listener) context.Context { return s.ctx }}
		// The request's context bounds the whole pull too.
		k.pull = newPeerClient(k.timeout)
	}
	return k, nil
}

// P2PAddr is the bound address of the OffloadingConnector p2p tier; nil
// without one.
func (s *Server) P2PAddr() net.Addr {
	if s.kvc == nil || s.kvc.ln == nil {
		return nil
	}
	return s.kvc.ln.Addr()
}

func (k *kvConnector) run() error {
	if k.srv == nil {
		return nil
	}
	if err := k.srv.Serve(k.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func (k *kvConnector) close() {
	if k.srv != nil {
		_ = k.srv.Close()
		_ = k.ln.Close()
		k.pull.CloseIdleConnections()
	}
}

func (k *kvConnector) registerMetrics(reg prometheus.Registerer) error {
	st := &k.stats
	return registerAtomicCounters(reg, prometheus.Labels{"connector": k.name}, []atomicCounter{
		{"kvgate_sim_kv_connector_loads_total", "requests that loaded KV blocks through the connector, every byte checked", &st.Loads},
		{"kvgate_sim_kv_connector_loaded_blocks_total", "KV blocks loaded through the connector", &st.LoadedBlocks},
		{"kvgate_sim_kv_connector_loaded_bytes_total", "KV bytes loaded through the connector and checked", &st.LoadedBytes},
		{"kvgate_sim_kv_connector_load_failures_total", "connector loads that failed (unreachable tier, unreadable file)", &st.LoadFailures},
		{"kvgate_sim_kv_connector_verify_failures_total", "loaded KV blocks whose bytes were wrong", &st.VerifyFailures},
		{"kvgate_sim_kv_connector_stored_blocks_total", "KV blocks written to the shared storage or the p2p tier", &st.Stored},
		{"kvgate_sim_cache_threshold_misses_total", "requests answered finish_reason cache_threshold", &st.ThresholdMisses},
	})
}

// atomicCounter is a Prometheus counter read from an atomic at scrape
// time.
type atomicCounter struct {
	name, help string
	v          *atomic.Uint64
}

func registerAtomicCounters(reg prometheus.Registerer, labels prometheus.Labels, cs []atomicCounter) error {
	for _, m := range cs {
		v := m.v
		c := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: m.name, Help: m.help, ConstLabels: labels},
			func() float64 { return float64(v.Load()) })
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// hashes are the block hashes of j's first n full blocks.
func (k *kvConnector) hashes(j *job, n int) []uint64 {
	full := min(n, len(j.prompt)/k.s.engCfg.BlockSize)
	return k.hasher.AppendUint64s(make([]uint64, 0, full), j.prompt[:full*k.s.engCfg.BlockSize],
		kvhash.Extra{LoRA: j.lora, CacheSalt: j.cacheSalt, MM: j.mm})
}

// load brings in what the connector holds of j's prompt: the shared
// storage's files of its leading blocks, or, for a decode leg naming a
// remote_prefiller, the blocks that prefill leaves in the prefiller's p2p
// tier (waiting for them to land). Every block is checked; a wrong one
// fails the request or, under recompute, ends the load there.
func (k *kvConnector) load(ctx context.Context, j *job) *apiError {
	if j.prefillOnly {
		return nil
	}
	// The last prompt token is always computed, as vLLM's connectors load
	// at most the blocks before it.
	want := k.hashes(j, (len(j.prompt)-1)/k.s.engCfg.BlockSize)
	if len(want) == 0 {
		return nil
	}
	var got int
	var err error
	switch {
	case k.dir != "":
		got, err = k.loadFiles(want)
	case j.kv != nil && j.kv.RemotePrefiller != nil:
		got, err = k.pullTier(ctx, j, want)
	default:
		return nil
	}
	if err != nil {
		k.stats.LoadFailures.Add(1)
		if k.policy == PolicyRecompute {
			k.s.log.Warn("KV load failed; recomputing the prompt", "request", j.id, "connector", k.name, "err", err)
			return nil
		}
		return kvLoadFailed(err)
	}
	if got > 0 {
		k.stats.Loads.Add(1)
		k.stats.LoadedBlocks.Add(uint64(got))
		k.stats.LoadedBytes.Add(uint64(got * k.blockBytes))
		j.remote = &engine.RemotePrefill{Tokens: got * k.s.engCfg.BlockSize}
	}
	return nil
}

// checkBlock verifies one loaded block's bytes against its hash.
func (k *kvConnector) checkBlock(b []byte, h uint64, i int) error {
	if len(b) != k.blockBytes {
		k.stats.VerifyFailures.Add(1)
		return fmt.Errorf("block %d (hash %d): %d bytes, want %d", i, h, len(b), k.blockBytes)
	}
	if at := kvblock.Check(b, h); at >= 0 {
		k.stats.VerifyFailures.Add(1)
		return fmt.Errorf("block %d (hash %d): wrong byte at offset %d", i, h, at)
	}
	return nil
}

// blockFile is where SharedStorageConnector keeps a block: one file per
// block hash, so that prompts sharing a prefix share its files.
func (k *kvConnector) blockFile(h uint64) string {
	return filepath.Join(k.dir, fmt.Sprintf("%016x.kv", h))
}

// loadFiles reads the leading blocks present in the shared storage, up to
// the first one missing.
func (k *kvConnector) loadFiles(want []uint64) (int, error) {
	for i, h := range want {
		b, err := os.ReadFile(k.blockFile(h))
		if errors.Is(err, fs.ErrNotExist) {
			return i, nil
		}
		if err != nil {
			return 0, err
		}
		if err := k.checkBlock(b, h, i); err != nil {
			return 0, err
		}
	}
	return len(want), nil
}

// store writes a finished prefill's full blocks: to the shared storage
// (those not there yet, each file complete before it appears), or, for a
// prefill leg naming a remote_decoder, into this server's p2p tier under
// its kv_request_id.
func (k *kvConnector) store(j *job) {
	hashes := k.hashes(j, len(j.prompt))
	if len(hashes) == 0 {
		return
	}
	switch {
	case k.dir != "":
		buf := make([]byte, k.blockBytes)
		for _, h := range hashes {
			path := k.blockFile(h)
			if _, err := os.Stat(path); err == nil {
				continue
			}
			kvblock.Fill(buf, h)
			if err := writeFileAtomic(path, buf); err != nil {
				k.s.log.Warn("shared storage: block not written; a decoder will recompute it", "path", path, "err", err)
				return
			}
			k.stats.Stored.Add(1)
		}
	case k.tier != nil && j.kv != nil && j.kv.RemoteDecoder != nil && j.kv.RemoteDecoder.KVRequestID != "":
		if len(hashes) > k.tier.cap {
			// Refused before its blocks are made: at the model's real size
			// they are megabytes each.
			k.s.log.Warn("p2p tier: prefill larger than the tier; the decoder will recompute", "kv_request_id", j.kv.RemoteDecoder.KVRequestID, "blocks", len(hashes))
			return
		}
		blocks := make([][]byte, len(hashes))
		for i, h := range hashes {
			blocks[i] = make([]byte, k.blockBytes)
			kvblock.Fill(blocks[i], h)
		}
		k.tier.put(j.kv.RemoteDecoder.KVRequestID, hashes, blocks)
		k.stats.Stored.Add(uint64(len(hashes)))
	}
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// pullTier fetches a prefill's blocks from the remote_prefiller's p2p
// tier: as many leading blocks as match this request's own hashes.
func (k *kvConnector) pullTier(ctx context.Context, j *job, want []uint64) (int, error) {
	rp := j.kv.RemotePrefiller
	if rp.KVRequestID == "" || rp.RemoteHost == "" || rp.RemotePort <= 0 {
		return 0, errors.New("kv_transfer_params.remote_prefiller needs kv_request_id, remote_host and remote_port")
	}
	if err := k.s.peers.check(dialP2PPull, "remote_prefiller.remote_host", rp.RemoteHost); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()
	u := "http://" + net.JoinHostPort(rp.RemoteHost, strconv.Itoa(rp.RemotePort)) + "/kvgate/p2p/" + url.PathEscape(rp.KVRequestID) +
		"?wait_ms=" + strconv.FormatInt(k.timeout.Milliseconds(), 10)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := k.pull.Do(req)
	if err != nil {
		return 0, fmt.Errorf("p2p tier %s: %w", rp.RemoteHost, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("p2p tier %s: %s: %s", rp.RemoteHost, resp.Status, bytes.TrimSpace(msg))
	}
	body := io.LimitReader(resp.Body, int64(len(want))*int64(8+k.blockBytes))
	buf := make([]byte, k.blockBytes)
	var hb [8]byte
	for i, h := range want {
		if _, err := io.ReadFull(body, hb[:]); err != nil {
			if i > 0 && errors.Is(err, io.EOF) {
				return i, nil // the prefill held fewer blocks
			}
			return 0, fmt.Errorf("p2p tier %s: block %d: %w", rp.RemoteHost, i, err)
		}
		if got := binary.BigEndian.Uint64(hb[:]); got != h {
			return i, nil // the prompts part here
		}
		if _, err := io.ReadFull(body, buf); err != nil {
			return 0, fmt.Errorf("p2p tier %s: block %d: %w", rp.RemoteHost, i, err)
		}
		if err := k.checkBlock(buf, h, i); err != nil {
			return 0, err
		}
	}
	return len(want), nil
}

// serveTier is GET /kvgate/p2p/{kv_request_id}?wait_ms=N on the p2p tier's
// port: the request's blocks as (8-byte big-endian hash, block bytes)
// pairs, once its prefill has stored them (waiting up to wait_ms); 404
// when they do not land in time. It stands in for the NIXL transfer a
// real OffloadingConnector p2p tier serves.
func (k *kvConnector) serveTier(w http.ResponseWriter, r *http.Request) {
	wait := k.timeout
	if v := r.URL.Query().Get("wait_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			http.Error(w, "wait_ms: want a non-negative integer", http.StatusBadRequest)
			return
		}
		wait = min(wait, time.Duration(ms)*time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	e, ok := k.tier.get(ctx, r.PathValue("id"))
	if !ok {
		http.Error(w, "no KV landed for this kv_request_id", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(e.hashes)*(8+k.blockBytes)))
	var hb [8]byte
	for i, h := range e.hashes {
		binary.BigEndian.PutUint64(hb[:], h)
		if _, err := w.Write(hb[:]); err != nil {
			return
		}
		if _, err := w.Write(e.blocks[i]); err != nil {
			return
		}
	}
}

// p2pTier is an OffloadingConnector p2p tier: prefills' blocks by
// kv_request_id, bounded in blocks, the oldest dropped first. A decoder
// may ask before the prefill lands; it waits on the entry's ready channel.
type p2pTier struct {
	mu      sync.Mutex
	cap     int
	held    int
	entries map[string]*tierEntry
	order   []string // filled entries, oldest first
}

type tierEntry struct {
	ready   chan struct{}
	waiters int
	hashes  []uint64
	blocks  [][]byte
}

func newP2PTier(capBlocks int) *p2pTier {
	return &p2pTier{cap: capBlocks, entries: map[string]*tierEntry{}}
}

// put files a prefill's blocks, no more than the tier's capacity (the
// caller checks), dropping the oldest prefills to make room.
func (t *p2pTier) put(id string, hashes []uint64, blocks [][]byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	if e != nil && e.hashes != nil {
		return // a retried prefill leg: the first's blocks stand
	}
	for t.held+len(hashes) > t.cap && len(t.order) > 0 {
		old := t.order[0]
		t.order = t.order[1:]
		t.held -= len(t.entries[old].hashes)
		delete(t.entries, old)
	}
	if e == nil {
		e = &tierEntry{ready: make(chan struct{})}
		t.entries[id] = e
	}
	e.hashes, e.blocks = hashes, blocks
	t.held += len(hashes)
	t.order = append(t.order, id)
	close(e.ready)
}

// get waits until id's blocks land or ctx ends. An entry made only by
// waiters goes when its last waiter does, so that asking for ids that
// never land does not grow the map.
func (t *p2pTier) get(ctx context.Context, id string) (*tierEntry, bool) {
	t.mu.Lock()
	e := t.entries[id]
	if e == nil {
		e = &tierEntry{ready: make(chan struct{})}
		t.entries[id] = e
	}
	e.waiters++
	t.mu.Unlock()
	select {
	case <-e.ready:
	case <-ctx.Done():
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e.waiters--
	if e.hashes == nil {
		if e.waiters == 0 && t.entries[id] == e {
			delete(t.entries, id)
		}
		return nil, false
	}
	return e, true
}
