package planner

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvroute/kvroute/workload"
)

// Summary describes a workload by its statistics instead of a trace. Workload
// turns it into a seeded synthetic request stream the simulator can replay.
//
// Each request is one hot prefix (chosen by Zipf popularity among
// HotPrefixes) followed by a unique suffix: the prefixes hold SharedFraction of
// the prompt tokens on average, so with SharedFraction 0.6 and PromptMean 2000
// every prefix is 1200 tokens and suffixes average 800.
//
// With Adapters, every request is for one of that many LoRA adapters
// (workload.AdapterName(i), drawn by workload.AdapterMix: the lora
// generator's law, adapter i's share proportional to 1/(i+1)^AdapterSkew)
// and the hot prefixes are the adapter's own: adapter a's requests draw
// among its HotPrefixes prefixes by Zipf, none shared with another
// adapter's (the engine keys an adapter's blocks with its name, so the same
// text under two adapters shares no cached block anyway). With
// HotPrefixes 1 each adapter has one system prompt, as in the lora
// workload. The adapters are drawn from a stream of their own: the
// arrivals, lengths and prefix ranks are those of the same summary
// without adapters.
type Summary struct {
	// Rate is the mean request rate per second (Poisson arrivals, or gamma
	// with ArrivalCV). Required, > 0 and at most workload.MaxRate.
	Rate float64
	// Duration is the span of the generated stream; default enough for
	// 2000 requests. Rate x Duration is at most MaxSummaryRequests.
	Duration time.Duration
	// ArrivalCV is the coefficient of variation of inter-arrival gaps; 0 or 1
	// is Poisson, above 1 burstier (gamma); at most 100.
	ArrivalCV float64
	// PromptMean and PromptCV: prompt lengths in tokens, lognormal; CV
	// default 1. PromptMean required, >= 1.
	PromptMean, PromptCV float64
	// OutputMean and OutputCV: output lengths in tokens, lognormal; CV
	// default 1. OutputMean required, >= 1.
	OutputMean, OutputCV float64
	// MaxLen caps prompt + output (default 32768).
	MaxLen int
	// SharedFraction is the fraction of prompt tokens in shared prefixes,
	// 0..1 (0: no sharing).
	SharedFraction float64
	// HotPrefixes is the number of distinct shared prefixes; default 8 when
	// SharedFraction > 0.
	HotPrefixes int
	// Zipf is the popularity exponent over the prefixes (rank k is chosen
	// with weight 1/k^Zipf): 0 (the zero value) is uniform, 1 the usual
	// Zipf law (kvroute plan's --zipf default).
	Zipf float64
	// Adapters is the number of LoRA adapters the requests are for; 0
	// (the zero value) is the base model only. At most MaxSummaryAdapters.
	Adapters int
	// AdapterSkew is the popularity exponent over the adapters (adapter i
	// is chosen with weight 1/(i+1)^AdapterSkew): 0 (the zero value) is
	// uniform, 1 the lora generator's default (kvroute plan's
	// --adapter-skew default).
	AdapterSkew float64
}

// MaxSummaryAdapters is the most adapters a Summary names: the lora
// generator's limit.
const MaxSummaryAdapters = 10_000

// maxArrivalCV is the largest Summary.ArrivalCV: workload.Arrivals'
// limit on gamma arrivals.
const maxArrivalCV = 100

// MaxSummaryRequests is the most requests a Summary generates: Validate
// refuses a rate and duration that expect more.
const MaxSummaryRequests = 1_000_000

