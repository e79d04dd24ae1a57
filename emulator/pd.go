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
	"strings"
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
// by bootstrap_room, and the decode engine's pull is also the room's
// bootstrap: the prefill leg waits for it before the engine computes it
// (Server.awaitBootstrap), and the pull waits for the prefill to finish.
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
	// (SGLang: the prefill leg has not arrived, or is being computed once
	// this pull bootstrapped its room); 0 = do not wait.
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
	done        chan struct{} // closed when the lease ended (pulled, dropped, expired, replaced): end
	endOnce     sync.Once
	// The SGLang bootstrap form's room, made by its prefill leg or by the
	// decode engine's pull, whichever came first:
	booted   chan struct{} // closed when a decode engine's pull for the room arrived (boot)
	bootOnce sync.Once
	legID    string // the engine request ID of the prefill leg that waits or computes for the room; "" none yet
	gone     bool   // the pull left after it bootstrapped the room: the grant frees the blocks at once
}

func newLease() *lease {
	return &lease{ready: make(chan struct{}), done: make(chan struct{}), booted: make(chan struct{})}
}

// boot marks the room bootstrapped: its prefill leg is computed now.
func (l *lease) boot() { l.bootOnce.Do(func() { close(l.booted) }) }

// end marks the lease ended: an SGLang prefill leg waiting for it
// (Server.awaitPeer) answers.
func (l *lease) end() { l.endOnce.Do(func() { close(l.done) }) }

// leaseTable holds the prefill engine's leases, and in the SGLang form
// its rooms before the leases are granted.
type leaseTable struct {
	mu sync.Mutex // protects m, legs and the leases in them
	m  map[string]*lease
	// legs has each SGLang prefill leg's room by the leg's engine request
	// ID, from awaitBootstrap to endRoom: the grant finds its own room
	// there when another leg reused its key meanwhile.
	legs map[string]*lease
}

func roomKey(room uint64) string { return "room:" + strconv.FormatUint(room, 10) }
func reqKey(id string) string    { return "req:" + id }

// isRoomKey reports whether key names an SGLang room (roomKey).
func isRoomKey(key string) bool { return strings.HasPrefix(key, "room:") }

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
			s.pullForDecode(j, ereq, kv.RemoteHost, kv.RemotePort,
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
			j.peerBy = time.Now().Add(s.cfg.scaled(s.cfg.BootstrapTimeout))
		case kvroute.RoleDecode:
			s.pullForDecode(j, ereq, req.BootstrapHost, req.port,
				PullRequest{BootstrapRoom: req.room, WaitSeconds: s.cfg.BootstrapWait.Seconds()}, false)
		}
	}
	return nil
}

// transferTime is the real time of moving tokens' KV over the fabric to
// this (decode) engine: the bytes its ranks read
// (engine.Profile.KVTransferBytesPerToken).
func (s *Server) transferTime(tokens int) time.Duration {
	bytes := float64(tokens) * float64(s.prof.KVTransferBytesPerToken())
	d := s.cfg.TransferSetup + time.Duration(bytes*8/(s.cfg.FabricGbps*1e9)*float64(time.Second))
	return s.cfg.scaled(d)
}

// pullJob is a P/D decode leg's pull: where its KV is and how to ask for
// it (Server.awaitPull).
type pullJob struct {
	host string
	port int
	pr   PullRequest
	// nixl: vLLM's NixlConnector form; else SGLang's bootstrap form.
	nixl bool
}

// pullForDecode makes j a decode leg whose prompt KV is pulled from the
// prefill engine: the engine model admits it as any request
// (engine.Request.RemoteKV), takes its local prefix-cache hit and blocks
// for its whole prompt, and holds them, counted as waiting, while its
// handler pulls the KV (awaitPull), as vLLM's scheduler holds a
// do_remote_prefill request in WAITING_FOR_REMOTE_KVS with its blocks
// allocated until its connector received the KV, and SGLang's decode
// engine pre-allocates a request's KV before it receives it
// (DecodePreallocQueue). With NixlConnector a prompt shorter than a block
// is computed locally: vLLM moves no KV for it. SGLang moves every
// prompt's KV, a short one's partial page too (its prefill engine sends
// kv_to_page_num pages of the prompt, the last one partial), so a short
// prompt is pulled as any.
func (s *Server) pullForDecode(j *job, ereq *engine.Request, host string, port int, pr PullRequest, nixl bool) {
	if nixl && len(j.prompt) < s.prof.BlockSize {
		return
	}
	pr.EngineID = s.cfg.EngineID
	ereq.RemoteKV = true
	j.pull = &pullJob{host: host, port: port, pr: pr, nixl: nixl}
	j.st.loads = make(chan engine.KVLoad, 1)
}

