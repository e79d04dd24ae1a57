package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

// testDefaults fills what the tests' engines leave unset: model "tiny",
// the tiny profile, speed 100.
func testDefaults(t testing.TB, cfg *Config) {
	t.Helper()
	if cfg.Model == "" {
		cfg.Model = "tiny"
	}
	if cfg.Engine.Profile.Name == "" {
		p, err := engine.LookupProfile("tiny")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Engine.Profile = p
	}
	if cfg.Speed == 0 {
		cfg.Speed = 100
	}
}

// testServer runs a Server on an httptest server until the test ends.
func testServer(t testing.TB, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	testDefaults(t, &cfg)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	host, port := splitHostPort(t, hs.URL)
	s.SetAdvertise(host, port)
	runUntilCleanup(t, hs, s.Run)
	return s, hs
}

// runUntilCleanup runs run (an engine's Run) until the test ends, then
// closes hs, stops it and waits for it.
func runUntilCleanup(t testing.TB, hs *httptest.Server, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() {
		hs.Close()
		cancel()
		wg.Wait()
	})
}

func post(t testing.TB, url, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	code, _, b := roundTrip(t, req)
	return code, b
}

// roundTrip sends req and returns the answer's status, headers and body.
func roundTrip(t testing.TB, req *http.Request) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

func TestCompletionNonStreaming(t *testing.T) {
	_, hs := testServer(t, Config{})
	code, body := post(t, hs.URL+"/v1/completions", `{"model":"tiny","prompt":"Hello there, how are you?","max_tokens":5,"seed":7}`)
	if code != 200 {
		t.Fatalf("got status %d (%s), want 200", code, body)
	}
	var c openai.Completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	if got := c.Usage.CompletionTokens; got != 5 {
		t.Errorf("got %d completion tokens, want 5", got)
	}
	if c.Choices[0].FinishReason == nil || *c.Choices[0].FinishReason != "length" {
		t.Errorf("got finish_reason %v, want length", c.Choices[0].FinishReason)
	}
	if c.Choices[0].Text == "" {
		t.Errorf("got empty text")
	}
	_, body2 := post(t, hs.URL+"/v1/completions", `{"model":"tiny","prompt":"Hello there, how are you?","max_tokens":5,"seed":7}`)
	var c2 openai.Completion
	_ = json.Unmarshal(body2, &c2)
	if c2.Choices[0].Text != c.Choices[0].Text {
		t.Errorf("same seed: got %q, want %q", c2.Choices[0].Text, c.Choices[0].Text)
	}
	t.Logf("%s", body)
}

