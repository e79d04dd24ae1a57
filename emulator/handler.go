package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if s.isStopped() {
		// vLLM answers a dead engine's health check with a bare 503.
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// isStopped reports whether the engine's loop has stopped.
func (s *Server) isStopped() bool {
	s.inMu.Lock()
	defer s.inMu.Unlock()
	return s.stopped
}

// modelPermission is vLLM's ModelPermission, one per model card.
type modelPermission struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	Created            int64   `json:"created"`
	AllowCreateEngine  bool    `json:"allow_create_engine"`
	AllowSampling      bool    `json:"allow_sampling"`
	AllowLogprobs      bool    `json:"allow_logprobs"`
	AllowSearchIndices bool    `json:"allow_search_indices"`
	AllowView          bool    `json:"allow_view"`
	AllowFineTuning    bool    `json:"allow_fine_tuning"`
	Organization       string  `json:"organization"`
	Group              *string `json:"group"`
	IsBlocking         bool    `json:"is_blocking"`
}

// handleModels is GET /v1/models in vLLM's ModelList shape: one card for
// the served model with its max_model_len and a permission list (vLLM
// makes the card, its "created" and the permission's id per request), then
// one per LoRA adapter in load order, as vLLM's show_available_models
// lists them: its root the adapter's path, its parent the served model,
// no max_model_len.
func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string            `json:"id"`
		Object      string            `json:"object"`
		Created     int64             `json:"created"`
		OwnedBy     string            `json:"owned_by"`
		Root        string            `json:"root"`
		Parent      *string           `json:"parent"`
		MaxModelLen *int              `json:"max_model_len"`
		Permission  []modelPermission `json:"permission"`
	}
	now := time.Now().Unix()
	perm := func() []modelPermission {
		return []modelPermission{{ID: "modelperm-" + strings.TrimPrefix(openai.NewCompletionID(), "cmpl-"),
			Object: "model_permission", Created: now, AllowSampling: true, AllowLogprobs: true, AllowView: true,
			Organization: "*"}}
	}
	maxLen := s.prof.MaxModelLen
	cards := []model{{ID: s.cfg.Model, Object: "model", Created: now, OwnedBy: "vllm", Root: s.cfg.Model,
		MaxModelLen: &maxLen, Permission: perm()}}
	if s.loras != nil {
		for _, a := range s.loras.table.Load().order {
			cards = append(cards, model{ID: a.name, Object: "model", Created: now, OwnedBy: "vllm", Root: a.path,
				Parent: &a.parent, Permission: perm()})
		}
	}
	body, _ := json.Marshal(struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", cards})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// allowed is the Allow header of vLLM's routes the emulator serves, by
// path: another method gets FastAPI's 405 (Starlette adds HEAD to GET
// routes). /metrics is a mounted ASGI app in vLLM and left out.
var allowed = map[string]string{
	"/v1/completions":      "POST",
	"/v1/chat/completions": "POST",
	"/health":              "GET, HEAD",
	"/v1/models":           "GET, HEAD",
	"/version":             "GET, HEAD",
	"/tokenize":            "POST",
	"/detokenize":          "POST",
	"/reset_prefix_cache":  "POST",
}

// handleNotFound answers what no route takes as FastAPI does: 404, or 405
// with Allow for a known path and another method.
func (s *Server) handleNotFound(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if allow, ok := allowed[r.URL.Path]; ok {
		w.Header().Set("Allow", allow)
		w.WriteHeader(http.StatusMethodNotAllowed)
		_, _ = io.WriteString(w, `{"detail":"Method Not Allowed"}`)
		return
	}
	w.WriteHeader(http.StatusNotFound)
	_, _ = io.WriteString(w, `{"detail":"Not Found"}`)
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) { s.handle(w, r, false) }
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request)        { s.handle(w, r, true) }

var idCounter atomic.Uint64

