package disagg

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
)

// KVShape is a model's KV-cache footprint per token, the input of the
// transfer cost model, with the tensor-parallel degree of the decode
// engine that pulls it.
//
//	GQA/MHA: per rank = Layers x max(1, KVHeads/TP) x HeadDim x 2 (K and V) x BytesPerElem
//	MLA:     per rank = Layers x LatentDim x BytesPerElem   (one latent, no x2)
//	wire:    bytes/token = TP x per rank
//
// A handoff moves what vLLM's NixlConnector reads: each decode rank reads
// its own KV of every block from the prefill rank(s) holding it (the
// whole block with equal TP; its heads' part of a wider one when the
// prefill TP is smaller, or its parts of several narrower ones when it is
// larger), in parallel over its own link, which Link bandwidths account
// for (a node's aggregate bandwidth). Where TP splits the KV heads the
// ranks' shares add up to the model's KV (TP x KVHeads/TP heads). Where
// they are replicated, the wire carries every copy: TP above KVHeads puts
// one whole head on each rank, TP/KVHeads copies of each (Llama-3.1-70B's
// 8 KV heads at TP16: 2 copies, twice its 327,680 B a token), and the MLA
// latent, which vLLM cannot split, is whole on every rank (TP copies).
// This is engine.Profile's KVBytesPerTokenPerGPU per rank, times TP.
type KVShape struct {
	Layers       int
	KVHeads      int
	HeadDim      int
	BytesPerElem int
	// LatentDim is kv_lora_rank + qk_rope_head_dim for MLA models (0 for
	// GQA/MHA). When set, KVHeads and HeadDim are ignored.
	LatentDim int
	// TP is the decode engine's tensor-parallel degree: its ranks each
	// read their share of the KV (see above). 0 means 1 (the model's KV,
	// each head once).
	TP int
}

// ShapeOf returns the KV shape of an engine profile's model, at its TP.
func ShapeOf(p engine.Profile) KVShape {
	m := p.Model
	b := m.KVDTypeBytes
	if b <= 0 {
		b = m.DTypeBytes
	}
	s := KVShape{Layers: m.Layers, KVHeads: m.KVHeads, HeadDim: m.HeadDim, BytesPerElem: b, TP: p.TP}
	if m.KVLoRARank > 0 {
		s.LatentDim = m.KVLoRARank + m.QKRopeDim
	}
	return s
}

// Layout returns s without its TP: the model's KV layout alone, which a
// prefill and a decode engine must share whatever their TP.
func (s KVShape) Layout() KVShape {
	s.TP = 0
	return s
}

// ShapeFromHFConfig returns the KV shape of a HuggingFace config.json
// (Llama, Qwen2, Mistral-style GQA or DeepSeek-style MLA) with the KV dtype
// ("bfloat16", "fp8", ...; "" takes the config's torch_dtype). Its TP is 0
// (one rank); set it to the decode engines' (Config fills it from its
// Profile).
func ShapeFromHFConfig(configJSON []byte, dtype string) (KVShape, error) {
	// The shape does not depend on the deployment; grow the tensor-parallel
	// degree until the weights fit, so that big models parse too.
	var err error
	for tp := 1; tp <= 256; tp *= 2 {
		var p engine.Profile
		if p, err = engine.ProfileFromHFConfig(configJSON, "h200", tp, dtype); err == nil {
			return ShapeOf(p).Layout(), nil
		}
		if !strings.Contains(err.Error(), "leaves no KV memory") {
			break
		}
	}
	return KVShape{}, fmt.Errorf("disagg: kv shape: %w", err)
}

// BytesPerToken returns the KV bytes one token moves over the wire: TP x
// the bytes one rank holds (see KVShape), as the engine model counts them
// (engine.Profile.KVTransferBytesPerToken, of the shape's model and TP).
func (s KVShape) BytesPerToken() int64 {
	m := engine.Model{Layers: s.Layers, KVHeads: s.KVHeads, HeadDim: s.HeadDim, DTypeBytes: s.BytesPerElem}
	if s.LatentDim > 0 {
		m.KVLoRARank = s.LatentDim // the latent and its RoPE part: only their sum counts
	}
	return engine.Profile{Model: m, TP: s.TP}.KVTransferBytesPerToken()
}

