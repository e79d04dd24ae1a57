package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/config"
)

// This file discovers models' endpoints in Kubernetes. A model with
// discovery gets one informer (RunDiscovery, which Serve runs) per source
// (discovery.kubernetes, discovery.sources[i].kubernetes) on the
// EndpointSlices of its Service; each change, debounced, becomes that
// source's part of the pool (its engines, with its endpoint template: a
// prefill/decode model's prefill and decode Services), and the union of
// the parts, in source order, the pool's new endpoint list, applied
// exactly as a Reload applies a config's (planEndpoints, apply): added
// engines get their reverse proxy, signal loops and health probe, removed
// ones take no new requests and finish those in progress. Such a pool may
// be empty: its requests are answered 503 (router.Config.AllowEmpty). A
// Reload leaves its endpoints alone.

// defaultDebounce is how long a discovery waits after a change of its
// EndpointSlices for more before it applies them (a rollout changes many
// at once).
const defaultDebounce = 250 * time.Millisecond

// defaultDiscoveryWait is how long a model's discovery sources all get to
// list before the pool takes the engines of those that have.
const defaultDiscoveryWait = 30 * time.Second

// KubeClientFunc returns the Kubernetes client a model's discovery watches
// with, and the namespace it watches when discovery.kubernetes.namespace
// is empty.
type KubeClientFunc func(k *config.Kubernetes) (client kubernetes.Interface, namespace string, err error)

// serviceAccountNamespace holds the pod's namespace in a cluster.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// connectKube is the default KubeClientFunc: k.Kubeconfig when set, else
// the in-cluster config (the pod's service account and namespace), else
// $KUBECONFIG or ~/.kube/config. With a kubeconfig the namespace is its
// current context's, as kubectl's, else "default". It does not reach the
// API server.
func connectKube(k *config.Kubernetes) (kubernetes.Interface, string, error) {
	var rc *rest.Config
	ns := metav1.NamespaceDefault
	if k.Kubeconfig == "" {
		if c, err := rest.InClusterConfig(); err == nil {
			rc = c
			if b, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
				ns = strings.TrimSpace(string(b))
			}
		}
	}
	if rc == nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules() // $KUBECONFIG, else ~/.kube/config
		rules.ExplicitPath = k.Kubeconfig
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
		c, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("kubernetes config (not in a cluster; kubeconfig %q): %w", k.Kubeconfig, err)
		}
		rc = c
		if n, _, err := cc.Namespace(); err == nil && n != "" {
			ns = n
		}
	}
	rc.UserAgent = "kvroute"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client: %w", err)
	}
	return c, ns, nil
}

// discoverer is one model's discovery: built by New, run by RunDiscovery.
type discoverer struct {
	pl    *pool
	srcs  []*config.Kubernetes // the sources, in config order
	paths []string             // their config paths (models[i].discovery.kubernetes, ...)
	path  string               // the model's config path, for errors
	// listed is each source's endpoints as last listed, nil until its
	// first list of this run (RunDiscovery): the pool takes the union once
	// every source has listed.
	// Guarded by the Proxy's reloadMu.
	listed [][]config.Endpoint
	// waited is set once the model's sources had discWait to list: the
	// pool then takes the union of those that have (a source refused its
	// list, by RBAC say, does not hold the others' engines back for
	// ever). It does not apply while a source could not start (failed).
	// Guarded by the Proxy's reloadMu.
	waited bool
	// qualify is set when the sources watch more than one namespace (or
	// use more than one kubeconfig): an engine's ID is then
	// <namespace>/<pod> (under its cluster's name: clusters), since pods of
	// one name (vllm-0 of a prefill and of a decode StatefulSet) are
	// distinct engines in distinct namespaces.
	qualify bool
	// clusters names each source's cluster (clusterNames) when the
	// sources use more than one kubeconfig, else it is nil: an engine's ID
	// is then <cluster>/<namespace>/<pod>, since two clusters may each
	// have a namespace and a pod of one name.
	clusters []string
	// failed is the config path of a source that could not start (its
	// client), nil while none has failed since RunDiscovery started. The
	// pool then has no endpoints (apply).
	failed atomic.Pointer[string]
	// dualWarned is set once a source's listing had endpoints without
	// targetRef or hostname in both address families (logged once).
	dualWarned atomic.Bool
}

