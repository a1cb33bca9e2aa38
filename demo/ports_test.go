package demo

import (
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/kvgate/kvgate/demo/proc"
)

// withFreshPorts starts a fleet again only while a component lost its
// port, and at most fleetStarts times.
func TestStartAgainWhenAPortIsTaken(t *testing.T) {
	taken := &proc.ExitError{Name: "sim-1", Err: errors.New("exit status 1"),
		Tail: []string{"kvgate sim: listen: listen tcp 127.0.0.1:26950: bind: address already in use"}}
	crashed := &proc.ExitError{Name: "sim-0", Err: errors.New("exit status 2"), Tail: []string{"panic: boom"}}
	tests := []struct {
		name       string
		results    []error // what each start returns; the last repeats
		wantStarts int
		wantErr    error
	}{
		{"started at once", []error{nil}, 1, nil},
		{"a port taken once", []error{fmt.Errorf("fleet: %w", taken), nil}, 2, nil},
		{"a crash is not retried", []error{crashed}, 1, crashed},
		{"a port taken every time", []error{taken}, fleetStarts, taken},
		{"not a child's exit", []error{ErrNotReady}, 1, ErrNotReady},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			starts, notices := 0, 0
			_, err := withFreshPorts(func(string) { notices++ }, func() (int, error) {
				err := tt.results[min(starts, len(tt.results)-1)]
				starts++
				return starts, err
			})
			if starts != tt.wantStarts || !errors.Is(err, tt.wantErr) || notices != starts-1 {
				t.Fatalf("starts %d, err %v, notices %d; want %d starts, err %v, %d notices",
					starts, err, notices, tt.wantStarts, tt.wantErr, tt.wantStarts-1)
			}
		})
	}
}

// The words withFreshPorts looks for are the ones a real simulator dies
// with when its port is taken.
func TestPortTakenByARealSim(t *testing.T) {
	needE2E(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	g, err := proc.NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer g.StopAll(time.Second)
	port := ln.Addr().(*net.TCPAddr).Port
	c := StackConfig{TokenizerDir: testTokDir, TimeScale: 1, NumGPUBlocks: 16, HashSeed: "42"}
	o := c.simOptions(0, fleetPorts{kvEvents: port, sims: []int{port}})
	p, err := g.Start(proc.Spec{Name: "sim-0", Path: testBin, Args: append([]string{"sim"}, o.Args()...)})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatal("the simulator did not exit on a taken port")
	}
	if err := error(p.AsError()); portTakenBy(err) != "sim-0" {
		t.Fatalf("portTakenBy(%v) = %q, want sim-0", err, portTakenBy(err))
	}
}
