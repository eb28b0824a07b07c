"""The Python package reads top down: no module imports one that imports it
back (function-level imports included), and what a compile produced reaches
the caller through the compiled callable (the on_compile option, a loaded
step's graphs), not through module globals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import mpk
from mpk import backend

PKG = Path(mpk.__file__).parent


def _imports(path: Path) -> set[str]:
    """The package modules a file imports, wherever the import statement is."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpk."):
            out.add(node.module.split(".")[1])
    return out


def test_no_import_circle():
    mods = {p.stem for p in PKG.glob("*.py")}
    graph = {p.stem: _imports(p) & mods - {p.stem} for p in PKG.glob("*.py")}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m, path):
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                pytest.fail("import circle: " + " -> ".join(path[path.index(d):] + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert "backend" not in graph["build"] and "backend" not in graph["savable"]


def _affine(x, y):
    return x * 2.0 + y


def test_compile_results_reach_the_caller_through_on_compile(core_lib, fresh_dynamo):
    got = []
    cf = torch.compile(_affine, backend="mpk", options={"target": "reference", "on_compile": got.append},
                       fullgraph=True, dynamic=False)
    with torch.no_grad():
        cf(torch.randn(2, 3), torch.randn(2, 3))
        cf(torch.randn(4, 3), torch.randn(4, 3))  # a new shape: a second compile
    assert len(got) == 2 and got[0] is not got[1]
    assert all(isinstance(g, backend.CompiledGraph) and g.summary.get("tasks", 0) > 0 for g in got)
    assert not hasattr(backend, "last_compiled") and not hasattr(backend, "compile_count")


def test_on_compile_must_be_callable(core_lib, fresh_dynamo):
    cf = torch.compile(_affine, backend="mpk", options={"target": "reference", "on_compile": "yes"},
                       fullgraph=True, dynamic=False)
    with pytest.raises(mpk.MpkError, match="on_compile"):
        cf(torch.randn(2, 3), torch.randn(2, 3))