// pulledTokens is how many tokens' KV the pull of a decode leg admitted
// with load moves, the transfer time's (transferTime). With NixlConnector
// the tokens past the local prefix-cache hit (get_num_new_matched_tokens
// is given the scheduler's local hit and _read_blocks reads the rest).
// With SGLang's protocol whole pages (the engine's blocks): the prefill
// engine sends kv_to_page_num of the tokens past decode_prefix_len, each
// page a whole page's bytes (the transfer engine moves kv_item_lens per
// page index), the last one partial or not. decode_prefix_len is the
// decode engine's own page-aligned prefix hit with
// Config.DisaggregationDecodeEnableRadixCache, else 0: without it
// SGLang's decode engine has no prefix cache (New), and the local hit is
// none.
func (s *Server) pulledTokens(p *pullJob, load engine.KVLoad) int {
	if p.nixl {
		return load.ExternalTokens
	}
	bs := s.prof.BlockSize
	return (load.ExternalTokens + bs - 1) / bs * bs
}

// awaitPull runs the pull of j, a decode leg added to the engine: it waits
// for the engine to admit the request (its blocks allocated:
// Server.startLoads), pulls the KV it lacks (the transfer time of
// pulledTokens) and tells the engine it arrived. A failed pull follows
// LoadFailure: the request is aborted and a 500 error written ("fail",
// vLLM's kv_load_failure_policy default), or the engine recomputes the
// prompt, with a warning ("recompute"). It reports whether the handler
// goes on to serve the request; when the client leaves it aborts the
// request (pullFor says when its blocks are freed).
func (s *Server) awaitPull(w http.ResponseWriter, r *http.Request, j *job) bool {
	ctx := r.Context()
	var load engine.KVLoad
	select {
	case load = <-j.st.loads:
	case <-j.st.ch:
		// The request ended before its admission (the engine stopped):
		// the serving path reports it.
		j.st.signal()
		return true
	case <-ctx.Done():
		s.abort(j)
		s.releaseRemote(ctx, j)
		return false
	}
	p := j.pull
	p.pr.TransferSeconds = s.transferTime(s.pulledTokens(p, load)).Seconds()
	left, err := s.pullFor(ctx, j)
	if left {
		return false
	}
	switch {
	case err == nil:
	case s.life.Err() != nil:
		return true // the engine stopped (its loop failed the stream): the serving path reports it
	case s.cfg.LoadFailure == LoadFailureFail:
		s.abortPulled(j, false)
		writeError(w, http.StatusInternalServerError, "KV transfer failed: "+err.Error())
		return false
	default:
		s.cfg.Logger.Warn("kv transfer failed, recomputing the prompt locally", "request", j.engineID, "err", err)
	}
	// If the loop stopped, the stream fails and the serving path reports
	// it.
	s.loaded(j, err == nil)
	return true
}

// pullFor runs j's pull while its client (ctx) is there, and reports
// whether the client left. With NixlConnector the request is aborted as
// soon as the client leaves, but the transfer runs to its end (the engine
// stopping ends it) and only then frees the blocks it writes into: vLLM's
// worker finishes the read, and its scheduler frees a request aborted in
// WAITING_FOR_REMOTE_KVS only when the receive is reported finished
// (finish_requests, delay_free_blocks); the prefill engine keeps its
// blocks until the pull ends. With SGLang's protocol the pull ends with
// the client: its decode scheduler frees an aborted request's KV at once
// and tells the prefill engine to stop sending (ABORT; deferred release
// is off by default).
func (s *Server) pullFor(ctx context.Context, j *job) (left bool, err error) {
	p := j.pull
	if !p.nixl {
		_, err = s.pull(ctx, p.host, p.port, p.pr)
		if ctx.Err() != nil {
			s.abortPulled(j, false)
			return true, err
		}
		return false, err
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	aborted := make(chan struct{})
	stayed := context.AfterFunc(ctx, func() { s.abort(j); close(aborted) })
	_, err = s.pull(pctx, p.host, p.port, p.pr)
	if !stayed() {
		<-aborted
		s.loaded(j, err == nil)
		return true, err
	}
	return false, err
}

// releaseRemote tells the prefill engine that j, a NixlConnector decode
// leg aborted before its transfer started, will not read its KV, so that
// the prefill engine frees the blocks it holds for it now rather than when
// their lease expires: vLLM's scheduler, finishing a request still marked
// do_remote_prefill (request_finished), has its worker send the prefill
// engine the notification of a read of no blocks. Here that is a pull of
// no transfer time, made by the handler after its client left, bounded by
// releaseWait and the server's life. SGLang's decode engine has no such
// message before its transfer starts: the prefill engine's lease expires.
func (s *Server) releaseRemote(ctx context.Context, j *job) {
	p := j.pull
	if p == nil || !p.nixl {
		return
	}
	pr := p.pr
	pr.TransferSeconds = 0
	if err := s.release(ctx, p.host, p.port, pr); err != nil {
		s.cfg.Logger.Warn("kv release: the prefill engine was not told to free the blocks of an aborted decode leg", "request", j.engineID, "err", err)
	}
}

// release makes pr, a pull of no transfer time, telling the prefill
// engine at host:port to free the blocks it holds for a decode leg that
// will not read them; bounded by releaseWait and the server's life.
func (s *Server) release(ctx context.Context, host string, port int, pr PullRequest) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseWait)
	defer cancel()
	defer context.AfterFunc(s.life, cancel)()
	_, err := s.pull(ctx, host, port, pr)
	return err
}

