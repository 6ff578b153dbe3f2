package policy

// Settlement's configuration: a rule charges an estimate up front
// (cost_source, which may read a field of the request's JSON body) and
// settles with the actual cost once the response says it (settle_from in
// algorithm_config, a settle.Source, which package settle reads).

import (
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/engine"
	"github.com/sluicehq/sluice/settle"
)

// CostBodyLimit is the most of a request body that a body:PATH
// cost_source reads. A longer body is not parsed: its request costs the
// rule's default_cost, as a body without the field or one that is not
// JSON does.
const CostBodyLimit = 1 << 20

// settleFrom reads an algorithm_config's settle_from, unsettled_cost and
// stream_usage into v, for a limit of spec.
func (l *loader) settleFrom(o *obj, v *variant, spec *sluice.Spec) {
	s, n, ok := o.str("settle_from")
	var sf *settle.Source
	if ok {
		var err error
		if sf, err = settle.Parse(s); err != nil {
			l.errf(n, join(o.path, "settle_from"), "%v", err)
		} else if spec.Algorithm == sluice.SlidingWindow || spec.Algorithm == sluice.SlidingLog || spec.Calendar != 0 {
			// Each forgives what a request used beyond its window at the
			// window's end (TestAttackSettleOvershootForgivenOnSlidingLog).
			l.errf(n, join(o.path, "settle_from"), "a sliding window, a sliding log or a calendar period keeps no debt, so what a response reports beyond its window would be forgiven: settle on a token bucket, or on a fixed window whose period is a duration")
		}
	}
	needs := func(field string) string {
		switch {
		case !ok:
			return field + " applies only with settle_from (it is what a request is charged when its response does not state the cost settle_from reads)"
		case sf != nil && sf.Kind == settle.Caller:
			return field + " does not apply with settle_from: caller (the decision API's caller states every cost)"
		}
		return ""
	}
	if c, n, has := o.num("unsettled_cost"); has {
		switch msg := needs("unsettled_cost"); {
		case msg != "":
			l.errf(n, join(o.path, "unsettled_cost"), "%s", msg)
		case !(c > 0) || c > maxUnsettled:
			l.errf(n, join(o.path, "unsettled_cost"), "must be > 0 and at most %v (got %v)", maxUnsettled, c)
		case sf != nil:
			sf.Unsettled = c
		}
	}
	if u, n, has := o.str("stream_usage"); has {
		switch msg := needs("stream_usage"); {
		case msg != "":
			l.errf(n, join(o.path, "stream_usage"), "%s", msg)
		case u != "include" && u != "off":
			l.errf(n, join(o.path, "stream_usage"), "must be include (add stream_options.include_usage to requests whose JSON body sets \"stream\": true) or off (got %q)", u)
		case sf != nil && sf.Kind != settle.Body:
			l.errf(n, join(o.path, "stream_usage"), "applies only with settle_from: body:PATH (the usage an OpenAI-style stream sends is in its last event)")
		case sf != nil:
			sf.StreamUsage = u == "include"
		}
	}
	v.settle = sf
}

// maxUnsettled bounds unsettled_cost at two billion tokens: the most a
// settlement's debt can reach on any limit (sluice.Limit.SettleDebt).
const maxUnsettled = 2e9

// settleDefault gives v's settle_from, once v's limit is built, its
// default unsettled_cost: the most one request of the limit may cost (its
// capacity; what two shards hold; the debt bound of a bucket that holds
// nothing), so that a response that states nothing costs as much as any.
func settleDefault(v *variant) {
	if v.settle == nil || v.settle.Unsettled > 0 {
		return
	}
	most := v.limit.MaxCost()
	if most <= 0 {
		most = engine.FromMicroTokens(v.limit.Params().MaxReserved)
	}
	v.settle.Unsettled = min(most, maxUnsettled)
}

// MinSettleSecret is the shortest settle_secret_env key accepted: whoever
// knows it can mint handles that refund any key.
const MinSettleSecret = 32

// SettleFrom returns where the actual cost of a request charged to lim,
// r's own limit or one of its tiers', is found: nil when lim does not
// settle. r may be nil.
func (r *Rule) SettleFrom(lim *sluice.Limit) *settle.Source {
	if r == nil {
		return nil
	}
	for _, v := range r.variants() {
		if v.limit == lim {
			return v.settle
		}
	}
	return nil
}

// ReadsBody reports whether a rule's cost_source reads the request body
// (body:PATH), or its stream_usage rewrites it: a caller of Match then
// sets Input.Body.
func (p *Policy) ReadsBody() bool { return p.readsBody }

// SettleHeaders lists the headers and trailers that the rules' settle_from
// read from responses, canonical, each once. A client must not be the one
// to set them: the proxy and the middleware drop them from requests, so
// that an upstream that echoes request headers cannot be made to state a
// client's own cost. The list is the policy's: not to be changed.
func (p *Policy) SettleHeaders() []string { return p.settleHeaders }

// settleNeeds finds, once p's rules are loaded, what ReadsBody and
// SettleHeaders report: a door asks them of every request.
func (p *Policy) settleNeeds() {
	for _, r := range p.Rules {
		for _, v := range r.variants() {
			p.readsBody = p.readsBody || (v.cost.src != nil && v.cost.src.kind == srcBody) || (v.settle != nil && v.settle.StreamUsage)
			if s := v.settle; s != nil && (s.Kind == settle.Header || s.Kind == settle.Trailer) && !slices.Contains(p.settleHeaders, s.Name) {
				p.settleHeaders = append(p.settleHeaders, s.Name)
			}
		}
	}
}

// bodyCost reads a body:PATH cost: the values at the path of the request
// body's JSON, as Input.Body holds it. ok is false when there is no body
// or it is not JSON, and vals empty when the path is absent.
func (e *eval) bodyCost(src source) (vals []string, ok bool) {
	if len(e.r.Body) == 0 {
		return nil, false
	}
	path, _ := settle.ParsePath(src.name)
	vals, ok = settle.Values(e.r.Body, path)
	for i, v := range vals {
		// A number in a string is read as pydantic reads one for an
		// integer field, as model servers validate their requests:
		// "9_000" is 9000 (TestAttackBodyCostNumberInString).
		if s, err := strconv.Unquote(v); err == nil {
			vals[i] = strings.ReplaceAll(s, "_", "")
		}
	}
	return vals, ok
}
