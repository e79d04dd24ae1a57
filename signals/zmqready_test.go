package signals

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
)

// TestReadySocketType reads the Socket-Type of a peer's READY command from
// the bytes a listening socket receives (greeting, then the command), in
// the forms ZMTP allows, and refuses what is not a well-formed READY.
func TestReadySocketType(t *testing.T) {
	g := wireGreeting
	readyWith := func(props ...[2]string) []byte {
		body := []byte("\x05READY")
		for _, p := range props {
			body = append(body, byte(len(p[0])))
			body = append(body, p[0]...)
			body = binary.BigEndian.AppendUint32(body, uint32(len(p[1])))
			body = append(body, p[1]...)
		}
		return body
	}
	short := func(body []byte) []byte { return append([]byte{0x04, byte(len(body))}, body...) }
	long := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint64([]byte{0x06}, uint64(len(body))), body...)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
		ok   bool
	}{
		{"PUB", slices.Concat(g, wireReady("PUB")), "PUB", true},
		{"SUB, then a message", slices.Concat(g, wireReady("SUB"), []byte{0, 1, 'x'}), "SUB", true},
		{"identity first", slices.Concat(g, short(readyWith([2]string{"Identity", "e1"}, [2]string{"Socket-Type", "XPUB"}))), "XPUB", true},
		{"name in another case", slices.Concat(g, short(readyWith([2]string{"socket-type", "PUB"}))), "PUB", true},
		{"long size", slices.Concat(g, long(readyWith([2]string{"Socket-Type", "PUB"}))), "PUB", true},
		{"no socket type", slices.Concat(g, short(readyWith([2]string{"Identity", ""}))), "", false},
		{"not a command", slices.Concat(g, []byte{0x00}, wireReady("PUB")[1:]), "", false},
		{"another command", slices.Concat(g, short([]byte("\x05ERROR\x03bad"))), "", false},
		{"truncated frame", slices.Concat(g, wireReady("PUB"))[:len(g)+10], "", false},
		{"value past the body", slices.Concat(g, short([]byte("\x05READY\x0bSocket-Type\x00\x00\x00\x09PUB"))), "", false},
		{"greeting only", g, "", false},
		{"nothing", nil, "", false},
	} {
		got, ok := readySocketType(tc.b)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: got %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzReadySocketType: any bytes are read without a panic, and a socket
// type found is a part of the input.
func FuzzReadySocketType(f *testing.F) {
	f.Add(slices.Concat(wireGreeting, wireReady("PUB")))
	f.Add(slices.Concat(wireGreeting, []byte{0x06, 0, 0, 0, 0, 0, 0, 0, 6}, []byte("\x05READY")))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, ok := readySocketType(b)
		if !ok && st != "" {
			t.Fatalf("not ok, but socket type %q", st)
		}
		if ok && !bytes.Contains(b, []byte(st)) {
			t.Fatalf("socket type %q is not in the input", st)
		}
	})
}

// TestSubscriberListenIgnoresNonPublishers: on a listening subscriber, a
// peer that completes its handshake as another socket type than a
// publisher (here a SUB) is closed at once and does not pass for an
// engine's reconnection: the engine's entries stay (without replay, a
// reconnection drops them).
func TestSubscriberListenIgnoresNonPublishers(t *testing.T) {
	eng := newFakeEngine(t, false, EventEncoding{})
	h := startListenSub(t, nil)
	eng.dialPubTo(h.addr)
	eng.waitSubscribed()
	eng.publish(false, stored(0, 3))
	h.waitSeq(t, 0)
	if got := matchedOn(h.idx, prompt); got != 3 {
		t.Fatalf("engine: matched %d blocks, want 3", got)
	}

	p := dialRaw(t, h.addr)
	p.write(wireGreeting, wireReady("SUB"))
	p.waitClosed("the SUB peer")

	// The subscriber handles a connection before the batches after it: once
	// the next batch is applied, any check the peer set off is done.
	eng.publish(false, stored(3, 6))
	h.waitSeq(t, 1)
	if got := matchedOn(h.idx, prompt); got != 6 {
		t.Fatalf("after a SUB peer's visit: matched %d blocks, want 6 (the engine's entries dropped as on its reconnection?)", got)
	}
}
