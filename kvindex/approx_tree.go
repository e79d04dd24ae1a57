package kvindex

import (
	"math/bits"
	"unsafe"
)

// atree is one endpoint's recency order in an Approx: the chains it holds,
// as a tree of runs. A node holds a run of consecutive blocks of a chain
// (block keys, nonZero), and its children continue it; since a chained
// hash determines every block before it, a block key has one place in the
// tree, and the node a chain continues into is found by the key of its
// first block alone (start).
//
// Every node has the stamp (seq, t) of the last Record that went through
// it, and a Record that covers only part of a node splits it first, so all
// the blocks of a node share their last Record. Approx's exact LRU order
// (a Record makes its blocks the most recent, the first block most recent
// of all) is then: by seq, and within a seq the deeper block is the less
// recent. A parent's seq is at least its children's (a Record through a
// child goes through the parent), and two leaves never share a seq (a
// Record's path ends at one node), so the least recent block is the last
// one of the leaf with the least seq: eviction takes the leaves from a
// min-heap by seq, each from its tail, and a parent whose last child goes
// becomes a leaf. What an endpoint holds of a chain is thus always a
// prefix of it (MatchUnordered's bisection relies on that).
//
// Recording a prompt the endpoint holds costs a lookup per node on its
// path (a system prompt and a conversation: two) and a sequential compare
// of the keys, instead of a random access per block; only the blocks new
// to the endpoint, and the ones evicted, touch the block table.
//
// Not safe for concurrent use: Approx.mu guards it.
type atree struct {
	nodes []anode
	free  []int32 // ids of unused nodes
	start amap    // first key of each node's run -> node id
	heap  []int32 // the leaves, a min-heap by seq
	n     int     // blocks held
	seq   uint64  // the stamp of the last Record
}

type anode struct {
	run    []uint64 // the node's block keys, in chain order
	seq    uint64   // the last Record through the node
	t      int64    // its time, Unix nanoseconds
	parent int32    // -1 when the run starts a chain
	kids   int32    // children (nodes whose parent it is)
	heap   int32    // position in atree.heap, -1 when not a leaf
}

// child returns the node that continues parent's chain (-1: a chain's
// start) with key k, or -1 when none does. For hashes that are not a
// chain the key may start a node elsewhere in the tree: that one is not
// the continuation, and the caller records the rest as new.
func (tr *atree) child(parent int32, k uint64) int32 {
	v := tr.start.find(k)
	if v == nil || tr.nodes[*v].parent != parent {
		return -1
	}
	return int32(*v)
}

// walk finds how much of the chain hashes the tree holds from its start,
// stamping the nodes on the way with the tree's seq and t (splitting the
// node it leaves part way) and moving the leaf it ends on in the heap. It
// returns the node it ended on (-1: none) and how many blocks of hashes
// it covered; hashes[covered:] are new. When that node is a leaf, new
// blocks are to extend it rather than go into a new child.
func (tr *atree) walk(hashes []uint64, t int64) (cur int32, covered int) {
	cur = -1
	for covered < len(hashes) {
		id := tr.child(cur, nonZero(hashes[covered]))
		if id < 0 {
			break
		}
		run := tr.nodes[id].run
		j, m := 1, min(len(run), len(hashes)-covered)
		if m > 1 && keysBytes(run[1:m]) == keysBytes(hashes[covered+1:covered+m]) {
			// All equal, compared in one run (the runtime's vectorised
			// comparison): a prompt the endpoint holds, the common case.
			// The keys are nonZero, so a 0 among hashes compares unequal
			// here and the loop below maps it as Record does.
			j = m
		}
		for j < m && run[j] == nonZero(hashes[covered+j]) {
			j++
		}
		if j < len(run) {
			id = tr.split(id, j)
		}
		nd := &tr.nodes[id]
		nd.seq, nd.t = tr.seq, t
		cur, covered = id, covered+j
		if nd.heap >= 0 {
			// A leaf, covered whole: its seq is now the greatest.
			tr.down(int(nd.heap))
			break
		}
	}
	return cur, covered
}

// split cuts node id after its first j blocks and returns the node that
// holds them, a new parent of id, which keeps the rest, its stamp, its
// children and its place in the heap.
func (tr *atree) split(id int32, j int) int32 {
	p := tr.newNode()
	nd := &tr.nodes[id]
	k0 := nd.run[0]
	tr.nodes[p] = anode{run: nd.run[:j:j], seq: nd.seq, t: nd.t, parent: nd.parent, kids: 1, heap: -1}
	nd.run = nd.run[j:]
	nd.parent = p
	if v := tr.start.find(k0); v != nil && *v == uint64(id) {
		*v = uint64(p)
	}
	v, _ := tr.start.slot(nd.run[0])
	*v = uint64(id)
	return p
}

