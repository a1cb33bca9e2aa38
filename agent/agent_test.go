package agent

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/agent/kvblock"
	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/zmtp"
	"github.com/kvgate/kvgate/internal/zmtp/zmtptest"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

func TestMain(m *testing.M) {
	if os.Getenv("UCX_NET_DEVICES") == "" {
		os.Setenv("UCX_NET_DEVICES", "lo")
	}
	if os.Getenv("UCX_TLS") == "" {
		os.Setenv("UCX_TLS", "tcp")
	}
	os.Exit(m.Run())
}

const blockBytes = 8 << 10

// node is an agent serving gRPC on loopback plus a client to it.
type node struct {
	a      *Agent
	addr   string
	dir    string // its region directory
	client agentv1.KVTransferClient
}

func newNode(t testing.TB, name string, cpuBytes int) *node {
	t.Helper()
	return newNodeWith(t, Config{Name: name, CPUBytes: cpuBytes, PullTimeout: 10 * time.Second})
}

func newNodeWith(t testing.TB, cfg Config) *node {
	t.Helper()
	if cfg.RegionDir == "" {
		cfg.RegionDir = t.TempDir()
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	addr := serveKV(t, a)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &node{a: a, addr: addr, dir: cfg.RegionDir, client: agentv1.NewKVTransferClient(conn)}
}

// serveKV serves s on a loopback port until the test ends and returns its
// address.
func serveKV(t testing.TB, s agentv1.KVTransferServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterKVTransferServer(srv, s)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// region registers a fresh region file for engine and returns the
// server's own mapping of it.
func (n *node) region(t testing.TB, engine string, bb, slots int, events string) []byte {
	t.Helper()
	path := n.dir + "/" + engine
	mem, err := kvblock.Map(path, bb*slots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kvblock.Unmap(mem) })
	if _, err := n.client.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: engine, Path: path,
		BlockBytes: uint64(bb), Slots: uint32(slots), KvEventsEndpoint: events, KvEventsTopic: "kv@" + engine + "@m"}); err != nil {
		t.Fatal(err)
	}
	return mem
}

func slot(mem []byte, s uint32) []byte { return mem[int(s)*blockBytes : (int(s)+1)*blockBytes] }

func codeOf(err error) codes.Code { return status.Code(err) }

func TestPrefillDecodePull(t *testing.T) {
	p, d := newNode(t, "p", 0), newNode(t, "d", 0)
	pmem := p.region(t, "P", blockBytes, 16, "")
	dmem := d.region(t, "D", blockBytes, 16, "")
	ctx := t.Context()
	watch, err := p.client.WatchReleases(ctx, &agentv1.WatchReleasesRequest{EngineId: "P"})
	if err != nil {
		t.Fatal(err)
	}
	hashes := []uint64{101, 102, 103, 104}
	st, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: hashes,
		Hold: &agentv1.Hold{RequestId: "req-1", LeaseMs: 60000}})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st.Slots {
		if !st.Fresh[i] {
			t.Fatalf("slot %d not fresh", i)
		}
		kvblock.Fill(slot(pmem, s), hashes[i])
	}
	// Pressure on P's region must not evict the held blocks.
	for h := uint64(1000); h < 1030; h++ {
		if _, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: []uint64{h}}); err != nil {
			t.Fatal(err)
		}
	}
	pull, err := d.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: hashes,
		Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P",
			RemoteRequestId: "req-1", RemoteBlockIds: st.Slots, TpSize: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if pull.Bytes != uint64(len(hashes)*blockBytes) || len(pull.Slots) != len(hashes) {
		t.Fatalf("pull %+v", pull)
	}
	for i, s := range pull.Slots {
		if at := kvblock.Check(slot(dmem, s), hashes[i]); at >= 0 {
			t.Fatalf("block %d differs at byte %d", i, at)
		}
	}
	rel, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if rel.RequestId != "req-1" || rel.Expired {
		t.Fatalf("release %+v", rel)
	}
	if s := p.a.Stats(); s.Released != 1 || s.Expired != 0 {
		t.Fatalf("prefill stats %+v", s)
	}
	// Unpinned now: pressure reuses the slots.
	p.a.mu.Lock()
	pinned := p.a.regions["P"].pool.pinnedCount()
	p.a.mu.Unlock()
	if pinned != 0 {
		t.Fatalf("%d slots still pinned after the notification", pinned)
	}
}

