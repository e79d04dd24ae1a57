package policy

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

// refEstimate is estimate as written before its memory (estimateMemo,
// attnMemo): every term computed afresh. TestEstimateMemo checks estimate
// against it.
func refEstimate(k *KVAware, c *kvroute.Candidate, st *candState, P int) {
	p := &k.p
	l := &c.Load
	tok, reqMs, learnedReq := k.fleetTok, k.fleetReq, k.fleetLearned
	if k.perEp && st.es != nil {
		tok, reqMs, learnedReq = k.rates(st.es)
	}
	own := float64(P - int(st.credit))
	cpu := 0.0
	if c.Tier == kvroute.TierCPU && st.credit > 0 {
		cpu = float64(st.credit)
	}
	queued := st.queued
	stepMs := (p.StepOverheadUs + float64(max(l.Running, 0))*p.DecodeUsPerToken +
		float64(max(l.DecodeTokens, 0))/1000*p.DecodeUsPerCtxKTok) / 1000
	budget := max(float64(p.MaxBatchedTokens-max(l.Running, 0)), float64(p.MaxBatchedTokens)/4)
	stepsQ := math.Ceil(queued / budget)
	stepsAll := max(math.Ceil((queued+own)/budget), stepsQ+1)
	size := k.meanUncached
	if s := st.es; s != nil {
		switch {
		case k.firstTokens && s.pendTok > 0:
			size = s.pendSq / s.pendTok
		case !k.firstTokens && s.sumTok > 0:
			size = s.sumSq / s.sumTok
		}
	}
	ratio := k.ratio
	queueMs := queued*tok*(1+ratio*size/2000) + stepsQ*stepMs
	if p.StepPhase && (l.Running > 0 || queued > 0) && st.es != nil && st.es.stepAt != 0 {
		el := k.now.Sub(time.Unix(0, st.es.stepAt)).Seconds() * 1000
		w := stepMs / 2
		if el >= 0 && el < stepMs {
			w = stepMs - el
		}
		st.stepWaitMs = float32(w)
		queueMs += float64(st.stepWaitMs)
	}
	if learnedReq {
		queueMs = math.Max(queueMs, float64(l.Queue())*reqMs)
	} else {
		queueMs += float64(l.Queue()) * reqMs
	}
	ctxK := (float64(st.credit) + own/2) / 1000
	attn := 1 + ratio*ctxK
	prefMs := own*tok*attn + cpu*tok*p.CPUHitCost + (stepsAll-stepsQ)*stepMs
	st.queued, st.queueMs, st.prefMs = queued, queueMs, prefMs
	est := queueMs + prefMs
	st.work = own * tok * attn
	dstep := (p.StepOverheadUs + float64(max(l.InFlight, l.Running, 0)+1)*p.DecodeUsPerToken +
		float64(max(l.DecodeTokens, 0)+max(l.InFlightTokens, 0)+P)/1000*p.DecodeUsPerCtxKTok) / 1000
	st.decode = p.DecodeWeight * k.outTokens * dstep
	st.score = est + k.workW*st.work + st.decode
}

// TestEstimateMemo: estimate, which keeps terms per candidate position and
// across candidates, gives bit for bit what computing every term afresh
// gives (refEstimate), over candidates whose inputs repeat (drawn from few
// values, zeros of both signs among them, as an idle fleet's do), change
// one at a time, and come with other prompts and learned rates.
func TestEstimateMemo(t *testing.T) {
	for _, params := range []map[string]any{nil, {"learn": true, "learn_per_endpoint": true, "learn_min_samples": 0}} {
		k, err := NewKVAware(params, 1)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(5, 6))
		const n = 8
		cands := make([]kvroute.Candidate, n)
		for i := range cands {
			cands[i].Endpoint = &kvroute.Endpoint{ID: "ep" + strconv.Itoa(i)}
			cands[i].Healthy = true
		}
		k.Pick(epoch, &kvroute.Request{PromptTokens: 100}, cands) // sizes the memory, sets the Pick's rates
		stats := []*epStats{nil, {pendTok: 300, pendSq: 90000, sumTok: 50, sumSq: 900, tokMs: 0.03, reqMs: 2, nTok: 9, nReq: 9},
			{pendTok: 0, sumTok: 0}, {pendTok: 1e3, pendSq: 2e6, sumTok: 7, sumSq: 49, stepAt: epoch.UnixNano()}}
		pick := func(vals ...int) int { return vals[r.IntN(len(vals))] }
		fpick := func(vals ...float64) float64 { return vals[r.IntN(len(vals))] }
		P := 4096
		for step := range 20000 {
			if r.IntN(50) == 0 {
				P = pick(0, 1, 4096, 8192)
				k.meanUncached = fpick(0, 1024, 333.3)
				k.firstTokens = r.IntN(2) == 0
				k.outTokens = fpick(0, 128, 256)
				k.workW = fpick(0, 1, 2.5)
				// Before, within and past the last step begun at epoch.
				k.now = epoch.Add(time.Duration(pick(-3, 0, 1, 7, 1000)) * time.Millisecond)
			}
			i := r.IntN(n)
			c := &cands[i]
			switch r.IntN(4) {
			case 0:
				c.Load.Running, c.Load.DecodeTokens = pick(-1, 0, 3, 40), pick(-5, 0, 3000, 120000)
			case 1:
				c.Load.Waiting, c.Load.InFlight = pick(0, 2, 9), pick(0, 1, 12)
			case 2:
				c.Tier = kvroute.Tier(r.IntN(3))
			}
			st := candState{es: stats[r.IntN(len(stats))], credit: int32(min(pick(0, 0, 16, 1024, 4096), P)),
				queued: fpick(0, math.Copysign(0, -1), 100, 8192, 70000.5)}
			want := st
			refEstimate(k, c, &want, P)
			k.estimate(i, c, &st, P)
			if !sameBits(st, want) {
				t.Fatalf("params %v, step %d, candidate %d (%+v), P %d: got %+v, want %+v", params, step, i, c.Load, P, st, want)
			}
		}
	}
}

