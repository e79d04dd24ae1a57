package router

import (
	"testing"
	"time"
)

// TestWriteLog: the log keeps the writes a cache of capBlocks holds,
// oldest first: a write past the room drops the oldest ones (a write
// larger than the cache stays, alone), writes older
// than the TTL go at the next add or trim, and reset forgets them all.
// The front is reused once most of the slice is dropped.
func TestWriteLog(t *testing.T) {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	const capBlocks, ttl = 10, time.Minute
	var l writeLog
	check := func(step string, room int, oldest time.Time) {
		t.Helper()
		if got := l.room(capBlocks); got != room {
			t.Errorf("%s: room %d, want %d", step, got, room)
		}
		if got := l.oldest(); !got.Equal(oldest) {
			t.Errorf("%s: oldest %v, want %v", step, got, oldest)
		}
	}
	check("empty", 10, time.Time{})
	l.add(at(0), 4, capBlocks, ttl)
	l.add(at(1), 0, capBlocks, ttl) // nothing written
	l.add(at(2), 4, capBlocks, ttl)
	check("8 blocks", 2, at(0))
	l.add(at(3), 3, capBlocks, ttl) // 11 > 10: the first write goes
	check("past the room", 3, at(2))
	l.add(at(4), 12, capBlocks, ttl) // larger than the cache: it alone fills it
	check("a write larger than the cache", -2, at(4))
	l.add(at(10), 2, capBlocks, ttl)
	check("a write after it", 8, at(10))
	l.trim(at(71), capBlocks, ttl) // 61s old
	check("past the TTL", 10, time.Time{})
	for i := range 100 {
		l.add(at(100+i), 1, capBlocks, ttl)
	}
	check("100 writes of 1", 0, at(190))
	if len(l.w)-l.start != 10 || cap(l.w) > 128 {
		t.Errorf("100 writes of 1 into 10 blocks: %d kept in a slice of %d (cap %d), want 10, the front reused", len(l.w)-l.start, len(l.w), cap(l.w))
	}
	l.reset()
	check("reset", 10, time.Time{})
}
