package signals

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// Flavor names an engine's metrics dialect.
type Flavor string

// Engine flavours. FlavorAuto detects the flavour from the metric names.
const (
	FlavorAuto       Flavor = "auto"
	FlavorVLLM       Flavor = "vllm"        // vLLM >= 0.9.2 names (vllm:kv_cache_usage_perc ...)
	FlavorVLLMLegacy Flavor = "vllm-legacy" // vLLM < 0.12 names (vllm:gpu_cache_usage_perc ...)
	FlavorSGLang     Flavor = "sglang"
	FlavorLlamaCPP   Flavor = "llamacpp"
	FlavorTGI        Flavor = "tgi"
)

// Flavors lists the flavours ParseFlavor accepts, auto first.
var Flavors = []Flavor{FlavorAuto, FlavorVLLM, FlavorVLLMLegacy, FlavorSGLang, FlavorLlamaCPP, FlavorTGI}

// ParseFlavor parses a flavour name; "" is FlavorAuto.
func ParseFlavor(s string) (Flavor, error) {
	f := Flavor(strings.ToLower(strings.TrimSpace(s)))
	if f == "" {
		return FlavorAuto, nil
	}
	if slices.Contains(Flavors, f) {
		return f, nil
	}
	return "", fmt.Errorf("parse flavor: %q is not one of auto, vllm, vllm-legacy, sglang, llamacpp, tgi", s)
}

// Field is a bit set of the Metrics fields an engine reported.
type Field uint32

// Fields of Metrics that may be missing from a scrape.
const (
	HasWaiting Field = 1 << iota
	HasRunning
	HasKVUsage
	HasPrefixCounters // PrefixQueries and PrefixHits
	HasCacheHitRate   // CacheHitRate (an engine-side gauge)
	HasPreemptions
	HasCacheConfig // BlockSize and/or NumGPUBlocks
	HasKVCapacity  // KVCapacityTokens
	HasLoRA
	HasSlots    // TotalSlots and BusySlots (llama.cpp's /slots)
	HasKVTokens // KVTokens (llama.cpp's /slots, n_prompt_tokens)
)

var fieldNamesList = []string{"waiting", "running", "kv_usage", "prefix_counters", "cache_hit_rate", "preemptions",
	"cache_config", "kv_capacity", "lora", "slots", "kv_tokens"}

// String lists the fields in f, e.g. "waiting|running".
func (f Field) String() string {
	var parts []string
	for i, n := range fieldNamesList {
		if f&(1<<i) != 0 {
			parts = append(parts, n)
		}
	}
	return strings.Join(parts, "|")
}

