package disagg

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

// plansLeft returns how many plans the planner holds untaken.
func (p *Planner) plansLeft() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.plans)
}

// TestPDBooksBalance: whatever happens to a request's legs, when Serve
// returns the router holds no flight of it on any endpoint, the planner
// no pin and no untaken plan, and the prefill policy nothing under its ID.
func TestPDBooksBalance(t *testing.T) {
	const kvReply = `{"id":"p","object":"text_completion","choices":[{"index":0,"text":"","finish_reason":"length"}],"kv_transfer_params":{"remote_engine_id":"p","remote_block_ids":[1]}}`
	prefills := map[string]http.HandlerFunc{
		"ok": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, kvReply)
		},
		"500": status500,
		"400": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`)
		},
		"no params": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"p","choices":[]}`)
		},
	}
	decodes := map[string]http.HandlerFunc{
		"ok": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"d","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}]}`)
		},
		"500":    status500,
		"broken": brokenBody(t),
		"reset": func(w http.ResponseWriter, r *http.Request) { // before its first body byte
			_, _ = io.Copy(io.Discard, r.Body)
			headersThenReset(t, w, "application/json", "")
		},
		"hang": func(w http.ResponseWriter, r *http.Request) { // the client leaves meanwhile
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		},
		"dead": nil,
	}
	for _, proto := range []string{ProtocolNixl, ProtocolSGLang} {
		for pname, ph := range prefills {
			for dname, dh := range decodes {
				t.Run(proto+"/prefill "+pname+"/decode "+dname, func(t *testing.T) {
					ps := fake(t, ph)
					var du string
					if dh == nil {
						dead := httptest.NewServer(http.NotFoundHandler())
						du = dead.URL
						dead.Close()
					} else {
						du = fake(t, dh).URL
					}
					pp := &pendingPicker{pending: map[string]int{}}
					pl, err := NewPlanner(Config{Profile: mustProfile(t, "tiny"), Mode: ModeAlways, Seed: 1, Prefill: pp,
						Conditional: Conditional{ShortTokens: -1, LocalISL: -1}})
					if err != nil {
						t.Fatal(err)
					}
					r, err := newBooksRouter(pl, endpoint("p", ps.URL, kvroute.RolePrefill), endpoint("d", du, kvroute.RoleDecode))
					if err != nil {
						t.Fatal(err)
					}
					h, err := NewHandoff(HandoffConfig{Router: r, Planner: pl, Client: &http.Client{}, Protocol: proto})
					if err != nil {
						t.Fatal(err)
					}
					body := completion(false, 2)
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					if dname == "hang" {
						go func() { // the client leaves once the decode leg is in
							for ctx.Err() == nil {
								if st := r.Status(time.Now()); st[1].Load.InFlight > 0 {
									cancel()
									return
								}
								time.Sleep(time.Millisecond)
							}
						}()
					}
					req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(body))
					kr := &kvroute.Request{ID: "books", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 2, Arrival: time.Now()}
					done := make(chan Result, 1)
					go func() { done <- h.Serve(httptest.NewRecorder(), req, "/v1/completions", []byte(body), kr) }()
					var res Result
					select {
					case res = <-done:
					case <-time.After(20 * time.Second): // a hang guard
						t.Fatal("Serve did not return")
					}
					for _, st := range r.Status(time.Now()) {
						if st.Load.InFlight != 0 {
							t.Errorf("after %d (%v): endpoint %s has %d flights in the router, want 0", res.Status, res.Err, st.ID, st.Load.InFlight)
						}
					}
					if n := pl.pinsLeft(); n != 0 {
						t.Errorf("after %d: %d pins left, want 0", res.Status, n)
					}
					if n := pl.plansLeft(); n != 0 {
						t.Errorf("after %d: %d plans left, want 0", res.Status, n)
					}
					if n := pp.count(); n != 0 {
						t.Errorf("after %d: the prefill policy holds %d requests, want 0", res.Status, n)
					}
				})
			}
		}
	}
}

func newBooksRouter(pl *Planner, eps ...kvroute.Endpoint) (*router.Router, error) {
	return router.New(router.Config{Model: "tiny", Policy: "pd", Picker: pl, Endpoints: eps})
}
