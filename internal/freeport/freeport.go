// Package freeport finds free loopback TCP ports for tests that hand a
// port to something that binds it later (a ZMQ socket), and runs of them,
// for a base port plus an offset (a data-parallel engine's rank r binds its
// KV-event and side-channel ports at base + r).
package freeport

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// Ports are picked below those Linux gives outgoing connections by
// default (net.ipv4.ip_local_port_range, 32768-60999): a port picked there
// can be taken, between the pick and the caller's bind, by any connection
// that any process opens; one below it only by a listener. (net.Listen on
// port 0 picks from that range; consecutive falls back to it when the
// ports below are taken.)
const lowFirst, lowLast = 20000, 32767

// Consecutive returns a port p on 127.0.0.1 such that p to p+n-1 were all
// free when it looked (it listens on each, holding them all, then closes
// them), below the ports the system gives outgoing connections; another
// process's listener may take one before the caller binds it. It fails tb
// after 100 tries.
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
	for try := range 100 {
		base := 0 // the system's pick, after 50 tries below its range
		if try < 50 {
			base = lowFirst + rand.IntN(lowLast-lowFirst+2-n)
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(base)))
		if err != nil {
			if base != 0 {
				continue
			}
			tb.Fatal(err)
		}
		ls := []net.Listener{l}
		base = l.Addr().(*net.TCPAddr).Port
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
