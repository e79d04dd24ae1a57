package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/syncbuf"
)

// TestExitCode: a command stopped by Ctrl-C says it was interrupted (not
// "sim: context canceled") and exits 130; a cancellation that no signal
// caused is an ordinary failure.
func TestExitCode(t *testing.T) {
	canceled := fmt.Errorf("sim: %w", context.Canceled)
	for _, tc := range []struct {
		name        string
		err         error
		interrupted bool
		code        int
		stderr      string
	}{
		{"ok", nil, false, 0, ""},
		{"help", flag.ErrHelp, false, 0, ""},
		{"usage", errUsage, false, 2, ""},
		{"failure", errors.New("sim: boom"), false, 1, "kvroute: sim: boom\n"},
		{"interrupted", canceled, true, 130, "kvroute: interrupted\n"},
		{"interrupted, other error", errors.New("sim: boom"), true, 1, "kvroute: sim: boom\n"},
		{"canceled without a signal", canceled, false, 1, "kvroute: sim: context canceled\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errb bytes.Buffer
			if got := exitCode(tc.err, tc.interrupted, &errb); got != tc.code || errb.String() != tc.stderr {
				t.Errorf("got %d, %q; want %d, %q", got, errb.String(), tc.code, tc.stderr)
			}
		})
	}
}

// TestHelpUnknownCommand: "kvroute help nope" is an unknown command, as
// "kvroute nope" is, not the general usage with exit status 0.
func TestHelpUnknownCommand(t *testing.T) {
	for _, args := range [][]string{{"nope"}, {"help", "nope"}} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), args, &out, &errb); !errors.Is(err, errUsage) || !strings.Contains(errb.String(), `unknown command "nope"`) {
			t.Errorf("%v: got %v, stderr %q; want a usage error naming the command", args, err, errb.String())
		}
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"help", "sim"}, &out, &errb); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "Usage: kvroute sim") {
		t.Errorf("help sim: got %v, want sim's help", err)
	}
}

// TestHelpOnStdout: every command's --help goes to stdout, as 'kvroute
// --help' does, so that it pipes into a pager or grep (it went to stderr).
func TestHelpOnStdout(t *testing.T) {
	for name := range commands {
		var out, errb bytes.Buffer
		err := run(context.Background(), []string{name, "--help"}, &out, &errb)
		wantFlags := name != "version" // the one command without flags says nothing of them
		if !errors.Is(err, flag.ErrHelp) || !strings.HasPrefix(out.String(), "Usage: kvroute "+name) || strings.Contains(out.String(), "Flags:") != wantFlags ||
			strings.Contains(out.String(), " \n") || errb.Len() > 0 {
			t.Errorf("%s --help: got %v, stdout %.40q..., stderr %q; want the help on stdout only", name, err, out.String(), errb.String())
		}
	}
}

// TestSignalHelperProcess is not a test: TestSecondSignalEndsProcess runs
// the test binary again with this test selected to get a process that,
// like `kvroute serve` draining, keeps working after the first signal.
func TestSignalHelperProcess(t *testing.T) {
	if os.Getenv("KVROUTE_SIGNAL_HELPER") == "" {
		t.Skip("helper process for TestSecondSignalEndsProcess")
	}
	ctx, stop := signalContext()
	defer stop()
	fmt.Println("ready")
	<-ctx.Done()
	fmt.Println("draining")
	time.Sleep(time.Minute) // a long drain
	os.Exit(0)
}

// TestSecondSignalEndsProcess: the first SIGINT starts the orderly stop,
// a second one ends the process at once (the default action), not after
// the drain.
func TestSecondSignalEndsProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalHelperProcess$")
	cmd.Env = append(os.Environ(), "KVROUTE_SIGNAL_HELPER=1")
	out := &syncbuf.Buffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor := func(text string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(out.String(), text); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("helper did not print %q; output %q", text, out.String())
			}
		}
	}
	waitFor("ready")
	_ = cmd.Process.Signal(syscall.SIGINT)
	waitFor("draining")
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("helper exited with %v, want killed by SIGINT", err)
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
			t.Fatalf("helper exited with %v, want killed by SIGINT", err)
		}
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("the second SIGINT did not end the process")
	}
}

