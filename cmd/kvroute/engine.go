package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/tokenizer"
	"golang.org/x/sync/errgroup"
)

func init() {
	register(command{name: "engine", summary: "run an emulated vLLM-compatible inference engine", run: runEngine})
}

const engineDescription = `Run one emulated inference engine: the deterministic engine model (continuous
batching, paged KV cache with prefix caching, roofline step times) in real time,
behind vLLM's HTTP API. No GPU is used: each modelled step is slept for its
modelled duration divided by --speed.

Endpoints: POST /v1/completions and /v1/chat/completions (streaming or not, in
vLLM's exact JSON and SSE shapes; max_tokens (16 by default on completions),
max_completion_tokens (chat), stop, include_stop_str_in_output, ignore_eos,
seed, stream_options.include_usage and continuous_usage_stats,
return_token_ids (prompt_token_ids and token_ids filled in); n must be 1
(below 1 is vLLM's error; above 1, which vLLM serves, a 400) and a
completions prompt one prompt (a batch is a 400);
logprobs and top_logprobs get vLLM's checks (--max-logprobs), and a request
that passes them and asks for logprobs a 400, as the emulator computes none;
tools and tool_choice get vLLM's checks, and tool_choice "auto" (given, or
implied by tools) vLLM's 400 unless --enable-auto-tool-choice (no tool calls
are generated either way), and tools reach the chat template unless
tool_choice is "none" with --exclude-tools-when-tool-choice-none; echo is ignored; errors in vLLM's body with its
status, type and param; the endpoint-load-metrics header on request), GET /metrics
(--metrics-flavor; with llamacpp also llama.cpp's GET /slots, one slot per
running request up to --max-num-seqs, and GET /props), GET /health, GET /v1/models, GET /version
(` + "`" + `{"version":"` + emulator.Version + `"}` + "`" + `: the oldest vLLM whose shapes it emits), POST /tokenize,
POST /detokenize, POST /reset_prefix_cache, and the P/D side channel POST /internal/kv/pull.
Prompts are tokenized with the built-in deterministic tokenizer (chat messages
rendered with the ChatML template first), so equal text prefixes give equal
cached blocks; generated text is deterministic for a seed. With --tokenizer (a
HuggingFace tokenizer.json) prompts are tokenized as vLLM does with that
tokenizer: chat messages through its chat template (tokenizer_config.json;
ChatML when there is none) with the request's add_generation_prompt,
continue_final_message, chat_template_kwargs, tools, documents and
reasoning_effort, completion prompts
with its special tokens (BOS) unless add_special_tokens is false, and
generated ids, drawn from the model's vocabulary, are decoded with it,
special tokens skipped; its EOS token ends a turn.

KV-cache events (--kv-events-endpoint) go out on a ZMQ PUB socket exactly as vLLM
publishes them: frames [topic, 8-byte big-endian sequence, msgpack EventBatch],
one batch per engine step that stored or evicted blocks. As in vLLM the PUB
socket binds when the endpoint contains '*' (tcp://*:5557) and connects
otherwise (the subscriber binds). --kv-events-replay binds a ROUTER socket that
replays buffered batches from a requested sequence number. Both are bound
before the engine serves (an endpoint in use is an error at start), so a
subscriber that connects once /health answers gets every batch.

Prefill/decode disaggregation: with --pd-protocol nixl (vLLM NixlConnector) a
prefill engine given kv_transfer_params.do_remote_decode=true computes the
prompt, holds its KV blocks for --kv-lease and answers the kv_transfer_params a
decode engine needs (a prompt shorter than one block, or a prefill whose one
token ended the request, holds none: the answer has remote_block_ids [] or no
kv_transfer_params, as vLLM's); a decode engine given do_remote_prefill=true pulls the
blocks from remote_host:remote_port (the prefill engine's side channel: its
HTTP address, or --side-channel-listen), spending --kv-transfer-setup plus
bytes/--fabric-gbps (the bytes of the prompt past its own prefix-cache hit, as
vLLM pulls only those), then decodes without a prefill. A missing or expired lease is handled per --pd-load-failure.
A decode engine that rejects a decode leg before taking it (a model or LoRA
adapter it does not serve: vLLM's 404; a prompt over the context) tells the
prefill engine to free the blocks at once, as vLLM's does. A LoRA adapter's
legs name it on both engines, each of which keys the prompt's blocks with it.
A client that leaves during the pull aborts the request at once, but the
transfer runs to its end and only then do both engines free its blocks, as
vLLM's do (with sglang, the pull stops and the decode engine frees them at
once, as SGLang's does). With
--pd-protocol sglang the router sends the same request (bootstrap_host,
bootstrap_port = the prefill engine's side channel port, bootstrap_room) to
both engines at once. As SGLang's, the prefill engine keeps the request in its
bootstrap queue (sglang:num_prefill_prealloc_queue_reqs), not computed, until
the decode engine has taken its decode leg with KV blocks for the prompt and
bootstrapped the room (its pull), computes it then, and answers once the
decode engine took the KV; after --bootstrap-timeout in the bootstrap queue it
fails with SGLang's 500 (KVPoll.Bootstrapping). Every prompt goes through the
bootstrap queue and moves its KV, one shorter than a block too (its partial
page), in whole pages (blocks). As SGLang's, a decode engine has no prefix
cache unless --disaggregation-decode-enable-radix-cache, with which it pulls
only the pages past the prompt's prefix it holds cached (SGLang's
decode_prefix_len). There a
request names a LoRA adapter as SGLang reads one: model <base>:<adapter>, or
lora_path; one the engine does not serve gets SGLang's 400 ("The following
requested LoRA adapters are not loaded: ..."), which a streamed request gets
as SGLang sends it: a 200 whose stream is the error event and [DONE].

LoRA adapters, as vLLM serves them: with --enable-lora, --lora-modules
name=path (or the JSON form {"name": ..., "path": ..., "base_model_name": ...};
several after one flag, or the flag repeated) registers adapters, the n-th with
lora_id n. A request whose "model" names an adapter is served by it: every
block of its prompt is hashed with the adapter's name among its extra keys (so
it shares no cached block with the base model or another adapter; kvroute's
kvindex.HashTokensKeyed computes the same keys), its responses carry the
adapter's name, and its BlockStored events lora_id, lora_name and per-block
extra_keys. A model that is neither the served one nor an adapter gets vLLM's
404. --max-loras N lets at most N adapters into one step's batch: a waiting
request of another adapter is skipped (the requests behind it go first), as
vLLM's scheduler skips it. GET /v1/models lists the adapters (root: the path,
parent: the served model), and /metrics has vllm:lora_requests_info (vllm and
vllm-legacy flavours; its value a wall-clock time, one series per set of
running and waiting adapters seen, updated as the emulator publishes its
stats). --max-lora-rank and --max-cpu-loras are checked as vLLM checks them and
otherwise unused: no adapter weights are read, nor is their load time or
compute modelled. With VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, POST
/v1/load_lora_adapter and /v1/unload_lora_adapter answer as vLLM's do. vLLM
refuses LoRA with --data-parallel-size above 1; so does the emulator.

Profiles: %s; or --hf-config config.json (with --gpu, --tp, --dtype) models a
HuggingFace model: its KV bytes per token from the model's shape (MLA for
DeepSeek-style models), its KV cache from GPU memory as vLLM sizes it, its step
times from the same roofline as the built-in profiles.

Data parallelism: --data-parallel-size N runs N engine cores behind the one HTTP
endpoint, as vLLM's --data-parallel-size with its internal load balancer: each
rank has its own KV cache (--kv-blocks each), scheduler and KV-event stream.
A request goes to the rank its X-data-parallel-rank header names (a value that
is not an integer is ignored; one out of range is vLLM's 400 error, or a stream
whose one event is that error; a single engine accepts only 0), else to the
rank vLLM's front end picks: the lowest max(its requests in flight, waiting +
running), waiting requests weighing more when the rank's KV cache is over half
full, ties in turn. /metrics has every rank's series with engine="<rank>" (vllm
and vllm-legacy flavours only). Rank r publishes its KV events with
data_parallel_rank r on the tcp port of --kv-events-endpoint (and of
--kv-events-replay) plus r, as vLLM offsets them (inproc endpoints get the
suffix _dp<r>; vLLM refuses ipc endpoints). With a P/D role each rank holds
and pulls its own KV under its engine id <engine_id>_dp<r> (a pull naming
another rank's id gets vLLM's engine ID mismatch); with --side-channel-listen
and --pd-protocol nixl rank r serves its side channel on that port + r and
advertises it, as vLLM offsets VLLM_NIXL_SIDE_CHANNEL_PORT (SGLang's one
bootstrap port serves every rank, by bootstrap_room modulo N).

SIGINT/SIGTERM stop accepting connections; the requests in flight run to their
end for up to --shutdown-timeout, then what is left ends with an error event (a
second signal ends the process at once). Exit status: 0 once stopped by a
signal, 2 on a bad flag or flag value, 1 on another error (a listen address or
KV-event endpoint in use).`

