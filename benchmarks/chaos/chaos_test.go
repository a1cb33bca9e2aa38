package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// result is one check: what was done, whether the fleet held, and the
// figures measured.
type result struct {
	name   string
	held   bool
	detail string
}

func repoFile(rel string) string {
	dir, _ := os.Getwd()
	return filepath.Join(dir, "..", "..", rel)
}

func TestChaos(t *testing.T) {
	if os.Getenv("KVGATE_CHAOS") == "" {
		t.Skip("the long hostile-input and fault run; `make chaos` runs it")
	}
	bin := os.Getenv("KVGATE_BIN")
	if bin == "" {
		bin = repoFile("bin/kvgate")
	}
	wasm := os.Getenv("KVGATE_WASM")
	if wasm == "" {
		wasm = repoFile("bin/kvgate-filter.wasm")
	}
	tok := os.Getenv("KVGATE_TOKENIZER_DIR")
	if tok == "" {
		t.Fatal("KVGATE_TOKENIZER_DIR not set")
	}
	soak := 60 * time.Second
	if d, err := time.ParseDuration(os.Getenv("KVGATE_CHAOS_SOAK")); err == nil {
		soak = d
	}
	outage := 20 * time.Second
	if d, err := time.ParseDuration(os.Getenv("KVGATE_CHAOS_OUTAGE")); err == nil {
		outage = d
	}
	f := startFleet(t, bin, wasm, tok, 3)
	var results []result
	add := func(r result) {
		results = append(results, r)
		t.Logf("%-6s %s: %s", verdict(r.held), r.name, r.detail)
	}
	for _, check := range []func(*fleet) result{
		headerFlood, adminPath, stalledUploadsGateway, stalledStreamsPicker, pickerHeaderFlood,
		simKilled, simStopped,
	} {
		add(check(f))
	}
	add(pickerRestart(f, outage))
	add(soakRun(f, soak))
	add(lossyNetwork(t, bin, wasm, tok, 25*time.Millisecond, 25))
	add(lossyNetwork(t, bin, wasm, tok, 100*time.Millisecond, 8))
	add(agentKilled(t, bin, wasm, tok, "prefill"))
	add(agentKilled(t, bin, wasm, tok, "decode"))

	var b strings.Builder
	fmt.Fprintf(&b, "kvgate chaos run, %s, binary %s\n", time.Now().UTC().Format(time.RFC3339), bin)
	for _, r := range results {
		fmt.Fprintf(&b, "%-6s %s: %s\n", verdict(r.held), r.name, r.detail)
	}
	fmt.Print(b.String())
	if out := os.Getenv("KVGATE_CHAOS_OUT"); out != "" {
		_ = os.WriteFile(out, []byte(b.String()), 0o644)
	}
	for _, r := range results {
		if !r.held {
			t.Errorf("did not hold: %s", r.name)
		}
	}
}

func verdict(held bool) string {
	if held {
		return "HELD"
	}
	return "BROKE"
}

// statusCounts sends n completions and counts their statuses.
func (f *fleet) statusCounts(n int) map[int]int {
	out := map[int]int{}
	for i := range n {
		out[f.complete(context.Background(), fmt.Sprintf("request %d of a chaos check", i))]++
	}
	return out
}

func headerFlood(f *fleet) result {
	req, _ := http.NewRequest(http.MethodPost, f.gwURL+"/v1/completions", strings.NewReader(`{"model":"`+model+`","prompt":"x"}`))
	for range 5000 {
		req.Header.Add("x-a", "1")
	}
	start := time.Now()
	resp, err := f.client.Do(req)
	code := 0
	if err == nil {
		code = resp.StatusCode
		resp.Body.Close()
	}
	took := time.Since(start)
	after := f.complete(context.Background(), "after the flood")
	return result{"gateway header flood (one name x5,000)", code == 431 && after == 200,
		fmt.Sprintf("answered %d in %v; next request %d", code, took.Round(time.Millisecond), after)}
}

func adminPath(f *fleet) result {
	var codes []string
	ok := true
	for _, p := range []string{"/reset_prefix_cache", "/metrics", "/reset_prefix_cache/", "/%72eset_prefix_cache"} {
		resp, err := f.client.Post(f.gwURL+p, "application/json", strings.NewReader("{}"))
		code := 0
		if err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		ok = ok && code == 403
		codes = append(codes, fmt.Sprintf("%s=%d", p, code))
	}
	return result{"admin paths through the gateway", ok, strings.Join(codes, " ")}
}

