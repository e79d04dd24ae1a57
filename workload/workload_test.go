package workload

import (
	"bytes"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/tokenizer"
	"github.com/zeebo/xxh3"
)

const sharedTrace = "/work/shared/traces/conversation_trace.jsonl"

func genOrFatal(t testing.TB, name string, opts Options) *Workload {
	t.Helper()
	w, err := Generate(name, opts)
	if err != nil {
		t.Fatalf("Generate(%s): %v", name, err)
	}
	return w
}

// naiveHashes hashes materialised tokens block by block: the reference the
// segment fast path is checked against (equality structure, not values).
func naiveHashes(toks []uint32, bs int) []uint64 {
	var out []uint64
	var prev uint64
	buf := make([]byte, 0, 4*bs)
	for i := 0; i+bs <= len(toks); i += bs {
		buf = buf[:0]
		for _, t := range toks[i : i+bs] {
			buf = append(buf, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
		}
		prev = xxh3.HashSeed(buf, prev)
		out = append(out, prev)
	}
	return out
}

func commonPrefix(a, b []uint64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestTraceParse(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [7, 8]}

{"timestamp": 1500.5, "input_length": 512, "output_length": 1, "hash_ids": [7], "tenant": "a"}
`
	w, err := ReadTrace(strings.NewReader(in), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Request{
		{ID: "r000000", PromptLen: 1000, OutputLen: 5, HashIDs: []uint64{7, 8},
			Segments: []Segment{{7, 512}, {8, 488}}},
		{ID: "r000001", Arrival: 1500500 * time.Microsecond, Tenant: "a", PromptLen: 512, OutputLen: 1,
			HashIDs: []uint64{7}, Segments: []Segment{{7, 512}}},
	}
	if !reflect.DeepEqual(w.Requests, want) {
		t.Errorf("got %+v\nwant %+v", w.Requests, want)
	}
}

func TestTraceParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, line, want string }{
		{"not json", `{"timestamp": 0,`, "bad json"},
		{"missing timestamp", `{"input_length": 1, "output_length": 1, "hash_ids": [1]}`, "missing timestamp"},
		{"negative", `{"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}`, "negative"},
		{"few ids", `{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}`, "needs 3 hash_ids"},
		{"bad ts", `{"timestamp": -5, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "bad timestamp"},
		{"ts string", `{"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, "bad json"},
		{"segments mismatch", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "segments": [[1, 5]]}`, "segments cover 5"},
		{"tokens mismatch", `{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [1], "tokens": [1]}`, "tokens has 1"},
		{"trailing", `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]} {}`, "trailing"},
		{"no output", `{"timestamp": 0, "input_length": 1, "output_length": 0, "hash_ids": [1]}`, "output_length 0"},
		{"output missing", `{"timestamp": 0, "input_length": 1, "hash_ids": [1]}`, "missing output_length"},
		// Another format's keys (or null) read as an empty prompt that every
		// engine refused (or as "output_length 0").
		{"input missing", `{"timestamp": 0, "prompt_tokens": 600, "output_length": 5, "hash_ids": []}`, "missing input_length"},
		{"null", `null`, "missing input_length"},
		{"hash_ids missing", `{"timestamp": 0, "input_length": 5, "output_length": 5}`, "missing hash_ids"},
		{"hash_ids null", `{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": null}`, "missing hash_ids"},
		// An empty prompt every engine refuses: a plan with it found no
		// fleet meeting the SLO.
		{"empty prompt", `{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": []}`, "input_length 0"},
		// Four cheap lines like these held kvroute sim for minutes hashing
		// prompts of 1<<30 tokens (the limit was 1<<30) that no engine
		// would take.
		{"prompt too long", `{"timestamp": 0, "input_length": 1048577, "output_length": 1, "segments": [[7, 1048577]]}`, "at most 1048576 tokens"},
		{"output too long", `{"timestamp": 0, "input_length": 1, "output_length": 1048577, "segments": [[7, 1]]}`, "at most 1048576 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader("\n"+tc.line+"\n"), ReadOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line 2") {
				t.Errorf("got %v, want an error on line 2 containing %q", err, tc.want)
			}
		})
	}
}

// TestTraceMaxLen: a line at MaxLen tokens parses.
func TestTraceMaxLen(t *testing.T) {
	line := `{"timestamp": 0, "input_length": 1048576, "output_length": 1048576, "hash_ids": [], "segments": [[7, 1048576]]}`
	r, err := ParseTraceLine([]byte(line), 0, ReadOptions{})
	if err != nil || r.PromptLen != MaxLen || r.OutputLen != MaxLen {
		t.Errorf("got %d, %d, %v, want %d, %d, <nil>", r.PromptLen, r.OutputLen, err, MaxLen, MaxLen)
	}
}

func TestRoundTrip(t *testing.T) {
	var cases []*Workload
	for _, name := range GeneratorNames() {
		cases = append(cases, genOrFatal(t, name, Options{Seed: 3, Requests: 300, Arrivals: Arrivals{Kind: Gamma, Rate: 50}}))
	}
	// Literal prompts and odd fields.
	cases = append(cases, &Workload{Requests: []Request{
		{ID: "a", Arrival: 1234567, PromptLen: 3, OutputLen: 2, Tokens: []uint32{5, 6, 7}, HashIDs: []uint64{0}},
		{ID: "b", Arrival: 2 * time.Second, PromptLen: 2, OutputLen: 2, Text: "hello \"world\"\n", HashIDs: []uint64{1}, Session: "s"},
	}})
	if f, err := os.Open(sharedTrace); err == nil {
		w, err := ReadTrace(f, ReadOptions{})
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		w.Limit(0, 2000)
		cases = append(cases, w)
	}
	for _, w := range cases {
		t.Run(w.Name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteTrace(&buf, w.Requests); err != nil {
				t.Fatal(err)
			}
			got, err := ReadTrace(bytes.NewReader(buf.Bytes()), ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Requests, w.Requests) {
				for i := range got.Requests {
					if !reflect.DeepEqual(got.Requests[i], w.Requests[i]) {
						t.Fatalf("request %d: got %+v, want %+v", i, got.Requests[i], w.Requests[i])
					}
				}
				t.Fatalf("got %d requests, want %d", len(got.Requests), len(w.Requests))
			}
			// The written file is still a valid plain Mooncake trace.
			line, _, _ := bytes.Cut(buf.Bytes(), []byte("\n"))
			for _, k := range []string{`"timestamp":`, `"input_length":`, `"output_length":`, `"hash_ids":`} {
				if !bytes.Contains(line, []byte(k)) {
					t.Errorf("line %s lacks %s", line, k)
				}
			}
		})
	}
}

