package httpgate_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/policy"
)

// At the cap, a connection that becomes idle while a new one waits gives
// its place up (the new one does not wait for idle_timeout), and closing
// the listener wakes an Accept waiting for a place.
func TestConnLimiterIdleNextAndClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lc := httpgate.LimitConns(ln, 1)
	release := make(chan struct{})
	lim := policy.DefaultServerLimits
	lim.IdleTimeout = time.Hour
	hs := httpgate.APIServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			<-release
		}
		io.WriteString(w, "ok")
	}), lim, lc)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(lc) }()
	addr := ln.Addr().String()

	// The only place is taken by a keep-alive connection in the middle
	// of a request.
	first, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	io.WriteString(first, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")

	second := make(chan error, 1)
	go func() {
		c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
		}
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("answered past the cap of 1 (err %v)", err)
	case <-time.After(300 * time.Millisecond): // a slow machine can only make this pass
	}
	// The held request ends; its connection turns idle and is closed for
	// the waiting one.
	close(release)
	if resp, err := http.ReadResponse(bufio.NewReader(first), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("held request: %v %v", resp, err)
	}
	if err := <-second; err != nil {
		t.Fatalf("waiting connection: %v", err)
	}

	// A connection waiting for a place when the listener closes.
	held, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	io.WriteString(held, "GET / HTTP/1.1\r\n") // never finishes its headers
	waiting, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()
	time.Sleep(100 * time.Millisecond) // let Accept take it and wait (if it does not, Close is tested anyway)
	// The Accept this wakes makes Serve return, and Serve closes its
	// listener too: whichever close comes second finds it closed.
	if err := lc.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after the listener closed")
	}
	hs.Close()
}
