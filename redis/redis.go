// Package redis is sluice's Redis and Redis Cluster Store: the same
// limits, with the same answers as the memory store, shared by every
// process of a fleet.
//
// # Scripts
//
// Every decision is one Lua script call: the algorithms of the root
// package (TakeTokenBucket, TakeFixedWindow with its hashed WindowOffset,
// TakeSlidingLog) are ported line for line to lua/*.lua, in integers held
// exactly in Lua's doubles (see maxLuaScaled for the one limit that
// imposes), and checked against the same conformance vectors. The script
// reads the time with TIME, so callers whose clocks disagree still agree
// on every bucket; Options.Clock passes the time in instead, for tests.
//
// The script runs with EVALSHA and is sent again with EVAL when Redis
// answers NOSCRIPT (after a restart, a failover or SCRIPT FLUSH), which
// rueidis.Lua does. Redis 7 functions (FCALL) were the alternative; they
// survive restarts, but must be loaded on every primary of a Cluster,
// including a replica just promoted and a node just added, which needs a
// loader that watches the topology. EVALSHA needs nothing: the first call
// to a node without the script loads it, on any topology. The scripts
// need Redis 3.2 or newer (effects replication, since they read TIME);
// the tests run on 7.0: standalone, Cluster, Sentinel, TLS and ACL users.
//
// # State
//
// A token bucket is 24 bytes (tokens, stamp and rate denominator, packed
// doubles), a fixed window 16, a sliding log 16 per admitted request of
// the last period. Keys are Limit.StorageKey (after Options.KeyPrefix,
// when set), so a hash tag in a request
// key ("{user-42}") puts all of one identity's buckets in one Cluster slot.
// Every write sets a TTL equal to the time until the bucket is full again:
// a full bucket and an absent key give the same answers, so idle keys cost
// nothing. A rejected request writes nothing.
//
// # Refunds
//
// engine.OpRefund runs in the same script (RefundTokenBucket,
// RefundFixedWindow, RefundSlidingLog, ported like the takes): it is
// batched like a take, a refund of an absent key writes nothing, and one
// that fills the bucket deletes the key. It drops the key's over-limit
// cache entry. TakeAll with OpRefund is one script on one Redis, and one
// per slot on a Cluster, where every slot is refunded even if another
// fails: a refund never rejects, so there is nothing to roll back.
//
// # Several limits
//
// TakeAll on one Redis is one script over all its keys: all are charged or
// none. On a Cluster, the keys of one slot go in one script; slots are
// charged one after another in ascending slot order, and when a later slot
// rejects, the earlier ones are refunded (the scaled cost added back,
// capped at full; a sliding log's entry removed; a window's charge taken
// out of the window it counted in, and left in place once that window
// has ended, since a refund after the boundary would give the next
// window the cost again). Until the refund lands,
// about one round trip, the earlier buckets hold a charge that in the end
// was not made: a concurrent request may be rejected that would have
// passed. The error is towards rejecting, never admitting too much. While
// a bucket is in debt (reservations waiting for their turns), a charge is
// refunded only if no charge came after it: a reservation taken meanwhile
// was told a turn that counts it, and refunded from under that turn, the
// charge would let the next reservation take the same turn. Such a charge stays (capacity
// lost until the bucket refills, never turns that bunch); the rollback
// tells each refund where its take left the bucket, and refunds a slot's
// charges last first. To avoid both, give one identity's limits a common
// hash tag. When a slot's call fails instead (an error or a timeout), the earlier slots are
// refunded too and the error returned; that slot's own charge is then
// unknown, as for any timed-out write, and is left as Redis has it.
//
// # Speed
//
// A call that finds no other in flight goes straight to Redis; calls that
// arrive while scripts are in flight are carried together in the next
// script call (see batcher), so Redis's per-call overhead is paid once per
// batch, and a batch reads its keys with one MGET. Rejected keys are
// remembered in process until their RetryAfter (see overLimit). On a
// Cluster a script may only touch one slot, so a batch becomes one script
// call per slot, pipelined in one round. BenchmarkRedis (bench module)
// measures it against redis_rate: bench/README.md#redis-store.
//
// # Failures
//
// Every call carries a deadline (Options.Timeout, from when it is sent).
// Store errors come back
// wrapped and are not input errors (sluice.IsInputError), so the caller
// applies the rule's on_store_error. A circuit breaker fails calls at once
// while Redis is down and lets one probe through per backoff; rueidis
// reconnects by itself, so the store recovers without a restart. A
// Cluster has a breaker per primary (see nodes), so a primary that fails
// fails only its own slots; Store.Ready, what /readyz asks, is the rule
// for the store as a whole. As with
// any timed-out write, a take whose deadline passed may still be applied
// when a slow Redis gets to it: the error means "unknown", not "not
// charged" (a stopped or unreachable Redis applies nothing).
package redis

