package postgres_test

import (
	"context"
	"log"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/postgres"
)

// The PostgreSQL snippet of docs/stores.md: a store on its own pool, and a charge
// inside the application's own transaction, which a rollback undoes. It
// needs a server, so it is compiled but not run.
func Example() {
	ctx := context.Background()
	perUser := sluice.MustLimit(sluice.Spec{Name: "per-user", TokensPerSecond: 10, Burst: 50})

	store, err := postgres.Open(ctx, "postgres://app@db/app", postgres.Options{Migrate: true})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	lim := sluice.New(store)
	if d, err := lim.Take(ctx, sluice.Request{Limit: perUser, Key: "user-42"}); err == nil && !d.Allowed {
		log.Println("retry after", d.RetryAfter)
	}

	// Inside the application's own transaction: a rollback undoes the charge.
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	d, err := sluice.New(store.WithTx(tx)).Take(ctx, sluice.Request{Limit: perUser, Key: "user-42"})
	if err != nil || !d.Allowed {
		return // the deferred rollback undoes the work, and the charge with it
	}
	// ... the work the limit guards, in tx ...
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
