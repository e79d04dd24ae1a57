package workload

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Options configures a generator. Zero fields take their defaults.
type Options struct {
	// Seed makes the workload reproducible; the same seed and options give
	// the same requests.
	Seed uint64
	// Requests is the number of requests to generate; default 1000.
	Requests int
	// Duration, when > 0, drops requests arriving after it.
	Duration time.Duration
	// Arrivals is the arrival process of new sessions / requests; default
	// Poisson at 10 requests per second (the rate counts requests, not
	// sessions, for every generator).
	Arrivals Arrivals
	// Params are the generator's own parameters (see Generators); a name the
	// generator does not know is an error.
	Params map[string]float64
}

// Param documents one generator parameter and the values Generate accepts.
type Param struct {
	Name    string
	Default float64
	Doc     string
	// Min and Max bound the value (inclusive). Lengths are at most MaxLen
	// tokens; counts and times have bounds that keep a workload's
	// generation, hashing and memory in proportion to its requests.
	Min, Max float64
	// Int marks a count or a fixed length, which must be a whole number.
	Int bool
}

// check reports a value outside the parameter's range, naming generator g.
func (p Param) check(g string, v float64) error {
	switch {
	case math.IsNaN(v) || v < p.Min || v > p.Max:
		what := ""
		if p.Min == 1 && slices.Contains(outputParams, p.Name) {
			what = ": a request generates at least one token"
		}
		return fmt.Errorf("workload: generator %s: parameter %s=%v must be in [%s, %s]%s", g, p.Name, v,
			strconv.FormatFloat(p.Min, 'f', -1, 64), strconv.FormatFloat(p.Max, 'f', -1, 64), what)
	case p.Int && v != math.Trunc(v):
		return fmt.Errorf("workload: generator %s: parameter %s=%v must be a whole number", g, p.Name, v)
	}
	return nil
}

// Generator describes a built-in workload generator.
type Generator struct {
	Name    string
	Summary string
	Params  []Param
	gen     func(g *gen) []Request
}

// Generators returns the built-in generators in name order.
func Generators() []Generator {
	out := slices.Clone(generators)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// GeneratorNames returns the built-in generators' names in order.
func GeneratorNames() []string {
	var names []string
	for _, g := range Generators() {
		names = append(names, g.Name)
	}
	return names
}

// ParseParams parses "k=v,k=v" (v a number; durations in seconds).
func ParseParams(s string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("workload: param %q is not key=value", kv)
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("workload: param %s: %q is not a number", k, v)
		}
		out[strings.TrimSpace(k)] = f
	}
	return out, nil
}

