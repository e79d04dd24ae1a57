package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/freeport"
	"github.com/kvroute/kvroute/internal/syncbuf"
)

func TestEngineDataParallelUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--data-parallel-size", "0"}, "--data-parallel-size 0 must be at least 1"},
		{[]string{"--data-parallel-size", "-2"}, "--data-parallel-size -2 must be at least 1"},
		{[]string{"--data-parallel-size", "2", "--metrics-flavor", "sglang"}, "--data-parallel-size 2 needs --metrics-flavor vllm or vllm-legacy"},
		{[]string{"--data-parallel-size", "2", "--metrics-flavor", "llamacpp"}, "needs --metrics-flavor vllm or vllm-legacy"},
		{[]string{"--data-parallel-size", "2", "--kv-events-endpoint", "ipc:///tmp/kv"}, `--kv-events-endpoint "ipc:///tmp/kv": with --data-parallel-size`},
		{[]string{"--data-parallel-size", "2", "--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay", "ipc:///tmp/r"}, `--kv-events-replay "ipc:///tmp/r"`},
		{[]string{"--data-parallel-size", "2", "--kv-events-endpoint", "tcp://*:65535"}, `rank 1's port 65536 (port + rank) is out of range`},
		{[]string{"--data-parallel-size", "x"}, `invalid value "x" for flag --data-parallel-size`},
		{[]string{"--data-parallel-size", "2", "--side-channel-listen", "127.0.0.1:65535"}, `--side-channel-listen: rank 1's port 65536 (port + rank) is out of range`},
		{[]string{"--data-parallel-size", "2", "--listen", "127.0.0.1:0", "--side-channel-listen", "127.0.0.1:0", "--advertise", "h:65535"}, `--advertise: rank 1's port 65536 (port + rank) is out of range`},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		args := append([]string{"engine", "--model", "m"}, tt.args...)
		// Bounded: an engine that accepted the flags would serve until stopped.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := run(ctx, args, &out, &out)
		cancel()
		if err != errUsage || !strings.Contains(out.String(), tt.want) {
			t.Errorf("%v: got %v %q, want a usage error mentioning %q", args, err, out.String(), tt.want)
		}
	}
}

func TestEngineHelpExplainsDataParallel(t *testing.T) {
	var out bytes.Buffer
	_ = run(context.Background(), []string{"engine", "--help"}, &out, &out)
	for _, want := range []string{"-data-parallel-size", "X-data-parallel-rank", `engine="<rank>"`, "port"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// TestEngineDataParallel runs `kvroute engine --data-parallel-size 2`: a
// request pinned to rank 1 shows in rank 1's /metrics series, and the stop
// signal lets a stream in flight on rank 1 run to its end.
func TestEngineDataParallel(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncbuf.Buffer{}
	done := engineInProcess(t, ctx, addr, out, "--log-level", "info", "--data-parallel-size", "2")
	if !strings.Contains(out.String(), "data_parallel_size=2") {
		t.Errorf("the log does not give the size: %s", out.String())
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2}`))
	req.Header.Set("X-Data-Parallel-Rank", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("pinned request: got %d", resp.StatusCode)
	}
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 1`,
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 0`,
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	req, _ = http.NewRequest(http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":800,"stream":true}`))
	req.Header.Set("X-Data-Parallel-Rank", "1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	first, err := r.ReadString('\n') // the stream is in flight
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	rest, _ := io.ReadAll(r)
	body := first + string(rest)
	if strings.Contains(body, `"error"`) || !strings.Contains(body, `"finish_reason":"length"`) {
		t.Errorf("stream on rank 1 was not drained: its end %q", body[max(0, len(body)-300):])
	}
	waitStopped(t, "engine", done, 20*time.Second)
}

// TestEngineDataParallelPD runs the NixlConnector handshake between a
// prefill and a decode `kvroute engine --data-parallel-size 2`, each leg
// pinned to a rank as kvroute serve pins it: the prefill rank names its
// own engine (<engine_id>_dp<r>, as vLLM does), and the decode rank pulls
// the blocks from it without a transfer failure.
func TestEngineDataParallelPD(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dAddr := freeAddr(t)
	pout, dout := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	pAddr, _, pdone := engineOnFreePorts(t, ctx, pout, func() (string, []string) {
		// Rank r's side channel is on the given port + r.
		return freeAddr(t), []string{"--role", "prefill", "--data-parallel-size", "2", "--side-channel-listen", "127.0.0.1:" + strconv.Itoa(freeport.Consecutive(t, 2))}
	})
	ddone := engineInProcess(t, ctx, dAddr, dout, "--role", "decode", "--data-parallel-size", "2")
	prompt := strings.Repeat("A long shared document about disaggregated serving. ", 40)
	post := func(addr string, rank int, body map[string]any) map[string]any {
		t.Helper()
		code, out := postRank(t, addr, "/v1/completions", rank, body)
		if code != 200 {
			t.Fatalf("POST %s rank %d: %d %v", addr, rank, code, out)
		}
		return out
	}
	pr := post(pAddr, 1, map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true}})
	kv, _ := pr["kv_transfer_params"].(map[string]any)
	if id, _ := kv["remote_engine_id"].(string); !strings.HasSuffix(id, "_dp1") {
		t.Fatalf("prefill rank 1 named engine %v, want one ending _dp1 (kv_transfer_params %v)", kv["remote_engine_id"], kv)
	}
	dr := post(dAddr, 0, map[string]any{"model": "m", "prompt": prompt, "max_tokens": 8, "kv_transfer_params": kv})
	if usage, _ := dr["usage"].(map[string]any); usage["completion_tokens"] != float64(8) {
		t.Errorf("decode: got %v", dr)
	}
	if strings.Contains(dout.String(), "kv transfer failed") {
		t.Errorf("the decode rank's pull failed:\n%s", dout.String())
	}
	cancel()
	for _, done := range []<-chan error{pdone, ddone} {
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	}
}

