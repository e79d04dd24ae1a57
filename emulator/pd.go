package emulator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/engine"
)

// The P/D side channel. The prefill engine keeps a lease on the KV blocks
// of each finished remote-decode request; the decode engine pulls them with
// POST /internal/kv/pull, which holds the blocks for the transfer time,
// then releases them and ends the lease. A lease not pulled within
// LeaseTimeout expires and its blocks are released (vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT). In the SGLang form the lease is keyed
// by bootstrap_room and the pull waits for the prefill to finish.
//
// A decode engine whose pull fails (lease missing or expired, prefill
// engine unreachable) follows LoadFailure: fail the request with a 500
// error ("fail", the default, as vLLM's kv_load_failure_policy), or
// recompute the prompt locally with a warning ("recompute").

// PullRequest is the body of POST /internal/kv/pull.
type PullRequest struct {
	// RemoteRequestID is the prefill engine's request id
	// (kv_transfer_params.remote_request_id), NIXL form.
	RemoteRequestID string `json:"remote_request_id,omitempty"`
	// RemoteEngineID is the engine the puller expects to answer
	// (kv_transfer_params.remote_engine_id), NIXL form: another engine
	// refuses the pull, as vLLM's handshake does on an engine ID
	// mismatch. Empty: any.
	RemoteEngineID string `json:"remote_engine_id,omitempty"`
	// BootstrapRoom is the SGLang room, bootstrap form.
	BootstrapRoom *uint64 `json:"bootstrap_room,omitempty"`
	// EngineID names the pulling engine (for logs).
	EngineID string `json:"engine_id,omitempty"`
	// TransferSeconds is how long the transfer takes (real time): the
	// prefill engine keeps the blocks that long before releasing them.
	TransferSeconds float64 `json:"transfer_seconds"`
	// WaitSeconds bounds the wait for a lease that does not exist yet
	// (SGLang: the prefill is still running); 0 = do not wait.
	WaitSeconds float64 `json:"wait_seconds,omitempty"`
}

// PullResponse is the answer of a successful pull.
type PullResponse struct {
	EngineID  string `json:"engine_id"`
	NumTokens int    `json:"num_tokens"`
	BlockIDs  []int  `json:"block_ids"`
}

type lease struct {
	engineReqID string
	numTokens   int
	blockIDs    []int
	timer       *time.Timer
	granted     bool
	ready       chan struct{} // closed when granted
}

// leaseTable holds the prefill engine's leases.
type leaseTable struct {
	mu sync.Mutex // protects m and the leases in it
	m  map[string]*lease
}

func roomKey(room uint64) string { return "room:" + strconv.FormatUint(room, 10) }
func reqKey(id string) string    { return "req:" + id }

// preparePD applies the request's P/D role to the engine request.
func (s *Server) preparePD(r *http.Request, j *job, ereq *engine.Request) *apiError {
	req := j.req
	switch s.cfg.PDProtocol {
	case PDNixl:
		kv := req.KVTransferParams
		if kv == nil {
			return nil
		}
		switch {
		case kv.DoRemoteDecode && s.cfg.Role.CanPrefill():
			ereq.HoldKV, ereq.MaxTokens = true, 1
			j.maxTokens, j.st.maxTokens = 1, 1
			// The lease is named by the proxy's X-Request-Id when there is
			// one (decode engines before NixlConnector's protocol version 2,
			// vLLM PR #29665, find it by that header, without
			// remote_request_id), else by the engine's own id.
			j.remoteID = j.engineID
			if id := r.Header.Get("X-Request-Id"); id != "" {
				j.remoteID = id
			}
			j.st.holdKV, j.st.leaseKey = true, reqKey(j.remoteID)
			j.kvPrefill = true
		case kv.DoRemotePrefill && s.cfg.Role.CanDecode():
			id := kv.RemoteRequestID
			if id == "" {
				id = r.Header.Get("X-Request-Id")
			}
			return s.pullForDecode(r.Context(), j, ereq, kv.RemoteHost, kv.RemotePort,
				PullRequest{RemoteRequestID: id, RemoteEngineID: kv.RemoteEngineID}, true)
		}
	case PDSGLang:
		if req.room == nil {
			return nil
		}
		switch s.cfg.Role {
		case kvroute.RolePrefill:
			ereq.HoldKV, ereq.MaxTokens = true, 1
			j.maxTokens, j.st.maxTokens = 1, 1
			j.st.holdKV, j.st.leaseKey = true, roomKey(*req.room)
		case kvroute.RoleDecode:
			return s.pullForDecode(r.Context(), j, ereq, req.BootstrapHost, req.port,
				PullRequest{BootstrapRoom: req.room, WaitSeconds: s.cfg.BootstrapWait.Seconds()}, false)
		}
	}
	return nil
}

