package engine

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/kvindex"
)

// TestLoRACache: an adapter's request hits no block of a base request with
// the same prompt, nor of another adapter's; a second request of the same
// adapter hits the first's. Its BlockStored events name the adapter and
// carry the keys kvindex.HashTokensKeyed gives the prompt, for every hash
// function's chain (checked against Keyed; xxh3 against kvindex too).
func TestLoRACache(t *testing.T) {
	for _, name := range []string{HashXXH3, HashSHA256, HashSHA256CBOR} {
		t.Run(name, func(t *testing.T) {
			h, _ := NewHashFunc(name, "")
			e := mustEngine(t, "tiny", func(c *Config) { c.HashFunc, c.MaxLoRAs = h, 2 })
			d := newDriver(t, e)
			prompt := tokens(1000, 70) // 4 full blocks; 64 tokens can hit
			for _, tc := range []struct {
				id, lora string
				want     int
			}{
				{"base", "", 0},
				{"a1", "sql-lora", 0},
				{"a2", "sql-lora", 64},
				{"b1", "other", 0},
				{"base2", "", 64},
			} {
				d.events = nil
				r := &Request{ID: tc.id, Prompt: prompt, MaxTokens: 2, LoRA: tc.lora}
				if got := e.PrefixHit(r); got != tc.want {
					t.Errorf("%s: PrefixHit = %d, want %d", tc.id, got, tc.want)
				}
				d.add(r)
				d.run()
				if got := d.byID(tc.id)[0].CachedTokens; got != tc.want {
					t.Errorf("%s: cached tokens %d, want %d", tc.id, got, tc.want)
				}
				if tc.want > 0 {
					continue
				}
				want := kvindex.HashTokensKeyed(prompt, tc.lora, "", 16, nil)
				if name != HashXXH3 {
					want = want[:0]
					parent := h.None()
					for i := 0; i+16 <= len(prompt); i += 16 {
						parent = h.Keyed(parent, prompt[i:i+16], tc.lora, "")
						want = append(want, parent.Key())
					}
				}
				if len(d.events) == 0 || d.events[0].Kind != BlockStored || d.events[0].LoRA != tc.lora ||
					!slices.Equal(d.events[0].BlockHashes, want) {
					t.Errorf("%s: events %+v: want first the BlockStored of the prompt's blocks %v, adapter %q", tc.id, d.events, want, tc.lora)
				}
			}
			if e.loraSeqs != 0 {
				t.Errorf("%d adapter requests live after every request ended", e.loraSeqs)
			}
		})
	}
}

// TestLoRAOutputBlocks: the blocks an adapter's request fills with its
// outputs are keyed with the adapter too (the chain Keyed gives the prompt
// and outputs), and the BlockStored events of them name it.
func TestLoRAOutputBlocks(t *testing.T) {
	for _, noEvents := range []bool{false, true} {
		e := mustEngine(t, "tiny", func(c *Config) { c.NoEvents = noEvents })
		d := newDriver(t, e)
		prompt := tokens(3000, 20)
		d.add(&Request{ID: "a", Prompt: prompt, MaxTokens: 40, IgnoreEOS: true, LoRA: "sql-lora"})
		d.run()
		var all []uint32
		all = append(all, prompt...)
		for _, o := range d.byID("a") {
			all = append(all, o.Token)
		}
		want := kvindex.HashTokensKeyed(all[:59], "sql-lora", "", 16, nil) // the last token's KV is never computed
		// A second request with the whole sequence as its prompt hits
		// every block the first cached (all but one token).
		r := &Request{ID: "b", Prompt: all[:len(want)*16+1], MaxTokens: 1, LoRA: "sql-lora"}
		if got := e.PrefixHit(r); got != len(want)*16 {
			t.Errorf("events %v: second request hits %d tokens, want %d", !noEvents, got, len(want)*16)
		}
		if noEvents {
			continue
		}
		var stored []uint64
		for _, ev := range d.events {
			if ev.Kind == BlockStored {
				if ev.LoRA != "sql-lora" {
					t.Errorf("BlockStored %+v: adapter %q, want sql-lora", ev, ev.LoRA)
				}
				stored = append(stored, ev.BlockHashes...)
			}
		}
		if !slices.Equal(stored, want) {
			t.Errorf("stored %v, want %v", stored, want)
		}
	}
}