func TestLeaseExpiry(t *testing.T) {
	p := newNode(t, "p", 0)
	p.region(t, "P", blockBytes, 4, "")
	ctx := t.Context()
	watch, err := p.client.WatchReleases(ctx, &agentv1.WatchReleasesRequest{EngineId: "P"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: []uint64{1, 2, 3},
		Hold: &agentv1.Hold{RequestId: "r", LeaseMs: 30}}); err != nil {
		t.Fatal(err)
	}
	// Held: a fourth and fifth block do not fit beside them.
	if _, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: []uint64{4, 5},
		Hold: &agentv1.Hold{RequestId: "r2", LeaseMs: 30}}); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("pool full: %v", err)
	}
	rel, err := watch.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if rel.RequestId != "r" || !rel.Expired {
		t.Fatalf("release %+v", rel)
	}
	resp, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: []uint64{4, 5, 6, 7}})
	if err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	// Block 4 got a slot in the refused store, whose caller never wrote
	// it: it is fresh again, or a decoder would read a stale slot as it.
	if !resp.Fresh[0] {
		t.Fatal("block 4 of the refused store stayed mapped to an unwritten slot")
	}
}

func TestCPUTierAndP2P(t *testing.T) {
	sub := make(chan zmtp.Msg, 64)
	srv, err := zmtp.Listen(t.Context(), "tcp://127.0.0.1:*", zmtp.ServerConfig{HandshakeConfig: zmtp.HandshakeConfig{Type: zmtp.SUB}}, zmtptest.Subscriber(sub, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	src, dst := newNode(t, "src", 4*blockBytes), newNode(t, "dst", 4*blockBytes)
	smem := src.region(t, "S", blockBytes, 8, "tcp://"+srv.Addr().String())
	dmem := dst.region(t, "T", blockBytes, 8, "")
	ctx := t.Context()
	hashes := []uint64{11, 12, 13}
	st, err := src.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "S", Hashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range st.Slots {
		kvblock.Fill(slot(smem, s), hashes[i])
	}
	// A PUB socket drops what it publishes before a subscription arrived.
	waitSubscribed(t, src.a, "S")
	var blocks []*agentv1.OffloadBlock
	for i, h := range hashes {
		b := &agentv1.OffloadBlock{Hash: h, TokenIds: []int32{int32(i)}}
		if i > 0 {
			b.ParentHash, b.HasParent = hashes[i-1], true
		}
		blocks = append(blocks, b)
	}
	off, err := src.client.OffloadBlocks(ctx, &agentv1.OffloadBlocksRequest{EngineId: "S", Blocks: blocks, BlockSizeTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if off.Offloaded != 3 {
		t.Fatalf("offloaded %d", off.Offloaded)
	}
	msg, err := recvTimeout(sub, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	batch, _, err := kvwire.Decode(msg.Frames[2])
	if err != nil {
		t.Fatal(err)
	}
	if len(batch.Events) != 3 {
		t.Fatalf("events %+v", batch.Events)
	}
	for i, ev := range batch.Events {
		bs, ok := ev.(kvwire.BlockStored)
		if !ok || bs.Medium != "CPU" || bs.BlockHashes[0].Key() != hashes[i] {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	// The GPU copy is overwritten; a load restores it from the CPU tier.
	for _, s := range st.Slots {
		clear(slot(smem, s))
	}
	ld, err := src.client.LoadBlocks(ctx, &agentv1.LoadBlocksRequest{EngineId: "S", Hashes: append(hashes, 99)})
	if err != nil {
		t.Fatal(err)
	}
	if len(ld.Slots) != 3 {
		t.Fatalf("loaded %d blocks, want the 3 leading ones", len(ld.Slots))
	}
	// LoadBlocks reuses the region slot still mapped to the hash (its bytes
	// were cleared behind the agent's back here), so write them back.
	for i, s := range ld.Slots {
		if s != st.Slots[i] {
			t.Fatalf("loaded into slot %d, the hash's slot is %d", s, st.Slots[i])
		}
	}
	// P2P: dst pulls the leading CPU-tier blocks of src.
	pull, err := dst.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "T", Peer: src.addr,
		Hashes: append(hashes, 77), Source: &agentv1.PullBlocksRequest_Cpu{Cpu: &agentv1.CPUSource{}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(pull.Slots) != 3 {
		t.Fatalf("pulled %d blocks", len(pull.Slots))
	}
	for i, s := range pull.Slots {
		if at := kvblock.Check(slot(dmem, s), hashes[i]); at >= 0 {
			t.Fatalf("P2P block %d differs at %d", i, at)
		}
	}
	// The pin is released by the pull's notification.
	deadline := time.Now().Add(5 * time.Second)
	for src.a.Stats().Released == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s := src.a.Stats(); s.Released != 1 {
		t.Fatalf("source stats %+v", s)
	}
	// Evicting from the full CPU tier announces BlockRemoved.
	more := []*agentv1.OffloadBlock{}
	st2, _ := src.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "S", Hashes: []uint64{21, 22}})
	for i, h := range []uint64{21, 22} {
		kvblock.Fill(slot(smem, st2.Slots[i]), h)
		more = append(more, &agentv1.OffloadBlock{Hash: h})
	}
	if _, err := src.client.OffloadBlocks(ctx, &agentv1.OffloadBlocksRequest{EngineId: "S", Blocks: more}); err != nil {
		t.Fatal(err)
	}
	sawRemoved := false
	for !sawRemoved {
		msg, err := recvTimeout(sub, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		b, _, _ := kvwire.Decode(msg.Frames[2])
		for _, ev := range b.Events {
			if r, ok := ev.(kvwire.BlockRemoved); ok && r.Medium == "CPU" {
				sawRemoved = true
			}
		}
	}
}

// waitSubscribed waits until the KV-event publisher of engine's region
// has a subscriber.
func waitSubscribed(t *testing.T, a *Agent, engine string) {
	t.Helper()
	testutil.WaitFor(t, "a subscriber of "+engine+"'s KV-event publisher", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		r := a.regions[engine]
		return r != nil && r.pub != nil && r.pub.Subscribers() > 0
	})
}

func recvTimeout(s <-chan zmtp.Msg, d time.Duration) (zmtp.Msg, error) {
	select {
	case m := <-s:
		return m, nil
	case <-time.After(d):
		return zmtp.Msg{}, fmt.Errorf("no KV event within %v", d)
	}
}

func TestPullErrors(t *testing.T) {
	p, d := newNode(t, "p", 0), newNode(t, "d", 0)
	p.region(t, "P", blockBytes, 4, "")
	d.region(t, "D", blockBytes, 4, "")
	other := newNode(t, "o", 0)
	other.region(t, "O", 2*blockBytes, 4, "")
	ctx := t.Context()
	pd := func(engine string, ids ...uint32) *agentv1.PullBlocksRequest_Prefill {
		return &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: engine, RemoteRequestId: "x", RemoteBlockIds: ids}}
	}
	deadAddr := testutil.RefusedAddr(t)
	for _, tc := range []struct {
		name string
		req  *agentv1.PullBlocksRequest
		want codes.Code
	}{
		{"unknown local engine", &agentv1.PullBlocksRequest{EngineId: "nope", Peer: p.addr, Hashes: []uint64{1}, Source: pd("P", 0)}, codes.NotFound},
		{"unknown remote engine", &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{1}, Source: pd("Q", 0)}, codes.NotFound},
		{"remote block out of range", &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{1}, Source: pd("P", 9)}, codes.InvalidArgument},
		{"count mismatch", &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{1, 2}, Source: pd("P", 0)}, codes.InvalidArgument},
		{"mismatched block size", &agentv1.PullBlocksRequest{EngineId: "D", Peer: other.addr, Hashes: []uint64{1}, Source: pd("O", 0)}, codes.FailedPrecondition},
		{"peer down", &agentv1.PullBlocksRequest{EngineId: "D", Peer: deadAddr, Hashes: []uint64{1}, Source: pd("P", 0), TimeoutMs: 2000}, codes.Unavailable},
		{"no source", &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{1}}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.client.PullBlocks(ctx, tc.req)
			if codeOf(err) != tc.want {
				t.Fatalf("got %v, want %s", err, tc.want)
			}
		})
	}
	// A second region of another block size on one agent.
	path := d.dir + "/r"
	if _, err := d.client.RegisterRegion(ctx, &agentv1.RegisterRegionRequest{EngineId: "D2", Path: path, BlockBytes: 4096, Slots: 4}); codeOf(err) != codes.FailedPrecondition {
		t.Fatalf("mismatched region block size: %v", err)
	}
	if _, err := d.client.RegisterRegion(ctx, &agentv1.RegisterRegionRequest{EngineId: "D", Path: path, BlockBytes: blockBytes, Slots: 4}); codeOf(err) != codes.AlreadyExists {
		t.Fatalf("duplicate region: %v", err)
	}
}