import (
	"cmp"
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/internal/deadline"
	"github.com/sluicehq/sluice/internal/defaults"
)

// DefaultTimeout is Options.Timeout's default.
const DefaultTimeout = 250 * time.Millisecond

// ErrBreakerOpen is returned, wrapped, while the circuit breaker keeps
// calls away from a Redis that has been failing.
var ErrBreakerOpen = errors.New("redis store: circuit breaker open")

// Options configures a Store. The zero value is usable.
type Options struct {
	// Timeout bounds every call to Redis from when it is sent (default
	// 250ms); a call waiting in this process for a batch to carry it (the
	// process is short of CPU) waits on the caller's deadline alone. A
	// caller's earlier deadline wins: behind Envoy, its rate limit timeout
	// (20ms by default, sent with each call). The default is long enough
	// that a healthy Redis is not read as a failed one when this host is
	// short of CPU (bench/storeerr.sh counts the calls a loaded host lets
	// miss it: bench/README.md#the-redis-stores-deadline-on-a-loaded-host;
	// TestLoadedHostIsNotADeadStore keeps the property), and short enough that a hung
	// Redis costs each decision at most that long until the circuit breaker
	// opens (after BreakerFailures deadlines to a window plus that many:
	// see BreakerFailures).
	Timeout time.Duration
	// KeyPrefix is put before every key, to share a Redis with other
	// users ("sluice:"). It may not contain braces: a hash tag in it would
	// put every bucket in one Cluster slot.
	KeyPrefix string
	// Clock passes the time into the scripts instead of Redis's TIME. For
	// tests only: in production every process must use the server's clock.
	Clock sluice.Clock
	// TLSConfig, for Open with a rediss:// URL, replaces the default TLS
	// settings (system roots, the URL's host as server name): a private CA,
	// client certificates.
	TLSConfig *tls.Config
	// Observer, when set, is told of the store's errors, breaker changes,
	// cache hits and batch sizes: its metrics (metrics.NewRedisObserver).
	Observer Observer
	// NoOverLimitCache turns off the in-process cache of rejected keys.
	NoOverLimitCache bool
	// OverLimitCacheSize bounds that cache (default 100,000 keys).
	OverLimitCacheSize int
	// BreakerFailures is how many failed calls within a window, when they
	// are at least half of the window's calls, open the circuit breaker
	// (default 5): a Redis that is down opens it after that many calls,
	// while a stall of this process that makes a few calls miss their
	// deadline among many that succeed does not. The window is one second,
	// or 2*BreakerFailures*Timeout when longer (2.5s with the defaults), so
	// that even one caller, whose calls to a hung Redis fail one per
	// Timeout, opens it. The window is a fixed span, not a sliding one: a
	// hang opens the breaker after BreakerFailures deadlines (1.25s) when
	// the window holds nothing else, and at most one window plus that
	// (3.75s) when the calls that succeeded before the hang outnumber its
	// failures until the next window (TestHungServerOpensWithinBound).
	// BreakerBackoff is how long it stays open before a probe (default
	// 500ms).
	BreakerFailures int
	BreakerBackoff  time.Duration
	// NoBatch sends every call as its own script call.
	NoBatch bool
	// BatchWriters is the number of script calls in flight at once, per
	// Cluster primary, a lone caller's included (default 4, or GOMAXPROCS when fewer);
	// BatchMaxOps bounds the requests in one batch (default 256). A batch in flight per processor is as many as
	// the processors keep busy: one writer carries up to BatchMaxOps
	// requests per round trip, more than a processor decides in one, and
	// more writers than processors only split the waiting calls into
	// more, smaller script calls, each a write and a read for this process
	// and a script call for Redis (bench/results/2026-11-28.md measures it
	// with the server on one processor).
	BatchWriters int
	BatchMaxOps  int
}

