package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// slowConns opens n connections to addr and sends each only what the
// attack sends: a request cut short in its headers or in its body.
func slowConns(t *testing.T, addr, partial string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < n; i++ {
		c, err := dialFrom(i).Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i, n, err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, partial); err != nil {
			t.Fatalf("connection %d of %d: %v", i, n, err)
		}
	}
	return conns
}

// dialFrom dials from one of 64 loopback addresses, the i-th: many
// connections spread over them stay within server.max_conns_per_client.
func dialFrom(i int) *net.Dialer {
	return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%64))}}
}

// closedByServer waits, at most until deadline, for the server to close
// each connection, and returns the first status line it sent ("" when it
// closed without an answer). A connection still open at the deadline is
// the attack succeeding.
func closedByServer(t *testing.T, what string, conns []net.Conn, deadline time.Time) []string {
	status := make([]string, len(conns))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open int
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(deadline)
			br := bufio.NewReader(c)
			line, _ := br.ReadString('\n')
			status[i] = strings.TrimSpace(line)
			_, err := io.Copy(io.Discard, br)
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				mu.Lock()
				open++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if open > 0 {
		t.Errorf("%s: %d of %d connections still open at %s", what, open, len(conns), deadline.Format(time.TimeOnly))
	}
	return status
}

// openFiles returns the soft limit on open files; tests that hold many
// connections size themselves to it.
func openFiles(t *testing.T) int {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	return int(min(rl.Cur, 1<<20))
}

