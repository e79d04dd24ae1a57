package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
)

func init() {
	register(command{name: "serve", summary: "run the KV-cache-aware routing proxy", run: runServe})
}

const serveDescription = `Run the routing proxy in front of OpenAI-compatible inference engines (vLLM,
SGLang, llama.cpp server, the emulated 'kvroute engine').

POST /v1/completions and /v1/chat/completions are routed by their "model" field
to that model's pool of endpoints, using the model's routing policy, and
forwarded byte for byte; event streams are passed through chunk by chunk. A
connect error, a connection that failed after the request was sent and before
the response's first body byte (the engine may have run part of the work), or
a 5xx (not 501 or 505), all before the first response byte reached the client, is retried on
another endpoint (retry.attempts). GET /v1/models lists the models. The router's own
endpoints: /metrics (Prometheus), /healthz, /readyz, /debug/decisions and
/debug/endpoints (open with debug.enabled or --debug, else they need the admin token),
the live dashboard at /ui/ (the page is public; its data, /ui/api/state, is
guarded as /debug/* is), and PUT /admin/policy {"model","policy","params"}
(only with admin.token, sent as "Authorization: Bearer TOKEN").

Engine signals: every endpoint's /metrics (vLLM, SGLang, llama.cpp, TGI) is
scraped every signals.scrape_interval (100ms), a llama.cpp server's /slots too
(its busy slots and the KV tokens they hold; llama.cpp's /metrics no longer has
KV usage; without /slots, --no-slots, /metrics alone; without --metrics, llama.cpp's
default, /slots alone), and combined with the router's own
dispatches; signals older than signals.stale_after (1s) or failing scrapes are
reported stale and routing falls back on router-local counts. Precise mode
(precise.tokenizer: "builtin" or a HuggingFace model directory) tokenizes each
prompt as the engines do, chat rendered with the model's chat template, and
matches KV blocks; endpoints with kv_events (the engine's ZMQ publisher) feed a
precise index of what each engine really caches. The engines' reported cached
tokens are counted in kvroute_prefix_cached_tokens_total.

A vLLM server started with --data-parallel-size N (N engine cores, each with
its own KV cache, behind one URL) is routed as N endpoints, ID#dp0 ... ID#dp<N-1>,
when its endpoint sets data_parallel_size: N (quick mode: --data-parallel-size N):
each request is pinned to its rank with the X-Data-Parallel-Rank header (a
client's copy is dropped; a prefill/decode pool refuses it with 400
reserved_header), each rank reads its own engine="<rank>"
series of the one metrics scrape, and rank r's KV events are read at the
kv_events addresses' tcp port + r.

Configure it with a YAML file (--config; see kvroute.example.yaml for every
field and its default), or for the quick case with flags only:

  kvroute serve --listen :8080 --model llama --endpoint http://10.0.0.7:8000 \
      --endpoint http://10.0.0.8:8000 --policy least_request

--listen, --log-level, --log-format and --debug also override the file's values
(the file must still be valid by itself: an invalid listen under --listen is
refused at start as by --check-config, since it is what runs without the flag).
SIGINT/SIGTERM stop accepting connections and drain in-flight requests for up
to timeouts.shutdown; streams still running then end with an error event (a
second signal ends the process at once). Exit status: 0 once stopped by a
signal, 2 on a bad flag or flag value, 1 on another error (a config file that
cannot be read or is invalid, a listen address in use).

LoRA adapters: a model's adapters (models[].adapters, the names clients send
as the model; endpoints[].adapters for an engine that serves only some) are
routed in the model's pool: a request naming one goes only to an engine that
serves it, and /v1/models lists it with the model as its parent. Clients may
name one as SGLang does too ("model": "<model>:<adapter>", or "lora_path");
"model" and "lora_path" naming two adapters is a 400. The body reaches each
engine in the form it reads (signals.flavor, or the flavour its scrape
detected: vLLM's "model", SGLang's "lora_path"), else as sent. With no
healthy engine serving it the answer is 503 no_adapter_endpoint; an adapter
the model does not have is a 404.

SIGHUP (with --config) reads the file again and applies its models' endpoint
lists and LoRA adapters without a restart: engines added start taking requests (with their
metrics scrape, kv_events subscription and health check), engines removed take
no new ones while their requests in progress finish, and the engines that stay
keep their routing state (cache index, health, learned rates). An ID whose url
or role changed is a new engine. The whole file is validated first: an invalid file is
logged as an error naming the field, and nothing changes. Other changes
(models added or removed, listen, policies, timeouts, ...) need a restart: they
are logged and not applied. A P/D model's prefill and decode endpoints change
live the same way; a leg planned on an engine removed before it is sent is
placed again. kvroute_config_reloads_total{result} and
kvroute_config_last_reload_success_timestamp_seconds report reloads.

Kubernetes discovery: a model with discovery.kubernetes.service instead of
endpoints follows that Service's EndpointSlices (an informer, in-cluster config
or kubeconfig): each ready engine (pod) becomes an endpoint from the
discovery's endpoint template, at discovery.kubernetes.port; engines not ready
or terminating take no new requests and finish those in progress. Until one is
ready the model answers 503 with Retry-After and /readyz is 503 (a discovery
that cannot start, e.g. no cluster or kubeconfig: 503 discovery_not_running,
without Retry-After). A SIGHUP
leaves discovered endpoint lists alone (a changed discovery block needs a
restart). A P/D model lists a source per pool under discovery.sources (each
a kubernetes block, e.g. role prefill and role decode templates): its pool
takes their engines once each has listed, or after 30s those of the sources
that have; a source that cannot start leaves the model without endpoints (its
other sources' included) and answering discovery_not_running. An engine's ID
is its pod's name; <namespace>/<pod> when the sources watch several
namespaces; <cluster>/<namespace>/<pod> when they use several kubeconfigs,
the cluster named after its kubeconfig file (base name without extension,
"local" for the default). A P/D model is ready (/readyz) only with a healthy
endpoint that can decode.
kvroute_discovery_endpoints{model} and
kvroute_discovery_errors_total{model} report it.

Policies: %s. An endpoint's weight (default 1) is honoured by round_robin
(smooth weighted), random, least_request and power_of_two (in-flight per
weight): weight 2 takes about twice the requests of weight 1; kv-aware scales
its load bounds and session ring by it, not its TTFT estimate; the peers'
policies ignore it.`

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", "--config FILE | --model NAME --endpoint URL... [flags]",
		fmt.Sprintf(serveDescription, strings.Join(policy.Names(), ", ")), stdout, stderr)
	var (
		configFile = fs.String("config", "", "YAML config `file`")
		checkFile  = fs.String("check-config", "", "validate the YAML config `file` (including policies and their params, and the --listen, --log-level and --log-format given over it), print a summary and exit")
		listen     = fs.String("listen", "", "listen `address` (default \""+config.DefaultListen+"\", or the config's listen)")
		model      = fs.String("model", "", "quick mode: the served model `name` (instead of --config)")
		policyName = fs.String("policy", "", "quick mode: the routing `policy` (default \""+config.DefaultPolicy+"\")")
		logLevel   = fs.String("log-level", "", "log `level`: debug, info, warn, error (default \"info\", or the config's log.level)")
		logFormat  = fs.String("log-format", "", "log `format`: text or json (default \"text\", or the config's log.format)")
		debug      = fs.Bool("debug", false, "open /debug/*, the dashboard's data and the "+proxy.HeaderEndpoint+" response header to every client (debug.enabled; trusted networks only: the admin token guards them otherwise)")
		dpSize     = fs.Int("data-parallel-size", 0, "quick mode: the data-parallel `ranks` behind each --endpoint (vLLM --data-parallel-size), each routed as an endpoint of its own (default 1)")
		endpoints  stringList
	)
	fs.Var(&endpoints, "endpoint", "quick mode: an engine's base `URL`, e.g. http://127.0.0.1:8000 (repeatable, or comma-separated)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "kvroute serve: "+format+"\n", a...)
		shortUsage(fs)
		return errUsage
	}

	// The flags that apply over a config file (at start, each reload, and
	// --check-config).
	overlay := func(c *config.Config) {
		if *listen != "" {
			c.Listen = *listen
		}
		if *logLevel != "" {
			c.Log.Level = *logLevel
		}
		if *logFormat != "" {
			c.Log.Format = *logFormat
		}
		if *debug {
			c.Debug.Enabled = true
		}
	}

	if *checkFile != "" {
		// It checks what --config would run: the flags that apply over
		// the file are checked with it; the quick mode's have no place.
		if *configFile != "" || *model != "" || len(endpoints) > 0 || *policyName != "" || flagSet(fs, "data-parallel-size") {
			return usageErr("--check-config takes no other config source (--config, --model, --endpoint, --policy, --data-parallel-size)")
		}
		cfg, err := loadConfigFile(*checkFile)
		if err != nil {
			return overriddenErr(err, func(name string) bool { return flagSet(fs, name) })
		}
		overlay(&cfg)
		if err := cfg.Validate(); err != nil {
			if msgs := serveFlagErrors(err, false, func(name string) bool { return flagSet(fs, name) }); len(msgs) > 0 {
				return usageErr("%s", strings.Join(msgs, "; "))
			}
			return fmt.Errorf("invalid config: %w", err)
		}
		if _, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New}); err != nil {
			return fmt.Errorf("%s: %w", *checkFile, err)
		}
		n := 0
		for _, m := range cfg.Models {
			n += len(m.Endpoints)
		}
		fmt.Fprintf(stdout, "%s: ok (%d models, %d endpoints)\n", *checkFile, len(cfg.Models), n)
		return nil
	}
	// SIGHUP is caught from here on, before the slow part of the start (a
	// tokenizer to load): its default action would end the process. One
	// sent before the router serves waits in the channel.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	var cfg config.Config
	switch {
	case *configFile != "" && (*model != "" || len(endpoints) > 0 || *policyName != "" || flagSet(fs, "data-parallel-size")):
		return usageErr("use either --config or --model/--endpoint/--policy/--data-parallel-size, not both")
	case *configFile != "":
		var err error
		if cfg, err = loadConfigFile(*configFile); err != nil {
			return overriddenErr(err, func(name string) bool { return flagSet(fs, name) })
		}
	case *model != "" && len(endpoints) > 0 && *dpSize == 0 && flagSet(fs, "data-parallel-size"):
		return usageErr("--data-parallel-size: 0 is not positive") // quickConfig's 0 is the default, 1
	case *model != "" && len(endpoints) > 0:
		cfg = quickConfig(*model, *policyName, endpoints, *dpSize)
	case *model != "":
		return usageErr("--model %s needs at least one --endpoint URL", *model)
	case len(endpoints) > 0:
		return usageErr("--endpoint needs --model NAME, the model the endpoints serve")
	default:
		return usageErr("need --config FILE, or --model NAME with at least one --endpoint URL")
	}
	overlay(&cfg)
	quick := *configFile == ""
	if quick && *policyName != "" && !slices.Contains(policy.Names(), *policyName) {
		return usageErr("--policy %q: unknown policy (known: %s)", *policyName, strings.Join(policy.Names(), ", "))
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		// A value that came from a flag is the flag's error (exit status
		// 2, named as the user typed it); the rest are the file's.
		if msgs := serveFlagErrors(err, quick, func(name string) bool { return flagSet(fs, name) }); len(msgs) > 0 {
			return usageErr("%s", strings.Join(msgs, "; "))
		}
		return fmt.Errorf("invalid config: %w", err)
	}

	logger, err := newLogger(stderr, cfg.Log)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New, Logger: logger, Registerer: reg, Gatherer: reg})
	if err != nil && !quick {
		return fmt.Errorf("%s: %w", *configFile, err) // as --check-config says it
	}
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	// SIGHUP reloads the file, with the same flags over it; in quick mode
	// there is nothing to reload (nil).
	var load func() (config.Config, error)
	if !quick {
		load = fileLoader(*configFile, overlay)
	}
	rctx, stopReloads := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { reloadOnSignal(rctx, hup, p, *configFile, load, logger) })
	err = p.Serve(ctx, ln)
	stopReloads()
	wg.Wait()
	return err
}

