package router

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
)

// DecisionRecord is one routing decision with every candidate's inputs, as
// /debug/decisions and the dashboard show it.
type DecisionRecord struct {
	Seq          uint64           `json:"seq"`
	Time         time.Time        `json:"time"`
	RequestID    string           `json:"request_id"`
	Model        string           `json:"model"`
	Adapter      string           `json:"adapter,omitempty"` // the LoRA adapter requested (kvroute.Request.Adapter)
	Tenant       string           `json:"tenant,omitempty"`
	SessionKey   string           `json:"session_key,omitempty"`
	PromptTokens int              `json:"prompt_tokens"`
	Blocks       int              `json:"blocks"`
	Decision     kvroute.Decision `json:"decision"`
	Candidates   []CandidateInput `json:"candidates"`
}

// CandidateInput is what the router knew about one candidate when deciding.
type CandidateInput struct {
	Endpoint     string  `json:"endpoint"`
	Healthy      bool    `json:"healthy"`
	Waiting      int     `json:"waiting"`
	Running      int     `json:"running"`
	InFlight     int     `json:"in_flight"`
	KVUsage      float64 `json:"kv_usage"`
	CachedBlocks int     `json:"cached_blocks"`
	CachedTokens int     `json:"cached_tokens"`
	Tier         string  `json:"tier"`
	Precise      bool    `json:"precise"`
	Evicts       bool    `json:"evicts,omitempty"`     // no room left for the prompt's uncached blocks (kvroute.Candidate.Evicts)
	HorizonMS    float64 `json:"horizon_ms,omitempty"` // then how long the record keeps a block (kvroute.Candidate.Horizon)
	Stale        bool    `json:"stale"`
	// SignalAgeMS is the age of the candidate's engine signals at the
	// decision (kvroute.Load.Age); nil, JSON null, when they were never
	// scraped: the candidate is then stale, its waiting and running the
	// router's own estimates. (An age of 0 read as just scraped.)
	SignalAgeMS *float64 `json:"signal_age_ms"`
}

// decisionLog is a ring of the last decisions; slots and their slices are
// reused, so logging allocates nothing in steady state. A slot keeps the
// candidates as the picker saw them; they become CandidateInputs only when
// someone reads the log (Decisions), off the routing path. So does the
// explanation of a DeferredExplainer's decision.
type decisionLog struct {
	ring   []DecisionRecord      // Candidates stays nil: see cands
	cands  [][]kvroute.Candidate // per slot: the candidates of the slot's decision
	scores [][]kvroute.Score     // per slot: the storage behind the slot's Decision.Scores
	parts  [][]kvroute.Part      // per slot: the storage behind their Parts
	kept   []keptExplanation     // per slot: a deferred explanation (by nil: none)
	// unlisted, per slot: the indexes of the decision's candidates that
	// were no candidates because their llama.cpp server did not list the
	// request's adapter (Router.unlisted), for adapterWhy.
	unlisted [][]int32
	next     int
	seq      uint64
}

// keptExplanation is a decision's deferred explanation: by renders state.
type keptExplanation struct {
	by    DeferredExplainer
	state any
}

// DeferredExplainer is implemented by pickers that can leave a decision's
// explanation (Decision.Scores) to be rendered when someone reads it, from
// the state the decision was made from and by the same code that would
// have built it in Pick, as policy.KVAware does. The router calls
// DeferExplanations when it takes the picker; from then on Pick leaves
// Scores nil, and after each Pick that the decision log keeps, the log
// calls KeepExplanation and keeps its result until Decisions renders it
// with Explain. Building 64 candidates' scores for every decision, almost
// all never read, was about a tenth of a decision.
type DeferredExplainer interface {
	DeferExplanations()
	// KeepExplanation returns the state that renders the last Pick's
	// explanation and takes recycled, a state it returned before that the
	// log no longer keeps (or nil), as storage for later Picks.
	KeepExplanation(recycled any) any
	// Explain renders a kept state for the candidates of its decision:
	// the decision's Scores, and its whole Reason when Pick left only a
	// part of it (a deferring picker may leave out what is costly to
	// format; "" keeps the decision's). It must not change the picker:
	// Decisions calls it between Picks.
	Explain(kept any, cands []kvroute.Candidate) (scores []kvroute.Score, reason string)
}

