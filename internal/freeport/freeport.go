// Package freeport finds runs of free loopback TCP ports, for tests that
// start something binding a base port plus an offset (a data-parallel
// engine's rank r binds its KV-event and side-channel ports at base + r).
package freeport

import (
	"net"
	"strconv"
	"testing"
)

// Consecutive returns a port p on 127.0.0.1 such that p to p+n-1 were all
// free when it looked (it listens on each, holding them all, then closes
// them); another process may take one before the caller binds it. It
// fails tb after 50 tries.
func Consecutive(tb testing.TB, n int) int {
	tb.Helper()
	return consecutive(tb, "127.0.0.1", n)
}

// ConsecutiveAny is Consecutive for ports free on every interface, for
// what binds a wildcard address (tcp://*:port).
func ConsecutiveAny(tb testing.TB, n int) int {
	tb.Helper()
	return consecutive(tb, "", n)
}

func consecutive(tb testing.TB, host string, n int) int {
	tb.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			tb.Fatal(err)
		}
		ls := []net.Listener{l}
		base := l.Addr().(*net.TCPAddr).Port
		for r := 1; r < n; r++ {
			if l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(base+r))); err == nil {
				ls = append(ls, l)
			}
		}
		for _, l := range ls {
			l.Close()
		}
		if len(ls) == n {
			return base
		}
	}
	tb.Fatalf("no %d consecutive free ports", n)
	return 0
}
