package emulator

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/engine"
)

// stream carries one request's progress from the engine loop to its HTTP
// handler. The loop appends tokens and sets the final state under mu and
// signals ch (capacity 1, so signals coalesce); the handler takes what
// accumulated when it wakes. Handlers of non-streaming requests are
// signalled only when the request finishes (every 0).
type stream struct {
	// Owned by the engine loop, and read or written for every token (deliver):
	// first, in one cache line (a busy fleet's steps miss the cache on each
	// line of each running request): the engine request id, tokens not yet
	// handed to the handler, tokens generated (EOS included), the count
	// since the handler was last woken, and how often it is woken before
	// the request finishes: 0 never, 1 at every token (stop strings;
	// streaming), n at the first token and then every n tokens (streaming
	// with --stream-interval n).
	id    string
	pend  []uint32
	gen   int
	since int
	every int
	// Also owned by the loop: whether the handler was ever woken, and the
	// cached prompt tokens. (The object is 256 bytes, a size class whose
	// objects start on a cache line.)
	notified  bool
	holdKV    bool // P/D prefill leg: grant a lease when finished
	cached    int
	leaseKey  string // key of that lease
	maxTokens int
	ch        chan struct{}
	aborted   atomic.Bool // the handler gave up (client gone)
	// loads gets the P/D decode leg's admission, when its KV is to be
	// moved (Server.startLoads; capacity 1); nil for other requests.
	loads chan engine.KVLoad

	mu           sync.Mutex // protects the fields below
	toks         []uint32   // generated tokens not yet taken (EOS excluded)
	generated    int        // tokens generated so far (EOS included)
	finished     bool
	finishReason string
	stop         *stopState // a request with stop strings' accounting; nil without
	promptTokens int
	cachedTokens int
	blockIDs     []int // held blocks (holdKV)
	err          error // the request failed (Add error, engine stopped)
}

// stopState is the accounting of a request with stop strings, guarded by
// its stream's mu. vLLM counts a request's generated tokens, and records
// its finish, where it also matches the stop strings (the front end's
// output processor, step by step): outputs the engine produced after the
// step whose tokens completed a match (before its abort arrived) belong
// to a request already gone there, and are not counted. The emulator's
// handler matches them, as often after the engine ran ahead, so it counts
// them (counted) and the loop leaves them out of the engine's count
// (snapshot.stopGen).
type stopState struct {
	m       *metrics // of the engine that runs the request; set when it is added
	match   string   // the stop string that ended the request; "" until one did
	counted int      // tokens counted in m.stopCounted (searched, up to the match)
	// fin is the request's finish when the engine finished it before its
	// handler searched its last tokens: recorded by the handler then,
	// with the tokens up to a match and "stop" if one is found.
	fin *finishObs
	// itls are the inter-token latencies of the request's tokens after
	// the first, in order, appended by the loop. vLLM observes those of
	// the tokens it counted (up to the match), so they are recorded with
	// the finish, the first counted-1 of them (takeITLs).
	itls []time.Duration
	// held are the request's outputs whose step's iteration_tokens_total
	// observation waits for the handler to search their tokens (the loop
	// appends them, holdIter; the handler takes those it decided,
	// takeHeld), in order.
	held []iterOut
}

// takeHeld appends to dst, and removes, the held outputs the handler's
// search decided: those of the tokens it searched (ss.counted), or all
// when it searched the last or matched (final). Their step's counts are
// decided with metrics.decideIter, under the metrics' lock, which the loop
// holds while it holds st.mu: dst is the handler's, and the loop's later
// appends do not touch it. The caller holds the stream's mu.
func (ss *stopState) takeHeld(dst []iterOut, final bool) []iterOut {
	k := len(ss.held)
	if !final {
		k = 0
		for k < len(ss.held) && ss.held[k].index < ss.counted {
			k++
		}
	}
	dst = append(dst, ss.held[:k]...)
	n := copy(ss.held, ss.held[k:])
	clear(ss.held[n:])
	ss.held = ss.held[:n]
	return dst
}

// takeITLs returns the inter-token latencies of the first counted tokens
// of a request with stop strings (those vLLM counted), to be recorded with
// metrics.observeLatencies, and forgets them all. The caller holds the
// stream's mu.
func (ss *stopState) takeITLs(counted int) []time.Duration {
	d := ss.itls[:min(len(ss.itls), max(0, counted-1))]
	ss.itls = nil
	return d
}

// newStream returns the stream of a request. A whole response (every 0)
// collects no tokens: its handler recomputes them with the engine's
// Sampler when the request finished (tokens), so the loop only counts
// them.
func newStream(id string, every int, maxTokens int) *stream {
	return &stream{id: id, every: every, maxTokens: maxTokens, ch: make(chan struct{}, 1)}
}

// toksPool recycles the token buffers of whole responses: the handler
// takes one when its request finished, fills it with the request's tokens
// and puts it back when it is done. Buffers over maxPooledToks tokens are
// dropped.
var toksPool = sync.Pool{New: func() any { return new([]uint32) }}

const maxPooledToks = 1 << 16

func getToks() *[]uint32 { return toksPool.Get().(*[]uint32) }

func putToks(b *[]uint32) {
	if cap(*b) > maxPooledToks {
		return
	}
	*b = (*b)[:0]
	toksPool.Put(b)
}

func (st *stream) signal() {
	select {
	case st.ch <- struct{}{}:
	default:
	}
}

// fail ends the stream with err unless it already finished.
func (st *stream) fail(err error) {
	st.mu.Lock()
	if !st.finished {
		st.finished = true
		st.err = err
	}
	st.mu.Unlock()
	st.signal()
}

func (st *stream) isAborted() bool { return st.aborted.Load() }

// progress is what the handler took from a stream at one wake-up.
type progress struct {
	toks         []uint32
	generated    int
	finished     bool
	finishReason string
	promptTokens int
	cachedTokens int
	blockIDs     []int
	err          error
}

// take moves the pending tokens into buf (reusing it) and returns the
// stream's state.
func (st *stream) take(buf []uint32) progress {
	st.mu.Lock()
	p := progress{toks: st.toks, generated: st.generated, finished: st.finished, finishReason: st.finishReason,
		promptTokens: st.promptTokens, cachedTokens: st.cachedTokens, blockIDs: st.blockIDs, err: st.err}
	st.toks = buf[:0]
	st.mu.Unlock()
	return p
}
