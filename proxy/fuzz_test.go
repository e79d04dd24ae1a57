package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzServeInference posts arbitrary bodies to both inference routes: the
// proxy must answer 200 (the engine's answer) or a 4xx with an OpenAI-style
// error body, and never panic, whichever form a body names a LoRA adapter
// in (the engine is a vLLM one: SGLang's forms are rewritten for it).
func FuzzServeInference(f *testing.F) {
	be := newBackend(f, "a", okHandler("a"))
	cfg := testConfig("rr", be.URL)
	cfg.Limits.MaxBodyBytes = 4096
	cfg.Models[0].Adapters = []string{"sql"}
	cfg.Models[0].Endpoints[0].Signals.Flavor = "vllm" // bodies naming the adapter in SGLang's forms are rewritten
	tp := newTestProxy(f, cfg)
	for _, s := range []string{chatBody, streamBody, `{"model":"x"}`, `{"model":"m","messages":[{"role":1}]}`, `[`, ``,
		`{"model":"m","prompt":[[1,2],[3]],"max_tokens":null,"stream":false}`,
		// LoRA adapters in vLLM's and SGLang's forms (the model has adapter "sql").
		`{"model":"sql","prompt":"p"}`, `{"model":"m:sql","prompt":"p"}`, `{"model":"m:","prompt":"p"}`,
		`{"model":"m:x","prompt":"p"}`, `{"model":"m","prompt":"p","lora_path":["sql",null]}`,
		`{"model":"m:sql","prompt":"p","lora_path":"x"}`} {
		f.Add(true, s)
		f.Add(false, s)
	}
	f.Fuzz(func(t *testing.T, chat bool, body string) {
		path := PathCompletions
		if chat {
			path = PathChatCompletions
		}
		rec := httptest.NewRecorder()
		tp.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		switch {
		case rec.Code == http.StatusOK:
			if !strings.Contains(rec.Body.String(), "from a") && !strings.Contains(rec.Body.String(), "a-0") {
				t.Fatalf("200 without the engine's answer: %q", rec.Body.String())
			}
		case rec.Code >= 400 && rec.Code < 500:
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("status %d with body %q: not an OpenAI error (%v)", rec.Code, rec.Body.String(), err)
			}
		default:
			t.Fatalf("body %q: got status %d %q", body, rec.Code, rec.Body.String())
		}
	})
}
