package envoyrls

import (
	"cmp"
	"strconv"
	"strings"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluicehq/sluice/policy"
)

// ParseReferenceResources compiles the reference server's configuration
// as a control plane sends it over xDS (RateLimitConfig resources, each
// one domain) into the same policy ParseReferenceConfig makes of the
// YAML: every field the reference server reads from a resource (domain,
// descriptors with key, value, rate_limit, shadow_mode, detailed_metric,
// quota_mode; rate_limit's unit, requests_per_unit, unlimited, name and
// replaces) means what its YAML spelling means, and each limit keeps its
// buckets under the same name whichever resource or file it came from.
// Every problem is reported at once, as SOURCE: resource "NAME":
// path: message; a domain two resources name is refused, as the reference
// server refuses it. No resources is a policy that limits nothing, as a
// control plane with no rate limits configured sends.
func ParseReferenceResources(source string, cfgs []*rlsconf.RateLimitConfig) (*policy.Policy, error) {
	e := &refError{file: source}
	cfg := &Reference{domains: map[string]*refNode{}, overrides: map[overrideKey]*refLimit{}}
	for i, c := range cfgs {
		name := cmp.Or(c.GetName(), c.GetDomain())
		before := len(e.list)
		cfg.addDomain(e, refRoot{Domain: c.GetDomain(), Descriptors: protoDescriptors(c.GetDescriptors())}, 0, nil)
		for j := before; j < len(e.list); j++ {
			// Say which resource: a control plane's names (Envoy
			// Gateway's listener or policy names) are what its operator knows.
			e.list[j] = source + ": resource " + quoteIndex(name, i) + ": " + strings.TrimPrefix(e.list[j], source+": ")
		}
	}
	if len(e.list) > 0 {
		return nil, e
	}
	return referencePolicy(source, cfg)
}

func quoteIndex(name string, i int) string {
	if name == "" {
		return "#" + strconv.Itoa(i)
	}
	return strconv.Quote(name)
}

// protoDescriptors is ds as the YAML would have them, as the reference
// server converts them (config.ConfigXdsProtoToYaml).
func protoDescriptors(ds []*rlsconf.RateLimitDescriptor) []refDescriptor {
	out := make([]refDescriptor, 0, len(ds))
	for _, d := range ds {
		rd := refDescriptor{
			Key: d.GetKey(), Value: d.GetValue(),
			ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(), QuotaMode: d.GetQuotaMode(),
			Descriptors: protoDescriptors(d.GetDescriptors()),
		}
		if rl := d.GetRateLimit(); rl != nil {
			rpu := rl.GetRequestsPerUnit()
			rr := &refRateLimit{RequestsPerUnit: &rpu, Unlimited: rl.GetUnlimited(), Name: rl.GetName()}
			if rl.GetUnit() != rlsconf.RateLimitUnit_UNKNOWN {
				rr.Unit = rl.GetUnit().String()
			}
			for _, r := range rl.GetReplaces() {
				rr.Replaces = append(rr.Replaces, refReplace{Name: r.GetName()})
			}
			rd.RateLimit = rr
		}
		out = append(out, rd)
	}
	return out
}
