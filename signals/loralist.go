package signals

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// llama.cpp's GET /lora-adapters (tools/server: server_task_result_get_lora)
// is a JSON array, one object per adapter the server loaded at its start
// (--lora FNAME, --lora-scaled FNAME:SCALE; it loads none at run time):
//
//	id             the adapter's index, 0 .. n-1: what a request's "lora"
//	               list ([{"id": N, "scale": S}]) names it by
//	path           the file it was loaded from, as given on the command line
//	scale          its global scale: 1 (--lora), the one given
//	               (--lora-scaled), 0 (--lora-init-without-apply), or the
//	               last POST /lora-adapters
//	task_name      the GGUF's adapter.lora.task_name ("" when unset; newer
//	               builds)
//	prompt_prefix  the GGUF's adapter.lora.prompt_prefix (newer builds)
//
// and, for an activated LoRA, alora_invocation_string and _tokens. The
// server names an adapter by nothing else: no alias, no served name.

// MaxLoRAAdapters bounds the adapters ParseLoRAAdapters accepts.
const MaxLoRAAdapters = 1 << 12

// LlamaAdapter is one adapter of a llama.cpp server's /lora-adapters.
type LlamaAdapter struct {
	ID       int     `json:"id"`
	Path     string  `json:"path"`
	Scale    float64 `json:"scale"`
	TaskName string  `json:"task_name,omitempty"`
}

// adapterJSON is one entry of /lora-adapters; pointers tell absent fields.
type adapterJSON struct {
	ID       *int64   `json:"id"`
	Path     *string  `json:"path"`
	Scale    *float64 `json:"scale"`
	TaskName *string  `json:"task_name"`
}

// ParseLoRAAdapters reads llama.cpp's /lora-adapters body, in the server's
// order. Bad input (not an array of objects, an entry without id or path,
// a negative, fractional or repeated id, more than MaxLoRAAdapters
// entries, a scale that is not a finite number) is an error; fields the
// router does not read are ignored.
func ParseLoRAAdapters(body []byte) ([]LlamaAdapter, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("parse lora-adapters: %w", jsonErr(err))
	}
	if raw == nil {
		return nil, errors.New("parse lora-adapters: body is null, not an array of adapters")
	}
	if len(raw) > MaxLoRAAdapters {
		return nil, fmt.Errorf("parse lora-adapters: %d adapters, more than %d", len(raw), MaxLoRAAdapters)
	}
	list := make([]LlamaAdapter, 0, len(raw))
	ids := make(map[int64]bool, len(raw))
	for i, r := range raw {
		if !bytes.HasPrefix(bytes.TrimLeft(r, " \t\r\n"), []byte("{")) {
			return nil, fmt.Errorf("parse lora-adapters: adapter %d is not an object", i)
		}
		var a adapterJSON
		if err := json.Unmarshal(r, &a); err != nil {
			return nil, fmt.Errorf("parse lora-adapters: adapter %d: %w", i, jsonErr(err))
		}
		switch {
		case a.ID == nil:
			return nil, fmt.Errorf("parse lora-adapters: adapter %d has no id", i)
		case a.Path == nil:
			return nil, fmt.Errorf("parse lora-adapters: adapter %d has no path", i)
		case *a.ID < 0 || *a.ID >= MaxLoRAAdapters:
			return nil, fmt.Errorf("parse lora-adapters: adapter %d: id %d out of range", i, *a.ID)
		case ids[*a.ID]:
			return nil, fmt.Errorf("parse lora-adapters: adapter %d: id %d repeated", i, *a.ID)
		case a.Scale != nil && (math.IsInf(*a.Scale, 0) || math.IsNaN(*a.Scale)):
			return nil, fmt.Errorf("parse lora-adapters: adapter %d: scale %v is not finite", i, *a.Scale)
		}
		ids[*a.ID] = true
		ad := LlamaAdapter{ID: int(*a.ID), Path: *a.Path}
		if a.Scale != nil {
			ad.Scale = *a.Scale
		}
		if a.TaskName != nil {
			ad.TaskName = *a.TaskName
		}
		list = append(list, ad)
	}
	return list, nil
}

