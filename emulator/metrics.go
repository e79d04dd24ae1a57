package emulator

import (
	"bytes"
	"fmt"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Metrics flavours: which engine's /metrics the emulator imitates.
const (
	// FlavorVLLM is vLLM V1 with the current names (0.12 and later).
	FlavorVLLM = "vllm"
	// FlavorVLLMLegacy is vLLM V1 before 0.12: gpu_cache_usage_perc,
	// gpu_prefix_cache_{queries,hits}_total and time_per_output_token_seconds
	// instead of the current names.
	FlavorVLLMLegacy = "vllm-legacy"
	// FlavorSGLang is SGLang's sglang:* metrics (labels: model_name).
	FlavorSGLang = "sglang"
	// FlavorLlamaCpp is llama.cpp server's llamacpp:* metrics (no labels).
	FlavorLlamaCpp = "llamacpp"
)

// Flavors lists the metrics flavours.
var Flavors = []string{FlavorVLLM, FlavorVLLMLegacy, FlavorSGLang, FlavorLlamaCpp}

// Histogram buckets as the engines define them (protocols.md section 1).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
		20, 40, 80, 160, 640, 2560}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
		20, 40, 80}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240,
		480, 960, 1920, 7680}
	nBuckets         = []float64{1, 2, 5, 10, 20}
	iterationBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}

	sglangTTFTBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400}
	sglangITLBuckets  = []float64{0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06,
		0.08, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8}
	sglangE2EBuckets = []float64{0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800}
)

// buckets125 returns vLLM's build_1_2_5_buckets(max): 1, 2, 5, 10, 20, 50,
// ... up to max.
func buckets125(max int) []float64 {
	var b []float64
	for exp := 1; ; exp *= 10 {
		for _, m := range []int{1, 2, 5} {
			v := m * exp
			if v > max {
				return b
			}
			b = append(b, float64(v))
		}
	}
}

// finishReasons are the request_success_total series vLLM creates up front.
var finishReasons = []string{"stop", "length", "abort", "error"}

// snapshot is what the engine loop publishes after each step for the
// metrics read at scrape time.
type snapshot struct {
	st engine.Stats
	// Accumulated by the loop for the SGLang and llama.cpp flavours.
	promptSeconds, decodeSeconds float64
	maxContext                   int
	genThroughput                float64 // tokens/s over the last second
	requests, aborted            int64
	// stopGen counts the tokens the engine generated for requests with
	// stop strings (counted with its GenerationTokens, when a step is
	// computed): vllm:generation_tokens_total has instead the tokens their
	// handlers counted (metrics.stopCounted; see stopState).
	stopGen int64
	// bootstrapping is metrics.bootstrapping when the snapshot was taken.
	bootstrapping int64
}

// metrics holds one Server's instruments. Histograms that the flavour does
// not have are nil. The loop goroutine makes the observations; a scrape
// records those still pending (flush), under mu.
type metrics struct {
	reg *prometheus.Registry
	// snapMu protects snap, the last published snapshot (a leaf lock): the
	// loop overwrites it in place at every step instead of allocating one.
	snapMu sync.Mutex
	snap   snapshot
	// scraped is the snapshot a scrape (gather) reads every series from,
	// taken once when it starts, so that one scrape's series agree: read
	// series by series, a step published between two of them paired one
	// step's KV usage with an earlier step's request counts (a request
	// holding blocks, counted nowhere). gatherMu serializes the scrapes
	// that set it.
	scraped  atomic.Pointer[snapshot]
	gatherMu sync.Mutex

	// mu guards the histograms: the loop holds it while it records a step,
	// a scrape while it copies them. One lock per step instead of atomic
	// operations per observation keeps the per-token cost low.
	mu                                                      sync.Mutex
	hists                                                   []*hist
	ttft, itl, tpot, e2e, queue, inference, prefill, decode *hist
	promptTokens, genTokens, maxTokensParam, maxGenTokens   *hist
	nParam, iteration                                       *hist
	success                                                 map[string]prometheus.Counter
	// finishes are the observations of finished requests not yet
	// recorded (under mu): the histograms only they change (the
	// parameters', the finished requests' latencies and sizes) and the
	// success counters take them in batches (flush), in order, so that a
	// request does not touch a dozen histograms' cold memory (a busy
	// fleet's loop wakes with a cold cache). Whoever reads those flushes
	// first (gather, Collect).
	finishes []finishObs
	// stopCounted counts the tokens of requests with stop strings up to
	// their match (stopState), for vllm:generation_tokens_total.
	stopCounted atomic.Int64
	// dropAborts: a request its client left records no finish (vLLM: its
	// front end forgets the request, OutputProcessor.abort_requests, so
	// request_success_total and the per-request histograms never see it;
	// the tokens it generated before are counted). Set for the vLLM
	// flavours.
	dropAborts bool
	// bootstrapping counts the SGLang prefill legs waiting for their
	// decode engine's bootstrap before the engine takes them
	// (Server.awaitBootstrap): SGLang's prefill bootstrap queue.
	bootstrapping atomic.Int64
}