// job is one request in a handler: its parsed form and the generation
// state built from the stream.
type job struct {
	chat        bool
	role        string // chat: the answer's role when not the assistant's (responseRole)
	req         *apiRequest
	respID      string
	engineID    string
	prompt      []uint32
	maxTokens   int
	st          *stream
	hdr         openai.ChunkHeader
	kvPrefill   bool      // P/D prefill leg: return kv_transfer_params
	peerBy      time.Time // SGLang prefill leg: the end of its wait for the decode engine's bootstrap (awaitBootstrap); zero for others
	room        *lease    // SGLang prefill leg: its room (awaitBootstrap; endRoom)
	streaming   bool      // the stream's status and headers were sent (startStream): an SGLang prefill leg's, before its bootstrap
	remoteID    string    // P/D prefill leg: remote_request_id
	pull        *pullJob  // P/D decode leg: its KV's pull (awaitPull)
	maxStop     int       // bytes of the longest stop string (the search keeps maxStop-1)
	holdChars   int       // characters a stream holds back for stop strings (vLLM's stop_buffer_length)
	text        []byte    // rendered text not yet sent; in textBuf once tokens arrive
	textBuf     *[]byte   // from getBuf when the first tokens are rendered
	sent        int       // bytes of text already streamed
	checked     int       // bytes of text already searched for stop strings
	buf         []uint32
	toksBuf     *[]uint32       // from getToks: a whole response's tokens (tokens)
	ereq        *engine.Request // the request as the engine has it
	scratch     []uint32
	finish      string
	stopReason  string
	generated   int
	prog        progress
	stopped     bool // a stop string matched
	roleWritten bool
	held        []iterOut // a request with stop strings' outputs decided (stopState.takeHeld)
	chunked     bool      // an output was due (--stream-interval)
	chunkedAt   int       // generated tokens at the last due output
	returnIDs   bool      // the request set return_token_ids
	idsSent     int       // return_token_ids: generated tokens whose ids a chunk carried
	promptSent  bool      // return_token_ids: a chunk carried the prompt's ids
	// direct is set for a whole response without stop strings whose
	// tokens render as plain words (Server.plainWords): its text is not
	// rendered into text but straight into the body (appendWhole), which
	// needs no escaping.
	direct bool
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request, chat bool) {
	bodyBuf := getBody()
	body, err := readBody(w, r, s.cfg.MaxBodyBytes, bodyBuf)
	if err != nil {
		putBody(bodyBuf)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", mbe.Limit))
			return
		}
		writeError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		return
	}
	req, aerr := parseRequest(body, chat)
	if !chat || aerr != nil {
		// parseRequest copies what it keeps, but for a chat request's
		// messages: they alias the body, recycled once they are encoded.
		putBody(bodyBuf)
		bodyBuf = nil
	}
	if aerr == nil && !chat && req.promptEmpty {
		aerr = errNoPrompt() // (POST /tokenize takes an empty prompt)
	}
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	// A NixlConnector decode leg rejected before the engine takes it (an
	// unknown model or adapter, a prompt too long, ...) tells its prefill
	// engine to free the blocks it holds for it (rejectedRemote).
	admitted := false
	if rr := s.owedRelease(r, req); rr != nil {
		defer func() {
			if !admitted {
				s.rejectedRemote(w, rr)
			}
		}()
	}
	lora, aerr := s.resolveAdapter(req)
	if aerr != nil {
		putBody(bodyBuf)
		if aerr.inStream && req.Stream {
			writeSGLangStreamError(w, aerr)
		} else {
			writeAPIError(w, aerr)
		}
		return
	}
	if !chat && req.hasSuffix() {
		putBody(bodyBuf)
		writeError(w, http.StatusBadRequest, "suffix is not currently supported")
		return
	}
	if chat && req.autoTools && !s.cfg.EnableAutoToolChoice {
		putBody(bodyBuf)
		writeAPIError(w, errAutoTools())
		return
	}
	j := &job{chat: chat, req: req, returnIDs: req.returnTokenIDs()}
	defer j.putText()
	if chat {
		aerr := s.contentError(req)
		var opts *chatOpts
		if aerr == nil {
			opts, aerr = req.chatOptions(s.cfg.ExcludeToolsWhenToolChoiceNone)
		}
		if aerr == nil {
			j.prompt, aerr = s.encodeMessages(req, opts)
		}
		if n := len(req.chatMessages); n > 0 && req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt {
			// vLLM answers in the last message's role then
			// (get_chat_request_role); a copy, as the body is recycled.
			j.role = strings.Clone(req.chatMessages[n-1].Role)
		}
		req.chatMessages, req.messagesJSON = nil, nil
		putBody(bodyBuf)
		if aerr != nil {
			writeAPIError(w, aerr)
			return
		}
		j.respID = openai.NewChatID()
	} else {
		if req.promptIDs != nil {
			j.prompt = req.promptIDs
			for _, id := range j.prompt {
				if v := s.prof.Model.Vocab; v > 0 && int64(id) >= int64(v) {
					writeError(w, http.StatusBadRequest, fmt.Sprintf("Token id %d is out of vocabulary", id))
					return
				}
			}
		} else {
			j.prompt = s.encodePrompt(req.promptText, req)
		}
		j.respID = openai.NewCompletionID()
	}
	if len(j.prompt) == 0 {
		writeError(w, http.StatusBadRequest, "The prompt cannot be empty.")
		return
	}
	if aerr := s.checkLength(j); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if aerr := s.logprobsError(req); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		// vLLM names the request after the header (_base_request_id), so a
		// P/D pair shares it.
		w.Header().Set("X-Request-Id", id)
		j.respID = respIDPrefix(chat) + id
	} else if req.requestID != "" {
		// Else after the body's request_id (the default _base_request_id
		// takes; a random uuid when the body has none).
		j.respID = respIDPrefix(chat) + req.requestID
	}
	j.engineID = engineRequestID(j.respID, idCounter.Add(1))
	now := time.Now() // one clock reading for created and the seed
	// An adapter's responses carry its name (vLLM's
	// OpenAIServingModels.model_name of the request's LoRA).
	model := s.cfg.Model
	switch {
	case s.cfg.PDProtocol == PDSGLang && req.Model != "":
		model = req.Model // SGLang answers in the request's model, as given
	case lora != "":
		model = lora
	}
	j.hdr = openai.ChunkHeader{ID: j.respID, Model: model, Created: now.Unix()}
	for _, stop := range req.stops {
		j.maxStop = max(j.maxStop, len(stop))
		j.holdChars = max(j.holdChars, utf8.RuneCountInString(stop)-1)
	}

	ereq := &engine.Request{ID: j.engineID, Prompt: j.prompt, MaxTokens: j.maxTokens, IgnoreEOS: req.IgnoreEOS, CacheSalt: req.cacheSalt, LoRA: lora}
	seed := uint64(0)
	if req.Seed != nil {
		seed = mix64(uint64(*req.Seed)) | 1
		ereq.Seed = seed
	} else {
		seed = mix64(idCounter.Load()) ^ uint64(now.UnixNano())
	}
	ereq.EOSAt = eosAt(seed, s.cfg.EOSMean)
	if minTokens := int(req.MinTokens); ereq.EOSAt > 0 && ereq.EOSAt <= minTokens {
		ereq.EOSAt = minTokens + 1 // min_tokens holds EOS back
	}
	every := 0 // a whole response: the handler wakes when the request finished
	switch {
	case len(req.stops) > 0:
		every = 1 // stop strings are searched at every step, as vLLM's detokenizer does
	case req.Stream:
		every = s.cfg.StreamInterval
	}
	j.st = newStream(j.engineID, every, j.maxTokens)
	if len(req.stops) > 0 {
		j.st.stop = &stopState{}
	}
	j.direct = every == 0 && s.plainWords
	j.ereq = ereq
	defer j.putToks()

	if d := s.dp; d != nil {
		// A data-parallel server: validated as vLLM's front end validates,
		// the request goes to the engine core of the rank d picks (the
		// X-data-parallel-rank header's, or its load balancer's).
		k, aerr := d.pick(r.Header)
		if aerr != nil {
			writeRankError(w, req.Stream, aerr)
			return
		}
		defer d.release(k)
		s = d.ranks[k]
	} else if v := r.Header[HeaderDataParallelRank]; v != nil {
		// One engine checks the header's rank too (vLLM's data parallel
		// size is then 1).
		if _, _, aerr := headerRank(v[0], 1); aerr != nil {
			writeRankError(w, req.Stream, aerr)
			return
		}
	}
	if aerr := s.preparePD(r, j, ereq); aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if !j.peerBy.IsZero() {
		if req.Stream {
			// SGLang's StreamingResponse sends its status and headers
			// before its generator waits for the request: a streamed
			// prefill leg's answer starts before its bootstrap.
			startStream(w)
			j.streaming = true
		}
		ok, aerr := s.awaitBootstrap(r, j)
		if !ok {
			if aerr != nil {
				writeLegError(w, j.streaming, aerr)
			}
			return
		}
		defer s.endRoom(j)
	}
	if err := s.post(command{kind: cmdAdd, req: ereq, st: j.st}); err != nil {
		if j.streaming {
			writeLegError(w, true, &apiError{status: http.StatusServiceUnavailable, msg: err.Error()})
			return
		}
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	admitted = true
	if j.pull != nil && !s.awaitPull(w, r, j) {
		return
	}
	if req.Stream {
		s.serveStream(w, r, j)
		return
	}
	s.serveWhole(w, r, j)
}

