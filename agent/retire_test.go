package agent

import (
	"fmt"
	"os"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kvgate/kvgate/agent/kvblock"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestCrashLoopKeepsRegistering: a retired region (its server restarted on
// the same file) stayed mapped and counted toward the 64-region limit for
// the life of the agent, so a model server in a crash loop locked every
// server of the node out of registering after 64 restarts. The limit
// counts live regions now, and a restart reuses its old range.
func TestCrashLoopKeepsRegistering(t *testing.T) {
	for _, recreate := range []bool{false, true} {
		t.Run(fmt.Sprint("recreate=", recreate), func(t *testing.T) { crashLoop(t, recreate) })
	}
}

// crashLoop registers one server's region 3×maxRegions times, the server
// removing and creating its file again each time when recreate is set (the
// simulator removes it as it stops).
func crashLoop(t *testing.T, recreate bool) {
	n := newNode(t, "n", 0)
	path := n.dir + "/crashing"
	var base uintptr
	var mem []byte
	for i := range 3 * maxRegions {
		if mem == nil || recreate {
			if mem != nil {
				kvblock.Unmap(mem)
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			}
			var err error
			if mem, err = kvblock.Map(path, 4*blockBytes); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.client.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: fmt.Sprint("E-", i), Path: path,
			BlockBytes: blockBytes, Slots: 4}); err != nil {
			t.Fatalf("registration %d: %v", i, err)
		}
		n.a.mu.Lock()
		r, live, retired := n.a.regions[fmt.Sprint("E-", i)], len(n.a.regions), len(n.a.retired)
		n.a.mu.Unlock()
		if i == 0 {
			base = addr(r.mem)
		}
		if live != 1 || retired != 0 || addr(r.mem) != base {
			t.Fatalf("registration %d: %d live, %d retired regions, range at %#x (first at %#x); want the one range reused", i, live, retired, addr(r.mem), base)
		}
	}
	defer kvblock.Unmap(mem)
	// The reused range shows the server's file.
	kvblock.Fill(mem[:blockBytes], 42)
	n.a.mu.Lock()
	at := kvblock.Check(n.a.regions[fmt.Sprint("E-", 3*maxRegions-1)].mem[:blockBytes], 42)
	n.a.mu.Unlock()
	if at >= 0 {
		t.Fatalf("the agent's view of the reused range differs from the file at byte %d", at)
	}
	// Live servers are still bounded.
	for i := 1; i < maxRegions; i++ {
		n.region(t, fmt.Sprint("L-", i), blockBytes, 1, "")
	}
	p := n.dir + "/one-too-many"
	if _, err := n.client.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: "L-last", Path: p,
		BlockBytes: blockBytes, Slots: 1}); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("region %d: %v, want %s", maxRegions+1, err, codes.ResourceExhausted)
	}
}

// TestRetiredRangeBusy: a retired range a pull still writes into is not
// handed to another file (the pull's bytes would land in it); the smallest
// free one that fits is, and past maxRetired ranges that none fits the
// registration is refused rather than one unmapped.
func TestRetiredRangeBusy(t *testing.T) {
	n := newNode(t, "n", 0)
	reg := func(engine, file string, slots int) error {
		_, err := n.client.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: engine, Path: n.dir + "/" + file,
			BlockBytes: blockBytes, Slots: uint32(slots)})
		return err
	}
	rangeOf := func(engine string) *mapping {
		n.a.mu.Lock()
		defer n.a.mu.Unlock()
		return n.a.regions[engine].m
	}
	for _, e := range []string{"A", "B"} {
		if err := reg(e, e, 8); err != nil {
			t.Fatal(err)
		}
	}
	a, b := rangeOf("A"), rangeOf("B")
	n.a.mu.Lock()
	a.writers++ // a pull into A's region is in flight
	n.a.mu.Unlock()
	// Both servers restart.
	if err := reg("A2", "A", 8); err != nil {
		t.Fatal(err)
	}
	if got := rangeOf("A2"); got == a || got == b {
		t.Fatal("A2 got a range a pull writes into, or B's live one")
	}
	if err := reg("B2", "B", 4); err != nil {
		t.Fatal(err)
	}
	if rangeOf("B2") != b {
		t.Fatal("B2 did not reuse B's retired range")
	}
	n.a.mu.Lock()
	a.writers--
	n.a.mu.Unlock()
	if err := reg("C", "C", 2); err != nil {
		t.Fatal(err)
	}
	if rangeOf("C") != a {
		t.Fatal("C did not reuse A's range once its pull ended")
	}
	// Fill the retired list with small ranges, then ask for a larger one.
	n.a.mu.Lock()
	for len(n.a.retired) < maxRetired {
		n.a.retired = append(n.a.retired, &mapping{mem: make([]byte, blockBytes)})
	}
	n.a.mu.Unlock()
	if err := reg("D", "D", 64); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("past maxRetired: %v, want %s", err, codes.ResourceExhausted)
	}
	n.a.mu.Lock()
	n.a.retired = nil // they are not real mappings: Close must not unmap them
	n.a.mu.Unlock()
}
