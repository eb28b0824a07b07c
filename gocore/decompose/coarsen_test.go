package decompose

import (
	"slices"
	"testing"

	"mpk/gocore/tgraph"
)

// TestCoarsen: an op whose distinct predecessor sets overlap (its producers
// would each trigger several of its events) waits on their union; an op whose
// sets are disjoint, or whose tasks wait on one another, keeps its sets.
func TestCoarsen(t *testing.T) {
	ops := []int{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3}
	g := &tgraph.Graph{}
	for id, op := range ops {
		g.Tasks = append(g.Tasks, &tgraph.Task{ID: id, Op: op})
	}
	preds := [][]int{
		nil, nil, nil, nil,
		{0, 1, 2}, {1, 2, 3}, {0, 2, 3}, {0, 1, 3}, // op 1: 4 sets of 3 over 4 producers (share 3)
		{4}, {5}, {6}, {7}, // op 2: disjoint sets (share 1)
		{4, 5, 6}, {12, 7}, // op 3: its second task waits on its first
	}
	got := Coarsen(g, preds, 2)
	for id := 4; id < 8; id++ {
		if !slices.Equal(got[id], []int{0, 1, 2, 3}) {
			t.Errorf("task %d of the overlapping op waits on %v, want the union [0 1 2 3]", id, got[id])
		}
	}
	for id := 8; id < len(ops); id++ {
		if !slices.Equal(got[id], preds[id]) {
			t.Errorf("task %d waits on %v, want its own set %v", id, got[id], preds[id])
		}
	}
	if got := Coarsen(g, preds, 3); !slices.Equal(got[4], preds[4]) {
		t.Errorf("at a share of 3 the op keeps its sets: task 4 waits on %v", got[4])
	}
}

// TestCoarsenSinkJoinsAUnion: an op no task waits on (a fresh-row
// attention's KV-cache writes), whose sets lie in another op's union, waits
// on that union, so its producers trigger one event; an op some task waits
// on keeps its own sets.
func TestCoarsenSinkJoinsAUnion(t *testing.T) {
	ops := []int{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4}
	g := &tgraph.Graph{}
	for id, op := range ops {
		g.Tasks = append(g.Tasks, &tgraph.Task{ID: id, Op: op})
	}
	preds := [][]int{
		nil, nil, nil, nil,
		{0, 1, 2}, {1, 2, 3}, {0, 2, 3}, {0, 1, 3}, // op 1: coarsened to [0 1 2 3]
		{0, 1}, {1, 2}, // op 2: a sink whose overlapping sets lie in op 1's union
		{2, 3}, // op 3: waited on by op 4
		{10},
	}
	got := Coarsen(g, preds, 1)
	for id := 8; id < 10; id++ {
		if !slices.Equal(got[id], []int{0, 1, 2, 3}) {
			t.Errorf("sink task %d waits on %v, want op 1's union [0 1 2 3]", id, got[id])
		}
	}
	if !slices.Equal(got[10], preds[10]) {
		t.Errorf("task 10, waited on, waits on %v, want its own set %v", got[10], preds[10])
	}
}
