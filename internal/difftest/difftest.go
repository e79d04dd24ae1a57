// Package difftest describes how two texts differ, for test failures that
// compare a whole output (a golden file, a metrics exposition) with another.
package difftest

import (
	"bytes"
	"fmt"
)

// FirstLine returns the first line in which got and want differ, with its
// number, or "" when they are equal.
func FirstLine(got, want []byte) string {
	gl, wl := bytes.Split(got, []byte("\n")), bytes.Split(want, []byte("\n"))
	for i := range max(len(gl), len(wl)) {
		var g, w []byte
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if !bytes.Equal(g, w) {
			return fmt.Sprintf("line %d:\n got %s\nwant %s", i+1, g, w)
		}
	}
	return ""
}
