package httpgate

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Attack: a request refused a place is told how long until one frees,
// under the mutex every request of its limit takes. When that answer
// was a scan of every held place (on a2050d9), a client refused by its
// share again and again made each refusal look at all of max_queued's
// places, most of them other clients', holding up every request of the
// limit for as long. A refusal by its share looks at most at the key's
// own places, and one by a full queue at one place, however many other
// keys hold.
func TestAttackQueueRefusalScansEveryPlace(t *testing.T) {
	const others = 10000
	const most = 2*others + 2
	q := newRuleQueue("shaped", noShaping{})
	now := time.Unix(1_700_000_000, 0)
	for i := range others {
		p, _ := q.enter(most, fmt.Sprintf("client-%d", i), true, now)
		if p == nil {
			t.Fatalf("client %d refused a place in a queue of %d", i, most)
		}
		q.setTurn(p, now.Add(time.Duration(i+1)*time.Millisecond))
	}
	own, _ := q.enter(most, "attacker", true, now)
	if own == nil {
		t.Fatal("the attacker's first request was refused a place")
	}
	q.setTurn(own, now.Add(time.Hour))
	ownPlaces := q.byKey["attacker"].len()

	q.examined = 0
	for range 100 {
		p, room := q.enter(most, "attacker", true, now)
		if p != nil {
			t.Fatal("the attacker was given more than its share")
		}
		if room != time.Hour {
			t.Fatalf("room %v, want the attacker's own first turn, 1h", room)
		}
	}
	if q.examined > 100*ownPlaces {
		t.Fatalf("100 refusals by share looked at %d places: %d each, the key holds %d of the queue's %d",
			q.examined, q.examined/100, ownPlaces, len(q.held))
	}

	// Fill the queue: a refusal because it is full looks at one place.
	for i := 0; len(q.held) < most; i++ {
		if p, _ := q.enter(most, fmt.Sprintf("filler-%d", i), false, now); p != nil {
			q.setTurn(p, now.Add(2*time.Hour))
		}
	}
	q.examined = 0
	for range 100 {
		p, room := q.enter(most, "newcomer", true, now)
		if p != nil {
			t.Fatal("a place in a full queue")
		}
		if room != time.Millisecond {
			t.Fatalf("room %v in a full queue, want the first turn, 1ms", room)
		}
	}
	if q.examined > 100 {
		t.Fatalf("100 refusals by a full queue looked at %d places: %d each, of the queue's %d",
			q.examined, q.examined/100, len(q.held))
	}
}

// room is how long until the first place (of a key, or of any) frees,
// 0 while a place's turn is not known yet or has passed; a place given
// up no longer counts.
func TestQueueRoom(t *testing.T) {
	q := newRuleQueue("shaped", noShaping{})
	now := time.Unix(1_700_000_000, 0)
	enter := func(key string) *place {
		t.Helper()
		p, _ := q.enter(0, key, true, now)
		if p == nil {
			t.Fatalf("%s refused a place in a queue without bound", key)
		}
		return p
	}
	want := func(key string, d time.Duration) {
		t.Helper()
		q.mu.Lock()
		defer q.mu.Unlock()
		if got := q.room(key, now); got != d {
			t.Fatalf("room(%q) %v, want %v", key, got, d)
		}
	}
	want("", 0)
	want("a", 0)
	a1, a2, b1 := enter("a"), enter("a"), enter("b")
	want("a", 0) // turns not known yet
	q.setTurn(a1, now.Add(3*time.Second))
	want("a", 0) // a2's is not known yet
	q.setTurn(a2, now.Add(2*time.Second))
	want("a", 2*time.Second)
	want("", 0) // b1's is not known yet
	q.setTurn(b1, now.Add(5*time.Second))
	want("", 2*time.Second)
	want("b", 5*time.Second)
	q.leave(a2)
	want("a", 3*time.Second)
	want("", 3*time.Second)
	q.leave(a2) // twice: nothing changes
	want("a", 3*time.Second)
	now = now.Add(4 * time.Second) // a1's turn has passed
	want("a", 0)
	want("b", time.Second)
	q.leave(a1)
	want("a", 0)
	want("", time.Second)
	q.leave(b1)
	want("", 0)
	if len(q.byKey) != 0 || q.all.len() != 0 || len(q.held) != 0 {
		t.Fatalf("an empty queue keeps %d keys, %d places", len(q.byKey), q.all.len())
	}
}

// Across places taken, given turns and given up in any order, room is
// what a look at every held place says.
func TestQueueRoomMatchesEveryPlace(t *testing.T) {
	q := newRuleQueue("shaped", noShaping{})
	now := time.Unix(1_700_000_000, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	var held []*place
	keys := []string{"a", "b", "c", "d"}
	scan := func(key string) time.Duration {
		var room time.Duration
		first := true
		for p := range q.held {
			if key != "" && p.key != key {
				continue
			}
			w := max(p.at.Sub(now), 0) // a turn not known: zero
			if first || w < room {
				room, first = w, false
			}
		}
		return room
	}
	for i := range 5000 {
		switch op := rng.IntN(10); {
		case op < 4:
			p, room := q.enter(12, keys[rng.IntN(len(keys))], true, now)
			if p != nil {
				held = append(held, p)
			} else if room < 0 {
				t.Fatalf("step %d: room %v", i, room)
			}
		case op < 7 && len(held) > 0:
			q.setTurn(held[rng.IntN(len(held))], now.Add(time.Duration(1+rng.IntN(1000))*time.Millisecond))
		case op < 9 && len(held) > 0:
			j := rng.IntN(len(held))
			q.leave(held[j])
			held = append(held[:j], held[j+1:]...)
		default:
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		for _, key := range append([]string{""}, keys...) {
			q.mu.Lock()
			got, want := q.room(key, now), scan(key)
			q.mu.Unlock()
			if got != want {
				t.Fatalf("step %d: room(%q) %v, every place says %v", i, key, got, want)
			}
		}
		n := 0
		for _, k := range q.byKey {
			n += k.len()
		}
		if n != len(q.held) || q.all.len() != len(q.held) {
			t.Fatalf("step %d: %d held, %d by key, %d in turns", i, len(q.held), n, q.all.len())
		}
	}
}
