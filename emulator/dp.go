package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/openai"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// DP is a data-parallel engine: Size engine cores (Servers, ranks 0 to
// Size-1), each with its own engine model, KV cache, loop and KV-event
// publisher, behind one HTTP endpoint, as vLLM serves --data-parallel-size
// N with its internal load balancer. Create it with NewDP, serve Handler
// and drive it with Run. It is safe for concurrent use.
//
// A generation request is validated once (by rank 0's handler, which
// tokenizes for all ranks as vLLM's API server does) and then runs on one
// rank: the one its X-data-parallel-rank header names, or else the one
// vLLM's DPLBAsyncMPClient would pick (see pick). /metrics has every rank's
// series, each labelled engine="<rank>"; /health answers for all ranks;
// /v1/models, /version, /tokenize and /detokenize are rank 0's; /reset_prefix_cache
// resets every rank; the P/D side channel finds the rank holding the
// lease. With Size 1 a DP is exactly its one Server.
type DP struct {
	ranks []*Server
	mux   *http.ServeMux // the routes other than the generation endpoints

	mu sync.Mutex // protects the balancer's state below
	// lb is each rank's [waiting, running, KV usage] as the front end last
	// saw them (vLLM's lb_engines): refreshed from the ranks' published
	// stats at most every lbRefresh, the waiting count raised at each pick
	// in between.
	lb        []lbCounts
	refreshed time.Time
	inflight  []int // per rank: requests handed to it and not yet finished
	start     int   // where the next pick's scan starts (eng_start_index)
}

// lbCounts is one rank's load as the balancer sees it.
type lbCounts struct {
	waiting, running int
	kvUsage          float64
}

// lbRefresh is how often vLLM's DP coordinator publishes the engines'
// request counts to the front end (min_stats_update_interval_ms).
const lbRefresh = 100 * time.Millisecond

// HeaderDataParallelRank is the request header that pins a request to a
// data-parallel rank (vLLM's X-data-parallel-rank; names are
// case-insensitive): the one the router sends.
const HeaderDataParallelRank = kvroute.HeaderDataParallelRank

// NewDP builds a data-parallel engine of size ranks, each configured by cfg
// with DataParallelRank set to its rank (cfg.DataParallelRank must be 0)
// and, when size > 1, EngineID suffixed with _dp<rank> (vLLM suffixes the
// KV connector's engine_id so, in vllm/v1/engine/core.py). size > 1 needs
// a vLLM metrics flavour (SGLang's and llama.cpp's /metrics have no engine
// label). Every Role is allowed: the ranks of a prefill or decode server
// each hold and pull their own KV (see DP.handlePull).
func NewDP(cfg Config, size int) (*DP, error) {
	switch {
	case size < 1:
		return nil, fmt.Errorf("emulator: data parallel size %d must be at least 1", size)
	case cfg.DataParallelRank != 0:
		return nil, errors.New("emulator: NewDP sets DataParallelRank; leave it 0")
	}
	if size > 1 {
		if cfg.LoRA.Enable {
			// vLLM's PrometheusStatLogger refuses it.
			return nil, fmt.Errorf("emulator: LoRA with data parallel size %d (vLLM: LoRA in DP mode is not supported yet)", size)
		}
		switch cfg.MetricsFlavor {
		case "", FlavorVLLM, FlavorVLLMLegacy:
		default:
			return nil, fmt.Errorf("emulator: data parallel size %d needs the %s or %s metrics flavour, not %q",
				size, FlavorVLLM, FlavorVLLMLegacy, cfg.MetricsFlavor)
		}
		if cfg.EngineID == "" {
			cfg.EngineID = newUUID()
		}
	}
	// Every rank's endpoints are valid before any rank binds its own.
	for _, ep := range []string{cfg.KVEvents.Endpoint, cfg.KVEvents.ReplayEndpoint} {
		if _, err := offsetEndpoint(ep, size-1); err != nil {
			return nil, err
		}
	}
	d := &DP{ranks: make([]*Server, size), lb: make([]lbCounts, size), inflight: make([]int, size)}
	for k := range d.ranks {
		c := cfg
		c.DataParallelRank = k
		if size > 1 {
			c.EngineID = cfg.EngineID + "_dp" + strconv.Itoa(k)
		}
		s, err := New(c)
		if err != nil {
			for _, s := range d.ranks[:k] {
				s.Close() // release the KV-event sockets New bound
			}
			return nil, err
		}
		d.ranks[k] = s
	}
	if size == 1 {
		return d, nil
	}
	front := d.ranks[0]
	front.dp = d
	d.mux = http.NewServeMux()
	d.mux.HandleFunc("GET /metrics", d.handleMetrics)
	d.mux.HandleFunc("GET /health", d.handleHealth)
	d.mux.HandleFunc("GET /v1/models", front.handleModels)
	d.mux.HandleFunc("POST /internal/kv/pull", d.handlePull)
	d.mux.HandleFunc("POST /reset_prefix_cache", d.handleResetPrefixCache)
	d.mux.HandleFunc("POST /tokenize", front.handleTokenize)
	d.mux.HandleFunc("POST /detokenize", front.handleDetokenize)
	d.mux.HandleFunc("GET /version", front.handleVersion)
	d.mux.HandleFunc("/", front.handleNotFound)
	return d, nil
}

