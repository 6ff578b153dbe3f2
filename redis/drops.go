package redis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Every store on one Redis (a fleet of sluice processes) keeps its own
// over-limit cache. A Reset or a refund made through one of them must
// reach the others' caches too, or they would keep rejecting the key until
// the cached RetryAfter, which for a window of an hour is an hour. So the
// store that deletes or refunds a key publishes it on a channel every
// store with a cache subscribes to, and each drops its entry. Delivery
// takes a round trip; while a subscription is down its messages are lost,
// so losing it and making it again each clear the whole cache, which can
// only cost round trips.

// dropChannel is the channel of the stores sharing the key prefix.
func (s *Store) dropChannel() string { return s.prefix + "sluice:overlimit-drops" }

// beforeSubscribe, when set (tests: SetBeforeSubscribe), runs before each
// subscription is asked for; calling waitOver ends New's wait for the
// first, as if it had run past its deadline.
var beforeSubscribe atomic.Pointer[func(waitOver func())]

// subscribeDrops listens on dropChannel until ctx ends, and closes first
// when the first subscription is confirmed or has failed.
func (s *Store) subscribeDrops(ctx context.Context, first chan struct{}) {
	var once sync.Once
	firstDone := func() { once.Do(func() { close(first) }) }
	// Every subscription clears the cache when Redis confirms it, the
	// first included: until then drops are lost, and a store whose first
	// subscription was slower than New's wait for it may already have
	// cached rejections. A take sent before the clear cannot cache its
	// answer after it (the cache's generations).
	hooked := rueidis.WithOnSubscriptionHook(ctx, func(p rueidis.PubSubSubscription) {
		if p.Kind == "subscribe" {
			s.cache.clear()
			firstDone()
		}
	})
	const firstBackoff = 50 * time.Millisecond
	backoff := firstBackoff
	for ctx.Err() == nil {
		if f := beforeSubscribe.Load(); f != nil {
			(*f)(firstDone)
		}
		// A command is recycled by the call that sends it: one per call.
		sub := s.client.B().Subscribe().Channel(s.dropChannel()).Build()
		began := time.Now()
		err := s.client.Receive(hooked, sub, func(m rueidis.PubSubMessage) { s.cache.drop(m.Message) })
		if ctx.Err() != nil {
			return
		}
		// Lost (Redis down, a failover) or refused (an ACL without the
		// channel): cleared, and asked again.
		if errors.Is(err, rueidis.ErrClosing) {
			return // the caller closed the client without closing the store
		}
		s.obs.DropsLost()
		s.cache.clear()
		firstDone()
		if time.Since(began) > time.Minute {
			backoff = firstBackoff // it had been working: a new outage
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// publishDrops tells the stores' caches (this one's included, which is
// harmless) that keys have tokens again, whether or not this store has a
// cache of its own. It is best effort: on failure their entries still end
// at their RetryAfter, as without the channel.
func (s *Store) publishDrops(ctx context.Context, keys ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	cmds := make(rueidis.Commands, 0, len(keys))
	for _, k := range keys {
		cmds = append(cmds, s.client.B().Publish().Channel(s.dropChannel()).Message(k).Build())
	}
	for _, r := range s.client.DoMulti(ctx, cmds...) {
		if r.Error() != nil {
			s.obs.DropsLost()
		}
	}
}
