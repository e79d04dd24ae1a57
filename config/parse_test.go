package config

import (
	"errors"
	"fmt"
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
		{"comments only", "# listen: ':8080'\n\n  # models: []\n", "the file holds no settings (only comments or blank lines)"},
		{"two documents", "models: []\n---\nlisten: ':1'\n", "more than one YAML document"},
		{"unknown field", "modelz: []", `line 1: unknown field "modelz"`},
		{"unknown fields, one line", "listen: ':1'\nmodels: [{name: m, endpointz: [], endpoints: [{url: 'http://a:1', wieght: 2}]}]",
			`line 2: unknown field "endpointz" in models[0]; line 2: unknown field "wieght" in models[0].endpoints[0]`},
		{"duration without unit", "timeouts: {dial: 5}", "line 1: timeouts.dial: cannot unmarshal !!int `5` into time.Duration (a duration has a unit: \"5s\", \"500ms\")"},
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
		"models: [{name: m, adapters: [sql, chat], endpoints: [{url: 'http://a:1', adapters: [sql]}, {url: 'http://b:1'}]}, {name: n, adapters: [fr], endpoints: [{url: 'http://c:1'}]}]",
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

// TestParseRefusesWhatTheDecoderDropsSilently: the YAML decoder truncates
// a fraction given for a whole-number field (weight: 0.5 became 0, then
// the default 1; retry.attempts: 1.5 became 1, no retries) and drops an
// empty list entry (a "-" with nothing under it), which also shifted the
// indices that later errors name. Each is an error naming its field.
// parseErrorCase is a document Parse refuses with Errors holding want.
type parseErrorCase struct {
	name, yaml, want string
}

// checkParseErrors runs Parse on each case.
func checkParseErrors(t *testing.T, tests []parseErrorCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			var es Errors
			if !errors.As(err, &es) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: got %v, want config.Errors with %q", err, tc.want)
			}
		})
	}
}

