package signals

import (
	"errors"
	"fmt"
	"strings"
)

// zmq4 (v0.17.0) reads a ZMTP frame by allocating a buffer of the size its
// header announces and then reading the body into it: a peer that announces
// a frame of 2^62 bytes makes it panic (makeslice), one of a few GiB makes
// it allocate them, whatever the peer then sends. It also gathers the frames
// of a multipart message without bound. The subscriber's transports
// (zmqdial.go, zmqlisten.go) therefore pass every byte a peer sends through
// a zmtpScanner before zmq4 sees it, and fail the connection at the header
// of a frame over the limit, before its size reaches zmq4.

// DefaultMaxFrameSize is the default SubscriberConfig.MaxFrameSize: 64 MiB,
// far above any KV-event batch (vLLM publishes a batch per engine step, a
// few KiB to a few MiB) and any ZMTP command.
const DefaultMaxFrameSize = 64 << 20

const (
	// zmtpGreetingLen is the size of the ZMTP 3 greeting that starts the
	// stream each side sends.
	zmtpGreetingLen = 64
	zmtpFlagMore    = 0x1 // another frame of the same message follows
	zmtpFlagLong    = 0x2 // the size is 8 bytes, big-endian, not 1
	// zmtpFrameCost is what each frame counts toward its message's size on
	// top of its body (zmq4 keeps a slice header and more per frame), so
	// that a message of many empty frames is bounded too.
	zmtpFrameCost = 32
)

// errFrameTooLarge is wrapped by the error that fails a connection whose
// peer announced a frame or a message over the limit.
var errFrameTooLarge = errors.New("frame over the limit")

type zmtpScanState uint8

const (
	scanGreeting  zmtpScanState = iota // in the greeting
	scanFlags                          // at a frame's flags byte
	scanShortSize                      // at the 1-byte size
	scanLongSize                       // in the 8-byte size
	scanBody                           // in the body
)

// zmtpScanner follows the byte stream a ZMTP 3 peer sends (the 64-byte
// greeting, then frames: a flags byte, a 1- or 8-byte size, the body) and
// finds the first frame header that announces a frame larger than max, or
// one that takes its multipart message past max (each earlier frame of the
// message counting zmtpFrameCost bytes more than its body). It reads any chunking of the
// stream alike, skips bodies without looking at them and allocates nothing.
// The zero value is not usable: see newZMTPScanner. Not safe for concurrent
// use.
type zmtpScanner struct {
	max   uint64
	state zmtpScanState
	left  uint64 // bytes left in the greeting, the long size or the body
	size  uint64 // the current frame's size (as read so far, in a long size)
	more  bool   // the current frame has the MORE flag
	msg   uint64 // what the current message's earlier frames count
	// off counts the bytes accepted; frames the complete frames, and
	// firstEnd the offset just past the first one (0 until it is complete):
	// zmq4's handshake reads the greeting and that one frame (READY).
	off, frames, firstEnd uint64
	err                   error // sticky
}

// newZMTPScanner returns a scanner at the start of a stream that accepts
// frames and messages of up to max bytes.
func newZMTPScanner(max uint64) zmtpScanner {
	return zmtpScanner{max: max, left: zmtpGreetingLen}
}

// scan takes the next bytes of the stream and returns how many of them
// may be passed on. When b holds a frame header over the limit, it returns
// the bytes up to (not including) the last byte of that header's size, so
// that the size never reaches a reader, and an error that wraps
// errFrameTooLarge; every later call returns 0 and the same error.
func (s *zmtpScanner) scan(b []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	i := 0
	for i < len(b) {
		switch s.state {
		case scanGreeting:
			k := min(s.left, uint64(len(b)-i))
			i += int(k)
			s.left -= k
			if s.left == 0 {
				s.state = scanFlags
			}
		case scanFlags:
			f := b[i]
			i++
			s.more = f&zmtpFlagMore != 0
			s.size = 0
			if f&zmtpFlagLong != 0 {
				s.state, s.left = scanLongSize, 8
			} else {
				s.state = scanShortSize
			}
		case scanShortSize, scanLongSize:
			s.size = s.size<<8 | uint64(b[i])
			if s.state == scanLongSize {
				if s.left--; s.left > 0 {
					i++
					continue
				}
			}
			if err := s.check(); err != nil {
				s.off += uint64(i)
				s.err = err
				return i, err
			}
			i++
			s.state, s.left = scanBody, s.size
			if s.size == 0 {
				s.endFrame(uint64(i))
			}
		case scanBody:
			k := min(s.left, uint64(len(b)-i))
			i += int(k)
			if s.left -= k; s.left == 0 {
				s.endFrame(uint64(i))
			}
		}
	}
	s.off += uint64(len(b))
	return len(b), nil
}

// check reports an error when the frame whose size was just read is over
// the limit, alone or with its message's earlier frames.
func (s *zmtpScanner) check() error {
	switch {
	case s.size > s.max:
		return fmt.Errorf("zmtp: peer announced a frame of %d bytes, limit %d: %w", s.size, s.max, errFrameTooLarge)
	case s.msg > s.max-s.size: // s.msg+s.size > s.max, without overflow
		return fmt.Errorf("zmtp: peer announced a frame of %d bytes after %d bytes of the same message, limit %d: %w",
			s.size, s.msg, s.max, errFrameTooLarge)
	}
	return nil
}

// endFrame closes the current frame, which ended at offset i of the chunk
// being scanned.
func (s *zmtpScanner) endFrame(i uint64) {
	s.frames++
	if s.frames == 1 {
		s.firstEnd = s.off + i
	}
	if s.more {
		s.msg += s.size + zmtpFrameCost
	} else {
		s.msg = 0
	}
	s.state = scanFlags
}

// zmtpFlagCommand marks a command frame (READY, ERROR, ...).
const zmtpFlagCommand = 0x4

// readySocketType returns the Socket-Type property of the READY command
// that is the first frame after the greeting in b (a peer's side of the
// handshake: greeting, then the command), and false when b holds no
// well-formed READY command with that property. The command's body is
// its name (a length byte, "READY") then properties, each a name (a length
// byte, matched without regard to case) and a value (a 4-byte big-endian
// length).
func readySocketType(b []byte) (string, bool) {
	if len(b) < zmtpGreetingLen+2 {
		return "", false
	}
	b = b[zmtpGreetingLen:]
	flags := b[0]
	if flags&zmtpFlagCommand == 0 || flags&zmtpFlagMore != 0 {
		return "", false
	}
	var size uint64
	if flags&zmtpFlagLong != 0 {
		if len(b) < 9 {
			return "", false
		}
		for _, c := range b[1:9] {
			size = size<<8 | uint64(c)
		}
		b = b[9:]
	} else {
		size, b = uint64(b[1]), b[2:]
	}
	if size > uint64(len(b)) {
		return "", false
	}
	body := b[:size]
	if len(body) < 6 || body[0] != 5 || string(body[1:6]) != "READY" {
		return "", false
	}
	props := body[6:]
	for len(props) > 0 {
		n := int(props[0])
		if len(props) < 1+n+4 {
			return "", false
		}
		name := props[1 : 1+n]
		vl := uint64(props[1+n])<<24 | uint64(props[2+n])<<16 | uint64(props[3+n])<<8 | uint64(props[4+n])
		props = props[5+n:]
		if vl > uint64(len(props)) {
			return "", false
		}
		value := props[:vl]
		props = props[vl:]
		if strings.EqualFold(string(name), "Socket-Type") {
			return string(value), true
		}
	}
	return "", false
}
