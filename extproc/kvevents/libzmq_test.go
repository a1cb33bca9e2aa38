package kvevents

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/kvwire"
	"github.com/kvgate/kvgate/internal/zmtp/libzmqtest"
)

// TestLibzmqPublisherToIndex publishes vLLM-framed batches with the real
// libzmq (what vLLM's ZmqEventPublisher runs on) into the subscriber, in
// both of vLLM's modes: connecting to the central socket, and bound for
// the subscriber to connect to.
func TestLibzmqPublisherToIndex(t *testing.T) {
	bin := libzmqtest.Build(t, "zpub")
	payload, err := kvwire.Encode(stored(kvwire.MediumGPU, 77, 78), kvwire.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "batch")
	if err := os.WriteFile(file, payload, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, central := range []bool{true, false} {
		name := "per-endpoint"
		if central {
			name = "central"
		}
		t.Run(name, func(t *testing.T) {
			const ep = "10.3.0.1:8000"
			cfg := Config{}
			if central {
				cfg.Bind = "tcp://127.0.0.1:0"
			}
			f := newFixture(t, cfg)
			if central {
				f.sub.AddEndpoint(ep, Source{})
				libzmqtest.Start(t, bin, "connect", "tcp://"+f.sub.Addr().String(), kvwire.BuildTopic(ep, "m"), "100000", "@"+file)
			} else {
				p := libzmqtest.Start(t, bin, "bind", "tcp://127.0.0.1:*", "", "100000", "@"+file)
				f.sub.AddEndpoint(ep, Source{Events: p.Line(t, testTimeout)})
			}
			f.eventually("libzmq's batches", func() bool {
				return f.holds(ep, 77) == 1 && f.holds(ep, 78) == 1 && testutil.ToFloat64(f.sub.m.batches) >= 10
			})
			if got := testutil.ToFloat64(f.sub.m.gaps) + testutil.ToFloat64(f.sub.m.decodeErrors); got != 0 {
				t.Fatalf("gaps+decode errors = %v on libzmq's stream", got)
			}
		})
	}
}
