package router

import "time"

// writeLog is the router's record of what its dispatches wrote into an
// endpoint's KV cache when the endpoint publishes KV events: the blocks
// each request brought that the engine did not hold (its prefix match
// from the events), oldest first, no more than the cache holds. It tells
// the cache's room and turnover (kvroute.Candidate.Evicts and Horizon) as
// the approximate index tells them for an endpoint without events, at a
// fraction of the cost: the prefix matches are the engine's, so the
// blocks need not be recorded one by one. A block a later request hits
// stays in the log at the age of its write (the engine's LRU would keep
// it longer): the horizon errs short.
type writeLog struct {
	w     []write // w[start:] are the writes still in the cache
	start int
	sum   int // blocks in w[start:]
}

type write struct {
	at     time.Time
	blocks int
}

// add records blocks written at now into a cache of capBlocks blocks,
// dropping the oldest writes the cache has no room left for, and those
// older than ttl (the approximate index's TTL).
func (l *writeLog) add(now time.Time, blocks, capBlocks int, ttl time.Duration) {
	if blocks <= 0 {
		return
	}
	l.w = append(l.w, write{at: now, blocks: blocks})
	l.sum += blocks
	l.trim(now, capBlocks, ttl)
}

// trim drops the writes past capBlocks, but for the last one (a write
// larger than the cache fills it), and those older than ttl.
func (l *writeLog) trim(now time.Time, capBlocks int, ttl time.Duration) {
	for l.start < len(l.w) && (l.sum > capBlocks && l.start < len(l.w)-1 || now.Sub(l.w[l.start].at) > ttl) {
		l.sum -= l.w[l.start].blocks
		l.start++
	}
	if l.start > 32 && l.start*2 > len(l.w) { // reuse the front
		n := copy(l.w, l.w[l.start:])
		l.w, l.start = l.w[:n], 0
	}
}

// room returns the blocks a cache of capBlocks has left before a write
// evicts (below 0 when its last write was larger than the cache).
func (l *writeLog) room(capBlocks int) int { return capBlocks - l.sum }

// oldest returns the time of the least recent write still in the cache
// (the zero Time when there is none).
func (l *writeLog) oldest() time.Time {
	if l.start == len(l.w) {
		return time.Time{}
	}
	return l.w[l.start].at
}

// reset forgets every write (the engine's cache was reset).
func (l *writeLog) reset() { l.w, l.start, l.sum = l.w[:0], 0, 0 }
