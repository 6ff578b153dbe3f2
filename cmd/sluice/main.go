// Command sluice serves sluice's rate limits over HTTP and Envoy's gRPC
// rate limit protocol, and validates and simulates their configuration.
// It only wires: the logic lives in the library's packages. serve.go is
// serve's steps (flags, policy, checks, store, gate, listeners, the
// policy watcher, shutdown); startup.go what serve and check refuse
// before starting, and the binding of every listener; store.go the stores
// this binary opens, each parsing its own URL; envoy.go the Envoy
// service's gRPC server.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
)

// version, when set at build time with -ldflags "-X main.version=...",
// is printed as it is; left empty, the version comes from the build
// information Go records in the binary (see buildVersion).
var version = ""

// command is one subcommand: it gets the arguments after its name and
// returns the process exit code.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is filled by each subcommand's file in its init function.
var commands = map[string]command{}

func init() {
	commands["version"] = command{"print the version, how it was built and the Go release", runVersion}
	commands["help"] = command{`list the commands, or show one command's help ("sluice help serve")`, runHelp}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name, rest := args[0], args[1:]
	switch {
	case isHelpFlag(name):
		name = "help"
	case name == "--version" || name == "-version":
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
	// Help that was asked for is the output, not an error: "sluice CMD -h"
	// prints it on stdout (a lone -h can mean nothing else to any command).
	// After other arguments, -h is the flag package's and prints on stderr,
	// still with exit 0.
	if len(rest) == 1 && isHelpFlag(rest[0]) {
		stderr = stdout
	}
	return c.run(rest, stdout, stderr)
}

func isHelpFlag(s string) bool { return s == "-h" || s == "--help" || s == "-help" }

// runHelp lists the commands, or prints one command's help through the
// command's own flag set, so the two cannot disagree.
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) > 1 {
		fmt.Fprintln(stderr, "usage: sluice help [COMMAND]")
		return 2
	}
	if len(args) == 0 || isHelpFlag(args[0]) || args[0] == "help" {
		usage(stdout)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run([]string{"-h"}, stdout, stdout)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `sluice is a rate limiter: it serves limits over HTTP (decision API,
forward auth, reverse proxy) and Envoy's gRPC rate limit protocol, on a
memory, Redis or PostgreSQL store.

usage: sluice <command> [flags] [arguments]

commands:
`)
	for _, n := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(w, "  %-11s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `
"sluice <command> -h" or "sluice help <command>" shows a command's flags.
"sluice serve" with no --config runs the embedded default policy: per client
IP, 10 requests per second, burst 20, memory store.
`)
}

// newFlagSet returns the flag set of the command name. Its help (-h,
// --help, "sluice help NAME") is the command's summary, then usage (its
// usage line, optionally followed by a paragraph), then every flag with
// its default. It is printed on stderr unless run chose otherwise.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "sluice %s: %s\n\n%s\n", name, commands[name].summary, strings.TrimRight(usage, "\n"))
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nflags:")
			fs.PrintDefaults()
		}
	}
	return fs
}

// parseFlags parses a command's arguments, which are flags alone unless
// the command takesArgs. When ok is false the command is over and returns
// code: 0 after -h/--help (help printed), 2 after a bad flag (the error
// and the help printed on stderr) or an unexpected argument.
func parseFlags(fs *flag.FlagSet, args []string, takesArgs bool) (code int, ok bool) {
	err := fs.Parse(args)
	switch {
	case err == nil && !takesArgs && fs.NArg() > 0:
		fmt.Fprintf(fs.Output(), "sluice %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2, false
	case err == nil:
		return 0, true
	case errors.Is(err, flag.ErrHelp):
		return 0, false
	default:
		return 2, false
	}
}

func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", "usage: sluice version", stderr)
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintf(stdout, "sluice %s (%s, %s/%s)\n", buildVersion(version, info), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return 0
}

// buildVersion names the build: the -ldflags override when given; else
// the module version "go install ...@v1.2.3" recorded; else, for a build
// from a checkout, the commit (12 hex digits, "-dirty" when the tree had
// changes) and its time; else "dev". info may be nil.
func buildVersion(override string, info *debug.BuildInfo) string {
	if override != "" {
		return override
	}
	if info == nil {
		return "dev"
	}
	var rev, at string
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	rev = rev[:min(len(rev), 12)]
	// A checkout's build also gets a module version, a pseudo-version
	// made of the commit ("v0.0.0-20250102030405-0123456789ab+dirty"):
	// the commit form below says the same more plainly. A tag's version
	// ("v1.2.3") is kept.
	v := info.Main.Version
	fromCommit := rev != "" && (strings.Contains(v, rev) || strings.HasSuffix(v, "+dirty"))
	if v != "" && v != "(devel)" && !fromCommit {
		return v
	}
	if rev == "" {
		return "dev"
	}
	if dirty {
		rev += "-dirty"
	}
	if at != "" {
		rev += " " + at
	}
	return rev
}
