package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/signals"
)

// llamaLoRAServer is a llama.cpp-flavoured engine with adapters sql-lora
// (id 0) and chat-lora (id 1).
func llamaLoRAServer(t *testing.T) string {
	t.Helper()
	cfg := loraConfig(LoRAModule{Name: "sql-lora", Path: "/adapters/sql-lora.gguf"}, LoRAModule{Name: "chat-lora", Path: "/adapters/chat.gguf"})
	cfg.MetricsFlavor = FlavorLlamaCpp
	_, hs := testServer(t, cfg)
	return hs.URL
}

// llamaErr is llama.cpp's error body (format_error_response).
func llamaErr(code int, msg, typ string) string {
	return fmt.Sprintf(`{"error":{"code":%d,"message":%q,"type":%q}}`, code, msg, typ)
}

// TestLlamaLoRAAdaptersHTTP: GET /lora-adapters lists the modules as
// llama.cpp's server does (ids in order, path, global scale 1 as with
// --lora, empty task_name and prompt_prefix), a body the router's
// signals.ParseLoRAAdapters reads and names by file name; POST sets the
// global scales as llama.cpp does (unlisted adapters to 0, the last entry
// of an id winning) and refuses bad bodies with llama.cpp's statuses and
// bodies, setting nothing.
func TestLlamaLoRAAdaptersHTTP(t *testing.T) {
	url := llamaLoRAServer(t)
	list := func() string {
		t.Helper()
		code, body := get(t, url+"/lora-adapters")
		if code != http.StatusOK {
			t.Fatalf("GET /lora-adapters: %d %s", code, body)
		}
		return body
	}
	want := `[{"id":0,"path":"/adapters/sql-lora.gguf","scale":1.0,"task_name":"","prompt_prefix":""},` +
		`{"id":1,"path":"/adapters/chat.gguf","scale":1.0,"task_name":"","prompt_prefix":""}]`
	body := list()
	if body != want {
		t.Errorf("GET /lora-adapters:\n got %s\nwant %s", body, want)
	}
	parsed, err := signals.ParseLoRAAdapters([]byte(body))
	if err != nil {
		t.Fatalf("signals.ParseLoRAAdapters: %v", err)
	}
	named := signals.NewLlamaAdapters(parsed)
	for name, id := range map[string]int{"sql-lora": 0, "chat": 1, "/adapters/chat.gguf": 1} {
		if a, ok := named.Lookup(name); !ok || a.ID != id || a.Scale != 1 {
			t.Errorf("the router's name %q: got %+v %v, want id %d at scale 1", name, a, ok, id)
		}
	}

	for _, tc := range []struct {
		body, want string
		code       int
		after      string // the scales GET lists after it, as "s0,s1"
	}{
		{`[{"id":0,"scale":0.5}]`, `{"success":true}`, 200, "0.5,0.0"},
		{`[{"id":1,"scale":1},{"id":1,"scale":0.25},{"id":0,"scale":-2}]`, `{"success":true}`, 200, "-2.0,0.25"},
		{`[{"id":0,"scale":0.1}]`, `{"success":true}`, 200, "0.10000000149011612,0.0"}, // a float, written as the double
		{`[]`, `{"success":true}`, 200, "0.0,0.0"},
		{"\ufeff" + `[{"id":true,"scale":true}]`, `{"success":true}`, 200, "0.0,1.0"},
		{`[{"id":0.9,"scale":"2"},{"id":1,"scale":null}]`, `{"success":true}`, 200, "0.0,0.0"},
		{`[{"id":4294967296,"scale":3}]`, `{"success":true}`, 200, "3.0,0.0"}, // int's conversion wraps
		{`[{"id":1,"scale":1e39}]`, `{"success":true}`, 200, "0.0,null"},      // a float's infinity
		{`{"id":0,"scale":1}`, llamaErr(400, "Request body must be an array", "invalid_request_error"), 400, ""},
		{`"x"`, llamaErr(400, "Request body must be an array", "invalid_request_error"), 400, ""},
		{`[{"id":2,"scale":1}]`, llamaErr(500, "invalid adapter id", "server_error"), 500, ""},
		{`[{"id":0,"scale":1},{"id":-1,"scale":1}]`, llamaErr(500, "invalid adapter id", "server_error"), 500, ""},
		{`[{"scale":1}]`, llamaErr(500, "invalid adapter id", "server_error"), 500, ""},
		{`[{"id":"0","scale":1}]`, llamaErr(500, "invalid adapter id", "server_error"), 500, ""},
		{`[0]`, llamaErr(500, "invalid adapter id", "server_error"), 500, ""},
		{`[{"id":1e10}]`, llamaErr(500, "invalid adapter id", "server_error"), 500, ""},
		{`not json`, "", 500, ""},
		{``, "", 500, ""},
		{`[] []`, "", 500, ""},
	} {
		before := list()
		req, _ := http.NewRequest(http.MethodPost, url+"/lora-adapters", strings.NewReader(tc.body))
		code, hdr, out := roundTrip(t, req)
		if code != tc.code || tc.want != "" && string(out) != tc.want {
			t.Errorf("POST %s: got %d %s, want %d %s", tc.body, code, out, tc.code, tc.want)
			continue
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json; charset=utf-8" {
			t.Errorf("POST %s: Content-Type %q", tc.body, ct)
		}
		if code == 500 && tc.want == "" {
			var e struct {
				Error struct {
					Code          int
					Message, Type string
				}
			}
			if json.Unmarshal(out, &e) != nil || e.Error.Code != 500 || e.Error.Type != "server_error" ||
				!strings.HasPrefix(e.Error.Message, "[json.exception.parse_error.101] parse error") {
				t.Errorf("POST %q: got %s, want llama.cpp's 500 of a body that is not JSON", tc.body, out)
			}
		}
		after := list()
		if code != 200 {
			if after != before {
				t.Errorf("POST %s failed but changed the list: %s -> %s", tc.body, before, after)
			}
			continue
		}
		var got []string
		for _, a := range decodeList(t, after) {
			got = append(got, string(a["scale"]))
		}
		if strings.Join(got, ",") != tc.after {
			t.Errorf("POST %s: the scales then %v, want %s", tc.body, got, tc.after)
		}
	}
}

