package emulator

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/tokenizer"
)

// P/D protocols (--pd-protocol).
const (
	// PDNixl is vLLM's NixlConnector handshake through kv_transfer_params.
	PDNixl = "nixl"
	// PDSGLang is SGLang's bootstrap form (bootstrap_host, bootstrap_port,
	// bootstrap_room; the same request goes to prefill and decode at once).
	PDSGLang = "sglang"
)

// What a decode engine does when the prefill engine's lease is missing or
// expired (--pd-load-failure).
const (
	// LoadFailureRecompute computes the prompt locally, with a warning: vLLM's
	// kv_load_failure_policy="recompute".
	LoadFailureRecompute = "recompute"
	// LoadFailureFail fails the request with a 500 error:
	// kv_load_failure_policy="fail".
	LoadFailureFail = "fail"
)

// Config configures a Server. Apply it with New, which fills defaults and
// validates.
type Config struct {
	// Model is the served model name (--served-model-name); required.
	Model string
	// Engine configures the engine model: its Profile is required; the
	// overrides (NumGPUBlocks, MaxModelLen, HashFunc, ...) default to the
	// profile's. Engine.Speed is set from Speed.
	Engine engine.Config
	// Speed runs the model this many times faster than real time; default 1.
	// It must be a positive, finite number.
	Speed float64
	// Role is the engine's role in a disaggregated pool; default both.
	Role kvroute.Role
	// MetricsFlavor is one of Flavors; default FlavorVLLM.
	MetricsFlavor string
	// NoSlots is llama.cpp's --no-slots: GET /slots answers 501. Only
	// with MetricsFlavor FlavorLlamaCpp (the only flavour with /slots).
	NoSlots bool
	// KVEvents configures the ZMQ KV-event publisher; zero = no events.
	KVEvents KVEventsConfig
	// Tokenizer tokenizes prompts and renders generated ids; default
	// tokenizer.Builtin().
	Tokenizer tokenizer.Tokenizer

	// PDProtocol is PDNixl (default) or PDSGLang.
	PDProtocol string
	// LeaseTimeout is how long a prefill engine holds the KV blocks of a
	// finished remote-decode request for the decode engine to pull (model
	// time; divided by Speed); default 480 s like vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT. (An SGLang leg's decode engine is
	// already waiting for its KV when it is computed, and a pull that left
	// frees it at once.)
	LeaseTimeout time.Duration
	// FabricGbps is the prefill->decode link speed used for the KV
	// transfer time; default 100. It must be finite, as must EOSMean.
	FabricGbps float64
	// TransferSetup is the fixed cost of one KV transfer; default 2 ms.
	TransferSetup time.Duration
	// LoadFailure is LoadFailureFail (default: vLLM's kv_load_failure_policy
	// default since vLLM PR #34896; SGLang's decode engines never recompute)
	// or LoadFailureRecompute.
	LoadFailure string
	// BootstrapWait bounds how long an SGLang decode leg's pull, which
	// bootstraps its room on the prefill engine, waits there for the
	// room's KV (the prefill leg's arrival and computation); default 60 s.
	BootstrapWait time.Duration
	// BootstrapTimeout is SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT:
	// how long an SGLang prefill leg waits, from its arrival, for its
	// decode engine to bootstrap its room before it fails with SGLang's
	// 500 (KVPoll.Bootstrapping), never computed (model time; divided by
	// Speed). SGLang's prefill engine computes a request only once the
	// decode engine pre-allocated its KV, and answers it once its KV went
	// there. Default 300 s, SGLang's; only with PDProtocol PDSGLang.
	BootstrapTimeout time.Duration
	// DisaggregationDecodeEnableRadixCache is SGLang's
	// --disaggregation-decode-enable-radix-cache (SGLang PR #19746, merged
	// 2026-05-01; off by default, "EXPERIMENTAL" in its log): an SGLang
	// decode engine keeps a prefix cache, matches each decode leg's prompt
	// in it when it pre-allocates the leg (whole pages), and tells the
	// prefill engine that prefix's length (decode_prefix_len), whose KV
	// the prefill engine then does not send: the pull moves only the pages
	// past it (Server.pulledTokens). Without it (the default) SGLang
	// forces a decode engine's cache to a chunk cache ("KV cache is forced
	// as chunk cache for decode server"): the emulated decode engine then
	// runs without prefix caching (no hit, no cached block, no KV event;
	// engine.Config.DisablePrefixCaching), and every pull moves the whole
	// prompt. Only with PDProtocol PDSGLang; it changes nothing on a
	// prefill engine, as in SGLang.
	DisaggregationDecodeEnableRadixCache bool
	// AdvertiseHost and AdvertisePort are the side-channel address put in
	// kv_transfer_params (remote_host, remote_port): this server's own
	// listen address. Default 127.0.0.1 and 0 (set it).
	AdvertiseHost string
	AdvertisePort int
	// EngineID is remote_engine_id; default a random UUID.
	EngineID string
	// DataParallelRank is the engine's data-parallel rank (vLLM's DP engine
	// index) when it is one of the engine cores of a DP server (NewDP):
	// its /metrics series carry engine="<rank>", its KV-event batches
	// data_parallel_rank, and its KV-event endpoints are offset by it as
	// vLLM offsets them (tcp port + rank, inproc suffix _dp<rank>).
	// Default 0.
	DataParallelRank int

	// DefaultMaxTokens is the output limit of a chat request that gives
	// neither max_tokens nor max_completion_tokens; default 1024. (vLLM's
	// default is the rest of the context; with a model that never emits EOS
	// that would be 100k tokens.) Capped at the rest of the context. A
	// completions request without max_tokens gets vLLM's 16.
	DefaultMaxTokens int
	// EOSMean, when > 0, makes the model emit EOS after a geometric number of
	// tokens with this mean (drawn from the request's seed) unless the
	// request sets ignore_eos; default 0: the model never emits EOS and
	// requests end at their max_tokens.
	EOSMean float64
	// StreamInterval is vLLM's --stream-interval: a streaming response
	// sends the first token at once, then a chunk every StreamInterval
	// tokens (and one with the last tokens), instead of one chunk per token.
	// Default 1 (vLLM's default: every token).
	StreamInterval int
	// MaxBodyBytes limits request bodies; default 32 MiB.
	MaxBodyBytes int64
	// MaxLogprobs is vLLM's --max-logprobs: the most sample logprobs a
	// request may ask for (-1: the vocabulary); default 20, vLLM's. A
	// request within it is refused all the same, as the emulator computes
	// no logprobs, but with vLLM's error when over it. It must be -1 or
	// positive (0 is the default).
	MaxLogprobs int
	// EnableAutoToolChoice is vLLM's --enable-auto-tool-choice: without it
	// a chat request whose tool_choice is "auto" (given, or implied by
	// tools) gets vLLM's 400. The emulator generates no tool calls either
	// way (message.tool_calls stays empty).
	EnableAutoToolChoice bool
	// LoRA configures LoRA adapters (vLLM's --enable-lora and its flags);
	// default none.
	LoRA LoRAConfig
	// ExcludeToolsWhenToolChoiceNone is vLLM's
	// --exclude-tools-when-tool-choice-none: a chat request whose
	// tool_choice is "none" is rendered without its tools (the chat
	// template gets none). Default false, vLLM's: the tools are rendered,
	// as the router's precise mode assumes.
	ExcludeToolsWhenToolChoiceNone bool
	// Logger receives warnings (nil = discard).
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Speed == 0 {
		c.Speed = 1
	}
	if c.MetricsFlavor == "" {
		c.MetricsFlavor = FlavorVLLM
	}
	if c.Tokenizer == nil {
		c.Tokenizer = tokenizer.Builtin()
	}
	if c.PDProtocol == "" {
		c.PDProtocol = PDNixl
	}
	if c.LeaseTimeout == 0 {
		c.LeaseTimeout = 480 * time.Second
	}
	if c.FabricGbps == 0 {
		c.FabricGbps = 100
	}
	if c.TransferSetup == 0 {
		c.TransferSetup = 2 * time.Millisecond
	}
	if c.LoadFailure == "" {
		c.LoadFailure = LoadFailureFail
	}
	if c.BootstrapWait == 0 {
		c.BootstrapWait = 60 * time.Second
	}
	if c.BootstrapTimeout == 0 {
		c.BootstrapTimeout = 300 * time.Second
	}
	if c.AdvertiseHost == "" {
		c.AdvertiseHost = "127.0.0.1"
	}
	if c.DefaultMaxTokens == 0 {
		c.DefaultMaxTokens = 1024
	}
	if c.MaxLogprobs == 0 {
		c.MaxLogprobs = defaultMaxLogprobs
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.StreamInterval == 0 {
		c.StreamInterval = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.KVEvents.setDefaults()
	c.LoRA.setDefaults()
}

func (c *Config) validate() error {
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("emulator: Model is required"))
	}
	if !(c.Speed > 0) || math.IsInf(c.Speed, 1) { // NaN compares false: it would hang every request
		errs = append(errs, fmt.Errorf("emulator: Speed %v must be a positive number", c.Speed))
	} else if c.Speed < MinSpeed { // the model's durations, divided by it, would overflow
		errs = append(errs, fmt.Errorf("emulator: Speed %v is below %v", c.Speed, MinSpeed))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"FabricGbps", c.FabricGbps}, {"EOSMean", c.EOSMean}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("emulator: %s %v must be a finite number", f.name, f.v))
		}
	}
	switch c.MetricsFlavor {
	case FlavorVLLM, FlavorVLLMLegacy, FlavorSGLang, FlavorLlamaCpp:
	default:
		errs = append(errs, fmt.Errorf("emulator: MetricsFlavor %q is not one of %v", c.MetricsFlavor, Flavors))
	}
	if c.NoSlots && c.MetricsFlavor != FlavorLlamaCpp {
		errs = append(errs, fmt.Errorf("emulator: NoSlots needs MetricsFlavor %s (only llama.cpp has /slots)", FlavorLlamaCpp))
	}
	if c.LoRA.RuntimeUpdating && c.MetricsFlavor == FlavorLlamaCpp {
		// Its adapters' ids are their places in the list loaded at start.
		errs = append(errs, fmt.Errorf("emulator: LoRA.RuntimeUpdating is vLLM's: MetricsFlavor %s loads its adapters at start only", FlavorLlamaCpp))
	}
	if c.PDProtocol != PDNixl && c.PDProtocol != PDSGLang {
		errs = append(errs, fmt.Errorf("emulator: PDProtocol %q is not nixl or sglang", c.PDProtocol))
	} else if c.DisaggregationDecodeEnableRadixCache && c.PDProtocol != PDSGLang {
		errs = append(errs, fmt.Errorf("emulator: DisaggregationDecodeEnableRadixCache needs PDProtocol %s (it is SGLang's)", PDSGLang))
	}
	if c.LoadFailure != LoadFailureRecompute && c.LoadFailure != LoadFailureFail {
		errs = append(errs, fmt.Errorf("emulator: LoadFailure %q is not recompute or fail", c.LoadFailure))
	}
	if c.FabricGbps < 0 || c.LeaseTimeout < 0 || c.TransferSetup < 0 || c.BootstrapWait < 0 || c.BootstrapTimeout < 0 || c.EOSMean < 0 ||
		c.DefaultMaxTokens < 0 || c.MaxBodyBytes < 0 || c.StreamInterval < 0 {
		errs = append(errs, errors.New("emulator: FabricGbps, LeaseTimeout, TransferSetup, BootstrapWait, BootstrapTimeout, EOSMean, DefaultMaxTokens, MaxBodyBytes and StreamInterval must not be negative"))
	}
	if c.MaxLogprobs < -1 {
		errs = append(errs, fmt.Errorf("emulator: MaxLogprobs %d must be -1 or positive", c.MaxLogprobs))
	}
	if c.DataParallelRank < 0 {
		errs = append(errs, fmt.Errorf("emulator: DataParallelRank %d must not be negative", c.DataParallelRank))
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		errs = append(errs, fmt.Errorf("emulator: AdvertisePort %d out of range", c.AdvertisePort))
	}
	if err := c.KVEvents.validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.LoRA.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// MinSpeed is the slowest Config.Speed: a thousand times slower than the
// model. Slower, a model duration divided by it (a KV lease of 480 s, a
// long prefill) overflows time.Duration and requests hang.
const MinSpeed = 1e-3

// scaled converts a model-time duration to real time.
func (c *Config) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / c.Speed)
}
