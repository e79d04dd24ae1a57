package planner

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/workload"
)

// Latency holds the percentiles of one latency and its value at the SLO's
// quantile.
type Latency struct {
	P50 time.Duration `json:"p50_ns"`
	P90 time.Duration `json:"p90_ns"`
	P99 time.Duration `json:"p99_ns"`
	// AtSLO is the value at the SLO target's quantile (0 when no target).
	AtSLO time.Duration `json:"at_slo_ns"`
}

// FabricNeed is the fabric a disaggregated fleet needs for KV handoffs.
type FabricNeed struct {
	Link string  `json:"link"`
	Gbps float64 `json:"gbps"`
	// Total is the fleet's handoff bytes per second; PerDecodeMean,
	// PerDecodeP99 and PerDecodeMax one decode node's ingress: the mean,
	// and the p99 and largest over one-second windows (simulated: the
	// transfers the router placed, each spread over its wire time;
	// analytical: requests spread round robin at their arrival, each
	// counted with the probability that the router hands it off).
	Total         float64 `json:"total_bytes_per_s"`
	PerDecodeMean float64 `json:"per_decode_mean_bytes_per_s"`
	PerDecodeP99  float64 `json:"per_decode_p99_bytes_per_s"`
	PerDecodeMax  float64 `json:"per_decode_max_bytes_per_s,omitempty"`
	// LinkUtilMean and LinkUtilP99 are PerDecodeMean and PerDecodeP99 over
	// the link's effective bandwidth.
	LinkUtilMean float64 `json:"link_util_mean"`
	LinkUtilP99  float64 `json:"link_util_p99"`
	// TransferP50 and TransferP99 are the handoff times: simulated, setup,
	// queueing behind other transfers and wire; analytical, the median and
	// p99 handoff (the prompt tokens past the decode engine's prefix hit) on
	// an idle link. QueueP99 is the simulated p99 queueing.
	TransferP50 time.Duration `json:"transfer_p50_ns"`
	TransferP99 time.Duration `json:"transfer_p99_ns"`
	QueueP99    time.Duration `json:"queue_p99_ns,omitempty"`
	// Source says where the figures come from.
	Source string `json:"source"`
}

// queue is the waiting-time model of a pool of c identical servers fed by a
// stream of requests: M/G/c with the Allen-Cunneen correction. The waiting
// time W is 0 with probability 1-C (Erlang C) and exponential with rate
// Theta otherwise. The P/D model takes its pools' utilisation and
// saturation from it; every wait the analytical fleets report comes from
// the replay of the workload's arrivals (replay), bursts included.
type queue struct {
	C, Theta, Rho float64
}

// newQueue returns the model for arrival rate lambda, mean service meanS
// seconds, squared CVs of arrivals and service ca2, cs2, and c servers; ok
// is false when the pool is saturated.
func newQueue(lambda, meanS, ca2, cs2 float64, c int) (queue, bool) {
	a := lambda * meanS
	rho := a / float64(c)
	if rho >= 1 || c < 1 {
		return queue{Rho: rho}, false
	}
	// Erlang B by recursion, then C.
	bb := 1.0
	for k := 1; k <= c; k++ {
		bb = a * bb / (float64(k) + a*bb)
	}
	erlC := float64(c) * bb / (float64(c) - a*(1-bb))
	ac := max((ca2+cs2)/2, 1e-3)
	theta := (float64(c)/meanS - lambda) / ac
	return queue{C: erlC, Theta: theta, Rho: rho}, true
}

// sample returns up to n evenly spaced order statistics of v (sorted copy).
func sample(v []time.Duration, n int) []time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) <= n {
		return s
	}
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = s[(2*i+1)*len(s)/(2*n)]
	}
	return out
}

// poissonQuantile is the smallest k with P(Poisson(mean) <= k) >= q.
func poissonQuantile(mean, q float64) int {
	if mean <= 0 {
		return 0
	}
	if mean > 500 { // normal approximation
		return int(math.Ceil(mean + normQuantile(q)*math.Sqrt(mean)))
	}
	p := math.Exp(-mean)
	cum := p
	k := 0
	for cum < q && k < 100000 {
		k++
		p *= mean / float64(k)
		cum += p
	}
	return k
}

// normQuantile is the standard normal quantile (Acklam's approximation,
// relative error < 1.2e-9).
func normQuantile(p float64) float64 {
	a := []float64{-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00}
	b := []float64{-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01, -1.328068155288572e+01}
	c := []float64{-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00}
	d := []float64{7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00}
	switch {
	case p <= 0:
		return math.Inf(-1)
	case p >= 1:
		return math.Inf(1)
	case p < 0.02425:
		q := math.Sqrt(-2 * math.Log(p))
		return (((((c[0]*q+c[1])*q+c[2])*q+c[3])*q+c[4])*q + c[5]) / ((((d[0]*q+d[1])*q+d[2])*q+d[3])*q + 1)
	case p > 1-0.02425:
		q := math.Sqrt(-2 * math.Log(1-p))
		return -(((((c[0]*q+c[1])*q+c[2])*q+c[3])*q+c[4])*q + c[5]) / ((((d[0]*q+d[1])*q+d[2])*q+d[3])*q + 1)
	}
	q := p - 0.5
	r := q * q
	return (((((a[0]*r+a[1])*r+a[2])*r+a[3])*r+a[4])*r + a[5]) * q / (((((b[0]*r+b[1])*r+b[2])*r+b[3])*r+b[4])*r + 1)
}

// model holds what the analytical fleet estimates share.
type model struct {
	in      *Input
	d       *Demand
	c       Costs
	hit     float64   // expected prefix hit rate
	uncache []int     // per-request uncached tokens at hit
	cachedE []int     // per-request cached tokens at hit
	svc     []float64 // per-request prefill service (s) at full-chunk throughput
	meanSvc float64
	cs2     float64
	meanU   float64
	pulled  []int // per demand request, the prompt tokens its KV handoff moves (expected)
	dcached []int // per demand request, the prompt tokens its decode engine holds (expected)
	// pre and dpre are the chunked prefill (chunkedPrefill) of each
	// request's uncached tokens: of m.reqs at cachedE, of the demand's at
	// dcached.
	pre, dpre []time.Duration
	pd        *disagg.Planner
	rate      float64 // request rate (the demand's, times a burst factor)
	reqs      []workload.Request
}

