package policy_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/sim"
	"github.com/kvroute/kvroute/workload"
)

var epochT = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// recorder wraps a picker and tallies its decisions.
type recorder struct {
	p                 kvroute.Picker
	reasons           map[string]int
	credit            int // picks whose chosen candidate got cache credit
	avail             int // picks where some healthy candidate cached something
	picks             int
	chosenTok, maxTok int
	// with KVROUTE_SIMDIAG_CSV: the chosen candidate's estimate per request,
	// joined with the observed TTFT at release.
	est     map[string][7]float64 // id -> queue_ms, prefill_ms, at (s), queued tokens, waiting, running, in-flight tokens
	lastObs kvroute.Outcome
	holders [65]int // picks by the number of healthy candidates caching a prefix of the request
	csv     *strings.Builder
	// with KVROUTE_SIMDIAG_COQ: picks by tenant and by whether the chosen
	// candidate had prefill queued (see queuedPick); coqSum sums, over the
	// picks of a queued candidate while an empty one was eligible, the
	// empty one's queue_ms, decode_ms and in_flight less the chosen's.
	coq    map[string]int
	coqSum [3]float64
	coqN   int
}

func (r *recorder) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	d := r.p.Pick(now, req, cands)
	r.picks++
	if w := os.Getenv("KVROUTE_SIMDIAG_REQ"); w != "" && strings.Contains(","+w+",", ","+req.ID+",") {
		fmt.Printf("%s at %v P=%d -> %s (%s)\n", req.ID, now.Sub(epochT), req.PromptTokens, d.Endpoint, d.Reason)
		for _, s := range d.Scores {
			fmt.Printf("    %s %.1f %v %q %v\n", s.Endpoint, s.Value, s.Eligible, s.Why, s.Parts)
		}
		if os.Getenv("KVROUTE_SIMDIAG_LOADS") != "" {
			for _, c := range cands {
				fmt.Printf("    load %s %+v\n", c.Endpoint.ID, c.Load)
			}
		}
	}
	for _, c := range cands {
		if c.Healthy && c.CachedTokens > 0 {
			r.avail++
			break
		}
	}
	nh := 0
	for _, c := range cands {
		if c.Healthy && c.CachedTokens > 0 {
			nh++
		}
	}
	r.holders[nh]++
	mx, mi := 0, -1
	for i, c := range cands {
		if c.Healthy && c.CachedTokens > mx {
			mx, mi = c.CachedTokens, i
		}
	}
	if mi >= 0 && mi < len(d.Scores) {
		r.reasons["best-cached why="+d.Scores[mi].Why]++
	}
	r.maxTok += mx
	if d.Index >= 0 {
		r.chosenTok += cands[d.Index].CachedTokens
	}
	if d.Index >= 0 && cands[d.Index].CachedTokens > 0 {
		r.credit++
	}
	if r.est != nil && d.Index >= 0 && d.Index < len(d.Scores) {
		var q, pf, qt float64
		for _, pt := range d.Scores[d.Index].Parts {
			switch pt.Name {
			case "queue_ms":
				q = pt.Value
			case "prefill_ms":
				pf = pt.Value
			case "queued_tokens":
				qt = pt.Value
			}
		}
		l := cands[d.Index].Load
		r.est[req.ID] = [7]float64{q, pf, now.Sub(epochT).Seconds(), qt, float64(l.Waiting), float64(l.Running), float64(l.InFlightTokens)}
	}
	if d.Index >= 0 && d.Index < len(d.Scores) && os.Getenv("KVROUTE_SIMDIAG_COQ") != "" {
		r.queuedPick(d, cands, req.Tenant)
	}
	reason, _, _ := strings.Cut(d.Reason, ":")
	r.reasons[reason]++
	return d
}

// part returns score s's part name (0 when it has none).
func part(s kvroute.Score, name string) float64 {
	for _, pt := range s.Parts {
		if pt.Name == name {
			return pt.Value
		}
	}
	return 0
}