// codeDiscoveryNotRunning is the error code of a request for a model
// whose discovery could not start.
const codeDiscoveryNotRunning = "discovery_not_running"

// notRunning returns the error that answers a request for the model while
// a source of its discovery could not start (its pool then has no
// endpoints and gets none: waiting does not help), else nil.
func (d *discoverer) notRunning() error {
	path := d.failed.Load()
	if path == nil {
		return nil
	}
	return &kvroute.Error{Status: http.StatusServiceUnavailable, Type: kvroute.TypeUnavailable, Code: codeDiscoveryNotRunning,
		Message: fmt.Sprintf("model %q has no endpoints: its Kubernetes discovery (%s) is not running (see the router's log)", d.pl.model, *path)}
}

// newDiscoverer returns pool pl's discovery (its model m's). It connects
// when it runs: New (and so --check-config) does not need the cluster.
func (p *Proxy) newDiscoverer(pl *pool, m *config.Model) *discoverer {
	d := &discoverer{pl: pl, path: fmt.Sprintf("models[%d]", pl.index)}
	srcs, paths := m.Discovery.KubernetesSources()
	d.srcs, d.listed = srcs, make([][]config.Endpoint, len(srcs))
	kubeconfigs := make([]string, len(srcs))
	for i, k := range srcs {
		kubeconfigs[i] = k.Kubeconfig
		d.qualify = d.qualify || k.Namespace != srcs[0].Namespace || k.Kubeconfig != srcs[0].Kubeconfig
	}
	d.clusters = clusterNames(kubeconfigs)
	for _, sp := range paths {
		d.paths = append(d.paths, d.path+".discovery."+sp)
	}
	return d
}

// clusterNames names the clusters of a model's sources for their
// engines' IDs, one name per source (kubeconfigs: their kubeconfig files,
// in order); nil when they all use one kubeconfig. A cluster is named by
// its kubeconfig file's base name without extension
// ("/etc/kube/prefill.yaml": "prefill"; "", the in-cluster config or
// $KUBECONFIG: "local"); files that share a name, by as many of their
// parent directories as tell them apart, joined with "-" and without
// leading dots ("/etc/kube/east/config": "east-config"); paths that even
// so share one (a relative and an absolute path) are numbered from the
// second ("kube-config-2"). The names come from the config alone: they
// are known before any cluster is reached, and an engine keeps its ID
// across restarts.
func clusterNames(kubeconfigs []string) []string {
	clean := func(k string) string {
		if k == "" {
			return ""
		}
		return filepath.Clean(k)
	}
	var files []string // distinct, in order
	for _, k := range kubeconfigs {
		if !slices.Contains(files, clean(k)) {
			files = append(files, clean(k))
		}
	}
	if len(files) < 2 {
		return nil
	}
	elems := make([][]string, len(files)) // each file's path elements, base name first
	for i, f := range files {
		all := strings.Split(filepath.ToSlash(f), "/")
		for j := len(all) - 1; j >= 0; j-- {
			e := all[j]
			if base := strings.TrimSuffix(e, filepath.Ext(e)); j == len(all)-1 && base != "" {
				e = base
			}
			if e = strings.TrimLeft(e, "."); e != "" {
				elems[i] = append(elems[i], e)
			}
		}
		if len(elems[i]) == 0 {
			elems[i] = []string{"local"}
		}
	}
	depth := make([]int, len(files)) // how many of elems[i] name file i
	name := func(i int) string {
		e := slices.Clone(elems[i][:depth[i]])
		slices.Reverse(e)
		return strings.Join(e, "-")
	}
	for i := range depth {
		depth[i] = 1
	}
	for grew := true; grew; {
		grew = false
		byName := make(map[string][]int)
		for i := range files {
			byName[name(i)] = append(byName[name(i)], i)
		}
		for _, same := range byName {
			for _, i := range same {
				if len(same) > 1 && depth[i] < len(elems[i]) {
					depth[i]++
					grew = true
				}
			}
		}
	}
	byFile := make(map[string]string, len(files))
	taken := make(map[string]bool, len(files))
	for i, f := range files {
		n := name(i)
		for k := 2; taken[n]; k++ {
			n = name(i) + "-" + strconv.Itoa(k)
		}
		taken[n], byFile[f] = true, n
	}
	out := make([]string, len(kubeconfigs))
	for i, k := range kubeconfigs {
		out[i] = byFile[clean(k)]
	}
	return out
}

