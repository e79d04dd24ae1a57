package planner

import (
	"testing"
	"time"
)

func BenchmarkAnalyse(b *testing.B) {
	w, err := Summary{Rate: 50, Duration: 60 * time.Second, PromptMean: 4000, OutputMean: 200, SharedFraction: 0.5, Zipf: 1}.Workload(1)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		analyse(w, 16)
	}
}

func BenchmarkAnalyticDisaggregated(b *testing.B) {
	benchAnalyticDisaggregated(b, smallInput(b, 60))
}

// BenchmarkAnalyticDisaggregatedLarge is BenchmarkAnalyticDisaggregated on
// 10,000 requests at 250 a second: the replay's per-request P/D decisions
// price prefill pools with deep queues while the search grows them.
func BenchmarkAnalyticDisaggregatedLarge(b *testing.B) {
	benchAnalyticDisaggregated(b, sizedInput(b, 250, 40*time.Second, 600))
}

// benchAnalyticDisaggregated times the analytical P/D replay of in.
func benchAnalyticDisaggregated(b *testing.B, in Input) {
	in.defaults()
	d := analyse(in.Workload, in.Profile.BlockSize)
	bd, err := computeBounds(&in, d)
	if err != nil {
		b.Fatal(err)
	}
	m := newModel(&in, d, bd.Costs, d.OracleHitRate, nil, nil)
	b.ReportAllocs()
	for b.Loop() {
		m.analyticDisaggregated(bd.Bandwidth.Need)
	}
}

// BenchmarkChunkedPrefill prices the chunked prefill of each of 3,000
// requests of 8,000 prompt tokens on average (up to 32k: one to four
// chunks of 8192), half of them shared, as newModel and computeBounds do
// for every request of a workload.
func BenchmarkChunkedPrefill(b *testing.B) {
	w, err := Summary{Rate: 60, Duration: 50 * time.Second, PromptMean: 8000, OutputMean: 200, SharedFraction: 0.5, Zipf: 1}.Workload(1)
	if err != nil {
		b.Fatal(err)
	}
	p := mustProfile(b, "llama-3.1-8b-h100")
	d := analyse(w, p.BlockSize)
	b.ReportAllocs()
	var sink time.Duration
	for b.Loop() {
		prefill := chunkedPrefiller(p)
		for i := range d.reqs {
			sink += prefill(d.reqs[i].PromptLen-d.cached[i], d.cached[i])
		}
	}
	_ = sink
}
