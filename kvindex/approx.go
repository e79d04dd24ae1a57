package kvindex

import (
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
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
	// Shards is the number of shards of the block table, a power of two;
	// default 64.
	Shards int
	// Serialized promises that no two calls overlap (the caller serialises
	// them, as the router does under its lock; a Match may expire entries,
	// so it writes too): the block table then needs no lock-free readers
	// and is a btable (buckets of one cache line, no atomics, no
	// tombstones), about twice as fast to update as the concurrent one.
	// Default false: any calls may run concurrently.
	Serialized bool
}

func (c *ApproxConfig) setDefaults() {
	if c.DefaultCapacityBlocks <= 0 {
		c.DefaultCapacityBlocks = 65536
	}
	if c.TTL <= 0 {
		c.TTL = 10 * time.Minute
	}
	if c.Shards <= 0 || c.Shards&(c.Shards-1) != 0 {
		c.Shards = 64
	}
}

// Approx is the approximate prefix index: for each endpoint an LRU of the
// block hashes the router itself routed there, each trusted for TTL after it
// was last routed. It needs no tokenizer and no engine events, and it is
// wrong exactly when the engine evicted what the router thinks it holds.
//
// Policy: exact LRU with TTL. Record makes a prompt's blocks the endpoint's
// most recent entries, the first block most recent of all; the least recent
// entries beyond the endpoint's capacity, and entries older than TTL, are
// dropped. The differential test checks this against a naive list.
//
// Layout: as in Index, endpoints are numbered in groups of 64 and a
// lock-free table (atable; with ApproxConfig.Serialized, btable) maps each
// block hash to the mask of endpoints holding it. Each endpoint keeps its
// recency order as a ring of entries in Record order (alog: no linked list)
// and a map from block hash to the ring position of its live entry (amap)
// for the blocks recorded again while held only. A block recorded once has
// one entry and needs no map entry (the table says that the endpoint holds
// it), so under churn, when every Record inserts and evicts, a block costs
// the table two changes and the ring two sequential writes, and no map
// insertion or deletion. A block recorded again gets a map entry naming its
// new entry at back; its old entry is stale: a tombstone when the map named
// it, otherwise left in place and told from the live one by the map when it
// reaches the front (trim) or a compaction. Record prefetches the map
// slots and table lines a prompt needs before it uses them, and trim
// applies evictions to the table in one batch, so that the cache misses
// overlap instead of queueing (see atable). Record allocates only when a
// structure grows or an atable shard is rebuilt to purge tombstones (with
// Serialized, not at steady state: btable has no tombstones). Expired
// entries are dropped by Record and, once the oldest entry's TTL has
// passed, by the next Match, so Match never sees one.
//
// Approx is safe for concurrent use. Match takes no lock except for the
// brief write lock of an expiry; Record, SetCapacity and Remove take the
// write lock. With ApproxConfig.Serialized the caller promises that no two
// calls overlap, and the table's writes need no atomics.
type Approx struct {
	cfg ApproxConfig
	ttl int64 // cfg.TTL in nanoseconds

	mu     sync.Mutex // guards eps, the endpoints' logs and maps, group bit allocation, sets, clears and sink
	eps    map[string]*aendpoint
	groups atomic.Pointer[[]*agroup]
	// nextExpiry is a Unix nanosecond time no later than the first moment
	// an entry of some endpoint expires (math.MaxInt64: none). It may be
	// early (then the Match that passes it finds nothing to drop and
	// recomputes it), never late.
	nextExpiry atomic.Int64

	clears []uint64   // trim's batch of table changes
	miss   []uint64   // Record's blocks missing from the endpoint's map
	at     []int32    // Record's map slot of each block, -1 when not indexed
	sink   uint64     // keeps the prefetching loads alive
	lastEp *aendpoint // the endpoint whose map the last Record used (in cache)
}

type agroup struct {
	tab   *atable // nil when Serialized
	stab  *btable // Serialized only
	names [64]atomic.Pointer[string]
	// room is each endpoint's capacity less its live entries (Slot.Room),
	// and oldest the Unix nanosecond time of its least recent entry
	// (Slot.Oldest), stored under Approx.mu whenever they change.
	room, oldest [64]atomic.Int64
	inUse        uint64 // guarded by Approx.mu
}

type aendpoint struct {
	name     string
	g        *agroup
	bit      uint64
	capacity int

	idx amap // block hash -> position in log
	log alog
}