// MarshalText renders f as String does (for JSON status pages).
func (f Field) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// Metrics is one scrape of an engine's /metrics, normalised across
// flavours. Series with several label sets (data-parallel engines, several
// served model names) are summed, except ratios which are averaged.
type Metrics struct {
	// Flavor is the flavour the metrics were read as (never FlavorAuto).
	Flavor Flavor `json:"flavor"`
	// Have says which of the fields below the engine reported.
	Have Field `json:"have"`
	// Waiting and Running are the engine's queued and batched requests.
	Waiting float64 `json:"waiting"`
	Running float64 `json:"running"`
	// KVUsage is the fraction 0..1 of the KV cache in use.
	KVUsage float64 `json:"kv_usage"`
	// PrefixQueries and PrefixHits are cumulative prefix-cache counters in
	// tokens; their rates give the hit rate.
	PrefixQueries float64 `json:"prefix_queries"`
	PrefixHits    float64 `json:"prefix_hits"`
	// CacheHitRate is an engine-computed hit rate gauge (SGLang), 0..1.
	CacheHitRate float64 `json:"cache_hit_rate"`
	// Preemptions is the cumulative count of preempted requests.
	Preemptions float64 `json:"preemptions"`
	// PromptTokens and GenerationTokens are cumulative token counters.
	PromptTokens     float64 `json:"prompt_tokens"`
	GenerationTokens float64 `json:"generation_tokens"`
	// BlockSize and NumGPUBlocks come from vllm:cache_config_info.
	BlockSize    int `json:"block_size"`
	NumGPUBlocks int `json:"num_gpu_blocks"`
	// KVCapacityTokens is the KV cache size in tokens: BlockSize*NumGPUBlocks
	// for vLLM, sglang:max_total_num_tokens for SGLang, the sum of the
	// slots' n_ctx for llama.cpp (/slots; exact without --kv-unified, the
	// slot count times too large with it, where every slot's n_ctx is the
	// whole shared cache); 0 = unknown.
	KVCapacityTokens int `json:"kv_capacity_tokens"`
	// LoRAAdapters are the adapters running or waiting (vllm:lora_requests_info),
	// sorted, without duplicates; MaxLoRA is the engine's max_lora (0 = unknown).
	LoRAAdapters []string `json:"lora_adapters,omitempty"`
	MaxLoRA      int      `json:"max_lora,omitempty"`
	// LoRARunning and LoRAWaiting are LoRAAdapters apart: the adapters of
	// the requests in the engine's batch (running_lora_adapters, at most
	// MaxLoRA of them: vLLM batches at most --max-loras distinct adapters)
	// and of those queued (waiting_lora_adapters), each sorted, without
	// duplicates.
	LoRARunning []string `json:"lora_running,omitempty"`
	LoRAWaiting []string `json:"lora_waiting,omitempty"`
	// TotalSlots and BusySlots are a llama.cpp server's slots (-np, from
	// /props or /slots) and those processing a request (/slots); the
	// scraper reads them besides /metrics (see the package doc).
	TotalSlots int `json:"total_slots,omitempty"`
	BusySlots  int `json:"busy_slots,omitempty"`
	// KVTokens is the tokens whose KV the running requests hold: a
	// llama.cpp server's busy slots' n_prompt_tokens. With it, the View
	// moves KV usage by the router's transitions from KVTokens over the
	// KV capacity (configured, or the slots' n_ctx).
	KVTokens int `json:"kv_tokens,omitempty"`
	// LlamaAdapters are a llama.cpp server's LoRA adapters, read from its
	// GET /lora-adapters besides /metrics (see the package doc); nil when
	// not read (another engine, or no list read yet).
	LlamaAdapters *LlamaAdapters `json:"llama_lora_adapters,omitempty"`
}

// Has reports whether all fields in f were reported.
func (m Metrics) Has(f Field) bool { return m.Have&f == f }

// ErrUnknownFlavor is returned by ParseMetrics when auto-detection finds no
// engine metrics it knows.
var ErrUnknownFlavor = errors.New("no known engine metrics (vllm:, sglang:, llamacpp:, tgi_)")

// MaxFamilies bounds the number of metric families ParseMetrics accepts.
const MaxFamilies = 10000

// ParseMetrics reads an engine's /metrics body with the Prometheus text,
// OpenMetrics or protobuf parser chosen by contentType ("" or an unknown
// type means the text format) and extracts the routing signals of flavour
// (FlavorAuto detects it). Callers should cap the body size.
//
// Text bodies take a fast path that gives expfmt only the families read
// (see parsefilter.go); the result, errors included, is the same as parsing
// every family.
func ParseMetrics(r io.Reader, contentType string, flavor Flavor) (Metrics, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return Metrics{}, fmt.Errorf("parse metrics: %w", err)
	}
	return newMetricsParser().parse(body, contentType, flavor)
}

// parse is ParseMetrics on a body in memory, with p's buffers.
func (p *metricsParser) parse(body []byte, contentType string, flavor Flavor) (Metrics, error) {
	fams, prefixes, err := p.decode(body, contentType)
	if err != nil {
		return Metrics{}, fmt.Errorf("parse metrics: %w", err)
	}
	return extract(fams, prefixes, flavor)
}

// extract reads the signals of flavour from fams; prefixes are the engine
// prefixes of the page's families (for FlavorAuto).
func extract(fams map[string]*dto.MetricFamily, prefixes prefixSet, flavor Flavor) (Metrics, error) {
	if flavor == "" {
		flavor = FlavorAuto
	}
	if flavor == FlavorAuto {
		flavor = detectFlavor(prefixes, fams)
		if flavor == "" {
			return Metrics{}, fmt.Errorf("parse metrics: %w", ErrUnknownFlavor)
		}
	}
	return extractFlavor(fams, flavor)
}

