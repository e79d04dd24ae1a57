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

// Example_loRA serves one prompt by the base model and by two LoRA
// adapters, at most one adapter a step (vLLM's --max-loras 1): an
// adapter's blocks are keyed with its name, so only its own second request
// hits; the other adapter's request waits while the first adapter's run,
// and the base model's request behind it is not held up.
func Example_loRA() {
	p, err := engine.LookupProfile("tiny")
	if err != nil {
		panic(err)
	}
	e, err := engine.New(engine.Config{Profile: p, MaxLoRAs: 1})
	if err != nil {
		panic(err)
	}
	prompt := make([]uint32, 80)
	for i := range prompt {
		prompt[i] = uint32(100 + i)
	}
	var now time.Duration
	run := func(reqs ...engine.Request) {
		for i := range reqs {
			reqs[i].Prompt, reqs[i].MaxTokens = prompt, 4
			if err := e.Add(now, &reqs[i]); err != nil {
				panic(err)
			}
		}
		for e.HasWork() {
			r := e.Step(now)
			now += r.Duration
			for _, o := range r.Outputs {
				if o.Finished {
					fmt.Printf("%s: %d cached, done at step %d\n", o.ID, o.CachedTokens, e.Stats().Steps)
				}
			}
		}
	}
	run(engine.Request{ID: "base"})
	run(engine.Request{ID: "sql-1", LoRA: "sql-lora"}, engine.Request{ID: "chat-1", LoRA: "chat-lora"},
		engine.Request{ID: "base-2"})
	run(engine.Request{ID: "sql-2", LoRA: "sql-lora"})
	// Output:
	// base: 0 cached, done at step 4
	// sql-1: 0 cached, done at step 8
	// base-2: 64 cached, done at step 8
	// chat-1: 0 cached, done at step 12
	// sql-2: 64 cached, done at step 16
}
