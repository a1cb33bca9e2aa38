package wasmhost_test

import (
	"context"
	"math"
	"testing"

	"github.com/kvgate/kvgate/gateway/wasmhost"
)

// TestStreamIDsWrap (left open): after 2^32 streams a VM's context ids
// wrap past 0 (no context) and the root's id instead of onto them, and the
// filter keeps working.
func TestStreamIDsWrap(t *testing.T) {
	h := newHost(t, `{"mode":"approximate","blockSize":16}`, 1)
	ctx := context.Background()
	vm, err := h.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release(vm)
	wasmhost.SetNextStreamID(vm, math.MaxUint32-1)
	var ids []uint32
	for range 4 {
		s, err := vm.NewStream(ctx, [][2]string{{":method", "GET"}, {":path", "/v1/models"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.OnRequestHeaders(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := s.Done(ctx); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, wasmhost.StreamID(s))
	}
	for _, id := range ids {
		if id <= 1 {
			t.Fatalf("stream ids %v reuse 0 or the root context's id", ids)
		}
	}
}