// newModel builds the analytical model. reqs and cached give the requests
// and the prefix-cached tokens each got (from a simulation of the router's
// policy); with nil reqs the whole demand is used with the oracle's cached
// tokens scaled to the hit rate hit.
//
// A disaggregated request's KV handoff moves only the prompt tokens past
// its decode engine's own prefix-cache hit (disagg.PulledTokens, as the
// simulator and kvroute serve charge it). The decode placement prices each
// candidate's pull from its hit and so prefers an engine holding the
// prefix, as the policy does for the prefill, so the model takes the
// decode engine's hit to be the request's prefix hit: cached for reqs, and
// for the whole demand (the fabric's bandwidth) the oracle's cached tokens
// scaled by the hit rate over the oracle's on the same requests. These are
// estimates, not bounds (the closed-form floor is Demand.pulledFloor).
func newModel(in *Input, d *Demand, c Costs, hit float64, reqs []workload.Request, cached []int) *model {
	m := &model{in: in, d: d, c: c, hit: hit, rate: d.Rate, reqs: reqs}
	bs := in.Profile.BlockSize
	oracle := d.OracleHitRate
	if reqs != nil {
		oracle = tokenShare(reqs, oracleCached(reqs, bs))
	}
	scale := 0.0
	if oracle > 0 {
		scale = min(1, hit/oracle)
	}
	m.pulled, m.dcached, m.dpre = make([]int, len(d.reqs)), make([]int, len(d.reqs)), make([]time.Duration, len(d.reqs))
	prefill := chunkedPrefiller(in.Profile)
	for i := range d.reqs {
		m.dcached[i] = int(float64(d.cached[i]) * scale)
		m.pulled[i] = disagg.PulledTokens(d.reqs[i].PromptLen, m.dcached[i], bs)
		ce := max(0, min(m.dcached[i], d.reqs[i].PromptLen-1))
		m.dpre[i] = prefill(d.reqs[i].PromptLen-ce, ce)
	}
	// The router's P/D placement, as the simulator builds it: its
	// conditional rule decides which requests hand their KV off. Input
	// validation leaves nothing for NewPlanner to refuse; should it, every
	// request is taken to hand off (the always mode's fabric).
	m.pd, _ = disagg.NewPlanner(disagg.Config{Profile: in.Profile, Links: uniformLinks(in), Mode: in.PDMode})
	if reqs == nil {
		m.reqs = d.reqs
		cached = make([]int, len(d.reqs))
		for i := range d.reqs {
			cached[i] = int(float64(d.cached[i]) * scale)
		}
	}
	n := len(m.reqs)
	m.uncache, m.cachedE, m.svc, m.pre = make([]int, n), make([]int, n), make([]float64, n), make([]time.Duration, n)
	var s, s2, u float64
	for i := range m.reqs {
		ce := min(cached[i], m.reqs[i].PromptLen-1)
		m.cachedE[i] = ce
		m.uncache[i] = m.reqs[i].PromptLen - ce
		m.pre[i] = prefill(m.uncache[i], ce)
		m.svc[i] = float64(m.uncache[i]) * c.PrefillPerToken.Seconds()
		s += m.svc[i]
		s2 += m.svc[i] * m.svc[i]
		u += float64(m.uncache[i])
	}
	m.meanSvc = s / float64(n)
	m.meanU = u / float64(n)
	if m.meanSvc > 0 {
		m.cs2 = (s2/float64(n) - m.meanSvc*m.meanSvc) / (m.meanSvc * m.meanSvc)
	}
	return m
}

// decodeBatch solves b = rate x output x TPOT(b) / engines for the mean
// decode batch per engine, where TPOT(b) = DecodeTime(b, ctx) / (1 - steal)
// (steal: the time share prefill chunks take on the same engine). ok is false
// when the batch does not converge below max_num_seqs.
func (m *model) decodeBatch(engines int, steal float64) (b float64, ok bool) {
	p := m.in.Profile
	lam := m.rate / float64(engines)
	b = 1
	for range 200 {
		t := p.DecodeTime(max(1, int(math.Ceil(b))), m.c.DecodeContext).Seconds() / (1 - steal)
		nb := lam * m.d.OutputMean * t
		if math.Abs(nb-b) < 1e-6 {
			b = nb
			break
		}
		b = nb
		if b > float64(p.MaxNumSeqs) {
			return b, false
		}
	}
	return b, b <= float64(p.MaxNumSeqs)
}

func (m *model) tpot(b, steal, q float64) time.Duration {
	k := max(1, poissonQuantile(b, q))
	return time.Duration(float64(m.in.Profile.DecodeTime(k, m.c.DecodeContext)) / (1 - steal))
}

func (m *model) latency(f func(q float64) time.Duration, t Target) Latency {
	l := Latency{P50: f(0.5), P90: f(0.9), P99: f(0.99)}
	if t.Set() {
		l.AtSLO = f(t.Quantile)
	}
	return l
}

func meets(l Latency, t Target) bool { return !t.Set() || l.AtSLO <= t.Limit }

// analyticAggregated estimates the smallest aggregated fleet from start
// engines up: each engine time-shares prefill chunks and decode steps.
func (m *model) analyticAggregated(start int) Fleet {
	in, d := m.in, m.d
	f := Fleet{Mode: "aggregated", Method: "analytical", HitRate: m.hit, KVCapacityTokens: m.c.KVCapacity}
	for n := max(1, start); n <= in.MaxEngines; n++ {
		if m.aggregatedAt(&f, n) {
			f.Meets = true
			break
		}
	}
	if !f.Meets {
		f.Notes = append(f.Notes, "no aggregated fleet up to "+itoa(in.MaxEngines)+" engines meets the SLO in the analytical model")
	}
	_ = d
	return f
}

// aggregatedAt fills f for n aggregated engines and reports whether it meets
// the SLO at the target utilisation. Every request runs whole on one engine
// (the replay of the workload's arrivals on n engines, each request on the
// one with the fewest prompt tokens in flight, as the router's kv-aware
// estimate picks): it waits there for the engine's earlier prefills, first
// come first served (replay), and its TTFT is that wait plus its prefill
// and the round trip. With chunked prefill the decoding sequences ride in
// every step, prefill chunks included, so each request's TPOT pays for the
// prefills its engine runs while it decodes (decodeTPOT), the workload's
// own in its bursts. The mean decode batch is the one whose steps the
// prefills' share of the engine's time slows (decodeBatch). Utilisation is
// the share of the engines' time with a request on them (prefilling or
// decoding), as the simulator counts it, so it is near 100% for a fleet
// whose engines are never empty; the fleet is taken to meet the SLO when
// its prefill load is at most the target utilisation and the replay's
// latencies and the KV capacity meet it.
//
// (The M/G/c queue it replaces took the arrivals to be Poisson, the waits'
// mean scaled by Allen-Cunneen for their CV^2, and TPOT from a Poisson count
// of the prefills met: on the conversation trace, CV^2 9.2, it had 3
// engines of llama-3.1-8b-h100 meet TTFT p90 2s with 1.24s and TPOT p99
// 100ms with 29ms where the simulator's are 2.07s and 213ms.)
func (m *model) aggregatedAt(f *Fleet, n int) bool {
	in, d := m.in, m.d
	f.Engines, f.Prefill, f.Decode = n, 0, 0
	inf := Latency{P50: infDur, P90: infDur, P99: infDur, AtSLO: infDur}
	f.TTFT, f.TPOT = inf, inf
	pfRho := m.rate * m.meanSvc / float64(n)
	f.Utilisation = 1
	if pfRho >= 1 {
		return false
	}
	b, ok := m.decodeBatch(n, pfRho)
	f.DecodeBatch = b
	if !ok {
		return false
	}
	f.ThroughputRPS = m.rate
	f.OutputTPS = m.rate * d.OutputMean
	r := m.replay(m.reqs, m.cachedE, m.pre, 0, n, b)
	xs := m.localTimes()
	tt := make([]time.Duration, len(xs))
	for i, x := range xs {
		tt[i] = x + time.Duration(r.wait[i]*float64(time.Second))
	}
	slices.Sort(tt)
	f.TTFT = m.latency(func(q float64) time.Duration { return tt[rankIndex(len(tt), q)] }, in.SLO.TTFT)
	tp, end := m.decodeTPOT(r, b, xs)
	slices.Sort(tp)
	f.TPOT = m.latency(func(q float64) time.Duration { return tp[rankIndex(len(tp), q)] }, in.SLO.TPOT)
	f.Utilisation = r.busy(end)
	mem := float64(poissonQuantile(b, 0.99)) * (d.PromptMean + d.OutputMean/2)
	return pfRho <= in.MaxUtilisation && mem <= float64(m.c.KVCapacity) &&
		meets(f.TTFT, in.SLO.TTFT) && meets(f.TPOT, in.SLO.TPOT)
}

