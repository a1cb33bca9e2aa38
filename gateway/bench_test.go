package gateway_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/gateway"
)

// BenchmarkGatewayOverhead is the latency the gateway adds per request over
// loopback: each iteration sends one request straight to the upstream and
// one through the gateway (filter, picker, upstream), and the difference is
// reported as added-µs/req.
//
//	go test -run XXX -bench GatewayOverhead ./gateway
func BenchmarkGatewayOverhead(b *testing.B) {
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("hello world ", 1300) + `"}]}` // ~16 KB
	for _, tc := range []struct {
		name   string
		mode   gateway.BodyMode
		filter bool
	}{
		{"full-duplex", gateway.FullDuplexStreamed, false},
		{"full-duplex+filter", gateway.FullDuplexStreamed, true},
		{"headers-only+filter", gateway.None, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			up := newUpstream(b, nil)
			go func() {
				for range up.got {
				}
			}()
			cfg := gateway.Config{ExtProc: startPicker(b, &testPicker{endpoints: up.addr()}), RequestBodyMode: tc.mode}
			if tc.filter {
				cfg = withFilter(b, cfg, "")
			}
			url := startGateway(b, cfg)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			do := func(base string) time.Duration {
				start := time.Now()
				resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
				return time.Since(start)
			}
			var direct, via time.Duration
			for b.Loop() {
				direct += do(up.URL)
				via += do(url)
			}
			n := float64(b.N)
			b.ReportMetric(float64(direct.Microseconds())/n, "direct-µs/req")
			b.ReportMetric(float64(via.Microseconds())/n, "gateway-µs/req")
			b.ReportMetric(float64((via-direct).Microseconds())/n, "added-µs/req")
		})
	}
}
