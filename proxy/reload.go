package proxy

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/openai"
)

// This file changes the pools' endpoints while the proxy serves: Reload
// takes a new configuration and applies its endpoint lists. A pool's
// endpoints are an immutable endpointSet that a reload replaces whole;
// the request path reads it through pool.set without locks.

// endpointSet is a pool's endpoints at one time and what the request path
// needs of each. It is never modified once stored in pool.set.
type endpointSet struct {
	// model is the model's config as applied: its endpoints are this
	// set's (the scrape targets, KV-event subscriptions and health
	// probes are built from it); its other fields are the ones New took.
	model *config.Model
	eps   []kvroute.Endpoint        // the router's endpoints (KVEndpoints: data-parallel ranks expanded)
	byID  map[string]*endpointProxy // by endpoint ID
	// forms is the adapter form of each endpoint whose signals.flavor
	// names its engine, by endpoint ID (configuredForms); nil for none.
	forms map[string]openai.AdapterForm
}

// newEndpointSet builds the set of m's endpoints eps (m.KVEndpoints()).
// An endpoint of old that is unchanged keeps its reverse proxy. Errors
// name the config field below the model.
func (p *Proxy) newEndpointSet(pl *pool, m *config.Model, eps []kvroute.Endpoint, old *endpointSet) (*endpointSet, error) {
	s := &endpointSet{model: m, eps: eps, byID: make(map[string]*endpointProxy, len(eps)), forms: configuredForms(m)}
	for j := range eps {
		ep := &eps[j]
		if old != nil {
			if up := old.byID[ep.ID]; up != nil && sameEndpoint(up.ep, ep) {
				s.byID[ep.ID] = up
				continue
			}
		}
		up, err := p.newEndpointProxy(pl, ep)
		if err != nil {
			p.forgetNew(pl, s, old)
			return nil, fmt.Errorf("endpoints[%d].url: %w", configIndex(m, ep.ID), err)
		}
		s.byID[ep.ID] = up
	}
	return s, nil
}

// forgetNew deletes the metric series that building set made for
// endpoints old does not have: a change refused after its sets were
// built leaves no series of endpoints that never joined.
func (p *Proxy) forgetNew(pl *pool, set, old *endpointSet) {
	for id := range set.byID {
		if old == nil || old.byID[id] == nil {
			p.forgetEndpoint(pl.model, id)
		}
	}
}

// dropPlanned undoes the metric series of changes planned but not applied.
func (p *Proxy) dropPlanned(plans []planned) {
	for _, pc := range plans {
		p.forgetNew(pc.pl, pc.set, pc.pl.set.Load())
	}
}

// configIndex returns the index in m.Endpoints of the endpoint that router
// endpoint id is (or is a data-parallel rank of), -1 if none.
func configIndex(m *config.Model, id string) int {
	for i := range m.Endpoints {
		e := &m.Endpoints[i]
		if e.DataParallelSize <= 1 && e.ID == id {
			return i
		}
		for r := range e.DataParallelSize {
			if e.RankID(r) == id {
				return i
			}
		}
	}
	return -1
}

// sameEndpoint reports whether a and b are equal in every field.
func sameEndpoint(a, b *kvroute.Endpoint) bool {
	return a.ID == b.ID && a.URL == b.URL && a.Role == b.Role && a.Weight == b.Weight &&
		a.KVCapacityTokens == b.KVCapacityTokens && a.DataParallelSize == b.DataParallelSize &&
		a.DataParallelRank == b.DataParallelRank && maps.Equal(a.Labels, b.Labels) && slices.Equal(a.Adapters, b.Adapters)
}

// upstream returns the reverse proxy of a routed endpoint, nil when it is
// no longer in the pool as routed (a reload removed it, or put another
// engine or role under its ID, since).
func (pl *pool) upstream(ep *kvroute.Endpoint) *endpointProxy {
	up := pl.set.Load().byID[ep.ID]
	if up == nil || !up.ep.SameEngine(ep) {
		return nil
	}
	return up
}

// label returns id as the endpoint label of a metric, "" when the endpoint
// is no longer in the pool: a request that ends on an endpoint after a
// reload removed it is counted without it, rather than bringing back the
// series the reload deleted. The caller holds the pool's
// poolMetrics.series (read) from label to its write of the series, so
// that the reload cannot delete the series in between.
func (pl *pool) label(id string) string {
	if _, ok := pl.set.Load().byID[id]; ok {
		if testHookLabel != nil {
			testHookLabel(pl.model, id)
		}
		return id
	}
	return ""
}