// TestMaxLoRAs: with MaxLoRAs 2, a request of a third adapter waits while
// requests of two others run, and the requests behind it (another of a
// running adapter, one of the base model) are admitted past it, as vLLM
// V1's scheduler skips it; it runs in the step after one of the two
// finishes. AppendLoRAs reports the adapters running and waiting.
func TestMaxLoRAs(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.MaxLoRAs = 2 })
	d := newDriver(t, e)
	d.add(&Request{ID: "a", Prompt: tokens(100, 20), MaxTokens: 3, IgnoreEOS: true, LoRA: "a"})
	d.add(&Request{ID: "b", Prompt: tokens(200, 20), MaxTokens: 10, IgnoreEOS: true, LoRA: "b"})
	d.add(&Request{ID: "c", Prompt: tokens(300, 20), MaxTokens: 2, IgnoreEOS: true, LoRA: "c"})
	d.add(&Request{ID: "c2", Prompt: tokens(350, 20), MaxTokens: 2, IgnoreEOS: true, LoRA: "c"})
	d.add(&Request{ID: "a2", Prompt: tokens(400, 20), MaxTokens: 2, IgnoreEOS: true, LoRA: "a"})
	d.add(&Request{ID: "base", Prompt: tokens(500, 20), MaxTokens: 2, IgnoreEOS: true})
	running := func() []string {
		var ids []string
		for _, s := range e.AppendRunning(nil) {
			ids = append(ids, s.ID)
		}
		return ids
	}
	d.step()
	if got, want := running(), []string{"a", "b", "a2", "base"}; !slices.Equal(got, want) {
		t.Fatalf("running after the first step: %v, want %v", got, want)
	}
	run, wait := e.AppendLoRAs(nil, nil)
	if !slices.Equal(run, []string{"a", "b"}) || !slices.Equal(wait, []string{"c"}) {
		t.Errorf("AppendLoRAs = %v, %v, want [a b], [c]", run, wait)
	}
	if st := e.Stats(); st.Waiting != 2 || e.waiting.front().id != "c" {
		t.Errorf("waiting %d, head %s: want c and c2, in order", st.Waiting, e.waiting.front().id)
	}
	// Until a and a2 finish, c waits; in the step after, c and c2 run.
	for slices.Contains(running(), "a") || slices.Contains(running(), "a2") {
		if slices.Contains(running(), "c") {
			t.Fatalf("c runs with a, b in the batch: %v", running())
		}
		d.step()
	}
	d.step()
	if got := running(); !slices.Contains(got, "c") || !slices.Contains(got, "c2") {
		t.Errorf("running after a finished: %v, want c and c2 among them", got)
	}
	d.run()
	for _, id := range []string{"a", "b", "c", "c2", "a2", "base"} {
		if o := d.byID(id); len(o) == 0 || !o[len(o)-1].Finished {
			t.Errorf("%s did not finish", id)
		}
	}
	if run, wait := e.AppendLoRAs(nil, nil); len(run)+len(wait) != 0 {
		t.Errorf("AppendLoRAs after the end = %v, %v", run, wait)
	}
}

// TestMaxLoRAsUnlimited: MaxLoRAs 0 puts no bound on the adapters of a
// step.
func TestMaxLoRAsUnlimited(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	for _, id := range []string{"a", "b", "c"} {
		d.add(&Request{ID: id, Prompt: tokens(100, 20), MaxTokens: 2, LoRA: id})
	}
	d.step()
	if st := e.Stats(); st.Running != 3 {
		t.Errorf("running %d, want 3", st.Running)
	}
}
