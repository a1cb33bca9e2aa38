package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvgate/kvgate/demo/proc"
	"github.com/kvgate/kvgate/extproc/config"
	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/extproc/endpoints/staticfile"
	"github.com/kvgate/kvgate/internal/kvhash"
	"github.com/kvgate/kvgate/sidecar"
	"github.com/kvgate/kvgate/sim/engine"
	"github.com/kvgate/kvgate/sim/vllmserver"
)

// Deciders of a P/D fleet's disagg-profile-handler (--pd-decider).
const (
	DeciderAlways       = "always"
	DeciderPrefix       = "prefix"
	DeciderTransferCost = "transfer-cost"
)

// pdPreset is the engine preset of the P/D fleet's simulators.
const pdPreset = "qwen3-0.6b-h100"

// RoleLabel is llm-d's pod role label, which the picker's prefill-filter
// and decode-filter read.
const RoleLabel = "llm-d.ai/role"

// PDShape is an xPyD fleet: x prefill and y decode servers, and with
// Encode an E/P/D fleet's encode servers.
type PDShape struct{ Encode, Prefill, Decode int }

func (s PDShape) String() string {
	if s.Encode > 0 {
		return fmt.Sprintf("%dE%dP%dD", s.Encode, s.Prefill, s.Decode)
	}
	return fmt.Sprintf("%dP%dD", s.Prefill, s.Decode)
}

var pdShapeRe = regexp.MustCompile(`^(?i)([0-9]+)p([0-9]+)d$`)

// ParsePDShape reads "1P2D" (any xPyD, case-insensitive).
func ParsePDShape(s string) (PDShape, error) {
	m := pdShapeRe.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return PDShape{}, fmt.Errorf("--pd %q: want xPyD, e.g. 1P2D", s)
	}
	p, _ := strconv.Atoi(m[1])
	d, _ := strconv.Atoi(m[2])
	if p < 1 || d < 1 || p+d > 32 {
		return PDShape{}, fmt.Errorf("--pd %q: want 1..31 prefill and decode servers, 32 in all", s)
	}
	return PDShape{Prefill: p, Decode: d}, nil
}

// PDConfig describes a P/D fleet: per prefill server a `kvgate sim --role
// prefill` with its node agent; per decode server a `kvgate sim --role
// decode` with its agent and a `kvgate sidecar` in front; the picker with
// disagg-profile-handler; the gateway.
type PDConfig struct {
	StackConfig
	Shape PDShape
	// AgentBin is kvgate-agent (default: beside Bin).
	AgentBin string
	// Decider is DeciderAlways, DeciderPrefix (prefix-based-pd-decider
	// with NonCachedTokens) or DeciderTransferCost
	// (transfer-cost-pd-decider, given the simulators' KV size and prefill
	// rate).
	Decider         string
	NonCachedTokens int
	// KVBytesPerToken sizes the KV the agents move (0: the model's real
	// size).
	KVBytesPerToken int
	// KVRegionDir holds the simulators' shared regions (default /dev/shm).
	KVRegionDir string
	// KVConnector is the sidecars' --kv-connector: "" or nixlv2 (NIXL
	// READs through the agents), offloading or shared-storage (the sims'
	// OffloadingConnector p2p tiers or SharedStorageConnector folder,
	// LogDir/shared-kv; no agents). offloading takes one prefill server:
	// the sidecars name every prefiller's tier by one port, and on one
	// machine the prefillers share a host.
	KVConnector string
}

// agents reports whether the fleet moves KV through node agents.
func (c PDConfig) agents() bool { return viaAgents(c.KVConnector) }

// nodeAgents is how many node agents the fleet runs: one per prefill and
// decode server, none when a KV connector moves the KV.
func (c PDConfig) nodeAgents() int {
	if !c.agents() {
		return 0
	}
	return c.Shape.Prefill + c.Shape.Decode
}

func viaAgents(connector string) bool {
	return connector == "" || connector == sidecar.ConnectorNIXLV2
}

