package nixl

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// blockWord is word w of block b's content in generation g.
func blockWord(b, g, w int) uint64 {
	return (uint64(b)<<40 | uint64(g)<<20 | uint64(w)) * 0x9e3779b97f4a7c15
}

func fillBlock(p []byte, b, g int) {
	for w := 0; w+8 <= len(p); w += 8 {
		binary.LittleEndian.PutUint64(p[w:], blockWord(b, g, w/8))
	}
}

// badOffset is the first byte of p that differs from block b's content in
// generation g, or -1.
func badOffset(p []byte, b, g int) int {
	for w := 0; w+8 <= len(p); w += 8 {
		if binary.LittleEndian.Uint64(p[w:]) != blockWord(b, g, w/8) {
			return w
		}
	}
	return -1
}

// TestReadNotifiedAfterData checks what a P/D hold relies on, under CPU
// load: a READ of many scattered blocks is reported complete only once
// every byte landed, and its notification reaches the target only after
// the target served the whole READ. The target plays the prefill node: on
// a batch's notification it frees the source blocks and refills them with
// new content at once (a new request reusing the slots), then acks.
// Initiators READ batches (UCX over TCP: each GET is served in software by
// the target, completion is the endpoint flush) while goroutines keep
// every CPU busy, and check each batch the moment it is reported complete.
// Zeros had not landed (a flush that ended early); the next generation's
// bytes were read after the notification arrived (a notification sent
// before the flush). Blocks are large enough that a batch outruns the
// loopback socket buffers, so replies still queue at the target when a
// premature notification arrives: either fault, injected into the shim,
// fails this test at once.
func TestReadNotifiedAfterData(t *testing.T) {
	t.Setenv("UCX_TLS", "tcp")
	const (
		blockBytes = 128 << 10
		perInit    = 256 // source blocks each initiator owns
		batch      = 108
		initiators = 3
	)
	rounds := 4 // KVGATE_NIXL_LOAD_ROUNDS raises it for a longer soak
	if v, err := strconv.Atoi(os.Getenv("KVGATE_NIXL_LOAD_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	// The target has no progress thread: its GETs are served inside the
	// GetNotifs calls of the goroutine below, so a notification it gets is
	// acted on before any reply still queued behind it is packed, the
	// strictest order a prefill node's agent can see.
	target := newSideCfg(t, "target", initiators*perInit*blockBytes, nil, AgentConfig{})
	gen := make([]int, initiators*perInit) // owned by the target's goroutine
	for b := range gen {
		fillBlock(target.reg.Bytes()[b*blockBytes:(b+1)*blockBytes], b, 0)
	}
	inits := make([]*side, initiators)
	for i := range inits {
		inits[i] = newSide(t, fmt.Sprintf("init-%d", i), batch*blockBytes, nil)
		connect(t, inits[i], target)
	}
	stop := make(chan struct{})
	var bg sync.WaitGroup
	for range 2 * runtime.GOMAXPROCS(0) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			x := uint64(1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
				_ = x
			}
		}()
	}
	// The target: a notification names its batch's blocks; they are
	// rewritten (next generation) and the initiator is told so.
	bg.Add(1)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				runtime.Gosched()
			}
			m, err := target.a.GetNotifs()
			if err != nil {
				t.Error(err)
				return
			}
			for sender, msgs := range m {
				for _, msg := range msgs {
					for _, f := range strings.Fields(string(msg)) {
						b, _ := strconv.Atoi(f)
						gen[b]++
						fillBlock(target.reg.Bytes()[b*blockBytes:(b+1)*blockBytes], b, gen[b])
					}
					if err := target.a.GenNotif(sender, []byte("refilled")); err != nil {
						t.Error(err)
					}
				}
			}
		}
	}()
	var bad atomic.Int64
	var firstBad atomic.Value
	var wg sync.WaitGroup
	for i, in := range inits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			mine := make([]int, perInit) // the generation each owned block is in
			for round := range rounds {
				clear(in.reg.Bytes())
				src := rng.Perm(perInit)[:batch]
				local, remote := make([]Desc, batch), make([]Desc, batch)
				var msg strings.Builder
				for k, o := range src {
					b := i*perInit + o
					local[k] = in.reg.Desc(k*blockBytes, blockBytes)
					remote[k] = target.reg.Desc(b*blockBytes, blockBytes)
					fmt.Fprintf(&msg, "%d ", b)
				}
				r, err := in.a.CreateXferReq(Read, DescList{Type: DRAM, Descs: local}, DescList{Type: DRAM, Descs: remote}, "target",
					XferOpts{HasNotif: true, NotifMsg: []byte(msg.String())})
				if err == nil {
					if _, err = in.a.PostXferReq(r); err == nil {
						err = waitCtx(t, in.a, r)
					}
					in.a.ReleaseXferReq(r)
				}
				if err != nil {
					t.Errorf("%s round %d: %v", in.a.Name(), round, err)
					return
				}
				for k, o := range src {
					b := i*perInit + o
					p := in.reg.Bytes()[k*blockBytes : (k+1)*blockBytes]
					if at := badOffset(p, b, mine[o]); at >= 0 {
						what, w := "other bytes", binary.LittleEndian.Uint64(p[at:])
						switch w {
						case blockWord(b, mine[o]+1, at/8):
							what = "the next generation's bytes: read after its notification"
						case 0:
							what = "zeros: not landed"
						}
						bad.Add(1)
						firstBad.CompareAndSwap(nil, fmt.Sprintf("%s round %d: block %d of %d (target block %d) wrong from byte %d: %s",
							in.a.Name(), round, k, batch, b, at, what))
					}
					mine[o]++
				}
				if err := awaitNotif(in.a, "target"); err != nil {
					t.Errorf("%s round %d: %v", in.a.Name(), round, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d of %d blocks wrong after their READ completed; first: %s", n, initiators*rounds*batch, firstBad.Load())
	}
}

// awaitNotif polls a for one notification from sender (10 s at most).
func awaitNotif(a *Agent, sender string) error {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		m, err := a.GetNotifs()
		if err != nil {
			return err
		}
		if n := len(m[sender]); n > 0 {
			if n > 1 {
				return fmt.Errorf("%d notifications from %s, want 1", n, sender)
			}
			return nil
		}
	}
	return fmt.Errorf("no notification from %s in 10 s", sender)
}
