package compiler

import (
	"time"

	"mpk/gocore/refexec"
	"mpk/gocore/wire"
)

// RunReference executes the task graph on the CPU over caller memory: ptrs
// are the data pointers of the graph inputs, then of the outputs.
func (c *Compiled) RunReference(ptrs []uintptr, seed int64) (int, float64, *wire.Error) {
	start := time.Now()
	n, err := refexec.Run(c.Ops, c.Tasks, ptrs, seed)
	if err != nil {
		return n, 0, &wire.Error{Kind: "runtime", Message: err.Error()}
	}
	return n, float64(time.Since(start).Microseconds()) / 1000, nil
}
