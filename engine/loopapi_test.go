package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestDecodeStepsStarted: DecodeStepsStarted computes the steps that start
// before woke (and before) and end by until, the step in progress at woke
// included unless a request finishes in it, as stepping computes them.
func TestDecodeStepsStarted(t *testing.T) {
	// Three requests decoding; r1 finishes in the run's last step (k).
	setup := func() (*Engine, time.Duration) {
		e := mustEngine(t, "tiny", nil)
		for i := range 3 {
			max := 200
			if i == 1 {
				max = 12
			}
			if err := e.Add(0, &Request{ID: fmt.Sprint("r", i), Prompt: tokens(i*1000, 40), MaxTokens: max, IgnoreEOS: true}); err != nil {
				t.Fatal(err)
			}
		}
		return e, stepUntilDecoding(e)
	}
	ref, now := setup()
	var run DecodedRun
	k := ref.DecodeSteps(now, time.Hour, 100, &run)
	if k < 6 || len(run.Finished) != 1 {
		t.Fatalf("DecodeSteps computed %d steps, %d finished, want at least 6 and 1", k, len(run.Finished))
	}
	starts := []time.Duration{now} // starts[k]: step k's start; starts[k+1] its end
	for _, d := range run.Durations {
		starts = append(starts, starts[len(starts)-1]+d)
	}
	const forever = time.Duration(1 << 62)
	for _, tc := range []struct {
		name                string
		woke, until, before time.Duration
		want                int
	}{
		{"in step 4", starts[4] + 1, forever, forever, 5},
		{"at step 4's start", starts[4], forever, forever, 4},
		{"until cuts the step in progress", starts[4] + 1, starts[5] - 1, forever, 4},
		{"before in step 2", starts[4] + 1, forever, starts[2] + 1, 3},
		{"in the finishing step", starts[k-1] + 1, forever, forever, k - 1},
		{"at the finishing step's end", starts[k], forever, forever, k},
		{"before the first", now, forever, forever, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, now := setup()
			var got DecodedRun
			n := e.DecodeStepsStarted(now, tc.woke, tc.until, tc.before, 100, &got)
			if n != tc.want || !slices.Equal(got.Durations, run.Durations[:n]) {
				t.Errorf("got %d steps %v, want %d %v", n, got.Durations, tc.want, run.Durations[:tc.want])
			}
			if fin := len(got.Finished); fin != 0 != (n == k) {
				t.Errorf("%d finished in %d steps", fin, n)
			}
			if got, want := e.Stats().Steps, ref.Stats().Steps-int64(k-n); got != want {
				t.Errorf("engine stepped %d steps, want %d", got, want)
			}
		})
	}
}