// Validate reports the first bad field, wrapping ErrBadInput.
func (s Summary) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: workload summary: %s", ErrBadInput, fmt.Sprintf(format, a...))
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !finite(s.Rate) || s.Rate <= 0:
		return bad("rate %v req/s must be positive", s.Rate)
	case s.Rate > workload.MaxRate:
		return bad("rate %v req/s is above the %g the arrivals model (arrival times are whole nanoseconds)", s.Rate, float64(workload.MaxRate))
	case s.Duration < 0:
		return bad("duration %v is negative", s.Duration)
	case !finite(s.ArrivalCV) || s.ArrivalCV < 0:
		return bad("arrival CV %v is negative", s.ArrivalCV)
	case s.ArrivalCV > maxArrivalCV:
		return bad("arrival CV %v is above the %g gamma arrivals model", s.ArrivalCV, float64(maxArrivalCV))
	case !finite(s.PromptMean) || s.PromptMean < 1:
		return bad("prompt mean %v tokens must be >= 1", s.PromptMean)
	case !finite(s.OutputMean) || s.OutputMean < 1:
		return bad("output mean %v tokens must be >= 1", s.OutputMean)
	case !finite(s.PromptCV) || s.PromptCV < 0, !finite(s.OutputCV) || s.OutputCV < 0:
		return bad("length CVs must be >= 0")
	case s.MaxLen < 0:
		return bad("max length %d is negative", s.MaxLen)
	case !finite(s.SharedFraction) || s.SharedFraction < 0 || s.SharedFraction >= 1:
		return bad("shared fraction %v must be in [0, 1)", s.SharedFraction)
	case s.HotPrefixes < 0:
		return bad("hot prefixes %d is negative", s.HotPrefixes)
	case !finite(s.Zipf) || s.Zipf < 0:
		return bad("zipf exponent %v is negative", s.Zipf)
	case s.Adapters < 0 || s.Adapters > MaxSummaryAdapters:
		return bad("adapters %d must be in [0, %d]", s.Adapters, MaxSummaryAdapters)
	case !finite(s.AdapterSkew) || s.AdapterSkew < 0 || s.AdapterSkew > 100:
		return bad("adapter skew %v must be in [0, 100]", s.AdapterSkew)
	}
	maxLen := s.MaxLen
	if maxLen == 0 {
		maxLen = 32768
	}
	if s.PromptMean+s.OutputMean > float64(maxLen) {
		return bad("prompt mean %v + output mean %v exceed the max length %d", s.PromptMean, s.OutputMean, maxLen)
	}
	if n := s.Rate * s.Duration.Seconds(); n > MaxSummaryRequests {
		return bad("rate %v req/s over duration %v is about %.0f requests, more than the %d a summary generates: shorten the duration",
			s.Rate, s.Duration, n, MaxSummaryRequests)
	}
	return nil
}