// transferTime is the real time of moving tokens' KV over the fabric.
func (s *Server) transferTime(tokens int) time.Duration {
	bytes := float64(tokens) * float64(s.prof.KVBytesPerToken())
	d := s.cfg.TransferSetup + time.Duration(bytes*8/(s.cfg.FabricGbps*1e9)*float64(time.Second))
	return s.cfg.scaled(d)
}

// pullForDecode pulls the prompt's KV from the prefill engine; on success
// the request skips its prefill. With local (vLLM's NixlConnector) only
// the tokens past this engine's own prefix-cache hit move: the scheduler's
// local hit (KVCacheManager.get_computed_blocks: whole blocks, never the
// last prompt token) is passed to get_num_new_matched_tokens, which asks
// the prefill engine for the rest, and _read_blocks reads only those
// blocks. The transfer time is that of the tokens moved. Until the pull
// ends the request counts as waiting in the metrics (metrics.pulling), as
// vLLM's scheduler holds it in its waiting queue while its KV arrives.
func (s *Server) pullForDecode(ctx context.Context, j *job, ereq *engine.Request, host string, port int, pr PullRequest, local bool) *apiError {
	if len(j.prompt) < s.prof.BlockSize {
		return nil // vLLM: no transfer for a prompt shorter than one block
	}
	// Until the pull ends; the handler then hands the request to the
	// model's own waiting queue.
	s.metrics.pulling.Add(1)
	defer s.metrics.pulling.Add(-1)
	hit := 0
	if local {
		var err error
		if hit, err = s.prefixHit(ctx, ereq); err != nil {
			return &apiError{status: http.StatusServiceUnavailable, msg: "kv pull: " + err.Error()}
		}
	}
	pr.EngineID = s.cfg.EngineID
	pr.TransferSeconds = s.transferTime(len(j.prompt) - hit).Seconds()
	_, err := s.pull(ctx, host, port, pr)
	if err == nil {
		ereq.SkipPrefill = true
		return nil
	}
	if s.cfg.LoadFailure == LoadFailureFail {
		return &apiError{status: http.StatusInternalServerError, msg: "KV transfer failed: " + err.Error()}
	}
	s.cfg.Logger.Warn("kv transfer failed, recomputing the prompt locally", "request", j.engineID, "err", err)
	return nil
}

// prefixHit returns the prompt tokens of r this engine's prefix cache
// holds (engine.PrefixHit, asked of the engine loop).
func (s *Server) prefixHit(ctx context.Context, r *engine.Request) (int, error) {
	hit := make(chan int, 1)
	if err := s.post(command{kind: cmdPrefixHit, req: r, hit: hit}); err != nil {
		return 0, err
	}
	select {
	case n := <-hit:
		return n, nil
	case <-s.done:
		return 0, ErrStopped
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// pull calls the prefill engine's side channel.
func (s *Server) pull(ctx context.Context, host string, port int, pr PullRequest) (PullResponse, error) {
	var out PullResponse
	if host == "" || port <= 0 {
		return out, errors.New("kv pull: no remote host/port in the request")
	}
	body, _ := json.Marshal(pr)
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/internal/kv/pull"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return out, fmt.Errorf("kv pull: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return out, fmt.Errorf("kv pull: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("kv pull: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return out, fmt.Errorf("kv pull: bad response: %w", err)
	}
	return out, nil
}

// kvTransferParams is the prefill leg's answer (NixlConnector,
// pull_scheduler form), or nil for a request the engine ended on its one
// token (EOS), whose lease ends at once: vLLM's connector hands over only
// the KV of a request its length cap ended (FINISHED_LENGTH_CAPPED) and
// frees the blocks of any other. A stop string is matched by the front
// end after the engine ended the request by its length cap: handed over.
func (s *Server) kvTransferParams(j *job) map[string]any {
	if j.prog.finishReason != engine.FinishLength {
		s.dropLease(j)
		return nil
	}
	ids := j.prog.blockIDs
	if ids == nil || len(j.prompt) < s.prof.BlockSize {
		ids = []int{} // nothing held to transfer (grantLease)
	}
	return map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_block_ids":  ids,
		"remote_engine_id":  s.cfg.EngineID,
		"remote_request_id": j.remoteID,
		"remote_host":       s.cfg.AdvertiseHost,
		"remote_port":       s.cfg.AdvertisePort,
		"tp_size":           s.prof.TP,
		"remote_num_tokens": len(j.prompt),
	}
}

// grantLease is called by the loop when a HoldKV request finished. A
// prompt shorter than one block is not held: no decode engine pulls it
// (pullForDecode recomputes it), so its blocks are freed at once, as
// vLLM's NixlConnector frees them ("If prompt < block_size, no xfer so
// free blocks immediately").
func (s *Server) grantLease(st *stream, promptTokens int, blockIDs []int) {
	if promptTokens < s.prof.BlockSize {
		_ = s.post(command{kind: cmdRelease, id: st.id})
		return
	}
	key := st.leaseKey
	t := &s.leases
	t.mu.Lock()
	l := t.m[key]
	if l != nil && l.granted { // a reused room: the old lease ends now
		l.timer.Stop()
		_ = s.post(command{kind: cmdRelease, id: l.engineReqID})
		l = nil
	}
	if l == nil {
		l = &lease{ready: make(chan struct{})}
		t.m[key] = l
	}
	l.engineReqID, l.numTokens, l.blockIDs, l.granted = st.id, promptTokens, blockIDs, true
	l.timer = time.AfterFunc(s.cfg.scaled(s.cfg.LeaseTimeout), func() { s.expire(key, l) })
	close(l.ready)
	t.mu.Unlock()
}

// dropLease frees the blocks of j's lease, if one is held for it.
func (s *Server) dropLease(j *job) {
	t := &s.leases
	t.mu.Lock()
	l := t.m[j.st.leaseKey]
	if l == nil || !l.granted || l.engineReqID != j.st.id {
		t.mu.Unlock()
		return
	}
	delete(t.m, j.st.leaseKey)
	l.timer.Stop()
	t.mu.Unlock()
	_ = s.post(command{kind: cmdRelease, id: l.engineReqID})
}

func (s *Server) expire(key string, l *lease) {
	t := &s.leases
	t.mu.Lock()
	if t.m[key] != l {
		t.mu.Unlock()
		return
	}
	delete(t.m, key)
	t.mu.Unlock()
	s.cfg.Logger.Warn("kv lease expired: releasing blocks not pulled by a decode engine", "lease", key)
	_ = s.post(command{kind: cmdRelease, id: l.engineReqID})
}

// stopAll ends every lease when the server stops: their timers are stopped
// (a timer fired up to LeaseTimeout after Close, owned by nothing), and a
// pull or a waiting take finds none.
func (t *leaseTable) stopAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, l := range t.m {
		if l.timer != nil {
			l.timer.Stop()
		}
		delete(t.m, key)
	}
}