// startStream sends a stream's status and headers (200, text/event-stream).
func startStream(w http.ResponseWriter) {
	openai.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
}

// writeLegError writes aerr, the failure of an SGLang prefill leg before
// the engine took it: in its stream, started (startStream), as the error
// event and [DONE]; else as SGLang's error body.
func writeLegError(w http.ResponseWriter, streaming bool, aerr *apiError) {
	if !streaming {
		writeAPIError(w, aerr)
		return
	}
	sw := openai.NewSSEWriter(w)
	sw.Data(appendErrorBody(nil, aerr.status, aerr.msg))
	sw.Done()
	_ = sw.Flush()
}

// respIDPrefix is the prefix of a response id: vLLM's "chatcmpl-" or
// "cmpl-".
func respIDPrefix(chat bool) string {
	if chat {
		return "chatcmpl-"
	}
	return "cmpl-"
}

// engineRequestID is the engine's id of the request answered as respID,
// the n-th of the process: respID-n (n in base 36), built on the stack
// (one allocation, the string's; not inlined, so that its buffer is not
// in handle's frame, on the stack for the whole request).
//
//go:noinline
func engineRequestID(respID string, n uint64) string {
	var buf [64]byte
	b := append(buf[:0], respID...)
	b = append(b, '-')
	return string(strconv.AppendUint(b, n, 36))
}

