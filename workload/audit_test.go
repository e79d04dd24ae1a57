package workload

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestArrivalsRateCap: a rate whose gaps round to zero nanoseconds is an
// error, not a generator that never reaches its next arrival (chat at 1e300
// requests/s looped forever, growing memory).
func TestArrivalsRateCap(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		ok   bool
	}{{MaxRate, true}, {1000, true}, {2 * MaxRate, false}, {1e300, false}} {
		err := Arrivals{Rate: tc.rate}.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("Arrivals{Rate: %g}.Validate() = %v, want ok %v", tc.rate, err, tc.ok)
			continue // Generate would not return
		}
		if tc.ok {
			continue
		}
		if _, err := Generate("chat", Options{Requests: 10, Arrivals: Arrivals{Rate: tc.rate}}); err == nil || !strings.Contains(err.Error(), "maximum") {
			t.Errorf("Generate(chat, rate %g): got %v, want the rate cap's error", tc.rate, err)
		}
	}
}

// TestChatHighRate: at a high rate the chat generator still returns the
// first Requests arrivals at that rate (the warm start's later turns are
// cut as the cutoff is refined).
func TestChatHighRate(t *testing.T) {
	w := genOrFatal(t, "chat", Options{Seed: 3, Requests: 2000, Arrivals: Arrivals{Rate: 20000}})
	if len(w.Requests) != 2000 {
		t.Fatalf("got %d requests, want 2000", len(w.Requests))
	}
	if got := float64(len(w.Requests)) / w.Span().Seconds(); got < 15000 || got > 25000 {
		t.Errorf("rate %.0f/s, want about 20000/s", got)
	}
}

// TestScaleRateOverflow: a tiny rate scale that would push arrivals past
// what time.Duration holds is an error, not wrapped (negative) arrivals; a
// scale above 1e9 says what the range is.
func TestScaleRateOverflow(t *testing.T) {
	w := genOrFatal(t, "rag", Options{Seed: 1, Requests: 10, Arrivals: Arrivals{Kind: Constant, Rate: 1}})
	last := w.Span()
	err := w.ScaleRate(1e-12)
	if err == nil || !strings.Contains(err.Error(), "years") {
		t.Errorf("ScaleRate(1e-12): got %v, want an error about the span", err)
	}
	if got := w.Span(); got != last {
		t.Errorf("after a refused ScaleRate the last arrival is %v, want it unchanged (%v)", got, last)
	}
	if err := w.ScaleRate(1e-300); err == nil || strings.Contains(err.Error(), "Inf") {
		t.Errorf("ScaleRate(1e-300): got %v, want an error without Inf in it", err)
	}
	if err := w.ScaleRate(2e9); err == nil || !strings.Contains(err.Error(), "(0, 1e9]") {
		t.Errorf("ScaleRate(2e9): got %v, want an error giving the range", err)
	}
	if err := w.ScaleRate(1e-6); err != nil {
		t.Errorf("ScaleRate(1e-6) (a 9s workload stretched to 104 days): %v", err)
	}
	if w.Span() != 9*time.Second*1e6 {
		t.Errorf("after ScaleRate(1e-6): span %v, want %v", w.Span(), 9*time.Second*1e6)
	}
}

// TestScaleRateAbsolute: a trace with absolute timestamps (a production log
// in Unix milliseconds, 56 years after 1970) is scaled from its first
// arrival, as the simulator and bench replay it from there: slowing it down
// (x < 1) was refused because the timestamps themselves were divided,
// putting the first request past the 100-year limit.
func TestScaleRateAbsolute(t *testing.T) {
	const unixMs = 1_764_000_000_000 * time.Millisecond
	w := &Workload{Name: "log"}
	for i := range 5 {
		w.Requests = append(w.Requests, Request{ID: strconv.Itoa(i), Arrival: unixMs + time.Duration(i)*100*time.Millisecond, PromptLen: 16, OutputLen: 1})
	}
	if err := w.ScaleRate(0.5); err != nil {
		t.Fatalf("ScaleRate(0.5) of a Unix-ms trace: %v", err)
	}
	for i, r := range w.Requests {
		if want := unixMs + time.Duration(i)*200*time.Millisecond; r.Arrival != want {
			t.Errorf("request %d arrives at %v after ScaleRate(0.5), want %v (the first arrival kept, the gaps doubled)", i, r.Arrival, want)
		}
	}
	if err := w.ScaleRate(4); err != nil {
		t.Fatalf("ScaleRate(4): %v", err)
	}
	if got, want := w.Requests[4].Arrival, unixMs+200*time.Millisecond; got != want {
		t.Errorf("after ScaleRate(4) the last arrival is %v, want %v", got, want)
	}
	if err := w.ScaleRate(1e-10); err == nil || !strings.Contains(err.Error(), "years") {
		t.Errorf("ScaleRate(1e-10) of a trace 56 years after 0 (gaps stretched to 63 years): got %v, want the span error", err)
	}
}
