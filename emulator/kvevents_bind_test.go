package emulator

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/tokenizer"
)

// TestKVEventsBoundByNew: New binds the KV-event sockets, so a subscriber
// that connects as soon as the engine can serve (before Run has even
// started) gets the events of the first request, and the replay socket
// answers. They were bound by Run, in a goroutine of its own that could
// come after the first requests: a router that dialled on the engine's
// first /health found nothing to connect to, retried 500 ms later, and the
// first request's BlockStored (the roots of every later block) went to
// nobody, so its index dropped every later block as an orphan.
func TestKVEventsBoundByNew(t *testing.T) {
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)
	toks := tokenizer.Builtin().Encode(prompt)
	wantHashes := kvindex.HashTokens(toks, 16, nil)
	for _, tc := range []struct{ name, endpoint string }{
		{"tcp", fmt.Sprintf("tcp://*:%d", freeport.Consecutive(t, 1))},
		{"ipc", "ipc://" + filepath.Join(t.TempDir(), "kv.sock")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			replay := fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
			cfg := Config{Speed: 1000, KVEvents: KVEventsConfig{Endpoint: tc.endpoint, ReplayEndpoint: replay}}
			testDefaults(t, &cfg)
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()

			// Dialled once, without retries: the sockets must be bound now.
			sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0))
			defer sub.Close()
			if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
				t.Fatal(err)
			}
			if err := sub.Dial(strings.Replace(tc.endpoint, "*", "127.0.0.1", 1)); err != nil {
				t.Fatalf("KV-event PUB socket not bound when New returned: %v", err)
			}
			dealer := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0))
			defer dealer.Close()
			if err := dealer.Dial(replay); err != nil {
				t.Fatalf("replay socket not bound when New returned: %v", err)
			}
			// The subscription reaches the PUB socket asynchronously (ZMQ's
			// slow joiner, the same with vLLM): wait until it has.
			waitSubscribed(t, s)

			hs := httptest.NewServer(s.Handler())
			runUntilCleanup(t, hs, s.Run)
			if code, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, prompt)); code != 200 {
				t.Fatalf("got %d %s", code, body)
			}
			m, err := sub.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				t.Fatalf("got frames %q, want [topic, seq, payload]", m.Frames)
			}
			if seq := binary.BigEndian.Uint64(m.Frames[1]); seq != 0 {
				t.Errorf("got first seq %d, want 0", seq)
			}
			_, evs := decodeBatch(t, m.Frames[2], EncodingArray)
			if len(evs) == 0 || evs[0].Type != "BlockStored" || evs[0].Parent != nil || len(evs[0].Hashes) == 0 {
				t.Fatalf("got events %+v, want the first block's BlockStored with no parent", evs)
			}
			if n := min(len(evs[0].Hashes), len(wantHashes)); !reflect.DeepEqual(evs[0].Hashes[:n], wantHashes[:n]) {
				t.Errorf("got hashes %v, want %v", evs[0].Hashes[:n], wantHashes[:n])
			}

			// The replay socket serves the same batch.
			var start [8]byte
			if err := dealer.Send(zmq4.NewMsgFrom(nil, start[:])); err != nil {
				t.Fatal(err)
			}
			r, err := dealer.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Frames) != 3 || binary.BigEndian.Uint64(r.Frames[1]) != 0 || string(r.Frames[2]) != string(m.Frames[2]) {
				t.Errorf("replay from 0: got %q, want seq 0 and the published payload", r.Frames)
			}
		})
	}
}

// waitSubscribed waits until s's PUB socket has a subscription.
func waitSubscribed(t *testing.T, s *Server) {
	t.Helper()
	topics := s.pub.sock.(zmq4.Topics)
	for deadline := time.Now().Add(10 * time.Second); len(topics.Topics()) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the subscription never reached the PUB socket")
		}
	}
}

// zmqGoroutines returns the stacks of the goroutines running in zmq4 or
// the publisher, but for zmq4's PUB writers: zmq4 v0.17.0 never stops one
// (pubSocket.Close does not close its pubMWriter), whatever its owner does.
func zmqGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "zmq4.(*pubMWriter).run") {
			continue
		}
		if strings.Contains(g, "go-zeromq/zmq4") || strings.Contains(g, "emulator.(*publisher)") {
			gs = append(gs, g)
		}
	}
	return gs
}

