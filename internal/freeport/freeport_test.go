package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestConsecutive(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		base := Consecutive(t, n)
		for r := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+r))
			if err != nil {
				t.Fatalf("n=%d: port %d (base %d + %d) is not free: %v", n, base+r, base, r, err)
			}
			l.Close()
		}
	}
}
