package workload

import (
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
