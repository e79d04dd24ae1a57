package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
)

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	s.inMu.Lock()
	stopped := s.stopped
	s.inMu.Unlock()
	if stopped {
		writeError(w, http.StatusServiceUnavailable, "engine stopped")
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	body, _ := json.Marshal(struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: s.cfg.Model, Object: "model", Created: s.created, OwnedBy: "vllm", Root: s.cfg.Model,
		MaxModelLen: s.prof.MaxModelLen}}})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

func (s *Server) handleNotFound(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
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
	req         *apiRequest
	respID      string
	engineID    string
	prompt      []uint32
	maxTokens   int
	st          *stream
	hdr         openai.ChunkHeader
	kvPrefill   bool   // P/D prefill leg: return kv_transfer_params
	remoteID    string // P/D prefill leg: remote_request_id
	maxStop     int
	text        []byte  // rendered text not yet sent; in textBuf once tokens arrive
	textBuf     *[]byte // from getBuf when the first tokens are rendered
	sent        int     // bytes of text already streamed
	checked     int     // bytes of text already searched for stop strings
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
	chunked     bool // an output was due (--stream-interval)
	chunkedAt   int  // generated tokens at the last due output
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
	putBody(bodyBuf) // parseRequest copies what it keeps
	if aerr != nil {
		writeError(w, aerr.status, aerr.msg)
		return
	}
	if req.Model != "" && req.Model != s.cfg.Model {
		writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return
	}
	j := &job{chat: chat, req: req}
	defer j.putText()
	if chat {
		var err error
		if j.prompt, err = s.encodeMessages(req.chatMessages); err != nil {
			writeError(w, http.StatusBadRequest, "chat template: "+err.Error())
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
			j.prompt = s.encodePrompt(req.promptText)
		}
		j.respID = openai.NewCompletionID()
	}
	if len(j.prompt) == 0 {
		writeError(w, http.StatusBadRequest, "The prompt cannot be empty.")
		return
	}
	if aerr := s.checkLength(j); aerr != nil {
		writeError(w, aerr.status, aerr.msg)
		return
	}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		// vLLM names the request after the header (_base_request_id), so a
		// P/D pair shares it.
		w.Header().Set("X-Request-Id", id)
		if chat {
			j.respID = "chatcmpl-" + id
		} else {
			j.respID = "cmpl-" + id
		}
	}
	j.engineID = j.respID + "-" + strconv.FormatUint(idCounter.Add(1), 36)
	j.hdr = openai.ChunkHeader{ID: j.respID, Model: s.cfg.Model, Created: time.Now().Unix()}
	for _, stop := range req.stops {
		j.maxStop = max(j.maxStop, len(stop))
	}

	ereq := &engine.Request{ID: j.engineID, Prompt: j.prompt, MaxTokens: j.maxTokens, IgnoreEOS: req.IgnoreEOS}
	seed := uint64(0)
	if req.Seed != nil {
		seed = mix64(uint64(*req.Seed)) | 1
		ereq.Seed = seed
	} else {
		seed = mix64(idCounter.Load()) ^ uint64(time.Now().UnixNano())
	}
	ereq.EOSAt = eosAt(seed, s.cfg.EOSMean)
	every := 0 // a whole response: the handler wakes when the request finished
	switch {
	case len(req.stops) > 0:
		every = 1 // stop strings are searched at every step, as vLLM's detokenizer does
	case req.Stream:
		every = s.cfg.StreamInterval
	}
	j.st = newStream(j.engineID, every, j.maxTokens)
	j.ereq = ereq
	defer j.putToks()

	if aerr := s.preparePD(r, j, ereq); aerr != nil {
		writeError(w, aerr.status, aerr.msg)
		return
	}
	if err := s.post(command{kind: cmdAdd, req: ereq, st: j.st}); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if req.Stream {
		s.serveStream(w, r, j)
		return
	}
	s.serveWhole(w, r, j)
}

// checkLength sets j.maxTokens and rejects requests that do not fit the
// context, with vLLM's message.
func (s *Server) checkLength(j *job) *apiError {
	maxLen := s.prof.MaxModelLen
	n := len(j.prompt)
	where := "prompt"
	if j.chat {
		where = "messages"
	}
	if j.req.MaxTokens != nil {
		j.maxTokens = *j.req.MaxTokens
	} else {
		j.maxTokens = min(s.cfg.DefaultMaxTokens, maxLen-n)
	}
	if n >= maxLen || n+j.maxTokens > maxLen {
		return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens "+
			"(%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
			maxLen, n+max(j.maxTokens, 0), n, where, max(j.maxTokens, 0), where)
	}
	return nil
}