// checkLength sets j.maxTokens and rejects requests that do not fit the
// context, as vLLM's renderer does (vllm/renderers/params.py,
// TokenizeParams): the requested output alone must fit max_model_len, then
// the prompt must fit what it leaves. A completion without max_tokens asks
// for 16; a chat request without one gets what the context leaves (capped
// by Config.DefaultMaxTokens), and a prompt that leaves nothing fails as
// vLLM's sampling parameters do.
func (s *Server) checkLength(j *job) *apiError {
	maxLen := s.prof.MaxModelLen
	n := len(j.prompt)
	out, given, param := 0, j.req.MaxTokens != nil, "max_tokens"
	switch {
	case given:
		out = int(*j.req.MaxTokens)
		if j.chat && j.req.MaxCompletionTokens != nil {
			param = "max_completion_tokens"
		}
	case !j.chat: // vLLM's CompletionRequest: max_tokens 16 when absent or null
		out, given = completionDefaultMaxTokens, true
	}
	if err := lengthError(maxLen, n, out, param); err != nil {
		return err
	}
	if err := j.req.checkN(); err != nil {
		return err
	}
	if given {
		if out < 1 {
			return tooFewTokens(out)
		}
		j.maxTokens = out
		return j.req.checkSampling(out)
	}
	j.maxTokens = min(s.cfg.DefaultMaxTokens, maxLen-n)
	if j.maxTokens < 1 {
		return tooFewTokens(j.maxTokens)
	}
	return j.req.checkSampling(j.maxTokens)
}

