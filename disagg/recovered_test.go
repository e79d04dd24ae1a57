package disagg

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/openai"
)

// TestRecoveredLegLeavesNoError: a request whose first decode leg fails
// (a 500) and whose next placement answers it in full has succeeded: its
// Result says 200 and carries no error (the proxy logs Result.Err with the
// request), while the failed leg is still counted as one. Before, Err
// kept the failure the retry recovered from.
func TestRecoveredLegLeavesNoError(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			p := emu(t, kvroute.RolePrefill, emulator.PDNixl)
			d := emu(t, kvroute.RoleDecode, emulator.PDNixl)
			du, _ := url.Parse(d.URL)
			var legs atomic.Int32
			failFirst := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if legs.Add(1) == 1 {
					status500(w, r)
					return
				}
				httputil.NewSingleHostReverseProxy(du).ServeHTTP(w, r)
			})
			d1, d2 := fake(t, failFirst), fake(t, failFirst)
			f := newPD(t, ProtocolNixl, ModeAlways, endpoint("p", p.URL, kvroute.RolePrefill),
				endpoint("d1", d1.URL, kvroute.RoleDecode), endpoint("d2", d2.URL, kvroute.RoleDecode))
			body := completion(stream, 2)
			ri, err := openai.ParseRequest(openai.KindCompletion, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			req := &kvroute.Request{ID: "r1", Model: ri.Model, Prompt: ri.Prompt, PromptTokens: ri.PromptTokens(),
				MaxTokens: ri.MaxTokens, Stream: ri.Stream, Arrival: time.Now()}
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
			res := f.h.Serve(w, r, "/v1/completions", []byte(body), req)
			if w.Code != http.StatusOK || res.Status != http.StatusOK {
				t.Fatalf("got %d (result %d, %v) %s", w.Code, res.Status, res.Err, w.Body)
			}
			if legs.Load() != 2 || res.Attempts != 2 {
				t.Fatalf("decode legs %d, attempts %d: want a failed one and its retry", legs.Load(), res.Attempts)
			}
			if res.Err != nil || res.Abort {
				t.Errorf("result error %v (abort %v), want none: the client got a whole answer", res.Err, res.Abort)
			}
			if got := counter(t, f.h.cfg.Metrics.failures, "tiny", "decode", "status"); got != 1 {
				t.Errorf("decode leg failures: got %v, want 1 (the failed leg is still one)", got)
			}
		})
	}
}