// RunDiscovery runs the discovery of every model that has one until ctx is
// done, then stops the informers and returns once their goroutines have
// exited. Serve runs it; call it yourself only when serving the Proxy as a
// plain http.Handler. Each source's informer watches the EndpointSlices
// labelled kubernetes.io/service-name=<service> in its namespace; 250ms
// after a change (with the changes that came meanwhile: a rollout that
// goes on is followed, not waited out), the source's part of the model's
// endpoints becomes the ready ones (see config.Kubernetes), and the
// model's endpoints the union of its sources' parts, logged as one line
// with the IDs added and removed. A model with several sources takes its
// first endpoints once each source has listed its Service once (a P/D
// pool does not start with its prefill engines and no decode engine for
// want of the other list), or 30s after the start those of the sources
// that have listed (a warning names the others, which join when they
// list); an engine listed by two sources (one pod behind
// both Services) joins with the first one's template, and the other is
// logged and counted as an error. When the sources watch more than one
// namespace, engines are named <namespace>/<pod>; when they use more
// than one kubeconfig, <cluster>/<namespace>/<pod>, the cluster named
// after its kubeconfig file (clusterNames). A slice whose port cannot be
// chosen (none named so, or several and no discovery.kubernetes.port) is
// skipped and the error logged and counted in
// kvroute_discovery_errors_total, as are failed
// watches (the informer retries them) and endpoint lists that cannot be
// applied (the pool keeps its endpoints). A source that cannot get its
// client (no in-cluster config, no kubeconfig) does not run: its model
// stays without endpoints (its other sources' included, even after the
// 30s: a P/D pool of one side would fail every request), its requests
// are answered 503 discovery_not_running (without Retry-After) and
// /readyz names it, and RunDiscovery returns that error, naming the
// field, once every other discovery has ended.
func (p *Proxy) RunDiscovery(ctx context.Context) error {
	if !p.discRun.CompareAndSwap(false, true) {
		return errors.New("proxy: discovery: already running")
	}
	defer p.discRun.Store(false)
	var wg sync.WaitGroup
	var errs []error
	var mu sync.Mutex // protects errs
	for _, name := range p.names {
		d := p.pools[name].disc
		if d == nil {
			continue
		}
		d.failed.Store(nil)
		p.reloadMu.Lock()
		d.waited = false
		clear(d.listed) // a run before's lists do not count as this run's
		p.reloadMu.Unlock()
		if len(d.srcs) > 1 {
			wg.Go(func() {
				t := time.NewTimer(p.discWait)
				defer t.Stop()
				select {
				case <-ctx.Done():
				case <-t.C:
					d.waitOver(p)
				}
			})
		}
		for i := range d.srcs {
			wg.Go(func() {
				if err := d.run(ctx, p, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// run watches source i's EndpointSlices until ctx is done. It returns an
// error only when it cannot start.
func (d *discoverer) run(ctx context.Context, p *Proxy, i int) error {
	model, k := d.pl.model, d.srcs[i]
	client, ns, err := p.kubeClient(k)
	if err != nil {
		p.disc.errors.WithLabelValues(model).Inc()
		err = fmt.Errorf("proxy: %s: %w", d.paths[i], err)
		log := p.log.With("model", model)
		log.Error("discovery: not running; the model has no endpoints", "error", err)
		d.fail(p, log, i)
		return err
	}
	if k.Namespace != "" {
		ns = k.Namespace
	}
	log := p.log.With("model", model, "service", k.Service, "namespace", ns)
	if d.clusters != nil {
		log = log.With("cluster", d.clusters[i])
	}
	selector := discoveryv1.LabelServiceName + "=" + k.Service
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	defer factory.Shutdown() // after ctx is done: waits for the informer's goroutines
	slicesInf := factory.Discovery().V1().EndpointSlices()
	inf := slicesInf.Informer()
	kick := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, obj any) { notify(obj) },
		DeleteFunc: notify,
	}); err != nil {
		p.disc.errors.WithLabelValues(model).Inc()
		return fmt.Errorf("proxy: %s: %w", d.paths[i], err)
	}
	_ = inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		p.disc.errors.WithLabelValues(model).Inc()
		log.Warn("discovery: watching EndpointSlices failed; retrying", "error", err)
	})
	factory.Start(ctx.Done())
	log.Info("discovery: watching EndpointSlices", "selector", selector)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil // ctx done
	}
	notify(nil) // the first list, even an empty one
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	pending := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
			if !pending {
				pending = true
				timer.Reset(p.debounce)
			}
		case <-timer.C:
			pending = false
			list, err := slicesInf.Lister().EndpointSlices(ns).List(labels.Everything())
			if err != nil {
				p.disc.errors.WithLabelValues(model).Inc()
				log.Error("discovery: listing EndpointSlices", "error", err)
				continue
			}
			d.update(p, log, i, ns, list)
		}
	}
}

