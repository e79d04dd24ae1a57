package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/disagg"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/ui"
)

// NewPickerFunc builds a policy by name (policy.New has this signature).
type NewPickerFunc func(name string, params map[string]any, seed uint64) (kvroute.Picker, error)

// Options configure a Proxy. Config is required; the rest have nil
// defaults as documented.
type Options struct {
	// Config is the router configuration; New applies its defaults and
	// validates it.
	Config config.Config
	// NewPicker builds each model's policy. Required (cmd passes policy.New).
	NewPicker NewPickerFunc
	// Logger receives the proxy's logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the proxy's metrics; nil registers nowhere (the
	// metrics are still kept).
	Registerer prometheus.Registerer
	// Gatherer, when set, is served on GET /metrics.
	Gatherer prometheus.Gatherer
	// Transport carries upstream requests; nil builds an http.Transport from
	// Config.Timeouts.
	Transport http.RoundTripper
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// KubeClient returns the Kubernetes client of a model's discovery
	// (discovery.kubernetes) and the namespace to watch when the config
	// leaves it empty; nil connects as the config says (kubeconfig, or the
	// in-cluster service account) and defaults the namespace to the pod's
	// own, else "default". Tests pass a fake clientset.
	KubeClient KubeClientFunc
}

// Proxy is the routing proxy. Build it with New; it is an http.Handler.
type Proxy struct {
	cfg       config.Config
	log       *slog.Logger
	now       func() time.Time
	newPicker NewPickerFunc
	transport http.RoundTripper
	metrics   *metrics
	gatherer  prometheus.Gatherer
	ui        *ui.Dashboard // the /ui dashboard; nil if it could not be built
	trusted   []netip.Prefix
	pools     map[string]*pool // by model name; read-only after New
	// adapters are the LoRA adapters (config models[].adapters) and the
	// pools of their base models; Reload replaces the table whole.
	adapters atomic.Pointer[adapterTable]
	// sessionField is the body field carrying session keys (the same for
	// every model, see config.Config.SessionField), or "".
	sessionField string
	names        []string // model names, sorted
	mux          *http.ServeMux
	started      time.Time
	draining     atomic.Bool      // set when Serve starts shutting down
	ids          idSet            // the routing IDs of the requests in progress
	sig          signalState      // the running signal loops (RunSignals)
	health       healthState      // the running health probes (RunHealthChecks)
	fb           *feedbackMetrics // engine-reported prompt and cached tokens
	pdMetrics    *disagg.Metrics  // P/D handoffs (disagg.go)
	notFound     notFoundLog      // the engines' 404s logged (handler.go)
	// reloadMu serialises Reload, and the start of the background loops
	// with it; applied is the configuration running, the models'
	// endpoints as last reloaded or discovered (guarded by reloadMu).
	reloadMu   sync.Mutex
	applied    config.Config
	kubeClient KubeClientFunc    // Options.KubeClient, defaulted
	disc       *discoveryMetrics // discovery.go
	debounce   time.Duration     // how long a discovery waits for more changes before applying them
	discWait   time.Duration     // how long a model's discovery sources all get to list before those that have are applied
	discRun    atomic.Bool       // set while RunDiscovery runs
	// queuePause is how long the head of a pool's line pauses before it
	// routes again after a shed: first, doubling up to max, unless the
	// router signals that load drained (queue.go). Tests lengthen it.
	queuePause struct{ first, max time.Duration }
}

// pool is one model's endpoints, router and reverse proxies.
type pool struct {
	model   string
	index   int // the model's place in the config's models (for field paths)
	router  *router.Router
	set     atomic.Pointer[endpointSet] // the endpoints now; a reload replaces it (reload.go)
	precise *precise                    // token-level matching; nil when off
	kvSink  *kvSink                     // what the KV-event subscribers feed; nil without precise.index
	line    waitLine                    // the requests held by the queue escape hatch (queue.go)
	session *sessionSource              // the requests' affinity key
	pd      *disagg.Handoff             // P/D pools only (disagg.go)
	// discovered: the pool's endpoints come from its model's discovery
	// disc (discovery.go), not from the config's list; they may be none.
	discovered bool
	disc       *discoverer
}