// take removes and returns a granted lease, waiting up to wait for it to be
// granted. nil means missing or expired.
func (t *leaseTable) take(ctx context.Context, key string, wait time.Duration) *lease {
	t.mu.Lock()
	l := t.m[key]
	if l == nil && wait > 0 {
		l = &lease{ready: make(chan struct{})}
		t.m[key] = l
	}
	t.mu.Unlock()
	if l == nil {
		return nil
	}
	if wait > 0 {
		tm := time.NewTimer(wait)
		select {
		case <-l.ready:
		case <-tm.C:
		case <-ctx.Done():
		}
		tm.Stop()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[key] != l {
		return nil
	}
	if !l.granted {
		delete(t.m, key) // our placeholder: nobody else waits on it
		return nil
	}
	delete(t.m, key)
	l.timer.Stop()
	return l
}

func (s *Server) handlePull(w http.ResponseWriter, r *http.Request) {
	var pr PullRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&pr); err != nil {
		writeError(w, http.StatusBadRequest, "kv pull: "+err.Error())
		return
	}
	var key string
	switch {
	case pr.RemoteRequestID != "":
		key = reqKey(pr.RemoteRequestID)
	case pr.BootstrapRoom != nil:
		key = roomKey(*pr.BootstrapRoom)
	default:
		writeError(w, http.StatusBadRequest, "kv pull: remote_request_id or bootstrap_room required")
		return
	}
	if pr.RemoteEngineID != "" && pr.RemoteEngineID != s.cfg.EngineID {
		// vLLM's NixlConnector handshake: "Remote NIXL agent engine ID
		// mismatch" (the KV is another engine's, or another rank's).
		writeError(w, http.StatusNotFound, fmt.Sprintf("kv pull: remote engine ID mismatch: expected %s, this engine is %s",
			pr.RemoteEngineID, s.cfg.EngineID))
		return
	}
	wait := min(time.Duration(pr.WaitSeconds*float64(time.Second)), s.cfg.BootstrapWait)
	l := s.leases.take(r.Context(), key, wait)
	if l == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("kv pull: no held KV for %s (never prefilled here, already pulled, or lease expired)", key))
		return
	}
	// Hold the blocks for the transfer, then release them.
	if d := time.Duration(min(pr.TransferSeconds, 600) * float64(time.Second)); d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-r.Context().Done():
			tm.Stop()
		}
	}
	_ = s.post(command{kind: cmdRelease, id: l.engineReqID})
	body, _ := json.Marshal(PullResponse{EngineID: s.cfg.EngineID, NumTokens: l.numTokens, BlockIDs: l.blockIDs})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