// ScoreRecycler is implemented by pickers that keep their explanations
// (Decision.Scores and the scores' Parts) in buffers they reuse, as
// policy.KVAware does. The decision log then keeps a decision's buffers
// instead of copying the explanation out of them, and gives the picker the
// buffers of the decision it drops in exchange: RecycleScores is called
// after each Pick whose decision has Scores, with buffers the picker may
// use from its next Pick on, and returns the buffers behind that
// decision's Scores and Parts, which the picker must not touch again.
// Copying a 64-candidate explanation into the log was about a tenth of a
// decision.
type ScoreRecycler interface {
	RecycleScores(scores []kvroute.Score, parts []kvroute.Part) ([]kvroute.Score, []kvroute.Part)
}

func newDecisionLog(n int) decisionLog {
	if n < 0 {
		n = 0
	}
	return decisionLog{ring: make([]DecisionRecord, n), cands: make([][]kvroute.Candidate, n),
		scores: make([][]kvroute.Score, n), parts: make([][]kvroute.Part, n), kept: make([]keptExplanation, n),
		unlisted: make([][]int32, n)}
}

// take logs a decision and keeps cands itself instead of a copy: it
// returns the candidates of the decision it drops (or new ones when none)
// for the caller's next decision, with the same Endpoints as cands and
// the other fields for the caller to set. With the log disabled it
// returns cands. dx is the picker that made d when it defers its
// explanations (see put). unlisted (copied) are the indexes of the
// candidates whose llama.cpp server does not list the request's adapter.
func (l *decisionLog) take(now time.Time, req *kvroute.Request, d kvroute.Decision, cands []kvroute.Candidate, unlisted []int32, rcy ScoreRecycler, dx DeferredExplainer) []kvroute.Candidate {
	if len(l.ring) == 0 {
		return cands
	}
	slot := l.put(now, req, d, rcy, dx)
	l.unlisted[slot] = append(l.unlisted[slot][:0], unlisted...)
	old := l.cands[slot]
	l.cands[slot] = cands
	if len(old) != len(cands) {
		old = make([]kvroute.Candidate, len(cands))
		for i := range old {
			old[i].Endpoint = cands[i].Endpoint
		}
	}
	return old
}

// put logs a decision but for its candidates and returns its slot. With a
// deferring explainer (dx: the picker that made d) the slot keeps dx's
// state of the decision, handing dx the state the slot held when dx made
// it; with a recycler (the picker that made d) the slot takes over the
// buffers behind d's explanation; otherwise the explanation is copied into
// the slot's own.
func (l *decisionLog) put(now time.Time, req *kvroute.Request, d kvroute.Decision, rcy ScoreRecycler, dx DeferredExplainer) int {
	l.seq++
	slot := l.next
	rec := &l.ring[slot]
	l.next = (l.next + 1) % len(l.ring)
	rec.Seq, rec.Time, rec.RequestID, rec.Model, rec.Adapter = l.seq, now, req.ID, req.Model, req.Adapter
	rec.Tenant, rec.SessionKey, rec.PromptTokens, rec.Blocks = req.Tenant, req.SessionKey, req.PromptTokens, len(req.BlockHashes)
	rec.Decision = d
	if k := &l.kept[slot]; dx != nil {
		var recycled any
		if k.by == dx {
			recycled = k.state
		}
		*k = keptExplanation{by: dx, state: dx.KeepExplanation(recycled)}
	} else if k.by != nil {
		*k = keptExplanation{}
	}
	if rcy != nil && d.Scores != nil {
		l.scores[slot], l.parts[slot] = rcy.RecycleScores(l.scores[slot][:0], l.parts[slot][:0])
		return slot
	}
	// Deep-copy the explanation into the slot's own storage: pickers may
	// reuse their score buffers on the next call. The scores in one copy,
	// then their parts into one backing array, each score's Parts
	// re-pointed at its own run.
	scores := append(l.scores[slot][:0], d.Scores...)
	n := 0
	for i := range scores {
		n += len(scores[i].Parts)
	}
	parts := l.parts[slot]
	if cap(parts) < n {
		parts = make([]kvroute.Part, n)
	}
	parts = parts[:n]
	at := 0
	for i := range scores {
		sc := &scores[i]
		if sc.Parts == nil {
			continue // stays nil, as the picker left it
		}
		end := at + copy(parts[at:], sc.Parts)
		sc.Parts = parts[at:end:end]
		at = end
	}
	l.scores[slot], l.parts[slot] = scores, parts
	if d.Scores != nil {
		rec.Decision.Scores = scores
	}
	return slot
}