// Workload generates the summary's request stream, deterministic for seed.
func (s Summary) Workload(seed uint64) (*workload.Workload, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.PromptCV == 0 {
		s.PromptCV = 1
	}
	if s.OutputCV == 0 {
		s.OutputCV = 1
	}
	if s.MaxLen == 0 {
		s.MaxLen = 32768
	}
	if s.SharedFraction > 0 && s.HotPrefixes == 0 {
		s.HotPrefixes = 8
	}
	if s.Duration == 0 {
		s.Duration = time.Duration(2000 / s.Rate * float64(time.Second))
	}
	arr := workload.Arrivals{Kind: workload.Poisson, Rate: s.Rate}
	if s.ArrivalCV > 0 && s.ArrivalCV != 1 {
		arr = workload.Arrivals{Kind: workload.Gamma, Rate: s.Rate, CV: s.ArrivalCV}
	}
	rng := rand.New(rand.NewPCG(seed, 0x706c616e))
	gaps := arr.Gaps(rand.New(rand.NewPCG(seed, 0x61727276)))
	// Zipf cumulative weights over the hot prefixes.
	cum := make([]float64, s.HotPrefixes)
	tot := 0.0
	for k := range cum {
		tot += 1 / math.Pow(float64(k+1), s.Zipf)
		cum[k] = tot
	}
	prefixLen := int(math.Round(s.SharedFraction * s.PromptMean))
	suffixMean := s.PromptMean - float64(prefixLen)
	w := &workload.Workload{Name: fmt.Sprintf("summary(rate=%g, prompt=%g, output=%g, shared=%g, prefixes=%d)",
		s.Rate, s.PromptMean, s.OutputMean, s.SharedFraction, s.HotPrefixes)}
	var amix workload.AdapterMix
	var arng *rand.Rand // the adapters' own stream
	if s.Adapters > 0 {
		amix = workload.NewAdapterMix(s.Adapters, s.AdapterSkew)
		arng = rand.New(rand.NewPCG(seed, 0x6c6f7261))
		w.Name = strings.TrimSuffix(w.Name, ")") + fmt.Sprintf(", adapters=%d, adapter-skew=%g)", s.Adapters, s.AdapterSkew)
	}
	var at time.Duration
	for i := 0; ; i++ {
		if i > 0 {
			at += gaps()
		}
		if at > s.Duration || i >= MaxSummaryRequests {
			break
		}
		var segs []workload.Segment
		plen := 0
		adapter := -1
		if arng != nil {
			adapter = amix.Pick(arng.Float64())
		}
		if prefixLen > 0 && s.HotPrefixes > 0 {
			u := rng.Float64() * tot
			k := 0
			for k < len(cum)-1 && cum[k] < u {
				k++
			}
			key := 0x686f7400 + uint64(k)
			if adapter >= 0 { // the adapter's own prefix k
				key = mix(0x6c6f72612f686f74 ^ uint64(adapter)<<32 ^ uint64(k))
			}
			segs = append(segs, workload.Segment{Key: key, Len: prefixLen})
			plen = prefixLen
		}
		suffix := max(1, int(math.Round(lognormal(rng, suffixMean, s.PromptCV))))
		out := max(1, int(math.Round(lognormal(rng, s.OutputMean, s.OutputCV))))
		if plen+suffix+out > s.MaxLen {
			suffix = max(1, s.MaxLen-plen-out)
			if plen+suffix+out > s.MaxLen {
				out = max(1, s.MaxLen-plen-suffix)
			}
		}
		segs = append(segs, workload.Segment{Key: seed<<32 ^ 0x7366780000000000 ^ uint64(i), Len: suffix})
		r := workload.Request{ID: fmt.Sprintf("s%06d", i), Arrival: at, PromptLen: plen + suffix, OutputLen: out, Segments: segs}
		if adapter >= 0 {
			r.Adapter = workload.AdapterName(adapter)
		}
		w.Requests = append(w.Requests, r)
	}
	return w, nil
}

// lognormal draws a lognormal value with the given mean and coefficient of
// variation.
func lognormal(rng *rand.Rand, mean, cv float64) float64 {
	if cv <= 0 {
		return mean
	}
	s2 := math.Log(1 + cv*cv)
	mu := math.Log(mean) - s2/2
	return math.Exp(mu + math.Sqrt(s2)*rng.NormFloat64())
}

// WhatIf returns a copy of w changed by a what-if scenario: "rate-x2"
// (arrivals twice as fast) or "prompt-x2" (every prompt segment twice as
// long, so shared prefixes stay shared). The requests are copied; w is not
// modified.
func WhatIf(w *workload.Workload, name string) (*workload.Workload, error) {
	out := &workload.Workload{Name: w.Name + " [" + name + "]", Requests: make([]workload.Request, len(w.Requests))}
	copy(out.Requests, w.Requests)
	switch name {
	case "rate-x2":
		if err := out.ScaleRate(2); err != nil {
			return nil, fmt.Errorf("planner: what-if %s: %w", name, err)
		}
	case "prompt-x2":
		for i := range out.Requests {
			r := &out.Requests[i]
			if len(r.Segments) == 0 {
				return nil, fmt.Errorf("%w: what-if %s: request %s has no segments (a literal prompt cannot be lengthened)", ErrBadInput, name, r.ID)
			}
			segs := make([]workload.Segment, len(r.Segments))
			for k, s := range r.Segments {
				segs[k] = workload.Segment{Key: s.Key, Len: 2 * s.Len}
			}
			r.Segments, r.PromptLen, r.HashIDs = segs, 2*r.PromptLen, nil
		}
	default:
		return nil, fmt.Errorf("%w: unknown what-if %q (want rate-x2 or prompt-x2; node-lost is part of every plan)", ErrBadInput, name)
	}
	return out, nil
}