func runEngine(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("engine", "--model NAME [--profile NAME | --hf-config FILE] [--tokenizer DIR] [--listen ADDR] [flags]",
		fmt.Sprintf(engineDescription, strings.Join(engine.ProfileNames(), ", ")), stdout, stderr)
	var (
		model       = fs.String("model", "", "served model `name` (required; requests must name it or omit model)")
		profile     = fs.String("profile", "llama-3.1-8b-h100", "engine profile `name` (model, GPU, TP, cost model)")
		listen      = fs.String("listen", "127.0.0.1:8000", "HTTP listen `address`")
		speed       = fs.Float64("speed", 1, "run the model this many times faster than real time (at least 0.001)")
		kvBlocks    = fs.Int("kv-blocks", 0, "KV cache size in blocks, at most 16777216 (default: the profile's, from GPU memory)")
		blockSize   = fs.Int("block-size", 0, "tokens per KV block (default: the profile's, 16)")
		maxNumSeqs  = fs.Int("max-num-seqs", 0, "vLLM max_num_seqs: the most requests running in one step; more wait (default: the profile's)")
		maxBatched  = fs.Int("max-num-batched-tokens", 0, "vLLM max_num_batched_tokens: the most tokens (prefill chunks and decodes) one step computes (default: the profile's)")
		maxModelLen = fs.Int("max-model-len", 0, "context limit in tokens (default: the profile's, capped by the KV cache)")
		hashAlgo    = fs.String("prefix-caching-hash-algo", "xxh3", "block hash: xxh3 (matches the router's kvindex), sha256 or sha256_cbor (vLLM's, byte for byte)")
		hashSeed    = fs.String("hash-seed", "", "NONE_HASH seed for sha256 algorithms, like PYTHONHASHSEED (default \"vllm-none-hash\")")
		role        = fs.String("role", "both", "P/D role: both, prefill or decode")
		flavor      = fs.String("metrics-flavor", emulator.FlavorVLLM, "/metrics flavour: "+strings.Join(emulator.Flavors, ", ")+" (llamacpp also serves llama.cpp's GET /slots and GET /props)")
		noSlots     = fs.Bool("no-slots", false, "llama.cpp's --no-slots: GET /slots answers 501 (needs --metrics-flavor llamacpp)")
		evEndpoint  = fs.String("kv-events-endpoint", "", "ZMQ PUB `endpoint` for KV events, e.g. tcp://*:5557 (default: no events)")
		evReplay    = fs.String("kv-events-replay", "", "ZMQ ROUTER `endpoint` for replay, e.g. tcp://127.0.0.1:5558")
		evTopic     = fs.String("kv-events-topic", "", "ZMQ topic of KV-event messages (vLLM's default is empty; its example uses kv-events)")
		evEncoding  = fs.String("kv-events-encoding", emulator.EncodingArray, "event encoding: array (vLLM < 0.26) or map (current)")
		evBuffer    = fs.Int("kv-events-buffer-steps", 10000, "batches kept for replay")
		pdProtocol  = fs.String("pd-protocol", emulator.PDNixl, "P/D handshake: nixl (vLLM kv_transfer_params) or sglang (bootstrap room)")
		fabricGbps  = fs.Float64("fabric-gbps", 100, "prefill->decode link speed for KV transfers, Gbit/s")
		setup       = fs.Duration("kv-transfer-setup", 2*time.Millisecond, "fixed cost of one KV transfer")
		lease       = fs.Duration("kv-lease", 480*time.Second, "how long a prefill engine holds KV for a decode engine (VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
		decodeRadix = fs.Bool("disaggregation-decode-enable-radix-cache", false, "SGLang's flag, --pd-protocol sglang, decode side: keep a prefix cache and pull only the KV pages past the prompt's cached prefix (decode_prefix_len); without it, as in SGLang, the decode engine has no prefix cache (a chunk cache) and pulls every prompt's whole KV")
		bootTimeout = fs.Duration("bootstrap-timeout", 300*time.Second, "--pd-protocol sglang, prefill side: how long a request waits in the prefill engine's bootstrap queue, not computed, for its decode engine to bootstrap its room before it fails with SGLang's 500 (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT); it answers the request once the decode engine took the KV")
		loadFailure = fs.String("pd-load-failure", emulator.LoadFailureFail, "decode side, lease missing or expired: fail (500, vLLM's kv_load_failure_policy default) or recompute (warn, prefill locally)")
		sideListen  = fs.String("side-channel-listen", "", "also serve the P/D side channel on this `address` (like VLLM_NIXL_SIDE_CHANNEL_PORT or SGLang's bootstrap port); it is then the advertised one. With --data-parallel-size N and --pd-protocol nixl, rank r listens on its port + r, as vLLM's ranks do")
		advertise   = fs.String("advertise", "", "side-channel `host:port` put in kv_transfer_params (default: --side-channel-listen, else --listen); with ranks on their own side-channel ports, rank r advertises port + r")
		defMaxTok   = fs.Int("default-max-tokens", 1024, "output limit in tokens of chat requests without max_tokens (completions get vLLM's 16)")
		eosMean     = fs.Float64("eos-mean", 0, "mean output length in tokens before the model emits EOS (0 = never; requests end at max_tokens)")
		streamIntvl = fs.Int("stream-interval", 1, "vLLM's --stream-interval: a streamed response sends the first token, then a chunk every N tokens; tokens generated while the previous chunk is still being written go out together, as vLLM merges the outputs of a lagging reader (at a high --speed, chunks carry more tokens)")
		maxLogprobs = fs.Int("max-logprobs", 20, "vLLM's --max-logprobs: the most logprobs a request may ask for, -1 (the vocabulary) or at least 1; past it, vLLM's 400")
		autoTools   = fs.Bool("enable-auto-tool-choice", false, "vLLM's --enable-auto-tool-choice: accept chat requests whose tool_choice is \"auto\" (given, or implied by tools); without it they get vLLM's 400. No --tool-call-parser is needed: the emulator generates no tool calls")
		exclTools   = fs.Bool("exclude-tools-when-tool-choice-none", false, "vLLM's --exclude-tools-when-tool-choice-none: render a chat request whose tool_choice is \"none\" without its tools (the router's precise mode assumes the default, off)")
		dpSize      = fs.Int("data-parallel-size", 1, "vLLM's --data-parallel-size: `N` engine cores (each with its own KV cache, scheduler and KV events on port+rank) behind one endpoint, at most 1024; requests go to the rank of their X-data-parallel-rank header or vLLM's internal load balancer's")
		hf          hfModel
		tokPath     = fs.String("tokenizer", "builtin", "prompt tokenizer: builtin, or a HuggingFace model `directory` (tokenizer.json, and tokenizer_config.json for the chat template) or its tokenizer.json file")
		logLevel    = fs.String("log-level", "info", "log level: debug, info, warn, error")
		keepAlive   = fs.Duration("keep-alive", 5*time.Second, "close a client connection idle this long, as vLLM's HTTP server does (uvicorn's timeout_keep_alive, VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s); 0 keeps idle connections open")
		shutdownTO  = fs.Duration("shutdown-timeout", 30*time.Second, "on SIGINT/SIGTERM, how long requests in flight may run to their end before they are cut with an error event (0 = at once; a second signal ends the process at once)")
		enableLoRA  = fs.Bool("enable-lora", false, "vLLM's --enable-lora: serve LoRA adapters: a request whose model names one is served by it (its blocks keyed with the adapter's name, its responses naming it); /v1/models lists them and /metrics has vllm:lora_requests_info. With --metrics-flavor llamacpp the adapters are llama.cpp's instead: GET/POST /lora-adapters and a request's \"lora\" list of ids and scales")
		loraMods    loraModules
		maxLoRAs    = fs.Int("max-loras", 1, "vLLM's --max-loras: the most adapters among the requests of one step; a waiting request of another adapter is skipped (needs --enable-lora)")
		maxLoRARank = fs.Int("max-lora-rank", 16, "vLLM's --max-lora-rank, checked as vLLM checks it (one of 1, 8, 16, 32, 64, 128, 256, 320, 512) and otherwise unused")
		maxCPULoRAs = fs.Int("max-cpu-loras", 0, "vLLM's --max-cpu-loras, checked as vLLM checks it (at least --max-loras) and otherwise unused (default: --max-loras)")
		procs       = fs.Int("procs", 1, "OS threads running Go code at once (GOMAXPROCS) while the engine serves; 0 = the Go default (the GOMAXPROCS variable, else one per core). "+
			"1 unless the GOMAXPROCS variable is set (then that): the engine is one event loop, and a wider runtime spends more CPU waking threads than it saves (16 engines at 200 req/s: about a quarter less CPU at 1)")
	)
	hf.register(fs, "the engine's model, GPU and KV cache (instead of --profile)")
	fs.Var(&loraMods, "lora-modules", "vLLM's --lora-modules: LoRA adapters, `name=path` or JSON {\"name\": ..., \"path\": ..., \"base_model_name\": ...} (or a JSON list of them), several after one flag or the flag repeated; the n-th adapter's lora_id is n (with --metrics-flavor llamacpp: its id in /lora-adapters is n-1) (needs --enable-lora; the path is not read)")
	args = expandLoRAModules(args)
	// An empty topic is vLLM's default; an empty --listen has its own
	// message (checkListenAddr).
	if err := parseFlags(fs, args, "kv-events-topic", "listen"); err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "kvroute engine: "+format+"\n", a...)
		return errUsage
	}
	if *model == "" {
		return usageErr("--model is required")
	}
	prof, ok, err := hf.profile()
	switch {
	case err != nil:
		return usageErr("%s", hfUsage(err))
	case !ok:
		if prof, err = engine.LookupProfile(*profile); err != nil {
			return usageErr("--profile: %s", strings.TrimPrefix(err.Error(), "engine: "))
		}
	}
	r, err := kvroute.ParseRole(*role)
	if err != nil {
		return usageErr("--role %q is not one of both, prefill, decode", *role)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageErr("--log-level %q is not one of debug, info, warn, error", *logLevel)
	}
	if err := checkEngineFlags(fs); err != nil {
		return usageErr("%v", err)
	}
	mods, err := parseLoRAModules(loraMods)
	if err != nil {
		return usageErr("%v", err)
	}
	if err := checkLoRARank(*maxLoRARank); err != nil {
		return usageErr("%v", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	ec := engine.Config{Profile: prof, NumGPUBlocks: *kvBlocks, BlockSize: *blockSize, MaxNumSeqs: *maxNumSeqs,
		MaxNumBatchedTokens: *maxBatched, MaxModelLen: *maxModelLen}
	if *hashAlgo != "xxh3" || *hashSeed != "" {
		if ec.HashFunc, err = engine.NewHashFunc(*hashAlgo, *hashSeed); err != nil {
			return usageErr("--prefix-caching-hash-algo: %v", err)
		}
	}
	cfg := emulator.Config{
		Model: *model, Engine: ec, Speed: *speed, Role: r, MetricsFlavor: *flavor, NoSlots: *noSlots,
		KVEvents: emulator.KVEventsConfig{Endpoint: *evEndpoint, ReplayEndpoint: *evReplay, Topic: *evTopic,
			Encoding: *evEncoding, BufferSteps: *evBuffer},
		PDProtocol: *pdProtocol, FabricGbps: *fabricGbps, TransferSetup: *setup, LeaseTimeout: *lease, BootstrapTimeout: *bootTimeout,
		LoadFailure: *loadFailure, DisaggregationDecodeEnableRadixCache: *decodeRadix, DefaultMaxTokens: *defMaxTok, EOSMean: *eosMean, StreamInterval: *streamIntvl,
		MaxLogprobs: *maxLogprobs, EnableAutoToolChoice: *autoTools, ExcludeToolsWhenToolChoiceNone: *exclTools, Logger: logger,
		LoRA: emulator.LoRAConfig{Enable: *enableLoRA, Modules: mods, MaxLoRAs: *maxLoRAs, MaxLoRARank: *maxLoRARank,
			MaxCPULoRAs: *maxCPULoRAs, RuntimeUpdating: runtimeLoRAUpdating()},
	}
	if *maxLoRAs < 1 {
		return usageErr("max_loras (%d) must be >= 1.", *maxLoRAs)
	}
	if flagSet(fs, "max-cpu-loras") && *maxCPULoRAs < *maxLoRAs {
		return usageErr("max_cpu_loras (%d) must be >= max_loras (%d).", *maxCPULoRAs, *maxLoRAs)
	}
	if len(mods) > 0 && !*enableLoRA {
		return usageErr("LoRA is not enabled. Use --enable-lora to enable LoRA.")
	}
	if msg := loraModulesError(mods); msg != "" {
		return usageErr("%s", msg)
	}
	if *enableLoRA && *dpSize > 1 {
		return usageErr("LoRA in DP mode is not supported yet.")
	}
	if *tokPath != "builtin" {
		hf, err := tokenizer.LoadDir(*tokPath)
		if err != nil {
			return usageErr("--tokenizer: %v", err)
		}
		cfg.Tokenizer = hf
	}
	if err := checkListenAddr(*listen); err != nil {
		return usageErr("--listen: %v", err)
	}
	if *streamIntvl < 1 {
		return usageErr("--stream-interval must be at least 1")
	}
	if *maxLogprobs < -1 || *maxLogprobs == 0 {
		return usageErr("--max-logprobs must be -1 (the vocabulary) or at least 1")
	}
	if *speed <= 0 {
		return usageErr("--speed must be positive")
	} else if !(*speed > 0) || math.IsInf(*speed, 1) { // NaN: every request hung after its first token
		return usageErr("--speed %v must be a positive number", *speed)
	} else if *speed < emulator.MinSpeed {
		return usageErr("--speed %v is below %v: model durations divided by it would overflow", *speed, emulator.MinSpeed)
	}
	if *procs < 0 {
		return usageErr("--procs must be 0 or more")
	}
	if err := checkDataParallel(*dpSize, *flavor, *evEndpoint, *evReplay); err != nil {
		return usageErr("%v", err)
	}
	// NewDP binds the KV-event sockets: before the engine serves, so that
	// a router subscribing once it answers gets every event.
	srv, err := emulator.NewDP(cfg, *dpSize)
	if be := (*emulator.BindError)(nil); errors.As(err, &be) {
		return kvBindError(be, *evEndpoint, *evReplay)
	} else if err != nil {
		return usageErr("%v", err)
	}
	defer srv.Close() // releases the sockets when the engine never ran
	// With --side-channel-listen the side channel has its own listeners:
	// one per data-parallel rank for the NIXL protocol (base port + rank,
	// as vLLM offsets VLLM_NIXL_SIDE_CHANNEL_PORT), one for SGLang's (its
	// bootstrap server serves every rank).
	var sideAddrs []string
	if *sideListen != "" {
		perRank := 1
		if *pdProtocol == emulator.PDNixl {
			perRank = srv.Size()
		}
		if sideAddrs, err = rankAddrs(*sideListen, perRank); err != nil {
			return usageErr("--side-channel-listen: %v", err)
		}
	}
	// A signal during the set-up (a large --tokenizer takes a second to
	// load, many on a starved machine) stops the engine before it serves:
	// the command ends as interrupted, not with the loop's "engine
	// stopped" error.
	if err := ctx.Err(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	var sideLns []net.Listener
	closeAll := func() {
		ln.Close()
		for _, l := range sideLns {
			l.Close()
		}
	}
	advAddr := ln.Addr()
	if len(sideAddrs) > 0 {
		for _, a := range sideAddrs {
			l, err := net.Listen("tcp", a)
			if err != nil {
				closeAll()
				return fmt.Errorf("engine: side channel: %w", err)
			}
			sideLns = append(sideLns, l)
		}
		advAddr = sideLns[0].Addr()
	}
	advHost, advPort, err := advertiseAddr(*advertise, advAddr)
	if err != nil {
		closeAll()
		return usageErr("--advertise: %v", err)
	}
	srv.SetAdvertise(advHost, advPort)
	if len(sideLns) > 1 {
		for k, l := range sideLns {
			port := advPort + k // --advertise names the base port, as VLLM_NIXL_SIDE_CHANNEL_PORT does
			if *advertise == "" {
				port = l.Addr().(*net.TCPAddr).Port
			}
			if port > 65535 {
				closeAll()
				return usageErr("--advertise: rank %d's port %d (port + rank) is out of range", k, port)
			}
			srv.Rank(k).SetAdvertise(advHost, port)
		}
	}
	if n := engineProcs(*procs, flagSet(fs, "procs"), os.Getenv("GOMAXPROCS") != ""); n > 0 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(n))
	}
	p := srv.Profile()
	attrs := []any{"addr", ln.Addr().String(), "model", *model, "profile", p.Name, "speed", *speed,
		"role", r.String(), "kv_blocks", p.NumGPUBlocks, "block_size", p.BlockSize, "max_model_len", p.MaxModelLen,
		"kv_events", *evEndpoint, "engine_id", srv.EngineID(), "procs", runtime.GOMAXPROCS(0)}
	if srv.Size() > 1 {
		attrs = append(attrs, "data_parallel_size", srv.Size())
	}
	logger.Info("engine listening", attrs...)

	// IdleTimeout closes idle connections as uvicorn does for vLLM, so a
	// router in front meets the engines' keep-alive (its
	// timeouts.upstream_idle). 0 is no limit: net/http then reads
	// ReadTimeout, 0 too.
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: *keepAlive}
	g, gctx := errgroup.WithContext(ctx)
	// The engine loop outlives the signal: it keeps stepping while the HTTP
	// servers drain, so that the requests in flight finish (a router in
	// front may be draining its own), and stops after them.
	loopCtx, stopLoop := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLoop()
	g.Go(func() error { return srv.Run(loopCtx) })
	g.Go(func() error {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("engine: serve: %w", err)
		}
		return nil
	})
	var sides []*http.Server
	for k, l := range sideLns {
		h := srv.SideChannelHandler() // one listener: it finds the rank (DP.handlePull)
		if len(sideLns) > 1 {
			h = srv.Rank(k).SideChannelHandler() // rank k's own port
		}
		side := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		sides = append(sides, side)
		g.Go(func() error {
			if err := side.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("engine: side channel: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		timeout := *shutdownTO
		if ctx.Err() != nil {
			logger.Info("shutting down: finishing the requests in flight", "timeout", timeout)
		} else { // a failure, not a stop: the requests in flight cannot finish
			stopLoop()
			timeout = min(timeout, 5*time.Second)
		}
		sctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_ = hs.Shutdown(sctx)
		// After the HTTP server: a decode engine may still pull the KV of
		// a request that just finished its prefill here.
		for _, side := range sides {
			_ = side.Shutdown(sctx)
		}
		stopLoop() // cuts what is left with an error event
		return srv.Close()
	})
	return g.Wait()
}

// kvBindError is the error of a KV-event endpoint that could not be bound,
// naming its flag (endpoint and replay are the flags' values; a rank's
// endpoint is offset from them).
func kvBindError(be *emulator.BindError, endpoint, replay string) error {
	name, value := "--kv-events-endpoint", endpoint
	if be.Replay {
		name, value = "--kv-events-replay", replay
	}
	if be.Endpoint != value {
		return fmt.Errorf("engine: %s %s: data-parallel rank's endpoint %s: %w", name, value, be.Endpoint, be.Err)
	}
	return fmt.Errorf("engine: %s %s: %w", name, value, be.Err)
}

// maxEngineKVBlocks bounds --kv-blocks: engine.MaxNumGPUBlocks.
const maxEngineKVBlocks = engine.MaxNumGPUBlocks

// checkEngineFlags checks the values the emulator's and the engine's
// configs would reject, or read as "the default", naming the flag given.
func checkEngineFlags(fs *flag.FlagSet) error {
	get := func(name string) flag.Getter { return fs.Lookup(name).Value.(flag.Getter) }
	const zero = "must be positive (0 reads as the default)" // the flags whose 0 means something else
	// The engine model keeps about 32 bytes per block: 2e9 blocks ended in
	// the runtime's "fatal error: out of memory" and a stack trace.
	if n := get("kv-blocks").Get().(int); n > maxEngineKVBlocks {
		return fmt.Errorf("--kv-blocks %d must be at most %d", n, maxEngineKVBlocks)
	}
	for _, name := range []string{"kv-blocks", "block-size", "max-num-seqs", "max-num-batched-tokens", "max-model-len",
		"kv-events-buffer-steps", "default-max-tokens"} {
		if n := get(name).Get().(int); n < 0 {
			return fmt.Errorf("--%s %d must not be negative", name, n)
		} else if n == 0 && flagSet(fs, name) {
			return fmt.Errorf("--%s 0 %s", name, zero)
		}
	}
	for _, name := range []string{"fabric-gbps", "eos-mean"} {
		if v := get(name).Get().(float64); !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("--%s %v must be a number, not negative", name, v)
		} else if v == 0 && name == "fabric-gbps" && flagSet(fs, name) { // --eos-mean 0: never
			return fmt.Errorf("--%s 0 %s", name, zero)
		}
	}
	for _, name := range []string{"kv-lease", "bootstrap-timeout", "kv-transfer-setup", "shutdown-timeout", "keep-alive"} {
		if d := get(name).Get().(time.Duration); d < 0 {
			return fmt.Errorf("--%s %v must not be negative", name, d)
		} else if d == 0 && (name == "kv-lease" || name == "bootstrap-timeout" || name == "kv-transfer-setup") && flagSet(fs, name) { // --shutdown-timeout 0: at once; --keep-alive 0: never
			return fmt.Errorf("--%s %v %s", name, d, zero)
		}
	}
	for _, c := range []struct {
		name  string
		valid []string
	}{
		{"metrics-flavor", emulator.Flavors},
		{"pd-protocol", []string{emulator.PDNixl, emulator.PDSGLang}},
		{"pd-load-failure", []string{emulator.LoadFailureRecompute, emulator.LoadFailureFail}},
		{"kv-events-encoding", []string{emulator.EncodingArray, emulator.EncodingMap}},
	} {
		if v := get(c.name).String(); !slices.Contains(c.valid, v) {
			return fmt.Errorf("--%s %q is not one of %s", c.name, v, strings.Join(c.valid, ", "))
		}
	}
	for _, name := range []string{"kv-events-endpoint", "kv-events-replay"} {
		if v := get(name).String(); v != "" && !validZMQEndpoint(v) {
			return fmt.Errorf("--%s %q is not a ZMQ endpoint such as tcp://*:5557, tcp://127.0.0.1:5557 or ipc:///tmp/kv", name, v)
		}
	}
	if get("kv-events-replay").String() != "" && get("kv-events-endpoint").String() == "" {
		return errors.New("--kv-events-replay needs --kv-events-endpoint")
	}
	if get("disaggregation-decode-enable-radix-cache").String() == "true" && get("pd-protocol").String() != emulator.PDSGLang {
		return fmt.Errorf("--disaggregation-decode-enable-radix-cache needs --pd-protocol %s (it is SGLang's)", emulator.PDSGLang)
	}
	if get("no-slots").String() == "true" && get("metrics-flavor").String() != emulator.FlavorLlamaCpp {
		return fmt.Errorf("--no-slots needs --metrics-flavor %s (only llama.cpp has /slots)", emulator.FlavorLlamaCpp)
	}
	return nil
}

