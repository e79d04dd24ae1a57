package engine

import (
	"math"
	"time"
)

// Batch describes one step's work for the cost model.
type Batch struct {
	// PrefillTokens is the number of uncached prompt (or recompute) tokens
	// computed this step, over all prefilling sequences.
	PrefillTokens int
	// PrefillAttnPairs is the sum over prefill chunks of q x (p + q/2): query
	// tokens times the (causal) context they attend to, where p tokens were
	// already in the cache.
	PrefillAttnPairs float64
	// PrefillContext is the sum over prefill chunks of p (cached context read
	// once from HBM).
	PrefillContext int
	// DecodeTokens is the number of decoding sequences (one token each).
	DecodeTokens int
	// DecodeContext is the sum of the decoding sequences' context lengths
	// (the KV tokens their attention reads).
	DecodeContext int
	// Seqs is the number of scheduled sequences; Sampled how many of them
	// produce a token (run the LM head).
	Seqs, Sampled int
}

// costModel holds the per-profile constants of the step-time model, computed
// once so StepTime is a handful of float operations.
type costModel struct {
	linFLOPsPerToken   float64 // 2 x active layer params / TP
	headFLOPsPerSample float64 // 2 x vocab x hidden / TP
	attnFLOPsPerPair   float64 // per query-key pair, all layers, per GPU
	weightSec          float64 // weight read per step
	kvSecPerToken      float64 // KV read per context token per GPU
	peak               float64 // peak FLOP/s
	mfuLo, mfuHi, half float64 // GEMM efficiency: mfuLo + (mfuHi-mfuLo) T/(T+half)
	commSecPerToken    float64 // TP all-reduce bytes time per token
	commFixedSec       float64 // TP all-reduce latency per step
	stepSec, seqSec    float64
}

func newCostModel(p Profile) costModel {
	m := p.Model
	tp := float64(max(p.TP, 1))
	bw := p.Hardware.HBMBandwidth * p.Eff.MemEfficiency
	var attnPerPair float64
	if m.KVLoRARank > 0 {
		// Absorbed MLA: scores over the (latent + rope) dims, values over
		// the latent, per head.
		attnPerPair = 2*float64(m.Heads)*float64(m.KVLoRARank+m.QKRopeDim) + 2*float64(m.Heads)*float64(m.KVLoRARank)
	} else {
		attnPerPair = 4 * float64(m.Heads) * float64(m.HeadDim)
	}
	attnPerPair *= float64(m.Layers) / tp
	c := costModel{
		linFLOPsPerToken:   2 * m.activeLayerParams() / tp,
		headFLOPsPerSample: 2 * float64(m.Vocab) * float64(m.Hidden) / tp,
		attnFLOPsPerPair:   attnPerPair,
		weightSec:          float64(p.WeightBytesPerGPU()) / bw,
		kvSecPerToken:      float64(p.KVBytesPerTokenPerGPU()) / bw,
		peak:               p.Hardware.PeakFLOPs,
		mfuLo:              p.Eff.MFUDecode,
		mfuHi:              p.Eff.MFUPrefill,
		half:               float64(p.Eff.GEMMHalfTokens),
		stepSec:            p.Eff.StepOverheadSeconds,
		seqSec:             p.Eff.SeqOverheadSeconds,
	}
	if p.TP > 1 && p.Hardware.NVLinkBandwidth > 0 {
		// Two ring all-reduces per layer of hidden x dtype bytes per token.
		ring := 2 * (tp - 1) / tp
		c.commSecPerToken = 2 * float64(m.Layers) * ring * float64(m.Hidden*m.DTypeBytes) / p.Hardware.NVLinkBandwidth
		c.commFixedSec = 2 * float64(m.Layers) * p.Eff.AllReduceLatencySeconds
	}
	return c
}

// seconds returns the modelled step time in seconds:
//
//	GEMMs:     max(weight read, 2 N_active T / (peak x MFU))   (weight-read floor once per step)
//	prefill:   attention FLOPs of the chunks + cached-context KV read
//	decode:    KV read of every decoding sequence's context
//	TP:        two all-reduces per layer
//	overheads: per step + per sequence
func (c *costModel) seconds(b *Batch) float64 {
	if b.Seqs == 0 {
		return 0
	}
	pf, dc := float64(b.PrefillTokens), float64(b.DecodeTokens)
	t := pf + dc
	mfu := c.mfuHi
	if c.half > 0 {
		mfu = c.mfuLo + (c.mfuHi-c.mfuLo)*t/(t+c.half)
	}
	compute := (c.linFLOPsPerToken*t + c.headFLOPsPerSample*float64(b.Sampled)) / (c.peak * mfu)
	gemm := math.Max(c.weightSec, compute)
	attnPf := math.Max(c.attnFLOPsPerPair*b.PrefillAttnPairs/(c.peak*c.mfuHi), c.kvSecPerToken*float64(b.PrefillContext))
	attnDc := c.kvSecPerToken * float64(b.DecodeContext)
	comm := 0.0
	if c.commFixedSec > 0 {
		comm = c.commFixedSec + c.commSecPerToken*(pf+dc)
	}
	return gemm + attnPf + attnDc + comm + c.stepSec + c.seqSec*float64(b.Seqs)
}

