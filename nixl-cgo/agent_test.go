package nixl

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testutil"
)

var transports = []string{"tcp", "shm"}

func TestTransferContent(t *testing.T) {
	for _, tls := range transports {
		for _, tc := range []struct {
			name      string
			op        XferOp
			descs     int
			descBytes int
			workers   string
		}{
			{"read-one-block", Read, 1, 4096, "1"},
			{"read-many-blocks", Read, 64, 16 << 10, "1"},
			{"write-many-blocks", Write, 32, 8 << 10, "1"},
			{"read-large", Read, 2, 8 << 20, "1"},
			{"read-two-workers", Read, 16, 4096, "2"},
		} {
			t.Run(tls+"/"+tc.name, func(t *testing.T) {
				t.Setenv("UCX_TLS", tls)
				size := tc.descs * tc.descBytes * 2
				params := Params{"num_workers": tc.workers}
				if tls == "shm" {
					// UCX's shared-memory transports have no peer
					// failure handling.
					params["ucx_error_handling_mode"] = "none"
				}
				init, target := newSide(t, "init", size, params), newSide(t, "target", size, params)
				connect(t, init, target)
				src, dst := target.reg, init.reg
				if tc.op == Write {
					src, dst = init.reg, target.reg
				}
				pattern(src.Bytes(), 3)
				// Scatter: block k of the target's region (every other
				// block) to block descs-1-k of the initiator's.
				var local, remote []Desc
				for k := range tc.descs {
					local = append(local, init.reg.Desc((tc.descs-1-k)*tc.descBytes, tc.descBytes))
					remote = append(remote, target.reg.Desc(2*k*tc.descBytes, tc.descBytes))
				}
				msg := []byte("req-1:1")
				r, err := init.a.CreateXferReq(tc.op, DescList{Type: DRAM, Descs: local}, DescList{Type: DRAM, Descs: remote},
					"target", XferOpts{NotifMsg: msg, HasNotif: true})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := init.a.PostXferReq(r); err != nil {
					t.Fatal(err)
				}
				if err := waitCtx(t, init.a, r); err != nil {
					t.Fatal(err)
				}
				for k := range tc.descs {
					lo, ro := (tc.descs-1-k)*tc.descBytes, 2*k*tc.descBytes
					l, rm := init.reg.Bytes()[lo:lo+tc.descBytes], target.reg.Bytes()[ro:ro+tc.descBytes]
					if !bytes.Equal(l, rm) {
						t.Fatalf("block %d differs after %s", k, tc.op)
					}
				}
				if bytes.Equal(dst.Bytes()[:tc.descBytes], make([]byte, tc.descBytes)) {
					t.Fatal("destination still zero")
				}
				got := notifsFrom(t, target.a, "init", 1)
				if len(got) != 1 || string(got[0]) != string(msg) {
					t.Fatalf("notifications %q, want [%q]", got, msg)
				}
				tel, err := init.a.XferTelemetry(r)
				if err != nil {
					t.Fatal(err)
				}
				if tel.TotalBytes != uint64(tc.descs*tc.descBytes) || tel.DescCount != tc.descs {
					t.Fatalf("telemetry %+v", tel)
				}
				if st := init.a.Stats(); st.BytesDone != uint64(tc.descs*tc.descBytes) || st.XfersDone != 1 {
					t.Fatalf("stats %+v", st)
				}
				if err := init.a.ReleaseXferReq(r); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestPreparedListsAndRepost(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const blk, n = 4096, 8
	init, target := newSide(t, "init", blk*n, nil), newSide(t, "target", blk*n, nil)
	connect(t, init, target)
	var blocks []Desc
	for k := range n {
		blocks = append(blocks, Desc{Addr: uintptr(k * blk), Len: blk})
	}
	rebase := func(r *Region) DescList {
		l := DescList{Type: DRAM}
		for _, d := range blocks {
			l.Descs = append(l.Descs, Desc{Addr: r.Addr() + d.Addr, Len: d.Len})
		}
		return l
	}
	lp, err := init.a.PrepXferDlist("init", rebase(init.reg))
	if err != nil {
		t.Fatal(err)
	}
	rp, err := init.a.PrepXferDlist("target", rebase(target.reg))
	if err != nil {
		t.Fatal(err)
	}
	// A partial hit as vLLM reads it: the last 3 remote blocks into local
	// blocks 0..2.
	r, err := init.a.MakeXferReq(Read, lp, []int{0, 1, 2}, rp, []int{5, 6, 7}, XferOpts{})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		pattern(target.reg.Bytes(), byte(round+1))
		if _, err := init.a.PostXferReq(r); err != nil {
			t.Fatal(err)
		}
		if _, err := init.a.PostXferReq(r); StatusOf(err) != ErrRepostActive && err != nil {
			t.Fatalf("repost while active: %v", err)
		}
		if err := waitCtx(t, init.a, r); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(init.reg.Bytes()[:3*blk], target.reg.Bytes()[5*blk:]) {
			t.Fatalf("round %d: content differs", round)
		}
	}
	if err := init.a.ReleaseXferReq(r); err != nil {
		t.Fatal(err)
	}
	if _, err := init.a.PostXferReq(r); StatusOf(err) != ErrInvalidParam {
		t.Fatalf("post after release: %v", err)
	}
}

func TestStandaloneNotif(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	x, y := newSide(t, "x", 4096, nil), newSide(t, "y", 4096, nil)
	connect(t, x, y)
	for _, m := range []string{"a:1", "b:1", ""} {
		if err := x.a.GenNotif("y", []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	got := notifsFrom(t, y.a, "x", 3)
	if len(got) != 3 || string(got[0]) != "a:1" || string(got[1]) != "b:1" || len(got[2]) != 0 {
		t.Fatalf("got %q", got)
	}
	if err := x.a.GenNotif("nobody", nil); StatusOf(err) != ErrNotFound {
		t.Fatalf("notif to unknown agent: %v", err)
	}
}

// TestNotified: a notification is announced on Notified once collected,
// so that a receiver can sleep until then instead of polling GetNotifs
// (the node agent did, every 2 ms): collected by the progress goroutine as
// it arrives, or by a transfer's polling (GetXferStatus, Wait) that took
// it in. Before, polling left it in the backend until the progress
// goroutine's next wake-up (its UCX event may have been consumed by then:
// up to ProgressDelay), or, without a progress goroutine, for good.
func TestNotified(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	for _, tc := range []struct {
		name string
		cfg  AgentConfig // the receiver's
		// wait returns once the receiver announced a notification.
		wait func(t *testing.T, x, y *side)
	}{
		{"progress goroutine", AgentConfig{ProgressThread: true}, func(t *testing.T, x, _ *side) {
			select {
			case <-x.a.Notified():
			case <-time.After(30 * time.Second):
				t.Fatal("no notification announced")
			}
		}},
		{"transfer polling", AgentConfig{}, func(t *testing.T, x, y *side) {
			r, err := x.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{x.reg.Desc(0, 4096)}},
				DescList{Type: DRAM, Descs: []Desc{y.reg.Desc(0, 4096)}}, "y", XferOpts{})
			if err != nil {
				t.Fatal(err)
			}
			defer x.a.ReleaseXferReq(r)
			testutil.WaitFor(t, "the notification, announced", func() bool {
				if _, err := x.a.PostXferReq(r); err != nil {
					t.Fatal(err)
				}
				if err := waitCtx(t, x.a, r); err != nil {
					t.Fatal(err)
				}
				select {
				case <-x.a.Notified():
					return true
				default:
					return false
				}
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The sender first, so that the receiver, which may have
			// nothing progressing it, closes first: the sender's graceful
			// close of its endpoint to it would wait for it.
			y := newSide(t, "y", 4096, nil)
			x := newSideCfg(t, "x", 4096, nil, tc.cfg)
			connect(t, x, y)
			select {
			case <-x.a.Notified():
				t.Fatal("announced before any notification")
			default:
			}
			if err := y.a.GenNotif("x", []byte("r:1")); err != nil {
				t.Fatal(err)
			}
			tc.wait(t, x, y)
			m, err := x.a.GetNotifs()
			if err != nil {
				t.Fatal(err)
			}
			if got := m["y"]; len(got) != 1 || string(got[0]) != "r:1" {
				t.Fatalf("got %q", m)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const size = 1 << 16
	init, target := newSide(t, "init", size, nil), newSide(t, "target", size, nil)
	connect(t, init, target)
	md, err := target.a.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	loc := func(off, n int) DescList { return DescList{Type: DRAM, Descs: []Desc{init.reg.Desc(off, n)}} }
	rem := func(off, n int) DescList { return DescList{Type: DRAM, Descs: []Desc{target.reg.Desc(off, n)}} }
	outside, _ := AllocDRAM(4096)
	defer outside.Close()
	corrupt := bytes.Clone(md)
	corrupt[len(corrupt)/2] ^= 0xff
	for _, tc := range []struct {
		name string
		do   func() error
		want Status
	}{
		{"unknown remote descriptor", func() error {
			_, err := init.a.CreateXferReq(Read, loc(0, 4096), DescList{Type: DRAM, Descs: []Desc{{Addr: target.reg.Addr() + size - 100, Len: 4096}}}, "target", XferOpts{})
			return err
		}, ErrNotFound},
		{"unregistered local memory", func() error {
			_, err := init.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{outside.Desc(0, 4096)}}, rem(0, 4096), "target", XferOpts{})
			return err
		}, ErrNotFound},
		{"mismatched sizes", func() error {
			_, err := init.a.CreateXferReq(Read, loc(0, 4096), rem(0, 8192), "target", XferOpts{})
			return err
		}, ErrMismatch},
		{"count mismatch", func() error {
			_, err := init.a.CreateXferReq(Read, loc(0, 4096), DescList{Type: DRAM}, "target", XferOpts{})
			return err
		}, ErrMismatch},
		{"unknown agent", func() error {
			_, err := init.a.CreateXferReq(Read, loc(0, 4096), rem(0, 4096), "ghost", XferOpts{})
			return err
		}, ErrNotFound},
		{"corrupt metadata", func() error { _, err := init.a.LoadRemoteMD(corrupt); return err }, ErrInvalidParam},
		{"truncated metadata", func() error { _, err := init.a.LoadRemoteMD(md[:len(md)-9]); return err }, ErrInvalidParam},
		{"own metadata", func() error {
			own, _ := init.a.LocalMD()
			_, err := init.a.LoadRemoteMD(own)
			return err
		}, ErrNotAllowed},
		{"unknown backend", func() error { _, err := init.a.CreateBackend("GDS", nil); return err }, ErrNotFound},
		{"second UCX backend", func() error { _, err := init.a.CreateBackend("UCX", nil); return err }, ErrNotAllowed},
		{"VRAM without GPU", func() error {
			return init.a.RegisterMem(DescList{Type: VRAM, Descs: []Desc{outside.Desc(0, 4096)}})
		}, ErrNotSupported},
		{"overlapping registration", func() error { return init.a.RegisterMem(loc(100, 10)) }, ErrNotAllowed},
		{"deregister unknown", func() error { return init.a.DeregisterMem(DescList{Type: DRAM, Descs: []Desc{outside.Desc(0, 4096)}}) }, ErrNotFound},
		{"oversized notification", func() error { return init.a.GenNotif("target", make([]byte, maxNotif+1)) }, ErrInvalidParam},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if !errors.Is(err, tc.want.Err()) {
				t.Fatalf("got %v, want %s", err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		params Params
	}{
		{"unknown param", Params{"ucx_turbo": "1"}},
		{"bad num_workers", Params{"num_workers": "0"}},
		{"bad error mode", Params{"ucx_error_handling_mode": "maybe"}},
		{"thread pool", Params{"num_threads": "4"}},
	} {
		t.Run("params/"+tc.name, func(t *testing.T) {
			a, _ := NewAgent("p", AgentConfig{})
			defer a.Close()
			if _, err := a.CreateBackend("UCX", tc.params); StatusOf(err) != ErrInvalidParam {
				t.Fatalf("got %v", err)
			}
		})
	}
	// The metadata of a region deregistered after loading: a reload is
	// needed, and the stale list is refused.
	rp, err := init.a.PrepXferDlist("target", rem(0, 4096))
	if err != nil {
		t.Fatal(err)
	}
	if err := init.a.InvalidateRemoteMD("target"); err != nil {
		t.Fatal(err)
	}
	lp, _ := init.a.PrepXferDlist("init", loc(0, 4096))
	if _, err := init.a.MakeXferReq(Read, lp, []int{0}, rp, []int{0}, XferOpts{}); StatusOf(err) != ErrNotFound {
		t.Fatalf("stale prepared list: %v", err)
	}
}

// A peer process killed mid-transfer ends the transfer with an error in
// bounded time; nothing is left behind.
func TestRemoteKilledMidTransfer(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	base, goroutines := liveCObjects(), runtime.NumGoroutine()
	init := newSide(t, "init", childSize, nil)
	cmd, md := startChild(t)
	if _, err := init.a.LoadRemoteMD(md); err != nil {
		t.Fatal(err)
	}
	remoteAddr := func() uintptr {
		m, _ := decodeMD(md)
		return m.Backends[0].Regions[0].Desc.Addr
	}()
	// First a verified READ across processes.
	r, err := init.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{init.reg.Desc(0, 1<<20)}},
		DescList{Type: DRAM, Descs: []Desc{{Addr: remoteAddr, Len: 1 << 20}}}, "child", XferOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := init.a.PostXferReq(r); err != nil {
		t.Fatal(err)
	}
	if err := waitCtx(t, init.a, r); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 1<<20)
	pattern(want, childSeed)
	if !bytes.Equal(init.reg.Bytes()[:1<<20], want) {
		t.Fatal("cross-process READ content differs")
	}
	init.a.ReleaseXferReq(r)
	// Then a long one (the whole region, 32 times), killed under way.
	var l, rm []Desc
	for range 32 {
		l = append(l, init.reg.Desc(0, childSize))
		rm = append(rm, Desc{Addr: remoteAddr, Len: childSize})
	}
	r, err = init.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: l}, DescList{Type: DRAM, Descs: rm}, "child", XferOpts{HasNotif: true, NotifMsg: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := init.a.PostXferReq(r); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = init.a.Wait(ctx, r)
	if err == nil {
		t.Fatal("transfer from a killed peer succeeded")
	}
	if !errors.Is(err, ErrRemoteDisconnect.Err()) {
		t.Fatalf("got %v, want %s", err, ErrRemoteDisconnect)
	}
	t.Logf("failed as expected: %v", err)
	if err := init.a.ReleaseXferReq(r); err != nil {
		t.Fatal(err)
	}
	// New requests fail fast, and the peer can be forgotten.
	r2, err := init.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{init.reg.Desc(0, 4096)}},
		DescList{Type: DRAM, Descs: []Desc{{Addr: remoteAddr, Len: 4096}}}, "child", XferOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := init.a.PostXferReq(r2); err == nil {
		if err = waitCtx(t, init.a, r2); err == nil {
			t.Fatal("READ from a dead peer succeeded")
		}
	}
	if err := init.a.InvalidateRemoteMD("child"); err != nil {
		t.Fatal(err)
	}
	init.a.Close()
	if n := liveCObjects(); n != base {
		t.Fatalf("%d C objects left (was %d)", n, base)
	}
	testutil.NoGoroutineLeak(t, goroutines, "closing the agent")
}

// TestReleaseDoneUnpolled: a request whose data completed while nobody
// polled it (a Wait given up on at that moment, progress made by other
// calls) is still in progress for the agent, and releasing it aborts the
// connection, then collects it. Collecting it found the flush done and
// sent the notification on the endpoint the abort had just closed: a NULL
// UCP endpoint, and the process crashed.
func TestReleaseDoneUnpolled(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const size = 1 << 20
	x := newSideCfg(t, "x", size, nil, AgentConfig{})
	y := newSide(t, "y", size, nil)
	connect(t, x, y)
	pattern(y.reg.Bytes(), 5)
	r, err := x.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{x.reg.Desc(0, size)}},
		DescList{Type: DRAM, Descs: []Desc{y.reg.Desc(0, size)}}, "y", XferOpts{HasNotif: true, NotifMsg: []byte("r:1")})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := x.a.PostXferReq(r); st != InProg {
		t.Fatalf("a %d-byte READ over TCP ended at once: %s %v", size, st, err)
	}
	// Progress, not polling the request, until the data landed; then more,
	// for the flush that follows it.
	testutil.WaitFor(t, "the READ's data", func() bool {
		x.a.Progress()
		return bytes.Equal(x.reg.Bytes(), y.reg.Bytes())
	})
	for range 100 {
		x.a.Progress()
	}
	if err := x.a.ReleaseXferReq(r); err != nil {
		t.Fatal(err)
	}
	if st, err := x.a.GetXferStatus(r); st == Success || err == nil {
		t.Fatalf("a request aborted before its notification went out ended %s", st)
	}
}

// Releasing a request in progress aborts it without hanging, and the
// peer is reachable again after reloading its metadata.
func TestReleaseInProgress(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const size = 32 << 20
	init, target := newSide(t, "init", size, nil), newSide(t, "target", size, nil)
	connect(t, init, target)
	var l, rm []Desc
	for range 16 {
		l, rm = append(l, init.reg.Desc(0, size)), append(rm, target.reg.Desc(0, size))
	}
	r, err := init.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: l}, DescList{Type: DRAM, Descs: rm}, "target", XferOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := init.a.PostXferReq(r); err != nil {
		t.Fatal(err)
	}
	if err := init.a.ReleaseXferReq(r); err != nil {
		t.Fatal(err)
	}
	md, _ := target.a.LocalMD()
	if _, err := init.a.LoadRemoteMD(md); err != nil {
		t.Fatal(err)
	}
	pattern(target.reg.Bytes()[:4096], 9)
	r, err = init.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{init.reg.Desc(0, 4096)}},
		DescList{Type: DRAM, Descs: []Desc{target.reg.Desc(0, 4096)}}, "target", XferOpts{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := init.a.PostXferReq(r); err != nil {
		t.Fatal(err)
	}
	if err := waitCtx(t, init.a, r); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(init.reg.Bytes()[:4096], target.reg.Bytes()[:4096]) {
		t.Fatal("content differs after reconnect")
	}
}

// TestOversizedNotifDropped: a peer's notification is input. GenNotif
// refuses messages over maxNotif, but a peer need not use it: the receiver
// handed on a message of any size, and its workers first copied whatever
// arrived into their queues (65536 of them, each of any size). A message over
// maxNotif is now dropped, and a payload over maxNotifPayload already in C
// (cDropped counts the workers' drops).
func TestOversizedNotifDropped(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	for _, tc := range []struct {
		name     string
		msg      int
		cDropped uint64
	}{
		{"message over maxNotif", maxNotif + 1, 0},
		{"payload over maxNotifPayload", maxNotifPayload, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, y := newSide(t, "x", 4096, nil), newSide(t, "y", 4096, nil)
			connect(t, x, y)
			x.a.mu.Lock()
			err := x.a.remotes["y"].conn.genNotif(notifPayload("x", make([]byte, tc.msg)))
			x.a.mu.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			if err := x.a.GenNotif("y", make([]byte, maxNotif)); err != nil {
				t.Fatal(err)
			}
			got := notifsFrom(t, y.a, "x", 1)
			if len(got) != 1 || len(got[0]) != maxNotif {
				lens := make([]int, len(got))
				for i, m := range got {
					lens[i] = len(m)
				}
				t.Fatalf("got notifications of %v bytes, want one of %d", lens, maxNotif)
			}
			y.a.mu.Lock()
			st, cDropped := y.a.stats, y.a.cDropped
			y.a.mu.Unlock()
			if st.NotifsDropped != 1 || cDropped != tc.cDropped {
				t.Fatalf("dropped %d (%d by the workers), want 1 (%d)", st.NotifsDropped, cDropped, tc.cDropped)
			}
		})
	}
}

// TestEmptyRemoteKeysRefused: UCP takes a worker address and a packed
// rkey as bare pointers, with no length, so an empty one from a peer's
// metadata would have UCX parse whatever lies past the buffer. Metadata
// with an empty worker address is refused on load, and a region with an
// empty rkey when a transfer needs it.
func TestEmptyRemoteKeysRefused(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	x, y := newSide(t, "x", 4096, nil), newSide(t, "y", 4096, nil)
	blob, err := y.a.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	md, err := decodeMD(blob)
	if err != nil {
		t.Fatal(err)
	}
	md.Backends[0].Workers[0] = nil
	if _, err := x.a.LoadRemoteMD(md.encode()); StatusOf(err) != ErrInvalidParam {
		t.Fatalf("empty worker address: %v", err)
	}
	md, _ = decodeMD(blob)
	md.Backends[0].Regions[0].RKey = nil
	if _, err := x.a.LoadRemoteMD(md.encode()); err != nil {
		t.Fatal(err)
	}
	r, err := x.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: []Desc{x.reg.Desc(0, 64)}},
		DescList{Type: DRAM, Descs: []Desc{y.reg.Desc(0, 64)}}, "y", XferOpts{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.a.ReleaseXferReq(r)
	if _, err := x.a.PostXferReq(r); StatusOf(err) != ErrInvalidParam {
		t.Fatalf("empty rkey: %v", err)
	}
}

// TestLoadRemoteMDAs: metadata whose name is not the one its sender claims
// is refused before it replaces what is loaded under that name.
func TestLoadRemoteMDAs(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	x, y := newSide(t, "x", 4096, nil), newSide(t, "y", 4096, nil)
	blob, err := y.a.LocalMD()
	if err != nil {
		t.Fatal(err)
	}
	if err := x.a.LoadRemoteMDAs("y", blob); err != nil {
		t.Fatal(err)
	}
	x.a.mu.Lock()
	loaded := x.a.remotes["y"]
	x.a.mu.Unlock()
	// Another blob under y's name, sent by a peer that calls itself z.
	md, err := decodeMD(blob)
	if err != nil {
		t.Fatal(err)
	}
	md.Backends[0].Regions = nil
	for _, tc := range []struct {
		name, claim string
		blob        []byte
		want        Status
	}{
		{"other name", "z", md.encode(), ErrMismatch},
		{"no name", "", md.encode(), ErrInvalidParam},
		{"corrupt", "y", blob[:len(blob)-1], ErrInvalidParam},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := x.a.LoadRemoteMDAs(tc.claim, tc.blob); StatusOf(err) != tc.want {
				t.Fatalf("got %v, want %s", err, tc.want)
			}
			x.a.mu.Lock()
			defer x.a.mu.Unlock()
			if x.a.remotes["y"] != loaded || len(x.a.remotes) != 1 {
				t.Fatalf("a refused load changed the loaded peers: %v", x.a.remotes)
			}
		})
	}
}
