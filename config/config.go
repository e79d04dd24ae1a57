package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/zmqaddr"
)

// Config is the whole router configuration.
type Config struct {
	// Listen is the address the router listens on; default ":8080".
	Listen string `yaml:"listen"`
	// Models are the served models, each with its own pool and policy. At
	// least one is required.
	Models []Model `yaml:"models"`
	// Timeouts bound the client and upstream sides of a request.
	Timeouts Timeouts `yaml:"timeouts"`
	// Limits bound what a client may send.
	Limits Limits `yaml:"limits"`
	// Retry controls retries before the first response byte reaches the
	// client.
	Retry Retry `yaml:"retry"`
	// HealthCheck controls active health checks of every endpoint.
	HealthCheck HealthCheck `yaml:"health_check"`
	// TrustedClients are the client addresses (CIDR prefixes or single IPs)
	// allowed to send routing instructions in x-kvroute-* headers; those
	// headers are stripped from every other client's requests. They are
	// also the proxies (a gateway in front of the router) whose
	// X-Forwarded-For, X-Forwarded-Host and X-Forwarded-Proto reach the
	// engines, the router appending the client's address to
	// X-Forwarded-For; every other client's are replaced with its own
	// address, host and scheme. Default: none.
	TrustedClients []string `yaml:"trusted_clients"`
	// Admin configures the admin API.
	Admin Admin `yaml:"admin"`
	// Debug enables debug endpoints and headers.
	Debug Debug `yaml:"debug"`
	// Log configures the router's own logs.
	Log Log `yaml:"log"`
}

// Model is one served model and its pool of endpoints.
type Model struct {
	// Name is the model name clients send in the request's "model" field.
	// Required and unique.
	Name string `yaml:"name"`
	// Adapters are the LoRA adapters the model's engines serve (vLLM
	// --enable-lora with --lora-modules), by the names clients send in the
	// request's "model" field. A request naming one is routed in this
	// model's pool (its endpoints, prefix index, policy and signals) to an
	// endpoint that serves it (see Endpoint.Adapters), and /v1/models lists
	// it with this model as its parent. Clients may also name one as SGLang
	// does ("model": "<name>:<adapter>", or "lora_path"); each engine gets
	// the request in the form it reads when its kind is known
	// (signals.flavor, or the flavour its scrape detected), else as sent. Each name is
	// unique across every model's name and adapters. Default none. A
	// reload applies changes to it.
	Adapters []string `yaml:"adapters"`
	// Endpoints are the engines serving the model. At least one is
	// required, unless Discovery finds them.
	Endpoints []Endpoint `yaml:"endpoints"`
	// Discovery finds the model's endpoints at run time instead of
	// Endpoints; default nil: none, the endpoints are listed. Not allowed
	// with Endpoints.
	Discovery *Discovery `yaml:"discovery"`
	// Policy is the routing policy; default kv-aware with no parameters.
	Policy Policy `yaml:"policy"`
	// Router holds the routing core's parameters.
	Router Router `yaml:"router"`
	// Signals configures the scraping of the endpoints' metrics.
	Signals Signals `yaml:"signals"`
	// Precise configures token-level prefix matching (a tokenizer) and the
	// precise prefix index fed by the endpoints' KV-cache events. Off by
	// default: the router then matches prefixes approximately, on characters.
	Precise Precise `yaml:"precise"`
	// PD configures prefill/decode disaggregation; it applies when the pool
	// has prefill or decode endpoints.
	PD PD `yaml:"pd"`
}

// Endpoint is one engine in a model's pool.
type Endpoint struct {
	// ID names the endpoint in metrics, logs and decisions; default the URL.
	// Unique within the model.
	ID string `yaml:"id"`
	// URL is the engine's base URL (http or https, no query, not ending
	// in /v1: requests keep their /v1/... path), e.g.
	// http://10.0.0.7:8000. Required.
	URL string `yaml:"url"`
	// Role is both, prefill or decode; default both.
	Role string `yaml:"role"`
	// Weight scales the endpoint's share of the load, 1 to 1,000,000
	// (kvroute.MaxWeight); default 1. round_robin (smooth weighted),
	// random, least_request and power_of_two (in-flight per weight) send
	// an endpoint of weight 2 about twice the requests of one of weight 1;
	// kv-aware scales its in-flight bounds (bounded-load caps, the session
	// ring) and its session ring share by weight, not its TTFT estimate.
	// The peers' policies (sglang-cache-aware, llm-d, dynamo, kubeai-chwbl,
	// preble-e2) ignore it, as their published algorithms do.
	Weight int `yaml:"weight,omitempty" zero:"to send an endpoint nothing, remove it"`
	// Labels are free-form (zone, node, gpu, link); default none.
	Labels map[string]string `yaml:"labels"`
	// KVCapacityTokens is the engine's KV capacity in tokens; default 0,
	// which means learn it from the engine's metrics (for llama.cpp, the
	// sum of its slots' n_ctx: set it to the context size, -c, for a
	// server with --kv-unified, whose slots share the whole cache).
	KVCapacityTokens int `yaml:"kv_capacity_tokens"`
	// Signals overrides the model's signals settings for this endpoint;
	// zero fields take the model's values.
	Signals EndpointSignals `yaml:"signals"`
	// KVEvents is where the engine publishes its KV-cache events (vLLM
	// --kv-events-config); default none. It needs the model's
	// precise.tokenizer. With DataParallelSize > 1 these are the addresses
	// of vLLM's --kv-events-config (rank 0's); rank r's are offset as vLLM
	// offsets them (see DataParallelSize).
	KVEvents KVEvents `yaml:"kv_events"`
	// DataParallelSize is the number of data-parallel ranks behind URL
	// (vLLM --data-parallel-size with its internal load balancer: one HTTP
	// server, that many engine cores, each with its own KV cache); default
	// 1. Above 1 the endpoint is routed as that many endpoints, one per
	// rank, with IDs ID#dp0 ... ID#dp<N-1> (but see DataParallelStartRank):
	// each is pinned with the X-Data-Parallel-Rank request header, observes
	// the series of its own engine="<rank>" label of the one metrics scrape
	// (vLLM flavours only), and subscribes to its own KV events at the
	// kv_events addresses with the tcp port plus its rank (vLLM's publisher
	// of rank r binds port + r). Weight and kv_capacity_tokens apply to
	// each rank. In a prefill/decode pool each rank is a prefill or
	// decode endpoint of its own (Role applies to every rank), each P/D
	// leg pinned to its rank.
	DataParallelSize int `yaml:"data_parallel_size,omitempty" zero:"an engine has at least one rank: leave it out, or write 1"`
	// DataParallelStartRank is the data-parallel rank of the first engine
	// core behind URL, when a deployment spans nodes and each node's server
	// fronts its own ranks (vLLM --data-parallel-start-rank with
	// --data-parallel-hybrid-lb; DataParallelSize is then the node's
	// --data-parallel-size-local); default 0. The ranks behind URL are
	// start ... start+N-1: their IDs (ID#dp<rank>), engine labels and
	// KV-event ports (port + rank) use these ranks, while the
	// X-Data-Parallel-Rank header names a rank by its place behind URL (0
	// ... N-1), as vLLM's server indexes its own engine cores. Only with
	// DataParallelSize above 1, and not on a prefill-capable endpoint of
	// a pd.protocol sglang pool (SGLang's decode finds the prefill rank
	// as bootstrap_room modulo the whole server's data-parallel size).
	DataParallelStartRank int `yaml:"data_parallel_start_rank"`
	// Adapters restricts which of the model's LoRA adapters (Model.Adapters)
	// the engine serves, for an engine started with its own --lora-modules:
	// a request for another adapter never goes to it. Each name must be in
	// the model's adapters (the model's list is the whole set; this one
	// picks from it). Default none: the engine serves every adapter of the
	// model. A reload applies changes to it, as to the endpoint's other
	// fields.
	Adapters []string `yaml:"adapters"`
}

