package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemoFlags: --quick shortens the run and the fleet only where the
// command line does not say otherwise, and a zero that demo.Config would
// silently read as "the default" is a usage error.
func TestDemoFlags(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		engines  int
		duration time.Duration
	}{
		{nil, 4, time.Minute},
		{[]string{"--quick"}, 2, 10 * time.Second},
		{[]string{"--quick", "--engines", "3"}, 3, 10 * time.Second},
		{[]string{"--quick", "--duration", "20s"}, 2, 20 * time.Second},
	} {
		var errb bytes.Buffer
		cfg, _, err := parseDemoFlags(append([]string{"--listen", "127.0.0.1:0"}, tc.args...), io.Discard, &errb)
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, errb.String())
		}
		if cfg.Engines != tc.engines || cfg.Duration != tc.duration {
			t.Errorf("%v: %d engines for %v, want %d for %v", tc.args, cfg.Engines, cfg.Duration, tc.engines, tc.duration)
		}
	}
	// What demo.Config refuses is a usage error too (it was exit status 1,
	// named by the config's field: `demo: policy "nope": policy: unknown
	// policy`), named by the flag.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "nope"}, `kvroute demo: --policy "nope": unknown policy "nope" (known: dynamo,`},
		{[]string{"--compare", "kv-aware,nope"}, `kvroute demo: --compare "nope": unknown policy "nope"`},
		{[]string{"--workload", "nope"}, `kvroute demo: --workload: "nope" is not one of mixed, chat`},
		{[]string{"--profile", "nope"}, `kvroute demo: --profile: engine: unknown profile "nope"`},
		{[]string{"--engines", "70"}, "kvroute demo: --engines: 70 is not in 1..64"},
		{[]string{"--blocks", "10"}, "kvroute demo: --blocks: 10 is below 64"},
		{[]string{"--blocks", "2000000000"}, "kvroute demo: --blocks: 2000000000 is above 262144"},
		// Below the emulator's least speed it was exit status 1, named by
		// the emulator's field: "demo: engine 0: emulator: Speed 0.0001".
		{[]string{"--speed", "0.0001"}, "kvroute demo: --speed: 0.0001 is not in [0.001, 1000]"},
		{[]string{"--admin-token", "short"}, "kvroute demo: --admin-token: needs at least 16 characters"},
		{[]string{"--listen", "bad"}, `kvroute demo: --listen "bad" is not a host:port address`},
	} {
		var errb bytes.Buffer
		_, _, err := parseDemoFlags(tc.args, io.Discard, &errb)
		if !errors.Is(err, errUsage) || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: got %v, stderr %q; want a usage error with %q", tc.args, err, errb.String(), tc.want)
		}
	}
	for _, args := range [][]string{{"--engines", "0"}, {"--rate", "0"}, {"--speed", "0"}, {"--blocks", "0"}, {"--duration", "0"}, {"--engines", "-2"}} {
		var errb bytes.Buffer
		_, _, err := parseDemoFlags(args, io.Discard, &errb)
		if !errors.Is(err, errUsage) || !strings.Contains(errb.String(), args[0]) {
			t.Errorf("%v: got %v, stderr %q; want a usage error naming %s", args, err, errb.String(), args[0])
		}
	}
}

// TestDemoOutError: an --out that cannot be made is named by its flag
// (exit status 1, before anything starts); it was "demo: mkdir ...".
func TestDemoOutError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"demo", "--no-browser", "--listen", "127.0.0.1:0", "--out", filepath.Join(file, "report")}, &out, &errb)
	if err == nil || errors.Is(err, errUsage) || !strings.HasPrefix(err.Error(), "demo: --out: mkdir ") {
		t.Errorf("got %v, want an error starting \"demo: --out: mkdir \"", err)
	}
}
