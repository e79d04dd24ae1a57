package engine

import (
	"fmt"
	"sort"
	"strings"
)

// Model is a transformer's shape, enough to derive weight bytes, FLOPs per
// token and KV bytes per token.
type Model struct {
	// Name is the model's name, e.g. "meta-llama/Llama-3.1-8B-Instruct".
	Name           string
	Layers         int
	Hidden         int
	Heads          int // attention (query) heads
	KVHeads        int // key/value heads (GQA); = Heads for MHA
	HeadDim        int
	Intermediate   int // MLP intermediate size (dense layers)
	Vocab          int
	TiedEmbeddings bool
	// MLA (DeepSeek-style latent attention): when KVLoRARank > 0 the KV
	// cache holds KVLoRARank + QKRopeDim elements per layer per token (no x2
	// for K and V), replicated on every tensor-parallel rank.
	KVLoRARank int
	QKRopeDim  int
	// MoE: when Experts > 0, layers after the first DenseLayers replace the
	// dense MLP with Experts routed experts of MoEIntermediate (ExpertsPerTok
	// active per token) plus SharedExperts always-active experts.
	Experts         int
	ExpertsPerTok   int
	SharedExperts   int
	MoEIntermediate int
	DenseLayers     int
	// DTypeBytes is the bytes per weight (2 for BF16).
	DTypeBytes int
	// KVDTypeBytes is the bytes per KV-cache element; 0 means DTypeBytes.
	KVDTypeBytes int
	// Params is the total parameter count; 0 means derive it from the shape.
	Params int64
	// EOSTokenID is the end-of-sequence token id.
	EOSTokenID uint32
}

// Hardware is one GPU's roofline constants.
type Hardware struct {
	Name string
	// PeakFLOPs is the dense BF16 peak in FLOP/s.
	PeakFLOPs float64
	// HBMBandwidth is in bytes/s; HBMBytes the device memory.
	HBMBandwidth float64
	HBMBytes     int64
	// NVLinkBandwidth is the per-direction GPU-GPU bandwidth in bytes/s used
	// for tensor-parallel all-reduces.
	NVLinkBandwidth float64
}

// Known GPUs (papers.md section 4.1).
var gpus = map[string]Hardware{
	"h100": {Name: "h100", PeakFLOPs: 989.4e12, HBMBandwidth: 3.35e12, HBMBytes: 80e9, NVLinkBandwidth: 450e9},
	"h200": {Name: "h200", PeakFLOPs: 989.4e12, HBMBandwidth: 4.8e12, HBMBytes: 141e9, NVLinkBandwidth: 450e9},
	"a100": {Name: "a100", PeakFLOPs: 312e12, HBMBandwidth: 2.039e12, HBMBytes: 80e9, NVLinkBandwidth: 300e9},
	"l40s": {Name: "l40s", PeakFLOPs: 362e12, HBMBandwidth: 0.864e12, HBMBytes: 48e9, NVLinkBandwidth: 32e9},
	// A toy device for fast tests: a few-MB model steps in about a millisecond.
	"tiny": {Name: "tiny", PeakFLOPs: 2e11, HBMBandwidth: 4e9, HBMBytes: 1 << 30, NVLinkBandwidth: 1e9},
}

// Efficiency holds the achieved fractions of peak and the fixed overheads of
// the step-time model (papers.md section 4.8).
type Efficiency struct {
	// MFUPrefill is the fraction of PeakFLOPs reached by large GEMMs (many
	// tokens in the step) and by prefill attention.
	MFUPrefill float64
	// MFUDecode is the fraction of PeakFLOPs reached by GEMMs over few
	// tokens (small decode batches).
	MFUDecode float64
	// GEMMHalfTokens is the step size (tokens) at which GEMM efficiency is
	// halfway from MFUDecode to MFUPrefill: mfu(T) = MFUDecode +
	// (MFUPrefill - MFUDecode) x T / (T + GEMMHalfTokens). 0 means
	// MFUPrefill at every size.
	GEMMHalfTokens int
	// MemEfficiency is the fraction of HBMBandwidth reached by weight and KV
	// reads.
	MemEfficiency float64
	// StepOverhead is a fixed cost per step (scheduling, launch, sampling).
	StepOverheadSeconds float64
	// SeqOverhead is a cost per scheduled sequence per step (input prep,
	// sampling, detokenisation).
	SeqOverheadSeconds float64
	// AllReduceLatencySeconds is the fixed latency of one tensor-parallel
	// all-reduce (two per layer per step when TP > 1).
	AllReduceLatencySeconds float64
}

