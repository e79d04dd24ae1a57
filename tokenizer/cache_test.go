package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
)

// conversation returns the messages of a chat of n user turns.
func conversation(n int) []Message {
	msgs := []Message{{Role: "system", Content: "You are a helpful assistant for a team that runs an LLM inference fleet. Answer precisely, cite numbers, and keep code idiomatic."}}
	for i := range n {
		msgs = append(msgs,
			Message{Role: "user", Content: fmt.Sprintf("Question %d: how does prefix caching interact with chunked prefill when the batch holds %d requests? Show code.", i, 8*i+3)},
			Message{Role: "assistant", Content: fmt.Sprintf("Answer %d: the scheduler reuses cached blocks first, then chunks the rest.\n\n```go\nfor i := 0; i < %d; i++ {\n\tstep(i)\n}\n```\nThat is all. 日本語も大丈夫です 🙂", i, i*17)})
	}
	return msgs
}

func TestCacheEqualsUncached(t *testing.T) {
	for _, model := range allRefModels {
		t.Run(model, func(t *testing.T) {
			tok := loadRef(t, model)
			exp := loadExpected(t, model)
			cache := NewCache(tok, CacheConfig{MaxTokens: 4096, MinSegmentBytes: 1})
			// Twice: the second pass is served from the cache.
			for pass := range 2 {
				for i, c := range exp.Texts {
					if got := cache.Encode(c.Text); !slices.Equal(got, c.IDs) {
						t.Fatalf("pass %d text %d %q: cached\n got  %v\n want %v", pass, i, trunc(c.Text), got, c.IDs)
					}
					if got, want := cache.EncodeAddSpecial(c.Text), tok.EncodeAddSpecial(c.Text); !slices.Equal(got, want) {
						t.Fatalf("pass %d text %d: cached EncodeAddSpecial\n got  %v\n want %v", pass, i, got, want)
					}
				}
				for i, c := range exp.Chats {
					if got := cache.Encode(c.Prompt); !slices.Equal(got, c.IDs) {
						t.Fatalf("pass %d chat %d: cached\n got  %v\n want %v", pass, i, got, c.IDs)
					}
				}
			}
			if s := cache.Stats(); s.Hits == 0 || s.Tokens > 4096 {
				t.Errorf("stats %+v: want hits > 0 and tokens <= 4096", s)
			}
		})
	}
}

func TestCacheMultiTurn(t *testing.T) {
	for _, model := range refModels {
		t.Run(model, func(t *testing.T) {
			tok := loadRef(t, model)
			tmpl, err := tok.ChatTemplate()
			if err != nil {
				t.Fatal(err)
			}
			cache := NewCache(tok, CacheConfig{})
			var prevMiss uint64
			for turn := 1; turn <= 12; turn++ {
				msgs := conversation(turn)
				prompt, err := tmpl.Render(msgs[:len(msgs)-1], ChatOptions{AddGenerationPrompt: true})
				if err != nil {
					t.Fatal(err)
				}
				want := tok.Encode(prompt)
				if got := cache.Encode(prompt); !slices.Equal(got, want) {
					t.Fatalf("turn %d: cached ids differ\n got  %v\n want %v", turn, got, want)
				}
				s := cache.Stats()
				newBytes := s.MissBytes - prevMiss
				prevMiss = s.MissBytes
				// Only the newest user and assistant messages are new text.
				t.Logf("turn %d: %d new bytes of %d", turn, newBytes, len(prompt))
				if turn > 1 && newBytes > 400 {
					t.Errorf("turn %d: encoded %d new bytes of %d, want only the new messages", turn, newBytes, len(prompt))
				}
			}
		})
	}
}

func TestCacheEviction(t *testing.T) {
	tok := loadTiny(t)
	const budget = 8 * (entryCost + 6) // a few entries of a few ids
	cache := NewCache(tok, CacheConfig{MaxTokens: budget, MinSegmentBytes: 1})
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 500 {
		text := fmt.Sprintf("hello world %d <s> %d", r.IntN(40), i)
		if got, want := cache.Encode(text), tok.Encode(text); !slices.Equal(got, want) {
			t.Fatalf("Encode(%q) = %v, want %v", text, got, want)
		}
		if s := cache.Stats(); s.Tokens+entryCost*s.Entries > budget {
			t.Fatalf("after %d texts: %d tokens held in %d entries, over the budget %d", i, s.Tokens, s.Entries, budget)
		}
	}
	s := cache.Stats()
	if s.Hits == 0 || s.Misses == 0 || s.Entries == 0 {
		t.Errorf("stats %+v: want hits, misses and entries", s)
	}
	// A segment longer than the whole budget is encoded but not stored.
	long := strings.Repeat("hello ", 100)
	if got, want := cache.Encode(long), tok.Encode(long); !slices.Equal(got, want) {
		t.Errorf("long segment: got %v, want %v", got, want)
	}
}

