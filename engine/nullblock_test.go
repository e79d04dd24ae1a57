package engine

import "testing"

// TestNullBlock: vLLM's BlockPool takes block 0 as the null block when it
// starts and never frees it, so of num_gpu_blocks one fewer hold KV,
// vllm:kv_cache_usage_perc is 1 - free / (num_gpu_blocks - 1)
// (BlockPool.get_usage) and vllm:cache_config_info still reports
// num_gpu_blocks. Worked by hand on 17 blocks of 16 tokens: 16 usable, so
// the default max model length drops to 256 tokens; a held request of 100
// prompt tokens and 1 output holds ceil(100 / 16) = 7 blocks (the output
// token is not yet computed), so usage is 7/16 = 0.4375 (not 7/17), 9
// blocks are free, and its block ids are vLLM's 1..16, never 0.
func TestNullBlock(t *testing.T) {
	e := mustEngine(t, "tiny", func(c *Config) { c.NumGPUBlocks = 17 })
	if got := e.Profile().MaxModelLen; got != 256 {
		t.Errorf("MaxModelLen %d, want 256 (16 usable blocks of 16)", got)
	}
	if got := e.Profile().UsableBlocks(); got != 16 {
		t.Errorf("UsableBlocks %d, want 16", got)
	}
	d := newDriver(t, e)
	d.add(&Request{ID: "a", Prompt: tokens(0, 100), MaxTokens: 1, HoldKV: true})
	d.run()
	ids := e.BlockIDs("a")
	if len(ids) != 7 {
		t.Fatalf("held request holds %d blocks (%v), want 7", len(ids), ids)
	}
	for _, id := range ids {
		if id < 1 || id > 16 {
			t.Errorf("block id %d outside vLLM's 1..16 (0 is the null block): %v", id, ids)
		}
	}
	st := e.Stats()
	if st.NumGPUBlocks != 17 || st.FreeBlocks != 9 || st.KVUsage != 7.0/16 {
		t.Errorf("Stats: %d blocks, %d free, usage %v; want 17, 9, %v", st.NumGPUBlocks, st.FreeBlocks, st.KVUsage, 7.0/16)
	}
	e.Release("a")
	if st := e.Stats(); st.FreeBlocks != 16 || st.KVUsage != 0 {
		t.Errorf("after release: %d free, usage %v; want 16, 0", st.FreeBlocks, st.KVUsage)
	}
	// One block is too few: it would be the null block alone.
	if _, err := New(Config{Profile: e.Profile(), NumGPUBlocks: 1}); err == nil {
		t.Error("New with 1 block succeeded, want an error (nothing left past the null block)")
	}
}
