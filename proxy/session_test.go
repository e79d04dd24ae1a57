package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
)

// TestSessionKeySources: the affinity key comes from the configured header,
// then the body field, then the prompt expression, then (opted in) the user
// field, and reaches the router (its decision log records it).
func TestSessionKeySources(t *testing.T) {
	engine := newBackend(t, "a", statusHandler(http.StatusOK))
	for _, tc := range []struct {
		name    string
		session config.Session
		header  string
		body    string
		want    string
	}{
		{"default header", config.Session{}, "s-1", `{"model":"m","prompt":"p"}`, "s-1"},
		{"no source", config.Session{}, "", `{"model":"m","prompt":"p","user":"alice"}`, ""},
		{"body field", config.Session{JSONField: "doc_id"}, "", `{"model":"m","prompt":"p","doc_id":"contract-7"}`, "contract-7"},
		{"header before field", config.Session{JSONField: "doc_id"}, "s-2", `{"model":"m","prompt":"p","doc_id":"contract-7"}`, "s-2"},
		{"prompt expression", config.Session{PromptRegexp: `document id: ([a-z0-9-]+)`}, "",
			`{"model":"m","messages":[{"role":"user","content":"Summarise document id: lease-42, section 3."}]}`, "lease-42"},
		{"whole match", config.Session{PromptRegexp: `lease-[0-9]+`}, "", `{"model":"m","prompt":"about lease-42"}`, "lease-42"},
		{"user opted in", config.Session{User: true}, "", `{"model":"m","prompt":"p","user":"alice"}`, "alice"},
		{"own header", config.Session{Header: "X-Conversation"}, "c-9", `{"model":"m","prompt":"p"}`, "c-9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(policy.Default, engine.URL)
			cfg.Models[0].Router.Session = tc.session
			tp := newTestProxyWith(t, cfg, policy.New)
			path := PathCompletions
			if strings.Contains(tc.body, `"messages"`) {
				path = PathChatCompletions
			}
			req, _ := http.NewRequest(http.MethodPost, tp.srv.URL+path, strings.NewReader(tc.body))
			if tc.header != "" {
				name := tc.session.Header
				if name == "" {
					name = config.DefaultSessionHeader
				}
				req.Header.Set(name, tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			d := tp.Router("m").Decisions(1)
			if len(d) != 1 || d[0].SessionKey != tc.want {
				t.Fatalf("session key %q, want %q", d[0].SessionKey, tc.want)
			}
		})
	}
}

func TestSessionConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		models []config.Session
		want   string
	}{
		{"bad expression", []config.Session{{PromptRegexp: "("}}, "prompt_regexp"},
		{"two groups", []config.Session{{PromptRegexp: "(a)(b)"}}, "capture groups"},
		{"bad header", []config.Session{{Header: "X Session"}}, "header"},
		{"two fields", []config.Session{{JSONField: "a"}, {JSONField: "b"}}, "json_field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(policy.Default, "http://127.0.0.1:1")
			m := cfg.Models[0]
			cfg.Models = nil
			for i, s := range tc.models {
				m.Name = string(rune('a' + i))
				m.Router.Session = s
				cfg.Models = append(cfg.Models, m)
			}
			_, err := New(Options{Config: cfg, NewPicker: policy.New})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %s", err, tc.want)
			}
		})
	}
}
