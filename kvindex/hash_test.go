package kvindex

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

// seqTokens returns n token ids counting up from start: a prompt whose
// blocks all differ.
func seqTokens(n int, start uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = start + uint32(i)
	}
	return t
}

func TestHashTokens(t *testing.T) {
	a := seqTokens(50, 1)
	b := append(seqTokens(32, 1), seqTokens(18, 1000)...)
	ha := HashTokens(a, 16, nil)
	hb := HashTokens(b, 16, nil)
	if len(ha) != 3 || len(hb) != 3 {
		t.Fatalf("len = %d, %d, want 3, 3 (full blocks only)", len(ha), len(hb))
	}
	if ha[0] != hb[0] || ha[1] != hb[1] || ha[2] == hb[2] {
		t.Fatalf("shared prefix: got %x vs %x, want first two equal, third different", ha, hb)
	}
	// Chained: same block contents after a different prefix hash differently.
	c := append(seqTokens(16, 500), seqTokens(16, 17)...)
	if hc := HashTokens(c, 16, nil); hc[1] == ha[1] {
		t.Fatalf("block 1 with different parent hashed equal: %x", hc[1])
	}
	// ChainHash is the per-block step.
	p := uint64(0)
	for i, h := range ha {
		p = ChainHash(p, a[i*16:(i+1)*16])
		if p != h {
			t.Fatalf("ChainHash block %d = %x, want %x", i, p, h)
		}
	}
	// dst is appended to and reused.
	dst := make([]uint64, 1, 8)
	got := HashTokens(a, 16, dst)
	if len(got) != 4 || got[1] != ha[0] || &got[0] != &dst[0] {
		t.Fatalf("append to dst: got %v", got)
	}
	if got := HashTokens(a, 0, nil); got != nil {
		t.Fatalf("block size 0: got %v, want nil", got)
	}
	if got := HashTokens(a[:15], 16, nil); len(got) != 0 {
		t.Fatalf("partial block: got %v, want none", got)
	}
	for _, h := range ha {
		if h == 0 {
			t.Fatal("hash 0")
		}
	}
}

func TestHashText(t *testing.T) {
	ha := HashText("hello world, how are you today?", 8, nil)
	hb := HashText("hello world, who are you?", 8, nil)
	if len(ha) != 3 || len(hb) != 3 {
		t.Fatalf("len %d %d, want 3 3", len(ha), len(hb))
	}
	if ha[0] != hb[0] || ha[1] == hb[1] {
		t.Fatalf("got %x %x, want first equal, second different", ha, hb)
	}
	// Chained: the same block after a different first block hashes
	// differently, and equal texts hash equally.
	hc := HashText("HELLO WORLD, how are you today?", 8, nil)
	if hc[1] == ha[1] || hc[2] == ha[2] {
		t.Fatalf("blocks 1 and 2 after a different block 0: got %x, want both unlike %x", hc, ha)
	}
	if again := HashText("hello world, how are you today?", 8, nil); !slices.Equal(again, ha) {
		t.Fatalf("the same text: got %x, then %x", ha, again)
	}
	for _, h := range append(ha, hb...) {
		if h == 0 {
			t.Fatal("hash 0")
		}
	}
	// Text and token chains never share keys for the same bytes.
	tok := HashTokens([]uint32{0x6c6c6568, 0x6f77206f}, 2, nil)
	if tok[0] == ha[0] {
		t.Fatal("text and token chains collide")
	}
}

func BenchmarkHashTokens8k(b *testing.B) {
	toks := seqTokens(8192, 1)
	dst := make([]uint64, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(toks) * 4))
	for b.Loop() {
		dst = HashTokens(toks, 16, dst[:0])
	}
}

