package staticfile

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

// llm-d's no-Kubernetes guide's file, with the shapes its parser accepts.
const llmdExample = `endpoints:
  - name: vllm-0
    address: "10.0.0.1"
    port: "8000"
  - name: vllm-1
    namespace: llm
    address: 10.0.0.2
    port: 8001
    labels: {llm-d.ai/role: decode}
`

func TestParseLLMD(t *testing.T) {
	got, skipped, err := ParseLLMD([]byte(llmdExample))
	if err != nil || len(skipped) != 0 {
		t.Fatal(err, skipped)
	}
	want := []endpoints.Spec{
		{Name: "vllm-0", Address: "10.0.0.1:8000", Labels: map[string]string{NamespaceLabel: "default"}},
		{Name: "vllm-1", Address: "10.0.0.2:8001", Labels: map[string]string{NamespaceLabel: "llm", endpoints.RoleLabel: "decode"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestParseLLMDSkipsAndErrors(t *testing.T) {
	// Entries llm-d skips are skipped, each reported.
	specs, skipped, err := ParseLLMD([]byte(`endpoints:
  - {name: ok, address: 10.0.0.1, port: "8000"}
  - {name: host, address: vllm.local, port: "8000"}
  - {name: v6, address: "fd00::1", port: "8000"}
  - {name: port0, address: 10.0.0.3, port: "0"}
  - {name: portx, address: 10.0.0.4, port: "http"}
  - {name: noport, address: 10.0.0.5}
`))
	if err != nil || len(specs) != 1 || specs[0].Name != "ok" {
		t.Fatalf("specs %+v, err %v", specs, err)
	}
	var fields []string
	for _, s := range skipped {
		var se *endpoints.SpecError
		if !errors.As(s, &se) {
			t.Fatalf("skipped %v is not a SpecError", s)
		}
		fields = append(fields, se.Name+"."+se.Field)
	}
	if got := strings.Join(fields, " "); got != "host.address v6.address port0.port portx.port noport.port" {
		t.Fatalf("skipped %s", got)
	}
	for name, file := range map[string]string{
		"not yaml":       "endpoints: [",
		"not a list":     "endpoints: 3",
		"duplicate name": "endpoints:\n- {name: a, address: 10.0.0.1, port: '1'}\n- {name: a, address: 10.0.0.2, port: '1'}\n",
		"too large":      "# " + strings.Repeat("x", MaxLLMDFileBytes),
	} {
		if _, _, err := ParseLLMD([]byte(file)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The llm-d format through the watched source: edits apply; with
// watching off, the first read stays.
func TestLLMDSource(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	write(t, path, llmdExample)
	r := runSource(t, &File{Path: path, LLMD: true})
	r.waitFor(t, "vllm-0", "vllm-1")
	replace(t, path, "endpoints:\n- {name: vllm-2, address: 10.0.0.9, port: '8000'}\n- {name: bad, address: nowhere, port: '1'}\n")
	r.waitFor(t, "vllm-2")
	if a := r.ds.Get("vllm-2").Address(); a != "10.0.0.9:8000" {
		t.Fatalf("address %s", a)
	}

	once := filepath.Join(dir, "once.yaml")
	write(t, once, llmdExample)
	r2 := runSource(t, &File{Path: once, LLMD: true, NoWatch: true})
	r2.waitFor(t, "vllm-0", "vllm-1")
	replace(t, once, "endpoints:\n- {name: other, address: 10.0.0.9, port: '8000'}\n")
	// Give a watcher, were there one, several debounce periods to act.
	time.Sleep(200 * time.Millisecond)
	r2.waitFor(t, "vllm-0", "vllm-1")
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseLLMD(f *testing.F) {
	f.Add([]byte(llmdExample))
	f.Add([]byte("endpoints:\n- {name: a, address: 10.0.0.1, port: 99999}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		specs, _, err := ParseLLMD(data)
		if err == nil {
			if verr := endpoints.Validate(specs); verr != nil {
				t.Fatalf("accepted an invalid set: %v", verr)
			}
		}
	})
}

// multicluster-file-discovery's file: clusters by DNS name, IP or IPv6;
// bad hosts are skipped, the plain format still refuses names.
func TestParseLLMDHosts(t *testing.T) {
	const clusters = `endpoints:
  - name: cluster-a
    address: gateway.cluster-a.example.com
    port: "443"
    labels: {metricsAddress: epp.cluster-a.example.com, metricsPort: "9090"}
  - name: cluster-b
    address: 10.1.0.1
    port: 443
  - name: cluster-c
    address: "fd00::1"
    port: 443
  - name: bad-host
    address: "Not_A_Host"
    port: 443
  - name: bad-port
    address: gw.example.com
    port: 0
`
	got, skipped, err := ParseLLMDHosts([]byte(clusters))
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, s := range got {
		if !s.Hostname {
			t.Errorf("%s not marked Hostname", s.Name)
		}
		addrs = append(addrs, s.Address)
	}
	if want := []string{"gateway.cluster-a.example.com:443", "10.1.0.1:443", "[fd00::1]:443"}; !reflect.DeepEqual(addrs, want) {
		t.Fatalf("addresses %v, want %v", addrs, want)
	}
	if got[0].Labels["metricsAddress"] != "epp.cluster-a.example.com" || got[0].Labels["metricsPort"] != "9090" {
		t.Errorf("labels %v", got[0].Labels)
	}
	if len(skipped) != 2 {
		t.Fatalf("skipped %v, want bad-host and bad-port", skipped)
	}
	for i, field := range []string{"address", "port"} {
		var se *endpoints.SpecError
		if !errors.As(skipped[i], &se) || se.Field != field {
			t.Errorf("skipped[%d] = %v, want field %s", i, skipped[i], field)
		}
	}
	if specs, skipped, err := ParseLLMD([]byte(clusters)); err != nil || len(specs) != 1 || len(skipped) != 4 {
		t.Fatalf("file-discovery's format took names: %v %v %v", specs, skipped, err)
	}
	dup := "endpoints:\n  - {name: a, address: gw.example.com, port: 443}\n  - {name: b, address: gw.example.com, port: 443}\n"
	if _, _, err := ParseLLMDHosts([]byte(dup)); !errors.Is(err, endpoints.ErrDuplicate) {
		t.Fatalf("a repeated host:port: err = %v", err)
	}
}
