package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// redisAddr starts a private redis-server for the benchmarks (or uses
// SLUICE_REDIS_URL's host:port) and returns its address.
func redisAddr(b *testing.B) string {
	b.Helper()
	if u := os.Getenv("SLUICE_REDIS_URL"); u != "" {
		return strings.TrimPrefix(u, "redis://")
	}
	return redistest.Server(b)
}

// redisCPU returns the server's used CPU (user + system) in seconds, from
// INFO cpu.
func redisCPU(b *testing.B, c *goredis.Client) float64 {
	return redisInfo(b, c, "cpu", "used_cpu_sys", "used_cpu_user")
}

// redisScriptCalls is the number of script calls (EVAL, EVALSHA) the
// server has run: the round trips a limiter makes of Redis, whatever
// client it uses, since each check of sluice and of redis_rate is a
// script (the commands inside a script count apart in INFO).
func redisScriptCalls(b *testing.B, c *goredis.Client) float64 {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "cmdstat_evalsha" && k != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		f, err := strconv.ParseFloat(calls, 64)
		if err != nil {
			b.Fatal(fmt.Errorf("INFO commandstats %s: %w", k, err))
		}
		total += f
	}
	return total
}

// redisInfo is the sum of the fields named of an INFO section.
func redisInfo(b *testing.B, c *goredis.Client, section string, fields ...string) float64 {
	b.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && slices.Contains(fields, k) {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(fmt.Errorf("INFO %s %s: %w", section, k, err))
			}
			total += f
		}
	}
	return total
}
