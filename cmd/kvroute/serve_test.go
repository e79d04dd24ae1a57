package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/policy"
	"github.com/kvroute/kvroute/proxy"
)

const examplePath = "../../kvroute.example.yaml"

func TestExampleConfigLoadsAndValidates(t *testing.T) {
	cfg, err := loadConfigFile(examplePath)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if _, err := proxy.New(proxy.Options{Config: cfg, NewPicker: policy.New}); err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	if got := cfg.Models[1].Endpoints[0].ID; got != "http://10.0.1.7:8000" {
		t.Errorf("defaulted endpoint id: got %q", got)
	}
}

// TestExampleConfigNamesEveryField keeps the example complete: every field
// of config.Config (through structs and the first element of slices)
// appears in it.
func TestExampleConfigNamesEveryField(t *testing.T) {
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var missing []string
	checkFields(reflect.TypeFor[config.Config](), doc.Content[0], "", &missing)
	if len(missing) > 0 {
		t.Errorf("kvroute.example.yaml lacks %s", strings.Join(missing, ", "))
	}
}

func checkFields(typ reflect.Type, n *yaml.Node, path string, missing *[]string) {
	switch typ.Kind() {
	case reflect.Struct:
		if typ == reflect.TypeFor[time.Duration]() {
			return
		}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if name == "" || name == "-" {
				continue
			}
			p := strings.TrimPrefix(path+"."+name, ".")
			v := mapValue(n, name)
			if v == nil {
				*missing = append(*missing, p)
				continue
			}
			checkFields(f.Type, v, p, missing)
		}
	case reflect.Slice:
		if n.Kind == yaml.SequenceNode && len(n.Content) > 0 {
			checkFields(typ.Elem(), n.Content[0], path+"[0]", missing)
		}
	}
}

func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"empty", "", "the file is empty"},
		{"unknown field", "models:\n  - name: m\n    endpointz: []\n", `line 3: unknown field "endpointz"`},
		{"wrong type", "retry:\n  attempts: many\n", "cannot unmarshal !!str `many` into int"},
		{"bare number duration", "timeouts:\n  dial: 5\n", "cannot unmarshal !!int `5` into time.Duration"},
		{"two documents", "listen: \":1\"\n---\nlisten: \":2\"\n", "more than one YAML document"},
		{"validation", "models:\n  - name: m\n    endpoints:\n      - url: x\n      - url: htp://x\n",
			`models[0].endpoints[1].url: "htp://x" is not an http(s) URL`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestServeCheckConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("models:\n  - name: m\n    endpoints: [{url: \"http://a:1\"}]\n    policy: {name: kv-aware, params: {nope: 1}}\n"), 0o644)
	tests := []struct {
		name    string
		args    []string
		wantOut string
		wantErr string
	}{
		{"example", []string{"--check-config", examplePath}, "ok (2 models, 4 endpoints)", ""},
		{"bad policy param", []string{"--check-config", bad}, "", "models[0].policy"},
		{"missing file", []string{"--check-config", filepath.Join(dir, "none.yaml")}, "", "no such file"},
		{"no source", nil, "", "usage error"},
		{"both sources", []string{"--config", examplePath, "--model", "m"}, "", "usage error"},
		{"bad quick endpoint", []string{"--model", "m", "--endpoint", "htp://x"}, "", "usage error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), append([]string{"serve"}, tc.args...), &out, &errOut)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("got error %v (stderr %s)", err, errOut.String())
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("stdout: got %q, want %q", out.String(), tc.wantOut)
			}
		})
	}
}

// TestServeFileRefusedUnderItsFlag: a config file's invalid listen or
// log.level is refused though a flag overrides it, at start as by
// --check-config (the file must be valid by itself: it is what runs
// without the flag), and the error says the flag was given over it (it
// read as if the flag had been ignored).
func TestServeFileRefusedUnderItsFlag(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listen: nope\nlog: {level: loud}\nmodels: [{name: m, endpoints: [{url: 'http://127.0.0.1:1'}]}]\n"), 0o644)
	over := []string{"--listen", "127.0.0.1:0", "--log-level", "info"}
	for _, mode := range []string{"--check-config", "--config"} {
		t.Run(mode, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), append([]string{"serve", mode, bad}, over...), &out, &errOut)
			want := `config ` + bad + `: listen: "nope" is not a host:port address; log.level: "loud" is not one of debug, info, warn, error (--listen, --log-level given over it: the file must be valid by itself)`
			if err == nil || errors.Is(err, errUsage) || err.Error() != want {
				t.Errorf("got %v; want a (non-usage) error %q", err, want)
			}
		})
	}
}

