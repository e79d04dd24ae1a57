package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/zeebo/xxh3"
)

// Config configures an Engine. Zero-valued overrides take the profile's value.
type Config struct {
	// Profile is the deployment being modelled (see LookupProfile).
	Profile Profile
	// NumGPUBlocks overrides the KV cache size in blocks (default: the
	// profile's).
	NumGPUBlocks int
	// BlockSize overrides tokens per block (default: the profile's, 16). When
	// NumGPUBlocks is not set the block count is scaled to keep the same
	// capacity in tokens.
	BlockSize int
	// MaxNumSeqs overrides vLLM's max_num_seqs (default: the profile's).
	MaxNumSeqs int
	// MaxNumBatchedTokens overrides the per-step token budget (default: the
	// profile's).
	MaxNumBatchedTokens int
	// MaxModelLen overrides the context limit. Default: the profile's,
	// lowered to the KV capacity (Profile.UsableBlocks x BlockSize) when
	// the cache is smaller.
	MaxModelLen int
	// HashFunc computes block hashes from token ids (default XXH3()). Unused
	// for requests that carry BlockHashes.
	HashFunc HashFunc
	// DisablePrefixCaching turns automatic prefix caching off (no hits, no
	// KV events), like vLLM's --no-enable-prefix-caching.
	DisablePrefixCaching bool
	// NoEvents skips building KV events (the simulator's fast path when
	// nothing consumes them).
	NoEvents bool
	// Speed divides every modelled step time (2 = twice as fast). 0 means 1.
	Speed float64
	// KVConnector marks an engine run with a KV connector (vLLM's
	// --kv-transfer-config, as the engines of a P/D pair are): every
	// request's first scheduling then records the connector's prefix-cache
	// stats (Stats.ExternalQueries, ExternalHits), as vLLM's scheduler does
	// for each request it asks the connector about. Without it only
	// RemoteKV requests record them. Default false.
	KVConnector bool
	// OutputVocab, when in (0, the model's vocabulary), bounds the ids the
	// model generates: a tokenizer smaller than the model's padded
	// embedding table (Qwen2.5's 151,665 ids of 152,064) never sees a
	// padding id.
	OutputVocab int
	// MaxLoRAs is vLLM's --max-loras: at most this many distinct LoRA
	// adapters (Request.LoRA) among the requests a step schedules. A
	// waiting request of another adapter is skipped, and the requests
	// behind it are considered, as vLLM V1's scheduler does; the skipped
	// keep their places at the head of the queue. 0 means no limit (vLLM
	// takes 1 when LoRA is enabled: the emulator passes its --max-loras).
	MaxLoRAs int
}

// Request is one generation request as the engine sees it.
type Request struct {
	// ID identifies the request; it must be unique among live requests.
	ID string
	// Prompt holds the token ids; nil when BlockHashes is given (simulator
	// fast path).
	Prompt []uint32
	// PromptLen is len(Prompt), or the prompt length BlockHashes cover when
	// Prompt is nil (the last block may be partial). 0 means len(Prompt).
	PromptLen int
	// BlockHashes are optional precomputed chained hashes of the prompt's full
	// blocks (at the engine's block size); used as cache keys as they are.
	// The engine keeps a reference; the caller must not modify them.
	BlockHashes []uint64
	// MaxTokens is the output limit; 0 means up to the max model length.
	MaxTokens int
	// IgnoreEOS disables the EOSAt rule.
	IgnoreEOS bool
	// EOSAt, when > 0 and IgnoreEOS is false, makes the EOSAt-th output token
	// the model's EOS token: the request finishes with reason "stop". When 0
	// the model never emits EOS and requests stop at MaxTokens ("length").
	EOSAt int
	// Seed selects the pseudo-random output token ids; 0 derives one from ID.
	Seed uint64
	// SkipPrefill marks the decode leg of disaggregated prefill: the prompt's
	// KV arrived by transfer, so no prefill is computed (the last prompt
	// token is recomputed locally to produce the first token, as vLLM's
	// NixlConnector does).
	SkipPrefill bool
	// HoldKV marks the prefill leg: when the request finishes its blocks stay
	// referenced until Release(ID).
	HoldKV bool
	// RemoteKV marks a decode leg whose prompt KV the driver moves from
	// outside (vLLM's NixlConnector pull, kv_transfer_params
	// do_remote_prefill): when the request is admitted (FCFS, as any
	// waiting request) it takes its prefix-cache hit and blocks for the
	// rest of its prompt, which it holds while it waits for its KV,
	// counted as waiting; the step's StepResult.Loads reports it, and the
	// driver ends the wait with LoadedKV. Any prompt, however short: the
	// driver decides whose KV moves (vLLM's NixlConnector moves none of a
	// prompt shorter than one block, which the emulator then does not
	// mark RemoteKV; SGLang moves a short prompt's partial page too). It
	// takes precedence over SkipPrefill.
	RemoteKV bool
	// CacheSalt is vLLM's cache_salt: the extra key of the prompt's first
	// block's hash (HashFunc.Salted), so that requests with different salts,
	// or a salt and none, share no cached block. Used only with Prompt (the
	// caller's BlockHashes are taken as they are).
	CacheSalt string
	// LoRA is the name of the LoRA adapter that serves the request (vLLM's
	// lora_request.lora_name), "" for the base model. Every block of an
	// adapter's request has the name among its hash's extra keys
	// (HashFunc.Keyed), so requests of different adapters, or of an
	// adapter and the base model, share no cached block (with Prompt: the
	// caller's BlockHashes are taken as they are); and the adapters of a
	// step's requests are bounded by Config.MaxLoRAs. An engine keeps the
	// names it was given (at most MaxLoRANames).
	LoRA string
}

