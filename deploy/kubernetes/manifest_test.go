// Package kubernetes holds example Kubernetes manifests for kvroute
// (kvroute.yaml: the router with its RBAC and config; vllm.yaml: engines it
// discovers). It has no Go code: its tests keep the manifests true to the
// code they deploy.
package kubernetes

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	clienttesting "k8s.io/client-go/testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
)

// manifestFiles are the files checked; every document of each is decoded.
var manifestFiles = []string{"kvroute.yaml", "vllm.yaml"}

// routerName is the router's Deployment (and the container in it).
const routerName = "kvroute"

// object is one document of a manifest file.
type object struct {
	where string // file#document, for errors
	obj   runtime.Object
}

// set is every object of the manifests.
type set struct{ objs []object }

// loadManifests decodes every document of the manifest files with the
// client-go scheme, strictly: an unknown kind, an unknown or duplicate field
// is an error.
func loadManifests(t *testing.T) *set {
	t.Helper()
	dec := json.NewSerializerWithOptions(json.DefaultMetaFactory, clientscheme.Scheme, clientscheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	s := &set{}
	for _, file := range manifestFiles {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for i := 0; ; i++ {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			where := fmt.Sprintf("%s#%d", file, i)
			var v any
			if err := yaml.Unmarshal(doc, &v); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if v == nil {
				continue // only comments
			}
			obj, gvk, err := dec.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			m, err := metaOf(obj)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			where = fmt.Sprintf("%s: %s %s", where, gvk.Kind, m.GetName())
			s.objs = append(s.objs, object{where: where, obj: obj})
		}
	}
	if len(s.objs) == 0 {
		t.Fatal("no objects in the manifests")
	}
	return s
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// all returns the objects of type T.
func all[T runtime.Object](s *set) []T {
	var out []T
	for _, o := range s.objs {
		if v, ok := o.obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the object of type T named name.
func one[T interface {
	runtime.Object
	GetName() string
}](t *testing.T, s *set, name string) T {
	t.Helper()
	for _, v := range all[T](s) {
		if v.GetName() == name {
			return v
		}
	}
	var zero T
	t.Fatalf("no %T named %q in %v", zero, name, manifestFiles)
	return zero
}

// namespace is the one namespace of every object.
func namespace(t *testing.T, s *set) string {
	t.Helper()
	ns := ""
	for _, o := range s.objs {
		m, _ := metaOf(o.obj)
		switch {
		case m.GetNamespace() == "":
			t.Errorf("%s: no metadata.namespace (the RoleBinding's subject needs one: set it on every object)", o.where)
		case ns == "":
			ns = m.GetNamespace()
		case m.GetNamespace() != ns:
			t.Errorf("%s: namespace %q, others %q: the example is one namespace", o.where, m.GetNamespace(), ns)
		}
	}
	return ns
}

// router is the router's Deployment, its kvroute container, its config
// (the ConfigMap file its --config names, through the real loader) and
// the config file's text.
type router struct {
	dep      *appsv1.Deployment
	c        *corev1.Container
	cfg      config.Config
	cfgText  []byte
	cfgPath  string // --config's value
	cfgIndex int    // where --config's value is in c.Args
}

func loadRouter(t *testing.T, s *set) router {
	t.Helper()
	dep := one[*appsv1.Deployment](t, s, routerName)
	r := router{dep: dep}
	for i := range dep.Spec.Template.Spec.Containers {
		if c := &dep.Spec.Template.Spec.Containers[i]; c.Name == routerName {
			r.c = c
		}
	}
	if r.c == nil {
		t.Fatalf("Deployment %s: no container %q", dep.Name, routerName)
	}
	if len(r.c.Args) == 0 || r.c.Args[0] != "serve" {
		t.Fatalf("Deployment %s: args %q do not start with the serve command", dep.Name, r.c.Args)
	}
	r.cfgPath, r.cfgIndex = flagValue(r.c.Args[1:], "config")
	if r.cfgIndex < 0 {
		t.Fatalf("Deployment %s: args %q have no --config FILE", dep.Name, r.c.Args)
	}
	r.cfgIndex++ // Args[0] is serve
	r.cfgText = mountedFile(t, s, &dep.Spec.Template.Spec, r.c, r.cfgPath)
	cfg, err := config.Parse(r.cfgText)
	if err != nil {
		t.Fatalf("the config at %s (the ConfigMap's): %v", r.cfgPath, err)
	}
	r.cfg = cfg
	return r
}

// flagValue returns the value of flag name in args (-name v, --name v,
// -name=v or --name=v; the last one wins, as with package flag) and its
// index in args, or -1.
func flagValue(args []string, name string) (string, int) {
	v, at := "", -1
	for i := 0; i < len(args); i++ {
		a := strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-")
		if a == args[i] {
			continue
		}
		switch {
		case a == name && i+1 < len(args):
			v, at = args[i+1], i+1
			i++
		case strings.HasPrefix(a, name+"="):
			v, at = a[len(name)+1:], i
		}
	}
	return v, at
}

// mountedFile returns the content of the file at file in container c:
// a key of a ConfigMap mounted as a volume of pod spec.
func mountedFile(t *testing.T, s *set, spec *corev1.PodSpec, c *corev1.Container, file string) []byte {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path.Clean(file), path.Clean(vm.MountPath)+"/")
		if !ok {
			continue
		}
		if vm.SubPath != "" {
			t.Errorf("volumeMount %s uses subPath: an edited ConfigMap would never reach the file", vm.Name)
		}
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 || spec.Volumes[i].ConfigMap == nil {
			t.Fatalf("%s is under the mount of volume %q, which is not a ConfigMap volume", file, vm.Name)
		}
		src := spec.Volumes[i].ConfigMap
		key := rel
		if len(src.Items) > 0 {
			j := slices.IndexFunc(src.Items, func(k corev1.KeyToPath) bool { return k.Path == rel })
			if j < 0 {
				t.Fatalf("ConfigMap volume %q maps no key to %s", vm.Name, rel)
			}
			key = src.Items[j].Key
		}
		cm := one[*corev1.ConfigMap](t, s, src.Name)
		data, ok := cm.Data[key]
		if !ok {
			t.Fatalf("ConfigMap %s has no key %q (the file %s)", cm.Name, key, file)
		}
		return []byte(data)
	}
	t.Fatalf("container %s: %s is under none of its volumeMounts", c.Name, file)
	return nil
}

// containerPort returns c's port named or numbered p, or fails.
func containerPort(t *testing.T, c *corev1.Container, p intstr.IntOrString, what string) corev1.ContainerPort {
	t.Helper()
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp
		}
	}
	t.Fatalf("%s: port %s is not a port of container %s (%v)", what, p.String(), c.Name, c.Ports)
	return corev1.ContainerPort{}
}

