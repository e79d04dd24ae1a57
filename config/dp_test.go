package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

func TestDataParallelExpansion(t *testing.T) {
	cfg, err := Parse([]byte(`
models:
  - name: m
    endpoints:
      - id: gpu-0
        url: http://10.0.0.7:8000/
        weight: 2
        labels: {zone: a}
        kv_capacity_tokens: 1000
        data_parallel_size: 3
      - url: http://10.0.0.8:8000
`))
	if err != nil {
		t.Fatal(err)
	}
	eps, err := cfg.Models[0].KVEndpoints()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range eps {
		got = append(got, fmt.Sprintf("%s %s dp=%v %d/%d w=%d cap=%d zone=%s", e.ID, e.URL, e.IsDataParallel(),
			e.DataParallelRank, e.DataParallelSize, e.Weight, e.KVCapacityTokens, e.Labels["zone"]))
	}
	want := []string{
		"gpu-0#dp0 http://10.0.0.7:8000 dp=true 0/3 w=2 cap=1000 zone=a",
		"gpu-0#dp1 http://10.0.0.7:8000 dp=true 1/3 w=2 cap=1000 zone=a",
		"gpu-0#dp2 http://10.0.0.7:8000 dp=true 2/3 w=2 cap=1000 zone=a",
		// The zero value of the new fields: not data-parallel.
		"http://10.0.0.8:8000 http://10.0.0.8:8000 dp=false 0/0 w=1 cap=0 zone=",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if cfg.Models[0].Endpoints[1].DataParallelSize != 1 {
		t.Errorf("data_parallel_size default: got %d, want 1", cfg.Models[0].Endpoints[1].DataParallelSize)
	}
	eps[1].Labels["zone"] = "b"
	if eps[0].Labels["zone"] != "a" {
		t.Error("ranks share their labels map")
	}

	// A node of a multi-node deployment: ranks 8 and 9 behind its URL,
	// pinned as its engine cores 0 and 1.
	cfg, err = Parse([]byte("models: [{name: m, endpoints: [{id: n1, url: 'http://n1:8000', data_parallel_size: 2, data_parallel_start_rank: 8}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	if eps, err = cfg.Models[0].KVEndpoints(); err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, e := range eps {
		got = append(got, fmt.Sprintf("%s %d/%d", e.ID, e.DataParallelRank, e.DataParallelSize))
	}
	if strings.Join(got, ", ") != "n1#dp8 0/2, n1#dp9 1/2" {
		t.Errorf("with data_parallel_start_rank 8: got %s, want n1#dp8 0/2, n1#dp9 1/2", strings.Join(got, ", "))
	}
}

func TestDataParallelValidation(t *testing.T) {
	const prefix = "models:\n  - name: m\n    "
	tests := []struct {
		name, yaml string
		want       []string // field: message fragment
	}{
		{"negative", "endpoints: [{url: 'http://a:1', data_parallel_size: -2}]",
			[]string{"models[0].endpoints[0].data_parallel_size: -2 is not positive"}},
		{"too large", "endpoints: [{url: 'http://a:1', data_parallel_size: 5000}]",
			[]string{"models[0].endpoints[0].data_parallel_size: 5000 is above 1024"}},
		{"prefill/decode pool", "endpoints: [{url: 'http://a:1', role: prefill, data_parallel_size: 2}, {url: 'http://b:1', role: decode, data_parallel_size: 2}]", nil},
		{"both role in a P/D pool", "endpoints: [{url: 'http://a:1', role: prefill}, {url: 'http://b:1', data_parallel_size: 2}]", nil},
		{"nixl prefill start rank", "endpoints: [{url: 'http://a:1', role: prefill, data_parallel_size: 2, data_parallel_start_rank: 2}, {url: 'http://b:1', role: decode}]", nil},
		{"sglang prefill start rank", "pd: {protocol: sglang}\n    endpoints: [{url: 'http://a:1', role: prefill, data_parallel_size: 2, data_parallel_start_rank: 2}, {url: 'http://b:1', role: decode}]",
			[]string{"models[0].endpoints[0].data_parallel_start_rank: 2: with pd.protocol sglang a prefill endpoint must front all its server's ranks (start rank 0)"}},
		{"sglang decode start rank", "pd: {protocol: sglang}\n    endpoints: [{url: 'http://a:1', role: prefill, data_parallel_size: 2}, {url: 'http://b:1', role: decode, data_parallel_size: 2, data_parallel_start_rank: 2}]", nil},
		{"sglang metrics", "signals: {flavor: sglang}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 2}]",
			[]string{`models[0].endpoints[0].data_parallel_size: 2 needs vLLM metrics, whose engine label tells the ranks apart; signals.flavor "sglang"`}},
		{"endpoint flavor", "endpoints: [{url: 'http://a:1', data_parallel_size: 2, signals: {flavor: llamacpp}}]",
			[]string{`models[0].endpoints[0].data_parallel_size: 2 needs vLLM metrics`}},
		{"sglang without signals", "signals: {flavor: sglang, disabled: true}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 2}]", nil},
		{"sglang endpoint not scraped", "endpoints: [{url: 'http://a:1', data_parallel_size: 2, signals: {flavor: tgi, disabled: true}}]", nil},
		{"ipc events", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 2, kv_events: {address: 'ipc:///tmp/kv'}}]",
			[]string{"models[0].endpoints[0].kv_events.address: with data_parallel_size 2: vLLM offsets only tcp:// ports"}},
		{"replay port overflow", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 4, kv_events: {address: 'tcp://a:5557', replay_address: 'tcp://a:65534'}}]",
			[]string{`models[0].endpoints[0].kv_events.replay_address: with data_parallel_size 4: "tcp://a:65534": port 65534 + rank 3 is above 65535`}},
		{"tcp events", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 8, kv_events: {address: 'tcp://a:5557', replay_address: 'tcp://a:5600'}}]", nil},
		{"rank ID taken", "endpoints: [{id: 'g#dp1', url: 'http://a:1'}, {id: g, url: 'http://b:1', data_parallel_size: 2}]",
			[]string{`models[0].endpoints[1].id: rank 1's ID "g#dp1" (data_parallel_size 2) is models[0].endpoints[0]'s ID`}},
		{"rank ID taken by a later endpoint", "endpoints: [{id: g, url: 'http://b:1', data_parallel_size: 2}, {id: 'g#dp0', url: 'http://a:1'}]",
			[]string{`models[0].endpoints[0].id: rank 0's ID "g#dp0" (data_parallel_size 2) is models[0].endpoints[1]'s ID`}},
		{"replay ports overlap the event ports", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 4, kv_events: {address: 'tcp://a:5557', replay_address: 'tcp://a:5558'}}]",
			[]string{"models[0].endpoints[0].kv_events.replay_address: port 5558: with data_parallel_size 4 the ranks' replay ports 5558-5561 overlap their event ports 5557-5560"}},
		{"replay ports just clear", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 4, kv_events: {address: 'tcp://a:5557', replay_address: 'tcp://a:5553'}}]", nil},
		{"replay ports on another host", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 4, kv_events: {address: 'tcp://a:5557', replay_address: 'tcp://b:5558'}}]", nil},
		{"rank ID is another data-parallel endpoint's ID", "endpoints: [{id: x, url: 'http://a:1', data_parallel_size: 2}, {id: 'x#dp0', url: 'http://b:1', data_parallel_size: 2}]",
			[]string{`models[0].endpoints[0].id: rank 0's ID "x#dp0" (data_parallel_size 2) is models[0].endpoints[1]'s ID`}},
		{"two data-parallel engines", "endpoints: [{id: g, url: 'http://b:1', data_parallel_size: 2}, {id: h, url: 'http://a:1', data_parallel_size: 3}]", nil},
		{"one", "endpoints: [{url: 'http://a:1', data_parallel_size: 1}]", nil},
		{"start rank", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 4, data_parallel_start_rank: 4, kv_events: {address: 'tcp://a:5557'}}]", nil},
		{"negative start rank", "endpoints: [{url: 'http://a:1', data_parallel_size: 2, data_parallel_start_rank: -1}]",
			[]string{"models[0].endpoints[0].data_parallel_start_rank: -1 is negative"}},
		{"start rank of one", "endpoints: [{url: 'http://a:1', data_parallel_start_rank: 3}]",
			[]string{"models[0].endpoints[0].data_parallel_start_rank: 3 needs data_parallel_size above 1"}},
		{"start rank past the ports", "precise: {tokenizer: builtin}\n    endpoints: [{url: 'http://a:1', data_parallel_size: 2, data_parallel_start_rank: 8, kv_events: {address: 'tcp://a:65527'}}]",
			[]string{`models[0].endpoints[0].kv_events.address: with data_parallel_size 2: "tcp://a:65527": port 65527 + rank 9 is above 65535`}},
		{"start rank ID taken", "endpoints: [{id: 'g#dp5', url: 'http://a:1'}, {id: g, url: 'http://b:1', data_parallel_size: 2, data_parallel_start_rank: 4}]",
			[]string{`models[0].endpoints[1].id: rank 5's ID "g#dp5" (data_parallel_size 2) is models[0].endpoints[0]'s ID`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(prefix + tc.yaml))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("got %v, want field errors", err)
			}
			if len(errs) != len(tc.want) {
				t.Fatalf("got %d errors (%v), want %d", len(errs), err, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(errs[i].Error(), w) {
					t.Errorf("error %d: got %q, want it to start with %q", i, errs[i].Error(), w)
				}
			}
		})
	}
}

