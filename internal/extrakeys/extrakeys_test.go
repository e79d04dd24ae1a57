package extrakeys

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestAppendBlock: the entry's bytes are what a msgpack library writes for
// the array of the adapter's name and the salt (each only when non-empty),
// for each string form; with neither, nothing is appended (vLLM's None).
func TestAppendBlock(t *testing.T) {
	sizes := []int{0, 1, 31, 32, 255, 256, 65535, 65536}
	for _, nl := range sizes {
		for _, ns := range sizes {
			lora := strings.Repeat("l", nl)
			salt := strings.Repeat("é", ns/2) + strings.Repeat("s", ns%2)
			var tuple []string
			if lora != "" {
				tuple = append(tuple, lora)
			}
			if salt != "" {
				tuple = append(tuple, salt)
			}
			got := AppendBlock([]byte("x"), lora, salt)
			if tuple == nil {
				if string(got) != "x" {
					t.Errorf("no keys: appended % x", got[1:])
				}
				continue
			}
			want, err := msgpack.Marshal(tuple)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[1:], want) {
				t.Errorf("lora of %d bytes, salt of %d: % x..., want % x...", nl, len(salt), got[1:min(9, len(got))], want[:min(8, len(want))])
			}
		}
	}
}
