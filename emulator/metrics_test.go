package emulator

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got, want := resp.Header.Get("Content-Type"), "text/plain; version=0.0.4; charset=utf-8"; got != want {
		t.Errorf("got content type %q, want %q", got, want)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}

func TestMetricsFlavors(t *testing.T) {
	type want struct {
		typ    dto.MetricType
		labels []string // label names on every series
	}
	vl := []string{"engine", "model_name"}
	tests := []struct {
		flavor string
		want   map[string]want
		absent []string
	}{
		{FlavorVLLM, map[string]want{
			"vllm:num_requests_running":                  {dto.MetricType_GAUGE, vl},
			"vllm:num_requests_waiting":                  {dto.MetricType_GAUGE, vl},
			"vllm:kv_cache_usage_perc":                   {dto.MetricType_GAUGE, vl},
			"vllm:prefix_cache_queries_total":            {dto.MetricType_COUNTER, vl},
			"vllm:prefix_cache_queries_created":          {dto.MetricType_GAUGE, vl},
			"vllm:prefix_cache_hits_total":               {dto.MetricType_COUNTER, vl},
			"vllm:num_preemptions_total":                 {dto.MetricType_COUNTER, vl},
			"vllm:prompt_tokens_total":                   {dto.MetricType_COUNTER, vl},
			"vllm:generation_tokens_total":               {dto.MetricType_COUNTER, vl},
			"vllm:request_success_total":                 {dto.MetricType_COUNTER, []string{"engine", "finished_reason", "model_name"}},
			"vllm:time_to_first_token_seconds":           {dto.MetricType_HISTOGRAM, vl},
			"vllm:time_to_first_token_seconds_created":   {dto.MetricType_GAUGE, vl},
			"vllm:inter_token_latency_seconds":           {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_time_per_output_token_seconds": {dto.MetricType_HISTOGRAM, vl},
			"vllm:e2e_request_latency_seconds":           {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_queue_time_seconds":            {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_prefill_time_seconds":          {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_decode_time_seconds":           {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_inference_time_seconds":        {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_prompt_tokens":                 {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_generation_tokens":             {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_params_max_tokens":             {dto.MetricType_HISTOGRAM, vl},
			"vllm:request_params_n":                      {dto.MetricType_HISTOGRAM, vl},
			"vllm:iteration_tokens_total":                {dto.MetricType_HISTOGRAM, vl},
			"vllm:cache_config_info":                     {dto.MetricType_GAUGE, []string{"block_size", "engine", "num_gpu_blocks"}},
		}, []string{"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:time_per_output_token_seconds"}},
		{FlavorVLLMLegacy, map[string]want{
			"vllm:gpu_cache_usage_perc":           {dto.MetricType_GAUGE, vl},
			"vllm:gpu_prefix_cache_queries_total": {dto.MetricType_COUNTER, vl},
			"vllm:gpu_prefix_cache_hits_total":    {dto.MetricType_COUNTER, vl},
			"vllm:time_per_output_token_seconds":  {dto.MetricType_HISTOGRAM, vl},
			"vllm:num_requests_running":           {dto.MetricType_GAUGE, vl},
		}, []string{"vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:inter_token_latency_seconds"}},
		{FlavorSGLang, map[string]want{
			"sglang:num_running_reqs":                {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:num_queue_reqs":                  {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:token_usage":                     {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:cache_hit_rate":                  {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:max_total_num_tokens":            {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:cached_tokens_total":             {dto.MetricType_COUNTER, []string{"cache_source", "model_name"}},
			"sglang:time_to_first_token_seconds":     {dto.MetricType_HISTOGRAM, []string{"model_name"}},
			"sglang:num_prefill_prealloc_queue_reqs": {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:num_prefill_inflight_queue_reqs": {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:num_decode_prealloc_queue_reqs":  {dto.MetricType_GAUGE, []string{"model_name"}},
			"sglang:num_decode_transfer_queue_reqs":  {dto.MetricType_GAUGE, []string{"model_name"}},
		}, []string{"vllm:num_requests_running", "sglang:num_prefill_bootstrap_queue_reqs"}},
		{FlavorLlamaCpp, map[string]want{
			"llamacpp:prompt_tokens_total":        {dto.MetricType_COUNTER, nil},
			"llamacpp:prompt_tokens_cached_total": {dto.MetricType_COUNTER, nil},
			"llamacpp:tokens_predicted_total":     {dto.MetricType_COUNTER, nil},
			"llamacpp:requests_processing":        {dto.MetricType_GAUGE, nil},
			"llamacpp:requests_deferred":          {dto.MetricType_GAUGE, nil},
			"llamacpp:n_decode_total":             {dto.MetricType_COUNTER, nil},
		}, []string{"vllm:num_requests_running", "llamacpp:prompt_tokens_created"}},
	}
	for _, tt := range tests {
		t.Run(tt.flavor, func(t *testing.T) {
			_, hs := testServer(t, Config{MetricsFlavor: tt.flavor})
			if code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen","max_tokens":3}`); code != 200 {
				t.Fatalf("got %d %s", code, body)
			}
			mfs := scrape(t, hs.URL)
			for name, w := range tt.want {
				mf := mfs[name]
				if mf == nil {
					t.Errorf("%s: missing", name)
					continue
				}
				if mf.GetType() != w.typ {
					t.Errorf("%s: got type %v, want %v", name, mf.GetType(), w.typ)
				}
				for _, m := range mf.GetMetric() {
					ls := labelsOf(m)
					for _, l := range w.labels {
						if _, ok := ls[l]; !ok {
							t.Errorf("%s: got labels %v, want %q among them", name, ls, l)
						}
					}
					if w.labels == nil && len(ls) != 0 {
						t.Errorf("%s: got labels %v, want none", name, ls)
					}
				}
			}
			for _, name := range tt.absent {
				if mfs[name] != nil {
					t.Errorf("%s: present, want absent in flavour %s", name, tt.flavor)
				}
			}
		})
	}
}

func TestMetricsVLLMValues(t *testing.T) {
	s, hs := testServer(t, Config{})
	for range 2 {
		if code, body := post(t, hs.URL+"/v1/completions", `{"prompt":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen","max_tokens":4}`); code != 200 {
			t.Fatalf("got %d %s", code, body)
		}
	}
	mfs := scrape(t, hs.URL)
	get := func(name string) *dto.Metric {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) == 0 {
			t.Fatalf("%s missing", name)
		}
		return mf.GetMetric()[0]
	}
	if got := labelsOf(get("vllm:num_requests_running")); got["model_name"] != "tiny" || got["engine"] != "0" {
		t.Errorf("got labels %v, want model_name=tiny engine=0", got)
	}
	info := labelsOf(get("vllm:cache_config_info"))
	// tiny: 64 usable blocks and vLLM's null block, which num_gpu_blocks
	// counts.
	if info["block_size"] != "16" || info["num_gpu_blocks"] != "65" || info["enable_prefix_caching"] != "True" {
		t.Errorf("got cache_config_info labels %v, want block_size 16, num_gpu_blocks 65", info)
	}
	if got := value(get("vllm:generation_tokens_total")); got != 8 {
		t.Errorf("got generation_tokens_total %v, want 8", got)
	}
	if got := value(get("vllm:prefix_cache_hits_total")); got <= 0 {
		t.Errorf("got prefix_cache_hits_total %v, want > 0 after a repeated prompt", got)
	}
	for _, m := range mfs["vllm:request_success_total"].GetMetric() {
		reason := labelsOf(m)["finished_reason"]
		want := 0.0
		if reason == "length" {
			want = 2
		}
		if got := value(m); got != want {
			t.Errorf("request_success_total{finished_reason=%q}: got %v, want %v", reason, got, want)
		}
	}
	h := get("vllm:time_to_first_token_seconds").GetHistogram()
	var bounds []float64
	for _, b := range h.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if want := append(slices.Clone(ttftBuckets), math.Inf(1)); !slices.Equal(bounds, want) {
		t.Errorf("got TTFT buckets %v, want %v and +Inf", bounds, ttftBuckets)
	}
	if h.GetSampleCount() != 2 {
		t.Errorf("got TTFT count %d, want 2", h.GetSampleCount())
	}
	if h := get("vllm:request_prompt_tokens").GetHistogram(); len(h.GetBucket()) < 2 || h.GetBucket()[len(h.GetBucket())-2].GetUpperBound() > float64(s.Profile().MaxModelLen) {
		t.Errorf("got prompt token buckets %v, want 1-2-5 up to %d", h.GetBucket(), s.Profile().MaxModelLen)
	}
}

func TestBuckets125(t *testing.T) {
	tests := []struct {
		max  int
		want []float64
	}{
		{1, []float64{1}},
		{100, []float64{1, 2, 5, 10, 20, 50, 100}},
		{1024, []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}},
	}
	for _, tt := range tests {
		if got := buckets125(tt.max); !slices.Equal(got, tt.want) {
			t.Errorf("buckets125(%d): got %v, want %v", tt.max, got, tt.want)
		}
	}
}

// TestMetricsGolden pins every flavour's exposition: family names, types,
// label names and bucket bounds (values vary and are left out), parsed back
// with the Prometheus text parser.
func TestMetricsGolden(t *testing.T) {
	for _, flavor := range Flavors {
		t.Run(flavor, func(t *testing.T) {
			_, hs := testServer(t, Config{MetricsFlavor: flavor})
			mfs := scrape(t, hs.URL)
			names := make([]string, 0, len(mfs))
			for n := range mfs {
				names = append(names, n)
			}
			slices.Sort(names)
			var b strings.Builder
			for _, n := range names {
				mf := mfs[n]
				fmt.Fprintf(&b, "%s %s %q", n, strings.ToLower(mf.GetType().String()), mf.GetHelp())
				m := mf.GetMetric()[0]
				var ls []string
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "model_name" || lp.GetName() == "engine" || lp.GetName() == "finished_reason" || lp.GetName() == "cache_source" {
						ls = append(ls, lp.GetName()+"="+lp.GetValue())
					} else {
						ls = append(ls, lp.GetName())
					}
				}
				fmt.Fprintf(&b, " {%s}", strings.Join(ls, ","))
				if h := m.GetHistogram(); h != nil {
					var bs []string
					for _, bk := range h.GetBucket() {
						bs = append(bs, fmt.Sprint(bk.GetUpperBound()))
					}
					fmt.Fprintf(&b, " le=[%s]", strings.Join(bs, ","))
				}
				if len(mf.GetMetric()) > 1 {
					fmt.Fprintf(&b, " series=%d", len(mf.GetMetric()))
				}
				b.WriteByte('\n')
			}
			golden(t, "metrics_"+flavor+".golden", []byte(b.String()))
		})
	}
}

// TestHistObserve checks the histogram's bucket search, including the
// repeated-value shortcut, against a linear scan.
func TestHistObserve(t *testing.T) {
	upper := []float64{0.5, 1, 2}
	h := &hist{upper: upper, counts: make([]uint64, len(upper)+1), lastV: math.NaN()}
	want := make([]uint64, len(upper)+1)
	for _, v := range []float64{0.5, 0.5, 1, 1, 2, 100, 100, 0.5, 0.7, 0.7, 3, 0, 0} {
		h.observe(v)
		i := 0
		for i < len(upper) && v > upper[i] {
			i++
		}
		want[i]++
	}
	for i := range want {
		if h.counts[i] != want[i] {
			t.Errorf("bucket %d: got %d, want %d (all: %v, want %v)", i, h.counts[i], want[i], h.counts, want)
		}
	}
	if h.count != 13 {
		t.Errorf("count %d, want 13", h.count)
	}
}

// TestHistObserveN: observeN(v, n) leaves the histogram exactly as n
// observe(v) calls do, sum bit for bit, after any history.
func TestHistObserveN(t *testing.T) {
	upper := []float64{0.005, 0.01, 0.05}
	newHist := func() *hist {
		return &hist{upper: upper, counts: make([]uint64, len(upper)+1), lastV: math.NaN()}
	}
	runs := []struct {
		v float64
		n int
	}{{0.0061, 3}, {0.0061, 0}, {0.0073, 17}, {0.1, 1}, {0.0073, 64}, {0.003, 5}, {1e-9, 2}}
	got, want := newHist(), newHist()
	for _, r := range runs {
		got.observeN(r.v, r.n)
		for range r.n {
			want.observe(r.v)
		}
		if got.sum != want.sum || got.count != want.count || !slices.Equal(got.counts, want.counts) {
			t.Fatalf("after %v x %d: got sum %v count %d counts %v, want %v %d %v", r.v, r.n, got.sum, got.count, got.counts, want.sum, want.count, want.counts)
		}
	}
	var nilHist *hist
	nilHist.observeN(1, 3) // no histogram in this flavour: no-op
}

// naiveAddN is addN's reference: n additions, one by one.
func naiveAddN(sum, v float64, n int) float64 {
	for range n {
		sum += v
	}
	return sum
}

// TestAddN checks addN against n additions one by one, bit for bit:
// sums and values of every scale, values that tie at some binade of the
// sum (an odd multiple of half its ulp), and runs that cross binades,
// reach the subnormals or overflow.
func TestAddN(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	type tc struct {
		sum, v float64
		n      int
	}
	cases := []tc{
		{0, 0.0065, 1000}, {0, 1, 1 << 20}, {1, 0x1p-53, 10}, {1, 0x1p-52, 10}, {1, 3 * 0x1p-53, 100},
		{1 << 52, 0.5, 20}, {1 << 52, 1.5, 20}, {1 << 53, 1, 10}, {1 << 53, 3, 10}, {math.MaxFloat64 / 2, math.MaxFloat64 / 8, 10},
		{0x1p-1074, 0x1p-1074, 5000}, {0x1p-1022, 0x1p-1060, 5000}, {-1, 0.25, 100}, {1, -0.3, 100}, {1, 0, 10},
		{math.NaN(), 1, 10}, {1, math.NaN(), 10}, {math.Inf(1), 1, 10}, {1, math.Inf(1), 10}, {3, 2, 0},
	}
	for range 20000 {
		sum := math.Ldexp(rng.Float64(), rng.IntN(120)-60)
		if rng.IntN(8) == 0 {
			sum = 0
		}
		v := math.Ldexp(rng.Float64(), rng.IntN(80)-60)
		switch rng.IntN(4) {
		case 0: // a tie at the sum's binade or a later one: an odd multiple of half an ulp
			_, e := math.Frexp(math.Max(sum, v))
			half := math.Ldexp(1, e-54+rng.IntN(4))
			v = float64(2*rng.IntN(1<<10)+1) * half
		case 1: // a value with few significant bits (step latencies in seconds are often short)
			v = math.Ldexp(float64(rng.IntN(1<<12)), rng.IntN(20)-30)
		}
		cases = append(cases, tc{sum, v, rng.IntN(3000)})
	}
	for _, c := range cases {
		got, want := addN(c.sum, c.v, c.n), naiveAddN(c.sum, c.v, c.n)
		if math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("addN(%v, %v, %d) = %v (%#x), want %v (%#x)", c.sum, c.v, c.n, got, math.Float64bits(got), want, math.Float64bits(want))
		}
	}
}

func FuzzAddN(f *testing.F) {
	f.Add(0.0, 0.0065, uint16(1000))
	f.Add(1.0, 3*0x1p-53, uint16(100))
	f.Add(float64(1<<52), 1.5, uint16(50))
	f.Fuzz(func(t *testing.T, sum, v float64, n uint16) {
		got, want := addN(sum, v, int(n)), naiveAddN(sum, v, int(n))
		if math.Float64bits(got) != math.Float64bits(want) && !(math.IsNaN(got) && math.IsNaN(want)) {
			t.Fatalf("addN(%v, %v, %d) = %v, want %v", sum, v, n, got, want)
		}
	})
}

// BenchmarkHistObserveN records a step's batch of 96 equal inter-token
// latencies, as deliver does.
func BenchmarkHistObserveN(b *testing.B) {
	h := &hist{upper: itlBuckets, counts: make([]uint64, len(itlBuckets)+1), lastV: math.NaN()}
	b.ReportAllocs()
	for i := range b.N {
		h.observeN(0.0065+float64(i%3)*1e-4, 96)
	}
}

// TestMetricsPendingBatches: the observations of finished requests,
// recorded in batches (metrics.finishes), give the
// exposition that recording each at once gives, across several batches
// and interleaved with the steps' latencies, in every flavour.
func TestMetricsPendingBatches(t *testing.T) {
	prof, err := engine.LookupProfile("llama-3.1-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 9))
	type call struct {
		o         engine.Output
		generated int
		reason    string
		maxTokens int
	}
	var calls []call
	finished := 0
	for i := range 3*pendMax + 5 {
		ms := func() time.Duration { return time.Duration(rng.IntN(5e9)) }
		o := engine.Output{Finished: i%5 != 0, First: i%7 == 0, FinishReason: []string{"stop", "length", "abort"}[i%3],
			PromptTokens: rng.IntN(9000), Arrival: ms(), QueueTime: ms(), PrefillTime: ms(), DecodeTime: ms(), TTFT: ms(), ITL: ms()}
		o.Time = o.Arrival + ms()
		calls = append(calls, call{o: o, generated: rng.IntN(3), reason: o.FinishReason, maxTokens: 1 + rng.IntN(4000)})
		if o.Finished {
			finished++
		}
		if i%4 == 1 {
			calls[len(calls)-1].generated = 100 + rng.IntN(2000)
		}
	}
	for _, flavor := range Flavors {
		var out [2]string
		for k, eachAtOnce := range []bool{false, true} {
			m, err := newMetrics(flavor, "m", prof, "xxh3", time.Unix(1700000000, 0))
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range calls {
				m.mu.Lock()
				m.onOutput(&c.o, c.generated, c.reason, c.maxTokens)
				m.observeITLs(time.Duration(c.generated)*time.Millisecond, 3)
				if eachAtOnce {
					m.flush()
				}
				m.mu.Unlock()
			}
			mfs, err := m.gather()
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, mf := range mfs {
				if err := enc.Encode(mf); err != nil {
					t.Fatal(err)
				}
			}
			out[k] = b.String()
		}
		if out[0] != out[1] {
			t.Errorf("%s: batched exposition differs from recording each at once:\n%s\nwant\n%s", flavor, out[0], out[1])
		}
		if want := fmt.Sprintf(`vllm:request_params_max_tokens_count{engine="0",model_name="m"} %d`, finished); flavor == FlavorVLLM && !strings.Contains(out[0], want) {
			t.Errorf("vllm: want all %d finished requests' max_tokens counted", finished)
		}
	}
}

// TestMetricsFinishedRequestParams checks the histograms vLLM records for
// each finished request (IterationStats.update_from_finished_request and
// ParentRequest.observe_finished_request): max_num_generation_tokens is
// the tokens the request generated (the most of its n choices), not its
// max_tokens; request_time_per_output_token is observed for every finished
// request, 0 when it generated one token.
func TestMetricsFinishedRequestParams(t *testing.T) {
	_, hs := testServer(t, Config{EOSMean: 4})
	completion := func(body string) int {
		t.Helper()
		code, b := post(t, hs.URL+"/v1/completions", body)
		if code != 200 {
			t.Fatalf("got status %d (%s)", code, b)
		}
		var c openai.Completion
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		return c.Usage.CompletionTokens
	}
	// A one-token request, and requests until one ends with EOS before
	// its max_tokens.
	gen, maxTokens, reqs := completion(`{"prompt":"abc","max_tokens":1,"ignore_eos":true}`), 1, 1
	for seed := 1; ; seed++ {
		n := completion(fmt.Sprintf(`{"prompt":"abc","max_tokens":50,"seed":%d}`, seed))
		gen, maxTokens, reqs = gen+n, maxTokens+50, reqs+1
		if n < 50 {
			break
		}
		if seed == 100 {
			t.Fatal("no request ended with EOS")
		}
	}
	mfs := scrape(t, hs.URL)
	hist := func(name string) (count uint64, sum float64) {
		h := mfs[name].GetMetric()[0].GetHistogram()
		return h.GetSampleCount(), h.GetSampleSum()
	}
	if n, sum := hist("vllm:request_max_num_generation_tokens"); n != uint64(reqs) || sum != float64(gen) {
		t.Errorf("request_max_num_generation_tokens: got count %d sum %v, want %d and %d (the tokens generated)", n, sum, reqs, gen)
	}
	if n, sum := hist("vllm:request_params_max_tokens"); n != uint64(reqs) || sum != float64(maxTokens) {
		t.Errorf("request_params_max_tokens: got count %d sum %v, want %d and %d", n, sum, reqs, maxTokens)
	}
	if n, _ := hist("vllm:request_time_per_output_token_seconds"); n != uint64(reqs) {
		t.Errorf("request_time_per_output_token_seconds: got count %d, want %d (a one-token request observes 0)", n, reqs)
	}
}

// TestMetricsIterationTokens checks vllm:iteration_tokens_total as vLLM
// records it (IterationStats.update_from_output, AsyncLLM's output
// handler): per step with outputs, the tokens generated plus the whole
// prompt of each request that got its first token (cached tokens
// included); a step that only computes a prefill chunk, with no output,
// is not observed.
func TestMetricsIterationTokens(t *testing.T) {
	m := tinyVLLMMetrics(t)
	steps := []engine.StepResult{
		// A first chunk of a 100-token prompt: no output.
		{Batch: engine.Batch{Seqs: 1, PrefillTokens: 64}},
		// Its last 4 tokens (32 were cached) and a decode: 100 + 1 + 1.
		{Batch: engine.Batch{Seqs: 2, PrefillTokens: 4, DecodeTokens: 1},
			Outputs: []engine.Output{{ID: "a", First: true, PromptTokens: 100}, {ID: "b", Index: 7}}},
		// Two decodes: 2.
		{Batch: engine.Batch{Seqs: 2, DecodeTokens: 2}, Outputs: []engine.Output{{ID: "a", Index: 1}, {ID: "b", Index: 8}}},
	}
	m.mu.Lock()
	for i := range steps {
		n, ok := stepTokens(&steps[i])
		m.observeStep(n, ok, nil)
	}
	m.mu.Unlock()
	h := m.iteration
	if h.count != 2 || h.sum != 104 {
		t.Errorf("iteration_tokens_total: got count %d sum %v, want 2 and 104", h.count, h.sum)
	}
}

// TestCacheConfigInfoPrefixCaching: vllm:cache_config_info's
// enable_prefix_caching label says whether the engine caches prefixes.
func TestCacheConfigInfoPrefixCaching(t *testing.T) {
	for _, off := range []bool{false, true} {
		cfg := Config{}
		testDefaults(t, &cfg)
		cfg.Engine.DisablePrefixCaching = off
		_, hs := testServer(t, cfg)
		m := scrape(t, hs.URL)["vllm:cache_config_info"].GetMetric()[0]
		want := map[bool]string{false: "True", true: "False"}[off]
		if got := labelsOf(m)["enable_prefix_caching"]; got != want {
			t.Errorf("DisablePrefixCaching %v: got enable_prefix_caching %q, want %q", off, got, want)
		}
	}
}

// TestScrapeIsOneSnapshot: every series of one scrape reports the same
// published snapshot, even when the engine loop publishes another while
// the registry collects (here a series that publishes when read, as the
// loop may between any two series). Each series read the last published
// snapshot on its own, so a scrape could pair one step's KV usage with an
// earlier step's request counts: a pulled request holding blocks while
// counted nowhere (TestPDDecodeHoldsBlocksDuringPull failed in CI on it:
// "KV usage 0.109375, 0 waiting").
func TestScrapeIsOneSnapshot(t *testing.T) {
	m := tinyVLLMMetrics(t)
	idle := snapshot{}
	busy := snapshot{st: engine.Stats{Waiting: 1, KVUsage: 0.5}}
	var n int
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "test_publisher", Help: "publishes when read"}, func() float64 {
		n++
		if n%2 == 1 {
			m.publish(&busy)
		} else {
			m.publish(&idle)
		}
		return 0
	}))
	for i := range 50 {
		mfs, err := m.gather()
		if err != nil {
			t.Fatal(err)
		}
		var waiting, usage float64
		for _, mf := range mfs {
			switch mf.GetName() {
			case "vllm:num_requests_waiting":
				waiting = mf.GetMetric()[0].GetGauge().GetValue()
			case "vllm:kv_cache_usage_perc":
				usage = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		if (waiting == 0) != (usage == 0) {
			t.Fatalf("scrape %d: %v waiting with KV usage %v, from two snapshots", i, waiting, usage)
		}
	}
}

// tinyVLLMMetrics is the vLLM flavour's instruments for the tiny profile.
func tinyVLLMMetrics(t *testing.T) *metrics {
	t.Helper()
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(FlavorVLLM, "m", prof, "xxh3", time.Unix(1700000000, 0))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMetricsNullBlock: the emulated engine's null block (engine.Profile's
// UsableBlocks) is neither used nor capacity. tiny has 65 blocks of 16
// tokens, 64 usable: SGLang's max_total_num_tokens is 64 x 16 = 1024 and,
// idle, num_used_tokens and token_usage are 0; vLLM's kv_cache_usage_perc
// is 0 too.
func TestMetricsNullBlock(t *testing.T) {
	for _, tc := range []struct {
		flavor string
		want   map[string]float64
	}{
		{FlavorSGLang, map[string]float64{"sglang:max_total_num_tokens": 1024, "sglang:num_used_tokens": 0, "sglang:token_usage": 0}},
		{FlavorVLLM, map[string]float64{"vllm:kv_cache_usage_perc": 0}},
	} {
		_, hs := testServer(t, Config{MetricsFlavor: tc.flavor})
		mfs := scrape(t, hs.URL)
		for name, want := range tc.want {
			mf := mfs[name]
			if mf == nil || len(mf.GetMetric()) == 0 {
				t.Fatalf("%s: %s missing", tc.flavor, name)
			}
			if got := value(mf.GetMetric()[0]); got != want {
				t.Errorf("%s: %s = %v, want %v", tc.flavor, name, got, want)
			}
		}
	}
}
