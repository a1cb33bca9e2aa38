package filediscovery

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
)

func TestDiscovery(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	if err := os.WriteFile(path, []byte("endpoints:\n- {name: vllm-0, address: 10.0.0.1, port: '8000'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := New("fd", []byte(`{"path": "`+path+`", "watchFile": true}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	ds := endpoints.NewDatastore()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ds.Run(ctx, p.(*Discovery).EndpointSource()) }()
	defer func() { cancel(); <-done }()
	names := func() []string {
		var out []string
		for _, e := range ds.All() {
			out = append(out, e.Name())
		}
		return out
	}
	waitFor := func(want ...string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !slices.Equal(names(), want); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("membership %v, want %v", names(), want)
			}
		}
	}
	waitFor("vllm-0")
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("endpoints:\n- {name: vllm-0, address: 10.0.0.1, port: '8000'}\n- {name: vllm-1, address: 10.0.0.2, port: '8000'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor("vllm-0", "vllm-1")
}

func TestParams(t *testing.T) {
	for _, bad := range []string{``, `{}`, `{"path": ""}`, `{"path": "/x", "watch": true}`} {
		var raw []byte
		if bad != "" {
			raw = []byte(bad)
		}
		if _, err := New("", raw, nil); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