// abort tells the engine the client is gone.
func (s *Server) abort(j *job) {
	j.st.aborted.Store(true)
	_ = s.post(command{kind: cmdAbort, id: j.engineID})
}

// advance takes the stream's new tokens, renders them and applies stop
// strings. It reports whether the request is over.
func (s *Server) advance(j *job) bool {
	j.prog = j.st.take(j.buf)
	p := &j.prog
	j.buf = p.toks
	if j.st.every == 0 && p.finished && p.err == nil {
		s.tokens(j)
	}
	if j.stopped {
		return true
	}
	j.generated = p.generated
	if len(p.toks) > 0 {
		if j.textBuf == nil {
			// Taken only now, not when the request arrives: a request
			// waiting for its tokens holds no text buffer, so a few buffers
			// recycled by the finishing requests serve the whole fleet.
			j.textBuf = getBuf()
			j.text = (*j.textBuf)[:0]
		}
		j.text, j.scratch = s.render(j.text, p.toks, j.scratch)
	}
	if len(j.req.stops) > 0 && len(j.text) > j.checked {
		if i, stop := stopMatch(j.text, j.checked, j.req.stops); i >= 0 {
			j.text = j.text[:i]
			j.stopped, j.finish, j.stopReason = true, openai.FinishStop, stop
			if !p.finished {
				j.st.mu.Lock()
				j.st.stopString = stop
				j.st.mu.Unlock()
				_ = s.post(command{kind: cmdAbort, id: j.engineID})
			}
			return true
		}
		j.checked = len(j.text)
	}
	if p.finished {
		j.finish = p.finishReason
	}
	return p.finished
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
		writeError(w, http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			le.MaxModelLen, le.PromptTokens+le.MaxTokens, le.PromptTokens, le.MaxTokens))
	case errors.Is(err, ErrStopped):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, j *job) {
	openai.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
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
		upto := len(j.text)
		if !done && j.maxStop > 1 {
			upto = max(j.sent, upto-(j.maxStop-1)) // hold back a possible stop-string prefix
		}
		if !done && s.codec != nil {
			upto = completeText(j.text, j.sent, upto) // and a character's first bytes
		}
		if j.chat && !j.roleWritten && (upto > j.sent || done || j.generated > 0) {
			sw.AppendData(func(b []byte) []byte { return j.usage(openai.AppendChatRoleChunk(b, &j.hdr), 0) })
			j.roleWritten = true
		}
		// --stream-interval: vLLM's output processor passes the first token
		// on at once, then every interval tokens (the loop wakes this
		// handler only then, unless stop strings are searched at every
		// step), and the last. A due output whose text is all held back
		// for stop strings sends nothing.
		due := done
		if j.generated > j.chunkedAt && (!j.chunked || j.generated-j.chunkedAt >= s.cfg.StreamInterval) {
			due = true
			j.chunked, j.chunkedAt = true, j.generated
		}
		if upto > j.sent && due || done {
			piece := bytesString(j.text[j.sent:upto]) // used before j.text changes (AppendData runs fn at once)
			j.sent = upto
			finish := ""
			var stopJSON []byte
			if done {
				finish = j.finish
				stopJSON = openai.StopReasonJSON(nil, j.stopReason, 0, false)
			}
			if j.chat {
				sw.AppendData(func(b []byte) []byte {
					return j.usage(openai.AppendChatContentChunk(b, &j.hdr, piece, finish, stopJSON), j.generated)
				})
			} else {
				sw.AppendData(func(b []byte) []byte {
					return j.usage(openai.AppendCompletionChunk(b, &j.hdr, piece, finish, stopJSON), j.generated)
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

// usage adds "usage" to the chunk just appended to b when the request asked
// for stream_options.continuous_usage_stats (with include_usage), as vLLM
// does: prompt, total and completion tokens so far, no details.
func (j *job) usage(b []byte, completion int) []byte {
	so := j.req.StreamOptions
	if so == nil || !so.IncludeUsage || !so.ContinuousUsageStats || len(b) == 0 || b[len(b)-1] != '}' {
		return b
	}
	b = append(b[:len(b)-1], `,"usage":`...)
	b = openai.AppendUsage(b, len(j.prompt), completion, -1)
	return append(b, '}')
}
