package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/kvgate/kvgate/proto/kvgate/agent/v1"
)

// TestRegisterRegionConfined: RegisterRegion created, grew and mapped
// whatever file its caller named, so any gRPC caller could create or
// overwrite files anywhere the agent (on the GPU node, with its
// capabilities) can write. Only files below --region-dir are taken now.
func TestRegisterRegionConfined(t *testing.T) {
	n := newNode(t, "n", 0)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(victim, filepath.Join(n.dir, "to-victim")))
	must(os.Symlink(outside, filepath.Join(n.dir, "to-outside")))
	must(os.Mkdir(filepath.Join(n.dir, "sub"), 0o700))
	must(syscall.Mkfifo(filepath.Join(n.dir, "fifo"), 0o600))
	must(os.WriteFile(filepath.Join(n.dir, "real"), nil, 0o600))
	must(os.Symlink("real", filepath.Join(n.dir, "alias")))
	for _, tc := range []struct {
		name, path string
		want       codes.Code
		wantErr    error
	}{
		{"file elsewhere", filepath.Join(outside, "new"), codes.PermissionDenied, ErrOutsideRegionDir},
		{"existing file elsewhere", victim, codes.PermissionDenied, ErrOutsideRegionDir},
		{"dot-dot out", n.dir + "/../" + filepath.Base(outside) + "/new", codes.PermissionDenied, ErrOutsideRegionDir},
		{"dot-dot staying inside", n.dir + "/sub/../new", codes.PermissionDenied, ErrOutsideRegionDir},
		{"symlink out", filepath.Join(n.dir, "to-victim"), codes.PermissionDenied, ErrOutsideRegionDir},
		{"through a symlinked folder", filepath.Join(n.dir, "to-outside", "new"), codes.PermissionDenied, ErrOutsideRegionDir},
		{"the directory itself", n.dir, codes.PermissionDenied, ErrOutsideRegionDir},
		{"a folder inside", filepath.Join(n.dir, "sub"), codes.InvalidArgument, ErrNotRegularFile},
		{"a FIFO inside", filepath.Join(n.dir, "fifo"), codes.InvalidArgument, ErrNotRegularFile},
		{"relative", "region", codes.InvalidArgument, ErrRelativeRegionPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.client.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: "E-" + tc.name, Path: tc.path,
				BlockBytes: blockBytes, Slots: 4})
			if status.Code(err) != tc.want {
				t.Fatalf("got %v, want %s", err, tc.want)
			}
			// The error names the path and the setting.
			if msg := status.Convert(err).Message(); !strings.Contains(msg, strconv.Quote(tc.path)) || !strings.Contains(msg, "--region-dir "+n.dir) {
				t.Fatalf("message %q names not the path and --region-dir", msg)
			}
			_, err = n.a.dir.open(tc.path)
			var pe *RegionPathError
			if !errors.As(err, &pe) || !errors.Is(err, tc.wantErr) || pe.Path != tc.path || pe.Dir != n.dir {
				t.Fatalf("open: %v, want a RegionPathError wrapping %v", err, tc.wantErr)
			}
		})
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("the file outside was changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file was created outside: %v", err)
	}
	// Inside: a new file, and a symlink that stays inside.
	for _, p := range []string{filepath.Join(n.dir, "fresh"), filepath.Join(n.dir, "alias")} {
		if _, err := n.client.RegisterRegion(t.Context(), &agentv1.RegisterRegionRequest{EngineId: p, Path: p,
			BlockBytes: blockBytes, Slots: 4}); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	if st, err := os.Stat(filepath.Join(n.dir, "real")); err != nil || st.Size() != 4*blockBytes {
		t.Fatalf("the symlink's target was not sized: %v %v", st, err)
	}
}

// TestRegionDirResolved: a region directory reached through a symlink
// takes paths under either name.
func TestRegionDirResolved(t *testing.T) {
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "shm")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	d, err := openRegionDir(link)
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	for _, p := range []string{filepath.Join(link, "a"), filepath.Join(real, "b")} {
		f, err := d.open(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		f.Close()
	}
	if _, err := os.Stat(filepath.Join(real, "a")); err != nil {
		t.Fatal(err)
	}
}
