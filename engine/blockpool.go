package engine

// blockPool is the paged KV cache: a fixed array of blocks, a free queue in
// vLLM's eviction order, and the prefix-cache map from block hash to the
// blocks caching it (several when requests computed the same block, as in
// vLLM).
//
// The free queue (vLLM's FreeKVCacheBlockQueue) is a doubly linked list
// threaded through the blocks: allocation pops the head; a freed block is
// appended at the tail. A freed block keeps its hash and stays findable
// until it is popped for reuse (eviction), so the least recently freed
// cached block is evicted first. Requests free their blocks tail-first, so
// a prompt's later blocks are evicted before its earlier (more shareable)
// ones. Every operation is O(1) per block.
type blockPool struct {
	blocks  []kvBlock // the last element is the free-queue sentinel
	numFree int
	// deferred counts the full blocks whose keys are deferred (deferred.go)
	// and that are still in the pool.
	deferred int
	cached   *blockTable // hash -> blocks holding it
	// onEvict is called with the hash of each cached block that is evicted.
	onEvict func(hash uint64)
}

type kvBlock struct {
	hash       uint64
	ref        int32
	prev, next int32  // free-queue links; -1 when not in the queue
	mark       uint32 // admit's epoch, to stop at a repeated block
	run        int32  // 1 + the retired deferred run holding the block (deferred.go); 0: none
	hashed     bool   // hash is valid and cached[hash] holds this block
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{blocks: make([]kvBlock, n+1)}
	p.cached = newBlockTable(n, p.blocks)
	s := int32(n) // sentinel
	p.blocks[s].prev, p.blocks[s].next = s, s
	for i := 0; i < n; i++ {
		p.blocks[i].prev, p.blocks[i].next = -1, -1
		p.pushTail(int32(i))
	}
	return p
}

func (p *blockPool) sentinel() int32 { return int32(len(p.blocks) - 1) }

// size returns the number of KV blocks.
func (p *blockPool) size() int { return len(p.blocks) - 1 }

// The free queue is a doubly linked list through the blocks, closed by the
// sentinel, with one exception: the head's prev is not kept (it may name
// the block popped before it). Popping the head then writes only the
// sentinel instead of the next block too, which in a busy engine is a
// cache miss per allocation (the next block was freed long ago); a block
// that is not the head has a kept prev, since blocks join only at the tail.

func (p *blockPool) pushTail(id int32) {
	s := p.sentinel()
	last := p.blocks[s].prev
	p.blocks[id].prev, p.blocks[id].next = last, s
	p.blocks[last].next = id
	p.blocks[s].prev = id
	p.numFree++
}

func (p *blockPool) unlink(id int32) {
	s := p.sentinel()
	b := &p.blocks[id]
	if p.blocks[s].next == id { // the head: its prev is not kept
		p.blocks[s].next = b.next
		if b.next == s {
			p.blocks[s].prev = s // the queue is empty
		}
	} else {
		p.blocks[b.prev].next = b.next
		p.blocks[b.next].prev = b.prev
	}
	b.prev, b.next = -1, -1
	p.numFree--
}

// lookup returns the block caching hash, the one cached first when
// several do (vLLM's get_cached_block).
func (p *blockPool) lookup(hash uint64) (int32, bool) {
	return p.cached.get(hash)
}

// touch takes a reference on a cached block found by lookup, taking it off
// the free queue if it was unreferenced.
func (p *blockPool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.unlink(id)
	}
	b.ref++
}

// alloc pops the head of the free queue, evicting its cached hash if any
// (other blocks caching the same hash stay cached: vLLM's
// _maybe_evict_cached_block). The caller has checked numFree.
func (p *blockPool) alloc() int32 {
	s := p.sentinel()
	id := p.blocks[s].next
	p.unlink(id)
	b := &p.blocks[id]
	if b.hashed {
		p.cached.drop(id) // clears b.hashed
		if p.onEvict != nil {
			p.onEvict(b.hash)
		}
	}
	if b.run != 0 {
		b.run = 0 // its key, deferred, is out of reach
		p.deferred--
	}
	b.hash = 0
	b.ref = 1
	return id
}

// release drops one reference; an unreferenced block joins the free queue
// tail (keeping its cached hash).
func (p *blockPool) release(id int32) {
	b := &p.blocks[id]
	b.ref--
	if b.ref == 0 {
		p.pushTail(id)
	}
}

// cache registers block id under hash (setting its hash and hashed), after
// any other block caching hash: vLLM does not de-duplicate the cache
// (block tables are append-only), so each copy is cached and reported.
func (p *blockPool) cache(id int32, hash uint64) {
	p.cached.insert(hash, id)
}

// reset forgets every cached hash. It fails (returns false) while any block
// is referenced, as vLLM's reset_prefix_cache does.
func (p *blockPool) reset() bool {
	if p.numFree != p.size() {
		return false
	}
	p.cached.clear()
	for i := range p.blocks[:p.size()] {
		p.blocks[i].hashed = false
		p.blocks[i].hash = 0
	}
	return true
}