// Generate runs the named generator (see Generators) with opts. The
// requests are sorted by arrival, numbered r000000..., and carry HashIDs so
// that WriteTrace/ReadTrace round-trips them exactly. No drawn length is
// above MaxLen, and a request whose prompt adds up to more than MaxLen
// tokens (ReadTrace's limit) is an error.
func Generate(name string, opts Options) (*Workload, error) {
	var g *Generator
	for i := range generators {
		if generators[i].Name == name {
			g = &generators[i]
		}
	}
	if g == nil {
		return nil, fmt.Errorf("workload: unknown generator %q (have %s)", name, strings.Join(GeneratorNames(), ", "))
	}
	if opts.Requests == 0 {
		opts.Requests = 1000
	}
	if opts.Requests < 0 || opts.Requests > 100_000_000 {
		return nil, fmt.Errorf("workload: requests %d out of range", opts.Requests)
	}
	if err := opts.Arrivals.Validate(); err != nil {
		return nil, err
	}
	params := map[string]float64{}
	for _, p := range g.Params {
		params[p.Name] = p.Default
	}
	for _, k := range slices.Sorted(maps.Keys(opts.Params)) { // the first bad one by name: the same error every time
		v := opts.Params[k]
		i := slices.IndexFunc(g.Params, func(p Param) bool { return p.Name == k })
		if i < 0 {
			var known []string
			for _, p := range g.Params {
				known = append(known, p.Name)
			}
			return nil, fmt.Errorf("workload: generator %s has no parameter %q (have %s)", name, k, strings.Join(known, ", "))
		}
		if err := g.Params[i].check(name, v); err != nil {
			return nil, err
		}
		params[k] = v
	}
	st := &gen{
		opts:   opts,
		params: params,
		rng:    rand.New(rand.NewPCG(opts.Seed, 0x6b76726f757465)),
		kind:   name,
	}
	st.keyBase = opts.Seed ^ hashString(name)
	st.gaps = opts.Arrivals.Gaps(st.rng)
	reqs := g.gen(st)
	if st.err != nil {
		return nil, st.err
	}
	sortByArrival(reqs)
	w := &Workload{Name: name, Requests: reqs}
	w.limitAt(opts.Duration, opts.Requests) // Options.Duration is on the generator's clock
	for i := range w.Requests {
		r := &w.Requests[i]
		r.ID = defaultID(i)
		if r.PromptLen > MaxLen {
			// Each length is at most MaxLen, their sum may not be; ReadTrace
			// would refuse the request, so Generate does.
			return nil, fmt.Errorf("workload: generator %s: request %s has a prompt of %d tokens, above MaxLen (%d): lower its lengths",
				name, r.ID, r.PromptLen, MaxLen)
		}
	}
	AssignHashIDs(w.Requests)
	return w, w.Validate()
}

// outputParams are the generator parameters that set a request's output
// length. Their Min is 1: a request generates at least one token
// (ReadTrace refuses an output_length of 0 too), and max_tokens 0 would
// mean "up to the model's length" to the engine model and to
// vLLM-compatible servers.
var outputParams = []string{"output_len", "reply_len"}

// Parameter ranges (Param.Min, Param.Max).
const (
	// maxCount bounds counts that cost one draw per request (users,
	// prefixes).
	maxCount = 1e9
	// maxTable bounds counts that the generator tabulates up front or
	// walks per request (docs, prompts' and tenants' tables, turns).
	maxTable   = 1e6
	maxTenants = 1e4
	// maxSeconds is the longest time a parameter may give: secs' limit.
	maxSeconds = 1e9
)

// lenParam, outParam, countParam and secParam declare parameters with
// their ranges.
func lenParam(name string, def float64, doc string) Param {
	return Param{Name: name, Default: def, Doc: doc, Max: MaxLen}
}

func fixedLenParam(name string, def float64, doc string) Param {
	return Param{Name: name, Default: def, Doc: doc, Max: MaxLen, Int: true}
}

func outParam(name string, def float64, doc string) Param {
	return Param{Name: name, Default: def, Doc: doc, Min: 1, Max: MaxLen}
}

func countParam(name string, def float64, doc string, lo, hi float64) Param {
	return Param{Name: name, Default: def, Doc: doc, Min: lo, Max: hi, Int: true}
}

func secParam(name string, def float64, doc string) Param {
	return Param{Name: name, Default: def, Doc: doc, Max: maxSeconds}
}

// gen is a generator's state.
type gen struct {
	opts   Options
	params map[string]float64
	rng    *rand.Rand
	gaps   func() time.Duration
	kind   string
	keys   uint64 // keys drawn so far (key)
	// keyBase is opts.Seed ^ hashString(kind), key's part that does not
	// change.
	keyBase uint64
	err     error
}

func (g *gen) p(name string) float64 { return g.params[name] }

func (g *gen) n(name string) int {
	v := g.params[name]
	if v > 1<<30 {
		v = 1 << 30
	}
	return int(v)
}

// key returns a fresh segment key, unique within this workload and unlikely
// to collide with a trace's small hash ids or another generator's keys.
func (g *gen) key() uint64 {
	g.keys++
	return g.keyOf(g.keys)
}

// keyOf returns the key that key returns when its count reaches n.
func (g *gen) keyOf(n uint64) uint64 {
	return splitmix64(splitmix64(n) ^ g.keyBase)
}