// finishObs is what a finished request records in the histograms only
// finished requests change, and in its success counter. As in vLLM
// (IterationStats.update_from_finished_request), its parameters
// (max_tokens, n) are recorded when it finishes, max_num_generation_tokens
// is the tokens it generated, and its time per output token is 0 when it
// generated one token or none.
type finishObs struct {
	e2e, queue, inference, prefill, decode float64
	promptTokens, generated, tpot          float64
	maxTokens                              float64
	reason                                 string
}

// pendMax is the most pending finishes before they are recorded.
const pendMax = 32

// hist is a classic Prometheus histogram written under metrics.mu and
// exposed as a const histogram at scrape time.
type hist struct {
	desc   *prometheus.Desc
	upper  []float64
	counts []uint64 // counts[i]: observations in (upper[i-1], upper[i]]; the last is +Inf
	sum    float64
	count  uint64
	// lastV was last observed, in counts[lastBucket] (NaN at first: no
	// value equals it).
	lastV      float64
	lastBucket int
}

func (h *hist) observe(v float64) {
	if h == nil {
		return
	}
	lo := h.lastBucket
	if v != h.lastV { // a step's inter-token latencies are one value: search once
		hi := len(h.upper) // first i with v <= upper[i]
		lo = 0
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if v <= h.upper[mid] {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		h.lastV, h.lastBucket = v, lo
	}
	h.counts[lo]++
	h.sum += v
	h.count++
}

// observeN records n observations of v, exactly as n calls of observe(v)
// would (the sum adds v n times, in order).
func (h *hist) observeN(v float64, n int) {
	if h == nil || n <= 0 {
		return
	}
	h.observe(v)
	h.counts[h.lastBucket] += uint64(n - 1)
	h.count += uint64(n - 1)
	h.sum = addN(h.sum, v, n-1)
}

// addN returns sum after n float64 additions of v, one after the other
// (each rounded to nearest, ties to even), bit for bit, without making
// them all: a step records a batch of ~100 equal latencies, and n
// dependent additions were most of observeN's cost.
//
// While the running sum stays in one binade [2^e, 2^(e+1)), every sum is
// a multiple of the binade's ulp u, and an addition rounds it to the
// multiple nearest to sum+v: it adds v rounded to a multiple of u, the
// same each time, except for a tie (v an odd multiple of u/2), which
// rounds to an even multiple and so may add one u more the first time,
// then the same from the second on. So once two additions were made
// within the binade, the next ones add the second's increment d for as
// long as sum+d stays below the binade's end: their result is computed
// at once, in units of u. The additions near each binade's start are
// made one by one, as are those of values the argument does not cover
// (v <= 0, sums that are not positive normal numbers, the last binade).
func addN(sum, v float64, n int) float64 {
	const mant = 1<<52 - 1
	for n > 0 {
		if n < 4 || !(v > 0) || !(sum > 0) {
			sum += v
			n--
			continue
		}
		s1 := sum + v
		s2 := s1 + v
		s3 := s2 + v
		n -= 3
		b1, b2, b3 := math.Float64bits(s1), math.Float64bits(s2), math.Float64bits(s3)
		exp := b3 >> 52
		if b1>>52 != exp || b2>>52 != exp || exp == 0 || exp >= 0x7fe {
			sum = s3 // a binade boundary, a subnormal, or the last binade (+Inf)
			continue
		}
		d := b3 - b2                    // the increment, in ulps (s2, s3: same binade)
		a := b3&mant | 1<<52            // s3 in ulps, in [2^52, 2^53)
		k, room := uint64(n), 1<<53-1-a // additions computed at once; a + k*d <= 1<<53-1
		if hi, lo := bits.Mul64(k, d); hi != 0 || lo > room {
			k = room / d // the binade ends first
		}
		sum = math.Float64frombits(exp<<52 | (a+k*d)&mant)
		n -= int(k)
	}
	return sum
}

// Describe and Collect make metrics a prometheus.Collector of its
// histograms.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, h := range m.hists {
		ch <- h.desc
	}
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flush()
	for _, h := range m.hists {
		buckets := make(map[float64]uint64, len(h.upper))
		var cum uint64
		for i, u := range h.upper {
			cum += h.counts[i]
			buckets[u] = cum
		}
		ch <- prometheus.MustNewConstHistogram(h.desc, h.count, h.sum, buckets)
	}
}