// checkSampling is the rest of vLLM's sampling parameters' checks, in
// their order: min_tokens against the final max_tokens, then the stop
// strings (an empty one would match everywhere).
func (r *apiRequest) checkSampling(maxTokens int) *apiError {
	if aerr := checkMinTokens(int(r.MinTokens), maxTokens); aerr != nil {
		return aerr
	}
	if slices.Contains(r.stops, "") {
		return badRequest("stop cannot contain an empty string.")
	}
	return nil
}

// lengthError is vLLM's error for n prompt tokens and out requested output
// tokens (named param) that do not fit maxLen, or nil when they fit.
func lengthError(maxLen, n, out int, param string) *apiError {
	if out > maxLen {
		// vLLM's message has no space before "cannot" and names the
		// limit twice (an f-string's "{max_total_tokens=}").
		return validationError(param, out, "%s=%dcannot be greater than max_model_len=max_total_tokens=%d. "+
			"Please request fewer output tokens.", param, out, maxLen)
	}
	if n > maxLen-out {
		return validationError("input_tokens", n, "You passed %d input tokens and requested %d output tokens. "+
			"However, the model's context length is only %d tokens, resulting in a maximum input length of %d tokens. "+
			"Please reduce the length of the input prompt.", n, out, maxLen, maxLen-out)
	}
	return nil
}

// abort tells the engine the client is gone.
func (s *Server) abort(j *job) {
	j.st.aborted.Store(true)
	_ = s.post(command{kind: cmdAbort, id: j.engineID})
	if ss := j.st.stop; ss != nil {
		// A finish held for this handler is recorded now, with every
		// token; one still to come is recorded by the loop (st.aborted).
		j.st.mu.Lock()
		f, m, n := ss.fin, ss.m, j.st.generated-ss.counted
		ss.fin = nil
		var itls []time.Duration
		if f != nil {
			ss.counted += n
			itls = ss.takeITLs(ss.counted)
			f.generated = float64(ss.counted)
			f.decodeUntil(itls, ss.counted)
		}
		// The held outputs count: a request whose client left has all
		// its tokens counted (none is held after a match).
		held := ss.takeHeld(j.held[:0], true)
		j.st.mu.Unlock()
		j.held = held
		if f != nil {
			m.stopCounted.Add(int64(n))
		}
		if f != nil || len(held) > 0 {
			m.mu.Lock()
			m.decideIter(held, math.MaxInt)
			if f != nil {
				m.observeLatencies(itls)
				m.addFinish(*f)
			}
			m.mu.Unlock()
		}
	}
}

// advance takes the stream's new tokens, renders them and applies stop
// strings. It reports whether the request is over. A request with stop
// strings then counts its tokens searched (settleStop).
func (s *Server) advance(j *job) bool {
	over := s.advanceText(j)
	if j.st.stop != nil {
		s.settleStop(j)
	}
	return over
}

// settleStop counts the tokens of a request with stop strings that its
// handler searched, up to the one that completed a match (vLLM counts
// those its output processor processed), and records its finish when the
// engine finished it before the handler searched its last tokens: with
// the tokens counted and "stop" when a stop string matched.
func (s *Server) settleStop(j *job) {
	ss := j.st.stop
	j.st.mu.Lock()
	n := max(0, j.generated-ss.counted)
	ss.counted += n
	m, f := ss.m, ss.fin
	var itls []time.Duration
	if f != nil && (j.stopped || j.prog.finished) {
		ss.fin = nil
		itls = ss.takeITLs(ss.counted)
		f.generated = float64(ss.counted)
		f.decodeUntil(itls, ss.counted)
		if j.stopped {
			f.reason = engine.FinishStop
		}
	} else {
		f = nil
	}
	held, counted := ss.takeHeld(j.held[:0], j.stopped || j.prog.finished), ss.counted
	j.st.mu.Unlock()
	j.held = held
	if m == nil {
		return // not added to an engine (yet)
	}
	if n > 0 {
		m.stopCounted.Add(int64(n))
	}
	if f != nil || len(held) > 0 {
		m.mu.Lock()
		m.decideIter(held, counted)
		if f != nil {
			m.observeLatencies(itls)
			m.addFinish(*f)
		}
		m.mu.Unlock()
	}
}

