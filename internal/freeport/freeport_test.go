package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestConsecutive(t *testing.T) {
	for _, tc := range []struct {
		name string
		find func(testing.TB, int) int
		host string
	}{{"loopback", Consecutive, "127.0.0.1"}, {"any", ConsecutiveAny, ""}} {
		for _, n := range []int{1, 2, 4} {
			base := tc.find(t, n)
			for r := range n {
				l, err := net.Listen("tcp", net.JoinHostPort(tc.host, strconv.Itoa(base+r)))
				if err != nil {
					t.Fatalf("%s, n=%d: port %d (base %d + %d) is not free: %v", tc.name, n, base+r, base, r, err)
				}
				l.Close()
			}
		}
	}
}

// TestBelowOutgoing checks that the ports are picked below the system's
// range for outgoing connections, whose ephemeral ports could take them
// before the caller binds them.
func TestBelowOutgoing(t *testing.T) {
	for range 20 {
		for _, n := range []int{1, 3} {
			if p := Consecutive(t, n); p < lowFirst || p+n-1 > lowLast {
				t.Errorf("ports %d..%d, want them in %d..%d", p, p+n-1, lowFirst, lowLast)
			}
		}
	}
}