// Test hooks, nil outside tests: testHookLabel runs in pool.label between
// the check that the endpoint is in the pool and the caller's write;
// testHookForget runs in apply just before the removed endpoints' series
// are deleted.
var (
	testHookLabel  func(model, id string)
	testHookForget func()
)

// preciseIDs returns the endpoints of set whose KV events feed the pool's
// precise index.
func (pl *pool) preciseIDs(m *config.Model) []string {
	if pl.kvSink == nil {
		return nil
	}
	var out []string
	for _, e := range m.Endpoints {
		switch {
		case e.KVEvents.Address == "":
		case e.DataParallelSize > 1:
			for r := range e.DataParallelSize {
				out = append(out, e.RankID(r))
			}
		default:
			out = append(out, e.ID)
		}
	}
	return out
}

// ReloadResult is what a Reload did.
type ReloadResult struct {
	// Models lists the models whose endpoints changed, in config order.
	Models []ModelChange
	// Adapters lists the models whose LoRA adapters (models[].adapters)
	// changed, in config order: applied live, as the endpoint lists are.
	Adapters []string
	// Restart lists the config fields that differ from the running
	// configuration but are not applied live (everything but the models'
	// endpoint lists and adapters), e.g. "listen", "models[0].policy",
	// "models: model \"b\" added". They take effect at the next start.
	Restart []string
}

// ModelChange is the change of one model's endpoints, by router endpoint
// ID (a data-parallel engine's ranks are endpoints).
type ModelChange struct {
	Model string
	// Added and Removed endpoints; Changed ones kept their ID with other
	// settings (weight, labels, signals settings, kv_events, ...; another
	// URL or data-parallel place is another engine: its routing state
	// starts afresh, as an added endpoint's).
	Added, Removed, Changed []string
}

// planned is one model's validated change, ready to apply.
type planned struct {
	pl     *pool
	model  *config.Model
	set    *endpointSet
	change ModelChange
}

// Reload applies a new configuration's endpoint lists while the proxy
// serves. load returns the configuration as written, without its
// defaults applied (config.Decode; cmd reads the file again on SIGHUP):
// Reload applies them, an endpoint's signals settings left unset
// inheriting the running model's (with the file's defaults applied, a
// model-level signals setting changed in the file would reach every
// endpoint as an endpoint change, though it needs a restart). It is
// validated whole first (config.Validate, then what New
// checks of each changed model's endpoints: kv_events addresses, URLs); an
// invalid configuration changes nothing and is returned as an error
// naming the field. Then, per model whose endpoints differ, the router
// takes the new list (router.Router.SetEndpoints: endpoints that stay keep
// their routing state), each new endpoint gets its reverse proxy, scrape
// loop, KV-event subscription and health probe, and a removed one's are
// stopped (its precise-index entries removed) and its metric series
// deleted; requests in progress on it finish. A data-parallel endpoint's
// ranks are endpoints: its data_parallel_size may change too.
//
// A running model's LoRA adapters (models[].adapters) change live too:
// the adapter table the request path reads is replaced whole once the
// endpoint changes are applied (an endpoint's own adapters are one of its
// fields, applied with it), and the result's Adapters names the models.
//
// Nothing else is applied live: models added or removed, listen, policies,
// timeouts and every other field keep their running values, and the
// result's Restart names each one that differs (Reload logs them as a
// warning).
//
// A disaggregated (pd) model's endpoints change live the same way, its
// prefill and decode pools each growing or shrinking, and an endpoint
// whose role changes under its ID counts as another engine (removed and
// added: router.Router.SetEndpoints). Its planner forgets what it kept of
// the removed endpoints (disagg.Planner.ForgetEndpoint), and a request
// whose next leg was routed to an endpoint removed since is placed again
// over the new pool (disagg.HandoffConfig.Live); legs already sent run to
// their end. Whether a model is disaggregated does not change live: a
// configuration giving a P/D model only role both endpoints, or an
// aggregated model a prefill or decode endpoint, is refused whole.
//
// Reload logs one line per changed model (added, removed and changed
// endpoint IDs) and counts the outcome in kvroute_config_reloads_total,
// kvroute_config_last_reload_successful and
// kvroute_config_last_reload_success_timestamp_seconds. Reloads are
// serialised.
func (p *Proxy) Reload(load func() (config.Config, error)) (ReloadResult, error) {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	res, err := p.reload(load)
	// The counter goes last: whoever sees it move finds the gauges set
	// and the lines logged.
	if err != nil {
		p.metrics.reloadOK.Set(0)
		p.log.Error("config reload failed: nothing changed", "error", err)
		p.metrics.reloads.WithLabelValues("failure").Inc()
		return ReloadResult{}, err
	}
	p.metrics.reloadOK.Set(1)
	p.metrics.reloadSuccessAt.Set(float64(p.now().UnixNano()) / 1e9)
	if len(res.Restart) > 0 {
		p.log.Warn("config reload: these changes need a restart and were not applied", "fields", strings.Join(res.Restart, "; "))
	}
	p.log.Info("config reloaded", "models_changed", len(res.Models))
	p.metrics.reloads.WithLabelValues("success").Inc()
	return res, nil
}