// stopMatched records that stop ended the request before the engine
// finished it, with its tokens up to the match counted, in one step: the
// engine's last output, which may follow the abort at once, finds both
// (Server.finished).
func (s *Server) stopMatched(j *job, stop string) {
	ss := j.st.stop
	if ss == nil {
		return
	}
	j.st.mu.Lock()
	n := max(0, j.generated-ss.counted)
	ss.counted += n
	ss.match = stop
	m := ss.m
	j.st.mu.Unlock()
	if m != nil && n > 0 {
		m.stopCounted.Add(int64(n))
	}
}

// advanceText is advance before the stop strings' accounting.
func (s *Server) advanceText(j *job) bool {
	j.prog = j.st.take(j.buf)
	p := &j.prog
	j.buf = p.toks
	if j.st.every == 0 && p.finished && p.err == nil {
		s.tokens(j)
	}
	if j.stopped {
		return true
	}
	before := j.generated // tokens out before p.toks
	j.generated = p.generated
	if toks := p.toks; len(toks) > 0 && !j.direct {
		if j.textBuf == nil {
			// Taken only now, not when the request arrives: a request
			// waiting for its tokens holds no text buffer, so a few buffers
			// recycled by the finishing requests serve the whole fleet.
			j.textBuf = getBuf()
			j.text = (*j.textBuf)[:0]
		}
		if len(j.req.stops) == 0 {
			j.text, j.scratch = s.render(j.text, toks, j.scratch)
		} else if s.searchStops(j, toks, before, p.finished) {
			return true
		}
	}
	if p.finished {
		j.finish = p.finishReason
	}
	return p.finished
}

// searchStops renders toks, the tokens generated after the first before,
// and looks for the stop strings as vLLM's detokenizer does at every step:
// in each token's text (a handler may take several tokens at one wake-up),
// from the token after the first min_tokens on. On a match it truncates
// the text, counts the tokens up to the one that completed the match (the
// request's output as vLLM reports it), aborts the engine's request unless
// it finished, and reports true.
func (s *Server) searchStops(j *job, toks []uint32, before int, finished bool) bool {
	for i := range toks {
		j.text, j.scratch = s.render(j.text, toks[i:i+1], j.scratch)
		if before+i < int(j.req.MinTokens) || len(j.text) == j.checked {
			j.checked = len(j.text) // within min_tokens, or no new text: not searched
			continue
		}
		at, stop := stopMatch(j.text, j.checked, j.req.stops)
		j.checked = len(j.text)
		if at < 0 {
			continue
		}
		if j.req.IncludeStopStr {
			at += len(stop)
		}
		j.text = j.text[:at]
		j.generated = before + i + 1
		j.stopped, j.finish, j.stopReason = true, openai.FinishStop, stop
		if !finished {
			s.stopMatched(j, stop)
			_ = s.post(command{kind: cmdAbort, id: j.engineID})
		}
		return true
	}
	return false
}

// wait blocks until the stream has news or the client is gone.
func (s *Server) wait(r *http.Request, j *job) bool {
	select {
	case <-j.st.ch:
		return true
	case <-r.Context().Done():
		s.abort(j)
		return false
	}
}

func (s *Server) serveWhole(w http.ResponseWriter, r *http.Request, j *job) {
	for {
		if !s.wait(r, j) {
			return
		}
		if s.advance(j) {
			break
		}
	}
	if err := j.prog.err; err != nil {
		s.writeEngineError(w, err)
		return
	}
	if !s.awaitPeer(r, j) {
		return
	}
	var kv map[string]any
	if j.kvPrefill {
		kv = s.kvTransferParams(j)
	}
	out := getBuf()
	defer putBuf(out)
	*out = s.appendWhole((*out)[:0], j, kv)
	s.setLoadHeader(w, r)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(*out)))
	_, _ = w.Write(*out)
}

