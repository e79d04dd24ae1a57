package router

import (
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// drain leaves the head of l until it is empty and returns the order the
// heads came in.
func drain(t *testing.T, l *Line[string]) []string {
	t.Helper()
	var order []string
	h, ok := l.Head()
	for ok {
		order = append(order, h)
		next, more := l.Leave(h)
		if nh, hok := l.Head(); more != hok || (more && nh != next) {
			t.Fatalf("Leave(%q) = %q, %v; Head() = %q, %v", h, next, more, nh, hok)
		}
		h, ok = next, more
	}
	if l.Len() != 0 {
		t.Fatalf("%d left in line after its heads", l.Len())
	}
	return order
}

func TestLineFairByTenant(t *testing.T) {
	var l Line[string]
	if !l.Join("a1", "A") {
		t.Fatal("the first to join an empty line is not its head")
	}
	for _, v := range []string{"a2", "a3", "a4"} {
		if l.Join(v, "A") {
			t.Fatalf("%s joined as head behind a1", v)
		}
	}
	l.Join("b1", "B")
	l.Join("b2", "B")
	l.Join("c1", "C")
	// a1 is the head (tag 1); a2..a4 take tags 2..4, b1 and c1 tag 2 (one
	// past the head's), b2 tag 3: B's and C's first wait for one more of
	// A's at most.
	want := []string{"a1", "a2", "b1", "c1", "a3", "b2", "a4"}
	if got := drain(t, &l); !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}

	// Two of a tenant ahead: one tied with the head's tag, one after it.
	l.Join("x1", "X") // tag vnow+1, the head
	l.Join("a1", "A") // vnow+2
	l.Join("b1", "B") // vnow+2
	l.Leave("x1")     // a1 is the head at vnow+2; b1 waits at that tag
	l.Join("b2", "B") // vnow+3
	l.Join("t1", "T") // vnow+3, after b2
	want = []string{"a1", "b1", "b2", "t1"}
	if got := drain(t, &l); !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

func TestLineLeaveOutOfTurn(t *testing.T) {
	var l Line[string]
	for _, v := range []string{"x1", "x2", "y1", "x3"} {
		l.Join(v, v[:1])
	}
	if _, ok := l.Leave("x2"); ok {
		t.Error("leaving behind the head gave a new head")
	}
	if _, ok := l.Leave("nobody"); ok || l.Len() != 3 {
		t.Errorf("leaving a request not in line changed it: %d in line", l.Len())
	}
	if h, _ := l.Head(); h != "x1" {
		t.Errorf("head %q, want x1", h)
	}
	// The head's index moves when one before it leaves.
	next, ok := l.Leave("x1")
	if !ok || next != "y1" {
		t.Fatalf("next head %q, %v; want y1", next, ok)
	}
	l.Join("z1", "z")
	if _, ok := l.Leave("x3"); ok {
		t.Error("x3 was not the head")
	}
	if got := drain(t, &l); !slices.Equal(got, []string{"y1", "z1"}) {
		t.Errorf("order %v, want [y1 z1]", got)
	}
	if len(l.last) != 0 || len(l.tenants) != 0 {
		t.Errorf("an empty line keeps tenants: %v %v", l.last, l.tenants)
	}
}

// TestLineProperties: under random joins and leaves, each tenant's requests
// come to the head in the order they joined, every request comes to the
// head once, and a request joining with none of its tenant's in line (but
// the head) waits for at most two requests of each other tenant, besides
// the head (the fairness Line promises).
func TestLineProperties(t *testing.T) {
	for seed := range uint64(50) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var l Line[int]
		tenants := []string{"t0", "t1", "t2", "t3"}
		tenantOf := map[int]string{}
		joinedBefore := map[int][]int{} // the requests in line when each joined
		headAt := map[int]int{}         // the head when each joined
		var order []int
		next := 0
		for step := 0; step < 400 || l.Len() > 0; step++ {
			if step < 400 && (l.Len() == 0 || rng.IntN(3) > 0) {
				v := next
				next++
				tenantOf[v] = tenants[rng.IntN(len(tenants))]
				for _, e := range l.q {
					joinedBefore[v] = append(joinedBefore[v], e.v)
				}
				if h, ok := l.Head(); ok {
					headAt[v] = h
				} else {
					headAt[v] = -1
				}
				l.Join(v, tenantOf[v])
				continue
			}
			h, _ := l.Head()
			order = append(order, h)
			l.Leave(h)
		}
		if len(order) != next {
			t.Fatalf("seed %d: %d heads for %d requests", seed, len(order), next)
		}
		pos := map[int]int{}
		for k, v := range order {
			pos[v] = k
		}
		for v := range next {
			perTenant := map[string]int{}
			alone := true // none of its tenant's in line but the head
			for _, u := range joinedBefore[v] {
				if tenantOf[u] == tenantOf[v] {
					if pos[u] > pos[v] {
						t.Fatalf("seed %d: %d (%s) came before %d of its tenant that joined earlier", seed, v, tenantOf[v], u)
					}
					alone = alone && u == headAt[v]
					continue
				}
				if u != headAt[v] && pos[u] < pos[v] {
					perTenant[tenantOf[u]]++
				}
			}
			for tn, n := range perTenant {
				if alone && n > 2 {
					t.Fatalf("seed %d: %d (%s) waited for %d requests of %s that joined before it, besides the head", seed, v, tenantOf[v], n, tn)
				}
			}
		}
	}
}

func TestWaitedOut(t *testing.T) {
	se := BehindShed("m")
	out := WaitedOut(se, 5*time.Second)
	if out.Err.Status != http.StatusTooManyRequests || out.Err.Type != kvroute.TypeOverloaded {
		t.Errorf("status %d type %q, want 429 overloaded", out.Err.Status, out.Err.Type)
	}
	want := `model "m" is overloaded: requests held before this one were still waiting for room; still overloaded after the request waited 5s in the router's queue (retry.queue_wait)`
	if out.Error() != want {
		t.Errorf("error %q\nwant  %q", out.Error(), want)
	}
	if se.Err.Message == out.Err.Message {
		t.Error("WaitedOut changed the shed it was given")
	}
}