func TestCacheConcurrent(t *testing.T) {
	tok := loadTiny(t)
	cache := NewCache(tok, CacheConfig{MaxTokens: 200, MinSegmentBytes: 4})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for range 300 {
				text := fmt.Sprintf("<s>hello %d</s> world  %d <|user|> x", r.IntN(20), r.IntN(5))
				if got, want := cache.Encode(text), tok.Encode(text); !slices.Equal(got, want) {
					t.Errorf("Encode(%q) = %v, want %v", text, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

func FuzzEncode(f *testing.F) {
	f.Add("Hello, world! I'm 12345 \n\n  x")
	f.Add("<|im_start|>user\nhi<|im_end|>\n<|eot_id|>")
	f.Add("e\u0301 日本 🙂\u00a0\u0085 ſ'S")
	toks := map[string]*HF{}
	caches := map[string]*Cache{}
	for _, m := range refModels {
		toks[m] = loadRef(f, m)
		caches[m] = NewCache(toks[m], CacheConfig{MaxTokens: 1 << 12, MinSegmentBytes: 1})
	}
	f.Fuzz(func(t *testing.T, s string) {
		for m, tok := range toks {
			ids := tok.Encode(s)
			if got := caches[m].Encode(s); !slices.Equal(got, ids) {
				t.Fatalf("%s: cached Encode(%q) = %v, want %v", m, s, got, ids)
			}
			want := s
			if tok.normalize != nil {
				want = tok.normalize(s)
			}
			if got := tok.Decode(ids); got != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q, want %q", m, s, got, want)
			}
		}
	})
}

func TestCacheLineCuts(t *testing.T) {
	for _, model := range allRefModels {
		t.Run(model, func(t *testing.T) {
			tok := loadRef(t, model)
			if want := model != "deepseek_v3"; lineCutsExact(tok) != want {
				t.Errorf("lineCutsExact = %v, want %v", !want, want)
			}
			cache := NewCache(tok, CacheConfig{MinSegmentBytes: 8})
			doc := strings.Repeat("Paragraph about KV caches.\nSecond line:  indented\n\n  spaced\nÉlan\n\tTabbed\r\nCRLF line\n 42 items\nend", 3)
			r := rand.New(rand.NewPCG(7, 8))
			for i := range 200 {
				// A shared document behind varying prefixes, with random cuts.
				text := fmt.Sprintf("Q%d: %s", r.IntN(5), doc[:r.IntN(len(doc))])
				if got, want := cache.Encode(text), tok.Encode(text); !slices.Equal(got, want) {
					t.Fatalf("text %d %q: cached\n got  %v\n want %v", i, text, got, want)
				}
			}
			if model != "deepseek_v3" && cache.Stats().Hits == 0 {
				t.Errorf("no cache hits on a shared document: %+v", cache.Stats())
			}
		})
	}
}

// TestBuiltinCacheHitAllocs: a built-in cache's AppendEncode of a chat
// prompt whose long segments are cached allocates nothing into a slice
// with room (the emulator encodes each request's prompt so).
func TestBuiltinCacheHitAllocs(t *testing.T) {
	c := NewBuiltinCache(CacheConfig{})
	text := RenderChatML([]Message{{Role: "system", Content: strings.Repeat("System prompt 1 sets the rules for this assistant. ", 30)},
		{Role: "user", Content: "question 7 about the rules"}}, true)
	dst := make([]uint32, 0, len(text))
	want := Builtin().Encode(text)
	if got := c.AppendEncode(dst, text); !slices.Equal(got, want) {
		t.Fatalf("AppendEncode: got %d ids, want Encode's %d", len(got), len(want))
	}
	if n := testing.AllocsPerRun(100, func() { _ = c.AppendEncode(dst, text) }); n != 0 {
		t.Errorf("AppendEncode with a cache hit: %v allocations, want 0", n)
	}
}

// TestCacheChargesEntries: the budget counts each entry's bookkeeping
// (entryCost ids' worth) beside its ids, so a cache of many short segments
// stays within about 4 x MaxTokens bytes. Counting the ids alone, the
// default budget held 51 MB of Llama 3's short segments.
func TestCacheChargesEntries(t *testing.T) {
	tok := loadTiny(t)
	const budget = 4000
	cache := NewCache(tok, CacheConfig{MaxTokens: budget, MinSegmentBytes: 1})
	for i := range 2000 {
		cache.Encode(fmt.Sprintf("w%d", i))
		s := cache.Stats()
		if charged := s.Tokens + entryCost*s.Entries; charged > budget {
			t.Fatalf("after %d segments: %d ids + %d entries x %d = %d, over the budget %d", i+1, s.Tokens, s.Entries, entryCost, charged, budget)
		}
	}
	s := cache.Stats()
	if s.Entries == 0 || s.Entries > budget/entryCost {
		t.Fatalf("%d entries held, want 1..%d", s.Entries, budget/entryCost)
	}

	// The charge is about what an entry takes: fill a cache with short
	// segments and weigh the heap.
	big := NewCache(tok, CacheConfig{MaxTokens: 1 << 30, MinSegmentBytes: 1})
	texts := make([]string, 20000)
	for i := range texts {
		texts[i] = fmt.Sprintf("v%d", i)
	}
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for _, text := range texts {
		big.Encode(text)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	s = big.Stats()
	perEntry := float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc)) / float64(s.Entries)
	charged := 4 * float64(s.Tokens+entryCost*s.Entries) / float64(s.Entries)
	t.Logf("%d entries of %.2f ids: %.0f bytes each on the heap, %.0f charged", s.Entries, float64(s.Tokens)/float64(s.Entries), perEntry, charged)
	if perEntry > 1.5*charged {
		t.Errorf("an entry takes %.0f bytes of heap, %.0f charged: entryCost is too low", perEntry, charged)
	}
	runtime.KeepAlive(big)
}
