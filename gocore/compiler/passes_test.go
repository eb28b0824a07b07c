package compiler

import (
	"strings"
	"testing"

	"mpk/gocore/tgraph"
)

// TestTooLarge: a step past the runtime's tables is a bad request that
// says how many and what to do, not the validator's "bug in mpk".
func TestTooLarge(t *testing.T) {
	if err := tooLarge(&tgraph.Graph{Tasks: make([]*tgraph.Task, tgraph.MaxTasks)}); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	err := tooLarge(&tgraph.Graph{Tasks: make([]*tgraph.Task, tgraph.MaxTasks+1)})
	if err == nil || err.Kind != "bad_request" || !strings.Contains(err.Message, "1048577 tasks") ||
		!strings.Contains(err.Hint, "shorter prompt chunks") {
		t.Fatalf("past the tasks' limit: %v", err)
	}
	err = tooLarge(&tgraph.Graph{Events: make([]*tgraph.Event, tgraph.MaxEvents+1)})
	if err == nil || !strings.Contains(err.Message, "1048577 events") {
		t.Fatalf("past the events' limit: %v", err)
	}
}