// decodeOK reports whether dn decode nodes meet TPOT and KV capacity, with
// the mean batch and the TPOT percentiles.
func (m *model) decodeOK(dn int) (b float64, tp Latency, ok bool) {
	in, d := m.in, m.d
	b, ok = m.decodeBatch(dn, 0)
	if !ok {
		return b, Latency{P50: infDur, P90: infDur, P99: infDur, AtSLO: infDur}, false
	}
	mem := float64(poissonQuantile(b, 0.99)) * (d.PromptMean + d.OutputMean/2)
	tp = m.latency(func(q float64) time.Duration { return m.tpot(b, 0, q) }, in.SLO.TPOT)
	return b, tp, mem <= float64(m.c.KVCapacity) && meets(tp, in.SLO.TPOT)
}

// handoffLatency returns, per request (sampled), the TTFT without queueing
// on a disaggregated fleet: prefill + KV handoff (of the prompt tokens past
// the request's prefix hit, see newModel) + first decode step.
func (m *model) handoffLatency(b float64) []time.Duration {
	return sample(m.handoffTimes(b), 1500)
}

// handoffTimes is handoffLatency per request of m.reqs, not sampled.
func (m *model) handoffTimes(b float64) []time.Duration {
	p := m.in.Profile
	shape := disagg.ShapeOf(p)
	firstStep := p.DecodeTime(max(1, int(math.Ceil(b))), m.c.DecodeContext)
	xs := make([]time.Duration, len(m.reqs))
	for i := range m.reqs {
		// Three hops: router -> prefill, prefill -> decode (in the
		// handoff), decode -> router.
		pulled := disagg.PulledTokens(m.reqs[i].PromptLen, m.cachedE[i], p.BlockSize)
		xs[i] = m.pre[i] + m.in.Fabric.Duration(shape.Bytes(pulled)) +
			firstStep + netRTT + netRTT/2
	}
	return xs
}

// localTimes is, per request of m.reqs, the TTFT without queueing of a
// request run whole on one engine: its prefill past the prefix hit and the
// round trip (as on an aggregated engine).
func (m *model) localTimes() []time.Duration {
	xs := make([]time.Duration, len(m.reqs))
	for i := range m.reqs {
		xs[i] = m.pre[i] + netRTT
	}
	return xs
}

// poolLoad is the prefill work one pool of a P/D fleet takes: the requests
// with weight w (the probability each goes there).
type poolLoad struct {
	rate    float64 // requests per second
	share   float64 // of all requests
	meanSvc float64 // mean prefill service, s
	cs2     float64 // its squared CV
	ca2     float64 // the arrivals' squared CV (a thinned stream)
}

// load returns the prefill load of the requests of m.reqs with weights w.
func (m *model) load(w []float64) poolLoad {
	var n, s, s2 float64
	for i, x := range m.svc {
		n, s, s2 = n+w[i], s+w[i]*x, s2+w[i]*x*x
	}
	l := poolLoad{share: n / float64(len(m.svc))}
	l.rate = m.rate * l.share
	// Splitting a renewal stream at random with probability p leaves
	// arrivals of squared CV p x ca2 + 1 - p.
	l.ca2 = l.share*m.d.ArrivalCV2 + 1 - l.share
	if n > 0 && s > 0 {
		l.meanSvc = s / n
		l.cs2 = max(0, (s2/n-l.meanSvc*l.meanSvc)/(l.meanSvc*l.meanSvc))
	}
	return l
}

// queue is the M/G/c model of c engines taking l; an idle one when l is
// empty.
func (l poolLoad) queue(c int) (queue, bool) {
	if l.rate <= 0 || l.meanSvc <= 0 {
		return queue{}, c >= 1
	}
	return newQueue(l.rate, l.meanSvc, l.ca2, l.cs2, c)
}

// pdFit is how a P/D fleet fares in the model: which pool its misses point
// at, as the simulated search grows them.
type pdFit struct {
	meets      bool
	growDecode bool
	// stuck: TTFT misses with neither pool's queue adding to it, so no
	// fleet size helps.
	stuck bool
}

// disaggAt fills f for pn prefill and dn decode engines and reports whether
// the fleet meets the SLO with the prefill pool at the target utilisation.
func (m *model) disaggAt(f *Fleet, pn, dn int) bool { return m.disaggFit(f, pn, dn).meets }

