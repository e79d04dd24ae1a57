package kvindex

import (
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// Hit is one endpoint's answer to a prefix match: how many leading blocks of
// the prompt it holds, and in which tier the matched blocks live (the slowest
// tier among them).
type Hit struct {
	Endpoint string
	Blocks   int
	Tier     kvroute.Tier
	// GPUBlocks is the leading run held on the GPU alone (<= Blocks); the
	// rest of Blocks must be loaded from host memory.
	GPUBlocks int
}

// sortHits orders hits by Blocks descending, then Endpoint ascending, so
// results are deterministic.
func sortHits(h []Hit) {
	slices.SortFunc(h, func(a, b Hit) int {
		if a.Blocks != b.Blocks {
			return b.Blocks - a.Blocks
		}
		switch {
		case a.Endpoint < b.Endpoint:
			return -1
		case a.Endpoint > b.Endpoint:
			return 1
		}
		return 0
	})
}

// ApproxConfig configures an Approx index.
type ApproxConfig struct {
	// DefaultCapacityBlocks bounds each endpoint's entries until SetCapacity
	// gives its real KV capacity; default 65536 blocks.
	DefaultCapacityBlocks int
	// TTL is how long a recorded block is trusted after the router last sent
	// it to the endpoint; default 10 minutes.
	TTL time.Duration
}

func (c *ApproxConfig) setDefaults() {
	if c.DefaultCapacityBlocks <= 0 {
		c.DefaultCapacityBlocks = 65536
	}
	if c.TTL <= 0 {
		c.TTL = 10 * time.Minute
	}
}

// Approx is the approximate prefix index: for each endpoint an LRU of the
// block hashes the router itself routed there, each trusted for TTL after it
// was last routed. It needs no tokenizer and no engine events, and it is
// wrong exactly when the engine evicted what the router thinks it holds.
//
// Approx is safe for concurrent use: Match takes a read lock, Record,
// SetCapacity and Remove a write lock.
type Approx struct {
	cfg ApproxConfig

	mu     sync.RWMutex          // protects everything below
	blocks map[uint64][]*anode   // block hash -> one node per endpoint holding it
	eps    map[string]*aendpoint // endpoint -> its LRU
}

type aendpoint struct {
	name     string
	capacity int
	n        int
	head     anode // sentinel: head.next is most recent, head.prev least recent
}

type anode struct {
	hash       uint64
	ep         *aendpoint
	seen       time.Time
	prev, next *anode
}

// NewApprox returns an empty approximate index.
func NewApprox(cfg ApproxConfig) *Approx {
	cfg.setDefaults()
	return &Approx{cfg: cfg, blocks: make(map[uint64][]*anode), eps: make(map[string]*aendpoint)}
}

func (a *Approx) endpoint(name string) *aendpoint {
	e := a.eps[name]
	if e == nil {
		e = &aendpoint{name: name, capacity: a.cfg.DefaultCapacityBlocks}
		e.head.next, e.head.prev = &e.head, &e.head
		a.eps[name] = e
	}
	return e
}

// Record notes that the router sent a prompt with these chained block hashes
// to endpoint at now. The blocks become the endpoint's most recent entries,
// the first block most recent of all (an engine evicts a prompt's tail
// before its head), and the least recent entries beyond the endpoint's
// capacity are dropped.
func (a *Approx) Record(now time.Time, endpoint string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.endpoint(endpoint)
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		var nd *anode
		for _, x := range a.blocks[h] {
			if x.ep == e {
				nd = x
				break
			}
		}
		if nd != nil {
			nd.unlink()
		} else {
			nd = &anode{hash: h, ep: e}
			a.blocks[h] = append(a.blocks[h], nd)
			e.n++
		}
		nd.seen = now
		e.pushFront(nd)
	}
	a.trim(now, e)
}

// trim drops expired entries and entries beyond capacity from e's tail.
func (a *Approx) trim(now time.Time, e *aendpoint) {
	for e.n > 0 {
		last := e.head.prev
		if e.n <= e.capacity && now.Sub(last.seen) <= a.cfg.TTL {
			return
		}
		a.drop(last)
	}
}

func (a *Approx) drop(nd *anode) {
	nd.unlink()
	nd.ep.n--
	list := a.blocks[nd.hash]
	for i, x := range list {
		if x == nd {
			list[i] = list[len(list)-1]
			list[len(list)-1] = nil
			list = list[:len(list)-1]
			break
		}
	}
	if len(list) == 0 {
		delete(a.blocks, nd.hash)
	} else {
		a.blocks[nd.hash] = list
	}
}

// SetCapacity sets endpoint's capacity in blocks (its KV cache size, e.g.
// from vllm:cache_config_info); blocks <= 0 restores the default. Excess
// entries are dropped at once.
func (a *Approx) SetCapacity(endpoint string, blocks int) {
	if blocks <= 0 {
		blocks = a.cfg.DefaultCapacityBlocks
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.endpoint(endpoint)
	e.capacity = blocks
	for e.n > e.capacity {
		a.drop(e.head.prev)
	}
}

// Remove forgets endpoint and all its entries.
func (a *Approx) Remove(endpoint string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.eps[endpoint]
	if e == nil {
		return
	}
	for e.n > 0 {
		a.drop(e.head.prev)
	}
	delete(a.eps, endpoint)
}

// Len returns the number of (block, endpoint) entries, expired ones included
// until they are trimmed.
func (a *Approx) Len() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := 0
	for _, e := range a.eps {
		n += e.n
	}
	return n
}

// Match appends to dst, for every endpoint holding at least the first block
// of hashes (recorded within TTL of now), the number of leading blocks it
// holds, and returns the extended slice ordered by Blocks descending then
// Endpoint. Tier is always kvroute.TierGPU: the router cannot tell more.
func (a *Approx) Match(now time.Time, hashes []uint64, dst []Hit) []Hit {
	if len(hashes) == 0 {
		return dst
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	start := len(dst)
	// alive holds the endpoints that matched every block so far.
	var aliveBuf [64]*aendpoint
	alive := aliveBuf[:0]
	for _, nd := range a.blocks[hashes[0]] {
		if now.Sub(nd.seen) <= a.cfg.TTL {
			alive = append(alive, nd.ep)
		}
	}
	for i := 1; i < len(hashes) && len(alive) > 0; i++ {
		holders := a.blocks[hashes[i]]
		kept := alive[:0]
		for _, e := range alive {
			held := false
			for _, nd := range holders {
				if nd.ep == e {
					held = now.Sub(nd.seen) <= a.cfg.TTL
					break
				}
			}
			if held {
				kept = append(kept, e)
			} else {
				dst = append(dst, Hit{Endpoint: e.name, Blocks: i, Tier: kvroute.TierGPU, GPUBlocks: i})
			}
		}
		alive = kept
	}
	for _, e := range alive {
		dst = append(dst, Hit{Endpoint: e.name, Blocks: len(hashes), Tier: kvroute.TierGPU, GPUBlocks: len(hashes)})
	}
	sortHits(dst[start:])
	return dst
}

func (e *aendpoint) pushFront(nd *anode) {
	nd.prev = &e.head
	nd.next = e.head.next
	e.head.next.prev = nd
	e.head.next = nd
}

func (nd *anode) unlink() {
	nd.prev.next = nd.next
	nd.next.prev = nd.prev
	nd.prev, nd.next = nil, nil
}
