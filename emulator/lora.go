package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/engine"
)

// LoRAConfig is vLLM's LoRA serving: --enable-lora and its flags. With
// Enable, a request whose "model" names an adapter is served by it (its
// blocks' hashes and KV events carry the adapter, engine.Request.LoRA, and
// its responses the adapter's name), /v1/models lists the adapters, and
// /metrics has vllm:lora_requests_info. With MetricsFlavor FlavorLlamaCpp
// the Modules are llama.cpp's --lora adapters instead, addressed by their
// ids in GET /lora-adapters and a request's "lora" list (llamalora.go).
// No adapter weights are read: a module's path is only reported.
type LoRAConfig struct {
	// Enable is vLLM's --enable-lora. Default false: no adapter serves, and
	// Modules must be empty.
	Enable bool
	// Modules are vLLM's --lora-modules, loaded at start in order: the
	// n-th gets the int id n (vLLM's lora_int_id, the lora_id of its KV
	// events).
	Modules []LoRAModule
	// MaxLoRAs is vLLM's --max-loras: the most adapters among the requests
	// of one step (engine.Config.MaxLoRAs). Default 1; at least 1.
	MaxLoRAs int
	// MaxLoRARank is vLLM's --max-lora-rank, checked as vLLM checks it
	// (one of LoRARanks) and otherwise unused. Default 16.
	MaxLoRARank int
	// MaxCPULoRAs is vLLM's --max-cpu-loras, checked as vLLM checks it (at
	// least MaxLoRAs) and otherwise unused. Default MaxLoRAs.
	MaxCPULoRAs int
	// RuntimeUpdating is vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=true: the
	// server has POST /v1/load_lora_adapter and /v1/unload_lora_adapter
	// (without Enable, a load gets vLLM's 400: LoRA is not enabled).
	// Default false (those paths are 404). Not with MetricsFlavor
	// FlavorLlamaCpp, whose adapters are loaded at start only.
	RuntimeUpdating bool
}

// LoRAModule is one of vLLM's --lora-modules: name=path, or the JSON form
// {"name": ..., "path": ..., "base_model_name": ...}.
type LoRAModule struct {
	Name, Path string
	// BaseModelName is the adapter's parent in /v1/models when it is the
	// served model's name; vLLM ignores another (the parent is then the
	// served model).
	BaseModelName string
}

// LoRARanks are the values vLLM's --max-lora-rank accepts.
var LoRARanks = []int{1, 8, 16, 32, 64, 128, 256, 320, 512}

func (c *LoRAConfig) setDefaults() {
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = 1
	}
	if c.MaxLoRARank == 0 {
		c.MaxLoRARank = 16
	}
	if c.MaxCPULoRAs == 0 {
		c.MaxCPULoRAs = c.MaxLoRAs
	}
}

// validate checks c as vLLM's LoRAConfig and its loading of the modules
// do (kvroute engine prints vLLM's messages for its flags).
func (c *LoRAConfig) validate() error {
	var errs []error
	if c.MaxLoRAs < 1 {
		errs = append(errs, fmt.Errorf("emulator: LoRA.MaxLoRAs %d must be at least 1", c.MaxLoRAs))
	}
	if !slices.Contains(LoRARanks, c.MaxLoRARank) {
		errs = append(errs, fmt.Errorf("emulator: LoRA.MaxLoRARank %d must be one of %v", c.MaxLoRARank, LoRARanks))
	}
	if c.MaxCPULoRAs < c.MaxLoRAs {
		errs = append(errs, fmt.Errorf("emulator: LoRA.MaxCPULoRAs %d must be at least LoRA.MaxLoRAs %d", c.MaxCPULoRAs, c.MaxLoRAs))
	}
	if !c.Enable && len(c.Modules) > 0 {
		// vLLM's worker, asked to load the modules without a LoRA manager.
		errs = append(errs, errors.New("emulator: LoRA.Modules need LoRA.Enable (vLLM: LoRA is not enabled)"))
	}
	seen := map[string]bool{}
	for _, m := range c.Modules {
		switch {
		case m.Name == "" || m.Path == "":
			errs = append(errs, fmt.Errorf("emulator: LoRA module %q needs a name and a path", m.Name))
		case seen[m.Name]:
			errs = append(errs, fmt.Errorf("emulator: LoRA module %q is given twice", m.Name))
		}
		seen[m.Name] = true
	}
	return errors.Join(errs...)
}

