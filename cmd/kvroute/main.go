// Command kvroute is the KV-cache-aware load balancer for LLM inference
// fleets: the router and its companions (emulated engine, simulator, load
// generator, capacity planner, demo) in one binary.
//
// main only maps signals to a context and errors to exit codes around run;
// each subcommand lives in its own file and registers itself in commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// command is one subcommand. run receives the arguments after the
// subcommand's name and writes its normal output to stdout.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is filled by each subcommand file's init.
var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("kvroute: duplicate command " + c.name)
	}
	commands[c.name] = c
}

// errUsage marks a usage error (exit code 2); the message was already printed.
var errUsage = errors.New("usage error")

func main() {
	ctx, stop := signalContext()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	interrupted := ctx.Err() != nil // before stop, which cancels ctx
	stop()
	os.Exit(exitCode(err, interrupted, os.Stderr))
}

// signalContext returns a context cancelled by the first SIGINT or
// SIGTERM, which starts a command's orderly stop (serve's drain, bench's
// and demo's partial report). That signal also hands the two signals back
// to their default action, so a second one (Ctrl-C pressed again) ends the
// process at once rather than waiting out a drain of up to
// timeouts.shutdown. The signals are handed back before the context is
// cancelled: whatever the command does once it sees the cancellation, a
// second signal finds the default action (with signal.NotifyContext
// undone by context.AfterFunc, a second signal sent as soon as the drain
// began could still be swallowed on a loaded machine).
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	stopped, exited := make(chan struct{}), make(chan struct{})
	go func() { // ends at the first signal or at stop, which waits for it
		defer close(exited)
		select {
		case <-sig:
		case <-stopped:
		}
		signal.Stop(sig)
		cancel()
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() { close(stopped) })
		<-exited
	}
	return ctx, stop
}

// exitCode prints run's error to stderr and returns the exit status: 0
// without one (or for --help), 2 for a usage error (already printed), 130
// (128 + SIGINT, as shells report it) when a signal stopped a command that
// ends with the cancellation (sim, plan; bench and demo report what
// finished and return nil), else 1.
func exitCode(err error, interrupted bool, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case interrupted && errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "kvroute: interrupted")
		return 130
	default:
		fmt.Fprintf(stderr, "kvroute: %v\n", err)
		return 1
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return errUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			c, ok := commands[args[1]]
			if !ok {
				fmt.Fprintf(stderr, "kvroute: unknown command %q\n\n", args[1])
				usage(stderr)
				return errUsage
			}
			return c.run(ctx, []string{"--help"}, stdout, stderr)
		}
		usage(stdout)
		return nil
	case "-version", "--version":
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "kvroute: unknown command %q\n\n", name)
		usage(stderr)
		return errUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `kvroute: a KV-cache-aware load balancer and request router for LLM inference fleets.

Usage:
  kvroute <command> [flags]

Commands:`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, `
Run 'kvroute <command> --help' for a command's flags.`)
}

// newFlagSet returns a flag set that prints a usage header and the command's
// flags on --help, to stdout as 'kvroute --help' does (so that it pipes into
// a pager or grep), writes its errors to stderr, and returns errors instead
// of exiting.
func newFlagSet(name, usageLine, description string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("kvroute "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: %s\n\n%s\n", strings.TrimSpace("kvroute "+name+" "+usageLine), strings.TrimSpace(description))
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			// The flag package lists a flag as -name; the help's prose,
			// README and the usage errors write --name, which the
			// package takes as well.
			var list strings.Builder
			fs.SetOutput(&list)
			fs.PrintDefaults()
			fs.SetOutput(stderr)
			fmt.Fprint(stdout, "\nFlags:\n"+flagLine.ReplaceAllString(list.String(), "  --"))
		}
	}
	return fs
}

// flagLine is the start of a flag's line in flag.PrintDefaults' listing
// (its usage lines start with four spaces and a tab).
var flagLine = regexp.MustCompile(`(?m)^  -`)

