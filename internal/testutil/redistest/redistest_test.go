package redistest

import (
	"errors"
	"net"
	"os/exec"
	"testing"
)

func TestStartAnswersPing(t *testing.T) {
	s := Start(t)
	pid, err := processID(s.Addr)
	if err != nil || pid != s.cmd.Process.Pid {
		t.Fatalf("INFO on %s: process %d, %v; want %d", s.Addr, pid, err, s.cmd.Process.Pid)
	}
}

// A port another process holds is reported as taken (Start then tries
// another), whether a bare listener or another redis-server (which would
// answer PING for it) holds it.
func TestStartOnATakenPort(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not found")
	}
	other := Start(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	otherPort, _ := net.ResolveTCPAddr("tcp", other.Addr)
	for name, port := range map[string]int{"a listener": taken.Addr().(*net.TCPAddr).Port, "another redis-server": otherPort.Port} {
		s, err := start(bin, t.TempDir(), port, nil)
		if !errors.Is(err, errPortTaken) {
			if s != nil {
				s.stop()
			}
			t.Errorf("%s: start on port %d = %v, want errPortTaken", name, port, err)
		}
	}
}