// Store is the Redis Store. It is safe for concurrent use.
type Store struct {
	client  rueidis.Client
	owned   bool
	prefix  string
	script  *rueidis.Lua
	cluster bool
	timeout time.Duration
	clock   sluice.Clock
	epoch   time.Time
	pad     string
	nodes   *nodes
	cache   *overLimit
	// batches are the batch writers of every node made (node.batch) but
	// those retired; closed says that Close has begun, after which none is
	// made or retired. retireAfter is how long a retired node's writers
	// go on answering the calls the old slot table sent them.
	batchMu     sync.Mutex
	batches     []*batcher
	closed      bool
	retireAfter time.Duration
	// stopDrops ends the subscription that keeps cache in step with the
	// other stores (see drops.go); dropsDone is closed when it has.
	stopDrops context.CancelFunc
	dropsDone chan struct{}
	obs       Observer
	// beforeRollback, when set (tests: SetBeforeRollback), runs when a
	// Cluster TakeAll has been rejected, before its charges are refunded:
	// where another caller's request lands in between on demand.
	beforeRollback func()
}

// New returns a Store over client, which the caller keeps and closes.
func New(client rueidis.Client, opts Options) (*Store, error) {
	defaults.Set(&opts.Timeout, DefaultTimeout)
	defaults.Set(&opts.BreakerFailures, 5)
	defaults.Set(&opts.BreakerBackoff, 500*time.Millisecond)
	defaults.Set(&opts.OverLimitCacheSize, 100_000)
	defaults.Set(&opts.BatchWriters, min(4, runtime.GOMAXPROCS(0)))
	defaults.Set(&opts.BatchMaxOps, 256)
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("redis store: key prefix %q: braces would make a hash tag", opts.KeyPrefix)
	}
	obs := cmp.Or[Observer](opts.Observer, noObserver{})
	s := &Store{
		client:  client,
		prefix:  opts.KeyPrefix,
		script:  rueidis.NewLuaScript(scriptSource),
		cluster: client.Mode() == rueidis.ClientModeCluster,
		timeout: opts.Timeout,
		clock:   opts.Clock,
		epoch:   time.Now(),
		pad:     "0",
		obs:     obs,
		// A call the old table sent is in flight for at most Timeout; one
		// waiting for a place behind such calls, about a Timeout more.
		retireAfter: 2 * opts.Timeout,
	}
	if opts.Clock != nil {
		// Test clocks jump far ahead of real time; keys must outlive the
		// real time a test takes, or they would expire early.
		s.pad = "3600000"
	}
	// Failures are counted over long enough a window for one caller's
	// calls, each failing only at its deadline, to reach the threshold.
	newNode := func(addr string) *node {
		// Told at once, so that a breaker that never changes still shows
		// its state (closed).
		obs.BreakerChanged(addr, breaker.Closed, false)
		n := &node{addr: addr, br: breaker.ForDeadline(opts.BreakerFailures, opts.BreakerBackoff, opts.Timeout, func(st int32, opened bool) {
			obs.BreakerChanged(addr, st, opened)
		})}
		if !opts.NoBatch {
			// Batch writers of its own: a primary that hangs holds its own
			// calls only (TestAttackHungPrimaryStallsOtherPrimaries).
			n.batch = newBatcher(opts.BatchWriters, opts.BatchMaxOps, opts.Timeout, s.pad, s.exec, obs.Batch)
			if s.cluster {
				n.batch.slotOf, n.batch.multi = s.slotOf, s.execMulti
			}
			s.batchMu.Lock()
			if s.closed {
				// A refresh begun as the store closed: its writers stop now.
				n.batch.close()
			} else {
				s.batches = append(s.batches, n.batch)
			}
			s.batchMu.Unlock()
		}
		return n
	}
	s.nodes = &nodes{fallback: newNode(""), cluster: s.cluster, newNode: newNode, gone: obs.BreakerRemoved, retire: s.retire, timeout: opts.Timeout, gap: int64(opts.BreakerBackoff)}
	if s.cluster {
		s.nodes.fetch = clusterSlotsOf(client)
		// Read now, so that the first failures count against their own
		// primary; a Cluster that does not answer yet is read again after
		// the first failed call.
		s.nodes.last.Store(time.Now().UnixNano())
		s.nodes.refresh()
	}
	if !opts.NoOverLimitCache {
		s.cache = newOverLimit(opts.OverLimitCacheSize)
		ctx, cancel := context.WithCancel(context.Background())
		s.stopDrops, s.dropsDone = cancel, make(chan struct{})
		first := make(chan struct{})
		go func() {
			defer close(s.dropsDone)
			s.subscribeDrops(ctx, first)
		}()
		// The first takes cache their rejections only once drops can
		// reach them: wait for the subscription, or its failure, for a
		// store call's deadline. A slower one clears the cache when it
		// comes (drops.go).
		select {
		case <-first:
		case <-time.After(opts.Timeout):
		}
	}
	return s, nil
}

