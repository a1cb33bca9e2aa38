// Package libzmqtest builds and runs small C programs linked with the real
// libzmq (testdata/*.c) so that tests can check kvgate's ZMTP against the
// library vLLM's publisher uses. They need gcc and libzmq3-dev; without
// them the tests skip, unless KVGATE_REQUIRE_LIBZMQ=1 makes them fail.
package libzmqtest

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Require reports whether missing gcc or libzmq must fail the tests.
func Require() bool { return os.Getenv("KVGATE_REQUIRE_LIBZMQ") == "1" }

// Build compiles testdata/<name>.c into a temporary folder of tb and
// returns the binary's path; it skips tb when gcc or libzmq is missing.
func Build(tb testing.TB, name string) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "testdata", name+".c")
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		missing(tb, "gcc not found")
	}
	bin := filepath.Join(tb.TempDir(), name)
	out, err := exec.Command(gcc, "-O1", "-Wall", "-o", bin, src, "-lzmq").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "zmq.h") || strings.Contains(string(out), "-lzmq") {
			missing(tb, "libzmq not installed (Debian libzmq3-dev): "+string(out))
		}
		tb.Fatalf("gcc %s: %v\n%s", name, err, out)
	}
	return bin
}

func missing(tb testing.TB, why string) {
	tb.Helper()
	if Require() {
		tb.Fatalf("%s (KVGATE_REQUIRE_LIBZMQ=1)", why)
	}
	tb.Skip(why)
}

// Proc is a running C program; its stdout arrives line by line.
type Proc struct {
	cmd   *exec.Cmd
	Lines <-chan string
	done  chan error
}

// Start runs bin with args until the test ends (it is killed then).
func Start(tb testing.TB, bin string, args ...string) *Proc {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	lines := make(chan string, 1024)
	p := &Proc{cmd: cmd, Lines: lines, done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
		close(lines)
		p.done <- cmd.Wait()
	}()
	tb.Cleanup(func() {
		cancel()
		<-p.done
	})
	return p
}

// Line returns the next line of output, failing tb after timeout.
func (p *Proc) Line(tb testing.TB, timeout time.Duration) string {
	tb.Helper()
	select {
	case l, ok := <-p.Lines:
		if !ok {
			tb.Fatal("the program ended early")
		}
		return l
	case <-time.After(timeout):
		tb.Fatal("timed out waiting for the program's output")
	}
	return ""
}

// Wait waits for the program to exit and returns its error.
func (p *Proc) Wait(timeout time.Duration) error {
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(timeout):
		return context.DeadlineExceeded
	}
}
