package disagg

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/emulator"
	"github.com/kvroute/kvroute/emulator/emulatortest"
)

// engineCall is one request an emulated data-parallel server received.
type engineCall struct {
	path, rank, id string // rank: the X-Data-Parallel-Rank header
	body           map[string]any
}

// engineLog records the requests a server receives (legs and side-channel
// pulls).
type engineLog struct {
	mu    sync.Mutex // protects calls
	calls []engineCall
}

func (l *engineLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		var m map[string]any
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber() // bootstrap_room is a 63-bit integer
		_ = d.Decode(&m)
		rank, has := r.Header[kvroute.HeaderDataParallelRank]
		c := engineCall{path: r.URL.Path, id: r.Header.Get("X-Request-Id"), body: m, rank: "none"}
		if has {
			c.rank = strings.Join(rank, ",")
		}
		l.mu.Lock()
		l.calls = append(l.calls, c)
		l.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// legs returns the generation requests for client request id (whose legs
// carry X-Request-Id id.<suffix>) and every side-channel pull.
func (l *engineLog) legs(id string) (legs, pulls []engineCall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.calls {
		switch {
		case c.path == "/internal/kv/pull":
			pulls = append(pulls, c)
		case strings.HasPrefix(c.id, id+"."):
			legs = append(legs, c)
		}
	}
	return legs, pulls
}

// dpServer starts a data-parallel emulated server of two ranks in role.
func dpServer(t *testing.T, role kvroute.Role, proto string) (*emulator.DP, string, *engineLog) {
	t.Helper()
	l := &engineLog{}
	d, hs := emulatortest.StartDP(t, emulator.Config{Model: "tiny", Role: role, PDProtocol: proto,
		LoadFailure: emulator.LoadFailureFail, BootstrapWait: 2 * time.Second}, 2, l.wrap) // a pull from the wrong rank fails in 2s
	return d, hs.URL, l
}

// dpRanks returns the router endpoints of the two ranks of server u (its
// port is its SGLang bootstrap port).
func dpRanks(t *testing.T, id, u string, role kvroute.Role) []kvroute.Endpoint {
	_, port := hostPort(t, u)
	var out []kvroute.Endpoint
	for r := range 2 {
		e := endpoint(kvroute.DataParallelID(id, r), u, role, LabelBootstrapPort, strconv.Itoa(port))
		e.DataParallelSize, e.DataParallelRank = 2, r
		out = append(out, e)
	}
	return out
}

// TestPDDataParallelEndToEnd runs P/D requests between a two-rank prefill
// server and a two-rank decode server (vLLM --data-parallel-size 2 on both
// sides): every prefill leg is pinned to the prefill rank the router
// chose, every decode leg to the decode rank, and the decode rank pulls
// the KV from the prefill rank that holds it. The emulated servers answer
// a pull from another rank as vLLM does (engine ID mismatch, or no KV
// held) and fail the request (LoadFailureFail), so a wrong rank shows as a
// failed leg and a second placement.
func TestPDDataParallelEndToEnd(t *testing.T) {
	for _, proto := range []string{ProtocolNixl, ProtocolSGLang} {
		t.Run(proto, func(t *testing.T) {
			p, pURL, plog := dpServer(t, kvroute.RolePrefill, proto)
			_, dURL, dlog := dpServer(t, kvroute.RoleDecode, proto)
			eps := append(dpRanks(t, "p", pURL, kvroute.RolePrefill), dpRanks(t, "d", dURL, kvroute.RoleDecode)...)
			f := newPD(t, proto, ModeAlways, eps...)

			const n = 8
			type answer struct {
				code          int
				body, decoder string
			}
			answers := make([]answer, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() { // concurrent, so that both ranks of each server take legs
					body := fmt.Sprintf(`{"model":"tiny","prompt":"request %d: %s","max_tokens":3}`, i, prompt)
					code, b, dec := f.postH(t, body, "X-Request-Id", "c"+strconv.Itoa(i))
					answers[i] = answer{code, b, dec}
				})
			}
			wg.Wait()

			decisions := f.r.Decisions(0)
			used := map[string]bool{}
			for i, a := range answers {
				id := "c" + strconv.Itoa(i)
				if a.code != http.StatusOK {
					t.Errorf("%s: got %d %s", id, a.code, a.body)
					continue
				}
				var prefill string // the endpoint the plan chose (the request's first decision)
				for _, d := range decisions {
					if d.RequestID == id {
						prefill = d.Decision.Endpoint // newest first: the last one seen is the first made
					}
				}
				pl, _ := plog.legs(id)
				dl, _ := dlog.legs(id)
				if len(pl) != 1 || len(dl) != 1 {
					t.Errorf("%s: got %d prefill and %d decode legs, want 1 and 1 (a second placement means a failed leg)", id, len(pl), len(dl))
					continue
				}
				prank, drank := strings.TrimPrefix(prefill, "p#dp"), strings.TrimPrefix(a.decoder, "d#dp")
				used[prefill], used[a.decoder] = true, true
				if !strings.HasPrefix(prefill, "p#dp") || pl[0].rank != prank {
					t.Errorf("%s: prefill leg's %s: got %q, want %q (the rank of %s)", id, kvroute.HeaderDataParallelRank, pl[0].rank, prank, prefill)
				}
				if !strings.HasPrefix(a.decoder, "d#dp") || dl[0].rank != drank {
					t.Errorf("%s: decode leg's %s: got %q, want %q (the rank of %s)", id, kvroute.HeaderDataParallelRank, dl[0].rank, drank, a.decoder)
				}
				k, _ := strconv.Atoi(prank)
				switch proto {
				case ProtocolNixl:
					// vLLM's prefill rank names its own engine (<id>_dp<rank>): the
					// decode rank's handshake expects it.
					kv, _ := dl[0].body["kv_transfer_params"].(map[string]any)
					if kv["remote_engine_id"] != p.Rank(k).EngineID() {
						t.Errorf("%s: decode leg's remote_engine_id: got %v, want %s (prefill rank %d's)", id, kv["remote_engine_id"], p.Rank(k).EngineID(), k)
					}
				case ProtocolSGLang:
					// SGLang's decode reads the prefill DP group bootstrap_room % size.
					room, err := strconv.ParseUint(fmt.Sprint(dl[0].body["bootstrap_room"]), 10, 64)
					if err != nil || int(room%2) != k || pl[0].body["bootstrap_room"] != dl[0].body["bootstrap_room"] {
						t.Errorf("%s: bootstrap_room: got %v (prefill leg %v), want one whose remainder mod 2 is prefill rank %d",
							id, dl[0].body["bootstrap_room"], pl[0].body["bootstrap_room"], k)
					}
				}
			}
			// The prefill server saw one pull per request, each from the rank
			// that holds its KV (the ranks answer for themselves: a pull from
			// another fails the decode leg, which the leg counts above catch).
			if _, pulls := plog.legs(""); len(pulls) != n {
				t.Errorf("pulls: got %d, want %d", len(pulls), n)
			}
			if got := counter(t, f.h.cfg.Metrics.decisions, "tiny", "disaggregated", "always"); got != n {
				t.Errorf("decisions: got %v disaggregated, want %d", got, n)
			}
			if strings.Contains(f.logs.String(), "level=WARN") || strings.Contains(f.logs.String(), "level=ERROR") {
				t.Errorf("logs: %s", f.logs.String())
			}
			t.Logf("endpoints used: %v", used)
		})
	}
}