// queuedPick tallies a decision of tenant's request by whether the chosen
// candidate had prefill queued (queued_tokens > 0: the request shares or
// waits for its steps) and, when it had, whether an eligible candidate
// credited at least as many cached tokens had none, and then which score
// part favoured the chosen one most (kv-aware's parts).
func (r *recorder) queuedPick(d kvroute.Decision, cands []kvroute.Candidate, tenant string) {
	if r.coq == nil {
		r.coq = map[string]int{}
	}
	tenant += ": "
	ch := d.Scores[d.Index]
	if part(ch, "queued_tokens") == 0 {
		r.coq[tenant+"chose an empty queue"]++
		return
	}
	bi := -1
	for i, s := range d.Scores {
		if !cands[i].Healthy || !s.Eligible || i == d.Index || part(s, "queued_tokens") > 0 || part(s, "cached_tokens") < part(ch, "cached_tokens") {
			continue
		}
		if bi < 0 || s.Value < d.Scores[bi].Value {
			bi = i
		}
	}
	if bi < 0 {
		r.coq[tenant+"chose a queue, none empty with its credit"]++
		return
	}
	b := d.Scores[bi]
	most, by := 0.0, "none"
	for _, n := range []string{"queue_ms", "prefill_ms", "work_ms", "decode_ms"} {
		if v := part(b, n) - part(ch, n); v > most {
			most, by = v, n
		}
	}
	r.coq[tenant+"chose a queue over an empty one, by "+by]++
	r.coqSum[0] += part(b, "queue_ms") - part(ch, "queue_ms")
	r.coqSum[1] += part(b, "decode_ms") - part(ch, "decode_ms")
	r.coqSum[2] += part(b, "in_flight") - part(ch, "in_flight")
	r.coqN++
}

func (r *recorder) FirstToken(now time.Time, req *kvroute.Request, ep string) {
	if f, ok := r.p.(interface {
		FirstToken(time.Time, *kvroute.Request, string)
	}); ok {
		f.FirstToken(now, req, ep)
	}
}
func (r *recorder) Observe(now time.Time, o kvroute.Outcome) {
	r.lastObs = o
	if l, ok := r.p.(kvroute.Learner); ok {
		l.Observe(now, o)
	}
}
func (r *recorder) Release(now time.Time, req *kvroute.Request, ep string) {
	if e, ok := r.est[req.ID]; ok && r.csv != nil {
		fmt.Fprintf(r.csv, "%s,%s,%.4f,%d,%d,%.1f,%.1f,%.1f,%.0f,%.0f,%.0f,%.0f\n", req.ID, ep, e[2], req.PromptTokens, r.lastObs.CachedTokens,
			e[0], e[1], float64(r.lastObs.TTFT)/float64(time.Millisecond), e[3], e[4], e[5], e[6])
	}
	if l, ok := r.p.(kvroute.Releaser); ok {
		l.Release(now, req, ep)
	}
}