// ModelBytesPerToken returns the model's KV bytes of one token, each head
// (or the MLA latent) once: BytesPerToken at TP 1.
func (s KVShape) ModelBytesPerToken() int64 {
	s.TP = 1
	return s.BytesPerToken()
}

// PulledTokens returns how many of a prompt's tokens a decode engine pulls
// from the prefill engine when it already holds cached of them (its
// prefix-cache hit, in tokens), as vLLM's NixlConnector does: the decode
// engine's scheduler first matches its own prefix cache
// (KVCacheManager.get_computed_blocks: whole blocks, at most prompt-1
// tokens, since the last token is computed again for its logits), then
// asks the connector for the rest (get_num_new_matched_tokens: prompt
// minus that local hit), and the worker reads only those blocks, the
// prefill engine's last ones (_read_blocks). So a prompt the decode
// engine holds whole still pulls its last block, and one it holds none of
// pulls every token. blockSize is the engine's block size (<= 0: hits are
// not rounded to blocks). A partial last block counts as its tokens.
func PulledTokens(prompt, cached, blockSize int) int {
	if prompt <= 0 {
		return 0
	}
	hit := min(max(cached, 0), prompt-1)
	if blockSize > 0 {
		hit = hit / blockSize * blockSize
	}
	return prompt - hit
}

// Bytes returns the KV bytes of tokens tokens.
func (s KVShape) Bytes(tokens int) int64 {
	if tokens <= 0 {
		return 0
	}
	return int64(tokens) * s.BytesPerToken()
}

// Validate reports a shape that cannot size a transfer.
func (s KVShape) Validate() error {
	if s.Layers <= 0 || s.BytesPerElem <= 0 || s.TP < 0 || (s.LatentDim <= 0 && (s.KVHeads <= 0 || s.HeadDim <= 0)) {
		return fmt.Errorf("disagg: kv shape: layers, bytes per element and kv heads x head dim (or the MLA latent) must be > 0 (and tp >= 0), got %+v", s)
	}
	return nil
}

// Link is one class of fabric link between a prefill and a decode node.
type Link struct {
	// Name labels the link in metrics and decisions (nvlink, rdma, tcp).
	Name string `json:"name" yaml:"name"`
	// Gbps is the line rate in gigabits per second. Required (> 0).
	Gbps float64 `json:"gbps" yaml:"gbps"`
	// Efficiency is the fraction of the line rate a KV transfer reaches;
	// default 1 (line rate, as papers.md 4.6's table).
	Efficiency float64 `json:"efficiency,omitempty" yaml:"efficiency"`
	// Setup is the fixed cost of one transfer (handshake, descriptor
	// exchange, first-byte latency); default 0.
	Setup time.Duration `json:"setup,omitempty" yaml:"setup"`
}

// BytesPerSecond is the link's effective bandwidth.
func (l Link) BytesPerSecond() float64 {
	eff := l.Efficiency
	if eff <= 0 {
		eff = 1
	}
	return l.Gbps * 1e9 / 8 * eff
}

// Duration returns how long bytes take on an idle link: Setup +
// bytes / effective bandwidth.
func (l Link) Duration(bytes int64) time.Duration {
	if bytes <= 0 {
		return 0
	}
	w := l.wire(float64(bytes))
	if l.Setup > 0 && w > time.Duration(math.MaxInt64)-l.Setup {
		return time.Duration(math.MaxInt64)
	}
	return l.Setup + w
}

// wire is the time bytes occupy the link, without setup.
func (l Link) wire(bytes float64) time.Duration {
	bps := l.BytesPerSecond()
	if bps <= 0 || bytes <= 0 {
		return 0
	}
	ns := math.Ceil(bytes / bps * float64(time.Second))
	if ns >= math.MaxInt64 {
		return time.Duration(math.MaxInt64) // saturate: a conversion past it wraps negative
	}
	return time.Duration(ns)
}

// LinkRule assigns a link to endpoint pairs that share labels.
type LinkRule struct {
	// Same lists labels that must be present on both endpoints with equal
	// values (e.g. ["node"] for NVLink within one node). Required.
	Same []string `json:"same" yaml:"same"`
	Link Link     `json:"link" yaml:"link"`
}