// selected returns the Deployments whose pods Service svc selects.
func selected(s *set, svc *corev1.Service) []*appsv1.Deployment {
	var out []*appsv1.Deployment
	if len(svc.Spec.Selector) == 0 {
		return nil
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	for _, d := range all[*appsv1.Deployment](s) {
		if d.Namespace == svc.Namespace && sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			out = append(out, d)
		}
	}
	return out
}

// TestManifestsDecode checks that every document decodes strictly, that
// everything is in one namespace, and that each Deployment's selector
// selects its own pods.
func TestManifestsDecode(t *testing.T) {
	s := loadManifests(t)
	if ns := namespace(t, s); ns == "" {
		t.Fatal("no namespace")
	}
	seen := map[string]string{}
	for _, o := range s.objs {
		m, _ := metaOf(o.obj)
		k := fmt.Sprintf("%T/%s", o.obj, m.GetName())
		if w, dup := seen[k]; dup {
			t.Errorf("%s: also defined at %s", o.where, w)
		}
		seen[k] = o.where
	}
	for _, d := range all[*appsv1.Deployment](s) {
		sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Deployment %s: selector %v does not select its pod template's labels %v (%v)", d.Name, d.Spec.Selector, d.Spec.Template.Labels, err)
		}
	}
}

// TestRouterConfig checks the router's config: it loads with kvroute's own
// loader (config.Parse, then proxy.New as serve --check-config does), every
// model discovers its engines from a Service of these manifests, on a port
// that Service has, and the engines serve the model's name.
func TestRouterConfig(t *testing.T) {
	s := loadManifests(t)
	ns := namespace(t, s)
	r := loadRouter(t, s)
	if _, err := proxy.New(proxy.Options{Config: r.cfg, NewPicker: policy.New}); err != nil {
		t.Fatalf("the router's config: %v", err)
	}
	if len(r.cfg.Models) == 0 {
		t.Fatal("the router's config has no model")
	}
	for _, m := range r.cfg.Models {
		if !m.Discovered() || m.Discovery.Kubernetes == nil {
			t.Errorf("model %s: no discovery.kubernetes (the example is about discovery)", m.Name)
			continue
		}
		k := m.Discovery.Kubernetes
		if k.Kubeconfig != "" {
			t.Errorf("model %s: discovery.kubernetes.kubeconfig %q: in a pod the router uses its service account", m.Name, k.Kubeconfig)
		}
		if k.Namespace != "" && k.Namespace != ns {
			t.Errorf("model %s: discovery.kubernetes.namespace %q is not the manifests' %q (the Role is there)", m.Name, k.Namespace, ns)
		}
		svc := one[*corev1.Service](t, s, k.Service)
		var sp *corev1.ServicePort
		for i, p := range svc.Spec.Ports {
			if (k.Port == "" && len(svc.Spec.Ports) == 1) || p.Name == k.Port || strconv.Itoa(int(p.Port)) == k.Port {
				sp = &svc.Spec.Ports[i]
			}
		}
		if sp == nil {
			t.Errorf("model %s: discovery.kubernetes.port %q does not choose a port of Service %s (%v)", m.Name, k.Port, svc.Name, svc.Spec.Ports)
			continue
		}
		engines := selected(s, svc)
		if len(engines) == 0 {
			t.Errorf("Service %s selects no Deployment's pods: its EndpointSlices would be empty", svc.Name)
		}
		for _, d := range engines {
			for i := range d.Spec.Template.Spec.Containers {
				c := &d.Spec.Template.Spec.Containers[i]
				if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
					return (sp.TargetPort.Type == intstr.String && p.Name == sp.TargetPort.StrVal) ||
						(sp.TargetPort.Type == intstr.Int && p.ContainerPort == sp.TargetPort.IntVal)
				}) {
					continue
				}
				if name, at := flagValue(c.Args, "served-model-name"); at >= 0 && name != m.Name {
					t.Errorf("Deployment %s serves --served-model-name %q, the router's model is %q", d.Name, name, m.Name)
				}
				if port, at := flagValue(c.Args, "port"); at >= 0 {
					cp := containerPort(t, c, sp.TargetPort, "Service "+svc.Name)
					if port != strconv.Itoa(int(cp.ContainerPort)) {
						t.Errorf("Deployment %s: --port %s, but Service %s's port %s targets %d", d.Name, port, svc.Name, sp.Name, cp.ContainerPort)
					}
				}
			}
		}
	}
}