// MaxLoRANames bounds the distinct adapter names (Request.LoRA) one engine
// is given over its life.
const MaxLoRANames = 1<<16 - 1

// KVLoad is a RemoteKV request admitted in a step: it holds the blocks of
// its whole prompt and waits for the driver to move the KV of its
// ExternalTokens (vLLM's num_external_computed_tokens: the prompt past
// its LocalTokens, the prefix-cache hit) and call LoadedKV.
type KVLoad struct {
	ID                          string
	LocalTokens, ExternalTokens int
}

// Finish reasons, as vLLM reports them.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
)

// Output is one request's progress in a step.
type Output struct {
	ID string
	// Token is the generated token id (meaningless for an abort).
	Token uint32
	// Index is the 0-based position of Token among the request's outputs.
	Index int
	// First marks the request's first token.
	First bool
	// Finished marks the request's last output; FinishReason says why.
	Finished     bool
	FinishReason string
	// PromptTokens and CachedTokens: the prompt length and how many of its
	// tokens were prefix-cache hits when the request was first scheduled.
	PromptTokens, CachedTokens int
	// Time is when the token is ready: the end of the step.
	Time time.Duration
	// TTFT is Time - Arrival of the first token (set on every output once
	// the first token exists). ITL is the time since the previous token (0 on
	// the first).
	TTFT, ITL time.Duration
	// The rest is set only when Finished: arrival, time queued before first
	// scheduled, prefill (first scheduled -> first token), decode (first ->
	// last token; for an abort, first token -> the abort), and the number
	// of times the request was preempted. An abort has the phases the
	// request reached (none if it was never scheduled).
	Arrival     time.Duration
	QueueTime   time.Duration
	PrefillTime time.Duration
	DecodeTime  time.Duration
	Preemptions int
}

// KVEventKind says which of vLLM's KV events a KVEvent is.
type KVEventKind uint8

// KV event kinds (vllm/distributed/kv_events.py).
const (
	BlockStored KVEventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k KVEventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("KVEventKind(%d)", k)
}

// MediumGPU is the medium of every event this engine emits.
const MediumGPU = "GPU"

// KVEvent is one KV-cache event. Slices alias engine memory that is never
// modified afterwards; callers must not modify them.
type KVEvent struct {
	Kind KVEventKind
	// BlockHashes are the 64-bit keys of the blocks stored or removed, in
	// chain order for BlockStored.
	BlockHashes []uint64
	// ParentHash is the key of the block before BlockHashes[0], nil when
	// BlockHashes[0] is the first block of its sequence (BlockStored only).
	ParentHash *uint64
	// TokenIDs are the stored blocks' tokens concatenated (BlockStored; nil
	// for requests given as BlockHashes without tokens).
	TokenIDs  []uint32
	BlockSize int
	Medium    string
	// Salt is the CacheSalt of the request whose first block is
	// BlockHashes[0] (BlockStored; "" for none or a later block): vLLM
	// reports it as that block's extra_keys entry (cache_salt,).
	Salt string
	// LoRA is the adapter of the request whose blocks these are
	// (BlockStored; "" for the base model): vLLM reports it as lora_name,
	// and in each block's extra_keys entry, (lora_name,) or, for a salted
	// first block, (lora_name, cache_salt).
	LoRA string
}

// StepResult is what one Step did.
type StepResult struct {
	// Duration is the modelled time of the step (0 when there was no work).
	Duration time.Duration
	// Outputs has one entry per request that produced a token (or was
	// aborted) this step.
	Outputs []Output
	// Events are the KV events of the step, in order.
	Events []KVEvent
	// Batch is the step's shape as given to the cost model.
	Batch Batch
	// Preempted is the number of requests preempted this step.
	Preempted int
	// Loads are the RemoteKV requests admitted this step, in order: their
	// KV is now to be moved (see LoadedKV).
	Loads []KVLoad

	// Summarize is the caller's: set before StepInto, it leaves out of
	// Outputs the tokens that are neither a request's first nor its last
	// (a driver that wakes no one before a request finishes needs only
	// their count and latencies, not an Output each). Summarized counts
	// them and ITLs lists their inter-token latencies.
	Summarize bool
	// Summarized is the number of tokens left out of Outputs (Summarize).
	Summarized int
	// ITLs are the inter-token latencies of the tokens left out of Outputs
	// (Summarize), in the order their Outputs would have had, a run of
	// equal ones in one entry.
	ITLs []ITLRun

	removed []uint64 // slab for BlockRemoved hashes
}

// ITLRun is N tokens of a step's left out of its Outputs
// (StepResult.Summarize), each ITL after its request's previous token,
// that would have come just before Outputs[Before] (at the end when
// Before is len(Outputs)).
type ITLRun struct {
	ITL    time.Duration
	N      int
	Before int
}

