package emulator

import (
	"encoding/json"
	"net/http"
	"sync"

	"github.com/kvroute/kvroute/engine"
)

// llama.cpp's GET /slots and GET /props (flavour llamacpp only), in the
// shape of tools/server/server-context.cpp: server_slot::to_json with
// only_metrics (the default, LLAMA_SERVER_SLOTS_DEBUG unset), the
// get_slots and get_props handlers, and format_error_response for their
// errors.
//
// The engine model batches requests as vLLM does, up to max_num_seqs; the
// emulator shows that batch as llama.cpp's -np slots: max_num_seqs slots,
// each running request in one of them for as long as it runs. A request
// that starts running takes the idle slot used least recently (llama.cpp's
// fallback when no slot's cached prompt is similar enough), keeps it until
// it finishes, is aborted or is preempted (llama.cpp does not preempt: a
// preempted request takes a slot again, with a new task id, when it runs
// again), and the slot then stays idle with its last task's numbers, as
// llama.cpp keeps task_prev. A slot's n_ctx is the model's context limit
// (max_model_len): every request may use it, and all share one cache, as
// llama.cpp's slots do with --kv-unified.

// slotTable maps the engine's running requests onto slots. update runs in
// the loop goroutine; the handlers read under mu.
type slotTable struct {
	nCtx int
	buf  []engine.SeqInfo // update's, loop goroutine only

	mu       sync.Mutex // protects the fields below
	slots    []slot
	byID     map[string]int // running request -> its slot
	nextTask int            // the next task id
	uses     int64          // slot assignments so far (the LRU clock)
	gen      uint64         // update generation, to find the slots left
}

// slot is one llama.cpp slot.
type slot struct {
	req      string // the running request, "" when idle
	hasTask  bool   // it ran a task (llama.cpp's task or task_prev)
	task     int
	info     engine.SeqInfo // the task's last state
	lastUsed int64          // uses when it was last assigned (0: never)
	seen     uint64         // gen at which its request was last running
}

func newSlotTable(n, nCtx int) *slotTable {
	return &slotTable{nCtx: nCtx, slots: make([]slot, n), byID: make(map[string]int, n)}
}

// update reads the engine's running requests into the slots. Loop
// goroutine only.
func (t *slotTable) update(eng *engine.Engine) {
	t.buf = eng.AppendRunning(t.buf[:0])
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen++
	var pending []int // indexes in buf of the requests without a slot yet
	for i, s := range t.buf {
		if k, ok := t.byID[s.ID]; ok {
			t.slots[k].info, t.slots[k].seen = s, t.gen
			continue
		}
		pending = append(pending, i)
	}
	for k := range t.slots {
		sl := &t.slots[k]
		if sl.req != "" && sl.seen != t.gen { // finished, aborted or preempted
			delete(t.byID, sl.req)
			sl.req = ""
		}
	}
	for _, i := range pending {
		k := t.leastUsedIdle()
		if k < 0 {
			break // more requests running than slots: not with max_num_seqs slots
		}
		t.uses++
		s := t.buf[i]
		t.slots[k] = slot{req: s.ID, hasTask: true, task: t.nextTask, info: s, lastUsed: t.uses, seen: t.gen}
		t.nextTask++
		t.byID[s.ID] = k
	}
}

// leastUsedIdle returns the idle slot assigned least recently (the lowest
// id among those never used), or -1.
func (t *slotTable) leastUsedIdle() int {
	best := -1
	for k := range t.slots {
		if t.slots[k].req == "" && (best < 0 || t.slots[k].lastUsed < t.slots[best].lastUsed) {
			best = k
		}
	}
	return best
}

// llamaSlot is a slot that never ran a task: server_slot::to_json without
// a task or task_prev.
type llamaSlot struct {
	ID           int  `json:"id"`
	NCtx         int  `json:"n_ctx"`
	Speculative  bool `json:"speculative"`
	IsProcessing bool `json:"is_processing"`
}