// TestServeFlagErrors: a bad value given by a flag is a usage error (exit
// status 2) on one line that names the flag as typed, not the config field
// it fills (models[0].endpoints[0].url) or, for the policy, a failure of
// the proxy; a config file's own errors still name its fields.
func TestServeFlagErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("models: [{name: m, endpoints: [{url: 'http://127.0.0.1:1'}]}]\n"), 0o644)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("models: [{name: m, endpoints: [{url: 'htp://x'}]}]\n"), 0o644)
	quick := []string{"--model", "m", "--endpoint", "http://127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		args []string
		want string // stderr's first line, after "kvroute serve: "
	}{
		{"bad endpoint", []string{"--model", "m", "--endpoint", "htp://x"}, `--endpoint: "htp://x" is not an http(s) URL`},
		{"endpoint twice", []string{"--model", "m", "--endpoint", "http://a:1", "--endpoint", "http://a:1"}, `--endpoint: "http://a:1" is given twice`},
		{"unknown policy", append(quick, "--policy", "nope"), `--policy "nope": unknown policy (known: dynamo,`},
		{"bad listen", append(quick, "--listen", "8080"), `--listen: "8080" is not a host:port address`},
		{"bad log level", append(quick, "--log-level", "loud"), `--log-level: "loud" is not one of debug, info, warn, error`},
		{"bad log format", append(quick, "--log-format", "xml"), `--log-format: "xml" is not one of text, json`},
		{"two bad flags", []string{"--model", "m", "--endpoint", "ftp://a", "--listen", "x"},
			`--listen: "x" is not a host:port address; --endpoint: "ftp://a" is not an http(s) URL`},
		{"bad listen over a file", []string{"--config", good, "--listen", "x"}, `--listen: "x" is not a host:port address`},
		{"model without endpoint", []string{"--model", "m"}, "--model m needs at least one --endpoint URL"},
		{"endpoint without model", []string{"--endpoint", "http://a:1"}, "--endpoint needs --model NAME"},
		{"unknown flag", []string{"--bogus"}, "flag provided but not defined: --bogus"},
		{"bad data-parallel size", []string{"--model", "m", "--endpoint", "http://a:1", "--endpoint", "http://b:1", "--data-parallel-size", "-1"},
			"--data-parallel-size: -1 is not positive\n"},
		{"zero data-parallel size", append(quick, "--listen", "127.0.0.1:0", "--data-parallel-size", "0"), // was: ran with 1
			"--data-parallel-size: 0 is not positive\n"},
		{"data-parallel size over a file", []string{"--config", good, "--data-parallel-size", "2"},
			"use either --config or --model/--endpoint/--policy/--data-parallel-size, not both"},
		// --check-config checks what --config would run: the flags that
		// apply over a file are checked with it, the quick-mode ones refused.
		{"bad listen over a checked file", []string{"--check-config", good, "--listen", "x"}, `--listen: "x" is not a host:port address`},
		{"bad log level over a checked file", []string{"--check-config", good, "--log-level", "loud"}, `--log-level: "loud" is not one of debug, info, warn, error`},
		{"policy with --check-config", []string{"--check-config", good, "--policy", "random"}, "--check-config takes no other config source"},
		{"data-parallel size with --check-config", []string{"--check-config", good, "--data-parallel-size", "2"}, "--check-config takes no other config source"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), append([]string{"serve"}, tc.args...), &out, &errOut)
			first, rest, _ := strings.Cut(errOut.String(), "\n")
			if !errors.Is(err, errUsage) || !strings.Contains(first+"\n", tc.want) {
				t.Errorf("got %v, stderr %q; want a usage error whose first line has %q", err, errOut.String(), tc.want)
			}
			if rest != "Run 'kvroute serve --help' for usage.\n" {
				t.Errorf("stderr after the error: got %q, want only the pointer to --help", rest)
			}
		})
	}
	// The file's own errors are the file's: exit status 1, field paths.
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"serve", "--config", bad, "--listen", "127.0.0.1:0"}, &out, &errOut)
	if err == nil || errors.Is(err, errUsage) || !strings.Contains(err.Error(), `models[0].endpoints[0].url: "htp://x"`) {
		t.Errorf("bad file: got %v, want the file's field error", err)
	}
	// A policy the file names that does not exist: the error names the
	// file, as --check-config's does (it named neither).
	badPolicy := filepath.Join(dir, "policy.yaml")
	os.WriteFile(badPolicy, []byte("models: [{name: m, policy: {name: nope}, endpoints: [{url: 'http://127.0.0.1:1'}]}]\n"), 0o644)
	err = run(context.Background(), []string{"serve", "--config", badPolicy, "--listen", "127.0.0.1:0"}, &out, &errOut)
	if err == nil || errors.Is(err, errUsage) || !strings.HasPrefix(err.Error(), badPolicy+": ") || !strings.Contains(err.Error(), `unknown policy "nope"`) {
		t.Errorf("bad policy in the file: got %v, want an error naming the file and the policy", err)
	}
}

func TestServeHelpExplainsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"serve", "--help"}, &out, &errOut)
	if err == nil || !errors.Is(err, flagErrHelp()) {
		t.Fatalf("got %v, want flag.ErrHelp", err)
	}
	for _, f := range []string{"-config", "-check-config", "-listen", "-model", "-endpoint", "-policy", "-log-level", "-log-format",
		"-data-parallel-size", "X-Data-Parallel-Rank", "kv-aware"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("--help lacks %s", f)
		}
	}
	if errOut.Len() > 0 {
		t.Errorf("--help wrote %q to stderr; want it all on stdout (kvroute serve --help | less)", errOut.String())
	}
}

// TestServeQuickModeServesAndStops runs `kvroute serve` with flags only,
// checks /healthz and /v1/models, and stops it as SIGTERM would.
func TestServeQuickModeServesAndStops(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var out, errOut bytes.Buffer
	go func() {
		done <- run(ctx, []string{"serve", "--listen", addr, "--model", "m", "--endpoint", "http://127.0.0.1:1",
			"--policy", "round_robin", "--log-level", "warn", "--debug"}, &out, &errOut)
	}()
	var resp *http.Response
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err = http.Get("http://" + addr + "/v1/models")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("serve never answered: %v (stderr %s)", err, errOut.String())
	}
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(buf.String(), `"id":"m"`) {
		t.Errorf("/v1/models: got %d %s", resp.StatusCode, buf.String())
	}
	// --debug opens the debug pages without an admin token.
	if resp, err := http.Get("http://" + addr + "/debug/endpoints"); err != nil {
		t.Error(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("--debug: /debug/endpoints answered %d, want 200", resp.StatusCode)
		}
	}
	stop()
	waitStopped(t, "serve", done, 10*time.Second)
}

func flagErrHelp() error { return flag.ErrHelp }

// TestServeQuickDataParallel: --data-parallel-size gives every --endpoint
// that many ranks, each routed as an endpoint of its own.
func TestServeQuickDataParallel(t *testing.T) {
	cfg := quickConfig("m", "", []string{"http://a:1", "http://b:1"}, 2)
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	eps, err := cfg.Models[0].KVEndpoints()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range eps {
		ids = append(ids, e.ID)
	}
	if got, want := strings.Join(ids, " "), "http://a:1#dp0 http://a:1#dp1 http://b:1#dp0 http://b:1#dp1"; got != want {
		t.Errorf("got endpoints %s, want %s", got, want)
	}
	cfg = quickConfig("m", "", []string{"http://a:1"}, 0)
	if cfg.ApplyDefaults(); cfg.Models[0].Endpoints[0].DataParallelSize != 1 {
		t.Errorf("without the flag: got data_parallel_size %d, want 1", cfg.Models[0].Endpoints[0].DataParallelSize)
	}
}