// update makes the ready engines of list (source i's, in namespace ns)
// its part of the pool's endpoints, and the union of the parts the pool's
// endpoints once every source has listed.
func (d *discoverer) update(p *Proxy, log *slog.Logger, i int, ns string, list []*discoveryv1.EndpointSlice) {
	model, k := d.pl.model, d.srcs[i]
	engines, problems, unkeyed := readyEngines(k.Service, k.Port, list)
	for _, err := range problems {
		p.disc.errors.WithLabelValues(model).Inc()
		log.Error("discovery: EndpointSlice skipped", "error", err)
	}
	if unkeyed && d.dualWarned.CompareAndSwap(false, true) {
		log.Warn("discovery: the Service's IPv4 and IPv6 EndpointSlices both have endpoints without targetRef or hostname; "+
			"each address is taken for its own engine, so a backend listed in both families gets twice its share "+
			"(set the endpoints' hostname, or list one family's addresses)", "service", k.Service)
	}
	part := make([]config.Endpoint, len(engines))
	for j, e := range engines {
		if d.qualify {
			e.ID = ns + "/" + e.ID
		}
		if d.clusters != nil {
			e.ID = d.clusters[i] + "/" + e.ID
		}
		part[j] = k.EndpointOf(e)
	}
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	d.listed[i] = part
	d.apply(p, log)
}

// fail records that source i could not start: the pool leaves the
// endpoints it may have taken meanwhile (the other sources' after the
// wait) and takes none until RunDiscovery runs again.
func (d *discoverer) fail(p *Proxy, log interface {
	Error(msg string, args ...any)
}, i int) {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	d.failed.CompareAndSwap(nil, &d.paths[i])
	d.apply(p, log)
}

// waitOver is called once the model's sources have had discWait to list:
// the pool takes the union of those that have, and the others are logged.
// A source that could not start is not waited for (fail logged it): the
// pool stays without endpoints.
func (d *discoverer) waitOver(p *Proxy) {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	d.waited = true
	if d.failed.Load() != nil {
		return
	}
	var missing []string
	for j, l := range d.listed {
		if l == nil {
			missing = append(missing, d.paths[j])
		}
	}
	if len(missing) == 0 {
		return // applied already
	}
	log := p.log.With("model", d.pl.model)
	log.Warn("discovery: sources not listed yet; the pool takes the engines of the others meanwhile", "sources", missing,
		"waited", p.discWait)
	if len(missing) < len(d.listed) {
		d.apply(p, log)
	}
}

