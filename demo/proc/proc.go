package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// TailLines is how many of a child's last output lines are kept in memory.
const TailLines = 20

// maxTailLine bounds one kept line; a child printing a huge line must not
// grow the supervisor's memory.
const maxTailLine = 512

// Spec describes one child.
type Spec struct {
	// Name identifies the child in reports and names its log file.
	Name string
	Path string
	Args []string
	// Env is added to the supervisor's environment.
	Env []string
}

// Group owns a set of children. Start and Stop may be called from any
// goroutine; Exited delivers each child that ended without being stopped.
type Group struct {
	logDir string

	mu      sync.Mutex
	procs   []*Proc // running or not yet stopped
	started int     // ever started, bounded by MaxChildren
	exited  chan *Proc
}

// MaxChildren bounds the children a group ever starts; the exit channel is
// sized by it so that reaping never blocks.
const MaxChildren = 64

// ErrTooMany is returned by Start when the group is full.
var ErrTooMany = errors.New("proc: too many children")

// NewGroup returns a group whose children log to logDir/<name>.log.
func NewGroup(logDir string) (*Group, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, fmt.Errorf("proc: log dir: %w", err)
	}
	return &Group{logDir: logDir, exited: make(chan *Proc, MaxChildren)}, nil
}

// Exited delivers children that ended on their own (crashed or returned),
// not those ended by Stop.
func (g *Group) Exited() <-chan *Proc { return g.exited }

// Proc is one running child.
type Proc struct {
	Name    string
	LogPath string

	cmd     *exec.Cmd
	log     *os.File
	tail    *tail
	done    chan struct{}
	err     error // set before done is closed
	stopped bool  // guarded by stopMu
	stopMu  sync.Mutex
}

// Start launches spec as a child of the group.
func (g *Group) Start(spec Spec) (*Proc, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started >= MaxChildren {
		return nil, ErrTooMany
	}
	logPath := filepath.Join(g.logDir, spec.Name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("proc: %s log: %w", spec.Name, err)
	}
	p := &Proc{Name: spec.Name, LogPath: logPath, log: f, tail: &tail{}, done: make(chan struct{})}
	out := io.MultiWriter(f, p.tail)
	p.cmd = exec.Command(spec.Path, spec.Args...)
	p.cmd.Env = append(os.Environ(), spec.Env...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	// No Setpgid: children stay in our process group, so a terminal's
	// Ctrl-C reaches them too; Pdeathsig covers the supervisor dying
	// without a chance to stop them.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("proc: start %s: %w", spec.Name, err)
	}
	g.procs = append(g.procs, p)
	g.started++
	go func() {
		p.err = p.cmd.Wait()
		p.log.Close()
		close(p.done)
		p.stopMu.Lock()
		stopped := p.stopped
		p.stopMu.Unlock()
		if !stopped {
			g.exited <- p
		}
	}()
	return p, nil
}

// PID is the child's process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited and its output is flushed.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the child's exit status; valid after Done.
func (p *Proc) Err() error { return p.err }

// Tail returns the child's last output lines.
func (p *Proc) Tail() []string { return p.tail.lines() }

// Stop ends the child: SIGTERM, then SIGKILL once grace has passed.
func (p *Proc) Stop(grace time.Duration) {
	p.stopMu.Lock()
	p.stopped = true
	p.stopMu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill ends the child at once with SIGKILL, as a crash would; the group
// reports it on Exited.
func (p *Proc) Kill() error { return p.cmd.Process.Kill() }

// StopAll stops every child in parallel, so the whole group is gone within
// grace plus the time SIGKILL takes.
func (g *Group) StopAll(grace time.Duration) {
	g.mu.Lock()
	procs := g.procs
	g.procs = nil
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop(grace)
		}()
	}
	wg.Wait()
}

// ExitError describes a child that ended on its own.
type ExitError struct {
	Name    string
	Err     error
	Tail    []string
	LogPath string
}

func (e *ExitError) Error() string {
	status := "exited"
	if e.Err != nil {
		status = e.Err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s died (%s); last log lines (%s):", e.Name, status, e.LogPath)
	for _, l := range e.Tail {
		b.WriteString("\n  | ")
		b.WriteString(l)
	}
	return b.String()
}

func (e *ExitError) Unwrap() error { return e.Err }

// AsError describes p's unexpected exit; call it after Done.
func (p *Proc) AsError() *ExitError {
	return &ExitError{Name: p.Name, Err: p.err, Tail: p.Tail(), LogPath: p.LogPath}
}

// tail keeps the last TailLines lines written to it. exec copies a child's
// output from one goroutine, but Tail may be read from another.
type tail struct {
	mu      sync.Mutex
	partial []byte
	ring    [TailLines]string
	n       int // lines ever completed
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			t.appendPartial(b)
			break
		}
		t.appendPartial(b[:i])
		t.ring[t.n%TailLines] = string(t.partial)
		t.n++
		t.partial = t.partial[:0]
		b = b[i+1:]
	}
	return n, nil
}

func (t *tail) appendPartial(b []byte) {
	if room := maxTailLine - len(t.partial); room < len(b) {
		b = b[:max(room, 0)]
	}
	t.partial = append(t.partial, b...)
}

func (t *tail) lines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := max(t.n-TailLines, 0)
	out := make([]string, 0, t.n-first+1)
	for i := first; i < t.n; i++ {
		out = append(out, t.ring[i%TailLines])
	}
	if len(t.partial) > 0 {
		out = append(out, string(t.partial))
	}
	return out
}