// TestFlagErrorsNameCommand: the flag package's own errors (an unknown
// flag, a value that does not parse) come after the command's name, as the
// commands' other usage errors do; they were printed bare ("flag provided
// but not defined: -bogus"). They name the flag as typed: --bogus, not
// the flag package's -bogus.
func TestFlagErrorsNameCommand(t *testing.T) {
	for name := range commands {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--bogus"}, "flag provided but not defined: --bogus"},
			{[]string{"-bogus"}, "flag provided but not defined: -bogus"},
			{[]string{"--bogus=1"}, "flag provided but not defined: --bogus"},
		} {
			var out, errb bytes.Buffer
			err := run(context.Background(), append([]string{name}, tc.args...), &out, &errb)
			want := "kvroute " + name + ": " + tc.want + "\nRun 'kvroute " + name + " --help' for usage.\n"
			if !errors.Is(err, errUsage) || errb.String() != want {
				t.Errorf("%s %v: got %v, stderr %q; want a usage error, stderr %q", name, tc.args, err, errb.String(), want)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sim", "--rate", "x"}, `kvroute sim: invalid value "x" for flag --rate: parse error`},
		{[]string{"sim", "-rate", "x"}, `kvroute sim: invalid value "x" for flag -rate: parse error`},
		{[]string{"sim", "--rate=x"}, `kvroute sim: invalid value "x" for flag --rate: parse error`},
		{[]string{"sim", "--rate", "-x -rate"}, `kvroute sim: invalid value "-x -rate" for flag --rate: parse error`},
		{[]string{"sim", "--quiet=maybe"}, `kvroute sim: invalid boolean value "maybe" for --quiet: parse error`},
		{[]string{"serve", "--config"}, `kvroute serve: flag needs an argument: --config`},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), tc.args, &out, &errb)
		if want := tc.want + "\n"; !errors.Is(err, errUsage) || !strings.HasPrefix(errb.String(), want) {
			t.Errorf("%v: got %v, stderr %q; want %q first", tc.args, err, errb.String(), want)
		}
	}
}

// TestTraceErrorsNameFlag: a --trace that cannot be read is the flag's
// error in sim, bench and plan (exit status 1: a bad file, not bad usage);
// it said "workload: read trace: open ...", naming neither the command
// nor the flag (sim, bench).
func TestTraceErrorsNameFlag(t *testing.T) {
	missing := t.TempDir() + "/missing.jsonl"
	for _, args := range [][]string{
		{"sim", "--trace", missing},
		{"bench", "--url", "http://127.0.0.1:1", "--model", "m", "--trace", missing},
		{"plan", "--slo-ttft-p99", "2s", "--trace", missing},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), args, &out, &errb)
		want := args[0] + ": --trace: workload: read trace: open " + missing
		if err == nil || errors.Is(err, errUsage) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%v: got %v, want an error starting %q", args, err, want)
		}
	}
}

// emptyOK are the flags whose empty value means something (their help
// says what) or that their command checks itself.
var emptyOK = map[string]string{
	"demo --compare":           "", // no comparison
	"engine --kv-events-topic": "", // vLLM's default topic
	"engine --listen":          "kvroute engine: --listen: is empty (give host:port",
}