// NewApprox returns an empty approximate index.
func NewApprox(cfg ApproxConfig) *Approx {
	cfg.setDefaults()
	a := &Approx{cfg: cfg, ttl: int64(cfg.TTL), eps: make(map[string]*aendpoint)}
	a.groups.Store(&[]*agroup{})
	a.nextExpiry.Store(math.MaxInt64)
	return a
}

func (a *Approx) endpoint(name string) *aendpoint {
	if e := a.eps[name]; e != nil {
		return e
	}
	groups := *a.groups.Load()
	var g *agroup
	for _, cand := range groups {
		if cand.inUse != ^uint64(0) {
			g = cand
			break
		}
	}
	if g == nil {
		g = &agroup{}
		if a.cfg.Serialized {
			g.stab = newBTable()
		} else {
			g.tab = newATable(a.cfg.Shards)
		}
		ng := append(append([]*agroup(nil), groups...), g)
		a.groups.Store(&ng)
	}
	i := bits.TrailingZeros64(^g.inUse)
	g.inUse |= 1 << i
	n := name
	g.names[i].Store(&n)
	e := &aendpoint{name: name, g: g, bit: 1 << i, capacity: a.cfg.DefaultCapacityBlocks}
	e.publishRoom()
	a.eps[name] = e
	return e
}

// Record notes that the router sent a prompt with these chained block hashes
// to endpoint at now. The blocks become the endpoint's most recent entries,
// the first block most recent of all (an engine evicts a prompt's tail
// before its head), and the least recent entries beyond the endpoint's
// capacity or older than TTL are dropped.
func (a *Approx) Record(now time.Time, endpoint string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	t := now.UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.endpoint(endpoint)
	if e.log.refresh(hashes, t) {
		// The prompt already is the endpoint's most recent entries, in
		// order (the same prompt again, or a prefix of the last one):
		// only their times change.
		a.trim(e, t, true)
		a.noteExpiry(e)
		return
	}
	// Only blocks recorded again while held are indexed (e.idx: key ->
	// position of its live entry), so that their old entry can be found
	// and dropped. A block recorded once has one entry and needs no index
	// entry: the table says whether the endpoint holds it. Under churn
	// (every Record inserting and evicting) most blocks are never indexed,
	// which saves a map insertion and deletion per block.
	//
	// One pass over the map first: where it holds each block (at: the
	// slot, -1 when not indexed), and the table lines the others need,
	// loaded together. The main loop then uses those slots instead of
	// probing the map again, until it inserts a key (a block repeated in
	// the prompt may then be there): the pass's answers stand while the
	// map gains no key, as nothing moves in it before then.
	//
	// The touch pass loads the map slots first so that their misses
	// overlap; when the endpoint's map was the last Record's (a hot prefix
	// on one endpoint: the router's hit regime) they are in cache, and the
	// pass would only add its own loads (rotate16 in BenchmarkApproxRecord:
	// about 2.4 -> 2.0 us).
	if a.lastEp != e {
		a.sink += e.idx.touch(hashes)
	}
	a.lastEp = e
	miss := a.miss[:0] // the table lines only blocks missing from the map need
	at := slices.Grow(a.at[:0], len(hashes))[:len(hashes)]
	if e.idx.n > 0 {
		for i, h := range hashes {
			h = nonZero(h)
			j := e.idx.findSlot(h)
			if j < 0 {
				miss = append(miss, h)
			}
			at[i] = int32(j)
		}
	} else {
		for i, h := range hashes {
			miss = append(miss, nonZero(h))
			at[i] = -1
		}
	}
	a.miss, a.at = miss, at
	if e.g.tab != nil {
		a.sink += e.g.tab.touch(miss)
	} else {
		a.sink += e.g.stab.touch(miss)
	}
	grown := false // the map gained a key since the pass
	for i := len(hashes) - 1; i >= 0; i-- {
		h := nonZero(hashes[i]) // 0 is the tables' empty key; HashTokens never returns it
		var v *uint64
		switch {
		case grown:
			v = e.idx.find(h)
		case at[i] >= 0:
			v = &e.idx.slots[at[i]].v
		}
		if v != nil {
			e.log.kill(*v)
			*v = e.log.push(h, t, &e.idx)
			continue
		}
		// Not indexed: the table says whether the endpoint holds it; if
		// not, it goes in at once (one probe for both), so that a repeat
		// later in the prompt finds it held.
		if e.g.set(h, e.bit)&e.bit != 0 {
			// Held, with one entry somewhere in the log: from now on
			// the index says which is live (see trim).
			pos := e.log.push(h, t, &e.idx)
			v, _ := e.idx.slot(h)
			*v = pos
			grown = true
			continue
		}
		// New.
		e.log.n++
		e.log.push(h, t, &e.idx)
	}
	a.trim(e, t, true)
	a.noteExpiry(e)
}

