package engine_test

import (
	"fmt"
	"time"

	"github.com/kvgate/kvgate/sim/engine"
)

// The discrete-event loop: add what has arrived, Step, advance the virtual
// clock by the step's duration, then act on the step's outputs.
func Example() {
	preset, _ := engine.LookupPreset("llama-3.1-8b-h100")
	clock := engine.NewVirtualClock(time.Unix(0, 0))
	eng, err := engine.New(engine.Config{Timing: preset.Timing, Clock: clock, HashSeed: "42"})
	if err != nil {
		fmt.Println(err)
		return
	}
	prompt := make([]int, 1000)
	for i, id := range []string{"first", "second"} {
		if err := eng.Add(engine.Request{ID: id, Prompt: prompt, MaxTokens: 3}); err != nil {
			fmt.Println(err)
			return
		}
		for {
			res := eng.Step()
			if res.Idle() {
				break
			}
			clock.Advance(res.Duration)
			for _, f := range res.Finished {
				fmt.Printf("request %d: %d tokens, %d of %d prompt tokens cached\n",
					i+1, f.Usage.CompletionTokens, f.Usage.CachedTokens, f.Usage.PromptTokens)
			}
		}
	}
	// Output:
	// request 1: 3 tokens, 0 of 1000 prompt tokens cached
	// request 2: 3 tokens, 992 of 1000 prompt tokens cached
}