// checkKVConnector refuses a --kv-connector the fleet of shape cannot run
// with.
func checkKVConnector(connector string, shape PDShape) error {
	switch connector {
	case "", sidecar.ConnectorNIXLV2, sidecar.ConnectorSharedStorage:
	case sidecar.ConnectorOffloading:
		if shape.Prefill != 1 {
			return fmt.Errorf("--kv-connector offloading: %d prefill servers, want 1 (the sidecars name every prefiller's p2p tier by one port, and on one machine the prefillers share a host)", shape.Prefill)
		}
	default:
		return fmt.Errorf("--kv-connector %q: want %s, %s or %s", connector, sidecar.ConnectorNIXLV2, sidecar.ConnectorOffloading, sidecar.ConnectorSharedStorage)
	}
	return nil
}

// kvPath says how a fleet with connector moves the KV, for its reports.
func kvPath(connector string) string {
	switch connector {
	case sidecar.ConnectorOffloading:
		return "fetched by each decode sim from the prefill sim's OffloadingConnector p2p tier, no node agents"
	case sidecar.ConnectorSharedStorage:
		return "written to and loaded from the sims' SharedStorageConnector folder, no node agents"
	}
	return "NIXL READ through the node agents, over UCX on loopback"
}

// kvTransferConfig is a simulator's --kv-transfer-config for the
// connector, with its p2p tier (offloading) on p2pPort.
func (c PDConfig) kvTransferConfig(p2pPort int) string {
	switch c.KVConnector {
	case sidecar.ConnectorOffloading:
		return fmt.Sprintf(`{"kv_connector":%q,"kv_role":"kv_both","kv_connector_extra_config":{"spec_name":"TieringOffloadingSpec",`+
			`"cpu_bytes_to_use":%d,"secondary_tiers":[{"type":"p2p","host":"127.0.0.1","port":%d}]}}`, vllmserver.ConnectorOffloading, 64<<20, p2pPort)
	case sidecar.ConnectorSharedStorage:
		return fmt.Sprintf(`{"kv_connector":%q,"kv_role":"kv_both","kv_connector_extra_config":{"shared_storage_path":%q}}`,
			vllmserver.ConnectorSharedStorage, filepath.Join(c.LogDir, "shared-kv"))
	}
	return ""
}

// Sidecar is one running routing sidecar.
type Sidecar struct {
	Name    string
	Addr    string // the decode pod's address: what the picker routes to
	Metrics string // its own /metrics
	Decoder string // the decode sim behind it
	Proc    *proc.Proc
}

// PDStack is a running P/D fleet. Stack.Sims lists the prefill sims, the
// decode sims (their own addresses, for the counters), then the encode
// sims.
type PDStack struct {
	*Stack
	Encode, Prefill, Decode []Sim
	Agents                  []Sim
	Sidecars                []Sidecar
	// KVConnector is the sidecars' --kv-connector ("": nixlv2).
	KVConnector string
}

