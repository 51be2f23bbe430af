"""The GPU check (bench/gpu_check.sh, bench/gpu_bench.py) run on the CPU, so that a case or a step
that cannot work fails here and not in a short GPU window: every section's sanitizer cases on CPU
tensors, and the whole check's --dry-run (every step's flow at tiny shapes)."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_gpu_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_bench = load_gpu_bench()


@pytest.mark.parametrize("section", list(gpu_bench.SECTIONS))
def test_sanitizer_cases_are_valid(section):
    gpu_bench.SECTIONS[section][1]("cpu")


def test_expect_error_checks_the_message():
    def refuse():
        raise RuntimeError("x must be positive")

    gpu_bench.expect_error("must be positive", refuse)
    with pytest.raises(AssertionError, match="expected an error matching"):
        gpu_bench.expect_error("must be negative", refuse)
    with pytest.raises(AssertionError, match="nothing was raised"):
        gpu_bench.expect_error("anything", lambda: None)


def test_dry_run_of_the_whole_check(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path), GPU_CHECK_SECONDS="360")
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=500)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    summary = log[log.rindex("== summary"):]
    sections = " ".join(gpu_bench.SECTIONS)  # the dry run's one process for all sections
    steps = ["machine", "build", "xkernels info", "pytest -m needs_cuda", f"sanitizer memcheck {sections}",
             f"timings {sections}", "decode", "compile peers"]
    for name in steps:
        assert any(line.startswith(name + " ") and line.endswith(" ok") for line in summary.splitlines()), (
            f"step {name!r} not ok in:\n{summary}")
    assert (tmp_path / "gpu_check.log").read_text().rstrip().endswith(summary.splitlines()[-1])
    assert (tmp_path / "tests.xml").exists()
    timed = {json.loads(line)["op"] for line in (tmp_path / "timings.jsonl").read_text().splitlines()}
    assert {"tree_verify", "spiffy_accept", "dllm_step T=0", "refine_step / jacobi_refine", "chain_verify"} <= timed
    peers = [json.loads(line) for line in (tmp_path / "peers.jsonl").read_text().splitlines()]
    assert {row["op"] for row in peers} == {"refine_step / jacobi_refine", "chain_verify"}
    assert all(row.get("compiled_eager_us", row.get("compiled_reference_pass_us")) is not None for row in peers)


def test_the_check_refuses_an_unknown_option():
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--fast"], capture_output=True, text=True,
                          env=dict(os.environ, OUT="/nonexistent-never-made"))
    assert done.returncode == 2 and "usage" in done.stderr
