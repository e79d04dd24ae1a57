package proxy

import "sync"

// maxPooledPrompt bounds the prompt buffers kept for reuse: a rare huge
// prompt is left to the garbage collector rather than pinned in the pool.
const maxPooledPrompt = 1 << 20

// promptBuffers recycles the storage of canonical prompts across requests
// (openai.ParseRequestInto). A prompt is as large as the request body, and
// allocating one per request was a third of the proxy's garbage.
var promptBuffers = slicePool{max: maxPooledPrompt}

// slicePool is a sync.Pool of byte slices up to max bytes of capacity.
type slicePool struct {
	p   sync.Pool
	max int
}

// get returns an empty slice, with the capacity of a recycled one if any.
func (s *slicePool) get() []byte {
	if v, ok := s.p.Get().(*[]byte); ok {
		return (*v)[:0]
	}
	return nil
}

// put recycles b's storage; the caller must not use b afterwards.
func (s *slicePool) put(b []byte) {
	if cap(b) == 0 || cap(b) > s.max {
		return
	}
	b = b[:0]
	s.p.Put(&b)
}
