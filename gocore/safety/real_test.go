package safety

import (
	"testing"

	"mpk/gocore/tgraph"
)

// realGraphs returns the real lowerings available to tests (none yet).
func realGraphs(t testing.TB) []*tgraph.Graph { return nil }