func (p *Proxy) reload(load func() (config.Config, error)) (ReloadResult, error) {
	cfg, err := load()
	if err != nil {
		return ReloadResult{}, fmt.Errorf("proxy: reload: %w", err)
	}
	// The endpoints' own signals settings as written: ApplyDefaults fills
	// those left unset from the file's model settings, but a running model
	// keeps its own settings until a restart, and its endpoints inherit
	// from those (else a model-level scrape_interval changed in the file
	// would reach every endpoint as an endpoint change, and a P/D model's
	// reload would be refused for it).
	own := make(map[string][]config.EndpointSignals, len(cfg.Models))
	for _, m := range cfg.Models {
		s := make([]config.EndpointSignals, len(m.Endpoints))
		for j := range m.Endpoints {
			s[j] = m.Endpoints[j].Signals
		}
		own[m.Name] = s
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return ReloadResult{}, fmt.Errorf("proxy: reload: invalid config: %w", err)
	}
	var res ReloadResult
	res.Restart = restartFields(&p.applied, &cfg)
	var plans []planned
	for i := range cfg.Models {
		m := &cfg.Models[i]
		pl := p.pools[m.Name]
		if pl == nil {
			continue // a new model: in Restart
		}
		if pl.discovered || m.Discovered() {
			// Its endpoints are its discovery's (a discovery block
			// added, removed or changed is in Restart).
			continue
		}
		path := fmt.Sprintf("models[%d]", i)
		running := pl.set.Load().model
		eps := slices.Clone(m.Endpoints)
		for j := range eps {
			eps[j].Signals = own[m.Name][j]
			eps[j].InheritSignals(&running.Signals)
		}
		pc, err := p.planEndpoints(pl, path, eps)
		if err != nil {
			p.dropPlanned(plans)
			return ReloadResult{}, fmt.Errorf("proxy: reload: %w", err)
		}
		if pc == nil {
			continue
		}
		if pl.kvSink == nil {
			for j, e := range m.Endpoints {
				if e.KVEvents.Address != "" {
					res.Restart = append(res.Restart, fmt.Sprintf("%s.endpoints[%d].kv_events (the model had no precise index at start)", path, j))
				}
			}
		}
		plans = append(plans, *pc)
	}
	// Valid: apply.
	for k, pc := range plans {
		if err := p.apply(pc, "reload"); err != nil {
			p.dropPlanned(plans[k+1:])
			// SetEndpoints checks only what KVEndpoints and Validate did.
			return ReloadResult{}, fmt.Errorf("proxy: reload: %w", err)
		}
		res.Models = append(res.Models, pc.change)
	}
	// The adapters: a request names one in its model field, so the new
	// table is published whole, after the endpoints that serve them.
	changed := false
	for i := range cfg.Models {
		m := &cfg.Models[i]
		pl := p.pools[m.Name]
		if pl == nil || slices.Equal(p.applied.Models[pl.index].Adapters, m.Adapters) {
			continue
		}
		p.log.Info("adapters changed", "model", m.Name, "adapters", m.Adapters, "was", p.applied.Models[pl.index].Adapters)
		p.applied.Models[pl.index].Adapters = slices.Clone(m.Adapters)
		res.Adapters = append(res.Adapters, m.Name)
		changed = true
	}
	if changed {
		// (A model removed from the file keeps running until a restart,
		// Restart says so, and so do its adapters.)
		p.adapters.Store(p.newAdapterTable(p.applied.Models))
	}
	return res, nil
}