// Stats is the engine's state and counters, as vLLM's metrics report them.
type Stats struct {
	// Waiting counts the requests not running, as vLLM's
	// num_requests_waiting does: those queued, and the RemoteKV requests
	// holding their blocks while their KV arrives (Loading).
	Waiting, Running int
	// Loading counts the RemoteKV requests holding blocks for KV not yet
	// arrived (vLLM's WAITING_FOR_REMOTE_KVS); LoadQueued those still
	// queued for their blocks. Both are part of Waiting.
	Loading, LoadQueued int
	// AbortedLoading counts the RemoteKV requests aborted while their KV
	// arrived: they left the queues (and Waiting) but hold their blocks
	// until the transfer ends (LoadedKV), as vLLM frees them only then.
	AbortedLoading int
	// Held is the number of finished requests whose KV is held (HoldKV).
	Held int
	// KVUsage is the fraction of the usable blocks in use (referenced),
	// 0..1: vLLM's vllm:kv_cache_usage_perc, 1 - FreeBlocks /
	// (NumGPUBlocks - 1) (BlockPool.get_usage leaves the null block out).
	KVUsage float64
	// NumGPUBlocks and BlockSize describe the cache as vLLM's
	// cache_config_info does (NumGPUBlocks counts the null block, which
	// is never free nor used); FreeBlocks counts unreferenced blocks, CachedBlocks blocks holding a cached hash (each
	// copy of a hash that several blocks cache counts).
	NumGPUBlocks, BlockSize  int
	FreeBlocks, CachedBlocks int
	// Counters since New, in tokens where vLLM counts tokens. The prefix
	// cache's stay 0 with DisablePrefixCaching, as vLLM's do.
	PrefixQueries, PrefixHits int64
	// ExternalQueries and ExternalHits are the KV connector's prefix-cache
	// stats (vLLM's connector_prefix_cache_stats): at a request's first
	// scheduling, its prompt tokens past the local hit, and those of them
	// that arrive from outside (a RemoteKV request's ExternalTokens).
	// Counted for RemoteKV requests, and for every request with
	// Config.KVConnector.
	ExternalQueries, ExternalHits  int64
	Preemptions                    int64
	PromptTokens, GenerationTokens int64
	// The prompt tokens of requests that produced their first token, by
	// source, as vLLM's PromptTokenStats counts them: PromptCached are
	// those not computed when the request was first scheduled
	// (Output.CachedTokens: local hits and tokens that arrived from
	// outside), PromptExternal those that arrived (KVLoad.ExternalTokens),
	// and PromptRecomputed counts the requests whose prompt was cached
	// but for the last token, recomputed for the logits.
	PromptCached, PromptExternal, PromptRecomputed int64
	FinishedStop, FinishedLength                   int64
	FinishedAbort                                  int64
	Steps                                          int64
	// BusyTime is the sum of step durations.
	BusyTime time.Duration
}

// LengthError reports a request that does not fit the model's context.
type LengthError struct {
	MaxModelLen, PromptTokens, MaxTokens int
}

func (e *LengthError) Error() string {
	return fmt.Sprintf("engine: add: %d prompt tokens + %d output tokens exceed the max model length %d",
		e.PromptTokens, e.MaxTokens, e.MaxModelLen)
}

// Errors returned by Add.
var (
	ErrDuplicateID = errors.New("engine: add: duplicate request id")
	ErrEmptyPrompt = errors.New("engine: add: empty prompt")
	ErrLoRANames   = errors.New("engine: add: too many LoRA adapter names")
)

type seqStatus uint8

const (
	statusWaiting seqStatus = iota
	statusRunning
	statusHeld
	statusDone
	statusLoading // RemoteKV: admitted, holds its blocks, in no queue until LoadedKV
	statusLoaded  // RemoteKV: its KV arrived; in Engine.loaded, with its blocks
	// RemoteKV aborted in statusLoading: reported, in no queue, holds its
	// blocks until LoadedKV (the transfer still writes into them)
	statusAbortedLoading
)

