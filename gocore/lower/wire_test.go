package lower

import (
	"strings"
	"testing"

	"mpk/gocore/ir"
	"mpk/gocore/wire"
)

func meta(dt string, shape ...int64) *wire.Meta {
	return &wire.Meta{DType: dt, Shape: shape, Strides: ir.ContiguousStrides(shape)}
}

func nodeArg(name string) wire.Arg { return wire.Arg{K: "node", Node: name} }
func intArg(i int64) wire.Arg      { return wire.Arg{K: "int", I: i} }

// wireGraph has inputs x [2,3] and y [4] (float32) and the given nodes; its
// output is the last node.
func wireGraph(nodes ...wire.Node) *wire.Graph {
	g := &wire.Graph{Inputs: []wire.Input{
		{Name: "x", Kind: "input", Meta: *meta("float32", 2, 3)},
		{Name: "y", Kind: "param", Meta: *meta("float32", 4)},
	}, Nodes: nodes}
	if len(nodes) > 0 {
		g.Outputs = []wire.Arg{nodeArg(nodes[len(nodes)-1].Name)}
	}
	return g
}

func TestLowerWireGraph(t *testing.T) {
	g, err := Lower(wireGraph(wire.Node{Name: "add", Target: "aten.add.Tensor",
		Args: []wire.Arg{nodeArg("x"), nodeArg("x")}, Outs: []*wire.Meta{meta("float32", 2, 3)}}))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Ops) != 1 || g.Ops[0].Kind != ir.Elementwise || g.Ops[0].Label != "residual_add" && g.Ops[0].Label != "elementwise" {
		t.Fatalf("ops:\n%s", g.Dump())
	}
	op := g.Ops[0]
	if got := op.Attr.Expr.String(); got != "float32(add(in0,in0))" && got != "float32(add(in0,in1))" {
		t.Errorf("expr %s, want x+x", got)
	}
	if op.Node != "add" || op.Target != "aten.add.Tensor" {
		t.Errorf("op located at %q %q, want the add node", op.Node, op.Target)
	}
	if o := g.Outputs[0]; o.Buf.Kind != ir.Output || o.Buf.Index != 0 || op.Out.Buf != o.Buf {
		t.Errorf("output %v (kind %d) is not the add's output buffer", o, o.Buf.Kind)
	}
	if len(g.Inputs) != 2 || !g.Inputs[1].Param || g.Inputs[0].Param {
		t.Errorf("inputs %v: want x (not a param) and y (a param)", g.Inputs)
	}
}

func TestLowerErrors(t *testing.T) {
	const src = "model.py:7  y = torch.fft.rfft(x)"
	cases := []struct {
		name    string
		g       *wire.Graph
		kind    string
		node    string
		message string // substring
	}{
		{"unsupported op", wireGraph(wire.Node{Name: "fft", Target: "aten._fft_r2c.default", Source: src,
			Args: []wire.Arg{nodeArg("x")}, Outs: []*wire.Meta{meta("float32", 2, 2)}}),
			"unsupported_op", "fft", "aten._fft_r2c.default"},
		{"dropout in attention", wireGraph(wire.Node{Name: "sdpa", Target: "aten.scaled_dot_product_attention.default", Source: src,
			Args:   []wire.Arg{nodeArg("x"), nodeArg("x"), nodeArg("x")},
			Kwargs: map[string]wire.Arg{"dropout_p": {K: "float", F: 0.1}}, Outs: []*wire.Meta{meta("float32", 2, 3)}}),
			"unsupported_op", "sdpa", "dropout"},
		{"symbolic size in a list", wireGraph(wire.Node{Name: "permute", Target: "aten.permute.default", Source: src,
			Args: []wire.Arg{nodeArg("x"), {K: "list", List: []wire.Arg{{K: "str", S: "s0"}, intArg(0)}}},
			Outs: []*wire.Meta{meta("float32", 3, 2)}}),
			"invalid_graph", "permute", "symbolic sizes are not supported"},
		{"symbolic scalar", wireGraph(wire.Node{Name: "tr", Target: "aten.transpose.int", Source: src,
			Args: []wire.Arg{nodeArg("x"), {K: "str", S: "s0"}, intArg(1)}, Outs: []*wire.Meta{meta("float32", 3, 2)}}),
			"invalid_graph", "tr", "symbolic sizes are not supported"},
		{"matmul shape mismatch", wireGraph(wire.Node{Name: "mm", Target: "aten.mm.default", Source: src,
			Args: []wire.Arg{nodeArg("x"), nodeArg("x")}, Outs: []*wire.Meta{meta("float32", 2, 3)}}),
			"invalid_graph", "mm", "matmul of [1 2 3] by [1 2 3]"},
		{"broadcast mismatch", wireGraph(wire.Node{Name: "add", Target: "aten.add.Tensor", Source: src,
			Args: []wire.Arg{nodeArg("x"), nodeArg("y")}, Outs: []*wire.Meta{meta("float32", 2, 3)}}),
			"invalid_graph", "add", "cannot broadcast shape [4] to [2 3]"},
		{"lowered shape differs from traced", wireGraph(wire.Node{Name: "t", Target: "aten.t.default", Source: src,
			Args: []wire.Arg{nodeArg("x")}, Outs: []*wire.Meta{meta("float32", 2, 3)}}),
			"invalid_graph", "t", "lowered shape [3 2] differs from traced shape [2 3]"},
		{"reshape changes numel", wireGraph(wire.Node{Name: "view", Target: "aten.view.default", Source: src,
			Args: []wire.Arg{nodeArg("x"), {K: "list", List: []wire.Arg{intArg(7)}}}, Outs: []*wire.Meta{meta("float32", 7)}}),
			"invalid_graph", "view", "reshape of [2 3] elements into [7]"},
		{"write into a parameter", wireGraph(wire.Node{Name: "copy_", Target: "aten.copy_.default", Source: src,
			Args: []wire.Arg{nodeArg("y"), nodeArg("y")}, Outs: []*wire.Meta{meta("float32", 4)}}),
			"invalid_graph", "copy_", "writes into parameter y"},
		{"unknown argument node", wireGraph(wire.Node{Name: "neg", Target: "aten.neg.default", Source: src,
			Args: []wire.Arg{nodeArg("nope")}, Outs: []*wire.Meta{meta("float32", 2, 3)}}),
			"invalid_graph", "neg", `unknown node "nope"`},
		{"missing metadata", wireGraph(wire.Node{Name: "neg", Target: "aten.neg.default", Source: src,
			Args: []wire.Arg{nodeArg("x")}}),
			"invalid_graph", "neg", "no tensor metadata"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := Lower(c.g)
			if err == nil {
				t.Fatalf("lowered without error:\n%s", g.Dump())
			}
			if g != nil {
				t.Error("a failed Lower returned a graph")
			}
			if err.Kind != c.kind || !strings.Contains(err.Message, c.message) {
				t.Errorf("error %s %q, want %s containing %q", err.Kind, err.Message, c.kind, c.message)
			}
			target := ""
			for _, n := range c.g.Nodes {
				if n.Name == c.node {
					target = n.Target
				}
			}
			if err.Node != c.node || err.Op != target || err.Source != src {
				t.Errorf("error located at node %q op %q source %q, want %q %q %q", err.Node, err.Op, err.Source, c.node, target, src)
			}
			if c.kind == "unsupported_op" && err.Hint == "" {
				t.Error("unsupported_op error without a hint")
			}
		})
	}
	t.Run("graph output is not a tensor", func(t *testing.T) {
		g := wireGraph()
		g.Outputs = []wire.Arg{intArg(3)}
		_, err := Lower(g)
		if err == nil || err.Kind != "invalid_graph" || !strings.Contains(err.Message, "graph output 0 is a int") || err.Node != "" {
			t.Errorf("error %+v, want an unlocated invalid_graph about output 0", err)
		}
	})
	t.Run("input with negative stride", func(t *testing.T) {
		g := wireGraph()
		g.Inputs[0].Meta.Strides = []int64{-3, 1}
		_, err := Lower(g)
		if err == nil || !strings.Contains(err.Message, "negative stride -3 in dim 0") {
			t.Errorf("error %v, want a negative-stride error", err)
		}
	})
}

