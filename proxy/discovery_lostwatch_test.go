package proxy

import (
	"slices"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
	clienttesting "k8s.io/client-go/testing"
)

// TestDiscoveryLostWatch: the API server ends the informer's watch (a
// restart, a load balancer's idle timeout); the changes made while it was
// gone (a slice deleted, another added) are taken once it watches again.
func TestDiscoveryLostWatch(t *testing.T) {
	cluster := newFakeCluster()
	var mu sync.Mutex
	var watchers []watch.Interface
	cluster.client.PrependWatchReactor("endpointslices", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w, err := cluster.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return false, nil, err
		}
		mu.Lock()
		watchers = append(watchers, w)
		mu.Unlock()
		cluster.watches.Add(1)
		return true, w, nil
	})
	close(cluster.watching)
	a := slice("vllm-a", "vllm", "http", 8000, readyEndpoint("pod-a", "10.0.0.1"))
	cluster.put(t, a)
	tp := discoveryProxy(t, discoveryConfig("first"), cluster)
	waitFor(t, "pod-a", func() bool { return slices.Equal(endpointIDs(tp, "m"), []string{"pod-a"}) })
	mu.Lock()
	for _, w := range watchers {
		w.Stop()
	}
	n := len(watchers)
	mu.Unlock()
	cluster.remove(t, a)
	cluster.put(t, slice("vllm-b", "vllm", "http", 8000, readyEndpoint("pod-b", "10.0.0.2")))
	waitFor(t, "a new watch", func() bool { mu.Lock(); defer mu.Unlock(); return len(watchers) > n })
	waitFor(t, "pod-b alone", func() bool { return slices.Equal(endpointIDs(tp, "m"), []string{"pod-b"}) })
}
