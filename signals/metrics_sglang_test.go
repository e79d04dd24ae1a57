package signals

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// sglangPage writes an SGLang /metrics page with one series per scheduler
// worker: each of schedulers is a label set and its (running, queued,
// token usage, capacity, cache hit rate, retracted) gauges.
func sglangPage(workers []sglangWorker) string {
	var b strings.Builder
	gauges := []struct {
		name string
		val  func(w sglangWorker) float64
	}{
		{"sglang:num_running_reqs", func(w sglangWorker) float64 { return w.running }},
		{"sglang:num_queue_reqs", func(w sglangWorker) float64 { return w.queued }},
		{"sglang:token_usage", func(w sglangWorker) float64 { return w.usage }},
		{"sglang:max_total_num_tokens", func(w sglangWorker) float64 { return w.capacity }},
		{"sglang:cache_hit_rate", func(w sglangWorker) float64 { return w.hitRate }},
		{"sglang:num_retracted_reqs_total", func(w sglangWorker) float64 { return w.retracted }},
	}
	for _, g := range gauges {
		typ := "gauge"
		if strings.HasSuffix(g.name, "_total") {
			typ = "counter"
		}
		fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s %s\n", g.name, g.name, typ)
		for _, w := range workers {
			fmt.Fprintf(&b, "%s{engine_type=\"unified\",model_name=\"Qwen/Qwen3-8B\",%s} %g\n", g.name, w.labels, g.val(w))
		}
	}
	b.WriteString("# HELP sglang:prompt_tokens_total x\n# TYPE sglang:prompt_tokens_total counter\n")
	b.WriteString("sglang:prompt_tokens_total{model_name=\"Qwen/Qwen3-8B\"} 1000\n")
	b.WriteString("# HELP sglang:cached_tokens_total x\n# TYPE sglang:cached_tokens_total counter\n")
	b.WriteString("sglang:cached_tokens_total{cache_source=\"device\",model_name=\"Qwen/Qwen3-8B\"} 300\n")
	b.WriteString("sglang:cached_tokens_total{cache_source=\"host\",model_name=\"Qwen/Qwen3-8B\"} 100\n")
	return b.String()
}

type sglangWorker struct {
	labels                                               string
	running, queued, usage, capacity, hitRate, retracted float64
}

// TestParseMetricsSGLangSchedulers: an SGLang server with several
// schedulers publishes one series per scheduler worker, labelled with its
// ranks. The tensor-parallel ranks of one data-parallel group (all of them
// with --enable-metrics-for-all-schedulers) and its pipeline stages (by
// default) publish the same batch's numbers: counted once. Data-parallel
// groups (dp_rank; DP attention's too) each have their own requests and KV
// pool: their queues and capacities add up, their KV usage is averaged
// weighted by capacity. (Every series was added up: a TP=2 server
// reported twice its queue, and its capacity twice over.)
func TestParseMetricsSGLangSchedulers(t *testing.T) {
	type want struct {
		waiting, running, usage, hit, retracted float64
		capacity                                int
	}
	tests := []struct {
		name    string
		workers []sglangWorker
		want    want
	}{
		{"one scheduler", []sglangWorker{
			{`moe_ep_rank="0",pp_rank="0",tp_rank="0"`, 12, 3, 0.28, 442357, 0.5, 2},
		}, want{3, 12, 0.28, 0.5, 2, 442357}},
		{"tp 2, metrics for all schedulers", []sglangWorker{
			{`moe_ep_rank="0",pp_rank="0",tp_rank="0"`, 12, 3, 0.28, 442357, 0.5, 2},
			{`moe_ep_rank="0",pp_rank="0",tp_rank="1"`, 12, 3, 0.28, 442357, 0.5, 2},
		}, want{3, 12, 0.28, 0.5, 2, 442357}},
		{"pp 2", []sglangWorker{
			{`moe_ep_rank="0",pp_rank="0",tp_rank="0"`, 8, 1, 0.5, 100000, 0.25, 0},
			// The last stage sampled one step later: a request more.
			{`moe_ep_rank="0",pp_rank="1",tp_rank="0"`, 9, 1, 0.5, 100000, 0.25, 0},
		}, want{1, 9, 0.5, 0.25, 0, 100000}},
		{"dp 2 (one scheduler each)", []sglangWorker{
			{`dp_rank="0",moe_ep_rank="0",pp_rank="0",tp_rank="0"`, 10, 3, 0.5, 200000, 0.2, 1},
			{`dp_rank="1",moe_ep_rank="0",pp_rank="0",tp_rank="0"`, 6, 1, 0.25, 200000, 0.4, 2},
		}, want{4, 16, 0.375, 0.3, 3, 400000}},
		{"dp attention tp 4 dp 2, metrics for all schedulers", []sglangWorker{
			{`dp_rank="0",moe_ep_rank="0",pp_rank="0",tp_rank="0"`, 10, 3, 0.5, 200000, 0.2, 1},
			{`dp_rank="0",moe_ep_rank="0",pp_rank="0",tp_rank="1"`, 10, 3, 0.5, 200000, 0.2, 1},
			{`dp_rank="1",moe_ep_rank="1",pp_rank="0",tp_rank="2"`, 6, 1, 0.25, 200000, 0.4, 2},
			{`dp_rank="1",moe_ep_rank="1",pp_rank="0",tp_rank="3"`, 6, 1, 0.25, 200000, 0.4, 2},
		}, want{4, 16, 0.375, 0.3, 3, 400000}},
		{"dp 2, unequal pools", []sglangWorker{
			{`dp_rank="0",pp_rank="0",tp_rank="0"`, 1, 0, 0.5, 300000, 0, 0},
			{`dp_rank="1",pp_rank="0",tp_rank="0"`, 1, 0, 0.1, 100000, 0, 0},
		}, want{0, 2, 0.4, 0, 0, 400000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(sglangPage(tt.workers)), textCT, FlavorAuto)
			if err != nil {
				t.Fatalf("ParseMetrics: %v", err)
			}
			if got.Flavor != FlavorSGLang {
				t.Fatalf("flavor %q, want sglang", got.Flavor)
			}
			w := tt.want
			for _, c := range []struct {
				name      string
				got, want float64
			}{
				{"Waiting", got.Waiting, w.waiting}, {"Running", got.Running, w.running},
				{"KVUsage", got.KVUsage, w.usage}, {"CacheHitRate", got.CacheHitRate, w.hit},
				{"Preemptions", got.Preemptions, w.retracted},
				{"KVCapacityTokens", float64(got.KVCapacityTokens), float64(w.capacity)},
				{"PrefixQueries", got.PrefixQueries, 1000}, {"PrefixHits", got.PrefixHits, 400},
			} {
				if math.Abs(c.got-c.want) > 1e-9 {
					t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
				}
			}
		})
	}
}

