// Package defaults fills the settings that an options struct leaves
// unset with their defaults.
package defaults

// Set sets *v, a setting left unset (zero, or negative, which no such
// setting means), to its default d.
func Set[T ~int | ~int32 | ~int64 | ~float64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