// Profile is a deployment: a model on TP GPUs of one kind with vLLM's
// scheduler limits. The zero value is not usable; start from LookupProfile or
// ProfileFromHFConfig.
type Profile struct {
	Name     string
	Model    Model
	Hardware Hardware
	Eff      Efficiency
	// TP is the tensor-parallel degree (GPUs per engine).
	TP int
	// GPUMemoryUtilization is vLLM's --gpu-memory-utilization (0.9).
	GPUMemoryUtilization float64
	// BlockSize is tokens per KV block (16).
	BlockSize int
	// NumGPUBlocks is the KV cache size in blocks, vLLM's num_gpu_blocks
	// (what vllm:cache_config_info reports). LookupProfile derives it from
	// memory; set it to override. As in vLLM's BlockPool, block 0 is the
	// null block, never allocated: UsableBlocks hold KV.
	NumGPUBlocks int
	// MaxNumSeqs is vLLM's max_num_seqs (sequences per step).
	MaxNumSeqs int
	// MaxNumBatchedTokens is vLLM's max_num_batched_tokens (token budget per
	// step).
	MaxNumBatchedTokens int
	// MaxModelLen is the context limit (prompt + output tokens).
	MaxModelLen int
}

// ParamCount returns the total parameter count (Model.Params when set).
func (m Model) ParamCount() int64 {
	if m.Params > 0 {
		return m.Params
	}
	return m.denseParams() + m.expertParams()
}

func (m Model) embedParams() int64 {
	e := int64(m.Vocab) * int64(m.Hidden)
	if m.TiedEmbeddings {
		return e
	}
	return 2 * e
}

func (m Model) attnParams() int64 {
	h := int64(m.Hidden)
	if m.KVLoRARank > 0 {
		// MLA: q (full rank approx), kv down-projection, kv up-projection, o.
		qk := int64(m.HeadDim + m.QKRopeDim)
		return h*int64(m.Heads)*qk + h*int64(m.KVLoRARank+m.QKRopeDim) +
			int64(m.KVLoRARank)*int64(m.Heads)*int64(m.HeadDim)*2 + int64(m.Heads)*int64(m.HeadDim)*h
	}
	q := int64(m.Heads) * int64(m.HeadDim)
	kv := int64(m.KVHeads) * int64(m.HeadDim)
	return h*q + 2*h*kv + q*h
}

// denseParams is everything but the routed experts.
func (m Model) denseParams() int64 {
	h := int64(m.Hidden)
	perLayer := m.attnParams() + 2*h
	total := m.embedParams() + int64(m.Layers)*perLayer
	if m.Experts == 0 {
		return total + int64(m.Layers)*3*h*int64(m.Intermediate)
	}
	dense := int64(m.DenseLayers)
	moe := int64(m.Layers) - dense
	total += dense * 3 * h * int64(m.Intermediate)
	total += moe * (int64(m.SharedExperts)*3*h*int64(m.MoEIntermediate) + h*int64(m.Experts)) // shared + router
	return total
}

func (m Model) expertParams() int64 {
	if m.Experts == 0 {
		return 0
	}
	moe := int64(m.Layers - m.DenseLayers)
	return moe * int64(m.Experts) * 3 * int64(m.Hidden) * int64(m.MoEIntermediate)
}

// activeLayerParams is the parameters a token multiplies through in the
// transformer layers (no embeddings, no LM head).
func (m Model) activeLayerParams() float64 {
	p := m.denseParams() - m.embedParams()
	if m.Experts > 0 {
		moe := int64(m.Layers - m.DenseLayers)
		p += moe * int64(m.ExpertsPerTok) * 3 * int64(m.Hidden) * int64(m.MoEIntermediate)
	}
	return float64(p)
}

