package engine

import (
	"encoding/hex"
	"slices"
	"testing"
)

func seq(from, to uint32) []uint32 {
	var s []uint32
	for t := from; t <= to; t++ {
		s = append(s, t)
	}
	return s
}

// TestVLLMHashVectors checks the sha256 and sha256_cbor chains against the
// vectors in shared/protocols.md section 3 (tokens 1..48, block size 16).
func TestVLLMHashVectors(t *testing.T) {
	tests := []struct {
		algo, seed, none string
		blocks           []string
		keys             []uint64
	}{
		{
			algo: HashSHA256, seed: "vllm-none-hash",
			none: "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198",
			blocks: []string{
				"7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf",
				"8e717becdc2054b7a3223b7b844f462c0db0ac86287b752b16d077ad0843c577",
				"22037986a86c2b763b86fba8b74fcc31eef23fe073d83875efa329b7176b54f1",
			},
			keys: []uint64{1403909460543360175, 1643945449041937783, 17267691262617277681},
		},
		{
			algo: HashSHA256, seed: "0",
			none:   "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c",
			blocks: []string{"bea72b7d33de03c1aa715efbb492d0e0d3801f00c1f985756896072ae8b31325"},
			keys:   []uint64{7536218907325174565},
		},
		{
			algo: HashSHA256CBOR, seed: "vllm-none-hash",
			none: "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
			blocks: []string{
				"cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682",
				"2533ea50426b36e9e4d68296cac6bce8cf602e46957d0fe40b368b33d87bf3bf",
				"c7e6bd05b0485123bde5709175e3f6d9accbc05c10c9742a96f37f6bfe25db82",
			},
			keys: []uint64{8866452693264111234, 807986237951177663, 10877177626832001922},
		},
		{
			algo: HashSHA256CBOR, seed: "0",
			none:   "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
			blocks: []string{"202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea"},
			keys:   []uint64{3236607068019569386},
		},
	}
	for _, tt := range tests {
		t.Run(tt.algo+"/"+tt.seed, func(t *testing.T) {
			h, err := NewHashFunc(tt.algo, tt.seed)
			if err != nil {
				t.Fatal(err)
			}
			none := h.None()
			if got := hex.EncodeToString(none[:]); got != tt.none {
				t.Fatalf("NONE_HASH = %s, want %s", got, tt.none)
			}
			parent := none
			tokens := seq(1, 48)
			for i, want := range tt.blocks {
				d := h.Block(parent, tokens[16*i:16*i+16])
				if got := hex.EncodeToString(d[:]); got != want {
					t.Errorf("block %d = %s, want %s", i, got, want)
				}
				if got := d.Key(); got != tt.keys[i] {
					t.Errorf("block %d key = %d, want %d", i, got, tt.keys[i])
				}
				parent = d
			}
		})
	}
}

// TestPickleLayout checks the byte layout given in protocols.md section 3.
func TestPickleLayout(t *testing.T) {
	var zero Digest
	got := hex.EncodeToString(pickleBlock(nil, &zero, []uint32{1, 2}, "", ""))
	want := "800595" + "2d00000000000000" + "4320" + hex.EncodeToString(zero[:]) + "94" + "4b014b02" + "8694" + "4e" + "8794" + "2e"
	if got != want {
		t.Errorf("pickle = %s, want %s", got, want)
	}
}

// TestChainKeys: chainKeys (Add's chain, on keys for xxh3) gives the keys
// and the last digest that Keyed gives block after block, for every hash
// function, from None and from another parent, with 0 to 5 blocks, of the
// base model (Keyed is Block) and of an adapter.
func TestChainKeys(t *testing.T) {
	const bs = 16
	toks := tokens(7000, 5*bs)
	for _, name := range []string{HashXXH3, HashSHA256, HashSHA256CBOR} {
		h, err := NewHashFunc(name, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, from := range []Digest{h.None(), h.Block(h.None(), tokens(1, bs))} {
			for _, lora := range []string{"", "sql-lora"} {
				for n := 0; n <= 5; n++ {
					want, wantKeys := from, []uint64{99}
					for i := range n {
						want = h.Keyed(want, toks[i*bs:(i+1)*bs], lora, "")
						wantKeys = append(wantKeys, want.Key())
					}
					got, keys := chainKeys(h, from, toks[:n*bs], bs, lora, []uint64{99})
					if got != want || !slices.Equal(keys, wantKeys) {
						t.Errorf("%s, adapter %q, %d blocks: got %x %v, want %x %v", name, lora, n, got, keys, want, wantKeys)
					}
				}
			}
		}
	}
}
