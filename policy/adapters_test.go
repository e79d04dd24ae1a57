package policy

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestAdapterDemand: a count decays with AdapterDemandTau, per adapter,
// and its rate is per second.
func TestAdapterDemand(t *testing.T) {
	var d AdapterDemand
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if r := d.Rate(t0, "a"); r != 0 {
		t.Fatalf("rate of an adapter never seen: %v, want 0", r)
	}
	for i := range 30 {
		d.Seen(t0.Add(time.Duration(i)*time.Millisecond), "a")
	}
	d.Seen(t0, "b")
	at := t0.Add(29 * time.Millisecond)
	if r, want := d.Rate(at, "a"), 30/AdapterDemandTau.Seconds(); math.Abs(r-want) > 0.001*want {
		t.Errorf("rate of 30 requests just now: %v, want about %v", r, want)
	}
	later := at.Add(AdapterDemandTau)
	if r, want := d.Rate(later, "a"), 30/math.E/AdapterDemandTau.Seconds(); math.Abs(r-want) > 0.001*want {
		t.Errorf("rate one time constant later: %v, want %v", r, want)
	}
	if r, want := d.Rate(t0, "b"), 1/AdapterDemandTau.Seconds(); r != want {
		t.Errorf("rate of b: %v, want %v", r, want)
	}
}

// TestSlotBusyPeriod works the M/G/inf busy period by hand: requests of
// 2 s at 0.5/s leave the batch empty after (e^1 - 1) / 0.5 = 3.44 s; at
// 5/s after (e^10 - 1) / 5 = 4405 s, bounded to 100 decodes (200 s);
// with no arrivals counted, one decode.
func TestSlotBusyPeriod(t *testing.T) {
	for _, tc := range []struct {
		lambda float64
		d      time.Duration
		want   float64 // seconds
	}{
		{0.5, 2 * time.Second, math.Expm1(1) / 0.5},
		{5, 2 * time.Second, 200},
		{0, 2 * time.Second, 2},
		{1e-9, 2 * time.Second, 2},
		{3, 0, 0},
	} {
		if got := SlotBusyPeriod(tc.lambda, tc.d).Seconds(); math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("SlotBusyPeriod(%v, %v) = %vs, want %vs", tc.lambda, tc.d, got, tc.want)
		}
	}
}

// TestAdapterUses: an endpoint holds the last slots adapters placed there
// within hold, most recent first, each once; the list keeps 8 per
// endpoint and is per endpoint.
func TestAdapterUses(t *testing.T) {
	var u AdapterUses
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	u.Note(at(0), "e", "a")
	u.Note(at(100), "e", "b")
	u.Note(at(200), "e", "a") // a again: moved to the front, once
	u.Note(at(300), "f", "c")
	for _, tc := range []struct {
		now   int
		slots int
		hold  time.Duration
		want  []string
	}{
		{300, 4, time.Second, []string{"a", "b"}},
		{300, 1, time.Second, []string{"a"}},
		{1150, 4, time.Second, []string{"a"}}, // b's placement is over a second old
		{1250, 4, time.Second, nil},
	} {
		if got := slices.Collect(u.Held(at(tc.now), "e", tc.slots, tc.hold)); !slices.Equal(got, tc.want) {
			t.Errorf("Held at %d ms, %d slots: %v, want %v", tc.now, tc.slots, got, tc.want)
		}
	}
	for i := range 10 {
		u.Note(at(400+i), "e", string(rune('p'+i)))
	}
	if got := slices.Collect(u.Held(at(500), "e", 100, time.Hour)); len(got) != 8 || got[0] != "y" {
		t.Errorf("after 10 more: %v, want the last 8, most recent (y) first", got)
	}
	u.Forget("e")
	if got := slices.Collect(u.Held(at(500), "e", 100, time.Hour)); got != nil {
		t.Errorf("after Forget: %v", got)
	}
	if got := slices.Collect(u.Held(at(500), "f", 100, time.Hour)); !slices.Equal(got, []string{"c"}) {
		t.Errorf("f: %v, want [c]", got)
	}
}

// TestLoRANamesAt: a candidate position's LoRA signals are interned: the
// same names give the same strings whatever strings carry them, and a
// LoRALoad its caller reuses, its names changed in place, gives its new
// names (the interned names are kept by the names, not by the LoRALoad).
func TestLoRANamesAt(t *testing.T) {
	k := &KVAware{}
	l := &kvroute.LoRALoad{Running: []string{"a", "b"}, Waiting: []string{"c"}, Max: 2}
	run, wait := k.loraNamesAt(3, l)
	if !slices.Equal(run, []string{"a", "b"}) || !slices.Equal(wait, []string{"c"}) {
		t.Fatalf("names: %v %v, want [a b] [c]", run, wait)
	}
	// The same names in other strings: the same interned strings.
	other := &kvroute.LoRALoad{Running: []string{strings.Clone("a"), strings.Clone("b")}, Waiting: []string{strings.Clone("c")}}
	run2, wait2 := k.loraNamesAt(3, other)
	for j := range run {
		if !sameAdapter(run[j], run2[j]) {
			t.Errorf("running %d: %q and %q are not the same string", j, run[j], run2[j])
		}
	}
	if !sameAdapter(wait[0], wait2[0]) {
		t.Errorf("waiting: %q and %q are not the same string", wait[0], wait2[0])
	}
	// Interned at another position, and for a request: the same strings.
	if r, _ := k.loraNamesAt(0, other); !sameAdapter(r[1], run[1]) || !sameAdapter(k.intern(strings.Clone("b")), run[1]) {
		t.Errorf("b interned apart")
	}
	// The LoRALoad reused, its names changed in place.
	l.Running[1], l.Waiting = "d", l.Waiting[:0]
	run, wait = k.loraNamesAt(3, l)
	if !slices.Equal(run, []string{"a", "d"}) || len(wait) != 0 {
		t.Errorf("names after the LoRALoad changed: %v %v, want [a d] []", run, wait)
	}
	if sameAdapter("x", strings.Clone("x")) {
		t.Errorf("sameAdapter: two copies of x are the same string")
	}
	if !sameAdapter("", strings.Clone("")) {
		t.Errorf("sameAdapter: two empty strings differ")
	}
}
