package engine

import (
	"fmt"
	"slices"
	"testing"
)

// storedBlocks returns the hashes the BlockStored events of r report, and
// the number of those events.
func storedBlocks(r StepResult) (hashes []uint64, events int) {
	for _, ev := range r.Events {
		if ev.Kind == BlockStored {
			hashes = append(hashes, ev.BlockHashes...)
			events++
		}
	}
	return hashes, events
}

// TestRemoteKV follows a RemoteKV request (a P/D decode leg) as vLLM's
// scheduler handles one: admitted, it holds blocks for its whole prompt
// and waits, counted as waiting, computing nothing, until its KV arrived;
// then its received full blocks are cached (BlockStored) and it computes
// its last prompt token in its next step. Its prompt then hits in the
// prefix cache as any computed one.
func TestRemoteKV(t *testing.T) {
	for _, tt := range []struct {
		name         string
		plen         int
		stored       int // full blocks cached once the KV arrived
		storedEvents int // in how many BlockStored events
	}{
		{"partial last block", 300, 18, 1},
		// A prompt of whole blocks: the blocks up to the last token first,
		// then the last block, filled by the recomputed token
		// (_update_waiting_for_remote_kv's cache_blocks, then
		// allocate_slots').
		{"whole blocks", 320, 20, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := mustEngine(t, "tiny", nil) // 64 blocks of 16
			d := newDriver(t, e)
			prompt := tokens(1, tt.plen)
			blocks := (tt.plen + 15) / 16
			d.add(&Request{ID: "d", Prompt: prompt, MaxTokens: 3, RemoteKV: true})
			r := d.step()
			if want := []KVLoad{{ID: "d", LocalTokens: 0, ExternalTokens: tt.plen}}; !slices.Equal(r.Loads, want) {
				t.Fatalf("admission step: loads %+v, want %+v", r.Loads, want)
			}
			if r.Duration != 0 || len(r.Outputs) != 0 || len(r.Events) != 0 {
				t.Fatalf("admission step: %v, outputs %+v, events %+v; want nothing computed or cached", r.Duration, r.Outputs, r.Events)
			}
			st := e.Stats()
			if st.Waiting != 1 || st.Running != 0 || st.Loading != 1 || st.LoadQueued != 0 || st.FreeBlocks != 64-blocks ||
				st.KVUsage != float64(blocks)/64 {
				t.Fatalf("while the KV arrives: %+v; want 1 waiting (loading) holding %d blocks", st, blocks)
			}
			if st.PrefixQueries != int64(tt.plen) || st.PrefixHits != 0 || st.ExternalQueries != int64(tt.plen) ||
				st.ExternalHits != int64(tt.plen) {
				t.Errorf("queries: %+v; want prefix %d/0, external %d/%d", st, tt.plen, tt.plen, tt.plen)
			}
			if e.HasWork() {
				t.Fatal("HasWork = true while the only request waits for its KV")
			}
			if r := d.step(); r.Duration != 0 || len(r.Loads) != 0 {
				t.Fatalf("a step while the KV arrives: %+v", r)
			}
			e.LoadedKV("d", true)
			e.LoadedKV("d", true) // no longer waiting: ignored
			if !e.HasWork() {
				t.Fatal("HasWork = false after LoadedKV")
			}
			r = d.step()
			hashes, events := storedBlocks(r)
			if len(hashes) != tt.stored || events != tt.storedEvents {
				t.Errorf("step after the KV arrived: %d blocks stored in %d events, want %d in %d", len(hashes), events, tt.stored, tt.storedEvents)
			}
			if r.Batch.PrefillTokens != 1 || len(r.Outputs) != 1 || !r.Outputs[0].First || r.Outputs[0].CachedTokens != tt.plen-1 {
				t.Fatalf("step after the KV arrived: batch %+v, outputs %+v; want the last prompt token computed, %d cached",
					r.Batch, r.Outputs, tt.plen-1)
			}
			d.run()
			st = e.Stats()
			if st.PromptTokens != int64(tt.plen) || st.PromptCached != int64(tt.plen-1) || st.PromptExternal != int64(tt.plen) ||
				st.PromptRecomputed != 1 || st.FreeBlocks != 64 || st.Waiting != 0 || st.Loading != 0 {
				t.Errorf("after: %+v", st)
			}
			// The received prompt is in the prefix cache: a plain request
			// with the same prompt hits every block but the one with its
			// last token.
			d.add(&Request{ID: "again", Prompt: prompt, MaxTokens: 1})
			d.run()
			if got, want := d.byID("again")[0].CachedTokens, (tt.plen-1)/16*16; got != want {
				t.Errorf("same prompt again: %d cached tokens, want %d", got, want)
			}
		})
	}
}

