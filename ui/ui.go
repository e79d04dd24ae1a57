package ui

import (
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/openai"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/report"
	"github.com/kvroute/kvroute/router"
)

//go:embed assets
var assets embed.FS

// Source gives the dashboard the routers it shows. *proxy.Proxy implements
// it. Router may return nil for a model that went away.
type Source interface {
	Models() []string
	Router(model string) *router.Router
}

// RunState describes a demo run for the dashboard's banner and comparison.
type RunState struct {
	// Title heads the page (default "kvroute").
	Title string
	// Workload names the workload being replayed.
	Workload string
	// Phase (1-based) of Phases is the policy running now (Phase 0: not
	// started); Policy is its name.
	Phase, Phases int
	Policy        string
	// Remaining is the current phase's time left.
	Remaining time.Duration
	// Done reports that every phase has finished.
	Done bool
	// Rows are the finished phases' results, one per policy.
	Rows []report.Row
	// Current, when set, gives the current (or last) phase's figures so
	// far as its row will show them: the summary tiles then show these
	// (requests finished, TTFT percentiles and hit rate measured by the
	// load generator) instead of the dashboard's estimates from the
	// router's metrics, so that they agree with Rows and the run's own
	// output. Nil: the router's estimates.
	Current func() report.Row
}

// Options configure a Dashboard. Source is required; the rest have the
// documented defaults.
type Options struct {
	// Source gives the routers. Required.
	Source Source
	// Gatherer gives the router's own metrics for the throughput and TTFT
	// charts; nil leaves those charts empty.
	Gatherer prometheus.Gatherer
	// Prefix is the path the dashboard is mounted at; default "/ui".
	Prefix string
	// AdminPath is the router's policy admin API; default "/admin/policy".
	AdminPath string
	// AdminEnabled tells the page that the router has an admin token
	// configured; without it the page is read-only (it still lets the user
	// try, and shows the refusal). Default false.
	AdminEnabled bool
	// Policies are offered by the policy switch; default policy.Names().
	Policies []string
	// Authorize, when set, guards the state API (the fleet, the decisions
	// with their request IDs, session keys and tenants): requests it refuses
	// get a 401 when AdminEnabled, and the page asks for the admin token,
	// which it then sends as "Authorization: Bearer TOKEN"; without an admin
	// token they get a 403. The page and its assets stay public.
	// Nil: the state is open to whoever reaches the dashboard.
	Authorize func(r *http.Request) bool
	// Run, when set, describes a demo run (banner and comparison).
	Run func() RunState
	// SampleEvery is the spacing of chart points; default 1s.
	SampleEvery time.Duration
	// History is the number of chart points kept; default 600.
	History int
	// Decisions is the number of recent decisions sent to the page per
	// model; default 40.
	Decisions int
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Logger receives errors (a failed gather); nil discards.
	Logger *slog.Logger
}

// Dashboard serves the page and its state. Create it with New and mount it
// at Options.Prefix ("/ui"): mux.Handle("/ui/", d). It is safe for
// concurrent use.
type Dashboard struct {
	opts   Options
	static http.Handler

	mu sync.Mutex // protects s
	s  sampler
}