// retire closes the batch writers of n, a Cluster primary gone from the
// slot table (a failover, a resharding, a node removed), once retireAfter
// has passed: the calls the old table sent there have had their script
// call's deadline by then, and one still waiting, or one that reaches
// them later, is refused (errRetired) rather than left waiting. Without it every primary the store ever saw would keep
// its writers until Close, and a Cluster whose primaries change over and
// over would make the process grow without bound
// (TestClusterTopologyChurnRetiresBatchers).
func (s *Store) retire(n *node) {
	b := n.batch
	if b == nil {
		return
	}
	s.batchMu.Lock()
	defer s.batchMu.Unlock()
	if s.closed || b.retire != nil {
		return
	}
	err := fmt.Errorf("node %s: %w", n.addr, errRetired)
	b.retire = time.AfterFunc(s.retireAfter, func() {
		b.closeWith(err)
		s.batchMu.Lock()
		if i := slices.Index(s.batches, b); i >= 0 {
			s.batches = slices.Delete(s.batches, i, i+1)
		}
		s.batchMu.Unlock()
	})
}

// Close stops the batch writers and, if the store opened its client,
// closes it.
func (s *Store) Close() error {
	if s.stopDrops != nil {
		s.stopDrops()
		<-s.dropsDone
	}
	// A refresh in flight ends first; one that a call begins later finds
	// the store closed (newNode, retire).
	s.nodes.wait()
	s.batchMu.Lock()
	s.closed = true
	bs := s.batches
	s.batches = nil // a retire timer that fires now finds nothing to remove
	s.batchMu.Unlock()
	for _, b := range bs {
		if b.retire != nil {
			b.retire.Stop()
		}
		// A batcher whose retire timer has fired is closed once, by
		// whichever comes first; the other waits for it.
		b.close()
	}
	if s.owned {
		s.client.Close()
	}
	return nil
}

// Client returns the underlying client.
func (s *Store) Client() rueidis.Client { return s.client }

