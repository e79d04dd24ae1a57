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
// block hash to the mask of endpoints holding it: Match reads only that.
// Each endpoint keeps its recency order as a tree of the chains it holds
// (atree: runs of blocks, each run stamped with its last Record, and a
// heap of the leaves), so that recording a prompt the endpoint holds
// costs a few lookups and a sequential compare, not a random access per
// block; the blocks it adds and the ones it evicts change the table, which
// Record loads a batch at a time (see atable) so that their cache misses
// overlap. Record allocates only when a structure grows or an atable shard
// is rebuilt to purge tombstones (with Serialized, not at steady state:
// btable has no tombstones, and runs are recycled). Expired entries are
// dropped by Record and, once the oldest entry's TTL has passed, by the
// next Match, so Match never sees one.
//
// Approx is safe for concurrent use. Match takes no lock except for the
// brief write lock of an expiry; Record, SetCapacity and Remove take the
// write lock. With ApproxConfig.Serialized the caller promises that no two
// calls overlap, and the table's writes need no atomics.
type Approx struct {
	cfg ApproxConfig
	ttl int64 // cfg.TTL in nanoseconds

	mu     sync.Mutex // guards eps, the endpoints' trees, group bit allocation, runs, clears and sink
	eps    map[string]*aendpoint
	groups atomic.Pointer[[]*agroup]
	// nextExpiry is a Unix nanosecond time no later than the first moment
	// an entry of some endpoint expires (math.MaxInt64: none). It may be
	// early (then the Match that passes it finds nothing to drop and
	// recomputes it), never late.
	nextExpiry atomic.Int64

	runs   runPool  // the trees' run arrays
	clears []uint64 // trim's batch of table changes
	sink   uint64   // keeps the prefetching loads alive
}

