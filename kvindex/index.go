package kvindex

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute"
)

// IndexConfig configures an Index. The zero value is usable.
type IndexConfig struct {
	// BlockSize is the engines' KV block size in tokens (the router must hash
	// prompts with the same size); 0 learns it from the first BlockStored.
	BlockSize int
	// Capacity bounds the number of (block, endpoint) entries; beyond it
	// random entries of the largest endpoint are evicted. The engines' own
	// BlockRemoved events normally keep the index far below it; the bound is
	// a safety net against lost events. Default 1<<23 (about 8.4 million,
	// roughly 450 MB).
	Capacity int
	// Shards is the number of shards of each block table, a power of two;
	// default 256.
	Shards int
}

func (c *IndexConfig) setDefaults() {
	if c.Capacity <= 0 {
		c.Capacity = 1 << 23
	}
	if c.Shards <= 0 || c.Shards&(c.Shards-1) != 0 {
		c.Shards = 256
	}
}

// Errors returned by Index.Store.
var (
	// ErrUnknownParent: the event's parent block was never stored on this
	// endpoint (the router subscribed after it was stored, or events were
	// lost), so the blocks' token prefix and hence their keys are unknown.
	ErrUnknownParent = errors.New("kvindex: parent block unknown")
	// ErrBlockSize: the event's block size differs from the index's.
	ErrBlockSize = errors.New("kvindex: block size mismatch")
	// ErrBadStored: token ids do not fill the blocks, or a salt list has the
	// wrong length.
	ErrBadStored = errors.New("kvindex: malformed stored blocks")
	// ErrRemoved: the endpoint was removed while the call was in progress.
	ErrRemoved = errors.New("kvindex: endpoint removed")
	// ErrUnknownBlocks: a BlockStored without token ids (vLLM's CPU
	// offloading reports the blocks it copies by hash alone) names blocks
	// this endpoint never stored with their tokens, so their keys are
	// unknown; the blocks it does know are indexed.
	ErrUnknownBlocks = errors.New("kvindex: blocks stored without tokens are unknown")
)

// Stored is one BlockStored event as the index needs it.
type Stored struct {
	// BlockHashes are the engine's hashes of the stored blocks, in order.
	BlockHashes []uint64
	// Parent is the engine hash of the block before BlockHashes[0], valid
	// when HasParent (false for a sequence's first block).
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of all the blocks, concatenated. Empty
	// Tokens name blocks by their engine hashes alone (vLLM's
	// OffloadingConnector reports its CPU copies so): blocks the endpoint
	// stored earlier with their tokens gain the tier, others are skipped
	// (ErrUnknownBlocks); Parent and Salts are then ignored.
	Tokens []uint32
	// BlockSize is the tokens per block (0 = the index's).
	BlockSize int
	// Tier is where the blocks were stored: GPU (the default for TierNone)
	// or CPU.
	Tier kvroute.Tier
	// Salts, when not nil, has one entry per block: non-zero for blocks whose
	// engine hash covers more than tokens (LoRA adapter, multimodal inputs,
	// cache salt), folded into the block's parent key. Such blocks get keys
	// no plain prompt can match, and so do their descendants; a first block
	// whose only extra key is a cache_salt entry (BlockKey("", salt)) has the key
	// HashTokensSalted gives a request with that salt.
	Salts []uint64
}

// Index is the precise prefix index: which endpoint holds which block, as
// the engines themselves report it in KV-cache events. Blocks are keyed by
// the router's own chained hash over token ids (ChainHash), computed from
// each BlockStored's token ids and its parent's key, so requests hashed with
// HashTokens match regardless of the engine's hash function or seed; the
// engine's hashes are kept per endpoint only to apply BlockRemoved.
//
// Index is safe for concurrent use. Match takes no lock and never waits for
// a writer; writers for different endpoints run in parallel. Lock order:
// Index.mu, then an endpoint's mu, then a table shard's mu.
type Index struct {
	cfg       IndexConfig
	blockSize atomic.Int64

	mu     sync.RWMutex // guards eps and growth of groups
	eps    map[string]*iendpoint
	groups atomic.Pointer[[]*igroup]

	entries atomic.Int64 // (block, endpoint) entries: sum of iendpoint.blocks.Len()

	orphans, unknownRemoves, evictions, mismatches atomic.Uint64
}

