package proxy

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/policy"
)

// TestPDInflightIsRecorded: kvroute_inflight_requests counts the requests
// an endpoint of a P/D pool is serving, as it does on an aggregated pool:
// a decode leg streaming its answer is in flight on the decode endpoint
// until its answer ends. It stayed 0 on every endpoint of a P/D pool
// whatever they served.
func TestPDInflightIsRecorded(t *testing.T) {
	ps, _ := pdEngine(t, kvroute.RolePrefill, "nixl")
	streaming, release := make(chan struct{}), make(chan struct{})
	ds, _ := pdEngineHook(t, kvroute.RoleDecode, "nixl", func(w http.ResponseWriter, r *http.Request) bool {
		flushEvents(w, "data: {\"n\":0}\n\n")
		close(streaming)
		<-release
		fmt.Fprint(w, "data: [DONE]\n\n")
		return true
	})
	tp := newTestProxyWith(t, pdTestConfig("", "nixl", ps.URL, ds.URL), policy.New)
	done := make(chan string)
	go func() {
		resp := tp.post(t, PathCompletions, `{"model":"tiny","prompt":"a prompt handed off to decode","stream":true,"max_tokens":4}`)
		done <- readAll(t, resp)
	}()
	recv(t, "the decode leg's first event", streaming)
	// The prefill leg has ended: its reply was read before the decode leg.
	if d, p := tp.metric(t, tp.metrics.inflight, "tiny", "d0"), tp.metric(t, tp.metrics.inflight, "tiny", "p0"); d != 1 || p != 0 {
		t.Errorf("kvroute_inflight_requests while the decode leg streams: got d0 %v, p0 %v; want 1, 0", d, p)
	}
	close(release)
	recv(t, "the answer's end", done)
	// The gauge falls when the leg's answer is closed, which may follow
	// the client's last byte: wait for it.
	waitFor(t, "d0's inflight back to 0", func() bool { return tp.metric(t, tp.metrics.inflight, "tiny", "d0") == 0 })
}