func TestDataParallelAddress(t *testing.T) {
	tests := []struct {
		addr    string
		rank    int
		want    string
		wantErr string
	}{
		{"tcp://10.0.0.7:5557", 0, "tcp://10.0.0.7:5557", ""},
		{"tcp://10.0.0.7:5557", 3, "tcp://10.0.0.7:5560", ""},
		{"tcp://*:5557", 1, "tcp://*:5558", ""},
		{"tcp://[::1]:5557", 2, "tcp://[::1]:5559", ""},
		{"inproc://cache", 2, "inproc://cache_dp2", ""},
		{"ipc:///tmp/kv", 0, "ipc:///tmp/kv", ""}, // rank 0 keeps any address, as vLLM does
		{"ipc:///tmp/kv", 1, "", "use a tcp:// address"},
		{"tcp://host", 1, "", "has no port"},
		{"tcp://host:65535", 1, "", "above 65535"},
		{"", 4, "", ""},
	}
	for _, tc := range tests {
		got, err := DataParallelAddress(tc.addr, tc.rank)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("DataParallelAddress(%q, %d): got %q, %v; want an error containing %q", tc.addr, tc.rank, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("DataParallelAddress(%q, %d): got %q, %v; want %q", tc.addr, tc.rank, got, err, tc.want)
		}
	}
}

func ExampleDataParallelAddress() {
	for r := range 3 {
		a, _ := DataParallelAddress("tcp://10.0.0.7:5557", r)
		fmt.Println(kvroute.DataParallelID("gpu-0", r), a)
	}
	// Output:
	// gpu-0#dp0 tcp://10.0.0.7:5557
	// gpu-0#dp1 tcp://10.0.0.7:5558
	// gpu-0#dp2 tcp://10.0.0.7:5559
}
