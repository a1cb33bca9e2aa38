package netobs

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/internal/testutil/delaylink"
)

// attached returns a Tracker with its programs attached; it skips when not
// root. As root, a kernel that refuses the program fails the test: the
// machines `make test` runs on support sockops.
func attached(t *testing.T, cfg Config) *Tracker {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading eBPF programs needs root; make test runs as root")
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Attach(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Error(err)
		}
	})
	return tr
}

// scrape reads the tracker's metrics through the same handler the agent
// serves /metrics with.
func scrape(t *testing.T, tr *Tracker) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(tr)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %s: %s", resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mf
}

// sample finds name{peer, class}'s metric.
func sample(t *testing.T, mf map[string]*dto.MetricFamily, name, peer, class string) *dto.Metric {
	t.Helper()
	if f := mf[name]; f != nil {
		for _, m := range f.Metric {
			l := map[string]string{}
			for _, p := range m.Label {
				l[p.GetName()] = p.GetValue()
			}
			if l["peer"] == peer && l["class"] == class {
				return m
			}
		}
	}
	t.Fatalf("no %s{peer=%q,class=%q}", name, peer, class)
	return nil
}

var (
	ssRTT     = regexp.MustCompile(`\brtt:([0-9.]+)/`)
	ssRetrans = regexp.MustCompile(`\bretrans:[0-9]+/([0-9]+)`)
)

// ss runs `ss -tin` for the established flows of ns towards dst:port (or
// from its own port) and returns each flow's srtt and the total of their
// retransmits.
func ss(t *testing.T, l *delaylink.Link, ns, filter string) ([]time.Duration, uint64) {
	t.Helper()
	out, err := l.Exec(ns, "ss", "-tin", "state", "established", filter)
	if err != nil {
		t.Fatalf("ss: %v\n%s", err, out)
	}
	var rtts []time.Duration
	for _, m := range ssRTT.FindAllSubmatch(out, -1) {
		ms, _ := strconv.ParseFloat(string(m[1]), 64)
		rtts = append(rtts, time.Duration(ms*float64(time.Millisecond)))
	}
	var retrans uint64
	for _, m := range ssRetrans.FindAllSubmatch(out, -1) {
		n, _ := strconv.ParseUint(string(m[1]), 10, 64)
		retrans += n
	}
	return rtts, retrans
}

func mean(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s / time.Duration(len(ds))
}