// New returns a Dashboard for opts.
func New(opts Options) (*Dashboard, error) {
	if opts.Source == nil {
		return nil, errors.New("ui: options: Source is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = "/ui"
	}
	opts.Prefix = "/" + strings.Trim(opts.Prefix, "/")
	if opts.AdminPath == "" {
		opts.AdminPath = "/admin/policy"
	}
	if opts.Policies == nil {
		opts.Policies = policy.Names()
	}
	if opts.SampleEvery <= 0 {
		opts.SampleEvery = time.Second
	}
	if opts.History <= 0 {
		opts.History = 600
	}
	if opts.Decisions <= 0 {
		opts.Decisions = 40
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	d := &Dashboard{opts: opts, static: http.StripPrefix(opts.Prefix+"/", http.FileServerFS(sub))}
	d.s.init(opts.History)
	return d, nil
}

// refuse answers a state request Authorize refused: 401 with a Bearer
// challenge when the router has an admin token (AdminEnabled), which the
// page then asks for; 403 when it has none, as no token can open it. The
// bodies are the router's own OpenAI-style errors.
func (d *Dashboard) refuse(w http.ResponseWriter) {
	if !d.opts.AdminEnabled {
		openai.WriteError(w, kvroute.Errorf(http.StatusForbidden, "permission_error", "forbidden", "",
			"the dashboard's data is closed: the router has no admin.token and debug.enabled is false"))
		return
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
	openai.WriteError(w, kvroute.Errorf(http.StatusUnauthorized, "authentication_error", "invalid_token", "",
		"the dashboard's data needs the admin token: Authorization: Bearer <admin.token>"))
}

// ServeHTTP serves the page (Prefix/), its assets and Prefix/api/state.
// Its errors on the API (405 with Allow, 401/403, 404 under Prefix/api/)
// are OpenAI-style JSON bodies, as the router's own.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := d.opts.Prefix
	switch {
	case r.URL.Path == p:
		http.Redirect(w, r, p+"/", http.StatusFound)
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		w.Header().Set("Allow", "GET, HEAD")
		openai.WriteError(w, kvroute.Errorf(http.StatusMethodNotAllowed, kvroute.TypeInvalidRequest, "method_not_allowed", "",
			"method %s is not allowed on %s; use GET", r.Method, r.URL.Path))
	case r.URL.Path == p+"/api/state":
		if d.opts.Authorize != nil && !d.opts.Authorize(r) {
			d.refuse(w)
			return
		}
		d.serveState(w, r)
	case strings.HasPrefix(r.URL.Path, p+"/api/"):
		openai.WriteError(w, kvroute.Errorf(http.StatusNotFound, kvroute.TypeNotFound, "not_found", "",
			"no route for %s %s", r.Method, r.URL.Path))
	case strings.HasPrefix(r.URL.Path, p+"/"):
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'")
		d.static.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}

// Sample takes one chart point at now, unless the last one is younger than
// SampleEvery.
func (d *Dashboard) Sample(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sampleLocked(now, false)
}

// SampleNow takes one chart point at now, however young the last one is:
// for figures up to date at the end of a run.
func (d *Dashboard) SampleNow(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !now.After(d.s.last) {
		return
	}
	d.sampleLocked(now, true)
}

// Mark starts a new run at now: it labels the charts (e.g. with the policy
// name) and restarts the totals Totals reports.
func (d *Dashboard) Mark(now time.Time, label string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sampleLocked(now, true)
	d.s.mark(now, label)
}

// Totals returns the figures since the last Mark (or since New).
func (d *Dashboard) Totals() Totals {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.s.totals()
}

func (d *Dashboard) sampleLocked(now time.Time, force bool) {
	if !force && !d.s.last.IsZero() && now.Sub(d.s.last) < d.opts.SampleEvery {
		return
	}
	var fams gathered
	if d.opts.Gatherer != nil {
		mfs, err := d.opts.Gatherer.Gather()
		if err != nil {
			d.opts.Logger.Warn("ui: gather metrics", "err", err)
		}
		fams = readFamilies(mfs)
	}
	d.s.add(now, fams, d.endpointCounters(now))
}

// endpointCounters reads every endpoint's engine prefix-cache counters and
// load from the routers.
func (d *Dashboard) endpointCounters(now time.Time) []endpointSample {
	var out []endpointSample
	for _, m := range d.opts.Source.Models() {
		rt := d.opts.Source.Router(m)
		if rt == nil {
			continue
		}
		for _, st := range rt.Status(now) {
			out = append(out, endpointSample{
				model:   m,
				id:      st.ID,
				scraped: st.Signals.Scrapes > 0,
				hits:    st.Signals.Last.PrefixHits,
				queries: st.Signals.Last.PrefixQueries,
				load:    float64(st.Load.Waiting + st.Load.Running),
			})
		}
	}
	return out
}

func (d *Dashboard) serveState(w http.ResponseWriter, r *http.Request) {
	now := d.opts.Now()
	d.mu.Lock()
	d.sampleLocked(now, false)
	st := d.buildState(now)
	d.mu.Unlock()
	b, err := json.Marshal(st)
	if err != nil {
		openai.WriteError(w, kvroute.Errorf(http.StatusInternalServerError, kvroute.TypeInternal, "internal_error", "",
			"ui: state: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}