// TestRouterDeployment checks the router's Deployment and Service against
// its config and the routes the router serves.
func TestRouterDeployment(t *testing.T) {
	s := loadManifests(t)
	r := loadRouter(t, s)
	_, lp, err := net.SplitHostPort(r.cfg.Listen)
	if err != nil {
		t.Fatalf("listen %q: %v", r.cfg.Listen, err)
	}
	listenPort, err := strconv.Atoi(lp)
	if err != nil {
		t.Fatalf("listen %q: not a numeric port", r.cfg.Listen)
	}
	if flag, at := flagValue(r.c.Args, "listen"); at >= 0 {
		t.Fatalf("args set --listen %s: keep the address in the config (the checks derive the port from it)", flag)
	}
	if !slices.ContainsFunc(r.c.Ports, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == listenPort }) {
		t.Errorf("container %s: no containerPort %d (the config's listen %q): %v", r.c.Name, listenPort, r.cfg.Listen, r.c.Ports)
	}
	for _, pr := range []struct {
		name string
		p    *corev1.Probe
		path string
	}{{"readinessProbe", r.c.ReadinessProbe, proxy.PathReadyz}, {"livenessProbe", r.c.LivenessProbe, proxy.PathHealthz}} {
		if pr.p == nil || pr.p.HTTPGet == nil {
			t.Errorf("container %s: no %s httpGet", r.c.Name, pr.name)
			continue
		}
		if pr.p.HTTPGet.Path != pr.path {
			t.Errorf("container %s: %s path %q, the router serves %s", r.c.Name, pr.name, pr.p.HTTPGet.Path, pr.path)
		}
		if cp := containerPort(t, r.c, pr.p.HTTPGet.Port, pr.name); int(cp.ContainerPort) != listenPort {
			t.Errorf("container %s: %s on port %d, the router listens on %d", r.c.Name, pr.name, cp.ContainerPort, listenPort)
		}
		if sc := pr.p.HTTPGet.Scheme; sc != "" && sc != corev1.URISchemeHTTP {
			t.Errorf("container %s: %s scheme %s, the router serves plain HTTP", r.c.Name, pr.name, sc)
		}
	}
	spec := &r.dep.Spec.Template.Spec
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	if time.Duration(grace)*time.Second <= r.cfg.Timeouts.Shutdown {
		t.Errorf("terminationGracePeriodSeconds %d is not above timeouts.shutdown %v: the drain would be killed", grace, r.cfg.Timeouts.Shutdown)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the router pod does not set runAsNonRoot: true")
	}
	if sc := r.c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("the router container is not readOnlyRootFilesystem: true, allowPrivilegeEscalation: false")
	}
	if _, ok := r.c.Resources.Requests[corev1.ResourceCPU]; !ok {
		t.Error("the router container requests no cpu")
	}
	if _, ok := r.c.Resources.Requests[corev1.ResourceMemory]; !ok {
		t.Error("the router container requests no memory")
	}

	svc := one[*corev1.Service](t, s, routerName)
	if got := selected(s, svc); len(got) != 1 || got[0] != r.dep {
		t.Errorf("Service %s selects %d Deployments, not just the router's", svc.Name, len(got))
	}
	for _, p := range svc.Spec.Ports {
		tp := p.TargetPort
		if tp.Type == intstr.Int && tp.IntVal == 0 {
			tp = intstr.FromInt32(p.Port)
		}
		if cp := containerPort(t, r.c, tp, "Service "+svc.Name); int(cp.ContainerPort) != listenPort {
			t.Errorf("Service %s port %s targets %d, the router listens on %d", svc.Name, p.Name, cp.ContainerPort, listenPort)
		}
	}
}