// checkDataParallel checks --data-parallel-size against the flags it
// cannot go with.
func checkDataParallel(size int, flavor string, endpoints ...string) error {
	if size < 1 {
		return fmt.Errorf("--data-parallel-size %d must be at least 1", size)
	}
	if size > config.MaxDataParallelSize { // 100000 ranks ran the machine out of memory
		return fmt.Errorf("--data-parallel-size %d must be at most %d (as the router's data_parallel_size)", size, config.MaxDataParallelSize)
	}
	if size == 1 {
		return nil
	}
	if flavor != emulator.FlavorVLLM && flavor != emulator.FlavorVLLMLegacy {
		return fmt.Errorf("--data-parallel-size %d needs --metrics-flavor %s or %s: %s's /metrics has no per-rank engine label",
			size, emulator.FlavorVLLM, emulator.FlavorVLLMLegacy, flavor)
	}
	for i, name := range []string{"kv-events-endpoint", "kv-events-replay"} {
		ep := endpoints[i]
		if strings.HasPrefix(ep, "ipc://") && !strings.Contains(ep, "tcp") && !strings.Contains(ep, "inproc") {
			return fmt.Errorf("--%s %q: with --data-parallel-size each rank needs its own endpoint, and vLLM offsets only tcp ports and inproc names", name, ep)
		}
		if c := strings.LastIndexByte(ep, ':'); strings.HasPrefix(ep, "tcp://") && c >= 0 {
			if port, err := strconv.Atoi(ep[c+1:]); err == nil && port+size-1 > 65535 {
				return fmt.Errorf("--%s %q: rank %d's port %d (port + rank) is out of range", name, ep, size-1, port+size-1)
			}
		}
	}
	return nil
}

