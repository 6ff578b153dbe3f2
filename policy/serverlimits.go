package policy

import (
	"time"

	"gopkg.in/yaml.v3"
)

var serverFields = []string{"read_header_timeout", "read_timeout", "write_timeout", "idle_timeout", "max_header_bytes", "max_conns", "shutdown_drain"}

// MaxShutdownDrain bounds server.shutdown_drain: a process told to stop
// must stop within a bound an orchestrator can wait for.
const MaxShutdownDrain = 10 * time.Minute

// serverLimits reads the server section into s, which holds the defaults.
// Zero would mean "no deadline" to net/http, so every timeout must be
// positive: a listener without deadlines is what slow clients exploit.
func (l *loader) serverLimits(n *yaml.Node, s *ServerLimits) {
	o := l.object(n, "server", serverFields)
	if o == nil {
		return
	}
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{
		{"read_header_timeout", &s.ReadHeaderTimeout},
		{"read_timeout", &s.ReadTimeout},
		{"write_timeout", &s.WriteTimeout},
		{"idle_timeout", &s.IdleTimeout},
	} {
		d, dn, ok := o.duration(f.name)
		switch {
		case !ok:
		case d <= 0:
			l.errf(dn, "server."+f.name, "must be > 0 (got %q): a listener without this deadline can be held by a client that never finishes", dn.Value)
		default:
			*f.dst = d
		}
	}
	if v, vn, ok := o.integer("max_header_bytes"); ok {
		if v < 4<<10 || v > 16<<20 {
			l.errf(vn, "server.max_header_bytes", "must be between 4096 and 16777216 (got %d)", v)
		} else {
			s.MaxHeaderBytes = v
		}
	}
	if d, dn, ok := o.duration("shutdown_drain"); ok {
		if d < 0 || d > MaxShutdownDrain {
			l.errf(dn, "server.shutdown_drain", "must be between 0s (no drain) and %v (got %q)", MaxShutdownDrain, dn.Value)
		} else {
			s.ShutdownDrain = d
		}
	}
	if v, vn, ok := o.integer("max_conns"); ok {
		if v < 1 || v > 1<<20 {
			l.errf(vn, "server.max_conns", "must be between 1 and 1048576 (got %d)", v)
		} else {
			s.MaxConns = v
		}
	}
}
