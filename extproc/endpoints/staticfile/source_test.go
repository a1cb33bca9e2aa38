package staticfile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvgate/kvgate/extproc/endpoints"
	"github.com/kvgate/kvgate/internal/testutil"
)

// logCount counts error records, so a test can wait until the source has
// looked at an edit it must reject.
type logCount struct {
	mu       sync.Mutex
	errors   int
	warnings int
}

func (l *logCount) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCount) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logCount) WithGroup(string) slog.Handler            { return l }
func (l *logCount) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case r.Level >= slog.LevelError:
		l.errors++
	case r.Level >= slog.LevelWarn:
		l.warnings++
	}
	return nil
}

func (l *logCount) warned() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.warnings
}

func (l *logCount) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errors
}

// pool renders a file with endpoints named after names.
func pool(names ...string) string {
	var b strings.Builder
	b.WriteString("endpoints:\n")
	for i, n := range names {
		fmt.Fprintf(&b, "  - name: %s\n    address: 10.0.0.%d:8000\n", n, i+1)
	}
	return b.String()
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replace writes content to a temporary file and renames it over path, as
// editors and config management tools do.
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	write(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type running struct {
	ds   *endpoints.Datastore
	logs *logCount
	stop func() error
	// exited closes when the source has ended by itself or been stopped.
	exited chan struct{}
}

func run(t *testing.T, path string) *running {
	t.Helper()
	return runSource(t, &File{Path: path})
}

// runSource runs src (its Debounce and Logger set here) into a datastore.
func runSource(t *testing.T, src *File) *running {
	t.Helper()
	r := &running{ds: endpoints.NewDatastore(), logs: &logCount{}}
	src.Debounce, src.Logger = 20*time.Millisecond, slog.New(r.logs)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r.exited = make(chan struct{})
	go func() { done <- r.ds.Run(ctx, src); close(r.exited) }()
	var once sync.Once
	var err error
	r.stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func (r *running) names() []string {
	var out []string
	for _, e := range r.ds.All() {
		out = append(out, e.Name())
	}
	return out
}

func (r *running) waitFor(t *testing.T, names ...string) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("membership %v", names), func() bool { return slices.Equal(r.names(), names) })
}

func TestWatchEdits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	write(t, path, pool("a", "b"))
	r := run(t, path)
	r.waitFor(t, "a", "b")
	a := r.ds.Get("a")

	// In-place write.
	write(t, path, pool("a", "b", "c"))
	r.waitFor(t, "a", "b", "c")
	if r.ds.Get("a") != a {
		t.Error("an unchanged endpoint was recreated by an edit")
	}

	// Rename over the file.
	replace(t, path, pool("a", "d"))
	r.waitFor(t, "a", "d")

	// An invalid edit is logged and changes nothing.
	errs := r.logs.count()
	replace(t, path, pool("a", "a"))
	testutil.WaitFor(t, "the invalid edit to be rejected", func() bool { return r.logs.count() > errs })
	if got := r.names(); !slices.Equal(got, []string{"a", "d"}) {
		t.Fatalf("membership %v after an invalid edit", got)
	}
	replace(t, path, pool("a", "e"))
	r.waitFor(t, "a", "e")

	// Deleting the file keeps the set; recreating it applies the new one.
	errs = r.logs.count()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the deletion to be noticed", func() bool { return r.logs.count() > errs })
	if got := r.names(); !slices.Equal(got, []string{"a", "e"}) {
		t.Fatalf("membership %v after deletion", got)
	}
	write(t, path, pool("f"))
	r.waitFor(t, "f")

	if err := r.stop(); err != nil {
		t.Errorf("Run returned %v after cancel", err)
	}
}

// Kubernetes mounts a ConfigMap key as a symlink through "..data", which it
// repoints at a new timestamped directory on every update.
func TestWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, name, "endpoints.yaml"), content)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_11_29_v1", pool("a"))
	path := filepath.Join(dir, "endpoints.yaml")
	if err := os.Symlink(filepath.Join("..data", "endpoints.yaml"), path); err != nil {
		t.Fatal(err)
	}
	r := run(t, path)
	r.waitFor(t, "a")
	version("..2026_11_29_v2", pool("a", "b"))
	r.waitFor(t, "a", "b")
}

func TestRunFailsOnBadStart(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		path string
		is   error
	}{
		{"missing file", filepath.Join(dir, "absent.yaml"), os.ErrNotExist},
		{"missing directory", filepath.Join(dir, "no", "endpoints.yaml"), nil},
		{"invalid file", filepath.Join(dir, "bad.yaml"), endpoints.ErrDuplicate},
	}
	write(t, filepath.Join(dir, "bad.yaml"), pool("x", "x"))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := &File{Path: tt.path, Logger: slog.New(slog.DiscardHandler)}
			applied := false
			err := src.Run(context.Background(), func([]endpoints.Spec) error { applied = true; return nil })
			if err == nil || applied {
				t.Fatalf("Run = %v, applied = %v", err, applied)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want errors.Is %v", err, tt.is)
			}
		})
	}
}

// bigPool lists n endpoints with distinct addresses.
func bigPool(n int) string {
	var b strings.Builder
	b.WriteString("endpoints:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: e%d\n    address: 10.%d.%d.%d:8000\n", i, i>>16&255, i>>8&255, i&255)
	}
	return b.String()
}

// TestHostileEdits (Low, Medium): an edit to `endpoints: []` and one over
// the pool's endpoint cap are refused with an error logged, and the set in
// force keeps routing.
func TestHostileEdits(t *testing.T) {
	for _, tc := range []struct {
		name, content string
	}{
		{"empty list", "endpoints: []\n"},
		{"10,000 endpoints", bigPool(10_000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "endpoints.yaml")
			write(t, path, pool("a", "b"))
			r := run(t, path)
			r.waitFor(t, "a", "b")
			errs := r.logs.count()
			replace(t, path, tc.content)
			testutil.WaitFor(t, "the edit to be refused", func() bool { return r.logs.count() > errs })
			if got := r.names(); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("membership %v after the edit", got)
			}
			if len(r.ds.Candidates()) != 2 {
				t.Fatal("the kept endpoints are no longer candidates")
			}
			replace(t, path, pool("c"))
			r.waitFor(t, "c")
		})
	}
}

// A file caught mid-rewrite at start (truncated to nothing: no
// "endpoints" key) is read again a debounce later rather than ending the
// source; it failed the picker's start before.
func TestTruncatedAtStartIsReadAgain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write(t, path, "")
	r := run(t, path)
	for i := 0; r.logs.warned() == 0; i++ { // the source has read the empty file
		if i > 1000 {
			t.Fatal("no warning about the unparsable file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	write(t, path, pool("a"))
	r.waitFor(t, "a")
}

// A file that stays broken still fails the start, with its error.
func TestBrokenAtStartFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write(t, path, "endpoints: [")
	r := run(t, path)
	select {
	case <-r.exited:
	case <-time.After(10 * time.Second): // a hang guard, not a timing assertion
		t.Fatal("the source kept running on a broken file")
	}
	if err := r.stop(); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("source ended with %v, want the file's parse error", err)
	}
}

// TestEmptyAtStart: an empty file at start is a known, empty pool.
func TestEmptyAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write(t, path, "endpoints: []\n")
	r := run(t, path)
	write(t, path, pool("a"))
	r.waitFor(t, "a")
}
