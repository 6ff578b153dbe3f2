package main

import (
	"bytes"
	"runtime/debug"
	"sort"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version"} {
		var out, errb bytes.Buffer
		if code := run([]string{arg}, &out, &errb); code != 0 {
			t.Fatalf("%s: exit %d: %s", arg, code, errb.String())
		}
		if !strings.HasPrefix(out.String(), "sluice ") || strings.Count(out.String(), "\n") != 1 || !strings.Contains(out.String(), "go1.") {
			t.Fatalf("%s printed %q, want one line: sluice VERSION (GO, OS/ARCH)", arg, out.String())
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"version", "extra"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unexpected argument") {
		t.Fatalf("version extra: exit %d, stderr %q", code, errb.String())
	}
}

func TestBuildVersion(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	vcs := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{
			{Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2025-01-02T03:04:05Z"},
			{Key: "vcs.modified", Value: modified},
		}
	}
	info := func(v string, s []debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: v}, Settings: s}
	}
	for _, tc := range []struct {
		name     string
		override string
		info     *debug.BuildInfo
		want     string
	}{
		{"ldflags wins", "1.2.3-custom", info("v1.0.0", vcs("false")), "1.2.3-custom"},
		{"no build info", "", nil, "dev"},
		{"go install @version", "", info("v1.4.0", nil), "v1.4.0"},
		{"go install @pseudo-version", "", info("v0.0.0-20250102030405-0123456789ab", nil), "v0.0.0-20250102030405-0123456789ab"},
		{"checkout, clean", "", info("v0.0.0-20250102030405-0123456789ab", vcs("false")), "0123456789ab 2025-01-02T03:04:05Z"},
		{"checkout, modified", "", info("v0.0.0-20250102030405-0123456789ab+dirty", vcs("true")), "0123456789ab-dirty 2025-01-02T03:04:05Z"},
		{"checkout at a tag", "", info("v1.4.0", vcs("false")), "v1.4.0"},
		{"checkout at a tag, modified", "", info("v1.4.0+dirty", vcs("true")), "0123456789ab-dirty 2025-01-02T03:04:05Z"},
		{"older Go: (devel) with VCS", "", info("(devel)", vcs("true")), "0123456789ab-dirty 2025-01-02T03:04:05Z"},
		{"-buildvcs=false", "", info("(devel)", nil), "dev"},
	} {
		if got := buildVersion(tc.override, tc.info); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"nope"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "nope"`) {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"help", "nope"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), `unknown command "nope"`) {
		t.Fatalf("help nope: exit %d, stderr %q", code, errb.String())
	}
}

func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// TestHelpListsCommands: "sluice help", "--help" and "-h" list every
// command with its one-line summary on stdout and exit 0; "sluice" alone
// prints the same on stderr and exits 2.
func TestHelpListsCommands(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"-help"}, {"help", "help"}, {}} {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		got, want := out.String(), 0
		if len(args) == 0 {
			got, want = errb.String(), 2
		}
		if code != want {
			t.Errorf("%v: exit %d, want %d", args, code, want)
		}
		for _, n := range commandNames() {
			if !strings.Contains(got, "\n  "+n+" ") || !strings.Contains(got, " "+commands[n].summary+"\n") {
				t.Errorf("%v: the list lacks the line of %q:\n%s", args, n, got)
			}
		}
	}
}

// TestCommandHelp: each command's -h, --help and "sluice help CMD" print
// its summary, its usage line and its flags with their defaults on
// stdout, and exit 0. A new command is covered without editing the test.
func TestCommandHelp(t *testing.T) {
	// Flags, with a default, that each command's help must show.
	wantFlags := map[string][]string{
		"serve":      {"-config string", "-listen string", "-grpc-listen string", "-proxy-listen string"},
		"simulate":   {"-pattern string", "-step duration", "(default 1s)", "-cost float", "(default 1)"},
		"migrate":    {"-url string", "-timeout duration", "(default 1m0s)"},
		"violations": {"-since duration", "(default 1h0m0s)", "-limit int", "(default 50)"},
	}
	for _, n := range commandNames() {
		if n == "help" {
			continue
		}
		for _, args := range [][]string{{n, "-h"}, {n, "--help"}, {n, "-help"}, {"help", n}} {
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != 0 {
				t.Errorf("%v: exit %d, want 0; stderr %q", args, code, errb.String())
			}
			got := out.String()
			if head := "sluice " + n + ": " + commands[n].summary + "\n"; !strings.HasPrefix(got, head) {
				t.Errorf("%v: help starts %q, want %q", args, firstLine(got), head)
			}
			if !strings.Contains(got, "\nusage: sluice "+n) {
				t.Errorf("%v: help lacks the usage line:\n%s", args, got)
			}
			for _, f := range wantFlags[n] {
				if !strings.Contains(got, f) {
					t.Errorf("%v: help lacks %q:\n%s", args, f, got)
				}
			}
			if errb.Len() != 0 {
				t.Errorf("%v: stderr %q, want nothing", args, errb.String())
			}
		}
	}
	// After other arguments -h is still help (exit 0, nothing run), printed
	// where the flag package prints: stderr.
	var out, errb bytes.Buffer
	if code := run([]string{"serve", "--listen", "127.0.0.1:0", "-h"}, &out, &errb); code != 0 || !strings.HasPrefix(errb.String(), "sluice serve: ") {
		t.Errorf("serve --listen ... -h: exit %d, stderr %q", code, errb.String())
	}
}

// TestBadFlag: an unknown flag exits 2 with the error and the usage on
// stderr, and nothing on stdout, for every command.
func TestBadFlag(t *testing.T) {
	for _, n := range commandNames() {
		if n == "help" {
			continue
		}
		var out, errb bytes.Buffer
		if code := run([]string{n, "--no-such-flag"}, &out, &errb); code != 2 {
			t.Errorf("%s: exit %d, want 2", n, code)
		}
		if s := errb.String(); !strings.Contains(s, "flag provided but not defined: -no-such-flag") || !strings.Contains(s, "usage: sluice "+n) {
			t.Errorf("%s: stderr %q lacks the error or the usage", n, s)
		}
		if out.Len() != 0 {
			t.Errorf("%s: stdout %q, want nothing", n, out.String())
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