// RankID is the routing endpoint ID of the i-th data-parallel rank behind
// the endpoint's URL (0 <= i < DataParallelSize): ID#dp<start+i>.
func (e *Endpoint) RankID(i int) string {
	return kvroute.DataParallelID(e.ID, e.DataParallelStartRank+i)
}

// Signals configures how a model's endpoints are scraped (GET metrics_path
// on each endpoint, parsed as the flavor's metrics) and when their signals
// count as stale.
type Signals struct {
	// Disabled turns scraping off: routing then uses router-local counts
	// only. Default false.
	Disabled bool `yaml:"disabled"`
	// ScrapeInterval is the time between two scrapes of one endpoint;
	// at least MinInterval and shorter than StaleAfter; default 100ms.
	ScrapeInterval time.Duration `yaml:"scrape_interval,omitempty" zero:"to turn scraping off, write disabled: true"`
	// ScrapeTimeout bounds one scrape; default 1s.
	ScrapeTimeout time.Duration `yaml:"scrape_timeout,omitempty" zero:"write a duration (default 1s)"`
	// StaleAfter is the age past which scraped signals are stale and routing
	// falls back on router-local counts; default router.stale_after (1s),
	// the older spelling of this field.
	StaleAfter time.Duration `yaml:"stale_after,omitempty" zero:"write a duration (default router.stale_after, 1s)"`
	// Flavor is the engines' metrics dialect: auto, vllm, vllm-legacy,
	// sglang, llamacpp or tgi; default auto (detected from the names). It
	// is also the engines' kind for the form a request names a LoRA
	// adapter in (vLLM's "model", SGLang's "lora_path"); with auto, the
	// kind the last scrape detected, unknown before it.
	Flavor string `yaml:"flavor"`
	// MetricsPath is the path scraped on each endpoint's URL; default
	// "/metrics".
	MetricsPath string `yaml:"metrics_path,omitempty" zero:"leave it out for /metrics; to scrape nothing, write disabled: true"`
}

// EndpointSignals overrides a model's Signals for one endpoint. Zero fields
// take the model's values.
type EndpointSignals struct {
	// Disabled turns scraping of this endpoint off; default false.
	Disabled bool `yaml:"disabled"`
	// ScrapeInterval overrides signals.scrape_interval.
	ScrapeInterval time.Duration `yaml:"scrape_interval,omitempty" zero:"to take the model's signals.scrape_interval, leave it out; to turn scraping of the endpoint off, write disabled: true"`
	// ScrapeTimeout overrides signals.scrape_timeout.
	ScrapeTimeout time.Duration `yaml:"scrape_timeout,omitempty" zero:"to take the model's signals.scrape_timeout, leave it out"`
	// Flavor overrides signals.flavor.
	Flavor string `yaml:"flavor"`
	// MetricsURL is the full metrics URL when the engine serves its metrics
	// elsewhere than url + signals.metrics_path, query included (llama.cpp's
	// router mode: http://host:8080/metrics?model=NAME); default "".
	MetricsURL string `yaml:"metrics_url"`
}

// KVEvents is one engine's ZMQ KV-event publisher.
type KVEvents struct {
	// Address is the engine's ZMQ PUB address, e.g. tcp://10.0.0.7:5557;
	// default "": no events.
	Address string `yaml:"address"`
	// ReplayAddress is the engine's ZMQ ROUTER replay address, e.g.
	// tcp://10.0.0.7:5558; default "": a sequence gap drops the endpoint's
	// index entries instead of replaying the missing events.
	ReplayAddress string `yaml:"replay_address"`
	// Topic is the ZMQ topic subscribed to; default "" (all, vLLM's).
	Topic string `yaml:"topic"`
	// Listen binds Address for engines that connect to the router (a "*"
	// host implies it); default false: the router dials the engine.
	Listen bool `yaml:"listen"`
	// ReplayBufferSteps is the engine's replay buffer (vLLM
	// --kv-events-config buffer_steps): a replay answer of more batches
	// fails; default 0: vLLM's default, 10000.
	ReplayBufferSteps int `yaml:"replay_buffer_steps"`
}

// Precise configures token-level prefix matching for a model.
type Precise struct {
	// Tokenizer turns on token-level matching: "builtin" (the emulated
	// engine's tokenizer and ChatML template), or a HuggingFace model
	// directory (or tokenizer.json path) whose tokenizer.json and
	// tokenizer_config.json chat template the engines use. Default "": off,
	// prefixes are matched approximately on characters.
	Tokenizer string `yaml:"tokenizer"`
	// BlockSize is the engines' KV block size in tokens (vLLM
	// --block-size); prompts are hashed in blocks of this size. Default 16.
	BlockSize int `yaml:"block_size,omitempty" zero:"write the engines' KV block size (vLLM --block-size; default 16)"`
	// CacheTokens bounds the tokenizer's prefix cache, in token ids (4
	// bytes each): every id held counts one and every cached segment about
	// 44 more for its bookkeeping, so the cache takes about 4 x CacheTokens
	// bytes; default 1048576 (4 MiB).
	CacheTokens int `yaml:"cache_tokens,omitempty" zero:"the tokenizer's prefix cache cannot be turned off: write a size in token ids (default 1048576)"`
	// IndexCapacity bounds the precise index's (block, endpoint) entries
	// (a safety net: KV events normally keep it far below); default 8388608.
	IndexCapacity int `yaml:"index_capacity,omitempty" zero:"write a number of entries (default 8388608)"`
}

// Enabled reports whether precise mode is on (a tokenizer is set).
func (p Precise) Enabled() bool { return p.Tokenizer != "" }

// MetricsFlavors are the accepted signals.flavor values.
var MetricsFlavors = []string{"auto", "vllm", "vllm-legacy", "sglang", "llamacpp", "tgi"}