// loraAdapter is one adapter the server serves.
type loraAdapter struct {
	name, path, parent string
	id                 int // vLLM's lora_int_id
}

// loraTable is an immutable view of the adapters: replaced whole by a load
// or an unload, read without a lock by handlers and the loop.
type loraTable struct {
	order  []*loraAdapter          // in load order (/v1/models)
	byName map[string]*loraAdapter // the served ones
	// ids is the last int id of every name ever loaded: the lora_id of
	// the KV events of a request whose adapter was unloaded meanwhile.
	ids map[string]int
}

// loras is a server's adapters. Safe for concurrent use.
type loras struct {
	mu     sync.Mutex // serializes load and unload; protects nextID
	nextID int        // the last int id given (vLLM's lora_id_counter)
	table  atomic.Pointer[loraTable]
	served string // the served model (a parent)
}

func newLoRAs(served string, modules []LoRAModule) *loras {
	l := &loras{served: served}
	l.table.Store(&loraTable{byName: map[string]*loraAdapter{}, ids: map[string]int{}})
	for _, m := range modules {
		_ = l.load(m) // validated: no error
	}
	return l
}

// lookup returns the adapter serving model, or nil.
func (l *loras) lookup(model string) *loraAdapter {
	if l == nil {
		return nil
	}
	return l.table.Load().byName[model]
}

// id is the int id of adapter name for its KV events (0: none).
func (l *loras) id(name string) int {
	if l == nil {
		return 0
	}
	return l.table.Load().ids[name]
}

// load adds an adapter as vLLM's OpenAIServingModels.load_lora_adapter
// does: the next int id, its errors. A nil l (LoRA not enabled) fails as
// vLLM's engine does.
func (l *loras) load(m LoRAModule) *apiError {
	switch {
	case m.Name == "" || m.Path == "":
		return &apiError{status: http.StatusBadRequest, msg: "Both 'lora_name' and 'lora_path' must be provided.", typ: "InvalidUserInput"}
	case l == nil:
		return &apiError{status: http.StatusBadRequest, msg: "LoRA is not enabled. Use --enable-lora to enable LoRA."}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.table.Load()
	if old.byName[m.Name] != nil {
		return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("The lora adapter '%s' has already been loaded.", m.Name), typ: "InvalidUserInput"}
	}
	l.nextID++
	a := &loraAdapter{name: m.Name, path: m.Path, parent: l.served, id: l.nextID}
	if m.BaseModelName == l.served {
		a.parent = m.BaseModelName
	}
	t := &loraTable{order: append(slices.Clip(old.order), a), byName: make(map[string]*loraAdapter, len(old.byName)+1), ids: make(map[string]int, len(old.ids)+1)}
	for k, v := range old.byName {
		t.byName[k] = v
	}
	for k, v := range old.ids {
		t.ids[k] = v
	}
	t.byName[a.name], t.ids[a.name] = a, a.id
	l.table.Store(t)
	return nil
}

// unload removes an adapter as vLLM's unload_lora_adapter does; requests
// it serves run to their end.
func (l *loras) unload(name string, id int) *apiError {
	if name == "" && id == 0 {
		return &apiError{status: http.StatusBadRequest, msg: "either 'lora_name' and 'lora_int_id' needs to be provided.", typ: "InvalidUserInput"}
	}
	if l.lookup(name) == nil {
		return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The lora adapter '%s' cannot be found.", name), typ: "NotFoundError"}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.table.Load()
	if old.byName[name] == nil { // unloaded meanwhile
		return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("The lora adapter '%s' cannot be found.", name), typ: "NotFoundError"}
	}
	t := &loraTable{byName: make(map[string]*loraAdapter, len(old.byName)), ids: old.ids}
	for _, a := range old.order {
		if a.name != name {
			t.order = append(t.order, a)
			t.byName[a.name] = a
		}
	}
	l.table.Store(t)
	return nil
}

