package sim

import (
	"slices"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/signals"
)

// metricsOf is what engine e's /metrics page says right now, as the
// router's scraper would parse it (the vLLM flavour, like the emulator's).
// During a step it is the engine as the step found it: like the step's
// outputs, its outcome (admissions, finished requests, blocks allocated
// and freed, prefix-cache counters) shows when the step ends, as the
// emulator's page and vLLM's per-step stats show it.
func metricsOf(e *simEngine) signals.Metrics {
	st := e.pre
	if !e.inStep {
		st = e.eng.Stats()
	}
	m := signals.Metrics{
		Flavor: signals.FlavorVLLM,
		Have: signals.HasWaiting | signals.HasRunning | signals.HasKVUsage | signals.HasPrefixCounters |
			signals.HasPreemptions | signals.HasCacheConfig | signals.HasKVCapacity,
		Waiting:          float64(st.Waiting),
		Running:          float64(st.Running),
		KVUsage:          st.KVUsage,
		PrefixQueries:    float64(st.PrefixQueries),
		PrefixHits:       float64(st.PrefixHits),
		Preemptions:      float64(st.Preemptions),
		PromptTokens:     float64(st.PromptTokens),
		GenerationTokens: float64(st.GenerationTokens),
		BlockSize:        st.BlockSize,
		NumGPUBlocks:     st.NumGPUBlocks,
		KVCapacityTokens: st.BlockSize * st.NumGPUBlocks,
	}
	if e.loraStepped {
		m.Have |= signals.HasLoRA
		m.LoRARunning, m.LoRAWaiting = e.loraRunning, e.loraWaiting
		m.LoRAAdapters = slices.Compact(slices.Sorted(slices.Values(append(slices.Clip(e.loraRunning), e.loraWaiting...))))
		m.MaxLoRA = e.maxLoRAs
	}
	return m
}

// recordLoRAs records engine e's running and waiting LoRA adapters for its
// vllm:lora_requests_info (metricsOf), which vLLM sets with each step's
// stats and leaves as it was while the engine idles: the simulator calls
// it when a step starts (the adapters as the step found them, like
// simEngine.pre) and when the engine goes idle. An engine that never
// finished a step (ended: one just did) has no series. The lists are new
// each time: the scrapes in flight keep the old ones.
func recordLoRAs(e *simEngine, ended bool) {
	e.loraStepped = e.loraStepped || ended
	if !e.loraStepped {
		return
	}
	run, wait := e.eng.AppendLoRAs(nil, nil)
	slices.Sort(run)
	slices.Sort(wait)
	e.loraRunning, e.loraWaiting = run, wait
}

// engineTotals returns engine e's preemptions and prefix-cache hit rate.
func engineTotals(e *simEngine) (preemptions int, hitRate float64) {
	st := e.eng.Stats()
	if st.PrefixQueries > 0 {
		hitRate = float64(st.PrefixHits) / float64(st.PrefixQueries)
	}
	return int(st.Preemptions), hitRate
}

// applyEvents feeds a batch of engine KV events to the precise index, as
// the router's KV-event subscriber does: a LoRA adapter's blocks are
// stored with the adapter's key as each block's salt (kvindex.BlockKey of
// the block's extra keys, (lora_name,)), so the index keys them as
// kvindex.HashTokensKeyed keys the adapter's prompts. salts is scratch
// space.
func applyEvents(x *kvindex.Index, endpoint string, batch []engine.KVEvent, salts *[]uint64) {
	for i := range batch {
		ev := &batch[i]
		switch ev.Kind {
		case engine.BlockStored:
			st := kvindex.Stored{BlockHashes: ev.BlockHashes, Tokens: ev.TokenIDs, BlockSize: ev.BlockSize,
				Tier: kvroute.TierGPU}
			if ev.ParentHash != nil {
				st.Parent, st.HasParent = *ev.ParentHash, true
			}
			if ev.LoRA != "" {
				k := kvindex.BlockKey(ev.LoRA, "")
				*salts = (*salts)[:0]
				for range ev.BlockHashes {
					*salts = append(*salts, k)
				}
				st.Salts = *salts
			}
			// An orphan (its parent was evicted before this event was
			// applied) is dropped, as the live subscriber drops it.
			_, _ = x.Store(endpoint, st)
		case engine.BlockRemoved:
			x.Evict(endpoint, ev.BlockHashes, kvroute.TierGPU)
		case engine.AllBlocksCleared:
			x.Clear(endpoint)
		}
	}
}
