package vllmserver

import (
	"io"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/cliflag/cliflagtest"
	"github.com/kvgate/kvgate/internal/kvwire"
)

// A command line built from Options parses back to the same Options.
func TestArgsRoundTrip(t *testing.T) {
	full := DefaultOptions() // the fields without a flag keep their defaults
	full.Host, full.Port, full.AdvertiseHost, full.Model, full.ServedModelNames = "127.0.0.1", 8123, "10.0.0.1", "m", []string{"a", "b"}
	full.TokenizerDir, full.Preset, full.BlockSize, full.NumGPUBlocks, full.MaxNumSeqs = "/tok", "llama-3.1-8b-h100", 32, 600, 8
	full.MaxNumBatchedTokens, full.MaxModelLen, full.MaxWaiting, full.HashSeed, full.SchedulingPolicy = 4096, 2048, 10, "7", "priority"
	full.LoRAModules, full.MaxLoRAs = []LoRAModule{{Name: "l1", Path: "/p1"}, {Name: "l2", Path: "/p2"}}, 2
	full.HeldBlockTimeout, full.Role, full.TimeScale, full.FailureRate, full.Seed = time.Minute, RolePrefill, 0.03, 0.25, 3
	full.Echo, full.DefaultMaxTokens, full.KVEventsEndpoint = true, 5, "tcp://127.0.0.1:5557"
	full.KVEventsReplayEndpoint, full.KVEventsTopic, full.KVEventsEncoding = "tcp://*:5558", "kv@x@m", kvwire.EncodingMap
	full.Agent, full.KVBytesPerToken, full.KVRegionBytes, full.KVRegionDir = "127.0.0.1:7600", 4096, 1<<20, "/tmp"
	full.KVLoadFailurePolicy, full.KVTransferTimeout, full.KVOffloadEventsEndpoint = PolicyRecompute, time.Second, "tcp://127.0.0.1:5560"
	full.KVTransferConfig = `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`
	full.KVAllowedHosts = []string{"10.0.0.2", "10.8.0.0/16", "prefill-0.pool"}
	cliflagtest.AllSet(t, full, "Tokenizer", "Logger")
	// The logger is built from --log-level, not carried.
	parse := func(args []string) (Options, error) {
		o, err := ParseFlags(args, io.Discard)
		o.Logger = nil
		return o, err
	}
	cliflagtest.RoundTrip(t, parse, Options.Args, DefaultOptions(), full)
}
