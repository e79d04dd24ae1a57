package main

import (
	"bytes"
	"errors"
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
		cfg, _, err := parseDemoFlags(append([]string{"--listen", "127.0.0.1:0"}, tc.args...), &errb)
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, errb.String())
		}
		if cfg.Engines != tc.engines || cfg.Duration != tc.duration {
			t.Errorf("%v: %d engines for %v, want %d for %v", tc.args, cfg.Engines, cfg.Duration, tc.engines, tc.duration)
		}
	}
	for _, args := range [][]string{{"--engines", "0"}, {"--rate", "0"}, {"--speed", "0"}, {"--blocks", "0"}, {"--duration", "0"}, {"--engines", "-2"}} {
		var errb bytes.Buffer
		_, _, err := parseDemoFlags(args, &errb)
		if !errors.Is(err, errUsage) || !strings.Contains(errb.String(), args[0]) {
			t.Errorf("%v: got %v, stderr %q; want a usage error naming %s", args, err, errb.String(), args[0])
		}
	}
}