// reloadOnSignal reloads p's config (load) on each receive from sig until
// ctx is done. proxy.Reload logs what it did, or the error. With load nil
// (quick mode, no file) it logs that there is nothing to reload.
func reloadOnSignal(ctx context.Context, sig <-chan os.Signal, p *proxy.Proxy, file string, load func() (config.Config, error), log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
		}
		if load == nil {
			log.Warn("SIGHUP: nothing to reload (quick mode has no --config file); the router keeps running")
			continue
		}
		log.Info("reloading the config", "file", file)
		_, _ = p.Reload(load)
	}
}

// fileLoader returns the loader of a reload (proxy.Proxy.Reload): the
// config file read again and checked as at the start (loadConfigFile),
// then given as written (config.Decode), with the flags over it
// (overlay). Reload applies the defaults: an endpoint's signals settings
// left unset keep inheriting the running model's (a model-level one
// changed in the file needs a restart), which they could not once the
// file's defaults were applied.
func fileLoader(file string, overlay func(*config.Config)) func() (config.Config, error) {
	return func() (config.Config, error) {
		data, err := os.ReadFile(file)
		if err != nil {
			return config.Config{}, fmt.Errorf("config: %w", err)
		}
		if _, err := config.Parse(data); err != nil {
			return config.Config{}, fmt.Errorf("config %s: %w", file, err)
		}
		c, err := config.Decode(data)
		if err != nil {
			return config.Config{}, fmt.Errorf("config %s: %w", file, err)
		}
		overlay(&c)
		return c, nil
	}
}