// stats returns a copy of the last published snapshot.
func (m *metrics) stats() *snapshot {
	m.snapMu.Lock()
	s := m.snap
	m.snapMu.Unlock()
	s.bootstrapping = m.bootstrapping.Load()
	return &s
}

// publish makes s the snapshot stats returns.
func (m *metrics) publish(s *snapshot) {
	m.snapMu.Lock()
	m.snap = *s
	m.snapMu.Unlock()
}

// newMetrics builds the instruments of a flavour on a private registry.
func newMetrics(flavor, model string, prof engine.Profile, hashAlgo string, start time.Time) (*metrics, error) {
	return newRankMetrics(flavor, model, 0, prof, hashAlgo, true, start)
}

// newRankMetrics is newMetrics for the engine core of data parallel rank
// rank: vLLM's series carry engine="<rank>" (vllm/v1/metrics/loggers.py);
// caching is whether the engine caches prefixes (cache_config_info).
func newRankMetrics(flavor, model string, rank int, prof engine.Profile, hashAlgo string, caching bool, start time.Time) (*metrics, error) {
	m := &metrics{reg: prometheus.NewRegistry(), success: map[string]prometheus.Counter{}}
	created := float64(start.UnixNano()) / 1e9
	switch flavor {
	case FlavorVLLM, FlavorVLLMLegacy:
		m.dropAborts = true
		m.vllm(flavor == FlavorVLLMLegacy, prometheus.Labels{"model_name": model, "engine": strconv.Itoa(rank)}, prof, hashAlgo, caching, created)
	case FlavorSGLang:
		m.sglang(prometheus.Labels{"model_name": model}, prof, created)
	case FlavorLlamaCpp:
		m.llamacpp()
	default:
		return nil, fmt.Errorf("emulator: unknown metrics flavor %q (known: %v)", flavor, Flavors)
	}
	if len(m.hists) > 0 {
		m.reg.MustRegister(m)
	}
	return m, nil
}

func (m *metrics) gaugeFunc(name, help string, labels prometheus.Labels, f func(*snapshot) float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels},
		func() float64 { return f(m.seriesStats()) }))
}

// counterFunc registers name (which ends in _total) and, when created is not
// zero, the <base>_created gauge prometheus_client emits next to it.
func (m *metrics) counterFunc(name, help string, labels prometheus.Labels, created float64, f func(*snapshot) float64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
		func() float64 { return f(m.seriesStats()) }))
	if created != 0 {
		m.created(name[:len(name)-len("_total")], help, labels, created)
	}
}

func (m *metrics) created(base, help string, labels prometheus.Labels, created float64) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: base + "_created", Help: help, ConstLabels: labels})
	g.Set(created)
	m.reg.MustRegister(g)
}

func (m *metrics) histogram(name, help string, labels prometheus.Labels, buckets []float64, created float64) *hist {
	h := &hist{desc: prometheus.NewDesc(name, help, nil, labels), upper: buckets, counts: make([]uint64, len(buckets)+1), lastV: math.NaN()}
	m.hists = append(m.hists, h)
	if created != 0 {
		m.created(name, help, labels, created)
	}
	return h
}

