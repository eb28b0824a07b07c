package safety

import (
	"testing"

	"mpk/gocore/tgraph"
	"mpk/gocore/validate"
)

// decodeGraph turns fuzz bytes into a small task graph, ids sometimes out of
// range, Needed sometimes wrong, queues sometimes permuted.
func decodeGraph(data []byte) *tgraph.Graph {
	i := 0
	next := func(n int) int {
		if n <= 0 {
			return 0
		}
		if i >= len(data) {
			return 0
		}
		i++
		return int(data[i-1]) % n
	}
	b := validate.NewBuilder(1 + next(3))
	nb := 1 + next(3)
	for k := range nb {
		b.Buf(string(rune('a'+k)), 8)
	}
	ne := next(5)
	for range ne {
		if n := next(6); n < 4 {
			b.EventNeeding(n)
		} else {
			b.Event()
		}
	}
	nt := 1 + next(8)
	ev := func() int { return next(ne+2) - 1 } // None, 0..ne-1, or ne (out of range)
	for range nt {
		order, wait, trig := next(nt), ev(), ev()
		var accs []validate.Acc
		for range next(4) {
			lo := int64(next(8))
			accs = append(accs, validate.Acc{Buf: next(nb + 1), Lo: lo, Hi: lo + 1 + int64(next(8)), Write: next(2) == 0})
		}
		b.Task("f#0", order, wait, trig, accs...)
	}
	if next(2) == 0 {
		b.Output(next(nb))
	}
	g := b.Finish()
	// Shuffle queues: move up to two tasks to another position or worker.
	for range next(3) {
		w := next(len(g.Queues))
		if len(g.Queues[w]) == 0 {
			continue
		}
		t := g.Queues[w][next(len(g.Queues[w]))]
		g.Queues[w] = remove(g.Queues[w], t)
		w2 := next(len(g.Queues))
		q := g.Queues[w2]
		k := next(len(q) + 1)
		g.Queues[w2] = append(q[:k:k], append([]int{t}, q[k:]...)...)
		g.Tasks[t].Worker = w2
	}
	return g
}

func FuzzValidate(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 0, 5, 7, 2, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 2, 4, 4, 3, 0, 0, 1, 1, 0, 3, 0, 1, 2, 1, 2, 1, 2, 0, 0, 1, 0})
	f.Add([]byte("\x02\x01\x04\x05\x05\x05\x05\x06\x00\x00\x01\x02\x00\x04\x00\x01\x02\x03\x01\x01\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g := decodeGraph(data)
		err := validate.Check(g) // must not panic
		v := Oracle(g, OracleOptions{Runs: 8, Seed: 1})
		if v.Unsafe && err == nil {
			t.Fatalf("oracle: %s; validate accepted", v.Reason)
		}
	})
}