func TestChatStreaming(t *testing.T) {
	_, hs := testServer(t, Config{})
	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", bytes.NewBufferString(
		`{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"seed":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	t.Logf("%s", b)
}

func splitHostPort(t testing.TB, url string) (string, int) {
	t.Helper()
	hp := strings.TrimPrefix(url, "http://")
	i := strings.LastIndexByte(hp, ':')
	var port int
	for _, c := range hp[i+1:] {
		port = port*10 + int(c-'0')
	}
	return hp[:i], port
}

func tinyEngine(t testing.TB) engine.Config {
	p, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	return engine.Config{Profile: p}
}

// recorder is a minimal concurrency-safe ResponseWriter with Flush (the
// handler writes only from its own goroutine, but Flush must exist).
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.body.Write(b)
}
func (r *recorder) Flush() {}

func TestRunAndCloseLifecycle(t *testing.T) {
	t.Run("close without run", func(t *testing.T) {
		s, err := New(Config{Model: "tiny", Engine: tinyEngine(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Run(context.Background()); err != ErrStopped {
			t.Errorf("Run after Close: got %v, want ErrStopped", err)
		}
		rec := newRecorder()
		req, _ := http.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"a"}`))
		s.Handler().ServeHTTP(rec, req)
		if rec.code != http.StatusServiceUnavailable {
			t.Errorf("request after Close: got %d, want 503", rec.code)
		}
		// GET /health: vLLM's bare 503 (Response(status_code=503)), no body.
		rec = newRecorder()
		req, _ = http.NewRequest(http.MethodGet, "/health", nil)
		s.Handler().ServeHTTP(rec, req)
		if rec.code != http.StatusServiceUnavailable || rec.body.Len() != 0 {
			t.Errorf("health after Close: got %d %q, want 503 and no body", rec.code, rec.body.String())
		}
	})
	t.Run("close while running", func(t *testing.T) {
		s, err := New(Config{Model: "tiny", Engine: tinyEngine(t), Speed: 0.01}) // very slow: requests stay live
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background()) }()
		got := make(chan int, 1)
		go func() {
			rec := newRecorder()
			req, _ := http.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"prompt":"a","max_tokens":50}`))
			s.Handler().ServeHTTP(rec, req)
			got <- rec.code
		}()
		time.Sleep(50 * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: got %v, want nil", err)
		}
		if code := <-got; code != http.StatusServiceUnavailable {
			t.Errorf("live request at Close: got %d, want 503", code)
		}
		if err := s.Run(context.Background()); err == nil {
			t.Errorf("second Run: got nil, want an error")
		}
		_ = s.Close() // idempotent
	})
}

// TestWholeMatchesStream is a differential test of a whole response, whose
// handler recomputes its tokens with the engine's Sampler, against the
// streamed response of the same seed, whose tokens the loop hands over:
// the same text, finish reason and token count, with EOS (a short EOSMean)
// and without (ignore_eos), in completions and chat.
func TestWholeMatchesStream(t *testing.T) {
	_, hs := testServer(t, Config{EOSMean: 4})
	for seed := range 12 {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			in := `"prompt":"Hello there"`
			if path == "/v1/chat/completions" {
				in = `"messages":[{"role":"user","content":"Hello there"}]`
			}
			body := fmt.Sprintf(`{%s,"max_tokens":9,"seed":%d,"ignore_eos":%v`, in, seed, seed%3 == 0)
			code, whole := post(t, hs.URL+path, body+`}`)
			if code != 200 {
				t.Fatalf("%s: status %d: %s", body, code, whole)
			}
			var w struct {
				Choices []struct {
					Text         string
					Message      struct{ Content string }
					FinishReason string `json:"finish_reason"`
				}
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				}
			}
			if err := json.Unmarshal(whole, &w); err != nil {
				t.Fatal(err)
			}
			code, streamed := post(t, hs.URL+path, body+`,"stream":true,"stream_options":{"include_usage":true}}`)
			if code != 200 {
				t.Fatalf("%s: stream status %d", body, code)
			}
			var text, finish string
			tokens := -1
			for _, ev := range readStream(t, bytes.NewReader(streamed)) {
				if ev == openai.Done {
					continue
				}
				var c struct {
					Choices []struct {
						Text         string
						Delta        struct{ Content string }
						FinishReason *string `json:"finish_reason"`
					}
					Usage *struct {
						CompletionTokens int `json:"completion_tokens"`
					}
				}
				if err := json.Unmarshal([]byte(ev), &c); err != nil {
					t.Fatal(err)
				}
				for _, ch := range c.Choices {
					text += ch.Text + ch.Delta.Content
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
				}
				if c.Usage != nil {
					tokens = c.Usage.CompletionTokens
				}
			}
			ch := w.Choices[0]
			if got := ch.Text + ch.Message.Content; got != text || ch.FinishReason != finish || w.Usage.CompletionTokens != tokens {
				t.Errorf("%s: whole %q %s %d tokens, streamed %q %s %d tokens", body, got, ch.FinishReason, w.Usage.CompletionTokens, text, finish, tokens)
			}
		}
	}
}

// TestRouteMatchesMux: the handler (route, which serves the generation
// endpoints without the mux's routing) answers every method and path as
// the mux alone does, and sets the same r.Pattern.
func TestRouteMatchesMux(t *testing.T) {
	s, _ := testServer(t, Config{})
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodPut, http.MethodHead, "post"} {
		for _, target := range []string{"/v1/completions", "/v1/chat/completions", "/v1/completions/", "//v1/completions",
			"/v1/./chat/completions", "/v1/chat/completions?x=1", "/v1/%63ompletions", "/V1/completions", "/health", "/nope",
			"http://other.host/v1/completions"} {
			serve := func(h http.Handler) (*httptest.ResponseRecorder, string) {
				r := httptest.NewRequest(method, target, strings.NewReader(`{"prompt":[]}`)) // a 400: no generation
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w, r.Pattern
			}
			got, gotPat := serve(s.Handler())
			want, wantPat := serve(s.mux)
			if got.Code != want.Code || got.Body.String() != want.Body.String() || !reflect.DeepEqual(got.Header(), want.Header()) || gotPat != wantPat {
				t.Errorf("%s %s: got %d %q %v pattern %q, want the mux's %d %q %v pattern %q", method, target,
					got.Code, got.Body, got.Header(), gotPat, want.Code, want.Body, want.Header(), wantPat)
			}
		}
	}
}