// exec runs the script once.
func (s *Store) exec(ctx context.Context, keys, args []string) ([]int64, error) {
	return s.script.Exec(ctx, s.client, keys, args).AsIntSlice()
}

// scriptSHA is the SHA-1 Redis knows the script by.
var scriptSHA = func() string {
	sum := sha1.Sum([]byte(scriptSource))
	return hex.EncodeToString(sum[:])
}()

// execMulti runs the script once per element of keys and args, in one
// pipelined round across the Cluster's nodes. A node that does not have
// the script yet (NOSCRIPT) gets it sent again through exec.
func (s *Store) execMulti(ctx context.Context, keys, args [][]string) ([][]int64, []error) {
	cmds := make(rueidis.Commands, len(keys))
	for i := range keys {
		cmds[i] = s.client.B().Evalsha().Sha1(scriptSHA).Numkeys(int64(len(keys[i]))).Key(keys[i]...).Arg(args[i]...).Build()
	}
	out := make([][]int64, len(keys))
	errs := make([]error, len(keys))
	for i, r := range s.client.DoMulti(ctx, cmds...) {
		out[i], errs[i] = r.AsIntSlice()
		if rerr, ok := rueidis.IsRedisErr(errs[i]); ok && rerr.IsNoScript() {
			out[i], errs[i] = s.exec(ctx, keys[i], args[i])
		}
	}
	return out, errs
}

// slotOf is key's Cluster slot.
func (s *Store) slotOf(key string) uint16 {
	cmd := s.client.B().Get().Key(key).Build()
	return cmd.Slot()
}

// nowArg is the time argument of a group: "" for the server's clock.
func (s *Store) nowArg() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock.Now().UnixMicro(), 10)
}

// wallNow is this process's clock in microseconds since the epoch (the
// test clock's in tests): the time a calendar window's bounds are
// computed for (see appendWindow).
func (s *Store) wallNow() int64 {
	if s.clock != nil {
		return s.clock.Now().UnixMicro()
	}
	return time.Now().UnixMicro()
}

// wallNowFor is wallNow when a request of l needs it (needsNow), else 0:
// a clock read saved for every other request.
func (s *Store) wallNowFor(l *sluice.Limit) int64 {
	if !needsNow(l) {
		return 0
	}
	return s.wallNow()
}

// localNow is this process's time in microseconds, for the over-limit
// cache: monotonic, or the test clock.
func (s *Store) localNow() int64 {
	if s.clock != nil {
		return s.clock.Now().UnixMicro()
	}
	return int64(time.Since(s.epoch) / time.Microsecond)
}