// parseFlags parses args into fs, mapping a parse error to errUsage and
// --help to flag.ErrHelp. --help prints the whole help; a bad flag prints
// the flag package's one-line error after the command's name ("kvroute
// sim: invalid value ...") and where the help is, not the whole help,
// which would bury the error.
//
// A flag given an empty value (--policies "", --out=, a list of only
// commas) is a usage error naming it ("kvroute sim: --policies is
// empty"): the commands read an empty string or list as the flag left out,
// and would run their default instead. emptyOK names the flags for which
// an empty value means something (documented in their help, e.g. demo's
// --compare "": no comparison) or that check it themselves.
func parseFlags(fs *flag.FlagSet, args []string, emptyOK ...string) error {
	full := fs.Usage
	fs.Usage = func() {}
	// The flag package prints its error ("flag provided but not defined:
	// -bogus") bare; it is printed here after the command's name, as the
	// commands' own usage errors are.
	out := fs.Output()
	var msg strings.Builder
	fs.SetOutput(&msg)
	empty := ""
	restore := watchEmpty(fs, emptyOK, &empty)
	err := fs.Parse(args)
	restore()
	fs.SetOutput(out)
	fs.Usage = full
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			full()
			return flag.ErrHelp
		}
		if empty != "" {
			fmt.Fprintf(out, "%s: --%s is empty (give a value, or leave the flag out)\n", fs.Name(), empty)
		} else {
			fmt.Fprintf(out, "%s: %s\n", fs.Name(), typedFlagError(strings.TrimSpace(msg.String()), args))
		}
		shortUsage(fs)
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments: %q\n", fs.Name(), fs.Args())
		shortUsage(fs)
		return errUsage
	}
	return nil
}

// typedFlagError names the flag in one of the flag package's errors as it
// was typed: the package writes -name ("flag provided but not defined:
// -bogus") however the user wrote it, and the help, the docs and the
// other usage errors say --name. A flag args gave as --name (or
// --name=value) is named so; any other message is returned as it is.
func typedFlagError(msg string, args []string) string {
	at := -1 // the index of the name's dash in msg
	for _, p := range []string{"flag provided but not defined: ", "flag needs an argument: "} {
		if strings.HasPrefix(msg, p) {
			at = len(p)
		}
	}
	for _, p := range []struct{ head, mid string }{{"invalid value ", " for flag "}, {"invalid boolean value ", " for "}} {
		if rest, ok := strings.CutPrefix(msg, p.head); ok {
			// The value is quoted and may hold anything: the name
			// follows its closing quote.
			if q, err := strconv.QuotedPrefix(rest); err == nil && strings.HasPrefix(rest[len(q):], p.mid) {
				at = len(p.head) + len(q) + len(p.mid)
			}
		}
	}
	if at < 0 || at >= len(msg) || msg[at] != '-' {
		return msg
	}
	name, _, _ := strings.Cut(msg[at+1:], ":")
	for _, a := range args {
		if a == "--" { // the end of the flags
			break
		}
		if a == "--"+name || strings.HasPrefix(a, "--"+name+"=") {
			return msg[:at] + "-" + msg[at:]
		}
	}
	return msg
}

// errEmpty stops a parse at a flag given an empty value (watchEmpty).
var errEmpty = errors.New("empty value")

// emptyWatch wraps a flag's value during a parse: an empty value (spaces
// only, or for a stringList commas and spaces only) records the flag's
// name in *empty and fails the parse.
type emptyWatch struct {
	flag.Value
	name  string
	list  bool
	empty *string
}

func (w emptyWatch) Set(v string) error {
	cut := " \t\n"
	if w.list {
		cut += ","
	}
	if strings.Trim(v, cut) == "" {
		*w.empty = w.name
		return errEmpty
	}
	return w.Value.Set(v)
}

// emptyBoolWatch is emptyWatch for a boolean flag, which the flag package
// lets go without a value (--quiet) but not with an empty one (--quiet=).
type emptyBoolWatch struct{ emptyWatch }

func (emptyBoolWatch) IsBoolFlag() bool { return true }

// watchEmpty wraps the values of fs's flags but those named in emptyOK
// in emptyWatch, for one parse, and returns the function that unwraps
// them (the help and flag.Value type switches see the flags' own values).
func watchEmpty(fs *flag.FlagSet, emptyOK []string, empty *string) (restore func()) {
	orig := map[*flag.Flag]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		if slices.Contains(emptyOK, f.Name) {
			return
		}
		orig[f] = f.Value
		_, list := f.Value.(*stringList)
		w := emptyWatch{Value: f.Value, name: f.Name, list: list, empty: empty}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = emptyBoolWatch{w}
		} else {
			f.Value = w
		}
	})
	return func() {
		for f, v := range orig {
			f.Value = v
		}
	}
}

// shortUsage follows a usage error: it says where the command's help is.
func shortUsage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "Run '%s --help' for usage.\n", fs.Name())
}

// stringList is a repeatable string flag (--endpoint a --endpoint b, or a,b).
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
