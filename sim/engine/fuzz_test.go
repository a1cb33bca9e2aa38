package engine

import (
	"strconv"
	"testing"
	"time"
)

// FuzzEngine runs arbitrary sequences of client actions against a tiny
// engine, checking the block accounting after each, and then drains it: no
// input may panic, leak a block or strand a request.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 10, 1, 1, 1, 0, 20, 1, 1, 3, 0, 1})
	f.Add([]byte{0, 200, 0, 201, 0, 202, 1, 1, 1, 1, 1, 1, 2, 1, 1})
	f.Add([]byte{0, 64, 0, 65, 1, 5, 0, 1, 4, 0, 1, 2, 2, 2})
	f.Fuzz(func(t *testing.T, ops []byte) {
		clock := NewVirtualClock(epoch)
		cfg := testConfig(clock, &recorder{})
		cfg.BlockSize, cfg.NumGPUBlocks = 4, 24
		cfg.MaxNumSeqs, cfg.MaxNumBatchedTokens, cfg.MaxWaiting, cfg.MaxLoRAs = 4, 32, 8, 1
		cfg.HeldBlockTimeout = time.Second
		e := newTestEngine(t, cfg)
		next := 0
		arg := func(i int) int {
			if i < len(ops) {
				return int(ops[i])
			}
			return 0
		}
		for i := 0; i < len(ops); i += 2 {
			a := arg(i + 1)
			switch ops[i] % 6 {
			case 0:
				req := Request{
					ID:        strconv.Itoa(next),
					Prompt:    make([]int, 1+a%70),
					MaxTokens: 1 + a%13,
				}
				for j := range req.Prompt {
					req.Prompt[j] = (j * (a%3 + 1)) % 50 // shared prefixes
				}
				switch a % 5 {
				case 1:
					req.PrefillOnly = true
				case 2:
					req.RemotePrefill = &RemotePrefill{Tokens: a % 80}
				case 3:
					req.LoRA = "l" + strconv.Itoa(a%2)
				}
				_ = e.Add(req) // rejections are part of the game
				next++
			case 1:
				clock.Advance(e.Step().Duration)
			case 2:
				clock.Advance(time.Duration(a) * 10 * time.Millisecond)
			case 3:
				_ = e.Abort(strconv.Itoa(a % max(1, next)))
			case 4:
				_ = e.Release(strconv.Itoa(a % max(1, next)))
			case 5:
				_ = e.ResetPrefixCache()
			}
			checkInvariants(t, e)
		}
		for range 10000 {
			res := e.Step()
			checkInvariants(t, e)
			if !res.Idle() {
				clock.Advance(res.Duration)
				continue
			}
			w, ok := e.NextWake()
			if !ok {
				break
			}
			clock.Set(w)
		}
		if m := e.Metrics(); m.Waiting+m.Running+m.HeldRequests != 0 || m.KVUsage != 0 {
			t.Fatalf("engine did not drain: %+v", m)
		}
	})
}
