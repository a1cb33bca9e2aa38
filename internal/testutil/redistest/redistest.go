package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is one running redis-server.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// Dir holds the server's working directory (its RDB/AOF files).
	Dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Require reports whether a missing redis-server fails the test instead of
// skipping it: `make test` sets KVGATE_REQUIRE_REDIS=1 after installing it.
func Require() bool { return os.Getenv("KVGATE_REQUIRE_REDIS") == "1" }

// Start runs redis-server on a free loopback port with persistence off
// (appendonly and snapshots disabled) unless extra config lines say
// otherwise, e.g. "appendonly yes". The server is killed at test cleanup.
//
// redis-server cannot bind port 0 and report the port, so a port is chosen
// and freed first, and another process may take it before the server binds
// it. Start notices that two ways: the server exits with "Address already
// in use" (then Start tries another port), and the server answering on the
// port must be this one (INFO's process_id), never another test's.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if Require() {
			tb.Fatalf("redis-server not found (KVGATE_REQUIRE_REDIS=1; apt-get install redis-server)")
		}
		tb.Skip("redis-server not found (apt-get install redis-server)")
	}
	dir := tb.TempDir()
	const attempts = 5
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s, err := start(bin, dir, port, extra)
		if err == nil {
			tb.Cleanup(s.stop)
			return s
		}
		if !errors.Is(err, errPortTaken) || attempt == attempts {
			tb.Fatalf("redis-server (attempt %d): %v", attempt, err)
		}
	}
}

// errPortTaken is start's error when another process held the chosen port.
var errPortTaken = errors.New("port taken by another process")

// start runs one server on port and waits until it answers.
func start(bin, dir string, port int, extra []string) (*Server, error) {
	logPath := filepath.Join(dir, "redis.log")
	_ = os.Remove(logPath)
	conf := []string{
		"bind 127.0.0.1",
		fmt.Sprintf("port %d", port),
		"dir " + dir,
		"save \"\"",
		"appendonly no",
		"protected-mode yes",
		"daemonize no",
		"loglevel warning",
		"logfile " + logPath,
	}
	conf = append(conf, extra...)
	confPath := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(confPath, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, confPath)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Dir: dir, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	if err := s.waitReady(10 * time.Second); err != nil {
		s.stop()
		log, _ := os.ReadFile(logPath)
		if bytes.Contains(log, []byte("Address already in use")) {
			err = fmt.Errorf("%s: %w", s.Addr, errPortTaken)
		}
		return nil, fmt.Errorf("on %s: %w\n%s", s.Addr, err, log)
	}
	return s, nil
}

// waitReady polls until this server (not another process on the port)
// answers, or it exits.
func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return errors.New("redis-server exited")
		default:
		}
		var pid int
		pid, last = processID(s.Addr)
		if last == nil {
			if pid != s.cmd.Process.Pid {
				return fmt.Errorf("process %d answers, not redis-server %d: %w", pid, s.cmd.Process.Pid, errPortTaken)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %w", limit, last)
}

// processID asks the server on addr for INFO server's process_id.
func processID(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil || n < 0 || n > 1<<20 {
		return 0, fmt.Errorf("INFO answered %q", strings.TrimSpace(head))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

func (s *Server) stop() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