// TestSimDiag runs policies through the fleet simulator on the embedded
// Mooncake conversation trace and prints TTFT percentiles and decision
// statistics. Diagnostic only: KVROUTE_SIMDIAG=policies[;limit;rate;params[;generator]]
// e.g. KVROUTE_SIMDIAG="kv-aware,dynamo;3000;4;c=1.5" (trace, rate scale 4) or
// KVROUTE_SIMDIAG="kv-aware;2000;40;;tenants" (generator, 40 requests/s).
// KVROUTE_SIMDIAG_SEED sets the seed (default 1), KVROUTE_SIMDIAG_REQ=id,...
// prints those requests' decisions (KVROUTE_SIMDIAG_LOADS=1: with each
// candidate's Load), KVROUTE_SIMDIAG_CSV=prefix writes each
// request's chosen estimate next to its observed TTFT, KVROUTE_SIMDIAG_COQ=1
// tallies the picks of an endpoint with prefill queued (queuedPick),
// KVROUTE_SIMDIAG_ENGINES=n runs n engines rather than 8 (the lora rows'
// 6 and 7) and KVROUTE_SIMDIAG_MAXLORAS=n sets their --max-loras.
func TestSimDiag(t *testing.T) {
	spec := os.Getenv("KVROUTE_SIMDIAG")
	if spec == "" {
		t.Skip("set KVROUTE_SIMDIAG to run")
	}
	parts := strings.Split(spec, ";")
	limit, rate := 3000, 4.0
	if len(parts) > 1 {
		fmt.Sscan(parts[1], &limit)
	}
	if len(parts) > 2 {
		fmt.Sscan(parts[2], &rate)
	}
	params := map[string]any{}
	if len(parts) > 3 && parts[3] != "" {
		for _, kv := range strings.Split(parts[3], ",") {
			k, v, _ := strings.Cut(kv, "=")
			params[k] = v
		}
	}
	seed := uint64(1)
	if v := os.Getenv("KVROUTE_SIMDIAG_SEED"); v != "" {
		fmt.Sscan(v, &seed)
	}
	w, err := sim.DefaultWorkload()
	if len(parts) > 4 && parts[4] != "" {
		w, err = workload.Generate(parts[4], workload.Options{Seed: seed, Requests: limit, Arrivals: workload.Arrivals{Rate: rate}})
		rate = 1
	}
	if err != nil {
		t.Fatal(err)
	}
	reqs := w.Requests
	if len(reqs) > limit {
		reqs = reqs[:limit]
	}
	nEng := "8"
	if v := os.Getenv("KVROUTE_SIMDIAG_ENGINES"); v != "" {
		nEng = v
	}
	fleet, _ := sim.ParseFleet(nEng, "llama-3.1-8b-h100")
	for _, name := range strings.Split(parts[0], ",") {
		var pp map[string]any
		if name == policy.NameKVAware {
			pp = params
		}
		p, err := policy.New(name, pp, seed)
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{p: p, reasons: map[string]int{}}
		out := os.Getenv("KVROUTE_SIMDIAG_CSV")
		if out != "" {
			rec.est, rec.csv = map[string][7]float64{}, &strings.Builder{}
			rec.csv.WriteString("id,endpoint,at_s,prompt,cached,est_queue_ms,est_prefill_ms,ttft_ms,queued_tokens,waiting,running,inflight_tokens\n")
		}
		maxLoRAs := 1
		if v := os.Getenv("KVROUTE_SIMDIAG_MAXLORAS"); v != "" {
			fmt.Sscan(v, &maxLoRAs)
		}
		res, err := sim.Run(context.Background(), sim.Config{Fleet: fleet, Policy: name, Picker: rec, Seed: seed, RateScale: rate, MaxLoRAs: maxLoRAs}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if out != "" {
			if err := os.WriteFile(out+"."+name+".csv", []byte(rec.csv.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		row := res.Row(0)
		var rs []string
		for k, v := range rec.reasons {
			rs = append(rs, fmt.Sprintf("%s=%d", k, v))
		}
		sort.Strings(rs)
		t.Logf("%-18s %+v", name, row)
		t.Logf("%-18s picks %d, some cache %d, chosen cached %d; cached tokens chosen %d of best %d; reasons %v",
			name, rec.picks, rec.avail, rec.credit, rec.chosenTok, rec.maxTok, rs)
		t.Logf("%-18s picks by candidates caching a prefix: %v", name, rec.holders[:9])
		if rec.coq != nil {
			var qs []string
			for k, v := range rec.coq {
				qs = append(qs, fmt.Sprintf("%s=%d", k, v))
			}
			sort.Strings(qs)
			n := float64(max(rec.coqN, 1))
			t.Logf("%-18s picks by queue: %s; over an empty one, the empty one's queue_ms %+.1f, decode_ms %+.1f, in_flight %+.1f on average",
				name, strings.Join(qs, ", "), rec.coqSum[0]/n, rec.coqSum[1]/n, rec.coqSum[2]/n)
		}
	}
}