// owedRelease is the release a decode leg of request req owes its
// prefill engine if it is rejected before the engine takes it: a
// NixlConnector request with do_remote_prefill and remote blocks, on an
// engine that decodes; nil for any other.
func (s *Server) owedRelease(r *http.Request, req *apiRequest) *remoteRelease {
	kv := req.KVTransferParams
	if kv == nil || !kv.DoRemotePrefill || s.cfg.PDProtocol != PDNixl || !s.cfg.Role.CanDecode() {
		return nil
	}
	if ids, ok := kv.RemoteBlockIDs.([]any); !ok || len(ids) == 0 {
		return nil // nothing held (a prompt shorter than a block)
	}
	id := kv.RemoteRequestID
	if id == "" {
		id = r.Header.Get("X-Request-Id")
	}
	return &remoteRelease{ctx: r.Context(), host: kv.RemoteHost, port: kv.RemotePort,
		pr: PullRequest{RemoteRequestID: id, RemoteEngineID: kv.RemoteEngineID, EngineID: s.cfg.EngineID}}
}

// remoteRelease is where and how a rejected decode leg frees its prefill
// engine's blocks (Server.rejectedRemote).
type remoteRelease struct {
	ctx  context.Context
	host string
	port int
	pr   PullRequest
}

// rejectedRemote tells the prefill engine that a decode leg this engine
// rejected before taking it (its answer written to w: an unknown model or
// LoRA adapter's 404, a 400, the engine stopped) will never read its KV,
// so that it frees the blocks now rather than when their lease expires:
// vLLM's serving layer notifies the engine of such a rejection, and its
// NixlConnector sends the prefill engine the notification of a read of no
// blocks (vLLM PR #41269; before it the blocks waited for
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT). The answer is flushed first, so the
// client does not wait for the notification.
func (s *Server) rejectedRemote(w http.ResponseWriter, rr *remoteRelease) {
	_ = http.NewResponseController(w).Flush()
	if err := s.release(rr.ctx, rr.host, rr.port, rr.pr); err != nil {
		s.cfg.Logger.Warn("kv release: the prefill engine was not told to free the blocks of a rejected decode leg",
			"remote_request_id", rr.pr.RemoteRequestID, "err", err)
	}
}

