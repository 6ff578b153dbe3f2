package sluice_test

import (
	"slices"
	"strings"
	"testing"
)

// The arrows of the module's layers (see package engine's doc): the
// application's package imports no store or transport, the engine nothing
// of sluice's, stores no transport, and the two transports not each other.
// A feature's home is below the doors and policy, which call it: adaptive
// imports nothing of sluice's but internal/defaults and internal/deadline
// (leaves that import nothing of it), settle nothing above the root (no policy, store, door or
// metrics).
func TestLayering(t *testing.T) {
	stores := []string{"memory", "redis", "postgres"}
	transports := []string{"httpgate", "envoyrls"}
	forbid := map[string][]string{
		".":        append(append([]string{"engine/conformance", "conformance", "policy", "metrics", "insight", "settle", "adaptive"}, stores...), transports...),
		"engine":   {""}, // "" is the root: nothing of the module
		"memory":   transports,
		"redis":    transports,
		"postgres": transports,
		"httpgate": {"envoyrls"},
		"envoyrls": {"httpgate"},
		// Leased quotas wrap any store from outside: the root and the
		// engine only.
		"quota":    append(append([]string{"policy", "metrics", "insight", "conformance"}, stores...), transports...),
		"settle":   append(append([]string{"policy", "metrics", "insight", "conformance", "adaptive", "quota"}, stores...), transports...),
		"adaptive": {""},
	}
	// Leaves each package may import despite a rule above.
	allowed := map[string][]string{"adaptive": {"internal/defaults", "internal/deadline"}}
	for pkg, bad := range forbid {
		for imp := range moduleImports(t, "./"+pkg) {
			rel, ok := strings.CutPrefix(imp, modulePath)
			if !ok {
				continue
			}
			rel = strings.TrimPrefix(rel, "/")
			if slices.Contains(allowed[pkg], rel) {
				continue
			}
			for _, b := range bad {
				if rel == b || b == "" || strings.HasPrefix(rel, b+"/") {
					t.Errorf("%s imports %s (directly or through a package of the module)", pkg, imp)
				}
			}
		}
	}
}
