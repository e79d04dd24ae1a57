package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/signals"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// pickFirstHealthy picks the healthy candidate with the most cached blocks,
// then the fewest in flight, then the lowest index: simple enough to work
// results out by hand.
type pickFirstHealthy struct {
	observed, released int
}

func (p *pickFirstHealthy) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	best := -1
	for i, c := range cands {
		if !c.Healthy {
			continue
		}
		if best < 0 || c.CachedBlocks > cands[best].CachedBlocks ||
			(c.CachedBlocks == cands[best].CachedBlocks && c.Load.InFlight < cands[best].Load.InFlight) {
			best = i
		}
	}
	if best < 0 {
		return kvroute.None("test", "none healthy")
	}
	d := kvroute.Chose("test", cands, best, "test")
	d.Scores = make([]kvroute.Score, len(cands))
	for i, c := range cands {
		d.Scores[i] = kvroute.Score{Endpoint: c.Endpoint.ID, Eligible: c.Healthy, Value: float64(c.CachedBlocks),
			Parts: []kvroute.Part{{Name: "cached_blocks", Value: float64(c.CachedBlocks)}}}
	}
	return d
}

func (p *pickFirstHealthy) Observe(time.Time, kvroute.Outcome)          { p.observed++ }
func (p *pickFirstHealthy) Release(time.Time, *kvroute.Request, string) { p.released++ }
func (p *pickFirstHealthy) String() string                              { return "pickFirstHealthy" }
func eps(n int) []kvroute.Endpoint {
	out := make([]kvroute.Endpoint, n)
	for i := range out {
		out[i] = kvroute.Endpoint{ID: fmt.Sprintf("e%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i)}
	}
	return out
}

func newTestRouter(t *testing.T, n int, p kvroute.Picker) *Router {
	t.Helper()
	r, err := New(Config{Model: "m", Endpoints: eps(n), Policy: "test", Picker: p})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewValidates(t *testing.T) {
	p := &pickFirstHealthy{}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no picker", Config{Model: "m", Endpoints: eps(1)}, "picker is required"},
		{"no endpoints", Config{Model: "m", Picker: p}, "has no endpoints"},
		{"duplicate", Config{Model: "m", Picker: p, Endpoints: []kvroute.Endpoint{{ID: "a"}, {ID: "a"}}}, `duplicate id "a"`},
		{"empty id", Config{Model: "m", Picker: p, Endpoints: []kvroute.Endpoint{{}}}, "id or url is required"},
		{"negative weight", Config{Model: "m", Picker: p, Endpoints: []kvroute.Endpoint{{ID: "a", Weight: -2}}},
			`endpoints[0] ("a"): weight -2 is not in 1..1000000`},
		{"weight too large", Config{Model: "m", Picker: p, Endpoints: []kvroute.Endpoint{{ID: "a"}, {ID: "b", Weight: kvroute.MaxWeight + 1}}},
			`endpoints[1] ("b"): weight 1000001 is not in 1..1000000`},
		{"chars per token NaN", Config{Model: "m", Picker: p, Endpoints: eps(1), CharsPerToken: math.NaN()}, "chars per token NaN is not a finite number"},
		{"chars per token +Inf", Config{Model: "m", Picker: p, Endpoints: eps(1), CharsPerToken: math.Inf(1)}, "chars per token +Inf is not a finite number"},
		{"chars per token -Inf", Config{Model: "m", Picker: p, Endpoints: eps(1), CharsPerToken: math.Inf(-1)}, "chars per token -Inf is not a finite number"},
		{"chars per token tiny", Config{Model: "m", Picker: p, Endpoints: eps(1), CharsPerToken: 1e-300}, "of at least 0.01"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: got %v, want error containing %q", err, tt.want)
			}
		})
	}
}

// TestNewCharsPerToken: CharsPerToken 0 or negative is the default, the
// minimum and ordinary values are accepted.
func TestNewCharsPerToken(t *testing.T) {
	for _, cpt := range []float64{0, -1, MinCharsPerToken, 3.5} {
		if _, err := New(Config{Model: "m", Picker: &pickFirstHealthy{}, CharsPerToken: cpt, Endpoints: eps(2)}); err != nil {
			t.Fatalf("CharsPerToken %v: %v", cpt, err)
		}
	}
}

