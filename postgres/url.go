package postgres

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/duration"
)

// URL parameters sluice reads from a store URL and removes before handing
// the rest to pgx (which would send unknown ones to the server as settings).
const (
	paramMigrate      = "sluice_migrate"      // true: apply migrations at start
	paramKeyPrefix    = "sluice_key_prefix"   // Options.KeyPrefix
	paramHousekeeping = "sluice_housekeeping" // Options.HousekeepingInterval, e.g. 30s; 0 disables
	paramViolations   = "sluice_violations"   // true: record rejections in sluice_violations
	paramRules        = "sluice_rules"        // true: serve also loads rules from sluice_rules
	paramTimeout      = "sluice_timeout"      // Options.Timeout, e.g. 150ms
)

// The violation log's settings, with sluice_violations=true.
const (
	paramViolationsRetention = "sluice_violations_retention"  // ViolationOptions.Retention, e.g. 30d; 0 keeps rows for ever
	paramViolationsPerBucket = "sluice_violations_per_bucket" // ViolationOptions.PerBucket, e.g. 10s; 0 records every rejection
)

// URLOptions are the sluice settings found in a store URL.
type URLOptions struct {
	Options
	// LogViolations asks the opener to attach a ViolationLog, with
	// ViolationOptions (Retention and PerBucket, when the URL sets them).
	LogViolations    bool
	ViolationOptions ViolationOptions
	// Rules asks serve to load sluice_rules into its policy.
	Rules bool
}

// SplitURL separates sluice's own parameters (sluice_migrate,
// sluice_key_prefix, sluice_housekeeping, sluice_violations,
// sluice_violations_retention, sluice_violations_per_bucket, sluice_rules,
// sluice_timeout) from a postgres:// URL and returns the URL pgx should
// connect with.
func SplitURL(raw string) (string, URLOptions, error) {
	var o URLOptions
	u, err := url.Parse(raw)
	if err != nil {
		return "", o, fmt.Errorf("postgres url: %w", err.(*url.Error).Err) // not err: it repeats the URL, password and all
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return "", o, fmt.Errorf("postgres url: scheme %q, want postgres or postgresql", u.Scheme)
	}
	q := u.Query()
	for _, b := range []struct {
		name string
		dst  *bool
	}{{paramMigrate, &o.Migrate}, {paramViolations, &o.LogViolations}, {paramRules, &o.Rules}} {
		if v := q.Get(b.name); v != "" {
			if *b.dst, err = strconv.ParseBool(v); err != nil {
				return "", o, fmt.Errorf("postgres url: %s=%q is not true or false", b.name, v)
			}
		}
	}
	o.KeyPrefix = q.Get(paramKeyPrefix)
	// Each turns its setting off with 0, since the options' zero is the
	// default; a retention counts days and weeks (7d, 2w) as sluice
	// violations --since does.
	for _, p := range []struct {
		name  string
		dst   *time.Duration
		parse func(string) (time.Duration, error)
		eg    string
	}{
		{paramHousekeeping, &o.HousekeepingInterval, time.ParseDuration, "30s, 5m"},
		{paramViolationsRetention, &o.ViolationOptions.Retention, duration.Parse, "36h, 7d, 2w"},
		{paramViolationsPerBucket, &o.ViolationOptions.PerBucket, time.ParseDuration, "500ms, 10s, 1m"},
	} {
		if v := q.Get(p.name); v != "" {
			d, err := p.parse(v)
			if err != nil || d < 0 {
				return "", o, fmt.Errorf("postgres url: %s=%q is not a duration >= 0 (%s; 0 turns it off)", p.name, v, p.eg)
			}
			*p.dst = d
			if d == 0 {
				*p.dst = -1
			}
		}
	}
	if v := q.Get(paramTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return "", o, fmt.Errorf("postgres url: %s=%q is not a duration > 0", paramTimeout, v)
		}
		o.Timeout = d
	}
	for _, p := range []string{paramMigrate, paramKeyPrefix, paramHousekeeping, paramViolations, paramViolationsRetention, paramViolationsPerBucket, paramRules, paramTimeout} {
		q.Del(p)
	}
	u.RawQuery = q.Encode()
	return u.String(), o, nil
}

// CheckURL reports what Open (after SplitURL) would refuse in a store
// URL without connecting: sluice's parameters and pgx's settings.
func CheckURL(raw string) error {
	conn, _, err := SplitURL(raw)
	if err != nil {
		return err
	}
	if _, err := pgxpool.ParseConfig(conn); err != nil {
		return fmt.Errorf("postgres url: %w", err)
	}
	return nil
}