// candidateInputs converts a decision's candidates as the router saw them
// at now.
func candidateInputs(now time.Time, cands []kvroute.Candidate) []CandidateInput {
	out := make([]CandidateInput, len(cands))
	var ages []float64 // behind the SignalAgeMS pointers
	for i := range cands {
		c := &cands[i]
		out[i] = CandidateInput{
			Endpoint: c.Endpoint.ID, Healthy: c.Healthy,
			Waiting: c.Load.Waiting, Running: c.Load.Running, InFlight: c.Load.InFlight, KVUsage: c.Load.KVUsage,
			CachedBlocks: c.CachedBlocks, CachedTokens: c.CachedTokens, Tier: c.Tier.String(), Precise: c.Precise,
			Evicts: c.Evicts, HorizonMS: float64(c.Horizon) / float64(time.Millisecond),
			Stale: c.Load.Stale,
		}
		if !c.Load.ObservedAt.IsZero() {
			if ages == nil {
				ages = make([]float64, len(cands))
			}
			ages[i] = float64(c.Load.Age(now)) / float64(time.Millisecond)
			out[i].SignalAgeMS = &ages[i]
		}
	}
	return out
}

// Decisions returns up to n of the latest decisions, newest first (n <= 0
// or past the log's size: the whole log). The records are copies, safe to
// keep.
//
// It takes the router's lock for one decision at a time (rendering one,
// its candidates and its deferred explanation, is some tens of
// microseconds for 64 candidates), so routing goes on between them:
// holding it for the whole read (256 such decisions: 17 ms) stalled every
// request of the model meanwhile. The decisions are those logged when it
// is called; if routing overwrites one of them before its turn, the
// older ones are gone too and the list ends there.
func (r *Router) Decisions(n int) []DecisionRecord {
	r.mu.Lock()
	size, newest := len(r.log.ring), r.log.seq
	r.mu.Unlock()
	if n <= 0 || n > size {
		n = size
	}
	out := make([]DecisionRecord, 0, min(uint64(n), newest))
	for seq := newest; seq > 0 && len(out) < n; seq-- {
		rec, ok := r.decision(seq)
		if !ok {
			break
		}
		out = append(out, rec)
	}
	return out
}

// decision returns a copy of the logged decision numbered seq, rendered
// (its candidates' inputs, its explanation), and true; false when the log
// no longer holds it. The decision numbered seq is in slot (seq-1) mod the
// log's size (put fills the slots in turn from the first decision on).
func (r *Router) decision(seq uint64) (DecisionRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := &r.log
	slot := int((seq - 1) % uint64(len(l.ring)))
	rec := &l.ring[slot]
	if rec.Seq != seq {
		return DecisionRecord{}, false
	}
	cp := *rec
	cp.Candidates = candidateInputs(rec.Time, l.cands[slot])
	if k := l.kept[slot]; k.by != nil {
		scores, reason := k.by.Explain(k.state, l.cands[slot])
		if cp.Decision.Scores = scores; scores == nil {
			cp.Decision.Scores = []kvroute.Score{}
		}
		if reason != "" {
			cp.Decision.Reason = reason
		}
		adapterWhy(&cp, l.cands[slot], l.unlisted[slot])
		return cp, true
	}
	cp.Decision.Scores = make([]kvroute.Score, len(rec.Decision.Scores))
	for j, sc := range rec.Decision.Scores {
		sc.Parts = append([]kvroute.Part(nil), sc.Parts...)
		cp.Decision.Scores[j] = sc
	}
	adapterWhy(&cp, l.cands[slot], l.unlisted[slot])
	return cp, true
}

// adapterWhy says, in the explanation of a decision for a LoRA adapter,
// why a candidate that does not serve it was not one: Route offers it to
// the picker as not healthy, which the picker's explanation calls it. It
// does not serve it when the config does not give it the adapter, or when
// its llama.cpp server did not list it at the decision (unlisted: indexes
// in cands). Scores are matched to candidates by endpoint ID: a picker's
// explanation need not have one score per candidate in the pool's order
// (the P/D disagg.Planner's starts with the plan's, then the decode
// stage's).
func adapterWhy(rec *DecisionRecord, cands []kvroute.Candidate, unlisted []int32) {
	if rec.Adapter == "" {
		return
	}
	for i := range rec.Decision.Scores {
		s := &rec.Decision.Scores[i]
		c := -1
		if i < len(cands) && cands[i].Endpoint.ID == s.Endpoint {
			c = i
		} else {
			for j := range cands {
				if cands[j].Endpoint.ID == s.Endpoint {
					c = j
					break
				}
			}
		}
		switch {
		case c < 0:
		case !cands[c].Endpoint.ServesAdapter(rec.Adapter):
			s.Why = fmt.Sprintf("does not serve adapter %q", rec.Adapter)
		case slices.Contains(unlisted, int32(c)):
			s.Why = fmt.Sprintf("its llama.cpp server does not list adapter %q (GET /lora-adapters)", rec.Adapter)
		}
	}
}