// run sends groups through the breaker of the node serving keys (on a
// Cluster they are of one slot), with the deadline, batched when it can be.
func (s *Store) run(ctx context.Context, keys, groups []string, batchable bool) ([]int64, error) {
	n := s.breakerOf(keys[0])
	if err := s.allow(n); err != nil {
		return nil, err
	}
	var res []int64
	var err error
	if batchable && n.batch != nil {
		res, err = n.batch.do(ctx, keys, groups) // the deadline runs from the send
	} else {
		args := make([]string, 0, len(groups)+1)
		args = append(append(args, s.pad), groups...)
		cctx, cancel := deadline.WithTimeout(ctx, s.timeout)
		res, err = s.exec(cctx, keys, args)
		cancel()
		if err == nil && len(res) != replyWidth*len(keys) {
			err = fmt.Errorf("script returned %d values for %d keys", len(res), len(keys))
		}
	}
	// The caller's own cancellation, or a call that never left this
	// process, is not Redis's failure (see done).
	s.done(ctx, n, err)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, op engine.Op, r sluice.Charged) (sluice.Decision, error) {
	ch := r.Charge
	if err := fits(r.Limit, max(r.Limit.Params().MaxReserved, ch.MaxReserved)); err != nil {
		return sluice.Decision{}, err
	}
	key := s.prefix + r.Limit.StorageKey(r.Key)
	cacheable := s.cache != nil && op == engine.OpTake && !ch.Reserve
	var sent int64
	var gen uint64
	if cacheable {
		sent = s.localNow()
		d, g, ok := s.cache.get(key, r.Limit, ch.Cost, sent)
		if ok {
			s.obs.OverLimitCacheHit()
			return d, nil
		}
		gen = g
	}
	// The key and the arguments in one allocation: the group header and a
	// request's three (four with extra) arguments.
	ka := new([6]string)
	ka[0] = key
	args := appendGroup(ka[1:1], 1, opOf(op), s.nowArg())
	args = appendRequest(args, &r, "", s.wallNowFor(r.Limit))
	res, err := s.run(ctx, ka[:1:1], args, true)
	if op == engine.OpRefund {
		// The key has tokens again: a cached rejection would keep refusing
		// them. Dropped even after an error, which may hide an applied
		// refund; a needless drop only costs a round trip.
		s.cache.drop(key)
	}
	if err != nil {
		return sluice.Decision{}, fmt.Errorf("redis %s %q: %w", op, key, err)
	}
	if op == engine.OpRefund {
		s.publishDrops(ctx, key)
	}
	o := outcome(res)
	d := r.Limit.Decide(o)
	if cacheable && !o.Allowed && o.RetryAfter > 0 {
		s.cache.put(key, r.Limit, gen, ch.Cost, sent, sent+o.RetryAfter, d)
	}
	return d, nil
}

func opOf(op engine.Op) string {
	switch op {
	case engine.OpTake:
		return opTake
	case engine.OpRefund:
		return opRefund
	}
	return opPeek
}

// Reset implements sluice.Store.
func (s *Store) Reset(ctx context.Context, l *sluice.Limit, key string) error {
	if l == nil {
		return fmt.Errorf("redis reset %q: %w", key, sluice.ErrInvalidLimit)
	}
	k := s.prefix + l.StorageKey(key)
	// Dropped again once the key is deleted, so that no rejection decided
	// before the DEL is cached after it (see overLimit.put).
	defer s.cache.drop(k)
	s.cache.drop(k)
	err := s.call(ctx, k, func(ctx context.Context) error {
		return s.client.Do(ctx, s.client.B().Del().Key(k).Build()).Error()
	})
	if err != nil {
		return fmt.Errorf("redis reset %q: %w", k, err)
	}
	s.publishDrops(ctx, k)
	return nil
}

// TakeAll implements sluice.Store. On one Redis it is one script; on a
// Cluster, one script per slot, charged in slot order and refunded when a
// later slot rejects (see the package documentation).
func (s *Store) TakeAll(ctx context.Context, op engine.Op, rs []sluice.Charged, dst []sluice.Decision) ([]sluice.Decision, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	if len(rs) == 1 && op == engine.OpTake && s.cache != nil {
		// One request is all-or-nothing by itself: Take, whose over-limit
		// cache answers a key known to be short without a round trip.
		d, err := s.Take(ctx, op, rs[0])
		if err != nil {
			return nil, err
		}
		return append(dst[:0], d), nil
	}
	keys := make([]string, len(rs))
	for i := range rs {
		if err := fits(rs[i].Limit, max(rs[i].Limit.Params().MaxReserved, rs[i].MaxReserved)); err != nil {
			return nil, fmt.Errorf("take %d of %d: %w", i+1, len(rs), err)
		}
		keys[i] = s.prefix + rs[i].Limit.StorageKey(rs[i].Key)
	}
	if op == engine.OpRefund {
		defer s.cache.drop(keys...) // see Take
	}
	if !s.cluster {
		res, err := s.runGroup(ctx, rs, keys, allIndexes(len(rs)), opOf(op), s.nowArg())
		if err != nil {
			return nil, fmt.Errorf("redis %s all %q: %w", op, keys, err)
		}
		if op == engine.OpRefund {
			s.publishDrops(ctx, keys...)
		}
		return s.decide(rs, res), nil
	}
	if op == engine.OpRefund {
		ds, err := s.refundAllCluster(ctx, rs, keys)
		s.publishDrops(ctx, keys...) // even after an error: some slots may have been refunded
		return ds, err
	}
	return s.takeAllCluster(ctx, op, rs, keys)
}