type sequence struct {
	// The fields are grouped by when they are used, a cache line per group
	// (a sequence is 256 bytes, so its lines are aligned): in a busy fleet
	// every running request's lines miss the cache at each step, so a step
	// should touch as few of them as it can (TestSequenceLayout).
	//
	// Line 0: read or written for every scheduled token (schedule, add,
	// allocate's fast path, decode runs).
	status              seqStatus
	skipPrefill, holdKV bool
	tokenMode           bool  // block keys chain over token ids (Add had a Prompt): tokens holds some
	last                int32 // blocks[len(blocks)-1] when there is one (allocN; its line is cold when the block fills)
	numTokens, computed int
	outputs             int
	numStored           int // blocks[:numStored] have been offered to the cache
	blocks              []int32
	// Line 1: for every output token (emit, token, decode runs).
	seed                    uint64
	lastToken               time.Duration
	id                      string
	eosAt, maxTokens        int32 // maxTokens <= the context length; eosAt <= maxTokens+1 (Add)
	ttft                    time.Duration
	promptLen, cachedTokens int32
	// run is 1 + its run of blocks with deferred keys (deferred.go); 0:
	// none. Read at every block an output token fills (deferring), so on
	// this line, which the token's step writes anyway, rather than line 3
	// (a miss per output block in a busy fleet).
	run     int32
	remote  bool   // RemoteKV and its KV not arrived yet (waiting or statusLoading)
	counted bool   // its prefix-cache queries are counted (countQueries)
	lora    uint16 // its adapter: Engine.loras[lora-1]; 0 for the base model
	// Line 2: for every full block (blockKey).
	hashes  []uint64 // keys of full blocks known so far, in chain order
	tokBase int32    // tokens[0] is token tokBase of the sequence (keepTokens)
	parentN int32    // parent is the digest of hashes[parentN-1] (token mode chain), when > 0
	parent  Digest
	// Line 3: at admission, the first token and the finish, and the block
	// with the prompt's last tokens. The generated tokens are appended to
	// tokens only when KV events report them (Engine.keepGen); otherwise
	// the sampler recomputes a block's outputs when it fills (nextKey), so
	// no step writes them.
	tokens                          []uint32 // prompt (from tokBase) [+ outputs (keepGen)]; token mode only
	firstToken, arrival, firstSched time.Duration
	preemptions                     int
	admitted                        bool
	ownHashes                       bool  // hashes were allocated by Add (recyclable)
	external                        int32 // prompt tokens whose KV arrived from outside (RemoteKV)
}

// Finished sequences are recycled, with their slices, when nothing else
// can hold those slices: KV events alias a sequence's hashes and tokens, so
// only with Config.NoEvents. maxSpare bounds the free list, or the sweep
// threshold when that is larger: a sweep of deferred runs (deferred.go)
// returns that many sequences at once, which the requests after it reuse
// (kept to maxSpare, most were garbage: 3.35 allocations per request on
// the 8B profile at steady state, 0 kept).
const maxSpare = 256

// recyclable slices of a spare sequence
type spareSlices struct {
	blocks []int32
	tokens []uint32
	hashes []uint64
}

// seqSlab is how newSequence allocates new sequences: slabSeqs at once,
// so that an engine's requests lie on a few pages of their own rather
// than scattered over the heap among other 256-byte objects, and a wake-up
// that reads every running request (decodeRun, each cold in a busy fleet)
// misses fewer pages. In the fleet soak (16 engines in one process,
// KVROUTE_SOAK_AGAINST, five rounds, this build's fleet first) they
// measured a median of 15.9 us per request lower, lower in every round;
// the harness favours the first fleet (the same build against itself:
// medians of -7.4, -9.0 and -17.7 us), so the gain is smaller than that,
// and it was not measured in the other order. The cost: a slab is garbage
// only when all its sequences are (with NoEvents, finished ones are
// recycled instead), so a long request can keep about 9 KiB alive.
//
// A sequence's fields are grouped by cache line (see sequence), so its
// first byte must start a line. The runtime puts an 8-byte header before
// an object of more than 512 bytes that holds pointers, so the sequences
// follow 56 bytes of padding: 64 bytes from the object's start, which is
// 64-byte aligned (its size class, 9472 bytes, is a multiple of 64).
// TestSequenceSlab checks the alignment.
type seqSlab struct {
	_    [56]byte
	seqs [slabSeqs]sequence
}

const slabSeqs = 36 // the most that fit the 9472-byte size class

// newSequence returns a sequence to fill (a spare one when there is) and
// the slices it had, to reuse.
func (e *Engine) newSequence() (*sequence, spareSlices) {
	k := len(e.spare)
	if k == 0 {
		if len(e.slab) == 0 {
			e.slab = new(seqSlab).seqs[:]
		}
		s := &e.slab[0]
		e.slab = e.slab[1:]
		return s, spareSlices{}
	}
	s := e.spare[k-1]
	e.spare[k-1] = nil
	e.spare = e.spare[:k-1]
	sp := spareSlices{blocks: s.blocks, tokens: s.tokens}
	if s.ownHashes {
		sp.hashes = s.hashes
	}
	return s, sp
}

// recycle keeps a finished sequence (statusDone, referenced by nothing
// else) for a later Add.
func (e *Engine) recycle(s *sequence) {
	if s.run != 0 {
		return // its retired run holds it; endRun recycles it
	}
	if len(e.salts) > 0 {
		delete(e.salts, s)
	}
	if e.cfg.NoEvents && len(e.spare) < max(maxSpare, e.sweepAt) {
		e.spare = append(e.spare, s)
	}
}

// idSlabLen is the size of the slabs that sequences' block id arrays are
// carved from (blockIDs): 64 KiB, room for about 170 arrays of requests of
// 1,500 tokens.
const idSlabLen = 16 << 10

// blockIDs returns an empty slice with room for c block ids for a new
// sequence: spare's (a finished sequence's) when it has the room, else
// carved from the engine's slab of ids, so that the arrays of an engine's
// running requests lie together on a few pages. A decode step appends to a
// request's array at each block its tokens reach (allocN); scattered over
// the heap, each array was a page of its own, and in a busy fleet those
// appends missed the TLB (perf on the fleet soak: allocN's store into the
// array was the engine loop's largest single cost). A slab is garbage only
// when all its arrays are (with NoEvents, finished sequences' arrays are
// reused instead); a request whose array must grow past its room gets a
// new one from the heap, as append gives it.
func (e *Engine) blockIDs(spare []int32, c int) []int32 {
	if cap(spare) >= c {
		return spare[:0]
	}
	if c > idSlabLen/16 {
		return make([]int32, 0, c) // a long prompt's: alone
	}
	if len(e.idSlab) < c {
		e.idSlab = make([]int32, idSlabLen)
	}
	b := e.idSlab[:0:c]
	e.idSlab = e.idSlab[c:]
	return b
}

