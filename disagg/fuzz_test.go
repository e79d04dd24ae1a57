package disagg

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// FuzzClientRequest: the client-body checks and rewrites never panic, and
// a body that passes the check never carries a reserved field into a leg
// except the router's own.
func FuzzClientRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":3}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"kv_transfer_params":{"remote_host":"evil"}}`, `{"Bootstrap_Host":"x"}`, `[]`, `null`, `{"a":1}{}`, `{"a":"\u003c"}`,
		`{"model":"m","prompt":["a","b"]}`, `{"prompt":[[1],[2,3]]}`, `{"prompt":[1,2]}`, `{"messages":[],"n":3}`, `{"n":1e9}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if err := CheckClientRequest(body, http.Header{}); err != nil {
			return
		}
		for name, out := range map[string]func() ([]byte, error){
			"nixl-prefill": func() ([]byte, error) { return NixlPrefillBody(body) },
			"nixl-decode":  func() ([]byte, error) { return NixlDecodeBody(body, json.RawMessage(`{"remote_host":"p"}`)) },
			"sglang":       func() ([]byte, error) { return SGLangBody(body, "p", 8998, 7) },
		} {
			b, err := out()
			if err != nil {
				if name == "sglang" && strings.Contains(err.Error(), "above the limit") {
					continue
				}
				t.Fatalf("%s: checked body %q: %v", name, body, err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("%s: output %q is not an object: %v", name, b, err)
			}
			if name == "sglang" {
				// The bootstrap fields are all scalars or all lists of one length.
				var lens []int
				for _, k := range []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"} {
					var items []json.RawMessage
					if json.Unmarshal(m[k], &items) != nil {
						items = nil
					}
					lens = append(lens, len(items))
				}
				if lens[0] != lens[1] || lens[1] != lens[2] {
					t.Fatalf("sglang: bootstrap list lengths %v in the output of %q", lens, body)
				}
			}
			for k, v := range m {
				if isReserved(k) && !strings.Contains(string(v), `"p"`) && !strings.Contains(string(v), "do_remote_decode") &&
					k != "bootstrap_port" && k != "bootstrap_room" {
					t.Fatalf("%s: reserved field %s=%s in the output of %q", name, k, v, body)
				}
			}
		}
	})
}

// FuzzKVTransferParams: parsing a prefill reply never panics and returns
// either an object or an error.
func FuzzKVTransferParams(f *testing.F) {
	for _, s := range []string{`{"kv_transfer_params":{"remote_host":"h","remote_port":1}}`, `{"kv_transfer_params":null}`, `{}`, `x`, `{"kv_transfer_params":"s"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, reply []byte) {
		kv, err := KVTransferParams(reply)
		if err != nil {
			return
		}
		var m map[string]any
		if json.Unmarshal(kv, &m) != nil || len(m) == 0 {
			t.Fatalf("got params %q from %q, want a non-empty object", kv, reply)
		}
	})
}