// Attack: slowloris, headers and bodies. Hundreds of connections send part
// of their headers, or headers with Content-Length: 100 and one byte of
// body, and stop. Request bodies had no read deadline, so such connections
// were held for as long as the client liked (600 of them exhausted the
// process's file descriptors). Now, while they are held, normal requests
// are answered on the decision API and through the reverse proxy, and the
// server closes every slow connection once read_header_timeout or
// read_timeout passes: a decision API body that never arrives gets a 408.
func TestAttackSlowConnectionsAreCut(t *testing.T) {
	// Both ends of every connection live in this process, plus the
	// proxy's connections to the upstream.
	apiN, proxyN := 300, 100
	if fds := openFiles(t); fds < 2400 {
		apiN, proxyN = (fds-400)/8, (fds-400)/24
		t.Logf("open file limit %d: holding %d+%d connections on the API, %d+%d on the proxy", fds, apiN, apiN, proxyN, proxyN)
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "app")
	}))
	t.Cleanup(app.Close)
	cfg := writePolicy(t, `
server:
  read_header_timeout: 2s
  read_timeout: 2s
  write_timeout: 10s
  idle_timeout: 1m
  max_conns: 4000
proxy:
  listen: 127.0.0.1:0
  upstream: `+app.URL+`
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 10000, burst: 10000}
`)
	l, _ := startServe(t, "--config", cfg)

	start := time.Now()
	held := map[string][]net.Conn{
		"api, slow headers":   slowConns(t, l.API, "POST /v1/take HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n", apiN),
		"api, slow body":      slowConns(t, l.API, "POST /v1/take HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", apiN),
		"proxy, slow headers": slowConns(t, l.Proxy, "GET / HTTP/1.1\r\nHost: app\r\nX-Slow: ", proxyN),
		"proxy, slow body":    slowConns(t, l.Proxy, "POST /upload HTTP/1.1\r\nHost: app\r\nContent-Length: 100\r\n\r\nx", proxyN),
	}
	t.Logf("%d slow connections open after %v", 2*apiN+2*proxyN, time.Since(start).Round(time.Millisecond))

	// Normal requests are answered while the slow ones are held.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := 0; i < 10; i++ {
		resp, err := client.Post("http://"+l.API+"/v1/take", "application/json", strings.NewReader(`{"rule":"per-ip","key":"normal"}`))
		if err != nil {
			t.Fatalf("normal take %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("normal take %d: %d", i, resp.StatusCode)
		}
		resp, err = client.Post("http://"+l.Proxy+"/upload", "text/plain", strings.NewReader("hello"))
		if err != nil {
			t.Fatalf("normal proxied request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "app" {
			t.Fatalf("normal proxied request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	t.Logf("normal requests answered %v after the attack began", time.Since(start).Round(time.Millisecond))

	// Every slow connection is closed by the server: the bound is
	// generous, the timeouts are 2s.
	deadline := start.Add(60 * time.Second)
	var wg sync.WaitGroup
	for what, conns := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status := closedByServer(t, what, conns, deadline)
			if what == "api, slow body" {
				for i, s := range status {
					if !strings.HasPrefix(s, "HTTP/1.1 408 ") {
						t.Errorf("%s, connection %d: %q, want a 408", what, i, s)
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("slow connections closed %v after the attack began", time.Since(start).Round(time.Millisecond))
}

// connCapPolicy is a policy whose listeners hold max connections, with
// every deadline an hour away, so that only the cap closes one.
func connCapPolicy(t *testing.T, max int) string {
	return writePolicy(t, fmt.Sprintf(`
server:
  read_header_timeout: 1h
  read_timeout: 1h
  idle_timeout: 1h
  max_conns: %d
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 10000, burst: 10000}
`, max))
}

// Attack: more connections than the process can hold. Each listener holds
// at most server.max_conns: at the cap, a new connection waits for a
// place; one frees when a held connection closes, and an idle keep-alive
// connection gives its place up at once.
func TestAttackConnectionCap(t *testing.T) {
	const max = 8
	cfg := connCapPolicy(t, max)
	l, _ := startServe(t, "--config", cfg)
	// Each new client dials from an address of its own, so that
	// max_conns_per_client never closes it, whatever the server has yet to
	// notice of the connections closed before it.
	get := func(from int) chan error {
		done := make(chan error, 1)
		go func() {
			c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dialFrom(from).DialContext}}
			resp, err := c.Get("http://" + l.API + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			done <- err
		}()
		return done
	}

	// The cap held by connections that never finish their headers: a
	// new request waits...
	held := slowConns(t, l.API, "GET /healthz HTTP/1.1\r\n", max)
	done := get(max)
	select {
	case err := <-done:
		t.Fatalf("answered past the cap of %d held connections (err %v)", max, err)
	case <-time.After(300 * time.Millisecond):
		// Still waiting, as it should (a slow machine can only make
		// this check pass, never fail).
	}
	// ...and is answered as soon as one of them goes away.
	held[0].Close()
	if err := <-done; err != nil {
		t.Fatalf("after a held connection closed: %v", err)
	}
	for _, c := range held[1:] {
		c.Close()
	}

	// The cap held by idle keep-alive connections: a new client is
	// answered at once, an idle one closed for it.
	idle := make([]net.Conn, max)
	for i := range idle {
		c, err := dialFrom(i).Dial("tcp", l.API)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		req, _ := http.NewRequest("GET", "http://"+l.API+"/healthz", nil)
		req.Write(c)
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			t.Fatalf("keep-alive connection %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		idle[i] = c
	}
	if err := <-get(max + 1); err != nil {
		t.Fatalf("with %d idle connections at the cap: %v", max, err)
	}
}

// Attack: one client holds every place. A single host opens max_conns
// connections and never finishes a request on any of them, and again as
// each is cut at read_header_timeout: every other client waited for a
// place, served by nobody, without the attacker sending one valid
// request. Now a client (an address, an IPv6 client's prefix) outside
// trusted_proxies holds at most max_conns_per_client (a quarter of the
// cap by default), and its connections beyond are closed at once.
func TestAttackOneClientHoldsEveryConnection(t *testing.T) {
	const max = 8
	cfg := connCapPolicy(t, max)
	l, _ := startServe(t, "--config", cfg)
	var held []net.Conn
	for i := 0; i < max; i++ {
		c, err := net.Dial("tcp", l.API)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET /healthz HTTP/1.1\r\n") // a connection closed already may refuse it
		held = append(held, c)
	}
	other := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: dialFrom(1).DialContext, DisableKeepAlives: true}}
	resp, err := other.Get("http://" + l.API + "/healthz")
	if err != nil {
		t.Fatalf("another client, while one holds %d connections without a request: %v", max, err)
	}
	resp.Body.Close()
	closedByServer(t, "the holder's connections beyond its share", held[max/4:], time.Now().Add(30*time.Second))
}

// Attack: the decision API served wherever forward auth is. With
// api_listen, the listener facing the front proxy answers forward auth and
// health only; /v1/take, /v1/peek, /v1/reset and /metrics are on the
// decision API's own listener, which serves no forward auth, and with
// api_token_env a take without the token drains nothing.
func TestAttackDecisionAPIListenerApart(t *testing.T) {
	const token = "api-token-0123456789abcdef"
	t.Setenv("SLUICE_SERVE_API_TOKEN", token)
	t.Setenv("SLUICE_SERVE_ADMIN_TOKEN", "admin-token-0123456789")
	cfg := writePolicy(t, `
api_listen: 127.0.0.1:0
api_token_env: SLUICE_SERVE_API_TOKEN
admin_token_env: SLUICE_SERVE_ADMIN_TOKEN
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rate: 2, period: 1h}
`)
	l, logs := startServe(t, "--config", cfg)
	if l.Decision == "" || l.Decision == l.API || !strings.Contains(logs.String(), "server=auth") {
		t.Fatalf("listeners %+v:\n%s", l, logs.String())
	}
	do := func(method, addr, path, body string, hdr ...string) int {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	drain := `{"rule":"per-ip","key":"127.0.0.1","cost":2}`
	bearer := []string{"Authorization", "Bearer " + token}
	for _, c := range []struct {
		method, addr, path string
		hdr                []string
		want               int
	}{
		{"POST", l.API, "/v1/take", bearer, 404},
		{"POST", l.API, "/v1/peek", bearer, 404},
		{"POST", l.API, "/v1/reset", []string{"Authorization", "Bearer admin-token-0123456789"}, 404},
		{"GET", l.API, "/metrics", nil, 404},
		{"GET", l.Decision, "/v1/auth", []string{"X-Sluice-Token", token}, 404},
		{"POST", l.Decision, "/v1/take", nil, 401},
		{"POST", l.Decision, "/v1/take", []string{"Authorization", "Bearer wrong"}, 401},
		{"GET", l.API, "/v1/auth", nil, 401},
		{"GET", l.API, "/healthz", nil, 200},
		{"GET", l.Decision, "/readyz", nil, 200},
		{"GET", l.Decision, "/metrics", nil, 200},
	} {
		if got := do(c.method, c.addr, c.path, drain, c.hdr...); got != c.want {
			t.Errorf("%s %s on %s: %d, want %d", c.method, c.path, c.addr, got, c.want)
		}
	}
	// Nothing above charged the victim (127.0.0.1, 2 per hour).
	for i := 0; i < 2; i++ {
		if got := do("GET", l.API, "/v1/auth", "", "X-Sluice-Token", token); got != 200 {
			t.Fatalf("victim's request %d: %d", i, got)
		}
	}
	if got := do("POST", l.Decision, "/v1/peek", `{"rule":"per-ip","key":"10.0.0.1"}`, bearer...); got != 200 {
		t.Errorf("peek with the token: %d", got)
	}
}

// The reverse proxy's deadlines bound each wait for the client, not the
// whole exchange: a body sent in pieces and a response streamed with
// pauses, each longer in all than read_timeout and write_timeout, go
// through, as does a quiet websocket; a client that stops reading is cut
// off, and the upstream sees the request end. The upload's pieces come
// 100ms apart against a read_timeout of 3s, so that a writer a loaded
// machine pauses still sends each in time; the pauses that must outlast
// a deadline can only grow.
func TestProxyDeadlinesBoundStalls(t *testing.T) {
	upstreamGone := make(chan struct{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "got %d bytes", len(b))
		case "/events":
			// Pauses longer than write_timeout: before a write, and
			// before the end of the body, which net/http writes after
			// the handler.
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			time.Sleep(1200 * time.Millisecond)
			io.WriteString(w, "b")
			w.(http.Flusher).Flush()
			time.Sleep(1200 * time.Millisecond)
		case "/ws":
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			io.Copy(conn, brw)
		case "/flood":
			defer close(upstreamGone)
			chunk := make([]byte, 64<<10)
			for {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(app.Close)
	cfg := writePolicy(t, `
server:
  read_header_timeout: 1s
  read_timeout: 3s
  write_timeout: 1s
proxy:
  listen: 127.0.0.1:0
  upstream: `+app.URL+`
rules:
  - name: per-ip
    limit_keys: ["ip:address"]
    algorithm_config: {rps: 10000, burst: 10000}
`)
	l, _ := startServe(t, "--config", cfg)

	// An upgraded connection may stay quiet longer than every timeout: it
	// stays quiet while the upload and the stream below go through.
	ws, err := net.Dial("tcp", l.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(time.Minute))
	io.WriteString(ws, "GET /ws HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	wr := bufio.NewReader(ws)
	if r, err := http.ReadResponse(wr, nil); err != nil || r.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", r, err)
	}
	quietSince := time.Now()

	// An upload in 40 pieces, 100ms apart: 4s in all.
	pr, pw := io.Pipe()
	go func() {
		for i := 0; i < 40; i++ {
			pw.Write([]byte("0123456789"))
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
	}()
	resp, err := http.Post("http://"+l.Proxy+"/upload", "text/plain", pr)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "got 400 bytes" {
		t.Errorf("slow but steady upload: %d %q", resp.StatusCode, body)
	}

	// A stream with a pause longer than write_timeout arrives whole.
	resp, err = http.Get("http://" + l.Proxy + "/events")
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != "ab" {
		t.Errorf("stream: %q, %v", body, err)
	}

	if quiet := time.Since(quietSince); quiet < 3200*time.Millisecond {
		time.Sleep(3200*time.Millisecond - quiet)
	}
	io.WriteString(ws, "ping\n")
	if echo, err := wr.ReadString('\n'); err != nil || echo != "ping\n" {
		t.Errorf("echo after a quiet spell: %q %v", echo, err)
	}

	// A client that never reads its response.
	c, err := net.Dial("tcp", l.Proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /flood HTTP/1.1\r\nHost: app\r\n\r\n")
	select {
	case <-upstreamGone:
	case <-time.After(60 * time.Second):
		t.Fatal("the proxy kept writing to a client that does not read")
	}
}

func TestMaxConns(t *testing.T) {
	for _, c := range []struct {
		set    int
		nofile uint64
		n      int
		want   int
	}{
		{0, 1 << 20, 1, 10000},
		{0, 20000, 3, 5000},
		{0, 1024, 1, 768},
		{0, 1024, 2, 384},
		{0, 0, 2, 10000}, // limit unknown
		{0, 10, 1, 16},
		{50, 1024, 3, 50},
	} {
		if got := maxConns(c.set, c.nofile, c.n); got != c.want {
			t.Errorf("maxConns(%d, %d, %d) = %d, want %d", c.set, c.nofile, c.n, got, c.want)
		}
	}
}

// A request held for its reserved turn (a leaky bucket shaping forward
// auth) is answered even when the turn comes after write_timeout: the
// write deadline counts from the turn, not from the request's arrival.
func TestReservedWaitOutlivesWriteTimeout(t *testing.T) {
	cfg := writePolicy(t, `
server:
  write_timeout: 1s
rules:
  - name: shaped
    algorithm: leaky_bucket
    algorithm_config: {rate: 2, period: 3s, max_delay: 10s}
`)
	l, _ := startServe(t, "--config", cfg)
	start := time.Now()
	for i := 0; i < 2; i++ {
		resp, err := http.Get("http://" + l.API + "/v1/auth")
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	// The second request waited for its slot, 1.5s after the first.
	if d := time.Since(start); d < 1400*time.Millisecond {
		t.Errorf("two requests of a 1-per-1.5s leaky bucket took %v", d)
	}
}
