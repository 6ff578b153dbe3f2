package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/serverconf"
)

// runSettings are the settings serve runs with: the config file's
// server settings, with the addresses its flags override, remembering
// which, and the policy's settings that serve reads when it starts.
type runSettings struct {
	serverconf.Settings
	// pol is the policy's settings (the audit log, the tokens).
	pol policy.Settings
	// fromFlag holds the settings a flag gave ("listen", "grpc_listen").
	fromFlag map[string]bool
	// ready, when set, is asked by /readyz (the xDS client's Ready).
	ready func() error
	// healthy, when set, is asked by /healthcheck (the xDS client's
	// Healthy).
	healthy func() error
}

// fileSettings are the settings of a config file: its server's, and its
// policy's.
func fileSettings(srv serverconf.Settings, p *policy.Policy) runSettings {
	return runSettings{Settings: srv, pol: p.Settings}
}

// withFlags applies serve's address flags to a config file's settings.
func withFlags(rs runSettings, f serveFlags) runSettings {
	rs.fromFlag = map[string]bool{}
	if f.listen != "" {
		rs.Listen = f.listen
		rs.fromFlag["listen"] = true
		if rs.GRPCListenDerived {
			rs.GRPCListen = serverconf.DefaultGRPCListen(rs.Listen) // private when the API is
		}
	}
	if f.proxyListen != "" {
		rs.ProxyListen = f.proxyListen
		rs.fromFlag["proxy.listen"] = true
	}
	if f.apiListen != "" {
		rs.APIListen = f.apiListen
		rs.fromFlag["api_listen"] = true
	}
	switch f.grpcListen {
	case "":
	case "off":
		rs.GRPCListen = ""
		rs.fromFlag["grpc_listen"] = true
	default:
		rs.GRPCListen = f.grpcListen
		rs.fromFlag["grpc_listen"] = true
	}
	if f.drainSet {
		rs.Server.ShutdownDrain = f.shutdownDrain
	}
	return rs
}

// listener is one address serve listens on.
type listener struct {
	name    string // in the log: api, auth, proxy, envoy-rls
	setting string // the policy's field
	flag    string // the serve flag that overrides it
	addr    string
	// off says how to turn the listener off, when it can be.
	off string
}

// listeners are the addresses serve listens on, in the order it binds
// them: forward auth and the decision API (together on listen, or the
// API on api_listen), the proxy, the Envoy service.
func (rs runSettings) listeners() []listener {
	var ls []listener
	if rs.APIListen == "" {
		ls = append(ls, listener{"api", "listen", "--listen", rs.Listen, ""})
	} else {
		ls = append(ls, listener{"auth", "listen", "--listen", rs.Listen, ""},
			listener{"api", "api_listen", "--api-listen", rs.APIListen, ""})
	}
	if rs.ProxyUpstream != "" {
		ls = append(ls, listener{"proxy", "proxy.listen", "--proxy-listen", rs.ProxyListen, ""})
	}
	if rs.GRPCListen != "" {
		ls = append(ls, listener{"envoy-rls", "grpc_listen", "--grpc-listen", rs.GRPCListen, `, or "" / off to turn the Envoy service off`})
	}
	return ls
}

// origin names where a listener's address came from, for messages.
func (rs runSettings) origin(l listener) string {
	switch {
	case rs.fromFlag[l.setting]:
		return l.flag
	case l.setting == "grpc_listen" && rs.GRPCListenDerived:
		return "grpc_listen (by default listen's host, port " + serverconf.DefaultGRPCPort + ")"
	}
	return l.setting
}

// preflight lists what serve would refuse in settings that loaded, short
// of a store that does not answer (serve starts without it) and a port
// another process holds (known only when binding): every listener's
// address, the store URL, the audit log's file. sluice check runs it on
// every file, and serve before it opens anything, so that check passes
// exactly the files that serve starts with. source names the file.
func preflight(source string, rs runSettings) error {
	var errs []error
	bad := func(path, format string, a ...any) {
		errs = append(errs, &policy.Error{File: source, Path: path, Msg: fmt.Sprintf(format, a...)})
	}
	for _, l := range rs.listeners() {
		msg := serverconf.CheckListen(l.addr)
		switch {
		case msg == "":
		case rs.fromFlag[l.setting]:
			errs = append(errs, &policy.Error{Path: l.flag, Msg: msg})
		default:
			bad(l.setting, "%s", msg)
		}
	}
	if err := checkStoreURL(rs.StoreURL); err != nil {
		bad("store.url", "%v", err)
	}
	if rs.pol.AuditLog != "" {
		if msg := checkAuditLog(rs.pol.AuditLog); msg != "" {
			bad("audit_log", "%s", msg)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return &policy.Errors{List: errs}
}

// checkAuditLog says what would stop serve from appending to the audit
// log at path ("" when nothing would), without creating it: an existing
// file must be a writable regular file, and a new one's directory must
// exist and be writable. A relative path is taken from the working
// directory, where serve opens it.
func checkAuditLog(path string) string {
	fi, err := os.Stat(path)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return fmt.Sprintf("%s is not a regular file", path)
	case err == nil:
		if err := syscall.Access(path, 2); err != nil { // W_OK
			return fmt.Sprintf("%s is not writable by this user (uid %d): %v", path, os.Getuid(), err)
		}
		return ""
	case !errors.Is(err, fs.ErrNotExist):
		return err.Error()
	}
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("directory %s does not exist: create it, writable by the user sluice runs as, or choose another path", dir)
	case err != nil:
		return err.Error()
	case !di.IsDir():
		return fmt.Sprintf("%s is not a directory", dir)
	}
	if err := syscall.Access(dir, 2|1); err != nil { // W_OK|X_OK: create the file in it
		return fmt.Sprintf("directory %s is not writable by this user (uid %d), so %s cannot be created: %v", dir, os.Getuid(), filepath.Base(path), err)
	}
	return ""
}

// bind listens on every address of rs before serve serves on any, so
// that serve either holds all of them or exits having announced none.
// An address that cannot be bound is an error naming the setting or flag
// it came from and how to change it.
func bind(rs runSettings) (map[string]net.Listener, error) {
	lns := map[string]net.Listener{}
	for _, l := range rs.listeners() {
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return nil, fmt.Errorf("%s %s: %s (set %s or %s to another address%s)", rs.origin(l), l.addr, bindReason(err), l.setting, l.flag, l.off)
		}
		lns[l.name] = ln
	}
	return lns, nil
}

// bindReason is the system's reason a listen failed ("address already in
// use"), without the wrapping that repeats the address.
func bindReason(err error) string {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err.Error()
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}
