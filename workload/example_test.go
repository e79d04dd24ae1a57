package workload_test

import (
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/workload"
)

func Example() {
	trace := `{"timestamp": 0, "input_length": 700, "output_length": 20, "hash_ids": [0, 1]}
{"timestamp": 250, "input_length": 900, "output_length": 10, "hash_ids": [0, 2]}
`
	w, err := workload.ReadTrace(strings.NewReader(trace), workload.ReadOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	a := w.Requests[0].BlockHashes(16, nil)
	b := w.Requests[1].BlockHashes(16, nil)
	shared := 0
	for shared < min(len(a), len(b)) && a[shared] == b[shared] {
		shared++
	}
	fmt.Println(len(w.Requests), w.Requests[1].Arrival, len(a), len(b), shared)
	// Output: 2 250ms 43 56 32
}
