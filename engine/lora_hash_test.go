package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// TestLoRAVLLMVectors: an adapter's blocks hash as vLLM hashes them, each
// with the extra keys (lora_name,), the first (lora_name, cache_salt) when
// salted, against digests computed with Python 3's pickle (protocol 5) and
// hashlib, and with a CBOR encoder written apart from this package's
// (tokens 1..48, block size 16, NONE_HASH of "vllm-none-hash"), for a
// short name, a short name and salt, and a non-ASCII name of 80 bytes
// (str8 in CBOR) with a salt of 300 (BINUNICODE, str16).
// testdata/vectors/lora_vectors.py prints them.
func TestLoRAVLLMVectors(t *testing.T) {
	long, x300 := strings.Repeat("é", 40), strings.Repeat("x", 300)
	for _, tc := range []struct {
		algo, lora, salt string
		want             [3]string
		keys             [3]uint64
	}{
		{HashSHA256, "sql-lora", "", [3]string{
			"91808d5b2115cd4f5d42e3f9f0bf5c08e9f2806750d7107fee4ef0d65a4fcf9a",
			"482834c1ea984c6b01001b5555814e660ad54ad495ce89293e272d2f8282dfd6",
			"f649ad11d0eee643659e85eeeadf584ebf2e6823a4899585fd52efb4ddc06317",
		}, [3]uint64{17171927232639127450, 4478598036519575510, 18253915799779566359}},
		{HashSHA256, "sql-lora", "tenant-a", [3]string{
			"d0f70979e5306a6c296c5261082f2d74ec1ad55ebf9588ce3d224d4ebe02e70e",
			"d47e3739d021419a3294bb886a19692212184e5555535998fca2f8f2b148988e",
			"1d00527aac2e845a59f07e2365da6739fbf1bffdd3e09eb8d074cc522a135d04",
		}, [3]uint64{4405168386112415502, 18204386365025065102, 15020855310452743428}},
		{HashSHA256, long, x300, [3]string{
			"56a8d38ce432957bbf2647510fb89b48078ac6db1ae0f02f55f1c908c84d55ae",
			"1b86613eb3dfcaaadbcf072f62a5e397d3b2d440961e8ca5c02e03868031f4e1",
			"689890078f4be540b773d0077c512597ffc97cc2f50417357cf4430ab71dca2d",
		}, [3]uint64{6192952002168575406, 13848009780422112481, 9003895268321380909}},
		{HashSHA256CBOR, "sql-lora", "", [3]string{
			"f271bf6c288d2f17711019b397eb19017e32efa06b8387c4b47cb62a60fd1ee3",
			"7c1b748aa77929715c3e5c2283edf28559d5b683a3b42dfe65a8946fbe18784e",
			"211296d80898a0a4a9f8b165f63944f7bc26603e531920925140a4f7b96e1fac",
		}, [3]uint64{13005470117071232739, 7325268001569667150, 5854860899456524204}},
		{HashSHA256CBOR, "sql-lora", "tenant-a", [3]string{
			"6e283755968961ed99d877a0d93ae13e625a34f293d503f78a67d5622f39d458",
			"fbaa9f4fe6188c952e7d3d6db0a45de76e0d71d91ff0a4e5d5945246cd920d01",
			"0b9d5582842fc4d786569488b5a7def7cc9e4d3d4411393f864b6eb1bb487e20",
		}, [3]uint64{9973174517511083096, 15390016290681916673, 9676949933965999648}},
		{HashSHA256CBOR, long, x300, [3]string{
			"176e5a73a148bad174bd3b6997e578df1f95ce4071bc5e96662e26cd08465cc5",
			"e8e20cf2dd516172853f6bc0a0b3127a461f42c1509f926b1c68fa911907e318",
			"85708eb830596a0adea45fdafbd417ea3ba779923e05363372979f1d2c51fdc0",
		}, [3]uint64{7362865102846319813, 2047161531737039640, 8257243389453532608}},
	} {
		h, err := NewHashFunc(tc.algo, "")
		if err != nil {
			t.Fatal(err)
		}
		toks := seq(1, 48)
		parent := h.None()
		for i := range 3 {
			salt := ""
			if i == 0 {
				salt = tc.salt
			}
			parent = h.Keyed(parent, toks[16*i:16*i+16], tc.lora, salt)
			if got := hex.EncodeToString(parent[:]); got != tc.want[i] || parent.Key() != tc.keys[i] {
				t.Errorf("%s, adapter %.10q, salt %.10q, block %d: %s (key %d), want %s (%d)",
					tc.algo, tc.lora, tc.salt, i, got, parent.Key(), tc.want[i], tc.keys[i])
			}
		}
		// chainPrompt keys a whole prompt so.
		_, keys := chainPrompt(h, tc.lora, tc.salt, toks, 16, nil)
		if len(keys) != 3 || keys[0] != tc.keys[0] || keys[1] != tc.keys[1] || keys[2] != tc.keys[2] {
			t.Errorf("%s, adapter %.10q: chainPrompt keys %v, want %v", tc.algo, tc.lora, keys, tc.keys)
		}
	}
}

// TestKeyedCBORLayout: sha256_cbor's adapter block is the canonical CBOR
// of [parent bytes, [tokens], [lora_name, salt]], assembled here by hand.
func TestKeyedCBORLayout(t *testing.T) {
	h := SHA256CBOR(DefaultNoneHashSeed)
	none := h.None()
	b := append([]byte{0x83, 0x58, 0x20}, none[:]...)
	b = append(b, 0x83, 0x01, 0x18, 0xc8, 0x19, 0x03, 0xe8) // [1, 200, 1000]
	b = append(b, 0x82, 0x63)                               // [text of 3 bytes, ...
	b = append(b, "sql"...)
	b = append(b, 0x61, 's') // ... text of 1 byte]
	want := Digest(sha256.Sum256(b))
	if got := h.Keyed(none, []uint32{1, 200, 1000}, "sql", "s"); got != want {
		t.Errorf("Keyed = %x, want %x", got, want)
	}
}

// TestKeyedIsBlockAndSalted: without extra keys Keyed is Block, and with
// a salt alone from None it is Salted, for every hash function; an
// adapter's key differs from the base model's and another adapter's.
func TestKeyedIsBlockAndSalted(t *testing.T) {
	toks := seq(1, 16)
	for _, name := range []string{HashXXH3, HashSHA256, HashSHA256CBOR} {
		h, _ := NewHashFunc(name, "")
		p := h.Block(h.None(), seq(100, 115))
		if got, want := h.Keyed(p, toks, "", ""), h.Block(p, toks); got != want {
			t.Errorf("%s: Keyed without keys = %x, want Block's %x", name, got, want)
		}
		if got, want := h.Keyed(h.None(), toks, "", "s"), h.Salted(toks, "s"); got != want {
			t.Errorf("%s: Keyed with a salt = %x, want Salted's %x", name, got, want)
		}
		a, b, base := h.Keyed(p, toks, "a", ""), h.Keyed(p, toks, "b", ""), h.Block(p, toks)
		if a == b || a == base || b == base {
			t.Errorf("%s: keys %x %x %x: want three different ones", name, a, b, base)
		}
	}
}