// awaitBootstrap holds j, an SGLang prefill leg, before the engine takes
// it, until the decode engine has bootstrapped its room: SGLang's prefill
// engine keeps a request in its bootstrap queue
// (disaggregation/prefill.py, PrefillBootstrapQueue.pop_bootstrapped)
// until its KV sender's poll leaves KVPoll.Bootstrapping, which it does
// once the decode engine sent the room's destination (the prefill's
// bootstrap thread sets KVPoll.WaitingForInput when the room's transfer
// info arrived), and the decode engine sends it only once it
// pre-allocated the request's KV (decode.py,
// DecodePreallocQueue.pop_preallocated: KVReceiver.init with the page
// indices, send_metadata in newer releases); only then is the request
// put in the scheduler's waiting queue. Here the decode engine's pull,
// which it makes once its engine admitted the leg with its blocks
// (Server.awaitPull), is that message: it bootstraps the room
// (leaseTable.take), whether it comes before or after the prefill leg.
// Every leg waits, however short its prompt: SGLang puts every request of
// a prefill engine in its bootstrap queue (PrefillBootstrapQueue.add has
// no length test), and its decode engine pulls a short prompt's partial
// page as any (pullForDecode). The wait is bounded by BootstrapTimeout
// from the leg's arrival: then the leg fails with SGLang's 500, its KV sender's
// KVTransferError "Request <room> timed out after <s>s in
// KVPoll.Bootstrapping" (the decode engine never came: it refused its
// leg, for an adapter it does not serve say, and SGLang's decode engine
// tells the prefill engine nothing of a request its tokenizer manager
// refused). A client that leaves (the router cancelling the leg when the
// decode leg failed) leaves the queue at once, as SGLang aborts a request
// in its bootstrap queue; either way the engine never computed the leg.
// A leg waiting here counts in sglang:num_prefill_prealloc_queue_reqs
// (SGLang's bootstrap queue), not as running or waiting in the engine.
// It reports whether the handler goes on to add the leg to the engine:
// false when the client left (nothing to write) or with aerr to write.
// Once it returned true, the handler owes endRoom.
func (s *Server) awaitBootstrap(r *http.Request, j *job) (ok bool, aerr *apiError) {
	key := j.st.leaseKey
	t := &s.leases
	t.mu.Lock()
	l := t.m[key]
	switch {
	case l != nil && l.granted:
		// A reused room: its old lease ends (its blocks are freed, its
		// leg answers).
		l.timer.Stop()
		_ = s.post(command{kind: cmdRelease, id: l.engineReqID})
		l.end()
		l = nil
	case l != nil && l.legID != "":
		// A reused room whose leg waits, or computes: the room is this
		// leg's now; the other's bootstrap times out, or its KV is freed
		// when computed (grantLease).
		l = nil
	}
	if l == nil {
		l = newLease()
		t.m[key] = l
	}
	l.legID = j.engineID
	t.legs[j.engineID] = l
	t.mu.Unlock()
	j.room = l
	s.metrics.bootstrapping.Add(1)
	defer s.metrics.bootstrapping.Add(-1)
	tm := time.NewTimer(time.Until(j.peerBy))
	defer tm.Stop()
	select {
	case <-l.booted:
		return true, nil
	case <-r.Context().Done():
		s.endRoom(j)
		return false, nil
	case <-s.life.Done():
		return true, nil // the engine stopped: adding the leg fails
	case <-l.done: // the engine stopped (leaseTable.stopAll)
	case <-tm.C:
	}
	s.endRoom(j)
	if s.isStopped() {
		return true, nil // adding the leg fails
	}
	room := strings.TrimPrefix(key, "room:")
	waited := s.cfg.BootstrapTimeout.Seconds()
	msg := fmt.Sprintf("KVTransferError(bootstrap_room=%s): Request %s timed out after %.1fs in KVPoll.Bootstrapping", room, room, waited)
	return false, &apiError{status: http.StatusInternalServerError, msg: msg, typ: "InternalServerError", sglang: true}
}

// awaitPeer holds j, an SGLang prefill leg whose request finished, until
// the decode engine took its room's KV, as SGLang's prefill engine returns
// a request from its inflight queue only once the KV transfer ended, a
// short prompt's as any. The decode engine bootstrapped the room before the leg was computed
// (awaitBootstrap) and waits for the KV: the lease ends when it pulled
// it, or when the pull left (grantLease), or at LeaseTimeout. A client
// that leaves makes the handler return, and its endRoom frees the blocks
// at once, as SGLang aborts a request in its inflight queue. It reports
// whether the handler goes on to answer.
func (s *Server) awaitPeer(r *http.Request, j *job) bool {
	l := j.room
	if l == nil {
		return true
	}
	select {
	case <-l.done:
		return true
	case <-r.Context().Done():
		return false
	case <-s.life.Done():
		return true // the engine stopped: stopAll ended the lease
	}
}

// endRoom ends j's room, an SGLang prefill leg's, when its handler is done
// with it: the room leaves the table unless a pull took it or another leg
// reused it, the blocks of a lease granted and not pulled are freed, and a
// grant still to come frees them at once (grantLease). A pull waiting for
// the room finds no KV.
func (s *Server) endRoom(j *job) {
	l := j.room
	if l == nil {
		return
	}
	key := j.st.leaseKey
	t := &s.leases
	t.mu.Lock()
	delete(t.legs, j.engineID)
	held := false
	if t.m[key] == l {
		delete(t.m, key)
		if held = l.granted; held {
			l.timer.Stop()
		}
	}
	l.gone = true
	t.mu.Unlock()
	if held {
		_ = s.post(command{kind: cmdRelease, id: l.engineReqID})
	}
	l.end()
}