// planEndpoints validates the change of pool pl's endpoints to endpoints
// (as configured: data-parallel endpoints not expanded) as New would
// (KVEndpoints, kv_events addresses, URLs) and builds what apply makes of
// it; nil when they are the pool's already. Errors name the field below
// path, the model's. Reload and the discoveries (discovery.go) both change
// pools through planEndpoints and apply, with reloadMu held.
func (p *Proxy) planEndpoints(pl *pool, path string, endpoints []config.Endpoint) (*planned, error) {
	cur := pl.set.Load()
	if reflect.DeepEqual(cur.model.Endpoints, endpoints) || len(cur.model.Endpoints)+len(endpoints) == 0 {
		return nil, nil // (a discovered pool's none is nil or empty)
	}
	// The model as it runs, with the new endpoints.
	run := *cur.model
	run.Endpoints = endpoints
	if err := checkDisaggregated(pl, path, &run); err != nil {
		return nil, err
	}
	eps, err := run.KVEndpoints()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := checkKVEvents(path, &run); err != nil {
		return nil, err
	}
	set, err := p.newEndpointSet(pl, &run, eps, cur)
	if err != nil {
		return nil, fmt.Errorf("%s.%w", path, err)
	}
	return &planned{pl: pl, model: &run, set: set, change: diffEndpoints(pl.model, cur.eps, eps, cur.model, &run)}, nil
}

// checkDisaggregated refuses a change of pool pl's endpoints to run's that
// would change whether the model is disaggregated: a P/D pool's picker is
// the prefill/decode planner and its requests go through the handoff, an
// aggregated pool's do not, and neither is rebuilt live. A P/D pool keeps
// at least one prefill or decode endpoint (unless it has none at all, as a
// discovered pool may); an aggregated pool gets none. The rest of what a
// P/D pool needs (a decode-capable endpoint; data-parallel endpoints are
// allowed, their ranks pinned on each leg by the handoff) is
// config.Validate's, for a reload, as at start.
func checkDisaggregated(pl *pool, path string, run *config.Model) error {
	pd := run.Disaggregated()
	switch {
	case pl.pd != nil && !pd && len(run.Endpoints) > 0:
		return fmt.Errorf("%s.endpoints: model %q is disaggregated (pd): at least one endpoint needs role prefill or decode "+
			"(the model becomes aggregated only with a restart)", path, pl.model)
	case pl.pd == nil && pd:
		for j, e := range run.Endpoints {
			if r, err := kvroute.ParseRole(e.Role); err == nil && r != kvroute.RoleBoth {
				return fmt.Errorf("%s.endpoints[%d].role: %q: model %q is aggregated: it becomes disaggregated (pd) only with a restart",
					path, j, e.Role, pl.model)
			}
		}
	}
	return nil
}

// apply makes a validated change (planEndpoints): the health probes of
// endpoints leaving stop first (none may report on an ID that names another
// engine next), then the new set is published with the old endpoints'
// reverse proxies still in it, the router takes the new list, the set
// without them is published, the signal loops follow, the new probes
// start, the removed endpoints' metric series go, and the running
// configuration (p.applied) takes the model's new endpoints. It logs one
// line naming the change and its source ("reload", "discovery"). Called
// with reloadMu held.
func (p *Proxy) apply(pc planned, source string) error {
	pl, cur := pc.pl, pc.pl.set.Load()
	p.health.stopOld(p, pl, pc.set)
	both := &endpointSet{model: pc.set.model, eps: pc.set.eps, byID: make(map[string]*endpointProxy, len(cur.byID)+len(pc.set.byID))}
	maps.Copy(both.byID, cur.byID)
	maps.Copy(both.byID, pc.set.byID)
	if cur.forms != nil || pc.set.forms != nil {
		both.forms = maps.Clone(cur.forms)
		if both.forms == nil {
			both.forms = make(map[string]openai.AdapterForm, len(pc.set.forms))
		}
		maps.Copy(both.forms, pc.set.forms)
	}
	pl.set.Store(both) // a request routed just before the change finds its endpoint
	if err := pl.router.SetEndpoints(p.now(), pc.set.eps, pl.preciseIDs(pc.model)); err != nil {
		pl.set.Store(cur)
		p.health.start(p, pl)
		return fmt.Errorf("model %q: %w", pl.model, err)
	}
	pl.set.Store(pc.set)
	if err := p.sig.sync(p); err != nil {
		p.log.Error("endpoints changed: engine signals", "model", pl.model, "source", source, "error", err)
	}
	p.health.start(p, pl)
	if testHookForget != nil {
		testHookForget()
	}
	for _, id := range pc.change.Removed {
		p.forgetEndpoint(pl.model, id) // after the set without it is published: see poolMetrics.series
	}
	p.applied.Models[pl.index].Endpoints = pc.model.Endpoints // what runs now
	c := pc.change
	p.log.Info("endpoints changed", "model", c.Model, "source", source, "added", c.Added, "removed", c.Removed, "changed", c.Changed,
		"endpoints", len(pc.set.eps))
	return nil
}