// apply makes the union of the sources' parts the pool's endpoints, once
// every source has listed (or discWait is over: then the union of those
// that have), and none while a source could not start (failed): a source
// that will not list is not waited out, so a P/D pool does not run with
// one side, and requests are told discovery_not_running. Called with
// reloadMu held.
func (d *discoverer) apply(p *Proxy, log interface {
	Error(msg string, args ...any)
}) {
	model := d.pl.model
	endpoints := []config.Endpoint{}
	if d.failed.Load() == nil {
		var ok bool
		if endpoints, ok = d.union(p, log); !ok {
			return
		}
	} else if len(d.pl.set.Load().model.Endpoints) == 0 {
		p.disc.endpoints.WithLabelValues(model).Set(0)
		return // none to remove
	}
	p.disc.endpoints.WithLabelValues(model).Set(float64(len(endpoints)))
	pc, err := p.planEndpoints(d.pl, d.path, endpoints)
	if err == nil && pc != nil {
		err = p.apply(*pc, "discovery")
	}
	if err != nil {
		p.disc.errors.WithLabelValues(model).Inc()
		log.Error("discovery: endpoints not applied; the pool keeps its endpoints", "error", err)
	}
}

// union returns the union of the sources' parts, in source order, and
// true; false while a source has not listed and discWait is not over. An
// engine listed by two sources is taken from the first (the other is
// logged and counted). Called with reloadMu held.
func (d *discoverer) union(p *Proxy, log interface {
	Error(msg string, args ...any)
}) ([]config.Endpoint, bool) {
	endpoints := []config.Endpoint{}
	seen := make(map[string]int)
	for j, l := range d.listed {
		if l == nil {
			if d.waited {
				continue
			}
			return nil, false // a source not listed yet
		}
		for _, e := range l {
			if first, dup := seen[e.ID]; dup {
				p.disc.errors.WithLabelValues(d.pl.model).Inc()
				log.Error("discovery: engine listed by two sources; it joins with the first one's endpoint template", "endpoint", e.ID,
					"first", d.paths[first], "again", d.paths[j])
				continue
			}
			seen[e.ID] = j
			endpoints = append(endpoints, e)
		}
	}
	return endpoints, true
}