func TestSharedTrace(t *testing.T) {
	w, err := ReadTraceFile(sharedTrace)
	if os.IsNotExist(err) || (err != nil && strings.Contains(err.Error(), "no such file")) {
		t.Skip("shared trace not present")
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(w.Requests), 12031; got != want {
		t.Errorf("requests: got %d, want %d", got, want)
	}
	if got, want := w.Span(), 3536999*time.Millisecond; got != want {
		t.Errorf("span: got %v, want %v", got, want)
	}
	// Block reuse in the README is 36.6% of 512-token blocks; our segment
	// hashes at 512 tokens must see exactly the trace's sharing.
	st := w.Stats(TraceBlockSize)
	ids := map[uint64]bool{}
	total := 0
	for _, r := range w.Requests {
		for _, id := range r.HashIDs {
			ids[id] = true
		}
		total += len(r.HashIDs)
	}
	if got, want := len(ids), 182790; got != want {
		t.Errorf("unique hash ids: got %d, want %d", got, want)
	}
	if st.OracleHitRate < 0.2 || st.OracleHitRate > 0.5 {
		t.Errorf("oracle hit rate at 512: got %.3f, want in [0.2, 0.5]", st.OracleHitRate)
	}
	t.Logf("stats@512: %+v (total ids %d)", st, total)
}

// TestFastHashesMatchTokens checks the segment fast path against hashing
// materialised tokens: for every pair of requests the number of shared
// leading blocks must agree, at several block sizes, including ones that do
// not divide 512.
func TestFastHashesMatchTokens(t *testing.T) {
	var reqs []Request
	for _, name := range GeneratorNames() {
		reqs = append(reqs, genOrFatal(t, name, Options{Seed: 9, Requests: 40}).Requests...)
	}
	tr := `{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 3]}
{"timestamp": 0, "input_length": 1030, "output_length": 1, "hash_ids": [1, 2, 4]}
{"timestamp": 0, "input_length": 700, "output_length": 1, "hash_ids": [1, 5]}
{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}`
	w, err := ReadTrace(strings.NewReader(tr), ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs = append(reqs, w.Requests...)
	for _, bs := range []int{16, 64, 100, 512, 777} {
		fast := make([][]uint64, len(reqs))
		slow := make([][]uint64, len(reqs))
		for i := range reqs {
			fast[i] = reqs[i].BlockHashes(bs, nil)
			slow[i] = naiveHashes(reqs[i].PromptTokens(), bs)
			if len(fast[i]) != reqs[i].PromptLen/bs || len(slow[i]) != len(fast[i]) {
				t.Fatalf("bs %d req %d: got %d fast / %d slow hashes, want %d", bs, i, len(fast[i]), len(slow[i]), reqs[i].PromptLen/bs)
			}
		}
		for i := range reqs {
			for j := i + 1; j < len(reqs); j++ {
				if f, s := commonPrefix(fast[i], fast[j]), commonPrefix(slow[i], slow[j]); f != s {
					t.Fatalf("bs %d requests %s/%s: fast hashes share %d blocks, tokens share %d", bs, reqs[i].ID, reqs[j].ID, f, s)
				}
			}
		}
	}
}

func TestTextMatchesBuiltinTokenizer(t *testing.T) {
	tok := tokenizer.Builtin()
	w := genOrFatal(t, "rag", Options{Seed: 1, Requests: 30, Params: map[string]float64{"docs": 3}})
	enc := make([][]uint32, len(w.Requests))
	for i := range w.Requests {
		r := &w.Requests[i]
		enc[i] = tok.Encode(r.PromptText())
		if len(enc[i]) != r.PromptLen {
			t.Fatalf("request %d: text encodes to %d built-in tokens, want PromptLen %d", i, len(enc[i]), r.PromptLen)
		}
	}
	// Shared token prefixes are shared built-in token prefixes, exactly.
	for i := range w.Requests {
		for j := i + 1; j < len(w.Requests); j++ {
			a, b := w.Requests[i].PromptTokens(), w.Requests[j].PromptTokens()
			n := 0
			for n < len(a) && n < len(b) && a[n] == b[n] {
				n++
			}
			m := 0
			for m < len(enc[i]) && m < len(enc[j]) && enc[i][m] == enc[j][m] {
				m++
			}
			if n != m {
				t.Fatalf("requests %d/%d share %d synthetic tokens but %d built-in tokens", i, j, n, m)
			}
		}
	}
}

func TestWordsAreOneBuiltinToken(t *testing.T) {
	tok := tokenizer.Builtin()
	seen := map[string]bool{}
	for _, wd := range words {
		if seen[wd] {
			t.Errorf("duplicate word %q", wd)
		}
		seen[wd] = true
		if got := len(tok.Encode(wd)); got != 1 {
			t.Errorf("%q encodes to %d tokens, want 1", wd, got)
		}
		if got := len(tok.Encode("a " + wd)); got != 2 {
			t.Errorf("%q encodes to %d tokens, want 2", "a "+wd, got)
		}
	}
}

func TestGenerateDeterministic(t *testing.T) {
	for _, name := range GeneratorNames() {
		t.Run(name, func(t *testing.T) {
			a := genOrFatal(t, name, Options{Seed: 42, Requests: 200})
			b := genOrFatal(t, name, Options{Seed: 42, Requests: 200})
			c := genOrFatal(t, name, Options{Seed: 43, Requests: 200})
			if !reflect.DeepEqual(a, b) {
				t.Error("same seed gave different workloads")
			}
			if reflect.DeepEqual(a.Requests, c.Requests) {
				t.Error("different seeds gave the same workload")
			}
			if got := len(a.Requests); got != 200 {
				t.Errorf("got %d requests, want 200", got)
			}
			if err := a.Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestGenerateErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  string
		opts Options
		want string
	}{
		{"unknown generator", "nope", Options{}, "unknown generator"},
		{"unknown param", "chat", Options{Params: map[string]float64{"bogus": 1}}, `no parameter "bogus"`},
		{"negative param", "rag", Options{Params: map[string]float64{"docs": -1}}, "docs=-1 must be in [1, 1000000]"},
		// Values the generators used to take silently for others (0 docs,
		// turns or tenants as 1, a Zipf exponent below 1 as 1.0001, a
		// fractional count truncated), or that made generation and the
		// prompts' hashing take minutes and gigabytes (a length of 1e12
		// tokens: kvroute sim ran for 10 minutes at 14.7 GB).
		{"zero docs", "rag", Options{Params: map[string]float64{"docs": 0}}, "docs=0 must be in [1, 1000000]"},
		{"zero turns", "chat", Options{Params: map[string]float64{"turns": 0}}, "turns=0 must be in [1, 1000000]"},
		{"zero tenants", "tenants", Options{Params: map[string]float64{"tenants": 0}}, "tenants=0 must be in [1, 10000]"},
		{"zipf below 1", "rag", Options{Params: map[string]float64{"zipf": 0.5}}, "zipf=0.5 must be in [1, 100]"},
		{"fractional count", "sysprompt", Options{Params: map[string]float64{"prompts": 2.5}}, "prompts=2.5 must be a whole number"},
		{"fractional length", "storm", Options{Params: map[string]float64{"hot_len": 10.5}}, "hot_len=10.5 must be a whole number"},
		{"too many docs", "rag", Options{Requests: 1, Params: map[string]float64{"docs": 1e7}}, "docs=1e+07 must be in [1, 1000000]"},
		{"too long", "rag", Options{Requests: 1, Params: map[string]float64{"doc_len": 2e6}}, "doc_len=2e+06 must be in [0, 1048576]"},
		{"nan", "chat", Options{Params: map[string]float64{"think_s": math.NaN()}}, "think_s=NaN must be in"},
		{"bad rate", "rag", Options{Arrivals: Arrivals{Rate: -1}}, "rate"},
		{"bad kind", "rag", Options{Arrivals: Arrivals{Kind: "weibull"}}, "arrivals.kind"},
		// A request generates at least one token (ReadTrace refuses an
		// output_length of 0): max_tokens 0 is "up to the model's length".
		{"zero output", "rag", Options{Params: map[string]float64{"output_len": 0}}, "output_len=0"},
		{"zero reply", "chat", Options{Params: map[string]float64{"reply_len": 0}}, "reply_len=0 must be in [1, 1048576]: a request generates at least one token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Generate(tc.gen, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want error containing %q", err, tc.want)
			}
		})
	}
}

// TestParamDefaultsInRange checks that every generator takes its own
// defaults, and the ends of every range.
func TestParamDefaultsInRange(t *testing.T) {
	for _, g := range Generators() {
		for _, p := range g.Params {
			if err := p.check(g.Name, p.Default); err != nil {
				t.Errorf("default: %v", err)
			}
			for _, v := range []float64{p.Min, p.Max} {
				if err := p.check(g.Name, v); err != nil {
					t.Errorf("range end: %v", err)
				}
			}
		}
	}
}

func isPrefix(a, b []Segment) bool {
	return len(a) <= len(b) && reflect.DeepEqual(a, b[:len(a)])
}

func TestChatHistoryGrows(t *testing.T) {
	w := genOrFatal(t, "chat", Options{Seed: 5, Requests: 500})
	bySession := map[string][]Request{}
	for _, r := range w.Requests {
		bySession[r.Session] = append(bySession[r.Session], r)
	}
	multi := 0
	for s, turns := range bySession {
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1], turns[k]
			if !isPrefix(prev.Segments, cur.Segments) {
				t.Fatalf("session %s turn %d does not extend the previous prompt", s, k)
			}
			if got, want := cur.Segments[len(prev.Segments)].Len, prev.OutputLen; got != want {
				t.Errorf("session %s turn %d: reply segment %d tokens, want previous output %d", s, k, got, want)
			}
			if cur.Arrival < prev.Arrival {
				t.Errorf("session %s turn %d arrives before the previous turn", s, k)
			}
			multi++
		}
	}
	if multi == 0 {
		t.Error("no multi-turn session")
	}
}