// sized returns a slice of length n and capacity at least c, reusing b's
// array when it is large enough.
func sized[T any](b []T, n, c int) []T {
	if cap(b) >= c {
		return b[:n]
	}
	return make([]T, n, c)
}

type scheduled struct {
	s *sequence
	n int
}

// Engine is the model of one vLLM engine. It is not safe for concurrent use.
type Engine struct {
	cfg     Config
	prof    Profile
	bs      int
	maxSeqs int
	budget  int
	maxLen  int
	cost    costModel
	hash    HashFunc
	speed   float64
	sampler Sampler // output tokens
	caching bool

	pool    *blockPool
	seqs    map[string]*sequence
	waiting deque
	running []*sequence
	aborted []Output

	sched          []scheduled
	spare          []*sequence // finished sequences to reuse (recycle)
	slab           []sequence  // new sequences, allocated together (newSequence)
	idSlab         []int32     // room for new sequences' block ids (blockIDs)
	hitIDs         []int32     // admit's scratch
	epoch          uint32      // admit's marker for repeated blocks
	res            *StepResult // target of the step in progress (for eviction events)
	pendingClear   bool        // ResetPrefixCache ran: report AllBlocksCleared
	held           int         // requests in statusHeld
	loading        int         // requests in statusLoading
	abortedLoading int         // requests in statusAbortedLoading
	loaded         []*sequence // requests in statusLoaded, in the order their KV arrived
	loadQueued     int         // remote requests in the waiting queue
	stalled        bool        // the last step could admit no waiting request and ran nothing
	ahead          uint64      // keysAhead's and hitsAhead's loads, kept so that they are made
	keepGen        bool        // generated tokens are kept in sequence.tokens (KV events report them)
	blockBuf       []uint32    // nextKey's scratch: a block's tokens recomputed
	// salts holds the CacheSalt of the salted sequences (for nextKey and
	// stored), until recycle.
	salts map[*sequence]string
	stats Stats

	// Deferred keys (deferred.go): with prefix caching and no KV events.
	deferKeys bool
	runs      []deferredRun
	freeRuns  []int32
	runByKey  map[uint64]int32                   // a run's first key -> 1 + the newest run of its chain
	keyCount  *[1 << (64 - keyCountShift)]uint32 // runs by the top bits of their first key (findDeferred's filter)
	retired   int                                // retired runs
	sweepAt   int                                // retired runs that start a sweep
	minSweep  int                                // the least sweepAt

	// LoRA adapters: the names Add was given (a sequence's lora is 1 + an
	// index), their ids, the live sequences of an adapter (schedule skips
	// the adapter check while there are none) and the scratch of schedule
	// (the adapters of the step's requests, the requests it skipped).
	loras       []string
	loraIDs     map[string]uint16
	loraSeqs    int
	stepLoRAs   []uint16
	skippedLoRA []*sequence
}

// MaxNumGPUBlocks bounds an engine's KV cache: 2^24 blocks (268M tokens of
// 16, far above any GPU's KV cache) hold about 0.5 GB of the engine model's
// own state; a larger count would exhaust the host's memory, not model a GPU.
const MaxNumGPUBlocks = 1 << 24

