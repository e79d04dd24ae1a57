package engine_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/engine"
)

// Example steps a small engine in virtual time: two requests share a
// 64-token prefix, so the second one hits the prefix cache.
func Example() {
	p, err := engine.LookupProfile("tiny")
	if err != nil {
		panic(err)
	}
	e, err := engine.New(engine.Config{Profile: p})
	if err != nil {
		panic(err)
	}
	prompt := func(suffix uint32) []uint32 {
		ids := make([]uint32, 0, 80)
		for i := uint32(0); i < 64; i++ {
			ids = append(ids, 100+i) // shared prefix: 4 blocks of 16
		}
		for i := uint32(0); i < 16; i++ {
			ids = append(ids, suffix+i)
		}
		return ids
	}
	var now time.Duration
	for i, id := range []string{"first", "second"} {
		if err := e.Add(now, &engine.Request{ID: id, Prompt: prompt(uint32(1000 * (i + 1))), MaxTokens: 4}); err != nil {
			panic(err)
		}
		for e.HasWork() {
			r := e.Step(now)
			now += r.Duration
			for _, o := range r.Outputs {
				if o.Finished {
					fmt.Printf("%s: %d tokens, %d cached, finish %s\n", o.ID, o.Index+1, o.CachedTokens, o.FinishReason)
				}
			}
		}
	}
	st := e.Stats()
	fmt.Printf("prefix cache: %d of %d prompt tokens hit\n", st.PrefixHits, st.PrefixQueries)
	// Output:
	// first: 4 tokens, 0 cached, finish length
	// second: 4 tokens, 64 cached, finish length
	// prefix cache: 64 of 160 prompt tokens hit
}