// named returns the key of a named shared segment (system prompt i, doc i).
func (g *gen) named(kind string, i int) uint64 {
	return splitmix64(g.opts.Seed ^ hashString(g.kind+"/"+kind) ^ splitmix64(uint64(i)+1))
}

// length draws a length with the given mean, uniform on [mean/2, 3mean/2],
// at least 1 (0 when mean is 0) and at most MaxLen, the longest length
// ReadTrace accepts (a draw above it, from a mean above 2/3 of MaxLen, is
// cut to it).
func (g *gen) length(mean float64) int {
	if mean <= 0 {
		return 0
	}
	lo := mean / 2
	return min(MaxLen, max(1, int(lo+g.rng.Float64()*mean)))
}

func (g *gen) exp(meanSec float64) time.Duration {
	return secs(g.rng.ExpFloat64() * meanSec)
}

// zipf returns a sampler over [0, n) with exponent s (>1; values <= 1 are
// raised to 1.0001).
func (g *gen) zipf(s float64, n int) func() int {
	if n <= 1 {
		return func() int { return 0 }
	}
	s = max(s, 1.0001)
	z := rand.NewZipf(g.rng, s, 1, uint64(n-1))
	return func() int { return int(z.Uint64()) }
}

func newRequest(arrival time.Duration, out int, segs ...Segment) Request {
	r := Request{Arrival: arrival, OutputLen: out}
	for _, s := range segs {
		if s.Len > 0 {
			r.Segments = append(r.Segments, s)
			r.PromptLen += s.Len
		}
	}
	return r
}