// Policy selects a routing policy by name with its parameters.
type Policy struct {
	// Name is the policy name (see policy.Names); default "kv-aware"
	// (policy.Default).
	Name string `yaml:"name"`
	// Params are the policy's parameters; unknown ones are rejected when the
	// picker is built. Default none.
	Params map[string]any `yaml:"params"`
	// Seed seeds randomised policies; default 0, which means a random seed
	// chosen at start.
	Seed uint64 `yaml:"seed"`
}

// Router holds the per-model routing core's parameters.
type Router struct {
	// BlockChars is the approximate prefix block size in characters used
	// when no tokenizer is configured; default 128.
	BlockChars int `yaml:"block_chars,omitempty" zero:"write a block size in characters (default 128)"`
	// StaleAfter is the age past which engine signals are stale; default 1s.
	StaleAfter time.Duration `yaml:"stale_after,omitempty" zero:"write a duration (default 1s)"`
	// FailThreshold is the number of consecutive connect errors or 5xx
	// responses (but 501 and 505, which say nothing of the engine's health)
	// that eject an endpoint; default 3.
	FailThreshold int `yaml:"fail_threshold,omitempty" zero:"write a number of consecutive failures (default 3); a large one ejects almost never"`
	// BaseEjection is the first ejection's length, doubled on each
	// consecutive ejection; default 1s.
	BaseEjection time.Duration `yaml:"base_ejection,omitempty" zero:"write a duration (default 1s)"`
	// MaxEjection caps the ejection length; default 30s.
	MaxEjection time.Duration `yaml:"max_ejection,omitempty" zero:"write a duration, at least router.base_ejection (default 30s)"`
	// DecisionLog is the number of recent decisions kept for
	// /debug/decisions; default 256, at most MaxDecisionLog (the log is
	// allocated whole at start, some 300 bytes a decision).
	DecisionLog int `yaml:"decision_log,omitempty" zero:"the log keeps at least one decision (default 256)"`
	// Session says where a request's session (or document) affinity key
	// comes from; the first source that gives one wins.
	Session Session `yaml:"session"`
}

// SessionField is the body field carrying session keys (every model that
// sets one sets the same; Validate checks it), or "".
func (c *Config) SessionField() string {
	for _, m := range c.Models {
		if f := m.Router.Session.JSONField; f != "" {
			return f
		}
	}
	return ""
}

// Session configures the session and document affinity key of requests:
// requests with the same key go to the same endpoint (consistent hashing
// with bounded loads), unless it is over its load cap.
type Session struct {
	// Header is the request header carrying the key; default X-Session-Id.
	Header string `yaml:"header,omitempty" zero:"leave it out for X-Session-Id; a request without the header takes its key from json_field, prompt_regexp or user"`
	// JSONField is a top-level field of the request body carrying the key
	// (e.g. "doc_id"; a string, or a number's text); default none.
	JSONField string `yaml:"json_field"`
	// PromptRegexp is a regular expression (Go RE2 syntax) matched against
	// the prompt (for chat, the messages' text): its first capture group,
	// or the whole match without one, is the key, e.g. a document ID in a
	// RAG prompt; default none.
	PromptRegexp string `yaml:"prompt_regexp"`
	// User uses the request's "user" field as the key when nothing above
	// gave one; default false (the user field is the tenant).
	User bool `yaml:"user"`
}

// Timeouts bound the client and upstream sides of a request. A negative
// duration is invalid, and so is a 0 written in the file for a field with
// a default (0s, which net/http reads as no limit, would have become the
// default): only UpstreamHeader takes 0, no limit.
type Timeouts struct {
	// ReadHeader bounds reading a client's request headers; default 10s.
	ReadHeader time.Duration `yaml:"read_header,omitempty" zero:"a client that never finishes its headers would hold its connection for ever; write a duration (default 10s)"`
	// ReadBody bounds reading a client's request body; default 60s.
	ReadBody time.Duration `yaml:"read_body,omitempty" zero:"a client that stalls its body would hold its connection and request for ever; write a duration (default 60s)"`
	// Idle bounds an idle client keep-alive connection; default 120s.
	Idle time.Duration `yaml:"idle,omitempty" zero:"idle client connections would be held for ever; write a duration (default 120s)"`
	// Dial bounds connecting to an engine; default 5s.
	Dial time.Duration `yaml:"dial,omitempty" zero:"a connect to an engine that does not answer would wait for the system's TCP timeout (minutes); write a duration (default 5s)"`
	// UpstreamIdle is how long an idle connection to an engine is kept for
	// the next request; default 4s. Engines close idle connections
	// themselves: vLLM and SGLang serve through uvicorn, which closes a
	// connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and a
	// request sent on a connection as the engine closes it is lost (it
	// fails without an answer; a POST is not resent by the transport, so
	// it counts against the engine and is retried elsewhere, if at all).
	// Keep it below the engines' keep-alive timeout.
	UpstreamIdle time.Duration `yaml:"upstream_idle,omitempty" zero:"idle connections to engines would be kept past the engines' own keep-alive (5s for vLLM and SGLang), and a request sent on one as the engine closes it is lost; write a duration below it (default 4s)"`
	// UpstreamHeader bounds the wait for an engine's response headers (for
	// non-streaming requests that is the whole generation), and then each
	// silence of the response while the router waits for its next bytes (on
	// an aggregated pool a wait for the first body byte is answered 504 and
	// not retried, as a wait for the headers; a stream from an engine that
	// hangs mid-answer ends with a 504 error event, a JSON body is aborted, a 5xx body still being read is retried
	// without it or answered 504; time spent waiting for a slow client does
	// not count), on aggregated and P/D pools alike; default 0, no limit.
	UpstreamHeader time.Duration `yaml:"upstream_header"`
	// Shutdown is how long in-flight requests may drain on SIGTERM/SIGINT
	// before the router closes them; default 30s. A written 0s is refused
	// (it became 30s): 1ms closes them at once.
	Shutdown time.Duration `yaml:"shutdown,omitempty" zero:"to close in-flight requests at once, without a drain, write 1ms (default 30s)"`
}

// Limits bound what a client may send.
type Limits struct {
	// MaxBodyBytes is the largest request body accepted (413 past it);
	// default 16 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes,omitempty" zero:"every request would be refused; write a size in bytes (default 16777216)"`
	// MaxHeaderBytes is the largest request header block accepted; default
	// 1 MiB.
	MaxHeaderBytes int `yaml:"max_header_bytes,omitempty" zero:"write a size in bytes (default 1048576)"`
}

