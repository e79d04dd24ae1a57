package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestPDDataParallel: a prefill/decode model whose prefill and decode
// servers are data-parallel validates, listed or discovered, and its
// ranks are prefill and decode endpoints pinned by their place behind the
// URL.
func TestPDDataParallel(t *testing.T) {
	c, err := Parse([]byte(`
models:
  - name: ds
    endpoints:
      - {id: p, url: 'http://p:8000', role: prefill, data_parallel_size: 2}
      - {id: d, url: 'http://d:8000', role: decode, data_parallel_size: 2}
  - name: ds-discovered
    discovery:
      kubernetes:
        service: ds-prefill
        endpoint: {role: prefill, data_parallel_size: 4}
      sources:
        - kubernetes:
            service: ds-decode
            endpoint: {role: decode, data_parallel_size: 8}
`))
	if err != nil {
		t.Fatalf("got %v, want a P/D model with data-parallel endpoints to validate", err)
	}
	eps, err := c.Models[0].KVEndpoints()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range eps {
		got = append(got, fmt.Sprintf("%s %s %d/%d", e.ID, e.Role, e.DataParallelRank, e.DataParallelSize))
	}
	want := "p#dp0 prefill 0/2, p#dp1 prefill 1/2, d#dp0 decode 0/2, d#dp1 decode 1/2"
	if strings.Join(got, ", ") != want {
		t.Errorf("ranks: got %s, want %s", strings.Join(got, ", "), want)
	}
	srcs, _ := c.Models[1].Discovery.KubernetesSources()
	e := srcs[1].EndpointOf(DiscoveredEngine{ID: "ds-decode-0", Host: "10.0.0.9", Port: 8000})
	if r, _ := kvroute.ParseRole(e.Role); r != kvroute.RoleDecode || e.DataParallelSize != 8 {
		t.Errorf("a discovered decode engine: got role %q data_parallel_size %d, want decode 8", e.Role, e.DataParallelSize)
	}
}