// handleLoadLoRA is vLLM's POST /v1/load_lora_adapter (with
// VLLM_ALLOW_RUNTIME_LORA_UPDATING): {"lora_name", "lora_path"} -> 200
// and its plain success text, or its error. The path is not read.
func (s *Server) handleLoadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
		Path string `json:"lora_path"`
	}
	if aerr := decodeLoRABody(w, r, s.cfg.MaxBodyBytes, &req); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if aerr := s.loras.load(LoRAModule{Name: req.Name, Path: req.Path}); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	s.cfg.Logger.Info("loaded LoRA adapter", "name", req.Name, "path", req.Path)
	writePlain(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.Name))
}

// handleUnloadLoRA is vLLM's POST /v1/unload_lora_adapter:
// {"lora_name"} -> 200 and its plain success text, or its error.
func (s *Server) handleUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"lora_name"`
		ID   int    `json:"lora_int_id"`
	}
	if aerr := decodeLoRABody(w, r, s.cfg.MaxBodyBytes, &req); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if aerr := s.loras.unload(req.Name, req.ID); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	s.cfg.Logger.Info("unloaded LoRA adapter", "name", req.Name)
	writePlain(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.Name))
}

// decodeLoRABody decodes a load or unload body; one that is not a JSON
// object of the request's fields gets the 400 of FastAPI's validation.
func decodeLoRABody(w http.ResponseWriter, r *http.Request, limit int64, v any) *apiError {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit)).Decode(v); err != nil {
		return &apiError{status: http.StatusBadRequest, msg: "invalid request body: " + err.Error(), typ: typeValidation}
	}
	return nil
}

// writePlain answers 200 with body and no Content-Type, as vLLM's
// Response(status_code=200, content=...) does.
func writePlain(w http.ResponseWriter, body string) {
	w.Header()["Content-Type"] = nil
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(body))
}

// resolveModel returns the adapter a request's "model" names ("" for the
// served model, or a request that names none), or vLLM's 404.
func (s *Server) resolveModel(model string) (string, *apiError) {
	if model == "" || model == s.cfg.Model {
		return "", nil
	}
	if a := s.loras.lookup(model); a != nil {
		return a.name, nil
	}
	return "", errNoModel(model)
}

// resolveAdapter returns the adapter a request names ("" for the base
// model) as the engine's protocol addresses one: llama.cpp's "lora" list
// with the llama.cpp flavour (resolveLlamaAdapter), vLLM's "model" naming
// it (resolveModel), or, with the SGLang P/D protocol (an SGLang engine),
// SGLang's OpenAI-compatible forms: "model" as "<base>:<adapter>" (split
// at its first colon, both parts trimmed; an empty adapter names none),
// else the body's lora_path, the model's adapter winning
// (OpenAIServingBase._resolve_lora_path). SGLang does not check the model
// name itself ("default" is as good as any), so a "model" naming an adapter
// alone is the base model's request there. An adapter it does not serve is
// SGLang's 400 (LoRARegistry.acquire's ValueError, answered by its serving
// layer as a BadRequestError), before the engine takes the request, as
// SGLang's tokenizer manager refuses it before its scheduler sees it; a
// streamed request gets it in a 200, as its stream's error event and
// [DONE] (writeSGLangStreamError): the tokenizer manager's
// generate_request runs inside the StreamingResponse's generator, whose
// ValueError the serving code turns into that event.
func (s *Server) resolveAdapter(req *apiRequest) (string, *apiError) {
	if s.llama != nil {
		return s.resolveLlamaAdapter(req) // llamalora.go
	}
	if s.cfg.PDProtocol != PDSGLang {
		return s.resolveModel(req.Model)
	}
	name := req.loraPath
	if _, a, ok := strings.Cut(req.Model, ":"); ok {
		if a = strings.TrimSpace(a); a != "" {
			name = a
		}
	}
	if name == "" {
		return "", nil
	}
	if !s.cfg.LoRA.Enable {
		return "", &apiError{status: http.StatusBadRequest, sglang: true, msg: fmt.Sprintf(
			"LoRA adapter '%s' was requested, but LoRA is not enabled. Please launch the server with --enable-lora flag.", name)}
	}
	if a := s.loras.lookup(name); a != nil {
		return a.name, nil
	}
	var loaded []string
	if s.loras != nil {
		for _, a := range s.loras.table.Load().order {
			loaded = append(loaded, "'"+a.name+"'")
		}
	}
	// Python's repr of the registry's keys (an OrderedDict's). SGLang's
	// tokenizer manager raises it in generate_request, which a streamed
	// response runs after it started (apiError.inStream).
	return "", &apiError{status: http.StatusBadRequest, sglang: true, inStream: true, msg: fmt.Sprintf(
		"The following requested LoRA adapters are not loaded: %s\nLoaded adapters: odict_keys([%s]).", name, strings.Join(loaded, ", "))}
}

// loraInfo is vllm:lora_requests_info: one series per set of labels ever
// set, its value the wall-clock time it was last set (prometheus_client's
// set_to_current_time on the label set of each step's stats), as vLLM's
// GaugeVec keeps every child it made. At most maxLoRAInfoSeries are kept
// (vLLM keeps all): past it the oldest goes.
type loraInfo struct {
	desc    *prometheus.Desc
	maxLoRA string

	mu     sync.Mutex // protects series, cur, and the loop's scratch below
	series map[[2]string]float64
	cur    [2]string // the labels set last
	// The loop's: the adapters of the last update, to skip joining them
	// again when they did not change, and the engine's steps then.
	running, waiting []string
	runBuf, waitBuf  []string
	steps            int64
}

const maxLoRAInfoSeries = 1024

func newLoRAInfo(maxLoRAs int) *loraInfo {
	return &loraInfo{
		desc:    prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.", []string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil),
		maxLoRA: strconv.Itoa(maxLoRAs),
		series:  map[[2]string]float64{},
	}
}

// update sets the series of the engine's running and waiting adapters to
// now (the loop calls it when it publishes its stats) if the engine
// stepped since the last update (steps: its Stats.Steps): vLLM records
// the series with each step's stats, none while idle, so an engine that
// never stepped has none.
func (li *loraInfo) update(eng *engine.Engine, steps int64, now time.Time) {
	li.mu.Lock()
	defer li.mu.Unlock()
	if steps == li.steps {
		return
	}
	li.steps = steps
	li.runBuf, li.waitBuf = eng.AppendLoRAs(li.runBuf[:0], li.waitBuf[:0])
	if len(li.series) == 0 || !slices.Equal(li.runBuf, li.running) || !slices.Equal(li.waitBuf, li.waiting) {
		li.running = append(li.running[:0], li.runBuf...)
		li.waiting = append(li.waiting[:0], li.waitBuf...)
		li.cur = [2]string{strings.Join(li.running, ","), strings.Join(li.waiting, ",")}
	}
	if _, ok := li.series[li.cur]; !ok && len(li.series) >= maxLoRAInfoSeries {
		oldest, t := [2]string{}, 0.0
		for k, v := range li.series {
			if t == 0 || v < t {
				oldest, t = k, v
			}
		}
		delete(li.series, oldest)
	}
	li.series[li.cur] = float64(now.UnixNano()) / 1e9
}

func (li *loraInfo) Describe(ch chan<- *prometheus.Desc) { ch <- li.desc }

func (li *loraInfo) Collect(ch chan<- prometheus.Metric) {
	li.mu.Lock()
	defer li.mu.Unlock()
	for k, v := range li.series {
		ch <- prometheus.MustNewConstMetric(li.desc, prometheus.GaugeValue, v, li.maxLoRA, k[0], k[1])
	}
}
