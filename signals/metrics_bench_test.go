package signals

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// emulatorPages are /metrics pages of `kvroute engine --profile tiny
// --metrics-flavor <flavour>` after a few requests (histograms filled), one
// per flavour the emulator offers.
var emulatorPages = []string{"emulator-vllm", "emulator-vllm-legacy", "emulator-sglang", "emulator-llamacpp"}

// BenchmarkParseMetrics parses each emulator page: old is the whole page
// through expfmt (ParseMetrics before the fast path, kept as the tests'
// reference), new is ParseMetrics, scraper a parser reused from one scrape
// to the next as a Scraper does.
func BenchmarkParseMetrics(b *testing.B) {
	for _, name := range emulatorPages {
		body, err := os.ReadFile(filepath.Join("testdata", name+".prom"))
		if err != nil {
			b.Fatal(err)
		}
		p := newMetricsParser()
		for _, bb := range []struct {
			name  string
			parse func() (Metrics, error)
		}{
			{"old", func() (Metrics, error) { return referenceParseMetrics(bytes.NewReader(body), textCT, FlavorAuto) }},
			{"new", func() (Metrics, error) { return ParseMetrics(bytes.NewReader(body), textCT, FlavorAuto) }},
			{"scraper", func() (Metrics, error) { return p.parse(body, textCT, FlavorAuto) }},
		} {
			b.Run(name+"/"+bb.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if _, err := bb.parse(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
