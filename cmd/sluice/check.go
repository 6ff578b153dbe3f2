package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/sluicehq/sluice/envoyrls"
)

func init() {
	commands["check"] = command{"validate configuration files: exit 0 when valid, 1 with every problem as FILE:LINE: path: message", runCheck}
}

// runCheck validates each file named in args the way serve loads it. It
// prints every problem of every file, so one run shows all that needs
// fixing.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check", "usage: sluice check FILE...\n\nValidates sluice configuration files (YAML or JSON), and envoyproxy/ratelimit's\nYAML, as serve loads them, and what serve checks before it starts: listener\naddresses, the store URL (without connecting) and that the audit log can be\nwritten (without creating it). Exits 0 when all are valid, 1 when any is not\n(every problem is printed as FILE:LINE: path: message), 2 on a usage error.\nSettings that are valid but let clients pick their own limits are printed\nas \"warning: FILE:LINE: path: message\" and do not change the exit code.\nWhat settings work out to (the burst that burst_seconds gives, the bounds\nand steps of an adaptive rate) follows a file's ok line as\n\"note: FILE:LINE: path: message\".", stderr)
	if code, ok := parseFlags(fs, args, true); !ok {
		return code
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	code := 0
	for _, file := range fs.Args() {
		cf, p, err := loadPolicy(file) // sluice's format, or envoyproxy/ratelimit's
		if err == nil {
			// What serve checks before it starts: listeners, store URL,
			// audit log.
			err = preflight(p.Source, fileSettings(cf.Server(), p))
		}
		if err != nil {
			fmt.Fprintln(stderr, err)
			code = 1
			continue
		}
		for _, w := range p.Warnings {
			fmt.Fprintln(stderr, "warning: "+w)
		}
		if domains, limits, ok := envoyrls.ReferenceLimits(p); ok {
			n := len(limits)
			fmt.Fprintf(stdout, "%s: ok (envoyproxy/ratelimit format: %d %s, %s %s)\n", file, n, plural(n, "rate limit"), plural(len(domains), "domain"), strings.Join(domains, ", "))
			continue
		}
		fmt.Fprintf(stdout, "%s: ok (%d %s)\n", file, len(p.Rules), plural(len(p.Rules), "rule"))
		// What settings work out to, such as burst_seconds' burst.
		for _, n := range p.Notes {
			fmt.Fprintln(stdout, "note: "+n)
		}
		if k, err := storeKindOf(fileSettings(cf.Server(), p).StoreURL); err == nil && k.schemes[0] == "memory" && len(p.Leased()) > 0 {
			fmt.Fprintf(stdout, "note: %s: lease: the memory store decides every request in one process, exactly: nothing is leased (leasing needs a shared store: Redis or PostgreSQL)\n", file)
		}
	}
	return code
}

func plural(n int, s string) string {
	if n == 1 {
		return s
	}
	return s + "s"
}
