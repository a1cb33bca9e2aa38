package dashboards

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/agent/kvblock"
	"github.com/kvgate/kvgate/internal/testutil"
	"github.com/kvgate/kvgate/internal/testutil/delaylink"
	"github.com/kvgate/kvgate/internal/testutil/proctest"
	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// agentBinary is KVGATE_BIN_DIR's kvgate-agent, or one built here.
func agentBinary(t *testing.T) string { return repoBinary(t, "kvgate-agent", "./cmd/kvgate-agent") }

// repoBinary is KVGATE_BIN_DIR's name (`make test` has just built it), or
// pkg built into a temporary directory.
func repoBinary(t *testing.T, name, pkg string) string {
	t.Helper()
	if bd := os.Getenv("KVGATE_BIN_DIR"); bd != "" {
		p := filepath.Join(bd, name)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("KVGATE_BIN_DIR: %v", err)
		}
		return p
	}
	p := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", p, pkg)
	cmd.Dir = testutil.RepoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", name, err, out)
	}
	return p
}

var (
	agentListening = regexp.MustCompile(`kvgate-agent \S+ listening on (\S+)`)
	agentMetrics   = regexp.MustCompile(`kvgate-agent metrics on (\S+)`)
)

// liveAgent is a running kvgate-agent process.
type liveAgent struct {
	*proctest.Proc
	addr, metrics string
	regionDir     string // the agent's --region-dir, where region files must lie
	client        agentv1.KVTransferClient
}

// startAgent runs bin with args and waits for its gRPC address; the
// metrics address (--metrics-addr) is printed before it.
func startAgent(t *testing.T, bin string, env []string, args ...string) *liveAgent {
	t.Helper()
	dir := t.TempDir()
	p, addr := proctest.Start(t, agentListening, env, bin, append([]string{"--region-dir", dir}, args...)...)
	a := &liveAgent{Proc: p, addr: addr, regionDir: dir}
	if m := agentMetrics.FindStringSubmatch(p.Log.String()); m != nil {
		a.metrics = m[1]
	}
	conn, err := grpc.NewClient(a.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	a.client = agentv1.NewKVTransferClient(conn)
	return a
}

func (a *liveAgent) region(t *testing.T, engine string, blockBytes, slots int) {
	t.Helper()
	path := filepath.Join(a.regionDir, engine)
	mem, err := kvblock.Map(path, blockBytes*slots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kvblock.Unmap(mem) })
	if _, err := a.client.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: engine, Path: path,
		BlockBytes: uint64(blockBytes), Slots: uint32(slots)}); err != nil {
		t.Fatal(err)
	}
}

