package bench

import (
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/workload"
)

// Oracle is the bound on a report row's prefix-cache hit rate (the
// oracle% column): the hit rate an infinite cache shared by every engine
// (workload.Oracle) would have had on the same requests.
//
// Two things make the bound comparable with the measured hit%. It is taken
// over the requests hit% counts (report.Summarize: completed, with cached
// tokens reported), not over every request sent: a failed request is
// neither a hit nor a miss there. And it remembers every prompt sent
// through it, failed ones included (the server may have cached them), so
// that consecutive runs against one server (a --sweep, whose caches carry
// over) are bounded by what the server may already hold instead of by a
// cold start. It cannot know what the server held before its first run.
//
// Not safe for concurrent use.
type Oracle struct {
	o    *workload.Oracle
	hits int64 // o's cached tokens so far
	buf  []uint64
}

// NewOracle returns an oracle at the given block size (<= 0 means 16)
// that has seen nothing: the server starts cold.
func NewOracle(blockSize int) *Oracle {
	return &Oracle{o: workload.NewOracle(blockSize)}
}

// Observe records a request sent to the server and returns how many of its
// prompt tokens the oracle had cached.
func (o *Oracle) Observe(r *workload.Request) int {
	o.buf = o.o.Observe(r, o.buf)
	hits := o.o.CachedTokens()
	d := hits - o.hits
	o.hits = hits
	return int(d)
}

// HitRate observes the requests of one run that were sent (those with a
// sample, matched by ID; reqs in the order Run issued them) and returns
// the bound on that run's hit%: the oracle's cached tokens over the prompt
// tokens of the requests whose samples count in report.Row.HitRate. When
// no sample counts there (the server does not report cached tokens, so
// hit% is unknown, or no request completed) it is the bound over every
// request sent. It returns -1 when no request was sent.
func (o *Oracle) HitRate(reqs []workload.Request, samples []report.Sample) float64 {
	type tally struct{ sent, counted int }
	byID := make(map[string]*tally, len(samples))
	for i := range samples {
		s := &samples[i]
		t := byID[s.ID]
		if t == nil {
			t = &tally{}
			byID[s.ID] = t
		}
		t.sent++
		if s.OK() && s.CachedTokens >= 0 { // as report.Summarize counts hit%
			t.counted++
		}
	}
	var hit, prompt, sentHit, sentPrompt int64
	for i := range reqs {
		r := &reqs[i]
		t := byID[r.ID]
		if t == nil || t.sent == 0 {
			continue // not sent
		}
		t.sent--
		h := int64(o.Observe(r))
		sentHit += h
		sentPrompt += int64(r.PromptLen)
		if t.counted > 0 {
			t.counted--
			hit += h
			prompt += int64(r.PromptLen)
		}
	}
	switch {
	case prompt > 0:
		return float64(hit) / float64(prompt)
	case sentPrompt > 0:
		return float64(sentHit) / float64(sentPrompt)
	}
	return -1
}