// pdConfig is the picker's configuration: llm-d's sim P/D config (deploy/
// config/sim-pd-epp-config.yaml) with the chosen decider, and with encode
// its encode stage (sim-e-p-d-epp-config.yaml: encode-filter,
// always-disagg-multimodal-decider). The transfer-cost decider is told
// what an operator would tell it of the hardware: the KV bytes a token
// occupies (kvBytesPerToken, as the agents move them; 0: the model's) and
// the servers' prefill rate, the simulators' preset at timeScale; the
// network it reads from the agents.
func pdConfig(decider string, nonCached, kvBytesPerToken int, timeScale float64, encode bool) (string, error) {
	dec := "- type: always-disagg-pd-decider\n"
	name := "always-disagg-pd-decider"
	switch decider {
	case DeciderAlways:
	case DeciderPrefix:
		if nonCached < 1 {
			return "", fmt.Errorf("--pd-non-cached-tokens %d: prefix-based-pd-decider needs at least 1 (0 never disaggregates)", nonCached)
		}
		dec = fmt.Sprintf("- type: prefix-based-pd-decider\n  parameters:\n    nonCachedTokens: %d\n", nonCached)
		name = "prefix-based-pd-decider"
	case DeciderTransferCost:
		preset, ok := engine.LookupPreset(pdPreset)
		if !ok {
			return "", fmt.Errorf("the P/D simulators' preset %q is unknown", pdPreset)
		}
		if !(timeScale > 0) {
			return "", fmt.Errorf("--time-scale %v must be positive", timeScale)
		}
		if kvBytesPerToken <= 0 {
			kvBytesPerToken = int(preset.Model.KVBytesPerToken())
		}
		// A 2048-token prefill step of the preset, slowed as the
		// simulators are.
		const n = 2048
		step := preset.StepDuration(engine.Shape{PrefillTokens: n, SampledSeqs: 1, ContextTokens: n}).Seconds() / timeScale
		dec = fmt.Sprintf("- type: transfer-cost-pd-decider\n  parameters:\n    kvBytesPerToken: %d\n    prefillTokensPerSecond: %.6g\n", kvBytesPerToken, n/step)
		name = "transfer-cost-pd-decider"
	default:
		return "", fmt.Errorf("--pd-decider %q: want always, prefix or transfer-cost", decider)
	}
	profile := func(n, filter string) string {
		return "- name: " + n + "\n  plugins:\n  - pluginRef: " + filter + "\n  - pluginRef: max-score-picker\n" +
			"  - pluginRef: prefix-cache-scorer\n    weight: 2\n  - pluginRef: queue-scorer\n    weight: 1\n"
	}
	encPlugins, encDecider, encProfile := "", "", ""
	if encode {
		encPlugins = "- type: encode-filter\n- type: always-disagg-multimodal-decider\n"
		encDecider = "      encode: always-disagg-multimodal-decider\n"
		encProfile = "- name: encode\n  plugins:\n  - pluginRef: encode-filter\n  - pluginRef: max-score-picker\n  - pluginRef: queue-scorer\n    weight: 1\n"
	}
	return "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n" +
		"- type: prefix-cache-scorer\n  parameters:\n    blockSizeTokens: " + strconv.Itoa(kvhash.DefaultBlockSize) + "\n    maxPrefixBlocksToMatch: 256\n    lruCapacityPerServer: 31250\n" +
		"- type: queue-scorer\n- type: prefill-filter\n- type: decode-filter\n- type: max-score-picker\n" + dec + encPlugins +
		"- type: disagg-profile-handler\n  parameters:\n    deciders:\n      prefill: " + name + "\n" + encDecider +
		"schedulingProfiles:\n" + encProfile + profile("prefill", "prefill-filter") + profile("decode", "decode-filter"), nil
}

// StartPDStack starts a P/D fleet and waits until the gateway can route.
func StartPDStack(ctx context.Context, c PDConfig) (*PDStack, error) {
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
	if c.AgentBin == "" {
		c.AgentBin = filepath.Join(filepath.Dir(c.Bin), "kvgate-agent")
	}
	if err := checkKVConnector(c.KVConnector, c.Shape); err != nil {
		return nil, err
	}
	cfg, err := pdConfig(c.Decider, c.NonCachedTokens, c.KVBytesPerToken, c.TimeScale, c.Shape.Encode > 0)
	if err != nil {
		return nil, err
	}
	return withFreshPorts(c.Progress, func() (*PDStack, error) { return startPDFleet(ctx, c, cfg) })
}