// readyEngines returns the ready engines of a Service's EndpointSlices,
// sorted by ID: every endpoint whose conditions say ready and serving
// (unset counts as such, as the API documents; a Service with
// publishNotReadyAddresses has every endpoint ready, and only serving
// tells a pod not ready yet) and not terminating, at its first address
// and the port named port (a name or number; "" is the slice's only
// port). A backend listed twice (the IPv4 and IPv6 slices of a dual-stack
// Service) counts once, at its IPv4 address: a pod by its targetRef; an
// endpoint without one by its hostname, each IPv6 endpoint pairing with
// an IPv4 one of the same hostname (the API calls endpoints of one
// hostname fungible: one DNS name). An endpoint with neither is keyed by
// IP:port, and nothing tells its two addresses are one backend's:
// unkeyed reports that both families had such endpoints (their backends
// may be listed twice). Slices of other Services and of FQDN addresses
// are ignored; those whose port cannot be chosen are skipped, each with
// an error.
func readyEngines(service, port string, list []*discoveryv1.EndpointSlice) (_ []config.DiscoveredEngine, _ []error, unkeyed bool) {
	list = slices.Clone(list)
	slices.SortFunc(list, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(a.AddressType, b.AddressType), cmp.Compare(a.Name, b.Name)) // IPv4 before IPv6
	})
	var out []config.DiscoveredEngine
	var errs []error
	seen := make(map[string]bool)
	v4Hosts := make(map[string]int) // IPv4 endpoints without targetRef by hostname, not yet paired
	var bare [2]bool                // IPv4, IPv6 endpoints with neither targetRef nor hostname
	for _, s := range list {
		if s.Labels[discoveryv1.LabelServiceName] != service || len(s.Endpoints) == 0 ||
			(s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		n, err := slicePort(s, port)
		if err != nil {
			errs = append(errs, fmt.Errorf("EndpointSlice %s/%s: %w", s.Namespace, s.Name, err))
			continue
		}
		for _, e := range s.Endpoints {
			c := e.Conditions
			if (c.Ready != nil && !*c.Ready) || (c.Serving != nil && !*c.Serving) || (c.Terminating != nil && *c.Terminating) ||
				len(e.Addresses) == 0 {
				continue
			}
			host := e.Addresses[0]
			id := net.JoinHostPort(host, strconv.Itoa(n))
			v6 := s.AddressType == discoveryv1.AddressTypeIPv6
			switch {
			case e.TargetRef != nil && e.TargetRef.Name != "":
				id = e.TargetRef.Name
			case e.Hostname != nil && *e.Hostname != "" && !v6:
				v4Hosts[*e.Hostname]++
			case e.Hostname != nil && *e.Hostname != "":
				if v4Hosts[*e.Hostname] > 0 {
					v4Hosts[*e.Hostname]-- // the IPv4 endpoint's twin
					continue
				}
			default:
				bare[b2i(v6)] = true
			}
			if seen[id] {
				continue
			}
			seen[id] = true
			out = append(out, config.DiscoveredEngine{ID: id, Host: host, Port: n, Zone: deref(e.Zone), Node: deref(e.NodeName)})
		}
	}
	slices.SortFunc(out, func(a, b config.DiscoveredEngine) int { return cmp.Compare(a.ID, b.ID) })
	return out, errs, bare[0] && bare[1]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// slicePort returns the number of slice s's port named port (a name or a
// number), or of its only port when port is "". A port without a number
// (the API's "all ports") is not one to dial: it is ignored.
func slicePort(s *discoveryv1.EndpointSlice, port string) (int, error) {
	var names []string
	only := 0
	for _, sp := range s.Ports {
		if sp.Port == nil {
			continue
		}
		name := deref(sp.Name)
		names = append(names, cmp.Or(name, "(unnamed)")+"="+strconv.Itoa(int(*sp.Port)))
		only = int(*sp.Port)
		if port != "" && (name == port || strconv.Itoa(int(*sp.Port)) == port) {
			return int(*sp.Port), nil
		}
	}
	switch {
	case port != "":
		return 0, fmt.Errorf("no port %q among its ports [%s]", port, strings.Join(names, " "))
	case len(names) == 0:
		return 0, errors.New("it has no ports")
	case len(names) > 1:
		return 0, fmt.Errorf("several ports [%s] and discovery.kubernetes.port does not choose one", strings.Join(names, " "))
	}
	return only, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// discoveryMetrics are the discoveries' metrics.
type discoveryMetrics struct {
	endpoints *prometheus.GaugeVec   // model
	errors    *prometheus.CounterVec // model
}

func newDiscoveryMetrics() *discoveryMetrics {
	return &discoveryMetrics{
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvroute_discovery_endpoints",
			Help: "Ready engines the model's discovery saw at its last change (its pool's endpoints, before data-parallel ranks).",
		}, []string{"model"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_discovery_errors_total",
			Help: "Discovery errors: failed watches, EndpointSlices skipped (no usable port), endpoint lists not applied.",
		}, []string{"model"}),
	}
}

// addModel makes a discovered model's series, at zero.
func (m *discoveryMetrics) addModel(name string) {
	m.endpoints.WithLabelValues(name)
	m.errors.WithLabelValues(name)
}

func (m *discoveryMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.endpoints, m.errors}
}
