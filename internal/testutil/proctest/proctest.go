// Package proctest runs a command for one test: its output is kept for
// failure reports, Start returns once a line shows the address it serves
// on, and the test's cleanup stops it (SIGTERM, SIGKILL after 5 s).
package proctest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

// ListeningOn matches the line of the Prometheus exporter toolkit's web
// server (Prometheus, kube-state-metrics) naming the address it bound, so
// such a server can be given port 0 and report the port the kernel chose.
var ListeningOn = regexp.MustCompile(`"?Listening on"? address="?([^"\s]+)`)

// Proc is a running command.
type Proc struct {
	Cmd *exec.Cmd
	// Log is its stdout and stderr so far.
	Log *testutil.SyncBuffer
}

// Start runs name with args, with env added to the test's environment,
// and returns once re matches a line: its first submatch.
func Start(tb testing.TB, re *regexp.Regexp, env []string, name string, args ...string) (*Proc, string) {
	tb.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	log := &testutil.SyncBuffer{}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		pw.Close()
		if tb.Failed() {
			tb.Logf("%s %v output:\n%s", filepath.Base(name), args, log.String())
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, line)
			if m := re.FindStringSubmatch(line); m != nil && !sent {
				found <- m[1]
				sent = true
			}
		}
	}()
	select {
	case a := <-found:
		return &Proc{Cmd: cmd, Log: log}, a
	case <-time.After(30 * time.Second):
		tb.Fatalf("%s did not start:\n%s", name, log.String())
	}
	return nil, ""
}
