package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/syncbuf"
)

// fakeCluster is a fake API server holding EndpointSlices. watching is
// closed once an informer watches them: a change made after that reaches
// it (the fake's watch would miss changes made between its list and its
// watch); watches counts the informers watching (one per discovery
// source).
type fakeCluster struct {
	client   *fake.Clientset
	watching chan struct{}
	watches  atomic.Int32
}

func newFakeCluster() *fakeCluster {
	c := &fakeCluster{client: fake.NewClientset(), watching: make(chan struct{})}
	var once sync.Once
	c.client.PrependWatchReactor("endpointslices", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w, err := c.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return false, nil, err
		}
		c.watches.Add(1)
		once.Do(func() { close(c.watching) })
		return true, w, nil
	})
	return c
}

func (c *fakeCluster) kubeClient(*config.Kubernetes) (kubernetes.Interface, string, error) {
	return c.client, "default", nil
}

func (c *fakeCluster) put(t testing.TB, s *discoveryv1.EndpointSlice) {
	t.Helper()
	api := c.client.DiscoveryV1().EndpointSlices(s.Namespace)
	_, err := api.Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		_, err = api.Create(context.Background(), s, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func (c *fakeCluster) remove(t testing.TB, s *discoveryv1.EndpointSlice) {
	t.Helper()
	if err := c.client.DiscoveryV1().EndpointSlices(s.Namespace).Delete(context.Background(), s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// slice is an EndpointSlice of Service svc in namespace "inference" with one
// port (name, number) and the endpoints eps.
func slice(name, svc, portName string, port int, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	p := int32(port)
	sp := discoveryv1.EndpointPort{Port: &p}
	if portName != "" {
		sp.Name = &portName
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{sp},
		Endpoints:   eps,
	}
}

// readyEndpoint is a ready endpoint of pod (no pod when ""), at ip.
func readyEndpoint(pod, ip string) discoveryv1.Endpoint {
	ready := true
	e := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
	if pod != "" {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: pod, Namespace: "inference"}
	}
	return e
}

func notReady(e discoveryv1.Endpoint) discoveryv1.Endpoint {
	f := false
	e.Conditions.Ready = &f
	return e
}

// terminating is e shutting down, still serving (as with
// publishNotReadyAddresses: ready unset).
func terminating(e discoveryv1.Endpoint) discoveryv1.Endpoint {
	t := true
	e.Conditions.Ready, e.Conditions.Terminating, e.Conditions.Serving = nil, &t, &t
	return e
}

// hostPort splits a test backend's URL.
func hostPort(t testing.TB, raw string) (string, int) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	h, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// discoveryConfig is a one-model config ("m", policy pol) discovering the
// engines of Service vllm in namespace inference, port "http".
func discoveryConfig(pol string) config.Config {
	c := testConfig(pol)
	c.Models[0].Signals.Disabled = true
	c.Debug.Enabled = true // /debug/endpoints
	c.Models[0].Discovery = &config.Discovery{Kubernetes: &config.Kubernetes{Service: "vllm", Namespace: "inference", Port: "http"}}
	return c
}

// discoveryProxy is a test proxy of cfg on cluster, its discovery running
// (debounced 10ms; sources that have listed applied after 1s without the
// others) until the test ends.
func discoveryProxy(t *testing.T, cfg config.Config, cluster *fakeCluster) *testProxy {
	t.Helper()
	return discoveryProxyOpts(t, Options{Config: cfg}, cluster)
}

// discoveryProxyOpts is discoveryProxy with opts (a Logger, say).
func discoveryProxyOpts(t *testing.T, opts Options, cluster *fakeCluster) *testProxy {
	t.Helper()
	opts.NewPicker, opts.KubeClient = testPickers, cluster.kubeClient
	tp := newTestProxyOpts(t, opts)
	p := tp.Proxy
	p.debounce, p.discWait = 10*time.Millisecond, time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.RunDiscovery(ctx) }()
	t.Cleanup(func() {
		cancel()
		recv(t, "RunDiscovery to return", done)
	})
	recv(t, "the informer's watch", cluster.watching)
	return tp
}

// checkNoEndpoints checks that a request for m is answered 503 with a
// Retry-After and an OpenAI error naming the model.
func checkNoEndpoints(t *testing.T, tp *testProxy) {
	t.Helper()
	resp := tp.post(t, PathCompletions, `{"model":"m","prompt":"hi"}`)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, `"error"`) || !strings.Contains(body, `model \"m\"`) || !strings.Contains(body, "no_endpoints") {
		t.Fatalf("got %d Retry-After %q %s, want 503 with a Retry-After and an error naming model \"m\"",
			resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// TestDiscoveryFollowsEndpointSlices: a model with discovery serves 503
// until a slice of its Service appears, then its engines take requests;
// an engine that becomes not ready, or terminating, takes no new requests
// while its stream in progress ends normally; with none left the model is
// 503 again. Reloads leave the discovered endpoints alone.
func TestDiscoveryFollowsEndpointSlices(t *testing.T) {
	release := make(chan struct{})
	streaming := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !strings.Contains(r.URL.RawQuery, "hold") {
				okHandler(name)(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"%s-0\"}]}\n\n", name)
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"%s-1\"}]}\n\ndata: [DONE]\n\n", name)
		}
	}
	a := newBackend(t, "a", streaming("a"))
	b := newBackend(t, "b", okHandler("b"))
	cluster := newFakeCluster()
	cfg := discoveryConfig("first")
	tp := discoveryProxy(t, cfg, cluster)

	checkNoEndpoints(t, tp)
	if resp, err := http.Get(tp.srv.URL + PathReadyz); err != nil {
		t.Fatal(err)
	} else if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"m"`) {
		t.Errorf("/readyz without endpoints: got %d %s, want 503 naming m", resp.StatusCode, body)
	}
	if resp, err := http.Get(tp.srv.URL + PathEndpoints); err != nil {
		t.Fatal(err)
	} else if body := readAll(t, resp); resp.StatusCode != http.StatusOK || !strings.Contains(body, `"endpoints":[]`) {
		t.Errorf("/debug/endpoints without endpoints: got %d %s", resp.StatusCode, body)
	}

	if tp.ui != nil { // the dashboard's state of an empty pool
		tp.ui.Sample(tp.clock.Now())
		resp, err := http.Get(tp.srv.URL + PathUI + "api/state")
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Errorf("dashboard state without endpoints: got %d %s", resp.StatusCode, body)
		}
	}

	ah, ap := hostPort(t, a.URL)
	bh, bp := hostPort(t, b.URL)
	sa := slice("vllm-a", "vllm", "http", ap, readyEndpoint("pod-a", ah))
	sb := slice("vllm-b", "vllm", "http", bp, readyEndpoint("pod-b", bh))
	cluster.put(t, sa)
	cluster.put(t, sb)
	cluster.put(t, slice("other", "other-svc", "http", bp, readyEndpoint("pod-x", bh)))
	waitFor(t, "both engines discovered", func() bool { return slices.Equal(endpointIDs(tp, "m"), []string{"pod-a", "pod-b"}) })
	if got := tp.metric(t, tp.disc.endpoints, "m"); got != 2 {
		t.Errorf("kvroute_discovery_endpoints: got %v, want 2", got)
	}
	if e := tp.Router("m").Endpoints()[0]; e.URL != a.URL {
		t.Errorf("pod-a's URL: got %s, want %s", e.URL, a.URL)
	}

	// A stream in progress on pod-a (policy first).
	resp := tp.post(t, PathCompletions+"?hold", `{"model":"m","prompt":"hi","stream":true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, "a-0") {
		t.Fatalf("first event: got %q, %v, want a-0", line, err)
	}

	// A reload (same file, or a changed discovery) leaves them alone.
	if res, err := tp.Reload(reloadTo(cfg)); err != nil || len(res.Models) != 0 || len(res.Restart) != 0 {
		t.Fatalf("reload of the same config: got %+v, %v; want no change", res, err)
	}
	next := discoveryConfig("first")
	next.Models[0].Discovery.Kubernetes.Service = "vllm-2"
	if res, err := tp.Reload(reloadTo(next)); err != nil || len(res.Models) != 0 || !slices.Contains(res.Restart, "models[0].discovery") {
		t.Fatalf("reload of another discovery: got %+v, %v; want models[0].discovery to restart", res, err)
	}
	if got := endpointIDs(tp, "m"); !slices.Equal(got, []string{"pod-a", "pod-b"}) {
		t.Fatalf("endpoints after reloads: got %v", got)
	}

	sa.Endpoints = []discoveryv1.Endpoint{notReady(readyEndpoint("pod-a", ah))}
	cluster.put(t, sa)
	waitFor(t, "pod-a gone", func() bool { return slices.Equal(endpointIDs(tp, "m"), []string{"pod-b"}) })
	hitsA := a.hits.Load()
	tp.postOK(t, 3, PathCompletions, `{"model":"m","prompt":"hi"}`)
	if a.hits.Load() != hitsA || b.hits.Load() != 3 {
		t.Errorf("after pod-a left: got a %d new, b %d requests; want 0, 3", a.hits.Load()-hitsA, b.hits.Load())
	}
	close(release)
	rest := events(t, rd)
	resp.Body.Close()
	if len(rest) != 2 || !strings.Contains(rest[0], "a-1") || rest[1] != "[DONE]" {
		t.Fatalf("the rest of pod-a's stream: got %q, want a-1 and [DONE]", rest)
	}

	sb.Endpoints = []discoveryv1.Endpoint{terminating(readyEndpoint("pod-b", bh))}
	cluster.put(t, sb)
	waitFor(t, "pod-b gone", func() bool { return len(endpointIDs(tp, "m")) == 0 })
	checkNoEndpoints(t, tp)
	if got := tp.metric(t, tp.disc.endpoints, "m"); got != 0 {
		t.Errorf("kvroute_discovery_endpoints: got %v, want 0", got)
	}

	// Back, then every slice deleted.
	sb.Endpoints = []discoveryv1.Endpoint{readyEndpoint("pod-b", bh)}
	cluster.put(t, sb)
	waitFor(t, "pod-b back", func() bool { return slices.Equal(endpointIDs(tp, "m"), []string{"pod-b"}) })
	cluster.remove(t, sa)
	cluster.remove(t, sb)
	waitFor(t, "every slice deleted", func() bool { return len(endpointIDs(tp, "m")) == 0 })
	checkNoEndpoints(t, tp)
	if got := tp.metric(t, tp.disc.errors, "m"); got != 0 {
		t.Errorf("kvroute_discovery_errors_total: got %v, want 0", got)
	}
}

// TestDiscoveryBadPort: a slice without the configured port is skipped and
// the error counted; the model stays without endpoints.
func TestDiscoveryBadPort(t *testing.T) {
	cluster := newFakeCluster()
	tp := discoveryProxy(t, discoveryConfig("first"), cluster)
	cluster.put(t, slice("vllm-a", "vllm", "metrics", 9000, readyEndpoint("pod-a", "10.0.0.1")))
	waitFor(t, "the error counted", func() bool { return tp.metric(t, tp.disc.errors, "m") >= 1 })
	if got := endpointIDs(tp, "m"); len(got) != 0 {
		t.Errorf("endpoints: got %v, want none", got)
	}
}

func TestReadyEngines(t *testing.T) {
	zone, node := "us-a", "n1"
	withZone := readyEndpoint("pod-z", "10.0.0.9")
	withZone.Zone, withZone.NodeName = &zone, &node
	twoPorts := slice("two", "vllm", "http", 8000, readyEndpoint("pod-t", "10.0.0.5"))
	metricsPort, metricsName := int32(9090), "metrics"
	twoPorts.Ports = append(twoPorts.Ports, discoveryv1.EndpointPort{Name: &metricsName, Port: &metricsPort})
	v6 := slice("v6", "vllm", "http", 8000, readyEndpoint("pod-a", "fd00::1"), readyEndpoint("pod-6", "fd00::6"))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	// h1 twice in each family: two backends; h2 only in IPv6.
	v6Hosts := slice("v6", "vllm", "http", 8000, hostEndpoint("h1", "fd00::1"), hostEndpoint("h1", "fd00::2"), hostEndpoint("h2", "fd00::3"))
	v6Hosts.AddressType = discoveryv1.AddressTypeIPv6
	tests := []struct {
		name    string
		port    string
		slices  []*discoveryv1.EndpointSlice
		want    []string // ID@host:port
		wantErr string
	}{
		{"port by name", "http", []*discoveryv1.EndpointSlice{slice("s", "vllm", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"))},
			[]string{"pod-a@10.0.0.1:8000"}, ""},
		{"port by number", "8000", []*discoveryv1.EndpointSlice{slice("s", "vllm", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"))},
			[]string{"pod-a@10.0.0.1:8000"}, ""},
		{"the only port", "", []*discoveryv1.EndpointSlice{slice("s", "vllm", "", 8000, readyEndpoint("pod-a", "10.0.0.1"))},
			[]string{"pod-a@10.0.0.1:8000"}, ""},
		{"chosen among two", "metrics", []*discoveryv1.EndpointSlice{twoPorts}, []string{"pod-t@10.0.0.5:9090"}, ""},
		{"ambiguous port", "", []*discoveryv1.EndpointSlice{twoPorts,
			slice("s", "vllm", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"))}, []string{"pod-a@10.0.0.1:8000"}, "several ports"},
		{"no such port", "grpc", []*discoveryv1.EndpointSlice{slice("s", "vllm", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"))},
			nil, `no port "grpc"`},
		{"not ready and terminating left out", "http", []*discoveryv1.EndpointSlice{slice("s", "vllm", "http", 8000,
			readyEndpoint("pod-a", "10.0.0.1"), notReady(readyEndpoint("pod-b", "10.0.0.2")), terminating(readyEndpoint("pod-c", "10.0.0.3")))},
			[]string{"pod-a@10.0.0.1:8000"}, ""},
		{"no pod: IP:port", "http", []*discoveryv1.EndpointSlice{slice("s", "vllm", "http", 8000, readyEndpoint("", "10.0.0.1"))},
			[]string{"10.0.0.1:8000@10.0.0.1:8000"}, ""},
		{"other services ignored", "http", []*discoveryv1.EndpointSlice{slice("s", "other", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"))},
			nil, ""},
		{"dual stack: once, IPv4", "http", []*discoveryv1.EndpointSlice{v6, slice("v4", "vllm", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"))},
			[]string{"pod-6@fd00::6:8000", "pod-a@10.0.0.1:8000"}, ""},
		{"dual stack without pods: once by hostname", "http", []*discoveryv1.EndpointSlice{v6Hosts, slice("v4", "vllm", "http", 8000,
			hostEndpoint("h1", "10.0.0.1"), hostEndpoint("h1", "10.0.0.2"))},
			[]string{"10.0.0.1:8000@10.0.0.1:8000", "10.0.0.2:8000@10.0.0.2:8000", "[fd00::3]:8000@fd00::3:8000"}, ""},
		{"sorted by ID", "http", []*discoveryv1.EndpointSlice{slice("s", "vllm", "http", 8000, readyEndpoint("pod-b", "10.0.0.2"), readyEndpoint("pod-a", "10.0.0.1"))},
			[]string{"pod-a@10.0.0.1:8000", "pod-b@10.0.0.2:8000"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs, _ := readyEngines("vllm", tc.port, tc.slices)
			var ids []string
			for _, e := range got {
				ids = append(ids, fmt.Sprintf("%s@%s:%d", e.ID, e.Host, e.Port))
			}
			if !slices.Equal(ids, tc.want) {
				t.Errorf("engines: got %v, want %v", ids, tc.want)
			}
			switch err := errors.Join(errs...); {
			case tc.wantErr == "" && err != nil:
				t.Errorf("errors: got %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("errors: got %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	got, _, _ := readyEngines("vllm", "http", []*discoveryv1.EndpointSlice{slice("s", "vllm", "http", 8000, withZone)})
	if len(got) != 1 || got[0].Zone != zone || got[0].Node != node {
		t.Errorf("zone and node: got %+v", got)
	}
}

// hostEndpoint is a ready endpoint without a pod, of hostname host ("":
// none), at ip.
func hostEndpoint(host, ip string) discoveryv1.Endpoint {
	e := readyEndpoint("", ip)
	if host != "" {
		e.Hostname = &host
	}
	return e
}

// TestDiscoveryDualStackWithoutTargetRef: a dual-stack Service's backends
// are listed in an IPv4 and an IPv6 EndpointSlice; those without a
// targetRef (a Service without selector, its slices written by hand or by
// a controller) were keyed by IP:port, so each took two engines' share.
// One with a hostname is now taken once, at its IPv4 address, its IPv6
// twin paired by hostname; endpoints of one hostname within a family stay
// distinct; one with neither is still listed per address (nothing tells
// they are one backend), and the router warns once.
func TestDiscoveryDualStackWithoutTargetRef(t *testing.T) {
	var logs syncbuf.Buffer
	cluster := newFakeCluster()
	tp := discoveryProxyOpts(t, Options{Config: discoveryConfig("first"),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}, cluster)
	v4 := slice("vllm-v4", "vllm", "http", 8000, hostEndpoint("engine-a", "10.0.0.1"), hostEndpoint("engine-b", "10.0.0.2"),
		hostEndpoint("engine-b", "10.0.0.3"), hostEndpoint("", "10.0.0.4"))
	v6 := slice("vllm-v6", "vllm", "http", 8000, hostEndpoint("engine-a", "fd00::1"), hostEndpoint("engine-b", "fd00::2"),
		hostEndpoint("engine-b", "fd00::3"), hostEndpoint("", "fd00::4"))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	cluster.put(t, v4)
	cluster.put(t, v6)
	want := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000", "[fd00::4]:8000"}
	waitFor(t, "the dual-stack engines", func() bool { return slices.Equal(endpointIDs(tp, "m"), want) })
	v4.Endpoints = append(v4.Endpoints, hostEndpoint("engine-c", "10.0.0.5")) // a second listing, still warned once
	cluster.put(t, v4)
	want = slices.Insert(want, 4, "10.0.0.5:8000")
	waitFor(t, "engine-c", func() bool { return slices.Equal(endpointIDs(tp, "m"), want) })
	if n := strings.Count(logs.String(), "without targetRef or hostname"); n != 1 {
		t.Errorf("warnings about endpoints without targetRef or hostname in both families: got %d, want 1; log:\n%s", n, logs.String())
	}
}

// TestDiscoveryShutdown: RunDiscovery returns once ctx is done, and the
// informers' goroutines are gone.
func TestDiscoveryShutdown(t *testing.T) {
	cluster := newFakeCluster()
	p, err := New(Options{Config: discoveryConfig("first"), NewPicker: testPickers, KubeClient: cluster.kubeClient})
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.RunDiscovery(ctx) }()
	recv(t, "the informer's watch", cluster.watching)
	if err := p.RunDiscovery(ctx); err == nil {
		t.Error("a second RunDiscovery: got nil error, want already running")
	}
	cancel()
	if err := recv(t, "RunDiscovery to return", done); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the informer goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

// TestDiscoveryClientError: a discovery that cannot get a client leaves
// its model without endpoints, and RunDiscovery says why, naming the field.
func TestDiscoveryClientError(t *testing.T) {
	p, err := New(Options{Config: discoveryConfig("first"), NewPicker: testPickers,
		KubeClient: func(*config.Kubernetes) (kubernetes.Interface, string, error) {
			return nil, "", errors.New("no kubeconfig")
		}})
	if err != nil {
		t.Fatalf("New: %v (it does not connect)", err)
	}
	err = p.RunDiscovery(context.Background())
	if err == nil || !strings.Contains(err.Error(), "models[0].discovery.kubernetes: no kubeconfig") {
		t.Errorf("RunDiscovery: got %v, want an error naming models[0].discovery.kubernetes", err)
	}
	if n := len(p.Router("m").Endpoints()); n != 0 {
		t.Errorf("endpoints: got %d, want 0", n)
	}
}

// TestDiscoveryKVEvents: a discovered model whose endpoint template
// publishes KV events has a precise index from the start (it has no
// endpoints yet), and each engine discovered gets its KV-event
// subscription at its pod's address and the template's port.
func TestDiscoveryKVEvents(t *testing.T) {
	a := newBackend(t, "a", okHandler("a"))
	host, port := hostPort(t, a.URL)
	cluster := newFakeCluster()
	cfg := discoveryConfig("first")
	m := &cfg.Models[0]
	m.Precise = config.Precise{Tokenizer: config.BuiltinTokenizer}
	m.Discovery.Kubernetes.Endpoint.KVEvents = config.KVEventPorts{Port: 5557}
	tp := discoveryProxy(t, cfg, cluster)
	if tp.PreciseIndex("m") == nil {
		t.Fatal("no precise index for a discovered model whose engines publish KV events")
	}
	<-cluster.watching
	cluster.put(t, slice("s1", "vllm", "http", port, readyEndpoint("pod-a", host)))
	waitFor(t, "pod-a discovered", func() bool { return len(tp.Router("m").Endpoints()) == 1 })
	var got []string
	for _, ts := range tp.signalTargets() {
		for _, tg := range ts {
			if tg.KVEvents != nil {
				got = append(got, tg.Endpoint+" "+tg.KVEvents.Address)
			}
		}
	}
	if want := "pod-a tcp://" + host + ":5557"; len(got) != 1 || got[0] != want {
		t.Errorf("KV-event subscriptions: got %q, want [%s]", got, want)
	}
}

// TestDiscoverySourceNeverLists: of a model's two sources, one is refused
// its list (no Role in its namespace). The other's engines join once the
// sources have had their wait, rather than never.
func TestDiscoverySourceNeverLists(t *testing.T) {
	e := newBackend(t, "e", okHandler("e"))
	cfg := discoveryConfig("first")
	cfg.Models[0].Discovery.Sources = []config.Source{{Kubernetes: &config.Kubernetes{Service: "vllm", Namespace: "locked", Port: "http"}}}
	cluster := newFakeCluster()
	cluster.client.PrependReactor("list", "endpointslices", func(a clienttesting.Action) (bool, k8sruntime.Object, error) {
		if a.GetNamespace() == "locked" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", nil)
		}
		return false, nil, nil
	})
	h, port := hostPort(t, e.URL)
	cluster.put(t, slice("vllm-a", "vllm", "http", port, readyEndpoint("e-0", h)))
	tp := discoveryProxy(t, cfg, cluster)
	waitFor(t, "the listed source's engine joins", func() bool {
		eps := tp.Router("m").Endpoints()
		return len(eps) == 1 && eps[0].ID == "inference/e-0"
	})
	tp.postOK(t, 1, PathCompletions, `{"model":"m","prompt":"hi"}`)
}

// TestReadyEnginesAllPortsEntry: an EndpointSlice port without a number
// means "all ports" and is not a port to dial; with it first and one
// numbered port after, discovery.kubernetes.port "" took the first entry's
// number and dereferenced nil (the router crashed). The numbered port is
// now taken.
func TestReadyEnginesAllPortsEntry(t *testing.T) {
	s := slice("s", "vllm", "", 8000, readyEndpoint("pod-a", "10.0.0.1"))
	s.Ports = append([]discoveryv1.EndpointPort{{}}, s.Ports...)
	got, errs, _ := readyEngines("vllm", "", []*discoveryv1.EndpointSlice{s})
	if len(errs) != 0 || len(got) != 1 || got[0].Port != 8000 {
		t.Errorf("got %+v, errors %v; want pod-a at port 8000", got, errs)
	}
}

// TestDiscoveryRunAgainForgetsOldLists: RunDiscovery run again (after its
// context ended) kept each source's list of the run before, so a source
// refused its list in the new run still counted as listed and its old
// engines stayed in the pool for good. Each run now starts with no lists:
// once the sources have had their wait, the pool is the engines of those
// that listed in this run.
func TestDiscoveryRunAgainForgetsOldLists(t *testing.T) {
	cfg := discoveryConfig("first")
	cfg.Models[0].Discovery.Sources = []config.Source{{Kubernetes: &config.Kubernetes{Service: "vllm", Namespace: "locked", Port: "http"}}}
	cluster := newFakeCluster()
	var locked atomic.Bool
	cluster.client.PrependReactor("list", "endpointslices", func(a clienttesting.Action) (bool, k8sruntime.Object, error) {
		if a.GetNamespace() == "locked" && locked.Load() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "discovery.k8s.io", Resource: "endpointslices"}, "", nil)
		}
		return false, nil, nil
	})
	cluster.put(t, slice("vllm-a", "vllm", "http", 8000, readyEndpoint("e-0", "10.0.0.1")))
	other := slice("vllm-b", "vllm", "http", 8000, readyEndpoint("d-0", "10.0.0.2"))
	other.Namespace = "locked"
	cluster.put(t, other)
	tp := newTestProxyOpts(t, Options{Config: cfg, NewPicker: testPickers, KubeClient: cluster.kubeClient})
	p := tp.Proxy
	p.debounce, p.discWait = 10*time.Millisecond, time.Second
	ids := func() []string {
		var out []string
		for _, e := range tp.Router("m").Endpoints() {
			out = append(out, e.ID)
		}
		return out
	}
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.RunDiscovery(ctx) }()
		return func() {
			cancel()
			recv(t, "RunDiscovery to return", done)
		}
	}
	stop := run()
	waitFor(t, "both sources' engines", func() bool { return slices.Equal(ids(), []string{"inference/e-0", "locked/d-0"}) })
	stop()
	locked.Store(true)
	stop = run()
	defer stop()
	waitFor(t, "only the listed source's engine, after the wait", func() bool { return slices.Equal(ids(), []string{"inference/e-0"}) })
}

// TestReadyEnginesNotServing: a Service with publishNotReadyAddresses
// (a StatefulSet's headless Service, often) has its EndpointSlices say
// ready for every pod, a pod still loading its model included: only
// conditions.serving tells it is not ready. Such a pod was taken as an
// engine; an endpoint whose serving is false is now left out (unset
// still counts as serving).
func TestReadyEnginesNotServing(t *testing.T) {
	f := false
	loading := readyEndpoint("pod-b", "10.0.0.2")
	loading.Conditions.Serving = &f
	s := slice("s", "vllm", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"), loading)
	got, errs, _ := readyEngines("vllm", "http", []*discoveryv1.EndpointSlice{s})
	if len(errs) != 0 || len(got) != 1 || got[0].ID != "pod-a" {
		t.Errorf("got %+v, errors %v; want pod-a alone", got, errs)
	}
}