var generators = []Generator{
	{
		Name: "chat",
		Summary: "multi-turn chat sessions: each turn's prompt is the whole history (system prompt, earlier " +
			"user messages and replies) plus a new user message; turns are separated by think time; sessions " +
			"already under way at time 0 are included (warm start), so the rate is steady from the start",
		Params: []Param{
			countParam("turns", 4, "mean turns per session (uniform on 1..2*turns-1)", 1, maxTable),
			fixedLenParam("system_len", 400, "tokens of the system prompt shared by all sessions (0 = none)"),
			lenParam("user_len", 150, "mean tokens per user message"),
			outParam("reply_len", 300, "mean tokens per reply (the turn's output length; > 0)"),
			secParam("think_s", 15, "mean think time between a turn and the next, seconds (exponential)"),
			fixedLenParam("max_len", 32000, "a session ends once its prompt would exceed this many tokens"),
		},
		gen: genChat,
	},
	{
		Name: "lora",
		Summary: "a multi-tenant LoRA deployment: requests for adapter-0..adapter-N-1 (share of adapter i " +
			"proportional to 1/(i+1)^skew) and, with base_share, the base model; each adapter's requests " +
			"share its own system prompt, then a unique user message",
		Params: []Param{
			countParam("adapters", 8, "number of LoRA adapters", 1, maxTenants),
			{Name: "skew", Default: 1, Doc: "adapter i's share is proportional to 1/(i+1)^skew (0 = uniform)", Max: 100},
			{Name: "base_share", Default: 0, Doc: "share of requests for the base model (no adapter), with its own system prompt", Max: 1},
			fixedLenParam("system_len", 1500, "per-adapter (and base model) system prompt, tokens"),
			lenParam("user_len", 200, "mean user message, tokens"),
			outParam("output_len", 200, "mean output length, tokens (> 0)"),
		},
		gen: genLoRA,
	},
	{
		Name: "rag",
		Summary: "retrieval-augmented generation over a hot document set: system prompt + one document " +
			"(Zipf popularity) + a unique question",
		Params: []Param{
			countParam("docs", 200, "number of documents", 1, maxTable),
			lenParam("doc_len", 3000, "mean document length, tokens"),
			{Name: "zipf", Default: 1.1, Doc: "Zipf exponent of document popularity (1 is taken as 1.0001)", Min: 1, Max: 100},
			lenParam("question_len", 80, "mean question length, tokens"),
			fixedLenParam("system_len", 300, "shared system prompt, tokens (0 = none)"),
			outParam("output_len", 250, "mean output length, tokens (> 0)"),
		},
		gen: genRAG,
	},
	{
		Name:    "sysprompt",
		Summary: "a few long system prompts shared by many users, each request adding a short unique user message",
		Params: []Param{
			countParam("prompts", 4, "number of distinct system prompts (chosen uniformly)", 1, maxCount),
			fixedLenParam("system_len", 6000, "system prompt length, tokens"),
			lenParam("user_len", 200, "mean user message length, tokens"),
			outParam("output_len", 200, "mean output length, tokens (> 0)"),
			countParam("users", 1000, "distinct users (session ids)", 1, maxCount),
		},
		gen: genSysPrompt,
	},
	{
		Name: "storm",
		Summary: "background traffic over many distinct prefixes plus one burst of requests sharing a hot " +
			"prefix (the affinity pile-up case); the burst counts towards requests",
		Params: []Param{
			countParam("prefixes", 200, "distinct background prefixes (chosen uniformly)", 1, maxCount),
			fixedLenParam("prefix_len", 2000, "background prefix length, tokens"),
			fixedLenParam("hot_len", 6000, "hot prefix length, tokens"),
			lenParam("suffix_len", 100, "mean unique suffix length, tokens"),
			outParam("output_len", 150, "mean output length, tokens (> 0)"),
			countParam("burst", 200, "requests in the burst", 0, maxCount),
			secParam("burst_at_s", 10, "burst start, seconds after the first arrival"),
			secParam("burst_s", 2, "burst length, seconds (arrivals uniform within it)"),
		},
		gen: genStorm,
	},
	{
		Name: "tenants",
		Summary: "a mix of tenants with skewed shares: each has its own system prompt; tenant-0 is heavy " +
			"(long documents in front of its messages)",
		Params: []Param{
			countParam("tenants", 4, "number of tenants", 1, maxTenants),
			{Name: "skew", Default: 1, Doc: "tenant i's share is proportional to 1/(i+1)^skew", Max: 100},
			fixedLenParam("system_len", 1000, "per-tenant system prompt, tokens"),
			lenParam("heavy_len", 4000, "mean extra document length for tenant-0, tokens (from 20 shared docs)"),
			lenParam("user_len", 300, "mean user message, tokens"),
			outParam("output_len", 200, "mean output length, tokens (> 0)"),
		},
		gen: genTenants,
	},
}

