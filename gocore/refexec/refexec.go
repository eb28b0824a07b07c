// Package refexec runs a task graph on the CPU with a float reference
// implementation of every task op, in a random order the events allow.
package refexec

import (
	"fmt"

	"mpk/gocore/ir"
	"mpk/gocore/tgraph"
)

// Run executes every task of tg over caller memory and returns how many ran.
func Run(g *ir.Graph, tg *tgraph.Graph, ptrs []uintptr, seed int64) (int, error) {
	return 0, fmt.Errorf("refexec: not implemented")
}
