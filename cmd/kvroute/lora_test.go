package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/internal/syncbuf"
)

// TestParseLoRAModules: --lora-modules values read as vLLM's
// LoRAParserAction reads them, with its errors.
func TestParseLoRAModules(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []emulator.LoRAModule
		err  string
	}{
		{in: []string{"a=/p/a", "", "b=/p/b"}, want: []emulator.LoRAModule{{Name: "a", Path: "/p/a"}, {Name: "b", Path: "/p/b"}}},
		{in: []string{`{"name": "a", "path": "/p/a", "base_model_name": "m"}`}, want: []emulator.LoRAModule{{Name: "a", Path: "/p/a", BaseModelName: "m"}}},
		{in: []string{`{"name": "a", "path": "/p=a"}`}, want: []emulator.LoRAModule{{Name: "a", Path: "/p=a"}}},
		{in: []string{`[{"name": "a", "path": "/a"}, {"name": "b", "path": "/b", "base_model_name": null}]`},
			want: []emulator.LoRAModule{{Name: "a", Path: "/a"}, {Name: "b", Path: "/b"}}},
		{in: []string{"a=b=c"}, err: "invalid --lora-modules a=b=c: too many values to unpack (expected 2)"},
		{in: []string{"nope"}, err: "Invalid JSON format for --lora-modules: nope"},
		{in: []string{"a=b,c"}, err: "Invalid JSON format for --lora-modules: a=b,c"},
		{in: []string{`{"name": "a", "path": "/a", "rank": 8}`}, err: `Invalid fields for --lora-modules: {"name": "a", "path": "/a", "rank": 8} - LoRAModulePath.__init__() got an unexpected keyword argument 'rank'`},
		{in: []string{`{"name": "a"}`}, err: "LoRAModulePath.__init__() missing 1 required positional argument: 'path'"},
		{in: []string{`{}`}, err: "LoRAModulePath.__init__() missing 2 required positional arguments: 'name' and 'path'"},
		{in: []string{`{"name": 5, "path": "/a"}`}, err: "field name is not a string"},
	} {
		got, err := parseLoRAModules(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: got %v, want error %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || !reflect.DeepEqual(got, tc.want)):
			t.Errorf("%q: got %+v %v, want %+v", tc.in, got, err, tc.want)
		}
	}
}

// TestExpandLoRAModules: the values after --lora-modules, up to the next
// flag, are each the flag's (vLLM's nargs='+').
func TestExpandLoRAModules(t *testing.T) {
	got := expandLoRAModules([]string{"--model", "m", "--lora-modules", "a=/a", "b=/b", "--enable-lora", "-lora-modules", "c=/c", "--lora-modules=d=/d", "--lora-modules"})
	want := []string{"--model", "m", "--lora-modules=a=/a", "--lora-modules=b=/b", "--enable-lora", "--lora-modules=c=/c", "--lora-modules=d=/d", "--lora-modules"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// FuzzParseLoRAModules: any value parses or fails without a panic; a
// name=path one (no ',', one '=') is that module; a module parsed from
// JSON has the object's name and path ("" for null).
func FuzzParseLoRAModules(f *testing.F) {
	for _, s := range []string{"a=/p", `{"name":"a","path":"/p"}`, `[{"name":"a","path":"/p","base_model_name":"m"}]`, "", "a=b=c", "{", "[]", `{"name":null,"path":"x"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		mods, err := parseLoRAModules([]string{v})
		if err != nil {
			return
		}
		if v == "" {
			if len(mods) != 0 {
				t.Errorf("an empty value gave %+v, want none (vLLM skips it)", mods)
			}
			return
		}
		if name, path, ok := strings.Cut(v, "="); ok && !strings.Contains(v, ",") {
			if len(mods) != 1 || mods[0].Name != name || mods[0].Path != path {
				t.Errorf("%q: got %+v, want {%q %q}", v, mods, name, path)
			}
			return
		}
		var objs []map[string]any
		if json.Unmarshal([]byte(v), &objs) != nil {
			var obj map[string]any
			if json.Unmarshal([]byte(v), &obj) != nil {
				t.Fatalf("%q: parsed to %+v, but is no JSON object", v, mods)
			}
			objs = []map[string]any{obj}
		}
		if len(objs) != len(mods) {
			t.Fatalf("%q: %d modules from %d objects", v, len(mods), len(objs))
		}
		str := func(v any) any {
			if v == nil {
				return "" // null: vLLM's None, refused when the adapter loads
			}
			return v
		}
		for i, o := range objs {
			if str(o["name"]) != mods[i].Name || str(o["path"]) != mods[i].Path {
				t.Errorf("%q: module %+v, want the object's name and path", v, mods[i])
			}
		}
	})
}

// TestEngineLoRAUsageErrors: the LoRA flags' errors are vLLM's, as usage
// errors.
func TestEngineLoRAUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--lora-modules", "a=/a"}, "LoRA is not enabled. Use --enable-lora to enable LoRA."},
		{[]string{"--enable-lora", "--max-lora-rank", "7"}, "argument --max-lora-rank: invalid choice: 7 (choose from 1, 8, 16, 32, 64, 128, 256, 320, 512)"},
		{[]string{"--enable-lora", "--max-loras", "0"}, "max_loras (0) must be >= 1."},
		{[]string{"--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"}, "max_cpu_loras (2) must be >= max_loras (4)."},
		{[]string{"--enable-lora", "--lora-modules", "a=/a", "a=/b"}, "The lora adapter 'a' has already been loaded."},
		{[]string{"--enable-lora", "--lora-modules", "{"}, "Invalid JSON format for --lora-modules: {"},
		{[]string{"--enable-lora", "--lora-modules", "=/a"}, "Both 'lora_name' and 'lora_path' must be provided."},
		{[]string{"--enable-lora", "--data-parallel-size", "2"}, "LoRA in DP mode is not supported yet."},
	} {
		var out bytes.Buffer
		args := append([]string{"engine", "--model", "m", "--profile", "tiny"}, tc.args...)
		if err := run(context.Background(), args, &out, &out); !errors.Is(err, errUsage) || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%v: got %v %q, want a usage error with %q", tc.args, err, out.String(), tc.want)
		}
	}
}

// TestEngineLoRA runs `kvroute engine --enable-lora --lora-modules a=... b=...`:
// /v1/models lists both adapters, and a request to one is answered in its
// name.
func TestEngineLoRA(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncbuf.Buffer{}
	addr := freeAddr(t)
	done := engineInProcess(t, ctx, addr, out, "--profile", "tiny", "--enable-lora", "--max-loras", "2",
		"--lora-modules", "a=/adapters/a", `{"name":"b","path":"/adapters/b"}`)
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("engine: %v\n%s", err, out.String())
		}
	}()
	resp, err := http.Get("http://" + addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID, Root string
			Parent   *string
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || len(list.Data) != 3 || list.Data[1].ID != "a" || list.Data[1].Root != "/adapters/a" || list.Data[2].ID != "b" ||
		list.Data[2].Parent == nil || *list.Data[2].Parent != "m" {
		t.Errorf("/v1/models: got %+v %v, want m, a and b (parent m)", list.Data, err)
	}
	c := postJSON(t, "http://"+addr+"/v1/completions", map[string]any{"model": "b", "prompt": "hi", "max_tokens": 1})
	if c["model"] != "b" {
		t.Errorf("completion of adapter b: model %v", c["model"])
	}
}