// trim drops e's least recent entries while it is over capacity or (when
// ttl) they expired at t, and clears the dropped keys from the table. On
// the way it drops the dead entries it meets at the front: tombstones, and
// entries of indexed blocks other than the one the index names (a block
// recorded again while held, whose first entry was not indexed). Called
// with a.mu held.
func (a *Approx) trim(e *aendpoint, t int64, ttl bool) {
	clears := a.clears[:0]
	l := &e.log
	for l.front != l.back {
		k := l.ring[l.front&l.mask].key
		if k == 0 {
			l.front++ // tombstone
			continue
		}
		indexed := false
		if e.idx.n > 0 {
			if v := e.idx.find(k); v != nil {
				if *v != l.front {
					l.ring[l.front&l.mask].key = 0 // stale
					l.front++
					continue
				}
				indexed = true
			}
		}
		// The front entry is live.
		if l.n <= e.capacity && (!ttl || t-l.ring[l.front&l.mask].t <= a.ttl) {
			break
		}
		l.pop()
		if indexed {
			e.idx.del(k)
		}
		clears = append(clears, k)
	}
	e.publishRoom()
	a.clears = clears
	if e.g.stab != nil {
		a.sink += e.g.stab.touch(clears)
		for _, k := range clears {
			e.g.stab.update(k, 0, e.bit)
		}
	} else {
		a.sink += e.g.tab.applyBatch(nil, clears, e.bit)
	}
}

// publishRoom stores e's room for Slot.Room. Called with a.mu held.
func (e *aendpoint) publishRoom() {
	i := bits.TrailingZeros64(e.bit)
	e.g.room[i].Store(int64(e.capacity - e.log.n))
	t := int64(0)
	if e.log.n > 0 {
		t = e.log.oldest().t
	}
	e.g.oldest[i].Store(t)
}

// noteExpiry lowers nextExpiry to e's first expiry. Called with a.mu held.
func (a *Approx) noteExpiry(e *aendpoint) {
	if e.log.n == 0 {
		return
	}
	if x := e.log.oldest().t + a.ttl; x < a.nextExpiry.Load() {
		a.nextExpiry.Store(x)
	}
}

// expireAt drops the expired entries when the first expiry has passed.
func (a *Approx) expireAt(now time.Time) {
	if t := now.UnixNano(); t > a.nextExpiry.Load() {
		a.expire(t)
	}
}

// expire drops every entry older than TTL at t and recomputes nextExpiry.
func (a *Approx) expire(t int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t <= a.nextExpiry.Load() {
		return // another Match got here first
	}
	next := int64(math.MaxInt64)
	for _, e := range a.eps {
		a.trim(e, t, true)
		e.log.shrink()
		if e.log.n > 0 {
			next = min(next, e.log.oldest().t+a.ttl)
		}
	}
	a.nextExpiry.Store(next)
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
	if e.log.n > e.capacity {
		a.trim(e, 0, false)
		e.log.shrink()
	}
	e.publishRoom()
	a.noteExpiry(e)
}

// Slot is a handle on one endpoint's room in an Approx (see Room): reading
// it takes no lock and no lookup by name.
type Slot struct {
	g *agroup
	i int
}

// Slot returns endpoint's handle, adding the endpoint (with the default
// capacity) if it has no entries yet. It stays valid until Remove.
func (a *Approx) Slot(endpoint string) Slot {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.endpoint(endpoint)
	e.publishRoom()
	return Slot{g: e.g, i: bits.TrailingZeros64(e.bit)}
}

// Room returns how many blocks the endpoint can be recorded to hold before
// a Record must evict (its capacity less the entries it holds; entries
// past their TTL count until dropped), or -1 for the zero Slot. Safe to
// call concurrently with anything but Remove of the endpoint.
func (s Slot) Room() int {
	if s.g == nil {
		return -1
	}
	return int(s.g.room[s.i].Load())
}