// extractFlavor reads the signals of flavor, a named engine (not
// FlavorAuto), from fams.
func extractFlavor(fams map[string]*dto.MetricFamily, flavor Flavor) (Metrics, error) {
	m := Metrics{Flavor: flavor}
	switch flavor {
	case FlavorVLLM, FlavorVLLMLegacy:
		extractVLLM(fams, &m)
	case FlavorSGLang:
		extractSGLang(fams, &m)
	case FlavorLlamaCPP:
		extractLlamaCPP(fams, &m)
	case FlavorTGI:
		extractTGI(fams, &m)
	default:
		return Metrics{}, fmt.Errorf("parse metrics: unknown flavor %q", flavor)
	}
	if m.Have&(HasWaiting|HasRunning) == 0 {
		return m, fmt.Errorf("parse metrics: no %s queue metrics in body", flavor)
	}
	return m, nil
}

// DetectFlavor names the engine that produced fams, or "" when none is
// recognised. vLLM is FlavorVLLMLegacy when only the pre-0.12 names
// (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*) are present.
func DetectFlavor(fams map[string]*dto.MetricFamily) Flavor {
	return detectFlavor(familyPrefixes(fams), fams)
}

// detectFlavor is DetectFlavor with the name prefixes of the page's
// families given (fams may hold only the families read).
func detectFlavor(prefixes prefixSet, fams map[string]*dto.MetricFamily) Flavor {
	switch {
	case prefixes&prefixVLLM != 0:
		return vllmFlavor(fams)
	case prefixes&prefixSGLang != 0:
		return FlavorSGLang
	case prefixes&prefixLlamaCPP != 0:
		return FlavorLlamaCPP
	case prefixes&prefixTGI != 0:
		return FlavorTGI
	}
	return ""
}

// vllmFlavor tells which vLLM a page of vLLM families comes from:
// FlavorVLLMLegacy when it has only the pre-0.12 names
// (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*), else FlavorVLLM.
func vllmFlavor(fams map[string]*dto.MetricFamily) Flavor {
	_, kv := fams["vllm:kv_cache_usage_perc"]
	_, pq := fams["vllm:prefix_cache_queries_total"]
	_, okv := fams["vllm:gpu_cache_usage_perc"]
	_, opq := fams["vllm:gpu_prefix_cache_queries_total"]
	if !kv && !pq && (okv || opq) {
		return FlavorVLLMLegacy
	}
	return FlavorVLLM
}

func (p *metricsParser) decode(body []byte, contentType string) (map[string]*dto.MetricFamily, prefixSet, error) {
	format := expfmt.FmtUnknown
	if contentType != "" {
		format = expfmt.ResponseFormat(http.Header{"Content-Type": {contentType}})
	}
	switch format.FormatType() {
	case expfmt.TypeProtoDelim:
		fams, err := decodeWith(expfmt.NewDecoder(bytes.NewReader(body), format))
		if err != nil {
			return nil, 0, err
		}
		return fams, familyPrefixes(fams), nil
	case expfmt.TypeOpenMetrics:
		// expfmt's OpenMetrics decoder is a general ABNF parser that takes
		// seconds on a vLLM body, unusable at a 100 ms interval. The text
		// parser reads engines' OpenMetrics output (# EOF is a comment,
		// counters' _total samples become untyped families); exemplars and
		// float timestamps are not supported. Scrapes ask for the text
		// format, so engines rarely send this.
		return p.parseText(body)
	}
	// The text format, and anything unrecognised (engines often send text
	// with a sloppy content type).
	return p.parseText(body)
}

// checkFamilies bounds the number of families of a page.
func checkFamilies(fams map[string]*dto.MetricFamily) error {
	if len(fams) > MaxFamilies {
		return fmt.Errorf("%d metric families, more than %d", len(fams), MaxFamilies)
	}
	return nil
}

func decodeWith(dec expfmt.Decoder) (map[string]*dto.MetricFamily, error) {
	fams := make(map[string]*dto.MetricFamily)
	for {
		mf := new(dto.MetricFamily)
		if err := dec.Decode(mf); err != nil {
			if errors.Is(err, io.EOF) {
				return fams, nil
			}
			return nil, err
		}
		if len(fams) >= MaxFamilies {
			return nil, fmt.Errorf("more than %d metric families", MaxFamilies)
		}
		if old, ok := fams[mf.GetName()]; ok {
			old.Metric = append(old.Metric, mf.Metric...)
		} else {
			fams[mf.GetName()] = mf
		}
	}
}