// TestNetworkDashboardOnLiveAgent evaluates every query of the network
// dashboard (kvgate-network.json in grafanaDir) against a real Prometheus that
// scraped a real kvgate-agent with eBPF tracking on, while it pulled KV
// blocks from a peer agent over UCX/TCP and TCP flows crossed a delayed
// veth link between two network namespaces: each query must return data.
func TestNetworkDashboardOnLiveAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts agents and prometheus; skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("the agent's eBPF tracking needs root; make test runs as root")
	}
	promBin := prometheusBinary(t)
	f, err := os.Open(filepath.Join(grafanaDir, "kvgate-network.json"))
	if err != nil {
		t.Fatal(err)
	}
	panels, err := ParseGrafana(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	bin := agentBinary(t)
	// UCX's TCP transport listens in this range, so the KV class sees it;
	// per process, so that parallel test packages do not collide.
	lo := 21000 + (os.Getpid()%200)*20
	ucxEnv := []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=lo", fmt.Sprintf("UCX_TCP_PORT_RANGE=%d-%d", lo, lo+19)}
	const ingressPort = 8000
	src := startAgent(t, bin, ucxEnv, "--listen", "127.0.0.1:0", "--cpu-bytes", "0")
	dst := startAgent(t, bin, ucxEnv, "--listen", "127.0.0.1:0", "--cpu-bytes", "0", "--metrics-addr", "127.0.0.1:0",
		"--netobs", "--netobs-interval", "200ms",
		"--netobs-class", fmt.Sprintf("kv_ucx_tcp=%d-%d", lo, lo+19),
		"--netobs-class", fmt.Sprintf("model_ingress=%d", ingressPort))
	if dst.metrics == "" {
		t.Fatalf("no metrics address in the agent's output:\n%s", dst.Log.String())
	}
	if strings.Contains(dst.Log.String(), "running without eBPF") {
		t.Fatalf("the agent runs without eBPF:\n%s", dst.Log.String())
	}
	prom := startPrometheus(t, promBin, []scrapeTarget{{Job: "kvgate-agent", Addr: dst.metrics}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := prom.awaitHealthy(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}

	const blockBytes, slots = 64 << 10, 64
	src.region(t, "P", blockBytes, slots)
	dst.region(t, "D", blockBytes, slots)
	link := delaylink.New(t, delaylink.Options{Delay: 5 * time.Millisecond, DropEvery: 40})
	ln, err := link.Listen(link.B, fmt.Sprintf("%s:%d", link.AddrB, ingressPort))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer delaylink.Echo(ln)()
	defer ln.Close()

	loadStart := time.Now()
	loadCtx, stopLoad := context.WithTimeout(ctx, 5*time.Second)
	defer stopLoad()
	for range 3 { // ingress flows: echoes of 64 KiB
		c, err := link.Dial(link.A, fmt.Sprintf("%s:%d", link.AddrB, ingressPort))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 64<<10)
			for loadCtx.Err() == nil {
				if _, err := c.Write(buf); err != nil {
					return
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
			}
		})
	}
	pulls := 0
	for i := 0; loadCtx.Err() == nil; i++ {
		hashes := []uint64{uint64(4*i + 1), uint64(4*i + 2), uint64(4*i + 3), uint64(4*i + 4)}
		req := fmt.Sprintf("req-%d", i)
		st, err := src.client.StoreBlocks(ctx, &agentv1.StoreBlocksRequest{EngineId: "P", Hashes: hashes,
			Hold: &agentv1.Hold{RequestId: req, LeaseMs: 30000}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dst.client.PullBlocks(ctx, &agentv1.PullBlocksRequest{EngineId: "D", Peer: src.addr, Hashes: hashes,
			Source: &agentv1.PullBlocksRequest_Prefill{Prefill: &agentv1.PrefillSource{RemoteEngineId: "P",
				RemoteRequestId: req, RemoteBlockIds: st.Slots, TpSize: 1}}}); err != nil {
			t.Fatalf("pull %d: %v\nagent:\n%s", i, err, dst.Log.String())
		}
		pulls++
		time.Sleep(20 * time.Millisecond)
	}
	stopLoad()
	t.Logf("%d pulls of %d KiB; delayed link: %d packets forwarded, %d dropped", pulls, 4*blockBytes>>10, link.Forwarded(), link.Dropped())
	// Two scrapes after the load, so that its last samples are in.
	if err := prom.awaitHealthy(ctx, time.Now().Add(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	window := fmt.Sprintf("%ds", int(time.Since(loadStart).Seconds())+10)
	vars := map[string]string{"instance": ".+", "class": ".+", "__rate_interval": window, "datasource": "prometheus"}
	n := 0
	for _, p := range panels {
		for _, e := range p.Exprs {
			q, missing := Substitute(e, vars)
			if len(missing) > 0 {
				t.Fatalf("%s: no value for template variables %v", p.Title, missing)
			}
			r, err := prom.query(ctx, q)
			n++
			switch {
			case err != nil:
				t.Errorf("%s / %s: %v: %s", p.Row, p.Title, err, q)
			case r.Valued == 0:
				t.Errorf("%s / %s: no data (%d series): %s", p.Row, p.Title, r.Series, q)
			}
		}
	}
	// The series behind the panels: both link ends, the UCX class, NIXL,
	// and retransmits the dropped segments caused.
	for _, q := range []string{
		`kvgate_netobs_bpf_attached == 1`,
		fmt.Sprintf(`kvgate_netobs_tcp_smoothed_rtt_seconds{peer=%q, class="model_ingress"} > 0.005`, link.AddrB),
		fmt.Sprintf(`kvgate_netobs_tcp_srtt_seconds_count{peer=%q, class="model_ingress"} > 0`, link.AddrA),
		`kvgate_netobs_tcp_bytes_acked_total{peer="127.0.0.1", class="kv_ucx_tcp"} > 0`,
		fmt.Sprintf(`kvgate_netobs_kv_transfers_total{peer="127.0.0.1", class="kv_nixl", result="ok"} == %d`, pulls),
		`sum(kvgate_netobs_tcp_retransmits_total{class="model_ingress"}) > 0`,
	} {
		if r, err := prom.query(ctx, q); err != nil || r.Valued == 0 {
			t.Errorf("%s: nothing (%v)", q, err)
		}
	}
	t.Logf("%d queries of %d panels evaluated", n, len(panels))
}