// Size is the number of ranks.
func (d *DP) Size() int { return len(d.ranks) }

// Rank returns the engine core of rank k.
func (d *DP) Rank(k int) *Server { return d.ranks[k] }

// Profile returns the effective engine profile (every rank's).
func (d *DP) Profile() engine.Profile { return d.ranks[0].Profile() }

// EngineID returns rank 0's remote_engine_id.
func (d *DP) EngineID() string { return d.ranks[0].EngineID() }

// SetAdvertise sets every rank's side-channel address (Server.SetAdvertise);
// Rank(k).SetAdvertise then gives a rank its own port.
func (d *DP) SetAdvertise(host string, port int) {
	for _, s := range d.ranks {
		s.SetAdvertise(host, port)
	}
}

// Handler returns the HTTP handler of the whole server.
func (d *DP) Handler() http.Handler {
	if len(d.ranks) == 1 {
		return d.ranks[0].Handler()
	}
	return http.HandlerFunc(d.route)
}

// SideChannelHandler serves only the P/D side channel (see
// Server.SideChannelHandler).
func (d *DP) SideChannelHandler() http.Handler {
	if len(d.ranks) == 1 {
		return d.ranks[0].SideChannelHandler()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/kv/pull", d.handlePull)
	mux.HandleFunc("/", d.ranks[0].handleNotFound)
	return mux
}

// route is Server.route for the whole server: the generation endpoints
// go to rank 0's handlers, which hand the request on after validating it.
func (d *DP) route(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		switch r.URL.EscapedPath() {
		case "/v1/chat/completions":
			r.Pattern = patChat
			d.ranks[0].handleChat(w, r)
			return
		case "/v1/completions":
			r.Pattern = patCompletions
			d.ranks[0].handleCompletions(w, r)
			return
		}
	}
	d.mux.ServeHTTP(w, r)
}