// New builds a Proxy: applies the config's defaults, validates it, builds
// every model's policy and router. Errors name the config field.
func New(opts Options) (*Proxy, error) {
	cfg := opts.Config
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxy: invalid config: %w", err)
	}
	if opts.NewPicker == nil {
		return nil, errors.New("proxy: options: NewPicker is required")
	}
	p := &Proxy{
		cfg:          cfg,
		applied:      cfg,
		sessionField: cfg.SessionField(),
		log:          opts.Logger,
		now:          opts.Now,
		newPicker:    opts.NewPicker,
		transport:    opts.Transport,
		gatherer:     opts.Gatherer,
		pools:        make(map[string]*pool, len(cfg.Models)),
		kubeClient:   opts.KubeClient,
		debounce:     defaultDebounce,
		discWait:     defaultDiscoveryWait,
	}
	if p.kubeClient == nil {
		p.kubeClient = connectKube
	}
	p.applied.Models = slices.Clone(cfg.Models) // Reload replaces their endpoints
	p.queuePause.first, p.queuePause.max = router.LinePauseFirst, router.LinePauseMax
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	if p.transport == nil {
		p.transport = newTransport(cfg.Timeouts)
	}
	for _, s := range cfg.TrustedClients {
		pfx, err := config.ParsePrefix(s)
		if err != nil { // Validate checked it
			return nil, fmt.Errorf("proxy: trusted_clients: %w", err)
		}
		p.trusted = append(p.trusted, pfx)
	}
	var err error
	if p.pdMetrics, err = disagg.NewMetrics(opts.Registerer); err != nil {
		return nil, fmt.Errorf("proxy: register metrics: %w", err)
	}
	p.metrics = newMetrics(p)
	p.fb = newFeedbackMetrics()
	p.disc = newDiscoveryMetrics()
	for i := range cfg.Models {
		pl, err := p.newPool(i, &cfg.Models[i])
		if err != nil {
			return nil, err
		}
		p.pools[pl.model] = pl
		p.names = append(p.names, pl.model)
	}
	sort.Strings(p.names)
	p.adapters.Store(p.newAdapterTable(cfg.Models))
	for _, name := range p.names {
		p.metrics.addPool(name)
		if p.pools[name].discovered {
			p.disc.addModel(name)
		}
	}
	if opts.Registerer != nil {
		if err := p.metrics.register(opts.Registerer); err != nil {
			return nil, fmt.Errorf("proxy: register metrics: %w", err)
		}
		for _, c := range append(append(p.fb.collectors(), signalCollector{p}), p.disc.collectors()...) {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("proxy: register metrics: %w", err)
			}
		}
	}
	p.started = p.now()
	p.routes()
	return p, nil
}

func (p *Proxy) newPool(i int, m *config.Model) (*pool, error) {
	path := fmt.Sprintf("models[%d]", i)
	eps, err := m.KVEndpoints()
	if err != nil {
		return nil, fmt.Errorf("proxy: %s: %w", path, err)
	}
	picker, err := p.buildPicker(m.Policy.Name, m.Policy.Params, m.Policy.Seed)
	if err != nil {
		return nil, fmt.Errorf("proxy: %s.policy: %w", path, err)
	}
	if err := checkKVEvents(path, m); err != nil {
		return nil, err
	}
	pc, err := newPrecise(m)
	if err != nil {
		return nil, fmt.Errorf("proxy: %s.%w", path, err)
	}
	srcs, _ := m.Discovery.KubernetesSources()
	if pc != nil && pc.index == nil && slices.ContainsFunc(srcs, func(k *config.Kubernetes) bool { return k.Endpoint.KVEvents.Port > 0 }) {
		// The engines that will publish KV events are not known yet.
		pc.index = kvindex.NewIndex(kvindex.IndexConfig{BlockSize: m.Precise.BlockSize, Capacity: m.Precise.IndexCapacity})
	}
	var planner *disagg.Planner
	if m.Disaggregated() {
		prefill := picker
		if m.Policy.Name == config.DefaultPolicy && len(m.Policy.Params) == 0 {
			prefill = nil // kv-aware with the profile's costs
		}
		if planner, err = newPlanner(m, prefill); err != nil {
			return nil, fmt.Errorf("proxy: %s.%w", path, err)
		}
		picker = planner
	}
	rc := router.Config{
		Model:      m.Name,
		Endpoints:  eps,
		Policy:     m.Policy.Name,
		Picker:     picker,
		BlockChars: m.Router.BlockChars,
		StaleAfter: m.Signals.StaleAfter,
		Health: router.HealthConfig{
			FailThreshold: m.Router.FailThreshold,
			BaseEjection:  m.Router.BaseEjection,
			MaxEjection:   m.Router.MaxEjection,
		},
		DecisionLog: m.Router.DecisionLog,
		AllowEmpty:  m.Discovered(),
	}
	if pc != nil && pc.index != nil {
		rc.Precise, rc.PreciseEndpoints = pc.index, pc.endpoints
	}
	r, err := router.New(rc)
	if err != nil {
		return nil, fmt.Errorf("proxy: %s: %w", path, err)
	}
	pl := &pool{model: m.Name, index: i, router: r, precise: pc, session: newSessionSource(m.Router.Session), discovered: m.Discovered()}
	if pc != nil && pc.index != nil {
		pl.kvSink = &kvSink{Index: pc.index, router: r}
	}
	if planner != nil {
		if pl.pd, err = p.newHandoff(pl, m, planner); err != nil {
			return nil, fmt.Errorf("proxy: %s.pd: %w", path, err)
		}
	}
	set, err := p.newEndpointSet(pl, m, eps, nil)
	if err != nil {
		return nil, fmt.Errorf("proxy: %s.%w", path, err)
	}
	pl.set.Store(set)
	if pl.discovered {
		pl.disc = p.newDiscoverer(pl, m)
	}
	return pl, nil
}