func (m *metrics) vllm(legacy bool, l prometheus.Labels, prof engine.Profile, hashAlgo string, caching bool, created float64) {
	m.gaugeFunc("vllm:num_requests_running", "Number of requests in model execution batches.", l,
		func(s *snapshot) float64 { return float64(s.st.Running) })
	m.gaugeFunc("vllm:num_requests_waiting", "Number of requests waiting to be processed.", l,
		func(s *snapshot) float64 { return float64(s.st.Waiting) })
	usage, queries, hits := "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
	usageHelp := "KV-cache usage. 1 means 100 percent usage."
	if legacy {
		usage, queries, hits = "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"
		usageHelp = "GPU KV-cache usage. 1 means 100 percent usage."
	}
	m.gaugeFunc(usage, usageHelp, l, func(s *snapshot) float64 { return s.st.KVUsage })
	m.counterFunc(queries, "Prefix cache queries, in terms of number of queried tokens.", l, created,
		func(s *snapshot) float64 { return float64(s.st.PrefixQueries) })
	m.counterFunc(hits, "Prefix cache hits, in terms of number of cached tokens.", l, created,
		func(s *snapshot) float64 { return float64(s.st.PrefixHits) })
	if !legacy {
		m.counterFunc("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", l, created,
			func(s *snapshot) float64 { return float64(s.st.ExternalQueries) })
		m.counterFunc("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", l, created,
			func(s *snapshot) float64 { return float64(s.st.ExternalHits) })
	}
	m.counterFunc("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", l, created,
		func(s *snapshot) float64 { return float64(s.st.Preemptions) })
	m.counterFunc("vllm:prompt_tokens_total", "Number of prefill tokens processed.", l, created,
		func(s *snapshot) float64 { return float64(s.st.PromptTokens) })
	if !legacy {
		m.promptBySource(l, created)
	}
	m.counterFunc("vllm:generation_tokens_total", "Number of generation tokens processed.", l, created,
		func(s *snapshot) float64 { return float64(s.st.GenerationTokens - s.stopGen + m.stopCounted.Load()) })

	const successHelp = "Count of successfully processed requests."
	sv := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total", Help: successHelp, ConstLabels: l},
		[]string{"finished_reason"})
	cv := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:request_success_created", Help: successHelp, ConstLabels: l},
		[]string{"finished_reason"})
	for _, r := range finishReasons {
		m.success[r] = sv.WithLabelValues(r)
		cv.WithLabelValues(r).Set(created)
	}
	m.reg.MustRegister(sv, cv)

	m.ttft = m.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", l, ttftBuckets, created)
	if legacy {
		m.itl = m.histogram("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", l, itlBuckets, created)
	} else {
		m.itl = m.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", l, itlBuckets, created)
		m.tpot = m.histogram("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", l, itlBuckets, created)
	}
	m.e2e = m.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", l, requestLatencyBuckets, created)
	m.queue = m.histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", l, requestLatencyBuckets, created)
	m.inference = m.histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", l, requestLatencyBuckets, created)
	m.prefill = m.histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", l, requestLatencyBuckets, created)
	m.decode = m.histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", l, requestLatencyBuckets, created)
	tokBuckets := buckets125(prof.MaxModelLen)
	m.promptTokens = m.histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", l, tokBuckets, created)
	m.genTokens = m.histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", l, tokBuckets, created)
	m.maxTokensParam = m.histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", l, tokBuckets, created)
	m.maxGenTokens = m.histogram("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", l, tokBuckets, created)
	m.nParam = m.histogram("vllm:request_params_n", "Histogram of the n request parameter.", l, nBuckets, created)
	m.iteration = m.histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", l, iterationBuckets, created)

	info := prometheus.Labels{"engine": l["engine"], "block_size": strconv.Itoa(prof.BlockSize), "cache_dtype": "auto",
		"enable_prefix_caching": pyBool(caching), "gpu_memory_utilization": strconv.FormatFloat(prof.GPUMemoryUtilization, 'g', -1, 64),
		"num_gpu_blocks": strconv.Itoa(prof.NumGPUBlocks), "num_cpu_blocks": "None", "prefix_caching_hash_algo": hashAlgo}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig", ConstLabels: info})
	g.Set(1)
	m.reg.MustRegister(g)
}

// promptBySource registers vLLM's prompt token counters by source
// (vllm/v1/metrics/loggers.py, from PromptTokenStats in
// vllm/v1/metrics/stats.py, counted at each request's first output):
// prompt_tokens_by_source_total{source} with local_compute (the prompt
// less its cached tokens), local_cache_hit (cached tokens less those that
// arrived from outside, plus the last token recomputed when all others
// were cached) and external_kv_transfer (the KV connector's tokens);
// prompt_tokens_cached_total and prompt_tokens_recomputed_total.
func (m *metrics) promptBySource(l prometheus.Labels, created float64) {
	const help = "Number of prompt tokens by source."
	for _, src := range []struct {
		name string
		f    func(st *engine.Stats) int64
	}{
		{"local_compute", func(st *engine.Stats) int64 { return st.PromptTokens - st.PromptCached }},
		{"local_cache_hit", func(st *engine.Stats) int64 { return st.PromptCached + st.PromptRecomputed - st.PromptExternal }},
		{"external_kv_transfer", func(st *engine.Stats) int64 { return st.PromptExternal }},
	} {
		sl := prometheus.Labels{"source": src.name}
		for k, v := range l {
			sl[k] = v
		}
		m.counterFunc("vllm:prompt_tokens_by_source_total", help, sl, created, func(s *snapshot) float64 { return float64(src.f(&s.st)) })
	}
	m.counterFunc("vllm:prompt_tokens_cached_total", "Number of cached prompt tokens (local + external).", l, created,
		func(s *snapshot) float64 { return float64(s.st.PromptCached) })
	m.counterFunc("vllm:prompt_tokens_recomputed_total", "Number of cached tokens recomputed for forward pass.", l, created,
		func(s *snapshot) float64 { return float64(s.st.PromptRecomputed) })
}

// pyBool is Python's str of a bool, as vLLM's info labels write one.
func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func (m *metrics) sglang(l prometheus.Labels, prof engine.Profile, created float64) {
	m.gaugeFunc("sglang:num_running_reqs", "The number of running requests.", l, func(s *snapshot) float64 { return float64(s.st.Running) })
	m.gaugeFunc("sglang:num_queue_reqs", "The number of requests in the waiting queue.", l, func(s *snapshot) float64 {
		return float64(s.st.Waiting - s.st.Loading - s.st.LoadQueued) // not the decode legs' P/D queues (below)
	})
	m.gaugeFunc("sglang:num_used_tokens", "The number of used tokens.", l, func(s *snapshot) float64 {
		// The blocks in use: all but the free ones and the engine
		// model's null block (engine.Profile.UsableBlocks).
		return float64(s.st.NumGPUBlocks-1-s.st.FreeBlocks) * float64(s.st.BlockSize)
	})
	m.gaugeFunc("sglang:token_usage", "The token usage.", l, func(s *snapshot) float64 { return s.st.KVUsage })
	m.gaugeFunc("sglang:cache_hit_rate", "The prefix cache hit rate.", l, func(s *snapshot) float64 {
		if s.st.PrefixQueries == 0 {
			return 0
		}
		return float64(s.st.PrefixHits) / float64(s.st.PrefixQueries)
	})
	m.gaugeFunc("sglang:gen_throughput", "The generation throughput (token/s).", l, func(s *snapshot) float64 { return s.genThroughput })
	maxTotal := float64(prof.UsableBlocks() * prof.BlockSize) // what requests can hold, as token_usage's denominator
	m.gaugeFunc("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", l, func(*snapshot) float64 { return maxTotal })
	// The P/D queues, published by every SGLang server (0 outside P/D),
	// under the names of the SGLang whose labels this flavour has (its
	// metrics/collector.py; observability/metrics_collector.py renamed the
	// prefill prealloc queue num_prefill_bootstrap_queue_reqs). A prefill
	// request waits for its decode engine's bootstrap before the engine
	// takes it (bootstrap queue: Server.awaitBootstrap's legs, as
	// SGLang's scheduler reports len(disagg_prefill_bootstrap_queue.queue);
	// neither running nor in num_queue_reqs); once prefilled its KV is
	// held until a decode engine pulled it (inflight queue: the engine's
	// held requests). A decode
	// request waits for KV space before its pull (prealloc queue: the
	// engine model's decode legs queued for their blocks), then holds it
	// during its pull (transfer queue: those loading); SGLang's
	// num_queue_reqs counts neither.
	m.gaugeFunc("sglang:num_prefill_prealloc_queue_reqs", "The number of requests in the prefill prealloc queue.", l,
		func(s *snapshot) float64 { return float64(s.bootstrapping) })
	m.gaugeFunc("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.", l,
		func(s *snapshot) float64 { return float64(s.st.Held) })
	m.gaugeFunc("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.", l,
		func(s *snapshot) float64 { return float64(s.st.LoadQueued) })
	m.gaugeFunc("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.", l,
		func(s *snapshot) float64 { return float64(s.st.Loading) })
	m.counterFunc("sglang:prompt_tokens_total", "Number of prefill tokens processed.", l, created, func(s *snapshot) float64 { return float64(s.st.PromptTokens) })
	m.counterFunc("sglang:generation_tokens_total", "Number of generation tokens processed.", l, created, func(s *snapshot) float64 { return float64(s.st.GenerationTokens) })
	dl := prometheus.Labels{"cache_source": "device"}
	for k, v := range l {
		dl[k] = v
	}
	m.counterFunc("sglang:cached_tokens_total", "Number of cached prompt tokens.", dl, created, func(s *snapshot) float64 { return float64(s.st.PrefixHits) })
	m.counterFunc("sglang:num_requests_total", "Number of requests processed.", l, created, func(s *snapshot) float64 { return float64(s.requests) })
	m.counterFunc("sglang:num_aborted_requests_total", "Number of requests aborted.", l, created, func(s *snapshot) float64 { return float64(s.aborted) })
	m.ttft = m.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", l, sglangTTFTBuckets, created)
	m.itl = m.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", l, sglangITLBuckets, created)
	m.e2e = m.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", l, sglangE2EBuckets, created)
}