// disaggFit is disaggAt, also saying which pool to grow when the fleet
// misses. The prefill pool prefills the requests the router hands off (all
// in always mode; in conditional mode those handoffs picks); the decode
// pool decodes every request and prefills the others, as an aggregated
// engine does (aggregatedAt): it steals from the decode steps, which pay
// for the prefills that arrive while a request decodes. A request's TTFT
// is its wait in the replay (replay: first come first served on the node
// that prefills it, on the workload's own arrivals) plus prefill + handoff
// + first decode step, or plus its local prefill; the quantiles are taken
// over the requests. (An M/G/c queue per pool took the arrivals to be
// Poisson, with the waits' mean scaled by Allen-Cunneen for their CV^2: on
// the conversation trace, CV^2 9, it found the local prefills almost never
// waiting, and with the variability term calibrated on the aggregated
// fleet, clamped at x4, put the 2:2 prefill pool's p90 wait at 4.7s where
// the simulator's is 1.5s; TestModelMatchesSimulation,
// TestDisaggQueueBurstsHandWorked.)
func (m *model) disaggFit(f *Fleet, pn, dn int) pdFit {
	in, d := m.in, m.d
	f.Prefill, f.Decode, f.Engines = pn, dn, pn+dn
	inf := Latency{P50: infDur, P90: infDur, P99: infDur, AtSLO: infDur}
	f.TTFT, f.TPOT = inf, inf
	// The local prefills slow the decode steps, which moves the split: a
	// few rounds settle it.
	b, okB := m.decodeBatch(dn, 0)
	r := m.replay(m.reqs, m.cachedE, m.pre, pn, dn, b)
	w := r.handed
	var pf, loc poolLoad
	var steal float64
	for range 3 {
		pf = m.load(w)
		loc = m.load(oneMinus(w))
		steal = loc.rate * loc.meanSvc / float64(dn)
		if steal >= 1 {
			okB = false
			break
		}
		nb, ok := m.decodeBatch(dn, steal)
		okB = ok
		if !ok || math.Abs(nb-b) < 1e-3 {
			b = nb
			break
		}
		b = nb
		r = m.replay(m.reqs, m.cachedE, m.pre, pn, dn, b)
		w = r.handed
		pf, loc = m.load(w), m.load(oneMinus(w))
	}
	f.DecodeBatch, f.SplitFraction = b, pf.share
	f.Fabric = m.fabric(pn, dn, b, disagg.ShapeOf(in.Profile), in.Fabric)
	qp, okP := pf.queue(pn)
	_, okL := loc.queue(dn)
	f.ThroughputRPS = m.rate
	f.OutputTPS = m.rate * d.OutputMean
	// Each request's TTFT is its wait in the replay plus its latency
	// unqueued, handed off or run on its decode node.
	hx, lx := m.handoffTimes(b), m.localTimes()
	xs := make([]time.Duration, len(m.reqs))
	var all, hand, handX, local, localX, slots []time.Duration
	for i := range m.reqs {
		x, tt, ts := lx[i], &local, &localX
		v := x + time.Duration(r.wait[i]*float64(time.Second))
		if w[i] > 0 {
			// A handed-off request's wait for a LoRA slot is the decode
			// pool's: apart from its prefill side.
			x, tt, ts = hx[i], &hand, &handX
			v = x + time.Duration(r.wait[i]*float64(time.Second))
			slot := time.Duration(r.slot[i] * float64(time.Second))
			*tt, *ts = append(*tt, v-slot), append(*ts, x)
			slots = append(slots, slot)
		} else {
			*tt, *ts = append(*tt, v), append(*ts, x)
		}
		xs[i] = x
		all = append(all, v)
	}
	// Utilisation is what the simulator reports: each pool's busy time
	// over the replay's span (pdBusy), the fleet's the mean over its
	// nodes. (The fit is on the load, qp.Rho and steal, below.)
	tp, end := m.decodeTPOT(r, b, xs)
	f.PrefillUtil, f.DecodeUtil = r.pdBusy(m.pre, xs, end)
	f.Utilisation = (f.PrefillUtil*float64(pn) + f.DecodeUtil*float64(dn)) / float64(pn+dn)
	if !okP {
		return pdFit{}
	}
	if !okB || !okL {
		return pdFit{growDecode: true}
	}
	if loc.share > 0 {
		slices.Sort(tp)
		f.TPOT = m.latency(func(q float64) time.Duration { return tp[rankIndex(len(tp), q)] }, in.SLO.TPOT)
	} else {
		f.TPOT = m.latency(func(q float64) time.Duration { return m.tpot(b, 0, q) }, in.SLO.TPOT)
	}
	for _, v := range [][]time.Duration{all, hand, handX, local, localX, slots} {
		slices.Sort(v)
	}
	at := func(v []time.Duration, q float64) time.Duration {
		if len(v) == 0 {
			return 0
		}
		return v[rankIndex(len(v), q)]
	}
	f.TTFT = m.latency(func(q float64) time.Duration { return at(all, q) }, in.SLO.TTFT)
	mem := float64(poissonQuantile(b, 0.99)) * (d.PromptMean + d.OutputMean/2)
	switch {
	case qp.Rho > in.MaxUtilisation:
		return pdFit{}
	case steal > in.MaxUtilisation || mem > float64(m.c.KVCapacity) || !meets(f.TPOT, in.SLO.TPOT) ||
		f.Fabric.LinkUtilMean > in.MaxUtilisation:
		return pdFit{growDecode: true}
	case meets(f.TTFT, in.SLO.TTFT):
		return pdFit{meets: true}
	}
	// The misses point at the pool whose queue adds more at the SLO's
	// quantile.
	q := in.SLO.TTFT.Quantile
	wp, wl := at(hand, q)-at(handX, q), max(at(local, q)-at(localX, q), at(slots, q))
	return pdFit{growDecode: wl > wp, stuck: wp <= 0 && wl <= 0}
}

func oneMinus(w []float64) []float64 {
	out := make([]float64, len(w))
	for i, x := range w {
		out[i] = 1 - x
	}
	return out
}

const infDur = time.Duration(math.MaxInt64)

// analyticDisaggregated sizes a P/D fleet: the decode pool from the
// smallest meeting TPOT, KV capacity and link ingress with no prefill, the
// prefill pool from its load at the target utilisation (in always mode;
// from one in conditional mode, where the router runs some requests on the
// decode nodes), then grows the pool the misses point at (disaggFit) until
// the fleet meets the SLO (TTFT: queue + prefill + handoff + first decode
// step, or queue + prefill on the decode node), and shrinks each pool while
// it still does.
func (m *model) analyticDisaggregated(bwNeed int) Fleet {
	in := m.in
	f := Fleet{Mode: "disaggregated", Method: "analytical", HitRate: m.hit, KVCapacityTokens: m.c.KVCapacity}
	dn := 0
	for n := max(1, bwNeed); n <= in.MaxEngines; n++ {
		if _, _, ok := m.decodeOK(n); ok {
			dn = n
			break
		}
	}
	if dn == 0 {
		f.Notes = append(f.Notes, "no decode pool up to "+itoa(in.MaxEngines)+" engines meets TPOT and the KV capacity")
		return f
	}
	b, _, _ := m.decodeOK(dn)
	pn := max(1, int(math.Ceil(m.rate*m.meanSvc/in.MaxUtilisation-1e-9)))
	if in.PDMode == disagg.ModeConditional {
		pn = 1
	}
	if in.SLO.TTFT.Set() {
		// A floor: each request's TTFT with no queue, handed off (or, in
		// conditional mode, run on its decode node if that is faster).
		xs := m.handoffTimes(b)
		if in.PDMode == disagg.ModeConditional {
			for i, x := range m.localTimes() {
				xs[i] = min(xs[i], x)
			}
		}
		if floor := quantileDur(xs, in.SLO.TTFT.Quantile); floor > in.SLO.TTFT.Limit {
			m.disaggAt(&f, pn, dn)
			f.Notes = append(f.Notes, "TTFT target "+in.SLO.TTFT.String()+" is below prefill + KV handoff + first decode step at that quantile ("+
				fmtDur(floor)+"): no prefill pool meets it")
			return f
		}
	}
	for pn+dn <= in.MaxEngines {
		fit := m.disaggFit(&f, pn, dn)
		if fit.stuck {
			f.Notes = append(f.Notes, "TTFT target "+in.SLO.TTFT.String()+" is below the TTFT of the requests as the router splits them with no queueing: no P/D fleet meets it")
			return f
		}
		if !fit.meets {
			if fit.growDecode {
				dn++
			} else {
				pn++
			}
			continue
		}
		for pn > 1 && m.disaggAt(&f, pn-1, dn) {
			pn--
		}
		for dn > 1 && m.disaggAt(&f, pn, dn-1) {
			dn--
		}
		m.disaggAt(&f, pn, dn)
		f.Meets = true
		return f
	}
	f.Notes = append(f.Notes, "no P/D fleet up to "+itoa(in.MaxEngines)+" engines meets the SLO")
	return f
}