func (s *Server) writeEngineError(w http.ResponseWriter, err error) {
	var le *engine.LengthError
	switch {
	case errors.As(err, &le):
		aerr := lengthError(le.MaxModelLen, le.PromptTokens, le.MaxTokens, "max_tokens")
		if aerr == nil { // no max_tokens, and the prompt leaves no room
			aerr = tooFewTokens(le.MaxModelLen - le.PromptTokens)
		}
		writeAPIError(w, aerr)
	case errors.Is(err, ErrStopped):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, j *job) {
	if !j.streaming {
		openai.SetHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
	}
	sw := openai.NewSSEWriter(w)
	if err := sw.Flush(); err != nil {
		s.abort(j)
		return
	}
	object := openai.ObjectChatCompletionChunk
	if !j.chat {
		object = openai.ObjectTextCompletion
	}
	for {
		if !s.wait(r, j) {
			return
		}
		done := s.advance(j)
		if err := j.prog.err; err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, ErrStopped) {
				status = http.StatusServiceUnavailable
			}
			sw.Data(appendErrorBody(nil, status, err.Error()))
			sw.Done()
			_ = sw.Flush()
			return
		}
		if done && !s.awaitPeer(r, j) {
			return
		}
		upto := len(j.text)
		if !done && s.codec != nil {
			upto = completeText(j.text, j.sent, upto) // hold back a character's first bytes
		}
		if !done && j.holdChars > 0 && !j.req.IncludeStopStr {
			// And a possible stop-string prefix, as vLLM's detokenizer
			// does unless the stop string is to be output: the longest
			// stop string's length less one, in characters of the
			// complete text.
			upto = max(j.sent, cutChars(j.text[:upto], j.holdChars))
		}
		if j.chat && !j.roleWritten && (upto > j.sent || done || j.generated > 0) {
			sw.AppendData(func(b []byte) []byte {
				return openai.AppendChatRoleChunk(b, &j.hdr, j.responseRole(), j.promptIDs(), j.usage(0))
			})
			j.roleWritten = true
		}
		// --stream-interval: vLLM's output processor passes the first token
		// on at once, then every interval tokens (the loop wakes this
		// handler only then, unless stop strings are searched at every
		// step), and the last. A due output whose text is all held back
		// (for stop strings, or a character's first bytes) is still sent,
		// with empty text, as vLLM's serving code sends an output that
		// has tokens but no text.
		due := done
		if j.generated > j.chunkedAt && (!j.chunked || j.generated-j.chunkedAt >= s.cfg.StreamInterval) {
			due = true
			j.chunked, j.chunkedAt = true, j.generated
		}
		if due || done {
			piece := bytesString(j.text[j.sent:upto]) // used before j.text changes (AppendData runs fn at once)
			j.sent = upto
			finish := ""
			var stopJSON []byte
			if done {
				finish = j.finish
				stopJSON = openai.StopReasonJSON(nil, j.stopReason, 0, false)
			}
			ids := s.chunkIDs(j)
			if j.chat {
				sw.AppendData(func(b []byte) []byte {
					return openai.AppendChatContentChunk(b, &j.hdr, piece, finish, stopJSON, ids, j.usage(j.generated))
				})
			} else {
				sw.AppendData(func(b []byte) []byte {
					return openai.AppendCompletionChunk(b, &j.hdr, piece, finish, stopJSON, j.promptIDs(), ids, j.usage(j.generated))
				})
			}
			j.compact()
		}
		if done {
			if so := j.req.StreamOptions; so != nil && so.IncludeUsage {
				sw.AppendData(func(b []byte) []byte {
					return openai.AppendUsageChunk(b, &j.hdr, object, len(j.prompt), j.generated, j.prog.cachedTokens)
				})
			}
			sw.Done()
			_ = sw.Flush()
			return
		}
		if err := sw.Flush(); err != nil {
			s.abort(j)
			return
		}
	}
}

