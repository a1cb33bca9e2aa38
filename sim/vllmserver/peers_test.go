package vllmserver

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/internal/vllm"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestAllowList: loopback, localhost and the --kv-allowed-hosts entries
// (addresses, prefixes, names; IPv4 in IPv6 form too) are dialled, nothing
// else; an entry that could never match is refused by name.
func TestAllowList(t *testing.T) {
	l, err := parseAllowList([]string{"10.0.0.7", "Tier.Example", "fd00::1", "10.8.0.0/16", "::ffff:192.168.1.0/120"})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.8.9.10": true, "::1": true, "::ffff:127.0.0.1": true, "localhost": true, "LocalHost": true,
		"10.0.0.7": true, "::ffff:10.0.0.7": true, "tier.example": true, "fd00::1": true, "10.8.200.1": true, "192.168.1.9": true,
		"10.0.0.8": false, "0.0.0.0": false, "::": false, "tier.example.evil": false, "fd00::2": false, "10.9.0.1": false,
		"169.254.169.254": false, "metadata.google.internal": false, "": false,
	} {
		if got := l.allows(host); got != want {
			t.Errorf("allows(%q) = %v, want %v", host, got, want)
		}
	}
	for _, bad := range []string{"10.0.0.1:8000", "http://tier", "", "a b", "-x.example", "10.0.0.0/33"} {
		if _, err := parseAllowList([]string{bad}); err == nil || !strings.Contains(err.Error(), "--kv-allowed-hosts") {
			t.Errorf("entry %q: %v, want an error naming --kv-allowed-hosts", bad, err)
		}
	}
}

// refusedDials is kvgate_sim_refused_dials_total{dial} on s's registry.
func refusedDials(t *testing.T, reg prometheus.Gatherer, dial string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_sim_refused_dials_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "dial" && lp.GetValue() == dial {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("kvgate_sim_refused_dials_total{dial=%q} not exported", dial)
	return 0
}

// counting is a loopback HTTP server that counts the connections and the
// requests it gets.
type counting struct {
	*httptest.Server
	conns, reqs atomic.Int32
}

func newCounting(t *testing.T, h http.HandlerFunc) *counting {
	c := &counting{}
	c.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.reqs.Add(1)
		h(w, r)
	}))
	c.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			c.conns.Add(1)
		}
	}
	c.Start()
	t.Cleanup(c.Close)
	return c
}

func (c *counting) port(t *testing.T) int {
	_, p := splitAddr(t, c.Listener.Addr().String())
	return p
}

// TestReleaseKVHosts: a decode leg tells its prefiller to release only
// when remote_host is allowed. 0.0.0.0 is not: on Linux a connection to
// it reaches the machine's own listeners, so without the check a client
// could have the simulator POST to any local port. A refused release is
// counted and left to the prefiller's held-block timeout; the request is
// served all the same. The release client follows no redirect.
func TestReleaseKVHosts(t *testing.T) {
	o := testOptions(t)
	o.Role = RoleDecode
	dec := startServer(t, o)
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
	refusedPeer, allowedPeer := newCounting(t, ok), newCounting(t, ok)
	decode := func(host string, port int) {
		t.Helper()
		eng, id := "kvgate-sim-prefiller", "cmpl-held"
		r := complete(t, dec, "/v1/completions", map[string]any{"model": o.Model, "prompt": strings.Repeat("release me ", 20), "max_tokens": 2,
			"kv_transfer_params": vllm.KVTransferParams{DoRemotePrefill: true, RemoteEngineID: &eng, RemoteRequestID: &id,
				RemoteBlockIDs: []int{0, 1}, RemoteHost: &host, RemotePort: &port}})
		if r.Usage.CompletionTokens != 2 {
			t.Fatalf("decode leg naming %s: usage %+v", host, r.Usage)
		}
	}
	decode("0.0.0.0", refusedPeer.port(t))
	decode("127.0.0.1", allowedPeer.port(t))
	waitFor(t, "the allowed prefiller's release_kv", func() bool { return allowedPeer.reqs.Load() == 1 })
	if n := refusedPeer.conns.Load(); n != 0 {
		t.Fatalf("the refused remote_host got %d connections", n)
	}
	if n := refusedDials(t, dec.Registry(), dialReleaseKV); n != 1 {
		t.Fatalf("%v refused release_kv dials counted, want 1", n)
	}

	target := newCounting(t, ok)
	redirect := newCounting(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+"/kvgate/release_kv", http.StatusTemporaryRedirect)
	})
	err := dec.postRelease(context.Background(), redirect.URL+"/kvgate/release_kv", []byte(`{"request_id":"x"}`))
	if err == nil || !strings.Contains(err.Error(), "307") || target.reqs.Load() != 0 {
		t.Fatalf("a redirecting prefiller: %v, %d requests to its target; want the 307 and none", err, target.reqs.Load())
	}
}