// TestParseMetricsSGLangRetracted: SGLang counts retracted requests in
// sglang:num_retracted_requests_total (its collector's Counter
// "sglang:num_retracted_requests"); only a sglang:num_retracted_reqs_total,
// which it does not publish, was read, so Preemptions stayed unknown.
func TestParseMetricsSGLangRetracted(t *testing.T) {
	page := `# HELP sglang:num_running_reqs x
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 4
# HELP sglang:num_queue_reqs x
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1
# HELP sglang:num_retracted_reqs x
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 7
`
	got, err := ParseMetrics(strings.NewReader(page), textCT, FlavorAuto)
	if err != nil {
		t.Fatal(err)
	}
	if got.Have&HasPreemptions == 0 || got.Preemptions != 7 {
		t.Errorf("Preemptions: got %v (have %v), want 7", got.Preemptions, got.Have&HasPreemptions != 0)
	}
}

// TestParseMetricsSGLangBootstrapQueue: SGLang renamed its prefill
// server's bootstrap queue gauge sglang:num_prefill_prealloc_queue_reqs to
// sglang:num_prefill_bootstrap_queue_reqs
// (python/sglang/srt/observability/metrics_collector.py); a prefill
// server of either version has its bootstrap queue in Waiting. (Only the
// old name was read: a newer prefill server's bootstrap queue was not
// counted.)
func TestParseMetricsSGLangBootstrapQueue(t *testing.T) {
	const labels = `{dp_rank="%d",engine_type="prefill",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"}`
	for _, name := range []string{"sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_prealloc_queue_reqs"} {
		t.Run(name, func(t *testing.T) {
			var b strings.Builder
			for _, g := range []struct {
				name   string
				v0, v1 float64
			}{
				{"sglang:num_running_reqs", 0, 0},
				{"sglang:num_queue_reqs", 2, 1},
				{name, 5, 3},
				{"sglang:num_prefill_inflight_queue_reqs", 7, 4},
			} {
				fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s gauge\n", g.name, g.name)
				fmt.Fprintf(&b, "%s"+labels+" %g\n", g.name, 0, g.v0)
				fmt.Fprintf(&b, "%s"+labels+" %g\n", g.name, 1, g.v1)
			}
			got, err := ParseMetrics(strings.NewReader(b.String()), textCT, FlavorAuto)
			if err != nil {
				t.Fatal(err)
			}
			if got.Waiting != 11 {
				t.Errorf("Waiting: got %v, want 11 (queue 2+1, bootstrap 5+3)", got.Waiting)
			}
		})
	}
}

// TestParseMetricsSGLangPriority: with --enable-priority-scheduling, SGLang
// writes each queue gauge (running, waiting, the P/D queues) twice per
// scheduler: the total under priority="" and a breakdown under
// priority="<n>" (and "None" for requests without one). The breakdown was
// taken for other schedulers' series and added to the total: Waiting and
// Running came out doubled.
func TestParseMetricsSGLangPriority(t *testing.T) {
	page := func(dp int) string {
		var b strings.Builder
		for _, g := range []struct {
			name               string
			total, p0, p10, pn float64
		}{
			{"sglang:num_running_reqs", 8, 6, 2, 0},
			{"sglang:num_queue_reqs", 5, 3, 1, 1},
			{"sglang:num_decode_prealloc_queue_reqs", 4, 4, 0, 0},
			{"sglang:num_decode_transfer_queue_reqs", 2, 0, 2, 0},
		} {
			fmt.Fprintf(&b, "# HELP %s x\n# TYPE %s gauge\n", g.name, g.name)
			for r := range dp {
				for _, p := range []struct {
					label string
					v     float64
				}{{"", g.total}, {"0", g.p0}, {"10", g.p10}, {"None", g.pn}} {
					fmt.Fprintf(&b, "%s{dp_rank=\"%d\",engine_type=\"decode\",model_name=\"m\",moe_ep_rank=\"0\",pp_rank=\"0\",priority=%q,tp_rank=\"0\"} %g\n",
						g.name, r, p.label, p.v)
				}
			}
		}
		return b.String()
	}
	for _, dp := range []int{1, 2} {
		t.Run(fmt.Sprintf("dp %d", dp), func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(page(dp)), textCT, FlavorAuto)
			if err != nil {
				t.Fatal(err)
			}
			if want := float64(dp * (5 + 4 + 2)); got.Waiting != want {
				t.Errorf("Waiting: got %v, want %v", got.Waiting, want)
			}
			if want := float64(dp * 8); got.Running != want {
				t.Errorf("Running: got %v, want %v", got.Running, want)
			}
		})
	}
}
