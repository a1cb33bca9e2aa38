package sidecar

import (
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	t.Setenv("INFERENCE_POOL", "")
	t.Setenv("P2P_CONNECTOR_PORT", "")
	o := DefaultOptions()
	if o.Port != 8000 || o.ModelServerPort != 8200 || o.KVConnector != "nixlv2" || !o.EnableSSRFProtection || !o.SecureServing ||
		o.P2PConnectorPort != 7777 || o.PrefillRetryBackoff != 200*time.Millisecond || o.PrefillMaxRetries != 0 || o.MaxIdleConnsPerHost != 1024 ||
		o.ReplayBufferBytes != 256<<20 || o.BodyBudgetBytes != 256<<20 {
		t.Fatalf("defaults %+v", o)
	}
	t.Setenv("INFERENCE_POOL", "ns/pool")
	t.Setenv("P2P_CONNECTOR_PORT", "7000")
	t.Setenv("ENABLE_PREFILLER_SAMPLING", "true")
	if o := DefaultOptions(); o.InferencePool != "ns/pool" || o.P2PConnectorPort != 7000 || !o.EnablePrefillerSampling {
		t.Fatalf("env defaults %+v", o)
	}
}

// TestParseFlags: llm-d's command lines parse (old spellings too); what
// kvgate does not implement is refused by name.
func TestParseFlags(t *testing.T) {
	t.Setenv("INFERENCE_POOL", "")
	ok := [][]string{
		{"--port=8000", "--vllm-port=8200", "--kv-connector=offloading", "--p2p-connector-port=7777", "--secure-proxy=false", "--endpoints=/x"},
		{"--port", "5000", "--vllm-port=5001", "--connector=nixlv2", "--secure-proxy=false", "--zap-log-level=4", "--enable-ssrf-protection=false"},
		{"--model-server-port=8100", "--inference-pool=ns/p", "--enable-tls=prefiller,decoder", "--tls-insecure-skip-verify=prefiller", "--prefill-max-retries=3", "--prefill-retry-backoff=1s"},
		{"--ec-connector=ec-nixl", "--enable-p2p-pull", "--inference-pool=p", "--metrics-port=9000", "--zap-log-level=debug"},
		{"--replay-buffer-bytes=0", "--inference-pool=p"},
		{"--body-budget-bytes=-1", "--inference-pool=p"},
	}
	for _, args := range ok {
		if _, err := ParseFlags(args, io.Discard); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	o, _ := ParseFlags([]string{"--vllm-port=5001", "--secure-proxy=false", "--inference-pool=p"}, io.Discard)
	if o.ModelServerPort != 5001 || o.SecureServing {
		t.Fatalf("deprecated aliases not applied: %+v", o)
	}
	bad := map[string][]string{
		"kv-connector":           {"--kv-connector=sglang", "--inference-pool=p"},
		"ec-connector":           {"--ec-connector=x", "--inference-pool=p"},
		"TLS stage":              {"--enable-tls=router", "--inference-pool=p"},
		"data-parallel-size":     {"--data-parallel-size=2", "--inference-pool=p"},
		"decode-chunk-size":      {"--decode-chunk-size=64", "--inference-pool=p"},
		"enable-p2p-pull":        {"--enable-p2p-pull", "--kv-connector=shared-storage", "--inference-pool=p"},
		"enable-ssrf-protection": {},
		"exclusive":              {"--endpoints=/x", "--inference-pool=p"},
		"pool-group":             {"--pool-group=x.io", "--inference-pool=p"},
		"not defined":            {"--configuration=x"},
		"--replay-buffer-bytes":  {"--replay-buffer-bytes=-1", "--inference-pool=p"},
		"--body-budget-bytes":    {"--body-budget-bytes=0", "--inference-pool=p"},
	}
	for want, args := range bad {
		if _, err := ParseFlags(args, io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: error %v, want one naming %q", args, err, want)
		}
	}
}

func TestArgsRoundTrip(t *testing.T) {
	o := DefaultOptions()
	o.Host, o.Port, o.ModelServerPort, o.KVConnector, o.ECConnector = "127.0.0.1", 0, 9, ConnectorOffloading, ECConnectorNIXL
	o.EndpointsFile, o.InferencePool, o.SecureServing, o.EnableTLS = "/p.yaml", "", false, []string{"prefiller"}
	o.PrefillMaxRetries, o.PrefillRetryBackoff, o.MetricsPort, o.ReplayBufferBytes, o.BodyBudgetBytes = 2, time.Second, 7, 1<<20, -1
	got, err := ParseFlags(o.Args(), io.Discard)
	if err != nil {
		t.Fatalf("%v: %v", o.Args(), err)
	}
	got.Logger, o.Logger = nil, nil
	if !reflect.DeepEqual(got, o) {
		t.Fatalf("round trip\n%+v\n%+v", got, o)
	}
}