// stubAgent is the node agent's KVTransfer service as far as a decode leg
// uses it before its pull: it records the peers it is asked to pull from
// and answers that nothing arrived (the real agent needs NIXL).
type stubAgent struct {
	agentv1.UnimplementedKVTransferServer
	mu    sync.Mutex
	peers []string
}

func (a *stubAgent) PullBlocks(_ context.Context, r *agentv1.PullBlocksRequest) (*agentv1.PullBlocksResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.peers = append(a.peers, r.Peer)
	return &agentv1.PullBlocksResponse{}, nil
}

func (a *stubAgent) asked() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.peers...)
}

// TestAgentPullHosts: with --agent, the server asks its agent to pull
// from the host a decode leg's remote_host or a remote_kv_source names
// only when that host is allowed; a refused one is counted and is a failed
// KV load under kv_load_failure_policy: vLLM's 500 under fail, a
// recompute under recompute.
func TestAgentPullHosts(t *testing.T) {
	agent := &stubAgent{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	agentv1.RegisterKVTransferServer(g, agent)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)

	newPlane := func(policy string) (*dataPlane, *prometheus.Registry) {
		o := DefaultOptions()
		o.Agent, o.KVLoadFailurePolicy = ln.Addr().String(), policy
		reg := prometheus.NewRegistry()
		s := &Server{opts: o, log: slog.New(slog.DiscardHandler), engID: "test", ctx: context.Background()}
		s.engCfg.BlockSize = o.BlockSize
		if s.peers, err = newPeerGuard(allowList{}, s.log, reg); err != nil {
			t.Fatal(err)
		}
		d, err := newDataPlane(s, 64)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.conn.Close() })
		return d, reg
	}
	prompt := make([]int, 4*16+1)
	for i := range prompt {
		prompt[i] = 100 + i
	}
	nixlLeg := func(host string) *job {
		port, eng, id := 7600, "kvgate-sim-x", "cmpl-x"
		return &job{prompt: prompt, kv: &vllm.KVTransferParams{DoRemotePrefill: true, RemoteEngineID: &eng, RemoteRequestID: &id,
			RemoteBlockIDs: []int{0, 1}, RemoteHost: &host, RemotePort: &port}}
	}
	sourced := func(host string) *job {
		return &job{prompt: prompt, kv: &vllm.KVTransferParams{RemoteKVSource: &vllm.RemoteKVSource{RemoteHost: host, RemotePort: 7600}}}
	}
	for _, tc := range []struct {
		name, dial, field string
		job               func(host string) *job
	}{
		{"do_remote_prefill", dialNIXLPull, "remote_host", nixlLeg},
		{"remote_kv_source", dialKVSource, "remote_kv_source.remote_host", sourced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, reg := newPlane(PolicyFail)
			before := len(agent.asked())
			for _, host := range []string{"192.0.2.1", "0.0.0.0", "metadata.google.internal"} {
				aerr := d.beforeSubmit(context.Background(), tc.job(host))
				if aerr == nil || aerr.Code != http.StatusInternalServerError || aerr.Type != "InternalServerError" ||
					!strings.Contains(aerr.Message, tc.field) || !strings.Contains(aerr.Message, strconv.Quote(host)) ||
					!strings.Contains(aerr.Message, "--kv-allowed-hosts") {
					t.Fatalf("%s %s: %+v, want the 500 naming the field, the host and the flag", tc.field, host, aerr)
				}
			}
			if got := agent.asked()[before:]; len(got) != 0 {
				t.Fatalf("the agent was asked to pull from %v", got)
			}
			if n := refusedDials(t, reg, tc.dial); n != 3 {
				t.Fatalf("%v refused %s dials counted, want 3", n, tc.dial)
			}
			// An allowed host reaches the agent: the check is what kept the
			// others away.
			_ = d.beforeSubmit(context.Background(), tc.job("127.0.0.1"))
			if got := agent.asked()[before:]; len(got) != 1 || got[0] != "127.0.0.1:7600" {
				t.Fatalf("the agent was asked for %v, want 127.0.0.1:7600 once", got)
			}

			d, reg = newPlane(PolicyRecompute)
			j := tc.job("192.0.2.1")
			if aerr := d.beforeSubmit(context.Background(), j); aerr != nil || j.remote != nil || d.stats.Recomputed.Load() != 1 {
				t.Fatalf("under recompute: %+v, remote %+v, %d recomputed; want the prompt recomputed", aerr, j.remote, d.stats.Recomputed.Load())
			}
			if n := refusedDials(t, reg, tc.dial); n != 1 {
				t.Fatalf("%v refused %s dials counted under recompute, want 1", n, tc.dial)
			}
		})
	}
}