// TestRemoteKVLocalHit: a RemoteKV request whose prompt starts with
// blocks this engine caches waits only for the rest (vLLM's NixlConnector
// reads the blocks past the local hit): its KVLoad, the prefix-cache and
// connector stats, and the blocks cached when the KV arrived say so.
func TestRemoteKVLocalHit(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.KVConnector = true })
	d := newDriver(t, e)
	prompt := tokens(1, 300)
	d.add(&Request{ID: "turn1", Prompt: prompt[:170], MaxTokens: 1}) // 10 full blocks cached
	d.run()
	before := e.Stats()
	if before.ExternalQueries != 170 || before.ExternalHits != 0 {
		t.Errorf("a plain request with KVConnector: external %d/%d, want 170/0", before.ExternalQueries, before.ExternalHits)
	}
	d.add(&Request{ID: "turn2", Prompt: prompt, MaxTokens: 2, RemoteKV: true})
	r := d.step()
	if want := []KVLoad{{ID: "turn2", LocalTokens: 160, ExternalTokens: 140}}; !slices.Equal(r.Loads, want) {
		t.Fatalf("loads %+v, want %+v", r.Loads, want)
	}
	st := e.Stats()
	if q, h := st.PrefixQueries-before.PrefixQueries, st.PrefixHits-before.PrefixHits; q != 300 || h != 160 {
		t.Errorf("prefix cache: %d queries, %d hits; want 300, 160", q, h)
	}
	if q, h := st.ExternalQueries-before.ExternalQueries, st.ExternalHits-before.ExternalHits; q != 140 || h != 140 {
		t.Errorf("connector: %d queries, %d hits; want 140, 140", q, h)
	}
	e.LoadedKV("turn2", true)
	r = d.step()
	if hashes, _ := storedBlocks(r); len(hashes) != 8 { // blocks 10..17
		t.Errorf("%d blocks stored, want the 8 received full blocks", len(hashes))
	}
	d.run()
	st = e.Stats()
	if c, x := st.PromptCached-before.PromptCached, st.PromptExternal-before.PromptExternal; c != 299 || x != 140 {
		t.Errorf("prompt tokens by source: cached %d, external %d; want 299, 140", c, x)
	}
}

// TestRemoteKVWaitsForBlocks: a RemoteKV request whose prompt's blocks do
// not fit waits in the queue, like any request (vLLM's allocate_slots
// fails and the scheduler stops at it, FCFS: the request behind it waits
// too), and is admitted, to wait for its KV, once blocks are freed.
func TestRemoteKVWaitsForBlocks(t *testing.T) {
	e := mustEngine(t, "tiny", nil) // 64 blocks
	d := newDriver(t, e)
	d.add(&Request{ID: "lease", Prompt: tokens(1, 800), MaxTokens: 1, HoldKV: true}) // 50 blocks held
	d.run()
	d.add(&Request{ID: "d", Prompt: tokens(2000, 300), MaxTokens: 2, RemoteKV: true}) // 19 blocks
	d.add(&Request{ID: "small", Prompt: tokens(5000, 20), MaxTokens: 2})
	if r := d.step(); len(r.Loads) != 0 || len(r.Outputs) != 0 {
		t.Fatalf("admitted with 14 blocks free: %+v", r)
	}
	if st := e.Stats(); st.Waiting != 2 || st.LoadQueued != 1 || st.Loading != 0 || st.FreeBlocks != 14 {
		t.Fatalf("queued: %+v", st)
	}
	if e.HasWork() {
		t.Fatal("HasWork = true although nothing can run until a Release")
	}
	e.Release("lease")
	r := d.step()
	if len(r.Loads) != 1 || r.Loads[0].ID != "d" || len(r.Outputs) != 1 || r.Outputs[0].ID != "small" {
		t.Fatalf("after the release: loads %+v, outputs %+v; want d loading and small's first token", r.Loads, r.Outputs)
	}
	if st := e.Stats(); st.Loading != 1 || st.LoadQueued != 0 || st.Waiting != 1 || st.Running != 1 {
		t.Fatalf("after the release: %+v", st)
	}
	e.LoadedKV("d", true)
	d.run()
	if out := d.byID("d"); len(out) != 2 || out[0].CachedTokens != 299 {
		t.Errorf("d: outputs %+v", out)
	}
}

