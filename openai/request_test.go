package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvroute/kvroute"
)

func TestParseRequest(t *testing.T) {
	ns := func(parts ...string) string {
		var b []byte
		for _, p := range parts {
			b = appendNetstring(b, []byte(p))
		}
		return string(b)
	}
	chat := func(roleContent ...string) string {
		var b []byte
		for i := 0; i+1 < len(roleContent); i += 2 {
			b = kvroute.AppendChatMessage(b, []byte(roleContent[i]), []byte(roleContent[i+1]))
		}
		return string(b)
	}
	tests := []struct {
		name string
		kind Kind
		body string
		want RequestInfo
	}{
		{"completion", KindCompletion, `{"model":"m","prompt":"hello","stream":true,"max_tokens":16,"user":"u1"}`,
			RequestInfo{Model: "m", Prompt: "hello", Stream: true, MaxTokens: 16, User: "u1"}},
		{"cache salt", KindCompletion, `{"model":"m","prompt":"p","cache_salt":"t\u00e9"}`,
			RequestInfo{Model: "m", Prompt: "p", CacheSalt: "té"}},
		{"cache salt not a string: left to the engine", KindChat, `{"model":"m","cache_salt":{"a":[1]},"messages":[{"role":"user","content":"hi"}],"cache_salt":null}`,
			RequestInfo{Model: "m", Prompt: chat("user", "hi"), Messages: 1}},
		{"escapes", KindCompletion, `{"model":"m\u00e9","prompt":"a\"b\\c\n\u00e9\ud83d\ude00\ud800x"}`,
			RequestInfo{Model: "mé", Prompt: "a\"b\\c\né😀\uFFFDx"}},
		{"whitespace and nulls", KindCompletion, " {\n\"model\" : \"m\" ,\"stream\":null, \"max_tokens\":null,\"user\":null, \"prompt\" : \"p\"}\n",
			RequestInfo{Model: "m", Prompt: "p"}},
		{"max_completion_tokens ignored by completions", KindCompletion, `{"max_completion_tokens":"x","model":"m","max_tokens":9,"prompt":"p"}`,
			RequestInfo{Model: "m", MaxTokens: 9, Prompt: "p"}},
		{"max_completion_tokens wins", KindChat, `{"max_completion_tokens":7,"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`,
			RequestInfo{Model: "m", MaxTokens: 7, Prompt: chat("user", "hi"), Messages: 1}},
		{"last duplicate wins", KindCompletion, `{"model":"a","prompt":"x","model":"b","stream":true,"stream":false}`,
			RequestInfo{Model: "b", Prompt: "x"}},
		{"batch of strings", KindCompletion, `{"model":"m","prompt":["ab","c"]}`,
			RequestInfo{Model: "m", Prompt: ns("ab", "c")}},
		{"one string in array", KindCompletion, `{"model":"m","prompt":["ab"]}`, RequestInfo{Model: "m", Prompt: "ab"}},
		{"token ids", KindCompletion, `{"model":"m","prompt":[1,22,333]}`,
			RequestInfo{Model: "m", Prompt: "1 22 333 ", TokenIDs: []uint32{1, 22, 333}}},
		{"batch of token ids", KindCompletion, `{"model":"m","prompt":[[1,2],[3]]}`,
			RequestInfo{Model: "m", Prompt: "1 2 3 ", TokenIDs: []uint32{1, 2, 3}}},
		{"chat skips unknown fields, keeps tools", KindChat,
			`{"model":"m","temperature":0.5,"tools":[{"type":"function","function":{"name":"f","parameters":{"a":[1,{"b":null}]}}}],` +
				`"messages":[{"role":"system","content":"be brief","name":"x"},{"role":"user","content":null,"tool_calls":[]}],"prompt":{"ignored":true}}`,
			RequestInfo{Model: "m", Prompt: "\x00\x03" + `[{"type":"function","function":{"name":"f","parameters":{"a":[1,{"b":null}]}}}]` + "\x00\x00" +
				chat("system", "be brief", "user", ""), Messages: 2}},
		{"chat with tool calls", KindChat,
			`{"model":"m","tools":null,"messages":[{"role":"user","content":"hi"},{"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}],"role":"assistant","content":"a\u0000b"}]}`,
			RequestInfo{Model: "m", Prompt: chat("user", "hi") + "9:assistant,a\x00\x01b\x00\x02" +
				`[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]` + "\x00\x00", Messages: 2}},
		{"content parts", KindChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}},{"text":"b","type":"text"}]}]}`,
			RequestInfo{Model: "m", Prompt: chat("user", "a\n"+`{"type":"image_url","image_url":{"url":"data:x"}}`+"\nb"), Messages: 1,
				mediaBytes: len(`{"type":"image_url","image_url":{"url":"data:x"}}`), mediaParts: 1}},
		{"completion ignores messages", KindCompletion, `{"model":"m","prompt":"p","messages":7}`, RequestInfo{Model: "m", Prompt: "p"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest(tc.kind, []byte(tc.body))
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseRequest:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestCanonicalPromptNoCollision(t *testing.T) {
	// Two conversations whose concatenated texts are equal must differ.
	a := `{"model":"m","messages":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}`
	b := `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}`
	c := `{"model":"m","messages":[{"role":"user","content":"abc"}]}`
	seen := map[string]string{}
	for _, body := range []string{a, b, c} {
		ri, err := ParseRequest(KindChat, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := seen[ri.Prompt]; dup {
			t.Errorf("bodies %s and %s share the canonical prompt %q", prev, body, ri.Prompt)
		}
		seen[ri.Prompt] = body
	}
	// A conversation's text is a prefix of its continuation's.
	turn1, _ := ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"}]}`))
	turn2, _ := ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}`))
	if !strings.HasPrefix(turn2.Prompt, turn1.Prompt) {
		t.Errorf("turn 2 prompt %q does not start with turn 1 prompt %q", turn2.Prompt, turn1.Prompt)
	}
}

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		name      string
		kind      Kind
		body      string
		wantParam string
		wantCode  string
		wantMsg   string
	}{
		{"empty body", KindChat, ``, "", "empty_body", "request body is empty"},
		{"not an object", KindChat, `[1,2]`, "", "invalid_body", "must be a JSON object"},
		{"malformed", KindChat, `{"model":"m",}`, "", "invalid_json", "at byte 13: invalid character '}'"},
		{"truncated", KindChat, `{"model":"m","messages":[{"role":"us`, "", "invalid_json", "unexpected end of JSON input"},
		{"trailing data", KindChat, `{"model":"m","messages":[{"role":"u"}]} x`, "", "invalid_json", "after top-level value"},
		{"bad escape", KindCompletion, `{"model":"m","prompt":"\q"}`, "", "invalid_json", "in string escape code"},
		{"control char", KindCompletion, "{\"model\":\"m\",\"prompt\":\"a\x01\"}", "", "invalid_json", "control character"},
		{"bad number in skipped", KindCompletion, `{"model":"m","prompt":"p","temperature":1.}`, "", "invalid_json", "after decimal point"},
		{"bad literal", KindCompletion, `{"model":"m","prompt":"p","echo":tru}`, "", "invalid_json", "looking for beginning of value"},
		{"missing model", KindChat, `{"messages":[{"role":"user","content":"x"}]}`, "model", "missing_model", `"model" field is required`},
		{"null model", KindChat, `{"model":null,"messages":[{"role":"user","content":"x"}]}`, "model", "missing_model", ""},
		{"model wrong type", KindChat, `{"model":3,"messages":[]}`, "model", "invalid_type", `"model" must be a string, got a number`},
		{"stream wrong type", KindChat, `{"model":"m","stream":"yes"}`, "stream", "invalid_type", `must be a boolean, got a string`},
		{"max_tokens float", KindCompletion, `{"model":"m","max_tokens":1.5,"prompt":"p"}`, "max_tokens", "invalid_type", "must be an integer, got 1.5"},
		{"max_tokens negative", KindCompletion, `{"model":"m","max_tokens":-1,"prompt":"p"}`, "max_tokens", "invalid_value", "non-negative"},
		{"max_tokens huge", KindCompletion, `{"model":"m","max_tokens":99999999999999999999,"prompt":"p"}`, "max_tokens", "invalid_value", ""},
		{"max_completion_tokens string", KindChat, `{"model":"m","max_completion_tokens":"5","messages":[{"role":"user","content":"x"}]}`, "max_completion_tokens", "invalid_type", ""},
		{"user wrong type", KindCompletion, `{"model":"m","user":{},"prompt":"p"}`, "user", "invalid_type", "got an object"},
		{"missing messages", KindChat, `{"model":"m"}`, "messages", "missing_messages", ""},
		{"empty messages", KindChat, `{"model":"m","messages":[]}`, "messages", "empty_messages", "must not be empty"},
		{"messages wrong type", KindChat, `{"model":"m","messages":"hi"}`, "messages", "invalid_type", "got a string"},
		{"message not object", KindChat, `{"model":"m","messages":["hi"]}`, "messages[0]", "invalid_type", ""},
		{"message without role", KindChat, `{"model":"m","messages":[{"role":"user","content":"a"},{"content":"b"}]}`, "messages[1].role", "missing_role", ""},
		{"role wrong type", KindChat, `{"model":"m","messages":[{"role":1}]}`, "messages[0].role", "invalid_type", ""},
		{"content wrong type", KindChat, `{"model":"m","messages":[{"role":"user","content":5}]}`, "messages[0].content", "invalid_type", ""},
		{"part wrong type", KindChat, `{"model":"m","messages":[{"role":"user","content":[5]}]}`, "messages[0].content[0]", "invalid_type", ""},
		{"missing prompt", KindCompletion, `{"model":"m"}`, "prompt", "missing_prompt", ""},
		{"prompt wrong type", KindCompletion, `{"model":"m","prompt":{}}`, "prompt", "invalid_type", ""},
		{"empty prompt array", KindCompletion, `{"model":"m","prompt":[]}`, "prompt", "empty_prompt", ""},
		{"mixed prompt array", KindCompletion, `{"model":"m","prompt":["a",1]}`, "prompt", "invalid_type", ""},
		{"negative token", KindCompletion, `{"model":"m","prompt":[1,-2]}`, "prompt", "invalid_value", ""},
		{"float token", KindCompletion, `{"model":"m","prompt":[[1.5]]}`, "prompt", "invalid_value", ""},
		{"token too big", KindCompletion, `{"model":"m","prompt":[4294967296]}`, "prompt", "invalid_value", ""},
		{"null token", KindCompletion, `{"model":"m","prompt":[1,null]}`, "prompt", "invalid_type", "got null"},
		{"null in a batch of token ids", KindCompletion, `{"model":"m","prompt":[[1],[null]]}`, "prompt", "invalid_type", "got null"},
		{"null string", KindCompletion, `{"model":"m","prompt":["a",null]}`, "prompt", "invalid_type", "got null"},
		{"too deep", KindCompletion, `{"model":"m","prompt":"p","x":` + strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2) + `}`, "", "invalid_json", "exceeded max depth"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRequest(tc.kind, []byte(tc.body))
			var e *kvroute.Error
			if !errors.As(err, &e) {
				t.Fatalf("ParseRequest: got %v, want a *kvroute.Error", err)
			}
			if e.Status != 400 || e.Type != kvroute.TypeInvalidRequest || e.Param != tc.wantParam || e.Code != tc.wantCode {
				t.Errorf("got status %d type %q param %q code %q, want 400 %q %q %q",
					e.Status, e.Type, e.Param, e.Code, kvroute.TypeInvalidRequest, tc.wantParam, tc.wantCode)
			}
			if !strings.Contains(e.Message, tc.wantMsg) {
				t.Errorf("message: got %q, want it to contain %q", e.Message, tc.wantMsg)
			}
		})
	}
}