func TestRAGZipf(t *testing.T) {
	w := genOrFatal(t, "rag", Options{Seed: 5, Requests: 2000})
	count := map[string]int{}
	for _, r := range w.Requests {
		if len(r.Segments) != 3 {
			t.Fatalf("rag request has %d segments, want 3 (system, doc, question)", len(r.Segments))
		}
		count[r.Session]++
	}
	if count["doc0"] <= count["doc10"] || count["doc0"] < 200 {
		t.Errorf("doc0 %d, doc10 %d: want Zipf popularity (doc0 hottest)", count["doc0"], count["doc10"])
	}
	if st := w.Stats(16); st.OracleHitRate < 0.5 {
		t.Errorf("oracle hit rate %.2f, want >= 0.5 for hot documents", st.OracleHitRate)
	}
}

func TestStormBurst(t *testing.T) {
	w := genOrFatal(t, "storm", Options{Seed: 5, Requests: 1000,
		Params: map[string]float64{"burst": 300, "burst_at_s": 20, "burst_s": 1}})
	hot := 0
	for _, r := range w.Requests {
		if r.Session == "hot" {
			hot++
			if r.Arrival < 20*time.Second || r.Arrival > 21*time.Second {
				t.Errorf("hot request at %v, want within [20s, 21s]", r.Arrival)
			}
		}
	}
	if hot != 300 {
		t.Errorf("got %d hot requests, want 300", hot)
	}
}

