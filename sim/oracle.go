package sim

// oracle computes the upper bound on the prefix-cache hit rate for a
// request stream: an infinite cache shared by the whole fleet (perfect
// affinity), where every block seen before anywhere is a hit. Blocks are
// chained hashes, so a block is a hit only if its whole prefix was seen.
//
// Like vLLM, at least the prompt's last token is always computed: a prompt
// of L tokens can hit at most (L-1)/blockSize full blocks.
type oracle struct {
	seen map[uint64]struct{}
	// queried and hit count prompt tokens.
	queried, hit int64
}

func newOracle() *oracle { return &oracle{seen: make(map[uint64]struct{}, 1<<16)} }

// observe records a request's prompt (its chained full-block hashes at
// blockSize tokens per block, and its length) and returns the tokens the
// oracle would have served from cache.
func (o *oracle) observe(hashes []uint64, blockSize, promptLen int) int {
	limit := len(hashes)
	if blockSize > 0 {
		if m := (promptLen - 1) / blockSize; m < limit {
			limit = max(m, 0)
		}
	}
	n := 0
	for n < limit {
		if _, ok := o.seen[hashes[n]]; !ok {
			break
		}
		n++
	}
	for _, h := range hashes[n:] {
		o.seen[h] = struct{}{}
	}
	hit := n * blockSize
	o.queried += int64(promptLen)
	o.hit += int64(hit)
	return hit
}

// rate returns the token hit rate so far (0 when nothing was queried).
func (o *oracle) rate() float64 {
	if o.queried == 0 {
		return 0
	}
	return float64(o.hit) / float64(o.queried)
}
