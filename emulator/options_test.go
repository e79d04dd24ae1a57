package emulator

import (
	"encoding/json"
	"testing"
)

// errBody is vLLM's error body for status 400.
func errBody(msg, typ string, param any) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": param, "code": 400}})
	return string(b)
}

// canonical re-encodes a JSON body with sorted keys, for an exact
// comparison.
func canonical(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("got body %s: %v", b, err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// TestLogprobsOptions checks vLLM's errors for logprobs and top_logprobs
// (check_logprobs, then --max-logprobs), and the emulator's refusal of a
// request that asks for logprobs within them, as it computes none.
func TestLogprobsOptions(t *testing.T) {
	_, hs := testServer(t, Config{})
	const chat, cmpl = "/v1/chat/completions", "/v1/completions"
	const msgs = `"messages":[{"role":"user","content":"a"}]`
	refused := errBody("logprobs are not supported by this emulated engine (kvroute engine computes no token probabilities)", "BadRequestError", "logprobs")
	tests := []struct {
		name, path, body string
		want             string // "" is a 200
	}{
		{"chat top_logprobs without logprobs", chat, `{` + msgs + `,"top_logprobs":2}`,
			errBody("Value error, when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)", typeValidation, "top_logprobs")},
		{"chat top_logprobs with logprobs false", chat, `{` + msgs + `,"logprobs":false,"top_logprobs":-1}`,
			errBody("Value error, when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)", typeValidation, "top_logprobs")},
		{"chat top_logprobs negative", chat, `{` + msgs + `,"logprobs":true,"top_logprobs":-2}`,
			errBody("Value error, `top_logprobs` must be a positive value or -1. (parameter=top_logprobs, value=-2)", typeValidation, "top_logprobs")},
		{"chat top_logprobs a string", chat, `{` + msgs + `,"logprobs":true,"top_logprobs":"x"}`,
			errBody("Value error, `top_logprobs` must be an integer. (parameter=top_logprobs, value=x)", typeValidation, "top_logprobs")},
		{"chat top_logprobs over the limit", chat, `{` + msgs + `,"logprobs":true,"top_logprobs":21}`,
			errBody("Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)", "BadRequestError", "logprobs")},
		{"chat top_logprobs -1 is the vocabulary", chat, `{` + msgs + `,"logprobs":true,"top_logprobs":-1}`,
			errBody("Requested sample logprobs of 1000, which is greater than max allowed: 20 (parameter=logprobs, value=1000)", "BadRequestError", "logprobs")},
		{"chat logprobs", chat, `{` + msgs + `,"logprobs":true}`, refused},
		{"chat logprobs and top_logprobs", chat, `{` + msgs + `,"logprobs":true,"top_logprobs":20}`, refused},
		{"chat top_logprobs 0 without logprobs", chat, `{` + msgs + `,"top_logprobs":0,"logprobs":false,"max_tokens":2}`, ""},
		{"chat logprobs null", chat, `{` + msgs + `,"logprobs":null,"top_logprobs":null,"max_tokens":2}`, ""},
		{"completions logprobs negative", cmpl, `{"prompt":"a","logprobs":-3}`,
			errBody("Value error, `logprobs` must be a positive value or -1. (parameter=logprobs, value=-3)", typeValidation, "logprobs")},
		{"completions logprobs over the limit", cmpl, `{"prompt":"a","logprobs":25}`,
			errBody("Requested sample logprobs of 25, which is greater than max allowed: 20 (parameter=logprobs, value=25)", "BadRequestError", "logprobs")},
		{"completions logprobs 0", cmpl, `{"prompt":"a","logprobs":0}`, refused},
		{"completions logprobs 5", cmpl, `{"prompt":"a","logprobs":5}`, refused},
		{"completions logprobs null", cmpl, `{"prompt":"a","logprobs":null,"max_tokens":2}`, ""},
		{"completions top_logprobs ignored", cmpl, `{"prompt":"a","top_logprobs":3,"max_tokens":2}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, hs.URL+tt.path, tt.body)
			if tt.want == "" {
				if code != 200 {
					t.Fatalf("got status %d (%s), want 200", code, body)
				}
				return
			}
			if code != 400 {
				t.Fatalf("got status %d (%s), want 400", code, body)
			}
			if got, want := canonical(t, body), canonical(t, []byte(tt.want)); got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

// TestMaxLogprobsFlag: --max-logprobs -1 allows the whole vocabulary, so
// top_logprobs -1 passes vLLM's limit (and meets the emulator's refusal).
func TestMaxLogprobsFlag(t *testing.T) {
	_, hs := testServer(t, Config{MaxLogprobs: -1})
	code, body := post(t, hs.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"logprobs":true,"top_logprobs":-1}`)
	want := errBody("logprobs are not supported by this emulated engine (kvroute engine computes no token probabilities)", "BadRequestError", "logprobs")
	if code != 400 || canonical(t, body) != canonical(t, []byte(want)) {
		t.Errorf("got %d %s, want 400 %s", code, body, want)
	}
}

// TestToolChoice checks vLLM's check_tool_usage errors and its serving
// layer's refusal of tool_choice "auto" (given, or implied by tools)
// without --enable-auto-tool-choice.
func TestToolChoice(t *testing.T) {
	_, plain := testServer(t, Config{})
	_, auto := testServer(t, Config{EnableAutoToolChoice: true})
	const msgs = `"messages":[{"role":"user","content":"a"}],"max_tokens":2`
	const tools = `"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]`
	const usage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`"
	refusedAuto := errBody(`"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`, "BadRequestError", nil)
	tests := []struct {
		name, body   string
		plain, token string // want without and with --enable-auto-tool-choice ("" is a 200)
	}{
		{"tools imply auto", `{` + msgs + `,` + tools + `}`, refusedAuto, ""},
		{"auto", `{` + msgs + `,` + tools + `,"tool_choice":"auto"}`, refusedAuto, ""},
		{"none", `{` + msgs + `,` + tools + `,"tool_choice":"none"}`, "", ""},
		{"required", `{` + msgs + `,` + tools + `,"tool_choice":"required"}`, "", ""},
		{"named", `{` + msgs + `,` + tools + `,"tool_choice":{"type":"function","function":{"name":"f"}}}`, "", ""},
		{"null", `{` + msgs + `,` + tools + `,"tool_choice":null}`, "", ""},
		{"none without tools", `{` + msgs + `,"tool_choice":"none"}`, "", ""},
		{"empty tools", `{` + msgs + `,"tools":[]}`,
			errBody("Value error, `tools` must not be an empty array. Either provide at least one tool or omit the field entirely. (parameter=tools)", typeValidation, "tools"), "same"},
		{"auto without tools", `{` + msgs + `,"tool_choice":"auto"}`,
			errBody("Value error, When using `tool_choice`, `tools` must be set. (parameter=tool_choice)", typeValidation, "tool_choice"), "same"},
		{"unknown choice", `{` + msgs + `,` + tools + `,"tool_choice":"any"}`,
			errBody(`Value error, Invalid value for `+"`tool_choice`"+`: any! Only named tools, "none", "auto" or "required" are supported. (parameter=tool_choice)`, typeValidation, "tool_choice"), "same"},
		{"function not an object", `{` + msgs + `,` + tools + `,"tool_choice":{"type":"function"}}`,
			errBody("Value error, Invalid value for `function`: `None` in `tool_choice`! "+usage+" (parameter=tool_choice.function)", typeValidation, "tool_choice.function"), "same"},
		{"function without name", `{` + msgs + `,` + tools + `,"tool_choice":{"function":{}}}`,
			errBody("Value error, Expected field `name` in `function` in `tool_choice`! "+usage+" (parameter=tool_choice.function.name)", typeValidation, "tool_choice.function.name"), "same"},
		{"empty name", `{` + msgs + `,` + tools + `,"tool_choice":{"function":{"name":""}}}`,
			errBody("Value error, Invalid `name` in `function`: `` in `tool_choice`! "+usage+" (parameter=tool_choice.function.name)", typeValidation, "tool_choice.function.name"), "same"},
		{"no such tool", `{` + msgs + `,` + tools + `,"tool_choice":{"function":{"name":"g"}}}`,
			errBody("Value error, The tool specified in `tool_choice` does not match any of the specified `tools` (parameter=tool_choice)", typeValidation, "tool_choice"), "same"},
	}
	check := func(t *testing.T, url, body, want string) {
		t.Helper()
		code, got := post(t, url+"/v1/chat/completions", body)
		if want == "" {
			if code != 200 {
				t.Errorf("got status %d (%s), want 200", code, got)
			}
			return
		}
		if code != 400 || canonical(t, got) != canonical(t, []byte(want)) {
			t.Errorf("got  %d %s\nwant 400 %s", code, got, want)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check(t, plain.URL, tt.body, tt.plain)
			if tt.token == "same" {
				tt.token = tt.plain
			}
			check(t, auto.URL, tt.body, tt.token)
		})
	}
}

// FuzzOptionChecks: vLLM's logprobs and tool checks take any JSON value in
// these fields and answer an error or nothing, never a panic.
func FuzzOptionChecks(f *testing.F) {
	f.Add(`true`, `5`, `[{"type":"function","function":{"name":"f"}}]`, `{"function":{"name":"f"}}`, true)
	f.Add(`3`, `null`, `[]`, `"auto"`, false)
	f.Add(`"x"`, `-1.5`, `{"a":[1,{"b":null}]}`, `{"function":"x"}`, true)
	f.Add(``, `1e400`, `[1,"a",{"function":{"name":1}}]`, `{"function":{"name":""}}`, true)
	f.Fuzz(func(t *testing.T, logprobs, top, tools, choice string, chat bool) {
		for _, v := range []string{logprobs, top, tools, choice} {
			if v != "" && !json.Valid([]byte(v)) {
				return // the body was JSON: encoding/json refused it before
			}
		}
		r := &apiRequest{Tools: json.RawMessage(tools), opts: &reqOptions{Logprobs: json.RawMessage(logprobs),
			TopLogprobs: json.RawMessage(top), ToolChoice: json.RawMessage(choice)}}
		if aerr := r.checkLogprobs(chat); aerr != nil && aerr.msg == "" {
			t.Fatalf("checkLogprobs: an error without a message")
		}
		if aerr := r.checkTools(); aerr != nil && aerr.msg == "" {
			t.Fatalf("checkTools: an error without a message")
		}
	})
}

// errBodyStatus is vLLM's error body for status.
func errBodyStatus(msg, typ string, param any, status int) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": param, "code": status}})
	return string(b)
}

// TestNChecks: n below 1 is vLLM's sampling parameters' error, after the
// model and the prompt's length were checked and before max_tokens, as
// vLLM checks them; n above 1, which vLLM serves, is the emulator's clear
// refusal (it generates one choice per request); n null is 1.
func TestNChecks(t *testing.T) {
	_, hs := testServer(t, Config{})
	one := errBody("n=2 is not supported by this emulated engine: it generates one choice per request (n must be 1)", "BadRequestError", nil)
	for _, tc := range []struct {
		name, path, body string
		status           int
		want             string
	}{
		{"n 0", "/v1/completions", `{"prompt":"a","n":0}`, 400, errBody("n must be at least 1, got 0.", "BadRequestError", nil)},
		{"n -3 chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"n":-3}`, 400, errBody("n must be at least 1, got -3.", "BadRequestError", nil)},
		{"n 0 before max_tokens 0", "/v1/completions", `{"prompt":"a","n":0,"max_tokens":0}`, 400, errBody("n must be at least 1, got 0.", "BadRequestError", nil)},
		{"n 0, other model", "/v1/completions", `{"model":"other","prompt":"a","n":0}`, 404, errBodyStatus("The model `other` does not exist.", "NotFoundError", "model", 404)},
		{"n 2", "/v1/completions", `{"prompt":"a","n":2}`, 400, one},
		{"n 2 stream", "/v1/completions", `{"prompt":"a","n":2,"stream":true}`, 400, one},
		{"n null", "/v1/completions", `{"prompt":"a","n":null,"max_tokens":1}`, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, hs.URL+tc.path, tc.body)
			if code != tc.status {
				t.Fatalf("got status %d (%s), want %d", code, body, tc.status)
			}
			if tc.want != "" && canonical(t, body) != canonical(t, []byte(tc.want)) {
				t.Errorf("got  %s\nwant %s", body, tc.want)
			}
		})
	}
}