func TestTenantsSkew(t *testing.T) {
	w := genOrFatal(t, "tenants", Options{Seed: 5, Requests: 4000})
	count := map[string]int{}
	for _, r := range w.Requests {
		count[r.Tenant]++
	}
	// Shares 1 : 1/2 : 1/3 : 1/4 -> 48%, 24%, 16%, 12%.
	for ten, want := range map[string]float64{"tenant-0": 0.48, "tenant-1": 0.24, "tenant-2": 0.16, "tenant-3": 0.12} {
		got := float64(count[ten]) / 4000
		if math.Abs(got-want) > 0.03 {
			t.Errorf("%s share: got %.3f, want %.2f", ten, got, want)
		}
	}
}

func TestArrivalRates(t *testing.T) {
	for _, a := range []Arrivals{{Kind: Poisson, Rate: 20}, {Kind: Gamma, Rate: 20, CV: 3}, {Kind: Gamma, Rate: 20, CV: 0.5}, {Kind: Constant, Rate: 20}} {
		w := genOrFatal(t, "sysprompt", Options{Seed: 11, Requests: 20000, Arrivals: a})
		rate := float64(len(w.Requests)-1) / w.Span().Seconds()
		if math.Abs(rate-20)/20 > 0.06 {
			t.Errorf("%+v: measured rate %.2f, want about 20", a, rate)
		}
		// Coefficient of variation of the gaps.
		var gaps []float64
		for i := 1; i < len(w.Requests); i++ {
			gaps = append(gaps, (w.Requests[i].Arrival - w.Requests[i-1].Arrival).Seconds())
		}
		var m, v float64
		for _, g := range gaps {
			m += g
		}
		m /= float64(len(gaps))
		for _, g := range gaps {
			v += (g - m) * (g - m)
		}
		cv := math.Sqrt(v/float64(len(gaps))) / m
		want := map[string]float64{Poisson: 1, Constant: 0}[a.Kind]
		if a.Kind == Gamma {
			want = a.CV
		}
		if math.Abs(cv-want) > 0.1*max(want, 1) {
			t.Errorf("%+v: gap CV %.2f, want about %.2f", a, cv, want)
		}
	}
}

