// Package bench compares sluice with other rate limiters on one machine in
// one run. It is its own module so that the limiters it measures against
// never become dependencies of sluice itself.
package bench