// stalledUploadsGateway opens 40 uploads announcing 16 MB that send 15 MB
// and stop, and measures the gateway's memory.
func stalledUploadsGateway(f *fleet) result {
	const conns, sent, announced = 40, 15 << 20, 16 << 20
	before := rssMiB(f.gateway.pid())
	stop := make(chan struct{})
	peak := peakRSS(f.gateway.pid(), stop)
	var answered atomic.Int64
	var wg sync.WaitGroup
	var cs []net.Conn
	var mu sync.Mutex
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = 'a'
	}
	for range conns {
		wg.Go(func() {
			c, err := net.Dial("tcp", strings.TrimPrefix(f.gwURL, "http://"))
			if err != nil {
				return
			}
			mu.Lock()
			cs = append(cs, c)
			mu.Unlock()
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":%q,\"prompt\":\"", announced, model)
			_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			for w := 0; w < sent; w += len(chunk) {
				if _, err := c.Write(chunk); err != nil {
					break // the gateway answered and closed
				}
			}
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				answered.Add(1)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	during := f.complete(context.Background(), "during the stalled uploads")
	close(stop)
	p := <-peak
	mu.Lock()
	for _, c := range cs {
		_ = c.Close()
	}
	mu.Unlock()
	time.Sleep(500 * time.Millisecond)
	after := f.complete(context.Background(), "after the stalled uploads")
	return result{"40 stalled 15 MB uploads through the gateway", p < 1024 && after == 200,
		fmt.Sprintf("gateway RSS %.0f MiB before, peak %.0f MiB; %d of 40 refused early; small request during: %d, after: %d",
			before, p, answered.Load(), during, after)}
}

// stalledStreamsPicker opens 40 ext_proc streams straight to the picker,
// each sending 15 MB of body without its end.
func stalledStreamsPicker(f *fleet) result {
	conn, err := grpc.NewClient(f.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return result{"40 stalled 15 MB ext_proc streams", false, err.Error()}
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	before := rssMiB(f.picker.pid())
	stop := make(chan struct{})
	peak := peakRSS(f.picker.pid(), stop)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var refused atomic.Int64
	var wg sync.WaitGroup
	chunk := make([]byte, 62_000)
	for range 40 {
		wg.Go(func() {
			s, err := client.Process(ctx)
			if err != nil {
				return
			}
			_ = s.Send(headersMsg(false, ":method", "POST", ":path", "/v1/completions", "content-type", "application/json"))
			got := make(chan struct{})
			go func() {
				if m, err := s.Recv(); err == nil && m.GetImmediateResponse() != nil {
					refused.Add(1)
				}
				close(got)
			}()
			for sentBytes := 0; sentBytes < 15<<20; sentBytes += len(chunk) {
				if s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
					RequestBody: &extprocv3.HttpBody{Body: chunk}}}) != nil {
					break
				}
				select {
				case <-got:
					return
				default:
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	during := f.complete(context.Background(), "during the stalled streams")
	close(stop)
	p := <-peak
	cancel()
	time.Sleep(500 * time.Millisecond)
	after := f.complete(context.Background(), "after the stalled streams")
	return result{"40 stalled 15 MB ext_proc streams to the picker", p < 1024 && after == 200,
		fmt.Sprintf("picker RSS %.0f MiB before, peak %.0f MiB; %d of 40 refused (503); small request during: %d, after: %d",
			before, p, refused.Load(), during, after)}
}

func headersMsg(eos bool, kv ...string) *extprocv3.ProcessingRequest {
	hm := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: eos}}}
}

// pickerHeaderFlood sends four header lists with one name 160,000 times
// straight to the picker (H4) while normal traffic flows.
func pickerHeaderFlood(f *fleet) result {
	conn, err := grpc.NewClient(f.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		return result{"160,000 repeated headers to the picker", false, err.Error()}
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	kv := []string{":method", "POST", ":path", "/v1/completions"}
	for range 160_000 {
		kv = append(kv, "x-a", "1")
	}
	msg := headersMsg(true, kv...)
	start := time.Now()
	answers := make([]string, 4)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s, err := client.Process(ctx)
			if err != nil {
				answers[i] = "open: " + err.Error()
				return
			}
			if err := s.Send(msg); err != nil {
				answers[i] = "send: " + err.Error()
				return
			}
			m, err := s.Recv()
			switch {
			case err != nil:
				answers[i] = err.Error()
			case m.GetImmediateResponse() != nil:
				answers[i] = fmt.Sprint(m.GetImmediateResponse().GetStatus().GetCode().Number())
			default:
				answers[i] = "routed"
			}
		})
	}
	codes := f.statusCounts(20)
	wg.Wait()
	took := time.Since(start)
	return result{"4 x 160,000 repeated headers straight to the picker", codes[200] == 20 && answers[0] == "431",
		fmt.Sprintf("answers %v within %v; 20 normal requests meanwhile: %v", answers, took.Round(time.Millisecond), codes)}
}

