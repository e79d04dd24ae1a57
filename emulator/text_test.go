package emulator

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// renderDecode is the reference: the tokenizer's own Decode.
type renderDecode struct{ tokenizer.Tokenizer }

func TestRenderTokensMatchesDecode(t *testing.T) {
	tok := tokenizer.Builtin()
	ids := []uint32{0, 1, 2, 15, 16, 17, 61 + 16, 53 + 16, 128009, 131071, 131072, 1 << 31}
	fast, _ := renderTokens(tok, nil, ids, nil)
	slow, _ := renderTokens(renderDecode{tok}, nil, ids, nil)
	if string(fast) != string(slow) || len(fast) == 0 {
		t.Errorf("got %q, want Decode's %q", fast, slow)
	}
	// Many ids appended to text already there (the packed table's 8-byte
	// stores must not clobber it nor run past the slice).
	rng := rand.New(rand.NewPCG(3, 4))
	ids = make([]uint32, 10000)
	for i := range ids {
		ids[i] = rng.Uint32()
	}
	fast, _ = renderTokens(tok, []byte("prefix:"), ids, nil)
	slow, _ = renderTokens(renderDecode{tok}, []byte("prefix:"), ids, nil)
	if string(fast) != string(slow) {
		t.Errorf("10,000 ids: got %d bytes, want Decode's %d (first difference at %d)", len(fast), len(slow), firstDiff(fast, slow))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestStopMatch(t *testing.T) {
	tests := []struct {
		text  string
		from  int
		stops []string
		want  int
		which string
	}{
		{"hello world", 0, []string{"wor"}, 6, "wor"},
		{"hello world", 7, []string{"wor"}, 6, "wor"},            // straddles the checked boundary
		{"hello world", 0, []string{"xyz", "lo", "he"}, 3, "lo"}, // the list's order, as vLLM's check_stop_strings
		{"hello", 0, []string{""}, -1, ""},
		{"abc", 2, []string{"abc"}, 0, "abc"},
		{"abc", 3, []string{"abc"}, -1, ""}, // already checked
	}
	for _, tt := range tests {
		got, which := stopMatch([]byte(tt.text), tt.from, tt.stops)
		if got != tt.want || which != tt.which {
			t.Errorf("stopMatch(%q, %d, %q): got %d %q, want %d %q", tt.text, tt.from, tt.stops, got, which, tt.want, tt.which)
		}
	}
}

func TestEOSAt(t *testing.T) {
	if got := eosAt(1, 0); got != 0 {
		t.Errorf("eosAt(mean 0): got %d, want 0", got)
	}
	sum := 0
	const n = 20000
	for i := range n {
		v := eosAt(uint64(i), 100)
		if v < 1 {
			t.Fatalf("eosAt: got %d, want >= 1", v)
		}
		sum += v
	}
	if mean := float64(sum) / n; mean < 90 || mean > 110 {
		t.Errorf("got mean %.1f, want about 100", mean)
	}
	if a, b := eosAt(7, 50), eosAt(7, 50); a != b {
		t.Errorf("eosAt is not deterministic")
	}
}

// TestBuiltinWordsTables checks that the small-table renderer is in use:
// its tables match the built-in Decode for every regular id (checked when
// built). If the built-in tokenizer's rendering changes, rendering falls
// back to Decode (still correct, slower) and this test says so.
func TestBuiltinWordsTables(t *testing.T) {
	wt, ok := builtinWords()
	if !ok {
		t.Fatal("builtinWords: got ok false, want the tables (has the built-in Decode changed?)")
	}
	tok := tokenizer.Builtin()
	for _, r := range []uint32{0, 1, 53, 61, 85, 106, 122, 7225, 7225 * 3, 61 * 53, 131055} {
		var b [8]byte
		w := wt.word(r)
		for i := range b {
			b[i] = byte(w >> (8 * i))
		}
		if got, want := string(b[:b[7]]), tok.Decode([]uint32{tokenizer.BuiltinFirstRegular + r}); got != want {
			t.Errorf("word(%d): got %q, want Decode's %q", r, got, want)
		}
	}
}

func BenchmarkRenderTokens(b *testing.B) {
	tok := tokenizer.Builtin()
	rng := rand.New(rand.NewPCG(5, 6))
	ids := make([]uint32, 1000)
	for i := range ids {
		ids[i] = rng.Uint32N(128256)
	}
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = renderTokens(tok, dst[:0], ids, nil)
	}
	b.SetBytes(int64(len(dst)))
}

func TestAppendChatML(t *testing.T) {
	for _, msgs := range [][]tokenizer.Message{
		nil,
		{{Role: "user", Content: "hi"}},
		{{Role: "system", Content: "rules\nmore"}, {Role: "user", Content: ""}, {Role: "assistant", Content: "<|im_end|> é"}},
	} {
		got := appendChatML([]byte("stale"), msgs)
		if want := "stale" + tokenizer.RenderChatML(msgs, true); string(got) != want {
			t.Errorf("appendChatML(%v): got %q, want %q", msgs, got, want)
		}
	}
}

// TestEncodeMatchesTokenizer checks encode and encodeChat against the
// tokenizer's Encode, for the built-in tokenizer (their sized fast path,
// with and without the server's cache, twice: a miss, then a hit) and
// another one.
func TestEncodeMatchesTokenizer(t *testing.T) {
	msgs := []tokenizer.Message{{Role: "system", Content: strings.Repeat("System prompt 3 sets the rules. It's 42 ok? ", 3)}, {Role: "user", Content: "question"}}
	servers := []*Server{
		{cfg: Config{Tokenizer: tokenizer.Builtin()}},
		{cfg: Config{Tokenizer: tokenizer.Builtin()}, tokCache: tokenizer.NewBuiltinCache(tokenizer.CacheConfig{})},
		{cfg: Config{Tokenizer: renderDecode{tokenizer.Builtin()}}},
	}
	for i, s := range servers {
		tok := s.cfg.Tokenizer
		for range 2 {
			for _, text := range []string{"", "a", "Benchmarks measure the emulator's own cost per request. ", "ééé ... 123456 <|im_start|>x",
				"<|im_start|>" + strings.Repeat("long enough to be cached ", 4) + "<|im_end|>  "} {
				if got, want := s.encode(text), tok.Encode(text); !slices.Equal(got, want) {
					t.Errorf("server %d: encode(%q): got %v, want %v", i, text, got, want)
				}
			}
			if got, want := s.encodeChat(msgs), tok.Encode(tokenizer.RenderChatML(msgs, true)); !slices.Equal(got, want) {
				t.Errorf("server %d: encodeChat: got %v, want %v", i, got, want)
			}
		}
	}
	if st := servers[1].tokCache.Stats(); st.Hits == 0 {
		t.Errorf("the cache was not used: %+v", st)
	}
}

// TestContinueFinal: continue_final_message cuts the rendered chat after
// the final message's content as transformers does: with its trailing
// whitespace when the template kept it, without when the template trimmed
// it, and an error when the template dropped the content.
func TestContinueFinal(t *testing.T) {
	msgs := func(final string) []tokenizer.Message {
		return []tokenizer.Message{{Role: "user", Content: "Sure"}, {Role: "assistant", Content: final}}
	}
	for _, tc := range []struct {
		text, final, want string
	}{
		{"U: Sure</s>A: Sure </s>", "Sure ", "U: Sure</s>A: Sure "},  // kept, and the last occurrence
		{"U: Sure</s>A: Sure</s>", " Sure \n", "U: Sure</s>A: Sure"}, // trimmed by the template
		{"U: Sure</s>A: </s>", "", "U: Sure</s>A: </s>"},             // nothing to find: all of it
	} {
		got, aerr := continueFinal(tc.text, msgs(tc.final))
		if aerr != nil || got != tc.want {
			t.Errorf("continueFinal(%q, final %q) = %q, %v; want %q", tc.text, tc.final, got, aerr, tc.want)
		}
	}
	if _, aerr := continueFinal("U: Sure</s>A: </s>", msgs("Maybe")); aerr == nil || !strings.Contains(aerr.msg, "does not appear in the chat") {
		t.Errorf("final message dropped by the template: got %v, want transformers' error", aerr)
	}
}