// LlamaAdapters is a llama.cpp server's adapters, as its /lora-adapters
// listed them, and the names the router knows each by. The server has no
// name for an adapter but its file, so a name (config models[].adapters)
// is, in this order of precedence:
//
//   - an adapter's path as listed ("/models/sql-lora.gguf");
//   - its file name without the directory and a ".gguf" extension
//     ("sql-lora"; either separator, / or \);
//   - its task_name (the GGUF's adapter.lora.task_name), when set.
//
// A name that two adapters share at the first of these that has it names
// neither (Ambiguous lists it). A LlamaAdapters is never modified once
// built: safe for concurrent use. A nil *LlamaAdapters is an empty one.
type LlamaAdapters struct {
	list      []LlamaAdapter
	byName    map[string]int // index in list; -1: ambiguous
	ambiguous []string       // sorted
}

// NewLlamaAdapters returns the adapters of list (ParseLoRAAdapters'),
// named as LlamaAdapters says. list is kept: the caller must not modify
// it.
func NewLlamaAdapters(list []LlamaAdapter) *LlamaAdapters {
	t := &LlamaAdapters{list: list, byName: make(map[string]int, 2*len(list))}
	for _, name := range []func(LlamaAdapter) string{
		func(a LlamaAdapter) string { return a.Path },
		func(a LlamaAdapter) string { return adapterStem(a.Path) },
		func(a LlamaAdapter) string { return a.TaskName },
	} {
		level := make(map[string]int)
		for i, a := range list {
			n := name(a)
			if n == "" {
				continue
			}
			if _, taken := t.byName[n]; taken {
				continue // a higher precedence names it
			}
			if j, seen := level[n]; seen && j != i {
				level[n] = -1
				continue
			}
			level[n] = i
		}
		for n, i := range level {
			t.byName[n] = i
			if i < 0 {
				t.ambiguous = append(t.ambiguous, n)
			}
		}
	}
	slices.Sort(t.ambiguous)
	return t
}

// adapterStem is path's file name without its directory (/ or \) and a
// ".gguf" extension (any case).
func adapterStem(path string) string {
	if i := strings.LastIndexAny(path, `/\`); i >= 0 {
		path = path[i+1:]
	}
	if n := len(path) - len(".gguf"); n > 0 && strings.EqualFold(path[n:], ".gguf") {
		path = path[:n]
	}
	return path
}

// Lookup returns the adapter that name names.
func (t *LlamaAdapters) Lookup(name string) (LlamaAdapter, bool) {
	if t == nil {
		return LlamaAdapter{}, false
	}
	i, ok := t.byName[name]
	if !ok || i < 0 {
		return LlamaAdapter{}, false
	}
	return t.list[i], true
}

// List returns the adapters in the server's order. The caller must not
// modify it.
func (t *LlamaAdapters) List() []LlamaAdapter {
	if t == nil {
		return nil
	}
	return t.list
}

// Len is the number of adapters.
func (t *LlamaAdapters) Len() int { return len(t.List()) }

// Names returns each adapter's name as the router's messages give it (its
// file name without ".gguf"), in the server's order.
func (t *LlamaAdapters) Names() []string {
	names := make([]string, 0, t.Len())
	for _, a := range t.List() {
		names = append(names, adapterStem(a.Path))
	}
	return names
}

// Ambiguous returns the names two adapters share (sorted), which name
// neither.
func (t *LlamaAdapters) Ambiguous() []string {
	if t == nil {
		return nil
	}
	return t.ambiguous
}

// Equal reports whether t and o list the same adapters.
func (t *LlamaAdapters) Equal(o *LlamaAdapters) bool { return slices.Equal(t.List(), o.List()) }

// MarshalJSON writes the adapters as a list (status pages).
func (t *LlamaAdapters) MarshalJSON() ([]byte, error) {
	l := t.List()
	if l == nil {
		l = []LlamaAdapter{}
	}
	return json.Marshal(l)
}
