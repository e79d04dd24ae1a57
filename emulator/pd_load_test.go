package emulator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	dto "github.com/prometheus/client_model/go"
)

// gaugeOf is the value of the one series of family name, failing the test
// when the family is missing.
func gaugeOf(t *testing.T, mfs map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	v, ok := sample(mfs, name, nil)
	if !ok {
		t.Fatalf("no %s in /metrics", name)
	}
	return v
}

// checkGauges compares the gauges of want with a scrape of url.
func checkGauges(t *testing.T, what, url string, want map[string]float64) {
	t.Helper()
	mfs := scrape(t, url)
	for name, w := range want {
		if got := gaugeOf(t, mfs, name); got != w {
			t.Errorf("%s: got %s %v, want %v", what, name, got, w)
		}
	}
}

// sendAsync posts body to url with ctx in its own goroutine; the returned
// function waits for the answer and returns its status (0 and the error
// when there was no answer).
func sendAsync(ctx context.Context, url, body string) func() (int, string, error) {
	type answer struct {
		code int
		body string
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			ch <- answer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- answer{resp.StatusCode, string(b), err}
	}()
	return func() (int, string, error) {
		a := <-ch
		return a.code, a.body, a.err
	}
}

// TestPDDecodePullCountsWaiting: a decode engine's request whose KV is
// being pulled from the prefill engine is load the engine reports, as
// vLLM's scheduler keeps a do_remote_prefill request in its waiting queue
// (WAITING_FOR_REMOTE_KVS) while its KV arrives: vllm:num_requests_waiting
// (and the endpoint-load-metrics header, which vLLM reads from that
// gauge) and llamacpp:requests_deferred. The request was counted nowhere
// until its pull ended. The prefill side here is a side channel
// that holds the pull until the test releases it.
func TestPDDecodePullCountsWaiting(t *testing.T) {
	tests := []struct {
		flavor, protocol string
		during, after    map[string]float64
	}{
		{FlavorVLLM, PDNixl,
			map[string]float64{"vllm:num_requests_waiting": 1, "vllm:num_requests_running": 0},
			map[string]float64{"vllm:num_requests_waiting": 0}},
		{FlavorVLLMLegacy, PDNixl,
			map[string]float64{"vllm:num_requests_waiting": 1, "vllm:num_requests_running": 0},
			map[string]float64{"vllm:num_requests_waiting": 0}},
		{FlavorLlamaCpp, PDNixl,
			map[string]float64{"llamacpp:requests_deferred": 1, "llamacpp:requests_processing": 0},
			map[string]float64{"llamacpp:requests_deferred": 0}},
	}
	for _, tt := range tests {
		t.Run(tt.flavor, func(t *testing.T) {
			arrived, release := make(chan struct{}, 1), make(chan struct{})
			side := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				_ = json.NewEncoder(w).Encode(PullResponse{EngineID: "p"})
			}))
			defer side.Close()
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			defer unblock()
			host, port := splitHostPort(t, side.URL)
			_, ds := testServer(t, Config{Role: kvroute.RoleDecode, PDProtocol: tt.protocol, MetricsFlavor: tt.flavor,
				LoadFailure: LoadFailureFail})

			body := fmt.Sprintf(`{"prompt":%q,"max_tokens":3,"kv_transfer_params":{"do_remote_prefill":true,"remote_request_id":"r1","remote_host":%q,"remote_port":%d}}`,
				pdPrompt, host, port)
			wait := sendAsync(context.Background(), ds.URL+"/v1/completions", body)
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("timed out waiting for the decode engine's pull")
			}
			checkGauges(t, "during the pull", ds.URL, tt.during)
			if tt.flavor == FlavorVLLM {
				// vLLM's endpoint-load-metrics header reads
				// vllm:num_requests_waiting.
				req, _ := http.NewRequest(http.MethodPost, ds.URL+"/v1/completions", strings.NewReader(`{"prompt":"Hi","max_tokens":1}`))
				req.Header.Set("endpoint-load-metrics-format", "TEXT")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if got, want := resp.Header.Get("endpoint-load-metrics"), "named_metrics.num_requests_waiting=1.0"; !strings.Contains(got, want) {
					t.Errorf("during the pull: got endpoint-load-metrics %q, want %s", got, want)
				}
			}
			unblock()
			code, b, err := wait()
			if err != nil || code != 200 {
				t.Fatalf("decode: got %d %s (%v)", code, b, err)
			}
			checkGauges(t, "after the request", ds.URL, tt.after)
		})
	}
}