// New returns an engine for cfg, or an error naming the bad field.
func New(cfg Config) (*Engine, error) {
	p := cfg.Profile
	if cfg.BlockSize < 0 || cfg.NumGPUBlocks < 0 || cfg.MaxNumSeqs < 0 || cfg.MaxNumBatchedTokens < 0 || cfg.MaxModelLen < 0 || cfg.Speed < 0 || cfg.MaxLoRAs < 0 {
		return nil, errors.New("engine: new: negative override in Config")
	}
	if cfg.BlockSize > 0 && cfg.BlockSize != p.BlockSize {
		if cfg.NumGPUBlocks == 0 && p.BlockSize > 0 {
			p.NumGPUBlocks = p.NumGPUBlocks * p.BlockSize / cfg.BlockSize
		}
		p.BlockSize = cfg.BlockSize
	}
	if cfg.NumGPUBlocks > 0 {
		p.NumGPUBlocks = cfg.NumGPUBlocks
	}
	if cfg.MaxNumSeqs > 0 {
		p.MaxNumSeqs = cfg.MaxNumSeqs
	}
	if cfg.MaxNumBatchedTokens > 0 {
		p.MaxNumBatchedTokens = cfg.MaxNumBatchedTokens
	}
	if p.NumGPUBlocks > MaxNumGPUBlocks {
		return nil, fmt.Errorf("engine: new: NumGPUBlocks %d is above %d", p.NumGPUBlocks, MaxNumGPUBlocks)
	}
	if cfg.MaxModelLen > 0 {
		p.MaxModelLen = cfg.MaxModelLen
	} else if c := p.UsableBlocks() * p.BlockSize; p.MaxModelLen > c {
		p.MaxModelLen = c
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("engine: new: %w", err)
	}
	// A request must fit the blocks it can hold (not vLLM's check, on
	// memory with the null block's, under which a request that needs
	// every block would wait forever).
	if c := p.UsableBlocks() * p.BlockSize; p.MaxModelLen > c {
		return nil, fmt.Errorf("engine: new: MaxModelLen %d is larger than the KV cache (%d tokens)", p.MaxModelLen, c)
	}
	if p.BlockSize > 128 {
		return nil, fmt.Errorf("engine: new: BlockSize %d is larger than 128", p.BlockSize)
	}
	e := &Engine{
		cfg: cfg, prof: p, bs: p.BlockSize, maxSeqs: p.MaxNumSeqs, budget: p.MaxNumBatchedTokens,
		maxLen: p.MaxModelLen, cost: newCostModel(p), hash: cfg.HashFunc, speed: cfg.Speed,
		sampler: Sampler{vocab: uint32(p.Model.Vocab), eos: p.Model.EOSTokenID}, caching: !cfg.DisablePrefixCaching,
		pool: newBlockPool(p.UsableBlocks()), seqs: make(map[string]*sequence), salts: make(map[*sequence]string),
	}
	if v := cfg.OutputVocab; v > 0 && v < p.Model.Vocab {
		e.sampler.vocab = uint32(v)
	}
	e.sampler.vocabRem = newRemainder(e.sampler.vocab)
	e.keepGen = e.caching && !cfg.NoEvents
	if e.deferKeys = e.caching && cfg.NoEvents; e.deferKeys {
		e.runByKey = make(map[uint64]int32)
		e.keyCount = new([1 << (64 - keyCountShift)]uint32)
		e.sweepAt, e.minSweep = minSweep, minSweep
	}
	e.blockBuf = make([]uint32, 0, p.BlockSize)
	if e.hash == nil {
		e.hash = XXH3()
	}
	if e.speed == 0 {
		e.speed = 1
	}
	if e.caching && !cfg.NoEvents {
		e.pool.onEvict = e.evicted
	}
	e.stats.NumGPUBlocks, e.stats.BlockSize = p.NumGPUBlocks, p.BlockSize
	return e, nil
}

// Profile returns the effective profile (with Config overrides applied).
func (e *Engine) Profile() Profile { return e.prof }

// Add queues r at virtual time now. It fails for an empty prompt, a
// duplicate live ID, or a request longer than the max model length
// (*LengthError).
func (e *Engine) Add(now time.Duration, r *Request) error {
	n := r.PromptLen
	if r.Prompt != nil {
		if n == 0 {
			n = len(r.Prompt)
		} else if n != len(r.Prompt) {
			return fmt.Errorf("engine: add: PromptLen %d != len(Prompt) %d", n, len(r.Prompt))
		}
	}
	if n <= 0 {
		return ErrEmptyPrompt
	}
	if _, dup := e.seqs[r.ID]; dup {
		return fmt.Errorf("%w %q", ErrDuplicateID, r.ID)
	}
	if r.MaxTokens < 0 {
		return fmt.Errorf("engine: add: MaxTokens %d < 0", r.MaxTokens)
	}
	maxTok := r.MaxTokens
	if maxTok == 0 {
		maxTok = e.maxLen - n
	}
	if maxTok < 1 || n+maxTok > e.maxLen {
		return &LengthError{MaxModelLen: e.maxLen, PromptTokens: n, MaxTokens: r.MaxTokens}
	}
	var lora uint16
	if r.LoRA != "" {
		id, ok := e.loraIDs[r.LoRA]
		if !ok {
			if len(e.loras) == MaxLoRANames {
				return ErrLoRANames
			}
			if e.loraIDs == nil {
				e.loraIDs = make(map[string]uint16)
			}
			e.loras = append(e.loras, r.LoRA)
			id = uint16(len(e.loras))
			e.loraIDs[r.LoRA] = id
		}
		lora = id
		e.loraSeqs++
	}
	s, spare := e.newSequence()
	remote := r.RemoteKV
	*s = sequence{
		id: r.ID, promptLen: int32(n), maxTokens: int32(maxTok), seed: r.Seed, skipPrefill: r.SkipPrefill && !remote, holdKV: r.HoldKV,
		numTokens: n, arrival: now, remote: remote, lora: lora,
	}
	if remote {
		e.loadQueued++
	}
	if !r.IgnoreEOS && r.EOSAt > 0 {
		s.eosAt = int32(min(r.EOSAt, maxTok+1)) // a later EOS is never reached
	}
	if s.seed == 0 {
		s.seed = xxh3.HashString(r.ID) | 1
	}
	total := n + maxTok
	s.blocks = e.blockIDs(spare.blocks, min((total+e.bs-1)/e.bs, (n+e.bs-1)/e.bs+64))
	full := n / e.bs
	switch {
	case r.BlockHashes != nil || r.Prompt == nil:
		// The fast path: the caller's block keys (none when it gave only a
		// PromptLen: no block of the prompt can be a cache hit).
		h := r.BlockHashes
		if len(h) > full {
			h = h[:full]
		}
		s.hashes = h[:len(h):len(h)] // the caller's: never recycled
		if r.Prompt != nil {
			e.keepTokens(s, r.Prompt, spare.tokens, maxTok)
		}
	default:
		if e.caching {
			s.hashes = sized(spare.hashes, 0, full+min(maxTok, 4096)/e.bs+1)
			s.ownHashes = true
			s.parent, s.hashes = chainPrompt(e.hash, r.LoRA, r.CacheSalt, r.Prompt[:full*e.bs], e.bs, s.hashes)
			s.parentN = int32(full)
			if r.CacheSalt != "" {
				// For its first block's key (nextKey) when the prompt is
				// shorter than a block, and its BlockStored (stored).
				e.salts[s] = r.CacheSalt
			}
		}
		e.keepTokens(s, r.Prompt, spare.tokens, maxTok)
	}
	e.seqs[r.ID] = s
	e.waiting.pushBack(s)
	e.stalled = false
	return nil
}

