package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/sluicehq/sluice/internal/breaker"
	"github.com/sluicehq/sluice/internal/deadline"
)

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// node is one Redis server as the store's calls see it: its address ("" for
// a standalone Redis, a Sentinel's primary, and a Cluster's slots whose
// primary is not known yet), its circuit breaker and its batch writers.
type node struct {
	addr  string
	br    *breaker.Breaker
	batch *batcher // nil without batching
}

// nodes are the store's circuit breakers. A standalone Redis has one. A
// Cluster has one per primary, so that a primary that fails opens the
// breaker of its own slots only: the slots of the primaries that answer
// go on being served. The slot table comes from CLUSTER SLOTS, read when
// the store is made and again, at most once per refresh gap, after a call
// failed or was refused by an open breaker: a failover or a resharding
// moves slots, and the calls that fail on the old owner are what tell of
// it. Until the table is read, every slot shares the fallback breaker.
type nodes struct {
	fallback *node
	cluster  bool
	// table is the Cluster's slot owners (nil until first read).
	table atomic.Pointer[slotTable]
	// newNode makes the breaker of a primary seen for the first time;
	// gone tells the observer of a primary that no longer owns slots, and
	// retire is given its node, which no call finds from then on but those
	// the old table sent there (a primary that comes back is a new node).
	newNode func(addr string) *node
	gone    func(addr string)
	retire  func(n *node)
	fetch   func(ctx context.Context) (map[string][][2]int64, error)
	timeout time.Duration
	// gap is the least time between two refreshes, in nanoseconds; last
	// is when the latest began, busy whether one is running.
	gap  int64
	last atomic.Int64
	busy atomic.Bool
	wg   sync.WaitGroup
}

// slotTable maps each slot to the breaker of its primary.
type slotTable struct {
	owner [clusterSlots]*node
	// primaries, in address order.
	primaries []*node
}

// of is the node serving slot.
func (ns *nodes) of(slot uint16) *node {
	if t := ns.table.Load(); t != nil && int(slot) < clusterSlots {
		if n := t.owner[slot]; n != nil {
			return n
		}
	}
	return ns.fallback
}

// all is every node whose breaker counts now: the Cluster's primaries, or
// the one node.
func (ns *nodes) all() []*node {
	if t := ns.table.Load(); t != nil && len(t.primaries) > 0 {
		return t.primaries
	}
	return []*node{ns.fallback}
}

// suspect starts a refresh of the slot table in the background, unless
// one ran within the gap: a call failed, or an open breaker refused one,
// which is how a moved slot shows.
func (ns *nodes) suspect() {
	if !ns.cluster {
		return
	}
	t := time.Now().UnixNano()
	if l := ns.last.Load(); t-l < ns.gap || !ns.last.CompareAndSwap(l, t) || !ns.busy.CompareAndSwap(false, true) {
		return
	}
	ns.wg.Go(func() {
		defer ns.busy.Store(false)
		ns.refresh() // a failed read leaves the table as it was; the next failure retries
	})
}

// refresh reads the slot owners and installs them, keeping the breaker of
// a primary that still owns slots (its state is what it learned).
func (ns *nodes) refresh() error {
	ctx, cancel := context.WithTimeout(context.Background(), ns.timeout)
	defer cancel()
	groups, err := ns.fetch(ctx)
	if err != nil {
		return err
	}
	known := map[string]*node{}
	old := ns.table.Load()
	if old != nil {
		for _, n := range old.primaries {
			known[n.addr] = n
		}
	}
	t := &slotTable{}
	covered := 0
	for addr, ranges := range groups {
		n := known[addr]
		if n == nil {
			n = ns.newNode(addr)
		}
		t.primaries = append(t.primaries, n)
		for _, r := range ranges {
			for sl := max(r[0], 0); sl <= r[1] && sl < clusterSlots; sl++ {
				if t.owner[sl] == nil {
					covered++
				}
				t.owner[sl] = n
			}
		}
	}
	slices.SortFunc(t.primaries, func(a, b *node) int { return cmp.Compare(a.addr, b.addr) })
	ns.table.Store(t)
	for addr, n := range known {
		if _, ok := groups[addr]; !ok {
			ns.gone(addr)
			ns.retire(n)
		}
	}
	if covered == clusterSlots {
		// Every slot has its primary: the fallback serves none, and a
		// state it was left in would read as a breaker open for good.
		ns.gone(ns.fallback.addr)
	}
	return nil
}

// wait waits for a refresh in flight, when the store closes.
func (ns *nodes) wait() { ns.wg.Wait() }