// TestRemoteKVAbort: a RemoteKV request aborted while it waits for its KV,
// for its blocks, or to be scheduled once its KV arrived frees its blocks
// and leaves no count behind.
func TestRemoteKVAbort(t *testing.T) {
	for _, when := range []string{"queued", "loading", "loaded"} {
		t.Run(when, func(t *testing.T) {
			e := mustEngine(t, "tiny", func(c *Config) { c.MaxNumSeqs = 1 })
			d := newDriver(t, e)
			if when == "queued" {
				d.add(&Request{ID: "lease", Prompt: tokens(1, 800), MaxTokens: 1, HoldKV: true})
				d.run()
			}
			d.add(&Request{ID: "d", Prompt: tokens(2000, 300), MaxTokens: 2, RemoteKV: true})
			d.step()
			if when == "loaded" {
				// Waiting for its KV, d takes no seat of max_num_seqs;
				// busy takes the one there is.
				d.add(&Request{ID: "busy", Prompt: tokens(9000, 20), MaxTokens: 50})
				d.step()
				e.LoadedKV("d", true)
				d.step() // no seat: d stays queued with its blocks
				if st := e.Stats(); st.Waiting != 1 || st.Loading != 0 || st.FreeBlocks > 64-19 {
					t.Fatalf("loaded, not scheduled: %+v", st)
				}
			}
			e.Abort(d.now, "d")
			e.LoadedKV("d", true) // loading: its transfer ended, its blocks are freed (TestRemoteKVAbortWhileLoading); else ignored
			r := d.step()
			if i := slices.IndexFunc(r.Outputs, func(o Output) bool { return o.ID == "d" }); i < 0 || r.Outputs[i].FinishReason != FinishAbort {
				t.Fatalf("step after the abort: outputs %+v, want d's abort", r.Outputs)
			}
			e.Abort(d.now, "busy")
			e.Release("lease")
			d.run()
			st := e.Stats()
			if st.FreeBlocks != 64 || st.Waiting != 0 || st.Loading != 0 || st.LoadQueued != 0 || st.Running != 0 {
				t.Errorf("after the abort: %+v, want every block free and no request", st)
			}
		})
	}
}