// handoffs returns, per request of reqs whose decode engine holds cached[i]
// of its prompt, whether (1) or not (0) the router's P/D placement
// (disagg.Planner.WhatIf: its mode and conditional rule on its cost model)
// hands its KV off on pn prefill nodes and decode nodes whose decode batch
// is b: a request it runs whole on the decode node (short, mostly cached
// there, or cheaper there) moves no KV and is prefilled there. Both nodes
// are taken to hold the request's expected prefix hit and the link to be
// idle. (The fabric's bandwidth takes the demand's requests, the prefill
// pool's queue the model's.)
//
// The rule weighs both nodes' queues as the router sees them: the prompt
// tokens of the requests it dispatched there that have no first token yet
// (Load.InFlightTokens), the prefills running as well as those waiting.
// That load is made by the rule's own choices and by the arrivals' bursts,
// so the requests are replayed in arrival order (at the model's rate) on
// pn prefill and dn decode nodes: each request's prefill node is the one
// with the fewest tokens in flight (a free one when there is one, as the
// router's picker chooses), its decode node the next in turn (the decode
// picker weighs the transfer and the batch, not the local prefills), the
// rule decides on their loads, and the request holds its prompt tokens on
// the node that prefills it until its prefill, queued first come first
// served behind that node's earlier ones, is done. An Erlang C arrival
// (Poisson) found a free prefill node for 74% of the requests at 2:2 on
// the conversation trace, whose arrivals come in bursts, where the
// router finds one for 24%, and so expected far more handoffs than the
// router makes (TestConditionalSplitMatchesSimulation).
func (m *model) handoffs(reqs []workload.Request, cached []int, pre []time.Duration, pn, dn int, b float64) []float64 {
	return m.replay(reqs, cached, pre, pn, dn, b).handed
}

// replayed is what replay finds, per request (the index of reqs) and per
// decode node; times are seconds on the replay's clock (the first arrival
// at 0, the model's rate).
type replayed struct {
	handed []float64 // 1 when the router hands the request off, else 0
	at     []float64 // its arrival
	wait   []float64 // from its arrival to the start of its prefill (or, handed off, of its decode leg past the prefill)
	slot   []float64 // of wait, the wait for a LoRA adapter's slot on its decode node
	pslot  []float64 // of wait, handed off, the wait for a LoRA adapter's slot on its prefill node
	node   []int     // its decode node
	pnode  []int     // its prefill node, when handed off
	local  [][]span  // per decode node, the prefills it runs, in order
	pn     int       // prefill nodes
}

// span is a stretch of a node's time; for a prefill, tokens is the
// prompt tokens it computes.
type span struct {
	from, to float64
	tokens   int
}

// addPrefill appends to a node's prefills sp one of tokens from..to: one
// that starts as the previous ends (queued behind it) joins its stretch,
// since the engine fills each step's token budget from the prompts waiting
// (chunked prefill: many short prompts share a step).
func addPrefill(sp []span, from, to float64, tokens int) []span {
	if k := len(sp) - 1; k >= 0 && sp[k].to == from {
		sp[k].to, sp[k].tokens = to, sp[k].tokens+tokens
		return sp
	}
	return append(sp, span{from, to, tokens})
}

