package memory

import (
	"fmt"
	"net/url"
	"strconv"
)

// Open returns a new Store configured by a store URL:
//
//	memory://[?max_keys=N]
//
// max_keys sets Options.MaxKeys. Any other parameter is an error, so that
// a misspelt bound is not silently the default.
func Open(rawURL string) (*Store, error) {
	opts, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return New(opts), nil
}

// ParseURL returns the Options a memory:// store URL asks for (see Open).
func ParseURL(rawURL string) (Options, error) {
	var opts Options
	u, err := url.Parse(rawURL)
	if err != nil {
		return opts, fmt.Errorf("memory store url %q: %v", rawURL, err)
	}
	if u.Scheme != "memory" {
		return opts, fmt.Errorf("memory store url %q: want memory://", rawURL)
	}
	for name, vs := range u.Query() {
		switch v := vs[len(vs)-1]; name {
		case "max_keys":
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return opts, fmt.Errorf("memory store url %q: max_keys %q is not a positive whole number", rawURL, v)
			}
			opts.MaxKeys = n
		default:
			return opts, fmt.Errorf("memory store url %q: unknown parameter %q (known: max_keys)", rawURL, name)
		}
	}
	return opts, nil
}