// igroup holds up to 64 endpoints, one bit each in its tables' masks.
type igroup struct {
	gpu, cpu *maskTable
	names    [64]atomic.Pointer[string] // endpoint name per bit; nil = free
	inUse    uint64                     // bits allocated; guarded by Index.mu
}

type iendpoint struct {
	name string
	g    *igroup
	bit  uint64

	mu     sync.Mutex // serialises this endpoint's writers; guards the fields below
	blocks emap       // engine block hash -> key
	// copies counts, per engine hash, the GPU copies beyond the first: vLLM
	// does not de-duplicate its prefix cache (two requests that compute the
	// same block in one step, or a fully cached prompt whose last block is
	// recomputed, cache it twice), reports each copy's BlockStored and each
	// copy's BlockRemoved, and keeps the block while one copy is left. Nil
	// until a second copy is stored. Stale counts of hashes no longer held
	// are dropped when met.
	copies  map[uint64]uint32
	evictAt uint64 // where the next capacity eviction starts scanning
	removed bool
}

// NewIndex returns an empty precise index.
func NewIndex(cfg IndexConfig) *Index {
	cfg.setDefaults()
	x := &Index{cfg: cfg, eps: make(map[string]*iendpoint)}
	x.blockSize.Store(int64(cfg.BlockSize))
	x.groups.Store(&[]*igroup{})
	return x
}

// BlockSize returns the index's block size in tokens (0 until learned).
func (x *Index) BlockSize() int { return int(x.blockSize.Load()) }

