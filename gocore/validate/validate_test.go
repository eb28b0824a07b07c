package validate

import (
	"errors"
	"strings"
	"testing"

	"mpk/gocore/tgraph"
)

const none = tgraph.None

// diamond is embed → {left, right} → join, with left and right sharing the
// counter e1 (two producers, waited on in full):
//
//	task 0 embed#0  writes h          triggers e0
//	task 1 left#1   waits e0, h → l   triggers e1
//	task 2 right#2  waits e0, h → r   triggers e1 (or e2 if split)
//	task 3 join#3   waits e1, l,r → out (a graph output)
type diamond struct {
	b                   *Builder
	h, l, r, out        int
	e0, e1              int
	rightTrigger, extra int
}

func newDiamond(mod func(d *diamond)) *tgraph.Graph {
	b := NewBuilder(2)
	d := &diamond{b: b, h: b.Buf("h", 64), l: b.Buf("l", 64), r: b.Buf("r", 64), out: b.Buf("out", 64)}
	b.Output(d.out)
	d.e0, d.e1 = b.Event(), b.Event()
	d.rightTrigger = d.e1
	if mod != nil {
		mod(d)
	}
	b.Task("embed#0", 0, none, d.e0, W(d.h, 0, 64))
	b.Task("left#1", 1, d.e0, d.e1, R(d.h, 0, 64), W(d.l, 0, 64))
	b.Task("right#2", 2, d.e0, d.rightTrigger, R(d.h, 0, 64), W(d.r, 0, 64))
	b.Task("join#3", 3, d.e1, none, R(d.l, 0, 64), R(d.r, 0, 64), W(d.out, 0, 64))
	return b.Finish()
}