// postRank posts body as JSON to http://addr+path pinned to rank (none
// when rank < 0) and returns the status and the decoded JSON answer.
func postRank(t *testing.T, addr, path string, rank int, body map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(b))
	if rank >= 0 {
		req.Header.Set("X-Data-Parallel-Rank", strconv.Itoa(rank))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestEngineDataParallelSidePorts: with --side-channel-listen and the
// NIXL protocol, rank r of a data-parallel prefill engine serves its side
// channel on the base port + r and names that port in its
// kv_transfer_params, as vLLM offsets VLLM_NIXL_SIDE_CHANNEL_PORT per rank;
// a rank's port answers only for that rank (another rank's engine id gets
// the engine ID mismatch), and the decode engine pulls through it. With
// --advertise, rank r advertises its port + r.
func TestEngineDataParallelSidePorts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dAddr, aAddr := freeAddr(t), freeAddr(t)
	pout, dout, aout := &syncbuf.Buffer{}, &syncbuf.Buffer{}, &syncbuf.Buffer{}
	pAddr, pargs, pdone := engineOnFreePorts(t, ctx, pout, func() (string, []string) {
		return freeAddr(t), []string{"--role", "prefill", "--data-parallel-size", "2", "--side-channel-listen", "127.0.0.1:" + strconv.Itoa(freeport.Consecutive(t, 2))}
	})
	side := pargs[len(pargs)-1]
	host, ps, _ := net.SplitHostPort(side)
	base, _ := strconv.Atoi(ps)
	ddone := engineInProcess(t, ctx, dAddr, dout, "--role", "decode", "--data-parallel-size", "2")
	adone := engineInProcess(t, ctx, aAddr, aout, "--role", "prefill", "--data-parallel-size", "2",
		"--side-channel-listen", "127.0.0.1:0", "--advertise", "prefill.example:9000")
	prompt := strings.Repeat("Each rank has its own side channel. ", 40)
	prefill := func(addr string, rank int) map[string]any {
		t.Helper()
		code, out := postRank(t, addr, "/v1/completions", rank, map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1,
			"kv_transfer_params": map[string]any{"do_remote_decode": true}})
		if code != 200 {
			t.Fatalf("prefill rank %d: %d %v", rank, code, out)
		}
		kv, _ := out["kv_transfer_params"].(map[string]any)
		return kv
	}
	var kvs []map[string]any
	for rank := range 2 {
		kv := prefill(pAddr, rank)
		if kv["remote_host"] != host || kv["remote_port"] != float64(base+rank) {
			t.Errorf("rank %d advertises %v:%v, want %s:%d", rank, kv["remote_host"], kv["remote_port"], host, base+rank)
		}
		kvs = append(kvs, kv)
		if kv := prefill(aAddr, rank); kv["remote_host"] != "prefill.example" || kv["remote_port"] != float64(9000+rank) {
			t.Errorf("--advertise prefill.example:9000: rank %d advertises %v:%v, want prefill.example:%d", rank, kv["remote_host"], kv["remote_port"], 9000+rank)
		}
	}
	// Rank 1's port does not serve rank 0's KV.
	code, out := postRank(t, net.JoinHostPort(host, strconv.Itoa(base+1)), "/internal/kv/pull", -1, map[string]any{
		"remote_request_id": kvs[0]["remote_request_id"], "remote_engine_id": kvs[0]["remote_engine_id"]})
	if msg, _ := out["error"].(map[string]any); code != http.StatusNotFound || !strings.Contains(fmt.Sprint(msg["message"]), "engine ID mismatch") {
		t.Errorf("rank 0's pull on rank 1's port: %d %v, want 404 engine ID mismatch", code, out)
	}
	// The decode engine pulls rank 1's KV through rank 1's port.
	code, dr := postRank(t, dAddr, "/v1/completions", 0, map[string]any{"model": "m", "prompt": prompt, "max_tokens": 8, "kv_transfer_params": kvs[1]})
	if usage, _ := dr["usage"].(map[string]any); code != 200 || usage["completion_tokens"] != float64(8) {
		t.Errorf("decode: %d %v", code, dr)
	}
	if strings.Contains(dout.String(), "kv transfer failed") {
		t.Errorf("the decode rank's pull failed:\n%s", dout.String())
	}
	cancel()
	for _, done := range []<-chan error{pdone, ddone, adone} {
		if err := <-done; err != nil {
			t.Errorf("engine: %v", err)
		}
	}
}

func TestRankAddrs(t *testing.T) {
	for _, tc := range []struct {
		addr string
		n    int
		want []string
		err  bool
	}{
		{"127.0.0.1:5600", 3, []string{"127.0.0.1:5600", "127.0.0.1:5601", "127.0.0.1:5602"}, false},
		{":0", 2, []string{":0", ":0"}, false}, // each its own free port
		{"[::1]:7000", 1, []string{"[::1]:7000"}, false},
		{"h:65535", 2, nil, true},
		{"h:x", 1, nil, true},
		{"nohostport", 1, nil, true},
	} {
		got, err := rankAddrs(tc.addr, tc.n)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("rankAddrs(%q, %d) = %v, %v; want %v (error %v)", tc.addr, tc.n, got, err, tc.want, tc.err)
		}
	}
}
