package sluice

import (
	"context"
	"net/netip"
)

// Caller describes whom a request is limited for, beyond its bucket key:
// the user (a verified JWT subject), the client address and the endpoint.
// Servers attach it to the context of their store calls so that a store
// keeping a record of rejections (the PostgreSQL violations table) can say
// who was rejected; the decision itself never depends on it.
type Caller struct {
	User     string
	IP       netip.Addr
	Endpoint string
}

type callerKey struct{}

// callerCtx is a context carrying a Caller: one allocation per request,
// where context.WithValue takes two (the context, and the Caller boxed to
// be its value). The Caller is boxed only when asked for, which few stores
// do.
type callerCtx struct {
	context.Context
	c Caller
}

func (c *callerCtx) Value(key any) any {
	if key == (callerKey{}) {
		return c.c
	}
	return c.Context.Value(key)
}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context { return &callerCtx{Context: ctx, c: c} }

// CallerFrom returns the Caller that ctx carries, if any.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}
