package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/emulator"
)

// loraModules is the --lora-modules flag: every value given, in order (the
// flag may repeat, and takes several values as vLLM's nargs='+' does:
// expandLoRAModules).
type loraModules []string

func (m *loraModules) String() string { return strings.Join(*m, " ") }
func (m *loraModules) Set(v string) error {
	*m = append(*m, v)
	return nil
}

// expandLoRAModules rewrites the values that follow --lora-modules (vLLM
// takes them all: nargs='+') into one --lora-modules=value each, up to
// the next argument that starts with "-", so that the flag package reads
// them.
func expandLoRAModules(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if a != "--lora-modules" && a != "-lora-modules" {
			out = append(out, a)
			continue
		}
		n := 0
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			n++
			out = append(out, "--lora-modules="+args[i])
		}
		if n == 0 {
			out = append(out, a) // the flag package's "needs an argument"
		}
	}
	return out
}

// parseLoRAModules reads --lora-modules values as vLLM's LoRAParserAction
// does: an empty value is skipped; name=path (an '=' and no ',') is the
// old form; anything else is JSON, an object {"name", "path",
// "base_model_name"} or a list of them. Its errors are vLLM's.
func parseLoRAModules(values []string) ([]emulator.LoRAModule, error) {
	var mods []emulator.LoRAModule
	for _, v := range values {
		if v == "" {
			continue
		}
		if strings.Contains(v, "=") && !strings.Contains(v, ",") {
			name, path, _ := strings.Cut(v, "=")
			if strings.Contains(path, "=") {
				// vLLM's item.split('=') into two names fails.
				return nil, fmt.Errorf("invalid --lora-modules %s: too many values to unpack (expected 2)", v)
			}
			mods = append(mods, emulator.LoRAModule{Name: name, Path: path})
			continue
		}
		raw := []byte(strings.TrimSpace(v))
		var objs []map[string]json.RawMessage
		if len(raw) > 0 && raw[0] == '[' {
			if err := json.Unmarshal(raw, &objs); err != nil {
				//lint:ignore ST1005 vLLM's message, word for word
				return nil, fmt.Errorf("Invalid JSON format for --lora-modules: %s", v)
			}
		} else {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
				//lint:ignore ST1005 vLLM's message, word for word
				return nil, fmt.Errorf("Invalid JSON format for --lora-modules: %s", v)
			}
			objs = append(objs, obj)
		}
		for _, obj := range objs {
			m, err := loraModule(obj)
			if err != nil {
				//lint:ignore ST1005 vLLM's message, word for word
				return nil, fmt.Errorf("Invalid fields for --lora-modules: %s - %s", v, err)
			}
			mods = append(mods, m)
		}
	}
	return mods, nil
}

// loraModule is vLLM's LoRAModulePath(**obj), with Python's errors for
// unknown or missing fields (and one for a field that is not a string).
func loraModule(obj map[string]json.RawMessage) (emulator.LoRAModule, error) {
	var m emulator.LoRAModule
	fields := map[string]*string{"name": &m.Name, "path": &m.Path, "base_model_name": &m.BaseModelName}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		dst, ok := fields[k]
		if !ok {
			return m, fmt.Errorf("LoRAModulePath.__init__() got an unexpected keyword argument '%s'", k)
		}
		if k == "base_model_name" && bytes.Equal(obj[k], []byte("null")) {
			continue
		}
		if err := json.Unmarshal(obj[k], dst); err != nil {
			return m, fmt.Errorf("field %s is not a string", k)
		}
	}
	var missing []string
	for _, k := range []string{"name", "path"} {
		if _, ok := obj[k]; !ok {
			missing = append(missing, "'"+k+"'")
		}
	}
	switch len(missing) {
	case 1:
		return m, fmt.Errorf("LoRAModulePath.__init__() missing 1 required positional argument: %s", missing[0])
	case 2:
		return m, fmt.Errorf("LoRAModulePath.__init__() missing 2 required positional arguments: %s and %s", missing[0], missing[1])
	}
	return m, nil
}

// loraModulesError is vLLM's error loading the modules, in order: one
// without a name or a path, or a name given twice ("" for none).
func loraModulesError(mods []emulator.LoRAModule) string {
	seen := map[string]bool{}
	for _, m := range mods {
		switch {
		case m.Name == "" || m.Path == "":
			return "Both 'lora_name' and 'lora_path' must be provided."
		case seen[m.Name]:
			return fmt.Sprintf("The lora adapter '%s' has already been loaded.", m.Name)
		}
		seen[m.Name] = true
	}
	return ""
}

// checkLoRARank is argparse's check of --max-lora-rank's choices.
func checkLoRARank(rank int) error {
	if slices.Contains(emulator.LoRARanks, rank) {
		return nil
	}
	s := make([]string, len(emulator.LoRARanks))
	for i, r := range emulator.LoRARanks {
		s[i] = strconv.Itoa(r)
	}
	return fmt.Errorf("argument --max-lora-rank: invalid choice: %d (choose from %s)", rank, strings.Join(s, ", "))
}

// runtimeLoRAUpdating reads VLLM_ALLOW_RUNTIME_LORA_UPDATING as vLLM's
// envs does: "1" or "true", any case, around spaces.
func runtimeLoRAUpdating() bool {
	v := strings.ToLower(strings.TrimSpace(os.Getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING")))
	return v == "1" || v == "true"
}
