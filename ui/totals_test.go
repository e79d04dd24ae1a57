package ui

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvroute/kvroute/report"
)

// TestTotalsFromRun: during a demo run the summary tiles show the running
// phase's row so far (the load generator's measurements, which the
// comparison and the terminal show), not the router's histogram estimate
// of the same TTFT, which disagreed with them; without a run they are the
// router's figures, and say so.
func TestTotalsFromRun(t *testing.T) {
	reg, reqs, ttfb := testMetrics(t)
	now := time.Unix(1000, 0)
	row := report.Row{Name: "kv-aware", Requests: 7, Completed: 7, HitRate: 0.625}
	row.TTFT.N, row.TTFT.P50, row.TTFT.P99 = 7, 42*time.Millisecond, 173*time.Millisecond
	for _, tc := range []struct {
		name   string
		run    func() RunState
		source string
		want   [4]float64 // requests, p50 ms, p99 ms, hit rate
	}{
		// The router saw 3 requests at 80 ms: the estimate is in the
		// (50, 100] ms bucket; the engines reported no counters.
		{"router", nil, "router", [4]float64{3, -1, -1, -1}},
		{"run", func() RunState {
			return RunState{Phase: 1, Phases: 1, Policy: "kv-aware", Current: func() report.Row { return row }}
		},
			"client", [4]float64{7, 42, 173, 0.625}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(Options{Source: fakeSource{newTestRouter(t)}, Gatherer: reg, Run: tc.run, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			d.Mark(now, "kv-aware")
			for range 3 {
				reqs.WithLabelValues("a").Inc()
				ttfb.WithLabelValues("a").Observe(0.08)
			}
			now = now.Add(time.Second)
			rec := httptest.NewRecorder()
			d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
			var st struct {
				Totals struct {
					Label    string   `json:"label"`
					Source   string   `json:"source"`
					Requests int      `json:"requests"`
					P50      *float64 `json:"ttft_p50_ms"`
					P99      *float64 `json:"ttft_p99_ms"`
					Hit      *float64 `json:"hit_rate"`
				} `json:"totals"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil {
				t.Fatal(err)
			}
			tot := st.Totals
			val := func(p *float64) float64 {
				if p == nil {
					return -1
				}
				return *p
			}
			got := [4]float64{float64(tot.Requests), val(tot.P50), val(tot.P99), val(tot.Hit)}
			if tc.source == "router" {
				// A bucket estimate: only its bucket is known.
				if got[1] <= 50 || got[1] > 100 || got[2] <= 50 || got[2] > 100 {
					t.Errorf("router estimate p50/p99 = %v/%v ms, want within (50, 100]", got[1], got[2])
				}
				got[1], got[2] = -1, -1
			}
			if got != tc.want || tot.Source != tc.source || tot.Label != "kv-aware" {
				t.Errorf("totals = %v from %q labelled %q, want %v from %q labelled kv-aware", got, tot.Source, tot.Label, tc.want, tc.source)
			}
		})
	}
}

// compareState serves /ui/api/state for a finished run whose comparison
// rows are rows and decodes it into st.
func compareState(t *testing.T, rows []report.Row, st any) {
	t.Helper()
	d, err := New(Options{Source: fakeSource{newTestRouter(t)}, Run: func() RunState { return RunState{Phases: 2, Done: true, Rows: rows} }})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/api/state", nil))
	if err := json.Unmarshal(rec.Body.Bytes(), st); err != nil {
		t.Fatal(err)
	}
}

// TestCompareUnknownHitRate: a comparison row whose hit rate or oracle is
// unknown (report.Row's -1: the engines reported no cached tokens) goes to
// the page as null, shown as "–", not as -1 (which the page drew as
// "-100.0%" and a bar below the axis).
func TestCompareUnknownHitRate(t *testing.T) {
	rows := []report.Row{{Name: "a", Requests: 2, Completed: 2, HitRate: -1, OracleHitRate: -1}, {Name: "b", Requests: 2, Completed: 2, HitRate: 0.25, OracleHitRate: 0.5}}
	var st struct {
		Run struct {
			Rows []struct {
				Hit    *float64 `json:"hit_rate"`
				Oracle *float64 `json:"oracle_hit_rate"`
			} `json:"rows"`
		} `json:"run"`
	}
	compareState(t, rows, &st)
	if len(st.Run.Rows) != 2 {
		t.Fatalf("%d rows, want 2", len(st.Run.Rows))
	}
	if r := st.Run.Rows[0]; r.Hit != nil || r.Oracle != nil {
		t.Errorf("unknown rates sent as %v / %v, want null / null", deref(r.Hit), deref(r.Oracle))
	}
	if r := st.Run.Rows[1]; r.Hit == nil || *r.Hit != 0.25 || r.Oracle == nil || *r.Oracle != 0.5 {
		t.Errorf("known rates sent as %v / %v, want 0.25 / 0.5", deref(r.Hit), deref(r.Oracle))
	}
}

// TestCompareNoCompletedRequest: a comparison row with no completed request
// has no TTFT: it goes to the page as null ("–"), not 0 ("0.0 ms", which
// the page marked as the best p50).
func TestCompareNoCompletedRequest(t *testing.T) {
	rows := []report.Row{{Name: "a", Requests: 2, Errors: map[string]int{"http_500": 2}, HitRate: -1, OracleHitRate: -1},
		{Name: "b", Requests: 2, Completed: 2, TTFT: report.Dist{N: 2, P50: 80 * time.Millisecond, P99: 90 * time.Millisecond},
			E2E: report.Dist{N: 2, P50: time.Second}}}
	var st struct {
		Run struct {
			Rows []struct {
				P50 *float64 `json:"ttft_p50_ms"`
				P99 *float64 `json:"ttft_p99_ms"`
				E2E *float64 `json:"e2e_p50_ms"`
			} `json:"rows"`
		} `json:"run"`
	}
	compareState(t, rows, &st)
	if len(st.Run.Rows) != 2 {
		t.Fatalf("%d rows, want 2", len(st.Run.Rows))
	}
	if r := st.Run.Rows[0]; r.P50 != nil || r.P99 != nil || r.E2E != nil {
		t.Errorf("no completed request: sent %v / %v / %v, want null / null / null", deref(r.P50), deref(r.P99), deref(r.E2E))
	}
	if r := st.Run.Rows[1]; r.P50 == nil || *r.P50 != 80 || r.P99 == nil || *r.P99 != 90 || r.E2E == nil || *r.E2E != 1000 {
		t.Errorf("sent %v / %v / %v, want 80 / 90 / 1000", deref(r.P50), deref(r.P99), deref(r.E2E))
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestRemovedEndpointNoSpike: when an endpoint leaves a pool the proxy
// deletes its series (forgetEndpoint), so the sums of the router's
// counters go down. That is not a counter reset: the remaining endpoints'
// counters carry on, and only what they added since the last point is new.
// Before, the whole of their lifetime counts was taken as the interval's:
// the throughput chart showed every request ever answered as one second's,
// the totals counted them again, and the TTFT of the last seconds was that
// of the router's whole life.
func TestRemovedEndpointNoSpike(t *testing.T) {
	reg, reqs, ttfb := testMetrics(t)
	now := time.Unix(1000, 0)
	d, err := New(Options{Source: fakeSource{newTestRouter(t)}, Gatherer: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	// Before the run: a answered 1000 fast requests, b 500 slow ones.
	reqs.WithLabelValues("a").Add(1000)
	reqs.WithLabelValues("b").Add(500)
	for range 1000 {
		ttfb.WithLabelValues("a").Observe(0.03)
	}
	for range 500 {
		ttfb.WithLabelValues("b").Observe(0.3)
	}
	d.Mark(now, "run")
	// a leaves the pool; b answers 2 requests at 80 ms.
	reqs.DeleteLabelValues("a")
	ttfb.DeleteLabelValues("a")
	reqs.WithLabelValues("b").Add(2)
	ttfb.WithLabelValues("b").Observe(0.08)
	ttfb.WithLabelValues("b").Observe(0.08)
	now = now.Add(time.Second)
	d.Sample(now)

	tot := d.Totals()
	if tot.Requests != 2 {
		t.Errorf("requests since the mark = %d, want 2", tot.Requests)
	}
	if tot.TTFTP99 <= 50*time.Millisecond || tot.TTFTP99 > 100*time.Millisecond {
		t.Errorf("TTFT p99 since the mark = %v, want within (50, 100] ms (the 2 new requests)", tot.TTFTP99)
	}
	d.mu.Lock()
	se := d.s.series()
	d.mu.Unlock()
	if rps := se.RPS[len(se.RPS)-1]; rps == nil || *rps != 2 {
		t.Errorf("last throughput point = %v rps, want 2", deref(rps))
	}
}