// StepTime returns the modelled duration of one step of batch b on profile p.
// Engines precompute the constants; this is for planners and tests.
func (p Profile) StepTime(b Batch) time.Duration {
	c := newCostModel(p)
	return secondsToDuration(c.seconds(&b))
}

func secondsToDuration(s float64) time.Duration {
	return time.Duration(math.Round(s * 1e9))
}

// PrefillTime returns the modelled time of one step that prefills q new
// tokens on top of p cached tokens of one sequence (no other work).
func (p Profile) PrefillTime(q, cached int) time.Duration {
	return p.StepTime(Batch{PrefillTokens: q, PrefillAttnPairs: float64(q) * (float64(cached) + float64(q)/2),
		PrefillContext: cached, Seqs: 1, Sampled: 1})
}

// DecodeTime returns the modelled time of one pure decode step of batch
// sequences holding ctx tokens of context each.
func (p Profile) DecodeTime(batch, ctx int) time.Duration {
	return p.StepTime(Batch{DecodeTokens: batch, DecodeContext: batch * ctx, Seqs: batch, Sampled: batch})
}

// StepCost is a profile's step-time model (Profile.StepTime) with its
// constants derived once, for callers that price many steps: the P/D
// placement's estimates (package disagg) run on every candidate of every
// decision.
type StepCost struct{ c costModel }

// NewStepCost returns p's step-time model.
func NewStepCost(p Profile) StepCost { return StepCost{newCostModel(p)} }

// StepTime returns the modelled duration of one step of batch b, equal to
// Profile.StepTime of the profile s was made from.
func (s *StepCost) StepTime(b Batch) time.Duration {
	return secondsToDuration(s.c.seconds(&b))
}

// ChunkedPrefill returns the modelled time of prefilling q tokens on top of
// cached ones (one sequence) in steps of at most budget tokens, each step
// also decoding decodes sequences that hold decodeContext tokens of context
// in all: the sum over the steps of StepTime of
//
//	Batch{PrefillTokens: n, PrefillAttnPairs: n x (p + n/2), PrefillContext: p,
//	      DecodeTokens: decodes, DecodeContext: decodeContext,
//	      Seqs: decodes + 1, Sampled: decodes + 1}
//
// for the chunks n of q (all budget but the last) at p = cached + the tokens
// before them. It costs O(1) whatever q/budget: every full chunk's step is
// the same but for its prefill attention, max(FLOPs, cached-context read),
// both linear in p, so the max switches from one to the other at most once
// as p grows and each side sums as an arithmetic series. It rounds that sum
// once where the steps' StepTime each round to the nanosecond, so it is
// within half a nanosecond per full chunk (and 2 ns) of the step-by-step
// sum. budget < 1 is taken as 1; q <= 0 costs nothing.
func (s *StepCost) ChunkedPrefill(q, cached, budget, decodes, decodeContext int) time.Duration {
	if q <= 0 {
		return 0
	}
	budget = max(budget, 1)
	cached, decodes, decodeContext = max(cached, 0), max(decodes, 0), max(decodeContext, 0)
	full, rest := q/budget, q%budget
	var d time.Duration
	if rest > 0 {
		p := cached + full*budget
		d = s.StepTime(Batch{PrefillTokens: rest, PrefillAttnPairs: float64(rest) * (float64(p) + float64(rest)/2), PrefillContext: p,
			DecodeTokens: decodes, DecodeContext: decodeContext, Seqs: decodes + 1, Sampled: decodes + 1})
	}
	if full == 0 {
		return d
	}
	c := &s.c
	// One full chunk's step without its prefill attention.
	base := c.seconds(&Batch{PrefillTokens: budget, DecodeTokens: decodes, DecodeContext: decodeContext,
		Seqs: decodes + 1, Sampled: decodes + 1})
	// Chunk k (0-based) at p_k = cached + k B: attention FLOPs time
	// a B (p_k + B/2), cached-context read kv p_k.
	b, kv := float64(budget), c.kvSecPerToken
	a := c.attnFLOPsPerPair / (c.peak * c.mfuHi)
	n := float64(full)
	// m: the leading chunks on the FLOPs side (a B (p + B/2) >= kv p).
	m := n
	if kv > a*b {
		pstar := a * b * b / 2 / (kv - a*b) // the p where the two meet
		m = math.Min(n, math.Max(0, math.Floor((pstar-float64(cached))/b)+1))
	}
	// sumP is the sum of p_k over chunks k in [i, j).
	sumP := func(i, j float64) float64 { return (j-i)*float64(cached) + b*(i+j-1)*(j-i)/2 }
	sec := n*base + a*b*(sumP(0, m)+m*b/2) + kv*sumP(m, n)
	return d + secondsToDuration(sec)
}