// llamaSlotTask is a slot with its (current or last) task.
type llamaSlotTask struct {
	ID           int  `json:"id"`
	NCtx         int  `json:"n_ctx"`
	Speculative  bool `json:"speculative"`
	IsProcessing bool `json:"is_processing"`
	IDTask       int  `json:"id_task"`
	// NPromptTokens is the size of the slot's cached sequence
	// (prompt.tokens: the prompt and the tokens generated so far), whose
	// KV the slot holds.
	NPromptTokens          int              `json:"n_prompt_tokens"`
	NPromptTokensProcessed int              `json:"n_prompt_tokens_processed"`
	NPromptTokensCache     int              `json:"n_prompt_tokens_cache"`
	Params                 llamaParams      `json:"params"`
	NextToken              []llamaNextToken `json:"next_token"`
}

type llamaNextToken struct {
	HasNextToken bool `json:"has_next_token"`
	HasNewLine   bool `json:"has_new_line"`
	NRemain      int  `json:"n_remain"`
	NDecoded     int  `json:"n_decoded"`
}

// llamaParams is task_params::to_json(only_metrics = true) with llama.cpp's
// default sampling settings; the emulator reports a request's output limit
// (n_predict, max_tokens) and the defaults for the rest.
type llamaParams struct {
	Seed               uint32   `json:"seed"`
	Temperature        float64  `json:"temperature"`
	DynatempRange      float64  `json:"dynatemp_range"`
	DynatempExponent   float64  `json:"dynatemp_exponent"`
	TopK               int      `json:"top_k"`
	TopP               float64  `json:"top_p"`
	MinP               float64  `json:"min_p"`
	TopNSigma          float64  `json:"top_n_sigma"`
	XTCProbability     float64  `json:"xtc_probability"`
	XTCThreshold       float64  `json:"xtc_threshold"`
	TypicalP           float64  `json:"typical_p"`
	RepeatLastN        int      `json:"repeat_last_n"`
	RepeatPenalty      float64  `json:"repeat_penalty"`
	PresencePenalty    float64  `json:"presence_penalty"`
	FrequencyPenalty   float64  `json:"frequency_penalty"`
	DryMultiplier      float64  `json:"dry_multiplier"`
	DryBase            float64  `json:"dry_base"`
	DryAllowedLength   int      `json:"dry_allowed_length"`
	DryPenaltyLastN    int      `json:"dry_penalty_last_n"`
	Mirostat           int      `json:"mirostat"`
	MirostatTau        float64  `json:"mirostat_tau"`
	MirostatEta        float64  `json:"mirostat_eta"`
	MaxTokens          int      `json:"max_tokens"`
	NPredict           int      `json:"n_predict"`
	NKeep              int      `json:"n_keep"`
	NDiscard           int      `json:"n_discard"`
	IgnoreEOS          bool     `json:"ignore_eos"`
	Stream             bool     `json:"stream"`
	NProbs             int      `json:"n_probs"`
	MinKeep            int      `json:"min_keep"`
	ChatFormat         string   `json:"chat_format"`
	ReasoningFormat    string   `json:"reasoning_format"`
	ReasoningInContent bool     `json:"reasoning_in_content"`
	GenerationPrompt   string   `json:"generation_prompt"`
	Samplers           []string `json:"samplers"`
	SpeculativeTypes   string   `json:"speculative.types"`
	TimingsPerToken    bool     `json:"timings_per_token"`
	PostSamplingProbs  bool     `json:"post_sampling_probs"`
	BackendSampling    bool     `json:"backend_sampling"`
	LoRA               []string `json:"lora"`
}

// defaultLlamaParams are common_params_sampling's defaults, n_predict -1
// (no limit).
func defaultLlamaParams(nPredict int) llamaParams {
	return llamaParams{
		Seed: 0xFFFFFFFF, Temperature: 0.8, DynatempExponent: 1, TopK: 40, TopP: 0.95, MinP: 0.05, TopNSigma: -1,
		XTCThreshold: 0.1, TypicalP: 1, RepeatLastN: 64, RepeatPenalty: 1, DryBase: 1.75, DryAllowedLength: 2,
		DryPenaltyLastN: -1, MirostatTau: 5, MirostatEta: 0.1, MaxTokens: nPredict, NPredict: nPredict,
		ChatFormat: "Content-only", ReasoningFormat: "deepseek",
		Samplers:         []string{"penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"},
		SpeculativeTypes: "none", LoRA: []string{},
	}
}

