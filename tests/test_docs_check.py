"""The docs build's API check (docs/_ext/xk_apicheck.py): the public API passes it today, and it
catches what it is there to catch. The full build (docs/build.sh) also renders the pages."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "xk_apicheck", Path(__file__).resolve().parent.parent / "docs" / "_ext" / "xk_apicheck.py")
apicheck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(apicheck)


def test_every_public_object_is_documented():
    found = apicheck.public_objects()
    names = {name for name, _, _ in found}
    assert {"xkernels.chain_verify", "xkernels.shard_row_stats", "xkernels.distributed.tree_verify",
            "xkernels.decoding.generate", "xkernels.spiffy.DraftGraph", "xkernels.tree.tree_block_mask"} <= names
    assert [p for name, obj, strict in found for p in apicheck.problems(name, obj, strict)] == []


def op(a, b=0):
    """An op.

    Args:
        a: the first.
        b: the second.

    Returns:
        nothing.
    """


def undocumented(a):
    pass


def missing_arg(a, b):
    """An op.

    Args:
        a: the first.

    Returns:
        nothing.
    """


@pytest.mark.parametrize("fn, strict, problem", [
    (undocumented, False, "has no docstring"),
    (missing_arg, True, "does not document b"),
    (op, False, None),
    (op, True, None),
])
def test_it_finds_what_is_missing(fn, strict, problem):
    got = apicheck.problems(fn.__name__, fn, strict)
    assert (got == []) if problem is None else any(problem in p for p in got), got


def test_a_kernel_entry_point_needs_raises_and_kernels(monkeypatch):
    monkeypatch.setattr(op, "__module__", "xkernels.ops")
    assert sorted(apicheck.problems("op", op, True)) == ["op: no Kernels section", "op: no Raises section"]