func TestParseRefusesWhatTheDecoderDropsSilently(t *testing.T) {
	const oneModel = "models: [{name: m, endpoints: [{url: 'http://a:1'}]}]\n"
	pdModel := func(pd string) string {
		return "models: [{name: m, pd: {" + pd + "}, endpoints: [{url: 'http://a:1', role: prefill}, {url: 'http://b:1', role: decode}]}]"
	}
	tests := []parseErrorCase{
		{"fraction for an int", "models: [{name: m, endpoints: [{url: 'http://a:1', weight: 0.5}]}]",
			"models[0].endpoints[0].weight: 0.5 is not a whole number"},
		// A weight of 0 became the default 1: a full share for an
		// endpoint its writer meant to drain.
		{"weight 0", "models: [{name: m, endpoints: [{url: 'http://a:1', weight: 3}, {url: 'http://b:1', weight: 0}]}]",
			"models[0].endpoints[1].weight: 0 is refused (unset, the field takes its default, not 0): to send an endpoint nothing, remove it"},
		{"weight 0 in a discovery template", "models: [{name: m, discovery: {kubernetes: {service: s, endpoint: {weight: 0.0}}}}]",
			"models[0].discovery.kubernetes.endpoint.weight: 0 is refused (unset, the field takes its default, not 0): to send an endpoint nothing, remove it"},
		// A 0 that the default replaced without a word: timeouts.shutdown
		// 0s (no drain) became 30s, read_header, idle and dial 0 (no
		// limit in net/http) 10s, 120s and 5s.
		{"shutdown 0s", "timeouts: {shutdown: 0s}\n" + oneModel,
			`timeouts.shutdown: "0s" is refused (unset, the field takes its default, not 0): to close in-flight requests at once, without a drain, write 1ms`},
		{"read_header quoted 0", "timeouts: {read_header: '0'}\n" + oneModel, "timeouts.read_header: 0 is refused"},
		{"read_body 0ms", "timeouts: {read_body: 0ms}\n" + oneModel, `timeouts.read_body: "0ms" is refused`},
		{"idle -0h", "timeouts: {idle: -0h}\n" + oneModel, `timeouts.idle: "-0h" is refused`},
		{"dial 0s", "timeouts: {dial: 0s}\n" + oneModel, `timeouts.dial: "0s" is refused`},
		{"dial 0s through an alias", "timeouts: {read_body: &z 0s, dial: *z}\n" + oneModel, `timeouts.dial: "0s" is refused`},
		{"upstream_idle 0s", "timeouts: {upstream_idle: 0s}\n" + oneModel, `timeouts.upstream_idle: "0s" is refused`},
		{"max_body_bytes 0", "limits: {max_body_bytes: 0}\n" + oneModel, "limits.max_body_bytes: 0 is refused"},
		{"max_header_bytes 0", "limits: {max_header_bytes: 0}\n" + oneModel, "limits.max_header_bytes: 0 is refused"},
		{"retry attempts 0", "retry: {attempts: 0}\n" + oneModel, "retry.attempts: 0 is refused (unset, the field takes its default, not 0): 1 tries one endpoint, without retries"},
		{"queue_wait 0s", "retry: {queue_wait: 0s}\n" + oneModel, `retry.queue_wait: "0s" is refused`},
		{"health interval 0s", "health_check: {interval: 0s}\n" + oneModel, `health_check.interval: "0s" is refused (unset, the field takes its default, not 0): to turn active health checks off, write disabled: true`},
		{"health timeout 0s", "health_check: {timeout: 0s}\n" + oneModel, `health_check.timeout: "0s" is refused`},
		{"healthy_threshold 0", "health_check: {healthy_threshold: 0}\n" + oneModel, "health_check.healthy_threshold: 0 is refused"},
		{"unhealthy_threshold 0", "health_check: {unhealthy_threshold: 0}\n" + oneModel, "health_check.unhealthy_threshold: 0 is refused"},
		{"block_chars 0", "models: [{name: m, router: {block_chars: 0}, endpoints: [{url: 'http://a:1'}]}]", "models[0].router.block_chars: 0 is refused"},
		{"router stale_after 0s", "models: [{name: m, router: {stale_after: 0s}, endpoints: [{url: 'http://a:1'}]}]", `models[0].router.stale_after: "0s" is refused`},
		{"fail_threshold 0", "models: [{name: m, router: {fail_threshold: 0}, endpoints: [{url: 'http://a:1'}]}]", "models[0].router.fail_threshold: 0 is refused"},
		{"base_ejection 0s", "models: [{name: m, router: {base_ejection: 0s}, endpoints: [{url: 'http://a:1'}]}]", `models[0].router.base_ejection: "0s" is refused`},
		{"max_ejection 0s", "models: [{name: m, router: {max_ejection: 0s}, endpoints: [{url: 'http://a:1'}]}]", `models[0].router.max_ejection: "0s" is refused`},
		{"decision_log 0", "models: [{name: m, router: {decision_log: 0}, endpoints: [{url: 'http://a:1'}]}]", "models[0].router.decision_log: 0 is refused"},
		{"scrape_interval 0s", "models: [{name: m, signals: {scrape_interval: 0s}, endpoints: [{url: 'http://a:1'}]}]",
			`models[0].signals.scrape_interval: "0s" is refused (unset, the field takes its default, not 0): to turn scraping off, write disabled: true`},
		{"scrape_timeout 0s", "models: [{name: m, signals: {scrape_timeout: 0s}, endpoints: [{url: 'http://a:1'}]}]", `models[0].signals.scrape_timeout: "0s" is refused`},
		{"signals stale_after 0s", "models: [{name: m, signals: {stale_after: 0s}, endpoints: [{url: 'http://a:1'}]}]", `models[0].signals.stale_after: "0s" is refused`},
		{"endpoint scrape_interval 0s", "models: [{name: m, endpoints: [{url: 'http://a:1', signals: {scrape_interval: 0s}}]}]",
			`models[0].endpoints[0].signals.scrape_interval: "0s" is refused (unset, the field takes its default, not 0): to take the model's signals.scrape_interval, leave it out`},
		{"endpoint scrape_timeout 0s", "models: [{name: m, endpoints: [{url: 'http://a:1', signals: {scrape_timeout: 0s}}]}]", `models[0].endpoints[0].signals.scrape_timeout: "0s" is refused`},
		{"data_parallel_size 0", "models: [{name: m, endpoints: [{url: 'http://a:1', data_parallel_size: 0}]}]", "models[0].endpoints[0].data_parallel_size: 0 is refused"},
		{"template data_parallel_size 0", "models: [{name: m, discovery: {kubernetes: {service: s, endpoint: {data_parallel_size: 0}}}}]",
			"models[0].discovery.kubernetes.endpoint.data_parallel_size: 0 is refused"},
		{"template scrape_interval 0s", "models: [{name: m, discovery: {sources: [{kubernetes: {service: s, endpoint: {signals: {scrape_interval: 0s}}}}]}}]",
			`models[0].discovery.sources[0].kubernetes.endpoint.signals.scrape_interval: "0s" is refused`},
		{"precise block_size 0", "models: [{name: m, precise: {tokenizer: builtin, block_size: 0}, endpoints: [{url: 'http://a:1'}]}]", "models[0].precise.block_size: 0 is refused"},
		{"precise cache_tokens 0", "models: [{name: m, precise: {tokenizer: builtin, cache_tokens: 0}, endpoints: [{url: 'http://a:1'}]}]", "models[0].precise.cache_tokens: 0 is refused"},
		{"precise index_capacity 0", "models: [{name: m, precise: {tokenizer: builtin, index_capacity: 0}, endpoints: [{url: 'http://a:1'}]}]", "models[0].precise.index_capacity: 0 is refused"},
		{"pd short_tokens 0", pdModel("short_tokens: 0"), "models[0].pd.short_tokens: 0 is refused (unset, the field takes its default, not 0): -1 turns the rule off"},
		{"pd local_isl 0", pdModel("local_isl: 0"), "models[0].pd.local_isl: 0 is refused"},
		{"pd local_ratio 0", pdModel("local_ratio: 0.0"), "models[0].pd.local_ratio: 0 is refused"},
		{"pd max_local_tokens 0", pdModel("max_local_tokens: 0"), "models[0].pd.max_local_tokens: 0 is refused"},
		{"pd margin 0", pdModel("margin: 0"), "models[0].pd.margin: 0 is refused"},
		{"pd attempts 0", pdModel("attempts: 0"), "models[0].pd.attempts: 0 is refused"},
		{"pd bootstrap_port 0", pdModel("bootstrap_port: 0"), "models[0].pd.bootstrap_port: 0 is refused"},
		{"pd link efficiency 0", pdModel("links: [{name: x, same: [node], gbps: 100, efficiency: 0}]"), "models[0].pd.links[0].efficiency: 0 is refused"},
		// A default_link of gbps 0 alone was ignored, the built-in TCP
		// link used.
		{"pd default_link gbps 0", pdModel("default_link: {gbps: 0}"), "models[0].pd.default_link.gbps: 0 is refused"},
		// An empty string for a field with a default: a session header
		// of "" (no header) became X-Session-Id.
		{"session header empty", "models: [{name: m, router: {session: {header: ''}}, endpoints: [{url: 'http://a:1'}]}]",
			`models[0].router.session.header: "" is refused (unset, the field takes its default, not ""): leave it out for X-Session-Id`},
		{"metrics_path empty", "models: [{name: m, signals: {metrics_path: \"\"}, endpoints: [{url: 'http://a:1'}]}]",
			`models[0].signals.metrics_path: "" is refused`},
		{"health path empty", "health_check: {path: ''}\n" + oneModel, `health_check.path: "" is refused (unset, the field takes its default, not ""): leave it out for /health`},
		{"fraction at top level", "retry: {attempts: 1.5}\nmodels: [{name: m, endpoints: [{url: 'http://a:1'}]}]",
			"retry.attempts: 1.5 is not a whole number"},
		{"fraction for a uint", "models: [{name: m, policy: {seed: 2.5}, endpoints: [{url: 'http://a:1'}]}]",
			"models[0].policy.seed: 2.5 is not a whole number"},
		{"fraction in a discovery template", "models: [{name: m, discovery: {kubernetes: {service: s, endpoint: {weight: 1.25}}}}]",
			"models[0].discovery.kubernetes.endpoint.weight: 1.25 is not a whole number"},
		// The decoder converts a float that is not whole-number safe with
		// Go's conversion: seed -1.0 became 18446744073709551615, -.inf
		// 9223372036854775808, and max_body_bytes -.inf the most
		// negative int64.
		{"negative float for a uint", "models: [{name: m, policy: {seed: -1.0}, endpoints: [{url: 'http://a:1'}]}]",
			"models[0].policy.seed: -1.0 is out of range"},
		{"-.inf for a uint", "models: [{name: m, policy: {seed: -.inf}, endpoints: [{url: 'http://a:1'}]}]",
			"models[0].policy.seed: -.inf is not a finite number"},
		{"-.inf for an int64", "limits: {max_body_bytes: -.inf}\nmodels: [{name: m, endpoints: [{url: 'http://a:1'}]}]",
			"limits.max_body_bytes: -.inf is not a finite number"},
		{"-1e300 for an int64", "limits: {max_body_bytes: -1e300}\nmodels: [{name: m, endpoints: [{url: 'http://a:1'}]}]",
			"limits.max_body_bytes: -1e300 is out of range"},
		{"empty model entry", "models:\n  -\n  - name: m\n    endpoints: [{url: 'http://a:1'}]\n",
			"models[0]: is an empty list entry"},
		{"empty endpoint entry", "models:\n  - name: m\n    endpoints:\n      - url: http://a:1\n      -\n",
			"models[0].endpoints[1]: is an empty list entry"},
		{"empty trusted client", "trusted_clients: [10.0.0.1, null]\nmodels: [{name: m, endpoints: [{url: 'http://a:1'}]}]",
			"trusted_clients[1]: is an empty list entry"},
	}
	checkParseErrors(t, tests)
	// A whole number written as a float is a whole number.
	cfg, err := Parse([]byte("limits: {max_body_bytes: 1e6}\nmodels: [{name: m, endpoints: [{url: 'http://a:1', weight: 2.0}]}]"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if cfg.Limits.MaxBodyBytes != 1e6 || cfg.Models[0].Endpoints[0].Weight != 2 {
		t.Errorf("got max_body_bytes %d weight %d, want 1000000 and 2", cfg.Limits.MaxBodyBytes, cfg.Models[0].Endpoints[0].Weight)
	}
}

// TestParseDecodeErrorsNameTheField: a value of the wrong type, and an
// unknown field, are named by their path as validation errors are (the
// decoder gave a line and a Go type: "line 3: cannot unmarshal !!str
// `least_r...` into config.Policy").
func TestParseDecodeErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"wrong type", "models:\n  - name: m\n    endpoints:\n      - url: http://a:1\n        weight: two\n",
			[]string{"line 5: models[0].endpoints[0].weight: cannot unmarshal !!str `two` into int"}},
		{"a string for a block", "models:\n  - name: m\n    policy: least_request\n",
			[]string{"line 3: models[0].policy: cannot unmarshal !!str `least_r...` into a mapping"}},
		{"a mapping for a list", "models:\n  - name: m\n    endpoints:\n      url: http://a:1\n",
			[]string{"line 4: models[0].endpoints: cannot unmarshal !!map into a list"}},
		{"unknown field", "models:\n  - name: m\n    endpoints:\n      - url: http://a:1\n        wieght: 2\n",
			[]string{`line 5: unknown field "wieght" in models[0].endpoints[0]`}},
		{"two on one line", "models: [{name: m, endpoints: [{url: 'http://a:1', weight: x, kv_capacity_tokens: x}]}]",
			[]string{"line 1: models[0].endpoints[0].weight: cannot unmarshal !!str `x` into int",
				"line 1: models[0].endpoints[0].kv_capacity_tokens: cannot unmarshal !!str `x` into int"}},
		{"duration without unit", "timeouts:\n  dial: 5\n",
			[]string{"line 2: timeouts.dial: cannot unmarshal !!int `5` into time.Duration (a duration has a unit"}},
		// A bare 0 was refused for its unit, and 0s then for its default:
		// one message says it.
		{"bare 0 duration with a default", "timeouts:\n  dial: 0\n",
			[]string{"line 2: timeouts.dial: 0 is refused (unset, the field takes its default, not 0): a connect to an engine"}},
		{"bare 0.0 duration with a default", "models: [{name: m, signals: {scrape_interval: 0.0}}]\n",
			[]string{"line 1: models[0].signals.scrape_interval: 0 is refused (unset, the field takes its default, not 0): to turn scraping off"}},
		{"bare 0 duration without a default", "timeouts:\n  upstream_header: 0\n",
			[]string{"line 2: timeouts.upstream_header: cannot unmarshal !!int `0` into time.Duration (a duration has a unit"}},
		// A duration out of range, or not a number, was also told "a
		// duration has a unit", which it had.
		{"duration out of range", "timeouts:\n  dial: 999999999h\n",
			[]string{"line 2: timeouts.dial: cannot unmarshal !!str `999999999h` into time.Duration (out of range: a duration is at most 2562047h)"}},
		{"duration not a number", "timeouts:\n  dial: NaN\n",
			[]string{"line 2: timeouts.dial: cannot unmarshal !!str `NaN` into time.Duration (a duration is a number with a unit: \"5s\", \"500ms\", \"1h30m\")"}},
		{"duration in seconds without unit", "timeouts:\n  dial: 2.5\n",
			[]string{"line 2: timeouts.dial: cannot unmarshal !!float `2.5` into time.Duration (a duration has a unit"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Parse: got %v, want an error containing %q", err, w)
				}
			}
		})
	}
}

