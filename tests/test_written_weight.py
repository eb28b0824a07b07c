"""A graph that writes a tensor it also uses as a Linear's weight (issue 11):
a parameter written in place is refused, naming the op and the model line; a
buffer written in place is read after the write, so the Linear sees the new
weight (the cuda target reads it coherently, never through the weight ring
or the read-only path, which the loader fills ahead of every event)."""

from __future__ import annotations

import pytest
import torch

import mpk


class WrittenParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 256), requires_grad=False)

    def forward(self, x, d):
        self.w.add_(d)  # mpk-written-parameter-line
        return torch.nn.functional.linear(x, self.w)


class WrittenBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(64, 256))

    def forward(self, x, d):
        self.w.add_(d)
        return torch.nn.functional.linear(x, self.w)


def _steps(options: dict, device: str, steps: int = 3) -> list[tuple[float, float]]:
    """Relative error of the compiled output, and the largest difference of the
    written weight, against eager, after each step."""
    torch.manual_seed(0)
    m, ref = WrittenBuffer().to(device), WrittenBuffer().to(device)
    ref.load_state_dict(m.state_dict())
    f = torch.compile(m, backend="mpk", options=options, fullgraph=True, dynamic=False)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            x, d = torch.randn(2, 256, device=device), torch.randn(64, 256, device=device)
            got, want = f(x, d), ref(x, d)
            out.append((((got - want).norm() / want.norm()).item(), (m.w - ref.w).abs().max().item()))
    return out


def test_a_written_parameter_is_refused_with_the_op_and_line(core_lib, fresh_dynamo):
    with pytest.raises(mpk.MpkError) as ei, torch.no_grad():
        torch.compile(WrittenParameter(), backend="mpk", options={"target": "reference"}, fullgraph=True,
                      dynamic=False)(torch.randn(2, 256), torch.randn(64, 256))
    msg = str(ei.value)
    assert "writes into parameter" in msg and "copy_" in msg
    assert "test_written_weight.py:" in msg and "self.w.add_(d)" in msg


def test_a_written_buffer_is_read_after_the_write(core_lib, fresh_dynamo):
    for err, werr in _steps({"target": "reference"}, "cpu"):
        assert err <= 1e-5 and werr == 0.0


def test_a_written_weight_takes_the_coherent_linear(core_lib, fresh_dynamo):
    """The cuda target's code for it (built without a GPU): the register Linear
    with coherent loads, and no weight stream."""
    got = []
    with torch.no_grad():
        torch.compile(WrittenBuffer(), backend="mpk",
                      options={"target": "cuda", "build_only": True, "num_workers": 132, "on_compile": got.append},
                      fullgraph=True, dynamic=False)(torch.randn(2, 256), torch.randn(64, 256))
    src = got[0].sources["module.cu"]
    assert "mpk::linear<float, 256, false, mpk::NoPro, mpk::NoEpi, false>" in src
    assert "linear_stream" not in src and "kRingPages = 0" in src


@pytest.mark.gpu
def test_a_written_buffer_is_read_after_the_write_on_cuda(core_lib, fresh_dynamo):
    torch.backends.cuda.matmul.allow_tf32 = False
    for err, werr in _steps({"target": "cuda"}, "cuda"):
        assert err <= 1e-5 and werr == 0.0
