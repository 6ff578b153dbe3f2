// Package quota leases slices of a limit's budget to this process, so
// that a hot key shared by a fleet (a global limit: "the whole fleet may
// call the provider 20,000 times per second") costs the shared store one
// call per slice instead of one per request, with a stated bound on how
// far the fleet may exceed the exact limit.
//
// # The model
//
// A Store wraps any sluice.Store (memory, Redis, Redis Cluster,
// PostgreSQL). For a limit that Configure leases, a process takes a
// slice of a key's budget with an ordinary, exact, atomic take of the
// slice's size, and then admits requests of that key locally from the
// slice until it runs out, its term ends or (fixed windows) its window
// ends. The unused tokens go back with an ordinary refund when the slice
// ends, when the key goes idle (Sweep), on reload (Configure) and on
// shutdown (Close). There is no new script, statement or store method:
// a slice is a take. Anything a slice cannot answer goes to the store
// exactly as without leasing, which is always safe: charging the store
// directly while slices are held can only under-admit.
//
// A key leases only once this process has seen HotAfter requests of it
// within one term; below that it is decided exactly. Its first slice is
// MinSlice tokens (or the request's cost); a slice used up within half
// its term doubles the next, one that ended more than half unused halves
// it (NextSize), never above the max slice (MaxSlice). A key's slice is
// topped up rather than added to, so a process holds at most one max
// slice of a key. One take per key is in flight at a time: the other
// requests of the key wait for it (within their context) rather than all
// going to the store. A slice the store refuses sends the request to
// the exact path and shrinks the next slice, and the key stays exact
// until the store's retry-after (at most a term) has passed.
//
// Reservations, peeks, refunds (a caller's, or settlement's), resets,
// sharded limits and concurrency leases pass through, exactly. A refund
// never adds to a slice: it goes to the store, which counts it as it
// always does. TakeAll charges its leased members to their slices when
// every one of them fits, and sends the others to the store; if the
// store refuses them, the local tokens go back to their slices
// (all-or-nothing). When one leased member's slice cannot answer, the
// whole batch goes to the store.
//
// A locally admitted Decision is allowed, with the limit's capacity, and
// a Remaining that is an estimate: the store's tokens when the slice was
// taken plus what is left in the slice.
//
// # The bound
//
// Over any interval of length T, the fleet admits at most
//
//	ExactAdmits(T) + N x max_slice
//
// tokens of one key, where ExactAdmits(T) is what the exact limit admits
// over T (a token bucket: capacity + rate x T; a fixed window: its
// capacity plus its rate at each boundary crossed, ceil(T/period)), and
// N the number of processes holding slices of that key (Overshoot).
//
// Why: every token the fleet admits was counted by the store, by an
// exact take or as part of a slice. Tokens the store counts within the
// interval are at most ExactAdmits(T) plus what was refunded to it
// within the interval; a refund of a slice taken within the interval
// cancels tokens counted within it. What remains beyond ExactAdmits(T)
// is what slices taken before the interval began supply within it, as
// local admissions or as refunds; a process holds at most one slice per
// key, of at most the max slice, so at most N x max_slice.
//
// Fixed windows need one more step: a slice is used only inside the
// window the store charged it to. The store's answer says how long its
// window has left (WindowUseBy); counted from when the take was sent,
// that is never after the window's end on the store's clock, whatever
// the clocks read, and a margin (a twentieth of the period, at most
// 250ms) covers the local clock running slow. A slice's leftovers go
// back only while a margin remains before that end; later they are
// dropped, and so is a TakeAll's put-back that finds the next slice on
// its way, which may be charged to the next window. A refund that is
// delayed into the next window anyway adds at most one slice of the
// process to it, within the same N x max_slice.
//
// The default max slice, 0.3% of the capacity, keeps three processes
// within 0.9% of a hot key's exact limit. Keys no process sees HotAfter
// times within a term hold no slice: their overshoot is zero. A process
// that stops without returning its slices (killed) loses them:
// under-admission, never over. A store that restarts empty forgets its
// counts, as in exact mode (up to one capacity more), and the slices
// held at that moment add at most N x max_slice, the same bound.
//
// # Choices
//
// The policy file's lease: section sits in a rule's algorithm_config,
// beside the concurrency rule's lease (its slot term, a duration): the
// same idea, a share of a limit held for a term, read by its shape.
// Configure returns an error for a limit that cannot be leased or
// Settings out of range, and changes nothing then. When the store
// refuses a request of a hot key, the refusal is kept until its
// retry-after (see the model above): without it a key over its limit
// would cost one store call per request, as in exact mode. sluice serve
// leases only over a shared store: over the memory store every decision
// is already local and exact. A fixed window's slice is dated by the
// store's own answer (WindowUseBy), not by computing the window from the
// local clock, which may be skewed from the store's.
//
// # Attacks
//
// The keys this process follows are bounded (Options.MaxKeys; beyond it
// keys are exact), so a client that makes up keys to make the process
// hold many slices holds at most that many. A request costing more than
// the max slice is decided exactly: it never makes a slice larger.
package quota