func decodeList(t *testing.T, body string) []map[string]json.RawMessage {
	t.Helper()
	var l []map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return l
}

// TestLlamaLoRAAdaptersNone: a llama.cpp-flavoured engine without adapters
// lists none (llama.cpp always serves /lora-adapters), and every id is
// invalid; the vLLM flavour has no /lora-adapters.
func TestLlamaLoRAAdaptersNone(t *testing.T) {
	_, hs := testServer(t, Config{MetricsFlavor: FlavorLlamaCpp})
	if code, body := get(t, hs.URL+"/lora-adapters"); code != 200 || body != "[]" {
		t.Errorf("GET /lora-adapters: got %d %s, want 200 []", code, body)
	}
	if code, body := post(t, hs.URL+"/lora-adapters", `[]`); code != 200 || string(body) != `{"success":true}` {
		t.Errorf("POST []: got %d %s", code, body)
	}
	if code, body := post(t, hs.URL+"/lora-adapters", `[{"id":0,"scale":1}]`); code != 500 {
		t.Errorf("POST id 0: got %d %s, want 500", code, body)
	}
	if code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1,"lora":[{"id":0,"scale":1}]}`); code != 400 ||
		string(body) != llamaErr(400, "invalid adapter id", "invalid_request_error") {
		t.Errorf("a request for id 0: got %d %s, want llama.cpp's 400", code, body)
	}
	if code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1,"lora":[]}`); code != 200 {
		t.Errorf("a request with an empty lora list: got %d %s", code, body)
	}

	_, vhs := testServer(t, loraConfig(sqlLoRA))
	if code, body := get(t, vhs.URL+"/lora-adapters"); code != http.StatusNotFound {
		t.Errorf("vLLM flavour: GET /lora-adapters got %d %s, want 404", code, body)
	}
}

