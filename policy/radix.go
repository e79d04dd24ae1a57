package policy

import (
	"container/heap"
	"strings"
)

// radixTree is a multi-tenant character radix tree in the form SGLang's
// router uses (sgl-model-gateway/src/policies/tree.rs): one tree per model,
// each node records which tenants (workers) hold it and when each last
// touched it, and each tenant's size is the number of characters it holds.
// Access times come from a counter, not the wall clock. Not safe for
// concurrent use.
type radixTree struct {
	root  *radixNode
	clock uint64
	size  map[string]int // characters held per tenant
	nodes int
}

type radixNode struct {
	edge     string // label from the parent (a private copy)
	parent   *radixNode
	children map[byte]*radixNode
	tenants  map[string]uint64 // tenant -> last access tick
}

func newRadixTree() *radixTree {
	return &radixTree{root: &radixNode{tenants: map[string]uint64{}}, size: map[string]int{}, nodes: 1}
}

func (t *radixTree) touch(n *radixNode, tenant string) {
	t.clock++
	if _, ok := n.tenants[tenant]; !ok {
		t.size[tenant] += len(n.edge)
	}
	n.tenants[tenant] = t.clock
}

func lcp(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// insert records that tenant holds text.
func (t *radixTree) insert(text, tenant string) {
	n := t.root
	t.touch(n, tenant)
	for text != "" {
		child := n.children[text[0]]
		if child == nil {
			leaf := &radixNode{edge: strings.Clone(text), parent: n, tenants: map[string]uint64{}}
			if n.children == nil {
				n.children = map[byte]*radixNode{}
			}
			n.children[text[0]] = leaf
			t.nodes++
			t.touch(leaf, tenant)
			return
		}
		c := lcp(child.edge, text)
		if c < len(child.edge) {
			// Split the edge: mid takes the common part and the child's tenants.
			mid := &radixNode{edge: child.edge[:c], parent: n, children: map[byte]*radixNode{child.edge[c]: child},
				tenants: make(map[string]uint64, len(child.tenants))}
			for k, v := range child.tenants {
				mid.tenants[k] = v
			}
			child.edge = strings.Clone(child.edge[c:])
			mid.edge = strings.Clone(mid.edge)
			child.parent = mid
			n.children[text[0]] = mid
			t.nodes++
			child = mid
		}
		t.touch(child, tenant)
		n = child
		text = text[c:]
	}
}

// match returns the number of leading characters of text the tree holds and
// the node where the match ended (the last node entered, possibly part-way
// along its edge).
func (t *radixTree) match(text string) (int, *radixNode) {
	n := t.root
	matched := 0
	for text != "" {
		child := n.children[text[0]]
		if child == nil {
			break
		}
		c := lcp(child.edge, text)
		matched += c
		n = child
		if c < len(child.edge) {
			break
		}
		text = text[c:]
	}
	return matched, n
}

// mostRecent returns the tenant that touched n last ("" when none), breaking
// equal ticks by name so the answer is deterministic.
func (n *radixNode) mostRecent() string {
	best, tick := "", uint64(0)
	for k, v := range n.tenants {
		if v > tick || (v == tick && k < best) {
			best, tick = k, v
		}
	}
	return best
}

// removeNode detaches a node that no tenant holds any more.
func (t *radixTree) removeNode(n *radixNode) {
	if n.parent == nil {
		return
	}
	delete(n.parent.children, n.edge[0])
	t.nodes--
}

// leafFor reports whether tenant holds n and none of n's children.
func leafFor(n *radixNode, tenant string) bool {
	if _, ok := n.tenants[tenant]; !ok {
		return false
	}
	for _, c := range n.children {
		if _, ok := c.tenants[tenant]; ok {
			return false
		}
	}
	return true
}

// evict removes tenant's least recently used leaves until it holds at most
// max characters (SGLang evict_tenant_by_size).
func (t *radixTree) evict(tenant string, max int) {
	if t.size[tenant] <= max {
		return
	}
	h := &leafHeap{tenant: tenant}
	var walk func(n *radixNode)
	walk = func(n *radixNode) {
		if n != t.root && leafFor(n, tenant) {
			h.nodes = append(h.nodes, n)
		}
		for _, c := range n.children {
			if _, ok := c.tenants[tenant]; ok {
				walk(c)
			}
		}
	}
	walk(t.root)
	heap.Init(h)
	for t.size[tenant] > max && h.Len() > 0 {
		n := heap.Pop(h).(*radixNode)
		t.drop(n, tenant)
		if p := n.parent; p != nil && p != t.root && leafFor(p, tenant) {
			heap.Push(h, p)
		}
	}
}

// drop removes tenant from node n, and n from the tree when nobody holds it.
func (t *radixTree) drop(n *radixNode, tenant string) {
	if _, ok := n.tenants[tenant]; !ok {
		return
	}
	delete(n.tenants, tenant)
	t.size[tenant] -= len(n.edge)
	if len(n.tenants) == 0 && n != t.root {
		t.removeNode(n)
	}
}

// removeTenant forgets everything tenant holds.
func (t *radixTree) removeTenant(tenant string) {
	var walk func(n *radixNode)
	walk = func(n *radixNode) {
		for _, c := range n.children {
			if _, ok := c.tenants[tenant]; ok {
				walk(c)
			}
		}
		if n != t.root {
			t.drop(n, tenant)
		}
	}
	walk(t.root)
	delete(t.root.tenants, tenant)
	delete(t.size, tenant)
}

type leafHeap struct {
	tenant string
	nodes  []*radixNode
}

func (h *leafHeap) Len() int { return len(h.nodes) }
func (h *leafHeap) Less(i, j int) bool {
	return h.nodes[i].tenants[h.tenant] < h.nodes[j].tenants[h.tenant]
}
func (h *leafHeap) Swap(i, j int) { h.nodes[i], h.nodes[j] = h.nodes[j], h.nodes[i] }
func (h *leafHeap) Push(x any)    { h.nodes = append(h.nodes, x.(*radixNode)) }
func (h *leafHeap) Pop() any {
	n := h.nodes[len(h.nodes)-1]
	h.nodes = h.nodes[:len(h.nodes)-1]
	return n
}
