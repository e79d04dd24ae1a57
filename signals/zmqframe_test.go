package signals

import (
	"encoding/binary"
	"errors"
	"testing"
)

// zmtpFrame encodes one ZMTP 3 frame as the wire carries it: flags, a
// 1-byte size (or an 8-byte one, with long) and the body.
func zmtpFrame(flags byte, long bool, body []byte) []byte {
	if long {
		b := []byte{flags | zmtpFlagLong, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
		return append(b, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

// zmtpLongHeader is the header of a long frame announcing size bytes.
func zmtpLongHeader(flags byte, size uint64) []byte {
	b := []byte{flags | zmtpFlagLong, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint64(b[1:], size)
	return b
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// refScan is the naive reference for zmtpScanner: it parses a whole stream
// at once and returns how many bytes pass (up to the last size byte of the
// first header over the limit), whether such a header was found, and the
// number of complete frames before it.
func refScan(b []byte, max uint64) (pass int, over bool, frames uint64) {
	if len(b) < zmtpGreetingLen {
		return len(b), false, 0
	}
	pos, msg := zmtpGreetingLen, uint64(0)
	for pos < len(b) {
		flags := b[pos]
		pos++
		var size uint64
		var last int // the size's last byte
		if flags&zmtpFlagLong != 0 {
			if pos+8 > len(b) {
				return len(b), false, frames
			}
			size, last = binary.BigEndian.Uint64(b[pos:pos+8]), pos+7
			pos += 8
		} else {
			if pos >= len(b) {
				return len(b), false, frames
			}
			size, last = uint64(b[pos]), pos
			pos++
		}
		// Compared in big.Int-free form: size > max or msg+size > max.
		if size > max || msg > max-size {
			return last, true, frames
		}
		if uint64(len(b)-pos) < size {
			return len(b), false, frames
		}
		pos += int(size)
		frames++
		if flags&zmtpFlagMore != 0 {
			msg += size + zmtpFrameCost
		} else {
			msg = 0
		}
	}
	return len(b), false, frames
}

// scanChunks feeds b to a new scanner in chunks of the sizes cuts gives in
// turn (each at least 1) and returns what passed, the error and the frames.
func scanChunks(b []byte, max uint64, cuts []byte) (int, uint64, error) {
	s := newZMTPScanner(max)
	pass := 0
	for i, c := 0, 0; i < len(b); c++ {
		n := len(b) - i
		if len(cuts) > 0 {
			n = min(n, int(cuts[c%len(cuts)])+1)
		}
		k, err := s.scan(b[i : i+n])
		pass += k
		if err != nil {
			if k2, err2 := s.scan(b[i+k:]); k2 != 0 || err2 != err {
				return pass, s.frames, errors.New("error not sticky")
			}
			return pass, s.frames, err
		}
		if k != n {
			return pass, s.frames, errors.New("short count without an error")
		}
		i += n
	}
	return pass, s.frames, nil
}

func TestZMTPScanner(t *testing.T) {
	g := zmtpNullGreeting[:]
	ready := zmtpFrame(0x04, false, []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB"))
	const max = 1000
	for _, tc := range []struct {
		name   string
		in     []byte
		pass   int // bytes that pass; len(in) when none is over the limit
		over   bool
		frames uint64
	}{
		{"greeting only", g, 64, false, 0},
		{"partial greeting", g[:10], 10, false, 0},
		{"handshake and a message", cat(g, ready, zmtpFrame(1, false, []byte("topic")), zmtpFrame(0, true, make([]byte, 300))),
			64 + len(ready) + 7 + 309, false, 3},
		{"frame of exactly max", cat(g, zmtpFrame(0, true, make([]byte, max))), 64 + 9 + max, false, 1},
		{"frame of max+1", cat(g, zmtpLongHeader(0, max+1), make([]byte, 10)), 64 + 8, true, 0},
		{"frame of 2^62", cat(g, ready, zmtpLongHeader(0, 1<<62)), 64 + len(ready) + 8, true, 1},
		{"frame of 2^64-1", cat(g, zmtpLongHeader(0, 1<<64-1)), 64 + 8, true, 0},
		{"header cut before its size", cat(g, zmtpLongHeader(0, 1<<62)[:5]), 64 + 5, false, 0},
		// 600 + 32 + 400 > 1000: the second frame's size byte is held back.
		{"message over max", cat(g, zmtpFrame(1, true, make([]byte, 600)), zmtpFrame(0, true, make([]byte, 400))),
			64 + 609 + 8, true, 1},
		{"two messages under max each", cat(g, zmtpFrame(0, true, make([]byte, 600)), zmtpFrame(0, true, make([]byte, 600))),
			64 + 2*609, false, 2},
		// Empty frames with MORE count 32 bytes each: the 32nd takes the
		// message to 992, and a 9-byte frame after it is over.
		{"many empty frames", cat(g, bytesRepeat([]byte{1, 0}, 31), []byte{0, 9}), 64 + 62 + 1, true, 31},
		{"short frame of max 255 under a small limit", cat(g, zmtpFrame(0, false, make([]byte, 255))), 64 + 257, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if p, over, fr := refScan(tc.in, max); p != tc.pass || over != tc.over || fr != tc.frames {
				t.Fatalf("reference: got %d bytes, over %v, %d frames; want %d, %v, %d", p, over, fr, tc.pass, tc.over, tc.frames)
			}
			for _, cuts := range [][]byte{nil, {0}, {1, 6, 0, 60}} {
				pass, frames, err := scanChunks(tc.in, max, cuts)
				if pass != tc.pass || (err != nil) != tc.over || frames != tc.frames {
					t.Errorf("chunks %v: got %d bytes, err %v, %d frames; want %d, over %v, %d", cuts, pass, err, frames, tc.pass, tc.over, tc.frames)
				}
				if err != nil && !errors.Is(err, errFrameTooLarge) {
					t.Errorf("chunks %v: error %v does not wrap errFrameTooLarge", cuts, err)
				}
			}
		})
	}
}

func bytesRepeat(b []byte, n int) []byte {
	var out []byte
	for range n {
		out = append(out, b...)
	}
	return out
}

// TestZMTPScannerFirstEnd: firstEnd marks the end of the greeting and the
// first frame (zmq4's handshake), however the stream is cut.
func TestZMTPScannerFirstEnd(t *testing.T) {
	ready := zmtpFrame(0x04, false, []byte("\x05READY"))
	in := cat(zmtpNullGreeting[:], ready, zmtpFrame(0, false, []byte("x")))
	for cut := 1; cut < len(in); cut++ {
		s := newZMTPScanner(DefaultMaxFrameSize)
		for i := 0; i < len(in); i += cut {
			if _, err := s.scan(in[i:min(i+cut, len(in))]); err != nil {
				t.Fatal(err)
			}
		}
		if got, want := s.firstEnd, uint64(64+len(ready)); got != want || s.frames != 2 {
			t.Fatalf("cut %d: firstEnd %d, frames %d; want %d, 2", cut, got, s.frames, want)
		}
	}
}

// FuzzZMTPScanner checks the scanner against the naive reference on any
// stream, cut into chunks as cuts says.
func FuzzZMTPScanner(f *testing.F) {
	g := zmtpNullGreeting[:]
	f.Add(cat(g, zmtpFrame(4, false, []byte("\x05READY"))), []byte{3, 0, 200}, uint16(1000))
	f.Add(cat(g, zmtpLongHeader(0, 1<<62)), []byte{}, uint16(1000))
	f.Add(cat(g, zmtpFrame(1, true, make([]byte, 600)), zmtpFrame(0, true, make([]byte, 300))), []byte{7}, uint16(900))
	f.Add(cat(g, bytesRepeat([]byte{1, 0}, 40)), []byte{0, 1}, uint16(1000))
	f.Fuzz(func(t *testing.T, in, cuts []byte, max16 uint16) {
		max := uint64(max16)
		wantPass, wantOver, wantFrames := refScan(in, max)
		pass, frames, err := scanChunks(in, max, cuts)
		if err != nil && !errors.Is(err, errFrameTooLarge) {
			t.Fatalf("error %v", err)
		}
		if pass != wantPass || (err != nil) != wantOver || frames != wantFrames {
			t.Fatalf("got %d bytes, err %v, %d frames; reference %d, over %v, %d", pass, err, frames, wantPass, wantOver, wantFrames)
		}
	})
}
