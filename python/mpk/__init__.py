"""mpk: compile a PyTorch model's forward pass into one persistent CUDA kernel.

Use it through torch.compile(model, backend="mpk", options={"target": "reference"})."""

from .errors import (ArgumentError, BadRequestError, InternalError, InvalidGraphError, MpkError,
                     MpkRuntimeError, UnsupportedOpError, ValidationError)

__all__ = ["MpkError", "UnsupportedOpError", "ValidationError", "InvalidGraphError",
           "BadRequestError", "MpkRuntimeError", "InternalError", "ArgumentError", "mpk_backend"]
__version__ = "0.1.0"


def mpk_backend(gm, example_inputs, options=None, **kwargs):
    """The torch.compile backend (imported lazily so `import mpk` stays cheap)."""
    from .backend import mpk_backend as _backend
    return _backend(gm, example_inputs, options=options, **kwargs)
