package demo

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/config"
)

func TestPolicyConfigsParse(t *testing.T) {
	for p := range Policies {
		t.Run(p, func(t *testing.T) {
			text, err := policyConfig(p, "/tok", "42", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := config.Parse([]byte(text)); err != nil {
				t.Fatalf("%v\n%s", err, text)
			}
		})
	}
	if _, err := policyConfig("nope", "", "", nil); err == nil {
		t.Fatal("unknown policy accepted")
	}
}

// Each bad flag is refused by name (checked before any path is looked up,
// so the refusal is the flag's own).
func TestParseFlagsRejects(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "0"}, "--replicas"},
		{[]string{"--requests", "0"}, "--requests"},
		{[]string{"--policy", "fastest"}, "fastest"},
		{[]string{"--time-scale", "-1"}, "--time-scale"},
		{[]string{"--words-per-block", "0"}, "--words-per-block"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--agent", "/nonexistent/kvgate-agent"}, "--agent"},
		{[]string{"--mixed", "--batch-requests", "0"}, "--batch-requests"},
		{[]string{"--pd", "2P"}, "--pd"},
		{[]string{"--pd", "0P2D"}, "--pd"},
		{[]string{"--pd", "1P2D", "--pd-decider", "sometimes"}, "--pd-decider"},
		{[]string{"--pd", "1P2D", "--pd-decider", "prefix", "--pd-non-cached-tokens", "0"}, "--pd-non-cached-tokens"},
		{[]string{"--epd"}, "--epd"},
		{[]string{"--mixed", "--holdback", "1"}, "--holdback"},
		{[]string{"--mixed", "--max-concurrency", "0"}, "--max-concurrency"},
		{[]string{"--mixed", "--queue-ttl", "0s"}, "--queue-ttl"},
		{[]string{"--mixed", "--keep-running"}, "--keep-running"},
		{[]string{"--engine-priority"}, "--engine-priority"},
	} {
		_, err := ParseFlags(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %s", tc.args, err, tc.want)
		}
	}
}

func TestParseMetricsSumsFamilies(t *testing.T) {
	m, err := parseMetrics(strings.NewReader(`# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 2
vllm:num_requests_waiting{model_name="b"} 3
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="a"} 40
`))
	if err != nil {
		t.Fatal(err)
	}
	if m["vllm:num_requests_waiting"] != 5 || m["vllm:prefix_cache_hits_total"] != 40 {
		t.Fatalf("parsed %v", m)
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add("# TYPE x counter\nx 1\n")
	f.Add("vllm:kv_cache_usage_perc{a=\"b\"} 0.5\n")
	f.Add("x{") // truncated
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = parseMetrics(strings.NewReader(s))
	})
}

func TestProgressWithoutTTYPrintsQuarters(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, false, "rr", 8)
	for i := 1; i <= 8; i++ {
		p.update(i)
	}
	p.finish(time.Second)
	out := b.String()
	if strings.Contains(out, "\r") || strings.Count(out, "requests done") != 4 || !strings.Contains(out, "8/8") {
		t.Fatalf("non-TTY progress:\n%s", out)
	}
}

func TestExitErrorNamesComponent(t *testing.T) {
	// StartStack fails fast, with the component's log tail, when a child
	// cannot run: here the binary is a shell that exits at once.
	_, err := StartStack(t.Context(), StackConfig{Bin: "/bin/false", Replicas: 1, Policy: PolicyRoundRobin,
		LogDir: t.TempDir(), TimeScale: 1, NumGPUBlocks: 16, HashSeed: "42", Ready: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "died (exit status 1)") {
		t.Fatalf("err = %v", err)
	}
	var nr interface{ Unwrap() error }
	if !errors.As(err, &nr) {
		t.Fatalf("err %T does not wrap the exit", err)
	}
}
