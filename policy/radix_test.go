package policy

import (
	"math/rand/v2"
	"testing"
)

// naiveTree is the reference: per tenant, the set of all prefixes held.
type naiveTree map[string]map[string]bool

func (n naiveTree) insert(text, tenant string) {
	if n[tenant] == nil {
		n[tenant] = map[string]bool{}
	}
	for i := 1; i <= len(text); i++ {
		n[tenant][text[:i]] = true
	}
}

func (n naiveTree) match(text string) int {
	best := 0
	for _, set := range n {
		for i := len(text); i > best; i-- {
			if set[text[:i]] {
				best = i
				break
			}
		}
	}
	return best
}

func randText(r *rand.Rand) string {
	b := make([]byte, 1+r.IntN(12))
	for i := range b {
		b[i] = "abc"[r.IntN(3)]
	}
	return string(b)
}

// TestRadixTreeMatchesNaive checks match and per-tenant sizes against the
// prefix-set reference over random inserts.
func TestRadixTreeMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	tree, ref := newRadixTree(), naiveTree{}
	tenants := []string{"w0", "w1", "w2"}
	for k := 0; k < 2000; k++ {
		text, tenant := randText(r), tenants[r.IntN(len(tenants))]
		if got, want := func() int { m, _ := tree.match(text); return m }(), ref.match(text); got != want {
			t.Fatalf("step %d: match(%q) = %d, want %d", k, text, got, want)
		}
		tree.insert(text, tenant)
		ref.insert(text, tenant)
		for _, tn := range tenants {
			if got, want := tree.size[tn], len(ref[tn]); got != want {
				t.Fatalf("step %d: size[%s] = %d, want %d", k, tn, got, want)
			}
		}
	}
}

// TestRadixTreeEvict checks that eviction bounds a tenant's size, keeps what
// it holds prefix-closed, keeps its most recent text and leaves the other
// tenants alone.
func TestRadixTreeEvict(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	tree := newRadixTree()
	var last string
	for k := 0; k < 500; k++ {
		last = randText(r) + randText(r)
		tree.insert(last, "w0")
		tree.insert(randText(r), "w1")
	}
	w1 := tree.size["w1"]
	tree.evict("w0", 30)
	if tree.size["w0"] > 30 {
		t.Fatalf("size after evict = %d, want <= 30", tree.size["w0"])
	}
	if tree.size["w1"] != w1 {
		t.Errorf("evicting w0 changed w1's size %d -> %d", w1, tree.size["w1"])
	}
	var check func(n *radixNode, parentHas bool) int
	check = func(n *radixNode, parentHas bool) int {
		_, has := n.tenants["w0"]
		if has && !parentHas {
			t.Fatalf("node %q held by w0 under a node it does not hold", n.edge)
		}
		if len(n.tenants) == 0 && n != tree.root {
			t.Fatalf("node %q held by nobody is still in the tree", n.edge)
		}
		total := 0
		if has {
			total = len(n.edge)
		}
		for _, c := range n.children {
			total += check(c, has)
		}
		return total
	}
	if got := check(tree.root, true); got != tree.size["w0"] {
		t.Errorf("w0 holds %d characters in the tree, size says %d", got, tree.size["w0"])
	}
	tree.removeTenant("w1")
	if _, ok := tree.size["w1"]; ok {
		t.Error("removeTenant left a size entry")
	}
	// The most recent text survives: every node along its path is w0's.
	n, rest := tree.root, last
	for rest != "" {
		c := n.children[rest[0]]
		if c == nil {
			t.Fatalf("most recent text %q lost at %q", last, rest)
		}
		if _, ok := c.tenants["w0"]; !ok {
			t.Fatalf("most recent text %q: node %q no longer w0's", last, c.edge)
		}
		rest = rest[lcp(c.edge, rest):]
		n = c
	}
}