// TestRemoteKVFailed: a RemoteKV request whose KV did not arrive
// (LoadedKV false: kv_load_failure_policy "recompute") after a local hit
// keeps the blocks it holds (vLLM truncates its computed tokens at the
// first block that failed, the first past the hit) and computes its
// prompt past the hit into them; nothing it did not compute is cached,
// and its lookup is counted once.
func TestRemoteKVFailed(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	prompt := tokens(1, 300)
	d.add(&Request{ID: "turn1", Prompt: prompt[:170], MaxTokens: 1})
	d.run()
	before := e.Stats()
	d.add(&Request{ID: "d", Prompt: prompt, MaxTokens: 2, RemoteKV: true})
	d.step()
	held := e.BlockIDs("d")
	e.LoadedKV("d", false)
	if st := e.Stats(); st.FreeBlocks != 64-len(held) || st.Loading != 0 || st.Waiting != 1 {
		t.Fatalf("after the failure: %+v, want its %d blocks held and it waiting", st, len(held))
	}
	from := len(d.steps)
	d.step()
	if got := e.BlockIDs("d"); !slices.Equal(got[:len(held)], held) || len(got) != len(held) {
		t.Errorf("blocks after the failure's first step %v, want those it held %v", got, held)
	}
	d.run()
	out := d.byID("d")
	if len(out) != 2 || out[0].CachedTokens != 160 {
		t.Fatalf("outputs %+v, want 2 tokens with the 160 local tokens cached", out)
	}
	prefill, stored := 0, 0
	for _, s := range d.steps[from:] {
		prefill += s.Batch.PrefillTokens
		for _, ev := range s.Events {
			if ev.Kind == BlockStored {
				stored += len(ev.BlockHashes)
			}
		}
	}
	if prefill != 140 {
		t.Errorf("%d prompt tokens computed, want the 140 past the local hit", prefill)
	}
	if stored != 8 {
		t.Errorf("%d blocks stored after the failure, want the 8 full ones past the hit (blocks 10-17)", stored)
	}
	st := e.Stats()
	if q := st.PrefixQueries - before.PrefixQueries; q != 300 {
		t.Errorf("%d prefix-cache queries, want the prompt once", q)
	}
	if x := st.PromptExternal - before.PromptExternal; x != 0 {
		t.Errorf("%d prompt tokens counted external, want 0", x)
	}
}

// TestRemoteKVFailedNoHit: with no local hit, a RemoteKV request whose KV
// did not arrive frees its blocks and goes back to the front of the queue
// (vLLM's _update_waiting_for_remote_kv frees them), where it looks its
// prompt up again: a request computed meanwhile cached part of it, which
// it hits, and the new lookup is counted as vLLM's scheduler counts it.
func TestRemoteKVFailedNoHit(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	prompt := tokens(2, 100)
	d.add(&Request{ID: "d", Prompt: prompt, MaxTokens: 2, RemoteKV: true})
	if r := d.step(); len(r.Loads) != 1 || r.Loads[0].LocalTokens != 0 {
		t.Fatalf("loads %+v, want d's with no local hit", r.Loads)
	}
	d.add(&Request{ID: "other", Prompt: prompt[:70], MaxTokens: 1}) // its 4 full blocks are cached
	d.run()
	e.LoadedKV("d", false)
	if st := e.Stats(); st.FreeBlocks != 64 || st.Loading != 0 || st.Waiting != 1 {
		t.Fatalf("after the failure: %+v, want its blocks freed and it queued", st)
	}
	from := len(d.steps)
	d.run()
	out := d.byID("d")
	if len(out) != 2 || out[0].CachedTokens != 64 {
		t.Fatalf("outputs %+v, want 2 tokens with other's 64 cached", out)
	}
	prefill := 0
	for _, s := range d.steps[from:] {
		prefill += s.Batch.PrefillTokens
	}
	if prefill != 36 {
		t.Errorf("%d prompt tokens computed, want the 36 past the new hit", prefill)
	}
	if q := e.Stats().PrefixQueries; q != 100+70+100 {
		t.Errorf("%d prefix-cache queries, want d's twice and other's", q)
	}
}

// TestRemoteKVKeepsDecodeRuns: requests waiting for their KV do not stop
// the running requests' plain decode runs (they are in no queue the next
// step reads), so a real-time driver still sleeps through them.
func TestRemoteKVKeepsDecodeRuns(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	d.add(&Request{ID: "run", Prompt: tokens(1, 20), MaxTokens: 100})
	d.step()
	d.step()
	d.add(&Request{ID: "d", Prompt: tokens(500, 200), MaxTokens: 2, RemoteKV: true})
	if n, _, _ := e.DecodeRun(8); n != 0 {
		t.Fatalf("DecodeRun = %d with a request to admit", n)
	}
	d.step()
	if n, _, _ := e.DecodeRun(8); n != 8 {
		t.Fatalf("DecodeRun = %d while a request waits for its KV, want 8", n)
	}
	e.LoadedKV("d", true)
	if n, _, _ := e.DecodeRun(8); n != 0 {
		t.Fatalf("DecodeRun = %d with a request whose KV arrived, want 0", n)
	}
	d.run()
}