// waitZMQGoroutines waits until at most want goroutines run in zmq4 or the
// publisher.
func waitZMQGoroutines(t *testing.T, want int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(zmqGoroutines()) > want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			gs := zmqGoroutines()
			t.Fatalf("got %d goroutines in zmq4 or the publisher, want at most %d:\n%s", len(gs), want, strings.Join(gs, "\n\n"))
		}
	}
}

// TestCloseWithoutRunReleasesKVEventSockets: Close releases the sockets New
// bound (or the connection it started) when Run never ran: their
// goroutines end and the endpoints can be bound again.
func TestCloseWithoutRunReleasesKVEventSockets(t *testing.T) {
	before := len(zmqGoroutines())
	pub := fmt.Sprintf("tcp://*:%d", freeport.Consecutive(t, 1))
	replay := fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
	connect := fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1)) // nobody listens: the dial retries
	for _, kv := range []KVEventsConfig{
		{Endpoint: pub, ReplayEndpoint: replay},
		{Endpoint: pub, ReplayEndpoint: replay}, // again: released
		{Endpoint: connect, ReplayEndpoint: replay},
	} {
		cfg := Config{KVEvents: kv}
		testDefaults(t, &cfg)
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Run(context.Background()); !errors.Is(err, ErrStopped) {
			t.Errorf("Run after Close: got %v, want ErrStopped", err)
		}
		waitZMQGoroutines(t, before)
	}
}

// TestNewKVEventsAddressInUse: New fails when a KV-event endpoint cannot
// be bound, with a *BindError naming it, and leaves nothing running.
func TestNewKVEventsAddressInUse(t *testing.T) {
	before := len(zmqGoroutines())
	held, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port
	heldLocal, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer heldLocal.Close()
	free := fmt.Sprintf("tcp://*:%d", freeport.Consecutive(t, 1))
	for _, tc := range []struct {
		name   string
		kv     KVEventsConfig
		want   string
		replay bool
	}{
		{"pub", KVEventsConfig{Endpoint: fmt.Sprintf("tcp://*:%d", port)}, fmt.Sprintf("tcp://*:%d", port), false},
		{"replay", KVEventsConfig{Endpoint: free, ReplayEndpoint: "tcp://" + heldLocal.Addr().String()}, "tcp://" + heldLocal.Addr().String(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{KVEvents: tc.kv}
			testDefaults(t, &cfg)
			s, err := New(cfg)
			if err == nil {
				s.Close()
				t.Fatalf("New: no error, want %s in use", tc.want)
			}
			var be *BindError
			if !errors.As(err, &be) || be.Endpoint != tc.want || be.Replay != tc.replay || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %T %v, want a *BindError for %s (replay %v)", err, err, tc.want, tc.replay)
			}
			waitZMQGoroutines(t, before)
		})
	}
}

// TestNewDPReleasesRanksOnError: when a rank's KV-event endpoint cannot be
// bound, NewDP fails and releases the sockets of the ranks it had built;
// an endpoint no rank can use fails before any rank binds.
func TestNewDPReleasesRanksOnError(t *testing.T) {
	before := len(zmqGoroutines())
	held, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	port := held.Addr().(*net.TCPAddr).Port // rank 1's
	cfg := Config{MetricsFlavor: FlavorVLLM, KVEvents: KVEventsConfig{Endpoint: fmt.Sprintf("tcp://*:%d", port-1)}}
	testDefaults(t, &cfg)
	_, err = NewDP(cfg, 2)
	var be *BindError
	if err == nil || errors.As(err, &be) && be.Endpoint == cfg.KVEvents.Endpoint {
		t.Skipf("port %d (rank 0's) is taken: %v", port-1, err)
	}
	if !errors.As(err, &be) || be.Endpoint != fmt.Sprintf("tcp://*:%d", port) {
		t.Fatalf("got %v, want a *BindError for rank 1's port %d", err, port)
	}
	waitZMQGoroutines(t, before)

	ipc := "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
	cfg.KVEvents.Endpoint = ipc
	if _, err := NewDP(cfg, 2); err == nil || !strings.Contains(err.Error(), "tcp or inproc") {
		t.Fatalf("got %v, want an error mentioning tcp or inproc", err)
	}
	s, err := New(Config{Model: "m", Engine: cfg.Engine, KVEvents: KVEventsConfig{Endpoint: ipc}})
	if err != nil {
		t.Fatalf("the endpoint NewDP refused is bound: %v", err)
	}
	s.Close()
}
