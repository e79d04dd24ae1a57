package emulator

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
	"unsafe"
)

// scanSeeds are request bodies of every shape: the fast path's and those
// it leaves to encoding/json.
var scanSeeds = []string{
	`{"model":"m","messages":[{"role":"system","content":"System prompt 0 sets the rules."},{"role":"user","content":"question 1 about the rules"}],"max_tokens":1000,"ignore_eos":true,"stream":false}`,
	`{"prompt":"hello","max_tokens":2}`,
	`{"prompt":["hello"],"max_tokens":2,"seed":-7,"n":1}`,
	`{"prompt":[1,2,3],"max_tokens":1,"stop":["a","b"]}`,
	`{"prompt":[1, 4294967295],"stop":"x"}`,
	`{"prompt":[4294967296]}`, `{"prompt":[-0]}`, `{"prompt":[-1]}`, `{"prompt":[1.0]}`, `{"prompt":[]}`, `{"prompt":[[5,6]]}`,
	`{"prompt":["a","b"]}`, `{"prompt":""}`, `{"prompt":null}`, `{"prompt":5}`,
	` { "prompt" : "a\nb\t\"q\"\\ \/" , "max_tokens" : 3 } `,
	`{"prompt":"\u00e9\ud83d\ude00"}`, "{\"prompt\":\"\xff\xfe\"}", "{\"prompt\":\"é ü 😀\"}",
	`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}`,
	`{"messages":[{"role":"user","content":"hi"}],"stream_options":{}}`,
	`{"messages":[{"role":"user","content":"hi"}],"stream_options":null}`,
	`{"prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true}}`,
	`{"prompt":"x","stream":true,"stream_options":{"include_usage":null}}`, `{"prompt":"x","stream_options":{"other":1}}`,
	`{"prompt":"x","stop":"a","include_stop_str_in_output":true,"min_tokens":3}`, `{"prompt":"x","min_tokens":null}`, `{"prompt":"x","min_tokens":-2}`, `{"prompt":"x","include_stop_str_in_output":null}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"max_tokens":1}`,
	`{"messages":[{"role":"user"}]}`, `{"messages":[{"content":"x"}]}`, `{"messages":[{"role":"","content":"x"}]}`,
	`{"messages":[{"role":"user","content":null}]}`, `{"messages":[]}`, `{"messages":null}`, `{"messages":{}}`,
	`{"messages":[{"role":"user","content":"a","name":"bob","extra":[1,{"x":null}]}]}`,
	`{"messages":[{"role":"user","role":"system","content":"a"}]}`,
	`{"messages":[{"Role":"user","content":"a"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"prompt":{"any":["thing",1e5,-0.5,true,false,null]}}`,
	`{"prompt":"x","kv_transfer_params":{"do_remote_decode":true},"max_tokens":1}`,
	`{"prompt":"x","bootstrap_room":5,"bootstrap_port":1}`,
	`{"prompt":"x","MODEL":"m"}`, `{"prompt":"x","model":"a","model":"b"}`, `{"prompt":"x","maxtokens":5}`,
	`{"prompt":"x","max_tokens":1.5}`, `{"prompt":"x","max_tokens":1e3}`, `{"prompt":"x","max_tokens":01}`,
	`{"prompt":"x","max_tokens":-0}`, `{"prompt":"x","max_tokens":9223372036854775807}`, `{"prompt":"x","max_tokens":123456789012345678}`,
	`{"prompt":"x","max_tokens":null}`, `{"prompt":"x","seed":null}`, `{"prompt":"x","stop":null}`, `{"prompt":"x","stop":[]}`,
	`{"prompt":"x","stop":["a",1]}`, `{"prompt":"x","stop":"\u0041"}`, `{"prompt":"x","ignore_eos":1}`, `{"prompt":"x","stream":"true"}`,
	`{"prompt":"x","temperature":0.7,"top_p":1,"logit_bias":{"1":-100},"user":"u\u00e9","tools":[[[[]]]]}`,
	`{"prompt":"x","z":01}`, `{"prompt":"x","z":1.}`, `{"prompt":"x","z":-}`, `{"prompt":"x","z":"\x"}`, `{"prompt":"x","z":tru}`,
	`{"prompt":"x",}`, `{"prompt":"x"} x`, `{"prompt":"x"`, `[]`, ``, `null`, "\x00", `{}`, `{"prompt":"x","ünï":1}`,
	"{\"prompt\":\"a\x01b\"}", "\ufeff{\"prompt\":\"x\"}",
	`{"prompt":"hello","max_tokens":2,"cache_salt":"t1"}`, `{"prompt":"x","cache_salt":""}`,
	`{"messages":[{"role":"user","content":"hi"}],"documents":[{"title":"a","text":"b"}],"max_tokens":2}`,
	`{"messages":[{"role":"user","content":"hi"}],"reasoning_effort":"none","max_tokens":2}`,
}