// diffEndpoints compares a pool's endpoints before and after, of the
// models' configurations from and to: an endpoint whose configuration
// changed in a field the router's Endpoint does not have (its signals
// settings, its kv_events) is changed too.
func diffEndpoints(model string, before, after []kvroute.Endpoint, from, to *config.Model) ModelChange {
	c := ModelChange{Model: model}
	fromCfg, toCfg := configByID(from), configByID(to)
	old := make(map[string]*kvroute.Endpoint, len(before))
	for i := range before {
		old[before[i].ID] = &before[i]
	}
	seen := make(map[string]bool, len(after))
	for i := range after {
		e := &after[i]
		seen[e.ID] = true
		switch o := old[e.ID]; {
		case o == nil:
			c.Added = append(c.Added, e.ID)
		case !sameEndpoint(o, e) || !reflect.DeepEqual(fromCfg[e.ID], toCfg[e.ID]):
			c.Changed = append(c.Changed, e.ID)
		}
	}
	for i := range before {
		if !seen[before[i].ID] {
			c.Removed = append(c.Removed, before[i].ID)
		}
	}
	return c
}

// configByID returns the configured endpoint of each router endpoint ID
// of m (a data-parallel endpoint's under each of its ranks' IDs).
func configByID(m *config.Model) map[string]*config.Endpoint {
	out := make(map[string]*config.Endpoint, len(m.Endpoints))
	for i := range m.Endpoints {
		e := &m.Endpoints[i]
		if e.DataParallelSize <= 1 {
			out[e.ID] = e
			continue
		}
		for r := range e.DataParallelSize {
			out[e.RankID(r)] = e
		}
	}
	return out
}

// restartFields names the fields of next that differ from cur, the
// running configuration, other than the models' endpoint lists: what a
// reload does not apply.
func restartFields(cur, next *config.Config) []string {
	var out []string
	cv, nv := reflect.ValueOf(*cur), reflect.ValueOf(*next)
	ct := cv.Type()
	for i := range ct.NumField() {
		f := ct.Field(i)
		name := yamlName(f)
		if f.Name == "Models" || !f.IsExported() {
			continue
		}
		if !reflect.DeepEqual(cv.Field(i).Interface(), nv.Field(i).Interface()) {
			out = append(out, name)
		}
	}
	curIdx := make(map[string]int, len(cur.Models))
	for i, m := range cur.Models {
		curIdx[m.Name] = i
	}
	nextNames := make(map[string]bool, len(next.Models))
	for i := range next.Models {
		m := &next.Models[i]
		nextNames[m.Name] = true
		j, ok := curIdx[m.Name]
		if !ok {
			out = append(out, fmt.Sprintf("models: model %q added", m.Name))
			continue
		}
		mv, ov := reflect.ValueOf(*m), reflect.ValueOf(cur.Models[j])
		mt := mv.Type()
		for k := range mt.NumField() {
			f := mt.Field(k)
			if f.Name == "Endpoints" || f.Name == "Adapters" || !f.IsExported() {
				continue
			}
			if !reflect.DeepEqual(mv.Field(k).Interface(), ov.Field(k).Interface()) {
				out = append(out, fmt.Sprintf("models[%d].%s", i, yamlName(f)))
			}
		}
	}
	for _, m := range cur.Models {
		if !nextNames[m.Name] {
			out = append(out, fmt.Sprintf("models: model %q removed", m.Name))
		}
	}
	return out
}

// yamlName is a struct field's name in the config file.
func yamlName(f reflect.StructField) string {
	if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != "" && tag != "-" {
		return tag
	}
	return strings.ToLower(f.Name)
}
