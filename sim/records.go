package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"time"
)

// recordsHeader is the header of WriteRecordsCSV; durations are in
// milliseconds; adapter is the LoRA adapter ("" = the base model).
var recordsHeader = []string{"run", "id", "engine", "arrival_s", "status", "prompt_tokens", "cached_tokens",
	"output_tokens", "preemptions", "ttft_ms", "held_ms", "network_ms", "queue_ms", "prefill_ms", "transfer_ms", "first_step_ms", "tpot_ms",
	"e2e_ms", "error", "adapter"}

// WriteRecordsCSV writes one line per request of each result, labelled
// with runs[i] (one name per result).
func WriteRecordsCSV(w io.Writer, runs []string, results []*Result) error {
	if len(runs) != len(results) {
		return fmt.Errorf("sim: write records: %d run names for %d results", len(runs), len(results))
	}
	cw := csv.NewWriter(w)
	if err := cw.Write(recordsHeader); err != nil {
		return fmt.Errorf("sim: write records: %w", err)
	}
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }
	line := make([]string, len(recordsHeader))
	for k, res := range results {
		for i := range res.Records {
			r := &res.Records[i]
			line = append(line[:0], runs[k], r.ID, r.Engine, strconv.FormatFloat(r.Arrival.Seconds(), 'f', 6, 64),
				strconv.Itoa(r.Status), strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CachedTokens),
				strconv.Itoa(r.OutputTokens), strconv.Itoa(r.Preemptions), ms(r.TTFT), ms(r.Held), ms(r.Network), ms(r.Queue),
				ms(r.Prefill), ms(r.Transfer), ms(r.FirstDecode), ms(r.TPOT), ms(r.E2E), r.Error, r.Adapter)
			if err := cw.Write(line); err != nil {
				return fmt.Errorf("sim: write records: %w", err)
			}
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("sim: write records: %w", err)
	}
	return nil
}
