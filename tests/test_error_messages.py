"""Argument errors arrive whole, word for word with their numbers, and never crash the process.

A toolchain that links libstdc++ statically into libxkernels (g++ 13.3 on the H200 machines) made
every number in a TORCH_CHECK message crash the process or cut the message at its first number
(cmake/SharedLibstdcxx.cmake has the fix). CI runs this file again against a library built with
`LDFLAGS=-static-libstdc++`, loaded through XKERNELS_LIBRARY.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import xkernels
from tests.utils import DEVICES


def long(*shape, fill=0):
    return torch.full(shape, fill, dtype=torch.long)


# (call on a device, the exact message). Each formats integers, sizes, doubles or dtypes.
CASES = {
    "chain_verify K mismatch": (
        lambda dev: xkernels.chain_verify(long(2, 5).to(dev), torch.zeros(2, 4, 10, device=dev)),
        "target_logits must have shape [N, K+1, V] = [2, 6, V] to match draft_tokens [2, 5], got [2, 4, 10]",
    ),
    "chain_verify temperature": (
        lambda dev: xkernels.chain_verify(long(1, 2).to(dev), torch.zeros(1, 3, 4, device=dev), temperature=-0.5),
        "temperature must be finite and >= 0, got -0.5",
    ),
    "chain_verify draft_probs shape": (
        lambda dev: xkernels.chain_verify(long(1, 2).to(dev), torch.zeros(1, 3, 4, device=dev),
                                          draft_probs=torch.zeros(1, 2, 5, device=dev), temperature=1.0),
        "draft_probs must have shape [N, K, V] = [1, 2, 4], got [1, 2, 5]",
    ),
    "chain_verify dtype": (
        lambda dev: xkernels.chain_verify(long(1, 2).to(dev), torch.zeros(1, 3, 4, dtype=torch.float64, device=dev)),
        "target_logits must be float32, bfloat16 or float16, got Double",
    ),
    "tree_verify logits shape": (
        lambda dev: xkernels.tree_verify(long(1, 3).to(dev), torch.tensor([[-1, 0, 0]], device=dev),
                                         torch.zeros(1, 4, 5, device=dev)),
        "target_logits must have shape [N, M, V] = [1, 3, V], got [1, 4, 5]",
    ),
    "compact_kv_ prefix_len": (
        lambda dev: xkernels.compact_kv_(torch.zeros(1, 2, 8, 4, device=dev), long(1, 3).to(dev), long(1).to(dev), 8),
        "prefix_len must lie in [0, L) = [0, 8), got 8",
    ),
}

# Value checks: always on the CPU; on CUDA only under XKERNELS_CHECK=1 (they need a host sync).
VALUE_CASES = {
    "chain_verify draft id >= V": (
        lambda dev: xkernels.chain_verify(torch.tensor([[1, 10]], device=dev), torch.zeros(1, 3, 10, device=dev)),
        "draft_tokens holds ids outside [0, 10)",
    ),
    "tree_verify token >= V": (
        lambda dev: xkernels.tree_verify(torch.tensor([[0, 9, 1]], device=dev), torch.tensor([[-1, 0, 0]], device=dev),
                                         torch.zeros(1, 3, 5, device=dev)),
        "tokens holds ids outside [0, 5) at real nodes",
    ),
}


def first_line(exc):
    return str(exc).splitlines()[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_argument_errors_are_whole(device, name):
    call, message = CASES[name]
    with pytest.raises((RuntimeError, ValueError)) as info:
        call(device)
    assert first_line(info.value) == message


@pytest.mark.parametrize("name", sorted(VALUE_CASES))
def test_value_errors_are_whole_on_the_cpu(name):
    call, message = VALUE_CASES[name]
    with pytest.raises(RuntimeError) as info:
        call("cpu")
    assert first_line(info.value) == message


@pytest.mark.needs_cuda
def test_value_errors_are_whole_on_cuda_under_xkernels_check():
    # XKERNELS_CHECK is read once per process: a child process with it set.
    script = (
        "import tests.test_error_messages as t\n"
        "for name, (call, message) in sorted(t.VALUE_CASES.items()):\n"
        "    try:\n"
        "        call('cuda')\n"
        "    except RuntimeError as e:\n"
        "        assert t.first_line(e) == message, (name, str(e))\n"
        "    else:\n"
        "        raise AssertionError(name + ' did not raise')\n"
        "print('ok')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "XKERNELS_CHECK": "1"}, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


# Checked after the op's own tensors, as a group (ops/sampling_args.cpp): their order is their own.
_SAMPLING_TENSORS = {"temperature_tensor", "top_k_tensor", "top_p_tensor", "min_p_tensor", "seed_tensor",
                     "offset_tensor", "cut_value", "cut_id"}


def _device_order_cases():
    """(op, argument) for every op's own tensor arguments, where the op takes two or more."""
    cases = []
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("xkernels::"):
            names = [a.name for a in schema.arguments
                     if a.type.isSubtypeOf(torch._C.OptionalType(torch._C.TensorType.get()))
                     and a.name not in _SAMPLING_TENSORS]
            cases += [(schema.name.split("::")[1], name) for name in names] if len(names) > 1 else []
    return sorted(cases)


@pytest.mark.parametrize("op,name", _device_order_cases())
def test_the_device_is_checked_before_the_shape(op, name):
    """Device first, as torch does: the C++ checks report a tensor on the wrong device as that,
    whatever else is wrong with it. Each of the op's own tensor arguments (optional ones too) is a
    float32 [1, 1, 1, 1, 1] (no op's shape), `name`'s on meta, and the call goes to the CPU kernel itself (redispatch: a meta
    tensor would otherwise send it to the fake kernel), so the checks the CUDA kernel runs too
    (csrc/ops) meet a tensor on another device, as on a GPU with a CPU tensor among CUDA ones."""
    overload = getattr(torch.ops.xkernels, op).default
    args = []
    for a in overload._schema.arguments:
        tensor = a.type.isSubtypeOf(torch._C.OptionalType(torch._C.TensorType.get()))
        if tensor and a.name not in _SAMPLING_TENSORS:
            args.append(torch.zeros(1, 1, 1, 1, 1, device="meta" if a.name == name else "cpu"))
        elif a.has_default_value():
            args.append(a.default_value)
        else:
            args.append({"int": 0, "float": 0.0, "bool": False}.get(str(a.type)))  # None: an optional
    with pytest.raises(RuntimeError) as info:
        overload.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args)
    message = first_line(info.value)
    assert re.match(rf"{name} must be on cpu like \w+, got meta$|\w+ must be on meta like {name}, got cpu$",
                    message), message


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_library_exports_no_libstdcxx_locale():
    """A libstdc++ copy inside libxkernels is either absent (the shared one is linked) or private."""
    out = subprocess.run(["nm", "-D", "-C", "--defined-only", str(xkernels._LIBRARY_PATH)], capture_output=True,
                         text=True, check=True).stdout
    leaked = [line for line in out.splitlines() if "std::locale::" in line or "std::ios_base::Init" in line]
    assert not leaked, f"{xkernels._LIBRARY_PATH} exports libstdc++ internals: {leaked[:5]}"
