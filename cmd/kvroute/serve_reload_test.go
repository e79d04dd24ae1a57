package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/syncbuf"
)

// TestServeHelperProcess is not a test: TestServeReloadsOnSIGHUP runs the
// test binary again with this test selected to get a `kvroute serve`
// process of its own, with main's signal handling, to send signals to.
func TestServeHelperProcess(t *testing.T) {
	args := os.Getenv("KVROUTE_SERVE_HELPER")
	if args == "" {
		t.Skip("helper process for TestServeReloadsOnSIGHUP")
	}
	ctx, stop := signalContext()
	err := run(ctx, strings.Split(args, "\n"), os.Stdout, os.Stderr)
	interrupted := ctx.Err() != nil
	stop()
	os.Exit(exitCode(err, interrupted, os.Stderr))
}

// serveProcess is `kvroute serve` run as a process of its own (this test
// binary as TestServeHelperProcess), killed at the end of the test unless
// it exited.
type serveProcess struct {
	cmd    *exec.Cmd
	logs   *syncbuf.Buffer // its stderr
	done   chan error      // cmd.Wait's result
	exited bool            // done was read
}

// startServeProcess starts `kvroute` with args.
func startServeProcess(t *testing.T, args ...string) *serveProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeHelperProcess$")
	cmd.Env = append(os.Environ(), "KVROUTE_SERVE_HELPER="+strings.Join(args, "\n"))
	sp := &serveProcess{cmd: cmd, logs: &syncbuf.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = sp.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { sp.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if !sp.exited {
			_ = cmd.Process.Kill()
			<-sp.done
		}
	})
	return sp
}

// TestServeReloadsOnSIGHUP: `kvroute serve --config FILE` reads the file
// again on SIGHUP and routes to the engine it adds; an invalid file then
// changes nothing and is counted as a failed reload.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	var hitsA, hitsB atomic.Int32
	engine := func(name string, hits *atomic.Int32) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"from %s","finish_reason":"stop"}]}`, name)
		}))
		t.Cleanup(s.Close)
		return s
	}
	a, b := engine("a", &hitsA), engine("b", &hitsB)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	write := func(endpoints string) {
		t.Helper()
		cfg := fmt.Sprintf(`listen: %q
models:
  - name: m
    endpoints:
%s
    policy: {name: round_robin}
    signals: {disabled: true}
health_check: {disabled: true}
timeouts: {shutdown: 2s}
`, addr, endpoints)
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("      - {id: a, url: %s}", a.URL))

	sp := startServeProcess(t, "serve", "--config", path, "--log-level", "info")
	cmd, logs := sp.cmd, sp.logs
	base := "http://" + addr
	poll := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10s; logs:\n%s", what, logs.String())
			}
		}
	}
	metric := func(series string) float64 {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(body)
		if m == nil {
			return -1
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		return v
	}
	send := func(n int) {
		t.Helper()
		for range n {
			resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":1}`))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
	}
	poll("the router serving", func() bool { return metric(`kvroute_config_reloads_total{result="success"}`) == 0 })
	send(4)
	if hitsA.Load() != 4 || hitsB.Load() != 0 {
		t.Fatalf("before the reload: a %d, b %d requests; want 4, 0", hitsA.Load(), hitsB.Load())
	}

	write(fmt.Sprintf("      - {id: a, url: %s}\n      - {id: b, url: %s}", a.URL, b.URL))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll("the reload", func() bool { return metric(`kvroute_config_reloads_total{result="success"}`) == 1 })
	send(4)
	if hitsB.Load() != 2 {
		t.Fatalf("after the reload: b got %d of 4 requests, want 2 (round robin over a and b)", hitsB.Load())
	}
	// The child's log lines reach this process through a pipe, after
	// the counter may have been read: wait for them.
	poll("an endpoints changed line naming b as added", func() bool {
		return strings.Contains(logs.String(), "endpoints changed") && strings.Contains(logs.String(), "added=[b]")
	})

	write("      - {id: c, url: ftp://nowhere}")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll("the failed reload", func() bool { return metric(`kvroute_config_reloads_total{result="failure"}`) == 1 })
	if got := metric("kvroute_config_last_reload_successful"); got != 0 {
		t.Errorf("kvroute_config_last_reload_successful: got %v, want 0", got)
	}
	poll("the error naming models[0].endpoints[0].url logged", func() bool {
		return strings.Contains(logs.String(), "models[0].endpoints[0].url")
	})
	send(2)
	if hitsA.Load()+hitsB.Load() != 10 {
		t.Errorf("after the failed reload: a %d + b %d requests, want 10", hitsA.Load(), hitsB.Load())
	}

	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-sp.done:
		sp.exited = true
		if err != nil {
			t.Fatalf("serve exited with %v; logs:\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop on SIGTERM")
	}
}

// TestServeQuickModeSIGHUP: without --config there is nothing to reload:
// a SIGHUP is logged and the router keeps serving (its default action
// would end the process).
func TestServeQuickModeSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"x","finish_reason":"stop"}]}`)
	}))
	t.Cleanup(engine.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	sp := startServeProcess(t, "serve", "--listen", addr, "--model", "m", "--endpoint", engine.URL, "--log-level", "info")
	cmd, logs := sp.cmd, sp.logs
	post := func() int {
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi"}`))
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for deadline := time.Now().Add(10 * time.Second); post() != http.StatusOK; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the router does not serve; logs:\n%s", logs.String())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "nothing to reload"); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-sp.done:
			sp.exited = true
			t.Fatalf("serve ended on SIGHUP: %v; logs:\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log of the SIGHUP; logs:\n%s", logs.String())
		}
	}
	if code := post(); code != http.StatusOK {
		t.Errorf("after the SIGHUP: status %d, want 200", code)
	}
}