// quickConfig is the config of the flags-only mode: one model, each
// endpoint with dpSize data-parallel ranks (0: the default, 1).
func quickConfig(model, policyName string, urls []string, dpSize int) config.Config {
	m := config.Model{Name: model, Policy: config.Policy{Name: policyName}}
	for _, u := range urls {
		m.Endpoints = append(m.Endpoints, config.Endpoint{URL: u, DataParallelSize: dpSize})
	}
	return config.Config{Models: []config.Model{m}}
}

// loadConfigFile reads a YAML config strictly (unknown fields are errors),
// applies defaults and validates it.
func loadConfigFile(path string) (config.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return config.Config{}, fmt.Errorf("config: %w", err)
	}
	cfg, err := config.Parse(data)
	if err != nil {
		return config.Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

func newLogger(w io.Writer, c config.Log) (*slog.Logger, error) {
	level, err := config.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// overlayFlags are the flags that apply over a config file, by the path of
// the field each sets (debug.enabled, a bool, cannot be invalid).
var overlayFlags = map[string]string{"listen": "listen", "log.level": "log-level", "log.format": "log-format"}

// overriddenErr notes on an invalid config file's error (loadConfigFile's)
// the invalid fields that a flag given overrides. The file is refused all
// the same, at start as by --check-config (and on a reload): it must be
// valid by itself, as it is what runs once the flag is dropped, and a
// value nothing uses is a mistake waiting for that day.
func overriddenErr(err error, given func(string) bool) error {
	var errs config.Errors
	if !errors.As(err, &errs) {
		return err
	}
	var flags []string
	for _, e := range errs {
		if f := overlayFlags[e.Path]; f != "" && given(f) && !slices.Contains(flags, "--"+f) {
			flags = append(flags, "--"+f)
		}
	}
	if len(flags) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s given over it: the file must be valid by itself)", err, strings.Join(flags, ", "))
}

// serveFlagErrors returns the validation errors of the fields the command
// line set, each named by its flag: --listen, --log-level and --log-format
// when given, and in quick mode (no --config) the model, its endpoints and
// its policy. It returns nothing when any error is the config file's, so
// that the whole list is reported against the file.
func serveFlagErrors(err error, quick bool, given func(string) bool) []string {
	var errs config.Errors
	if !errors.As(err, &errs) {
		return nil
	}
	var msgs []string
	for _, e := range errs {
		flagName := ""
		switch f := overlayFlags[e.Path]; {
		case f != "" && given(f):
			flagName = f
		case quick && e.Path == "models[0].name":
			flagName = "model"
		case quick && strings.HasPrefix(e.Path, "models[0].endpoints[") && strings.HasSuffix(e.Path, ".data_parallel_size"):
			flagName = "data-parallel-size"
		case quick && strings.HasPrefix(e.Path, "models[0].endpoints["):
			flagName = "endpoint"
			if strings.Contains(e.Msg, "duplicates") || strings.Contains(e.Msg, "again; list each engine once") {
				e = &config.FieldError{Path: e.Path, Msg: strings.Fields(e.Msg)[0] + " is given twice"}
			}
		case quick && strings.HasPrefix(e.Path, "models[0].policy"):
			flagName = "policy"
		}
		if flagName == "" {
			return nil
		}
		if msg := "--" + flagName + ": " + e.Msg; !slices.Contains(msgs, msg) { // one per flag, not per endpoint
			msgs = append(msgs, msg)
		}
	}
	return msgs
}