func TestScaleAndLimit(t *testing.T) {
	w := genOrFatal(t, "rag", Options{Seed: 1, Requests: 100, Arrivals: Arrivals{Kind: Constant, Rate: 10}})
	if err := w.ScaleRate(2); err != nil {
		t.Fatal(err)
	}
	if got, want := w.Requests[10].Arrival, 500*time.Millisecond; got != want {
		t.Errorf("after ScaleRate(2) request 10 arrives at %v, want %v", got, want)
	}
	if err := w.ScaleRate(0); err == nil {
		t.Error("ScaleRate(0): want error")
	}
	w.Limit(2*time.Second, 0)
	if got := len(w.Requests); got != 41 {
		t.Errorf("Limit(2s): got %d requests, want 41", got)
	}
	w.Limit(0, 7)
	if got := len(w.Requests); got != 7 {
		t.Errorf("Limit(0, 7): got %d requests, want 7", got)
	}
}

// TestLimitAbsoluteTimestamps: a trace logged in Unix milliseconds keeps
// the requests within d of its first one; Limit counted d from 0, kept
// none, and kvroute sim --duration 5s said "the workload has no requests".
func TestLimitAbsoluteTimestamps(t *testing.T) {
	const t0 = 1764000000000 * time.Millisecond
	mk := func() *Workload {
		w := &Workload{}
		for i := range 100 {
			w.Requests = append(w.Requests, Request{ID: defaultID(i), Arrival: t0 + time.Duration(i)*100*time.Millisecond,
				PromptLen: 1, OutputLen: 1, Segments: []Segment{{Key: 1, Len: 1}}})
		}
		return w
	}
	for _, tc := range []struct {
		d    time.Duration
		n    int
		want int
	}{
		{5 * time.Second, 0, 51}, // arrivals t0 + 0, 0.1, ..., 5 s
		{5 * time.Second, 10, 10},
		{math.MaxInt64, 0, 100}, // past the end of the clock: everything
		{0, 0, 100},
	} {
		w := mk()
		w.Limit(tc.d, tc.n)
		if got := len(w.Requests); got != tc.want {
			t.Errorf("Limit(%v, %d): got %d requests, want %d", tc.d, tc.n, got, tc.want)
		}
	}
}