// sameBits reports whether two candidate states are equal, their floats
// bit for bit (a -0 is not a 0).
func sameBits(a, b candState) bool {
	fa := []float64{a.work, a.score, a.queueMs, a.prefMs, a.queued}
	fb := []float64{b.work, b.score, b.queueMs, b.prefMs, b.queued}
	for i := range fa {
		if math.Float64bits(fa[i]) != math.Float64bits(fb[i]) {
			return false
		}
	}
	a.work, a.score, a.queueMs, a.prefMs, a.queued = 0, 0, 0, 0, 0
	b.work, b.score, b.queueMs, b.prefMs, b.queued = 0, 0, 0, 0, 0
	return a == b
}

// TestKVAwareMemoAcrossPicks: a policy that keeps estimate's terms from
// Pick to Pick decides as one whose memory is wiped before every Pick,
// over a fleet whose loads mostly stay, change a few at a time, and whose
// candidates change places.
func TestKVAwareMemoAcrossPicks(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	got, err := NewKVAware(nil, 3)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := NewKVAware(nil, 3)
	_, cands := randomState(r, 16, true)
	now := epoch
	for step := range 3000 {
		req, fresh := randomState(r, len(cands), true)
		req.ID = strconv.Itoa(step)
		for range 1 + r.IntN(3) { // a few loads change
			i := r.IntN(len(cands))
			cands[i].Load = fresh[i].Load
		}
		for i := range cands { // the prompt's cache hits are the request's
			cands[i].CachedBlocks, cands[i].CachedTokens, cands[i].Tier = fresh[i].CachedBlocks, fresh[i].CachedTokens, fresh[i].Tier
		}
		if r.IntN(20) == 0 {
			r.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		}
		want.memo, want.attnMemo = nil, attnMemo{}
		dw := cloneDecision(want.Pick(now, req, cands))
		dg := cloneDecision(got.Pick(now, req, cands))
		if !reflect.DeepEqual(dg, dw) {
			t.Fatalf("step %d: got %+v, want %+v", step, dg, dw)
		}
		for i := range got.c {
			g, w := got.c[i], want.c[i]
			if (g.es == nil) != (w.es == nil) {
				t.Fatalf("step %d, candidate %d: got stats %v, want %v", step, i, g.es, w.es)
			}
			g.es, w.es = nil, nil // each policy's own
			if !sameBits(g, w) {
				t.Fatalf("step %d, candidate %d: got %+v, want %+v", step, i, got.c[i], want.c[i])
			}
		}
		if r.IntN(2) == 0 {
			got.FirstToken(now, req, "")
			want.FirstToken(now, req, "")
		}
		if r.IntN(3) == 0 {
			got.Release(now, req, "")
			want.Release(now, req, "")
		}
		now = now.Add(time.Duration(r.IntN(50)) * time.Millisecond)
	}
}

// TestSameString: sameString is ==, whether the two strings are the same
// bytes in memory or copies.
func TestSameString(t *testing.T) {
	id := "endpoint-7"
	cp := string([]byte(id))
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{id, id, true}, {id, cp, true}, {"", "", true}, {id, id[:9], false},
		{id, "endpoint-8", false}, {id[:9], id[1:], false}, {"", id, false},
	} {
		if got := sameString(c.a, c.b); got != c.want || got != (c.a == c.b) {
			t.Errorf("sameString(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
