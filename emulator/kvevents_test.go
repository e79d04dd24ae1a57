package emulator

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/vmihailenco/msgpack/v5"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s: got\n%s\nwant\n%s", name, got, want)
	}
}

func TestEncodeEventBatchGolden(t *testing.T) {
	parent := uint64(1<<63 + 5)
	evs := []engine.KVEvent{
		{Kind: engine.BlockStored, BlockHashes: []uint64{1, 1 << 63}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU"},
		{Kind: engine.BlockStored, BlockHashes: []uint64{7}, ParentHash: &parent, TokenIDs: []uint32{5, 6}, BlockSize: 2},
		{Kind: engine.BlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU"},
		{Kind: engine.AllBlocksCleared},
	}
	for _, enc := range []string{EncodingArray, EncodingMap} {
		b, err := EncodeEventBatch(nil, enc, 1789095808.5, evs)
		if err != nil {
			t.Fatal(err)
		}
		var decoded any
		if err := msgpack.Unmarshal(b, &decoded); err != nil {
			t.Fatal(err)
		}
		golden(t, "events_"+enc+".golden", []byte(hex.EncodeToString(b)+"\n"+fmt.Sprintf("%v", decoded)+"\n"))
	}
}

// decodedEvent is an event decoded independently of the encoder, with
// positional and map forms normalised.
type decodedEvent struct {
	Type      string
	Hashes    []uint64
	Parent    any
	Tokens    []uint32
	BlockSize int64
	Medium    any
	// BlockStored's LoRA fields, as decoded (nil for None or absent).
	LoRAID, LoRAName, ExtraKeys any
}

func toU64(t *testing.T, v any) uint64 {
	switch x := v.(type) {
	case int8:
		return uint64(x)
	case int16:
		return uint64(x)
	case int32:
		return uint64(x)
	case int64:
		return uint64(x)
	case uint8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case uint64:
		return x
	}
	t.Fatalf("got %T %v, want an integer", v, v)
	return 0
}

func decodeBatch(t *testing.T, payload []byte, encoding string) (ts float64, evs []decodedEvent) {
	t.Helper()
	var batch []any
	if err := msgpack.Unmarshal(payload, &batch); err != nil {
		t.Fatalf("decode batch: %v", err)
	}
	if len(batch) != 3 {
		t.Fatalf("got batch of %d fields, want [ts, events, dp_rank]", len(batch))
	}
	ts, _ = batch[0].(float64)
	for _, raw := range batch[1].([]any) {
		var d decodedEvent
		var fields map[string]any
		switch encoding {
		case EncodingArray:
			a := raw.([]any)
			fields = map[string]any{"type": a[0]}
			names := map[string][]string{
				"BlockStored":  {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"},
				"BlockRemoved": {"block_hashes", "medium"},
			}[a[0].(string)]
			for i, n := range names {
				if i+1 < len(a) {
					fields[n] = a[i+1]
				}
			}
		case EncodingMap:
			fields = raw.(map[string]any)
		}
		d.Type = fields["type"].(string)
		if hs, ok := fields["block_hashes"].([]any); ok {
			for _, h := range hs {
				d.Hashes = append(d.Hashes, toU64(t, h))
			}
		}
		if p := fields["parent_block_hash"]; p != nil {
			d.Parent = toU64(t, p)
		}
		if ts, ok := fields["token_ids"].([]any); ok {
			for _, tok := range ts {
				d.Tokens = append(d.Tokens, uint32(toU64(t, tok)))
			}
		}
		if bs, ok := fields["block_size"]; ok {
			d.BlockSize = int64(toU64(t, bs))
		}
		d.Medium = fields["medium"]
		d.LoRAID, d.LoRAName, d.ExtraKeys = fields["lora_id"], fields["lora_name"], fields["extra_keys"]
		evs = append(evs, d)
	}
	return ts, evs
}

func TestKVEventsOverZMQ(t *testing.T) {
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)
	toks := tokenizer.Builtin().Encode(prompt)
	wantHashes := kvindex.HashTokens(toks, 16, nil)
	full := len(wantHashes)
	if full < 2 {
		t.Fatalf("prompt has %d full blocks, want >= 2", full)
	}
	tests := []struct {
		name, encoding string
		bind           bool // the emulator binds (ipc) rather than connects
	}{
		{"array/connect", EncodingArray, false},
		{"map/connect", EncodingMap, false},
		{"array/bind-ipc", EncodingArray, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sub := zmq4.NewSub(ctx)
			defer sub.Close()
			var endpoint string
			if tt.bind {
				endpoint = "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
			} else {
				endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
				if err := sub.Listen(endpoint); err != nil {
					t.Fatal(err)
				}
			}
			if err := sub.SetOption(zmq4.OptionSubscribe, "kv-events"); err != nil {
				t.Fatal(err)
			}
			replay := fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
			_, hs := testServer(t, Config{Speed: 1000, KVEvents: KVEventsConfig{Endpoint: endpoint, ReplayEndpoint: replay,
				Topic: "kv-events", Encoding: tt.encoding}})
			if tt.bind {
				if err := sub.Dial(endpoint); err != nil {
					t.Fatal(err)
				}
			}
			// A subscription takes effect asynchronously: send requests until
			// a message arrives (each repeat of the prompt stores nothing new,
			// so vary it).
			type msg struct {
				frames [][]byte
				err    error
			}
			got := make(chan msg, 64)
			go func() {
				for {
					m, err := sub.Recv()
					got <- msg{m.Frames, err}
					if err != nil {
						return
					}
				}
			}()
			var first msg
			for i := 0; ; i++ {
				p := fmt.Sprintf("#%d %s", i, prompt) // new blocks every time
				if i == 0 {
					p = prompt
				}
				if code, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, p)); code != 200 {
					t.Fatalf("got %d %s", code, body)
				}
				select {
				case first = <-got:
				case <-time.After(200 * time.Millisecond):
					if ctx.Err() != nil {
						t.Fatal("no KV event received")
					}
					continue
				}
				break
			}
			if first.err != nil {
				t.Fatal(first.err)
			}
			if len(first.frames) != 3 || string(first.frames[0]) != "kv-events" || len(first.frames[1]) != 8 {
				t.Fatalf("got frames %q, want [topic, 8-byte seq, payload]", first.frames)
			}
			seq := binary.BigEndian.Uint64(first.frames[1])
			_, evs := decodeBatch(t, first.frames[2], tt.encoding)
			if len(evs) == 0 || evs[0].Type != "BlockStored" {
				t.Fatalf("got events %+v, want BlockStored first", evs)
			}
			ev := evs[0]
			if ev.BlockSize != 16 || ev.Medium != "GPU" || len(ev.Tokens) != 16*len(ev.Hashes) {
				t.Errorf("got event %+v, want block_size 16, medium GPU, 16 tokens per block", ev)
			}
			if seq == 0 { // the first request's batch: compare with the router's hashes
				if ev.Parent != nil {
					t.Errorf("got parent %v, want nil for the first block", ev.Parent)
				}
				if n := min(len(ev.Hashes), full); !reflect.DeepEqual(ev.Hashes[:n], wantHashes[:n]) {
					t.Errorf("got hashes %v, want kvindex.HashTokens %v", ev.Hashes[:n], wantHashes[:n])
				}
				if !reflect.DeepEqual(ev.Tokens[:16], toks[:16]) {
					t.Errorf("got tokens %v, want %v", ev.Tokens[:16], toks[:16])
				}
			}

			// Replay from 0 with a DEALER socket: every batch up to the
			// newest, then the end marker.
			dealer := zmq4.NewDealer(ctx)
			defer dealer.Close()
			if err := dealer.Dial(replay); err != nil {
				t.Fatal(err)
			}
			var start [8]byte
			if err := dealer.Send(zmq4.NewMsgFrom(nil, start[:])); err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for {
				m, err := dealer.Recv()
				if err != nil {
					t.Fatal(err)
				}
				if len(m.Frames) != 3 || len(m.Frames[0]) != 0 {
					t.Fatalf("got replay frames %q, want [\"\", seq, payload]", m.Frames)
				}
				if int64(binary.BigEndian.Uint64(m.Frames[1])) == -1 {
					if len(m.Frames[2]) != 0 {
						t.Errorf("got end marker payload %q, want empty", m.Frames[2])
					}
					break
				}
				s := binary.BigEndian.Uint64(m.Frames[1])
				seqs = append(seqs, s)
				decodeBatch(t, m.Frames[2], tt.encoding)
			}
			if len(seqs) == 0 || seqs[0] != 0 || seqs[len(seqs)-1] < seq {
				t.Errorf("got replayed seqs %v, want 0..>=%d", seqs, seq)
			}
			for i, s := range seqs {
				if s != uint64(i) {
					t.Errorf("got replayed seqs %v, want consecutive from 0", seqs)
					break
				}
			}
		})
	}
}