// kvElemsPerTokenLayer is KV elements per token per layer over all ranks.
func (m Model) kvElemsPerTokenLayer() int64 {
	if m.KVLoRARank > 0 {
		return int64(m.KVLoRARank + m.QKRopeDim)
	}
	return 2 * int64(m.KVHeads) * int64(m.HeadDim)
}

// KVBytesPerToken returns the KV-cache bytes one token occupies in the whole
// model: 2 x layers x KV heads x head dim x dtype bytes, or for MLA
// layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes.
func (p Profile) KVBytesPerToken() int64 {
	return int64(p.Model.Layers) * p.Model.kvElemsPerTokenLayer() * int64(p.Model.kvBytes())
}

func (m Model) kvBytes() int {
	if m.KVDTypeBytes > 0 {
		return m.KVDTypeBytes
	}
	return m.DTypeBytes
}

// KVBytesPerTokenPerGPU is what one tensor-parallel rank stores per token:
// KV heads are split across ranks (replicated when there are fewer heads
// than ranks); the MLA latent is replicated on every rank.
func (p Profile) KVBytesPerTokenPerGPU() int64 {
	m := p.Model
	if m.KVLoRARank > 0 || p.TP <= 1 {
		return p.KVBytesPerToken()
	}
	heads := m.KVHeads / p.TP
	if heads < 1 {
		heads = 1
	}
	return int64(m.Layers) * 2 * int64(heads) * int64(m.HeadDim) * int64(m.kvBytes())
}

// KVTransferBytesPerToken is what a P/D handoff moves per token to a
// decode engine of this profile: each of its TP ranks reads its own share
// of every block (vLLM's NixlConnector), so KV heads that TP replicates
// (more ranks than KV heads) and the MLA latent (whole on every rank)
// cross once per copy: TP x KVBytesPerTokenPerGPU. It is
// disagg.KVShape.BytesPerToken, which computes it here for a shape.
func (p Profile) KVTransferBytesPerToken() int64 {
	return int64(max(p.TP, 1)) * p.KVBytesPerTokenPerGPU()
}

// WeightBytesPerGPU is one rank's share of the weights.
func (p Profile) WeightBytesPerGPU() int64 {
	return p.Model.ParamCount() * int64(p.Model.DTypeBytes) / int64(max(p.TP, 1))
}

// activationReserve estimates what vLLM's profiling run leaves out of the KV
// budget per GPU: the peak activations of a max_num_batched_tokens forward,
// the sampler's logits for max_num_seqs sequences, and ~1 GiB of non-torch
// memory (CUDA context, graphs, NCCL buffers).
func (p Profile) activationReserve() int64 {
	m := p.Model
	inter := m.Intermediate
	if m.Experts > 0 && m.MoEIntermediate*m.ExpertsPerTok > inter {
		inter = m.MoEIntermediate * m.ExpertsPerTok
	}
	tp := int64(max(p.TP, 1))
	act := int64(p.MaxNumBatchedTokens) * int64(4*m.Hidden+2*inter/int(tp)) * int64(m.DTypeBytes)
	logits := int64(p.MaxNumSeqs) * int64(m.Vocab) * 4 / tp
	return act + logits + 1<<30
}

// DeriveNumGPUBlocks returns the KV capacity in blocks as vLLM computes it:
// (HBM x gpu_memory_utilization - weights - activations) per GPU divided by
// the per-GPU bytes of one block. It returns 0 when nothing is left.
func (p Profile) DeriveNumGPUBlocks() int {
	free := float64(p.Hardware.HBMBytes)*p.GPUMemoryUtilization - float64(p.WeightBytesPerGPU()) - float64(p.activationReserve())
	per := float64(p.KVBytesPerTokenPerGPU()) * float64(p.BlockSize)
	if free <= 0 || per <= 0 {
		return 0
	}
	return int(free / per)
}