// simKilled kills a simulator: requests in the first moments may still be
// routed to it (the picker notices within a few scrapes), after a second
// none may fail.
func simKilled(f *fleet) result {
	_ = f.sims[2].cmd.Process.Kill()
	first := f.timedCounts(time.Second, 10*time.Second)
	after := f.statusCounts(30)
	return result{"a simulator killed (SIGKILL)", after[200] == 30,
		fmt.Sprintf("requests in the first second: %v; 30 requests after it: %v", first, after)}
}

// simStopped stops a simulator (it accepts connections and never answers):
// requests already routed to it wait for the upstream idle timeout; once
// the scrapes have timed out for the failure window it gets no new ones.
func simStopped(f *fleet) result {
	victim := f.sims[1]
	_ = victim.cmd.Process.Signal(syscall.SIGSTOP)
	defer func() { _ = victim.cmd.Process.Signal(syscall.SIGCONT) }()
	first := f.timedCounts(3*time.Second, 2*time.Second)
	after := f.statusCounts(30)
	return result{"a simulator stopped (SIGSTOP)", after[200] == 30,
		fmt.Sprintf("requests in the first 3 s (2 s client timeout): %v; 30 requests after: %v", first, after)}
}

// timedCounts sends requests one after another for d, each under its own
// timeout, and counts their statuses (0: no answer in time).
func (f *fleet) timedCounts(d, each time.Duration) map[int]int {
	out := map[int]int{}
	for end := time.Now().Add(d); time.Now().Before(end); {
		ctx, cancel := context.WithTimeout(context.Background(), each)
		out[f.complete(ctx, "during a fault")]++
		cancel()
	}
	return out
}

// pickerRestart kills the picker, keeps traffic on the fallbacks for the
// outage (long enough for gRPC's default back-off to grow to several
// seconds), starts a new picker and measures how soon the gateway routes
// through it again.
func pickerRestart(f *fleet, outage time.Duration) result {
	_ = f.picker.cmd.Process.Kill()
	_, _ = f.picker.cmd.Process.Wait()
	down := map[int]int{}
	for end := time.Now().Add(outage); time.Now().Before(end); {
		down[f.complete(context.Background(), "picker down")]++
		time.Sleep(100 * time.Millisecond)
	}
	f.restartPicker()
	started := time.Now()
	f.waitHTTP(f.metrics)
	ready := time.Since(started)
	var routedAfter time.Duration
	for time.Since(started) < 60*time.Second {
		before := f.metric("inference_objective_request_total")
		f.complete(context.Background(), "after the picker restart")
		if f.metric("inference_objective_request_total") > before {
			routedAfter = time.Since(started)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return result{fmt.Sprintf("picker killed, restarted after %v", outage), len(down) == 1 && down[200] > 0 && routedAfter > 0 && routedAfter < 5*time.Second,
		fmt.Sprintf("requests while down: %v (fail-open); new picker serving metrics after %v, first routed request %v after its start",
			down, ready.Round(time.Millisecond), routedAfter.Round(time.Millisecond))}
}

// soakRun drives 4 clients for d and compares memory and goroutines at the
// start and the end.
func soakRun(f *fleet, d time.Duration) result {
	gw0, ep0 := rssMiB(f.gateway.pid()), rssMiB(f.picker.pid())
	gor0 := f.metric("go_goroutines")
	var ok, bad atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				prompt := fmt.Sprintf("soak client %d shared system prompt about caching; turn %d", c, i%50)
				if f.complete(context.Background(), prompt) == 200 {
					ok.Add(1)
				} else {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(time.Second)
	gw1, ep1 := rssMiB(f.gateway.pid()), rssMiB(f.picker.pid())
	gor1 := f.metric("go_goroutines")
	return result{fmt.Sprintf("soak, 4 clients for %v", d), bad.Load() == 0 && gor1 <= gor0+20,
		fmt.Sprintf("%d ok, %d failed; gateway RSS %.0f -> %.0f MiB, picker RSS %.0f -> %.0f MiB, picker goroutines %.0f -> %.0f",
			ok.Load(), bad.Load(), gw0, gw1, ep0, ep1, gor0, gor1)}
}
