package engine

// blockPool is the paged KV cache: a fixed array of blocks, a free queue in
// vLLM's eviction order, and the prefix-cache map from block hash to the
// blocks caching it (several when requests computed the same block, as in
// vLLM).
//
// The free queue holds vLLM's FreeKVCacheBlockQueue order: allocation pops
// the head; a freed block is appended at the tail. A freed block keeps its
// hash and stays findable until it is popped for reuse (eviction), so the
// least recently freed cached block is evicted first. Requests free their
// blocks tail-first, so a prompt's later blocks are evicted before its
// earlier (more shareable) ones. Every operation is O(1) per block
// (amortized: see compact).
//
// The queue is a ring of block ids (free) rather than vLLM's doubly linked
// list through the blocks: popping the head reads the ring, not the block
// popped before it, so the blocks a run of allocations pops are
// independent loads that overlap, where following a list's links missed
// the cache once per allocation in turn (in a busy engine each block was
// freed long ago). A block taken from the middle of the queue (a prefix
// hit on a free block, touch) leaves a hole (-1) in its slot, which
// popping skips; holes are squeezed out when the ring fills (compact).
type blockPool struct {
	blocks []kvBlock // the last element is a spare that is never hashed nor queued
	// free is the ring of the free queue: used slots from head, in queue
	// order, each a block id or -1 (a hole); its length is a power of two
	// at least twice the blocks'.
	free       []int32
	spare      []int32 // compact's second ring
	head, used int
	numFree    int
	sink       int32 // loadAhead's loads
	// deferred counts the full blocks whose keys are deferred (deferred.go)
	// and that are still in the pool.
	deferred int
	cached   *blockTable // hash -> blocks holding it
	// onEvict is called with the hash of each cached block that is evicted.
	onEvict func(hash uint64)
}

type kvBlock struct {
	hash   uint64
	ref    int32
	slot   int32  // its slot in the free ring; -1 when not in the queue
	mark   uint32 // admit's epoch, to stop at a repeated block
	run    int32  // 1 + the retired deferred run holding the block (deferred.go); 0: none
	hashed bool   // hash is valid and cached[hash] holds this block
}

func newBlockPool(n int) *blockPool {
	size := 16
	for size < 2*n {
		size <<= 1
	}
	p := &blockPool{blocks: make([]kvBlock, n+1), free: make([]int32, size)}
	p.cached = newBlockTable(n, p.blocks)
	p.blocks[n].slot = -1
	for i := 0; i < n; i++ {
		p.pushTail(int32(i))
	}
	return p
}

// size returns the number of KV blocks (the engine's usable blocks: vLLM's
// null block is not in the pool).
func (p *blockPool) size() int { return len(p.blocks) - 1 }

func (p *blockPool) pushTail(id int32) {
	if p.used == len(p.free) {
		p.compact()
	}
	i := (p.head + p.used) & (len(p.free) - 1)
	p.free[i] = id
	p.blocks[id].slot = int32(i)
	p.used++
	p.numFree++
}

// compact squeezes the holes out of the full ring, the queue's blocks
// keeping their order from slot 0. The ring is at least twice the blocks,
// so at least half its slots are holes, each left by a touch since the
// last compaction: the blocks' slot updates cost at most one per touch.
func (p *blockPool) compact() {
	mask := len(p.free) - 1
	dst := p.spare
	if len(dst) != len(p.free) {
		dst = make([]int32, len(p.free))
	}
	n := 0
	for k := range p.used {
		if id := p.free[(p.head+k)&mask]; id >= 0 {
			dst[n] = id
			p.blocks[id].slot = int32(n)
			n++
		}
	}
	p.free, p.spare = dst, p.free
	p.head, p.used = 0, n
}

// unlink takes block id, in the queue, off it, leaving a hole.
func (p *blockPool) unlink(id int32) {
	b := &p.blocks[id]
	p.free[b.slot] = -1
	b.slot = -1
	p.numFree--
}

// loadAhead loads the blocks the next n allocations pop (at most
// maxLoadAhead), so that they find them in the cache: in a busy engine
// each was freed long ago, and loaded in this short loop the misses
// overlap, where between the allocations (a few hundred instructions
// apart, each missing the cache on its own) they mostly did not.
func (p *blockPool) loadAhead(n int) {
	n = min(n, p.numFree, maxLoadAhead)
	mask := len(p.free) - 1
	var sink int32
	for k := 0; n > 0 && k < p.used; k++ {
		if id := p.free[(p.head+k)&mask]; id >= 0 {
			sink += p.blocks[id].ref
			n--
		}
	}
	p.sink = sink
}

// maxLoadAhead bounds loadAhead's loads: more than a step of a full batch
// allocates, few enough for the cache to keep.
const maxLoadAhead = 64

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
	mask := len(p.free) - 1
	id := p.free[p.head]
	for id < 0 { // holes left by touch
		p.head = (p.head + 1) & mask
		p.used--
		id = p.free[p.head]
	}
	p.head = (p.head + 1) & mask
	p.used--
	p.numFree--
	b := &p.blocks[id]
	b.slot = -1
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