// TestRemoteKVShortPrompt: a prompt shorter than a block is loaded as any
// other when the driver marks it RemoteKV (SGLang moves a short prompt's
// partial page; the emulator marks no such vLLM decode leg): admitted, it
// holds its one block and waits for its KV, then computes its last token.
func TestRemoteKVShortPrompt(t *testing.T) {
	e := mustEngine(t, "tiny", nil)
	d := newDriver(t, e)
	d.add(&Request{ID: "d", Prompt: tokens(1, 10), MaxTokens: 2, RemoteKV: true})
	r := d.step()
	if want := []KVLoad{{ID: "d", ExternalTokens: 10}}; !slices.Equal(r.Loads, want) || r.Batch.PrefillTokens != 0 {
		t.Fatalf("loads %+v, batch %+v; want %+v, nothing computed", r.Loads, r.Batch, want)
	}
	if st := e.Stats(); st.Loading != 1 || st.FreeBlocks != 63 {
		t.Fatalf("while its KV arrives: %+v; want it loading, holding 1 block", st)
	}
	e.LoadedKV("d", true)
	r = d.step()
	if r.Batch.PrefillTokens != 1 || len(r.Outputs) != 1 || r.Outputs[0].CachedTokens != 9 {
		t.Fatalf("after its KV arrived: batch %+v, outputs %+v; want its last token computed, 9 cached", r.Batch, r.Outputs)
	}
	d.run()
}

// TestRemoteKVAbortWhileLoading: a RemoteKV request aborted while its KV
// arrives leaves the queues and is reported at once, but keeps its blocks
// until the transfer ends (LoadedKV, ok or not), as vLLM's scheduler
// delays freeing them (finish_requests: delay_free_blocks for a request in
// WAITING_FOR_REMOTE_KVS, freed on finished_recving): the transfer still
// writes into them. Its local prefix hit stays cached; what it received is
// not.
func TestRemoteKVAbortWhileLoading(t *testing.T) {
	for _, ok := range []bool{true, false} {
		t.Run(fmt.Sprintf("ok=%v", ok), func(t *testing.T) {
			e := mustEngine(t, "tiny", nil)
			d := newDriver(t, e)
			d.add(&Request{ID: "warm", Prompt: tokens(2000, 64), MaxTokens: 1})
			d.run()
			d.add(&Request{ID: "d", Prompt: tokens(2000, 300), MaxTokens: 2, RemoteKV: true})
			if r := d.step(); len(r.Loads) != 1 || r.Loads[0].LocalTokens != 64 {
				t.Fatalf("admission: loads %+v, want d's with its 64-token local hit", r.Loads)
			}
			held := e.Stats().FreeBlocks
			e.Abort(d.now, "d")
			st := e.Stats()
			if st.Waiting != 0 || st.Loading != 0 || st.AbortedLoading != 1 || st.FreeBlocks != held {
				t.Fatalf("aborted during its transfer: %+v; want nobody waiting, 1 aborted load, %d free blocks (its own held)", st, held)
			}
			r := d.step()
			if i := slices.IndexFunc(r.Outputs, func(o Output) bool { return o.ID == "d" }); i < 0 || r.Outputs[i].FinishReason != FinishAbort {
				t.Fatalf("step after the abort: outputs %+v, want d's abort at once", r.Outputs)
			}
			e.Abort(d.now, "d") // again: ignored
			if st := e.Stats(); st.FreeBlocks != held {
				t.Fatalf("second abort freed blocks: %d free, want %d", st.FreeBlocks, held)
			}
			e.LoadedKV("d", ok)
			st = e.Stats()
			if st.AbortedLoading != 0 || st.FreeBlocks != 64 || st.CachedBlocks != 4 {
				t.Fatalf("after its transfer ended: %+v; want every block free, the 4 warm blocks cached", st)
			}
			if err := e.Add(d.now, &Request{ID: "d", Prompt: tokens(1, 20), MaxTokens: 1}); err != nil {
				t.Fatalf("the ID is free again: %v", err)
			}
		})
	}
}
