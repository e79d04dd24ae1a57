package disagg

import (
	"math"
	"os"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
)

func mustProfile(t testing.TB, name string) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKVBytes checks bytes per token against papers.md 4.2, worked by hand:
// 8B: 32 layers x 8 KV heads x 128 x 2 x 2 B = 131,072 B; 70B: 80 x 8 x 128
// x 2 x 2 = 327,680 B; Qwen2.5-7B: 28 x 4 x 128 x 2 x 2 = 57,344 B;
// DeepSeek-V3 (MLA): 61 x (512 + 64) x 2 B = 70,272 B.
func TestKVBytes(t *testing.T) {
	for _, tc := range []struct {
		file string
		want int64
	}{
		{"llama-3.1-8b.json", 131072},
		{"qwen2.5-7b.json", 57344},
		{"deepseek-v3.json", 70272},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile("testdata/hf/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			s, err := ShapeFromHFConfig(b, "bfloat16")
			if err != nil {
				t.Fatal(err)
			}
			if got := s.BytesPerToken(); got != tc.want {
				t.Errorf("got %d bytes/token (%+v), want %d", got, s, tc.want)
			}
		})
	}
	if got := ShapeOf(mustProfile(t, "llama-3.1-70b-h100-tp4")).BytesPerToken(); got != 327680 {
		t.Errorf("70B: got %d bytes/token, want 327680", got)
	}
	if _, err := ShapeFromHFConfig([]byte(`{"num_hidden_layers":"x"}`), ""); err == nil {
		t.Error("bad config: got no error")
	}
}