func (m *metrics) llamacpp() {
	c := func(name, help string, f func(*snapshot) float64) { m.counterFunc("llamacpp:"+name, help, nil, 0, f) }
	g := func(name, help string, f func(*snapshot) float64) { m.gaugeFunc("llamacpp:"+name, help, nil, f) }
	c("prompt_tokens_total", "Number of prompt tokens processed.", func(s *snapshot) float64 { return float64(s.st.PromptTokens - s.st.PrefixHits) })
	c("prompt_tokens_cached_total", "Number of prompt tokens served from the prompt cache.", func(s *snapshot) float64 { return float64(s.st.PrefixHits) })
	c("prompt_seconds_total", "Prompt process time", func(s *snapshot) float64 { return s.promptSeconds })
	c("tokens_predicted_total", "Number of generation tokens processed.", func(s *snapshot) float64 { return float64(s.st.GenerationTokens) })
	c("tokens_predicted_seconds_total", "Predict process time", func(s *snapshot) float64 { return s.decodeSeconds })
	c("n_decode_total", "Total number of llama_decode() calls", func(s *snapshot) float64 { return float64(s.st.Steps) })
	// llama.cpp declares n_tokens_max as a counter although it is a maximum.
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "llamacpp:n_tokens_max", Help: "Largest observed n_tokens."},
		func() float64 { return float64(m.seriesStats().maxContext) }))
	g("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", func(s *snapshot) float64 {
		if s.promptSeconds == 0 {
			return 0
		}
		return float64(s.st.PromptTokens-s.st.PrefixHits) / s.promptSeconds
	})
	g("predicted_tokens_seconds", "Average generation throughput in tokens/s.", func(s *snapshot) float64 {
		if s.decodeSeconds == 0 {
			return 0
		}
		return float64(s.st.GenerationTokens) / s.decodeSeconds
	})
	g("requests_processing", "Number of requests processing.", func(s *snapshot) float64 { return float64(s.st.Running) })
	// llama.cpp has no P/D: a request in a KV pull (an emulator-only
	// setup) is deferred as a task that waits for a free slot is, not yet
	// started, so that the load is seen (the engine counts it waiting).
	g("requests_deferred", "Number of requests deferred.", func(s *snapshot) float64 { return float64(s.st.Waiting) })
	g("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", func(s *snapshot) float64 {
		if s.st.Steps == 0 {
			return 0
		}
		return float64(s.st.GenerationTokens) / float64(s.st.Steps)
	})
}