// Retry controls retries, on another endpoint, of requests that failed
// before the first response byte reached the client: a connect error, a
// connection that failed after the request was sent and before the
// response's first body byte (the engine may have run part of the work: an
// engine that crashed mid-generation, or after a stream's headers; the
// headers reach the client only with that byte), or a 5xx response but
// 501 and 505 (another engine would answer the same). A
// response whose headers, or first body byte, took longer than
// timeouts.upstream_header is not retried.
type Retry struct {
	// Attempts is the total number of endpoints tried per request, the first
	// included; default 2. 1 disables retries (a written 0 is refused).
	Attempts int `yaml:"attempts,omitempty" zero:"1 tries one endpoint, without retries"`
	// QueueWait is how long a request the policy asks to queue (kv-aware's
	// overload: queue, when every endpoint is over its cap) is held before
	// it is answered 429; it is routed again as load drains. A request
	// arriving while others are held waits in line behind them, for as
	// long at most. Default 5s.
	QueueWait time.Duration `yaml:"queue_wait,omitempty" zero:"to answer 429 at once rather than hold the request, write 1ms (default 5s)"`
}

// HealthCheck controls active health checks (GET Path on every endpoint).
type HealthCheck struct {
	// Disabled turns active checks off; passive ejection still applies.
	// Default false.
	Disabled bool `yaml:"disabled"`
	// Path is the path probed on each endpoint; default "/health".
	Path string `yaml:"path,omitempty" zero:"leave it out for /health; to probe nothing, write disabled: true"`
	// Interval is the time between two checks of one endpoint, at least
	// MinInterval; default 5s.
	Interval time.Duration `yaml:"interval,omitempty" zero:"to turn active health checks off, write disabled: true"`
	// Timeout bounds one check; default 2s, and at most Interval.
	Timeout time.Duration `yaml:"timeout,omitempty" zero:"write a duration, at most health_check.interval (default 2s)"`
	// HealthyThreshold is the number of consecutive successful checks that
	// mark an unhealthy endpoint healthy; default 1.
	HealthyThreshold int `yaml:"healthy_threshold,omitempty" zero:"1 marks an endpoint healthy again on its first successful check (the default)"`
	// UnhealthyThreshold is the number of consecutive failed checks that
	// mark an endpoint unhealthy; default 2.
	UnhealthyThreshold int `yaml:"unhealthy_threshold,omitempty" zero:"1 marks an endpoint unhealthy on its first failed check (default 2)"`
}

// Admin configures the admin API (PUT /admin/policy).
type Admin struct {
	// Token is the bearer token the admin API requires, at least 16
	// characters, without leading or trailing white space or control
	// characters (no Authorization header would carry them); default "",
	// which disables the admin API.
	Token string `yaml:"token"`
}

// Debug enables debug endpoints and headers.
type Debug struct {
	// Enabled serves GET /debug/decisions to everyone and adds the
	// x-kvroute-endpoint response header; default false (then
	// /debug/decisions needs the admin token).
	Enabled bool `yaml:"enabled"`
}

// Log configures the router's own logs.
type Log struct {
	// Format is "text" or "json"; default "text".
	Format string `yaml:"format"`
	// Level is debug, info, warn or error; default "info".
	Level string `yaml:"level"`
}

// Defaults.
const (
	DefaultListen             = ":8080"
	DefaultPolicy             = "kv-aware"
	DefaultBlockChars         = 128
	DefaultStaleAfter         = time.Second
	DefaultFailThreshold      = 3
	DefaultBaseEjection       = time.Second
	DefaultMaxEjection        = 30 * time.Second
	DefaultDecisionLog        = 256
	DefaultSessionHeader      = "X-Session-Id"
	DefaultReadHeader         = 10 * time.Second
	DefaultReadBody           = 60 * time.Second
	DefaultIdle               = 120 * time.Second
	DefaultDial               = 5 * time.Second
	DefaultUpstreamIdle       = 4 * time.Second
	DefaultShutdown           = 30 * time.Second
	DefaultMaxBodyBytes       = 16 << 20
	DefaultMaxHeaderBytes     = 1 << 20
	DefaultAttempts           = 2
	DefaultQueueWait          = 5 * time.Second
	DefaultHealthPath         = "/health"
	DefaultHealthInterval     = 5 * time.Second
	DefaultHealthTimeout      = 2 * time.Second
	DefaultHealthyThreshold   = 1
	DefaultUnhealthyThreshold = 2
	DefaultLogFormat          = "text"
	DefaultLogLevel           = "info"
	DefaultScrapeInterval     = 100 * time.Millisecond
	DefaultScrapeTimeout      = time.Second
	DefaultMetricsFlavor      = "auto"
	DefaultMetricsPath        = "/metrics"
	DefaultPreciseBlockSize   = 16
	DefaultTokenizerCache     = 1 << 20
	DefaultIndexCapacity      = 1 << 23
	// BuiltinTokenizer is the precise.tokenizer value of the built-in
	// tokenizer.
	BuiltinTokenizer = "builtin"
)

// MaxDecisionLog bounds router.decision_log: the log is allocated whole at
// start, and a large one took the router down (runtime: out of memory).
const MaxDecisionLog = 100000

// ApplyDefaults replaces zero values by their documented defaults, in place.
// It never overwrites a value that was set, valid or not.
func (c *Config) ApplyDefaults() {
	setDefault(&c.Listen, DefaultListen)
	for i := range c.Models {
		c.Models[i].applyDefaults()
	}
	t := &c.Timeouts
	setDefault(&t.ReadHeader, DefaultReadHeader)
	setDefault(&t.ReadBody, DefaultReadBody)
	setDefault(&t.Idle, DefaultIdle)
	setDefault(&t.Dial, DefaultDial)
	setDefault(&t.UpstreamIdle, DefaultUpstreamIdle)
	setDefault(&t.Shutdown, DefaultShutdown)
	setDefault(&c.Limits.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&c.Limits.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&c.Retry.Attempts, DefaultAttempts)
	setDefault(&c.Retry.QueueWait, DefaultQueueWait)
	h := &c.HealthCheck
	setDefault(&h.Path, DefaultHealthPath)
	setDefault(&h.Interval, DefaultHealthInterval)
	setDefault(&h.Timeout, min(DefaultHealthTimeout, h.Interval))
	setDefault(&h.HealthyThreshold, DefaultHealthyThreshold)
	setDefault(&h.UnhealthyThreshold, DefaultUnhealthyThreshold)
	setDefault(&c.Log.Format, DefaultLogFormat)
	setDefault(&c.Log.Level, DefaultLogLevel)
}

// InheritSignals fills the endpoint's own signals settings left unset
// (scrape interval and timeout, flavour) from its model's, s, as
// ApplyDefaults does.
func (e *Endpoint) InheritSignals(s *Signals) {
	es := &e.Signals
	setDefault(&es.ScrapeInterval, s.ScrapeInterval)
	setDefault(&es.ScrapeTimeout, s.ScrapeTimeout)
	setDefault(&es.Flavor, s.Flavor)
}

