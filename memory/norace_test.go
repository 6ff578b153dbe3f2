//go:build !race

package memory

const raceDetector = false