// TestKVEventsSHA256Vectors runs the engine with vLLM's sha256 block hash
// and checks the published BlockStored hashes against the test vectors of
// protocols.md section 3 (tokens 1..48, block size 16, NONE_HASH seed
// "vllm-none-hash"): the emulator publishes what vLLM would.
func TestKVEventsSHA256Vectors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	hf, err := engine.NewHashFunc(engine.HashSHA256, "")
	if err != nil {
		t.Fatal(err)
	}
	ec := tinyEngine(t)
	ec.HashFunc = hf
	_, hs := testServer(t, Config{Engine: ec, KVEvents: KVEventsConfig{Endpoint: endpoint, Encoding: EncodingMap}})
	ids := make([]string, 48)
	for i := range ids {
		ids[i] = fmt.Sprint(i + 1)
	}
	body := `{"prompt":[` + strings.Join(ids, ",") + `],"max_tokens":1}`
	want := []uint64{1403909460543360175, 1643945449041937783, 17267691262617277681}
	payloads := make(chan []byte, 64)
	go func() { // forwards payloads; ends when sub is closed
		for {
			m, err := sub.Recv()
			if err != nil {
				close(payloads)
				return
			}
			payloads <- m.Frames[2]
		}
	}()
	// The subscription connects asynchronously: resend (after a reset, so
	// the blocks are stored again) until the events arrive.
	for {
		if code, b := post(t, hs.URL+"/v1/completions", body); code != 200 {
			t.Fatalf("got %d %s", code, b)
		}
		var hashes []uint64
	collect:
		for len(hashes) < len(want) {
			select {
			case p, ok := <-payloads:
				if !ok {
					t.Fatal("subscriber closed")
				}
				_, evs := decodeBatch(t, p, EncodingMap)
				for _, e := range evs {
					if e.Type == "BlockStored" {
						hashes = append(hashes, e.Hashes...)
					}
				}
			case <-time.After(200 * time.Millisecond):
				break collect
			}
		}
		if len(hashes) > 0 {
			if !reflect.DeepEqual(hashes, want) {
				t.Errorf("got BlockStored hashes %v, want vLLM's %v", hashes, want)
			}
			return
		}
		if ctx.Err() != nil {
			t.Fatal("no events")
		}
		post(t, hs.URL+"/reset_prefix_cache", "")
	}
}

