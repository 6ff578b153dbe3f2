package postgres_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/conformance"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/metrics"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/postgres/pgtest"
)

func TestViolationLog(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	if _, err := p.Exec(ctx, "TRUNCATE sluice_violations"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{BatchSize: 7, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(metrics.NewViolationLogCollector(vl))
	defer vl.Close()
	base := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	for i := 0; i < 30; i++ {
		v := postgres.Violation{
			BucketKey: fmt.Sprintf("tb:per-user:u%d", i%3), UserID: fmt.Sprintf("u%d", i%3),
			IP: netip.AddrFrom4([4]byte{192, 0, 2, byte(i % 5)}), Endpoint: "/api/search",
			At: base.Add(time.Duration(i) * time.Second), Tokens: 0.5, Rule: "per-user",
		}
		if !vl.Record(v) {
			t.Fatal("a violation was dropped from an empty queue")
		}
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if vl.Written() != 30 || metricValue(t, reg, "sluice_postgres_violations_written_total") != 30 {
		t.Fatalf("written %d", vl.Written())
	}
	byUser, err := postgres.ListViolations(ctx, p, postgres.ViolationQuery{Since: base, UserID: "u1", Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(byUser) != 3 || !byUser[0].At.After(byUser[1].At) || byUser[0].UserID != "u1" || !byUser[0].At.Equal(base.Add(28*time.Second)) {
		t.Fatalf("by user, newest first: %+v", byUser)
	}
	byIP, err := postgres.ListViolations(ctx, p, postgres.ViolationQuery{Since: base, IP: netip.MustParseAddr("192.0.2.4")})
	if err != nil {
		t.Fatal(err)
	}
	if len(byIP) != 6 || byIP[0].IP != netip.MustParseAddr("192.0.2.4") || byIP[0].Endpoint != "/api/search" || byIP[0].Tokens != 0.5 {
		t.Fatalf("by IP: %d rows, first %+v", len(byIP), byIP[0])
	}

	// Both lookups are index scans, newest first, with no sort.
	for _, q := range []string{
		`SELECT * FROM sluice_violations WHERE user_id = 'u1' ORDER BY requested_at DESC LIMIT 10`,
		`SELECT * FROM sluice_violations WHERE ip_address = '192.0.2.4' ORDER BY requested_at DESC LIMIT 10`,
	} {
		plan := explain(t, q)
		if !strings.Contains(plan, "Index Scan") || strings.Contains(plan, "Sort") {
			t.Errorf("%s:\n%s", q, plan)
		}
	}
}

func explain(t *testing.T, q string) string {
	t.Helper()
	ctx := pgtestContext(t)
	tx, err := pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

// When the database stalls (here: the table is locked), the queue fills
// and further violations are dropped and counted, never blocking the
// caller; once the database is back everything queued is written.
func TestViolationLogDropsWhenFull(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	reg := prometheus.NewRegistry()
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{QueueSize: 5, BatchSize: 2, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(metrics.NewViolationLogCollector(vl))
	defer vl.Close()
	before := vl.Written()
	lock, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A failure must not leave the table locked for the tests after.
	defer lock.Rollback(ctx)
	if _, err := lock.Exec(ctx, "LOCK TABLE sluice_violations IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	const total = 200
	start := time.Now()
	for i := 0; i < total; i++ {
		// A bucket each: one bucket's would be recorded once a second.
		vl.Record(postgres.Violation{BucketKey: fmt.Sprintf("k%d", i), Rule: "r", Tokens: 0})
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("recording blocked for %v", d)
	}
	dropped := vl.Dropped()
	if dropped == 0 || dropped > total-5 {
		t.Fatalf("dropped %d of %d with a stalled database and a queue of 5", dropped, total)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := vl.Written() - before; got+dropped != total {
		t.Fatalf("written %d + dropped %d != %d recorded", got, dropped, total)
	}
	if got := metricValue(t, reg, "sluice_postgres_violations_dropped_total"); got != float64(dropped) {
		t.Fatalf("dropped counter %v, want %d", got, dropped)
	}
}

// A store with a violation log records its rejections: bucket key, rule
// and the tokens left.
func TestStoreRecordsRejections(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	// Every rejection: the bucket's two below come within a second.
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{PerBucket: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer vl.Close()
	clock := sluice.NewManualClock(time.Now())
	s := newStoreOpts(t, postgres.Options{Clock: clock, Violations: vl})
	lim := sluice.MustLimit(sluice.Spec{Name: "rec", TokensPerSecond: 1, Burst: 2})
	for i := 0; i < 3; i++ {
		conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "someone", Cost: 0.75})
	}
	if _, err := conformance.TakeAll(ctx, s, engine.OpTake, []sluice.Request{{Limit: lim, Key: "other"}, {Limit: lim, Key: "someone"}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	var tokens float64
	if err := p.QueryRow(ctx, `SELECT count(*), max(tokens_at_time) FROM sluice_violations WHERE bucket_key LIKE '%tb:rec:someone' AND rule = 'rec'`).Scan(&n, &tokens); err != nil {
		t.Fatal(err)
	}
	// Three takes of 0.75 from 2: the third is rejected with 0.5 left; the
	// TakeAll is rejected by "someone" alone.
	if n != 2 || tokens != 0.5 {
		t.Fatalf("%d violations recorded for the bucket with %v tokens, want 2 with 0.5", n, tokens)
	}

	// Keys are client bytes: invalid UTF-8, NUL and great length are
	// limited like any other key and recorded without failing the batch.
	before := vl.Written()
	for _, key := range []string{"bad\xff\x00key", strings.Repeat("long", 500)} {
		req := sluice.Request{Limit: lim, Key: key, Cost: 2}
		if d, err := conformance.Take(ctx, s, engine.OpTake, req); err != nil || !d.Allowed {
			t.Fatalf("first take of %q: %+v %v", key[:8], d, err)
		}
		if d, err := conformance.Take(ctx, s, engine.OpTake, req); err != nil || d.Allowed {
			t.Fatalf("second take of %q: %+v %v", key[:8], d, err)
		}
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := vl.Written() - before; got != 2 || vl.Failed() != 0 {
		t.Fatalf("%d violations written, %d failed; want 2 and 0", got, vl.Failed())
	}
}

// A server that says whom a request is for (sluice.WithCaller) gets the
// user, client and endpoint recorded with the rejection.
func TestStoreRecordsCaller(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer vl.Close()
	s := newStoreOpts(t, postgres.Options{Clock: sluice.NewManualClock(time.Now()), Violations: vl})
	lim := sluice.MustLimit(sluice.Spec{Name: "who", TokensPerSecond: 1, Burst: 1})
	cctx := sluice.WithCaller(ctx, sluice.Caller{User: "alice", IP: netip.MustParseAddr("2001:db8::7"), Endpoint: "/search"})
	for i := 0; i < 2; i++ {
		if _, err := conformance.Take(cctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "alice"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var user, ip, endpoint string
	if err := p.QueryRow(ctx, `SELECT user_id, host(ip_address), endpoint FROM sluice_violations WHERE rule = 'who'`).Scan(&user, &ip, &endpoint); err != nil {
		t.Fatal(err)
	}
	if user != "alice" || ip != "2001:db8::7" || endpoint != "/search" {
		t.Fatalf("recorded user %q ip %q endpoint %q", user, ip, endpoint)
	}
}

// ListViolations finds buckets by a value of their key: one component of
// a composite key, escaped as Match escapes it, or a whole bucket key;
// never a longer value, a rule named like the value or part of one.
func TestListViolationsByKey(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer vl.Close()
	// An hour ahead, where no other test records, so Since selects only
	// these.
	base := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	keys := []string{
		"tb:per-user:alice",
		"tb:per-user:alice2",
		"tb:alice:bob",
		"app:tb:combo:alice|/api/x",
		"tb:combo:bob|alice",
		"tb:combo:bob|alice|/y",
		"tb:per-user:" + policy.KeyComponent("a:b|c"),
		"tb:per-ip:2001:db8::/64",
		"tb:per-user:xalice",
		"tb:per-ip:192.0.2.7",
		"tb:hot:{5300}alice", // shards of a sharded limit
		"tb:hot:{12}bob|alice",
		"tb:hot:{7}xalice",
		"tb:per-client:" + policy.KeyComponent("2001:db8::/64"), // Envoy's remote_address
	}
	for i, k := range keys {
		vl.Record(postgres.Violation{BucketKey: k, Rule: "r", At: base.Add(time.Duration(i) * time.Millisecond)})
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key  string
		want []int // indexes into keys, newest first
	}{
		{"alice", []int{11, 10, 5, 4, 3, 0}},
		{"/api/x", []int{3}},
		{"a:b|c", []int{6}},
		{"alic", nil},
		{"2001:db8::/64", []int{13, 7}},
		{"2001:db8::42", []int{13, 7}}, // an IPv6 client's buckets are its /64's
		{"192.0.2.7", []int{9}},
		{"tb:per-user:alice2", []int{1}},
		{"bob", []int{11, 5, 4, 2}}, // rule alice's bucket of bob too
	} {
		vs, err := postgres.ListViolations(ctx, p, postgres.ViolationQuery{Since: base, Key: tc.key})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range vs {
			got = append(got, v.BucketKey)
		}
		var want []string
		for _, i := range tc.want {
			want = append(want, keys[i])
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("key %q: %q, want %q", tc.key, got, want)
		}
	}
}

// A database without the tables says so, as ErrNotMigrated, rather than
// with the server's words.
func TestListViolationsNotMigrated(t *testing.T) {
	pgtest.Require(t, server)
	ctx := pgtestContext(t)
	u, err := server.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	_, err = postgres.ListViolations(ctx, conn, postgres.ViolationQuery{Since: time.Now().Add(-time.Hour)})
	if !errors.Is(err, postgres.ErrNotMigrated) {
		t.Fatalf("err = %v, want ErrNotMigrated", err)
	}
}

// Attack: a user id of a few kilobytes (a user name the client chose,
// which an application names with sluice.WithCaller, or an identity
// provider's sub). user_id has a btree index, which refuses rows of about
// 2.7 KB, so COPY failed and the whole batch was lost: every other
// client's violations written with it, which the client so kept out of
// the audit trail by being refused once a second. The id is cut short
// enough for the index, where it is written and where it is looked up.
func TestAttackLongUserIDLosesViolations(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{BatchSize: 10, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer vl.Close()
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 6000)
	rand.NewChaCha8([32]byte{3}).Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	long, victim := string(b), fmt.Sprintf("victim-%d", time.Now().UnixNano())
	base := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	for _, u := range []string{victim, long, "é" + long} {
		vl.Record(postgres.Violation{BucketKey: "tb:per-user:" + u, UserID: u, At: base, Rule: "per-user"})
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if vl.Failed() != 0 {
		t.Fatalf("%d violations lost to a failed write", vl.Failed())
	}
	for _, u := range []string{victim, long, "é" + long} {
		got, err := postgres.ListViolations(ctx, p, postgres.ViolationQuery{Since: base, UserID: u})
		if err != nil || len(got) != 1 {
			t.Fatalf("violations of a %d-byte user id: %d, %v; want 1", len(u), len(got), err)
		}
	}
}

// Attack: a client flooding a limit it is over. Every rejection was
// queued and written as a row, thousands a second for as long as the
// client kept at it, with no bound and nothing deleting them: one client
// filled the database's disk. A bucket's rejections within one interval
// (ViolationOptions.PerBucket, a second by default) are one row, the
// others counted.
func TestAttackRejectionFloodFillsViolations(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	reg := prometheus.NewRegistry()
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(metrics.NewViolationLogCollector(vl))
	defer vl.Close()
	key := fmt.Sprintf("tb:per-user:flood-%d", time.Now().UnixNano())
	// The start of a second, and 10,000 rejections within it.
	base := time.Now().Add(-time.Minute).Truncate(time.Second)
	queued := 0
	for i := range 10000 {
		if vl.Record(postgres.Violation{BucketKey: key, Rule: "per-user", At: base.Add(time.Duration(i) * 50 * time.Microsecond)}) {
			queued++
		}
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := p.QueryRow(ctx, "SELECT count(*) FROM sluice_violations WHERE bucket_key = $1", key).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if queued != 1 || rows != 1 {
		t.Fatalf("10,000 rejections of one bucket within a second: %d queued, %d rows written; want 1", queued, rows)
	}
	if vl.Coalesced() != 9999 || metricValue(t, reg, "sluice_postgres_violations_coalesced_total") != 9999 || vl.Dropped() != 0 {
		t.Fatalf("coalesced %d (metric %v), dropped %d; want 9999 and 0", vl.Coalesced(), metricValue(t, reg, "sluice_postgres_violations_coalesced_total"), vl.Dropped())
	}
}

// A bucket is recorded once per interval of PerBucket, aligned to the
// Unix epoch, each bucket apart from the others; a violation of an
// earlier interval (a clock stepped back) starts one too. More buckets in
// an interval than the queue holds start a new one rather than grow the
// map: a bucket may then be recorded once more.
func TestViolationLogCoalescesPerBucket(t *testing.T) {
	p := pool(t)
	ctx := pgtestContext(t)
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{QueueSize: 100, PerBucket: 10 * time.Second, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer vl.Close()
	// The start of an interval of ten seconds, where no other test records.
	base := time.Now().Add(-2 * time.Hour).Truncate(10 * time.Second)
	key := func(s string) string { return fmt.Sprintf("tb:coalesce:%s-%d", s, base.UnixNano()) }
	for _, step := range []struct {
		key  string
		at   time.Duration
		want bool
	}{
		{"a", 0, true},
		{"b", time.Second, true},
		{"a", 9*time.Second + 999*time.Millisecond, false},
		{"b", 5 * time.Second, false},
		{"a", 10 * time.Second, true}, // the next interval
		{"b", 19 * time.Second, true},
		{"b", 19 * time.Second, false},
		{"a", 3 * time.Second, true}, // back to the first: a new one
		{"a", 4 * time.Second, false},
	} {
		if got := vl.Record(postgres.Violation{BucketKey: key(step.key), Rule: "r", At: base.Add(step.at)}); got != step.want {
			t.Errorf("%s at +%v: queued %v, want %v", step.key, step.at, got, step.want)
		}
	}
	if vl.Coalesced() != 4 {
		t.Fatalf("coalesced %d, want 4", vl.Coalesced())
	}

	// 100 buckets fill the map; the 101st starts an interval afresh, in
	// which the first is recorded once more, and once only.
	at := base.Add(25 * time.Second)
	for i := range 100 {
		vl.Record(postgres.Violation{BucketKey: key(fmt.Sprint("m", i)), Rule: "r", At: at})
	}
	if err := vl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if vl.Record(postgres.Violation{BucketKey: key("m1"), Rule: "r", At: at}) {
		t.Fatal("a bucket recorded twice before the map was full")
	}
	if !vl.Record(postgres.Violation{BucketKey: key("new"), Rule: "r", At: at}) {
		t.Fatal("a new bucket in a full map was not recorded")
	}
	if !vl.Record(postgres.Violation{BucketKey: key("m1"), Rule: "r", At: at}) || vl.Record(postgres.Violation{BucketKey: key("m1"), Rule: "r", At: at}) {
		t.Fatal("after a full map, a bucket is recorded once again, and once")
	}

	// PerBucket negative records every rejection.
	every, err := postgres.NewViolationLog(p, postgres.ViolationOptions{PerBucket: -1, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer every.Close()
	for i := range 3 {
		if !every.Record(postgres.Violation{BucketKey: key("every"), Rule: "r", At: base.Add(time.Duration(i))}) {
			t.Fatal("a rejection not recorded with PerBucket negative")
		}
	}
	if every.Coalesced() != 0 {
		t.Fatalf("coalesced %d with PerBucket negative", every.Coalesced())
	}
}

// Rows older than Retention are deleted at the log's start and by Expire,
// in batches; younger rows and the other tables are kept.
func TestViolationLogRetention(t *testing.T) {
	pgtest.Require(t, server)
	ctx := pgtestContext(t)
	// A database of its own: its rows are days old, which a log of
	// another test would delete.
	u, err := server.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := postgres.MigratePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	s, err := postgres.New(ctx, p, postgres.Options{HousekeepingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lim := sluice.MustLimit(sluice.Spec{Name: "kept", TokensPerSecond: 1, Burst: 5})
	if _, err := conformance.Take(ctx, s, engine.OpTake, sluice.Request{Limit: lim, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	insertOld := func(n int) {
		t.Helper()
		// Between eight and nine days old.
		if _, err := p.Exec(ctx, `INSERT INTO sluice_violations (bucket_key, requested_at, tokens_at_time, rule)
			SELECT 'tb:old:' || i, now() - interval '8 days' - i * interval '1 second', 0, 'old' FROM generate_series(1, $1) i`, n); err != nil {
			t.Fatal(err)
		}
	}
	count := func(sql string) int {
		t.Helper()
		var n int
		if err := p.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	insertOld(2500)
	if _, err := p.Exec(ctx, `INSERT INTO sluice_violations (bucket_key, requested_at, tokens_at_time, rule)
		VALUES ('tb:young:1', now() - interval '1 hour', 0, 'young'), ('tb:young:2', now() - interval '6 days', 0, 'young')`); err != nil {
		t.Fatal(err)
	}

	// Negative keeps every row.
	keep, err := postgres.NewViolationLog(p, postgres.ViolationOptions{Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := keep.Expire(ctx); n != 0 || err != nil {
		t.Fatalf("Expire with Retention negative: %d, %v", n, err)
	}
	keep.Close()
	if n := count("SELECT count(*) FROM sluice_violations"); n != 2502 {
		t.Fatalf("%d rows with Retention negative, want 2502", n)
	}

	// The default, seven days: the start's pass deletes the old rows.
	vl, err := postgres.NewViolationLog(p, postgres.ViolationOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer vl.Close()
	deadline := time.Now().Add(20 * time.Second)
	for count("SELECT count(*) FROM sluice_violations WHERE rule = 'old'") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the old rows were not deleted at the log's start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	insertOld(1500)
	if n, err := vl.Expire(ctx); n != 1500 || err != nil {
		t.Fatalf("Expire deleted %d, %v; want the 1500 old rows", n, err)
	}
	if n := count("SELECT count(*) FROM sluice_violations WHERE rule = 'young'"); n != 2 {
		t.Fatalf("%d young rows left, want 2", n)
	}
	if n := count("SELECT count(*) FROM sluice_buckets"); n != 1 {
		t.Fatalf("%d bucket rows, want the one the take wrote", n)
	}

	// The batch is found through the index on requested_at.
	if plan := explain(t, "SELECT ctid FROM sluice_violations WHERE requested_at < now() - interval '7 days' LIMIT 1000 FOR UPDATE SKIP LOCKED"); !strings.Contains(plan, "sluice_violations_time") {
		t.Errorf("the expired rows are not found by the index:\n%s", plan)
	}
}