// reference parses body with encoding/json into the same RequestInfo, or
// reports that the body is not acceptable. It is the oracle of the fuzz
// test.
func reference(kind Kind, body []byte) (RequestInfo, bool) {
	body = bytes.TrimPrefix(body, []byte(utf8BOM)) // one leading mark is skipped
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return RequestInfo{}, false
	}
	var ri RequestInfo
	str := func(key string) (string, bool) {
		raw, ok := top[key]
		if !ok {
			return "", true
		}
		var s *string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		if s == nil {
			return "", true
		}
		return *s, true
	}
	intField := func(key string) (int, bool, bool) {
		raw, ok := top[key]
		if !ok || string(raw) == "null" {
			return 0, false, true
		}
		var n int
		if json.Unmarshal(raw, &n) != nil {
			// A whole number written as a float (1024.0, 1e3) counts.
			var f float64
			if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f >= 1<<63 {
				return 0, false, false
			}
			n = int(f)
		}
		if n < 0 {
			return 0, false, false
		}
		return n, true, true
	}
	var ok bool
	if ri.Model, ok = str("model"); !ok || ri.Model == "" {
		return RequestInfo{}, false
	}
	if ri.User, ok = str("user"); !ok {
		return RequestInfo{}, false
	}
	if raw, has := top["lora_path"]; has { // a string, null, or a list of them naming one adapter
		var v any
		_ = json.Unmarshal(raw, &v)
		switch v := v.(type) {
		case nil:
		case string:
			ri.LoRAPath = v
		case []any:
			for i, item := range v {
				name, ok := item.(string)
				if item != nil && !ok {
					return RequestInfo{}, false
				}
				if i == 0 {
					ri.LoRAPath = name
				} else if name != ri.LoRAPath {
					return RequestInfo{}, false
				}
			}
		default:
			return RequestInfo{}, false
		}
	}
	if raw, has := top["cache_salt"]; has { // a string, else nothing (left to the engine)
		_ = json.Unmarshal(raw, &ri.CacheSalt)
	}
	if raw, has := top["stream"]; has {
		var b *bool
		if json.Unmarshal(raw, &b) != nil {
			return RequestInfo{}, false
		}
		ri.Stream = b != nil && *b
	}
	mt, hasMT, ok1 := intField("max_tokens")
	mc, hasMC, ok2 := intField("max_completion_tokens")
	if kind != KindChat { // not a completions field: skipped
		hasMC, ok2 = false, true
	}
	if !ok1 || !ok2 {
		return RequestInfo{}, false
	}
	if hasMC {
		ri.MaxTokens = mc
	} else if hasMT {
		ri.MaxTokens = mt
	}
	var prompt []byte
	if kind == KindCompletion {
		raw, has := top["prompt"]
		if !has {
			return RequestInfo{}, false
		}
		if nullElem(raw) {
			return RequestInfo{}, false
		}
		var s string
		var ss []string
		var ids []uint32
		var idss [][]uint32
		switch {
		case json.Unmarshal(raw, &s) == nil && raw[0] == '"':
			prompt = []byte(s)
		case json.Unmarshal(raw, &ss) == nil && len(ss) > 0 && raw[0] == '[' && bytes.Contains(raw, []byte(`"`)):
			if len(ss) == 1 {
				prompt = []byte(ss[0])
			} else {
				for _, x := range ss {
					prompt = appendNetstring(prompt, []byte(x))
				}
			}
		case json.Unmarshal(raw, &ids) == nil && len(ids) > 0:
			ri.TokenIDs = ids
		case json.Unmarshal(raw, &idss) == nil && len(idss) > 0:
			ri.TokenIDs = []uint32{}
			for _, x := range idss {
				ri.TokenIDs = append(ri.TokenIDs, x...)
			}
		default:
			return RequestInfo{}, false
		}
		for _, id := range ri.TokenIDs {
			prompt = append(strconv.AppendUint(prompt, uint64(id), 10), ' ')
		}
	} else {
		raw, has := top["messages"]
		if !has {
			return RequestInfo{}, false
		}
		var msgs []map[string]json.RawMessage
		if json.Unmarshal(raw, &msgs) != nil || len(msgs) == 0 {
			return RequestInfo{}, false
		}
		// Tools and tool calls count as their raw JSON, unless null or [].
		list := func(r json.RawMessage) []byte {
			if string(r) == "null" || r[0] == '[' && len(bytes.TrimSpace(r[1:len(r)-1])) == 0 {
				return nil
			}
			return r
		}
		for _, m := range msgs {
			if m == nil {
				return RequestInfo{}, false
			}
			var role string
			if r, has := m["role"]; !has || r[0] != '"' || json.Unmarshal(r, &role) != nil {
				return RequestInfo{}, false
			}
			var content []byte
			if c, has := m["content"]; has && string(c) != "null" {
				var s string
				var parts []map[string]json.RawMessage
				switch {
				case c[0] == '"' && json.Unmarshal(c, &s) == nil:
					content = []byte(s)
				case c[0] == '[':
					// A part that is not text is its JSON as the body has it.
					var raws []json.RawMessage
					if json.Unmarshal(c, &raws) != nil {
						return RequestInfo{}, false
					}
					parts = make([]map[string]json.RawMessage, len(raws))
					written := 0
					for i, p := range parts {
						if r := raws[i]; r[0] == '"' { // a string is a text part
							if json.Unmarshal(r, &s) != nil {
								return RequestInfo{}, false
							}
							if s != "" {
								if written > 0 {
									content = append(content, '\n')
								}
								content = append(content, s...)
								written++
							}
							continue
						}
						if json.Unmarshal(raws[i], &p) != nil || p == nil {
							return RequestInfo{}, false
						}
						// A part vLLM reads as text: its text, or
						// nothing when that is empty, null or absent.
						var typ, text string
						tr, th := p["type"]
						key := map[string]string{"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking", "tool_reference": "name"}
						textLike := th && tr[0] == '"' && json.Unmarshal(tr, &typ) == nil && key[typ] != ""
						xr, xh := p[key[typ]]
						switch {
						case textLike && (!xh || string(xr) == "null" || string(xr) == `""`):
							continue // dropped, no separator
						case textLike && xr[0] == '"' && json.Unmarshal(xr, &text) == nil && text != "":
							if written > 0 {
								content = append(content, '\n')
							}
							content = append(content, text...)
						default:
							if written > 0 {
								content = append(content, '\n')
							}
							content = append(content, raws[i]...)
							ri.mediaBytes += len(raws[i])
							ri.mediaParts++
						}
						written++
					}
				default:
					return RequestInfo{}, false
				}
			}
			if tc, has := m["tool_calls"]; has && list(tc) != nil {
				prompt = kvroute.AppendChatRole(prompt, []byte(role))
				prompt = kvroute.AppendChatContent(prompt, content)
				prompt = kvroute.AppendChatToolCalls(prompt, tc)
				prompt = append(prompt, kvroute.ChatTerminator...)
			} else {
				prompt = kvroute.AppendChatMessage(prompt, []byte(role), content)
			}
			ri.Messages++
		}
		if tools, has := top["tools"]; has && list(tools) != nil {
			prompt = kvroute.PrependChatTools(prompt, tools)
		}
	}
	ri.Prompt = string(prompt)
	return ri, true
}