// flush records the pending finishes, in the order they were made. The
// caller holds m.mu (as for onOutput and observeStep).
func (m *metrics) flush() {
	for i := range m.finishes {
		f := &m.finishes[i]
		if c := m.success[f.reason]; c != nil {
			c.Inc()
		}
		m.e2e.observe(f.e2e)
		m.queue.observe(f.queue)
		m.inference.observe(f.inference)
		m.prefill.observe(f.prefill)
		m.decode.observe(f.decode)
		m.promptTokens.observe(f.promptTokens)
		m.genTokens.observe(f.generated)
		m.tpot.observe(f.tpot)
		m.maxTokensParam.observe(f.maxTokens)
		m.maxGenTokens.observe(f.generated) // n is 1: the most tokens of the request's choices
		m.nParam.observe(1)
	}
	clear(m.finishes)
	m.finishes = m.finishes[:0]
}

// gather returns the registry's metrics, the pending observations
// recorded first.
func (m *metrics) gather() ([]*dto.MetricFamily, error) {
	m.gatherMu.Lock()
	defer m.gatherMu.Unlock()
	m.mu.Lock()
	m.flush()
	m.mu.Unlock()
	m.scraped.Store(m.stats())
	defer m.scraped.Store(nil)
	return m.reg.Gather()
}

// seriesStats is the snapshot a series reports: the scrape's (gather), or
// the last published one outside a scrape.
func (m *metrics) seriesStats() *snapshot {
	if s := m.scraped.Load(); s != nil {
		return s
	}
	return m.stats()
}

// onOutput records one engine output. generated is the number of tokens the
// request produced so far; reason the finish reason to count (it may differ
// from o.FinishReason: a stop string ends a request with an abort in the
// engine but "stop" for the client); maxTokens the request's max_tokens
// (read when o is its last output).
func (m *metrics) onOutput(o *engine.Output, generated int, reason string, maxTokens int) {
	m.onLatency(o, generated)
	if !o.Finished {
		return
	}
	m.addFinish(finishOf(o, generated, reason, maxTokens))
}

// onLatency records the time to first token or inter-token latency of o,
// as onOutput does.
func (m *metrics) onLatency(o *engine.Output, generated int) {
	if o.FinishReason != engine.FinishAbort || generated > 0 {
		if o.First {
			m.ttft.observe(o.TTFT.Seconds())
		} else if o.ITL > 0 {
			m.itl.observe(o.ITL.Seconds())
		}
	}
}

// finishOf is the observation of a request's last output o (see onOutput).
func finishOf(o *engine.Output, generated int, reason string, maxTokens int) finishObs {
	f := finishObs{e2e: (o.Time - o.Arrival).Seconds(), queue: o.QueueTime.Seconds(),
		inference: (o.PrefillTime + o.DecodeTime).Seconds(), prefill: o.PrefillTime.Seconds(),
		decode: o.DecodeTime.Seconds(), promptTokens: float64(o.PromptTokens), generated: float64(generated),
		maxTokens: float64(maxTokens), reason: reason}
	if generated > 1 {
		f.tpot = o.DecodeTime.Seconds() / float64(generated-1)
	}
	return f
}

// decodeUntil makes f, the finish of a request with stop strings, end
// at its last counted token (the one that completed a match, or its last),
// whose inter-token latencies after the first are itls: vLLM records the
// finish at the step of the match, so its decode phase, and with it the
// request's inference time, end-to-end latency and time per output token,
// ends there, not where the engine stopped (its abort, or a finish the
// handler had not yet searched).
func (f *finishObs) decodeUntil(itls []time.Duration, counted int) {
	var d time.Duration
	for _, x := range itls {
		d += x
	}
	dec := d.Seconds()
	f.e2e += dec - f.decode
	f.inference += dec - f.decode
	f.decode = dec
	f.tpot = 0
	if counted > 1 {
		f.tpot = dec / float64(counted-1)
	}
}