// refundAllCluster refunds rs one slot at a time. A refund never rejects,
// so the slots need no all-or-nothing: every slot is tried even when
// another fails (a refund left undone is capacity lost until the bucket
// refills), and the errors are returned together.
func (s *Store) refundAllCluster(ctx context.Context, rs []sluice.Charged, keys []string) ([]sluice.Decision, error) {
	res := make([]int64, replyWidth*len(rs))
	now := s.nowArg()
	var errs []error
	for _, g := range s.slotGroups(keys) {
		var err error
		if g.res, err = s.runGroup(ctx, rs, keys, g.ix, opRefund, now); err != nil {
			errs = append(errs, fmt.Errorf("slot %d: %w", g.slot, err))
			continue
		}
		g.place(res)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("redis refund all %q: %w", keys, errors.Join(errs...))
	}
	return s.decide(rs, res), nil
}

func allIndexes(n int) []int {
	ix := make([]int, n)
	for i := range ix {
		ix[i] = i
	}
	return ix
}

// runGroup runs the requests ix of rs as one all-or-nothing group and
// returns their replies in the order of ix.
func (s *Store) runGroup(ctx context.Context, rs []sluice.Charged, keys []string, ix []int, op, now string) ([]int64, error) {
	gk := make([]string, len(ix))
	args := make([]string, 0, 1+3*len(ix))
	args = appendGroup(args, len(ix), op, now)
	for j, i := range ix {
		gk[j] = keys[i]
		args = appendRequest(args, &rs[i], "", s.wallNowFor(rs[i].Limit))
	}
	return s.run(ctx, gk, args, true)
}

// decide turns replies (in the order of rs) into decisions.
func (s *Store) decide(rs []sluice.Charged, res []int64) []sluice.Decision {
	ds := make([]sluice.Decision, len(rs))
	for i := range rs {
		ds[i] = rs[i].Limit.Decide(outcome(res[replyWidth*i:]))
	}
	return ds
}

// slotGroup is the requests of one Cluster slot.
type slotGroup struct {
	slot uint16
	ix   []int
	res  []int64
}

// place copies g's replies into res, which is in the order of the call's
// requests.
func (g *slotGroup) place(res []int64) {
	for j, i := range g.ix {
		copy(res[replyWidth*i:replyWidth*(i+1)], g.res[replyWidth*j:])
	}
}

func (s *Store) slotGroups(keys []string) []*slotGroup {
	var gs []*slotGroup
	for i, k := range keys {
		slot := s.slotOf(k)
		j := slices.IndexFunc(gs, func(g *slotGroup) bool { return g.slot == slot })
		if j < 0 {
			gs = append(gs, &slotGroup{slot: slot})
			j = len(gs) - 1
		}
		gs[j].ix = append(gs[j].ix, i)
	}
	slices.SortFunc(gs, func(a, b *slotGroup) int { return cmp.Compare(a.slot, b.slot) })
	return gs
}

