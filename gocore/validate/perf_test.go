package validate

import (
	"fmt"
	"testing"
	"time"

	"mpk/gocore/tgraph"
)

// bigGraph has the size of a real lowering: 1250 layers of 16 tiles (20k
// tasks), each layer triggering 4 counters of 4 producers (5k events); tile i
// of a layer reads the 4 tiles of the previous layer that counter i%4 covers,
// the whole weight buffer, and
// one tile of the same group written 8 layers back.
func bigGraph() *tgraph.Graph {
	const layers, tiles, groups, tile = 1250, 16, 4, 64
	b := NewBuilder(132)
	w := b.Buf("weight", tiles*tile)
	var bufs []int
	var prev []int
	for l := range layers {
		out := b.Buf(fmt.Sprintf("act%d", l), tiles*tile)
		bufs = append(bufs, out)
		evs := make([]int, groups)
		for g := range evs {
			evs[g] = b.Event()
		}
		for i := range tiles {
			g := i % groups
			accs := []Acc{W(out, int64(i*tile), int64(i*tile+tile)), R(w, 0, tiles*tile)}
			wait := none
			if prev != nil {
				wait = prev[g]
				for j := g; j < tiles; j += groups {
					accs = append(accs, R(bufs[l-1], int64(j*tile), int64(j*tile+tile)))
				}
			}
			if l >= 8 {
				accs = append(accs, R(bufs[l-8], int64(g*tile), int64(g*tile+tile)))
			}
			b.Task(fmt.Sprintf("op#%d", l), l, wait, evs[g], accs...)
		}
		prev = evs
	}
	b.Output(bufs[len(bufs)-1])
	return b.Finish()
}

func TestCheckLargeGraphFast(t *testing.T) {
	g := bigGraph()
	start := time.Now()
	err := Check(g)
	d := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Check: %d tasks, %d events in %v", len(g.Tasks), len(g.Events), d)
	if d > 300*time.Millisecond && !testing.Short() {
		t.Errorf("Check took %v on %d tasks, want well under 300ms", d, len(g.Tasks))
	}
}

func BenchmarkCheck(b *testing.B) {
	g := bigGraph()
	for b.Loop() {
		if err := Check(g); err != nil {
			b.Fatal(err)
		}
	}
}
