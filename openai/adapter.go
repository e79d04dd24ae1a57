package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// AdapterForm is how an engine reads the LoRA adapter a request names.
type AdapterForm uint8

const (
	// AdapterUnknown is an engine whose form the router does not know: a
	// request goes to it as its client wrote it.
	AdapterUnknown AdapterForm = iota
	// AdapterVLLM is vLLM's form: "model" is the adapter's name (the base
	// model's for none). vLLM ignores "lora_path" (an extra field, logged),
	// and answers 404 to a "model" it does not serve, such as SGLang's
	// "<base>:<adapter>".
	AdapterVLLM
	// AdapterSGLang is SGLang's form: "model" as "<base>:<adapter>" (split
	// at its first colon; an empty adapter names none), else "lora_path".
	// SGLang does not check the model's name, so a "model" naming an
	// adapter alone, vLLM's form, is the base model's request there.
	AdapterSGLang
	// AdapterLlamaCPP is llama.cpp's server's form: "lora", a list of
	// {"id": N, "scale": S} naming the server's adapters by their index in
	// its GET /lora-adapters (the server has no name for them), each
	// adapter not listed at scale 0; without "lora" (or with an empty
	// list: current builds take an empty one as none) a request runs every
	// adapter at its global scale (1 for --lora, unless
	// --lora-init-without-apply; POST /lora-adapters sets it), so a base
	// model's request must list its adapters at scale 0. The server reads
	// "lora" on its OpenAI routes too; it ignores "model" but in its router
	// mode (--models-dir), where "model" names one of its models. See
	// NameLlamaAdapter.
	AdapterLlamaCPP
)

func (f AdapterForm) String() string {
	switch f {
	case AdapterVLLM:
		return "vllm"
	case AdapterSGLang:
		return "sglang"
	case AdapterLlamaCPP:
		return "llamacpp"
	}
	return "unknown"
}

// SplitModelAdapter splits SGLang's "<base>:<adapter>" at its first colon,
// both parts trimmed of white space as SGLang trims them; ok is false
// without a colon.
func SplitModelAdapter(model string) (base, adapter string, ok bool) {
	base, adapter, ok = strings.Cut(model, ":")
	return strings.TrimSpace(base), strings.TrimSpace(adapter), ok
}

// AdapterRead returns what an engine reading form finds in a request whose
// "model" and "lora_path" (RequestInfo.Model and LoRAPath) are given: for
// AdapterVLLM the model it serves the request as (an adapter's name or the
// base model's); for AdapterSGLang the adapter, "" for the base model
// (the model's adapter wins over lora_path, as in SGLang's
// OpenAIServingBase). AdapterUnknown and AdapterLlamaCPP read nothing
// here ("": a llama.cpp server reads its "lora" list of ids, which only
// its own adapter list names).
func AdapterRead(form AdapterForm, model, loraPath string) string {
	switch form {
	case AdapterVLLM:
		return model
	case AdapterSGLang:
		if _, a, ok := SplitModelAdapter(model); ok && a != "" {
			return a
		}
		return loraPath
	}
	return ""
}

// NameAdapter returns body (a request ParseRequest accepted) rewritten
// for an engine reading form to find adapter, the LoRA adapter the request
// was routed for ("" for base, the base model): for AdapterVLLM "model"
// becomes adapter (base for none) and "lora_path" is removed; for
// AdapterSGLang "lora_path" becomes adapter (removed for none) and "model"
// stays as given unless it has a colon, which SGLang would read as
// "<base>:<adapter>": then it becomes base. Other fields are kept as their
// JSON text, in key order (the engines read the same values).
func NameAdapter(body []byte, form AdapterForm, base, adapter string) ([]byte, error) {
	m, err := DecodeObject(body)
	if err != nil {
		return nil, fmt.Errorf("openai: name adapter: %w", err)
	}
	switch form {
	case AdapterVLLM:
		name := adapter
		if name == "" {
			name = base
		}
		m["model"], _ = json.Marshal(name)
		delete(m, "lora_path")
	case AdapterSGLang:
		if adapter == "" {
			delete(m, "lora_path")
		} else {
			m["lora_path"], _ = json.Marshal(adapter)
		}
		var model string
		if json.Unmarshal(m["model"], &model) == nil && strings.Contains(model, ":") {
			m["model"], _ = json.Marshal(base)
		}
	case AdapterLlamaCPP:
		return nil, errors.New("openai: name adapter: a llama.cpp server's adapters are named by its own ids: use NameLlamaAdapter")
	default:
		return nil, fmt.Errorf("openai: name adapter: unknown form %d", form)
	}
	return EncodeObject(m)
}

// LoRAScale is one entry of a llama.cpp server's per-request "lora" list:
// the adapter of index ID in its GET /lora-adapters, applied at Scale.
type LoRAScale struct {
	ID    int     `json:"id"`
	Scale float64 `json:"scale"`
}

// NameLlamaAdapter returns body (a request ParseRequest accepted)
// rewritten for a llama.cpp server (AdapterLlamaCPP) to run the request
// with lora, its adapters' scales (each of the server's adapters listed,
// at scale 0 but the one the request was routed for, so that neither the
// global scales nor a client's own list apply): "lora" becomes lora,
// "model" becomes base (the model's name in the server's router mode; a
// single model's server ignores it) and "lora_path" is removed. Other
// fields are kept as their JSON text, in key order.
func NameLlamaAdapter(body []byte, base string, lora []LoRAScale) ([]byte, error) {
	m, err := DecodeObject(body)
	if err != nil {
		return nil, fmt.Errorf("openai: name llama.cpp adapter: %w", err)
	}
	if lora == nil {
		lora = []LoRAScale{}
	}
	if m["lora"], err = json.Marshal(lora); err != nil { // a float that is not finite
		return nil, fmt.Errorf("openai: name llama.cpp adapter: %w", err)
	}
	m["model"], _ = json.Marshal(base)
	delete(m, "lora_path")
	return EncodeObject(m)
}

// DecodeObject parses a request body's top level (one leading UTF-8
// byte-order mark skipped, as ParseRequest skips it), each member's value
// kept as its JSON text.
func DecodeObject(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(TrimBOM(body)))
	if err := d.Decode(&m); err != nil {
		return nil, fmt.Errorf("request body is not a JSON object: %w", err)
	}
	if m == nil {
		return nil, errors.New("request body is not a JSON object")
	}
	if d.More() {
		return nil, errors.New("request body has data after the JSON object")
	}
	return m, nil
}

// EncodeObject writes m as a JSON object without HTML escaping (the
// engines read the same strings the client sent), its keys sorted.
func EncodeObject(m map[string]json.RawMessage) ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}
