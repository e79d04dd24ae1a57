package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// TestSaltedVLLMVectors: a salted first block hashes as vLLM hashes it,
// sha256(pickle((NONE_HASH, tuple(tokens), (cache_salt,)))), against
// digests Python 3's pickle (protocol 5) and hashlib computed, for a short
// salt, one of 300 bytes (BINUNICODE rather than SHORT_BINUNICODE) and a
// non-ASCII one, with token ids of every pickle width.
func TestSaltedVLLMVectors(t *testing.T) {
	h := SHA256(DefaultNoneHashSeed)
	x300 := strings.Repeat("x", 300)
	for _, tc := range []struct {
		tokens []uint32
		salt   string
		want   string
		key    uint64
	}{
		{seq(1, 16), "tenant-a", "a53ac8bde370bb4c1c264c15caf98ed8d756b0ca96151a5b47592848baa7f631", 5141184742454457905},
		{seq(1, 16), x300, "73df7b20143a88addc727634719ec059ff8ff06a7bdd7e3be2865f98c976455b", 16322839009270580571},
		{[]uint32{70000, 5, 1<<31 + 5}, "é", "1780be337266a131fda3b944ada19a68c3feef101eb9634f9a9083bba9b1d134", 11137546720516362548},
	} {
		d := h.Salted(tc.tokens, tc.salt)
		if got := hex.EncodeToString(d[:]); got != tc.want || d.Key() != tc.key {
			t.Errorf("salt %.10q: %s (key %d), want %s (%d)", tc.salt, got, d.Key(), tc.want, tc.key)
		}
	}
}

// TestSaltedCBORLayout: sha256_cbor's salted first block is the canonical
// CBOR of [parent bytes, [tokens], [salt]], assembled here by hand.
func TestSaltedCBORLayout(t *testing.T) {
	h := SHA256CBOR(DefaultNoneHashSeed)
	none := h.None()
	b := append([]byte{0x83, 0x58, 0x20}, none[:]...)
	b = append(b, 0x83, 0x01, 0x18, 0xc8, 0x19, 0x03, 0xe8) // [1, 200, 1000]
	b = append(b, 0x81, 0x68)                               // [text of 8 bytes]
	b = append(b, "tenant-a"...)
	want := Digest(sha256.Sum256(b))
	if got := h.Salted([]uint32{1, 200, 1000}, "tenant-a"); got != want {
		t.Errorf("Salted = %x, want %x", got, want)
	}
}

// TestSaltedXXH3: the xxh3 chain's salted first block is chained from the
// salt's root, and salts (and no salt) give different keys.
func TestSaltedXXH3(t *testing.T) {
	h := XXH3()
	toks := seq(1, 16)
	a, b, none := h.Salted(toks, "a"), h.Salted(toks, "b"), h.Block(h.None(), toks)
	if a == b || a == none || b == none {
		t.Errorf("keys %x %x %x: want three different ones", a, b, none)
	}
	if want := digestOf(xxh3Block(SaltRoot("a"), toks)); a != want {
		t.Errorf("Salted = %x, want %x", a, want)
	}
}

// TestCacheSalt: requests with the same salt share their prefix's cached
// blocks; with another salt, or none, they share none, whatever the hash
// function. A salted prompt shorter than a block has its first block, made
// of prompt and output tokens, keyed with the salt when it fills (KV
// events report that key).
func TestCacheSalt(t *testing.T) {
	for _, name := range []string{HashXXH3, HashSHA256, HashSHA256CBOR} {
		t.Run(name, func(t *testing.T) {
			h, _ := NewHashFunc(name, "")
			e := mustEngine(t, "tiny", func(c *Config) { c.HashFunc = h })
			d := newDriver(t, e)
			prefix := tokens(1000, 64)
			d.add(&Request{ID: "a", Prompt: concat(prefix, tokens(5000, 10)), MaxTokens: 2, CacheSalt: "s1"})
			d.run()
			if len(d.events) == 0 || d.events[0].Kind != BlockStored || d.events[0].Salt != "s1" ||
				d.events[0].BlockHashes[0] != h.Salted(prefix[:16], "s1").Key() {
				t.Fatalf("events %+v: want first the BlockStored of the prompt, salted s1", d.events)
			}
			for _, tc := range []struct {
				id, salt string
				want     int
			}{
				{"same", "s1", 64},
				{"other", "s2", 0},
				{"none", "", 0},
			} {
				r := &Request{ID: tc.id, Prompt: concat(prefix, tokens(7000, 10)), MaxTokens: 2, CacheSalt: tc.salt}
				if got := e.PrefixHit(r); got != tc.want {
					t.Errorf("%s: PrefixHit = %d, want %d", tc.id, got, tc.want)
				}
				d.add(r)
				d.run()
				if got := d.byID(tc.id)[0].CachedTokens; got != tc.want {
					t.Errorf("%s: cached tokens %d, want %d", tc.id, got, tc.want)
				}
			}
			// A 10-token salted prompt: its first block fills with 6 outputs.
			short := tokens(9000, 10)
			d.events = nil
			d.add(&Request{ID: "short", Prompt: short, MaxTokens: 8, IgnoreEOS: true, CacheSalt: "s3"})
			d.run()
			var outs []uint32
			for _, o := range d.byID("short") {
				outs = append(outs, o.Token)
			}
			want := h.Salted(concat(short, outs[:6]), "s3").Key()
			stored := false
			for _, ev := range d.events {
				if ev.Kind == BlockStored && len(ev.BlockHashes) > 0 && ev.BlockHashes[0] == want {
					stored = ev.Salt == "s3" && ev.ParentHash == nil
				} else if ev.Salt != "" {
					t.Errorf("event %+v: salted, but not of the salted first block", ev)
				}
			}
			if !stored {
				t.Errorf("no BlockStored of the salted first block %d in %+v", want, d.events)
			}
			if len(e.salts) != 0 {
				t.Errorf("%d salts kept after every request ended", len(e.salts))
			}
		})
	}
}
