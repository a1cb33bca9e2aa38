package agent

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/agent/kvblock"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestReleaseCount: the ":<tp>" of a release notification was cut off and
// the first notification freed the hold, so with a decoder whose
// tensor-parallel ranks each pull (each notifying "<id>:<ranks>", as vLLM's
// do) the prefiller's blocks were reused while the other ranks still read
// them. The hold lasts until as many notifications as the count arrived.
func TestReleaseCount(t *testing.T) {
	p, d := newNode(t, "p", 0), newNode(t, "d", 0)
	pmem := p.region(t, "P", blockBytes, 16, "")
	d.region(t, "D", blockBytes, 16, "")
	ctx := t.Context()
	watch, err := p.client.WatchReleases(ctx, &agentv1.WatchReleasesRequest{EngineId: "P"})
	if err != nil {
		t.Fatal(err)
	}
	hold := func(id string, hashes ...uint64) []uint32 {
		t.Helper()
		st, err := p.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: hashes,
			Hold: &agentv1.Hold{RequestId: id, LeaseMs: 60000}})
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range st.Slots {
			kvblock.Fill(slot(pmem, s), hashes[i])
		}
		return st.Slots
	}
	pull := func(id string, tp uint32, slots []uint32, hashes ...uint64) {
		t.Helper()
		if _, err := d.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: p.addr, Hashes: hashes,
			Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P",
				RemoteRequestId: id, RemoteBlockIds: slots, TpSize: tp}}}); err != nil {
			t.Fatal(err)
		}
	}
	released := func() string {
		t.Helper()
		rel, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if rel.Expired {
			t.Fatalf("%s expired", rel.RequestId)
		}
		return rel.RequestId
	}
	two, one := hold("two-ranks", 1, 2), hold("one-rank", 3)
	pull("two-ranks", 2, two, 1, 2) // rank 0 of 2
	// Notifications from one agent arrive in order: once the later one
	// freed its hold, the first one has been counted.
	pull("one-rank", 1, one, 3)
	if got := released(); got != "one-rank" {
		t.Fatalf("released %s first; the hold of two ranks went after one notification", got)
	}
	p.a.mu.Lock()
	_, held := p.a.leases["two-ranks"]
	p.a.mu.Unlock()
	if !held {
		t.Fatal("the hold of two ranks is gone after one notification")
	}
	pull("two-ranks", 2, two, 1, 2) // rank 1 of 2
	if got := released(); got != "two-ranks" {
		t.Fatalf("released %s", got)
	}
}

func TestParseRelease(t *testing.T) {
	for _, tc := range []struct {
		msg   string
		id    string
		count uint64
		err   string
	}{
		{msg: "cmpl-1:1", id: "cmpl-1", count: 1},
		{msg: "a:b:4", id: "a:b", count: 4}, // split at the last colon
		{msg: ":2", id: "", count: 2},
		{msg: "cmpl-1", err: "no \":<count>\""},
		{msg: "cmpl-1:", err: "count \"\""},
		{msg: "cmpl-1:0", err: "count \"0\""},
		{msg: "cmpl-1:-1", err: "count \"-1\""},
		{msg: "cmpl-1:1025", err: "count \"1025\""},
		{msg: "cmpl-1:x", err: "count \"x\""},
	} {
		id, count, err := parseRelease([]byte(tc.msg))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: err %v, want one with %q", tc.msg, err, tc.err)
		case tc.err == "" && (err != nil || id != tc.id || count != tc.count):
			t.Errorf("%q: %q %d %v, want %q %d", tc.msg, id, count, err, tc.id, tc.count)
		}
	}
}

// FuzzParseRelease: notifications are a peer's input; an accepted one has
// a count in range and gives the request id back.
func FuzzParseRelease(f *testing.F) {
	for _, s := range []string{"r:1", "a:b:8", "r", "r:0", ":1", "r:99999999999999999999"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		id, count, err := parseRelease(msg)
		if err != nil {
			return
		}
		if count == 0 || count > maxConsumers || !strings.HasPrefix(string(msg), id+":") {
			t.Fatalf("%q parsed to %q %d", msg, id, count)
		}
	})
}
