package disagg

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestDataParallelRanksShareANode: the ranks of one data-parallel server
// (one URL) are one fabric node: NVLink between them under the default
// links, and one network port out of (and into) the machine, so two
// transfers from two prefill ranks of one server to another server queue
// behind each other. A "node" label still wins.
func TestDataParallelRanksShareANode(t *testing.T) {
	rank := func(id, u string, r int, labels ...string) *kvroute.Endpoint {
		e := endpoint(kvroute.DataParallelID(id, r), u, kvroute.RolePrefill, labels...)
		e.DataParallelSize, e.DataParallelRank = 2, r
		return &e
	}
	p0, p1 := rank("p", "http://p:8000", 0), rank("p", "http://p:8000", 1)
	d0, d1 := rank("d", "http://d:8000", 0), rank("d", "http://d:8000", 1)
	if NodeOf(p0) != NodeOf(p1) || NodeOf(p0) == NodeOf(d0) {
		t.Errorf("nodes: got p0 %q p1 %q d0 %q, want p0 = p1 != d0", NodeOf(p0), NodeOf(p1), NodeOf(d0))
	}
	links := DefaultLinks()
	if got := links.Between(p0, p1).Name; got != "nvlink" {
		t.Errorf("between two ranks of one server: got %s, want nvlink", got)
	}
	if got := links.Between(p0, d0).Name; got != "tcp" {
		t.Errorf("between two servers: got %s, want tcp", got)
	}
	if l0, l1 := rank("q", "http://q:8000", 0, "node", "n1"), rank("q", "http://q:8000", 1, "node", "n2"); NodeOf(l0) == NodeOf(l1) ||
		links.Between(l0, l1).Name == "nvlink" {
		t.Errorf("node labels n1, n2: got nodes %q %q and link %s, want the labels' (two nodes)", NodeOf(l0), NodeOf(l1), links.Between(l0, l1).Name)
	}
	plain := endpoint("e", "http://p:8000", kvroute.RolePrefill) // not data-parallel: its own node, as before
	if NodeOf(&plain) != "e" {
		t.Errorf("a plain endpoint: got node %q, want its ID", NodeOf(&plain))
	}

	now := time.Unix(1_800_000_000, 0)
	f := NewFabric(links)
	const bytes = 1 << 30
	f.Reserve(now, now, p0, d0, bytes)
	if e := f.Estimate(now, now, p1, d1, bytes); e.Queue < e.Wire*9/10 {
		t.Errorf("a second transfer out of the same server: got queue %v, want about the first's wire time %v", e.Queue, e.Wire)
	}
}