// TestScanRequestSeeds checks the fast path on the seeds (FuzzParseRequest
// runs them too) and that it takes the common shapes.
func TestScanRequestSeeds(t *testing.T) {
	for _, body := range scanSeeds {
		for _, chat := range []bool{false, true} {
			checkScan(t, []byte(body), chat)
		}
	}
	for _, tc := range []struct {
		body string
		chat bool
	}{
		{scanSeeds[0], true}, {scanSeeds[1], false}, {scanSeeds[3], false}, {scanSeeds[15], false}, {scanSeeds[19], true},
	} {
		if _, ok := scanRequest([]byte(tc.body), tc.chat); !ok {
			t.Errorf("scanRequest(%s, chat %v): got false, want the fast path", tc.body, tc.chat)
		}
	}
}

// FuzzParseRequest is a differential test: whenever the fast path
// (scanRequest) takes a body, encoding/json (decodeRequest, decodeExtra)
// must accept it too and decode the same request.
func FuzzParseRequest(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		checkScan(t, []byte(body), chat)
		_, _ = parseRequest([]byte(body), chat) // never panics
	})
}

func checkScan(t *testing.T, body []byte, chat bool) {
	t.Helper()
	fast, ok := scanRequest(body, chat)
	if !ok {
		return
	}
	want, aerr := decodeRequest(body, chat)
	if aerr == nil {
		aerr = want.decodeExtra()
	}
	if aerr != nil {
		t.Fatalf("body %q chat %v: the fast path took it, encoding/json rejects it: %s", body, chat, aerr.msg)
	}
	// The raw fields are decodeRequest's intermediate forms.
	want.Prompt, want.Messages, want.Stop, want.BootstrapPort, want.BootstrapRoom, want.Suffix = nil, nil, nil, nil, nil, nil
	if !reflect.DeepEqual(fast, want) {
		t.Fatalf("body %q chat %v:\ngot  %+v\nwant %+v", body, chat, *fast, *want)
	}
}

// BenchmarkParseRequest parses the fleet soak's chat body (a ~1.6 kB
// system prompt): the fast path and encoding/json's.
func BenchmarkParseRequest(b *testing.B) {
	sys := strings.Repeat("System prompt 3 sets the rules for this assistant. ", 30)
	body := []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":%q},{"role":"user","content":"question 7 about the rules"}],"max_tokens":1000,"ignore_eos":true,"stream":false}`, sys))
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if _, aerr := parseRequest(body, true); aerr != nil {
				b.Fatal(aerr.msg)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			r, aerr := decodeRequest(body, true)
			if aerr == nil {
				aerr = r.checkOptions(true)
			}
			if aerr != nil {
				b.Fatal(aerr.msg)
			}
		}
	})
}

// TestPlainString checks plainString against a byte-by-byte reference on
// strings of every length up to 40 with a control character, a byte of
// 0x7f or 0x80 and above, or valid and invalid UTF-8 at each position.
func TestPlainString(t *testing.T) {
	naive := func(v []byte) bool {
		for _, c := range v {
			if c < 0x20 {
				return false
			}
		}
		return utf8.Valid(v)
	}
	for n := range 41 {
		base := bytes.Repeat([]byte("a"), n)
		check := func(v []byte) {
			if got, want := plainString(v), naive(v); got != want {
				t.Fatalf("plainString(%q) = %v, want %v", v, got, want)
			}
		}
		check(base)
		for i := range n {
			for _, c := range []byte{0, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xff, '\t', '\n'} {
				v := bytes.Clone(base)
				v[i] = c
				check(v)
				if i+1 < n {
					v[i+1] = 0xa9 // "é" when v[i] is 0xc3
					check(v)
					v[i+1] = 0x1f // a control character after a non-ASCII byte
					check(v)
				}
			}
		}
	}
}

// TestScanMessagesAliasBody: the fast path's message contents are views
// of the body, not copies (a system prompt is kilobytes); handle recycles
// the body only once they are encoded (TestChatBodyRecycled).
func TestScanMessagesAliasBody(t *testing.T) {
	body := []byte(scanSeeds[0])
	r, ok := scanRequest(body, true)
	if !ok {
		t.Fatal("scanRequest: got false, want the fast path")
	}
	c := r.chatMessages[0].Content
	i := bytes.Index(body, []byte(c))
	if i < 0 || unsafe.StringData(c) != &body[i] {
		t.Errorf("content %q is a copy, want a view of the body", c)
	}
}