// Oldest returns when the endpoint's least recent entry was recorded (the
// zero Time when it holds none, or for the zero Slot): for a full endpoint,
// now less Oldest is how long it keeps a block nobody sends again. Safe to
// call concurrently with anything but Remove of the endpoint.
func (s Slot) Oldest() time.Time {
	if s.g == nil {
		return time.Time{}
	}
	if t := s.g.oldest[s.i].Load(); t != 0 {
		return time.Unix(0, t)
	}
	return time.Time{}
}

// Remove forgets endpoint and all its entries.
func (a *Approx) Remove(endpoint string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.eps[endpoint]
	if e == nil {
		return
	}
	e.capacity = 0
	a.trim(e, 0, false)
	delete(a.eps, endpoint)
	if a.lastEp == e {
		a.lastEp = nil
	}
	i := bits.TrailingZeros64(e.bit)
	e.g.names[i].Store(nil)
	e.g.inUse &^= e.bit
}

// Len returns the number of (block, endpoint) entries.
func (a *Approx) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, e := range a.eps {
		n += e.log.n
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
	a.expireAt(now)
	start := len(dst)
	for _, g := range *a.groups.Load() {
		alive := g.get(nonZero(hashes[0]))
		for i := 1; i < len(hashes) && alive != 0; i++ {
			held := g.get(nonZero(hashes[i]))
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

// MatchUnordered is Match for chained hashes (each block's hash determines
// the blocks before it, as HashText's, HashTokens' and vLLM's do), with
// the hits in no particular order: the router's. It reads O(log n) blocks
// per distinct match depth instead of every block: Record makes a prompt's
// first block its most recent and each block more recent than the next,
// and eviction and expiry take the least recent first, so what an endpoint
// holds of a chain is always a prefix of it, and the depth at which each
// endpoint stops holding the query can be found by bisection. (Match reads
// every block and holds for any hashes; the differential test checks the
// two agree on chains.)
func (a *Approx) MatchUnordered(now time.Time, hashes []uint64, dst []Hit) []Hit {
	n := len(hashes)
	if n == 0 {
		return dst
	}
	a.expireAt(now)
	for _, g := range *a.groups.Load() {
		first := g.get(nonZero(hashes[0]))
		if first == 0 {
			continue
		}
		last := first
		if n > 1 {
			last = g.get(nonZero(hashes[n-1])) & first
		}
		for b := last; b != 0; b &= b - 1 {
			dst = g.hit(dst, bits.TrailingZeros64(b), n)
		}
		dst = g.bisect(dst, hashes, 0, first, n-1, last)
	}
	return dst
}

// bisect appends the hits of the endpoints that hold block lo of hashes
// (mask mlo) but not block hi (mask mhi, a subset of mlo): each holds a
// prefix ending in [lo, hi).
func (g *agroup) bisect(dst []Hit, hashes []uint64, lo int, mlo uint64, hi int, mhi uint64) []Hit {
	if mlo&^mhi == 0 {
		return dst
	}
	if hi-lo == 1 {
		for b := mlo &^ mhi; b != 0; b &= b - 1 {
			dst = g.hit(dst, bits.TrailingZeros64(b), hi)
		}
		return dst
	}
	mid := lo + (hi-lo)/2
	mm := g.get(nonZero(hashes[mid]))&mlo | mhi
	dst = g.bisect(dst, hashes, lo, mlo, mid, mm)
	return g.bisect(dst, hashes, mid, mm, hi, mhi)
}

// get returns key's mask in the group's table.
func (g *agroup) get(key uint64) uint64 {
	if g.stab != nil {
		return g.stab.get(key)
	}
	return g.tab.get(key)
}

// set ORs bit into key's mask in the group's table and returns the mask
// before. Called with Approx.mu held.
func (g *agroup) set(key, bit uint64) uint64 {
	if g.stab != nil {
		return g.stab.set(key, bit)
	}
	return g.tab.set(key, bit)
}

func (g *agroup) hit(dst []Hit, bit, blocks int) []Hit {
	name := g.names[bit].Load()
	if name == nil {
		return dst
	}
	return append(dst, Hit{Endpoint: *name, Blocks: blocks, Tier: kvroute.TierGPU, GPUBlocks: blocks})
}
