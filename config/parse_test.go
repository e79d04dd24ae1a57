package config

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name, yaml, wantErr string
	}{
		{"minimal", "models: [{name: m, endpoints: [{url: 'http://127.0.0.1:8000'}]}]", ""},
		{"empty", "", "the file is empty"},
		{"two documents", "models: []\n---\nlisten: ':1'\n", "more than one YAML document"},
		{"unknown field", "modelz: []", `line 1: unknown field "modelz"`},
		{"unknown fields, one line", "listen: ':1'\nmodels: [{name: m, endpointz: [], endpoints: [{url: 'http://a:1', wieght: 2}]}]",
			`line 2: unknown field "endpointz"; line 2: unknown field "wieght"`},
		{"duration without unit", "timeouts: {dial: 5}", "line 1: cannot unmarshal !!int `5` into time.Duration (a duration has a unit: \"5s\", \"500ms\")"},
		{"invalid", "models: []", "models: at least one model is required"},
		{"every error", "listen: x\nmodels: [{name: m, endpoints: [{url: 'ftp://a'}]}]",
			`listen: "x" is not a host:port address; models[0].endpoints[0].url: "ftp://a" is not an http(s) URL`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.yaml))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if cfg.Listen != DefaultListen || cfg.Models[0].Policy.Name != DefaultPolicy {
					t.Errorf("defaults not applied: listen %q policy %q", cfg.Listen, cfg.Models[0].Policy.Name)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Parse: got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// FuzzParse: no input makes Parse panic; what it accepts is valid,
// complete (ApplyDefaults changes nothing more) and survives a round trip
// through YAML; what it rejects for validation names each field.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("../kvroute.example.yaml"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"models: [{name: m, endpoints: [{url: 'http://127.0.0.1:8000'}]}]",
		"models: [{name: m, endpoints: [{url: 'http://a:1', role: prefill}, {url: 'http://b:1', role: decode}], pd: {mode: always}}]",
		"listen: ':9'\ntimeouts: {dial: 2s}\nmodels: [{name: m, router: {block_chars: 64}, endpoints: [{url: 'http://a:1', kv_events: {address: 'tcp://a:5557'}}], precise: {tokenizer: builtin}}]",
		"models: [{name: m, endpoints: [{url: 'http://a:1', signals: {scrape_interval: -1s}}]}]",
		"models: [{name: m, policy: {name: kv-aware, params: {c: 1.5}}, endpoints: [{url: 'http://a:1'}]}]",
		"models: [{name: m, discovery: {sources: [{kubernetes: {service: p, endpoint: {role: prefill}}}, {kubernetes: {service: d, namespace: x, endpoint: {role: decode, data_parallel_size: 2}}}]}, pd: {mode: always}}]",
		"models: [{name: m, endpoints: [{url: 'http://a:1', role: prefill, data_parallel_size: 2}, {url: 'http://b:1', role: decode, data_parallel_size: 4, data_parallel_start_rank: 4}], pd: {protocol: sglang}}]",
		"&a [*a]", "models: !!binary aGVsbG8=", "{", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			var es Errors
			if errors.As(err, &es) {
				for _, e := range es {
					if e.Path == "" || e.Msg == "" {
						t.Fatalf("field error without a path or message: %#v", e)
					}
				}
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v", err)
		}
		again := cfg
		again.Models = append([]Model(nil), cfg.Models...)
		for i := range again.Models {
			again.Models[i].Endpoints = append([]Endpoint(nil), cfg.Models[i].Endpoints...)
		}
		again.ApplyDefaults()
		if !reflect.DeepEqual(again, cfg) {
			t.Fatalf("ApplyDefaults changed an accepted config:\n%+v\n%+v", cfg, again)
		}
		for i := range cfg.Models {
			if _, err := cfg.Models[i].KVEndpoints(); err != nil {
				t.Fatalf("KVEndpoints of model %d: %v", i, err)
			}
		}
		out, err := yaml.Marshal(&cfg)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("the accepted config, written back, is rejected: %v\n%s", err, out)
		}
		// Compared as YAML: a nil and an empty list or map are one to
		// the file.
		if out2, err := yaml.Marshal(&back); err != nil || string(out2) != string(out) {
			t.Fatalf("round trip changed the config (%v):\n%s\n%s", err, out, out2)
		}
	})
}
