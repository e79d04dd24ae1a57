package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var updateTrace = flag.Bool("update-trace", false, "re-encode data/conversation_trace.bin.gz from the shared Mooncake trace")

// sharedTrace is the upstream file the embedded trace was made from, and its
// sha256 (from shared/traces/README.md).
const (
	sharedTrace       = "../../shared/traces/conversation_trace.jsonl"
	sharedTraceSHA256 = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
)

func TestEmbeddedTraceIsTheMooncakeTrace(t *testing.T) {
	if *updateTrace {
		src, err := os.ReadFile(sharedTrace)
		if err != nil {
			t.Fatal(err)
		}
		enc, err := encodeCompactTrace(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("data", "conversation_trace.bin.gz"), enc, 0o644); err != nil {
			t.Fatal(err)
		}
		conversationTrace = enc
	}
	got, err := DefaultTraceJSONL()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(got)
	if h := hex.EncodeToString(sum[:]); h != sharedTraceSHA256 {
		t.Fatalf("decoded trace sha256: got %s, want %s", h, sharedTraceSHA256)
	}
	if src, err := os.ReadFile(sharedTrace); err == nil && !bytes.Equal(src, got) {
		t.Fatal("decoded trace differs from the shared file")
	}
	w, err := DefaultWorkload()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(w.Requests); n != 12031 {
		t.Fatalf("requests: got %d, want 12031", n)
	}
}

func TestCompactTraceRejectsNonCanonical(t *testing.T) {
	for _, in := range []string{
		`{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[0]}` + "\n",
		`{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n" + `{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [0]}` + "\n",
		`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}`,
		"not json\n",
	} {
		if _, err := encodeCompactTrace([]byte(in)); err == nil {
			t.Errorf("encodeCompactTrace(%q): got nil error, want one", in)
		}
	}
}

func FuzzDecodeCompactTrace(f *testing.F) {
	good, err := encodeCompactTrace([]byte(`{"timestamp": 3, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}` + "\n"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{0x1f, 0x8b})
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := decodeCompactTrace(data)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode to something that decodes the same.
		enc, err := encodeCompactTrace(out)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := decodeCompactTrace(enc)
		if err != nil || !bytes.Equal(back, out) {
			t.Fatalf("round trip: %v", err)
		}
	})
}