// TestRTTMatchesSS is issue 17's check: flows between two namespaces over a
// veth pair with delay added by a TUN forwarder show in the metrics with
// the RTT `ss -ti` reports for the same flows (within 20%), on both ends.
func TestRTTMatchesSS(t *testing.T) {
	const (
		delay = 20 * time.Millisecond
		flows = 4
		port  = 7100
	)
	l := delaylink.New(t, delaylink.Options{Delay: delay})
	tr := attached(t, Config{Classes: []Class{{Name: "kv_test", Ranges: []PortRange{{port, port}}}}})
	ln, err := l.Listen(l.B, fmt.Sprintf("%s:%d", l.AddrB, port))
	if err != nil {
		t.Fatal(err)
	}
	defer delaylink.Echo(ln)()
	defer ln.Close()
	const rounds, msg = 25, 1024
	var sent uint64
	var cwg sync.WaitGroup
	errc := make(chan error, flows)
	for range flows {
		c, err := l.Dial(l.A, fmt.Sprintf("%s:%d", l.AddrB, port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cwg.Go(func() {
			buf := make([]byte, msg)
			for range rounds {
				if _, err := c.Write(buf); err != nil {
					errc <- err
					return
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					errc <- err
					return
				}
			}
		})
		sent += rounds * msg
	}
	cwg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	// The flows stay open and idle: once the last data is acked on both
	// ends their srtt no longer changes, so ss and the poll see the same.
	deadline := time.Now().Add(5 * time.Second)
	for {
		tr.poll(time.Now())
		done := 0
		for _, p := range tr.Peers() {
			if p.BytesAcked >= sent {
				done++
			}
		}
		if done == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mf := scrape(t, tr)
	for _, side := range []struct {
		ns, filter, peer string
	}{
		{l.A, "dst " + l.AddrB.String(), l.AddrB.String()},
		{l.B, fmt.Sprintf("sport = :%d", port), l.AddrA.String()},
	} {
		rtts, _ := ss(t, l, side.ns, side.filter)
		if len(rtts) != flows {
			t.Fatalf("%s: ss shows %d flows, want %d", side.ns, len(rtts), flows)
		}
		want := mean(rtts)
		got := time.Duration(sample(t, mf, "kvgate_netobs_tcp_smoothed_rtt_seconds", side.peer, "kv_test").GetGauge().GetValue() * float64(time.Second))
		t.Logf("%s → %s: metric srtt %v, ss mean %v (flows %v)", side.ns, side.peer, got, want, rtts)
		if r := math.Abs(float64(got-want)) / float64(want); r > 0.2 {
			t.Errorf("%s → %s: metric srtt %v differs from ss's %v by %.0f%%", side.ns, side.peer, got, want, 100*r)
		}
		if want < delay {
			t.Errorf("ss's rtt %v is below the added delay %v: the forwarder is not in the path", want, delay)
		}
		if n := sample(t, mf, "kvgate_netobs_tcp_flows", side.peer, "kv_test").GetGauge().GetValue(); n != flows {
			t.Errorf("%s: %v flows in the metric, want %d", side.peer, n, flows)
		}
		h := sample(t, mf, "kvgate_netobs_tcp_srtt_seconds", side.peer, "kv_test").GetHistogram()
		if h.GetSampleCount() < flows {
			t.Errorf("%s: %d RTT observations, want at least one per flow", side.peer, h.GetSampleCount())
		}
		if acked := sample(t, mf, "kvgate_netobs_tcp_bytes_acked_total", side.peer, "kv_test").GetCounter().GetValue(); uint64(acked) < sent {
			t.Errorf("%s: %v bytes acked, sent %d", side.peer, acked, sent)
		}
	}
	var ps *PeerStats
	for _, p := range tr.Peers() {
		if p.Peer == l.AddrB && p.Class == "kv_test" {
			ps = &p
		}
	}
	if ps == nil || ps.Flows != flows || ps.SRTT < delay || ps.MinRTT <= 0 || ps.MinRTT > ps.SRTT || ps.BytesAcked < sent {
		t.Fatalf("Peers() for %s: %+v", l.AddrB, ps)
	}
}

// TestRetransmitsMatchSS: segments the forwarder drops are retransmitted,
// and the counter matches ss's total for the flows.
func TestRetransmitsMatchSS(t *testing.T) {
	const port = 7101
	l := delaylink.New(t, delaylink.Options{Delay: 2 * time.Millisecond, DropEvery: 50})
	tr := attached(t, Config{Classes: []Class{{Name: "bulk", Ranges: []PortRange{{port, port}}}}})
	ln, err := l.Listen(l.B, fmt.Sprintf("%s:%d", l.AddrB, port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const total = 4 << 20
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		buf := make([]byte, total)
		_, err = io.ReadFull(c, buf)
		if err == nil {
			_, err = c.Write([]byte{1}) // all in: the sender may stop
		}
		got <- err
	}()
	c, err := l.Dial(l.A, fmt.Sprintf("%s:%d", l.AddrB, port))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(make([]byte, total)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	// The flow is half closed now (the server is done): ss shows it in
	// CLOSE-WAIT, and its counters no longer move.
	tr.poll(time.Now())
	out, err := l.Exec(l.A, "ss", "-tin", "dst", l.AddrB.String())
	if err != nil {
		t.Fatalf("ss: %v\n%s", err, out)
	}
	var want uint64
	for _, m := range ssRetrans.FindAllSubmatch(out, -1) {
		n, _ := strconv.ParseUint(string(m[1]), 10, 64)
		want += n
	}
	mf := scrape(t, tr)
	gotRetrans := uint64(sample(t, mf, "kvgate_netobs_tcp_retransmits_total", l.AddrB.String(), "bulk").GetCounter().GetValue())
	t.Logf("dropped %d segments; retransmits: metric %d, ss %d", l.Dropped(), gotRetrans, want)
	if want == 0 || l.Dropped() == 0 {
		t.Fatalf("no retransmits to compare (ss %d, dropped %d):\n%s", want, l.Dropped(), out)
	}
	if gotRetrans != want {
		t.Errorf("retransmits: metric %d, ss %d", gotRetrans, want)
	}
	// Closed, the flow's final values are counted and it leaves the map.
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	var ps PeerStats
	for {
		tr.poll(time.Now())
		for _, p := range tr.Peers() {
			if p.Peer == l.AddrB {
				ps = p
			}
		}
		if ps.Flows == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ps.Flows != 0 || ps.BytesAcked < total || ps.Retransmits != want {
		t.Errorf("after close: %+v, want no flows, at least %d bytes acked, %d retransmits", ps, total, want)
	}
	if tr.counts.flowsClosed == 0 || tr.counts.mapEntries != 0 {
		t.Errorf("closed flows %d, map entries %d", tr.counts.flowsClosed, tr.counts.mapEntries)
	}
}
