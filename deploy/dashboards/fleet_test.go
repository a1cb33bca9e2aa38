package dashboards

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promclient "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/extproc/epp"
	"github.com/kvgate/kvgate/gateway"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/internal/tokenizer"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// fleetModel is the model the simulators serve.
const fleetModel = "Qwen/Qwen3-0.6B"

// fleet is an in-process kvgate fleet on loopback: simulated vLLM servers
// publishing KV events, the picker (precise prefix policy) and the gateway.
type fleet struct {
	sims           []*vllmserver.Server
	simNames       []string
	eppMetrics     string // host:port of the picker's /metrics
	gatewayMetrics string // host:port of the gateway's (BBR's) /metrics
	gatewayClient
	poolName string
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	errMu    sync.Mutex
	errs     []error
}

// gatewayClient sends the load's requests to one gateway.
type gatewayClient struct {
	gatewayURL  string
	unknownSent atomic.Int64
}

// startFleet starts replicas simulators (the last one failing failRate of
// its requests with a 500), the picker and the gateway, and waits until the
// gateway routes.
func startFleet(t *testing.T, tokDir string, replicas int, failRate float64) *fleet {
	t.Helper()
	return startFleetWith(t, tokDir, replicas, failRate, nil)
}

// startFleetWith is startFleet with a llm-d.ai/role per replica (roles[i],
// "" for none; nil for none at all): a role-labelled server is named
// vllm-<role>-<i>, as llm-d's P/D Deployments name their pods, and serves
// whatever the picker sends it (no disaggregation profile runs).
func startFleetWith(t *testing.T, tokDir string, replicas int, failRate float64, roles []string) *fleet {
	t.Helper()
	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		t.Fatalf("tokenizer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fleet{cancel: cancel, poolName: "kvgate"}
	t.Cleanup(f.stop)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	var specs []endpoints.Spec
	for i := range replicas {
		o := vllmserver.DefaultOptions()
		o.Host, o.Port = "127.0.0.1", 0
		o.Model, o.Tokenizer = fleetModel, tok
		o.HashSeed, o.BlockSize = kvhash.DefaultSeed, kvhash.DefaultBlockSize
		o.Seed = uint64(i + 1)
		// Each server binds its publisher and the picker connects to it,
		// as with llm-d's per-pod subscriptions.
		o.KVEventsEndpoint = "tcp://127.0.0.1:*"
		o.Logger = quiet
		if i == replicas-1 {
			o.FailureRate = failRate
		}
		s, err := vllmserver.New(o)
		if err != nil {
			t.Fatalf("sim %d: %v", i, err)
		}
		name := fmt.Sprintf("vllm-%d", i)
		spec := endpoints.Spec{Address: s.Addr().String(), KVEvents: "tcp://" + s.KVEventsAddr()}
		if i < len(roles) && roles[i] != "" {
			name = fmt.Sprintf("vllm-%s-%d", roles[i], i)
			spec.Labels = map[string]string{endpoints.RoleLabel: roles[i]}
		}
		spec.Name = name
		f.sims, f.simNames = append(f.sims, s), append(f.simNames, name)
		specs = append(specs, spec)
		f.run(func() error { return s.Run(ctx) })
	}

	file, err := staticfile.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	epFile := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(epFile, file, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Policy(config.PolicyPrecise, config.PolicyOptions{Tokenizer: tokDir, BlockSize: kvhash.DefaultBlockSize, HashSeed: kvhash.DefaultSeed, Fallbacks: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Flow control on, with llm-d's defaults, so that its dashboard row has
	// data.
	cfg = append(cfg, "featureGates: [flowControl]\nflowControl:\n  defaultRequestTTL: 30s\n"...)
	eo := epp.DefaultOptions()
	eo.EndpointsFile, eo.ConfigText, eo.PoolName = epFile, string(cfg), f.poolName
	eo.GRPCAddr, eo.HealthAddr, eo.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	eo.KVEventsAddr = ""
	// Slower than the default so that a loaded test machine (the race
	// detector, parallel packages) does not time scrapes out and empty the
	// candidate set; the dashboards need no finer picture.
	eo.RefreshMetricsInterval = 500 * time.Millisecond
	eo.DrainTimeout = time.Second
	p, err := epp.New(eo, quiet)
	if err != nil {
		t.Fatalf("epp: %v", err)
	}
	f.run(func() error { defer p.Close(); return p.Run(ctx) })
	select {
	case <-p.Listening():
	case <-time.After(10 * time.Second):
		t.Fatal("picker did not bind its sockets")
	}
	grpcAddr, _, metricsAddr := p.Addrs()
	f.eppMetrics = metricsAddr

	// The gateway runs GIE's Body-Based Router step, for the gateway
	// dashboard's BBR panels.
	reg := promclient.NewRegistry()
	bbr, err := gateway.NewBBRMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	f.gatewayMetrics = serveMetrics(t, reg)
	g, err := gateway.New(ctx, gateway.Config{ExtProc: grpcAddr, ExtProcTimeout: 30 * time.Second, UpstreamTimeout: time.Minute,
		BodyBasedRouting: bbr, Logger: quiet})
	if err != nil {
		t.Fatalf("gateway: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.gatewayURL = "http://" + ln.Addr().String()
	f.run(func() error { defer g.Close(); return gateway.Serve(ctx, ln, g) })

	// Ready once a request goes through the whole path.
	deadline := time.Now().Add(20 * time.Second)
	for {
		status, err := f.chat(ctx, fleetModel, "ready?", false)
		var sb *statusBody
		if errors.As(err, &sb) {
			err = nil
		}
		if err == nil && status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleet not ready: status %d, %v", status, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return f
}

// serveMetrics serves reg's /metrics on loopback until the test ends; its
// address.
func serveMetrics(t *testing.T, reg *promclient.Registry) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = hs.Serve(ln) // ErrServerClosed once the test ends
	}()
	t.Cleanup(func() {
		hs.Close()
		<-done
	})
	return ln.Addr().String()
}

func (f *fleet) run(fn func() error) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		if err := fn(); err != nil {
			f.errMu.Lock()
			f.errs = append(f.errs, err)
			f.errMu.Unlock()
		}
	}()
}

func (f *fleet) stop() {
	f.cancel()
	f.wg.Wait()
}

var httpClient = &http.Client{Timeout: 30 * time.Second}

// chat sends one chat completion through the gateway and reads the whole
// response; it returns the HTTP status.
func (f *gatewayClient) chat(ctx context.Context, model, prompt string, stream bool) (int, error) {
	body := map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "system", "content": systemPrompt}, {"role": "user", "content": prompt}},
		"max_tokens": 8 + rand.IntN(24),
		"stream":     stream,
	}
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	raw, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.gatewayURL+"/v1/chat/completions", bytes.NewReader(raw))
	if err != nil {
		return 0, err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp.StatusCode, &statusBody{body: string(b), err: err}
	}
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// statusBody carries a non-200 answer's body (and any read error) to the
// load report.
type statusBody struct {
	body string
	err  error
}

