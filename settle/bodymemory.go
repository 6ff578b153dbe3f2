package settle

import "sync"

// BodyMemory bounds the request bodies that ReadBody holds at once: in
// all, and for each client. Without a bound per client, one client
// declaring large bodies and sending them slowly would hold the whole
// bound, and every other client's body would go unread, charged its
// rule's default_cost: one client would move every other client's limit.
// With it, a client beyond its share finds its own bodies unread, and
// the rest of the bound stays for the others. It is safe for concurrent
// use.
type BodyMemory struct {
	perClient int64

	mu   sync.Mutex
	free int64            // of the bound in all
	held map[string]int64 // by client, only those holding some
}

// NewBodyMemory bounds the bodies held at once at total bytes, and those
// of one client at perClient bytes.
func NewBodyMemory(total, perClient int64) *BodyMemory {
	return &BodyMemory{perClient: perClient, free: total, held: map[string]int64{}}
}

// take reserves n bytes for client, reporting whether they fit both
// bounds. The client "" (one whose address is unknown, as behind a Unix
// socket, where no two clients can be told apart) is bounded by the total
// alone.
func (m *BodyMemory) take(client string, n int64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n > m.free || client != "" && m.held[client]+n > m.perClient {
		return false
	}
	m.free -= n
	if client != "" {
		m.held[client] += n
	}
	return true
}

// give returns n bytes that take reserved for client. A client holding
// nothing is forgotten, so the map holds only the clients with a body in
// hand.
func (m *BodyMemory) give(client string, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.free += n
	if client == "" {
		return
	}
	if m.held[client] -= n; m.held[client] <= 0 {
		delete(m.held, client)
	}
}
