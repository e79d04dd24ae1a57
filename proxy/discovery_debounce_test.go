package proxy

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// TestDiscoveryDebounceWindow: a change of the EndpointSlices is applied
// defaultDebounce after it, with the changes that came meanwhile, and
// not defaultDebounce after the last change: a rollout that changes the
// slices more often than that is followed, not held back until it is
// over. Run on synctest's virtual clock.
func TestDiscoveryDebounceWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cluster := newFakeCluster()
		p, err := New(Options{Config: discoveryConfig("first"), NewPicker: testPickers, KubeClient: cluster.kubeClient})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.RunDiscovery(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()
		<-cluster.watching
		time.Sleep(time.Second) // the first (empty) list applied
		synctest.Wait()
		ids := func() []string {
			var out []string
			for _, e := range p.Router("m").Endpoints() {
				out = append(out, e.ID)
			}
			return out
		}

		// A pod joins every 100ms, for a second.
		var want []string
		for i := range 10 {
			pod := fmt.Sprintf("pod-%d", i)
			cluster.put(t, slice(pod, "vllm", "http", 8000, readyEndpoint(pod, fmt.Sprintf("10.0.0.%d", i+1))))
			want = append(want, pod)
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
			if i == 2 { // 250ms after the first change, during the rollout
				if got := ids(); !slices.Equal(got, want[:3]) {
					t.Errorf("%v after the first change, with changes every 100ms: endpoints %v, want %v",
						300*time.Millisecond, got, want[:3])
				}
			}
		}
		time.Sleep(defaultDebounce)
		synctest.Wait()
		if got := ids(); !slices.Equal(got, want) {
			t.Errorf("after the rollout: endpoints %v, want %v", got, want)
		}
	})
}
