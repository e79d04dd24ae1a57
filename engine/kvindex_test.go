package engine_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvindex"
)

// TestXXH3MatchesKVIndex: the engine's default block hash is the router's
// kvindex.HashTokens chain, so KV events carry the keys the router computes.
func TestXXH3MatchesKVIndex(t *testing.T) {
	for _, bs := range []int{1, 16, 64} {
		toks := make([]uint32, 1000)
		for i := range toks {
			toks[i] = uint32(i*7919) % 128256
		}
		want := kvindex.HashTokens(toks, bs, nil)
		h := engine.XXH3()
		var got []uint64
		parent := h.None()
		for i := 0; i+bs <= len(toks); i += bs {
			parent = h.Block(parent, toks[i:i+bs])
			got = append(got, parent.Key())
		}
		if !slices.Equal(got, want) {
			t.Errorf("block size %d: engine chain differs from kvindex.HashTokens", bs)
		}
	}
}

// TestSaltedXXH3MatchesKVIndex: a salted request's chain in the engine
// (Salted for the first block) is kvindex.HashTokensSalted's, so the
// router computes the keys a salted request's KV events carry.
func TestSaltedXXH3MatchesKVIndex(t *testing.T) {
	toks := make([]uint32, 160)
	for i := range toks {
		toks[i] = uint32(i*7919) % 128256
	}
	h := engine.XXH3()
	for _, salt := range []string{"tenant-a", "é", "x"} {
		want := kvindex.HashTokensSalted(toks, salt, 16, nil)
		parent := h.Salted(toks[:16], salt)
		got := []uint64{parent.Key()}
		for i := 16; i+16 <= len(toks); i += 16 {
			parent = h.Block(parent, toks[i:i+16])
			got = append(got, parent.Key())
		}
		if !slices.Equal(got, want) {
			t.Errorf("salt %q: engine chain differs from kvindex.HashTokensSalted", salt)
		}
		if engine.SaltRoot(salt) != kvindex.SaltRoot(salt) {
			t.Errorf("salt %q: engine.SaltRoot differs from kvindex.SaltRoot", salt)
		}
	}
}

// TestSaltRootLengths: engine.SaltRoot is kvindex.SaltRoot for salts whose
// msgpack strings take each form (fixstr, str8, str16, str32).
func TestSaltRootLengths(t *testing.T) {
	for _, n := range []int{1, 31, 32, 255, 256, 65535, 65536} {
		salt := strings.Repeat("s", n)
		if engine.SaltRoot(salt) != kvindex.SaltRoot(salt) {
			t.Errorf("salt of %d bytes: engine.SaltRoot differs from kvindex.SaltRoot", n)
		}
	}
}

// TestKeyedXXH3MatchesKVIndex: an adapter's chain in the engine (every
// block Keyed with its name, the first with the salt too) is
// kvindex.HashTokensKeyed's, so the router computes the keys an adapter
// request's KV events carry; ExtraKey is kvindex.BlockKey.
func TestKeyedXXH3MatchesKVIndex(t *testing.T) {
	toks := make([]uint32, 160)
	for i := range toks {
		toks[i] = uint32(i*7919) % 128256
	}
	h := engine.XXH3()
	for _, tc := range []struct{ lora, salt string }{
		{"sql-lora", ""}, {"sql-lora", "tenant-a"}, {"é", "x"}, {strings.Repeat("l", 300), ""}, {"", "tenant-a"}, {"", ""},
	} {
		want := kvindex.HashTokensKeyed(toks, tc.lora, tc.salt, 16, nil)
		parent := h.Keyed(h.None(), toks[:16], tc.lora, tc.salt)
		got := []uint64{parent.Key()}
		for i := 16; i+16 <= len(toks); i += 16 {
			parent = h.Keyed(parent, toks[i:i+16], tc.lora, "")
			got = append(got, parent.Key())
		}
		if !slices.Equal(got, want) {
			t.Errorf("adapter %.10q, salt %q: engine chain %v differs from kvindex.HashTokensKeyed %v", tc.lora, tc.salt, got[:2], want[:2])
		}
		if engine.ExtraKey(tc.lora, tc.salt) != kvindex.BlockKey(tc.lora, tc.salt) {
			t.Errorf("adapter %.10q, salt %q: engine.ExtraKey differs from kvindex.BlockKey", tc.lora, tc.salt)
		}
	}
}