// startPDFleet is one start of StartPDStack's fleet, with its picker
// config cfg.
func startPDFleet(ctx context.Context, c PDConfig, cfg string) (_ *PDStack, err error) {
	g, err := proc.NewGroup(c.LogDir)
	if err != nil {
		return nil, err
	}
	s := &PDStack{Stack: &Stack{group: g}, KVConnector: c.KVConnector}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	np, nd, ne := c.Shape.Prefill, c.Shape.Decode, c.Shape.Encode
	ports, err := freePorts(5 + 3*np + 5*nd + ne) // a p2p tier's port per P/D server
	if err != nil {
		return nil, err
	}
	fp := fleetPorts{kvEvents: ports[0], grpc: ports[1], health: ports[2], metrics: ports[3], gateway: ports[4]}
	next := 5
	port := func() int { next++; return ports[next-1] }
	ucxEnv := []string{"UCX_TLS=tcp", "UCX_NET_DEVICES=lo"}
	start := func(name, path string, args, env []string) (*proc.Proc, error) {
		return s.group.Start(proc.Spec{Name: name, Path: path, Args: args, Env: env})
	}
	// Agents first: a simulator registers its region with its agent as it
	// starts.
	agentArgs := func(addr string) []string {
		args := []string{"--listen", addr, "--cpu-bytes", strconv.Itoa(64 << 20)}
		if c.KVRegionDir != "" {
			// The agent maps only region files below its --region-dir.
			args = append(args, "--region-dir", c.KVRegionDir)
		}
		return args
	}
	for i := range c.nodeAgents() {
		name := fmt.Sprintf("agent-p%d", i)
		if i >= np {
			name = fmt.Sprintf("agent-d%d", i-np)
		}
		a := Sim{Name: name, Addr: loopback(port())}
		if a.Proc, err = start(a.Name, c.AgentBin, agentArgs(a.Addr), ucxEnv); err != nil {
			return nil, err
		}
		s.Agents = append(s.Agents, a)
		s.others = append(s.others, a.Proc)
	}
	rctx, cancel := context.WithTimeout(ctx, c.Ready)
	defer cancel()
	for _, a := range s.Agents {
		if err := s.await(rctx, a.Name, func(ctx context.Context) error { return dialOK(ctx, a.Addr) }); err != nil {
			return nil, err
		}
	}
	if len(s.Agents) > 0 {
		c.Progress(fmt.Sprintf("%d node agents ready", len(s.Agents)))
	} else {
		c.Progress("KV " + kvPath(c.KVConnector))
	}
	p2pPort := 0 // the prefill server's p2p tier (offloading)
	simOpts := func(i int, role vllmserver.Role) vllmserver.Options {
		o := vllmserver.DefaultOptions()
		o.Host, o.Port = "127.0.0.1", port()
		o.Model, o.TokenizerDir, o.Preset, o.BlockSize, o.HashSeed = Model, c.TokenizerDir, pdPreset, kvhash.DefaultBlockSize, c.HashSeed
		o.NumGPUBlocks, o.TimeScale, o.Seed, o.Role = c.NumGPUBlocks, c.TimeScale, uint64(i+1), role
		o.KVBytesPerToken = c.KVBytesPerToken
		if c.agents() {
			o.Agent, o.KVRegionDir = s.Agents[i].Addr, c.KVRegionDir
			return o
		}
		if role == vllmserver.RoleEncode {
			return o // no KV connector
		}
		tier := port()
		o.KVTransferConfig = c.kvTransferConfig(tier)
		if role == vllmserver.RolePrefill && c.KVConnector == sidecar.ConnectorOffloading {
			p2pPort = tier
		}
		return o
	}
	for i := range np + nd {
		role, name := vllmserver.RolePrefill, fmt.Sprintf("prefill-%d", i)
		if i >= np {
			role, name = vllmserver.RoleDecode, fmt.Sprintf("decode-%d", i-np)
		}
		o := simOpts(i, role)
		sim := Sim{Name: name, Addr: loopback(o.Port)}
		if sim.Proc, err = start(name, c.Bin, append(append([]string{"sim"}, o.Args()...), c.SimArgs...), nil); err != nil {
			return nil, err
		}
		if role == vllmserver.RolePrefill {
			s.Prefill = append(s.Prefill, sim)
		} else {
			s.Decode = append(s.Decode, sim)
		}
		s.Sims = append(s.Sims, sim)
	}
	// Encode servers need no agent: their outputs travel by
	// ec_transfer_params.
	for i := range ne {
		o := simOpts(0, vllmserver.RoleEncode)
		o.Agent, o.KVBytesPerToken, o.KVRegionDir, o.Seed = "", 0, "", uint64(100+i)
		sim := Sim{Name: fmt.Sprintf("encode-%d", i), Addr: loopback(o.Port)}
		if sim.Proc, err = start(sim.Name, c.Bin, append([]string{"sim"}, o.Args()...), nil); err != nil {
			return nil, err
		}
		s.Encode = append(s.Encode, sim)
		s.Sims = append(s.Sims, sim)
	}
	// The pool: encode and prefill servers and the decode pods' sidecars,
	// by role; the picker and every sidecar (SSRF protection) read the
	// same file.
	specs := make([]endpoints.Spec, 0, ne+np+nd)
	for _, e := range s.Encode {
		specs = append(specs, endpoints.Spec{Name: e.Name, Address: e.Addr, Labels: map[string]string{RoleLabel: "encode"}})
	}
	for _, p := range s.Prefill {
		specs = append(specs, endpoints.Spec{Name: p.Name, Address: p.Addr, Labels: map[string]string{RoleLabel: "prefill"}})
	}
	for i, d := range s.Decode {
		sc := Sidecar{Name: fmt.Sprintf("sidecar-%d", i), Addr: loopback(port()), Metrics: loopback(port()), Decoder: d.Addr}
		s.Sidecars = append(s.Sidecars, sc)
		specs = append(specs, endpoints.Spec{Name: d.Name, Address: sc.Addr, Labels: map[string]string{RoleLabel: "decode"}})
	}
	file, err := staticfile.Marshal(specs)
	if err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	epFile := filepath.Join(c.LogDir, "endpoints.yaml")
	if err := os.WriteFile(epFile, file, 0o644); err != nil {
		return nil, fmt.Errorf("endpoints file: %w", err)
	}
	for i := range s.Sidecars {
		sc := &s.Sidecars[i]
		o := sidecar.DefaultOptions()
		o.InferencePool = ""
		o.Host, o.Port = "127.0.0.1", portOf(sc.Addr)
		o.ModelServerPort, o.MetricsPort = portOf(sc.Decoder), portOf(sc.Metrics)
		o.SecureServing, o.EndpointsFile = false, epFile
		if ne > 0 {
			o.ECConnector = sidecar.ECConnectorNIXL
		}
		if c.KVConnector != "" {
			o.KVConnector = c.KVConnector
		}
		if p2pPort > 0 {
			o.P2PConnectorPort = p2pPort
		}
		if sc.Proc, err = start(sc.Name, c.Bin, append([]string{"sidecar"}, o.Args()...), nil); err != nil {
			return nil, err
		}
		s.others = append(s.others, sc.Proc)
	}
	eo := c.eppOptions(epFile, cfg, fp)
	eo.KVEventsAddr = "" // the approximate prefix scorer learns from the picker's own choices
	if s.EPP, err = start("epp", c.Bin, append([]string{"epp"}, eo.Args()...), nil); err != nil {
		return nil, err
	}
	s.EPPMetricsURL = "http://" + eo.MetricsAddr + "/metrics"
	c.Policy = config.PolicyApprox // the gateway sends the picker the body
	if err := s.startGateway(c.StackConfig, fp); err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: time.Second}
	for _, sim := range s.Sims {
		if err := s.await(rctx, sim.Name, func(ctx context.Context) error { return httpOK(ctx, client, "http://"+sim.Addr+"/health") }); err != nil {
			return nil, err
		}
	}
	for _, sc := range s.Sidecars {
		if err := s.await(rctx, sc.Name, func(ctx context.Context) error { return httpOK(ctx, client, "http://"+sc.Addr+"/health") }); err != nil {
			return nil, err
		}
	}
	c.Progress(fmt.Sprintf("%d encode, %d prefill and %d decode sims, %d sidecars ready", ne, np, nd, nd))
	if err := s.await(rctx, "epp", func(ctx context.Context) error { return grpcServing(ctx, loopback(fp.health)) }); err != nil {
		return nil, err
	}
	if err := s.await(rctx, "gateway", func(ctx context.Context) error { return dialOK(ctx, loopback(fp.gateway)) }); err != nil {
		return nil, err
	}
	c.Progress("epp (disagg-profile-handler) and gateway ready on " + s.GatewayURL)
	return s, nil
}

func portOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

func dialOK(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err == nil {
		conn.Close()
	}
	return err
}

// PDPair is how many requests one prefill server handed to one decode pod.
type PDPair struct {
	Prefill  string  `json:"prefill"`
	Decode   string  `json:"decode"`
	Requests float64 `json:"requests"`
}

// PDTransfers is what one decode server pulled through its agent, or
// loaded through its KV connector.
type PDTransfers struct {
	Decode         string  `json:"decode"`
	Pulls          float64 `json:"pulls"`
	Bytes          float64 `json:"bytes"`
	BytesPerPull   float64 `json:"bytes_per_pull"`
	Failures       float64 `json:"pull_failures"`
	VerifyFailures float64 `json:"verify_failures"`
	// Sizes is the bytes-per-transfer histogram (vllm:nixl_bytes_transferred):
	// upper bound in bytes → transfers at most that large.
	Sizes map[string]float64 `json:"bytes_per_transfer_histogram"`
}

// PDEncoder is what one encode server did: encoder passes run and
// multimodal items served from its cache.
type PDEncoder struct {
	Encode    string  `json:"encode"`
	Runs      float64 `json:"encoder_runs"`
	CacheHits float64 `json:"cache_hits"`
}

// PDReport is a P/D run's data-plane view.
type PDReport struct {
	Pairs     []PDPair      `json:"pairs"`
	Transfers []PDTransfers `json:"transfers"`
	Encoders  []PDEncoder   `json:"encoders,omitempty"`
	// RemoteEncoded counts the prefill servers' items whose encoder output
	// came from an encode server.
	RemoteEncoded float64 `json:"remote_encoded"`
}