// nullElem reports whether raw is an array with a null element, or with an
// array element that holds a null. A null is neither a string nor a token id,
// though encoding/json reads it into a string or an int as "" or 0.
func nullElem(raw json.RawMessage) bool {
	var v []any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	for _, x := range v {
		if x == nil {
			return true
		}
		inner, _ := x.([]any)
		for _, y := range inner {
			if y == nil {
				return true
			}
		}
	}
	return false
}

func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","prompt":"hello","stream":true,"max_tokens":16,"user":"u"}`,
		`{"model":"m","prompt":["a","b"]}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[[1],[2,3]]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"m","tools":[{"type":"function"}],"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]},{"role":"tool","content":"1"}],"tools":[ ]}`,
		`{"model":"m","tools":[[]],"messages":[{"tool_calls":null,"role":"user","content":"x","tool_calls":[1]}]}`,
		`{"model":"m\ud800","prompt":"\u00e9\"","x":[{"y":-1.5e3},true,false,null]}`,
		`{"model":"m","model":null}`,
		`{"model":"m","prompt":"p","cache_salt":"t\u00e9","cache_salt":7}`,
		`[]`, `{`, `{"model":`,
		"\xef\xbb\xbf{\"model\":\"m\",\"prompt\":\"p\"}",
		`{"model":"m","prompt":"p","max_tokens":1.6e1}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}, {"type":"text","text":"a","text":null}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"text","text":""},{"type":"refusal","refusal":null},{"thinking":"b","type":"thinking"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":["a","",{"type":"text","text":"b"},"\u00e9"]}]}`,
		`{"model":"m:a","prompt":"p","lora_path":"a"}`,
		`{"model":"m","prompt":["p","q"],"lora_path":["a","\u0061"]}`,
		`{"model":"m","prompt":["p","q"],"lora_path":[null,""]}`,
		`{"model":"m","prompt":["p","q"],"lora_path":["a",null]}`,
		`{"model":"m","prompt":"p","lora_path":[]}`,
		`{"model":"m","prompt":"p","lora_path":{"a":1}}`,
		`{"model":"m","prompt":"p","lora_path":["a",[]]}`,
		`{"model":"m","prompt":"p","lora_path":"a","lora_path":null}`,
	}
	for _, s := range seeds {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(1), []byte(s))
	}
	f.Fuzz(func(t *testing.T, k uint8, body []byte) {
		kind := Kind(k % 2)
		got, err := ParseRequest(kind, body)
		// A recycled buffer full of another prompt changes nothing.
		// The session field ("model" here) is the model's name.
		dirty := bytes.Repeat([]byte("stale "), len(body)/3+1)
		into, _, errInto := ParseRequestInto(kind, body, Options{Prompt: dirty, SessionField: "model"})
		if err == nil && into.SessionValue != got.Model {
			t.Fatalf("ParseRequestInto(%s, %q): session value %q, model %q", kind, body, into.SessionValue, got.Model)
		}
		into.SessionValue = ""
		if (err == nil) != (errInto == nil) || (err == nil && !reflect.DeepEqual(got, into)) {
			t.Fatalf("ParseRequestInto(%s, %q) = %+v, %v; ParseRequest = %+v, %v", kind, body, into, errInto, got, err)
		}
		want, ok := reference(kind, body)
		if err != nil {
			var e *kvroute.Error
			if !errors.As(err, &e) || e.Status != 400 {
				t.Fatalf("error %v is not a 400 *kvroute.Error", err)
			}
			if ok {
				t.Fatalf("ParseRequest(%s, %q): got error %v, encoding/json accepts it as %+v", kind, body, err, want)
			}
			return
		}
		if !json.Valid(bytes.TrimPrefix(body, []byte(utf8BOM))) {
			t.Fatalf("ParseRequest(%s, %q) accepted invalid JSON", kind, body)
		}
		if !ok {
			t.Fatalf("ParseRequest(%s, %q) = %+v, the reference rejects it", kind, body, got)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseRequest(%s, %q):\n got %+v\nwant %+v", kind, body, got, want)
		}
	})
}