// TestRouterPreStop: on SIGTERM the router closes its listener at once
// (http.Server.Shutdown), while the Service's endpoints, kube-proxy and
// any ingress drop the terminating pod only some seconds later: the
// connections they still sent it meanwhile were refused. The container
// now sleeps in a preStop hook first, and the grace period covers that
// sleep, the drain (timeouts.shutdown) and the second after it.
func TestRouterPreStop(t *testing.T) {
	r := loadRouter(t, loadManifests(t))
	lc := r.c.Lifecycle
	if lc == nil || lc.PreStop == nil || lc.PreStop.Sleep == nil || lc.PreStop.Sleep.Seconds <= 0 {
		t.Fatalf("container %s: no lifecycle.preStop.sleep: the router stops accepting connections while the Service still sends them", r.c.Name)
	}
	sleep := time.Duration(lc.PreStop.Sleep.Seconds) * time.Second
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if g := r.dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = *g
	}
	if need := sleep + r.cfg.Timeouts.Shutdown + time.Second; time.Duration(grace)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds %d is not above the preStop sleep %v + timeouts.shutdown %v + 1s", grace, sleep, r.cfg.Timeouts.Shutdown)
	}
}

// TestEngineDrain: the router takes a terminating engine out of its pool
// (no new request) and lets the requests in progress on it finish, but
// vLLM aborts every request in progress at SIGTERM unless started with
// --shutdown-timeout (its default 0 is an immediate shutdown), and gets
// SIGTERM the moment its pod starts terminating, before the router has
// seen the EndpointSlice change. Each vLLM container of a Deployment behind
// a Service the router discovers now sleeps in a preStop hook first (the
// router stops sending it requests meanwhile), then drains for
// --shutdown-timeout, and its grace period covers both.
func TestEngineDrain(t *testing.T) {
	s := loadManifests(t)
	r := loadRouter(t, s)
	ns := namespace(t, s)
	checked := 0
	for _, m := range r.cfg.Models {
		srcs, _ := m.Discovery.KubernetesSources()
		for _, k := range srcs {
			if k.Namespace != "" && k.Namespace != ns {
				continue
			}
			for _, dep := range selected(s, one[*corev1.Service](t, s, k.Service)) {
				spec := &dep.Spec.Template.Spec
				grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
				if g := spec.TerminationGracePeriodSeconds; g != nil {
					grace = *g
				}
				for i := range spec.Containers {
					c := &spec.Containers[i]
					if !slices.Contains(append(slices.Clone(c.Command), c.Args...), "serve") || !strings.Contains(c.Image, "vllm") {
						continue
					}
					checked++
					v, at := flagValue(c.Args, "shutdown-timeout")
					drain, err := strconv.Atoi(v)
					if at < 0 || err != nil || drain <= 0 {
						t.Errorf("Deployment %s container %s: no --shutdown-timeout SECONDS above 0 (got %q): vLLM aborts the requests in progress at SIGTERM",
							dep.Name, c.Name, v)
					}
					lc := c.Lifecycle
					if lc == nil || lc.PreStop == nil || lc.PreStop.Sleep == nil || lc.PreStop.Sleep.Seconds < 2 {
						t.Errorf("Deployment %s container %s: no lifecycle.preStop.sleep of 2s or more: vLLM gets SIGTERM before the router "+
							"has seen the pod terminating", dep.Name, c.Name)
						continue
					}
					if need := lc.PreStop.Sleep.Seconds + int64(drain); grace <= need {
						t.Errorf("Deployment %s: terminationGracePeriodSeconds %d is not above the preStop sleep %ds + --shutdown-timeout %ds",
							dep.Name, grace, lc.PreStop.Sleep.Seconds, drain)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no vLLM container behind a Service the router discovers")
	}
}

// rbacGrant is one (API group, resource, verb) a Role grants or a client
// used.
type rbacGrant struct{ group, resource, verb string }

func (g rbacGrant) String() string { return g.verb + " " + g.resource + "." + g.group }

// TestRBAC runs the router's discovery (the real informer of package proxy)
// for the config's models against a fake API server that allows only what
// the manifests' Role grants the Deployment's ServiceAccount, with an
// EndpointSlice of the engines' Service as Kubernetes would publish it. The
// discovery must find the engine without being denied anything, and the
// Role must grant exactly what it used.
func TestRBAC(t *testing.T) {
	s := loadManifests(t)
	ns := namespace(t, s)
	r := loadRouter(t, s)

	// The ServiceAccount the router runs as, and what is bound to it.
	saName := r.dep.Spec.Template.Spec.ServiceAccountName
	if saName == "" || saName == "default" {
		t.Fatalf("the router's Deployment runs as ServiceAccount %q: give it its own", saName)
	}
	sa := one[*corev1.ServiceAccount](t, s, saName)
	if (sa.AutomountServiceAccountToken != nil && !*sa.AutomountServiceAccountToken) ||
		(r.dep.Spec.Template.Spec.AutomountServiceAccountToken != nil && !*r.dep.Spec.Template.Spec.AutomountServiceAccountToken) {
		t.Error("automountServiceAccountToken is false: discovery uses the in-cluster token")
	}
	granted := map[rbacGrant]bool{}
	for _, rb := range all[*rbacv1.RoleBinding](s) {
		if !slices.ContainsFunc(rb.Subjects, func(sub rbacv1.Subject) bool {
			return sub.Kind == rbacv1.ServiceAccountKind && sub.Name == saName && sub.Namespace == ns
		}) {
			continue
		}
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.APIGroup != rbacv1.GroupName {
			t.Fatalf("RoleBinding %s: roleRef %v is not a Role of %s", rb.Name, rb.RoleRef, rbacv1.GroupName)
		}
		role := one[*rbacv1.Role](t, s, rb.RoleRef.Name)
		for _, rule := range role.Rules {
			if len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
				t.Fatalf("Role %s: rule %v: resourceNames would not allow list and watch", role.Name, rule)
			}
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						if g == "*" || res == "*" || v == "*" {
							t.Fatalf("Role %s grants a wildcard (%s %s.%s): grant exactly what discovery uses", role.Name, v, res, g)
						}
						granted[rbacGrant{g, res, v}] = true
					}
				}
			}
		}
	}
	if len(granted) == 0 {
		t.Fatalf("no RoleBinding binds a Role to ServiceAccount %s/%s", ns, saName)
	}

	// A fake API server that enforces the grants, holding one ready engine
	// of each discovered Service, published as the EndpointSlice controller
	// does: the Service's port name, the pods' container port.
	client := fake.NewClientset()
	var mu sync.Mutex // the informers' goroutines call allow
	used := map[rbacGrant]bool{}
	var denied []string
	allow := func(a clienttesting.Action) error {
		mu.Lock()
		defer mu.Unlock()
		g := rbacGrant{a.GetResource().Group, a.GetResource().Resource, a.GetVerb()}
		if a.GetSubresource() != "" {
			g.resource += "/" + a.GetSubresource()
		}
		if a.GetNamespace() != ns || !granted[g] {
			denied = append(denied, fmt.Sprintf("%s in namespace %q", g, a.GetNamespace()))
			return apierrors.NewForbidden(schema.GroupResource{Group: g.group, Resource: g.resource}, "", errors.New("not granted by the manifests' Role"))
		}
		used[g] = true
		return nil
	}
	client.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if err := allow(a); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
	client.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
		if err := allow(a); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
	for i, m := range r.cfg.Models {
		k := m.Discovery.Kubernetes
		svc := one[*corev1.Service](t, s, k.Service)
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: svc.Name + "-x7k2p", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		for _, d := range selected(s, svc) {
			for j := range d.Spec.Template.Spec.Containers {
				c := &d.Spec.Template.Spec.Containers[j]
				for _, sp := range svc.Spec.Ports {
					if p := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool {
						return (sp.TargetPort.Type == intstr.String && p.Name == sp.TargetPort.StrVal) ||
							(sp.TargetPort.Type == intstr.Int && p.ContainerPort == sp.TargetPort.IntVal)
					}); p >= 0 {
						slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: &sp.Name, Port: &c.Ports[p].ContainerPort})
					}
				}
			}
			ready := true
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("192.0.2.%d", 10+i)},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: d.Name + "-0"},
			})
		}
		if err := client.Tracker().Add(slice); err != nil {
			t.Fatal(err)
		}
	}

	cfg := r.cfg
	cfg.HealthCheck.Disabled = true // no probes of the fake engines
	for i := range cfg.Models {
		cfg.Models[i].Signals.Disabled = true
	}
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Options{
		Config: cfg, NewPicker: policy.New, Registerer: reg,
		KubeClient: func(*config.Kubernetes) (kubernetes.Interface, string, error) { return client, ns, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.RunDiscovery(ctx) }()
	found := func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			if mf.GetName() != "kvroute_discovery_endpoints" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() >= 1 {
					n++
				}
			}
		}
		return n == len(cfg.Models)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !found() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	ok := found()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock() // the informers have stopped; for the race detector's sake
	defer mu.Unlock()
	if !ok {
		t.Error("the discovery did not find the engine of every model's Service within 15s")
	}
	if len(denied) > 0 {
		t.Errorf("the discovery was denied %q: the Role must grant it", denied)
	}
	for g := range granted {
		if !used[g] {
			t.Errorf("the Role grants %s, which the discovery never uses: grant exactly what it needs", g)
		}
	}
}