// validZMQEndpoint reports whether s is a tcp://host:port (host may be *),
// ipc://path or inproc://name endpoint.
func validZMQEndpoint(s string) bool {
	scheme, rest, ok := strings.Cut(s, "://")
	switch {
	case !ok || rest == "":
		return false
	case scheme == "ipc" || scheme == "inproc":
		return true
	case scheme != "tcp":
		return false
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n >= 0 && n <= 65535
}

// checkListenAddr checks a listen address as the router's config checks
// its listen: an empty one (net.Listen's "any port on every interface")
// or one without a port is an error, not a surprise at listen time.
func checkListenAddr(addr string) error {
	if addr == "" {
		return errors.New("is empty (give host:port, e.g. 127.0.0.1:8000)")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not a host:port address", addr)
	}
	if n, err := strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
		return fmt.Errorf("%q has port %d, not 0-65535", addr, n)
	}
	return nil
}

// rankAddrs returns the listen addresses of n side channels based at
// addr: addr's port + k for rank k (each its own free port when addr's port
// is 0).
func rankAddrs(addr string, n int) ([]string, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("bad port %q", portStr)
	}
	addrs := make([]string, n)
	for k := range addrs {
		p := port
		if port != 0 {
			p += k
		}
		if p > 65535 {
			return nil, fmt.Errorf("rank %d's port %d (port + rank) is out of range", k, p)
		}
		addrs[k] = net.JoinHostPort(host, strconv.Itoa(p))
	}
	return addrs, nil
}

// advertiseAddr returns the side-channel host and port: --advertise when
// given, else the listen address (0.0.0.0 and :: become 127.0.0.1).
func advertiseAddr(flagValue string, ln net.Addr) (string, int, error) {
	hp := flagValue
	if hp == "" {
		hp = ln.String()
	}
	host, portStr, err := net.SplitHostPort(hp)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", portStr)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return host, port, nil
}

// engineProcs is the GOMAXPROCS the engine runs with (0: leave the
// runtime's): --procs when given, else its default unless the GOMAXPROCS
// variable chose already.
func engineProcs(procs int, given, env bool) int {
	if env && !given {
		return 0
	}
	return procs
}
