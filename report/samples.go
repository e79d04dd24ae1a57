package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"time"
)

// WriteSamplesCSV writes one line per sample: id, engine, arrival, TTFT,
// TPOT, E2E (milliseconds), token counts (cached -1 = not reported), the
// error kind and whether the request was rejected.
func WriteSamplesCSV(w io.Writer, samples []Sample) error {
	cw := csv.NewWriter(w)
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }
	if err := cw.Write([]string{"id", "engine", "arrival_ms", "ttft_ms", "tpot_ms", "e2e_ms",
		"prompt_tokens", "cached_tokens", "output_tokens", "preemptions", "error", "rejected"}); err != nil {
		return fmt.Errorf("report: write samples: %w", err)
	}
	for i := range samples {
		s := &samples[i]
		if err := cw.Write([]string{s.ID, s.Engine, ms(s.Arrival), ms(s.TTFT), ms(s.TPOT()), ms(s.E2E),
			strconv.Itoa(s.PromptTokens), strconv.Itoa(s.CachedTokens), strconv.Itoa(s.OutputTokens),
			strconv.Itoa(s.Preemptions), s.Err, strconv.FormatBool(s.Rejected)}); err != nil {
			return fmt.Errorf("report: write samples: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("report: write samples: %w", err)
	}
	return nil
}
