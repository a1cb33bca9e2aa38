package kvevents

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/extproc/kvindex"
	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/testutil"
)

// TestApplyAllocatesNoMoreThanDecode checks that a worker converts an
// event's hashes to routing keys without a buffer as long as the event:
// applying a batch of many 1-byte hashes, for an endpoint the index does
// not hold (so the index itself allocates nothing), costs what decoding it
// does, not 8 bytes per hash more.
func TestApplyAllocatesNoMoreThanDecode(t *testing.T) {
	idx := kvindex.New(kvindex.Config{MaxEntries: 1 << 10})
	sub, err := New(t.Context(), idx, Config{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	hs := make([]kvwire.Hash, 1<<16)
	for i := range hs {
		hs[i] = kvwire.Uint64Hash(uint64(i % 100)) // each a 1-byte fixint
	}
	payload, err := kvwire.Encode(kvwire.EventBatch{Events: []kvwire.Event{kvwire.BlockRemoved{BlockHashes: hs}}}, kvwire.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	decode := testutil.AllocatedPerByte(len(payload), func() {
		if _, _, err := (kvwire.DecodeOptions{SkipTokenIDs: true}).Decode(payload); err != nil {
			t.Fatal(err)
		}
	})
	apply := testutil.AllocatedPerByte(len(payload), func() {
		w := &worker{s: sub, states: map[string]*seqState{}, maxEndpoints: 1}
		w.apply("10.0.0.1:8000", payload)
	})
	t.Logf("decode %.2f, apply %.2f bytes allocated per payload byte", decode, apply)
	if apply > decode+1 {
		t.Fatalf("apply allocated %.2f bytes per payload byte, decoding alone %.2f: want at most 1 more", apply, decode)
	}
}

// TestDecodedSizeIsCharged: a valid batch of 1-byte hashes decodes to 16
// times its size. That is charged to its connection's share of the memory
// budget while the batch is applied, so a batch whose decoded events the
// share cannot hold is dropped (and the endpoint cleared, as for any lost
// batch) instead of allocated outside the budget.
func TestDecodedSizeIsCharged(t *testing.T) {
	const ep = "10.0.0.7:8000"
	f := newFixtureSized(t, Config{MaxMessageSize: 64 << 10, PublisherMemory: 64 << 10}, 1<<15)
	p := followed(t, f, ep, "")
	p.sendBatch(0, stored("", 1000))
	f.eventually("the first batch", func() bool { return f.holds(ep, 1000) == 1 })
	hs := make([]uint64, 16<<10) // 16 KiB of payload, 256 KiB decoded
	for i := range hs {
		hs[i] = uint64(i % 100) // each a 1-byte fixint
	}
	p.sendBatch(1, stored("", hs...))
	p.sendBatch(2, stored("", 2000))
	f.eventually("the batch after", func() bool { return f.holds(ep, 2000) == 1 })
	if f.holds(ep, 1) != 0 || f.holds(ep, 1000) != 0 {
		t.Fatal("a batch decoding past the publisher's memory share was applied, or the endpoint not cleared")
	}
	if got := promtestutil.ToFloat64(f.sub.m.dropped.WithLabelValues(dropMemory)); got != 1 {
		t.Fatalf("dropped{memory} = %v, want 1", got)
	}
	// What a batch that fits was charged is given back once it applied.
	mem := &connBudget{g: &f.sub.mem, max: 1 << 20}
	w := &worker{s: f.sub, states: map[string]*seqState{}, maxEndpoints: 1, mem: mem}
	payload, err := kvwire.Encode(stored("", hs...), kvwire.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	w.apply("10.0.0.8:8000", payload)
	if f.holds("10.0.0.8:8000", 1) != 1 {
		t.Fatal("a batch within the budget was not applied")
	}
	if mem.used != 0 {
		t.Fatalf("%d bytes of the connection's budget still held once the batch applied", mem.used)
	}
}