// TestParseRefusesUnexpandedVariables: the file is not expanded, so an
// admin token written as ${KVROUTE_ADMIN_TOKEN} (long enough to pass as a
// token) was that very text, a token anyone reading the docs could send.
func TestParseRefusesUnexpandedVariables(t *testing.T) {
	base := "models: [{name: m, endpoints: [{url: 'http://a:1'}]}]\n"
	tests := []parseErrorCase{
		{"admin token", base + "admin: {token: '${KVROUTE_ADMIN_TOKEN}'}",
			`admin.token: "${KVROUTE_ADMIN_TOKEN}" names an environment variable, but the file is not expanded: write the value itself`},
		{"bare variable", base + "admin: {token: $KVROUTE_ADMIN_TOKEN}",
			`admin.token: "$KVROUTE_ADMIN_TOKEN" names an environment variable`},
		{"in a url", "models: [{name: m, endpoints: [{url: 'http://${ENGINE_HOST}:8000'}]}]",
			`models[0].endpoints[0].url: "http://${ENGINE_HOST}:8000" names an environment variable`},
	}
	checkParseErrors(t, tests)
	// A dollar sign that names no variable is text.
	if _, err := Parse([]byte(base + "admin: {token: 'pa$$word-0123456789'}")); err != nil {
		t.Errorf("Parse: %v", err)
	}
}

