package policy

import (
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/engine"
)

// cond is one match condition: the source's value equals one of values,
// or, for path_prefix, starts with one of them.
type cond struct {
	src    source
	values []string
	prefix bool
}

// holds reports whether every condition of cs holds. With anyClaim, a
// claim's condition also holds when upstreams may read another bearer
// token than sluice (bearerAmbiguous): a rule then applies, as
// it would to the token they read (a tier does not: it could be a larger one).
func (e *eval) holds(cs []cond, anyClaim bool) bool {
	for _, c := range cs {
		if !e.holdsOne(c) && !(anyClaim && c.src.kind == srcJWT && e.bearerAmbiguous()) {
			return false
		}
	}
	return true
}

func (e *eval) holdsOne(c cond) bool {
	if c.prefix {
		clean, lenient := e.paths()
		for _, v := range c.values {
			if strings.HasPrefix(clean, v) || (lenient != "" && strings.HasPrefix(lenient, v)) {
				return true
			}
		}
		return false
	}
	if c.src.multi() {
		for _, g := range e.values(c.src) {
			if slices.Contains(c.values, g) {
				return true
			}
		}
		return false
	}
	// One value: compared without a slice to hold it.
	g, ok := e.value(c.src)
	return ok && slices.Contains(c.values, g)
}

// costSpec is how a request's cost is found.
type costSpec struct {
	src   *source // nil: fixed
	fixed float64 // cost when src is nil
	def   float64 // cost when src is absent or not a usable number
	min   float64 // the least a declared cost is charged (<= def)
}

// cost returns the request's cost under c. A value that is absent, not a
// number, NaN, zero or negative costs the default; a positive value below
// the floor costs the floor, so a client declaring a tiny cost cannot
// pass a multiple of the burst. A value above the limit's capacity
// (infinity included) is returned as it is, so the rule rejects the
// request, which could never succeed, without charging anything: a client
// never pays less by sending an absurd cost.
func (e *eval) cost(c costSpec) float64 {
	if c.src == nil {
		return c.fixed
	}
	if c.src.kind == srcBody {
		// A key given twice is as ambiguous as a query parameter given
		// twice: an upstream may read either.
		vs, ok := e.bodyCost(*c.src)
		switch {
		case !ok || len(vs) == 0:
			return c.def
		case len(vs) == 1:
			return parseCost(vs[0], c)
		}
		return mostCost(vs, c)
	}
	if vs, amb := e.ambiguous(*c.src); amb {
		return mostCost(vs, c) // the most any server could read
	}
	v, ok := e.value(*c.src)
	if !ok {
		return c.def
	}
	return parseCost(v, c)
}

// mostCost is the most that any of vs costs, never less than c.def.
func mostCost(vs []string, c costSpec) float64 {
	most := c.def
	for _, v := range vs {
		most = max(most, parseCost(v, c))
	}
	return most
}

// parseCost reads a declared cost: c.def when it is not a usable number,
// at least c.min when it is.
func parseCost(v string, c costSpec) float64 {
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	switch {
	case (err != nil && !math.IsInf(f, 1)) || math.IsNaN(f) || f <= 0:
		return c.def
	case f < c.min:
		return c.min
	case f*engine.TokenScale < 1: // below what a store can count
		return c.def
	}
	return f
}
