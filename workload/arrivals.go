package workload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Arrival process kinds.
const (
	// Poisson arrivals: exponential gaps at Rate.
	Poisson = "poisson"
	// Gamma arrivals: gamma-distributed gaps at mean rate Rate with
	// coefficient of variation CV (CV>1 is burstier than Poisson).
	Gamma = "gamma"
	// Constant arrivals: exactly 1/Rate apart.
	Constant = "constant"
	// Trace keeps a trace's own timestamps (only meaningful for traces).
	Trace = "trace"
)

// MaxRate is the largest arrival rate Validate accepts, in requests per
// second: gaps are whole nanoseconds, so a mean gap under a microsecond
// would be distorted by rounding (and under a nanosecond every gap is 0:
// a generator that waits for its clock to pass a time never finishes).
const MaxRate = 1e6

// Arrivals configures an arrival process. The zero value is Poisson at 10
// requests per second.
type Arrivals struct {
	// Kind is poisson (default), gamma, constant or trace.
	Kind string
	// Rate is the mean number of arrivals per second, at most MaxRate;
	// default 10.
	Rate float64
	// CV is the coefficient of variation of gamma gaps; default 2.
	CV float64
}

func (a Arrivals) withDefaults() Arrivals {
	if a.Kind == "" {
		a.Kind = Poisson
	}
	if a.Rate == 0 {
		a.Rate = 10
	}
	if a.CV == 0 {
		a.CV = 2
	}
	return a
}

// Validate reports a bad kind, rate or CV (after defaults).
func (a Arrivals) Validate() error {
	a = a.withDefaults()
	switch a.Kind {
	case Poisson, Gamma, Constant, Trace:
	default:
		return fmt.Errorf("workload: arrivals.kind %q is not one of poisson, gamma, constant, trace", a.Kind)
	}
	if !(a.Rate > 0) || math.IsInf(a.Rate, 0) {
		return fmt.Errorf("workload: arrivals.rate %v must be > 0", a.Rate)
	}
	if a.Rate > MaxRate {
		return fmt.Errorf("workload: arrivals.rate %v requests/s is above the maximum %g (arrival times are whole nanoseconds)", a.Rate, float64(MaxRate))
	}
	if !(a.CV > 0) || a.CV > 100 {
		return fmt.Errorf("workload: arrivals.cv %v must be in (0, 100]", a.CV)
	}
	return nil
}

// Gaps returns a function drawing successive inter-arrival gaps from rng.
// The Trace kind draws Poisson gaps (a generator has no timestamps of its own).
func (a Arrivals) Gaps(rng *rand.Rand) func() time.Duration {
	a = a.withDefaults()
	mean := 1 / a.Rate
	switch a.Kind {
	case Constant:
		return func() time.Duration { return secs(mean) }
	case Gamma:
		shape := 1 / (a.CV * a.CV)
		scale := mean / shape
		return func() time.Duration { return secs(gamma(rng, shape) * scale) }
	}
	return func() time.Duration { return secs(rng.ExpFloat64() * mean) }
}

// Retime replaces the arrival offsets of reqs (kept in their order) with
// draws from a, seeded by seed. Kind trace leaves them untouched.
func Retime(reqs []Request, a Arrivals, seed uint64) error {
	if err := a.Validate(); err != nil {
		return err
	}
	if a.withDefaults().Kind == Trace {
		return nil
	}
	next := a.Gaps(rand.New(rand.NewPCG(seed, 0xa771)))
	var t time.Duration
	for i := range reqs {
		if i > 0 {
			t += next()
		}
		reqs[i].Arrival = t
	}
	return nil
}

func secs(s float64) time.Duration {
	if s > 1e9 {
		s = 1e9
	}
	return time.Duration(s * float64(time.Second))
}

// gamma draws from Gamma(shape, 1) (Marsaglia and Tsang 2000).
func gamma(rng *rand.Rand, shape float64) float64 {
	if shape < 1 {
		u := rng.Float64()
		for u == 0 {
			u = rng.Float64()
		}
		return gamma(rng, shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}