// A server restarting on the same region file (new engine id) retires the
// old engine; a peer that handshook before a region existed fetches the
// metadata again.
func TestRestartedServerAndLateRegion(t *testing.T) {
	p, d := newNode(t, "p", 0), newNode(t, "d", 0)
	d.region(t, "D", blockBytes, 8, "")
	ctx := t.Context()
	path := p.dir + "/srv"
	mem, err := kvblock.Map(path, 8*blockBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer kvblock.Unmap(mem)
	reg := func(engine string) {
		t.Helper()
		if _, err := p.client.RegisterRegion(ctx, &agentv1.RegisterRegionRequest{EngineId: engine, Path: path, BlockBytes: blockBytes, Slots: 8}); err != nil {
			t.Fatal(err)
		}
	}
	reg("P-1")
	// d handshakes with p now (P-1 exists, P-2 not yet).
	if _, err := d.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{1},
		Source: &agentv1.PullBlocksRequest_Cpu{Cpu: &agentv1.CPUSource{}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P-1", Hashes: []uint64{5}, Hold: &agentv1.Hold{RequestId: "old"}}); err != nil {
		t.Fatal(err)
	}
	reg("P-2") // the restart
	if _, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P-1", Hashes: []uint64{6}}); codeOf(err) != codes.NotFound {
		t.Fatalf("retired engine still answers: %v", err)
	}
	if s := p.a.Stats(); s.Expired != 1 {
		t.Fatalf("the retired engine's hold was not released: %+v", s)
	}
	mem2, err := kvblock.Map(path, 8*blockBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer kvblock.Unmap(mem2)
	st, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P-2", Hashes: []uint64{7}, Hold: &agentv1.Hold{RequestId: "new"}})
	if err != nil {
		t.Fatal(err)
	}
	kvblock.Fill(mem2[int(st.Slots[0])*blockBytes:][:blockBytes], 7)
	pull, err := d.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: []uint64{7},
		Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P-2", RemoteRequestId: "new", RemoteBlockIds: st.Slots}}})
	if err != nil {
		t.Fatalf("pull from a region registered after the handshake: %v", err)
	}
	if len(pull.Slots) != 1 {
		t.Fatalf("pull %+v", pull)
	}
}

// TestLeasesBounded: every hold and every peer's pin is a lease until it is
// released or expires, and a lease may last 49 days (lease_ms is a uint32):
// the map of them had no bound, so a caller could grow it, and pin the
// blocks it names, without end. Past maxLeases new ones are refused.
func TestLeasesBounded(t *testing.T) {
	n := newNode(t, "n", 0)
	n.region(t, "E", blockBytes, 4, "")
	ctx := t.Context()
	hold := func(i int) error {
		_, err := n.a.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "E", Hashes: []uint64{1},
			Hold: &agentv1.Hold{RequestId: fmt.Sprint("r", i), LeaseMs: 1 << 31}})
		return err
	}
	for i := range maxLeases {
		if err := hold(i); err != nil {
			t.Fatalf("hold %d: %v", i, err)
		}
	}
	if err := hold(maxLeases); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("hold past the bound: %v, want %s", err, codes.ResourceExhausted)
	}
}