func genChat(g *gen) []Request {
	turns := max(1, g.n("turns"))
	// Sessions start at rate/turns so that requests arrive at the configured rate.
	a := g.opts.Arrivals.withDefaults()
	a.Rate /= float64(turns)
	next := a.Gaps(g.rng)
	sys := Segment{Key: g.named("system", 0), Len: g.n("system_len")}
	userLen, replyLen, think, maxLen := g.p("user_len"), g.p("reply_len"), g.p("think_s"), g.n("max_len")
	var reqs []Request
	// Warm start: sessions begin up to 2*turns*think_s before time 0 and
	// only their turns at or after 0 are kept, so the request rate is steady
	// from the start instead of ramping up while sessions accumulate.
	t := -secs(2 * float64(turns) * think)
	s := 0
	// keepUntil drops turns arriving after it: once Requests arrivals are
	// known, later ones are cut by Generate anyway. Without it the requests
	// kept (and the sessions started to reach the cutoff) would grow with
	// the rate times the warm start.
	keepUntil := time.Duration(math.MaxInt64)
	// hist is the session's prompt so far, reused: newRequest copies the
	// segments it keeps. Its messages' keys are drawn as key() would draw
	// them, but hashed (keyOf) only once a turn is kept: most sessions of
	// the warm start end before time 0, and at a high rate they are most of
	// the work. hist[:ready] are hashed, the others hold their key's count.
	var hist []Segment
	ready := 0
	draw := func(n int) Segment {
		g.keys++
		return Segment{Key: g.keys, Len: n}
	}
	session := func() {
		t += next()
		id := s
		s++
		n := 1 + g.rng.IntN(2*turns-1)
		hist = append(hist[:0], sys)
		ready = 1
		plen := max(sys.Len, 0)
		at := t
		for k := 0; k < n; k++ {
			user := draw(g.length(userLen))
			hist = append(hist, user)
			plen += max(user.Len, 0)
			out := g.length(replyLen)
			if k > 0 && plen > maxLen {
				break
			}
			if at >= 0 && at <= keepUntil {
				for ; ready < len(hist); ready++ {
					hist[ready].Key = g.keyOf(hist[ready].Key)
				}
				r := newRequest(at, out, hist...)
				r.Session = "s" + strconv.Itoa(id)
				reqs = append(reqs, r)
			}
			hist = append(hist, draw(out))
			plen += out
			at += g.exp(think)
		}
	}
	over := func() bool { return g.opts.Duration > 0 && t > g.opts.Duration }
	for len(reqs) < g.opts.Requests && !over() {
		session()
	}
	// Later turns of the sessions so far reach far beyond the last session
	// start; keep starting sessions until no new one can arrive before the
	// Requests-th arrival, so that the first Requests arrivals (kept by
	// Generate) are at the steady rate. That arrival only moves earlier as
	// sessions are added: refine it as the requests pile up, dropping the
	// ones after it (their order is kept, so Generate keeps the same ones).
	if len(reqs) >= g.opts.Requests {
		keepUntil = nthArrival(reqs, g.opts.Requests)
		for t <= keepUntil && !over() {
			session()
			if len(reqs) >= 2*g.opts.Requests {
				keepUntil = nthArrival(reqs, g.opts.Requests)
				reqs = slices.DeleteFunc(reqs, func(r Request) bool { return r.Arrival > keepUntil })
			}
		}
	}
	return reqs
}

// nthArrival returns the n-th earliest arrival of reqs (1 <= n <= len(reqs)).
func nthArrival(reqs []Request, n int) time.Duration {
	at := make([]time.Duration, len(reqs))
	for i := range reqs {
		at[i] = reqs[i].Arrival
	}
	slices.Sort(at)
	return at[n-1]
}

func genRAG(g *gen) []Request {
	docs := max(1, g.n("docs"))
	pick := g.zipf(g.p("zipf"), docs)
	docLen := make([]int, docs)
	for i := range docLen {
		docLen[i] = g.length(g.p("doc_len"))
	}
	sys := Segment{Key: g.named("system", 0), Len: g.n("system_len")}
	reqs := make([]Request, 0, g.opts.Requests)
	var t time.Duration
	for i := 0; i < g.opts.Requests; i++ {
		if i > 0 {
			t += g.gaps()
		}
		d := pick()
		r := newRequest(t, g.length(g.p("output_len")), sys,
			Segment{Key: g.named("doc", d), Len: docLen[d]},
			Segment{Key: g.key(), Len: g.length(g.p("question_len"))})
		r.Session = fmt.Sprintf("doc%d", d)
		reqs = append(reqs, r)
	}
	return reqs
}

func genSysPrompt(g *gen) []Request {
	prompts, users := max(1, g.n("prompts")), max(1, g.n("users"))
	reqs := make([]Request, 0, g.opts.Requests)
	var t time.Duration
	for i := 0; i < g.opts.Requests; i++ {
		if i > 0 {
			t += g.gaps()
		}
		p := g.rng.IntN(prompts)
		r := newRequest(t, g.length(g.p("output_len")),
			Segment{Key: g.named("system", p), Len: g.n("system_len")},
			Segment{Key: g.key(), Len: g.length(g.p("user_len"))})
		r.Session = fmt.Sprintf("u%d", g.rng.IntN(users))
		reqs = append(reqs, r)
	}
	return reqs
}