// Links maps an endpoint pair to the link between them: the first rule
// whose labels match, else Default.
type Links struct {
	Rules   []LinkRule `json:"rules" yaml:"rules"`
	Default Link       `json:"default" yaml:"default"`
}

// Default link speeds (papers.md 4.1 and 4.6).
const (
	NVLinkGbps = 3600 // NVLink4: 450 GB/s per direction
	RDMAGbps   = 400  // 400G InfiniBand/RoCE: 50 GB/s
	TCPGbps    = 100  // 100G Ethernet: 12.5 GB/s
)

// DefaultLinks returns the default fabric: same "node" label -> NVLink
// (450 GB/s, 0.1 ms setup), same "rack" or same "zone" label -> RDMA
// (400 Gb/s, 1 ms setup), anything else -> TCP (100 Gb/s, 2 ms setup).
// Data-parallel ranks of one URL without a "node" label share one (see
// NodeOf).
func DefaultLinks() Links {
	nv := Link{Name: "nvlink", Gbps: NVLinkGbps, Setup: 100 * time.Microsecond}
	rdma := Link{Name: "rdma", Gbps: RDMAGbps, Setup: time.Millisecond}
	return Links{
		Rules: []LinkRule{
			{Same: []string{"node"}, Link: nv},
			{Same: []string{"rack"}, Link: rdma},
			{Same: []string{"zone"}, Link: rdma},
		},
		Default: Link{Name: "tcp", Gbps: TCPGbps, Setup: 2 * time.Millisecond},
	}
}

// UniformLinks returns a fabric where every pair of distinct nodes is
// joined by l (the simulator's and benchmarks' "one fabric" setting).
func UniformLinks(l Link) Links { return Links{Default: l} }

// Validate reports the first unusable rule or link.
func (ls Links) Validate() error {
	check := func(where string, l Link) error {
		if l.Gbps <= 0 || math.IsNaN(l.Gbps) || math.IsInf(l.Gbps, 0) {
			return fmt.Errorf("disagg: links: %s: gbps must be > 0, got %v", where, l.Gbps)
		}
		if !(l.Efficiency >= 0 && l.Efficiency <= 1) { // NaN too
			return fmt.Errorf("disagg: links: %s: efficiency must be in [0, 1], got %v", where, l.Efficiency)
		}
		if l.Setup < 0 {
			return fmt.Errorf("disagg: links: %s: setup must be >= 0, got %v", where, l.Setup)
		}
		return nil
	}
	for i, r := range ls.Rules {
		if len(r.Same) == 0 {
			return fmt.Errorf("disagg: links: rules[%d]: same must list at least one label", i)
		}
		if err := check(fmt.Sprintf("rules[%d]", i), r.Link); err != nil {
			return err
		}
	}
	return check("default", ls.Default)
}

// Between returns the link from a to b.
func (ls Links) Between(a, b *kvroute.Endpoint) Link {
	for _, r := range ls.Rules {
		if sameLabels(a, b, r.Same) {
			l := r.Link
			if l.Name == "" {
				l.Name = strings.Join(r.Same, "+")
			}
			return l
		}
	}
	l := ls.Default
	if l.Name == "" {
		l.Name = "default"
	}
	return l
}

func sameLabels(a, b *kvroute.Endpoint, keys []string) bool {
	for _, k := range keys {
		va, vb := label(a, k), label(b, k)
		if va == "" || vb != va {
			return false
		}
	}
	return true
}

// label is e's label k; a data-parallel rank without a "node" label has
// its server's URL for it (the ranks behind one URL share a machine).
func label(e *kvroute.Endpoint, k string) string {
	if v := e.Labels[k]; v != "" || k != "node" || !e.IsDataParallel() {
		return v
	}
	return "url:" + e.URL
}

// NodeOf returns the fabric node an endpoint sits on: its "node" label,
// else, for a data-parallel rank, its server (every rank behind one URL:
// the ranks of one vLLM or SGLang server are on one machine), else its ID
// (one node per endpoint).
func NodeOf(e *kvroute.Endpoint) string {
	if n := label(e, "node"); n != "" {
		return n
	}
	return e.ID
}