// TestNewWeights: a weight of 0 is the default 1 and the largest weight is
// accepted; SetEndpoints refuses a negative weight as New does, changing
// nothing.
func TestNewWeights(t *testing.T) {
	r, err := New(Config{Model: "m", Picker: &pickFirstHealthy{},
		Endpoints: []kvroute.Endpoint{{ID: "a"}, {ID: "b", Weight: kvroute.MaxWeight}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Endpoints(); got[0].Weight != 1 || got[1].Weight != kvroute.MaxWeight {
		t.Errorf("weights: got %d, %d, want 1, %d", got[0].Weight, got[1].Weight, kvroute.MaxWeight)
	}
	r = newTestRouter(t, 2, &pickFirstHealthy{})
	bad := eps(2)
	bad[1].Weight = -1
	if err := r.SetEndpoints(t0, bad, nil); err == nil || !strings.Contains(err.Error(), `endpoints[1] ("e1"): weight -1`) {
		t.Fatalf("SetEndpoints with weight -1: got %v, want an error naming it", err)
	}
	if got := r.Endpoints(); len(got) != 2 || got[1].Weight != 1 {
		t.Errorf("after the refused SetEndpoints: %+v, want the pool unchanged", got)
	}
}

func TestInFlightAccounting(t *testing.T) {
	p := &pickFirstHealthy{}
	r := newTestRouter(t, 2, p)
	req := &kvroute.Request{ID: "a", Model: "m", PromptTokens: 100}
	f1, err := r.Route(t0, req, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.View(f1.Endpoint.ID).Load(t0).InFlight; got != 1 {
		t.Fatalf("in flight after Route: got %d, want 1", got)
	}
	// The second request goes to the other endpoint: fewer in flight.
	f2, err := r.Route(t0, &kvroute.Request{ID: "b", Model: "m", PromptTokens: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f2.Endpoint.ID == f1.Endpoint.ID {
		t.Fatalf("second request: got %s again, want the idle endpoint", f2.Endpoint.ID)
	}
	r.FirstToken(t0, f1)
	r.Done(t0, f1, kvroute.Outcome{TTFT: time.Millisecond})
	r.Done(t0, f1, kvroute.Outcome{}) // idempotent
	if got := r.View(f1.Endpoint.ID).Load(t0).InFlight; got != 0 {
		t.Fatalf("in flight after Done: got %d, want 0", got)
	}
	if p.observed != 1 || p.released != 1 {
		t.Fatalf("learner/releaser calls: got %d/%d, want 1/1", p.observed, p.released)
	}
}

func TestExcludeNeverPicked(t *testing.T) {
	r := newTestRouter(t, 3, &pickFirstHealthy{})
	for i := 0; i < 20; i++ {
		f, err := r.Route(t0, &kvroute.Request{ID: "x", Model: "m"}, []string{"e0", "e2"})
		if err != nil {
			t.Fatal(err)
		}
		if f.Endpoint.ID != "e1" {
			t.Fatalf("got %s, want e1 (e0 and e2 excluded)", f.Endpoint.ID)
		}
	}
	_, err := r.Route(t0, &kvroute.Request{ID: "x", Model: "m"}, []string{"e0", "e1", "e2"})
	var ue *UnavailableError
	if !errors.As(err, &ue) || kvroute.StatusOf(err) != http.StatusServiceUnavailable || ue.RetryAfter < 1 {
		t.Fatalf("all excluded: got %v, want 503 UnavailableError with RetryAfter >= 1", err)
	}
}

func TestPassiveEjectionAndBackoff(t *testing.T) {
	r, err := New(Config{Model: "m", Endpoints: eps(2), Picker: &pickFirstHealthy{},
		Health: HealthConfig{FailThreshold: 2, BaseEjection: time.Second, MaxEjection: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	if r.ReportResult(now, "e0", false) {
		t.Fatal("ejected after one failure, want threshold 2")
	}
	if !r.ReportResult(now, "e0", false) {
		t.Fatal("not ejected after two failures")
	}
	for i := 0; i < 5; i++ {
		f, err := r.Route(now.Add(500*time.Millisecond), &kvroute.Request{Model: "m"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if f.Endpoint.ID != "e1" {
			t.Fatalf("ejected endpoint picked: got %s", f.Endpoint.ID)
		}
		r.Done(now, f, kvroute.Outcome{})
	}
	st := r.Status(now.Add(500 * time.Millisecond))
	if st[0].Healthy || st[0].EjectedUntil.IsZero() || st[0].Ejections != 1 {
		t.Fatalf("status of ejected endpoint: got %+v", st[0])
	}
	// Back after BaseEjection; the next ejection doubles, then caps at MaxEjection.
	now = now.Add(time.Second)
	if !r.Status(now)[0].Healthy {
		t.Fatal("endpoint not back after the ejection")
	}
	wants := []time.Duration{2 * time.Second, 3 * time.Second, 3 * time.Second}
	for i, want := range wants {
		r.ReportResult(now, "e0", false)
		if !r.ReportResult(now, "e0", false) {
			t.Fatalf("ejection %d did not happen", i+2)
		}
		if got := r.Status(now)[0].EjectedUntil.Sub(now); got != want {
			t.Fatalf("ejection %d length: got %v, want %v", i+2, got, want)
		}
		now = now.Add(want)
	}
	// A success resets the back-off.
	r.ReportResult(now, "e0", true)
	r.ReportResult(now, "e0", false)
	r.ReportResult(now, "e0", false)
	if got := r.Status(now)[0].EjectedUntil.Sub(now); got != time.Second {
		t.Fatalf("ejection after success: got %v, want back-off reset to 1s", got)
	}
}

// TestEjectionBackoffNoOverflow: the back-off doubles up to MaxEjection
// and stays there, even for a base ejection so long that doubling it 20
// times wraps an int64: 2^44+2^30 ns (about 4.9h) shifted by 20 wrapped to
// 2^50 ns (13 days), shorter than the 1000h cap the ejections before it had.
func TestEjectionBackoffNoOverflow(t *testing.T) {
	base, limit := time.Duration(1<<44+1<<30), 1000*time.Hour
	r, err := New(Config{Model: "m", Endpoints: eps(2), Picker: &pickFirstHealthy{},
		Health: HealthConfig{FailThreshold: 1, BaseEjection: base, MaxEjection: limit}})
	if err != nil {
		t.Fatal(err)
	}
	now, want := t0, base
	for i := range 24 {
		if !r.ReportResult(now, "e0", false) {
			t.Fatalf("ejection %d did not happen", i+1)
		}
		got := r.Status(now)[0].EjectedUntil.Sub(now)
		if got != want {
			t.Fatalf("ejection %d length: got %v, want %v", i+1, got, want)
		}
		now = now.Add(got)
		want = min(2*want, limit)
	}
}

func TestActiveHealth(t *testing.T) {
	r := newTestRouter(t, 2, &pickFirstHealthy{})
	r.SetActiveHealth(t0, "e0", false)
	r.SetActiveHealth(t0, "e1", false)
	if _, err := r.Route(t0, &kvroute.Request{Model: "m"}, nil); kvroute.StatusOf(err) != http.StatusServiceUnavailable {
		t.Fatalf("all failing active checks: got %v, want 503", err)
	}
	r.SetActiveHealth(t0, "e1", true)
	f, err := r.Route(t0, &kvroute.Request{Model: "m"}, nil)
	if err != nil || f.Endpoint.ID != "e1" {
		t.Fatalf("after e1 recovers: got %v %v, want e1", f, err)
	}
}

func TestShedIs429(t *testing.T) {
	shed := kvroute.PickerFunc(func(time.Time, *kvroute.Request, []kvroute.Candidate) kvroute.Decision {
		d := kvroute.None("shedder", "all capped")
		d.Shed = true
		return d
	})
	r := newTestRouter(t, 2, shed)
	_, err := r.Route(t0, &kvroute.Request{Model: "m"}, nil)
	if kvroute.StatusOf(err) != http.StatusTooManyRequests || !strings.Contains(err.Error(), "all capped") {
		t.Fatalf("got %v, want 429 naming the reason", err)
	}
	var se *ShedError
	if !errors.As(err, &se) || !se.Decision.Shed || se.Decision.Reason != "all capped" {
		t.Fatalf("got %#v, want a *ShedError carrying the decision", err)
	}
}

func TestIneligibleChoiceRejected(t *testing.T) {
	bad := kvroute.PickerFunc(func(_ time.Time, _ *kvroute.Request, c []kvroute.Candidate) kvroute.Decision {
		return kvroute.Chose("bad", c, 0, "always the first")
	})
	r := newTestRouter(t, 2, bad)
	r.SetActiveHealth(t0, "e0", false)
	if _, err := r.Route(t0, &kvroute.Request{Model: "m"}, nil); kvroute.StatusOf(err) != http.StatusInternalServerError {
		t.Fatalf("picker chose an unhealthy endpoint: got %v, want a 500 error", err)
	}
}

func TestApproximatePrefixAffinity(t *testing.T) {
	r := newTestRouter(t, 4, &pickFirstHealthy{})
	shared := strings.Repeat("You are a helpful assistant. ", 40) // 1160 chars: 9 blocks of 128
	first := &kvroute.Request{ID: "1", Model: "m", Prompt: shared + "question one", PromptTokens: 300}
	f1, err := r.Route(t0, first, nil)
	if err != nil {
		t.Fatal(err)
	}
	if first.BlockHashes != nil {
		t.Fatal("Route left its scratch hashes on the request")
	}
	r.Done(t0, f1, kvroute.Outcome{})
	second := &kvroute.Request{ID: "2", Model: "m", Prompt: shared + "another question", PromptTokens: 300}
	f2, err := r.Route(t0.Add(time.Second), second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f2.Endpoint.ID != f1.Endpoint.ID {
		t.Fatalf("prefix affinity: got %s, want %s", f2.Endpoint.ID, f1.Endpoint.ID)
	}
	recs := r.Decisions(1)
	if len(recs) != 1 || recs[0].RequestID != "2" {
		t.Fatalf("Decisions(1): got %+v", recs)
	}
	var cached int
	for _, c := range recs[0].Candidates {
		if c.Endpoint == f1.Endpoint.ID {
			cached = c.CachedBlocks
		} else if c.CachedBlocks != 0 {
			t.Fatalf("candidate %s reports %d cached blocks, want 0", c.Endpoint, c.CachedBlocks)
		}
	}
	if want := len(shared) / 128; cached != want {
		t.Fatalf("cached blocks on %s: got %d, want %d", f1.Endpoint.ID, cached, want)
	}
	// Expired: after the TTL nothing is cached.
	r.Route(t0.Add(11*time.Minute), &kvroute.Request{ID: "3", Model: "m", Prompt: shared, PromptTokens: 300}, nil)
	for _, c := range r.Decisions(1)[0].Candidates {
		if c.CachedBlocks != 0 {
			t.Fatalf("after TTL: %s reports %d cached blocks", c.Endpoint, c.CachedBlocks)
		}
	}
}

// TestRecycledPromptStorage: the proxy parses each prompt into a
// recycled buffer (openai.ParseRequestInto) and req.Prompt aliases it, so
// once a request is done its prompt's bytes may become the next
// request's. The router keeps the last prompt to reuse the hashes of the
// blocks the next one shares with it: it must keep its own copy, or it
// would find the next prompt "shared" with itself and give it the last
// one's hashes (here: all 9 blocks cached on an endpoint that holds none
// of them).
func TestRecycledPromptStorage(t *testing.T) {
	r := newTestRouter(t, 2, &pickFirstHealthy{})
	a := strings.Repeat("You are a helpful assistant. ", 40)
	b := strings.Repeat("Tell me about the big city. ", 42)[:len(a)]
	buf := []byte(a)
	f1, err := r.Route(t0, &kvroute.Request{ID: "1", Model: "m", Prompt: unsafe.String(&buf[0], len(buf)), PromptTokens: 300}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Done(t0, f1, kvroute.Outcome{})
	copy(buf, b) // the buffer recycled for the next request
	f2, err := r.Route(t0.Add(time.Second), &kvroute.Request{ID: "2", Model: "m", Prompt: unsafe.String(&buf[0], len(buf)), PromptTokens: 300}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := f2.CachedTokens(); got != 0 {
		t.Fatalf("a prompt sharing nothing with the last one, in its recycled storage: %d tokens cached, want 0", got)
	}
}

func TestDecisionLogIsACopy(t *testing.T) {
	r, err := New(Config{Model: "m", Endpoints: eps(2), Picker: &pickFirstHealthy{}, DecisionLog: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if _, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i), Model: "m"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	recs := r.Decisions(10)
	if len(recs) != 3 || recs[0].RequestID != "4" || recs[2].RequestID != "2" {
		t.Fatalf("ring of 3 after 5 decisions: got %d records starting %q", len(recs), recs[0].RequestID)
	}
	if len(recs[0].Decision.Scores) != 2 || recs[0].Decision.Scores[0].Parts[0].Name != "cached_blocks" {
		t.Fatalf("explanation not kept: %+v", recs[0].Decision)
	}
	recs[0].Candidates[0].Endpoint = "mutated"
	if r.Decisions(1)[0].Candidates[0].Endpoint == "mutated" {
		t.Fatal("Decisions returned the log's own storage")
	}
}

func BenchmarkRoute64Endpoints32KiB(b *testing.B) {
	r, err := New(Config{Model: "m", Endpoints: eps(64), Picker: &pickFirstHealthy{}, DecisionLog: 256})
	if err != nil {
		b.Fatal(err)
	}
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 32*1024/44)
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := &kvroute.Request{Model: "m", Prompt: prompt, PromptTokens: 8000}
		f, err := r.Route(now, req, nil)
		if err != nil {
			b.Fatal(err)
		}
		r.Done(now, f, kvroute.Outcome{})
	}
}

// firstTokenPicker records FirstToken calls (router.FirstTokenObserver).
type firstTokenPicker struct {
	pickFirstHealthy
	first []string // request ID @ endpoint
}

func (p *firstTokenPicker) FirstToken(_ time.Time, req *kvroute.Request, endpoint string) {
	p.first = append(p.first, req.ID+"@"+endpoint)
}

func TestFirstTokenObserver(t *testing.T) {
	p := &firstTokenPicker{}
	r := newTestRouter(t, 2, p)
	f1, err := r.Route(t0, &kvroute.Request{ID: "a", Model: "m", PromptTokens: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := r.Route(t0, &kvroute.Request{ID: "b", Model: "m", PromptTokens: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.FirstToken(t0, f1)
	r.FirstToken(t0, f1) // once per flight
	r.Done(t0, f1, kvroute.Outcome{TTFT: time.Millisecond})
	r.Done(t0, f2, kvroute.Outcome{Failed: true})
	r.FirstToken(t0, f2) // after Done: the request is over, nothing to report
	r.FirstToken(t0, nil)
	want := []string{"a@" + f1.Endpoint.ID}
	if fmt.Sprint(p.first) != fmt.Sprint(want) {
		t.Errorf("FirstToken calls: got %v, want %v", p.first, want)
	}
}

// TestDecisionLogCandidates checks every field of the logged candidates
// against the candidates the picker saw: fresh, stale and never observed
// signals, an ejected endpoint, a cached prefix.
func TestDecisionLogCandidates(t *testing.T) {
	p := &recordingPicker{}
	r, err := New(Config{Model: "m", Endpoints: eps(4), Picker: p, StaleAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.View("e0").Observe(t0, signals.Metrics{Have: signals.HasWaiting | signals.HasRunning | signals.HasKVUsage, Waiting: 3, Running: 5, KVUsage: 0.25})
	r.View("e1").Observe(t0.Add(-3*time.Second), signals.Metrics{Have: signals.HasWaiting | signals.HasRunning, Waiting: 1, Running: 2})
	for range 3 {
		r.ReportResult(t0, "e3", false)
	}
	prompt := strings.Repeat("a shared prefix of some length. ", 20)
	if _, err := r.Route(t0, &kvroute.Request{ID: "a", Model: "m", Prompt: prompt, PromptTokens: 160}, nil); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(250 * time.Millisecond)
	if _, err := r.Route(now, &kvroute.Request{ID: "b", Model: "m", Prompt: prompt + "more", PromptTokens: 161}, nil); err != nil {
		t.Fatal(err)
	}
	got := r.Decisions(1)[0].Candidates
	if len(got) != len(p.last) {
		t.Fatalf("logged %d candidates, want %d", len(got), len(p.last))
	}
	for i := range p.last {
		c := &p.last[i]
		want := CandidateInput{
			Endpoint: c.Endpoint.ID, Healthy: c.Healthy,
			Waiting: c.Load.Waiting, Running: c.Load.Running, InFlight: c.Load.InFlight, KVUsage: c.Load.KVUsage,
			CachedBlocks: c.CachedBlocks, CachedTokens: c.CachedTokens, Tier: c.Tier.String(), Precise: c.Precise,
			Stale: c.Load.Stale,
		}
		// The age, nil when never observed, compared apart (a pointer).
		g := got[i]
		switch age := float64(c.Load.Age(now)) / float64(time.Millisecond); {
		case c.Load.ObservedAt.IsZero() && g.SignalAgeMS != nil:
			t.Errorf("candidate %d: signal age %v, want nil (never observed)", i, *g.SignalAgeMS)
		case !c.Load.ObservedAt.IsZero() && (g.SignalAgeMS == nil || *g.SignalAgeMS != age):
			t.Errorf("candidate %d: signal age %v, want %v", i, g.SignalAgeMS, age)
		}
		g.SignalAgeMS = nil
		if g != want {
			t.Errorf("candidate %d: got %+v, want %+v", i, g, want)
		}
	}
	// The inputs are not all zero: the test would not notice a field left out.
	if g := got[0]; g.Waiting == 0 || g.Running == 0 || g.KVUsage == 0 || g.SignalAgeMS == nil || *g.SignalAgeMS != 250 || g.CachedBlocks == 0 || g.Tier != "gpu" {
		t.Errorf("candidate 0: got %+v, want observed signals and a cached prefix", g)
	}
	if !got[1].Stale || got[3].Healthy || !got[2].Stale || got[2].SignalAgeMS != nil {
		t.Errorf("got %+v, %+v and %+v, want e1 stale, e2 stale and never observed, e3 ejected", got[1], got[2], got[3])
	}
}

// TestDecisionLogNeverScraped: a candidate whose signals were never
// observed has no signal age: /debug/decisions renders it null, not 0,
// which read as just scraped beside its stale mark.
func TestDecisionLogNeverScraped(t *testing.T) {
	r, err := New(Config{Model: "m", Endpoints: eps(2), Picker: &pickFirstHealthy{}, StaleAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.View("e0").Observe(t0, signals.Metrics{Have: signals.HasWaiting, Waiting: 1})
	if _, err := r.Route(t0.Add(250*time.Millisecond), &kvroute.Request{ID: "a", Model: "m", Prompt: "p", PromptTokens: 1}, nil); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(r.Decisions(1)[0].Candidates)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"e0": 250.0, "e1": nil}
	for _, c := range got {
		age, ok := c["signal_age_ms"]
		if w := want[c["endpoint"].(string)]; !ok || age != w {
			t.Errorf("%v: signal_age_ms %v (present %v), want %v", c["endpoint"], age, ok, w)
		}
	}
	if len(got) != 2 || got[1]["stale"] != true {
		t.Errorf("got %s, want e1 stale", b)
	}
}

// TestEndpointOf checks the endpoint lookup of index hits: the router's own
// ID strings (the cache's case), equal strings with other backing arrays,
// and unknown names.
func TestEndpointOf(t *testing.T) {
	r, err := New(Config{Model: "m", Endpoints: eps(100), Picker: &pickFirstHealthy{}})
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		for i, e := range r.eps {
			ids := []string{e.ep.ID, strings.Clone(e.ep.ID), fmt.Sprintf("e%d", i)}
			for _, id := range ids {
				if got := r.endpointOf(id); got != e {
					t.Fatalf("round %d: endpointOf(%q) = %v, want endpoint %d", round, id, got, i)
				}
			}
		}
		for _, id := range []string{"", "e100", "nope"} {
			if got := r.endpointOf(id); got != nil {
				t.Fatalf("endpointOf(%q) = %v, want nil", id, got.ep.ID)
			}
		}
	}
}

// recyclingPicker picks the first healthy candidate and explains each
// decision with its sequence number, in buffers it reuses and trades with
// the decision log (ScoreRecycler).
type recyclingPicker struct {
	n      int
	scores []kvroute.Score
	parts  []kvroute.Part
	traded int
}

func (p *recyclingPicker) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	p.n++
	if cap(p.scores) < len(cands) {
		p.scores = make([]kvroute.Score, len(cands))
	}
	if cap(p.parts) < 2*len(cands) {
		p.parts = make([]kvroute.Part, 2*len(cands))
	}
	p.scores, p.parts = p.scores[:len(cands)], p.parts[:2*len(cands)]
	for i := range cands {
		p.parts[2*i] = kvroute.Part{Name: "n", Value: float64(p.n)}
		p.parts[2*i+1] = kvroute.Part{Name: "i", Value: float64(i)}
		p.scores[i] = kvroute.Score{Endpoint: cands[i].Endpoint.ID, Value: float64(p.n), Eligible: true, Parts: p.parts[2*i : 2*i+2 : 2*i+2]}
	}
	return kvroute.Decision{Index: 0, Endpoint: cands[0].Endpoint.ID, Reason: "first", Scores: p.scores}
}

func (p *recyclingPicker) RecycleScores(s []kvroute.Score, parts []kvroute.Part) ([]kvroute.Score, []kvroute.Part) {
	p.traded++
	old, oldParts := p.scores, p.parts
	p.scores, p.parts = s, parts
	return old, oldParts
}

// TestDecisionLogRecycles checks that a picker's explanation buffers taken
// over by the log keep every logged decision's explanation intact while
// the picker reuses the buffers the log gave back.
func TestDecisionLogRecycles(t *testing.T) {
	p := &recyclingPicker{}
	r, err := New(Config{Model: "m", Endpoints: eps(3), Picker: p, DecisionLog: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 11 {
		if _, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i + 1), Model: "m"}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if p.traded != 11 {
		t.Fatalf("RecycleScores called %d times, want 11", p.traded)
	}
	recs := r.Decisions(10)
	if len(recs) != 4 {
		t.Fatalf("got %d records, want 4", len(recs))
	}
	for j, rec := range recs {
		n := float64(11 - j)
		if rec.RequestID != fmt.Sprint(11-j) || len(rec.Decision.Scores) != 3 {
			t.Fatalf("record %d: got request %q with %d scores, want %d with 3", j, rec.RequestID, len(rec.Decision.Scores), 11-j)
		}
		for i, sc := range rec.Decision.Scores {
			want := []kvroute.Part{{Name: "n", Value: n}, {Name: "i", Value: float64(i)}}
			if sc.Value != n || sc.Endpoint != fmt.Sprintf("e%d", i) || !slices.Equal(sc.Parts, want) {
				t.Fatalf("record %d score %d: got %+v, want value %v, parts %v", j, i, sc, n, want)
			}
		}
	}
}

// TestRouteAllocs: at steady state a decision of the default policy, with
// the decision log on and its first token and end recorded, allocates one
// thing, the Flight Route returns: the signal views, the prefix index,
// kv-aware's Pick (its reason and scores are deferred to the log) and the
// log reuse their storage. An allocation under the router's lock can be
// made to help the GC mark while every other request waits. The loops
// are BenchmarkDecisionKVAware64's.
func TestRouteAllocs(t *testing.T) {
	for _, tc := range []struct{ sessions, inflight int }{{16, 0}, {256, 128}} {
		t.Run(fmt.Sprintf("sessions=%d/inflight=%d", tc.sessions, tc.inflight), func(t *testing.T) {
			step := decisionLoop(t, tc.sessions, tc.inflight)
			for range 3000 { // until the structures stop growing
				step(nil)
			}
			if n := testing.AllocsPerRun(500, func() { step(nil) }); n != 1 {
				t.Fatalf("a decision allocated %v times, want 1 (its Flight)", n)
			}
		})
	}
}

// TestRouteEvicts: a candidate Evicts when the router's record of its
// cache (capacity from DefaultCapacityTokens: 256 tokens = 8 blocks of 128
// characters) has no room left for the prompt blocks it does not hold, and
// its Horizon is then the age of the record's least recent entry; the
// decision log shows both.
func TestRouteEvicts(t *testing.T) {
	r, err := New(Config{Model: "m", Endpoints: eps(2), Policy: "test", Picker: &pickFirstHealthy{}, DefaultCapacityTokens: 256, DecisionLog: 8})
	if err != nil {
		t.Fatal(err)
	}
	prompt := func(i int) string { return strings.Repeat(fmt.Sprintf("prompt %d. ", i), 60)[:512] } // 4 blocks
	for i, want := range []bool{false, false, true, true} {
		// A second apart: when e0 is full, its least recent entry (the
		// prompt before last) is 2s old.
		now := t0.Add(time.Duration(i) * time.Second)
		f, err := r.Route(now, &kvroute.Request{ID: fmt.Sprint(i), Model: "m", Prompt: prompt(i % 3), PromptTokens: 128}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(now, f, kvroute.Outcome{})
		c := r.Decisions(1)[0].Candidates
		wantHorizon := 0.0
		if want {
			wantHorizon = 2000
		}
		if c[0].Evicts != want || c[1].Evicts || c[0].HorizonMS != wantHorizon || c[1].HorizonMS != 0 {
			t.Errorf("request %d (e0 holds %d blocks before it): Evicts %v, %v, horizon %v, %v ms; want %v, false, %v, 0",
				i, 4*min(i, 2), c[0].Evicts, c[1].Evicts, c[0].HorizonMS, c[1].HorizonMS, want, wantHorizon)
		}
	}
	// The same prompt again: e0 holds all of it, nothing to record.
	now := t0.Add(4 * time.Second)
	f, err := r.Route(now, &kvroute.Request{ID: "again", Model: "m", Prompt: prompt(2), PromptTokens: 128}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.Done(now, f, kvroute.Outcome{})
	if c := r.Decisions(1)[0].Candidates; c[0].Evicts || c[0].CachedBlocks != 4 {
		t.Errorf("a prompt e0 holds: Evicts %v with %d blocks cached, want false with 4", c[0].Evicts, c[0].CachedBlocks)
	}
}

// TestRouteEvictsPrecise: an endpoint with KV events Evicts as one without
// does, from the blocks the router's dispatches wrote there (capacity 128
// tokens = 8 blocks of 16): those the engine's prefix match (and the gap
// index's) did not cover. A prompt the gap index has let go with no event
// to say the engine holds it is written again. ForgetDispatches forgets
// the writes.
func TestRouteEvictsPrecise(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 16})
	r, err := New(Config{Model: "m", Endpoints: eps(2), Policy: "test", Picker: &pickFirstHealthy{}, DefaultCapacityTokens: 128,
		Precise: idx, PreciseEndpoints: []string{"e0", "e1"}, EventGap: 1500 * time.Millisecond, DecisionLog: 8})
	if err != nil {
		t.Fatal(err)
	}
	hashes := func(i int) []uint64 {
		return []uint64{uint64(10*i + 1), uint64(10*i + 2), uint64(10*i + 3), uint64(10*i + 4)}
	}
	route := func(i int, at time.Duration) []CandidateInput {
		t.Helper()
		now := t0.Add(at)
		req := &kvroute.Request{ID: fmt.Sprint(i), Model: "m", PromptTokens: 64, BlockSize: 16, BlockHashes: hashes(i)}
		f, err := r.Route(now, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(now, f, kvroute.Outcome{})
		return r.Decisions(1)[0].Candidates
	}
	for i, want := range []bool{false, false, true, true} {
		c := route(i, time.Duration(i)*time.Second) // to e0, a second apart
		wantHorizon := 0.0
		if want {
			wantHorizon = 2000 // the record's least recent prompt, 2s old
		}
		if c[0].Evicts != want || c[1].Evicts || c[0].HorizonMS != wantHorizon || c[0].CachedBlocks != 0 {
			t.Errorf("prompt %d (e0's record holds %d blocks before it): Evicts %v, %v, horizon %v ms, %d blocks cached; want %v, false, %v, 0",
				i, 4*min(i, 2), c[0].Evicts, c[1].Evicts, c[0].HorizonMS, c[0].CachedBlocks, want, wantHorizon)
		}
	}
	// Prompt 3 again, 0.5s after it was routed: the gap index claims it.
	if c := route(3, 3500*time.Millisecond); c[0].CachedBlocks != 4 || c[0].Evicts {
		t.Errorf("prompt 3 within the event gap: %d blocks cached, Evicts %v; want 4, false", c[0].CachedBlocks, c[0].Evicts)
	}
	// Prompt 3 once the gap has passed: the engine has not said it holds
	// it, so nothing is claimed, and its blocks are written again: they
	// push out the least recent write (prompt 2's, at 2s).
	if c := route(3, 6*time.Second); c[0].CachedBlocks != 0 || !c[0].Evicts || c[0].HorizonMS != 4000 {
		t.Errorf("prompt 3 after the event gap: %d blocks cached, Evicts %v, horizon %v ms; want 0 (no event, no claim), true, 4000",
			c[0].CachedBlocks, c[0].Evicts, c[0].HorizonMS)
	}
	r.ForgetDispatches("e0")
	if c := route(4, 7*time.Second); c[0].Evicts {
		t.Errorf("after ForgetDispatches(e0): Evicts, want the writes forgotten")
	}
}

// TestSessionsLeaveThrashingHolder is BenchmarkDecisionKVAware64's
// sessions=64 regime: 64 sessions of 8k-token prompts (32 KiB) behind one
// shared 1k-token system prompt, over 64 endpoints whose caches hold 16
// sessions each. Without kv-aware's spare_full every session follows the
// system prompt to its one holder, which thrashes: each turn finds only
// the system prompt cached. With it, after a warm-up, every turn finds its
// whole prompt cached.
func TestSessionsLeaveThrashingHolder(t *testing.T) {
	for _, spare := range []bool{true, false} {
		r, step := decisionLoopWith(t, 64, 0, 0, map[string]any{"spare_full": spare})
		for range 3000 {
			step(nil)
		}
		whole := 0
		ds := r.Decisions(256)
		for _, d := range ds {
			for _, c := range d.Candidates {
				if c.Endpoint == d.Decision.Endpoint && c.CachedTokens == 8192 {
					whole++
				}
			}
		}
		if spare && whole != len(ds) {
			t.Errorf("spare_full: %d of the last %d turns found their whole prompt cached, want all", whole, len(ds))
		}
		if !spare && whole != 0 {
			t.Errorf("without spare_full: %d of the last %d turns found their whole prompt cached, want none (the regime thrashes)", whole, len(ds))
		}
	}
}

// TestForgetDispatches: a prompt routed to an endpoint that publishes KV
// events counts there (the gap index) until its events come; when the
// engine's history is reset (ForgetDispatches), it no longer does.
func TestForgetDispatches(t *testing.T) {
	idx := kvindex.NewIndex(kvindex.IndexConfig{BlockSize: 16})
	r, err := New(Config{Model: "m", Endpoints: eps(2), Policy: "test", Picker: &pickFirstHealthy{},
		Precise: idx, PreciseEndpoints: []string{"e0", "e1"}, DecisionLog: 8})
	if err != nil {
		t.Fatal(err)
	}
	hashes := []uint64{11, 12, 13, 14}
	route := func() []CandidateInput {
		t.Helper()
		req := &kvroute.Request{ID: "r", Model: "m", PromptTokens: 64, BlockSize: 16, BlockHashes: hashes}
		f, err := r.Route(t0, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(t0, f, kvroute.Outcome{})
		return r.Decisions(1)[0].Candidates
	}
	route() // to e0 (no cache anywhere: the first)
	if c := route(); c[0].CachedBlocks != 4 || c[1].CachedBlocks != 0 {
		t.Fatalf("routed once: cached blocks %d, %d; want 4 on e0 (the gap index), 0 on e1", c[0].CachedBlocks, c[1].CachedBlocks)
	}
	r.ForgetDispatches("e0")
	if c := route(); c[0].CachedBlocks != 0 {
		t.Fatalf("after ForgetDispatches(e0): e0 claims %d blocks, want 0", c[0].CachedBlocks)
	}
}

// TestStatusLoadIsTheRoutingView: EndpointStatus.Load is the load the
// router decides from, whose KV capacity falls back to the endpoint's
// configured one when its metrics do not give it (proxy's
// kvroute_endpoint_kv_capacity_tokens: "block size x GPU blocks, or
// config"); Status read the view alone and said 0.
func TestStatusLoadIsTheRoutingView(t *testing.T) {
	list := eps(2)
	list[0].KVCapacityTokens = 50_000
	var seen []int
	pick := kvroute.PickerFunc(func(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
		for _, c := range cands {
			seen = append(seen, c.Load.KVCapacityTokens)
		}
		return kvroute.Chose("test", cands, 0, "test")
	})
	r, err := New(Config{Model: "m", Endpoints: list, Picker: pick})
	if err != nil {
		t.Fatal(err)
	}
	f, err := r.Route(t0, &kvroute.Request{ID: "a", Prompt: "hello"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Done(t0, f, kvroute.Outcome{})
	st := r.Status(t0)
	for i := range st {
		if got, want := st[i].Load.KVCapacityTokens, seen[i]; got != want {
			t.Errorf("%s: Status's KV capacity %d, want %d as routing saw it", st[i].ID, got, want)
		}
	}
	if got := st[0].Load.KVCapacityTokens; got != 50_000 {
		t.Errorf("e0: Status's KV capacity %d, want the configured 50000", got)
	}
}

// TestDrainedSignals: Drained is signalled whenever a request held for
// room may fit now: a flight's first token and end, an endpoint added, a
// rank present again, and an endpoint passing its active health checks
// again (SetActiveHealth(true) was not signalled, so a held request
// waited out the proxy queue's pause for an endpoint that was back).
// Nothing else signals it.
func TestDrainedSignals(t *testing.T) {
	r := newTestRouter(t, 2, &pickFirstHealthy{})
	drained := func() bool {
		select {
		case <-r.Drained():
			return true
		default:
			return false
		}
	}
	f, err := r.Route(t0, &kvroute.Request{ID: "a", Model: "m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	drained() // empty the channel
	steps := []struct {
		name string
		do   func()
		want bool
	}{
		{"first token", func() { r.FirstToken(t0, f) }, true},
		{"done", func() { r.Done(t0, f, kvroute.Outcome{}) }, true},
		{"active health fails", func() { r.SetActiveHealth(t0, "e1", false) }, false},
		{"active health fails again", func() { r.SetActiveHealth(t0, "e1", false) }, false},
		{"active health passes", func() { r.SetActiveHealth(t0, "e1", true) }, true},
		{"active health passes again", func() { r.SetActiveHealth(t0, "e1", true) }, false},
		{"absent", func() { r.SetAbsent(t0, "e1", true) }, false},
		{"present", func() { r.SetAbsent(t0, "e1", false) }, true},
		{"endpoint added", func() {
			if err := r.SetEndpoints(t0, eps(3), nil); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"endpoint removed", func() {
			if err := r.SetEndpoints(t0, eps(2), nil); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, s := range steps {
		s.do()
		if got := drained(); got != s.want {
			t.Errorf("%s: Drained signalled %v, want %v", s.name, got, s.want)
		}
	}
}

// TestApproxCapacityMixedUnits: with a tokenizer (precise mode) a prompt
// that cannot be tokenized is routed on character blocks. Its block unit
// (128 characters, 32 tokens) must not resize the approximate index
// sized in token blocks (16 tokens): each such request halved every
// endpoint's capacity in blocks and trimmed the token-block prompts down
// to it (the 80-block prompt here kept 49 blocks), until the next token
// request grew it back with the entries gone.
func TestApproxCapacityMixedUnits(t *testing.T) {
	r, err := New(Config{Model: "m", Endpoints: []kvroute.Endpoint{{ID: "a", KVCapacityTokens: 16 * 100}}, Picker: &pickFirstHealthy{}})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, 16*80)
	for i := range toks {
		toks[i] = uint32(i)
	}
	h := kvindex.HashTokens(toks, 16, nil)
	route := func(req *kvroute.Request) *Flight {
		t.Helper()
		f, err := r.Route(t0, req, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(t0, f, kvroute.Outcome{})
		return f
	}
	tokens := func(id string) *kvroute.Request {
		return &kvroute.Request{ID: id, PromptTokens: len(toks), BlockSize: 16, BlockHashes: h}
	}
	route(tokens("1"))
	if got := route(tokens("2")).CachedTokens(); got != len(toks) {
		t.Fatalf("the token prompt again: got %d tokens cached, want %d", got, len(toks))
	}
	for i := range 3 {
		route(&kvroute.Request{ID: fmt.Sprint("c", i), Prompt: strings.Repeat(fmt.Sprint(i), 300), PromptTokens: 75})
	}
	if got := route(tokens("3")).CachedTokens(); got != len(toks) {
		t.Errorf("the token prompt after character-block prompts: got %d tokens cached, want %d", got, len(toks))
	}
}
