"""The GPU check (bench/gpu_check.sh, bench/gpu_bench.py, bench/ncu_table.py) run on the CPU, so that
a case or a step that cannot work fails here and not in a short GPU window: every section's sanitizer
cases (memcheck's and racecheck's) on CPU tensors, the peers' compile bound, the profile table on a
CSV in Nsight Compute's raw shape, and the whole check's --dry-run (every step's flow at tiny shapes)."""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_bench = load("gpu_bench")
ncu_table = load("ncu_table")
FIXTURE = ROOT / "bench" / "ncu_table_fixture.csv"


@pytest.mark.parametrize("racecheck", [False, True], ids=["memcheck", "racecheck"])
@pytest.mark.parametrize("section", list(gpu_bench.SECTIONS))
def test_sanitizer_cases_are_valid(section, racecheck):
    _, sanitize, cases, racecheck_cases = gpu_bench.SECTIONS[section]
    sanitize("cpu", racecheck_cases if racecheck else cases, racecheck=racecheck)


def test_racecheck_cases_launch_no_cublas_gemm():
    # float32 refine weights always take cuBLAS's SGEMM, the bfloat16 ones the fused read when forced.
    assert gpu_bench.dtypes(True, torch.float32, torch.bfloat16) == (torch.bfloat16,)
    assert gpu_bench.dtypes(False, torch.float32, torch.bfloat16) == (torch.float32, torch.bfloat16)
    assert all(r % 8 == 0 and r <= 256 for _, _, _, r, _ in gpu_bench.SECTIONS["refine"][3])  # fusable ranks


def test_a_peer_over_its_compile_bound_is_skipped_and_recorded():
    bench = gpu_bench.Bench(dry_run=True, compile_bound=0.2)
    us, why = bench.peer(lambda: time.sleep(5))
    assert us is None and why == "skipped: first call (compile) over 0.2 s"
    us, why = bench.peer(lambda: None)
    assert us is not None and why is None

    def broken():
        raise ValueError("no kernel")

    us, why = bench.peer(broken)
    assert us is None and why.startswith("failed: ValueError('no kernel')")


def test_profile_once_leaves_out_the_cases_past_its_seconds(capsys):
    calls = []
    gpu_bench.Bench(dry_run=True, once=True, once_seconds=60).profile_once("early", lambda: calls.append(1))
    gpu_bench.Bench(dry_run=True, once=True, once_seconds=-1).profile_once("late", lambda: calls.append(2))
    assert calls == [1, 1, 1]  # two warm-up calls and the profiled one; none for the late case
    printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("device:")]
    assert printed == ["profiled once: early", "left out (--profile-seconds): late"]


def test_the_profile_table_of_a_raw_ncu_csv(capsys):
    units, rows = ncu_table.read(FIXTURE)  # ==PROF== lines before the header and after the rows
    assert [row["ID"] for row in rows] == ["0", "1", "2", "3", "4"] and units[ncu_table.DURATION] == "nsecond"
    lines = ncu_table.lines(units, rows)
    cases = [line for line in lines if not line.startswith(" ")]
    assert cases == ["chain_verify N=64 K=16 V=151936 bf16 T=0.0", "refine_step / jacobi_refine N=32 B=16 V=151936 r=256 bf16"]
    kernel = {line.split()[0]: line.split() for line in lines if line.startswith("  ") and "<" in line}
    # row_stats: "123,456" ns, 1088 blocks, 58% DRAM, 21% SM, 88% occupancy, 40 registers, 2 KiB
    assert kernel["row_stats_kernel<bf16,"][2:11] == ["1", "123.5", "1088", "58", "21", "88", "40", "2.0",
                                                      "long_scoreboard"]
    # two launches of the epilogue in one case: one line, their durations summed (30 + 32.5 us)
    assert kernel["read_epilogue_kernel<bf16,"][2:4] == ["2", "62.5"]
    # static + dynamic shared memory; the top three stalls, largest first, `selected` not among them
    assert kernel["front_hidden_kernel<float>"][-7:] == ["24.0", "barrier", "20.5", "long_scoreboard", "8.2",
                                                         "math_pipe_throttle", "0.9"]
    assert ncu_table.main([str(FIXTURE)]) == 0 and "row_stats_kernel<bf16, false>" in capsys.readouterr().out


def test_the_profile_table_reads_units_and_refuses_an_empty_report(tmp_path, capsys):
    text = FIXTURE.read_text().replace('"nsecond"', '"usecond"')
    (tmp_path / "us.csv").write_text(text)
    units, rows = ncu_table.read(tmp_path / "us.csv")
    row_stats = next(line for line in ncu_table.lines(units, rows) if "row_stats" in line)
    assert " 123456.0 " in row_stats  # microseconds as given, not divided again
    (tmp_path / "empty.csv").write_text("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - no access\n")
    assert ncu_table.main([str(tmp_path / "empty.csv")]) == 3 and "no kernel rows" in capsys.readouterr().err
    assert ncu_table.main(["--metrics"]) == 0
    metrics = capsys.readouterr().out.strip().split(",")
    assert {"gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
            "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
            "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
            "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"} <= set(metrics)


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
             f"sanitizer racecheck {sections}", f"timings {sections}", "profile", "compile peers", "decode"]
    names = [re.match(r"(.+?) +\d+s of ", line).group(1) for line in summary.splitlines()[1:]]
    assert [n for n in names if n in steps] == steps, summary  # the steps in their order
    for name in steps:
        assert any(line.startswith(name + " ") and line.endswith(" ok") for line in summary.splitlines()), (
            f"step {name!r} not ok in:\n{summary}")
    # The profile step: each timing case called once (named as its NVTX range), the fixture's table.
    profiled = [line for line in (tmp_path / "profile.log").read_text().splitlines() if line.startswith("profiled once")]
    assert any("chain_verify N=2 K=3 V=97 bf16 T=1.0 with q" in line for line in profiled)
    assert {line.split(": ")[1].split(" ")[0] for line in profiled} >= {"tree_verify", "spiffy_accept", "dllm_step",
                                                                         "refine_step", "chain_verify_ragged",
                                                                         "shard_cut_pick"}
    assert "read_epilogue_kernel<bf16, float>" in (tmp_path / "profile.txt").read_text()
    assert (tmp_path / "gpu_check.log").read_text().rstrip().endswith(summary.splitlines()[-1])
    assert (tmp_path / "tests.xml").exists()
    # racecheck's run took its own cases (the dry run: each section's first)
    assert "spiffy case (2, 16, 300, 8)" in (tmp_path / "sanitize.log").read_text()
    timed = {json.loads(line)["op"] for line in (tmp_path / "timings.jsonl").read_text().splitlines()}
    assert {"tree_verify", "spiffy_accept", "dllm_step T=0", "refine_step / jacobi_refine", "chain_verify"} <= timed
    peers = [json.loads(line) for line in (tmp_path / "peers.jsonl").read_text().splitlines()]
    assert sorted(row["op"] for row in peers) == ["chain_verify", "refine_step / jacobi_refine"]  # one case each
    assert all(row.get("compiled_eager_us", row.get("compiled_reference_pass_us")) is not None for row in peers)
    assert all(row["compiled_note"] is None for row in peers)


def test_the_check_refuses_an_unknown_option():
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--fast"], capture_output=True, text=True,
                          env=dict(os.environ, OUT="/nonexistent-never-made"))
    assert done.returncode == 2 and "usage" in done.stderr
