package kvindex

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
)

// approxV0 is the Approx implementation before the ring-log rewrite (linked-list
// LRU, one table update per block), kept verbatim for side-by-side
// benchmarks only.
//
// Original doc: Approx is the approximate prefix index: for each endpoint an LRU of the
// block hashes the router itself routed there, each trusted for TTL after it
// was last routed. It needs no tokenizer and no engine events, and it is
// wrong exactly when the engine evicted what the router thinks it holds.
//
// Layout: as in Index, endpoints are numbered in groups of 64 and a
// lock-free table maps each block hash to the mask of endpoints holding it;
// each endpoint also keeps an LRU list of its entries (for capacity and
// TTL). Expired entries are dropped by Record and, when the oldest entry's
// TTL has passed, by the next Match, so Match never sees one.
//
// Approx is safe for concurrent use. Match takes no lock except for the
// brief write lock of an expiry; Record, SetCapacity and Remove take the
// write lock.
type approxV0 struct {
	cfg ApproxConfig
	ttl int64 // cfg.TTL in nanoseconds

	mu     sync.Mutex // guards eps, the endpoints' lists and group bit allocation
	eps    map[string]*v0endpoint
	groups atomic.Pointer[[]*v0group]
	// nextExpiry is the Unix nanosecond time after which the least recent
	// entry of some endpoint has expired (math.MaxInt64: none).
	nextExpiry atomic.Int64
}

type v0group struct {
	tab   *maskTable
	names [64]atomic.Pointer[string]
	inUse uint64 // guarded by Approx.mu
}

type v0endpoint struct {
	name     string
	g        *v0group
	bit      uint64
	capacity int

	idx   emap     // block hash -> node index
	nodes []v0node // slab; free ones are chained through next from free
	free  int32
	head  int32 // most recent, -1 when empty
	tail  int32 // least recent
	n     int
}

type v0node struct {
	key        uint64
	seen       int64 // Unix nanoseconds of the last Record
	prev, next int32
}

// newApproxV0 returns an empty approximate index.
func newApproxV0(cfg ApproxConfig) *approxV0 {
	cfg.setDefaults()
	a := &approxV0{cfg: cfg, ttl: int64(cfg.TTL), eps: make(map[string]*v0endpoint)}
	a.groups.Store(&[]*v0group{})
	a.nextExpiry.Store(math.MaxInt64)
	return a
}

func (a *approxV0) endpoint(name string) *v0endpoint {
	if e := a.eps[name]; e != nil {
		return e
	}
	groups := *a.groups.Load()
	var g *v0group
	for _, cand := range groups {
		if cand.inUse != ^uint64(0) {
			g = cand
			break
		}
	}
	if g == nil {
		g = &v0group{tab: newMaskTable(a.cfg.Shards)}
		ng := append(append([]*v0group(nil), groups...), g)
		a.groups.Store(&ng)
	}
	i := bits.TrailingZeros64(^g.inUse)
	g.inUse |= 1 << i
	n := name
	g.names[i].Store(&n)
	e := &v0endpoint{name: name, g: g, bit: 1 << i, capacity: a.cfg.DefaultCapacityBlocks, free: -1, head: -1, tail: -1}
	a.eps[name] = e
	return e
}

// Record notes that the router sent a prompt with these chained block hashes
// to endpoint at now. The blocks become the endpoint's most recent entries,
// the first block most recent of all (an engine evicts a prompt's tail
// before its head), and the least recent entries beyond the endpoint's
// capacity or older than TTL are dropped.
func (a *approxV0) Record(now time.Time, endpoint string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	t := now.UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.endpoint(endpoint)
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		if h == 0 {
			h = 1 // 0 is the tables' empty key; HashTokens never returns it
		}
		if v, ok := e.idx.get(h); ok {
			nd := int32(v)
			e.unlink(nd)
			e.nodes[nd].seen = t
			e.pushFront(nd)
			continue
		}
		nd := e.alloc(h, t)
		e.idx.put(h, uint64(nd))
		e.pushFront(nd)
		e.n++
		e.g.tab.update(h, e.bit, 0)
	}
	a.trim(e, t)
	a.updateExpiry()
}

// trim drops e's least recent entries while it is over capacity or they
// expired at t. Called with a.mu held.
func (a *approxV0) trim(e *v0endpoint, t int64) {
	for e.tail >= 0 && (e.n > e.capacity || t-e.nodes[e.tail].seen > a.ttl) {
		a.dropTail(e)
	}
}

