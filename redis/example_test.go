package redis_test

import (
	"context"
	"log"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redis"
)

// A fleet of processes shares one limit through one Redis (or a Cluster:
// redis+cluster://host:port,host:port). It needs a server, so it is
// compiled but not run.
func Example() {
	store, err := redis.Open("redis://app:secret@10.0.0.5:6379/0", redis.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	lim := sluice.New(store)

	perUser := sluice.MustLimit(sluice.Spec{Name: "per-user", TokensPerSecond: 1, Burst: 5})
	d, err := lim.Take(context.Background(), sluice.Request{Limit: perUser, Key: "alice"})
	if err != nil {
		// The store failed (or the cost can never succeed): decide as the
		// rule's on_store_error would, here by failing open.
		log.Print(err)
		return
	}
	log.Println(d.Allowed, d.Remaining)
}