// clusterSlotsOf asks the Cluster's nodes, one after another until one
// answers, which primary serves which slots (CLUSTER SLOTS, as rueidis
// reads it: a primary without an address, "?", is left out; an empty
// one is the address of the node asked).
func clusterSlotsOf(client rueidis.Client) func(ctx context.Context) (map[string][][2]int64, error) {
	return func(ctx context.Context) (map[string][][2]int64, error) {
		var errs []error
		for addr, c := range client.Nodes() {
			msgs, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", addr, err))
				if ctx.Err() != nil {
					break
				}
				continue
			}
			return parseClusterSlots(msgs, addr), nil
		}
		return nil, fmt.Errorf("redis store: cluster slots: %w", errors.Join(errs...))
	}
}

// parseClusterSlots reads a CLUSTER SLOTS reply: each entry is a range's
// first and last slot, then its primary (address, port, ...), then its
// replicas.
func parseClusterSlots(msgs []rueidis.RedisMessage, asked string) map[string][][2]int64 {
	groups := map[string][][2]int64{}
	for _, m := range msgs {
		v, err := m.ToArray()
		if err != nil || len(v) < 3 {
			continue
		}
		lo, err1 := v[0].AsInt64()
		hi, err2 := v[1].AsInt64()
		p, err3 := v[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(p) < 2 {
			continue
		}
		host, _ := p[0].ToString()
		port, err := p[1].AsInt64()
		if err != nil || host == "?" {
			continue
		}
		if host == "" {
			host, _, _ = net.SplitHostPort(asked)
		}
		addr := net.JoinHostPort(host, strconv.FormatInt(port, 10))
		groups[addr] = append(groups[addr], [2]int64{lo, hi})
	}
	return groups
}

// breakerOf is the node serving key.
func (s *Store) breakerOf(key string) *node {
	if !s.cluster {
		return s.nodes.fallback
	}
	return s.nodes.of(s.slotOf(key))
}

// allow reports, as an error, whether n's breaker lets a call through.
func (s *Store) allow(n *node) error {
	if n.br.Allow() {
		return nil
	}
	s.obs.StoreError()
	s.nodes.suspect()
	if n.addr == "" {
		return ErrBreakerOpen
	}
	return fmt.Errorf("node %s: %w", n.addr, ErrBreakerOpen)
}

// call runs f, with the store's deadline, on the node serving key
// through its breaker, and records its error there (see done).
func (s *Store) call(ctx context.Context, key string, f func(ctx context.Context) error) error {
	n := s.breakerOf(key)
	if err := s.allow(n); err != nil {
		return err
	}
	cctx, cancel := deadline.WithTimeout(ctx, s.timeout)
	err := f(cctx)
	cancel()
	s.done(ctx, n, err)
	return err
}

// done records a call to n that went through allow: err nil is a
// success; an error counts against n unless ctx's own end (the caller gave
// up) or a call that never left this process caused it (a deadline that
// passed before it was sent, a primary retired from under it).
func (s *Store) done(ctx context.Context, n *node, err error) {
	if err == nil {
		n.br.Done(true)
		return
	}
	if ctx.Err() == nil && !errors.Is(err, errUnsent) && !errors.Is(err, errRetired) {
		n.br.Done(false)
		s.nodes.suspect()
	} else {
		n.br.Abort()
	}
	s.obs.StoreError()
}

// Ready reports whether the store as a whole is usable, for a readiness
// probe: nil when at least one node answers a PING. Every node whose
// breaker lets a call through is asked at once (a Cluster's primaries,
// or the one Redis), each within the store's timeout, and the PINGs count
// for the breakers like any call: after an open breaker's backoff the
// PING is its probe, so a process that gets no traffic while every node
// is down still finds out when one is back. A node whose breaker is open
// is not asked, and not ready: when every breaker is open, the store is
// not ready. A Cluster with one primary down is ready; its slots fail
// fast meanwhile, each rule answering by its on_store_error.
func (s *Store) Ready(ctx context.Context) error {
	ns := s.nodes.all()
	errs := make([]error, len(ns))
	var byAddr map[string]rueidis.Client
	if s.cluster {
		byAddr = s.client.Nodes()
	}
	var wg sync.WaitGroup
	for i, n := range ns {
		c := s.client
		if n.addr != "" {
			if c = byAddr[n.addr]; c == nil {
				errs[i] = fmt.Errorf("node %s: no connection", n.addr)
				continue
			}
		}
		if errs[i] = s.allow(n); errs[i] != nil {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, s.timeout)
			err := c.Do(cctx, c.B().Ping().Build()).Error()
			cancel()
			s.done(ctx, n, err)
			if err != nil && n.addr != "" {
				err = fmt.Errorf("node %s: %w", n.addr, err)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if slices.Contains(errs, nil) {
		return nil
	}
	return fmt.Errorf("redis store: no node answers: %w", errors.Join(errs...))
}
