//go:build !race

package memory_test

const raceDetector = false