// TestParseRefusesNonFiniteFloats: YAML's .nan and .inf decode into a
// float field without a word; validation names the field.
func TestParseRefusesNonFiniteFloats(t *testing.T) {
	const pd = "models: [{name: m, endpoints: [{url: 'http://a:1', role: prefill}, {url: 'http://a:2', role: decode}], pd: %s}]"
	checkParseErrors(t, []parseErrorCase{
		{"efficiency .nan", fmt.Sprintf(pd, "{default_link: {gbps: 100, efficiency: .nan}}"),
			"models[0].pd.default_link.efficiency: NaN is not a finite number"},
		{"gbps .inf", fmt.Sprintf(pd, "{links: [{same: [node], gbps: .inf}]}"),
			"models[0].pd.links[0].gbps: +Inf is not a finite number"},
		{"local_ratio .NaN", fmt.Sprintf(pd, "{local_ratio: .NaN}"),
			"models[0].pd.local_ratio: NaN is not a finite number"},
		{"margin -.inf", fmt.Sprintf(pd, "{margin: -.Inf}"),
			"models[0].pd.margin: -Inf is not a finite number"},
	})
}

// FuzzDecode: no input makes Decode panic; Decode then ApplyDefaults and
// Validate is Parse (what a reload does with the file is what the start
// did).
func FuzzDecode(f *testing.F) {
	if b, err := os.ReadFile("../kvroute.example.yaml"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"models: [{name: m, endpoints: [{url: 'http://127.0.0.1:8000'}]}]",
		"models: [{name: m, signals: {scrape_interval: 700ms}, endpoints: [{url: 'http://a:1'}, {url: 'http://b:1', signals: {scrape_interval: 50ms}}]}]",
		"models: [{name: m, discovery: {kubernetes: {service: s, endpoint: {weight: 2}}}}]",
		"models: [{name: m, endpoints: [{url: 'http://a:1', weight: 0.5}]}]",
		"&a [*a]", "{", "", "listen: ${PORT}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		raw, derr := Decode(data)
		parsed, perr := Parse(data)
		if derr != nil {
			if perr == nil || perr.Error() != derr.Error() {
				t.Fatalf("Decode: %v; Parse: %v; want Parse to fail as Decode does", derr, perr)
			}
			return
		}
		cfg := raw
		cfg.ApplyDefaults()
		verr := cfg.Validate()
		if (verr == nil) != (perr == nil) || (verr != nil && verr.Error() != perr.Error()) {
			t.Fatalf("Decode, ApplyDefaults, Validate: %v; Parse: %v", verr, perr)
		}
		if perr == nil && !reflect.DeepEqual(cfg, parsed) {
			t.Fatalf("Decode with defaults:\n%+v\nParse:\n%+v", cfg, parsed)
		}
	})
}

// TestDecodeKeepsUnsetFields: Decode returns the file as written: an
// endpoint's signals setting it does not write stays unset (a reload
// fills it from the running model's, not the file's).
func TestDecodeKeepsUnsetFields(t *testing.T) {
	cfg, err := Decode([]byte("models: [{name: m, signals: {scrape_interval: 700ms}, endpoints: [{url: 'http://a:1'}]}]"))
	if err != nil {
		t.Fatal(err)
	}
	e := cfg.Models[0].Endpoints[0]
	if e.Signals.ScrapeInterval != 0 || e.ID != "" || e.Weight != 0 {
		t.Errorf("endpoint: got %+v, want its unset fields unset", e)
	}
}
