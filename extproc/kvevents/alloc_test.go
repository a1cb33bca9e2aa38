package kvevents

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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
