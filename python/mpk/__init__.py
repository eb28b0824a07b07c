"""mpk: compile a PyTorch model's forward pass into one persistent CUDA kernel.

Use it through torch.compile(model, backend="mpk", options={"target": "reference"}),
or, to start later processes without Dynamo's trace, mpk.precompile / mpk.load."""

from .errors import (ArgumentError, BadRequestError, InternalError, InvalidGraphError, MpkError,
                     MpkRuntimeError, UnsupportedOpError, ValidationError)

__all__ = ["MpkError", "UnsupportedOpError", "ValidationError", "InvalidGraphError",
           "BadRequestError", "MpkRuntimeError", "InternalError", "ArgumentError", "mpk_backend",
           "precompile", "load"]
__version__ = "0.1.0"


def mpk_backend(gm, example_inputs, options=None, **kwargs):
    """The torch.compile backend (imported lazily so `import mpk` stays cheap)."""
    from .backend import mpk_backend as _backend
    return _backend(gm, example_inputs, options=options, **kwargs)


def precompile(model, path, *args, options=None, **kwargs):
    """Compiles model(*args, **kwargs) and saves it to `path`; see mpk.aot."""
    from .aot import precompile as _precompile
    return _precompile(model, path, *args, options=options, **kwargs)


def load(model, path, check_guards=True):
    """The step precompile saved to `path`, bound to `model`; see mpk.aot.load
    (check_guards=False is unsafe)."""
    from .aot import load as _load
    return _load(model, path, check_guards=check_guards)
