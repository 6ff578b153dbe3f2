package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/lockedbuf"
)

// TestMain makes the test binary sluice itself when SLUICE_TEST_MAIN holds
// its arguments, so that a test can start sluice as a process of its own
// and signal it from outside.
func TestMain(m *testing.M) {
	if args := os.Getenv("SLUICE_TEST_MAIN"); args != "" {
		os.Exit(run(strings.Fields(args), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// startProcess runs `sluice serve args` as a child process and returns it
// with the decision API's address and its log.
func startProcess(t *testing.T, args string) (*exec.Cmd, string, *lockedbuf.Buffer, <-chan error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=serve --listen 127.0.0.1:0 --grpc-listen off "+args)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// exited delivers Wait's result, to the test or else to the cleanup.
	exited := make(chan error, 1)
	logs := &lockedbuf.Buffer{}
	addrc := make(chan string, 1)
	gone := make(chan struct{})
	go func() {
		addrRE := regexp.MustCompile(`msg=listening server=api addr=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write([]byte(sc.Text() + "\n"))
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				addrc <- m[1]
			}
		}
		io.Copy(io.Discard, stderr)
		exited <- cmd.Wait()
		close(gone)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-gone
	})
	select {
	case addr := <-addrc:
		return cmd, addr, logs, exited
	case err := <-exited:
		t.Fatalf("sluice serve exited (%v):\n%s", err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("sluice serve did not start:\n%s", logs.String())
	}
	return nil, "", nil, nil
}

func statusOf(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestShutdownDrainsReadiness signals a sluice process as Kubernetes does:
// /readyz answers 503 while decisions are still made, for the drain
// (cut short here by a second SIGTERM, so that nothing waits on a clock),
// and only then do the listeners close and the process exit.
func TestShutdownDrainsReadiness(t *testing.T) {
	cmd, addr, logs, exited := startProcess(t, "--shutdown-drain 10m")
	if got := statusOf(addr, "/readyz"); got != http.StatusOK {
		t.Fatalf("/readyz before SIGTERM = %d, want 200", got)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for statusOf(addr, "/readyz") != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered 503 after SIGTERM:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Draining, the process still decides and still answers liveness.
	if got := statusOf(addr, "/v1/auth"); got != http.StatusOK {
		t.Errorf("forward auth while draining = %d, want 200", got)
	}
	if got := statusOf(addr, "/healthz"); got != http.StatusOK {
		t.Errorf("/healthz while draining = %d, want 200", got)
	}
	select {
	case err := <-exited:
		t.Fatalf("exited (%v) during a 10m drain:\n%s", err, logs.String())
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("exit: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("a second SIGTERM did not end the drain:\n%s", logs.String())
	}
	if got := statusOf(addr, "/readyz"); got != 0 {
		t.Errorf("/readyz after exit = %d, want a refused connection", got)
	}
	out := logs.String()
	i, j, k := strings.Index(out, "shutting down"), strings.Index(out, "draining"), strings.Index(out, "closing the listeners")
	if i < 0 || j < i || k < j {
		t.Errorf("want shutting down, draining, closing the listeners in that order:\n%s", out)
	}
}

// TestShutdownDrainEnds: a drain that runs its course ends the process by
// itself, and drain 0 skips the drain.
func TestShutdownDrainEnds(t *testing.T) {
	for _, drain := range []string{"100ms", "0s"} {
		cmd, _, logs, exited := startProcess(t, "--shutdown-drain "+drain)
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("drain %s: exit: %v\n%s", drain, err, logs.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("drain %s: still running:\n%s", drain, logs.String())
		}
		if got := strings.Contains(logs.String(), "draining"); got != (drain != "0s") {
			t.Errorf("drain %s: logged draining = %v:\n%s", drain, got, logs.String())
		}
	}
}
