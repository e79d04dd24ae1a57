package emulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/kvroute/kvroute/openai"
)

// llama.cpp's LoRA adapters (flavour llamacpp), as its tools/server serves
// them in the builds whose parse_lora_request takes the server's adapter
// list (and refuses an id it does not have; later builds ignore such an
// id, and read an empty per-request list as the global scales):
//
//   - the adapters are LoRAConfig.Modules, loaded at start (llama.cpp's
//     --lora FNAME, each at global scale 1; it loads none at run time):
//     the n-th module's id is n-1, its path the module's path;
//   - GET /lora-adapters lists them: [{"id", "path", "scale", "task_name",
//     "prompt_prefix"}] (server_task_result_get_lora; task_name and
//     prompt_prefix empty, as for an adapter GGUF without them);
//   - POST /lora-adapters [{"id": N, "scale": S}, ...] sets the global
//     scales: each listed id's to its scale, every other adapter's to 0
//     (the last entry of an id wins), answering {"success": true}; a body
//     that is not JSON is llama.cpp's 500 (its JSON parser's exception), one
//     that is not an array its 400 "Request body must be an array", an id
//     the server does not have its 500 "invalid adapter id" (a
//     runtime_error its handler does not catch); nothing is set then;
//   - a completion or chat request's "lora" list (the same form) gives the
//     request's scales, every adapter it does not list at 0; without
//     "lora" the request runs at the global scales. A "lora" that is not an
//     array is llama.cpp's 400 "Error: 'lora' must be an array of objects
//     with 'id' and 'scale' fields", an id the server does not have its 400
//     "invalid adapter id" (invalid_request_error, in llama.cpp's error
//     shape), before the engine takes the request.
//
// An entry's id and scale are read as llama.cpp's json_value reads them:
// a number (an id truncated to an integer, an integer id past int's range
// wrapping as C++'s conversion does), a boolean (1 or 0); anything else,
// null, or the key absent, its default (id -1, which no adapter has; scale
// 0). An entry that is not an object has neither.
//
// The adapters a request runs with (scale not 0, negative too, as
// llama.cpp applies them) are its engine.Request.LoRA: the module's name,
// or the names of several joined with "+" in id order, so that its blocks
// are keyed with them and its responses name them as their model, as a
// vLLM adapter's do (llama.cpp itself answers in the served model's name;
// the emulator names the adapter so that a client sees which one served).
// The scales themselves are not modelled: an adapter at 0.5 keys its
// blocks as at 1.
type llamaLoRAs struct {
	list []*loraAdapter // by id
	// scales are the global scales, by id: replaced whole by POST
	// /lora-adapters, read without a lock.
	scales atomic.Pointer[[]float32]
}

// newLlamaLoRAs returns l's adapters (nil: none) as llama.cpp's, each at
// global scale 1. LoRAConfig.RuntimeUpdating is refused with the llama.cpp
// flavour, so the list does not change.
func newLlamaLoRAs(l *loras) *llamaLoRAs {
	ll := &llamaLoRAs{}
	if l != nil {
		ll.list = l.table.Load().order
	}
	scales := make([]float32, len(ll.list))
	for i := range scales {
		scales[i] = 1
	}
	ll.scales.Store(&scales)
	return ll
}

// adapter returns the engine's LoRA for scales (by id): the names of the
// adapters whose scale is not 0, joined with "+" ("" for none).
func (ll *llamaLoRAs) adapter(scales []float32) string {
	name, n := "", 0
	for i, s := range scales {
		if s != 0 {
			if n == 0 {
				name = ll.list[i].name
			}
			n++
		}
	}
	if n < 2 {
		return name
	}
	names := make([]string, 0, n)
	for i, s := range scales {
		if s != 0 {
			names = append(names, ll.list[i].name)
		}
	}
	return strings.Join(names, "+")
}

// The errors of parseLlamaLoRA, with llama.cpp's messages.
var (
	errLoRANotArray    = errors.New("Error: 'lora' must be an array of objects with 'id' and 'scale' fields")
	errInvalidLoRAID   = errors.New("invalid adapter id")
	errLoRABodyNoArray = errors.New("Request body must be an array")
)

// parseLlamaLoRA reads raw, one JSON value, as llama.cpp's
// parse_lora_request reads a "lora" list for a server of n adapters: the
// scales by id, every adapter not listed at 0. Raw that is not an array
// is errLoRANotArray; an entry whose id (llamaID) is not one of the
// server's, errInvalidLoRAID.
func parseLlamaLoRA(raw []byte, n int) ([]float32, error) {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] != '[' {
		return nil, errLoRANotArray
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, errLoRANotArray
	}
	scales := make([]float32, n)
	for _, e := range entries {
		id, scale := -1, float32(0)
		if e = bytes.TrimLeft(e, " \t\r\n"); len(e) > 0 && e[0] == '{' {
			var m map[string]json.RawMessage
			if json.Unmarshal(e, &m) == nil {
				id, scale = llamaID(m["id"]), llamaScale(m["scale"])
			}
		}
		if id < 0 || id >= n {
			return nil, errInvalidLoRAID
		}
		scales[id] = scale
	}
	return scales, nil
}

