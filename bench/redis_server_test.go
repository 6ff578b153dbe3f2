package bench

import (
	"context"
	"fmt"
	"os"
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
	b.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(fmt.Errorf("INFO cpu %s: %w", k, err))
			}
			total += f
		}
	}
	return total
}
