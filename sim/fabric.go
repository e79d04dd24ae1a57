package sim

import (
	"math"
	"slices"
	"time"
)

// Transfer is one KV handoff of a disaggregated request: the decode engine
// pulls the prompt's KV from the prefill engine over the fabric (see
// PDConfig). Times are virtual, on the workload's clock like
// Record.Arrival.
type Transfer struct {
	// ID is the request's workload ID.
	ID string `json:"id"`
	// Prefill and Decode are the sending and receiving engines.
	Prefill string `json:"prefill"`
	Decode  string `json:"decode"`
	// Bytes is the KV moved: the prompt tokens past the decode engine's
	// prefix-cache hit (disagg.PulledTokens).
	Bytes int64 `json:"bytes"`
	// Ready is when the decode leg reached its engine and asked for the
	// KV; Wire when the bytes started to move (after the link's setup and
	// the queue behind other transfers on the same ports); End when the
	// last byte arrived.
	Ready time.Duration `json:"ready_ns"`
	Wire  time.Duration `json:"wire_ns"`
	End   time.Duration `json:"end_ns"`
	// Setup is the link's fixed cost paid between Ready and Wire; the rest
	// of that time is the queue behind other transfers.
	Setup time.Duration `json:"setup_ns"`
}

// FabricLoad is the KV-handoff traffic of a P/D run, from its Transfers.
type FabricLoad struct {
	// Transfers is the number of handoffs; Bytes their total size.
	Transfers int   `json:"transfers"`
	Bytes     int64 `json:"bytes"`
	// DecodeEngines is the number of engines that can receive handoffs
	// (role decode or both).
	DecodeEngines int `json:"decode_engines"`
	// Window is the width of the windows the peaks are measured over.
	Window time.Duration `json:"window_ns"`
	// Total is the fleet's handoff bytes per second over the span (the
	// first transfer's start to the last one's end); PerDecodeMean one
	// decode engine's mean ingress (Total / DecodeEngines); PerDecodeP99
	// and PerDecodeMax the p99 and the largest ingress of one decode
	// engine in one window, over every (engine, window) pair of the span.
	Total         float64 `json:"total_bytes_per_s"`
	PerDecodeMean float64 `json:"per_decode_mean_bytes_per_s"`
	PerDecodeP99  float64 `json:"per_decode_p99_bytes_per_s"`
	PerDecodeMax  float64 `json:"per_decode_max_bytes_per_s"`
	// TimeP50 and TimeP99 are the handoff times (Ready to End: setup,
	// queueing and wire); QueueP99 the p99 wait behind other transfers
	// (Ready to Wire less the link's setup).
	TimeP50  time.Duration `json:"time_p50_ns"`
	TimeP99  time.Duration `json:"time_p99_ns"`
	QueueP99 time.Duration `json:"queue_p99_ns"`
}

// FabricLoad summarises the run's KV handoffs over windows of the given
// width (default one second). A transfer's bytes are spread evenly over its
// wire time. The zero FabricLoad (no transfers) is returned for an
// aggregated run.
func (r *Result) FabricLoad(window time.Duration) FabricLoad {
	if window <= 0 {
		window = time.Second
	}
	fl := FabricLoad{Window: window, Transfers: len(r.Transfers)}
	dec := map[string]int{}
	for _, e := range r.Engines {
		if e.Role != "prefill" {
			dec[e.ID] = len(dec)
		}
	}
	fl.DecodeEngines = len(dec)
	if len(r.Transfers) == 0 || len(dec) == 0 {
		return fl
	}
	first, last := time.Duration(math.MaxInt64), time.Duration(0)
	times := make([]time.Duration, len(r.Transfers))
	queues := make([]time.Duration, len(r.Transfers))
	for i, t := range r.Transfers {
		fl.Bytes += t.Bytes
		first, last = min(first, t.Wire), max(last, t.End)
		times[i], queues[i] = t.End-t.Ready, max(t.Wire-t.Ready-t.Setup, 0)
	}
	span := max(last-first, window)
	fl.Total = float64(fl.Bytes) / span.Seconds()
	fl.PerDecodeMean = fl.Total / float64(len(dec))
	nw := int((span + window - 1) / window)
	perWin := make([]float64, len(dec)*nw) // [engine*nw + window] bytes
	for _, t := range r.Transfers {
		k, ok := dec[t.Decode]
		if !ok {
			continue
		}
		a, b := t.Wire-first, t.End-first
		if b <= a {
			perWin[k*nw+min(int(a/window), nw-1)] += float64(t.Bytes)
			continue
		}
		rate := float64(t.Bytes) / float64(b-a)
		for w := int(a / window); w < nw && time.Duration(w)*window < b; w++ {
			lo, hi := max(a, time.Duration(w)*window), min(b, time.Duration(w+1)*window)
			perWin[k*nw+w] += rate * float64(hi-lo)
		}
	}
	slices.Sort(perWin)
	scale := 1 / window.Seconds()
	fl.PerDecodeP99 = perWin[nearestRank(len(perWin), 0.99)] * scale
	fl.PerDecodeMax = perWin[len(perWin)-1] * scale
	slices.Sort(times)
	slices.Sort(queues)
	fl.TimeP50, fl.TimeP99 = times[nearestRank(len(times), 0.5)], times[nearestRank(len(times), 0.99)]
	fl.QueueP99 = queues[nearestRank(len(queues), 0.99)]
	return fl
}

// nearestRank is the index of quantile q among n sorted values.
func nearestRank(n int, q float64) int {
	i := int(math.Ceil(q*float64(n))) - 1
	return min(max(i, 0), n-1)
}