// promptIDs is the prompt_token_ids of a stream's next chunk: with
// return_token_ids the prompt's ids in the first chunk that carries them
// (chat: the role chunk; completions: the first chunk), nil (null)
// otherwise.
func (j *job) promptIDs() []uint32 {
	if !j.returnIDs || j.promptSent {
		return nil
	}
	j.promptSent = true
	return j.prompt
}

// chunkIDs is the token_ids of a stream's next chunk: with
// return_token_ids the ids of the tokens generated since the previous
// chunk (up to a stop string's match, EOS included, as vLLM's output
// has them), nil (null) otherwise.
func (s *Server) chunkIDs(j *job) []uint32 {
	if !j.returnIDs {
		return nil
	}
	ids := s.sampler.AppendTokenRange(make([]uint32, 0, max(0, j.generated-j.idsSent)), j.ereq, j.idsSent, j.generated)
	j.idsSent = max(j.idsSent, j.generated)
	return ids
}

// cutChars returns the length of b without its last n characters (UTF-8
// sequences; an invalid byte counts as one, as it is one U+FFFD in the
// text vLLM holds).
func cutChars(b []byte, n int) int {
	i := len(b)
	for ; n > 0 && i > 0; n-- {
		_, size := utf8.DecodeLastRune(b[:i])
		i -= size
	}
	return i
}

// tokens puts the tokens of a finished whole response (every 0, whose
// stream collected none) in j.prog.toks: the engine's Sampler recomputes
// them, the EOS that ended a "stop" finish excluded (it has no text), as
// the stream would have collected them.
func (s *Server) tokens(j *job) {
	p := &j.prog
	n := p.generated
	if p.finishReason == engine.FinishStop {
		n--
	}
	if n <= 0 {
		return
	}
	if j.toksBuf == nil {
		j.toksBuf = getToks()
	}
	*j.toksBuf = s.sampler.AppendTokens((*j.toksBuf)[:0], j.ereq, n)
	p.toks = *j.toksBuf
}

// putToks recycles the tokens buffer (handle's deferred clean-up).
func (j *job) putToks() {
	if j.toksBuf != nil {
		putToks(j.toksBuf)
		j.toksBuf = nil
	}
}

// putText recycles the text buffer (handle's deferred clean-up).
func (j *job) putText() {
	if j.textBuf != nil {
		*j.textBuf = j.text
		putBuf(j.textBuf)
		j.textBuf, j.text = nil, nil
	}
}

// compact drops the streamed text no longer needed: all that was sent, or
// with stop strings what was sent and searched, keeping the last
// maxStop-1 searched bytes that a later match may start in. A long stream
// then keeps only a step's worth of text instead of all of it.
func (j *job) compact() {
	drop := j.sent
	if len(j.req.stops) > 0 {
		drop = min(drop, max(0, j.checked-(j.maxStop-1)))
	}
	if drop <= 0 {
		return
	}
	n := copy(j.text, j.text[drop:])
	j.text = j.text[:n]
	j.sent -= drop
	if len(j.req.stops) > 0 {
		j.checked -= drop
	}
}

// responseRole is the role a chat answer is given: the assistant's, or
// with add_generation_prompt false the last message's, as vLLM's
// get_chat_request_role gives it.
func (j *job) responseRole() string {
	if j.role == "" {
		return "assistant"
	}
	return j.role
}

// usage is the running usage of a chunk when the request asked for
// stream_options.continuous_usage_stats (with include_usage), as vLLM
// reports it: the prompt's tokens and the completion tokens so far; nil
// otherwise.
func (j *job) usage(completion int) *openai.ChunkUsage {
	so := j.req.StreamOptions
	if so == nil || !so.IncludeUsage || !so.ContinuousUsageStats {
		return nil
	}
	return &openai.ChunkUsage{PromptTokens: len(j.prompt), CompletionTokens: completion}
}
