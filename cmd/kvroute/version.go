package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
)

func init() {
	register(command{name: "version", summary: "print the version", run: runVersion})
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "", "Print kvroute's version and the Go version it was built with.", stdout, stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "kvroute %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