// TestEmptyFlagValues: every flag of every command given an empty value
// (--flag=, booleans included) is a usage error naming the command and
// the flag, before anything runs (an empty string or list read as the
// flag left out ran the default: sim --policies "" the three default
// policies), but the flags of emptyOK. The context is cancelled, so that a
// command that does run stops at once.
func TestEmptyFlagValues(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	flagRE := regexp.MustCompile(`(?m)^  --(\S+)`)
	n := 0
	for _, cmd := range []string{"serve", "engine", "sim", "bench", "plan", "demo", "version"} {
		var help bytes.Buffer
		if err := run(ctx, []string{cmd, "--help"}, &help, io.Discard); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s --help: %v", cmd, err)
		}
		for _, m := range flagRE.FindAllStringSubmatch(help.String(), -1) {
			name := m[1]
			if _, ok := emptyOK[cmd+" --"+name]; ok {
				continue
			}
			n++
			t.Run(cmd+" --"+name+"=", func(t *testing.T) {
				var out, errb bytes.Buffer
				err := run(ctx, []string{cmd, "--" + name + "="}, &out, &errb)
				want := fmt.Sprintf("kvroute %s: --%s is empty (give a value, or leave the flag out)\nRun 'kvroute %s --help' for usage.\n", cmd, name, cmd)
				if !errors.Is(err, errUsage) || errb.String() != want || out.Len() > 0 {
					t.Errorf("got %v, stdout %q, stderr %q; want a usage error, stderr %q", err, out.String(), errb.String(), want)
				}
				if code := exitCode(err, false, io.Discard); code != 2 {
					t.Errorf("exit status %d, want 2", code)
				}
			})
		}
	}
	if n < 100 {
		t.Errorf("%d flags found in the commands' help, want over 100 (the help's format changed?)", n)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string // a line of stderr
	}{
		{"policies", []string{"sim", "--policies", ""}, "kvroute sim: --policies is empty"},
		{"policies of commas", []string{"sim", "--policies", " , ,"}, "kvroute sim: --policies is empty"},
		{"spaces", []string{"sim", "--workload", "  "}, "kvroute sim: --workload is empty"},
		{"repeated, the second empty", []string{"sim", "--policy-param", "kv-aware.c=1.5", "--policy-param", ""}, "kvroute sim: --policy-param is empty"},
		{"endpoint", []string{"serve", "--model", "m", "--endpoint", "http://127.0.0.1:1", "--endpoint", ""}, "kvroute serve: --endpoint is empty"},
		{"config", []string{"serve", "--config", ""}, "kvroute serve: --config is empty"},
		{"header", []string{"bench", "--url", "http://127.0.0.1:1", "--model", "m", "--header", ""}, "kvroute bench: --header is empty"},
		{"hash seed", []string{"engine", "--model", "m", "--prefix-caching-hash-algo", "sha256", "--hash-seed", ""}, "kvroute engine: --hash-seed is empty"},
		{"what-if", []string{"plan", "--slo-ttft-p99", "1s", "--what-if", ","}, "kvroute plan: --what-if is empty"},
		{"a number", []string{"sim", "--rate", ""}, "kvroute sim: --rate is empty"},
		{"dtype", []string{"plan", "--hf-config", "x.json", "--dtype", ""}, "kvroute plan: --dtype is empty"},
		// The flags whose empty value means something go on to the
		// command's next check.
		{"compare: no comparison", []string{"demo", "--compare", "", "--engines", "0"}, "kvroute demo: --engines 0 must be positive"},
		{"compare=", []string{"demo", "--compare=", "--engines", "0"}, "kvroute demo: --engines 0 must be positive"},
		{"kv-events-topic", []string{"engine", "--model", "m", "--kv-events-topic", "", "--listen", "127.0.0.1:99999"}, `kvroute engine: --listen: "127.0.0.1:99999" has port 99999`},
		{"listen", []string{"engine", "--model", "m", "--listen", ""}, emptyOK["engine --listen"]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(ctx, tc.args, &out, &errb)
			if !errors.Is(err, errUsage) || !strings.HasPrefix(errb.String(), tc.want) || out.Len() > 0 {
				t.Errorf("got %v, stdout %q, stderr %q; want a usage error, stderr starting %q", err, out.String(), errb.String(), tc.want)
			}
		})
	}
}

// TestHelpListsFlagsAsTyped: each command's help lists its flags as
// --name, as its prose, README and the usage errors write them (the flag
// package's listing wrote -name).
func TestHelpListsFlagsAsTyped(t *testing.T) {
	for name := range commands {
		var out, errb bytes.Buffer
		if err := run(context.Background(), []string{name, "--help"}, &out, &errb); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s --help: got %v, want flag.ErrHelp", name, err)
		}
		_, list, _ := strings.Cut(out.String(), "\nFlags:\n")
		for line := range strings.Lines(list) {
			if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
				t.Errorf("%s --help lists %q, want --", name, strings.TrimSpace(line))
			}
		}
	}
}
