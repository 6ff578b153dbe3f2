//go:build race

package memory

// raceDetector scales down the tests that are slow under the race
// detector (ten times slower per operation) to the same shape.
const raceDetector = true
