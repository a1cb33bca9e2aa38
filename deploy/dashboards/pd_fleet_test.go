package dashboards

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/demo"
	"github.com/kvgate/kvgate/internal/kvhash"
)

// pdJob is the scrape job of the P/D pool's picker.
const pdJob = "gaie-pd-epp"

// pdPart is a 1P1D fleet beside the main one, as `kvgate up --pd 1P1D`
// runs it: a prefill and a decode `kvgate sim`, each with its
// kvgate-agent moving the KV over NIXL (UCX on loopback), a `kvgate
// sidecar` in front of the decoder, the picker with
// disagg-profile-handler (every request disaggregated) and a gateway.
type pdPart struct {
	stack *demo.PDStack
	gatewayClient
}

// startPD starts the P/D fleet from the repository's binaries; it stops
// when the test ends.
func startPD(ctx context.Context, t *testing.T, tokDir string) *pdPart {
	t.Helper()
	c := demo.PDConfig{Shape: demo.PDShape{Prefill: 1, Decode: 1}, Decider: demo.DeciderAlways, KVBytesPerToken: 1024, KVRegionDir: t.TempDir()}
	c.Bin, c.AgentBin = repoBinary(t, "kvgate", "./cmd/kvgate"), agentBinary(t)
	c.TokenizerDir, c.HashSeed = tokDir, kvhash.DefaultSeed
	c.LogDir, c.TimeScale, c.NumGPUBlocks, c.Ready = t.TempDir(), 1, 2048, time.Minute
	s, err := demo.StartPDStack(ctx, c)
	if err != nil {
		t.Fatalf("P/D fleet: %v", err)
	}
	t.Cleanup(s.Close)
	return &pdPart{stack: s, gatewayClient: gatewayClient{gatewayURL: s.GatewayURL}}
}

// targets are the P/D pool's picker and servers, their pod names saying
// their role as llm-d's P/D guides name them.
func (p *pdPart) targets() []scrapeTarget {
	epp := strings.TrimSuffix(strings.TrimPrefix(p.stack.EPPMetricsURL, "http://"), "/metrics")
	targets := []scrapeTarget{{Job: pdJob, Addr: epp, Labels: map[string]string{
		"namespace": testNamespace, "pod": pdJob + "-0", "service": pdJob,
	}}}
	for _, s := range append(append([]demo.Sim{}, p.stack.Prefill...), p.stack.Decode...) {
		targets = append(targets, scrapeTarget{Job: "vllm", Addr: s.Addr, Labels: map[string]string{
			"namespace": testNamespace, "pod": "vllm-pd-" + s.Name,
		}})
	}
	return targets
}