// TestEncodeEvictionsOnePerBlock: the engine reports an allocation's
// evictions as one BlockRemoved of several hashes; on the wire they are one
// BlockRemoved per block, as vLLM's BlockPool emits them, in order and
// between the events around them.
func TestEncodeEvictionsOnePerBlock(t *testing.T) {
	evs := []engine.KVEvent{
		{Kind: engine.BlockRemoved, BlockHashes: []uint64{11, 12, 13}, Medium: "GPU"},
		{Kind: engine.BlockStored, BlockHashes: []uint64{7}, TokenIDs: []uint32{5, 6}, BlockSize: 2},
		{Kind: engine.BlockRemoved, BlockHashes: []uint64{14}, Medium: "GPU"},
	}
	for _, enc := range []string{EncodingArray, EncodingMap} {
		b, err := EncodeEventBatch(nil, enc, 1, evs)
		if err != nil {
			t.Fatal(err)
		}
		_, got := decodeBatch(t, b, enc)
		var kinds []string
		for _, e := range got {
			kinds = append(kinds, fmt.Sprint(e.Type, e.Hashes))
		}
		want := []string{"BlockRemoved[11]", "BlockRemoved[12]", "BlockRemoved[13]", "BlockStored[7]", "BlockRemoved[14]"}
		if !slices.Equal(kinds, want) {
			t.Errorf("%s: got events %v, want %v", enc, kinds, want)
		}
	}
}

// TestMapEventsSpecKind: in the map encoding (vLLM >= 0.26) a BlockStored
// names its KV cache group and the group's kind, as vLLM's capture shows
// ('group_idx': 0, 'kv_cache_spec_kind': 'full_attention'); a router
// follows the full-attention group by it.
func TestMapEventsSpecKind(t *testing.T) {
	b, err := EncodeEventBatch(nil, EncodingMap, 1, []engine.KVEvent{
		{Kind: engine.BlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2}})
	if err != nil {
		t.Fatal(err)
	}
	var batch []any
	if err := msgpack.Unmarshal(b, &batch); err != nil {
		t.Fatal(err)
	}
	ev := batch[1].([]any)[0].(map[string]any)
	if kind, group := ev["kv_cache_spec_kind"], ev["group_idx"]; kind != "full_attention" || group == nil || toU64(t, group) != 0 {
		t.Errorf("BlockStored: got kv_cache_spec_kind %v group_idx %v, want full_attention and 0 (%v)", kind, group, ev)
	}
}

// replayEvents returns every KV event the engine whose replay endpoint is
// replay published so far, in order, decoded from enc.
func replayEvents(t *testing.T, ctx context.Context, replay, enc string) []decodedEvent {
	t.Helper()
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial(replay); err != nil {
		t.Fatal(err)
	}
	if err := dealer.Send(zmq4.NewMsgFrom(nil, make([]byte, 8))); err != nil {
		t.Fatal(err)
	}
	var evs []decodedEvent
	for {
		m, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if int64(binary.BigEndian.Uint64(m.Frames[1])) == -1 {
			return evs
		}
		_, batch := decodeBatch(t, m.Frames[2], enc)
		evs = append(evs, batch...)
	}
}

// listeningSub binds a SUB socket on a free loopback port, which an
// engine given endpoint as its KV-event endpoint connects to (vLLM's
// rule), and picks a replay endpoint; ctx bounds the test's socket reads
// (20 s). Both end with the test.
func listeningSub(t *testing.T) (ctx context.Context, endpoint, replay string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
	replay = fmt.Sprintf("tcp://127.0.0.1:%d", freeport.Consecutive(t, 1))
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { sub.Close() })
	if err := sub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	return ctx, endpoint, replay
}