// TestLlamaLoRARequests: a request's "lora" list picks the adapters it
// runs with as llama.cpp reads it (unlisted ones at 0), without one the
// global scales apply; the adapter with a scale not 0 is the request's
// LoRA: its response names it and its blocks are keyed with it, apart
// from the base model's and the other adapter's. "model" names no adapter
// there. Bad lists get llama.cpp's 400 before the engine takes the
// request, streamed or not.
func TestLlamaLoRARequests(t *testing.T) {
	url := llamaLoRAServer(t)
	prompt := strings.Repeat("one long document the adapters share ", 40)
	complete := func(path string, fields map[string]any) (int, string, int, string) {
		t.Helper()
		req := map[string]any{"max_tokens": 1}
		if path == "/v1/completions" {
			req["prompt"] = prompt
		} else {
			req["messages"] = []map[string]string{{"role": "user", "content": prompt}}
		}
		for k, v := range fields {
			req[k] = v
		}
		b, _ := json.Marshal(req)
		code, out := post(t, url+path, string(b))
		if code != 200 {
			return code, "", 0, string(out)
		}
		var c struct {
			Model string
			Usage openai.Usage
		}
		if err := json.Unmarshal(out, &c); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		return code, c.Model, c.Usage.CachedTokens(), string(out)
	}
	lora := func(scales ...float64) []map[string]any {
		var l []map[string]any
		for id, s := range scales {
			l = append(l, map[string]any{"id": id, "scale": s})
		}
		return l
	}
	for i, tc := range []struct {
		fields map[string]any
		model  string // the response's: the adapter run
		cached bool
	}{
		{map[string]any{"lora": lora(1, 0)}, "sql-lora", false},
		{map[string]any{"lora": []map[string]any{{"id": 0, "scale": 0.5}}}, "sql-lora", true}, // scales are not modelled
		{map[string]any{"lora": lora(0, 0)}, "tiny", false},
		{map[string]any{"lora": []any{}, "model": "sql-lora"}, "tiny", true}, // "model" names nothing
		{map[string]any{"lora": lora(0, 2)}, "chat-lora", false},
		{map[string]any{}, "sql-lora+chat-lora", false}, // the global scales: both at 1
		{map[string]any{"lora": lora(1, -1)}, "sql-lora+chat-lora", true},
	} {
		code, model, cached, out := complete("/v1/completions", tc.fields)
		if code != 200 || model != tc.model || (cached > 0) != tc.cached {
			t.Errorf("request %d (%v): got %d, model %q, %d cached tokens; want model %q, a hit %v (%s)",
				i, tc.fields, code, model, cached, tc.model, tc.cached, out)
		}
	}
	if code, body := post(t, url+"/lora-adapters", `[{"id":1,"scale":0.5}]`); code != 200 {
		t.Fatalf("POST /lora-adapters: %d %s", code, body)
	}
	if _, model, _, out := complete("/v1/chat/completions", nil); model != "chat-lora" {
		t.Errorf("a chat request at the global scales set to chat-lora only: model %q (%s)", model, out)
	}
	if _, model, _, out := complete("/v1/chat/completions", map[string]any{"lora": lora(1)}); model != "sql-lora" {
		t.Errorf("a chat request for sql-lora: model %q (%s)", model, out)
	}

	notArray := llamaErr(400, "Error: 'lora' must be an array of objects with 'id' and 'scale' fields", "invalid_request_error")
	badID := llamaErr(400, "invalid adapter id", "invalid_request_error")
	for _, tc := range []struct {
		path string
		lora any
		want string
	}{
		{"/v1/completions", []map[string]any{{"id": 2, "scale": 1}}, badID},
		{"/v1/completions", []map[string]any{{"scale": 1}}, badID},
		{"/v1/chat/completions", []any{0}, badID},
		{"/v1/completions", map[string]any{"id": 0, "scale": 1}, notArray},
		{"/v1/completions", nil, notArray},
		{"/v1/chat/completions", "sql-lora", notArray},
	} {
		for _, stream := range []bool{false, true} {
			code, _, _, out := complete(tc.path, map[string]any{"lora": tc.lora, "stream": stream})
			if code != 400 || out != tc.want {
				t.Errorf("%s lora %v (stream %v): got %d %s, want 400 %s", tc.path, tc.lora, stream, code, out, tc.want)
			}
		}
	}
}

// TestLlamaLoRAConfig: runtime loading is vLLM's; a llama.cpp-flavoured
// engine loads its adapters at start only.
func TestLlamaLoRAConfig(t *testing.T) {
	cfg := loraConfig(sqlLoRA)
	cfg.MetricsFlavor, cfg.LoRA.RuntimeUpdating = FlavorLlamaCpp, true
	testDefaults(t, &cfg)
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "RuntimeUpdating") {
		t.Errorf("RuntimeUpdating with llama.cpp metrics: got %v, want an error naming RuntimeUpdating", err)
	}
}

