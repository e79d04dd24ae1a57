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

// TestLoopback checks that Loopback's port is free (it can be listened on)
// and below the system's range for outgoing connections, where their
// ephemeral ports cannot take it.
func TestLoopback(t *testing.T) {
	for range 20 {
		p := Loopback(t)
		if p < lowFirst || p > lowLast {
			t.Errorf("port %d, want one in %d..%d", p, lowFirst, lowLast)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
}