// render returns the slots as /slots lists them, and how many are idle.
func (t *slotTable) render() (out []any, idle int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out = make([]any, len(t.slots))
	for k, sl := range t.slots {
		busy := sl.req != ""
		if !busy {
			idle++
		}
		if !sl.hasTask {
			out[k] = llamaSlot{ID: k, NCtx: t.nCtx}
			continue
		}
		s := sl.info
		processed := max(0, min(s.Tokens, s.PromptTokens)-s.CachedTokens)
		out[k] = llamaSlotTask{
			ID: k, NCtx: t.nCtx, IsProcessing: busy, IDTask: sl.task,
			NPromptTokens: s.Tokens, NPromptTokensProcessed: processed, NPromptTokensCache: min(s.CachedTokens, s.Tokens),
			Params: defaultLlamaParams(s.MaxTokens),
			NextToken: []llamaNextToken{{
				HasNextToken: busy, NRemain: max(0, s.MaxTokens-s.Outputs), NDecoded: s.Outputs,
			}},
		}
	}
	return out, idle
}

// llamaError writes format_error_response's body: {"error": {code,
// message, type}} with the code as the status.
func llamaError(w http.ResponseWriter, code int, msg, typ string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{"code": code, "message": msg, "type": typ}})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

func writeLlamaJSON(w http.ResponseWriter, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		llamaError(w, http.StatusInternalServerError, err.Error(), "server_error")
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_, _ = w.Write(body)
}

// handleSlots is llama.cpp's GET /slots: 501 with Config.NoSlots
// (--no-slots), 503 with a non-empty fail_on_no_slot when no slot is idle,
// else the slots.
func (s *Server) handleSlots(w http.ResponseWriter, r *http.Request) {
	if s.cfg.NoSlots {
		llamaError(w, http.StatusNotImplemented, "This server does not support slots endpoint. Start it with `--slots`", "not_supported_error")
		return
	}
	s.syncStats(r.Context())
	out, idle := s.slots.render()
	if r.URL.Query().Get("fail_on_no_slot") != "" && idle == 0 {
		llamaError(w, http.StatusServiceUnavailable, "no slot available", "unavailable_error")
		return
	}
	writeLlamaJSON(w, out)
}

// llamaProps is the part of llama.cpp's GET /props the emulator knows.
type llamaProps struct {
	DefaultGenerationSettings struct {
		Params llamaParams `json:"params"`
		NCtx   int         `json:"n_ctx"`
	} `json:"default_generation_settings"`
	TotalSlots int    `json:"total_slots"`
	ModelAlias string `json:"model_alias"`
	ModelPath  string `json:"model_path"`
	Modalities struct {
		Vision bool `json:"vision"`
		Audio  bool `json:"audio"`
	} `json:"modalities"`
	EndpointSlots   bool   `json:"endpoint_slots"`
	EndpointProps   bool   `json:"endpoint_props"`
	EndpointMetrics bool   `json:"endpoint_metrics"`
	ChatTemplate    string `json:"chat_template"`
	BOSToken        string `json:"bos_token"`
	EOSToken        string `json:"eos_token"`
	BuildInfo       string `json:"build_info"`
	IsSleeping      bool   `json:"is_sleeping"`
}

// chatMLTemplate is the template the emulator renders chat messages with.
const chatMLTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// handleProps is llama.cpp's GET /props (always served, as llama.cpp's
// is; --props only enables POST).
func (s *Server) handleProps(w http.ResponseWriter, _ *http.Request) {
	var p llamaProps
	p.DefaultGenerationSettings.Params = defaultLlamaParams(-1)
	p.DefaultGenerationSettings.NCtx = s.slots.nCtx
	p.TotalSlots = len(s.slots.slots) // fixed at New
	p.ModelAlias, p.ModelPath = s.cfg.Model, s.cfg.Model
	p.EndpointSlots, p.EndpointMetrics = !s.cfg.NoSlots, true
	p.ChatTemplate = chatMLTemplate
	p.BOSToken, p.EOSToken = "<|im_start|>", "<|im_end|>"
	p.BuildInfo = "kvroute-emulator"
	writeLlamaJSON(w, p)
}
