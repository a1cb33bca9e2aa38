package nixl

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBackendRegistry(t *testing.T) {
	if got := AvailablePlugins(); !slices.Contains(got, "UCX") || !slices.IsSorted(got) {
		t.Fatalf("AvailablePlugins() = %q, want a sorted list with UCX", got)
	}
	for _, tc := range []struct {
		name string
		want Status
	}{
		{"UCX", Success},
		{"GDS", ErrNotFound},
		{"ucx", ErrNotFound}, // names are case-sensitive, as NIXL's
		{"", ErrNotFound},
	} {
		t.Run("name="+tc.name, func(t *testing.T) {
			a, err := NewAgent("reg", AgentConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			be, err := a.CreateBackend(tc.name, nil)
			params, perr := PluginParams(tc.name)
			if tc.want == Success {
				if err != nil || perr != nil {
					t.Fatalf("CreateBackend: %v; PluginParams: %v", err, perr)
				}
				if be.Type != tc.name {
					t.Fatalf("backend type %q, want %q", be.Type, tc.name)
				}
				if tc.name == "UCX" && !maps.Equal(params, UCXParams()) {
					t.Fatalf("PluginParams(UCX) = %v, want UCXParams()", params)
				}
				// The caller's copy is its own.
				clear(params)
				if again, _ := PluginParams(tc.name); len(again) == 0 {
					t.Fatal("clearing the returned map emptied the registry's")
				}
				return
			}
			for _, e := range []error{err, perr} {
				if !errors.Is(e, tc.want.Err()) {
					t.Fatalf("got %v, want %s", e, tc.want)
				}
				if msg := e.Error(); !strings.Contains(msg, `"`+tc.name+`"`) || !strings.Contains(msg, "UCX") {
					t.Fatalf("error %q does not name %q and the available backends", msg, tc.name)
				}
			}
			// Without a backend the agent refuses work and says why.
			if err := a.RegisterMem(DescList{Type: DRAM, Descs: []Desc{{Addr: 4096, Len: 1}}}); !errors.Is(err, ErrNotFound.Err()) || !strings.Contains(err.Error(), "CreateBackend") {
				t.Fatalf("RegisterMem without a backend: %v", err)
			}
		})
	}
}

// TestBackendSeam runs every registered backend through the seam: first
// the engine contract the Agent relies on, then two Agents created by the
// backend's name READing through it.
func TestBackendSeam(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const block = 64 << 10
	for _, name := range AvailablePlugins() {
		t.Run(name+"/engine", func(t *testing.T) {
			plugin := backendPlugins[name]
			type end struct {
				eng backendEngine
				reg *Region
				mem backendMem
			}
			mk := func(params Params) *end {
				eng, err := plugin.create(params, engineOpts{})
				if err != nil {
					t.Fatal(err)
				}
				reg, err := AllocDRAM(4 * block)
				if err != nil {
					eng.close()
					t.Fatal(err)
				}
				mem, err := eng.registerMem(DRAM, reg.Desc(0, reg.Len()))
				if err != nil {
					eng.close()
					reg.Close()
					t.Fatal(err)
				}
				return &end{eng, reg, mem}
			}
			// The initiator closes its connection by force: the target
			// does not progress during cleanup.
			init, target := mk(Params{"ucx_ep_close_force": "true"}), mk(nil)
			peer, err := init.eng.loadRemote(&backendMD{Type: name, Workers: target.eng.connInfo(),
				Regions: []regionMD{{Type: DRAM, Desc: target.reg.Desc(0, target.reg.Len()), RKey: target.mem.publicMD()}}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				peer.close()
				for _, e := range []*end{init, target} {
					e.eng.deregisterMem(e.mem)
					e.eng.close()
					e.reg.Close()
				}
			})
			if err := init.eng.supportsMem(File); StatusOf(err) != ErrNotSupported || !strings.Contains(err.Error(), "FILE_SEG") {
				t.Fatalf("supportsMem(FILE_SEG): %v", err)
			}
			// run posts x and progresses both ends until it ended.
			run := func(x backendXfer, notif []byte) {
				t.Helper()
				if err := x.post(notif); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(30 * time.Second)
				for {
					st, err := x.check(pollSpins)
					if st != InProg {
						if err != nil {
							t.Fatal(err)
						}
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("transfer still in progress after 30 s")
					}
					target.eng.progress(pollSpins)
				}
				x.release()
			}
			notifs := func() [][]byte {
				t.Helper()
				var got [][]byte
				for deadline := time.Now().Add(10 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
					target.eng.progress(pollSpins)
					target.eng.getNotifs(func(p []byte) { got = append(got, bytes.Clone(p)) })
				}
				return got
			}
			// READ target blocks 1 and 3 into init blocks 0 and 1.
			tb, ib := target.reg.Bytes(), init.reg.Bytes()
			base := uint64(target.reg.Addr())
			read := peer.prepXfer(Read, []uintptr{init.reg.Addr(), init.reg.Addr() + block},
				[]uint64{base + block, base + 3*block}, []uint64{block, block}, []int{0, 0})
			for round, seed := range []byte{7, 9} { // the second round reposts the same handle
				pattern(tb, seed)
				run(read, []byte("n"+string('0'+rune(round))))
				if !bytes.Equal(ib[:block], tb[block:2*block]) || !bytes.Equal(ib[block:2*block], tb[3*block:]) {
					t.Fatalf("round %d: READ content differs", round)
				}
				if got := notifs(); len(got) != 1 || string(got[0]) != "n"+string('0'+rune(round)) {
					t.Fatalf("round %d: notifications %q", round, got)
				}
			}
			// WRITE init block 2 over target block 0, then a standalone
			// notification.
			pattern(ib[2*block:3*block], 11)
			run(peer.prepXfer(Write, []uintptr{init.reg.Addr() + 2*block}, []uint64{base}, []uint64{block}, []int{0}), nil)
			if !bytes.Equal(tb[:block], ib[2*block:3*block]) {
				t.Fatal("WRITE content differs")
			}
			if err := peer.genNotif([]byte("standalone")); err != nil {
				t.Fatal(err)
			}
			if got := notifs(); len(got) != 1 || string(got[0]) != "standalone" {
				t.Fatalf("standalone notification: %q", got)
			}
			if err := peer.failed(); err != nil {
				t.Fatalf("healthy connection reports %v", err)
			}
		})
		t.Run(name+"/agents", func(t *testing.T) {
			cfg := AgentConfig{ProgressThread: true}
			init, target := newSideOn(t, name, "init", 4*block, nil, cfg), newSideOn(t, name, "target", 4*block, nil, cfg)
			md, err := target.a.LocalMD()
			if err != nil {
				t.Fatal(err)
			}
			dmd, err := decodeMD(md)
			if err != nil {
				t.Fatal(err)
			}
			if len(dmd.Backends) != 1 || dmd.Backends[0].Type != name || len(dmd.Backends[0].Regions) != 1 {
				t.Fatalf("metadata backends %+v, want one %s backend with one region", dmd.Backends, name)
			}
			connect(t, init, target)
			pattern(target.reg.Bytes(), 5)
			r, err := init.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{init.reg.Desc(0, block)}},
				DescList{Type: DRAM, Descs: []Desc{target.reg.Desc(2*block, block)}}, "target", XferOpts{NotifMsg: []byte("done"), HasNotif: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := init.a.PostXferReq(r); err != nil {
				t.Fatal(err)
			}
			if err := waitCtx(t, init.a, r); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(init.reg.Bytes()[:block], target.reg.Bytes()[2*block:3*block]) {
				t.Fatal("READ content differs")
			}
			if got := notifsFrom(t, target.a, "init", 1); len(got) != 1 || string(got[0]) != "done" {
				t.Fatalf("notifications %q", got)
			}
			if err := init.a.ReleaseXferReq(r); err != nil {
				t.Fatal(err)
			}
		})
	}
}