// addFinish records a finished request's observation f (pending until
// the next flush). The caller holds m.mu.
func (m *metrics) addFinish(f finishObs) {
	if len(m.finishes) == pendMax {
		m.flush()
	}
	m.finishes = append(m.finishes, f)
}

// observeITLs records n inter-token latencies d, as n onOutput calls of
// unfinished outputs (not the first token) with ITL d > 0 would. deliver
// batches a step's equal latencies into one call.
func (m *metrics) observeITLs(d time.Duration, n int) {
	if n > 0 {
		m.itl.observeN(d.Seconds(), n)
	}
}

// observeLatencies records inter-token latencies (those of a request with
// stop strings, stopState.takeITLs). The caller holds m.mu.
func (m *metrics) observeLatencies(itls []time.Duration) {
	for _, d := range itls {
		if d > 0 {
			m.itl.observe(d.Seconds())
		}
	}
}

// stepTokens is a step's tokens as vLLM's iteration_tokens_total counts
// them (IterationStats.update_from_output): those of its outputs
// (outputTokens) and its summarised tokens; and whether it is observed at
// all: a step with no output (a prefill chunk alone) is not.
func stepTokens(res *engine.StepResult) (n int, observed bool) {
	n = res.Summarized // a token each
	for i := range res.Outputs {
		n += outputTokens(&res.Outputs[i])
	}
	return n, n > 0
}

// outputTokens is what one output adds to its step's iteration tokens:
// the token it generated (an abort's has none), plus the whole prompt
// (cached tokens included) when it is the request's first.
func outputTokens(o *engine.Output) int {
	n := 0
	if o.First {
		n += o.PromptTokens
	}
	if !o.Finished || o.FinishReason != engine.FinishAbort {
		n++
	}
	return n
}

// observeStep records a step's n tokens (stepTokens, less its outputs of
// requests with stop strings left out or held): at once, or, with held,
// when its held outputs are decided (decideIter). The caller holds m.mu.
func (m *metrics) observeStep(n int, observed bool, held *iterStep) {
	switch {
	case held != nil:
		held.n += n
	case observed:
		m.iteration.observe(float64(n))
	}
}

// iterStep is a step's vllm:iteration_tokens_total observation waiting
// for the handlers of requests with stop strings to search the tokens of
// its outputs of theirs (held, iterOut): vLLM's front end processes a
// step's outputs in order and forgets a request at the output whose
// tokens complete a stop string, so the step's count depends on whether
// a match came before. It is observed when its last held output is
// decided, with n then (0 if every output was left out: vLLM observes
// such a step). Guarded by metrics.mu.
type iterStep struct {
	n    int // tokens counted: the step's other outputs and those decided counted
	open int // held outputs not decided yet
}

// iterOut is an output of a request with stop strings held in its
// step's observation (stopState.held).
type iterOut struct {
	step   *iterStep
	index  int // tokens the request generated before it (engine.Output.Index)
	tokens int // what it adds to the step when counted (outputTokens)
}

// decideIter decides held outputs of one request: those before its first
// counted tokens count in their step (vLLM processed them; the rest came
// after the match), and a step is observed when its last held output is
// decided. The caller holds m.mu.
func (m *metrics) decideIter(outs []iterOut, counted int) {
	for _, o := range outs {
		if o.index < counted {
			o.step.n += o.tokens
		}
		if o.step.open--; o.step.open == 0 {
			m.iteration.observe(float64(o.step.n))
		}
	}
}

// contentTypeMetrics is what vLLM's (prometheus_client's) /metrics sends.
const contentTypeMetrics = "text/plain; version=0.0.4; charset=utf-8"

// handleMetrics writes the registry in the text format 0.0.4 with the exact
// Content-Type vLLM sends (no content negotiation, like vLLM's default).
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	s.syncStats(r.Context())
	mfs, err := s.metrics.gather()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "gather metrics: "+err.Error())
		return
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			writeError(w, http.StatusInternalServerError, "encode metrics: "+err.Error())
			return
		}
	}
	w.Header().Set("Content-Type", contentTypeMetrics)
	_, _ = w.Write(buf.Bytes())
}
