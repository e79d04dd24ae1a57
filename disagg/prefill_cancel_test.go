package disagg

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// TestPrefillReplyClientLeft: a client that leaves while the router reads
// a prefill engine's reply ends the leg as "cancelled", not as the
// engine's transport failure: it is not reported to passive health (which
// would eject a healthy engine whose clients hang up), as a client leaving
// before the reply's headers is not.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestPrefillReplyClientLeft(t *testing.T) {
	for _, proto := range []string{ProtocolNixl, ProtocolSGLang} {
		t.Run(proto, func(t *testing.T) {
			started := make(chan struct{})
			p := fake(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusOK)
				_, _ = w.Write([]byte(`{"id":"cmpl-1",`))
				w.(http.Flusher).Flush()
				<-r.Context().Done() // the rest of the reply never comes
			})
			_, port := hostPort(t, p.URL)
			d := emu(t, kvroute.RoleDecode, proto)
			f := newPD(t, proto, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill, LabelBootstrapPort, strconv.Itoa(port)),
				endpoint("d", d.URL, kvroute.RoleDecode))
			// The client leaves once the router has the prefill reply's
			// headers, while it reads the body.
			f.h.cfg.Client = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err == nil && r.URL.Host == strings.TrimPrefix(p.URL, "http://") {
					close(started)
				}
				return resp, err
			})}
			body := completion(false, 4)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/completions", strings.NewReader(body))
			kr := &kvroute.Request{ID: "client-left", Model: "tiny", Prompt: prompt, PromptTokens: 30, MaxTokens: 4, Arrival: time.Now()}
			done := make(chan Result, 1)
			go func() { done <- f.h.Serve(httptest.NewRecorder(), req, "/v1/completions", []byte(body), kr) }()
			select {
			case <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("the prefill leg was not sent")
			}
			cancel()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("Serve did not return after the client left")
			}
			if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "prefill", "transport"); got != 0 {
				t.Errorf("prefill failures (transport): got %v, want 0 (the client left)", got)
			}
			if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "prefill", "cancelled"); got != 1 {
				t.Errorf("prefill failures (cancelled): got %v, want 1", got)
			}
			checkBooks(t, f)
		})
	}
}