// replay is handoffs, also returning each request's wait for the node that
// prefills it: the time from its arrival (at the model's rate) to the start
// of its prefill, the node's earlier prefills served first come first
// served one after the other (Lindley's recursion per node: wait =
// max(0, the node's earlier prefills' end - arrival)); and its decode node
// and the prefills each decode node runs.
//
// With pn 0 it replays an aggregated fleet of dn engines (aggregatedAt):
// no prefill pool and no rule, every request run whole on the engine with
// the fewest prompt tokens in flight, ties going to the one with the fewest
// requests decoding (each taken to decode for its output's steps of the
// batch b after its prefill), as the kv-aware picker's estimate (queue
// wait + prefill at the engine's step time) chooses when little is cached.
// On the conversation trace's first 2,500 requests at 5 engines of
// llama-3.1-8b-h100 this spreads 480 to 525 requests an engine where the
// simulator's router spreads 486 to 513, and the engines' busy share is
// 92% in both.
//
// With LoRA adapters each node's max_lora slots are booked (slotBook): a
// request whose adapter its node does not run, with Input.MaxLoRAs other
// adapters running there, starts (its prefill, run whole or handed off,
// or its decode leg once its prefill is done) only when enough of them
// have left, each staying while its requests keep arriving (vLLM admits a
// running adapter's request and skips another's); the wait is the
// request's own (its prefill keeps its place in the node's queue), in
// wait and, apart, slot (the decode node's) and pslot (the prefill
// node's). A prefill node's slot is held for the prefill alone (a prefill
// leg leaves with its first token), a decode-capable node's to the last
// token. An adapter's request goes to the engine (the aggregated engine
// or the prefill node) whose queue, slot wait and adapter load
// (policy.KVAwareParams.AdapterLoad, where none of its requests is
// booked) are the least, as the router's kv-aware picker prices them. On
// a P/D fleet its decode node is the router's decode picker's
// (disagg.DecodePicker) on the decode nodes' loads as booked (requests
// running and waiting, and their adapters): it weighs each node's decode
// step and, only where other adapters hold every slot, a slot wait, so a
// hot adapter spreads over the nodes with a free slot and the others'
// decode legs wait for one; a decode node then foresees one in so many of
// an adapter's requests as the nodes it runs on (adapterStream.homes).
// The P/D rule (disagg.Planner.HandsOff) sees the decode node's adapters
// running and waiting (Scenario.Adapter, Load.LoRA), not the prefill
// node's (the router's rule takes a prefill-only node's slot wait to be
// within its queue). On 4 adapters at --max-loras 1 (TestModelAdapterSlots'
// summary) it sizes 5 aggregated engines where the simulation needs 4 and
// the demand without adapters 1. On 8 adapters of the 8B profile at 20
// req/s, --max-loras 1 (TestModelPDAdapterSlots), it puts TTFT p99 at
// 1:7 and 2:10 at 16.7s and 8.1s where the simulator has 13.2s and 6.8s,
// and sizes 1:16, where the simulator's is 3.2s; with the decode node
// chosen where the adapter's slot wait and load were the least (the
// router's picker spreads adapters, this one kept each on its nodes), it
// put them at 0.63s and 0.31s and sized 1:7. Booking the prefill nodes'
// slots alone moved neither: on the 100s of docs/PLANNING.md's example at 1:7
// the simulated prefill queue's p99 is 0.21s (2ms at --max-loras 8), the
// decode legs' first step's (their wait for a slot) 13.8s.
func (m *model) replay(reqs []workload.Request, cached []int, pre []time.Duration, pn, dn int, b float64) *replayed {
	n := len(reqs)
	r := &replayed{handed: make([]float64, n), at: make([]float64, n), wait: make([]float64, n), slot: make([]float64, n), pslot: make([]float64, n),
		node: make([]int, n), pnode: make([]int, n), local: make([][]span, max(1, dn)), pn: pn}
	out, wait := r.handed, r.wait
	if n == 0 {
		return r
	}
	always := m.pd == nil || m.in.PDMode == disagg.ModeAlways
	run := int(math.Round(b))
	dl := kvroute.Load{Running: run, DecodeTokens: run * m.c.DecodeContext}
	order := make([]int, len(reqs))
	for i := range order {
		order[i] = i
	}
	if !slices.IsSortedFunc(reqs, func(a, b workload.Request) int { return cmp.Compare(a.Arrival, b.Arrival) }) {
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(reqs[a].Arrival, reqs[b].Arrival) })
	}
	scale := 1.0
	if m.d.Rate > 0 && m.rate > 0 {
		scale = m.rate / m.d.Rate
	}
	type flight struct {
		end    float64 // s, when the router sees its first token
		tokens int
	}
	// A pool's nodes: each one's prefills in flight and when they are done.
	type pool struct {
		flights [][]flight
		free    []float64
	}
	newPool := func(n int) pool { return pool{flights: make([][]flight, n), free: make([]float64, n)} }
	// inflight drops node j's prefills done by t and returns the tokens of
	// the others.
	inflight := func(pl pool, j int, t float64) int {
		fl, tok, k := pl.flights[j], 0, 0
		for _, f := range fl {
			if f.end > t {
				fl[k] = f
				k++
				tok += f.tokens
			}
		}
		pl.flights[j] = fl[:k]
		return tok
	}
	// queue puts a prefill of svc seconds arriving at t on node j and
	// returns when it starts.
	queue := func(pl pool, j int, t, svc float64, tokens int) float64 {
		start := max(t, pl.free[j])
		end := start + svc
		pl.free[j] = end
		pl.flights[j] = append(pl.flights[j], flight{end: end + netRTT.Seconds(), tokens: tokens})
		return start
	}
	// least returns the node of pl with the fewest prompt tokens in
	// flight at t and their count; with running, ties go to the node
	// with the fewest requests decoding (dropping those done by t), as
	// the kv-aware estimate of an idle engine's prefill is longer the
	// larger its decode batch.
	least := func(pl pool, t float64, running [][]float64) (best, load int) {
		load, busy := -1, 0
		for j := range pl.flights {
			tok, run := inflight(pl, j, t), 0
			if running != nil {
				ends, k := running[j], 0
				for _, e := range ends {
					if e > t {
						ends[k] = e
						k++
					}
				}
				running[j], run = ends[:k], k
			}
			if load < 0 || tok < load || tok == load && run < busy {
				best, load, busy = j, tok, run
			}
		}
		return best, load
	}
	pf, dec := newPool(max(1, pn)), newPool(max(1, dn))
	var running [][]float64 // aggregated: per engine, when its decoding requests end (unstalled)
	step := m.in.Profile.DecodeTime(max(1, int(math.Ceil(b))), m.c.DecodeContext).Seconds()
	if pn == 0 {
		running = make([][]float64, len(dec.flights))
	}
	// With LoRA adapters, each node's slots (slotBook): a request of an
	// adapter its node does not run, with every slot held, starts (its
	// prefill, run whole or handed off, or its decode leg) only when one
	// frees. Its prefill's compute keeps its place in the node's first
	// come first served queue (vLLM schedules the requests behind it
	// meanwhile), so the wait delays only the request itself. A prefill
	// node's slot is held for the prefill (pbooks), a decode-capable
	// node's to the last token (books).
	var books, pbooks []slotBook
	var streams map[string]*adapterStream
	if m.d.Adapters > 0 {
		streams = map[string]*adapterStream{}
		t0 := reqs[order[0]].Arrival
		for _, i := range order {
			if x := reqs[i].Adapter; x != "" {
				st := streams[x]
				if st == nil {
					st = &adapterStream{}
					streams[x] = st
				}
				st.at = append(st.at, (reqs[i].Arrival-t0).Seconds()/scale)
				st.dur = append(st.dur, pre[i].Seconds()+float64(max(0, reqs[i].OutputLen-1))*step)
				st.pre = append(st.pre, pre[i].Seconds())
			}
		}
		books = make([]slotBook, len(dec.flights))
		for j := range books {
			books[j] = slotBook{max: max(1, m.in.MaxLoRAs), streams: streams}
		}
		if pn > 0 {
			pbooks = make([]slotBook, len(pf.flights))
			for j := range pbooks {
				pbooks[j] = slotBook{max: max(1, m.in.MaxLoRAs), prefill: true, streams: streams}
			}
		}
	}
	// slotted moves the last prefill queued on decode node j, of svc
	// seconds, arrived at t and computed from cs, to when adapter x's
	// slot lets it start, books the slot to its last token (out more
	// decode steps) and returns its start.
	slotted := func(j int, x string, t, cs, svc float64, out int) float64 {
		if books == nil || x == "" {
			return cs
		}
		start := books[j].wait(x, cs)
		fl := dec.flights[j]
		fl[len(fl)-1].end = start + svc + netRTT.Seconds()
		books[j].add(x, t, start, start+svc+float64(max(0, out))*step)
		return start
	}
	// With adapters, a P/D fleet's decode node is the router's decode
	// picker's (disagg.DecodePicker) on the decode nodes' loads as the
	// replay books them (requests running and waiting, their adapters;
	// every node holding the request's prefix hit, so the transfer weighs
	// the same everywhere and is left out).
	var dpick *disagg.DecodePicker
	var dcands []kvroute.Candidate
	if books != nil && pn > 0 && m.pd != nil {
		dpick = m.pd.NewDecodePicker()
		dcands = make([]kvroute.Candidate, len(dec.flights))
		for j := range dcands {
			dcands[j] = kvroute.Candidate{Endpoint: &kvroute.Endpoint{ID: "decode-" + itoa(j), Role: kvroute.RoleDecode}, Healthy: true}
		}
	}
	// pstart returns when a prefill of adapter x arriving at t on
	// prefill node j, its compute queued from cs, starts: at cs when x
	// runs there at t (vLLM admits it into x's batch), else when x's slot
	// lets it.
	pstart := func(j int, x string, t, cs float64) float64 {
		if pbooks == nil || x == "" || slices.Contains(pbooks[j].running(t), x) {
			return cs
		}
		return pbooks[j].wait(x, cs)
	}
	perTok := m.c.PrefillPerToken.Seconds()
	t0 := reqs[order[0]].Arrival
	for k, i := range order {
		t := (reqs[i].Arrival - t0).Seconds() / scale
		prompt := reqs[i].PromptLen
		ce := max(0, min(cached[i], prompt-1))
		svc := pre[i].Seconds()
		x := reqs[i].Adapter
		for j := range books {
			books[j].drop(t)
		}
		for j := range pbooks {
			pbooks[j].drop(t)
		}
		if st := streams[x]; st != nil {
			st.next++ // this one is being placed: it is booked, not foreseen
		}
		if pn == 0 {
			dj, _ := least(dec, t, running)
			if books != nil && x != "" {
				// The router's kv-aware estimate prices the slot: the
				// engine whose queue, slot wait and adapter load (on an
				// engine that has no request of it) are the least.
				best, busy := math.Inf(1), 0
				for j := range dec.flights {
					tok := inflight(dec, j, t)
					s0 := max(t, dec.free[j])
					est := float64(tok)*perTok + books[j].wait(x, s0) - s0
					if !books[j].has(x) {
						est += adapterLoad
					}
					if run := len(running[j]); est < best || est == best && run < busy {
						dj, best, busy = j, est, run
					}
				}
			}
			r.at[i], r.node[i] = t, dj
			cs := queue(dec, dj, t, svc, prompt)
			start := slotted(dj, x, t, cs, svc, reqs[i].OutputLen-1)
			wait[i], r.slot[i] = start-t, start-cs
			r.local[dj] = addPrefill(r.local[dj], cs, cs+svc, prompt-ce)
			running[dj] = append(running[dj], start+svc+float64(max(0, reqs[i].OutputLen-1))*step)
			continue
		}
		best, load := least(pf, t, nil)
		if pbooks != nil && x != "" {
			// The prefill picker prices the slot as the aggregated one
			// does: the node whose queue, slot wait and adapter load (on
			// a node that has no request of it) are the least.
			est := math.Inf(1)
			for j := range pf.flights {
				tok := inflight(pf, j, t)
				s0 := max(t, pf.free[j])
				e := float64(tok)*perTok + pstart(j, x, t, s0) - s0
				if !pbooks[j].has(x) {
					e += adapterLoad
				}
				if e < est {
					best, load, est = j, tok, e
				}
			}
		}
		dj := k % len(dec.flights)
		if dpick != nil {
			// The decode nodes' loads, and each adapter's homes (the
			// nodes it runs or waits on: the picker sends its requests to
			// any of them at no slot cost, see adapterStream).
			for _, st := range streams {
				st.homes = 0
			}
			for j := range dcands {
				run, queued, lora := books[j].load(t, dcands[j].Load.LoRA)
				dcands[j].Load = kvroute.Load{Running: run, Waiting: queued, DecodeTokens: run * m.c.DecodeContext, LoRA: lora}
				dcands[j].CachedTokens = ce
				for _, a := range lora.Running {
					streams[a].homes++
				}
				for _, a := range lora.Waiting {
					if !slices.Contains(lora.Running, a) {
						streams[a].homes++
					}
				}
			}
			if x != "" {
				// It weighs each node's decode step with the request in
				// its batch (TPOTWeight), the last free slot of a node
				// that does not run the adapter (adapter_load_ms) and,
				// where other adapters hold every slot, half a decode of
				// its assumed output. It is told of no leg placed
				// (DecodePicker.Placed), so it prices no adapter's demand
				// behind a full slot: told of them, the model put 1:7 at
				// a TTFT p99 of 6.7s, the simulator 2.6s
				// (TestModelPDAdapterSlots), where it puts 4.8s.
				req := kvroute.Request{PromptTokens: prompt, MaxTokens: reqs[i].OutputLen, Adapter: x}
				if d := dpick.Pick(time.Unix(0, 0).Add(time.Duration(t*float64(time.Second))), &req, dcands); d.Index >= 0 {
					dj = d.Index
				}
			}
		}
		r.at[i], r.node[i] = t, dj
		dload := dl
		dload.InFlightTokens = inflight(dec, dj, t)
		switch {
		case dpick != nil:
			dload.LoRA = dcands[dj].Load.LoRA
		case books != nil:
			_, _, dload.LoRA = books[dj].load(t, nil)
		}
		if !always && !m.pd.HandsOff(disagg.Scenario{PromptTokens: prompt, Adapter: x, CachedPrefill: ce, CachedDecode: ce,
			PrefillLoad: kvroute.Load{InFlightTokens: load}, DecodeLoad: dload, Link: m.in.Fabric}) {
			cs := queue(dec, dj, t, svc, prompt)
			start := slotted(dj, x, t, cs, svc, reqs[i].OutputLen-1)
			wait[i], r.slot[i] = start-t, start-cs
			r.local[dj] = addPrefill(r.local[dj], cs, cs+svc, prompt-ce)
			continue
		}
		out[i] = 1
		r.pnode[i] = best
		cs := queue(pf, best, t, svc, prompt)
		start := cs
		if pbooks != nil && x != "" {
			// The prefill leg holds its adapter's slot on the prefill
			// node until its prefill is done.
			start = pstart(best, x, t, cs)
			fl := pf.flights[best]
			fl[len(fl)-1].end = start + svc + netRTT.Seconds()
			pbooks[best].add(x, t, start, start+svc)
		}
		wait[i], r.pslot[i] = start-t, start-cs
		if books != nil && x != "" {
			// The decode leg arrives when the prefill is done and waits
			// there for a slot.
			ready := t + wait[i] + svc
			start := books[dj].wait(x, ready)
			books[dj].add(x, ready, start, start+float64(reqs[i].OutputLen)*step)
			wait[i] += start - ready
			r.slot[i] = start - ready
		}
	}
	return r
}