func (s *Store) takeAllCluster(ctx context.Context, op engine.Op, rs []sluice.Charged, keys []string) ([]sluice.Decision, error) {
	gs := s.slotGroups(keys)
	res := make([]int64, replyWidth*len(rs))
	now := s.nowArg()
	if op == engine.OpPeek {
		// Peeks change nothing, so the slots are asked at once (a sharded
		// limit's peek reads a slot per shard).
		errs := make([]error, len(gs))
		var wg sync.WaitGroup
		for i, g := range gs {
			wg.Go(func() {
				g.res, errs[i] = s.runGroup(ctx, rs, keys, g.ix, opPeek, now)
			})
		}
		wg.Wait()
		for i, g := range gs {
			if errs[i] != nil {
				return nil, fmt.Errorf("redis peek all %q: %w", keys, errs[i])
			}
			g.place(res)
		}
		return s.decide(rs, res), nil
	}
	for n, g := range gs {
		var err error
		g.res, err = s.runGroup(ctx, rs, keys, g.ix, opTake, now)
		if err != nil {
			// The earlier slots were charged; this one may or may not have
			// been (a timeout says nothing). Give back what is known.
			rerr := s.rollback(ctx, rs, keys, gs[:n])
			return nil, errors.Join(fmt.Errorf("redis take all %q: %w", keys, err), rerr)
		}
		g.place(res)
		if g.res[0] == 1 {
			continue
		}
		// Rejected: refund the slots already charged, and ask the rest
		// what they would have said.
		if s.beforeRollback != nil {
			s.beforeRollback()
		}
		// The rejection stands though the refund or a peek fail (counted
		// by RefundFailed and the breaker): as an error, on_store_error
		// could admit it (TestAttackFailedRollbackAdmitsRejected).
		_ = s.rollback(ctx, rs, keys, gs[:n])
		for _, g := range gs[n+1:] {
			if g.res, err = s.runGroup(ctx, rs, keys, g.ix, opPeek, now); err == nil {
				g.place(res)
			}
		}
		ds := s.decide(rs, res)
		for i := range ds {
			ds[i].Allowed = false
		}
		return ds, nil
	}
	return s.decide(rs, res), nil
}

// rollback gives back the charges of the groups gs (a refund, removing
// exactly the sliding-log entries those takes appended). It runs with its
// own deadline even when the caller's has passed: a refund left undone is
// a charge nobody was admitted for.
func (s *Store) rollback(ctx context.Context, rs []sluice.Charged, keys []string, gs []*slotGroup) error {
	var errs []error
	for _, g := range gs {
		n := len(g.ix)
		gk := make([]string, 0, n)
		args := []string{s.pad}
		args = appendGroup(args, n, opRefund, s.nowArg())
		// Last charged, first refunded: a bucket charged twice in the group
		// is then, at each refund, where the charge being refunded left it
		// (see tb_refund).
		for j := n - 1; j >= 0; j-- {
			i := g.ix[j]
			gk = append(gk, keys[i])
			reply := g.res[replyWidth*j:]
			var extra string
			window := false
			switch rs[i].Limit.Algorithm() {
			case sluice.FixedWindow, sluice.SlidingWindow: // calendar windows too
				window = true
			case sluice.SlidingLog: // the entry the take added
				extra = strconv.FormatInt(reply[4], 10)
			default: // a bucket ("tb"): where the take left it
				extra = strconv.FormatInt(reply[4], 10) + ":" + strconv.FormatInt(reply[1], 10)
			}
			args = appendRequest(args, &rs[i], extra, s.wallNowFor(rs[i].Limit))
			if window {
				// The window the take counted in: a refund counts in the
				// window of its moment, and one that lands after the
				// boundary would give the next window the cost again
				// (TestAttackClusterRollbackRefundsLaterWindow).
				args[len(args)-2] = strconv.FormatInt(rs[i].Cost, 10) + "w" + strconv.FormatInt(reply[4], 10)
			}
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*s.timeout)
		_, err := s.exec(rctx, gk, args)
		cancel()
		if err != nil {
			s.obs.RefundFailed()
			errs = append(errs, fmt.Errorf("refund slot %d: %w", g.slot, err))
			continue
		}
		// The tokens are back: no cache may keep rejecting these keys.
		s.cache.drop(gk...)
		s.publishDrops(ctx, gk...)
	}
	return errors.Join(errs...)
}

var _ sluice.Store = (*Store)(nil)
