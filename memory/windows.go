package memory

import (
	"github.com/sluicehq/sluice"
	_ "github.com/sluicehq/sluice/engine" // the windows Limit.Evaluate dispatches to
)

// windowed reports whether p's windows are package engine's: a sliding
// window, or a window aligned to the calendar. Their state holds a third
// number (entry.prev), read under the shard's lock only.
func windowed(p *sluice.Params) bool {
	return p.Algorithm == sluice.SlidingWindow || p.Calendar != 0
}