func (e *statusBody) Error() string { return fmt.Sprintf("body %q (%v)", e.body, e.err) }

// systemPrompt is shared by every request, so that the servers' prefix
// caches hit and the precise scorer has blocks to find.
var systemPrompt = strings.Repeat("You are a helpful assistant that answers questions about the kvgate fleet. ", 12)

// loadResult counts a load run's responses by status.
type loadResult struct {
	mu     sync.Mutex
	status map[int]int
	errors int
	// sample is one body per non-200 status.
	sample map[int]string
}

// load drives the fleet with workers concurrent clients until requests
// have been sent, for at least minDur (so that rates span several scrapes)
// and at most maxDur (a starved machine still ends): prompts with a shared
// prefix, half of them streamed, and every unknownEvery-th request for a
// model no server has (answered 404 by the model server). Counting
// requests rather than time keeps what the dashboards see the same on a
// slow machine.
func (f *gatewayClient) load(ctx context.Context, workers, requests int, minDur, maxDur time.Duration, unknownEvery int) *loadResult {
	res := &loadResult{status: map[int]int{}, sample: map[int]string{}}
	ctx, cancel := context.WithTimeout(ctx, maxDur)
	defer cancel()
	minEnd := time.Now().Add(minDur)
	var n atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for turn := 0; ctx.Err() == nil; turn++ {
				i := n.Add(1)
				if i > int64(requests) && time.Now().After(minEnd) {
					return
				}
				model := fleetModel
				if unknownEvery > 0 && i%int64(unknownEvery) == 0 {
					model = "no-such-model"
					f.unknownSent.Add(1)
				}
				prompt := fmt.Sprintf("session %d turn %d: %s", w, turn, strings.Repeat("tell me more. ", 1+turn%7))
				status, err := f.chat(ctx, model, prompt, i%2 == 0)
				res.mu.Lock()
				var sb *statusBody
				switch {
				case errors.As(err, &sb):
					res.status[status]++
					if _, ok := res.sample[status]; !ok {
						res.sample[status] = sb.body
					}
				case err != nil:
					if ctx.Err() == nil {
						res.errors++
					}
				default:
					res.status[status]++
				}
				res.mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

// modelessRequests sends n chat requests without a model and n whose model
// is not a string (the gateway's body-based routing counts both; the
// picker answers them), and returns their statuses.
func (f *gatewayClient) modelessRequests(ctx context.Context, n int) map[int]int {
	statuses := map[int]int{}
	for i := range 2 * n {
		body := `{"messages":[{"role":"user","content":"which model?"}],"max_tokens":4}`
		if i%2 == 1 {
			body = `{"model":7,"messages":[{"role":"user","content":"which model?"}],"max_tokens":4}`
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.gatewayURL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			statuses[0]++
			continue
		}
		req.Header.Set("content-type", "application/json")
		resp, err := httpClient.Do(req)
		if err != nil {
			statuses[0]++
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses[resp.StatusCode]++
	}
	return statuses
}