// keepTokens copies into s.tokens (reusing spare) the prompt tokens s
// still needs: all of them when KV events report stored blocks' tokens
// (with room for the outputs, appended as they are generated), otherwise
// only those after the blocks whose keys are known (the key of a later
// block needs its tokens; a known one's does not), so a long prompt is not
// copied for nothing. Without events blockKey also drops a block's tokens
// once it has its key, and the outputs are recomputed by the sampler when
// their block fills instead of kept.
func (e *Engine) keepTokens(s *sequence, prompt, spare []uint32, maxTok int) {
	base, room := 0, 0
	if e.keepGen {
		room = min(maxTok, 4096)
	} else {
		base = len(s.hashes) * e.bs
	}
	n := len(prompt) - base
	s.tokenMode = true
	s.tokBase = int32(base)
	s.tokens = sized(spare, n, n+room)
	copy(s.tokens, prompt[base:])
}

// Abort removes a waiting or running request and frees its blocks; the next
// Step reports it with FinishReason "abort". Unknown IDs are ignored. A held
// request (HoldKV) is released. A RemoteKV request whose KV is arriving
// (admitted, LoadedKV not called yet) leaves the queues and is reported
// the same way, but keeps its blocks until LoadedKV says the transfer
// ended (Stats.AbortedLoading), as vLLM's scheduler does
// (Scheduler.finish_requests delays freeing the blocks of a request in
// WAITING_FOR_REMOTE_KVS until its connector reports the receive
// finished or failed): the transfer still writes into them.
func (e *Engine) Abort(now time.Duration, id string) {
	s, ok := e.seqs[id]
	if !ok {
		return
	}
	e.stalled = false
	keep := false // the blocks stay until LoadedKV
	switch s.status {
	case statusHeld:
		e.Release(id)
		return
	case statusAbortedLoading:
		return // reported already
	case statusWaiting:
		e.waiting.remove(s)
		if s.remote {
			e.loadQueued--
		}
	case statusLoaded:
		e.loaded = slices.DeleteFunc(e.loaded, func(x *sequence) bool { return x == s })
	case statusLoading:
		e.loading--
		keep = true
	case statusRunning:
		for i, r := range e.running {
			if r == s {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
	}
	e.stats.FinishedAbort++
	o := Output{ID: id, Index: s.outputs, Finished: true, FinishReason: FinishAbort, PromptTokens: int(s.promptLen),
		CachedTokens: int(s.cachedTokens), Time: now, Arrival: s.arrival, Preemptions: s.preemptions, TTFT: s.ttft}
	if s.admitted { // its phases until the abort, as a finish has them
		o.QueueTime = s.firstSched - s.arrival
		if s.outputs > 0 {
			o.PrefillTime = s.firstToken - s.firstSched
			o.DecodeTime = now - s.firstToken
		}
	}
	e.aborted = append(e.aborted, o)
	if keep {
		s.status = statusAbortedLoading
		s.remote = false
		e.abortedLoading++
	} else {
		e.drop(s)
	}
}

// drop frees the blocks of s, a request that leaves the engine, and
// forgets it.
func (e *Engine) drop(s *sequence) {
	if s.lora != 0 {
		e.loraSeqs--
	}
	e.freeBlocks(s)
	s.status = statusDone
	delete(e.seqs, s.id)
	e.recycle(s)
}

// Release frees the blocks a finished HoldKV request kept (the end of a P/D
// lease). Unknown or not-held IDs are ignored.
func (e *Engine) Release(id string) {
	s, ok := e.seqs[id]
	if !ok || s.status != statusHeld {
		return
	}
	e.stalled = false
	e.held--
	e.drop(s)
}

// LoadedKV ends the wait of RemoteKV request id for its KV (StepResult.Loads).
// When ok, its received blocks are cached (BlockStored, in the step that
// schedules it) and it computes its last prompt token in the next step
// with a seat and budget for it, as vLLM's scheduler does when the
// transfer finished (Scheduler._update_waiting_for_remote_kv:
// num_computed_tokens is the prompt less the last token): such requests
// are scheduled before the waiting queue (vLLM keeps them at its head;
// they need no block, so a queued request that waits for blocks they hold
// does not hold them up). Else (the transfer failed; vLLM's
// kv_load_failure_policy "recompute") what it computed is truncated at
// the first block that did not arrive, the first past its local
// prefix-cache hit, as vLLM's Scheduler._update_requests_with_invalid_blocks
// truncates num_computed_tokens: with a local hit it keeps all its blocks
// and is scheduled as a loaded request, computing its prompt from the hit
// into them (no new lookup, no new block); with none it frees them
// (_update_waiting_for_remote_kv) and goes to the front of the waiting
// queue, to look its prompt up again (a request computed meanwhile may
// have cached some of it), counted as a new prefix-cache query as vLLM's
// lookup counts it. A request aborted while its KV arrived frees its
// blocks now, whatever ok (vLLM caches nothing of it). Unknown IDs, and
// requests not waiting for KV, are ignored.
func (e *Engine) LoadedKV(id string, ok bool) {
	s, found := e.seqs[id]
	if !found {
		return
	}
	if s.status == statusAbortedLoading {
		e.stalled = false
		e.abortedLoading--
		e.drop(s)
		return
	}
	if s.status != statusLoading {
		return
	}
	e.stalled = false
	e.loading--
	s.remote = false
	switch {
	case ok:
		s.computed = int(s.promptLen) - 1
	case s.computed > 0: // the local hit, admitRemote's
		s.external = 0
	default:
		e.freeBlocks(s)
		s.external, s.counted = 0, false
		s.status = statusWaiting
		e.waiting.pushFront(s)
		return
	}
	s.status = statusLoaded
	e.loaded = append(e.loaded, s)
}

// BlockIDs returns the KV block ids a live or held request holds, in order
// (for NixlConnector's remote_block_ids): 1 to NumGPUBlocks-1, as vLLM's,
// whose block 0 is the null block. Nil for unknown IDs.
func (e *Engine) BlockIDs(id string) []int {
	s, ok := e.seqs[id]
	if !ok {
		return nil
	}
	ids := make([]int, len(s.blocks))
	for i, b := range s.blocks {
		ids[i] = int(b) + 1
	}
	return ids
}

// HasWork reports whether Step has anything to do: running requests,
// waiting requests that may be admitted, or abort outputs and events to
// report. It is false while requests wait only for KV blocks that held
// (HoldKV) requests keep, or only for their KV (RemoteKV): nothing can
// change until Add, Abort, Release or LoadedKV, so a driver may sleep until
// its next input instead of spinning on empty steps.
func (e *Engine) HasWork() bool {
	return len(e.running) > 0 || len(e.aborted) > 0 || e.pendingClear || len(e.loaded) > 0 || (e.waiting.len() > 0 && !e.stalled)
}

// MinStepTime returns a lower bound on the modelled duration of any step
// that does work (the weight-read floor plus the fixed overheads of one
// sequence): a request admitted now cannot finish sooner than n x
// MinStepTime after it is scheduled, n its output tokens.
func (e *Engine) MinStepTime() time.Duration {
	c := &e.cost
	return time.Duration((c.weightSec + c.stepSec + c.seqSec) / e.speed * 1e9) // truncated: a lower bound
}

// Stats returns the current state and counters.
func (e *Engine) Stats() Stats {
	st := e.stats
	st.Waiting = e.waiting.len() + e.loading + len(e.loaded)
	st.Loading, st.LoadQueued, st.AbortedLoading = e.loading, e.loadQueued, e.abortedLoading
	st.Running = len(e.running)
	st.Held = e.held
	st.FreeBlocks = e.pool.numFree
	st.CachedBlocks = e.pool.cached.len() + e.pool.deferred
	st.KVUsage = 1 - float64(e.pool.numFree)/float64(e.pool.size())
	return st
}

// ResetPrefixCache forgets every cached block, as vLLM's
// /reset_prefix_cache does, and reports an AllBlocksCleared event in the
// next Step. It fails (returns false) while any block is in use.
func (e *Engine) ResetPrefixCache() bool {
	if !e.pool.reset() {
		return false
	}
	e.dropRuns()
	if e.caching && !e.cfg.NoEvents {
		e.pendingClear = true
	}
	return true
}

// PrefixHit returns how many of r's prompt tokens the prefix cache would
// serve if r were scheduled now (a read-only probe: nothing is touched or
// counted). Like admission, it never counts the whole prompt: at least one
// token is left to compute.
func (e *Engine) PrefixHit(r *Request) int {
	if !e.caching {
		return 0
	}
	n := r.PromptLen
	if n == 0 {
		n = len(r.Prompt)
	}
	limit := (n - 1) / e.bs
	if limit <= 0 {
		return 0
	}
	hit := 0
	if r.BlockHashes != nil {
		for _, h := range r.BlockHashes[:min(limit, len(r.BlockHashes))] {
			e.findDeferred(h)
			if _, ok := e.pool.lookup(h); !ok {
				break
			}
			hit++
		}
		return hit * e.bs
	}
	parent := e.hash.None()
	for i := 0; i < limit && (i+1)*e.bs <= len(r.Prompt); i++ {
		salt := ""
		if i == 0 {
			salt = r.CacheSalt
		}
		parent = e.hash.Keyed(parent, r.Prompt[i*e.bs:(i+1)*e.bs], r.LoRA, salt)
		e.findDeferred(parent.Key())
		if _, ok := e.pool.lookup(parent.Key()); !ok {
			break
		}
		hit++
	}
	return hit * e.bs
}