// TestTransferTimes works papers.md 4.6's table by hand: 8B at 8k tokens is
// 8192 x 131,072 = 1,073,741,824 B; at 400 Gb/s (50 GB/s) that is 21.47 ms,
// at 100 Gb/s (12.5 GB/s) 85.90 ms, at NVLink's 450 GB/s 2.39 ms. 70B at
// 8k is 2,684,354,560 B: 53.69 ms at 400G.
func TestTransferTimes(t *testing.T) {
	b8 := ShapeOf(mustProfile(t, "llama-3.1-8b-h100")).Bytes(8192)
	b70 := ShapeOf(mustProfile(t, "llama-3.1-70b-h100-tp4")).Bytes(8192)
	if b8 != 1073741824 || b70 != 2684354560 {
		t.Fatalf("got %d and %d bytes, want 1073741824 and 2684354560", b8, b70)
	}
	for _, tc := range []struct {
		name  string
		link  Link
		bytes int64
		want  time.Duration
	}{
		{"8b-rdma400", Link{Gbps: 400}, b8, 21474837 * time.Nanosecond},
		{"8b-tcp100", Link{Gbps: 100}, b8, 85899346 * time.Nanosecond},
		{"8b-nvlink", Link{Gbps: NVLinkGbps}, b8, 2386093 * time.Nanosecond},
		{"70b-rdma400", Link{Gbps: 400}, b70, 53687092 * time.Nanosecond},
		{"8b-rdma400-setup-eff", Link{Gbps: 400, Efficiency: 0.8, Setup: time.Millisecond}, b8, time.Millisecond + 26843546*time.Nanosecond},
		{"nothing", Link{Gbps: 400, Setup: time.Millisecond}, 0, 0},
	} {
		if got := tc.link.Duration(tc.bytes); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func ep(id string, role kvroute.Role, labels ...string) *kvroute.Endpoint {
	e := &kvroute.Endpoint{ID: id, URL: "http://" + id, Role: role, Labels: map[string]string{}}
	for i := 0; i+1 < len(labels); i += 2 {
		e.Labels[labels[i]] = labels[i+1]
	}
	return e
}

func TestLinksBetween(t *testing.T) {
	ls := DefaultLinks()
	a := ep("a", kvroute.RolePrefill, "node", "n1", "rack", "r1", "zone", "z1")
	for _, tc := range []struct {
		b    *kvroute.Endpoint
		want string
	}{
		{ep("b", kvroute.RoleDecode, "node", "n1", "rack", "r1"), "nvlink"},
		{ep("c", kvroute.RoleDecode, "node", "n2", "rack", "r1"), "rdma"},
		{ep("d", kvroute.RoleDecode, "node", "n3", "rack", "r2", "zone", "z1"), "rdma"},
		{ep("e", kvroute.RoleDecode, "node", "n4", "zone", "z2"), "tcp"},
		{ep("f", kvroute.RoleDecode), "tcp"},
	} {
		if got := ls.Between(a, tc.b).Name; got != tc.want {
			t.Errorf("a -> %s: got %s, want %s", tc.b.ID, got, tc.want)
		}
	}
	bad := Links{Rules: []LinkRule{{Same: nil, Link: Link{Gbps: 1}}}, Default: Link{Gbps: 1}}
	if err := bad.Validate(); err == nil {
		t.Error("rule without labels: got no error")
	}
	if err := (Links{Default: Link{Gbps: 0}}).Validate(); err == nil {
		t.Error("zero default gbps: got no error")
	}
	if err := (Links{Default: Link{Gbps: 100, Efficiency: math.NaN()}}).Validate(); err == nil {
		t.Error("NaN efficiency accepted")
	}
	if err := DefaultLinks().Validate(); err != nil {
		t.Errorf("default links: %v", err)
	}
}

// TestFabricCongestion works the queueing by hand on a 400 Gb/s fabric with
// no setup: one 8k-token 8B handoff (1.0737 GB) takes 21.47 ms; a second one
// into the same decode node, ready at the same time, waits for the first:
// 42.95 ms; a third from another prefill node to another decode node is
// independent: 21.47 ms. Halfway through the first transfer half of its
// bytes remain, so a handoff planned then into the same node waits 10.74 ms.
func TestFabricCongestion(t *testing.T) {
	f := NewFabric(UniformLinks(Link{Name: "rdma", Gbps: 400}))
	t0 := time.Unix(1000, 0)
	p1, p2, p3 := ep("p1", kvroute.RolePrefill), ep("p2", kvroute.RolePrefill), ep("p3", kvroute.RolePrefill)
	d1, d2 := ep("d1", kvroute.RoleDecode), ep("d2", kvroute.RoleDecode)
	const gb = 1073741824
	wire := 21474837 * time.Nanosecond
	t1, e1 := f.Reserve(t0, t0, p1, d1, gb)
	if e1.Total() != wire || e1.Queue != 0 {
		t.Fatalf("first: got %+v, want %v and no queue", e1, wire)
	}
	if e := f.Estimate(t0, t0, p2, d1, gb); e.Queue != wire || e.Total() != 2*wire {
		t.Errorf("second into d1: got queue %v total %v, want %v and %v", e.Queue, e.Total(), wire, 2*wire)
	}
	if e := f.Estimate(t0, t0, p1, d2, gb); e.Queue != wire {
		t.Errorf("second out of p1: got queue %v, want %v (the sender's port is shared)", e.Queue, wire)
	}
	if e := f.Estimate(t0, t0, p3, d2, gb); e.Queue != 0 || e.Total() != wire {
		t.Errorf("disjoint pair: got %+v, want no queue", e)
	}
	half := t0.Add(wire / 2)
	if e := f.Estimate(half, half, p2, d1, gb); e.Queue < wire/2-time.Microsecond || e.Queue > wire/2+time.Microsecond {
		t.Errorf("halfway: got queue %v, want about %v", e.Queue, wire/2)
	}
	// A transfer ready later than the first's end meets no queue.
	if e := f.Estimate(t0, t0.Add(wire), p2, d1, gb); e.Queue != 0 {
		t.Errorf("after the first ends: got queue %v, want 0", e.Queue)
	}
	if n, b := f.InFlight(t0); n != 1 || b != gb {
		t.Errorf("in flight: got %d, %v bytes, want 1, %d", n, b, gb)
	}
	f.Release(t1)
	f.Release(t1)
	if e := f.Estimate(t0, t0, p2, d1, gb); e.Queue != 0 {
		t.Errorf("after release: got queue %v, want 0", e.Queue)
	}
	// Expired transfers leave the books on their own.
	f.Reserve(t0, t0, p1, d1, gb)
	if n, _ := f.InFlight(t0.Add(time.Second)); n != 0 {
		t.Errorf("after the planned end: got %d in flight, want 0", n)
	}
	// Same endpoint: no transfer.
	if tk, e := f.Reserve(t0, t0, p1, p1, gb); tk != 0 || e.Total() != 0 {
		t.Errorf("self transfer: got %v %+v", tk, e)
	}
}

// TestLinkDurationSaturates: a transfer too long for a time.Duration (a
// crawling link) saturates at the longest one instead of wrapping negative.
func TestLinkDurationSaturates(t *testing.T) {
	l := Link{Name: "crawl", Gbps: 1e-12, Setup: time.Millisecond}
	if got := l.Duration(1e12); got != time.Duration(math.MaxInt64) {
		t.Fatalf("1 TB over a 1e-12 Gbps link: got %v, want the longest duration", got)
	}
	if got := (Link{Gbps: 8}).Duration(1e9); got != time.Second {
		t.Fatalf("1 GB over 8 Gbps: got %v, want 1s", got)
	}
}