func promptBody(kind Kind, n int) []byte {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog. \"quoted\" ", n/54+1)[:n]
	q, _ := json.Marshal(text)
	if kind == KindChat {
		return fmt.Appendf(nil, `{"model":"llama","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":%s}],"stream":true,"max_tokens":128,"temperature":0.7}`, q)
	}
	return fmt.Appendf(nil, `{"model":"llama","prompt":%s,"stream":true,"max_tokens":128,"temperature":0.7}`, q)
}

func BenchmarkParseRequest32KiB(b *testing.B) {
	for _, kind := range []Kind{KindCompletion, KindChat} {
		body := promptBody(kind, 32<<10)
		b.Run(kind.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := ParseRequest(kind, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, kind := range []Kind{KindCompletion, KindChat} {
		body := promptBody(kind, 32<<10)
		b.Run(kind.String()+"-into", func(b *testing.B) { // the proxy's way: a recycled prompt buffer
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var buf []byte
			for b.Loop() {
				_, next, err := ParseRequestInto(kind, body, Options{Prompt: buf})
				if err != nil {
					b.Fatal(err)
				}
				buf = next
			}
		})
	}
	body := promptBody(KindChat, 32<<10)
	b.Run("encoding-json-reference", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			var v struct {
				Model    string
				Messages []struct{ Role, Content string }
				Stream   bool
			}
			if err := json.Unmarshal(body, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestParseRequestIntoReusesStorage(t *testing.T) {
	bodies := [][]byte{promptBody(KindChat, 4<<10), promptBody(KindChat, 1<<10), promptBody(KindCompletion, 2<<10)}
	kinds := []Kind{KindChat, KindChat, KindCompletion}
	buf := make([]byte, 0, 8<<10)
	for i, body := range bodies {
		want, err := ParseRequest(kinds[i], body)
		if err != nil {
			t.Fatal(err)
		}
		got, next, err := ParseRequestInto(kinds[i], body, Options{Prompt: buf})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("body %d: ParseRequestInto = %+v, want %+v", i, got, want)
		}
		if unsafe.StringData(got.Prompt) != unsafe.SliceData(buf[:1]) {
			t.Errorf("body %d: the prompt does not live in the 8 KiB buffer given", i)
		}
		if cap(next) != cap(buf) || len(next) != 0 {
			t.Errorf("body %d: returned storage len %d cap %d, want the buffer given back empty", i, len(next), cap(next))
		}
	}
	// Too small: a new buffer, returned for the next request.
	got, next, err := ParseRequestInto(KindChat, promptBody(KindChat, 16<<10), Options{Prompt: buf})
	if err != nil {
		t.Fatal(err)
	}
	if cap(next) < len(got.Prompt) || unsafe.StringData(got.Prompt) != unsafe.SliceData(next[:1]) {
		t.Errorf("grown storage not returned: cap %d for a %d-byte prompt", cap(next), len(got.Prompt))
	}
}

func TestSessionField(t *testing.T) {
	for _, tc := range []struct {
		field, body, want string
	}{
		{"doc_id", `{"model":"m","prompt":"p","doc_id":"contract-\u00e9"}`, "contract-é"},
		{"doc_id", `{"model":"m","prompt":"p","doc_id":42}`, "42"},
		{"doc_id", `{"model":"m","prompt":"p","doc_id":{"a": [1]}}`, `{"a": [1]}`},
		{"doc_id", `{"model":"m","prompt":"p","doc_id":null}`, ""},
		{"doc_id", `{"model":"m","prompt":"p"}`, ""},
		{"user", `{"model":"m","prompt":"p","user":"alice"}`, "alice"},
		{"", `{"model":"m","prompt":"p","doc_id":"x"}`, ""},
	} {
		ri, _, err := ParseRequestInto(KindCompletion, []byte(tc.body), Options{SessionField: tc.field})
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if ri.SessionValue != tc.want {
			t.Errorf("%s field %q: got %q, want %q", tc.body, tc.field, ri.SessionValue, tc.want)
		}
	}
	if ri, _, _ := ParseRequestInto(KindCompletion, []byte(`{"model":"m","prompt":"p","user":"alice"}`), Options{SessionField: "user"}); ri.User != "alice" {
		t.Errorf("a session field that routing also reads: user = %q", ri.User)
	}
}

func TestIndexControl(t *testing.T) {
	for n := range 40 {
		for at := -1; at < n; at++ {
			b := bytes.Repeat([]byte{'a'}, n)
			for i := range b {
				b[i] = byte(0x20 + (i*37)%0x60) // printable ASCII
			}
			if n > 3 {
				b[n/2] = 0xC3 // high bytes must not count as control
			}
			if at >= 0 {
				b[at] = byte(at % 0x20)
			}
			if got := indexControl(b); got != at {
				t.Fatalf("indexControl(%q) = %d, want %d", b, got, at)
			}
		}
	}
}

// TestToolsInCanonicalPrompt: conversations that differ only in the tools
// offered (chat templates render them at the start of the prompt) or in an
// assistant's tool calls have different canonical texts (they were one),
// and a conversation's text is still a prefix of its continuation's.
func TestToolsInCanonicalPrompt(t *testing.T) {
	a := `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]}]}`
	b := `{"model":"m","tools":[{"type":"function","function":{"name":"g"}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c9","type":"function","function":{"name":"g","arguments":"{\"y\":2}"}}]}]}`
	c := `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c9","type":"function","function":{"name":"g","arguments":"{\"y\":2}"}}]}]}`
	next := `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},{"role":"tool","content":"42"}]}`
	parse := func(body string) string {
		t.Helper()
		ri, err := ParseRequest(KindChat, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return ri.Prompt
	}
	pa, pb, pc, pn := parse(a), parse(b), parse(c), parse(next)
	if pa == pb || pa == pc || pb == pc {
		t.Errorf("different tools or tool calls share a canonical text: %q %q %q", pa, pb, pc)
	}
	if !strings.HasPrefix(pn, pa) {
		t.Errorf("the continuation's text %q does not start with the conversation's %q", pn, pa)
	}
	noTools := parse(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	if empty := parse(`{"model":"m","tools":[ ],"messages":[{"role":"user","content":"hi"}]}`); empty != noTools {
		t.Errorf("tools [] gives %q, want the text without tools %q", empty, noTools)
	}
}

// TestParseRequestByteOrderMark: a body that starts with a UTF-8
// byte-order mark (Windows tools write one) is read as the JSON after it,
// as vLLM and SGLang read it (Python's json.loads skips it in bytes); a
// mark anywhere else is an error, as it is for them.
func TestParseRequestByteOrderMark(t *testing.T) {
	const bom = "\xef\xbb\xbf"
	for _, tc := range []struct {
		kind Kind
		body string
	}{
		{KindCompletion, `{"model":"m","prompt":"hello","max_tokens":3}`},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`},
	} {
		want, err := ParseRequest(tc.kind, []byte(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseRequest(tc.kind, []byte(bom+tc.body))
		if err != nil {
			t.Fatalf("ParseRequest(%s, BOM+%s): %v", tc.kind, tc.body, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ParseRequest(%s, BOM+%s):\n got %+v\nwant %+v", tc.kind, tc.body, got, want)
		}
		for _, bad := range []string{" " + bom + tc.body, bom + bom + tc.body, tc.body[:1] + bom + tc.body[1:]} {
			var e *kvroute.Error
			if _, err := ParseRequest(tc.kind, []byte(bad)); !errors.As(err, &e) || e.Status != 400 || e.Code != "invalid_json" {
				t.Errorf("ParseRequest(%s, %q): got %v, want a 400 invalid_json error", tc.kind, bad, err)
			}
		}
	}
}

// TestPromptTokensNonTextParts: an image (or audio) part is estimated as
// nonTextPartTokens, not as a quarter of its JSON: a data URL of a
// megabyte is not 262,144 prompt tokens (what the load the router books
// for the request, and the KV room P/D decode placement asks for, rest on).
func TestPromptTokensNonTextParts(t *testing.T) {
	text := `{"type":"text","text":"What is in this image?"}`
	image := `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 1<<20) + `"}}`
	textOnly, err := ParseRequest(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":[`+text+`]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, body string
		parts      int // non-text parts
	}{
		{"image after text", `{"model":"m","messages":[{"role":"user","content":[` + text + `,` + image + `]}]}`, 1},
		{"two images", `{"model":"m","messages":[{"role":"user","content":[` + text + `,` + image + `,` + image + `]}]}`, 2},
		{"image in an earlier message", `{"model":"m","messages":[{"role":"user","content":[` + image + `]},{"role":"user","content":[` + text + `]}]}`, 1},
		{"content given again", `{"model":"m","messages":[{"role":"user","content":[` + image + `],"content":[` + text + `]}]}`, 0},
		{"messages given again", `{"model":"m","messages":[{"role":"user","content":[` + image + `]}],"messages":[{"role":"user","content":[` + text + `]}]}`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ri, err := ParseRequest(KindChat, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			// The text around the parts still counts (about four bytes a
			// token), each non-text part nonTextPartTokens.
			lo := textOnly.PromptTokens() + tc.parts*nonTextPartTokens
			if got := ri.PromptTokens(); got < lo || got > lo+8 {
				t.Errorf("PromptTokens() = %d, want %d to %d (text %d, %d non-text parts)", got, lo, lo+8, textOnly.PromptTokens(), tc.parts)
			}
		})
	}
}

// TestParseRequestIntegralFloatMaxTokens: a max_tokens written as a number
// with a fraction or an exponent but a whole value (1024.0, 1e3: what
// Python's json.dumps writes for a computed float) is that integer, as
// vLLM's request models read it; a fractional or out-of-range one is
// still a 400.
func TestParseRequestIntegralFloatMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		num  string
		want int
	}{
		{"1024.0", 1024}, {"1e3", 1000}, {"1.5e1", 15}, {"2E+2", 200}, {"-0.0", 0}, {"0e5", 0},
	} {
		for _, field := range []string{"max_tokens", "max_completion_tokens"} {
			body := `{"model":"m","messages":[{"role":"user","content":"x"}],"` + field + `":` + tc.num + `}`
			ri, err := ParseRequest(KindChat, []byte(body))
			if err != nil || ri.MaxTokens != tc.want {
				t.Errorf("ParseRequest(%s): got MaxTokens %d, error %v; want %d", body, ri.MaxTokens, err, tc.want)
			}
		}
	}
	for _, tc := range []struct{ num, code string }{
		{"1.5", "invalid_type"}, {"1e-1", "invalid_type"}, {"-1.0", "invalid_value"}, {"1e19", "invalid_value"}, {"1e400", "invalid_value"},
	} {
		body := `{"model":"m","prompt":"p","max_tokens":` + tc.num + `}`
		_, err := ParseRequest(KindCompletion, []byte(body))
		var e *kvroute.Error
		if !errors.As(err, &e) || e.Status != 400 || e.Code != tc.code || e.Param != "max_tokens" {
			t.Errorf("ParseRequest(%s): got %v, want a 400 %s error on max_tokens", body, err, tc.code)
		}
	}
}

// TestParseRequestPartDuplicateKeys: in a content part too the last of
// duplicate keys wins: a part whose last "type" is not a string, or whose
// last "text" is neither a string nor null, is not a text part, whatever
// came before (a last "text" null drops the part: TestParseRequestTextLikeParts).
func TestParseRequestPartDuplicateKeys(t *testing.T) {
	for _, part := range []string{
		`{"type":"text","text":"a","type":null}`,
		`{"type":"text","text":"a","type":5}`,
		`{"text":"a","type":"text","text":["b"]}`,
	} {
		body := `{"model":"m","messages":[{"role":"user","content":[` + part + `]}]}`
		ri, err := ParseRequest(KindChat, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		want := string(kvroute.AppendChatMessage(nil, []byte("user"), []byte(part)))
		if ri.Prompt != want || ri.mediaParts != 1 {
			t.Errorf("ParseRequest(%s): got prompt %q, %d non-text parts; want %q, 1", body, ri.Prompt, ri.mediaParts, want)
		}
	}
}

// TestParseRequestTextLikeParts: the parts vLLM reads as text are text in
// the canonical prompt and counted as text, not as an image's
// nonTextPartTokens: "input_text" and "output_text" (their "text"),
// "refusal" (its "refusal") and "thinking" (its "thinking"); and a text
// part whose text is empty, null or absent is dropped, with no "\n" for
// it, as vLLM drops it (chat_utils.py: `if parse_res:`), so that
// [{"type":"text","text":"a"},{"type":"text","text":""}] is "a" as the
// engines render it.
func TestParseRequestTextLikeParts(t *testing.T) {
	for _, tc := range []struct {
		parts string
		want  string // the message's content in the canonical prompt
		media int    // non-text parts
	}{
		{`{"type":"input_text","text":"hello there"}`, "hello there", 0},
		{`"hello",{"type":"text","text":"there"},""`, "hello\nthere", 0}, // a string is a text part to vLLM
		{`{"type":"output_text","text":"hello there"}`, "hello there", 0},
		{`{"type":"refusal","refusal":"I can't"}`, "I can't", 0},
		{`{"thinking":"hmm","type":"thinking","closed":true}`, "hmm", 0},
		{`{"type":"text","text":"a"},{"type":"input_text","text":"b"}`, "a\nb", 0},
		{`{"type":"text","text":"a"},{"type":"text","text":""},{"type":"text","text":"b"}`, "a\nb", 0},
		{`{"type":"text","text":null},{"type":"text","text":"x"}`, "x", 0},
		{`{"type":"text"},{"type":"text","text":"x"},{"type":"refusal","refusal":null}`, "x", 0},
		{`{"type":"text","text":""}`, "", 0},
		{`{"type":"text","text":"a","text":null}`, "", 0}, // the last of duplicate keys wins
		{`{"type":"refusal","text":"a"}`, "", 0},          // a refusal's text is its "refusal"
		// A deferred tool's reference is its name (before, its JSON,
		// counted as an image's nonTextPartTokens).
		{`{"type":"tool_reference","name":"lookup"},{"type":"tool_reference","name":null},{"name":"x","type":"tool_reference"}`, "lookup\nx", 0},
		{`{"type":"tool_reference","text":"a"}`, "", 0},
		// Not text: kept as their JSON, counted as non-text parts.
		{`{"type":"input_text","text":5}`, `{"type":"input_text","text":5}`, 1},
		{`{"text":"a"}`, `{"text":"a"}`, 1},
		{`{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"a"}`, `{"type":"image_url","image_url":{"url":"x"}}` + "\na", 1},
	} {
		body := `{"model":"m","messages":[{"role":"user","content":[` + tc.parts + `]}]}`
		ri, err := ParseRequest(KindChat, []byte(body))
		if err != nil {
			t.Fatalf("ParseRequest(%s): %v", body, err)
		}
		want := string(kvroute.AppendChatMessage(nil, []byte("user"), []byte(tc.want)))
		if ri.Prompt != want || ri.mediaParts != tc.media {
			t.Errorf("ParseRequest(%s): got prompt %q, %d non-text parts; want %q, %d", body, ri.Prompt, ri.mediaParts, want, tc.media)
		}
		if tc.media == 0 {
			if got, wantTok := ri.PromptTokens(), (len(want)+3)/4; got != wantTok {
				t.Errorf("ParseRequest(%s).PromptTokens() = %d, want %d", body, got, wantTok)
			}
		}
	}
}