func (a *approxV0) dropTail(e *v0endpoint) {
	nd := e.tail
	key := e.nodes[nd].key
	e.unlink(nd)
	e.idx.del(key)
	e.g.tab.update(key, 0, e.bit)
	e.release(nd)
	e.n--
}

// updateExpiry recomputes nextExpiry. Called with a.mu held.
func (a *approxV0) updateExpiry() {
	next := int64(math.MaxInt64)
	for _, e := range a.eps {
		if e.tail >= 0 {
			if x := e.nodes[e.tail].seen + a.ttl; x < next {
				next = x
			}
		}
	}
	a.nextExpiry.Store(next)
}

// expire drops every entry older than TTL at t.
func (a *approxV0) expire(t int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.eps {
		for e.tail >= 0 && t-e.nodes[e.tail].seen > a.ttl {
			a.dropTail(e)
		}
	}
	a.updateExpiry()
}

// SetCapacity sets endpoint's capacity in blocks (its KV cache size, e.g.
// from vllm:cache_config_info); blocks <= 0 restores the default. Excess
// entries are dropped at once.
func (a *approxV0) SetCapacity(endpoint string, blocks int) {
	if blocks <= 0 {
		blocks = a.cfg.DefaultCapacityBlocks
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.endpoint(endpoint)
	e.capacity = blocks
	for e.n > e.capacity {
		a.dropTail(e)
	}
	a.updateExpiry()
}

// Remove forgets endpoint and all its entries.
func (a *approxV0) Remove(endpoint string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.eps[endpoint]
	if e == nil {
		return
	}
	for e.tail >= 0 {
		a.dropTail(e)
	}
	delete(a.eps, endpoint)
	i := bits.TrailingZeros64(e.bit)
	e.g.names[i].Store(nil)
	e.g.inUse &^= e.bit
	a.updateExpiry()
}

// Len returns the number of (block, endpoint) entries.
func (a *approxV0) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
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
func (a *approxV0) Match(now time.Time, hashes []uint64, dst []Hit) []Hit {
	if len(hashes) == 0 {
		return dst
	}
	if t := now.UnixNano(); t > a.nextExpiry.Load() {
		a.expire(t)
	}
	start := len(dst)
	for _, g := range *a.groups.Load() {
		alive := g.tab.get(nonZero(hashes[0]))
		for i := 1; i < len(hashes) && alive != 0; i++ {
			held := g.tab.get(nonZero(hashes[i]))
			for b := alive &^ held; b != 0; b &= b - 1 {
				dst = g.hit(dst, bits.TrailingZeros64(b), i)
			}
			alive &= held
		}
		for b := alive; b != 0; b &= b - 1 {
			dst = g.hit(dst, bits.TrailingZeros64(b), len(hashes))
		}
	}
	sortHits(dst[start:])
	return dst
}

func (g *v0group) hit(dst []Hit, bit, blocks int) []Hit {
	name := g.names[bit].Load()
	if name == nil {
		return dst
	}
	return append(dst, Hit{Endpoint: *name, Blocks: blocks, Tier: kvroute.TierGPU, GPUBlocks: blocks})
}

func (e *v0endpoint) alloc(key uint64, t int64) int32 {
	if e.free >= 0 {
		nd := e.free
		e.free = e.nodes[nd].next
		e.nodes[nd] = v0node{key: key, seen: t, prev: -1, next: -1}
		return nd
	}
	e.nodes = append(e.nodes, v0node{key: key, seen: t, prev: -1, next: -1})
	return int32(len(e.nodes) - 1)
}

func (e *v0endpoint) release(nd int32) {
	e.nodes[nd] = v0node{next: e.free}
	e.free = nd
}

func (e *v0endpoint) pushFront(nd int32) {
	e.nodes[nd].prev = -1
	e.nodes[nd].next = e.head
	if e.head >= 0 {
		e.nodes[e.head].prev = nd
	}
	e.head = nd
	if e.tail < 0 {
		e.tail = nd
	}
}

func (e *v0endpoint) unlink(nd int32) {
	p, n := e.nodes[nd].prev, e.nodes[nd].next
	if p >= 0 {
		e.nodes[p].next = n
	} else {
		e.head = n
	}
	if n >= 0 {
		e.nodes[n].prev = p
	} else {
		e.tail = p
	}
	e.nodes[nd].prev, e.nodes[nd].next = -1, -1
}
