package bench

import (
	"os"
	"testing"
	"time"
)

func TestStatCPU(t *testing.T) {
	// A command name with a space and a parenthesis of its own, then
	// utime 250 and stime 50 ticks.
	line := []byte("4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 0 0\n")
	got, err := statCPU(line)
	if err != nil || got != 3*time.Second {
		t.Fatalf("statCPU = %v, %v; want 3s", got, err)
	}
	for _, bad := range []string{"", "4242 (x", "4242 (x) S 1 2", "4242 (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 a 50"} {
		if _, err := statCPU([]byte(bad)); err == nil {
			t.Errorf("statCPU(%q) read a time", bad)
		}
	}
}

func TestProcessCPUOfThisProcess(t *testing.T) {
	before, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for x := 0; ; x++ { // spend CPU until the clock moves
		after, err := ProcessCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
	}
}

func TestStatCPUOfThisProcess(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc here")
	}
	if _, err := statCPU(b); err != nil {
		t.Fatal(err)
	}
}
