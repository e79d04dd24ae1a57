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
		{"unknown field", "models:\n  - name: m\n    endpointz: []\n", "line 3: field endpointz not found"},
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
		{"bad quick endpoint", []string{"--model", "m", "--endpoint", "htp://x"}, "", `models[0].endpoints[0].url: "htp://x" is not an http(s) URL`},
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

func TestServeHelpExplainsEveryFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"serve", "--help"}, &out, &errOut)
	if err == nil || !errors.Is(err, flagErrHelp()) {
		t.Fatalf("got %v, want flag.ErrHelp", err)
	}
	for _, f := range []string{"-config", "-check-config", "-listen", "-model", "-endpoint", "-policy", "-log-level", "-log-format", "kv-aware"} {
		if !strings.Contains(errOut.String(), f) {
			t.Errorf("--help lacks %s", f)
		}
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
			"--policy", "round_robin", "--log-level", "warn"}, &out, &errOut)
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
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
}

func flagErrHelp() error { return flag.ErrHelp }
