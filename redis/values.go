package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
)

// Small values every process of a fleet shares besides bucket state: the
// adaptive rates (package adaptive's Values). Each is one string key,
// read with GET and written with a compare-and-swap script, so that two
// processes stepping the same rate at once never both win.

// casScript sets KEYS[1] to ARGV[2] with a TTL of ARGV[3] milliseconds if
// it holds ARGV[1] (or, for "", nothing), and returns 1; else 0.
var casScript = rueidis.NewLuaScript(`
local cur = redis.call('GET', KEYS[1])
if (cur == false and ARGV[1] == '') or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
`)

// LoadValue returns the value kept under key (after Options.KeyPrefix);
// ok is false when there is none.
func (s *Store) LoadValue(ctx context.Context, key string) (string, bool, error) {
	k := s.prefix + key
	var v string
	found := true
	err := s.call(ctx, k, func(ctx context.Context) (err error) {
		v, err = s.client.Do(ctx, s.client.B().Get().Key(k).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			found = false
			return nil
		}
		return err
	})
	if err != nil {
		return "", false, fmt.Errorf("redis get %q: %w", k, err)
	}
	return v, found, nil
}

// CompareAndSwapValue stores value under key, to expire after ttl, if
// the key still holds old ("" for no key), and reports whether it did.
func (s *Store) CompareAndSwapValue(ctx context.Context, key, old, value string, ttl time.Duration) (bool, error) {
	k := s.prefix + key
	if value == "" {
		return false, errors.New("redis compare-and-swap: an empty value reads as no value")
	}
	ms := strconv.FormatInt(max(1, ttl.Milliseconds()), 10)
	var n int64
	err := s.call(ctx, k, func(ctx context.Context) (err error) {
		n, err = casScript.Exec(ctx, s.client, []string{k}, []string{old, value, ms}).AsInt64()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("redis compare-and-swap %q: %w", k, err)
	}
	return n == 1, nil
}