type agroup struct {
	tab   *atable // nil when Serialized
	stab  *btable // Serialized only
	base  int     // the group's first slot number (Slot.Index): 64 times its place in groups
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
	tree     atree
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
		g = &agroup{base: 64 * len(groups)}
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
//
// The hashes must be a chain, as HashText's, HashTokens' and vLLM's are:
// equal hashes at a position imply equal blocks before it. Hashes that
// are not (a key repeated within a prompt, or after other blocks than
// before) are recorded without harm, but their blocks may then be
// reported held or not held as the LRU order would not have them.
func (a *Approx) Record(now time.Time, endpoint string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	t := now.UnixNano()
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.endpoint(endpoint)
	tr := &e.tree
	tr.seq++
	cur, covered := tr.walk(hashes, t)
	if rest := hashes[covered:]; len(rest) > 0 {
		var run []uint64
		extend := cur >= 0 && tr.nodes[cur].heap >= 0 // a leaf the prompt goes past
		if extend {
			run = a.runs.grow(tr.nodes[cur].run, len(rest))
		} else {
			run = a.runs.get(len(rest))
		}
		from := len(run)
		for _, h := range rest {
			run = append(run, nonZero(h)) // 0 is the tables' empty key; HashTokens never returns it
		}
		if extend {
			tr.nodes[cur].run = run
			tr.n += len(rest)
		} else {
			tr.addLeaf(cur, run, t)
		}
		a.insert(e, run[from:])
	}
	a.trim(e, t, true)
	a.noteExpiry(e)
}

// insert sets e's bit on keys, blocks new to the endpoint, in the table.
// Called with a.mu held.
func (a *Approx) insert(e *aendpoint, keys []uint64) {
	if e.g.tab != nil {
		a.sink += e.g.tab.applyBatch(keys, nil, e.bit)
		return
	}
	a.sink += e.g.stab.touch(keys)
	for _, k := range keys {
		e.g.stab.set(k, e.bit)
	}
}

// trim drops e's least recent entries while it is over capacity or (when
// ttl) they expired at t, and clears the dropped keys from the table.
// Called with a.mu held.
func (a *Approx) trim(e *aendpoint, t int64, ttl bool) {
	clears := a.clears[:0]
	tr := &e.tree
	for nd := tr.least(); nd != nil; nd = tr.least() {
		expired := ttl && t-nd.t > a.ttl
		if !expired && tr.n <= e.capacity {
			break
		}
		k := len(nd.run)
		if !expired {
			k = min(k, tr.n-e.capacity)
		}
		clears = append(clears, nd.run[len(nd.run)-k:]...)
		tr.n -= k
		if k < len(nd.run) {
			nd.run = nd.run[:len(nd.run)-k]
			continue
		}
		a.runs.put(tr.dropLeast())
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
	e.g.room[i].Store(int64(e.capacity - e.tree.n))
	t := int64(0)
	if nd := e.tree.least(); nd != nil {
		t = nd.t
	}
	e.g.oldest[i].Store(t)
}

// noteExpiry lowers nextExpiry to e's first expiry. Called with a.mu held.
func (a *Approx) noteExpiry(e *aendpoint) {
	nd := e.tree.least()
	if nd == nil {
		return
	}
	if x := nd.t + a.ttl; x < a.nextExpiry.Load() {
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
		if nd := e.tree.least(); nd != nil {
			next = min(next, nd.t+a.ttl)
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
	if e.tree.n > e.capacity {
		a.trim(e, 0, false)
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

// Index returns the slot's number in its Approx, -1 for the zero Slot:
// slots are numbered from 0, densely while no endpoint is removed, and
// MatchSlots names its hits by it.
func (s Slot) Index() int {
	if s.g == nil {
		return -1
	}
	return s.g.base + s.i
}

// Clear drops all of endpoint's entries; its capacity and Slot stay.
func (a *Approx) Clear(endpoint string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e := a.eps[endpoint]
	if e == nil {
		return
	}
	capacity := e.capacity
	e.capacity = 0
	a.trim(e, 0, false)
	e.capacity = capacity
	e.publishRoom()
	a.noteExpiry(e)
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
		n += e.tree.n
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
	var nm [64]*string
	names := a.namesBuf(&nm)
	for _, g := range *a.groups.Load() {
		alive := g.first(hashes, names)
		for i := 1; i < len(hashes) && alive != 0; i++ {
			held := g.get(nonZero(hashes[i]))
			for b := alive &^ held; b != 0; b &= b - 1 {
				dst = g.hit(dst, bits.TrailingZeros64(b), i, names)
			}
			alive &= held
		}
		for b := alive; b != 0; b &= b - 1 {
			dst = g.hit(dst, bits.TrailingZeros64(b), len(hashes), names)
		}
	}
	sortHits(dst[start:])
	return dst
}

// MatchUnordered is Match for chained hashes (each block's hash determines
// the blocks before it, as HashText's, HashTokens' and vLLM's do), with
// the hits in no particular order (the router's form of it is MatchSlots).
// It reads O(log n) blocks per distinct match depth instead of every
// block: Record makes a prompt's first block its most recent and each block more recent than the next,
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
	var depth [64]int32
	var nm [64]*string
	names := a.namesBuf(&nm)
	for _, g := range *a.groups.Load() {
		for b := g.depths(hashes, &depth, names); b != 0; b &= b - 1 {
			i := bits.TrailingZeros64(b)
			dst = g.hit(dst, i, int(depth[i]), names)
		}
	}
	return dst
}

// SlotHit is a hit of MatchSlots: the endpoint with the Slot numbered Slot
// (Slot.Index) holds the first Blocks blocks of the prompt.
type SlotHit struct {
	Slot, Blocks int32
}

// MatchSlots is MatchUnordered with the hits naming their endpoints by
// slot number rather than by name: the router, which keeps its endpoints
// by slot, finds each hit's without a lookup by name. A slot names
// whichever endpoint holds it when the caller looks: a MatchSlots that
// overlaps a Remove and the Record that gives the slot to another endpoint
// may credit that one with the removed one's blocks (the router serialises
// its calls).
func (a *Approx) MatchSlots(now time.Time, hashes []uint64, dst []SlotHit) []SlotHit {
	if len(hashes) == 0 {
		return dst
	}
	a.expireAt(now)
	var depth [64]int32
	for _, g := range *a.groups.Load() {
		for b := g.depths(hashes, &depth, nil); b != 0; b &= b - 1 {
			if i := bits.TrailingZeros64(b); g.names[i].Load() != nil {
				dst = append(dst, SlotHit{Slot: int32(g.base + i), Blocks: depth[i]})
			}
		}
	}
	return dst
}

// depths finds, for each endpoint of the group holding the first block of
// the chain hashes (not empty), how many leading blocks it holds: it
// returns their mask and sets depth[i] for each endpoint i in it.
func (g *agroup) depths(hashes []uint64, depth *[64]int32, names *[64]*string) uint64 {
	n := len(hashes)
	first := g.first(hashes, names)
	if first == 0 {
		return 0
	}
	last := first
	if n > 1 {
		last = g.get(nonZero(hashes[n-1])) & first
	}
	for b := last; b != 0; b &= b - 1 {
		depth[bits.TrailingZeros64(b)] = int32(n)
	}
	g.bisect(depth, hashes, 0, first, n-1, last)
	return first
}

// bisect sets the depths of the endpoints that hold block lo of hashes
// (mask mlo) but not block hi (mask mhi, a subset of mlo): each holds a
// prefix ending in [lo, hi).
func (g *agroup) bisect(depth *[64]int32, hashes []uint64, lo int, mlo uint64, hi int, mhi uint64) {
	if mlo&^mhi == 0 {
		return
	}
	if hi-lo == 1 {
		for b := mlo &^ mhi; b != 0; b &= b - 1 {
			depth[bits.TrailingZeros64(b)] = int32(hi)
		}
		return
	}
	mid := lo + (hi-lo)/2
	mm := g.get(nonZero(hashes[mid]))&mlo | mhi
	g.bisect(depth, hashes, lo, mlo, mid, mm)
	g.bisect(depth, hashes, mid, mm, hi, mhi)
}

// get returns key's mask in the group's table.
func (g *agroup) get(key uint64) uint64 {
	if g.stab != nil {
		return g.stab.get(key)
	}
	return g.tab.get(key)
}

// namesBuf returns buf for a match of a's to read names into, or nil
// when a is Serialized: no Remove then runs during a match.
func (a *Approx) namesBuf(buf *[64]*string) *[64]*string {
	if a.cfg.Serialized {
		return nil
	}
	return buf
}

// first returns the mask of hashes' first block. With names (a concurrent
// Approx), it reads the names of the mask's endpoints into names first,
// then the mask again, without the bits with no name: a Remove and an
// Record of another endpoint may hand a bit over during a match, and
// hit then drops a bit whose name changed, as Index's match does (see
// igroup.match), so that no endpoint is credited with another's blocks.
func (g *agroup) first(hashes []uint64, names *[64]*string) uint64 {
	m := g.get(nonZero(hashes[0]))
	if names == nil || m == 0 {
		return m
	}
	for b := m; b != 0; b &= b - 1 {
		i := bits.TrailingZeros64(b)
		if names[i] = g.names[i].Load(); names[i] == nil {
			m &^= 1 << i
		}
	}
	return m & g.get(nonZero(hashes[0]))
}

// hit appends bit's hit, unless it has no endpoint, or, with names, the
// bit changed hands since first read its name.
func (g *agroup) hit(dst []Hit, bit, blocks int, names *[64]*string) []Hit {
	name := g.names[bit].Load()
	if name == nil || (names != nil && name != names[bit]) {
		return dst
	}
	return append(dst, Hit{Endpoint: *name, Blocks: blocks, Tier: kvroute.TierGPU, GPUBlocks: blocks})
}
