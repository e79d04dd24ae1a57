package policy

import (
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute"
)

// RoundRobin cycles through the healthy candidates in order, skipping the
// unhealthy ones. When the healthy candidates' weights
// (kvroute.Endpoint.Weight) differ, it is nginx's smooth weighted round
// robin instead: each pick adds every healthy candidate's weight to its
// current weight, takes the candidate with the highest (the first on a
// tie) and subtracts the healthy weights' total from it, so weights 1:2:1
// give B A C B, B A C B, ...: exactly the weights' shares in every cycle
// of their sum, spread out rather than in runs. The current weights are
// kept per candidate position and start again from zero when the
// candidates (their IDs, in order) change. With equal weights it is the
// plain rotation. It takes no params. Not safe for concurrent use.
type RoundRobin struct {
	buf  scoreBuf // explanation buffers, reused
	next int      // position of the next pick, modulo the candidate count
	// cur holds the smooth weighted round robin's current weight per
	// candidate position, for the candidates named by ids.
	cur []int64
	ids []string
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
	if !equalWeights(cands) {
		return p.pickWeighted(cands, scores)
	}
	for k := 0; k < n; k++ {
		i := (p.next + k) % n
		if cands[i].Healthy {
			p.next = (i + 1) % n
			return chose(NameRoundRobin, cands, i, "next in turn", scores)
		}
	}
	return noneHealthy(NameRoundRobin, cands, scores)
}

// pickWeighted is Pick's smooth weighted round robin (see RoundRobin).
func (p *RoundRobin) pickWeighted(cands []kvroute.Candidate, scores []kvroute.Score) kvroute.Decision {
	n := len(cands)
	same := len(p.ids) == n
	for i := 0; same && i < n; i++ {
		same = sameString(p.ids[i], endpointID(&cands[i]))
	}
	if !same {
		p.ids, p.cur = p.ids[:0], p.cur[:0]
		for i := range cands {
			p.ids = append(p.ids, endpointID(&cands[i]))
			p.cur = append(p.cur, 0)
		}
	}
	best, total := -1, int64(0)
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		w := int64(weight(&cands[i]))
		p.cur[i] += w
		total += w
		if best < 0 || p.cur[i] > p.cur[best] {
			best = i
		}
	}
	if best < 0 {
		return noneHealthy(NameRoundRobin, cands, scores)
	}
	p.cur[best] -= total
	p.next = (best + 1) % n // the plain rotation, should the weights become equal, goes on from here
	return chose(NameRoundRobin, cands, best, "next in weighted turn", scores)
}

// Random picks a healthy candidate at random from its seeded generator,
// with probability proportional to its weight (kvroute.Endpoint.Weight):
// uniformly when the weights are equal. It takes no params. Not safe for
// concurrent use.
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
	if !equalWeights(cands) {
		return chose(NameRandom, cands, drawWeighted(p.rng, p.idx, cands, -1), "weighted random", scores)
	}
	return chose(NameRandom, cands, p.idx[p.rng.IntN(len(p.idx))], "uniform random", scores)
}

// drawWeighted returns a member of idx other than skip (-1: none), drawn
// with probability proportional to its candidate's weight. idx must hold
// a member other than skip.
func drawWeighted(r *rand.Rand, idx []int, cands []kvroute.Candidate, skip int) int {
	total := int64(0)
	for _, i := range idx {
		if i != skip {
			total += int64(weight(&cands[i]))
		}
	}
	x := r.Int64N(total)
	last := -1
	for _, i := range idx {
		if i == skip {
			continue
		}
		last = i
		if x -= int64(weight(&cands[i])); x < 0 {
			return i
		}
	}
	return last
}

