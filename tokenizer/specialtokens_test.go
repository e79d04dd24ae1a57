package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestSpecialTokensMap loads testdata/legacy_special, whose
// tokenizer_config.json has no added_tokens_decoder (as transformers
// wrote it before 4.34) and whose special_tokens_map.json names other
// special tokens: transformers' from_pretrained reads the map over the
// config, so its bos_token (the BOS the LlamaTokenizerFast post-processor
// adds), eos_token (the EOS id) and pad_token are the map's, and its
// additional_special_tokens the config's with the map's others appended.
// Beside a config with added_tokens_decoder the map is not read.
func TestSpecialTokensMap(t *testing.T) {
	dir := filepath.Join("testdata", "legacy_special")
	msgs := []Message{{Role: "user", Content: "hi"}}
	for _, tc := range []struct {
		name         string
		load         func() (*HF, error)
		bos, eos     uint32
		wantRendered string
	}{
		{"legacy config", func() (*HF, error) { return LoadDir(dir) }, 302, 303, "<|user|>user: hi[MASK]</s>|<s>,</s>"},
		{"added_tokens_decoder", func() (*HF, error) {
			cfg := bytes.Replace(mustRead(t, filepath.Join(dir, "tokenizer_config.json")), []byte("{"), []byte(`{"added_tokens_decoder": {},`), 1)
			return LoadFiles(Files{Tokenizer: mustRead(t, filepath.Join(dir, "tokenizer.json")), Config: cfg,
				SpecialTokensMap: mustRead(t, filepath.Join(dir, "special_tokens_map.json"))})
		}, 300, 301, "<s>user: hi</s>|<s>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := tc.load()
			if err != nil {
				t.Fatal(err)
			}
			if eos, ok := tok.EOS(); !ok || eos != tc.eos {
				t.Errorf("EOS() = %d, %v, want %d", eos, ok, tc.eos)
			}
			if ids := tok.EncodeAddSpecial("hi"); len(ids) == 0 || ids[0] != tc.bos {
				t.Errorf("EncodeAddSpecial(hi) = %v, want it to start with BOS %d", ids, tc.bos)
			}
			ct, err := tok.ChatTemplate()
			if err != nil {
				t.Fatal(err)
			}
			got, err := ct.Render(msgs, ChatOptions{})
			if err != nil || got != tc.wantRendered {
				t.Errorf("Render = %q (%v), want %q", got, err, tc.wantRendered)
			}
		})
	}
}

// FuzzSpecialTokensMap loads testdata/tiny's tokenizer.json with a
// fuzzed tokenizer_config.json and special_tokens_map.json: it loads or
// fails cleanly, its template renders or fails cleanly, and beside a
// config with added_tokens_decoder the map changes nothing.
func FuzzSpecialTokensMap(f *testing.F) {
	const show = `{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ additional_special_tokens }}`
	f.Add([]byte(`{"bos_token": "<s>", "additional_special_tokens": ["<a>", {"content": "<b>"}], "chat_template": "`+show+`"}`),
		[]byte(`{"bos_token": {"content": "<|user|>"}, "eos_token": "[MASK]", "additional_special_tokens": ["<a>", {"content": "<b>"}, {"content": "<b>"}]}`))
	f.Add([]byte(`{"added_tokens_decoder": {}, "eos_token": "</s>", "chat_template": "`+show+`"}`), []byte(`{"eos_token": "x", "pad_token": null}`))
	f.Add([]byte(`{"additional_special_tokens": "x", "chat_template": "`+show+`"}`), []byte(`{"additional_special_tokens": [null, 5, [], {}], "bos_token": 3}`))
	f.Add([]byte(`{"chat_template": "`+show+`"}`), []byte(`[]`))
	tj, err := os.ReadFile(filepath.Join("testdata", "tiny", "tokenizer.json"))
	if err != nil {
		f.Fatal(err)
	}
	render := func(tok *HF) string {
		ct, err := tok.ChatTemplate()
		if err != nil {
			return "template: " + err.Error()
		}
		out, err := ct.Render([]Message{{Role: "user", Content: "hi"}}, ChatOptions{})
		if err != nil {
			return "render: " + err.Error()
		}
		eos, ok := tok.EOS()
		return fmt.Sprint(out, eos, ok, tok.EncodeAddSpecial("hi"))
	}
	f.Fuzz(func(t *testing.T, config, stm []byte) {
		tok, err := LoadFiles(Files{Tokenizer: tj, Config: config, SpecialTokensMap: stm})
		if err != nil {
			return
		}
		got := render(tok)
		var c hfConfig
		if json.Unmarshal(config, &c) != nil || c.AddedTokensDecoder == nil {
			return
		}
		without, err := Load(tj, config)
		if err != nil {
			t.Fatalf("loads with special_tokens_map.json %q, not without it: %v", stm, err)
		}
		if want := render(without); got != want {
			t.Fatalf("beside a config with added_tokens_decoder, special_tokens_map.json %q changed\n%s\nto\n%s", stm, want, got)
		}
	})
}
