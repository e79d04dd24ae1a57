package disagg

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/router"
)

// learningPicker is a prefill policy that picks the first healthy
// candidate and records the outcomes it is taught from.
type learningPicker struct {
	mu  sync.Mutex
	got []kvroute.Outcome
}

func (l *learningPicker) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	for i, c := range cands {
		if c.Healthy {
			return kvroute.Chose("learn", cands, i, "first healthy")
		}
	}
	return kvroute.None("learn", "none")
}

func (l *learningPicker) Observe(_ time.Time, o kvroute.Outcome) {
	l.mu.Lock()
	l.got = append(l.got, o)
	l.mu.Unlock()
}

// TestPlannerTeachesPrefillPolicyPrefillLegsOnly: the router reports every
// flight's outcome to its picker (Router.Done -> Learner), the decode leg's
// included, whose TTFT is the KV pull and a decode step; the Planner passes
// on only the prefill leg's (kv-aware with learn: true learned a "prefill
// rate" from the decode engine's TTFT, which dragged its fleet-wide rate
// towards its lower clamp).
func TestPlannerTeachesPrefillPolicyPrefillLegsOnly(t *testing.T) {
	lp := &learningPicker{}
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1, Prefill: lp,
		Conditional: Conditional{ShortTokens: -1, LocalISL: -1}})
	if err != nil {
		t.Fatal(err)
	}
	p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
	d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
	r, err := router.New(router.Config{Model: "tiny", Policy: "pd", Picker: pl, Endpoints: []kvroute.Endpoint{
		endpoint("p", p.URL, kvroute.RolePrefill), endpoint("d", d.URL, kvroute.RoleDecode)}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: &http.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	body := completion(true, 4)
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
	kr := &kvroute.Request{ID: "learn", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 4, Stream: true, Arrival: time.Now()}
	if res := h.Serve(httptest.NewRecorder(), req, "/v1/completions", []byte(body), kr); res.Status != http.StatusOK || !res.Disaggregated {
		t.Fatalf("got %+v, want a disaggregated 200", res)
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if len(lp.got) != 1 {
		t.Errorf("the prefill policy was taught %d outcomes, want 1 (the prefill leg's): %+v", len(lp.got), lp.got)
	}
	for _, o := range lp.got {
		if o.Endpoint != "p" {
			t.Errorf("the prefill policy was taught %+v, the outcome of the decode leg on %s", o, o.Endpoint)
		}
	}
}

// TestStreamErrorEventTeachesNothing: a request run whole on one node whose
// stream opens with an error event in a 200 (an error the engine met after
// its answer started) reaches the client as it is, and its outcome is a
// failure, which no policy learns a prefill rate from: its first bytes came
// at once and are no first token. A stream with tokens first is a success.
func TestStreamErrorEventTeachesNothing(t *testing.T) {
	const refusal = `data: {"error": {"object": "error", "message": "not loaded", "type": "BadRequestError", "param": null, "code": 400}}` +
		"\n\ndata: [DONE]\n\n"
	const tokens = `data: {"choices":[{"index":0,"text":"a"}]}` + "\n\ndata: [DONE]\n\n"
	var answer atomic.Value
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(answer.Load().(string)))
	}))
	defer be.Close()
	lp := &learningPicker{}
	pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeNever, Seed: 1, Prefill: lp})
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.Config{Model: "tiny", Policy: "pd", Picker: pl, Endpoints: []kvroute.Endpoint{
		endpoint("b", be.URL, kvroute.RoleBoth)}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: &http.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{refusal, tokens} {
		answer.Store(want)
		body := completion(true, 4)
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		kr := &kvroute.Request{ID: "e", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 4, Stream: true, Arrival: time.Now()}
		rec := httptest.NewRecorder()
		if res := h.Serve(rec, req, "/v1/completions", []byte(body), kr); res.Status != http.StatusOK || rec.Body.String() != want {
			t.Fatalf("got %+v and %q, want a 200 passing on %q", res, rec.Body.String(), want)
		}
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if len(lp.got) != 2 || !lp.got[0].Failed || lp.got[1].Failed {
		t.Errorf("outcomes %+v, want a failure (the error event) then a success", lp.got)
	}
}