func (m *Model) applyDefaults() {
	m.PD.applyDefaults()
	for i := range m.Endpoints {
		e := &m.Endpoints[i]
		setDefault(&e.ID, e.URL)
		setDefault(&e.Role, kvroute.RoleBoth.String())
		setDefault(&e.Weight, 1)
		setDefault(&e.DataParallelSize, 1)
	}
	setDefault(&m.Policy.Name, DefaultPolicy)
	r := &m.Router
	setDefault(&r.BlockChars, DefaultBlockChars)
	setDefault(&r.StaleAfter, DefaultStaleAfter)
	setDefault(&r.FailThreshold, DefaultFailThreshold)
	setDefault(&r.BaseEjection, DefaultBaseEjection)
	setDefault(&r.MaxEjection, max(DefaultMaxEjection, r.BaseEjection))
	setDefault(&r.DecisionLog, DefaultDecisionLog)
	setDefault(&r.Session.Header, DefaultSessionHeader)
	sg := &m.Signals
	setDefault(&sg.ScrapeInterval, DefaultScrapeInterval)
	setDefault(&sg.ScrapeTimeout, DefaultScrapeTimeout)
	setDefault(&sg.StaleAfter, r.StaleAfter)
	setDefault(&sg.Flavor, DefaultMetricsFlavor)
	setDefault(&sg.MetricsPath, DefaultMetricsPath)
	for i := range m.Endpoints {
		m.Endpoints[i].InheritSignals(sg)
	}
	if m.Precise.Enabled() {
		pr := &m.Precise
		setDefault(&pr.BlockSize, DefaultPreciseBlockSize)
		setDefault(&pr.CacheTokens, DefaultTokenizerCache)
		setDefault(&pr.IndexCapacity, DefaultIndexCapacity)
	}
	m.applyDiscoveryDefaults()
}

// MetricsURL returns the URL scraped for endpoint i ("" when scraping is
// disabled for it) on a model whose defaults are applied.
func (m *Model) MetricsURL(i int) string {
	e := &m.Endpoints[i]
	switch {
	case m.Signals.Disabled || e.Signals.Disabled:
		return ""
	case e.Signals.MetricsURL != "":
		return e.Signals.MetricsURL
	}
	return strings.TrimRight(e.URL, "/") + m.Signals.MetricsPath
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// FieldError is one invalid field: its path (YAML names, e.g.
// models[0].endpoints[2].url) and what is wrong with it.
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

// Errors is the list of every problem Validate found, in field order.
type Errors []*FieldError

func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

type validator struct{ errs Errors }

func (v *validator) addf(path, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) nonNegative(path string, d time.Duration) {
	if d < 0 {
		v.addf(path, "%s is negative", d)
	}
}

func (v *validator) positiveDuration(path string, d time.Duration) {
	if d <= 0 {
		v.addf(path, "%s is not positive", d)
	}
}

// MinInterval is the shortest health_check.interval and
// signals.scrape_interval: below it the router would probe or scrape its
// engines continuously.
const MinInterval = time.Millisecond

// interval checks a probe or scrape interval: positive, and at least
// MinInterval.
func (v *validator) interval(path string, d time.Duration) {
	switch {
	case d <= 0:
		v.addf(path, "%s is not positive", d)
	case d < MinInterval:
		v.addf(path, "%s is shorter than %s: the router would probe its engines continuously", d, MinInterval)
	}
}

// fresh reports a scrape interval that is not below the age at which
// scraped signals go stale: every signal would be stale before the next
// scrape replaced it, and routing would fall back on router-local counts
// most of the time without saying so.
func (v *validator) fresh(path string, interval, staleAfter time.Duration) {
	if interval > 0 && staleAfter > 0 && interval >= staleAfter {
		v.addf(path, "%s is not shorter than signals.stale_after (%s): each scrape would go stale before the next; shorten the interval or raise stale_after", interval, staleAfter)
	}
}

// urlPath checks a path the router appends to every endpoint's URL
// (health_check.path, signals.metrics_path): it starts with / and parses
// as a URL's path (and query). One that does not parse (an invalid %
// escape) made every probe or scrape fail before it was sent: every
// endpoint failed its health checks, with no error logged.
func (v *validator) urlPath(path, p string) {
	if !strings.HasPrefix(p, "/") {
		v.addf(path, "%q does not start with /", p)
		return
	}
	if _, err := url.Parse("http://host" + p); err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		v.addf(path, "%q is not a URL path: %v", p, err)
	}
}

// finite reports a float field that is NaN or infinite (YAML's .nan and
// .inf decode without an error) and says whether it is finite, so the
// caller checks its range only then: every comparison with NaN is false,
// so a range check alone lets it through.
func (v *validator) finite(path string, x float64) bool {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		v.addf(path, "%v is not a finite number", x)
		return false
	}
	return true
}

func (v *validator) positive(path string, n int64) {
	if n <= 0 {
		v.addf(path, "%d is not positive", n)
	}
}

// weight checks an endpoint's weight: 1 to kvroute.MaxWeight.
func (v *validator) weight(path string, w int) {
	if w <= 0 {
		v.addf(path, "%d is not positive", w)
	} else if w > kvroute.MaxWeight {
		v.addf(path, "%d is above the largest weight, %d", w, kvroute.MaxWeight)
	}
}

// flavor checks a metrics flavour: one of MetricsFlavors.
func (v *validator) flavor(path, f string) {
	if !validFlavor(f) {
		v.addf(path, "%q is not one of %s", f, strings.Join(MetricsFlavors, ", "))
	}
}