// FuzzSetLoRABody: any POST /lora-adapters body is scales for every
// adapter or one of llama.cpp's errors, never a panic; on success each
// adapter's scale is that of the last entry naming it by a plain integer
// id with a plain number scale, read apart with encoding/json, and 0 when
// no entry names it. setLoRABody reads a request's "lora" list as
// parseLlamaLoRA does, after the body's own decoding.
func FuzzSetLoRABody(f *testing.F) {
	for _, s := range []string{`[{"id":0,"scale":0.5}]`, `[]`, `{"id":0}`, `[{"id":1,"scale":1},{"id":1,"scale":0.25}]`,
		`[{"id":true,"scale":true}]`, `[{"id":4294967296}]`, `[{"id":-0.5,"scale":1e39}]`, `[1,"a",null]`, `nope`, "\ufeff[]"} {
		f.Add([]byte(s), uint8(2))
	}
	f.Fuzz(func(t *testing.T, body []byte, n uint8) {
		scales, status, msg := setLoRABody(openai.TrimBOM(body), int(n))
		switch status {
		case http.StatusOK:
		case http.StatusBadRequest, http.StatusInternalServerError:
			if scales != nil || msg == "" {
				t.Fatalf("status %d with scales %v, message %q", status, scales, msg)
			}
			return
		default:
			t.Fatalf("status %d", status)
		}
		if len(scales) != int(n) {
			t.Fatalf("%d scales for %d adapters", len(scales), n)
		}
		var entries []map[string]json.RawMessage
		d := json.NewDecoder(bytes.NewReader(openai.TrimBOM(body)))
		if d.Decode(&entries) != nil {
			return // entries that are not all objects: no reference
		}
		want := make([]float32, n)
		for _, e := range entries {
			var id int64
			var scale float64
			if json.Unmarshal(e["id"], &id) != nil || bytes.ContainsAny(e["id"], ".eE") ||
				json.Unmarshal(e["scale"], &scale) != nil || len(e["scale"]) == 0 || string(e["scale"]) == "null" {
				return
			}
			if id < 0 || id >= int64(n) {
				t.Fatalf("id %d accepted for %d adapters", id, n)
			}
			want[id] = float32(scale)
		}
		for i := range want {
			if scales[i] != want[i] && !(math.IsNaN(float64(scales[i])) && math.IsNaN(float64(want[i]))) {
				t.Fatalf("%s: scales %v, want %v", body, scales, want)
			}
		}
	})
}

// FuzzLlamaLoRARequest: any "lora" value of a completion request to a
// llama.cpp-flavoured engine is served (its response naming the model or
// an adapter) or refused with llama.cpp's 400, never another answer.
func FuzzLlamaLoRARequest(f *testing.F) {
	for _, s := range []string{`[{"id":0,"scale":1}]`, `[]`, `null`, `{"id":0}`, `[{"id":1,"scale":-1},{"id":0,"scale":2}]`, `[{"id":2}]`, `"x"`, `[[1]]`} {
		f.Add(s)
	}
	cfg := loraConfig(LoRAModule{Name: "sql-lora", Path: "/adapters/sql-lora.gguf"}, LoRAModule{Name: "chat-lora", Path: "/adapters/chat.gguf"})
	cfg.MetricsFlavor, cfg.Model, cfg.Engine, cfg.Speed = FlavorLlamaCpp, "tiny", tinyEngine(f), 1000
	s, _ := testServer(f, cfg)
	h := s.Handler()
	f.Fuzz(func(t *testing.T, lora string) {
		body := `{"prompt":"hello","max_tokens":1,"lora":` + lora + `}`
		rec := newRecorder()
		req, _ := http.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		h.ServeHTTP(rec, req)
		switch {
		case !json.Valid([]byte(body)):
			if rec.code != 400 {
				t.Errorf("invalid JSON %q: status %d", body, rec.code)
			}
		case rec.code == 200:
			var c struct{ Model string }
			if err := json.Unmarshal(rec.body.Bytes(), &c); err != nil || !map[string]bool{"tiny": true, "sql-lora": true, "chat-lora": true, "sql-lora+chat-lora": true}[c.Model] {
				t.Errorf("lora %s: answered %s", lora, rec.body.String())
			}
		case rec.code == 400:
			var e struct {
				Error struct {
					Code          int
					Message, Type string
				}
			}
			if err := json.Unmarshal(rec.body.Bytes(), &e); err != nil || e.Error.Code != 400 || e.Error.Message == "" {
				t.Errorf("lora %s: 400 with body %s", lora, rec.body.String())
			}
		default:
			t.Errorf("lora %s: status %d %s", lora, rec.code, rec.body.String())
		}
	})
}