func (x *Index) endpoint(name string) *iendpoint {
	x.mu.RLock()
	e := x.eps[name]
	x.mu.RUnlock()
	if e != nil {
		return e
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if e = x.eps[name]; e != nil {
		return e
	}
	groups := *x.groups.Load()
	var g *igroup
	for _, cand := range groups {
		if cand.inUse != ^uint64(0) {
			g = cand
			break
		}
	}
	if g == nil {
		g = &igroup{gpu: newMaskTable(x.cfg.Shards), cpu: newMaskTable(x.cfg.Shards)}
		ng := append(append([]*igroup(nil), groups...), g)
		x.groups.Store(&ng)
	}
	bit := uint64(1) << bits.TrailingZeros64(^g.inUse)
	g.inUse |= bit
	n := name
	g.names[bits.TrailingZeros64(bit)].Store(&n)
	e = &iendpoint{name: name, g: g, bit: bit}
	x.eps[name] = e
	return e
}

func (e *iendpoint) table(t kvroute.Tier) *maskTable {
	if t == kvroute.TierCPU {
		return e.g.cpu
	}
	return e.g.gpu
}

// Store applies a BlockStored event from endpoint and returns the number of
// blocks indexed.
func (x *Index) Store(endpoint string, s Stored) (int, error) {
	if len(s.BlockHashes) == 0 {
		return 0, nil
	}
	bs := s.BlockSize
	if bs <= 0 {
		bs = x.BlockSize()
	}
	if bs <= 0 {
		return 0, fmt.Errorf("%w: no block size", ErrBadStored)
	}
	if len(s.Tokens) == 0 {
		return x.storeKnown(endpoint, s, bs)
	}
	if cur := x.BlockSize(); cur == 0 {
		x.blockSize.CompareAndSwap(0, int64(bs))
	}
	if cur := x.BlockSize(); cur != bs {
		x.mismatches.Add(1)
		return 0, fmt.Errorf("%w: event %d, index %d", ErrBlockSize, bs, cur)
	}
	if len(s.Tokens) != len(s.BlockHashes)*bs {
		return 0, fmt.Errorf("%w: %d tokens for %d blocks of %d", ErrBadStored, len(s.Tokens), len(s.BlockHashes), bs)
	}
	if s.Salts != nil && len(s.Salts) != len(s.BlockHashes) {
		return 0, fmt.Errorf("%w: %d salts for %d blocks", ErrBadStored, len(s.Salts), len(s.BlockHashes))
	}
	e := x.endpoint(endpoint)
	e.mu.Lock()
	if e.removed {
		e.mu.Unlock()
		return 0, ErrRemoved
	}
	var key uint64
	if s.HasParent {
		k, ok := e.blocks.get(s.Parent)
		if !ok {
			e.mu.Unlock()
			x.orphans.Add(1)
			return 0, ErrUnknownParent
		}
		key = k
	}
	tab := e.table(s.Tier)
	added := 0
	for i, eh := range s.BlockHashes {
		parent := key
		if s.Salts != nil && s.Salts[i] != 0 {
			if parent == 0 {
				parent = tokenSeed
			}
			parent ^= s.Salts[i]
		}
		key = ChainHash(parent, s.Tokens[i*bs:(i+1)*bs])
		old, ok := e.blocks.put(eh, key)
		switch {
		case !ok:
			added++
			e.forgetCopies(eh)
		case old != key:
			// The engine reused a hash for other contents: forget the old key.
			e.g.gpu.update(old, 0, e.bit)
			e.g.cpu.update(old, 0, e.bit)
			e.forgetCopies(eh)
		case tab == e.g.gpu && tab.get(key)&e.bit != 0:
			// Another GPU copy of a block held: its BlockRemoved will
			// come on its own.
			if e.copies == nil {
				e.copies = make(map[uint64]uint32)
			}
			e.copies[eh]++
		}
		tab.update(key, e.bit, 0)
	}
	e.mu.Unlock()
	if x.entries.Add(int64(added)) > int64(x.cfg.Capacity) {
		x.evict()
	}
	return len(s.BlockHashes), nil
}

// storeKnown applies a BlockStored without token ids: the blocks of s
// that endpoint already holds in a tier (stored with their tokens, whose
// keys it therefore knows) are added to s.Tier. It neither learns the block
// size nor adds an endpoint.
func (x *Index) storeKnown(endpoint string, s Stored, bs int) (int, error) {
	if cur := x.BlockSize(); cur != bs {
		if cur == 0 {
			// Nothing was stored with tokens yet: every block is unknown.
			x.orphans.Add(1)
			return 0, fmt.Errorf("%w: %d blocks", ErrUnknownBlocks, len(s.BlockHashes))
		}
		x.mismatches.Add(1)
		return 0, fmt.Errorf("%w: event %d, index %d", ErrBlockSize, bs, cur)
	}
	x.mu.RLock()
	e := x.eps[endpoint]
	x.mu.RUnlock()
	if e == nil {
		x.orphans.Add(1)
		return 0, fmt.Errorf("%w: %d blocks", ErrUnknownBlocks, len(s.BlockHashes))
	}
	tab := e.table(s.Tier)
	known := 0
	e.mu.Lock()
	if e.removed {
		e.mu.Unlock()
		return 0, ErrRemoved
	}
	for _, eh := range s.BlockHashes {
		key, ok := e.blocks.get(eh)
		if !ok {
			continue
		}
		known++
		if tab == e.g.gpu && tab.get(key)&e.bit != 0 {
			if e.copies == nil {
				e.copies = make(map[uint64]uint32)
			}
			e.copies[eh]++
		}
		tab.update(key, e.bit, 0)
	}
	e.mu.Unlock()
	if unknown := len(s.BlockHashes) - known; unknown > 0 {
		x.orphans.Add(1)
		return known, fmt.Errorf("%w: %d of %d blocks", ErrUnknownBlocks, unknown, len(s.BlockHashes))
	}
	return known, nil
}

// Evict applies a BlockRemoved event: endpoint no longer holds the blocks
// with these engine hashes in tier (TierNone means GPU). Unknown hashes are
// counted and ignored. A GPU block stored more than once (vLLM caches and
// reports every copy it computes) stays until each copy is removed.
func (x *Index) Evict(endpoint string, engineHashes []uint64, tier kvroute.Tier) {
	x.mu.RLock()
	e := x.eps[endpoint]
	x.mu.RUnlock()
	if e == nil {
		x.unknownRemoves.Add(uint64(len(engineHashes)))
		return
	}
	tab, other := e.g.gpu, e.g.cpu
	if tier == kvroute.TierCPU {
		tab, other = other, tab
	}
	removed, unknown := 0, 0
	e.mu.Lock()
	for _, eh := range engineHashes {
		key, ok := e.blocks.get(eh)
		if !ok {
			unknown++
			e.forgetCopies(eh)
			continue
		}
		if tab == e.g.gpu {
			if n := e.copies[eh]; n > 0 {
				// One GPU copy of several went: the block stays.
				if n == 1 {
					delete(e.copies, eh)
				} else {
					e.copies[eh] = n - 1
				}
				continue
			}
		}
		tab.update(key, 0, e.bit)
		if other.live.Load() == 0 || other.get(key)&e.bit == 0 {
			e.blocks.del(eh)
			e.forgetCopies(eh) // left when another hash cleared the key's GPU bit
			removed++
		}
	}
	e.mu.Unlock()
	x.entries.Add(-int64(removed))
	if unknown > 0 {
		x.unknownRemoves.Add(uint64(unknown))
	}
}

// Clear drops every entry of endpoint (AllBlocksCleared, an engine restart,
// or a resync after lost events); the endpoint stays known.
func (x *Index) Clear(endpoint string) {
	x.mu.RLock()
	e := x.eps[endpoint]
	x.mu.RUnlock()
	if e == nil {
		return
	}
	x.clear(e)
}

// clear drops e's entries unless e was removed since it was looked up:
// Remove has dropped them, and e's bit in its group's masks may belong to
// another endpoint by now.
func (x *Index) clear(e *iendpoint) {
	e.mu.Lock()
	if !e.removed {
		x.clearLocked(e)
	}
	e.mu.Unlock()
}

// forgetCopies drops the extra copies counted for engine hash eh. Called
// with e.mu held.
func (e *iendpoint) forgetCopies(eh uint64) {
	if e.copies != nil {
		delete(e.copies, eh)
	}
}

func (x *Index) clearLocked(e *iendpoint) {
	n := e.blocks.Len()
	e.blocks = emap{}
	e.copies = nil
	e.g.gpu.clearBits(e.bit)
	e.g.cpu.clearBits(e.bit)
	x.entries.Add(-int64(n))
}

// Remove purges endpoint's entries and forgets it.
func (x *Index) Remove(endpoint string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	e := x.eps[endpoint]
	if e == nil {
		return
	}
	e.mu.Lock()
	x.clearLocked(e)
	e.removed = true
	e.mu.Unlock()
	delete(x.eps, endpoint)
	e.g.names[bits.TrailingZeros64(e.bit)].Store(nil)
	e.g.inUse &^= e.bit
}

// evict brings the entry count back under capacity by dropping random
// entries of the largest endpoints.
func (x *Index) evict() {
	for x.entries.Load() > int64(x.cfg.Capacity) {
		x.mu.RLock()
		var victim *iendpoint
		most := -1
		for _, e := range x.eps {
			e.mu.Lock()
			n := e.blocks.Len()
			e.mu.Unlock()
			if n > most {
				victim, most = e, n
			}
		}
		x.mu.RUnlock()
		if victim == nil || most == 0 {
			return
		}
		excess := int(x.entries.Load() - int64(x.cfg.Capacity))
		// Evict a little more than needed so the next inserts do not each
		// pay for a round.
		want := min(max(excess, 0)+x.cfg.Capacity/64+1, most)
		victim.mu.Lock()
		// Start where the last round stopped, moved on by a large odd step,
		// so successive rounds spread over the whole table.
		victim.evictAt += 0x9e3779b97f4a7c15
		n := victim.blocks.evictFrom(victim.evictAt, want, func(eh, key uint64) {
			victim.g.gpu.update(key, 0, victim.bit)
			victim.g.cpu.update(key, 0, victim.bit)
			// Its extra copies' count goes with it: an engine that
			// never removes would otherwise grow copies without bound.
			victim.forgetCopies(eh)
		})
		victim.mu.Unlock()
		x.entries.Add(-int64(n))
		x.evictions.Add(uint64(n))
		if n == 0 {
			return
		}
	}
}

// Match appends to dst, for every endpoint holding at least the first of
// hashes (keys from HashTokens with the index's block size), the number of
// leading blocks it holds in any tier, and returns the extended slice
// ordered by Blocks descending then Endpoint. Hit.Tier is TierGPU when all
// those blocks are on the GPU and TierCPU when some are only in host memory;
// Hit.GPUBlocks is the leading run on the GPU alone. Match takes no lock.
// Racing a Remove, a hit may name the endpoint removed (callers keep the
// endpoints they know), never another endpoint that took its place.
func (x *Index) Match(hashes []uint64, dst []Hit) []Hit {
	if len(hashes) == 0 {
		return dst
	}
	start := len(dst)
	for _, g := range *x.groups.Load() {
		dst = g.match(hashes, dst)
	}
	sortHits(dst[start:])
	return dst
}

// match appends g's hits. A bit may change hands while it reads: Remove
// frees an endpoint's bit (after clearing its blocks and its name) and the
// next endpoint added takes it (a new name, then its blocks), so blocks
// read before the change and a name read after it would credit one
// endpoint with another's prefix. So the names of the bits holding the
// first block are read first and the masks after them, and a hit is
// emitted only if its bit's name is still the same pointer (every endpoint
// added gets a new one): the masks it was counted from were that
// endpoint's. (A hit may name an endpoint whose Remove is under way, with
// fewer blocks: the router drops endpoints it does not know.)
func (g *igroup) match(hashes []uint64, dst []Hit) []Hit {
	cpuOn := g.cpu.live.Load() > 0
	alive := g.gpu.get(hashes[0])
	if cpuOn {
		alive |= g.cpu.get(hashes[0])
	}
	if alive == 0 {
		return dst
	}
	var names [64]*string
	for b := alive; b != 0; b &= b - 1 {
		i := bits.TrailingZeros64(b)
		if names[i] = g.names[i].Load(); names[i] == nil {
			alive &^= 1 << i
		}
	}
	// The first block again, read after the names.
	var gpuRun [64]int32
	gpu := g.gpu.get(hashes[0]) & alive
	held := gpu
	if cpuOn {
		held |= g.cpu.get(hashes[0])
	}
	if alive &= held; alive == 0 {
		return dst
	}
	gpuAlive := gpu
	for i := 1; i < len(hashes); i++ {
		m := g.gpu.get(hashes[i])
		held := m
		if cpuOn {
			held |= g.cpu.get(hashes[i])
		}
		if lost := gpuAlive &^ m; lost != 0 {
			for b := lost; b != 0; b &= b - 1 {
				gpuRun[bits.TrailingZeros64(b)] = int32(i)
			}
			gpuAlive &= m
		}
		if ended := alive &^ held; ended != 0 {
			for b := ended; b != 0; b &= b - 1 {
				dst = g.hit(dst, bits.TrailingZeros64(b), i, &gpuRun, gpuAlive, &names)
			}
			alive &= held
			if alive == 0 {
				return dst
			}
		}
	}
	for b := alive; b != 0; b &= b - 1 {
		dst = g.hit(dst, bits.TrailingZeros64(b), len(hashes), &gpuRun, gpuAlive, &names)
	}
	return dst
}

// hit appends bit's hit unless the bit changed hands since names was read
// (see match).
func (g *igroup) hit(dst []Hit, bit, blocks int, gpuRun *[64]int32, gpuAlive uint64, names *[64]*string) []Hit {
	name := g.names[bit].Load()
	if name == nil || name != names[bit] {
		return dst
	}
	gb := blocks
	if gpuAlive&(1<<bit) == 0 {
		gb = min(int(gpuRun[bit]), blocks)
	}
	t := kvroute.TierGPU
	if gb < blocks {
		t = kvroute.TierCPU
	}
	return append(dst, Hit{Endpoint: *name, Blocks: blocks, Tier: t, GPUBlocks: gb})
}

// IndexStats are an Index's counters.
type IndexStats struct {
	// Entries is the number of (block, endpoint) entries; Keys the number of
	// distinct (block, tier) keys; Endpoints the endpoints known.
	Entries, Keys, Endpoints int
	// BlockSize is the block size in tokens (0 until learned).
	BlockSize int
	// Orphans counts BlockStored events dropped for an unknown parent, and
	// those without token ids that named unknown blocks;
	// UnknownRemoves BlockRemoved hashes never stored; Evictions entries
	// dropped for capacity; BlockSizeMismatches events with another block
	// size.
	Orphans, UnknownRemoves, Evictions, BlockSizeMismatches uint64
	// Slots is the number of table slots allocated (16 bytes each).
	Slots int
}

// Stats returns the index's counters.
func (x *Index) Stats() IndexStats {
	s := IndexStats{
		Entries:             int(x.entries.Load()),
		BlockSize:           x.BlockSize(),
		Orphans:             x.orphans.Load(),
		UnknownRemoves:      x.unknownRemoves.Load(),
		Evictions:           x.evictions.Load(),
		BlockSizeMismatches: x.mismatches.Load(),
	}
	x.mu.RLock()
	s.Endpoints = len(x.eps)
	x.mu.RUnlock()
	for _, g := range *x.groups.Load() {
		s.Keys += int(g.gpu.live.Load() + g.cpu.live.Load())
		s.Slots += g.gpu.slots() + g.cpu.slots()
	}
	return s
}