// Validate reports every invalid field of a config on which ApplyDefaults
// has run. The error is an Errors value (use errors.As to list them).
func (c *Config) Validate() error {
	v := &validator{}
	if c.Listen == "" {
		v.addf("listen", "is empty")
	} else if _, port, err := net.SplitHostPort(c.Listen); err != nil {
		v.addf("listen", "%q is not a host:port address", c.Listen)
	} else if n, err := strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
		v.addf("listen", "%q has port %d, not 0-65535", c.Listen, n)
	} else if _, err := net.LookupPort("tcp", port); err != nil {
		v.addf("listen", "%q: port %q is not a number or a known service name", c.Listen, port)
	}
	if len(c.Models) == 0 {
		v.addf("models", "at least one model is required")
	}
	names := map[string]int{}
	for i := range c.Models {
		m := &c.Models[i]
		p := fmt.Sprintf("models[%d]", i)
		if j, dup := names[m.Name]; dup && m.Name != "" {
			v.addf(p+".name", "%q duplicates models[%d].name", m.Name, j)
		} else {
			names[m.Name] = i
		}
		m.validate(v, p)
	}
	c.checkAdapterNames(v)
	c.checkBoundKVEvents(v)
	// The request scanner reads one session field for every model (it
	// runs before the model is known).
	field, first := "", 0
	for i, m := range c.Models {
		if f := m.Router.Session.JSONField; f != "" {
			if field == "" {
				field, first = f, i
			} else if f != field {
				v.addf(fmt.Sprintf("models[%d].router.session.json_field", i), "%q differs from models[%d]'s %q; every model that sets one must use the same field", f, first, field)
			}
		}
	}
	t := c.Timeouts
	v.nonNegative("timeouts.read_header", t.ReadHeader)
	v.nonNegative("timeouts.read_body", t.ReadBody)
	v.nonNegative("timeouts.idle", t.Idle)
	v.nonNegative("timeouts.dial", t.Dial)
	v.nonNegative("timeouts.upstream_idle", t.UpstreamIdle)
	v.nonNegative("timeouts.upstream_header", t.UpstreamHeader)
	v.nonNegative("timeouts.shutdown", t.Shutdown)
	v.positive("limits.max_body_bytes", c.Limits.MaxBodyBytes)
	v.positive("limits.max_header_bytes", int64(c.Limits.MaxHeaderBytes))
	v.positive("retry.attempts", int64(c.Retry.Attempts))
	v.positiveDuration("retry.queue_wait", c.Retry.QueueWait)
	h := c.HealthCheck
	v.urlPath("health_check.path", h.Path)
	v.interval("health_check.interval", h.Interval)
	v.positive("health_check.timeout", int64(h.Timeout))
	if h.Timeout > h.Interval && h.Interval > 0 {
		v.addf("health_check.timeout", "%s is longer than health_check.interval (%s)", h.Timeout, h.Interval)
	}
	v.positive("health_check.healthy_threshold", int64(h.HealthyThreshold))
	v.positive("health_check.unhealthy_threshold", int64(h.UnhealthyThreshold))
	for i, s := range c.TrustedClients {
		if _, err := ParsePrefix(s); err != nil {
			v.addf(fmt.Sprintf("trusted_clients[%d]", i), "%q is not an IP address or CIDR prefix", s)
		}
	}
	if c.Admin.Token != "" && len(c.Admin.Token) < 16 {
		v.addf("admin.token", "is shorter than 16 characters")
	} else if !headerToken(c.Admin.Token) {
		// (The token itself is not in the message: it is a secret.)
		v.addf("admin.token", "starts or ends with white space, or holds a control character: no Authorization header carries it as it is, so every token sent would be refused")
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		v.addf("log.format", "%q is not one of text, json", c.Log.Format)
	}
	if _, err := ParseLevel(c.Log.Level); err != nil {
		v.addf("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

func (m *Model) validate(v *validator, p string) {
	if strings.TrimSpace(m.Name) == "" {
		v.addf(p+".name", "is empty")
	}
	if len(m.Endpoints) == 0 && m.Discovery == nil {
		v.addf(p+".endpoints", "at least one endpoint is required")
	}
	m.validateDiscovery(v, p)
	m.PD.validate(v, p+".pd")
	ids := map[string]int{}
	engines := map[string]int{} // engine URL and role -> first endpoint
	decoders := 0
	for i := range m.Endpoints {
		e := &m.Endpoints[i]
		ep := fmt.Sprintf("%s.endpoints[%d]", p, i)
		sameEngine := false
		if err := checkURL(e.URL, false); err != nil {
			v.addf(ep+".url", "%q %v", e.URL, err)
		} else if base, ok := strings.CutSuffix(strings.TrimRight(e.URL, "/"), "/v1"); ok {
			// An OpenAI client's base URL: the requests would go to
			// /v1/v1/..., the scrapes and health checks to /v1/metrics
			// and /v1/health.
			v.addf(ep+".url", "%q ends in /v1: give the engine's base URL (%s); the router adds each request's /v1/... path", e.URL, base)
		} else if r, err := kvroute.ParseRole(e.Role); err == nil {
			// One engine listed twice in a role would take twice its share
			// of the pool's requests under two names.
			key := engineKey(e.URL) + " " + r.String()
			if j, dup := engines[key]; dup {
				v.addf(ep+".url", "%q is the engine of %s.endpoints[%d] again; list each engine once", e.URL, p, j)
				sameEngine = true
			} else {
				engines[key] = i
			}
		}
		if e.ID == "" {
			v.addf(ep+".id", "is empty")
		} else if j, dup := ids[e.ID]; !dup {
			ids[e.ID] = i
		} else if !sameEngine { // else reported for the url
			v.addf(ep+".id", "%q duplicates %s.endpoints[%d].id", e.ID, p, j)
		}
		m.validateDataParallel(v, p, i)
		if r, err := kvroute.ParseRole(e.Role); err != nil {
			v.addf(ep+".role", "%q is not one of both, prefill, decode", e.Role)
			decoders++ // reported above; no second error for the pool
		} else if r.CanDecode() {
			decoders++
		}
		v.weight(ep+".weight", e.Weight)
		if bp, ok := e.Labels[kvroute.LabelBootstrapPort]; ok {
			// A bad one would send every SGLang handoff to the default port.
			if n, err := strconv.Atoi(bp); err != nil || n < 1 || n > 65535 {
				v.addf(ep+".labels."+kvroute.LabelBootstrapPort, "%q is not a port 1-65535", bp)
			}
		}
		if e.KVCapacityTokens < 0 {
			v.addf(ep+".kv_capacity_tokens", "%d is negative", e.KVCapacityTokens)
		}
		es := e.Signals
		if es.ScrapeInterval != m.Signals.ScrapeInterval { // else reported for the model
			v.interval(ep+".signals.scrape_interval", es.ScrapeInterval)
			if !es.Disabled && !m.Signals.Disabled {
				v.fresh(ep+".signals.scrape_interval", es.ScrapeInterval, m.Signals.StaleAfter)
			}
		}
		if es.ScrapeTimeout != m.Signals.ScrapeTimeout {
			v.positiveDuration(ep+".signals.scrape_timeout", es.ScrapeTimeout)
		}
		if es.Flavor != m.Signals.Flavor { // else reported for the model
			v.flavor(ep+".signals.flavor", es.Flavor)
		}
		if es.MetricsURL != "" {
			if err := checkURL(es.MetricsURL, true); err != nil {
				v.addf(ep+".signals.metrics_url", "%q %v", es.MetricsURL, err)
			}
		}
		ev := e.KVEvents
		switch {
		case ev.Address == "" && (ev.ReplayAddress != "" || ev.Topic != "" || ev.Listen || ev.ReplayBufferSteps != 0):
			v.addf(ep+".kv_events.address", "is empty but other kv_events fields are set")
		case ev.Address != "" && !m.Precise.Enabled():
			v.addf(ep+".kv_events", "needs %s.precise.tokenizer: KV events are matched on token ids", p)
		}
		if ev.Address != "" {
			if err := zmqaddr.Check(ev.Address, true); err != nil { // a "*" host implies listen
				v.addf(ep+".kv_events.address", "%v", err)
			}
		}
		var replayErr error
		if ev.ReplayAddress != "" {
			replayErr = zmqaddr.Check(ev.ReplayAddress, false) // the engine's ROUTER: always dialled
		}
		if replayErr != nil {
			v.addf(ep+".kv_events.replay_address", "%v", replayErr)
		} else if e.DataParallelSize <= 1 && sameZMQAddress(ev.Address, ev.ReplayAddress) { // (a data-parallel endpoint's overlap is reported by validateDataParallel)
			v.addf(ep+".kv_events.replay_address", "%q is kv_events.address again: the engine's replay socket (vLLM's replay_endpoint, a ROUTER) and its event socket (PUB) are two sockets on two addresses", ev.ReplayAddress)
		}
		if ev.ReplayBufferSteps < 0 {
			v.addf(ep+".kv_events.replay_buffer_steps", "%d is negative", ev.ReplayBufferSteps)
		}
	}
	checkRankIDs(v, p, m.Endpoints)
	m.validateAdapters(v, p)
	if len(m.Endpoints) > 0 && decoders == 0 {
		// A prefill engine hands its KV cache to a decode engine and
		// generates nothing itself: such a pool would answer every request
		// with a 503.
		v.addf(p+".endpoints", "every endpoint has role prefill: at least one needs role both or decode to generate tokens")
	}
	sg := m.Signals
	v.interval(p+".signals.scrape_interval", sg.ScrapeInterval)
	v.positiveDuration(p+".signals.scrape_timeout", sg.ScrapeTimeout)
	v.positiveDuration(p+".signals.stale_after", sg.StaleAfter)
	if !sg.Disabled {
		v.fresh(p+".signals.scrape_interval", sg.ScrapeInterval, sg.StaleAfter)
	}
	v.flavor(p+".signals.flavor", sg.Flavor)
	v.urlPath(p+".signals.metrics_path", sg.MetricsPath)
	if pr := m.Precise; pr.Enabled() {
		v.positive(p+".precise.block_size", int64(pr.BlockSize))
		v.positive(p+".precise.cache_tokens", int64(pr.CacheTokens))
		v.positive(p+".precise.index_capacity", int64(pr.IndexCapacity))
	} else if pr.BlockSize != 0 || pr.CacheTokens != 0 || pr.IndexCapacity != 0 {
		v.addf(p+".precise.tokenizer", "is empty but other precise fields are set")
	}
	if strings.TrimSpace(m.Policy.Name) == "" {
		v.addf(p+".policy.name", "is empty")
	}
	r := m.Router
	v.positive(p+".router.block_chars", int64(r.BlockChars))
	v.positive(p+".router.stale_after", int64(r.StaleAfter))
	v.positive(p+".router.fail_threshold", int64(r.FailThreshold))
	v.positive(p+".router.base_ejection", int64(r.BaseEjection))
	if r.MaxEjection < r.BaseEjection {
		v.addf(p+".router.max_ejection", "%s is shorter than router.base_ejection (%s)", r.MaxEjection, r.BaseEjection)
	}
	v.positive(p+".router.decision_log", int64(r.DecisionLog))
	if r.DecisionLog > MaxDecisionLog {
		v.addf(p+".router.decision_log", "%d is above %d (the log is allocated whole at start)", r.DecisionLog, MaxDecisionLog)
	}
	if r.Session.PromptRegexp != "" {
		if re, err := regexp.Compile(r.Session.PromptRegexp); err != nil {
			v.addf(p+".router.session.prompt_regexp", "%q does not compile: %v", r.Session.PromptRegexp, err)
		} else if re.NumSubexp() > 1 {
			v.addf(p+".router.session.prompt_regexp", "%q has %d capture groups; want at most one (the key)", r.Session.PromptRegexp, re.NumSubexp())
		}
	}
	if h := r.Session.Header; strings.TrimSpace(h) == "" || strings.ContainsAny(h, " :\t\r\n") {
		v.addf(p+".router.session.header", "%q is not a header name", h)
	} else if strings.HasPrefix(strings.ToLower(h), "x-kvroute-") {
		v.addf(p+".router.session.header", "%q is in the router's X-Kvroute- namespace, whose headers the router drops from untrusted clients: name another header", h)
	}
}

// checkAdapterNames reports a LoRA adapter name (models[i].adapters) that
// is empty, or that another model's name or adapter (or the same model's)
// is too: the request's "model" field must name one pool, and one
// adapter in it.
func (c *Config) checkAdapterNames(v *validator) {
	where := map[string]string{} // name -> the field that has it first
	for i := range c.Models {
		if n := c.Models[i].Name; n != "" {
			if _, dup := where[n]; !dup {
				where[n] = fmt.Sprintf("models[%d].name", i)
			}
		}
	}
	for i := range c.Models {
		for k, a := range c.Models[i].Adapters {
			path := fmt.Sprintf("models[%d].adapters[%d]", i, k)
			if strings.TrimSpace(a) == "" {
				v.addf(path, "is empty")
				continue
			}
			if w, dup := where[a]; dup {
				v.addf(path, "%q is %s too: a request's model field must name one model or adapter", a, w)
				continue
			}
			where[a] = path
		}
	}
}

// validateAdapters reports an endpoint's adapter (endpoints[j].adapters)
// that is not one of the model's, or listed twice, and a model adapter no
// endpoint serves (every endpoint lists its own and none lists it).
func (m *Model) validateAdapters(v *validator, p string) {
	served := map[string]bool{}
	all := false // an endpoint serves every adapter of the model
	for j := range m.Endpoints {
		e := &m.Endpoints[j]
		if len(e.Adapters) == 0 {
			all = true
			continue
		}
		m.checkEndpointAdapters(v, fmt.Sprintf("%s.endpoints[%d]", p, j), e.Adapters)
		for _, a := range e.Adapters {
			served[a] = true
		}
	}
	if all || len(m.Endpoints) == 0 {
		return
	}
	for k, a := range m.Adapters {
		if !served[a] && strings.TrimSpace(a) != "" {
			v.addf(fmt.Sprintf("%s.adapters[%d]", p, k), "%q is served by no endpoint: every endpoint lists its adapters, and none lists it", a)
		}
	}
}

// checkEndpointAdapters reports an adapter of the endpoint (or discovery
// template) at path ep that is not one of the model's, or listed twice.
func (m *Model) checkEndpointAdapters(v *validator, ep string, adapters []string) {
	seen := make(map[string]int, len(adapters))
	for k, a := range adapters {
		path := fmt.Sprintf("%s.adapters[%d]", ep, k)
		switch prev, dup := seen[a]; {
		case dup:
			v.addf(path, "%q duplicates adapters[%d]", a, prev)
		case !slices.Contains(m.Adapters, a):
			v.addf(path, "%q is not one of the model's adapters: list it there too (the model's adapters are the whole set)", a)
		}
		seen[a] = k
	}
}

// checkBoundKVEvents reports a kv_events address the router binds
// (listen, or a "*" host; each data-parallel rank's at its own port) that
// another endpoint, of any model, binds too: the second bind fails, and
// that endpoint's events never arrive.
func (c *Config) checkBoundKVEvents(v *validator) {
	type bind struct{ host, path string }
	tcp := map[int][]bind{} // by port
	other := map[string]string{}
	wild := func(h string) bool { return h == "*" || h == "0.0.0.0" || h == "[::]" || h == "::" }
	owner := func(addr, path string) string {
		h, port, ok := tcpPort(addr)
		if !ok {
			if o, dup := other[addr]; dup {
				return o
			}
			other[addr] = path
			return ""
		}
		h = strings.ToLower(h)
		for _, b := range tcp[port] {
			if b.host == h || wild(b.host) || wild(h) {
				return b.path
			}
		}
		tcp[port] = append(tcp[port], bind{h, path})
		return ""
	}
	for i, m := range c.Models {
		for j, e := range m.Endpoints {
			ev := e.KVEvents
			if ev.Address == "" || !(ev.Listen || strings.Contains(ev.Address, "*")) || zmqaddr.Check(ev.Address, true) != nil {
				continue
			}
			path := fmt.Sprintf("models[%d].endpoints[%d].kv_events.address", i, j)
			first, n := 0, 1
			if e.DataParallelSize > 1 {
				first, n = e.DataParallelStartRank, e.DataParallelSize
			}
			for r := first; r < first+n; r++ {
				addr, err := DataParallelAddress(ev.Address, r)
				if err != nil {
					break // reported by validateDataParallel
				}
				if o := owner(addr, path); o != "" {
					v.addf(path, "%q (bound at %s) is bound by %s too: each endpoint's events need an address of their own", ev.Address, addr, o)
					break
				}
			}
		}
	}
}

// sameZMQAddress reports whether two ZMQ addresses, neither "", name one
// socket: the same text, or tcp:// addresses with the same host (without
// case) and port.
func sameZMQAddress(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	if a == b {
		return true
	}
	h1, p1, ok1 := tcpPort(a)
	h2, p2, ok2 := tcpPort(b)
	return ok1 && ok2 && p1 == p2 && strings.EqualFold(h1, h2)
}

func validFlavor(f string) bool {
	for _, g := range MetricsFlavors {
		if f == g {
			return true
		}
	}
	return false
}

// engineKey is a checked URL as the engine it names: scheme and host
// without case, an IP address in its canonical form, the port as a number
// (the scheme's default when none is given), the path without a trailing
// slash.
func engineKey(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	scheme, host := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname())
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	port := u.Port()
	if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n)
	} else if port == "" && scheme == "https" {
		port = "443"
	} else if port == "" {
		port = "80"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + strings.TrimRight(u.Path, "/")
}