// KVCapacityTokens is NumGPUBlocks x BlockSize, the capacity vLLM
// advertises (num_gpu_blocks in vllm:cache_config_info, the null block
// included); UsableBlocks x BlockSize is what requests can hold.
func (p Profile) KVCapacityTokens() int { return p.NumGPUBlocks * p.BlockSize }

// UsableBlocks is NumGPUBlocks less vLLM's null block (block 0, which its
// BlockPool takes at start and never frees): the blocks requests can
// hold, and the denominator of vllm:kv_cache_usage_perc
// (BlockPool.get_usage: 1 - free / (num_gpu_blocks - 1)).
func (p Profile) UsableBlocks() int { return max(p.NumGPUBlocks-1, 0) }

// Validate reports the first unusable field.
func (p Profile) Validate() error {
	m := p.Model
	switch {
	case m.Layers <= 0 || m.Hidden <= 0 || m.Heads <= 0 || m.HeadDim <= 0 || m.Vocab <= 0:
		return fmt.Errorf("profile %q: model shape needs layers, hidden, heads, head dim and vocab > 0", p.Name)
	case m.KVLoRARank == 0 && m.KVHeads <= 0:
		return fmt.Errorf("profile %q: model KVHeads must be > 0", p.Name)
	case m.DTypeBytes <= 0:
		return fmt.Errorf("profile %q: model DTypeBytes must be > 0", p.Name)
	case p.Hardware.PeakFLOPs <= 0 || p.Hardware.HBMBandwidth <= 0:
		return fmt.Errorf("profile %q: hardware PeakFLOPs and HBMBandwidth must be > 0", p.Name)
	case p.Eff.MFUPrefill <= 0 || p.Eff.MFUPrefill > 1 || p.Eff.MFUDecode <= 0 || p.Eff.MFUDecode > 1 ||
		p.Eff.MemEfficiency <= 0 || p.Eff.MemEfficiency > 1:
		return fmt.Errorf("profile %q: efficiencies must be in (0, 1]", p.Name)
	case p.TP <= 0:
		return fmt.Errorf("profile %q: TP must be > 0", p.Name)
	case p.BlockSize <= 0:
		return fmt.Errorf("profile %q: BlockSize must be > 0", p.Name)
	case p.NumGPUBlocks <= 1:
		return fmt.Errorf("profile %q: NumGPUBlocks must be > 1, one being vLLM's null block (model does not fit in memory?)", p.Name)
	case p.MaxNumSeqs <= 0:
		return fmt.Errorf("profile %q: MaxNumSeqs must be > 0", p.Name)
	case p.MaxNumBatchedTokens <= 0:
		return fmt.Errorf("profile %q: MaxNumBatchedTokens must be > 0", p.Name)
	case p.MaxModelLen <= 0:
		return fmt.Errorf("profile %q: MaxModelLen must be > 0", p.Name)
	}
	return nil
}

// h100Eff is the H100 efficiency set for dense 7-8B models. It is
// calibrated against BLIS's blackbox fit for vLLM 0.8.4 serving Llama-3.1-8B
// on one H100 (step_us = 5753 + 17.25 x prefill + 6.00 x decode tokens):
// MemEfficiency 0.85 puts the weight-read floor at 5.64 ms against BLIS's
// 5.75 ms intercept; GEMM efficiency rises from BLIS's decode MFU 0.30 for
// tiny steps to 0.75 for large ones (half way at 512 tokens), the upper end
// of what H100 BF16 GEMM and FlashAttention-3 kernels reach. (BLIS's roofline
// MFU 0.45 would make 8B prefill 1.6x slower than its own fit; the fit's
// 17.25 us/token slope alone would need more than 90% of peak.) cost_test.go
// holds the model within 25% of the fit wherever the fit is physically
// attainable.
var h100Eff = Efficiency{
	MFUPrefill: 0.75, MFUDecode: 0.30, GEMMHalfTokens: 512, MemEfficiency: 0.85,
	StepOverheadSeconds: 150e-6, SeqOverheadSeconds: 2e-6, AllReduceLatencySeconds: 5e-6,
}

