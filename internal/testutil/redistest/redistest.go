package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Server is one running redis-server.
type Server struct {
	// Addr is host:port on 127.0.0.1.
	Addr string
	// Dir holds the server's working directory (its RDB/AOF files).
	Dir string
	cmd *exec.Cmd
}

// Require reports whether a missing redis-server fails the test instead of
// skipping it: `make test` sets KVGATE_REQUIRE_REDIS=1 after installing it.
func Require() bool { return os.Getenv("KVGATE_REQUIRE_REDIS") == "1" }

// Start runs redis-server on a free loopback port with persistence off
// (appendonly and snapshots disabled) unless extra config lines say
// otherwise, e.g. "appendonly yes". The server is killed at test cleanup.
func Start(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if Require() {
			tb.Fatalf("redis-server not found (KVGATE_REQUIRE_REDIS=1; apt-get install redis-server)")
		}
		tb.Skip("redis-server not found (apt-get install redis-server)")
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	conf := []string{
		"bind 127.0.0.1",
		fmt.Sprintf("port %d", port),
		"dir " + dir,
		"save \"\"",
		"appendonly no",
		"protected-mode yes",
		"daemonize no",
		"loglevel warning",
		"logfile " + filepath.Join(dir, "redis.log"),
	}
	conf = append(conf, extra...)
	confPath := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(confPath, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, confPath)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start redis-server: %v", err)
	}
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Dir: dir, cmd: cmd}
	tb.Cleanup(s.stop)
	if err := s.waitReady(10 * time.Second); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
		tb.Fatalf("redis-server on %s: %v\n%s", s.Addr, err, log)
	}
	return s
}

// waitReady polls PING until the server answers PONG.
func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		last = ping(s.Addr)
		if last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %w", limit, last)
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func (s *Server) stop() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