// checkURL checks an http(s) URL with a host and no user info or
// fragment; a query only when query is set (a metrics URL may need one:
// llama.cpp's router mode serves a model's metrics at /metrics?model=NAME).
func checkURL(s string, query bool) error {
	u, err := url.Parse(s)
	switch {
	case s == "":
		return errors.New("is empty")
	case err != nil || (u.Scheme != "http" && u.Scheme != "https"):
		return errors.New("is not an http(s) URL")
	case u.Hostname() == "":
		return errors.New("has no host")
	case query && u.Fragment != "":
		return errors.New("has a fragment")
	case !query && (u.RawQuery != "" || u.Fragment != ""):
		return errors.New("has a query or fragment")
	case u.User != nil:
		return errors.New("has user info")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("has port %s, not 1-65535", p)
		}
	}
	return nil
}

// headerToken reports whether tok can arrive intact in a request header:
// HTTP servers strip a value's leading and trailing white space, and a
// control character (a YAML block scalar's final newline) cannot be sent.
func headerToken(tok string) bool {
	if strings.Trim(tok, " \t") != tok {
		return false
	}
	for _, c := range []byte(tok) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// ParsePrefix parses a trusted-client entry: a CIDR prefix (10.0.0.0/8) or
// a single IP address (a /32 or /128 prefix).
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// ParseLevel parses a log level name.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// Model returns the model named name, or nil.
func (c *Config) Model(name string) *Model {
	for i := range c.Models {
		if c.Models[i].Name == name {
			return &c.Models[i]
		}
	}
	return nil
}

// AdapterModel returns the model that serves LoRA adapter name
// (Model.Adapters), or nil.
func (c *Config) AdapterModel(name string) *Model {
	for i := range c.Models {
		if slices.Contains(c.Models[i].Adapters, name) {
			return &c.Models[i]
		}
	}
	return nil
}

// ModelNames returns the configured model names, sorted.
func (c *Config) ModelNames() []string {
	out := make([]string, 0, len(c.Models))
	for _, m := range c.Models {
		out = append(out, m.Name)
	}
	sort.Strings(out)
	return out
}

// KVEndpoints converts a validated model's endpoints to the domain type,
// in config order, a data-parallel endpoint (data_parallel_size N > 1)
// expanded into its N ranks (see Endpoint.DataParallelSize).
func (m *Model) KVEndpoints() ([]kvroute.Endpoint, error) {
	out := make([]kvroute.Endpoint, 0, len(m.Endpoints))
	for i, e := range m.Endpoints {
		role, err := kvroute.ParseRole(e.Role)
		if err != nil {
			return nil, fmt.Errorf("models[%s].endpoints[%d].role: %w", m.Name, i, err)
		}
		labels := make(map[string]string, len(e.Labels))
		for k, v := range e.Labels {
			labels[k] = v
		}
		ke := kvroute.Endpoint{
			ID:               e.ID,
			URL:              strings.TrimRight(e.URL, "/"),
			Role:             role,
			Weight:           e.Weight,
			Labels:           labels,
			KVCapacityTokens: e.KVCapacityTokens,
		}
		if len(e.Adapters) > 0 {
			ke.Adapters = slices.Clone(e.Adapters)
			slices.Sort(ke.Adapters)
			ke.Adapters = slices.Compact(ke.Adapters)
		}
		if e.DataParallelSize <= 1 {
			out = append(out, ke)
			continue
		}
		for r := range e.DataParallelSize {
			rk := ke
			rk.ID = e.RankID(r)
			rk.DataParallelSize, rk.DataParallelRank = e.DataParallelSize, r
			if r > 0 { // each rank its own map: endpoints are immutable, but not shared
				rk.Labels = make(map[string]string, len(labels))
				for k, v := range labels {
					rk.Labels[k] = v
				}
			}
			out = append(out, rk)
		}
	}
	return out, nil
}