// value returns a sample's value for gauges, counters and untyped series.
func value(mf *dto.MetricFamily, m *dto.Metric) (float64, bool) {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

// sum adds the finite values of every series of the first family found
// among names. ok is false when none has a usable sample.
func sum(fams map[string]*dto.MetricFamily, names ...string) (total float64, ok bool) {
	for _, name := range names {
		mf := fams[name]
		if mf == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			v, good := value(mf, m)
			if !good || math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			total += v
			ok = true
		}
		if ok {
			return total, true
		}
	}
	return 0, false
}

// mean averages the finite values of the first family found among names.
func mean(fams map[string]*dto.MetricFamily, names ...string) (float64, bool) {
	for _, name := range names {
		mf := fams[name]
		if mf == nil {
			continue
		}
		var total float64
		n := 0
		for _, m := range mf.GetMetric() {
			v, good := value(mf, m)
			if !good || math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			total += v
			n++
		}
		if n > 0 {
			return total / float64(n), true
		}
	}
	return 0, false
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// set stores v into *dst and marks f when ok.
func set(m *Metrics, f Field, dst *float64, v float64, ok bool) {
	if ok {
		*dst = v
		m.Have |= f
	}
}

func clamp01(v float64) float64 {
	return math.Max(0, math.Min(1, v))
}

func extractVLLM(fams map[string]*dto.MetricFamily, m *Metrics) {
	v, ok := sum(fams, "vllm:num_requests_waiting")
	set(m, HasWaiting, &m.Waiting, v, ok)
	v, ok = sum(fams, "vllm:num_requests_running")
	set(m, HasRunning, &m.Running, v, ok)
	v, ok = mean(fams, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
	set(m, HasKVUsage, &m.KVUsage, clamp01(v), ok)
	q, qok := sum(fams, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
		"vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries")
	h, hok := sum(fams, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits",
		"vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits")
	if qok && hok {
		m.PrefixQueries, m.PrefixHits = q, h
		m.Have |= HasPrefixCounters
	}
	v, ok = sum(fams, "vllm:num_preemptions_total", "vllm:num_preemptions")
	set(m, HasPreemptions, &m.Preemptions, v, ok)
	m.PromptTokens, _ = sum(fams, "vllm:prompt_tokens_total", "vllm:prompt_tokens")
	m.GenerationTokens, _ = sum(fams, "vllm:generation_tokens_total", "vllm:generation_tokens")

	if mf := fams["vllm:cache_config_info"]; mf != nil {
		for _, s := range mf.GetMetric() {
			if bs, ok := label(s, "block_size"); ok {
				if n, err := strconv.Atoi(bs); err == nil && n > 0 {
					m.BlockSize = n
					m.Have |= HasCacheConfig
				}
			}
			if nb, ok := label(s, "num_gpu_blocks"); ok {
				// One series per data-parallel engine: the capacities add up.
				if n, err := strconv.Atoi(nb); err == nil && n > 0 {
					m.NumGPUBlocks += n
					m.Have |= HasCacheConfig
				}
			}
		}
		if m.BlockSize > 0 && m.NumGPUBlocks > 0 {
			m.KVCapacityTokens = m.BlockSize * m.NumGPUBlocks
			m.Have |= HasKVCapacity
		}
	}
	if mf := fams["vllm:lora_requests_info"]; mf != nil {
		// The series whose value (a wall-clock timestamp) is newest is the
		// current state; older label sets linger in the registry.
		var best *dto.Metric
		var bestV float64
		for _, s := range mf.GetMetric() {
			v, ok := value(mf, s)
			if ok && (best == nil || v > bestV) {
				best, bestV = s, v
			}
		}
		if best != nil {
			m.LoRARunning = adapterList(best, "running_lora_adapters")
			m.LoRAWaiting = adapterList(best, "waiting_lora_adapters")
			names := append(slices.Clone(m.LoRARunning), m.LoRAWaiting...)
			slices.Sort(names)
			m.LoRAAdapters = slices.Compact(names)
			if ml, ok := label(best, "max_lora"); ok {
				m.MaxLoRA, _ = strconv.Atoi(ml)
			}
			m.Have |= HasLoRA
		}
	}
}

// adapterList returns the adapter names of a vllm:lora_requests_info
// series' label l (comma-joined), sorted, without duplicates; nil for none.
func adapterList(s *dto.Metric, l string) []string {
	lv, _ := label(s, l)
	var names []string
	for _, a := range strings.Split(lv, ",") {
		if a = strings.TrimSpace(a); a != "" {
			names = append(names, a)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func extractSGLang(fams map[string]*dto.MetricFamily, m *Metrics) {
	// The scheduler gauges come once per scheduler (sglangSchedulers):
	// queues and capacities add up over data-parallel schedulers, whose
	// replicas count once.
	//
	// Waiting is every request the server holds that has not started its
	// work there: the waiting queue, and a P/D server's queues before it
	// (--disaggregation-mode; zero on a unified server). A prefill
	// server's bootstrap queue (num_prefill_bootstrap_queue_reqs, before
	// num_prefill_prealloc_queue_reqs) holds requests waiting
	// for their decode server's handshake, not yet prefilled; a decode
	// server's prealloc queue those waiting for KV space, its transfer
	// queue those whose KV is arriving, none decoding yet. A prefill
	// server's inflight queue is not waiting: its requests are prefilled
	// and only hold their KV (in token_usage) until the decode server has
	// read it, which takes no compute of the prefill server; counted, a
	// prefill server with slow transfers would look queued to the router
	// and lose new prefills it would run at once.
	var waiting float64
	hasWaiting := false
	for _, names := range [][]string{{"sglang:num_queue_reqs"},
		{"sglang:num_prefill_bootstrap_queue_reqs", "sglang:num_prefill_prealloc_queue_reqs"},
		{"sglang:num_decode_prealloc_queue_reqs"}, {"sglang:num_decode_transfer_queue_reqs"}} {
		q := sglangSchedulers(fams, names...)
		waiting += q.sum()
		hasWaiting = hasWaiting || len(q) > 0
	}
	set(m, HasWaiting, &m.Waiting, waiting, hasWaiting)
	running := sglangSchedulers(fams, "sglang:num_running_reqs")
	set(m, HasRunning, &m.Running, running.sum(), len(running) > 0)
	capacity := sglangSchedulers(fams, "sglang:max_total_num_tokens")
	usage := sglangSchedulers(fams, "sglang:token_usage")
	set(m, HasKVUsage, &m.KVUsage, clamp01(usage.weightedMean(capacity)), len(usage) > 0)
	hit := sglangSchedulers(fams, "sglang:cache_hit_rate")
	set(m, HasCacheHitRate, &m.CacheHitRate, clamp01(hit.weightedMean(nil)), len(hit) > 0)
	// Cached tokens (all sources) over prompt tokens give the token hit
	// rate. The tokenizer counts them, once for the server.
	h, hok := sum(fams, "sglang:cached_tokens_total", "sglang:cached_tokens")
	q, qok := sum(fams, "sglang:prompt_tokens_total", "sglang:prompt_tokens")
	if hok && qok {
		m.PrefixQueries, m.PrefixHits = q, h
		m.Have |= HasPrefixCounters
	}
	m.PromptTokens = q
	m.GenerationTokens, _ = sum(fams, "sglang:generation_tokens_total", "sglang:generation_tokens")
	// SGLang's counter of retracted requests (preempted for KV space) is
	// sglang:num_retracted_requests_total; some versions had a cumulative
	// gauge sglang:total_retracted_reqs instead. (sglang:num_retracted_reqs
	// counts the retractions since its last stats line, not a total.)
	retracted := sglangSchedulers(fams, "sglang:num_retracted_requests_total", "sglang:num_retracted_reqs_total",
		"sglang:total_retracted_reqs")
	set(m, HasPreemptions, &m.Preemptions, retracted.sum(), len(retracted) > 0)
	if v := capacity.sum(); v > 0 && v < math.MaxInt32 {
		m.KVCapacityTokens = int(v)
		m.Have |= HasKVCapacity
	}
}

// sglangReplicaLabels name the ranks of the workers that share one SGLang
// scheduler's batch: the tensor- (and expert-) parallel ranks of a
// data-parallel group (with DP attention, of an attention group), and its
// pipeline stages. Each publishes the group's own numbers, labelled with
// its ranks: the stages by default, the tensor-parallel ranks with
// --enable-metrics-for-all-schedulers. A data-parallel group (dp_rank)
// has requests and a KV pool of its own.
var sglangReplicaLabels = []string{"tp_rank", "pp_rank", "moe_ep_rank"}

// schedValues are one value per scheduler, keyed by its labels.
type schedValues map[string]float64

func (v schedValues) sum() float64 {
	var t float64
	for _, x := range v {
		t += x
	}
	return t
}

// weightedMean averages v's values weighted by w's for the same
// schedulers, or plainly when w lacks one of them or has no weight.
func (v schedValues) weightedMean(w schedValues) float64 {
	if len(v) == 0 {
		return 0
	}
	var t, tw float64
	for k, x := range v {
		wk, ok := w[k]
		if !ok || wk <= 0 {
			return v.sum() / float64(len(v))
		}
		t += x * wk
		tw += wk
	}
	return t / tw
}

// sglangPriorityLabel labels the per-priority breakdown SGLang writes of
// a scheduler's queue gauges with --enable-priority-scheduling
// (_log_gauge_queue_count): the total under priority="", each priority's
// share under priority="<n>" ("None" for requests without one).
const sglangPriorityLabel = "priority"

// sglangSchedulers returns the finite values of the first family found
// among names, one per scheduler: series whose labels differ only in
// sglangReplicaLabels are copies of one scheduler's numbers (the largest
// is taken: copies sampled at different steps err towards load), and any
// other label (dp_rank, model_name, engine_type, extra labels) tells
// schedulers apart. A series with a non-empty priority label is part of
// its scheduler's total (priority="", always written with it) and is
// skipped. Empty when there is none.
func sglangSchedulers(fams map[string]*dto.MetricFamily, names ...string) schedValues {
	var out schedValues
	for _, name := range names {
		mf := fams[name]
		if mf == nil {
			continue
		}
		for _, s := range mf.GetMetric() {
			if p, ok := label(s, sglangPriorityLabel); ok && p != "" {
				continue
			}
			v, good := value(mf, s)
			if !good || math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			if out == nil {
				out = make(schedValues, 1)
			}
			var k string // a lone series needs no key (the usual page)
			if len(mf.GetMetric()) > 1 {
				k = schedulerKey(s)
			}
			if old, ok := out[k]; !ok || v > old {
				out[k] = v
			}
		}
		if out != nil {
			return out
		}
	}
	return nil
}

// schedulerKey is a series' labels but sglangReplicaLabels, sorted by name.
func schedulerKey(s *dto.Metric) string {
	var pairs []string
	for _, lp := range s.GetLabel() {
		if !slices.Contains(sglangReplicaLabels, lp.GetName()) {
			pairs = append(pairs, lp.GetName()+"\xff"+lp.GetValue())
		}
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "\xfe")
}

func extractLlamaCPP(fams map[string]*dto.MetricFamily, m *Metrics) {
	v, ok := sum(fams, "llamacpp:requests_deferred")
	set(m, HasWaiting, &m.Waiting, v, ok)
	v, ok = sum(fams, "llamacpp:requests_processing")
	set(m, HasRunning, &m.Running, v, ok)
	// Removed in 2025 (PR #13660); read it when an older server has it.
	v, ok = mean(fams, "llamacpp:kv_cache_usage_ratio")
	set(m, HasKVUsage, &m.KVUsage, clamp01(v), ok)
	q, qok := sum(fams, "llamacpp:prompt_tokens_total")
	h, hok := sum(fams, "llamacpp:prompt_tokens_cached_total")
	m.PromptTokens = q
	if qok && hok {
		// llama.cpp counts evaluated prompt tokens; queried = evaluated + cached.
		m.PrefixQueries, m.PrefixHits = q+h, h
		m.Have |= HasPrefixCounters
	}
	m.GenerationTokens, _ = sum(fams, "llamacpp:tokens_predicted_total")
}

func extractTGI(fams map[string]*dto.MetricFamily, m *Metrics) {
	v, ok := sum(fams, "tgi_queue_size")
	set(m, HasWaiting, &m.Waiting, v, ok)
	v, ok = sum(fams, "tgi_batch_current_size")
	set(m, HasRunning, &m.Running, v, ok)
}

// EngineLabel is the label vLLM puts on each data-parallel engine core's
// series: its rank, "0" to "N-1" (and "0" on a single engine).
const EngineLabel = "engine"

// ParseMetricsRanks reads the /metrics body of a data-parallel vLLM server
// (ranks data-parallel engine cores behind one URL, the first of them rank
// first: 0, or vLLM's --data-parallel-start-rank) as ParseMetrics does, but
// gives each of them the signals of its own series: out[i] those labelled
// engine="<first+i>" (series without an engine label, such as
// vllm:lora_requests_info, count for every rank; series of other ranks are
// ignored). The metrics must be vLLM's (flavor auto, vllm or vllm-legacy):
// other engines have no engine label. The error joins every rank's: a rank
// without queue metrics has a zero Metrics (Have 0) and an error naming its
// engine label.
func ParseMetricsRanks(r io.Reader, contentType string, flavor Flavor, first, ranks int) ([]Metrics, error) {
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	out := make([]Metrics, ranks)
	errs := make([]error, ranks)
	newMetricsParser().parseRanks(body, contentType, flavor, first, out, errs, nil)
	return out, errors.Join(errs...)
}

// parseRanks is ParseMetricsRanks on a body in memory, with p's buffers:
// rank first+i's signals go to out[i] and its error to errs[i] (nil when
// fine). seen, when not nil, records the page's engine labels once it reads
// as vLLM metrics (see engineLabels).
func (p *metricsParser) parseRanks(body []byte, contentType string, flavor Flavor, first int, out []Metrics, errs []error, seen *engineLabels) {
	fail := func(err error) {
		for r := range out {
			out[r], errs[r] = Metrics{}, err
		}
	}
	fams, prefixes, err := p.decode(body, contentType)
	if err != nil {
		fail(fmt.Errorf("parse metrics: %w", err))
		return
	}
	if flavor == "" || flavor == FlavorAuto {
		if flavor = detectFlavor(prefixes, fams); flavor == "" {
			fail(fmt.Errorf("parse metrics: %w", ErrUnknownFlavor))
			return
		}
	}
	if flavor != FlavorVLLM && flavor != FlavorVLLMLegacy {
		fail(fmt.Errorf("parse metrics: data-parallel ranks need vLLM metrics (an engine label per rank), not %s", flavor))
		return
	}
	if seen != nil {
		seen.read = true
	}
	// Each family's series by rank; -1 collects those without an engine
	// label.
	byRank := make([]map[string]*dto.MetricFamily, len(out))
	for r := range byRank {
		byRank[r] = make(map[string]*dto.MetricFamily, len(fams))
	}
	for name, mf := range fams {
		for _, s := range mf.GetMetric() {
			v, ok := label(s, EngineLabel)
			var ranks []map[string]*dto.MetricFamily
			if !ok {
				ranks = byRank // engine-wide: every rank's
			} else if r, err := strconv.Atoi(v); err == nil && r-first >= 0 && r-first < len(byRank) && strconv.Itoa(r) == v {
				ranks = byRank[r-first : r-first+1]
				seen.note(v, r-first)
			} else {
				seen.note(v, -1)
			}
			for _, fm := range ranks {
				f := fm[name]
				if f == nil {
					f = &dto.MetricFamily{Name: mf.Name, Help: mf.Help, Type: mf.Type, Unit: mf.Unit}
					fm[name] = f
				}
				f.Metric = append(f.Metric, s)
			}
		}
	}
	for r := range out {
		m, err := extract(byRank[r], prefixes, flavor)
		if err != nil {
			m, err = Metrics{}, fmt.Errorf("parse metrics: no %s queue metrics with %s=%q", flavor, EngineLabel, strconv.Itoa(first+r))
		}
		out[r], errs[r] = m, err
	}
}