// TestHashTextAfter: HashTextAfter gives HashText's hashes whatever the
// previous text shares with the new one: nothing, part of a block, whole
// blocks, all of it, more than it; with the previous hashes whole or cut
// short; and at block sizes that do and do not divide the texts.
func TestHashTextAfter(t *testing.T) {
	base := strings.Repeat("You are a careful assistant. ", 40) // 1160 bytes
	texts := []string{
		"",
		base,
		base[:500],
		base[:500] + "X" + base[501:],
		base[:512] + "a different ending that goes on for a while, longer than a block or two of the text",
		"Y" + base[1:],
		base + base,
		base[:127],
	}
	for _, chars := range []int{16, 100, 128} {
		for _, prev := range texts {
			prevHashes := HashText(prev, chars, nil)
			for _, text := range texts {
				want := HashText(text, chars, nil)
				for _, keep := range []int{len(prevHashes), len(prevHashes) / 2, 0} {
					ph := append([]uint64(nil), prevHashes[:keep]...)
					if got := HashTextAfter(text, prev, chars, ph); !slices.Equal(got, want) {
						t.Fatalf("chars %d, prev %d bytes (%d hashes kept), text %d bytes: got %x, want %x",
							chars, len(prev), keep, len(text), got, want)
					}
				}
			}
		}
	}
	if got, want := HashText(base, 100, []uint64{7}), append([]uint64{7}, HashText(base, 100, nil)...); !slices.Equal(got, want) {
		t.Fatalf("HashText appending to dst: got %x, want %x", got, want)
	}
	if got := HashTextAfter(base, base, 0, []uint64{1, 2}); len(got) != 0 {
		t.Fatalf("block size 0: got %v, want none", got)
	}
}

// FuzzHashTextAfter: HashTextAfter given the previous prompt's hashes (or a
// prefix of them) returns HashText of the new prompt, whatever the two
// share, and no hash is 0.
func FuzzHashTextAfter(f *testing.F) {
	f.Add("You are a careful assistant. Tell me a story.", "You are a careful assistant. Tell me a joke.", uint8(8), uint8(255))
	f.Add("abcdefgh", "abcdefghij", uint8(4), uint8(1))
	f.Add("", "prev", uint8(3), uint8(0))
	f.Fuzz(func(t *testing.T, text, prev string, chars, keep uint8) {
		c := int(chars%64) + 1
		prevHashes := HashText(prev, c, nil)
		prevHashes = prevHashes[:min(len(prevHashes), int(keep))]
		want := HashText(text, c, nil)
		got := HashTextAfter(text, prev, c, prevHashes)
		if !slices.Equal(got, want) {
			t.Fatalf("HashTextAfter(%q after %q, %d chars, %d kept) = %x, want HashText's %x", text, prev, c, len(prevHashes), got, want)
		}
		if slices.Contains(want, 0) {
			t.Fatalf("HashText(%q, %d) has a 0 hash: %x", text, c, want)
		}
	})
}

// TestXXH3Len128: xxh3Len128 is xxh3's hash of 128 bytes, for text and
// for random bytes.
func TestXXH3Len128(t *testing.T) {
	text := strings.Repeat("You are a careful assistant. ", 20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		var b [128]byte
		if i < len(text)-128 {
			copy(b[:], text[i:])
		} else {
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
		}
		if got, want := xxh3Len128(&b), xxh3.Hash(b[:]); got != want {
			t.Fatalf("%q: got %x, want xxh3's %x", b[:], got, want)
		}
	}
}

// FuzzXXH3Len128: xxh3Len128 is xxh3's hash of any 128 bytes.
func FuzzXXH3Len128(f *testing.F) {
	f.Add(strings.Repeat("a", 128))
	f.Fuzz(func(t *testing.T, s string) {
		var b [128]byte
		copy(b[:], s)
		if got, want := xxh3Len128(&b), xxh3.Hash(b[:]); got != want {
			t.Fatalf("%q: got %x, want xxh3's %x", b[:], got, want)
		}
	})
}

// TestSharedBlocks: sharedBlocks counts the leading equal blocks wherever
// the first difference falls, up to the shorter text's whole blocks.
func TestSharedBlocks(t *testing.T) {
	base := strings.Repeat("0123456789abcdef", 300) // 4800 bytes
	for _, bc := range []int{1, 7, 16, 128} {
		for _, at := range []int{0, 1, 15, 16, 17, 100, 127, 128, 129, 1000, 2047, 2048, 4000, 4799, 4800} {
			other := base
			if at < len(base) {
				other = base[:at] + "X" + base[at+1:]
			}
			if got, want := sharedBlocks(base, other, bc), at/bc; got != want {
				t.Errorf("block %d, difference at %d: got %d, want %d", bc, at, got, want)
			}
			if got, want := sharedBlocks(base, base[:at], bc), at/bc; got != want {
				t.Errorf("block %d, prefix of %d: got %d, want %d", bc, at, got, want)
			}
		}
	}
}