func TestOracle(t *testing.T) {
	o := NewOracle(4)
	r1 := Request{PromptLen: 12, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}}
	r2 := Request{PromptLen: 10, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 0, 9, 10}}
	o.Observe(&r1, nil)
	o.Observe(&r2, nil)
	// r2 hits its first block (4 tokens) only: 4 / 22.
	if got, want := o.HitRate(), 4.0/22; math.Abs(got-want) > 1e-12 {
		t.Errorf("hit rate: got %v, want %v", got, want)
	}
}

func TestParseParams(t *testing.T) {
	got, err := ParseParams("docs=10, zipf=1.5,,")
	if err != nil || !reflect.DeepEqual(got, map[string]float64{"docs": 10, "zipf": 1.5}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{"docs", "docs=x", "a=NaN", "a=Inf"} {
		if _, err := ParseParams(bad); err == nil {
			t.Errorf("ParseParams(%q): want error", bad)
		}
	}
}

func FuzzParseTraceLine(f *testing.F) {
	for _, s := range []string{
		`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}`,
		`{"timestamp": 1.5, "input_length": 3, "output_length": 1, "hash_ids": [0], "tokens": [1,2,3], "id": "x"}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0], "segments": [[5, 10]], "arrival_ns": 7}`,
		`{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "text": "hi"}`,
		`[]`, `null`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := ParseTraceLine(line, 0, ReadOptions{})
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("parsed request is invalid: %v", err)
		}
		if r.PromptLen <= 1<<16 {
			_ = r.BlockHashes(16, nil)
		}
		// What parses must write and read back the same.
		var buf bytes.Buffer
		if err := WriteTrace(&buf, []Request{r}); err != nil {
			t.Fatalf("write: %v", err)
		}
		w, err := ReadTrace(&buf, ReadOptions{})
		if err != nil {
			t.Fatalf("read back %q: %v", buf.String(), err)
		}
		if r.HashIDs != nil && !reflect.DeepEqual(w.Requests[0], r) {
			t.Fatalf("round trip: got %+v, want %+v", w.Requests[0], r)
		}
	})
}

func FuzzParseParams(f *testing.F) {
	f.Add("docs=10,zipf=1.2")
	f.Add("=,=")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseParams(s)
		if err != nil {
			return
		}
		for k, v := range m {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("%s=%v accepted", k, v)
			}
		}
	})
}

func BenchmarkBlockHashesSegments(b *testing.B) {
	w := genOrFatal(b, "rag", Options{Seed: 1, Requests: 100})
	var dst []uint64
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		dst = w.Requests[i%len(w.Requests)].BlockHashes(16, dst[:0])
	}
}

