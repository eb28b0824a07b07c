package compiler

import (
	"fmt"
	"sort"

	"mpk/gocore/arena"
	"mpk/gocore/codegen"
	"mpk/gocore/decompose"
	"mpk/gocore/ir"
	"mpk/gocore/lower"
	"mpk/gocore/tgraph"
	"mpk/gocore/validate"
	"mpk/gocore/wire"
)

// tooLarge is the error for a step with more tasks or events than the
// runtime's tables hold (a long prompt chunk, a large batch): a limit the
// user can act on, said before the validator's capacity rule would call it
// a compiler bug.
func tooLarge(g *tgraph.Graph) *wire.Error {
	what, n, most := "tasks", len(g.Tasks), tgraph.MaxTasks
	if len(g.Events) > tgraph.MaxEvents {
		what, n, most = "events", len(g.Events), tgraph.MaxEvents
	}
	if n <= most {
		return nil
	}
	return &wire.Error{Kind: "bad_request",
		Message: fmt.Sprintf("this step needs %d %s, more than the %d the megakernel's tables hold", n, what, most),
		Hint:    "compile shorter prompt chunks or a smaller batch (each chunk length compiles once)"}
}

type pass struct {
	name string
	fn   func(c *Compiled, req *wire.Request) *wire.Error
}

// coarsenShare is decompose.Coarsen's bound: an op whose producers would
// each trigger more than 1 of its events on average (its tasks' sets
// overlap) waits on their union. At 2, a layer's attention whose sets share
// the k and v cache writes kept 4 sets, and each write reached them through
// relays, a hop more on the path to the attention.
const coarsenShare = 1

// passes is the pipeline, in order. The task-graph passes between decompose
// and schedule follow MPK's compiler (dependency analysis, event fusion,
// normalization, linearization); validate guards every launch.
var passes = []pass{
	{"lower", func(c *Compiled, req *wire.Request) *wire.Error {
		g, err := lower.LowerWith(&req.Graph, lower.ConfigFor(c.Options))
		c.Ops = g
		return err
	}},
	{"decompose", func(c *Compiled, _ *wire.Request) *wire.Error {
		c.Tasks = decompose.Decompose(c.Ops, c.Options.NumWorkers)
		if c.Options.WeightAffinity {
			decompose.WeightAffinity(c.Ops, c.Tasks)
		}
		if c.Options.TimedSchedule {
			decompose.EstimateTimes(c.Ops, c.Tasks)
		}
		return tooLarge(c.Tasks)
	}},
	{"depend", func(c *Compiled, _ *wire.Request) *wire.Error {
		c.preds = decompose.Depend(c.Tasks)
		return nil
	}},
	{"reduce", func(c *Compiled, _ *wire.Request) *wire.Error {
		c.preds = decompose.Reduce(c.Tasks, c.preds)
		return nil
	}},
	{"coarsen", func(c *Compiled, _ *wire.Request) *wire.Error {
		if c.Options.CoarseEvents {
			c.preds = decompose.Coarsen(c.Tasks, c.preds, coarsenShare)
		}
		return nil
	}},
	{"fuse_events", func(c *Compiled, _ *wire.Request) *wire.Error {
		c.fused = tgraph.FuseEvents(c.Tasks, c.preds)
		return nil
	}},
	{"normalize", func(c *Compiled, _ *wire.Request) *wire.Error {
		tgraph.Normalize(c.Tasks, c.fused)
		return tooLarge(c.Tasks) // with the relays and events
	}},
	{"linearize", func(c *Compiled, _ *wire.Request) *wire.Error {
		if err := tgraph.Linearize(c.Tasks); err != nil {
			return &wire.Error{Kind: "internal", Message: err.Error()}
		}
		return nil
	}},
	{"schedule", func(c *Compiled, _ *wire.Request) *wire.Error {
		tgraph.Schedule(c.Tasks, c.Options.TimedSchedule)
		return nil
	}},
	{"arena", func(c *Compiled, _ *wire.Request) *wire.Error {
		arena.Place(c.Ops, c.Tasks, c.Options.ArenaReuse)
		return nil
	}},
	{"debug_drop_dependency", func(c *Compiled, _ *wire.Request) *wire.Error {
		if c.Options.DropDependency {
			dropDependency(c.Tasks)
		}
		return nil
	}},
	{"validate", func(c *Compiled, _ *wire.Request) *wire.Error {
		if c.Options.SkipValidate {
			return nil
		}
		if err := validate.Check(c.Tasks); err != nil {
			return &wire.Error{Kind: "validation", Message: err.Error(),
				Hint: "the compiler built a task graph that could deadlock or race; this is a bug in mpk"}
		}
		return nil
	}},
	{"codegen", func(c *Compiled, _ *wire.Request) *wire.Error {
		if c.Options.Target != "cuda" {
			return nil
		}
		m, err := codegen.Generate(c.Ops, c.Tasks, codegen.Options{Trace: c.Options.Trace, SplitGemmX: c.Options.SplitGemmX,
			TileXParts: c.Options.TileXParts, WideXParts: c.Options.WideXParts,
			KVSwizzle: c.Options.KVSwizzle})
		if err != nil {
			return &wire.Error{Kind: "unsupported_op", Message: err.Error()}
		}
		c.Result.CUDA, c.Result.BulkInputs = m.Files, m.BulkInputs
		return nil
	}},
	{"summarize", func(c *Compiled, _ *wire.Request) *wire.Error {
		summarize(c)
		return nil
	}},
}

