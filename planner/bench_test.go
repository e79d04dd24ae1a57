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
