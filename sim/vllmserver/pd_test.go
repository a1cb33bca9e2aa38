package vllmserver

import (
	"net/http"
	"testing"
	"time"
)

// TestPrefillThenDecode runs the P/D protocol between two servers as the
// routing sidecar drives it: the prefill leg answers with
// kv_transfer_params, the decode leg counts the pulled KV as cached, and
// the decoder then releases the prefiller's held blocks.
func TestPrefillThenDecode(t *testing.T) {
	po := testOptions(t)
	po.Role = RolePrefill
	prefiller := startServer(t, po)
	do := testOptions(t)
	do.Role = RoleDecode
	decoder := startServer(t, do)

	prompt := make([]int, 100)
	for i := range prompt {
		prompt[i] = 7 * i
	}
	leg := map[string]any{"model": po.Model, "prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}
	pre := complete(t, prefiller, "/v1/completions", leg)
	kv := pre.KVTransferParams
	if kv == nil || !kv.DoRemotePrefill || kv.DoRemoteDecode || len(kv.RemoteBlockIDs) != 7 ||
		kv.RemoteRequestID == nil || *kv.RemoteRequestID != pre.ID || kv.RemoteEngineID == nil ||
		kv.RemoteHost == nil || *kv.RemoteHost != "127.0.0.1" || kv.RemotePort == nil || kv.TPSize == nil || *kv.TPSize != 1 {
		t.Fatalf("prefill kv_transfer_params %+v", kv)
	}
	if pre.Usage.CompletionTokens != 1 || *pre.Choices[0].FinishReason != "length" {
		t.Fatalf("prefill answer %+v", pre)
	}
	if m := prefiller.Engine().Metrics(); m.HeldRequests != 1 || m.KVUsage == 0 {
		t.Fatalf("prefiller after the prefill leg: %+v", m)
	}

	dec := complete(t, decoder, "/v1/completions", map[string]any{"model": do.Model, "prompt": prompt,
		"max_tokens": 5, "kv_transfer_params": kv})
	if dec.Usage.CompletionTokens != 5 || dec.Usage.PromptTokensDetails.CachedTokens != len(prompt)-1 {
		t.Fatalf("decode usage %+v, want the pulled KV (all but the last prompt token) cached", dec.Usage)
	}
	if dec.KVTransferParams != nil {
		t.Fatalf("decode answer carries kv_transfer_params %+v", dec.KVTransferParams)
	}
	waitFor(t, "the decoder to release the prefiller's blocks", func() bool {
		m := prefiller.Engine().Metrics()
		return m.HeldRequests == 0 && m.KVUsage == 0
	})

	// Each role refuses the other's leg.
	if status, raw := post(t, decoder.URL()+"/v1/completions", leg); status != http.StatusBadRequest {
		t.Fatalf("decoder took a prefill leg: %d %s", status, raw)
	}
	decLeg := map[string]any{"model": po.Model, "prompt": prompt, "kv_transfer_params": kv}
	if status, raw := post(t, prefiller.URL()+"/v1/completions", decLeg); status != http.StatusBadRequest {
		t.Fatalf("prefiller took a decode leg: %d %s", status, raw)
	}
}

// TestHeldBlocksTimeOut: blocks no decoder releases are freed after
// --kv-held-timeout of simulated time.
func TestHeldBlocksTimeOut(t *testing.T) {
	o := testOptions(t)
	o.TimeScale, o.HeldBlockTimeout = 1000, 2*time.Second // 2 ms of wall time
	s := startServer(t, o)
	complete(t, s, "/v1/completions", map[string]any{"model": o.Model, "prompt": "keep these blocks for a decoder",
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	waitFor(t, "held blocks to expire", func() bool { return s.Engine().Metrics().HeldRequests == 0 })
}
