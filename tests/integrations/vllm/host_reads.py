"""Counts what reads a tensor's values on the host (a device sync on a GPU), on any device: the
Tensor methods that do (.item(), .tolist(), .cpu(), .numpy(), bool(), int(), float()), and the aten
ops behind them or whose output shape depends on values (nonzero, masked_select, unique, ...).
Shared by tests/test_ragged_verifier.py (the main suite) and test_vllm_sampler.py (vLLM's)."""

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
        "repeat_interleave", "_assert_async")


class _Ops(TorchDispatchMode):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        # repeat_interleave with output_size reads nothing; device-to-host copies read values
        if name in _OPS and not (name == "repeat_interleave" and kwargs.get("output_size") is not None):
            self.seen.append(name)
        if name in ("_to_copy", "copy_") and any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in args):
            dst = kwargs.get("device") or (args[0].device if name == "copy_" else None)
            if dst is not None and torch.device(dst).type == "cpu":
                self.seen.append(f"{name} to the host")
        return func(*args, **kwargs)


@contextlib.contextmanager
def count_host_reads():
    """Yields the list of host reads made inside the block."""
    seen, originals = [], {name: getattr(torch.Tensor, name) for name in _METHODS}

    def counting(name):
        def method(self, *args, **kwargs):
            seen.append(f".{name}()")
            return originals[name](self, *args, **kwargs)
        return method

    try:
        for name in _METHODS:
            setattr(torch.Tensor, name, counting(name))
        with _Ops(seen):
            yield seen
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)