// Run runs every rank's loop (Server.Run) until ctx is cancelled or Close
// is called, and returns when all have returned. A rank that fails stops
// the others; the error names its rank.
func (d *DP) Run(ctx context.Context) error {
	if len(d.ranks) == 1 {
		return d.ranks[0].Run(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(d.ranks))
	var wg sync.WaitGroup
	for k, s := range d.ranks {
		wg.Go(func() {
			if err := s.Run(ctx); err != nil {
				errs[k] = fmt.Errorf("data parallel rank %d: %w", k, err)
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Close stops every rank (Server.Close) and waits for Run to return.
func (d *DP) Close() error {
	var errs []error
	for _, s := range d.ranks {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// pick chooses the rank of a validated generation request: the one its
// X-data-parallel-rank header names (a value that is not an integer is
// ignored, one out of range is vLLM's 400 error), else the one vLLM's
// DPLBAsyncMPClient.get_core_engine_for_request picks. The rank's
// in-flight count is raised; release lowers it when the request is over.
//
// The balancer scans the ranks from a start index that moves on by one at
// every pick (ties go round robin) and takes the first of the lowest
// score: max(its own in-flight count, waiting + running as last seen),
// plus waiting x 6 x max(0, KV usage - 0.5) when requests wait. It then
// counts the request as waiting on the chosen rank until the next refresh
// of the counts from the ranks' stats, at most every lbRefresh (vLLM's
// coordinator publishes them every 100 ms).
func (d *DP) pick(h http.Header) (int, *apiError) {
	n := len(d.ranks)
	if k, pinned, aerr := headerRank(h.Get(HeaderDataParallelRank), n); aerr != nil {
		return 0, aerr
	} else if pinned {
		d.mu.Lock()
		d.inflight[k]++
		d.mu.Unlock()
		return k, nil
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.refreshed.IsZero() || now.Sub(d.refreshed) >= lbRefresh {
		for k, s := range d.ranks {
			st := &s.metrics.stats().st
			d.lb[k] = lbCounts{waiting: st.Waiting, running: st.Running, kvUsage: st.KVUsage}
		}
		d.refreshed = now
	}
	best, bestScore := 0, math.Inf(1)
	for i := range n {
		k := (d.start + i) % n
		c := d.lb[k]
		score := float64(max(d.inflight[k], c.waiting+c.running))
		if c.waiting > 0 {
			score += float64(c.waiting) * 6 * max(0, c.kvUsage-0.5)
		}
		if score < bestScore {
			best, bestScore = k, score
		}
	}
	d.lb[best].waiting++
	d.start = (d.start + 1) % n
	d.inflight[best]++
	return best, nil
}

// release ends a request pick handed to rank k.
func (d *DP) release(k int) {
	d.mu.Lock()
	d.inflight[k]--
	d.mu.Unlock()
}

// headerRank reads an X-data-parallel-rank value v for a server of n
// ranks: the rank it pins the request to, none (pinned false) when v is
// not an integer (vLLM ignores it), or vLLM's error when it is out of
// range. A single engine (n 1) checks the header too, as vLLM does.
func headerRank(v string, n int) (k int, pinned bool, aerr *apiError) {
	digits, neg, ok := parseRank(v)
	if !ok {
		return 0, false, nil
	}
	k, inRange := rankIndex(digits, neg, n)
	if !inRange {
		if neg {
			digits = "-" + digits
		}
		return 0, false, &apiError{status: http.StatusBadRequest,
			msg: fmt.Sprintf("data_parallel_rank %s is out of range [0, %d).", digits, n)}
	}
	return k, true, nil
}

// parseRank reads an X-data-parallel-rank value as Python's int() reads a
// string (vLLM's _get_data_parallel_rank; Starlette decodes header values
// as Latin-1): surrounding whitespace, an optional sign, decimal digits
// with single underscores between them. It returns the digits without
// leading zeros or underscores ("0" for zero, which is never negative),
// the sign, and false for anything int() rejects.
func parseRank(v string) (digits string, neg, ok bool) {
	isSpace := func(c byte) bool {
		// str.isspace over Latin-1: \t\n\v\f\r, \x1c-\x1f, space, NEL, NBSP.
		return c == ' ' || c >= '\t' && c <= '\r' || c >= 0x1c && c <= 0x1f || c == 0x85 || c == 0xa0
	}
	i, j := 0, len(v)
	for i < j && isSpace(v[i]) {
		i++
	}
	for j > i && isSpace(v[j-1]) {
		j--
	}
	v = v[i:j]
	if v != "" && (v[0] == '+' || v[0] == '-') {
		neg = v[0] == '-'
		v = v[1:]
	}
	if v == "" {
		return "", false, false
	}
	var b []byte
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= '0' && c <= '9':
			if len(b) > 0 || c != '0' {
				b = append(b, c)
			}
		case c == '_' && i > 0 && i < len(v)-1 && v[i-1] != '_' && v[i+1] >= '0' && v[i+1] <= '9':
		default:
			return "", false, false
		}
	}
	if len(b) == 0 {
		return "0", false, true
	}
	return string(b), neg, true
}

// rankIndex is the rank digits (parseRank's) name among n ranks.
func rankIndex(digits string, neg bool, n int) (int, bool) {
	if neg || len(digits) > 9 {
		return 0, false
	}
	k, err := strconv.Atoi(digits)
	return k, err == nil && k < n
}

// writeRankError answers a request whose rank is out of range as vLLM
// does: its engine client raises the error when the response's generator
// first runs, so a whole response is the 400 error and a stream is a 200
// whose one event is the error, then [DONE].
func writeRankError(w http.ResponseWriter, stream bool, e *apiError) {
	if !stream {
		writeAPIError(w, e)
		return
	}
	openai.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openai.AppendErrorEvent(nil, e.kvError()))
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// handleMetrics writes every rank's metrics as one page: one family per
// name, with the ranks' series in rank order (each labelled with its
// engine), as vLLM's PrometheusStatLogger registers a child per engine.
func (d *DP) handleMetrics(w http.ResponseWriter, r *http.Request) {
	var merged []*dto.MetricFamily
	byName := map[string]*dto.MetricFamily{}
	for _, s := range d.ranks {
		s.syncStats(r.Context())
		mfs, err := s.metrics.gather()
		if err != nil {
			writeError(w, http.StatusInternalServerError, "gather metrics: "+err.Error())
			return
		}
		for _, mf := range mfs {
			if m := byName[mf.GetName()]; m != nil {
				m.Metric = append(m.Metric, mf.Metric...)
				continue
			}
			byName[mf.GetName()] = mf
			merged = append(merged, mf)
		}
	}
	slices.SortFunc(merged, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range merged {
		if err := enc.Encode(mf); err != nil {
			writeError(w, http.StatusInternalServerError, "encode metrics: "+err.Error())
			return
		}
	}
	w.Header().Set("Content-Type", contentTypeMetrics)
	_, _ = w.Write(buf.Bytes())
}

// handleHealth is 200 while every rank's loop runs, else vLLM's bare 503
// (its engine client is dead when any engine core is).
func (d *DP) handleHealth(w http.ResponseWriter, r *http.Request) {
	for _, s := range d.ranks {
		if s.isStopped() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

// handleResetPrefixCache resets every rank's prefix cache and answers with
// rank 0's result, as vLLM's DP client calls the utility on every engine
// core and returns the first one's result.
func (d *DP) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	results := make([]chan bool, len(d.ranks))
	for k, s := range d.ranks {
		results[k] = make(chan bool, 1)
		if err := s.post(command{kind: cmdReset, done: results[k]}); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	var first bool
	for k, s := range d.ranks {
		select {
		case ok := <-results[k]:
			if k == 0 {
				first = ok
			}
		case <-s.done:
			writeError(w, http.StatusServiceUnavailable, ErrStopped.Error())
			return
		case <-r.Context().Done():
			return
		}
	}
	if !first {
		writeError(w, http.StatusConflict, "prefix cache not reset: blocks are in use by running requests")
		return
	}
	w.WriteHeader(http.StatusOK)
}

// handlePull hands a side-channel pull to the rank it names, as the
// engines find a data-parallel rank's KV:
//
//   - NIXL form with remote_engine_id (what vLLM's decode side expects of
//     the handshake, from the prefill's kv_transfer_params): the rank with
//     that engine ID. vLLM gives each rank its own side-channel port and
//     engine ID <id>_dp<rank> and fails the handshake with "Remote NIXL
//     agent engine ID mismatch" when the agent answering is another. A
//     rank's own port serves only that rank (Rank(k).SideChannelHandler,
//     as `kvroute engine --side-channel-listen` serves it); this shared
//     one finds the rank, and an ID no rank has is answered by rank 0
//     with that mismatch.
//   - SGLang form: rank bootstrap_room modulo the rank count, the DP group
//     an SGLang decode engine not told the prefill's rank reads from.
//   - NIXL form without remote_engine_id (older callers): the rank that
//     holds the lease, rank 0 when none does.
//
// A rank that does not hold the lease answers as a plain engine does: no
// held KV (so a pull from the wrong rank fails, and the decode engine
// follows its LoadFailure).
func (d *DP) handlePull(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "kv pull: "+err.Error())
		return
	}
	var pr PullRequest
	_ = json.Unmarshal(body, &pr)
	s := d.ranks[0]
	switch {
	case pr.RemoteRequestID != "" && pr.RemoteEngineID != "":
		for _, rs := range d.ranks {
			if rs.cfg.EngineID == pr.RemoteEngineID {
				s = rs
				break
			}
		}
	case pr.RemoteRequestID != "":
		key := reqKey(pr.RemoteRequestID)
		for _, rs := range d.ranks {
			rs.leases.mu.Lock()
			held := rs.leases.m[key] != nil
			rs.leases.mu.Unlock()
			if held {
				s = rs
				break
			}
		}
	case pr.BootstrapRoom != nil:
		s = d.ranks[*pr.BootstrapRoom%uint64(len(d.ranks))]
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.handlePull(w, r)
}