// addmmGraph is addmm(b, x, t(W)) for 3 rows of 4 into 5, with kwargs.
func addmmGraph(kwargs map[string]wire.Arg) *wire.Graph {
	return &wire.Graph{Inputs: []wire.Input{
		{Name: "x", Kind: "input", Meta: *meta("float32", 3, 4)},
		{Name: "w", Kind: "param", Meta: *meta("float32", 5, 4)},
		{Name: "b", Kind: "param", Meta: *meta("float32", 5)},
	}, Nodes: []wire.Node{
		{Name: "wt", Target: "aten.t.default", Args: []wire.Arg{nodeArg("w")}, Outs: []*wire.Meta{{DType: "float32", Shape: []int64{4, 5}, Strides: []int64{1, 4}}}},
		{Name: "addmm", Target: "aten.addmm.default", Args: []wire.Arg{nodeArg("b"), nodeArg("x"), nodeArg("wt")},
			Kwargs: kwargs, Outs: []*wire.Meta{meta("float32", 3, 5)}},
	}, Outputs: []wire.Arg{nodeArg("addmm")}}
}

// TestBiasFoldsIntoLinear: a projection with a bias becomes one Linear that
// adds the bias, broadcast over the rows, as it stores: no elementwise stage
// after it.
func TestBiasFoldsIntoLinear(t *testing.T) {
	lg, err := Lower(addmmGraph(nil))
	if err != nil {
		t.Fatal(err)
	}
	if kinds(lg) != "linear:linear+residual" {
		t.Fatalf("ops %s, want one linear+residual:\n%s", kinds(lg), lg.Dump())
	}
	r := lg.Ops[0].In[2]
	if r.Buf.Name != "b" || !equalShape(r.Shape, []int64{3, 5}) || r.Strides[0] != 0 || r.Strides[1] != 1 {
		t.Errorf("residual %v, want the bias b broadcast over 3 rows", r)
	}
}

// TestScaledAddmmStaysElementwise: with beta or alpha other than 1 the sum is
// not a plain bias add and keeps its own op.
func TestScaledAddmmStaysElementwise(t *testing.T) {
	lg, err := Lower(addmmGraph(map[string]wire.Arg{"beta": {K: "float", F: 0.5}}))
	if err != nil {
		t.Fatal(err)
	}
	if kinds(lg) != "linear elementwise" || !strings.Contains(lg.Ops[1].Attr.Expr.String(), "mul(in0,0.5)") {
		t.Fatalf("ops %s, want a linear and the scaled add:\n%s", kinds(lg), lg.Dump())
	}
}