// decodeTPOT returns each request's TPOT (of those with more than one
// output token) on its decode node in the replay r, whose decode steps
// of the mean batch b share the node with the prefills it runs (vLLM runs
// them in the same steps: every step takes one token of each decoding
// sequence and fills the rest of its token budget with prompt chunks). The
// request decodes from its first token (its arrival, wait and unqueued
// latency x) one token a step: a decode step of the batch between the
// node's prefills (the workload's own, in its bursts, where a Poisson
// count of them missed the bursts), and inside a stretch of prefills one
// of its chunk steps (decodeEnd). A short output decoding while a long
// prompt is prefilled takes a chunk step a token: the TPOT tail of an
// aggregated fleet on the conversation trace. end is, per request, when
// its last token comes (its first token's time when it has one).
func (m *model) decodeTPOT(r *replayed, b float64, x []time.Duration) (tpot []time.Duration, end []float64) {
	step := m.in.Profile.DecodeTime(max(1, int(math.Ceil(b))), m.c.DecodeContext).Seconds()
	budget := max(1, m.in.Profile.MaxNumBatchedTokens)
	out := make([]time.Duration, 0, len(r.at))
	end = make([]float64, len(r.at))
	for i := range r.at {
		from := r.at[i] + r.wait[i] + x[i].Seconds()
		end[i] = from
		o := m.reqs[i].OutputLen - 1
		if o < 1 {
			continue
		}
		end[i] = decodeEnd(r.local[r.node[i]], from, float64(o), step, budget)
		out = append(out, time.Duration((end[i]-from)/float64(o)*float64(time.Second)))
	}
	if len(out) == 0 {
		out = append(out, time.Duration(step*float64(time.Second)))
	}
	return out, end
}

