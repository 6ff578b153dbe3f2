package httpgate_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/serverconf"
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
	lim := serverconf.DefaultServerLimits
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

// Many clients, each leaving its keep-alive connection idle after two
// requests and then opening a new one, against a cap of 2 and an idle
// timeout of an hour: every new connection needs an idle one closed for
// it, by the search when it arrives or by Track when one turns idle. A
// place missed by both would leave a client waiting for the hour; every
// request must be answered. Nothing here depends on speed: the bound is
// a deadlock's, not a time.
func TestConnLimiterChurnNeverStalls(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lc := httpgate.LimitConns(ln, 2)
	lim := serverconf.DefaultServerLimits
	lim.IdleTimeout = time.Hour
	hs := httpgate.APIServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), lim, lc)
	go hs.Serve(lc)
	defer hs.Close()
	url := "http://" + ln.Addr().String() + "/"

	const clients, rounds = 8, 25
	errs := make(chan error, clients)
	for range clients {
		go func() {
			for range rounds {
				tr := &http.Transport{MaxIdleConnsPerHost: 1}
				c := &http.Client{Transport: tr}
				for range 2 {
					resp, err := c.Get(url)
					if err != nil {
						// An idle connection closed for another can lose a
						// request sent on it at that moment: once again, on
						// a new connection, as clients do.
						resp, err = c.Get(url)
					}
					if err != nil {
						errs <- err
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				defer tr.CloseIdleConnections()
			}
			errs <- nil
		}()
	}
	for range clients {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("a client still waits for a place after 2 minutes: a waiting connection missed an idle one")
		}
	}
}

// BenchmarkConnLimiterTrack is the hook's cost per request (a connection
// turning active, then idle), each goroutine on connections of its own as
// a server's are: what a connection cap adds to every request.
func BenchmarkConnLimiterTrack(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	lc := httpgate.LimitConns(ln, 1024)
	const conns = 256
	held := make(chan net.Conn, conns)
	go func() {
		for range conns {
			c, err := lc.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	var cs []net.Conn
	for range conns {
		d, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer d.Close()
		cs = append(cs, <-held)
	}
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1))
		for pb.Next() {
			c := cs[i%conns]
			lc.Track(c, http.StateActive)
			lc.Track(c, http.StateIdle)
			i += 7
		}
	})
}
