package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

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
		{[]string{"--data-parallel-size", "x"}, `invalid value "x" for flag -data-parallel-size`},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		args := append([]string{"engine", "--model", "m"}, tt.args...)
		if err := run(context.Background(), args, &out, &out); err != errUsage || !strings.Contains(out.String(), tt.want) {
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
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("engine: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("engine did not stop")
	}
}

// TestEngineDataParallelPD runs the NixlConnector handshake between a
// prefill and a decode `kvroute engine --data-parallel-size 2`, each leg
// pinned to a rank as kvroute serve pins it: the prefill rank names its
// own engine (<engine_id>_dp<r>, as vLLM does), and the decode rank pulls
// the blocks from it without a transfer failure.
func TestEngineDataParallelPD(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	side := freeAddr(t)
	pAddr, dAddr := freeAddr(t), freeAddr(t)
	pout, dout := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	pdone := engineInProcess(t, ctx, pAddr, pout, "--role", "prefill", "--data-parallel-size", "2", "--side-channel-listen", side)
	ddone := engineInProcess(t, ctx, dAddr, dout, "--role", "decode", "--data-parallel-size", "2")
	prompt := strings.Repeat("A long shared document about disaggregated serving. ", 40)
	post := func(addr string, rank int, body map[string]any) map[string]any {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(b))
		req.Header.Set("X-Data-Parallel-Rank", strconv.Itoa(rank))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("POST %s rank %d: %d %v %v", addr, rank, resp.StatusCode, out, err)
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
