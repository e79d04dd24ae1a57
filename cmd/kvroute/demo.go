package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/demo"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/policy"
)

func init() {
	register(command{name: "demo", summary: "run an emulated fleet, the router and a workload, with the live dashboard", run: runDemo})
}

const demoDescription = `See what kvroute does in about a minute, with no GPU and no engines: start, in
this process on loopback, N emulated vLLM engines (small KV caches, so that
spreading shared prefixes over every engine thrashes them), the router in front
of them and a workload (multi-turn chat sessions, users behind a few long shared
system prompts and a burst on one hot prefix). The same workload then replays
through each --compare policy on cold caches, and the side-by-side table
(TTFT, throughput, prefix hit rate) and the report files end the run.

Open the printed URL for the live dashboard: the fleet, every routing decision
with the candidates' scores, charts and the policy switch (it asks for the
printed admin token). --no-browser keeps the browser closed; Ctrl-C stops
everything and prints the table of the policies that finished. Exit status: 0
when the run finished or was interrupted, 2 on a bad flag or flag value, 1 on
another error (a listen address in use, an unwritable --out).

Workloads: %s. Policies: %s. Profiles: %s.`

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, noBrowser, err := parseDemoFlags(args, stdout, stderr)
	if err != nil {
		return err
	}
	if cfg.Out != "" {
		// Named by its flag, as sim's and bench's --out are (demo.Run's
		// error said "demo: mkdir ...").
		if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
			return fmt.Errorf("demo: --out: %w", err)
		}
	}
	cfg.Stdout = stdout
	if !noBrowser {
		cfg.OnReady = func(url string) { openBrowser(ctx, url) }
	}
	_, err = demo.Run(ctx, cfg)
	return err
}

// parseDemoFlags builds the demo's configuration from its flags.
func parseDemoFlags(args []string, stdout, stderr io.Writer) (cfg demo.Config, noBrowser bool, err error) {
	fs := newFlagSet("demo", "[flags]", fmt.Sprintf(demoDescription, strings.Join(demo.WorkloadNames(), ", "),
		strings.Join(policy.Names(), ", "), strings.Join(engine.ProfileNames(), ", ")), stdout, stderr)
	var (
		compare string
		quick   bool
		verbose bool
	)
	fs.IntVar(&cfg.Engines, "engines", demo.DefaultEngines, "number of emulated engines")
	fs.StringVar(&cfg.Workload, "workload", demo.WorkloadMixed, "workload: mixed or a generator `name`")
	fs.DurationVar(&cfg.Duration, "duration", demo.DefaultDuration, "whole run, split evenly over the policies")
	fs.StringVar(&cfg.Policy, "policy", policy.Default, "the routing `policy` shown first")
	fs.StringVar(&compare, "compare", demo.DefaultCompare, "policies to compare against, comma-separated (\"\" or none = no comparison)")
	fs.StringVar(&cfg.Listen, "listen", "", "dashboard and router `address` (default 127.0.0.1:8080 if free, else a free port)")
	fs.StringVar(&cfg.AdminToken, "admin-token", "", "admin `token` for the policy switch, at least 16 characters (default random, printed)")
	fs.StringVar(&cfg.Out, "out", "", "report `dir` (default a new temporary directory)")
	fs.StringVar(&cfg.Profile, "profile", demo.DefaultProfile, "engine `profile`")
	fs.IntVar(&cfg.Blocks, "blocks", demo.DefaultBlocks, "KV cache size per engine in 16-token blocks (64 to 262144)")
	fs.Float64Var(&cfg.Speed, "speed", demo.DefaultSpeed, "run the engines this many times faster than real time (0.001 to 1000)")
	fs.Float64Var(&cfg.Rate, "rate", demo.DefaultRate, "mean arrival rate, requests per second")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "workload seed")
	fs.BoolVar(&cfg.Linger, "keep", false, "keep the dashboard up after the run until Ctrl-C")
	fs.BoolVar(&noBrowser, "no-browser", false, "do not open the dashboard in a browser")
	fs.BoolVar(&quick, "quick", false, "a short run (10s, 2 engines, unless --duration or --engines says otherwise) for a smoke test")
	fs.BoolVar(&verbose, "v", false, "log the components' warnings to stderr")
	if err := parseFlags(fs, args, "compare"); err != nil { // --compare "": no comparison
		return cfg, false, err
	}
	// demo.Config reads zero as "the default": a zero given on the command
	// line is a mistake, not a request for the default.
	for _, f := range []struct {
		name string
		bad  bool
	}{
		{"engines", cfg.Engines < 1}, {"blocks", cfg.Blocks < 1}, {"speed", !(cfg.Speed > 0)},
		{"rate", !(cfg.Rate > 0)}, {"duration", cfg.Duration <= 0},
	} {
		if f.bad {
			fmt.Fprintf(stderr, "kvroute demo: --%s %s must be positive\n", f.name, fs.Lookup(f.name).Value)
			return cfg, false, errUsage
		}
	}
	switch strings.TrimSpace(compare) {
	case "", "none":
		cfg.NoCompare = true
	default:
		var l stringList
		_ = l.Set(compare)
		cfg.Compare = l
	}
	if quick {
		if !flagSet(fs, "duration") {
			cfg.Duration = 10 * time.Second
		}
		if !flagSet(fs, "engines") {
			cfg.Engines = 2
		}
	}
	if cfg.Listen != "" {
		if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
			fmt.Fprintf(stderr, "kvroute demo: --listen %q is not a host:port address\n", cfg.Listen)
			return cfg, false, errUsage
		}
	}
	// What demo.Run would refuse (naming its config's fields) is the
	// flags' error: name the flag, exit status 2.
	if err := cfg.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "kvroute demo: %s\n", demoFlagError(line, cfg.Policy))
		}
		return cfg, false, errUsage
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
		if ln, err := net.Listen("tcp", "127.0.0.1:8080"); err == nil {
			_ = ln.Close()
			cfg.Listen = "127.0.0.1:8080"
		}
	}
	if verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return cfg, noBrowser, nil
}

// openBrowser opens url with the desktop's opener, if there is one, and
// waits at most 3 s for the opener (not the browser) to return. Failures
// are ignored: the URL is printed.
func openBrowser(ctx context.Context, url string) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	switch runtime.GOOS {
	case "darwin":
		cmd = exec.CommandContext(ctx, "open", url)
	case "windows":
		cmd = exec.CommandContext(ctx, "rundll32", "url.dll,FileProtocolHandler", url)
	default:
		if _, err := exec.LookPath("xdg-open"); err != nil {
			return
		}
		cmd = exec.CommandContext(ctx, "xdg-open", url)
	}
	_ = cmd.Run()
}

// demoFlagError renames a demo.Config validation error after its flag:
// "engines: 70 is not in 1..64" becomes "--engines: 70 is not in 1..64",
// and a policy's error names --policy or --compare.
func demoFlagError(msg, shownFirst string) string {
	field, rest, ok := strings.Cut(msg, ": ")
	if !ok {
		return msg
	}
	if name, isPolicy := strings.CutPrefix(field, "policy "); isPolicy {
		flagName := "--compare"
		if name == strconv.Quote(shownFirst) {
			flagName = "--policy"
		}
		return flagName + " " + name + ": " + strings.TrimPrefix(rest, "policy: ")
	}
	switch field {
	case "engines", "profile", "blocks", "speed", "workload", "rate", "duration":
		return "--" + field + ": " + rest
	case "admin token":
		return "--admin-token: " + rest
	}
	return msg
}
