package disagg

import (
	"net/http"
	"testing"
)

// TestReservedDataParallelRank: a client cannot pin an SGLang rank in a P/D
// pool by any of the body fields SGLang reads one from (the router chooses
// bootstrap_room so that the prefill rank is room modulo the DP size).
func TestReservedDataParallelRank(t *testing.T) {
	for _, f := range []string{"routed_dp_rank", "disagg_prefill_dp_rank", "data_parallel_rank"} {
		if err := CheckClientRequest([]byte(`{"model":"m","prompt":"x","`+f+`":1}`), http.Header{}); err == nil {
			t.Errorf("%s: accepted, want 400 reserved_field", f)
		}
	}
}
