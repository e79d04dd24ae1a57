package extrakeys

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestAppendCacheSalt: the entry's bytes are what a msgpack library writes
// for a 1-element array of the string, for each string form.
func TestAppendCacheSalt(t *testing.T) {
	for _, n := range []int{0, 1, 31, 32, 255, 256, 65535, 65536} {
		salt := strings.Repeat("é", n/2) + strings.Repeat("s", n%2)
		want, err := msgpack.Marshal([]string{salt})
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendCacheSalt(nil, salt); !bytes.Equal(got, want) {
			t.Errorf("salt of %d bytes: % x..., want % x...", len(salt), got[:min(8, len(got))], want[:min(8, len(want))])
		}
	}
}
