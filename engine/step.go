package engine

import (
	"encoding/binary"
	"slices"
	"time"

	"github.com/zeebo/xxh3"
)

// Step runs one scheduler iteration starting at virtual time now and returns
// what it did in a fresh StepResult.
func (e *Engine) Step(now time.Duration) StepResult {
	var r StepResult
	e.StepInto(now, &r)
	return r
}

// StepInto is Step writing into r, reusing its slices: the previous contents
// of r (and any event slices taken from it) are overwritten. Drivers that
// consume a step's results before the next step use it to avoid allocating.
func (e *Engine) StepInto(now time.Duration, r *StepResult) {
	r.Duration, r.Batch, r.Preempted = 0, Batch{}, 0
	r.Loads = r.Loads[:0]
	r.Outputs = append(r.Outputs[:0], e.aborted...)
	r.Summarized, r.ITLs = 0, r.ITLs[:0]
	clear(e.aborted)
	e.aborted = e.aborted[:0]
	r.Events = r.Events[:0]
	r.removed = r.removed[:0]
	if e.pendingClear {
		r.Events = append(r.Events, KVEvent{Kind: AllBlocksCleared})
		e.pendingClear = false
	}
	e.res = r
	defer func() { e.res = nil }()

	e.schedule(now, r)
	if len(e.sched) == 0 {
		e.stalled = e.waiting.len() > 0 && len(e.running) == 0 && r.Preempted == 0
		return
	}
	r.Duration = e.stepTime(&r.Batch)
	end := now + r.Duration
	e.stats.Steps++
	e.stats.BusyTime += r.Duration

	finished := false
	for _, sc := range e.sched {
		s := sc.s
		s.computed += sc.n
		if s.computed < s.numTokens {
			continue // a prefill chunk; no token yet
		}
		finished = e.emit(s, end, r) || finished
	}
	clear(e.sched)
	e.sched = e.sched[:0]
	if finished {
		e.dropFinished()
	}
}