// TestHashText128: hashText128 is xxh3Len128 and chainText block by block,
// appended after what dst holds.
func TestHashText128(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	text := make([]byte, 128*9)
	for i := range text {
		text[i] = byte(rng.Uint32())
	}
	for _, h0 := range []uint64{textSeed, 0, 1, 0x9e3779b97f4a7c15} {
		want := []uint64{7}
		h := h0
		for i := 0; i < len(text)/128; i++ {
			h = chainText(h, xxh3Len128((*[128]byte)(text[i*128:])))
			want = append(want, h)
		}
		dst := make([]uint64, 1, 1+len(text)/128)
		dst[0] = 7
		if got := hashText128(string(text), h0, dst); !slices.Equal(got, want) {
			t.Errorf("seed %x: got %x, want %x", h0, got, want)
		}
	}
}

// TestHashSalted: a salted chain shares no key with an unsalted one or
// another salt's, equals itself, and the empty salt is the unsalted chain;
// HashTextSharedSalted reusing the hashes of a prompt with the same salt
// equals hashing from scratch.
func TestHashSalted(t *testing.T) {
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(i + 1)
	}
	plain, a, b := HashTokens(toks, 16, nil), HashTokensSalted(toks, "a", 16, nil), HashTokensSalted(toks, "b", 16, nil)
	if !slices.Equal(HashTokensSalted(toks, "", 16, nil), plain) || !slices.Equal(HashTokensSalted(toks, "a", 16, nil), a) {
		t.Fatal("salted chains are not deterministic, or the empty salt is not HashTokens")
	}
	for i := range plain {
		if plain[i] == a[i] || a[i] == b[i] || plain[i] == b[i] {
			t.Errorf("block %d: keys %x %x %x, want three different ones", i, plain[i], a[i], b[i])
		}
	}
	text := strings.Repeat("a shared system prompt. ", 40)
	next := text + "and a question"
	for _, salt := range []string{"", "s"} {
		prev, _ := HashTextSharedSalted(text, salt, "", 64, nil)
		got, shared := HashTextSharedSalted(next, salt, text, 64, slices.Clone(prev))
		want, _ := HashTextSharedSalted(next, salt, "", 64, nil)
		if shared == 0 || !slices.Equal(got, want) {
			t.Errorf("salt %q: reusing %d blocks gave %x, want %x", salt, shared, got, want)
		}
	}
	salted, _ := HashTextSharedSalted(text, "s", "", 64, nil)
	if unsalted := HashText(text, 64, nil); unsalted[0] == salted[0] {
		t.Error("a salted text chain shares the unsalted one's first key")
	}
}

// TestHashTextKeyed: an adapter's text chain shares no key with the base
// model's, another adapter's, or its own with another salt; without an
// adapter it is HashTextSharedSalted's; reusing the hashes of a prompt of
// the same adapter and salt equals hashing from scratch.
func TestHashTextKeyed(t *testing.T) {
	text := strings.Repeat("a shared system prompt. ", 40)
	chain := func(lora, salt string) []uint64 {
		h, _ := HashTextSharedKeyed(text, lora, salt, "", 64, nil)
		return h
	}
	for _, salt := range []string{"", "s"} {
		want, _ := HashTextSharedSalted(text, salt, "", 64, nil)
		if got := chain("", salt); !slices.Equal(got, want) {
			t.Errorf("salt %q, no adapter: %x, want HashTextSharedSalted's %x", salt, got, want)
		}
	}
	chains := map[string][]uint64{
		"base": chain("", ""), "sql": chain("sql", ""), "chat": chain("chat", ""), "sql+s": chain("sql", "s"), "base+s": chain("", "s"),
	}
	seen := map[uint64]string{}
	for name, c := range chains {
		for i, h := range c {
			if o, dup := seen[h]; dup {
				t.Errorf("%s block %d has the key of a block of %s", name, i, o)
			}
			seen[h] = name
		}
	}
	next := text + "and a question"
	prev := chain("sql", "s")
	got, shared := HashTextSharedKeyed(next, "sql", "s", text, 64, slices.Clone(prev))
	want, _ := HashTextSharedKeyed(next, "sql", "s", "", 64, nil)
	if shared == 0 || !slices.Equal(got, want) {
		t.Errorf("reusing %d blocks gave %x, want %x", shared, got, want)
	}
}
