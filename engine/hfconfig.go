package engine

import (
	"encoding/json"
	"fmt"
	"strings"
)

// hfConfig is the subset of a HuggingFace config.json the model needs.
// Pointers distinguish absent fields from zeros.
type hfConfig struct {
	ModelType        string          `json:"model_type"`
	Architectures    []string        `json:"architectures"`
	NameOrPath       string          `json:"_name_or_path"`
	Layers           int             `json:"num_hidden_layers"`
	Hidden           int             `json:"hidden_size"`
	Heads            int             `json:"num_attention_heads"`
	KVHeads          *int            `json:"num_key_value_heads"`
	HeadDim          int             `json:"head_dim"`
	Intermediate     int             `json:"intermediate_size"`
	Vocab            int             `json:"vocab_size"`
	Tied             bool            `json:"tie_word_embeddings"`
	MaxPos           int             `json:"max_position_embeddings"`
	TorchDType       string          `json:"torch_dtype"`
	DType            string          `json:"dtype"`
	EOS              json.RawMessage `json:"eos_token_id"`
	KVLoRARank       int             `json:"kv_lora_rank"`
	QKRopeDim        int             `json:"qk_rope_head_dim"`
	QKNopeDim        int             `json:"qk_nope_head_dim"`
	VHeadDim         int             `json:"v_head_dim"`
	RoutedExperts    int             `json:"n_routed_experts"`
	LocalExperts     int             `json:"num_local_experts"`
	NumExperts       int             `json:"num_experts"`
	ExpertsPerTok    int             `json:"num_experts_per_tok"`
	SharedExperts    int             `json:"n_shared_experts"`
	MoEIntermediate  int             `json:"moe_intermediate_size"`
	FirstKDense      int             `json:"first_k_dense_replace"`
	TextConfig       *hfConfig       `json:"text_config"`
	QuantizationConf json.RawMessage `json:"quantization_config"`
}

// maxHFDim bounds every dimension read from a config so that arithmetic on
// hostile input cannot overflow.
const maxHFDim = 1 << 24