// buildPicker builds a policy; seed 0 means a random seed.
func (p *Proxy) buildPicker(name string, params map[string]any, seed uint64) (kvroute.Picker, error) {
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	return p.newPicker(name, params, seed)
}

// Router returns the routing core of a model, or nil. The scrape loops of
// the engine signals feed its Views.
func (p *Proxy) Router(model string) *router.Router {
	if pl := p.pools[model]; pl != nil {
		return pl.router
	}
	return nil
}

// Models returns the served model names, sorted.
func (p *Proxy) Models() []string { return append([]string(nil), p.names...) }

// adapterTable is the LoRA adapters served: each adapter's base model's
// pool. It is never modified once stored in Proxy.adapters.
type adapterTable struct {
	pools map[string]*pool // by adapter name
	names []string         // the adapter names, sorted
}

// newAdapterTable builds the adapter table of models (validated: each
// adapter is one model's), leaving out the adapters of models without a
// pool (added by a reload: they need a restart).
func (p *Proxy) newAdapterTable(models []config.Model) *adapterTable {
	t := &adapterTable{pools: map[string]*pool{}}
	for i := range models {
		pl := p.pools[models[i].Name]
		if pl == nil {
			continue
		}
		for _, a := range models[i].Adapters {
			t.pools[a] = pl
			t.names = append(t.names, a)
		}
	}
	sort.Strings(t.names)
	return t
}

// adapterPool returns the pool of LoRA adapter name's base model, or nil.
func (p *Proxy) adapterPool(name string) *pool { return p.adapters.Load().pools[name] }

// SetPolicy switches a model's policy at runtime.
func (p *Proxy) SetPolicy(model, policy string, params map[string]any) error {
	pl := p.pools[model]
	if pl == nil {
		return kvroute.Errorf(http.StatusNotFound, kvroute.TypeNotFound, "model_not_found", "model", "model %q is not served here", model)
	}
	if pl.pd != nil {
		return kvroute.Errorf(http.StatusConflict, kvroute.TypeInvalidRequest, "pd_pool", "model",
			"model %q is disaggregated: its placement is set by its pd config", model)
	}
	picker, err := p.buildPicker(policy, params, 0)
	if err != nil {
		return kvroute.Errorf(http.StatusBadRequest, kvroute.TypeInvalidRequest, "invalid_policy", "policy", "%v", err)
	}
	pl.router.SetPicker(policy, picker)
	p.log.Info("policy switched", "model", model, "policy", policy)
	return nil
}

// Paths served by the proxy.
const (
	PathCompletions     = "/v1/completions"
	PathChatCompletions = "/v1/chat/completions"
	PathModels          = "/v1/models"
	PathHealthz         = "/healthz"
	PathReadyz          = "/readyz"
	PathMetrics         = "/metrics"
	PathDecisions       = "/debug/decisions"
	PathEndpoints       = "/debug/endpoints"
	PathAdminPolicy     = "/admin/policy"
)

func (p *Proxy) routes() {
	mux := http.NewServeMux()
	mux.HandleFunc(PathCompletions, p.method(http.MethodPost, p.serveCompletions))
	mux.HandleFunc(PathChatCompletions, p.method(http.MethodPost, p.serveChat))
	mux.HandleFunc(PathModels, p.method(http.MethodGet, p.serveModels))
	mux.HandleFunc(PathHealthz, p.method(http.MethodGet, p.serveHealthz))
	mux.HandleFunc(PathReadyz, p.method(http.MethodGet, p.serveReadyz))
	if p.gatherer != nil {
		h := promhttp.HandlerFor(p.gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelWarn)})
		mux.Handle(PathMetrics, p.method(http.MethodGet, h.ServeHTTP))
	}
	mux.HandleFunc(PathDecisions, p.method(http.MethodGet, p.serveDecisions))
	mux.HandleFunc(PathEndpoints, p.method(http.MethodGet, p.serveEndpoints))
	if p.cfg.Admin.Token != "" {
		mux.HandleFunc(PathAdminPolicy, p.method(http.MethodPut, p.serveAdminPolicy))
	}
	p.mountUI(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openai.WriteError(w, kvroute.Errorf(http.StatusNotFound, kvroute.TypeNotFound, "not_found", "", "no route for %s %s", r.Method, r.URL.Path))
	})
	p.mux = mux
}

// method restricts a handler to one HTTP method (GET also allows HEAD).
func (p *Proxy) method(m string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m && !(m == http.MethodGet && r.Method == http.MethodHead) {
			allow := m
			if m == http.MethodGet {
				allow = "GET, HEAD"
			}
			w.Header().Set("Allow", allow)
			openai.WriteError(w, kvroute.Errorf(http.StatusMethodNotAllowed, kvroute.TypeInvalidRequest, "method_not_allowed", "",
				"method %s is not allowed on %s; use %s", r.Method, r.URL.Path, m))
			return
		}
		h(w, r)
	}
}

// ServeHTTP serves every route of the proxy.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }
