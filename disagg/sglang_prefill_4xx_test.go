package disagg

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestSGLangPrefill4xxReplayed: an SGLang prefill engine that does not serve
// the model under the router's name answers 404 (as it would for a wrong
// --served-model-name), which cancels the decode leg waiting on the
// bootstrap room. The prefill's 4xx is the client's answer, replayed and
// marked X-Kvroute-Error-Source: upstream, as on the nixl path, with the
// leg's error as the result's (the proxy's engine-404 warning reads it):
// not placed again (three prefill legs and the router's own 502 before).
func TestSGLangPrefill4xxReplayed(t *testing.T) {
	const notFound = `{"error":{"message":"The model ` + "`tiny`" + ` does not exist.","type":"NotFoundError","param":null,"code":404}}`
	pre := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, notFound)
	}))
	t.Cleanup(pre.Close)
	dec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // waiting for the KV of the room
	}))
	t.Cleanup(dec.Close)
	f := newPD(t, ProtocolSGLang, ModeAlways, endpoint("p", pre.URL, kvroute.RolePrefill), endpoint("d", dec.URL, kvroute.RoleDecode))
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/v1/completions", strings.NewReader(completion(false, 3)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get(kvroute.HeaderErrorSource) != kvroute.ErrorSourceUpstream {
		t.Errorf("got %d %s=%q %s; want the prefill engine's 404 replayed, marked upstream (prefill legs sent: %d)",
			resp.StatusCode, kvroute.HeaderErrorSource, resp.Header.Get(kvroute.HeaderErrorSource), b, len(f.rec.to(pre.URL)))
	}
	if string(b) != notFound {
		t.Errorf("body %s, want the engine's %s", b, notFound)
	}
	if n := len(f.rec.to(pre.URL)); n != 1 {
		t.Errorf("prefill legs sent: %d, want 1", n)
	}
}