// TotalPulls sums the decode servers' verified pulls.
func (r PDReport) TotalPulls() (pulls, bytes, verifyFailures float64) {
	for _, t := range r.Transfers {
		pulls, bytes, verifyFailures = pulls+t.Pulls, bytes+t.Bytes, verifyFailures+t.VerifyFailures
	}
	return
}

// Collect reads the sidecars' P/D pairs and the decode servers' transfer
// counters.
func (s *PDStack) Collect(ctx context.Context) (PDReport, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	var r PDReport
	byAddr := map[string]string{}
	for _, p := range s.Prefill {
		byAddr[p.Addr] = p.Name
	}
	for i, sc := range s.Sidecars {
		fams, err := families(ctx, client, sc.Metrics)
		if err != nil {
			return r, fmt.Errorf("%s: %w", sc.Name, err)
		}
		for _, m := range fams["kvgate_sidecar_pd_requests_total"].GetMetric() {
			name := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "prefiller" {
					name = byAddr[l.GetValue()]
					if name == "" {
						name = l.GetValue()
					}
				}
			}
			r.Pairs = append(r.Pairs, PDPair{Prefill: name, Decode: s.Decode[i].Name, Requests: m.GetCounter().GetValue()})
		}
	}
	for _, d := range s.Decode {
		fams, err := families(ctx, client, d.Addr)
		if err != nil {
			return r, fmt.Errorf("%s: %w", d.Name, err)
		}
		v := func(name string) float64 {
			sum := 0.0
			for _, m := range fams[name].GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
		t := PDTransfers{Decode: d.Name, Pulls: v("kvgate_sim_kv_pulls_total"), Bytes: v("kvgate_sim_kv_pulled_bytes_total"),
			Failures: v("kvgate_sim_kv_pull_failures_total"), VerifyFailures: v("kvgate_sim_kv_verify_failures_total"), Sizes: map[string]float64{}}
		if !viaAgents(s.KVConnector) {
			t.Pulls, t.Bytes = v("kvgate_sim_kv_connector_loads_total"), v("kvgate_sim_kv_connector_loaded_bytes_total")
			t.Failures, t.VerifyFailures = v("kvgate_sim_kv_connector_load_failures_total"), v("kvgate_sim_kv_connector_verify_failures_total")
		}
		if t.Pulls > 0 {
			t.BytesPerPull = t.Bytes / t.Pulls
		}
		for _, m := range fams["vllm:nixl_bytes_transferred"].GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				t.Sizes[strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)] += float64(b.GetCumulativeCount())
			}
		}
		r.Transfers = append(r.Transfers, t)
	}
	sum := func(addr, name string) (float64, error) {
		fams, err := families(ctx, client, addr)
		v := 0.0
		for _, m := range fams[name].GetMetric() {
			v += m.GetCounter().GetValue()
		}
		return v, err
	}
	for _, e := range s.Encode {
		runs, err := sum(e.Addr, "kvgate_sim_encoder_runs_total")
		if err != nil {
			return r, fmt.Errorf("%s: %w", e.Name, err)
		}
		hits, _ := sum(e.Addr, "kvgate_sim_encoder_cache_hits_total")
		r.Encoders = append(r.Encoders, PDEncoder{Encode: e.Name, Runs: runs, CacheHits: hits})
	}
	if len(s.Encode) > 0 {
		for _, p := range s.Prefill {
			v, err := sum(p.Addr, "kvgate_sim_encoder_remote_total")
			if err != nil {
				return r, fmt.Errorf("%s: %w", p.Name, err)
			}
			r.RemoteEncoded += v
		}
	}
	return r, nil
}

// families reads addr's /metrics page with its labels.
func families(ctx context.Context, c *http.Client, addr string) (fams map[string]*dto.MetricFamily, err error) {
	err = metricsPage(ctx, c, addr, func(r io.Reader) error {
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err = p.TextToMetricFamilies(r)
		return err
	})
	return fams, err
}