// TestRouterBinary builds kvroute and runs the router's container args
// (the --config path mapped to the ConfigMap's file, --listen to a free
// local port, no cluster reachable): the args must parse with the real
// serve flags and the config load, /healthz (liveness) must answer 200 and
// /readyz (readiness) 503, no engine being discovered, and SIGTERM must
// stop it cleanly. It builds the binary, so -short skips it.
func TestRouterBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/kvroute")
	}
	s := loadManifests(t)
	r := loadRouter(t, s)
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvroute")
	// Built as this test binary was (-race or not): the packages it shares
	// with the test come from the build cache (a cold build of kvroute
	// alone takes minutes on a small machine).
	buildArgs := []string{"build", "-o", bin}
	if raceEnabled {
		buildArgs = append(buildArgs, "-race")
	}
	build := exec.Command("go", append(buildArgs, "github.com/kvroute/kvroute/cmd/kvroute")...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfgFile := filepath.Join(dir, path.Base(r.cfgPath))
	if err := os.WriteFile(cfgFile, r.cfgText, 0o600); err != nil {
		t.Fatal(err)
	}
	args := slices.Clone(r.c.Args)
	if a := args[r.cfgIndex]; strings.Contains(a, "=") && strings.HasPrefix(a, "-") {
		args[r.cfgIndex] = a[:strings.Index(a, "=")+1] + cfgFile
	} else {
		args[r.cfgIndex] = cfgFile
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	args = append(args, "--listen", addr)

	cmd := exec.Command(bin, args...)
	for _, e := range os.Environ() { // no cluster: not in-cluster, no kubeconfig
		if k, _, _ := strings.Cut(e, "="); !strings.HasPrefix(k, "KUBERNETES_") && k != "KUBECONFIG" && k != "HOME" {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+dir, "KUBECONFIG="+filepath.Join(dir, "no-kubeconfig"))
	var stderr syncbuf.Buffer // read while the process writes it
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed when it has exited, with waitErr
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	}()

	get := func(p string) int {
		resp, err := http.Get("http://" + addr + p)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	livePath, readyPath := r.c.LivenessProbe.HTTPGet.Path, r.c.ReadinessProbe.HTTPGet.Path
	deadline := time.Now().Add(30 * time.Second)
	for get(livePath) != http.StatusOK {
		select {
		case <-exited:
			t.Fatalf("kvroute %q exited: %v\n%s", args, waitErr, &stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvroute %q: GET %s is not 200 after 30s\n%s", args, livePath, &stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := get(readyPath); code != http.StatusServiceUnavailable {
		t.Errorf("GET %s with no engine discovered: %d, want 503\n%s", readyPath, code, &stderr)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("kvroute after SIGTERM: %v\n%s", waitErr, &stderr)
		}
	case <-time.After(r.cfg.Timeouts.Shutdown + 10*time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("kvroute still running after SIGTERM and timeouts.shutdown + 10s\n%s", &stderr)
	}
}
