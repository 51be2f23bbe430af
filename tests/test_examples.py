"""The scripts of python/examples run as a user runs them (the docs include them, so this also
keeps the docs' code working), each in its own process on the shipped models."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "python" / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def run(*args):
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=EXAMPLES.parent.parent)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_every_example_is_listed():
    assert SCRIPTS == sorted(["ragged_engine_step.py", "spiffy_diffusion.py", "tensor_parallel.py",
                              "transformers_target.py", "tree_from_layout.py", "verify_batch.py", "xpress_refine.py"])


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in ("tensor_parallel.py", "transformers_target.py")])
def test_example_runs(script):
    assert run(EXAMPLES / script).strip()


def test_transformers_example_runs():
    pytest.importorskip("transformers")
    assert "target calls" in run(EXAMPLES / "transformers_target.py")


def test_tensor_parallel_example_runs_under_torchrun():
    out = run("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", EXAMPLES / "tensor_parallel.py")
    assert "sharded chain_verify equals the unsharded op" in out and "tensor-parallel jacobi" in out


def test_the_readme_example_runs():
    readme = (EXAMPLES.parent.parent / "README.md").read_text()
    blocks = readme.split("```python\n")[1:]
    assert len(blocks) == 1, "the README has one Python example"
    assert run("-c", blocks[0].split("```")[0]).count("\n") == 2  # one line per sequence
