package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// redisAddr starts a private redis-server for the benchmarks (or uses
// SLUICE_REDIS_URL's host:port) and returns its address.
func redisAddr(b *testing.B) string {
	b.Helper()
	if u := os.Getenv("SLUICE_REDIS_URL"); u != "" {
		return strings.TrimPrefix(u, "redis://")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Skip("redis-server not found")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := b.TempDir()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(port)
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	for i := 0; ; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return addr
		}
		if i > 200 {
			b.Fatal("redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
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