// LeastRequest picks the healthy candidate with the fewest requests the
// router holds open to it (Load.InFlight, always fresh) per unit of its
// weight (kvroute.Endpoint.Weight; in-flight / weight, compared exactly,
// as nginx's least_conn compares connections), breaking ties at random
// (as Envoy's least_request does): with equal service times each
// endpoint's share of the requests approaches its share of the weights.
// With equal weights that is the fewest in-flight. It takes no params.
// Not safe for concurrent use.
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
	scores := p.buf.get(cands, 2)
	best, bestW, w0, weighted := -1, 1, 0, false
	p.idx = p.idx[:0]
	for i := range cands {
		if !cands[i].Healthy {
			continue
		}
		f, w := cands[i].Load.InFlight, weight(&cands[i])
		scores[i].Value = float64(f) / float64(w)
		scores[i].Parts = append(scores[i].Parts, kvroute.Part{Name: "in_flight", Value: float64(f)})
		if w != 1 {
			scores[i].Parts = append(scores[i].Parts, kvroute.Part{Name: "weight", Value: float64(w)})
		}
		if w0 == 0 {
			w0 = w
		}
		weighted = weighted || w != w0
		switch c := cmpPerWeight(f, w, best, bestW); {
		case len(p.idx) == 0 || c < 0:
			best, bestW = f, w
			p.idx = append(p.idx[:0], i)
		case c == 0:
			p.idx = append(p.idx, i)
		}
	}
	if len(p.idx) == 0 {
		return noneHealthy(NameLeastRequest, cands, scores)
	}
	why := "fewest in-flight"
	if weighted {
		why = "fewest in-flight per weight"
	}
	return chose(NameLeastRequest, cands, p.idx[p.rng.IntN(len(p.idx))], why, scores)
}

// cmpPerWeight compares a/wa with b/wb (weights positive) exactly: -1, 0
// or +1.
func cmpPerWeight(a, wa, b, wb int) int {
	x, y := int64(a)*int64(wb), int64(b)*int64(wa)
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// PowerOfTwo draws two distinct healthy candidates at random and keeps the
// one with fewer in-flight requests, then the shorter engine queue
// (Load.Queue), then the first drawn (Azar et al., "Balanced Allocations";
// SGLang's power_of_two compares in-flight counts the same way). When the
// healthy candidates' weights (kvroute.Endpoint.Weight) differ it draws
// each with probability proportional to its weight and compares in-flight
// and queue per unit of weight, as nginx's "random two least_conn" does:
// with equal service times each endpoint's share of the requests
// approaches its share of the weights (a uniform draw would cap any
// endpoint's share at the chance of being drawn, 2/n). It takes no
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
	scores := p.buf.get(cands, 3)
	p.idx = healthyIdx(p.idx[:0], cands)
	for _, i := range p.idx {
		l := &cands[i].Load
		w := weight(&cands[i])
		scores[i].Value = float64(l.InFlight) / float64(w)
		scores[i].Parts = append(scores[i].Parts,
			kvroute.Part{Name: "in_flight", Value: float64(l.InFlight)},
			kvroute.Part{Name: "queue", Value: float64(l.Queue())})
		if w != 1 {
			scores[i].Parts = append(scores[i].Parts, kvroute.Part{Name: "weight", Value: float64(w)})
		}
	}
	switch len(p.idx) {
	case 0:
		return noneHealthy(NamePowerOfTwo, cands, scores)
	case 1:
		return chose(NamePowerOfTwo, cands, p.idx[0], "only healthy candidate", scores)
	}
	if !equalWeights(cands) {
		a := drawWeighted(p.rng, p.idx, cands, -1)
		b := drawWeighted(p.rng, p.idx, cands, a)
		if lessLoadedPerWeight(&cands[b], &cands[a]) {
			a = b
		}
		return chose(NamePowerOfTwo, cands, a, "less loaded per weight of two drawn by weight", scores)
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

// lessLoadedPerWeight orders candidates by in-flight count per unit of
// weight, then engine queue per unit of weight.
func lessLoadedPerWeight(x, y *kvroute.Candidate) bool {
	wx, wy := weight(x), weight(y)
	if c := cmpPerWeight(x.Load.InFlight, wx, y.Load.InFlight, wy); c != 0 {
		return c < 0
	}
	return cmpPerWeight(x.Load.Queue(), wx, y.Load.Queue(), wy) < 0
}

func healthyIdx(dst []int, cands []kvroute.Candidate) []int {
	for i := range cands {
		if cands[i].Healthy {
			dst = append(dst, i)
		}
	}
	return dst
}
