package policy

import (
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute"
)

// RoundRobin cycles through the healthy candidates in order, skipping the
// unhealthy ones. It takes no params. Not safe for concurrent use.
type RoundRobin struct {
	buf  scoreBuf // explanation buffers, reused
	next int      // position of the next pick, modulo the candidate count
}

var _ kvroute.Picker = (*RoundRobin)(nil)

func newRoundRobin(params map[string]any, _ uint64) (*RoundRobin, error) {
	if err := decodeParams(NameRoundRobin, params, &struct{}{}); err != nil {
		return nil, err
	}
	return &RoundRobin{}, nil
}

// Pick implements kvroute.Picker.
func (p *RoundRobin) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	scores := p.buf.get(cands, 0)
	n := len(cands)
	for k := 0; k < n; k++ {
		i := (p.next + k) % n
		if cands[i].Healthy {
			p.next = (i + 1) % n
			return chose(NameRoundRobin, cands, i, "next in turn", scores)
		}
	}
	return noneHealthy(NameRoundRobin, cands, scores)
}

// Random picks a healthy candidate uniformly at random from its seeded
// generator. It takes no params. Not safe for concurrent use.
type Random struct {
	buf scoreBuf // explanation buffers, reused
	rng *rand.Rand
	idx []int // scratch: healthy indexes
}

var _ kvroute.Picker = (*Random)(nil)

func newRandom(params map[string]any, seed uint64) (*Random, error) {
	if err := decodeParams(NameRandom, params, &struct{}{}); err != nil {
		return nil, err
	}
	return &Random{rng: newRand(seed)}, nil
}

// Pick implements kvroute.Picker.
func (p *Random) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	scores := p.buf.get(cands, 0)
	p.idx = healthyIdx(p.idx[:0], cands)
	if len(p.idx) == 0 {
		return noneHealthy(NameRandom, cands, scores)
	}
	return chose(NameRandom, cands, p.idx[p.rng.IntN(len(p.idx))], "uniform random", scores)
}

// LeastRequest picks the healthy candidate with the fewest requests the
// router holds open to it (Load.InFlight, always fresh), breaking ties at
// random (as Envoy's least_request does). It takes no params. Not safe for
// concurrent use.
type LeastRequest struct {
	buf scoreBuf // explanation buffers, reused
	rng *rand.Rand
	idx []int
}

var _ kvroute.Picker = (*LeastRequest)(nil)

func newLeastRequest(params map[string]any, seed uint64) (*LeastRequest, error) {
	if err := decodeParams(NameLeastRequest, params, &struct{}{}); err != nil {
		return nil, err
	}
	return &LeastRequest{rng: newRand(seed)}, nil
}

// Pick implements kvroute.Picker.
func (p *LeastRequest) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	scores := p.buf.get(cands, 1)
	best := -1
	p.idx = p.idx[:0]
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		f := cands[i].Load.InFlight
		scores[i].Value = float64(f)
		scores[i].Parts = append(scores[i].Parts, kvroute.Part{Name: "in_flight", Value: float64(f)})
		switch {
		case best < 0 || f < best:
			best = f
			p.idx = append(p.idx[:0], i)
		case f == best:
			p.idx = append(p.idx, i)
		}
	}
	if len(p.idx) == 0 {
		return noneHealthy(NameLeastRequest, cands, scores)
	}
	return chose(NameLeastRequest, cands, p.idx[p.rng.IntN(len(p.idx))], "fewest in-flight", scores)
}

// PowerOfTwo draws two distinct healthy candidates at random and keeps the
// one with fewer in-flight requests, then the shorter engine queue
// (Load.Queue), then the first drawn (Azar et al., "Balanced Allocations";
// SGLang's power_of_two compares in-flight counts the same way). It takes no
// params. Not safe for concurrent use.
type PowerOfTwo struct {
	buf scoreBuf // explanation buffers, reused
	rng *rand.Rand
	idx []int
}

var _ kvroute.Picker = (*PowerOfTwo)(nil)

func newPowerOfTwo(params map[string]any, seed uint64) (*PowerOfTwo, error) {
	if err := decodeParams(NamePowerOfTwo, params, &struct{}{}); err != nil {
		return nil, err
	}
	return &PowerOfTwo{rng: newRand(seed)}, nil
}

// Pick implements kvroute.Picker.
func (p *PowerOfTwo) Pick(_ time.Time, _ *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	scores := p.buf.get(cands, 2)
	p.idx = healthyIdx(p.idx[:0], cands)
	for _, i := range p.idx {
		l := &cands[i].Load
		scores[i].Value = float64(l.InFlight)
		scores[i].Parts = append(scores[i].Parts,
			kvroute.Part{Name: "in_flight", Value: float64(l.InFlight)},
			kvroute.Part{Name: "queue", Value: float64(l.Queue())})
	}
	switch len(p.idx) {
	case 0:
		return noneHealthy(NamePowerOfTwo, cands, scores)
	case 1:
		return chose(NamePowerOfTwo, cands, p.idx[0], "only healthy candidate", scores)
	}
	a, b := pickTwo(p.rng, p.idx)
	if lessLoaded(&cands[b].Load, &cands[a].Load) {
		a = b
	}
	return chose(NamePowerOfTwo, cands, a, "less loaded of two random", scores)
}

// lessLoaded orders loads by in-flight count, then engine queue.
func lessLoaded(x, y *kvroute.Load) bool {
	if x.InFlight != y.InFlight {
		return x.InFlight < y.InFlight
	}
	return x.Queue() < y.Queue()
}

func healthyIdx(dst []int, cands []kvroute.Candidate) []int {
	for i := range cands {
		if cands[i].Healthy {
			dst = append(dst, i)
		}
	}
	return dst
}