// ProfileFromHFConfig builds a profile from a HuggingFace config.json for
// tp GPUs of kind gpu ("h100", "h200", "a100", "l40s"; case-insensitive).
// dtype is the weight and KV dtype ("bfloat16", "float16", "fp8", "float32";
// "" or "auto" takes the config's torch_dtype, else bfloat16). Llama, Qwen2,
// Mistral-style (GQA) and DeepSeek-style (MLA: kv_lora_rank +
// qk_rope_head_dim; MoE experts) configs are understood. The KV cache size
// is derived from memory as vLLM does with gpu_memory_utilization 0.9.
func ProfileFromHFConfig(configJSON []byte, gpu string, tp int, dtype string) (Profile, error) {
	var c hfConfig
	if err := json.Unmarshal(configJSON, &c); err != nil {
		return Profile{}, fmt.Errorf("engine: hf config: %w", err)
	}
	if c.Layers == 0 && c.TextConfig != nil { // multimodal wrappers
		t := *c.TextConfig
		if t.ModelType == "" {
			t.ModelType = c.ModelType
		}
		c = t
	}
	hw, ok := gpus[strings.ToLower(gpu)]
	if !ok || hw.Name == "tiny" {
		return Profile{}, fmt.Errorf("engine: hf config: unknown gpu %q (want h100, h200, a100 or l40s)", gpu)
	}
	if tp < 1 || tp > 64 {
		return Profile{}, fmt.Errorf("engine: hf config: tp %d out of range 1..64", tp)
	}
	for name, v := range map[string]int{"num_hidden_layers": c.Layers, "hidden_size": c.Hidden,
		"num_attention_heads": c.Heads, "vocab_size": c.Vocab} {
		if v <= 0 || v > maxHFDim {
			return Profile{}, fmt.Errorf("engine: hf config: %s %d out of range 1..%d", name, v, maxHFDim)
		}
	}
	for name, v := range map[string]int{"head_dim": c.HeadDim, "intermediate_size": c.Intermediate,
		"kv_lora_rank": c.KVLoRARank, "qk_rope_head_dim": c.QKRopeDim, "qk_nope_head_dim": c.QKNopeDim,
		"n_routed_experts": c.RoutedExperts, "num_local_experts": c.LocalExperts, "num_experts": c.NumExperts,
		"num_experts_per_tok": c.ExpertsPerTok, "n_shared_experts": c.SharedExperts,
		"moe_intermediate_size": c.MoEIntermediate, "first_k_dense_replace": c.FirstKDense, "max_position_embeddings": c.MaxPos} {
		if v < 0 || v > maxHFDim {
			return Profile{}, fmt.Errorf("engine: hf config: %s %d out of range 0..%d", name, v, maxHFDim)
		}
	}
	if c.Layers > 4096 || c.Heads > 65536 {
		return Profile{}, fmt.Errorf("engine: hf config: implausible shape (%d layers, %d heads)", c.Layers, c.Heads)
	}
	m := Model{Name: c.NameOrPath, Layers: c.Layers, Hidden: c.Hidden, Heads: c.Heads, HeadDim: c.HeadDim,
		Intermediate: c.Intermediate, Vocab: c.Vocab, TiedEmbeddings: c.Tied}
	if m.Name == "" {
		m.Name = c.ModelType
	}
	if m.HeadDim == 0 {
		m.HeadDim = c.Hidden / c.Heads
	}
	m.KVHeads = c.Heads
	if c.KVHeads != nil {
		if *c.KVHeads <= 0 || *c.KVHeads > c.Heads {
			return Profile{}, fmt.Errorf("engine: hf config: num_key_value_heads %d out of range 1..%d", *c.KVHeads, c.Heads)
		}
		m.KVHeads = *c.KVHeads
	}
	if c.KVLoRARank > 0 {
		if c.QKRopeDim <= 0 {
			return Profile{}, fmt.Errorf("engine: hf config: kv_lora_rank without qk_rope_head_dim")
		}
		m.KVLoRARank, m.QKRopeDim = c.KVLoRARank, c.QKRopeDim
		m.KVHeads = 1
		if c.QKNopeDim > 0 {
			m.HeadDim = c.QKNopeDim
		}
		if c.VHeadDim > 0 {
			m.HeadDim = c.VHeadDim
		}
	}
	experts := max(c.RoutedExperts, c.LocalExperts, c.NumExperts)
	if experts > 0 {
		if c.ExpertsPerTok <= 0 || c.ExpertsPerTok > experts {
			return Profile{}, fmt.Errorf("engine: hf config: num_experts_per_tok %d out of range 1..%d", c.ExpertsPerTok, experts)
		}
		m.Experts, m.ExpertsPerTok, m.SharedExperts = experts, c.ExpertsPerTok, c.SharedExperts
		m.MoEIntermediate = c.MoEIntermediate
		if m.MoEIntermediate == 0 { // Mixtral: experts use intermediate_size
			m.MoEIntermediate = c.Intermediate
		}
		m.DenseLayers = min(c.FirstKDense, c.Layers)
	}
	// Bound the parameter count in floating point first, so that the int64
	// arithmetic of the model below cannot overflow on hostile configs.
	h, heads, hd := float64(m.Hidden), float64(m.Heads), float64(m.HeadDim+m.QKRopeDim)
	perLayer := 4*h*heads*hd + 2*float64(m.KVLoRARank)*heads*hd + h*float64(m.KVLoRARank+m.QKRopeDim) +
		3*h*float64(m.Intermediate) + 3*h*float64(m.MoEIntermediate)*float64(m.Experts+m.SharedExperts) + h*float64(m.Experts)
	if est := float64(m.Layers)*perLayer + 2*float64(m.Vocab)*h; est > 1e14 {
		return Profile{}, fmt.Errorf("engine: hf config: implausible model size (%.3g parameters)", est)
	}
	if m.Intermediate == 0 && m.Experts == 0 {
		return Profile{}, fmt.Errorf("engine: hf config: intermediate_size missing")
	}
	if len(c.EOS) > 0 {
		var one uint32
		var many []uint32
		if json.Unmarshal(c.EOS, &one) == nil {
			m.EOSTokenID = one
		} else if json.Unmarshal(c.EOS, &many) == nil && len(many) > 0 {
			m.EOSTokenID = many[0]
		}
	}
	auto := dtype == "" || dtype == "auto"
	if auto {
		dtype = nonEmpty(c.TorchDType, c.DType)
	}
	n, err := dtypeBytes(dtype)
	if err != nil {
		return Profile{}, err
	}
	m.DTypeBytes = n
	if auto && len(c.QuantizationConf) > 0 {
		// Pre-quantized checkpoints (DeepSeek-V3's fp8 block quantization):
		// the weights are stored at 1 byte, the KV cache stays at the
		// activation dtype (vLLM's kv_cache_dtype "auto").
		var q struct {
			Method string `json:"quant_method"`
		}
		if json.Unmarshal(c.QuantizationConf, &q) == nil && strings.EqualFold(q.Method, "fp8") {
			m.KVDTypeBytes, m.DTypeBytes = m.DTypeBytes, 1
		}
	}
	eff := h100Eff
	if tp > 1 {
		eff = h100EffTP
	}
	switch hw.Name {
	case "a100":
		eff.MFUPrefill, eff.MemEfficiency = 0.6, 0.8
	case "l40s":
		eff.MFUPrefill, eff.MFUDecode, eff.MemEfficiency = 0.5, 0.15, 0.8
	}
	p := Profile{Name: fmt.Sprintf("%s-%s-tp%d", strings.ToLower(nonEmpty(c.ModelType, "model")), hw.Name, tp),
		Model: m, Hardware: hw, Eff: eff, TP: tp, GPUMemoryUtilization: 0.9, BlockSize: 16, MaxModelLen: c.MaxPos}
	if m.KVLoRARank > 0 {
		p.BlockSize = 64 // vLLM's MLA backends use 64-token blocks
	}
	// vLLM's defaults (engine/arg_utils.py, OpenAI server): larger for
	// >= 70 GiB GPUs other than the A100.
	if hw.HBMBytes >= 70e9 && hw.Name != "a100" {
		p.MaxNumSeqs, p.MaxNumBatchedTokens = 1024, 8192
	} else {
		p.MaxNumSeqs, p.MaxNumBatchedTokens = 256, 2048
	}
	if p.MaxModelLen == 0 {
		p.MaxModelLen = 4096
	}
	p.NumGPUBlocks = p.DeriveNumGPUBlocks()
	if p.NumGPUBlocks == 0 {
		return Profile{}, fmt.Errorf("engine: hf config: the model (%.1f GB per GPU) leaves no KV memory on %d x %s",
			float64(p.WeightBytesPerGPU())/1e9, tp, hw.Name)
	}
	if c := p.UsableBlocks() * p.BlockSize; p.MaxModelLen > c {
		p.MaxModelLen = c // vLLM would refuse to start; a planner wants the profile anyway
	}
	if err := p.Validate(); err != nil {
		return Profile{}, fmt.Errorf("engine: hf config: %w", err)
	}
	return p, nil
}

func dtypeBytes(dtype string) (int, error) {
	switch strings.ToLower(dtype) {
	case "", "bfloat16", "bf16", "float16", "fp16", "half":
		return 2, nil
	case "fp8", "float8", "float8_e4m3fn", "fp8_e4m3":
		return 1, nil
	case "float32", "fp32", "float":
		return 4, nil
	}
	return 0, fmt.Errorf("engine: hf config: unknown dtype %q", dtype)
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