// decodeEnd returns when a sequence decoding o tokens from from has its
// last on a node whose prefills are sp (in order, apart): a token per
// decode step of step seconds, and inside a stretch of prefills a token
// per chunk step, the stretch's time over its ceil(tokens/budget) steps.
func decodeEnd(sp []span, from, o, step float64, budget int) float64 {
	t := from
	k, _ := slices.BinarySearchFunc(sp, from, func(s span, t float64) int { return cmp.Compare(s.to, t) })
	for ; k < len(sp) && o > 0; k++ {
		s := sp[k]
		if s.from > t {
			if n := (s.from - t) / step; n < o {
				o -= n
				t = s.from
			} else {
				break
			}
		}
		per := (s.to - s.from) / math.Ceil(float64(max(1, s.tokens))/float64(budget))
		if per <= 0 {
			continue
		}
		if n := (s.to - t) / per; n < o {
			o -= n
			t = s.to
			continue
		}
		return t + o*per
	}
	return t + o*step
}

// busy returns the share of the nodes' time, from the first arrival to the
// last request's end (end, per request), with a request on them: from the
// start of its prefill to its last token.
func (r *replayed) busy(end []float64) float64 {
	per := make([][]span, len(r.local))
	var last float64
	for i := range r.at {
		j := r.node[i]
		per[j] = append(per[j], span{from: r.at[i] + r.wait[i], to: end[i]})
		last = max(last, end[i])
	}
	return busyShare(per, last)
}

// pdBusy is busy for a disaggregated replay: the share of each pool's
// time, from the first arrival to the last request's end (end, per
// request), that its nodes are computing. A prefill node is busy with
// the prefills handed to it (pre, per request: from its start, after its
// wait, to its end); a decode node with the prefills it runs itself
// (r.local) and with each of its requests from its first token (x, per
// request: its latency unqueued, after its wait) to its last. The fleet's
// is the mean over its nodes, pn of one and dn of the other.
func (r *replayed) pdBusy(pre, x []time.Duration, end []float64) (prefill, decode float64) {
	// A prefill node runs its prefills one after the other (replay's
	// queue), so its busy time is their sum. A decode node's stretches
	// overlap: they go, per node, into one array for busyShare.
	off := make([]int, len(r.local)+1)
	for j, sp := range r.local {
		off[j+1] = len(sp)
	}
	var last, pbusy float64
	for i := range r.at {
		start := r.at[i] + r.wait[i]
		if r.handed[i] > 0 {
			pbusy += pre[i].Seconds()
			last = max(last, start+pre[i].Seconds())
		}
		if end[i] > start+x[i].Seconds() {
			off[r.node[i]+1]++
		}
		last = max(last, end[i])
	}
	if last <= 0 {
		return 0, 0
	}
	for j := range r.local {
		off[j+1] += off[j]
	}
	buf := make([]span, off[len(r.local)])
	dp := make([][]span, len(r.local))
	for j, sp := range r.local {
		dp[j] = append(buf[off[j]:off[j]:off[j+1]], sp...)
	}
	for i := range r.at {
		if from := r.at[i] + r.wait[i] + x[i].Seconds(); end[i] > from {
			j := r.node[i]
			dp[j] = append(dp[j], span{from: from, to: end[i]})
		}
	}
	return pbusy / (last * float64(max(1, r.pn))), busyShare(dp, last)
}

// busyShare returns the share of [0, last] that the spans cover, per node
// (overlaps counted once), over the nodes.
func busyShare(per [][]span, last float64) float64 {
	if last <= 0 || len(per) == 0 {
		return 0
	}
	var tot float64
	for _, sp := range per {
		slices.SortFunc(sp, func(a, b span) int { return cmp.Compare(a.from, b.from) })
		var hi float64
		for _, s := range sp {
			from := max(s.from, hi)
			if s.to > from {
				tot += s.to - from
			}
			hi = max(hi, s.to)
		}
	}
	return tot / (last * float64(len(per)))
}

// fabric computes the handoff bandwidth for pn prefill and dn decode
// nodes running a mean batch of b sequences each, requests assigned round
// robin, in one-second windows, each request moving the prompt tokens past
// its decode engine's prefix hit (m.pulled) if the router hands it off
// (handoffs: in conditional mode it runs the rest whole on their decode
// nodes, and they move nothing).
func (m *model) fabric(pn, dn int, b float64, shape disagg.KVShape, link disagg.Link) *FabricNeed {
	d := m.d
	fn := &FabricNeed{Link: link.Name, Gbps: link.Gbps, Source: "disagg.KVShape + disagg.Link cost model"}
	bytes := make([]int64, len(d.reqs))
	var moved []int
	var tot float64
	per := map[[2]int64]float64{}
	t0 := d.reqs[0].Arrival
	split := m.handoffs(d.reqs, m.dcached, m.dpre, pn, dn, b)
	for i := range d.reqs {
		if split[i] == 0 {
			continue
		}
		moved = append(moved, m.pulled[i])
		bytes[i] = int64(split[i] * float64(shape.Bytes(m.pulled[i])))
		tot += float64(bytes[i])
		sec := int64((d.reqs[i].Arrival - t0) / time.Second)
		per[[2]int64{int64(i % dn), sec}] += float64(bytes[i])
	}
	secs := int64(max(1, int(math.Ceil(d.Span.Seconds()))))
	if d.Span > 0 {
		fn.Total = tot / d.Span.Seconds()
	}
	fn.PerDecodeMean = fn.Total / float64(dn)
	vals := make([]float64, 0, int(secs)*dn)
	for k := range dn {
		for s := int64(0); s < secs; s++ {
			vals = append(vals, per[[2]int64{int64(k), s}])
		}
	}
	sort.Float64s(vals)
	fn.PerDecodeP99 = vals[rankIndex(len(vals), 0.99)]
	fn.PerDecodeMax = vals[len(vals)-1]
	// A burst scales the rate, so the bytes per second, by the same factor.
	if k := m.rate / d.Rate; k > 0 && k != 1 {
		fn.Total, fn.PerDecodeMean, fn.PerDecodeP99, fn.PerDecodeMax = fn.Total*k, fn.PerDecodeMean*k, fn.PerDecodeP99*k, fn.PerDecodeMax*k
	}
	bw := link.BytesPerSecond()
	fn.LinkUtilMean, fn.LinkUtilP99 = fn.PerDecodeMean/bw, fn.PerDecodeP99/bw
	if len(moved) > 0 {
		fn.TransferP50 = link.Duration(shape.Bytes(quantileInt(moved, 0.5)))
		fn.TransferP99 = link.Duration(shape.Bytes(quantileInt(moved, 0.99)))
	}
	return fn
}

func itoa(n int) string { return strconv.Itoa(n) }