// releaseWait bounds releaseRemote's call.
const releaseWait = 5 * time.Second

// abortPulled aborts j, a decode leg whose transfer has ended (ok: its KV
// arrived): the engine reports the abort at once and frees the blocks it
// kept for the transfer (engine.Engine.Abort) when told it ended.
func (s *Server) abortPulled(j *job, ok bool) {
	s.abort(j)
	s.loaded(j, ok)
}

// loaded tells the engine that j's transfer ended (ok: its KV arrived).
// After the loop stopped it does nothing: the stream failed.
func (s *Server) loaded(j *job, ok bool) {
	_ = s.post(command{kind: cmdLoaded, id: j.engineID, ok: ok})
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
// pull_scheduler form: NixlPullConnectorScheduler.request_finished's
// fields), or nil for a request the engine ended on its one
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
		"dcp_size":          1, // no decode context parallelism
		"pp_size":           1, // profiles are tensor parallel only
		"remote_num_tokens": len(j.prompt),
		// Set by a decode engine only (for a later turn's read-back).
		"remote_blocks_expiry_time": nil,
		"transfer_mode":             "pull",
	}
}

// grantLease is called by the loop when a HoldKV request finished. With
// NixlConnector a prompt shorter than one block is not held: no decode
// engine pulls it (pullForDecode recomputes it), so its blocks are freed
// at once, as vLLM's NixlConnector frees them ("If prompt < block_size,
// no xfer so free blocks immediately"). An SGLang leg's KV is held
// whatever its length, its decode engine pulling a partial page too. An
// SGLang leg's room was made when it arrived (awaitBootstrap): when its
// leg or its pull left since, the blocks are freed at once.
func (s *Server) grantLease(st *stream, promptTokens int, blockIDs []int) {
	key := st.leaseKey
	if !isRoomKey(key) && promptTokens < s.prof.BlockSize {
		_ = s.post(command{kind: cmdRelease, id: st.id})
		return
	}
	t := &s.leases
	t.mu.Lock()
	l := t.m[key]
	if isRoomKey(key) {
		l = t.legs[st.id]
		if l == nil || t.m[key] != l || l.gone {
			// The leg left (endRoom), another leg reused the room, or
			// the pull left: nothing will take the KV.
			if l != nil && t.m[key] == l {
				delete(t.m, key)
			}
			t.mu.Unlock()
			_ = s.post(command{kind: cmdRelease, id: st.id})
			if l != nil {
				l.end()
			}
			return
		}
	} else if l != nil && l.granted { // a reused request ID: the old lease ends now
		l.timer.Stop()
		_ = s.post(command{kind: cmdRelease, id: l.engineReqID})
		l.end()
		l = nil
	}
	if l == nil {
		l = newLease()
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
	l.end()
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
	l.end()
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
		l.end()
		delete(t.m, key)
	}
	for id, l := range t.legs {
		l.end()
		delete(t.legs, id)
	}
}

// take removes and returns a granted lease, waiting up to wait for it to be
// granted. nil means missing or expired. In the SGLang form the pull also
// bootstraps the room (lease.boot): the prefill leg waiting for it is
// computed now, or, when it has not arrived yet, as soon as it does
// (awaitBootstrap); a pull that leaves before the grant leaves the room
// to its leg, whose blocks the grant then frees (lease.gone).
func (t *leaseTable) take(ctx context.Context, key string, wait time.Duration) *lease {
	t.mu.Lock()
	l := t.m[key]
	if l == nil && wait > 0 {
		l = newLease()
		t.m[key] = l
	}
	if l != nil {
		l.gone = false
		l.boot()
	}
	t.mu.Unlock()
	if l == nil {
		return nil
	}
	if wait > 0 {
		tm := time.NewTimer(wait)
		select {
		case <-l.ready:
		case <-l.done: // its leg left, or the engine stopped
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
		if l.legID == "" {
			delete(t.m, key) // our placeholder: nobody else waits on it
		} else {
			l.gone = true
		}
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
	l.end() // the transfer ended: an SGLang prefill engine answers its leg now
	body, _ := json.Marshal(PullResponse{EngineID: s.cfg.EngineID, NumTokens: l.numTokens, BlockIDs: l.blockIDs})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
