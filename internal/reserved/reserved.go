// Package reserved builds the limits sluice keeps in a store for itself
// (the settlement handles' nonces), under names that no limit of a user's
// may take: sluice.NewLimit refuses them, so their buckets can never be
// shared with a rule's or a library user's.
package reserved

// NewLimit is set by package sluice: it compiles spec, a sluice.Spec, as
// sluice.NewLimit does but with any non-empty name, and returns a
// *sluice.Limit. (Typed any: this package cannot import sluice, which
// imports it.)
var NewLimit func(spec any) (any, error)
