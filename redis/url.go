package redis

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/internal/defaults"
)

// Open connects to the Redis that rawURL names and returns a Store that
// owns the connection (Close closes it). Accepted forms:
//
//	redis://[user:password@]host:port[/db][?timeout=250ms&dial_timeout=1s]
//	rediss://...                             the same over TLS
//	redis+sentinel://[user:password@]host:port,host:port/master[/db][?...]
//	redis+cluster://[user:password@]host:port,host:port[?...]
//
// timeout sets Options.Timeout and key_prefix Options.KeyPrefix when the
// options leave them zero, as batch_writers does Options.BatchWriters;
// overlimit_cache=0 sets NoOverLimitCache and batch=0 sets NoBatch. The
// other query parameters are rueidis's (dial_timeout, write_timeout,
// client_name, skip_verify for rediss, ...).
func Open(rawURL string, opts Options) (*Store, error) {
	co, timeout, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	defaults.Set(&opts.Timeout, timeout)
	if err := switches(rawURL, &opts); err != nil {
		return nil, err
	}
	if opts.TLSConfig != nil {
		if co.TLSConfig == nil {
			return nil, fmt.Errorf("redis store url %s: Options.TLSConfig needs a rediss:// URL", redact(rawURL))
		}
		cfg := opts.TLSConfig.Clone()
		cfg.ServerName = cmp.Or(cfg.ServerName, co.TLSConfig.ServerName)
		co.TLSConfig = cfg
	}
	client, err := rueidis.NewClient(co)
	if err != nil {
		return nil, fmt.Errorf("redis store %s: %w", redact(rawURL), err)
	}
	s, err := New(client, opts)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// CheckURL reports what Open would refuse in rawURL without connecting:
// its form, its parameters and a key prefix that would make a hash tag.
func CheckURL(rawURL string) error {
	if _, _, err := ParseURL(rawURL); err != nil {
		return err
	}
	var opts Options
	if err := switches(rawURL, &opts); err != nil {
		return err
	}
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return fmt.Errorf("redis store url %s: key_prefix %q: braces would make a hash tag", redact(rawURL), opts.KeyPrefix)
	}
	return nil
}

// ParseURL turns a store URL into rueidis options and the per-call
// timeout it asks for (zero if none).
func ParseURL(rawURL string) (rueidis.ClientOption, time.Duration, error) {
	var co rueidis.ClientOption
	bad := func(format string, a ...any) (rueidis.ClientOption, time.Duration, error) {
		return co, 0, fmt.Errorf("redis store url %s: %s", redact(rawURL), fmt.Sprintf(format, a...))
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return bad("want scheme://host:port")
	}
	var hosts []string
	var master string
	plain := rawURL
	switch scheme {
	case "redis", "rediss":
	case "redis+cluster", "redis+sentinel":
		// Several hosts: rueidis and net/url take one, so split them off.
		auth, tail := rest, ""
		if i := strings.IndexAny(rest, "/?"); i >= 0 {
			auth, tail = rest[:i], rest[i:]
		}
		userinfo := ""
		if i := strings.LastIndex(auth, "@"); i >= 0 {
			userinfo, auth = auth[:i+1], auth[i+1:]
		}
		defPort := "6379"
		if scheme == "redis+sentinel" {
			defPort = "26379"
			path, query, _ := strings.Cut(tail, "?")
			parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
			if parts[0] == "" {
				return bad("redis+sentinel needs the master name: redis+sentinel://host:port,host:port/mymaster")
			}
			master = parts[0]
			tail = "/" + strings.Join(parts[1:], "/")
			if tail == "/" {
				tail = ""
			}
			if query != "" {
				tail += "?" + query
			}
		}
		for h := range strings.SplitSeq(auth, ",") {
			if h == "" {
				continue
			}
			if _, _, err := net.SplitHostPort(h); err != nil {
				h = net.JoinHostPort(h, defPort)
			}
			hosts = append(hosts, h)
		}
		if len(hosts) == 0 {
			return bad("no host")
		}
		plain = "redis://" + userinfo + hosts[0] + tail
	default:
		return bad("unknown scheme %q (want redis, rediss, redis+sentinel or redis+cluster)", scheme)
	}
	u, err := url.Parse(plain)
	if err != nil {
		return bad("%v", err.(*url.Error).Err) // not the error itself: it repeats the URL, password and all
	}
	var timeout time.Duration
	if v := u.Query().Get("timeout"); v != "" {
		if timeout, err = time.ParseDuration(v); err != nil || timeout <= 0 {
			return bad("timeout %q is not a positive duration", v)
		}
	}
	co, err = rueidis.ParseURL(plain)
	if err != nil {
		return bad("%v", err)
	}
	if hosts != nil {
		co.InitAddress = hosts
	}
	if master != "" {
		co.Sentinel.MasterSet = master
		co.Sentinel.Username, co.Sentinel.Password = co.Username, co.Password
	}
	// Client-side caching is of no use to scripts that write on every call.
	co.DisableCache = true
	co.Dialer.Timeout = cmp.Or(co.Dialer.Timeout, time.Second)
	// Also how long a silent connection (a dead primary) takes to be
	// given up on.
	co.ConnWriteTimeout = cmp.Or(co.ConnWriteTimeout, time.Second)
	return co, timeout, nil
}

// redact hides the password of a URL for error messages.
func redact(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	auth := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		auth = rest[:i]
	}
	i := strings.LastIndex(auth, "@")
	if i < 0 {
		return rawURL
	}
	user, _, hasPass := strings.Cut(auth[:i], ":")
	if !hasPass {
		return rawURL
	}
	return scheme + "://" + user + ":xxxxx" + rest[i:]
}

// switches reads the store's own on/off query parameters.
func switches(rawURL string, opts *Options) error {
	_, query, _ := strings.Cut(rawURL, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return fmt.Errorf("redis store url %s: %v", redact(rawURL), err)
	}
	if v := q.Get("key_prefix"); v != "" && opts.KeyPrefix == "" {
		opts.KeyPrefix = v
	}
	if v := q.Get("batch_writers"); v != "" && opts.BatchWriters == 0 {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			return fmt.Errorf("redis store url %s: batch_writers must be 1 to 64, got %q", redact(rawURL), v)
		}
		opts.BatchWriters = n
	}
	for name, off := range map[string]*bool{"overlimit_cache": &opts.NoOverLimitCache, "batch": &opts.NoBatch} {
		switch v := q.Get(name); v {
		case "":
		case "0", "false":
			*off = true
		case "1", "true":
			*off = false
		default:
			return fmt.Errorf("redis store url %s: %s must be 0 or 1, got %q", redact(rawURL), name, v)
		}
	}
	return nil
}