// h100EffTP is used for 70B-class models at TP4: BLIS's 70B-TP4 slope
// (76.4 us per prefill token) implies a lower prefill MFU than its 8B fit
// (tensor-parallel GEMMs are narrower per GPU).
var h100EffTP = Efficiency{
	MFUPrefill: 0.60, MFUDecode: 0.30, GEMMHalfTokens: 512, MemEfficiency: 0.85,
	StepOverheadSeconds: 150e-6, SeqOverheadSeconds: 2e-6, AllReduceLatencySeconds: 5e-6,
}

var (
	llama31_8B = Model{Name: "meta-llama/Llama-3.1-8B-Instruct", Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8,
		HeadDim: 128, Intermediate: 14336, Vocab: 128256, DTypeBytes: 2, EOSTokenID: 128009}
	llama31_70B = Model{Name: "meta-llama/Llama-3.1-70B-Instruct", Layers: 80, Hidden: 8192, Heads: 64, KVHeads: 8,
		HeadDim: 128, Intermediate: 28672, Vocab: 128256, DTypeBytes: 2, EOSTokenID: 128009}
	qwen25_7B = Model{Name: "Qwen/Qwen2.5-7B-Instruct", Layers: 28, Hidden: 3584, Heads: 28, KVHeads: 4,
		HeadDim: 128, Intermediate: 18944, Vocab: 152064, DTypeBytes: 2, EOSTokenID: 151645}
	tinyModel = Model{Name: "tiny", Layers: 2, Hidden: 256, Heads: 4, KVHeads: 2, HeadDim: 64,
		Intermediate: 512, Vocab: 1000, DTypeBytes: 2, EOSTokenID: 0}
)

// vLLM's defaults for GPUs with >= 70 GiB (engine/arg_utils.py, OpenAI server).
const (
	h100MaxNumSeqs          = 1024
	h100MaxNumBatchedTokens = 8192
)

func profiles() map[string]Profile {
	base := func(name string, m Model, eff Efficiency, tp, maxLen int) Profile {
		p := Profile{Name: name, Model: m, Hardware: gpus["h100"], Eff: eff, TP: tp, GPUMemoryUtilization: 0.9,
			BlockSize: 16, MaxNumSeqs: h100MaxNumSeqs, MaxNumBatchedTokens: h100MaxNumBatchedTokens, MaxModelLen: maxLen}
		p.NumGPUBlocks = p.DeriveNumGPUBlocks()
		return p
	}
	tiny := Profile{Name: "tiny", Model: tinyModel, Hardware: gpus["tiny"],
		Eff: Efficiency{MFUPrefill: 0.5, MFUDecode: 0.3, MemEfficiency: 0.8, StepOverheadSeconds: 100e-6, SeqOverheadSeconds: 5e-6},
		TP:  1, GPUMemoryUtilization: 0.9, BlockSize: 16, NumGPUBlocks: 65, MaxNumSeqs: 8, MaxNumBatchedTokens: 256, MaxModelLen: 1024}
	return map[string]Profile{
		"llama-3.1-8b-h100":      base("llama-3.1-8b-h100", llama31_8B, h100Eff, 1, 131072),
		"llama-3.1-70b-h100-tp4": base("llama-3.1-70b-h100-tp4", llama31_70B, h100EffTP, 4, 131072),
		"qwen2.5-7b-h100":        base("qwen2.5-7b-h100", qwen25_7B, h100Eff, 1, 32768),
		"tiny":                   tiny,
	}
}

// ProfileNames returns the names LookupProfile accepts, sorted.
func ProfileNames() []string {
	ps := profiles()
	names := make([]string, 0, len(ps))
	for n := range ps {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupProfile returns a built-in profile: "llama-3.1-8b-h100",
// "llama-3.1-70b-h100-tp4", "qwen2.5-7b-h100" or "tiny" (a toy model with 64
// usable blocks of 16 tokens, 65 with the null block, and millisecond
// steps, for tests).
func LookupProfile(name string) (Profile, error) {
	p, ok := profiles()[name]
	if !ok {
		return Profile{}, fmt.Errorf("engine: unknown profile %q (known: %s)", name, strings.Join(ProfileNames(), ", "))
	}
	return p, nil
}
