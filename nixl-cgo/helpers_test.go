package nixl

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	// Loopback only; UCX_TLS is left to the caller (the tests set it per
	// case) so tcp and shared memory are both exercised.
	if os.Getenv("UCX_NET_DEVICES") == "" {
		os.Setenv("UCX_NET_DEVICES", "lo")
	}
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// pattern fills b with bytes derived from seed and the offset.
func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) ^ byte(i>>9) ^ seed
	}
}

type side struct {
	a   *Agent
	reg *Region
}

func newSide(t testing.TB, name string, size int, params Params) *side {
	t.Helper()
	return newSideCfg(t, name, size, params, AgentConfig{ProgressThread: true, CaptureTelemetry: true})
}

func newSideCfg(t testing.TB, name string, size int, params Params, cfg AgentConfig) *side {
	t.Helper()
	return newSideOn(t, "UCX", name, size, params, cfg)
}

// newSideOn makes an agent with the backend named backend and size bytes of
// DRAM registered.
func newSideOn(t testing.TB, backend, name string, size int, params Params, cfg AgentConfig) *side {
	t.Helper()
	a, err := NewAgent(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateBackend(backend, params); err != nil {
		a.Close()
		t.Fatal(err)
	}
	r, err := AllocDRAM(size)
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	if err := a.RegisterMem(DescList{Type: DRAM, Descs: []Desc{r.Desc(0, size)}}); err != nil {
		a.Close()
		r.Close()
		t.Fatal(err)
	}
	s := &side{a: a, reg: r}
	t.Cleanup(func() {
		s.a.Close()
		s.reg.Close()
	})
	return s
}

// connect loads each side's metadata into the other.
func connect(t testing.TB, x, y *side) {
	t.Helper()
	for _, p := range [][2]*side{{x, y}, {y, x}} {
		md, err := p[1].a.LocalMD()
		if err != nil {
			t.Fatal(err)
		}
		name, err := p[0].a.LoadRemoteMD(md)
		if err != nil {
			t.Fatal(err)
		}
		if name != p[1].a.Name() {
			t.Fatalf("loaded %q, want %q", name, p[1].a.Name())
		}
	}
}

func waitCtx(t testing.TB, a *Agent, r *XferReq) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return a.Wait(ctx, r)
}

// notifsFrom polls until want notifications from sender arrived (or 10 s).
func notifsFrom(t testing.TB, a *Agent, sender string, want int) [][]byte {
	t.Helper()
	var got [][]byte
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < want && time.Now().Before(deadline) {
		m, err := a.GetNotifs()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m[sender]...)
		if len(got) < want {
			time.Sleep(time.Millisecond)
		}
	}
	return got
}

// The child process: an agent serving a patterned region until killed or
// until its stdin closes.
const (
	childEnv  = "KVGATE_NIXL_TEST_CHILD"
	childSize = 64 << 20
	childSeed = 0x5a
)

func runChild() int {
	a, err := NewAgent("child", AgentConfig{ProgressThread: true, ProgressDelay: time.Millisecond})
	if err == nil {
		_, err = a.CreateBackend("UCX", nil)
	}
	var r *Region
	if err == nil {
		r, err = AllocDRAM(childSize)
	}
	if err == nil {
		pattern(r.Bytes(), childSeed)
		err = a.RegisterMem(DescList{Type: DRAM, Descs: []Desc{r.Desc(0, childSize)}})
	}
	var md []byte
	if err == nil {
		md, err = a.LocalMD()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Println(hex.EncodeToString(md))
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	a.Close()
	return 0
}

// startChild runs the child agent and returns its metadata.
func startChild(t testing.TB) (*exec.Cmd, []byte) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("child metadata: %v", err)
	}
	md, err := hex.DecodeString(line[:len(line)-1])
	if err != nil {
		t.Fatal(err)
	}
	return cmd, md
}