// addLeaf adds run, stamped with the tree's seq and t, as a new leaf below
// parent (-1: a chain's start), which is not a leaf.
func (tr *atree) addLeaf(parent int32, run []uint64, t int64) {
	id := tr.newNode()
	tr.nodes[id] = anode{run: run, seq: tr.seq, t: t, parent: parent, heap: -1}
	if parent >= 0 {
		tr.nodes[parent].kids++
	}
	// A key that starts another node already is not a chain's: the
	// first node keeps it (this one can only be evicted).
	if v, inserted := tr.start.slot(run[0]); inserted {
		*v = uint64(id)
	}
	tr.n += len(run)
	tr.push(id)
}

// dropLeast removes the leaf at the top of the heap (its blocks, which
// the caller evicts, no longer count in n) and returns its run. Its parent
// becomes a leaf when it was the last child.
func (tr *atree) dropLeast() []uint64 {
	id := tr.heap[0]
	nd := &tr.nodes[id]
	k0 := nd.run[0]
	if v := tr.start.find(k0); v != nil && *v == uint64(id) {
		tr.start.del(k0)
	}
	tr.pop()
	run, parent := nd.run, nd.parent
	*nd = anode{heap: -1}
	tr.free = append(tr.free, id)
	if parent >= 0 {
		pn := &tr.nodes[parent]
		if pn.kids--; pn.kids == 0 {
			tr.push(parent)
		}
	}
	return run
}

// least returns the leaf holding the least recent block, or nil when the
// tree is empty.
func (tr *atree) least() *anode {
	if len(tr.heap) == 0 {
		return nil
	}
	return &tr.nodes[tr.heap[0]]
}

func (tr *atree) newNode() int32 {
	if n := len(tr.free); n > 0 {
		id := tr.free[n-1]
		tr.free = tr.free[:n-1]
		return id
	}
	tr.nodes = append(tr.nodes, anode{heap: -1})
	return int32(len(tr.nodes) - 1)
}

// The leaf heap: a binary min-heap of node ids by seq; each node keeps its
// position (anode.heap).

func (tr *atree) less(i, j int) bool { return tr.nodes[tr.heap[i]].seq < tr.nodes[tr.heap[j]].seq }

func (tr *atree) swap(i, j int) {
	h := tr.heap
	h[i], h[j] = h[j], h[i]
	tr.nodes[h[i]].heap, tr.nodes[h[j]].heap = int32(i), int32(j)
}

func (tr *atree) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !tr.less(i, p) {
			return
		}
		tr.swap(i, p)
		i = p
	}
}

func (tr *atree) down(i int) {
	n := len(tr.heap)
	for {
		m := 2*i + 1
		if m >= n {
			return
		}
		if r := m + 1; r < n && tr.less(r, m) {
			m = r
		}
		if !tr.less(m, i) {
			return
		}
		tr.swap(i, m)
		i = m
	}
}

func (tr *atree) push(id int32) {
	tr.nodes[id].heap = int32(len(tr.heap))
	tr.heap = append(tr.heap, id)
	tr.up(len(tr.heap) - 1)
}

// pop removes the heap's top.
func (tr *atree) pop() {
	last := len(tr.heap) - 1
	tr.swap(0, last)
	tr.nodes[tr.heap[last]].heap = -1
	tr.heap = tr.heap[:last]
	tr.down(0)
}

// runPool recycles the arrays behind the trees' runs by size class (a
// power of two), so that a Serialized Approx at steady state, whose
// Records add and evict runs of similar sizes, allocates nothing. It
// keeps at most runPoolMax keys' worth.
type runPool struct {
	free [64][][]uint64 // class c: arrays of capacity at least 1<<c
	keys int            // capacity held
}

const (
	runPoolMax = 1 << 20
	runMinCap  = 8
)

// get returns an empty slice with room for n keys.
func (p *runPool) get(n int) []uint64 {
	c := bits.Len(uint(max(n, runMinCap) - 1)) // 1<<c >= n
	if l := p.free[c]; len(l) > 0 {
		s := l[len(l)-1]
		l[len(l)-1] = nil
		p.free[c] = l[:len(l)-1]
		p.keys -= cap(s)
		return s
	}
	return make([]uint64, 0, 1<<c)
}

// put takes back s's array (no slice may use it any more).
func (p *runPool) put(s []uint64) {
	if cap(s) < runMinCap || p.keys+cap(s) > runPoolMax {
		return
	}
	c := bits.Len(uint(cap(s))) - 1 // 1<<c <= cap
	p.free[c] = append(p.free[c], s[:0])
	p.keys += cap(s)
}

// grow returns s with room for extra more keys, moved to a larger array
// when it has not.
func (p *runPool) grow(s []uint64, extra int) []uint64 {
	if len(s)+extra <= cap(s) {
		return s
	}
	ns := append(p.get(len(s)+extra), s...)
	p.put(s)
	return ns
}

// keysBytes returns the bytes of keys as a string, without a copy, for a
// comparison: keys must not change while it is in use.
func keysBytes(keys []uint64) string {
	return unsafe.String((*byte)(unsafe.Pointer(unsafe.SliceData(keys))), 8*len(keys))
}