// schedule picks this step's work as vLLM V1's scheduler does: running
// requests first, in order (decodes and unfinished prefill chunks), each
// taking min(remaining, budget) tokens and preempting the newest running
// request when blocks run out; then, if nothing was preempted, the
// RemoteKV requests whose KV arrived (LoadedKV), and waiting requests in
// FCFS order with their prefix-cache hits, chunked to the remaining
// budget, while max_num_seqs allows (a RemoteKV request admitted takes
// its blocks and waits for its KV, off the queues, taking neither budget
// nor a seat). With Config.MaxLoRAs, a loaded or waiting request whose
// adapter is not among those of the requests scheduled so far is skipped
// when they are MaxLoRAs already (vLLM's scheduled_loras, which starts
// from the running requests scheduled): the skipped stay at the head of
// the queue, in order, as vLLM puts them back.
func (e *Engine) schedule(now time.Duration, r *StepResult) {
	budget := e.budget
	for i := 0; i < len(e.running) && budget > 0; {
		s := e.running[i]
		n := min(s.numTokens-s.computed, budget)
		if n <= 0 {
			i++
			continue
		}
		ok := true
		for !e.allocate(s, n) {
			victim := e.running[len(e.running)-1]
			e.running[len(e.running)-1] = nil
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			r.Preempted++
			if victim == s {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		e.add(s, n, r)
		budget -= n
		i++
	}
	if r.Preempted > 0 {
		return
	}
	limit := e.cfg.MaxLoRAs > 0 && e.loraSeqs > 0
	if limit {
		e.stepLoRAs = e.stepLoRAs[:0]
		for _, sc := range e.sched {
			e.useLoRA(sc.s.lora)
		}
	}
	for i := 0; i < len(e.loaded) && budget > 0 && len(e.running) < e.maxSeqs; {
		s := e.loaded[i]
		if limit && !e.useLoRA(s.lora) {
			i++
			continue
		}
		e.loaded[i+copy(e.loaded[i:], e.loaded[i+1:])] = nil
		e.loaded = e.loaded[:len(e.loaded)-1]
		n := e.admitLoaded(now, s, budget)
		s.status = statusRunning
		e.running = append(e.running, s)
		e.add(s, n, r)
		budget -= n
	}
	for e.waiting.len() > 0 && budget > 0 && len(e.running) < e.maxSeqs {
		s := e.waiting.front()
		if limit && !e.fitsLoRA(s.lora) {
			e.skippedLoRA = append(e.skippedLoRA, e.waiting.popFront())
			continue
		}
		n, ok := e.admit(now, s, budget)
		if !ok {
			break
		}
		e.waiting.popFront()
		if n == 0 {
			continue // a RemoteKV request, waiting for its KV (statusLoading)
		}
		if limit {
			e.useLoRA(s.lora)
		}
		s.status = statusRunning
		e.running = append(e.running, s)
		e.add(s, n, r)
		budget -= n
	}
	if k := len(e.skippedLoRA); k > 0 {
		for i := k - 1; i >= 0; i-- {
			e.waiting.pushFront(e.skippedLoRA[i])
		}
		clear(e.skippedLoRA)
		e.skippedLoRA = e.skippedLoRA[:0]
	}
}

// loraBlocked reports whether no waiting request can join a plain decode
// step, which schedules every running request, because of
// Config.MaxLoRAs: the running requests' adapters are MaxLoRAs already and
// every waiting request is of another adapter (schedule skips them all,
// changing nothing), until a running request finishes.
func (e *Engine) loraBlocked() bool {
	if e.cfg.MaxLoRAs == 0 || e.loraSeqs == 0 {
		return false
	}
	e.stepLoRAs = e.stepLoRAs[:0]
	for _, s := range e.running {
		e.useLoRA(s.lora)
	}
	if len(e.stepLoRAs) < e.cfg.MaxLoRAs {
		return false
	}
	for i := range e.waiting.len() {
		if e.fitsLoRA(e.waiting.at(i).lora) {
			return false
		}
	}
	return true
}

// fitsLoRA reports whether a request of adapter lora (0: the base model)
// may join the step's requests under Config.MaxLoRAs: its adapter is
// among theirs, or they have fewer than MaxLoRAs.
func (e *Engine) fitsLoRA(lora uint16) bool {
	return lora == 0 || len(e.stepLoRAs) < e.cfg.MaxLoRAs || slices.Contains(e.stepLoRAs, lora)
}

// useLoRA adds adapter lora to the step's when it fits (fitsLoRA) and
// reports whether it did.
func (e *Engine) useLoRA(lora uint16) bool {
	if lora == 0 || slices.Contains(e.stepLoRAs, lora) {
		return true
	}
	if len(e.stepLoRAs) >= e.cfg.MaxLoRAs {
		return false
	}
	e.stepLoRAs = append(e.stepLoRAs, lora)
	return true
}

// add records that s computes n tokens this step.
func (e *Engine) add(s *sequence, n int, r *StepResult) {
	e.sched = append(e.sched, scheduled{s: s, n: n})
	b := &r.Batch
	b.Seqs++
	if s.computed+n == s.numTokens {
		b.Sampled++
	}
	if n == 1 && s.outputs > 0 && s.computed == s.numTokens-1 {
		b.DecodeTokens++
		b.DecodeContext += s.numTokens
		return
	}
	b.PrefillTokens += n
	b.PrefillAttnPairs += float64(n) * (float64(s.computed) + float64(n)/2)
	b.PrefillContext += s.computed
}

// allocate makes room in s's blocks for n more tokens, caching the blocks
// that become full. It returns false, changing nothing, when the free queue
// is too short.
func (e *Engine) allocate(s *sequence, n int) bool {
	upTo := s.computed + n
	if upTo <= len(s.blocks)*e.bs && upTo < (s.numStored+1)*e.bs {
		// The common decode step: the tokens fit the blocks held and fill
		// no new block (a multiplication, not allocN's and cacheFull's
		// divisions, once a token per running request).
		return true
	}
	need := (upTo+e.bs-1)/e.bs - len(s.blocks)
	if need > e.pool.numFree {
		return false
	}
	e.allocN(s, need)
	e.cacheFull(s, upTo)
	return true
}

// admit schedules a waiting request: it finds its prefix-cache hit, then
// allocates blocks for min(uncached, budget) tokens. It returns the tokens
// to compute this step, or false when the blocks do not fit.
func (e *Engine) admit(now time.Duration, s *sequence, budget int) (int, bool) {
	hits := e.hitIDs[:0]
	evictable := 0
	if e.caching {
		// At least one token must be computed to produce logits.
		limit := min((s.numTokens-1)/e.bs, len(s.hashes))
		e.hitsAhead(s.hashes[:limit])
		e.epoch++
		for _, h := range s.hashes[:limit] {
			e.findDeferred(h)
			id, ok := e.pool.lookup(h)
			if !ok || e.pool.blocks[id].mark == e.epoch {
				break // a miss, or a key repeated in a caller-given chain
			}
			e.pool.blocks[id].mark = e.epoch
			hits = append(hits, id)
			if e.pool.blocks[id].ref == 0 {
				evictable++
			}
		}
	}
	e.hitIDs = hits
	hit := len(hits)
	if s.remote {
		return 0, e.admitRemote(s, hits, evictable)
	}
	computed := hit * e.bs
	if promptLen := int(s.promptLen); s.skipPrefill && s.outputs == 0 && computed < promptLen-1 {
		computed = promptLen - 1 // KV transferred from the prefill engine
	}
	n := min(s.numTokens-computed, budget)
	need := (computed+n+e.bs-1)/e.bs - hit
	if need > e.pool.numFree-evictable {
		return 0, false
	}
	for _, id := range hits {
		e.pool.touch(id)
	}
	s.blocks = append(s.blocks, hits...)
	s.numStored = hit
	s.computed = computed
	e.allocN(s, need)
	e.cacheFull(s, computed+n)
	if !s.admitted {
		s.admitted = true
		s.firstSched = now
		s.cachedTokens = int32(computed)
		if !s.counted {
			e.countQueries(s, hit*e.bs)
		}
	}
	return n, true
}

// countQueries records s's first lookup, local tokens of its prompt hit:
// in the prefix cache's stats (vLLM records no query when prefix caching
// is off), and the KV connector's (its tokens past the hit, those that
// arrive from outside hit), as vLLM's scheduler records them when it first
// allocates a request's blocks (Scheduler.schedule: the local
// KVCacheManager lookup, then connector_prefix_cache_stats with the
// connector's get_num_new_matched_tokens).
func (e *Engine) countQueries(s *sequence, local int) {
	s.counted = true
	if e.caching {
		e.stats.PrefixQueries += int64(s.promptLen)
		e.stats.PrefixHits += int64(local)
	}
	if e.cfg.KVConnector || s.remote {
		e.stats.ExternalQueries += int64(int(s.promptLen) - local)
		e.stats.ExternalHits += int64(s.external)
	}
}

// admitRemote admits RemoteKV request s, hits its leading blocks found in
// the prefix cache (evictable of them unreferenced), as vLLM's scheduler
// admits a request whose KV the connector loads asynchronously: blocks
// for the whole prompt at once (KVCacheManager.allocate_slots with the
// external tokens and no new ones), not cached until the KV arrived
// (delay_cache_blocks), no token computed; the request waits, off the
// queues (statusLoading), and the step reports it in Loads. It returns
// false, changing nothing, when the blocks do not fit.
func (e *Engine) admitRemote(s *sequence, hits []int32, evictable int) bool {
	hit := len(hits)
	need := (int(s.promptLen)+e.bs-1)/e.bs - hit
	if need > e.pool.numFree-evictable {
		return false
	}
	for _, id := range hits {
		e.pool.touch(id)
	}
	s.blocks = append(s.blocks, hits...)
	s.numStored = hit
	s.computed = hit * e.bs
	e.allocN(s, need)
	s.external = s.promptLen - int32(s.computed)
	s.status = statusLoading
	e.loadQueued--
	e.loading++
	e.countQueries(s, s.computed)
	if r := e.res; r != nil {
		r.Loads = append(r.Loads, KVLoad{ID: s.id, LocalTokens: s.computed, ExternalTokens: int(s.external)})
	}
	return true
}

// admitLoaded schedules s, a RemoteKV request whose KV arrived (LoadedKV),
// as vLLM's scheduler does (Scheduler._update_waiting_for_remote_kv, then
// its admission): the full blocks of the received tokens (all but the
// last prompt token) are cached, then the last token is computed in the
// blocks held, and the block it fills cached. One whose KV failed to
// arrive after a local hit computes its prompt from the hit instead, in
// chunks of the budget, into the blocks it holds. It returns the tokens
// to compute this step.
func (e *Engine) admitLoaded(now time.Duration, s *sequence, budget int) int {
	e.cacheFull(s, s.computed)
	n := min(s.numTokens-s.computed, budget)
	e.cacheFull(s, s.computed+n)
	if !s.admitted {
		s.admitted = true
		s.firstSched = now
		s.cachedTokens = int32(s.computed)
	}
	return n
}

// hitsAhead loads what the lookups of a prompt's prefix hit read, before
// them: for each key its deferred runs' counter (findDeferred's filter)
// and its home slot in the table, then the block the slot names. In a busy
// engine each is a cache miss at a random place, and loaded in these short
// loops the misses overlap, where the lookups, a key after the other,
// took them one at a time. At most the first maxLoadAhead*4 keys (4,096
// tokens of 16-token blocks): a prompt that misses early wastes at most
// that many loads, overlapped.
func (e *Engine) hitsAhead(keys []uint64) {
	keys = keys[:min(len(keys), maxLoadAhead*4)]
	t := e.pool.cached
	var sink uint64
	for _, k := range keys {
		sink += t.slots[tag(k)&t.mask]
		if e.keyCount != nil {
			sink += uint64(e.keyCount[k>>keyCountShift])
		}
	}
	for _, k := range keys {
		if sl := t.slots[tag(k)&t.mask]; sl != 0 {
			sink += uint64(t.blocks[int32(uint32(sl)-1)].ref)
		}
	}
	e.ahead += sink
}

// allocN appends need fresh blocks to s, reporting evictions as one
// BlockRemoved event.
func (e *Engine) allocN(s *sequence, need int) {
	if need <= 0 {
		return
	}
	r := e.res
	start := 0
	if r != nil {
		start = len(r.removed)
	}
	for range need {
		s.last = e.pool.alloc()
		s.blocks = append(s.blocks, s.last)
	}
	if r != nil && len(r.removed) > start {
		r.Events = append(r.Events, KVEvent{Kind: BlockRemoved, BlockHashes: r.removed[start:len(r.removed):len(r.removed)], Medium: MediumGPU})
	}
}

// evicted collects the hash of an evicted block for the step's events.
func (e *Engine) evicted(hash uint64) {
	if e.res != nil {
		e.res.removed = append(e.res.removed, hash)
	}
}

// cacheFull caches every block of s that is full within the first upTo
// tokens and not cached yet, reporting them as one BlockStored event, as
// vLLM's cache_full_blocks does (a block another request also computed is
// cached and reported as well: a second copy under the same hash).
func (e *Engine) cacheFull(s *sequence, upTo int) {
	full := min(upTo, s.numTokens) / e.bs
	if full <= s.numStored {
		return
	}
	if !e.caching {
		s.numStored = max(s.numStored, full)
		return
	}
	from, end := s.numStored, full
	for j := from; j < full; j++ {
		if e.deferring(s, j) && e.deferBlocks(s, j, full) {
			end = j // output blocks: keyed when a lookup could reach them
			break
		}
		key := e.blockKey(s, j)
		id := s.last // a decode step fills its last block
		if j != len(s.blocks)-1 {
			id = s.blocks[j]
		}
		// A deferred block with this key filled before this one: it is
		// cached first, as it would have been had it been keyed when it
		// filled.
		e.findDeferred(key)
		e.pool.cache(id, key)
	}
	if end > from {
		e.stored(s, from, end)
	}
	s.numStored = max(s.numStored, full)
}

// stored reports blocks [from, to) of s as one BlockStored event.
func (e *Engine) stored(s *sequence, from, to int) {
	r := e.res
	if r == nil || e.cfg.NoEvents {
		return
	}
	ev := KVEvent{Kind: BlockStored, BlockHashes: s.hashes[from:to:to], BlockSize: e.bs, Medium: MediumGPU}
	if from > 0 {
		ev.ParentHash = &s.hashes[from-1]
	} else if salt, ok := e.salts[s]; ok {
		ev.Salt = salt
	}
	if s.lora != 0 {
		ev.LoRA = e.loras[s.lora-1]
	}
	if s.tokenMode {
		base := int(s.tokBase) // 0 with events
		ev.TokenIDs = s.tokens[from*e.bs-base : to*e.bs-base : to*e.bs-base]
	}
	r.Events = append(r.Events, ev)
}

// blockKey returns the key of block j of s, extending the chain when block
// j holds tokens generated after Add (or prompt blocks BlockHashes did not
// cover). Blocks are hashed in order, so j <= len(s.hashes).
func (e *Engine) blockKey(s *sequence, j int) uint64 {
	if j < len(s.hashes) {
		return s.hashes[j]
	}
	var key uint64
	for len(s.hashes) <= j {
		key = e.nextKey(s)
	}
	return key // not read back from hashes: its line is cold (written once per block)
}

// nextKey computes the key of block len(s.hashes) of s and appends it.
func (e *Engine) nextKey(s *sequence) uint64 {
	i := len(s.hashes)
	if s.tokenMode {
		// s.parent is kept with the chain: reading hashes[i-1] instead
		// would miss the cache too.
		switch {
		case i == 0:
			lora, salt := "", e.salts[s]
			if s.lora != 0 {
				lora = e.loras[s.lora-1]
			}
			s.parent = e.hash.Keyed(e.hash.None(), e.blockTokens(s, 0), lora, salt)
		case s.lora != 0:
			parent := s.parent
			if int(s.parentN) != i {
				parent = digestOf(s.hashes[i-1]) // the chain continues from caller-given keys
			}
			s.parent = e.hash.Keyed(parent, e.blockTokens(s, i), e.loras[s.lora-1], "")
		case int(s.parentN) != i:
			// The chain continues from caller-given keys.
			s.parent = e.hash.Block(digestOf(s.hashes[i-1]), e.blockTokens(s, i))
		default:
			s.parent = e.hash.Block(s.parent, e.blockTokens(s, i))
		}
		key := s.parent.Key()
		s.hashes = append(s.hashes, key)
		s.parentN = int32(i + 1)
		return key
	}
	// No token ids: the block's content is this request's own output (or
	// unknown prompt), so its key only needs to be unique.
	var parent uint64
	if i > 0 {
		parent = s.hashes[i-1]
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], s.seed)
	binary.LittleEndian.PutUint64(b[8:], uint64(i))
	key := nonZero(xxh3.HashSeed(b[:], parent^0x9e3779b97f4a7c15))
	s.hashes = append(s.hashes, key)
	return key
}

// blockTokens returns the token ids of block i of s (token mode), the
// block after the last keyed one. Without KV events it then drops the
// stored tokens up to the block's end: a later key never needs them.
func (e *Engine) blockTokens(s *sequence, i int) []uint32 {
	lo, hi := i*e.bs, (i+1)*e.bs
	if !e.keepGen && lo >= int(s.promptLen) {
		// Outputs only (the common case of a decode step filling a block):
		// recomputed, without touching the tokens' line.
		b := e.blockBuf[:0]
		for p := lo; p < hi; p++ {
			b = append(b, e.token(s, p-int(s.promptLen)))
		}
		return b
	}
	base := int(s.tokBase) // lo >= base: blocks are keyed in order
	if hi-base <= len(s.tokens) {
		b := s.tokens[lo-base : hi-base]
		if !e.keepGen {
			// No event reports the block's tokens: keep only those after
			// it (see keepTokens). b is used before the next write.
			b = append(e.blockBuf[:0], b...)
			s.tokens = s.tokens[:copy(s.tokens, s.tokens[hi-base:])]
			s.tokBase = int32(hi)
		}
		return b
	}
	// The prompt's last tokens and the first outputs (only stored prompt
	// tokens are: keepGen keeps every token, so it never gets here).
	b := append(e.blockBuf[:0], s.tokens[lo-base:]...)
	for p := base + len(s.tokens); p < hi; p++ {
		b = append(b, e.token(s, p-int(s.promptLen)))
	}
	s.tokens, s.tokBase = s.tokens[:0], int32(hi)
	return b
}

// preempt frees s's blocks and puts it back at the front of the waiting
// queue to be recomputed (vLLM's recompute preemption).
func (e *Engine) preempt(s *sequence) {
	if s.run != 0 {
		// Key its deferred blocks now: its recomputation looks them up
		// (they stay cached after the free) and nothing else holds its
		// chain.
		e.unlinkRun(s.run - 1)
		e.materialize(s.run - 1)
	}
	e.freeBlocks(s)
	s.computed = 0
	s.numStored = 0
	s.status = statusWaiting
	s.preemptions++
	e.stats.Preemptions++
	e.waiting.pushFront(s)
}

// freeBlocks releases s's blocks tail first, so the free queue evicts a
// sequence's last blocks before its first ones.
// A request with deferred keys (deferred.go) keeps its block ids: its
// retired run finds them.
func (e *Engine) freeBlocks(s *sequence) {
	retire := s.run != 0
	if retire {
		e.retire(s)
	}
	for i := len(s.blocks) - 1; i >= 0; i-- {
		e.pool.release(s.blocks[i])
	}
	if !retire {
		s.blocks = s.blocks[:0]
	}
	s.numStored = 0
}

// emit samples s's next token at time t and reports it. It returns true when
// s finished.
func (e *Engine) emit(s *sequence, t time.Duration, r *StepResult) bool {
	idx := s.outputs
	if r.Summarize && idx > 0 && e.finishReasonAt(s, idx+1, s.numTokens+1) == "" {
		e.emitQuiet(s, t, r)
		return false
	}
	tok := e.token(s, idx)
	s.outputs++
	s.numTokens++
	if e.keepGen && s.tokenMode {
		s.tokens = append(s.tokens, tok)
	}
	e.stats.GenerationTokens++
	// Fill the output in place: Output is large, and this runs per token.
	// Only the sequence's first two lines are read (the fourth is cold; it
	// is read at the first token and the finish).
	r.Outputs = append(r.Outputs, Output{})
	e.fillOutput(&r.Outputs[len(r.Outputs)-1], s, tok, idx, t)
	reason := e.finishReason(s)
	if reason == "" {
		return false
	}
	e.finishOutput(s, &r.Outputs[len(r.Outputs)-1], reason)
	e.retireFinished(s)
	return true
}

// emitQuiet is emit for a token left out of r.Outputs (Summarize): s
// neither starts nor finishes with it. Its latency joins r.ITLs.
func (e *Engine) emitQuiet(s *sequence, t time.Duration, r *StepResult) {
	if e.keepGen && s.tokenMode {
		s.tokens = append(s.tokens, e.token(s, s.outputs))
	}
	s.outputs++
	s.numTokens++
	e.stats.GenerationTokens++
	itl := t - s.lastToken
	s.lastToken = t
	r.Summarized++
	r.ITLs = addITL(r.ITLs, itl, len(r.Outputs))
}

// fillOutput fills o, a zero Output, with s's token tok, its idx-th output,
// ready at t, and records t as s's last token time (and its first token's
// when idx is 0).
func (e *Engine) fillOutput(o *Output, s *sequence, tok uint32, idx int, t time.Duration) {
	o.ID, o.Token, o.Index, o.PromptTokens, o.CachedTokens, o.Time = s.id, tok, idx, int(s.promptLen), int(s.cachedTokens), t
	if idx == 0 {
		o.First = true
		s.firstToken = t
		s.ttft = t - s.arrival
		e.countPrompt(s)
	} else {
		o.ITL = t - s.lastToken
	}
	s.lastToken = t
	o.TTFT = s.ttft
}

// countPrompt counts the prompt of s, which produced its first token, in
// Stats by source, as vLLM's PromptTokenStats.update_from_output does at a
// request's first output.
func (e *Engine) countPrompt(s *sequence) {
	st := &e.stats
	st.PromptTokens += int64(s.promptLen)
	st.PromptCached += int64(s.cachedTokens)
	st.PromptExternal += int64(s.external)
	if s.cachedTokens+1 == s.promptLen {
		st.PromptRecomputed++
	}
}

// finishReason returns why s finished with the token it just emitted, or
// "" when it did not.
func (e *Engine) finishReason(s *sequence) string {
	return e.finishReasonAt(s, s.outputs, s.numTokens)
}

// finishReasonAt is finishReason for s with outputs output tokens and
// numTokens tokens.
func (e *Engine) finishReasonAt(s *sequence, outputs, numTokens int) string {
	switch {
	case s.eosAt > 0 && outputs == int(s.eosAt):
		return FinishStop
	case outputs >= int(s.maxTokens) || numTokens >= e.maxLen:
		return FinishLength
	}
	return ""
}

// finishOutput completes o, s's output at o.Time, as its last, and counts
// the finish. The caller then retires s (retireFinished), after the
// step's allocations.
func (e *Engine) finishOutput(s *sequence, o *Output, reason string) {
	if reason == FinishStop {
		e.stats.FinishedStop++
	} else {
		e.stats.FinishedLength++
	}
	o.Finished, o.FinishReason = true, reason
	o.Arrival = s.arrival
	o.QueueTime = s.firstSched - s.arrival
	o.PrefillTime = s.firstToken - s.firstSched
	o.DecodeTime = o.Time - s.firstToken
	o.Preemptions = s.preemptions
}

// retireFinished takes a finished s out of the engine: its KV stays held
// for a HoldKV request (until Release), else its blocks are freed and it is
// done. The step then drops it from the running list.
func (e *Engine) retireFinished(s *sequence) {
	if s.holdKV {
		s.status = statusHeld
		e.held++
		return
	}
	if s.lora != 0 {
		e.loraSeqs--
	}
	e.freeBlocks(s)
	s.status = statusDone
	delete(e.seqs, s.id)
}

// dropFinished removes the requests that finished this step from the
// running list, keeping its order, and recycles the done ones (held ones
// wait for Release).
func (e *Engine) dropFinished() {
	keep := e.running[:0]
	for _, s := range e.running {
		switch s.status {
		case statusRunning:
			keep = append(keep, s)
		case statusDone:
			e.recycle(s) // off every list now
		}
	}
	clear(e.running[len(keep):])
	e.running = keep
}

// token returns s's idx-th output token.
func (e *Engine) token(s *sequence, idx int) uint32 {
	return e.sampler.token(s.seed, int(s.eosAt), idx)
}

// Sampler computes the output tokens of requests as the engine generates
// them: a pure function of the request's seed, its EOS position and the
// model's vocabulary, so a driver can recompute a request's tokens when it
// needs them instead of collecting them step by step. It is a value, safe
// for concurrent use.
type Sampler struct {
	vocab, eos uint32
	vocabRem   remainder // x % vocab without a division
}

// Sampler returns the engine's sampler.
func (e *Engine) Sampler() Sampler { return e.sampler }

// AppendTokens appends the first n output tokens of r (EOS included, where
// r.EOSAt puts it) to dst: the tokens Step reports for r, in order.
func (sm Sampler) AppendTokens(dst []uint32, r *Request, n int) []uint32 {
	return sm.AppendTokenRange(dst, r, 0, n)
}

// AppendTokenRange appends r's output tokens from index from up to, not
// including, to (AppendTokens' tokens from..to-1) to dst: a stream's
// tokens since its previous chunk.
func (sm Sampler) AppendTokenRange(dst []uint32, r *Request, from, to int) []uint32 {
	seed := r.Seed
	if seed == 0 {
		seed = xxh3.HashString(r.ID) | 1
	}
	eosAt := 0
	if !r.IgnoreEOS && r.EOSAt > 0 {
		eosAt = r.EOSAt
	}
	for idx := max(from, 0); idx < to; idx++ {
		dst = append(dst, sm.token(seed, eosAt, idx))
	}
	return dst
}

// token returns the idx-th output token of a request: the model's EOS at
// the eosAt position, else a pseudo-random id from the seed that is never
// EOS.
func (sm *Sampler) token(seed uint64, eosAt, idx int) uint32 {
	if eosAt > 0 && idx+1 == eosAt {
		return sm.eos
	}
	x := seed + uint64(idx+1)*0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	x ^= x >> 31
	t := uint32(sm.vocabRem.mod(x)) // x % vocab
	if t == sm.eos {
		t = (t + 1) % sm.vocab
	}
	return t
}