// llamaID reads an entry's id as json_value(entry, "id", -1) does: a number
// converted to int (an integer modulo 2^32, as C++ converts it; a
// fractional one truncated, -1 past int's range, where C++'s conversion is
// undefined), a boolean as 1 or 0, anything else -1.
func llamaID(raw json.RawMessage) int {
	s := string(bytes.TrimSpace(raw))
	switch {
	case s == "true":
		return 1
	case s == "false":
		return 0
	case s == "" || s[0] != '-' && (s[0] < '0' || s[0] > '9'):
		return -1 // absent, null, a string, an array or an object
	}
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return int(int32(i))
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return int(int32(u))
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= math.MinInt32-1 || f >= math.MaxInt32+1 {
		return -1
	}
	return int(f)
}

// llamaScale reads an entry's scale as json_value(entry, "scale", 0.0f)
// does: a number as a float, a boolean as 1 or 0, anything else 0.
func llamaScale(raw json.RawMessage) float32 {
	s := string(bytes.TrimSpace(raw))
	switch {
	case s == "true":
		return 1
	case s == "" || s[0] != '-' && (s[0] < '0' || s[0] > '9'):
		return 0
	}
	f, _ := strconv.ParseFloat(s, 64) // out of range: ±Inf, as strtod's
	return float32(f)
}

// resolveLlamaAdapter returns the adapter a llama.cpp-flavoured engine
// runs req with (llamaLoRAs): its "lora" list's, else the global scales'.
// "model" names nothing there (llama.cpp reads it only in its router
// mode), but a model that is neither the served one nor an adapter is
// still refused as the other flavours refuse it (resolveModel).
func (s *Server) resolveLlamaAdapter(req *apiRequest) (string, *apiError) {
	if _, aerr := s.resolveModel(req.Model); aerr != nil {
		return "", aerr
	}
	if len(req.LoRA) == 0 { // absent (null is present: not an array)
		return s.llama.adapter(*s.llama.scales.Load()), nil
	}
	scales, err := parseLlamaLoRA(req.LoRA, len(s.llama.list))
	if err != nil {
		return "", &apiError{status: http.StatusBadRequest, msg: err.Error(), typ: "invalid_request_error", llama: true}
	}
	return s.llama.adapter(scales), nil
}

// llamaAdapterJSON is one adapter of GET /lora-adapters.
type llamaAdapterJSON struct {
	ID           int        `json:"id"`
	Path         string     `json:"path"`
	Scale        llamaFloat `json:"scale"`
	TaskName     string     `json:"task_name"`
	PromptPrefix string     `json:"prompt_prefix"`
}

// llamaFloat is a float llama.cpp's JSON library writes: as the double it
// converts to, with ".0" when it is a whole number, null when it is not
// finite.
type llamaFloat float32

func (f llamaFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return []byte("null"), nil
	}
	b, err := json.Marshal(v)
	if err == nil && !bytes.ContainsAny(b, ".eE") {
		b = append(b, ".0"...)
	}
	return b, err
}

// handleLoRAAdapters is llama.cpp's GET /lora-adapters: the adapters by
// id, at their global scales.
func (s *Server) handleLoRAAdapters(w http.ResponseWriter, _ *http.Request) {
	scales := *s.llama.scales.Load()
	out := make([]llamaAdapterJSON, len(s.llama.list))
	for i, a := range s.llama.list {
		out[i] = llamaAdapterJSON{ID: i, Path: a.path, Scale: llamaFloat(scales[i])}
	}
	writeLlamaJSON(w, out)
}

// handleSetLoRAAdapters is llama.cpp's POST /lora-adapters: it sets the
// global scales (llamaLoRAs) and answers {"success": true}, or llama.cpp's
// error, setting nothing.
func (s *Server) handleSetLoRAAdapters(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			llamaError(w, http.StatusRequestEntityTooLarge, "request body larger than "+strconv.FormatInt(mbe.Limit, 10)+" bytes", "invalid_request_error")
			return
		}
		llamaError(w, http.StatusBadRequest, "reading request body: "+err.Error(), "invalid_request_error")
		return
	}
	scales, status, msg := setLoRABody(openai.TrimBOM(body), len(s.llama.list))
	if status != http.StatusOK {
		typ := "server_error"
		if status == http.StatusBadRequest {
			typ = "invalid_request_error"
		}
		llamaError(w, status, msg, typ)
		return
	}
	s.llama.scales.Store(&scales)
	s.cfg.Logger.Info("set LoRA adapter scales", "scales", scales)
	writeLlamaJSON(w, map[string]bool{"success": true})
}

// setLoRABody reads a POST /lora-adapters body for a server of n adapters:
// the scales by id, or the status and message of llama.cpp's error.
func setLoRABody(body []byte, n int) (scales []float32, status int, msg string) {
	var v json.RawMessage
	if err := json.Unmarshal(body, &v); err != nil {
		// nlohmann::json::parse's exception, answered as a server error.
		return nil, http.StatusInternalServerError, "[json.exception.parse_error.101] parse error: " + err.Error()
	}
	scales, err := parseLlamaLoRA(v, n)
	switch {
	case errors.Is(err, errLoRANotArray):
		return nil, http.StatusBadRequest, errLoRABodyNoArray.Error()
	case err != nil:
		return nil, http.StatusInternalServerError, err.Error()
	}
	return scales, http.StatusOK, ""
}