func TestCheck(t *testing.T) {
	cases := []struct {
		name  string
		pre   func(d *diamond)      // before Finish (waits, triggers)
		post  func(g *tgraph.Graph) // after Finish (Needed, ids, queues)
		rule  string                // "" = accepted
		tasks []int                 // must appear in Tasks and in the message
	}{
		{name: "valid diamond"},
		{name: "cycle", post: func(g *tgraph.Graph) {
			g.Tasks[3].Trigger = 0 // join feeds embed's counter: e0 → e1 → e0
			g.Events[0].Needed = 2
		}, rule: "cycle", tasks: []int{1, 3}},
		{name: "self loop", post: func(g *tgraph.Graph) { g.Tasks[3].Trigger = 1; g.Events[1].Needed = 3 },
			rule: "cycle", tasks: []int{3}},
		{name: "wait never satisfied", post: func(g *tgraph.Graph) { g.Events[1].Needed = 3 },
			rule: "unsatisfiable-wait", tasks: []int{3}},
		{name: "wait on event nobody triggers", post: func(g *tgraph.Graph) {
			g.Events = append(g.Events, &tgraph.Event{ID: 2, Needed: 1, First: 3, Last: 4})
			g.Events[1].First, g.Events[1].Last = 0, 0
			g.Tasks[3].Wait = 2
		}, rule: "no-producer", tasks: []int{3}},
		{name: "partial wait on shared counter", post: func(g *tgraph.Graph) { g.Events[1].Needed = 1 },
			rule: "partial-wait", tasks: []int{3, 1, 2}},
		{name: "read before writer", pre: func(d *diamond) { d.rightTrigger = d.b.Event() },
			rule: "unordered-read", tasks: []int{3, 2}},
		{name: "write after unordered write", post: func(g *tgraph.Graph) {
			g.Tasks[2].Writes = append(g.Tasks[2].Writes, tgraph.Access{Buf: 1, Ivs: []tgraph.Interval{{Lo: 0, Hi: 8}}})
		}, rule: "unordered-write", tasks: []int{2, 1}},
		{name: "tiles of one op overlap", post: func(g *tgraph.Graph) { g.Tasks[2].Order = 1; g.Tasks[2].Writes[0].Buf = 1 },
			rule: "unordered-write", tasks: []int{1, 2}},
		{name: "out-of-range event id", post: func(g *tgraph.Graph) { g.Tasks[1].Wait = 7 },
			rule: "ids", tasks: []int{1}},
		{name: "out-of-range buffer interval", post: func(g *tgraph.Graph) { g.Tasks[2].Reads[0].Ivs[0].Hi = 65 },
			rule: "ids", tasks: []int{2}},
		{name: "no workers", post: func(g *tgraph.Graph) { g.Workers = 0 }, rule: "capacity"},
		{name: "launch range", post: func(g *tgraph.Graph) { g.Events[0].Last = 2 },
			rule: "launch-range", tasks: []int{2}},
		{name: "task in no queue", post: func(g *tgraph.Graph) { g.Queues[1] = g.Queues[1][:1] },
			rule: "queue", tasks: []int{3}},
		{name: "queue order deadlocks", post: func(g *tgraph.Graph) {
			// worker 0 runs join before embed; worker 1 waits for embed.
			g.Queues = [][]int{{3, 0}, {1, 2}}
			for w, q := range g.Queues {
				for _, t := range q {
					g.Tasks[t].Worker = w
				}
			}
		}, rule: "queue-deadlock", tasks: []int{3, 1}},
		{name: "output not written", post: func(g *tgraph.Graph) { g.Tasks[3].Writes[0].Ivs[0].Hi = 32 },
			rule: "output"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := newDiamond(tc.pre)
			if tc.post != nil {
				tc.post(g)
			}
			err := Check(g)
			if tc.rule == "" {
				if err != nil {
					t.Fatalf("Check rejected a valid graph: %v", err)
				}
				return
			}
			var ve *Error
			if !errors.As(err, &ve) {
				t.Fatalf("Check = %v, want a *validate.Error with rule %q", err, tc.rule)
			}
			t.Log(err)
			if ve.Rule != tc.rule {
				t.Fatalf("rule %q, want %q: %v", ve.Rule, tc.rule, err)
			}
			if !strings.Contains(err.Error(), `validate: rule "`+tc.rule+`"`) {
				t.Errorf("message does not name the rule: %v", err)
			}
			for _, id := range tc.tasks {
				if !contains(ve.Tasks, id) {
					t.Errorf("Tasks = %v, want it to include %d", ve.Tasks, id)
				}
				if !strings.Contains(err.Error(), g.Name(id)) {
					t.Errorf("message does not name %q: %v", g.Name(id), err)
				}
			}
		})
	}
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestSharedArena: a chain a → b → c → out of temporaries in the arena
// (package arena). a and c may share bytes (every task of a happens-before
// every task of c); a and b may not (the task writing b reads a), nor may
// temporaries sit past the arena's end.
func TestSharedArena(t *testing.T) {
	build := func(place func(g *tgraph.Graph)) *tgraph.Graph {
		b := NewBuilder(2)
		x, y, z, out := b.Buf("a", 16), b.Buf("b", 16), b.Buf("c", 16), b.Buf("out", 16)
		b.Output(out)
		e0, e1, e2 := b.Event(), b.Event(), b.Event()
		b.Task("first#0", 0, none, e0, W(x, 0, 16))
		b.Task("second#1", 1, e0, e1, R(x, 0, 16), W(y, 0, 16))
		b.Task("third#2", 2, e1, e2, R(y, 0, 16), W(z, 0, 16))
		b.Task("last#3", 3, e2, none, R(z, 0, 16), W(out, 0, 16))
		g := b.Finish()
		for i, at := range []int64{0, 256, 512} { // a, b, c apart
			g.Buffers[i].InArena, g.Buffers[i].Arena, g.Buffers[i].ElemBytes = true, at, 4
		}
		g.ArenaBytes = 768
		place(g)
		return g
	}
	rule := func(err error) string {
		var ve *Error
		if errors.As(err, &ve) {
			return ve.Rule
		}
		return ""
	}
	for _, c := range []struct {
		name  string
		place func(g *tgraph.Graph)
		rule  string
	}{
		{"apart", func(g *tgraph.Graph) {}, ""},
		{"a and c share", func(g *tgraph.Graph) { g.Buffers[2].Arena = 0 }, ""},
		{"a and c overlap in part", func(g *tgraph.Graph) { g.Buffers[2].Arena = 32 }, ""},
		{"a and b share", func(g *tgraph.Graph) { g.Buffers[1].Arena = 0 }, "shared-arena"},
		{"b and c overlap in part", func(g *tgraph.Graph) { g.Buffers[2].Arena = 256 + 60 }, "shared-arena"},
		{"past the arena's end", func(g *tgraph.Graph) { g.ArenaBytes = 560 }, "ids"},
		{"misaligned", func(g *tgraph.Graph) { g.Buffers[1].Arena = 258 }, "ids"},
		{"an output in the arena", func(g *tgraph.Graph) {
			g.Buffers[3].InArena, g.Buffers[3].ElemBytes = true, 4
		}, "ids"},
	} {
		err := Check(build(c.place))
		if got := rule(err); got != c.rule || (c.rule == "") != (err == nil) {
			t.Errorf("%s: Check = %v, want rule %q", c.name, err, c.rule)
		}
	}
}