func BenchmarkReadSharedTrace(b *testing.B) {
	data, err := os.ReadFile(sharedTrace)
	if err != nil {
		b.Skip(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ReadTrace(bytes.NewReader(data), ReadOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestChatRateSteadyFromStart(t *testing.T) {
	w := genOrFatal(t, "chat", Options{Seed: 2, Requests: 4000, Arrivals: Arrivals{Rate: 20}})
	span := w.Span()
	early := 0
	for _, r := range w.Requests {
		if r.Arrival < span/10 {
			early++
		}
	}
	overall := float64(len(w.Requests)) / span.Seconds()
	head := float64(early) / (span / 10).Seconds()
	if math.Abs(head-overall)/overall > 0.25 || math.Abs(overall-20)/20 > 0.15 {
		t.Errorf("request rate: first tenth %.1f/s, overall %.1f/s; want both about 20/s", head, overall)
	}
}

// BenchmarkGenerateChatWarmStart: the chat generator at a high rate, where
// its warm start (sessions under way at time 0) dominates: 2*turns*think_s
// of sessions before time 0, 30 times the rate with the defaults.
func BenchmarkGenerateChatWarmStart(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		genOrFatal(b, "chat", Options{Seed: 1, Requests: 2000, Arrivals: Arrivals{Rate: 100000}})
	}
}

// TestGenerateLongestLengthsReadBack: a generator run at the longest
// lengths its parameters accept gives requests ReadTrace accepts back: an
// output of up to 1.5 times a mean of MaxLen, or a prompt whose segments
// added up to more than MaxLen, was written by WriteTrace and refused by
// ReadTrace ("length too large"), and the engines were sent it.
func TestGenerateLongestLengthsReadBack(t *testing.T) {
	for _, tc := range []struct {
		gen     string
		params  map[string]float64
		wantErr bool
	}{
		{"rag", map[string]float64{"output_len": MaxLen, "doc_len": 100, "system_len": 0}, false},
		{"sysprompt", map[string]float64{"system_len": MaxLen}, true},
	} {
		w, err := Generate(tc.gen, Options{Seed: 1, Requests: 20, Params: tc.params})
		if tc.wantErr {
			if err == nil || !strings.Contains(err.Error(), "MaxLen") {
				t.Errorf("%s %v: got %v, want an error naming MaxLen", tc.gen, tc.params, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s %v: %v", tc.gen, tc.params, err)
		}
		var buf bytes.Buffer
		if err := WriteTrace(&buf, w.Requests); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadTrace(&buf, ReadOptions{}); err != nil {
			t.Errorf("%s %v: reading the written trace back: %v", tc.gen, tc.params, err)
		}
	}
}

// TestReadTraceMaxLineBytes: ReadOptions.MaxLineBytes caps a line at
// exactly that many bytes (line ending not counted): a cap under the
// scanner's 64 KiB starting buffer was not enforced at all, and a line of
// exactly the cap followed by its newline was refused.
func TestReadTraceMaxLineBytes(t *testing.T) {
	line := func(n int) string {
		s := `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]`
		return s + strings.Repeat(" ", n-len(s)-1) + "}"
	}
	for _, tc := range []struct {
		name, trace string
		ok          bool
	}{
		{"at the cap", line(100) + "\n" + line(100) + "\n", true},
		{"at the cap, CRLF", line(100) + "\r\n", true},
		{"at the cap, last line", line(100), true},
		{"one over the cap", line(100) + "\n" + line(101) + "\n", false},
		{"one over the cap, last line", line(101), false},
		{"far over the cap", line(1000) + "\n", false},
	} {
		w, err := ReadTrace(strings.NewReader(tc.trace), ReadOptions{MaxLineBytes: 100})
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "longer than 100 bytes")):
			n := -1
			if w != nil {
				n = len(w.Requests)
			}
			t.Errorf("%s: got %d requests, %v; want an error saying the line is longer than 100 bytes", tc.name, n, err)
		}
	}
	// Above the scanner's starting buffer too.
	const big = 1 << 17
	if _, err := ReadTrace(strings.NewReader(line(big)+"\n"+line(big)+"\n"), ReadOptions{MaxLineBytes: big}); err != nil {
		t.Errorf("two lines of %d bytes, the cap: %v", big, err)
	}
}