// dropDependency is a debug fault: the first event with consumers asks for one
// more trigger than it will ever get, so its consumers wait forever. It exists
// to prove that the runtime turns a hang into an error.
func dropDependency(g *tgraph.Graph) {
	for _, e := range g.Events {
		if e.Last > e.First {
			e.Needed++
			return
		}
	}
}

func summarize(c *Compiled) {
	s := c.Result.Summary
	s.Ops, s.Tasks, s.Events, s.Workers = len(c.Ops.Ops), len(c.Tasks.Tasks), len(c.Tasks.Events), c.Tasks.Workers
	s.ArenaBytes = c.Tasks.ArenaBytes
	s.TasksByOp, s.OpsByKind = map[string]int{}, map[string]int{}
	labels, nodes := make([]string, len(c.Ops.Ops)), make([]string, len(c.Ops.Ops))
	for i, op := range c.Ops.Ops {
		labels[i], nodes[i] = op.Label, op.Node
		s.OpsByKind[op.Label]++
	}
	s.OpLabels, s.OpNodes = labels, nodes
	for _, t := range c.Tasks.Tasks {
		if t.Op < 0 {
			s.EmptyTasks++
			continue
		}
		s.TasksByOp[labels[t.Op]]++
	}
	if c.Tasks.Queues != nil {
		for _, local := range tgraph.LocalWaits(c.Tasks) {
			if local {
				s.LocalWaits++
			}
		}
	}
	kinds := make([]string, 0, len(s.OpsByKind))
	for k := range s.OpsByKind {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	text := fmt.Sprintf("mpk task graph: %d ops, %d tasks (%d empty relays, %d local waits), %d events, %d workers, target %s, arena %s\n",
		s.Ops, s.Tasks, s.EmptyTasks, s.LocalWaits, s.Events, s.Workers, c.Options.Target, bytesText(s.ArenaBytes))
	for _, k := range kinds {
		text += fmt.Sprintf("  %-16s %4d ops %7d tasks\n", k, s.OpsByKind[k], s.TasksByOp[k])
	}
	s.Text = text
	for _, v := range c.Ops.Outputs {
		// A 0-d output's shape is [], never null.
		spec := wire.OutputSpec{Kind: "new", DType: v.DType().String(), Shape: append([]int64{}, v.Shape...),
			Strides: append([]int64{}, v.Strides...), Offset: v.Offset}
		if v.Buf.Kind == ir.Input {
			spec.Kind, spec.Input = "input", v.Buf.Index
		}
		c.Result.Outputs = append(c.Result.Outputs, spec)
	}
}

// bytesText writes a size in B, KB, MB or GB (powers of 1,000).
func bytesText(n int64) string {
	for _, u := range []struct {
		size float64
		name string
	}{{1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}} {
		if float64(n) >= u.size {
			return fmt.Sprintf("%.1f %s", float64(n)/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