// TestRankRoom: an SGLang room for a data-parallel prefill rank has the
// rank for its remainder modulo the rank count, and so does every item's
// room of a batch; a plain endpoint's room is the one drawn.
func TestRankRoom(t *testing.T) {
	e := endpoint("p#dp2", "http://p:1", kvroute.RolePrefill)
	e.DataParallelSize, e.DataParallelRank = 4, 2
	for _, room := range []uint64{0, 1, 3, 5, 6, 1<<63 - 1, 1<<62 + 1} {
		r := rankRoom(room, &e)
		if r%4 != 2 || r >= 1<<62+4 {
			t.Errorf("room %d: got %d (mod 4 = %d), want a room below 1<<62+4 with remainder 2", room, r, r%4)
		}
	}
	plain := endpoint("p", "http://p:1", kvroute.RolePrefill)
	if got := rankRoom(1<<63-1, &plain); got != 1<<63-1 {
		t.Errorf("a plain endpoint: got %d, want the room drawn", got)
	}
	b, err := sglangBody([]byte(`{"model":"m","prompt":["a","b","c"]}`), "h", 1, rankRoom(1<<62-1, &e), 4)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		BootstrapRoom []uint64 `json:"bootstrap_room"`
	}
	if err := json.Unmarshal(b, &m); err != nil || len(m.BootstrapRoom) != 3 {
		t.Fatalf("got %s (%v)", b, err)
	}
	for i, r := range m.BootstrapRoom {
		if r%4 != 2 || r >= 1<<63 {
			t.Errorf("item %d's room: got %d, want remainder 2 mod 4 and below 1<<63", i, r)
		}
	}
}
