package router

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/policy"
)

// eagerKVAware is kv-aware hiding its DeferredExplainer methods, so that
// its decisions carry their explanations as Pick builds them.
type eagerKVAware struct{ k *policy.KVAware }

func (p eagerKVAware) Pick(now time.Time, req *kvroute.Request, cands []kvroute.Candidate) kvroute.Decision {
	return p.k.Pick(now, req, cands)
}
func (p eagerKVAware) FirstToken(now time.Time, req *kvroute.Request, ep string) {
	p.k.FirstToken(now, req, ep)
}
func (p eagerKVAware) Observe(now time.Time, o kvroute.Outcome) { p.k.Observe(now, o) }
func (p eagerKVAware) Release(now time.Time, req *kvroute.Request, ep string) {
	p.k.Release(now, req, ep)
}
func (p eagerKVAware) RecycleScores(s []kvroute.Score, parts []kvroute.Part) ([]kvroute.Score, []kvroute.Part) {
	return p.k.RecycleScores(s, parts)
}

// TestDecisionsDeferredExplanation: a router whose kv-aware picker defers
// its explanations to the decision log (DeferredExplainer) logs the same
// records, scores and candidates as one whose picker explains in Pick,
// through rings that recycle the kept states many times over, and routes
// the same way.
func TestDecisionsDeferredExplanation(t *testing.T) {
	for _, logSize := range []int{5, 64} {
		t.Run(fmt.Sprintf("log=%d", logSize), func(t *testing.T) {
			newRouter := func(eager bool) *Router {
				k, err := policy.NewKVAware(nil, 1)
				if err != nil {
					t.Fatal(err)
				}
				var p kvroute.Picker = k
				if eager {
					p = eagerKVAware{k}
				}
				r, err := New(Config{Model: "m", Endpoints: eps(8), Policy: policy.Default, Picker: p, DecisionLog: logSize})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			lazy, eager := newRouter(false), newRouter(true)
			if _, ok := lazy.picker.(DeferredExplainer); !ok {
				t.Fatal("kv-aware is not a DeferredExplainer")
			}
			now := t0
			var fl [2][]*Flight
			explained := 0
			for i := range 300 {
				prompt := strings.Repeat(fmt.Sprintf("conversation %d. ", i%9), 40+i%50)
				for j, r := range []*Router{lazy, eager} {
					req := &kvroute.Request{ID: fmt.Sprint(i), Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4, SessionKey: fmt.Sprint(i % 4)}
					f, err := r.Route(now, req, nil)
					if err != nil {
						t.Fatal(err)
					}
					fl[j] = append(fl[j], f)
					if len(fl[j]) > 12 { // twelve in flight
						r.FirstToken(now, fl[j][0])
						r.Done(now, fl[j][0], kvroute.Outcome{TTFT: 40 * time.Millisecond, PromptTokens: 100})
						fl[j] = fl[j][1:]
					}
				}
				if a, b := fl[0][len(fl[0])-1].Endpoint.ID, fl[1][len(fl[1])-1].Endpoint.ID; a != b {
					t.Fatalf("request %d: deferring router chose %s, eager %s", i, a, b)
				}
				if i%37 == 0 || i == 299 {
					got, want := lazy.Decisions(0), eager.Decisions(0)
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("after request %d: deferred decisions differ:\n%+v\nwant\n%+v", i, got, want)
					}
					for _, rec := range got {
						if len(rec.Decision.Scores) > 0 && len(rec.Decision.Scores[0].Parts) > 0 {
							explained++
						}
					}
				}
				now = now.Add(time.Millisecond)
			}
			if explained == 0 {
				t.Fatal("no decision was explained: the comparison is vacuous")
			}
		})
	}
}

// TestRouteHashesPrompt: Route keeps the character-block hashes of the
// last prompt (reusing those of the blocks a new prompt shares with it):
// after every Route they are HashText of that prompt, whatever the two
// shared, and a request routed after another with the same prompt finds
// it cached.
func TestRouteHashesPrompt(t *testing.T) {
	r := defaultRouter(t)
	base := strings.Repeat("You are a careful assistant. ", 60)
	prompts := []string{base, base, base[:700] + "!" + base[701:], base[:300], base + base, "short", base, strings.ToUpper(base)}
	for i, prompt := range prompts {
		f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i), Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := kvindex.HashText(prompt, r.cfg.BlockChars, nil); !slices.Equal(r.hashes, want) {
			t.Fatalf("prompt %d: kept hashes %x, want HashText's %x", i, r.hashes, want)
		}
		if i == 1 && f.CachedTokens() == 0 {
			t.Fatal("the same prompt again: nothing cached")
		}
		r.Done(t0, f, kvroute.Outcome{})
	}
}

// TestRouteSaltedPrompt: a request with a cache_salt matches only the
// blocks routed with the same salt, and the hashes Route keeps between
// requests are never another salt's (an unsalted prompt after a salted one
// is hashed unsalted, whatever they share).
func TestRouteSaltedPrompt(t *testing.T) {
	r := defaultRouter(t)
	prompt := strings.Repeat("You are a careful assistant. ", 60)
	for i, tc := range []struct {
		salt   string
		cached bool
	}{{"a", false}, {"a", true}, {"b", false}, {"", false}, {"", true}, {"a", true}} {
		f, err := r.Route(t0, &kvroute.Request{ID: fmt.Sprint(i), Model: "m", Prompt: prompt, PromptTokens: len(prompt) / 4, CacheSalt: tc.salt}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := kvindex.HashTextSharedSalted(prompt, tc.salt, "", r.cfg.BlockChars, nil)
		if !slices.Equal(r.hashes, want) {
			t.Fatalf("request %d (salt %q): kept hashes %x, want %x", i, tc.salt, r.hashes, want)
		}
		if got := f.CachedTokens() > 0; got != tc.cached {
			t.Errorf("request %d (salt %q): cached %v, want %v", i, tc.salt, got, tc.cached)
		}
		r.Done(t0, f, kvroute.Outcome{})
	}
}

// defaultRouter is a router of 4 endpoints with the default policy.
func defaultRouter(t *testing.T) *Router {
	t.Helper()
	p, err := policy.New(policy.Default, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{Model: "m", Endpoints: eps(4), Picker: p})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
