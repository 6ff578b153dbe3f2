package httpgate

import (
	"context"
	"io"
	"log/slog"
)

// Audit writes one JSON line per rejection: time, rule, key, client IP,
// path and the tokens left at the time. It is safe for concurrent use. A
// nil *Audit records nothing.
type Audit struct {
	log *slog.Logger
}

// NewAudit writes records to w (typically a file opened for append).
func NewAudit(w io.Writer) *Audit { return &Audit{log: slog.New(slog.NewJSONHandler(w, nil))} }

// Record is one rejection.
type Record struct {
	Rule     string
	Key      string
	ClientIP string
	Path     string
	Tokens   float64
	Shadow   bool
	Reason   string
}

// Write records r.
func (a *Audit) Write(ctx context.Context, r Record) {
	if a == nil {
		return
	}
	attrs := []slog.Attr{
		slog.String("rule", r.Rule),
		slog.String("key", r.Key),
		slog.String("client_ip", r.ClientIP),
		slog.String("path", r.Path),
		slog.Float64("tokens", r.Tokens),
		slog.String("reason", r.Reason),
	}
	if r.Shadow {
		attrs = append(attrs, slog.Bool("shadow", true))
	}
	a.log.LogAttrs(ctx, slog.LevelInfo, "rejected", attrs...)
}
