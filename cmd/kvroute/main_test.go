package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
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
	if err := run(context.Background(), []string{"help", "sim"}, &out, &errb); !errors.Is(err, flag.ErrHelp) || !strings.Contains(errb.String(), "Usage: kvroute sim") {
		t.Errorf("help sim: got %v, want sim's help", err)
	}
}
