package proc

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestExitedChildIsReportedWithItsTail(t *testing.T) {
	g, err := NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.StopAll(time.Second) })
	p, err := g.Start(Spec{Name: "crasher", Path: "/bin/sh", Args: []string{"-c", "for i in $(seq 1 30); do echo line $i; done; echo -n partial; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	got := <-g.Exited()
	if got != p {
		t.Fatalf("exited %q", got.Name)
	}
	e := got.AsError()
	tail := e.Tail
	if len(tail) != TailLines+1 || tail[0] != "line 11" || tail[TailLines-1] != "line 30" || tail[TailLines] != "partial" {
		t.Fatalf("tail = %q", tail)
	}
	if !strings.Contains(e.Error(), "crasher died (exit status 3)") {
		t.Fatalf("error = %v", e)
	}
	log, err := os.ReadFile(p.LogPath)
	if err != nil || !strings.HasPrefix(string(log), "line 1\n") {
		t.Fatalf("log = %q, %v", log, err)
	}
}

func TestStopEscalatesToKill(t *testing.T) {
	g, err := NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The child ignores SIGTERM; only SIGKILL ends it.
	p, err := g.Start(Spec{Name: "stubborn", Path: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(strings.Join(p.Tail(), ""), "ready") {
		time.Sleep(10 * time.Millisecond)
	}
	g.StopAll(100 * time.Millisecond)
	var ee interface{ ExitCode() int }
	if !errors.As(p.Err(), &ee) || ee.ExitCode() != -1 {
		t.Fatalf("err = %v, want killed", p.Err())
	}
	if err := syscall.Kill(p.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("pid %d still exists: %v", p.PID(), err)
	}
	select {
	case q := <-g.Exited():
		t.Fatalf("stopped child %q reported as exited", q.Name)
	default:
	}
}

func TestTailBoundsLongLines(t *testing.T) {
	var tl tail
	tl.Write([]byte(strings.Repeat("x", 3*maxTailLine) + "\nshort\n"))
	got := tl.lines()
	if len(got) != 2 || len(got[0]) != maxTailLine || got[1] != "short" {
		t.Fatalf("lines = %d %q", len(got[0]), got[1:])
	}
}
