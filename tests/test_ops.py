"""Single ATen ops through the whole compile path on the reference target."""

import pytest
import torch
import torch.nn.functional as F

from mpk import check


@pytest.mark.parametrize("pad", [(1, 2), (1, 2, 0, 1), (-1, 2, 1, -1)])
def test_constant_pad(core_lib, fresh_dynamo, pad):
    check.ensure_backend_registered()

    def f(x):
        return F.pad(x * 2, pad, value=3.0) + 1

    x = torch.randn(3, 5)
    got = torch.compile(f, backend="mpk", options={"target": "reference"}, fullgraph=True, dynamic=False)(x)
    torch.testing.assert_close(got, f(x))
