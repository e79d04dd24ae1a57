package sim

import (
	"bytes"
	"encoding/csv"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// capPicker places a request on the endpoint with the fewest flights, and
// sheds it with the "queue" action (as kv-aware's overload: queue does)
// while every endpoint holds limit flights or more. It records the
// requests it placed, in order, and the most flights it saw on an endpoint
// it chose.
type capPicker struct {
	limit  int
	placed []string
	most   int
}

func (p *capPicker) Pick(_ time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	best := -1
	for i, c := range cands {
		if c.Healthy && c.Load.InFlight < p.limit && (best < 0 || c.Load.InFlight < cands[best].Load.InFlight) {
			best = i
		}
	}
	if best < 0 {
		d := kvroute.None("cap", policy.OverloadQueue+": every endpoint holds its limit")
		d.Shed = true
		return d
	}
	p.placed = append(p.placed, req.ID)
	p.most = max(p.most, cands[best].Load.InFlight+1)
	return kvroute.Chose("cap", cands, best, "fewest flights")
}

// TestHoldQueue: requests the policy sheds with the "queue" action wait in
// the router's line, in arrival order, and are routed as flights end, so
// that no endpoint ever holds more than the policy allows; their TTFT
// counts the wait (Record.Held).
func TestHoldQueue(t *testing.T) {
	reqs := smallChat(t, 120, 60, 3)
	p := &capPicker{limit: 2}
	res := mustRun(t, Config{Fleet: tinyFleet(2), Picker: p, Policy: "cap", QueueWait: time.Minute}, reqs)
	held := 0
	for _, r := range res.Records {
		if r.Status != http.StatusOK {
			t.Fatalf("%s: status %d (%s), want every request served", r.ID, r.Status, r.Error)
		}
		if r.Held > 0 {
			held++
		}
		if sum := r.Held + r.Network + r.Queue + r.Prefill + r.FirstDecode; sum != r.TTFT {
			t.Errorf("%s: TTFT %v != held %v + network %v + queue %v + prefill %v + first step %v", r.ID, r.TTFT,
				r.Held, r.Network, r.Queue, r.Prefill, r.FirstDecode)
		}
	}
	// Room frees only when a flight ends: a held request routes when one
	// does (the router's Drained ends its head's pause), not at the end of
	// a pause that outlasts it.
	ends := map[time.Duration]bool{}
	for _, r := range res.Records {
		ends[r.Arrival+r.E2E] = true
	}
	for _, r := range res.Records {
		if r.Held > 0 && !ends[r.Arrival+r.Held] {
			t.Errorf("%s: routed %v after its arrival, at no flight's end", r.ID, r.Held)
		}
	}
	if held < len(reqs)/4 {
		t.Errorf("%d of %d requests held, want the fleet's limit to hold many", held, len(reqs))
	}
	if p.most > p.limit {
		t.Errorf("an endpoint was given its %d-th flight, past the limit %d", p.most, p.limit)
	}
	// One tenant: first come, first served (the workload's arrivals are in
	// order).
	for i, id := range p.placed {
		if id != reqs[i].ID {
			t.Fatalf("placement %d is %s, want %s (arrival order)", i, id, reqs[i].ID)
		}
	}
	if b := res.TTFTBreakdown(); b.Held <= 0 {
		t.Errorf("breakdown %+v, want a mean hold", b)
	}
	// requests.csv carries each request's hold.
	var buf bytes.Buffer
	if err := WriteRecordsCSV(&buf, []string{"cap"}, []*Result{res}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := slices.Index(rows[0], "held_ms")
	for k, r := range res.Records {
		if want := strconv.FormatFloat(float64(r.Held)/1e6, 'f', 3, 64); col < 0 || rows[k+1][col] != want {
			t.Fatalf("requests.csv: %s's held_ms (column %d) is not %s: %v", r.ID, col, want, rows[k+1])
		}
	}

	// The same run with no wait: the queue sheds are 429s at once.
	p = &capPicker{limit: 2}
	res = mustRun(t, Config{Fleet: tinyFleet(2), Picker: p, Policy: "cap", QueueWait: -1}, reqs)
	shed := 0
	for _, r := range res.Records {
		switch {
		case r.Status == http.StatusTooManyRequests:
			shed++
		case r.Held != 0:
			t.Errorf("%s: held %v with no wait", r.ID, r.Held)
		}
	}
	if shed == 0 || len(p.placed) != len(reqs)-shed {
		t.Errorf("%d shed and %d placed of %d, want sheds and the rest placed", shed, len(p.placed), len(reqs))
	}
}

// TestHoldQueueTimesOut: a request still held when its wait runs out is
// answered 429, saying how long it waited; one that arrived behind it
// says that others were held before it.
func TestHoldQueueTimesOut(t *testing.T) {
	reqs := smallChat(t, 20, 1000, 5)
	p := &capPicker{limit: 0} // never any room
	res := mustRun(t, Config{Fleet: tinyFleet(1), Picker: p, Policy: "cap", QueueWait: 50 * time.Millisecond}, reqs)
	for i, r := range res.Records {
		if r.Status != http.StatusTooManyRequests || r.Engine != "" {
			t.Fatalf("%s: status %d on %q, want 429 unrouted", r.ID, r.Status, r.Engine)
		}
		if !strings.Contains(r.Error, "waited 50ms in the router's queue") {
			t.Errorf("%s: error %q, want the wait", r.ID, r.Error)
		}
		if i == 0 && !strings.Contains(r.Error, "every endpoint is over its load cap") {
			t.Errorf("first request: error %q, want the policy's shed", r.Error)
		}
	}
	if len(p.placed) != 0 {
		t.Errorf("placed %v with no room", p.placed)
	}
}
