package httpgate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httpgate"
	"github.com/sluicehq/sluice/insight"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/postgres"
	"github.com/sluicehq/sluice/postgres/pgtest"
	"github.com/sluicehq/sluice/redis"
)

// newFleetEnv is a process of a fleet on the store open returns, the
// live page on.
func newFleetEnv(t *testing.T, open func() sluice.Store) *env {
	t.Helper()
	e := newEnvOpts(t, mustPolicy(t, uiPolicy), func(sluice.Store) sluice.Store { return open() }, func(e *env, o *httpgate.Options) {
		o.Insight = insight.New(insight.Options{Clock: e.clk, Store: "redis://"})
	})
	e.env["ADMIN"] = adminToken
	return e
}

// processOf finds id in the fleet s lists.
func processOf(t *testing.T, s httpgate.Stats, id string) httpgate.StatsProcess {
	t.Helper()
	for _, p := range s.Fleet.Processes {
		if p.ID == id {
			return p
		}
	}
	t.Fatalf("the fleet lacks %s: %+v", id, s.Fleet)
	return httpgate.StatsProcess{}
}

// Two processes on one Redis: each publishes its statistics, and the
// page of either lists both, with each one's requests and share, and
// shows the fleet's totals, rules and hot keys merged; one that stops
// reporting is shown stale.
func TestStatsFleetOnRedis(t *testing.T) {
	addr := redistest.Server(t)
	prefix := fmt.Sprintf("fleet%d:", time.Now().UnixNano())
	testStatsFleet(t, func() sluice.Store {
		st, err := redis.Open("redis://"+addr+"/0", redis.Options{Clock: sluice.NewManualClock(sluiceEpoch), KeyPrefix: prefix, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	})
}

// The same fleet on PostgreSQL: each process a store of its own on one
// database.
func TestStatsFleetOnPostgres(t *testing.T) {
	srv := pgtest.ForTest(t)
	ctx := pgtest.Context(t)
	url, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testStatsFleet(t, func() sluice.Store {
		st, err := postgres.Open(ctx, url, postgres.Options{Clock: sluice.NewManualClock(sluiceEpoch), Migrate: true, HousekeepingInterval: -1, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		return st
	})
}

func testStatsFleet(t *testing.T, open func() sluice.Store) {
	e1, e2 := newFleetEnv(t, open), newFleetEnv(t, open)
	// per-user: burst 5 in the shared bucket. Process 1 takes 4 of
	// alice's, process 2 three more (1 admitted, 2 rejected) and 2 of
	// bob's.
	for range 4 {
		e1.post("/v1/take", `{"rule":"per-user","key":"alice"}`)
	}
	for range 3 {
		e2.post("/v1/take", `{"rule":"per-user","key":"alice"}`)
	}
	for range 2 {
		e2.post("/v1/take", `{"rule":"per-user","key":"bob"}`)
	}
	e1.clk.Advance(time.Second)
	e2.clk.Advance(time.Second)
	ctx := context.Background()
	for _, e := range []*env{e1, e2} {
		if err := e.gate.PublishFleet(ctx); err != nil {
			t.Fatal(err)
		}
	}
	id1, id2 := e1.gate.ProcessID(), e2.gate.ProcessID()
	if id1 == id2 || id1 == "" {
		t.Fatalf("process ids %q and %q", id1, id2)
	}
	for i, e := range []*env{e1, e2} {
		s := getStats(t, e, "Authorization", "Bearer "+adminToken)
		if !s.Fleet.Shared || len(s.Fleet.Processes) != 2 || s.Fleet.Error != "" || s.Fleet.Self != e.gate.ProcessID() {
			t.Fatalf("process %d's fleet: %+v", i+1, s.Fleet)
		}
		p1, p2 := processOf(t, s, id1), processOf(t, s, id2)
		if p1.Admitted != 4 || p1.Rejected != 0 || p2.Admitted != 3 || p2.Rejected != 2 || !p1.Live || !p2.Live || p1.State != "live" {
			t.Errorf("process %d's page: process 1 %+v, process 2 %+v", i+1, p1, p2)
		}
		if p1.Share+p2.Share < 0.999 || p1.Share+p2.Share > 1.001 || p1.Share < 0.44 || p1.Share > 0.45 {
			t.Errorf("shares %v and %v, want 4/9 and 5/9", p1.Share, p2.Share)
		}
		if p1.Self != (i == 0) || p2.Self != (i == 1) {
			t.Errorf("self: %v %v", p1.Self, p2.Self)
		}
		if sum(s.Requests.Admitted) != 7 || sum(s.Requests.Rejected) != 2 {
			t.Errorf("process %d's page: fleet requests %d admitted, %d rejected; want 7 and 2", i+1, sum(s.Requests.Admitted), sum(s.Requests.Rejected))
		}
		pu := s.Rules[0]
		if pu.Name != "per-user" || sum(pu.Allowed) != 7 || sum(pu.Rejected) != 2 {
			t.Errorf("process %d's page: per-user %d allowed, %d rejected; want 7 and 2", i+1, sum(pu.Allowed), sum(pu.Rejected))
		}
		tr := s.HotKeys.ByTraffic
		if tr.Total != 9 || len(tr.Keys) != 2 || tr.Keys[0].Key != "alice" || tr.Keys[0].Count != 7 || tr.Keys[1].Key != "bob" || tr.Keys[1].Count != 2 {
			t.Errorf("process %d's page: by traffic %+v", i+1, tr)
		}
		// The shared bucket, read once: alice spent hers.
		if k := tr.Keys[0]; k.Tokens == nil || *k.Tokens > 1 {
			t.Errorf("alice's shared bucket: %v tokens", deref(k.Tokens))
		}
	}
	// Process 2 stops reporting: past FleetLive, process 1's page shows
	// it stale, its counts of the window still in the totals.
	e1.clk.Advance(httpgate.FleetLive + time.Second)
	s := getStats(t, e1, "Authorization", "Bearer "+adminToken)
	if p2 := processOf(t, s, id2); p2.Live || p2.State != "stale" || p2.AgeMs < httpgate.FleetLive.Milliseconds() || p2.Admitted != 3 {
		t.Errorf("process 2, silent: %+v", p2)
	}
	if p1 := processOf(t, s, id1); !p1.Live || sum(s.Requests.Admitted) != 7 {
		t.Errorf("process 1 %+v, fleet admitted %d", p1, sum(s.Requests.Admitted))
	}
}

// Over the memory store a process is a fleet of one: itself, live, with
// its requests, and nothing published.
func TestStatsFleetOfOne(t *testing.T) {
	e, _ := newUIEnv(t, uiPolicy, adminToken)
	for range 7 { // burst 5: 5 admitted, 2 rejected
		e.post("/v1/take", `{"rule":"per-user","key":"alice"}`)
	}
	e.get("/v1/auth", "X-User", "carol", "X-Key", "k1", "X-Plan", "free") // three rules, one request
	e.clk.Advance(time.Second)
	if err := e.gate.PublishFleet(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := getStats(t, e, "Authorization", "Bearer "+adminToken)
	if s.Fleet.Shared || len(s.Fleet.Processes) != 1 || !s.Fleet.Processes[0].Self || !s.Fleet.Processes[0].Live || s.Fleet.Processes[0].Share != 1 {
		t.Fatalf("fleet: %+v", s.Fleet)
	}
	if sum(s.Requests.Admitted) != 6 || sum(s.Requests.Rejected) != 2 || s.Fleet.Processes[0].Admitted != 6 {
		t.Errorf("requests: %d admitted, %d rejected; want 6 and 2", sum(s.Requests.Admitted), sum(s.Requests.Rejected))
	}
}

// Attack: a report in the store with a time that JSON cannot write (at
// or started past the year 9999 or before year 0, a ranking's since
// before year 0, the earliest one the page shows), written by anyone who
// writes the store. Every process's page reads every
// report, and json.Marshal refused the whole answer: /v1/stats was a 500
// on each process of the fleet for as long as the report stayed. Such a
// report is refused as DecodeReport refuses one beyond its bounds, and
// the page shows the other processes.
func TestAttackFleetReportTimeBreaksPage(t *testing.T) {
	addr := redistest.Server(t)
	prefix := fmt.Sprintf("fleetattack%d:", time.Now().UnixNano())
	open := func() *redis.Store {
		st, err := redis.Open("redis://"+addr+"/0", redis.Options{Clock: sluice.NewManualClock(sluiceEpoch), KeyPrefix: prefix, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	e1, e2 := newFleetEnv(t, func() sluice.Store { return open() }), newFleetEnv(t, func() sluice.Store { return open() })
	e2.post("/v1/take", `{"rule":"per-user","key":"alice"}`)
	e1.clk.Advance(time.Second)
	e2.clk.Advance(time.Second)
	ctx := context.Background()
	for _, e := range []*env{e1, e2} {
		if err := e.gate.PublishFleet(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st := open()
	now := sluiceEpoch.UnixMilli()
	for i, tc := range []struct{ name, fields string }{
		{"at past 9999", fmt.Sprintf(`"at":%d,"started":%d`, int64(1)<<62, now)},
		{"at just past 9999", fmt.Sprintf(`"at":253402300800000,"started":%d`, now)},
		{"started before 0", fmt.Sprintf(`"at":%d,"started":%d`, now, -int64(1)<<62)},
		{"since before 0", fmt.Sprintf(`"at":%d,"started":%d,"by_traffic":{"since":%d,"keys":[]}`, now, now, -int64(1)<<40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprint("crafted-", i)
			old, _, err := st.LoadValue(ctx, "fleet:roster")
			if err != nil {
				t.Fatal(err)
			}
			roster := fmt.Sprintf(`{%q:%d,%q:%d,%q:%d}`, e1.gate.ProcessID(), now, e2.gate.ProcessID(), now, id, now)
			if ok, err := st.CompareAndSwapValue(ctx, "fleet:roster", old, roster, time.Minute); !ok || err != nil {
				t.Fatalf("roster: %v %v", ok, err)
			}
			rep := `{"id":"` + id + `","host":"h",` + tc.fields + `,"requests":[[1],[]]}`
			if ok, err := st.CompareAndSwapValue(ctx, "fleet:proc:"+id, "", rep, time.Minute); !ok || err != nil {
				t.Fatalf("report: %v %v", ok, err)
			}
			s := getStats(t, e1, "Authorization", "Bearer "+adminToken) // a 500 fails here
			if len(s.Fleet.Processes) != 2 || s.Fleet.Error != "" {
				t.Fatalf("fleet: %+v, want the two honest processes", s.Fleet)
			}
			if p2 := processOf(t, s, e2.gate.ProcessID()); p2.Admitted != 1 || sum(s.Requests.Admitted) != 1 {
				t.Errorf("process 2 %+v, fleet admitted %d; want 1 and 1", p2, sum(s.Requests.Admitted))
			}
		})
	}
}
