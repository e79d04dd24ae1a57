package disagg

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
)

// liveDoer is a Doer that counts its legs in flight: from Do until Do
// fails or the response body is closed.
type liveDoer struct {
	c    *http.Client
	live atomic.Int32
}

func (d *liveDoer) Do(req *http.Request) (*http.Response, error) {
	d.live.Add(1)
	resp, err := d.c.Do(req)
	if err != nil {
		d.live.Add(-1)
		return nil, err
	}
	resp.Body = &inflightBody{ReadCloser: resp.Body, done: func() { d.live.Add(-1) }}
	return resp, nil
}

// pendingPicker is the prefill policy of the probe: first healthy, and it
// keeps the IDs of the requests placed until the router releases them.
type pendingPicker struct {
	mu      sync.Mutex
	pending map[string]int
}

func (p *pendingPicker) Pick(_ time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, c := range cands {
		if c.Healthy {
			p.pending[req.ID]++
			return kvroute.Chose("probe", cands, i, "first healthy")
		}
	}
	return kvroute.None("probe", "none")
}

func (p *pendingPicker) Release(_ time.Time, req *kvroute.Request, _ string) {
	p.mu.Lock()
	delete(p.pending, req.ID)
	p.mu.Unlock()
}

func (p *pendingPicker) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}

// TestPDServeEndsItsLegs: when Serve returns, no leg of the request is
// in flight and the routing core holds nothing under its ID (its flights
// are done), whether the client went away or the decode engine answered
// while the prefill leg (SGLang's, concurrent) was still running. The
// caller (the proxy) then releases the request's routing ID for reuse.
func TestPDServeEndsItsLegs(t *testing.T) {
	for _, tc := range []struct {
		name, proto string
		clientGone  bool // else the decode engine answers while the prefill leg runs
	}{
		{"nixl, client gone in the prefill leg", ProtocolNixl, true},
		{"sglang, client gone in both legs", ProtocolSGLang, true},
		{"sglang, decode answers before the prefill leg ends", ProtocolSGLang, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefillArrived := make(chan struct{})
			decodeArrived := make(chan struct{})
			decodeAnswered := make(chan struct{})
			release := make(chan struct{}) // ends the prefill leg
			ps := fake(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body) // then a closed connection cancels r
				close(prefillArrived)
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"id":"p","choices":[{"index":0,"text":"","finish_reason":"length"}],"kv_transfer_params":{"remote_engine_id":"p"}}`)
			})
			ds := fake(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				close(decodeArrived)
				if tc.clientGone {
					<-r.Context().Done()
					return
				}
				select { // as SGLang's decode engine waits for the KV
				case <-prefillArrived:
				case <-r.Context().Done():
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"id":"d","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
				w.(http.Flusher).Flush()
				close(decodeAnswered)
			})
			pp := &pendingPicker{pending: map[string]int{}}
			pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1, Prefill: pp,
				Conditional: Conditional{ShortTokens: -1, LocalISL: -1}})
			if err != nil {
				t.Fatal(err)
			}
			r, err := router.New(router.Config{Model: "tiny", Policy: "pd", Picker: pl, Endpoints: []kvroute.Endpoint{
				endpoint("p", ps.URL, kvroute.RolePrefill), endpoint("d", ds.URL, kvroute.RoleDecode)}})
			if err != nil {
				t.Fatal(err)
			}
			doer := &liveDoer{c: &http.Client{}}
			h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: doer, Protocol: tc.proto})
			if err != nil {
				t.Fatal(err)
			}
			body := completion(false, 2)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(body))
			ri, err := openai.ParseRequest(openai.KindCompletion, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			kr := &kvroute.Request{ID: "req-1", Model: ri.Model, Prompt: ri.Prompt, PromptTokens: ri.PromptTokens(), MaxTokens: ri.MaxTokens}
			type ended struct {
				res          Result
				live, placed int
			}
			done := make(chan ended, 1)
			go func() {
				res := h.Serve(httptest.NewRecorder(), req, "/v1/completions", []byte(body), kr)
				done <- ended{res, int(doer.live.Load()), pp.count()}
			}()
			wait := func(what string, ch <-chan struct{}) {
				t.Helper()
				select {
				case <-ch:
				case <-time.After(10 * time.Second): // a hang guard
					t.Fatalf("timed out waiting for %s", what)
				}
			}
			wait("the prefill leg", prefillArrived)
			if tc.proto == ProtocolSGLang {
				wait("the decode leg", decodeArrived)
			}
			if tc.clientGone {
				cancel()
			} else {
				wait("the decode engine's answer", decodeAnswered)
				close(release)
			}
			var e ended
			select {
			case e = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("timed out waiting for Serve to return")
			}
			want := http.StatusOK
			if tc.clientGone {
				want = StatusClientClosed
			}
			if e.res.Status != want {
				t.Errorf("status: got %d (%v), want %d", e.res.Status, e.res.Err, want)
			}
			if e.live != 0 {
				t.Errorf("legs in flight when Serve returned: got %d, want 0", e.live)
			}
			if e.placed != 0 {
				t.Errorf("requests the prefill policy still held when Serve returned: got %d, want 0", e.placed)
			}
		})
	}
}