func genStorm(g *gen) []Request {
	burst := g.n("burst")
	if burst > g.opts.Requests {
		burst = g.opts.Requests
	}
	prefixes := max(1, g.n("prefixes"))
	reqs := make([]Request, 0, g.opts.Requests)
	var t time.Duration
	for i := 0; i < g.opts.Requests-burst; i++ {
		if i > 0 {
			t += g.gaps()
		}
		p := g.rng.IntN(prefixes)
		r := newRequest(t, g.length(g.p("output_len")),
			Segment{Key: g.named("prefix", p), Len: g.n("prefix_len")},
			Segment{Key: g.key(), Len: g.length(g.p("suffix_len"))})
		r.Session = fmt.Sprintf("p%d", p)
		reqs = append(reqs, r)
	}
	start := secs(g.p("burst_at_s"))
	window := g.p("burst_s")
	hot := Segment{Key: g.named("hot", 0), Len: g.n("hot_len")}
	for i := 0; i < burst; i++ {
		at := start + secs(g.rng.Float64()*window)
		r := newRequest(at, g.length(g.p("output_len")), hot,
			Segment{Key: g.key(), Len: g.length(g.p("suffix_len"))})
		r.Session = "hot"
		reqs = append(reqs, r)
	}
	return reqs
}

func genTenants(g *gen) []Request {
	n := max(1, g.n("tenants"))
	weights := make([]float64, n)
	var sum float64
	for i := range weights {
		weights[i] = 1 / math.Pow(float64(i+1), g.p("skew"))
		sum += weights[i]
	}
	const heavyDocs = 20
	heavyLen := make([]int, heavyDocs)
	for i := range heavyLen {
		heavyLen[i] = g.length(g.p("heavy_len"))
	}
	reqs := make([]Request, 0, g.opts.Requests)
	var t time.Duration
	for i := 0; i < g.opts.Requests; i++ {
		if i > 0 {
			t += g.gaps()
		}
		u := g.rng.Float64() * sum
		ten := 0
		for ten < n-1 && u >= weights[ten] {
			u -= weights[ten]
			ten++
		}
		segs := []Segment{{Key: g.named(fmt.Sprintf("tenant%d/system", ten), 0), Len: g.n("system_len")}}
		if ten == 0 {
			d := g.rng.IntN(heavyDocs)
			segs = append(segs, Segment{Key: g.named("tenant0/doc", d), Len: heavyLen[d]})
		}
		segs = append(segs, Segment{Key: g.key(), Len: g.length(g.p("user_len"))})
		r := newRequest(t, g.length(g.p("output_len")), segs...)
		r.Tenant = fmt.Sprintf("tenant-%d", ten)
		reqs = append(reqs, r)
	}
	return reqs
}

// AdapterName is the name of adapter i of the lora generator.
func AdapterName(i int) string { return "adapter-" + strconv.Itoa(i) }

func genLoRA(g *gen) []Request {
	mix := NewAdapterMix(g.n("adapters"), g.p("skew"))
	base := g.p("base_share")
	sysLen := g.n("system_len")
	reqs := make([]Request, 0, g.opts.Requests)
	var t time.Duration
	for i := 0; i < g.opts.Requests; i++ {
		if i > 0 {
			t += g.gaps()
		}
		// Two draws per request whatever base_share is, so that the
		// arrivals and lengths do not depend on it.
		u, v := g.rng.Float64(), g.rng.Float64()
		sys := Segment{Key: g.named("base/system", 0), Len: sysLen}
		adapter := ""
		if u >= base {
			a := mix.Pick(v)
			adapter = AdapterName(a)
			sys.Key = g.named("adapter/system", a)
		}
		r := newRequest(t, g.length(g.p("output_len")), sys, Segment{Key: g.key(), Len: g.length(g.p("user_len"))})
		r.Adapter = adapter
		reqs = append(reqs, r)
	}
	return reqs
}
